//! `surge run job.sh`: run a DataWarp-style batch script with the burst buffer it asks for,
//! without a scheduler. A short driver of the job lifecycle ([`crate::lifecycle`], the phases
//! `surge bb` runs for Slurm too), with the job's nodes emulated here
//! ([`lifecycle::LocalNodes`]: FUSE mounts in this process):
//!
//! parse the directives (any error: nothing is allocated and nothing runs) and check the
//! stage-in sources, start the embedded manager and servers (or use `$SURGE_MANAGER`), then the
//! phases: setup, data_in, paths, pre_run, the script on node 0, post_run, data_out (also after
//! a failed job; not after Ctrl-C), teardown; stop what was started. Each step is timed and
//! reported (`surge run: <phase> ... <time>`, and `--report` as JSON).

use crate::embedded::{child_setup, Embedded, EmbeddedOptions};
use crate::jobplan::{self, StageIn};
use crate::lifecycle::{self, rate, Alloc, Event, LocalNodes, Report, Teardown};
use crate::nodes::{NodeInfo, NodesFile};
use anyhow::Context;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use surge_api::states::{SessionState, TaskState};
use surge_api::v1 as api;
use surge_core::directives::{parse_script, Directives, DwVariable};
use surge_core::format_bytes;
use surge_manager::cli::connect;

/// Run a batch script with the burst buffer its #DW/#BB directives ask for.
///
/// With no manager configured, starts a manager and --servers local servers (fast tier under
/// $SURGE_FAST_DIR or /dev/shm/surge-$USER) and stops them at the end; with $SURGE_MANAGER set,
/// uses that manager and its servers. The script runs once (node 0, as on Slurm's first node)
/// with $DW_JOB_STRIPED / $DW_JOB_PRIVATE / $DW_PERSISTENT_STRIPED_<name> set, `surge` on its
/// PATH and $SURGE_MANAGER / $SURGE_MANAGER_HTTP naming the manager; `surge exec --node K --
/// CMD` runs work on the other emulated nodes, `surge stage` (or libdatawarp) stages while it
/// runs. Stage tasks the job leaves pending are waited for, and its deferred stage-outs run,
/// before anything is released. Exits with the script's status.
///
/// Example job script:
///   #!/bin/bash
///   #DW jobdw type=scratch access_mode=striped capacity=4GiB
///   #DW stage_in type=directory source=inputs destination=$DW_JOB_STRIPED/in
///   #DW stage_out type=directory source=$DW_JOB_STRIPED/out destination=results
///   mkdir -p $DW_JOB_STRIPED/out && ./transform $DW_JOB_STRIPED/in $DW_JOB_STRIPED/out
#[derive(clap::Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct RunArgs {
    /// The job script.
    pub script: PathBuf,
    /// Arguments for the script.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
    /// Compute nodes to emulate: each gets its own mount of the job instance (and, in private
    /// mode, its own namespace).
    #[arg(long, default_value_t = 1)]
    pub nodes: u32,
    /// Use this manager instead of starting one (host:port).
    #[arg(long, env = "SURGE_MANAGER", value_name = "HOST:PORT")]
    pub manager: Option<String>,
    /// The HTTP address (JSON API, /metrics) of the manager given with --manager, passed to
    /// the job as $SURGE_MANAGER_HTTP (the embedded manager's is passed without asking).
    #[arg(long, env = "SURGE_MANAGER_HTTP", value_name = "HOST:PORT")]
    pub manager_http: Option<String>,
    /// Embedded: number of local servers.
    #[arg(long, env = "SURGE_SERVERS", default_value_t = crate::embedded::DEFAULT_SERVERS)]
    pub servers: usize,
    /// Embedded: fast-tier directory (default /dev/shm/surge-$USER).
    #[arg(long, env = "SURGE_FAST_DIR", value_name = "DIR")]
    pub fast_dir: Option<PathBuf>,
    /// Embedded: manager state directory (default: <fast-dir>/state, so persistent instances
    /// live as long as their data).
    #[arg(long, env = "SURGE_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Embedded: pool granularity (fragment size) when the pool is first created.
    #[arg(long, env = "SURGE_GRANULARITY", value_parser = surge_core::sys::size_arg, default_value = crate::embedded::DEFAULT_GRANULARITY)]
    pub granularity: u64,
    /// Embedded: capacity of each server (default: 80% of the fast tier's free space, shared).
    #[arg(long, env = "SURGE_SERVER_CAPACITY", value_parser = surge_core::sys::size_arg)]
    pub server_capacity: Option<u64>,
    /// Calibrated peaks of one fragment (`surge bench calibrate`): what `#SURGE jobdw`
    /// performance targets are sized from.
    #[arg(long, env = "SURGE_PEAKS", value_name = "PEAKS.json")]
    pub peaks: Option<PathBuf>,
    /// With `#SURGE jobdw`: measure the promised bandwidth on the job's mount (a short `surge
    /// bench io`) before the job runs; the report has promised vs measured.
    #[arg(long)]
    pub measure_targets: bool,
    /// Write a JSON report of the phases (times, bytes, exit status) to this file.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Remember this run in `surge tune`'s history (SQLite, as `surge tune --history`) as the
    /// job as written: a later `surge tune` of the same script, inputs and pool starts from it.
    #[arg(long, value_name = "FILE")]
    pub history: Option<PathBuf>,
    /// Only print errors.
    #[arg(long, short)]
    pub quiet: bool,
}

