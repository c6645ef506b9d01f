//! Namespace changes made behind the application.
//!
//! In a directory this node lists (see [`super::listings`]), creating a file, or unlinking one
//! not open here, is answered at once (the inode number comes from a range the metadata server
//! reserved for this node) and queued; one task sends the queue in batches
//! ([`surge_proto::Request::NamespaceBatch`], one transaction each), so a stream of creates or
//! unlinks costs the metadata server one round trip per batch instead of one each. Every other
//! namespace request of this node (and every request about a file made behind) waits until the
//! queue is empty (`Fs::barrier`), so this node sees its own changes in order; other nodes see
//! them a round trip late. Each reply carries the directory's change counter, checked against
//! what this node expected: a change by another node drops the listing. A queued unlink removes
//! the name only while it still names the inode this node saw; a queued create fails if the
//! name was taken meanwhile. An empty directory whose listing this node may trust (see
//! `Fs::rmdir_behind`) is removed behind too, as the end of `rm -rf`.

use super::listings::Listings;
use crate::error::ClientError;
use crate::instance::InstanceClient;
use futures::StreamExt;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use surge_core::Ino;
use surge_proto::{BatchDone, BatchOp, Unlinked};
use tokio::sync::Notify;
use tracing::{debug, warn};

/// Changes sent in one batch at most.
const MAX_BATCH: usize = 1024;
/// A batch smaller than this waits up to [`GATHER`] for more changes unless a request waits
/// for the queue: one transaction, one round trip and one wake-up of the metadata server
/// then serve many changes (a stream of unlinks came in batches of ~3 without it, and the
/// server's per-batch work took the CPU the application's next change needed).
const GATHER_MIN: usize = 64;
const GATHER: Duration = Duration::from_micros(500);
/// Tries of a batch that could not be sent (1 ms, 4, 16, 64, 256 ms, then every second: ~30 s).
const BATCH_RETRIES: u32 = 35;
/// A batch the server could not make for want of space is tried again this long: the
/// acknowledged changes in it must not be lost while space may come back.
const NO_SPACE_RETRY: Duration = Duration::from_secs(600);
/// Orphaned files of one batch whose data is being removed at once.
pub(super) const PURGES_AT_ONCE: usize = 32;

#[derive(Default)]
pub(super) struct Behind {
    state: Mutex<BehindState>,
    /// Queued plus being sent; zero means nothing is behind.
    count: AtomicUsize,
    work: Notify,
    idle: Notify,
    /// Requests waiting for the queue to empty (`Fs::barrier`): the sender stops gathering.
    waiting: AtomicUsize,
    urgent: Notify,
    /// When the metadata server last could not make a batch for want of space: creates are
    /// not made behind for a while after (each meets the full device itself, as ENOSPC).
    no_space_at: Mutex<Option<Instant>>,
}

/// How long creates are not made behind after the metadata server found its device full.
const NO_SPACE_PAUSE: Duration = Duration::from_secs(30);

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

/// A failed batch worth sending again: the connection or the server's store failed, not the
/// request.
fn retryable(e: &ClientError) -> bool {
    match e.code() {
        None => true,
        Some(code) => code == surge_proto::ErrorCode::Io || code == surge_proto::ErrorCode::Busy,
    }
}

fn no_space(e: &ClientError) -> bool {
    e.code() == Some(surge_proto::ErrorCode::NoSpace)
}

impl Behind {
    /// Queues `op`, a change of `parent` after which the parent's counter is `change`, and
    /// starts the sender on `rt` if it does not run yet. Called with the parent's listing
    /// locked, so the queue keeps the order of the changes.
    pub fn push(
        self: &Arc<Self>,
        rt: &tokio::runtime::Handle,
        client: &Arc<InstanceClient>,
        listings: &Arc<Listings>,
        op: BatchOp,
        parent: Ino,
        change: u64,
    ) {
        let mut st = self.state.lock();
        st.queue.push(Queued { op, parent, change });
        self.count.fetch_add(1, Ordering::AcqRel);
        if !st.sender_started {
            st.sender_started = true;
            rt.spawn(send_behind(self.clone(), client.clone(), listings.clone()));
        }
    }

    /// Gives the file made behind as inode `ino`, while its creation is still queued (not
    /// being sent), the permission bits `perm` (a chmod, or a chown that cleared setuid or
    /// setgid, answered here); its ctime moves when the metadata server makes it. False when
    /// the creation is no longer queued.
    pub fn amend_create(&self, ino: Ino, new_perm: u16) -> bool {
        let mut st = self.state.lock();
        for q in st.queue.iter_mut().rev() {
            if let BatchOp::CreateFile {
                ino: i,
                perm,
                changed,
                ..
            } = &mut q.op
            {
                if *i == ino {
                    *perm = new_perm;
                    *changed = true;
                    return true;
                }
            }
        }
        false
    }

