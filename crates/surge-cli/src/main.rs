//! `surge`: one binary, one verb per task (DESIGN §2). This file only parses flags and hands each
//! verb to the crate that owns it; no behaviour lives here.

mod accounts;
mod config;
mod doctor;
mod quota;

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
Start here: `surge run job.sh` runs a DataWarp job script (#DW jobdw, #DW stage_in, ...) with no \
setup. Run `surge <verb> --help` for the manual of each verb."
)]
struct Cli {
    /// More log output (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,

    /// Read the daemon's settings from this file (manager, server, agent, mover,
    /// passthrough-helper; the units give /etc/surge/surge.toml): flags on the command line
    /// win. `surge config show` prints what a daemon runs with; `surge doctor` reads it too.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<std::path::PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a job script with the burst buffer its #DW/#BB directives ask for.
    Run(surge_run::run::RunArgs),
    /// Run a command on an emulated compute node of the running job (like srun).
    Exec(surge_run::exec::ExecArgs),
    /// A job's burst-buffer phases for a workload manager (Slurm's burst_buffer/lua hooks).
    Bb(surge_run::bb::BbArgs),
    /// The compute-node agent: mounts job instances on this host when the manager asks (root).
    Agent(surge_run::agent::AgentArgs),
    /// A data mover: runs the manager's stage tasks on this host (root, PFS mounted).
    Mover(surge_run::mover::MoverArgs),
    /// Stage files between the PFS and burst-buffer instances.
    Stage(surge_run::stage_cli::StageArgs),
    /// Persistent instances: create, list, destroy.
    Persistent(surge_manager::cli::PersistentArgs),
    /// Instances: list (manager), or create/show/destroy on servers by hand.
    Instance(InstanceCmd),
    /// Pools of burst-buffer servers.
    Pool(surge_manager::cli::PoolArgs),
    /// Sessions (jobs using instances).
    Session(surge_manager::cli::SessionArgs),
    /// Quotas per user and group: capacity, instances, sessions, stage tasks.
    Quota(quota::QuotaArgs),
    /// Run the control plane (pools, servers, instances, sessions, stage tasks).
    Manager(surge_manager::cli::ManagerArgs),
    /// Print the web dashboard's URL, with a token that shows you your own jobs.
    Dashboard(surge_manager::cli::DashboardArgs),
    /// The cluster key shared by the manager and its servers (create it at install).
    Key(surge_manager::cli::KeyArgs),
    /// Certificates for TLS on the data protocol: the site CA and the servers' (at install).
    Cert(surge_manager::cli::CertArgs),
    /// Run a burst-buffer server, or query/register servers.
    Server(ServerCmd),
    /// Mount an instance's namespace as a POSIX directory (FUSE).
    Mount(surge_client::cli::MountArgs),
    // Its help is LayoutArgs' own (with examples).
    Layout(surge_client::cli::LayoutArgs),
    /// Root's service that gives users' mounts kernel FUSE passthrough (the fast tier's speed).
    PassthroughHelper(surge_client::lend::HelperArgs),
    /// IOR/mdtest-style benchmarks of any path: bandwidth, IOPS, metadata rates.
    Bench(surge_bench::cli::BenchArgs),
    /// Record the I/O of a command and say whether it is bandwidth-, IOPS- or metadata-bound.
    Profile(surge_profile::cli::ProfileArgs),
    /// Turn a profile and calibrated peaks into an allocation and #DW lines.
    Advise(surge_profile::cli::AdviseArgs),
    /// Tune a job's burst buffer by running it: fragments, access mode, placement, MPI-IO hints.
    Tune(surge_tune::cli::TuneArgs),
    /// Simulate compute nodes, burst buffers and the PFS (Liu et al.'s CODES model).
    Sim(surge_sim::cli::SimArgs),
    // Its help is ConfigArgs' own (with examples).
    Config(config::ConfigArgs),
    // Its help is DoctorArgs' own (with examples).
    Doctor(doctor::DoctorArgs),
}

#[derive(clap::Args, Debug)]
struct InstanceCmd {
    #[command(subcommand)]
    command: InstanceSub,
}

