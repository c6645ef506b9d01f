//! The MPI-IO backend of `surge bench io` (`--backend mpiio`), modelled on IOR's aiori-MPIIO:
//! collective (`--collective`, IOR `-c`) or independent writes and reads of a shared file (or a
//! file per process), with the MPI-IO hints of `$ROMIO_HINTS` passed through.
//!
//! MPI ranks are not the POSIX backend's worker processes: they are started by `mpirun` and
//! share collective calls, so this backend has its own runner. The program is C
//! (`mpiio/surge_mpiio.c`, embedded here) compiled on first use with the MPI found on this
//! machine (`$SURGE_MPICC`, default `mpicc`) into `~/.cache/surge/mpiio/<hash>/`, so Surge
//! builds without MPI and uses the site's MPI where there is one. It prints each phase's
//! per-rank results as [`RankResult`]s; the arithmetic and the report are the POSIX backend's.
//!
//! Launcher: `$SURGE_MPIRUN` (default `mpirun`) with `$SURGE_MPIRUN_ARGS` (split at spaces);
//! as root, Open MPI's `--allow-run-as-root` is added, and `--oversubscribe` so that more ranks
//! than cores start (a 2-core machine runs 4 ranks). With `$ROMIO_HINTS` set and no
//! `$OMPI_MCA_io`, Open MPI's ROMIO component is chosen (OMPIO ignores the hints file).

use crate::backend::{PosixBackend, Space};
use crate::cleanup::{self, RunDir};
use crate::ior::IoParams;
use crate::result::{Phase, PhaseResult, PhaseSummary, RankResult};
use crate::run::{preflight, Report};
use crate::workers::Job;
use crate::BenchError;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

const SOURCE: &str = include_str!("../mpiio/surge_mpiio.c");

/// One phase as the MPI program prints it.
#[derive(Deserialize)]
struct PhaseLine {
    phase: Phase,
    #[serde(default)]
    info: BTreeMap<String, String>,
    ranks: Vec<RankResult>,
}

fn setup(msg: String) -> BenchError {
    BenchError::Setup(msg)
}

fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("surge/mpiio")
}

