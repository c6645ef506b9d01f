//! `surge bb <phase>`: the burst-buffer phases a workload manager calls for a job (Slurm's
//! `burst_buffer/lua` hooks in `contrib/slurm/burst_buffer.lua`), each an idempotent step of
//! the job's session, which the manager keeps (its `phase`, hosts and wanted mounts):
//!
//! | phase      | Slurm hook            | does                                                        |
//! |------------|-----------------------|-------------------------------------------------------------|
//! | validate   | slurm_bb_job_process  | parses the script; errors name the line (sbatch refuses it) |
//! | pools      | slurm_bb_pools        | pools, granularity and free space as Slurm's JSON          |
//! | setup      | slurm_bb_setup        | creates persistent instances, opens the session, allocates |
//! | data_in    | slurm_bb_data_in      | stages in (a task already done is not redone)             |
//! | paths      | slurm_bb_paths        | writes DW_JOB_STRIPED=... for the job's environment        |
//! | pre_run    | slurm_bb_pre_run      | asks the agents of the job's hosts to mount, waits for it  |
//! | post_run   | slurm_bb_post_run     | asks them to unmount, waits for it                         |
//! | data_out   | slurm_bb_data_out     | stages out (also the job's deferred stage-outs)            |
//! | teardown   | slurm_bb_job_teardown | unmounts, ends the session (keeps the job instance if a    |
//! |            |                       | stage-out failed), destroys `#BB destroy_persistent`       |
//! | reconcile  | (from slurm_bb_pools) | ends sessions of jobs Slurm forgot or ended in stage-in    |
//!
//! Each phase finds the session by the job's id (`slurm:<id>`), so any phase may be re-run
//! after a crash of the manager, the hook or the controller, and teardown after anything.

use crate::jobplan::{self, StageGroup};
use crate::progress::wait_stage;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use surge_api::v1 as api;
use surge_client::InstanceClient;
use surge_core::directives::{parse_script, Directives, DwVariable};
use surge_core::{format_bytes, NamespaceId};
use surge_manager::cli::{connect, status_err};
use surge_proto::InstanceDescriptor;

/// Run one burst-buffer phase of a job for a workload manager (Slurm's burst_buffer/lua).
///
/// Every phase is idempotent and finds the job's session by --job-id, so a hook may be re-run
/// after any crash. Output on stdout/stderr is what the hook reports to Slurm; the exit status
/// is 0 on success. The manager is --manager or $SURGE_MANAGER; callers authenticate with
/// MUNGE (SlurmUser must be in the manager's --admin-group to act for the job's owner).
///
/// Example (what contrib/slurm/burst_buffer.lua runs):
///   surge bb validate job.sh
///   surge bb setup --job-id 42 --uid 1001 --gid 1001 --nodes 2 --script job.sh
///   surge bb data_in --job-id 42 --script job.sh --workdir /home/alice
///   surge bb paths --job-id 42 --script job.sh --path-file /var/spool/.../path
///   surge bb pre_run --job-id 42 --script job.sh --hosts c1,c2
///   surge bb post_run --job-id 42 --script job.sh
///   surge bb data_out --job-id 42 --script job.sh --workdir /home/alice
///   surge bb teardown --job-id 42 --script job.sh [--hurry]
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct BbArgs {
    #[command(subcommand)]
    pub phase: Phase,
}

#[derive(clap::Subcommand, Debug, Clone)]
pub enum Phase {
    /// Parse a job script's #DW/#BB directives; print the errors (with file:line) and exit 1
    /// if any.
    Validate {
        /// The job script.
        script: PathBuf,
        /// The name messages give the script (Slurm passes a copy in its state directory).
        #[arg(long)]
        name: Option<String>,
        /// Print the directives as JSON when they are valid.
        #[arg(long)]
        json: bool,
    },
    /// The compute-node agents the manager hears from, with their mounts.
    Agents {
        #[command(flatten)]
        c: Common,
        /// As JSON: [{"host", "alive", "last_seen", "mounts": [...], "failed": [...]}].
        #[arg(long)]
        json: bool,
    },
    /// The manager's pools as Slurm's burst_buffer/lua wants them:
    /// {"pools":[{"id","quantity","granularity","free"}]}.
    Pools(Common),
    /// Create the script's persistent instances and the job's session (allocates its job
    /// instance, attaches `#DW persistentdw` instances).
    Setup {
        #[command(flatten)]
        c: Job,
        /// The job's owner (Slurm's uid of the job).
        #[arg(long)]
        uid: u32,
        /// The job's group (Slurm's gid of the job).
        #[arg(long)]
        gid: u32,
        /// Nodes of the job (a private instance has one namespace per node).
        #[arg(long, default_value_t = 1)]
        nodes: u32,
    },
    /// Stage the script's stage_in directives into the job's instances.
    #[command(name = "data_in", alias = "data-in")]
    DataIn {
        #[command(flatten)]
        c: Job,
        /// Relative stage paths are relative to this directory (the job's working directory).
        #[arg(long, default_value = "/")]
        workdir: PathBuf,
    },
    /// Write the job's environment variables (DW_JOB_STRIPED=... one per line) to a file.
    Paths {
        #[command(flatten)]
        c: Job,
        /// Slurm's path_file: one NAME=value per line is added to the job's environment.
        #[arg(long, value_name = "FILE")]
        path_file: PathBuf,
    },
    /// Have the agents of the job's hosts mount its instances; wait until they have.
    #[command(name = "pre_run", alias = "pre-run")]
    PreRun {
        #[command(flatten)]
        c: Job,
        /// The job's hosts in node order (comma-separated; node i of a private instance gets
        /// namespace i).
        #[arg(long, value_delimiter = ',', required = true)]
        hosts: Vec<String>,
        /// Seconds to wait for the agents.
        #[arg(long, default_value_t = 60.0)]
        timeout: f64,
    },
    /// Have the agents unmount the job's instances (every close reaches the servers); wait.
    #[command(name = "post_run", alias = "post-run")]
    PostRun {
        #[command(flatten)]
        c: Job,
        /// Seconds to wait for the agents to unmount.
        #[arg(long, default_value_t = 60.0)]
        timeout: f64,
    },
    /// Stage the script's stage_out directives (and the job's deferred stage-outs) out.
    #[command(name = "data_out", alias = "data-out")]
    DataOut {
        #[command(flatten)]
        c: Job,
        /// Relative stage paths are relative to this directory (the job's working directory).
        #[arg(long, default_value = "/")]
        workdir: PathBuf,
    },
    /// End the sessions of jobs the workload manager forgot (Slurm calls no teardown for them)
    /// or that ended during setup or stage-in: unmount, stop their stage tasks, end them as
    /// "abandoned" (a job instance whose stage-out failed is kept). `burst_buffer.lua` starts
    /// it in the background from the periodic pools hook; an admin may run it by hand.
    Reconcile {
        #[command(flatten)]
        c: Common,
        /// Only sessions whose external id is "<scheduler>:<job id>".
        #[arg(long, default_value = "slurm")]
        scheduler: String,
        /// Prints the jobs the workload manager knows, one "JOBID STATE" per line (run with
        /// sh -c; a failure ends nothing).
        #[arg(
            long,
            value_name = "COMMAND",
            default_value = "squeue --noheader --all --array --states=all --format='%A %T'"
        )]
        jobs_command: String,
        /// Say what would be ended; end nothing.
        #[arg(long)]
        dry_run: bool,
        /// As JSON: [{"job", "session", "phase", "reason", "result"}].
        #[arg(long)]
        json: bool,
    },
    /// Unmount, end the session (the job instance is kept if a stage-out failed), destroy the
    /// script's `#BB destroy_persistent` instances. Succeeds when there is nothing left.
    Teardown {
        #[command(flatten)]
        c: Job,
        /// The job was cancelled: stop its stage tasks, do not wait long for agents.
        #[arg(long)]
        hurry: bool,
    },
}

