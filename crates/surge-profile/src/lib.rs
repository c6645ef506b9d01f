//! `surge profile` and `surge advise`. Being built under issue 5.

pub mod cli {
    use std::process::ExitCode;

    /// Profile the I/O of a command (issue 5).
    #[derive(clap::Args, Debug)]
    pub struct ProfileArgs {}

    /// Turn a profile into an allocation (issue 5).
    #[derive(clap::Args, Debug)]
    pub struct AdviseArgs {}

    pub fn run_profile(_args: ProfileArgs) -> anyhow::Result<ExitCode> {
        anyhow::bail!("surge profile is not built yet (issue 5)")
    }

    pub fn run_advise(_args: AdviseArgs) -> anyhow::Result<ExitCode> {
        anyhow::bail!("surge advise is not built yet (issue 5)")
    }
}
