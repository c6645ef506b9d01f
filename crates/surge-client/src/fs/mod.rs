//! The file-system core of a Surge mount: POSIX semantics over [`InstanceClient`], with no FUSE
//! types (the adapter in [`crate::fuse`] only translates). It can be driven, and tested, without
//! a kernel mount (`crates/surge-client/tests/fs_core.rs` does, against in-process servers).
//!
//! Consistency (docs/SEMANTICS.md): close-to-open across compute nodes, POSIX within one.
//! - Data goes to the servers on every `write` (no client write cache), so another node that
//!   opens the file after our `close` reads it all.
//! - The size and mtime of a file being written live here (shared by every handle of the inode on
//!   this node) and are committed to the metadata server on `flush` (each `close`), `fsync` and
//!   the last `release`.
//! - `open` fetches fresh attributes; when they changed since this node last saw the file the
//!   adapter drops the kernel's cached attributes and pages.
//! - A file unlinked while open here keeps its data until its last close on this node.
//!
//! The parts, each in its own module:
//! - [`inodes`]: what this node knows of each inode the kernel holds (open counts, sizes and
//!   times of writes not yet committed) and the open file handles.
//! - [`listings`]: the names of directories this node made and alone changed (lookups of
//!   absent names answered here), and directory attributes returned with this node's changes.
//! - [`behind`]: the queue of namespace changes answered before the metadata server made them,
//!   and the task that sends it in batches.
//! - [`leases`]: directory leases of shared namespaces (creates behind there) and the task that
//!   answers the metadata server's recalls.
//! - [`passthrough`]: kernel passthrough of files whose data is one local object.
//! - [`preload`]: what the interposition library may do with files open here by passthrough.
//! - [`locks`]: fcntl, OFD and flock locks, kept by the metadata server for every node.
//! - [`space`]: what files really hold (`st_blocks`, `SEEK_DATA`/`SEEK_HOLE`).
//! - Cache instances: [`fill`] (files read from the PFS until copied in), [`through`] (files
//!   written through to the PFS when the tier is full), [`evict`] (clean files evicted first,
//!   and the reports of opens that rely on) and [`dirty`] (back-pressure on writers).
//! - [`files`] (open, read, write, fsync, close) and [`names`] (lookup, create, unlink, rename,
//!   readdir) are the operations, built on the parts.
//!
//! Lock order (never take an earlier lock while holding a later one): an inode's size lock
//! (async, held across the round trips of a commit or truncate) -> `listings` -> `inodes` ->
//! (`open_inos`, `inos`, the `behind` queue); `handles`, `fresh_dirs` and the lease set are
//! taken alone.

mod behind;
mod dirty;
mod evict;
mod failures;
mod files;
mod fill;
mod inodes;
mod leases;
mod listings;
mod locks;
mod names;
mod passthrough;
mod preload;
mod space;
mod through;
mod xattr;

use crate::error::ClientError;
use crate::instance::InstanceClient;
use behind::Behind;
pub use failures::{errno_name, Failures};
pub use files::{KillSuidgid, ReadSource};
use inodes::InodeTable;
use listings::{FreshDirs, Listings};
pub use locks::{LockRequest, TakenLocks};
pub use names::NewPerm;
use parking_lot::Mutex;
pub use passthrough::PASSTHROUGH_ACCOUNTING;
pub use space::dense_blocks;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use surge_core::Ino;
use surge_proto::FileKind;

/// An error for the application: an errno and, for the log, why.
#[derive(Debug, Clone)]
pub struct FsError {
    pub errno: i32,
    pub message: String,
}

impl FsError {
    pub fn new(errno: i32, message: impl Into<String>) -> FsError {
        FsError {
            errno,
            message: message.into(),
        }
    }

    /// An error of the local file system (a backing file), with what was being done.
    fn io(what: &str, e: std::io::Error) -> FsError {
        FsError::new(
            e.raw_os_error().unwrap_or(libc::EIO),
            format!("{what}: {e}"),
        )
    }
}

impl From<ClientError> for FsError {
    fn from(e: ClientError) -> FsError {
        FsError {
            errno: e.errno(),
            message: e.to_string(),
        }
    }
}

