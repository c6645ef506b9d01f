//! `rename(2)` and `renameat2(2)` in the metadata store: NOREPLACE, EXCHANGE, WHITEOUT,
//! and the checks that keep the tree a tree.

use super::*;

impl Ops<'_> {
    pub(super) fn parent_of_dir(&self, ino: Ino) -> MetaResult<Ino> {
        self.tx
            .prepare_cached("SELECT parent FROM inodes WHERE ino = ?1")
            .and_then(|mut st| st.query_row([ino as i64], |r| r.get::<_, i64>(0)))
            .map(|p| p as u64)
            .map_err(db_err)
    }

    /// True if `dir` is `ancestor` or lies below it.
    pub(super) fn is_within(&self, mut dir: Ino, ancestor: Ino) -> MetaResult<bool> {
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
        Self::refuse_flagged(&self.dir(parent)?, FL_IMMUTABLE | FL_APPEND, "rename")?;
        Self::refuse_flagged(&self.dir(new_parent)?, FL_IMMUTABLE, "rename")?;
        let (ino, kind) = self.dentry(parent, name)?.ok_or_else(|| {
            err(
                ErrorCode::NotFound,
                format!("{} not found", String::from_utf8_lossy(name)),
            )
        })?;
        self.refuse_flagged_ino(ino, FL_IMMUTABLE | FL_APPEND, "rename")?;
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
            self.refuse_flagged_ino(dst, FL_IMMUTABLE | FL_APPEND, "rename over")?;
            // Replacing a name removes it: not in an append-only directory.
            self.refuse_flagged_ino(new_parent, FL_APPEND, "rename over")?;
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
    pub(super) fn whiteout(&self, parent: Ino, name: &[u8], now: Timestamp) -> MetaResult<()> {
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
    pub(super) fn exchange(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
    ) -> MetaResult<()> {
        Self::refuse_flagged(&self.dir(parent)?, FL_IMMUTABLE | FL_APPEND, "rename")?;
        Self::refuse_flagged(&self.dir(new_parent)?, FL_IMMUTABLE | FL_APPEND, "rename")?;
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
        self.refuse_flagged_ino(a, FL_IMMUTABLE | FL_APPEND, "rename")?;
        self.refuse_flagged_ino(b, FL_IMMUTABLE | FL_APPEND, "rename")?;
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
    pub(super) fn renamed(&self, ino: Ino, to: Ino, now: Timestamp) -> MetaResult<()> {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::tests::{code, store};

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
}
