//! Test harness of the end-to-end tests: the shared test kit (`surge-testkit`) with this
//! crate's `surge` binary: real `surge server` processes on loopback, real instances, real FUSE
//! mounts. Each test gets its own servers (port 0) and directories, so tests run in parallel.

#![allow(dead_code, unused_imports)]

pub mod wire;

pub use surge_testkit::procs::{Mount, Server};
pub use surge_testkit::{
    fuse_unavailable, seed, skip_without_fuse, wait_for, ChildGuard, Rng, Scratch,
};

pub const SURGE: &str = env!("CARGO_BIN_EXE_surge");

pub type Cluster = surge_testkit::procs::Cluster;

/// `n` servers of this crate's binary, each offering `capacity_each`.
pub fn cluster(n: usize, capacity_each: &str) -> Cluster {
    Cluster::start(std::path::Path::new(SURGE), n, capacity_each)
}

/// A `surge` command with the test process's cluster key and munged (for tests that start a
/// manager of their own).
pub fn surge_command() -> std::process::Command {
    surge_testkit::surge_command(std::path::Path::new(SURGE))
}

/// Runs `surge ARGS`, panicking with its output if it fails; returns stdout.
pub fn surge(args: &[&str]) -> String {
    surge_testkit::procs::run(std::path::Path::new(SURGE), args)
}