#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// The manager (default $SURGE_MANAGER).
    #[arg(long, env = "SURGE_MANAGER", value_name = "HOST:PORT")]
    pub manager: String,
}

#[derive(clap::Args, Debug, Clone)]
pub struct Job {
    #[command(flatten)]
    pub common: Common,
    /// The workload manager's job id.
    #[arg(long)]
    pub job_id: String,
    /// The job's script (its directives are read again in each phase).
    #[arg(long)]
    pub script: PathBuf,
    /// Prefix of the job id in the manager (sessions are "<prefix>:<id>").
    #[arg(long, default_value = "slurm")]
    pub scheduler: String,
}

impl Job {
    fn external(&self) -> String {
        format!("{}:{}", self.scheduler, self.job_id)
    }
    fn directives(&self) -> anyhow::Result<(String, Directives)> {
        let text = std::fs::read_to_string(&self.script)
            .with_context(|| format!("cannot read job script {}", self.script.display()))?;
        // Slurm passes a copy in its state directory: name the job instead.
        let name = format!("job {} script", self.job_id);
        match parse_script(&name, &text) {
            Ok(d) => Ok((name, d)),
            Err(errs) => anyhow::bail!(
                "{}",
                errs.0
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join("\n")
            ),
        }
    }
}

pub fn run(args: BbArgs) -> anyhow::Result<ExitCode> {
    if let Phase::Validate { script, json, name } = &args.phase {
        return validate(script, name.as_deref(), *json);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    // Every phase is idempotent: one cut by a manager that died or lost its lead (several
    // managers on etcd, `--manager a,b`) is run again, against the next leader, for as long
    // as a failover takes.
    let start = Instant::now();
    loop {
        match rt.block_on(phase(&args.phase)) {
            Err(e)
                if surge_api::manager_gone(e.as_ref())
                    && start.elapsed() < surge_api::FAILOVER_WAIT
                    && args.phase.manager().contains(',') =>
            {
                eprintln!("surge bb: the manager went away ({e:#}); running the phase again");
                std::thread::sleep(Duration::from_millis(500));
            }
            r => {
                r?;
                return Ok(ExitCode::SUCCESS);
            }
        }
    }
}

impl Phase {
    /// The manager (list) the phase talks to.
    fn manager(&self) -> &str {
        match self {
            Phase::Validate { .. } => "",
            Phase::Pools(c) | Phase::Agents { c, .. } | Phase::Reconcile { c, .. } => &c.manager,
            Phase::Setup { c, .. }
            | Phase::DataIn { c, .. }
            | Phase::Paths { c, .. }
            | Phase::PreRun { c, .. }
            | Phase::PostRun { c, .. }
            | Phase::DataOut { c, .. }
            | Phase::Teardown { c, .. } => &c.common.manager,
        }
    }
}

async fn phase(phase: &Phase) -> anyhow::Result<()> {
    {
        match phase.clone() {
            Phase::Validate { .. } => unreachable!("handled above"),
            Phase::Pools(c) => pools(&c).await,
            Phase::Agents { c, json } => agents(&c, json).await,
            Phase::Setup { c, uid, gid, nodes } => setup(&c, uid, gid, nodes).await,
            Phase::DataIn { c, workdir } => data_in(&c, &workdir).await,
            Phase::Paths { c, path_file } => paths(&c, &path_file).await,
            Phase::PreRun { c, hosts, timeout } => pre_run(&c, hosts, timeout).await,
            Phase::PostRun { c, timeout } => post_run(&c, timeout).await,
            Phase::DataOut { c, workdir } => data_out(&c, &workdir).await,
            Phase::Teardown { c, hurry } => teardown(&c, hurry).await,
            Phase::Reconcile {
                c,
                scheduler,
                jobs_command,
                dry_run,
                json,
            } => reconcile(&c, &scheduler, &jobs_command, dry_run, json).await,
        }
    }
}

fn validate(script: &Path, name: Option<&str>, json: bool) -> anyhow::Result<ExitCode> {
    let name = name.map_or_else(|| script.display().to_string(), str::to_string);
    let text = std::fs::read_to_string(script)
        .with_context(|| format!("cannot read job script {name}"))?;
    if let Some((n, _)) = text.lines().enumerate().find(|(_, l)| l.ends_with('\r')) {
        println!(
            "{name}:{}: the script has Windows (CRLF) line endings; convert it with \
             `sed -i 's/\\r$//' {name}`",
            n + 1
        );
        return Ok(ExitCode::from(1));
    }
    match parse_script(&name, &text) {
        Ok(d) => {
            for w in &d.warnings {
                eprintln!(
                    "{}:{}: warning: `{}`: {}",
                    w.file, w.line, w.text, w.message
                );
            }
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "jobdw": d.jobdw.as_ref().map(|j| serde_json::json!({
                            "capacity": j.capacity,
                            "access_mode": j.access_mode.as_str(),
                            "pool": j.pool,
                        })),
                        "persistentdw": d.persistentdw.iter().map(|p| &p.name).collect::<Vec<_>>(),
                        "stage_in": d.stage_in.len(),
                        "stage_out": d.stage_out.len(),
                    })
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(errs) => {
            for e in &errs.0 {
                println!("{e}");
            }
            Ok(ExitCode::from(1))
        }
    }
}

