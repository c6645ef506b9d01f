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
//!   session's locks live as long as that connection: a mount that dies loses them.
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
use tracing::{debug, info, warn};

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
            let Some(held) = r else { break };
            if !wait {
                return Err(FsError::new(
                    libc::EAGAIN,
                    format!(
                        "inode {}: locked by session {:#x} ({:?} {}..={})",
                        req.ino, held.session, held.kind, held.start, held.end
                    ),
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
    /// locks of the file).
    pub async fn unlock_owner(&self, ino: Ino, owner: u64) {
        let had = {
            let mut by_fh = self.locks.by_fh.lock();
            let mut had = false;
            for s in by_fh.values_mut() {
                had |= s.remove(&(ino, owner));
            }
            had
        };
        if had {
            self.release_at_server(ino, owner).await;
        }
    }

    /// The last close of handle `fh`: locks taken through it (OFD and flock locks) go.
    pub async fn unlock_handle(&self, fh: u64) {
        let taken = self.locks.by_fh.lock().remove(&fh);
        for (ino, owner) in taken.into_iter().flatten() {
            self.release_at_server(ino, owner).await;
        }
    }

    /// Whether kernel owner `owner` took locks of `ino` here (its close must release them).
    pub fn owner_has_locks(&self, ino: Ino, owner: u64) -> bool {
        let by_fh = self.locks.by_fh.lock();
        !by_fh.is_empty() && by_fh.values().any(|s| s.contains(&(ino, owner)))
    }

    /// Whether `fh` took locks (its close must release them).
    pub fn has_locks(&self, fh: u64) -> bool {
        self.locks.by_fh.lock().contains_key(&fh)
    }

    async fn release_at_server(&self, ino: Ino, owner: u64) {
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
                tokio::spawn(keep(self.client.clone(), conn, tx, self.locks.gone.clone()));
                info!("lock keeper started (locks are kept by the metadata server)");
                Ok::<_, FsError>(rx)
            })
            .await?;
        Ok(rx.clone())
    }
}

/// Long-polls the lock service on its own connection until the mount goes, telling waiters of
/// every release. The server drops this session's locks when the connection closes; if it
/// breaks (a restarted server), a new one is made: the locks held before are gone (logged).
async fn keep(
    client: Arc<crate::instance::InstanceClient>,
    conn: Arc<crate::conn::Connection>,
    tx: tokio::sync::watch::Sender<u64>,
    gone: Arc<AtomicBool>,
) {
    let mut conn = Some(conn);
    let mut last = *tx.borrow();
    while !gone.load(Ordering::Acquire) {
        let c = match conn.take() {
            Some(c) => c,
            None => match client.lock_connection().await {
                Ok(c) => c,
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