impl std::fmt::Display for FsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (errno {})", self.message, self.errno)
    }
}

impl std::error::Error for FsError {}

pub type FsResult<T> = Result<T, FsError>;

/// For requests that name an inode the kernel found through its name cache: if the metadata
/// server no longer has it (removed or replaced on another node while the cache held it),
/// ESTALE makes the kernel look the path up again and retry the call (open, stat, truncate),
/// so a cached name never hides the file that now has it.
fn stale(e: ClientError) -> FsError {
    if e.code() == Some(surge_proto::ErrorCode::NotFound) {
        FsError::new(libc::ESTALE, format!("stale inode: {e}"))
    } else {
        e.into()
    }
}

/// What `open` decided.
#[derive(Debug, Clone)]
pub struct Opened {
    pub fh: u64,
    /// The file is unchanged since this node last saw it: the kernel may keep its pages.
    pub keep_cache: bool,
    /// The file changed: the kernel's cached attributes must be dropped.
    pub invalidate_attr: bool,
    /// Kernel passthrough: the object file holding all of this file's data on this host; the
    /// kernel reads and writes it directly (DESIGN §3, the local fast path).
    pub backing: Option<Arc<std::fs::File>>,
}

/// One directory entry for the kernel: `offset` is where to continue after it.
#[derive(Debug, Clone)]
pub struct DirItem {
    pub ino: Ino,
    pub offset: u64,
    pub kind: FileKind,
    pub name: Vec<u8>,
}

/// Directory listing pages fetched from the metadata server per `readdir` call.
const READDIR_PAGE: u32 = 256;

pub struct Fs {
    client: Arc<InstanceClient>,
    inodes: Arc<InodeTable>,
    /// Directory attributes returned with this node's own changes (see [`FreshDirs`]).
    fresh_dirs: FreshDirs,
    /// Directories whose every name this node knows (see [`Listings`]); shared with the tasks
    /// that send changes behind and answer lease recalls.
    listings: Arc<Listings>,
    /// Changes answered before the metadata server made them (see [`Behind`]).
    behind: Arc<Behind>,
    /// Directory leases held and the task answering recalls (see [`leases`]).
    leases: leases::Leases,
    /// Kernel passthrough (see [`passthrough`]).
    passthrough: passthrough::Passthrough,
    /// fcntl and flock locks, kept by the metadata server (see [`locks`]).
    locks: locks::Locks,
    /// Creates may be made behind in every listed directory: the namespace is private to one
    /// compute node (DataWarp's private mode). In a shared namespace another node may make
    /// the same name meanwhile, and a file this node answered for would then not exist (its
    /// data lost): there creates are made behind only in a directory this node holds the
    /// lease of (the metadata server recalls it before another node looks there, and this
    /// node then sends what it did and gives it back); elsewhere they wait for the metadata
    /// server (and `O_CREAT` of a name another node made opens it).
    creates_behind: bool,
    /// Inode numbers reserved for creates made behind, not used yet.
    inos: Mutex<std::ops::Range<Ino>>,
    /// The metadata server refused to reserve inode numbers (creates are not made behind).
    inos_refused: AtomicBool,
    /// Size changes of one inode sent to the metadata server one at a time (striped by inode
    /// number): a commit is `size = max(size, sent)`, so one computed before a truncate and
    /// arriving after it would undo the truncate.
    size_locks: Vec<tokio::sync::Mutex<()>>,
    /// Cache instances: writes to the fast tier hold one of these shared, a switch of the file
    /// to writing through (striped by inode number) holds it exclusively.
    through_locks: Vec<tokio::sync::RwLock<()>>,
    /// A cache (`type=cache`) instance.
    cache: bool,
    /// Cache instances: an open holds this shared from its `CacheOpen` until it is recorded
    /// here; a report of opens and closes holds it exclusively (see `evict`).
    use_reports: tokio::sync::RwLock<()>,
    /// Cache instances: one eviction at a time, and how many this mount made (see `evict`).
    evicting: tokio::sync::Mutex<()>,
    evictions: std::sync::atomic::AtomicU64,
    /// Operations answered with an error, per operation and errno (see `failures`).
    failures: failures::Failures,
    /// Cache instances: back-pressure at the dirty high-water mark (see `dirty`).
    dirty: dirty::DirtyGate,
    /// A read-only ldbalance replica: nothing changes it while it is mounted.
    immutable: bool,
    /// Whether and when an open for reading moves a file's atime (the mount's `noatime`,
    /// `relatime` or `strictatime`; see [`Fs::set_atime`]).
    atime: Atime,
    /// Whether listings move directories' atimes by the same rule (`diratime`, Linux's
    /// default) or never (`nodiratime`).
    diratime: bool,
    /// The layout of new files where no directory default says otherwise (`surge mount
    /// --layout`); `None`: the mount's own choice (see `passthrough`).
    default_layout: Option<surge_core::FileLayout>,
    /// Drops the kernel's cached pages of an inode (the adapter's notifier; see `fill`).
    drop_pages: std::sync::OnceLock<PageDrop>,
    /// Drops the kernel's cached attributes of an inode (the adapter's notifier; see
    /// [`Fs::flush`]).
    drop_attrs: std::sync::OnceLock<PageDrop>,
    /// Cache instances, a root mount acting for a user (the compute-node agent): the user
    /// whose rights the PFS files it opens are opened with (see `fill::open_pfs_file`).
    pfs_user: Option<surge_auth::Caller>,
}