/// What happened in one phase.
#[derive(serde::Serialize, Clone, Debug)]
struct Phase {
    name: String,
    detail: String,
    seconds: f64,
    ok: bool,
}

/// The run's timed lines on stderr and the phases of its `--report`.
struct Reporter {
    quiet: bool,
    phases: Vec<Phase>,
    sig: Arc<Signals>,
}

impl Reporter {
    fn phase(&mut self, name: &str, detail: String, started: Instant, ok: bool) {
        let seconds = started.elapsed().as_secs_f64();
        if !self.quiet || !ok {
            eprintln!(
                "surge run: {name:<18} {detail:<56} {seconds:>7.2} s{}",
                if ok { "" } else { "  FAILED" }
            );
        }
        self.phases.push(Phase {
            name: name.to_string(),
            detail,
            seconds,
            ok,
        });
    }

    fn note(&self, msg: &str) {
        if !self.quiet {
            eprintln!("surge run: {msg}");
        }
    }

    fn allocated(&mut self, s: &api::Session, started: Instant) {
        let detail = match s.instances.iter().find(|i| i.id == s.job_instance) {
            Some(i) => format!(
                "session {}: job instance {} {} ({}{} fragments){}",
                s.id,
                format_bytes(i.capacity),
                i.access_mode,
                match i.access_mode.as_str() {
                    "ldbalance" => format!("{} replicas, ", lifecycle::namespaces(i)),
                    _ => String::new(),
                },
                i.fragments,
                if s.persistent.is_empty() {
                    String::new()
                } else {
                    format!(", {} persistent", s.persistent.len())
                }
            ),
            None => format!("session {}: {} named instance(s)", s.id, s.persistent.len()),
        };
        self.phase("allocate", detail, started, true);
        // What the manager promised for the targets, and why.
        let promise = s
            .instances
            .iter()
            .find(|i| i.id == s.job_instance)
            .and_then(crate::targets::promise_of);
        if let Some(p) = promise {
            self.phase("size", crate::targets::detail(&p), started, true);
            for w in &p.why {
                self.note(&format!("  {w}"));
            }
        }
    }

    fn staged(
        &mut self,
        direction: &str,
        var: &DwVariable,
        i: &api::Instance,
        ns: u32,
        t: &api::StageTask,
        started: Instant,
    ) {
        let on = match (i.access_mode.as_str(), direction) {
            ("private", _) => format!(" (node {ns})"),
            ("ldbalance", "in") => format!(" (replica {}/{})", ns + 1, lifecycle::namespaces(i)),
            _ => String::new(),
        };
        let detail = format!(
            "{var}{on}: {} files, {}{}",
            t.files_done,
            format_bytes(t.bytes_done),
            rate(t.bytes_done, t.seconds)
        );
        let name = if direction == "in" {
            "stage in"
        } else {
            "stage out"
        };
        self.phase(
            name,
            detail,
            started,
            t.task_state() == Some(TaskState::Done),
        );
    }

    fn filled(
        &mut self,
        var: &DwVariable,
        i: &api::Instance,
        pfs: &str,
        t: &api::StageTask,
        summary: Option<lifecycle::FillSummary>,
        started: Instant,
    ) {
        let what = match var {
            DwVariable::PersistentStriped(_) => i.name.clone(),
            _ => var.to_string(),
        };
        let detail = match summary {
            Some(f) => format!(
                "{what} from {pfs}: {} files ({}) read from the PFS until copied into the tier \
                 on first read, {} copied now ({}), {} directories",
                f.lazy_files,
                format_bytes(f.lazy_bytes),
                f.copied_files,
                format_bytes(f.copied_bytes),
                f.dirs
            ),
            None => format!(
                "{what} from {pfs}: {}",
                crate::job_stage::failure_message(t)
            ),
        };
        self.phase("fill", detail, started, summary.is_some());
    }
}

impl Reporter {
    /// A cache drained to the PFS: `moved` is (files, bytes, seconds).
    fn drained(
        &mut self,
        var: &DwVariable,
        pfs: &str,
        (files, bytes, seconds): (u64, u64, f64),
        ok: bool,
        started: Instant,
    ) {
        let detail = format!(
            "{var} to {pfs}: {files} files, {}{}",
            format_bytes(bytes),
            rate(bytes, seconds)
        );
        self.phase("drain", detail, started, ok);
    }

