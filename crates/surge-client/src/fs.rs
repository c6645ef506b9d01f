//! The file-system core of a Surge mount: POSIX semantics over [`InstanceClient`], with no FUSE
//! types (the adapter in [`crate::fuse`] only translates). It can be driven, and tested, without
//! a kernel mount.
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

use crate::error::ClientError;
use crate::instance::{InstanceClient, Usage};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use surge_core::Ino;
use surge_proto::{
    AllocMode, Attr, BatchDone, BatchOp, FileKind, KeepOpen, NewNode, SetAttr, TimeSet, Timestamp,
    Unlinked,
};
use tracing::{debug, info, warn};

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

#[derive(Default)]
struct Inode {
    /// Kernel references (lookup counts), released by `forget`.
    lookups: u64,
    /// Open handles on this node.
    opens: u32,
    /// (mtime, size) as last seen from the metadata server, to detect change at `open`.
    seen: Option<(Timestamp, u64)>,
    /// This node's view of the size while the file is open (writes and truncates included).
    size: u64,
    /// Time of the last local write not yet committed.
    dirty_mtime: Option<Timestamp>,
    /// Fragments written since the last fsync (bit i = fragment i).
    touched: u64,
    /// The last name went away while open here: remove the data at the last release.
    unlinked: bool,
    /// The object file the kernel reads and writes directly while the file is open here
    /// (passthrough); writes then bypass this process, so size and mtime are read from it.
    backing: Option<Arc<std::fs::File>>,
    /// (size, mtime) of the backing file last committed to the metadata server.
    backing_committed: Option<(u64, Timestamp)>,
    /// The kernel changed the backing file since the server last measured it.
    backing_changed: bool,
}

struct Handle {
    ino: Ino,
}

/// Directory listing pages fetched from the metadata server per `readdir` call.
const READDIR_PAGE: u32 = 256;

pub struct Fs {
    client: Arc<InstanceClient>,
    inodes: Mutex<HashMap<Ino, Inode>>,
    /// The inodes with `opens > 0`, changed only under the `inodes` lock: what an unlink
    /// sends as [`KeepOpen`] without scanning every inode the kernel knows.
    open_inos: Mutex<std::collections::BTreeSet<Ino>>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    /// Kernel passthrough is possible (the kernel granted it and the instance's one fragment
    /// is on this host); cleared for good at the first sign it is not.
    passthrough: std::sync::atomic::AtomicBool,
    /// Directory attributes returned with this node's own changes in them (create, unlink,
    /// rmdir), and when: the change invalidates the kernel's copy and the kernel asks for them
    /// right after (to check search permission on the next path walk). Answered from here, once
    /// each, while younger than the attribute TTL, so the kernel's question costs no round trip.
    fresh_dirs: Mutex<HashMap<Ino, (Attr, std::time::Instant)>>,
    /// How long an entry of `fresh_dirs` may answer (the mount's attribute TTL; zero: never).
    fresh_ttl: std::time::Duration,
    /// Directories whose every name this node knows: made here, and changed by nobody else
    /// since (each change here returned the directory's change counter one above the last).
    /// A lookup of a name not in the listing is answered "no such entry" without a round
    /// trip while the listing is younger than `listing_ttl`: the kernel's first question
    /// before every create. Another node's new name may stay unseen that long, as a name the
    /// kernel cached may stay after another node removed it.
    listings: Arc<Mutex<HashMap<Ino, Listing>>>,
    /// The mount's entry TTL (zero: listings are not kept).
    listing_ttl: std::time::Duration,
    /// Changes answered before the metadata server made them (see [`Behind`]).
    behind: Arc<Behind>,
    /// Inode numbers reserved for creates made behind, not used yet.
    inos: Mutex<std::ops::Range<Ino>>,
    /// The metadata server refused to reserve inode numbers (creates are not made behind).
    inos_refused: std::sync::atomic::AtomicBool,
    /// Creates may be made behind in every listed directory: the namespace is private to one
    /// compute node (DataWarp's private mode). In a shared namespace another node may make
    /// the same name meanwhile, and a file this node answered for would then not exist (its
    /// data lost): there creates are made behind only in a directory this node holds the
    /// lease of (the metadata server recalls it before another node looks there, and this
    /// node then sends what it did and gives it back); elsewhere they wait for the metadata
    /// server (and `O_CREAT` of a name another node made opens it).
    creates_behind: bool,
    /// The task answering lease recalls runs.
    recalls_started: std::sync::atomic::AtomicBool,
    /// Directories whose lease this node holds (given back once their listing is gone).
    leases: Arc<Mutex<std::collections::HashSet<Ino>>>,
}

