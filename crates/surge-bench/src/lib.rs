//! `surge bench`: IOR- and mdtest-style microbenchmarks of any path (a Surge mount, the PFS, a
//! local disk, `/dev/shm`), concurrency sweeps, and the calibrated peaks that `surge profile`,
//! `surge advise` and performance-target allocation read (Daley et al. §3.1.1, §4.1).
//!
//! Layers, bottom up:
//! - [`backend`]: the storage seam (IOR's aiori): a POSIX backend now, a native Surge one later.
//! - [`layout`], [`ior`], [`mdtest`]: what one process does in one phase; pure arithmetic plus a
//!   plain I/O loop over preallocated buffers.
//! - [`workers`]: separate processes behind a barrier, reporting their own clocks.
//! - [`mpiio`]: the MPI-IO backend of `io` (IOR's aiori-MPIIO): MPI ranks under mpirun.
//! - [`run`]: one benchmark end to end (checks, directories, repetitions, cleanup).
//! - [`sweep`], [`calibrate`]: many runs over process counts; curves, plots, peaks.
//! - [`report`], [`plot`]: text tables, CSV and SVG.
//! - [`cli`]: the `surge bench` verbs.

pub mod backend;
pub mod buffer;
pub mod calibrate;
pub mod cleanup;
pub mod cli;
pub mod clock;
pub mod compare;
pub mod histogram;
pub mod ior;
pub mod layout;
pub mod mdtest;
pub mod mpiio;
pub mod plot;
pub mod progress;
pub mod report;
pub mod result;
pub mod run;
pub mod sweep;
pub mod workers;

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// An operation on a file failed; `op` says which and where ("write at offset 4096 of").
    #[error("{op} {path}: {source}")]
    Io {
        op: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid parameters: {0}")]
    Params(String),
    #[error("{0}")]
    Setup(String),
    #[error(
        "{path} ({fs_type}) refuses O_DIRECT (EINVAL): tmpfs before Linux 6.6 and many FUSE \
         file systems do not support it; run without --direct (add --drop-cache to keep reads \
         out of the page cache where the file system allows it)"
    )]
    DirectUnsupported { path: String, fs_type: String },
    #[error("worker process {rank}: {message}")]
    Worker { rank: u32, message: String },
}

/// This machine's host name, for reports and run-directory names.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}
