//! Operations on files' data: open, read, write, fallocate, truncate (setattr), fsync and
//! close (flush, release), and the removal of an unlinked file's data.

use super::{stale, Atime, Fs, FsError, FsResult, Opened};
use surge_core::Ino;
use surge_proto::{
    AllocMode, Attr, FileKind, FileLayout, SetAttr, TimeSet, Unlinked, FL_CAPS, FL_EOFBLOCKS,
    FL_RECOVER,
};
use tracing::{debug, warn};

/// The setuid and setgid bits a `setattr` clears. With `FUSE_HANDLE_KILLPRIV_V2` the kernel
/// leaves this to the mount, which follows what the VFS does for a local file system
/// (`notify_change`, `setattr_should_drop_suidgid`, `chown_common`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum KillSuidgid {
    #[default]
    Nothing,
    /// A truncate by a caller without `CAP_FSETID`: setuid, and setgid with group execute.
    Truncate,
    /// A change of owner or group of anything but a directory, by any caller (root too, as
    /// Linux has done since 2.2.13): setuid, and setgid with group execute or when the caller
    /// is neither privileged nor in the file's group. `groups`: the caller's groups (its
    /// fsgid included); `None`: privileged (`CAP_FSETID`, taken to be root's).
    Chown { groups: Option<Vec<u32>> },
}

/// The setuid and setgid bits.
const SUID_SGID: u16 = (libc::S_ISUID | libc::S_ISGID) as u16;

/// The permission bits `a` keeps after a chown by a caller with `groups` (see
/// [`KillSuidgid::Chown`]), if that clears any.
fn perm_after_chown(a: &Attr, groups: Option<&[u32]>) -> Option<u16> {
    if a.kind == FileKind::Dir {
        return None;
    }
    let mut kill = libc::S_ISUID as u16;
    let in_group = groups.is_none_or(|g| g.contains(&a.gid));
    if a.perm & libc::S_IXGRP as u16 != 0 || !in_group {
        kill |= libc::S_ISGID as u16;
    }
    (a.perm & kill != 0).then_some(a.perm & !kill)
}

/// See [`Fs::read_source`].
pub enum ReadSource {
    /// `len` bytes of `file` at `offset` (zeros past its end: a hole).
    Object {
        file: std::sync::Arc<std::fs::File>,
        offset: u64,
        len: usize,
    },
    /// The bytes.
    Data(Vec<u8>),
}

impl Fs {
    /// `setattr`; `kill`: the setuid/setgid bits it also clears.
    pub async fn setattr(&self, ino: Ino, set: SetAttr, kill: KillSuidgid) -> FsResult<Attr> {
        let mut tries = 0;
        loop {
            match self.setattr_once(ino, set.clone(), &kill).await {
                // A cache file evicted between its copy into the tier and its truncate (not
                // open here, so not known to be in use): copied in again.
                Err(e)
                    if self.cache && set.size.is_some() && e.errno == libc::ESTALE && tries < 3 =>
                {
                    tries += 1;
                    self.forget_fill(ino);
                }
                other => return other,
            }
        }
    }

