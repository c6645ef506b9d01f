//! The test kit of Surge's own tests (a dev-dependency only): everything a test needs to stand
//! up real servers, instances and mounts on this machine.
//!
//! - [`inproc`]: servers inside the test process (`surge_server::cli::start`, port 0) and an
//!   instance over them, for tests of the client core and the staging engine without a kernel
//!   mount or a `surge` binary.
//! - [`procs`]: `surge server` and `surge mount` processes (the binary the test names), for
//!   end-to-end tests through a real FUSE mount; servers can be killed and restarted.
//! - [`Scratch`], [`wait_for`], [`Rng`], [`seed`], [`ChildGuard`]: small helpers.
//! - [`skip_without_fuse`]: the one rule for FUSE tests on machines without FUSE.

pub mod etcd;
pub mod inproc;
pub mod procs;
pub mod wire;

/// The cluster key of this test process (one for all its servers and commands; see
/// `surge_auth::key`), made on first use in a private directory under the system's temporary
/// directory. Processes the kit starts get it as `SURGE_KEY_FILE`.
pub fn key_file() -> &'static Path {
    static KEY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("surge-test-key-{}", std::process::id()));
        let p = dir.join("surge.key");
        let _ = std::fs::remove_dir_all(&dir);
        remove_stale("surge-test-key-");
        surge_auth::Key::create(&p).expect("make the test cluster key");
        p
    })
}

/// The socket of a munged for this test process's managers and their clients (started on first
/// use on a thread of its own, so it lives, and dies, with the process).
pub fn munge_socket() -> &'static Path {
    static SOCKET: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    SOCKET.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("surge-test-munge-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        remove_stale("surge-test-munge-");
        // The socket is every user's (tests run commands as other users), its key the test's.
        let public = dir.join("socket");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("test-munged".into())
            .spawn(move || {
                use std::os::unix::fs::PermissionsExt;
                let d = std::fs::create_dir_all(&public)
                    .and_then(|_| {
                        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
                    })
                    .and_then(|_| {
                        std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o755))
                    })
                    .map_err(|e| surge_auth::AuthError::Munge(e.to_string()))
                    .and_then(|_| {
                        surge_auth::munge::Daemon::start_with_socket(
                            &dir.join("private"),
                            &public.join("munge.socket"),
                        )
                    });
                let _ = tx.send(
                    d.as_ref()
                        .map(|d| d.socket.clone())
                        .map_err(|e| e.to_string()),
                );
                // munged dies with this thread (PDEATHSIG): keep it for the process's life.
                let _keep = d;
                loop {
                    std::thread::park();
                }
            })
            .expect("start the test munged thread");
        match rx.recv() {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => panic!("cannot start munged for the tests: {e} (make setup installs it)"),
            Err(_) => panic!("the test munged thread died"),
        }
    })
}

/// A `surge` command for tests that talk to a manager of their own: the process's cluster key
/// and munged.
pub fn surge_command(bin: &Path) -> Command {
    let mut c = Command::new(bin);
    c.env("SURGE_KEY_FILE", key_file())
        .env(surge_auth::munge::SOCKET_ENV, munge_socket());
    c
}

/// Removes `/tmp/<prefix><pid>` directories of test processes that are gone.
fn remove_stale(prefix: &str) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(pid) = name
            .strip_prefix(prefix)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// The cluster key of this test process.
pub fn key() -> surge_auth::Key {
    surge_auth::Key::load(key_file()).expect("load the test cluster key")
}

/// An administrator's capability made with this process's key.
pub fn admin_token() -> surge_auth::Token {
    surge_auth::Token::admin(&key(), surge_auth::Caller::me(), 3600)
}

/// A capability for `instance` (every namespace) for this process's user.
pub fn instance_token(instance: u64) -> surge_auth::Token {
    instance_token_for(instance, surge_auth::Caller::me())
}

/// A capability for `instance` (every namespace) acting for `caller` (what the manager gives
/// a root agent that mounts for a job's user).
pub fn instance_token_for(instance: u64, caller: surge_auth::Caller) -> surge_auth::Token {
    surge_auth::Token::mint(
        &key(),
        &surge_auth::Claims {
            instance,
            ns: None,
            caller,
            rights: surge_auth::Rights::Instance,
            expires: surge_auth::token::now() + 3600,
            generation: 0,
        },
    )
}

