//! `surge bench` as a user runs it: the real binary, real worker processes, real files.
//! Sizes are small so the whole file runs in seconds; performance is never asserted here
//! (bench/fio_vs_surge.sh measures it).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn surge() -> Command {
    Command::new(env!("CARGO_BIN_EXE_surge"))
}

fn run(args: &[&str]) -> Output {
    surge().args(args).output().expect("run surge")
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "surge failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect()
}

fn phase<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["summary"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["phase"] == name)
        .unwrap_or_else(|| panic!("no {name} phase in {report}"))
}

#[test]
fn io_with_two_processes_moves_the_aggregate_and_cleans_up() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let out = run(&[
        "bench",
        "io",
        dir,
        "--procs",
        "2",
        "--transfer",
        "64KiB",
        "--block",
        "1MiB",
        "--segments",
        "3",
        "--shared-file",
        "--random",
        "--verify",
        "-i",
        "2",
        "--json",
    ]);
    let r = json(&out);
    assert_eq!(r["schema"], "surge.bench.io/1");
    let results = r["results"].as_array().unwrap();
    assert_eq!(results.len(), 4, "write and read, two repetitions");
    for p in results {
        // 2 processes x 3 segments x 1 MiB, in 64 KiB transfers.
        assert_eq!(p["bytes"], 6 << 20);
        assert_eq!(p["ops"], 96);
        assert_eq!(p["procs"], 2);
        assert_eq!(p["verify_errors"], 0);
        let time = p["time_s"].as_f64().unwrap();
        let rate = p["bytes_per_s"].as_f64().unwrap();
        assert!(
            (rate * time - (6 << 20) as f64).abs() < 1.0,
            "rate x time = bytes"
        );
    }
    let w = phase(&r, "write");
    assert_eq!(w["repetitions"], 2);
    assert_eq!(w["latency"]["ops"], 192);
    assert!(w["mib_per_s"]["min"].as_f64().unwrap() <= w["mib_per_s"]["max"].as_f64().unwrap());
    assert!(
        entries(tmp.path()).is_empty(),
        "files left: {:?}",
        entries(tmp.path())
    );
}

#[test]
fn shared_file_layout_interleaves_the_processes_blocks() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let r = json(&run(&[
        "bench",
        "io",
        dir,
        "--procs",
        "3",
        "--transfer",
        "4KiB",
        "--block",
        "8KiB",
        "--segments",
        "2",
        "--shared-file",
        "--write-only",
        "--keep",
        "--json",
    ]));
    assert!(r["notes"].to_string().contains("files kept in"));
    let run_dir = entries(tmp.path()).pop().expect("kept run directory");
    let data = std::fs::read(run_dir.join("rep0/data.shared")).unwrap();
    assert_eq!(data.len(), 3 * 2 * 8192);
    // Each 4 KiB transfer starts with its writer's stamp and its own offset.
    for (i, t) in data.chunks(4096).enumerate() {
        let owner = u64::from_le_bytes(t[..8].try_into().unwrap()) & 0xffff;
        let offset = u64::from_le_bytes(t[8..16].try_into().unwrap());
        assert_eq!(
            owner,
            (i as u64 / 2) % 3,
            "segment-major, then process, then transfer"
        );
        assert_eq!(offset, i as u64 * 4096);
    }
}

#[test]
fn md_phases_count_every_file_of_every_process() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    for extra in [&[][..], &["--shared-dir"][..]] {
        let mut args = vec![
            "bench", "md", dir, "--procs", "2", "--files", "150", "--json",
        ];
        args.extend_from_slice(extra);
        let r = json(&run(&args));
        assert_eq!(r["schema"], "surge.bench.md/1");
        for name in ["create", "stat", "open-close", "remove"] {
            let p = phase(&r, name);
            assert_eq!(p["latency"]["ops"], 300, "{name}");
            assert!(p["ops_per_s"]["mean"].as_f64().unwrap() > 0.0);
        }
        assert!(entries(tmp.path()).is_empty());
    }
}