/// The compiled MPI program, compiling it if this source and compiler have not been yet.
pub fn program() -> Result<PathBuf, BenchError> {
    let mpicc = std::env::var("SURGE_MPICC").unwrap_or_else(|_| "mpicc".into());
    let version = Command::new(&mpicc)
        .arg("--showme:version")
        .output()
        .or_else(|_| Command::new(&mpicc).arg("--version").output())
        .map_err(|e| {
            setup(format!(
                "the mpiio backend needs an MPI compiler: cannot run `{mpicc}` ({e}); install \
                 Open MPI (Debian: libopenmpi-dev openmpi-bin, as scripts/setup.sh does) or set \
                 SURGE_MPICC"
            ))
        })?;
    let tag = format!(
        "{:016x}",
        fnv1a(
            format!(
                "{SOURCE}\0{mpicc}\0{}",
                String::from_utf8_lossy(&version.stdout)
            )
            .as_bytes()
        )
    );
    let dir = cache_dir().join(tag);
    let exe = dir.join("surge_mpiio");
    if exe.is_file() {
        return Ok(exe);
    }
    std::fs::create_dir_all(&dir)
        .map_err(|e| setup(format!("cannot create {}: {e}", dir.display())))?;
    let src = dir.join("surge_mpiio.c");
    std::fs::write(&src, SOURCE)
        .map_err(|e| setup(format!("cannot write {}: {e}", src.display())))?;
    // Compile to a temporary name and rename: concurrent first uses do not see half a file.
    let tmp = dir.join(format!("surge_mpiio.{}", std::process::id()));
    let out = Command::new(&mpicc)
        .args(["-O2", "-o"])
        .arg(&tmp)
        .arg(&src)
        .output()
        .map_err(|e| setup(format!("cannot run {mpicc}: {e}")))?;
    if !out.status.success() {
        return Err(setup(format!(
            "{mpicc} failed to compile the mpiio benchmark ({}):\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    std::fs::rename(&tmp, &exe)
        .map_err(|e| setup(format!("cannot install {}: {e}", exe.display())))?;
    Ok(exe)
}

/// A tiny stable hash (FNV-1a) for the cache tag; no dependency for 16 hex digits.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// The `mpirun` command line for `procs` ranks.
pub fn launcher(procs: u32) -> Command {
    let mpirun = std::env::var("SURGE_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let mut cmd = Command::new(&mpirun);
    let open_mpi = Command::new(&mpirun)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("Open MPI"))
        .unwrap_or(false);
    if open_mpi {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            cmd.arg("--allow-run-as-root");
        }
        cmd.arg("--oversubscribe");
        // ROMIO_HINTS is ROMIO's: with hints and no component chosen, use Open MPI's ROMIO
        // component (its default, OMPIO, ignores the file and most hints).
        if std::env::var_os("ROMIO_HINTS").is_some() && std::env::var_os("OMPI_MCA_io").is_none() {
            if let Some(romio) = ompi_romio() {
                cmd.args(["--mca", "io", &romio]);
            }
        }
        // Pass the hints and the component choice to every rank.
        for var in ["ROMIO_HINTS", "OMPI_MCA_io"] {
            if std::env::var_os(var).is_some() {
                cmd.args(["-x", var]);
            }
        }
    }
    if let Ok(extra) = std::env::var("SURGE_MPIRUN_ARGS") {
        cmd.args(extra.split_whitespace());
    }
    cmd.args(["-np", &procs.to_string()]);
    cmd
}

/// Open MPI's ROMIO component (`romio321` in Open MPI 4.1), from `ompi_info`.
pub fn ompi_romio() -> Option<String> {
    let out = Command::new("ompi_info").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split("MCA io:").nth(1))
        .filter_map(|r| r.split_whitespace().next())
        .find(|c| c.starts_with("romio"))
        .map(str::to_string)
}

/// Refuses the options the MPI-IO backend does not implement, by name.
fn check(p: &IoParams) -> Result<(), BenchError> {
    let unsupported = [
        (p.random, "--random"),
        (p.fsync_per_write, "--fsync-per-write"),
        (p.direct, "--direct"),
        (p.drop_cache, "--drop-cache"),
        (p.verify, "--verify"),
        (p.deadline_s.is_some(), "--deadline"),
    ];
    for (set, flag) in unsupported {
        if set {
            return Err(setup(format!(
                "{flag} is not supported by the mpiio backend (it is by --backend posix)"
            )));
        }
    }
    if p.transfer > (1 << 30) {
        return Err(setup(
            "the mpiio backend takes transfers of at most 1GiB".into(),
        ));
    }
    Ok(())
}

fn run_ranks(
    exe: &Path,
    dir: &Path,
    p: &IoParams,
    collective: bool,
    write: bool,
    read: bool,
) -> Result<Vec<PhaseLine>, BenchError> {
    let b = |x: bool| if x { "1" } else { "0" };
    let out = launcher(p.procs)
        .arg(exe)
        .arg(dir)
        .args([
            p.transfer.to_string(),
            p.block.to_string(),
            p.segments.to_string(),
            b(p.shared_file).into(),
            b(collective).into(),
            b(write).into(),
            b(read).into(),
            b(p.reorder).into(),
            b(p.fsync).into(),
        ])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| setup(format!("cannot start mpirun: {e}")))?;
    if !out.status.success() {
        return Err(setup(format!(
            "mpirun of the mpiio benchmark failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = Vec::new();
    for l in text.lines().filter(|l| l.starts_with('{')) {
        let pl: PhaseLine = serde_json::from_str(l).map_err(|e| {
            setup(format!(
                "unreadable output of the mpiio benchmark ({e}): {l}"
            ))
        })?;
        lines.push(pl);
    }
    Ok(lines)
}

/// `surge bench io --backend mpiio`.
pub fn run_io_mpiio(
    path: &Path,
    p: &IoParams,
    collective: bool,
    keep: bool,
) -> Result<Report, BenchError> {
    p.validate()?;
    check(p)?;
    cleanup::install_handler();
    let exe = program()?;
    let backend = Arc::new(PosixBackend);
    let space: Space = preflight(&*backend, path, p.aggregate_bytes(), 0)?;
    let run_dir = RunDir::create(
        backend.clone(),
        crate::backend::unique_run_dir(path, "io"),
        keep,
    )?;
    let started_at = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let mut results = Vec::new();
    let mut info: BTreeMap<String, String> = BTreeMap::new();
    for rep in 0..p.repetitions {
        let rep_dir = run_dir.path().join(format!("rep{rep}"));
        std::fs::create_dir(&rep_dir).map_err(|source| BenchError::Io {
            op: "mkdir".into(),
            path: rep_dir.clone(),
            source,
        })?;
        if !p.write {
            // Read-only: lay the files out first, untimed.
            run_ranks(&exe, &rep_dir, p, collective, true, false)?;
        }
        for pl in run_ranks(&exe, &rep_dir, p, collective, p.write, p.read)? {
            if pl.ranks.is_empty() {
                return Err(setup("the mpiio benchmark reported no ranks".into()));
            }
            info.extend(pl.info);
            results.push(PhaseResult::from_ranks(pl.phase, rep, &pl.ranks));
        }
        if !keep {
            let _ = std::fs::remove_dir_all(&rep_dir);
        }
    }
    let mut notes = vec![format!(
        "MPI-IO, {} {}",
        if collective {
            "collective"
        } else {
            "independent"
        },
        if p.shared_file {
            "access to one shared file"
        } else {
            "access, a file per process"
        }
    )];
    if !info.is_empty() {
        notes.push(format!(
            "hints the MPI-IO library reports: {}",
            info.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    if p.read && space.fs_type != "tmpfs" {
        notes.push(
            "reads may be served by this host's page cache (the data was just written here)"
                .to_string(),
        );
    }
    if keep {
        notes.push(format!("files kept in {}", run_dir.path().display()));
    }
    Ok(Report {
        schema: "surge.bench.io/1".into(),
        path: path.display().to_string(),
        fs_type: space.fs_type,
        backend: "mpiio".into(),
        host: crate::host_name(),
        started_at,
        params: Job::Io(p.clone()),
        summary: PhaseSummary::of_all(&results),
        results,
        notes,
    })
}
