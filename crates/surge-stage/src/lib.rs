//! Surge's staging engine: copies files and directory trees between the parallel file system
//! (any POSIX directory) and an instance, in both directions, through the native client API
//! (never through FUSE).
//!
//! - [`plan()`] scans the sources (the PFS for a stage-in, the instance for a stage-out) and fails,
//!   naming the path, before anything is copied when a source is missing or of the wrong kind.
//! - [`check_fits`] refuses a stage-in larger than the instance's free capacity.
//! - [`execute`] copies: many files in flight, large files cut into chunks written in parallel
//!   at their offsets, modes, owners (on request), atimes, mtimes and symlinks preserved. Each
//!   file is written under a temporary name in its destination directory and renamed onto its
//!   final name only once data, size and attributes are complete, so an interrupted stage never
//!   leaves a half-written file that looks complete; the next stage over the same destination
//!   removes the temporaries. A failed file does not stop the others: the report lists it.
//! - [`verify`] compares the files of a plan with their copies (xxh3 per chunk).
//! - [`Progress`] is a set of counters a caller polls; [`ProgressRenderer`] draws them on a
//!   terminal (a live bar) or as one log line per second.
//! - [`ns`] resolves and lists instance paths over the native client.
//! - [`cli`] is `surge stage` (today `surge stage copy`, the direct copy for admins and
//!   benchmarks).
//!
//! What to copy (expanding `$DW_*` variables, reading `type=list` files) is the caller's job:
//! this crate receives plain [`StageItem`]s.

pub mod cache_task;
pub mod cli;
mod copy;
pub mod drain;
pub mod fill;
pub mod job;
pub mod merge;
mod names;
pub mod ns;
mod pfs;
mod plan;
mod progress;
mod verify;
pub mod worker;

pub use copy::{check_fits, execute};
pub use names::{is_temp_name, TEMP_PREFIX};
pub use plan::{plan, Plan};
pub use progress::{summary_line, Progress, ProgressRenderer, ProgressSnapshot};
pub use verify::verify;

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use surge_client::ClientError;

/// Which way a stage copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// PFS -> instance (stage-in).
    In,
    /// Instance -> PFS (stage-out).
    Out,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::In => "in",
            Direction::Out => "out",
        }
    }
}

impl From<surge_core::directives::StageDirection> for Direction {
    fn from(d: surge_core::directives::StageDirection) -> Direction {
        match d {
            surge_core::directives::StageDirection::In => Direction::In,
            surge_core::directives::StageDirection::Out => Direction::Out,
        }
    }
}

/// What a [`StageItem`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemKind {
    File,
    Directory,
    /// Rabbit's `copy_in`/`copy_out` (no type): a `Directory` when the source is one, else a
    /// `File`, whose destination is taken as a directory to copy into when it ends with `/`
    /// (or is an existing directory on the PFS).
    Any,
}

/// One thing to copy. `pfs` is a path on the POSIX file system (absolute; a relative path is
/// taken from the current directory); `instance_path` is a path inside the instance namespace,
/// absolute from its root (`/input/a.dat`; `/` is the root).
///
/// - `File`: the exact destination file path (its parent directories are created).
/// - `Directory`: the *contents* of the source go into the destination directory (created with
///   its parents), as DataWarp's `type=directory`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageItem {
    pub kind: ItemKind,
    pub pfs: PathBuf,
    pub instance_path: String,
}

/// How to copy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageOptions {
    /// Files in flight, and chunks of large files in flight (default 32).
    pub workers: usize,
    /// Files larger than this are cut into chunks of this size, copied in parallel (default
    /// 8 MiB, the default stripe size, so that one chunk is one request to one fragment).
    pub chunk_size: u64,
    /// After copying a file, read the copy back and compare it with the source (xxh3 per
    /// chunk) before giving it its final name.
    pub checksum: bool,
    /// Give copies the owner (uid, gid) of their source (needs root on the PFS side).
    pub preserve_owner: bool,
    /// Owner of the copies when `preserve_owner` is off. `None`: on the instance, the calling
    /// process's user; on the PFS, whoever the process is (no chown).
    pub owner: Option<(u32, u32)>,
    /// Stage-out: flush the destination file system (`syncfs`) before reporting success, so
    /// that the instance can be destroyed safely.
    pub sync: bool,
}

