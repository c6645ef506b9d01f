//! One benchmark run from start to report: check the target, create the run directory, start
//! the worker processes, run every phase of every repetition behind the barrier, remove the
//! files, and summarise. `io` and `md` share this; they differ only in their phases and in what
//! each phase may touch after a stonewalled predecessor.

use crate::backend::{Backend, OpenFlags, Space};
use crate::cleanup::{self, RunDir};
use crate::ior::IoParams;
use crate::layout;
use crate::mdtest::MdParams;
use crate::progress::ProgressLine;
use crate::result::{Phase, PhaseResult, PhaseSummary};
use crate::workers::{Job, WorkerCommand, WorkerPool};
use crate::BenchError;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What every run needs besides its parameters.
#[derive(Clone)]
pub struct RunContext {
    pub backend: Arc<dyn Backend>,
    pub worker: WorkerCommand,
    /// Keep the files (IOR `-k`).
    pub keep: bool,
    /// Show the live progress line (when stderr is a terminal).
    pub progress: bool,
}

/// The full result of `surge bench io` or `surge bench md`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// `surge.bench.io/1` or `surge.bench.md/1`.
    pub schema: String,
    pub path: String,
    pub fs_type: String,
    pub backend: String,
    pub host: String,
    pub started_at: String,
    pub params: Job,
    /// Every phase of every repetition.
    pub results: Vec<PhaseResult>,
    /// Min/mean/max over repetitions, per phase.
    pub summary: Vec<PhaseSummary>,
    /// Things the reader should know (cache effects, fallbacks, kept files).
    pub notes: Vec<String>,
}

impl Report {
    pub fn summary_of(&self, phase: Phase) -> Option<&PhaseSummary> {
        self.summary.iter().find(|s| s.phase == phase)
    }
}

/// Checks that `path` is an existing directory with room for `bytes` and `inodes`, before
/// anything is written. Returns the file system's figures for the report.
pub fn preflight(
    backend: &dyn Backend,
    path: &Path,
    bytes: u64,
    inodes: u64,
) -> Result<Space, BenchError> {
    check_dir(backend, path)?;
    check_space(backend, path, bytes, inodes)
}

/// Creates the run directory after checking the target: exists, is a directory, is writable
/// (the directory can be created), and has room. Data is written only after all of these.
fn open_run_dir(
    ctx: &RunContext,
    path: &Path,
    tag: &str,
    bytes: u64,
    inodes: u64,
) -> Result<(RunDir, Space), BenchError> {
    check_dir(&*ctx.backend, path)?;
    let dir = RunDir::create(
        ctx.backend.clone(),
        crate::backend::unique_run_dir(path, tag),
        ctx.keep,
    )?;
    let space = check_space(&*ctx.backend, path, bytes, inodes)?;
    Ok((dir, space))
}

fn check_dir(backend: &dyn Backend, path: &Path) -> Result<(), BenchError> {
    let st = backend.stat(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            BenchError::Setup(format!("{} does not exist", path.display()))
        }
        _ => BenchError::Setup(format!("cannot stat {}: {e}", path.display())),
    })?;
    if !st.is_dir {
        return Err(BenchError::Setup(format!(
            "{} is not a directory; give the directory to benchmark in",
            path.display()
        )));
    }
    Ok(())
}

fn check_space(
    backend: &dyn Backend,
    path: &Path,
    bytes: u64,
    inodes: u64,
) -> Result<Space, BenchError> {
    let space = backend.space(path).map_err(|e| {
        BenchError::Setup(format!(
            "cannot read the capacity of {}: {e}",
            path.display()
        ))
    })?;
    if bytes > space.avail_bytes {
        return Err(BenchError::Setup(format!(
            "not enough space in {}: the run writes {} but the file system has {} free",
            path.display(),
            surge_core::format_bytes(bytes),
            surge_core::format_bytes(space.avail_bytes)
        )));
    }
    if let Some(free) = space.avail_inodes {
        if inodes > free {
            return Err(BenchError::Setup(format!(
                "not enough inodes in {}: the run creates {inodes} files but the file system \
                 has {free} free",
                path.display()
            )));
        }
    }
    Ok(space)
}

/// Fails clearly when the target refuses O_DIRECT (tmpfs, some FUSE file systems).
fn probe_direct(backend: &dyn Backend, dir: &Path, fs_type: &str) -> Result<(), BenchError> {
    let probe = dir.join("direct-probe");
    let flags = OpenFlags::create_write().with_direct(true);
    match backend.open(&probe, flags) {
        Ok(f) => {
            let _ = f.close();
            let _ = backend.unlink(&probe);
            Ok(())
        }
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Err(BenchError::DirectUnsupported {
            path: dir.parent().unwrap_or(dir).display().to_string(),
            fs_type: fs_type.to_string(),
        }),
        Err(e) => Err(BenchError::Io {
            op: "open with O_DIRECT".into(),
            path: probe,
            source: e,
        }),
    }
}

