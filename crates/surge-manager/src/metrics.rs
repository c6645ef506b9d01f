//! Prometheus metrics of the manager (`GET /metrics` on its HTTP address), in the OpenMetrics
//! text format written by the `prometheus-client` crate. Everything is read from the manager's
//! state at each scrape (a [`Collector`]), so the numbers are those `surge pool ls` and `GET
//! /v1/...` show:
//!
//! - pools: capacity, free space, servers and servers up (label `pool`);
//! - registered servers: up, capacity, reserved, used (labels `server`, `pool`);
//! - instances: capacity, used, fragments (labels `instance_id`, `name`, `kind`, `pool`);
//! - sessions by state; stage tasks by direction and state; bytes and files copied by stage tasks
//!   that ended (counters); bytes done and to do of each queued or running task (label `task`).

use crate::core::{Core, ManagerError};
use crate::stage::Stages;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;
use std::collections::BTreeMap;
use std::sync::Arc;
use tracing::warn;

/// The content type of [`render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What one scrape reports, read from the state before anything is encoded (the encoder is
/// synchronous; the state is not).
struct State {
    core: Arc<Core>,
    pools: Vec<crate::core::PoolUsage>,
    servers: Vec<(crate::store::ServerRow, Option<surge_proto::ServerStatus>)>,
    instances: Vec<crate::store::InstanceRow>,
    sessions: Vec<(String, u64)>,
    /// Tasks not ended, and the totals of those that did.
    tasks: Vec<crate::store::StageRow>,
    totals: Vec<crate::store::StageTotal>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("manager state")
    }
}

