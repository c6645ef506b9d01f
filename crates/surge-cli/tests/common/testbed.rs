//! The many-host test bed of `contrib/slurm/testbed.sh` (network namespaces, Slurm, munged,
//! Surge's daemons) from a test: commands with its environment, and a guard that takes it
//! down when the test ends, failed or not.

use std::path::{Path, PathBuf};
use std::process::Command;

pub const TB: &str = "/run/surge-tb";
pub const USER: &str = "sgbbuser";

pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/slurm/testbed.sh")
}

/// A command with the test bed's environment (the system munged, not the test kit's).
pub fn cmd(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(program);
    c.env_remove("SURGE_MUNGE_SOCKET")
        .env_remove("SURGE_KEY_FILE")
        .env("SURGE", super::SURGE)
        .env("SLURM_CONF", format!("{TB}/etc/slurm.conf"))
        // The test bed's CA (and the submit host's certificate): its hosts speak TLS.
        .env("SURGE_TLS_DIR", tls_dir());
    c
}

/// The submit host's TLS directory (the test bed's CA): what its clients are given.
pub fn tls_dir() -> String {
    format!("{TB}/etc/tls/ctl")
}

/// Makes this test process's own clients of the test bed (`surge_api::connect`) use its CA,
/// as its commands do; call before the first connection (the setting is read once).
pub fn use_tls_here() {
    std::env::set_var("SURGE_TLS_DIR", tls_dir());
}

/// `bash -c SCRIPT`: whether it succeeded, and what it printed.
pub fn sh(script: &str) -> (bool, String) {
    let out = cmd("bash").args(["-c", script]).output().expect("bash");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `bash -c SCRIPT`, which must succeed; what it printed.
pub fn ok(script: &str) -> String {
    let (good, out) = sh(script);
    assert!(good, "`{script}` failed:\n{out}");
    out
}

/// Why the test bed cannot run here, if it cannot.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (network namespaces, slurmd and agents need root)".into());
    }
    if let Some(why) = super::fuse_unavailable() {
        return Some(why);
    }
    let probe = "surge-tb-probe";
    let (good, out) = sh(&format!("ip netns add {probe} && ip netns del {probe}"));
    if !good {
        return Some(format!("cannot create network namespaces: {out}"));
    }
    None
}

/// Panics unless the test bed can run, or returns true when the run says it may be skipped
/// (`SURGE_SKIP_SLURM=1`, and then says so).
pub fn skip(test: &str) -> bool {
    let Some(why) = unavailable() else {
        return false;
    };
    if std::env::var("SURGE_SKIP_SLURM").is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED {test}: the Slurm test bed needs {why} (SURGE_SKIP_SLURM=1)");
        return true;
    }
    panic!("{test}: the Slurm test bed needs {why}; set SURGE_SKIP_SLURM=1 to skip it");
}

/// The test bed, brought down (also when the test fails) so nothing stays behind.
pub struct Bed;

impl Drop for Bed {
    fn drop(&mut self) {
        if std::env::var("SURGE_KEEP_TESTBED").is_ok_and(|v| v == "1") {
            eprintln!("SURGE_KEEP_TESTBED=1: the test bed stays up");
            return;
        }
        let (_, out) = sh(&format!("{} down", script().display()));
        eprintln!("{out}");
    }
}