struct Listing {
    /// Every name, with its inode and kind.
    names: HashMap<Vec<u8>, (Ino, FileKind)>,
    /// When the metadata server last confirmed the listing (a change here answered with the
    /// next counter).
    at: std::time::Instant,
    /// The directory's attributes after the last change made here (`dir.change` is the
    /// counter this node expects).
    dir: Attr,
    /// In a shared namespace, creates are made behind only in a directory this node holds
    /// the lease of (see `Fs::leased`); one try per listing.
    lease: LeaseState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LeaseState {
    Untried,
    Held,
    /// Refused, being asked for, or given back.
    No,
}

/// Namespace changes made behind the application. In a directory this node lists (see
/// `Fs::listings`), creating a file, or unlinking one not open here, is answered at once (the
/// inode number comes from a range the metadata server reserved for this node) and queued;
/// one task sends the queue in batches ([`surge_proto::Request::NamespaceBatch`], one
/// transaction each), so a stream of creates or unlinks costs the metadata server one round
/// trip per batch instead of one each. Every other namespace request of this node (and every
/// request about a file made behind) waits until the queue is empty (`Fs::barrier`), so this
/// node sees its own changes in order; other nodes see them a round trip late. Each reply
/// carries the directory's change counter, checked against what this node expected: a change
/// by another node drops the listing. A queued unlink removes the name only while it still
/// names the inode this node saw; a queued create fails if the name was taken meanwhile.
struct Behind {
    state: Mutex<BehindState>,
    /// Queued plus being sent; zero means nothing is behind.
    count: std::sync::atomic::AtomicUsize,
    work: tokio::sync::Notify,
    idle: tokio::sync::Notify,
    /// Requests waiting for the queue to empty (`Fs::barrier`): the sender stops gathering.
    waiting: std::sync::atomic::AtomicUsize,
    urgent: tokio::sync::Notify,
}

#[derive(Default)]
struct BehindState {
    queue: Vec<Queued>,
    sender_started: bool,
}

struct Queued {
    op: BatchOp,
    parent: Ino,
    /// The parent's change counter after this change, as this node expects it.
    change: u64,
}

/// Changes sent in one batch at most.
const MAX_BATCH: usize = 1024;
/// A batch smaller than this waits up to [`GATHER`] for more changes unless a request waits
/// for the queue: one transaction, one round trip and one wake-up of the metadata server
/// then serve many changes (a stream of unlinks came in batches of ~3 without it, and the
/// server's per-batch work took the CPU the application's next change needed).
const GATHER_MIN: usize = 64;
const GATHER: std::time::Duration = std::time::Duration::from_micros(500);
/// Tries of a batch that could not be sent (1 ms, 4, 16, 64, 256 ms, then every second: ~30 s).
const BATCH_RETRIES: u32 = 35;

/// A failed batch worth sending again: the connection or the server's store failed, not the
/// request.
fn retryable(e: &ClientError) -> bool {
    match e.code() {
        None => true,
        Some(code) => code == surge_proto::ErrorCode::Io || code == surge_proto::ErrorCode::Busy,
    }
}

/// Bounds on `Fs::listings`: directories, and names in one (beyond: forgotten).
const MAX_LISTINGS: usize = 1024;
const MAX_LISTED_NAMES: usize = 1 << 20;
/// Bound on `Fs::fresh_dirs` (cleared when reached; entries are taken at once in practice).
const MAX_FRESH_DIRS: usize = 4096;
/// Inode numbers reserved at a time for creates made behind.
const INODE_GRANT: u32 = 4096;

/// Sends the changes queued behind the application, a batch at a time, until the mount goes.
async fn send_behind(
    b: Arc<Behind>,
    client: Arc<InstanceClient>,
    listings: Arc<Mutex<HashMap<Ino, Listing>>>,
) {
    loop {
        let work = b.work.notified();
        tokio::pin!(work);
        work.as_mut().enable();
        let queued = b.state.lock().queue.len();
        if queued == 0 {
            work.await;
            continue;
        }
        if queued < GATHER_MIN && b.waiting.load(Ordering::Acquire) == 0 {
            let urgent = b.urgent.notified();
            tokio::pin!(urgent);
            urgent.as_mut().enable();
            if b.waiting.load(Ordering::Acquire) == 0 {
                tokio::select! {
                    _ = tokio::time::sleep(GATHER) => {}
                    _ = urgent => {}
                }
            }
        }
        let batch: Vec<Queued> = {
            let mut st = b.state.lock();
            let n = st.queue.len().min(MAX_BATCH);
            st.queue.drain(..n).collect()
        };
        let n = batch.len();
        send_batch(&client, &listings, batch).await;
        if b.count.fetch_sub(n, Ordering::AcqRel) == n {
            b.idle.notify_waiters();
        }
    }
}

impl Behind {
    /// Waits until nothing is behind.
    async fn wait_empty(&self) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        // Counted while this waits (also when the wait is dropped half-way).
        struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let _waiting = Waiting(&self.waiting);
        self.urgent.notify_waiters();
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.count.load(Ordering::Acquire) == 0 {
                break;
            }
            idle.await;
        }
    }
}

