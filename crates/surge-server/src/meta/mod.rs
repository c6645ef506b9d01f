//! The metadata store of one namespace: inodes and directory entries in an embedded SQLite
//! database in the namespace's directory on the fast tier.
//!
//! WAL journal with `synchronous=NORMAL`: a committed transaction is in the WAL file before the
//! reply leaves, so it survives `kill -9` of the server (the page cache keeps it); power loss
//! may lose the last transactions, as for any fast tier. Inode numbers are never reused
//! (AUTOINCREMENT), so a kernel's cached inode can never alias a new file.

use crate::acl::{self, Acl};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;
use surge_core::Ino;
use surge_proto::{
    check_name, new_node_group_and_perm, Attr, BatchDone, BatchOp, DirEntry, ErrorCode, ErrorReply,
    FileKind, FileLayout, KeepOpen, NewNode, SetAttr, TimeSet, Timestamp, Unlinked,
    CAPABILITY_XATTR, FILE_FLAGS, FL_APPEND, FL_CAPS, FL_EOFBLOCKS, FL_IMMUTABLE, FL_RECOVER,
    STORE_MARKS, XATTR_ACL_KILL_SGID, XATTR_INODE_MAX, XATTR_NAME_MAX, XATTR_SIZE_MAX,
};

pub const ROOT_INO: Ino = 1;
const RENAME_NOREPLACE: u32 = 1;
pub(crate) const RENAME_EXCHANGE: u32 = 2;
pub(crate) const RENAME_WHITEOUT: u32 = 4;

pub type MetaResult<T> = Result<T, ErrorReply>;

mod cache;
mod rename;
mod xattr;

/// `setxattr(2)` flags.
const XATTR_CREATE: u32 = 1;
const XATTR_REPLACE: u32 = 2;

fn no_xattr(ino: Ino, name: &[u8]) -> ErrorReply {
    err(
        ErrorCode::NoData,
        format!(
            "inode {ino} has no extended attribute {}",
            String::from_utf8_lossy(name)
        ),
    )
}

fn check_xattr_name(name: &[u8]) -> MetaResult<()> {
    if name.is_empty() || name.contains(&0) {
        return Err(err(ErrorCode::Invalid, "empty extended attribute name"));
    }
    if name.len() > XATTR_NAME_MAX {
        return Err(err(
            ErrorCode::Invalid,
            format!(
                "extended attribute name of {} bytes exceeds {XATTR_NAME_MAX}",
                name.len()
            ),
        ));
    }
    Ok(())
}

/// What [`Ops::create_with_layout`] made: the node, its parent after, and whether it took the
/// parent's default ACL.
#[derive(Debug)]
pub struct Created {
    pub attr: Attr,
    pub parent: Attr,
    pub inherited: bool,
}

fn err(code: ErrorCode, msg: impl Into<String>) -> ErrorReply {
    ErrorReply::new(code, msg)
}

fn db_err(e: rusqlite::Error) -> ErrorReply {
    if is_full(&e) {
        return err(ErrorCode::NoSpace, format!("{STORE_FULL}: {e}"));
    }
    err(ErrorCode::Io, format!("metadata store: {e}"))
}

/// How a [`NoSpace`](ErrorCode::NoSpace) of the store itself (not of a quota) begins.
pub const STORE_FULL: &str = "metadata store: device full";

/// True when SQLite could not write because the device is full.
pub fn is_full(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DiskFull)
}

/// What the metadata server can check of a layout without knowing the instance's fragments
/// (the clients check the stripe count against them; a count the instance cannot hold resolves
/// to the instance's rule, see `Layout::resolve`).
fn check_layout(l: &FileLayout) -> MetaResult<()> {
    l.check(u32::MAX - 1)
        .map_err(|e| err(ErrorCode::Invalid, e.to_string()))
}

fn kind_code(k: FileKind) -> i64 {
    match k {
        FileKind::File => 1,
        FileKind::Dir => 2,
        FileKind::Symlink => 3,
        FileKind::Fifo => 4,
        FileKind::Socket => 5,
        FileKind::CharDev => 6,
        FileKind::BlockDev => 7,
    }
}

/// The kind stored in column `i` of `r`; a code no Surge writes is an error (a store damaged
/// or written by a newer Surge), not a regular file.
fn kind_at(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<FileKind> {
    let code: i64 = r.get(i)?;
    Ok(match code {
        1 => FileKind::File,
        2 => FileKind::Dir,
        3 => FileKind::Symlink,
        4 => FileKind::Fifo,
        5 => FileKind::Socket,
        6 => FileKind::CharDev,
        7 => FileKind::BlockDev,
        _ => {
            return Err(rusqlite::Error::FromSqlConversionFailure(
                i,
                rusqlite::types::Type::Integer,
                format!("file kind {code} is none this Surge knows (1 to 7)").into(),
            ))
        }
    })
}

const ATTR_COLS: &str =
    "ino, kind, perm, nlink, uid, gid, size, atime_s, atime_ns, mtime_s, mtime_ns, \
     ctime_s, ctime_ns, change, rdev, through, stripe_size, stripe_count, stripe_start, \
     btime_s, btime_ns, flags";

fn attr_from_row(r: &rusqlite::Row<'_>, base: usize) -> rusqlite::Result<Attr> {
    let ts = |i: usize| -> rusqlite::Result<Timestamp> {
        Ok(Timestamp {
            secs: r.get(base + i)?,
            nsec: r.get::<_, i64>(base + i + 1)? as u32,
        })
    };
    Ok(Attr {
        ino: r.get::<_, i64>(base)? as u64,
        kind: kind_at(r, base + 1)?,
        perm: r.get::<_, i64>(base + 2)? as u16,
        nlink: r.get::<_, i64>(base + 3)? as u32,
        uid: r.get::<_, i64>(base + 4)? as u32,
        gid: r.get::<_, i64>(base + 5)? as u32,
        size: r.get::<_, i64>(base + 6)? as u64,
        atime: ts(7)?,
        mtime: ts(9)?,
        ctime: ts(11)?,
        change: r.get::<_, i64>(base + 13)? as u64,
        rdev: r.get::<_, i64>(base + 14)? as u32,
        through: r.get::<_, i64>(base + 15)? as u64,
        layout: FileLayout {
            stripe_size: r.get::<_, i64>(base + 16)? as u64,
            stripe_count: r.get::<_, i64>(base + 17)? as u32,
            start: r.get::<_, i64>(base + 18)? as u32,
        },
        btime: ts(19)?,
        flags: r.get::<_, i64>(base + 21)? as u32,
    })
}

/// Opens (creating if needed) the store at `path`.
pub fn open(
    path: &Path,
    root_uid: u32,
    root_gid: u32,
    root_perm: u16,
) -> Result<Connection, crate::schema::SchemaError> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    // One connection per store, owned by this server: no file locking per transaction.
    conn.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
    let from = crate::schema::upgrade(&conn)?;
    if from != crate::schema::VERSION {
        tracing::info!(
            "{}: metadata store schema version {from} -> {}",
            path.display(),
            crate::schema::VERSION
        );
    }
    let now = Timestamp::now();
    conn.execute(
        "INSERT OR IGNORE INTO inodes(ino, kind, perm, nlink, uid, gid, size, atime_s, atime_ns,
            mtime_s, mtime_ns, ctime_s, ctime_ns, parent, btime_s, btime_ns)
         VALUES (?1, 2, ?2, 2, ?3, ?4, 0, ?5, ?6, ?5, ?6, ?5, ?6, ?1, ?5, ?6)",
        params![
            ROOT_INO as i64,
            i64::from(root_perm),
            i64::from(root_uid),
            i64::from(root_gid),
            now.secs,
            i64::from(now.nsec)
        ],
    )?;
    Ok(conn)
}

/// Metadata operations, each run inside the caller's transaction or savepoint.
pub struct Ops<'a> {
    pub tx: &'a Connection,
}

