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
    /// Connections kept per (instance, namespace) while tasks use them.
    clients: Mutex<HashMap<(u64, u32), Arc<InstanceClient>>>,
}

impl Stages {
    pub fn new(core: Arc<Core>) -> Stages {
        Stages {
            core,
            running: Mutex::new(HashMap::new()),
            clients: Mutex::new(HashMap::new()),
        }
    }

    fn client(&self, instance: u64, ns: u32) -> MResult<Arc<InstanceClient>> {
        if let Some(c) = self.clients.lock().get(&(instance, ns)) {
            return Ok(c.clone());
        }
        let inst = self.core.instance(instance, "")?;
        let c = Arc::new(
            InstanceClient::new(inst.descriptor.clone(), NamespaceId(ns))
                .map_err(|e| ManagerError::Unavailable(format!("instance {instance}: {e}")))?,
        );
        self.clients.lock().insert((instance, ns), c.clone());
        Ok(c)
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
            return Err(ManagerError::Invalid(format!("session {} is {}", session.id, session.state)));
        }
        let uses = session.job_instance == Some(req.instance) || session.persistent.contains(&req.instance);
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
            return Err(ManagerError::Invalid("a stage task needs at least one item".into()));
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
        let client = self.client(inst.id, ns)?;
        let plan = match surge_stage::plan(&client, direction, &items).await {
            Ok(p) => p,
            Err(e) => {
                self.finish(&mut row, "failed", e.to_string());
                return Ok(row);
            }
        };
        if direction == Direction::In {
            if let Err(e) = surge_stage::check_fits(&client, &plan).await {
                self.finish(&mut row, "failed", e.to_string());
                return Ok(row);
            }
        }
        row.files_total = plan.files;
        row.bytes_total = plan.bytes;
        let _ = self.core.store.lock().update_stage(&row);
        let progress = Arc::new(Progress::new());
        self.running.lock().insert(
            row.id,
            Running {
                instance: inst.id,
                progress: progress.clone(),
            },
        );
        let opts = StageOptions {
            workers: if req.workers == 0 { 32 } else { req.workers as usize },
            checksum: req.checksum,
            owner: Some((inst.owner_uid, inst.owner_gid)),
            ..StageOptions::default()
        };
        let this = self.clone();
        let started = row.clone();
        tokio::spawn(async move {
            let mut row = started;
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
                    row.failures_json = serde_json::to_string(&report.failures).unwrap_or_else(|_| "[]".into());
                    if report.ok() {
                        info!(
                            "stage task {} ({}): {} files, {} in {:.2} s",
                            row.id,
                            row.direction,
                            report.files,
                            surge_core::format_bytes(report.bytes),
                            report.seconds
                        );
                        this.finish(&mut row, "done", String::new());
                    } else {
                        let n = report.failures.len();
                        warn!("stage task {} ({}): {n} files failed", row.id, row.direction);
                        this.finish(&mut row, "failed", format!("{n} file(s) could not be copied"));
                    }
                }
                Err(e) => this.finish(&mut row, "failed", e.to_string()),
            }
            this.running.lock().remove(&row.id);
        });
        Ok(row)
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
                self.clients.lock().retain(|(i, _), _| *i != instance);
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
