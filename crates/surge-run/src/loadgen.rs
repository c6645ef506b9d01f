//! `surge bench control-plane`: the control plane under a cluster's load (issue 30). It starts
//! the embedded manager and servers (or uses a running manager), connects N emulated agents
//! (each a real `AgentSync` long poll on its own connection, reporting back what it is asked
//! to mount, without FUSE: the manager's side is what is measured), can preload the state with
//! a history of ended sessions and stage tasks, then drives C concurrent jobs through every
//! phase the way Slurm's hooks do (setup, paths, pre_run with mounts on their hosts, post_run,
//! teardown), and prints per-phase p50/p99, jobs per hour, the manager's CPU per job and idle,
//! its RSS, and how long listings take.

use anyhow::Context;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use surge_api::v1 as api;
use surge_core::backoff::Backoff;

/// Drive a manager as a cluster would and measure it.
///
/// Examples:
///   surge bench control-plane --agents 1000 --jobs 500 --concurrency 50
///   surge bench control-plane --agents 10000 --jobs 0 --idle 20       # idle cost only
///   surge bench control-plane --history 1000000 --jobs 200            # with a long history
///   surge bench control-plane --agents 1000 --concurrency 50 --run-seconds 3 --jobs 3000
///                                               # 50 jobs running at once, phases as they end
///   surge bench control-plane --manager a:7070,b:7070 --duration 600 --run-seconds 3
///                                               # managers on etcd (bench/control_plane_ha.sh)
#[derive(clap::Args, Debug, Clone)]
#[command(verbatim_doc_comment)]
pub struct LoadArgs {
    /// Use this running manager (gRPC address) instead of starting the embedded one; give its
    /// pid with --manager-pid to measure its CPU.
    #[arg(long)]
    pub manager: Option<String>,
    #[arg(long)]
    pub manager_pid: Option<u32>,
    /// Servers of the embedded manager.
    #[arg(long, default_value_t = 4)]
    pub servers: usize,
    /// Emulated compute-node agents (hosts node-00000, node-00001, ...).
    #[arg(long, default_value_t = 100)]
    pub agents: usize,
    /// Jobs driven through every phase.
    #[arg(long, default_value_t = 200)]
    pub jobs: usize,
    /// Jobs in flight at once.
    #[arg(long, default_value_t = 20)]
    pub concurrency: usize,
    /// Compute nodes (hosts) per job.
    #[arg(long, default_value_t = 2)]
    pub nodes: usize,
    /// Ended sessions (each with a stage task) written into the embedded manager's state
    /// before it starts.
    #[arg(long, default_value_t = 0)]
    pub history: u64,
    /// Seconds the manager's idle CPU is measured with the agents connected.
    #[arg(long, default_value_t = 10.0)]
    pub idle: f64,
    /// Seconds each agent's long poll waits when nothing changes.
    #[arg(long, default_value_t = 30.0)]
    pub agent_wait: f64,
    /// Seconds each job runs between pre_run and post_run (its compute). 0 drives the phases
    /// back to back: the control plane saturated; a few seconds is a cluster where
    /// --concurrency jobs are running at once and phases arrive as they end.
    #[arg(long, default_value_t = 0.0)]
    pub run_seconds: f64,
    /// Keep starting jobs for this many seconds (--jobs is then the most started); 0: run
    /// --jobs jobs.
    #[arg(long, default_value_t = 0.0)]
    pub duration: f64,
    /// Stop one of the embedded servers (SIGSTOP, continued at the end) this many seconds into
    /// the jobs, and report when the manager marked it down and the setups of the jobs that
    /// came after.
    #[arg(long)]
    pub stop_server_at: Option<f64>,
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
}

/// One job's phase durations, in seconds, and what it saw.
#[derive(Default, Clone)]
struct JobTimes {
    setup: f64,
    paths: f64,
    pre_run: f64,
    post_run: f64,
    teardown: f64,
    /// Phases run again because the manager went away (a failover).
    retries: u32,
    /// The job instance it ran with.
    instance: u64,
    /// It passed pre_run without an active session holding a job instance.
    without_instance: bool,
}

const PHASES: [&str; 5] = ["setup", "paths", "pre_run", "post_run", "teardown"];

