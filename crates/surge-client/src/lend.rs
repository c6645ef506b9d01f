//! Kernel FUSE passthrough for mounts that are not root: `surge passthrough-helper`.
//!
//! The kernel maps a FUSE file onto a backing file (passthrough: reads and writes go to the
//! backing file without the daemon) only for a daemon with `CAP_SYS_ADMIN`
//! (`FUSE_DEV_IOC_BACKING_OPEN` checks it: "relax once backing files are visible to lsof").
//! A mount made by a user (a plain `surge run` as that user) therefore copies every byte
//! through its daemon: a fraction of the fast tier's speed (docs/DATAPLANE.md).
//!
//! The helper, started by root (a system service), lends that one check and nothing else. A
//! mount connects to its socket and hands over its `/dev/fuse` descriptor; the helper forks a
//! process for the connection that becomes the connecting user (its uid, gid and no
//! supplementary groups, `SO_PEERCRED`) keeping only `CAP_SYS_ADMIN`, and from then on
//! registers, on that user's own FUSE connection, backing files the mount opened itself and
//! sends over (`SCM_RIGHTS`): regular files owned by that user. What the user can read and
//! write through the mount is therefore what they could read and write already; the kernel
//! does the I/O with the credentials of the process that registered the file (the user's,
//! with `CAP_SYS_ADMIN`: no quota or reserved-block privilege, which is `CAP_SYS_RESOURCE`).
//! What is lent: a user can keep files open that `lsof` does not show, until their mount
//! ends (docs/SECURITY.md). The connection's process ends with the mount (or the helper).
//!
//! Wire format (a `SOCK_SEQPACKET` Unix socket, one request, one answer): requests are a tag
//! byte, `H` (hello, with the `/dev/fuse` descriptor attached), `O` (open, with the backing
//! file attached) or `C` + a little-endian `u32` backing id (close); answers are a
//! little-endian `i32`: the backing id or 0 on success, `-errno` on failure.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use surge_proto::unix::{peer_cred, recv, send};
use tracing::{debug, info, warn};

/// The helper's socket: `$SURGE_PASSTHROUGH_SOCKET`, else [`DEFAULT_SOCKET`].
pub const SOCKET_ENV: &str = "SURGE_PASSTHROUGH_SOCKET";
pub const DEFAULT_SOCKET: &str = "/run/surge/passthrough.sock";

const HELLO: u8 = b'H';
const OPEN: u8 = b'O';
const CLOSE: u8 = b'C';

/// `/dev/fuse` is character device 10:229.
const FUSE_MAJOR: u32 = 10;
const FUSE_MINOR: u32 = 229;
/// `FUSE_DEV_IOC_BACKING_CLOSE`: `_IOW(229, 2, uint32_t)`.
const FUSE_DEV_IOC_BACKING_CLOSE: libc::c_ulong = 0x4004_e502;

pub fn socket_path() -> PathBuf {
    std::env::var_os(SOCKET_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| DEFAULT_SOCKET.into())
}

fn answer(v: &[u8]) -> io::Result<i32> {
    let b: [u8; 4] = v
        .try_into()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "short answer"))?;
    Ok(i32::from_le_bytes(b))
}

/// A mount's connection to the helper (client side).
pub struct Lender {
    sock: parking_lot::Mutex<OwnedFd>,
}

impl Lender {
    /// Connects to the helper at `path` and hands it the mount's `/dev/fuse` descriptor.
    pub fn connect(path: &Path, fuse: BorrowedFd<'_>) -> io::Result<Lender> {
        let (sock, addr) = seqpacket(path)?;
        // SAFETY: addr is a valid sockaddr_un of the length given.
        let rc = unsafe {
            libc::connect(
                sock.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let l = Lender {
            sock: parking_lot::Mutex::new(sock),
        };
        let r = l.call(&[HELLO], Some(fuse.as_raw_fd()))?;
        if r < 0 {
            return Err(io::Error::from_raw_os_error(-r));
        }
        Ok(l)
    }

    fn call(&self, msg: &[u8], fd: Option<RawFd>) -> io::Result<i32> {
        let s = self.sock.lock();
        send(s.as_raw_fd(), msg, fd)?;
        let mut buf = [0u8; 8];
        match recv(s.as_raw_fd(), &mut buf)? {
            (0, _) => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the passthrough helper closed the connection",
            )),
            (n, _) => answer(&buf[..n]),
        }
    }

