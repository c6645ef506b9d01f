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

/// An open for writing is passed through only while the instance has at least this fraction
/// (1/`PASSTHROUGH_ROOM`) of its capacity left on the file's server (see
/// [`Fs::passthrough_ok`]).
pub const PASSTHROUGH_ROOM: u64 = 16;

/// How often what the kernel wrote into passthrough files is measured and accounted (see
/// [`Fs::account_passthrough`]).
pub const PASSTHROUGH_ACCOUNTING: std::time::Duration = std::time::Duration::from_millis(100);

/// How long a server's answer about the room it has stands for the opens for writing that
/// follow, when it is far from what passthrough needs (see [`Fs::passthrough_ok`]):
/// a tenth of [`PASSTHROUGH_ACCOUNTING`], the time by which the answer itself may already lag
/// the kernel's writes.
pub const ROOM_KEPT: std::time::Duration = std::time::Duration::from_millis(10);

/// How far from the room passthrough needs an answer must be to stand for [`ROOM_KEPT`]
/// (besides twice that room): more than files closed in that time can have written (25 GB/s).
/// A closed file's bytes count at the server at once, so a smaller margin let a burst of
/// files written and closed within [`ROOM_KEPT`] past the limit
/// (`capacity.rs::passthrough_files_stop_at_the_capacity`: 80 MiB into 64 MiB).
pub const ROOM_KEPT_MARGIN: u64 = 256 << 20;

/// Whether passthrough is possible (the kernel granted it; cleared for good at the first sign
/// it is not), and the instance's fragments on this host.
#[derive(Default)]
pub(super) struct Passthrough {
    on: AtomicBool,
    /// The fragments whose servers run on this host, once asked.
    local: OnceLock<Vec<u32>>,
    /// Which local fragment the next new file goes to (round robin).
    next: AtomicUsize,
    /// Per fragment: the room its server had when last asked, and when.
    room: parking_lot::Mutex<std::collections::HashMap<u32, (std::time::Instant, u64)>>,
}

impl Passthrough {
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    pub fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// The room fragment `frag`'s server had less than [`ROOM_KEPT`] ago, if it was at least
    /// twice `need` and [`ROOM_KEPT_MARGIN`] past it (near the limit, and on small instances,
    /// every open asks).
    fn room_kept(&self, frag: u32, need: u64) -> Option<u64> {
        let (at, room) = *self.room.lock().get(&frag)?;
        let far = room >= need.saturating_mul(2) && room - need >= ROOM_KEPT_MARGIN;
        (at.elapsed() < ROOM_KEPT && far).then_some(room)
    }

    fn keep_room(&self, frag: u32, room: u64) {
        self.room
            .lock()
            .insert(frag, (std::time::Instant::now(), room));
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
    /// do not use it (see [`passthrough_ok`](Self::passthrough_ok)).
    pub fn enable_passthrough(&self) {
        self.passthrough
            .set(!self.cache || self.client.desc.cache_passthrough);
    }

    /// Whether an open of `ino` (`size` and `through` from its attributes) may be a kernel
    /// passthrough open. An inode already open by passthrough here keeps it (the kernel keeps
    /// one I/O mode per inode: an open in the other mode would fail with EIO), and for the
    /// same reason no other open of it here may go through this process. Cache instances
    /// (`passthrough=on`): its data must all be on the fast tier (not written through to the
    /// PFS, not left there by the lazy fill).
    ///
    /// Capacity: the kernel writes a passthrough file without this process, and Linux gives a
    /// FUSE server no way to stop the writes of a file open so. An open for writing is
    /// therefore passed through only while the instance has room on the file's server,
    /// counting what the file holds there (`size`, e.g. preallocated): at least
    /// [`PASSTHROUGH_ROOM`] of its capacity there. Past that, files are written through this
    /// process, whose every write the server checks (ENOSPC at the capacity); what files
    /// already open by passthrough write is measured while they are open
    /// ([`account_passthrough`](Self::account_passthrough)) and counts at once.
    pub(super) async fn passthrough_ok(
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
        if self.inodes.is_open(ino) || (self.cache && (through != 0 || self.fill_of(ino).is_some()))
        {
            return false;
        }
        if !writer {
            return true;
        }
        let frag = match self.client.layout_of(ino).await {
            Ok(l) if l.single_object() => l.start,
            _ => return false,
        };
        let need = self.client.desc.capacity / PASSTHROUGH_ROOM;
        // Asked at every open for writing near the limit. Far from it (twice the room
        // needed, and [`ROOM_KEPT_MARGIN`] past it), an answer stands for [`ROOM_KEPT`]:
        // what files just opened write is measured only every [`PASSTHROUGH_ACCOUNTING`],
        // and what files closed in that time wrote is within the margin; asking at every
        // create cost one round trip more per file (creates on a passthrough mount
        // 4.2-5.2K/s, 6.7-9.2K/s without passthrough).
        let room = match self.passthrough.room_kept(frag, need) {
            Some(room) => Ok(room),
            None => {
                let room = self.client.room_at(frag).await;
                if let Ok(r) = room {
                    self.passthrough.keep_room(frag, r);
                }
                room
            }
        };
        match room {
            Ok(room) if room.saturating_add(size) >= need => true,
            Ok(room) => {
                debug!(
                    "inode {ino}: {room} bytes left on its server (under {need}): written \
                     through this process, which the server checks"
                );
                false
            }
            Err(e) => {
                debug!("inode {ino}: room on its server unknown ({e}): no passthrough");
                false
            }
        }
    }

    /// Tells the servers what the kernel wrote into the objects of files open here by
    /// passthrough since they last measured them, so the instance's use counts it while the
    /// files are open (other opens, here and on other nodes, see the space taken at once, not
    /// at the last close). Called every [`PASSTHROUGH_ACCOUNTING`].
    pub async fn account_passthrough(&self) {
        for (ino, b) in self.inodes.open_backings() {
            self.account_backing(ino, &b).await;
        }
    }

    /// Has the server measure the object of `ino` (open here by passthrough, backing file
    /// `b`) again when the kernel changed its allocation since the server last did.
    pub(super) async fn account_backing(&self, ino: Ino, b: &std::fs::File) {
        use std::os::unix::fs::MetadataExt;
        let Ok(md) = b.metadata() else { return };
        let allocated = md.blocks() * 512;
        let reported = self.inodes.with(ino, |i| {
            std::mem::replace(&mut i.backing_accounted, allocated)
        });
        if reported.is_some_and(|r| r != allocated) {
            if let Err(e) = self.client.object_changed(ino).await {
                debug!("inode {ino}: passthrough writes not accounted yet: {e}");
                self.inodes.with(ino, |i| i.backing_accounted = 0);
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
