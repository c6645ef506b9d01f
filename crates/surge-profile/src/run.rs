//! Runs a command under the shim and turns its record files into a [`Profile`].
//!
//! Boundaries: this module spawns and waits; the counting happens in the shim, the merging in
//! [`crate::records`], the interpretation in [`crate::tables`].

use crate::model::{Ending, Profile, Source, SourceKind};
use crate::records;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What to run and where to keep the raw records.
#[derive(Debug, Clone)]
pub struct RunRequest {
    pub stage: String,
    pub command: Vec<String>,
    pub data_paths: Vec<String>,
    /// Keep the per-process record files here (created if missing) instead of a temp dir.
    pub records_dir: Option<PathBuf>,
    /// Send the command's stdout to surge's stderr (so `--json` on stdout stays parseable).
    pub stdout_to_stderr: bool,
}

pub(crate) fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// RFC 3339 (UTC, seconds) of a time since the Unix epoch.
pub(crate) fn rfc3339(secs: i64) -> String {
    // Howard Hinnant's days-to-civil algorithm.
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

pub(crate) fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    rfc3339(secs)
}

extern "C" fn ignore_signal(_: libc::c_int) {}

/// While the profiled command runs, Ctrl-C and SIGTERM reach it (same process group) but must
/// not kill surge before it has merged what the command did. A handler (not SIG_IGN, which
/// exec would pass on to the command) keeps surge alive.
struct SignalGuard {
    old_int: libc::sighandler_t,
    old_term: libc::sighandler_t,
}

impl SignalGuard {
    fn install() -> SignalGuard {
        let h = ignore_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: installing a handler that does nothing is async-signal-safe.
        unsafe {
            SignalGuard {
                old_int: libc::signal(libc::SIGINT, h),
                old_term: libc::signal(libc::SIGTERM, h),
            }
        }
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        // SAFETY: restores the dispositions saved above.
        unsafe {
            libc::signal(libc::SIGINT, self.old_int);
            libc::signal(libc::SIGTERM, self.old_term);
        }
    }
}

fn children_max_rss_bytes() -> u64 {
    // SAFETY: getrusage fills the struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) } == 0 {
        ru.ru_maxrss.max(0) as u64 * 1024
    } else {
        0
    }
}

/// Runs the command under the shim and returns its profile.
pub fn profile_command(req: &RunRequest) -> anyhow::Result<Profile> {
    let Some((program, args)) = req.command.split_first() else {
        anyhow::bail!(
            "no command given: write it after `--`, e.g. surge profile -- python3 job.py"
        );
    };
    let shim = crate::shim::install()?;
    let tmp;
    let dir: &Path = match &req.records_dir {
        Some(d) => {
            std::fs::create_dir_all(d)
                .with_context(|| format!("cannot create records directory {}", d.display()))?;
            d
        }
        None => {
            tmp = tempfile::Builder::new()
                .prefix("surge-profile-")
                .tempdir()
                .context("cannot create a temporary directory for the records")?;
            tmp.path()
        }
    };
    let dir =
        std::fs::canonicalize(dir).with_context(|| format!("cannot resolve {}", dir.display()))?;
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", shim.display()),
        _ => shim.display().to_string(),
    };
    tracing::debug!(shim = %shim.display(), records = %dir.display(), "running {:?}", req.command);
    let started_at = now_rfc3339();
    let guard = SignalGuard::install();
    let t0 = mono_ns();
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("LD_PRELOAD", &preload)
        .env("SURGE_PROFILE_DIR", &dir);
    if req.stdout_to_stderr {
        use std::os::fd::AsFd;
        let err = std::io::stderr()
            .as_fd()
            .try_clone_to_owned()
            .context("cannot duplicate stderr for the command's output")?;
        cmd.stdout(std::process::Stdio::from(err));
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run '{program}'"))?;
    let status = child
        .wait()
        .with_context(|| format!("cannot wait for '{program}'"))?;
    let wall_ns = mono_ns() - t0;
    drop(guard);

    use std::os::unix::process::ExitStatusExt;
    let source = Source {
        kind: SourceKind::Shim,
        command: req.command.clone(),
        file: None,
        exit_code: status.code(),
        signal: status.signal(),
        detail: match &req.records_dir {
            Some(_) => format!(
                "libsurge_shim (LD_PRELOAD), records kept in {}",
                dir.display()
            ),
            None => "libsurge_shim (LD_PRELOAD)".into(),
        },
    };
    let mut profile = Profile::new(&req.stage, source);
    profile.host = hostname();
    profile.started_at = started_at;
    profile.wall_time_s = wall_ns as f64 / 1e9;
    profile.max_rss_children_bytes = children_max_rss_bytes();
    profile.data_paths = req.data_paths.clone();
    let (recs, problems) = records::read_dir(&dir)?;
    if recs.is_empty() {
        anyhow::bail!(
            "'{program}' left no records in {}: a statically linked program, or one that clears \
             LD_PRELOAD, cannot be profiled by the shim (use strace -f -T -tt and --from instead)",
            dir.display()
        );
    }
    profile.caveats.extend(problems);
    records::merge_into(&mut profile, &recs, t0);
    // What the stage left behind: kept outputs vs deleted temporaries, and final sizes.
    for f in profile
        .files
        .iter_mut()
        .filter(|f| f.is_storage() && f.path.starts_with('/'))
    {
        match std::fs::symlink_metadata(&f.path) {
            Ok(m) => {
                f.exists_after = Some(true);
                if m.is_file() {
                    f.counters.size_seen = f.counters.size_seen.max(m.len());
                }
            }
            Err(_) => f.exists_after = Some(false),
        }
    }
    if let Some(sig) = status.signal() {
        profile.caveats.push(format!(
            "the command was killed by signal {sig}; the profile holds everything it did until then"
        ));
    }
    let unknown: Vec<String> = profile
        .processes
        .iter()
        .filter(|p| p.ending == Ending::Unknown)
        .map(|p| p.pid.to_string())
        .collect();
    if !unknown.is_empty() {
        profile.caveats.push(format!(
            "{} process(es) ended without their exit handler (crash, signal or _exit): pid {}; \
             their counters are complete up to their last call, their peak memory is unknown",
            unknown.len(),
            unknown.join(", ")
        ));
    }
    Ok(profile)
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339_of_known_instants() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(1_795_305_484), "2026-11-21T23:58:04Z");
        assert_eq!(super::rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }
}
