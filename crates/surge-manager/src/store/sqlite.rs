//! The SQLite engine of the manager's state: pools, servers, instances (with their data-plane
//! descriptors), sessions and stage tasks in one database file. Every change is committed
//! before the API answers, so a restarted manager carries on where it stopped.

use super::{
    is_ended, now, InstanceRow, PeaksRow, PoolRow, QuotaRow, ServerRow, SessionRow, StageRow,
    StageTotal,
};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;
use surge_proto::InstanceDescriptor;

/// One SQLite database (the embedded default's and a single-host install's engine). Its methods
/// are synchronous; [`super::Store`] calls them under a mutex, never across an await.
pub struct Db {
    db: Connection,
}

type R<T> = rusqlite::Result<T>;

/// Statements prepared once per connection and kept (rusqlite's statement cache): parsing the
/// SQL of every call was an eighth of the manager's CPU under load.
trait Cached {
    fn exec<P: rusqlite::Params>(&self, sql: &str, p: P) -> R<usize>;
    fn row<T, P: rusqlite::Params, F: FnOnce(&rusqlite::Row<'_>) -> R<T>>(
        &self,
        sql: &str,
        p: P,
        f: F,
    ) -> R<T>;
}

impl Cached for Connection {
    fn exec<P: rusqlite::Params>(&self, sql: &str, p: P) -> R<usize> {
        self.prepare_cached(sql)?.execute(p)
    }

    fn row<T, P: rusqlite::Params, F: FnOnce(&rusqlite::Row<'_>) -> R<T>>(
        &self,
        sql: &str,
        p: P,
        f: F,
    ) -> R<T> {
        self.prepare_cached(sql)?.query_row(p, f)
    }
}

fn json_err(e: serde_json::Error) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(e))
}

