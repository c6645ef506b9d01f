//! The control plane's failure modes of issue 30, each driven the way a cluster meets it: a
//! setup retried by Slurm, a manager killed at each step of a setup (failpoints: the process
//! aborts there as `kill -9` would stop it), fragments nobody knows left on servers, and a
//! server that stops answering while other jobs allocate.

mod common;
use common::*;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

/// Where a test's manager keeps its state: the embedded default's SQLite, or a real etcd
/// (three members) that outlives the managers a test restarts.
enum Engine {
    Sqlite,
    Etcd(surge_testkit::etcd::Etcd),
}

impl Engine {
    fn etcd(tag: &str) -> Engine {
        Engine::Etcd(surge_testkit::etcd::Etcd::start(tag))
    }

    /// `Manager::start_env` on this engine.
    fn manager(&self, dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Manager {
        match self {
            Engine::Sqlite => Manager::start_env(dir, extra, env),
            Engine::Etcd(e) => {
                let endpoints = e.endpoints();
                let mut args = vec!["--etcd", &endpoints, "--etcd-prefix", "/surge-test/"];
                args.extend_from_slice(extra);
                Manager::start_env(dir, &args, env)
            }
        }
    }
}

/// A Cori-style job script asking for a 64 MiB striped job instance.
const SCRIPT: &str = "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=64MiB\n";

/// `surge bb PHASE --job-id JOB --script SCRIPT --manager M ARGS` (as Slurm's hooks call it).
fn bb(m: &str, phase: &str, job: &str, script: &Path, args: &[&str]) -> Output {
    surge_command()
        .args(["bb", phase, "--job-id", job, "--manager", m, "--script"])
        .arg(script)
        .args(args)
        .output()
        .expect("run surge bb")
}

fn setup(m: &str, job: &str, script: &Path) -> Output {
    bb(m, "setup", job, script, &["--uid", "0", "--gid", "0"])
}

/// Instances each server holds fragments of, from the servers themselves.
fn held(c: &Cluster) -> Vec<u64> {
    let mut ids = Vec::new();
    for s in &c.servers {
        let st: serde_json::Value =
            serde_json::from_str(&surge(&["server", "status", "--json", &s.addr])).unwrap();
        for f in st[0]["fragments"].as_array().into_iter().flatten() {
            ids.push(f["instance"].as_u64().expect("fragment instance"));
        }
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// `surge session ls --all --json`: every session the manager keeps, ended ones too.
fn all_sessions(manager: &str) -> serde_json::Value {
    serde_json::from_str(&surge(&[
        "session",
        "ls",
        "--all",
        "--json",
        "--manager",
        manager,
    ]))
    .expect("session ls --json")
}

/// The instance ids the manager lists.
fn listed(m: &Manager) -> Vec<u64> {
    let v: serde_json::Value =
        serde_json::from_str(&surge(&["instance", "ls", "--json", "--manager", &m.grpc])).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_u64().unwrap())
        .collect()
}

#[test]
fn a_retried_setup_gets_its_session_and_the_manager_keeps_serving() {
    retried_setup(&Engine::Sqlite);
}

#[test]
fn a_retried_setup_gets_its_session_on_etcd_too() {
    retried_setup(&Engine::etcd("cp-retry"));
}

fn retried_setup(engine: &Engine) {
    let dir = Scratch::new("cp-retry");
    let c = cluster(1, "1GiB");
    let m = engine.manager(dir.path(), &[], &[]);
    m.register(&c);
    let script = dir.path().join("job.sh");
    std::fs::write(&script, SCRIPT).unwrap();
    let o = setup(&m.grpc, "101", &script);
    assert!(o.status.success(), "{}", text(&o));
    // The retry (Slurm requeues, a setup retried after NoSpace): on the old manager this
    // took the store's lock twice and hung every RPC for good.
    let mut retry = surge_command()
        .args([
            "bb",
            "setup",
            "--job-id",
            "101",
            "--manager",
            &m.grpc,
            "--script",
        ])
        .arg(&script)
        .args(["--uid", "0", "--gid", "0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(st) = retry.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = retry.kill();
            panic!("the retried setup did not answer in 20 s: the manager is stuck");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    let mut out = String::new();
    std::io::Read::read_to_string(&mut retry.stdout.take().unwrap(), &mut out).unwrap();
    assert!(out.contains("already set up"), "{out}");
    // Every other RPC still answers.
    let sessions = surge(&["session", "ls", "--json", "--manager", &m.grpc]);
    assert!(sessions.contains("slurm:101"), "{sessions}");
    let o = bb(&m.grpc, "teardown", "101", &script, &[]);
    assert!(o.status.success(), "{}", text(&o));
    // A new setup for a job id whose session ended makes a new session.
    let o = setup(&m.grpc, "101", &script);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("already"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_manager_killed_at_any_step_of_a_setup_never_lets_a_job_run_without_its_instance() {
    killed_in_setup(&Engine::Sqlite);
}

#[test]
fn a_manager_on_etcd_killed_in_a_setup_never_lets_a_job_run_without_its_instance() {
    killed_in_setup(&Engine::etcd("cp-crash"));
}

fn killed_in_setup(engine: &Engine) {
    let dir = Scratch::new("cp-crash");
    let c = cluster(2, "1GiB");
    let script = dir.path().join("job.sh");
    std::fs::write(&script, SCRIPT).unwrap();
    let free0 = {
        let m = engine.manager(dir.path(), &[], &[]);
        m.register(&c);
        pool_free(&m)
    };
    for (n, point) in [
        "manager:session-row",
        "manager:instance-made",
        "manager:instance-linked",
    ]
    .iter()
    .enumerate()
    {
        let job = format!("20{n}");
        {
            let m = engine.manager(dir.path(), &[], &[("SURGE_FAILPOINTS", point)]);
            let o = setup(&m.grpc, &job, &script);
            assert!(
                !o.status.success(),
                "{point}: the setup succeeded though the manager died\n{}",
                text(&o)
            );
            let mut child = m.child;
            let st = child.0.wait().unwrap();
            assert!(!st.success(), "{point}: the manager did not die");
        }
        // Slurm retries the setup against the restarted manager (same state).
        let m = engine.manager(dir.path(), &[], &[]);
        let o = setup(&m.grpc, &job, &script);
        assert!(o.status.success(), "{point}: retried setup\n{}", text(&o));
        assert!(
            !String::from_utf8_lossy(&o.stdout).contains("already set up"),
            "{point}: the retry took the interrupted session as set up\n{}",
            text(&o)
        );
        let paths = dir.path().join(format!("paths-{job}"));
        let o = bb(
            &m.grpc,
            "paths",
            &job,
            &script,
            &["--path-file", paths.to_str().unwrap()],
        );
        assert!(o.status.success(), "{point}: paths\n{}", text(&o));
        let env = std::fs::read_to_string(&paths).unwrap();
        assert!(
            env.contains("DW_JOB_STRIPED="),
            "{point}: no instance path: {env}"
        );
        // What the interrupted setup made is destroyed on the servers, not just forgotten.
        wait_for(
            &format!("{point}: servers holding only the live instance"),
            Duration::from_secs(20),
            || (held(&c) == listed(&m)).then_some(()),
        );
        let o = bb(&m.grpc, "teardown", &job, &script, &[]);
        assert!(o.status.success(), "{point}: teardown\n{}", text(&o));
        assert!(
            held(&c).is_empty(),
            "{point}: fragments left: {:?}",
            held(&c)
        );
        assert_eq!(
            pool_free(&m),
            free0,
            "{point}: the pool did not get its space back"
        );
        eprintln!("{point}: the retried setup made a whole session; nothing left behind");
    }
}

/// The manager's servers with their states (`GET /v1/servers`, open to anyone).
fn servers_of(m: &Manager) -> serde_json::Value {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(&m.http).unwrap();
    write!(
        s,
        "GET /v1/servers HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    let body = r.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {r}"))
}

/// The default pool's free bytes as the manager counts them.
fn pool_free(m: &Manager) -> u64 {
    let v: serde_json::Value =
        serde_json::from_str(&surge(&["pool", "ls", "--json", "--manager", &m.grpc])).unwrap();
    v[0]["free"].as_u64().expect("free bytes")
}

#[test]
fn fragments_nobody_knows_are_removed_while_their_server_runs() {
    let dir = Scratch::new("cp-gc");
    let c = cluster(1, "1GiB");
    let m = Manager::start_with(dir.path(), &["--gc-interval", "0.5"]);
    m.register(&c);
    // Made behind the manager's back (what a crashed creation or a lost state leaves).
    let stray = c.create_instance("128MiB", "1MiB", &[]);
    assert_eq!(held(&c), vec![stray]);
    wait_for(
        "the stray fragments removed",
        Duration::from_secs(20),
        || held(&c).is_empty().then_some(()),
    );
    // The pass's summary ("... freed") is logged after the server has removed them.
    let said = || {
        let log = std::fs::read_to_string(dir.path().join("manager.log")).unwrap_or_default();
        (
            log.contains(&format!("unknown instance {stray}")) && log.contains("freed"),
            log,
        )
    };
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while !said().0 && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    let (ok, log) = said();
    assert!(ok, "the manager did not say what it removed:\n{log}");
    // The manager's own instances stay.
    let script = dir.path().join("job.sh");
    std::fs::write(&script, SCRIPT).unwrap();
    let o = setup(&m.grpc, "301", &script);
    assert!(o.status.success(), "{}", text(&o));
    holds_for(
        "the collector keeps the manager's own instance (three passes)",
        Duration::from_millis(1500),
        || {
            let (h, l) = (held(&c), listed(&m));
            check(h == l, || {
                format!("servers hold {h:?}, the manager lists {l:?}")
            })
        },
    );
}

#[test]
fn a_stopped_server_delays_no_other_allocation_and_is_marked_down_in_seconds() {
    let dir = Scratch::new("cp-stop");
    let mut c = cluster(2, "1GiB");
    let m = Manager::start(dir.path());
    m.register(&c);
    let servers = servers_of(&m);
    let id_of = |addr: &str| -> String {
        servers
            .as_array()
            .unwrap()
            .iter()
            .find(|s| {
                s["addrs"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(addr)))
            })
            .and_then(|s| s["id"].as_str())
            .unwrap_or_else(|| panic!("no server {addr} in {servers}"))
            .to_string()
    };
    let (hung, healthy) = (id_of(&c.servers[0].addr), id_of(&c.servers[1].addr));
    let pid = c.servers[0].child.as_ref().unwrap().id() as i32;
    // SAFETY: stopping a child of this test.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let stopped = Instant::now();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let grpc = m.grpc.clone();
    let on = |server: String| {
        let grpc = grpc.clone();
        async move {
            let t = Instant::now();
            let mut api =
                surge_api::connect_with(&grpc, surge_testkit::munge_socket().to_path_buf())
                    .await
                    .unwrap();
            let r = api
                .create_instance(surge_api::v1::CreateInstanceRequest {
                    capacity: 64 << 20,
                    access_mode: "striped".into(),
                    nodes: 1,
                    server,
                    ..Default::default()
                })
                .await;
            (r.is_ok(), t.elapsed())
        }
    };
    let is_down = || {
        servers_of(&m)
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["id"] == hung.as_str() && s["state"] == "down")
    };
    let (on_hung, on_healthy, down) = rt.block_on(async {
        let hung_alloc = tokio::spawn(on(hung.clone()));
        // The one on the stopped server asks first.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let healthy_alloc = tokio::spawn(on(healthy.clone()));
        let mut down = None;
        while down.is_none() && stopped.elapsed() < Duration::from_secs(30) {
            if is_down() {
                down = Some(stopped.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (
            hung_alloc.await.unwrap(),
            healthy_alloc.await.unwrap(),
            down,
        )
    });
    eprintln!(
        "healthy allocation {:?}; stopped server's {:?} (ok: {}); marked down after {down:?}",
        on_healthy.1, on_hung.1, on_hung.0
    );
    assert!(
        on_healthy.0 && on_healthy.1 < Duration::from_secs(5),
        "an allocation on a healthy server waited {:?} behind the stopped one",
        on_healthy.1
    );
    assert!(!on_hung.0, "an allocation on a stopped server succeeded");
    assert!(
        on_hung.1 < Duration::from_secs(40),
        "the allocation on the stopped server took {:?} to fail",
        on_hung.1
    );
    let down = down.expect("the stopped server was not marked down in 30 s");
    assert!(down < Duration::from_secs(10), "marked down after {down:?}");
    // SAFETY: resuming the child stopped above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    c.servers[0].kill9();
}

/// Ends a session made through the gRPC API, by id.
fn session_of_job(m: &Manager, job: &str) -> u64 {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut api = surge_api::connect_with(&m.grpc, surge_testkit::munge_socket().to_path_buf())
            .await
            .unwrap();
        let s = api
            .create_session(surge_api::v1::CreateSessionRequest {
                job: job.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        api.end_session(surge_api::v1::EndSessionRequest {
            id: s.id,
            ..Default::default()
        })
        .await
        .unwrap();
        s.id
    })
}

#[test]
fn the_history_is_listed_a_page_at_a_time_and_forgotten_after_its_retention() {
    let dir = Scratch::new("cp-history");
    let c = cluster(1, "1GiB");
    let m = Manager::start(dir.path());
    m.register(&c);
    let ids: Vec<u64> = (0..30)
        .map(|i| session_of_job(&m, &format!("old-{i}.sh")))
        .collect();
    // An open session is listed by default; the history only with --all, a page at a time.
    let script = dir.path().join("job.sh");
    std::fs::write(&script, SCRIPT).unwrap();
    let o = setup(&m.grpc, "401", &script);
    assert!(o.status.success(), "{}", text(&o));
    let open: serde_json::Value =
        serde_json::from_str(&surge(&["session", "ls", "--json", "--manager", &m.grpc])).unwrap();
    assert_eq!(open.as_array().unwrap().len(), 1, "{open}");
    let out = surge(&[
        "session",
        "ls",
        "--all",
        "--limit",
        "10",
        "--manager",
        &m.grpc,
    ]);
    let rows = out
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|w| w.parse::<u64>().is_ok())
        })
        .count();
    assert_eq!(rows, 10, "{out}");
    let hint = out
        .lines()
        .find_map(|l| l.strip_prefix("(older sessions: surge session ls --all --before "))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("no next page named:\n{out}"));
    // Walking every page sees each session once.
    let mut seen = Vec::new();
    let mut before = 0u64;
    loop {
        let page: serde_json::Value = serde_json::from_str(&surge(&[
            "session",
            "ls",
            "--all",
            "--json",
            "--limit",
            "7",
            "--before",
            &before.to_string(),
            "--manager",
            &m.grpc,
        ]))
        .unwrap();
        let page: Vec<u64> = page
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_u64().unwrap())
            .collect();
        if page.is_empty() {
            break;
        }
        before = *page.iter().min().unwrap();
        seen.extend(page);
    }
    seen.sort_unstable();
    let mut all = ids.clone();
    all.push(open[0]["id"].as_u64().unwrap());
    all.sort_unstable();
    assert_eq!(seen, all);
    assert!(hint.parse::<u64>().is_ok(), "{hint}");
    // A manager that keeps ended sessions 2 s forgets the 30 (and keeps the open one).
    std::thread::sleep(Duration::from_millis(2500));
    drop(m);
    let m = Manager::start_with(dir.path(), &["--retention-days", "0.00002"]);
    let log = || std::fs::read_to_string(dir.path().join("manager.log")).unwrap();
    wait_for("the retention's pass", Duration::from_secs(20), || {
        log()
            .contains("retention: forgot 30 session(s)")
            .then_some(())
    });
    let left = all_sessions(&m.grpc);
    assert_eq!(left.as_array().unwrap().len(), 1, "{left}");
}

/// `surge bench control-plane` (the load generator of the note's figures) as `make test` runs
/// it: small, against the embedded manager it starts; every job through every phase, the
/// counts that must be 0 are 0.
#[test]
fn the_load_generator_drives_every_phase_and_finds_nothing_lost() {
    let out = surge_command()
        .args(["bench", "control-plane", "--agents", "30", "--jobs", "40"])
        .args([
            "--concurrency",
            "6",
            "--servers",
            "2",
            "--idle",
            "1",
            "--json",
        ])
        .output()
        .expect("run surge bench control-plane");
    assert!(out.status.success(), "{}", text(&out));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&out)));
    assert_eq!(r["jobs_ok"], 40, "{r}");
    for k in [
        "failures_total",
        "jobs_without_instance",
        "instances_given_twice",
        "pool_bytes_not_returned",
    ] {
        assert_eq!(r[k], 0, "{k}: {r}");
    }
    for p in ["setup", "paths", "pre_run", "post_run", "teardown"] {
        assert!(
            r["phases"][p]["p50_ms"].as_f64().unwrap_or(0.0) > 0.0,
            "{p}: {r}"
        );
    }
    assert!(
        r["manager_cpu_per_job_ms"].as_f64().unwrap_or(0.0) > 0.0,
        "{r}"
    );
}

