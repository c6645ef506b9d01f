//! Progress of a stage: lock-free counters the engine bumps and any caller (the manager, a
//! progress bar) polls, and a renderer for command lines: a live bar on a terminal, one log line
//! per second otherwise, and a one-line summary at the end.

use crate::{Plan, StageReport};
use serde::{Deserialize, Serialize};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use surge_core::format_bytes;

/// Counters of a running stage. Share it (`Arc`) with [`crate::execute`] and poll
/// [`Progress::snapshot`]; [`Progress::cancel`] asks the stage to stop.
#[derive(Debug, Default)]
pub struct Progress {
    started: OnceLock<Instant>,
    /// Elapsed time, frozen when the stage ends.
    ended_ns: AtomicU64,
    ended: AtomicBool,
    files_total: AtomicU64,
    bytes_total: AtomicU64,
    files_done: AtomicU64,
    bytes_done: AtomicU64,
    failed: AtomicU64,
    cancelled: AtomicBool,
}

/// A consistent-enough copy of the counters at one moment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProgressSnapshot {
    pub files_done: u64,
    pub files_total: u64,
    /// Bytes copied so far (chunks of large files count as they land).
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub failed: u64,
    #[serde(with = "secs")]
    pub elapsed: Duration,
    /// The stage has ended (successfully or not).
    pub finished: bool,
    pub cancelled: bool,
}

mod secs {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let v = f64::deserialize(d)?;
        Ok(Duration::try_from_secs_f64(v).unwrap_or_default())
    }
}

impl ProgressSnapshot {
    pub fn mib_per_s(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s <= 0.0 {
            0.0
        } else {
            self.bytes_done as f64 / 1048576.0 / s
        }
    }

    /// Fraction done, by bytes when there are any, else by files.
    pub fn fraction(&self) -> f64 {
        if self.bytes_total > 0 {
            (self.bytes_done as f64 / self.bytes_total as f64).min(1.0)
        } else if self.files_total > 0 {
            (self.files_done as f64 / self.files_total as f64).min(1.0)
        } else if self.finished {
            1.0
        } else {
            0.0
        }
    }
}

impl Progress {
    pub fn new() -> Progress {
        Progress::default()
    }

    /// Called by `execute` when it starts on a plan.
    pub(crate) fn begin(&self, plan: &Plan) {
        let _ = self.started.set(Instant::now());
        self.files_total
            .fetch_add(plan.files + plan.symlinks, Ordering::Relaxed);
        self.bytes_total.fetch_add(plan.bytes, Ordering::Relaxed);
    }

    pub(crate) fn end(&self) {
        let ns = self.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        self.ended_ns.store(ns, Ordering::Relaxed);
        self.ended.store(true, Ordering::Release);
    }

