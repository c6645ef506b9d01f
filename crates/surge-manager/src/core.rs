//! The manager's logic, independent of how it is called (gRPC in [`crate::service`], HTTP reads
//! in [`crate::http`]): servers and their liveness, pools, instance allocation and destruction,
//! sessions. Stage tasks are in [`crate::stage`].

use crate::placement::{self, Candidate};
use crate::store::{now, InstanceRow, PeaksRow, PoolRow, ServerRow, SessionRow, Store};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use surge_api::{InstanceState, SessionState};
use surge_client::admin::{self, InstancePlan};
use surge_core::layout::DEFAULT_STRIPE_SIZE;
use surge_core::{InstanceId, NamespaceId};
use surge_proto::{Request, ServerRef, ServerStatus};
use thiserror::Error;
use tracing::{info, warn};

/// How long a view token of the HTTP API is valid (12 hours).
pub const VIEW_SECS: i64 = 12 * 3600;
/// How long a capability the manager gives lasts (longer than any job may run).
const CAPABILITY_SECS: i64 = 14 * 24 * 3600;

/// Rows a page of a listing has when the caller does not say.
pub const DEFAULT_PAGE: u32 = 500;
/// Rows a page of a listing has at most.
pub const MAX_PAGE: u32 = 5000;

/// A caller's page size, within bounds (0: the default).
pub fn page_limit(asked: u32) -> u32 {
    match asked {
        0 => DEFAULT_PAGE,
        n => n.min(MAX_PAGE),
    }
}

/// Missed liveness checks after which a server is marked down.
const MISSES_DOWN: u32 = 3;
/// How long a liveness check waits for a server's status: a hung (stopped, overloaded)
/// server misses its checks in seconds, not in the connection's default minute (issue 30).
const LIVENESS_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);
/// How long the manager waits for each call to a server when it creates or destroys an
/// instance. No lock is held meanwhile: a slow server delays only its own instances.
pub const SERVER_CALL_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);
/// How often each server's fragments are compared with the manager's records (leftovers of
/// crashed creations, of a lost state: removed and reported).
const GC_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