/// When reads move a file's access time, as the mount flags of the same names say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Atime {
    /// `noatime`: never.
    No,
    /// `relatime` (Linux's default): when the atime is not after the mtime or the ctime, or
    /// is a day old (see [`surge_proto::atime_due`]).
    #[default]
    Relative,
    /// `strictatime`: at every open for reading.
    Strict,
}

/// Drops the kernel's cached pages of an inode.
pub type PageDrop = Arc<dyn Fn(Ino) + Send + Sync>;

/// Stripes of [`Fs::size_locks`].
const SIZE_LOCKS: usize = 64;

impl Fs {
    /// `fresh_dir_ttl`: how long directory attributes returned with this node's own changes
    /// may answer the kernel's next `getattr` of that directory (the mount's attribute TTL;
    /// zero: never). `entry_ttl`: how long this node's listing of a directory it made and
    /// alone changed answers lookups of absent names (see [`Listings`]; zero: never).
    pub fn new(
        client: Arc<InstanceClient>,
        fresh_dir_ttl: std::time::Duration,
        entry_ttl: std::time::Duration,
    ) -> Fs {
        let creates_behind = client.desc.access_mode == "private";
        let immutable = client.desc.access_mode == "ldbalance";
        let cache = client.desc.cache_pfs.is_some();
        let inodes = Arc::new(InodeTable::default());
        // The instance's `dirty_high=` (see `dirty`).
        let dirty_high = if cache {
            let mark = client.desc.cache_dirty_high;
            mark.unwrap_or(surge_core::directives::DirtyHigh::DEFAULT)
                .bytes(client.desc.capacity)
        } else {
            0
        };
        if cache {
            inodes.record_closes();
        }
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let pfs_user = client
            .acting_for()
            .filter(|c| cache && root && c.uid != 0)
            .cloned();
        Fs {
            client,
            inodes,
            fresh_dirs: FreshDirs::new(fresh_dir_ttl),
            listings: Arc::new(Listings::new(entry_ttl)),
            behind: Arc::new(Behind::default()),
            leases: leases::Leases::default(),
            passthrough: passthrough::Passthrough::default(),
            locks: locks::Locks::default(),
            creates_behind,
            inos: Mutex::new(0..0),
            inos_refused: AtomicBool::new(false),
            size_locks: (0..SIZE_LOCKS)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            through_locks: (0..SIZE_LOCKS)
                .map(|_| tokio::sync::RwLock::new(()))
                .collect(),
            cache,
            use_reports: tokio::sync::RwLock::new(()),
            evicting: tokio::sync::Mutex::new(()),
            evictions: std::sync::atomic::AtomicU64::new(0),
            failures: failures::Failures::default(),
            dirty: dirty::DirtyGate::new(dirty_high),
            immutable,
            atime: Atime::No,
            diratime: true,
            default_layout: None,
            drop_pages: std::sync::OnceLock::new(),
            drop_attrs: std::sync::OnceLock::new(),
            pfs_user,
        }
    }

