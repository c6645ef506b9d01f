//! `surge sim` as a user runs it: the real binary on the shipped examples.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn surge(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_surge"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run surge")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("surge-sim-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn check_accepts_every_shipped_example() {
    let mut args = vec!["sim", "check"];
    let files: Vec<String> = ["systems", "kernels"]
        .iter()
        .flat_map(|d| std::fs::read_dir(root().join("examples/sim").join(d)).unwrap())
        .map(|e| e.unwrap().path().display().to_string())
        .collect();
    assert!(files.len() >= 9, "{files:?}");
    args.extend(files.iter().map(String::as_str));
    let out = surge(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert_eq!(stdout.matches(": ok").count(), files.len(), "{stdout}");
    assert!(stdout.contains("app plasma: 16384 nodes"), "{stdout}");
}

#[test]
fn check_reports_errors_by_file_and_line() {
    let dir = scratch("check");
    let k = dir.join("bad.kernel");
    std::fs::write(
        &k,
        "app a {\n  processes 4\n  file f shared\n  write f 4 MiB\n}\n",
    )
    .unwrap();
    let out = surge(&["sim", "check", k.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("bad.kernel:4: unexpected 'MiB'"), "{err}");
}

#[test]
fn run_writes_json_series_and_plots() {
    let dir = scratch("run");
    let out = surge(&[
        "sim",
        "run",
        "examples/sim/systems/intrepid.toml",
        "examples/sim/kernels/ior.kernel",
        "--param",
        "procs=1024",
        "--set",
        "burst_buffer.capacity=4GiB",
        "--json",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json = text(&out.stdout);
    assert!(json.contains("\"schema\": \"surge.sim/1\""), "{json}");
    assert!(json.contains("\"name\": \"ior\""), "{json}");
    assert!(json.contains("\"perceived_write_gib_s\""), "{json}");
    for f in [
        "summary.json",
        "series.csv",
        "series.json",
        "cn_rate.svg",
        "storage_rate.svg",
        "bb_occupancy.svg",
    ] {
        let p = dir.join(f);
        assert!(p.is_file(), "{} missing", p.display());
    }
    let csv = std::fs::read_to_string(dir.join("series.csv")).unwrap();
    assert!(csv.starts_with("time_s,cn_write_gib_s,"), "{csv}");
    assert!(csv.lines().count() >= 2);
    let svg = std::fs::read_to_string(dir.join("cn_rate.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("ior"));
}

#[test]
fn run_prints_a_table_by_default() {
    let out = surge(&[
        "sim",
        "run",
        "examples/sim/systems/intrepid.toml",
        "examples/sim/kernels/ior.kernel",
        "--param",
        "procs=512",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let t = text(&out.stdout);
    assert!(
        t.contains("system intrepid: 40960 compute nodes, 640 I/O nodes"),
        "{t}"
    );
    assert!(t.contains("perceived"), "{t}");
    assert!(t.contains("events/s"), "{t}");
}

#[test]
fn unknown_params_and_bad_overrides_are_errors() {
    let out = surge(&[
        "sim",
        "run",
        "examples/sim/systems/intrepid.toml",
        "examples/sim/kernels/ior.kernel",
        "--param",
        "prcos=512",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--param prcos: no kernel declares"),
        "{}",
        text(&out.stderr)
    );
    let out = surge(&[
        "sim",
        "run",
        "examples/sim/systems/intrepid.toml",
        "examples/sim/kernels/ior.kernel",
        "--set",
        "burst_buffer.capacity=lots",
    ]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("lots"), "{}", text(&out.stderr));
}

#[test]
fn help_teaches_with_examples() {
    let out = surge(&["sim", "run", "--help"]);
    assert!(out.status.success());
    let h = text(&out.stdout);
    assert!(
        h.contains("--set") && h.contains("--param") && h.contains("Examples:"),
        "{h}"
    );
}

/// `surge ... | head`: a reader that went ends the command as SIGPIPE ends a C tool (status
/// 141), with no panic message or backtrace on the terminal.
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_surge"))
        .args([
            "sim",
            "run",
            "examples/sim/systems/intrepid.toml",
            "examples/sim/kernels/ior.kernel",
            "--param",
            "procs=64",
            "--json",
        ])
        .current_dir(root())
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run surge");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
