//! The embedded default (DESIGN §2): with no manager configured, `surge run` starts a manager and
//! N servers on this machine as separate `surge` processes (the same code, protocol and processes
//! as a cluster; only the addresses differ), and stops them at the end.
//!
//! Layout under the fast-tier directory (default `/dev/shm/surge-$USER`):
//! ```text
//! lock                 held while a `surge run` uses this directory
//! state/manager.db     the manager's state (persistent instances survive between runs)
//! bb<i>/               device of server i;  bb<i>.sock its Unix socket
//! logs/                manager.log, server-<i>.log
//! run/surge.key        the cluster key of this run (0600), shared by manager and servers
//! run/munge/           a munged of our own when the host runs none (its socket authenticates
//!                      every call to the manager, as on a cluster)
//! ```
//! and in the state directory (default `<fast dir>/state`), `embedded-peaks.json`: the
//! calibrated peaks of these servers (crate::calibrate), registered at every start.
//!
//! The directory is private to its user (0700): data at rest is reached through mounts only.

use anyhow::Context;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Servers the embedded default starts (`$SURGE_SERVERS`).
pub const DEFAULT_SERVERS: usize = 4;
/// Granularity of the embedded default's pool when it is created (`$SURGE_GRANULARITY`).
pub const DEFAULT_GRANULARITY: &str = "256MiB";

/// The embedded default's fast tier: `/dev/shm/surge-$USER`.
pub fn default_fast_dir() -> PathBuf {
    PathBuf::from(format!("/dev/shm/surge-{}", user_name()))
}

#[derive(Clone, Debug)]
pub struct EmbeddedOptions {
    pub fast_dir: PathBuf,
    pub state_dir: PathBuf,
    pub servers: usize,
    /// Capacity per server; `None`: 80% of the fast tier's free space, shared.
    pub server_capacity: Option<u64>,
    pub granularity: u64,
}

impl EmbeddedOptions {
    /// The options `surge run` would use, from the same environment variables
    /// (`SURGE_FAST_DIR`, `SURGE_STATE_DIR`, `SURGE_SERVERS`, `SURGE_SERVER_CAPACITY`,
    /// `SURGE_GRANULARITY`) and defaults.
    pub fn from_env() -> anyhow::Result<EmbeddedOptions> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let fast_dir = var("SURGE_FAST_DIR").map_or_else(default_fast_dir, PathBuf::from);
        let state_dir =
            var("SURGE_STATE_DIR").map_or_else(|| fast_dir.join("state"), PathBuf::from);
        let servers = match var("SURGE_SERVERS") {
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .with_context(|| format!("SURGE_SERVERS={v} is not a positive number"))?,
            None => DEFAULT_SERVERS,
        };
        let size = |k: &str| -> anyhow::Result<Option<u64>> {
            var(k)
                .map(|v| surge_core::sys::size_arg(&v).map_err(|e| anyhow::anyhow!("{k}={v}: {e}")))
                .transpose()
        };
        let granularity = match size("SURGE_GRANULARITY")? {
            Some(g) => g,
            None => surge_core::sys::size_arg(DEFAULT_GRANULARITY).map_err(anyhow::Error::msg)?,
        };
        Ok(EmbeddedOptions {
            fast_dir,
            state_dir,
            servers,
            server_capacity: size("SURGE_SERVER_CAPACITY")?,
            granularity,
        })
    }
}

/// The manager a command (`surge persistent`, `surge session ls`, ...) uses when none is given:
/// the one of the `surge run` using the embedded default's directory right now, else the
/// embedded manager and servers started for the command (and stopped after it), over the
/// state that `surge run` keeps there.
pub enum CommandManager {
    Running(String),
    Started(Box<Embedded>),
}

impl CommandManager {
    pub fn find_or_start(opts: &EmbeddedOptions, surge: &Path) -> anyhow::Result<CommandManager> {
        if let Some(addr) = running_manager(&opts.fast_dir) {
            return Ok(CommandManager::Running(addr));
        }
        Ok(CommandManager::Started(Box::new(Embedded::start(
            opts, surge,
        )?)))
    }

    /// The manager's gRPC address.
    pub fn addr(&self) -> &str {
        match self {
            CommandManager::Running(a) => a,
            CommandManager::Started(e) => &e.manager,
        }
    }

    pub fn stop(self) {
        if let CommandManager::Started(e) = self {
            e.stop();
        }
    }
}

