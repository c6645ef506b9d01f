//! What this node knows of each inode the kernel holds, and the open file handles.
//!
//! The size and mtime of a file being written live here (shared by every handle of the inode on
//! this node) until they are committed to the metadata server; attributes from the server are
//! overlaid with them before the kernel sees them ([`InodeTable::observe`]).

use super::passthrough::backing_state;
use super::{FsError, FsResult};
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use surge_core::Ino;
use surge_proto::{Attr, KeepOpen, Timestamp, Unlinked};

/// See [`Inodes::defer_mtime`].
#[derive(Clone, Copy, Debug)]
pub(super) struct AppMtime {
    pub time: Timestamp,
    /// When it was set (the ctime it gave).
    pub at: Timestamp,
    /// The backing file's (size, mtime) then: a passthrough write since changes them, and
    /// the write's time wins.
    pub backing: Option<(u64, Timestamp)>,
}

#[derive(Default)]
pub(super) struct Inode {
    /// Kernel references (lookup counts), released by `forget`.
    pub lookups: u64,
    /// Open handles on this node.
    pub opens: u32,
    /// (mtime, size) as last seen from the metadata server, to detect change at `open`.
    pub seen: Option<(Timestamp, u64)>,
    /// This node's view of the size while the file is open (writes and truncates included).
    pub size: u64,
    /// Time of the last local change of the data not yet committed.
    pub dirty_mtime: Option<Timestamp>,
    /// An mtime the application set while writes were pending here, sent with their commit
    /// (see [`Inodes::defer_mtime`]).
    pub app_mtime: Option<AppMtime>,
    /// Fragments written since the last fsync (bit i = fragment i).
    pub touched: u64,
    /// The last name went away while open here: remove the data at the last release.
    pub unlinked: bool,
    /// The object file the kernel reads and writes directly while the file is open here
    /// (passthrough); writes then bypass this process, so size and mtime are read from it.
    pub backing: Option<Arc<std::fs::File>>,
    /// (size, mtime) of the backing file last committed to the metadata server.
    pub backing_committed: Option<(u64, Timestamp)>,
    /// The kernel changed the backing file since the server last measured it.
    pub backing_changed: bool,
    /// Bytes allocated to the backing file when its server was last told to measure it
    /// (see `Fs::account_passthrough`).
    pub backing_accounted: u64,
    /// Permission bits as last seen from the metadata server (setuid/setgid to clear on
    /// writes and truncates).
    pub perm: u16,
    /// The attributes last seen from the metadata server (an immutable namespace opens with
    /// them instead of asking again).
    pub attr: Option<Attr>,
    /// A cache file written through (the fast tier was full): its PFS file, which reads and
    /// writes go to instead of the fast tier.
    pub through: Option<Arc<std::fs::File>>,
    /// A cache file the lazy fill made and this node reads from the PFS (see `fill`).
    pub fill: Option<Arc<super::fill::Fill>>,
    /// `st_blocks` as last measured on the fragments, with the (size, mtime) it was measured
    /// at (see `space`).
    pub blocks: Option<((u64, Timestamp), u64)>,
    /// When the kernel last looked the inode up by name here (see [`InodeTable::looked_up_after_stale`]).
    pub looked_up: Option<std::time::Instant>,
    /// Directory handles open on this node (`opendir`).
    pub dir_opens: u32,
}

impl Inode {
    /// The size this node knows, the kernel's passthrough writes included.
    pub fn current_size(&self) -> u64 {
        let backing = self
            .backing
            .as_deref()
            .and_then(backing_state)
            .map_or(0, |(s, _)| s);
        self.size.max(backing)
    }
}

/// What the last release of a handle left to do.
pub(super) struct Released {
    /// The kernel wrote the backing file: the server must measure the object again.
    pub backing_changed: bool,
    /// The file was unlinked while open here: remove its data (its size).
    pub purge: Option<u64>,
}

