//! The shim's counters against ground truth: a C program with known I/O (exact counts per file,
//! across a thread and a forked child), `strace -f -c` of the same run, a program that crashes,
//! and Darshan's counters for the Python workload shipped in shared/data/darshan.
//!
//! Needs a C compiler (scripts/setup.sh installs gcc) and, for one test, strace; a test that
//! cannot run says why on stderr.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use surge_profile::model::{Counters, Ending, FileKind, Profile};
use surge_profile::run::{profile_command, RunRequest};

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Compiles tests/programs/ground_truth.c once per test binary.
fn ground_truth_program() -> Option<PathBuf> {
    static BUILT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            if !have("cc") {
                eprintln!("SKIP: no C compiler (cc) to build the ground-truth program; run scripts/setup.sh");
                return None;
            }
            let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/ground_truth.c");
            let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ground_truth");
            let st = Command::new("cc")
                .args(["-O1", "-pthread", "-o"])
                .arg(&out)
                .arg(&src)
                .status()
                .expect("cc runs");
            assert!(st.success(), "compiling {} failed", src.display());
            Some(out)
        })
        .clone()
}

fn profile(cmd: &[&str]) -> Profile {
    profile_command(&RunRequest {
        stage: "test".into(),
        command: cmd.iter().map(|s| s.to_string()).collect(),
        data_paths: vec![],
        records_dir: None,
        stdout_to_stderr: false,
    })
    .expect("profile runs")
}

fn file<'a>(p: &'a Profile, path: &Path) -> &'a surge_profile::model::FileStats {
    let s = path.display().to_string();
    p.files.iter().find(|f| f.path == s).unwrap_or_else(|| {
        panic!(
            "no record for {s}; have {:?}",
            p.files.iter().map(|f| &f.path).collect::<Vec<_>>()
        )
    })
}

/// Sum of the counters of every file under `dir`.
fn under(p: &Profile, dir: &Path) -> Counters {
    let prefix = format!("{}/", dir.display());
    let mut c = Counters::default();
    for f in p
        .files
        .iter()
        .filter(|f| f.path.starts_with(&prefix) || f.path == dir.display().to_string())
    {
        c.merge(&f.counters);
    }
    c
}

#[test]
fn counters_match_the_programs_known_io_across_threads_and_children() {
    let Some(gt) = ground_truth_program() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().canonicalize().unwrap();
    let p = profile(&[gt.to_str().unwrap(), "io", d.to_str().unwrap(), "5"]);
    assert_eq!(p.source.exit_code, Some(0));

    // Two processes (the program and its forked child), both ended normally.
    let gt_procs: Vec<_> = p
        .processes
        .iter()
        .filter(|x| x.exe == gt.display().to_string())
        .collect();
    assert_eq!(gt_procs.len(), 2, "{:?}", p.processes);
    assert!(gt_procs.iter().all(|x| x.ending == Ending::Exit));
    // The parent had two threads alive at once and both did I/O.
    let parent = gt_procs
        .iter()
        .find(|x| x.threads == 2)
        .expect("a process with 2 threads");
    assert_eq!(parent.io_threads, 2);

    for i in 2..5 {
        let c = &file(&p, &d.join(format!("f{i}"))).counters;
        assert_eq!(
            (c.opens, c.closes, c.writes, c.bytes_written),
            (1, 1, 3, 3 * 4096),
            "f{i}"
        );
        assert_eq!(
            (c.syncs, c.stats, c.accesses),
            (1, 4, 1),
            "f{i}: fsync; stat, lstat, fstatat, statx; access"
        );
        assert_eq!(
            c.hist_write[2], 3,
            "three 4 KiB writes in the 1K-10K bucket"
        );
        assert_eq!(c.size_estimate(), 12288);
    }
    assert_eq!(file(&p, &d.join("f0")).counters.renames, 1);
    assert_eq!(file(&p, &d.join("f1")).counters.unlinks, 1);

    let t = &file(&p, &d.join("t")).counters;
    assert_eq!(
        (t.opens, t.writes, t.bytes_written, t.reads, t.bytes_read),
        (1, 10, 10_000, 5, 5_000)
    );
    assert_eq!((t.seeks, t.syncs, t.closes), (3, 1, 1));
    assert_eq!(t.max_byte_read, 9_000, "pread at offset 8000 of 1000 bytes");

    let c = &file(&p, &d.join("c")).counters;
    assert_eq!(
        (c.opens, c.writes, c.bytes_written, c.closes),
        (1, 7, 700, 1)
    );

    let s = &file(&p, &d.join("s")).counters;
    assert_eq!(
        (
            s.stdio_opens,
            s.stdio_writes,
            s.stdio_bytes_written,
            s.stdio_closes
        ),
        (1, 1000, 10_000, 1)
    );
    // 10,000 bytes through a 4 KiB libc buffer reach the kernel as 3 writes.
    assert_eq!(s.stdio_kernel_writes_est, 3);

    let dd = &file(&p, &d.join("d")).counters;
    assert_eq!((dd.mkdirs, dd.rmdirs), (1, 1));
    let m = file(&p, &d.join("missing"));
    assert_eq!(
        (m.kind, m.counters.stats, m.counters.meta_errors),
        (FileKind::Missing, 1, 1)
    );
    let top = file(&p, &d);
    // ., .., f2, f3, f4, g0, t, c, s, then the end-of-directory call.
    assert_eq!(
        (
            top.counters.opendirs,
            top.counters.readdirs,
            top.counters.closes
        ),
        (1, 10, 1)
    );
}

