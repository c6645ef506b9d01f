//! Stage tasks run by the manager (DataWarp's stage daemon): copies between the PFS and an
//! instance with the `surge-stage` engine, through the native client (never FUSE). A task is
//! recorded when asked for, planned at once (a missing source or a stage-in that does not fit
//! fails the task before anything is copied), then copied in the background; its progress is
//! live while it runs and its result (with every failed file) is kept in the state database.
//!
//! A task can also be recorded `deferred` (DataWarp's stage at job end): it is checked like any
//! other but neither planned nor copied until [`Stages::activate`]; [`Stages::cancel`] ends a
//! deferred, queued or running task, and the end of its session cancels what is still deferred.

use crate::core::{namespace_for, Core, MResult, ManagerError};
use crate::state::StageRow;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use surge_api::v1 as api;
use surge_client::InstanceClient;
use surge_core::NamespaceId;
use surge_stage::{Direction, Progress, StageItem, StageOptions};
use tracing::{info, warn};

/// How long [`Stages::cancel`] waits for a running task to stop.
const CANCEL_WAIT: Duration = Duration::from_secs(30);
const TERMINATED: &str = "terminated while it ran; files not finished were removed";

fn parse_direction(d: &str) -> MResult<Direction> {
    match d {
        "in" => Ok(Direction::In),
        "out" => Ok(Direction::Out),
        other => Err(ManagerError::Invalid(format!(
            "direction '{other}' is not in or out"
        ))),
    }
}

/// What a task copies, and how.
struct Work {
    desc: surge_proto::InstanceDescriptor,
    direction: Direction,
    items: Vec<StageItem>,
    opts: StageOptions,
}

struct Running {
    instance: u64,
    progress: Arc<Progress>,
}

/// Files in flight when neither the request nor the instance says.
const DEFAULT_WORKERS: usize = 32;
/// The most files in flight an instance's stage concurrency may ask for.
pub const MAX_STAGE_CONCURRENCY: u32 = 256;

pub struct Stages {
    core: Arc<Core>,
    running: Mutex<HashMap<u64, Running>>,
    /// Files in flight for tasks of an instance that do not say (dw_set_stage_concurrency).
    concurrency: Mutex<HashMap<u64, usize>>,
}

impl Stages {
    pub fn new(core: Arc<Core>) -> Stages {
        Stages {
            core,
            running: Mutex::new(HashMap::new()),
            concurrency: Mutex::new(HashMap::new()),
        }
    }

    fn session_uses(&self, session: u64, instance: u64) -> MResult<()> {
        let session = self.core.session(session)?;
        if session.state != "active" {
            return Err(ManagerError::Invalid(format!(
                "session {} is {}",
                session.id, session.state
            )));
        }
        if session.job_instance != Some(instance) && !session.persistent.contains(&instance) {
            return Err(ManagerError::Invalid(format!(
                "session {} does not use instance {instance}",
                session.id
            )));
        }
        Ok(())
    }

    fn options(
        &self,
        instance: &crate::state::InstanceRow,
        workers: u32,
        checksum: bool,
    ) -> StageOptions {
        let workers = if workers > 0 {
            workers as usize
        } else {
            self.concurrency
                .lock()
                .get(&instance.id)
                .copied()
                .unwrap_or(DEFAULT_WORKERS)
        };
        StageOptions {
            workers,
            checksum,
            owner: Some((instance.owner_uid, instance.owner_gid)),
            ..StageOptions::default()
        }
    }

    /// Sets the files in flight of the instance's later stage tasks.
    pub fn set_concurrency(&self, session: u64, instance: u64, concurrency: u32) -> MResult<()> {
        self.session_uses(session, instance)?;
        if concurrency == 0 {
            return Err(ManagerError::Invalid(
                "a stage concurrency of 0 would never copy anything".into(),
            ));
        }
        let n = concurrency.min(MAX_STAGE_CONCURRENCY) as usize;
        self.concurrency.lock().insert(instance, n);
        info!("instance {instance}: stage concurrency {n}");
        Ok(())
    }

    fn finish(&self, row: &mut StageRow, state: &str, error: String) {
        row.state = state.into();
        row.error = error;
        if let Err(e) = self.core.store.lock().update_stage(row) {
            warn!("stage task {}: cannot record its result: {e}", row.id);
        }
    }