#[derive(Default)]
pub(super) struct InodeTable {
    inodes: Mutex<HashMap<Ino, Inode>>,
    /// The inodes with `opens > 0`, changed only under the `inodes` lock: what an unlink
    /// sends as [`KeepOpen`] without scanning every inode the kernel knows.
    open_inos: Mutex<BTreeSet<Ino>>,
    /// Open file handle -> inode.
    handles: Mutex<HashMap<u64, Ino>>,
    next_fh: AtomicU64,
    /// Cache namespaces: inodes whose last handle here closed since the last report to the
    /// metadata server (see `Fs::report_use`); `None`: not recorded.
    closed: Mutex<Option<Vec<Ino>>>,
    /// When an open here last answered ESTALE (see [`InodeTable::looked_up_after_stale`]).
    stale_open: Mutex<Option<std::time::Instant>>,
}

impl InodeTable {
    /// Runs `f` on the inode's entry, if this node has one.
    pub fn with<R>(&self, ino: Ino, f: impl FnOnce(&mut Inode) -> R) -> Option<R> {
        self.inodes.lock().get_mut(&ino).map(f)
    }

    /// Runs `f` on the inode's entry, made if missing.
    pub fn with_entry<R>(&self, ino: Ino, f: impl FnOnce(&mut Inode) -> R) -> R {
        f(self.inodes.lock().entry(ino).or_default())
    }

    /// Overlays this node's view (size, mtime of writes not yet committed) on attributes from
    /// the metadata server and records what was seen; `lookup`: the kernel takes a reference.
    pub fn observe(&self, mut a: Attr, lookup: bool) -> Attr {
        let mut inodes = self.inodes.lock();
        let ino = inodes.entry(a.ino).or_default();
        if lookup {
            ino.lookups += 1;
            ino.looked_up = Some(std::time::Instant::now());
        }
        ino.perm = a.perm;
        ino.attr = Some(a.clone());
        if ino.opens > 0 {
            ino.seen = Some((a.mtime, a.size));
            a.size = ino.size;
            if let Some(m) = ino.dirty_mtime {
                a.mtime = m;
                a.ctime = a.ctime.max(m);
            }
            let backing = ino.backing.as_deref().and_then(backing_state);
            if let Some((size, mtime)) = backing {
                a.size = a.size.max(size);
                if Some((size, mtime)) != ino.backing_committed {
                    a.mtime = a.mtime.max(mtime);
                    a.ctime = a.ctime.max(mtime);
                }
            }
            if let Some(m) = ino.app_mtime.filter(|m| m.backing == backing) {
                a.mtime = m.time;
                a.ctime = a.ctime.max(m.at);
            }
        } else {
            ino.seen = Some((a.mtime, a.size));
        }
        a
    }

    /// The kernel dropped `n` references to `ino`.
    pub fn forget(&self, ino: Ino, n: u64) {
        let mut inodes = self.inodes.lock();
        if let Some(i) = inodes.get_mut(&ino) {
            i.lookups = i.lookups.saturating_sub(n);
            if i.lookups == 0 && i.opens == 0 && i.dir_opens == 0 {
                inodes.remove(&ino);
            }
        }
    }

    /// `opendir` of `ino`.
    pub fn opendir(&self, ino: Ino) {
        self.inodes.lock().entry(ino).or_default().dir_opens += 1;
    }

    /// `releasedir` of `ino`.
    pub fn releasedir(&self, ino: Ino) {
        let mut inodes = self.inodes.lock();
        if let Some(i) = inodes.get_mut(&ino) {
            i.dir_opens = i.dir_opens.saturating_sub(1);
            if i.lookups == 0 && i.opens == 0 && i.dir_opens == 0 {
                inodes.remove(&ino);
            }
        }
    }

