//! The profile of one workflow stage: the raw, named per-file counters (Darshan-style) and the
//! processes that produced them, whatever the source (the shim, strace, Darshan). Everything in
//! Daley's tables is derived from this ([`crate::tables`]); nothing here interprets it.
//!
//! The JSON form (schema tag [`PROFILE_SCHEMA`]) is documented in `docs/PROFILE.md`.

use serde::{Deserialize, Serialize};

/// The schema tag written in every profile; bumped on incompatible changes.
pub const PROFILE_SCHEMA: &str = "surge.profile/1";

/// Darshan's transfer-size buckets: bucket i holds sizes above `HIST_EDGES[i-1]` up to and
/// including `HIST_EDGES[i]` (bucket 0 holds 0..=100; the last is open-ended).
pub const HIST_EDGES: [u64; 10] = [
    100,
    1024,
    10 * 1024,
    100 * 1024,
    1024 * 1024,
    4 * 1024 * 1024,
    10 * 1024 * 1024,
    100 * 1024 * 1024,
    1024 * 1024 * 1024,
    u64::MAX,
];

/// Human labels of [`HIST_EDGES`], as Darshan names them.
pub const HIST_LABELS: [&str; 10] = [
    "0-100", "100-1K", "1K-10K", "10K-100K", "100K-1M", "1M-4M", "4M-10M", "10M-100M", "100M-1G",
    "1G+",
];

/// Transfers up to this size are "small" (IOPS-bound), above it "large" (bandwidth-bound):
/// the edge of Darshan's 10K-100K bucket, between IOR's 4 KiB IOPS and 8 MiB bandwidth tests.
pub const SMALL_IO_BYTES: u64 = 100 * 1024;

/// Where a profile came from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// `surge profile -- CMD` with the LD_PRELOAD shim.
    #[default]
    Shim,
    /// An `strace -f -T -tt` log.
    Strace,
    /// A Darshan log (binary through PyDarshan or darshan-parser, or darshan-parser text).
    Darshan,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Source {
    pub kind: SourceKind,
    /// The command that was profiled, when known.
    #[serde(default)]
    pub command: Vec<String>,
    /// The imported file, for strace and Darshan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Exit code of the command (shim only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Signal that ended the command (shim only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// How the counters were obtained (e.g. "darshan-parser 3.5.0 text", "PyDarshan 3.5.0").
    #[serde(default)]
    pub detail: String,
}

/// What a path turned out to be.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    #[default]
    Unknown,
    Regular,
    Directory,
    CharDevice,
    BlockDevice,
    Fifo,
    Socket,
    Symlink,
    /// The path did not exist when it was looked up (failed stat/open: Python's import search).
    Missing,
}

impl FileKind {
    pub fn from_shim(code: u32) -> FileKind {
        match code {
            1 => FileKind::Regular,
            2 => FileKind::Directory,
            3 => FileKind::CharDevice,
            4 => FileKind::BlockDevice,
            5 => FileKind::Fifo,
            6 => FileKind::Socket,
            7 => FileKind::Symlink,
            8 => FileKind::Missing,
            _ => FileKind::Unknown,
        }
    }
}

/// Raw per-file counters. Names follow the shim's (`shim/surge_shim.h`); times are
/// nanoseconds, timestamps nanoseconds since the start of the profile (0 = never).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Counters {
    pub opens: u64,
    pub closes: u64,
    pub reads: u64,
    pub writes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub seeks: u64,
    pub stats: u64,
    pub syncs: u64,
    pub unlinks: u64,
    pub renames: u64,
    pub mkdirs: u64,
    pub rmdirs: u64,
    pub opendirs: u64,
    pub readdirs: u64,
    pub accesses: u64,
    pub meta_errors: u64,
    pub stdio_opens: u64,
    pub stdio_closes: u64,
    pub stdio_reads: u64,
    pub stdio_writes: u64,
    pub stdio_bytes_read: u64,
    pub stdio_bytes_written: u64,
    pub stdio_seeks: u64,
    pub stdio_flushes: u64,
    pub stdio_kernel_reads_est: u64,
    pub stdio_kernel_writes_est: u64,
    pub read_time_ns: u64,
    pub write_time_ns: u64,
    pub meta_time_ns: u64,
    pub sync_time_ns: u64,
    /// Time in data calls of at most [`SMALL_IO_BYTES`] (and syncs).
    pub small_data_time_ns: u64,
    pub large_data_time_ns: u64,
    pub first_ns: u64,
    pub last_ns: u64,
    pub first_read_ns: u64,
    pub first_write_ns: u64,
    /// One past the highest byte read / written.
    pub max_byte_read: u64,
    pub max_byte_written: u64,
    /// Largest size a stat or open reported, or the file had once the stage ended.
    pub size_seen: u64,
    /// Reads per size bucket ([`HIST_EDGES`]).
    pub hist_read: [u64; 10],
    pub hist_write: [u64; 10],
}

