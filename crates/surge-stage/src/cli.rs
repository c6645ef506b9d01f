//! `surge stage`: today `surge stage copy`, a direct copy between the PFS and an instance for
//! admins and benchmarks (no manager involved). The manager-backed `surge stage
//! in|out|status|wait` for jobs join it here as further subcommands.

use crate::{
    check_fits, execute, plan, summary_line, Direction, ItemKind, Progress, ProgressRenderer,
    StageError, StageItem, StageOptions,
};
use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use surge_client::InstanceClient;
use surge_core::{format_bytes, NamespaceId};

/// Copy data between the parallel file system and burst-buffer instances.
#[derive(clap::Args, Debug)]
pub struct StageArgs {
    #[command(subcommand)]
    pub command: StageCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum StageCommand {
    Copy(CopyArgs),
}

pub fn run(args: StageArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        StageCommand::Copy(a) => run_copy(a),
    }
}

fn parse_owner(s: &str) -> Result<(u32, u32), String> {
    let (u, g) = s
        .split_once(':')
        .ok_or_else(|| format!("'{s}': expected UID:GID, e.g. 1000:1000"))?;
    let u = u.parse().map_err(|_| format!("'{s}': bad uid '{u}'"))?;
    let g = g.parse().map_err(|_| format!("'{s}': bad gid '{g}'"))?;
    Ok((u, g))
}

/// Copy a file or a directory tree between the PFS and an instance, directly through the
/// native client (not through a mount, not through the manager).
///
/// --in copies SRC on the PFS to DST in the instance; --out copies SRC in the instance to
/// DST on the PFS. Instance paths are absolute from the instance root (`/` is the root).
/// Without --directory, SRC is a file and DST the file to create (or, ending with `/`, the
/// directory to put it in). With --directory, the CONTENTS of directory SRC go into directory
/// DST (created with its parents), recursively, as `#DW stage_in type=directory` does.
///
/// Modes, atimes, mtimes and symlinks are preserved (owners with --preserve-owner). Many files
/// are copied at once and large files are cut into chunks copied in parallel. Each file is
/// written under a temporary name (.surge-stage.NAME.XXXXXXXX) and renamed when complete, so an
/// interrupted copy (Ctrl-C, kill) leaves no half-written file under a real name; the next copy
/// into the same directories removes the temporaries. A stage-in larger than the instance's free
/// space is refused before anything is copied. A file that fails does not stop the others:
/// they are listed at the end and the exit status is 1.
///
/// Examples:
///   surge stage copy --server 127.0.0.1:7001 --instance 42 --in --directory /pfs/inputs /inputs
///   surge stage copy --server 127.0.0.1:7001 --instance 42 --in /pfs/big.dat /
///   surge stage copy --server 127.0.0.1:7001 --instance 42 --out --directory /results /pfs/out
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
#[command(group(clap::ArgGroup::new("direction").required(true).args(["stage_in", "stage_out"])))]
pub struct CopyArgs {
    /// The instance: through the manager (--manager or SURGE_MANAGER, which checks with MUNGE
    /// that you may use it), or --server with the cluster key (administrators).
    #[command(flatten)]
    pub source: surge_client::cli::InstanceSource,

    /// Namespace: 0 for a striped instance; the compute node's index for a private one.
    #[arg(long, default_value_t = 0)]
    pub ns: u32,

    /// Stage in: SRC is on the PFS, DST in the instance.
    #[arg(long = "in")]
    pub stage_in: bool,

    /// Stage out: SRC is in the instance, DST on the PFS.
    #[arg(long = "out")]
    pub stage_out: bool,

    /// What to copy.
    pub src: String,

    /// Where to copy it.
    pub dst: String,

    /// SRC is a directory: copy its contents into DST, recursively.
    #[arg(long)]
    pub directory: bool,

    /// Files (and chunks of large files) in flight.
    #[arg(long, default_value_t = 32)]
    pub workers: usize,

    /// Files larger than this are cut into chunks of this size copied in parallel.
    #[arg(long, value_name = "SIZE", default_value = "8MiB", value_parser = surge_core::sys::size_arg)]
    pub chunk_size: u64,

    /// Read every copy back and compare it with its source (xxh3 per chunk) before giving it
    /// its final name.
    #[arg(long)]
    pub checksum: bool,

    /// Give copies the owner of their source (needs root for a stage-out).
    #[arg(long)]
    pub preserve_owner: bool,

    /// Give copies this owner instead (default: the caller).
    #[arg(long, value_name = "UID:GID", value_parser = parse_owner, conflicts_with = "preserve_owner")]
    pub owner: Option<(u32, u32)>,

    /// Stage-out: do not flush the destination file system at the end (faster, but the data
    /// may still be only in memory when the command returns).
    #[arg(long)]
    pub no_sync: bool,

    /// Print the report as JSON on stdout (progress still goes to stderr).
    #[arg(long)]
    pub json: bool,
}