async fn pools(c: &Common) -> anyhow::Result<()> {
    let mut m = connect(&c.manager).await?;
    let pools = m
        .list_pools(api::Empty {})
        .await
        .map_err(status_err)?
        .into_inner()
        .pools;
    let out: Vec<serde_json::Value> = pools
        .iter()
        .map(|p| {
            let g = p.granularity.max(1);
            serde_json::json!({
                "id": p.name,
                "granularity": g,
                "quantity": p.capacity / g,
                "free": p.free / g,
            })
        })
        .collect();
    println!("{}", serde_json::json!({ "pools": out }));
    Ok(())
}

async fn agents(c: &Common, json: bool) -> anyhow::Result<()> {
    let mut m = connect(&c.manager).await?;
    let agents = m
        .list_agents(api::Empty {})
        .await
        .map_err(status_err)?
        .into_inner()
        .agents;
    if json {
        let v: Vec<serde_json::Value> = agents
            .iter()
            .map(|a| {
                serde_json::json!({
                    "host": a.host, "alive": a.alive, "last_seen": a.last_seen,
                    "mounts": a.mounts.iter().map(|m| serde_json::json!({
                        "session": m.session, "instance": m.instance, "namespace": m.namespace,
                        "path": m.path, "owner_uid": m.owner_uid})).collect::<Vec<_>>(),
                    "failed": a.failed.iter().map(|m| serde_json::json!({
                        "session": m.session, "path": m.path, "error": m.error})).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(v));
        return Ok(());
    }
    println!(
        "{:<16} {:<6} {:>7} {:>7}",
        "host", "state", "mounts", "failed"
    );
    for a in &agents {
        println!(
            "{:<16} {:<6} {:>7} {:>7}",
            a.host,
            if a.alive { "alive" } else { "dead" },
            a.mounts.len(),
            a.failed.len()
        );
    }
    Ok(())
}

async fn find(m: &mut surge_api::Client, job: &Job) -> anyhow::Result<Option<api::Session>> {
    match m
        .find_session(api::FindSessionRequest {
            external_id: job.external(),
        })
        .await
    {
        Ok(s) => Ok(Some(s.into_inner())),
        Err(e) if e.code() == tonic::Code::NotFound => Ok(None),
        Err(e) => Err(status_err(e)),
    }
}

/// What a session lacks of what the script's directives ask for (its job instance, a
/// persistent instance it attaches), if anything: no phase lets a job run without them.
fn missing(d: &surge_core::directives::Directives, s: &api::Session) -> Option<String> {
    if d.jobdw.is_some()
        && (s.job_instance == 0 || !s.instances.iter().any(|i| i.id == s.job_instance))
    {
        return Some("its job instance".into());
    }
    let lacking: Vec<String> = attached(d)
        .into_iter()
        .filter(|n| {
            !s.instances
                .iter()
                .any(|i| i.id != s.job_instance && &i.name == n)
        })
        .collect();
    (!lacking.is_empty()).then(|| format!("persistent instance(s) {}", lacking.join(", ")))
}

/// The job's active session, complete: a session without an instance its directives ask for
/// is an error here, so `paths` and `pre_run` never let such a job start.
async fn complete_session(m: &mut surge_api::Client, job: &Job) -> anyhow::Result<api::Session> {
    let s = session(m, job).await?;
    let (name, d) = job.directives()?;
    if let Some(what) = missing(&d, &s) {
        anyhow::bail!(
            "job {}: session {} lacks {what} that {name} asks for: the job must not run \
             (re-run setup, or end the session with `surge session end {}`)",
            job.job_id,
            s.id,
            s.id
        );
    }
    Ok(s)
}

async fn session(m: &mut surge_api::Client, job: &Job) -> anyhow::Result<api::Session> {
    let s = find(m, job).await?.with_context(|| {
        format!(
            "job {} has no burst-buffer session (was setup run?)",
            job.job_id
        )
    })?;
    anyhow::ensure!(
        s.state == "active",
        "job {}: session {} is {}",
        job.job_id,
        s.id,
        s.state
    );
    Ok(s)
}

/// Records the phase session `s` is in (hosts and mounts: the scheduler's, see the manager).
pub async fn set_phase(
    m: &mut surge_api::Client,
    s: &api::Session,
    phase: &str,
    hosts: Vec<String>,
    mount: bool,
) -> anyhow::Result<api::Session> {
    Ok(m.set_session_phase(api::SetSessionPhaseRequest {
        id: s.id,
        phase: phase.into(),
        hosts,
        mount,
    })
    .await
    .map_err(status_err)?
    .into_inner())
}

/// The persistent instances a job's session attaches: its `persistentdw` ones, and the
/// persistent caches it creates (their fill and drain are stage tasks of the session).
fn attached(d: &surge_core::directives::Directives) -> Vec<String> {
    let mut names: Vec<String> = d.persistentdw.iter().map(|p| p.name.clone()).collect();
    for cp in d
        .create_persistent
        .iter()
        .filter(|cp| cp.cache.pfs.is_some())
    {
        if !names.contains(&cp.name) {
            names.push(cp.name.clone());
        }
    }
    names
}

async fn setup(job: &Job, uid: u32, gid: u32, nodes: u32) -> anyhow::Result<()> {
    let (name, d) = job.directives()?;
    let mut m = connect(&job.common.manager).await?;
    if let Some(s) = find(&mut m, job).await?.filter(|s| s.state == "active") {
        match missing(&d, &s) {
            None => {
                println!("job {}: session {} (already set up)", job.job_id, s.id);
                return Ok(());
            }
            // A session without what the script asks for (made by a manager that crashed in
            // the middle of a setup, before setups were all or nothing): ended, made anew.
            Some(what) => {
                eprintln!(
                    "job {}: session {} lacks {what}: ending it and setting up again",
                    job.job_id, s.id
                );
                m.end_session(api::EndSessionRequest {
                    id: s.id,
                    keep_job_instance: false,
                    state: "failed".into(),
                })
                .await
                .map_err(status_err)?;
            }
        }
    }
    for cp in &d.create_persistent {
        let r = m
            .create_instance(persistent_request(
                cp,
                cp.pool.clone().unwrap_or_default(),
                uid,
                gid,
            ))
            .await;
        match r {
            Ok(_) => println!("created persistent instance {}", cp.name),
            // Re-run after a crash: the instance is there, and the job's owner's.
            Err(e) if e.code() == tonic::Code::AlreadyExists || e.message().contains("exists") => {
                let i = m
                    .get_instance(api::GetInstanceRequest {
                        id: 0,
                        persistent_name: cp.name.clone(),
                    })
                    .await
                    .map_err(|_| {
                        anyhow::anyhow!(
                            "{name}:{}: #BB create_persistent name={}: {}",
                            cp.line,
                            cp.name,
                            e.message()
                        )
                    })?
                    .into_inner();
                anyhow::ensure!(
                    i.owner_uid == uid,
                    "{name}:{}: #BB create_persistent name={}: a persistent instance of that \
                     name belongs to uid {}",
                    cp.line,
                    cp.name,
                    i.owner_uid
                );
            }
            Err(e) => anyhow::bail!(
                "{name}:{}: #BB create_persistent name={}: {}",
                cp.line,
                cp.name,
                e.message()
            ),
        }
    }
    let job_req = d.jobdw.as_ref().map(|j| api::CreateInstanceRequest {
        capacity: j.capacity,
        access_mode: j.access_mode.as_str().into(),
        pool: j.pool.clone().unwrap_or_default(),
        persistent_name: String::new(),
        nodes: nodes.max(1),
        owner_uid: uid,
        owner_gid: gid,
        stripe_size: 0,
        share_with_group: false,
        // `#SURGE jobdw`: the manager sizes the instance from the pool's calibrated peaks.
        targets: crate::targets::request_targets(j),
        ..cache_request(&j.cache)
    });
    let s = m
        .create_session(api::CreateSessionRequest {
            job: job.external(),
            owner_uid: uid,
            owner_gid: gid,
            job_instance: job_req,
            persistent: attached(&d),
            external_id: job.external(),
        })
        .await
        .map_err(|e| {
            let line = d.jobdw.as_ref().map(|j| j.line).unwrap_or(0);
            anyhow::anyhow!(
                "{name}:{line}: cannot allocate the burst buffer: {}",
                e.message()
            )
        })?
        .into_inner();
    set_phase(&mut m, &s, "setup", Vec::new(), false).await?;
    let job_inst = s.instances.iter().find(|i| i.id == s.job_instance);
    println!(
        "job {}: session {}{}",
        job.job_id,
        s.id,
        job_inst.map_or(String::new(), |i| format!(
            ", job instance {} {} ({} fragments)",
            format_bytes(i.capacity),
            i.access_mode,
            i.fragments
        ))
    );
    if let Some(p) = job_inst.and_then(crate::targets::promise_of) {
        println!("job {}: {}", job.job_id, crate::targets::detail(&p));
        for w in &p.why {
            println!("job {}:   {w}", job.job_id);
        }
    }
    Ok(())
}

/// The instance a `#BB create_persistent` line asks for, for its owner.
pub fn persistent_request(
    cp: &surge_core::directives::CreatePersistent,
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
pub fn cache_request(c: &surge_core::directives::CacheSpec) -> api::CreateInstanceRequest {
    api::CreateInstanceRequest {
        cache_pfs: c.pfs.clone().unwrap_or_default(),
        cache_fsync_pfs: c.fsync_pfs,
        cache_dirty_high: c.dirty_high.map(|d| d.to_string()).unwrap_or_default(),
        cache_passthrough: c.passthrough,
        ..Default::default()
    }
}

/// The session's instance a `$DW_...` variable names.
fn instance_of<'a>(s: &'a api::Session, var: &DwVariable) -> Option<&'a api::Instance> {
    match var {
        DwVariable::PersistentStriped(n) => s.instances.iter().find(|i| &i.name == n),
        _ => s.instances.iter().find(|i| i.id == s.job_instance),
    }
}

fn private(i: &api::Instance) -> bool {
    i.access_mode == "private"
}

/// The namespaces a stage-in into `i` fills: one per node (private), every replica
/// (ldbalance), else the one.
fn stage_in_namespaces(i: &api::Instance) -> Vec<u32> {
    if private(i) {
        (0..i.nodes.max(1)).collect()
    } else if i.access_mode == "ldbalance" {
        let replicas = serde_json::from_str::<InstanceDescriptor>(&i.descriptor_json)
            .map_or(1, |d| d.namespaces.len().max(1));
        (0..replicas as u32).collect()
    } else {
        vec![0]
    }
}

/// Runs a stage task unless the same one (instance, namespace, direction, items) already
/// ran to the end in this session; waits for one already running. Idempotent.
async fn stage_once(
    m: &mut surge_api::Client,
    s: &api::Session,
    inst: u64,
    ns: u32,
    direction: &str,
    items_json: String,
) -> anyhow::Result<api::StageTask> {
    let origin = format!("data_{direction}");
    stage_once_in(
        m,
        s.id,
        inst,
        ns,
        direction,
        items_json,
        &origin,
        true,
        || false,
    )
    .await
}

/// [`stage_once`] for session `session` and phase `origin` (only tasks that phase asked for
/// count: the job's own stage-out of the same file, earlier, does not), with progress on
/// stderr unless `quiet`; `stop` gives up waiting (Ctrl-C of `surge run`).
#[allow(clippy::too_many_arguments)]
pub async fn stage_once_in(
    m: &mut surge_api::Client,
    session: u64,
    inst: u64,
    ns: u32,
    direction: &str,
    items_json: String,
    origin: &str,
    quiet: bool,
    stop: impl Fn() -> bool,
) -> anyhow::Result<api::StageTask> {
    let tasks = session_tasks(m, session).await?;
    let same = tasks.into_iter().rev().find(|t| {
        t.origin == origin
            && t.instance == inst
            && t.namespace == ns
            && t.direction == direction
            && t.items_json == items_json
    });
    let task = match same {
        Some(t) if t.state == "done" => return Ok(t),
        Some(t) if t.state == "running" || t.state == "queued" => t,
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
                origin: origin.into(),
            })
            .await
            .map_err(status_err)?
            .into_inner(),
    };
    wait_stage(m, task, &format!("stage {direction}"), quiet, stop).await
}

