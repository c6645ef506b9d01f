//! Cache instances (`type=cache`): eviction of clean files when the fast tier is full, and
//! the reports of this mount's opens it relies on.
//!
//! A file is clean when the PFS holds its data under its fill name
//! (`.surge-through/<ino>-fill`: the lazy fill's link to the PFS file, or the drain's link to
//! its last copy) and no change of its data is journaled since. When the servers refuse a
//! write (or `fallocate`, or the copy into the tier before a change of a file the lazy fill
//! made) for want of space, this mount asks the metadata server to evict clean files, least
//! recently used first, none open on any node ([`Request::CacheEvict`]): the server marks them
//! [`THROUGH_FILL`] again, so every node's next open reads them from the PFS (and copies them
//! back on first read, as after the lazy fill), and gives this mount their fill claims; this
//! mount removes their objects (their space returns) and gives the claims back. Only when
//! nothing clean is left does the writer's file switch to writing through (see `through`).
//!
//! The metadata server knows what is open from the mounts: an open asks it for the file's
//! attributes with [`Request::CacheOpen`] (recorded under its store's lock, so an eviction sees
//! either the open or, for a later open, the file evicted), files a mount creates count as
//! open, and every second each mount reports what it has open and what it closed
//! ([`Request::CacheUse`], see [`Fs::report_use`]); an open not reported for
//! [`CACHE_OPEN_TTL`] is forgotten (a mount that died, or hangs that long).
//!
//! [`Request::CacheEvict`]: surge_proto::Request::CacheEvict
//! [`Request::CacheOpen`]: surge_proto::Request::CacheOpen
//! [`Request::CacheUse`]: surge_proto::Request::CacheUse
//! [`THROUGH_FILL`]: surge_proto::THROUGH_FILL
//! [`CACHE_OPEN_TTL`]: surge_proto::CACHE_OPEN_TTL

use super::Fs;
use std::sync::atomic::Ordering;
use surge_core::Ino;
use surge_proto::FillStep;
use tracing::{debug, info, warn};

/// At least this share of the instance's capacity is evicted at once (so a burst does not
/// ask once per write).
const EVICT_SHARE: u64 = 16;
/// Rounds of "refused, evict, try again" for one write before it goes through to the PFS
/// (each round frees space; other writers may take it first).
pub(super) const EVICT_ROUNDS: usize = 64;
/// Inodes per use report (a frame's bound is far above).
const REPORT_CHUNK: usize = 65536;

impl Fs {
    /// The number of evictions this mount made so far: a writer notes it before a write, so
    /// that a refusal after another writer's eviction tries again without evicting more.
    pub(super) fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Acquire)
    }

    /// The fast tier refused `len` bytes for `ino`: evicts clean files to make room. True when
    /// the caller should try again (files were evicted, here now or by another writer since
    /// `seen`, the count of [`evictions`](Self::evictions) before its try); false when nothing
    /// clean is left (or the metadata server refuses), and the caller falls back.
    pub(super) async fn make_room(&self, ino: Ino, len: u64, seen: u64) -> bool {
        if !self.cache {
            return false;
        }
        let _one = self.evicting.lock().await;
        if self.evictions() != seen {
            return true;
        }
        let want = len.max(self.client.desc.capacity / EVICT_SHARE);
        let files = match self.client.cache_evict(ino, want).await {
            Ok(f) => f,
            Err(e) => {
                warn!("inode {ino}: the fast tier is full and evicting clean files failed: {e}");
                return false;
            }
        };
        if files.is_empty() {
            debug!("inode {ino}: the fast tier is full and holds no clean file to evict");
            return false;
        }
        let bytes: u64 = files.iter().map(|a| a.size).sum();
        for a in &files {
            // Its data is on the PFS: its reads go there from now on (here too).
            self.forget_fill(a.ino);
            if let Err(e) = self
                .client
                .remove_objects(a.ino, surge_proto::extent(a))
                .await
            {
                warn!(
                    "inode {}: evicted, but its fast-tier copy stays ({e}); its reads go to the \
                     PFS",
                    a.ino
                );
            }
            if let Err(e) = self.client.cache_fill(a.ino, FillStep::Release).await {
                debug!("inode {}: giving the eviction's claim back: {e}", a.ino);
            }
        }
        info!(
            "inode {ino}: the fast tier is full; {} clean file(s) of {bytes} bytes evicted (their \
             data is on the PFS)",
            files.len()
        );
        self.evictions.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Cache namespaces, every second: tells the metadata server which files are open here
    /// and which closed since the last report (see the module docs), and learns how much data
    /// is dirty (for [`hold_back`](Self::hold_back)).
    pub async fn report_use(&self) {
        if !self.cache {
            return;
        }
        // No open is between its `CacheOpen` and its record here while the list is taken
        // and sent: a close reported after a reopen would undo the reopen.
        let _report = self.use_reports.write().await;
        let (open, closed) = self.inodes.take_open_and_closed();
        let mut open = open.chunks(REPORT_CHUNK).peekable();
        let mut closed = closed.chunks(REPORT_CHUNK).peekable();
        let count = self.dirty.wants_count();
        loop {
            let o = open.next().unwrap_or_default().to_vec();
            let c = closed.next().unwrap_or_default().to_vec();
            match self.client.cache_use(o, c, count).await {
                Ok((dirty, ..)) if count => self.dirty.seen(dirty),
                Ok(_) => {}
                Err(e) => {
                    // The server forgets the opens after a while: it then evicts less.
                    debug!("report of the files open here: {e}");
                    return;
                }
            }
            if open.peek().is_none() && closed.peek().is_none() {
                return;
            }
        }
    }
}
