//! The manager's durable state behind one interface, two engines (issue 30): SQLite for the
//! embedded default and a single-host install ([`sqlite`]), etcd for a cluster, where several
//! managers share it and one leads ([`etcd`]). The rows are the same in both; every method is
//! async (an etcd call is a network round trip) and commits before it returns.

pub mod etcd;
pub mod sqlite;

use serde::{Deserialize, Serialize};
use surge_proto::InstanceDescriptor;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("state database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("etcd: {0}")]
    Etcd(String),
    /// This manager no longer leads: its write was refused (another manager took over).
    #[error("this manager is no longer the leader: {0}")]
    NotLeader(String),
    #[error("state record {key}: {error}")]
    Corrupt { key: String, error: String },
}

pub type SResult<T> = Result<T, StoreError>;

pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PoolRow {
    pub name: String,
    pub granularity: u64,
    pub created: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ServerRow {
    pub id: String,
    pub pool: String,
    pub addrs: Vec<String>,
    pub capacity: u64,
    pub state: String,
    pub last_seen: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct InstanceRow {
    pub id: u64,
    pub name: String,
    /// "job" or "persistent".
    pub kind: String,
    pub persistent_name: Option<String>,
    pub access_mode: String,
    pub pool: String,
    pub capacity: u64,
    pub nodes: u32,
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub state: String,
    pub created: i64,
    pub descriptor: InstanceDescriptor,
    /// Members of the owner's group may use it too (persistent instances shared by a group).
    pub group_shared: bool,
    /// A performance-target allocation's promise (`crate::targets::Promise` as JSON), else "".
    #[serde(default)]
    pub promise: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SessionRow {
    pub id: u64,
    pub job: String,
    pub owner_uid: u32,
    pub owner_gid: u32,
    /// "active", "ended", "stage-out-failed".
    pub state: String,
    pub created: i64,
    pub ended: i64,
    pub job_instance: Option<u64>,
    /// Attached persistent instances.
    pub persistent: Vec<u64>,
    /// A workload manager's job id ("slurm:1234").
    pub external: Option<String>,
    /// The last burst-buffer phase run.
    pub phase: String,
    /// The job's hosts, in node order.
    pub hosts: Vec<String>,
    /// Agents should have the session's instances mounted on `hosts`.
    pub mount: bool,
    /// What the manager promised for its job instance's performance targets (JSON), else "";
    /// kept after the instance is gone.
    #[serde(default)]
    pub promise: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StageRow {
    pub id: u64,
    pub session: u64,
    pub instance: u64,
    pub ns: u32,
    pub direction: String,
    pub items_json: String,
    /// A burst-buffer phase that asked for it ("data_in", "data_out"), or "".
    pub origin: String,
    /// "deferred", "queued", "running", "done", "failed", "cancelled".
    pub state: String,
    pub files_total: u64,
    pub files_done: u64,
    pub bytes_total: u64,
    pub bytes_done: u64,
    pub seconds: f64,
    pub failures_json: String,
    pub error: String,
    pub created: i64,
}

/// Calibrated peaks registered for a server (`key` = its id) or for some of a pool's servers
/// measured at once (`key` = the pool, `servers` = how many: a point of the pool's curve).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PeaksRow {
    pub key: String,
    pub peaks: surge_core::peaks::Peaks,
    pub source: String,
    pub registered: i64,
    pub servers: u32,
}

/// Stage tasks that ended, by direction and state, summed as they end (what the metrics
/// report without walking the history, which retention prunes).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StageTotal {
    pub direction: String,
    pub state: String,
    pub tasks: u64,
    pub bytes: u64,
    pub files: u64,
}

/// What a user or a group may hold at once (0: no limit).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct QuotaRow {
    /// "user", "group" or "default".
    pub kind: String,
    pub id: u32,
    pub capacity: u64,
    pub instances: u32,
    pub sessions: u32,
    pub stage_tasks: u32,
}

/// True for the states a stage task ends in.
pub fn is_ended(state: &str) -> bool {
    matches!(state, "done" | "failed" | "cancelled")
}

/// The state, in one of its engines.
pub enum Store {
    Sqlite(parking_lot::Mutex<sqlite::Db>),
    Etcd(Box<etcd::EtcdStore>),
}

impl Store {
    /// The SQLite engine over the database at `path` (made and migrated as needed).
    pub fn sqlite(path: &std::path::Path) -> SResult<Store> {
        Ok(Store::Sqlite(parking_lot::Mutex::new(sqlite::Db::open(
            path,
        )?)))
    }

    /// Which engine, for logs: "sqlite" or "etcd".
    pub fn engine(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Etcd(_) => "etcd",
        }
    }
}