    /// A directory open on this node that the metadata server no longer has (renamed over or
    /// removed): its last attributes with no links left, what `fstat` of an open removed
    /// directory gives on a local file system (xfstests generic/035). `None` for any other
    /// inode (the caller's ESTALE stands: the kernel looks the name up again).
    pub fn removed_open_dir(&self, ino: Ino) -> Option<Attr> {
        let inodes = self.inodes.lock();
        let i = inodes.get(&ino).filter(|i| i.dir_opens > 0)?;
        let mut a = i.attr.clone()?;
        a.nlink = 0;
        Some(a)
    }

    pub fn handle_ino(&self, fh: u64) -> FsResult<Ino> {
        self.handles
            .lock()
            .get(&fh)
            .copied()
            .ok_or_else(|| FsError::new(libc::EBADF, format!("unknown file handle {fh}")))
    }

    fn new_handle(&self, ino: Ino) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed) + 1;
        self.handles.lock().insert(fh, ino);
        fh
    }

    /// The `chattr` flags this node knows of `ino` (None: no attributes known here).
    pub fn flags(&self, ino: Ino) -> Option<u32> {
        self.with(ino, |i| i.attr.as_ref().map(|a| a.flags))
            .flatten()
    }

    /// The size this node knows of `ino` (0 if none).
    pub fn size(&self, ino: Ino) -> u64 {
        self.with(ino, |i| i.current_size()).unwrap_or(0)
    }

    /// The permission bits of `ino` without the setuid and setgid bits a write or truncate by
    /// an unprivileged user clears (`setattr_should_drop_suidgid`: setgid only with group
    /// execute), if it has any to clear.
    pub fn perm_without_suidgid(&self, ino: Ino) -> Option<u16> {
        let perm = self.with(ino, |i| i.perm)?;
        let mut kill = libc::S_ISUID as u16;
        if perm & libc::S_IXGRP as u16 != 0 {
            kill |= libc::S_ISGID as u16;
        }
        (perm & kill != 0).then_some(perm & !kill)
    }

    /// The permission bits of `ino` as this node last saw them.
    pub fn perm_of(&self, ino: Ino) -> Option<u16> {
        self.with(ino, |i| i.perm)
    }

    /// The size of `ino` while it is open here.
    pub fn open_size(&self, ino: Ino) -> Option<u64> {
        self.inodes
            .lock()
            .get(&ino)
            .filter(|i| i.opens > 0)
            .map(|i| i.size)
    }

    /// An open here answered ESTALE (the kernel looks the name up again and retries).
    pub fn note_stale_open(&self) {
        *self.stale_open.lock() = Some(std::time::Instant::now());
    }

    /// Whether the kernel found `ino` by its name after an open here answered ESTALE, within
    /// `within` of it: an open of it is then the kernel's retry, after a fresh path walk.
    pub fn looked_up_after_stale(&self, ino: Ino, within: std::time::Duration) -> bool {
        let Some(stale) = *self.stale_open.lock() else {
            return false;
        };
        stale.elapsed() < within
            && self
                .inodes
                .lock()
                .get(&ino)
                .and_then(|i| i.looked_up)
                .is_some_and(|t| t >= stale)
    }

    pub fn is_open(&self, ino: Ino) -> bool {
        self.open_inos.lock().contains(&ino)
    }

    /// The backing file of `ino` in use on this node.
    /// The backing files of the inodes open here by passthrough.
    pub fn open_backings(&self) -> Vec<(Ino, Arc<std::fs::File>)> {
        let open: Vec<Ino> = self.open_inos.lock().iter().copied().collect();
        let inodes = self.inodes.lock();
        open.into_iter()
            .filter_map(|ino| Some((ino, inodes.get(&ino)?.backing.clone()?)))
            .collect()
    }

    pub fn backing(&self, ino: Ino) -> Option<Arc<std::fs::File>> {
        self.with(ino, |i| i.backing.clone()).flatten()
    }

    /// Records an open of `ino` with attributes `a` from the server and the backing file the
    /// kernel is given (passthrough); returns (handle, unchanged since last seen, changed since
    /// last seen). The backing file is (re)attached here, under the same lock as the open
    /// count: the last release of an earlier handle may have run since it was looked up, and
    /// without it this node would read sizes from its own count while the kernel writes the
    /// object, and tell the kernel a shorter file.
    pub fn opened(
        &self,
        ino: Ino,
        a: &Attr,
        backing: Option<&Arc<std::fs::File>>,
    ) -> (u64, bool, bool) {
        let fh = self.new_handle(ino);
        let mut inodes = self.inodes.lock();
        let i = inodes.entry(ino).or_default();
        if let Some(b) = backing {
            i.backing.get_or_insert_with(|| b.clone());
            if i.backing_committed.is_none() {
                i.backing_committed = i.backing.as_deref().and_then(backing_state);
            }
        }
        i.perm = a.perm;
        // What the open asked of the metadata server is what this node knows now (the
        // `chattr` flags and the marks of a capability or of bytes past the end included).
        i.attr = Some(a.clone());
        let now = (a.mtime, a.size);
        let changed = i.seen.is_some_and(|s| s != now);
        let keep_cache = i.seen == Some(now);
        if i.opens == 0 {
            i.size = a.size;
            i.dirty_mtime = None;
            i.touched = 0;
            self.open_inos.lock().insert(ino);
        } else {
            i.size = i.size.max(a.size);
        }
        i.seen = Some(now);
        i.opens += 1;
        (fh, keep_cache, changed)
    }

    /// Records the create-and-open of a new file (with its backing file, see
    /// [`opened`](Self::opened)); returns its handle.
    pub fn created(&self, a: &Attr, backing: Option<&Arc<std::fs::File>>) -> u64 {
        let fh = self.new_handle(a.ino);
        let mut inodes = self.inodes.lock();
        let i = inodes.entry(a.ino).or_default();
        if let Some(b) = backing {
            i.backing.get_or_insert_with(|| b.clone());
        }
        i.lookups += 1;
        if i.opens == 0 {
            self.open_inos.lock().insert(a.ino);
        }
        i.opens += 1;
        i.size = 0;
        i.perm = a.perm;
        i.attr = Some(a.clone());
        i.seen = Some((a.mtime, a.size));
        i.backing_committed = i.backing.as_deref().and_then(backing_state);
        fh
    }

    /// An unnamed file (`O_TMPFILE`) was made and opened as `fh`: its data goes at its last
    /// release unless a link names it first (see [`named`](Self::named)).
    pub fn created_unnamed(&self, a: &Attr) -> u64 {
        let fh = self.created(a, None);
        if let Some(i) = self.inodes.lock().get_mut(&a.ino) {
            i.unlinked = true;
        }
        fh
    }

    /// `ino` got a name (a link of an unnamed file): its data stays at its last release.
    pub fn named(&self, ino: Ino) {
        if let Some(i) = self.inodes.lock().get_mut(&ino) {
            i.unlinked = false;
        }
    }

    /// Data of `ino` changed here up to `end` (written, allocated, punched) on the fragments
    /// of `mask`.
    pub fn changed_data(&self, ino: Ino, end: u64, mask: u64, grows: bool) {
        if let Some(i) = self.inodes.lock().get_mut(&ino) {
            if grows {
                i.size = i.size.max(end);
            }
            i.dirty_mtime = Some(Timestamp::now());
            // Written after the application set the mtime: the write's time wins.
            i.app_mtime = None;
            i.touched |= mask;
        }
    }

    /// What must be committed to the metadata server for `ino` (size, mtime), marked as sent;
    /// [`commit_failed`](Self::commit_failed) puts it back. The mtime is the application's
    /// when it set one after the last write (see [`defer_mtime`](Self::defer_mtime)).
    pub fn take_pending(&self, ino: Ino) -> Option<(u64, Timestamp, bool)> {
        let mut inodes = self.inodes.lock();
        let i = inodes.get_mut(&ino)?;
        let backing = i.backing.as_deref().and_then(backing_state);
        let app = i.app_mtime.take().filter(|m| m.backing == backing);
        // Passthrough writes are seen only in the backing file.
        let written = match backing {
            Some((size, mtime)) if backing != i.backing_committed => {
                i.backing_committed = backing;
                i.backing_changed = true;
                i.size = i.size.max(size);
                Some(i.dirty_mtime.take().map_or(mtime, |d| d.max(mtime)))
            }
            _ => i.dirty_mtime.take(),
        };
        written.map(|m| match app {
            Some(a) => (i.size, a.time, true),
            None => (i.size, m, false),
        })
    }

    /// The application set `ino`'s mtime to `time` (alone, at `now`) while this node has
    /// writes of it pending: it is kept here and sent with their commit (at `fsync`, a
    /// truncate, the close), one request for both, unless the file is written again first
    /// (then the write's time wins, as on a local file system). False, nothing kept, when no
    /// write is pending (the caller sets it at the server).
    pub fn defer_mtime(&self, ino: Ino, time: Timestamp, now: Timestamp) -> bool {
        let mut inodes = self.inodes.lock();
        let Some(i) = inodes.get_mut(&ino) else {
            return false;
        };
        let backing = i.backing.as_deref().and_then(backing_state);
        let pending =
            i.dirty_mtime.is_some() || (backing.is_some() && backing != i.backing_committed);
        if pending {
            i.app_mtime = Some(AppMtime {
                time,
                at: now,
                backing,
            });
        }
        pending
    }

    /// Attributes fetched when a lock was taken (see `Fs::setlk`): the size of a file open
    /// here becomes the server's (another node may have grown or truncated it), unless this
    /// node has writes of it not yet committed (then the larger of the two).
    pub fn refreshed(&self, ino: Ino, a: &Attr) {
        if let Some(i) = self.inodes.lock().get_mut(&ino) {
            if i.opens > 0 && i.backing.is_none() {
                i.size = if i.dirty_mtime.is_none() {
                    a.size
                } else {
                    i.size.max(a.size)
                };
            }
            i.seen = Some((a.mtime, a.size));
        }
    }

    pub fn committed(&self, ino: Ino, a: &Attr) {
        if let Some(i) = self.inodes.lock().get_mut(&ino) {
            i.seen = Some((a.mtime, a.size));
        }
    }

    /// Keeps `mtime` pending so a later flush or release retries the commit.
    pub fn commit_failed(&self, ino: Ino, mtime: Timestamp) {
        if let Some(i) = self.inodes.lock().get_mut(&ino) {
            i.dirty_mtime.get_or_insert(mtime);
        }
    }

    /// The fragments written since the last fsync, cleared.
    pub fn take_touched(&self, ino: Ino) -> u64 {
        self.with(ino, |i| std::mem::take(&mut i.touched))
            .unwrap_or(0)
    }

    pub fn untake_touched(&self, ino: Ino, touched: u64) {
        self.with(ino, |i| i.touched |= touched);
    }

    /// True when nothing of `fh`'s inode waits to be committed.
    pub fn nothing_pending(&self, fh: u64) -> bool {
        let Ok(ino) = self.handle_ino(fh) else {
            return false;
        };
        self.inodes.lock().get(&ino).is_some_and(|i| {
            i.dirty_mtime.is_none()
                && i.backing
                    .as_deref()
                    .is_none_or(|b| backing_state(b) == i.backing_committed)
        })
    }

    /// Releases `fh` at once if that needs no network request (nothing to commit, nothing to
    /// purge); false otherwise.
    pub fn release_fast(&self, fh: u64) -> bool {
        let Ok(ino) = self.handle_ino(fh) else {
            return false;
        };
        let mut inodes = self.inodes.lock();
        let Some(i) = inodes.get_mut(&ino) else {
            return false;
        };
        // A passthrough file the kernel did not change since the last commit needs nothing
        // sent either (typically a file created and closed empty).
        let backing_quiet = match &i.backing {
            None => true,
            Some(b) => !i.backing_changed && backing_state(b) == i.backing_committed,
        };
        if i.dirty_mtime.is_some() || !backing_quiet || (i.unlinked && i.opens == 1) {
            return false;
        }
        i.opens = i.opens.saturating_sub(1);
        if i.opens == 0 {
            self.open_inos.lock().remove(&ino);
            self.note_closed(ino);
            i.backing = None;
            i.backing_committed = None;
            if i.lookups == 0 {
                inodes.remove(&ino);
            }
        }
        drop(inodes);
        self.handles.lock().remove(&fh);
        true
    }

    /// Forgets handle `fh` of `ino` (after its commit).
    pub fn release(&self, fh: u64, ino: Ino) -> Released {
        self.handles.lock().remove(&fh);
        let mut out = Released {
            backing_changed: false,
            purge: None,
        };
        let mut inodes = self.inodes.lock();
        if let Some(i) = inodes.get_mut(&ino) {
            i.opens = i.opens.saturating_sub(1);
            if i.opens == 0 {
                self.open_inos.lock().remove(&ino);
                self.note_closed(ino);
                out.backing_changed =
                    i.backing.take().is_some() && std::mem::take(&mut i.backing_changed);
                i.backing_committed = None;
                if i.unlinked {
                    out.purge = Some(i.size);
                    i.unlinked = false;
                }
                if i.lookups == 0 {
                    inodes.remove(&ino);
                }
            }
        }
        out
    }

    /// The inodes open on this node, which the metadata server must not forget when their last
    /// name goes (beyond a bound, keep every orphan and purge later).
    pub fn keep_open(&self) -> KeepOpen {
        let open: Vec<Ino> = self.open_inos.lock().iter().copied().take(1025).collect();
        if open.len() > 1024 {
            KeepOpen::All
        } else {
            KeepOpen::Only(open)
        }
    }

    /// The inodes open here whose last name went (or that never had one): their data goes at
    /// their last release (at most [`surge_proto::MAX_CLAIMED`]).
    pub fn unlinked_open(&self) -> Vec<Ino> {
        let open: Vec<Ino> = self.open_inos.lock().iter().copied().collect();
        let inodes = self.inodes.lock();
        open.into_iter()
            .filter(|i| inodes.get(i).is_some_and(|x| x.unlinked))
            .take(surge_proto::MAX_CLAIMED)
            .collect()
    }

    /// The last name of `u.ino` went: the size of the data to remove now, or `None` when it
    /// is open here (removed at its last release).
    pub fn orphaned(&self, u: &Unlinked) -> Option<u64> {
        let mut inodes = self.inodes.lock();
        match inodes.get_mut(&u.ino) {
            Some(i) if i.opens > 0 => {
                i.unlinked = true;
                None
            }
            Some(i) => Some(i.size.max(u.size)),
            None => Some(u.size),
        }
    }

    /// Records the inodes whose last handle here closes from now on (see
    /// [`take_closed`](Self::take_closed)).
    pub fn record_closes(&self) {
        self.closed.lock().get_or_insert_with(Vec::new);
    }

    fn note_closed(&self, ino: Ino) {
        if let Some(c) = self.closed.lock().as_mut() {
            c.push(ino);
        }
    }

    /// The inodes open here, and those whose last handle closed since the last call (with
    /// [`record_closes`](Self::record_closes)).
    pub fn take_open_and_closed(&self) -> (Vec<Ino>, Vec<Ino>) {
        let open = self.open_inos.lock().iter().copied().collect();
        let closed = self
            .closed
            .lock()
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        (open, closed)
    }

    /// Inodes with writes not yet committed.
    pub fn dirty(&self) -> Vec<Ino> {
        self.inodes
            .lock()
            .iter()
            .filter(|(_, i)| i.dirty_mtime.is_some())
            .map(|(k, _)| *k)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use surge_proto::FileKind;

    fn attr(ino: Ino, size: u64, secs: i64) -> Attr {
        let t = Timestamp { secs, nsec: 0 };
        Attr {
            ino,
            kind: FileKind::File,
            perm: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            size,
            atime: t,
            mtime: t,
            ctime: t,
            change: 0,
            rdev: 0,
            through: 0,
            layout: Default::default(),
            btime: t,
            flags: 0,
        }
    }

    #[test]
    fn writes_here_show_in_attributes_until_committed() {
        let t = InodeTable::default();
        let (fh, keep, changed) = t.opened(5, &attr(5, 10, 100), None);
        assert!(!keep && !changed, "first open: nothing seen before");
        t.changed_data(5, 4096, 1, true);
        let a = t.observe(attr(5, 10, 100), false);
        assert_eq!(a.size, 4096, "this node's write is in the size");
        assert!(a.mtime.secs > 100, "and in mtime");
        let (size, _, _) = t.take_pending(5).expect("a commit is pending");
        assert_eq!(size, 4096);
        assert!(t.take_pending(5).is_none(), "taken once");
        assert!(t.nothing_pending(fh));
        assert!(t.release_fast(fh), "nothing to send at close");
        assert!(t.handle_ino(fh).is_err(), "the handle is gone");
    }

    #[test]
    fn reopen_sees_whether_another_node_changed_the_file() {
        let t = InodeTable::default();
        t.observe(attr(7, 10, 100), true);
        let (fh, keep, changed) = t.opened(7, &attr(7, 10, 100), None);
        assert!(keep && !changed, "unchanged: the kernel keeps its pages");
        t.release(fh, 7);
        let (_, keep, changed) = t.opened(7, &attr(7, 20, 101), None);
        assert!(!keep && changed, "changed elsewhere: caches dropped");
    }

    #[test]
    fn an_open_file_unlinked_here_is_purged_at_its_last_release() {
        let t = InodeTable::default();
        let (fh1, ..) = t.opened(9, &attr(9, 0, 1), None);
        let (fh2, ..) = t.opened(9, &attr(9, 0, 1), None);
        assert_eq!(t.keep_open(), KeepOpen::Only(vec![9]));
        let u = Unlinked {
            ino: 9,
            kind: FileKind::File,
            orphaned: true,
            size: 0,
            purged: false,
        };
        assert_eq!(t.orphaned(&u), None, "open here: removed later");
        assert!(t.release(fh1, 9).purge.is_none(), "still open once");
        assert!(!t.release_fast(fh2), "the last close must purge");
        assert_eq!(t.release(fh2, 9).purge, Some(0));
        assert_eq!(t.keep_open(), KeepOpen::Only(vec![]));
    }

    #[test]
    fn an_open_racing_the_last_release_of_an_earlier_handle_keeps_its_backing_file() {
        // The kernel sends RELEASE without waiting for it, so a reopen's OPEN can look the
        // backing file up while the old handle is open, and record the open after the old
        // handle's release dropped it.
        let dir = std::env::temp_dir().join(format!("surge-inodes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = Arc::new(
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(dir.join("obj"))
                .unwrap(),
        );
        let t = InodeTable::default();
        t.observe(attr(3, 0, 1), true);
        let (old, ..) = t.opened(3, &attr(3, 0, 1), Some(&file));
        let looked_up = t.backing(3).expect("backing while open");
        assert!(t.release_fast(old), "the old handle goes");
        assert!(t.backing(3).is_none());
        let (_new, ..) = t.opened(3, &attr(3, 0, 1), Some(&looked_up));
        // The kernel writes the object directly: this node must see it.
        use std::os::unix::fs::FileExt;
        file.write_all_at(b"written by the kernel", 0).unwrap();
        assert_eq!(t.observe(attr(3, 0, 1), false).size, 21);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
