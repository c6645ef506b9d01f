//! fcntl (POSIX and OFD) and flock locks of this mount, kept by the namespace's lock service
//! on the metadata server (`surge_server::locks`), so locks taken on two nodes exclude each
//! other as on one (NFS's NLM, Lustre's flock locks).
//!
//! - A lock is asked for at the server; a blocking one (`F_SETLKW`, `flock` without
//!   `LOCK_NB`) tries again each time the server says a lock of the namespace was released
//!   (the keeper's long poll), or after [`RETRY`], until it is granted, refused as a deadlock,
//!   or its FUSE request is interrupted by a signal (EINTR; the kernel restarts the call if
//!   the handler says so).
//! - The keeper: a task with a connection of its own that long-polls the server. This
//!   session's locks live as long as that connection: a mount that dies loses them. The mount
//!   keeps a copy of the ranges it was granted; when the keeper's connection breaks (a
//!   restarted metadata server) and is made again, it reclaims them at once, and a restarted
//!   server grants reclaims only during its grace period (`surge_proto::LOCK_GRACE`, NLM's).
//!   A reclaim refused (the grace period was over and another owner took the range) is
//!   logged as a lost lock.
//! - Coherence, as NFS does it: taking a lock drops this node's cached pages and attributes of
//!   the file (a reader under a lock sees what the last holder wrote), and releasing one first
//!   commits this node's size and mtime of it (the next holder sees them).
//! - Locks are released at the close of their owner (`flush` for POSIX locks: any close by
//!   the process) and at the last close of their open file description (OFD and flock locks).

use super::{Fs, FsError, FsResult};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use surge_core::Ino;
use surge_proto::{LockHeld, LockKind, LockOwner, LockRange};
use tracing::{debug, error, info, warn};

/// How long a blocked lock waits between tries when the keeper hears of no release.
const RETRY: Duration = Duration::from_millis(200);

/// How many interrupted requests are remembered (those of requests that ended before their
/// interrupt came are never asked about).
const MAX_INTERRUPTED: usize = 1024;

#[derive(Default)]
pub(super) struct Locks {
    /// The keeper's release count, once it runs.
    keeper: tokio::sync::OnceCell<tokio::sync::watch::Receiver<u64>>,
    /// Open file handle -> the (file, kernel owner) pairs that took locks through it.
    by_fh: Mutex<HashMap<u64, HashSet<(Ino, u64)>>>,
    /// FUSE requests the kernel interrupted (a signal to the caller).
    interrupted: Mutex<HashSet<u64>>,
    interrupt: tokio::sync::Notify,
    /// The mount went: the keeper ends.
    gone: Arc<AtomicBool>,
    /// What this mount holds, as the server granted it: reclaimed after a restart.
    held: Arc<Mutex<Vec<Granted>>>,
    /// Releases taken from `by_fh` at a close and not yet done at the server.
    releasing: Arc<Releasing>,
}

/// Files whose locks a close is releasing: a lock request of one of them waits until the
/// server has done it. The kernel sends `FUSE_RELEASE` (the last close of an open file,
/// which takes its OFD and flock locks) after `close(2)` has returned, and another thread may
/// answer the next request first: a `F_OFD_GETLK` made right after that close must not see
/// the lock (xfstests generic/478).
#[derive(Default)]
struct Releasing {
    inos: Mutex<HashMap<Ino, usize>>,
    done: tokio::sync::Notify,
}

impl Releasing {
    async fn wait(&self, ino: Ino) {
        loop {
            let done = self.done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if !self.inos.lock().contains_key(&ino) {
                return;
            }
            done.await;
        }
    }
}

/// Locks a close took from this mount's table, released at the server by
/// [`Fs::release_locks`]; the files count as being released until then (also if dropped).
pub struct TakenLocks {
    locks: Vec<(Ino, u64)>,
    releasing: Arc<Releasing>,
}

impl TakenLocks {
    fn new(locks: Vec<(Ino, u64)>, releasing: &Arc<Releasing>) -> Option<Self> {
        if locks.is_empty() {
            return None;
        }
        let mut inos = releasing.inos.lock();
        for (ino, _) in &locks {
            *inos.entry(*ino).or_default() += 1;
        }
        drop(inos);
        Some(Self {
            locks,
            releasing: releasing.clone(),
        })
    }
}

