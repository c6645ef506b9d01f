//! `surge`: one binary, one verb per task (DESIGN §2). This file only parses flags and hands each
//! verb to the crate that owns it; no behaviour lives here.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "surge",
    version,
    about = "Surge: an open burst buffer for HPC clusters",
    long_about = "Surge turns fast devices (NVMe, SSD, RAM) on burst-buffer nodes into on-demand \
file systems for jobs, stages data between them and the parallel file system, and ships the tools \
to decide whether and how to use them: benchmarks, an I/O profiler, an advisor and a simulator.\n\n\
Run `surge <verb> --help` for the manual of each verb."
)]
struct Cli {
    /// More log output (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a burst-buffer server (fragments and metadata on fast-tier directories).
    Server(surge_server::cli::ServerArgs),
    /// Create, show or destroy instances on running servers by hand.
    Instance(surge_client::cli::InstanceArgs),
    /// Mount an instance's namespace as a POSIX directory (FUSE).
    Mount(surge_client::cli::MountArgs),
    /// Copy data between the PFS and instances (stage in, stage out).
    Stage(surge_stage::cli::StageArgs),
    /// IOR/mdtest-style benchmarks of any path: bandwidth, IOPS, metadata rates.
    Bench(surge_bench::cli::BenchArgs),
    /// Record the I/O of a command and say whether it is bandwidth-, IOPS- or metadata-bound.
    Profile(surge_profile::cli::ProfileArgs),
    /// Turn a profile and calibrated peaks into an allocation and #DW lines.
    Advise(surge_profile::cli::AdviseArgs),
    /// Simulate compute nodes, burst buffers and the PFS (Liu et al.'s CODES model).
    Sim(surge_sim::cli::SimArgs),
}

fn init_logging(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let result = match cli.command {
        Command::Server(a) => surge_server::cli::run(a),
        Command::Instance(a) => surge_client::cli::run_instance(a),
        Command::Mount(a) => surge_client::cli::run_mount(a),
        Command::Stage(a) => surge_stage::cli::run(a),
        Command::Bench(a) => surge_bench::cli::run(a),
        Command::Profile(a) => surge_profile::cli::run_profile(a),
        Command::Advise(a) => surge_profile::cli::run_advise(a),
        Command::Sim(a) => surge_sim::cli::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("surge: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
