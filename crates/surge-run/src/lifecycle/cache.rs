//! `type=cache` instances (docs/DIRECTIVES.md "Cache instances") as the manager's stage tasks
//! (`surge_stage::cache_task`): the lazy fill of a new cache from its PFS directory before the
//! job, its drain in the background while the job runs, and after the job the end of that
//! drain and a `drain_all` task for whatever is still journaled. A persistent cache that is
//! destroyed is drained first, in a session of its own when the job's did not attach it.

use super::staging::stage_once;
use super::{cache_pfs, instance_client, persistent, session_tasks, var_of, Event, Job, Report};
use std::time::Instant;
use surge_api::states::{SessionState, TaskState};
use surge_api::v1 as api;
use surge_core::Ino;
use surge_manager::cli::status_err;

/// The root inode of a namespace.
const ROOT: Ino = 1;

/// What a cache's namespace holds after its fill.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FillSummary {
    pub dirs: u64,
    /// Regular files whose data stays on the PFS until a mount copies them in.
    pub lazy_files: u64,
    pub lazy_bytes: u64,
    /// Regular files the fill copied (they could not be linked on the PFS).
    pub copied_files: u64,
    pub copied_bytes: u64,
}

/// Fills the session's new cache instances from their PFS directories: the job instance, and
/// a persistent cache the script creates whose namespace is still empty (one an earlier job
/// filled, or that is in use, is not filled again). Each fill is a stage task of the session,
/// so a phase run again finds it done.
pub(super) async fn fill(
    m: &mut surge_api::Client,
    job: &Job,
    s: &api::Session,
    rep: &mut impl Report,
) -> anyhow::Result<()> {
    let tasks = session_tasks(m, s.id).await?;
    for i in &s.instances {
        let Some(pfs) = cache_pfs(i) else { continue };
        let new = if i.id == s.job_instance {
            true
        } else if !job
            .directives
            .create_persistent
            .iter()
            .any(|cp| cp.name == i.name && cp.cache.pfs.is_some())
        {
            false
        } else {
            tasks
                .iter()
                .any(|t| t.instance == i.id && t.direction == "fill")
                || namespace_is_empty(m, i).await?
        };
        if new {
            fill_one(m, s, i, &pfs, rep).await?;
        }
    }
    Ok(())
}

async fn fill_one(
    m: &mut surge_api::Client,
    s: &api::Session,
    i: &api::Instance,
    pfs: &str,
    rep: &mut impl Report,
) -> anyhow::Result<()> {
    let var = var_of(s, i);
    let t = Instant::now();
    let done = stage_once(m, s.id, i.id, 0, "fill", "[]".into(), rep).await?;
    let summary = if done.state == "done" {
        let client = instance_client(m, i, 0).await?;
        Some(summarize(&client).await?)
    } else {
        None
    };
    rep.event(Event::Filled {
        var: &var,
        instance: i,
        pfs,
        task: &done,
        summary,
        started: t,
    });
    if done.state != "done" {
        anyhow::bail!(
            "the fill of {var} from {pfs} failed: {}{}",
            super::failure_lines(&done).join("; "),
            if i.id == s.job_instance {
                String::new()
            } else {
                format!(
                    "; the persistent instance {} is kept (destroy it with `surge persistent \
                     destroy {}`)",
                    i.name, i.name
                )
            }
        );
    }
    Ok(())
}

/// True when namespace 0 of instance `i` has no entry.
async fn namespace_is_empty(m: &mut surge_api::Client, i: &api::Instance) -> anyhow::Result<bool> {
    let client = instance_client(m, i, 0).await?;
    let entries = surge_stage::ns::list_dir(&client, ROOT, false).await?;
    Ok(entries.iter().all(|e| e.name == b"." || e.name == b".."))
}

/// Counts what a cache's namespace holds: directories, files still on the PFS (lazily filled),
/// files in the tier.
async fn summarize(client: &surge_client::InstanceClient) -> anyhow::Result<FillSummary> {
    use surge_proto::{FileKind, THROUGH_FILL, THROUGH_FILL_KEPT};
    let mut sum = FillSummary::default();
    let mut todo = vec![ROOT];
    while let Some(dir) = todo.pop() {
        for e in surge_stage::ns::list_dir(client, dir, true).await? {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let size = e.attr.as_ref().map_or(0, |a| a.size);
            let through = e.attr.as_ref().map_or(0, |a| a.through);
            match e.kind {
                FileKind::Dir => {
                    sum.dirs += 1;
                    todo.push(e.ino);
                }
                FileKind::File if through == THROUGH_FILL || through == THROUGH_FILL_KEPT => {
                    sum.lazy_files += 1;
                    sum.lazy_bytes += size;
                }
                FileKind::File => {
                    sum.copied_files += 1;
                    sum.copied_bytes += size;
                }
                FileKind::Symlink
                | FileKind::Fifo
                | FileKind::Socket
                | FileKind::CharDev
                | FileKind::BlockDev => {}
            }
        }
    }
    Ok(sum)
}

