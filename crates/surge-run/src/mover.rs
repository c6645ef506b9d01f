//! `surge mover`: a data mover (root, on a host that mounts the PFS: a BB server node or a
//! dedicated one). It asks the manager for stage tasks (a long poll), runs each in a
//! `surge stage worker` with the uid, gid and groups of the task's owner, exactly as the
//! manager does when it stages itself, and passes the worker's events back. The manager only
//! schedules: with movers alive, staging never reads or writes the PFS on the manager's host,
//! and tasks spread over the movers (`--slots` each).
//!
//! A mover that dies is noticed by the manager within 15 s: its tasks fail (and a re-run of
//! the phase starts them again). A terminated task's worker gets SIGTERM.

use anyhow::Context;
use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use surge_api::v1 as api;
use surge_core::backoff::Backoff;
use surge_manager::cli::{connect, status_err};
use tracing::{info, warn};

/// Run a data mover: stage tasks of the manager's jobs, run here as their owners.
///
/// Run it as root on hosts that mount the PFS at the same paths the jobs name. The manager
/// gives tasks to movers whenever one is alive (see `surge manager --stage-on`).
///
/// Example:
///   surge mover --manager mgr:7060 --slots 4
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct MoverArgs {
    /// The manager (default $SURGE_MANAGER).
    #[arg(long, env = "SURGE_MANAGER", value_name = "HOST:PORT")]
    pub manager: String,
    /// This host's name (default: the host name).
    #[arg(long)]
    pub host: Option<String>,
    /// Stage tasks run at once here.
    #[arg(long, default_value_t = 4)]
    pub slots: u32,
}

pub fn run(args: MoverArgs) -> anyhow::Result<ExitCode> {
    let host = match &args.host {
        Some(h) => h.clone(),
        None => {
            let h = surge_core::sys::hostname();
            anyhow::ensure!(!h.is_empty(), "cannot read the host name: give --host");
            h
        }
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        warn!("not root: only this user's stage tasks can run here");
    }
    let exe = std::env::current_exe().context("cannot find the surge executable")?;
    let stop = surge_core::sys::stop_on_signals();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(serve(args, host, exe, stop))?;
    Ok(ExitCode::SUCCESS)
}

type Running = Arc<parking_lot::Mutex<HashMap<u64, u32>>>;