#[test]
fn concurrent_threads_lose_no_counts() {
    let Some(gt) = ground_truth_program() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().canonicalize().unwrap();
    let p = profile(&[gt.to_str().unwrap(), "threads", d.to_str().unwrap()]);
    assert_eq!(p.source.exit_code, Some(0));
    assert_eq!((p.processes[0].threads, p.processes[0].io_threads), (9, 9));
    for k in 0..8 {
        let c = &file(&p, &d.join(format!("own{k}"))).counters;
        assert_eq!(
            (c.opens, c.writes, c.bytes_written, c.closes),
            (1, 500, 50_000, 1),
            "own{k}"
        );
    }
    let s = &file(&p, &d.join("shared")).counters;
    assert_eq!((s.writes, s.bytes_written, s.stats), (1600, 16_000, 2400));
    assert_eq!(s.hist_write[0], 1600);
}

/// strace -c counts of one syscall family.
fn strace_counts(path: &Path) -> HashMap<String, u64> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut m = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // "% time seconds usecs/call calls [errors] syscall"
        if f.len() >= 5 && f[0].parse::<f64>().is_ok() {
            let name = f[f.len() - 1].to_string();
            if name != "total" {
                m.insert(name, f[3].parse().unwrap_or(0));
            }
        }
    }
    m
}

fn family(m: &HashMap<String, u64>, names: &[&str]) -> i64 {
    names
        .iter()
        .map(|n| m.get(*n).copied().unwrap_or(0) as i64)
        .sum()
}

#[test]
fn counters_match_strace_of_the_same_run() {
    let Some(gt) = ground_truth_program() else {
        return;
    };
    if !have("strace") {
        eprintln!("SKIP: strace is not installed (scripts/setup.sh installs it)");
        return;
    }
    // Run the program under strace and the shim at once, with 0 and 5 data files. The loader,
    // libc start-up and the shim's own few calls are the same in both runs, so the difference
    // between the runs must be the same for strace and for the shim, call family by family.
    let mut shim = Vec::new();
    let mut sys = Vec::new();
    for n in ["0", "5"] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().canonicalize().unwrap();
        let out = d.join("strace.txt");
        let data = d.join("data");
        std::fs::create_dir(&data).unwrap();
        let p = profile(&[
            "strace",
            "-f",
            "-c",
            "-o",
            out.to_str().unwrap(),
            gt.to_str().unwrap(),
            "io",
            data.to_str().unwrap(),
            n,
        ]);
        assert_eq!(p.source.exit_code, Some(0));
        shim.push(under(&p, &data));
        sys.push(strace_counts(&out));
    }
    let d_shim = |f: fn(&Counters) -> u64| f(&shim[1]) as i64 - f(&shim[0]) as i64;
    let d_sys = |names: &[&str]| family(&sys[1], names) - family(&sys[0], names);
    let checks: Vec<(&str, i64, i64)> = vec![
        (
            "open",
            d_shim(|c| c.opens + c.stdio_opens + c.opendirs),
            d_sys(&["open", "openat"]),
        ),
        (
            "close",
            d_shim(|c| c.closes + c.stdio_closes),
            d_sys(&["close"]),
        ),
        (
            "write",
            d_shim(|c| c.writes + c.stdio_kernel_writes_est),
            d_sys(&["write", "pwrite64", "writev"]),
        ),
        (
            "read",
            d_shim(|c| c.reads + c.stdio_kernel_reads_est),
            d_sys(&["read", "pread64", "readv"]),
        ),
        ("sync", d_shim(|c| c.syncs), d_sys(&["fsync", "fdatasync"])),
        (
            "stat",
            d_shim(|c| c.stats),
            d_sys(&["stat", "lstat", "newfstatat", "statx"]),
        ),
        (
            "access",
            d_shim(|c| c.accesses),
            d_sys(&["access", "faccessat", "faccessat2"]),
        ),
        (
            "unlink",
            d_shim(|c| c.unlinks),
            d_sys(&["unlink", "unlinkat"]),
        ),
        (
            "rename",
            d_shim(|c| c.renames),
            d_sys(&["rename", "renameat", "renameat2"]),
        ),
        ("mkdir", d_shim(|c| c.mkdirs), d_sys(&["mkdir", "mkdirat"])),
        ("rmdir", d_shim(|c| c.rmdirs), d_sys(&["rmdir"])),
        ("lseek", d_shim(|c| c.seeks), d_sys(&["lseek"])),
    ];
    for (name, s, t) in &checks {
        assert_eq!(s, t, "{name}: shim counted {s} more calls, strace {t} more");
    }
    // And the differences are the ones the program was written to make.
    assert_eq!(checks[0].1, 5, "5 more opens");
    assert_eq!(checks[5].1, 20, "5 files x (stat, lstat, fstatat, statx)");
}

