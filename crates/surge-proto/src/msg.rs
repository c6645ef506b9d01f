//! The messages carried in a frame's meta section, encoded with `postcard`. Bulk bytes (the data
//! of a write request, the data of a read reply) travel in the frame's payload instead.

use serde::{Deserialize, Serialize};
use std::fmt;
pub use surge_core::layout::{FileLayout, START_ANY, STRIPE_ALL};
use surge_core::{FileId, Ino, InstanceId, NamespaceId};

/// Seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Timestamp {
    pub secs: i64,
    pub nsec: u32,
}

impl Timestamp {
    pub fn now() -> Timestamp {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp {
            secs: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        }
    }

    pub fn to_system_time(self) -> std::time::SystemTime {
        let d = std::time::Duration::new(self.secs.unsigned_abs(), self.nsec);
        if self.secs >= 0 {
            std::time::UNIX_EPOCH + d
        } else {
            std::time::UNIX_EPOCH - d
        }
    }

    pub fn from_system_time(t: std::time::SystemTime) -> Timestamp {
        match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Timestamp {
                secs: d.as_secs() as i64,
                nsec: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                // Before the epoch: floor to whole seconds below, keep nanoseconds positive.
                let (secs, nsec) = if d.subsec_nanos() == 0 {
                    (-(d.as_secs() as i64), 0)
                } else {
                    (-(d.as_secs() as i64) - 1, 1_000_000_000 - d.subsec_nanos())
                };
                Timestamp { secs, nsec }
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    /// Special files: metadata only (the kernel of the node that opens one serves it: a pipe,
    /// a socket's address, a device number).
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl FileKind {
    /// The kind of a node made with `mode` (its `S_IFMT` bits); `None` for an unknown type.
    pub fn from_mode(mode: u32) -> Option<FileKind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => FileKind::File,
            libc::S_IFDIR => FileKind::Dir,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDev,
            libc::S_IFBLK => FileKind::BlockDev,
            _ => return None,
        })
    }

    /// True for the kinds with nothing but metadata (FIFOs, sockets, devices).
    pub fn is_special(self) -> bool {
        matches!(
            self,
            FileKind::Fifo | FileKind::Socket | FileKind::CharDev | FileKind::BlockDev
        )
    }
}

/// The attributes of an inode as the metadata service keeps them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    pub ino: Ino,
    pub kind: FileKind,
    /// Permission bits (mode & 0o7777).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    /// Directories: bumped by exactly one at every change of their entries (persistent, never
    /// goes back), so a client that sees `change + 1` after its own change of a directory knows
    /// nobody else changed it in between. Zero for other kinds.
    pub change: u64,
    /// Character and block devices: the device number (`st_rdev`); zero for other kinds.
    pub rdev: u32,
    /// Regular files of a `type=cache` namespace written through to the PFS (the fast tier
    /// was full, Liu's fall-back): the drain journal entry (`DrainOp::Through`) after which
    /// the file's data lives only on the PFS. Zero for every other file.
    pub through: u64,
    /// Regular files: how the file's bytes lie over the instance's fragments, fixed when it
    /// is made (zeros: the instance's rule). Directories: the default of what is made in
    /// them. (`surge layout`, the attribute `user.surge.layout`.)
    pub layout: FileLayout,
    /// When the file was made (`statx`'s `stx_btime`); zero when unknown (made by a store
    /// before birth times were kept).
    pub btime: Timestamp,
    /// `chattr` flags ([`FILE_FLAGS`]: immutable, append-only, no-dump, no-atime), as
    /// `FS_IOC_GETFLAGS` gives them.
    pub flags: u32,
}

/// `FS_IMMUTABLE_FL`: the file cannot be changed, renamed, linked to or removed.
pub const FL_IMMUTABLE: u32 = 0x10;
/// `FS_APPEND_FL`: the file can only be appended to; it cannot be renamed, linked to or
/// removed.
pub const FL_APPEND: u32 = 0x20;
/// `FS_NODUMP_FL`: kept for backup tools, no effect here.
pub const FL_NODUMP: u32 = 0x40;
/// `FS_NOATIME_FL`: kept, no effect here (the mount keeps no access times).
pub const FL_NOATIME: u32 = 0x80;
/// The `chattr` flags Surge keeps; others are refused (EOPNOTSUPP).
pub const FILE_FLAGS: u32 = FL_IMMUTABLE | FL_APPEND | FL_NODUMP | FL_NOATIME;
/// Not a `chattr` flag (`FS_RESERVED_FL`, which no program sets): the metadata server marks
/// an inode that has a file capability ([`CAPABILITY_XATTR`]), so a mount answers the
/// kernel's question before each write ("is there one to clear?") without a round trip for
/// every other file, and clears it before a write (`FUSE_HANDLE_KILLPRIV_V2`). Never set by a
/// client (a `SetAttr` with it is refused as any flag outside [`FILE_FLAGS`]), never shown to
/// `lsattr`.
pub const FL_CAPS: u32 = 0x8000_0000;
/// Not a `chattr` flag (`FS_EOFBLOCKS_FL`, ext4's old "blocks past the end of the file",
/// which no program sets): the metadata server marks a file that may hold allocated bytes
/// past its size (`Request::AllocatedPastEnd`). Its objects' extent is then
/// [`EXTENT_UNKNOWN`]: an unlink removes them on every fragment of the layout, and a truncate
/// that does not grow the file cuts every fragment (and the mark goes). Never shown to `lsattr`.
pub const FL_EOFBLOCKS: u32 = 0x0040_0000;
/// Not a `chattr` flag (`FS_EA_INODE_FL`, ext4's own, which no program sets): the metadata
/// server marks a file that a mount had open for writing when that mount's last connection
/// went (a crash, a kill, a lost node) without committing. Its objects may hold that mount's
/// acknowledged writes past the size last committed: the next open (or truncate) by any node
/// measures the objects and has the size recovered (`Request::Recovered`), which clears the
/// mark. Its extent is [`EXTENT_UNKNOWN`] until then. Never shown to `lsattr`.
pub const FL_RECOVER: u32 = 0x0020_0000;
/// The store's own marks of an inode, kept through a `chattr` (never set or cleared by one).
pub const STORE_MARKS: u32 = FL_CAPS | FL_EOFBLOCKS | FL_RECOVER;
/// The extent of a file's objects when it may hold bytes past its size: every fragment of its
/// layout ([`extent`]).
pub const EXTENT_UNKNOWN: u64 = i64::MAX as u64;

/// How far a file's objects may reach: its size, or [`EXTENT_UNKNOWN`] when it is marked
/// [`FL_EOFBLOCKS`] or [`FL_RECOVER`]. What the removal and the cutting of its objects go by.
pub fn extent(a: &Attr) -> u64 {
    extent_of(a.size, a.flags)
}

