//! Cache instances (`type=cache`): back-pressure at a dirty high-water mark. When the data
//! journaled and not yet drained (dirty) passes the high-water mark, writers wait until the
//! drain brings it under the low-water mark, instead of filling the tier with data the drain
//! is behind on (whose files then write through to the PFS one by one).
//!
//! Dirty data is counted as the metadata server counts it: whole files with a change of their
//! data pending (the drain copies whole files), learnt with every use report (once a second,
//! see `evict`) and in between estimated from this mount's own writes. Writers wait only for
//! what the drain can finish: dirty files open on no node. Files being written are not
//! counted in it (the drain copies a file whole once it is quiet, and again after each later
//! change: waiting for a writer's own file would copy it over and over), so a burst of files
//! that are all open at once (one file per process, each larger than what the tier takes) is
//! never held back: it fills the tier and falls back to writing through as before.
//!
//! Off unless the instance asks for it (`dirty_high=`): measured, it did not make a burst
//! larger than the instance end sooner than eviction and writing through (docs/DIRECTIVES.md,
//! cache instances, item 6).

use super::Fs;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// How often a waiting writer asks the metadata server how far the drain got.
const POLL: Duration = Duration::from_millis(100);
/// Over the high-water mark with nothing the drain can finish (every dirty file is being
/// written), writers ask again only after this long.
const RECHECK: Duration = Duration::from_secs(1);

/// The dirty-data gate of a cache mount.
pub(super) struct DirtyGate {
    /// Writers wait once the dirty data passes this many bytes (0: never).
    high: u64,
    /// ... until it is under this many.
    low: u64,
    /// Dirty bytes, as the metadata server last counted them.
    dirty: AtomicU64,
    /// Bytes written here since.
    written: AtomicU64,
    /// The drain's oldest pending entry when a wait gave up (the drain made no progress for
    /// `DRAIN_STALL`): no writer waits again until the drain moves past it.
    stalled_at: AtomicU64,
    /// Writers do not ask the metadata server before this (see [`RECHECK`]).
    quiet_until: parking_lot::Mutex<Option<Instant>>,
    /// One waiter asks the metadata server; the others wait for it.
    gate: tokio::sync::Mutex<()>,
}

impl DirtyGate {
    /// A gate at `high` dirty bytes (0: none); the low-water mark is three quarters of it.
    pub fn new(high: u64) -> DirtyGate {
        DirtyGate {
            high,
            low: high / 4 * 3,
            dirty: AtomicU64::new(0),
            written: AtomicU64::new(0),
            stalled_at: AtomicU64::new(0),
            quiet_until: parking_lot::Mutex::new(None),
            gate: tokio::sync::Mutex::new(()),
        }
    }

    /// Whether the next report should have the metadata server count the dirty data: this
    /// mount's estimate is past half the high-water mark (counting costs the server a pass over
    /// the files pending in the journal; far under the mark nothing needs it).
    pub fn wants_count(&self) -> bool {
        self.high > 0 && self.estimate() >= self.high / 2
    }

    fn estimate(&self) -> u64 {
        self.dirty
            .load(Ordering::Acquire)
            .saturating_add(self.written.load(Ordering::Acquire))
    }

    /// The metadata server counted `dirty` bytes.
    pub fn seen(&self, dirty: u64) {
        self.dirty.store(dirty, Ordering::Release);
        self.written.store(0, Ordering::Release);
    }

    /// True when writers may go on without asking the metadata server.
    fn under(&self) -> bool {
        self.estimate() <= self.high || self.quiet_until.lock().is_some_and(|t| Instant::now() < t)
    }
}

impl Fs {
    /// Before a write of `len` bytes to the fast tier: waits while the instance's dirty data
    /// is over the high-water mark and the drain can bring it down (see the module docs).
    pub(super) async fn hold_back(&self, len: u64) {
        let g = &self.dirty;
        if g.high == 0 {
            return;
        }
        g.written.fetch_add(len, Ordering::AcqRel);
        if g.under() {
            return;
        }
        let _one = g.gate.lock().await;
        if g.under() {
            return;
        }
        // What this node wrote so far is where the metadata server counts it.
        self.commit_dirty().await;
        let start = Instant::now();
        let mut waited = false;
        let mut progress: Option<(u64, Instant)> = None;
        loop {
            let (dirty, dirty_closed, oldest) =
                match self.client.cache_use(vec![], vec![], true).await {
                    Ok(s) => s,
                    Err(e) => {
                        debug!("dirty data of the cache: {e}");
                        return;
                    }
                };
            g.seen(dirty);
            let mark = if waited { g.low } else { g.high };
            if dirty <= mark {
                break;
            }
            if dirty_closed == 0 {
                *g.quiet_until.lock() = Some(Instant::now() + RECHECK);
                break;
            }
            if oldest == g.stalled_at.load(Ordering::Acquire) {
                return;
            }
            match progress {
                Some((o, since)) if o == oldest => {
                    if since.elapsed() > super::through::DRAIN_STALL {
                        g.stalled_at.store(oldest, Ordering::Release);
                        warn!(
                            "{dirty} bytes of the cache are dirty (high-water mark {}), but the \
                             drain made no progress for {} s: writers no longer wait for it",
                            g.high,
                            super::through::DRAIN_STALL.as_secs()
                        );
                        return;
                    }
                }
                _ => progress = Some((oldest, Instant::now())),
            }
            waited = true;
            tokio::time::sleep(POLL).await;
        }
        if waited {
            info!(
                "writers held back {:.2} s: dirty data over the high-water mark ({} bytes) until \
                 the drain brought it under {} bytes",
                start.elapsed().as_secs_f64(),
                g.high,
                g.low
            );
        }
    }
}
