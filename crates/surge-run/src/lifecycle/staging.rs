//! The copies of a job's stage directives, as the manager's stage tasks: the stage-in before
//! the job (with the caches' fill before it and their drains started after it), the stage-out
//! after it (with the caches' drains finished and the stage tasks the job left).

use super::{
    cache, failure_lines, instance_of, namespaces, session, session_tasks, set_phase, Event, Job,
    Report,
};
use crate::jobplan::{self, StageGroup, StageIn};
use crate::progress::wait_stage;
use anyhow::Context;
use std::path::Path;
use std::time::Instant;
use surge_api::v1 as api;
use surge_core::directives::{DwVariable, StageKind};
use surge_core::NamespaceId;
use surge_manager::cli::status_err;
use surge_proto::InstanceDescriptor;
use surge_stage::StageItem;

/// Stages in what `plan` says (the script's `stage_in` directives, checked by
/// [`jobplan::stage_in`]), every namespace a node reads (one per node of a private instance,
/// every replica of an ldbalance one). The caches of the session are filled first and their
/// drains started after.
pub async fn data_in(
    m: &mut surge_api::Client,
    job: &Job,
    plan: &StageIn,
    rep: &mut impl Report,
) -> anyhow::Result<()> {
    let s = session(m, job).await?;
    let s = set_phase(m, &s, "data_in", Vec::new(), false).await?;
    cache::fill(m, job, &s, rep).await?;
    for g in &plan.groups {
        if rep.stopped() {
            anyhow::bail!("interrupted before the job ran");
        }
        let inst = instance_of(&s, &g.instance).with_context(|| {
            format!(
                "{}: {} is not an instance of this job",
                job.script, g.instance
            )
        })?;
        let items = serde_json::to_string(&g.items)?;
        for ns in 0..namespaces(inst) {
            let t = Instant::now();
            let done = stage_once(m, s.id, inst.id, ns, "in", items.clone(), rep).await?;
            rep.event(Event::Staged {
                direction: "in",
                var: &g.instance,
                instance: inst,
                ns,
                task: &done,
                started: t,
            });
            if rep.stopped() {
                anyhow::bail!("interrupted before the job ran");
            }
            if done.state != "done" {
                anyhow::bail!(
                    "stage-in from {}:{:?} failed: {}",
                    job.script,
                    g.lines,
                    failure_lines(&done).join("; ")
                );
            }
        }
    }
    cache::start_drains(m, &s, rep).await
}

/// After the job (its mounts gone): finishes the caches' drains, stages out what the script's
/// `stage_out` directives say (relative paths from `workdir`), waits for the stage tasks the
/// job started itself and runs its deferred stage-outs. Returns what failed; then the session
/// is marked `data_out_failed`, and teardown keeps the job instance (its data the only copy).
pub async fn data_out(
    m: &mut surge_api::Client,
    job: &Job,
    workdir: &Path,
    rep: &mut impl Report,
) -> anyhow::Result<Vec<String>> {
    let s = session(m, job).await?;
    let s = set_phase(m, &s, "data_out", Vec::new(), false).await?;
    let mut failures = cache::finish(m, &s, rep).await?;
    failures.extend(stage_out(m, job, &s, workdir, rep).await?);
    failures.extend(job_stages(m, &s, rep).await?);
    if !failures.is_empty() {
        set_phase(m, &s, "data_out_failed", Vec::new(), false).await?;
    }
    Ok(failures)
}

/// Runs a stage task unless the same one (instance, namespace, direction, items) already ran
/// to the end in this session, for the same phase (the job's own stage-out of the same file,
/// earlier, does not count); waits for one already running. Idempotent. A stage-in stops
/// waiting when the driver is stopped.
pub(super) async fn stage_once(
    m: &mut surge_api::Client,
    session: u64,
    inst: u64,
    ns: u32,
    direction: &str,
    items_json: String,
    rep: &impl Report,
) -> anyhow::Result<api::StageTask> {
    let (origin, label) = match direction {
        "in" | "out" => (format!("data_{direction}"), format!("stage {direction}")),
        "fill" => ("data_fill".to_string(), "fill".to_string()),
        other => (other.to_string(), other.to_string()),
    };
    let same = session_tasks(m, session)
        .await?
        .into_iter()
        .rev()
        .find(|t| {
            t.origin == origin
                && t.instance == inst
                && t.namespace == ns
                && t.direction == direction
                && t.items_json == items_json
        });
    let task = match same {
        Some(t) if t.state == "done" => return Ok(t),
        Some(t) if t.in_progress() => t,
        _ => m
            .start_stage(api::StartStageRequest {
                session,
                instance: inst,
                namespace: ns,
                direction: direction.into(),
                items_json,
                workers: 0,
                checksum: false,
                deferred: false,
                origin,
            })
            .await
            .map_err(status_err)?
            .into_inner(),
    };
    let stops = direction == "in";
    wait_stage(m, task, &label, !rep.progress(), || stops && rep.stopped()).await
}