    /// A stage task the job asked for from inside (`deferred`: run at the job's end).
    fn job_stage(&mut self, task: &api::StageTask, deferred: bool, started: Instant) {
        let name = if deferred {
            "stage at job end"
        } else {
            "job's stage"
        };
        let detail = format!(
            "task {} {}: {} files, {}{}",
            task.id,
            task.direction,
            task.files_done,
            format_bytes(task.bytes_done),
            rate(task.bytes_done, task.seconds)
        );
        self.phase(
            name,
            detail,
            started,
            task.task_state() == Some(TaskState::Done),
        );
    }

    /// The session ended; `kept`: its job instance was kept with its data.
    fn ended(&mut self, session: &api::Session, kept: Option<u64>, started: Instant) {
        let detail = match kept {
            Some(i) => format!(
                "session {} ended; job instance {i} KEPT (stage-out failed)",
                session.id
            ),
            None => format!("session {} ended", session.id),
        };
        self.phase("release", detail, started, kept.is_none());
    }
}

impl Report for Reporter {
    fn event(&mut self, e: Event<'_>) {
        match e {
            Event::PoolFallback { pool } => self.note(&format!(
                "pool '{pool}' is not defined here: using the default pool"
            )),
            Event::Persistent {
                name,
                instance: i,
                created,
                started,
            } => self.phase(
                "create persistent",
                format!(
                    "{name} {} ({} fragments){}",
                    format_bytes(i.capacity),
                    i.fragments,
                    if created { "" } else { ", there already" }
                ),
                started,
                true,
            ),
            Event::Allocation {
                var,
                instance: i,
                created,
                started,
            } => self.phase(
                "allocate named",
                format!(
                    "{var}: instance {} {} {} ({} fragments){}",
                    i.name,
                    format_bytes(i.capacity),
                    i.access_mode,
                    i.fragments,
                    if created { "" } else { ", there already" }
                ),
                started,
                true,
            ),
            Event::AllocationDestroyed {
                var,
                instance,
                existed,
                ok,
                started,
            } => self.phase(
                "destroy named",
                if existed {
                    format!("{var}: instance {instance}")
                } else {
                    format!("{var}: instance {instance} not there (destroyed before)")
                },
                started,
                ok,
            ),
            Event::PersistentFailed { name, started } => {
                self.phase("create persistent", name.to_string(), started, false)
            }
            Event::AlreadySetUp { session } => {
                self.note(&format!("session {} (already set up)", session.id))
            }
            Event::Incomplete { session, lacks } => self.note(&format!(
                "session {} lacks {lacks}: ending it and setting up again",
                session.id
            )),
            Event::Allocated { session, started } => self.allocated(session, started),
            Event::Staged {
                direction,
                var,
                instance,
                ns,
                task,
                started,
            } => self.staged(direction, var, instance, ns, task, started),
            Event::Filled {
                var,
                instance,
                pfs,
                task,
                summary,
                started,
            } => self.filled(var, instance, pfs, task, summary, started),
            Event::DrainStarted { .. } | Event::NoSession => {}
            Event::Drained {
                var,
                pfs,
                files,
                bytes,
                seconds,
                error,
                started,
            } => self.drained(var, pfs, (files, bytes, seconds), error.is_none(), started),
            Event::Mounted { detail, started } => self.phase("mount", detail, started, true),
            Event::Unmounted { detail, started } => self.phase("unmount", detail, started, true),
            Event::JobStage {
                task,
                deferred,
                started,
            } => self.job_stage(task, deferred, started),
            Event::Ended {
                session,
                kept,
                started,
            } => self.ended(session, kept, started),
            Event::Destroyed {
                name,
                existed,
                ok,
                started,
            } => self.phase(
                "destroy persistent",
                if existed {
                    name.to_string()
                } else {
                    format!("{name}: not there (destroyed before)")
                },
                started,
                ok,
            ),
        }
    }

    fn stopped(&self) -> bool {
        self.sig.interrupted.load(Ordering::SeqCst)
    }

    fn progress(&self) -> bool {
        !self.quiet
    }
}

/// Signals: the first SIGINT/SIGTERM stops the job (SIGTERM to its process group) and the run
/// tears down without staging out; a second kills the job at once.
struct Signals {
    interrupted: AtomicBool,
    job_pgid: AtomicI32,
    signal: AtomicI32,
}

