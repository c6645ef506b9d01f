//! Issue 18, item 4: the job lines `surge advise` prints run as printed. For each shipped
//! workflow of examples/workflows, the stage is profiled on its "PFS" directory, advised, and
//! the printed lines are pasted, unchanged, at the top of a job script whose body runs the
//! stage on the burst buffer; `surge run` (real manager, servers, FUSE) must parse and run it,
//! stage in, and stage the results back out.

mod common;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The embedded fast tier of the jobs, and the granularity advise is told about.
const GRANULARITY: &str = "64MiB";

fn surge_in(fast: &Path, cwd: &Path) -> Command {
    let mut c = Command::new(SURGE);
    c.current_dir(cwd)
        .env("SURGE_FAST_DIR", fast)
        .env("SURGE_SERVERS", "2")
        .env("SURGE_SERVER_CAPACITY", "1GiB")
        .env("SURGE_GRANULARITY", GRANULARITY)
        .env_remove("SURGE_MANAGER")
        .env_remove("SURGE_STATE_DIR");
    c
}

/// A peaks file as `surge bench calibrate` writes it: an input of advise (the fragment of a
/// RAM tier), not a result under test.
fn write_peaks(dir: &Path) -> PathBuf {
    let p = dir.join("peaks.json");
    let gib = 1024.0f64 * 1024.0 * 1024.0;
    std::fs::write(
        &p,
        serde_json::json!({
            "schema": "surge.peaks/1", "path": "/dev/shm", "host": "test",
            "measured_at": "2026-01-01T00:00:00Z",
            "read_bw": 4.0 * gib, "write_bw": 2.0 * gib, "read_iops": 400000.0,
            "write_iops": 300000.0, "metadata_ops": 60000.0,
            "procs_at_peak": {"read_bw": 2, "write_bw": 2, "read_iops": 2, "write_iops": 2, "metadata_ops": 2}
        })
        .to_string(),
    )
    .unwrap();
    p
}

