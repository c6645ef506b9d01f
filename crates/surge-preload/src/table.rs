//! The descriptors this library handles ("adopted"), and the connections to the mounts that
//! hand out their objects (`surge_proto::preload`).
//!
//! An adopted descriptor keeps its kernel file: the open went through the mount, and the
//! kernel's file offset stays the one offset of the descriptor (read and write here take it
//! and move it), so a `dup` of it, a child after `fork` or a program after `exec` find it
//! where the library left it. What the library adds is the object file of the same data on
//! this host, which it reads and writes instead of sending a request through FUSE.

use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use surge_proto::preload;
use tracing::{debug, warn};

/// A descriptor the library handles.
pub struct Adopted {
    /// The file's object on this host, opened with the descriptor's access mode.
    pub object: OwnedFd,
    pub ino: u64,
    pub dev: u64,
    /// Written here since the mount last committed: the kernel's cached size and times of the
    /// file are out of date until it does (see [`sync`]).
    pub dirty: AtomicBool,
    /// Serializes what reads and moves the kernel's offset (`read`, `write`, `lseek`) among
    /// this process's threads, as the kernel's own file position lock does.
    pub offset: Mutex<()>,
}

static TABLE: RwLock<Option<HashMap<RawFd, Arc<Adopted>>>> = RwLock::new(None);
/// Entries in [`TABLE`]: while 0 the hooks of a process with no Surge file cost one load.
static ADOPTED: AtomicUsize = AtomicUsize::new(0);

/// The adopted descriptor `fd`, if it is one.
pub fn get(fd: RawFd) -> Option<Arc<Adopted>> {
    if fd < 0 || ADOPTED.load(Ordering::Relaxed) == 0 {
        return None;
    }
    TABLE.read().as_ref()?.get(&fd).cloned()
}

fn insert(fd: RawFd, a: Arc<Adopted>) {
    let mut t = TABLE.write();
    if t.get_or_insert_with(HashMap::new).insert(fd, a).is_none() {
        ADOPTED.fetch_add(1, Ordering::Relaxed);
    }
}

/// `new` is a duplicate of `old` (`dup`, `dup2`, `fcntl(F_DUPFD)`): one open file, one
/// offset, one object; `new` is adopted as `old` is (or forgotten, if `old` is not).
pub fn duplicated(old: RawFd, new: RawFd) {
    match get(old) {
        Some(a) => insert(new, a),
        None => drop(forget(new)),
    }
}

/// Forgets `fd` (closed, or reused for another file); its object is closed with the last
/// reference (a call in flight on another thread may still hold one).
pub fn forget(fd: RawFd) -> Option<Arc<Adopted>> {
    if fd < 0 || ADOPTED.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let gone = TABLE.write().as_mut()?.remove(&fd);
    if gone.is_some() {
        ADOPTED.fetch_sub(1, Ordering::Relaxed);
    }
    gone
}

/// Forgets every descriptor of the open file `a` (its duplicates share its flags: `F_SETFL`).
pub fn forget_file(a: &Arc<Adopted>) {
    let mut t = TABLE.write();
    if let Some(t) = t.as_mut() {
        let before = t.len();
        t.retain(|_, x| !Arc::ptr_eq(x, a));
        ADOPTED.fetch_sub(before - t.len(), Ordering::Relaxed);
    }
}

/// Forgets every descriptor in `first..=last`.
pub fn forget_range(first: u32, last: u32) {
    if ADOPTED.load(Ordering::Relaxed) == 0 {
        return;
    }
    let mut t = TABLE.write();
    if let Some(t) = t.as_mut() {
        let before = t.len();
        t.retain(|fd, _| !(first as i64..=last as i64).contains(&i64::from(*fd)));
        ADOPTED.fetch_sub(before - t.len(), Ordering::Relaxed);
    }
}

/// An adopted open file of the file `(dev, ino)` (as the kernel numbers it on the mount),
/// one with writes not committed first: what a `stat` by name of it must be corrected by.
pub fn by_inode(dev: u64, ino: u64) -> Option<Arc<Adopted>> {
    if ADOPTED.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let t = TABLE.read();
    let mut of_file = t
        .as_ref()?
        .values()
        .filter(|a| a.dev == dev && a.ino == ino);
    let first = of_file.next()?.clone();
    if first.dirty.load(Ordering::SeqCst) {
        return Some(first);
    }
    Some(
        of_file
            .find(|a| a.dirty.load(Ordering::SeqCst))
            .cloned()
            .unwrap_or(first),
    )
}

