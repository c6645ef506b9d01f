//! Directory leases of shared namespaces (see [`surge_proto::Request::LeaseDir`]).
//!
//! In a shared namespace creates are made behind only in a directory this node made, lists,
//! and holds the metadata server's lease of: before any other node reads or changes that
//! directory's entries, the server recalls the lease; [`answer_recalls`] then drops the
//! listing, sends what is queued and gives the lease back.

use super::behind::Behind;
use super::inodes::InodeTable;
use super::listings::{LeaseState, Listings};
use super::Fs;
use crate::instance::InstanceClient;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use surge_core::Ino;
use tracing::{debug, info, warn};

#[derive(Default)]
pub(super) struct Leases {
    /// Directories whose lease this node holds (given back once their listing is gone).
    held: Arc<Mutex<HashSet<Ino>>>,
    /// The task answering lease recalls runs.
    started: AtomicBool,
    /// Set when the mount goes (this is dropped with its file system): the task ends, and
    /// its connection with it.
    gone: Arc<AtomicBool>,
}

impl Drop for Leases {
    fn drop(&mut self) {
        self.gone.store(true, Ordering::Release);
    }
}

impl Fs {
    /// True when this node holds the lease of `parent` (listed here), asking the metadata
    /// server for it the first time.
    pub(super) async fn leased(&self, parent: Ino) -> bool {
        {
            let mut listings = self.listings.lock();
            let Some(l) = listings.live(parent) else {
                return false;
            };
            match l.lease {
                LeaseState::Held => return true,
                LeaseState::No => return false,
                LeaseState::Untried => l.lease = LeaseState::No,
            }
        }
        // The server's counter is the one expected here once nothing is behind.
        if self.barrier().await.is_err() {
            return false;
        }
        let Some(change) = self.listings.lock().get(parent).map(|l| l.dir.change) else {
            return false;
        };
        // A lease nobody answers recalls for would be taken away behind this node's back.
        if !self.start_recalls() {
            return false;
        }
        match self.client.lease_dir(parent, change).await {
            Ok(true) => {
                if let Some(l) = self.listings.lock().get(parent) {
                    if l.dir.change == change {
                        debug!("lease of directory {parent} granted");
                        l.lease = LeaseState::Held;
                        self.leases.held.lock().insert(parent);
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
    /// cannot run (no async runtime here). Its wait also tells the metadata server this mount
    /// lives: one that holds unlinked files open keeps it going, so that if it goes, another
    /// mount removes their data (see `surge_server` `mds::orphans`), and it takes such files
    /// of mounts that went.
    pub(super) fn start_recalls(&self) -> bool {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        if self.leases.started.swap(true, Ordering::AcqRel) {
            return true;
        }
        rt.spawn(answer_recalls(
            self.client.clone(),
            self.behind.clone(),
            self.inodes.clone(),
            self.listings.clone(),
            self.leases.held.clone(),
            self.leases.gone.clone(),
        ));
        true
    }
}

impl Fs {
    /// Once as the mount starts: removes the data of unlinked files mounts that went left
    /// open (see [`Fs::start_recalls`]), so that they do not wait for a mount that waits for
    /// recalls.
    pub async fn remove_abandoned_files(&self) {
        match self.client.claim_orphans(Vec::new()).await {
            Ok(reap) if !reap.is_empty() => remove_abandoned(&self.client, reap).await,
            Ok(_) => {}
            Err(e) => debug!("no unlinked files of mounts that went taken ({e})"),
        }
    }
}

/// Removes the objects of unlinked files another mount held open when it went (killed, or
/// its node lost): the metadata server forgot them and handed them to this session.
async fn remove_abandoned(client: &InstanceClient, reap: Vec<surge_proto::Unlinked>) {
    use futures::StreamExt;
    let (n, bytes) = (reap.len(), reap.iter().map(|u| u.size).sum::<u64>());
    futures::stream::iter(reap)
        .for_each_concurrent(super::behind::PURGES_AT_ONCE, |u| async move {
            // The size the server had is what was last committed: the mount that went may
            // have written past it (acknowledged writes, passthrough). Every fragment that
            // may hold a byte of the file is asked.
            if let Err(e) = client
                .remove_objects(u.ino, surge_proto::EXTENT_UNKNOWN)
                .await
            {
                warn!("could not remove the data of unlinked inode {}: {e}", u.ino);
            }
        })
        .await;
    info!(
        "removed the data of {n} unlinked file(s) ({bytes} bytes as last committed) that a \
         mount which went held open"
    );
}

/// Answers the metadata server's recalls of this node's directory leases until the mount
/// goes: stops making changes behind in a recalled directory, sends what is queued, and gives
/// the lease back. Between waits, gives back the leases of directories whose listing is gone
/// or expired, so the server keeps no lease this node no longer uses. The server drops them
/// all when this task's connection closes.
async fn answer_recalls(
    client: Arc<InstanceClient>,
    behind: Arc<Behind>,
    inodes: Arc<InodeTable>,
    listings: Arc<Listings>,
    held: Arc<Mutex<HashSet<Ino>>>,
    gone: Arc<AtomicBool>,
) {
    let ttl = listings.ttl();
    let mut conn = None;
    // A task that outlived its mount kept reconnecting for ever (with a capability revoked
    // once the instance was destroyed): 256 connections from one agent filled a server's
    // per-peer limit in the Slurm test bed.
    while !gone.load(Ordering::Acquire) {
        let c = match conn.take() {
            Some(c) => c,
            None => match client.recall_connection().await {
                // A metadata server that restarted found this mount's unlinked open files
                // without a name: they stay this mount's (see `Request::ClaimOrphans`).
                Ok(c) => match inodes.unlinked_open() {
                    held if held.is_empty() => c,
                    held => match client.claim_orphans(held).await {
                        Ok(reap) => {
                            if !reap.is_empty() {
                                remove_abandoned(&client, reap).await;
                            }
                            c
                        }
                        Err(e) => {
                            warn!("cannot claim this mount's unlinked open files ({e}); retrying");
                            tokio::time::sleep(Duration::from_millis(500)).await;
                            continue;
                        }
                    },
                },
                Err(e) => {
                    warn!("cannot wait for lease recalls ({e}); retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            },
        };
        let recalled = match client.wait_recall(&c, 1000).await {
            Ok((d, reap)) => {
                if !reap.is_empty() {
                    remove_abandoned(&client, reap).await;
                }
                d
            }
            Err(e) => {
                // The server may have restarted and forgotten its leases: hold none, and
                // forget what they made known (another node may add names there now).
                listings.lock().retain(|l| l.lease != LeaseState::Held);
                held.lock().clear();
                debug!("waiting for lease recalls: {e}; leases given up, reconnecting");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        conn = Some(c);
        let unused: Vec<Ino> = {
            let mut l = listings.lock();
            for &d in &recalled {
                l.remove(d);
            }
            l.retain(|x| !(x.lease == LeaseState::Held && x.at.elapsed() >= ttl));
            let mut h = held.lock();
            let unused: Vec<Ino> = h
                .iter()
                .filter(|d| !recalled.contains(d))
                .filter(|&&d| l.get(d).is_none_or(|x| x.lease != LeaseState::Held))
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
