//! Kernel FUSE passthrough (DESIGN §3, the local fast path): a file whose data is one object on
//! a server of this host is read and written by the kernel directly in that object file. Its
//! size and mtime are then read from the object (the writes bypass this process) and committed
//! at close like any other file's.
//!
//! Which files are in one object is their layout's business (stripe count 1). Where no
//! directory default says otherwise, a mount that can use passthrough makes its new files so:
//! one stripe, on a fragment of its own host (node-local placement, Haider's "local flash";
//! what GekkoFS and HPE's near-node flash do). A mount that cannot (no root, an old kernel,
//! no fragment here) keeps the instance's rule, DataWarp's striping over every fragment.

use super::Fs;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use surge_core::{FileLayout, Ino};
use surge_proto::Timestamp;
use tracing::debug;

/// Whether passthrough is possible (the kernel granted it; cleared for good at the first sign
/// it is not), and the instance's fragments on this host.
#[derive(Default)]
pub(super) struct Passthrough {
    on: AtomicBool,
    /// The fragments whose servers run on this host, once asked.
    local: OnceLock<Vec<u32>>,
    /// Which local fragment the next new file goes to (round robin).
    next: AtomicUsize,
}

impl Passthrough {
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    pub fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// The next local fragment for a file of one stripe; `None` when there is none (or it is
    /// not known yet).
    fn pick(&self) -> Option<u32> {
        let local = self.local.get()?;
        if local.is_empty() {
            return None;
        }
        Some(local[self.next.fetch_add(1, Ordering::Relaxed) % local.len()])
    }
}

/// Size and mtime of a backing file.
pub(super) fn backing_state(f: &std::fs::File) -> Option<(u64, Timestamp)> {
    let md = f.metadata().ok()?;
    Some((md.len(), Timestamp::from_system_time(md.modified().ok()?)))
}

impl Fs {
    /// Whether the kernel accepted passthrough (and it was not turned off since).
    pub fn passthrough_on(&self) -> bool {
        self.passthrough.on()
    }

    /// Stops using passthrough (the kernel refused a backing file).
    pub fn disable_passthrough(&self) {
        self.passthrough.set(false);
    }

    /// Called by the adapter when the kernel accepted FUSE passthrough. Cache instances only
    /// with `passthrough=on`: their files may have to switch to writing through to the PFS
    /// mid-write (see `through`), which needs every write to pass here, so by default they
    /// do not use it (see [`cache_passthrough_ok`](Self::cache_passthrough_ok)).
    pub fn enable_passthrough(&self) {
        self.passthrough
            .set(!self.cache || self.client.desc.cache_passthrough);
    }

    /// A cache instance with `passthrough=on`: whether an open of `ino` (`through` from its
    /// attributes) may be a kernel passthrough open. Its data must all be on the fast tier
    /// (not written through to the PFS, not left there by the lazy fill), no open of it here
    /// may go through this process (the kernel keeps one I/O mode per inode: an open in the
    /// other mode would fail with EIO), and for a writer the instance must have room on the
    /// file's server, counting what the file holds there (`size`, e.g. preallocated): at least
    /// a sixteenth of the instance's capacity (a passthrough file cannot switch to the PFS
    /// when the tier fills, so it may take the tier past the capacity until it closes; what
    /// opens later falls back as usual). An inode already open by passthrough here keeps it
    /// (same reason).
    pub(super) async fn cache_passthrough_ok(
        &self,
        ino: Ino,
        size: u64,
        through: u64,
        writer: bool,
    ) -> bool {
        if !self.passthrough.on() {
            return false;
        }
        if self.inodes.backing(ino).is_some() {
            return true;
        }
        if through != 0 || self.fill_of(ino).is_some() || self.inodes.is_open(ino) {
            return false;
        }
        if !writer {
            return true;
        }
        let frag = match self.client.layout_of(ino).await {
            Ok(l) if l.single_object() => l.start,
            _ => return false,
        };
        let need = self.client.desc.capacity / 16;
        match self.client.room_at(frag).await {
            Ok(room) if room.saturating_add(size) >= need => true,
            Ok(room) => {
                debug!(
                    "inode {ino}: {room} bytes left on the tier (under {need}): written \
                     through this process, which can fall back to the PFS"
                );
                false
            }
            Err(e) => {
                debug!("inode {ino}: room on the tier unknown ({e}): no passthrough");
                false
            }
        }
    }

    /// Asks which of the instance's fragments are on this host (once); returns how many.
    pub async fn learn_local_fragments(&self) -> usize {
        if let Some(l) = self.passthrough.local.get() {
            return l.len();
        }
        let local = self.client.local_fragments().await;
        debug!("fragments on this host: {local:?}");
        // Consecutive new files go to different servers first (each server holds its own
        // share of the instance): the fragments in turn by server, interleaved.
        let server = |f: &u32| {
            self.client
                .desc
                .fragments
                .iter()
                .find(|r| r.index == *f)
                .map(|r| r.server.id.clone())
                .unwrap_or_default()
        };
        let mut by_server: Vec<(String, Vec<u32>)> = Vec::new();
        for f in local {
            let s = server(&f);
            match by_server.iter_mut().find(|(id, _)| *id == s) {
                Some((_, v)) => v.push(f),
                None => by_server.push((s, vec![f])),
            }
        }
        let rounds = by_server.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
        let order: Vec<u32> = (0..rounds)
            .flat_map(|k| by_server.iter().filter_map(move |(_, v)| v.get(k).copied()))
            .collect();
        self.passthrough.local.get_or_init(|| order).len()
    }

    /// The layout of a new regular file made here in a directory whose default is
    /// `dir_default`; learns which fragments are on this host first (once).
    pub(super) async fn new_file_layout(&self, dir_default: FileLayout) -> FileLayout {
        if self.passthrough.on() {
            self.learn_local_fragments().await;
        }
        self.new_file_layout_now(dir_default)
    }

    /// [`new_file_layout`](Self::new_file_layout) with what is known now (no request): the
    /// directory's default, with a file of one stripe placed on a fragment of this host when
    /// the kernel does passthrough here; no default: one stripe on a fragment of this host in
    /// that case, the instance's rule otherwise.
    pub(super) fn new_file_layout_now(&self, dir_default: FileLayout) -> FileLayout {
        let dir_default = match self.default_layout {
            Some(mine) if dir_default.is_unset() => mine.as_default(),
            _ => dir_default,
        };
        let local = if self.passthrough.on() {
            self.passthrough.pick()
        } else {
            None
        };
        match (local, dir_default.is_unset(), dir_default.stripe_count) {
            (Some(frag), true, _) => FileLayout {
                stripe_size: 0,
                stripe_count: 1,
                start: frag,
            },
            (Some(frag), false, 1) => FileLayout {
                start: frag,
                ..dir_default.for_child_file()
            },
            _ => dir_default.for_child_file(),
        }
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
                debug!("inode {ino}: its data is not one object on this host: no passthrough");
                None
            }
            Err(e) => {
                debug!("no passthrough for inode {ino}: {e}");
                None
            }
        }
    }
}