async fn serve(
    args: MoverArgs,
    host: String,
    exe: std::path::PathBuf,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    // Task id -> its worker's pid.
    let running: Running = Arc::default();
    let mut last_error: Option<String> = None;
    info!(%host, manager = %args.manager, slots = args.slots, "data mover started");
    while !stop.load(Ordering::SeqCst) {
        let r = async {
            let mut m = connect(&args.manager).await?;
            let ids: Vec<u64> = running.lock().keys().copied().collect();
            let free = args.slots.saturating_sub(ids.len() as u32);
            let reply = m
                .mover_poll(api::MoverPollRequest {
                    host: host.clone(),
                    free_slots: free,
                    running: ids,
                    wait_ms: 5000,
                })
                .await
                .map_err(status_err)?
                .into_inner();
            anyhow::Ok((m, reply))
        }
        .await;
        let (m, reply) = match r {
            Ok(x) => {
                if last_error.take().is_some() {
                    info!("manager {} answers again", args.manager);
                }
                x
            }
            Err(e) => {
                let msg = format!("{e:#}");
                if last_error.as_deref() != Some(&msg) {
                    warn!("cannot reach the manager {}: {msg}", args.manager);
                    last_error = Some(msg);
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        for id in reply.cancel {
            if let Some(pid) = running.lock().get(&id).copied() {
                info!("stage task {id}: terminated");
                // SAFETY: signalling our own child.
                unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            }
        }
        for t in reply.tasks {
            tokio::spawn(run_task(
                m.clone(),
                args.manager.clone(),
                host.clone(),
                exe.clone(),
                t,
                running.clone(),
            ));
        }
    }
    // Stopping: terminate the workers (their tasks end as cancelled).
    for pid in running.lock().values() {
        // SAFETY: signalling our own children.
        unsafe { libc::kill(*pid as i32, libc::SIGTERM) };
    }
    Ok(())
}

/// How long a mover keeps trying to report a task's plan, end or exit while no manager
/// answers (a failover takes a few seconds).
const REPORT_RETRY: Duration = Duration::from_secs(60);

/// True for a report that must reach the manager: the worker's exit, its plan, its result.
fn exited_or(req: &api::MoverEventRequest) -> bool {
    req.exited
        || !matches!(
            serde_json::from_str::<surge_stage::worker::Event>(&req.event_json),
            Ok(surge_stage::worker::Event::Progress(_))
        )
}

/// Runs one task's worker and reports each of its events, then how it exited.
async fn run_task(
    m: surge_api::Client,
    manager: String,
    host: String,
    exe: std::path::PathBuf,
    t: api::MoverTask,
    running: Running,
) {
    let id = t.id;
    let report = |m: &surge_api::Client, event_json: String, exited: Option<String>| {
        let req = api::MoverEventRequest {
            host: host.clone(),
            task: id,
            event_json,
            exited: exited.is_some(),
            exit_status: exited.unwrap_or_default(),
        };
        let mut m = m.clone();
        let manager = manager.clone();
        async move {
            // What ends or plans a task is kept trying while no manager answers (one that
            // takes over adopts the task from it); progress is not: the next one says more.
            let keep = exited_or(&req);
            let mut pauses = Backoff::new(REPORT_RETRY, Duration::from_millis(500));
            loop {
                match m.mover_event(req.clone()).await {
                    Ok(r) => return Ok(r.into_inner().cancel),
                    Err(e) if keep && surge_api::manager_gone(&e) => {
                        let Some(pause) = pauses.next() else {
                            return Err(e);
                        };
                        tokio::time::sleep(pause).await;
                        // Whoever leads now (the address list is followed to the leader).
                        if let Ok(c) = connect(&manager).await {
                            m = c;
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    };
    let task: surge_stage::worker::Task = match serde_json::from_str(&t.task_json) {
        Ok(x) => x,
        Err(e) => {
            let _ = report(&m, String::new(), Some(format!("unreadable task: {e}"))).await;
            return;
        }
    };
    info!(
        "stage task {id}: {} for uid {} ({} item(s))",
        task.direction.as_str(),
        t.uid,
        task.items.len()
    );
    let mut child = match surge_stage::worker::spawn(&exe, &task, t.uid, t.gid, t.groups.clone()) {
        Ok(c) => c,
        Err(e) => {
            warn!("stage task {id}: {e}");
            let _ = report(&m, String::new(), Some(e)).await;
            return;
        }
    };
    let pid = child.id().unwrap_or(0);
    running.lock().insert(id, pid);
    if let Some(stdout) = child.stdout.take() {
        let mut lines = surge_stage::worker::Lines::new(stdout);
        loop {
            let line = match lines.next_line().await {
                Ok(Some(l)) => l,
                Ok(None) => break,
                Err(e) => {
                    // The worker runs as its owner: a line past the bound stops it.
                    warn!("stage task {id}: worker output refused ({e}): stopping it");
                    let _ = child.start_kill();
                    break;
                }
            };
            match report(&m, line, None).await {
                Ok(true) => {
                    // SAFETY: signalling our own child.
                    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
                }
                Ok(false) => {}
                Err(e) => warn!(
                    "stage task {id}: cannot report to the manager: {}",
                    e.message()
                ),
            }
        }
    }
    let status = match child.wait().await {
        Ok(st) => st.to_string(),
        Err(e) => format!("lost: {e}"),
    };
    running.lock().remove(&id);
    info!("stage task {id}: worker {status}");
    if let Err(e) = report(&m, String::new(), Some(status)).await {
        warn!("stage task {id}: cannot report its end: {}", e.message());
    }
}
