//! The setup phase: the script's persistent instances, then the job's session (its job
//! instance allocated, persistent instances attached). Nothing else moves: the caches are
//! filled by [`super::data_in`].

use super::{attached, find, missing, set_phase, Alloc, Event, Job, Report};
use anyhow::Context;
use std::time::Instant;
use surge_api::states::SessionState;
use surge_api::v1 as api;
use surge_core::directives::{CacheSpec, CreatePersistent, JobAllocation};
use surge_manager::cli::status_err;

/// Opens the job's session: creates the script's `#BB create_persistent` instances (one of the
/// same name and owner that is there already is taken as it is: a re-run), then the session
/// with the job instance and the attached persistent instances. A session of the job that is
/// there already is the answer when it has everything the script asks for; one that lacks
/// something (a manager that crashed in the middle of an older setup) is ended and made again.
pub async fn setup(
    m: &mut surge_api::Client,
    job: &Job,
    rep: &mut impl Report,
) -> anyhow::Result<api::Session> {
    let alloc = job
        .alloc
        .as_ref()
        .context("setup needs the job's owner and nodes")?;
    if let Some(s) = find(m, job).await?.filter(|s| s.is_active()) {
        match missing(job, &s) {
            None => {
                rep.event(Event::AlreadySetUp { session: &s });
                return Ok(s);
            }
            Some(lacks) => {
                rep.event(Event::Incomplete {
                    session: &s,
                    lacks: &lacks,
                });
                m.end_session(api::EndSessionRequest {
                    id: s.id,
                    keep_job_instance: false,
                    state: SessionState::Failed.to_string(),
                })
                .await
                .map_err(status_err)?;
            }
        }
    }
    let pools = Pools::of(m, alloc).await?;
    for cp in &job.directives.create_persistent {
        let t = Instant::now();
        let pool = pools.pool_for(&cp.pool, rep);
        match create_persistent(m, job, alloc, cp, pool).await {
            Ok((instance, created)) => rep.event(Event::Persistent {
                name: &cp.name,
                instance: &instance,
                created,
                started: t,
            }),
            Err(e) => {
                rep.event(Event::PersistentFailed {
                    name: &cp.name,
                    started: t,
                });
                return Err(e);
            }
        }
    }
    for a in &job.directives.allocations {
        let t = Instant::now();
        let name = super::allocation_instance(&job.external_id, a);
        let req = allocation_request(a, &name, pools.pool_for(&a.pool, rep), alloc);
        let what = format!(
            "{}:{}: #DW jobdw type={} name={}",
            job.script, a.line, a.fs, a.name
        );
        match create_named(m, alloc, req, &name, what).await {
            Ok((instance, created)) => rep.event(Event::Allocation {
                var: &a.var(),
                instance: &instance,
                created,
                started: t,
            }),
            Err(e) => {
                rep.event(Event::PersistentFailed {
                    name: &name,
                    started: t,
                });
                return Err(undo_allocations(m, job, rep, e).await);
            }
        }
    }
    let t = Instant::now();
    let job_instance = job_request(job, alloc, &pools, rep);
    let line = job.directives.jobdw.as_ref().map_or(0, |j| j.line);
    let s = match m
        .create_session(api::CreateSessionRequest {
            job: job.label.clone(),
            owner_uid: alloc.uid,
            owner_gid: alloc.gid,
            job_instance,
            persistent: attached(job),
            external_id: job.external_id.clone(),
        })
        .await
    {
        Ok(s) => s.into_inner(),
        Err(e) => {
            let e = status_err(e).context(format!(
                "{}:{line}: cannot allocate the burst buffer",
                job.script
            ));
            return Err(undo_allocations(m, job, rep, e).await);
        }
    };
    let s = set_phase(m, &s, "setup", Vec::new(), false).await?;
    rep.event(Event::Allocated {
        session: &s,
        started: t,
    });
    Ok(s)
}

/// A setup that fails destroys the job's Rabbit allocations made before (the job will not
/// run; they would stay allocated without a session) and returns `e`, with what could not be
/// destroyed added.
async fn undo_allocations(
    m: &mut surge_api::Client,
    job: &Job,
    rep: &mut impl Report,
    e: anyhow::Error,
) -> anyhow::Error {
    match super::teardown::destroy_allocations(m, job, false, rep).await {
        Ok(failures) if failures.is_empty() => e,
        Ok(failures) => anyhow::anyhow!("{e:#}; and {}", failures.join("; ")),
        Err(d) => anyhow::anyhow!("{e:#}; and the job's allocations stay: {d:#}"),
    }
}

/// The pools the manager has, when a script's unknown pool falls back to the default.
struct Pools(Option<Vec<String>>);

impl Pools {
    async fn of(m: &mut surge_api::Client, alloc: &Alloc) -> anyhow::Result<Pools> {
        if !alloc.pool_fallback {
            return Ok(Pools(None));
        }
        let pools = m
            .list_pools(api::Empty {})
            .await
            .map_err(status_err)?
            .into_inner()
            .pools;
        Ok(Pools(Some(pools.into_iter().map(|p| p.name).collect())))
    }

