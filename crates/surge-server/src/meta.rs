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
    XATTR_ACL_KILL_SGID, XATTR_INODE_MAX, XATTR_NAME_MAX, XATTR_SIZE_MAX,
};

pub const ROOT_INO: Ino = 1;
const RENAME_NOREPLACE: u32 = 1;
pub(crate) const RENAME_EXCHANGE: u32 = 2;
pub(crate) const RENAME_WHITEOUT: u32 = 4;

pub type MetaResult<T> = Result<T, ErrorReply>;

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

fn kind_from(code: i64) -> FileKind {
    match code {
        2 => FileKind::Dir,
        3 => FileKind::Symlink,
        4 => FileKind::Fifo,
        5 => FileKind::Socket,
        6 => FileKind::CharDev,
        7 => FileKind::BlockDev,
        _ => FileKind::File,
    }
}

const ATTR_COLS: &str =
    "ino, kind, perm, nlink, uid, gid, size, atime_s, atime_ns, mtime_s, mtime_ns, \
     ctime_s, ctime_ns, change, rdev, through, stripe_size, stripe_count, stripe_start";

fn attr_from_row(r: &rusqlite::Row<'_>, base: usize) -> rusqlite::Result<Attr> {
    let ts = |i: usize| -> rusqlite::Result<Timestamp> {
        Ok(Timestamp {
            secs: r.get(base + i)?,
            nsec: r.get::<_, i64>(base + i + 1)? as u32,
        })
    };
    Ok(Attr {
        ino: r.get::<_, i64>(base)? as u64,
        kind: kind_from(r.get(base + 1)?),
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
            mtime_s, mtime_ns, ctime_s, ctime_ns, parent)
         VALUES (?1, 2, ?2, 2, ?3, ?4, 0, ?5, ?6, ?5, ?6, ?5, ?6, ?1)",
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

    /// Appends a change to the drain journal (write-behind cache namespaces). A `Data` of an
    /// inode is not repeated while an equal one is pending, not yet taken by a drain (which
    /// copies what the inode holds when it gets there) and not followed by a change that
    /// moves or removes names: a file written in many pieces is copied once, not once per
    /// piece.
    pub fn journal(&self, op: &surge_proto::DrainOp) -> MetaResult<()> {
        use surge_proto::DrainOp;
        // A file written through has its data on the PFS already: only its attributes move.
        let attr_only;
        let op = match op {
            DrainOp::Data { ino, path } if self.through_of(*ino)? != 0 => {
                attr_only = DrainOp::Attr {
                    ino: *ino,
                    path: path.clone(),
                };
                &attr_only
            }
            other => other,
        };
        let text = serde_json::to_string(op)
            .map_err(|e| err(ErrorCode::Io, format!("drain journal: {e}")))?;
        let data_ino = match op {
            DrainOp::Data { ino, .. } => Some(*ino as i64),
            _ => None,
        };
        let moves = matches!(
            op,
            DrainOp::Rename { .. }
                | DrainOp::Unlink { .. }
                | DrainOp::Rmdir { .. }
                | DrainOp::Link { .. }
                | DrainOp::Symlink { .. }
        );
        if let Some(ino) = data_ino {
            // Its data changes: the PFS copy under its fill name is old (see `clean_files`).
            self.tx
                .prepare_cached("UPDATE inodes SET clean = 0 WHERE ino = ?1 AND clean = 1")
                .and_then(|mut st| st.execute([ino]))
                .map_err(db_err)?;
            let pending: bool = self
                .tx
                .prepare_cached(
                    "SELECT EXISTS(SELECT 1 FROM drain d WHERE d.data_ino = ?1 AND d.op = ?2
                        AND d.taken = 0 AND NOT EXISTS(
                            SELECT 1 FROM drain m WHERE m.moves = 1 AND m.seq > d.seq))",
                )
                .and_then(|mut st| st.query_row(params![ino, text], |r| r.get(0)))
                .map_err(db_err)?;
            if pending {
                return Ok(());
            }
        }
        self.tx
            .prepare_cached("INSERT INTO drain(op, data_ino, moves) VALUES (?1, ?2, ?3)")
            .and_then(|mut st| st.execute(params![text, data_ino, i64::from(moves)]))
            .map_err(db_err)?;
        Ok(())
    }

    /// The `through` of `ino` (0: not written through, or no such inode).
    fn through_of(&self, ino: Ino) -> MetaResult<u64> {
        Ok(self
            .tx
            .prepare_cached("SELECT through FROM inodes WHERE ino = ?1")
            .and_then(|mut st| {
                st.query_row([ino as i64], |r| r.get::<_, i64>(0))
                    .optional()
            })
            .map_err(db_err)?
            .unwrap_or(0) as u64)
    }

    /// Marks regular file `ino` of a cache namespace as written through to the PFS from now
    /// on: journals `DrainOp::Through` and returns its sequence number (the one recorded
    /// before if the file already was).
    ///
    /// The mount that asked waits until the drain has applied every entry before the
    /// `Through`. The pending copies of the other files in `open` (files a mount has open,
    /// still being written as a rule) are moved after it, under their current names: a file
    /// being written would otherwise be copied while it is written, holding the switch for
    /// the whole copy, and copied again once complete. Their order against the other files'
    /// changes does not matter (a copy takes the file's data as the instance holds it when
    /// the drain gets there, and its current name is right after every rename before it); a
    /// file written through itself keeps its copies before its own `Through`.
    pub fn cache_through(&self, ino: Ino, open: &[Ino]) -> MetaResult<u64> {
        let a = self.getattr(ino)?;
        if a.kind != FileKind::File {
            return Err(err(
                ErrorCode::Invalid,
                format!("inode {ino} is not a regular file: only files are written through"),
            ));
        }
        if a.through == surge_proto::THROUGH_FILL {
            // Made by the lazy fill and not copied into the tier: its PFS file (under its
            // fill name) is the file from now on; nothing to drain first.
            self.set_through(ino, surge_proto::THROUGH_FILL_KEPT)?;
            return Ok(surge_proto::THROUGH_FILL_KEPT);
        }
        if a.through != 0 {
            return Ok(a.through);
        }
        let Some(path) = self.path_of(ino)? else {
            return Err(err(
                ErrorCode::NoSpace,
                format!(
                    "inode {ino} has no name (unlinked while open): it cannot be written \
                     through to the PFS, and the fast tier is full"
                ),
            ));
        };
        let postponed = self.take_pending_copies(ino, open)?;
        self.journal(&surge_proto::DrainOp::Through { ino, path })?;
        let seq = self.tx.last_insert_rowid() as u64;
        self.set_through(ino, seq)?;
        for (other, origin) in postponed {
            // No name left: its data never reaches the PFS.
            if let Some(path) = self.path_of(other)? {
                self.journal(&surge_proto::DrainOp::Data { ino: other, path })?;
                // Barriers (fsync=pfs, wait-drained) still count it where it was.
                self.tx
                    .execute(
                        "UPDATE drain SET origin = ?2
                            WHERE seq = (SELECT MAX(seq) FROM drain WHERE data_ino = ?1)",
                        params![other as i64, origin as i64],
                    )
                    .map_err(db_err)?;
            }
        }
        Ok(seq)
    }

    /// Removes the pending `Data` entries of the files in `open` but `except` that are not
    /// written through (see [`Self::cache_through`]); returns those files, each with the
    /// journal place of its oldest change removed.
    fn take_pending_copies(&self, except: Ino, open: &[Ino]) -> MetaResult<Vec<(Ino, u64)>> {
        let mut taken = Vec::new();
        for &other in open {
            if other == except || self.through_of(other)? != 0 {
                continue;
            }
            let origin: Option<i64> = self
                .tx
                .prepare_cached("SELECT MIN(COALESCE(origin, seq)) FROM drain WHERE data_ino = ?1")
                .and_then(|mut st| st.query_row([other as i64], |r| r.get(0)))
                .map_err(db_err)?;
            let Some(origin) = origin else {
                continue;
            };
            self.tx
                .prepare_cached("DELETE FROM drain WHERE data_ino = ?1")
                .and_then(|mut st| st.execute([other as i64]))
                .map_err(db_err)?;
            taken.push((other, origin as u64));
        }
        Ok(taken)
    }

    fn set_through(&self, ino: Ino, through: u64) -> MetaResult<()> {
        self.tx
            .prepare_cached("UPDATE inodes SET through = ?2 WHERE ino = ?1")
            .and_then(|mut st| st.execute(params![ino as i64, through as i64]))
            .map_err(db_err)?;
        Ok(())
    }

    /// One step of the lazy fill of cache file `ino` (see `surge_proto::FillStep`; claims
    /// are the metadata server's, in memory): returns the file's `through` after it.
    pub fn cache_fill(&self, ino: Ino, step: surge_proto::FillStep) -> MetaResult<u64> {
        use surge_proto::{FillStep, THROUGH_FILL};
        let a = self.getattr(ino)?;
        match step {
            FillStep::Mark { size, atime, mtime } => {
                if a.kind != FileKind::File || a.size != 0 || a.through != 0 {
                    return Err(err(
                        ErrorCode::Invalid,
                        format!(
                            "inode {ino}: only an empty regular file on the fast tier is marked \
                             as filled lazily from the PFS"
                        ),
                    ));
                }
                self.tx
                    .prepare_cached(
                        "UPDATE inodes SET size = ?2, atime_s = ?3, atime_ns = ?4, mtime_s = ?5,
                            mtime_ns = ?6, through = ?7 WHERE ino = ?1",
                    )
                    .and_then(|mut st| {
                        st.execute(params![
                            ino as i64,
                            size.min(i64::MAX as u64) as i64,
                            atime.secs,
                            i64::from(atime.nsec),
                            mtime.secs,
                            i64::from(mtime.nsec),
                            THROUGH_FILL as i64
                        ])
                    })
                    .map_err(db_err)?;
                Ok(THROUGH_FILL)
            }
            FillStep::Done if a.through == THROUGH_FILL => {
                // The tier holds what its fill name on the PFS holds: clean.
                self.tx
                    .prepare_cached("UPDATE inodes SET through = 0, clean = 1 WHERE ino = ?1")
                    .and_then(|mut st| st.execute([ino as i64]))
                    .map_err(db_err)?;
                Ok(0)
            }
            FillStep::Claim | FillStep::Done | FillStep::Release => Ok(a.through),
        }
    }

    /// Up to `max` journal entries after `after`, and how far the drain got.
    pub fn drain_poll(
        &self,
        after: u64,
        max: u32,
    ) -> MetaResult<(Vec<surge_proto::DrainEntry>, surge_proto::DrainProgress)> {
        let mut st = self
            .tx
            .prepare_cached("SELECT seq, op FROM drain WHERE seq > ?1 ORDER BY seq LIMIT ?2")
            .map_err(db_err)?;
        let rows = st
            .query_map(params![after as i64, i64::from(max)], |r| {
                Ok((r.get::<_, i64>(0)? as u64, r.get::<_, String>(1)?))
            })
            .map_err(db_err)?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, text) = row.map_err(db_err)?;
            let op = serde_json::from_str(&text)
                .map_err(|e| err(ErrorCode::Io, format!("drain journal entry {seq}: {e}")))?;
            out.push(surge_proto::DrainEntry { seq, op });
        }
        let (pending, oldest_entry, oldest): (i64, Option<i64>, Option<i64>) = self
            .tx
            .query_row(
                "SELECT COUNT(*), MIN(seq), MIN(COALESCE(origin, seq)) FROM drain",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .map_err(db_err)?;
        // AUTOINCREMENT: the newest sequence number ever given, also once its entry is gone.
        let newest: Option<i64> = self
            .tx
            .query_row(
                "SELECT seq FROM sqlite_sequence WHERE name = 'drain'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(db_err)?;
        // Taken: a change made from now on gets an entry of its own.
        if let Some(last) = out.last() {
            self.tx
                .execute(
                    "UPDATE drain SET taken = 1 WHERE seq > ?1 AND seq <= ?2 AND taken = 0",
                    params![after as i64, last.seq as i64],
                )
                .map_err(db_err)?;
        }
        let progress = surge_proto::DrainProgress {
            oldest: oldest.unwrap_or(0) as u64,
            newest: newest.unwrap_or(0) as u64,
            pending: pending as u64,
            oldest_entry: oldest_entry.unwrap_or(0) as u64,
        };
        Ok((out, progress))
    }

    /// Forgets the journal's entries up to `upto` (they reached the PFS). `linked`: files the
    /// drain copied among them and gave their fill name; those with no change of their data
    /// pending after `upto` are clean from now on.
    pub fn drain_ack(&self, upto: u64, linked: &[Ino]) -> MetaResult<()> {
        self.tx
            // `u64::MAX` ("everything", after a fill) must not wrap to -1.
            .execute(
                "DELETE FROM drain WHERE seq <= ?1",
                [upto.min(i64::MAX as u64) as i64],
            )
            .map_err(db_err)?;
        for ino in linked {
            self.tx
                .prepare_cached(
                    "UPDATE inodes SET clean = 1 WHERE ino = ?1 AND through = 0 AND kind = 1
                        AND NOT EXISTS(SELECT 1 FROM drain WHERE data_ino = ?1)",
                )
                .and_then(|mut st| st.execute([*ino as i64]))
                .map_err(db_err)?;
        }
        Ok(())
    }

    /// Records the drainer that holds the journal (`Some((session, wall-clock ms))`) or that
    /// none does, so that a restarted server keeps the hold until it lapses.
    pub fn set_drain_hold(&self, hold: Option<(u32, u64)>) -> MetaResult<()> {
        match hold {
            Some((session, at_ms)) => self.tx.execute(
                "INSERT INTO drain_hold(one, session, at_ms) VALUES (0, ?1, ?2)
                    ON CONFLICT(one) DO UPDATE SET session = ?1, at_ms = ?2",
                params![i64::from(session), at_ms.min(i64::MAX as u64) as i64],
            ),
            None => self.tx.execute("DELETE FROM drain_hold", []),
        }
        .map_err(db_err)?;
        Ok(())
    }

    /// The hold [`Self::set_drain_hold`] recorded last, if any.
    pub fn drain_hold(&self) -> MetaResult<Option<(u32, u64)>> {
        self.tx
            .query_row("SELECT session, at_ms FROM drain_hold", [], |r| {
                Ok((r.get::<_, i64>(0)? as u32, r.get::<_, i64>(1)? as u64))
            })
            .optional()
            .map_err(db_err)
    }

    /// Cache namespaces: the regular files eviction may take, but `except`: clean (the PFS
    /// holds their data under their fill name, `cache_through_path(root, ino, THROUGH_FILL)`:
    /// the lazy fill's link, or the drain's of its last copy, and no change of their data is
    /// journaled since), on the fast tier (`through` 0), with a name and data. (ino, size).
    pub fn clean_files(&self, except: Ino) -> MetaResult<Vec<(Ino, u64)>> {
        let mut st = self
            .tx
            .prepare_cached(
                "SELECT ino, size FROM inodes i WHERE clean = 1 AND through = 0 AND kind = 1
                    AND nlink > 0 AND size > 0 AND ino != ?1
                    AND NOT EXISTS(SELECT 1 FROM drain d WHERE d.data_ino = i.ino)",
            )
            .map_err(db_err)?;
        let rows = st
            .query_map([except as i64], |r| {
                Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))
            })
            .map_err(db_err)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db_err)
    }

    /// Evicts clean file `ino` (see [`clean_files`](Self::clean_files)): its reads go to its
    /// fill name on the PFS again, as for a file of the lazy fill. The caller removes its
    /// objects. Returns its attributes after.
    pub fn evict(&self, ino: Ino) -> MetaResult<Attr> {
        self.set_through(ino, surge_proto::THROUGH_FILL)?;
        self.getattr(ino)
    }

    /// Cache namespaces: with `list`, the files with a change of their data journaled and not
    /// yet on the PFS, (ino, size); and the oldest change pending (as `DrainProgress::oldest`;
    /// 0: none).
    pub fn dirty_files(&self, list: bool) -> MetaResult<(Vec<(Ino, u64)>, u64)> {
        let oldest: Option<i64> = self
            .tx
            .query_row("SELECT MIN(COALESCE(origin, seq)) FROM drain", [], |r| {
                r.get(0)
            })
            .map_err(db_err)?;
        let oldest = oldest.unwrap_or(0) as u64;
        if !list {
            return Ok((Vec::new(), oldest));
        }
        let mut st = self
            .tx
            .prepare_cached(
                "SELECT ino, size FROM inodes WHERE ino IN
                    (SELECT data_ino FROM drain WHERE data_ino IS NOT NULL)",
            )
            .map_err(db_err)?;
        let files = st
            .query_map([], |r| {
                Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))
            })
            .map_err(db_err)?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(db_err)?;
        Ok((files, oldest))
    }

    /// Refuses a change of the data of `a` while it is [`THROUGH_FILL`](surge_proto::THROUGH_FILL)
    /// (evicted, or never copied in): a mount changes such a file only after copying it into
    /// the tier (`FillStep::Done`). Reached only when a file was evicted under a mount whose
    /// open the metadata server did not know (see `surge_proto::CACHE_OPEN_TTL`).
    fn check_not_evicted(a: &Attr, what: &str) -> MetaResult<()> {
        if a.through == surge_proto::THROUGH_FILL {
            return Err(err(
                ErrorCode::Stale,
                format!(
                    "{what} of inode {}: the file was evicted from the fast tier (its data is on \
                     the PFS); open it again",
                    a.ino
                ),
            ));
        }
        Ok(())
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

    pub(crate) fn dentry(&self, parent: Ino, name: &[u8]) -> MetaResult<Option<(Ino, FileKind)>> {
        let mut st = self
            .tx
            .prepare_cached("SELECT ino, kind FROM dentries WHERE parent = ?1 AND name = ?2")
            .map_err(db_err)?;
        st.query_row(params![parent as i64, name], |r| {
            Ok((r.get::<_, i64>(0)? as u64, kind_from(r.get(1)?)))
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

    /// The default ACL of directory `dir`, if it has one.
    fn default_acl(&self, dir: Ino) -> MetaResult<Option<Acl>> {
        self.stored_acl(dir, acl::DEFAULT)
    }

    /// The ACL stored as attribute `name` of `ino` (`None`: none, or only the mode).
    fn stored_acl(&self, ino: Ino, name: &[u8]) -> MetaResult<Option<Acl>> {
        let value: Option<Vec<u8>> = self
            .tx
            .prepare_cached("SELECT value FROM xattrs WHERE ino = ?1 AND name = ?2")
            .and_then(|mut st| {
                st.query_row(params![ino as i64, name], |r| r.get(0))
                    .optional()
            })
            .map_err(db_err)?;
        value
            .map(|v| {
                Acl::decode(&v).map_err(|e| {
                    err(
                        ErrorCode::Io,
                        format!(
                            "inode {ino}: stored {} unreadable: {}",
                            String::from_utf8_lossy(name),
                            e.message
                        ),
                    )
                })
            })
            .transpose()
    }

    /// Stores `value` as attribute `name` of `ino`, with no checks (the ACLs the store
    /// derives itself).
    fn put_xattr(&self, ino: Ino, name: &[u8], value: &[u8]) -> MetaResult<()> {
        // An upsert, not INSERT OR REPLACE: a replace's delete would not fire the delete
        // trigger that keeps `xattr_bytes`.
        self.tx
            .prepare_cached(
                "INSERT INTO xattrs(ino, name, value) VALUES (?1, ?2, ?3)
                 ON CONFLICT(ino, name) DO UPDATE SET value = excluded.value",
            )
            .and_then(|mut st| st.execute(params![ino as i64, name, value]))
            .map_err(db_err)?;
        Ok(())
    }

    /// Removes attribute `name` of `ino`; true when it was there.
    fn drop_xattr(&self, ino: Ino, name: &[u8]) -> MetaResult<bool> {
        self.tx
            .prepare_cached("DELETE FROM xattrs WHERE ino = ?1 AND name = ?2")
            .and_then(|mut st| st.execute(params![ino as i64, name]))
            .map(|n| n > 0)
            .map_err(db_err)
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
                    stripe_size, stripe_count, stripe_start, unnamed)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?7, ?8, ?7, ?8, ?9, ?10, ?11, ?12,
                    ?13, ?14, ?15, ?16)",
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
        self.dir(new_parent)?;
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
    fn is_unnamed(&self, ino: Ino) -> MetaResult<bool> {
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
                 RETURNING nlink, kind, size",
            )
            .and_then(|mut st| {
                st.query_row(params![ino as i64, now.secs, i64::from(now.nsec)], |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        kind_from(r.get(1)?),
                        r.get::<_, i64>(2)? as u64,
                    ))
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

    /// The value of extended attribute `name` of `ino`.
    pub fn get_xattr(&self, ino: Ino, name: &[u8]) -> MetaResult<Vec<u8>> {
        self.getattr(ino)?;
        self.tx
            .prepare_cached("SELECT value FROM xattrs WHERE ino = ?1 AND name = ?2")
            .and_then(|mut st| {
                st.query_row(params![ino as i64, name], |r| r.get(0))
                    .optional()
            })
            .map_err(db_err)?
            .ok_or_else(|| no_xattr(ino, name))
    }

    /// The names of `ino`'s extended attributes.
    pub fn list_xattr(&self, ino: Ino) -> MetaResult<Vec<Vec<u8>>> {
        self.getattr(ino)?;
        let mut st = self
            .tx
            .prepare_cached("SELECT name FROM xattrs WHERE ino = ?1 ORDER BY name")
            .map_err(db_err)?;
        let rows = st.query_map([ino as i64], |r| r.get(0)).map_err(db_err)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db_err)
    }

    /// Sets extended attribute `name` of `ino` (see [`surge_proto::Request::SetXattr`]).
    pub fn set_xattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: u32) -> MetaResult<Attr> {
        check_xattr_name(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(err(
                ErrorCode::TooLarge,
                format!(
                    "extended attribute value of {} bytes exceeds {XATTR_SIZE_MAX}",
                    value.len()
                ),
            ));
        }
        let a = self.getattr(ino)?;
        if name == acl::ACCESS || name == acl::DEFAULT {
            return self.set_acl(&a, name, value, flags);
        }
        let old = self.xattr_len(ino, name)?;
        match (old.is_some(), flags & (XATTR_CREATE | XATTR_REPLACE)) {
            (true, XATTR_CREATE) => {
                return Err(err(
                    ErrorCode::Exists,
                    format!(
                        "extended attribute {} exists",
                        String::from_utf8_lossy(name)
                    ),
                ))
            }
            (false, XATTR_REPLACE) => return Err(no_xattr(ino, name)),
            _ => {}
        }
        self.check_room(ino, name, old, value.len())?;
        self.put_xattr(ino, name, value)?;
        self.touch_ctime(ino)
    }

    /// Refuses (`NoSpace`) a value of `len` bytes for attribute `name` of `ino` (whose value
    /// now takes `old` bytes, if it has one) that would take its attributes past
    /// [`XATTR_INODE_MAX`].
    fn check_room(&self, ino: Ino, name: &[u8], old: Option<i64>, len: usize) -> MetaResult<()> {
        let used: i64 = self
            .tx
            .prepare_cached(
                "SELECT COALESCE(SUM(length(name) + length(value)), 0) FROM xattrs WHERE ino = ?1",
            )
            .and_then(|mut st| st.query_row([ino as i64], |r| r.get(0)))
            .map_err(db_err)?;
        let after = used - old.map_or(0, |v| v + name.len() as i64) + (name.len() + len) as i64;
        if after > XATTR_INODE_MAX as i64 {
            return Err(err(
                ErrorCode::NoSpace,
                format!("extended attributes of inode {ino} would take {after} bytes (at most {XATTR_INODE_MAX})"),
            ));
        }
        Ok(())
    }

    /// The length of the value of attribute `name` of `ino`, if it has one.
    fn xattr_len(&self, ino: Ino, name: &[u8]) -> MetaResult<Option<i64>> {
        self.tx
            .prepare_cached("SELECT length(value) FROM xattrs WHERE ino = ?1 AND name = ?2")
            .and_then(|mut st| {
                st.query_row(params![ino as i64, name], |r| r.get(0))
                    .optional()
            })
            .map_err(db_err)
    }

    /// Stores an ACL the caller set (within the inode's room for attributes).
    fn put_acl(&self, ino: Ino, name: &[u8], acl: &Acl) -> MetaResult<()> {
        let value = acl.encode();
        let old = self.xattr_len(ino, name)?;
        self.check_room(ino, name, old, value.len())?;
        self.put_xattr(ino, name, &value)
    }

    /// Sets the access or default ACL of `a` (the kernel checked that the caller owns the
    /// node). An access ACL sets the mode's permission bits and is kept only when the mode
    /// cannot say it (named entries); `flags` may ask to clear setgid too.
    fn set_acl(&self, a: &Attr, name: &[u8], value: &[u8], flags: u32) -> MetaResult<Attr> {
        let acl = Acl::decode(value)?;
        if name == acl::DEFAULT {
            if a.kind != FileKind::Dir {
                return Err(err(
                    ErrorCode::Permission,
                    "only a directory has a default ACL",
                ));
            }
            self.put_acl(a.ino, name, &acl)?;
            return self.touch_ctime(a.ino);
        }
        let mut perm = acl.apply_to_mode(a.perm);
        if flags & XATTR_ACL_KILL_SGID != 0 {
            perm &= !surge_proto::S_ISGID;
        }
        if acl.is_mode() {
            self.drop_xattr(a.ino, name)?;
        } else {
            self.put_acl(a.ino, name, &acl)?;
        }
        self.set_perm(a.ino, perm)?;
        self.touch_ctime(a.ino)
    }

    /// The bytes every extended attribute of the namespace takes (names and values).
    pub fn xattr_bytes(&self) -> MetaResult<u64> {
        self.tx
            .prepare_cached("SELECT bytes FROM xattr_bytes")
            .and_then(|mut st| st.query_row([], |r| r.get::<_, i64>(0)))
            .map(|b| b.max(0) as u64)
            .map_err(db_err)
    }

    /// Removes extended attribute `name` of `ino`.
    /// Removing an ACL the node does not have is no error: one equivalent to the mode is
    /// kept as just the mode, and the kernel removes ACLs without asking first.
    pub fn remove_xattr(&self, ino: Ino, name: &[u8]) -> MetaResult<Attr> {
        self.getattr(ino)?;
        let acl = name == acl::ACCESS || name == acl::DEFAULT;
        if !self.drop_xattr(ino, name)? && !acl {
            return Err(no_xattr(ino, name));
        }
        self.touch_ctime(ino)
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
        self.dir(parent)?;
        let (ino, kind) = self.dentry(parent, name)?.ok_or_else(|| {
            err(
                ErrorCode::NotFound,
                format!("{} not found", String::from_utf8_lossy(name)),
            )
        })?;
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
                    .map(|c| BatchDone::Created {
                        change: c.parent.change,
                    }),
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
        self.dir(parent)?;
        let (ino, kind) = self.dentry(parent, name)?.ok_or_else(|| {
            err(
                ErrorCode::NotFound,
                format!("{} not found", String::from_utf8_lossy(name)),
            )
        })?;
        if kind != FileKind::Dir {
            return Err(err(
                ErrorCode::NotDir,
                format!("{} is not a directory", String::from_utf8_lossy(name)),
            ));
        }
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

    fn parent_of_dir(&self, ino: Ino) -> MetaResult<Ino> {
        self.tx
            .prepare_cached("SELECT parent FROM inodes WHERE ino = ?1")
            .and_then(|mut st| st.query_row([ino as i64], |r| r.get::<_, i64>(0)))
            .map(|p| p as u64)
            .map_err(db_err)
    }

    /// True if `dir` is `ancestor` or lies below it.
    fn is_within(&self, mut dir: Ino, ancestor: Ino) -> MetaResult<bool> {
        for _ in 0..100_000 {
            if dir == ancestor {
                return Ok(true);
            }
            if dir == ROOT_INO {
                return Ok(false);
            }
            dir = self.parent_of_dir(dir)?;
        }
        Err(err(ErrorCode::Loop, "directory tree too deep or cyclic"))
    }

    pub fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: u32,
        keep: &KeepOpen,
    ) -> MetaResult<Option<Unlinked>> {
        if flags == RENAME_EXCHANGE {
            return self
                .exchange(parent, name, new_parent, new_name)
                .map(|()| None);
        }
        if flags & !(RENAME_NOREPLACE | RENAME_WHITEOUT) != 0 {
            return Err(err(
                ErrorCode::Invalid,
                format!("unknown rename flags {flags:#x}"),
            ));
        }
        check_name(new_name)?;
        self.dir(parent)?;
        self.dir(new_parent)?;
        let (ino, kind) = self.dentry(parent, name)?.ok_or_else(|| {
            err(
                ErrorCode::NotFound,
                format!("{} not found", String::from_utf8_lossy(name)),
            )
        })?;
        if kind == FileKind::Dir && new_parent != parent && self.is_within(new_parent, ino)? {
            return Err(err(
                ErrorCode::Invalid,
                "cannot move a directory into itself or below itself",
            ));
        }
        let now = Timestamp::now();
        let mut replaced = None;
        if let Some((dst, dst_kind)) = self.dentry(new_parent, new_name)? {
            if flags & RENAME_NOREPLACE != 0 {
                return Err(err(
                    ErrorCode::Exists,
                    format!("{} exists", String::from_utf8_lossy(new_name)),
                ));
            }
            if dst == ino {
                // Two names of one inode: POSIX says do nothing.
                return Ok(None);
            }
            match (kind == FileKind::Dir, dst_kind == FileKind::Dir) {
                (true, false) => {
                    return Err(err(
                        ErrorCode::NotDir,
                        format!("{} is not a directory", String::from_utf8_lossy(new_name)),
                    ))
                }
                (false, true) => {
                    return Err(err(
                        ErrorCode::IsDir,
                        format!("{} is a directory", String::from_utf8_lossy(new_name)),
                    ))
                }
                (true, true) => {
                    if self.has_children(dst)? {
                        return Err(err(
                            ErrorCode::NotEmpty,
                            format!("{} is not empty", String::from_utf8_lossy(new_name)),
                        ));
                    }
                    self.remove_dentry(new_parent, new_name)?;
                    self.delete_inode(dst)?;
                    self.touch_dir(new_parent, -1, now)?;
                }
                (false, false) => {
                    self.remove_dentry(new_parent, new_name)?;
                    replaced = Some(self.drop_link(dst, now, keep)?);
                }
            }
        }
        self.tx
            .prepare_cached(
                "UPDATE dentries SET parent = ?3, name = ?4 WHERE parent = ?1 AND name = ?2",
            )
            .and_then(|mut st| {
                st.execute(params![parent as i64, name, new_parent as i64, new_name])
            })
            .map_err(db_err)?;
        let moved_dir = kind == FileKind::Dir && new_parent != parent;
        self.renamed(ino, new_parent, now)?;
        self.touch_dir(parent, if moved_dir { -1 } else { 0 }, now)?;
        if new_parent != parent {
            self.touch_dir(new_parent, if moved_dir { 1 } else { 0 }, now)?;
        }
        if flags & RENAME_WHITEOUT != 0 {
            self.whiteout(parent, name, now)?;
        }
        Ok(replaced)
    }

    /// The whiteout `RENAME_WHITEOUT` leaves at the old name: a character device 0/0 with no
    /// permission bits (the kernel's `WHITEOUT_DEV` and `WHITEOUT_MODE`), owned by root (the
    /// kernel allows the flag only to a caller with `CAP_MKNOD`; the request does not carry
    /// the caller's ids).
    fn whiteout(&self, parent: Ino, name: &[u8], now: Timestamp) -> MetaResult<()> {
        let node = NewNode::Special {
            kind: FileKind::CharDev,
            rdev: 0,
        };
        self.make_node(
            parent,
            Some(name),
            &node,
            (0, 0, 0),
            0,
            None,
            now,
            FileLayout::default(),
        )?;
        Ok(())
    }

    /// `renameat2(RENAME_EXCHANGE)`: the two names swap their inodes atomically (both must
    /// exist; either may be a directory, which then changes parent unless it would end up
    /// below itself).
    fn exchange(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
    ) -> MetaResult<()> {
        self.dir(parent)?;
        self.dir(new_parent)?;
        let named = |p: Ino, n: &[u8]| {
            self.dentry(p, n)?.ok_or_else(|| {
                err(
                    ErrorCode::NotFound,
                    format!("{} not found", String::from_utf8_lossy(n)),
                )
            })
        };
        let (a, a_kind) = named(parent, name)?;
        let (b, b_kind) = named(new_parent, new_name)?;
        if a == b {
            return Ok(());
        }
        let (a_dir, b_dir) = (a_kind == FileKind::Dir, b_kind == FileKind::Dir);
        if new_parent != parent
            && ((a_dir && self.is_within(new_parent, a)?)
                || (b_dir && self.is_within(parent, b)?))
        {
            return Err(err(
                ErrorCode::Invalid,
                "cannot move a directory into itself or below itself",
            ));
        }
        let set = |p: Ino, n: &[u8], ino: Ino, kind: FileKind| {
            self.tx
                .prepare_cached(
                    "UPDATE dentries SET ino = ?3, kind = ?4 WHERE parent = ?1 AND name = ?2",
                )
                .and_then(|mut st| st.execute(params![p as i64, n, ino as i64, kind_code(kind)]))
                .map_err(db_err)
        };
        set(parent, name, b, b_kind)?;
        set(new_parent, new_name, a, a_kind)?;
        let now = Timestamp::now();
        for (ino, to) in [(a, new_parent), (b, parent)] {
            self.renamed(ino, to, now)?;
        }
        // A directory that changes parent takes its ".." link along.
        let moved = |d: bool| if d && new_parent != parent { 1 } else { 0 };
        let delta = moved(b_dir) - moved(a_dir);
        self.touch_dir(parent, delta, now)?;
        if new_parent != parent {
            self.touch_dir(new_parent, -delta, now)?;
        }
        Ok(())
    }

    /// `ino` got a new name in `to`: its ctime moves to `now`, and a directory's parent is
    /// `to` from now on.
    fn renamed(&self, ino: Ino, to: Ino, now: Timestamp) -> MetaResult<()> {
        self.tx
            .prepare_cached(
                "UPDATE inodes SET ctime_s = ?2, ctime_ns = ?3,
                    parent = CASE WHEN kind = 2 THEN ?4 ELSE parent END WHERE ino = ?1",
            )
            .and_then(|mut st| {
                st.execute(params![
                    ino as i64,
                    now.secs,
                    i64::from(now.nsec),
                    to as i64
                ])
            })
            .map_err(db_err)?;
        Ok(())
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
    ) -> MetaResult<(Vec<DirEntry>, bool)> {
        self.dir(ino)?;
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
                    kind: kind_from(r.get(3)?),
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
        Ok((entries, done))
    }

    pub fn setattr(&self, ino: Ino, set: &SetAttr) -> MetaResult<Attr> {
        let mut a = self.getattr(ino)?;
        let now = Timestamp::now();
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
                 atime_ns = ?7, mtime_s = ?8, mtime_ns = ?9, ctime_s = ?10, ctime_ns = ?11
                 WHERE ino = ?1",
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
                    i64::from(a.ctime.nsec)
                ])
            })
            .map_err(db_err)?;
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
        self.getattr(ino)
    }

    /// `O_APPEND`: reserves `len` bytes at the end of file `ino` (its size grows by `len`, its
    /// mtime and ctime move); returns where they start and the attributes after. One
    /// transaction, so two nodes appending at once get ranges that do not overlap.
    pub fn append(&self, ino: Ino, len: u64) -> MetaResult<(u64, Attr)> {
        let a = self.getattr(ino)?;
        if a.kind != FileKind::File {
            return Err(err(
                ErrorCode::Invalid,
                format!("inode {ino} is a {:?}, not a file", a.kind),
            ));
        }
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

    fn store() -> (tempfile::TempDir, Connection) {
        let t = tempfile::tempdir().unwrap();
        let c = open(&t.path().join("m.db"), 1000, 1000, 0o755).unwrap();
        (t, c)
    }

    fn code<T: std::fmt::Debug>(r: MetaResult<T>) -> ErrorCode {
        r.unwrap_err().code
    }

    #[test]
    fn a_switch_to_writing_through_moves_the_copies_of_open_files_after_it() {
        use surge_proto::DrainOp;
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let mut inos = Vec::new();
        for name in [&b"a"[..], b"b", b"c"] {
            let f = ops
                .create(ROOT_INO, name, &NewNode::File, 0o644, 1, 1)
                .unwrap();
            ops.journal(&DrainOp::Create {
                path: name.to_vec(),
            })
            .unwrap();
            ops.journal(&DrainOp::Data {
                ino: f.ino,
                path: name.to_vec(),
            })
            .unwrap();
            inos.push(f.ino);
        }
        let (a, b, c_) = (inos[0], inos[1], inos[2]);
        // `a` is renamed after its copy was journaled; `c` is written through already.
        ops.rename(ROOT_INO, b"a", ROOT_INO, b"a2", 0, &KeepOpen::All)
            .unwrap();
        ops.journal(&DrainOp::Rename {
            from: b"a".to_vec(),
            to: b"a2".to_vec(),
            gone: None,
        })
        .unwrap();
        let c_seq = ops.cache_through(c_, &[]).unwrap();
        // `b` switches while `a` and `c` are open (and `b` itself, which keeps its copy).
        let seq = ops.cache_through(b, &[a, b, c_]).unwrap();
        assert!(seq > c_seq);
        // A later commit of `a` is not journaled twice.
        ops.journal(&DrainOp::Data {
            ino: a,
            path: b"a2".to_vec(),
        })
        .unwrap();
        assert_eq!(ops.drain_poll(0, 0).unwrap().1.pending, 9);
        let (entries, _) = ops.drain_poll(0, 100).unwrap();
        let ops_of: Vec<String> = entries
            .iter()
            .map(|e| match &e.op {
                DrainOp::Create { path } => format!("create {}", String::from_utf8_lossy(path)),
                DrainOp::Data { ino, path } => {
                    format!("data {ino} {}", String::from_utf8_lossy(path))
                }
                DrainOp::Rename { from, to, .. } => format!(
                    "rename {} {}",
                    String::from_utf8_lossy(from),
                    String::from_utf8_lossy(to)
                ),
                DrainOp::Through { ino, .. } => format!("through {ino}"),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            ops_of,
            vec![
                "create a".to_string(),
                "create b".into(),
                format!("data {b} b"),
                "create c".into(),
                format!("data {c_} c"),
                "rename a a2".into(),
                format!("through {c_}"),
                format!("through {b}"),
                format!("data {a} a2"),
            ]
        );
        assert_eq!(entries[7].seq, seq);
        // Applied up to the `Through`: a switch waits no longer, a barrier still waits for
        // `a`'s copy, journaled (entry 2) before the switch.
        ops.drain_ack(seq, &[]).unwrap();
        let (_, p) = ops.drain_poll(0, 0).unwrap();
        assert!(p.applied_upto(seq) && !p.drained_upto(seq), "{p:?}");
        assert_eq!(
            (p.oldest, p.oldest_entry),
            (entries[0].seq + 1, entries[8].seq)
        );
        // A file with no name left has nothing to copy.
        ops.unlink(ROOT_INO, b"a2", &KeepOpen::All).unwrap();
        let d = ops
            .create(ROOT_INO, b"d", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        ops.cache_through(d.ino, &[a]).unwrap();
        let (entries, _) = ops.drain_poll(0, 100).unwrap();
        assert!(
            !entries
                .iter()
                .any(|e| matches!(e.op, DrainOp::Data { ino, .. } if ino == a)),
            "{entries:?}"
        );
    }

    #[test]
    fn drain_ack_of_everything_empties_the_journal() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        for name in [&b"a"[..], b"b"] {
            ops.journal(&surge_proto::DrainOp::Create {
                path: name.to_vec(),
            })
            .unwrap();
        }
        let (_, p) = ops.drain_poll(0, 0).unwrap();
        assert_eq!((p.pending, p.oldest, p.newest), (2, 1, 2));
        ops.drain_ack(u64::MAX, &[]).unwrap();
        let (_, p) = ops.drain_poll(0, 0).unwrap();
        assert_eq!((p.pending, p.oldest, p.newest), (0, 0, 2));
        assert!(p.drained_upto(2));
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
        let (entries, _) = ops.readdir(ROOT_INO, 0, 100, true).unwrap();
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

    /// `u::rw-, u:1001:r--, g::r--, m::r--, o::---` in the kernel's format.
    fn named_acl() -> Vec<u8> {
        let e = |tag: u16, perm: u16, id: u32| {
            [
                &tag.to_le_bytes()[..],
                &perm.to_le_bytes(),
                &id.to_le_bytes(),
            ]
            .concat()
        };
        [
            2u32.to_le_bytes().to_vec(),
            e(0x01, 6, u32::MAX),
            e(0x02, 4, 1001),
            e(0x04, 4, u32::MAX),
            e(0x10, 4, u32::MAX),
            e(0x20, 0, u32::MAX),
        ]
        .concat()
    }

    #[test]
    fn an_access_acl_sets_the_mode_and_chmod_sets_its_mask() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let f = ops
            .create(ROOT_INO, b"f", &NewNode::File, 0o2600, 1, 1)
            .unwrap();
        assert_eq!(
            code(ops.set_xattr(f.ino, acl::ACCESS, &named_acl()[..9], 0)),
            ErrorCode::Invalid
        );
        // The mode's group bits are the mask's; setgid stays unless asked to go.
        let a = ops.set_xattr(f.ino, acl::ACCESS, &named_acl(), 0).unwrap();
        assert_eq!(a.perm, 0o2640);
        assert_eq!(ops.get_xattr(f.ino, acl::ACCESS).unwrap(), named_acl());
        let a = ops
            .set_xattr(f.ino, acl::ACCESS, &named_acl(), XATTR_ACL_KILL_SGID)
            .unwrap();
        assert_eq!(a.perm, 0o640);
        // chmod moves the mask, not the owning group's entry, and keeps the named one.
        ops.setattr(
            f.ino,
            &SetAttr {
                perm: Some(0o600),
                ..Default::default()
            },
        )
        .unwrap();
        let after = Acl::decode(&ops.get_xattr(f.ino, acl::ACCESS).unwrap()).unwrap();
        let perms: Vec<_> = after.entries().iter().map(|e| e.perm).collect();
        assert_eq!(perms, [6, 4, 4, 0, 0]);
        // An ACL the mode says whole is kept as the mode: nothing to read back.
        let plain = Acl::from_mode(0o751).encode();
        assert_eq!(
            ops.set_xattr(f.ino, acl::ACCESS, &plain, 0).unwrap().perm,
            0o751
        );
        assert_eq!(code(ops.get_xattr(f.ino, acl::ACCESS)), ErrorCode::NoData);
        // Removing an ACL that is not there is no error (setfacl -b).
        ops.remove_xattr(f.ino, acl::ACCESS).unwrap();
        ops.remove_xattr(f.ino, acl::DEFAULT).unwrap();
        // Only directories have a default ACL.
        assert_eq!(
            code(ops.set_xattr(f.ino, acl::DEFAULT, &named_acl(), 0)),
            ErrorCode::Permission
        );
    }

    #[test]
    fn a_default_acl_is_inherited_in_place_of_the_umask() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let d = ops
            .create(ROOT_INO, b"d", &NewNode::Dir, 0o755, 1, 1)
            .unwrap();
        let make = |parent: Ino, name: &[u8], node: NewNode, perm: u16| {
            ops.create_with_layout(
                parent,
                name,
                &node,
                (perm, 1, 1),
                0o077,
                FileLayout::default(),
            )
            .unwrap()
        };
        // No default ACL: the umask applies, nothing is inherited.
        let plain = make(d.ino, b"plain", NewNode::File, 0o666);
        assert_eq!((plain.attr.perm, plain.inherited), (0o600, false));
        ops.set_xattr(d.ino, acl::DEFAULT, &named_acl(), 0).unwrap();
        // A file: the default masked by the create mode 0666, not by the umask.
        let f = make(d.ino, b"f", NewNode::File, 0o666);
        assert!(f.inherited);
        assert_eq!(f.attr.perm, 0o640);
        let access = Acl::decode(&ops.get_xattr(f.attr.ino, acl::ACCESS).unwrap()).unwrap();
        assert_eq!(access, Acl::decode(&named_acl()).unwrap());
        assert_eq!(
            code(ops.get_xattr(f.attr.ino, acl::DEFAULT)),
            ErrorCode::NoData
        );
        // A directory: both ACLs, so its own children inherit too.
        let sub = make(d.ino, b"sub", NewNode::Dir, 0o777);
        assert_eq!(sub.attr.perm, 0o640);
        assert_eq!(
            ops.get_xattr(sub.attr.ino, acl::DEFAULT).unwrap(),
            named_acl()
        );
        let deeper = make(sub.attr.ino, b"deeper", NewNode::File, 0o600);
        assert!(deeper.inherited);
        assert_eq!(deeper.attr.perm, 0o600);
        // A symlink takes nothing.
        let l = make(
            d.ino,
            b"l",
            NewNode::Symlink {
                target: b"f".to_vec(),
            },
            0o777,
        );
        assert!(!l.inherited);
        assert_eq!(
            code(ops.get_xattr(l.attr.ino, acl::ACCESS)),
            ErrorCode::NoData
        );
        // Inherited ACLs count with the other attributes.
        assert!(ops.xattr_bytes().unwrap() >= 4 * named_acl().len() as u64);
    }

    #[test]
    fn extended_attributes_follow_setxattr_rules_and_go_with_the_inode() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let f = ops
            .create(ROOT_INO, b"f", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        assert_eq!(code(ops.get_xattr(f.ino, b"user.a")), ErrorCode::NoData);
        ops.set_xattr(f.ino, b"user.a", b"1", 0).unwrap();
        assert_eq!(
            code(ops.set_xattr(f.ino, b"user.a", b"2", XATTR_CREATE)),
            ErrorCode::Exists
        );
        assert_eq!(
            code(ops.set_xattr(f.ino, b"user.b", b"2", XATTR_REPLACE)),
            ErrorCode::NoData
        );
        ops.set_xattr(f.ino, b"user.a", b"22", XATTR_REPLACE)
            .unwrap();
        assert_eq!(ops.get_xattr(f.ino, b"user.a").unwrap(), b"22");
        // The per-inode bound counts names and values; replacing a value frees the old one.
        let v = vec![0u8; XATTR_SIZE_MAX];
        for i in 0..3 {
            ops.set_xattr(f.ino, format!("user.v{i}").as_bytes(), &v, 0)
                .unwrap();
        }
        assert_eq!(
            code(ops.set_xattr(f.ino, b"user.v3", &v, 0)),
            ErrorCode::NoSpace
        );
        ops.set_xattr(f.ino, b"user.v2", &v, 0).unwrap();
        assert_eq!(
            code(ops.set_xattr(f.ino, b"user.x", &vec![0u8; XATTR_SIZE_MAX + 1], 0)),
            ErrorCode::TooLarge
        );
        assert_eq!(
            ops.list_xattr(f.ino).unwrap(),
            vec![
                b"user.a".to_vec(),
                b"user.v0".to_vec(),
                b"user.v1".to_vec(),
                b"user.v2".to_vec()
            ]
        );
        ops.remove_xattr(f.ino, b"user.a").unwrap();
        assert_eq!(code(ops.remove_xattr(f.ino, b"user.a")), ErrorCode::NoData);
        // The last name goes and the inode is forgotten: so are its attributes.
        ops.unlink(ROOT_INO, b"f", &KeepOpen::Only(vec![])).unwrap();
        let left: i64 = c
            .query_row("SELECT COUNT(*) FROM xattrs", [], |r| r.get(0))
            .unwrap();
        assert_eq!(left, 0);
        assert_eq!(code(ops.get_xattr(f.ino, b"user.v0")), ErrorCode::NotFound);
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

    /// Cache namespaces: a file is clean (eviction may take it) once its copy into the tier
    /// from the PFS is done, or once the drain linked its copy with nothing pending after it;
    /// any journaled change of its data makes it dirty; an evicted file refuses changes of
    /// its data until copied in again.
    #[test]
    fn clean_files_are_those_whose_pfs_copy_is_current() {
        use surge_proto::{DrainOp, FillStep, THROUGH_FILL};
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let t = Timestamp::now();
        let filled = ops
            .create(ROOT_INO, b"filled", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        let mark = FillStep::Mark {
            size: 10,
            atime: t,
            mtime: t,
        };
        ops.cache_fill(filled.ino, mark).unwrap();
        assert!(
            ops.clean_files(0).unwrap().is_empty(),
            "not in the tier yet"
        );
        ops.cache_fill(filled.ino, FillStep::Done).unwrap();
        assert_eq!(ops.clean_files(0).unwrap(), vec![(filled.ino, 10)]);
        assert!(
            ops.clean_files(filled.ino).unwrap().is_empty(),
            "the asker's own"
        );

        let written = ops
            .create(ROOT_INO, b"written", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        ops.commit_write(written.ino, 5, TimeSet::Now).unwrap();
        let data = |ino| DrainOp::Data {
            ino,
            path: b"x".to_vec(),
        };
        ops.journal(&data(written.ino)).unwrap();
        let (entries, _) = ops.drain_poll(0, 100).unwrap();
        let upto = entries.last().unwrap().seq;
        // Changed again while the drain copied it: still dirty after the acknowledgement.
        ops.journal(&data(written.ino)).unwrap();
        ops.drain_ack(upto, &[written.ino]).unwrap();
        assert_eq!(ops.clean_files(0).unwrap().len(), 1);
        ops.drain_ack(u64::MAX, &[written.ino]).unwrap();
        assert_eq!(ops.clean_files(0).unwrap().len(), 2);
        // A change of its data makes it dirty again.
        ops.journal(&data(filled.ino)).unwrap();
        assert_eq!(ops.clean_files(0).unwrap(), vec![(written.ino, 5)]);

        let a = ops.evict(written.ino).unwrap();
        assert_eq!(a.through, THROUGH_FILL);
        assert!(ops.clean_files(0).unwrap().is_empty());
        assert_eq!(
            code(ops.commit_write(written.ino, 9, TimeSet::Now)),
            ErrorCode::Stale
        );
        let truncate = SetAttr {
            size: Some(1),
            ..Default::default()
        };
        assert_eq!(code(ops.setattr(written.ino, &truncate)), ErrorCode::Stale);
        ops.cache_fill(written.ino, FillStep::Done).unwrap();
        ops.commit_write(written.ino, 9, TimeSet::Now).unwrap();
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
    fn rename_whiteout_leaves_a_character_device_in_the_same_transaction() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let f = ops
            .create(ROOT_INO, b"f", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        ops.rename(
            ROOT_INO,
            b"f",
            ROOT_INO,
            b"g",
            RENAME_WHITEOUT,
            &KeepOpen::All,
        )
        .unwrap();
        assert_eq!(ops.lookup(ROOT_INO, b"g").unwrap().ino, f.ino);
        let w = ops.lookup(ROOT_INO, b"f").unwrap();
        assert_eq!(
            (w.kind, w.rdev, w.perm, w.nlink),
            (FileKind::CharDev, 0, 0, 1)
        );
        // A refused rename leaves no whiteout behind.
        ops.create(ROOT_INO, b"h", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        assert_eq!(
            code(ops.rename(
                ROOT_INO,
                b"g",
                ROOT_INO,
                b"h",
                RENAME_WHITEOUT | RENAME_NOREPLACE,
                &KeepOpen::All
            )),
            ErrorCode::Exists
        );
        assert_eq!(ops.lookup(ROOT_INO, b"g").unwrap().ino, f.ino);
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
    fn rename_rules() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let a = ops
            .create(ROOT_INO, b"a", &NewNode::Dir, 0o755, 1, 1)
            .unwrap();
        let b = ops.create(a.ino, b"b", &NewNode::Dir, 0o755, 1, 1).unwrap();
        let f = ops
            .create(ROOT_INO, b"f", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        let g = ops
            .create(ROOT_INO, b"g", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        assert_eq!(
            code(ops.rename(ROOT_INO, b"a", b.ino, b"x", 0, &KeepOpen::All)),
            ErrorCode::Invalid,
            "into itself"
        );
        assert_eq!(
            code(ops.rename(ROOT_INO, b"f", ROOT_INO, b"g", 1, &KeepOpen::All)),
            ErrorCode::Exists,
            "NOREPLACE"
        );
        assert_eq!(
            code(ops.rename(ROOT_INO, b"f", ROOT_INO, b"a", 0, &KeepOpen::All)),
            ErrorCode::IsDir
        );
        assert_eq!(
            code(ops.rename(ROOT_INO, b"a", ROOT_INO, b"f", 0, &KeepOpen::All)),
            ErrorCode::NotDir
        );
        let replaced = ops
            .rename(ROOT_INO, b"f", ROOT_INO, b"g", 0, &KeepOpen::All)
            .unwrap()
            .unwrap();
        assert_eq!(replaced.ino, g.ino);
        assert!(replaced.orphaned);
        assert_eq!(ops.lookup(ROOT_INO, b"g").unwrap().ino, f.ino);
        // Moving a directory moves its link count to the new parent.
        ops.rename(a.ino, b"b", ROOT_INO, b"b2", 0, &KeepOpen::All)
            .unwrap();
        assert_eq!(ops.getattr(a.ino).unwrap().nlink, 2);
        assert_eq!(ops.getattr(ROOT_INO).unwrap().nlink, 4);
        ops.rename(ROOT_INO, b"b2", a.ino, b"b3", 0, &KeepOpen::All)
            .unwrap();
        assert_eq!(
            code(ops.rename(ROOT_INO, b"a", b.ino, b"x", 0, &KeepOpen::All)),
            ErrorCode::Invalid,
            "parent pointer followed the move"
        );
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
        let (p1, done1) = ops.readdir(ROOT_INO, 0, 4, false).unwrap();
        assert!(!done1);
        let (p2, _) = ops.readdir(ROOT_INO, p1[3].cursor, 4, true).unwrap();
        let (p3, done3) = ops.readdir(ROOT_INO, p2[3].cursor, 4, false).unwrap();
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