/// `surge advise --json` of a saved profile, with the list of the software environment.
fn advise(w: &Path, profile: &Path, pipelines: &str) -> Value {
    let out = Command::new(SURGE)
        .env("SURGE_GRANULARITY", GRANULARITY)
        .arg("advise")
        .arg(profile)
        .arg("--peaks")
        .arg(write_peaks(w))
        .args(["--pipelines", pipelines, "--json", "--env-list"])
        .arg(w.join("env.list"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn lines(a: &Value, key: &str) -> String {
    a[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

fn job_var(a: &Value) -> &'static str {
    if a["access_mode"] == "private" {
        "$DW_JOB_PRIVATE"
    } else {
        "$DW_JOB_STRIPED"
    }
}

#[test]
fn swarp_advice_runs_as_printed() {
    if skip_without_fuse("swarp_advice_runs_as_printed") {
        return;
    }
    if Command::new("cc").arg("--version").output().is_err()
        && skip_without(
            "swarp_advice_runs_as_printed",
            "no C compiler for resample.c",
        )
    {
        return;
    }
    let fast = Scratch::new("adv-swarp-fast");
    let w = Scratch::new("adv-swarp");
    let bin = w.path().join("resample");
    assert!(Command::new("cc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&bin)
        .arg(repo().join("examples/workflows/swarp/resample.c"))
        .status()
        .unwrap()
        .success());
    // The PFS copy of the inputs: 2 images of 8 MiB and their weights (small, the test is
    // about the lines, not the speed).
    let data = w.path().join("brick");
    assert!(Command::new(&bin)
        .arg("prepare")
        .arg(&data)
        .args(["2", "8"])
        .status()
        .unwrap()
        .success());
    let profile = w.path().join("swarp.json");
    let out = Command::new(SURGE)
        .args(["profile", "--stage", "swarp-resample", "--data-path"])
        .arg(&data)
        .arg("-o")
        .arg(&profile)
        .arg("--")
        .arg(&bin)
        .arg("run")
        .arg(&data)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let a = advise(w.path(), &profile, "2");
    assert_eq!(a["access_mode"], "striped", "{}", a["access_mode_reason"]);
    let expected = std::fs::read(data.join("out/image00.resamp.fits")).unwrap();
    std::fs::remove_dir_all(data.join("out")).unwrap();

    let job = w.path().join("job.sh");
    std::fs::write(
        &job,
        format!(
            "#!/bin/bash\n{}\nset -e\n{} run {}\n",
            lines(&a, "directives"),
            bin.display(),
            job_var(&a)
        ),
    )
    .unwrap();
    let out = surge_in(fast.path(), w.path())
        .arg("run")
        .arg(&job)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        std::fs::read(data.join("out/image00.resamp.fits")).unwrap() == expected,
        "the job's staged-out result differs from the stage run on the PFS"
    );

    // The performance-target line, in place of the #DW jobdw one, runs with the peaks.
    let first = a["directives"][0].as_str().unwrap();
    let target = a["target_directive"].as_str().unwrap();
    let script = std::fs::read_to_string(&job)
        .unwrap()
        .replacen(first, target, 1);
    std::fs::write(&job, script).unwrap();
    std::fs::remove_dir_all(data.join("out")).unwrap();
    let out = surge_in(fast.path(), w.path())
        .arg("run")
        .arg("--peaks")
        .arg(w.path().join("peaks.json"))
        .arg(&job)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("promise"),
        "{}",
        text(&out)
    );
    assert!(data.join("out/image00.resamp.fits").is_file());
}

#[test]
fn camp_advice_with_its_setup_job_runs_as_printed() {
    if skip_without_fuse("camp_advice_with_its_setup_job_runs_as_printed") {
        return;
    }
    let py = match Command::new("python3")
        .args(["-c", "import sys, sqlite3; print(sys.executable)"])
        .output()
    {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        _ => {
            skip_without(
                "camp_advice_with_its_setup_job_runs_as_printed",
                "no python3 with sqlite3",
            );
            return;
        }
    };
    let fast = Scratch::new("adv-camp-fast");
    let w = Scratch::new("adv-camp");
    let script = repo().join("examples/workflows/camp/builddb.py");
    let data = w.path().join("camp");
    assert!(Command::new(&py)
        .arg(&script)
        .arg("prepare")
        .arg(&data)
        .status()
        .unwrap()
        .success());
    let profile = w.path().join("camp.json");
    let out = Command::new(SURGE)
        .args(["profile", "--stage", "camp-builddb", "--data-path"])
        .arg(&data)
        .arg("-o")
        .arg(&profile)
        .arg("--")
        .arg(&py)
        .arg(&script)
        .arg("run")
        .arg(&data)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let a = advise(w.path(), &profile, "4");
    let env = a["software_environment_instance"].as_str().unwrap();
    assert!(!env.is_empty(), "the stage read a software environment");
    assert!(w.path().join("env.list").is_file());
    std::fs::remove_file(data.join("camp.db")).unwrap();

    // The setup job, as printed: creates the persistent instance and stages the list in.
    let setup = w.path().join("setup.sh");
    std::fs::write(
        &setup,
        format!("#!/bin/bash\n{}\ntrue\n", lines(&a, "setup_directives")),
    )
    .unwrap();
    let out = surge_in(fast.path(), w.path())
        .arg("run")
        .arg(&setup)
        .output()
        .unwrap();
    assert!(out.status.success(), "setup job: {}", text(&out));

    // The job: the advised lines, and a body that runs the stage on the burst buffer with its
    // package directories taken from the persistent instance.
    let var = job_var(&a);
    let rel = data.display().to_string();
    let job = w.path().join("job.sh");
    std::fs::write(
        &job,
        format!(
            "#!/bin/bash\n{}\nset -e\n\
             test -f $DW_PERSISTENT_STRIPED_{env}{rel}/env/site00/camp00/__init__.py\n\
             ln -s $DW_PERSISTENT_STRIPED_{env}{rel}/env {var}/env\n\
             {py} {} run {var}\n",
            lines(&a, "directives"),
            script.display(),
        ),
    )
    .unwrap();
    let out = surge_in(fast.path(), w.path())
        .arg("run")
        .arg(&job)
        .output()
        .unwrap();
    assert!(out.status.success(), "job: {}", text(&out));
    let db = data.join("camp.db");
    assert!(
        std::fs::metadata(&db).map(|m| m.len() > 0).unwrap_or(false),
        "camp.db staged out to {}",
        db.display()
    );
}