/// [`extent`] of a file of `size` bytes with flags `flags`.
pub fn extent_of(size: u64, flags: u32) -> u64 {
    if flags & (FL_EOFBLOCKS | FL_RECOVER) != 0 {
        EXTENT_UNKNOWN
    } else {
        size
    }
}

/// A file capability (`setcap`): stored as other `security.*` attributes are, and removed
/// at every write, truncate and change of owner, as Linux does.
pub const CAPABILITY_XATTR: &[u8] = b"security.capability";

/// Longest name of a directory entry, in bytes.
pub const NAME_MAX: usize = 255;
/// The set-group-ID bit of a mode.
pub const S_ISGID: u16 = 0o2000;

/// Checks that `name` can name a directory entry (the metadata server's rule; a client that
/// answers for the server must apply the same).
pub fn check_name(name: &[u8]) -> Result<(), ErrorReply> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(ErrorReply::new(
            ErrorCode::Invalid,
            format!("invalid file name {:?}", String::from_utf8_lossy(name)),
        ));
    }
    if name.len() > NAME_MAX {
        return Err(ErrorReply::new(
            ErrorCode::NameTooLong,
            format!("name of {} bytes exceeds {NAME_MAX}", name.len()),
        ));
    }
    Ok(())
}

/// The group and permission bits of a new node of `kind` asked for with `gid` and `perm` in
/// directory `parent` (the metadata server's rule; a client that answers for the server must
/// apply the same). BSD/SysV setgid directories: new entries take the directory's group,
/// subdirectories inherit the bit. Symlinks are 0o777.
pub fn new_node_group_and_perm(parent: &Attr, kind: FileKind, gid: u32, perm: u16) -> (u32, u16) {
    let (gid, perm) = if parent.perm & S_ISGID != 0 {
        let perm = if kind == FileKind::Dir {
            perm | S_ISGID
        } else {
            perm
        };
        (parent.gid, perm)
    } else {
        (gid, perm)
    };
    let perm = if kind == FileKind::Symlink {
        0o777
    } else {
        perm & 0o7777
    };
    (gid, perm)
}

/// A time to set: the metadata server's clock, or a given time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TimeSet {
    Now,
    At(Timestamp),
}

/// Which attributes a `SetAttr` changes. `size` only changes the recorded size: the client
/// truncates the objects on the fragments first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    pub perm: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    /// `chattr` flags (`FS_IOC_SETFLAGS`), within [`FILE_FLAGS`].
    pub flags: Option<u32>,
}

/// What a `Create` makes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NewNode {
    File,
    Dir,
    Symlink {
        target: Vec<u8>,
    },
    /// A FIFO, socket, or character or block device (`rdev`), by `mknod(2)`.
    Special {
        kind: FileKind,
        rdev: u32,
    },
    /// A regular file whose size is recorded as `size` from the start (a hole until written):
    /// what a copier makes before it writes, so that if it dies half-way, removing the file
    /// removes every byte it wrote.
    SizedFile {
        size: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: Ino,
    pub kind: FileKind,
    /// Opaque position to continue after this entry.
    pub cursor: u64,
    /// Present when the listing was asked with `plus` (readdirplus).
    pub attr: Option<Attr>,
}

/// How a client reaches a server: its stable id and addresses (`host:port`, `unix:/path`),
/// tried in order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ServerRef {
    pub id: String,
    pub addrs: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FragmentRef {
    pub index: u32,
    pub server: ServerRef,
    pub capacity: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceRef {
    pub ns: NamespaceId,
    pub server: ServerRef,
}

/// Everything a client needs to use an instance. Kept by every server that hosts a piece of the
/// instance, so a mount needs only one server address and the instance id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceDescriptor {
    pub instance: InstanceId,
    /// A human name (the persistent instance name, or `job-<id>`).
    pub name: String,
    /// `striped` or `private` (DataWarp's access modes).
    pub access_mode: String,
    pub capacity: u64,
    pub stripe_size: u64,
    pub fragments: Vec<FragmentRef>,
    pub namespaces: Vec<NamespaceRef>,
    /// `type=cache`: the PFS directory the namespace mirrors; its metadata servers keep a
    /// journal of changes for the drain to replay there.
    #[serde(default)]
    pub cache_pfs: Option<String>,
    /// `type=cache` with `fsync=pfs`: an `fsync` of a file returns once the file (and every
    /// change journaled before it) is on the PFS, not once it is on the fast tier.
    #[serde(default)]
    pub cache_fsync_pfs: bool,
    /// `type=cache`: the dirty-data high-water mark at which writers wait for the drain
    /// (`dirty_high=`); `None`: the default (off).
    #[serde(default)]
    pub cache_dirty_high: Option<surge_core::directives::DirtyHigh>,
    /// `type=cache` with `passthrough=on`: files of one stripe on a fragment of the mount's
    /// host get kernel passthrough when the tier has room at their open (they cannot switch
    /// to the PFS mid-write).
    #[serde(default)]
    pub cache_passthrough: bool,
    /// A random number drawn when the instance was made: its capabilities carry it, and
    /// servers refuse them once they hold no instance of that generation (destroyed, or made
    /// again under the same id). 0: none (instances made before generations existed).
    #[serde(default)]
    pub generation: u64,
}

impl InstanceDescriptor {
    pub fn namespace(&self, ns: NamespaceId) -> Option<&NamespaceRef> {
        self.namespaces.iter().find(|n| n.ns == ns)
    }
}

/// One fragment hosted by a server, as `ServerStatus` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FragmentStatus {
    pub instance: InstanceId,
    pub index: u32,
    pub capacity: u64,
    pub used: u64,
    pub device: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStatus {
    pub id: String,
    /// Where the server listens (`host:port`, `unix:/path`).
    pub addrs: Vec<String>,
    pub version: String,
    pub capacity: u64,
    /// Capacity promised to fragments.
    pub reserved: u64,
    /// Bytes stored in fragments.
    pub used: u64,
    pub devices: Vec<String>,
    pub fragments: Vec<FragmentStatus>,
    /// (instance, namespace) pairs this server is the metadata server of.
    pub namespaces: Vec<(InstanceId, NamespaceId)>,
    /// The bounds this server enforces on frames and connections.
    pub limits: Limits,
}

/// The bounds a server enforces (docs/DATAPLANE.md, "Bounds"), as `Status` reports them so
/// that any client can size its requests and keep its connections busy enough.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Largest encoded message of a frame, in bytes ([`crate::frame::MAX_META`]).
    pub max_meta: u32,
    /// Largest payload of a frame, in bytes ([`crate::frame::MAX_PAYLOAD`]).
    pub max_payload: u32,
    /// Largest `Read` length and `Write` payload, in bytes ([`crate::frame::MAX_IO`]).
    pub max_io: u32,
    /// Connections served at once (beyond it, new ones are refused with `ConnectionLimit`).
    pub max_connections: u32,
    /// Connections served at once from one peer (a TCP address; a uid on the Unix socket).
    pub max_connections_per_peer: u32,
    /// A connection with no request for this long is closed (`IdleClosed`); 0: never.
    pub idle_timeout_ms: u64,
    /// A frame must arrive whole within this long of its first byte, and a reply must be
    /// taken by the peer within this long; the connection is closed otherwise.
    pub frame_timeout_ms: u64,
}