#[derive(Subcommand, Debug)]
enum InstanceSub {
    /// List the instances the manager knows (job and persistent), with use and sessions.
    Ls {
        #[command(flatten)]
        addr: surge_manager::cli::ManagerAddr,
        /// Print the instances as JSON (the format of the manager's `/v1/instances`).
        #[arg(long)]
        json: bool,
    },
    /// Wait until a cache (type=cache) instance's changes made so far are on its PFS
    /// directory (returns at once for other instances). In a job: `surge stage wait --drained`.
    ///
    /// Example: surge instance wait-drained 42 --timeout 600
    WaitDrained {
        /// The instance's id (`surge instance ls`).
        id: u64,
        /// Fail (exit 1) if the drain has not got there after this many seconds.
        #[arg(long, value_name = "SECONDS")]
        timeout: Option<u64>,
        #[command(flatten)]
        addr: surge_manager::cli::ManagerAddr,
    },
    #[command(flatten)]
    Direct(surge_client::cli::InstanceCommand),
}

/// Run a burst-buffer server: store fragments of instances on fast-tier directories and serve
/// their data and metadata. `surge server status ADDR` and `surge server register ADDR` query
/// and register servers.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct ServerCmd {
    #[command(subcommand)]
    sub: Option<ServerSub>,
    #[command(flatten)]
    run: surge_server::cli::ServerArgs,
}

#[derive(Subcommand, Debug)]
enum ServerSub {
    /// Show what servers hold: fragments, namespaces, capacity and use.
    Status(surge_client::cli::StatusArgs),
    /// Register a running server with a manager.
    Register(surge_manager::cli::RegisterArgs),
}

