//! `surge bench io --backend mpiio` (issue 18, item 6): real MPI ranks under mpirun writing and
//! reading one shared file with collective MPI-IO, the ROMIO hints of $ROMIO_HINTS reaching
//! the library, and the options the backend does not implement refused by name.

use serde_json::Value;
use std::process::Command;

const SURGE: &str = env!("CARGO_BIN_EXE_surge");

fn mpi_missing() -> Option<&'static str> {
    ["mpicc", "mpirun"]
        .into_iter()
        .find(|tool| Command::new(tool).arg("--version").output().is_err())
}

fn bench(dir: &std::path::Path, extra: &[&str], env: &[(&str, &str)]) -> (bool, Value, String) {
    let out = Command::new(SURGE)
        .args(["bench", "io"])
        .arg(dir)
        .args([
            "--backend",
            "mpiio",
            "-n",
            "2",
            "-t",
            "1MiB",
            "-b",
            "4MiB",
            "--json",
        ])
        .args(extra)
        .env_remove("ROMIO_HINTS")
        .env_remove("OMPI_MCA_io")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.success(), v, err)
}

#[test]
fn collective_shared_file_io_with_hints() {
    if let Some(tool) = mpi_missing() {
        if surge_testkit::skip_without(
            "collective_shared_file_io_with_hints",
            &format!("{tool} not installed (Open MPI)"),
        ) {
            return;
        }
    }
    let t = tempfile::tempdir_in("/tmp").unwrap();
    let (ok, r, err) = bench(
        t.path(),
        &["--shared-file", "--collective", "-s", "2", "-k"],
        &[],
    );
    assert!(ok, "{err}");
    assert_eq!(r["backend"], "mpiio");
    for phase in r["results"].as_array().unwrap() {
        // 2 ranks x 2 segments x 4 MiB in 1 MiB transfers.
        assert_eq!(phase["bytes"], 16 << 20, "{phase}");
        assert_eq!(phase["ops"], 16);
        assert_eq!(phase["procs"], 2);
        assert!(phase["mib_per_s"].as_f64().unwrap() > 0.0);
        assert_eq!(phase["latency"]["ops"], 16);
    }
    // -k kept the shared file: IOR's layout fills exactly 2 x 2 x 4 MiB.
    let run = std::fs::read_dir(t.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let shared = run.join("rep0/data.shared");
    assert_eq!(std::fs::metadata(&shared).unwrap().len(), 16 << 20);

    // Hints from $ROMIO_HINTS reach the library (reported back by MPI_File_get_info).
    let hints = t.path().join("hints");
    std::fs::write(&hints, "romio_cb_write enable\ncb_nodes 1\n").unwrap();
    let h = hints.to_str().unwrap();
    let (ok, r, err) = bench(t.path(), &["--shared-file", "-c"], &[("ROMIO_HINTS", h)]);
    assert!(ok, "{err}");
    let notes = r["notes"].to_string();
    assert!(notes.contains("cb_nodes=1"), "{notes}");
}

#[test]
fn options_the_backend_lacks_are_refused_by_name() {
    if let Some(tool) = mpi_missing() {
        if surge_testkit::skip_without(
            "options_the_backend_lacks_are_refused_by_name",
            &format!("{tool} not installed (Open MPI)"),
        ) {
            return;
        }
    }
    let t = tempfile::tempdir_in("/tmp").unwrap();
    let (ok, _, err) = bench(t.path(), &["--random"], &[]);
    assert!(!ok);
    assert!(
        err.contains("--random is not supported by the mpiio backend"),
        "{err}"
    );
    let out = Command::new(SURGE)
        .args(["bench", "md", "/tmp", "--backend", "mpiio"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("`surge bench io` only"));
}
