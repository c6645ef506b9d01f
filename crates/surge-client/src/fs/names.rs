//! Operations on names: lookup, create, mkdir, symlink, link, unlink, rmdir, rename, readdir,
//! and the creates and unlinks made behind the application (see [`super::behind`]).

use super::listings::{LeaseState, Listing, MAX_LISTED_NAMES};
use super::{stale, DirItem, Fs, FsError, FsResult, READDIR_PAGE};
use crate::instance::Usage;
use std::sync::Arc;
use surge_core::{FileLayout, Ino};
use surge_proto::{Attr, BatchOp, FileKind, KeepOpen, NewNode, SetAttr, Timestamp};
use tracing::{debug, warn};

/// Inode numbers reserved at a time for creates made behind.
const INODE_GRANT: u32 = 4096;

/// How long a file replaced by a rename in a shared namespace is kept (its inode and data)
/// for readers on other nodes that found it by name just before: they read the old file
/// instead of failing with ESTALE.
pub(super) const REPLACED_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// The permission bits a new node is asked for (`mode & 07777` of `creat`, `mkdir`,
/// `mknod`) and the creator's umask. The kernel leaves the umask to the file system (ACLs on):
/// it applies unless the parent directory has a default ACL, which masks the bits instead (the
/// metadata server decides, knowing the ACL).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewPerm {
    pub perm: u16,
    pub umask: u16,
}

impl NewPerm {
    /// `perm` as it is, no umask.
    pub fn exact(perm: u16) -> NewPerm {
        NewPerm { perm, umask: 0 }
    }

    /// The bits less the umask.
    pub fn masked(self) -> u16 {
        self.perm & !(self.umask & 0o777)
    }
}

impl Fs {
    pub async fn lookup(&self, parent: Ino, name: &[u8]) -> FsResult<Attr> {
        // The kernel looks every path component up before any operation on it: a name no
        // entry can have is ENAMETOOLONG for all of them (chmod, unlink, rename, ...).
        if name.len() > surge_proto::NAME_MAX {
            return Err(FsError::new(
                libc::ENAMETOOLONG,
                format!(
                    "name of {} bytes exceeds {}",
                    name.len(),
                    surge_proto::NAME_MAX
                ),
            ));
        }
        // "." and ".." are asked for by the kernel only to resolve file handles (export
        // support); no listing holds them, the metadata server answers them.
        let dots = name == b"." || name == b"..";
        if !dots
            && self
                .listings
                .known_absent(parent, name, self.creates_behind)
        {
            return Err(FsError::new(libc::ENOENT, "no such entry"));
        }
        self.barrier().await?;
        let a = self.client.lookup(parent, name).await?;
        Ok(self.observe(a, true))
    }

    /// The kernel dropped `n` references to `ino`.
    pub fn forget(&self, ino: Ino, n: u64) {
        self.inodes.forget(ino, n);
    }

    pub async fn getattr(&self, ino: Ino) -> FsResult<Attr> {
        if let Some(a) = self.fresh_dirs.take(ino) {
            return Ok(self.observe(a, false));
        }
        self.getattr_at_server(ino).await
    }

    /// The metadata server's attributes of `ino`, never those this node made up for a
    /// directory it just made (their birth time is not known here): what `statx` reports.
    pub async fn getattr_at_server(&self, ino: Ino) -> FsResult<Attr> {
        self.barrier().await?;
        let a = match self.client.getattr(ino).await {
            Ok(a) => a,
            Err(e) if e.code() == Some(surge_proto::ErrorCode::NotFound) => {
                return self.inodes.removed_open_dir(ino).ok_or_else(|| stale(e));
            }
            Err(e) => return Err(stale(e)),
        };
        Ok(self.observe(a, false))
    }

    /// `opendir`: counted, for [`getattr`](Self::getattr) of a directory removed while open.
    pub fn opendir(&self, ino: Ino) {
        self.inodes.opendir(ino);
    }

