//! The metadata service of one namespace: the namespace's SQLite store, used directly by the
//! connection threads under a lock.
//!
//! Each request runs in its own transaction on the calling connection's thread. An earlier
//! design handed requests to a dedicated thread and committed them in groups; on the machines we
//! measure on, the two thread wake-ups per request cost more than the commit they saved (a
//! commit here writes the WAL to the page cache, no fsync), and metadata rates are bound by
//! round-trip latency (Daley §5.1), so the shortest path wins.

mod cache;
mod drain;
mod leases;
mod orphans;
pub use self::orphans::set_grace as set_orphan_grace;

use self::cache::Cache;
use self::drain::{held_before, wall_ms, Drain, Hold, RECORD_HOLD_EVERY};
use self::leases::{Dropped, Leases, MAX_RECALL_WAIT};
use crate::lockorder::{Level, Ordered};
use crate::meta::{self, Ops, RENAME_EXCHANGE};
use parking_lot::Condvar;
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use surge_core::{Ino, InstanceId, NamespaceId};
use surge_proto::{BatchDone, BatchOp, DrainOp, FileKind, NewNode, Unlinked};
use surge_proto::{Change, Dirs, ErrorCode, ErrorReply, Request, Response};
use tracing::{debug, error, info, warn};

/// An open metadata store. Dropping it closes the database.
pub struct Namespace {
    pub instance: InstanceId,
    pub ns: NamespaceId,
    pub dir: PathBuf,
    // The locks, one per concern, are taken in the order of their levels (crate::lockorder):
    // the store, the drainer, the leases, the cache's bookkeeping.
    conn: Ordered<Option<Connection>>,
    /// Directory leases (see [`Request::LeaseDir`]).
    leases: Ordered<Leases>,
    /// Signalled when a lease is recalled, released or dropped.
    lease_change: Condvar,
    /// Room kept on the device for this store (see [`crate::reserve`]).
    reserve: crate::reserve::Reserve,
    /// A write-behind cache namespace: every change is journaled for the drain.
    journal: bool,
    /// Cache namespaces: fill claims, open files and last uses (see [`Cache`]).
    cache: Ordered<Cache>,
    /// Nothing is evicted before this: a store reopened (a restart of the server) learns
    /// the mounts' opens only from their next reports.
    evict_after: Instant,
    /// Cache namespaces: who drains the journal (see [`Drain`]).
    drain: Ordered<Drain>,
    /// The namespace's lock service (fcntl, OFD and flock locks of every node).
    pub locks: crate::locks::LockTable,
    /// The extended attributes' share of the instance's space on this server.
    xattrs: XattrCharge,
    /// Who has which files open for writing (see [`Writers`]).
    writers: parking_lot::Mutex<Writers>,
    /// Unlinked files sessions hold open (see [`orphans`]). Taken alone.
    orphans: parking_lot::Mutex<orphans::Orphans>,
}

/// Files each client session has open for writing (`Request::OpenWrite`, a create, until a
/// `CommitWrite` with `writing` false or a `Goodbye`), and how many of the session's
/// connections to this server are open. When the last goes with files still recorded (the
/// mount crashed, was killed, or its node was lost), those files are marked
/// [`surge_proto::FL_RECOVER`]: their objects may hold acknowledged writes past the size last
/// committed, and the next open recovers it. In memory only: a restarted server knows no
/// writers (a mount that dies while its metadata server is down leaves its files as they
/// were committed). Taken alone, never while another of the namespace's locks is taken
/// after it (the store's lock may be held when it is taken).
#[derive(Default)]
struct Writers {
    files: std::collections::HashMap<u32, std::collections::HashSet<Ino>>,
    conns: std::collections::HashMap<u32, u32>,
}

/// Files recorded per session at most (a bound on the server's memory): past it, a session's
/// further files are not recorded, and the log says so when its record fills.
const MAX_WRITER_FILES: usize = 1 << 20;

impl Writers {
    fn add(&mut self, session: u32, ino: Ino, namespace: &str) {
        let files = self.files.entry(session).or_default();
        if files.len() < MAX_WRITER_FILES && files.insert(ino) && files.len() == MAX_WRITER_FILES {
            warn!(
                "namespace {namespace}: session {session:#x} has {MAX_WRITER_FILES} files open \
                 for writing; more are not recorded (a crash of that mount leaves their sizes \
                 as last committed)"
            );
        }
    }
}

/// What the namespace's extended attributes take, counted in the instance's space on this
/// server (the budget its fragments here share): a value stored in metadata is space a user
/// takes like a file's bytes, and an instance must not hold more than its capacity in either.
/// The store keeps the total (`Ops::xattr_bytes`); a `SetXattr` that would take the budget
/// past its capacity is refused with `NoSpace` before it commits, and after every change the
/// budget follows the total (so unlinks and removals give the space back). The check and the
/// data path's reservations are not one atomic step: a concurrent write may pass the capacity
/// by at most one attribute (64 KiB).
struct XattrCharge {
    budget: std::sync::Arc<crate::store::Budget>,
    counted: std::sync::atomic::AtomicU64,
}

impl XattrCharge {
    fn new(budget: std::sync::Arc<crate::store::Budget>, total: u64) -> XattrCharge {
        budget.add_used(total);
        XattrCharge {
            budget,
            counted: std::sync::atomic::AtomicU64::new(total),
        }
    }

    /// `NoSpace` when the store's new `total` would take the instance past its capacity here.
    fn admit(&self, total: u64, instance: InstanceId) -> Result<(), ErrorReply> {
        use std::sync::atomic::Ordering;
        let counted = self.counted.load(Ordering::Relaxed);
        let Some(growth) = total.checked_sub(counted).filter(|&g| g > 0) else {
            return Ok(());
        };
        let (used, capacity) = (self.budget.used(), self.budget.capacity());
        if used.saturating_add(growth) > capacity {
            return Err(ErrorReply::new(
                ErrorCode::NoSpace,
                format!(
                    "instance {instance} cannot take {} more of extended attributes on this \
                     server ({} of the {} of its space here used, {} of it by extended \
                     attributes)",
                    surge_core::format_bytes(growth),
                    surge_core::format_bytes(used),
                    surge_core::format_bytes(capacity),
                    surge_core::format_bytes(counted),
                ),
            ));
        }
        Ok(())
    }

    /// The store's total is now `total`.
    fn settle(&self, total: u64) {
        use std::sync::atomic::Ordering;
        let before = self.counted.swap(total, Ordering::Relaxed);
        if total > before {
            self.budget.add_used(total - before);
        } else {
            self.budget.sub_used(before - total);
        }
    }

