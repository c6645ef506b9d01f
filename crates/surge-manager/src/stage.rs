//! Stage tasks run by the manager (DataWarp's stage daemon): copies between the PFS and an
//! instance with the `surge-stage` engine, through the native client (never FUSE). A task is
//! recorded when asked for, planned at once (a missing source or a stage-in that does not fit
//! fails the task before anything is copied), then copied in the background; its progress is
//! live while it runs and its result (with every failed file) is kept in the state database.
//!
//! A task can also be recorded `deferred` (DataWarp's stage at job end): it is checked like any
//! other but neither planned nor copied until [`Stages::activate`]; [`Stages::cancel`] ends a
//! deferred, queued or running task, and the end of its session cancels what is still deferred.
//!
//! Each task is planned and copied by a worker process (`surge stage worker`, see
//! `surge_stage::worker`) running with the uid, gid and groups of the session's owner: the
//! manager never opens a user's path with its own rights (docs/SECURITY.md), so a stage-in
//! reads only what the owner may read and a stage-out writes only where the owner may write.
//! The worker gets a capability for the instance made for the owner.

use crate::core::{namespace_for, Core, MResult, ManagerError};
use crate::store::StageRow;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use surge_api::v1 as api;
use surge_stage::cache_task::CacheWork;
use surge_stage::worker::{Event, Task};
use surge_stage::{Direction, ProgressSnapshot, StageItem, StageOptions};
use tracing::{info, warn};

/// How long [`Stages::cancel`] waits for a running task to stop.
const CANCEL_WAIT: Duration = Duration::from_secs(30);
const TERMINATED: &str = "terminated while it ran; files not finished were removed";

/// A task's `direction`: `in` or `out` (a copy), or a cache instance's `fill` or `drain`
/// (`surge_stage::cache_task`; the direction the data goes, and the work).
fn parse_direction(d: &str) -> MResult<(Direction, Option<CacheWork>)> {
    match (d, CacheWork::parse(d)) {
        ("in", _) => Ok((Direction::In, None)),
        ("out", _) => Ok((Direction::Out, None)),
        (_, Some(CacheWork::Fill)) => Ok((Direction::In, Some(CacheWork::Fill))),
        (_, Some(w)) => Ok((Direction::Out, Some(w))),
        (other, None) => Err(ManagerError::Invalid(format!(
            "direction '{other}' is not in, out, fill, drain or drain_all"
        ))),
    }
}

/// What a task copies, how, and for whom.
struct Work {
    desc: surge_proto::InstanceDescriptor,
    direction: Direction,
    items: Vec<StageItem>,
    opts: StageOptions,
    /// A cache instance's fill or drain instead of a copy.
    cache: Option<CacheWork>,
    /// The instance is persistent (a cache's drain keeps its fill names).
    persistent: bool,
    /// The session's owner: the worker runs as this user.
    owner: surge_auth::Caller,
    /// A capability for the instance's servers, for the owner.
    token: surge_auth::Token,
}

/// A task's worker, while it runs.
#[derive(Default)]
struct Live {
    snap: Mutex<Option<ProgressSnapshot>>,
    /// The worker's pid once started (0 before).
    pid: std::sync::atomic::AtomicU32,
    cancelled: std::sync::atomic::AtomicBool,
}

impl Live {
    /// Asks the worker to stop (SIGTERM; at once if it has not started yet).
    fn cancel(&self) {
        self.cancelled
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let pid = self.pid.load(std::sync::atomic::Ordering::SeqCst);
        if pid != 0 {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
    }

    fn is_cancelled(&self) -> bool {
        self.cancelled.load(std::sync::atomic::Ordering::SeqCst)
    }
}

struct Running {
    instance: u64,
    live: Arc<Live>,
}

/// Where stage tasks run (`surge manager --stage-on`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StageOn {
    /// On a data mover when at least one is alive, else on the manager's host.
    Auto,
    /// Always on the manager's host.
    Local,
    /// Only on data movers (tasks wait for one).
    Movers,
}