    /// `releasedir`.
    pub fn releasedir(&self, ino: Ino) {
        self.inodes.releasedir(ino);
    }

    pub async fn create(
        &self,
        parent: Ino,
        name: &[u8],
        perm: NewPerm,
        uid: u32,
        gid: u32,
        flags: i32,
    ) -> FsResult<(Attr, u64, Option<Arc<std::fs::File>>)> {
        let behind = if self.listings.listed(parent)
            && self.behind.may_create()
            && (self.creates_behind || self.leased(parent).await)
        {
            self.ensure_inos().await;
            // Listed directories have no default ACL (see `make`): the umask applies.
            self.create_behind(parent, name, perm.masked(), uid, gid)
        } else {
            None
        };
        let made = match behind {
            Some(a) => Ok(a),
            None => self.make(parent, name, NewNode::File, perm, uid, gid).await,
        };
        let a = match made {
            Ok(a) => a,
            // The name appeared after the kernel's lookup (another node made it): without
            // O_EXCL, open(2) opens what is there.
            Err(e) if e.errno == libc::EEXIST && flags & libc::O_EXCL == 0 => {
                return self.open_existing(parent, name, flags).await;
            }
            Err(e) => return Err(e),
        };
        // Writes by a caller without CAP_FSETID must clear setuid/setgid bits the file was
        // made with: the daemon does that, not a passthrough write (see `open`).
        let backing = if super::files::drops_privilege(a.perm)
            || (flags & libc::O_APPEND != 0 && self.appends_need_the_daemon(a.ino, a.layout))
            || !self.passthrough_ok(a.ino, 0, 0, true).await
        {
            None
        } else {
            self.backing_for(a.ino).await
        };
        let fh = self.inodes.created(&a, backing.as_ref());
        Ok((a, fh, backing))
    }

    /// `open(2)` with `O_TMPFILE` in `dir`: a regular file with no name, open as the returned
    /// handle, removed at its last close unless [`link`](Self::link) names it (in a cache
    /// namespace the drain then makes it on the PFS with its data). Never passed through: its
    /// data is accounted by the servers as it is written.
    pub async fn tmpfile(
        &self,
        dir: Ino,
        perm: NewPerm,
        uid: u32,
        gid: u32,
    ) -> FsResult<(Attr, u64)> {
        self.barrier().await?;
        let default = self
            .inodes
            .with(dir, |i| i.attr.as_ref().map(|a| a.layout))
            .flatten();
        let layout = match default {
            Some(d) => self.new_file_layout(d).await,
            None => FileLayout::default(),
        };
        let a = self
            .client
            .tmpfile(dir, perm.perm, perm.umask, uid, gid, layout)
            .await?;
        let fh = self.inodes.created_unnamed(&a);
        // Removed at its last close, or by another mount if this one goes first.
        self.start_recalls();
        Ok((a, fh))
    }

    /// The open half of an `O_CREAT` open that found the name taken.
    async fn open_existing(
        &self,
        parent: Ino,
        name: &[u8],
        flags: i32,
    ) -> FsResult<(Attr, u64, Option<Arc<std::fs::File>>)> {
        let mut a = self.lookup(parent, name).await?;
        let writer = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let reader = flags & libc::O_ACCMODE != libc::O_WRONLY;
        let append = flags & libc::O_APPEND != 0;
        let o = match self.open(a.ino, reader, writer, append).await {
            Ok(o) => o,
            Err(e) => {
                // The kernel learns of no entry: undo the lookup's reference.
                self.forget(a.ino, 1);
                return Err(e);
            }
        };
        if flags & libc::O_TRUNC != 0 && a.size > 0 {
            let set = SetAttr {
                size: Some(0),
                ..Default::default()
            };
            match self.setattr(a.ino, set, super::KillSuidgid::Nothing).await {
                Ok(t) => a = t,
                Err(e) => {
                    let _ = self.release(o.fh).await;
                    self.forget(a.ino, 1);
                    return Err(e);
                }
            }
        }
        Ok((a, o.fh, o.backing))
    }

