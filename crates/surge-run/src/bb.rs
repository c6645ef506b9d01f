//! `surge bb <phase>`: the burst-buffer phases a workload manager calls for a job (Slurm's
//! `burst_buffer/lua` hooks in `contrib/slurm/burst_buffer.lua`), each mapped to one phase of
//! the job lifecycle ([`crate::lifecycle`], which `surge run` calls too), with the job's mounts
//! made by the agents of its hosts ([`lifecycle::Agents`]):
//!
//! | phase      | Slurm hook            | does                                                        |
//! |------------|-----------------------|-------------------------------------------------------------|
//! | validate   | slurm_bb_job_process  | parses the script; errors name the line (sbatch refuses it) |
//! | pools      | slurm_bb_pools        | pools, granularity and free space as Slurm's JSON          |
//! | setup      | slurm_bb_setup        | [`lifecycle::setup`]: persistent instances, the session    |
//! | data_in    | slurm_bb_data_in      | [`lifecycle::data_in`]: fills caches, stages in            |
//! | paths      | slurm_bb_paths        | [`lifecycle::paths`]: writes DW_JOB_STRIPED=... to a file  |
//! | pre_run    | slurm_bb_pre_run      | [`lifecycle::pre_run`]: the agents of the hosts mount      |
//! | post_run   | slurm_bb_post_run     | [`lifecycle::post_run`]: they unmount                      |
//! | data_out   | slurm_bb_data_out     | [`lifecycle::data_out`]: drains caches, stages out         |
//! | teardown   | slurm_bb_job_teardown | [`lifecycle::teardown`]: ends the session (keeps the job   |
//! |            |                       | instance if a stage-out failed), destroys persistent ones  |
//! | reconcile  | (from slurm_bb_pools) | ends sessions of jobs Slurm forgot or ended in stage-in    |
//!
//! Each phase finds the session by the job's id (`slurm:<id>`), so any phase may be re-run
//! after a crash of the manager, the hook or the controller, and teardown after anything.