impl Drop for TakenLocks {
    fn drop(&mut self) {
        let mut inos = self.releasing.inos.lock();
        for (ino, _) in &self.locks {
            if let Some(n) = inos.get_mut(ino) {
                *n -= 1;
                if *n == 0 {
                    inos.remove(ino);
                }
            }
        }
        drop(inos);
        self.releasing.done.notify_waiters();
    }
}

/// A lock range this mount holds (the server's copy is what counts; this one is reclaimed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Granted {
    owner: LockOwner,
    range: LockRange,
    pid: u32,
}

/// Records a grant of `req` (a lock or an unlock) in `held`: the owner's ranges of the file
/// that it covers are replaced, split where they straddle, as the server does.
fn record(held: &mut Vec<Granted>, owner: LockOwner, range: LockRange, pid: u32) {
    let (start, end) = (range.start, range.end);
    let mut out = Vec::with_capacity(held.len() + 1);
    for g in held.drain(..) {
        let r = g.range;
        if g.owner != owner || r.ino != range.ino || r.end < start || end < r.start {
            out.push(g);
            continue;
        }
        if r.start < start {
            out.push(Granted {
                range: LockRange {
                    end: start - 1,
                    ..r
                },
                ..g
            });
        }
        if end < r.end {
            out.push(Granted {
                range: LockRange {
                    start: end + 1,
                    ..r
                },
                ..g
            });
        }
    }
    if range.kind != LockKind::Unlock {
        out.push(Granted { owner, range, pid });
    }
    *held = out;
}

impl Drop for Locks {
    fn drop(&mut self) {
        self.gone.store(true, Ordering::Release);
    }
}

/// A lock request as the kernel makes it.
#[derive(Clone, Copy, Debug)]
pub struct LockRequest {
    pub ino: Ino,
    pub fh: u64,
    pub owner: u64,
    /// `flock(2)` (else fcntl POSIX or OFD).
    pub flock: bool,
    pub kind: LockKind,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
}

impl LockRequest {
    fn owner(&self) -> LockOwner {
        LockOwner {
            owner: self.owner,
            flock: self.flock,
        }
    }

    fn range(&self) -> LockRange {
        LockRange {
            ino: self.ino,
            kind: self.kind,
            start: self.start,
            end: self.end,
        }
    }
}

impl Fs {
    /// `F_GETLK`: the lock in the way of `req`, with its pid when it is this node's (a pid of
    /// another node means nothing here: 0).
    pub async fn getlk(&self, req: LockRequest) -> FsResult<Option<LockHeld>> {
        self.locks.releasing.wait(req.ino).await;
        let held = self.client.lock_test(req.owner(), req.range()).await?;
        let me = self.client.session();
        Ok(held.map(|mut h| {
            if h.session != me {
                h.pid = 0;
            }
            h
        }))
    }

    /// `F_SETLK` (`wait` false: EAGAIN when another owner is in the way) or `F_SETLKW`
    /// (`wait`: until granted; EINTR once FUSE request `unique` is interrupted, EDEADLK when
    /// waiting would close a cycle of owners).
    pub async fn setlk(&self, req: LockRequest, wait: bool, unique: u64) -> FsResult<()> {
        self.locks.releasing.wait(req.ino).await;
        let mut released = self.lock_keeper().await?;
        if req.kind == LockKind::Unlock {
            // The next holder sees this node's writes of the file (their size and mtime).
            if let Err(e) = self.commit(req.ino).await {
                warn!("inode {}: commit before unlock failed: {e}", req.ino);
            }
        } else {
            self.locks
                .by_fh
                .lock()
                .entry(req.fh)
                .or_default()
                .insert((req.ino, req.owner));
        }
        loop {
            let seen = *released.borrow_and_update();
            let r = self
                .client
                .lock_set(req.owner(), req.range(), req.pid, wait)
                .await?;
            let Some(held) = r else {
                record(
                    &mut self.locks.held.lock(),
                    req.owner(),
                    req.range(),
                    req.pid,
                );
                break;
            };
            if !wait {
                let why = if held.session == 0 {
                    "the metadata server restarted: its grace period, while the locks held \
                     before are reclaimed"
                        .to_string()
                } else {
                    format!(
                        "locked by session {:#x} ({:?} {}..={})",
                        held.session, held.kind, held.start, held.end
                    )
                };
                return Err(FsError::new(
                    libc::EAGAIN,
                    format!("inode {}: {why}", req.ino),
                ));
            }
            debug!("inode {}: waiting for {held:?}", req.ino);
            let interrupted = self.locks.interrupt.notified();
            tokio::pin!(interrupted);
            interrupted.as_mut().enable();
            if self.locks.interrupted.lock().remove(&unique) {
                return Err(FsError::new(libc::EINTR, "lock wait interrupted"));
            }
            if *released.borrow() == seen {
                tokio::select! {
                    _ = released.changed() => {}
                    _ = tokio::time::sleep(RETRY) => {}
                    _ = &mut interrupted => {}
                }
            }
            if self.locks.interrupted.lock().remove(&unique) {
                return Err(FsError::new(libc::EINTR, "lock wait interrupted"));
            }
        }
        if req.kind != LockKind::Unlock {
            // What the last holder wrote: fresh attributes, and no cached page of before.
            let a = self.client.getattr(req.ino).await.map_err(super::stale)?;
            self.inodes.refreshed(req.ino, &a);
            self.observe(a, false);
            if let Some(drop_pages) = self.drop_pages.get() {
                drop_pages(req.ino);
            }
        }
        Ok(())
    }