/// The script's stage-outs; returns what failed.
async fn stage_out(
    m: &mut surge_api::Client,
    job: &Job,
    s: &api::Session,
    workdir: &Path,
    rep: &mut impl Report,
) -> anyhow::Result<Vec<String>> {
    let d = &job.directives;
    // The list files of `type=list` live in the instance: read from node 0's namespace.
    let mut lists = std::collections::HashMap::new();
    for sd in d.stage_out.iter().filter(|x| x.kind == StageKind::List) {
        let r = match instance_of(s, &sd.instance) {
            Some(i) => match jobplan::instance_path(&sd.source, &sd.instance) {
                Ok(p) => read_in_instance(m, i, &p)
                    .await
                    .map_err(|e| format!("{e:#}")),
                Err(e) => Err(e),
            },
            None => Err(format!("{} is not an instance of this job", sd.instance)),
        };
        lists.insert(sd.line, r);
    }
    let groups = jobplan::stage_out(d, &job.script, workdir, |sd| match lists.get(&sd.line) {
        Some(Ok(t)) => Ok(t.clone()),
        Some(Err(e)) => Err(std::io::Error::other(e.clone())),
        None => Err(std::io::Error::other("not read")),
    });
    let groups = match groups {
        Ok(g) => g,
        Err(errors) => return Ok(errors),
    };
    let mut failures = Vec::new();
    for g in groups {
        let Some(inst) = instance_of(s, &g.instance) else {
            failures.push(format!(
                "{}: {} is not an instance of this job",
                job.script, g.instance
            ));
            continue;
        };
        match per_namespace(m, inst, &g).await {
            Ok(per_ns) => {
                failures.extend(stage_out_group(m, s, inst, &g.instance, per_ns, rep).await?)
            }
            Err(lines) => failures.extend(lines),
        }
    }
    Ok(failures)
}

/// The stage-out of one instance, per namespace; returns what failed.
async fn stage_out_group(
    m: &mut surge_api::Client,
    s: &api::Session,
    inst: &api::Instance,
    var: &DwVariable,
    per_ns: Vec<(u32, Vec<StageItem>)>,
    rep: &mut impl Report,
) -> anyhow::Result<Vec<String>> {
    let mut failures = Vec::new();
    for (ns, items) in per_ns {
        let t = Instant::now();
        let items = serde_json::to_string(&items)?;
        let done = stage_once(m, s.id, inst.id, ns, "out", items, rep).await?;
        rep.event(Event::Staged {
            direction: "out",
            var,
            instance: inst,
            ns,
            task: &done,
            started: t,
        });
        if done.state != "done" {
            failures.extend(failure_lines(&done));
        }
    }
    Ok(failures)
}

/// Reads a stage_out list file that lives in instance `i` (namespace 0), without a mount.
async fn read_in_instance(
    m: &mut surge_api::Client,
    i: &api::Instance,
    inner: &str,
) -> anyhow::Result<String> {
    let client = super::instance_client(m, i, 0).await?;
    let attr = surge_stage::ns::resolve(&client, Path::new(inner)).await?;
    let data = client.read(attr.ino, 0, attr.size).await?;
    String::from_utf8(data).with_context(|| format!("{inner} is not text"))
}