#[derive(Debug, Error)]
pub enum ManagerError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    NoSpace(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Denied(String),
    /// A quota would be exceeded (the message names it, what is held and what was asked).
    #[error("{0}")]
    Quota(String),
    #[error("{0}")]
    Store(#[from] crate::store::StoreError),
}

impl From<surge_client::ClientError> for ManagerError {
    fn from(e: surge_client::ClientError) -> Self {
        ManagerError::Unavailable(e.to_string())
    }
}

pub type MResult<T> = Result<T, ManagerError>;

/// What to allocate.
#[derive(Clone, Debug)]
pub struct InstanceRequest {
    pub capacity: u64,
    pub access_mode: String,
    pub pool: String,
    pub persistent_name: Option<String>,
    pub nodes: u32,
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub stripe_size: u64,
    /// Members of the owner's group may use it too.
    pub group_shared: bool,
    /// `type=cache`: the PFS directory the instance mirrors.
    pub cache_pfs: Option<String>,
    /// `type=cache` with `fsync=pfs`.
    pub cache_fsync_pfs: bool,
    /// `type=cache` with `passthrough=on`.
    pub cache_passthrough: bool,
    /// `type=cache`: `dirty_high=` (`None`: the default).
    pub cache_dirty_high: Option<surge_core::directives::DirtyHigh>,
    /// `#SURGE jobdw` performance targets: the instance is sized from calibrated peaks.
    pub targets: Option<surge_core::directives::Targets>,
    /// Peaks to assume for every server instead of the registered ones (`surge run --peaks`).
    pub peaks: Option<surge_core::peaks::Peaks>,
    /// Every fragment on this server (administrators: calibration of one server).
    pub server: Option<String>,
}

/// The calibrated peaks the manager keeps: each server's (with its pool and state, `None`
/// when it has none) and each pool's aggregate.
#[derive(Clone, Debug)]
pub struct PeaksView {
    pub servers: Vec<(ServerRow, Option<PeaksRow>)>,
    pub pools: Vec<PeaksRow>,
}

/// A pool with its servers and space, for listings.
#[derive(Clone, Debug)]
pub struct PoolUsage {
    pub pool: PoolRow,
    pub servers: u32,
    pub up: u32,
    pub capacity: u64,
    pub free: u64,
}

pub struct Core {
    pub store: Store,
    pub default_pool: String,
    /// The cluster key: the manager signs its own (administrator's) capabilities and those it
    /// gives users with it (see `surge_auth`).
    key: surge_auth::Key,
    /// Who may administer (besides root and the manager's own user).
    admin_group: Option<u32>,
    /// Last status of each server (by id), from registration and liveness checks.
    status: Mutex<HashMap<String, ServerStatus>>,
    misses: Mutex<HashMap<String, u32>>,
    /// Serializes placement decisions so two allocations never count the same free space.
    alloc: tokio::sync::Mutex<()>,
    /// Serializes creations of sessions with an external id, so a phase run twice at once
    /// makes one session.
    alloc_session: tokio::sync::Mutex<()>,
    /// When each server's fragments were last compared with the records.
    gc_at: Mutex<HashMap<String, std::time::Instant>>,
    /// How often they are ([`GC_EVERY`] unless set: `surge manager --gc-interval`).
    pub gc_every: std::time::Duration,
    /// What the collections freed since start (fragments, bytes), for the metrics.
    pub gc_freed: Mutex<(u64, u64)>,
    /// Sessions as they end (their id): stage tasks they left running are stopped
    /// ([`crate::stage::Stages`] listens).
    pub ended: tokio::sync::broadcast::Sender<u64>,
    /// Sessions that want mounts, by host: what an agent's sync reads (kept with every phase
    /// change and end; rebuilt from the state at start and at a takeover).
    by_host: Mutex<HashMap<String, std::collections::BTreeSet<u64>>>,
}

impl Core {
    /// The manager's logic over `store` (opened, and for etcd led, by the caller): the
    /// default pool made if missing, and what a stop interrupted recovered.
    pub async fn open(
        store: Store,
        default_pool: &str,
        granularity: u64,
        key: surge_auth::Key,
        admin_group: Option<u32>,
    ) -> anyhow::Result<Core> {
        if store.pool(default_pool).await?.is_none() {
            store.upsert_pool(default_pool, granularity).await?;
        }
        // Setups cut short by a stop: their sessions fail (the retried setup makes a new one,
        // whole) and their instances are destroyed on the servers by the orphan collection
        // (started with the manager), not just forgotten.
        let (failed, orphans) = store.recover_interrupted_setups().await?;
        if !failed.is_empty() {
            warn!(
                "{} session(s) were being set up when the manager stopped: failed ({failed:?}); \
                 a retried setup makes them anew",
                failed.len()
            );
        }
        if !orphans.is_empty() {
            warn!(
                "{} instance(s) of interrupted setups will be destroyed: {orphans:?}",
                orphans.len()
            );
        }
        let mut by_host: HashMap<String, std::collections::BTreeSet<u64>> = HashMap::new();
        for s in store.active_sessions(true).await? {
            for h in &s.hosts {
                by_host.entry(h.clone()).or_default().insert(s.id);
            }
        }
        Ok(Core {
            store,
            default_pool: default_pool.to_string(),
            key,
            admin_group,
            status: Mutex::new(HashMap::new()),
            misses: Mutex::new(HashMap::new()),
            alloc: tokio::sync::Mutex::new(()),
            alloc_session: tokio::sync::Mutex::new(()),
            gc_at: Mutex::new(HashMap::new()),
            gc_every: GC_EVERY,
            gc_freed: Mutex::new((0, 0)),
            by_host: Mutex::new(by_host),
            ended: tokio::sync::broadcast::channel(1024).0,
        })
    }

    // --- who is who ---

    /// The manager's own capability for its servers (administration).
    pub fn admin_token(&self) -> surge_auth::Token {
        surge_auth::Token::admin(&self.key, surge_auth::Caller::me(), 3600)
    }

    /// True for root, the manager's own user and members of its admin group.
    pub fn is_admin(&self, c: &surge_auth::Caller) -> bool {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        c.uid == 0 || c.uid == me || self.admin_group.is_some_and(|g| c.in_group(g))
    }

    /// True when `c` may use (attach, stage into and out of, mount, destroy) instance `inst`:
    /// its owner or an administrator; for a persistent instance, also members of its group
    /// when it is shared with the group.
    pub fn may_use(&self, c: &surge_auth::Caller, inst: &InstanceRow) -> bool {
        self.is_admin(c)
            || c.uid == inst.owner_uid
            || (inst.group_shared && c.in_group(inst.owner_gid))
    }

    /// Refuses `c` the use of `inst` unless [`may_use`](Self::may_use).
    pub fn check_use(&self, c: &surge_auth::Caller, inst: &InstanceRow) -> MResult<()> {
        if self.may_use(c, inst) {
            return Ok(());
        }
        Err(ManagerError::Denied(format!(
            "instance {} ({}) belongs to uid {}: uid {} may not use it",
            inst.id, inst.name, inst.owner_uid, c.uid
        )))
    }

    /// A capability for instance `inst` (namespace `ns`, or all) for `c`, valid as long as
    /// jobs may run.
    pub fn capability(
        &self,
        c: &surge_auth::Caller,
        inst: &InstanceRow,
        ns: Option<u32>,
    ) -> MResult<(surge_auth::Token, i64)> {
        self.check_use(c, inst)?;
        let expires = surge_auth::token::now() + CAPABILITY_SECS;
        let t = surge_auth::Token::mint(
            &self.key,
            &surge_auth::Claims {
                instance: inst.id,
                ns,
                caller: c.clone(),
                rights: surge_auth::Rights::Instance,
                expires,
                generation: inst.descriptor.generation,
            },
        );
        Ok((t, expires))
    }

    /// A token that lets `c` read the HTTP API as themselves (a browser cannot speak MUNGE):
    /// valid [`VIEW_SECS`].
    pub fn view_token(&self, c: &surge_auth::Caller) -> (surge_auth::Token, i64) {
        let expires = surge_auth::token::now() + VIEW_SECS;
        let t = surge_auth::Token::mint(
            &self.key,
            &surge_auth::Claims {
                instance: 0,
                ns: None,
                caller: c.clone(),
                rights: surge_auth::Rights::View,
                expires,
                generation: 0,
            },
        );
        (t, expires)
    }

    /// The caller a token presented to the HTTP API stands for (a view token, or an
    /// administrator's capability).
    pub fn viewer(&self, token: &surge_auth::Token) -> MResult<surge_auth::Caller> {
        let claims = token
            .verify(&self.key, surge_auth::token::now())
            .map_err(|e| ManagerError::Denied(e.to_string()))?;
        match claims.rights {
            surge_auth::Rights::View | surge_auth::Rights::Admin => Ok(claims.caller),
            surge_auth::Rights::Instance => Err(ManagerError::Denied(
                "an instance capability is not a view token (`surge dashboard` prints one)".into(),
            )),
        }
    }

    // --- pools ---

    pub async fn create_pool(&self, name: &str, granularity: u64) -> MResult<PoolRow> {
        surge_core::directives::check_pool_name(name).map_err(ManagerError::Invalid)?;
        if granularity == 0 {
            return Err(ManagerError::Invalid("granularity must be positive".into()));
        }
        Ok(self.store.upsert_pool(name, granularity).await?)
    }

    pub async fn pools(&self) -> MResult<Vec<PoolRow>> {
        Ok(self.store.pools().await?)
    }

    // --- calibrated peaks ---

    /// Keeps `peaks` for server `server` (a registered server's id), or with `aggregate` for
    /// pool `pool`'s servers measured all at once (`servers` of them).
    pub async fn register_peaks(
        &self,
        server: &str,
        pool: &str,
        aggregate: Option<u32>,
        peaks: &surge_core::peaks::Peaks,
        source: &str,
    ) -> MResult<PeaksRow> {
        crate::targets::check_peaks(peaks).map_err(ManagerError::Invalid)?;
        let store = &self.store;
        match aggregate {
            Some(n) => {
                let pool = if pool.is_empty() {
                    self.default_pool.as_str()
                } else {
                    pool
                };
                if store.pool(pool).await?.is_none() {
                    return Err(ManagerError::NotFound(format!(
                        "pool '{pool}' does not exist"
                    )));
                }
                if n == 0 {
                    return Err(ManagerError::Invalid(format!(
                        "the aggregate peaks of pool '{pool}' must say how many servers they                          spanned (at least 1)"
                    )));
                }
                store.set_pool_peaks(pool, n, peaks, source).await?;
                info!("pool {pool}: aggregate peaks over {n} server(s) registered ({source})");
                Ok(PeaksRow {
                    key: pool.into(),
                    peaks: peaks.clone(),
                    source: source.into(),
                    registered: now(),
                    servers: n,
                })
            }
            None => {
                if !store.servers().await?.iter().any(|s| s.id == server) {
                    return Err(ManagerError::NotFound(format!(
                        "no server '{server}' is registered (`surge pool peaks` lists them)"
                    )));
                }
                store.set_server_peaks(server, peaks, source).await?;
                info!("server {server}: peaks registered ({source})");
                Ok(PeaksRow {
                    key: server.into(),
                    peaks: peaks.clone(),
                    source: source.into(),
                    registered: now(),
                    servers: 1,
                })
            }
        }
    }

    /// The peaks of the servers of `pool` (every pool when empty) and of the pools.
    pub async fn peaks(&self, pool: &str) -> MResult<PeaksView> {
        let store = &self.store;
        if !pool.is_empty() && store.pool(pool).await?.is_none() {
            return Err(ManagerError::NotFound(format!(
                "pool '{pool}' does not exist"
            )));
        }
        let mut by_server: HashMap<String, PeaksRow> = store
            .server_peaks()
            .await?
            .into_iter()
            .map(|r| (r.key.clone(), r))
            .collect();
        Ok(PeaksView {
            servers: store
                .servers()
                .await?
                .into_iter()
                .filter(|s| pool.is_empty() || s.pool == pool)
                .map(|s| {
                    let p = by_server.remove(&s.id);
                    (s, p)
                })
                .collect(),
            pools: store
                .pool_peaks()
                .await?
                .into_iter()
                .filter(|p| pool.is_empty() || p.key == pool)
                .collect(),
        })
    }

    // --- servers ---

    /// Registers (or re-registers) the server at `addr` into `pool`.
    pub async fn register_server(&self, addr: &str, pool: &str) -> MResult<ServerRow> {
        let pool = if pool.is_empty() {
            self.default_pool.as_str()
        } else {
            pool
        };
        if self.store.pool(pool).await?.is_none() {
            return Err(ManagerError::NotFound(format!(
                "pool '{pool}' does not exist"
            )));
        }
        if let Some(why) = surge_core::addr::unroutable(addr) {
            return Err(ManagerError::Invalid(format!("cannot register {why}")));
        }
        let st = admin::status(addr, &self.admin_token())
            .await
            .map_err(|e| {
                ManagerError::Unavailable(format!("cannot reach server at {addr}: {e}"))
            })?;
        // What the server says it listens on, less what clients elsewhere cannot use, and the
        // address it was registered with.
        let mut addrs = st.addrs.clone();
        addrs.retain(|a| surge_core::addr::unroutable(a).is_none());
        if !addrs.iter().any(|a| a == addr) {
            addrs.push(addr.to_string());
        }
        let row = ServerRow {
            id: st.id.clone(),
            pool: pool.to_string(),
            addrs,
            capacity: st.capacity,
            state: "up".into(),
            last_seen: now(),
        };
        let changed_addrs = {
            let store = &self.store;
            let before = store.servers().await?.into_iter().find(|s| s.id == row.id);
            store.upsert_server(&row).await?;
            before.is_some_and(|b| b.addrs != row.addrs)
        };
        if changed_addrs {
            self.refresh_descriptors(&row).await?;
        }
        self.collect_garbage(&row, &st).await;
        self.status.lock().insert(row.id.clone(), st);
        self.misses.lock().remove(&row.id);
        info!(
            "server {} registered in pool {pool} ({})",
            row.id,
            row.addrs.join(", ")
        );
        Ok(row)
    }

    /// A server came back with other addresses: point every descriptor at them.
    async fn refresh_descriptors(&self, server: &ServerRow) -> MResult<()> {
        let store = &self.store;
        for mut inst in store.instances().await? {
            let mut touched = false;
            let fix = |r: &mut ServerRef, touched: &mut bool| {
                if r.id == server.id && r.addrs != server.addrs {
                    r.addrs = server.addrs.clone();
                    *touched = true;
                }
            };
            for f in &mut inst.descriptor.fragments {
                fix(&mut f.server, &mut touched);
            }
            for n in &mut inst.descriptor.namespaces {
                fix(&mut n.server, &mut touched);
            }
            if touched {
                store.update_descriptor(inst.id, &inst.descriptor).await?;
            }
        }
        Ok(())
    }

    /// Removes fragments and namespaces of instances the manager does not know (left by a
    /// killed job runner, a creation cut by a crash, a lost state), and says what it freed.
    /// `st` must have been read before this call: an instance's row is written before its
    /// fragments exist, so every fragment `st` shows whose row is missing is garbage.
    async fn collect_garbage(&self, server: &ServerRow, st: &ServerStatus) {
        let known: std::collections::HashSet<u64> = match self.store.instance_ids().await {
            Ok(k) => k.into_iter().collect(),
            Err(_) => return,
        };
        self.gc_at
            .lock()
            .insert(server.id.clone(), std::time::Instant::now());
        let stray_fragments: Vec<_> = st
            .fragments
            .iter()
            .filter(|f| !known.contains(&f.instance.0))
            .collect();
        let stray_namespaces: Vec<_> = st
            .namespaces
            .iter()
            .filter(|(i, _)| !known.contains(&i.0))
            .collect();
        if stray_fragments.is_empty() && stray_namespaces.is_empty() {
            return;
        }
        let sref = ServerRef {
            id: server.id.clone(),
            addrs: server.addrs.clone(),
        };
        let Ok(pool) = surge_client::conn::ServerPool::new(sref, 1) else {
            return;
        };
        let pool = pool
            .with_token(Arc::new(self.admin_token()))
            .with_deadline(Some(SERVER_CALL_DEADLINE));
        let (mut frags, mut bytes) = (0u64, 0u64);
        for f in stray_fragments {
            let r = pool
                .call(
                    &Request::DestroyFragment {
                        instance: f.instance,
                        fragment: f.index,
                    },
                    &[],
                )
                .await;
            if r.is_ok() {
                frags += 1;
                bytes += f.used;
            }
            warn!(
                "server {}: fragment {} of unknown instance {} ({} stored): {}",
                server.id,
                f.index,
                f.instance,
                surge_core::format_bytes(f.used),
                if r.is_ok() {
                    "removed"
                } else {
                    "could not be removed"
                }
            );
        }
        for (i, ns) in stray_namespaces {
            warn!(
                "server {}: removing namespace {} of unknown instance {i}",
                server.id, ns.0
            );
            let _ = pool
                .call(
                    &Request::DestroyNamespace {
                        instance: *i,
                        ns: *ns,
                    },
                    &[],
                )
                .await;
        }
        if frags > 0 {
            info!(
                "server {}: freed {frags} stray fragment(s), {}",
                server.id,
                surge_core::format_bytes(bytes)
            );
            let mut g = self.gc_freed.lock();
            g.0 += frags;
            g.1 += bytes;
        }
    }

    /// Destroys, on their servers, the instances left by setups a crash interrupted (and
    /// failed creations); each row goes once its pieces are gone. Run by
    /// [`spawn_orphan_collection`], apart from the liveness checks: a hung server delays its
    /// orphans, never the finding that it hangs.
    pub async fn collect_orphans(&self) {
        let orphans = match self.store.orphaned_instances().await {
            Ok(o) => o,
            Err(e) => {
                warn!("orphaned instances: {e}");
                return;
            }
        };
        for inst in orphans {
            match admin::destroy_instance_within(
                &inst.descriptor,
                &self.admin_token(),
                Some(SERVER_CALL_DEADLINE),
            )
            .await
            {
                Ok(()) => {
                    let _ = self.store.delete_instance(inst.id).await;
                    info!(
                        "instance {} of an interrupted setup destroyed ({} freed)",
                        inst.id,
                        surge_core::format_bytes(inst.descriptor.capacity)
                    );
                }
                Err(e) => warn!(
                    "instance {} of an interrupted setup: cannot destroy it yet: {e}",
                    inst.id
                ),
            }
        }
    }

    /// Checks every server once (all at once, each within [`LIVENESS_DEADLINE`]); compares
    /// a server's fragments with the records every [`GC_EVERY`]; called periodically.
    pub async fn check_liveness(&self) {
        let servers = match self.store.servers().await {
            Ok(s) => s,
            Err(e) => {
                warn!("liveness: {e}");
                return;
            }
        };
        let token = self.admin_token();
        let checks = servers.iter().map(|s| {
            let token = token.clone();
            // One deadline for the server, whichever of its addresses answers.
            let check = async move {
                for a in &s.addrs {
                    if a.starts_with("unix:") && !Path::new(&a[5..]).exists() {
                        continue;
                    }
                    if let Ok(st) = admin::status_within(a, &token, Some(LIVENESS_DEADLINE)).await {
                        return Some(st);
                    }
                }
                None
            };
            async move {
                tokio::time::timeout(LIVENESS_DEADLINE, check)
                    .await
                    .ok()
                    .flatten()
            }
        });
        let statuses = futures::future::join_all(checks).await;
        for (s, status) in servers.into_iter().zip(statuses) {
            match status {
                Some(st) if st.id == s.id => {
                    self.misses.lock().remove(&s.id);
                    if s.state != "up" {
                        info!("server {} is up again", s.id);
                    }
                    let _ = self.store.set_server_state(&s.id, "up", Some(now())).await;
                    let due = self
                        .gc_at
                        .lock()
                        .get(&s.id)
                        .is_none_or(|t| t.elapsed() >= self.gc_every);
                    if due {
                        self.collect_garbage(&s, &st).await;
                    }
                    self.status.lock().insert(s.id.clone(), st);
                }
                _ => {
                    let n = {
                        let mut m = self.misses.lock();
                        let n = m.entry(s.id.clone()).or_insert(0);
                        *n += 1;
                        *n
                    };
                    if n >= MISSES_DOWN && s.state != "down" {
                        warn!(
                            "server {} missed {n} liveness checks: marking it down",
                            s.id
                        );
                        let _ = self.store.set_server_state(&s.id, "down", None).await;
                    }
                }
            }
        }
    }

    pub async fn servers(&self) -> MResult<Vec<(ServerRow, Option<ServerStatus>)>> {
        let rows = self.store.servers().await?;
        let status = self.status.lock();
        Ok(rows
            .into_iter()
            .map(|r| {
                let st = status.get(&r.id).cloned();
                (r, st)
            })
            .collect())
    }

    /// Capacity promised to fragments on each server, from the descriptors of all instances.
    fn reserved_by_server(
        instances: &[InstanceRow],
    ) -> (HashMap<String, u64>, HashMap<String, u32>) {
        let mut reserved = HashMap::new();
        let mut namespaces = HashMap::new();
        for i in instances {
            for f in &i.descriptor.fragments {
                *reserved.entry(f.server.id.clone()).or_insert(0) += f.capacity;
            }
            for n in &i.descriptor.namespaces {
                *namespaces.entry(n.server.id.clone()).or_insert(0) += 1;
            }
        }
        (reserved, namespaces)
    }

    /// Every pool with its servers and space.
    pub async fn pool_usage(&self) -> MResult<Vec<PoolUsage>> {
        let store = &self.store;
        let (reserved, _) = Self::reserved_by_server(&store.reserving_instances().await?);
        let servers = store.servers().await?;
        let mut out = Vec::new();
        for p in store.pools().await? {
            let mine: Vec<&ServerRow> = servers.iter().filter(|s| s.pool == p.name).collect();
            let up = mine.iter().filter(|s| s.state == "up").count() as u32;
            let capacity: u64 = mine.iter().map(|s| s.capacity).sum();
            let used: u64 = mine
                .iter()
                .map(|s| reserved.get(&s.id).copied().unwrap_or(0))
                .sum();
            out.push(PoolUsage {
                servers: mine.len() as u32,
                up,
                capacity,
                free: capacity.saturating_sub(used),
                pool: p,
            });
        }
        Ok(out)
    }

    // --- instances ---

    pub async fn create_instance(&self, req: &InstanceRequest) -> MResult<InstanceRow> {
        self.create_instance_for(req, None).await
    }

    /// Allocates an instance (the job instance of `session`, if given): placement and the
    /// record of the planned fragments under the allocation lock (so two allocations never
    /// count the same space), the calls to the servers after it (so a slow server delays only
    /// the instances placed on it), each within [`SERVER_CALL_DEADLINE`].
    pub async fn create_instance_for(
        &self,
        req: &InstanceRequest,
        session: Option<u64>,
    ) -> MResult<InstanceRow> {
        let mode = req.access_mode.as_str();
        if !matches!(mode, "striped" | "private" | "ldbalance") {
            return Err(ManagerError::Invalid(format!(
                "access_mode '{mode}' is not supported (striped, private or ldbalance)"
            )));
        }
        if req.capacity == 0 && req.targets.is_none() {
            return Err(ManagerError::Invalid("capacity must be positive".into()));
        }
        let nodes = req.nodes.max(1);
        if nodes > surge_core::limits::MAX_JOB_NODES {
            return Err(ManagerError::Invalid(format!(
                "nodes={nodes}: a job has at most {} compute nodes",
                surge_core::limits::MAX_JOB_NODES
            )));
        }
        if let Some(name) = &req.persistent_name {
            surge_core::directives::check_persistent_name(name).map_err(ManagerError::Invalid)?;
        }
        let stripe = if req.stripe_size == 0 {
            DEFAULT_STRIPE_SIZE
        } else {
            req.stripe_size
        };
        let pool_name = if req.pool.is_empty() {
            self.default_pool.clone()
        } else {
            req.pool.clone()
        };

        let guard = self.alloc.lock().await;
        let (plan, placement, granularity, id) = {
            let store = &self.store;
            let pool = store.pool(&pool_name).await?.ok_or_else(|| {
                ManagerError::NotFound(format!("pool '{pool_name}' does not exist"))
            })?;
            if let Some(name) = &req.persistent_name {
                if store.persistent_name_taken(name).await? {
                    return Err(ManagerError::Busy(format!(
                        "a persistent instance named '{name}' exists"
                    )));
                }
            }
            let (reserved, namespaces) =
                Self::reserved_by_server(&store.reserving_instances().await?);
            let servers: Vec<ServerRow> = store
                .servers()
                .await?
                .into_iter()
                .filter(|s| s.pool == pool.name && s.state == "up")
                .collect();
            let mut servers = servers;
            if let Some(id) = &req.server {
                servers.retain(|s| &s.id == id);
                if servers.is_empty() {
                    return Err(ManagerError::NotFound(format!(
                        "no server '{id}' is up in pool '{}'",
                        pool.name
                    )));
                }
            }
            let mut candidates: Vec<Candidate> = servers
                .iter()
                .map(|s| Candidate {
                    id: s.id.clone(),
                    capacity: s.capacity,
                    reserved: reserved.get(&s.id).copied().unwrap_or(0),
                    namespaces: namespaces.get(&s.id).copied().unwrap_or(0),
                })
                .collect();
            // Performance targets: the servers (and so the fragments) and the metadata servers
            // come from the calibrated peaks; placement then lays the fragments on those.
            let mut sized = None;
            if let Some(targets) = &req.targets {
                let plan = self
                    .plan_targets(store, req, targets, &pool, &candidates, nodes, mode)
                    .await?;
                servers = plan.servers.iter().map(|&i| servers[i].clone()).collect();
                candidates = plan
                    .servers
                    .iter()
                    .map(|&i| candidates[i].clone())
                    .collect();
                sized = Some(plan);
            }
            // ldbalance: one read-only replica per node, at most one per server (each has its
            // own metadata service); the capacity is per replica.
            let ns_count = match mode {
                "private" => nodes,
                "ldbalance" => nodes.min(candidates.len().max(1) as u32),
                _ => 1,
            };
            let reserve = if mode == "ldbalance" {
                req.capacity.saturating_mul(u64::from(ns_count))
            } else if let Some(plan) = &sized {
                plan.fragments.saturating_mul(pool.granularity)
            } else {
                req.capacity
            };
            let mut placement = placement::place(reserve, pool.granularity, &candidates, ns_count)
                .map_err(|e| match e {
                    placement::PlacementError::NoSpace { .. } => {
                        ManagerError::NoSpace(format!("pool '{}': {e}", pool.name))
                    }
                    placement::PlacementError::NoServers => {
                        ManagerError::Unavailable(format!("pool '{}': {e}", pool.name))
                    }
                    other => ManagerError::Invalid(other.to_string()),
                })?;
            if let Some(plan) = &mut sized {
                // What placement made of the plan: fragments per server as laid out.
                for share in &mut plan.promise.servers {
                    share.fragments = placement
                        .fragments
                        .iter()
                        .filter(|(i, _)| candidates[*i].id == share.server)
                        .count() as u64;
                }
                // The plan's servers are the candidates in its order: its metadata servers
                // are found among them by id.
                let at = |id: &str| candidates.iter().position(|c| c.id == id);
                let md: Option<Vec<usize>> = plan
                    .promise
                    .metadata_servers
                    .iter()
                    .map(|id| at(id))
                    .collect();
                if let Some(md) = md.filter(|m| m.len() == placement.namespaces.len()) {
                    placement.namespaces = md;
                }
            }
            let capacity = match &sized {
                Some(plan) => plan.promise.offer.capacity.max(req.capacity),
                None => req.capacity,
            };
            let row = InstanceRow {
                id: 0,
                name: String::new(),
                kind: if req.persistent_name.is_some() {
                    "persistent"
                } else {
                    "job"
                }
                .into(),
                persistent_name: req.persistent_name.clone(),
                access_mode: mode.into(),
                pool: pool.name.clone(),
                capacity,
                nodes,
                owner_uid: req.owner_uid,
                owner_gid: req.owner_gid,
                group_shared: req.group_shared,
                promise: match &sized {
                    Some(plan) => serde_json::to_string(&plan.promise).unwrap_or_default(),
                    None => String::new(),
                },
                state: InstanceState::Creating.as_str().into(),
                created: now(),
                descriptor: surge_proto::InstanceDescriptor {
                    instance: InstanceId(0),
                    name: String::new(),
                    access_mode: mode.into(),
                    capacity: 0,
                    stripe_size: stripe,
                    fragments: vec![],
                    namespaces: vec![],
                    cache_pfs: None,
                    cache_fsync_pfs: false,
                    cache_dirty_high: None,
                    cache_passthrough: false,
                    generation: 0,
                },
            };
            // Quotas are checked under the allocation lock: two allocations of one user
            // cannot both fit in what is left.
            let asked: u64 = placement.fragments.iter().map(|f| f.1).sum();
            self.check_quota(row.owner_uid, row.owner_gid, (asked, 1, 0, 0))
                .await?;
            let id = store.new_instance_id(&row, session).await?;
            let name = req
                .persistent_name
                .clone()
                .unwrap_or_else(|| format!("job-{id}"));
            let sref = |i: usize| ServerRef {
                id: servers[i].id.clone(),
                addrs: servers[i].addrs.clone(),
            };
            let plan = InstancePlan {
                instance: InstanceId(id),
                name: name.clone(),
                access_mode: mode.into(),
                stripe_size: stripe,
                fragments: placement
                    .fragments
                    .iter()
                    .map(|(i, c)| (sref(*i), *c))
                    .collect(),
                namespaces: placement.namespaces.iter().map(|i| sref(*i)).collect(),
                root_uid: req.owner_uid,
                root_gid: req.owner_gid,
                root_perm: 0o755,
                cache_pfs: req.cache_pfs.clone(),
                cache_fsync_pfs: req.cache_fsync_pfs && req.cache_pfs.is_some(),
                cache_dirty_high: req.cache_dirty_high.filter(|_| req.cache_pfs.is_some()),
                cache_passthrough: req.cache_passthrough && req.cache_pfs.is_some(),
                generation: surge_auth::token::new_generation(),
            };
            // From here the planned fragments count against their servers' space.
            store.plan_instance(id, &name, &plan.descriptor()).await?;
            (plan, placement, pool.granularity, id)
        };
        drop(guard);
        let name = plan.name.clone();
        match admin::create_instance_within(&plan, &self.admin_token(), Some(SERVER_CALL_DEADLINE))
            .await
        {
            Ok(desc) => {
                surge_core::failpoint::hit("manager:instance-made");
                let store = &self.store;
                store.finish_instance(id, &name, &desc).await?;
                info!(
                    "instance {id} ({name}): {} {mode} in {} fragments of {} on {} servers",
                    surge_core::format_bytes(req.capacity),
                    plan.fragments.len(),
                    surge_core::format_bytes(granularity),
                    placement.namespaces.len().max(1)
                );
                Ok(store
                    .instance(id)
                    .await?
                    .ok_or_else(|| ManagerError::NotFound(format!("instance {id} vanished")))?)
            }
            Err(e) => {
                // `create_instance_within` undid what it made where servers answered; the
                // record stays, orphaned, until the orphan collection has made sure on every
                // server (one that did not answer may still make its piece).
                let _ = self.store.orphan_instance(id).await;
                Err(ManagerError::Unavailable(format!(
                    "cannot create instance: {e}"
                )))
            }
        }
    }

    /// Sizes an instance asked by performance targets from the calibrated peaks of the pool's
    /// `candidates` (its servers that are up), or refuses with the best the pool offers.
    #[allow(clippy::too_many_arguments)]
    async fn plan_targets(
        &self,
        store: &Store,
        req: &InstanceRequest,
        targets: &surge_core::directives::Targets,
        pool: &PoolRow,
        candidates: &[Candidate],
        nodes: u32,
        mode: &str,
    ) -> MResult<crate::targets::Plan> {
        use crate::targets::{plan, Aggregate, Ask, ServerView, TargetError};
        use surge_core::directives::AccessMode;
        let mode = match mode {
            "private" => AccessMode::Private,
            "ldbalance" => AccessMode::Ldbalance,
            _ => AccessMode::Striped,
        };
        // Each server's peaks, and whether `surge pool calibrate` measured them through the
        // data path (see `targets::host_medians`).
        let registered: HashMap<String, (surge_core::peaks::Peaks, bool)> = store
            .server_peaks()
            .await?
            .into_iter()
            .map(|r| {
                let measured = r.source.starts_with(crate::targets::MEASURED_SOURCE);
                (r.key, (r.peaks, measured))
            })
            .collect();
        let curve: Vec<PeaksRow> = store
            .pool_peaks()
            .await?
            .into_iter()
            .filter(|p| p.key == pool.name)
            .collect();
        let g = pool.granularity.max(1);
        let views: Vec<ServerView<'_>> = candidates
            .iter()
            .map(|c| ServerView {
                id: &c.id,
                free_fragments: c.capacity.saturating_sub(c.reserved) / g,
                reserved: c.reserved,
                peaks: match &req.peaks {
                    Some(p) => Some(p),
                    None => registered.get(&c.id).map(|(p, _)| p),
                },
                measured: req.peaks.is_none() && registered.get(&c.id).is_some_and(|(_, m)| *m),
            })
            .collect();
        let ask = Ask {
            targets: *targets,
            capacity: req.capacity,
            mode,
            nodes,
            granularity: g,
        };
        // Peaks given with the request stand for every server: the pool's curve, measured
        // with other peaks, does not apply to them.
        let curve: Vec<Aggregate<'_>> = match &req.peaks {
            Some(_) => Vec::new(),
            None => curve
                .iter()
                .map(|a| Aggregate {
                    peaks: &a.peaks,
                    servers: a.servers,
                })
                .collect(),
        };
        let source = if req.peaks.is_some() {
            "given"
        } else {
            "registered"
        };
        plan(&ask, &views, &curve, &pool.name, source).map_err(|e| match e {
            TargetError::NoPeaks { .. } => ManagerError::Busy(format!("pool '{}': {e}", pool.name)),
            TargetError::Unmet { .. } => {
                ManagerError::NoSpace(format!("pool '{}' cannot meet the targets: {e}", pool.name))
            }
            TargetError::Invalid(m) => ManagerError::Invalid(m),
        })
    }

    pub async fn instance(&self, id: u64, persistent_name: &str) -> MResult<InstanceRow> {
        let store = &self.store;
        let found = if id != 0 {
            store.instance(id).await?
        } else {
            store.persistent(persistent_name).await?
        };
        found.ok_or_else(|| {
            if id != 0 {
                ManagerError::NotFound(format!("instance {id} does not exist"))
            } else {
                ManagerError::NotFound(format!("no persistent instance named '{persistent_name}'"))
            }
        })
    }

    pub async fn instances(&self) -> MResult<Vec<InstanceRow>> {
        Ok(self.store.instances().await?)
    }

    pub async fn sessions_using(&self, id: u64) -> MResult<Vec<u64>> {
        Ok(self.store.sessions_using(id).await?)
    }

    /// Bytes stored in an instance (sum over its fragments), from the servers' last status.
    pub fn instance_used(&self, inst: &InstanceRow) -> u64 {
        let status = self.status.lock();
        inst.descriptor
            .fragments
            .iter()
            .filter_map(|f| {
                status.get(&f.server.id).and_then(|st| {
                    st.fragments
                        .iter()
                        .find(|x| x.instance == inst.descriptor.instance && x.index == f.index)
                        .map(|x| x.used)
                })
            })
            .sum()
    }

    /// Destroys an instance. A persistent instance used by an active session is refused.
    pub async fn destroy_instance(
        &self,
        id: u64,
        persistent_name: &str,
        except_session: Option<u64>,
    ) -> MResult<()> {
        let inst = self.instance(id, persistent_name).await?;
        let users: Vec<u64> = self
            .sessions_using(inst.id)
            .await?
            .into_iter()
            .filter(|s| Some(*s) != except_session)
            .collect();
        if !users.is_empty() {
            return Err(ManagerError::Busy(format!(
                "instance {} ({}) is in use by session(s) {users:?}",
                inst.id, inst.name
            )));
        }
        admin::destroy_instance(&inst.descriptor, &self.admin_token())
            .await
            .map_err(|e| {
                ManagerError::Unavailable(format!("cannot destroy instance {}: {e}", inst.id))
            })?;
        self.store.delete_instance(inst.id).await?;
        info!("instance {} ({}) destroyed", inst.id, inst.name);
        if let Some(pfs) = inst.descriptor.cache_pfs.clone() {
            let (uid, gid) = (inst.owner_uid, inst.owner_gid);
            let _ = tokio::task::spawn_blocking(move || {
                clear_through_as_owner(Path::new(&pfs), uid, gid)
            })
            .await;
        }
        Ok(())
    }

    // --- quotas ---

    /// The quotas that bind `uid`/`gid`: the user's own (else the default, for users other
    /// than root) and the group's.
    pub async fn quotas_of(&self, uid: u32, gid: u32) -> MResult<Vec<crate::store::QuotaRow>> {
        let all = self.store.quotas().await?;
        let mut out = Vec::new();
        match all.iter().find(|q| q.kind == "user" && q.id == uid) {
            Some(q) => out.push(q.clone()),
            None if uid != 0 => {
                if let Some(d) = all.iter().find(|q| q.kind == "default") {
                    let mut d = d.clone();
                    d.id = uid;
                    out.push(d);
                }
            }
            None => {}
        }
        if let Some(q) = all.iter().find(|q| q.kind == "group" && q.id == gid) {
            out.push(q.clone());
        }
        Ok(out)
    }

    /// What a user (`kind` "user"/"default") or a group holds now: capacity and instances
    /// (being created and to be destroyed included), open sessions, stage tasks not ended.
    pub async fn held(&self, kind: &str, id: u32) -> MResult<(u64, u32, u32, u32)> {
        let is_mine = |uid: u32, gid: u32| {
            if kind == "group" {
                gid == id
            } else {
                uid == id
            }
        };
        let (mut cap, mut inst) = (0u64, 0u32);
        for i in self.store.reserving_instances().await? {
            if is_mine(i.owner_uid, i.owner_gid) {
                cap += i
                    .descriptor
                    .fragments
                    .iter()
                    .map(|f| f.capacity)
                    .sum::<u64>();
                inst += 1;
            }
        }
        let open = self.store.sessions_page(0, u32::MAX, true, None).await?;
        let sessions = open
            .iter()
            .filter(|s| is_mine(s.owner_uid, s.owner_gid))
            .count() as u32;
        let mut tasks = 0u32;
        for t in self.store.open_stages().await? {
            if let Some(s) = open.iter().find(|s| s.id == t.session) {
                if is_mine(s.owner_uid, s.owner_gid) {
                    tasks += 1;
                }
            } else if let Ok(s) = self.session(t.session).await {
                if is_mine(s.owner_uid, s.owner_gid) {
                    tasks += 1;
                }
            }
        }
        Ok((cap, inst, sessions, tasks))
    }

    /// Refuses what would take `uid`/`gid` past a quota: `capacity` more bytes, `instances`
    /// more instances, `sessions` more sessions, `tasks` more stage tasks.
    pub async fn check_quota(
        &self,
        uid: u32,
        gid: u32,
        (capacity, instances, sessions, tasks): (u64, u32, u32, u32),
    ) -> MResult<()> {
        for q in self.quotas_of(uid, gid).await? {
            let who = match q.kind.as_str() {
                "group" => format!("group {}", q.id),
                _ => format!(
                    "uid {}{}",
                    q.id,
                    surge_auth::user_name(q.id)
                        .map(|n| format!(" ({n})"))
                        .unwrap_or_default()
                ),
            };
            let kind = if q.kind == "default" { "user" } else { &q.kind };
            let (hcap, hinst, hsess, htasks) = self.held(kind, q.id).await?;
            let over = |limit: u64, held: u64, asked: u64| limit > 0 && held + asked > limit;
            let fmt = surge_core::format_bytes;
            let why = if over(q.capacity, hcap, capacity) {
                Some(format!(
                    "capacity {} ({} held, {} asked)",
                    fmt(q.capacity),
                    fmt(hcap),
                    fmt(capacity)
                ))
            } else if over(q.instances.into(), hinst.into(), instances.into()) {
                Some(format!("{} instances ({hinst} held)", q.instances))
            } else if over(q.sessions.into(), hsess.into(), sessions.into()) {
                Some(format!("{} sessions ({hsess} open)", q.sessions))
            } else if over(q.stage_tasks.into(), htasks.into(), tasks.into()) {
                Some(format!(
                    "{} stage tasks ({htasks} not ended)",
                    q.stage_tasks
                ))
            } else {
                None
            };
            if let Some(why) = why {
                let src = if q.kind == "default" {
                    " (the default quota)"
                } else {
                    ""
                };
                return Err(ManagerError::Quota(format!(
                    "quota of {who}{src}: at most {why}; ask an administrator (`surge quota ls`)"
                )));
            }
        }
        Ok(())
    }

    // --- sessions ---

    /// Opens a session: allocates the job instance (if asked) and attaches persistent instances
    /// by name. All or nothing.
    pub async fn create_session(
        &self,
        job: &str,
        uid: u32,
        gid: u32,
        job_instance: Option<InstanceRequest>,
        persistent: &[String],
        external: Option<&str>,
    ) -> MResult<SessionRow> {
        // A workload manager's phase re-run after a crash: the session it made is the answer.
        // (A `surge run`'s id is its own process's: never reused.)
        if let Some(ext) = external.filter(|e| !e.starts_with("run:")) {
            let _one = self.alloc_session.lock().await;
            // The store's guard must end before `session()` takes it again (a temporary in
            // an `if let` lives to the end of its block: that was the deadlock of issue 30).
            let existing = self.store.session_of(ext).await?;
            if let Some(id) = existing {
                let s = self.session(id).await?;
                if s.state == SessionState::Active.as_str() {
                    if s.owner_uid != uid {
                        return Err(ManagerError::Denied(format!(
                            "job {ext} has session {id} of uid {}, not uid {uid}",
                            s.owner_uid
                        )));
                    }
                    return Ok(s);
                }
            }
            return self
                .create_session_now(job, uid, gid, job_instance, persistent, external)
                .await;
        }
        self.create_session_now(job, uid, gid, job_instance, persistent, external)
            .await
    }

    async fn create_session_now(
        &self,
        job: &str,
        uid: u32,
        gid: u32,
        job_instance: Option<InstanceRequest>,
        persistent: &[String],
        external: Option<&str>,
    ) -> MResult<SessionRow> {
        // Check the names first so a typo allocates nothing.
        let mut attach = Vec::new();
        for name in persistent {
            attach.push(self.instance(0, name).await?.id);
        }
        if attach.len() > surge_core::limits::MAX_ATTACHED {
            return Err(ManagerError::Invalid(format!(
                "{} persistent instances named: a session attaches at most {}",
                attach.len(),
                surge_core::limits::MAX_ATTACHED
            )));
        }
        self.check_quota(uid, gid, (0, 0, 1, 0)).await?;
        // The session is `creating` until it has every instance it asked for: a crash before
        // then fails it at the next start (and destroys what it had), so a retried setup never
        // finds a session without its instance (issue 30).
        let sid = self.store.create_session(job, uid, gid, external).await?;
        surge_core::failpoint::hit("manager:session-row");
        let mut made = None;
        if let Some(req) = job_instance {
            match self.create_instance_for(&req, Some(sid)).await {
                Ok(inst) => made = Some(inst),
                Err(e) => {
                    self.store
                        .end_session(sid, SessionState::Failed.as_str())
                        .await?;
                    return Err(e);
                }
            }
        }
        surge_core::failpoint::hit("manager:instance-linked");
        self.store
            .complete_session(
                sid,
                made.as_ref().map(|i| (i.id, i.promise.as_str())),
                &attach,
            )
            .await?;
        self.session(sid).await
    }

    pub async fn session(&self, id: u64) -> MResult<SessionRow> {
        self.store
            .session(id)
            .await?
            .ok_or_else(|| ManagerError::NotFound(format!("session {id} does not exist")))
    }

    /// A page of sessions, newest first (see [`crate::store::Store::sessions_page`]); the
    /// limit is taken between 1 and [`MAX_PAGE`].
    pub async fn sessions_page(
        &self,
        before: u64,
        limit: u32,
        open_only: bool,
        owner: Option<u32>,
    ) -> MResult<Vec<SessionRow>> {
        Ok(self
            .store
            .sessions_page(before, page_limit(limit), open_only, owner)
            .await?)
    }

    /// Forgets what ended more than `days` ago (sessions and their stage tasks), in batches;
    /// returns what went.
    pub async fn prune(&self, days: f64) -> MResult<(u64, u64)> {
        let cutoff = now() - (days * 86400.0) as i64;
        let (mut sessions, mut stages) = (0, 0);
        loop {
            let (s, t) = self.store.prune_ended(cutoff, 1000).await?;
            sessions += s;
            stages += t;
            if s < 1000 {
                return Ok((sessions, stages));
            }
        }
    }

    /// Active sessions (only those agents should mount, when `mounted`).
    pub async fn active_sessions(&self, mounted: bool) -> MResult<Vec<SessionRow>> {
        Ok(self.store.active_sessions(mounted).await?)
    }

    /// The newest session of a workload manager's job.
    pub async fn session_of(&self, external: &str) -> MResult<SessionRow> {
        let id = self
            .store
            .session_of(external)
            .await?
            .ok_or_else(|| ManagerError::NotFound(format!("job {external} has no session")))?;
        self.session(id).await
    }

    pub async fn set_phase(
        &self,
        id: u64,
        phase: &str,
        hosts: Option<&[String]>,
        mount: bool,
    ) -> MResult<SessionRow> {
        let before = self.session(id).await?;
        self.store.set_phase(id, phase, hosts, mount).await?;
        let s = self.session(id).await?;
        self.index_hosts(&before.hosts, &s);
        Ok(s)
    }

    /// Keeps the index of mounts by host for session `s` as it now is (`before`: its hosts
    /// until now): the work is the job's hosts, not the cluster's.
    fn index_hosts(&self, before: &[String], s: &SessionRow) {
        let mut by = self.by_host.lock();
        for h in before {
            if let Some(ids) = by.get_mut(h) {
                ids.remove(&s.id);
                if ids.is_empty() {
                    by.remove(h);
                }
            }
        }
        if s.state == SessionState::Active.as_str() && s.mount {
            for h in &s.hosts {
                by.entry(h.clone()).or_default().insert(s.id);
            }
        }
    }

    /// The sessions that want mounts on `host`.
    pub fn sessions_on(&self, host: &str) -> Vec<u64> {
        self.by_host
            .lock()
            .get(host)
            .map(|ids| ids.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Ends a session; its job instance is destroyed unless `keep` (a failed stage-out keeps
    /// the data for the user to recover).
    pub async fn end_session(
        &self,
        id: u64,
        keep: bool,
        state: SessionState,
    ) -> MResult<SessionRow> {
        let s = self.session(id).await?;
        if s.state != SessionState::Active.as_str() {
            return Ok(s);
        }
        let mut state = state;
        let mut keep = keep;
        // A cache instance whose journal still holds changes keeps them: they are the only
        // copy of data a job was told was written (`surge stage drain` finishes it).
        if let (Some(inst), false) = (s.job_instance, keep) {
            if let Ok(row) = self.instance(inst, "").await {
                match self.undrained(&row).await {
                    None | Some(Ok(0)) => {}
                    Some(Ok(n)) => {
                        warn!(
                            "session {id}: cache instance {inst} has {n} change(s) not yet on \
                             its PFS directory: kept (finish with `surge stage drain --instance \
                             {inst}`)"
                        );
                        (keep, state) = (true, SessionState::DrainPending);
                    }
                    Some(Err(e)) => {
                        warn!(
                            "session {id}: cannot tell whether cache instance {inst} is drained \
                             ({e}): kept"
                        );
                        (keep, state) = (true, SessionState::DrainPending);
                    }
                }
            }
        }
        if let (Some(inst), false) = (s.job_instance, keep) {
            match self.destroy_instance(inst, "", Some(id)).await {
                Ok(()) | Err(ManagerError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        self.store.end_session(id, state.as_str()).await?;
        let s = self.session(id).await?;
        self.index_hosts(&s.hosts, &s);
        // Nobody listening (a manager without stage tasks) is fine.
        let _ = self.ended.send(id);
        Ok(s)
    }
}

/// The state a client asks to end session `id` in (`EndSession.state`; empty: ended).
pub fn requested_end(id: u64, state: &str) -> MResult<SessionState> {
    if state.is_empty() {
        return Ok(SessionState::Ended);
    }
    SessionState::parse(state)
        .filter(|s| s.ends_by_request())
        .ok_or_else(|| {
            ManagerError::Invalid(format!(
                "session {id}: '{state}' is not a state a session can be ended in (ended, \
                 failed, cancelled, stage-out-failed, abandoned)"
            ))
        })
}

impl Core {
    /// Changes of a cache instance not yet drained to its PFS directory (`None`: not a cache
    /// instance; an error: its metadata server did not answer within 10 s).
    pub async fn undrained(&self, inst: &InstanceRow) -> Option<Result<u64, String>> {
        inst.descriptor.cache_pfs.as_ref()?;
        let client = match surge_client::InstanceClient::with_options(
            inst.descriptor.clone(),
            NamespaceId(0),
            self.admin_token(),
            surge_client::ClientOptions {
                deadline: Some(std::time::Duration::from_secs(10)),
                ..Default::default()
            },
        ) {
            Ok(c) => c,
            Err(e) => return Some(Err(e.to_string())),
        };
        Some(
            client
                .drain_poll(0, 0)
                .await
                .map(|(_, pending, _)| pending)
                .map_err(|e| e.to_string()),
        )
    }
}

/// A namespace index for a node of a session (private: one per node; ldbalance: the node's
/// replica, spread round-robin; striped: all on 0).
pub fn namespace_for(inst: &InstanceRow, node: u32) -> NamespaceId {
    if inst.access_mode == "private" || inst.access_mode == "ldbalance" {
        NamespaceId(node % inst.descriptor.namespaces.len().max(1) as u32)
    } else {
        NamespaceId(0)
    }
}

/// Starts the collection of orphaned instances: at once, then every `every`.
pub fn spawn_orphan_collection(core: Arc<Core>, every: std::time::Duration) {
    tokio::spawn(async move {
        loop {
            core.collect_orphans().await;
            tokio::time::sleep(every).await;
        }
    });
}

/// Starts the retention: what ended more than `days` ago is forgotten, at start and every
/// hour (0 days: kept forever).
pub fn spawn_retention(core: Arc<Core>, days: f64) {
    if days <= 0.0 {
        return;
    }
    tokio::spawn(async move {
        loop {
            match core.prune(days).await {
                Ok((0, _)) => {}
                Ok((s, t)) => info!(
                    "retention: forgot {s} session(s) and {t} stage task(s) ended more than \
                     {days} day(s) ago"
                ),
                Err(e) => warn!("retention: {e}"),
            }
            tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
        }
    });
}

/// Starts the periodic liveness checks.
pub fn spawn_liveness(core: Arc<Core>, every: std::time::Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            core.check_liveness().await;
        }
    });
}

/// The external id of a session `surge run` (process `pid` on `host`) owns:
/// "run:<host>:<pid>:<start>", the start time telling a reused pid apart.
pub fn run_external_id(host: &str, pid: u32) -> String {
    format!("run:{host}:{pid}:{}", process_start(pid).unwrap_or(0))
}

/// When process `pid` started (clock ticks after boot, /proc/PID/stat field 22).
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count fields after its closing paren.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// True when the `surge run` a session's external id names is known to be gone: it ran on
/// `host` (this one) and no process with its pid and start time exists. Sessions of other
/// hosts or of workload managers are never judged here.
pub fn run_is_gone(external: &str, host: &str) -> bool {
    let mut f = external.splitn(4, ':');
    if f.next() != Some("run") || f.next() != Some(host) {
        return false;
    }
    let (Some(Ok(pid)), Some(Ok(start))) = (
        f.next().map(str::parse::<u32>),
        f.next().map(str::parse::<u64>),
    ) else {
        return false;
    };
    process_start(pid) != Some(start)
}

impl Core {
    /// Ends the active sessions whose `surge run` died without ending them (kill -9, a crash,
    /// a lost manager): their job instance is destroyed, unless the session's stage-out had
    /// failed (then it is kept, with the state saying why). Returns what it ended.
    pub async fn reconcile(&self, host: &str) -> Vec<(u64, String)> {
        let sessions = match self.active_sessions(false).await {
            Ok(s) => s,
            Err(e) => {
                warn!("reconcile: {e}");
                return Vec::new();
            }
        };
        let mut ended = Vec::new();
        for s in sessions {
            let Some(ext) = s.external.as_deref() else {
                continue;
            };
            if !run_is_gone(ext, host) {
                continue;
            }
            let keep = s.phase == "data_out_failed";
            let state = if keep {
                SessionState::StageOutFailed
            } else {
                SessionState::Abandoned
            };
            match self.end_session(s.id, keep, state).await {
                Ok(_) => {
                    warn!(
                        "session {} ({}): its surge run ({ext}) is gone: ended ({state}{})",
                        s.id,
                        s.job,
                        if keep { ", job instance kept" } else { "" }
                    );
                    ended.push((s.id, state.to_string()));
                }
                Err(e) => warn!(
                    "session {}: its surge run is gone, but ending it failed: {e}",
                    s.id
                ),
            }
        }
        ended
    }
}

/// Reconciles at start and then every `every`.
pub fn spawn_reconcile(core: Arc<Core>, every: std::time::Duration) {
    let host = surge_core::sys::hostname();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            core.reconcile(&host).await;
        }
    });
}

