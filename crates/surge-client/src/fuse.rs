//! The FUSE adapter: translates `fuser` callbacks into calls on the core ([`crate::fs::Fs`]).
//! Each request is handed to the tokio runtime as a task that replies when done, so the FUSE
//! threads never block on the network and many requests are in flight at once.

use crate::fs::{Fs, KillSuidgid, LockRequest, NewPerm, ReadSource};
use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, Notifier, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen, ReplyStatfs,
    ReplyStatx, ReplyWrite, Request, RequestId, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};
use surge_proto::{Attr, FileKind, LockKind, SetAttr, TimeSet, Timestamp};
use tokio::runtime::Handle;
use tracing::debug;

/// Largest write the kernel sends in one request (the kernel's own cap).
pub const MAX_WRITE: u32 = 1 << 20;
/// Block size reported to applications: stdio and most copy tools size their buffers from it,
/// and larger requests mean fewer round trips through the kernel and the network.
const BLKSIZE: u32 = 1 << 20;

/// How long the kernel may cache names and attributes. Close-to-open does not depend on it
/// (every open fetches fresh attributes, and a cached name that leads to a removed or replaced
/// inode makes the kernel look the path up again, see `fs::stale`); what it bounds is how old a
/// `stat` of a file another node changed can be. 10 s, as NFS's attribute cache bounds go,
/// keeps metadata-heavy jobs (mdtest, Python imports) out of the network.
#[derive(Clone, Copy, Debug)]
pub struct CacheTimes {
    pub entry: Duration,
    pub attr: Duration,
}

impl Default for CacheTimes {
    fn default() -> Self {
        CacheTimes {
            entry: Duration::from_secs(10),
            attr: Duration::from_secs(10),
        }
    }
}

pub struct FuseAdapter {
    fs: Arc<Fs>,
    rt: Handle,
    ttl: CacheTimes,
    notifier: Arc<OnceLock<Notifier>>,
    /// Ask the kernel for FUSE passthrough (the local fast path).
    passthrough: bool,
    /// Answer metadata requests on the FUSE thread (see `crate::blocking`).
    inline_metadata: bool,
    backing: Arc<BackingCache>,
    /// The root helper that registers backing files for this mount when it is not root
    /// (`crate::lend`); set before the session starts.
    lender: Arc<OnceLock<Arc<crate::lend::Lender>>>,
    /// Ask the kernel for passthrough for the helper (it is connected right after the
    /// handshake, which needs the session's descriptor; see `mount::mount`).
    lend: bool,
    /// Immutable namespaces: the kernel also caches "no such name" for this long, and keeps
    /// directory listings (`FOPEN_CACHE_DIR`).
    negative_ttl: Option<Duration>,
    /// The session's requests by number (set once it is made): lock requests wait for those
    /// read before them (see [`FuseAdapter::in_order`]).
    order: Arc<OnceLock<Arc<fuser::TransportStats>>>,
}

/// How long a lock request waits for the requests the kernel queued before it to be
/// dispatched (microseconds, unless one of them never comes).
const ORDER_WAIT: Duration = Duration::from_millis(5);

/// A kernel backing id: registered by this process (root), or by the passthrough helper
/// (`crate::lend`), which then also unregisters it.
struct Backing {
    id: std::mem::ManuallyDrop<BackingId>,
    lender: Option<Arc<crate::lend::Lender>>,
}

impl Backing {
    /// Registers `file` for the connection of `reply`: through the helper when there is one.
    fn open(
        lender: &OnceLock<Arc<crate::lend::Lender>>,
        file: &std::fs::File,
        open_here: impl FnOnce() -> std::io::Result<BackingId>,
        wrap: impl FnOnce(u32) -> BackingId,
    ) -> std::io::Result<Backing> {
        use std::os::fd::AsFd;
        Ok(match lender.get() {
            Some(l) => Backing {
                id: std::mem::ManuallyDrop::new(wrap(l.open(file.as_fd())?)),
                lender: Some(l.clone()),
            },
            None => Backing {
                id: std::mem::ManuallyDrop::new(open_here()?),
                lender: None,
            },
        })
    }
}

impl std::ops::Deref for Backing {
    type Target = BackingId;
    fn deref(&self) -> &BackingId {
        &self.id
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        // SAFETY: taken once, here, and not used after.
        let id = unsafe { std::mem::ManuallyDrop::take(&mut self.id) };
        match &self.lender {
            Some(l) => {
                let raw = id.into_raw();
                if let Err(e) = l.close(raw) {
                    debug!("the passthrough helper did not close backing id {raw}: {e}");
                }
            }
            None => drop(id),
        }
    }
}

/// Kernel backing ids of files open in passthrough mode: one per inode, shared by all its
/// opens (the kernel refuses two backing files for one inode), released at the last close.
#[derive(Default)]
struct BackingCache {
    by_ino: parking_lot::Mutex<std::collections::HashMap<u64, (Arc<Backing>, u32)>>,
    fh_ino: parking_lot::Mutex<std::collections::HashMap<u64, u64>>,
}

impl BackingCache {
    fn get_or(
        &self,
        ino: u64,
        fh: u64,
        open: impl FnOnce() -> std::io::Result<Backing>,
    ) -> std::io::Result<Arc<Backing>> {
        let mut by = self.by_ino.lock();
        let id = match by.get_mut(&ino) {
            Some((id, n)) => {
                *n += 1;
                id.clone()
            }
            None => {
                let id = Arc::new(open()?);
                by.insert(ino, (id.clone(), 1));
                id
            }
        };
        self.fh_ino.lock().insert(fh, ino);
        Ok(id)
    }

