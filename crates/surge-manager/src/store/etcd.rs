//! The etcd engine of the manager's state, for a cluster: several `surge manager` processes
//! share one etcd (Debian's `etcd-server`, three or five members), one of them leads.
//!
//! **Leadership.** A manager becomes leader by creating `<prefix>leader` attached to a lease
//! of its own (a transaction that succeeds only if the key does not exist), keeps the lease
//! alive, and stops the moment it cannot ([`Leadership::lost`]: the process exits and a
//! standby takes over once the lease expires). **Fencing**: every write is a transaction
//! whose first condition is that `<prefix>leader` still has the create revision this manager
//! made it with, so a manager that lost its lease (paused, cut off) cannot write anything,
//! and two managers can never both allocate: no double allocation by construction.
//!
//! **Layout** (values are JSON rows, ids zero-padded so keys sort as numbers):
//! ```text
//! pools/<name>  servers/<id>  peaks/server/<id>  peaks/pool/<pool>/<servers>
//! instances/<id>            {row, session}; persistent/<name> -> id
//! sessions/<id>             the session row; sessions-open/<id> while creating or active;
//!                           sessions-external/<external> -> newest id
//! stages/<id>               the task row; stages-session/<session>/<id>;
//!                           stages-open/<id> while deferred, queued or running
//! ids/<table>               the next id of instances, sessions, stages
//! ```
//! Every change of a row and its index keys is one transaction.
//!
//! **Reads** cost no round trip on the leader: it keeps a copy of what it wrote ([`cache`]),
//! used only while its lease is known to be alive (renewed less than `LEASE_TTL - 1` s ago),
//! so a paused leader that wakes up asks etcd until it learns it lost the lead.
//!
//! **TLS.** With `https://` endpoints the manager verifies the members' certificates against
//! the site CA and presents its own client certificate when it has one ([`EtcdTls`];
//! docs/SECURITY.md, "The manager's etcd"): keys, rows and the leader record never cross the
//! network in clear. Before campaigning, [`EtcdStore::connect`] asks every member for its
//! status, so a member it cannot reach or trust is named with the reason at start, not met
//! later as a stalled request.

mod cache;
use cache::{Cache, Change};

use super::{
    is_ended, now, InstanceRow, PeaksRow, PoolRow, QuotaRow, SResult, ServerRow, SessionRow,
    StageRow, StageTotal, StoreError,
};
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, KvClient,
    PutOptions, TlsOptions, Txn, TxnOp,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};
use surge_api::{InstanceState, SessionState};
use surge_proto::InstanceDescriptor;
use tracing::{info, warn};

/// How long a leader's lease lasts without a renewal: how long a standby waits after the
/// leader dies (kill -9, a lost host) before it takes over.
pub const LEASE_TTL: i64 = 3;

/// Keys read per range request when a listing walks a prefix.
const PAGE: i64 = 1000;

fn etcd(e: etcd_client::Error) -> StoreError {
    StoreError::Etcd(e.to_string())
}

/// An error with its causes (a TLS failure is several sources below "transport error").
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// TLS to the members (`https://` endpoints), as PEM text.
#[derive(Clone)]
pub struct EtcdTls {
    /// The CA that signed the members' certificates (the site CA): the only one trusted.
    pub ca: String,
    /// This manager's certificate and key, for members that ask their clients for one
    /// (`etcd --client-cert-auth`).
    pub identity: Option<(String, String)>,
}

impl EtcdTls {
    fn options(&self) -> TlsOptions {
        let o = TlsOptions::new().ca_certificate(Certificate::from_pem(&self.ca));
        match &self.identity {
            Some((cert, key)) => o.identity(Identity::from_pem(cert, key)),
            None => o,
        }
    }
}

/// An instance as kept in etcd: the row and the session whose job instance it is.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct InstanceRec {
    row: InstanceRow,
    /// `None` while the servers have not been planned (the SQLite engine's `'null'`).
    planned: bool,
    session: Option<u64>,
}

/// What the leader key says: who leads and where its APIs are.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LeaderInfo {
    pub name: String,
    pub pid: u32,
    pub grpc: Vec<String>,
    pub http: Option<String>,
    /// Seconds since the epoch when it took over.
    pub since: i64,
}

/// This manager's hold on the leadership: the lease kept alive in the background, and what
/// every write checks.
pub struct Leadership {
    pub lease: i64,
    /// The create revision of the leader key: the fence.
    pub revision: i64,
    /// Resolves when the lease could not be renewed (leadership is gone).
    pub lost: tokio::sync::watch::Receiver<bool>,
}

pub struct EtcdStore {
    client: Client,
    prefix: String,
    /// The fence every write carries (set once this manager leads).
    fence: Mutex<Option<(String, i64)>>,
    /// Next ids, read at takeover and advanced by this (the only writing) manager.
    ids: tokio::sync::Mutex<()>,
    /// The leader's copy of its state (see [`cache`]); filled at takeover.
    cache: Arc<Mutex<Cache>>,
    /// When the last lease renewal that etcd acknowledged was sent, and whether the cache
    /// has been filled: reads use the cache only while both hold.
    renewed: Arc<Mutex<Option<Instant>>>,
    warm: std::sync::atomic::AtomicBool,
}

impl Change {
    fn op(&self) -> TxnOp {
        match self {
            Change::Put(k, v) => TxnOp::put(k.as_str(), v.clone(), None),
            Change::Delete(k) => TxnOp::delete(k.as_str(), None),
            Change::DeletePrefix(k) => TxnOp::delete(
                k.as_str(),
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            ),
        }
    }
}