/// A stage task running when the manager is killed is not lost with it: the manager started
/// again runs it again under the same id (its worker died with the old one), and the phase
/// that asked for it, run again, waits for that task instead of failing.
#[test]
fn a_stage_task_cut_by_a_manager_crash_runs_again_at_restart() {
    let dir = Scratch::new("cp-resume");
    let c = cluster(2, "1GiB");
    let m = Manager::start_with(dir.path(), &["--stage-on", "local"]);
    m.register(&c);
    let input = dir.path().join("in");
    std::fs::create_dir_all(&input).unwrap();
    let n = 3000;
    for i in 0..n {
        std::fs::write(input.join(format!("f{i:05}")), [i as u8; 4096]).unwrap();
    }
    let script = dir.path().join("job.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=256MiB\n\
             #DW stage_in type=directory source={} destination=$DW_JOB_STRIPED/in\n",
            input.display()
        ),
    )
    .unwrap();
    let bb = |m: &str, phase: &str| {
        let mut c = surge_command();
        c.args(["bb", phase, "--job-id", "41", "--manager", m, "--script"])
            .arg(&script);
        if phase == "setup" {
            c.args(["--uid", "0", "--gid", "0"]);
        }
        c
    };
    let o = bb(&m.grpc, "setup").output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let mut first = ChildGuard(
        bb(&m.grpc, "data_in")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let log = dir.path().join("manager.log");
    wait_for("the stage worker to start", Duration::from_secs(30), || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("started here")
            .then_some(())
    });
    let mut m = m;
    m.child.0.kill().unwrap();
    let _ = m.child.0.wait();
    let _ = first.0.kill();
    std::fs::rename(&log, dir.path().join("manager-1.log")).unwrap();

    let m = Manager::start_with(dir.path(), &["--stage-on", "local"]);
    let o = bb(&m.grpc, "data_in").output().unwrap();
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(o.status.success(), "{}\n{log}", text(&o));
    assert!(
        log.contains("run again after the manager changed"),
        "the task was not resumed:\n{log}"
    );
    assert_eq!(
        log.matches("started here").count(),
        1,
        "one worker, for the resumed task; none for a second task:\n{log}"
    );
    let o = bb(&m.grpc, "teardown").output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
}