/// The gRPC address of the manager of a `surge run` holding `fast`'s lock, if one does.
fn running_manager(fast: &Path) -> Option<String> {
    use std::os::fd::AsRawFd;
    // Only a directory of our own names our manager: another user's (made first, under our
    // default name) would send our credentials to theirs.
    surge_core::private_dir::check(fast).ok()?;
    let lock = File::open(fast.join("lock")).ok()?;
    // SAFETY: flock on a file we opened; dropping it releases our lock if we got it.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return None;
    }
    let text = std::fs::read_to_string(fast.join("run/manager.ready")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["grpc"].as_str().map(str::to_string)
}

pub struct Embedded {
    pub manager: String,
    pub http: Option<String>,
    pub fast_dir: PathBuf,
    pub servers: usize,
    /// The munged socket every call to the manager is authenticated with.
    pub munge_socket: PathBuf,
    /// The cluster key file of this run.
    pub key_file: PathBuf,
    manager_child: Option<Child>,
    server_children: Vec<Child>,
    /// Our own munged, when the host runs none (stopped last).
    munged: Option<surge_auth::munge::Daemon>,
    _lock: File,
}

/// The munged to use: the system's (or `$SURGE_MUNGE_SOCKET`'s) when it answers, else one of
/// our own with its files in `dir`.
fn munge(dir: &Path) -> anyhow::Result<(PathBuf, Option<surge_auth::munge::Daemon>)> {
    let socket = surge_auth::munge::socket();
    if surge_auth::munge::answers(&socket) {
        return Ok((socket, None));
    }
    let d = surge_auth::munge::Daemon::start(dir)
        .context("the embedded manager authenticates its callers with MUNGE")?;
    Ok((d.socket.clone(), Some(d)))
}

/// The user's name for default directory names (the user database's, never `$USER`).
pub fn user_name() -> String {
    surge_core::sys::user_name()
}

/// Makes a child die with us and start with a clean signal mask (we block SIGINT/SIGTERM to
/// handle them in one thread; children must not inherit that).
pub fn child_setup(cmd: &mut Command, die_with_parent: bool) {
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            if die_with_parent {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            }
            Ok(())
        });
    }
}