/// A mover not heard from for this long is lost: its tasks fail.
pub const MOVER_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a manager that starts (or takes the lead) waits for data movers to report the
/// tasks a previous manager gave them, before it runs the tasks nobody reported again.
pub const ADOPT_WAIT: Duration = MOVER_TIMEOUT;

/// What a mover said about a task.
pub enum MoverMsg {
    Event(Event),
    /// The worker exited (its status).
    Exited(String),
}

/// The mover a task was given to (None while queued) and where its events go.
type Feed = (Option<String>, tokio::sync::mpsc::UnboundedSender<MoverMsg>);

struct Queued {
    id: u64,
    task_json: String,
    owner: surge_auth::Caller,
}

/// Data movers (`surge mover`): the tasks waiting for one, and where each runs.
#[derive(Default)]
pub struct Movers {
    seen: Mutex<HashMap<String, std::time::Instant>>,
    queue: Mutex<std::collections::VecDeque<Queued>>,
    /// Task -> (the mover running it, where its events go).
    feeds: Mutex<HashMap<u64, Feed>>,
    /// Woken when a task is queued.
    pub wake: tokio::sync::Notify,
}

impl Movers {
    pub fn any_alive(&self) -> bool {
        self.seen
            .lock()
            .values()
            .any(|t| t.elapsed() < MOVER_TIMEOUT)
    }

    fn alive(&self, host: &str) -> bool {
        self.seen
            .lock()
            .get(host)
            .is_some_and(|t| t.elapsed() < MOVER_TIMEOUT)
    }

    pub fn seen(&self, host: &str) {
        self.seen
            .lock()
            .insert(host.to_string(), std::time::Instant::now());
    }

    fn enqueue(
        &self,
        id: u64,
        task_json: String,
        owner: &surge_auth::Caller,
    ) -> tokio::sync::mpsc::UnboundedReceiver<MoverMsg> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.feeds.lock().insert(id, (None, tx));
        self.queue.lock().push_back(Queued {
            id,
            task_json,
            owner: owner.clone(),
        });
        self.wake.notify_waiters();
        rx
    }

    /// True if task `id` is queued for, or followed on, a mover by this manager.
    pub fn follows(&self, id: u64) -> bool {
        self.feeds.lock().contains_key(&id)
    }

    /// Follows task `id`, which mover `host` runs for a previous manager: its events from
    /// now on go to the receiver.
    fn adopt(&self, id: u64, host: &str) -> tokio::sync::mpsc::UnboundedReceiver<MoverMsg> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.feeds.lock().insert(id, (Some(host.to_string()), tx));
        rx
    }

    /// Up to `n` queued tasks for mover `host`: (id, task JSON, owner).
    pub fn take(&self, host: &str, n: usize) -> Vec<(u64, String, surge_auth::Caller)> {
        let mut q = self.queue.lock();
        let mut feeds = self.feeds.lock();
        let mut out = Vec::new();
        while out.len() < n {
            let Some(t) = q.pop_front() else { break };
            if let Some(f) = feeds.get_mut(&t.id) {
                f.0 = Some(host.to_string());
                out.push((t.id, t.task_json, t.owner));
            }
        }
        out
    }

    /// Passes what mover `host` said about task `id` on; false when the task is not its.
    pub fn deliver(&self, host: &str, id: u64, msg: MoverMsg) -> bool {
        let mut feeds = self.feeds.lock();
        let Some((Some(h), tx)) = feeds.get(&id) else {
            return false;
        };
        if h != host {
            return false;
        }
        let exited = matches!(msg, MoverMsg::Exited(_));
        let _ = tx.send(msg);
        if exited {
            feeds.remove(&id);
        }
        true
    }

    /// The mover a task was given to, if any.
    fn host_of(&self, id: u64) -> Option<String> {
        self.feeds.lock().get(&id).and_then(|f| f.0.clone())
    }

    /// Forgets task `id`; true if it was still waiting for a mover.
    fn drop_task(&self, id: u64) -> bool {
        self.feeds.lock().remove(&id);
        let mut q = self.queue.lock();
        let before = q.len();
        q.retain(|t| t.id != id);
        q.len() != before
    }
}