    async fn setattr_once(&self, ino: Ino, set: SetAttr, kill: &KillSuidgid) -> FsResult<Attr> {
        self.fresh_dirs.forget(ino);
        // A directory's mode (setgid) and owner are copied into files made behind.
        self.listings.drop_dir(ino);
        if let Some(a) = self.setattr_here(ino, &set, kill) {
            return Ok(a);
        }
        self.barrier().await?;
        if let (true, Some(new)) = (self.cache, set.size) {
            // A file the lazy fill made moves to the fast tier before its size changes.
            if self.fill_of(ino).is_none() {
                let a = self.client.getattr(ino).await.map_err(stale)?;
                if a.through == surge_proto::THROUGH_FILL {
                    self.open_fill(ino, a.size)?;
                }
            }
            self.settle_fill(ino, new).await?;
        }
        let mut set = set;
        let times = set.atime.is_some() || set.mtime.is_some();
        // No commit of this inode may be in flight while its size or times change.
        let _size = if set.size.is_some() || times {
            Some(self.size_lock(ino).lock().await)
        } else {
            None
        };
        let open_here = self.inodes.open_size(ino).is_some();
        if times && set.size.is_none() && open_here {
            // An mtime alone set on a file with writes pending here (`tar -x` sets it on the
            // open copy, its atime left as it is): one commit of those writes carrying that
            // mtime does both (ctime moves as a setattr's does).
            if let Some(a) = self.commit_with_mtime(ino, &set).await? {
                return Ok(self.observe(a, false));
            }
            // Times the application sets win over this node's own mtime of its writes
            // (`cp -p`, `tar -xp` set them on the open copy): what is pending is committed
            // first, so no later commit (close, fsync) puts the time of the writes back.
            self.commit_locked(ino, false).await?;
        }
        let (old_size, past_end) = match (set.size, open_here) {
            (None, _) => (0, false),
            (Some(_), true) => {
                // Commit pending writes first, so the recorded size is not raised again by a
                // later commit of bytes the truncate removed.
                self.commit_locked(ino, false).await?;
                let flags = self.inodes.flags(ino).unwrap_or(0);
                (self.inodes.size(ino), flags & FL_EOFBLOCKS != 0)
            }
            (Some(_), false) => {
                let mut a = self.client.getattr(ino).await.map_err(stale)?;
                if a.flags & FL_RECOVER != 0 {
                    a = self.recover(ino).await?;
                }
                (a.size, a.flags & FL_EOFBLOCKS != 0)
            }
        };
        // Bytes allocated past the end (`fallocate` with `KEEP_SIZE`) go at a truncate that
        // does not grow the file, as on tmpfs: every fragment is cut, not only those the size
        // reached.
        let old_size = match set.size {
            Some(new) if past_end && new <= old_size => surge_proto::EXTENT_UNKNOWN,
            _ => old_size,
        };
        if set.size.is_some() && set.mtime.is_none() {
            set.mtime = Some(TimeSet::Now);
        }
        if set.perm.is_none() {
            set.perm = match kill {
                KillSuidgid::Nothing => None,
                KillSuidgid::Truncate => self.inodes.perm_without_suidgid(ino),
                KillSuidgid::Chown { .. } if set.uid.is_none() && set.gid.is_none() => None,
                // A file open here whose bits, as this node last saw them (at its open, and
                // after each change made here), have neither setuid nor setgid: nothing to
                // clear, no round trip (`tar -x` changes the owner of each file it makes).
                KillSuidgid::Chown { .. }
                    if open_here
                        && self.inodes.perm_of(ino).is_some_and(|p| p & SUID_SGID == 0) =>
                {
                    None
                }
                KillSuidgid::Chown { groups } => {
                    // The bits as the metadata server has them now (another node may have
                    // changed them since this one looked).
                    let a = self.client.getattr(ino).await.map_err(stale)?;
                    perm_after_chown(&a, groups.as_deref())
                }
            };
        }
        let a = if self.through_file(ino).is_some() {
            // Nothing of it on the fast tier to truncate: the PFS file is, below.
            self.client.setattr_meta(ino, set.clone()).await
        } else {
            self.client.setattr(ino, set.clone(), old_size).await
        }
        .map_err(stale)?;
        if a.kind == FileKind::Dir {
            // Again, for a listing gathered meanwhile (see `Listings::gathered`).
            self.listings.drop_dir(ino);
        }
        if let Some(new) = set.size {
            let backing = self
                .inodes
                .with(ino, |i| {
                    i.size = new;
                    i.backing.clone()
                })
                .flatten();
            // A file written through is as long as its PFS file.
            if self.cache && a.through != 0 {
                let f = self.open_through(ino, a.through).await?;
                f.set_len(new)
                    .map_err(|e| FsError::io("truncate of the PFS file", e))?;
            }
            // The kernel reads a passthrough file straight from its object, so the object
            // must be as long as the file (an extension is a hole).
            if let Some(b) = backing {
                b.set_len(new).map_err(|e| FsError::io("truncate", e))?;
                self.inodes.with(ino, |i| {
                    i.backing_committed = super::passthrough::backing_state(&b)
                });
            }
        }
        Ok(self.observe(a, false))
    }

    /// A `setattr` this node answers without a round trip, for a regular file open here
    /// (`tar -x` sets each file's mtime, owner and mode on its open copy, in that order):
    /// - the mtime alone while writes are pending: kept and sent with their commit (see
    ///   `Inodes::defer_mtime`);
    /// - the mode, or an owner and group equal to the file's, of a file made behind whose
    ///   creation is still queued (see `Behind::amend_create`): the queued create makes it
    ///   so (setuid and setgid cleared at a chown as the server would: nobody else knows the
    ///   file yet, so this node's bits are the bits).
    ///
    /// `None`: the metadata server is asked.
    fn setattr_here(&self, ino: Ino, set: &SetAttr, kill: &KillSuidgid) -> Option<Attr> {
        if self.cache || set.size.is_some() || set.atime.is_some() || set.flags.is_some() {
            return None;
        }
        let attr = self.inodes.with(ino, |i| i.attr.clone()).flatten()?;
        if attr.kind != FileKind::File || self.inodes.open_size(ino).is_none() {
            return None;
        }
        let now = surge_proto::Timestamp::now();
        if let Some(m) = set.mtime {
            if set.perm.is_some() || set.uid.is_some() || set.gid.is_some() {
                return None;
            }
            if !self.mtime_may_ride_on_commit(ino) {
                return None;
            }
            let time = match m {
                TimeSet::At(t) => t,
                TimeSet::Now => now,
            };
            if !self.inodes.defer_mtime(ino, time, now) {
                return None;
            }
            return Some(self.observe(attr, false));
        }
        if set.uid.is_some_and(|u| u != attr.uid) || set.gid.is_some_and(|g| g != attr.gid) {
            return None;
        }
        let mut a = attr.clone();
        match (set.perm, kill) {
            (Some(p), _) => a.perm = p & 0o7777,
            (None, KillSuidgid::Chown { groups }) if set.uid.is_some() || set.gid.is_some() => {
                if let Some(p) = perm_after_chown(&attr, groups.as_deref()) {
                    a.perm = p;
                }
            }
            _ => return None,
        }
        if !self.behind.amend_create(ino, a.perm) {
            return None;
        }
        a.ctime = now;
        Some(self.observe(a, false))
    }

