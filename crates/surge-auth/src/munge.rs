//! MUNGE credentials through libmunge (the daemon `munged` Slurm sites already run).
//!
//! A credential says which uid and gid made it (munged learns it from the socket's peer
//! credentials) and can be decoded once (munged refuses replays) within its time to live. A
//! client of the manager makes a fresh one for every call; the manager decodes it with the
//! munged of its own host, which shares the site's MUNGE key.
//!
//! The socket is the system's (`/run/munge/munge.socket.2`) unless `SURGE_MUNGE_SOCKET` names
//! another: `surge run` starts a munged of its own ([`Daemon`]) when the host has none.

use crate::AuthError;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The environment variable naming munged's socket.
pub const SOCKET_ENV: &str = "SURGE_MUNGE_SOCKET";
/// The system munged's socket.
pub const SYSTEM_SOCKET: &str = "/run/munge/munge.socket.2";

const MUNGE_OPT_SOCKET: c_int = 8;
const EMUNGE_SUCCESS: c_int = 0;

#[link(name = "munge")]
extern "C" {
    fn munge_ctx_create() -> *mut c_void;
    fn munge_ctx_destroy(ctx: *mut c_void);
    fn munge_ctx_set(ctx: *mut c_void, opt: c_int, ...) -> c_int;
    fn munge_encode(
        cred: *mut *mut c_char,
        ctx: *mut c_void,
        buf: *const c_void,
        len: c_int,
    ) -> c_int;
    fn munge_decode(
        cred: *const c_char,
        ctx: *mut c_void,
        buf: *mut *mut c_void,
        len: *mut c_int,
        uid: *mut libc::uid_t,
        gid: *mut libc::gid_t,
    ) -> c_int;
    fn munge_strerror(e: c_int) -> *const c_char;
}