    /// What the namespace takes now (reported with the instance's use).
    fn bytes(&self) -> u64 {
        self.counted.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for XattrCharge {
    fn drop(&mut self) {
        self.budget.sub_used(self.bytes());
    }
}

/// The directories whose entries `req` reads or changes ([`Request::dirs`]): a lease on any
/// of them held by another session must be recalled first.
fn dirs_touched(req: &Request, ops: &Ops<'_>) -> Vec<Ino> {
    // A removed or replaced directory: it must be empty, and only its lease holder knows.
    let dir_named = |parent: Ino, name: &[u8]| -> Option<Ino> {
        match ops.dentry(parent, name) {
            Ok(Some((ino, FileKind::Dir))) => Some(ino),
            _ => None,
        }
    };
    match req.dirs() {
        Dirs::None => Vec::new(),
        Dirs::Of(dir) => vec![dir],
        Dirs::Removing { parent, name } => {
            let mut v = vec![parent];
            v.extend(dir_named(parent, name));
            v
        }
        Dirs::Renaming {
            parent,
            new_parent,
            new_name,
        } => {
            let mut v = vec![parent, new_parent];
            v.extend(dir_named(new_parent, new_name));
            v
        }
        Dirs::Batch(batch) => {
            let mut v: Vec<Ino> = batch
                .iter()
                .flat_map(|op| match op {
                    BatchOp::Unlink { parent, .. } | BatchOp::CreateFile { parent, .. } => {
                        vec![*parent]
                    }
                    // The removed directory too: it must be empty, and only its lease holder
                    // knows.
                    BatchOp::Rmdir { parent, ino, .. } => vec![*parent, *ino],
                })
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        }
    }
}

impl Namespace {
    /// Opens the store in `dir` (created if missing).
    pub fn start(
        dir: &Path,
        instance: InstanceId,
        ns: NamespaceId,
        root: (u32, u32, u16),
        journal: bool,
        budget: std::sync::Arc<crate::store::Budget>,
    ) -> anyhow::Result<Namespace> {
        std::fs::create_dir_all(dir)?;
        let reopened = dir.join("meta.db").exists();
        let db = dir.join("meta.db");
        let conn = meta::open(&db, root.0, root.1, root.2)
            .map_err(|e| anyhow::anyhow!("{}: {e}", db.display()))?;
        let found = report_orphans(&conn, instance, ns, journal);
        let mut orphans = orphans::Orphans::default();
        if !journal && !found.is_empty() {
            // The mounts that hold some of them claim them when they wait for recalls again
            // (`ClaimOrphans`); the rest are handed out once the locks' grace is over too.
            orphans.found_at_start(found, Instant::now() + orphans::claim_period());
        }
        let xattr_total = (Ops { tx: &conn })
            .xattr_bytes()
            .map_err(|e| anyhow::anyhow!("{}: {}", dir.display(), e.message))?;
        let drainer = held_before(&conn, instance, ns);
        info!("metadata service of namespace {instance}/{} open", ns.0);
        Ok(Namespace {
            instance,
            ns,
            dir: dir.to_path_buf(),
            conn: Ordered::new(Level::Store, Some(conn)),
            leases: Ordered::new(Level::Leases, Leases::default()),
            lease_change: Condvar::new(),
            reserve: crate::reserve::Reserve::open(dir),
            journal,
            cache: Ordered::new(Level::Cache, Cache::default()),
            evict_after: Instant::now()
                + if reopened {
                    surge_proto::CACHE_OPEN_TTL
                } else {
                    Duration::ZERO
                },
            drain: Ordered::new(Level::Drain, Drain::new(drainer)),
            // A namespace opened again: the locks its mounts held are reclaimed first.
            locks: if reopened {
                crate::locks::LockTable::restarted(crate::locks::grace_period())
            } else {
                crate::locks::LockTable::default()
            },
            xattrs: XattrCharge::new(budget, xattr_total),
            writers: parking_lot::Mutex::new(Writers::default()),
            orphans: parking_lot::Mutex::new(orphans),
        })
    }

    /// A connection carried a metadata request of `session` (once per connection).
    pub fn session_connected(&self, session: u32) {
        *self.writers.lock().conns.entry(session).or_default() += 1;
    }

    /// A connection that carried `session`'s metadata requests closed. With the session's
    /// last, the files it still had open for writing are marked for recovery.
    pub fn session_disconnected(&self, session: u32) {
        let files = {
            let mut w = self.writers.lock();
            let left = match w.conns.get_mut(&session) {
                Some(n) => {
                    *n = n.saturating_sub(1);
                    *n
                }
                None => 0,
            };
            if left > 0 {
                return;
            }
            w.conns.remove(&session);
            w.files.remove(&session)
        };
        let inos: Vec<Ino> = files.into_iter().flatten().collect();
        if inos.is_empty() {
            return;
        }
        let mut guard = self.conn.lock();
        let Some(conn) = guard.as_mut() else {
            return;
        };
        let marked = conn
            .transaction()
            .map_err(|e| e.to_string())
            .and_then(|tx| {
                let n = (Ops { tx: &tx })
                    .mark_for_recovery(&inos)
                    .map_err(|e| e.message)?;
                tx.commit().map_err(|e| e.to_string())?;
                Ok(n)
            });
        match marked {
            Ok(n) => info!(
                "namespace {}/{}: session {session:#x} went with {n} file(s) open for writing; \
                 their sizes are recovered from their objects at their next open",
                self.instance, self.ns.0
            ),
            Err(e) => warn!(
                "namespace {}/{}: session {session:#x} went with {} file(s) open for writing, \
                 which could not be marked for recovery: {e}",
                self.instance,
                self.ns.0,
                inos.len()
            ),
        }
    }

    /// Records what `req` (answered `reply`) says of `session`'s files open for writing.
    fn note_writers(&self, session: u32, req: &Request, reply: &Response) {
        let name = || format!("{}/{}", self.instance, self.ns.0);
        match (req, reply) {
            (Request::OpenWrite { .. }, Response::Attr(a))
            | (Request::Tmpfile { .. }, Response::Attr(a)) => {
                self.writers.lock().add(session, a.ino, &name())
            }
            (Request::CommitWrite { ino, writing, .. }, Response::Attr(_)) if !writing => {
                if let Some(files) = self.writers.lock().files.get_mut(&session) {
                    files.remove(ino);
                }
            }
            // A file made with its final size (`surge stage`'s copies) is not recorded: its
            // size is never recovered.
            (
                Request::Create {
                    node: NewNode::File,
                    ..
                },
                Response::Created { attr, .. },
            ) => self.writers.lock().add(session, attr.ino, &name()),
            (Request::NamespaceBatch { ops, .. }, Response::BatchDone(done)) => {
                let mut w = self.writers.lock();
                for (op, r) in ops.iter().zip(done) {
                    if let (BatchOp::CreateFile { ino, .. }, Ok(_)) = (op, r) {
                        w.add(session, *ino, &name());
                    }
                }
            }
            _ => {}
        }
    }

    /// Records what `req` (answered `reply`) says of the unlinked files `session` holds open
    /// (see [`orphans`]). Not in a cache namespace, whose drain has its own rules.
    fn note_orphans(&self, session: u32, req: &Request, reply: &Response) {
        let held_open =
            |u: &Unlinked| (u.orphaned && !u.purged && u.kind == FileKind::File).then_some(u.ino);
        let (kept, gone): (Vec<Ino>, Option<Ino>) = match (req, reply) {
            (Request::Unlink { .. }, Response::Removed { unlinked, .. })
            | (
                Request::Rename { .. },
                Response::Renamed {
                    replaced: Some(unlinked),
                },
            ) => (held_open(unlinked).into_iter().collect(), None),
            (Request::NamespaceBatch { .. }, Response::BatchDone(done)) => (
                done.iter()
                    .filter_map(|r| match r {
                        Ok(BatchDone::Unlinked { unlinked, .. }) => held_open(unlinked),
                        _ => None,
                    })
                    .collect(),
                None,
            ),
            (Request::Tmpfile { .. }, Response::Attr(a)) => (vec![a.ino], None),
            (Request::Purge { ino, .. }, Response::Ok)
            | (Request::Link { ino, .. }, Response::Attr(_)) => (Vec::new(), Some(*ino)),
            _ => return,
        };
        let mut o = self.orphans.lock();
        for ino in kept {
            if !o.hold(session, ino) {
                warn!(
                    "namespace {}/{}: session {session:#x} holds {} unlinked files open; \
                     inode {ino} is not recorded (if that mount dies, its data stays until the \
                     instance is destroyed)",
                    self.instance,
                    self.ns.0,
                    orphans::MAX_HELD
                );
            }
        }
        if let Some(ino) = gone {
            o.let_go(session, ino);
        }
    }

    /// The bytes the namespace's extended attributes take (in the instance's use).
    pub fn xattr_bytes(&self) -> u64 {
        self.xattrs.bytes()
    }

    /// Runs one metadata request for client `session`; its changes are committed when this
    /// returns. A request touching a directory another session holds the lease of first has
    /// the lease recalled and waits until it is given back (or its holder is gone).
    pub fn call_as(&self, session: u32, req: Request) -> Response {
        let started = Instant::now();
        let mut told = false;
        loop {
            let mut guard = self.conn.lock();
            let Some(conn) = guard.as_mut() else {
                return Response::Error(ErrorReply::new(
                    ErrorCode::UnknownNamespace,
                    format!("namespace {}/{} is shut down", self.instance, self.ns.0),
                ));
            };
            let blocked: Vec<(Ino, u32)> = {
                let l = self.leases.lock();
                if l.held.is_empty() {
                    Vec::new()
                } else {
                    dirs_touched(&req, &Ops { tx: conn })
                        .into_iter()
                        .filter_map(|d| l.held.get(&d).map(|&h| (d, h)))
                        .filter(|&(_, h)| h != session)
                        .collect()
                }
            };
            if blocked.is_empty() {
                if let Request::LeaseDir { ino, change, .. } = req {
                    // No creates answered behind while the device is full: each must meet
                    // the full device itself.
                    return Response::Lease {
                        granted: !self.reserve.given_back()
                            && self.grant(conn, session, ino, change),
                    };
                }
                if matches!(req, Request::AllocInodes { .. }) && self.reserve.given_back() {
                    return Response::Error(ErrorReply::new(
                        ErrorCode::NoSpace,
                        format!(
                            "{}: no inode numbers for creates made behind while the device is full",
                            meta::STORE_FULL
                        ),
                    ));
                }
                if let Request::CacheFill { ino, step, .. } = req {
                    return self.fill(conn, session, ino, step, &req);
                }
                if self.journal {
                    if let Some(refused) = self.drainer_check(session, &req) {
                        return Response::Error(refused);
                    }
                    match &req {
                        Request::DrainHold { release, .. } => {
                            return self.drain_hold(conn, session, *release)
                        }
                        Request::CacheOpen { ino, .. } => {
                            return self.cache_open(conn, session, *ino)
                        }
                        Request::CacheUse {
                            open,
                            closed,
                            count,
                            ..
                        } => return self.cache_use(conn, session, open, closed, *count),
                        Request::CacheEvict { ino, want, .. } => {
                            return self.evict(conn, session, *ino, *want)
                        }
                        _ => {}
                    }
                }
                if let Request::Goodbye { .. } = req {
                    self.writers.lock().files.remove(&session);
                    return Response::Ok;
                }
                let mut reply = self.execute(conn, &req);
                // A cache namespace's files are recovered by its drain's own rules (a file's
                // size there is what its PFS copy or fill says), not from their objects.
                if session != 0 && !self.journal {
                    self.note_writers(session, &req, &reply);
                    self.note_orphans(session, &req, &reply);
                }
                if self.journal {
                    self.note_creates(session, &req, &reply);
                    if let Response::DrainBatch { entries, open, .. } = &mut reply {
                        *open = self.open_among(entries);
                    }
                }
                return reply;
            }
            drop(guard);
            if !told && started.elapsed() > Duration::from_secs(1) {
                told = true;
                info!(
                    "namespace {}/{}: a {} of session {session:#x} has waited {:?} for the \
                     lease holders of {blocked:?} (directory, session)",
                    self.instance,
                    self.ns.0,
                    req.name(),
                    started.elapsed()
                );
            }
            self.recall_and_wait(&blocked);
        }
    }

    /// A lazy-fill step of `session` (see [`surge_proto::FillStep`]): claims are kept here,
    /// the file's state in the store.
    fn fill(
        &self,
        conn: &mut Connection,
        session: u32,
        ino: Ino,
        step: surge_proto::FillStep,
        req: &Request,
    ) -> Response {
        use surge_proto::FillStep;
        let now = Instant::now();
        if matches!(step, FillStep::Claim | FillStep::Done) {
            if let Some(holder) = self.cache.lock().claimed_by_other(ino, session, now) {
                return Response::Error(ErrorReply::new(
                    ErrorCode::Busy,
                    format!(
                        "inode {ino} is being copied from the PFS into the fast tier by \
                         another mount (session {holder:#x})"
                    ),
                ));
            }
        }
        let reply = self.execute(conn, req);
        match (&reply, step) {
            // Copied into the tier: a use (it goes to the back of the eviction order).
            (Response::Fill { through: 0 }, FillStep::Done) => self.cache.lock().uses.used(ino),
            // The fill before the job made it (a create, which counts as an open) and is
            // done with it.
            (Response::Fill { .. }, FillStep::Mark { .. }) => {
                let mut cache = self.cache.lock();
                let uses = &mut cache.uses;
                uses.closed(session, ino);
                uses.last.remove(&ino);
            }
            _ => {}
        }
        let mut cache = self.cache.lock();
        let fills = &mut cache.fills;
        match (&reply, step) {
            (Response::Fill { through }, FillStep::Claim)
                if *through == surge_proto::THROUGH_FILL =>
            {
                fills.insert(ino, (session, now));
            }
            (Response::Fill { .. }, FillStep::Mark { .. }) | (Response::Error(_), _) => {}
            _ => {
                if fills.get(&ino).is_some_and(|&(h, _)| h == session) || step == FillStep::Claim {
                    fills.remove(&ino);
                }
            }
        }
        cache.forget_lapsed_claims(now);
        reply
    }

    /// `CacheOpen`: the attributes of `ino`, its open by `session` recorded (under the store's
    /// lock, so an eviction sees either the open or, for an open after it, the file evicted).
    fn cache_open(&self, conn: &mut Connection, session: u32, ino: Ino) -> Response {
        let reply = match (Ops { tx: conn }).getattr(ino) {
            Ok(a) => Response::Attr(a),
            Err(e) => return Response::Error(e),
        };
        self.cache.lock().uses.opened(session, ino, Instant::now());
        reply
    }

    /// Files a mount creates are open on it (until it reports them closed).
    fn note_creates(&self, session: u32, req: &Request, reply: &Response) {
        let now = Instant::now();
        match (req.change(), reply) {
            (
                Change::Create {
                    node: NewNode::File | NewNode::SizedFile { .. },
                    ..
                },
                Response::Created { attr, .. },
            ) => self.cache.lock().uses.opened(session, attr.ino, now),
            (Change::Batch(ops), Response::BatchDone(done)) => {
                let mut cache = self.cache.lock();
                let uses = &mut cache.uses;
                for (op, r) in ops.iter().zip(done) {
                    if let (BatchOp::CreateFile { ino, .. }, Ok(_)) = (op, r) {
                        uses.opened(session, *ino, now);
                    }
                }
            }
            _ => {}
        }
    }

    /// The files a mount has open.
    fn open_files(&self) -> Vec<Ino> {
        let now = Instant::now();
        let mut cache = self.cache.lock();
        let uses = &mut cache.uses;
        let all: Vec<Ino> = uses.open.keys().copied().collect();
        all.into_iter()
            .filter(|ino| uses.is_open(*ino, now))
            .collect()
    }

    /// The files whose data `entries` copy that a mount has open.
    fn open_among(&self, entries: &[surge_proto::DrainEntry]) -> Vec<Ino> {
        let now = Instant::now();
        let mut cache = self.cache.lock();
        let uses = &mut cache.uses;
        let mut open: Vec<Ino> = entries
            .iter()
            .filter_map(|e| match e.op {
                DrainOp::Data { ino, .. } => Some(ino),
                _ => None,
            })
            .filter(|ino| uses.is_open(*ino, now))
            .collect();
        open.sort_unstable();
        open.dedup();
        open
    }

    /// `CacheUse`: a mount's report of its opens and closes; replies with how far the drain
    /// got and, with `count`, the dirty data.
    fn cache_use(
        &self,
        conn: &mut Connection,
        session: u32,
        open: &[Ino],
        closed: &[Ino],
        count: bool,
    ) -> Response {
        let now = Instant::now();
        let (files, oldest) = match (Ops { tx: conn }).dirty_files(count) {
            Ok(d) => d,
            Err(e) => return Response::Error(e),
        };
        let mut cache = self.cache.lock();
        let uses = &mut cache.uses;
        for &ino in closed {
            uses.closed(session, ino);
        }
        for &ino in open {
            // A renewal, not a use: the file's place in the eviction order stays.
            uses.open.entry(ino).or_default().insert(session, now);
        }
        let mut dirty = 0u64;
        let mut dirty_closed = 0u64;
        for (ino, size) in files {
            dirty = dirty.saturating_add(size);
            if !uses.is_open(ino, now) {
                dirty_closed = dirty_closed.saturating_add(size);
            }
        }
        Response::CacheState {
            dirty,
            dirty_closed,
            oldest,
        }
    }

    /// `Busy` for a `DrainPoll` taking entries or a `DrainAck` of a session while another
    /// holds the drainer hold (see [`Request::DrainHold`]).
    fn drainer_check(&self, session: u32, req: &Request) -> Option<ErrorReply> {
        let takes = match req {
            Request::DrainPoll { max, .. } => *max > 0,
            Request::DrainAck { .. } => true,
            _ => false,
        };
        if !takes {
            return None;
        }
        match self.drain.lock().hold {
            Some(hold) if hold.bars(session) => Some(self.drain_busy(&hold)),
            _ => None,
        }
    }

    /// The refusal for another session while `hold` stands.
    fn drain_busy(&self, hold: &Hold) -> ErrorReply {
        let holder = hold.session;
        if hold.inherited {
            let left = surge_proto::DRAIN_HOLD.saturating_sub(hold.at.elapsed());
            return ErrorReply::new(
                ErrorCode::Again,
                format!(
                    "namespace {}/{}: drainer session {holder:#x} held this cache's journal \
                     when the server restarted and has not come back yet; its hold lapses in \
                     {:.1} s unless it does",
                    self.instance,
                    self.ns.0,
                    left.as_secs_f64()
                ),
            );
        }
        ErrorReply::new(
            ErrorCode::Busy,
            format!(
                "namespace {}/{}: another drainer (session {holder:#x}) drains this cache's \
                 journal; one drainer at a time keeps the PFS in the journal's order",
                self.instance, self.ns.0
            ),
        )
    }

    /// `DrainHold` (see [`Request::DrainHold`]).
    /// The hold is also kept in the store: a restarted server keeps it until it lapses, so a
    /// drainer that started while the holder's connections were down (the server restarting)
    /// does not drain beside it; the holder, reconnected with its session, renews it.
    fn drain_hold(&self, conn: &mut Connection, session: u32, release: bool) -> Response {
        let mut drain = self.drain.lock();
        let d = &mut drain.hold;
        if let Some(hold) = d.as_ref().filter(|h| h.bars(session)) {
            if release {
                return Response::Ok;
            }
            return Response::Error(self.drain_busy(hold));
        }
        let now = Instant::now();
        // The store is written when the hold changes hands or ends, and by renewals only
        // every RECORD_HOLD_EVERY.
        let renewal = d
            .as_ref()
            .filter(|h| !release && h.session == session && !h.inherited)
            .map(|h| h.recorded);
        let recorded = match renewal {
            Some(at) if now.duration_since(at) < RECORD_HOLD_EVERY => at,
            _ => {
                let kept =
                    (Ops { tx: conn }).set_drain_hold((!release).then_some((session, wall_ms())));
                if let Err(e) = kept {
                    // Held in memory all the same: only a restart within the hold forgets it.
                    warn!(
                        "namespace {}/{}: cannot record the drainer's hold: {}",
                        self.instance, self.ns.0, e.message
                    );
                }
                now
            }
        };
        *d = (!release).then_some(Hold {
            session,
            at: now,
            recorded,
            inherited: false,
        });
        Response::Ok
    }

    /// A connection of `session` carries drain requests (once per connection).
    pub fn drain_connection_opened(&self, session: u32) {
        self.drain.lock().connection_opened(session);
    }

    /// A connection of `session` that carried drain requests closed: with its last one, the
    /// session's drainer is gone, and so is its hold.
    pub fn drain_connection_closed(&self, session: u32) {
        if !self.drain.lock().connection_closed(session) {
            return;
        }
        info!(
            "namespace {}/{}: drainer session {session:#x} closed; its hold of the journal is \
             given back",
            self.instance, self.ns.0
        );
        // Nor does a restart keep it (unless another session took the hold meanwhile).
        if let Some(c) = self.conn.lock().as_mut() {
            let ops = Ops { tx: c };
            if ops
                .drain_hold()
                .ok()
                .flatten()
                .is_some_and(|(s, _)| s == session)
            {
                let _ = ops.set_drain_hold(None);
            }
        }
    }

    /// `CacheEvict`: marks clean files least recently used first, none open, until they hold
    /// `want` bytes, and gives `session` their fill claims (it removes their objects, then
    /// releases each). See [`Request::CacheEvict`].
    fn evict(&self, conn: &mut Connection, session: u32, except: Ino, want: u64) -> Response {
        let now = Instant::now();
        if now < self.evict_after {
            debug!(
                "namespace {}/{}: no eviction in the first {} s after a restart (the mounts' \
                 opens are not all known yet)",
                self.instance,
                self.ns.0,
                surge_proto::CACHE_OPEN_TTL.as_secs()
            );
            return Response::Evicted(Vec::new());
        }
        let result = (|| -> rusqlite::Result<Result<Vec<surge_proto::Attr>, ErrorReply>> {
            let tx = conn.transaction()?;
            let ops = Ops { tx: &tx };
            let clean = match ops.clean_files(except) {
                Ok(c) => c,
                Err(e) => return Ok(Err(e)),
            };
            let mut cache = self.cache.lock();
            let clean = cache.evictable(clean, now);
            let mut out = Vec::new();
            let mut freed = 0u64;
            for (ino, size) in clean {
                if freed >= want {
                    break;
                }
                match ops.evict(ino) {
                    Ok(a) => out.push(a),
                    Err(e) => return Ok(Err(e)),
                }
                freed = freed.saturating_add(size);
            }
            tx.commit()?;
            for a in &out {
                cache.evicted(a.ino, session, now);
            }
            Ok(Ok(out))
        })();
        match result {
            Ok(Ok(files)) => {
                if !files.is_empty() {
                    info!(
                        "namespace {}/{}: {} clean file(s) of {} bytes evicted from the fast \
                         tier for inode {except} (session {session:#x})",
                        self.instance,
                        self.ns.0,
                        files.len(),
                        files.iter().map(|a| a.size).sum::<u64>()
                    );
                }
                Response::Evicted(files)
            }
            Ok(Err(e)) => Response::Error(e),
            Err(e) if meta::is_full(&e) => Response::Error(ErrorReply::new(
                ErrorCode::NoSpace,
                format!("{}: {e}", meta::STORE_FULL),
            )),
            Err(e) => Response::Error(ErrorReply::new(
                ErrorCode::Io,
                format!("metadata store: {e}"),
            )),
        }
    }

    /// Grants the lease of `dir` to `session` if nobody changed the directory since the
    /// session saw change counter `change` and no other session holds it.
    fn grant(&self, conn: &Connection, session: u32, dir: Ino, change: u64) -> bool {
        if session == 0 {
            return false;
        }
        let ok = matches!(Ops { tx: conn }.getattr(dir),
            Ok(a) if a.kind == FileKind::Dir && a.change == change);
        ok && self.leases.lock().grant(dir, session, Instant::now())
    }

    /// Asks the holders of `blocked` leases to give them back and waits a little for it;
    /// leases of holders that are gone, or that did not answer within [`RECALL_LIMIT`], are
    /// dropped.
    fn recall_and_wait(&self, blocked: &[(Ino, u32)]) {
        let mut l = self.leases.lock();
        for d in l.recall(blocked, Instant::now()) {
            match d {
                Dropped::Gone { holder } => warn!(
                    "namespace {}/{}: session {holder:#x} stopped waiting for recalls; its \
                     leases are dropped",
                    self.instance, self.ns.0
                ),
                Dropped::Unanswered { holder, dir } => warn!(
                    "namespace {}/{}: session {holder:#x} did not give directory {dir} back \
                     within {:?}; the lease is dropped",
                    self.instance,
                    self.ns.0,
                    leases::RECALL_LIMIT
                ),
            }
        }
        self.lease_change.notify_all();
        l.wait_until(
            &self.lease_change,
            Instant::now() + Duration::from_millis(100),
        );
    }

    /// Waits up to `wait_ms` for recalls of `session`'s leases; returns the directories, and
    /// the unlinked files of mounts that went which `session` is to remove the data of (see
    /// [`orphans`]; already forgotten here).
    pub fn wait_recall(&self, session: u32, wait_ms: u32) -> (Vec<Ino>, Vec<Unlinked>) {
        if session == 0 {
            return (Vec::new(), Vec::new());
        }
        self.orphans.lock().waits(session);
        let deadline =
            Instant::now() + Duration::from_millis(u64::from(wait_ms)).min(MAX_RECALL_WAIT);
        let mut l = self.leases.lock();
        l.wait_begins(session);
        let out = loop {
            let pending = l.pending(session);
            if !pending.is_empty() {
                break pending;
            }
            if l.wait_until(&self.lease_change, deadline) {
                break Vec::new();
            }
        };
        l.wait_ends(session, Instant::now());
        drop(l);
        (out, self.hand_out_orphans(session))
    }

    /// Takes the abandoned unlinked files (see [`orphans`]) for `session`: forgets each one
    /// that still has no name and returns them, for the caller to remove their objects.
    fn hand_out_orphans(&self, session: u32) -> Vec<Unlinked> {
        let inos = self
            .orphans
            .lock()
            .take(session, Instant::now(), orphans::grace());
        if inos.is_empty() {
            return Vec::new();
        }
        let mut guard = self.conn.lock();
        let Some(conn) = guard.as_mut() else {
            return Vec::new();
        };
        let purged = conn
            .transaction()
            .map_err(|e| e.to_string())
            .and_then(|tx| {
                let ops = Ops { tx: &tx };
                let mut out = Vec::new();
                for &ino in &inos {
                    if let Some(a) = ops.purge_orphan(ino).map_err(|e| e.message)? {
                        out.push(Unlinked {
                            ino,
                            kind: a.kind,
                            orphaned: true,
                            size: a.size,
                            purged: true,
                        });
                    }
                }
                tx.commit().map_err(|e| e.to_string())?;
                Ok(out)
            });
        drop(guard);
        match purged {
            Ok(out) => {
                if !out.is_empty() {
                    info!(
                        "namespace {}/{}: {} unlinked file(s) of {} bytes, left open by a mount \
                         that went, forgotten; session {session:#x} removes their data",
                        self.instance,
                        self.ns.0,
                        out.len(),
                        out.iter().map(|u| u.size).sum::<u64>()
                    );
                }
                out
            }
            Err(e) => {
                warn!(
                    "namespace {}/{}: cannot forget {} unlinked file(s) a mount that went left \
                     open: {e}; tried again at the next recall wait",
                    self.instance,
                    self.ns.0,
                    inos.len()
                );
                self.orphans.lock().give_back(&inos);
                Vec::new()
            }
        }
    }

    /// `session` holds `inos` open, unlinked (see [`orphans`]): those this server found with no
    /// name at start are kept for it. Returns the abandoned ones it is to remove the objects of
    /// (forgotten here).
    pub fn claim_orphans(&self, session: u32, inos: &[Ino]) -> Result<Vec<Unlinked>, ErrorReply> {
        if inos.len() > surge_proto::MAX_CLAIMED {
            return Err(ErrorReply::new(
                ErrorCode::Invalid,
                format!(
                    "ClaimOrphans names {} inodes; at most {}",
                    inos.len(),
                    surge_proto::MAX_CLAIMED
                ),
            ));
        }
        if session == 0 || self.journal {
            return Ok(Vec::new());
        }
        let n = self.orphans.lock().claim(session, inos);
        if n > 0 {
            info!(
                "namespace {}/{}: session {session:#x} holds {n} of the unlinked files found at \
                 start open; they are kept for it",
                self.instance, self.ns.0
            );
        }
        Ok(self.hand_out_orphans(session))
    }

    /// Takes leases of `session` back.
    pub fn release_leases(&self, session: u32, dirs: &[Ino]) {
        self.leases.lock().release(session, dirs);
        self.lease_change.notify_all();
    }

    /// The connection `session` waited for recalls on closed (its mount went): its leases go
    /// unless it waits on another connection.
    pub fn recall_connection_closed(&self, session: u32) {
        let dropped = self.leases.lock().connection_closed(session);
        if dropped.is_some() {
            let mut o = self.orphans.lock();
            o.went_silent(session, Instant::now());
            let n = o.held_by(session);
            drop(o);
            if n > 0 {
                info!(
                    "namespace {}/{}: session {session:#x} stopped waiting for recalls with {n} \
                     unlinked file(s) open; their data goes if it does not come back within {:?}",
                    self.instance,
                    self.ns.0,
                    orphans::grace()
                );
            }
        }
        if dropped == Some(true) {
            info!(
                "namespace {}/{}: session {session:#x} closed; its directory leases are dropped",
                self.instance, self.ns.0
            );
        }
        self.lease_change.notify_all();
    }

    fn execute(&self, conn: &mut Connection, req: &Request) -> Response {
        // A switch to writing through moves the copies of the files open elsewhere after it
        // (`Ops::cache_through`).
        let open = match req {
            Request::CacheThrough { .. } if self.journal => self.open_files(),
            _ => Vec::new(),
        };
        let space = (self.instance, &self.xattrs);
        let mut result = run(conn, req, self.journal, &open, space);
        // The device is full: give the reserve back and commit with its room (what a mount
        // acknowledged must not be lost for want of a few pages).
        if store_full(&result) && self.reserve.release() {
            result = run(conn, req, self.journal, &open, space);
        } else if !read_only(req) {
            self.reserve.retake_if_room();
        }
        match result {
            Ok(r) => r,
            Err(e) if meta::is_full(&e) => Response::Error(ErrorReply::new(
                ErrorCode::NoSpace,
                format!("{}: {e}", meta::STORE_FULL),
            )),
            Err(e) => {
                error!(
                    "namespace {}/{}: metadata transaction failed: {e}",
                    self.instance, self.ns.0
                );
                Response::Error(ErrorReply::new(
                    ErrorCode::Io,
                    format!("metadata store: {e}"),
                ))
            }
        }
    }

    /// Closes the store; later requests get `UnknownNamespace`.
    pub fn stop(&self) {
        self.conn.lock().take();
    }
}

/// Logs the inodes with no name left that hold data (a mount went, or this server stopped,
/// before their last close) and returns them.
fn report_orphans(
    conn: &Connection,
    instance: InstanceId,
    ns: NamespaceId,
    journal: bool,
) -> Vec<Ino> {
    let ops = Ops { tx: conn };
    match ops.orphans() {
        Ok(o) if !o.is_empty() => {
            let fate = if journal {
                "their objects are kept until the instance is destroyed".to_string()
            } else {
                format!(
                    "mounts that hold them open claim them as they reconnect, and the others' \
                     data is removed by the next mount that waits for recalls after {:?}",
                    orphans::claim_period()
                )
            };
            warn!(
                "namespace {instance}/{}: {} unlinked inodes still hold data (a client stopped \
                 before closing them, or this server did); {fate}",
                ns.0,
                o.len()
            );
            o.into_iter().map(|(ino, _)| ino).collect()
        }
        Ok(_) => Vec::new(),
        Err(e) => {
            warn!("namespace {instance}/{}: cannot list orphans: {e}", ns.0);
            Vec::new()
        }
    }
}

/// True when a request failed because the store's device is full.
fn store_full(r: &rusqlite::Result<Response>) -> bool {
    match r {
        Err(e) => meta::is_full(e),
        Ok(Response::Error(e)) => {
            e.code == ErrorCode::NoSpace && e.message.starts_with(meta::STORE_FULL)
        }
        Ok(_) => false,
    }
}

/// A change of a cache namespace as the drain replays it, with the paths it had before the
/// change (a rename or unlink moves them): computed before the request runs.
enum Pending {
    Op(DrainOp),
    /// Made once the request succeeded (a create's kind, a batch's results).
    Create {
        path: Vec<u8>,
    },
    Batch(Vec<Option<DrainOp>>),
    /// Journaled in order once the request succeeded.
    Ops(Vec<DrainOp>),
    Nothing,
}

fn journal_before(ops: &Ops<'_>, req: &Request) -> Result<Pending, ErrorReply> {
    let child = |p: Ino, n: &[u8]| ops.child_path(p, n);
    Ok(match req.change() {
        Change::None => Pending::Nothing,
        Change::Create { parent, name, .. } => match child(parent, name)? {
            Some(path) => Pending::Create { path },
            None => Pending::Nothing,
        },
        Change::Link {
            ino,
            new_parent,
            new_name,
        } => match (ops.path_of(ino)?, child(new_parent, new_name)?) {
            (Some(from), Some(to)) => Pending::Op(DrainOp::Link { from, to }),
            // The first name of an `O_TMPFILE` file: on the PFS it is made, filled and given
            // its attributes, as a file made there with its data.
            (None, Some(path)) if ops.is_unnamed(ino)? => Pending::Ops(vec![
                DrainOp::Create { path: path.clone() },
                DrainOp::Data {
                    ino,
                    path: path.clone(),
                },
                DrainOp::Attr { ino, path },
            ]),
            _ => Pending::Nothing,
        },
        Change::Unlink { parent, name } => match child(parent, name)? {
            Some(path) => Pending::Op(DrainOp::Unlink { path, gone: None }),
            None => Pending::Nothing,
        },
        Change::Rmdir { parent, name } => match child(parent, name)? {
            Some(path) => Pending::Op(DrainOp::Rmdir { path }),
            None => Pending::Nothing,
        },
        Change::Rename {
            parent,
            name,
            new_parent,
            new_name,
            flags,
        } if flags & RENAME_EXCHANGE != 0 => {
            // The drain replays it as three renames through a third name beside the first
            // (the PFS may have no atomic exchange; it may be seen half done there, as any
            // change not yet drained is not seen at all).
            match (child(parent, name)?, child(new_parent, new_name)?) {
                (Some(a), Some(b)) => {
                    let ino = ops.lookup(parent, name)?.ino;
                    let mut tmp = match a.iter().rposition(|&c| c == b'/') {
                        Some(i) => a[..=i].to_vec(),
                        None => Vec::new(),
                    };
                    tmp.extend_from_slice(format!(".surge-exchange-{ino}").as_bytes());
                    let rename = |from: &[u8], to: &[u8]| DrainOp::Rename {
                        from: from.to_vec(),
                        to: to.to_vec(),
                        gone: None,
                    };
                    Pending::Ops(vec![rename(&a, &tmp), rename(&b, &a), rename(&tmp, &b)])
                }
                _ => Pending::Nothing,
            }
        }
        Change::Rename {
            parent,
            name,
            new_parent,
            new_name,
            ..
        } => match (child(parent, name)?, child(new_parent, new_name)?) {
            (Some(from), Some(to)) => Pending::Op(DrainOp::Rename {
                from,
                to,
                gone: None,
            }),
            _ => Pending::Nothing,
        },
        Change::Attr { ino } => match ops.path_of(ino)? {
            Some(path) => Pending::Op(DrainOp::Attr { ino, path }),
            None => Pending::Nothing,
        },
        Change::Data { ino } => match ops.path_of(ino)? {
            Some(path) => Pending::Op(DrainOp::Data { ino, path }),
            None => Pending::Nothing,
        },
        Change::Batch(batch) => Pending::Batch(
            batch
                .iter()
                .map(|op| match op {
                    BatchOp::Unlink { parent, name, .. } => child(*parent, name)
                        .map(|p| p.map(|path| DrainOp::Unlink { path, gone: None })),
                    BatchOp::CreateFile { parent, name, .. } => {
                        child(*parent, name).map(|p| p.map(|path| DrainOp::Create { path }))
                    }
                    BatchOp::Rmdir { parent, name, .. } => {
                        child(*parent, name).map(|p| p.map(|path| DrainOp::Rmdir { path }))
                    }
                })
                .collect::<Result<_, _>>()?,
        ),
    })
}

fn journal_after(
    ops: &Ops<'_>,
    req: &Request,
    pending: Pending,
    reply: &Response,
) -> Result<(), ErrorReply> {
    // The inode whose last name the change removed (its fill name on the PFS goes too).
    let gone =
        |u: &surge_proto::Unlinked| (u.orphaned && u.kind == FileKind::File).then_some(u.ino);
    match pending {
        Pending::Nothing => Ok(()),
        Pending::Op(DrainOp::Unlink { path, .. }) => ops.journal(&DrainOp::Unlink {
            path,
            gone: match reply {
                Response::Removed { unlinked, .. } => gone(unlinked),
                _ => None,
            },
        }),
        Pending::Op(DrainOp::Rename { from, to, .. }) => ops.journal(&DrainOp::Rename {
            from,
            to,
            gone: match reply {
                Response::Renamed {
                    replaced: Some(u), ..
                } => gone(u),
                _ => None,
            },
        }),
        Pending::Op(op) => ops.journal(&op),
        Pending::Ops(each) => each.iter().try_for_each(|op| ops.journal(op)),
        Pending::Create { path } => match req.change() {
            Change::Create { node, .. } => match node {
                NewNode::Dir | NewNode::File => {
                    let ino = match reply {
                        Response::Created { attr, .. } => Some(attr.ino),
                        _ => None,
                    };
                    if matches!(node, NewNode::Dir) {
                        journal_made(ops, DrainOp::Mkdir { path: path.clone() }, ino, path)
                    } else {
                        journal_made(ops, DrainOp::Create { path: path.clone() }, ino, path)
                    }
                }
                NewNode::Symlink { target } => ops.journal(&DrainOp::Symlink {
                    path,
                    target: target.clone(),
                }),
                NewNode::SizedFile { .. } => {
                    ops.journal(&DrainOp::Create { path: path.clone() })?;
                    match reply {
                        Response::Created { attr, .. } => ops.journal(&DrainOp::Data {
                            ino: attr.ino,
                            path,
                        }),
                        _ => Ok(()),
                    }
                }
                // FIFOs, sockets and devices stay on the fast tier.
                NewNode::Special { .. } => Ok(()),
            },
            _ => Ok(()),
        },
        Pending::Batch(each) => {
            let Response::BatchDone(results) = reply else {
                return Ok(());
            };
            let made = |i: usize| match req.change() {
                Change::Batch(batch) => match batch.get(i) {
                    Some(BatchOp::CreateFile { ino, .. }) => Some(*ino),
                    _ => None,
                },
                _ => None,
            };
            for (i, (op, r)) in each.into_iter().zip(results).enumerate() {
                match (op, r) {
                    (
                        Some(DrainOp::Unlink { path, .. }),
                        Ok(surge_proto::BatchDone::Unlinked { unlinked, .. }),
                    ) => ops.journal(&DrainOp::Unlink {
                        path,
                        gone: gone(unlinked),
                    })?,
                    // A file made behind, as a `Create`.
                    (Some(DrainOp::Create { path }), Ok(_)) => {
                        journal_made(ops, DrainOp::Create { path: path.clone() }, made(i), path)?
                    }
                    (Some(op), Ok(_)) => ops.journal(&op)?,
                    _ => {}
                }
            }
            Ok(())
        }
    }
}

/// Journals the making of a directory or file (`op`) and, when its inode is known, its mode
/// and times (an `Attr` entry): the drain's mkdir or create would take its own umask's; a
/// file with data gets them again with its copy.
fn journal_made(
    ops: &Ops<'_>,
    op: DrainOp,
    ino: Option<Ino>,
    path: Vec<u8>,
) -> Result<(), ErrorReply> {
    ops.journal(&op)?;
    match ino {
        Some(ino) => ops.journal(&DrainOp::Attr { ino, path }),
        None => Ok(()),
    }
}

/// Runs `req`, journaling what it changed when `journal` (a cache namespace), in the same
/// transaction: a change is acknowledged only with its journal entry.
/// `open`: for a `CacheThrough`, the files the mounts have open (see `Ops::cache_through`).
fn execute_journaled(
    ops: &Ops<'_>,
    req: &Request,
    journal: bool,
    open: &[Ino],
) -> Result<Response, ErrorReply> {
    match (req, journal) {
        (
            Request::DrainPoll { .. }
            | Request::DrainAck { .. }
            | Request::CacheThrough { .. }
            | Request::CacheFill { .. }
            | Request::CacheOpen { .. }
            | Request::CacheUse { .. }
            | Request::CacheEvict { .. }
            | Request::DrainHold { .. },
            false,
        ) => Err(ErrorReply::new(
            ErrorCode::Invalid,
            "this namespace is not a cache (type=cache) namespace: it has no drain journal",
        )),
        (Request::DrainPoll { after, max, .. }, true) => {
            let (entries, progress) = ops.drain_poll(*after, (*max).min(4096))?;
            Ok(Response::DrainBatch {
                entries,
                pending: progress.pending,
                oldest: progress.oldest,
                oldest_entry: progress.oldest_entry,
                newest: progress.newest,
                open: Vec::new(),
            })
        }
        (Request::CacheThrough { ino, .. }, true) => Ok(Response::Through {
            seq: ops.cache_through(*ino, open)?,
        }),
        (Request::CacheFill { ino, step, .. }, true) => Ok(Response::Fill {
            through: ops.cache_fill(*ino, *step)?,
        }),
        (Request::DrainAck { upto, linked, .. }, true) => {
            ops.drain_ack(*upto, linked)?;
            Ok(Response::Ok)
        }
        (_, false) => execute(ops, req),
        (_, true) => {
            let pending = journal_before(ops, req)?;
            let reply = execute(ops, req)?;
            journal_after(ops, req, pending, &reply)?;
            Ok(reply)
        }
    }
}

fn execute(ops: &Ops<'_>, req: &Request) -> Result<Response, ErrorReply> {
    Ok(match req {
        Request::Lookup { parent, name, .. } => Response::Attr(ops.lookup(*parent, name)?),
        Request::GetAttr { ino, .. } => Response::Attr(ops.getattr(*ino)?),
        Request::SetAttr { ino, set, .. } => Response::Attr(ops.setattr(*ino, set)?),
        Request::Accessed { ino, strict, .. } => Response::Attr(ops.accessed(*ino, *strict)?),
        Request::AllocatedPastEnd { ino, .. } => Response::Attr(ops.allocated_past_end(*ino)?),
        Request::Create {
            parent,
            name,
            node,
            perm,
            umask,
            uid,
            gid,
            layout,
            ..
        } => {
            let made =
                ops.create_with_layout(*parent, name, node, (*perm, *uid, *gid), *umask, *layout)?;
            Response::Created {
                attr: made.attr,
                parent: made.parent,
                inherited: made.inherited,
            }
        }
        Request::Link {
            ino,
            new_parent,
            new_name,
            ..
        } => Response::Attr(ops.link(*ino, *new_parent, new_name)?),
        Request::Tmpfile {
            dir,
            perm,
            umask,
            uid,
            gid,
            layout,
            ..
        } => Response::Attr(ops.tmpfile(*dir, (*perm, *uid, *gid), *umask, *layout)?),
        Request::Unlink {
            parent, name, keep, ..
        } => {
            let (unlinked, parent) = ops.unlink_returning_parent(*parent, name, keep)?;
            Response::Removed { unlinked, parent }
        }
        Request::Rmdir { parent, name, .. } => Response::DirChanged(ops.rmdir(*parent, name)?),
        Request::Rename {
            parent,
            name,
            new_parent,
            new_name,
            flags,
            keep,
            ..
        } => Response::Renamed {
            replaced: ops.rename(*parent, name, *new_parent, new_name, *flags, keep)?,
        },
        Request::Readlink { ino, .. } => Response::Target(ops.readlink(*ino)?),
        Request::ReadDir {
            ino,
            after,
            max,
            plus,
            ..
        } => {
            let (entries, done, dir) = ops.readdir(*ino, *after, *max, *plus)?;
            let default_acl = ops.has_default_acl(*ino)?;
            Response::Dir {
                entries,
                done,
                dir,
                default_acl,
            }
        }
        Request::CommitWrite {
            ino, size, mtime, ..
        } => Response::Attr(ops.commit_write(*ino, *size, *mtime)?),
        Request::Append { ino, len, .. } => {
            let (offset, attr) = ops.append(*ino, *len)?;
            Response::Appended { offset, attr }
        }
        Request::Purge { ino, .. } => {
            ops.purge(*ino)?;
            Response::Ok
        }
        Request::NamespaceBatch { ops: batch, .. } => {
            Response::BatchDone(ops.namespace_batch(batch)?)
        }
        Request::AllocInodes { count, .. } => Response::Inodes {
            first: ops.alloc_inodes(*count)?,
            count: *count,
        },
        Request::NamespaceStats { .. } => Response::NamespaceStats {
            inodes: ops.inode_count()?,
        },
        Request::GetXattr { ino, name, .. } => Response::Xattr(ops.get_xattr(*ino, name)?),
        Request::ListXattr { ino, .. } => Response::XattrNames(ops.list_xattr(*ino)?),
        Request::SetXattr {
            ino,
            name,
            value,
            flags,
            ..
        } => Response::Attr(ops.set_xattr(*ino, name, value, *flags)?),
        Request::RemoveXattr { ino, name, .. } => Response::Attr(ops.remove_xattr(*ino, name)?),
        Request::SetLayout { ino, layout, .. } => Response::Attr(ops.set_layout(*ino, *layout)?),
        // The writer is recorded by `Namespace::call_as`.
        Request::OpenWrite { ino, atime, .. } => Response::Attr(match atime {
            Some(strict) => ops.accessed(*ino, *strict)?,
            None => ops.getattr(*ino)?,
        }),
        Request::Recovered { ino, size, .. } => Response::Attr(ops.recovered(*ino, *size)?),
        // Answered before a transaction: leases and locks by the connection or
        // `Namespace::call_as`, the cache's bookkeeping by `call_as`, the drain by
        // `execute_journaled`.
        Request::LeaseDir { .. }
        | Request::WaitRecall { .. }
        | Request::ClaimOrphans { .. }
        | Request::ReleaseLeases { .. }
        | Request::Lock { .. }
        | Request::CacheOpen { .. }
        | Request::CacheUse { .. }
        | Request::CacheEvict { .. }
        | Request::DrainHold { .. }
        | Request::DrainPoll { .. }
        | Request::DrainAck { .. }
        | Request::CacheThrough { .. }
        | Request::CacheFill { .. }
        | Request::Goodbye { .. }
        // Not for a namespace.
        | Request::Status
        | Request::Authenticate { .. }
        | Request::CreateFragment { .. }
        | Request::DestroyFragment { .. }
        | Request::CreateNamespace { .. }
        | Request::DestroyNamespace { .. }
        | Request::Describe { .. }
        | Request::Write { .. }
        | Request::AppendObject { .. }
        | Request::Read { .. }
        | Request::TruncateObject { .. }
        | Request::RemoveObject { .. }
        | Request::SyncObject { .. }
        | Request::FragmentUsage { .. }
        | Request::LocalObject { .. }
        | Request::LocalFragment { .. }
        | Request::ObjectChanged { .. }
        | Request::AllocateObject { .. }
        | Request::ObjectAllocated { .. }
        | Request::ObjectLength { .. }
        | Request::SeekObject { .. } => {
            return Err(ErrorReply::new(
                ErrorCode::Invalid,
                format!(
                    "{} is not answered by a metadata transaction",
                    req.name()
                ),
            ))
        }
    })
}

/// Whether `req` changes nothing stored: its kind's fact, and an `OpenWrite` that moves no
/// atime (its writer is recorded in memory).
fn read_only(req: &Request) -> bool {
    req.facts().read_only || matches!(req, Request::OpenWrite { atime: None, .. })
}

/// Runs one request in a transaction; a failed request changes nothing.
fn run(
    conn: &mut Connection,
    req: &Request,
    journal: bool,
    open: &[Ino],
    space: (InstanceId, &XattrCharge),
) -> rusqlite::Result<Response> {
    if read_only(req) {
        return Ok(execute_journaled(&Ops { tx: conn }, req, journal, open)
            .unwrap_or_else(Response::Error));
    }
    let tx = conn.transaction()?;
    match execute_journaled(&Ops { tx: &tx }, req, journal, open) {
        Ok(r) => {
            let (instance, xattrs) = space;
            let total = match (Ops { tx: &tx }).xattr_bytes() {
                Ok(t) => t,
                Err(e) => return Ok(Response::Error(e)),
            };
            if matches!(req, Request::SetXattr { .. }) {
                if let Err(e) = xattrs.admit(total, instance) {
                    return Ok(Response::Error(e));
                }
            }
            tx.commit()?;
            xattrs.settle(total);
            Ok(r)
        }
        // Dropping the transaction rolls it back.
        Err(e) => Ok(Response::Error(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::ROOT_INO;
    use std::sync::Arc;
    use surge_proto::NewNode;

    const I: InstanceId = InstanceId(1);
    const N: NamespaceId = NamespaceId(0);

    fn create(ns: &Namespace, session: u32, parent: Ino, name: &str, node: NewNode) -> Response {
        ns.call_as(
            session,
            Request::Create {
                instance: I,
                ns: N,
                parent,
                name: name.into(),
                node,
                perm: 0o755,
                umask: 0,
                uid: 0,
                gid: 0,
                layout: Default::default(),
            },
        )
    }

    fn lease(ns: &Namespace, session: u32, ino: Ino, change: u64) -> bool {
        match ns.call_as(
            session,
            Request::LeaseDir {
                instance: I,
                ns: N,
                ino,
                change,
            },
        ) {
            Response::Lease { granted } => granted,
            other => panic!("{other:?}"),
        }
    }

    fn lookup(ns: &Namespace, session: u32, parent: Ino, name: &str) -> Response {
        ns.call_as(
            session,
            Request::Lookup {
                instance: I,
                ns: N,
                parent,
                name: name.into(),
            },
        )
    }

    #[test]
    fn a_restarted_server_keeps_the_drainers_hold_until_it_lapses() {
        let t = tempfile::tempdir().unwrap();
        let hold = |ns: &Namespace, session: u32, release: bool| {
            ns.call_as(
                session,
                Request::DrainHold {
                    instance: I,
                    ns: N,
                    release,
                },
            )
        };
        let ns = Namespace::start(t.path(), I, N, (0, 0, 0o755), true, Default::default()).unwrap();
        assert!(matches!(hold(&ns, 1, false), Response::Ok));
        drop(ns);
        // Restarted: the hold stands for another session, and its holder renews it.
        let ns = Namespace::start(t.path(), I, N, (0, 0, 0o755), true, Default::default()).unwrap();
        match hold(&ns, 2, false) {
            Response::Error(e) => assert_eq!(e.code, ErrorCode::Again, "{e:?}"),
            other => panic!("a second drainer got the hold after a restart: {other:?}"),
        }
        assert!(matches!(hold(&ns, 1, false), Response::Ok));
        // Renewed by its holder: busy, as before the restart.
        match hold(&ns, 2, false) {
            Response::Error(e) => assert_eq!(e.code, ErrorCode::Busy, "{e:?}"),
            other => panic!("a second drainer got a renewed hold: {other:?}"),
        }
        assert!(matches!(hold(&ns, 1, true), Response::Ok));
        drop(ns);
        // Given back before the restart: free.
        let ns = Namespace::start(t.path(), I, N, (0, 0, 0o755), true, Default::default()).unwrap();
        assert!(matches!(hold(&ns, 2, false), Response::Ok));
        // A hold older than DRAIN_HOLD has lapsed.
        if let Some(c) = ns.conn.lock().as_mut() {
            let old = wall_ms() - surge_proto::DRAIN_HOLD.as_millis() as u64 - 1000;
            (Ops { tx: c }).set_drain_hold(Some((2, old))).unwrap();
        }
        drop(ns);
        let ns = Namespace::start(t.path(), I, N, (0, 0, 0o755), true, Default::default()).unwrap();
        assert!(matches!(hold(&ns, 3, false), Response::Ok));
        // A renewal soon after writes nothing; one after RECORD_HOLD_EVERY does, and so does
        // a release.
        let stored = |ns: &Namespace| {
            ns.conn
                .lock()
                .as_mut()
                .and_then(|c| (Ops { tx: c }).drain_hold().unwrap())
        };
        let first = stored(&ns).expect("hold recorded");
        std::thread::sleep(Duration::from_millis(20));
        assert!(matches!(hold(&ns, 3, false), Response::Ok));
        assert_eq!(
            stored(&ns),
            Some(first),
            "a renewal rewrote the store at once"
        );
        if let Some(h) = ns.drain.lock().hold.as_mut() {
            h.recorded -= RECORD_HOLD_EVERY;
        }
        assert!(matches!(hold(&ns, 3, false), Response::Ok));
        let later = stored(&ns).expect("hold recorded");
        assert!(later.1 > first.1, "{later:?} not after {first:?}");
        assert!(matches!(hold(&ns, 3, true), Response::Ok));
        assert_eq!(stored(&ns), None);
    }

    #[test]
    fn unlinked_files_of_a_session_that_went_are_handed_to_another_once_forgotten() {
        let t = tempfile::tempdir().unwrap();
        let ns =
            Namespace::start(t.path(), I, N, (0, 0, 0o755), false, Default::default()).unwrap();
        set_orphan_grace(Duration::ZERO);
        let unlink = |session, name: &str| match ns.call_as(
            session,
            Request::Unlink {
                instance: I,
                ns: N,
                parent: ROOT_INO,
                name: name.into(),
                keep: surge_proto::KeepOpen::All,
            },
        ) {
            Response::Removed { unlinked, .. } => unlinked,
            other => panic!("unlink: {other:?}"),
        };
        let mut files = Vec::new();
        for name in ["held", "purged"] {
            let Response::Created { attr, .. } = create(&ns, 7, ROOT_INO, name, NewNode::File)
            else {
                panic!("create");
            };
            files.push(attr.ino);
        }
        let u = unlink(7, "held");
        assert!(u.orphaned && !u.purged);
        // One the session purged itself, and an O_TMPFILE it named with a link, are not
        // handed out.
        unlink(7, "purged");
        let purge = Request::Purge {
            instance: I,
            ns: N,
            ino: files[1],
        };
        assert!(matches!(ns.call_as(7, purge), Response::Ok));
        let tmpfile = Request::Tmpfile {
            instance: I,
            ns: N,
            dir: ROOT_INO,
            perm: 0o644,
            umask: 0,
            uid: 0,
            gid: 0,
            layout: Default::default(),
        };
        let Response::Attr(t) = ns.call_as(7, tmpfile) else {
            panic!("tmpfile");
        };
        files.push(t.ino);
        let link = Request::Link {
            instance: I,
            ns: N,
            ino: t.ino,
            new_parent: ROOT_INO,
            new_name: b"named".to_vec(),
        };
        assert!(matches!(ns.call_as(7, link), Response::Attr(_)));
        // Alive while it waits for recalls; gone once its recall connection closed (and the
        // grace, here none, is over).
        assert!(ns.wait_recall(7, 0).1.is_empty());
        assert!(
            ns.wait_recall(9, 0).1.is_empty(),
            "handed out while its holder lives"
        );
        ns.recall_connection_closed(7);
        let (_, reap) = ns.wait_recall(9, 0);
        assert_eq!(reap.len(), 1, "{reap:?}");
        assert!(reap[0].ino == files[0] && reap[0].purged && reap[0].orphaned);
        assert!(ns.wait_recall(9, 0).1.is_empty(), "handed out once");
        let Response::Attr(a) = ns.call_as(
            9,
            Request::GetAttr {
                instance: I,
                ns: N,
                ino: files[2],
            },
        ) else {
            panic!("the linked file was forgotten");
        };
        assert_eq!(a.nlink, 1);
        let mut guard = ns.conn.lock();
        let orphans = Ops {
            tx: guard.as_mut().unwrap(),
        }
        .orphans()
        .unwrap();
        assert!(orphans.is_empty(), "{orphans:?}");
    }

    #[test]
    fn a_lease_is_recalled_before_another_session_touches_the_directory() {
        let t = tempfile::tempdir().unwrap();
        let ns = Arc::new(
            Namespace::start(t.path(), I, N, (0, 0, 0o755), false, Default::default()).unwrap(),
        );
        let Response::Created { attr: d, .. } = create(&ns, 7, ROOT_INO, "d", NewNode::Dir) else {
            panic!("mkdir");
        };
        // Granted only for the counter the directory has, to one session at a time.
        assert!(!lease(&ns, 7, d.ino, d.change + 1));
        assert!(!lease(&ns, 0, d.ino, d.change));
        assert!(lease(&ns, 7, d.ino, d.change));
        assert!(!lease(&ns, 9, d.ino, d.change));
        // The holder's own requests run at once.
        assert!(matches!(
            create(&ns, 7, d.ino, "a", NewNode::File),
            Response::Created { .. }
        ));
        // Another session's lookup there waits until the holder gave the lease back.
        let ns2 = ns.clone();
        let other = std::thread::spawn(move || lookup(&ns2, 9, d.ino, "a"));
        assert_eq!(ns.wait_recall(7, 5000).0, vec![d.ino]);
        std::thread::sleep(Duration::from_millis(300));
        assert!(!other.is_finished(), "ran before the lease was given back");
        ns.release_leases(7, &[d.ino]);
        assert!(matches!(other.join().unwrap(), Response::Attr(a) if a.kind == FileKind::File));
        // Requests that only read attributes never wait; a session with no lease held is
        // told nothing.
        assert!(lease(&ns, 7, d.ino, d.change + 1));
        assert!(matches!(
            ns.call_as(
                9,
                Request::GetAttr {
                    instance: I,
                    ns: N,
                    ino: d.ino
                }
            ),
            Response::Attr(_)
        ));
        assert!(ns.wait_recall(9, 10).0.is_empty());
        // A holder whose recall connection closed blocks nobody.
        ns.recall_connection_closed(7);
        let start = Instant::now();
        assert!(matches!(lookup(&ns, 9, d.ino, "a"), Response::Attr(_)));
        assert!(start.elapsed() < Duration::from_secs(1));
        // Neither does one that stopped waiting for recalls long ago (3 s).
        assert!(lease(&ns, 7, d.ino, d.change + 1));
        ns.leases
            .lock()
            .seen
            .insert(7, Instant::now() - leases::LEASE_IDLE * 2);
        let start = Instant::now();
        assert!(matches!(
            create(&ns, 9, d.ino, "b", NewNode::File),
            Response::Created { .. }
        ));
        assert!(start.elapsed() < Duration::from_secs(1));
        assert!(ns.leases.lock().held.is_empty());
    }
}
