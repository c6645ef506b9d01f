//! The space one instance may use on this host: the sum of the capacities of its fragments on
//! the host's fast-tier file system, shared by them.
//!
//! A file of one stripe lies in one fragment, so what it may hold is what the instance has on
//! the host, not one fragment's share (DataWarp's files, striped over every fragment, never
//! needed more than a share). The fragments of one server share an in-process budget; servers
//! of one host (`surge run` starts four) whose devices are on one file system share theirs
//! through a table in `/dev/shm` (`surge-budget-<uid>-<device>-<instance>-<generation>`, mode 0600, one
//! slot per server, keyed by its device directory): every byte they hold is on the same
//! device, so one server's file may use what the instance has left on the others. Without
//! `/dev/shm` (or with a table another user made) each server keeps its own.
//!
//! Reservations add first and check after (see [`Budget::reserve`]), so two servers reserving
//! at once may both be refused near the end, never both let past it.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use surge_core::InstanceId;
use tracing::{debug, warn};

/// One server's capacity and use of an instance.
#[repr(C)]
#[derive(Default)]
struct Slot {
    /// Who holds the slot (a hash of its device directory; 0: free).
    owner: AtomicU64,
    capacity: AtomicU64,
    used: AtomicU64,
    pid: AtomicU64,
}

const SLOTS: usize = 64;
const MAGIC: u64 = 0x5355_5247_4542_5431; // "SURGEBT1"

/// The shared table's layout.
#[repr(C)]
struct Table {
    magic: AtomicU64,
    slots: [Slot; SLOTS],
}

/// A table file mapped in memory (shared with the other processes that map it), unmapped
/// when dropped.
struct Mapping(*mut Table);

// SAFETY: a shared mapping of atomics only, valid until the `Mapping` drops.
unsafe impl Send for Mapping {}
// SAFETY: as above; every access is atomic.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the table of `file`, at least a table long; `writable` for a slot's owner.
    fn of(file: &File, writable: bool) -> io::Result<Mapping> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a shared mapping of a table's size of an open file at least that long.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                std::mem::size_of::<Table>(),
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping(p.cast()))
    }

    fn table(&self) -> &Table {
        // SAFETY: mapped for the life of `self`, the size of `Table`.
        unsafe { &*self.0 }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `of`, not used after this.
        unsafe { libc::munmap(self.0.cast(), std::mem::size_of::<Table>()) };
    }
}

/// This server's slot in a host's shared table.
struct Shared {
    table: Mapping,
    file: File,
    path: PathBuf,
    slot: usize,
}

impl Shared {
    fn table(&self) -> &Table {
        self.table.table()
    }

    /// Claims (or takes back, after a restart) this server's slot in the table at `path`.
    fn open(path: &Path, owner: u64) -> io::Result<Shared> {
        let size = std::mem::size_of::<Table>();
        loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(path)?;
            // Held until this returns: closing the file on an error releases it too.
            std::mem::forget(Flock::exclusive(&file)?);
            let md = file.metadata()?;
            if md.nlink() == 0 {
                // Its last server removed it meanwhile: make a new one.
                continue;
            }
            // SAFETY: geteuid cannot fail.
            let me = unsafe { libc::geteuid() };
            if md.uid() != me || md.mode() & 0o077 != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{} belongs to uid {} with mode {:o}, not to this user alone",
                        path.display(),
                        md.uid(),
                        md.mode() & 0o7777
                    ),
                ));
            }
            if md.len() < size as u64 {
                file.set_len(size as u64)?;
            }
            let mut shared = Shared {
                table: Mapping::of(&file, true)?,
                file,
                path: path.to_path_buf(),
                slot: SLOTS,
            };
            let t = shared.table();
            match t.magic.load(Ordering::Acquire) {
                0 => t.magic.store(MAGIC, Ordering::Release),
                MAGIC => {}
                other => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{} is not a budget table ({other:#x})", path.display()),
                    ))
                }
            }
            let slot = t
                .slots
                .iter()
                .position(|s| s.owner.load(Ordering::Acquire) == owner)
                .or_else(|| {
                    t.slots
                        .iter()
                        .position(|s| s.owner.load(Ordering::Acquire) == 0)
                })
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::OutOfMemory,
                        format!("{} has no free slot ({SLOTS} servers)", path.display()),
                    )
                })?;
            let s = &t.slots[slot];
            // Taken back after a restart: its fragments count themselves again as they open.
            s.capacity.store(0, Ordering::Release);
            s.used.store(0, Ordering::Release);
            s.pid
                .store(u64::from(std::process::id()), Ordering::Release);
            s.owner.store(owner, Ordering::Release);
            shared.slot = slot;
            drop(Flock(&shared.file));
            return Ok(shared);
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let lock = Flock::exclusive(&self.file);
        let t = self.table();
        if self.slot < SLOTS {
            let s = &t.slots[self.slot];
            s.capacity.store(0, Ordering::Release);
            s.used.store(0, Ordering::Release);
            s.owner.store(0, Ordering::Release);
        }
        if lock.is_ok() && t.slots.iter().all(|s| s.owner.load(Ordering::Acquire) == 0) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// `flock(LOCK_EX)` held until dropped.