impl Db {
    pub fn open(path: &Path) -> R<Db> {
        let db = Connection::open(path)?;
        db.pragma_update(None, "journal_mode", "WAL")?;
        db.pragma_update(None, "synchronous", "NORMAL")?;
        migrate(&db)?;
        db.set_prepared_statement_cache_capacity(128);
        // Instance ids name fragments on servers, which outlive a manager whose state was
        // deleted: start a fresh database at a random offset so ids are not reused.
        let empty: bool = db
            .query_row(
                "SELECT NOT EXISTS(SELECT 1 FROM sqlite_sequence WHERE name = 'instances')",
                [],
                |r| r.get(0),
            )
            .unwrap_or(true);
        if empty {
            let start = random_u32() as i64;
            db.execute(
                "INSERT INTO sqlite_sequence(name, seq) SELECT 'instances', ?1
                 WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'instances')",
                [start],
            )?;
        }
        Ok(Db { db })
    }

    // --- pools ---

    pub fn upsert_pool(&self, name: &str, granularity: u64) -> R<PoolRow> {
        self.db.exec(
            "INSERT INTO pools(name, granularity, created) VALUES (?1, ?2, ?3)
             ON CONFLICT(name) DO UPDATE SET granularity = excluded.granularity",
            params![name, granularity as i64, now()],
        )?;
        self.pool(name).map(|p| {
            p.unwrap_or(PoolRow {
                name: name.to_string(),
                granularity,
                created: now(),
            })
        })
    }

    pub fn pool(&self, name: &str) -> R<Option<PoolRow>> {
        self.db
            .row(
                "SELECT name, granularity, created FROM pools WHERE name = ?1",
                [name],
                |r| {
                    Ok(PoolRow {
                        name: r.get(0)?,
                        granularity: r.get::<_, i64>(1)? as u64,
                        created: r.get(2)?,
                    })
                },
            )
            .optional()
    }

    pub fn pools(&self) -> R<Vec<PoolRow>> {
        let mut st = self
            .db
            .prepare("SELECT name, granularity, created FROM pools ORDER BY name")?;
        let rows = st.query_map([], |r| {
            Ok(PoolRow {
                name: r.get(0)?,
                granularity: r.get::<_, i64>(1)? as u64,
                created: r.get(2)?,
            })
        })?;
        rows.collect()
    }

    // --- servers ---

    pub fn upsert_server(&self, s: &ServerRow) -> R<()> {
        self.db.exec(
            "INSERT INTO servers(id, pool, addrs, capacity, state, last_seen) VALUES (?1,?2,?3,?4,?5,?6)
             ON CONFLICT(id) DO UPDATE SET pool = excluded.pool, addrs = excluded.addrs,
                capacity = excluded.capacity, state = excluded.state, last_seen = excluded.last_seen",
            params![
                s.id,
                s.pool,
                serde_json::to_string(&s.addrs).map_err(json_err)?,
                s.capacity as i64,
                s.state,
                s.last_seen
            ],
        )?;
        Ok(())
    }

    pub fn set_server_state(&self, id: &str, state: &str, last_seen: Option<i64>) -> R<()> {
        match last_seen {
            Some(t) => self.db.exec(
                "UPDATE servers SET state = ?2, last_seen = ?3 WHERE id = ?1",
                params![id, state, t],
            )?,
            None => self.db.exec(
                "UPDATE servers SET state = ?2 WHERE id = ?1",
                params![id, state],
            )?,
        };
        Ok(())
    }

    pub fn servers(&self) -> R<Vec<ServerRow>> {
        let mut st = self.db.prepare_cached(
            "SELECT id, pool, addrs, capacity, state, last_seen FROM servers ORDER BY pool, id",
        )?;
        let rows = st.query_map([], |r| {
            let addrs: String = r.get(2)?;
            Ok(ServerRow {
                id: r.get(0)?,
                pool: r.get(1)?,
                addrs: serde_json::from_str(&addrs).unwrap_or_default(),
                capacity: r.get::<_, i64>(3)? as u64,
                state: r.get(4)?,
                last_seen: r.get(5)?,
            })
        })?;
        rows.collect()
    }

    // --- calibrated peaks ---

    pub fn set_server_peaks(
        &self,
        server: &str,
        peaks: &surge_core::peaks::Peaks,
        source: &str,
    ) -> R<()> {
        self.db.exec(
            "INSERT INTO server_peaks(server, peaks, source, registered) VALUES (?1,?2,?3,?4)
             ON CONFLICT(server) DO UPDATE SET peaks = excluded.peaks, source = excluded.source,
                registered = excluded.registered",
            params![
                server,
                serde_json::to_string(peaks).map_err(json_err)?,
                source,
                now()
            ],
        )?;
        Ok(())
    }

    pub fn set_pool_peaks(
        &self,
        pool: &str,
        servers: u32,
        peaks: &surge_core::peaks::Peaks,
        source: &str,
    ) -> R<()> {
        self.db.exec(
            "INSERT INTO pool_curve(pool, servers, peaks, source, registered) VALUES (?1,?2,?3,?4,?5)
             ON CONFLICT(pool, servers) DO UPDATE SET peaks = excluded.peaks,
                source = excluded.source, registered = excluded.registered",
            params![
                pool,
                i64::from(servers),
                serde_json::to_string(peaks).map_err(json_err)?,
                source,
                now()
            ],
        )?;
        Ok(())
    }

    fn peaks_rows(&self, sql: &str) -> R<Vec<PeaksRow>> {
        let mut st = self.db.prepare_cached(sql)?;
        let rows = st.query_map([], |r| {
            let text: String = r.get(1)?;
            Ok(PeaksRow {
                key: r.get(0)?,
                peaks: serde_json::from_str(&text).map_err(|e| {
                    rusqlite::Error::FromSqlConversionFailure(
                        1,
                        rusqlite::types::Type::Text,
                        Box::new(e),
                    )
                })?,
                source: r.get(2)?,
                registered: r.get(3)?,
                servers: r.get::<_, i64>(4)? as u32,
            })
        })?;
        rows.collect()
    }

    /// Every server's registered peaks.
    pub fn server_peaks(&self) -> R<Vec<PeaksRow>> {
        self.peaks_rows(
            "SELECT server, peaks, source, registered, 1 FROM server_peaks ORDER BY server",
        )
    }

    /// Every pool's curve: its servers measured together, one row per number of servers.
    pub fn pool_peaks(&self) -> R<Vec<PeaksRow>> {
        self.peaks_rows(
            "SELECT pool, peaks, source, registered, servers FROM pool_curve
             ORDER BY pool, servers",
        )
    }

    // --- instances ---

    fn instance_from_row(r: &rusqlite::Row<'_>) -> R<InstanceRow> {
        let desc: String = r.get(12)?;
        Ok(InstanceRow {
            id: r.get::<_, i64>(0)? as u64,
            name: r.get(1)?,
            kind: r.get(2)?,
            persistent_name: r.get(3)?,
            access_mode: r.get(4)?,
            pool: r.get(5)?,
            capacity: r.get::<_, i64>(6)? as u64,
            nodes: r.get::<_, i64>(7)? as u32,
            owner_uid: r.get::<_, i64>(8)? as u32,
            owner_gid: r.get::<_, i64>(9)? as u32,
            state: r.get(10)?,
            created: r.get(11)?,
            descriptor: serde_json::from_str(&desc).map_err(|e| {
                rusqlite::Error::FromSqlConversionFailure(
                    12,
                    rusqlite::types::Type::Text,
                    Box::new(e),
                )
            })?,
            group_shared: r.get::<_, i64>(13)? != 0,
            promise: r.get(14)?,
        })
    }

    const INSTANCE_COLS: &'static str =
        "id, name, kind, persistent_name, access_mode, pool, capacity, nodes, \
         owner_uid, owner_gid, state, created, descriptor, group_shared, promise";

    /// Reserves an id for a new instance (the row is completed by [`Db::finish_instance`]
    /// once its servers have made it, or removed); its capacity counts from now on (see
    /// [`Db::reserving_instances`]). `session`: the session whose job instance it is.
    pub fn new_instance_id(&self, row: &InstanceRow, session: Option<u64>) -> R<u64> {
        self.db.exec(
            "INSERT INTO instances(name, kind, persistent_name, access_mode, pool, capacity, nodes,
                owner_uid, owner_gid, state, created, descriptor, group_shared, promise, session)
             VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,'creating',?10,'null',?11,?12,?13)",
            params![
                row.name,
                row.kind,
                row.persistent_name,
                row.access_mode,
                row.pool,
                row.capacity as i64,
                i64::from(row.nodes),
                i64::from(row.owner_uid),
                i64::from(row.owner_gid),
                now(),
                row.group_shared,
                row.promise,
                session.map(|s| s as i64)
            ],
        )?;
        Ok(self.db.last_insert_rowid() as u64)
    }

    /// The fragments and namespaces an instance being created will have: what its servers are
    /// asked for, recorded before they are asked, so its capacity counts and a crash leaves a
    /// record of what to destroy.
    pub fn plan_instance(&self, id: u64, name: &str, planned: &InstanceDescriptor) -> R<()> {
        self.db.exec(
            "UPDATE instances SET name = ?2, descriptor = ?3 WHERE id = ?1 AND state = 'creating'",
            params![
                id as i64,
                name,
                serde_json::to_string(planned).map_err(json_err)?
            ],
        )?;
        Ok(())
    }

    pub fn finish_instance(&self, id: u64, name: &str, desc: &InstanceDescriptor) -> R<()> {
        self.db.exec(
            "UPDATE instances SET state = 'active', name = ?2, descriptor = ?3 WHERE id = ?1",
            params![
                id as i64,
                name,
                serde_json::to_string(desc).map_err(json_err)?
            ],
        )?;
        Ok(())
    }

    pub fn update_descriptor(&self, id: u64, desc: &InstanceDescriptor) -> R<()> {
        self.db.exec(
            "UPDATE instances SET descriptor = ?2 WHERE id = ?1",
            params![id as i64, serde_json::to_string(desc).map_err(json_err)?],
        )?;
        Ok(())
    }

    pub fn delete_instance(&self, id: u64) -> R<()> {
        self.db
            .execute("DELETE FROM instances WHERE id = ?1", [id as i64])?;
        Ok(())
    }

    pub fn instance(&self, id: u64) -> R<Option<InstanceRow>> {
        self.db
            .row(
                &format!(
                    "SELECT {} FROM instances WHERE id = ?1 AND state = 'active'",
                    Self::INSTANCE_COLS
                ),
                [id as i64],
                Self::instance_from_row,
            )
            .optional()
    }

    pub fn persistent(&self, name: &str) -> R<Option<InstanceRow>> {
        self.db
            .row(
                &format!(
                    "SELECT {} FROM instances WHERE persistent_name = ?1 AND state = 'active'",
                    Self::INSTANCE_COLS
                ),
                [name],
                Self::instance_from_row,
            )
            .optional()
    }

    pub fn persistent_name_taken(&self, name: &str) -> R<bool> {
        self.db.row(
            "SELECT EXISTS(SELECT 1 FROM instances WHERE persistent_name = ?1)",
            [name],
            |r| r.get(0),
        )
    }

    pub fn instances(&self) -> R<Vec<InstanceRow>> {
        let mut st = self.db.prepare_cached(&format!(
            "SELECT {} FROM instances WHERE state = 'active' ORDER BY id",
            Self::INSTANCE_COLS
        ))?;
        let rows = st.query_map([], Self::instance_from_row)?;
        rows.collect()
    }

    /// Ids of every instance the manager knows (including ones being created).
    pub fn instance_ids(&self) -> R<Vec<u64>> {
        let mut st = self.db.prepare_cached("SELECT id FROM instances")?;
        let rows = st.query_map([], |r| r.get::<_, i64>(0).map(|v| v as u64))?;
        rows.collect()
    }

    /// Instances whose capacity counts: the active ones, those being created (their planned
    /// fragments) and those waiting to be destroyed after a crash.
    pub fn reserving_instances(&self) -> R<Vec<InstanceRow>> {
        let mut st = self.db.prepare_cached(&format!(
            "SELECT {} FROM instances WHERE descriptor != 'null' ORDER BY id",
            Self::INSTANCE_COLS
        ))?;
        let rows = st.query_map([], Self::instance_from_row)?;
        rows.collect()
    }

    /// After a crash (at start): instances being created, and the job instances of sessions
    /// whose setup did not finish, become `orphaned` (to be destroyed on their servers by
    /// [`crate::core::Core::collect_orphans`]); those sessions end as `failed`. Rows of a
    /// creation that had not planned anything yet are removed. Returns (sessions failed,
    /// instances orphaned).
    pub fn recover_interrupted_setups(&self) -> R<(Vec<u64>, Vec<u64>)> {
        let tx = self.db.unchecked_transaction()?;
        tx.exec(
            "DELETE FROM instances WHERE state = 'creating' AND descriptor = 'null'",
            [],
        )?;
        let sessions: Vec<u64> = {
            let mut st = tx.prepare_cached("SELECT id FROM sessions WHERE state = 'creating'")?;
            let rows = st.query_map([], |r| r.get::<_, i64>(0).map(|v| v as u64))?;
            rows.collect::<R<_>>()?
        };
        for sid in &sessions {
            tx.exec(
                "UPDATE instances SET state = 'orphaned' WHERE session = ?1",
                [*sid as i64],
            )?;
        }
        tx.exec(
            "UPDATE sessions SET state = 'failed', ended = ?1 WHERE state = 'creating'",
            [now()],
        )?;
        tx.exec(
            "UPDATE instances SET state = 'orphaned' WHERE state = 'creating'",
            [],
        )?;
        let orphans: Vec<u64> = {
            let mut st = tx.prepare_cached("SELECT id FROM instances WHERE state = 'orphaned'")?;
            let rows = st.query_map([], |r| r.get::<_, i64>(0).map(|v| v as u64))?;
            rows.collect::<R<_>>()?
        };
        tx.commit()?;
        Ok((sessions, orphans))
    }

    /// Instances to destroy on their servers (see [`Db::recover_interrupted_setups`]).
    pub fn orphaned_instances(&self) -> R<Vec<InstanceRow>> {
        let mut st = self.db.prepare_cached(&format!(
            "SELECT {} FROM instances WHERE state = 'orphaned' ORDER BY id",
            Self::INSTANCE_COLS
        ))?;
        let rows = st.query_map([], Self::instance_from_row)?;
        rows.collect()
    }

    /// Marks an instance to be destroyed by the orphan collection (its creation failed and
    /// its servers could not all be told).
    pub fn orphan_instance(&self, id: u64) -> R<()> {
        self.db.exec(
            "UPDATE instances SET state = 'orphaned' WHERE id = ?1",
            [id as i64],
        )?;
        Ok(())
    }

    // --- sessions ---

    pub fn create_session(&self, job: &str, uid: u32, gid: u32, external: Option<&str>) -> R<u64> {
        self.db.exec(
            "INSERT INTO sessions(job, owner_uid, owner_gid, state, created, ended, job_instance,
                                  external)
             VALUES (?1, ?2, ?3, 'creating', ?4, 0, NULL, ?5)",
            params![
                surge_core::limits::bounded(job, surge_core::limits::MAX_JOB_NAME),
                i64::from(uid),
                i64::from(gid),
                now(),
                external
                    .map(|e| surge_core::limits::bounded(e, surge_core::limits::MAX_EXTERNAL_ID))
            ],
        )?;
        Ok(self.db.last_insert_rowid() as u64)
    }

    /// The newest session of a workload manager's job.
    pub fn session_of(&self, external: &str) -> R<Option<u64>> {
        self.db
            .row(
                "SELECT id FROM sessions WHERE external = ?1 ORDER BY id DESC LIMIT 1",
                [external],
                |r| r.get::<_, i64>(0).map(|v| v as u64),
            )
            .optional()
    }

    pub fn set_phase(
        &self,
        session: u64,
        phase: &str,
        hosts: Option<&[String]>,
        mount: bool,
    ) -> R<()> {
        match hosts {
            Some(h) => self.db.exec(
                "UPDATE sessions SET phase = ?2, hosts = ?3, mount = ?4 WHERE id = ?1",
                params![
                    session as i64,
                    phase,
                    serde_json::to_string(h).unwrap_or_else(|_| "[]".into()),
                    mount
                ],
            )?,
            None => self.db.exec(
                "UPDATE sessions SET phase = ?2, mount = ?3 WHERE id = ?1",
                params![session as i64, phase, mount],
            )?,
        };
        Ok(())
    }

    /// Completes a session's setup in one transaction: its job instance (and promise), the
    /// persistent instances it attaches, and the switch to `active`.
    pub fn complete_session(
        &self,
        session: u64,
        job_instance: Option<(u64, &str)>,
        attach: &[u64],
    ) -> R<()> {
        let tx = self.db.unchecked_transaction()?;
        if let Some((instance, promise)) = job_instance {
            tx.exec(
                "UPDATE sessions SET job_instance = ?2, promise = ?3 WHERE id = ?1",
                params![session as i64, instance as i64, promise],
            )?;
        }
        for id in attach {
            tx.exec(
                "INSERT OR IGNORE INTO session_persistent(session, instance) VALUES (?1, ?2)",
                params![session as i64, *id as i64],
            )?;
        }
        tx.exec(
            "UPDATE sessions SET state = 'active' WHERE id = ?1 AND state = 'creating'",
            [session as i64],
        )?;
        tx.commit()
    }

    pub fn end_session(&self, session: u64, state: &str) -> R<()> {
        self.db.exec(
            "UPDATE sessions SET state = ?2, ended = ?3 WHERE id = ?1",
            params![session as i64, state, now()],
        )?;
        Ok(())
    }

    fn session_from_row(&self, r: &rusqlite::Row<'_>) -> R<SessionRow> {
        Ok(SessionRow {
            id: r.get::<_, i64>(0)? as u64,
            job: r.get(1)?,
            owner_uid: r.get::<_, i64>(2)? as u32,
            owner_gid: r.get::<_, i64>(3)? as u32,
            state: r.get(4)?,
            created: r.get(5)?,
            ended: r.get(6)?,
            job_instance: r.get::<_, Option<i64>>(7)?.map(|v| v as u64),
            persistent: Vec::new(),
            external: r.get(8)?,
            phase: r.get(9)?,
            hosts: serde_json::from_str(&r.get::<_, String>(10)?).unwrap_or_default(),
            mount: r.get(11)?,
            promise: r.get(12)?,
        })
    }

    fn fill_persistent(&self, s: &mut SessionRow) -> R<()> {
        let mut st = self.db.prepare_cached(
            "SELECT instance FROM session_persistent WHERE session = ?1 ORDER BY instance",
        )?;
        s.persistent = st
            .query_map([s.id as i64], |r| r.get::<_, i64>(0).map(|v| v as u64))?
            .collect::<R<Vec<_>>>()?;
        Ok(())
    }

    pub fn session(&self, id: u64) -> R<Option<SessionRow>> {
        let s = self
            .db
            .row(
                "SELECT id, job, owner_uid, owner_gid, state, created, ended, job_instance,
                        external, phase, hosts, mount, promise
                 FROM sessions WHERE id = ?1",
                [id as i64],
                |r| self.session_from_row(r),
            )
            .optional()?;
        match s {
            Some(mut s) => {
                self.fill_persistent(&mut s)?;
                Ok(Some(s))
            }
            None => Ok(None),
        }
    }

    pub fn sessions(&self) -> R<Vec<SessionRow>> {
        self.sessions_where("1")
    }

    /// Active sessions (only those agents should mount, when `mounted`): what the periodic
    /// reconciliation and every agent sync read, without the history of ended ones.
    pub fn active_sessions(&self, mounted: bool) -> R<Vec<SessionRow>> {
        self.sessions_where(if mounted {
            "state = 'active' AND mount = 1"
        } else {
            "state = 'active'"
        })
    }

    fn sessions_where(&self, cond: &str) -> R<Vec<SessionRow>> {
        let mut st = self.db.prepare_cached(&format!(
            "SELECT id, job, owner_uid, owner_gid, state, created, ended, job_instance,
                    external, phase, hosts, mount, promise
             FROM sessions WHERE {cond} ORDER BY id"
        ))?;
        let mut out = st
            .query_map([], |r| self.session_from_row(r))?
            .collect::<R<Vec<_>>>()?;
        for s in &mut out {
            self.fill_persistent(s)?;
        }
        Ok(out)
    }

    /// See [`super::Store::sessions_page`].
    pub fn sessions_page(
        &self,
        before: u64,
        limit: u32,
        open_only: bool,
        owner: Option<u32>,
    ) -> R<Vec<SessionRow>> {
        // Only the conditions asked for are in the statement: a condition such as `(?1 = 0 OR
        // id < ?1)` keeps SQLite from using an index, and a listing of open sessions then
        // read the whole history (1M ended sessions: 110 ms per listing).
        let mut cond = vec!["1"];
        let mut named: Vec<(&str, i64)> = vec![(":limit", i64::from(limit))];
        if before > 0 {
            cond.push("id < :before");
            named.push((":before", before as i64));
        }
        if open_only {
            cond.push("state IN ('creating', 'active')");
        }
        if let Some(o) = owner {
            cond.push("owner_uid = :owner");
            named.push((":owner", i64::from(o)));
        }
        let mut st = self.db.prepare_cached(&format!(
            "SELECT id, job, owner_uid, owner_gid, state, created, ended, job_instance,
                    external, phase, hosts, mount, promise
             FROM sessions WHERE {} ORDER BY id DESC LIMIT :limit",
            cond.join(" AND ")
        ))?;
        let named: Vec<(&str, &dyn rusqlite::ToSql)> = named
            .iter()
            .map(|(k, v)| (*k, v as &dyn rusqlite::ToSql))
            .collect();
        let mut out = st
            .query_map(named.as_slice(), |r| self.session_from_row(r))?
            .collect::<R<Vec<_>>>()?;
        for s in &mut out {
            self.fill_persistent(s)?;
        }
        Ok(out)
    }

    /// See [`super::Store::stages_page`].
    pub fn stages_page(&self, session: u64, before: u64, limit: u32) -> R<Vec<StageRow>> {
        // As in `sessions_page`: only the conditions asked for, so the indexes are used.
        let mut cond = vec!["1"];
        let mut named: Vec<(&str, i64)> = vec![(":limit", i64::from(limit))];
        if session > 0 {
            cond.push("session = :session");
            named.push((":session", session as i64));
        }
        if before > 0 {
            cond.push("id < :before");
            named.push((":before", before as i64));
        }
        let mut st = self.db.prepare_cached(&format!(
            "SELECT {} FROM stage_tasks WHERE {} ORDER BY id DESC LIMIT :limit",
            Self::STAGE_COLS,
            cond.join(" AND ")
        ))?;
        let named: Vec<(&str, &dyn rusqlite::ToSql)> = named
            .iter()
            .map(|(k, v)| (*k, v as &dyn rusqlite::ToSql))
            .collect();
        let rows = st.query_map(named.as_slice(), Self::stage_from_row)?;
        rows.collect()
    }

    /// See [`super::Store::prune_ended`].
    pub fn prune_ended(&self, ended_before: i64, max: u32) -> R<(u64, u64)> {
        let tx = self.db.unchecked_transaction()?;
        let ids: Vec<i64> = {
            let mut st = tx.prepare_cached(
                "SELECT s.id FROM sessions s
                 WHERE s.state NOT IN ('creating', 'active') AND s.ended > 0 AND s.ended < ?1
                   AND (s.job_instance IS NULL
                        OR NOT EXISTS (SELECT 1 FROM instances i WHERE i.id = s.job_instance))
                 ORDER BY s.ended LIMIT ?2",
            )?;
            let rows = st.query_map(params![ended_before, i64::from(max)], |r| r.get(0))?;
            rows.collect::<R<_>>()?
        };
        let mut stages = 0u64;
        for id in &ids {
            stages += tx.exec("DELETE FROM stage_tasks WHERE session = ?1", [id])? as u64;
            tx.exec("DELETE FROM session_persistent WHERE session = ?1", [id])?;
            tx.exec("DELETE FROM sessions WHERE id = ?1", [id])?;
        }
        tx.commit()?;
        Ok((ids.len() as u64, stages))
    }

    /// Writes `n` ended sessions, each with a finished stage-in task, ended over the last 20
    /// days (inside the default retention): the history `surge bench control-plane
    /// --history` measures the manager with. Real rows, as a cluster's would be.
    pub fn preload_history(&self, n: u64) -> R<()> {
        let tx = self.db.unchecked_transaction()?;
        {
            let mut s = tx.prepare_cached(
                "INSERT INTO sessions(job, owner_uid, owner_gid, state, created, ended,
                    job_instance, external, phase, hosts, mount, promise)
                 VALUES (?1, 1000, 1000, 'ended', ?2, ?3, NULL, ?4, 'teardown',
                    '[\"node-00000\",\"node-00001\"]', 0, '')",
            )?;
            let mut t = tx.prepare_cached(
                "INSERT INTO stage_tasks(session, instance, ns, direction, items, state,
                    files_total, files_done, bytes_total, bytes_done, seconds, failures, error,
                    created, origin)
                 VALUES (?1, 0, 0, 'in', ?2, 'done', 10, 10, 10485760, 10485760, 1.5, '[]', '',
                    ?3, 'data_in')",
            )?;
            let end = now();
            for i in 0..n {
                let ended = end - (i % (20 * 86400)) as i64;
                s.execute(params![
                    format!("history-{i}.sh"),
                    ended - 600,
                    ended,
                    format!("slurm:h{i}")
                ])?;
                let sid = tx.last_insert_rowid();
                t.execute(params![
                    sid,
                    format!(
                        "[{{\"source\":\"/pfs/in/{i}\",\"destination\":\"in\",\"kind\":\"directory\"}}]"
                    ),
                    ended - 500
                ])?;
            }
        }
        tx.commit()
    }

    /// See [`super::Store::session_counts`].
    pub fn session_counts(&self) -> R<Vec<(String, u64)>> {
        let mut st = self.db.prepare_cached(
            "SELECT state, COUNT(*) FROM sessions WHERE state IN ('creating', 'active')
             GROUP BY state ORDER BY state",
        )?;
        let mut out: Vec<(String, u64)> = st
            .query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))?
            .collect::<R<_>>()?;
        let total: i64 = self
            .db
            .row("SELECT COUNT(*) FROM sessions", [], |r| r.get(0))?;
        let open: u64 = out.iter().map(|(_, n)| n).sum();
        out.push(("ended".into(), (total as u64).saturating_sub(open)));
        Ok(out)
    }

    /// Active sessions using `instance` (as job instance or attached).
    pub fn sessions_using(&self, instance: u64) -> R<Vec<u64>> {
        let mut st = self.db.prepare_cached(
            "SELECT id FROM sessions WHERE state = 'active' AND (job_instance = ?1 OR id IN
                (SELECT session FROM session_persistent WHERE instance = ?1)) ORDER BY id",
        )?;
        let rows = st.query_map([instance as i64], |r| r.get::<_, i64>(0).map(|v| v as u64))?;
        rows.collect()
    }

    // --- stage tasks ---

    pub fn create_stage(&self, t: &StageRow) -> R<u64> {
        self.db.exec(
            "INSERT INTO stage_tasks(session, instance, ns, direction, items, state, files_total,
                files_done, bytes_total, bytes_done, seconds, failures, error, created, origin)
             VALUES (?1,?2,?3,?4,?5,?6,0,0,0,0,0,'[]','',?7,?8)",
            params![
                t.session as i64,
                t.instance as i64,
                i64::from(t.ns),
                t.direction,
                t.items_json,
                t.state,
                now(),
                t.origin
            ],
        )?;
        Ok(self.db.last_insert_rowid() as u64)
    }

    pub fn update_stage(&self, t: &StageRow) -> R<()> {
        let tx = self.db.unchecked_transaction()?;
        let was: Option<String> = tx
            .row(
                "SELECT state FROM stage_tasks WHERE id = ?1",
                [t.id as i64],
                |r| r.get(0),
            )
            .optional()?;
        if was.as_deref().is_some_and(|w| !is_ended(w)) && is_ended(&t.state) {
            tx.exec(
                "INSERT INTO stage_totals(direction, state, tasks, bytes, files)
                 VALUES (?1, ?2, 1, ?3, ?4)
                 ON CONFLICT(direction, state) DO UPDATE SET tasks = tasks + 1,
                    bytes = bytes + excluded.bytes, files = files + excluded.files",
                params![
                    t.direction,
                    t.state,
                    t.bytes_done as i64,
                    t.files_done as i64
                ],
            )?;
        }
        tx.exec(
            "UPDATE stage_tasks SET state = ?2, files_total = ?3, files_done = ?4, bytes_total = ?5,
                bytes_done = ?6, seconds = ?7, failures = ?8, error = ?9 WHERE id = ?1",
            params![
                t.id as i64,
                t.state,
                t.files_total as i64,
                t.files_done as i64,
                t.bytes_total as i64,
                t.bytes_done as i64,
                t.seconds,
                t.failures_json,
                t.error
            ],
        )?;
        tx.commit()
    }

    pub fn set_quota(&self, q: &QuotaRow, clear: bool) -> R<()> {
        if clear {
            self.db.exec(
                "DELETE FROM quotas WHERE kind = ?1 AND id = ?2",
                params![q.kind, i64::from(q.id)],
            )?;
            return Ok(());
        }
        self.db.exec(
            "INSERT INTO quotas(kind, id, capacity, instances, sessions, stage_tasks)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(kind, id) DO UPDATE SET capacity = excluded.capacity,
                instances = excluded.instances, sessions = excluded.sessions,
                stage_tasks = excluded.stage_tasks",
            params![
                q.kind,
                i64::from(q.id),
                q.capacity as i64,
                i64::from(q.instances),
                i64::from(q.sessions),
                i64::from(q.stage_tasks)
            ],
        )?;
        Ok(())
    }

    pub fn quotas(&self) -> R<Vec<QuotaRow>> {
        let mut st = self.db.prepare_cached(
            "SELECT kind, id, capacity, instances, sessions, stage_tasks FROM quotas
             ORDER BY kind, id",
        )?;
        let rows = st.query_map([], |r| {
            Ok(QuotaRow {
                kind: r.get(0)?,
                id: r.get::<_, i64>(1)? as u32,
                capacity: r.get::<_, i64>(2)? as u64,
                instances: r.get::<_, i64>(3)? as u32,
                sessions: r.get::<_, i64>(4)? as u32,
                stage_tasks: r.get::<_, i64>(5)? as u32,
            })
        })?;
        rows.collect()
    }

    /// See [`super::Store::stage_totals`].
    pub fn stage_totals(&self) -> R<Vec<StageTotal>> {
        let mut st = self.db.prepare_cached(
            "SELECT direction, state, tasks, bytes, files FROM stage_totals
             ORDER BY direction, state",
        )?;
        let rows = st.query_map([], |r| {
            Ok(StageTotal {
                direction: r.get(0)?,
                state: r.get(1)?,
                tasks: r.get::<_, i64>(2)? as u64,
                bytes: r.get::<_, i64>(3)? as u64,
                files: r.get::<_, i64>(4)? as u64,
            })
        })?;
        rows.collect()
    }

    /// Tasks not ended (deferred, queued, running).
    pub fn open_stages(&self) -> R<Vec<StageRow>> {
        let mut st = self.db.prepare_cached(&format!(
            "SELECT {} FROM stage_tasks WHERE state IN ('deferred', 'queued', 'running')
             ORDER BY id",
            Self::STAGE_COLS
        ))?;
        let rows = st.query_map([], Self::stage_from_row)?;
        rows.collect()
    }

    fn stage_from_row(r: &rusqlite::Row<'_>) -> R<StageRow> {
        Ok(StageRow {
            id: r.get::<_, i64>(0)? as u64,
            session: r.get::<_, i64>(1)? as u64,
            instance: r.get::<_, i64>(2)? as u64,
            ns: r.get::<_, i64>(3)? as u32,
            direction: r.get(4)?,
            items_json: r.get(5)?,
            state: r.get(6)?,
            files_total: r.get::<_, i64>(7)? as u64,
            files_done: r.get::<_, i64>(8)? as u64,
            bytes_total: r.get::<_, i64>(9)? as u64,
            bytes_done: r.get::<_, i64>(10)? as u64,
            seconds: r.get(11)?,
            failures_json: r.get(12)?,
            error: r.get(13)?,
            created: r.get(14)?,
            origin: r.get(15)?,
        })
    }

    const STAGE_COLS: &'static str =
        "id, session, instance, ns, direction, items, state, files_total, files_done, \
         bytes_total, bytes_done, seconds, failures, error, created, origin";

    pub fn stage(&self, id: u64) -> R<Option<StageRow>> {
        self.db
            .row(
                &format!("SELECT {} FROM stage_tasks WHERE id = ?1", Self::STAGE_COLS),
                [id as i64],
                Self::stage_from_row,
            )
            .optional()
    }

    /// Stage tasks of one session (0: all).
    pub fn stages(&self, session: u64) -> R<Vec<StageRow>> {
        // Two statements, not `?1 = 0 OR session = ?1`, which reads every task ever run.
        if session == 0 {
            let mut st = self.db.prepare_cached(&format!(
                "SELECT {} FROM stage_tasks ORDER BY id",
                Self::STAGE_COLS
            ))?;
            let rows = st.query_map([], Self::stage_from_row)?;
            return rows.collect();
        }
        let mut st = self.db.prepare_cached(&format!(
            "SELECT {} FROM stage_tasks WHERE session = ?1 ORDER BY id",
            Self::STAGE_COLS
        ))?;
        let rows = st.query_map([session as i64], Self::stage_from_row)?;
        rows.collect()
    }
}

