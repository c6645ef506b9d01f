//! `surge profile` and `surge advise` as a user runs them: the two example workflows of
//! examples/workflows (SWarp-like: bandwidth-bound; CAMP-like: metadata-bound, and fewer
//! metadata operations with relaxed SQLite pragmas), a crashing command, the outputs (table,
//! JSON, HTML), advice from a saved profile, and errors that name what is wrong.
//!
//! The workflows run in a directory under /dev/shm (the RAM tier Surge's embedded default uses
//! as burst buffer) when it exists: the profile then shows the stage as it runs on a burst
//! buffer, not as it runs on this machine's disk (where fsync alone costs ~5 ms).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SURGE: &str = env!("CARGO_BIN_EXE_surge");

/// The workflow tests time I/O: run them one at a time so they do not disturb each other.
static TIMED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn timed() -> std::sync::MutexGuard<'static, ()> {
    TIMED.lock().unwrap_or_else(|e| e.into_inner())
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn workdir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).expect("tempdir in /dev/shm")
    } else {
        tempfile::tempdir().expect("tempdir")
    }
}

fn have(tool: &str, arg: &str) -> bool {
    Command::new(tool)
        .arg(arg)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// The real interpreter (not a version-manager shim script that would be profiled too).
fn python() -> Option<String> {
    let out = Command::new("python3")
        .args(["-c", "import sys, sqlite3; print(sys.executable)"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn surge(args: &[&str]) -> Output {
    Command::new(SURGE).args(args).output().expect("surge runs")
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn write_peaks(dir: &Path) -> PathBuf {
    // A peaks file as `surge bench calibrate` writes it (Daley's Cori fragment: 6 GiB/s,
    // 90K IOPS, 25K metadata ops/s).
    let p = dir.join("peaks.json");
    let gib = 1024.0f64 * 1024.0 * 1024.0;
    std::fs::write(
        &p,
        serde_json::json!({
            "schema": "surge.peaks/1", "path": "/bb", "host": "test", "measured_at": "2026-01-01T00:00:00Z",
            "read_bw": 6.0 * gib, "write_bw": 6.0 * gib, "read_iops": 90000.0, "write_iops": 90000.0,
            "metadata_ops": 25000.0,
            "procs_at_peak": {"read_bw": 8, "write_bw": 8, "read_iops": 16, "write_iops": 16, "metadata_ops": 32}
        })
        .to_string(),
    )
    .unwrap();
    p
}

#[test]
fn swarp_like_stage_is_bandwidth_bound() {
    // Taken first, released last: this test's 400 MiB temp dir is deleted before the next
    // timed test starts.
    let _serial = timed();
    if !have("cc", "--version") {
        eprintln!("SKIP: no C compiler to build examples/workflows/swarp/resample.c");
        return;
    }
    let w = workdir();
    let bin = w.path().join("resample");
    let src = repo().join("examples/workflows/swarp/resample.c");
    assert!(Command::new("cc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .unwrap()
        .success());
    let data = w.path().join("brick");
    let data_s = data.to_str().unwrap();
    assert!(Command::new(&bin)
        .args(["prepare", data_s])
        .status()
        .unwrap()
        .success());
    let saved = w.path().join("swarp.json");
    let html = w.path().join("swarp.html");
    let out = surge(&[
        "profile",
        "--stage",
        "swarp-resample",
        "--data-path",
        data_s,
        "--json",
        "-o",
        saved.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
        "--",
        bin.to_str().unwrap(),
        "run",
        data_s,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = json_of(&out);
    let t2 = &j["summary"]["table2"];
    assert_eq!(
        j["summary"]["verdict"]["bound"], "bandwidth-bound",
        "{}",
        j["summary"]["verdict"]
    );
    // 4 images of 32 MiB + 4 weights of 16 MiB read, and as much written, in 4 MiB transfers.
    assert_eq!(t2["io_mib"].as_f64().unwrap().round(), 384.0);
    assert!(t2["mean_transfer_kib"].as_f64().unwrap() > 3000.0, "{t2}");
    assert_eq!(
        j["summary"]["table3"]["user_io_pct"]
            .as_f64()
            .unwrap()
            .round(),
        100.0
    );
    // Several threads resample each image (SWarp's model), one of them does the I/O.
    assert_eq!(j["summary"]["table1"]["threads"], 5);
    assert_eq!(j["summary"]["table1"]["io_threads"], 1);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<svg") && page.contains("BANDWIDTH-BOUND"));

    // Advice: inputs staged in, outputs staged out, striped.
    let peaks = write_peaks(w.path());
    let out = surge(&[
        "advise",
        saved.to_str().unwrap(),
        "--peaks",
        peaks.to_str().unwrap(),
        "--pipelines",
        "16",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("#DW jobdw type=scratch access_mode=striped"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "#DW stage_in source={data_s}/in destination=$DW_JOB_STRIPED/in type=directory"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "#DW stage_out source=$DW_JOB_STRIPED/out destination={data_s}/out type=directory"
        )),
        "{text}"
    );
}

fn camp(py: &str, dir: &Path, pragmas: &str) -> Value {
    let script = repo().join("examples/workflows/camp/builddb.py");
    let out = surge(&[
        "profile",
        "--stage",
        "camp-builddb",
        "--data-path",
        dir.to_str().unwrap(),
        "--json",
        // Median of 3: the stage's I/O takes ~30 ms here, and a few ms of preemption by other
        // load on a busy 2-core machine must not decide the verdict.
        "--repeat",
        "3",
        "--",
        py,
        script.to_str().unwrap(),
        "run",
        dir.to_str().unwrap(),
        "--pragmas",
        pragmas,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json_of(&out)
}

#[test]
fn camp_like_stage_is_metadata_bound_and_relaxed_pragmas_cut_metadata_ops() {
    let _serial = timed();
    let Some(py) = python() else {
        eprintln!("SKIP: python3 with sqlite3 is not available");
        return;
    };
    let w = workdir();
    let script = repo().join("examples/workflows/camp/builddb.py");
    assert!(Command::new(&py)
        .arg(&script)
        .args(["prepare", w.path().to_str().unwrap()])
        .status()
        .unwrap()
        .success());
    // The verdict compares measured times; the stage's I/O takes ~40 ms, so a burst of other
    // load (or writes into fresh memory, slow on this VM kind) can swing one median-of-3
    // profile. A warm-up run, then up to three profiles: a stage that is not metadata-bound
    // gives no metadata-bound profile and still fails.
    assert!(Command::new(&py)
        .arg(&script)
        .args(["run", w.path().to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap()
        .success());
    let mut default = camp(&py, w.path(), "default");
    for attempt in 2..=3 {
        if default["summary"]["verdict"]["bound"] == "metadata-bound" {
            break;
        }
        eprintln!(
            "profile {} was not metadata-bound ({}; {}), profiling again",
            attempt - 1,
            default["summary"]["verdict"],
            default["caveats"]
        );
        default = camp(&py, w.path(), "default");
    }
    let v = &default["summary"]["verdict"];
    assert_eq!(v["bound"], "metadata-bound", "{v}");
    let md_default = default["summary"]["table2"]["metadata_ops"]
        .as_u64()
        .unwrap();
    // Python searching 40 package directories and SQLite's per-transaction journal.
    assert!(md_default > 5000, "{md_default}");
    let journal = default["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"].as_str().unwrap().ends_with("camp.db-journal"))
        .expect("the rollback journal is a file with the default pragmas");
    // Two CREATE TABLE transactions, then 300 inserts: a journal created and deleted for each.
    assert_eq!(journal["counters"]["unlinks"], 302);

    let fast = camp(&py, w.path(), "fast");
    let md_fast = fast["summary"]["table2"]["metadata_ops"].as_u64().unwrap();
    // journal_mode=MEMORY removes the journal's create/stat/close/unlink per transaction and
    // synchronous=OFF the syncs (Daley §4.3).
    assert!(
        md_fast + 1000 < md_default,
        "default {md_default}, fast {md_fast}"
    );
    assert_eq!(fast["summary"]["table2"]["syncs"], 0);
    // The script still checks whether a stale journal exists; nothing creates one.
    let journal = fast["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"].as_str().unwrap().ends_with("camp.db-journal"));
    assert!(journal.is_none_or(|j| j["counters"]["opens"] == 0 && j["counters"]["unlinks"] == 0));

    // Advice for 64 pipelines: private mode, and the software environment in its own instance.
    let saved = w.path().join("camp.json");
    std::fs::write(&saved, serde_json::to_string(&default).unwrap()).unwrap();
    let peaks = write_peaks(w.path());
    let out = surge(&[
        "advise",
        saved.to_str().unwrap(),
        "--peaks",
        peaks.to_str().unwrap(),
        "--pipelines",
        "64",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let a = json_of(&out);
    assert_eq!(a["access_mode"], "private", "{}", a["access_mode_reason"]);
    assert!(a["directives"][0]
        .as_str()
        .unwrap()
        .contains("access_mode=private"));
    assert!(a["software_environment"].as_array().unwrap().len() > 50);
    // Inputs: the geometa directory (read, never written). Outputs: the database, which the
    // stage wrote and kept; not the journal, created and deleted by every transaction.
    let paths = |k: &str| -> Vec<String> {
        a[k].as_array()
            .unwrap()
            .iter()
            .map(|t| t["path"].as_str().unwrap().to_string())
            .collect()
    };
    let root = w.path().canonicalize().unwrap();
    assert_eq!(
        paths("stage_in"),
        vec![root.join("geometa").display().to_string()]
    );
    assert_eq!(
        paths("stage_out"),
        vec![root.join("camp.db").display().to_string()]
    );
}

#[test]
fn a_crashing_command_still_gives_a_profile_and_its_exit_status() {
    let w = workdir();
    let f = w.path().join("partial.dat");
    let script = format!(
        "printf 0123456789 > {0}; cat {0} > /dev/null; kill -SEGV $$",
        f.display()
    );
    let out = surge(&["profile", "--json", "--", "/bin/sh", "-c", &script]);
    assert_eq!(
        out.status.code(),
        Some(128 + 11),
        "surge exits like the command (128+SIGSEGV)"
    );
    let j = json_of(&out);
    assert_eq!(j["source"]["signal"], 11);
    let file = j["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["path"] == f.display().to_string())
        .expect("the file written before the crash");
    assert_eq!(file["counters"]["bytes_written"], 10);
    assert_eq!(file["counters"]["bytes_read"], 10);
    assert!(j["caveats"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c.as_str().unwrap().contains("signal 11")));
}

#[test]
fn from_imports_a_darshan_log_and_the_table_names_daleys_rows() {
    let mut shared = repo().join("../shared/data/darshan");
    if !shared.exists() {
        shared = PathBuf::from("/work/shared/data/darshan");
    }
    let log = shared.join("dd_write.parser.txt");
    if !log.exists() {
        eprintln!("SKIP: shared/data/darshan is not beside the repository");
        return;
    }
    let out = surge(&["profile", "--from", log.to_str().unwrap(), "--stage", "dd"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for row in [
        "Table 1: resource requirements",
        "Mean read/write transaction size (KiB)",
        "Pipelines to saturate",
        "Data reuse",
        "Verdict: BANDWIDTH-BOUND",
    ] {
        if row == "Pipelines to saturate" {
            assert!(!text.contains(row), "no peaks, no pipelines rows");
        } else {
            assert!(text.contains(row), "missing '{row}' in:\n{text}");
        }
    }
    assert!(text.contains("Darshan counted no stat calls"), "{text}");
}

#[test]
fn errors_name_what_is_wrong() {
    let out = surge(&["profile"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("give a command after `--`"));

    let w = workdir();
    let bad = w.path().join("peaks.json");
    std::fs::write(&bad, "{\"schema\": \"surge.peaks/0\"}").unwrap();
    let out = surge(&["profile", "--peaks", bad.to_str().unwrap(), "--", "true"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(bad.to_str().unwrap()), "{err}");

    let out = surge(&["profile", "--", "/nonexistent/program"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot run '/nonexistent/program'"));
}
