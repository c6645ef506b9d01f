//! Test harness: real `surge server` processes on loopback, real instances, real FUSE mounts.
//! Each test gets its own servers (port 0) and directories, so tests run in parallel.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const SURGE: &str = env!("CARGO_BIN_EXE_surge");

/// Why FUSE tests cannot run here, if they cannot.
pub fn fuse_unavailable() -> Option<String> {
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse does not exist".into());
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root && Command::new("fusermount3").arg("-V").output().is_err() {
        return Some("not root and fusermount3 is not installed".into());
    }
    None
}

/// Returns true (after printing why) when a FUSE test must be skipped.
pub fn skip_without_fuse(test: &str) -> bool {
    match fuse_unavailable() {
        Some(why) => {
            eprintln!("SKIPPED {test}: needs FUSE: {why}");
            true
        }
        None => false,
    }
}

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

/// A scratch directory under /dev/shm (the fast tier) removed on drop.
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
        std::fs::create_dir_all(&p).unwrap();
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

pub struct Server {
    pub child: Option<Child>,
    pub device: PathBuf,
    pub addr: String,
    pub unix: PathBuf,
    pub capacity: String,
    pub log: PathBuf,
}

impl Server {
    fn spawn(
        device: &Path,
        unix: &Path,
        listen: &str,
        capacity: &str,
        log: &Path,
    ) -> (Child, String) {
        let ready = device.with_extension("ready");
        let _ = std::fs::remove_file(&ready);
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = Command::new(SURGE)
            .args(["server", "--device"])
            .arg(device)
            .args(["--capacity", capacity, "--listen", listen, "--unix"])
            .arg(unix)
            .arg("--ready-file")
            .arg(&ready)
            .stdout(Stdio::null())
            .stderr(logf)
            .spawn()
            .expect("start surge server");
        let addr = wait_for("server ready file", Duration::from_secs(20), || {
            let text = std::fs::read_to_string(&ready).ok()?;
            let v: serde_json::Value = serde_json::from_str(&text).ok()?;
            v["addrs"]
                .as_array()?
                .iter()
                .filter_map(|a| a.as_str())
                .find(|a| !a.starts_with("unix:"))
                .map(str::to_string)
        });
        (child, addr)
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Restarts on the same device and address.
    pub fn restart(&mut self) {
        self.kill9();
        let (child, addr) = Server::spawn(
            &self.device,
            &self.unix,
            &self.addr,
            &self.capacity,
            &self.log,
        );
        assert_eq!(addr, self.addr);
        self.child = Some(child);
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().ok().flatten().is_none(),
            None => false,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: sending SIGTERM to our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let start = Instant::now();
            while c.try_wait().ok().flatten().is_none() && start.elapsed() < Duration::from_secs(5)
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// N servers, each with its own fast-tier directory.
pub struct Cluster {
    pub scratch: Scratch,
    pub servers: Vec<Server>,
}

impl Cluster {
    pub fn start(n: usize, capacity_each: &str) -> Cluster {
        let scratch = Scratch::new("cluster");
        let servers = (0..n)
            .map(|i| {
                let device = scratch.path().join(format!("bb{i}"));
                let unix = scratch.path().join(format!("bb{i}.sock"));
                let log = scratch.path().join(format!("bb{i}.log"));
                let (child, addr) =
                    Server::spawn(&device, &unix, "127.0.0.1:0", capacity_each, &log);
                Server {
                    child: Some(child),
                    device,
                    addr,
                    unix,
                    capacity: capacity_each.to_string(),
                    log,
                }
            })
            .collect();
        Cluster { scratch, servers }
    }

    pub fn addrs(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.addr.clone()).collect()
    }

    /// Creates an instance over all servers; returns its id.
    pub fn create_instance(&self, capacity: &str, stripe: &str, extra: &[&str]) -> u64 {
        let out = surge(
            &[
                &[
                    "instance",
                    "create",
                    "--servers",
                    &self.addrs().join(","),
                    "--capacity",
                    capacity,
                    "--stripe-size",
                    stripe,
                    "--json",
                ][..],
                extra,
            ]
            .concat(),
        );
        let v: serde_json::Value = serde_json::from_str(&out).expect("descriptor JSON");
        v["instance"].as_u64().expect("instance id")
    }

    pub fn server_logs(&self) -> String {
        self.servers
            .iter()
            .map(|s| std::fs::read_to_string(&s.log).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Runs `surge ARGS`, panicking with its output if it fails; returns stdout.
pub fn surge(args: &[&str]) -> String {
    let out = Command::new(SURGE).args(args).output().expect("run surge");
    assert!(
        out.status.success(),
        "surge {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// A FUSE mount of one namespace, unmounted on drop.
pub struct Mount {
    pub child: Option<Child>,
    pub dir: PathBuf,
    _scratch: Scratch,
}

impl Mount {
    pub fn new(cluster: &Cluster, instance: u64, ns: u32) -> Mount {
        Self::with_args(cluster, instance, ns, &[])
    }

    pub fn with_args(cluster: &Cluster, instance: u64, ns: u32, extra: &[&str]) -> Mount {
        let scratch = Scratch::new("mnt");
        let dir = scratch.path().join("m");
        std::fs::create_dir_all(&dir).unwrap();
        let ready = scratch.path().join("ready");
        let log = std::fs::File::create(scratch.path().join("mount.log")).unwrap();
        let child = Command::new(SURGE)
            .args([
                "mount",
                "--server",
                &cluster.servers[0].addr,
                "--instance",
                &instance.to_string(),
                "--ns",
                &ns.to_string(),
                "--ready-file",
            ])
            .arg(&ready)
            .args(extra)
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start surge mount");
        let mut m = Mount {
            child: Some(child),
            dir,
            _scratch: scratch,
        };
        let ok = {
            let start = Instant::now();
            loop {
                if ready.exists() {
                    break true;
                }
                if let Some(c) = m.child.as_mut() {
                    if c.try_wait().ok().flatten().is_some() {
                        break false;
                    }
                }
                if start.elapsed() > Duration::from_secs(20) {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        if !ok {
            let log =
                std::fs::read_to_string(m._scratch.path().join("mount.log")).unwrap_or_default();
            panic!("mount did not come up:\n{log}");
        }
        m
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self._scratch.path().join("mount.log")).unwrap_or_default()
    }

    pub fn unmount(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let start = Instant::now();
            while c.try_wait().ok().flatten().is_none() && start.elapsed() < Duration::from_secs(10)
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            if c.try_wait().ok().flatten().is_none() {
                let _ = c.kill();
                let _ = c.wait();
                let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
            }
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.unmount();
    }
}

/// Deterministic pseudo-random numbers (xorshift) so a failing run can be replayed by seed.
pub struct Rng(pub u64);

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
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