    /// Makes a node in `parent` and keeps this node's view of `parent` up to date.
    async fn make(
        &self,
        parent: Ino,
        name: &[u8],
        node: NewNode,
        perm: NewPerm,
        uid: u32,
        gid: u32,
    ) -> FsResult<Attr> {
        let is_dir = matches!(node, NewNode::Dir);
        self.barrier().await?;
        let layout = if matches!(node, NewNode::File | NewNode::SizedFile { .. }) {
            let default = self
                .inodes
                .with(parent, |i| i.attr.as_ref().map(|a| a.layout))
                .flatten();
            match default {
                Some(d) => self.new_file_layout(d).await,
                // The parent's default is not known here: the metadata server applies it.
                None => FileLayout::default(),
            }
        } else {
            FileLayout::default()
        };
        match self
            .client
            .create_in(parent, name, node, perm.perm, perm.umask, uid, gid, layout)
            .await
        {
            Ok((a, dir, inherited)) => {
                self.listings.changed(&dir, name, Some((a.ino, a.kind)));
                self.fresh_dirs.note(dir);
                // A directory with a default ACL is not listed: files made behind in it
                // could not be given the ACL (the metadata server applies it).
                if is_dir && !inherited {
                    self.listings.made(&a);
                }
                Ok(a)
            }
            Err(e) => {
                self.listings.drop_dir(parent);
                Err(e.into())
            }
        }
    }

