//! `surge server` and `surge mount` processes of the binary a test names (`CARGO_BIN_EXE_surge`
//! in the `surge-cli` tests), on loopback with port 0, each test with its own directories.

use crate::{wait_for, Scratch};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    pub child: Option<Child>,
    pub bin: PathBuf,
    pub device: PathBuf,
    pub addr: String,
    pub unix: PathBuf,
    pub capacity: String,
    pub log: PathBuf,
    /// Extra arguments of `surge server`.
    pub extra: Vec<String>,
}

impl Server {
    fn spawn(&self, listen: &str) -> (Child, String) {
        let ready = self.device.with_extension("ready");
        let _ = std::fs::remove_file(&ready);
        let logf = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("server log");
        let child = Command::new(&self.bin)
            .env("SURGE_KEY_FILE", crate::key_file())
            .args(["server", "--device"])
            .arg(&self.device)
            .args(["--capacity", &self.capacity, "--listen", listen, "--unix"])
            .arg(&self.unix)
            .arg("--ready-file")
            .arg(&ready)
            .args(&self.extra)
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
        let (child, addr) = self.spawn(&self.addr.clone());
        assert_eq!(addr, self.addr);
        self.child = Some(child);
    }

    /// Restarts on the same device, elsewhere: another TCP port and another Unix socket (a
    /// server moved, as after a restart on another address); `addr` and `unix` follow.
    pub fn restart_elsewhere(&mut self) {
        self.kill9();
        let _ = std::fs::remove_file(&self.unix);
        self.unix = self.unix.with_extension("moved.sock");
        let (child, addr) = self.spawn("127.0.0.1:0");
        assert_ne!(addr, self.addr, "the server came back on its old address");
        self.addr = addr;
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
    pub bin: PathBuf,
    pub scratch: Scratch,
    pub servers: Vec<Server>,
}

impl Cluster {
    pub fn start(bin: &Path, n: usize, capacity_each: &str) -> Cluster {
        Cluster::start_with(bin, n, capacity_each, &[])
    }

    /// With extra arguments for every `surge server`.
    pub fn start_with(bin: &Path, n: usize, capacity_each: &str, extra: &[&str]) -> Cluster {
        let scratch = Scratch::new("cluster");
        let devices: Vec<PathBuf> = (0..n)
            .map(|i| scratch.path().join(format!("bb{i}")))
            .collect();
        Cluster::start_on(bin, scratch, &devices, capacity_each, extra)
    }

    /// One server per directory of `devices` (e.g. on a file system of a chosen size).
    pub fn start_on(
        bin: &Path,
        scratch: Scratch,
        devices: &[PathBuf],
        capacity_each: &str,
        extra: &[&str],
    ) -> Cluster {
        let servers = devices
            .iter()
            .enumerate()
            .map(|(i, device)| {
                let mut s = Server {
                    child: None,
                    bin: bin.to_path_buf(),
                    device: device.clone(),
                    addr: String::new(),
                    unix: scratch.path().join(format!("bb{i}.sock")),
                    capacity: capacity_each.to_string(),
                    log: scratch.path().join(format!("bb{i}.log")),
                    extra: extra.iter().map(|s| s.to_string()).collect(),
                };
                let (child, addr) = s.spawn("127.0.0.1:0");
                s.child = Some(child);
                s.addr = addr;
                s
            })
            .collect();
        Cluster {
            bin: bin.to_path_buf(),
            scratch,
            servers,
        }
    }

    pub fn addrs(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.addr.clone()).collect()
    }

    /// Creates an instance over all servers; returns its id.
    pub fn create_instance(&self, capacity: &str, stripe: &str, extra: &[&str]) -> u64 {
        let out = run(
            &self.bin,
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

/// Runs `BIN ARGS`, panicking with its output if it fails; returns stdout.
pub fn run(bin: &Path, args: &[&str]) -> String {
    let out = crate::surge_command(bin)
        .env_remove("SURGE_MANAGER")
        .args(args)
        .output()
        .expect("run surge");
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
    scratch: Scratch,
    /// Request-count dumps read so far (see [`Mount::requests`]).
    dumps: std::cell::Cell<u64>,
}

impl Mount {
    pub fn new(cluster: &Cluster, instance: u64, ns: u32) -> Mount {
        Self::with_args(cluster, instance, ns, &[])
    }

    pub fn with_args(cluster: &Cluster, instance: u64, ns: u32, extra: &[&str]) -> Mount {
        let scratch = Scratch::new("mnt");
        let dir = scratch.path().join("m");
        std::fs::create_dir_all(&dir).expect("mount point");
        let ready = scratch.path().join("ready");
        let log = std::fs::File::create(scratch.path().join("mount.log")).expect("mount log");
        // A mount told of a manager asks it as its user (MUNGE): the test's munged.
        let mut cmd = if extra.contains(&"--manager") {
            crate::surge_command(&cluster.bin)
        } else {
            Command::new(&cluster.bin)
        };
        let child = cmd
            .env("SURGE_KEY_FILE", crate::key_file())
            .env_remove("SURGE_MANAGER")
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
            .arg("--stats-file")
            .arg(scratch.path().join("stats.json"))
            .args(extra)
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start surge mount");
        let mut m = Mount {
            child: Some(child),
            dir,
            scratch,
            dumps: std::cell::Cell::new(0),
        };
        let start = Instant::now();
        let ok = loop {
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
        };
        if !ok {
            panic!("mount did not come up:\n{}", m.log());
        }
        m
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.scratch.path().join("mount.log")).unwrap_or_default()
    }

    /// The requests this mount has sent to its servers so far, per operation (`surge mount
    /// --stats-file`, dumped on SIGUSR1): what its caches saved, counted.
    pub fn requests(&self) -> std::collections::BTreeMap<String, u64> {
        self.stats()["requests"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, n)| (k.clone(), n.as_u64().unwrap_or(0)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The mount's FUSE transport and the kernel requests it served on each path
    /// (`{"transport": "io_uring"|"dev_fuse", "uring_requests": n, "dev_fuse_requests": n,
    /// ...}`), dumped on SIGUSR1 like [`Mount::requests`].
    pub fn fuse_stats(&self) -> serde_json::Value {
        self.stats()["fuse"].clone()
    }

    /// The operations the mount answered with an error, per operation and errno
    /// (`{"lookup": {"ENOENT": n}, ...}`), dumped on SIGUSR1 like [`Mount::requests`].
    pub fn failures(&self) -> serde_json::Value {
        self.stats()["failures"].clone()
    }

    /// A fresh dump of the mount's `--stats-file`.
    fn stats(&self) -> serde_json::Value {
        let child = self.child.as_ref().expect("the mount is running");
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
        let file = self.scratch.path().join("stats.json");
        let want = self.dumps.get() + 1;
        let v = wait_for(
            "the mount's request counts",
            Duration::from_secs(10),
            || {
                let v: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(&file).ok()?).ok()?;
                (v["dumps"].as_u64()? >= want).then_some(v)
            },
        );
        self.dumps.set(v["dumps"].as_u64().unwrap_or(want));
        v
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
            }
        }
        // A mount process that ended without unmounting (seen after its servers were killed
        // and restarted, or killed by the test itself, which then took `child`) leaves a dead
        // mount behind: detach it.
        let dir = self.dir.display().to_string();
        let mounted = std::fs::read_to_string("/proc/self/mountinfo")
            .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(4) == Some(dir.as_str())));
        if mounted {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.unmount();
    }
}