/// Answers the metadata server's recalls of this node's directory leases until the mount
/// goes: stops making changes behind in a recalled directory, sends what is queued, and gives
/// the lease back. Between waits, gives back the leases of directories whose listing is gone
/// or expired (`ttl`), so the server keeps no lease this node no longer uses. The server
/// drops them all when this task's connection closes.
async fn answer_recalls(
    client: Arc<InstanceClient>,
    behind: Arc<Behind>,
    listings: Arc<Mutex<HashMap<Ino, Listing>>>,
    held: Arc<Mutex<std::collections::HashSet<Ino>>>,
    ttl: std::time::Duration,
) {
    let mut conn = None;
    loop {
        let c = match conn.take() {
            Some(c) => c,
            None => match client.recall_connection().await {
                Ok(c) => c,
                Err(e) => {
                    warn!("cannot wait for lease recalls ({e}); retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    continue;
                }
            },
        };
        let recalled = match client.wait_recall(&c, 1000).await {
            Ok(d) => d,
            Err(e) => {
                // The server may have restarted and forgotten its leases: hold none, and
                // forget what they made known (another node may add names there now).
                listings.lock().retain(|_, l| l.lease != LeaseState::Held);
                held.lock().clear();
                debug!("waiting for lease recalls: {e}; leases given up, reconnecting");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        conn = Some(c);
        let unused: Vec<Ino> = {
            let mut l = listings.lock();
            for d in &recalled {
                l.remove(d);
            }
            l.retain(|_, x| !(x.lease == LeaseState::Held && x.at.elapsed() >= ttl));
            let mut h = held.lock();
            let unused: Vec<Ino> = h
                .iter()
                .filter(|d| !recalled.contains(d))
                .filter(|d| l.get(d).is_none_or(|x| x.lease != LeaseState::Held))
                .copied()
                .collect();
            for d in recalled.iter().chain(&unused) {
                h.remove(d);
            }
            unused
        };
        if recalled.is_empty() && unused.is_empty() {
            continue;
        }
        // What was answered there reaches the server before the lease goes.
        behind.wait_empty().await;
        if !recalled.is_empty() {
            info!(
                "directories {recalled:?} recalled by the metadata server (another node looks \
                 there)"
            );
        }
        let mut dirs = recalled;
        dirs.extend(unused);
        if let Err(e) = client.release_leases(dirs).await {
            warn!("cannot give directory leases back ({e}); the server drops them itself");
        }
    }
}

fn op_name(op: &BatchOp) -> String {
    match op {
        BatchOp::Unlink { name, .. } => format!("unlink {}", String::from_utf8_lossy(name)),
        BatchOp::CreateFile { name, .. } => format!("create {}", String::from_utf8_lossy(name)),
    }
}

/// Sends one batch (retrying a failed connection a few times) and finishes each change.
async fn send_batch(
    client: &InstanceClient,
    listings: &Mutex<HashMap<Ino, Listing>>,
    batch: Vec<Queued>,
) {
    let ops: Vec<BatchOp> = batch.iter().map(|q| q.op.clone()).collect();
    let mut delay = std::time::Duration::from_millis(1);
    let mut attempt = 0;
    let sent = std::time::Instant::now();
    let results = loop {
        match client.namespace_batch(ops.clone()).await {
            Ok(r) if r.len() == batch.len() => break r,
            Ok(r) => {
                warn!(
                    "changes behind: {} results for {} changes; directories forgotten",
                    r.len(),
                    batch.len()
                );
                break Vec::new();
            }
            // A server that restarts (or a connection that broke) gets half a minute; an
            // instance or namespace that is gone, or a refusal, gets no retry.
            Err(e) if attempt < BATCH_RETRIES && retryable(&e) => {
                warn!(
                    "changes behind: {} changes not sent ({e}); retrying in {delay:?}",
                    batch.len()
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 4).min(std::time::Duration::from_secs(1));
                attempt += 1;
            }
            Err(e) => {
                let what: Vec<_> = ops.iter().take(10).map(op_name).collect();
                tracing::error!(
                    "changes behind: giving up on {} changes ({e}); they were not made, \
                     e.g. {what:?}",
                    batch.len()
                );
                break Vec::new();
            }
        }
    };
    if results.is_empty() {
        let mut l = listings.lock();
        for q in &batch {
            l.remove(&q.parent);
        }
        return;
    }
    for (q, r) in batch.iter().zip(results) {
        let change = match r {
            Ok(BatchDone::Unlinked {
                unlinked: u,
                change,
            }) => {
                if u.orphaned && u.purged {
                    remove_purged_data(client, &u).await;
                } else if u.orphaned {
                    if let Err(e) = client.purge(u.ino, u.size).await {
                        warn!("could not remove the data of unlinked inode {}: {e}", u.ino);
                    }
                }
                Some(change)
            }
            Ok(BatchDone::Created { change }) => Some(change),
            Err(e) => {
                // Another node changed the directory first.
                match &q.op {
                    BatchOp::CreateFile { .. } => warn!(
                        "{} in directory {} made behind failed: {e}; its descriptors here \
                         point to nothing",
                        op_name(&q.op),
                        q.parent
                    ),
                    BatchOp::Unlink { .. } => debug!(
                        "{} in directory {} made behind: {e}",
                        op_name(&q.op),
                        q.parent
                    ),
                }
                None
            }
        };
        let mut l = listings.lock();
        match change {
            // The directory is as this node expected it when the batch went out.
            Some(c) if c == q.change => {
                if let Some(x) = l.get_mut(&q.parent) {
                    x.at = x.at.max(sent);
                }
            }
            _ => {
                l.remove(&q.parent);
            }
        }
    }
}

/// Removes the objects of an inode the metadata server forgot when its last name went (the
/// server removed its own local objects already).
async fn remove_purged_data(client: &InstanceClient, u: &Unlinked) {
    if u.size > 0 {
        if let Err(e) = client.remove_objects(u.ino, u.size).await {
            warn!("could not remove the data of unlinked inode {}: {e}", u.ino);
        }
    }
}

/// Size and mtime of a backing file.
fn backing_state(f: &std::fs::File) -> Option<(u64, Timestamp)> {
    let md = f.metadata().ok()?;
    Some((md.len(), Timestamp::from_system_time(md.modified().ok()?)))
}

impl Fs {
    /// `fresh_dir_ttl`: how long directory attributes returned with this node's own changes
    /// may answer the kernel's next `getattr` of that directory (the mount's attribute TTL;
    /// zero: never). `entry_ttl`: how long this node's listing of a directory it made and
    /// alone changed answers lookups of absent names (see `Fs::listings`; zero: never).
    pub fn new(
        client: Arc<InstanceClient>,
        fresh_dir_ttl: std::time::Duration,
        entry_ttl: std::time::Duration,
    ) -> Fs {
        let creates_behind = client.desc.access_mode == "private";
        Fs {
            client,
            inodes: Mutex::new(HashMap::new()),
            open_inos: Mutex::new(std::collections::BTreeSet::new()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            passthrough: std::sync::atomic::AtomicBool::new(false),
            fresh_dirs: Mutex::new(HashMap::new()),
            fresh_ttl: fresh_dir_ttl,
            listings: Arc::new(Mutex::new(HashMap::new())),
            listing_ttl: entry_ttl,
            behind: Arc::new(Behind {
                state: Mutex::new(BehindState::default()),
                count: std::sync::atomic::AtomicUsize::new(0),
                work: tokio::sync::Notify::new(),
                idle: tokio::sync::Notify::new(),
                waiting: std::sync::atomic::AtomicUsize::new(0),
                urgent: tokio::sync::Notify::new(),
            }),
            inos: Mutex::new(0..0),
            inos_refused: std::sync::atomic::AtomicBool::new(false),
            creates_behind,
            recalls_started: std::sync::atomic::AtomicBool::new(false),
            leases: Arc::new(Mutex::new(std::collections::HashSet::new())),
        }
    }

    /// `dir` was just made here: it is empty.
    fn listing_new(&self, dir: &Attr) {
        if self.listing_ttl.is_zero() {
            return;
        }
        let mut l = self.listings.lock();
        if l.len() >= MAX_LISTINGS {
            l.clear();
        }
        l.insert(
            dir.ino,
            Listing {
                names: HashMap::new(),
                at: std::time::Instant::now(),
                dir: dir.clone(),
                lease: LeaseState::Untried,
            },
        );
    }

    /// This node added (`entry`: its inode and kind) or removed (`None`) `name` in a
    /// directory, which is now `dir`.
    fn listing_update(&self, dir: &Attr, name: &[u8], entry: Option<(Ino, FileKind)>) {
        let mut listings = self.listings.lock();
        let Some(l) = listings.get_mut(&dir.ino) else {
            return;
        };
        if dir.change != l.dir.change.wrapping_add(1) || l.names.len() >= MAX_LISTED_NAMES {
            // Somebody else changed it too (or it grew too big to keep).
            listings.remove(&dir.ino);
            return;
        }
        match entry {
            Some(e) => {
                l.names.insert(name.to_vec(), e);
            }
            None => {
                l.names.remove(name);
            }
        }
        l.at = std::time::Instant::now();
        l.dir = dir.clone();
    }

    fn listing_drop(&self, ino: Ino) {
        self.listings.lock().remove(&ino);
    }

    /// True when `name` is known not to be in `parent` (see `Fs::listings`): in a shared
    /// namespace only while this node holds the directory's lease (another node adding a name
    /// there recalls it first, which drops the listing).
    fn known_absent(&self, parent: Ino, name: &[u8]) -> bool {
        let mut listings = self.listings.lock();
        self.live_listing(&mut listings, parent).is_some_and(|l| {
            (self.creates_behind || l.lease == LeaseState::Held) && !l.names.contains_key(name)
        })
    }

    fn note_dir(&self, a: Attr) {
        if self.fresh_ttl.is_zero() {
            return;
        }
        let mut dirs = self.fresh_dirs.lock();
        if dirs.len() >= MAX_FRESH_DIRS {
            dirs.clear();
        }
        dirs.insert(a.ino, (a, std::time::Instant::now()));
    }

    fn forget_dir(&self, ino: Ino) {
        self.fresh_dirs.lock().remove(&ino);
    }

    fn take_fresh_dir(&self, ino: Ino) -> Option<Attr> {
        let (a, at) = self.fresh_dirs.lock().remove(&ino)?;
        (at.elapsed() < self.fresh_ttl).then_some(a)
    }

    /// Stops using passthrough (the kernel refused a backing file).
    pub fn disable_passthrough(&self) {
        self.passthrough.store(false, Ordering::Relaxed);
    }

    /// Called by the adapter when the kernel accepted FUSE passthrough.
    pub fn enable_passthrough(&self) {
        self.passthrough
            .store(self.client.fragments() == 1, Ordering::Relaxed);
    }

    /// The backing file for an open of `ino`: the one already in use on this node, or the
    /// object opened from the local server.
    async fn backing_for(&self, ino: Ino) -> Option<Arc<std::fs::File>> {
        if !self.passthrough.load(Ordering::Relaxed) {
            return None;
        }
        if let Some(b) = self.inodes.lock().get(&ino).and_then(|i| i.backing.clone()) {
            return Some(b);
        }
        match self.client.open_local_object(ino).await {
            Ok(Some(f)) => {
                let f = Arc::new(f);
                let mut inodes = self.inodes.lock();
                let i = inodes.entry(ino).or_default();
                // Another open may have raced us: every open of an inode shares one backing file.
                Some(i.backing.get_or_insert(f).clone())
            }
            Ok(None) => {
                debug!("instance's fragment is not on this host: no passthrough");
                self.passthrough.store(false, Ordering::Relaxed);
                None
            }
            Err(e) => {
                debug!("no passthrough for inode {ino}: {e}");
                None
            }
        }
    }

    pub fn client(&self) -> &Arc<InstanceClient> {
        &self.client
    }

    /// Overlays this node's view (size, mtime of writes not yet committed) on attributes from
    /// the metadata server and records what was seen.
    fn observe(&self, mut a: Attr, lookup: bool) -> Attr {
        if a.kind == FileKind::Dir {
            let mut listings = self.listings.lock();
            if listings
                .get(&a.ino)
                .is_some_and(|l| l.dir.change != a.change)
            {
                listings.remove(&a.ino);
            }
        }
        let mut inodes = self.inodes.lock();
        let ino = inodes.entry(a.ino).or_default();
        if lookup {
            ino.lookups += 1;
        }
        if ino.opens > 0 {
            ino.seen = Some((a.mtime, a.size));
            a.size = ino.size;
            if let Some(m) = ino.dirty_mtime {
                a.mtime = m;
            }
            if let Some((size, mtime)) = ino.backing.as_deref().and_then(backing_state) {
                a.size = a.size.max(size);
                if Some((size, mtime)) != ino.backing_committed {
                    a.mtime = a.mtime.max(mtime);
                }
            }
        } else {
            ino.seen = Some((a.mtime, a.size));
        }
        a
    }

    fn handle_ino(&self, fh: u64) -> FsResult<Ino> {
        self.handles
            .lock()
            .get(&fh)
            .map(|h| h.ino)
            .ok_or_else(|| FsError::new(libc::EBADF, format!("unknown file handle {fh}")))
    }

    pub async fn lookup(&self, parent: Ino, name: &[u8]) -> FsResult<Attr> {
        if self.known_absent(parent, name) {
            return Err(FsError::new(libc::ENOENT, "no such entry"));
        }
        self.barrier().await;
        let a = self.client.lookup(parent, name).await?;
        Ok(self.observe(a, true))
    }

    /// The kernel dropped `n` references to `ino`.
    pub fn forget(&self, ino: Ino, n: u64) {
        let mut inodes = self.inodes.lock();
        if let Some(i) = inodes.get_mut(&ino) {
            i.lookups = i.lookups.saturating_sub(n);
            if i.lookups == 0 && i.opens == 0 {
                inodes.remove(&ino);
            }
        }
    }

    pub async fn getattr(&self, ino: Ino) -> FsResult<Attr> {
        if let Some(a) = self.take_fresh_dir(ino) {
            return Ok(self.observe(a, false));
        }
        self.barrier().await;
        let a = self.client.getattr(ino).await.map_err(stale)?;
        Ok(self.observe(a, false))
    }

    pub async fn setattr(&self, ino: Ino, set: SetAttr) -> FsResult<Attr> {
        self.forget_dir(ino);
        // A directory's mode (setgid) and owner are copied into files made behind.
        self.listing_drop(ino);
        self.barrier().await;
        let mut set = set;
        let open_size = {
            let inodes = self.inodes.lock();
            inodes.get(&ino).filter(|i| i.opens > 0).map(|i| i.size)
        };
        let old_size = match (set.size, open_size) {
            (None, _) => 0,
            (Some(_), Some(s)) => {
                // Commit pending writes first, so the recorded size is not raised again by a
                // later commit of bytes the truncate removed.
                self.commit(ino).await?;
                s
            }
            (Some(_), None) => self.client.getattr(ino).await.map_err(stale)?.size,
        };
        if set.size.is_some() && set.mtime.is_none() {
            set.mtime = Some(TimeSet::Now);
        }
        let a = self
            .client
            .setattr(ino, set.clone(), old_size)
            .await
            .map_err(stale)?;
        if let Some(new) = set.size {
            let backing = {
                let mut inodes = self.inodes.lock();
                inodes.get_mut(&ino).and_then(|i| {
                    i.size = new;
                    i.backing.clone()
                })
            };
            // The kernel reads a passthrough file straight from its object, so the object
            // must be as long as the file (an extension is a hole).
            if let Some(b) = backing {
                b.set_len(new).map_err(|e| {
                    FsError::new(
                        e.raw_os_error().unwrap_or(libc::EIO),
                        format!("truncate: {e}"),
                    )
                })?;
                if let Some(i) = self.inodes.lock().get_mut(&ino) {
                    i.backing_committed = backing_state(&b);
                }
            }
        }
        Ok(self.observe(a, false))
    }

    fn new_handle(&self, ino: Ino) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, Handle { ino });
        fh
    }

    pub async fn open(&self, ino: Ino) -> FsResult<Opened> {
        self.barrier().await;
        let a = self.client.getattr(ino).await.map_err(stale)?;
        if a.kind == FileKind::Dir {
            return Err(FsError::new(libc::EISDIR, "is a directory"));
        }
        let open_here = self.inodes.lock().get(&ino).is_some_and(|i| i.opens > 0);
        if a.nlink == 0 && !open_here {
            // Unlinked elsewhere but kept for another node's open descriptors: the name that
            // led here is stale.
            return Err(FsError::new(
                libc::ESTALE,
                format!("inode {ino} has no name any more"),
            ));
        }
        let backing = self.backing_for(ino).await;
        if let Some(b) = &backing {
            // A file extended without writing (truncate up, on any node) has a shorter object;
            // the kernel reads a passthrough file straight from it.
            if b.metadata().map(|m| m.len()).unwrap_or(0) < a.size {
                b.set_len(a.size).map_err(|e| {
                    FsError::new(e.raw_os_error().unwrap_or(libc::EIO), format!("open: {e}"))
                })?;
            }
        }
        let fh = self.new_handle(ino);
        let mut inodes = self.inodes.lock();
        let i = inodes.entry(ino).or_default();
        if backing.is_some() && i.backing_committed.is_none() {
            i.backing_committed = i.backing.as_deref().and_then(backing_state);
        }
        let now = (a.mtime, a.size);
        let changed = i.seen.is_some_and(|s| s != now);
        let keep_cache = i.seen == Some(now);
        if i.opens == 0 {
            i.size = a.size;
            i.dirty_mtime = None;
            i.touched = 0;
        } else {
            i.size = i.size.max(a.size);
        }
        i.seen = Some(now);
        if i.opens == 0 {
            self.open_inos.lock().insert(ino);
        }
        i.opens += 1;
        Ok(Opened {
            fh,
            keep_cache,
            invalidate_attr: changed,
            backing,
        })
    }

    pub async fn create(
        &self,
        parent: Ino,
        name: &[u8],
        perm: u16,
        uid: u32,
        gid: u32,
        flags: i32,
    ) -> FsResult<(Attr, u64, Option<Arc<std::fs::File>>)> {
        let behind = if self.listed(parent) && (self.creates_behind || self.leased(parent).await) {
            self.ensure_inos().await;
            self.create_behind(parent, name, perm, uid, gid)
        } else {
            None
        };
        let made = match behind {
            Some(a) => Ok(a),
            None => self.make(parent, name, NewNode::File, perm, uid, gid).await,
        };
        let a = match made {
            Ok(a) => a,
            // The name appeared after the kernel's lookup (another node made it): without
            // O_EXCL, open(2) opens what is there.
            Err(e) if e.errno == libc::EEXIST && flags & libc::O_EXCL == 0 => {
                return self.open_existing(parent, name, flags).await;
            }
            Err(e) => return Err(e),
        };
        let backing = self.backing_for(a.ino).await;
        let fh = self.new_handle(a.ino);
        {
            let mut inodes = self.inodes.lock();
            let i = inodes.entry(a.ino).or_default();
            i.lookups += 1;
            if i.opens == 0 {
                self.open_inos.lock().insert(a.ino);
            }
            i.opens += 1;
            i.size = 0;
            i.seen = Some((a.mtime, a.size));
            i.backing_committed = i.backing.as_deref().and_then(backing_state);
        }
        Ok((a, fh, backing))
    }

    pub async fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let ino = self.handle_ino(fh)?;
        let file_size = self.inodes.lock().get(&ino).map_or(0, |i| i.size);
        if offset >= file_size {
            return Ok(Vec::new());
        }
        let len = u64::from(size).min(file_size - offset);
        Ok(self.client.read(ino, offset, len).await?)
    }

    pub async fn write(&self, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        let ino = self.handle_ino(fh)?;
        if offset
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > i64::MAX as u64)
        {
            return Err(FsError::new(
                libc::EFBIG,
                "write past the largest file offset",
            ));
        }
        let n = self.client.write(ino, offset, data).await?;
        let mask = self.client.fragments_touched(ino, offset, n);
        if let Some(i) = self.inodes.lock().get_mut(&ino) {
            i.size = i.size.max(offset + n);
            i.dirty_mtime = Some(Timestamp::now());
            i.touched |= mask;
        }
        Ok(n as u32)
    }

    /// `fallocate(2)`. Supported modes: 0 (allocate, extending the file), `FALLOC_FL_KEEP_SIZE`
    /// and `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`; others are `EOPNOTSUPP`. With
    /// `KEEP_SIZE` the part of the range past the end of the file is not reserved (a Surge file
    /// owns no blocks past its end, so unlink and truncate never have to look for them).
    pub async fn fallocate(&self, fh: u64, offset: u64, len: u64, mode: i32) -> FsResult<()> {
        let ino = self.handle_ino(fh)?;
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or_else(|| FsError::new(libc::EFBIG, "fallocate past the largest file offset"))?;
        if len == 0 {
            return Err(FsError::new(libc::EINVAL, "fallocate of an empty range"));
        }
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        let mode = match mode {
            0 => AllocMode::Allocate,
            KEEP => AllocMode::KeepSize,
            PUNCH => AllocMode::PunchHole,
            other => {
                return Err(FsError::new(
                    libc::EOPNOTSUPP,
                    format!("fallocate mode {other:#x} is not supported"),
                ))
            }
        };
        let size = self.inodes.lock().get(&ino).map_or(0, |i| i.size);
        let end = if mode == AllocMode::Allocate {
            end
        } else {
            end.min(size)
        };
        if end <= offset {
            return Ok(());
        }
        self.client
            .allocate_objects(ino, offset, end - offset, mode)
            .await?;
        let mask = self.client.fragments_touched(ino, offset, end - offset);
        if let Some(i) = self.inodes.lock().get_mut(&ino) {
            i.touched |= mask;
            if end > i.size || mode == AllocMode::PunchHole {
                i.size = i.size.max(end);
                i.dirty_mtime = Some(Timestamp::now());
            }
        }
        Ok(())
    }

    /// Sends this node's size and mtime of `ino` to the metadata server if writes are pending.
    async fn commit(&self, ino: Ino) -> FsResult<()> {
        let pending = {
            let mut inodes = self.inodes.lock();
            inodes.get_mut(&ino).and_then(|i| {
                // Passthrough writes are seen only in the backing file.
                if let Some((size, mtime)) = i.backing.as_deref().and_then(backing_state) {
                    if Some((size, mtime)) != i.backing_committed {
                        i.backing_committed = Some((size, mtime));
                        i.backing_changed = true;
                        i.size = i.size.max(size);
                        let m = i.dirty_mtime.take().map_or(mtime, |d| d.max(mtime));
                        return Some((i.size, m));
                    }
                }
                i.dirty_mtime.take().map(|m| (i.size, m))
            })
        };
        if let Some((size, mtime)) = pending {
            // The file may have been made behind: the server must know it first.
            self.barrier().await;
            match self
                .client
                .commit_write(ino, size, TimeSet::At(mtime))
                .await
            {
                Ok(a) => {
                    if let Some(i) = self.inodes.lock().get_mut(&ino) {
                        i.seen = Some((a.mtime, a.size));
                    }
                }
                Err(e) => {
                    // Keep it pending so a later flush or release retries.
                    if let Some(i) = self.inodes.lock().get_mut(&ino) {
                        i.dirty_mtime.get_or_insert(mtime);
                    }
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }

    /// True when `flush` of `fh` has nothing to send (no writes pending), so the adapter can
    /// answer at once without a trip through the async runtime.
    pub fn flush_is_noop(&self, fh: u64) -> bool {
        let Ok(ino) = self.handle_ino(fh) else {
            return false;
        };
        self.inodes.lock().get(&ino).is_some_and(|i| {
            i.dirty_mtime.is_none()
                && i.backing
                    .as_deref()
                    .is_none_or(|b| backing_state(b) == i.backing_committed)
        })
    }

    /// Releases `fh` at once if that needs no network request (nothing to commit, nothing to
    /// purge); returns false to have the caller run the full [`release`](Self::release).
    pub fn release_fast(&self, fh: u64) -> bool {
        let Ok(ino) = self.handle_ino(fh) else {
            return false;
        };
        let mut inodes = self.inodes.lock();
        let Some(i) = inodes.get_mut(&ino) else {
            return false;
        };
        // A passthrough file the kernel did not change since the last commit needs nothing
        // sent either (typically a file created and closed empty).
        let backing_quiet = match &i.backing {
            None => true,
            Some(b) => !i.backing_changed && backing_state(b) == i.backing_committed,
        };
        if i.dirty_mtime.is_some() || !backing_quiet || (i.unlinked && i.opens == 1) {
            return false;
        }
        i.opens = i.opens.saturating_sub(1);
        if i.opens == 0 {
            self.open_inos.lock().remove(&ino);
            i.backing = None;
            i.backing_committed = None;
            if i.lookups == 0 {
                inodes.remove(&ino);
            }
        }
        drop(inodes);
        self.handles.lock().remove(&fh);
        true
    }

    /// `close(2)` of a descriptor: make what was written visible to other nodes.
    pub async fn flush(&self, fh: u64) -> FsResult<()> {
        let ino = self.handle_ino(fh)?;
        self.commit(ino).await
    }

    pub async fn fsync(&self, fh: u64) -> FsResult<()> {
        let ino = self.handle_ino(fh)?;
        let touched = {
            let mut inodes = self.inodes.lock();
            inodes
                .get_mut(&ino)
                .map_or(0, |i| std::mem::take(&mut i.touched))
        };
        let backing = self.inodes.lock().get(&ino).and_then(|i| i.backing.clone());
        if let Some(b) = backing {
            b.sync_data().map_err(|e| {
                FsError::new(e.raw_os_error().unwrap_or(libc::EIO), format!("fsync: {e}"))
            })?;
        }
        if touched != 0 {
            if let Err(e) = self.client.sync_objects(ino, touched).await {
                if let Some(i) = self.inodes.lock().get_mut(&ino) {
                    i.touched |= touched;
                }
                return Err(e.into());
            }
        }
        self.commit(ino).await
    }

    /// Last close of a handle.
    pub async fn release(&self, fh: u64) -> FsResult<()> {
        let ino = self.handle_ino(fh)?;
        let commit = self.commit(ino).await;
        self.handles.lock().remove(&fh);
        let mut changed = false;
        let purge = {
            let mut inodes = self.inodes.lock();
            let mut purge = None;
            if let Some(i) = inodes.get_mut(&ino) {
                i.opens = i.opens.saturating_sub(1);
                if i.opens == 0 {
                    self.open_inos.lock().remove(&ino);
                    changed = i.backing.take().is_some() && std::mem::take(&mut i.backing_changed);
                    i.backing_committed = None;
                    if i.unlinked {
                        purge = Some(i.size);
                        i.unlinked = false;
                    }
                    if i.lookups == 0 {
                        inodes.remove(&ino);
                    }
                }
            }
            purge
        };
        if changed && purge.is_none() {
            // Capacity accounting of what the kernel wrote directly.
            if let Err(e) = self.client.object_changed(ino).await {
                warn!("could not account passthrough writes of inode {ino}: {e}");
            }
        }
        if let Some(size) = purge {
            self.purge(ino, size).await;
        }
        commit
    }

    async fn purge(&self, ino: Ino, size: u64) {
        self.barrier().await;
        if let Err(e) = self.client.purge(ino, size).await {
            warn!("could not remove the data of unlinked inode {ino}: {e}");
        }
    }

    /// The inodes open on this node, which the metadata server must not forget when their last
    /// name goes (beyond a bound, keep every orphan and purge later).
    fn keep_open(&self) -> KeepOpen {
        let open: Vec<Ino> = self.open_inos.lock().iter().copied().take(1025).collect();
        if open.len() > 1024 {
            KeepOpen::All
        } else {
            KeepOpen::Only(open)
        }
    }

    /// After the last name of an inode went away: remove its data now, or at its last close on
    /// this node if it is open here.
    async fn orphaned(&self, u: Unlinked) {
        if !u.orphaned {
            return;
        }
        if u.purged {
            remove_purged_data(&self.client, &u).await;
            return;
        }
        let size = {
            let mut inodes = self.inodes.lock();
            match inodes.get_mut(&u.ino) {
                Some(i) if i.opens > 0 => {
                    i.unlinked = true;
                    return;
                }
                Some(i) => i.size.max(u.size),
                None => u.size,
            }
        };
        self.purge(u.ino, size).await;
    }

    /// Makes a node in `parent` and keeps this node's view of `parent` up to date.
    async fn make(
        &self,
        parent: Ino,
        name: &[u8],
        node: NewNode,
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> FsResult<Attr> {
        let is_dir = matches!(node, NewNode::Dir);
        self.barrier().await;
        match self
            .client
            .create_in(parent, name, node, perm, uid, gid)
            .await
        {
            Ok((a, dir)) => {
                self.listing_update(&dir, name, Some((a.ino, a.kind)));
                self.note_dir(dir);
                if is_dir {
                    self.listing_new(&a);
                }
                Ok(a)
            }
            Err(e) => {
                self.listing_drop(parent);
                Err(e.into())
            }
        }
    }

    /// The open half of an `O_CREAT` open that found the name taken.
    async fn open_existing(
        &self,
        parent: Ino,
        name: &[u8],
        flags: i32,
    ) -> FsResult<(Attr, u64, Option<Arc<std::fs::File>>)> {
        let mut a = self.lookup(parent, name).await?;
        let o = match self.open(a.ino).await {
            Ok(o) => o,
            Err(e) => {
                // The kernel learns of no entry: undo the lookup's reference.
                self.forget(a.ino, 1);
                return Err(e);
            }
        };
        if flags & libc::O_TRUNC != 0 && a.size > 0 {
            let set = SetAttr {
                size: Some(0),
                ..Default::default()
            };
            match self.setattr(a.ino, set).await {
                Ok(t) => a = t,
                Err(e) => {
                    let _ = self.release(o.fh).await;
                    self.forget(a.ino, 1);
                    return Err(e);
                }
            }
        }
        Ok((a, o.fh, o.backing))
    }

    /// `mknod` of a regular file: created, not opened.
    pub async fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> FsResult<Attr> {
        let a = self
            .make(parent, name, NewNode::File, perm, uid, gid)
            .await?;
        Ok(self.observe(a, true))
    }

    pub async fn mkdir(
        &self,
        parent: Ino,
        name: &[u8],
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> FsResult<Attr> {
        let a = self
            .make(parent, name, NewNode::Dir, perm, uid, gid)
            .await?;
        Ok(self.observe(a, true))
    }

    pub async fn symlink(
        &self,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> FsResult<Attr> {
        let node = NewNode::Symlink {
            target: target.to_vec(),
        };
        let a = self.make(parent, name, node, 0o777, uid, gid).await?;
        Ok(self.observe(a, true))
    }

    pub async fn link(&self, ino: Ino, new_parent: Ino, new_name: &[u8]) -> FsResult<Attr> {
        self.forget_dir(new_parent);
        self.listing_drop(new_parent);
        self.barrier().await;
        let a = self.client.link(ino, new_parent, new_name).await?;
        Ok(self.observe(a, true))
    }

    pub async fn readlink(&self, ino: Ino) -> FsResult<Vec<u8>> {
        Ok(self.client.readlink(ino).await?)
    }

    pub async fn unlink(&self, parent: Ino, name: &[u8]) -> FsResult<()> {
        if self.unlink_behind(parent, name) {
            return Ok(());
        }
        self.barrier().await;
        let (u, dir) = self
            .client
            .unlink_in(parent, name, self.keep_open())
            .await
            .inspect_err(|_| self.listing_drop(parent))?;
        self.listing_update(&dir, name, None);
        self.note_dir(dir);
        self.orphaned(u).await;
        Ok(())
    }

    pub async fn rmdir(&self, parent: Ino, name: &[u8]) -> FsResult<()> {
        self.barrier().await;
        let dir = self
            .client
            .rmdir(parent, name)
            .await
            .inspect_err(|_| self.listing_drop(parent))?;
        self.listing_update(&dir, name, None);
        // The removed directory itself may have an entry.
        self.fresh_dirs.lock().clear();
        self.note_dir(dir);
        Ok(())
    }

    pub async fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: u32,
    ) -> FsResult<()> {
        // Moves a directory's `..` and ctime too: drop every entry.
        self.fresh_dirs.lock().clear();
        self.listing_drop(parent);
        self.listing_drop(new_parent);
        self.barrier().await;
        let replaced = self
            .client
            .rename(parent, name, new_parent, new_name, flags, self.keep_open())
            .await?;
        if let Some(u) = replaced {
            self.orphaned(u).await;
        }
        Ok(())
    }

    /// Entries of directory `ino` from kernel offset `offset`: 0 starts with `.`, 1 is after
    /// `.`, 2 after `..`, and an entry's offset is its metadata cursor + 2.
    pub async fn readdir(&self, ino: Ino, offset: u64) -> FsResult<Vec<DirItem>> {
        let mut out = Vec::new();
        if offset == 0 {
            out.push(DirItem {
                ino,
                offset: 1,
                kind: FileKind::Dir,
                name: b".".to_vec(),
            });
        }
        if offset <= 1 {
            out.push(DirItem {
                ino: 1,
                offset: 2,
                kind: FileKind::Dir,
                name: b"..".to_vec(),
            });
        }
        let after = offset.saturating_sub(2);
        let (entries, _) = self.client.readdir(ino, after, READDIR_PAGE, false).await?;
        out.extend(entries.into_iter().map(|e| DirItem {
            ino: e.ino,
            offset: e.cursor + 2,
            kind: e.kind,
            name: e.name,
        }));
        Ok(out)
    }

    pub async fn statfs(&self) -> FsResult<Usage> {
        self.barrier().await;
        Ok(self.client.usage().await?)
    }

    /// `fsync` of a directory: the unlinks this node answered early are made.
    pub async fn fsyncdir(&self) -> FsResult<()> {
        self.barrier().await;
        Ok(())
    }

    /// Waits until nothing is behind (see [`Behind`]).
    async fn barrier(&self) {
        self.behind.wait_empty().await;
    }

    /// True when this node holds the lease of `parent` (listed here), asking the metadata
    /// server for it the first time.
    async fn leased(&self, parent: Ino) -> bool {
        {
            let mut listings = self.listings.lock();
            let Some(l) = self.live_listing(&mut listings, parent) else {
                return false;
            };
            match l.lease {
                LeaseState::Held => return true,
                LeaseState::No => return false,
                LeaseState::Untried => l.lease = LeaseState::No,
            }
        }
        // The server's counter is the one expected here once nothing is behind.
        self.barrier().await;
        let Some(change) = self.listings.lock().get(&parent).map(|l| l.dir.change) else {
            return false;
        };
        // A lease nobody answers recalls for would be taken away behind this node's back.
        if !self.start_recalls() {
            return false;
        }
        match self.client.lease_dir(parent, change).await {
            Ok(true) => {
                if let Some(l) = self.listings.lock().get_mut(&parent) {
                    if l.dir.change == change {
                        debug!("lease of directory {parent} granted");
                        l.lease = LeaseState::Held;
                        self.leases.lock().insert(parent);
                        return true;
                    }
                }
                // The listing changed or went meanwhile.
                let _ = self.client.release_leases(vec![parent]).await;
                false
            }
            Ok(false) => {
                debug!("lease of directory {parent} refused: creates there wait for the server");
                false
            }
            Err(e) => {
                debug!("no lease of directory {parent} ({e}): creates there wait for the server");
                false
            }
        }
    }

    /// Starts the task that answers the metadata server's lease recalls, once; false when it
    /// cannot run (no async runtime here).
    fn start_recalls(&self) -> bool {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        if self.recalls_started.swap(true, Ordering::AcqRel) {
            return true;
        }
        rt.spawn(answer_recalls(
            self.client.clone(),
            self.behind.clone(),
            self.listings.clone(),
            self.leases.clone(),
            self.listing_ttl,
        ));
        true
    }

    /// The listing of `parent`, if this node may still answer from it.
    fn live_listing<'a>(
        &self,
        listings: &'a mut HashMap<Ino, Listing>,
        parent: Ino,
    ) -> Option<&'a mut Listing> {
        listings
            .get_mut(&parent)
            .filter(|l| l.at.elapsed() < self.listing_ttl)
    }

    /// Queues `op`, a change of `l` (the listing of `parent`, locked by the caller, so the
    /// queue keeps the order of the changes); returns the directory's attributes after it.
    fn queue_behind(
        &self,
        rt: &tokio::runtime::Handle,
        l: &mut Listing,
        parent: Ino,
        op: BatchOp,
    ) -> Attr {
        // What the metadata server will make of the directory (its clock may differ a little):
        // the kernel asks for it right after.
        let now = Timestamp::now();
        l.dir.mtime = now;
        l.dir.ctime = now;
        l.dir.change += 1;
        let mut st = self.behind.state.lock();
        st.queue.push(Queued {
            op,
            parent,
            change: l.dir.change,
        });
        self.behind.count.fetch_add(1, Ordering::AcqRel);
        if !st.sender_started {
            st.sender_started = true;
            rt.spawn(send_behind(
                self.behind.clone(),
                self.client.clone(),
                self.listings.clone(),
            ));
        }
        l.dir.clone()
    }

    /// Answers an unlink at once and queues it (see [`Behind`]) when this node lists
    /// `parent`, `name` is not a directory, and its file is not open here.
    fn unlink_behind(&self, parent: Ino, name: &[u8]) -> bool {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let dir = {
            let mut listings = self.listings.lock();
            let Some(l) = self.live_listing(&mut listings, parent) else {
                return false;
            };
            let Some(&(ino, kind)) = l.names.get(name) else {
                return false;
            };
            if kind == FileKind::Dir || self.open_inos.lock().contains(&ino) {
                return false;
            }
            l.names.remove(name);
            let op = BatchOp::Unlink {
                parent,
                name: name.to_vec(),
                ino,
            };
            self.queue_behind(&rt, l, parent, op)
        };
        self.note_dir(dir);
        self.behind.work.notify_one();
        true
    }

    /// True when a create in `parent` may be made behind (it is listed here).
    fn listed(&self, parent: Ino) -> bool {
        let mut listings = self.listings.lock();
        self.live_listing(&mut listings, parent).is_some()
    }

    /// Reserves inode numbers for creates made behind if none are left.
    async fn ensure_inos(&self) {
        if !self.inos.lock().is_empty() || self.inos_refused.load(Ordering::Relaxed) {
            return;
        }
        match self.client.alloc_inodes(INODE_GRANT).await {
            Ok(first) => *self.inos.lock() = first..first + u64::from(INODE_GRANT),
            Err(e) => {
                debug!("no inode numbers reserved ({e}): creates wait for the server");
                self.inos_refused.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Makes a regular file at once and queues its creation (see [`Behind`]) when this node
    /// lists `parent`, `name` is not in it, and a reserved inode number is left.
    fn create_behind(
        &self,
        parent: Ino,
        name: &[u8],
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> Option<Attr> {
        let rt = tokio::runtime::Handle::try_current().ok()?;
        // A name the server would refuse gets its error from the server.
        surge_proto::check_name(name).ok()?;
        let (a, dir) = {
            let mut listings = self.listings.lock();
            let l = self.live_listing(&mut listings, parent)?;
            if l.names.contains_key(name) || l.names.len() >= MAX_LISTED_NAMES {
                return None;
            }
            let ino = self.inos.lock().next()?;
            let (gid, perm) =
                surge_proto::new_node_group_and_perm(&l.dir, FileKind::File, gid, perm);
            let now = Timestamp::now();
            let a = Attr {
                ino,
                kind: FileKind::File,
                perm,
                nlink: 1,
                uid,
                gid,
                size: 0,
                atime: now,
                mtime: now,
                ctime: now,
                change: 0,
            };
            l.names.insert(name.to_vec(), (ino, FileKind::File));
            let op = BatchOp::CreateFile {
                parent,
                name: name.to_vec(),
                ino,
                perm: a.perm,
                uid,
                gid,
                time: now,
            };
            let dir = self.queue_behind(&rt, l, parent, op);
            (a, dir)
        };
        self.note_dir(dir);
        self.behind.work.notify_one();
        Some(a)
    }

    /// Called when the file system is unmounted: commit what is pending.
    pub async fn shutdown(&self) {
        self.barrier().await;
        let pending: Vec<Ino> = self
            .inodes
            .lock()
            .iter()
            .filter(|(_, i)| i.dirty_mtime.is_some())
            .map(|(k, _)| *k)
            .collect();
        for ino in pending {
            if let Err(e) = self.commit(ino).await {
                warn!("unmount: could not commit inode {ino}: {e}");
            }
        }
        debug!("file system core shut down");
    }
}