    /// The kernel interrupted FUSE request `unique` (its caller got a signal).
    pub fn interrupt(&self, unique: u64) {
        let mut i = self.locks.interrupted.lock();
        if i.len() >= MAX_INTERRUPTED {
            i.clear();
        }
        i.insert(unique);
        drop(i);
        self.locks.interrupt.notify_waiters();
    }

    /// A `close` by lock owner `owner` (POSIX locks: every close by the process releases its
    /// locks of the file): takes them from this mount's table at once (called on the FUSE
    /// thread, before any later request is answered); None when it has none.
    pub fn take_owner_locks(&self, ino: Ino, owner: u64) -> Option<TakenLocks> {
        let had = {
            let mut by_fh = self.locks.by_fh.lock();
            let mut had = false;
            for s in by_fh.values_mut() {
                had |= s.remove(&(ino, owner));
            }
            had
        };
        TakenLocks::new(
            if had { vec![(ino, owner)] } else { vec![] },
            &self.locks.releasing,
        )
    }

    /// The last close of handle `fh`: the locks taken through it (OFD and flock locks), taken
    /// from this mount's table at once; None when it took none.
    pub fn take_handle_locks(&self, fh: u64) -> Option<TakenLocks> {
        let taken = self.locks.by_fh.lock().remove(&fh);
        TakenLocks::new(taken.into_iter().flatten().collect(), &self.locks.releasing)
    }

    /// Releases at the server the locks a close took; lock requests of their files wait for
    /// this.
    pub async fn release_locks(&self, taken: TakenLocks) {
        for &(ino, owner) in &taken.locks {
            self.release_at_server(ino, owner).await;
        }
    }

    async fn release_at_server(&self, ino: Ino, owner: u64) {
        self.locks
            .held
            .lock()
            .retain(|g| !(g.range.ino == ino && g.owner.owner == owner));
        if let Err(e) = self.commit(ino).await {
            warn!("inode {ino}: commit before unlock failed: {e}");
        }
        if let Err(e) = self.client.lock_release(ino, owner).await {
            warn!("inode {ino}: could not release the locks of owner {owner:#x}: {e}");
        }
    }

    /// The keeper's release count, the keeper started at the first lock.
    async fn lock_keeper(&self) -> FsResult<tokio::sync::watch::Receiver<u64>> {
        let rx = self
            .locks
            .keeper
            .get_or_try_init(|| async {
                let conn = self.client.lock_connection().await?;
                // Registers this connection as the keeper before any lock is asked for.
                let n = self.client.lock_keep(&conn, u64::MAX, 0).await?;
                let (tx, rx) = tokio::sync::watch::channel(n);
                tokio::spawn(keep(
                    self.client.clone(),
                    conn,
                    tx,
                    self.locks.gone.clone(),
                    self.locks.held.clone(),
                ));
                info!("lock keeper started (locks are kept by the metadata server)");
                Ok::<_, FsError>(rx)
            })
            .await?;
        Ok(rx.clone())
    }
}