    /// Registers `file` as a backing file of the mount's FUSE connection: its backing id.
    pub fn open(&self, file: BorrowedFd<'_>) -> io::Result<u32> {
        let r = self.call(&[OPEN], Some(file.as_raw_fd()))?;
        if r < 0 {
            return Err(io::Error::from_raw_os_error(-r));
        }
        Ok(r as u32)
    }

    /// Unregisters backing id `id` (files open with it keep it until they are closed).
    pub fn close(&self, id: u32) -> io::Result<()> {
        let mut m = [0u8; 5];
        m[0] = CLOSE;
        m[1..].copy_from_slice(&id.to_le_bytes());
        let r = self.call(&m, None)?;
        if r < 0 {
            return Err(io::Error::from_raw_os_error(-r));
        }
        Ok(())
    }
}

/// Serve root's half: lend kernel FUSE passthrough to mounts made by users (see the module
/// documentation).
///
/// Runs as root, one per host, as a system service. Mounts made by users (`surge run`,
/// `surge mount`) look for its socket and, when it answers, open files of one stripe on a
/// fragment of their host with kernel passthrough, as a root mount does: the fast tier's
/// speed instead of the daemon's. Each connection is served by a process of its own that
/// runs as the connecting user with CAP_SYS_ADMIN as its only privilege, and maps only
/// files that user owns and opened.
///
/// Example (as root; a systemd unit is in contrib/systemd/):
///   surge passthrough-helper &
///   # then, as any user:
///   surge run job.sh
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct HelperArgs {
    /// The socket to listen on.
    #[arg(long, env = SOCKET_ENV, default_value = DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Only members of this group may connect (the socket is made 0660, group GROUP);
    /// default: every local user (0666).
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    /// Write a line to this file once listening (for scripts).
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
}

fn group_id(name: &str) -> anyhow::Result<u32> {
    if let Ok(g) = name.parse::<u32>() {
        return Ok(g);
    }
    let c = std::ffi::CString::new(name)?;
    // SAFETY: getgrnam_r writes into our buffers only.
    unsafe {
        let mut gr: libc::group = std::mem::zeroed();
        let mut buf = vec![0 as libc::c_char; 16384];
        let mut out: *mut libc::group = std::ptr::null_mut();
        if libc::getgrnam_r(c.as_ptr(), &mut gr, buf.as_mut_ptr(), buf.len(), &mut out) == 0
            && !out.is_null()
        {
            return Ok(gr.gr_gid);
        }
    }
    anyhow::bail!("no group named '{name}' (--group)")
}