use crate::jobplan;
use crate::lifecycle::{self, Agents, Alloc, Event, Report, Teardown};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use surge_api::states::{SessionState, TaskState};
use surge_api::v1 as api;
use surge_core::backoff::Backoff;
use surge_core::directives::{parse_script, Directives};
use surge_core::format_bytes;
use surge_manager::cli::{connect, status_err};

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
        c: JobArgs,
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
        c: JobArgs,
        /// Relative stage paths are relative to this directory (the job's working directory).
        #[arg(long, default_value = "/")]
        workdir: PathBuf,
    },
    /// Write the job's environment variables (DW_JOB_STRIPED=... one per line) to a file.
    Paths {
        #[command(flatten)]
        c: JobArgs,
        /// Slurm's path_file: one NAME=value per line is added to the job's environment.
        #[arg(long, value_name = "FILE")]
        path_file: PathBuf,
    },
    /// Have the agents of the job's hosts mount its instances; wait until they have.
    #[command(name = "pre_run", alias = "pre-run")]
    PreRun {
        #[command(flatten)]
        c: JobArgs,
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
        c: JobArgs,
        /// Seconds to wait for the agents to unmount.
        #[arg(long, default_value_t = 60.0)]
        timeout: f64,
    },
    /// Stage the script's stage_out directives (and the job's deferred stage-outs) out.
    #[command(name = "data_out", alias = "data-out")]
    DataOut {
        #[command(flatten)]
        c: JobArgs,
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
        c: JobArgs,
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
pub struct JobArgs {
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

impl JobArgs {
    /// The job as the lifecycle sees it; its directives read from the script again.
    fn job(&self, alloc: Option<Alloc>) -> anyhow::Result<lifecycle::Job> {
        let (script, directives) = self.directives()?;
        Ok(self.with(script, directives, alloc))
    }

    fn with(&self, script: String, directives: Directives, alloc: Option<Alloc>) -> lifecycle::Job {
        let external = format!("{}:{}", self.scheduler, self.job_id);
        lifecycle::Job {
            script,
            directives,
            label: external.clone(),
            external_id: external,
            manager: self.common.manager.clone(),
            alloc,
        }
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

    /// What the phase prints.
    fn lines(&self) -> Lines<'_> {
        Lines {
            job: &self.job_id,
            to_stderr: false,
        }
    }

    async fn manager(&self) -> anyhow::Result<surge_api::Client> {
        connect(&self.common.manager).await
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
    let mut pauses = Backoff::new(surge_api::FAILOVER_WAIT, Duration::from_millis(500));
    loop {
        match rt.block_on(phase(&args.phase)) {
            Err(e) if surge_api::manager_gone(e.as_ref()) && args.phase.manager().contains(',') => {
                let Some(pause) = pauses.next() else {
                    return Err(e);
                };
                eprintln!("surge bb: the manager went away ({e:#}); running the phase again");
                std::thread::sleep(pause);
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

/// Runs one phase: each Slurm hook is one phase of the lifecycle.
async fn phase(phase: &Phase) -> anyhow::Result<()> {
    match phase {
        Phase::Validate { .. } => anyhow::bail!("validate runs without a manager"),
        Phase::Pools(c) => pools(c).await,
        Phase::Agents { c, json } => agents(c, *json).await,
        Phase::Setup { c, uid, gid, nodes } => {
            let alloc = Alloc {
                uid: *uid,
                gid: *gid,
                nodes: (*nodes).max(1),
                ..Alloc::default()
            };
            let job = c.job(Some(alloc))?;
            lifecycle::setup(&mut c.manager().await?, &job, &mut c.lines()).await?;
            Ok(())
        }
        Phase::DataIn { c, workdir } => {
            let job = c.job(None)?;
            let plan = jobplan::stage_in(&job.directives, &job.script, workdir)
                .map_err(|e| anyhow::anyhow!(e.join("\n")))?;
            lifecycle::data_in(&mut c.manager().await?, &job, &plan, &mut c.lines()).await
        }
        Phase::Paths { c, path_file } => paths(c, path_file).await,
        Phase::PreRun { c, hosts, timeout } => {
            let mut agents = Agents {
                hosts: hosts.clone(),
                timeout: seconds(*timeout)?,
            };
            let job = c.job(None)?;
            lifecycle::pre_run(&mut c.manager().await?, &job, &mut agents, &mut c.lines()).await
        }
        Phase::PostRun { c, timeout } => {
            let mut agents = Agents {
                hosts: Vec::new(),
                timeout: seconds(*timeout)?,
            };
            let job = c.job(None)?;
            lifecycle::post_run(&mut c.manager().await?, &job, &mut agents, &mut c.lines()).await
        }
        Phase::DataOut { c, workdir } => {
            let job = c.job(None)?;
            let mut m = c.manager().await?;
            let failures = lifecycle::data_out(&mut m, &job, workdir, &mut c.lines()).await?;
            anyhow::ensure!(
                failures.is_empty(),
                "stage-out failed; the job instance is kept (recover with `surge stage copy \
                 --out`):\n{}",
                failures.join("\n")
            );
            Ok(())
        }
        Phase::Teardown { c, hurry } => teardown(c, *hurry).await,
        Phase::Reconcile {
            c,
            scheduler,
            jobs_command,
            dry_run,
            json,
        } => reconcile(c, scheduler, jobs_command, *dry_run, *json).await,
    }
}

/// A timeout given in seconds.
fn seconds(s: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s).with_context(|| format!("{s} is not a number of seconds"))
}

/// The agents' mounts outside pre_run: the session knows the hosts; 60 s to unmount.
fn agents_of_session() -> Agents {
    Agents {
        hosts: Vec::new(),
        timeout: Duration::from_secs(60),
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
                        "allocations": d.allocations.iter().map(|a| serde_json::json!({
                            "name": a.name,
                            "type": a.fs.as_str(),
                            "capacity": a.capacity,
                            "access_mode": a.access_mode().as_str(),
                            "pool": a.pool,
                            "variable": a.var().env_name(),
                        })).collect::<Vec<_>>(),
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

async fn paths(c: &JobArgs, path_file: &Path) -> anyhow::Result<()> {
    let job = c.job(None)?;
    let envs = lifecycle::paths(&mut c.manager().await?, &job, &agents_of_session()).await?;
    // The agents mount at the same paths on every host: one environment.
    let text: String = envs
        .first()
        .map(|env| env.iter().map(|(k, v)| format!("{k}={v}\n")).collect())
        .unwrap_or_default();
    std::fs::write(path_file, text).with_context(|| format!("cannot write {}", path_file.display()))
}

async fn teardown(c: &JobArgs, hurry: bool) -> anyhow::Result<()> {
    // A script that cannot be read any more: the session still goes (nothing is destroyed).
    let job = match c.directives() {
        Ok((script, d)) => c.with(script, d, None),
        Err(e) => {
            eprintln!("warning: {e:#}: no #BB destroy_persistent is done");
            c.with(
                format!("job {} script", c.job_id),
                Directives::default(),
                None,
            )
        }
    };
    let how = Teardown {
        hurry,
        state: if hurry {
            SessionState::Cancelled
        } else {
            SessionState::Ended
        },
        destroy: true,
    };
    let mut m = c.manager().await?;
    let mut agents = agents_of_session();
    let ended = lifecycle::teardown(&mut m, &job, &mut agents, &how, &mut c.lines()).await?;
    anyhow::ensure!(ended.failures.is_empty(), "{}", ended.failures.join("\n"));
    Ok(())
}

/// Ends session `s` of job `id`, which the workload manager forgot: what it says goes to stderr
/// (stdout is the reconcile's own report).
async fn end_session(
    m: &mut surge_api::Client,
    s: &api::Session,
    id: &str,
) -> anyhow::Result<api::Session> {
    let mut lines = Lines {
        job: id,
        to_stderr: true,
    };
    lifecycle::end_job_session(
        m,
        s,
        &mut agents_of_session(),
        true,
        SessionState::Abandoned,
        &mut lines,
    )
    .await
}

/// What a phase prints, as the hooks always did: on stdout for Slurm's log (stderr for
/// problems, and for everything in a reconcile, whose stdout is its report).
struct Lines<'a> {
    job: &'a str,
    to_stderr: bool,
}

impl Lines<'_> {
    fn say(&self, line: String) {
        if self.to_stderr {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }
}

impl Report for Lines<'_> {
    fn event(&mut self, e: Event<'_>) {
        let job = self.job;
        match e {
            Event::PoolFallback { pool } => self.say(format!(
                "pool '{pool}' is not defined here: using the default pool"
            )),
            Event::Persistent { name, created, .. } => self.say(if created {
                format!("created persistent instance {name}")
            } else {
                format!("persistent instance {name}: there already, the job owner's (set up again)")
            }),
            Event::PersistentFailed { .. } | Event::Unmounted { .. } | Event::JobStage { .. } => {}
            Event::AlreadySetUp { session } => self.say(format!(
                "job {job}: session {} (already set up)",
                session.id
            )),
            Event::Incomplete { session, lacks } => eprintln!(
                "job {job}: session {} lacks {lacks}: ending it and setting up again",
                session.id
            ),
            Event::Allocated { session, .. } => self.allocated(session),
            Event::Staged {
                direction,
                var,
                instance,
                ns,
                task,
                started,
            } if task.task_state() == Some(TaskState::Done) => self.say(format!(
                "stage {direction} {var}{}: {} files, {} in {:.1} s",
                if instance.access_mode == "private" {
                    format!(" (node {ns})")
                } else {
                    String::new()
                },
                task.files_done,
                format_bytes(task.bytes_done),
                started.elapsed().as_secs_f64()
            )),
            Event::Staged { .. } => {}
            Event::Filled {
                var,
                pfs,
                task,
                started,
                ..
            } if task.task_state() == Some(TaskState::Done) => self.say(format!(
                "fill {} from {pfs}: {} files ({}, read from the PFS on first use) in {:.1} s",
                var.env_name(),
                task.files_done,
                format_bytes(task.bytes_done),
                started.elapsed().as_secs_f64()
            )),
            Event::Filled { .. } => {}
            Event::DrainStarted { var, pfs, task } => self.say(format!(
                "drain {} to {pfs}: started (stage task {})",
                var.env_name(),
                task.id
            )),
            Event::Drained {
                var,
                pfs,
                files,
                bytes,
                seconds,
                error,
                ..
            } => match error {
                None => self.say(format!(
                    "drain {} to {pfs}: {files} files, {} ({seconds:.1} s after the job)",
                    var.env_name(),
                    format_bytes(bytes)
                )),
                Some(e) => eprintln!("{e}"),
            },
            Event::Mounted { detail, .. } => self.say(format!("job {job}: {detail}")),
            Event::NoSession => self.say(format!("job {job}: no session: nothing to tear down")),
            Event::Ended { session, kept, .. } => self.say(format!(
                "job {job}: session {} {}{}",
                session.id,
                session.state,
                match kept {
                    Some(i) => format!("; job instance {i} KEPT (stage-out or drain failed)"),
                    None => String::new(),
                }
            )),
            Event::Destroyed {
                name,
                existed: true,
                ok: true,
                ..
            } => self.say(format!("destroyed persistent instance {name}")),
            Event::Destroyed { .. } => {}
            Event::Allocation {
                var,
                instance,
                created,
                ..
            } => self.say(format!(
                "job {job}: {var} is instance {} ({} {}){}",
                instance.name,
                format_bytes(instance.capacity),
                instance.access_mode,
                if created {
                    ""
                } else {
                    ", there already (set up again)"
                }
            )),
            Event::AllocationDestroyed {
                var,
                instance,
                existed: true,
                ok: true,
                ..
            } => self.say(format!("job {job}: destroyed {var}'s instance {instance}")),
            Event::AllocationDestroyed { .. } => {}
        }
    }
}

impl Lines<'_> {
    fn allocated(&self, s: &api::Session) {
        let job = self.job;
        let job_inst = s.instances.iter().find(|i| i.id == s.job_instance);
        self.say(format!(
            "job {job}: session {}{}",
            s.id,
            job_inst.map_or(String::new(), |i| format!(
                ", job instance {} {} ({} fragments)",
                format_bytes(i.capacity),
                i.access_mode,
                i.fragments
            ))
        ));
        if let Some(p) = job_inst.and_then(crate::targets::promise_of) {
            self.say(format!("job {job}: {}", crate::targets::detail(&p)));
            for w in &p.why {
                self.say(format!("job {job}:   {w}"));
            }
        }
    }
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
        .filter(|s| s.is_active() && s.external_id.starts_with(&prefix))
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
                match end_session(&mut m, s, id).await {
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
