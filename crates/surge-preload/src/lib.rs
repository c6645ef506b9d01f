//! `libsurge_preload.so`: an `LD_PRELOAD` library that reads, writes and syncs files of a Surge
//! mount without a FUSE request for each call (DAOS's `libioil` over its dfuse mount is the
//! model; docs/DATAPLANE.md, "The preload path").
//!
//! Every open still goes through the mount, so every descriptor is a real kernel file and
//! anything this library does not handle (fork, exec, dup, mmap, locks, calls it does not
//! know) works as without it. Right after an open, the library asks the mount over its preload
//! socket (`surge_proto::preload`) to *adopt* the descriptor: for a regular file the mount has
//! open by kernel passthrough (its data is one object on this host), the mount hands back that
//! object opened with the descriptor's access mode. From then on, on that descriptor:
//! - `read`, `write`, `readv`, `writev` and the positioned forms read and write the object
//!   (the kernel's file offset stays the descriptor's offset: read and moved here);
//! - `lseek` with `SEEK_END`, `SEEK_DATA`, `SEEK_HOLE` and `fstat`/`statx` take the size from
//!   the object;
//! - `fsync`/`fdatasync` flush the object and have the mount commit size and mtime to the
//!   metadata service (one round trip to the mount instead of a FUSE request).
//!
//! `close` is the kernel's: the mount commits at that close as for any passthrough file
//! (close-to-open). Calls the kernel serves on an adopted descriptor (`mmap`, `ftruncate`,
//! `futimens`, `copy_file_range`, `sendfile`) are preceded by a commit of what was written
//! here, so the kernel sees the file as written. A `fork` hands every adopted descriptor back
//! to the kernel in both processes; `exec` is preceded by a commit. A panic in the library
//! disables it for the process and the call goes to the C library.
//!
//! Environment: `SURGE_PRELOAD=0` turns it off; `SURGE_PRELOAD_ADOPT=fsync` adopts a
//! descriptor at its first `fsync` instead of at its open; `SURGE_PRELOAD_STATS=FILE` writes counters
//! at exit (`%p`: the process id); `SURGE_PRELOAD_LOG=debug` logs to stderr.

mod hooks;
mod real;
mod stats;
mod table;

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

thread_local! {
    /// Set while this thread runs the library's own code: its calls to the C library (which
    /// land in the hooks) go straight through.
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// The library works in this process (not turned off, initialised).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// `SURGE_PRELOAD_ADOPT=fsync`: descriptors are adopted at their first `fsync`/`fdatasync`,
/// not at their open (until then the kernel does everything, at no extra cost to opens).
static LAZY: AtomicBool = AtomicBool::new(false);

pub(crate) fn lazy() -> bool {
    LAZY.load(Ordering::Relaxed)
}

/// Whether a hook should look at its call: the library is on and this thread is not already
/// inside it.
pub(crate) fn active() -> bool {
    ENABLED.load(Ordering::Relaxed) && !BUSY.try_with(|b| b.get()).unwrap_or(true)
}

/// Runs `f` as the library's own code (see [`BUSY`]); a panic turns the library off for the
/// process and gives `None` (the caller then makes the C library's call).
pub(crate) fn guarded<T>(f: impl FnOnce() -> T) -> Option<T> {
    let was = BUSY.try_with(|b| b.replace(true)).unwrap_or(true);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    let _ = BUSY.try_with(|b| b.set(was));
    match r {
        Ok(v) => Some(v),
        Err(_) => {
            ENABLED.store(false, Ordering::SeqCst);
            None
        }
    }
}

/// [`guarded`] with a value for the panic case.
pub(crate) fn with_guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    guarded(f).unwrap_or(fallback)
}

extern "C" fn init() {
    guarded(|| {
        if std::env::var("SURGE_PRELOAD").is_ok_and(|v| v == "0") {
            return;
        }
        if let Ok(filter) = std::env::var("SURGE_PRELOAD_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                .try_init();
        }
        // SAFETY: registering handlers that live as long as the process.
        unsafe {
            libc::pthread_atfork(
                Some(table::before_fork),
                Some(table::after_fork_parent),
                Some(table::after_fork_child),
            );
            libc::atexit(stats::write_at_exit);
        }
        LAZY.store(
            std::env::var("SURGE_PRELOAD_ADOPT").is_ok_and(|v| v == "fsync"),
            Ordering::SeqCst,
        );
        ENABLED.store(true, Ordering::SeqCst);
    });
}

/// Runs [`init`] when the library is loaded.
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;