    pub(crate) fn add_bytes(&self, n: u64) {
        self.bytes_done.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn file_done(&self) {
        self.files_done.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn file_failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    fn elapsed(&self) -> Duration {
        self.started.get().map(|t| t.elapsed()).unwrap_or_default()
    }

    /// Asks the stage to stop: no new file is started, files in flight stop at their next
    /// chunk and their temporaries are removed; `execute` then returns
    /// [`crate::StageError::Cancelled`].
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    pub fn snapshot(&self) -> ProgressSnapshot {
        let finished = self.ended.load(Ordering::Acquire);
        ProgressSnapshot {
            files_done: self.files_done.load(Ordering::Relaxed),
            files_total: self.files_total.load(Ordering::Relaxed),
            bytes_done: self.bytes_done.load(Ordering::Relaxed),
            bytes_total: self.bytes_total.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            elapsed: if finished {
                Duration::from_nanos(self.ended_ns.load(Ordering::Relaxed))
            } else {
                self.elapsed()
            },
            finished,
            cancelled: self.is_cancelled(),
        }
    }
}

fn eta(s: &ProgressSnapshot) -> String {
    let f = s.fraction();
    if f <= 0.0 || f >= 1.0 {
        return "-".into();
    }
    let left = s.elapsed.as_secs_f64() * (1.0 - f) / f;
    if left >= 3600.0 {
        format!(
            "{:.0}h{:02.0}m",
            (left / 3600.0).floor(),
            (left % 3600.0) / 60.0
        )
    } else if left >= 60.0 {
        format!("{:.0}m{:02.0}s", (left / 60.0).floor(), left % 60.0)
    } else {
        format!("{left:.0}s")
    }
}

/// The live terminal line: a bar, bytes, files, rate and time left.
pub fn bar_line(label: &str, s: &ProgressSnapshot) -> String {
    const WIDTH: usize = 24;
    let f = s.fraction();
    let filled = ((f * WIDTH as f64) as usize).min(WIDTH);
    let mut bar = "=".repeat(filled);
    if filled < WIDTH {
        bar.push('>');
        bar.push_str(&" ".repeat(WIDTH - filled - 1));
    }
    let failed = if s.failed > 0 {
        format!("  {} failed", s.failed)
    } else {
        String::new()
    };
    format!(
        "{label} [{bar}] {:>3.0}%  {} / {}  {}/{} files  {:.1} MiB/s  ETA {}{failed}",
        f * 100.0,
        format_bytes(s.bytes_done),
        format_bytes(s.bytes_total),
        s.files_done,
        s.files_total,
        s.mib_per_s(),
        eta(s)
    )
}

/// The line logged once per second when stderr is not a terminal.
pub fn log_line(label: &str, s: &ProgressSnapshot) -> String {
    format!(
        "{label}: {}/{} files, {} of {} ({:.0}%), {:.1} MiB/s, {} failed, {:.1} s",
        s.files_done,
        s.files_total,
        format_bytes(s.bytes_done),
        format_bytes(s.bytes_total),
        s.fraction() * 100.0,
        s.mib_per_s(),
        s.failed,
        s.elapsed.as_secs_f64()
    )
}

/// The one-line summary printed at the end of a stage.
pub fn summary_line(label: &str, r: &StageReport) -> String {
    let rate = if r.seconds > 0.0 {
        r.files as f64 / r.seconds
    } else {
        0.0
    };
    let mut s = format!(
        "{label}: {} files ({}), {} dirs, {} symlinks in {:.2} s: {:.1} MiB/s, {:.0} files/s; {} failed",
        r.files,
        format_bytes(r.bytes),
        r.dirs,
        r.symlinks,
        r.seconds,
        r.mib_per_s(),
        rate,
        r.failed()
    );
    if !r.skipped.is_empty() {
        s.push_str(&format!(", {} skipped", r.skipped.len()));
    }
    if r.checksummed {
        s.push_str(", checksums verified");
    }
    s
}

/// Draws a [`Progress`] on stderr from a thread of its own until [`ProgressRenderer::finish`]
/// (or drop): a bar redrawn 5 times a second on a terminal, a log line per second otherwise.
pub struct ProgressRenderer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ProgressRenderer {
    /// Starts drawing; the mode follows whether stderr is a terminal.
    pub fn start(progress: Arc<Progress>, label: impl Into<String>) -> ProgressRenderer {
        Self::with_mode(progress, label, std::io::stderr().is_terminal())
    }

    pub fn with_mode(
        progress: Arc<Progress>,
        label: impl Into<String>,
        terminal: bool,
    ) -> ProgressRenderer {
        let label = label.into();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("stage-progress".into())
            .spawn(move || {
                let tick = if terminal {
                    Duration::from_millis(200)
                } else {
                    Duration::from_secs(1)
                };
                let mut next = Instant::now() + tick;
                while !flag.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(50));
                    if Instant::now() < next {
                        continue;
                    }
                    next += tick;
                    let s = progress.snapshot();
                    let mut err = std::io::stderr().lock();
                    if terminal {
                        let _ = write!(err, "\r{}\x1b[K", bar_line(&label, &s));
                    } else {
                        let _ = writeln!(err, "{}", log_line(&label, &s));
                    }
                    let _ = err.flush();
                }
                if terminal {
                    let _ = write!(std::io::stderr(), "\r\x1b[K");
                }
            })
            .ok();
        ProgressRenderer { stop, thread }
    }

    /// Stops drawing (and clears the bar).
    pub fn finish(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ProgressRenderer {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_show_counts_rate_and_fraction() {
        let s = ProgressSnapshot {
            files_done: 5,
            files_total: 10,
            bytes_done: 512 << 20,
            bytes_total: 1 << 30,
            failed: 1,
            elapsed: Duration::from_secs(2),
            finished: false,
            cancelled: false,
        };
        let bar = bar_line("stage in", &s);
        assert!(bar.contains(" 50%"), "{bar}");
        assert!(bar.contains("5/10 files"), "{bar}");
        assert!(bar.contains("256.0 MiB/s"), "{bar}");
        assert!(bar.contains("ETA 2s"), "{bar}");
        assert!(bar.contains("1 failed"), "{bar}");
        let log = log_line("stage in", &s);
        assert!(
            log.starts_with("stage in: 5/10 files, 512 MiB of 1 GiB (50%)"),
            "{log}"
        );
    }

    #[test]
    fn summary_has_files_bytes_seconds_and_rate() {
        let r = StageReport {
            files: 4,
            bytes: 4 << 30,
            seconds: 2.0,
            ..StageReport::default()
        };
        let s = summary_line("stage out", &r);
        assert!(
            s.starts_with("stage out: 4 files (4 GiB), 0 dirs, 0 symlinks in 2.00 s: 2048.0 MiB/s"),
            "{s}"
        );
    }
}