    /// The pool to ask for a directive's `pool=` (empty: the manager's default).
    fn pool_for(&self, pool: &Option<String>, rep: &mut impl Report) -> String {
        match (pool, &self.0) {
            (Some(p), Some(known)) if !known.contains(p) => {
                rep.event(Event::PoolFallback { pool: p });
                String::new()
            }
            (Some(p), _) => p.clone(),
            (None, _) => String::new(),
        }
    }
}

/// Creates the persistent instance of `cp` for the job's owner; an instance of that name that
/// is there already and is the owner's is taken (the instance, and whether it was made now).
///
/// The manager answers a taken name with FAILED_PRECONDITION, as it answers other refusals
/// (ALREADY_EXISTS is taken too, should it say that): so the instance is asked for by name,
/// and its owner decides.
async fn create_persistent(
    m: &mut surge_api::Client,
    job: &Job,
    alloc: &Alloc,
    cp: &CreatePersistent,
    pool: String,
) -> anyhow::Result<(api::Instance, bool)> {
    let what = format!(
        "{}:{}: #BB create_persistent name={}",
        job.script, cp.line, cp.name
    );
    let req = persistent_request(cp, pool, alloc.uid, alloc.gid);
    create_named(m, alloc, req, &cp.name, what).await
}

/// Creates the named instance `req` (`name`) for the job's owner; one of that name that is
/// there already and is the owner's is taken (a setup run again). `what` names the directive
/// in errors.
async fn create_named(
    m: &mut surge_api::Client,
    alloc: &Alloc,
    req: api::CreateInstanceRequest,
    name: &str,
    what: String,
) -> anyhow::Result<(api::Instance, bool)> {
    let what = || what.clone();
    let refused = match m.create_instance(req).await {
        Ok(i) => return Ok((i.into_inner(), true)),
        Err(e)
            if matches!(
                e.code(),
                tonic::Code::AlreadyExists | tonic::Code::FailedPrecondition
            ) =>
        {
            e
        }
        Err(e) => return Err(status_err(e).context(what())),
    };
    match super::persistent(m, name).await? {
        Some(i) if i.owner_uid == alloc.uid => Ok((i, false)),
        Some(i) => anyhow::bail!(
            "{}: a persistent instance of that name belongs to uid {}",
            what(),
            i.owner_uid
        ),
        None => Err(status_err(refused).context(what())),
    }
}

/// The job instance a `#DW jobdw` / `#SURGE jobdw` line asks for.
fn job_request(
    job: &Job,
    alloc: &Alloc,
    pools: &Pools,
    rep: &mut impl Report,
) -> Option<api::CreateInstanceRequest> {
    let j = job.directives.jobdw.as_ref()?;
    let targets = crate::targets::request_targets(j);
    Some(api::CreateInstanceRequest {
        // Targets: the least capacity asked, and room for what is staged in.
        capacity: if targets.is_some() {
            j.capacity.max(alloc.stage_in_bytes)
        } else {
            j.capacity
        },
        access_mode: j.access_mode.as_str().into(),
        pool: pools.pool_for(&j.pool, rep),
        persistent_name: String::new(),
        nodes: alloc.nodes.max(1),
        owner_uid: alloc.uid,
        owner_gid: alloc.gid,
        stripe_size: 0,
        share_with_group: false,
        // `#SURGE jobdw`: the manager sizes the instance from the pool's calibrated peaks
        // (or the peaks given).
        targets,
        peaks_json: alloc.peaks_json.clone(),
        ..cache_request(&j.cache)
    })
}

/// The instance of a Rabbit allocation (`#DW jobdw type=xfs|gfs2|lustre ... name=`): xfs and
/// gfs2 private (a namespace per compute node, Rabbit's capacity being per node), lustre
/// striped; named `name` ([`super::allocation_instance`]).
fn allocation_request(
    a: &JobAllocation,
    name: &str,
    pool: String,
    alloc: &Alloc,
) -> api::CreateInstanceRequest {
    let nodes = alloc.nodes.max(1);
    api::CreateInstanceRequest {
        capacity: a.capacity_for(nodes),
        access_mode: a.access_mode().as_str().into(),
        pool,
        persistent_name: name.to_string(),
        nodes,
        owner_uid: alloc.uid,
        owner_gid: alloc.gid,
        stripe_size: 0,
        share_with_group: false,
        ..Default::default()
    }
}

/// The instance a `#BB create_persistent` line asks for, for its owner.
pub fn persistent_request(
    cp: &CreatePersistent,
    pool: String,
    uid: u32,
    gid: u32,
) -> api::CreateInstanceRequest {
    api::CreateInstanceRequest {
        capacity: cp.capacity,
        access_mode: "striped".into(),
        pool,
        persistent_name: cp.name.clone(),
        nodes: 1,
        owner_uid: uid,
        owner_gid: gid,
        stripe_size: 0,
        share_with_group: false,
        ..cache_request(&cp.cache)
    }
}

/// An instance request with the `type=cache` keys of a `jobdw` or `create_persistent` line
/// (and nothing else set).
pub fn cache_request(c: &CacheSpec) -> api::CreateInstanceRequest {
    api::CreateInstanceRequest {
        cache_pfs: c.pfs.clone().unwrap_or_default(),
        cache_fsync_pfs: c.fsync_pfs,
        cache_dirty_high: c.dirty_high.map(|d| d.to_string()).unwrap_or_default(),
        cache_passthrough: c.passthrough,
        ..Default::default()
    }
}
