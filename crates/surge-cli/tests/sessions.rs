//! `surge session end`: a session whose job is gone is ended by hand, its job instance
//! destroyed (or kept with --keep-instance); ending it again does nothing and says so.

mod common;
use common::*;

fn session(m: &Manager, job: &str) -> (u64, u64) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut api = surge_api::connect_with(&m.grpc, surge_testkit::munge_socket().to_path_buf())
            .await
            .unwrap();
        let s = api
            .create_session(surge_api::v1::CreateSessionRequest {
                job: job.into(),
                job_instance: Some(surge_api::v1::CreateInstanceRequest {
                    capacity: 64 << 20,
                    access_mode: "striped".into(),
                    nodes: 1,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        (s.id, s.job_instance)
    })
}

fn instances(m: &Manager) -> Vec<u64> {
    let v: serde_json::Value =
        serde_json::from_str(&surge(&["instance", "ls", "--json", "--manager", &m.grpc])).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_u64().unwrap())
        .collect()
}

#[test]
fn a_session_is_ended_by_hand_with_or_without_its_instance() {
    let dir = Scratch::new("sessions");
    let c = cluster(2, "1GiB");
    let m = Manager::start(dir.path());
    m.register(&c);

    let (gone, gone_inst) = session(&m, "gone.sh");
    let (kept, kept_inst) = session(&m, "kept.sh");
    assert!(instances(&m).contains(&gone_inst) && instances(&m).contains(&kept_inst));

    let out = surge(&["session", "end", &gone.to_string(), "--manager", &m.grpc]);
    assert!(out.contains("ended"), "{out}");
    let out = surge(&[
        "session",
        "end",
        &kept.to_string(),
        "--keep-instance",
        "--manager",
        &m.grpc,
    ]);
    assert!(
        out.contains(&format!("job instance {kept_inst} kept")),
        "{out}"
    );
    let left = instances(&m);
    assert!(
        !left.contains(&gone_inst) && left.contains(&kept_inst),
        "{left:?}"
    );
    let ls = surge(&["session", "ls", "--manager", &m.grpc]);
    assert!(!ls.contains("gone.sh") && !ls.contains("kept.sh"), "{ls}");

    // Again: nothing to do, said so (a teardown re-run after a crash must not fail).
    let out = surge(&["session", "end", &gone.to_string(), "--manager", &m.grpc]);
    assert!(out.contains("already ended"), "{out}");
}