/// `DST` ending with `/` for a file means "into that directory, under the source's name".
fn file_target(src: &str, dst: &str) -> String {
    if dst.ends_with('/') {
        let name = src.trim_end_matches('/').rsplit('/').next().unwrap_or(src);
        format!("{dst}{name}")
    } else {
        dst.to_string()
    }
}

impl CopyArgs {
    fn direction(&self) -> Direction {
        if self.stage_out {
            Direction::Out
        } else {
            Direction::In
        }
    }

    fn item(&self) -> StageItem {
        let kind = if self.directory {
            ItemKind::Directory
        } else {
            ItemKind::File
        };
        let dst = if self.directory {
            self.dst.clone()
        } else {
            file_target(&self.src, &self.dst)
        };
        match self.direction() {
            Direction::In => StageItem {
                kind,
                pfs: PathBuf::from(&self.src),
                instance_path: dst,
            },
            Direction::Out => StageItem {
                kind,
                pfs: PathBuf::from(dst),
                instance_path: self.src.clone(),
            },
        }
    }

    fn options(&self) -> StageOptions {
        StageOptions {
            workers: self.workers.max(1),
            chunk_size: self.chunk_size,
            checksum: self.checksum,
            preserve_owner: self.preserve_owner,
            owner: self.owner,
            sync: !self.no_sync,
        }
    }
}

/// Cancels the stage on the first SIGINT/SIGTERM (files in flight are abandoned and their
/// temporaries removed); a second signal exits at once.
fn watch_signals(progress: Arc<Progress>) {
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return;
        };
        let mut seen = 0;
        loop {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            seen += 1;
            if seen == 1 {
                eprintln!(
                    "\nsurge stage: interrupted, removing incomplete files (again to quit now)"
                );
                progress.cancel();
            } else {
                std::process::exit(130);
            }
        }
    });
}

/// Replay a cache instance's journal (type=cache) on its PFS directory: what `surge run`
/// does in the background for a cache job, by hand (a kept instance whose drain failed, or a
/// test). Runs as you: the PFS directory must be writable by you.
///
/// Without --follow, drains until the journal is empty and exits (0), or exits 1 naming the
/// change that failed (it stays in the journal: run again). With --follow, keeps draining new
/// changes until SIGINT/SIGTERM, then drains what is left and exits.
///
/// One drainer at a time: while another drain holds the journal (a job's, a drain task's),
/// this one waits until the holder has drained everything journaled when it started (exits 1
/// if the holder makes no progress for 60 s), or with --follow waits, and once told to stop
/// ends when the holder has drained everything journaled before the stop.
///
/// Examples:
///   surge stage drain --manager mgr:7060 --instance 42
///   surge stage drain --server 127.0.0.1:7001 --instance 42 --pfs /lus/run --follow
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct DrainArgs {
    /// The instance (see `surge stage copy`).
    #[command(flatten)]
    pub source: surge_client::cli::InstanceSource,
    /// The PFS directory (default: the instance's own pfs=).
    #[arg(long)]
    pub pfs: Option<PathBuf>,
    /// Keep draining until told to stop.
    #[arg(long)]
    pub follow: bool,
    /// Print what was drained as JSON: {"entries","files","bytes","pending"}.
    #[arg(long)]
    pub json: bool,
}