fn init_logging(verbose: u8, daemon: bool) {
    use tracing_subscriber::EnvFilter;
    let default = match (verbose, daemon) {
        (0, true) => "info",
        // Commands a user runs interactively: only what needs attention.
        (0, false) => "warn",
        (1, _) => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs a command that talks to a manager; with none given (no --manager, no $SURGE_MANAGER),
/// against the embedded default's (`surge_run::embedded::CommandManager`: the running `surge
/// run`'s, else one started for this command over the state `surge run` keeps).
fn with_manager<A>(
    mut args: A,
    addr: impl Fn(&mut A) -> &mut surge_manager::cli::ManagerAddr,
    run: impl FnOnce(A) -> anyhow::Result<ExitCode>,
) -> anyhow::Result<ExitCode> {
    if addr(&mut args).manager.is_some() {
        return run(args);
    }
    let surge = std::env::current_exe()?;
    let opts = surge_run::embedded::EmbeddedOptions::from_env()?;
    let m = surge_run::embedded::CommandManager::find_or_start(&opts, &surge)?;
    tracing::info!(
        "no manager given: using the embedded default's ({})",
        opts.fast_dir.display()
    );
    addr(&mut args).manager = Some(m.addr().to_string());
    let r = run(args);
    m.stop();
    r
}

/// `surge bench control-plane ...`: the control plane's load generator, which lives beside
/// the embedded manager it starts (surge-run), not with the storage benchmarks.
#[derive(Parser, Debug)]
#[command(name = "surge bench control-plane")]
struct ControlPlaneBench {
    #[command(flatten)]
    args: surge_run::loadgen::LoadArgs,
}

/// `surge ... | head`: the reader went, so printing fails with EPIPE, and `println!` panics.
/// That ends the command as SIGPIPE would end a C tool (status 141, nothing said), not with a
/// panic message and backtrace. Any other panic is reported as before.
fn quiet_on_closed_stdout() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to std") && msg.contains("Broken pipe") {
            std::process::exit(128 + libc::SIGPIPE);
        }
        report(info);
    }));
}

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    {
        let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
        // `mount.fuse.surge` (a symlink to this binary): mount(8)'s helper.
        let name = argv
            .first()
            .and_then(|a| std::path::Path::new(a).file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if surge_client::mount_helper::NAMES.contains(&name.as_str()) {
            init_logging(0, false);
            return match surge_client::mount_helper::run(&argv[1..]) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("{name}: {e:#}");
                    ExitCode::from(32) // mount(8)'s "mount failure"
                }
            };
        }
        if argv.len() >= 3 && argv[1] == "bench" && argv[2] == "control-plane" {
            let rest = std::iter::once(std::ffi::OsString::from("surge bench control-plane"))
                .chain(argv[3..].iter().cloned());
            let b = ControlPlaneBench::parse_from(rest);
            init_logging(0, false);
            return match surge_run::loadgen::run(b.args) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("surge: error: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
    }
    // --config FILE: the file's settings become the daemon's flags (config.rs).
    let args = match config::expand_args(std::env::args_os()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("surge: error: {e:#}");
            return ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(args);
    let daemon = matches!(
        cli.command,
        Command::Manager(_)
            | Command::Mount(_)
            | Command::PassthroughHelper(_)
            | Command::Agent(_)
            | Command::Mover(_)
            | Command::Server(ServerCmd { sub: None, .. })
    );
    init_logging(cli.verbose, daemon);
    let result = match cli.command {
        Command::Run(a) => surge_run::run::run(a),
        Command::Exec(a) => surge_run::exec::run_exec(a),
        Command::Bb(a) => surge_run::bb::run(a),
        Command::Agent(a) => surge_run::agent::run(a),
        Command::Mover(a) => surge_run::mover::run(a),
        Command::Stage(a) => surge_run::stage_cli::run_stage(a),
        Command::Persistent(a) => {
            with_manager(a, |a| &mut a.addr, surge_manager::cli::run_persistent)
        }
        Command::Instance(InstanceCmd { command }) => match command {
            InstanceSub::Ls { addr, json } => with_manager(
                addr,
                |a| a,
                |addr| {
                    surge_manager::cli::runtime().and_then(|rt| {
                        rt.block_on(surge_manager::cli::list_instances(addr.get()?, json))
                            .map(|_| ExitCode::SUCCESS)
                    })
                },
            ),
            InstanceSub::WaitDrained { id, timeout, addr } => with_manager(
                addr,
                |a| a,
                |addr| {
                    surge_manager::cli::runtime().and_then(|rt| {
                        rt.block_on(async {
                            let mut m = surge_manager::cli::connect(addr.get()?).await?;
                            surge_run::stage_cli::wait_instance_drained(
                                &mut m,
                                id,
                                timeout.map(std::time::Duration::from_secs),
                                "surge instance",
                            )
                            .await
                        })
                        .map(|_| ExitCode::SUCCESS)
                    })
                },
            ),
            InstanceSub::Direct(c) => surge_client::cli::run_instance_command(c),
        },
        Command::Pool(a) => {
            // No manager given: the embedded default's, whose peaks are also kept in its state.
            let embedded = a.addr.manager.is_none();
            with_manager(
                a,
                |a| &mut a.addr,
                move |a| match a.command {
                    surge_manager::cli::PoolCommand::Calibrate(c) => {
                        let addr = a.addr.get()?.to_string();
                        let opts = embedded
                            .then(surge_run::embedded::EmbeddedOptions::from_env)
                            .transpose()?;
                        surge_run::calibrate::run(&addr, *c, opts)
                    }
                    _ => surge_manager::cli::run_pool(a),
                },
            )
        }
        Command::Session(a) => with_manager(a, |a| &mut a.addr, surge_manager::cli::run_session),
        Command::Quota(a) => with_manager(a, |a| &mut a.addr, quota::run),
        Command::Manager(a) => surge_manager::cli::run_manager(a),
        Command::Dashboard(a) => surge_manager::cli::run_dashboard(a),
        Command::Key(a) => surge_manager::cli::run_key(a),
        Command::Cert(a) => surge_manager::cli::run_cert(a),
        Command::Server(ServerCmd { sub: Some(s), .. }) => match s {
            ServerSub::Status(a) => surge_client::cli::run_status(a),
            ServerSub::Register(a) => surge_manager::cli::run_register(a),
        },
        Command::Server(ServerCmd { sub: None, run }) => {
            surge_server::cli::run(run, |args, running| {
                if let Some(m) = &args.manager {
                    surge_manager::cli::register_in_background(
                        m.clone(),
                        running.tcp_addr().to_string(),
                        args.pool.clone(),
                    );
                }
            })
        }
        Command::Mount(a) => surge_client::cli::run_mount(a),
        Command::Layout(a) => surge_client::cli::run_layout(a),
        Command::PassthroughHelper(a) => surge_client::lend::run_helper(a),
        Command::Bench(a) => surge_bench::cli::run(a),
        Command::Profile(a) => surge_profile::cli::run_profile(a),
        Command::Advise(a) => surge_profile::cli::run_advise(a),
        Command::Tune(a) => surge_tune::cli::run(a),
        Command::Sim(a) => surge_sim::cli::run(a),
        Command::Config(a) => config::run(a, cli.config),
        Command::Doctor(a) => doctor::run(a, cli.config),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("surge: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// `--help` is the manual: every argument of every command says what it is.
    #[test]
    fn every_argument_of_every_command_is_described() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_name() == "help" {
                    continue;
                }
                if sub.get_about().is_none() && sub.get_long_about().is_none() {
                    missing.push(format!("{path} {} (the command)", sub.get_name()));
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "surge", &mut missing);
        assert!(
            missing.is_empty(),
            "undescribed in --help:\n{}",
            missing.join("\n")
        );
    }
}