    /// File `ino` is marked [`FL_RECOVER`]: a mount that had it open for writing went before
    /// its last close committed, and its objects may hold that mount's acknowledged writes
    /// past the size committed. The objects are measured and the size recovered (the
    /// metadata server takes it only while the mark is there, so two nodes recovering at
    /// once agree); the attributes after.
    async fn recover(&self, ino: Ino) -> FsResult<Attr> {
        let reach = self.client.objects_reach(ino).await.map_err(stale)?;
        let a = self.client.recovered(ino, reach).await.map_err(stale)?;
        tracing::info!(
            "inode {ino}: size recovered from its objects ({reach} bytes reached) after its \
             writer's mount went without committing; now {} bytes",
            a.size
        );
        Ok(a)
    }

    /// `reader`, `writer`: the open may read, write.
    /// `append`: opened `O_APPEND` (see [`append`](Self::append): not passed through where
    /// the metadata server decides where appends go, a file of several stripes; a file of
    /// one is: the kernel appends to its object, as its server does for other nodes).
    pub async fn open(
        &self,
        ino: Ino,
        reader: bool,
        writer: bool,
        append: bool,
    ) -> FsResult<Opened> {
        self.barrier().await?;
        // Cache instances: the open is known to the metadata server (the file is not evicted
        // while open) from its `CacheOpen` on; no report of this node's opens and closes is
        // taken until it is recorded here too (see `evict`).
        let _reports = if self.cache {
            Some(self.use_reports.read().await)
        } else {
            None
        };
        // Close-to-open: attributes are asked for at every open, unless nothing can change
        // them (a read-only ldbalance replica).
        let known = if self.immutable {
            self.inodes.with(ino, |i| i.attr.clone()).flatten()
        } else {
            None
        };
        // The atime this node saw last, to tell whether the open moved it.
        let seen_atime = self
            .inodes
            .with(ino, |i| i.attr.as_ref().map(|a| a.atime))
            .flatten();
        // An open for reading asks for the attributes and moves the atime in one request
        // (see `accessed`), except in a cache namespace, whose open is its own request.
        let strict = self.atime_strict().filter(|_| reader && !self.cache);
        let a = match known {
            Some(a) => a,
            None => {
                let fetched = if self.cache {
                    self.client.cache_open(ino).await
                } else if writer {
                    // Recorded as this mount's writer: if the mount goes before its last
                    // close commits, the file's size is recovered from its objects.
                    match self.client.open_write(ino, strict).await {
                        Err(e) if strict.is_some() => {
                            debug!("atime of inode {ino} not moved: {e}");
                            self.client.open_write(ino, None).await
                        }
                        r => r,
                    }
                } else if let Some(strict) = strict {
                    // An atime that cannot move (a full metadata store) must not stop the
                    // read: the attributes alone then.
                    match self.client.accessed(ino, strict).await {
                        Ok(a) => Ok(a),
                        Err(e) => {
                            debug!("atime of inode {ino} not moved: {e}");
                            self.client.getattr(ino).await
                        }
                    }
                } else {
                    self.client.getattr(ino).await
                };
                match fetched.map_err(stale) {
                    Ok(a) if a.flags & FL_RECOVER != 0 && !self.cache => self.recover(ino).await?,
                    Ok(a) => a,
                    Err(e) => {
                        if e.errno == libc::ESTALE {
                            self.inodes.note_stale_open();
                        }
                        return Err(e);
                    }
                }
            }
        };
        if a.kind == FileKind::Dir {
            return Err(FsError::new(libc::EISDIR, "is a directory"));
        }
        if writer {
            check_flags(ino, a.flags, append)?;
        }
        if a.nlink == 0
            && !self.inodes.is_open(ino)
            && !self
                .inodes
                .looked_up_after_stale(ino, super::names::REPLACED_GRACE / 2)
        {
            // Unlinked elsewhere but kept for another node's open descriptors (or replaced
            // by a rename moments ago): the name that led here was cached before, and the
            // kernel looks it up again on ESTALE. On that retry (the name looked up after
            // the ESTALE) a file replaced again meanwhile is opened as it is: the reader gets
            // the file of an instant ago, not a second ESTALE (which the kernel would return).
            self.inodes.note_stale_open();
            return Err(FsError::new(
                libc::ESTALE,
                format!("inode {ino} has no name any more"),
            ));
        }
        // A cache namespace's `CacheOpen` moved no atime.
        let a = if reader && self.cache {
            self.accessed(ino, a).await
        } else {
            a
        };
        // The kernel keeps the attributes it has while it reads from its page cache: a moved
        // atime is seen at the next stat only if they are dropped (see below).
        let atime_moved = reader && seen_atime != Some(a.atime);
        if self.cache {
            match a.through {
                0 => self.forget_fill(ino),
                surge_proto::THROUGH_FILL => {
                    self.open_fill(ino, a.size)?;
                }
                through => {
                    self.open_through(ino, through).await?;
                }
            }
        }
        let backing = if writer && (drops_privilege(a.perm) || a.flags & FL_CAPS != 0) {
            // The kernel writes a passthrough file without this process, so it could not
            // clear the setuid/setgid bits a write by a caller without CAP_FSETID (root
            // included) must clear, nor a file capability; through the daemon it does, as
            // the kernel marks each write.
            self.inodes.backing(ino)
        } else if (append && self.appends_need_the_daemon(ino, a.layout))
            || !self.passthrough_ok(ino, a.size, a.through, writer).await
        {
            None
        } else {
            self.backing_for(ino).await
        };
        if let Some(b) = &backing {
            // A file extended without writing (truncate up, on any node) has a shorter object;
            // the kernel reads a passthrough file straight from it.
            if b.metadata().map(|m| m.len()).unwrap_or(0) < a.size {
                b.set_len(a.size).map_err(|e| FsError::io("open", e))?;
            }
        }
        let (fh, keep_cache, invalidate_attr) = self.inodes.opened(ino, &a, backing.as_ref());
        Ok(Opened {
            fh,
            keep_cache,
            // Only where the kernel reads without telling: passthrough reads, and reads
            // that reach this mount, drop its cached atime themselves.
            invalidate_attr: invalidate_attr || (atime_moved && keep_cache && backing.is_none()),
            backing,
        })
    }