/// Removes `.surge-through` from the PFS directory `pfs` of a destroyed cache instance (the
/// written-through and fill names, extra links once the instance is gone), with the rights of
/// its owner `uid`/`gid` (a manager running as root acts as the owner: it removes nothing the
/// owner could not). Whoever destroys it (a Slurm teardown runs as SlurmUser) need not be
/// able to. A PFS not mounted here, or a failure, is logged and left: no data is lost.
fn clear_through_as_owner(pfs: &Path, uid: u32, gid: u32) {
    let through = pfs.join(surge_stage::drain::THROUGH_DIR);
    if !pfs.is_dir() {
        info!(
            "{} is not reachable from the manager's host: {} stays (extra names; remove it \
             as the owner)",
            pfs.display(),
            through.display()
        );
        return;
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let clear = || surge_stage::drain::clear_through(pfs).map_err(std::io::Error::other);
    let r = if me == uid {
        clear()
    } else {
        let owner = surge_auth::Caller::of(uid, gid);
        surge_core::sys::as_fs_user(uid, gid, &owner.groups, clear)
    };
    match r {
        Ok(()) => info!(
            "{} removed (the destroyed cache's written-through names)",
            through.display()
        ),
        Err(e) => warn!(
            "{}: {e} (as uid {uid}); it stays: remove it as the owner (extra names of files \
             that have their own)",
            through.display()
        ),
    }
}