impl Ops<'_> {
    /// The path of `ino` from the root ("a/b/c"; empty for the root), by its first name.
    /// `None` for an inode without a name (an open file that was unlinked).
    pub fn path_of(&self, ino: Ino) -> MetaResult<Option<Vec<u8>>> {
        let mut parts: Vec<Vec<u8>> = Vec::new();
        let mut cur = ino;
        while cur != ROOT_INO {
            let mut st = self
                .tx
                .prepare_cached("SELECT parent, name FROM dentries WHERE ino = ?1 LIMIT 1")
                .map_err(db_err)?;
            let Some((parent, name)) = st
                .query_row([cur as i64], |r| {
                    Ok((r.get::<_, i64>(0)? as u64, r.get::<_, Vec<u8>>(1)?))
                })
                .optional()
                .map_err(db_err)?
            else {
                return Ok(None);
            };
            parts.push(name);
            cur = parent;
            if parts.len() > 4096 {
                return Err(err(ErrorCode::Io, format!("inode {ino}: path loops")));
            }
        }
        parts.reverse();
        Ok(Some(parts.join(&b'/')))
    }

    /// The path of entry `name` in directory `parent`.
    pub fn child_path(&self, parent: Ino, name: &[u8]) -> MetaResult<Option<Vec<u8>>> {
        Ok(self.path_of(parent)?.map(|mut p| {
            if !p.is_empty() {
                p.push(b'/');
            }
            p.extend_from_slice(name);
            p
        }))
    }

    pub fn getattr(&self, ino: Ino) -> MetaResult<Attr> {
        self.find(ino)?
            .ok_or_else(|| err(ErrorCode::NotFound, format!("inode {ino} does not exist")))
    }

    fn find(&self, ino: Ino) -> MetaResult<Option<Attr>> {
        let mut st = self
            .tx
            .prepare_cached(&format!("SELECT {ATTR_COLS} FROM inodes WHERE ino = ?1"))
            .map_err(db_err)?;
        st.query_row([ino as i64], |r| attr_from_row(r, 0))
            .optional()
            .map_err(db_err)
    }

    fn dir(&self, ino: Ino) -> MetaResult<Attr> {
        let a = self.getattr(ino)?;
        if a.kind != FileKind::Dir {
            return Err(err(
                ErrorCode::NotDir,
                format!("inode {ino} is not a directory"),
            ));
        }
        Ok(a)
    }

    /// EPERM when `a` has one of the `chattr` flags `flags` (immutable, append-only), naming
    /// what was refused.
    pub(crate) fn refuse_flagged(a: &Attr, flags: u32, what: &str) -> MetaResult<()> {
        if a.flags & flags == 0 {
            return Ok(());
        }
        let which = if a.flags & flags & FL_IMMUTABLE != 0 {
            "immutable"
        } else {
            "append-only"
        };
        Err(err(
            ErrorCode::Permission,
            format!("{what}: inode {} is {which} (chattr)", a.ino),
        ))
    }

    /// [`refuse_flagged`](Self::refuse_flagged) of inode `ino`.
    pub(crate) fn refuse_flagged_ino(&self, ino: Ino, flags: u32, what: &str) -> MetaResult<()> {
        Self::refuse_flagged(&self.getattr(ino)?, flags, what)
    }

    pub(crate) fn dentry(&self, parent: Ino, name: &[u8]) -> MetaResult<Option<(Ino, FileKind)>> {
        let mut st = self
            .tx
            .prepare_cached("SELECT ino, kind FROM dentries WHERE parent = ?1 AND name = ?2")
            .map_err(db_err)?;
        st.query_row(params![parent as i64, name], |r| {
            Ok((r.get::<_, i64>(0)? as u64, kind_at(r, 1)?))
        })
        .optional()
        .map_err(db_err)
    }

    pub fn lookup(&self, parent: Ino, name: &[u8]) -> MetaResult<Attr> {
        // The kernel of an exporting mount (FUSE_EXPORT_SUPPORT: open_by_handle_at, NFS
        // re-export) resolves a handle of an inode it forgot as "." of that inode (any kind),
        // and a directory's parent as its ".." (the root's is itself).
        match name {
            b"." => return self.getattr(parent),
            b".." => {
                self.dir(parent)?;
                return self.getattr(self.parent_of_dir(parent)?);
            }
            _ => {}
        }
        let mut st = self
            .tx
            .prepare_cached(&format!(
                "SELECT {} FROM dentries d JOIN inodes i ON i.ino = d.ino
                 WHERE d.parent = ?1 AND d.name = ?2",
                ATTR_COLS
                    .split(", ")
                    .map(|c| format!("i.{c}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .map_err(db_err)?;
        match st
            .query_row(params![parent as i64, name], |r| attr_from_row(r, 0))
            .optional()
            .map_err(db_err)?
        {
            Some(a) => Ok(a),
            None => {
                self.dir(parent)?;
                if name.len() > surge_proto::NAME_MAX {
                    // No entry can have it: say so, as local file systems do.
                    check_name(name)?;
                }
                Err(err(
                    ErrorCode::NotFound,
                    format!("{} not found", String::from_utf8_lossy(name)),
                ))
            }
        }
    }

    /// Counts one entry change of directory `ino` (its times, its link count by
    /// `nlink_delta`, its change counter); returns its attributes after.
    fn touch_dir(&self, ino: Ino, nlink_delta: i64, now: Timestamp) -> MetaResult<Attr> {
        self.tx
            .prepare_cached(&format!(
                "UPDATE inodes SET nlink = nlink + ?2, mtime_s = ?3, mtime_ns = ?4,
                 ctime_s = ?3, ctime_ns = ?4, change = change + 1 WHERE ino = ?1
                 RETURNING {ATTR_COLS}"
            ))
            .and_then(|mut st| {
                st.query_row(
                    params![ino as i64, nlink_delta, now.secs, i64::from(now.nsec)],
                    |r| attr_from_row(r, 0),
                )
            })
            .map_err(db_err)
    }

    fn insert_dentry(&self, parent: Ino, name: &[u8], ino: Ino, kind: FileKind) -> MetaResult<()> {
        self.tx
            .prepare_cached("INSERT INTO dentries(parent, name, ino, kind) VALUES (?1, ?2, ?3, ?4)")
            .and_then(|mut st| {
                st.execute(params![parent as i64, name, ino as i64, kind_code(kind)])
            })
            .map_err(db_err)?;
        Ok(())
    }

    pub fn create(
        &self,
        parent: Ino,
        name: &[u8],
        node: &NewNode,
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> MetaResult<Attr> {
        self.create_returning_parent(parent, name, node, (perm, uid, gid))
            .map(|(a, _)| a)
    }

    /// [`create`](Self::create), also returning the parent's attributes after.
    pub fn create_returning_parent(
        &self,
        parent: Ino,
        name: &[u8],
        node: &NewNode,
        (perm, uid, gid): (u16, u32, u32),
    ) -> MetaResult<(Attr, Attr)> {
        self.create_in(
            parent,
            name,
            node,
            (perm, uid, gid),
            0,
            None,
            Timestamp::now(),
            FileLayout::default(),
        )
        .map(|c| (c.attr, c.parent))
    }

    /// [`create_returning_parent`](Self::create_returning_parent) with the layout the
    /// creator asked for (unset: the parent's default) and its `umask`, applied unless the
    /// parent has a default ACL (see [`Created`]).
    pub fn create_with_layout(
        &self,
        parent: Ino,
        name: &[u8],
        node: &NewNode,
        owner: (u16, u32, u32),
        umask: u16,
        layout: FileLayout,
    ) -> MetaResult<Created> {
        self.create_in(
            parent,
            name,
            node,
            owner,
            umask,
            None,
            Timestamp::now(),
            layout,
        )
    }

    /// Sets `ino`'s permission bits (and setuid/setgid/sticky) to `perm`.
    fn set_perm(&self, ino: Ino, perm: u16) -> MetaResult<()> {
        self.tx
            .prepare_cached("UPDATE inodes SET perm = ?2 WHERE ino = ?1")
            .and_then(|mut st| st.execute(params![ino as i64, i64::from(perm)]))
            .map_err(db_err)?;
        Ok(())
    }

    /// [`create`](Self::create) as inode `ino` when given (reserved with
    /// [`alloc_inodes`](Self::alloc_inodes); it must not exist), at time `now`, with `layout`
    /// (unset: the parent's default), `umask` applied unless the parent has a default ACL;
    /// also returns the parent's attributes after (see [`Created`]).
    #[allow(clippy::too_many_arguments)]
    fn create_in(
        &self,
        parent: Ino,
        name: &[u8],
        node: &NewNode,
        owner: (u16, u32, u32),
        umask: u16,
        ino: Option<Ino>,
        now: Timestamp,
        layout: FileLayout,
    ) -> MetaResult<Created> {
        check_name(name)?;
        self.make_node(parent, Some(name), node, owner, umask, ino, now, layout)
    }

    /// `open(2)` with `O_TMPFILE` in directory `dir`: a regular file made as a create in
    /// `dir` would make it, with no name (link count 0), marked unnamed until
    /// [`link`](Self::link) names it; [`purge`](Self::purge) forgets it at its last close.
    pub fn tmpfile(
        &self,
        dir: Ino,
        owner: (u16, u32, u32),
        umask: u16,
        layout: FileLayout,
    ) -> MetaResult<Attr> {
        let made = self.make_node(
            dir,
            None,
            &NewNode::File,
            owner,
            umask,
            None,
            Timestamp::now(),
            layout,
        )?;
        Ok(made.attr)
    }

    /// [`create_in`](Self::create_in) with `name` checked; with no name (only a regular
    /// file), an unnamed file of [`tmpfile`](Self::tmpfile): `parent` is only where its
    /// owner, mode and layout come from, and is left as it was.
    #[allow(clippy::too_many_arguments)]
    fn make_node(
        &self,
        parent: Ino,
        name: Option<&[u8]>,
        node: &NewNode,
        (perm, uid, gid): (u16, u32, u32),
        umask: u16,
        ino: Option<Ino>,
        now: Timestamp,
        layout: FileLayout,
    ) -> MetaResult<Created> {
        let p = self.dir(parent)?;
        Self::refuse_flagged(&p, FL_IMMUTABLE, "create")?;
        match name {
            Some(name) if self.dentry(parent, name)?.is_some() => {
                return Err(err(
                    ErrorCode::Exists,
                    format!("{} exists", String::from_utf8_lossy(name)),
                ));
            }
            Some(_) => {}
            None if *node != NewNode::File => {
                return Err(err(
                    ErrorCode::Invalid,
                    format!("an unnamed {node:?}: only regular files are made unnamed"),
                ));
            }
            None => {}
        }
        let mut size = 0;
        let (kind, target, nlink, rdev) = match node {
            NewNode::File => (FileKind::File, None, 1, 0),
            NewNode::SizedFile { size: s } => {
                size = *s;
                (FileKind::File, None, 1, 0)
            }
            NewNode::Dir => (FileKind::Dir, None, 2, 0),
            NewNode::Symlink { target } => {
                if target.is_empty() || target.len() > 4096 {
                    return Err(err(
                        ErrorCode::Invalid,
                        "symlink target must be 1..4096 bytes",
                    ));
                }
                (FileKind::Symlink, Some(target.as_slice()), 1, 0)
            }
            NewNode::Special { kind, rdev } => {
                if !kind.is_special() {
                    return Err(err(
                        ErrorCode::Invalid,
                        format!("mknod of a {kind:?}: only FIFOs, sockets and devices"),
                    ));
                }
                let rdev = match kind {
                    FileKind::CharDev | FileKind::BlockDev => *rdev,
                    _ => 0,
                };
                (*kind, None, 1, rdev)
            }
        };
        // A directory's default ACL masks the mode in place of the umask and is the new
        // node's access ACL (`posix_acl_create`); symlinks take none.
        let default = match kind {
            FileKind::Symlink => None,
            _ => self.default_acl(parent)?,
        };
        let perm = match default {
            Some(_) => perm,
            None => perm & !(umask & 0o777),
        };
        let (gid, perm) = new_node_group_and_perm(&p, kind, gid, perm);
        let (perm, access) = match &default {
            Some(d) => {
                let (access, mode) = d.create_masked(perm & 0o777);
                (perm & !0o777 | mode, (!access.is_mode()).then_some(access))
            }
            None => (perm, None),
        };
        let size = target.map_or(size, |t| t.len() as u64);
        // Files and directories take the layout asked for, else the parent's default
        // (directories pass it on, as Lustre's default striping); other kinds have no data.
        let layout = match kind {
            FileKind::File if layout.is_unset() => p.layout.for_child_file(),
            FileKind::Dir if layout.is_unset() => p.layout,
            FileKind::File => layout,
            FileKind::Dir => layout.as_default(),
            _ => FileLayout::default(),
        };
        check_layout(&layout)?;
        if let Some(ino) = ino {
            if ino <= ROOT_INO || self.find(ino)?.is_some() {
                return Err(err(
                    ErrorCode::Stale,
                    format!("inode {ino} is taken or was never reserved"),
                ));
            }
        }
        // A NULL inode number lets the store pick the next one.
        let ino = self
            .tx
            .prepare_cached(
                "INSERT INTO inodes(kind, perm, nlink, uid, gid, size, atime_s, atime_ns,
                    mtime_s, mtime_ns, ctime_s, ctime_ns, parent, target, ino, rdev,
                    stripe_size, stripe_count, stripe_start, unnamed, btime_s, btime_ns)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?7, ?8, ?7, ?8, ?9, ?10, ?11, ?12,
                    ?13, ?14, ?15, ?16, ?7, ?8)",
            )
            .and_then(|mut st| {
                st.insert(params![
                    kind_code(kind),
                    i64::from(perm),
                    if name.is_some() { nlink } else { 0 },
                    i64::from(uid),
                    i64::from(gid),
                    size as i64,
                    now.secs,
                    i64::from(now.nsec),
                    if kind == FileKind::Dir {
                        parent as i64
                    } else {
                        0
                    },
                    target,
                    ino.map(|i| i as i64),
                    i64::from(rdev),
                    layout.stripe_size as i64,
                    i64::from(layout.stripe_count),
                    i64::from(layout.start),
                    name.is_none()
                ])
            })
            .map_err(db_err)? as u64;
        if let Some(name) = name {
            self.insert_dentry(parent, name, ino, kind)?;
        }
        if let Some(access) = access {
            self.put_xattr(ino, acl::ACCESS, &access.encode())?;
        }
        if let (Some(d), FileKind::Dir) = (&default, kind) {
            self.put_xattr(ino, acl::DEFAULT, &d.encode())?;
        }
        let (parent_after, nlink) = match name {
            Some(_) => (
                self.touch_dir(parent, if kind == FileKind::Dir { 1 } else { 0 }, now)?,
                nlink,
            ),
            None => (p, 0),
        };
        let attr = Attr {
            ino,
            kind,
            perm,
            nlink: nlink as u32,
            uid,
            gid,
            size,
            atime: now,
            mtime: now,
            ctime: now,
            change: 0,
            rdev,
            through: 0,
            layout,
            btime: now,
            flags: 0,
        };
        Ok(Created {
            attr,
            parent: parent_after,
            inherited: default.is_some(),
        })
    }

    pub fn link(&self, ino: Ino, new_parent: Ino, new_name: &[u8]) -> MetaResult<Attr> {
        check_name(new_name)?;
        let a = self.getattr(ino)?;
        Self::refuse_flagged(&a, FL_IMMUTABLE | FL_APPEND, "link")?;
        if a.kind == FileKind::Dir {
            return Err(err(
                ErrorCode::Permission,
                "hard links to directories are not allowed",
            ));
        }
        // An unnamed file (`O_TMPFILE`) takes its first name; one whose last name went does
        // not come back.
        if a.nlink == 0 && !self.is_unnamed(ino)? {
            return Err(err(
                ErrorCode::NotFound,
                format!("inode {ino} was unlinked"),
            ));
        }
        Self::refuse_flagged(&self.dir(new_parent)?, FL_IMMUTABLE, "link")?;
        if self.dentry(new_parent, new_name)?.is_some() {
            return Err(err(
                ErrorCode::Exists,
                format!("{} exists", String::from_utf8_lossy(new_name)),
            ));
        }
        self.insert_dentry(new_parent, new_name, ino, a.kind)?;
        let now = Timestamp::now();
        self.tx
            .execute(
                "UPDATE inodes SET nlink = nlink + 1, ctime_s = ?2, ctime_ns = ?3, unnamed = 0
                 WHERE ino = ?1",
                params![ino as i64, now.secs, i64::from(now.nsec)],
            )
            .map_err(db_err)?;
        self.touch_dir(new_parent, 0, now)?;
        self.getattr(ino)
    }

    /// Whether `ino` was made by [`tmpfile`](Self::tmpfile) and never named.
    pub(crate) fn is_unnamed(&self, ino: Ino) -> MetaResult<bool> {
        self.tx
            .prepare_cached("SELECT 1 FROM inodes WHERE ino = ?1 AND unnamed = 1")
            .and_then(|mut st| st.exists([ino as i64]))
            .map_err(db_err)
    }

    fn remove_dentry(&self, parent: Ino, name: &[u8]) -> MetaResult<()> {
        self.tx
            .prepare_cached("DELETE FROM dentries WHERE parent = ?1 AND name = ?2")
            .and_then(|mut st| st.execute(params![parent as i64, name]))
            .map_err(db_err)?;
        Ok(())
    }

    /// Drops one link of a non-directory inode; returns what became of it. An orphan not in
    /// `keep` is forgotten at once.
    fn drop_link(&self, ino: Ino, now: Timestamp, keep: &KeepOpen) -> MetaResult<Unlinked> {
        let (nlink, kind, size) = self
            .tx
            .prepare_cached(
                "UPDATE inodes SET nlink = nlink - 1, ctime_s = ?2, ctime_ns = ?3 WHERE ino = ?1
                 RETURNING nlink, kind, size, flags",
            )
            .and_then(|mut st| {
                st.query_row(params![ino as i64, now.secs, i64::from(now.nsec)], |r| {
                    // What the objects may reach: the fragments their removal goes to.
                    let extent = surge_proto::extent_of(
                        r.get::<_, i64>(2)? as u64,
                        r.get::<_, i64>(3)? as u32,
                    );
                    Ok((r.get::<_, i64>(0)?, kind_at(r, 1)?, extent))
                })
            })
            .optional()
            .map_err(db_err)?
            .ok_or_else(|| err(ErrorCode::NotFound, format!("inode {ino} does not exist")))?;
        let orphaned = nlink == 0;
        let purged = orphaned
            && match keep {
                KeepOpen::All => false,
                KeepOpen::Only(open) => !open.contains(&ino),
            };
        if purged {
            self.delete_inode(ino)?;
        }
        Ok(Unlinked {
            ino,
            kind,
            orphaned,
            size,
            purged,
        })
    }

    fn has_children(&self, dir: Ino) -> MetaResult<bool> {
        self.tx
            .prepare_cached("SELECT 1 FROM dentries WHERE parent = ?1 LIMIT 1")
            .and_then(|mut st| st.exists([dir as i64]))
            .map_err(db_err)
    }

    fn delete_inode(&self, ino: Ino) -> MetaResult<()> {
        for sql in [
            "DELETE FROM inodes WHERE ino = ?1",
            "DELETE FROM xattrs WHERE ino = ?1",
        ] {
            self.tx
                .prepare_cached(sql)
                .and_then(|mut st| st.execute([ino as i64]))
                .map_err(db_err)?;
        }
        Ok(())
    }

    /// Moves `ino`'s ctime to now; returns its attributes.
    fn touch_ctime(&self, ino: Ino) -> MetaResult<Attr> {
        let now = Timestamp::now();
        self.tx
            .prepare_cached("UPDATE inodes SET ctime_s = ?2, ctime_ns = ?3 WHERE ino = ?1")
            .and_then(|mut st| st.execute(params![ino as i64, now.secs, i64::from(now.nsec)]))
            .map_err(db_err)?;
        self.getattr(ino)
    }

    pub fn unlink(&self, parent: Ino, name: &[u8], keep: &KeepOpen) -> MetaResult<Unlinked> {
        self.unlink_of(parent, name, keep, None).map(|(u, _)| u)
    }

    /// [`unlink`](Self::unlink), also returning the parent's attributes after.
    pub fn unlink_returning_parent(
        &self,
        parent: Ino,
        name: &[u8],
        keep: &KeepOpen,
    ) -> MetaResult<(Unlinked, Attr)> {
        self.unlink_of(parent, name, keep, None)
    }

    /// [`unlink`](Self::unlink), only while `name` names file `expect` when given (Stale
    /// otherwise: it names another inode now, or a directory); also returns the parent's
    /// attributes after.
    fn unlink_of(
        &self,
        parent: Ino,
        name: &[u8],
        keep: &KeepOpen,
        expect: Option<Ino>,
    ) -> MetaResult<(Unlinked, Attr)> {
        Self::refuse_flagged(&self.dir(parent)?, FL_IMMUTABLE | FL_APPEND, "unlink")?;
        let (ino, kind) = self.dentry(parent, name)?.ok_or_else(|| {
            err(
                ErrorCode::NotFound,
                format!("{} not found", String::from_utf8_lossy(name)),
            )
        })?;
        self.refuse_flagged_ino(ino, FL_IMMUTABLE | FL_APPEND, "unlink")?;
        if let Some(e) = expect.filter(|&e| e != ino || kind == FileKind::Dir) {
            return Err(err(
                ErrorCode::Stale,
                format!(
                    "{} now names another inode than {e}",
                    String::from_utf8_lossy(name)
                ),
            ));
        }
        if kind == FileKind::Dir {
            return Err(err(
                ErrorCode::IsDir,
                format!("{} is a directory", String::from_utf8_lossy(name)),
            ));
        }
        let now = Timestamp::now();
        self.remove_dentry(parent, name)?;
        let parent_after = self.touch_dir(parent, 0, now)?;
        Ok((self.drop_link(ino, now, keep)?, parent_after))
    }

    /// The changes of a [`surge_proto::Request::NamespaceBatch`]: one result per change. A
    /// change that no longer applies (the name is gone or names another inode, the name is
    /// taken, ...) fails alone, changing nothing; a failure of the store fails the whole batch
    /// (the caller's transaction rolls back).
    pub fn namespace_batch(
        &self,
        batch: &[BatchOp],
    ) -> MetaResult<Vec<Result<BatchDone, ErrorReply>>> {
        let keep = KeepOpen::Only(Vec::new());
        let mut out = Vec::with_capacity(batch.len());
        for op in batch {
            let r = match op {
                BatchOp::Unlink { parent, name, ino } => self
                    .unlink_of(*parent, name, &keep, Some(*ino))
                    .map(|(unlinked, p)| BatchDone::Unlinked {
                        unlinked,
                        change: p.change,
                    }),
                BatchOp::CreateFile {
                    parent,
                    name,
                    ino,
                    perm,
                    uid,
                    gid,
                    time,
                    layout,
                    changed,
                } => self
                    .create_in(
                        *parent,
                        name,
                        &NewNode::File,
                        (*perm, *uid, *gid),
                        0,
                        Some(*ino),
                        *time,
                        *layout,
                    )
                    .and_then(|c| {
                        if *changed {
                            self.touch_ctime(*ino)?;
                        }
                        Ok(BatchDone::Created {
                            change: c.parent.change,
                        })
                    }),
                BatchOp::Rmdir { parent, name, ino } => self
                    .rmdir_of(*parent, name, Some(*ino))
                    .map(|p| BatchDone::Removed { change: p.change }),
            };
            match r {
                // Checks come before changes: an I/O error may have left a change half made.
                Err(e) if e.code == ErrorCode::Io => return Err(e),
                r => out.push(r),
            }
        }
        Ok(out)
    }

    /// Sets the layout of `ino` (see [`Request::SetLayout`](surge_proto::Request::SetLayout)):
    /// a regular file's only while it holds no data, a directory's default at any time.
    pub fn set_layout(&self, ino: Ino, layout: FileLayout) -> MetaResult<Attr> {
        let a = self.getattr(ino)?;
        let layout = match a.kind {
            FileKind::File => {
                if a.size != 0 || a.through != 0 {
                    return Err(err(
                        ErrorCode::Busy,
                        format!(
                            "inode {ino} holds data ({} bytes): a file's layout is chosen before \
                             its first write (make a new file with the layout, or set it on \
                             the directory, and copy the data into it)",
                            a.size
                        ),
                    ));
                }
                if layout.is_unset() {
                    layout
                } else if layout.stripe_count == 0 {
                    FileLayout { start: 0, ..layout }
                } else {
                    layout
                }
            }
            FileKind::Dir => layout.as_default(),
            _ => {
                return Err(err(
                    ErrorCode::Invalid,
                    format!("inode {ino} is neither a file nor a directory: it has no layout"),
                ))
            }
        };
        check_layout(&layout)?;
        let now = Timestamp::now();
        self.tx
            .execute(
                "UPDATE inodes SET stripe_size = ?2, stripe_count = ?3, stripe_start = ?4,
                    ctime_s = ?5, ctime_ns = ?6 WHERE ino = ?1",
                params![
                    ino as i64,
                    layout.stripe_size as i64,
                    i64::from(layout.stripe_count),
                    i64::from(layout.start),
                    now.secs,
                    i64::from(now.nsec)
                ],
            )
            .map_err(db_err)?;
        self.getattr(ino)
    }

    /// Reserves `count` inode numbers, never given out again; returns the first.
    pub fn alloc_inodes(&self, count: u32) -> MetaResult<Ino> {
        if count == 0 || count > 65536 {
            return Err(err(
                ErrorCode::Invalid,
                format!("cannot reserve {count} inodes (1..=65536)"),
            ));
        }
        let seq: Option<i64> = self
            .tx
            .prepare_cached("SELECT seq FROM sqlite_sequence WHERE name = 'inodes'")
            .and_then(|mut st| st.query_row([], |r| r.get(0)).optional())
            .map_err(db_err)?;
        let last = match seq {
            Some(s) => s,
            None => self
                .tx
                .query_row("SELECT COALESCE(MAX(ino), 1) FROM inodes", [], |r| r.get(0))
                .map_err(db_err)?,
        };
        let new = last + i64::from(count);
        let sql = if seq.is_some() {
            "UPDATE sqlite_sequence SET seq = ?1 WHERE name = 'inodes'"
        } else {
            "INSERT INTO sqlite_sequence(name, seq) VALUES ('inodes', ?1)"
        };
        self.tx
            .prepare_cached(sql)
            .and_then(|mut st| st.execute([new]))
            .map_err(db_err)?;
        Ok(last as u64 + 1)
    }

    /// Removes empty directory `name`; returns the parent's attributes after.
    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> MetaResult<Attr> {
        self.rmdir_of(parent, name, None)
    }

    /// [`rmdir`](Self::rmdir), only while `name` names `expect` when that is given (a
    /// removal made behind, see [`namespace_batch`](Self::namespace_batch)).
    fn rmdir_of(&self, parent: Ino, name: &[u8], expect: Option<Ino>) -> MetaResult<Attr> {
        Self::refuse_flagged(&self.dir(parent)?, FL_IMMUTABLE | FL_APPEND, "rmdir")?;
        let (ino, kind) = self.dentry(parent, name)?.ok_or_else(|| {
            err(
                ErrorCode::NotFound,
                format!("{} not found", String::from_utf8_lossy(name)),
            )
        })?;
        if let Some(e) = expect.filter(|&e| e != ino) {
            return Err(err(
                ErrorCode::Stale,
                format!(
                    "{} now names another inode than {e}",
                    String::from_utf8_lossy(name)
                ),
            ));
        }
        if kind != FileKind::Dir {
            return Err(err(
                ErrorCode::NotDir,
                format!("{} is not a directory", String::from_utf8_lossy(name)),
            ));
        }
        self.refuse_flagged_ino(ino, FL_IMMUTABLE | FL_APPEND, "rmdir")?;
        if self.has_children(ino)? {
            return Err(err(
                ErrorCode::NotEmpty,
                format!("{} is not empty", String::from_utf8_lossy(name)),
            ));
        }
        self.remove_dentry(parent, name)?;
        self.delete_inode(ino)?;
        self.touch_dir(parent, -1, Timestamp::now())
    }

    pub fn readlink(&self, ino: Ino) -> MetaResult<Vec<u8>> {
        let t: Option<Option<Vec<u8>>> = self
            .tx
            .prepare_cached("SELECT target FROM inodes WHERE ino = ?1")
            .and_then(|mut st| st.query_row([ino as i64], |r| r.get(0)).optional())
            .map_err(db_err)?;
        match t {
            None => Err(err(
                ErrorCode::NotFound,
                format!("inode {ino} does not exist"),
            )),
            Some(None) => Err(err(
                ErrorCode::Invalid,
                format!("inode {ino} is not a symlink"),
            )),
            Some(Some(t)) => Ok(t),
        }
    }

    pub fn readdir(
        &self,
        ino: Ino,
        after: u64,
        max: u32,
        plus: bool,
    ) -> MetaResult<(Vec<DirEntry>, bool, Attr)> {
        let dir = self.dir(ino)?;
        let max = max.clamp(1, 4096);
        let sql = if plus {
            format!(
                "SELECT d.id, d.name, d.ino, d.kind, {} FROM dentries d JOIN inodes i ON i.ino = d.ino
                 WHERE d.parent = ?1 AND d.id > ?2 ORDER BY d.id LIMIT ?3",
                ATTR_COLS
                    .split(", ")
                    .map(|c| format!("i.{c}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            "SELECT id, name, ino, kind FROM dentries WHERE parent = ?1 AND id > ?2
             ORDER BY id LIMIT ?3"
                .to_string()
        };
        let mut st = self.tx.prepare_cached(&sql).map_err(db_err)?;
        let rows = st
            .query_map(params![ino as i64, after as i64, i64::from(max)], |r| {
                Ok(DirEntry {
                    cursor: r.get::<_, i64>(0)? as u64,
                    name: r.get(1)?,
                    ino: r.get::<_, i64>(2)? as u64,
                    kind: kind_at(r, 3)?,
                    attr: if plus {
                        Some(attr_from_row(r, 4)?)
                    } else {
                        None
                    },
                })
            })
            .map_err(db_err)?;
        let entries = rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db_err)?;
        let done = entries.len() < max as usize;
        Ok((entries, done, dir))
    }

    pub fn setattr(&self, ino: Ino, set: &SetAttr) -> MetaResult<Attr> {
        let mut a = self.getattr(ino)?;
        let now = Timestamp::now();
        let others = SetAttr {
            flags: None,
            ..set.clone()
        };
        if others != SetAttr::default() {
            // As Linux: an immutable or append-only file's mode, owner, times and size stay.
            Self::refuse_flagged(&a, FL_IMMUTABLE | FL_APPEND, "setattr")?;
        }
        if let Some(f) = set.flags {
            if f & !FILE_FLAGS != 0 {
                return Err(err(
                    ErrorCode::Unsupported,
                    format!(
                        "chattr flags {:#x} are not kept here (only immutable, append-only, \
                         no-dump and no-atime)",
                        f & !FILE_FLAGS
                    ),
                ));
            }
            // The capability and past-the-end marks are the store's own, not the caller's.
            a.flags = f | (a.flags & STORE_MARKS);
        }
        if set.uid.is_some() || set.gid.is_some() || set.size.is_some() {
            self.kill_capability(&mut a)?;
        }
        let resolve = |t: TimeSet| match t {
            TimeSet::Now => now,
            TimeSet::At(ts) => ts,
        };
        if let Some(p) = set.perm {
            a.perm = p & 0o7777;
            if let Some(mut access) = self.stored_acl(ino, acl::ACCESS)? {
                access.chmod(a.perm);
                self.put_xattr(ino, acl::ACCESS, &access.encode())?;
            }
        }
        if let Some(u) = set.uid {
            a.uid = u;
        }
        if let Some(g) = set.gid {
            a.gid = g;
        }
        if let Some(s) = set.size {
            if a.kind == FileKind::Dir {
                return Err(err(ErrorCode::IsDir, "cannot truncate a directory"));
            }
            Self::check_not_evicted(&a, "truncate")?;
            if a.size != s && set.mtime.is_none() {
                a.mtime = now;
            }
            a.size = s;
        }
        if let Some(t) = set.atime {
            a.atime = resolve(t);
        }
        if let Some(t) = set.mtime {
            a.mtime = resolve(t);
        }
        a.ctime = now;
        self.tx
            .prepare_cached(
                "UPDATE inodes SET perm = ?2, uid = ?3, gid = ?4, size = ?5, atime_s = ?6,
                 atime_ns = ?7, mtime_s = ?8, mtime_ns = ?9, ctime_s = ?10, ctime_ns = ?11,
                 flags = ?12 WHERE ino = ?1",
            )
            .and_then(|mut st| {
                st.execute(params![
                    ino as i64,
                    i64::from(a.perm),
                    i64::from(a.uid),
                    i64::from(a.gid),
                    a.size as i64,
                    a.atime.secs,
                    i64::from(a.atime.nsec),
                    a.mtime.secs,
                    i64::from(a.mtime.nsec),
                    a.ctime.secs,
                    i64::from(a.ctime.nsec),
                    i64::from(a.flags)
                ])
            })
            .map_err(db_err)?;
        Ok(a)
    }

    /// A read of file `ino`, or a listing of directory `ino`, on a mount that keeps access
    /// times: its atime becomes now when [`surge_proto::atime_due`] says so; its ctime stays
    /// (`Request::Accessed`).
    pub fn accessed(&self, ino: Ino, strict: bool) -> MetaResult<Attr> {
        let mut a = self.getattr(ino)?;
        let now = Timestamp::now();
        if !matches!(a.kind, FileKind::File | FileKind::Dir)
            || !surge_proto::atime_due(&a, now, strict)
        {
            return Ok(a);
        }
        a.atime = now;
        self.tx
            .prepare_cached("UPDATE inodes SET atime_s = ?2, atime_ns = ?3 WHERE ino = ?1")
            .and_then(|mut st| st.execute(params![ino as i64, now.secs, i64::from(now.nsec)]))
            .map_err(db_err)?;
        Ok(a)
    }

    /// File `ino` is about to hold allocated bytes past its end (`Request::AllocatedPastEnd`):
    /// marked [`FL_EOFBLOCKS`] for good (whoever removes or cuts its objects goes to every
    /// fragment of its layout; a mark a node does not know of yet only delays the freeing of
    /// bytes that read as zeros, to the unlink).
    pub fn allocated_past_end(&self, ino: Ino) -> MetaResult<Attr> {
        let mut a = self.file_attr(ino)?;
        if a.flags & FL_EOFBLOCKS == 0 {
            self.mark(ino, FL_EOFBLOCKS, true)?;
            a.flags |= FL_EOFBLOCKS;
        }
        Ok(a)
    }

    /// A mount measured the objects of `ino` (marked [`FL_RECOVER`]) to reach byte `size`:
    /// the size becomes max(size, `size`), mtime and ctime now, and the mark goes. A file no
    /// longer marked (another node recovered it first) is left as it is.
    pub fn recovered(&self, ino: Ino, size: u64) -> MetaResult<Attr> {
        let a = self.file_attr(ino)?;
        if a.flags & FL_RECOVER == 0 {
            return Ok(a);
        }
        let now = Timestamp::now();
        self.tx
            .prepare_cached(
                "UPDATE inodes SET size = MAX(size, ?2), mtime_s = ?3, mtime_ns = ?4,
                 ctime_s = ?3, ctime_ns = ?4, flags = flags & ~?5 WHERE ino = ?1",
            )
            .and_then(|mut st| {
                st.execute(params![
                    ino as i64,
                    size.min(i64::MAX as u64) as i64,
                    now.secs,
                    i64::from(now.nsec),
                    i64::from(FL_RECOVER)
                ])
            })
            .map_err(db_err)?;
        self.getattr(ino)
    }

    /// Marks the files of `inos` that still exist [`FL_RECOVER`] (their writer's mount went
    /// before committing); returns how many.
    pub fn mark_for_recovery(&self, inos: &[Ino]) -> MetaResult<usize> {
        let mut n = 0;
        for &ino in inos {
            n += self
                .tx
                .prepare_cached("UPDATE inodes SET flags = flags | ?2 WHERE ino = ?1 AND kind = 1")
                .and_then(|mut st| st.execute(params![ino as i64, i64::from(FL_RECOVER)]))
                .map_err(db_err)?;
        }
        Ok(n)
    }

    /// Sets (`on`) or clears the store's own mark `bit` ([`FL_CAPS`], [`FL_EOFBLOCKS`]) of
    /// inode `ino`.
    pub(super) fn mark(&self, ino: Ino, bit: u32, on: bool) -> MetaResult<()> {
        let sql = if on {
            "UPDATE inodes SET flags = flags | ?2 WHERE ino = ?1"
        } else {
            "UPDATE inodes SET flags = flags & ~?2 WHERE ino = ?1"
        };
        self.tx
            .prepare_cached(sql)
            .and_then(|mut st| st.execute(params![ino as i64, i64::from(bit)]))
            .map_err(db_err)?;
        Ok(())
    }

    /// The attributes of `ino`, a regular file (`Invalid` for any other kind).
    fn file_attr(&self, ino: Ino) -> MetaResult<Attr> {
        let a = self.getattr(ino)?;
        if a.kind != FileKind::File {
            return Err(err(
                ErrorCode::Invalid,
                format!("inode {ino} is a {:?}, not a file", a.kind),
            ));
        }
        Ok(a)
    }

    pub fn commit_write(&self, ino: Ino, size: u64, mtime: TimeSet) -> MetaResult<Attr> {
        let now = Timestamp::now();
        let m = match mtime {
            TimeSet::Now => now,
            TimeSet::At(t) => t,
        };
        let n = self
            .tx
            .prepare_cached(
                "UPDATE inodes SET size = MAX(size, ?2), mtime_s = ?3, mtime_ns = ?4,
                 ctime_s = ?5, ctime_ns = ?6 WHERE ino = ?1 AND kind = 1 AND through != ?7",
            )
            .and_then(|mut st| {
                st.execute(params![
                    ino as i64,
                    size as i64,
                    m.secs,
                    i64::from(m.nsec),
                    now.secs,
                    i64::from(now.nsec),
                    surge_proto::THROUGH_FILL as i64
                ])
            })
            .map_err(db_err)?;
        if n == 0 {
            let a = self.getattr(ino)?;
            Self::check_not_evicted(&a, "commit of writes")?;
            return Err(err(
                ErrorCode::Invalid,
                format!("inode {ino} is a {:?}, not a file", a.kind),
            ));
        }
        // Written: a file capability goes (the kernel of a node that passed the file
        // through, or wrote with `O_DIRECT`, did not ask before its writes).
        let mut a = self.getattr(ino)?;
        self.kill_capability(&mut a)?;
        Ok(a)
    }

    /// `O_APPEND`: reserves `len` bytes at the end of file `ino` (its size grows by `len`, its
    /// mtime and ctime move); returns where they start and the attributes after. One
    /// transaction, so two nodes appending at once get ranges that do not overlap.
    pub fn append(&self, ino: Ino, len: u64) -> MetaResult<(u64, Attr)> {
        let a = self.file_attr(ino)?;
        Self::check_not_evicted(&a, "append")?;
        let end = a
            .size
            .checked_add(len)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or_else(|| {
                err(
                    ErrorCode::TooLarge,
                    format!("append of {len} bytes past the largest file offset"),
                )
            })?;
        let after = self.commit_write(ino, end, TimeSet::Now)?;
        Ok((a.size, after))
    }

    pub fn purge(&self, ino: Ino) -> MetaResult<()> {
        match self.find(ino)? {
            Some(a) if a.nlink == 0 => self.delete_inode(ino),
            Some(_) => Err(err(ErrorCode::Busy, format!("inode {ino} still has names"))),
            None => Ok(()),
        }
    }

    /// Forgets `ino` if it has no name left (an unlinked file a mount that went held open);
    /// its attributes as it was, or `None` when it is gone or has a name.
    pub fn purge_orphan(&self, ino: Ino) -> MetaResult<Option<Attr>> {
        match self.find(ino)? {
            Some(a) if a.nlink == 0 => {
                self.delete_inode(ino)?;
                Ok(Some(a))
            }
            _ => Ok(None),
        }
    }

    pub fn inode_count(&self) -> MetaResult<u64> {
        self.tx
            .prepare_cached("SELECT COUNT(*) FROM inodes WHERE nlink > 0")
            .and_then(|mut st| st.query_row([], |r| r.get::<_, i64>(0)))
            .map(|n| n as u64)
            .map_err(db_err)
    }

    /// Inodes whose last name is gone but whose objects were never removed (a client died
    /// before its last close). Reported at start-up.
    pub fn orphans(&self) -> MetaResult<Vec<(Ino, u64)>> {
        let mut st = self
            .tx
            .prepare_cached("SELECT ino, size FROM inodes WHERE nlink = 0")
            .map_err(db_err)?;
        let rows = st
            .query_map([], |r| {
                Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))
            })
            .map_err(db_err)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use surge_proto::START_ANY;

    pub(super) fn store() -> (tempfile::TempDir, Connection) {
        let t = tempfile::tempdir().unwrap();
        let c = open(&t.path().join("m.db"), 1000, 1000, 0o755).unwrap();
        (t, c)
    }

    pub(super) fn code<T: std::fmt::Debug>(r: MetaResult<T>) -> ErrorCode {
        r.unwrap_err().code
    }

    #[test]
    fn layouts_are_kept_per_file_and_directories_pass_their_default_on() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let one = FileLayout {
            stripe_size: 1 << 20,
            stripe_count: 1,
            start: 0,
        };
        let d = ops
            .create(ROOT_INO, b"d", &NewNode::Dir, 0o755, 1, 1)
            .unwrap();
        assert!(d.layout.is_unset(), "no default unless one is set");
        let d = ops.set_layout(d.ino, one).unwrap();
        assert_eq!(d.layout, one.as_default());
        // A file made in it takes the default with its start left to the instance's rule; a
        // subdirectory takes the default itself.
        let f = ops
            .create(d.ino, b"f", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        assert_eq!(f.layout, one.for_child_file());
        assert_eq!(f.layout.start, START_ANY);
        let sub = ops
            .create(d.ino, b"sub", &NewNode::Dir, 0o755, 1, 1)
            .unwrap();
        assert_eq!(sub.layout, one.as_default());
        // What the creator asks for wins over the default, and is what is read back.
        let wide = FileLayout {
            stripe_size: 0,
            stripe_count: 0,
            start: 0,
        };
        let asked = FileLayout {
            stripe_size: 64 << 10,
            stripe_count: 3,
            start: 2,
        };
        let g = ops
            .create_with_layout(d.ino, b"g", &NewNode::File, (0o644, 1, 1), 0, asked)
            .unwrap()
            .attr;
        assert_eq!(ops.getattr(g.ino).unwrap().layout, asked);
        let s = ops
            .create(
                d.ino,
                b"s",
                &NewNode::Symlink {
                    target: b"f".to_vec(),
                },
                0o777,
                1,
                1,
            )
            .unwrap();
        assert!(s.layout.is_unset(), "a symlink has no data to lay out");
        // An empty file's layout may change; once it holds data it may not.
        assert_eq!(ops.set_layout(f.ino, wide).unwrap().layout, wide);
        ops.commit_write(f.ino, 10, TimeSet::Now).unwrap();
        let e = ops.set_layout(f.ino, one).unwrap_err();
        assert_eq!(e.code, ErrorCode::Busy);
        assert!(e.message.contains("10 bytes"), "{}", e.message);
        assert_eq!(
            code(ops.set_layout(s.ino, one).map(|_| ())),
            ErrorCode::Invalid
        );
        let odd = FileLayout {
            stripe_size: 1000,
            ..one
        };
        assert_eq!(
            code(ops.set_layout(d.ino, odd).map(|_| ())),
            ErrorCode::Invalid
        );
    }

    #[test]
    fn an_unknown_file_kind_in_the_store_is_an_error_not_a_regular_file() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let f = ops
            .create(ROOT_INO, b"f", &NewNode::File, 0o644, 1000, 1000)
            .unwrap();
        c.execute("UPDATE inodes SET kind = 9 WHERE ino = ?1", [f.ino as i64])
            .unwrap();
        let e = ops.getattr(f.ino).unwrap_err();
        assert_eq!(e.code, ErrorCode::Io, "{e:?}");
        assert!(e.message.contains("file kind 9"), "{}", e.message);
        assert_eq!(code(ops.lookup(ROOT_INO, b"f")), ErrorCode::Io);
    }

    #[test]
    fn create_lookup_and_errors() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let d = ops
            .create(ROOT_INO, b"d", &NewNode::Dir, 0o755, 1, 1)
            .unwrap();
        let f = ops
            .create(d.ino, b"f", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        assert_eq!(ops.lookup(d.ino, b"f").unwrap(), f);
        assert_eq!(
            ops.getattr(ROOT_INO).unwrap().nlink,
            3,
            "root gains a link per subdir"
        );
        assert_eq!(
            code(ops.create(d.ino, b"f", &NewNode::File, 0o644, 1, 1)),
            ErrorCode::Exists
        );
        assert_eq!(
            code(ops.create(f.ino, b"x", &NewNode::File, 0o644, 1, 1)),
            ErrorCode::NotDir
        );
        assert_eq!(code(ops.lookup(d.ino, b"nope")), ErrorCode::NotFound);
        assert_eq!(
            code(ops.create(d.ino, &[b'a'; 256], &NewNode::File, 0o644, 1, 1)),
            ErrorCode::NameTooLong
        );
        assert_eq!(code(ops.rmdir(ROOT_INO, b"d")), ErrorCode::NotEmpty);
        assert_eq!(
            code(ops.unlink(ROOT_INO, b"d", &KeepOpen::All)),
            ErrorCode::IsDir
        );
        assert_eq!(code(ops.rmdir(d.ino, b"f")), ErrorCode::NotDir);
    }

    #[test]
    fn special_files_keep_their_kind_and_device_number() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let dev = (8 << 8) | 1;
        for (name, kind) in [
            (&b"fifo"[..], FileKind::Fifo),
            (b"sock", FileKind::Socket),
            (b"chr", FileKind::CharDev),
            (b"blk", FileKind::BlockDev),
        ] {
            let node = NewNode::Special { kind, rdev: dev };
            let a = ops.create(ROOT_INO, name, &node, 0o640, 1, 1).unwrap();
            let back = ops.lookup(ROOT_INO, name).unwrap();
            assert_eq!(back, a);
            assert_eq!(back.kind, kind);
            let want = if matches!(kind, FileKind::CharDev | FileKind::BlockDev) {
                dev
            } else {
                0
            };
            assert_eq!(back.rdev, want, "{kind:?}");
            assert_eq!(back.size, 0);
        }
        let (entries, _, _) = ops.readdir(ROOT_INO, 0, 100, true).unwrap();
        let kinds: Vec<FileKind> = entries.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                FileKind::Fifo,
                FileKind::Socket,
                FileKind::CharDev,
                FileKind::BlockDev
            ]
        );
        let bad = NewNode::Special {
            kind: FileKind::Dir,
            rdev: 0,
        };
        assert_eq!(
            code(ops.create(ROOT_INO, b"x", &bad, 0o755, 1, 1)),
            ErrorCode::Invalid
        );
    }

    #[test]
    fn every_entry_change_bumps_the_directory_change_by_one() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let d = ops
            .create(ROOT_INO, b"d", &NewNode::Dir, 0o755, 1, 1)
            .unwrap();
        let change = |ino| ops.getattr(ino).unwrap().change;
        assert_eq!(change(d.ino), 0);
        let mut expect = 0;
        let mut step = |what: &str, ino: Ino| {
            expect += 1;
            assert_eq!(change(ino), expect, "after {what}");
        };
        let f = ops
            .create(d.ino, b"f", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        step("create", d.ino);
        ops.create(
            d.ino,
            b"s",
            &NewNode::Symlink {
                target: b"f".to_vec(),
            },
            0o777,
            1,
            1,
        )
        .unwrap();
        step("symlink", d.ino);
        ops.create(d.ino, b"sub", &NewNode::Dir, 0o755, 1, 1)
            .unwrap();
        step("mkdir", d.ino);
        ops.link(f.ino, d.ino, b"g").unwrap();
        step("link", d.ino);
        ops.unlink(d.ino, b"g", &KeepOpen::All).unwrap();
        step("unlink", d.ino);
        ops.rmdir(d.ino, b"sub").unwrap();
        step("rmdir", d.ino);
        // Neither reads nor attribute changes count.
        ops.lookup(d.ino, b"f").unwrap();
        ops.setattr(
            d.ino,
            &SetAttr {
                perm: Some(0o700),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(change(d.ino), expect);
        // A rename changes both directories (it may count twice; clients only need a bump).
        let before = change(ROOT_INO);
        ops.rename(d.ino, b"f", ROOT_INO, b"f", 0, &KeepOpen::All)
            .unwrap();
        assert!(change(d.ino) > expect && change(ROOT_INO) > before);
        assert_eq!(change(f.ino), 0, "files have no change counter");
    }

    #[test]
    fn stores_without_the_change_column_are_upgraded() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("m.db");
        {
            let c = Connection::open(&path).unwrap();
            c.execute_batch(
                "CREATE TABLE inodes(
                    ino INTEGER PRIMARY KEY AUTOINCREMENT,
                    kind INTEGER NOT NULL, perm INTEGER NOT NULL, nlink INTEGER NOT NULL,
                    uid INTEGER NOT NULL, gid INTEGER NOT NULL, size INTEGER NOT NULL,
                    atime_s INTEGER NOT NULL, atime_ns INTEGER NOT NULL,
                    mtime_s INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
                    ctime_s INTEGER NOT NULL, ctime_ns INTEGER NOT NULL,
                    parent INTEGER NOT NULL,
                    target BLOB);
                 INSERT INTO inodes VALUES (1, 2, 493, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, NULL);",
            )
            .unwrap();
        }
        let c = open(&path, 0, 0, 0o755).unwrap();
        let ops = Ops { tx: &c };
        assert_eq!(ops.getattr(ROOT_INO).unwrap().change, 0);
        ops.create(ROOT_INO, b"f", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        assert_eq!(ops.getattr(ROOT_INO).unwrap().change, 1);
    }

    #[test]
    fn namespace_batch_checks_each_change_and_reserved_inodes_are_never_reused() {
        let (t, c) = store();
        let ops = Ops { tx: &c };
        let d = ops
            .create(ROOT_INO, b"d", &NewNode::Dir, 0o2775, 1, 7)
            .unwrap();
        let f = ops
            .create(d.ino, b"f", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        let sub = ops
            .create(d.ino, b"sub", &NewNode::Dir, 0o755, 1, 1)
            .unwrap();
        let first = ops.alloc_inodes(10).unwrap();
        assert!(first > sub.ino);
        assert_eq!(ops.alloc_inodes(5).unwrap(), first + 10);
        assert_eq!(code(ops.alloc_inodes(0)), ErrorCode::Invalid);
        let unlink = |name: &[u8], ino| BatchOp::Unlink {
            parent: d.ino,
            name: name.to_vec(),
            ino,
        };
        let time = Timestamp {
            secs: 1_700_000_000,
            nsec: 5,
        };
        let create = |name: &[u8], ino| BatchOp::CreateFile {
            parent: d.ino,
            name: name.to_vec(),
            ino,
            perm: 0o600,
            uid: 3,
            gid: 4,
            time,
            layout: FileLayout::default(),
            changed: false,
        };
        let before = ops.getattr(d.ino).unwrap().change;
        let r = ops
            .namespace_batch(&[
                unlink(b"f", f.ino),
                create(b"f", first),
                unlink(b"g", f.ino),
                unlink(b"sub", sub.ino),
                create(b"f", first + 1),
                create(b"h", first),
                create(b"h", 1),
                unlink(b"f", f.ino),
            ])
            .unwrap();
        match &r[0] {
            Ok(BatchDone::Unlinked { unlinked, change }) => {
                assert!(unlinked.orphaned && unlinked.purged && unlinked.ino == f.ino);
                assert_eq!(*change, before + 1);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(r[1], Ok(BatchDone::Created { change: before + 2 }));
        let codes: Vec<_> = r[2..]
            .iter()
            .map(|x| x.as_ref().unwrap_err().code)
            .collect();
        assert_eq!(
            codes,
            [
                ErrorCode::NotFound,
                ErrorCode::Stale,
                ErrorCode::Exists,
                ErrorCode::Stale,
                ErrorCode::Stale,
                ErrorCode::Stale
            ]
        );
        let a = ops.lookup(d.ino, b"f").unwrap();
        assert_eq!((a.ino, a.perm, a.uid, a.mtime), (first, 0o600, 3, time));
        assert_eq!(a.gid, 7, "setgid directory passes its group down");
        assert_eq!(ops.getattr(d.ino).unwrap().change, before + 2);
        assert_eq!(code(ops.getattr(f.ino)), ErrorCode::NotFound, "forgotten");
        // Reserved numbers survive a reopen and are not handed out by plain creates.
        drop(c);
        let c = open(&t.path().join("m.db"), 1000, 1000, 0o755).unwrap();
        let ops = Ops { tx: &c };
        let g = ops
            .create(d.ino, b"g", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        assert!(g.ino >= first + 15, "{} reused a reserved number", g.ino);
        assert!(ops.alloc_inodes(1).unwrap() > g.ino);
    }

    #[test]
    fn a_batch_removes_an_empty_directory_only_while_its_name_names_it() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let mk = |parent, name: &[u8]| {
            ops.create(parent, name, &NewNode::Dir, 0o755, 1, 1)
                .unwrap()
        };
        let (a, b, full) = (
            mk(ROOT_INO, b"a"),
            mk(ROOT_INO, b"b"),
            mk(ROOT_INO, b"full"),
        );
        mk(full.ino, b"inside");
        let rmdir = |name: &[u8], ino| BatchOp::Rmdir {
            parent: ROOT_INO,
            name: name.to_vec(),
            ino,
        };
        let before = ops.getattr(ROOT_INO).unwrap();
        let r = ops
            .namespace_batch(&[
                rmdir(b"a", b.ino),
                rmdir(b"full", full.ino),
                rmdir(b"a", a.ino),
            ])
            .unwrap();
        assert_eq!(r[0].as_ref().unwrap_err().code, ErrorCode::Stale);
        assert_eq!(r[1].as_ref().unwrap_err().code, ErrorCode::NotEmpty);
        assert_eq!(
            r[2],
            Ok(BatchDone::Removed {
                change: before.change + 1
            })
        );
        let after = ops.getattr(ROOT_INO).unwrap();
        assert_eq!(after.nlink, before.nlink - 1);
        assert_eq!(code(ops.lookup(ROOT_INO, b"a")), ErrorCode::NotFound);
        assert_eq!(code(ops.getattr(a.ino)), ErrorCode::NotFound);
        assert!(ops.lookup(ROOT_INO, b"b").is_ok() && ops.lookup(ROOT_INO, b"full").is_ok());
    }

    #[test]
    fn unlink_orphans_then_purge() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let f = ops
            .create(ROOT_INO, b"f", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        ops.link(f.ino, ROOT_INO, b"g").unwrap();
        assert!(!ops.unlink(ROOT_INO, b"f", &KeepOpen::All).unwrap().orphaned);
        let u = ops.unlink(ROOT_INO, b"g", &KeepOpen::All).unwrap();
        assert!(u.orphaned);
        assert_eq!(
            ops.getattr(f.ino).unwrap().nlink,
            0,
            "kept for open handles"
        );
        assert_eq!(ops.orphans().unwrap(), vec![(f.ino, 0)]);
        ops.purge(f.ino).unwrap();
        assert_eq!(code(ops.getattr(f.ino)), ErrorCode::NotFound);
    }

    #[test]
    fn a_tmpfile_has_no_name_until_linked_and_an_unlinked_file_is_not_linked_again() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let d = ops
            .create(ROOT_INO, b"d", &NewNode::Dir, 0o2775, 0, 7)
            .unwrap();
        let before = ops.getattr(d.ino).unwrap();
        let t = ops
            .tmpfile(d.ino, (0o666, 1, 1), 0o022, FileLayout::default())
            .unwrap();
        assert_eq!((t.kind, t.nlink, t.perm), (FileKind::File, 0, 0o644));
        assert_eq!(t.gid, 7, "the setgid directory's group");
        assert_eq!(ops.getattr(t.ino).unwrap().nlink, 0);
        let after = ops.getattr(d.ino).unwrap();
        assert_eq!(
            (after.change, after.mtime),
            (before.change, before.mtime),
            "the directory is left as it was"
        );
        assert_eq!(ops.readdir(d.ino, 0, 10, false).unwrap().0.len(), 0);
        assert_eq!(
            code(ops.tmpfile(t.ino, (0o600, 1, 1), 0, FileLayout::default())),
            ErrorCode::NotDir
        );
        let u = ops
            .tmpfile(d.ino, (0o600, 1, 1), 0, FileLayout::default())
            .unwrap();

        assert_eq!(ops.link(t.ino, d.ino, b"named").unwrap().nlink, 1);
        assert_eq!(ops.lookup(d.ino, b"named").unwrap().ino, t.ino);
        assert_eq!(code(ops.purge(t.ino)), ErrorCode::Busy, "it has a name");
        assert!(
            ops.unlink(d.ino, b"named", &KeepOpen::All)
                .unwrap()
                .orphaned
        );
        assert_eq!(
            code(ops.link(t.ino, d.ino, b"again")),
            ErrorCode::NotFound,
            "named once, it is an unlinked file like any other"
        );
        ops.purge(t.ino).unwrap();
        // Never named: purged at its last close.
        ops.purge(u.ino).unwrap();
        assert_eq!(code(ops.getattr(u.ino)), ErrorCode::NotFound);
        assert_eq!(ops.orphans().unwrap(), vec![]);
    }

    #[test]
    fn unlink_forgets_an_orphan_at_once_unless_it_is_open_on_the_caller() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let f = ops
            .create(ROOT_INO, b"f", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        let g = ops
            .create(ROOT_INO, b"g", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        let u = ops
            .unlink(ROOT_INO, b"f", &KeepOpen::Only(vec![g.ino]))
            .unwrap();
        assert!(u.orphaned && u.purged);
        assert_eq!(code(ops.getattr(f.ino)), ErrorCode::NotFound);
        let u = ops
            .unlink(ROOT_INO, b"g", &KeepOpen::Only(vec![g.ino]))
            .unwrap();
        assert!(u.orphaned && !u.purged, "open on the caller: kept");
        assert_eq!(ops.getattr(g.ino).unwrap().nlink, 0);
    }

    #[test]
    fn readdir_pages_in_creation_order() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        for i in 0..10 {
            ops.create(
                ROOT_INO,
                format!("f{i}").as_bytes(),
                &NewNode::File,
                0o644,
                1,
                1,
            )
            .unwrap();
        }
        let (p1, done1, d1) = ops.readdir(ROOT_INO, 0, 4, false).unwrap();
        assert!(!done1);
        let (p2, _, _) = ops.readdir(ROOT_INO, p1[3].cursor, 4, true).unwrap();
        let (p3, done3, d3) = ops.readdir(ROOT_INO, p2[3].cursor, 4, false).unwrap();
        assert!(done3);
        let names: Vec<_> = p1
            .iter()
            .chain(&p2)
            .chain(&p3)
            .map(|e| e.name.clone())
            .collect();
        assert_eq!(names.len(), 10);
        assert_eq!(names[9], b"f9");
        assert!(p2[0].attr.is_some());
        assert_eq!(
            d1.change, d3.change,
            "each page carries the directory's counter"
        );
        assert_eq!(d1.kind, FileKind::Dir);
    }

    #[test]
    fn commit_write_only_grows_and_setattr_truncates() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let f = ops
            .create(ROOT_INO, b"f", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        assert_eq!(
            ops.commit_write(f.ino, 100, TimeSet::Now).unwrap().size,
            100
        );
        assert_eq!(ops.commit_write(f.ino, 50, TimeSet::Now).unwrap().size, 100);
        let set = SetAttr {
            size: Some(10),
            ..Default::default()
        };
        assert_eq!(ops.setattr(f.ino, &set).unwrap().size, 10);
        assert_eq!(
            code(ops.commit_write(ROOT_INO, 1, TimeSet::Now)),
            ErrorCode::Invalid
        );
    }

    /// chattr flags at the metadata server: what an immutable or append-only file or
    /// directory refuses (EPERM), and that the flags come off.
    #[test]
    fn reads_move_atime_as_relatime_and_strictatime_say_and_never_ctime() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let f = ops
            .create(ROOT_INO, b"f", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        let at = |t: &Attr| (t.atime, t.mtime, t.ctime);
        // A new file: atime == mtime, so the first read moves it; ctime and mtime stay.
        let first = ops.accessed(f.ino, false).unwrap();
        assert!(
            first.atime > f.atime,
            "relatime: the first read moves atime"
        );
        assert_eq!((first.mtime, first.ctime), (f.mtime, f.ctime));
        assert_eq!(at(&ops.getattr(f.ino).unwrap()), at(&first), "stored");
        // Read again before any change: relatime keeps it, strictatime moves it.
        assert_eq!(at(&ops.accessed(f.ino, false).unwrap()), at(&first));
        let strict = ops.accessed(f.ino, true).unwrap();
        assert!(
            strict.atime > first.atime,
            "strictatime moves it at every read"
        );
        assert_eq!(strict.ctime, f.ctime);
        // A change after that read: the next read moves it again.
        let set = SetAttr {
            perm: Some(0o600),
            ..Default::default()
        };
        let changed = ops.setattr(f.ino, &set).unwrap();
        let after = ops.accessed(f.ino, false).unwrap();
        assert!(after.atime >= changed.ctime && after.atime > strict.atime);
        // chattr +A (no-atime): never, not even strictly.
        let set = SetAttr {
            flags: Some(surge_proto::FL_NOATIME),
            ..Default::default()
        };
        let flagged = ops.setattr(f.ino, &set).unwrap();
        assert_eq!(at(&ops.accessed(f.ino, true).unwrap()), at(&flagged));
    }

    #[test]
    fn chattr_flags_refuse_what_linux_refuses() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let mk = |parent, name: &[u8], node: &NewNode| {
            ops.create(parent, name, node, 0o755, 1, 1).unwrap()
        };
        let flags = |ino, f| {
            let set = SetAttr {
                flags: Some(f),
                ..Default::default()
            };
            ops.setattr(ino, &set)
        };
        let keep = KeepOpen::All;
        let f = mk(ROOT_INO, b"f", &NewNode::File);
        let d = mk(ROOT_INO, b"d", &NewNode::Dir);
        mk(d.ino, b"x", &NewNode::File);
        assert_eq!(flags(f.ino, FL_IMMUTABLE).unwrap().flags, FL_IMMUTABLE);
        assert_eq!(
            code(ops.unlink(ROOT_INO, b"f", &keep)),
            ErrorCode::Permission
        );
        assert_eq!(
            code(ops.rename(ROOT_INO, b"f", ROOT_INO, b"g", 0, &keep)),
            ErrorCode::Permission
        );
        assert_eq!(code(ops.link(f.ino, ROOT_INO, b"h")), ErrorCode::Permission);
        let chmod = SetAttr {
            perm: Some(0o600),
            ..Default::default()
        };
        assert_eq!(code(ops.setattr(f.ino, &chmod)), ErrorCode::Permission);
        assert_eq!(
            code(ops.set_xattr(f.ino, b"user.a", b"1", 0)),
            ErrorCode::Permission
        );
        // Unknown flags are refused; the known ones come off.
        assert_eq!(code(flags(f.ino, 0x1000)), ErrorCode::Unsupported);
        assert_eq!(flags(f.ino, 0).unwrap().flags, 0);
        ops.unlink(ROOT_INO, b"f", &keep).unwrap();
        // An append-only directory takes names but loses none, not even by a rename over one.
        flags(d.ino, FL_APPEND).unwrap();
        mk(d.ino, b"y", &NewNode::File);
        assert_eq!(code(ops.unlink(d.ino, b"x", &keep)), ErrorCode::Permission);
        mk(ROOT_INO, b"w", &NewNode::File);
        assert_eq!(
            code(ops.rename(ROOT_INO, b"w", d.ino, b"x", 0, &keep)),
            ErrorCode::Permission,
            "a rename over a name of an append-only directory"
        );
        ops.rename(ROOT_INO, b"w", d.ino, b"w", 0, &keep).unwrap();
        // An immutable directory takes no names.
        flags(d.ino, FL_IMMUTABLE).unwrap();
        assert_eq!(
            code(ops.create(d.ino, b"z", &NewNode::File, 0o644, 1, 1)),
            ErrorCode::Permission
        );
        flags(d.ino, 0).unwrap();
        ops.unlink(d.ino, b"x", &keep).unwrap();
    }

    #[test]
    fn setgid_directory_passes_group_down() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let d = ops
            .create(ROOT_INO, b"d", &NewNode::Dir, 0o2775, 1, 50)
            .unwrap();
        let f = ops
            .create(d.ino, b"f", &NewNode::File, 0o644, 1, 7)
            .unwrap();
        let s = ops.create(d.ino, b"s", &NewNode::Dir, 0o755, 1, 7).unwrap();
        assert_eq!((f.gid, s.gid), (50, 50));
        assert_ne!(s.perm & surge_proto::S_ISGID, 0);
    }
}