/// "stage in $DW_JOB_STRIPED (node 1): 3 files, 20 MiB in 0.2 s".
fn stage_line(
    direction: &str,
    g: &StageGroup,
    inst: &api::Instance,
    ns: u32,
    done: &api::StageTask,
    t: Instant,
) -> String {
    format!(
        "stage {direction} {}{}: {} files, {} in {:.1} s",
        g.instance,
        if private(inst) {
            format!(" (node {ns})")
        } else {
            String::new()
        },
        done.files_done,
        format_bytes(done.bytes_done),
        t.elapsed().as_secs_f64()
    )
}

fn failure_lines(t: &api::StageTask) -> Vec<String> {
    let mut out = Vec::new();
    if !t.error.is_empty() {
        out.push(t.error.clone());
    }
    out.extend(
        crate::job_stage::failures(t)
            .into_iter()
            .map(|(p, e)| format!("{p}: {e}")),
    );
    out
}

async fn data_in(job: &Job, workdir: &Path) -> anyhow::Result<()> {
    let (name, d) = job.directives()?;
    let mut m = connect(&job.common.manager).await?;
    let s = session(&mut m, job).await?;
    let s = set_phase(&mut m, &s, "data_in", Vec::new(), false).await?;
    let plan = jobplan::stage_in(&d, &name, workdir).map_err(|e| anyhow::anyhow!(e.join("\n")))?;
    for g in &plan.groups {
        let inst = instance_of(&s, &g.instance)
            .with_context(|| format!("{name}: {} is not an instance of this job", g.instance))?;
        for ns in stage_in_namespaces(inst) {
            let t = Instant::now();
            let done = stage_once(
                &mut m,
                &s,
                inst.id,
                ns,
                "in",
                serde_json::to_string(&g.items)?,
            )
            .await?;
            if done.state != "done" {
                anyhow::bail!(
                    "stage-in from {name}:{:?} failed: {}",
                    g.lines,
                    failure_lines(&done).join("; ")
                );
            }
            println!("{}", stage_line("in", g, inst, ns, &done, t));
        }
    }
    for (inst, pfs) in cache_instances(&s) {
        // The job instance and the persistent caches this job creates are new: filled first.
        let fill = inst.id == s.job_instance
            || d.create_persistent
                .iter()
                .any(|cp| cp.cache.pfs.is_some() && cp.name == inst.name);
        cache_fill_and_drain(&mut m, &s, inst, &pfs, fill).await?;
    }
    Ok(())
}