/// A running task's worker: a child of the manager, or a worker on a data mover.
enum Source {
    Local {
        child: Box<tokio::process::Child>,
        lines: surge_stage::worker::Lines<tokio::process::ChildStdout>,
    },
    Mover {
        id: u64,
        rx: tokio::sync::mpsc::UnboundedReceiver<MoverMsg>,
        /// Set when the worker is known to have ended (or been lost).
        status: Option<Result<String, String>>,
        since: std::time::Instant,
    },
}

impl Source {
    /// The worker's next event; None once it has ended.
    async fn next(&mut self, movers: &Movers, live: &Live) -> Option<Event> {
        match self {
            Source::Local { lines, child } => loop {
                let line = match lines.next_line().await {
                    Ok(Some(l)) => l,
                    Ok(None) => return None,
                    Err(e) => {
                        // It runs as its owner, who may write into it: a line past the
                        // bound ends the worker, not the manager's memory.
                        warn!("stage worker output refused ({e}): stopping the worker");
                        let _ = child.start_kill();
                        return None;
                    }
                };
                match serde_json::from_str::<Event>(&line) {
                    Ok(ev) => return Some(ev),
                    Err(_) => warn!(
                        "unreadable stage worker output: {}",
                        surge_core::limits::bounded(&line, 1024)
                    ),
                }
            },
            Source::Mover {
                id,
                rx,
                status,
                since,
            } => loop {
                if status.is_some() {
                    return None;
                }
                match tokio::time::timeout(Duration::from_secs(1), rx.recv()).await {
                    Ok(Some(MoverMsg::Event(ev))) => return Some(ev),
                    Ok(Some(MoverMsg::Exited(st))) => {
                        *status = Some(Ok(st));
                        return None;
                    }
                    Ok(None) => {
                        *status = Some(Err("its data mover went away".into()));
                        return None;
                    }
                    Err(_) => match movers.host_of(*id) {
                        None if live.is_cancelled() => {
                            movers.drop_task(*id);
                            *status = Some(Ok("before a data mover took it".into()));
                            return None;
                        }
                        None if !movers.any_alive() && since.elapsed() > MOVER_TIMEOUT => {
                            movers.drop_task(*id);
                            *status = Some(Err(format!(
                                "no data mover is alive (none for {} s): start `surge mover` \
                                 on hosts that mount the PFS",
                                MOVER_TIMEOUT.as_secs()
                            )));
                            return None;
                        }
                        Some(h) if !movers.alive(&h) => {
                            movers.drop_task(*id);
                            *status = Some(Err(format!(
                                "data mover {h} was lost (not heard from for {} s)",
                                MOVER_TIMEOUT.as_secs()
                            )));
                            return None;
                        }
                        _ => {}
                    },
                }
            },
        }
    }

    /// How the worker ended.
    async fn end(self) -> Result<String, String> {
        match self {
            Source::Local { mut child, .. } => child
                .wait()
                .await
                .map(|st| st.to_string())
                .map_err(|e| e.to_string()),
            Source::Mover { status, .. } => {
                status.unwrap_or_else(|| Err("its data mover stopped reporting".into()))
            }
        }
    }
}

/// Files in flight when neither the request nor the instance says.
const DEFAULT_WORKERS: usize = 32;
/// The most files in flight an instance's stage concurrency may ask for.
pub const MAX_STAGE_CONCURRENCY: u32 = 256;

pub struct Stages {
    core: Arc<Core>,
    /// The `surge` binary, whose `stage worker` runs each task.
    exe: std::path::PathBuf,
    running: Mutex<HashMap<u64, Running>>,
    /// Files in flight for tasks of an instance that do not say (dw_set_stage_concurrency).
    concurrency: Mutex<HashMap<u64, usize>>,
    pub movers: Movers,
    pub stage_on: StageOn,
}