fn spawn_signal_thread(set: libc::sigset_t, sig: Arc<Signals>) {
    std::thread::spawn(move || loop {
        let mut s = 0;
        // SAFETY: `set` holds the blocked signals; `s` is a valid out-parameter.
        if unsafe { libc::sigwait(&set, &mut s) } != 0 {
            return;
        }
        let second = sig.interrupted.swap(true, Ordering::SeqCst);
        sig.signal.store(s, Ordering::SeqCst);
        let pgid = sig.job_pgid.load(Ordering::SeqCst);
        eprintln!(
            "surge run: signal {s}: {}",
            if second {
                "killing the job"
            } else {
                "stopping the job and tearing down (no stage-out)"
            }
        );
        if pgid > 0 {
            // SAFETY: signalling the job's process group.
            unsafe { libc::kill(-pgid, if second { libc::SIGKILL } else { libc::SIGTERM }) };
        }
    });
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    // Before any thread starts, so all inherit the mask.
    let set = surge_core::sys::block_signals(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP]);
    let script_name = args.script.display().to_string();
    let started_at = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let script = match Script::read(&args, &script_name)? {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    let sig = Arc::new(Signals {
        interrupted: AtomicBool::new(false),
        job_pgid: AtomicI32::new(0),
        signal: AtomicI32::new(0),
    });
    spawn_signal_thread(set, sig.clone());
    let mut rep = Reporter {
        quiet: args.quiet,
        phases: Vec::new(),
        sig: sig.clone(),
    };
    let surge_exe = std::env::current_exe().context("cannot find the surge executable")?;
    let started = Started::new(&args, &surge_exe, &mut rep)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let ctx = Ctx {
        args: &args,
        script_name: &script_name,
        script: &script,
        manager: &started.manager,
        manager_http: started.http.as_deref(),
        surge_exe: &surge_exe,
        sig: &sig,
        embedded: started.opts.as_ref(),
    };
    let outcome = rt.block_on(drive(&ctx, &mut rep));
    // What the phases did not get to (an error) went with the session; the embedded manager
    // and servers go now.
    let t = Instant::now();
    drop(rt);
    let embedded = started.embedded.is_some();
    if let Some(emb) = started.embedded {
        emb.stop();
    }
    if embedded || outcome.is_err() {
        rep.phase("teardown", String::new(), t, true);
    }
    let code = match &outcome {
        Ok(o) => o.code,
        Err(e) => {
            eprintln!("surge run: error: {e:#}");
            1
        }
    };
    if args.report.is_some() || args.history.is_some() {
        let report = report_json(&script_name, code, &outcome, &rep);
        if let Some(path) = &args.report {
            std::fs::write(path, serde_json::to_string_pretty(&report)?)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        if let Some(db) = &args.history {
            record_history(&args, &script.text, &report, &started_at, db, &rep);
        }
    }
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// The job script, read, parsed and checked before anything is allocated.
struct Script {
    text: String,
    directives: Directives,
    /// The stage-in, every source checked.
    plan: StageIn,
    /// Relative stage paths are relative to it.
    cwd: PathBuf,
}

impl Script {
    /// The script, or the exit status of a run that allocates nothing and runs nothing (the
    /// reason printed).
    fn read(args: &RunArgs, name: &str) -> anyhow::Result<Result<Script, ExitCode>> {
        let refused = Ok(Err(ExitCode::from(2)));
        let text = std::fs::read_to_string(&args.script)
            .with_context(|| format!("cannot read job script {name}"))?;
        if let Some((n, line)) = crlf_line(&text) {
            eprintln!(
                "{name}:{n}: `{line}\\r`: the script has Windows (CRLF) line endings; the shell \
                 would take each `\\r` as part of a command (`$'\\r': command not found`). \
                 Convert it with `sed -i 's/\\r$//' {name}` (or dos2unix)"
            );
            eprintln!("surge run: nothing was allocated and nothing ran");
            return refused;
        }
        let directives = match parse_script(name, &text) {
            Ok(d) => d,
            Err(errs) => {
                for e in &errs.0 {
                    eprintln!("{e}");
                }
                eprintln!(
                    "surge run: {} error(s) in {name}: nothing was allocated and nothing ran",
                    errs.0.len()
                );
                return refused;
            }
        };
        for w in &directives.warnings {
            eprintln!(
                "{}:{}: warning: `{}`: {}",
                w.file, w.line, w.text, w.message
            );
        }
        anyhow::ensure!(args.nodes >= 1, "--nodes must be at least 1");
        let cwd = std::env::current_dir().context("cannot read the current directory")?;
        // Every stage-in source is checked before anything is allocated.
        let plan = match jobplan::stage_in(&directives, name, &cwd) {
            Ok(p) => p,
            Err(errs) => {
                for e in &errs {
                    eprintln!("{e}");
                }
                eprintln!("surge run: nothing was allocated and nothing ran");
                return refused;
            }
        };
        let script = Script {
            text,
            directives,
            plan,
            cwd,
        };
        if let Some(j) = &script.directives.jobdw {
            let need = script.stage_in_bytes();
            // A `#SURGE jobdw` with targets only is sized later (and must hold the stage-in).
            if need > j.capacity && !(j.targets.is_some() && j.capacity == 0) {
                eprintln!(
                    "{name}:{}: stage-in of {} does not fit the job instance of {}: nothing \
                     was allocated and nothing ran",
                    j.line,
                    format_bytes(need),
                    format_bytes(j.capacity)
                );
                return refused;
            }
        }
        Ok(Ok(script))
    }

    /// Bytes staged into the job instance.
    fn stage_in_bytes(&self) -> u64 {
        let Some(j) = &self.directives.jobdw else {
            return 0;
        };
        let var = DwVariable::of_job(j.access_mode);
        self.plan.bytes.get(&var).copied().unwrap_or(0)
    }
}

/// The manager the run uses: the embedded one it started, or `--manager`'s.
struct Started {
    embedded: Option<Embedded>,
    opts: Option<EmbeddedOptions>,
    manager: String,
    http: Option<String>,
}

impl Started {
    fn new(args: &RunArgs, surge_exe: &Path, rep: &mut Reporter) -> anyhow::Result<Started> {
        if let Some(m) = &args.manager {
            return Ok(Started {
                embedded: None,
                opts: None,
                manager: m.clone(),
                http: args.manager_http.clone(),
            });
        }
        let t = Instant::now();
        let fast = args
            .fast_dir
            .clone()
            .unwrap_or_else(crate::embedded::default_fast_dir);
        let opts = EmbeddedOptions {
            fast_dir: fast.clone(),
            state_dir: args.state_dir.clone().unwrap_or_else(|| fast.join("state")),
            servers: args.servers.max(1),
            server_capacity: args.server_capacity,
            granularity: args.granularity,
        };
        let emb = Embedded::start(&opts, surge_exe)?;
        rep.phase(
            "start",
            format!(
                "embedded manager + {} servers in {}",
                args.servers,
                fast.display()
            ),
            t,
            true,
        );
        Ok(Started {
            manager: emb.manager.clone(),
            http: emb.http.clone(),
            embedded: Some(emb),
            opts: Some(opts),
        })
    }
}

/// What the driver works with.
struct Ctx<'a> {
    args: &'a RunArgs,
    script_name: &'a str,
    script: &'a Script,
    manager: &'a str,
    manager_http: Option<&'a str>,
    /// This `surge`, put on the job's PATH.
    surge_exe: &'a Path,
    sig: &'a Signals,
    /// The embedded default's options, when it runs the job.
    embedded: Option<&'a EmbeddedOptions>,
}

impl Ctx<'_> {
    /// The job as the lifecycle sees it, for this user, on `--nodes` nodes.
    fn job(&self) -> anyhow::Result<lifecycle::Job> {
        let d = &self.script.directives;
        let peaks_json = match &d.jobdw {
            Some(j) => {
                crate::targets::given_peaks(j, self.args.peaks.as_deref(), self.script_name)?
            }
            None => String::new(),
        };
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Ok(lifecycle::Job {
            script: self.script_name.to_string(),
            directives: d.clone(),
            // The manager ends the session if this process dies without ending it.
            external_id: surge_manager::core::run_external_id(
                &surge_core::sys::hostname(),
                std::process::id(),
            ),
            label: self.args.script.file_name().map_or_else(
                || self.script_name.to_string(),
                |n| n.to_string_lossy().to_string(),
            ),
            manager: self.manager.to_string(),
            alloc: Some(Alloc {
                uid,
                gid,
                nodes: self.args.nodes,
                // Embedded: a pool the script names but that does not exist falls back to the
                // default.
                pool_fallback: self.embedded.is_some(),
                peaks_json,
                stage_in_bytes: self.script.stage_in_bytes(),
            }),
        })
    }

    fn interrupted(&self) -> bool {
        self.sig.interrupted.load(Ordering::SeqCst)
    }
}