pub fn run_helper(args: HelperArgs) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid has no preconditions.
    anyhow::ensure!(
        unsafe { libc::geteuid() } == 0,
        "surge passthrough-helper lends root's CAP_SYS_ADMIN to FUSE mounts: run it as root"
    );
    let gid = args.group.as_deref().map(group_id).transpose()?;
    if let Some(dir) = args.socket.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    match std::fs::remove_file(&args.socket) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("cannot remove {}", args.socket.display()))
        }
        _ => {}
    }
    let listener = bind(&args.socket)?;
    let mode = if gid.is_some() { 0o660 } else { 0o666 };
    if let Some(g) = gid {
        std::os::unix::fs::chown(&args.socket, None, Some(g))
            .with_context(|| format!("cannot give {} to group {g}", args.socket.display()))?;
    }
    std::fs::set_permissions(&args.socket, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot open {} to users", args.socket.display()))?;
    // Children are reaped by the kernel; SIGTERM and SIGINT remove the socket (mounts then
    // see no helper, rather than one that does not answer).
    remove_on_exit(&args.socket)?;
    // SAFETY: setting a signal disposition.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) };
    info!(
        "lending kernel FUSE passthrough on {} ({})",
        args.socket.display(),
        match &args.group {
            Some(g) => format!("group {g}"),
            None => "every local user".into(),
        }
    );
    if let Some(r) = &args.ready_file {
        std::fs::write(r, format!("{}\n", args.socket.display()))
            .with_context(|| format!("cannot write {}", r.display()))?;
    }
    loop {
        // SAFETY: accept on our listener; the new descriptor is ours.
        let c = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if c < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            warn!("accept on {}: {e}", args.socket.display());
            std::thread::sleep(std::time::Duration::from_millis(100));
            continue;
        }
        // SAFETY: a fresh descriptor we own.
        let conn = unsafe { OwnedFd::from_raw_fd(c) };
        let cred = match peer_cred(conn.as_raw_fd()) {
            Ok(c) => c,
            Err(e) => {
                warn!("a connection without credentials ({e}): closed");
                continue;
            }
        };
        // This process has one thread: the child may do anything after fork.
        // SAFETY: fork of a single-threaded process.
        match unsafe { libc::fork() } {
            0 => {
                drop(listener);
                // SAFETY: the connection's process keeps the default dispositions.
                unsafe {
                    libc::signal(libc::SIGTERM, libc::SIG_DFL);
                    libc::signal(libc::SIGINT, libc::SIG_DFL);
                }
                let code = match serve_conn(conn, cred) {
                    Ok(()) => 0,
                    Err(e) => {
                        warn!("uid {} (pid {}): {e:#}", cred.uid, cred.pid);
                        1
                    }
                };
                // SAFETY: leave the child without running the parent's destructors twice.
                unsafe { libc::_exit(code) };
            }
            -1 => warn!(
                "cannot fork for uid {}: {}",
                cred.uid,
                io::Error::last_os_error()
            ),
            _ => debug!("serving uid {} (pid {})", cred.uid, cred.pid),
        }
    }
}

static SOCKET_PATH: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();

extern "C" fn on_stop(_sig: libc::c_int) {
    // unlink and _exit are async-signal-safe; the path was set before the handler.
    if let Some(p) = SOCKET_PATH.get() {
        // SAFETY: a NUL-terminated path that lives for the process.
        unsafe { libc::unlink(p.as_ptr()) };
    }
    // SAFETY: ends the process without running anything else.
    unsafe { libc::_exit(0) };
}

fn remove_on_exit(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let _ = SOCKET_PATH.set(std::ffi::CString::new(path.as_os_str().as_bytes())?);
    let handler: extern "C" fn(libc::c_int) = on_stop;
    // SAFETY: installing a handler that only calls async-signal-safe functions.
    unsafe {
        libc::signal(libc::SIGTERM, handler as libc::sighandler_t);
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
    }
    Ok(())
}

/// A `SOCK_SEQPACKET` Unix socket and the address of `path`.
fn seqpacket(path: &Path) -> io::Result<(OwnedFd, libc::sockaddr_un)> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: plain socket creation.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: zeroed sockaddr_un is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let p = path.as_os_str().as_bytes();
    if p.len() >= addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("socket path {} is too long", path.display()),
        ));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(p) {
        *d = *s as libc::c_char;
    }
    Ok((sock, addr))
}