    /// Wakes the sender (after [`push`](Self::push), with the listing unlocked).
    pub fn kick(&self) {
        self.work.notify_one();
    }

    /// False for a while after the metadata server could not make a batch for want of space.
    pub fn may_create(&self) -> bool {
        self.no_space_at
            .lock()
            .is_none_or(|t| t.elapsed() >= NO_SPACE_PAUSE)
    }

    /// True when nothing is behind.
    pub fn is_empty(&self) -> bool {
        self.count.load(Ordering::Acquire) == 0
    }

    /// Waits until nothing is behind.
    pub async fn wait_empty(&self) {
        if self.is_empty() {
            return;
        }
        // Counted while this waits (also when the wait is dropped half-way).
        struct Waiting<'a>(&'a AtomicUsize);
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
            if self.is_empty() {
                break;
            }
            idle.await;
        }
    }
}

/// Sends the changes queued behind the application, a batch at a time, until the mount goes.
async fn send_behind(b: Arc<Behind>, client: Arc<InstanceClient>, listings: Arc<Listings>) {
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
        send_batch(&b, &client, &listings, batch).await;
        if b.count.fetch_sub(n, Ordering::AcqRel) == n {
            b.idle.notify_waiters();
        }
    }
}

fn op_name(op: &BatchOp) -> String {
    match op {
        BatchOp::Unlink { name, .. } => format!("unlink {}", String::from_utf8_lossy(name)),
        BatchOp::CreateFile { name, .. } => format!("create {}", String::from_utf8_lossy(name)),
        BatchOp::Rmdir { name, .. } => format!("rmdir {}", String::from_utf8_lossy(name)),
    }
}

/// Sends one batch (retrying a failed connection a few times) and finishes each change.
async fn send_batch(b: &Behind, client: &InstanceClient, listings: &Listings, batch: Vec<Queued>) {
    let ops: Vec<BatchOp> = batch.iter().map(|q| q.op.clone()).collect();
    let mut delay = Duration::from_millis(1);
    let mut attempt = 0;
    let sent = Instant::now();
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
            // A server that restarts (or a connection that broke) gets half a minute; a full
            // device, while space may come back, ten minutes (what was acknowledged must not
            // be dropped lightly); an instance or namespace that is gone, or a refusal, gets
            // no retry.
            Err(e)
                if (attempt < BATCH_RETRIES && retryable(&e))
                    || (no_space(&e) && sent.elapsed() < NO_SPACE_RETRY) =>
            {
                if no_space(&e) {
                    *b.no_space_at.lock() = Some(Instant::now());
                }
                warn!(
                    "changes behind: {} changes not sent ({e}); retrying in {delay:?}",
                    batch.len()
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 4).min(Duration::from_secs(1));
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
        for q in &batch {
            listings.drop_dir(q.parent);
        }
        return;
    }
    // The data of the files the batch orphaned goes after it, several at once (one round
    // trip each, to their fragments' servers).
    let mut orphans = Vec::new();
    for (q, r) in batch.iter().zip(results) {
        let change = match r {
            Ok(BatchDone::Unlinked {
                unlinked: u,
                change,
            }) => {
                if u.orphaned {
                    orphans.push(u);
                }
                Some(change)
            }
            Ok(BatchDone::Created { change }) | Ok(BatchDone::Removed { change }) => Some(change),
            Err(e) => {
                // Another node changed the directory first.
                match &q.op {
                    BatchOp::CreateFile { .. } => warn!(
                        "{} in directory {} made behind failed: {e}; its descriptors here \
                         point to nothing",
                        op_name(&q.op),
                        q.parent
                    ),
                    BatchOp::Unlink { .. } | BatchOp::Rmdir { .. } => debug!(
                        "{} in directory {} made behind: {e}",
                        op_name(&q.op),
                        q.parent
                    ),
                }
                None
            }
        };
        listings.confirm(q.parent, change, q.change, sent);
    }
    futures::stream::iter(orphans)
        .for_each_concurrent(PURGES_AT_ONCE, |u| async move {
            if u.purged {
                remove_purged_data(client, &u).await;
            } else if let Err(e) = client.purge(u.ino, u.size).await {
                warn!("could not remove the data of unlinked inode {}: {e}", u.ino);
            }
        })
        .await;
}

/// Removes the objects of an inode the metadata server forgot when its last name went (the
/// server removed its own local objects already).
pub(super) async fn remove_purged_data(client: &InstanceClient, u: &Unlinked) {
    if u.size > 0 {
        if let Err(e) = client.remove_objects(u.ino, u.size).await {
            warn!("could not remove the data of unlinked inode {}: {e}", u.ino);
        }
    }
}