    /// An open for reading whose attributes came without moving its atime (a cache
    /// namespace's `CacheOpen`): the file's atime moves as the mount's rule says (see
    /// [`Atime`]), at the metadata server, and `a` becomes the attributes after. The kernel
    /// reads a passthrough file without this process, so the open stands for the reads; a
    /// failure leaves the atime as it was and the open goes on.
    async fn accessed(&self, ino: Ino, a: Attr) -> Attr {
        let Some(strict) = self.atime_strict() else {
            return a;
        };
        if !surge_proto::atime_due(&a, surge_proto::Timestamp::now(), strict) {
            return a;
        }
        match self.client.accessed(ino, strict).await {
            Ok(after) => after,
            Err(e) => {
                debug!("atime of inode {ino} not moved: {e}");
                a
            }
        }
    }

    /// Whether opens for reading move atimes (`Some`), and always (`true`: `strictatime`).
    pub(super) fn atime_strict(&self) -> Option<bool> {
        match self.atime {
            Atime::No => None,
            Atime::Relative => Some(false),
            Atime::Strict => Some(true),
        }
    }

    /// Where a read's bytes come from when the caller can read them into a buffer of its own
    /// (a FUSE reply's io_uring entry): an object of this host for a read within one of its
    /// stripes, else the bytes, as [`Fs::read`] gives them.
    pub async fn read_source(&self, fh: u64, offset: u64, size: u32) -> FsResult<ReadSource> {
        let ino = self.inodes.handle_ino(fh)?;
        let file_size = self.inodes.size(ino);
        if offset >= file_size {
            return Ok(ReadSource::Data(Vec::new()));
        }
        let len = u64::from(size).min(file_size - offset);
        if self.through_file(ino).is_none() && self.fill_of(ino).is_none() {
            if let Some((file, at)) = self.client.local_source(ino, offset, len).await? {
                return Ok(ReadSource::Object {
                    file,
                    offset: at,
                    len: len as usize,
                });
            }
        }
        self.read(fh, offset, size).await.map(ReadSource::Data)
    }

