//! `surge run job.sh`: run a DataWarp-style batch script with the burst buffer it asks for.
//!
//! Phases, each timed and reported: parse the directives (any error: nothing is allocated and
//! nothing runs), check the stage-in sources, start the embedded manager and servers (or use
//! `$SURGE_MANAGER`), create persistent instances, open a session (allocating the job
//! instance and attaching persistent ones), stage in, mount on every emulated node, run the
//! script on node 0, stage out (also after a failed job), unmount, end the session (the job
//! instance is kept if stage-out failed), destroy persistent instances, stop what was started.

use crate::embedded::{child_setup, user_name, Embedded, EmbeddedOptions};
use crate::jobplan::{self, StageGroup};
use crate::nodes::{MountInfo, NodeInfo, NodesFile};
use crate::progress::wait_stage;
use anyhow::Context;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use surge_api::v1 as api;
use surge_client::mount::{self, MountOptions, Mounted};
use surge_client::InstanceClient;
use surge_core::directives::{parse_script, AccessMode, Directives, DwVariable};
use surge_core::{format_bytes, NamespaceId};
use surge_manager::cli::{connect, status_err};
use surge_proto::InstanceDescriptor;

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

struct Reporter {
    quiet: bool,
    phases: Vec<Phase>,
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

/// Everything the run has set up, so teardown undoes exactly that.
struct Allocation {
    session: Option<u64>,
    mounts: Vec<Mounted>,
    run_dir: Option<PathBuf>,
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    // Before any thread starts, so all inherit the mask.
    let set = surge_core::sys::block_signals(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP]);
    let script_name = args.script.display().to_string();
    let started_at = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let text = std::fs::read_to_string(&args.script)
        .with_context(|| format!("cannot read job script {script_name}"))?;
    if let Some((n, line)) = crlf_line(&text) {
        eprintln!(
            "{script_name}:{n}: `{line}\\r`: the script has Windows (CRLF) line endings; the shell \
             would take each `\\r` as part of a command (`$'\\r': command not found`). Convert it \
             with `sed -i 's/\\r$//' {script_name}` (or dos2unix)"
        );
        eprintln!("surge run: nothing was allocated and nothing ran");
        return Ok(ExitCode::from(2));
    }
    let directives = match parse_script(&script_name, &text) {
        Ok(d) => d,
        Err(errs) => {
            for e in &errs.0 {
                eprintln!("{e}");
            }
            eprintln!(
                "surge run: {} error(s) in {script_name}: nothing was allocated and nothing ran",
                errs.0.len()
            );
            return Ok(ExitCode::from(2));
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

    // Check every stage-in source before anything is allocated.
    let jobplan::StageIn {
        groups: in_groups,
        bytes: in_bytes,
    } = match jobplan::stage_in(&directives, &script_name, &cwd) {
        Ok(x) => x,
        Err(errs) => {
            for e in &errs {
                eprintln!("{e}");
            }
            eprintln!("surge run: nothing was allocated and nothing ran");
            return Ok(ExitCode::from(2));
        }
    };
    if let Some(j) = &directives.jobdw {
        let var = job_var(j.access_mode);
        let need = in_bytes.get(&var).copied().unwrap_or(0);
        // A `#SURGE jobdw` with targets only is sized later (and must hold the stage-in).
        if need > j.capacity && !(j.targets.is_some() && j.capacity == 0) {
            eprintln!(
                "{script_name}:{}: stage-in of {} does not fit the job instance of {}: nothing \
                 was allocated and nothing ran",
                j.line,
                format_bytes(need),
                format_bytes(j.capacity)
            );
            return Ok(ExitCode::from(2));
        }
    }

    let sig = Arc::new(Signals {
        interrupted: AtomicBool::new(false),
        job_pgid: AtomicI32::new(0),
        signal: AtomicI32::new(0),
    });
    spawn_signal_thread(set, sig.clone());
    let mut rep = Reporter {
        quiet: args.quiet,
        phases: Vec::new(),
    };

    let t = Instant::now();
    let surge_exe = std::env::current_exe().context("cannot find the surge executable")?;
    let mut embedded_opts = None;
    let (embedded, manager, pool_fallback) = match &args.manager {
        Some(m) => (None, m.clone(), false),
        None => {
            let fast = args
                .fast_dir
                .clone()
                .unwrap_or_else(crate::embedded::default_fast_dir);
            let state = args.state_dir.clone().unwrap_or_else(|| fast.join("state"));
            let opts = EmbeddedOptions {
                fast_dir: fast.clone(),
                state_dir: state,
                servers: args.servers.max(1),
                server_capacity: args.server_capacity,
                granularity: args.granularity,
            };
            let emb = Embedded::start(&opts, &surge_exe)?;
            embedded_opts = Some(opts);
            let m = emb.manager.clone();
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
            (Some(emb), m, true)
        }
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let mut alloc = Allocation {
        session: None,
        mounts: Vec::new(),
        run_dir: None,
    };
    let manager_http = match &embedded {
        Some(e) => e.http.clone(),
        None => args.manager_http.clone(),
    };
    let ctx = Ctx {
        args: &args,
        script_name: &script_name,
        directives: &directives,
        in_groups: &in_groups,
        cwd: &cwd,
        manager: &manager,
        manager_http: manager_http.as_deref(),
        surge_exe: &surge_exe,
        pool_fallback,
        sig: &sig,
        stage_in_bytes: &in_bytes,
        embedded: embedded_opts.as_ref(),
    };
    let outcome = rt.block_on(job(&ctx, &mut rep, &mut alloc, rt.handle().clone()));
    // Whatever happened: unmount and end the session if the job flow did not get that far.
    let t = Instant::now();
    let leftover = !alloc.mounts.is_empty() || alloc.session.is_some();
    for m in alloc.mounts.drain(..) {
        let _ = m.unmount();
    }
    if let Some(s) = alloc.session.take() {
        let _ = rt.block_on(async {
            let mut c = connect(&manager).await?;
            c.end_session(api::EndSessionRequest {
                id: s,
                keep_job_instance: false,
                state: "failed".into(),
            })
            .await
            .map_err(status_err)
        });
    }
    if let Some(d) = alloc.run_dir.take() {
        let _ = std::fs::remove_dir_all(d);
    }
    drop(rt);
    if let Some(emb) = embedded {
        emb.stop();
    }
    if leftover || pool_fallback {
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
        let report = serde_json::json!({
            "script": script_name,
            "exit_code": code,
            "job_status": outcome.as_ref().ok().and_then(|o| o.job_status),
            "session": outcome.as_ref().ok().and_then(|o| o.session),
            "kept_instance": outcome.as_ref().ok().and_then(|o| o.kept_instance),
            "stage_out_failures": outcome.as_ref().map(|o| o.stage_out_failures.clone()).unwrap_or_default(),
            "targets": outcome.as_ref().ok().and_then(|o| o.targets.clone()),
            "phases": rep.phases,
            "error": outcome.as_ref().err().map(|e| format!("{e:#}")),
        });
        if let Some(path) = &args.report {
            std::fs::write(path, serde_json::to_string_pretty(&report)?)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        if let Some(db) = &args.history {
            let recorded = surge_tune::cli::record_as_written(
                &surge_tune::cli::RunAsWritten {
                    script: &args.script,
                    text: &text,
                    args: &args.args,
                    nodes: args.nodes,
                    granularity: args.granularity,
                    manager: args.manager.as_deref(),
                    report: &report,
                    started_at: &started_at,
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
    }
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

/// The first line (1-based) that ends with CR, and its text without it.
fn crlf_line(text: &str) -> Option<(usize, &str)> {
    text.split('\n')
        .enumerate()
        .find_map(|(i, l)| l.strip_suffix('\r').map(|l| (i + 1, l)))
}

// A cache drain that makes no progress for this long is given up (the instance is kept).
use surge_stage::cache_task::DRAIN_STALL;

fn job_var(mode: AccessMode) -> DwVariable {
    match mode {
        AccessMode::Private => DwVariable::JobPrivate,
        AccessMode::Striped => DwVariable::JobStriped,
        AccessMode::Ldbalance => DwVariable::JobLdbal,
    }
}

struct Ctx<'a> {
    args: &'a RunArgs,
    script_name: &'a str,
    directives: &'a Directives,
    in_groups: &'a [StageGroup],
    cwd: &'a Path,
    manager: &'a str,
    manager_http: Option<&'a str>,
    /// This `surge`, put on the job's PATH.
    surge_exe: &'a Path,
    /// Embedded mode: a pool the script names but that does not exist falls back to the default.
    pool_fallback: bool,
    sig: &'a Signals,
    /// Bytes staged in, per instance variable (a targets-only job instance must hold them).
    stage_in_bytes: &'a std::collections::HashMap<DwVariable, u64>,
    /// The embedded default's options, when it runs the job.
    embedded: Option<&'a EmbeddedOptions>,
}

struct Outcome {
    code: i32,
    job_status: Option<i32>,
    session: Option<u64>,
    kept_instance: Option<u64>,
    stage_out_failures: Vec<String>,
    /// `#SURGE jobdw`: what was promised and why, and what was measured.
    targets: Option<serde_json::Value>,
}

/// An instance the job uses, by the variable that names it in the script.
#[derive(Clone)]
struct Used {
    var: DwVariable,
    id: u64,
    desc: InstanceDescriptor,
    private: bool,
    /// Read-only replicas (ldbalance): the stage-in goes to each, node i reads i mod replicas.
    replicas: Option<u32>,
    /// `type=cache`: the PFS directory it mirrors (filled before, drained during and after).
    cache: Option<PathBuf>,
    /// A capability for the instance's servers (every namespace), from the manager.
    token: surge_auth::Token,
}

/// The stage-out of `items` from instance `u`, per namespace (see [`crate::bb::split_private`]).
async fn out_per_namespace(
    u: &Used,
    nodes: u32,
    items: &[surge_stage::StageItem],
) -> Result<Vec<(u32, Vec<surge_stage::StageItem>)>, Vec<String>> {
    if !u.private || nodes <= 1 {
        return Ok(vec![(0, items.to_vec())]);
    }
    crate::bb::split_private(&u.var, &u.desc, &u.token, nodes, items).await
}

fn interrupted(sig: &Signals) -> bool {
    sig.interrupted.load(Ordering::SeqCst)
}

fn instance_desc(i: &api::Instance) -> anyhow::Result<InstanceDescriptor> {
    serde_json::from_str(&i.descriptor_json)
        .with_context(|| format!("instance {}: bad descriptor from the manager", i.id))
}

async fn job(
    ctx: &Ctx<'_>,
    rep: &mut Reporter,
    alloc: &mut Allocation,
    rt: tokio::runtime::Handle,
) -> anyhow::Result<Outcome> {
    let d = ctx.directives;
    let mut c = connect(ctx.manager).await?;
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let nodes = ctx.args.nodes;
    let existing_pools: Vec<String> = c
        .list_pools(api::Empty {})
        .await
        .map_err(status_err)?
        .into_inner()
        .pools
        .into_iter()
        .map(|p| p.name)
        .collect();
    let pool_for = |p: &Option<String>, rep: &Reporter| -> String {
        match p {
            Some(p) if !existing_pools.contains(p) && ctx.pool_fallback => {
                rep.note(&format!(
                    "pool '{p}' is not defined here: using the default pool"
                ));
                String::new()
            }
            Some(p) => p.clone(),
            None => String::new(),
        }
    };

    // Persistent instances created by this script (before the job, as DataWarp does).
    for cp in &d.create_persistent {
        let t = Instant::now();
        let r = c
            .create_instance(crate::bb::persistent_request(
                cp,
                pool_for(&cp.pool, rep),
                uid,
                gid,
            ))
            .await;
        match r {
            Ok(i) => {
                let i = i.into_inner();
                rep.phase(
                    "create persistent",
                    format!(
                        "{} {} ({} fragments)",
                        cp.name,
                        format_bytes(i.capacity),
                        i.fragments
                    ),
                    t,
                    true,
                );
                // A persistent cache mirrors its PFS directory from its creation on.
                if let Some(pfs) = &cp.cache.pfs {
                    let filled = async {
                        let client = persistent_client_by(&mut c, i.id, "").await?;
                        fill_cache(ctx, rep, &client, Path::new(pfs), &cp.name).await
                    }
                    .await;
                    if let Err(e) = filled {
                        let gone = c
                            .destroy_instance(api::DestroyInstanceRequest {
                                id: i.id,
                                persistent_name: String::new(),
                                hurry: true,
                            })
                            .await;
                        anyhow::bail!(
                            "{}:{}: #BB create_persistent name={}: {e:#}; the instance was {}",
                            ctx.script_name,
                            cp.line,
                            cp.name,
                            if gone.is_ok() {
                                "destroyed"
                            } else {
                                "kept (destroy it with `surge instance destroy`)"
                            }
                        );
                    }
                }
            }
            Err(e) => {
                rep.phase("create persistent", cp.name.clone(), t, false);
                anyhow::bail!(
                    "{}:{}: #BB create_persistent name={}: {}",
                    ctx.script_name,
                    cp.line,
                    cp.name,
                    e.message()
                );
            }
        }
    }

    // `#SURGE jobdw`: the manager sizes the job instance from calibrated peaks. The embedded
    // default measures its peaks the first time a job asks (then keeps them).
    let job_pool = d.jobdw.as_ref().map(|j| pool_for(&j.pool, rep));
    let targets = d.jobdw.as_ref().and_then(crate::targets::request_targets);
    let given = match &d.jobdw {
        Some(j) => crate::targets::given_peaks(j, ctx.args.peaks.as_deref(), ctx.script_name)?,
        None => String::new(),
    };
    if let (Some(_), true, Some(opts)) = (&targets, given.is_empty(), ctx.embedded) {
        let t = Instant::now();
        match crate::calibrate::ensure_embedded(&mut c, &rt, opts).await {
            Ok(Some(line)) => rep.phase("calibrate", line, t, true),
            Ok(None) => {}
            Err(e) => {
                rep.phase("calibrate", format!("{e:#}"), t, false);
                return Err(e.context("cannot measure the peaks the targets are sized from"));
            }
        }
    }

    // The session: job instance and attached persistent instances.
    let t = Instant::now();
    let job_req = d.jobdw.as_ref().map(|j| api::CreateInstanceRequest {
        // Targets: the least capacity asked, and room for what is staged in.
        capacity: if j.targets.is_some() {
            j.capacity.max(
                ctx.stage_in_bytes
                    .get(&job_var(j.access_mode))
                    .copied()
                    .unwrap_or(0),
            )
        } else {
            j.capacity
        },
        access_mode: j.access_mode.as_str().into(),
        pool: job_pool.clone().unwrap_or_default(),
        persistent_name: String::new(),
        nodes,
        owner_uid: uid,
        owner_gid: gid,
        stripe_size: 0,
        share_with_group: false,
        targets,
        peaks_json: given.clone(),
        ..crate::bb::cache_request(&j.cache)
    });
    let job_name = ctx
        .args
        .script
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| ctx.script_name.to_string());
    let session = c
        .create_session(api::CreateSessionRequest {
            job: job_name,
            owner_uid: uid,
            owner_gid: gid,
            job_instance: job_req,
            persistent: d.persistentdw.iter().map(|p| p.name.clone()).collect(),
            // The manager ends the session if this process dies without ending it.
            external_id: surge_manager::core::run_external_id(
                &surge_core::sys::hostname(),
                std::process::id(),
            ),
        })
        .await
        .map_err(|e| {
            let line = d.jobdw.as_ref().map(|j| j.line).unwrap_or(0);
            anyhow::anyhow!(
                "{}:{line}: cannot allocate the burst buffer: {}",
                ctx.script_name,
                e.message()
            )
        })?
        .into_inner();
    alloc.session = Some(session.id);
    // The manager keeps the phase (`surge session ls`), as for a Slurm job's phases.
    let phase = |c: &mut surge_api::Client, name: &'static str| {
        let (mut c, s) = (c.clone(), session.clone());
        async move { crate::bb::set_phase(&mut c, &s, name, Vec::new(), false).await }
    };
    phase(&mut c, "setup").await?;
    let mut used: Vec<Used> = Vec::new();
    for i in &session.instances {
        let desc = instance_desc(i)?;
        let var = if i.id == session.job_instance {
            if desc.cache_pfs.is_some() {
                DwVariable::JobStripedCache
            } else if i.access_mode == "private" {
                DwVariable::JobPrivate
            } else if i.access_mode == "ldbalance" {
                DwVariable::JobLdbal
            } else {
                DwVariable::JobStriped
            }
        } else {
            DwVariable::PersistentStriped(i.name.clone())
        };
        let cap = c
            .get_capability(api::GetCapabilityRequest {
                instance: i.id,
                persistent_name: String::new(),
                namespace: 0,
                all_namespaces: true,
            })
            .await
            .map_err(status_err)?
            .into_inner();
        used.push(Used {
            var,
            id: i.id,
            private: i.access_mode == "private",
            replicas: (i.access_mode == "ldbalance").then_some(desc.namespaces.len().max(1) as u32),
            cache: desc.cache_pfs.as_ref().map(PathBuf::from),
            desc,
            token: surge_auth::Token::from_text(&cap.token)?,
        });
    }
    let detail = match session
        .instances
        .iter()
        .find(|i| i.id == session.job_instance)
    {
        Some(i) => format!(
            "session {}: job instance {} {} ({}{} fragments){}",
            session.id,
            format_bytes(i.capacity),
            i.access_mode,
            match used.iter().find(|u| u.id == i.id).and_then(|u| u.replicas) {
                Some(r) => format!("{r} replicas, "),
                None => String::new(),
            },
            i.fragments,
            if session.persistent.is_empty() {
                String::new()
            } else {
                format!(", {} persistent", session.persistent.len())
            }
        ),
        None => format!(
            "session {}: {} persistent instance(s)",
            session.id,
            session.persistent.len()
        ),
    };
    rep.phase("allocate", detail, t, true);
    // What the manager promised for the targets, and why.
    let promise = session
        .instances
        .iter()
        .find(|i| i.id == session.job_instance)
        .and_then(crate::targets::promise_of);
    if let Some(p) = &promise {
        rep.phase("size", crate::targets::detail(p), t, true);
        for w in &p.why {
            rep.note(&format!("  {w}"));
        }
    }
    let mut targets_json = promise.as_ref().and_then(|p| serde_json::to_value(p).ok());

    // A cache job instance is filled from its PFS directory (a persistent one was filled when
    // it was created).
    for u in used
        .iter()
        .filter(|u| u.cache.is_some() && u.id == session.job_instance)
    {
        phase(&mut c, "data_in").await?;
        let client = InstanceClient::new(u.desc.clone(), NamespaceId(0), u.token.clone())?;
        let pfs = u.cache.clone().unwrap_or_default();
        fill_cache(ctx, rep, &client, &pfs, &u.var.to_string())
            .await
            .context("the job did not run")?;
    }

    // Stage in.
    if !ctx.in_groups.is_empty() {
        phase(&mut c, "data_in").await?;
    }
    for g in ctx.in_groups {
        if interrupted(ctx.sig) {
            anyhow::bail!("interrupted before the job ran");
        }
        let u = used.iter().find(|u| u.var == g.instance).with_context(|| {
            format!(
                "{}: {} is not an instance of this job",
                ctx.script_name, g.instance
            )
        })?;
        let namespaces: Vec<u32> = match (u.private, u.replicas) {
            (true, _) => (0..nodes).collect(),
            (_, Some(r)) => (0..r).collect(),
            _ => vec![0],
        };
        for ns in namespaces {
            let t = Instant::now();
            let done = crate::bb::stage_once_in(
                &mut c,
                session.id,
                u.id,
                ns,
                "in",
                serde_json::to_string(&g.items)?,
                "data_in",
                ctx.args.quiet,
                || interrupted(ctx.sig),
            )
            .await?;
            let ok = done.state == "done";
            rep.phase(
                "stage in",
                format!(
                    "{}{}: {} files, {}{}",
                    g.instance,
                    match (u.private, u.replicas) {
                        (true, _) => format!(" (node {ns})"),
                        (_, Some(r)) => format!(" (replica {}/{r})", ns + 1),
                        _ => String::new(),
                    },
                    done.files_done,
                    format_bytes(done.bytes_done),
                    rate(done.bytes_done, done.seconds)
                ),
                t,
                ok,
            );
            if !ok {
                let failures = failure_lines(&done.failures_json);
                for f in &failures {
                    eprintln!("surge run:   {f}");
                }
                anyhow::bail!(
                    "stage-in from {}:{:?} failed: {}; the job did not run",
                    ctx.script_name,
                    g.lines,
                    if done.error.is_empty() {
                        "see above".to_string()
                    } else {
                        done.error.clone()
                    }
                );
            }
        }
    }

    // Mount on every node.
    phase(&mut c, "pre_run").await?;
    let t = Instant::now();
    let run_dir = make_run_dir(session.id)?;
    alloc.run_dir = Some(run_dir.clone());
    let mut nodes_file = NodesFile {
        session: session.id,
        manager: ctx.manager.to_string(),
        run_dir: run_dir.clone(),
        nodes: Vec::new(),
    };
    let path_env = job_path(&run_dir, ctx.surge_exe)?;
    let opts = MountOptions::default();
    for node in 0..nodes {
        let mut env = BTreeMap::new();
        let mut mounts = Vec::new();
        for u in &used {
            let ns = match (u.private, u.replicas) {
                (true, _) => node,
                (_, Some(r)) => node % r,
                _ => 0,
            };
            let dir = match &u.var {
                DwVariable::PersistentStriped(name) => {
                    run_dir.join(format!("node-{node}/persistent/{name}"))
                }
                _ => run_dir.join(format!("node-{node}/job")),
            };
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            let client = InstanceClient::new(u.desc.clone(), NamespaceId(ns), u.token.clone())?;
            let m = mount::mount(client, rt.clone(), &dir, &opts)?;
            alloc.mounts.push(m);
            let path = dir.display().to_string();
            env.insert(u.var.env_name(), path.clone());
            match &u.var {
                DwVariable::JobStriped => {
                    env.insert("SURGE_JOB_STRIPED".into(), path.clone());
                }
                DwVariable::JobPrivate => {
                    env.insert("SURGE_JOB_PRIVATE".into(), path.clone());
                }
                DwVariable::JobLdbal => {
                    env.insert("SURGE_JOB_LDBAL".into(), path.clone());
                }
                DwVariable::JobStripedCache => {
                    env.insert("SURGE_JOB_STRIPED_CACHE".into(), path.clone());
                }
                DwVariable::PersistentStriped(n) => {
                    env.insert(format!("SURGE_PERSISTENT_{n}"), path.clone());
                }
            }
            if u.id == session.job_instance {
                env.insert("SURGE_JOB_INSTANCE".into(), u.id.to_string());
            }
            mounts.push(MountInfo {
                path: dir.clone(),
                instance: u.id,
                ns,
                var: u.var.env_name(),
            });
        }
        env.insert("SURGE_NODE".into(), node.to_string());
        env.insert("SURGE_NODES".into(), nodes.to_string());
        env.insert("SURGE_SESSION".into(), session.id.to_string());
        env.insert("SURGE_MANAGER".into(), ctx.manager.to_string());
        // The munged the job's own calls to the manager are authenticated with.
        env.insert(
            surge_auth::munge::SOCKET_ENV.into(),
            surge_api::munge_socket().display().to_string(),
        );
        if let Some(h) = ctx.manager_http {
            env.insert("SURGE_MANAGER_HTTP".into(), h.to_string());
        }
        env.insert("SURGE_RUN_DIR".into(), run_dir.display().to_string());
        env.insert("PATH".into(), path_env.clone());
        nodes_file.nodes.push(NodeInfo { node, env, mounts });
    }
    nodes_file.write()?;
    if !used.is_empty() {
        // What the job's bytes get: a user without the helper learns why the mount is slow.
        let how = match alloc.mounts.first().map(|m| m.passthrough) {
            Some(mount::Passthrough::Off) if !mount::is_root() => format!(
                "; no kernel passthrough (not root, no passthrough helper at {}: every byte \
                 through this process)",
                surge_client::lend::socket_path().display()
            ),
            Some(p) => format!("; {}", p.describe()),
            None => String::new(),
        };
        rep.phase(
            "mount",
            format!(
                "{} instance(s) on {nodes} node(s) under {}{how}",
                used.len(),
                run_dir.display()
            ),
            t,
            true,
        );
    }

    if let (Some(p), true) = (&promise, ctx.args.measure_targets) {
        let t = Instant::now();
        let mount = nodes_file.nodes[0]
            .mounts
            .iter()
            .find(|m| m.instance == session.job_instance)
            .map(|m| m.path.clone())
            .context("the job instance is not mounted")?;
        let (measured, line) = crate::targets::measure(&mount, p)?;
        rep.phase("measure", line, t, true);
        if let Some(serde_json::Value::Object(o)) = targets_json.as_mut() {
            o.insert("measured".into(), measured);
        }
    }

    // Cache instances drain in the background while the job runs.
    let mut drains = Vec::new();
    for u in used.iter().filter(|u| u.cache.is_some()) {
        let client = Arc::new(InstanceClient::new(
            u.desc.clone(),
            NamespaceId(0),
            u.token.clone(),
        )?);
        let state = Arc::new(surge_stage::drain::DrainState::default());
        let stop = Arc::new(AtomicBool::new(false));
        let pfs = u.cache.clone().unwrap_or_default();
        let task = rt.spawn(surge_stage::drain::drain_loop(
            client,
            pfs.clone(),
            state.clone(),
            stop.clone(),
            Duration::from_millis(100),
        ));
        drains.push((
            u.var.clone(),
            pfs,
            state,
            stop,
            task,
            u.id == session.job_instance,
        ));
    }

    // The job.
    let t = Instant::now();
    let mut job_status = None;
    if !interrupted(ctx.sig) {
        let status = run_script(ctx, &nodes_file.nodes[0].env)?;
        job_status = Some(status);
        rep.phase(
            "job",
            format!("{} exited with status {status}", ctx.script_name),
            t,
            status == 0,
        );
    }

    // List files of stage_out type=list live in the instance: read them through node 0's mount
    // before unmounting.
    let mount_of = |var: &DwVariable| -> Option<PathBuf> {
        nodes_file.nodes[0]
            .mounts
            .iter()
            .find(|m| m.var == var.env_name())
            .map(|m| m.path.clone())
    };
    let out_groups = jobplan::stage_out(d, ctx.script_name, ctx.cwd, |s| {
        let base =
            mount_of(&s.instance).ok_or_else(|| std::io::Error::other("instance not mounted"))?;
        let rel = jobplan::instance_path(&s.source, &s.instance).map_err(std::io::Error::other)?;
        std::fs::read_to_string(base.join(rel.trim_start_matches('/')))
    });

    // Unmount: the kernel has sent every close by then, so all sizes are committed.
    phase(&mut c, "post_run").await?;
    let t = Instant::now();
    let n_mounts = alloc.mounts.len();
    for m in alloc.mounts.drain(..) {
        if let Err(e) = m.unmount() {
            eprintln!("surge run: {e:#}");
        }
    }
    if n_mounts > 0 {
        rep.phase("unmount", format!("{n_mounts} mount(s)"), t, true);
    }

    // Cache instances: every change reaches the PFS before the instance goes; a drain that
    // stops making progress keeps the instance (its data is the only copy).
    let mut drain_failures = Vec::new();
    for (var, pfs, state, stop, task, job_instance) in drains {
        let t = Instant::now();
        stop.store(true, Ordering::SeqCst);
        match finish_drain(&state, task).await {
            Err(why) => drain_failures.push(format!("drain of {var} to {}: {why}", pfs.display())),
            // Drained, mounts gone: the stable names of files written through are extra. A
            // persistent cache keeps them (its lazily filled files still read from them).
            Ok(()) if job_instance => {
                if let Err(e) = surge_stage::drain::clear_through(&pfs) {
                    eprintln!("surge run: {e}");
                }
            }
            Ok(()) => {}
        }
        let st = &state.stats;
        rep.phase(
            "drain",
            format!(
                "{var} to {}: {} changes, {} files, {}{}",
                pfs.display(),
                st.entries.load(Ordering::Relaxed),
                st.files.load(Ordering::Relaxed),
                format_bytes(st.bytes.load(Ordering::Relaxed)),
                rate(
                    st.bytes.load(Ordering::Relaxed),
                    st.busy_ns.load(Ordering::Relaxed) as f64 / 1e9
                )
            ),
            t,
            drain_failures.is_empty(),
        );
    }

    // Stage out (even after a failed job; not after Ctrl-C).
    phase(&mut c, "data_out").await?;
    let mut stage_out_failures = Vec::new();
    if interrupted(ctx.sig) {
        rep.note("interrupted: no stage-out");
    } else {
        match out_groups {
            Err(errs) => stage_out_failures.extend(errs),
            Ok(groups) => {
                for g in groups {
                    let Some(u) = used.iter().find(|u| u.var == g.instance) else {
                        stage_out_failures.push(format!(
                            "{}: {} is not an instance of this job",
                            ctx.script_name, g.instance
                        ));
                        continue;
                    };
                    let per_node = match out_per_namespace(u, nodes, &g.items).await {
                        Ok(p) => p,
                        Err(lines) => {
                            stage_out_failures.extend(lines);
                            continue;
                        }
                    };
                    for (ns, items) in per_node {
                        let t = Instant::now();
                        let done = crate::bb::stage_once_in(
                            &mut c,
                            session.id,
                            u.id,
                            ns,
                            "out",
                            serde_json::to_string(&items)?,
                            "data_out",
                            ctx.args.quiet,
                            || false,
                        )
                        .await?;
                        let ok = done.state == "done";
                        rep.phase(
                            "stage out",
                            format!(
                                "{}{}: {} files, {}{}",
                                g.instance,
                                if u.private {
                                    format!(" (node {ns})")
                                } else {
                                    String::new()
                                },
                                done.files_done,
                                format_bytes(done.bytes_done),
                                rate(done.bytes_done, done.seconds)
                            ),
                            t,
                            ok,
                        );
                        if !ok {
                            if !done.error.is_empty() {
                                stage_out_failures.push(done.error.clone());
                            }
                            stage_out_failures.extend(failure_lines(&done.failures_json));
                        }
                    }
                }
            }
        }
        stage_out_failures.extend(finish_job_stages(ctx, rep, &mut c, session.id).await?);
    }
    stage_out_failures.extend(drain_failures);

    // End the session: the job instance goes, unless stage-out failed (its data is the only
    // copy of the results).
    phase(
        &mut c,
        if stage_out_failures.is_empty() {
            "teardown"
        } else {
            "data_out_failed"
        },
    )
    .await?;
    let t = Instant::now();
    let keep = !stage_out_failures.is_empty();
    c.end_session(api::EndSessionRequest {
        id: session.id,
        keep_job_instance: keep,
        state: if keep {
            "stage-out-failed".into()
        } else {
            "ended".into()
        },
    })
    .await
    .map_err(status_err)?;
    alloc.session = None;
    let kept_instance = if keep && session.job_instance != 0 {
        Some(session.job_instance)
    } else {
        None
    };
    rep.phase(
        "release",
        match kept_instance {
            Some(i) => format!(
                "session {} ended; job instance {i} KEPT (stage-out failed)",
                session.id
            ),
            None => format!("session {} ended", session.id),
        },
        t,
        !keep,
    );
    for f in &stage_out_failures {
        eprintln!("surge run: stage-out: {f}");
    }
    if let Some(i) = kept_instance {
        eprintln!(
            "surge run: the job instance {i} and its data are kept; recover files with `surge stage copy \
             --out` and remove it with `surge instance destroy` (see `surge instance ls`)"
        );
    }

    // Persistent instances this script destroys (after the job).
    for dp in &d.destroy_persistent {
        let t = Instant::now();
        // A persistent cache drains every change to its PFS directory before it goes (not
        // with `hurry`, which gives them up).
        let drained = if dp.hurry {
            Ok(None)
        } else {
            drain_persistent_cache(&mut c, &dp.name).await
        };
        let cache = match drained {
            Ok(pfs) => pfs,
            Err(e) => {
                rep.phase("destroy persistent", dp.name.clone(), t, false);
                stage_out_failures.push(format!(
                    "{}:{}: #BB destroy_persistent name={}: {e:#}; the instance and its data \
                     are kept",
                    ctx.script_name, dp.line, dp.name
                ));
                continue;
            }
        };
        if let Some((pfs, line)) = &cache {
            rep.phase(
                "drain",
                format!("{} to {}: {line}", dp.name, pfs.display()),
                t,
                true,
            );
        }
        let r = c
            .destroy_instance(api::DestroyInstanceRequest {
                id: 0,
                persistent_name: dp.name.clone(),
                hurry: dp.hurry,
            })
            .await;
        match r {
            Ok(_) => {
                rep.phase("destroy persistent", dp.name.clone(), t, true);
                if let Some((pfs, _)) = cache {
                    if let Err(e) = surge_stage::drain::clear_through(&pfs) {
                        eprintln!("surge run: {e}");
                    }
                }
            }
            Err(e) => {
                rep.phase("destroy persistent", dp.name.clone(), t, false);
                stage_out_failures.push(format!(
                    "{}:{}: #BB destroy_persistent name={}: {}",
                    ctx.script_name,
                    dp.line,
                    dp.name,
                    e.message()
                ));
            }
        }
    }

    let code = match (job_status, interrupted(ctx.sig)) {
        (_, true) => 128 + ctx.sig.signal.load(Ordering::SeqCst),
        (Some(s), _) if s != 0 => s,
        _ if !stage_out_failures.is_empty() => 1,
        _ => 0,
    };
    Ok(Outcome {
        code,
        job_status,
        session: Some(session.id),
        kept_instance,
        stage_out_failures,
        targets: targets_json,
    })
}

/// Fills cache instance `client` (named `what` in the report) lazily from `pfs` (made if
/// missing), then empties its journal: what the fill wrote is on the PFS already.
async fn fill_cache(
    ctx: &Ctx<'_>,
    rep: &mut Reporter,
    client: &InstanceClient,
    pfs: &Path,
    what: &str,
) -> anyhow::Result<()> {
    let t = Instant::now();
    std::fs::create_dir_all(pfs).with_context(|| {
        format!(
            "{}: type=cache pfs={}: cannot create the directory",
            ctx.script_name,
            pfs.display()
        )
    })?;
    // What a job killed before its drain ended left (extra links, see THROUGH_DIR).
    surge_stage::drain::clear_through(pfs)?;
    let filled = surge_stage::fill::fill_lazy(client, pfs, || interrupted(ctx.sig)).await;
    let detail = match &filled {
        Ok(f) => format!(
            "{what} from {}: {} files ({}) read from the PFS until copied into the tier on \
             first read, {} copied now ({}), {} directories",
            pfs.display(),
            f.lazy_files,
            format_bytes(f.lazy_bytes),
            f.copied_files,
            format_bytes(f.copied_bytes),
            f.dirs
        ),
        Err(e) => format!("{what} from {}: {e}", pfs.display()),
    };
    rep.phase("fill", detail, t, filled.is_ok());
    if let Err(e) = filled {
        anyhow::bail!("filling the cache from {} failed: {e}", pfs.display());
    }
    client
        .drain_ack(u64::MAX, Vec::new())
        .await
        .context("cannot clear the cache's journal after the fill")?;
    Ok(())
}

/// A client of instance `id` (or, with `id` 0, of persistent instance `name`) acting for this
/// user (the manager's capability).
async fn persistent_client_by(
    c: &mut surge_api::Client,
    id: u64,
    name: &str,
) -> anyhow::Result<InstanceClient> {
    let cap = c
        .get_capability(api::GetCapabilityRequest {
            instance: id,
            persistent_name: name.to_string(),
            namespace: 0,
            all_namespaces: true,
        })
        .await
        .map_err(status_err)?
        .into_inner();
    let desc: InstanceDescriptor = serde_json::from_str(&cap.descriptor_json)
        .context("the manager sent an instance descriptor that does not parse")?;
    Ok(InstanceClient::new(
        desc,
        NamespaceId(0),
        surge_auth::Token::from_text(&cap.token)?,
    )?)
}

/// Drains persistent instance `name` to its PFS directory if it is a cache (waiting for a
/// drain another job runs); its directory and what was drained, `None` for a scratch one.
async fn drain_persistent_cache(
    c: &mut surge_api::Client,
    name: &str,
) -> anyhow::Result<Option<(PathBuf, String)>> {
    let client = persistent_client_by(c, 0, name).await?;
    let Some(pfs) = client.desc.cache_pfs.clone().map(PathBuf::from) else {
        return Ok(None);
    };
    let state = Arc::new(surge_stage::drain::DrainState::default());
    let task = tokio::spawn(surge_stage::drain::drain_loop(
        Arc::new(client),
        pfs.clone(),
        state.clone(),
        Arc::new(AtomicBool::new(true)),
        Duration::from_millis(100),
    ));
    finish_drain(&state, task)
        .await
        .map_err(|why| anyhow::anyhow!("the drain to {}: {why}", pfs.display()))?;
    let st = &state.stats;
    let line = format!(
        "{} changes, {} files, {}",
        st.entries.load(Ordering::Relaxed),
        st.files.load(Ordering::Relaxed),
        format_bytes(st.bytes.load(Ordering::Relaxed))
    );
    Ok(Some((pfs, line)))
}

/// Waits for a drain told to stop to end; gives it up (the reason) when the journal has not
/// moved for [`DRAIN_STALL`].
async fn finish_drain(
    state: &surge_stage::drain::DrainState,
    task: tokio::task::JoinHandle<()>,
) -> Result<(), String> {
    let every = Duration::from_millis(50);
    surge_stage::drain::watch(state, &task, DRAIN_STALL, every, || true, || {}).await
}

/// The stage tasks the job itself started (`surge stage`, libdatawarp) and left: pending ones
/// are waited for and deferred stage-outs (DW_STAGE_AT_JOB_END) run now, before anything is
/// released. Returns what failed among them.
async fn finish_job_stages(
    ctx: &Ctx<'_>,
    rep: &mut Reporter,
    c: &mut surge_api::Client,
    session: u64,
) -> anyhow::Result<Vec<String>> {
    let tasks = c
        .list_stages(api::ListStagesRequest { session })
        .await
        .map_err(status_err)?
        .into_inner()
        .tasks;
    let mut failures = Vec::new();
    for t in tasks {
        let deferred = match t.state.as_str() {
            "deferred" => true,
            "queued" | "running" => false,
            _ => continue,
        };
        let start = Instant::now();
        let t = if deferred {
            c.activate_stage(api::GetStageRequest { id: t.id })
                .await
                .map_err(status_err)?
                .into_inner()
        } else {
            t
        };
        let label = format!("stage {} (task {})", t.direction, t.id);
        let done = wait_stage(c, t, &label, ctx.args.quiet, || false).await?;
        let ok = done.state == "done";
        rep.phase(
            if deferred {
                "stage at job end"
            } else {
                "job's stage"
            },
            format!(
                "task {} {}: {} files, {}{}",
                done.id,
                done.direction,
                done.files_done,
                format_bytes(done.bytes_done),
                rate(done.bytes_done, done.seconds)
            ),
            start,
            ok,
        );
        if !ok && done.direction == "out" {
            failures.push(format!(
                "stage task {} (started by the job): {}",
                done.id,
                crate::job_stage::failure_message(&done)
            ));
            failures.extend(failure_lines(&done.failures_json));
        }
    }
    Ok(failures)
}

/// Removes what `surge run`s killed before their cleanup left under `runs`
/// (`session-<id>-<pid>` of a pid that is gone): their mounts, dead since their FUSE daemon
/// died ("transport endpoint is not connected"), are detached first.
/// The job's private run directory, `$TMPDIR/surge-<user>/session-<id>-<pid>`: the job's PATH
/// starts with its `bin/`, so nobody else may be able to write in it or in its parent. A
/// `surge-<user>` another user made first (or a link of that name) is not used: the run goes
/// to a fresh directory beside it, and says so (issue 31).
fn make_run_dir(session: u64) -> anyhow::Result<PathBuf> {
    use surge_core::private_dir;
    let runs = std::env::temp_dir().join(format!("surge-{}", user_name()));
    let runs = match private_dir::ensure_all(&runs) {
        Ok(()) => {
            clean_stale_runs(&runs);
            runs
        }
        Err(e) if e.is_squatted() => {
            let fresh = private_dir::fresh(&runs)?;
            eprintln!(
                "surge run: warning: not using {}: {e}; using {}",
                runs.display(),
                fresh.display()
            );
            fresh
        }
        Err(e) => return Err(e.into()),
    };
    let run_dir = runs.join(format!("session-{session}-{}", std::process::id()));
    // A directory left by an earlier process of the same pid is ours (the parent is private).
    if std::fs::symlink_metadata(&run_dir).is_ok() {
        std::fs::remove_dir_all(&run_dir)
            .with_context(|| format!("cannot remove the stale {}", run_dir.display()))?;
    }
    private_dir::ensure(&run_dir)?;
    Ok(run_dir)
}

fn clean_stale_runs(runs: &Path) {
    let Ok(rd) = std::fs::read_dir(runs) else {
        return;
    };
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(pid) = name
            .strip_prefix("session-")
            .and_then(|r| r.rsplit('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: kill with signal 0 only checks that the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if !gone {
            continue;
        }
        let dir = e.path();
        let mut mounts: Vec<&str> = mountinfo
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|mp| Path::new(mp).starts_with(&dir))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for mp in mounts {
            if mount::is_root() {
                if let Ok(c) = std::ffi::CString::new(mp) {
                    // SAFETY: c is a valid NUL-terminated path.
                    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
                }
            } else {
                let _ = std::process::Command::new("fusermount3")
                    .args(["-u", "-z", mp])
                    .status();
            }
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => eprintln!(
                "surge run: removed {} left by a surge run (pid {pid}) that was killed",
                dir.display()
            ),
            Err(e) => eprintln!("surge run: cannot remove {}: {e}", dir.display()),
        }
    }
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

fn rate(bytes: u64, seconds: f64) -> String {
    if seconds > 0.0 && bytes > 0 {
        format!(" ({:.0} MiB/s)", bytes as f64 / 1048576.0 / seconds)
    } else {
        String::new()
    }
}

fn failure_lines(json: &str) -> Vec<String> {
    let v: Vec<serde_json::Value> = serde_json::from_str(json).unwrap_or_default();
    v.iter()
        .map(|f| {
            format!(
                "{} -> {}: {}",
                f["path"].as_str().unwrap_or("?"),
                f["destination"].as_str().unwrap_or("?"),
                f["error"].as_str().unwrap_or("?")
            )
        })
        .collect()
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
        .current_dir(ctx.cwd)
        .envs(env)
        .process_group(0);
    child_setup(&mut cmd, false);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {} with {prog}", script.display()))?;
    ctx.sig.job_pgid.store(child.id() as i32, Ordering::SeqCst);
    if interrupted(ctx.sig) {
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
