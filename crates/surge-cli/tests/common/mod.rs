//! Test harness of the end-to-end tests: the shared test kit (`surge-testkit`) with this
//! crate's `surge` binary: real `surge server` processes on loopback, real instances, real FUSE
//! mounts. Each test gets its own servers (port 0) and directories, so tests run in parallel.

#![allow(dead_code, unused_imports)]

pub mod testbed;
pub mod wire;

pub use surge_testkit::procs::{Mount, Server};
pub use surge_testkit::{
    check, fuse_unavailable, holds_for, request_queued_at, seed, skip_without, skip_without_fuse,
    skip_without_root, system_user, wait_for, ChildGuard, Rng, Scratch,
};

pub const SURGE: &str = env!("CARGO_BIN_EXE_surge");

pub type Cluster = surge_testkit::procs::Cluster;

/// `n` servers of this crate's binary, each offering `capacity_each`.
pub fn cluster(n: usize, capacity_each: &str) -> Cluster {
    Cluster::start(std::path::Path::new(SURGE), n, capacity_each)
}

/// The size and the free bytes of the file system at `p`, as `df` shows them.
pub fn statvfs(p: &std::path::Path) -> (u64, u64) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out-parameter.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    (st.f_blocks * st.f_frsize, st.f_bfree * st.f_frsize)
}

/// Bytes of the file system at `dir` in use, as `df` shows them.
pub fn used_bytes(dir: &std::path::Path) -> u64 {
    let (size, free) = statvfs(dir);
    size - free
}

/// Makes file `path` of `len` patterned bytes, synced, then removes its name: the file stays
/// open as the returned handle, with its bytes.
pub fn unlinked_open_file(path: &std::path::Path, len: usize) -> (std::fs::File, Vec<u8>) {
    use std::os::unix::fs::FileExt;
    let body: Vec<u8> = (0..len).map(|i| (i % 241) as u8).collect();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .unwrap();
    f.write_all_at(&body, 0).unwrap();
    f.sync_all().unwrap();
    std::fs::remove_file(path).unwrap();
    (f, body)
}

/// A `surge` command with the test process's cluster key and munged (for tests that start a
/// manager of their own).
pub fn surge_command() -> std::process::Command {
    surge_testkit::surge_command(std::path::Path::new(SURGE))
}

/// A `surge manager` of a test: gRPC and HTTP on loopback, 64 MiB granularity, liveness checks
/// every 0.2 s, its state in `dir/m.db`, its log in `dir/manager.log`. Killed when dropped.
pub struct Manager {
    pub child: ChildGuard,
    pub grpc: String,
    pub http: String,
}

impl Manager {
    pub fn start(dir: &std::path::Path) -> Manager {
        Manager::start_with(dir, &[])
    }

    /// [`Manager::start`] with more options.
    pub fn start_with(dir: &std::path::Path, extra: &[&str]) -> Manager {
        Manager::start_env(dir, extra, &[])
    }

    /// [`Manager::start_with`] with more environment (e.g. `SURGE_FAILPOINTS`).
    pub fn start_env(dir: &std::path::Path, extra: &[&str], env: &[(&str, &str)]) -> Manager {
        let child = Manager::spawn(dir, extra, env);
        Manager::ready(dir, child)
    }

    /// Starts a manager without waiting for it to serve (a standby on etcd serves only once
    /// it leads); [`Manager::ready`] waits.
    pub fn spawn(dir: &std::path::Path, extra: &[&str], env: &[(&str, &str)]) -> ChildGuard {
        let ready = dir.join("m.ready");
        let _ = std::fs::remove_file(&ready);
        let mut cmd = surge_command();
        cmd.envs(env.iter().copied()).arg("manager");
        // Port 0 unless the test names the addresses (managers of one etcd, listed up front).
        if !extra.contains(&"--listen") {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        if !extra.contains(&"--http") {
            cmd.args(["--http", "127.0.0.1:0"]);
        }
        ChildGuard(
            cmd.args(["--granularity", "64MiB", "--liveness-interval", "0.2"])
                .args(["--reconcile-interval", "0.3"])
                .args(extra)
                .arg("--state")
                .arg(dir.join("m.db"))
                .arg("--ready-file")
                .arg(&ready)
                .stderr(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(dir.join("manager.log"))
                        .expect("manager log"),
                )
                .spawn()
                .expect("start surge manager"),
        )
    }

    /// Waits until the manager `child` (started by [`Manager::spawn`] in `dir`) serves.
    pub fn ready(dir: &std::path::Path, child: ChildGuard) -> Manager {
        let ready = dir.join("m.ready");
        let v: serde_json::Value = wait_for("manager", std::time::Duration::from_secs(30), || {
            serde_json::from_str(&std::fs::read_to_string(&ready).ok()?).ok()
        });
        Manager {
            child,
            grpc: v["grpc"].as_str().expect("grpc address").to_string(),
            http: v["http"].as_str().expect("http address").to_string(),
        }
    }

    /// Registers `cluster`'s servers with this manager.
    pub fn register(&self, cluster: &Cluster) {
        for srv in &cluster.servers {
            surge(&["server", "register", &srv.addr, "--manager", &self.grpc]);
        }
    }
}

/// Runs `surge ARGS`, panicking with its output if it fails; returns stdout.
pub fn surge(args: &[&str]) -> String {
    surge_testkit::procs::run(std::path::Path::new(SURGE), args)
}

/// A command's status, stdout and stderr, for assertion messages.
pub fn text(o: &std::process::Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A peaks file as `surge bench calibrate -o` writes it (an input here, not a measurement).
pub fn peaks_file(
    dir: &std::path::Path,
    name: &str,
    read_mib: f64,
    write_mib: f64,
    md: f64,
) -> std::path::PathBuf {
    const MIB: f64 = 1048576.0;
    let p = dir.join(name);
    std::fs::write(
        &p,
        serde_json::json!({
            "schema": "surge.peaks/1", "path": "/bb", "host": "test",
            "measured_at": "2026-01-01T00:00:00Z",
            "read_bw": read_mib * MIB, "write_bw": write_mib * MIB, "read_iops": 20000.0,
            "write_iops": 10000.0, "write_iops_fsync": 1000.0, "metadata_ops": md,
            "procs_at_peak": {"read_bw": 1, "write_bw": 1, "read_iops": 1, "write_iops": 1,
                              "metadata_ops": 1}
        })
        .to_string(),
    )
    .unwrap();
    p
}

/// A TCP connection to `addr` from loopback address `from` (e.g. 127.0.0.2).
pub fn connect_from(from: &str, addr: &str) -> std::net::TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let local: std::net::SocketAddr = format!("{from}:0").parse().unwrap();
    s.bind(&local.into()).unwrap();
    let remote: std::net::SocketAddr = addr.parse().unwrap();
    s.connect(&remote.into()).unwrap();
    let s: std::net::TcpStream = s.into();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    s
}

/// pjdfstest's configuration as the tests run it: the optional features Surge has, a short
/// nap between time checks, and two users of this machine for the ownership tests.
pub fn write_pjdfstest_conf(path: &std::path::Path) {
    std::fs::write(
        path,
        "[features]\nposix_fallocate = {}\nutime_now = {}\nutimensat = {}\n\
         [settings]\nnaptime = 0.01\n\
         [dummy_auth]\nentries = [ [\"nobody\", \"nogroup\"], [\"daemon\", \"daemon\"] ]\n",
    )
    .expect("pjdfstest configuration");
}