/// Issue 31 item 5: a manager that is away when `surge run` ends its job (restarted, or a
/// standby taking over) made the run fail and left the session active with its instance
/// allocated. `surge run` now says so and tries again until the manager answers: the run
/// succeeds and its session is ended.
#[test]
fn surge_run_ends_its_session_when_the_manager_comes_back_during_the_teardown() {
    let dir = Scratch::new("cp-endretry");
    let c = cluster(2, "1GiB");
    let grpc = format!("127.0.0.1:{}", surge_testkit::etcd::free_port());
    let args = ["--listen", grpc.as_str()];
    let m = Manager::start_with(dir.path(), &args);
    m.register(&c);
    let go = dir.path().join("go");
    let started = dir.path().join("started");
    let script = dir.path().join("job.sh");
    std::fs::write(
        &script,
        format!(
            "{SCRIPT}echo kept > $DW_JOB_STRIPED/out\ntouch {started}\n\
             while [ ! -e {go} ]; do sleep 0.1; done\n",
            go = go.display(),
            started = started.display()
        ),
    )
    .unwrap();
    let run_err = dir.path().join("run.err");
    let run = surge_command()
        .args(["run", "--manager", &grpc])
        .arg(&script)
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&run_err).unwrap())
        .spawn()
        .unwrap();
    let said = || std::fs::read_to_string(&run_err).unwrap_or_default();
    let log = dir.path().join("manager.log");
    // The job itself runs (its phases before it need the manager: they are not retried).
    wait_for("the job to run", Duration::from_secs(60), || {
        started.exists().then_some(())
    });
    // The manager goes away while the job runs, the job ends, the manager comes back.
    let mut m = m;
    m.child.0.kill().unwrap();
    let _ = m.child.0.wait();
    std::fs::write(&go, b"").unwrap();
    // `surge run` finds the manager away and says it will try again.
    wait_for(
        "surge run to report the retry",
        Duration::from_secs(60),
        || said().contains("trying again").then_some(()),
    );
    let m = Manager::start_with(dir.path(), &args);
    let o = run.wait_with_output().unwrap();
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        o.status.success(),
        "{}{}\nmanager:\n{log}",
        text(&o),
        said()
    );
    let ls = all_sessions(&m.grpc);
    let states: Vec<&str> = ls
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["state"].as_str())
        .collect();
    assert_eq!(states, ["ended"], "{ls}");
    assert!(
        held(&c).is_empty(),
        "an instance is left on the servers: {:?}",
        held(&c)
    );
}

