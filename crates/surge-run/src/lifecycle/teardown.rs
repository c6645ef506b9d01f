//! The teardown phase: unmount, end the session (the job instance is kept, with its data,
//! when a stage-out or a drain failed), then the script's `#BB destroy_persistent` instances,
//! each drained first when it is a cache. Succeeds when there is nothing left to do, so it may
//! run again after anything.

use super::{cache, find, session_tasks, set_phase, Event, Job, Mounts, Report};
use std::time::Instant;
use surge_api::states::SessionState;
use surge_api::v1 as api;
use surge_manager::cli::status_err;

/// How a teardown goes.
#[derive(Clone, Debug)]
pub struct Teardown {
    /// The job was cancelled: stop its stage tasks, do not wait long for the agents, destroy
    /// persistent instances without draining them.
    pub hurry: bool,
    /// The state the session ends in (`Ended`, `Cancelled`, `Failed`), unless its job
    /// instance is kept (`StageOutFailed`).
    pub state: SessionState,
    /// Destroy the script's `#BB destroy_persistent` instances.
    pub destroy: bool,
}

/// What a teardown did.
#[derive(Debug, Default)]
pub struct Ended {
    /// The job's session, as it ended (`None`: the job had none).
    pub session: Option<api::Session>,
    /// The job instance kept with its data (a stage-out or a drain failed).
    pub kept: Option<u64>,
    /// What could not be done (a persistent instance not destroyed, and why).
    pub failures: Vec<String>,
}

/// Tears the job down (see the module).
pub async fn teardown(
    m: &mut surge_api::Client,
    job: &Job,
    mounts: &mut impl Mounts,
    how: &Teardown,
    rep: &mut impl Report,
) -> anyhow::Result<Ended> {
    let Some(s) = find(m, job).await? else {
        rep.event(Event::NoSession);
        // A setup that failed after making some of the job's Rabbit allocations (the next one
        // did not fit) left them without a session.
        let failures = destroy_allocations(m, job, how.hurry, rep).await?;
        return Ok(Ended {
            failures,
            ..Ended::default()
        });
    };
    let mut ended = Ended::default();
    let s = if s.is_active() {
        let t = Instant::now();
        let e = end_job_session(m, &s, mounts, how.hurry, how.state, rep).await?;
        ended.kept = kept(&e);
        rep.event(Event::Ended {
            session: &e,
            kept: ended.kept,
            started: t,
        });
        e
    } else {
        s
    };
    if how.destroy {
        ended.failures = destroy_persistent(m, job, &s, how.hurry, rep).await?;
    }
    // A Rabbit allocation lives as long as the job, as the job instance does: it is kept, with
    // its data, when the stage-out failed.
    if kept_state(&s).is_none() {
        ended
            .failures
            .extend(destroy_allocations(m, job, how.hurry, rep).await?);
    }
    ended.session = Some(s);
    Ok(ended)
}

/// The job instance an ended session kept, if it did.
fn kept(s: &api::Session) -> Option<u64> {
    kept_state(s).and(Some(s.job_instance)).filter(|&i| i != 0)
}

/// The state of an ended session that kept its job instance with its data.
fn kept_state(s: &api::Session) -> Option<SessionState> {
    s.session_state().filter(|st| {
        matches!(
            st,
            SessionState::StageOutFailed | SessionState::DrainPending
        )
    })
}

