//! Extended attributes and POSIX ACLs of the metadata store: `setxattr(2)`'s rules, the
//! per-inode and per-namespace room, default ACLs inherited at create.

use super::*;

impl Ops<'_> {
    /// The default ACL of directory `dir`, if it has one.
    pub(super) fn default_acl(&self, dir: Ino) -> MetaResult<Option<Acl>> {
        self.stored_acl(dir, acl::DEFAULT)
    }

    /// True when directory `dir` has a default ACL.
    pub fn has_default_acl(&self, dir: Ino) -> MetaResult<bool> {
        Ok(self.default_acl(dir)?.is_some())
    }

    /// The ACL stored as attribute `name` of `ino` (`None`: none, or only the mode).
    pub(super) fn stored_acl(&self, ino: Ino, name: &[u8]) -> MetaResult<Option<Acl>> {
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
    pub(super) fn put_xattr(&self, ino: Ino, name: &[u8], value: &[u8]) -> MetaResult<()> {
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
    pub(super) fn drop_xattr(&self, ino: Ino, name: &[u8]) -> MetaResult<bool> {
        self.tx
            .prepare_cached("DELETE FROM xattrs WHERE ino = ?1 AND name = ?2")
            .and_then(|mut st| st.execute(params![ino as i64, name]))
            .map(|n| n > 0)
            .map_err(db_err)
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
        self.refuse_flagged_ino(ino, FL_IMMUTABLE | FL_APPEND, "setxattr")?;
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
        if name == CAPABILITY_XATTR {
            self.mark(ino, FL_CAPS, true)?;
        }
        self.touch_ctime(ino)
    }

    /// A write, truncate or change of owner of `a` (a file marked [`FL_CAPS`]): its file
    /// capability goes, as Linux's `security_inode_killpriv` removes it; `a.flags` follows.
    pub(super) fn kill_capability(&self, a: &mut Attr) -> MetaResult<()> {
        if a.flags & FL_CAPS != 0 {
            self.drop_xattr(a.ino, CAPABILITY_XATTR)?;
            self.mark(a.ino, FL_CAPS, false)?;
            a.flags &= !FL_CAPS;
        }
        Ok(())
    }

    /// Refuses (`NoSpace`) a value of `len` bytes for attribute `name` of `ino` (whose value
    /// now takes `old` bytes, if it has one) that would take its attributes past
    /// [`XATTR_INODE_MAX`].
    pub(super) fn check_room(
        &self,
        ino: Ino,
        name: &[u8],
        old: Option<i64>,
        len: usize,
    ) -> MetaResult<()> {
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
    pub(super) fn xattr_len(&self, ino: Ino, name: &[u8]) -> MetaResult<Option<i64>> {
        self.tx
            .prepare_cached("SELECT length(value) FROM xattrs WHERE ino = ?1 AND name = ?2")
            .and_then(|mut st| {
                st.query_row(params![ino as i64, name], |r| r.get(0))
                    .optional()
            })
            .map_err(db_err)
    }

    /// Stores an ACL the caller set (within the inode's room for attributes).
    pub(super) fn put_acl(&self, ino: Ino, name: &[u8], acl: &Acl) -> MetaResult<()> {
        let value = acl.encode();
        let old = self.xattr_len(ino, name)?;
        self.check_room(ino, name, old, value.len())?;
        self.put_xattr(ino, name, &value)
    }

    /// Sets the access or default ACL of `a` (the kernel checked that the caller owns the
    /// node). An access ACL sets the mode's permission bits and is kept only when the mode
    /// cannot say it (named entries); `flags` may ask to clear setgid too.
    pub(super) fn set_acl(
        &self,
        a: &Attr,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> MetaResult<Attr> {
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
        self.refuse_flagged_ino(ino, FL_IMMUTABLE | FL_APPEND, "removexattr")?;
        let acl = name == acl::ACCESS || name == acl::DEFAULT;
        if !self.drop_xattr(ino, name)? && !acl {
            return Err(no_xattr(ino, name));
        }
        if name == CAPABILITY_XATTR {
            self.mark(ino, FL_CAPS, false)?;
        }
        self.touch_ctime(ino)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::tests::{code, store};

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
    fn a_file_capability_is_marked_and_goes_at_commit_truncate_and_chown() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let f = ops
            .create(ROOT_INO, b"f", &NewNode::File, 0o755, 1, 1)
            .unwrap();
        let cap = [
            1u8, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        let set = |ops: &Ops| ops.set_xattr(f.ino, CAPABILITY_XATTR, &cap, 0).unwrap();
        let gone = |ops: &Ops| {
            assert_eq!(
                code(ops.get_xattr(f.ino, CAPABILITY_XATTR)),
                ErrorCode::NoData
            );
            assert_eq!(ops.getattr(f.ino).unwrap().flags & FL_CAPS, 0);
        };
        assert_eq!(set(&ops).flags, FL_CAPS);
        // chattr keeps the mark (not the caller's to set or clear), and refuses it as a flag.
        let chattr = |flags| SetAttr {
            flags: Some(flags),
            ..Default::default()
        };
        let a = ops.setattr(f.ino, &chattr(surge_proto::FL_NODUMP)).unwrap();
        assert_eq!(a.flags, surge_proto::FL_NODUMP | FL_CAPS);
        assert_eq!(
            code(ops.setattr(f.ino, &chattr(FL_CAPS))),
            ErrorCode::Unsupported
        );
        ops.setattr(f.ino, &chattr(0)).unwrap();
        // Removed by name: the mark goes with it.
        ops.remove_xattr(f.ino, CAPABILITY_XATTR).unwrap();
        gone(&ops);
        // A commit of writes (any node's, passthrough included).
        set(&ops);
        assert_eq!(
            ops.commit_write(f.ino, 10, TimeSet::Now).unwrap().flags & FL_CAPS,
            0
        );
        gone(&ops);
        // A truncate, and a change of owner.
        for change in [
            SetAttr {
                size: Some(3),
                ..Default::default()
            },
            SetAttr {
                uid: Some(1),
                ..Default::default()
            },
        ] {
            set(&ops);
            assert_eq!(ops.setattr(f.ino, &change).unwrap().flags & FL_CAPS, 0);
            gone(&ops);
        }
        // A chmod or a time keeps it.
        set(&ops);
        let chmod = SetAttr {
            perm: Some(0o700),
            mtime: Some(TimeSet::Now),
            ..Default::default()
        };
        assert_eq!(ops.setattr(f.ino, &chmod).unwrap().flags, FL_CAPS);
        assert_eq!(ops.get_xattr(f.ino, CAPABILITY_XATTR).unwrap(), cap);
    }

    #[test]
    fn a_file_allocated_past_its_end_is_removed_on_every_fragment() {
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let f = ops
            .create(ROOT_INO, b"f", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        ops.commit_write(f.ino, 4096, TimeSet::Now).unwrap();
        let d = ops
            .create(ROOT_INO, b"d", &NewNode::Dir, 0o755, 1, 1)
            .unwrap();
        assert_eq!(code(ops.allocated_past_end(d.ino)), ErrorCode::Invalid);
        let a = ops.allocated_past_end(f.ino).unwrap();
        assert_eq!((a.flags, a.size), (FL_EOFBLOCKS, 4096));
        assert_eq!(surge_proto::extent(&a), surge_proto::EXTENT_UNKNOWN);
        // chattr keeps the mark; a truncate too (the client cut every fragment; the mark
        // stays for good: at worst a later cut goes to fragments with nothing past the end).
        let chattr = SetAttr {
            flags: Some(surge_proto::FL_NODUMP),
            ..Default::default()
        };
        assert_eq!(
            ops.setattr(f.ino, &chattr).unwrap().flags,
            surge_proto::FL_NODUMP | FL_EOFBLOCKS
        );
        // The unlink tells the extent, not the size: every fragment's object goes.
        let u = ops.unlink(ROOT_INO, b"f", &KeepOpen::All).unwrap();
        assert_eq!(u.size, surge_proto::EXTENT_UNKNOWN);
        let g = ops
            .create(ROOT_INO, b"g", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        ops.commit_write(g.ino, 10, TimeSet::Now).unwrap();
        assert_eq!(ops.unlink(ROOT_INO, b"g", &KeepOpen::All).unwrap().size, 10);
    }

    #[test]
    fn a_file_left_by_a_crashed_writer_is_marked_then_recovered_once() {
        use surge_proto::FL_RECOVER;
        let (_t, c) = store();
        let ops = Ops { tx: &c };
        let f = ops
            .create(ROOT_INO, b"f", &NewNode::File, 0o644, 1, 1)
            .unwrap();
        ops.commit_write(f.ino, 100, TimeSet::Now).unwrap();
        let d = ops
            .create(ROOT_INO, b"d", &NewNode::Dir, 0o755, 1, 1)
            .unwrap();
        // Only files are marked; a removed inode is skipped.
        assert_eq!(ops.mark_for_recovery(&[f.ino, d.ino, 999_999]).unwrap(), 1);
        let a = ops.getattr(f.ino).unwrap();
        assert_eq!((a.flags, a.size), (FL_RECOVER, 100));
        assert_eq!(surge_proto::extent(&a), surge_proto::EXTENT_UNKNOWN);
        // Kept through a chattr; never shown as a chattr flag's to be set.
        let chattr = SetAttr {
            flags: Some(surge_proto::FL_NODUMP),
            ..Default::default()
        };
        assert_eq!(
            ops.setattr(f.ino, &chattr).unwrap().flags,
            surge_proto::FL_NODUMP | FL_RECOVER
        );
        // The size grows to what the objects reach, never shrinks, and the mark goes.
        let a = ops.recovered(f.ino, 5000).unwrap();
        assert_eq!((a.flags, a.size), (surge_proto::FL_NODUMP, 5000));
        assert!(a.mtime >= f.mtime && a.ctime >= a.mtime);
        // A second recovery (another node measured too, or late) changes nothing.
        assert_eq!(ops.recovered(f.ino, 9000).unwrap().size, 5000);
        ops.mark_for_recovery(&[f.ino]).unwrap();
        assert_eq!(ops.recovered(f.ino, 10).unwrap().size, 5000);
        assert_eq!(code(ops.recovered(d.ino, 10)), ErrorCode::Invalid);
        // An unlink of a marked file tells the extent: every fragment's object goes.
        ops.mark_for_recovery(&[f.ino]).unwrap();
        let u = ops.unlink(ROOT_INO, b"f", &KeepOpen::All).unwrap();
        assert_eq!(u.size, surge_proto::EXTENT_UNKNOWN);
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
}