    fn put(&self, fh: u64) {
        let Some(ino) = self.fh_ino.lock().remove(&fh) else {
            return;
        };
        let mut by = self.by_ino.lock();
        if let Some((_, n)) = by.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                by.remove(&ino);
            }
        }
    }
}

impl FuseAdapter {
    pub fn new(
        fs: Arc<Fs>,
        rt: Handle,
        ttl: CacheTimes,
        notifier: Arc<OnceLock<Notifier>>,
        passthrough: bool,
        inline_metadata: bool,
    ) -> Self {
        FuseAdapter {
            fs,
            rt,
            ttl,
            notifier,
            passthrough,
            inline_metadata,
            backing: Arc::new(BackingCache::default()),
            lender: Arc::new(OnceLock::new()),
            lend: false,
            negative_ttl: None,
            order: Arc::new(OnceLock::new()),
        }
    }

    /// Where the session's dispatch order goes once the session is made.
    pub fn dispatch_order(&self) -> Arc<OnceLock<Arc<fuser::TransportStats>>> {
        self.order.clone()
    }

    /// Waits until the requests the kernel queued before `req` have been dispatched, so that
    /// a lock request sees what an earlier close did (its locks taken from the table, see
    /// `Fs::take_handle_locks`), even when that close was read by another thread.
    fn in_order(&self, req: &Request) {
        if let Some(o) = self.order.get() {
            if !o.order.wait_before(req.unique().0, ORDER_WAIT) {
                debug!(
                    "request {}: one queued before it never came ({ORDER_WAIT:?})",
                    req.unique().0
                );
            }
        }
    }

    /// Where the passthrough helper's connection goes once made (see `crate::lend`): with
    /// one, the kernel is asked for passthrough even when this process is not root.
    pub fn lender(&self) -> Arc<OnceLock<Arc<crate::lend::Lender>>> {
        self.lender.clone()
    }

    /// Asks the kernel for passthrough although this process is not root: the caller
    /// connects the helper after the handshake (or turns passthrough off if it cannot).
    pub fn with_lender(mut self) -> Self {
        self.lend = true;
        self
    }

    /// Lets the kernel cache failed lookups for `ttl` (only for a namespace nobody changes:
    /// a name created later would stay invisible for that long).
    pub fn with_negative_cache(mut self, ttl: Duration) -> Self {
        self.negative_ttl = Some(ttl);
        self
    }
}

/// The largest write or read answered on the FUSE thread that read it (see
/// `FuseAdapter::write`).
const INLINE_DATA: usize = 64 * 1024;

impl FuseAdapter {
    /// Runs a metadata request: on this FUSE thread, with its single round trips sent from
    /// here (`crate::blocking`: one thread wake-up less each way, which is most of a metadata
    /// request's cost), or handed to the runtime when inline metadata is off.
    fn metadata(&self, fut: impl std::future::Future<Output = ()> + Send + 'static) {
        if self.inline_metadata {
            crate::blocking::inline(|| self.rt.block_on(fut));
        } else {
            self.rt.spawn(fut);
        }
    }

    /// Runs a data request as a metadata request is (see [`metadata`](Self::metadata)) when
    /// `inline` (a small one, waiting on no PFS), else on the runtime.
    fn data(&self, inline: bool, fut: impl std::future::Future<Output = ()> + Send + 'static) {
        if inline {
            self.metadata(fut);
        } else {
            self.rt.spawn(fut);
        }
    }
}

fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

/// Attributes for the kernel, `st_blocks` from the size (files just made, nodes that are not
/// regular files); [`file_attr_blocks`] with what a file really holds.
pub fn file_attr(a: &Attr) -> FileAttr {
    file_attr_blocks(a, crate::fs::dense_blocks(a.size))
}

/// Attributes for the kernel with `blocks` (512-byte units, see `Fs::blocks`).
pub fn file_attr_blocks(a: &Attr, blocks: u64) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks,
        atime: a.atime.to_system_time(),
        mtime: a.mtime.to_system_time(),
        ctime: a.ctime.to_system_time(),
        crtime: a.btime.to_system_time(),
        kind: kind(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        flags: 0,
        blksize: BLKSIZE,
    }
}

/// Attributes the kernel does not use (a negative entry's, `.` and `..` of `readdirplus`).
fn unused_attr(ino: u64, kind: FileType) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        flags: 0,
        blksize: BLKSIZE,
    }
}

/// `getxattr`/`listxattr` replies: with `size` 0 the length the caller needs, else the bytes,
/// or ERANGE when they do not fit.
fn reply_xattr(reply: fuser::ReplyXattr, value: &[u8], size: u32) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() > size as usize {
        reply.error(Errno::from_i32(libc::ERANGE));
    } else {
        reply.data(value);
    }
}

/// Fills `buf` from `file` at `offset`; past the object's end (a hole) with zeros.
fn read_object(file: &std::fs::File, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf[done..].fill(0);
    Ok(buf.len())
}

/// The groups of the process `pid` that made a request: its fsgid `gid` and its supplementary
/// groups (`Groups:` of `/proc/PID/status`, what the kernel's `in_group_p` looks at); only
/// `gid` when the process is gone.
fn caller_groups(pid: u32, gid: u32) -> Vec<u32> {
    let mut groups = vec![gid];
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    if let Some(line) = status.lines().find_map(|l| l.strip_prefix("Groups:")) {
        groups.extend(
            line.split_whitespace()
                .filter_map(|g| g.parse::<u32>().ok()),
        );
    }
    groups
}