/// The stage tasks the job itself started (`surge stage`, libdatawarp) and left: pending ones
/// are waited for and deferred stage-outs (DW_STAGE_AT_JOB_END) run now, before anything is
/// released. Returns what failed among the stage-outs.
async fn job_stages(
    m: &mut surge_api::Client,
    s: &api::Session,
    rep: &mut impl Report,
) -> anyhow::Result<Vec<String>> {
    let mut failures = Vec::new();
    // The job's own have no origin (the phases' tasks say which phase asked for them).
    let own = session_tasks(m, s.id)
        .await?
        .into_iter()
        .filter(|t| t.origin.is_empty());
    for t in own {
        let deferred = match t.state.as_str() {
            "deferred" => true,
            "queued" | "running" => false,
            _ => continue,
        };
        let started = Instant::now();
        let t = if deferred {
            m.activate_stage(api::GetStageRequest { id: t.id })
                .await
                .map_err(status_err)?
                .into_inner()
        } else {
            t
        };
        let label = format!("stage {} (task {})", t.direction, t.id);
        let done = wait_stage(m, t, &label, !rep.progress(), || false).await?;
        rep.event(Event::JobStage {
            task: &done,
            deferred,
            started,
        });
        if done.state != "done" && done.direction == "out" {
            failures.push(format!(
                "stage task {} (started by the job): {}",
                done.id,
                crate::job_stage::failure_message(&done)
            ));
            failures.extend(super::failed_files(&done));
        }
    }
    Ok(failures)
}

/// A stage-out group per namespace: one for a striped instance; for a private one, the items
/// each node's namespace holds (see [`split_private`]).
async fn per_namespace(
    m: &mut surge_api::Client,
    inst: &api::Instance,
    g: &StageGroup,
) -> Result<Vec<(u32, Vec<StageItem>)>, Vec<String>> {
    if inst.access_mode != "private" || inst.nodes <= 1 {
        return Ok(vec![(0, g.items.clone())]);
    }
    let (desc, token) = super::capability(m, inst, 0, true)
        .await
        .map_err(|e| vec![format!("stage out of {}: {e:#}", g.instance)])?;
    split_private(&g.instance, &desc, &token, inst.nodes, &g.items).await
}

/// The stage-out of `items` from a private instance of `nodes` namespaces, per namespace: each
/// node's namespace with the items it holds (all of them staged to the same destinations, the
/// nodes' trees merged). A destination two nodes would both write is refused before anything
/// is copied (the lines say which and why), so no node's output silently replaces another's;
/// an item no node holds stays with node 0, whose stage then says it is missing.
pub async fn split_private(
    var: &DwVariable,
    desc: &InstanceDescriptor,
    token: &surge_auth::Token,
    nodes: u32,
    items: &[StageItem],
) -> Result<Vec<(u32, Vec<StageItem>)>, Vec<String>> {
    let clients = (0..nodes)
        .map(|ns| {
            surge_client::InstanceClient::new(desc.clone(), NamespaceId(ns), token.clone())
                .map(std::sync::Arc::new)
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| vec![format!("stage out of {var}: {e}")])?;
    let held = surge_stage::merge::private_outputs(&clients, items)
        .await
        .map_err(|e| vec![format!("stage out of {var}: {e}")])?;
    if !held.conflicts.is_empty() {
        let mut lines: Vec<String> = held
            .conflicts
            .iter()
            .take(20)
            .map(|(path, nodes)| {
                format!(
                    "stage out of {var} (access_mode=private): {} would be written by nodes \
                     {nodes:?}; each node's namespace goes to the same destination, so give the \
                     nodes' outputs different names or directories",
                    path.display(),
                )
            })
            .collect();
        if held.conflicts.len() > 20 {
            lines.push(format!(
                "stage out of {var}: {} more paths written by several nodes",
                held.conflicts.len() - 20
            ));
        }
        lines.push(format!(
            "stage out of {var}: nothing of it was staged out; the instance is kept"
        ));
        return Err(lines);
    }
    let mut per_node: Vec<(u32, Vec<StageItem>)> = held
        .items
        .into_iter()
        .enumerate()
        .map(|(k, v)| (k as u32, v))
        .collect();
    for item in items {
        if per_node.iter().all(|(_, v)| !v.contains(item)) {
            if let Some(first) = per_node.first_mut() {
                first.1.push(item.clone());
            }
        }
    }
    per_node.retain(|(_, v)| !v.is_empty());
    Ok(per_node)
}