#[test]
fn a_crashing_program_still_leaves_a_usable_profile() {
    let Some(gt) = ground_truth_program() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().canonicalize().unwrap();
    let p = profile(&[gt.to_str().unwrap(), "crash", d.to_str().unwrap()]);
    assert_eq!(p.source.signal, Some(11), "SIGSEGV");
    assert_eq!(p.processes.len(), 1);
    assert_eq!(p.processes[0].ending, Ending::Unknown);
    assert!(
        p.caveats.iter().any(|c| c.contains("signal 11")),
        "{:?}",
        p.caveats
    );
    for i in 0..5 {
        let c = &file(&p, &d.join(format!("k{i}"))).counters;
        assert_eq!(
            (c.opens, c.writes, c.bytes_written, c.closes),
            (1, 1, 8, 0),
            "k{i}"
        );
    }
    let s = surge_profile::tables::summarize(&p, None);
    assert_eq!(s.table2.read_write_ops, 5);
    assert_eq!(s.table2.io_mib * 1024.0 * 1024.0, 40.0);
}

/// shared/data/darshan from the repository's neighbourhood (CI puts shared/ beside the clone).
pub fn darshan_data() -> Option<PathBuf> {
    let mut candidates = vec![];
    if let Ok(d) = std::env::var("SURGE_SHARED_DIR") {
        candidates.push(PathBuf::from(d).join("data/darshan"));
    }
    let mut here = Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf();
    while here.pop() {
        candidates.push(here.join("shared/data/darshan"));
    }
    candidates.push(PathBuf::from("/work/shared/data/darshan"));
    let found = candidates
        .into_iter()
        .find(|c| c.join("README.md").exists());
    if found.is_none() {
        eprintln!("SKIP: shared/data/darshan not found (set SURGE_SHARED_DIR)");
    }
    found
}

#[test]
fn python_workload_counts_match_darshans_and_see_the_stats_darshan_misses() {
    let Some(data) = darshan_data() else { return };
    let python = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output();
    let Ok(python) = python.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()) else {
        eprintln!("SKIP: python3 is not available");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().canonicalize().unwrap();
    let script = std::fs::read_to_string(data.join("write_read_files.py"))
        .unwrap()
        .replace("<workdir>", d.to_str().unwrap());
    let script_path = d.join("write_read_files.py");
    std::fs::write(&script_path, script).unwrap();
    let p = profile(&[&python, script_path.to_str().unwrap()]);
    assert_eq!(p.source.exit_code, Some(0));
    // Darshan's per-file counters for the same script (pydarshan_output.txt): opens, reads,
    // writes, fsyncs, seeks, bytes read, bytes written.
    let expected = [
        ("file0.bin", 3, 41, 8, 1, 8, 8_421_376, 8_388_608),
        ("file1.bin", 2, 65, 16, 1, 0, 16_777_216, 16_777_216),
        ("file2.bin", 2, 97, 24, 1, 0, 25_165_824, 25_165_824),
        ("file3.bin", 2, 129, 32, 1, 0, 33_554_432, 33_554_432),
    ];
    let listed = std::fs::read_to_string(data.join("pydarshan_output.txt")).unwrap();
    for (name, opens, reads, writes, syncs, seeks, br, bw) in expected {
        // Columns: file rank OPENS STATS READS WRITES FSYNCS SEEKS BYTES_READ BYTES_WRITTEN ...
        let row: Vec<u64> = listed
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("data/{name}")))
            .map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .take(9)
                    .filter_map(|v| v.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(
            row,
            vec![0, opens, 0, reads, writes, syncs, seeks, br, bw],
            "pydarshan_output.txt's row for {name}"
        );
        let c = &file(&p, &d.join("darshan_example/data").join(name)).counters;
        assert_eq!(
            (
                c.opens,
                c.reads,
                c.writes,
                c.syncs,
                c.seeks,
                c.bytes_read,
                c.bytes_written
            ),
            (opens, reads, writes, syncs, seeks, br, bw),
            "{name}"
        );
        // Darshan's POSIX_STATS is 0 here (its blind spot on glibc >= 2.33); the script's
        // os.stat and Python's fstat at open are real metadata calls.
        assert!(
            c.stats > opens,
            "{name}: stats {} (an fstat per open, plus os.stat)",
            c.stats
        );
    }
}