/// The permission bits a create asks for and the umask, which the kernel leaves to the file
/// system (FUSE_DONT_MASK).
fn new_perm(mode: u32, umask: u32) -> NewPerm {
    NewPerm {
        perm: (mode & 0o7777) as u16,
        umask: (umask & 0o777) as u16,
    }
}

fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(st) => TimeSet::At(Timestamp::from_system_time(st)),
    }
}

/// How a file opened `O_APPEND` is opened where the metadata server decides where appends
/// go: without the page cache, so every `write(2)` comes to the daemon whole (up to
/// [`MAX_WRITE`]) with no page of it cached at the kernel's own guess of the end.
fn append_flags() -> FopenFlags {
    FopenFlags::FOPEN_DIRECT_IO
}

/// The open flags of a file made by `create` or `tmpfile` with open `flags`: those of an
/// append at the metadata server for `O_APPEND`, where appends go there.
fn created_flags(flags: i32, fs: &Fs) -> FopenFlags {
    if flags & libc::O_APPEND != 0 && fs.appends_at_server() {
        append_flags()
    } else {
        FopenFlags::empty()
    }
}

/// `FS_IOC_GETFLAGS`/`FS_IOC_SETFLAGS` (the `long` and the 32-bit `int` forms) and
/// `FS_IOC_FSGETXATTR`/`FS_IOC_FSSETXATTR`.
const FS_IOC_GETFLAGS: [u32; 2] = [0x8008_6601, 0x8004_6601];
const FS_IOC_SETFLAGS: [u32; 2] = [0x4008_6602, 0x4004_6602];
const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;
/// `struct fsxattr`'s `fsx_xflags` of the `chattr` flags kept, beside the `FS_*_FL` flag.
const XFLAGS: [(u32, u32); 4] = [
    (0x08, surge_proto::FL_IMMUTABLE),
    (0x10, surge_proto::FL_APPEND),
    (0x80, surge_proto::FL_NODUMP),
    (0x40, surge_proto::FL_NOATIME),
];

/// A `chattr` ioctl.
#[derive(Clone, Copy)]
enum FlagsIoctl {
    Get { xflags: bool },
    Set { flags: u32 },
}

impl FlagsIoctl {
    fn of(cmd: u32, data: &[u8]) -> Option<FlagsIoctl> {
        let word = |at: usize| {
            data.get(at..at + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_ne_bytes)
        };
        if FS_IOC_GETFLAGS.contains(&cmd) {
            Some(FlagsIoctl::Get { xflags: false })
        } else if cmd == FS_IOC_FSGETXATTR {
            Some(FlagsIoctl::Get { xflags: true })
        } else if FS_IOC_SETFLAGS.contains(&cmd) {
            Some(FlagsIoctl::Set { flags: word(0)? })
        } else if cmd == FS_IOC_FSSETXATTR {
            let x = word(0)?;
            let known: u32 = XFLAGS.iter().map(|(x, _)| x).sum();
            // xflags not kept here are refused at the server with the flags they map to.
            let mut flags = if x & !known != 0 {
                !surge_proto::FILE_FLAGS
            } else {
                0
            };
            for (xf, f) in XFLAGS {
                if x & xf != 0 {
                    flags |= f;
                }
            }
            Some(FlagsIoctl::Set { flags })
        } else {
            None
        }
    }
}

/// `statx`'s `STATX_ATTR_*` bits of `chattr` flags `flags`, and the mask of those kept.
fn statx_attributes(flags: u32) -> (u64, u64) {
    let map = [
        (surge_proto::FL_IMMUTABLE, libc::STATX_ATTR_IMMUTABLE),
        (surge_proto::FL_APPEND, libc::STATX_ATTR_APPEND),
        (surge_proto::FL_NODUMP, libc::STATX_ATTR_NODUMP),
    ];
    let mut attributes = 0u64;
    let mut mask = 0u64;
    for (f, a) in map {
        mask |= a as u64;
        if flags & f != 0 {
            attributes |= a as u64;
        }
    }
    (attributes, mask)
}

/// A `struct fsxattr` (28 bytes) with the xflags of `flags`.
fn fsxattr(flags: u32) -> [u8; 28] {
    let mut x = 0u32;
    for (xf, f) in XFLAGS {
        if flags & f != 0 {
            x |= xf;
        }
    }
    let mut out = [0u8; 28];
    out[..4].copy_from_slice(&x.to_ne_bytes());
    out
}

/// A lock type of the kernel (`F_RDLCK`, `F_WRLCK`, `F_UNLCK`).
fn lock_kind(typ: i32) -> Option<LockKind> {
    match typ {
        libc::F_RDLCK => Some(LockKind::Read),
        libc::F_WRLCK => Some(LockKind::Write),
        libc::F_UNLCK => Some(LockKind::Unlock),
        _ => None,
    }
}

fn lock_type(kind: LockKind) -> i32 {
    match kind {
        LockKind::Read => libc::F_RDLCK,
        LockKind::Write => libc::F_WRLCK,
        LockKind::Unlock => libc::F_UNLCK,
    }
}

