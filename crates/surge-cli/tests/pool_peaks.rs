//! Issue 18, items 1-2: calibrated peaks kept by the manager per server (and for the pool's
//! servers together), shown by `surge pool peaks`, measured by `surge pool calibrate`, and the
//! `#SURGE jobdw` performance targets the manager sizes from them: which servers, what was
//! promised and why (in the session), refusals up front with the best offer, and the
//! embedded default measuring its peaks once. Real manager, servers, SQLite and FUSE mounts.

mod common;
use common::*;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

const MIB: f64 = 1048576.0;

fn peaks_json(m: &Manager) -> Value {
    serde_json::from_str(&surge(&["pool", "peaks", "--json", "--manager", &m.grpc])).unwrap()
}

/// `surge run` of `script` against manager `m`, with its report.
fn run_job(m: &Manager, w: &Path, script: &str, extra: &[&str]) -> (Output, Value) {
    std::fs::write(w.join("job.sh"), script).unwrap();
    let report = w.join("report.json");
    let _ = std::fs::remove_file(&report);
    let out = surge_command()
        .current_dir(w)
        .env_remove("SURGE_PEAKS")
        .args(["run", "--manager", &m.grpc, "--report"])
        .arg(&report)
        .args(extra)
        .arg("job.sh")
        .output()
        .unwrap();
    let rep = std::fs::read_to_string(&report)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    (out, rep)
}

