//! The mount's end of the preload socket (wire format and naming: `surge_proto::preload`):
//! processes running with the interposition library (`crates/surge-preload`) hand it a
//! descriptor they opened through this mount and get the file's object on this host, then ask
//! it to commit what they wrote there (`fsync`). What qualifies is decided by
//! [`Fs::preload_object`]: files open here by kernel passthrough.
//!
//! Who is answered (docs/SECURITY.md, "The preload socket"): a process of the mount's own user,
//! of the user a root mount acts for, or root, by `SO_PEERCRED`; anyone else's connection is
//! closed unanswered. An object is handed out only for a descriptor of this mount the process
//! sends along, opened again with that descriptor's access mode: it reads and writes no more
//! than it could through the mount.

use crate::fs::Fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::Arc;
use surge_proto::preload::{self, ADOPT, REQUEST_LEN, SYNC};
use surge_proto::unix::{peer_cred, recv, send};
use tracing::{debug, info, warn};

/// Connections served at once; further ones are closed at once (the library then leaves the
/// process's files to the mount).
const MAX_CONNECTIONS: usize = 256;

/// Set to `0` to have mounts not serve the socket.
pub const ENV: &str = "SURGE_MOUNT_PRELOAD";

/// The socket of one mount; stops listening when dropped.
pub struct PreloadSocket {
    listener: Arc<AtomicI32>,
    stopped: Arc<AtomicBool>,
}

impl PreloadSocket {
    fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let fd = self.listener.swap(-1, Ordering::SeqCst);
        if fd >= 0 {
            // SAFETY: the listening socket this value owns; shutting it down wakes its
            // `accept` (EINVAL), after which its thread closes nothing more.
            unsafe {
                libc::shutdown(fd, libc::SHUT_RDWR);
                libc::close(fd);
            }
        }
    }
}

impl Drop for PreloadSocket {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves the preload socket of the mount at `mountpoint` from a thread of its own (which
/// first learns the mount's device number, a request to the mount, so not from the caller's
/// thread). `acting_for`: the user a root mount acts for (its processes are answered too).
pub fn serve(
    fs: Arc<Fs>,
    rt: tokio::runtime::Handle,
    mountpoint: &Path,
    acting_for: Option<u32>,
) -> io::Result<PreloadSocket> {
    let listener = Arc::new(AtomicI32::new(-1));
    let stopped = Arc::new(AtomicBool::new(false));
    let (l, s) = (listener.clone(), stopped.clone());
    let mountpoint = mountpoint.to_path_buf();
    std::thread::Builder::new()
        .name("surge-preload".into())
        .spawn(move || {
            if let Err(e) = listen(fs, rt, &mountpoint, acting_for, &l, &s) {
                warn!(
                    "{}: no preload socket ({e}); processes with libsurge_preload use the \
                     mount for everything",
                    mountpoint.display()
                );
            }
        })?;
    Ok(PreloadSocket { listener, stopped })
}

fn listen(
    fs: Arc<Fs>,
    rt: tokio::runtime::Handle,
    mountpoint: &PathBuf,
    acting_for: Option<u32>,
    listener: &AtomicI32,
    stopped: &AtomicBool,
) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(mountpoint)?.dev();
    let name = preload::socket_name(dev);
    let fd = bind_abstract(&name)?;
    listener.store(fd.as_raw_fd(), Ordering::SeqCst);
    // The listening descriptor is closed by `PreloadSocket::stop` from now on.
    let fd = std::os::fd::IntoRawFd::into_raw_fd(fd);
    if stopped.load(Ordering::SeqCst) {
        return Ok(());
    }
    info!("preload socket @{name} for {}", mountpoint.display());
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let allowed = move |uid: u32| uid == me || uid == 0 || (me == 0 && Some(uid) == acting_for);
    let open = Arc::new(AtomicUsize::new(0));
    loop {
        // SAFETY: accepting on our listening socket; the new descriptor is owned below.
        let c = unsafe {
            libc::accept4(
                fd,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if c < 0 {
            let e = io::Error::last_os_error();
            if stopped.load(Ordering::SeqCst) {
                return Ok(());
            }
            match e.raw_os_error() {
                Some(libc::EINTR | libc::ECONNABORTED | libc::EMFILE | libc::ENFILE) => {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    continue;
                }
                _ => return Err(e),
            }
        }
        // SAFETY: `c` is the connection just accepted, owned by nothing else.
        let conn = unsafe { OwnedFd::from_raw_fd(c) };
        match peer_cred(conn.as_raw_fd()) {
            Ok(cred) if allowed(cred.uid) => {}
            Ok(cred) => {
                debug!(
                    "preload socket: uid {} is not this mount's user: refused",
                    cred.uid
                );
                continue;
            }
            Err(e) => {
                debug!("preload socket: no peer credentials ({e}): refused");
                continue;
            }
        }
        if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::SeqCst);
            debug!("preload socket: {MAX_CONNECTIONS} connections open: refused");
            continue;
        }
        let (fs, rt, open) = (fs.clone(), rt.clone(), open.clone());
        let spawned = std::thread::Builder::new()
            .name("surge-preload-conn".into())
            .spawn(move || {
                if let Err(e) = answer_all(&fs, &rt, dev, &conn) {
                    debug!("preload connection ended: {e}");
                }
                open.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            warn!("preload socket: cannot start a thread ({e})");
        }
    }
}

/// Answers the requests of one connection until it closes.
fn answer_all(fs: &Fs, rt: &tokio::runtime::Handle, dev: u64, conn: &OwnedFd) -> io::Result<()> {
    let sock = conn.as_raw_fd();
    let mut buf = [0u8; REQUEST_LEN + 1];
    let budget = surge_proto::transport::poll_budget("server");
    loop {
        // A process that just had an answer often asks again at once (an fsync per write):
        // polled for a moment before sleeping, as the servers' connection threads do.
        surge_proto::transport::poll_readable(sock, budget);
        let (n, fd) = recv(sock, &mut buf)?;
        if n == 0 && fd.is_none() {
            return Ok(());
        }
        let Some((op, ino)) = preload::parse_request(&buf[..n]) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "malformed request",
            ));
        };
        match (op, fd) {
            (ADOPT, Some(fd)) => match adopt(fs, dev, fd) {
                Ok((ino, object)) => {
                    send(sock, &preload::answer(0, ino), Some(object.as_raw_fd()))?
                }
                Err(errno) => send(sock, &preload::answer(errno, 0), None)?,
            },
            (SYNC, None) => {
                // A metadata round trip from this thread, as the FUSE threads make theirs
                // (`crate::blocking`): no hand-over to the runtime and back.
                let errno = match crate::blocking::inline(|| rt.block_on(fs.preload_sync(ino))) {
                    Ok(()) => 0,
                    Err(e) => fs.failed("preload sync", &e),
                };
                send(sock, &preload::answer(errno, ino), None)?;
            }
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "unknown request",
                ))
            }
        }
    }
}