    /// `mknod(2)`: a regular file (created, not opened), or a FIFO, socket or device (a node
    /// with metadata only: the kernel of the node that opens it serves it). `mode` carries the
    /// type (`S_IFMT` bits), `rdev` the device number of a device.
    #[allow(clippy::too_many_arguments)]
    pub async fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        perm: NewPerm,
        rdev: u32,
        uid: u32,
        gid: u32,
    ) -> FsResult<Attr> {
        let node = match FileKind::from_mode(mode) {
            Some(FileKind::File) => NewNode::File,
            Some(kind) if kind.is_special() => NewNode::Special { kind, rdev },
            _ => {
                return Err(FsError::new(
                    libc::EINVAL,
                    format!("mknod of file type {:#o}", mode & libc::S_IFMT),
                ))
            }
        };
        let a = self.make(parent, name, node, perm, uid, gid).await?;
        Ok(self.observe(a, true))
    }

    pub async fn mkdir(
        &self,
        parent: Ino,
        name: &[u8],
        perm: NewPerm,
        uid: u32,
        gid: u32,
    ) -> FsResult<Attr> {
        let a = self
            .make(parent, name, NewNode::Dir, perm, uid, gid)
            .await?;
        Ok(self.observe(a, true))
    }

    pub async fn symlink(
        &self,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> FsResult<Attr> {
        let node = NewNode::Symlink {
            target: target.to_vec(),
        };
        let a = self
            .make(parent, name, node, NewPerm::exact(0o777), uid, gid)
            .await?;
        Ok(self.observe(a, true))
    }

    pub async fn link(&self, ino: Ino, new_parent: Ino, new_name: &[u8]) -> FsResult<Attr> {
        self.fresh_dirs.forget(new_parent);
        self.listings.drop_dir(new_parent);
        self.barrier().await?;
        let a = self.client.link(ino, new_parent, new_name).await?;
        // Again, for a listing gathered meanwhile (see `Listings::gathered`).
        self.listings.drop_dir(new_parent);
        // An unnamed file (`O_TMPFILE`) named now keeps its data at its last close.
        self.inodes.named(ino);
        Ok(self.observe(a, true))
    }

    pub async fn readlink(&self, ino: Ino) -> FsResult<Vec<u8>> {
        Ok(self.client.readlink(ino).await?)
    }

    pub async fn unlink(&self, parent: Ino, name: &[u8]) -> FsResult<()> {
        self.lease_read_listing(parent).await;
        if self.unlink_behind(parent, name) {
            return Ok(());
        }
        self.barrier().await?;
        let (u, dir) = self
            .client
            .unlink_in(parent, name, self.inodes.keep_open())
            .await
            .inspect_err(|_| self.listings.drop_dir(parent))?;
        self.listings.changed(&dir, name, None);
        self.fresh_dirs.note(dir);
        self.orphaned(u).await;
        Ok(())
    }

    pub async fn rmdir(&self, parent: Ino, name: &[u8]) -> FsResult<()> {
        self.lease_read_listing(parent).await;
        if self.rmdir_behind(parent, name) {
            return Ok(());
        }
        self.barrier().await?;
        let dir = self
            .client
            .rmdir(parent, name)
            .await
            .inspect_err(|_| self.listings.drop_dir(parent))?;
        self.listings.changed(&dir, name, None);
        // The removed directory itself may have an entry.
        self.fresh_dirs.clear();
        self.fresh_dirs.note(dir);
        Ok(())
    }

    pub async fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: u32,
    ) -> FsResult<()> {
        // Moves a directory's `..` and ctime too: drop every entry.
        self.fresh_dirs.clear();
        self.listings.drop_dir(parent);
        self.listings.drop_dir(new_parent);
        self.barrier().await?;
        // In a shared namespace another node may be opening or reading the file this rename
        // replaces (the atomic-save pattern): it is kept for `REPLACED_GRACE` first.
        let shared = self.appends_at_server();
        let keep = if shared {
            KeepOpen::All
        } else {
            self.inodes.keep_open()
        };
        let replaced = self
            .client
            .rename(parent, name, new_parent, new_name, flags, keep)
            .await?;
        // Again, for a listing gathered meanwhile (see `Listings::gathered`).
        self.listings.drop_dir(parent);
        self.listings.drop_dir(new_parent);
        match replaced {
            Some(u) if shared && u.orphaned && !u.purged => {
                self.start_recalls();
                if let Some(size) = self.inodes.orphaned(&u) {
                    let client = self.client.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(REPLACED_GRACE).await;
                        if let Err(e) = client.purge(u.ino, size).await {
                            warn!("could not remove the data of replaced inode {}: {e}", u.ino);
                        }
                    });
                }
            }
            Some(u) => self.orphaned(u).await,
            None => {}
        }
        Ok(())
    }

    /// Entries of directory `ino` from kernel offset `offset`: 0 starts with `.`, 1 is after
    /// `.`, 2 after `..`, and an entry's offset is its metadata cursor + 2. This node's changes
    /// made behind reach the server first, so a listing shows them.
    pub async fn readdir(&self, ino: Ino, offset: u64) -> FsResult<Vec<DirItem>> {
        self.barrier().await?;
        // A listing from its start moves the directory's atime, as the kernel's
        // `iterate_dir` does on a local file system; the kernel drops its cached atime after
        // each `readdir` reply. The metadata server decides (this node's cached attributes
        // may predate another node's change of the directory), beside the page's request.
        let moved = async {
            if let Some(strict) = self.atime_strict().filter(|_| offset == 0 && self.diratime) {
                if let Err(e) = self.client.accessed(ino, strict).await {
                    debug!("atime of directory {ino} not moved: {e}");
                }
            }
        };
        let mut out = Vec::new();
        if offset == 0 {
            out.push(DirItem {
                ino,
                offset: 1,
                kind: FileKind::Dir,
                name: b".".to_vec(),
            });
        }
        if offset <= 1 {
            out.push(DirItem {
                ino: 1,
                offset: 2,
                kind: FileKind::Dir,
                name: b"..".to_vec(),
            });
        }
        let after = offset.saturating_sub(2);
        // A listing from the start may list the directory here (see `Listings::gathered`).
        if after == 0 {
            self.listings.gather_begin(ino);
        }
        let (page, ()) = tokio::join!(self.client.readdir(ino, after, READDIR_PAGE, false), moved);
        let page = page?;
        self.listings.gathered(ino, after, &page);
        let entries = page.entries;
        out.extend(entries.into_iter().map(|e| DirItem {
            ino: e.ino,
            offset: e.cursor + 2,
            kind: e.kind,
            name: e.name,
        }));
        Ok(out)
    }

    /// `readdirplus` of an immutable namespace: the entries after `offset` with their
    /// attributes (each entry but `.` and `..` counts as a lookup, as the kernel counts it).
    pub async fn readdir_plus(
        &self,
        ino: Ino,
        offset: u64,
    ) -> FsResult<Vec<(DirItem, Option<surge_proto::Attr>)>> {
        self.barrier().await?;
        let mut out = Vec::new();
        for (off, name) in [(1, &b"."[..]), (2, &b".."[..])] {
            if offset < off {
                out.push((
                    DirItem {
                        ino: if off == 1 { ino } else { 1 },
                        offset: off,
                        kind: FileKind::Dir,
                        name: name.to_vec(),
                    },
                    None,
                ));
            }
        }
        let after = offset.saturating_sub(2);
        let entries = self
            .client
            .readdir(ino, after, READDIR_PAGE, true)
            .await?
            .entries;
        out.extend(entries.into_iter().map(|e| {
            (
                DirItem {
                    ino: e.ino,
                    offset: e.cursor + 2,
                    kind: e.kind,
                    name: e.name,
                },
                e.attr,
            )
        }));
        Ok(out)
    }

    /// The kernel took a lookup of `a`'s inode with a `readdirplus` entry.
    pub fn looked_up(&self, a: surge_proto::Attr) -> surge_proto::Attr {
        self.observe(a, true)
    }

    pub async fn statfs(&self) -> FsResult<Usage> {
        self.barrier().await?;
        Ok(self.client.usage().await?)
    }

    /// `fsync` of a directory: the changes this node answered early are made.
    pub async fn fsyncdir(&self) -> FsResult<()> {
        self.barrier().await?;
        Ok(())
    }

    /// Queues `op`, a change of `l` (the listing of `parent`, locked by the caller, so the
    /// queue keeps the order of the changes); returns the directory's attributes after it.
    fn queue_behind(
        &self,
        rt: &tokio::runtime::Handle,
        l: &mut Listing,
        parent: Ino,
        op: BatchOp,
    ) -> Attr {
        // What the metadata server will make of the directory (its clock may differ a little):
        // the kernel asks for it right after.
        let now = Timestamp::now();
        l.dir.mtime = now;
        l.dir.ctime = now;
        l.dir.change += 1;
        self.behind
            .push(rt, &self.client, &self.listings, op, parent, l.dir.change);
        l.dir.clone()
    }

    /// Answers an unlink at once and queues it (see [`super::behind`]) when this node lists
    /// `parent`, `name` is not a directory, and its file is not open here.
    fn unlink_behind(&self, parent: Ino, name: &[u8]) -> bool {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let dir = {
            let mut listings = self.listings.lock();
            let Some(l) = listings.live(parent) else {
                return false;
            };
            if !super::listings::Locked::trusted(l, self.creates_behind) {
                return false;
            }
            let Some(&(ino, kind)) = l.names.get(name) else {
                return false;
            };
            // A file or directory with chattr flags (or whose flags are not known here)
            // is unlinked at the server, which refuses what they forbid.
            if kind == FileKind::Dir
                || self.inodes.is_open(ino)
                || l.dir.flags != 0
                || self.inodes.flags(ino) != Some(0)
            {
                return false;
            }
            l.names.remove(name);
            let op = BatchOp::Unlink {
                parent,
                name: name.to_vec(),
                ino,
            };
            self.queue_behind(&rt, l, parent, op)
        };
        self.fresh_dirs.note(dir);
        self.behind.kick();
        true
    }

    /// A listing of `parent` gathered from a `readdir` in a shared namespace serves a removal
    /// made behind under the directory's lease only, asked for here at its first use.
    async fn lease_read_listing(&self, parent: Ino) {
        if !self.creates_behind && self.listings.read_untried(parent) {
            self.leased(parent).await;
        }
    }

    /// Answers the removal of directory `name` at once and queues it (see [`super::behind`])
    /// when this node may trust both listings (the parent's as for an unlink; the
    /// directory's own: a private namespace or its lease held, so no other node added a name
    /// to it unseen) and the directory's is empty. Neither may carry chattr flags.
    fn rmdir_behind(&self, parent: Ino, name: &[u8]) -> bool {
        if self.cache {
            return false;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let dir = {
            let mut listings = self.listings.lock();
            let Some(&(ino, kind)) = listings
                .live(parent)
                .filter(|l| super::listings::Locked::trusted(l, self.creates_behind))
                .filter(|l| l.dir.flags == 0)
                .and_then(|l| l.names.get(name))
            else {
                return false;
            };
            let empty = listings.live(ino).is_some_and(|c| {
                c.names.is_empty()
                    && c.dir.flags == 0
                    && (self.creates_behind || c.lease == LeaseState::Held)
            });
            if kind != FileKind::Dir || !empty {
                return false;
            }
            listings.remove(ino);
            let Some(l) = listings.live(parent) else {
                return false;
            };
            l.names.remove(name);
            l.dir.nlink = l.dir.nlink.saturating_sub(1);
            let op = BatchOp::Rmdir {
                parent,
                name: name.to_vec(),
                ino,
            };
            self.queue_behind(&rt, l, parent, op)
        };
        self.fresh_dirs.note(dir);
        self.behind.kick();
        true
    }

    /// Reserves inode numbers for creates made behind if none are left.
    async fn ensure_inos(&self) {
        if !self.inos.lock().is_empty() || self.inos_refused() {
            return;
        }
        match self.client.alloc_inodes(INODE_GRANT).await {
            Ok(first) => *self.inos.lock() = first..first + u64::from(INODE_GRANT),
            Err(e) => {
                debug!("no inode numbers reserved ({e}): creates wait for the server");
                self.inos_refused
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// Makes a regular file at once and queues its creation (see [`super::behind`]) when this
    /// node lists `parent`, `name` is not in it, and a reserved inode number is left.
    fn create_behind(
        &self,
        parent: Ino,
        name: &[u8],
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> Option<Attr> {
        let rt = tokio::runtime::Handle::try_current().ok()?;
        // A name the server would refuse gets its error from the server.
        surge_proto::check_name(name).ok()?;
        let (a, dir) = {
            let mut listings = self.listings.lock();
            let l = listings.live(parent)?;
            if l.names.contains_key(name) || l.names.len() >= MAX_LISTED_NAMES || l.dir.flags != 0 {
                return None;
            }
            let ino = self.inos.lock().next()?;
            let (gid, perm) =
                surge_proto::new_node_group_and_perm(&l.dir, FileKind::File, gid, perm);
            let now = Timestamp::now();
            let a = Attr {
                ino,
                kind: FileKind::File,
                perm,
                nlink: 1,
                uid,
                gid,
                size: 0,
                atime: now,
                mtime: now,
                ctime: now,
                change: 0,
                rdev: 0,
                through: 0,
                layout: self.new_file_layout_now(l.dir.layout),
                // The metadata server's, once it has made the file (`statx` asks it).
                btime: Timestamp::default(),
                flags: 0,
            };
            // Its data calls (the passthrough object at its open) need the layout before
            // the metadata server knows the file.
            self.client.note_layout(&a);
            l.names.insert(name.to_vec(), (ino, FileKind::File));
            let op = BatchOp::CreateFile {
                parent,
                name: name.to_vec(),
                ino,
                perm: a.perm,
                uid,
                gid,
                time: now,
                layout: a.layout,
                changed: false,
            };
            let dir = self.queue_behind(&rt, l, parent, op);
            (a, dir)
        };
        self.fresh_dirs.note(dir);
        self.behind.kick();
        Some(a)
    }
}
