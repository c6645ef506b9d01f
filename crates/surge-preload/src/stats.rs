//! What the library did, counted: written at exit to `$SURGE_PRELOAD_STATS` (`%p` in it is
//! replaced by the process id) as one JSON object, so a test or a user can tell the data went
//! through the library and not through FUSE.

use std::sync::atomic::{AtomicU64, Ordering};

pub struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Counter {
        Counter(AtomicU64::new(0))
    }
    pub fn bump(&self) {
        self.add(1);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Descriptors the mount handed an object for.
pub static ADOPTED: Counter = Counter::new();
/// Descriptors of a Surge mount the mount kept (not open by passthrough, appends, ...).
pub static REFUSED: Counter = Counter::new();
pub static READS: Counter = Counter::new();
pub static READ_BYTES: Counter = Counter::new();
pub static WRITES: Counter = Counter::new();
pub static WRITE_BYTES: Counter = Counter::new();
/// `fsync`/`fdatasync` answered here.
pub static FSYNCS: Counter = Counter::new();
/// Commits asked of the mount (fsync, and before calls handed to the kernel).
pub static SYNCS: Counter = Counter::new();
/// `copy_file_range`/`sendfile` calls done here by reads and writes.
pub static COPIES: Counter = Counter::new();
/// Calls on adopted descriptors handed to the kernel (mmap, ftruncate, copy_file_range, ...).
pub static FORWARDED: Counter = Counter::new();

pub const ENV: &str = "SURGE_PRELOAD_STATS";

/// The counters as JSON.
pub fn json() -> String {
    let all: [(&str, &Counter); 10] = [
        ("adopted", &ADOPTED),
        ("refused", &REFUSED),
        ("reads", &READS),
        ("read_bytes", &READ_BYTES),
        ("writes", &WRITES),
        ("write_bytes", &WRITE_BYTES),
        ("fsyncs", &FSYNCS),
        ("syncs", &SYNCS),
        ("copies", &COPIES),
        ("forwarded", &FORWARDED),
    ];
    let fields: Vec<String> = all
        .iter()
        .map(|(k, c)| format!("\"{k}\": {}", c.get()))
        .collect();
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    format!("{{\"pid\": {pid}, {}}}\n", fields.join(", "))
}

/// Writes the counters where `$SURGE_PRELOAD_STATS` says (at exit).
pub extern "C" fn write_at_exit() {
    crate::with_guard((), || {
        let Some(path) = std::env::var_os(ENV).filter(|p| !p.is_empty()) else {
            return;
        };
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() }.to_string();
        let path = path.to_string_lossy().replace("%p", &pid);
        if let Err(e) = std::fs::write(&path, json()) {
            tracing::warn!("cannot write the preload stats to {path}: {e}");
        }
    });
}