impl Limits {
    /// The frame limits of this protocol version with the given connection bounds.
    pub fn new(
        max_connections: u32,
        max_connections_per_peer: u32,
        idle_timeout: std::time::Duration,
        frame_timeout: std::time::Duration,
    ) -> Limits {
        Limits {
            max_meta: crate::frame::MAX_META,
            max_payload: crate::frame::MAX_PAYLOAD,
            max_io: crate::frame::MAX_IO,
            max_connections,
            max_connections_per_peer,
            idle_timeout_ms: idle_timeout.as_millis() as u64,
            frame_timeout_ms: frame_timeout.as_millis() as u64,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    // --- server administration (driven by `surge instance` or the manager) ---
    /// Cheap liveness check; answered with `Status`.
    Status,
    CreateFragment {
        instance: InstanceId,
        fragment: u32,
        capacity: u64,
        descriptor: InstanceDescriptor,
    },
    DestroyFragment {
        instance: InstanceId,
        fragment: u32,
    },
    CreateNamespace {
        instance: InstanceId,
        ns: NamespaceId,
        descriptor: InstanceDescriptor,
        /// Owner and permission bits of the namespace's root directory (the job's user).
        root_uid: u32,
        root_gid: u32,
        root_perm: u16,
    },
    DestroyNamespace {
        instance: InstanceId,
        ns: NamespaceId,
    },
    Describe {
        instance: InstanceId,
    },

    // --- data, on one fragment ---
    /// Payload: the bytes to write at `offset` in the file's object.
    Write {
        instance: InstanceId,
        fragment: u32,
        file: FileId,
        offset: u64,
    },
    /// Reply payload: up to `len` bytes; shorter when the object ends (the rest is a hole).
    Read {
        instance: InstanceId,
        fragment: u32,
        file: FileId,
        offset: u64,
        len: u32,
    },
    TruncateObject {
        instance: InstanceId,
        fragment: u32,
        file: FileId,
        len: u64,
    },
    RemoveObject {
        instance: InstanceId,
        fragment: u32,
        file: FileId,
    },
    SyncObject {
        instance: InstanceId,
        fragment: u32,
        file: FileId,
    },
    FragmentUsage {
        instance: InstanceId,
        fragment: u32,
    },
    /// For a client on the server's own host: the path of a file's object (created empty if
    /// missing), so the client can hand it to the kernel for FUSE passthrough.
    LocalObject {
        instance: InstanceId,
        fragment: u32,
        file: FileId,
    },
    /// For a client that may be on the server's host: the path of the fragment's directory,
    /// so the client can tell (by its device and inode numbers) whether the fragment is
    /// local. Creates nothing.
    LocalFragment {
        instance: InstanceId,
        fragment: u32,
    },
    /// The object was changed behind the server's back (passthrough writes): measure it again
    /// for capacity accounting.
    ObjectChanged {
        instance: InstanceId,
        fragment: u32,
        file: FileId,
    },

    // --- metadata, on a namespace's metadata server ---
    Lookup {
        instance: InstanceId,
        ns: NamespaceId,
        parent: Ino,
        name: Vec<u8>,
    },
    GetAttr {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
    },
    SetAttr {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
        set: SetAttr,
    },
    Create {
        instance: InstanceId,
        ns: NamespaceId,
        parent: Ino,
        name: Vec<u8>,
        node: NewNode,
        /// The permission bits the creator asked for, before its umask.
        perm: u16,
        /// Taken from `perm` unless the parent directory has a default ACL, which masks it
        /// instead (`posix_acl_create`).
        umask: u16,
        uid: u32,
        gid: u32,
        /// The layout of the new file or directory; unset: the parent directory's default.
        layout: FileLayout,
    },
    Link {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
        new_parent: Ino,
        new_name: Vec<u8>,
    },
    Unlink {
        instance: InstanceId,
        ns: NamespaceId,
        parent: Ino,
        name: Vec<u8>,
        /// See [`KeepOpen`].
        keep: KeepOpen,
    },
    Rmdir {
        instance: InstanceId,
        ns: NamespaceId,
        parent: Ino,
        name: Vec<u8>,
    },
    Rename {
        instance: InstanceId,
        ns: NamespaceId,
        parent: Ino,
        name: Vec<u8>,
        new_parent: Ino,
        new_name: Vec<u8>,
        /// `RENAME_NOREPLACE` (1), `RENAME_EXCHANGE` (2) and `RENAME_WHITEOUT` (4: a
        /// character device 0/0 is left at the old name) are honoured, the last two not in a
        /// cache namespace, whose drain replays renames one by one.
        flags: u32,
        /// For the inode a rename replaces; see [`KeepOpen`].
        keep: KeepOpen,
    },
    Readlink {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
    },
    ReadDir {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
        /// 0 to start; otherwise the `cursor` of the last entry received.
        after: u64,
        max: u32,
        plus: bool,
    },
    /// After writes: size = max(size, `size`), mtime and ctime set. `writing`: the sending
    /// mount still has the file open after this commit (an `fsync`, a close of one of
    /// several handles); false at its last close, which ends what `OpenWrite` began.
    CommitWrite {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
        size: u64,
        mtime: TimeSet,
        writing: bool,
    },
    /// Forget an unlinked inode whose objects the client has removed.
    Purge {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
    },
    NamespaceStats {
        instance: InstanceId,
        ns: NamespaceId,
    },

    // --- data, on one fragment (added after the metadata requests to keep their encoding) ---
    /// `fallocate(2)` on the file's object: reserve (and zero) or release the object range
    /// `[offset, offset + len)`.
    AllocateObject {
        instance: InstanceId,
        fragment: u32,
        file: FileId,
        offset: u64,
        len: u64,
        mode: AllocMode,
    },

    // --- metadata, appended ---
    /// Namespace changes a mount answered before the metadata server made them (it knew the
    /// directory's entries, see `surge-client` `fs.rs`): in order, in one transaction, each on
    /// its own (a failed one changes nothing).
    NamespaceBatch {
        instance: InstanceId,
        ns: NamespaceId,
        ops: Vec<BatchOp>,
    },
    /// Reserves `count` inode numbers (at most 65536) for the creates of `NamespaceBatch`: they
    /// are never given to anything else.
    AllocInodes {
        instance: InstanceId,
        ns: NamespaceId,
        count: u32,
    },
    /// Asks for the lease of directory `ino` for the request's session (frame header): while
    /// the session holds it, a request of any other session that reads or changes the
    /// directory's entries first makes the metadata server recall it (`WaitRecall`), and waits
    /// until the holder has sent what it did there and released it. Granted only while the
    /// directory's change counter is `change` (nobody changed it since the asker last saw it)
    /// and no other session holds it. A holder may then create files there behind the
    /// application as in a private namespace.
    LeaseDir {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
        change: u64,
    },
    /// Waits up to `wait_ms` (at most 5000) until the metadata server recalls leases of the
    /// request's session; the reply names them (none when the wait ran out). A session's
    /// leases last while it keeps one such wait going (one at least every 3 s) on a
    /// connection of its own.
    WaitRecall {
        instance: InstanceId,
        ns: NamespaceId,
        wait_ms: u32,
    },
    /// Gives leases of the request's session back (its changes there are made).
    ReleaseLeases {
        instance: InstanceId,
        ns: NamespaceId,
        inos: Vec<Ino>,
    },
    /// The value of extended attribute `name` of `ino` (`Response::Xattr`; `NoData` when it
    /// has none of that name).
    GetXattr {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
        name: Vec<u8>,
    },
    /// The names of `ino`'s extended attributes (`Response::XattrNames`).
    ListXattr {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
    },
    /// Sets extended attribute `name` of `ino` to `value`; `flags` as `setxattr(2)`'s
    /// (`XATTR_CREATE` 1: fail with `Exists` if it is there; `XATTR_REPLACE` 2: fail with
    /// `NoData` if it is not). Replies with the inode's attributes (ctime moved).
    SetXattr {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
        name: Vec<u8>,
        value: Vec<u8>,
        flags: u32,
    },
    /// Removes extended attribute `name` of `ino` (`NoData` if it has none); replies with the
    /// inode's attributes.
    RemoveXattr {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
        name: Vec<u8>,
    },
    /// The first request on every connection: a capability (`surge_auth::Token`) signed with
    /// the cluster's key, naming what the connection may touch and for whom. Until one is
    /// accepted, every other request is refused with `Denied`.
    Authenticate {
        token: Vec<u8>,
    },
    /// A write-behind cache namespace's drain journal: the oldest entries after `after` (at
    /// most `max`, which are then taken: a later change of the same file gets an entry of its
    /// own) and how many are pending in all (`Response::DrainBatch`). `max` 0 only counts.
    DrainPoll {
        instance: InstanceId,
        ns: NamespaceId,
        after: u64,
        max: u32,
    },
    /// A cache namespace's file `ino` is to be written through to the PFS from now on (the
    /// fast tier is full): journals `DrainOp::Through` and records its sequence number in the
    /// inode's `through` (`Response::Through`; the existing one if it already was).
    CacheThrough {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
    },
    /// The journal's entries up to `upto` reached the PFS: forget them. `linked`: files
    /// whose data the drain copied among them and gave their fill name
    /// (`cache_through_path(root, ino, THROUGH_FILL)`): with no later change pending they
    /// are clean, and may be evicted from the fast tier (`CacheEvict`).
    DrainAck {
        instance: InstanceId,
        ns: NamespaceId,
        upto: u64,
        linked: Vec<Ino>,
    },
    /// A cache namespace's lazy fill (see [`THROUGH_FILL`]): one step for file `ino`
    /// (`Response::Fill` with the file's `through` after the step).
    CacheFill {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
        step: FillStep,
    },
    /// A cache namespace's file `ino` is being opened by the sending session: its attributes
    /// (`Response::Attr`, as `GetAttr`), and the open is recorded: a file open on any node is
    /// never evicted from the fast tier, and opens are the use its eviction order (least
    /// recently used first) is made of.
    CacheOpen {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
    },
    /// A cache mount's report (every second): the files `open` on it (an open not reported
    /// for [`CACHE_OPEN_TTL`] is forgotten), and those `closed` since its last report.
    /// Replies with how far the drain got and, with `count`, the namespace's dirty data
    /// (`Response::CacheState`; counting costs a pass over the files pending in the journal,
    /// so a mount asks only near its high-water mark); with both lists empty it only asks.
    CacheUse {
        instance: InstanceId,
        ns: NamespaceId,
        open: Vec<Ino>,
        closed: Vec<Ino>,
        count: bool,
    },
    /// The fast tier refused a write of cache file `ino` for want of space: evicts clean
    /// files (unchanged since their data was last put on the PFS under their fill names), least
    /// recently used first, none open on any node and not `ino`, until they hold `want` bytes.
    /// They are marked [`THROUGH_FILL`] (read from the PFS again, as files of the lazy fill)
    /// and the sender holds their fill claims: it removes their objects, then gives each claim
    /// back (`FillStep::Release`). `Response::Evicted` (empty: nothing clean to evict).
    CacheEvict {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
        want: u64,
    },
    /// Sets the layout of `ino`: of a regular file only while it holds no data (the layout
    /// decides where its bytes are), of a directory as the default of what is made in it
    /// from now on (unset: no default). Replies with the attributes after.
    SetLayout {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
        layout: FileLayout,
    },
    /// A cache namespace's drainer takes (or renews) the hold that makes the sending session
    /// the namespace's only drainer, or gives it back (`release`). While a session holds it,
    /// another session's `DrainPoll` that takes entries and its `DrainAck` are refused
    /// `Busy`: two drainers replaying one journal at once could apply its changes out of
    /// order on the PFS (a rename before the copy of the data under the old name). The hold
    /// ends with its release, when the last connection of its session that carried drain
    /// requests closes (the drainer died), or [`DRAIN_HOLD`] after its last renewal. A
    /// restarted server knows no hold. `Response::Ok`, or `Busy` naming the holder.
    DrainHold {
        instance: InstanceId,
        ns: NamespaceId,
        release: bool,
    },

    // --- data, on one fragment (appended) ---
    /// The bytes the fragment's device allocated to the file's object (`st_blocks` x 512, 0
    /// when there is none): a mount sums them over the file's fragments for `st_blocks`, so a
    /// hole costs nothing. Answered with `Allocated`.
    ObjectAllocated {
        instance: InstanceId,
        fragment: u32,
        file: FileId,
    },
    /// `lseek(2)` in the file's object from object offset `offset`: the next data
    /// (`SEEK_DATA`, `hole` false) or the next hole (`SEEK_HOLE`). Answered with `Seek`.
    SeekObject {
        instance: InstanceId,
        fragment: u32,
        file: FileId,
        offset: u64,
        hole: bool,
    },

    // --- cross-node POSIX (appended) ---
    /// A byte-range lock of the namespace's lock service (fcntl POSIX and OFD locks, flock):
    /// see [`LockOp`]. The service is the metadata server's, in memory; a session's locks
    /// live as long as a connection of the session that carried a [`LockOp::Keep`] is open
    /// (the mount's lock-keeper connection), so the locks of a mount that dies go with it.
    /// Answered with `Lock`.
    Lock {
        instance: InstanceId,
        ns: NamespaceId,
        op: LockOp,
    },
    /// `O_APPEND` from any node: reserves `len` bytes at the end of regular file `ino` (its
    /// size grows by `len` at once) and answers with the offset they start at (`Appended`),
    /// so writers on several nodes never choose the same offset. Not for cache namespaces.
    Append {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
        len: u64,
    },
    /// `open(2)` with `O_TMPFILE`: a regular file with no name (link count 0) made as a
    /// `Create` of one in directory `dir` would be (its default ACL, setgid and layout apply),
    /// given a name later by `Link` or removed by `Purge` at its last close. A store keeps it
    /// marked unnamed until then. Not for cache namespaces (the drain replays names).
    /// Answered with `Attr`.
    Tmpfile {
        instance: InstanceId,
        ns: NamespaceId,
        dir: Ino,
        /// As `Create`'s.
        perm: u16,
        umask: u16,
        uid: u32,
        gid: u32,
        layout: FileLayout,
    },
    /// `O_APPEND` to a file of one stripe, whose object is the file: the payload is written at
    /// the object's end as the kernel appends (`RWF_APPEND`), so appends through this server
    /// and those a node's kernel makes straight into the object (passthrough) never overwrite
    /// each other; the object is first extended to `at_least` (the file's size as the sender
    /// knows it: a file extended without writing has a shorter object). Answered with
    /// `ObjectAppended`.
    AppendObject {
        instance: InstanceId,
        fragment: u32,
        file: FileId,
        at_least: u64,
    },
    /// File `ino` is opened for reading, or directory `ino` listed from its start, on a mount
    /// that keeps access times: its atime becomes now when [`atime_due`] says so (`strict`:
    /// `strictatime`, else `relatime`), and its ctime stays, as the kernel's `touch_atime`
    /// does. Answered with `Attr`, the attributes after: the open's `GetAttr` and the atime
    /// in one round trip. Other kinds of nodes are only answered (so are directories by a
    /// server of protocol 11).
    Accessed {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
        strict: bool,
    },
    /// File `ino` is about to have bytes allocated past its end (`fallocate` with
    /// `FALLOC_FL_KEEP_SIZE`): the metadata server marks it [`FL_EOFBLOCKS`], so whoever
    /// removes or cuts its objects does so on every fragment of its layout, not only on
    /// those its size reaches. Answered with `Attr`. Nothing else changes (the allocation's
    /// mtime and ctime come with the writer's next commit).
    AllocatedPastEnd {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
    },
    /// File `ino` is being opened for writing by the sending session: its attributes
    /// (`Attr`; with `atime` `Some(strict)`, after the atime moved as `Accessed` moves it), and
    /// the session is recorded as its writer until a `CommitWrite` with `writing` false or a
    /// `Goodbye`. When the session's last connection to the metadata server goes before
    /// that, the file is marked [`FL_RECOVER`]. A `Create`, a `Tmpfile` and a batch's
    /// `CreateFile` of a file record their session the same way.
    OpenWrite {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
        atime: Option<bool>,
    },
    /// A mount measured the objects of file `ino` (marked [`FL_RECOVER`]): they reach byte
    /// `size` of the file. If the mark is still there the size becomes max(size, `size`),
    /// mtime and ctime now, and the mark goes; otherwise nothing changes (another node
    /// recovered it first). Answered with `Attr`.
    Recovered {
        instance: InstanceId,
        ns: NamespaceId,
        ino: Ino,
        size: u64,
    },
    /// The sending session unmounts cleanly: every file it had open is closed and committed,
    /// so its record as a writer goes with no mark.
    Goodbye {
        instance: InstanceId,
        ns: NamespaceId,
    },
    /// The length of the file's object on the fragment (0 when there is none), answered with
    /// `Length`: what a mount recovering a file's size measures.
    ObjectLength {
        instance: InstanceId,
        fragment: u32,
        file: FileId,
    },
    /// The request's session holds these inodes open, unlinked (at most [`MAX_CLAIMED`]): sent
    /// by a mount when its wait for recalls connects again, so that a restarted metadata
    /// server, which finds them without a name in its store, keeps them for it instead of
    /// handing their data to another mount for removal. Inodes the server did not find so
    /// are ignored. Answered with `Recall` (no directories): the unlinked files of mounts
    /// that went, as to a `WaitRecall`. A mount sends it empty as it starts, to take those.
    ClaimOrphans {
        instance: InstanceId,
        ns: NamespaceId,
        inos: Vec<Ino>,
    },
}

/// Inodes one `ClaimOrphans` names at most.
pub const MAX_CLAIMED: usize = 1 << 16;

/// Whether a read of a file with attributes `a` at `now` moves its atime: never for a file
/// with the no-atime or immutable flag; with `strict` (`strictatime`) always; else as Linux's
/// `relatime`: when the atime is not after the mtime or the ctime, or is a day old.
pub fn atime_due(a: &Attr, now: Timestamp, strict: bool) -> bool {
    if a.flags & (FL_NOATIME | FL_IMMUTABLE) != 0 {
        return false;
    }
    let key = |t: Timestamp| (t.secs, t.nsec);
    strict
        || key(a.atime) <= key(a.mtime)
        || key(a.atime) <= key(a.ctime)
        || now.secs - a.atime.secs >= 24 * 60 * 60
}

/// A lock's kind: shared (`F_RDLCK`), exclusive (`F_WRLCK`), or none (`F_UNLCK`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LockKind {
    Read,
    Write,
    Unlock,
}

/// Who holds a lock on a node: the kernel's lock owner (a process's file table for POSIX
/// locks, an open file description for OFD and flock locks), and whether it is a flock
/// (flock locks and POSIX/OFD locks do not conflict, as on Linux).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LockOwner {
    pub owner: u64,
    pub flock: bool,
}