/// One async method per operation, the same on both engines (the SQLite one runs under its
/// mutex, which no await crosses).
macro_rules! dispatch {
    ($( $(#[$m:meta])* fn $name:ident(&self $(, $arg:ident : $ty:ty)*) -> $ret:ty; )*) => {
        impl Store {
            $(
                $(#[$m])*
                pub async fn $name(&self $(, $arg: $ty)*) -> SResult<$ret> {
                    match self {
                        Store::Sqlite(db) => Ok(db.lock().$name($($arg),*)?),
                        Store::Etcd(e) => e.$name($($arg),*).await,
                    }
                }
            )*
        }
    };
}

dispatch! {
    fn upsert_pool(&self, name: &str, granularity: u64) -> PoolRow;
    fn pool(&self, name: &str) -> Option<PoolRow>;
    fn pools(&self) -> Vec<PoolRow>;
    fn upsert_server(&self, s: &ServerRow) -> ();
    fn set_server_state(&self, id: &str, state: &str, last_seen: Option<i64>) -> ();
    fn servers(&self) -> Vec<ServerRow>;
    fn set_server_peaks(&self, server: &str, peaks: &surge_core::peaks::Peaks, source: &str) -> ();
    fn set_pool_peaks(
        &self,
        pool: &str,
        servers: u32,
        peaks: &surge_core::peaks::Peaks,
        source: &str
    ) -> ();
    fn server_peaks(&self) -> Vec<PeaksRow>;
    fn pool_peaks(&self) -> Vec<PeaksRow>;
    /// Reserves an id for a new instance (completed by `finish_instance`, or removed).
    fn new_instance_id(&self, row: &InstanceRow, session: Option<u64>) -> u64;
    /// Records what an instance being created will have (its capacity counts from now on).
    fn plan_instance(&self, id: u64, name: &str, planned: &InstanceDescriptor) -> ();
    fn finish_instance(&self, id: u64, name: &str, desc: &InstanceDescriptor) -> ();
    fn update_descriptor(&self, id: u64, desc: &InstanceDescriptor) -> ();
    fn delete_instance(&self, id: u64) -> ();
    fn instance(&self, id: u64) -> Option<InstanceRow>;
    fn persistent(&self, name: &str) -> Option<InstanceRow>;
    fn persistent_name_taken(&self, name: &str) -> bool;
    fn instances(&self) -> Vec<InstanceRow>;
    fn instance_ids(&self) -> Vec<u64>;
    fn reserving_instances(&self) -> Vec<InstanceRow>;
    fn recover_interrupted_setups(&self) -> (Vec<u64>, Vec<u64>);
    fn orphaned_instances(&self) -> Vec<InstanceRow>;
    fn orphan_instance(&self, id: u64) -> ();
    fn create_session(&self, job: &str, uid: u32, gid: u32, external: Option<&str>) -> u64;
    fn session_of(&self, external: &str) -> Option<u64>;
    fn set_phase(&self, session: u64, phase: &str, hosts: Option<&[String]>, mount: bool) -> ();
    fn complete_session(&self, session: u64, job_instance: Option<(u64, &str)>, attach: &[u64]) -> ();
    fn end_session(&self, session: u64, state: &str) -> ();
    fn session(&self, id: u64) -> Option<SessionRow>;
    /// At most `limit` sessions with ids below `before` (0: from the newest), newest first;
    /// only those being set up or active if `open_only`; only `owner`'s if given.
    fn sessions_page(
        &self,
        before: u64,
        limit: u32,
        open_only: bool,
        owner: Option<u32>
    ) -> Vec<SessionRow>;
    /// At most `limit` stage tasks (of `session`, 0: of all) with ids below `before` (0: from
    /// the newest), newest first.
    fn stages_page(&self, session: u64, before: u64, limit: u32) -> Vec<StageRow>;
    /// Forgets up to `max` sessions that ended before `ended_before` (seconds since the
    /// epoch), with their stage tasks; never one whose kept job instance still exists.
    /// Returns (sessions, stage tasks) removed.
    fn prune_ended(&self, ended_before: i64, max: u32) -> (u64, u64);
    fn active_sessions(&self, mounted: bool) -> Vec<SessionRow>;
    /// Sessions being set up and active, by state, and all others as one "ended" count (what
    /// the metrics report; no walk over the history's rows).
    fn session_counts(&self) -> Vec<(String, u64)>;
    fn sessions_using(&self, instance: u64) -> Vec<u64>;
    fn create_stage(&self, t: &StageRow) -> u64;
    fn update_stage(&self, t: &StageRow) -> ();
    fn stage(&self, id: u64) -> Option<StageRow>;
    fn stages(&self, session: u64) -> Vec<StageRow>;
    /// Sets (or, with every limit 0 and `clear`, removes) a quota.
    fn set_quota(&self, q: &QuotaRow, clear: bool) -> ();
    fn quotas(&self) -> Vec<QuotaRow>;
    /// The totals of the tasks that ended (see [`StageTotal`]).
    fn stage_totals(&self) -> Vec<StageTotal>;
    /// Tasks not ended (deferred, queued, running).
    fn open_stages(&self) -> Vec<StageRow>;
}