/// Whether `path` accepts O_DIRECT (calibrate's `--direct auto` asks before choosing).
pub fn supports_direct(backend: Arc<dyn Backend>, path: &Path) -> Result<bool, BenchError> {
    let dir = RunDir::create(
        backend.clone(),
        crate::backend::unique_run_dir(path, "probe"),
        false,
    )?;
    match probe_direct(&*backend, dir.path(), "") {
        Ok(()) => Ok(true),
        Err(BenchError::DirectUnsupported { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

fn context_line(kind: &str, path: &Path, procs: u32, rep: u32, reps: u32) -> String {
    format!(
        "{kind} {} procs={procs} rep {}/{reps}",
        path.display(),
        rep + 1
    )
}

/// `surge bench io`: IOR's write and read phases over `params.repetitions`.
pub fn run_io(ctx: &RunContext, path: &Path, params: &IoParams) -> Result<Report, BenchError> {
    params.validate()?;
    cleanup::install_handler();
    let backend = ctx.backend.clone();
    let (run_dir, space) = open_run_dir(ctx, path, "io", params.aggregate_bytes(), 0)?;
    if params.direct {
        probe_direct(&*backend, run_dir.path(), &space.fs_type)?;
    }
    let mut notes = Vec::new();
    if params.read && !params.direct && !params.drop_cache && space.fs_type != "tmpfs" {
        notes.push(
            "reads may be served by this host's page cache (the data was just written here); \
             use --direct or --drop-cache to measure the storage"
                .to_string(),
        );
    }
    if ctx.keep {
        notes.push(format!("files kept in {}", run_dir.path().display()));
    }
    let started_at = now_rfc3339();
    let mut pool = WorkerPool::start(
        &ctx.worker,
        params.procs,
        backend.name(),
        &Job::Io(params.clone()),
    )?;
    let mut progress = ProgressLine::new(ctx.progress);
    let mut results = Vec::new();
    let n = params.procs as usize;
    for rep in 0..params.repetitions {
        let rep_dir = run_dir.path().join(format!("rep{rep}"));
        backend.mkdir(&rep_dir).map_err(|source| BenchError::Io {
            op: "mkdir".into(),
            path: rep_dir.clone(),
            source,
        })?;
        progress.set_context(
            context_line("io", path, params.procs, rep, params.repetitions),
            params.transfers_per_rank(),
            params.transfer,
        );
        let mut written: Option<Vec<u64>> = None;
        if !params.write {
            // Read-only runs read files laid out first, untimed (as fio does).
            let r = pool.run_phase(&rep_dir, Phase::Write, &vec![None; n], None, &mut progress)?;
            written = Some(PhaseResult::from_ranks(Phase::Write, rep, &r).ops_by_rank);
        }
        for phase in params.phases() {
            let limits: Vec<Option<u64>> = match (phase, &written) {
                (Phase::Read, Some(w)) => (0..params.procs)
                    .map(|rank| w.get(layout::read_owner(params, rank) as usize).copied())
                    .collect(),
                _ => vec![None; n],
            };
            let ranks =
                pool.run_phase(&rep_dir, phase, &limits, params.deadline_s, &mut progress)?;
            let result = PhaseResult::from_ranks(phase, rep, &ranks);
            if phase == Phase::Write {
                written = Some(result.ops_by_rank.clone());
            }
            results.push(result);
        }
        if !ctx.keep {
            backend
                .remove_tree(&rep_dir)
                .map_err(|source| BenchError::Io {
                    op: "remove".into(),
                    path: rep_dir.clone(),
                    source,
                })?;
        }
    }
    pool.shutdown();
    progress.clear();
    if results.iter().any(|r| r.stonewalled) {
        notes.push(
            "stonewalled: --deadline stopped some processes early; rates count what was moved"
                .to_string(),
        );
    }
    Ok(Report {
        schema: "surge.bench.io/1".into(),
        path: path.display().to_string(),
        fs_type: space.fs_type,
        backend: backend.name().into(),
        host: crate::host_name(),
        started_at,
        params: Job::Io(params.clone()),
        summary: PhaseSummary::of_all(&results),
        results,
        notes,
    })
}

/// `surge bench md`: mdtest's create, stat, open-close and remove phases.
pub fn run_md(ctx: &RunContext, path: &Path, params: &MdParams) -> Result<Report, BenchError> {
    params.validate()?;
    cleanup::install_handler();
    let backend = ctx.backend.clone();
    let dirs = params.dirs();
    // A file costs at least one block on most file systems even when empty; count 4 KiB each.
    let bytes = params.total_files() * params.write_bytes.max(4096);
    let inodes = params.total_files() + dirs.len() as u64 + 2;
    let (run_dir, space) = open_run_dir(ctx, path, "md", bytes, inodes)?;
    let mut notes = Vec::new();
    if ctx.keep {
        notes.push(format!("files kept in {}", run_dir.path().display()));
    }
    let started_at = now_rfc3339();
    let mut pool = WorkerPool::start(
        &ctx.worker,
        params.procs,
        backend.name(),
        &Job::Md(params.clone()),
    )?;
    let mut progress = ProgressLine::new(ctx.progress);
    let mut results = Vec::new();
    let n = params.procs as usize;
    for rep in 0..params.repetitions {
        let rep_dir = run_dir.path().join(format!("rep{rep}"));
        let mkdir = |p: PathBuf| {
            backend.mkdir(&p).map_err(|source| BenchError::Io {
                op: "mkdir".into(),
                path: p,
                source,
            })
        };
        mkdir(rep_dir.clone())?;
        for d in &dirs {
            mkdir(rep_dir.join(d))?;
        }
        progress.set_context(
            context_line("md", path, params.procs, rep, params.repetitions),
            params.files,
            0,
        );
        let mut created: Vec<Option<u64>> = vec![None; n];
        for phase in params.phases() {
            let ranks = pool.run_phase(&rep_dir, phase, &created, None, &mut progress)?;
            let result = PhaseResult::from_ranks(phase, rep, &ranks);
            if phase == Phase::Create {
                created = result.ops_by_rank.iter().map(|&c| Some(c)).collect();
            }
            results.push(result);
        }
        if !ctx.keep {
            backend
                .remove_tree(&rep_dir)
                .map_err(|source| BenchError::Io {
                    op: "remove".into(),
                    path: rep_dir.clone(),
                    source,
                })?;
        }
    }
    pool.shutdown();
    progress.clear();
    if results.iter().any(|r| r.stonewalled) {
        notes.push(
            "stonewalled: --deadline stopped the create phase early; later phases work on the \
             files that were created"
                .to_string(),
        );
    }
    Ok(Report {
        schema: "surge.bench.md/1".into(),
        path: path.display().to_string(),
        fs_type: space.fs_type,
        backend: backend.name().into(),
        host: crate::host_name(),
        started_at,
        params: Job::Md(params.clone()),
        summary: PhaseSummary::of_all(&results),
        results,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::PosixBackend;

    #[test]
    fn preflight_rejects_missing_file_and_too_big() {
        let b = PosixBackend;
        let e = preflight(&b, Path::new("/nonexistent/surge"), 0, 0).unwrap_err();
        assert_eq!(e.to_string(), "/nonexistent/surge does not exist");
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("f");
        std::fs::write(&f, b"").unwrap();
        let e = preflight(&b, &f, 0, 0).unwrap_err();
        assert!(e.to_string().contains("is not a directory"), "{e}");
        let e = preflight(&b, tmp.path(), u64::MAX / 2, 0).unwrap_err();
        assert!(e.to_string().starts_with("not enough space in"), "{e}");
        assert!(preflight(&b, tmp.path(), 4096, 1).is_ok());
    }

    /// A POSIX backend that refuses O_DIRECT the way tmpfs before Linux 6.6 does.
    struct NoDirect;
    impl Backend for NoDirect {
        fn name(&self) -> &'static str {
            "posix"
        }
        fn open(
            &self,
            path: &Path,
            flags: OpenFlags,
        ) -> std::io::Result<Box<dyn crate::backend::BenchFile>> {
            if flags.direct {
                return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
            }
            PosixBackend.open(path, flags)
        }
        fn stat(&self, p: &Path) -> std::io::Result<crate::backend::FileStat> {
            PosixBackend.stat(p)
        }
        fn unlink(&self, p: &Path) -> std::io::Result<()> {
            PosixBackend.unlink(p)
        }
        fn mkdir(&self, p: &Path) -> std::io::Result<()> {
            PosixBackend.mkdir(p)
        }
        fn rmdir(&self, p: &Path) -> std::io::Result<()> {
            PosixBackend.rmdir(p)
        }
        fn list_dir(&self, p: &Path) -> std::io::Result<Vec<String>> {
            PosixBackend.list_dir(p)
        }
        fn space(&self, p: &Path) -> std::io::Result<Space> {
            PosixBackend.space(p)
        }
    }

    #[test]
    fn refused_direct_is_a_clear_error_before_any_worker_starts() {
        let tmp = tempfile::tempdir().unwrap();
        let backend: Arc<dyn Backend> = Arc::new(NoDirect);
        assert!(!supports_direct(backend.clone(), tmp.path()).unwrap());
        let ctx = RunContext {
            backend,
            // Never started: the probe fails first.
            worker: WorkerCommand {
                program: "/nonexistent/surge".into(),
                args: vec![],
            },
            keep: false,
            progress: false,
        };
        let p = IoParams {
            transfer: 4096,
            block: 4096,
            direct: true,
            ..IoParams::default()
        };
        let e = run_io(&ctx, tmp.path(), &p).unwrap_err();
        assert!(matches!(e, BenchError::DirectUnsupported { .. }), "{e}");
        assert!(e.to_string().contains("refuses O_DIRECT"), "{e}");
        // Nothing is left behind.
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn direct_probe_agrees_with_the_kernel() {
        use std::os::unix::fs::OpenOptionsExt;
        let tmp = tempfile::tempdir_in("/dev/shm").unwrap();
        let kernel_says = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .custom_flags(libc::O_DIRECT)
            .open(tmp.path().join("k"))
            .is_ok();
        let b: Arc<dyn Backend> = Arc::new(PosixBackend);
        assert_eq!(supports_direct(b, tmp.path()).unwrap(), kernel_says);
    }
}