fn id_key(id: u64) -> String {
    format!("{id:020}")
}

impl EtcdStore {
    /// Connects to the etcd members at `endpoints` (`http://host:port`, or `https://` with
    /// `tls`; comma-separated in the flag), with every key under `prefix` (e.g. `/surge/`).
    /// Fails, naming each member and why, when no member answers.
    pub async fn connect(
        endpoints: &[String],
        prefix: &str,
        tls: Option<&EtcdTls>,
    ) -> SResult<EtcdStore> {
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(10))
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2));
        if let Some(t) = tls {
            opts = opts.with_tls(t.options());
        }
        Self::check_members(endpoints, &opts, tls).await?;
        let client = Client::connect(endpoints, Some(opts)).await.map_err(|e| {
            StoreError::Etcd(format!(
                "cannot connect to {}: {}",
                endpoints.join(","),
                chain(&e)
            ))
        })?;
        let mut prefix = prefix.to_string();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        Ok(EtcdStore {
            client,
            prefix,
            fence: Mutex::new(None),
            ids: tokio::sync::Mutex::new(()),
            cache: Arc::new(Mutex::new(Cache::default())),
            renewed: Arc::new(Mutex::new(None)),
            warm: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Asks each member for its status: one that does not answer (down, or a TLS handshake
    /// either side refused) is logged with the reason; none answering is an error naming them
    /// all. The balanced client used afterwards hides which member failed and why.
    async fn check_members(
        endpoints: &[String],
        opts: &ConnectOptions,
        tls: Option<&EtcdTls>,
    ) -> SResult<()> {
        let mut failed = Vec::new();
        for e in endpoints {
            let status = async {
                let mut c = Client::connect([e.as_str()], Some(opts.clone())).await?;
                c.status().await
            };
            let why = match tokio::time::timeout(Duration::from_secs(10), status).await {
                Ok(Ok(_)) => continue,
                Ok(Err(err)) => chain(&err),
                Err(_) => "no answer within 10 s".to_string(),
            };
            // In TLS 1.3 the client's certificate is checked after the client has finished
            // its handshake: a member that refuses it just closes the connection.
            let why = match tls.map(|t| t.identity.is_some()) {
                Some(true) if !why.contains("ertificate") => format!(
                    "{why} (a TLS member closes the connection of a client whose certificate \
                     it refuses: is --etcd-cert signed by the CA the members trust?)"
                ),
                Some(false) if !why.contains("ertificate") => format!(
                    "{why} (a TLS member started with --client-cert-auth closes the connection \
                     of a client without a certificate: --etcd-cert)"
                ),
                _ => why,
            };
            warn!("etcd member {e} does not answer: {why}");
            failed.push(format!("{e}: {why}"));
        }
        if failed.len() == endpoints.len() {
            return Err(StoreError::Etcd(format!(
                "no etcd member answers ({})",
                failed.join("; ")
            )));
        }
        Ok(())
    }

    fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    fn kv(&self) -> KvClient {
        self.client.kv_client()
    }

    /// Who leads now, if anyone (asked of etcd, never of the cache).
    pub async fn leader(&self) -> SResult<Option<LeaderInfo>> {
        let key = self.key("leader");
        let r = self.kv().get(key.as_str(), None).await.map_err(etcd)?;
        decode(&key, r.kvs().first().map(|kv| kv.value()))
    }

    /// True while reads may be answered from the cache: it is filled, and the lease was
    /// renewed recently enough that no other manager can have taken over.
    fn fresh(&self) -> bool {
        let margin = Duration::from_millis(LEASE_TTL as u64 * 1000 - 1000);
        self.warm.load(std::sync::atomic::Ordering::Acquire)
            && self.renewed.lock().is_some_and(|t| t.elapsed() < margin)
    }

    /// Fills the cache with the live state (every prefix of [`cache::WHOLE`], then the rows
    /// of the open sessions and tasks); called once on taking the lead, before serving.
    async fn warm_up(&self) -> SResult<()> {
        for w in cache::WHOLE {
            let prefix = self.key(w);
            let (rows, revision) = self.range_etcd(&prefix, false).await?;
            self.cache.lock().load(&prefix, rows, revision);
        }
        self.warm.store(true, std::sync::atomic::Ordering::Release);
        for id in self.index(&self.key("sessions-open/")).await? {
            self.get_raw(&self.session_key(id)).await?;
        }
        for id in self.index(&self.key("stages-open/")).await? {
            self.get_raw(&self.stage_key(id)).await?;
        }
        Ok(())
    }

    /// Waits until this manager leads (a standby waits here while another leads), then keeps
    /// its lease alive in the background. Every write from then on is fenced.
    pub async fn campaign(&self, me: &LeaderInfo) -> SResult<Leadership> {
        let leader_key = self.key("leader");
        let mut lease_client = self.client.lease_client();
        let mut announced = false;
        loop {
            let granted_at = Instant::now();
            let lease = lease_client
                .grant(LEASE_TTL, None)
                .await
                .map_err(etcd)?
                .id();
            let value = serde_json::to_vec(me).map_err(|e| StoreError::Etcd(e.to_string()))?;
            let txn = Txn::new()
                .when([Compare::create_revision(
                    leader_key.clone(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then([TxnOp::put(
                    leader_key.clone(),
                    value,
                    Some(PutOptions::new().with_lease(lease)),
                )]);
            let r = self.kv().txn(txn).await.map_err(etcd)?;
            if r.succeeded() {
                let got = self
                    .kv()
                    .get(leader_key.clone(), None)
                    .await
                    .map_err(etcd)?;
                let revision = got
                    .kvs()
                    .first()
                    .filter(|kv| kv.lease() == lease)
                    .map(|kv| kv.create_revision())
                    .ok_or_else(|| StoreError::NotLeader("the leader key vanished".into()))?;
                *self.fence.lock() = Some((leader_key.clone(), revision));
                *self.renewed.lock() = Some(granted_at);
                let (mut keeper, mut stream) =
                    lease_client.keep_alive(lease).await.map_err(etcd)?;
                let (tx, lost) = tokio::sync::watch::channel(false);
                let renewed = self.renewed.clone();
                tokio::spawn(async move {
                    // Renew at a third of the TTL; a failed or refused renewal ends the reign.
                    let every = Duration::from_millis((LEASE_TTL as u64 * 1000) / 3);
                    loop {
                        tokio::time::sleep(every).await;
                        let sent = Instant::now();
                        let renewal = async {
                            keeper.keep_alive().await?;
                            stream.message().await
                        };
                        match tokio::time::timeout(every, renewal).await {
                            Ok(Ok(Some(r))) if r.ttl() > 0 => *renewed.lock() = Some(sent),
                            other => {
                                *renewed.lock() = None;
                                warn!("leadership lease not renewed ({other:?}): stepping down");
                                let _ = tx.send(true);
                                return;
                            }
                        }
                    }
                });
                self.warm_up().await?;
                info!("leading (lease {lease:x}, fence revision {revision})");
                return Ok(Leadership {
                    lease,
                    revision,
                    lost,
                });
            }
            // Someone leads: wait for its key to go (its lease expires or it resigns).
            let _ = lease_client.revoke(lease).await;
            if !announced {
                if let Ok(Some(l)) = self.leader().await {
                    info!(
                        "standing by: {} (pid {}) leads at {}",
                        l.name,
                        l.pid,
                        l.grpc.join(",")
                    );
                }
                announced = true;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Updates the leader record with where this leader serves (fenced, on its lease).
    pub async fn announce(&self, me: &LeaderInfo, l: &Leadership) -> SResult<()> {
        let key = self.key("leader");
        let value = serde_json::to_vec(me).map_err(|e| StoreError::Etcd(e.to_string()))?;
        let op = TxnOp::put(key, value, Some(PutOptions::new().with_lease(l.lease)));
        self.commit(vec![op], Vec::new()).await
    }

    // --- reading ---

    /// The value of `key`: from the cache while it is fresh and knows the key, else from
    /// etcd (and then learnt, if the key is a loose one).
    async fn get_raw(&self, key: &str) -> SResult<Option<Vec<u8>>> {
        let fresh = self.fresh();
        if fresh {
            if let Some(v) = self.cache.lock().get(key) {
                return Ok(v);
            }
        }
        let r = self.kv().get(key, None).await.map_err(etcd)?;
        let value = r.kvs().first().map(|kv| kv.value().to_vec());
        if let (true, Some(h)) = (fresh, r.header()) {
            self.cache
                .lock()
                .learn_read(key, h.revision(), value.clone());
        }
        Ok(value)
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, key: &str) -> SResult<Option<T>> {
        let v = self.get_raw(key).await?;
        decode(key, v.as_deref())
    }

    async fn exists(&self, key: &str) -> SResult<bool> {
        Ok(self.get_raw(key).await?.is_some())
    }

    /// Every (key, value) under `prefix`, in key order: from the cache if it holds the prefix
    /// whole, else from etcd a page at a time.
    async fn range(&self, prefix: &str, keys_only: bool) -> SResult<Vec<(String, Vec<u8>)>> {
        if self.fresh() {
            if let Some(rows) = self.cache.lock().range(prefix) {
                return Ok(rows);
            }
        }
        Ok(self.range_etcd(prefix, keys_only).await?.0)
    }

    /// [`Self::range`] read from etcd, with the revision of its first page.
    async fn range_etcd(
        &self,
        prefix: &str,
        keys_only: bool,
    ) -> SResult<(Vec<(String, Vec<u8>)>, i64)> {
        let end = prefix_end(prefix);
        let mut from = prefix.to_string();
        let mut out = Vec::new();
        let mut revision = None;
        loop {
            let mut o = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
            if keys_only {
                o = o.with_keys_only();
            }
            let r = self.kv().get(from.clone(), Some(o)).await.map_err(etcd)?;
            if revision.is_none() {
                revision = r.header().map(|h| h.revision());
            }
            for kv in r.kvs() {
                out.push((
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    kv.value().to_vec(),
                ));
            }
            if !r.more() {
                break;
            }
            match out.last() {
                Some((k, _)) => from = format!("{k}\0"),
                None => break,
            }
        }
        Ok((out, revision.unwrap_or(0)))
    }

    async fn list<T: serde::de::DeserializeOwned>(&self, prefix: &str) -> SResult<Vec<T>> {
        self.range(prefix, false)
            .await?
            .into_iter()
            .map(|(k, v)| {
                serde_json::from_slice(&v).map_err(|e| StoreError::Corrupt {
                    key: k,
                    error: e.to_string(),
                })
            })
            .collect()
    }

    /// The ids under an index prefix (`sessions-open/`, ...): the last path component.
    async fn index(&self, prefix: &str) -> SResult<Vec<u64>> {
        Ok(self
            .range(prefix, true)
            .await?
            .into_iter()
            .filter_map(|(k, _)| k.rsplit('/').next().and_then(|i| i.parse().ok()))
            .collect())
    }

    // --- writing ---

    /// Applies `changes` in one transaction, if this manager still leads.
    async fn write(&self, changes: Vec<Change>) -> SResult<()> {
        let ops = changes.iter().map(Change::op).collect();
        self.commit(ops, changes).await
    }

    /// Commits `ops` fenced on the leader key, then records `changes` (what `ops` did to
    /// cached keys) in the cache. Runs as its own task: a caller that gives up (a client
    /// that hung up) cannot leave a committed write out of the cache.
    async fn commit(&self, ops: Vec<TxnOp>, changes: Vec<Change>) -> SResult<()> {
        let fence = self.fence.lock().clone();
        let Some((key, rev)) = fence else {
            return Err(StoreError::NotLeader(
                "this manager has not (or no longer) taken the lead".into(),
            ));
        };
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, rev)])
            .and_then(ops);
        let mut kv = self.kv();
        let cache = self.cache.clone();
        let succeeded = tokio::spawn(async move {
            let r = kv.txn(txn).await?;
            if let (true, Some(h)) = (r.succeeded(), r.header()) {
                cache.lock().apply(&changes, h.revision());
            }
            Ok::<_, etcd_client::Error>(r.succeeded())
        })
        .await
        .map_err(|e| StoreError::Etcd(format!("a write's task ended: {e}")))?
        .map_err(etcd)?;
        if !succeeded {
            *self.fence.lock() = None;
            return Err(StoreError::NotLeader(
                "another manager holds the leader key".into(),
            ));
        }
        Ok(())
    }

    fn put<T: Serialize>(&self, key: &str, v: &T) -> SResult<Change> {
        let bytes = serde_json::to_vec(v).map_err(|e| StoreError::Corrupt {
            key: key.to_string(),
            error: e.to_string(),
        })?;
        Ok(Change::Put(key.to_string(), bytes))
    }

    /// The next id of `table` (`instances`, `sessions`, `stages`) and the change that records
    /// it; call under `self.ids`. A fresh cluster starts instance ids at a random offset (ids
    /// name fragments on servers, which outlive a lost state).
    async fn next_id(&self, table: &str) -> SResult<(u64, Change)> {
        let key = self.key(&format!("ids/{table}"));
        let next = match self.get_json::<u64>(&key).await? {
            Some(n) => n,
            None if table == "instances" => {
                u64::from(u32::from_le_bytes(surge_core::sys::random_bytes()) >> 1) + 1
            }
            None => 1,
        };
        let op = self.put(&key, &(next + 1))?;
        Ok((next, op))
    }

    // --- pools ---

    pub async fn upsert_pool(&self, name: &str, granularity: u64) -> SResult<PoolRow> {
        let key = self.key(&format!("pools/{name}"));
        let row = match self.get_json::<PoolRow>(&key).await? {
            Some(mut p) => {
                p.granularity = granularity;
                p
            }
            None => PoolRow {
                name: name.to_string(),
                granularity,
                created: now(),
            },
        };
        self.write(vec![self.put(&key, &row)?]).await?;
        Ok(row)
    }

    pub async fn pool(&self, name: &str) -> SResult<Option<PoolRow>> {
        self.get_json(&self.key(&format!("pools/{name}"))).await
    }

    pub async fn pools(&self) -> SResult<Vec<PoolRow>> {
        self.list(&self.key("pools/")).await
    }

    // --- servers ---

    pub async fn upsert_server(&self, s: &ServerRow) -> SResult<()> {
        let key = self.key(&format!("servers/{}", s.id));
        self.write(vec![self.put(&key, s)?]).await
    }

    pub async fn set_server_state(
        &self,
        id: &str,
        state: &str,
        last_seen: Option<i64>,
    ) -> SResult<()> {
        let key = self.key(&format!("servers/{id}"));
        let Some(mut s) = self.get_json::<ServerRow>(&key).await? else {
            return Ok(());
        };
        s.state = state.to_string();
        if let Some(t) = last_seen {
            s.last_seen = t;
        }
        self.write(vec![self.put(&key, &s)?]).await
    }

    pub async fn servers(&self) -> SResult<Vec<ServerRow>> {
        let mut v: Vec<ServerRow> = self.list(&self.key("servers/")).await?;
        v.sort_by(|a, b| (&a.pool, &a.id).cmp(&(&b.pool, &b.id)));
        Ok(v)
    }

    // --- calibrated peaks ---

    pub async fn set_server_peaks(
        &self,
        server: &str,
        peaks: &surge_core::peaks::Peaks,
        source: &str,
    ) -> SResult<()> {
        let row = PeaksRow {
            key: server.to_string(),
            peaks: peaks.clone(),
            source: source.to_string(),
            registered: now(),
            servers: 1,
        };
        let key = self.key(&format!("peaks/server/{server}"));
        self.write(vec![self.put(&key, &row)?]).await
    }

    pub async fn set_pool_peaks(
        &self,
        pool: &str,
        servers: u32,
        peaks: &surge_core::peaks::Peaks,
        source: &str,
    ) -> SResult<()> {
        let row = PeaksRow {
            key: pool.to_string(),
            peaks: peaks.clone(),
            source: source.to_string(),
            registered: now(),
            servers,
        };
        let key = self.key(&format!("peaks/pool/{pool}/{servers:010}"));
        self.write(vec![self.put(&key, &row)?]).await
    }

    pub async fn server_peaks(&self) -> SResult<Vec<PeaksRow>> {
        self.list(&self.key("peaks/server/")).await
    }

    pub async fn pool_peaks(&self) -> SResult<Vec<PeaksRow>> {
        self.list(&self.key("peaks/pool/")).await
    }

    // --- instances ---

    fn instance_key(&self, id: u64) -> String {
        self.key(&format!("instances/{}", id_key(id)))
    }

    async fn instance_rec(&self, id: u64) -> SResult<Option<InstanceRec>> {
        self.get_json(&self.instance_key(id)).await
    }

    async fn instance_recs(&self) -> SResult<Vec<InstanceRec>> {
        self.list(&self.key("instances/")).await
    }

    pub async fn new_instance_id(&self, row: &InstanceRow, session: Option<u64>) -> SResult<u64> {
        let _one = self.ids.lock().await;
        let (id, next) = self.next_id("instances").await?;
        let mut r = row.clone();
        r.id = id;
        r.state = InstanceState::Creating.as_str().into();
        r.created = now();
        let rec = InstanceRec {
            row: r,
            planned: false,
            session,
        };
        let mut ops = vec![next, self.put(&self.instance_key(id), &rec)?];
        if let Some(name) = &row.persistent_name {
            let pkey = self.key(&format!("persistent/{name}"));
            if self.exists(&pkey).await? {
                return Err(StoreError::Etcd(format!(
                    "a persistent instance named '{name}' exists"
                )));
            }
            ops.push(self.put(&pkey, &id)?);
        }
        self.write(ops).await?;
        Ok(id)
    }

    async fn update_instance(
        &self,
        id: u64,
        f: impl FnOnce(&mut InstanceRec) -> bool,
    ) -> SResult<()> {
        let Some(mut rec) = self.instance_rec(id).await? else {
            return Ok(());
        };
        if !f(&mut rec) {
            return Ok(());
        }
        self.write(vec![self.put(&self.instance_key(id), &rec)?])
            .await
    }

    pub async fn plan_instance(
        &self,
        id: u64,
        name: &str,
        planned: &InstanceDescriptor,
    ) -> SResult<()> {
        self.update_instance(id, |r| {
            if r.row.state != "creating" {
                return false;
            }
            r.row.name = name.to_string();
            r.row.descriptor = planned.clone();
            r.planned = true;
            true
        })
        .await
    }

    pub async fn finish_instance(
        &self,
        id: u64,
        name: &str,
        desc: &InstanceDescriptor,
    ) -> SResult<()> {
        self.update_instance(id, |r| {
            r.row.state = InstanceState::Active.as_str().into();
            r.row.name = name.to_string();
            r.row.descriptor = desc.clone();
            r.planned = true;
            true
        })
        .await
    }

    pub async fn update_descriptor(&self, id: u64, desc: &InstanceDescriptor) -> SResult<()> {
        self.update_instance(id, |r| {
            r.row.descriptor = desc.clone();
            true
        })
        .await
    }

    pub async fn delete_instance(&self, id: u64) -> SResult<()> {
        let Some(rec) = self.instance_rec(id).await? else {
            return Ok(());
        };
        let mut ops = vec![Change::Delete(self.instance_key(id))];
        if let Some(name) = &rec.row.persistent_name {
            ops.push(Change::Delete(self.key(&format!("persistent/{name}"))));
        }
        self.write(ops).await
    }

    pub async fn instance(&self, id: u64) -> SResult<Option<InstanceRow>> {
        Ok(self
            .instance_rec(id)
            .await?
            .filter(|r| r.row.state == InstanceState::Active.as_str())
            .map(|r| r.row))
    }

    pub async fn persistent(&self, name: &str) -> SResult<Option<InstanceRow>> {
        match self
            .get_json::<u64>(&self.key(&format!("persistent/{name}")))
            .await?
        {
            Some(id) => self.instance(id).await,
            None => Ok(None),
        }
    }

    pub async fn persistent_name_taken(&self, name: &str) -> SResult<bool> {
        self.exists(&self.key(&format!("persistent/{name}"))).await
    }

    pub async fn instances(&self) -> SResult<Vec<InstanceRow>> {
        Ok(self
            .instance_recs()
            .await?
            .into_iter()
            .filter(|r| r.row.state == InstanceState::Active.as_str())
            .map(|r| r.row)
            .collect())
    }

    pub async fn instance_ids(&self) -> SResult<Vec<u64>> {
        self.index(&self.key("instances/")).await
    }

    pub async fn reserving_instances(&self) -> SResult<Vec<InstanceRow>> {
        Ok(self
            .instance_recs()
            .await?
            .into_iter()
            .filter(|r| r.planned)
            .map(|r| r.row)
            .collect())
    }

    pub async fn recover_interrupted_setups(&self) -> SResult<(Vec<u64>, Vec<u64>)> {
        let mut failed = Vec::new();
        for sid in self.index(&self.key("sessions-open/")).await? {
            if let Some(mut s) = self.session_row(sid).await? {
                if s.state == SessionState::Creating.as_str() {
                    s.state = SessionState::Failed.as_str().into();
                    s.ended = now();
                    self.put_session(&s, false).await?;
                    failed.push(sid);
                }
            }
        }
        let mut orphans = Vec::new();
        for rec in self.instance_recs().await? {
            let id = rec.row.id;
            let cut =
                rec.row.state == "creating" || rec.session.is_some_and(|s| failed.contains(&s));
            if !cut && rec.row.state != "orphaned" {
                continue;
            }
            if !rec.planned {
                self.delete_instance(id).await?;
                continue;
            }
            self.update_instance(id, |r| {
                r.row.state = InstanceState::Orphaned.as_str().into();
                true
            })
            .await?;
            orphans.push(id);
        }
        Ok((failed, orphans))
    }

    pub async fn orphaned_instances(&self) -> SResult<Vec<InstanceRow>> {
        Ok(self
            .instance_recs()
            .await?
            .into_iter()
            .filter(|r| r.row.state == "orphaned")
            .map(|r| r.row)
            .collect())
    }

    pub async fn orphan_instance(&self, id: u64) -> SResult<()> {
        self.update_instance(id, |r| {
            r.row.state = InstanceState::Orphaned.as_str().into();
            true
        })
        .await
    }

    // --- sessions ---

    fn session_key(&self, id: u64) -> String {
        self.key(&format!("sessions/{}", id_key(id)))
    }

    async fn session_row(&self, id: u64) -> SResult<Option<SessionRow>> {
        self.get_json(&self.session_key(id)).await
    }

    /// Writes a session and its open index (`external`: also point its job id at it).
    async fn put_session(&self, s: &SessionRow, external: bool) -> SResult<()> {
        let open = self.key(&format!("sessions-open/{}", id_key(s.id)));
        let mut ops = vec![self.put(&self.session_key(s.id), s)?];
        if matches!(s.state.as_str(), "creating" | "active") {
            ops.push(Change::Put(open, Vec::new()));
        } else {
            ops.push(Change::Delete(open));
            // The retention's index: ended sessions in the order they ended.
            ops.push(Change::Put(
                self.key(&format!(
                    "sessions-ended/{:020}/{}",
                    s.ended.max(0),
                    id_key(s.id)
                )),
                Vec::new(),
            ));
        }
        if external {
            if let Some(e) = &s.external {
                ops.push(self.put(&self.key(&format!("sessions-external/{e}")), &s.id)?);
            }
        }
        self.write(ops).await
    }

    async fn update_session(
        &self,
        id: u64,
        f: impl FnOnce(&mut SessionRow) -> bool,
    ) -> SResult<()> {
        let Some(mut s) = self.session_row(id).await? else {
            return Ok(());
        };
        if !f(&mut s) {
            return Ok(());
        }
        self.put_session(&s, false).await
    }

    pub async fn create_session(
        &self,
        job: &str,
        uid: u32,
        gid: u32,
        external: Option<&str>,
    ) -> SResult<u64> {
        use surge_core::limits::{bounded, MAX_EXTERNAL_ID, MAX_JOB_NAME};
        let _one = self.ids.lock().await;
        let (id, next) = self.next_id("sessions").await?;
        let s = SessionRow {
            id,
            job: bounded(job, MAX_JOB_NAME),
            owner_uid: uid,
            owner_gid: gid,
            state: SessionState::Creating.as_str().into(),
            created: now(),
            ended: 0,
            job_instance: None,
            persistent: Vec::new(),
            external: external.map(|e| bounded(e, MAX_EXTERNAL_ID)),
            phase: String::new(),
            hosts: Vec::new(),
            mount: false,
            promise: String::new(),
        };
        let mut ops = vec![
            next,
            self.put(&self.session_key(id), &s)?,
            Change::Put(
                self.key(&format!("sessions-open/{}", id_key(id))),
                Vec::new(),
            ),
        ];
        if let Some(e) = &s.external {
            ops.push(self.put(&self.key(&format!("sessions-external/{e}")), &id)?);
        }
        self.write(ops).await?;
        Ok(id)
    }

    pub async fn session_of(&self, external: &str) -> SResult<Option<u64>> {
        self.get_json(&self.key(&format!("sessions-external/{external}")))
            .await
    }

    pub async fn set_phase(
        &self,
        session: u64,
        phase: &str,
        hosts: Option<&[String]>,
        mount: bool,
    ) -> SResult<()> {
        self.update_session(session, |s| {
            s.phase = phase.to_string();
            if let Some(h) = hosts {
                s.hosts = h.to_vec();
            }
            s.mount = mount;
            true
        })
        .await
    }

    pub async fn complete_session(
        &self,
        session: u64,
        job_instance: Option<(u64, &str)>,
        attach: &[u64],
    ) -> SResult<()> {
        self.update_session(session, |s| {
            if let Some((i, promise)) = job_instance {
                s.job_instance = Some(i);
                s.promise = promise.to_string();
            }
            for id in attach {
                if !s.persistent.contains(id) {
                    s.persistent.push(*id);
                }
            }
            s.persistent.sort_unstable();
            if s.state == SessionState::Creating.as_str() {
                s.state = SessionState::Active.as_str().into();
            }
            true
        })
        .await
    }

    pub async fn end_session(&self, session: u64, state: &str) -> SResult<()> {
        self.update_session(session, |s| {
            s.state = state.to_string();
            s.ended = now();
            true
        })
        .await
    }

    pub async fn session(&self, id: u64) -> SResult<Option<SessionRow>> {
        self.session_row(id).await
    }

    pub async fn active_sessions(&self, mounted: bool) -> SResult<Vec<SessionRow>> {
        let mut out = Vec::new();
        for id in self.index(&self.key("sessions-open/")).await? {
            if let Some(s) = self.session_row(id).await? {
                if s.state == SessionState::Active.as_str() && (!mounted || s.mount) {
                    out.push(s);
                }
            }
        }
        Ok(out)
    }

    /// Keys under `prefix` below `before_key` (all when `None`), newest (highest) first, at
    /// most `limit`.
    async fn range_desc(
        &self,
        prefix: &str,
        before_key: Option<String>,
        limit: i64,
    ) -> SResult<Vec<(String, Vec<u8>)>> {
        if self.fresh() {
            let c = self.cache.lock();
            if let Some(rows) = c.range_desc(prefix, before_key.as_deref(), limit.max(0) as usize) {
                return Ok(rows);
            }
        }
        let end = before_key.map_or_else(|| prefix_end(prefix), String::into_bytes);
        let o = GetOptions::new()
            .with_range(end)
            .with_sort(
                etcd_client::SortTarget::Key,
                etcd_client::SortOrder::Descend,
            )
            .with_limit(limit);
        let r = self.kv().get(prefix, Some(o)).await.map_err(etcd)?;
        Ok(r.kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    kv.value().to_vec(),
                )
            })
            .collect())
    }

    pub async fn sessions_page(
        &self,
        before: u64,
        limit: u32,
        open_only: bool,
        owner: Option<u32>,
    ) -> SResult<Vec<SessionRow>> {
        let (prefix, index) = if open_only {
            (self.key("sessions-open/"), true)
        } else {
            (self.key("sessions/"), false)
        };
        let mut out = Vec::new();
        let mut cursor = (before > 0).then(|| format!("{prefix}{}", id_key(before)));
        // Another owner's sessions are skipped; a page looks at 20 times its size at most.
        let mut looked = 0usize;
        while out.len() < limit as usize && looked < 20 * limit.max(1) as usize {
            let batch = self
                .range_desc(&prefix, cursor.clone(), i64::from(limit.max(1)))
                .await?;
            if batch.is_empty() {
                break;
            }
            cursor = batch.last().map(|(k, _)| k.clone());
            looked += batch.len();
            for (k, v) in batch {
                let s: SessionRow = if index {
                    let Some(id) = k.rsplit('/').next().and_then(|i| i.parse().ok()) else {
                        continue;
                    };
                    match self.session_row(id).await? {
                        Some(s) => s,
                        None => continue,
                    }
                } else {
                    serde_json::from_slice(&v).map_err(|e| StoreError::Corrupt {
                        key: k.clone(),
                        error: e.to_string(),
                    })?
                };
                if owner.is_none_or(|o| o == s.owner_uid) && out.len() < limit as usize {
                    out.push(s);
                }
            }
        }
        Ok(out)
    }

    pub async fn stages_page(
        &self,
        session: u64,
        before: u64,
        limit: u32,
    ) -> SResult<Vec<StageRow>> {
        if session == 0 {
            let prefix = self.key("stages/");
            let cursor = (before > 0).then(|| format!("{prefix}{}", id_key(before)));
            return self
                .range_desc(&prefix, cursor, i64::from(limit))
                .await?
                .into_iter()
                .map(|(k, v)| {
                    serde_json::from_slice(&v).map_err(|e| StoreError::Corrupt {
                        key: k,
                        error: e.to_string(),
                    })
                })
                .collect();
        }
        let prefix = self.key(&format!("stages-session/{}/", id_key(session)));
        let cursor = (before > 0).then(|| format!("{prefix}{}", id_key(before)));
        let mut out = Vec::new();
        for (k, _) in self.range_desc(&prefix, cursor, i64::from(limit)).await? {
            if let Some(id) = k.rsplit('/').next().and_then(|i| i.parse().ok()) {
                if let Some(t) = self.stage(id).await? {
                    out.push(t);
                }
            }
        }
        Ok(out)
    }

    pub async fn prune_ended(&self, ended_before: i64, max: u32) -> SResult<(u64, u64)> {
        let prefix = self.key("sessions-ended/");
        let o = GetOptions::new()
            .with_range(format!("{prefix}{:020}", ended_before.max(0)))
            .with_keys_only()
            .with_limit(i64::from(max));
        let r = self.kv().get(prefix.clone(), Some(o)).await.map_err(etcd)?;
        let (mut sessions, mut stages) = (0u64, 0u64);
        for kv in r.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let Some(id) = key.rsplit('/').next().and_then(|i| i.parse::<u64>().ok()) else {
                continue;
            };
            let mut ops = vec![Change::Delete(key.clone())];
            if let Some(s) = self.session_row(id).await? {
                if let Some(i) = s.job_instance {
                    if self.instance_rec(i).await?.is_some() {
                        continue; // its kept job instance is still there
                    }
                }
                ops.push(Change::Delete(self.session_key(id)));
                if let Some(e) = &s.external {
                    let ekey = self.key(&format!("sessions-external/{e}"));
                    if self.get_json::<u64>(&ekey).await? == Some(id) {
                        ops.push(Change::Delete(ekey));
                    }
                }
                let sp = self.key(&format!("stages-session/{}/", id_key(id)));
                // etcd takes at most 128 operations a transaction: tasks go 50 at a time.
                for chunk in self.index(&sp).await?.chunks(50) {
                    let mut del = Vec::new();
                    for t in chunk {
                        del.push(Change::Delete(self.stage_key(*t)));
                        del.push(Change::Delete(
                            self.key(&format!("stages-open/{}", id_key(*t))),
                        ));
                    }
                    self.write(del).await?;
                    stages += chunk.len() as u64;
                }
                ops.push(Change::DeletePrefix(sp));
                sessions += 1;
            }
            self.write(ops).await?;
        }
        Ok((sessions, stages))
    }

    pub async fn session_counts(&self) -> SResult<Vec<(String, u64)>> {
        let mut by: std::collections::BTreeMap<String, u64> = Default::default();
        let open = self.index(&self.key("sessions-open/")).await?;
        for id in &open {
            if let Some(s) = self.session_row(*id).await? {
                *by.entry(s.state).or_default() += 1;
            }
        }
        let all = self.key("sessions/");
        let total = self
            .kv()
            .get(
                all.clone(),
                Some(
                    GetOptions::new()
                        .with_range(prefix_end(&all))
                        .with_count_only(),
                ),
            )
            .await
            .map_err(etcd)?
            .count();
        let mut out: Vec<(String, u64)> = by.into_iter().collect();
        out.push((
            "ended".into(),
            (total as u64).saturating_sub(open.len() as u64),
        ));
        Ok(out)
    }

    pub async fn sessions_using(&self, instance: u64) -> SResult<Vec<u64>> {
        Ok(self
            .active_sessions(false)
            .await?
            .into_iter()
            .filter(|s| s.job_instance == Some(instance) || s.persistent.contains(&instance))
            .map(|s| s.id)
            .collect())
    }

    // --- stage tasks ---

    fn stage_key(&self, id: u64) -> String {
        self.key(&format!("stages/{}", id_key(id)))
    }

    async fn put_stage(&self, t: &StageRow, ops: Vec<Change>) -> SResult<()> {
        let open = self.key(&format!("stages-open/{}", id_key(t.id)));
        let mut ops = ops;
        ops.push(self.put(&self.stage_key(t.id), t)?);
        if matches!(t.state.as_str(), "deferred" | "queued" | "running") {
            ops.push(Change::Put(open, Vec::new()));
        } else {
            ops.push(Change::Delete(open));
        }
        self.write(ops).await
    }

    pub async fn create_stage(&self, t: &StageRow) -> SResult<u64> {
        let _one = self.ids.lock().await;
        let (id, next) = self.next_id("stages").await?;
        let mut row = t.clone();
        row.id = id;
        row.files_total = 0;
        row.files_done = 0;
        row.bytes_total = 0;
        row.bytes_done = 0;
        row.seconds = 0.0;
        row.failures_json = "[]".into();
        row.error = String::new();
        row.created = now();
        let by_session = Change::Put(
            self.key(&format!(
                "stages-session/{}/{}",
                id_key(row.session),
                id_key(id)
            )),
            Vec::new(),
        );
        self.put_stage(&row, vec![next, by_session]).await?;
        Ok(id)
    }

    pub async fn update_stage(&self, t: &StageRow) -> SResult<()> {
        // Only what the SQLite engine updates: progress, state and result.
        let Some(mut row) = self.stage(t.id).await? else {
            return Ok(());
        };
        let mut ops = Vec::new();
        if !is_ended(&row.state) && is_ended(&t.state) {
            let key = self.key(&format!("stage-totals/{}/{}", t.direction, t.state));
            let mut total = self
                .get_json::<StageTotal>(&key)
                .await?
                .unwrap_or(StageTotal {
                    direction: t.direction.clone(),
                    state: t.state.clone(),
                    ..StageTotal::default()
                });
            total.tasks += 1;
            total.bytes += t.bytes_done;
            total.files += t.files_done;
            ops.push(self.put(&key, &total)?);
        }
        row.state = t.state.clone();
        row.files_total = t.files_total;
        row.files_done = t.files_done;
        row.bytes_total = t.bytes_total;
        row.bytes_done = t.bytes_done;
        row.seconds = t.seconds;
        row.failures_json = t.failures_json.clone();
        row.error = t.error.clone();
        self.put_stage(&row, ops).await
    }

    pub async fn set_quota(&self, q: &QuotaRow, clear: bool) -> SResult<()> {
        let key = self.key(&format!("quotas/{}/{:010}", q.kind, q.id));
        if clear {
            return self.write(vec![Change::Delete(key)]).await;
        }
        self.write(vec![self.put(&key, q)?]).await
    }

    pub async fn quotas(&self) -> SResult<Vec<QuotaRow>> {
        self.list(&self.key("quotas/")).await
    }

    pub async fn stage_totals(&self) -> SResult<Vec<StageTotal>> {
        self.list(&self.key("stage-totals/")).await
    }

    pub async fn open_stages(&self) -> SResult<Vec<StageRow>> {
        let mut out = Vec::new();
        for id in self.index(&self.key("stages-open/")).await? {
            if let Some(t) = self.stage(id).await? {
                out.push(t);
            }
        }
        Ok(out)
    }

    pub async fn stage(&self, id: u64) -> SResult<Option<StageRow>> {
        self.get_json(&self.stage_key(id)).await
    }

    pub async fn stages(&self, session: u64) -> SResult<Vec<StageRow>> {
        if session == 0 {
            return self.list(&self.key("stages/")).await;
        }
        let mut out = Vec::new();
        for id in self
            .index(&self.key(&format!("stages-session/{}/", id_key(session))))
            .await?
        {
            if let Some(t) = self.stage(id).await? {
                out.push(t);
            }
        }
        Ok(out)
    }
}

/// A JSON row read at `key`.
fn decode<T: serde::de::DeserializeOwned>(key: &str, value: Option<&[u8]>) -> SResult<Option<T>> {
    value
        .map(|v| {
            serde_json::from_slice(v).map_err(|e| StoreError::Corrupt {
                key: key.to_string(),
                error: e.to_string(),
            })
        })
        .transpose()
}

/// The smallest key after every key that starts with `prefix` (etcd's range end).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_prefix_range_ends_after_its_last_key() {
        assert_eq!(super::prefix_end("/surge/a/"), b"/surge/a0".to_vec());
        assert_eq!(super::prefix_end("ab\u{7f}"), b"ab\x80".to_vec());
    }
}