/// Every adopted descriptor.
pub fn all() -> Vec<(RawFd, Arc<Adopted>)> {
    if ADOPTED.load(Ordering::Relaxed) == 0 {
        return Vec::new();
    }
    TABLE
        .read()
        .as_ref()
        .map(|t| t.iter().map(|(k, v)| (*k, v.clone())).collect())
        .unwrap_or_default()
}

/// Descriptors of regular files of FUSE mounts not adopted yet (`SURGE_PRELOAD_ADOPT=fsync`:
/// adopted at their first `fsync`), with their device. A number reused behind the library's
/// back is harmless here: the mount checks the descriptor it is sent.
static CANDIDATES: Mutex<Option<HashMap<RawFd, u64>>> = Mutex::new(None);

pub fn candidate(fd: RawFd, dev: u64) {
    CANDIDATES
        .lock()
        .get_or_insert_with(HashMap::new)
        .insert(fd, dev);
}

pub fn take_candidate(fd: RawFd) -> Option<u64> {
    CANDIDATES.lock().as_mut()?.remove(&fd)
}

/// How long a device that is not a Surge mount (no socket answered) is not asked again.
const NOT_SURGE_FOR: Duration = Duration::from_secs(2);

enum MountState {
    /// A connection to the mount's socket, made by the process `pid` (a child after `fork`
    /// shares the parent's, and must not use it).
    Connected { sock: OwnedFd, pid: u32 },
    /// No mount of ours answered at this device, as of this instant.
    NotSurge(Instant),
}

/// One connection per mount, used under this lock (one request at a time per process).
static MOUNTS: Mutex<Option<HashMap<u64, MountState>>> = Mutex::new(None);

/// Asks the mount of device `dev` to adopt `fd` (a regular file of it, open with `flags`).
/// `None`: the mount does not (not a Surge mount, not open by passthrough, ...); the
/// descriptor then stays the kernel's alone.
pub fn adopt(fd: RawFd, dev: u64) -> Option<()> {
    let answer = ask(dev, preload::ADOPT, 0, Some(fd));
    match answer {
        Some((0, ino, Some(object))) => {
            insert(
                fd,
                Arc::new(Adopted {
                    object,
                    ino,
                    dev,
                    dirty: AtomicBool::new(false),
                    offset: Mutex::new(()),
                }),
            );
            crate::stats::ADOPTED.bump();
            debug!("fd {fd}: adopted (inode {ino})");
            Some(())
        }
        Some((errno, _, _)) => {
            crate::stats::REFUSED.bump();
            debug!("fd {fd}: the mount keeps it (errno {errno})");
            None
        }
        None => None,
    }
}

/// Has the mount commit what was written into `a`'s object and drop the kernel's cached
/// attributes; an errno when it could not.
pub fn sync(a: &Adopted) -> Result<(), i32> {
    a.dirty.store(false, Ordering::SeqCst);
    crate::stats::SYNCS.bump();
    match ask(a.dev, preload::SYNC, a.ino, None) {
        Some((0, _, _)) => Ok(()),
        Some((errno, _, _)) => {
            a.dirty.store(true, Ordering::SeqCst);
            Err(errno)
        }
        None => {
            a.dirty.store(true, Ordering::SeqCst);
            Err(libc::EIO)
        }
    }
}

/// [`sync`] if something was written since the last one: before the kernel is given the
/// descriptor (a call this library forwards), so it sees the file as written.
pub fn sync_if_dirty(a: &Adopted) -> Result<(), i32> {
    if a.dirty.load(Ordering::SeqCst) {
        sync(a)
    } else {
        Ok(())
    }
}

/// Commits every adopted file written since its last commit (before `exec` and `fork`).
pub fn sync_all() {
    for (fd, a) in all() {
        if let Err(errno) = sync_if_dirty(&a) {
            warn!("fd {fd}: the mount did not commit what was written (errno {errno})");
        }
    }
}