/// A byte range `start..=end` of one file and its kind (`end` `u64::MAX` or `i64::MAX`: to
/// the end of the file, whatever it becomes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockRange {
    pub ino: Ino,
    pub kind: LockKind,
    pub start: u64,
    pub end: u64,
}

/// What a [`Request::Lock`] does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockOp {
    /// `F_GETLK`: the first lock of another owner (any session) that conflicts with `range`.
    /// `Lock(Some(..))` or `Lock(None)`.
    Test { owner: LockOwner, range: LockRange },
    /// `F_SETLK` (and one try of `F_SETLKW`, `waiting`): takes or releases `range` for
    /// `owner`, all or nothing. `Lock(None)`: done; `Lock(Some(conflict))`: another owner
    /// holds a conflicting lock (the caller retries later if it waits). A waiting try of a
    /// POSIX lock that would close a cycle of owners waiting for each other (on any nodes)
    /// is refused `Deadlock`. `pid` is the locking process on its node (for `F_GETLK`).
    Set {
        owner: LockOwner,
        range: LockRange,
        pid: u32,
        waiting: bool,
    },
    /// Releases every lock of `owner` on `ino` (POSIX locks at a `close` of the owner,
    /// flock and OFD locks at the last close of their open file description).
    Release { ino: Ino, owner: u64 },
    /// The lock keeper: ties the session's locks to this connection and waits up to
    /// `wait_ms` for a lock of the namespace to be released (`after`: the release count the
    /// caller last saw). Answered with `LocksReleased` (the count now).
    Keep { after: u64, wait_ms: u32 },
    /// A lock `owner` held before its session's lock-keeper connection broke (a restarted
    /// metadata server), asked for again on the new one: granted during the service's grace
    /// period, when other locks wait (see [`LOCK_GRACE`]). Answered as `Set`.
    Reclaim {
        owner: LockOwner,
        range: LockRange,
        pid: u32,
    },
}