impl Default for StageOptions {
    fn default() -> StageOptions {
        StageOptions {
            workers: 32,
            chunk_size: 8 << 20,
            checksum: false,
            preserve_owner: false,
            owner: None,
            sync: true,
        }
    }
}

/// A file (or directory, or symlink) that could not be copied, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageFailure {
    /// The source path (on the PFS for a stage-in, in the instance for a stage-out).
    pub path: String,
    /// Where it was going.
    pub destination: String,
    pub error: String,
}

/// What a stage did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageReport {
    /// Files copied completely (data, size, attributes, final name).
    pub files: u64,
    /// Bytes of those files.
    pub bytes: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub seconds: f64,
    /// What failed, the first [`MAX_FAILURES`] of it (each text bounded); empty on success.
    /// A caller exits non-zero when it is not.
    pub failures: Vec<StageFailure>,
    /// Failures past the first [`MAX_FAILURES`], counted, not listed: a report stays small
    /// however much failed (a 10,000-level tree made a 288 MB one, issue 31).
    #[serde(default)]
    pub failures_more: u64,
    /// Sources that are neither file, directory nor symlink (FIFOs, sockets, devices), left
    /// out by the plan.
    pub skipped: Vec<StageFailure>,
    /// Temporaries of an earlier, interrupted stage removed from the destination.
    pub stale_temps_removed: u64,
    /// Every file copied was read back and compared with its source.
    pub checksummed: bool,
}

impl StageReport {
    /// Throughput over the whole stage, in MiB/s.
    pub fn mib_per_s(&self) -> f64 {
        if self.seconds <= 0.0 {
            return 0.0;
        }
        self.bytes as f64 / 1048576.0 / self.seconds
    }

    pub fn ok(&self) -> bool {
        self.failures.is_empty() && self.failures_more == 0
    }

    /// Every failure, listed or counted.
    pub fn failed(&self) -> u64 {
        self.failures.len() as u64 + self.failures_more
    }

    /// Records a failure: listed while fewer than [`MAX_FAILURES`] are, counted after; its
    /// texts cut to [`MAX_FAILURE_TEXT`] bytes.
    pub fn push_failure(&mut self, f: StageFailure) {
        push_failure(&mut self.failures, &mut self.failures_more, f);
    }
}

/// Failures a report lists (the rest are counted).
pub const MAX_FAILURES: usize = 100;
/// Bytes of a failure's path, destination or error as a report keeps them.
pub const MAX_FAILURE_TEXT: usize = 1024;

/// [`StageReport::push_failure`] on a list and its overflow count.
pub fn push_failure(list: &mut Vec<StageFailure>, more: &mut u64, f: StageFailure) {
    if list.len() >= MAX_FAILURES {
        *more += 1;
        return;
    }
    use surge_core::limits::bounded;
    list.push(StageFailure {
        path: bounded(&f.path, MAX_FAILURE_TEXT),
        destination: bounded(&f.destination, MAX_FAILURE_TEXT),
        error: bounded(&f.error, MAX_FAILURE_TEXT),
    });
}

/// Why a stage could not be planned or run at all (per-file problems are [`StageFailure`]s).
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("source {path} does not exist")]
    Missing { path: String },
    #[error("source {path} is {found}, but the item is type={expected}{hint}")]
    WrongKind {
        path: String,
        found: &'static str,
        expected: &'static str,
        hint: &'static str,
    },
    #[error("{path}: {message}")]
    BadPath { path: String, message: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("instance path {path}: {source}")]
    Instance {
        path: String,
        #[source]
        source: ClientError,
    },
    #[error(
        "the stage-in needs {} ({} of data) but instance {instance} has {} free of {}",
        surge_core::format_bytes(*needed),
        surge_core::format_bytes(*bytes),
        surge_core::format_bytes(*free),
        surge_core::format_bytes(*capacity)
    )]
    NoSpace {
        instance: u64,
        bytes: u64,
        needed: u64,
        free: u64,
        capacity: u64,
    },
    #[error("the stage was cancelled")]
    Cancelled,
}