fn bind(path: &Path) -> anyhow::Result<OwnedFd> {
    use anyhow::Context;
    let (sock, addr) =
        seqpacket(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    // SAFETY: addr is a valid sockaddr_un of the length given; listen on our socket.
    unsafe {
        if libc::bind(
            sock.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        ) != 0
        {
            return Err(io::Error::last_os_error())
                .with_context(|| format!("cannot listen on {}", path.display()));
        }
        if libc::listen(sock.as_raw_fd(), 64) != 0 {
            return Err(io::Error::last_os_error())
                .with_context(|| format!("cannot listen on {}", path.display()));
        }
    }
    Ok(sock)
}

/// Becomes `uid`/`gid` (no supplementary groups) keeping `CAP_SYS_ADMIN` alone.
fn become_user(uid: u32, gid: u32) -> io::Result<()> {
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    const CAP_SYS_ADMIN: u32 = 21;
    let check = |rc: libc::c_long| {
        if rc != 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // SAFETY: credential system calls on this (single-threaded) process.
    unsafe {
        check(libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) as libc::c_long)?;
        check(libc::setgroups(1, &gid) as libc::c_long)?;
        check(libc::setresgid(gid, gid, gid) as libc::c_long)?;
        check(libc::setresuid(uid, uid, uid) as libc::c_long)?;
        let hdr = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let keep = 1u32 << CAP_SYS_ADMIN;
        let data = [
            CapData {
                effective: keep,
                permitted: keep,
                inheritable: 0,
            },
            CapData {
                effective: 0,
                permitted: 0,
                inheritable: 0,
            },
        ];
        check(libc::syscall(libc::SYS_capset, &hdr, data.as_ptr()))?;
        check(libc::prctl(libc::PR_SET_KEEPCAPS, 0, 0, 0, 0) as libc::c_long)?;
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) as libc::c_long)?;
    }
    Ok(())
}

fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: fstat into our struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.as_raw_fd(), &mut st) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st)
    }
}

fn reply(sock: RawFd, v: i32) -> io::Result<()> {
    send(sock, &v.to_le_bytes(), None)
}

fn errno_of(e: &io::Error) -> i32 {
    -e.raw_os_error().unwrap_or(libc::EIO)
}

/// The child's work: one mount's connection, as its user.
fn serve_conn(conn: OwnedFd, cred: libc::ucred) -> anyhow::Result<()> {
    use anyhow::Context;
    let s = conn.as_raw_fd();
    become_user(cred.uid, cred.gid).context("cannot become the connecting user")?;
    let mut buf = [0u8; 16];
    let fuse = match recv(s, &mut buf)? {
        (0, _) => return Ok(()),
        (1, Some(fd)) if buf[0] == HELLO => fd,
        _ => {
            let _ = reply(s, -libc::EPROTO);
            anyhow::bail!("the first message is not a hello with a descriptor");
        }
    };
    let st = fstat(fuse.as_fd())?;
    let is_fuse = st.st_mode & libc::S_IFMT == libc::S_IFCHR
        && libc::major(st.st_rdev) == FUSE_MAJOR
        && libc::minor(st.st_rdev) == FUSE_MINOR;
    if !is_fuse {
        let _ = reply(s, -libc::EBADF);
        anyhow::bail!("the descriptor sent is not /dev/fuse");
    }
    reply(s, 0)?;
    loop {
        let (n, fd) = recv(s, &mut buf)?;
        let r = match (n, buf[0], fd) {
            (0, _, _) => return Ok(()),
            (1, OPEN, Some(file)) => match fstat(file.as_fd()) {
                Ok(st) if st.st_mode & libc::S_IFMT != libc::S_IFREG => -libc::EINVAL,
                Ok(st) if st.st_uid != cred.uid => -libc::EPERM,
                Ok(_) => match fuser::BackingId::create_raw(&fuse, &file) {
                    Ok(id) => id as i32,
                    Err(e) => errno_of(&e),
                },
                Err(e) => errno_of(&e),
            },
            (5, CLOSE, None) => {
                let id = u32::from_le_bytes([buf[1], buf[2], buf[3], buf[4]]);
                // SAFETY: the ioctl reads a u32 we own.
                let rc = unsafe { libc::ioctl(fuse.as_raw_fd(), FUSE_DEV_IOC_BACKING_CLOSE, &id) };
                if rc < 0 {
                    errno_of(&io::Error::last_os_error())
                } else {
                    0
                }
            }
            _ => -libc::EPROTO,
        };
        reply(s, r)?;
    }
}