/// Ends active session `s` of a job: unmounts its instances (a mount of a destroyed instance
/// would answer ESTALE to the job), stops its stage tasks when `hurry`, finishes its caches'
/// drains (nothing journaled is lost) and ends it as `state`; the job instance is kept, and
/// the state says "stage-out-failed", when its stage-out or a drain failed.
pub async fn end_job_session(
    m: &mut surge_api::Client,
    s: &api::Session,
    mounts: &mut impl Mounts,
    hurry: bool,
    state: SessionState,
    rep: &mut impl Report,
) -> anyhow::Result<api::Session> {
    // A failed stage-out is remembered in the phase, so a teardown run again keeps the data.
    let failed_out = s.phase == "data_out_failed";
    let phase = if failed_out {
        "data_out_failed"
    } else {
        "teardown"
    };
    let now = set_phase(m, s, phase, Vec::new(), false).await?;
    let t = Instant::now();
    match mounts.unmount(m, &now, hurry).await {
        Ok(Some(detail)) => rep.event(Event::Unmounted { detail, started: t }),
        Ok(None) => {}
        Err(e) => eprintln!("warning: {e:#}"),
    }
    if hurry {
        for t in session_tasks(m, s.id).await? {
            if t.in_progress() {
                // What still runs ends with the session anyway; a task that will not stop is
                // the manager's to report.
                let _ = m.cancel_stage(api::GetStageRequest { id: t.id }).await;
            }
        }
    }
    let drain_failures = cache::finish(m, &now, rep).await?;
    let keep = failed_out || !drain_failures.is_empty();
    Ok(m.end_session(api::EndSessionRequest {
        id: s.id,
        keep_job_instance: keep,
        state: if keep {
            SessionState::StageOutFailed
        } else {
            state
        }
        .to_string(),
    })
    .await
    .map_err(status_err)?
    .into_inner())
}

/// Destroys the instances of the script's Rabbit allocations (see
/// [`super::allocation_instance`]); one that is not there is not an error (a teardown run
/// again). Returns what could not be destroyed and why.
pub(super) async fn destroy_allocations(
    m: &mut surge_api::Client,
    job: &Job,
    hurry: bool,
    rep: &mut impl Report,
) -> anyhow::Result<Vec<String>> {
    let mut failures = Vec::new();
    for a in &job.directives.allocations {
        let t = Instant::now();
        let name = super::allocation_instance(&job.external_id, a);
        let r = m
            .destroy_instance(api::DestroyInstanceRequest {
                id: 0,
                persistent_name: name.clone(),
                hurry,
            })
            .await;
        let (existed, ok) = match r {
            Ok(_) => (true, true),
            Err(e) if e.code() == tonic::Code::NotFound => (false, true),
            Err(e) => {
                let e = status_err(e);
                if surge_api::manager_gone(e.as_ref()) {
                    return Err(e);
                }
                failures.push(format!(
                    "{}:{}: #DW jobdw name={} (instance {name}): {e:#}",
                    job.script, a.line, a.name
                ));
                (true, false)
            }
        };
        rep.event(Event::AllocationDestroyed {
            var: &a.var(),
            instance: &name,
            existed,
            ok,
            started: t,
        });
    }
    Ok(failures)
}

/// Destroys the script's `#BB destroy_persistent` instances (after the job, as DataWarp does),
/// each cache drained first unless `hurry` (or the line's own `hurry`) gives its changes up.
/// One that is not there is not an error (a teardown run again). Returns what could not be
/// destroyed and why; the manager going away is the error (the phase is run again).
async fn destroy_persistent(
    m: &mut surge_api::Client,
    job: &Job,
    owner: &api::Session,
    hurry: bool,
    rep: &mut impl Report,
) -> anyhow::Result<Vec<String>> {
    let mut failures = Vec::new();
    for dp in &job.directives.destroy_persistent {
        let t = Instant::now();
        let what = format!(
            "{}:{}: #BB destroy_persistent name={}",
            job.script, dp.line, dp.name
        );
        let hurry = hurry || dp.hurry;
        if !hurry {
            if let Err(e) = cache::drain_before_destroy(m, job, owner, &dp.name, rep).await {
                if surge_api::manager_gone(e.as_ref()) {
                    return Err(e);
                }
                rep.event(Event::Destroyed {
                    name: &dp.name,
                    existed: true,
                    ok: false,
                    started: t,
                });
                failures.push(format!("{what}: {e:#}; the instance and its data are kept"));
                continue;
            }
        }
        let r = m
            .destroy_instance(api::DestroyInstanceRequest {
                id: 0,
                persistent_name: dp.name.clone(),
                hurry,
            })
            .await;
        let (existed, ok) = match r {
            Ok(_) => (true, true),
            Err(e) if e.code() == tonic::Code::NotFound => (false, true),
            Err(e) => {
                let e = status_err(e);
                if surge_api::manager_gone(e.as_ref()) {
                    return Err(e);
                }
                failures.push(format!("{what}: {e:#}"));
                (true, false)
            }
        };
        rep.event(Event::Destroyed {
            name: &dp.name,
            existed,
            ok,
            started: t,
        });
    }
    Ok(failures)
}
