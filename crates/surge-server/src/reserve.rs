//! Room for metadata on a full device.
//!
//! A namespace's metadata store lives on a fast-tier device beside the fragments' objects, and
//! the device can fill before any instance reaches its quota (another tenant of the directory,
//! a device smaller than `--capacity`, passthrough writes). A mount has then already
//! acknowledged creates it sends behind, and a metadata server that cannot commit them loses
//! names the application was told exist. So each namespace keeps a *reserve*: a file of
//! [`size`] bytes allocated on its device when the namespace opens. Data writes meet the full
//! device first (ENOSPC, as on a local file system); when a metadata transaction finds the
//! device full, the namespace gives its reserve back to the device and runs the transaction
//! again. From then on data writes on that server are refused while the device has less than
//! a reserve free, so what was freed stays for metadata; the reserve is taken again once there
//! is room (checked at most every few seconds), and at every start.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use surge_proto::{ErrorCode, ErrorReply};
use tracing::{error, info, warn};

/// Default size of a namespace's reserve.
pub const DEFAULT_SIZE: u64 = 16 << 20;

static SIZE: AtomicU64 = AtomicU64::new(DEFAULT_SIZE);
/// Reserves given back and not taken again, in this process.
static RELEASED: AtomicUsize = AtomicUsize::new(0);

/// How often a given-back reserve tries to take its room again.
const RETRY: Duration = Duration::from_secs(5);

/// Sets the size of reserves made from now on (`surge server --metadata-reserve`).
pub fn set_size(bytes: u64) {
    SIZE.store(bytes, Ordering::Relaxed);
}

pub fn size() -> u64 {
    SIZE.load(Ordering::Relaxed)
}

/// The reserve of one namespace.
pub struct Reserve {
    path: PathBuf,
    size: u64,
    state: Mutex<State>,
}

struct State {
    held: bool,
    /// Given back (counted in [`RELEASED`]).
    released: bool,
    last_try: Instant,
}

/// Bytes free on the file system holding `dir`.
fn free(dir: &Path) -> Option<u64> {
    surge_core::sys::free_space(dir).ok()
}

impl Reserve {
    /// Takes the reserve of the namespace in `dir` (its file `dir/metadata.reserve`); on a
    /// device already full it starts without one, and says so.
    pub fn open(dir: &Path) -> Reserve {
        let r = Reserve {
            path: dir.join("metadata.reserve"),
            size: size(),
            state: Mutex::new(State {
                held: false,
                released: false,
                last_try: Instant::now(),
            }),
        };
        let mut st = r.state.lock();
        st.held = r.take();
        if !st.held && r.size > 0 {
            warn!(
                "{}: cannot set aside {} for metadata (device full?): creates will fail with \
                 ENOSPC when the device is full",
                r.path.display(),
                surge_core::format_bytes(r.size)
            );
        }
        drop(st);
        r
    }

    /// Allocates the reserve file; false when the device has no room.
    fn take(&self) -> bool {
        if self.size == 0 {
            return false;
        }
        let f = match std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.path)
        {
            Ok(f) => f,
            Err(_) => return false,
        };
        use std::os::fd::AsRawFd;
        // SAFETY: fallocate on a descriptor owned by `f`.
        let rc = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, self.size as libc::off_t) };
        if rc != 0 {
            let _ = f.set_len(0);
            return false;
        }
        true
    }

    /// The device is full: gives the reserve back so a metadata transaction can commit.
    /// False when there was none to give.
    pub fn release(&self) -> bool {
        let mut st = self.state.lock();
        if !st.held {
            return false;
        }
        let freed = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.path)
            .and_then(|f| f.set_len(0));
        if let Err(e) = freed {
            error!(
                "{}: cannot give the metadata reserve back: {e}",
                self.path.display()
            );
            return false;
        }
        st.held = false;
        st.last_try = Instant::now();
        if !st.released {
            st.released = true;
            RELEASED.fetch_add(1, Ordering::AcqRel);
        }
        error!(
            "{}: device full: the metadata reserve ({}) was given back so metadata changes \
             commit; data writes on this server are refused until the device has room again",
            self.path.display(),
            surge_core::format_bytes(self.size)
        );
        true
    }

    /// True while the reserve is given back (the device was full).
    pub fn given_back(&self) -> bool {
        self.state.lock().released
    }

    /// Takes the reserve again if it was given back and the device has room for it and more.
    pub fn retake_if_room(&self) {
        let mut st = self.state.lock();
        if st.held || st.last_try.elapsed() < RETRY {
            return;
        }
        st.last_try = Instant::now();
        let room = self
            .path
            .parent()
            .and_then(free)
            .is_some_and(|f| f >= 4 * self.size);
        if room && self.take() {
            st.held = true;
            if st.released {
                st.released = false;
                RELEASED.fetch_sub(1, Ordering::AcqRel);
            }
            info!(
                "{}: the device has room again: metadata reserve taken back",
                self.path.display()
            );
        }
    }
}

impl Drop for Reserve {
    fn drop(&mut self) {
        let st = self.state.lock();
        if st.released {
            RELEASED.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Called before data grows by `growth` bytes in `dir`: while a reserve is given back, data may
/// not take the device's last reserve-worth of room.
pub fn data_may_grow(dir: &Path, growth: u64) -> Result<(), ErrorReply> {
    if RELEASED.load(Ordering::Acquire) == 0 {
        return Ok(());
    }
    let keep = size();
    match free(dir) {
        Some(f) if f >= growth.saturating_add(keep) => Ok(()),
        _ => Err(ErrorReply::new(
            ErrorCode::NoSpace,
            format!(
                "the device of {} is full: its last {} are kept for metadata",
                dir.display(),
                surge_core::format_bytes(keep)
            ),
        )),
    }
}