/// Issue 32 item 5 for agents: a job that copied its mount into another mount namespace
/// (`unshare -m`: a container, a service with `PrivateTmp`) held the agent's unmount for as
/// long as that namespace lived, and with it every later mount and unmount on the host (one
/// loop serves them). The agent now aborts such a session after a short wait and says so;
/// post_run returns, and the next job on the host is mounted.
#[test]
fn a_copy_of_a_jobs_mount_in_another_namespace_does_not_hold_up_the_agent() {
    let name = "a_copy_of_a_jobs_mount_in_another_namespace_does_not_hold_up_the_agent";
    if skip_without_fuse(name) || skip_without_root(name) {
        return;
    }
    let dir = Scratch::new("cp-agent");
    let c = cluster(2, "1GiB");
    let m = Manager::start(dir.path());
    m.register(&c);
    let log = dir.path().join("agent.log");
    let _agent = ChildGuard(
        surge_command()
            .args([
                "agent",
                "--manager",
                &m.grpc,
                "--host",
                "h1",
                "--interval",
                "1",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let script = dir.path().join("job.sh");
    std::fs::write(&script, SCRIPT).unwrap();
    let phase = |job: &str, phase: &str| {
        let mut args = vec!["--hosts", "h1"];
        if phase == "setup" {
            args = vec!["--uid", "0", "--gid", "0"];
        } else if phase != "pre_run" {
            args.clear();
        }
        bb(&m.grpc, phase, job, &script, &args)
    };
    for p in ["setup", "pre_run"] {
        let o = phase("61", p);
        assert!(o.status.success(), "{p}: {}", text(&o));
    }
    let mounted = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(mounted.contains("mounted instance"), "{mounted}");
    // The job's copy of its mount, in a mount namespace of its own.
    let mut holder = ChildGuard(
        std::process::Command::new("unshare")
            .args(["-m", "--propagation", "private", "sleep", "120"])
            .spawn()
            .unwrap(),
    );
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
    let holder_pid = holder.0.id().to_string();
    wait_for(
        "the namespace copying the mount",
        Duration::from_secs(10),
        || (ns(&holder_pid) != ns("self")).then_some(()),
    );
    let t = Instant::now();
    let o = phase("61", "post_run");
    let took = t.elapsed();
    assert!(o.status.success(), "post_run: {}", text(&o));
    assert!(
        took < Duration::from_secs(30),
        "post_run took {took:?} (the namespace lives 120 s)"
    );
    let o = phase("61", "teardown");
    assert!(o.status.success(), "teardown: {}", text(&o));
    // The host serves the next job.
    for p in ["setup", "pre_run", "post_run", "teardown"] {
        let o = phase("62", p);
        assert!(o.status.success(), "the next job's {p}: {}", text(&o));
    }
    let _ = holder.0.kill();
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        log.contains("aborted its connection"),
        "the agent does not say what it did:\n{log}"
    );
}

/// Issue 35 item 4: a client and a manager of releases one minor apart work together (the API
/// only grows); further apart, every call is refused with both versions named and which side
/// to upgrade, before anything is done.
#[test]
fn a_client_of_a_release_too_far_from_the_managers_is_told_both_versions() {
    use tonic::service::Interceptor;
    let dir = Scratch::new("cp-version");
    let m = Manager::start(dir.path());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (major, minor) = {
        let mut it = surge_api::VERSION.split('.');
        let major: u64 = it.next().unwrap().parse().unwrap();
        let minor: u64 = it.next().unwrap().parse().unwrap();
        (major, minor)
    };
    let call_as = |version: String| {
        rt.block_on(async {
            let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", m.grpc))
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut munge = surge_api::Munge::new(surge_testkit::munge_socket().to_path_buf());
            let mut c =
                surge_api::v1::manager_client::ManagerClient::with_interceptor(ch, move |req| {
                    let mut req = munge.call(req)?;
                    req.metadata_mut()
                        .insert(surge_api::VERSION_HEADER, version.parse().unwrap());
                    Ok(req)
                });
            c.list_pools(surge_api::v1::Empty {}).await.map(|_| ())
        })
    };
    // This release, the next minor and (where there is one) the one before: served.
    call_as(surge_api::VERSION.to_string()).expect("this release");
    call_as(format!("{major}.{}.0", minor + 1)).expect("one minor newer");
    if minor > 0 {
        call_as(format!("{major}.{}.9", minor - 1)).expect("one minor older");
    }
    // Two minors newer, and another major: refused, saying both versions.
    for (v, upgrade) in [
        (format!("{major}.{}.0", minor + 2), "upgrade the manager"),
        (format!("{}.{minor}.0", major + 1), "upgrade the manager"),
    ] {
        let e = call_as(v.clone()).expect_err(&v);
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
        assert!(
            e.message().contains(&v)
                && e.message().contains(surge_api::VERSION)
                && e.message().contains(upgrade),
            "{}",
            e.message()
        );
    }
}