/// Long-polls the lock service on its own connection until the mount goes, telling waiters of
/// every release. The server drops this session's locks when the connection closes; if it
/// breaks (a restarted server), a new one is made and the locks held are reclaimed on it.
async fn keep(
    client: Arc<crate::instance::InstanceClient>,
    conn: Arc<crate::conn::Connection>,
    tx: tokio::sync::watch::Sender<u64>,
    gone: Arc<AtomicBool>,
    held: Arc<Mutex<Vec<Granted>>>,
) {
    let mut conn = Some(conn);
    let mut last = *tx.borrow();
    while !gone.load(Ordering::Acquire) {
        let c = match conn.take() {
            Some(c) => c,
            None => match client.lock_connection().await {
                Ok(c) => match reclaim(&client, &c, &held).await {
                    Ok(()) => c,
                    Err(e) => {
                        warn!("lock keeper: reclaiming this node's locks failed ({e}); retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue;
                    }
                },
                Err(e) => {
                    warn!("lock keeper cannot reach the metadata server ({e}); retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            },
        };
        match client.lock_keep(&c, last, 1000).await {
            Ok(n) => {
                if n != last {
                    last = n;
                    let _ = tx.send(n);
                }
                conn = Some(c);
            }
            Err(e) => {
                warn!(
                    "lock keeper lost its connection ({e}): locks this node held may have \
                     been released by the metadata server; reconnecting"
                );
                // Waiters try again at once.
                last = u64::MAX;
                let _ = tx.send(last);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// On a new keeper connection `c`: registers it (this session's locks live while it is open),
/// then asks again for every lock this mount held. A lock another owner took meanwhile is
/// lost: logged, and forgotten here.
async fn reclaim(
    client: &crate::instance::InstanceClient,
    c: &crate::conn::Connection,
    held: &Mutex<Vec<Granted>>,
) -> FsResult<()> {
    client.lock_keep(c, u64::MAX, 0).await?;
    let mine = held.lock().clone();
    if mine.is_empty() {
        return Ok(());
    }
    let (mut kept, mut lost) = (0, Vec::new());
    for g in &mine {
        match client.lock_reclaim(g.owner, g.range, g.pid).await? {
            None => kept += 1,
            Some(other) => {
                error!(
                    "inode {}: lock {:?} {}..={} of pid {} LOST: session {:#x} took {}..={} \
                     while the metadata server was restarting",
                    g.range.ino,
                    g.range.kind,
                    g.range.start,
                    g.range.end,
                    g.pid,
                    other.session,
                    other.start,
                    other.end
                );
                lost.push(*g);
            }
        }
    }
    held.lock().retain(|g| !lost.contains(g));
    info!(
        "lock keeper reconnected: {kept} lock(s) of this node reclaimed, {} lost",
        lost.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(kind: LockKind, start: u64, end: u64) -> LockRange {
        LockRange {
            ino: 3,
            kind,
            start,
            end,
        }
    }

    #[test]
    fn the_copy_of_granted_ranges_splits_and_replaces_as_the_server_does() {
        let a = LockOwner {
            owner: 1,
            flock: false,
        };
        let b = LockOwner { owner: 2, ..a };
        let mut h = Vec::new();
        record(&mut h, a, r(LockKind::Write, 0, 99), 10);
        record(&mut h, b, r(LockKind::Read, 200, 299), 11);
        // An unlock of the middle splits a's range; b's is another owner's.
        record(&mut h, a, r(LockKind::Unlock, 40, 59), 10);
        // A downgrade of a's tail replaces it.
        record(&mut h, a, r(LockKind::Read, 90, 99), 10);
        let mut got: Vec<_> = h
            .iter()
            .map(|g| (g.owner.owner, g.range.kind, g.range.start, g.range.end))
            .collect();
        got.sort_by_key(|x| (x.0, x.2));
        assert_eq!(
            got,
            vec![
                (1, LockKind::Write, 0, 39),
                (1, LockKind::Write, 60, 89),
                (1, LockKind::Read, 90, 99),
                (2, LockKind::Read, 200, 299),
            ]
        );
        record(&mut h, a, r(LockKind::Unlock, 0, u64::MAX), 10);
        assert_eq!(h.len(), 1);
    }
}