type Labels = Vec<(&'static str, String)>;

fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// One gauge family: a descriptor and a value per label set.
fn gauges<L: EncodeLabelSet>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    values: &[(L, i64)],
) -> Result<(), std::fmt::Error> {
    let mut m = e.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    for (labels, v) in values {
        ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

fn counters<L: EncodeLabelSet>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    values: &[(L, u64)],
) -> Result<(), std::fmt::Error> {
    let mut m = e.encode_descriptor(name, help, unit, MetricType::Counter)?;
    for (labels, v) in values {
        ConstCounter::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

impl State {
    fn collect(&self, e: &mut DescriptorEncoder) -> Result<(), ManagerError> {
        let fmt = |_: std::fmt::Error| ManagerError::Invalid("cannot encode metrics".into());
        // Pools.
        let pools = &self.pools;
        let pool = |p: &crate::core::PoolUsage| -> Labels { vec![("pool", p.pool.name.clone())] };
        let each = |f: &dyn Fn(&crate::core::PoolUsage) -> i64| -> Vec<(Labels, i64)> {
            pools.iter().map(|p| (pool(p), f(p))).collect()
        };
        gauges(
            e,
            "pool_capacity",
            "Capacity of the pool's servers",
            Some(&Unit::Bytes),
            &each(&|p| int(p.capacity)),
        )
        .map_err(fmt)?;
        gauges(
            e,
            "pool_free",
            "Capacity of the pool not promised to instances",
            Some(&Unit::Bytes),
            &each(&|p| int(p.free)),
        )
        .map_err(fmt)?;
        gauges(
            e,
            "pool_servers",
            "Servers registered in the pool",
            None,
            &each(&|p| i64::from(p.servers)),
        )
        .map_err(fmt)?;
        gauges(
            e,
            "pool_servers_up",
            "Servers of the pool that answer liveness checks",
            None,
            &each(&|p| i64::from(p.up)),
        )
        .map_err(fmt)?;

        // Servers as the manager sees them.
        let servers = &self.servers;
        let srv = |r: &crate::store::ServerRow| -> Labels {
            vec![("server", r.id.clone()), ("pool", r.pool.clone())]
        };
        let each = |f: &dyn Fn(
            &crate::store::ServerRow,
            Option<&surge_proto::ServerStatus>,
        ) -> i64|
         -> Vec<(Labels, i64)> {
            servers
                .iter()
                .map(|(r, st)| (srv(r), f(r, st.as_ref())))
                .collect()
        };
        gauges(
            e,
            "server_up",
            "1 if the server answers liveness checks, else 0",
            None,
            &each(&|r, _| i64::from(r.state == "up")),
        )
        .map_err(fmt)?;
        gauges(
            e,
            "server_capacity",
            "Capacity a registered server offers",
            Some(&Unit::Bytes),
            &each(&|r, _| int(r.capacity)),
        )
        .map_err(fmt)?;
        gauges(
            e,
            "server_reserved",
            "Capacity of a server promised to fragments (its last status)",
            Some(&Unit::Bytes),
            &each(&|_, st| st.map_or(0, |s| int(s.reserved))),
        )
        .map_err(fmt)?;
        gauges(
            e,
            "server_used",
            "Bytes stored on a server (its last status)",
            Some(&Unit::Bytes),
            &each(&|_, st| st.map_or(0, |s| int(s.used))),
        )
        .map_err(fmt)?;

        // Instances.
        let instances = &self.instances;
        let inst = |i: &crate::store::InstanceRow| -> Labels {
            vec![
                ("instance_id", i.id.to_string()),
                ("name", i.name.clone()),
                ("kind", i.kind.clone()),
                ("pool", i.pool.clone()),
            ]
        };
        let caps: Vec<_> = instances
            .iter()
            .map(|i| (inst(i), int(i.capacity)))
            .collect();
        gauges(
            e,
            "instance_capacity",
            "Capacity of an instance",
            Some(&Unit::Bytes),
            &caps,
        )
        .map_err(fmt)?;
        let used: Vec<_> = instances
            .iter()
            .map(|i| (inst(i), int(self.core.instance_used(i))))
            .collect();
        gauges(
            e,
            "instance_used",
            "Bytes stored in an instance",
            Some(&Unit::Bytes),
            &used,
        )
        .map_err(fmt)?;
        let frags: Vec<_> = instances
            .iter()
            .map(|i| (inst(i), i.descriptor.fragments.len() as i64))
            .collect();
        gauges(
            e,
            "instance_fragments",
            "Fragments (stripe width) of an instance",
            None,
            &frags,
        )
        .map_err(fmt)?;

        // Sessions.
        let mut by_state: BTreeMap<String, i64> = BTreeMap::new();
        for (state, n) in &self.sessions {
            *by_state.entry(state.clone()).or_default() += int(*n);
        }
        let sessions: Vec<_> = by_state
            .into_iter()
            .map(|(k, v)| (vec![("state", k)], v))
            .collect();
        gauges(e, "sessions", "Sessions by state", None, &sessions).map_err(fmt)?;

        // Stage tasks.
        let tasks = &self.tasks;
        let mut by_state: BTreeMap<(String, String), i64> = BTreeMap::new();
        let mut bytes: BTreeMap<String, u64> = BTreeMap::new();
        let mut files: BTreeMap<String, u64> = BTreeMap::new();
        for d in ["in", "out"] {
            bytes.insert(d.into(), 0);
            files.insert(d.into(), 0);
        }
        let mut active: Vec<(Labels, i64, i64)> = Vec::new();
        for t in &self.totals {
            *by_state
                .entry((t.direction.clone(), t.state.clone()))
                .or_default() += int(t.tasks);
            *bytes.entry(t.direction.clone()).or_default() += t.bytes;
            *files.entry(t.direction.clone()).or_default() += t.files;
        }
        for t in tasks.iter() {
            *by_state
                .entry((t.direction.clone(), t.state.clone()))
                .or_default() += 1;
            if matches!(t.state.as_str(), "queued" | "running") {
                active.push((
                    vec![
                        ("task", t.id.to_string()),
                        ("direction", t.direction.clone()),
                        ("session", t.session.to_string()),
                    ],
                    int(t.bytes_done),
                    int(t.bytes_total),
                ));
            }
        }
        let states: Vec<_> = by_state
            .into_iter()
            .map(|((d, s), n)| (vec![("direction", d), ("state", s)], n))
            .collect();
        gauges(
            e,
            "stage_tasks",
            "Stage tasks by direction and state",
            None,
            &states,
        )
        .map_err(fmt)?;
        let b: Vec<_> = bytes
            .into_iter()
            .map(|(d, v)| (vec![("direction", d)], v))
            .collect();
        counters(
            e,
            "stage_copied",
            "Bytes copied by stage tasks that ended",
            Some(&Unit::Bytes),
            &b,
        )
        .map_err(fmt)?;
        let f: Vec<_> = files
            .into_iter()
            .map(|(d, v)| (vec![("direction", d)], v))
            .collect();
        counters(
            e,
            "stage_files_copied",
            "Files copied by stage tasks that ended",
            None,
            &f,
        )
        .map_err(fmt)?;
        let done: Vec<_> = active.iter().map(|(l, d, _)| (l.clone(), *d)).collect();
        gauges(
            e,
            "stage_task_done",
            "Bytes a queued or running stage task has copied",
            Some(&Unit::Bytes),
            &done,
        )
        .map_err(fmt)?;
        let total: Vec<_> = active.iter().map(|(l, _, t)| (l.clone(), *t)).collect();
        gauges(
            e,
            "stage_task_size",
            "Bytes a queued or running stage task copies in all",
            Some(&Unit::Bytes),
            &total,
        )
        .map_err(fmt)?;
        Ok(())
    }
}

impl Collector for State {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.collect(&mut encoder).map_err(|e| {
            warn!("metrics: {e}");
            std::fmt::Error
        })
    }
}

/// The manager's metrics as OpenMetrics text, under the prefix `surge`.
pub async fn render(core: Arc<Core>, stages: Arc<Stages>) -> Result<String, ManagerError> {
    let state = State {
        pools: core.pool_usage().await?,
        servers: core.servers().await?,
        instances: core.instances().await?,
        sessions: core.store.session_counts().await?,
        tasks: stages.open().await?,
        totals: core.store.stage_totals().await?,
        core,
    };
    let mut r = prometheus_client::registry::Registry::with_prefix("surge");
    r.register_collector(Box::new(state));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &r)
        .map_err(|_| ManagerError::Invalid("cannot encode metrics".into()))?;
    Ok(out)
}