    pub async fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let ino = self.inodes.handle_ino(fh)?;
        let file_size = self.inodes.size(ino);
        if offset >= file_size {
            return Ok(Vec::new());
        }
        let len = u64::from(size).min(file_size - offset);
        if let Some(f) = self.through_file(ino) {
            return super::through::read_at(f, offset, len).await;
        }
        if let Some(fill) = self.fill_of(ino) {
            return self.read_fill(ino, fill, offset, len).await;
        }
        Ok(self.client.read(ino, offset, len).await?)
    }

    /// `write`; `kill_suidgid`: the writer lacks `CAP_FSETID`, so setuid/setgid are cleared
    /// (the kernel leaves that to this side, see `FUSE_HANDLE_KILLPRIV_V2` in the adapter).
    pub async fn write(
        &self,
        fh: u64,
        offset: u64,
        data: &[u8],
        kill_suidgid: bool,
    ) -> FsResult<u32> {
        let ino = self.inodes.handle_ino(fh)?;
        self.check_writable(ino)?;
        if kill_suidgid {
            self.clear_suidgid(ino).await?;
        }
        self.kill_capability(ino).await?;
        if offset
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > i64::MAX as u64)
        {
            return Err(FsError::new(
                libc::EFBIG,
                "write past the largest file offset",
            ));
        }
        if self.cache {
            return self.write_cache(ino, offset, data).await;
        }
        let n = self.client.write(ino, offset, data).await?;
        let mask = self.client.fragments_touched(ino, offset, n);
        self.inodes.changed_data(ino, offset + n, mask, true);
        Ok(n as u32)
    }

    /// Whether `O_APPEND` writes take their offset from the metadata server (see
    /// [`append`](Self::append)): in a namespace other nodes write too (not a private one, nor
    /// a cache instance, whose files may be written through to the PFS).
    pub fn appends_at_server(&self) -> bool {
        !self.creates_behind && !self.cache && !self.immutable
    }

    /// Whether an `O_APPEND` open of `ino` (of `layout`) must not be passed through: a file of
    /// several stripes whose appends the metadata server places. A file of one stripe is
    /// appended at its object, by the kernel on a node that passes it through.
    pub(super) fn appends_need_the_daemon(&self, ino: Ino, layout: FileLayout) -> bool {
        self.appends_at_server() && !self.client.resolve_layout(ino, layout).single_object()
    }

    /// A write of a descriptor opened `O_APPEND` (the adapter opens those without the page
    /// cache, so each `write(2)` up to the kernel's largest request comes here whole): the
    /// metadata server, which keeps the size, reserves the bytes at the end of the file, and
    /// they are written there, so appends from several nodes never overwrite each other.
    pub async fn append(&self, fh: u64, data: &[u8], kill_suidgid: bool) -> FsResult<u32> {
        let ino = self.inodes.handle_ino(fh)?;
        if !self.appends_at_server() || data.is_empty() {
            let at = self.inodes.size(ino);
            return self.write(fh, at, data, kill_suidgid).await;
        }
        self.check_writable(ino)?;
        // A file of one stripe: its server appends at the object's end, where a node passing
        // the file through appends too (the kernel, under the object's inode lock).
        if let Some(offset) = self
            .client
            .append_object(ino, self.inodes.size(ino), data)
            .await
            .map_err(super::stale)?
        {
            return self
                .appended(ino, offset, data.len() as u64, kill_suidgid)
                .await;
        }
        // This node's own size of the file first: appends from here land after its writes.
        self.commit(ino).await?;
        let (offset, a) = self
            .client
            .append(ino, data.len() as u64)
            .await
            .map_err(super::stale)?;
        self.observe(a, false);
        self.write(fh, offset, data, kill_suidgid).await
    }

    /// EPERM for a write or `fallocate` of an immutable file through a descriptor opened
    /// before it was made so (as Linux: such writes are refused too), as this node knows it.
    pub fn check_writable(&self, ino: Ino) -> FsResult<()> {
        // As an open for appending: only immutability forbids it.
        check_flags(ino, self.inodes.flags(ino).unwrap_or(0), true)
    }

    /// A write by a writer without `CAP_FSETID` clears setuid and setgid.
    async fn clear_suidgid(&self, ino: Ino) -> FsResult<()> {
        if let Some(perm) = self.inodes.perm_without_suidgid(ino) {
            let set = SetAttr {
                perm: Some(perm),
                ..Default::default()
            };
            let a = self.client.setattr_meta(ino, set).await.map_err(stale)?;
            self.observe(a, false);
        }
        Ok(())
    }

    /// Bookkeeping of `len` bytes appended at `offset` of `ino` by its server (see
    /// [`append`](Self::append)), as a write of them does.
    async fn appended(&self, ino: Ino, offset: u64, len: u64, kill_suidgid: bool) -> FsResult<u32> {
        if kill_suidgid {
            self.clear_suidgid(ino).await?;
        }
        self.kill_capability(ino).await?;
        let mask = self.client.fragments_touched(ino, offset, len);
        self.inodes.changed_data(ino, offset + len, mask, true);
        Ok(len as u32)
    }

    /// A write to a cache instance: to the fast tier (once the dirty data is under the
    /// high-water mark, see `dirty`), evicting clean files when it is full (see `evict`), or,
    /// once the fast tier refused one of this file's writes for want of space and nothing
    /// clean was left to evict, to the PFS (see `through`).
    async fn write_cache(&self, ino: Ino, offset: u64, data: &[u8]) -> FsResult<u32> {
        self.settle_fill(ino, u64::MAX).await?;
        if self.through_file(ino).is_none() {
            self.hold_back(data.len() as u64).await;
        }
        for _ in 0..super::evict::EVICT_ROUNDS {
            let evictions = self.evictions();
            {
                let _writing = self.through_lock(ino).read().await;
                if let Some(f) = self.through_file(ino) {
                    return self.write_through(f, ino, offset, data).await;
                }
                match self.client.write(ino, offset, data).await {
                    Ok(n) => {
                        let mask = self.client.fragments_touched(ino, offset, n);
                        self.inodes.changed_data(ino, offset + n, mask, true);
                        return Ok(n as u32);
                    }
                    Err(e) if e.code() == Some(surge_proto::ErrorCode::NoSpace) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if !self.make_room(ino, data.len() as u64, evictions).await {
                break;
            }
        }
        let f = self.go_through(ino).await?;
        self.write_through(f, ino, offset, data).await
    }

    /// A write of a file written through: to its PFS file.
    async fn write_through(
        &self,
        f: std::sync::Arc<std::fs::File>,
        ino: Ino,
        offset: u64,
        data: &[u8],
    ) -> FsResult<u32> {
        let data = data.to_vec();
        let n = super::through::on_pfs("write to the PFS", move || {
            use std::os::unix::fs::FileExt;
            f.write_all_at(&data, offset).map(|()| data.len() as u64)
        })
        .await?;
        self.inodes.changed_data(ino, offset + n, 0, true);
        Ok(n as u32)
    }

    /// `fallocate(2)`. Supported modes: 0 (allocate, extending the file), `FALLOC_FL_KEEP_SIZE`
    /// and `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`; others are `EOPNOTSUPP`. With
    /// `KEEP_SIZE` the part of the range past the end of the file is reserved too, as on
    /// tmpfs: the metadata server first marks the file ([`surge_proto::FL_EOFBLOCKS`]), so
    /// its unlink and a truncate that does not grow it free those bytes on every fragment,
    /// and `st_blocks` counts them. A hole punched past the end frees them. The end of the
    /// file is this node's view of it, the kernel's passthrough writes included. Every mode
    /// moves mtime and ctime, as on Linux's local file systems.
    pub async fn fallocate(&self, fh: u64, offset: u64, len: u64, mode: i32) -> FsResult<()> {
        let ino = self.inodes.handle_ino(fh)?;
        self.check_writable(ino)?;
        let flags = self.inodes.flags(ino).unwrap_or(0);
        if flags & surge_proto::FL_APPEND != 0 && mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return Err(FsError::new(
                libc::EPERM,
                format!("inode {ino} is append-only (chattr +a): only FALLOC_FL_KEEP_SIZE"),
            ));
        }
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or_else(|| FsError::new(libc::EFBIG, "fallocate past the largest file offset"))?;
        if len == 0 {
            return Err(FsError::new(libc::EINVAL, "fallocate of an empty range"));
        }
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        let bits = mode;
        let mode = match mode {
            0 => AllocMode::Allocate,
            KEEP => AllocMode::KeepSize,
            PUNCH => AllocMode::PunchHole,
            other => {
                return Err(FsError::new(
                    libc::EOPNOTSUPP,
                    format!("fallocate mode {other:#x} is not supported"),
                ))
            }
        };
        self.settle_fill(ino, u64::MAX).await?;
        let size = self.inodes.size(ino);
        let grows = mode == AllocMode::Allocate;
        if let Some(f) = self.through_file(ino) {
            return self
                .fallocate_through(f, ino, offset, len, bits, grows)
                .await;
        }
        // Past the end: reserved (after the mark), or, for a punched hole, freed where an
        // earlier reservation may have put bytes.
        let past_end = mode == AllocMode::KeepSize && end > size;
        if past_end && flags & FL_EOFBLOCKS == 0 {
            // The file may have been made behind: the metadata server must know it first.
            self.barrier().await?;
            let a = self.client.allocated_past_end(ino).await.map_err(stale)?;
            self.observe(a, false);
        }
        let end = match mode {
            AllocMode::Allocate | AllocMode::KeepSize => end,
            AllocMode::PunchHole if flags & FL_EOFBLOCKS != 0 => end,
            AllocMode::PunchHole => end.min(size),
        };
        let mut rounds = 0;
        // Tried again after each eviction that made room.
        while end > offset && rounds <= super::evict::EVICT_ROUNDS {
            let evictions = self.evictions();
            match self
                .client
                .allocate_objects(ino, offset, end - offset, mode)
                .await
            {
                Ok(()) => break,
                // A cache instance's full tier: clean files are evicted (see `evict`), or,
                // with none left, the file goes to the PFS (see `through`).
                Err(e) if self.cache && e.code() == Some(surge_proto::ErrorCode::NoSpace) => {
                    rounds += 1;
                    if rounds < super::evict::EVICT_ROUNDS
                        && self.make_room(ino, end - offset, evictions).await
                    {
                        continue;
                    }
                    if let Some(b) = self.inodes.backing(ino) {
                        // Open by kernel passthrough here (`passthrough=on`): the kernel
                        // writes its tier object, so it cannot move to the PFS; like its
                        // writes, the allocation goes past the capacity until the close.
                        fallocate_file(&b, bits, offset, len)
                            .map_err(|e| FsError::io("fallocate of a passthrough file", e))?;
                        self.inodes.changed_data(ino, end, 0, grows);
                        return Ok(());
                    }
                    let f = self.go_through(ino).await?;
                    return self
                        .fallocate_through(f, ino, offset, len, bits, grows)
                        .await;
                }
                Err(e) => {
                    if (grows || past_end) && end > size {
                        self.undo_allocation(ino, size, end).await;
                    }
                    return Err(e.into());
                }
            }
        }
        let mask = if end > offset {
            self.client.fragments_touched(ino, offset, end - offset)
        } else {
            0
        };
        self.inodes.changed_data(ino, end, mask, grows);
        Ok(())
    }

    /// After a failed `fallocate` that would have grown `ino` from `size` to `end`: the
    /// fragments that did allocate their part (one request per fragment, each may succeed
    /// alone) have objects past the file's end, which nothing would ever remove (an unlink
    /// removes what lies within the size; xfstests generic/103 then left 2 GiB of a 4 GiB
    /// instance taken for good). They are cut back to the file's end. A write that grows the
    /// file past `size` at the same moment, racing the failing fallocate over the same range,
    /// may lose its part past `size`, as with any two unordered changes of one range.
    async fn undo_allocation(&self, ino: Ino, size: u64, end: u64) {
        let size = size.max(self.inodes.size(ino));
        if size >= end {
            return;
        }
        if let Err(e) = self.client.truncate_objects(ino, end, size).await {
            warn!(
                "inode {ino}: a failed fallocate's allocation past the end of the file \
                 ({size} to {end}) could not be released: {e}"
            );
        }
    }

    /// `fallocate` of a file written through: on its PFS file (`bits`: the call's mode).
    async fn fallocate_through(
        &self,
        f: std::sync::Arc<std::fs::File>,
        ino: Ino,
        offset: u64,
        len: u64,
        bits: i32,
        grows: bool,
    ) -> FsResult<()> {
        super::through::on_pfs("fallocate of the PFS file", move || {
            fallocate_file(&f, bits, offset, len)
        })
        .await?;
        self.inodes.changed_data(ino, offset + len, 0, grows);
        Ok(())
    }

    /// Sends this node's size and mtime of `ino` to the metadata server if writes are pending.
    pub(super) async fn commit(&self, ino: Ino) -> FsResult<()> {
        let _size = self.size_lock(ino).lock().await;
        self.commit_locked(ino, false).await
    }

    /// [`commit`](Self::commit) at the close of a handle (`flush`, `release`): with no other
    /// handle of the file open here, the metadata server stops counting this mount as its
    /// writer.
    async fn commit_at_close(&self, ino: Ino) -> FsResult<()> {
        let _size = self.size_lock(ino).lock().await;
        self.commit_locked(ino, true).await
    }

    /// [`commit`](Self::commit) with the inode's size lock held by the caller; `closing`: at
    /// the close of a handle (see [`commit_pending`](Self::commit_pending)).
    async fn commit_locked(&self, ino: Ino, closing: bool) -> FsResult<()> {
        let Some((size, mtime, set)) = self.inodes.take_pending(ino) else {
            return Ok(());
        };
        // An mtime the application set after the last write (see `Inodes::defer_mtime`).
        let set = set.then_some(TimeSet::At(mtime));
        self.commit_pending(ino, size, mtime, set, closing)
            .await
            .map(|_| ())
    }

    /// A `setattr` of the mtime alone (`set`) on a file open here with writes pending: those
    /// are committed with that mtime, in one request; the attributes after. `None` (nothing
    /// sent) when `set` changes more than the mtime, nothing is pending, or the commit alone
    /// would skip a check the metadata server's `setattr` makes (a cache namespace, a file
    /// written through to the PFS, one this node saw immutable or append-only: those refuse
    /// new times there). The inode's size lock is held by the caller.
    async fn commit_with_mtime(&self, ino: Ino, set: &SetAttr) -> FsResult<Option<Attr>> {
        let only_mtime = SetAttr {
            mtime: set.mtime,
            ..SetAttr::default()
        };
        let Some(new_mtime) = set.mtime.filter(|_| *set == only_mtime) else {
            return Ok(None);
        };
        if !self.mtime_may_ride_on_commit(ino) {
            return Ok(None);
        }
        let Some((size, mtime, _)) = self.inodes.take_pending(ino) else {
            return Ok(None);
        };
        self.commit_pending(ino, size, mtime, Some(new_mtime), false)
            .await
    }

    /// True when an mtime the application sets on `ino` may go with a commit of its writes
    /// rather than a `setattr`: the commit skips checks the metadata server's `setattr`
    /// makes, which refuse new times in a cache namespace, on a file written through to the
    /// PFS and on one this node saw immutable or append-only (or whose flags it does not
    /// know).
    fn mtime_may_ride_on_commit(&self, ino: Ino) -> bool {
        let flagged = self
            .inodes
            .flags(ino)
            .is_none_or(|f| f & (surge_proto::FL_IMMUTABLE | surge_proto::FL_APPEND) != 0);
        !self.cache && !flagged && self.through_file(ino).is_none()
    }

    /// Commits `size` and the `mtime` of this node's writes (or `set_mtime`, a time the
    /// application set) taken from the inode's pending state; on failure they are pending
    /// again.
    async fn commit_pending(
        &self,
        ino: Ino,
        size: u64,
        mtime: surge_proto::Timestamp,
        set_mtime: Option<TimeSet>,
        closing: bool,
    ) -> FsResult<Option<Attr>> {
        // Still this mount's writer after the commit: another handle stays open here (the
        // handle being closed counts until its release is done).
        let opens = self.inodes.with(ino, |i| i.opens).unwrap_or(0);
        let writing = opens > u32::from(closing);
        // The file may have been made behind: the server must know it first.
        self.barrier().await?;
        match self
            .client
            .commit_write(ino, size, set_mtime.unwrap_or(TimeSet::At(mtime)), writing)
            .await
        {
            Ok(a) => {
                self.inodes.committed(ino, &a);
                if self.cache && a.through != 0 && self.through_file(ino).is_none() {
                    // Another node switched the file to the PFS (the fast tier was full) while
                    // this one wrote to the fast tier: those writes are not on the PFS.
                    return Err(FsError::new(
                        libc::EIO,
                        format!(
                            "inode {ino}: written here on the fast tier while another node \
                             wrote it through to the PFS (the tier was full); this node's \
                             writes since it opened the file are lost: write a file from one \
                             node when the instance may fill"
                        ),
                    ));
                }
                Ok(Some(a))
            }
            Err(e) if self.cache && e.code() == Some(surge_proto::ErrorCode::Stale) => {
                // Evicted while written here: only when this node's reports of its opens
                // stopped reaching the metadata server for `CACHE_OPEN_TTL` (see `evict`).
                let e = FsError::new(
                    libc::EIO,
                    format!(
                        "inode {ino}: evicted from the fast tier while written here (this \
                         mount's opens were not reported for {} s): writes since it was \
                         opened are lost ({e})",
                        surge_proto::CACHE_OPEN_TTL.as_secs()
                    ),
                );
                warn!("{e}");
                Err(e)
            }
            Err(e) => {
                self.inodes.commit_failed(ino, mtime);
                Err(e.into())
            }
        }
    }

    /// True when `flush` of `fh` has nothing to send (no writes pending), so the adapter can
    /// answer at once without a trip through the async runtime.
    pub fn flush_is_noop(&self, fh: u64) -> bool {
        self.inodes.nothing_pending(fh)
    }

    /// Releases `fh` at once if that needs no network request (nothing to commit, nothing to
    /// purge); returns false to have the caller run the full [`release`](Self::release).
    pub fn release_fast(&self, fh: u64) -> bool {
        self.inodes.release_fast(fh)
    }

    /// `close(2)` of a descriptor: make what was written visible to other nodes.
    pub async fn flush(&self, fh: u64) -> FsResult<()> {
        let ino = self.inodes.handle_ino(fh)?;
        // What the kernel wrote into a passthrough file counts before `close` returns (the
        // next open for writing is let through only while the instance has room).
        let backing = self.inodes.backing(ino);
        if let Some(b) = &backing {
            self.account_backing(ino, b).await;
        }
        self.commit_at_close(ino).await?;
        // The kernel changed the passthrough file itself (this runs only when something was
        // to commit, see `flush_is_noop`): a write(2) drops the kernel's cached attributes, a
        // store through a shared memory map does not, and a stat after `close` would show the
        // times and size of before (xfstests generic/215). Dropped here, before `close`
        // returns.
        if backing.is_some() {
            if let Some(drop_attrs) = self.drop_attrs.get() {
                drop_attrs(ino);
            }
        }
        Ok(())
    }

    /// True when no read, write or `fsync` of `fh` waits on the PFS (not a cache namespace,
    /// not a file written through to the PFS): an `fsync` is at most a sync of the objects
    /// and a commit.
    pub fn waits_on_no_pfs(&self, fh: u64) -> bool {
        !self.cache
            && self
                .inodes
                .handle_ino(fh)
                .is_ok_and(|ino| self.through_file(ino).is_none())
    }

    pub async fn fsync(&self, fh: u64) -> FsResult<()> {
        let ino = self.inodes.handle_ino(fh)?;
        let touched = self.inodes.take_touched(ino);
        if let Some(b) = self.inodes.backing(ino) {
            b.sync_data().map_err(|e| FsError::io("fsync", e))?;
        }
        if let Some(f) = self.through_file(ino) {
            super::through::on_pfs("fsync of the PFS file", move || f.sync_data()).await?;
        }
        if touched != 0 {
            if let Err(e) = self.client.sync_objects(ino, touched).await {
                self.inodes.untake_touched(ino, touched);
                return Err(e.into());
            }
        }
        self.commit(ino).await?;
        if self.cache && self.client.desc.cache_fsync_pfs {
            self.wait_on_pfs(ino).await?;
        }
        Ok(())
    }

    /// Last close of a handle.
    pub async fn release(&self, fh: u64) -> FsResult<()> {
        let ino = self.inodes.handle_ino(fh)?;
        let commit = self.commit_at_close(ino).await;
        let r = self.inodes.release(fh, ino);
        if r.backing_changed && r.purge.is_none() {
            // Capacity accounting of what the kernel wrote directly.
            if let Err(e) = self.client.object_changed(ino).await {
                warn!("could not account passthrough writes of inode {ino}: {e}");
            }
        }
        if let Some(size) = r.purge {
            self.purge(ino, size).await;
        }
        commit
    }

    async fn purge(&self, ino: Ino, size: u64) {
        if let Err(e) = self.barrier().await {
            warn!("could not remove the data of unlinked inode {ino}: {e}");
            return;
        }
        if let Err(e) = self.client.purge(ino, size).await {
            warn!("could not remove the data of unlinked inode {ino}: {e}");
        }
    }

    /// After the last name of an inode went away: remove its data now, or at its last close on
    /// this node if it is open here.
    pub(super) async fn orphaned(&self, u: Unlinked) {
        if !u.orphaned {
            return;
        }
        if u.purged {
            super::behind::remove_purged_data(&self.client, &u).await;
            return;
        }
        match self.inodes.orphaned(&u) {
            Some(size) => self.purge(u.ino, size).await,
            // Open here: removed at the last close, or by another mount if this one goes.
            None => {
                self.start_recalls();
            }
        }
    }

    /// Attributes from the metadata server, with this node's view overlaid (see
    /// [`super::inodes::InodeTable::observe`]); a directory's counter is checked against its
    /// listing.
    pub(super) fn observe(&self, a: Attr, lookup: bool) -> Attr {
        self.listings.seen(&a);
        self.client.note_layout(&a);
        self.inodes.observe(a, lookup)
    }
}

/// EPERM for an open for writing of a file with `chattr` flags that forbid it: any of an
/// immutable file, one without `O_APPEND` of an append-only file (Linux's `may_open`).
pub(super) fn check_flags(ino: Ino, flags: u32, append: bool) -> FsResult<()> {
    if flags & surge_proto::FL_IMMUTABLE != 0 {
        return Err(FsError::new(
            libc::EPERM,
            format!("inode {ino} is immutable (chattr +i)"),
        ));
    }
    if flags & surge_proto::FL_APPEND != 0 && !append {
        return Err(FsError::new(
            libc::EPERM,
            format!("inode {ino} is append-only (chattr +a): open it with O_APPEND"),
        ));
    }
    Ok(())
}

/// Whether `perm` has bits a write by an unprivileged user clears: setuid, and setgid with
/// group execute (`setattr_should_drop_suidgid`).
pub(super) fn drops_privilege(perm: u16) -> bool {
    perm & libc::S_ISUID as u16 != 0
        || (perm & libc::S_ISGID as u16 != 0 && perm & libc::S_IXGRP as u16 != 0)
}

/// `fallocate(2)` of `f` with mode `bits`.
fn fallocate_file(f: &std::fs::File, bits: i32, offset: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor and plain integers.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            bits,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