/// How the run ended.
struct Outcome {
    code: i32,
    job_status: Option<i32>,
    session: Option<u64>,
    kept_instance: Option<u64>,
    stage_out_failures: Vec<String>,
    /// `#SURGE jobdw`: what was promised and why, and what was measured.
    targets: Option<serde_json::Value>,
}

/// How long `surge run` tries a phase after the job again while the manager does not answer
/// (an HA takeover takes a few seconds, a restart of a single manager longer).
const MANAGER_RETRY: Duration = Duration::from_secs(60);

/// `$call`, an idempotent phase (they are: Slurm runs them again too), evaluated again while
/// it fails because the manager does not answer, for [`MANAGER_RETRY`], reconnecting to the
/// manager (`$m`, a place of the `surge_api::Client`) between tries and saying so; the last
/// result otherwise.
macro_rules! again {
    ($ctx:expr, $m:expr, $rep:expr, $what:expr, $call:expr) => {{
        let mut pauses = surge_core::backoff::Backoff::new(MANAGER_RETRY, Duration::from_secs(1))
            .doubling_to(Duration::from_secs(8));
        loop {
            match $call {
                Err(e) if surge_api::manager_gone(e.as_ref()) => {
                    let Some(pause) = pauses.next() else {
                        break Err(e);
                    };
                    $rep.note(&format!(
                        "{}: the manager does not answer ({e:#}); trying again in {} s",
                        $what,
                        pause.as_secs()
                    ));
                    tokio::time::sleep(pause).await;
                    if let Ok(again) = connect($ctx.manager).await {
                        $m = again;
                    }
                }
                r => break r,
            }
        }
    }};
}