fn min_set(a: u64, b: u64) -> u64 {
    match (a, b) {
        (0, x) | (x, 0) => x,
        (x, y) => x.min(y),
    }
}

impl Counters {
    /// Adds another set of counters for the same file (another process, another record).
    pub fn merge(&mut self, o: &Counters) {
        macro_rules! sum {
            ($($f:ident),*) => { $( self.$f += o.$f; )* };
        }
        sum!(
            opens,
            closes,
            reads,
            writes,
            bytes_read,
            bytes_written,
            seeks,
            stats,
            syncs,
            unlinks,
            renames,
            mkdirs,
            rmdirs,
            opendirs,
            readdirs,
            accesses,
            meta_errors,
            stdio_opens,
            stdio_closes,
            stdio_reads,
            stdio_writes,
            stdio_bytes_read,
            stdio_bytes_written,
            stdio_seeks,
            stdio_flushes,
            stdio_kernel_reads_est,
            stdio_kernel_writes_est,
            read_time_ns,
            write_time_ns,
            meta_time_ns,
            sync_time_ns,
            small_data_time_ns,
            large_data_time_ns
        );
        self.first_ns = min_set(self.first_ns, o.first_ns);
        self.first_read_ns = min_set(self.first_read_ns, o.first_read_ns);
        self.first_write_ns = min_set(self.first_write_ns, o.first_write_ns);
        self.last_ns = self.last_ns.max(o.last_ns);
        self.max_byte_read = self.max_byte_read.max(o.max_byte_read);
        self.max_byte_written = self.max_byte_written.max(o.max_byte_written);
        self.size_seen = self.size_seen.max(o.size_seen);
        for i in 0..10 {
            self.hist_read[i] += o.hist_read[i];
            self.hist_write[i] += o.hist_write[i];
        }
    }

    /// Bytes moved through POSIX and stdio calls.
    pub fn bytes_read_total(&self) -> u64 {
        self.bytes_read + self.stdio_bytes_read
    }
    pub fn bytes_written_total(&self) -> u64 {
        self.bytes_written + self.stdio_bytes_written
    }
    pub fn bytes_total(&self) -> u64 {
        self.bytes_read_total() + self.bytes_written_total()
    }

    /// Read and write operations as the storage sees them: POSIX calls plus the kernel calls
    /// estimated for stdio (libc buffering, Daley §3.3).
    pub fn data_ops(&self) -> u64 {
        self.reads + self.writes + self.stdio_kernel_reads_est + self.stdio_kernel_writes_est
    }

    /// Metadata operations in Daley's sense (open/close/stat and namespace changes). Seeks
    /// never reach the storage and readdir calls are mostly served from a libc buffer, so
    /// neither counts; syncs are data-path operations.
    pub fn meta_ops(&self) -> u64 {
        self.opens
            + self.closes
            + self.stats
            + self.accesses
            + self.unlinks
            + self.renames
            + self.mkdirs
            + self.rmdirs
            + self.opendirs
            + self.stdio_opens
            + self.stdio_closes
    }

    pub fn data_time_ns(&self) -> u64 {
        self.read_time_ns + self.write_time_ns + self.sync_time_ns
    }

    /// Size estimate: the largest of what stat reported and the highest byte touched.
    pub fn size_estimate(&self) -> u64 {
        self.size_seen
            .max(self.max_byte_read)
            .max(self.max_byte_written)
    }
}

/// One file (path) over the whole stage.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FileStats {
    pub path: String,
    #[serde(default)]
    pub kind: FileKind,
    /// How many processes touched it (ExPBB's "shared access" when > 1).
    #[serde(default)]
    pub processes: u32,
    /// Whether the path existed once the stage ended (shim profiles only): tells outputs that
    /// were kept from temporaries that were deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exists_after: Option<bool>,
    pub counters: Counters,
}

impl FileStats {
    /// Whether the file is storage (what a burst buffer would hold): not a pipe, socket, tty,
    /// nor a kernel pseudo-file under /proc, /sys or /dev (except /dev/shm, a real tmpfs).
    pub fn is_storage(&self) -> bool {
        match self.kind {
            FileKind::Fifo | FileKind::Socket | FileKind::CharDevice | FileKind::BlockDevice => {
                return false
            }
            _ => {}
        }
        // Names the shim and Darshan give to non-files; other "<...>" paths are storage
        // (the shim's "<other files>", the "<workdir>" placeholders of sanitised logs).
        const PSEUDO: [&str; 7] = [
            "<STDIN>", "<STDOUT>", "<STDERR>", "<stdin>", "<stdout>", "<stderr>", "<fd ",
        ];
        if PSEUDO.iter().any(|p| self.path.starts_with(p))
            || self.path.starts_with("pipe:")
            || self.path.starts_with("socket:")
            || self.path.starts_with("anon_inode:")
        {
            return false;
        }
        if self.path.starts_with("/dev/shm/") {
            return true;
        }
        !(self.path.starts_with("/proc/")
            || self.path.starts_with("/sys/")
            || self.path.starts_with("/dev/"))
    }
}