/// How long a metadata server that opened an existing namespace (a restart) takes no new
/// lock, so the locks mounts held before the restart are reclaimed first (NFS's and NLM's
/// grace period; `surge server --lock-grace` changes it). A lock asked for meanwhile
/// is answered with a conflicting lock of session 0: `F_SETLK` gets EAGAIN, `F_SETLKW`
/// waits.
pub const LOCK_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// A lock held, as `F_GETLK` reports it; `session` is the holder's client session (its pid
/// means something only on that node).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockHeld {
    pub kind: LockKind,
    pub start: u64,
    pub end: u64,
    pub pid: u32,
    pub session: u32,
}

/// How long a [`LockOp::Keep`] waits at most.
pub const MAX_LOCK_KEEP_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a lock owner counts as waiting for the owners in its way (deadlock detection)
/// after its last waiting try: waiters try again more often than this.
pub const LOCK_WAIT_TTL: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a cache namespace's drainer hold lasts after its last renewal
/// ([`Request::DrainHold`]): a drainer renews it every few seconds while it works, so a hold
/// outlives a drainer that died by this much.
pub const DRAIN_HOLD: std::time::Duration = std::time::Duration::from_secs(15);

/// How long a restarted metadata server keeps the drainer hold it read from its store (held
/// before the restart), at most: a drainer alive renews it within a few seconds of the server's
/// return (it renews every 3 s), and one that died with the server should not keep others
/// waiting the whole `DRAIN_HOLD`.
pub const DRAIN_HOLD_AFTER_RESTART: std::time::Duration = std::time::Duration::from_secs(6);