fn strerror(e: c_int) -> String {
    // SAFETY: munge_strerror returns a static string for any value.
    unsafe {
        let p = munge_strerror(e);
        if p.is_null() {
            format!("error {e}")
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

/// The socket to use: `SURGE_MUNGE_SOCKET`, else the system's.
pub fn socket() -> PathBuf {
    std::env::var_os(SOCKET_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| SYSTEM_SOCKET.into())
}

/// A libmunge context on `socket`, destroyed on drop.
struct Ctx(*mut c_void);

impl Ctx {
    fn new(socket: &Path) -> Result<Ctx, AuthError> {
        // SAFETY: plain constructor; null on allocation failure.
        let ctx = unsafe { munge_ctx_create() };
        if ctx.is_null() {
            return Err(AuthError::Munge("cannot create a context".into()));
        }
        let ctx = Ctx(ctx);
        let path = CString::new(socket.as_os_str().as_encoded_bytes())
            .map_err(|_| AuthError::Munge("socket path contains a NUL byte".into()))?;
        // SAFETY: MUNGE_OPT_SOCKET takes a `const char *`, copied by libmunge.
        let rc = unsafe { munge_ctx_set(ctx.0, MUNGE_OPT_SOCKET, path.as_ptr()) };
        if rc != EMUNGE_SUCCESS {
            return Err(AuthError::Munge(strerror(rc)));
        }
        Ok(ctx)
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: made by munge_ctx_create, destroyed once.
        unsafe { munge_ctx_destroy(self.0) }
    }
}

/// A new credential for this process's user, from the munged at `socket`.
pub fn encode(socket: &Path) -> Result<String, AuthError> {
    let ctx = Ctx::new(socket)?;
    let mut cred: *mut c_char = std::ptr::null_mut();
    // SAFETY: no payload; libmunge allocates `cred` with malloc on success.
    let rc = unsafe { munge_encode(&mut cred, ctx.0, std::ptr::null(), 0) };
    if rc != EMUNGE_SUCCESS || cred.is_null() {
        return Err(AuthError::Munge(format!(
            "cannot get a credential from munged at {}: {} (is munged running? Surge's \
             manager takes who you are from MUNGE)",
            socket.display(),
            strerror(rc)
        )));
    }
    // SAFETY: a NUL-terminated string from libmunge, freed with free() after copying.
    let s = unsafe {
        let s = CStr::from_ptr(cred).to_string_lossy().into_owned();
        libc::free(cred.cast());
        s
    };
    Ok(s)
}

/// The uid and gid that made `cred`, checked by the munged at `socket` (once: a replayed,
/// expired or foreign credential is refused).
pub fn decode(cred: &str, socket: &Path) -> Result<(u32, u32), AuthError> {
    let ctx = Ctx::new(socket)?;
    let c = CString::new(cred).map_err(|_| AuthError::Munge("credential contains NUL".into()))?;
    let mut buf: *mut c_void = std::ptr::null_mut();
    let mut len: c_int = 0;
    let (mut uid, mut gid): (libc::uid_t, libc::gid_t) = (0, 0);
    // SAFETY: out-parameters are valid; a payload, if any, is malloc'ed and freed below.
    let rc = unsafe { munge_decode(c.as_ptr(), ctx.0, &mut buf, &mut len, &mut uid, &mut gid) };
    if !buf.is_null() {
        // SAFETY: allocated by libmunge with malloc.
        unsafe { libc::free(buf) };
    }
    if rc != EMUNGE_SUCCESS {
        return Err(AuthError::Munge(format!(
            "credential refused: {}",
            strerror(rc)
        )));
    }
    Ok((uid, gid))
}

/// True when a munged answers at `socket`.
pub fn answers(socket: &Path) -> bool {
    socket.exists() && encode(socket).is_ok()
}

/// `name` on the PATH, else in the sbin directories where Debian puts munged and mungekey
/// (often not on a user's PATH).
fn program(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// A munged of our own (for `surge run` on a host without one, and for tests): its key, socket,
/// pid, log and seed files in one directory (0700). Stopped when dropped.
pub struct Daemon {
    child: Option<Child>,
    pub socket: PathBuf,
}

impl Daemon {
    /// Starts munged with its files in `dir` (a key is made there the first time), its socket
    /// there too: only `dir`'s owner (and root) can reach it.
    pub fn start(dir: &Path) -> Result<Daemon, AuthError> {
        Self::start_with_socket(dir, &dir.join("munge.socket"))
    }

    /// [`start`](Self::start) with the socket at `socket` (whose directory decides who can
    /// reach it: every user, for a munged serving a host).
    pub fn start_with_socket(dir: &Path, socket: &Path) -> Result<Daemon, AuthError> {
        use std::os::unix::fs::DirBuilderExt;
        let e = |m: String| AuthError::Munge(m);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|err| e(format!("cannot create {}: {err}", dir.display())))?;
        let key = dir.join("munge.key");
        if !key.exists() {
            let out = Command::new(program("mungekey"))
                .arg("--create")
                .arg(format!("--keyfile={}", key.display()))
                .output()
                .map_err(|err| {
                    e(format!(
                        "cannot run mungekey ({err}): install MUNGE (Debian: apt install munge)"
                    ))
                })?;
            if !out.status.success() {
                return Err(e(format!(
                    "mungekey failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
        }
        let socket = socket.to_path_buf();
        let _ = std::fs::remove_file(&socket);
        let mut cmd = Command::new(program("munged"));
        // It dies with the thread that started it (a killed `surge run` leaves none behind).
        // SAFETY: prctl is async-signal-safe.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = cmd
            .args(["--foreground", "--force"])
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--key-file={}", key.display()))
            .arg(format!("--pid-file={}", dir.join("munged.pid").display()))
            .arg(format!("--log-file={}", dir.join("munged.log").display()))
            .arg(format!("--seed-file={}", dir.join("munged.seed").display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|err| {
                e(format!(
                    "cannot start munged ({err}): install MUNGE (Debian: apt install munge)"
                ))
            })?;
        let mut d = Daemon {
            child: Some(child),
            socket,
        };
        let start = Instant::now();
        while !answers(&d.socket) {
            if let Some(c) = d.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    return Err(e(format!(
                        "munged exited ({st}); see {}",
                        dir.join("munged.log").display()
                    )));
                }
            }
            if start.elapsed() > Duration::from_secs(10) {
                return Err(e(format!(
                    "munged did not answer within 10 s; see {}",
                    dir.join("munged.log").display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(d)
    }

    /// Leaves the daemon running when this handle goes (it serves other processes).
    pub fn detach(mut self) -> u32 {
        self.child.take().map_or(0, |c| c.id())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_names_its_maker_and_decodes_once() {
        if Command::new("munged").arg("--version").output().is_err() {
            // The rule of surge_testkit::skip_without (this crate cannot use the test kit).
            assert!(
                std::env::var("SURGE_SKIP_MISSING").is_ok_and(|v| v == "1"),
                "munged is not installed: `make setup` installs it (apt install munge), or set \
                 SURGE_SKIP_MISSING=1 to skip such tests"
            );
            eprintln!("SKIPPED: munged is not installed (SURGE_SKIP_MISSING=1)");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let m = Daemon::start(&d.path().join("munge")).unwrap();
        let cred = encode(&m.socket).unwrap();
        // SAFETY: getuid/getgid have no preconditions.
        let me = unsafe { (libc::getuid(), libc::getgid()) };
        assert_eq!(decode(&cred, &m.socket).unwrap(), me);
        let again = decode(&cred, &m.socket).unwrap_err().to_string();
        assert!(again.contains("eplayed"), "{again}");
        assert!(decode("MUNGE:garbage:", &m.socket).is_err());
    }
}