fn name_bytes(name: &OsStr) -> Vec<u8> {
    name.as_bytes().to_vec()
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_readahead(MAX_WRITE);
        let _ = config.set_max_background(64);
        // Optional capabilities: take each the kernel offers.
        for cap in [
            InitFlags::FUSE_AUTO_INVAL_DATA,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_ASYNC_DIO,
            // This side clears setuid/setgid on writes and truncates (see `Fs::write`): the
            // kernel then marks files without them S_NOSEC and stops asking for
            // `security.capability` before every write (one round trip each otherwise).
            InitFlags::FUSE_HANDLE_KILLPRIV_V2,
            // fcntl (POSIX, OFD) and flock locks come here and are kept by the metadata
            // server, so they hold between nodes (`fs::locks`).
            InitFlags::FUSE_POSIX_LOCKS,
            InitFlags::FUSE_FLOCK_LOCKS,
            // File handles (name_to_handle_at/open_by_handle_at, NFS re-export) that outlive
            // the kernel's inode: node ids are the metadata server's inode numbers, never
            // reused (generation 0 throughout), and a forgotten one is looked up as "." of
            // itself, a directory's parent as its ".." (see `Fs::lookup`).
            InitFlags::FUSE_EXPORT_SUPPORT,
            // POSIX ACLs (`fs::xattr`): the kernel checks permissions with the ACLs it reads
            // through getxattr (default_permissions is on) and leaves the umask to this side
            // (FUSE_DONT_MASK: a directory's default ACL replaces it, see `NewPerm`).
            InitFlags::FUSE_POSIX_ACL,
            InitFlags::FUSE_DONT_MASK,
        ] {
            let _ = config.add_capabilities(cap);
        }
        // An immutable namespace lists directories with their entries' attributes in one
        // request (the kernel then resolves the names without a lookup each).
        if self.negative_ttl.is_some() {
            let _ = config.add_capabilities(InitFlags::FUSE_DO_READDIRPLUS);
        }
        // A passthrough file changed through a memory map: its attributes go (see
        // `Fs::flush`; offset -1: the attributes only).
        let notifier = self.notifier.clone();
        self.fs.set_attr_drop(Arc::new(move |ino| {
            if let Some(n) = notifier.get() {
                if let Err(e) = n.inval_inode(INodeNo(ino), -1, 0) {
                    debug!("cannot drop the kernel's attributes of inode {ino}: {e}");
                }
            }
        }));
        // A cache file copied into the tier: its pages cached from the PFS go (see `fill`).
        let notifier = self.notifier.clone();
        self.fs.set_page_drop(Arc::new(move |ino| {
            if let Some(n) = notifier.get() {
                let _ = n.inval_inode(INodeNo(ino), 0, 0);
            }
        }));
        if (self.passthrough || self.lend)
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && config.set_max_stack_depth(1).is_ok()
        {
            self.fs.enable_passthrough();
        }
        // Which fragments are on this host decides where new files go (see
        // `Fs::new_file_layout`) and which objects this mount reads itself: asked once now,
        // before the first create (which also waits for the answer; `init` may run on a
        // thread of the runtime: no blocking).
        let (fs, passthrough) = (self.fs.clone(), self.fs.passthrough_on());
        self.rt.spawn(async move {
            let local = fs.learn_local_fragments().await;
            fs.remove_abandoned_files().await;
            if passthrough {
                tracing::info!(
                    "kernel FUSE passthrough available: files of one stripe on the {local} \
                     fragment(s) of this host are read and written by the kernel"
                );
            } else {
                tracing::info!("{local} fragment(s) on this host: read here directly");
            }
        });
        Ok(())
    }

    fn destroy(&mut self) {
        let fs = self.fs.clone();
        self.rt.block_on(async move { fs.shutdown().await });
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let (fs, ttl, name) = (self.fs.clone(), self.ttl, name_bytes(name));
        let negative = self.negative_ttl;
        self.metadata(async move {
            match fs.lookup(parent.0, &name).await {
                Ok(a) => {
                    let blocks = fs.blocks(&a).await;
                    reply.entry(&ttl.entry, &file_attr_blocks(&a, blocks), Generation(0))
                }
                // A negative entry: node id 0 with a timeout (FUSE protocol).
                Err(e) if e.errno == libc::ENOENT && negative.is_some() => reply.entry(
                    &negative.unwrap_or_default(),
                    &unused_attr(0, FileType::RegularFile),
                    Generation(0),
                ),
                Err(e) => reply.error(Errno::from_i32(fs.failed("lookup", &e))),
            }
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let (fs, ttl) = (self.fs.clone(), self.ttl);
        self.metadata(async move {
            match fs.getattr(ino.0).await {
                Ok(a) => {
                    let blocks = fs.blocks(&a).await;
                    reply.attr(&ttl.attr, &file_attr_blocks(&a, blocks))
                }
                Err(e) => reply.error(Errno::from_i32(fs.failed("getattr", &e))),
            }
        });
    }

    /// `statx` with the birth time, which the metadata server keeps (none for a file made by
    /// a store before birth times were kept).
    fn statx(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: Option<FileHandle>,
        _mask: u32,
        reply: ReplyStatx,
    ) {
        let (fs, ttl) = (self.fs.clone(), self.ttl);
        self.metadata(async move {
            match fs.getattr_at_server(ino.0).await {
                Ok(a) => {
                    let blocks = fs.blocks(&a).await;
                    let btime = (a.btime != Timestamp::default()).then(|| a.btime.to_system_time());
                    reply.statx(
                        &ttl.attr,
                        &file_attr_blocks(&a, blocks),
                        btime,
                        statx_attributes(a.flags),
                    )
                }
                Err(e) => reply.error(Errno::from_i32(fs.failed("statx", &e))),
            }
        });
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        kill_suidgid: bool,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            perm: mode.map(|m| (m & 0o7777) as u16),
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            flags: None,
        };
        // With FUSE_HANDLE_KILLPRIV_V2 clearing setuid/setgid is this side's job: on a truncate
        // by someone without CAP_FSETID (the kernel checks the capability and says so), and on
        // every chown/chgrp.
        let kill = if mode.is_some() {
            KillSuidgid::Nothing
        } else if uid.is_some() || gid.is_some() {
            KillSuidgid::Chown {
                groups: (req.uid() != 0).then(|| caller_groups(req.pid(), req.gid())),
            }
        } else if size.is_some() && kill_suidgid {
            KillSuidgid::Truncate
        } else {
            KillSuidgid::Nothing
        };
        let (fs, ttl) = (self.fs.clone(), self.ttl);
        self.metadata(async move {
            match fs.setattr(ino.0, set, kill).await {
                Ok(a) => {
                    let blocks = fs.blocks(&a).await;
                    reply.attr(&ttl.attr, &file_attr_blocks(&a, blocks))
                }
                Err(e) => reply.error(Errno::from_i32(fs.failed("setattr", &e))),
            }
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let fs = self.fs.clone();
        self.metadata(async move {
            match fs.readlink(ino.0).await {
                Ok(t) => reply.data(&t),
                Err(e) => reply.error(Errno::from_i32(fs.failed("readlink", &e))),
            }
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let (fs, ttl, name) = (self.fs.clone(), self.ttl, name_bytes(name));
        let (uid, gid) = (req.uid(), req.gid());
        let perm = new_perm(mode, umask);
        self.metadata(async move {
            match fs.mkdir(parent.0, &name, perm, uid, gid).await {
                Ok(a) => reply.entry(&ttl.entry, &file_attr(&a), Generation(0)),
                Err(e) => reply.error(Errno::from_i32(fs.failed("mkdir", &e))),
            }
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (fs, name) = (self.fs.clone(), name_bytes(name));
        self.metadata(async move {
            match fs.unlink(parent.0, &name).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(Errno::from_i32(fs.failed("unlink", &e))),
            }
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (fs, name) = (self.fs.clone(), name_bytes(name));
        self.metadata(async move {
            match fs.rmdir(parent.0, &name).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(Errno::from_i32(fs.failed("rmdir", &e))),
            }
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let (fs, ttl, name) = (self.fs.clone(), self.ttl, name_bytes(link_name));
        let target = target.as_os_str().as_bytes().to_vec();
        let (uid, gid) = (req.uid(), req.gid());
        self.metadata(async move {
            match fs.symlink(parent.0, &name, &target, uid, gid).await {
                Ok(a) => reply.entry(&ttl.entry, &file_attr(&a), Generation(0)),
                Err(e) => reply.error(Errno::from_i32(fs.failed("symlink", &e))),
            }
        });
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (fs, name, newname) = (self.fs.clone(), name_bytes(name), name_bytes(newname));
        self.metadata(async move {
            match fs
                .rename(parent.0, &name, newparent.0, &newname, flags.bits())
                .await
            {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(Errno::from_i32(fs.failed("rename", &e))),
            }
        });
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let (fs, ttl, newname) = (self.fs.clone(), self.ttl, name_bytes(newname));
        self.metadata(async move {
            match fs.link(ino.0, newparent.0, &newname).await {
                Ok(a) => {
                    let blocks = fs.blocks(&a).await;
                    reply.entry(&ttl.entry, &file_attr_blocks(&a, blocks), Generation(0))
                }
                Err(e) => reply.error(Errno::from_i32(fs.failed("link", &e))),
            }
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let (fs, notifier, cache) = (self.fs.clone(), self.notifier.clone(), self.backing.clone());
        let lender = self.lender.clone();
        let writer = flags.0 & libc::O_ACCMODE != libc::O_RDONLY;
        let reader = flags.0 & libc::O_ACCMODE != libc::O_WRONLY;
        let append = flags.0 & libc::O_APPEND != 0;
        self.metadata(async move {
            match fs.open(ino.0, reader, writer, append).await {
                Ok(o) => {
                    if o.invalidate_attr {
                        // Another node changed the file: drop the kernel's cached size and
                        // times (pages are dropped because KEEP_CACHE is not set).
                        if let Some(n) = notifier.get() {
                            let _ = n.inval_inode(ino, -1, 0);
                        }
                    }
                    let mut flags = if o.keep_cache {
                        FopenFlags::FOPEN_KEEP_CACHE
                    } else {
                        FopenFlags::empty()
                    };
                    if append && fs.appends_at_server() {
                        flags = append_flags();
                    }
                    if let Some(file) = &o.backing {
                        let open = || {
                            Backing::open(
                                &lender,
                                file,
                                || reply.open_backing(&**file),
                                // SAFETY: an id the helper registered on this connection,
                                // closed only when the Backing holding it drops.
                                |id| unsafe { reply.wrap_backing(id) },
                            )
                        };
                        match cache.get_or(ino.0, o.fh, open) {
                            Ok(id) => {
                                return reply.opened_passthrough(
                                    FileHandle(o.fh),
                                    FopenFlags::empty(),
                                    &id,
                                )
                            }
                            Err(e) => {
                                debug!("kernel refused a backing file ({e}): no passthrough");
                                fs.disable_passthrough();
                            }
                        }
                    }
                    reply.opened(FileHandle(o.fh), flags)
                }
                Err(e) => reply.error(Errno::from_i32(fs.failed("open", &e))),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let fs = self.fs.clone();
        // A small read (4 KiB random reads) is answered from this FUSE thread, as a small
        // write is (see `write`): from the object when it is on this host, else in one round
        // trip; larger ones (readahead, striped over several servers) go to the runtime.
        let inline = size as usize <= INLINE_DATA && self.fs.waits_on_no_pfs(fh.0);
        let fut = async move {
            if !reply.is_ring() {
                match fs.read(fh.0, offset, size).await {
                    Ok(d) => reply.data(&d),
                    Err(e) => reply.error(Errno::from_i32(fs.failed("read", &e))),
                }
                return;
            }
            // Over io_uring a local object is read straight into the request's ring entry,
            // from which the kernel copies it once.
            match fs.read_source(fh.0, offset, size).await {
                Ok(ReadSource::Object { file, offset, len }) => {
                    reply.data_with(len, |buf| read_object(&file, offset, buf))
                }
                Ok(ReadSource::Data(d)) => reply.data(&d),
                Err(e) => reply.error(Errno::from_i32(fs.failed("read", &e))),
            }
        };
        self.data(inline, fut);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let (fs, data) = (self.fs.clone(), data.to_vec());
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        let append = flags.0 & libc::O_APPEND != 0 && self.fs.appends_at_server();
        // A small write (4 KiB random writes, a log line) is one round trip to one server:
        // sent from this FUSE thread, as a metadata request is, a thread wake-up less each
        // way. Larger ones (striped over several servers, many in flight from the page
        // cache's writeback) and those of a cache namespace (which may wait on the PFS) go
        // to the runtime.
        let inline = !append && data.len() <= INLINE_DATA && self.fs.waits_on_no_pfs(fh.0);
        let fut = async move {
            let written = if append {
                fs.append(fh.0, &data, kill).await
            } else {
                fs.write(fh.0, offset, &data, kill).await
            };
            match written {
                Ok(n) => reply.written(n),
                Err(e) => reply.error(Errno::from_i32(fs.failed("write", &e))),
            }
        };
        self.data(inline, fut);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let fs = self.fs.clone();
        self.rt.spawn(async move {
            match fs.fallocate(fh.0, offset, length, mode).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(Errno::from_i32(fs.failed("fallocate", &e))),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // A close releases the POSIX locks of its process on the file.
        let unlock = self.fs.take_owner_locks(ino.0, lock_owner.0);
        // A close with nothing to commit (a file created and closed empty, a read-only
        // open) is answered here, without handing it to another thread.
        if unlock.is_none() && self.fs.flush_is_noop(fh.0) {
            reply.ok();
            return;
        }
        let fs = self.fs.clone();
        self.metadata(async move {
            if let Some(taken) = unlock {
                fs.release_locks(taken).await;
            }
            match fs.flush(fh.0).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(Errno::from_i32(fs.failed("flush", &e))),
            }
        });
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.backing.put(fh.0);
        // OFD and flock locks go with the last close of their open file: taken from the
        // table here, so that a lock request read after this one waits for their release.
        let unlock = self.fs.take_handle_locks(fh.0);
        if unlock.is_none() && self.fs.release_fast(fh.0) {
            reply.ok();
            return;
        }
        let fs = self.fs.clone();
        self.rt.spawn(async move {
            if let Some(taken) = unlock {
                fs.release_locks(taken).await;
            }
            match fs.release(fh.0).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(Errno::from_i32(fs.failed("release", &e))),
            }
        });
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let fs = self.fs.clone();
        let inline = self.fs.waits_on_no_pfs(fh.0);
        let fut = async move {
            match fs.fsync(fh.0).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(Errno::from_i32(fs.failed("fsync", &e))),
            }
        };
        // An fsync that waits on no PFS is a commit at most (one round trip): sent from this
        // FUSE thread, as a metadata request is (a thread wake-up less each way: a 4 KiB write
        // and fsync loop's cost is mostly these).
        self.data(inline, fut);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.fs.opendir(ino.0);
        // An immutable namespace's listings never change: the kernel keeps them.
        let flags = if self.negative_ttl.is_some() {
            FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
        } else {
            FopenFlags::empty()
        };
        reply.opened(FileHandle(0), flags);
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.fs.releasedir(ino.0);
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let fs = self.fs.clone();
        self.metadata(async move {
            match fs.readdir(ino.0, offset).await {
                Ok(items) => {
                    for it in items {
                        if reply.add(
                            INodeNo(it.ino),
                            it.offset,
                            kind(it.kind),
                            OsStr::from_bytes(&it.name),
                        ) {
                            break;
                        }
                    }
                    reply.ok()
                }
                Err(e) => reply.error(Errno::from_i32(fs.failed("readdir", &e))),
            }
        });
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: fuser::ReplyDirectoryPlus,
    ) {
        let (fs, ttl) = (self.fs.clone(), self.ttl);
        self.metadata(async move {
            match fs.readdir_plus(ino.0, offset).await {
                Ok(items) => {
                    // What each file holds, asked of the fragments at once.
                    let blocks = futures::future::join_all(items.iter().map(|(_, a)| {
                        let fs = &fs;
                        async move {
                            match a {
                                Some(a) => fs.blocks(a).await,
                                None => 0,
                            }
                        }
                    }))
                    .await;
                    for ((it, attr), blocks) in items.into_iter().zip(blocks) {
                        let is_dot = it.name == b"." || it.name == b"..";
                        let a = match attr {
                            // `.` and `..` take no lookup; their attributes are not used.
                            _ if is_dot => unused_attr(it.ino, FileType::Directory),
                            // Whether or not the kernel keeps the entry, it counts a lookup
                            // for it once it is in the buffer: record it before adding.
                            Some(a) => file_attr_blocks(&fs.looked_up(a), blocks),
                            None => continue,
                        };
                        if reply.add(
                            INodeNo(it.ino),
                            it.offset,
                            OsStr::from_bytes(&it.name),
                            &ttl.entry,
                            &a,
                            Generation(0),
                        ) {
                            if !is_dot {
                                // Not added (the buffer is full): no lookup was taken.
                                fs.forget(it.ino, 1);
                            }
                            break;
                        }
                    }
                    reply.ok()
                }
                Err(e) => reply.error(Errno::from_i32(fs.failed("readdirplus", &e))),
            }
        });
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Every metadata change is committed before it is acknowledged, except unlinks sent
        // behind the application (fs.rs, `Behind`): wait for those.
        let fs = self.fs.clone();
        self.metadata(async move {
            match fs.fsyncdir().await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(Errno::from_i32(fs.failed("fsyncdir", &e))),
            }
        });
    }

    /// Regular files, FIFOs (`mkfifo`), sockets (`bind`) and devices (the kernel checked
    /// `CAP_MKNOD` for those).
    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let (fs, ttl, name) = (self.fs.clone(), self.ttl, name_bytes(name));
        let (uid, gid) = (req.uid(), req.gid());
        let perm = new_perm(mode, umask);
        self.metadata(async move {
            match fs.mknod(parent.0, &name, mode, perm, rdev, uid, gid).await {
                Ok(a) => reply.entry(&ttl.entry, &file_attr(&a), Generation(0)),
                Err(e) => reply.error(Errno::from_i32(fs.failed("mknod", &e))),
            }
        });
    }

    /// Not provided: EOPNOTSUPP makes the kernel copy with its generic code (reads and
    /// writes, through this daemon or straight into a passthrough file), except into an
    /// immutable file: EPERM, as Linux (xfstests generic/553; the kernel's own check reads
    /// inode flags a FUSE file system does not set, and a passthrough write would not come
    /// here). EOPNOTSUPP, unlike ENOSYS, keeps the kernel asking for each copy.
    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        match self.fs.check_writable(ino_out.0) {
            Ok(()) => reply.error(Errno::from_i32(libc::EOPNOTSUPP)),
            Err(e) => reply.error(Errno::from_i32(e.errno)),
        }
    }

    /// `chattr` flags (the kernel's `FS_IOC_GETFLAGS`/`SETFLAGS` and the `FSGETXATTR`/
    /// `FSSETXATTR` xflags, which `chattr`, `lsattr` and `xfs_io` use): immutable,
    /// append-only, no-dump and no-atime, kept by the metadata server. The kernel checks the
    /// caller's right to change them (owner, and `CAP_LINUX_IMMUTABLE` for immutable and
    /// append-only) before it asks. Other ioctls: ENOTTY, as a local file system answers one
    /// it does not know.
    fn ioctl(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        let Some(op) = FlagsIoctl::of(cmd, in_data) else {
            reply.error(Errno::from_i32(libc::ENOTTY));
            return;
        };
        let (fs, notifier) = (self.fs.clone(), self.notifier.clone());
        self.metadata(async move {
            let got = match op {
                FlagsIoctl::Get { .. } => fs.getattr(ino.0).await,
                FlagsIoctl::Set { flags } => {
                    let set = SetAttr {
                        flags: Some(flags),
                        ..Default::default()
                    };
                    fs.setattr(ino.0, set, KillSuidgid::Nothing).await
                }
            };
            match got {
                Ok(a) => match op {
                    FlagsIoctl::Get { xflags: false } => {
                        reply.ioctl(0, &(a.flags & surge_proto::FILE_FLAGS).to_ne_bytes())
                    }
                    FlagsIoctl::Get { xflags: true } => reply.ioctl(0, &fsxattr(a.flags)),
                    FlagsIoctl::Set { .. } => {
                        // The kernel keeps the attributes it had (ctime moved).
                        if let Some(n) = notifier.get() {
                            let _ = n.inval_inode(ino, -1, 0);
                        }
                        reply.ioctl(0, &[])
                    }
                },
                Err(e) => reply.error(Errno::from_i32(fs.failed("ioctl", &e))),
            }
        });
    }

    /// ENOSYS: the kernel then reports files always ready, as for a local file.
    fn poll(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: fuser::PollNotifier,
        _events: fuser::PollEvents,
        _flags: fuser::PollFlags,
        reply: fuser::ReplyPoll,
    ) {
        reply.error(Errno::ENOSYS);
    }

    /// `SEEK_DATA` and `SEEK_HOLE` (see `fs::space`); the kernel answers the other kinds of
    /// seek itself.
    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: fuser::ReplyLseek,
    ) {
        let hole = match whence {
            libc::SEEK_DATA => false,
            libc::SEEK_HOLE => true,
            _ => {
                reply.error(Errno::EINVAL);
                return;
            }
        };
        let fs = self.fs.clone();
        self.rt.spawn(async move {
            match fs.seek(fh.0, offset, hole).await {
                Ok(o) => reply.offset(o as i64),
                Err(e) => reply.error(Errno::from_i32(fs.failed("lseek", &e))),
            }
        });
    }

    /// Extended attributes (see `fs::xattr`). A namespace that is not stored is answered here
    /// on the FUSE thread.
    fn getxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        size: u32,
        reply: fuser::ReplyXattr,
    ) {
        let name = name_bytes(name);
        if let Some(e) = self.fs.getxattr_here(ino.0, &name, size) {
            reply.error(Errno::from_i32(e.errno));
            return;
        }
        let fs = self.fs.clone();
        self.metadata(async move {
            match fs.getxattr(ino.0, &name, size).await {
                Ok(v) => reply_xattr(reply, &v, size),
                Err(e) => reply.error(Errno::from_i32(fs.failed("getxattr", &e))),
            }
        });
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        let fs = self.fs.clone();
        self.metadata(async move {
            match fs.listxattr(ino.0).await {
                Ok(v) => reply_xattr(reply, &v, size),
                Err(e) => reply.error(Errno::from_i32(fs.failed("listxattr", &e))),
            }
        });
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let (fs, name, value) = (self.fs.clone(), name_bytes(name), value.to_vec());
        // An access ACL set by someone outside the file's group clears setgid (as
        // `posix_acl_update_mode`; the kernel checked CAP_FSETID only for root here).
        let groups = (req.uid() != 0 && name == surge_proto::ACL_ACCESS_XATTR)
            .then(|| caller_groups(req.pid(), req.gid()));
        self.metadata(async move {
            match fs.setxattr(ino.0, &name, &value, flags, groups).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(Errno::from_i32(fs.failed("setxattr", &e))),
            }
        });
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let (fs, name) = (self.fs.clone(), name_bytes(name));
        self.metadata(async move {
            match fs.removexattr(ino.0, &name).await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(Errno::from_i32(fs.failed("removexattr", &e))),
            }
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let fs = self.fs.clone();
        self.metadata(async move {
            match fs.statfs().await {
                Ok(u) => {
                    let bsize = 4096u64;
                    let blocks = u.capacity / bsize;
                    let free = u.capacity.saturating_sub(u.used) / bsize;
                    // Inodes are not limited; report a large pool so tools don't refuse.
                    let files = u.inodes + (1 << 30);
                    reply.statfs(
                        blocks,
                        free,
                        free,
                        files,
                        files - u.inodes,
                        bsize as u32,
                        255,
                        bsize as u32,
                    )
                }
                Err(e) => reply.error(Errno::from_i32(fs.failed("statfs", &e))),
            }
        });
    }

    fn getlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let Some(kind) = lock_kind(typ) else {
            reply.error(Errno::EINVAL);
            return;
        };
        self.in_order(req);
        let req = LockRequest {
            ino: ino.0,
            fh: fh.0,
            owner: lock_owner.0,
            flock: false,
            kind,
            start,
            end,
            pid,
        };
        let fs = self.fs.clone();
        self.rt.spawn(async move {
            match fs.getlk(req).await {
                Ok(Some(h)) => reply.locked(h.start, h.end, lock_type(h.kind), h.pid),
                Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
                Err(e) => reply.error(Errno::from_i32(fs.failed("getlk", &e))),
            }
        });
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        flock: bool,
        reply: ReplyEmpty,
    ) {
        let Some(kind) = lock_kind(typ) else {
            reply.error(Errno::EINVAL);
            return;
        };
        self.in_order(req);
        let unique = req.unique().0;
        let lock = LockRequest {
            ino: ino.0,
            fh: fh.0,
            owner: lock_owner.0,
            flock,
            kind,
            start,
            end,
            pid,
        };
        let fs = self.fs.clone();
        // A blocking lock may wait long: never on a FUSE thread.
        self.rt.spawn(async move {
            match fs.setlk(lock, sleep, unique).await {
                Ok(()) => reply.ok(),
                Err(e) => {
                    debug!("setlk of inode {}: {e}", lock.ino);
                    reply.error(Errno::from_i32(fs.failed("setlk", &e)))
                }
            }
        });
    }

    fn interrupt(&self, _req: &Request, unique: RequestId) {
        self.fs.interrupt(unique.0);
    }

    /// `O_TMPFILE`: an unnamed file, open (see `Fs::tmpfile`).
    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let (fs, ttl) = (self.fs.clone(), self.ttl);
        let (uid, gid) = (req.uid(), req.gid());
        let perm = new_perm(mode, umask);
        self.metadata(async move {
            match fs.tmpfile(parent.0, perm, uid, gid).await {
                Ok((a, fh)) => reply.created(
                    &ttl.entry,
                    &file_attr(&a),
                    Generation(0),
                    FileHandle(fh),
                    created_flags(flags, &fs),
                ),
                Err(e) => reply.error(Errno::from_i32(fs.failed("tmpfile", &e))),
            }
        });
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let (fs, ttl, name, cache) = (
            self.fs.clone(),
            self.ttl,
            name_bytes(name),
            self.backing.clone(),
        );
        let lender = self.lender.clone();
        let (uid, gid) = (req.uid(), req.gid());
        let perm = new_perm(mode, umask);
        self.metadata(async move {
            match fs.create(parent.0, &name, perm, uid, gid, flags).await {
                Ok((a, fh, Some(file))) => {
                    let open = || {
                        Backing::open(
                            &lender,
                            &file,
                            || reply.open_backing(&*file),
                            // SAFETY: as in `open`.
                            |id| unsafe { reply.wrap_backing(id) },
                        )
                    };
                    match cache.get_or(a.ino, fh, open) {
                        Ok(id) => reply.created_passthrough(
                            &ttl.entry,
                            &file_attr(&a),
                            Generation(0),
                            FileHandle(fh),
                            FopenFlags::empty(),
                            &id,
                        ),
                        Err(e) => {
                            debug!("kernel refused a backing file ({e}): no passthrough");
                            fs.disable_passthrough();
                            reply.created(
                                &ttl.entry,
                                &file_attr(&a),
                                Generation(0),
                                FileHandle(fh),
                                FopenFlags::empty(),
                            )
                        }
                    }
                }
                Ok((a, fh, None)) => reply.created(
                    &ttl.entry,
                    &file_attr(&a),
                    Generation(0),
                    FileHandle(fh),
                    created_flags(flags, &fs),
                ),
                Err(e) => reply.error(Errno::from_i32(fs.failed("create", &e))),
            }
        });
    }
}
