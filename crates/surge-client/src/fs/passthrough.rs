//! Kernel FUSE passthrough (DESIGN §3, the local fast path): a file whose data is one object on
//! a server of this host is read and written by the kernel directly in that object file. Its
//! size and mtime are then read from the object (the writes bypass this process) and committed
//! at close like any other file's.

use super::Fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use surge_core::Ino;
use surge_proto::Timestamp;
use tracing::debug;

/// Whether passthrough is possible: the kernel granted it and the instance's one fragment is
/// on this host; cleared for good at the first sign it is not.
#[derive(Default)]
pub(super) struct Passthrough(AtomicBool);

impl Passthrough {
    pub fn on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }
}

/// Size and mtime of a backing file.
pub(super) fn backing_state(f: &std::fs::File) -> Option<(u64, Timestamp)> {
    let md = f.metadata().ok()?;
    Some((md.len(), Timestamp::from_system_time(md.modified().ok()?)))
}

impl Fs {
    /// Stops using passthrough (the kernel refused a backing file).
    pub fn disable_passthrough(&self) {
        self.passthrough.set(false);
    }

    /// Called by the adapter when the kernel accepted FUSE passthrough. Not for cache
    /// instances: their files may have to switch to writing through to the PFS mid-write (see
    /// `through`), which needs every write to pass here.
    pub fn enable_passthrough(&self) {
        self.passthrough
            .set(self.client.fragments() == 1 && !self.cache);
    }

    /// The backing file for an open of `ino`: the one already in use on this node, or the
    /// object opened from the local server.
    pub(super) async fn backing_for(&self, ino: Ino) -> Option<Arc<std::fs::File>> {
        if !self.passthrough.on() {
            return None;
        }
        if let Some(b) = self.inodes.backing(ino) {
            return Some(b);
        }
        match self.client.open_local_object(ino).await {
            Ok(Some(f)) => {
                let f = Arc::new(f);
                // Another open may have raced us: every open of an inode shares one backing
                // file.
                Some(
                    self.inodes
                        .with_entry(ino, |i| i.backing.get_or_insert(f).clone()),
                )
            }
            Ok(None) => {
                debug!("instance's fragment is not on this host: no passthrough");
                self.passthrough.set(false);
                None
            }
            Err(e) => {
                debug!("no passthrough for inode {ino}: {e}");
                None
            }
        }
    }
}
