//! `surge sim`: a discrete-event simulator of compute nodes, burst buffers and the PFS
//! (Liu et al.'s CODES model). Being built under issue 6.

pub mod cli {
    use std::process::ExitCode;

    /// Simulate a system and a set of applications (issue 6).
    #[derive(clap::Args, Debug)]
    pub struct SimArgs {}

    pub fn run(_args: SimArgs) -> anyhow::Result<ExitCode> {
        anyhow::bail!("surge sim is not built yet (issue 6)")
    }
}