/// What ran between setup and teardown.
struct Ran {
    job_status: Option<i32>,
    failures: Vec<String>,
    targets: Option<serde_json::Value>,
}

/// The phases in order: setup, the job on its emulated nodes ([`run_job`]), teardown (also
/// after a failure, then ending the session as "failed" and destroying nothing).
async fn drive(ctx: &Ctx<'_>, rep: &mut Reporter) -> anyhow::Result<Outcome> {
    let mut m = connect(ctx.manager).await?;
    let job = ctx.job()?;
    calibrate(ctx, &mut m, rep).await?;
    let s = lifecycle::setup(&mut m, &job, rep).await?;
    let mut local = LocalNodes::new(s.id, ctx.args.nodes).map(|l| l.resolving_through(ctx.manager));
    let ran = match &mut local {
        Ok(local) => run_job(ctx, &mut m, &job, &s, local, rep).await,
        Err(e) => Err(anyhow::anyhow!("{e:#}")),
    };
    let how = Teardown {
        hurry: false,
        state: if ran.is_ok() {
            SessionState::Ended
        } else {
            SessionState::Failed
        },
        destroy: ran.is_ok(),
    };
    // The teardown is idempotent: while the manager does not answer (a failover, a restart)
    // it is tried again, so the session is ended and its instance freed rather than left
    // active for an administrator to find.
    let ended = again!(ctx, m, rep, "teardown", {
        match &mut local {
            Ok(local) => lifecycle::teardown(&mut m, &job, local, &how, rep).await,
            Err(_) => lifecycle::teardown(&mut m, &job, &mut lifecycle::NoMounts, &how, rep).await,
        }
    })
    .map_err(|e| {
        if surge_api::manager_gone(e.as_ref()) {
            e.context(format!(
                "session {} is not ended and its instances stay allocated: end it with \
                 `surge session end {}` once the manager answers",
                s.id, s.id
            ))
        } else {
            e
        }
    });
    drop(local);
    let (ran, ended) = match (ran, ended) {
        (Ok(r), Ok(e)) => (r, e),
        (Err(e), Ok(_)) => return Err(e),
        (Err(e), Err(t)) => return Err(e.context(format!("and the teardown failed: {t:#}"))),
        (Ok(_), Err(t)) => return Err(t.context("teardown")),
    };
    let mut failures = ran.failures;
    failures.extend(ended.failures);
    for f in &failures {
        eprintln!("surge run: stage-out: {f}");
    }
    if let Some(i) = ended.kept {
        eprintln!(
            "surge run: the job instance {i} and its data are kept; recover files with `surge \
             stage copy --out` and remove it with `surge instance destroy` (see `surge \
             instance ls`)"
        );
    }
    let code = match (ran.job_status, ctx.interrupted()) {
        (_, true) => 128 + ctx.sig.signal.load(Ordering::SeqCst),
        (Some(s), _) if s != 0 => s,
        _ if !failures.is_empty() => 1,
        _ => 0,
    };
    Ok(Outcome {
        code,
        job_status: ran.job_status,
        session: Some(s.id),
        kept_instance: ended.kept,
        stage_out_failures: failures,
        targets: ran.targets,
    })
}

/// `#SURGE jobdw` in the embedded default: the peaks the targets are sized from are measured
/// the first time a job asks (then kept).
async fn calibrate(
    ctx: &Ctx<'_>,
    m: &mut surge_api::Client,
    rep: &mut Reporter,
) -> anyhow::Result<()> {
    let (Some(j), Some(opts)) = (&ctx.script.directives.jobdw, ctx.embedded) else {
        return Ok(());
    };
    if j.targets.is_none() || ctx.args.peaks.is_some() {
        return Ok(());
    }
    let t = Instant::now();
    let rt = tokio::runtime::Handle::current();
    match crate::calibrate::ensure_embedded(m, &rt, opts).await {
        Ok(Some(line)) => rep.phase("calibrate", line, t, true),
        Ok(None) => {}
        Err(e) => {
            rep.phase("calibrate", format!("{e:#}"), t, false);
            return Err(e.context("cannot measure the peaks the targets are sized from"));
        }
    }
    Ok(())
}