/// The uid and gid of the local user `name`, made if missing (`useradd --system`, no home,
/// no login shell): tests that run commands as a user who is not root.
pub fn system_user(name: &str) -> (u32, u32) {
    let id = |flag: &str| {
        std::process::Command::new("id")
            .args([flag, name])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .parse::<u32>()
                    .ok()
            })
    };
    // One useradd at a time in this process (tests of one file run in threads and often want
    // the same user: two at once made one fail, and a user half made is not found by the
    // other test's tools), and one made meanwhile by another process is as good.
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|p| p.into_inner());
    if id("-u").is_none() {
        let o = std::process::Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ])
            .output()
            .expect("run useradd");
        // 9: the name exists (made by another test process just now).
        assert!(
            o.status.success() || o.status.code() == Some(9),
            "useradd {name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    (id("-u").expect("uid"), id("-g").expect("gid"))
}

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A scratch directory under /dev/shm (the fast tier; /tmp where there is none), removed on
/// drop. `tag` names it, with the test process's pid and a counter.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let base = if Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        };
        let p = PathBuf::from(format!(
            "{base}/surge-test-{}-{tag}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create a scratch directory");
        Scratch(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether the tests run as root (mounts then use kernel passthrough).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Why FUSE tests cannot run here, if they cannot.
pub fn fuse_unavailable() -> Option<String> {
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse does not exist".into());
    }
    let root = is_root();
    if !root && Command::new("fusermount3").arg("-V").output().is_err() {
        return Some("not root and fusermount3 is not installed".into());
    }
    None
}

/// Returns true (after printing why) when a FUSE test must be skipped: only when the run says
/// so with `SURGE_SKIP_FUSE=1`. Without it a machine that cannot mount fails the test, so a
/// run never reports FUSE tests as passed that did not run.
pub fn skip_without_fuse(test: &str) -> bool {
    match fuse_unavailable() {
        None => false,
        Some(why) if std::env::var("SURGE_SKIP_FUSE").is_ok_and(|v| v == "1") => {
            eprintln!("SKIPPED {test}: needs FUSE: {why} (SURGE_SKIP_FUSE=1)");
            true
        }
        Some(why) => panic!(
            "{test} needs FUSE: {why}; run as root on a machine with /dev/fuse, or set \
             SURGE_SKIP_FUSE=1 to skip the FUSE tests"
        ),
    }
}

/// The one rule for tests that need root (to make users, run daemons as root, mount): they
/// fail when not root, unless the run says it may skip them (`SURGE_SKIP_ROOT=1`), and then
/// they say so. Returns true when the test should return now.
pub fn skip_without_root(test: &str) -> bool {
    if is_root() {
        return false;
    }
    if std::env::var("SURGE_SKIP_ROOT").is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED {test}: needs root (SURGE_SKIP_ROOT=1)");
        return true;
    }
    panic!("{test} needs root; run the tests as root, or set SURGE_SKIP_ROOT=1 to skip them")
}

/// The one rule for tests that need a tool or a kernel feature `scripts/setup.sh` installs or
/// this project's machines have (a C compiler, gfortran, Open MPI, Chromium, Python modules,
/// FUSE over io_uring): without it the test fails, naming `why`, unless the run says it may
/// skip such tests (`SURGE_SKIP_MISSING=1`), and then it says so. Returns true when the test
/// should return now. So a run never reports as passed a test that did not run.
pub fn skip_without(test: &str, why: &str) -> bool {
    if std::env::var("SURGE_SKIP_MISSING").is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED {test}: {why} (SURGE_SKIP_MISSING=1)");
        return true;
    }
    panic!(
        "{test} cannot run: {why}; `make setup` (scripts/setup.sh) installs what the tests need, \
         or set SURGE_SKIP_MISSING=1 to skip such tests"
    )
}

/// Calls `f` every 20 ms until it returns something; panics after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The async twin of [`wait_for`] (tokio tests): awaits `f` every 20 ms until it returns
/// something; panics after `timeout`.
pub async fn wait_for_async<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A thing that must not happen: checks `ok` every 20 ms for the whole of `period` and panics
/// at the first check that fails, with `what` and the check's own reason. (A test that slept
/// and then looked once would miss a violation that came and went, and would say nothing
/// about when.)
pub fn holds_for(what: &str, period: Duration, mut ok: impl FnMut() -> Result<(), String>) {
    let start = Instant::now();
    loop {
        if let Err(why) = ok() {
            panic!("{what}: broken after {:?}: {why}", start.elapsed());
        }
        if start.elapsed() >= period {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The async twin of [`holds_for`].
pub async fn holds_for_async<F, Fut>(what: &str, period: Duration, mut ok: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let start = Instant::now();
    loop {
        if let Err(why) = ok().await {
            panic!("{what}: broken after {:?}: {why}", start.elapsed());
        }
        if start.elapsed() >= period {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `Ok` when `cond`, else `Err` of the reason `why` gives (for [`holds_for`]).
pub fn check(cond: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(why())
    }
}

/// Whether bytes a client sent wait unread at an accepted connection of the local listener on
/// `port` (a stopped process's listener: the kernel completes the handshake and queues the
/// request). Read from /proc/net/tcp and tcp6.
pub fn request_queued_at(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        std::fs::read_to_string(table)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|line| {
                // sl local_address rem_address st tx_queue:rx_queue ...
                let f: Vec<&str> = line.split_whitespace().collect();
                let local_port = f
                    .get(1)
                    .and_then(|a| a.rsplit(':').next())
                    .and_then(|p| u16::from_str_radix(p, 16).ok());
                let established = f.get(3) == Some(&"01");
                let unread = f
                    .get(4)
                    .and_then(|q| q.split(':').nth(1))
                    .and_then(|rx| u64::from_str_radix(rx, 16).ok())
                    .unwrap_or(0);
                local_port == Some(port) && established && unread > 0
            })
    })
}

/// Deterministic pseudo-random numbers (xorshift) so a failing run can be replayed by seed.
pub struct Rng(pub u64);

#[allow(clippy::should_implement_trait)]
impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// The seed of a randomized test: `SURGE_TEST_SEED`, else the clock (printed by the test).
pub fn seed() -> u64 {
    std::env::var("SURGE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        })
}

/// A child process killed when the guard goes (also when a test panics).
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    /// SIGTERM first, so a `surge mount` unmounts (a SIGKILLed one leaves a dead mount behind),
    /// then SIGKILL after 3 s.
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
            unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(3) {
                if let Ok(Some(_)) = self.0.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