/// A step of the lazy fill of a cache namespace's file (`Request::CacheFill`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FillStep {
    /// The fill before the job made `ino` (an empty regular file) for a PFS file of `size`
    /// bytes, linked under its fill name: record the size and times and mark it
    /// [`THROUGH_FILL`]. Journals nothing (the PFS has it).
    Mark {
        size: u64,
        atime: Timestamp,
        mtime: Timestamp,
    },
    /// This session copies the file into the fast tier (renewed by asking again): `Busy`
    /// while another session holds an unexpired claim; no claim is taken when the file is no
    /// longer `THROUGH_FILL` (the reply says what it is).
    Claim,
    /// This session copied the whole file into the fast tier: the file leaves the PFS
    /// (`through` 0) unless it is no longer `THROUGH_FILL`. `Busy` while another session
    /// holds the claim.
    Done,
    /// This session gives its claim up (the file stays on the PFS).
    Release,
}

/// `Attr.through` of a cache file made by the lazy fill and not yet copied into the fast
/// tier: its data is on the PFS, clean, and reads go to its fill name
/// ([`cache_through_path`]: `.surge-through/<ino>-fill`). The first write, truncate or
/// `fallocate` copies it into the fast tier first (`FillStep::Done` makes `through` 0), or
/// makes it [`THROUGH_FILL_KEPT`] when the tier is full.
pub const THROUGH_FILL: u64 = u64::MAX;
/// `Attr.through` of a file made by the lazy fill that the full fast tier could not take: it
/// is written through to its fill name from then on (as a file switched by `CacheThrough`).
pub const THROUGH_FILL_KEPT: u64 = u64::MAX - 1;

/// A cache mount reports the files it has open every second; an open not reported for this
/// long is forgotten by the metadata server (the mount died, or hangs), and the file may then
/// be evicted. A metadata server evicts nothing for this long after it starts (the opens made
/// before are not known to it until reported again).
pub const CACHE_OPEN_TTL: std::time::Duration = std::time::Duration::from_secs(30);

/// One change of a cache namespace, in the order it was made, for the drain to replay on the
/// PFS. Paths are relative to the namespace's root (and the PFS directory it mirrors), as they
/// were when the change was made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DrainOp {
    Mkdir {
        path: Vec<u8>,
    },
    /// An empty regular file (its data, if any, comes with a later `Data`).
    Create {
        path: Vec<u8>,
    },
    Symlink {
        path: Vec<u8>,
        target: Vec<u8>,
    },
    /// Inode `ino`'s data changed: copy what it holds when the drain gets to it.
    Data {
        ino: Ino,
        path: Vec<u8>,
    },
    /// Inode `ino`'s mode, times or size changed.
    Attr {
        ino: Ino,
        path: Vec<u8>,
    },
    /// `gone`: the inode whose last name this was (its fill name on the PFS goes too).
    Unlink {
        path: Vec<u8>,
        #[serde(default)]
        gone: Option<Ino>,
    },
    Rmdir {
        path: Vec<u8>,
    },
    /// `gone`: the inode whose last name the rename replaced (as for `Unlink`).
    Rename {
        from: Vec<u8>,
        to: Vec<u8>,
        #[serde(default)]
        gone: Option<Ino>,
    },
    Link {
        from: Vec<u8>,
        to: Vec<u8>,
    },
    /// Inode `ino` (at `path`) is written through from now on: its PFS file (all its data so far
    /// copied by earlier entries) gets the stable name `.surge-through/<ino>-<seq>` in the PFS
    /// directory (`cache_through_path`), which the mounts open to read and write it while
    /// renames move its name.
    Through {
        ino: Ino,
        path: Vec<u8>,
    },
}

/// The directory of a cache instance's PFS directory where the drain gives files written
/// through (`DrainOp::Through`) their stable names.
pub const CACHE_THROUGH_DIR: &str = ".surge-through";

/// The stable PFS name of inode `ino` written through from journal entry `seq` on, in PFS
/// directory `root`. The entry's number is in the name so that a replay of the entry (after
/// a crash of the drain) finds the name it made before and keeps it, whatever later entries
/// did to the file's visible name.
/// Files of the lazy fill ([`THROUGH_FILL`], [`THROUGH_FILL_KEPT`]) are `<ino>-fill`.
pub fn cache_through_path(root: &std::path::Path, ino: Ino, seq: u64) -> std::path::PathBuf {
    if seq >= THROUGH_FILL_KEPT {
        return root.join(CACHE_THROUGH_DIR).join(format!("{ino}-fill"));
    }
    root.join(CACHE_THROUGH_DIR).join(format!("{ino}-{seq}"))
}

