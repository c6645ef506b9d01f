//! `surge bench`: IOR- and mdtest-style microbenchmarks. Being built under issue 4.

pub mod cli {
    use std::process::ExitCode;

    /// Measure bandwidth, IOPS and metadata rates of a path (issue 4).
    #[derive(clap::Args, Debug)]
    pub struct BenchArgs {}

    pub fn run(_args: BenchArgs) -> anyhow::Result<ExitCode> {
        anyhow::bail!("surge bench is not built yet (issue 4)")
    }
}