struct Flock<'a>(&'a File);

impl<'a> Flock<'a> {
    fn exclusive(f: &'a File) -> io::Result<Self> {
        loop {
            // SAFETY: flock of an open descriptor.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(Flock(f));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Drop for Flock<'_> {
    fn drop(&mut self) {
        // SAFETY: unlock of an open descriptor.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Takes `n` from `cell`, stopping at zero.
fn saturating_sub(cell: &AtomicU64, n: u64) {
    let _ = cell.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
        Some(v.saturating_sub(n))
    });
}

/// The space one instance may use on this host (see the module's documentation).
#[derive(Default)]
pub struct Budget {
    /// This server's capacity and use, when not in a shared table.
    own: Slot,
    shared: Option<Shared>,
}

/// Where servers of this host whose devices are on the file system of `device` share the
/// budget of `instance` of `generation` (instance numbers are a manager's: two managers of one
/// user on a host, two `surge run` jobs, have instances of the same number).
fn table_path(instance: InstanceId, generation: u64, device: &Path) -> io::Result<PathBuf> {
    if generation == 0 {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "an instance made before generations existed",
        ));
    }
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        return Err(io::Error::new(io::ErrorKind::NotFound, "no /dev/shm"));
    }
    let dev = std::fs::metadata(device)?.dev();
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    Ok(shm.join(format!(
        "surge-budget-{uid}-{dev:x}-{}-{generation:x}",
        instance.0
    )))
}