fn phase_names(rep: &Value) -> Vec<String> {
    rep["phases"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| p["name"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_manager_sizes_targets_from_the_peaks_registered_for_its_servers() {
    if skip_without_fuse("the_manager_sizes_targets_from_the_peaks_registered_for_its_servers") {
        return;
    }
    let dir = Scratch::new("pool-peaks");
    let w = Scratch::new("pool-peaks-work");
    let c = cluster(3, "1GiB");
    let m = Manager::start(dir.path());
    m.register(&c);

    // No peaks yet: every server listed, each with a line that says how to measure it.
    let v = peaks_json(&m);
    let ids: Vec<String> = v["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["server"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 3, "{v}");
    assert!(v["servers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["peaks"].is_null()));
    let listing = surge(&["pool", "peaks", "--manager", &m.grpc]);
    assert_eq!(
        listing.matches("no calibrated peaks").count(),
        3,
        "{listing}"
    );
    assert!(
        listing.contains("surge pool calibrate --pool default --server"),
        "{listing}"
    );
    // A job with targets is refused before anything is allocated, and told how to calibrate.
    let (out, rep) = run_job(
        &m,
        w.path(),
        "#!/bin/bash\n#SURGE jobdw bandwidth=100MiB/s\ntrue\n",
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        err.contains("job.sh:2:")
            && err.contains("no calibrated peaks")
            && err.contains("surge pool calibrate"),
        "{err}"
    );
    assert!(
        !phase_names(&rep).contains(&"allocate".to_string()),
        "{rep}"
    );

    // Peaks measured elsewhere, registered: two slow servers, one fast with the best metadata
    // rate, and the three measured together (less than their sum).
    let slow = peaks_file(w.path(), "slow.json", 200.0, 100.0, 5000.0);
    let fast = peaks_file(w.path(), "fast.json", 400.0, 300.0, 8000.0);
    let together = peaks_file(w.path(), "together.json", 500.0, 450.0, 8000.0);
    let out = surge(&[
        "pool",
        "calibrate",
        "--manager",
        &m.grpc,
        "--peaks-file",
        slow.to_str().unwrap(),
        "--server",
        &ids[0],
        "--server",
        &ids[1],
    ]);
    let _ = out;
    surge(&[
        "pool",
        "calibrate",
        "--manager",
        &m.grpc,
        "--peaks-file",
        fast.to_str().unwrap(),
        "--server",
        &ids[2],
    ]);
    surge(&[
        "pool",
        "calibrate",
        "--manager",
        &m.grpc,
        "--peaks-file",
        together.to_str().unwrap(),
        "--aggregate",
    ]);
    let v = peaks_json(&m);
    let of = |id: &str| {
        v["servers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["server"] == id)
            .unwrap()
            .clone()
    };
    assert_eq!(of(&ids[2])["peaks"]["write_bw"], 300.0 * MIB);
    assert_eq!(of(&ids[0])["peaks"]["metadata_ops"], 5000.0);
    assert!(of(&ids[0])["source"]
        .as_str()
        .unwrap()
        .contains("slow.json"));
    assert_eq!(v["pools"][0]["servers"], 3, "{v}");
    assert_eq!(v["pools"][0]["peaks"]["write_bw"], 450.0 * MIB);
    let listing = surge(&["pool", "peaks", "--manager", &m.grpc]);
    assert!(
        !listing.contains("no calibrated peaks") && listing.contains("(3 servers at once)"),
        "{listing}"
    );

    // 350 MiB/s and 6k metadata/s: the fast server (metadata service, 300 MiB/s) and one slow
    // one (100): 2 fragments; the promise says so and is kept with the session.
    let (out, rep) = run_job(
        &m,
        w.path(),
        "#!/bin/bash\n#SURGE jobdw bandwidth=350MiB/s metadata=6k/s\n\
         echo ok > \"$DW_JOB_STRIPED/x\"\n",
        &["--measure-targets"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let t = &rep["targets"];
    assert_eq!(t["offer"]["fragments"], 2, "{t}");
    assert_eq!(t["offer"]["bandwidth"], 400.0 * MIB, "{t}");
    assert_eq!(t["metadata_servers"][0], ids[2].as_str(), "{t}");
    assert_eq!(t["servers"][0]["server"], ids[2].as_str(), "{t}");
    assert_eq!(t["peaks"], "registered");
    assert!(
        t["measured"]["write_bytes_per_s"].as_f64().unwrap() > 0.0,
        "{t}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("2 fragment(s) on 2 server(s) promise")
            && err.contains("metadata 6.0k/s asked"),
        "{err}"
    );
    let sessions: Value = serde_json::from_str(&surge(&[
        "session",
        "ls",
        "-a",
        "--json",
        "--manager",
        &m.grpc,
    ]))
    .unwrap();
    let last = sessions.as_array().unwrap().last().unwrap();
    assert_eq!(last["promise"]["offer"]["fragments"], 2, "{last}");
    assert!(
        last["promise"]["why"][0]
            .as_str()
            .unwrap()
            .contains("bandwidth 0.34 GiB/s asked: 2 server(s) give 0.39 GiB/s"),
        "{last}"
    );
    let ls = surge(&["session", "ls", "-a", "--manager", &m.grpc]);
    assert!(ls.contains("promised 2 fragment(s)"), "{ls}");

    // 460 MiB/s: the three add up to 500 but gave 450 together: refused, with the best.
    let (out, rep) = run_job(
        &m,
        w.path(),
        "#!/bin/bash\n#SURGE jobdw bandwidth=460MiB/s\ntrue\n",
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("measured at once gave 0.44 GiB/s")
            && err.contains("the best this pool offers is 3 fragment(s)"),
        "{err}"
    );
    assert!(
        !phase_names(&rep).contains(&"allocate".to_string()),
        "{rep}"
    );
    // More metadata than the best striped service: refused, naming access_mode=private; in
    // private mode on 2 nodes, two services (8k + 5k) meet it.
    let (out, _) = run_job(
        &m,
        w.path(),
        "#!/bin/bash\n#SURGE jobdw metadata=10k/s\ntrue\n",
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("access_mode=private"),
        "{err}"
    );
    let (out, rep) = run_job(
        &m,
        w.path(),
        "#!/bin/bash\n#SURGE jobdw metadata=10k/s access_mode=private\ntrue\n",
        &["--nodes", "2"],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(rep["targets"]["offer"]["metadata"], 13000.0, "{rep}");
    // Peaks given with the job stand for every server instead (and the curve does not apply).
    let given = peaks_file(w.path(), "given.json", 1000.0, 1000.0, 1000.0);
    let (out, rep) = run_job(
        &m,
        w.path(),
        "#!/bin/bash\n#SURGE jobdw bandwidth=1500MiB/s\ntrue\n",
        &["--peaks", given.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(rep["targets"]["peaks"], "given");
    assert_eq!(rep["targets"]["offer"]["fragments"], 2, "{rep}");
}

#[test]
fn bad_peaks_and_unknown_servers_are_refused_with_the_value_named() {
    let dir = Scratch::new("pool-peaks-bad");
    let c = cluster(1, "1GiB");
    let m = Manager::start(dir.path());
    m.register(&c);
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, peaks_json_text(-1.0)).unwrap();
    let out = surge_command()
        .args(["pool", "calibrate", "--manager", &m.grpc, "--peaks-file"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("write_bw is -1"),
        "{}",
        text(&out)
    );
    let good = dir.path().join("good.json");
    std::fs::write(&good, peaks_json_text(100.0)).unwrap();
    let out = surge_command()
        .args([
            "pool",
            "calibrate",
            "--manager",
            &m.grpc,
            "--server",
            "nosuch",
            "--peaks-file",
        ])
        .arg(&good)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no server 'nosuch'"),
        "{}",
        text(&out)
    );
    let out = surge_command()
        .args(["pool", "peaks", "--manager", &m.grpc, "--pool", "nosuch"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("pool 'nosuch' does not exist"));
}

fn peaks_json_text(write_mib: f64) -> String {
    serde_json::json!({
        "schema": "surge.peaks/1", "path": "/bb", "host": "test",
        "measured_at": "2026-01-01T00:00:00Z",
        "read_bw": 100.0 * MIB, "write_bw": write_mib * MIB, "read_iops": 1.0,
        "write_iops": 1.0, "metadata_ops": 1.0,
        "procs_at_peak": {"read_bw": 1, "write_bw": 1, "read_iops": 1, "write_iops": 1,
                          "metadata_ops": 1}
    })
    .to_string()
}

/// `surge pool calibrate` measures for real: one fragment on each server, then both at once,
/// all registered; a target below the promise is then met at the mount (measured, reported).
#[test]
fn surge_pool_calibrate_measures_each_server_and_the_pool_through_the_data_path() {
    if skip_without_fuse(
        "surge_pool_calibrate_measures_each_server_and_the_pool_through_the_data_path",
    ) {
        return;
    }
    let dir = Scratch::new("pool-calibrate");
    let w = Scratch::new("pool-calibrate-work");
    let c = cluster(2, "1GiB");
    let m = Manager::start(dir.path());
    m.register(&c);
    let out = surge_command()
        .args(["pool", "calibrate", "--manager", &m.grpc, "--json"])
        .args(["--deadline", "0.3", "--max-procs", "2"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["registered"].as_array().unwrap().len(), 3, "{got}");
    let v = peaks_json(&m);
    for s in v["servers"].as_array().unwrap() {
        let p = &s["peaks"];
        assert!(
            p["write_bw"].as_f64().unwrap() > 0.0
                && p["read_iops"].as_f64().unwrap() > 0.0
                && p["write_iops_fsync"].as_f64().unwrap() > 0.0
                && p["metadata_ops"].as_f64().unwrap() > 0.0,
            "{s}"
        );
        assert!(
            s["source"].as_str().unwrap().contains("one fragment"),
            "{s}"
        );
    }
    assert_eq!(v["pools"][0]["servers"], 2, "{v}");
    // Every calibration instance is gone.
    let left: Value =
        serde_json::from_str(&surge(&["instance", "ls", "--json", "--manager", &m.grpc])).unwrap();
    assert_eq!(left.as_array().unwrap().len(), 0, "{left}");

    // Half of what one server gives: one fragment; measured at the mount.
    let one = v["servers"][0]["peaks"]["write_bw"]
        .as_f64()
        .unwrap()
        .min(v["servers"][1]["peaks"]["write_bw"].as_f64().unwrap())
        .min(v["servers"][0]["peaks"]["read_bw"].as_f64().unwrap())
        .min(v["servers"][1]["peaks"]["read_bw"].as_f64().unwrap());
    let ask = (one / 2.0 / MIB) as u64;
    let (out, rep) = run_job(
        &m,
        w.path(),
        &format!("#!/bin/bash\n#SURGE jobdw bandwidth={ask}MiB/s\ntrue\n"),
        &["--measure-targets"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let t = &rep["targets"];
    assert_eq!(t["offer"]["fragments"], 1, "{t}");
    assert!(
        t["measured"]["read_bytes_per_s"].as_f64().unwrap() > 0.0,
        "{t}"
    );
    eprintln!(
        "asked {ask} MiB/s, promised {:.0} MiB/s, measured write {:.0} read {:.0} MiB/s",
        t["offer"]["bandwidth"].as_f64().unwrap() / MIB,
        t["measured"]["write_bytes_per_s"].as_f64().unwrap() / MIB,
        t["measured"]["read_bytes_per_s"].as_f64().unwrap() / MIB
    );
}

/// The embedded default measures its peaks the first time a job asks for targets, keeps them
/// in its state directory and registers them at every start: the second job does not measure.
#[test]
fn the_embedded_default_measures_its_peaks_once_and_keeps_them() {
    if skip_without_fuse("the_embedded_default_measures_its_peaks_once_and_keeps_them") {
        return;
    }
    let fast = Scratch::new("emb-peaks-fast");
    let state = Scratch::new("emb-peaks-state");
    let w = Scratch::new("emb-peaks-work");
    let run = |script: &str| {
        std::fs::write(w.path().join("job.sh"), script).unwrap();
        let report = w.path().join("report.json");
        let out = Command::new(SURGE)
            .current_dir(w.path())
            .env("SURGE_FAST_DIR", fast.path())
            .env("SURGE_STATE_DIR", state.path())
            .env("SURGE_SERVERS", "2")
            .env("SURGE_SERVER_CAPACITY", "1GiB")
            .env("SURGE_GRANULARITY", "64MiB")
            .env_remove("SURGE_MANAGER")
            .env_remove("SURGE_PEAKS")
            .args(["run", "--report"])
            .arg(&report)
            .arg("job.sh")
            .output()
            .unwrap();
        let rep: Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap_or_default())
                .unwrap_or(Value::Null);
        (out, rep)
    };
    // A job without targets measures nothing.
    let (out, rep) =
        run("#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=64MiB\ntrue\n");
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !phase_names(&rep).contains(&"calibrate".to_string()),
        "{rep}"
    );
    let (out, rep) = run("#!/bin/bash\n#SURGE jobdw bandwidth=1MiB/s\ntrue\n");
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        phase_names(&rep).contains(&"calibrate".to_string()),
        "{rep}"
    );
    assert!(state.path().join("embedded-peaks.json").is_file());
    assert_eq!(rep["targets"]["peaks"], "registered", "{rep}");
    let (out, rep) = run("#!/bin/bash\n#SURGE jobdw bandwidth=1MiB/s\ntrue\n");
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !phase_names(&rep).contains(&"calibrate".to_string()),
        "{rep}"
    );
    assert_eq!(rep["targets"]["offer"]["fragments"], 1, "{rep}");
    // `surge pool peaks` with no manager: the embedded default's, with its peaks.
    let out = Command::new(SURGE)
        .env("SURGE_FAST_DIR", fast.path())
        .env("SURGE_STATE_DIR", state.path())
        .env("SURGE_SERVERS", "2")
        .env_remove("SURGE_MANAGER")
        .args(["pool", "peaks", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let with: Vec<&Value> = v["servers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == "up")
        .collect();
    assert_eq!(with.len(), 2, "{v}");
    assert!(with.iter().all(|s| !s["peaks"].is_null()), "{v}");
    assert_eq!(v["pools"][0]["servers"], 2, "{v}");
}