impl Stages {
    pub fn new(core: Arc<Core>) -> Stages {
        Stages::with(core, StageOn::Local)
    }

    pub fn with(core: Arc<Core>, stage_on: StageOn) -> Stages {
        Stages::new_with(core, stage_on)
    }

    /// Starts listening for ended sessions: what they leave queued or running is stopped
    /// (a `surge run` killed while its cache drained, ended by the reconciliation, left its
    /// drain holding the journal for ever). Call once, on the `Arc` the manager serves.
    pub fn watch_sessions(self: &Arc<Self>) {
        let mut rx = self.core.ended.subscribe();
        let this = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let id = match rx.recv().await {
                    Ok(id) => id,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => return,
                };
                let Some(stages) = this.upgrade() else { return };
                if let Err(e) = stages.stop_session_tasks(id).await {
                    warn!("session {id}: cannot stop its stage tasks: {e}");
                }
            }
        });
    }

    /// Stops the deferred, queued and running tasks of an ended session (without waiting for
    /// the running ones: their workers stop at their next chunk).
    pub async fn stop_session_tasks(&self, session: u64) -> MResult<usize> {
        let mut n = self.cancel_deferred(session).await?;
        for row in self.core.store.stages(session).await? {
            if !matches!(row.state.as_str(), "queued" | "running") {
                continue;
            }
            if let Some(r) = self.running.lock().get(&row.id) {
                info!(
                    "stage task {} ({}): session {session} ended: stopping it",
                    row.id, row.direction
                );
                r.live.cancel();
                n += 1;
            }
        }
        Ok(n)
    }

    fn new_with(core: Arc<Core>, stage_on: StageOn) -> Stages {
        Stages {
            core,
            exe: std::env::current_exe().unwrap_or_else(|_| "surge".into()),
            running: Mutex::new(HashMap::new()),
            concurrency: Mutex::new(HashMap::new()),
            movers: Movers::default(),
            stage_on,
        }
    }

    /// Tasks of mover `host` that were terminated (it stops their workers).
    pub fn cancelled_on(&self, ids: &[u64]) -> Vec<u64> {
        let running = self.running.lock();
        ids.iter()
            .copied()
            .filter(|id| running.get(id).is_some_and(|r| r.live.is_cancelled()))
            .collect()
    }

    async fn session_uses(&self, session: u64, instance: u64) -> MResult<()> {
        let session = self.core.session(session).await?;
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
        instance: &crate::store::InstanceRow,
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
    pub async fn set_concurrency(
        &self,
        session: u64,
        instance: u64,
        concurrency: u32,
    ) -> MResult<()> {
        self.session_uses(session, instance).await?;
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

    async fn finish(&self, row: &mut StageRow, state: &str, error: String) {
        row.state = state.into();
        row.error = error;
        if let Err(e) = self.core.store.update_stage(row).await {
            warn!("stage task {}: cannot record its result: {e}", row.id);
        }
    }

    /// Records and starts a stage task (or only records it, if `deferred`). Errors found while
    /// planning (missing source, no space) fail the task, which is returned in state `failed`
    /// with the reason.
    pub async fn start(self: &Arc<Self>, req: api::StartStageRequest) -> MResult<StageRow> {
        let (direction, cache) = parse_direction(&req.direction)?;
        self.session_uses(req.session, req.instance).await?;
        let owner = self.core.session(req.session).await?;
        self.core
            .check_quota(owner.owner_uid, owner.owner_gid, (0, 0, 0, 1))
            .await?;
        let inst = self.core.instance(req.instance, "").await?;
        if cache.is_some() && inst.descriptor.cache_pfs.is_none() {
            return Err(ManagerError::Invalid(format!(
                "instance {} is not a type=cache instance: it has nothing to {}",
                inst.id, req.direction
            )));
        }
        let ns = req.namespace;
        if namespace_for(&inst, ns).0 != ns {
            return Err(ManagerError::Invalid(format!(
                "instance {} has no namespace {ns}",
                inst.id
            )));
        }
        let items: Vec<StageItem> = serde_json::from_str(&req.items_json)
            .map_err(|e| ManagerError::Invalid(format!("stage items are not valid JSON: {e}")))?;
        if items.is_empty() && cache.is_none() {
            return Err(ManagerError::Invalid(
                "a stage task needs at least one item".into(),
            ));
        }
        let mut row = StageRow {
            id: 0,
            session: req.session,
            instance: inst.id,
            ns,
            direction: cache.map_or(direction.as_str(), CacheWork::as_str).into(),
            items_json: req.items_json.clone(),
            origin: req.origin.clone(),
            state: if req.deferred { "deferred" } else { "running" }.into(),
            files_total: 0,
            files_done: 0,
            bytes_total: 0,
            bytes_done: 0,
            seconds: 0.0,
            failures_json: "[]".into(),
            error: String::new(),
            created: crate::store::now(),
        };
        row.id = self.core.store.create_stage(&row).await?;
        if req.deferred {
            info!(
                "stage task {} ({}): deferred until activated",
                row.id, row.direction
            );
            return Ok(row);
        }
        let opts = self.options(&inst, req.workers, req.checksum);
        let work = self
            .work(&row, &inst, (direction, cache), items, opts)
            .await?;
        Ok(self.launch(row, work).await)
    }

    /// What the worker of `row` gets: the task, and a capability for the session's owner.
    async fn work(
        &self,
        row: &StageRow,
        inst: &crate::store::InstanceRow,
        (direction, cache): (Direction, Option<CacheWork>),
        items: Vec<StageItem>,
        opts: StageOptions,
    ) -> MResult<Work> {
        let session = self.core.session(row.session).await?;
        let owner = surge_auth::Caller::of(session.owner_uid, session.owner_gid);
        let (token, _) = self.core.capability(&owner, inst, Some(row.ns))?;
        Ok(Work {
            desc: inst.descriptor.clone(),
            direction,
            items,
            opts,
            cache,
            persistent: inst.kind == "persistent",
            owner,
            token,
        })
    }

    /// Starts a deferred task.
    pub async fn activate(self: &Arc<Self>, id: u64) -> MResult<StageRow> {
        let mut row = self.get(id).await?;
        if row.state != "deferred" {
            return Err(ManagerError::Invalid(format!(
                "stage task {id} is {}, not deferred",
                row.state
            )));
        }
        self.session_uses(row.session, row.instance).await?;
        info!("stage task {id} ({}): activated", row.direction);
        row.state = "running".into();
        self.run_recorded(row).await
    }

    /// Starts the worker of a recorded task (`row.state` is recorded as it is given, progress
    /// from zero): a deferred task activated, or one a previous manager left running.
    async fn run_recorded(self: &Arc<Self>, mut row: StageRow) -> MResult<StageRow> {
        let id = row.id;
        let (direction, cache) = parse_direction(&row.direction)?;
        let items: Vec<StageItem> = serde_json::from_str(&row.items_json).map_err(|e| {
            ManagerError::Invalid(format!("stage task {id}: items are not valid JSON: {e}"))
        })?;
        let inst = self.core.instance(row.instance, "").await?;
        row.files_done = 0;
        row.bytes_done = 0;
        row.seconds = 0.0;
        self.core.store.update_stage(&row).await?;
        let opts = self.options(&inst, 0, false);
        let work = self
            .work(&row, &inst, (direction, cache), items, opts)
            .await?;
        Ok(self.launch(row, work).await)
    }

    /// At start, and on taking the lead: the tasks the previous manager left queued or
    /// running go on. One that a data mover still runs is adopted when the mover reports it
    /// ([`Self::adopt`]); every other one runs again from the start under its id once no
    /// mover has claimed it within [`ADOPT_WAIT`] (at once with `--stage-on local`: the
    /// previous manager's workers died with it). Running a copy again is safe: files land
    /// through temporaries and renames. Returns how many tasks are being resumed.
    pub async fn resume(self: &Arc<Self>) -> MResult<usize> {
        let rows: Vec<StageRow> = self
            .core
            .store
            .open_stages()
            .await?
            .into_iter()
            .filter(|r| matches!(r.state.as_str(), "queued" | "running"))
            .collect();
        let n = rows.len();
        if n == 0 {
            return Ok(0);
        }
        let wait = match self.stage_on {
            StageOn::Local => Duration::ZERO,
            StageOn::Auto | StageOn::Movers => ADOPT_WAIT,
        };
        info!(
            "{n} stage task(s) the previous manager left running: those no data mover reports \
             within {} s run again",
            wait.as_secs()
        );
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            for mut row in rows {
                let id = row.id;
                {
                    // Claimed here, so a late report from a mover cannot adopt it too.
                    let mut running = this.running.lock();
                    if running.contains_key(&id) {
                        continue; // adopted meanwhile
                    }
                    running.insert(
                        id,
                        Running {
                            instance: row.instance,
                            live: Arc::new(Live::default()),
                        },
                    );
                }
                row.state = "running".into();
                match this.run_recorded(row.clone()).await {
                    Ok(r) => info!(
                        "stage task {id} ({}): run again after the manager changed: {}",
                        r.direction, r.state
                    ),
                    Err(e) => {
                        this.running.lock().remove(&id);
                        warn!("stage task {id}: cannot run it again: {e}");
                        this.finish(
                            &mut row,
                            "failed",
                            format!("interrupted by the manager's stop; not resumed: {e}"),
                        )
                        .await;
                    }
                }
            }
        });
        Ok(n)
    }

    /// Task `id`, reported by data mover `host` though this manager did not give it: one a
    /// previous manager gave, still running there. Followed from now on as if given here.
    /// False if it is not an open task, or is already run or followed here.
    pub async fn adopt(self: &Arc<Self>, id: u64, host: &str) -> bool {
        let Ok(Some(mut row)) = self.core.store.stage(id).await else {
            return false;
        };
        if !matches!(row.state.as_str(), "queued" | "running") {
            return false;
        }
        let live = Arc::new(Live::default());
        {
            let mut running = self.running.lock();
            if running.contains_key(&id) || self.movers.follows(id) {
                return false;
            }
            running.insert(
                id,
                Running {
                    instance: row.instance,
                    live: live.clone(),
                },
            );
        }
        let rx = self.movers.adopt(id, host);
        info!(
            "stage task {id} ({}): adopted from data mover {host}",
            row.direction
        );
        if row.state != "running" {
            row.state = "running".into();
            if let Err(e) = self.core.store.update_stage(&row).await {
                warn!("stage task {id}: cannot record it running: {e}");
            }
        }
        let source = Source::Mover {
            id,
            rx,
            status: None,
            since: std::time::Instant::now(),
        };
        let (planned, _) = tokio::sync::oneshot::channel();
        let this = self.clone();
        tokio::spawn(async move { this.follow(row, source, live, planned).await });
        true
    }

    /// Terminates a task: a deferred or queued one is marked cancelled, a running one is asked
    /// to stop and awaited (it stops at its next chunk; files not finished are removed), a
    /// failed one is marked cancelled with its failures kept (DataWarp: a failed stage stays
    /// failed until it is terminated).
    pub async fn cancel(&self, id: u64) -> MResult<StageRow> {
        let mut row = self.get(id).await?;
        match row.state.as_str() {
            "deferred" | "queued" => {
                self.finish(&mut row, "cancelled", "terminated before it ran".into())
                    .await;
                Ok(row)
            }
            "failed" => {
                let error = std::mem::take(&mut row.error);
                self.finish(
                    &mut row,
                    "cancelled",
                    format!("terminated after failing: {error}"),
                )
                .await;
                Ok(row)
            }
            "running" => {
                if let Some(r) = self.running.lock().get(&id) {
                    r.live.cancel();
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
                self.get(id).await
            }
            other => Err(ManagerError::Invalid(format!(
                "stage task {id} has already ended ({other})"
            ))),
        }
    }

    /// Cancels the deferred tasks of a session that ends (their job end has passed).
    pub async fn cancel_deferred(&self, session: u64) -> MResult<usize> {
        let rows = self.core.store.stages(session).await?;
        let mut n = 0;
        for mut row in rows.into_iter().filter(|r| r.state == "deferred") {
            self.finish(
                &mut row,
                "cancelled",
                "the session ended before this deferred stage was activated".into(),
            )
            .await;
            n += 1;
        }
        Ok(n)
    }

    /// Starts the worker of a recorded task; answers once it is planned (or failed planning).
    async fn launch(self: &Arc<Self>, row: StageRow, work: Work) -> StageRow {
        let live = Arc::new(Live::default());
        self.running.lock().insert(
            row.id,
            Running {
                instance: row.instance,
                live: live.clone(),
            },
        );
        let (planned_tx, planned_rx) = tokio::sync::oneshot::channel::<StageRow>();
        let this = self.clone();
        let fallback = row.clone();
        tokio::spawn(async move { this.run_task(row, work, live, planned_tx).await });
        match planned_rx.await {
            Ok(r) => r,
            Err(_) => self.get(fallback.id).await.unwrap_or(fallback),
        }
    }

    /// Where a task's worker runs: on a data mover when one is alive (or `--stage-on
    /// movers`), else here.
    fn on_mover(&self) -> bool {
        match self.stage_on {
            StageOn::Local => false,
            StageOn::Movers => true,
            StageOn::Auto => self.movers.any_alive(),
        }
    }

    /// Starts the worker of `task` here or hands it to the movers.
    fn start_worker(
        &self,
        id: u64,
        task: &Task,
        owner: &surge_auth::Caller,
        live: &Live,
    ) -> Result<Source, String> {
        if self.on_mover() {
            let task_json = serde_json::to_string(task).map_err(|e| e.to_string())?;
            let rx = self.movers.enqueue(id, task_json, owner);
            info!("stage task {id}: queued for a data mover");
            return Ok(Source::Mover {
                id,
                rx,
                status: None,
                since: std::time::Instant::now(),
            });
        }
        let mut child = surge_stage::worker::spawn(
            &self.exe,
            task,
            owner.uid,
            owner.gid,
            owner.groups.clone(),
        )?;
        let pid = child.id().unwrap_or(0);
        live.pid.store(pid, std::sync::atomic::Ordering::SeqCst);
        info!("stage task {id}: worker {pid} started here");
        if live.is_cancelled() {
            live.cancel();
        }
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| "the stage worker has no stdout".to_string())?;
        Ok(Source::Local {
            child: Box::new(child),
            lines: surge_stage::worker::Lines::new(stdout),
        })
    }

    async fn run_task(
        self: Arc<Self>,
        mut row: StageRow,
        work: Work,
        live: Arc<Live>,
        planned: tokio::sync::oneshot::Sender<StageRow>,
    ) {
        let Work {
            desc,
            direction,
            items,
            opts,
            cache,
            persistent,
            owner,
            token,
        } = work;
        let task = Task {
            desc,
            ns: row.ns,
            token: token.to_text(),
            direction,
            items,
            opts,
            cache,
            persistent,
        };
        let source = match self.start_worker(row.id, &task, &owner, &live) {
            Ok(s) => s,
            Err(e) => {
                self.finish(&mut row, "failed", e).await;
                self.running.lock().remove(&row.id);
                let _ = planned.send(row);
                return;
            }
        };
        self.follow(row, source, live, planned).await;
    }

    /// Follows a task's worker to its end, recording what it reports.
    async fn follow(
        self: Arc<Self>,
        mut row: StageRow,
        mut source: Source,
        live: Arc<Live>,
        planned: tokio::sync::oneshot::Sender<StageRow>,
    ) {
        let mut planned = Some(planned);
        let mut ended = false;
        while let Some(ev) = source.next(&self.movers, &live).await {
            match ev {
                Event::Planned { files, bytes } => {
                    row.files_total = files;
                    row.bytes_total = bytes;
                    let _ = self.core.store.update_stage(&row).await;
                    if let Some(p) = planned.take() {
                        let _ = p.send(row.clone());
                    }
                }
                Event::Progress(s) => {
                    row.files_done = s.files_done;
                    row.bytes_done = s.bytes_done;
                    row.seconds = s.elapsed.as_secs_f64();
                    *live.snap.lock() = Some(s);
                }
                Event::Done(report) => {
                    ended = true;
                    self.done(&mut row, report).await;
                }
                Event::Cancelled => {
                    ended = true;
                    info!("stage task {} ({}): terminated", row.id, row.direction);
                    self.finish(&mut row, "cancelled", TERMINATED.into()).await;
                }
                Event::Failed(msg) => {
                    ended = true;
                    self.finish(&mut row, "failed", msg).await;
                }
            }
        }
        let status = source.end().await;
        if !ended {
            let why = match status {
                Ok(st) if live.is_cancelled() => format!("{TERMINATED} ({st})"),
                Ok(st) => format!("the stage worker stopped ({st}) before reporting"),
                Err(e) => format!("the stage worker was lost: {e}"),
            };
            let state = if live.is_cancelled() {
                "cancelled"
            } else {
                "failed"
            };
            self.finish(&mut row, state, why).await;
        }
        self.running.lock().remove(&row.id);
        if let Some(p) = planned.take() {
            let _ = p.send(row);
        }
    }

    /// Records the report of a finished copy.
    async fn done(&self, row: &mut StageRow, report: surge_stage::StageReport) {
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
            self.finish(row, "done", String::new()).await;
        } else {
            let n = report.failed();
            warn!(
                "stage task {} ({}): {n} files failed",
                row.id, row.direction
            );
            let listed = if report.failures_more > 0 {
                format!(" (the first {} listed)", report.failures.len())
            } else {
                String::new()
            };
            self.finish(
                row,
                "failed",
                format!("{n} file(s) could not be copied{listed}"),
            )
            .await;
        }
    }

    /// A task, with live progress while it runs.
    pub async fn get(&self, id: u64) -> MResult<StageRow> {
        let mut row = self
            .core
            .store
            .stage(id)
            .await?
            .ok_or_else(|| ManagerError::NotFound(format!("stage task {id} does not exist")))?;
        self.overlay(&mut row);
        Ok(row)
    }

    fn overlay(&self, row: &mut StageRow) {
        if let Some(r) = self.running.lock().get(&row.id) {
            let Some(s) = r.live.snap.lock().clone() else {
                return;
            };
            row.files_done = s.files_done;
            row.bytes_done = s.bytes_done;
            row.seconds = s.elapsed.as_secs_f64();
            if s.files_total > 0 {
                row.files_total = s.files_total;
                row.bytes_total = s.bytes_total;
            }
        }
    }

    /// The tasks of `session` (0: of every session), the newest [`crate::core::MAX_PAGE`] at
    /// most, oldest first.
    pub async fn list(&self, session: u64) -> MResult<Vec<StageRow>> {
        let mut rows = self.page(session, 0, crate::core::MAX_PAGE).await?;
        rows.reverse();
        Ok(rows)
    }

    /// A page of tasks, newest first, with live progress.
    pub async fn page(&self, session: u64, before: u64, limit: u32) -> MResult<Vec<StageRow>> {
        let mut rows = self
            .core
            .store
            .stages_page(session, before, crate::core::page_limit(limit))
            .await?;
        for r in &mut rows {
            self.overlay(r);
        }
        Ok(rows)
    }

    /// Tasks not ended, with live progress.
    pub async fn open(&self) -> MResult<Vec<StageRow>> {
        let mut rows = self.core.store.open_stages().await?;
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