impl JobTimes {
    fn get(&self, phase: &str) -> f64 {
        match phase {
            "setup" => self.setup,
            "paths" => self.paths,
            "pre_run" => self.pre_run,
            "post_run" => self.post_run,
            _ => self.teardown,
        }
    }
}

/// The manager's CPU seconds so far (user + system), from /proc.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks / hz.max(1.0))
}

fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn status(e: tonic::Status) -> anyhow::Error {
    surge_manager::cli::status_err(e)
}

/// One emulated agent: syncs, "mounts" what it is asked (reports it back at once), and waits.
async fn agent(
    addr: String,
    munge: std::path::PathBuf,
    host: String,
    wait: Duration,
    stop: Arc<AtomicBool>,
) {
    let mut conn: Option<surge_api::Client> = None;
    let mut have: Vec<api::AgentMount> = Vec::new();
    let mut report_now = true;
    while !stop.load(Ordering::Relaxed) {
        let mut c = match conn.take() {
            Some(c) => c,
            None => match surge_api::connect_with(&addr, munge.clone()).await {
                Ok(c) => c,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            },
        };
        let r = c
            .agent_sync(api::AgentSyncRequest {
                host: host.clone(),
                mounts: have.clone(),
                failed: Vec::new(),
                wait_ms: if report_now {
                    0
                } else {
                    wait.as_millis() as u32
                },
            })
            .await;
        match r {
            Ok(reply) => {
                let want = reply.into_inner().mounts;
                report_now = !surge_manager::agents::same_mounts(&have, &want);
                have = want;
                conn = Some(c);
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// A connection to the manager(s) that a phase can drop and make again: each phase is run
/// again, on a new connection to whichever manager leads, when the manager went away (as
/// `surge bb` does for Slurm), for as long as a failover takes.
struct Phases<'a> {
    addr: &'a str,
    munge: &'a std::path::Path,
    conn: Option<surge_api::Client>,
    retries: u32,
}

impl<'a> Phases<'a> {
    fn new(addr: &'a str, munge: &'a std::path::Path) -> Phases<'a> {
        Phases {
            addr,
            munge,
            conn: None,
            retries: 0,
        }
    }

    async fn run<T, F, Fut>(&mut self, mut f: F) -> anyhow::Result<T>
    where
        F: FnMut(surge_api::Client) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<T>>,
    {
        let mut pauses = failover_pauses();
        loop {
            let c = match self.conn.take() {
                Some(c) => c,
                None => match surge_api::connect_with(self.addr, self.munge.to_path_buf()).await {
                    Ok(c) => c,
                    Err(e) => {
                        let Some(pause) = pauses.next() else {
                            return Err(e.into());
                        };
                        self.retries += 1;
                        tokio::time::sleep(pause).await;
                        continue;
                    }
                },
            };
            match f(c.clone()).await {
                Ok(v) => {
                    self.conn = Some(c);
                    return Ok(v);
                }
                Err(e) if surge_api::manager_gone(e.as_ref()) => {
                    let Some(pause) = pauses.next() else {
                        return Err(e);
                    };
                    self.retries += 1;
                    tokio::time::sleep(pause).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// The Slurm-style job id of job `n` of this load generator.
fn external_id(n: usize) -> String {
    format!("loadgen:{}-{n}", std::process::id())
}

fn gone(e: tonic::Status) -> anyhow::Error {
    anyhow::Error::new(surge_api::ManagerStatus(e))
}

/// One job through every phase, as `surge bb` would drive it: each phase idempotent, run again
/// against the next leader when the manager goes away.
async fn job(
    addr: &str,
    munge: &std::path::Path,
    n: usize,
    hosts: Vec<String>,
    granularity: u64,
    run_for: Duration,
) -> anyhow::Result<JobTimes> {
    let mut t = JobTimes::default();
    let ext = external_id(n);
    let mut p = Phases::new(addr, munge);
    let t0 = Instant::now();
    let s = p
        .run(|mut m| {
            let ext = ext.clone();
            let nodes = hosts.len() as u32;
            async move {
                // A setup run again finds the session the first made (as `surge bb setup`).
                let found = match m
                    .find_session(api::FindSessionRequest {
                        external_id: ext.clone(),
                    })
                    .await
                {
                    Ok(s) => Some(s.into_inner()).filter(|s| s.is_active()),
                    Err(e) if e.code() == tonic::Code::NotFound => None,
                    Err(e) => return Err(gone(e)),
                };
                let s = match found {
                    Some(s) => s,
                    None => m
                        .create_session(api::CreateSessionRequest {
                            job: format!("job-{n}.sh"),
                            job_instance: Some(api::CreateInstanceRequest {
                                capacity: granularity,
                                access_mode: "striped".into(),
                                nodes,
                                ..Default::default()
                            }),
                            external_id: ext,
                            ..Default::default()
                        })
                        .await
                        .map_err(gone)?
                        .into_inner(),
                };
                m.set_session_phase(api::SetSessionPhaseRequest {
                    id: s.id,
                    phase: "setup".into(),
                    hosts: vec![],
                    mount: false,
                })
                .await
                .map_err(gone)?;
                Ok(s)
            }
        })
        .await?;
    t.setup = t0.elapsed().as_secs_f64();

    let t0 = Instant::now();
    let found = p
        .run(|mut m| {
            let ext = ext.clone();
            async move {
                Ok(m.find_session(api::FindSessionRequest { external_id: ext })
                    .await
                    .map_err(gone)?
                    .into_inner())
            }
        })
        .await?;
    t.paths = t0.elapsed().as_secs_f64();

    let wait_for = |mounted: bool| api::WaitMountsRequest {
        session: s.id,
        mounted,
        wait_ms: 30_000,
    };
    let t0 = Instant::now();
    let agents = p
        .run(|mut m| {
            let hosts = hosts.clone();
            async move {
                m.set_session_phase(api::SetSessionPhaseRequest {
                    id: s.id,
                    phase: "pre_run".into(),
                    hosts,
                    mount: true,
                })
                .await
                .map_err(gone)?;
                Ok(m.wait_mounts(wait_for(true))
                    .await
                    .map_err(gone)?
                    .into_inner())
            }
        })
        .await?;
    let mounted = agents
        .agents
        .iter()
        .all(|a| a.mounts.iter().any(|x| x.session == s.id));
    anyhow::ensure!(
        mounted,
        "session {}: not mounted on {hosts:?} in 30 s",
        s.id
    );
    t.pre_run = t0.elapsed().as_secs_f64();
    // What the job would run with: its session active and holding its job instance.
    t.instance = found.job_instance;
    t.without_instance = !found.is_active()
        || found.job_instance == 0
        || !found.instances.iter().any(|i| i.id == found.job_instance);

    tokio::time::sleep(run_for).await;

    let t0 = Instant::now();
    p.run(|mut m| async move {
        m.set_session_phase(api::SetSessionPhaseRequest {
            id: s.id,
            phase: "post_run".into(),
            hosts: vec![],
            mount: false,
        })
        .await
        .map_err(gone)?;
        m.wait_mounts(wait_for(false)).await.map_err(gone)?;
        Ok(())
    })
    .await?;
    t.post_run = t0.elapsed().as_secs_f64();

    let t0 = Instant::now();
    p.run(|mut m| async move {
        match m
            .end_session(api::EndSessionRequest {
                id: s.id,
                keep_job_instance: false,
                state: String::new(),
            })
            .await
        {
            Ok(_) => Ok(()),
            // Ended by the first try, before the manager that ended it went away.
            Err(e) if e.code() == tonic::Code::FailedPrecondition => Ok(()),
            Err(e) => Err(gone(e)),
        }
    })
    .await?;
    t.teardown = t0.elapsed().as_secs_f64();
    t.retries = p.retries;
    Ok(t)
}

pub fn run(args: LoadArgs) -> anyhow::Result<std::process::ExitCode> {
    surge_core::sys::raise_nofile_limit().ok();
    let scratch = tempfile::tempdir_in(if std::path::Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    })
    .context("cannot make a scratch directory")?;
    // The embedded manager and servers, over a state preloaded with the history.
    let mut embedded = None;
    let mut stoppable = None;
    let (addr, pid, munge, granularity) = match &args.manager {
        Some(a) => (
            a.clone(),
            args.manager_pid,
            surge_api::munge_socket(),
            64u64 << 20,
        ),
        None => {
            let opts = crate::embedded::EmbeddedOptions {
                fast_dir: scratch.path().join("fast"),
                state_dir: scratch.path().join("state"),
                servers: args.servers,
                server_capacity: Some(1 << 40),
                granularity: 64 << 20,
            };
            if args.history > 0 {
                surge_core::private_dir::ensure_all(&opts.state_dir)?;
                let t = Instant::now();
                let db =
                    surge_manager::store::sqlite::Db::open(&opts.state_dir.join("manager.db"))?;
                db.preload_history(args.history)?;
                eprintln!(
                    "history: {} ended sessions and stage tasks written in {:.1} s",
                    args.history,
                    t.elapsed().as_secs_f64()
                );
            }
            // The agents all connect from this host: the manager's per-address cap (4096 by
            // default, there against one host's flood) must let them in.
            const CAP: &str = "SURGE_MANAGER_MAX_PER_ADDRESS";
            if std::env::var_os(CAP).is_none() {
                // Set before any thread of this process starts (the runtime is made later).
                std::env::set_var(CAP, (args.agents * 2 + 1000).to_string());
            }
            let exe = std::env::current_exe().context("where is this surge")?;
            let e = crate::embedded::Embedded::start(&opts, &exe)?;
            let ready: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
                opts.fast_dir.join("run/manager.ready"),
            )?)?;
            let pid = ready["pid"].as_u64().map(|p| p as u32);
            let out = (
                e.manager.clone(),
                pid,
                e.munge_socket.clone(),
                opts.granularity,
            );
            stoppable = e.server_pids().last().copied();
            embedded = Some(e);
            out
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    anyhow::ensure!(
        args.stop_server_at.is_none() || stoppable.is_some(),
        "--stop-server-at needs the embedded servers (not --manager)"
    );
    let report = rt.block_on(drive(&args, &addr, pid, &munge, granularity, stoppable))?;
    if let Some(p) = stoppable {
        // SAFETY: our own child; a stopped server is continued before it is stopped for good.
        unsafe { libc::kill(p as i32, libc::SIGCONT) };
    }
    if let Some(e) = embedded {
        e.stop();
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(std::process::ExitCode::SUCCESS)
}

async fn drive(
    args: &LoadArgs,
    addr: &str,
    pid: Option<u32>,
    munge: &std::path::Path,
    granularity: u64,
    stoppable: Option<u32>,
) -> anyhow::Result<serde_json::Value> {
    let stop = Arc::new(AtomicBool::new(false));
    let hosts: Vec<String> = (0..args.agents).map(|i| format!("node-{i:05}")).collect();
    let wait = Duration::from_secs_f64(args.agent_wait.max(0.1));
    let t = Instant::now();
    let mut agents = Vec::new();
    for h in &hosts {
        agents.push(tokio::spawn(agent(
            addr.to_string(),
            munge.to_path_buf(),
            h.clone(),
            wait,
            stop.clone(),
        )));
    }
    // Every agent has reported once.
    let mut m = surge_api::connect_with(addr, munge.to_path_buf()).await?;
    loop {
        // While thousands of agents connect at once munged may refuse a credential: ask again.
        let n = match m.list_agents(api::Empty {}).await {
            Ok(r) => r
                .into_inner()
                .agents
                .iter()
                .filter(|a| a.alive && hosts.binary_search(&a.host).is_ok())
                .count(),
            Err(e) if t.elapsed() < Duration::from_secs(300) => {
                tracing::debug!("list agents: {e}");
                0
            }
            Err(e) => return Err(status(e)),
        };
        if n >= hosts.len() {
            break;
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(300),
            "only {n} of {} agents connected in 300 s",
            hosts.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let connected = t.elapsed().as_secs_f64();
    // Idle: the agents' long polls only.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let c0 = pid.and_then(cpu_seconds);
    tokio::time::sleep(Duration::from_secs_f64(args.idle)).await;
    let idle_cpu = match (c0, pid.and_then(cpu_seconds)) {
        (Some(a), Some(b)) => Some((b - a) / args.idle),
        _ => None,
    };

    // What the pools hold free before the jobs: all of it comes back after the last teardown.
    let free_before = pools_free(&mut m).await?;

    // Jobs.
    let sem = Arc::new(tokio::sync::Semaphore::new(args.concurrency.max(1)));
    let c0 = pid.and_then(cpu_seconds);
    let t0 = Instant::now();
    let run_for = Duration::from_secs_f64(args.run_seconds.max(0.0));
    // A server stopped (SIGSTOP) in the middle: when the manager says it is down.
    let stopped = match (args.stop_server_at, stoppable) {
        (Some(at), Some(spid)) => {
            let (addr, munge) = (addr.to_string(), munge.to_path_buf());
            Some(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs_f64(at)).await;
                // SAFETY: signalling our own child.
                unsafe { libc::kill(spid as i32, libc::SIGSTOP) };
                let stopped = Instant::now();
                let mut c = surge_api::connect_with(&addr, munge).await.ok()?;
                // Every other server answers: the first one down is the stopped one.
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let servers = c.list_servers(api::Empty {}).await.ok()?.into_inner();
                    if servers.servers.iter().any(|s| s.state == "down") {
                        return Some(stopped.elapsed().as_secs_f64());
                    }
                    if stopped.elapsed() > Duration::from_secs(300) {
                        return None;
                    }
                }
            }))
        }
        _ => None,
    };
    let mut handles = Vec::new();
    for n in 0..args.jobs {
        if args.duration > 0.0 && t0.elapsed().as_secs_f64() >= args.duration {
            break;
        }
        // With a run time, the first --concurrency jobs arrive spread over it (as jobs do on a
        // running cluster), not all in the same instant; later ones start as others end.
        if args.run_seconds > 0.0 && n < args.concurrency {
            let at = args.run_seconds * n as f64 / args.concurrency.max(1) as f64;
            tokio::time::sleep_until((t0 + Duration::from_secs_f64(at)).into()).await;
        }
        let permit = sem.clone().acquire_owned().await?;
        let job_hosts: Vec<String> = (0..args.nodes.min(hosts.len()).max(1))
            .map(|k| hosts[(n * args.nodes + k) % hosts.len().max(1)].clone())
            .collect();
        let addr = addr.to_string();
        let munge = munge.to_path_buf();
        let started = t0.elapsed().as_secs_f64();
        handles.push(tokio::spawn(async move {
            let r = job(&addr, &munge, n, job_hosts, granularity, run_for).await;
            if r.is_err() {
                // Slurm runs teardown after a failed job too: its session ends and the
                // space comes back.
                teardown_failed(&addr, &munge, n).await;
            }
            drop(permit);
            (started, r)
        }));
    }
    let stopped_down_after = match stopped {
        Some(h) => h.await.ok().flatten(),
        None => None,
    };
    let mut times = Vec::new();
    let mut failures = Vec::new();
    for h in handles {
        match h.await? {
            (at, Ok(t)) => times.push((at, t)),
            (at, Err(e)) => failures.push(format!("job started at {at:.1} s: {e:#}")),
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu_jobs = match (c0, pid.and_then(cpu_seconds)) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    // An instance given to two jobs, a job past pre_run without its instance, space not
    // given back.
    let mut ids: Vec<u64> = times.iter().map(|(_, t)| t.instance).collect();
    ids.sort_unstable();
    let given_twice = ids.windows(2).filter(|w| w[0] == w[1]).count();
    let without_instance = times.iter().filter(|(_, t)| t.without_instance).count();
    let retried = times.iter().filter(|(_, t)| t.retries > 0).count();
    // The manager that answers now may be a new leader.
    let mut m = connect_again(addr, munge).await?;
    // An instance whose destroy a dying leader cut is collected by the next one's orphan
    // collection (every --gc-interval): wait for it, a minute at most.
    let mut free_after = pools_free(&mut m).await?;
    let waited = Instant::now();
    while free_after < free_before && waited.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        m = connect_again(addr, munge).await?;
        free_after = pools_free(&mut m).await?;
    }
    let free_wait = waited.elapsed().as_secs_f64();
    // Setups of the jobs started before the stop and after it.
    let stop_view = args.stop_server_at.map(|at| {
        let pick = |after: bool| {
            let mut v: Vec<f64> = times
                .iter()
                .filter(|(s, _)| (*s >= at) == after)
                .map(|(_, t)| t.setup)
                .collect();
            serde_json::json!({
                "jobs": v.len(),
                "setup_p50_ms": percentile(&mut v, 0.5) * 1000.0,
                "setup_p99_ms": percentile(&mut v, 0.99) * 1000.0,
            })
        };
        serde_json::json!({
            "at_s": at,
            "marked_down_after_s": stopped_down_after,
            "before": pick(false),
            "after": pick(true),
        })
    });
    let times: Vec<JobTimes> = times.into_iter().map(|(_, t)| t).collect();

    // Listings, as an admin and a dashboard would ask them.
    let mut listings = serde_json::Map::new();
    let t1 = Instant::now();
    m.list_sessions_page(api::ListSessionsRequest {
        before: 0,
        limit: 500,
        open_only: false,
    })
    .await
    .map_err(status)?;
    listings.insert("sessions_page".into(), t1.elapsed().as_secs_f64().into());
    let t1 = Instant::now();
    m.list_sessions(api::Empty {}).await.map_err(status)?;
    listings.insert("sessions".into(), t1.elapsed().as_secs_f64().into());
    let t1 = Instant::now();
    m.list_stages_page(api::ListStagesPageRequest {
        session: 0,
        before: 0,
        limit: 500,
    })
    .await
    .map_err(status)?;
    listings.insert("stages_page".into(), t1.elapsed().as_secs_f64().into());
    let t1 = Instant::now();
    m.list_instances(api::Empty {}).await.map_err(status)?;
    listings.insert("instances".into(), t1.elapsed().as_secs_f64().into());
    let rss = pid.and_then(rss_mib);

    stop.store(true, Ordering::Relaxed);
    for a in agents {
        a.abort();
    }
    let mut phases = serde_json::Map::new();
    for p in PHASES {
        let mut v: Vec<f64> = times.iter().map(|t| t.get(p)).collect();
        phases.insert(
            p.into(),
            serde_json::json!({
                "p50_ms": percentile(&mut v, 0.5) * 1000.0,
                "p99_ms": percentile(&mut v, 0.99) * 1000.0,
                "max_ms": percentile(&mut v, 1.0) * 1000.0,
            }),
        );
    }
    Ok(serde_json::json!({
        "agents": args.agents,
        "agents_connected_s": connected,
        "jobs": times.len() + failures.len(),
        "jobs_ok": times.len(),
        "failures": failures.iter().take(10).collect::<Vec<_>>(),
        "failures_total": failures.len(),
        "concurrency": args.concurrency,
        "nodes_per_job": args.nodes,
        "history": args.history,
        "run_seconds": args.run_seconds,
        "wall_s": wall,
        "jobs_retried_after_manager_loss": retried,
        "jobs_without_instance": without_instance,
        "instances_given_twice": given_twice,
        "pool_free_before": free_before,
        "pool_free_after": free_after,
        "pool_bytes_not_returned": free_before.saturating_sub(free_after),
        "pool_free_wait_s": free_wait,
        "stopped_server": stop_view,
        "jobs_per_hour": if wall > 0.0 { times.len() as f64 / wall * 3600.0 } else { 0.0 },
        "manager_cpu_per_job_ms": cpu_jobs.map(|c| c / times.len().max(1) as f64 * 1000.0),
        "manager_idle_cpu": idle_cpu,
        "manager_rss_mib": rss,
        "phases": phases,
        "listings_s": listings,
    }))
}

/// Ends the session of job `n` after it failed, as Slurm's teardown would (best effort).
async fn teardown_failed(addr: &str, munge: &std::path::Path, n: usize) {
    let ext = external_id(n);
    let mut p = Phases::new(addr, munge);
    let r = p
        .run(|mut m| {
            let ext = ext.clone();
            async move {
                let s = match m
                    .find_session(api::FindSessionRequest { external_id: ext })
                    .await
                {
                    Ok(s) => s.into_inner(),
                    Err(e) if e.code() == tonic::Code::NotFound => return Ok(()),
                    Err(e) => return Err(gone(e)),
                };
                m.end_session(api::EndSessionRequest {
                    id: s.id,
                    keep_job_instance: false,
                    state: surge_api::states::SessionState::Failed.to_string(),
                })
                .await
                .map_err(gone)?;
                Ok(())
            }
        })
        .await;
    if let Err(e) = r {
        tracing::warn!("job {n}: teardown after its failure: {e:#}");
    }
}

/// The free bytes of every pool, summed.
async fn pools_free(m: &mut surge_api::Client) -> anyhow::Result<u64> {
    Ok(m.list_pools(api::Empty {})
        .await
        .map_err(status)?
        .into_inner()
        .pools
        .iter()
        .map(|p| p.free)
        .sum())
}

/// How long the load generator keeps a job going while no manager answers: two failovers.
fn failover_pauses() -> Backoff {
    Backoff::new(surge_api::FAILOVER_WAIT * 2, Duration::from_millis(200))
}

/// A connection to whichever manager leads now (after a failover, for as long as one takes).
async fn connect_again(addr: &str, munge: &std::path::Path) -> anyhow::Result<surge_api::Client> {
    let mut pauses = failover_pauses();
    loop {
        let mut c = surge_api::connect_with(addr, munge.to_path_buf()).await?;
        match c.list_pools(api::Empty {}).await {
            Ok(_) => return Ok(c),
            Err(e) => match pauses.next() {
                Some(pause) => tokio::time::sleep(pause).await,
                None => return Err(status(e)),
            },
        }
    }
}

fn print_report(r: &serde_json::Value) {
    let f = |v: &serde_json::Value| v.as_f64().map_or("-".into(), |x| format!("{x:.1}"));
    println!(
        "control plane: {} agents ({} s to connect), {} of {} jobs ok ({} failed), {} at once, {} nodes each, \
         history {}",
        r["agents"],
        f(&r["agents_connected_s"]),
        r["jobs_ok"],
        r["jobs"],
        r["failures_total"],
        r["concurrency"],
        r["nodes_per_job"],
        r["history"]
    );
    println!(
        "{:<10} {:>9} {:>9} {:>9}",
        "phase", "p50 ms", "p99 ms", "max ms"
    );
    for p in PHASES {
        println!(
            "{:<10} {:>9} {:>9} {:>9}",
            p,
            f(&r["phases"][p]["p50_ms"]),
            f(&r["phases"][p]["p99_ms"]),
            f(&r["phases"][p]["max_ms"])
        );
    }
    println!(
        "jobs without their instance {}   instances given twice {}   pool bytes not returned {}   \
         jobs that ran a phase again after losing the manager {}",
        r["jobs_without_instance"],
        r["instances_given_twice"],
        r["pool_bytes_not_returned"],
        r["jobs_retried_after_manager_loss"]
    );
    println!(
        "jobs/hour {}   manager CPU per job {} ms   idle CPU {}% of a core   RSS {} MiB",
        f(&r["jobs_per_hour"]),
        f(&r["manager_cpu_per_job_ms"]),
        r["manager_idle_cpu"]
            .as_f64()
            .map_or("-".into(), |x| format!("{:.1}", x * 100.0)),
        f(&r["manager_rss_mib"])
    );
    if let Some(st) = r["stopped_server"].as_object() {
        println!(
            "server stopped at {} s: marked down {} s later; setup p50/p99 of jobs started \
             before {}/{} ms ({} jobs), after {}/{} ms ({} jobs)",
            f(&st["at_s"]),
            f(&st["marked_down_after_s"]),
            f(&st["before"]["setup_p50_ms"]),
            f(&st["before"]["setup_p99_ms"]),
            st["before"]["jobs"],
            f(&st["after"]["setup_p50_ms"]),
            f(&st["after"]["setup_p99_ms"]),
            st["after"]["jobs"]
        );
    }
    if let Some(l) = r["listings_s"].as_object() {
        let parts: Vec<String> = l
            .iter()
            .map(|(k, v)| {
                format!(
                    "{k} {} ms",
                    v.as_f64()
                        .map_or("-".into(), |x| format!("{:.1}", x * 1000.0))
                )
            })
            .collect();
        println!("listings: {}", parts.join(", "));
    }
    if let Some(fs) = r["failures"].as_array().filter(|a| !a.is_empty()) {
        println!("failures ({}):", r["failures_total"]);
        for f in fs {
            println!("  {}", f.as_str().unwrap_or_default());
        }
    }
}