    /// Records and starts a stage task (or only records it, if `deferred`). Errors found while
    /// planning (missing source, no space) fail the task, which is returned in state `failed`
    /// with the reason.
    pub async fn start(self: &Arc<Self>, req: api::StartStageRequest) -> MResult<StageRow> {
        let direction = parse_direction(&req.direction)?;
        self.session_uses(req.session, req.instance)?;
        let inst = self.core.instance(req.instance, "")?;
        let ns = req.namespace;
        if namespace_for(&inst, ns).0 != ns {
            return Err(ManagerError::Invalid(format!(
                "instance {} has no namespace {ns}",
                inst.id
            )));
        }
        let items: Vec<StageItem> = serde_json::from_str(&req.items_json)
            .map_err(|e| ManagerError::Invalid(format!("stage items are not valid JSON: {e}")))?;
        if items.is_empty() {
            return Err(ManagerError::Invalid(
                "a stage task needs at least one item".into(),
            ));
        }
        let mut row = StageRow {
            id: 0,
            session: req.session,
            instance: inst.id,
            ns,
            direction: direction.as_str().into(),
            items_json: req.items_json.clone(),
            state: if req.deferred { "deferred" } else { "running" }.into(),
            files_total: 0,
            files_done: 0,
            bytes_total: 0,
            bytes_done: 0,
            seconds: 0.0,
            failures_json: "[]".into(),
            error: String::new(),
            created: crate::state::now(),
        };
        row.id = self.core.store.lock().create_stage(&row)?;
        if req.deferred {
            info!(
                "stage task {} ({}): deferred until activated",
                row.id, row.direction
            );
            return Ok(row);
        }
        let opts = self.options(&inst, req.workers, req.checksum);
        Ok(self
            .launch(
                row,
                Work {
                    desc: inst.descriptor.clone(),
                    direction,
                    items,
                    opts,
                },
            )
            .await)
    }

    /// Starts a deferred task.
    pub async fn activate(self: &Arc<Self>, id: u64) -> MResult<StageRow> {
        let mut row = self.get(id)?;
        if row.state != "deferred" {
            return Err(ManagerError::Invalid(format!(
                "stage task {id} is {}, not deferred",
                row.state
            )));
        }
        self.session_uses(row.session, row.instance)?;
        let direction = parse_direction(&row.direction)?;
        let items: Vec<StageItem> = serde_json::from_str(&row.items_json).map_err(|e| {
            ManagerError::Invalid(format!("stage task {id}: items are not valid JSON: {e}"))
        })?;
        let inst = self.core.instance(row.instance, "")?;
        row.state = "running".into();
        self.core.store.lock().update_stage(&row)?;
        info!("stage task {id} ({}): activated", row.direction);
        let opts = self.options(&inst, 0, false);
        Ok(self
            .launch(
                row,
                Work {
                    desc: inst.descriptor.clone(),
                    direction,
                    items,
                    opts,
                },
            )
            .await)
    }

    /// Terminates a task: a deferred or queued one is marked cancelled, a running one is asked
    /// to stop and awaited (it stops at its next chunk; files not finished are removed), a
    /// failed one is marked cancelled with its failures kept (DataWarp: a failed stage stays
    /// failed until it is terminated).
    pub async fn cancel(&self, id: u64) -> MResult<StageRow> {
        let mut row = self.get(id)?;
        match row.state.as_str() {
            "deferred" | "queued" => {
                self.finish(&mut row, "cancelled", "terminated before it ran".into());
                Ok(row)
            }
            "failed" => {
                let error = std::mem::take(&mut row.error);
                self.finish(
                    &mut row,
                    "cancelled",
                    format!("terminated after failing: {error}"),
                );
                Ok(row)
            }
            "running" => {
                if let Some(r) = self.running.lock().get(&id) {
                    r.progress.cancel();
                }
                let start = std::time::Instant::now();
                while self.running.lock().contains_key(&id) {
                    if start.elapsed() > CANCEL_WAIT {
                        return Err(ManagerError::Unavailable(format!(
                            "stage task {id} was asked to stop but still runs after {} s",
                            CANCEL_WAIT.as_secs()
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                self.get(id)
            }
            other => Err(ManagerError::Invalid(format!(
                "stage task {id} has already ended ({other})"
            ))),
        }
    }

    /// Cancels the deferred tasks of a session that ends (their job end has passed).
    pub fn cancel_deferred(&self, session: u64) -> MResult<usize> {
        let rows = self.core.store.lock().stages(session)?;
        let mut n = 0;
        for mut row in rows.into_iter().filter(|r| r.state == "deferred") {
            self.finish(
                &mut row,
                "cancelled",
                "the session ended before this deferred stage was activated".into(),
            );
            n += 1;
        }
        Ok(n)
    }

    /// Plans and copies a recorded task on its own thread; answers once it is planned.
    async fn launch(self: &Arc<Self>, mut row: StageRow, work: Work) -> StageRow {
        // Cancellable from now on, planning included.
        let progress = Arc::new(Progress::new());
        self.running.lock().insert(
            row.id,
            Running {
                instance: row.instance,
                progress: progress.clone(),
            },
        );
        // Each task plans and copies on its own thread and runtime (with its own connections),
        // apart from the API's runtime, so a large stage never slows the manager's answers. The
        // caller gets the task back once it is planned (or failed planning).
        let (planned_tx, planned_rx) = tokio::sync::oneshot::channel::<StageRow>();
        let this = self.clone();
        let mut task_row = row.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("stage-{}", row.id))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        this.finish(
                            &mut task_row,
                            "failed",
                            format!("cannot start a runtime: {e}"),
                        );
                        this.running.lock().remove(&task_row.id);
                        let _ = planned_tx.send(task_row);
                        return;
                    }
                };
                rt.block_on(this.run_task(task_row, work, progress, planned_tx));
            });
        if let Err(e) = spawned {
            self.finish(
                &mut row,
                "failed",
                format!("cannot start a stage thread: {e}"),
            );
            self.running.lock().remove(&row.id);
            return row;
        }
        match planned_rx.await {
            Ok(r) => r,
            Err(_) => {
                let mut r = self.get(row.id).unwrap_or(row);
                if r.state == "running" {
                    self.finish(
                        &mut r,
                        "failed",
                        "the stage task stopped while planning".into(),
                    );
                }
                r
            }
        }
    }