/// How far a cache namespace's drain got (`Response::DrainBatch` without entries).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainProgress {
    /// The oldest change not yet on the PFS, by the journal entry it was made as (0: none is
    /// pending): the oldest pending entry, or older, when a copy pending was moved after a
    /// `Through` (`oldest_entry`).
    pub oldest: u64,
    /// The newest entry ever journaled (0: none yet).
    pub newest: u64,
    pub pending: u64,
    /// The oldest pending journal entry (0: none): the drain's place in the journal's order.
    /// Above `oldest` while the copy of a file moved after a switch to writing through waits
    /// (a file still being written, see `Ops::cache_through` in surge-server).
    pub oldest_entry: u64,
}

impl DrainProgress {
    /// True when every change journaled up to entry `seq` reached the PFS (a barrier).
    pub fn drained_upto(&self, seq: u64) -> bool {
        self.oldest == 0 || self.oldest > seq
    }

    /// True when the drain applied every journal entry up to `seq` (what a switch to writing
    /// through waits for: copies moved after it may still wait).
    pub fn applied_upto(&self, seq: u64) -> bool {
        self.oldest_entry == 0 || self.oldest_entry > seq
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainEntry {
    pub seq: u64,
    pub op: DrainOp,
}

/// Longest extended attribute name, in bytes (Linux's `XATTR_NAME_MAX`).
pub const XATTR_NAME_MAX: usize = 255;
/// Largest extended attribute value, in bytes (Linux's `XATTR_SIZE_MAX`).
pub const XATTR_SIZE_MAX: usize = 65536;
/// Most bytes of names and values one inode's extended attributes may take together.
pub const XATTR_INODE_MAX: usize = 256 << 10;
/// The POSIX access ACL of a node (the kernel's xattr format; the metadata server keeps the
/// mode in step with it).
pub const ACL_ACCESS_XATTR: &[u8] = b"system.posix_acl_access";
/// The POSIX default ACL of a directory: what nodes made in it inherit.
pub const ACL_DEFAULT_XATTR: &[u8] = b"system.posix_acl_default";
/// A flag of `SetXattr` beside `XATTR_CREATE`/`XATTR_REPLACE`: setting an access ACL also
/// clears the setgid bit (the caller is not in the file's group and has no `CAP_FSETID`; the
/// kernel's `FUSE_SETXATTR_ACL_KILL_SGID`).
pub const XATTR_ACL_KILL_SGID: u32 = 1 << 16;

/// One change of [`Request::NamespaceBatch`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchOp {
    /// Removes `name` from `parent` only while it still names `ino`; an orphaned inode is
    /// forgotten at once (the sender has it open nowhere).
    Unlink {
        parent: Ino,
        name: Vec<u8>,
        ino: Ino,
    },
    /// Creates regular file `name` in `parent` as inode `ino` (reserved with `AllocInodes`),
    /// with `time` as its times and the parent's new mtime and ctime.
    CreateFile {
        parent: Ino,
        name: Vec<u8>,
        ino: Ino,
        perm: u16,
        uid: u32,
        gid: u32,
        time: Timestamp,
        /// Chosen by the sender (the parent's default, or the mount's own choice).
        layout: FileLayout,
        /// Its mode or owner were set after the sender made it (protocol 14): its ctime is
        /// when the metadata server makes it, not `time`.
        changed: bool,
    },
    /// Removes empty directory `name` from `parent` only while it still names `ino`
    /// (protocol 14).
    Rmdir {
        parent: Ino,
        name: Vec<u8>,
        ino: Ino,
    },
}

/// What one [`BatchOp`] did. `change` is the parent directory's change counter after it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchDone {
    Unlinked {
        unlinked: Unlinked,
        change: u64,
    },
    Created {
        change: u64,
    },
    /// A directory removed.
    Removed {
        change: u64,
    },
}

/// What [`Request::AllocateObject`] does with its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AllocMode {
    /// Allocate; the object grows to the end of the range if it is shorter.
    Allocate,
    /// Allocate without changing the object's length.
    KeepSize,
    /// Release the range's blocks (it reads as zeros); the length does not change.
    PunchHole,
}

/// What the metadata server does with an inode whose last name goes away. The inode must stay
/// while a node has the file open (POSIX: an unlinked open file stays usable); otherwise it can
/// be forgotten in the same transaction, saving the client a `Purge` round trip.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeepOpen {
    /// Keep every orphaned inode; the client purges it later.
    All,
    /// Forget the orphaned inode at once unless it is one of these (open on the calling node).
    Only(Vec<Ino>),
}