    /// How the kernel's cached pages of an inode are dropped (set once by the adapter).
    pub fn set_page_drop(&self, f: PageDrop) {
        let _ = self.drop_pages.set(f);
    }

    /// How the kernel's cached attributes of an inode are dropped (set once by the adapter).
    pub fn set_attr_drop(&self, f: PageDrop) {
        let _ = self.drop_attrs.set(f);
    }

    /// Cache instances: sets the dirty high-water mark, in bytes (0: writers never wait for
    /// the drain; see `dirty`).
    pub fn set_dirty_high(&mut self, bytes: u64) {
        if self.cache {
            self.dirty = dirty::DirtyGate::new(bytes);
        }
    }

    /// Sets the layout of new files where no directory default says otherwise (`None`: the
    /// mount's own choice).
    pub fn set_default_layout(&mut self, l: Option<surge_core::FileLayout>) {
        self.default_layout = l.filter(|l| !l.is_unset());
    }

    /// Whether and when opens for reading move atimes (default [`Atime::No`]; a read-only
    /// replica never does).
    pub fn set_atime(&mut self, rule: Atime) {
        self.atime = if self.immutable { Atime::No } else { rule };
    }

    /// Whether listings move directories' atimes by the rule of [`set_atime`](Self::set_atime)
    /// (`diratime`, the default) or never (`nodiratime`).
    pub fn set_diratime(&mut self, on: bool) {
        self.diratime = on;
    }

    /// The lock serializing size changes of `ino` (see `size_locks`).
    fn size_lock(&self, ino: Ino) -> &tokio::sync::Mutex<()> {
        &self.size_locks[(ino as usize) % SIZE_LOCKS]
    }

    pub fn client(&self) -> &Arc<InstanceClient> {
        &self.client
    }

    /// Notes that the operation `op` failed with `e` (logged once, counted; see
    /// [`Failures`]) and returns the errno to answer.
    pub fn failed(&self, op: &'static str, e: &FsError) -> i32 {
        self.failures.note(op, e)
    }

    /// The operations this mount answered with an error, per operation and errno.
    pub fn failures(&self) -> &Failures {
        &self.failures
    }

    /// Waits until nothing is behind (see [`Behind`]), at most the client's deadline: past it
    /// the request that waits fails with EIO (the queue is still sent when the metadata
    /// server answers again).
    async fn barrier(&self) -> FsResult<()> {
        if self.behind.is_empty() {
            return Ok(());
        }
        let Some(d) = self.client.deadline() else {
            self.behind.wait_empty().await;
            return Ok(());
        };
        if tokio::time::timeout(d, self.behind.wait_empty())
            .await
            .is_err()
        {
            let e = FsError::new(
                libc::EIO,
                format!(
                    "changes made behind were not taken by the metadata server within {d:?} \
                     (stopped, hung or unreachable); the request that waits for them fails"
                ),
            );
            tracing::warn!("{e}");
            return Err(e);
        }
        Ok(())
    }

    /// Commits the sizes and mtimes of every file with writes not yet committed (a cache
    /// namespace does this every second, so the metadata server, and the drain through it,
    /// sees a file being written change until it is closed).
    pub async fn commit_dirty(&self) {
        for ino in self.inodes.dirty() {
            if let Err(e) = self.commit(ino).await {
                tracing::debug!("periodic commit of inode {ino}: {e}");
            }
        }
    }

    /// Called when the file system is unmounted: commit what is pending.
    pub async fn shutdown(&self) {
        if let Err(e) = self.barrier().await {
            tracing::warn!("unmount: {e}");
        }
        for ino in self.inodes.dirty() {
            if let Err(e) = self.commit(ino).await {
                tracing::warn!("unmount: could not commit inode {ino}: {e}");
            }
        }
        tracing::debug!("file system core shut down");
    }

    /// The inode numbers reserved here ran out and the server refused more.
    fn inos_refused(&self) -> bool {
        self.inos_refused.load(Ordering::Relaxed)
    }
}