/// The object of the file `fd` is open on, opened with `fd`'s access mode, and its inode; an
/// errno when it is not a regular file of this mount open here by passthrough, or is open in
/// a mode the library leaves to the mount (appends, direct or synchronous I/O).
fn adopt(fs: &Fs, dev: u64, fd: OwnedFd) -> Result<(u64, std::fs::File), i32> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = std::fs::File::from(fd);
    let md = f
        .metadata()
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    if md.dev() != dev || !md.is_file() {
        return Err(libc::EXDEV);
    }
    // SAFETY: F_GETFL on a descriptor we own.
    let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 || flags & (libc::O_APPEND | libc::O_DIRECT | libc::O_DSYNC | libc::O_PATH) != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let ino = md.ino();
    let object = fs.preload_object(ino).ok_or(libc::EOPNOTSUPP)?;
    let acc = flags & libc::O_ACCMODE;
    std::fs::OpenOptions::new()
        .read(acc != libc::O_WRONLY)
        .write(acc != libc::O_RDONLY)
        .custom_flags(libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", object.as_raw_fd()))
        .map(|o| (ino, o))
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
}

/// A listening `SOCK_SEQPACKET` socket bound to the abstract name `name`.
fn bind_abstract(name: &str) -> io::Result<OwnedFd> {
    // SAFETY: a new socket, owned at once.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is the socket just made.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let (addr, len) = abstract_addr(name)?;
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
    if unsafe { libc::bind(fd, (&addr as *const libc::sockaddr_un).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a bound socket.
    if unsafe { libc::listen(fd, 64) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(owned)
}

/// The address of the abstract Unix socket `name` and its length.
pub fn abstract_addr(name: &str) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain old data; all zeros is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = name.as_bytes();
    if bytes.len() + 1 > addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket name too long",
        ));
    }
    for (dst, src) in addr.sun_path[1..].iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + bytes.len();
    Ok((addr, len as libc::socklen_t))
}