/// What an unlink (or a rename over an existing name) did to the inode it removed a name of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unlinked {
    pub ino: Ino,
    pub kind: FileKind,
    /// The last name is gone: the client removes the objects (now or at last close) and purges.
    pub orphaned: bool,
    /// Size at the time, to know which fragments hold data.
    pub size: u64,
    /// The inode is already forgotten (see [`KeepOpen`]): only its objects remain to remove.
    pub purged: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    Ok,
    Error(ErrorReply),
    Status(ServerStatus),
    Descriptor(InstanceDescriptor),
    Written {
        len: u64,
    },
    /// The payload holds the bytes.
    Data,
    Usage {
        capacity: u64,
        used: u64,
        /// What the instance has left on this server (its fragments here share their space).
        room: u64,
    },
    /// Where an object lives on the server's host; `dev`/`ino` let the client check that it
    /// opened that very file.
    LocalObject {
        path: String,
        dev: u64,
        ino: u64,
    },
    Attr(Attr),
    Unlinked(Unlinked),
    Renamed {
        replaced: Option<Unlinked>,
    },
    Target(Vec<u8>),
    Dir {
        entries: Vec<DirEntry>,
        done: bool,
        /// The directory's attributes as the page was read: pages read at one change
        /// counter, from the start to `done`, are every name it had then (a mount lists the
        /// directory from them, see `Fs::readdir`).
        dir: Attr,
        /// The directory has a default ACL (what is made in it inherits it, which only the
        /// metadata server applies: nothing is made there behind).
        default_acl: bool,
    },
    NamespaceStats {
        inodes: u64,
    },
    // Added after the others to keep their encoding. Replies to namespace changes carry the
    // parent directory's attributes after the change: the kernel asks for them right after
    // (the change invalidated its copy), and the client can answer without a round trip.
    /// Reply to `Create`.
    Created {
        attr: Attr,
        parent: Attr,
        /// The parent directory has a default ACL, which the new node took (a new directory
        /// has it as its own default too).
        inherited: bool,
    },
    /// Reply to `Unlink`.
    Removed {
        unlinked: Unlinked,
        parent: Attr,
    },
    /// Reply to `Rmdir`: the parent directory's attributes.
    DirChanged(Attr),
    /// Reply to `NamespaceBatch`: one result per change, in order.
    BatchDone(Vec<Result<BatchDone, ErrorReply>>),
    /// Reply to `AllocInodes`: `first..first + count` are reserved.
    Inodes {
        first: Ino,
        count: u32,
    },
    /// Reply to `LeaseDir`.
    Lease {
        granted: bool,
    },
    /// Reply to `WaitRecall`: the directories whose leases the session must give back, and
    /// unlinked files a mount that went left open, already forgotten by the metadata server,
    /// whose objects the session is to remove (the server removed those on its own host).
    Recall {
        dirs: Vec<Ino>,
        reap: Vec<Unlinked>,
    },
    /// Reply to `GetXattr`: the value.
    Xattr(Vec<u8>),
    /// Reply to `ListXattr`: the names, sorted.
    XattrNames(Vec<Vec<u8>>),
    /// Reply to `DrainPoll`.
    DrainBatch {
        entries: Vec<DrainEntry>,
        pending: u64,
        /// Sequence number of the oldest pending entry (0: none is pending): every change
        /// journaled before it reached the PFS.
        oldest: u64,
        /// Sequence number of the newest entry ever journaled (0: none yet).
        newest: u64,
        /// Sequence number of the oldest pending entry: above `oldest` while a copy moved
        /// after a `Through` waits (`DrainProgress::oldest_entry`).
        #[serde(default)]
        oldest_entry: u64,
        /// The files whose data the entries copy that a mount has open (`CacheOpen`,
        /// `CacheUse`): the drain holds back only these while they change; a file closed
        /// everywhere is complete.
        open: Vec<Ino>,
    },
    /// Reply to `CacheThrough`: the `DrainOp::Through` entry's sequence number.
    Through {
        seq: u64,
    },
    /// Reply to `CacheFill`: the file's `through` after the step.
    Fill {
        through: u64,
    },
    /// Reply to `CacheUse`: the cache namespace's dirty data (journaled, not yet on the
    /// PFS), counted as whole files (the drain copies whole files); zeros when not asked.
    CacheState {
        /// Bytes of the files with changes of their data pending.
        dirty: u64,
        /// Of those, bytes of files open on no node: what the drain can finish without
        /// waiting for a writer.
        dirty_closed: u64,
        /// The oldest pending journal entry (0: none), to tell a drain that moves.
        oldest: u64,
    },
    /// Reply to `CacheEvict`: the attributes of the files evicted (marked `THROUGH_FILL`).
    Evicted(Vec<Attr>),
    /// Reply to `ObjectAllocated`.
    Allocated {
        bytes: u64,
    },
    /// Reply to `SeekObject`: the object offset found. `SEEK_DATA`: `None` when the object
    /// holds no data at or after the offset. `SEEK_HOLE`: always an offset (the object's end
    /// is a hole, and so is everything past it).
    Seek {
        offset: Option<u64>,
    },
    /// Reply to `Lock`: `Test` and `Set`: the conflicting lock, if any.
    Lock(Option<LockHeld>),
    /// Reply to `Lock` `Keep`: how many times a lock of the namespace was released.
    LocksReleased(u64),
    /// Reply to `Append`: where the reserved bytes start, and the file's attributes after.
    Appended {
        offset: u64,
        attr: Attr,
    },
    /// Reply to `AppendObject`: where the bytes were written.
    ObjectAppended {
        offset: u64,
    },
    /// Reply to `ObjectLength`.
    Length {
        len: u64,
    },
}

/// A typed error, mapped to an errno at the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorCode {
    NotFound,
    Exists,
    NotDir,
    IsDir,
    NotEmpty,
    NoSpace,
    Invalid,
    NameTooLong,
    Permission,
    Io,
    UnknownInstance,
    UnknownFragment,
    UnknownNamespace,
    Malformed,
    Version,
    TooLarge,
    Busy,
    Stale,
    Unsupported,
    Loop,
    /// No such extended attribute.
    NoData,
    /// Not authenticated, or not allowed by the connection's capability.
    Denied,
    // Added after the others to keep their encoding.
    /// The server refuses the connection: it serves as many as it may, in total or from this
    /// peer (sent with request id `frame::CONNECTION_ID`, then the connection is closed).
    ConnectionLimit,
    /// The server closes the connection, idle too long: it read no request after its last
    /// reply, so a request the client sent meanwhile was not made and may be sent again on a
    /// new connection (sent with request id `frame::CONNECTION_ID`).
    IdleClosed,
    /// A frame did not arrive whole within the server's frame timeout.
    TimedOut,
    /// Not now, soon: what stands in the way was inherited from before the server restarted
    /// and lapses by itself unless its holder comes back (a cache's drainer hold); ask again.
    Again,
    /// A waiting lock would close a cycle of lock owners waiting for each other.
    Deadlock,
}

impl ErrorCode {
    pub fn errno(self) -> i32 {
        match self {
            ErrorCode::NotFound => libc::ENOENT,
            ErrorCode::Exists => libc::EEXIST,
            ErrorCode::NotDir => libc::ENOTDIR,
            ErrorCode::IsDir => libc::EISDIR,
            ErrorCode::NotEmpty => libc::ENOTEMPTY,
            ErrorCode::NoSpace => libc::ENOSPC,
            ErrorCode::Invalid => libc::EINVAL,
            ErrorCode::NameTooLong => libc::ENAMETOOLONG,
            ErrorCode::Permission => libc::EPERM,
            ErrorCode::Io => libc::EIO,
            ErrorCode::UnknownInstance | ErrorCode::UnknownNamespace => libc::ESTALE,
            ErrorCode::UnknownFragment => libc::ESTALE,
            ErrorCode::Malformed | ErrorCode::Version => libc::EPROTO,
            ErrorCode::TooLarge => libc::EFBIG,
            ErrorCode::Busy => libc::EBUSY,
            ErrorCode::Stale => libc::ESTALE,
            ErrorCode::Unsupported => libc::EOPNOTSUPP,
            ErrorCode::Loop => libc::ELOOP,
            ErrorCode::NoData => libc::ENODATA,
            ErrorCode::Denied => libc::EACCES,
            ErrorCode::ConnectionLimit | ErrorCode::IdleClosed | ErrorCode::TimedOut => libc::EIO,
            ErrorCode::Again => libc::EAGAIN,
            ErrorCode::Deadlock => libc::EDEADLK,
        }
    }

    /// The code for an I/O error from the server's own file system.
    pub fn from_io(e: &std::io::Error) -> ErrorCode {
        match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => ErrorCode::NoSpace,
            Some(libc::ENOENT) => ErrorCode::NotFound,
            Some(libc::EFBIG) => ErrorCode::TooLarge,
            _ => ErrorCode::Io,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub code: ErrorCode,
    pub message: String,
}

impl ErrorReply {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ErrorReply {
        ErrorReply {
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for ErrorReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

impl std::error::Error for ErrorReply {}