/// Removes the tables of this user in `/dev/shm` (but `keep`) whose servers are all gone
/// (killed, never to come back: a test's, or a host's whose jobs ended uncleanly). A server
/// that comes back makes a new table and counts its fragments again as it opens them.
fn collect_dead(keep: &Path) {
    let Some(dir) = keep.parent() else { return };
    // SAFETY: geteuid cannot fail.
    let prefix = format!("surge-budget-{}-", unsafe { libc::geteuid() });
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path == keep || !e.file_name().to_string_lossy().starts_with(&prefix) {
            continue;
        }
        let Ok(file) = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
        else {
            continue;
        };
        let Ok(_lock) = Flock::exclusive(&file) else {
            continue;
        };
        if file
            .metadata()
            .map_or(true, |m| (m.len() as usize) < std::mem::size_of::<Table>())
        {
            continue;
        }
        let Ok(map) = Mapping::of(&file, false) else {
            continue;
        };
        let t = map.table();
        let alive = t.magic.load(Ordering::Acquire) != MAGIC
            || t.slots.iter().any(|s| {
                s.owner.load(Ordering::Acquire) != 0 && {
                    let pid = s.pid.load(Ordering::Acquire) as libc::pid_t;
                    // SAFETY: signal 0 only checks that the process exists.
                    pid > 0
                        && (unsafe { libc::kill(pid, 0) } == 0
                            || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH))
                }
            });
        drop(map);
        if !alive {
            debug!("{}: every server of it is gone, removed", path.display());
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// A server's key in a shared table: its device directory (stable across restarts).
fn owner_of(device: &Path) -> u64 {
    let p = std::fs::canonicalize(device).unwrap_or_else(|_| device.to_path_buf());
    // FNV-1a.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in p.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h | 1
}

impl Budget {
    /// The budget of `instance` for a server whose fragments are on `device`: shared with the
    /// other servers of this host on the same file system where it can be.
    pub fn on_host(instance: InstanceId, generation: u64, device: &Path) -> Budget {
        let opened = table_path(instance, generation, device).and_then(|p| {
            collect_dead(&p);
            Shared::open(&p, owner_of(device))
        });
        match opened {
            Ok(s) => {
                debug!(
                    "instance {}: space shared with this host's servers through {}",
                    instance.0,
                    s.path.display()
                );
                Budget {
                    own: Slot::default(),
                    shared: Some(s),
                }
            }
            Err(e) => {
                if e.kind() == io::ErrorKind::PermissionDenied {
                    warn!(
                        "instance {}: space not shared with this host's other servers: {e}",
                        instance.0
                    );
                } else {
                    debug!(
                        "instance {}: space not shared with this host's other servers: {e}",
                        instance.0
                    );
                }
                Budget::default()
            }
        }
    }

    fn mine(&self) -> &Slot {
        match &self.shared {
            Some(s) => &s.table().slots[s.slot],
            None => &self.own,
        }
    }

    fn sum(&self, f: impl Fn(&Slot) -> &AtomicU64) -> u64 {
        match &self.shared {
            Some(s) => s
                .table()
                .slots
                .iter()
                .filter(|x| x.owner.load(Ordering::Acquire) != 0)
                .map(|x| f(x).load(Ordering::Acquire))
                .fold(0u64, u64::saturating_add),
            None => f(&self.own).load(Ordering::Acquire),
        }
    }

    /// The instance's capacity on this host (on this server alone when not shared).
    pub fn capacity(&self) -> u64 {
        self.sum(|s| &s.capacity)
    }

    /// What the instance uses of it.
    pub fn used(&self) -> u64 {
        self.sum(|s| &s.used)
    }

    /// What it has left.
    pub fn room(&self) -> u64 {
        self.capacity().saturating_sub(self.used())
    }

    pub(crate) fn add_capacity(&self, n: u64) {
        self.mine().capacity.fetch_add(n, Ordering::AcqRel);
    }

    pub(crate) fn sub_capacity(&self, n: u64) {
        saturating_sub(&self.mine().capacity, n);
    }

    pub(crate) fn add_used(&self, n: u64) {
        self.mine().used.fetch_add(n, Ordering::AcqRel);
    }

    pub(crate) fn sub_used(&self, n: u64) {
        saturating_sub(&self.mine().used, n);
    }

    /// Takes `n` bytes of the budget; on refusal (it would pass the capacity) takes nothing
    /// and returns what was used and the capacity.
    pub(crate) fn reserve(&self, n: u64) -> Result<(), (u64, u64)> {
        self.add_used(n);
        let (used, capacity) = (self.used(), self.capacity());
        if used > capacity {
            self.sub_used(n);
            return Err((used - n, capacity));
        }
        Ok(())
    }

    /// Whether servers of this host share it.
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(dir: &Path, device: &str, instance: u64) -> Budget {
        let device = dir.join(device);
        std::fs::create_dir_all(&device).unwrap();
        let path = dir.join(format!("table-{instance}"));
        Budget {
            own: Slot::default(),
            shared: Some(Shared::open(&path, owner_of(&device)).unwrap()),
        }
    }

    #[test]
    fn servers_of_a_host_share_their_space_and_take_their_slot_back_after_a_restart() {
        let t = tempfile::tempdir().unwrap();
        let a = shared(t.path(), "bb0", 1);
        let b = shared(t.path(), "bb1", 1);
        a.add_capacity(100);
        b.add_capacity(100);
        assert_eq!(a.capacity(), 200);
        // One server may take what the other has left.
        a.reserve(150).unwrap();
        assert_eq!(b.room(), 50);
        assert_eq!(b.reserve(60), Err((150, 200)));
        b.reserve(50).unwrap();
        assert_eq!(a.used(), 200);
        // Server a restarts (killed: its slot stays, then it takes it back and counts again).
        std::mem::forget(a);
        let a = shared(t.path(), "bb0", 1);
        assert_eq!(b.capacity(), 100, "a's fragments not yet opened again");
        a.add_capacity(100);
        a.add_used(150);
        assert_eq!(b.used(), 200);
        // Gone for good: its share goes with it; the last one removes the table.
        drop(a);
        assert_eq!((b.capacity(), b.used()), (100, 50));
        let path = b.shared.as_ref().unwrap().path.clone();
        drop(b);
        assert!(!path.exists());
    }

    #[test]
    fn tables_whose_servers_are_all_gone_are_removed() {
        let t = tempfile::tempdir().unwrap();
        // SAFETY: geteuid cannot fail.
        let uid = unsafe { libc::geteuid() };
        let name = |n: u32| t.path().join(format!("surge-budget-{uid}-1-{n}-1"));
        let dead = Shared::open(&name(1), 7).unwrap();
        let alive = Shared::open(&name(2), 7).unwrap();
        // A process that is gone (pid_max is below this).
        dead.table().slots[dead.slot]
            .pid
            .store(i32::MAX as u64, Ordering::Release);
        std::mem::forget(dead);
        collect_dead(&name(3));
        assert!(!name(1).exists(), "a table of dead servers stays");
        assert!(name(2).exists(), "a table of a live server went");
        drop(alive);
    }

    #[test]
    fn a_table_of_another_user_or_mode_is_not_used() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("table");
        std::fs::write(&path, b"").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = Shared::open(&path, 1).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
    }

    #[test]
    fn an_unshared_budget_is_this_servers_alone() {
        let b = Budget::default();
        b.add_capacity(10);
        b.reserve(10).unwrap();
        assert!(b.reserve(1).is_err());
        b.sub_used(4);
        assert_eq!(b.room(), 4);
    }
}