/// The job on its emulated nodes: data_in, paths, pre_run, the script on node 0 (unless
/// interrupted), post_run, data_out (not after an interrupt).
async fn run_job(
    ctx: &Ctx<'_>,
    m: &mut surge_api::Client,
    job: &lifecycle::Job,
    s: &api::Session,
    local: &mut LocalNodes,
    rep: &mut Reporter,
) -> anyhow::Result<Ran> {
    lifecycle::data_in(m, job, &ctx.script.plan, rep)
        .await
        .context("the job did not run")?;
    let envs = lifecycle::paths(m, job, local).await?;
    lifecycle::pre_run(m, job, local, rep).await?;
    let nodes = nodes_file(ctx, s, local, envs)?;
    let targets = measure_targets(ctx, s, &nodes, rep)?;
    let mut job_status = None;
    if !ctx.interrupted() {
        let t = Instant::now();
        let status = run_script(ctx, &nodes.nodes[0].env)?;
        job_status = Some(status);
        rep.phase(
            "job",
            format!("{} exited with status {status}", ctx.script_name),
            t,
            status == 0,
        );
    }
    // From here the job has run: a manager away for a while (a failover) must not fail it.
    again!(ctx, *m, rep, "post_run", {
        lifecycle::post_run(m, job, local, rep).await
    })?;
    // Stage out even after a failed job; not after Ctrl-C.
    let failures = if ctx.interrupted() {
        rep.note("interrupted: no stage-out");
        Vec::new()
    } else {
        again!(ctx, *m, rep, "stage-out", {
            lifecycle::data_out(m, job, &ctx.script.cwd, rep).await
        })?
    };
    Ok(Ran {
        job_status,
        failures,
        targets,
    })
}

/// Each node's environment and mounts, written where `surge exec` and `surge stage` find them.
fn nodes_file(
    ctx: &Ctx<'_>,
    s: &api::Session,
    local: &LocalNodes,
    envs: Vec<BTreeMap<String, String>>,
) -> anyhow::Result<NodesFile> {
    let path_env = job_path(&local.run_dir, ctx.surge_exe)?;
    let preload = preload_library(ctx.surge_exe);
    let nodes = ctx.args.nodes;
    let mut file = NodesFile {
        session: s.id,
        manager: ctx.manager.to_string(),
        run_dir: local.run_dir.clone(),
        nodes: Vec::new(),
    };
    for (node, mut env) in (0..nodes).zip(envs) {
        env.insert("SURGE_NODE".into(), node.to_string());
        env.insert("SURGE_NODES".into(), nodes.to_string());
        // The munged the job's own calls to the manager are authenticated with.
        env.insert(
            surge_auth::munge::SOCKET_ENV.into(),
            surge_api::munge_socket().display().to_string(),
        );
        if let Some(h) = ctx.manager_http {
            env.insert("SURGE_MANAGER_HTTP".into(), h.to_string());
        }
        env.insert("SURGE_RUN_DIR".into(), local.run_dir.display().to_string());
        env.insert("PATH".into(), path_env.clone());
        if let Some(lib) = &preload {
            let before = std::env::var("LD_PRELOAD").unwrap_or_default();
            let all = format!("{} {before}", lib.display());
            env.insert("LD_PRELOAD".into(), all.trim_end().to_string());
        }
        let mounts = local.mounts_of(node);
        file.nodes.push(NodeInfo { node, env, mounts });
    }
    anyhow::ensure!(
        file.nodes.len() == nodes as usize,
        "the job's environment was made for {} of {nodes} nodes",
        file.nodes.len()
    );
    file.write()?;
    Ok(file)
}

/// Where the job's programs are given the interposition library when `surge run` was asked
/// for it (`SURGE_CLIENT=preload`; docs/DATAPLANE.md, "The preload path"): next to the `surge`
/// executable or in `deps/` beside it (a build tree: `cargo build` puts it in the first,
/// `cargo test` in the second; the newer wins), else in `lib/surge` beside its `bin`
/// (`make install`), else in `/usr/lib/surge`. `None` when not asked, or (said) when it is
/// not there.
fn preload_library(surge_exe: &Path) -> Option<PathBuf> {
    const NAME: &str = "libsurge_preload.so";
    if std::env::var("SURGE_CLIENT").ok()?.as_str() != "preload" {
        return None;
    }
    let dir = surge_exe.parent()?;
    let built = [dir.join(NAME), dir.join("deps").join(NAME)]
        .into_iter()
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p);
    // `make install`: PREFIX/bin/surge and PREFIX/lib/surge/.
    let prefix = dir.parent().map(|p| p.join("lib/surge").join(NAME));
    let installed = Path::new("/usr/lib/surge").join(NAME);
    let found = [built, prefix, Some(installed)]
        .into_iter()
        .flatten()
        .find(|p| p.exists());
    if found.is_none() {
        tracing::warn!(
            "SURGE_CLIENT=preload: no {NAME} next to {} (or in its deps/), in lib/surge beside \
             it nor in /usr/lib/surge; the job runs without it",
            surge_exe.display()
        );
    }
    found
}