fn wait_ready(
    file: &Path,
    child: &mut Child,
    what: &str,
    log: &Path,
) -> anyhow::Result<serde_json::Value> {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(file) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                return Ok(v);
            }
        }
        if let Some(st) = child.try_wait()? {
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(5).collect();
            anyhow::bail!(
                "{what} exited ({st}) before it was ready; last log lines ({}):\n{}",
                log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        if start.elapsed() > Duration::from_secs(30) {
            anyhow::bail!("{what} was not ready after 30 s (see {})", log.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Embedded {
    /// Starts the manager and the servers. Fails if another `surge run` holds the directory.
    pub fn start(opts: &EmbeddedOptions, surge: &Path) -> anyhow::Result<Embedded> {
        let fast = &opts.fast_dir;
        // The directory is checked (ours, 0700, no link) before anything in it is touched: a
        // squatted default would otherwise take our lock, keys and sockets (issue 31).
        surge_core::private_dir::ensure_all(fast).map_err(|e| {
            anyhow::anyhow!(
                "fast-tier directory: {e} (or set SURGE_FAST_DIR to a directory of your own)"
            )
        })?;
        surge_core::private_dir::ensure_all(&opts.state_dir)
            .map_err(|e| anyhow::anyhow!("state directory: {e} (or set SURGE_STATE_DIR)"))?;
        let logs = fast.join("logs");
        std::fs::create_dir_all(&logs)?;
        let lock = surge_core::private_dir::open_nofollow(&fast.join("lock"))?;
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a file we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            anyhow::bail!(
                "another `surge run` is using {} (set SURGE_FAST_DIR to run another job at the same \
                 time, or start a manager and set SURGE_MANAGER)",
                fast.display()
            );
        }
        let run = fast.join("run");
        let _ = std::fs::remove_dir_all(&run);
        std::fs::create_dir_all(&run)?;
        let key_file = run.join("surge.key");
        surge_auth::Key::create(&key_file)?;
        let (munge_socket, munged) = munge(&run.join("munge"))?;
        // This process's own calls to the manager (and the job's, through its environment).
        surge_api::use_munge_socket(munge_socket.clone());

        // Manager.
        let mlog = logs.join("manager.log");
        let mready = run.join("manager.ready");
        let mut cmd = Command::new(surge);
        cmd.args([
            "manager",
            "--listen",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
        ])
        .arg("--state")
        .arg(opts.state_dir.join("manager.db"))
        .arg("--granularity")
        .arg(opts.granularity.to_string())
        .arg("--ready-file")
        .arg(&mready)
        .arg("--key-file")
        .arg(&key_file)
        .arg("--munge-socket")
        .arg(&munge_socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&mlog)?);
        child_setup(&mut cmd, true);
        let mut mchild = cmd.spawn().context("cannot start surge manager")?;
        let ready = wait_ready(&mready, &mut mchild, "surge manager", &mlog)?;
        let manager = ready["grpc"].as_str().unwrap_or_default().to_string();
        let http = ready["http"].as_str().map(str::to_string);

        let mut emb = Embedded {
            manager: manager.clone(),
            http,
            fast_dir: fast.clone(),
            servers: opts.servers,
            munge_socket: munge_socket.clone(),
            key_file: key_file.clone(),
            manager_child: Some(mchild),
            server_children: Vec::new(),
            munged,
            _lock: lock,
        };

        // Servers.
        let capacity = match opts.server_capacity {
            Some(c) => c,
            None => {
                let per = surge_core::sys::free_space(fast)
                    .with_context(|| format!("statvfs {}", fast.display()))?
                    / 10
                    * 8
                    / opts.servers.max(1) as u64;
                (per / opts.granularity * opts.granularity).max(opts.granularity)
            }
        };
        for i in 0..opts.servers {
            let log = logs.join(format!("server-{i}.log"));
            let ready = run.join(format!("server-{i}.ready"));
            let mut cmd = Command::new(surge);
            cmd.arg("server")
                .arg("--device")
                .arg(fast.join(format!("bb{i}")))
                .arg("--unix")
                .arg(fast.join(format!("bb{i}.sock")))
                .args([
                    "--listen",
                    "127.0.0.1:0",
                    "--capacity",
                    &capacity.to_string(),
                ])
                .args(["--manager", &manager])
                .arg("--key-file")
                .arg(&key_file)
                .env(surge_auth::munge::SOCKET_ENV, &munge_socket)
                .arg("--ready-file")
                .arg(&ready)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(File::create(&log)?);
            child_setup(&mut cmd, true);
            let mut child = cmd.spawn().context("cannot start surge server")?;
            let res = wait_ready(&ready, &mut child, &format!("surge server {i}"), &log);
            emb.server_children.push(child);
            res?;
        }
        registrations(&manager, &munge_socket, opts, &logs);
        Ok(emb)
    }

    /// The process ids of the servers, in the order started.
    pub fn server_pids(&self) -> Vec<u32> {
        self.server_children.iter().map(Child::id).collect()
    }

    /// Stops servers then the manager (SIGTERM, then SIGKILL after a grace period).
    pub fn stop(mut self) {
        let grace = Duration::from_secs(10);
        let mut all: Vec<Child> = self.server_children.drain(..).collect();
        for c in &all {
            // SAFETY: signalling our own children.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        }
        reap(&mut all, grace);
        if let Some(m) = self.manager_child.take() {
            let mut m = vec![m];
            // SAFETY: as above.
            unsafe { libc::kill(m[0].id() as i32, libc::SIGTERM) };
            reap(&mut m, grace);
        }
        drop(self.munged.take());
    }
}

/// A server says it is ready before it has registered with the manager: waits for the
/// registrations, so a job's first allocation finds every server. Peaks measured for this fast
/// tier before (crate::calibrate) are registered then, so `#SURGE jobdw` targets are sized
/// from them without measuring again. What fails is logged: the run goes on.
fn registrations(manager: &str, munge_socket: &Path, opts: &EmbeddedOptions, logs: &Path) {
    let registered = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .and_then(|rt| {
            rt.block_on(async {
                let mut c = surge_api::connect_with(manager, munge_socket.to_path_buf()).await?;
                let up = crate::calibrate::wait_servers(&mut c, opts.servers)
                    .await?
                    .2;
                if up.len() < opts.servers {
                    tracing::warn!(
                        "{} of {} servers registered with the manager (see {})",
                        up.len(),
                        opts.servers,
                        logs.display()
                    );
                }
                let cached = crate::calibrate::EmbeddedPeaks::load(&opts.state_dir)
                    .is_some_and(|c| c.matches(opts));
                if cached {
                    crate::calibrate::register_embedded(&mut c, opts).await?;
                }
                anyhow::Ok(())
            })
        });
    if let Err(e) = registered {
        tracing::warn!(
            "the servers' registrations or the peaks kept in {}: {e:#}",
            crate::calibrate::EmbeddedPeaks::path(&opts.state_dir).display()
        );
    }
}

fn reap(children: &mut [Child], grace: Duration) {
    let start = Instant::now();
    for c in children.iter_mut() {
        loop {
            match c.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if start.elapsed() > grace => {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        for c in self
            .server_children
            .iter_mut()
            .chain(self.manager_child.iter_mut())
        {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