/// Starts the drain of each cache instance of the session that has none running: it runs in
/// the background (a stage task, on a data mover when one is alive) until [`finish`].
pub(super) async fn start_drains(
    m: &mut surge_api::Client,
    s: &api::Session,
    rep: &mut impl Report,
) -> anyhow::Result<()> {
    let tasks = session_tasks(m, s.id).await?;
    for i in &s.instances {
        let Some(pfs) = cache_pfs(i) else { continue };
        let running = tasks
            .iter()
            .any(|t| t.instance == i.id && t.direction == "drain" && t.in_progress());
        if running {
            continue;
        }
        let var = var_of(s, i);
        let task = m
            .start_stage(api::StartStageRequest {
                session: s.id,
                instance: i.id,
                namespace: 0,
                direction: "drain".into(),
                items_json: "[]".into(),
                workers: 0,
                checksum: false,
                deferred: false,
                origin: "drain".into(),
            })
            .await
            .map_err(status_err)?
            .into_inner();
        if task.task_state() == Some(TaskState::Failed) {
            anyhow::bail!("the drain of {var} could not start: {}", task.error);
        }
        rep.event(Event::DrainStarted {
            var: &var,
            pfs: &pfs,
            task: &task,
        });
    }
    Ok(())
}

/// After the job (its mounts gone): each cache's background drain is told to finish (SIGTERM:
/// it copies what is left, then ends) and awaited, then a `drain_all` task drains whatever is
/// still journaled (all of it when the first never ran). Returns what failed; a failed drain
/// keeps the job instance, its data the only copy.
pub(super) async fn finish(
    m: &mut surge_api::Client,
    s: &api::Session,
    rep: &mut impl Report,
) -> anyhow::Result<Vec<String>> {
    let mut failures = Vec::new();
    for i in &s.instances {
        if let Some(pfs) = cache_pfs(i) {
            failures.extend(finish_one(m, s, i, &pfs, rep).await?);
        }
    }
    Ok(failures)
}

/// [`finish`] of one cache instance of the session; nothing when it finished already (an
/// earlier phase of the job).
async fn finish_one(
    m: &mut surge_api::Client,
    s: &api::Session,
    i: &api::Instance,
    pfs: &str,
    rep: &mut impl Report,
) -> anyhow::Result<Option<String>> {
    let var = var_of(s, i);
    let tasks = session_tasks(m, s.id).await?;
    let mine = |t: &&api::StageTask| t.instance == i.id;
    let running: Vec<&api::StageTask> = tasks
        .iter()
        .filter(mine)
        .filter(|t| t.direction == "drain" && t.is_running())
        .collect();
    let finished = tasks
        .iter()
        .filter(mine)
        .any(|t| t.direction == "drain_all" && t.state == "done");
    if finished && running.is_empty() {
        return Ok(None);
    }
    let t = Instant::now();
    for task in running {
        // The manager waits 30 s for the task to end; a longer drain is awaited here.
        let task = match m.cancel_stage(api::GetStageRequest { id: task.id }).await {
            Ok(r) => r.into_inner(),
            Err(e) if e.code() == tonic::Code::Unavailable => task.clone(),
            Err(e) => return Err(status_err(e)),
        };
        if task.is_running() {
            crate::progress::wait_stage(m, task, "drain", true, || false).await?;
        }
    }
    let done = stage_once(m, s.id, i.id, 0, "drain_all", "[]".into(), rep).await?;
    let (mut files, mut bytes) = (0, 0);
    for r in session_tasks(m, s.id)
        .await?
        .iter()
        .filter(|x| x.instance == i.id && (x.direction == "drain" || x.direction == "drain_all"))
    {
        files += r.files_done;
        bytes += r.bytes_done;
    }
    let failure = (done.state != "done").then(|| {
        format!(
            "the drain of {var} to {pfs} failed (stage task {}): {}; the instance {} is kept: \
             finish it with `surge stage drain --instance {}`",
            done.id,
            crate::job_stage::failure_message(&done),
            i.id,
            i.id
        )
    });
    rep.event(Event::Drained {
        var: &var,
        pfs,
        files,
        bytes,
        seconds: t.elapsed().as_secs_f64(),
        error: failure.as_deref(),
        started: t,
    });
    Ok(failure)
}

/// Drains persistent instance `name` before it is destroyed, if it is a cache with changes
/// not yet on its PFS directory: the drain is a stage task, so it runs in a session of the job
/// (for `owner`, the job's session's owner) that attaches the instance, ended after it. A
/// drain that fails is the error; the instance is then kept.
pub(super) async fn drain_before_destroy(
    m: &mut surge_api::Client,
    job: &Job,
    owner: &api::Session,
    name: &str,
    rep: &mut impl Report,
) -> anyhow::Result<()> {
    let Some(i) = persistent(m, name).await? else {
        return Ok(());
    };
    if cache_pfs(&i).is_none() {
        return Ok(());
    }
    let client = instance_client(m, &i, 0).await?;
    if client.drain_progress().await?.pending == 0 {
        return Ok(());
    }
    // Ended, the job's session no longer holds the job's external id: this one is found by it
    // when the phase runs again, and ended by the manager with it.
    let s = m
        .create_session(api::CreateSessionRequest {
            job: job.label.clone(),
            owner_uid: owner.owner_uid,
            owner_gid: owner.owner_gid,
            job_instance: None,
            persistent: vec![name.to_string()],
            external_id: job.external_id.clone(),
        })
        .await
        .map_err(status_err)?
        .into_inner();
    let failed = finish(m, &s, rep).await;
    let keep = !matches!(&failed, Ok(f) if f.is_empty());
    m.end_session(api::EndSessionRequest {
        id: s.id,
        keep_job_instance: keep,
        state: if keep {
            SessionState::Failed
        } else {
            SessionState::Ended
        }
        .to_string(),
    })
    .await
    .map_err(status_err)?;
    match failed?.into_iter().next() {
        Some(f) => Err(anyhow::anyhow!(f)),
        None => Ok(()),
    }
}