    async fn run_task(
        self: Arc<Self>,
        mut row: StageRow,
        work: Work,
        progress: Arc<Progress>,
        planned: tokio::sync::oneshot::Sender<StageRow>,
    ) {
        let Work {
            desc,
            direction,
            items,
            opts,
        } = work;
        let planning = async {
            let client = InstanceClient::new(desc, NamespaceId(row.ns))
                .map(Arc::new)
                .map_err(|e| ("failed", format!("instance {}: {e}", row.instance)))?;
            let plan = surge_stage::plan(&client, direction, &items)
                .await
                .map_err(|e| ("failed", e.to_string()))?;
            if direction == Direction::In {
                surge_stage::check_fits(&client, &plan)
                    .await
                    .map_err(|e| ("failed", e.to_string()))?;
            }
            if progress.is_cancelled() {
                return Err(("cancelled", TERMINATED.to_string()));
            }
            Ok((client, plan))
        };
        let (client, plan) = match planning.await {
            Ok(x) => x,
            Err((state, msg)) => {
                self.finish(&mut row, state, msg);
                self.running.lock().remove(&row.id);
                let _ = planned.send(row);
                return;
            }
        };
        row.files_total = plan.files;
        row.bytes_total = plan.bytes;
        let _ = self.core.store.lock().update_stage(&row);
        let _ = planned.send(row.clone());
        let result = surge_stage::execute(client, &plan, &opts, progress.clone()).await;
        let snap = progress.snapshot();
        row.files_done = snap.files_done;
        row.bytes_done = snap.bytes_done;
        row.seconds = snap.elapsed.as_secs_f64();
        match result {
            _ if progress.is_cancelled() => {
                if let Ok(report) = &result {
                    row.files_done = report.files;
                    row.bytes_done = report.bytes;
                }
                info!("stage task {} ({}): terminated", row.id, row.direction);
                self.finish(&mut row, "cancelled", TERMINATED.into());
            }
            Ok(report) => {
                row.files_done = report.files;
                row.bytes_done = report.bytes;
                row.seconds = report.seconds;
                row.failures_json =
                    serde_json::to_string(&report.failures).unwrap_or_else(|_| "[]".into());
                if report.ok() {
                    info!(
                        "stage task {} ({}): {} files, {} in {:.2} s",
                        row.id,
                        row.direction,
                        report.files,
                        surge_core::format_bytes(report.bytes),
                        report.seconds
                    );
                    self.finish(&mut row, "done", String::new());
                } else {
                    let n = report.failures.len();
                    warn!(
                        "stage task {} ({}): {n} files failed",
                        row.id, row.direction
                    );
                    self.finish(
                        &mut row,
                        "failed",
                        format!("{n} file(s) could not be copied"),
                    );
                }
            }
            Err(e) => self.finish(&mut row, "failed", e.to_string()),
        }
        self.running.lock().remove(&row.id);
    }

    /// A task, with live progress while it runs.
    pub fn get(&self, id: u64) -> MResult<StageRow> {
        let mut row = self
            .core
            .store
            .lock()
            .stage(id)?
            .ok_or_else(|| ManagerError::NotFound(format!("stage task {id} does not exist")))?;
        self.overlay(&mut row);
        Ok(row)
    }

    fn overlay(&self, row: &mut StageRow) {
        if let Some(r) = self.running.lock().get(&row.id) {
            let s = r.progress.snapshot();
            row.files_done = s.files_done;
            row.bytes_done = s.bytes_done;
            row.seconds = s.elapsed.as_secs_f64();
            if s.files_total > 0 {
                row.files_total = s.files_total;
                row.bytes_total = s.bytes_total;
            }
        }
    }

    pub fn list(&self, session: u64) -> MResult<Vec<StageRow>> {
        let mut rows = self.core.store.lock().stages(session)?;
        for r in &mut rows {
            self.overlay(r);
        }
        Ok(rows)
    }

    /// Waits until no task of `instance` runs (destroying an instance waits for its
    /// stage-outs unless asked to hurry).
    pub async fn wait_idle(&self, instance: u64) {
        loop {
            let busy = self.running.lock().values().any(|r| r.instance == instance);
            if !busy {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