/// `#SURGE jobdw`: what the manager promised and why, and with `--measure-targets` what a
/// short `surge bench io` on node 0's mount measured.
fn measure_targets(
    ctx: &Ctx<'_>,
    s: &api::Session,
    nodes: &NodesFile,
    rep: &mut Reporter,
) -> anyhow::Result<Option<serde_json::Value>> {
    let Some(p) = s
        .instances
        .iter()
        .find(|i| i.id == s.job_instance)
        .and_then(crate::targets::promise_of)
    else {
        return Ok(None);
    };
    let mut json = serde_json::to_value(&p).ok();
    if ctx.args.measure_targets {
        let t = Instant::now();
        let mount = nodes.nodes[0]
            .mounts
            .iter()
            .find(|m| m.instance == s.job_instance)
            .map(|m| m.path.clone())
            .context("the job instance is not mounted")?;
        let (measured, line) = crate::targets::measure(&mount, &p)?;
        rep.phase("measure", line, t, true);
        if let Some(serde_json::Value::Object(o)) = json.as_mut() {
            o.insert("measured".into(), measured);
        }
    }
    Ok(json)
}

/// The `--report` JSON.
fn report_json(
    script: &str,
    code: i32,
    outcome: &anyhow::Result<Outcome>,
    rep: &Reporter,
) -> serde_json::Value {
    let o = outcome.as_ref().ok();
    serde_json::json!({
        "script": script,
        "exit_code": code,
        "job_status": o.and_then(|o| o.job_status),
        "session": o.and_then(|o| o.session),
        "kept_instance": o.and_then(|o| o.kept_instance),
        "stage_out_failures": o.map(|o| o.stage_out_failures.clone()).unwrap_or_default(),
        "targets": o.and_then(|o| o.targets.clone()),
        "phases": rep.phases,
        "error": outcome.as_ref().err().map(|e| format!("{e:#}")),
    })
}

/// `--history`: the run remembered in `surge tune`'s history as the job as written.
fn record_history(
    args: &RunArgs,
    text: &str,
    report: &serde_json::Value,
    started_at: &str,
    db: &Path,
    rep: &Reporter,
) {
    let recorded = surge_tune::cli::record_as_written(
        &surge_tune::cli::RunAsWritten {
            script: &args.script,
            text,
            args: &args.args,
            nodes: args.nodes,
            granularity: args.granularity,
            manager: args.manager.as_deref(),
            report,
            started_at,
        },
        db,
    );
    match recorded {
        Ok(config) => rep.note(&format!(
            "recorded in the tune history {} as the job as written ({config})",
            db.display()
        )),
        Err(e) => eprintln!(
            "surge run: warning: not recorded in the tune history {}: {e:#}",
            db.display()
        ),
    }
}

/// The first line (1-based) that ends with CR, and its text without it.
fn crlf_line(text: &str) -> Option<(usize, &str)> {
    text.split('\n')
        .enumerate()
        .find_map(|(i, l)| l.strip_suffix('\r').map(|l| (i + 1, l)))
}

/// The job's PATH: a directory holding only this `surge` (so `surge stage`, `surge exec` work
/// in every job), then the caller's PATH.
fn job_path(run_dir: &Path, surge_exe: &Path) -> anyhow::Result<String> {
    let bin = run_dir.join("bin");
    std::fs::create_dir_all(&bin).with_context(|| format!("cannot create {}", bin.display()))?;
    let link = bin.join("surge");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(surge_exe, &link)
        .with_context(|| format!("cannot create {}", link.display()))?;
    let rest = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
    Ok(format!("{}:{rest}", bin.display()))
}

/// Runs the script with its interpreter (its `#!` line, else /bin/sh) in its own process group
/// and returns its status (128+N when killed by signal N).
fn run_script(ctx: &Ctx<'_>, env: &BTreeMap<String, String>) -> anyhow::Result<i32> {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let script = &ctx.args.script;
    let text = std::fs::read_to_string(script)?;
    let interp: Vec<String> = match text.lines().next().and_then(|l| l.strip_prefix("#!")) {
        Some(l) => l.split_whitespace().map(str::to_string).collect(),
        None => vec!["/bin/sh".into()],
    };
    let (prog, pre) = interp
        .split_first()
        .map(|(p, r)| (p.clone(), r.to_vec()))
        .unwrap_or(("/bin/sh".into(), vec![]));
    let mut cmd = std::process::Command::new(&prog);
    cmd.args(&pre)
        .arg(script)
        .args(&ctx.args.args)
        .current_dir(&ctx.script.cwd)
        .envs(env)
        .process_group(0);
    child_setup(&mut cmd, false);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {} with {prog}", script.display()))?;
    ctx.sig.job_pgid.store(child.id() as i32, Ordering::SeqCst);
    if ctx.interrupted() {
        // SAFETY: signalling the job's new process group.
        unsafe { libc::kill(-(child.id() as i32), libc::SIGTERM) };
    }
    let status = child.wait()?;
    // Processes the script left behind would keep the mounts busy: end them, as Slurm does at
    // the end of a job.
    // SAFETY: as above.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    ctx.sig.job_pgid.store(0, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(10));
    Ok(status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}