/// Migration 1: the schema as it was before migrations were numbered (every table, and the
/// columns added one by one since the first release; idempotent, so any older database
/// reaches it).
fn baseline(db: &Connection) -> R<()> {
    db.execute_batch(
        "CREATE TABLE IF NOT EXISTS pools(
        name TEXT PRIMARY KEY, granularity INTEGER NOT NULL, created INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS servers(
        id TEXT PRIMARY KEY, pool TEXT NOT NULL, addrs TEXT NOT NULL,
        capacity INTEGER NOT NULL, state TEXT NOT NULL, last_seen INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS instances(
        id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, kind TEXT NOT NULL,
        persistent_name TEXT UNIQUE, access_mode TEXT NOT NULL, pool TEXT NOT NULL,
        capacity INTEGER NOT NULL, nodes INTEGER NOT NULL, owner_uid INTEGER NOT NULL,
        owner_gid INTEGER NOT NULL, state TEXT NOT NULL, created INTEGER NOT NULL,
        descriptor TEXT NOT NULL);
         CREATE TABLE IF NOT EXISTS sessions(
        id INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT NOT NULL, owner_uid INTEGER NOT NULL,
        owner_gid INTEGER NOT NULL, state TEXT NOT NULL, created INTEGER NOT NULL,
        ended INTEGER NOT NULL, job_instance INTEGER);
         CREATE TABLE IF NOT EXISTS session_persistent(
        session INTEGER NOT NULL, instance INTEGER NOT NULL, PRIMARY KEY(session, instance));
         CREATE TABLE IF NOT EXISTS stage_tasks(
        id INTEGER PRIMARY KEY AUTOINCREMENT, session INTEGER NOT NULL,
        instance INTEGER NOT NULL, ns INTEGER NOT NULL, direction TEXT NOT NULL,
        items TEXT NOT NULL, state TEXT NOT NULL, files_total INTEGER NOT NULL,
        files_done INTEGER NOT NULL, bytes_total INTEGER NOT NULL,
        bytes_done INTEGER NOT NULL, seconds REAL NOT NULL, failures TEXT NOT NULL,
        error TEXT NOT NULL, created INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS server_peaks(
        server TEXT PRIMARY KEY, peaks TEXT NOT NULL, source TEXT NOT NULL,
        registered INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS pool_curve(
        pool TEXT NOT NULL, servers INTEGER NOT NULL, peaks TEXT NOT NULL,
        source TEXT NOT NULL, registered INTEGER NOT NULL, PRIMARY KEY(pool, servers));",
    )?;
    // Columns added since the first release: databases made before get them here.
    add_column(
        db,
        "instances",
        "group_shared",
        "INTEGER NOT NULL DEFAULT 0",
    )?;
    add_column(db, "stage_tasks", "origin", "TEXT NOT NULL DEFAULT ''")?;
    add_column(db, "sessions", "external", "TEXT")?;
    add_column(db, "sessions", "phase", "TEXT NOT NULL DEFAULT ''")?;
    add_column(db, "sessions", "hosts", "TEXT NOT NULL DEFAULT '[]'")?;
    add_column(db, "sessions", "mount", "INTEGER NOT NULL DEFAULT 0")?;
    // What a performance-target allocation promised (JSON, '' for the others).
    add_column(db, "instances", "promise", "TEXT NOT NULL DEFAULT ''")?;
    add_column(db, "sessions", "promise", "TEXT NOT NULL DEFAULT ''")?;
    Ok(())
}

/// Migration 2 (issue 30): indexes for every lookup the manager makes (history must not slow
/// anything), the session a job instance belongs to (so an instance whose session never
/// finished its setup is found and destroyed after a crash), and planned descriptors kept
/// for instances being created (their capacity counts while the servers are asked).
fn indexes_and_owners(db: &Connection) -> R<()> {
    add_column(db, "instances", "session", "INTEGER")?;
    db.execute_batch(
        "CREATE INDEX IF NOT EXISTS sessions_external ON sessions(external, id);
         CREATE INDEX IF NOT EXISTS sessions_state ON sessions(state, id);
         CREATE INDEX IF NOT EXISTS sessions_job_instance ON sessions(job_instance);
         CREATE INDEX IF NOT EXISTS sessions_ended ON sessions(ended);
         CREATE INDEX IF NOT EXISTS session_persistent_instance ON session_persistent(instance);
         CREATE INDEX IF NOT EXISTS instances_state ON instances(state);
         CREATE INDEX IF NOT EXISTS instances_session ON instances(session);
         CREATE INDEX IF NOT EXISTS stage_tasks_session ON stage_tasks(session, id);
         CREATE INDEX IF NOT EXISTS stage_tasks_instance ON stage_tasks(instance, id);
         CREATE INDEX IF NOT EXISTS stage_tasks_state ON stage_tasks(state, id);
         CREATE INDEX IF NOT EXISTS sessions_owner ON sessions(owner_uid, id);
         CREATE TABLE IF NOT EXISTS stage_totals(
            direction TEXT NOT NULL, state TEXT NOT NULL, tasks INTEGER NOT NULL,
            bytes INTEGER NOT NULL, files INTEGER NOT NULL, PRIMARY KEY(direction, state));",
    )?;
    // The totals of the tasks that ended before they were kept.
    db.execute_batch(
        "INSERT OR IGNORE INTO stage_totals(direction, state, tasks, bytes, files)
         SELECT direction, state, COUNT(*), SUM(bytes_done), SUM(files_done) FROM stage_tasks
         WHERE state IN ('done', 'failed', 'cancelled') GROUP BY direction, state;",
    )
}

/// Migration 3 (issue 31): quotas per user and group, and the default.
fn quotas(db: &Connection) -> R<()> {
    db.execute_batch(
        "CREATE TABLE IF NOT EXISTS quotas(
            kind TEXT NOT NULL, id INTEGER NOT NULL, capacity INTEGER NOT NULL,
            instances INTEGER NOT NULL, sessions INTEGER NOT NULL, stage_tasks INTEGER NOT NULL,
            PRIMARY KEY(kind, id));",
    )
}

/// The schema's numbered migrations, in order: migration `i + 1` is `MIGRATIONS[i]`. A
/// database records the last one applied (`PRAGMA user_version`); each start applies the rest,
/// each in its own transaction. A database newer than this manager is refused.
const MIGRATIONS: &[fn(&Connection) -> R<()>] = &[baseline, indexes_and_owners, quotas];

/// The schema version this manager writes.
pub const SCHEMA_VERSION: usize = MIGRATIONS.len();

fn migrate(db: &Connection) -> R<()> {
    let at: i64 = db.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let at = usize::try_from(at).unwrap_or(0);
    if at > MIGRATIONS.len() {
        return Err(rusqlite::Error::ToSqlConversionFailure(
            format!(
                "the state database has schema version {at}, newer than this manager's {} \
                 (a newer surge made it): upgrade this manager",
                MIGRATIONS.len()
            )
            .into(),
        ));
    }
    for (i, m) in MIGRATIONS.iter().enumerate().skip(at) {
        let tx = db.unchecked_transaction()?;
        m(&tx)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
}

/// Adds `column` to `table` unless the database has it (a database made by an older manager).
fn add_column(db: &Connection, table: &str, column: &str, decl: &str) -> R<()> {
    let has: bool = db.query_row(
        "SELECT COUNT(*) FROM pragma_table_info(?1) WHERE name = ?2",
        params![table, column],
        |r| r.get::<_, i64>(0).map(|n| n > 0),
    )?;
    if !has {
        db.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
    }
    Ok(())
}

fn random_u32() -> u32 {
    let b: [u8; 4] = surge_core::sys::random_bytes();
    // Keep ids well inside i64 and readable: at most ~2^31 plus what is allocated afterwards.
    u32::from_le_bytes(b) >> 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(id: u64) -> InstanceDescriptor {
        InstanceDescriptor {
            instance: surge_core::InstanceId(id),
            name: "x".into(),
            access_mode: "striped".into(),
            capacity: 1,
            stripe_size: 1,
            fragments: vec![],
            namespaces: vec![],
            cache_pfs: None,
            cache_fsync_pfs: false,
            cache_dirty_high: None,
            cache_passthrough: false,
            generation: 0,
        }
    }

    fn row() -> InstanceRow {
        InstanceRow {
            id: 0,
            name: "job".into(),
            kind: "persistent".into(),
            persistent_name: Some("keep".into()),
            access_mode: "striped".into(),
            pool: "default".into(),
            capacity: 100,
            nodes: 1,
            owner_uid: 1,
            owner_gid: 1,
            state: "active".into(),
            created: 0,
            descriptor: desc(0),
            group_shared: false,
            promise: String::new(),
        }
    }

    #[test]
    fn state_survives_reopening() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("m.db");
        let (iid, sid) = {
            let s = Db::open(&path).unwrap();
            s.upsert_pool("default", 1 << 30).unwrap();
            let iid = s.new_instance_id(&row(), None).unwrap();
            s.finish_instance(iid, "keep", &desc(iid)).unwrap();
            let sid = s.create_session("job.sh", 1, 1, None).unwrap();
            s.complete_session(sid, None, &[iid]).unwrap();
            (iid, sid)
        };
        let s = Db::open(&path).unwrap();
        assert_eq!(s.pools().unwrap()[0].granularity, 1 << 30);
        assert_eq!(s.persistent("keep").unwrap().unwrap().id, iid);
        assert_eq!(s.session(sid).unwrap().unwrap().persistent, vec![iid]);
        assert_eq!(s.sessions_using(iid).unwrap(), vec![sid]);
        s.end_session(sid, "ended").unwrap();
        assert!(s.sessions_using(iid).unwrap().is_empty());
    }

    fn peaks(bw: f64) -> surge_core::peaks::Peaks {
        serde_json::from_value(serde_json::json!({
            "schema": "surge.peaks/1", "path": "/bb", "host": "h",
            "measured_at": "2026-01-01T00:00:00Z", "read_bw": bw, "write_bw": bw,
            "read_iops": 1.0, "write_iops": 1.0, "metadata_ops": 1.0,
            "procs_at_peak": {"read_bw": 1, "write_bw": 1, "read_iops": 1, "write_iops": 1,
                              "metadata_ops": 1}
        }))
        .unwrap()
    }

    #[test]
    fn peaks_and_promises_survive_reopening_and_older_databases_get_their_columns() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("m.db");
        {
            let s = Db::open(&path).unwrap();
            s.set_server_peaks("srv-a", &peaks(1.0), "file a.json")
                .unwrap();
            s.set_pool_peaks("default", 2, &peaks(3.0), "both").unwrap();
            s.set_pool_peaks("default", 4, &peaks(5.0), "all").unwrap();
            s.set_pool_peaks("default", 2, &peaks(4.0), "both again")
                .unwrap();
            let mut r = row();
            r.promise = "{\"offer\":{}}".into();
            let iid = s.new_instance_id(&r, None).unwrap();
            s.finish_instance(iid, "keep", &desc(iid)).unwrap();
            let sid = s.create_session("job.sh", 1, 1, None).unwrap();
            s.complete_session(sid, Some((iid, &r.promise)), &[])
                .unwrap();
        }
        {
            let s = Db::open(&path).unwrap();
            let sp = s.server_peaks().unwrap();
            assert_eq!((sp[0].key.as_str(), sp[0].peaks.write_bw), ("srv-a", 1.0));
            let curve: Vec<(u32, f64)> = s
                .pool_peaks()
                .unwrap()
                .iter()
                .map(|p| (p.servers, p.peaks.write_bw))
                .collect();
            assert_eq!(curve, vec![(2, 4.0), (4, 5.0)]);
            assert_eq!(s.instances().unwrap()[0].promise, "{\"offer\":{}}");
            assert_eq!(s.sessions().unwrap()[0].promise, "{\"offer\":{}}");
            // What a manager before calibrated peaks made.
            s.db.execute_batch(
                "ALTER TABLE instances DROP COLUMN promise;
                 ALTER TABLE sessions DROP COLUMN promise;
                 DROP TABLE server_peaks; DROP TABLE pool_curve;
                 PRAGMA user_version = 0;",
            )
            .unwrap();
        }
        let s = Db::open(&path).unwrap();
        assert_eq!(s.instances().unwrap()[0].promise, "");
        assert!(s.server_peaks().unwrap().is_empty());
        s.set_server_peaks("srv-b", &peaks(2.0), "x").unwrap();
        assert_eq!(s.server_peaks().unwrap().len(), 1);
    }

    #[test]
    fn a_setup_cut_by_a_crash_fails_its_session_and_orphans_what_it_made() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("m.db");
        let mut job = row();
        job.persistent_name = None;
        job.kind = "job".into();
        let (cut, whole, made, planned, unplanned) = {
            let s = Db::open(&path).unwrap();
            // A session whose instance was made but not yet linked.
            let cut = s.create_session("cut.sh", 1, 1, Some("slurm:1")).unwrap();
            let made = s.new_instance_id(&job, Some(cut)).unwrap();
            s.plan_instance(made, "job-x", &desc(made)).unwrap();
            s.finish_instance(made, "job-x", &desc(made)).unwrap();
            // A creation planned (servers being asked) and one not yet planned.
            let planned = s.new_instance_id(&job, None).unwrap();
            s.plan_instance(planned, "job-y", &desc(planned)).unwrap();
            let unplanned = s.new_instance_id(&job, None).unwrap();
            // A whole session stays as it is.
            let whole = s.create_session("whole.sh", 1, 1, Some("slurm:2")).unwrap();
            s.complete_session(whole, None, &[]).unwrap();
            assert_eq!(s.sessions_using(made).unwrap(), Vec::<u64>::new());
            (cut, whole, made, planned, unplanned)
        };
        let s = Db::open(&path).unwrap();
        let (failed, orphans) = s.recover_interrupted_setups().unwrap();
        assert_eq!(failed, vec![cut]);
        assert_eq!(orphans, vec![made, planned]);
        assert_eq!(s.session(cut).unwrap().unwrap().state, "failed");
        assert_eq!(s.session(whole).unwrap().unwrap().state, "active");
        assert!(
            s.instance(made).unwrap().is_none(),
            "an orphan is not usable"
        );
        let ids: Vec<u64> = s
            .orphaned_instances()
            .unwrap()
            .iter()
            .map(|i| i.id)
            .collect();
        assert_eq!(ids, vec![made, planned]);
        // Orphans count against their servers' space until destroyed.
        let reserving: Vec<u64> = s
            .reserving_instances()
            .unwrap()
            .iter()
            .map(|i| i.id)
            .collect();
        assert!(reserving.contains(&made) && reserving.contains(&planned));
        assert!(!s.instance_ids().unwrap().contains(&unplanned));
    }

    #[test]
    fn the_schema_is_migrated_in_numbered_steps_and_a_newer_one_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("m.db");
        Db::open(&path).unwrap();
        let v: i64 = Connection::open(&path)
            .unwrap()
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v as usize, SCHEMA_VERSION);
        Connection::open(&path)
            .unwrap()
            .pragma_update(None, "user_version", 99)
            .unwrap();
        let e = Db::open(&path).err().expect("a newer schema was opened");
        assert!(e.to_string().contains("newer than this manager"), "{e}");
    }

    #[test]
    fn fresh_databases_start_instance_ids_at_a_random_offset() {
        let t = tempfile::tempdir().unwrap();
        let a = Db::open(&t.path().join("a.db"))
            .unwrap()
            .new_instance_id(&row(), None)
            .unwrap();
        let mut r = row();
        r.persistent_name = None;
        let b = Db::open(&t.path().join("b.db"))
            .unwrap()
            .new_instance_id(&r, None)
            .unwrap();
        assert_ne!(a, b);
        assert!(a > 1 || b > 1);
    }
}
