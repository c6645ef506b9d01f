//! Conversions between the manager's rows and the API's messages, and the one JSON shape of each
//! (served by the HTTP API and printed by `--json` in the CLI, so scripts see one format).

use crate::core::{Core, PoolUsage};
use crate::store::{InstanceRow, PeaksRow, ServerRow, SessionRow, StageRow};
use serde_json::{json, Value};
use surge_api::v1 as api;
use surge_proto::ServerStatus;

pub fn pool(u: &PoolUsage) -> api::Pool {
    api::Pool {
        name: u.pool.name.clone(),
        granularity: u.pool.granularity,
        servers: u.servers,
        servers_up: u.up,
        capacity: u.capacity,
        free: u.free,
    }
}

pub fn server(s: &ServerRow, st: Option<&ServerStatus>) -> api::Server {
    api::Server {
        id: s.id.clone(),
        pool: s.pool.clone(),
        addrs: s.addrs.clone(),
        capacity: s.capacity,
        reserved: st.map_or(0, |x| x.reserved),
        used: st.map_or(0, |x| x.used),
        state: s.state.clone(),
        last_seen: s.last_seen,
        fragments: st.map_or(0, |x| x.fragments.len() as u32),
        namespaces: st.map_or(0, |x| x.namespaces.len() as u32),
    }
}

pub async fn instance(core: &Core, i: &InstanceRow) -> api::Instance {
    api::Instance {
        id: i.id,
        name: i.name.clone(),
        kind: i.kind.clone(),
        access_mode: i.access_mode.clone(),
        pool: i.pool.clone(),
        capacity: i.capacity,
        fragments: i.descriptor.fragments.len() as u32,
        nodes: i.nodes,
        owner_uid: i.owner_uid,
        owner_gid: i.owner_gid,
        state: i.state.clone(),
        created: i.created,
        sessions: core.sessions_using(i.id).await.unwrap_or_default(),
        descriptor_json: serde_json::to_string(&i.descriptor).unwrap_or_default(),
        used: core.instance_used(i),
        promise_json: i.promise.clone(),
    }
}

pub async fn session(core: &Core, s: &SessionRow) -> api::Session {
    let mut instances = Vec::new();
    for id in s.job_instance.iter().chain(s.persistent.iter()) {
        if let Ok(i) = core.instance(*id, "").await {
            instances.push(instance(core, &i).await);
        }
    }
    api::Session {
        id: s.id,
        job: s.job.clone(),
        state: s.state.clone(),
        created: s.created,
        ended: s.ended,
        job_instance: s.job_instance.unwrap_or(0),
        persistent: s.persistent.clone(),
        instances,
        owner_uid: s.owner_uid,
        owner_gid: s.owner_gid,
        external_id: s.external.clone().unwrap_or_default(),
        phase: s.phase.clone(),
        hosts: s.hosts.clone(),
        mount: s.mount,
        mount_root: String::new(),
        promise_json: s.promise.clone(),
    }
}

pub fn server_peaks(s: &ServerRow, p: Option<&PeaksRow>) -> api::RegisteredPeaks {
    api::RegisteredPeaks {
        server: s.id.clone(),
        pool: s.pool.clone(),
        peaks_json: p
            .and_then(|p| serde_json::to_string(&p.peaks).ok())
            .unwrap_or_default(),
        registered: p.map_or(0, |p| p.registered),
        source: p.map(|p| p.source.clone()).unwrap_or_default(),
        state: s.state.clone(),
        servers: 1,
    }
}

pub fn pool_peaks(p: &PeaksRow) -> api::RegisteredPeaks {
    api::RegisteredPeaks {
        server: String::new(),
        pool: p.key.clone(),
        peaks_json: serde_json::to_string(&p.peaks).unwrap_or_default(),
        registered: p.registered,
        source: p.source.clone(),
        state: String::new(),
        servers: p.servers,
    }
}

pub fn stage(t: &StageRow) -> api::StageTask {
    api::StageTask {
        id: t.id,
        session: t.session,
        instance: t.instance,
        direction: t.direction.clone(),
        state: t.state.clone(),
        files_total: t.files_total,
        files_done: t.files_done,
        bytes_total: t.bytes_total,
        bytes_done: t.bytes_done,
        seconds: t.seconds,
        failures_json: t.failures_json.clone(),
        error: t.error.clone(),
        created: t.created,
        items_json: t.items_json.clone(),
        namespace: t.ns,
        origin: t.origin.clone(),
    }
}

// --- JSON ---

pub fn pool_json(p: &api::Pool) -> Value {
    json!({
        "name": p.name, "granularity": p.granularity, "servers": p.servers,
        "servers_up": p.servers_up, "capacity": p.capacity, "free": p.free,
    })
}

pub fn server_json(s: &api::Server) -> Value {
    json!({
        "id": s.id, "pool": s.pool, "addrs": s.addrs, "state": s.state, "capacity": s.capacity,
        "reserved": s.reserved, "used": s.used, "fragments": s.fragments,
        "namespaces": s.namespaces, "last_seen": s.last_seen,
    })
}

pub fn instance_json(i: &api::Instance) -> Value {
    json!({
        "id": i.id, "name": i.name, "kind": i.kind, "access_mode": i.access_mode, "pool": i.pool,
        "capacity": i.capacity, "used": i.used, "fragments": i.fragments, "nodes": i.nodes,
        "owner_uid": i.owner_uid, "owner_gid": i.owner_gid, "state": i.state,
        "created": i.created, "sessions": i.sessions,
        "descriptor": serde_json::from_str::<Value>(&i.descriptor_json).unwrap_or(Value::Null),
        "promise": promise(&i.promise_json),
    })
}

/// A promise as JSON (null when the instance was not sized by targets).
fn promise(text: &str) -> Value {
    serde_json::from_str::<Value>(text).unwrap_or(Value::Null)
}

/// One server's (or, with no server, one pool's aggregate) registered peaks as JSON: the
/// format of `surge pool peaks --json` and the HTTP API's `/v1/peaks`.
pub fn peaks_json(p: &api::RegisteredPeaks) -> Value {
    let mut v = json!({
        "pool": p.pool,
        "peaks": serde_json::from_str::<Value>(&p.peaks_json).unwrap_or(Value::Null),
        "registered": if p.registered == 0 { Value::Null } else { json!(p.registered) },
        "source": p.source,
    });
    if p.server.is_empty() {
        v["servers"] = json!(p.servers);
    } else {
        v["server"] = json!(p.server);
        v["state"] = json!(p.state);
    }
    v
}

pub fn session_json(s: &api::Session) -> Value {
    json!({
        "id": s.id, "job": s.job, "state": s.state, "created": s.created, "ended": s.ended,
        "owner_uid": s.owner_uid,
        "job_instance": if s.job_instance == 0 { Value::Null } else { json!(s.job_instance) },
        "external_id": s.external_id, "phase": s.phase, "hosts": s.hosts, "mount": s.mount,
        "persistent": s.persistent,
        "promise": promise(&s.promise_json),
    })
}

pub fn stage_json(t: &api::StageTask) -> Value {
    json!({
        "id": t.id, "session": t.session, "instance": t.instance, "namespace": t.namespace,
        "direction": t.direction, "state": t.state, "files_total": t.files_total,
        "files_done": t.files_done, "bytes_total": t.bytes_total, "bytes_done": t.bytes_done,
        "seconds": t.seconds, "error": t.error, "created": t.created,
        "items": serde_json::from_str::<Value>(&t.items_json).unwrap_or(Value::Null),
        "failures": serde_json::from_str::<Value>(&t.failures_json).unwrap_or(Value::Null),
    })
}