/// One request to the mount of `dev`; `None` when there is no mount of ours there or the
/// connection failed. Answers are (errno, inode, descriptor attached).
fn ask(dev: u64, op: u8, ino: u64, fd: Option<RawFd>) -> Option<(i32, u64, Option<OwnedFd>)> {
    let mut mounts = MOUNTS.lock();
    let mounts = mounts.get_or_insert_with(HashMap::new);
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    for attempt in 0..2 {
        let usable = match mounts.get(&dev) {
            Some(MountState::Connected { pid: p, .. }) => *p == pid,
            Some(MountState::NotSurge(at)) => {
                if at.elapsed() < NOT_SURGE_FOR {
                    return None;
                }
                false
            }
            None => false,
        };
        if !usable {
            match connect(dev) {
                Some(sock) => {
                    mounts.insert(dev, MountState::Connected { sock, pid });
                }
                None => {
                    mounts.insert(dev, MountState::NotSurge(Instant::now()));
                    return None;
                }
            }
        }
        let Some(MountState::Connected { sock, .. }) = mounts.get(&dev) else {
            return None;
        };
        let sock = sock.as_raw_fd();
        let mut buf = [0u8; preload::ANSWER_LEN + 1];
        let r = surge_proto::unix::send(sock, &preload::request(op, ino), fd).and_then(|()| {
            // The answer comes within a round trip of the mount's: polled for a moment before
            // sleeping, as the mount's own threads do (waking a sleeping vCPU costs as much).
            let budget = surge_proto::transport::poll_budget("client");
            surge_proto::transport::poll_readable(sock, budget);
            surge_proto::unix::recv(sock, &mut buf)
        });
        match r {
            Ok((n, obj)) => match preload::parse_answer(&buf[..n]) {
                Some((errno, ino)) => return Some((errno, ino, obj)),
                None => debug!("mount of device {dev}: malformed answer"),
            },
            Err(e) => debug!("mount of device {dev}: {e}"),
        }
        // The mount went away (or restarted on the same device): once more on a new
        // connection, which fails at once if there is no mount.
        mounts.remove(&dev);
        if attempt == 1 {
            break;
        }
    }
    None
}

/// A connection to the preload socket of the mount of `dev`, if one answers and is run by this
/// process's user or root.
fn connect(dev: u64) -> Option<OwnedFd> {
    let name = preload::socket_name(dev);
    // SAFETY: a new socket, owned at once.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the socket just made.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_un is plain old data; all zeros is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = name.as_bytes();
    if bytes.len() + 1 > addr.sun_path.len() {
        return None;
    }
    for (dst, src) in addr.sun_path[1..].iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + bytes.len();
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
    let r = unsafe {
        libc::connect(
            fd,
            (&addr as *const libc::sockaddr_un).cast(),
            len as libc::socklen_t,
        )
    };
    if r != 0 {
        return None;
    }
    let cred = surge_proto::unix::peer_cred(fd).ok()?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if cred.uid != me && cred.uid != 0 {
        warn!(
            "@{name} is served by uid {} (not this user, nor root): not used",
            cred.uid
        );
        return None;
    }
    // Bounded waits: a stopped mount must not hang the application (it then gets EIO on
    // fsync, or keeps the descriptor with the kernel at open).
    let tv = libc::timeval {
        tv_sec: 30,
        tv_usec: 0,
    };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: setting a timeval option of our socket.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
    }
    debug!("connected to @{name}");
    Some(sock)
}

/// `fork`: the descriptors adopted so far are left to the kernel in both processes (they
/// share the kernel's file offset, which two processes moving it each under their own lock
/// would race on), after what was written to them is committed. Files opened after the fork
/// are adopted again. The locks are held across the fork so the child finds them free.
pub extern "C" fn before_fork() {
    crate::with_guard((), || {
        sync_all();
    });
    std::mem::forget(MOUNTS.lock());
    std::mem::forget(TABLE.write());
    std::mem::forget(CANDIDATES.lock());
}

fn after_fork() {
    // SAFETY: taken in `before_fork` by this thread, the one that forked.
    unsafe {
        CANDIDATES.force_unlock();
        TABLE.force_unlock_write();
        MOUNTS.force_unlock();
    }
    crate::with_guard((), || {
        let gone = TABLE.write().as_mut().map(std::mem::take);
        ADOPTED.store(0, Ordering::Relaxed);
        drop(gone);
        CANDIDATES.lock().take();
    });
}

pub extern "C" fn after_fork_parent() {
    after_fork();
}

pub extern "C" fn after_fork_child() {
    after_fork();
    // The parent's connections are the parent's (the pid check drops them at first use).
}