/// A `surge run` killed with SIGKILL mid-job never ends its session: the manager notices the
/// process is gone and ends it, destroying the job instance (nothing stays allocated).
#[test]
fn the_session_of_a_killed_surge_run_is_ended_by_the_manager() {
    let dir = Scratch::new("sessions-reconcile");
    let c = cluster(2, "1GiB");
    let m = Manager::start(dir.path());
    m.register(&c);
    let script = dir.path().join("job.sh");
    std::fs::write(
        &script,
        "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=64MiB\n\
         echo started > \"$DW_JOB_STRIPED/x\"; sleep 60\n",
    )
    .unwrap();
    let mut run = ChildGuard(
        surge_command()
            .args(["run", "--quiet", "--manager", &m.grpc])
            .arg(&script)
            .stderr(std::fs::File::create(dir.path().join("run.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let active = |m: &Manager| -> Vec<serde_json::Value> {
        let v: serde_json::Value =
            serde_json::from_str(&surge(&["session", "ls", "--json", "--manager", &m.grpc]))
                .unwrap();
        v.as_array().unwrap().clone()
    };
    let s = wait_for(
        "the job's session",
        std::time::Duration::from_secs(30),
        // The session is listed before its job instance is allocated.
        || {
            active(&m)
                .into_iter()
                .find(|s| s["job_instance"].as_u64().is_some())
        },
    );
    let inst = s["job_instance"].as_u64().unwrap();
    assert!(
        s["external_id"].as_str().unwrap().starts_with("run:"),
        "{s}"
    );
    assert!(instances(&m).contains(&inst));
    let pid = run.0.id();
    let run_dir = std::env::temp_dir()
        .join(format!("surge-{}", surge_run::embedded::user_name()))
        .join(format!("session-{}-{pid}", s["id"].as_u64().unwrap()));
    wait_for(
        "the job's mount",
        std::time::Duration::from_secs(20),
        || run_dir.join("node-0/job/x").exists().then_some(()),
    );
    // The manager keeps the job's phase, as for a Slurm job.
    assert_eq!(active(&m)[0]["phase"], "pre_run", "{:?}", active(&m));
    run.0.kill().unwrap();
    let _ = run.0.wait();
    wait_for(
        "the session ended",
        std::time::Duration::from_secs(20),
        || active(&m).is_empty().then_some(()),
    );
    assert!(!instances(&m).contains(&inst), "{:?}", instances(&m));
    let all = surge(&["session", "ls", "--all", "--manager", &m.grpc]);
    assert!(all.contains("abandoned"), "{all}");
    let log = std::fs::read_to_string(dir.path().join("manager.log")).unwrap();
    assert!(log.contains("is gone"), "{log}");

    // Its dead mount and run directory are removed by the next `surge run`.
    assert!(run_dir.exists());
    std::fs::write(
        &script,
        "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=64MiB\ntrue\n",
    )
    .unwrap();
    let out = surge_command()
        .args(["run", "--quiet", "--manager", &m.grpc])
        .arg(&script)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        !run_dir.exists(),
        "{} is still there: {err}",
        run_dir.display()
    );
    assert!(err.contains("was killed"), "{err}");
}

/// A killed `surge run` of a `type=cache` job whose drain could not finish (its PFS directory
/// became unusable): the manager ends the session but keeps the instance ("drain-pending"),
/// and `surge stage drain` later puts the acknowledged data on the PFS.
#[test]
fn a_killed_cache_job_keeps_what_was_not_drained() {
    if skip_without_fuse("a_killed_cache_job_keeps_what_was_not_drained") {
        return;
    }
    let dir = Scratch::new("sessions-cache");
    let c = cluster(2, "1GiB");
    let m = Manager::start(dir.path());
    m.register(&c);
    let pfs = dir.path().join("pfs");
    let aside = dir.path().join("pfs.aside");
    let written = dir.path().join("written");
    std::fs::create_dir_all(&pfs).unwrap();
    let script = dir.path().join("job.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\n#DW jobdw type=cache access_mode=striped capacity=64MiB pfs={p}\n\
             mv {p} {a} && touch {p}\n\
             echo precious > \"$DW_JOB_STRIPED_CACHE/result\"\n\
             touch {w}; sleep 60\n",
            p = pfs.display(),
            a = aside.display(),
            w = written.display()
        ),
    )
    .unwrap();
    let mut run = ChildGuard(
        surge_command()
            .args(["run", "--quiet", "--manager", &m.grpc])
            .arg(&script)
            .stderr(std::fs::File::create(dir.path().join("run.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_for(
        "the job's write",
        std::time::Duration::from_secs(30),
        || written.exists().then_some(()),
    );
    let active = |m: &Manager| -> Vec<serde_json::Value> {
        let v: serde_json::Value =
            serde_json::from_str(&surge(&["session", "ls", "--json", "--manager", &m.grpc]))
                .unwrap();
        v.as_array().unwrap().clone()
    };
    let inst = active(&m)[0]["job_instance"].as_u64().unwrap();
    run.0.kill().unwrap();
    let _ = run.0.wait();
    wait_for(
        "the session ended",
        std::time::Duration::from_secs(30),
        || active(&m).is_empty().then_some(()),
    );
    let all = surge(&["session", "ls", "--all", "--manager", &m.grpc]);
    assert!(all.contains("drain-pending"), "{all}");
    assert!(instances(&m).contains(&inst), "{:?}", instances(&m));
    // Nothing drains it meanwhile: a wait for it gives up, saying what is pending.
    let wait_drained = |timeout: &str| {
        surge_command()
            .args(["instance", "wait-drained", &inst.to_string()])
            .args(["--timeout", timeout, "--manager", &m.grpc])
            .output()
            .unwrap()
    };
    let waited = wait_drained("1");
    let err = String::from_utf8_lossy(&waited.stderr);
    assert!(
        !waited.status.success() && err.contains("still not on"),
        "{err}"
    );
    // The PFS is back: the changes the job made reach it by hand.
    std::fs::remove_file(&pfs).unwrap();
    std::fs::rename(&aside, &pfs).unwrap();
    let out = surge(&[
        "stage",
        "drain",
        "--manager",
        &m.grpc,
        "--instance",
        &inst.to_string(),
    ]);
    assert!(out.contains("drained"), "{out}");
    assert_eq!(
        std::fs::read_to_string(pfs.join("result")).unwrap(),
        "precious\n"
    );
    let waited = wait_drained("5");
    assert!(
        waited.status.success(),
        "{}",
        String::from_utf8_lossy(&waited.stderr)
    );
}
