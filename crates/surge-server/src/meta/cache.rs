//! The write-behind cache's side of the metadata store: the drain journal (what a drainer
//! copies to the PFS, in order), fill and write-through state per file, the files a drain
//! has made clean and may be evicted, and the drainer's hold.

use super::*;

impl Ops<'_> {
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
    pub(super) fn through_of(&self, ino: Ino) -> MetaResult<u64> {
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
    pub(super) fn take_pending_copies(
        &self,
        except: Ino,
        open: &[Ino],
    ) -> MetaResult<Vec<(Ino, u64)>> {
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

    pub(super) fn set_through(&self, ino: Ino, through: u64) -> MetaResult<()> {
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
    pub(super) fn check_not_evicted(a: &Attr, what: &str) -> MetaResult<()> {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::tests::{code, store};

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
}
