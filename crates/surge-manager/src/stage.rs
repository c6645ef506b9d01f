//! Stage tasks run by the manager (DataWarp's stage daemon): copies between the PFS and an
//! instance with the `surge-stage` engine, through the native client (never FUSE). A task is
//! recorded when asked for, planned at once (a missing source or a stage-in that does not fit
//! fails the task before anything is copied), then copied in the background; its progress is
//! live while it runs and its result (with every failed file) is kept in the state database.

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

struct Running {
    instance: u64,
    progress: Arc<Progress>,
}

pub struct Stages {
    core: Arc<Core>,
    running: Mutex<HashMap<u64, Running>>,
}

impl Stages {
    pub fn new(core: Arc<Core>) -> Stages {
        Stages {
            core,
            running: Mutex::new(HashMap::new()),
        }
    }

    fn finish(&self, row: &mut StageRow, state: &str, error: String) {
        row.state = state.into();
        row.error = error;
        if let Err(e) = self.core.store.lock().update_stage(row) {
            warn!("stage task {}: cannot record its result: {e}", row.id);
        }
    }

    /// Records and starts a stage task. Errors found while planning (missing source, no
    /// space) fail the task, which is returned in state `failed` with the reason.
    pub async fn start(self: &Arc<Self>, req: api::StartStageRequest) -> MResult<StageRow> {
        let direction = match req.direction.as_str() {
            "in" => Direction::In,
            "out" => Direction::Out,
            other => {
                return Err(ManagerError::Invalid(format!(
                    "direction '{other}' is not in or out"
                )))
            }
        };
        let session = self.core.session(req.session)?;
        if session.state != "active" {
            return Err(ManagerError::Invalid(format!(
                "session {} is {}",
                session.id, session.state
            )));
        }
        let uses = session.job_instance == Some(req.instance)
            || session.persistent.contains(&req.instance);
        if !uses {
            return Err(ManagerError::Invalid(format!(
                "session {} does not use instance {}",
                session.id, req.instance
            )));
        }
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
            session: session.id,
            instance: inst.id,
            ns,
            direction: direction.as_str().into(),
            items_json: req.items_json.clone(),
            state: "running".into(),
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
        let opts = StageOptions {
            workers: if req.workers == 0 {
                32
            } else {
                req.workers as usize
            },
            checksum: req.checksum,
            owner: Some((inst.owner_uid, inst.owner_gid)),
            ..StageOptions::default()
        };
        // Each task plans and copies on its own thread and runtime (with its own connections),
        // apart from the API's runtime, so a large stage never slows the manager's answers. The
        // caller gets the task back once it is planned (or failed planning).
        let (planned_tx, planned_rx) = tokio::sync::oneshot::channel::<StageRow>();
        let this = self.clone();
        let desc = inst.descriptor.clone();
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
                        let _ = planned_tx.send(task_row);
                        return;
                    }
                };
                rt.block_on(this.run_task(task_row, desc, direction, items, opts, planned_tx));
            });
        if let Err(e) = spawned {
            self.finish(
                &mut row,
                "failed",
                format!("cannot start a stage thread: {e}"),
            );
            return Ok(row);
        }
        planned_rx
            .await
            .map_err(|_| ManagerError::Unavailable("the stage task stopped while planning".into()))
    }

    async fn run_task(
        self: Arc<Self>,
        mut row: StageRow,
        desc: surge_proto::InstanceDescriptor,
        direction: Direction,
        items: Vec<StageItem>,
        opts: StageOptions,
        planned: tokio::sync::oneshot::Sender<StageRow>,
    ) {
        let client = match InstanceClient::new(desc, NamespaceId(row.ns)) {
            Ok(c) => Arc::new(c),
            Err(e) => {
                let msg = format!("instance {}: {e}", row.instance);
                self.finish(&mut row, "failed", msg);
                let _ = planned.send(row);
                return;
            }
        };
        let plan = match surge_stage::plan(&client, direction, &items).await {
            Ok(p) => p,
            Err(e) => {
                self.finish(&mut row, "failed", e.to_string());
                let _ = planned.send(row);
                return;
            }
        };
        if direction == Direction::In {
            if let Err(e) = surge_stage::check_fits(&client, &plan).await {
                self.finish(&mut row, "failed", e.to_string());
                let _ = planned.send(row);
                return;
            }
        }
        row.files_total = plan.files;
        row.bytes_total = plan.bytes;
        let _ = self.core.store.lock().update_stage(&row);
        let progress = Arc::new(Progress::new());
        self.running.lock().insert(
            row.id,
            Running {
                instance: row.instance,
                progress: progress.clone(),
            },
        );
        let _ = planned.send(row.clone());
        let result = surge_stage::execute(client, &plan, &opts, progress.clone()).await;
        let snap = progress.snapshot();
        row.files_done = snap.files_done;
        row.bytes_done = snap.bytes_done;
        row.seconds = snap.elapsed.as_secs_f64();
        match result {
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