/// The session's `type=cache` instances (the job instance, persistent ones) and their PFS
/// directories.
fn cache_instances(s: &api::Session) -> Vec<(&api::Instance, String)> {
    s.instances
        .iter()
        .filter_map(|i| {
            let desc: surge_proto::InstanceDescriptor =
                serde_json::from_str(&i.descriptor_json).ok()?;
            Some((i, desc.cache_pfs?))
        })
        .collect()
}

/// The variable a job reaches instance `i` of session `s` by, for messages.
fn var_of(s: &api::Session, i: &api::Instance) -> String {
    if i.id == s.job_instance {
        DwVariable::JobStripedCache.env_name()
    } else {
        DwVariable::PersistentStriped(i.name.clone()).env_name()
    }
}

/// The stage tasks of session `session`.
async fn session_tasks(
    m: &mut surge_api::Client,
    session: u64,
) -> anyhow::Result<Vec<api::StageTask>> {
    Ok(m.list_stages(api::ListStagesRequest { session })
        .await
        .map_err(status_err)?
        .into_inner()
        .tasks)
}

/// `type=cache` (docs/DIRECTIVES.md "Cache instances"): the lazy fill of a new cache instance
/// from its PFS directory (`fill`: the job instance, a persistent cache this job creates), then
/// its drain, which runs in the background (a stage task, on a data mover when one is alive)
/// until [`finish_drains`] after the job.
async fn cache_fill_and_drain(
    m: &mut surge_api::Client,
    s: &api::Session,
    inst: &api::Instance,
    pfs: &str,
    fill: bool,
) -> anyhow::Result<()> {
    let var = var_of(s, inst);
    if fill {
        let t = Instant::now();
        let done = stage_once(m, s, inst.id, 0, "fill", "[]".into()).await?;
        if done.state != "done" {
            anyhow::bail!(
                "the fill of {var} from {pfs} failed: {}",
                failure_lines(&done).join("; ")
            );
        }
        println!(
            "fill {var} from {pfs}: {} files ({}, read from the PFS on first use) in {:.1} s",
            done.files_done,
            format_bytes(done.bytes_done),
            t.elapsed().as_secs_f64()
        );
    }
    let tasks = session_tasks(m, s.id).await?;
    if tasks.iter().any(|t| {
        t.instance == inst.id
            && t.direction == "drain"
            && (t.state == "running" || t.state == "queued")
    }) {
        return Ok(());
    }
    let d = m
        .start_stage(api::StartStageRequest {
            session: s.id,
            instance: inst.id,
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
    if d.state == "failed" {
        anyhow::bail!("the drain of {var} could not start: {}", d.error);
    }
    println!("drain {var} to {pfs}: started (stage task {})", d.id);
    Ok(())
}

/// `type=cache`, after the job (its mounts gone): the background drain is told to finish
/// (SIGTERM: it copies what is left, then ends) and awaited, then a `drain_all` task drains
/// whatever is still journaled (all of it when the first never ran). Returns the failures;
/// a failed drain keeps the job instance, its data the only copy.
async fn finish_drains(m: &mut surge_api::Client, s: &api::Session) -> anyhow::Result<Vec<String>> {
    let mut failures = Vec::new();
    for (inst, pfs) in cache_instances(s) {
        failures.extend(finish_drain(m, s, inst, &pfs).await?);
    }
    Ok(failures)
}

/// [`finish_drains`] of one cache instance of the session.
async fn finish_drain(
    m: &mut surge_api::Client,
    s: &api::Session,
    inst: &api::Instance,
    pfs: &str,
) -> anyhow::Result<Option<String>> {
    let var = var_of(s, inst);
    let tasks = session_tasks(m, s.id).await?;
    for t in tasks
        .into_iter()
        .filter(|t| t.instance == inst.id && t.direction == "drain" && t.state == "running")
    {
        // The manager waits 30 s for the task to end; a longer drain is awaited here.
        let t = match m.cancel_stage(api::GetStageRequest { id: t.id }).await {
            Ok(r) => r.into_inner(),
            Err(e) if e.code() == tonic::Code::Unavailable => t,
            Err(e) => return Err(status_err(e)),
        };
        if t.state == "running" {
            wait_stage(m, t, "drain", true, || false).await?;
        }
    }
    let t = Instant::now();
    let done = stage_once_in(
        m,
        s.id,
        inst.id,
        0,
        "drain_all",
        "[]".into(),
        "drain_all",
        true,
        || false,
    )
    .await?;
    let ran = session_tasks(m, s.id).await?.into_iter().filter(|t| {
        t.instance == inst.id && (t.direction == "drain" || t.direction == "drain_all")
    });
    let (mut files, mut bytes) = (0, 0);
    for r in ran {
        files += r.files_done;
        bytes += r.bytes_done;
    }
    if done.state == "done" {
        println!(
            "drain {var} to {pfs}: {} files, {} ({:.1} s after the job)",
            files,
            format_bytes(bytes),
            t.elapsed().as_secs_f64()
        );
        return Ok(None);
    }
    Ok(Some(format!(
        "the drain of {var} to {pfs} failed (stage task {}): {}; the instance {} is kept: \
         finish it with `surge stage drain --instance {}`",
        done.id,
        crate::job_stage::failure_message(&done),
        inst.id,
        inst.id
    )))
}

/// Where the agents mount instance `i` of session `s`.
fn mount_path(s: &api::Session, i: &api::Instance) -> String {
    if i.id == s.job_instance {
        format!("{}/{}/job", s.mount_root, s.id)
    } else {
        format!("{}/{}/persistent/{}", s.mount_root, s.id, i.name)
    }
}

async fn paths(job: &Job, path_file: &Path) -> anyhow::Result<()> {
    let mut m = connect(&job.common.manager).await?;
    let s = complete_session(&mut m, job).await?;
    let mut text = String::new();
    let caches = cache_instances(&s);
    for i in &s.instances {
        let path = mount_path(&s, i);
        let (dw, surge) = if i.id == s.job_instance {
            if private(i) {
                (
                    DwVariable::JobPrivate.env_name(),
                    "SURGE_JOB_PRIVATE".to_string(),
                )
            } else if i.access_mode == "ldbalance" {
                (
                    DwVariable::JobLdbal.env_name(),
                    "SURGE_JOB_LDBAL".to_string(),
                )
            } else if caches.iter().any(|(c, _)| c.id == i.id) {
                (
                    DwVariable::JobStripedCache.env_name(),
                    "SURGE_JOB_STRIPED_CACHE".to_string(),
                )
            } else {
                (
                    DwVariable::JobStriped.env_name(),
                    "SURGE_JOB_STRIPED".to_string(),
                )
            }
        } else {
            (
                DwVariable::PersistentStriped(i.name.clone()).env_name(),
                format!("SURGE_PERSISTENT_{}", i.name),
            )
        };
        text.push_str(&format!("{dw}={path}\n{surge}={path}\n"));
    }
    if s.job_instance != 0 {
        text.push_str(&format!("SURGE_JOB_INSTANCE={}\n", s.job_instance));
    }
    text.push_str(&format!(
        "SURGE_SESSION={}\nSURGE_MANAGER={}\n",
        s.id, job.common.manager
    ));
    std::fs::write(path_file, text)
        .with_context(|| format!("cannot write {}", path_file.display()))?;
    set_phase(&mut m, &s, "paths", Vec::new(), false).await?;
    Ok(())
}

/// How many of the session's mounts each host's agent reports, and what failed.
async fn mount_state(
    m: &mut surge_api::Client,
    s: &api::Session,
) -> anyhow::Result<(Vec<(String, Option<usize>)>, Vec<String>)> {
    let agents = m
        .list_agents(api::Empty {})
        .await
        .map_err(status_err)?
        .into_inner()
        .agents;
    let mut per_host = Vec::new();
    let mut errors = Vec::new();
    for h in &s.hosts {
        match agents.iter().find(|a| &a.host == h && a.alive) {
            None => per_host.push((h.clone(), None)),
            Some(a) => {
                per_host.push((
                    h.clone(),
                    Some(a.mounts.iter().filter(|x| x.session == s.id).count()),
                ));
                errors.extend(
                    a.failed
                        .iter()
                        .filter(|x| x.session == s.id)
                        .map(|x| format!("{h}: cannot mount {}: {}", x.path, x.error)),
                );
            }
        }
    }
    Ok((per_host, errors))
}

async fn pre_run(job: &Job, hosts: Vec<String>, timeout: f64) -> anyhow::Result<()> {
    let mut m = connect(&job.common.manager).await?;
    let s = complete_session(&mut m, job).await?;
    let hosts: Vec<String> = hosts
        .into_iter()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .collect();
    let s = set_phase(&mut m, &s, "pre_run", hosts, true).await?;
    let want = s.instances.len();
    if want == 0 {
        return Ok(());
    }
    let t = Instant::now();
    loop {
        let (per_host, errors) = mount_state(&mut m, &s).await?;
        if !errors.is_empty() {
            anyhow::bail!("{}", errors.join("\n"));
        }
        if per_host.iter().all(|(_, n)| n.is_some_and(|n| n >= want)) {
            println!(
                "job {}: {want} instance(s) mounted on {} in {:.1} s",
                job.job_id,
                s.hosts.join(","),
                t.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        if t.elapsed().as_secs_f64() > timeout {
            let missing: Vec<String> = per_host
                .iter()
                .filter(|(_, n)| !n.is_some_and(|n| n >= want))
                .map(|(h, n)| match n {
                    None => format!("{h} (no live agent: is `surge agent` running there?)"),
                    Some(n) => format!("{h} ({n} of {want} mounted)"),
                })
                .collect();
            anyhow::bail!(
                "job {}: not mounted after {timeout} s on {}",
                job.job_id,
                missing.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asks for the unmounts and waits until every live agent has none of the session's mounts.
/// Dead agents are not waited for (the manager and a restarted agent clean up after them).
async fn unmount(
    m: &mut surge_api::Client,
    s: &api::Session,
    phase: &str,
    timeout: f64,
) -> anyhow::Result<()> {
    let s = set_phase(m, s, phase, Vec::new(), false).await?;
    let t = Instant::now();
    loop {
        let (per_host, _) = mount_state(m, &s).await?;
        let left: Vec<&String> = per_host
            .iter()
            .filter(|(_, n)| n.is_some_and(|n| n > 0))
            .map(|(h, _)| h)
            .collect();
        for (h, n) in &per_host {
            if n.is_none() && t.elapsed() < Duration::from_millis(250) {
                eprintln!(
                    "warning: no live agent on {h}: its mounts of session {} are not waited for",
                    s.id
                );
            }
        }
        if left.is_empty() {
            return Ok(());
        }
        if t.elapsed().as_secs_f64() > timeout {
            anyhow::bail!(
                "session {}: still mounted on {:?} after {timeout} s",
                s.id,
                left
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn post_run(job: &Job, timeout: f64) -> anyhow::Result<()> {
    let mut m = connect(&job.common.manager).await?;
    let s = session(&mut m, job).await?;
    unmount(&mut m, &s, "post_run", timeout).await
}

/// Reads a stage_out list file that lives in an instance, without a mount.
async fn read_in_instance(
    m: &mut surge_api::Client,
    i: &api::Instance,
    ns: u32,
    inner: &str,
) -> anyhow::Result<String> {
    let desc: InstanceDescriptor = serde_json::from_str(&i.descriptor_json)
        .with_context(|| format!("instance {}: bad descriptor", i.id))?;
    let cap = m
        .get_capability(api::GetCapabilityRequest {
            instance: i.id,
            persistent_name: String::new(),
            namespace: ns,
            all_namespaces: false,
        })
        .await
        .map_err(status_err)?
        .into_inner();
    let client = InstanceClient::new(
        desc,
        NamespaceId(ns),
        surge_auth::Token::from_text(&cap.token)?,
    )?;
    let attr = surge_stage::ns::resolve(&client, Path::new(inner)).await?;
    let data = client.read(attr.ino, 0, attr.size).await?;
    String::from_utf8(data).with_context(|| format!("{inner} is not text"))
}

async fn data_out(job: &Job, workdir: &Path) -> anyhow::Result<()> {
    let (name, d) = job.directives()?;
    let mut m = connect(&job.common.manager).await?;
    let s = session(&mut m, job).await?;
    let s = set_phase(&mut m, &s, "data_out", Vec::new(), false).await?;
    // The list files of `type=list` are read from node 0's namespace.
    let mut lists = std::collections::HashMap::new();
    for sd in d
        .stage_out
        .iter()
        .filter(|x| x.kind == surge_core::directives::StageKind::List)
    {
        let r = match instance_of(&s, &sd.instance) {
            Some(i) => match jobplan::instance_path(&sd.source, &sd.instance) {
                Ok(p) => read_in_instance(&mut m, i, 0, &p)
                    .await
                    .map_err(|e| format!("{e:#}")),
                Err(e) => Err(e),
            },
            None => Err(format!("{} is not an instance of this job", sd.instance)),
        };
        lists.insert(sd.line, r);
    }
    let groups: anyhow::Result<Vec<StageGroup>> =
        jobplan::stage_out(&d, &name, workdir, |sd| match lists.get(&sd.line) {
            Some(Ok(t)) => Ok(t.clone()),
            Some(Err(e)) => Err(std::io::Error::other(e.clone())),
            None => Err(std::io::Error::other("not read")),
        })
        .map_err(|e| anyhow::anyhow!(e.join("\n")));
    let mut failures = Vec::new();
    match groups {
        Err(e) => failures.push(format!("{e:#}")),
        Ok(groups) => {
            for g in groups {
                let Some(inst) = instance_of(&s, &g.instance) else {
                    failures.push(format!(
                        "{name}: {} is not an instance of this job",
                        g.instance
                    ));
                    continue;
                };
                let per_ns = per_namespace(&mut m, inst, &g).await;
                let per_ns = match per_ns {
                    Ok(p) => p,
                    Err(lines) => {
                        failures.extend(lines);
                        continue;
                    }
                };
                for (ns, items) in per_ns {
                    let t = Instant::now();
                    let done = stage_once(
                        &mut m,
                        &s,
                        inst.id,
                        ns,
                        "out",
                        serde_json::to_string(&items)?,
                    )
                    .await?;
                    if done.state == "done" {
                        println!("{}", stage_line("out", &g, inst, ns, &done, t));
                    } else {
                        failures.extend(failure_lines(&done));
                    }
                }
            }
        }
    }
    // A cache's drain: everything journaled reaches the PFS before the instance goes.
    failures.extend(finish_drains(&mut m, &s).await?);
    // What the job itself left: pending tasks and deferred stage-outs.
    let tasks = session_tasks(&mut m, s.id).await?;
    for t in tasks {
        let t = match t.state.as_str() {
            "deferred" => m
                .activate_stage(api::GetStageRequest { id: t.id })
                .await
                .map_err(status_err)?
                .into_inner(),
            "queued" | "running" => t,
            _ => continue,
        };
        let done = wait_stage(&mut m, t, "job's stage", true, || false).await?;
        if done.state != "done" && done.direction == "out" {
            failures.push(format!(
                "stage task {} (started by the job): {}",
                done.id,
                crate::job_stage::failure_message(&done)
            ));
        }
    }
    if failures.is_empty() {
        return Ok(());
    }
    // Teardown keeps the job instance of a session whose stage-out failed.
    set_phase(&mut m, &s, "data_out_failed", Vec::new(), false).await?;
    anyhow::bail!(
        "stage-out failed; the job instance is kept (recover with `surge stage copy --out`):\n{}",
        failures.join("\n")
    )
}

/// A stage-out group per namespace: one for a striped instance; for a private one, the items
/// each node's namespace holds (collisions refused, as `surge run` does).
async fn per_namespace(
    m: &mut surge_api::Client,
    inst: &api::Instance,
    g: &StageGroup,
) -> Result<Vec<(u32, Vec<surge_stage::StageItem>)>, Vec<String>> {
    if !private(inst) || inst.nodes <= 1 {
        return Ok(vec![(0, g.items.clone())]);
    }
    let err = |e: String| vec![format!("stage out of {}: {e}", g.instance)];
    let desc: InstanceDescriptor =
        serde_json::from_str(&inst.descriptor_json).map_err(|e| err(e.to_string()))?;
    let cap = m
        .get_capability(api::GetCapabilityRequest {
            instance: inst.id,
            persistent_name: String::new(),
            namespace: 0,
            all_namespaces: true,
        })
        .await
        .map_err(|e| err(e.message().to_string()))?
        .into_inner();
    let token = surge_auth::Token::from_text(&cap.token).map_err(|e| err(e.to_string()))?;
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
    items: &[surge_stage::StageItem],
) -> Result<Vec<(u32, Vec<surge_stage::StageItem>)>, Vec<String>> {
    let clients = (0..nodes)
        .map(|ns| {
            InstanceClient::new(desc.clone(), NamespaceId(ns), token.clone())
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
    let mut per_node: Vec<(u32, Vec<surge_stage::StageItem>)> = held
        .items
        .into_iter()
        .enumerate()
        .map(|(k, v)| (k as u32, v))
        .collect();
    for item in items {
        if per_node.iter().all(|(_, v)| !v.contains(item)) {
            per_node[0].1.push(item.clone());
        }
    }
    per_node.retain(|(_, v)| !v.is_empty());
    Ok(per_node)
}

/// Ends an active session of a job: has the agents unmount its instances, stops its stage
/// tasks when `hurry`, and ends it as `state` (the job instance is kept, and the state says
/// "stage-out-failed", when its stage-out failed).
async fn end_job_session(
    m: &mut surge_api::Client,
    s: &api::Session,
    hurry: bool,
    state: &str,
) -> anyhow::Result<api::Session> {
    // Unmount first: a mount of a destroyed instance would answer ESTALE to the job.
    if s.mount || !s.hosts.is_empty() {
        if let Err(e) = unmount(m, s, "teardown", if hurry { 10.0 } else { 60.0 }).await {
            eprintln!("warning: {e:#}");
        }
    } else {
        set_phase(m, s, "teardown", Vec::new(), false).await?;
    }
    if hurry {
        let tasks = session_tasks(m, s.id).await?;
        for t in tasks
            .iter()
            .filter(|t| t.state == "running" || t.state == "queued")
        {
            let _ = m.cancel_stage(api::GetStageRequest { id: t.id }).await;
        }
    }
    // A cache's drain (done by data_out unless Slurm skipped it): nothing journaled is lost.
    let drain_failures = finish_drains(m, s).await?;
    for f in &drain_failures {
        eprintln!("{f}");
    }
    let keep = s.phase == "data_out_failed" || !drain_failures.is_empty();
    Ok(m.end_session(api::EndSessionRequest {
        id: s.id,
        keep_job_instance: keep,
        state: if keep { "stage-out-failed" } else { state }.into(),
    })
    .await
    .map_err(status_err)?
    .into_inner())
}

/// Job states after which Slurm runs no more hooks for a job still in stage-in.
const TERMINAL: &[&str] = &[
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "TIMEOUT",
];

/// Why a session whose job is in `job_state` (None: the workload manager does not know the
/// job) and whose last phase is `phase` is gone for good, if it is: the job was forgotten (its
/// teardown will never come), or it ended while in setup or stage-in (Slurm 22.05 kills the
/// data_in hook of a job cancelled then and calls no teardown for it).
pub fn gone_reason(phase: &str, job_state: Option<&str>) -> Option<String> {
    match job_state {
        None => Some("the workload manager no longer knows the job".into()),
        Some(st) if TERMINAL.contains(&st) && matches!(phase, "setup" | "data_in") => Some(
            format!("the job is {st} and its stage-in will not go on (phase {phase})"),
        ),
        Some(_) => None,
    }
}

/// Parses "JOBID STATE" lines (squeue --format='%A %T').
fn parse_jobs(out: &str) -> std::collections::HashMap<String, String> {
    out.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.to_string(), f.next().unwrap_or("").to_string()))
        })
        .collect()
}

async fn reconcile(
    c: &Common,
    scheduler: &str,
    jobs_command: &str,
    dry_run: bool,
    json: bool,
) -> anyhow::Result<()> {
    let mut m = connect(&c.manager).await?;
    // Sessions first, then the job list: a session opened after the list was taken is not
    // judged by it.
    let sessions = m
        .list_sessions(api::Empty {})
        .await
        .map_err(status_err)?
        .into_inner()
        .sessions;
    let prefix = format!("{scheduler}:");
    let ours: Vec<&api::Session> = sessions
        .iter()
        .filter(|s| s.state == "active" && s.external_id.starts_with(&prefix))
        .collect();
    let mut done = Vec::new();
    if !ours.is_empty() {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(jobs_command)
            .stdin(std::process::Stdio::null())
            .output()
            .with_context(|| format!("cannot run `{jobs_command}`"))?;
        anyhow::ensure!(
            out.status.success(),
            "`{jobs_command}` failed ({}){}; no session was ended",
            out.status,
            match String::from_utf8_lossy(&out.stderr).trim() {
                "" => String::new(),
                e => format!(": {e}"),
            }
        );
        let jobs = parse_jobs(&String::from_utf8_lossy(&out.stdout));
        for s in ours {
            let id = &s.external_id[prefix.len()..];
            let Some(why) = gone_reason(&s.phase, jobs.get(id).map(String::as_str)) else {
                continue;
            };
            let ended = if dry_run {
                "would end".to_string()
            } else {
                match end_job_session(&mut m, s, true, "abandoned").await {
                    Ok(e) => e.state,
                    Err(e) => format!("ending it failed: {e:#}"),
                }
            };
            if !json {
                println!(
                    "job {id}: session {} (phase {}): {why}: {ended}",
                    s.id, s.phase
                );
            }
            done.push(serde_json::json!({
                "job": id, "session": s.id, "phase": s.phase, "reason": why, "result": ended,
            }));
        }
    }
    if json {
        println!("{}", serde_json::Value::Array(done));
    } else if done.is_empty() {
        println!("nothing to reconcile");
    }
    Ok(())
}

async fn teardown(job: &Job, hurry: bool) -> anyhow::Result<()> {
    let directives = job.directives();
    let mut m = connect(&job.common.manager).await?;
    let Some(s) = find(&mut m, job).await? else {
        println!("job {}: no session: nothing to tear down", job.job_id);
        return Ok(());
    };
    if s.state == "active" {
        let ended =
            end_job_session(&mut m, &s, hurry, if hurry { "cancelled" } else { "ended" }).await?;
        let keep = ended.state == "stage-out-failed";
        println!(
            "job {}: session {} {}{}",
            job.job_id,
            ended.id,
            ended.state,
            if keep {
                format!(
                    "; job instance {} KEPT (stage-out or drain failed)",
                    s.job_instance
                )
            } else {
                String::new()
            }
        );
    }
    // Persistent instances the script destroys (after the job, as DataWarp does).
    if let Ok((name, d)) = directives {
        for dp in &d.destroy_persistent {
            match m
                .destroy_instance(api::DestroyInstanceRequest {
                    id: 0,
                    persistent_name: dp.name.clone(),
                    hurry: dp.hurry || hurry,
                })
                .await
            {
                Ok(_) => println!("destroyed persistent instance {}", dp.name),
                Err(e) if e.code() == tonic::Code::NotFound => {}
                Err(e) => anyhow::bail!(
                    "{name}:{}: #BB destroy_persistent name={}: {}",
                    dp.line,
                    dp.name,
                    e.message()
                ),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_of_forgotten_jobs_and_of_jobs_ended_in_stage_in_are_gone() {
        assert!(gone_reason("running", None).is_some());
        assert!(gone_reason("data_out", None).is_some());
        assert!(gone_reason("setup", Some("CANCELLED")).is_some());
        assert!(gone_reason("data_in", Some("FAILED")).is_some());
        // Slurm still runs stage-out and teardown for these:
        assert!(gone_reason("pre_run", Some("CANCELLED")).is_none());
        assert!(gone_reason("post_run", Some("COMPLETED")).is_none());
        assert!(gone_reason("data_out", Some("CANCELLED")).is_none());
        // Live jobs are never judged:
        assert!(gone_reason("setup", Some("PENDING")).is_none());
        assert!(gone_reason("data_in", Some("RUNNING")).is_none());
    }

    #[test]
    fn job_lists_parse() {
        let j = parse_jobs("12 RUNNING\n13 CANCELLED\n\n 14  PENDING \n");
        assert_eq!(j.get("12").map(String::as_str), Some("RUNNING"));
        assert_eq!(j.get("14").map(String::as_str), Some("PENDING"));
        assert_eq!(j.len(), 3);
    }
}