pub fn run_drain(args: DrainArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let (desc, token) = args.source.resolve(Some(0)).await?;
        let pfs = match (&args.pfs, &desc.cache_pfs) {
            (Some(p), _) => p.clone(),
            (None, Some(p)) => PathBuf::from(p),
            (None, None) => anyhow::bail!(
                "instance {} is not a cache (type=cache) instance: it has no journal to drain",
                desc.instance
            ),
        };
        let client = Arc::new(InstanceClient::new(desc, NamespaceId(0), token)?);
        let state = Arc::new(crate::drain::DrainState::default());
        let t = std::time::Instant::now();
        if args.follow {
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let s2 = stop.clone();
            tokio::spawn(async move {
                use tokio::signal::unix::{signal, SignalKind};
                if let (Ok(mut i), Ok(mut t)) = (
                    signal(SignalKind::interrupt()),
                    signal(SignalKind::terminate()),
                ) {
                    tokio::select! { _ = i.recv() => {}, _ = t.recv() => {} }
                }
                s2.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            crate::drain::drain_loop(
                client,
                pfs.clone(),
                state.clone(),
                stop,
                std::time::Duration::from_millis(100),
            )
            .await;
        } else {
            match crate::drain::drain_pass(&client, &pfs, &state.stats).await {
                Ok(_) => {}
                // Another drainer holds the journal (the drain of a job that uses the cache):
                // what is journaled now is on the PFS once that one has applied it.
                Err(crate::drain::DrainError::Elsewhere(why)) => {
                    eprintln!("surge stage drain: {why}: waiting for it to drain the changes");
                    if let Err(e) = drained_elsewhere(&client).await {
                        eprintln!("surge stage drain: {e:#}");
                        return Ok(ExitCode::from(1));
                    }
                }
                Err(e) => {
                    eprintln!("surge stage drain: {e}");
                    return Ok(ExitCode::from(1));
                }
            }
        }
        let st = &state.stats;
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "entries": load(&st.entries), "files": load(&st.files),
                    "bytes": load(&st.bytes), "pending": load(&st.pending),
                })
            );
        } else {
            println!(
                "drained {} changes to {}: {} files, {} in {:.2} s",
                load(&st.entries),
                pfs.display(),
                load(&st.files),
                format_bytes(load(&st.bytes)),
                t.elapsed().as_secs_f64()
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// Waits until every change journaled in `client`'s cache now is on the PFS, applied by the
/// drainer that holds the journal; gives up when the journal has not moved for
/// [`crate::drain::DRAIN_STALL`] (that drainer is stuck: its PFS is gone, or it is).
async fn drained_elsewhere(client: &InstanceClient) -> anyhow::Result<()> {
    let target = client.drain_progress().await?.newest;
    let (mut oldest, mut since) = (0, std::time::Instant::now());
    client
        .wait_drained(target, |p| -> anyhow::Result<()> {
            if p.oldest_entry != oldest {
                (oldest, since) = (p.oldest_entry, std::time::Instant::now());
            }
            anyhow::ensure!(
                since.elapsed() < crate::drain::DRAIN_STALL,
                "the drainer holding the journal made no progress for {} s; {} change(s) not on \
                 the PFS",
                crate::drain::DRAIN_STALL.as_secs(),
                p.pending
            );
            Ok(())
        })
        .await
}

pub fn run_copy(args: CopyArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(copy(args))
}

async fn copy(args: CopyArgs) -> anyhow::Result<ExitCode> {
    let direction = args.direction();
    let label = format!("stage {}", direction.as_str());
    let (desc, token) = args.source.resolve(Some(args.ns)).await?;
    let instance = desc.instance;
    let client = InstanceClient::new(desc, NamespaceId(args.ns), token)
        .with_context(|| format!("cannot use instance {instance} (namespace {})", args.ns))?;
    let client = Arc::new(client);
    let item = args.item();
    let plan = plan(&client, direction, std::slice::from_ref(&item)).await?;
    if !args.json {
        eprintln!(
            "{label}: {} files ({}), {} dirs, {} symlinks to copy",
            plan.files,
            format_bytes(plan.bytes),
            plan.dirs,
            plan.symlinks
        );
    }
    for s in &plan.skipped {
        eprintln!("{label}: skipping {}: {}", s.path, s.error);
    }
    check_fits(&client, &plan).await?;

    let progress = Arc::new(Progress::new());
    watch_signals(progress.clone());
    let renderer = ProgressRenderer::start(progress.clone(), label.clone());
    let result = execute(client, &plan, &args.options(), progress).await;
    renderer.finish();
    let report = match result {
        Ok(r) => r,
        Err(StageError::Cancelled) => {
            eprintln!("{label}: cancelled; files not finished were removed");
            return Ok(ExitCode::from(130));
        }
        Err(e) => return Err(e.into()),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", summary_line(&label, &report));
    }
    const SHOWN: usize = 20;
    for f in report.failures.iter().take(SHOWN) {
        eprintln!(
            "{label}: FAILED {} -> {}: {}",
            f.path, f.destination, f.error
        );
    }
    if report.failed() > SHOWN as u64 {
        eprintln!(
            "{label}: ... and {} more failures (--json lists the first {})",
            report.failed() - SHOWN as u64,
            crate::MAX_FAILURES
        );
    }
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(subcommand)]
        cmd: StageCommand,
    }

    fn parse(args: &[&str]) -> Result<CopyArgs, clap::Error> {
        let mut v = vec![
            "stage",
            "copy",
            "--server",
            "127.0.0.1:1",
            "--instance",
            "7",
        ];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).map(|c| match c.cmd {
            StageCommand::Copy(a) => a,
        })
    }

    #[test]
    fn direction_is_required_and_exclusive() {
        assert!(parse(&["a", "b"]).is_err());
        assert!(parse(&["--in", "--out", "a", "b"]).is_err());
        assert_eq!(
            parse(&["--out", "/a", "b"]).unwrap().direction(),
            Direction::Out
        );
    }

    #[test]
    fn items_follow_the_directive_rules() {
        let a = parse(&["--in", "/pfs/x/big.dat", "/in/"]).unwrap();
        assert_eq!(
            a.item(),
            StageItem {
                kind: ItemKind::File,
                pfs: "/pfs/x/big.dat".into(),
                instance_path: "/in/big.dat".into()
            }
        );
        let a = parse(&["--out", "--directory", "/results", "/pfs/out"]).unwrap();
        assert_eq!(
            a.item(),
            StageItem {
                kind: ItemKind::Directory,
                pfs: "/pfs/out".into(),
                instance_path: "/results".into()
            }
        );
        let a = parse(&["--in", "--owner", "10:20", "a", "/b"]).unwrap();
        assert_eq!(a.options().owner, Some((10, 20)));
        assert!(parse(&["--in", "--owner", "x", "a", "/b"]).is_err());
    }
}