#[test]
fn text_report_speaks_ior() {
    let tmp = tempfile::tempdir().unwrap();
    let out = run(&[
        "bench",
        "io",
        tmp.path().to_str().unwrap(),
        "--transfer",
        "4KiB",
        "--block",
        "256KiB",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "access=file-per-process",
        "transfer=4 KiB",
        "bw(MiB/s)",
        "IOPS",
        "Max(MiB)",
        "p99",
    ] {
        assert!(text.contains(needle), "missing {needle} in\n{text}");
    }
}

#[test]
fn bad_paths_fail_before_writing_with_a_clear_message() {
    let out = run(&["bench", "io", "/nonexistent/surge-bench"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/nonexistent/surge-bench does not exist"),
        "{err}"
    );

    let out = run(&["bench", "md", "/proc"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot write to /proc"));

    let tmp = tempfile::tempdir().unwrap();
    let out = run(&[
        "bench",
        "io",
        tmp.path().to_str().unwrap(),
        "--block",
        "1000TiB",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not enough space"), "{err}");
    assert!(entries(tmp.path()).is_empty(), "nothing written");

    let out = run(&[
        "bench",
        "io",
        tmp.path().to_str().unwrap(),
        "--transfer",
        "3KiB",
        "--block",
        "4KiB",
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("multiple of --transfer"));
}

fn children_of(pid: u32) -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // The fields after the command name (which may hold spaces) start after ") ".
        let rest = stat.rsplit_once(") ").map(|x| x.1).unwrap_or("");
        if rest.split_whitespace().nth(1) == Some(&pid.to_string()) {
            v.push(p);
        }
    }
    v
}

#[test]
fn ctrl_c_removes_the_files_and_stops_the_workers() {
    let tmp = tempfile::tempdir().unwrap();
    // fsync after every 4 KiB write: slow enough to be interrupted mid-phase.
    let mut child = surge()
        .args([
            "bench",
            "io",
            tmp.path().to_str().unwrap(),
            "--procs",
            "2",
            "--transfer",
            "4KiB",
            "--block",
            "256MiB",
            "--fsync-per-write",
            "--deadline",
            "60",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let mut workers = Vec::new();
    loop {
        let writing = entries(tmp.path())
            .first()
            .map(|run| run.join("rep0/data.00001").exists())
            .unwrap_or(false);
        if writing {
            workers = children_of(child.id());
            break;
        }
        if started.elapsed() > Duration::from_secs(30) || child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(workers.len(), 2, "two workers writing");
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    assert!(String::from_utf8_lossy(&out.stderr).contains("interrupted; removed"));
    assert!(
        entries(tmp.path()).is_empty(),
        "left: {:?}",
        entries(tmp.path())
    );
    for w in workers {
        assert!(
            !Path::new(&format!("/proc/{w}")).exists(),
            "worker {w} still alive"
        );
    }
}

#[test]
fn sweep_writes_json_csv_and_svg() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("target");
    std::fs::create_dir(&target).unwrap();
    let prefix = tmp.path().join("curve");
    let r = json(&run(&[
        "bench",
        "sweep",
        target.to_str().unwrap(),
        "--preset",
        "metadata",
        "--procs",
        "1,2",
        "--files",
        "200",
        "--out",
        prefix.to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(r["schema"], "surge.bench.sweep/1");
    let points = r["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    // Strong scaling: 200 files in total, 100 per process at 2 processes.
    assert_eq!(points[1]["params"]["md"]["files"], 100);
    let csv = std::fs::read_to_string(prefix.with_extension("csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 2 * 4);
    assert!(csv.lines().nth(1).unwrap().starts_with("1,create,"));
    let svg = std::fs::read_to_string(prefix.with_extension("svg")).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 4);
    assert!(prefix.with_extension("json").exists());
    assert!(entries(&target).is_empty());
}

#[test]
fn calibrate_writes_a_peaks_file_profile_can_read() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("target");
    std::fs::create_dir(&target).unwrap();
    let out_file = tmp.path().join("peaks.json");
    let out = run(&[
        "bench",
        "calibrate",
        target.to_str().unwrap(),
        "--max-procs",
        "2",
        "--bw-aggregate",
        "32MiB",
        "--iops-aggregate",
        "4MiB",
        "--md-files",
        "300",
        "--deadline",
        "0.5",
        "--out",
        out_file.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("read bandwidth"), "{text}");
    let peaks = surge_core::peaks::Peaks::load(&out_file).expect("valid surge.peaks/1 file");
    assert!(peaks.read_bw > 0.0 && peaks.write_bw > 0.0);
    assert!(peaks.read_iops > 0.0 && peaks.write_iops > 0.0);
    assert!(peaks.metadata_ops > 0.0 && peaks.metadata_detail.create > 0.0);
    for p in [
        peaks.procs_at_peak.read_bw,
        peaks.procs_at_peak.write_iops,
        peaks.procs_at_peak.metadata_ops,
    ] {
        assert!(p == 1 || p == 2, "{p}");
    }
    assert!(entries(&target).is_empty());
}

#[test]
fn help_teaches_the_ior_vocabulary() {
    let out = run(&["bench", "io", "--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--transfer",
        "--block",
        "--segments",
        "--shared-file",
        "IOR",
        "Examples",
    ] {
        assert!(text.contains(needle), "missing {needle}");
    }
}

/// Haider's normalised metric: every grid point has each side's rate and target / baseline,
/// and the sides' directories are left empty.
#[test]
fn compare_divides_each_target_by_the_baseline_at_every_point() {
    let tmp = tempfile::tempdir().unwrap();
    let (base, a, b) = (
        tmp.path().join("pfs"),
        tmp.path().join("a"),
        tmp.path().join("b"),
    );
    for d in [&base, &a, &b] {
        std::fs::create_dir(d).unwrap();
    }
    let out = run(&[
        "bench",
        "compare",
        "--baseline",
        &format!("pfs={}", base.display()),
        &format!("local={}", a.display()),
        b.to_str().unwrap(),
        "--procs",
        "1,2",
        "--transfers",
        "64KiB,1MiB",
        "--aggregate",
        "4MiB",
        "--json",
    ]);
    let r = json(&out);
    assert_eq!(r["schema"], "surge.compare/1");
    assert_eq!(
        r["targets"][1]["name"], "b",
        "a target named after its directory"
    );
    let points = r["points"].as_array().unwrap();
    // 2 process counts x 2 transfer sizes x write and read.
    assert_eq!(points.len(), 8, "{r}");
    for p in points {
        let bps: Vec<f64> = p["bytes_per_s"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let norm: Vec<f64> = p["normalised"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!((bps.len(), norm.len()), (3, 2), "{p}");
        assert!(bps.iter().all(|&x| x > 0.0), "{p}");
        for (i, n) in norm.iter().enumerate() {
            assert!((n - bps[i + 1] / bps[0]).abs() < 1e-9, "{p}");
        }
    }
    for d in [&base, &a, &b] {
        assert!(entries(d).is_empty(), "{} not cleaned up", d.display());
    }
    // A baseline that is not there is named in the error.
    let out = run(&[
        "bench",
        "compare",
        "--baseline",
        "/nonexistent/pfs",
        a.to_str().unwrap(),
        "--procs",
        "1",
        "--transfers",
        "64KiB",
        "--aggregate",
        "1MiB",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/nonexistent/pfs"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