/// How a process's record ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ending {
    /// Ran its exit handler.
    Exit,
    /// Replaced itself with exec (the new image has its own record).
    Exec,
    /// No exit handler ran: crashed, killed by a signal, or left with `_exit`. The counters are
    /// complete up to the last call; peak memory is unknown.
    #[default]
    Unknown,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Process {
    pub pid: i64,
    #[serde(default)]
    pub ppid: i64,
    #[serde(default)]
    pub exe: String,
    #[serde(default)]
    pub cmdline: String,
    /// Seconds since the start of the profile.
    #[serde(default)]
    pub start_s: f64,
    #[serde(default)]
    pub end_s: f64,
    #[serde(default)]
    pub ending: Ending,
    /// Most threads the process had alive at once (counted through pthread_create), when known.
    pub threads: u32,
    /// Distinct threads that made I/O calls.
    #[serde(default)]
    pub io_threads: u32,
    /// Peak resident memory (VmHWM), bytes; 0 when unknown.
    #[serde(default)]
    pub peak_rss_bytes: u64,
}

/// I/O over time, summed over processes, in bins of `bin_s` seconds from the profile start.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    pub bin_s: f64,
    pub bytes_read: Vec<u64>,
    pub bytes_written: Vec<u64>,
    pub data_ops: Vec<u64>,
    pub meta_ops: Vec<u64>,
}

/// A profile of one workflow stage.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub schema: String,
    pub stage: String,
    pub source: Source,
    #[serde(default)]
    pub host: String,
    /// RFC 3339 start time, when known.
    #[serde(default)]
    pub started_at: String,
    pub wall_time_s: f64,
    /// Peak memory of the largest descendant as the kernel reports it (getrusage), bytes.
    #[serde(default)]
    pub max_rss_children_bytes: u64,
    /// Path prefixes holding the user's scientific data (Daley's "user I/O", Table 3).
    #[serde(default)]
    pub data_paths: Vec<String>,
    pub processes: Vec<Process>,
    pub files: Vec<FileStats>,
    #[serde(default)]
    pub timeline: Timeline,
    /// What the source could not record, or had to estimate.
    #[serde(default)]
    pub caveats: Vec<String>,
}

impl Profile {
    pub fn new(stage: &str, source: Source) -> Profile {
        Profile {
            schema: PROFILE_SCHEMA.to_string(),
            stage: stage.to_string(),
            source,
            ..Profile::default()
        }
    }

    /// Whether a path is under one of the `--data-path` prefixes (whole path components).
    pub fn is_user_data(&self, path: &str) -> bool {
        self.data_paths.iter().any(|p| {
            let p = p.trim_end_matches('/');
            path == p || (path.starts_with(p) && path.as_bytes().get(p.len()) == Some(&b'/'))
        })
    }

    /// The totals of all storage files.
    pub fn storage_totals(&self) -> Counters {
        let mut t = Counters::default();
        for f in self.files.iter().filter(|f| f.is_storage()) {
            t.merge(&f.counters);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_path_matches_whole_components_only() {
        let mut p = Profile::new("s", Source::default());
        p.data_paths = vec!["/data/run1/".into()];
        assert!(p.is_user_data("/data/run1/a.fits"));
        assert!(p.is_user_data("/data/run1"));
        assert!(!p.is_user_data("/data/run10/a.fits"));
    }

    #[test]
    fn merge_sums_counts_and_keeps_extremes() {
        let mut a = Counters {
            opens: 2,
            first_ns: 50,
            last_ns: 70,
            size_seen: 10,
            ..Counters::default()
        };
        let b = Counters {
            opens: 3,
            first_ns: 20,
            last_ns: 60,
            size_seen: 30,
            ..Counters::default()
        };
        a.merge(&b);
        assert_eq!(
            (a.opens, a.first_ns, a.last_ns, a.size_seen),
            (5, 20, 70, 30)
        );
    }

    #[test]
    fn pipes_and_pseudo_files_are_not_storage() {
        let f = |path: &str, kind| FileStats {
            path: path.into(),
            kind,
            ..FileStats::default()
        };
        assert!(!f("pipe:[123]", FileKind::Fifo).is_storage());
        assert!(!f("/proc/self/status", FileKind::Regular).is_storage());
        assert!(f("/dev/shm/x", FileKind::Regular).is_storage());
        assert!(f("/work/a", FileKind::Missing).is_storage());
    }
}
