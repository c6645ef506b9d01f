//! The importers on real inputs: the Darshan 3.5 logs and darshan-parser output shipped in
//! shared/data/darshan (made on this kind of machine), strace logs of the ground-truth
//! program, and the strace sample. A test whose input or tool is missing says why and skips.

use std::path::{Path, PathBuf};
use std::process::Command;
use surge_profile::import::{load, Format};
use surge_profile::model::{Counters, Profile};

fn data() -> Option<PathBuf> {
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

fn counters<'a>(p: &'a Profile, suffix: &str) -> &'a Counters {
    &p.files
        .iter()
        .find(|f| f.path.ends_with(suffix))
        .unwrap_or_else(|| panic!("no file ending in {suffix}"))
        .counters
}

/// A file and its opens, reads, writes, fsyncs, seeks, bytes read, bytes written.
type Expected = (&'static str, u64, u64, u64, u64, u64, u64, u64);

/// pydarshan_output.txt's columns for the four data files.
const PYTHON_EXPECTED: [Expected; 4] = [
    ("data/file0.bin", 3, 41, 8, 1, 8, 8_421_376, 8_388_608),
    ("data/file1.bin", 2, 65, 16, 1, 0, 16_777_216, 16_777_216),
    ("data/file2.bin", 2, 97, 24, 1, 0, 25_165_824, 25_165_824),
    ("data/file3.bin", 2, 129, 32, 1, 0, 33_554_432, 33_554_432),
];

fn check_python(p: &Profile) {
    for (f, opens, reads, writes, syncs, seeks, br, bw) in PYTHON_EXPECTED {
        let c = counters(p, f);
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
            "{f}"
        );
    }
    assert_eq!(p.processes.len(), 1);
    assert!(
        (p.wall_time_s - 0.1499).abs() < 1e-3,
        "run time {}",
        p.wall_time_s
    );
    // Darshan's blind spot is reported, not hidden.
    assert!(
        p.caveats.iter().any(|c| c.contains("no stat calls")),
        "{:?}",
        p.caveats
    );
}

#[test]
fn darshan_parser_text_gives_darshans_counters() {
    let Some(d) = data() else { return };
    let p = load(&d.join("python_write_read.parser.txt"), Format::Auto, "py").unwrap();
    check_python(&p);
    // file0: 32 reads of 256 KiB, 8 of 4 KiB, one at EOF (0 bytes); writes of exactly 1 MiB
    // fall in Darshan's 100K-1M bucket (upper edges inclusive).
    let c = counters(&p, "data/file0.bin");
    assert_eq!(c.hist_read[..5], [1, 0, 8, 0, 32]);
    assert_eq!(c.hist_write[4], 8);
    // The heatmap becomes the timeline: 0.1 s bins.
    assert_eq!(p.timeline.bin_s, 0.1);
    assert_eq!(
        p.timeline.bytes_written.iter().sum::<u64>(),
        75_188_002 + 8_698_078
    );
}

#[test]
fn a_binary_darshan_log_reads_the_same_as_its_parser_text() {
    let Some(d) = data() else { return };
    let have_parser = Command::new("darshan-parser")
        .arg("--help")
        .output()
        .is_ok();
    let have_pydarshan = Command::new("python3")
        .args(["-c", "import darshan"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !have_parser && !have_pydarshan {
        eprintln!(
            "SKIP: neither darshan-parser nor PyDarshan is installed (scripts/setup.sh installs \
             PyDarshan with pip)"
        );
        return;
    }
    let bin = load(&d.join("python_write_read.darshan"), Format::Auto, "py").unwrap();
    check_python(&bin);
    let text = load(&d.join("python_write_read.parser.txt"), Format::Auto, "py").unwrap();
    for (f, ..) in PYTHON_EXPECTED {
        let (a, b) = (counters(&bin, f), counters(&text, f));
        assert_eq!(a.hist_read, b.hist_read, "{f}");
        // Times: the text has 6 decimals, the binary full precision.
        assert!(a.read_time_ns.abs_diff(b.read_time_ns) < 2_000, "{f}");
    }
    // stat_probe.c made 5 stat + 3 lstat + 1 fstat + 1 fstatat: Darshan saw none of them.
    let probe = load(&d.join("stat_probe.darshan"), Format::Darshan, "probe").unwrap();
    assert_eq!(probe.storage_totals().stats, 0);
    assert!(probe.caveats.iter().any(|c| c.contains("no stat calls")));
}

#[test]
fn dd_and_ior_logs() {
    let Some(d) = data() else { return };
    let dd = load(&d.join("dd_write.parser.txt"), Format::Auto, "dd").unwrap();
    let c = counters(&dd, "data/dd.out");
    // 64 writes of 1 MiB and one fsync; dd dup2's the output onto stdout (not an open).
    assert_eq!(
        (c.writes, c.bytes_written, c.syncs, c.opens),
        (64, 64 << 20, 1, 1)
    );
    assert_eq!(c.hist_write[4], 64);
    let s = surge_profile::tables::summarize(&dd, None);
    assert_eq!(
        s.verdict.bound,
        surge_profile::tables::Bound::BandwidthBound,
        "{}",
        s.verdict.reason
    );
    assert_eq!(s.verdict.small_large_basis, "mean-size");

    let ior = load(&d.join("ior_mpi_np2.parser.txt"), Format::Auto, "ior").unwrap();
    assert_eq!(ior.processes.len(), 2);
    for rank in 0..2 {
        let c = counters(&ior, &format!("darshan_ior_test.0000000{rank}"));
        assert_eq!(
            (c.writes, c.reads, c.bytes_written, c.syncs),
            (64, 64, 64 << 20, 1)
        );
    }
}

#[test]
fn the_strace_sample_is_one_process_without_io() {
    let Some(d) = data() else { return };
    let p = load(&d.join("py_stat_strace.txt"), Format::Strace, "s").unwrap();
    assert_eq!(p.processes.len(), 1);
    assert_eq!(p.processes[0].pid, 21193);
    assert!(p.files.is_empty());
}

#[test]
fn strace_log_of_the_ground_truth_program_gives_its_known_counts() {
    let have = |t: &str| Command::new(t).arg("--version").output().is_ok();
    if !have("strace") || !have("cc") {
        eprintln!("SKIP: needs strace and a C compiler (scripts/setup.sh installs both)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().canonicalize().unwrap();
    let prog = d.join("ground_truth");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/ground_truth.c");
    assert!(Command::new("cc")
        .args(["-O1", "-pthread", "-o"])
        .arg(&prog)
        .arg(&src)
        .status()
        .unwrap()
        .success());
    let data = d.join("data");
    std::fs::create_dir(&data).unwrap();
    let log = d.join("trace.txt");
    let st = Command::new("strace")
        .args(["-f", "-T", "-tt", "-o"])
        .arg(&log)
        .arg(&prog)
        .arg("io")
        .arg(&data)
        .arg("5")
        .status()
        .unwrap();
    assert!(st.success());
    let p = load(&log, Format::Auto, "gt").unwrap();
    assert_eq!(p.source.kind, surge_profile::model::SourceKind::Strace);
    // The program and its forked child; the thread belongs to the program.
    assert_eq!(p.processes.len(), 2, "{:?}", p.processes);
    assert!(p
        .processes
        .iter()
        .any(|x| x.threads == 2 && x.io_threads == 2));
    let f2 = counters(&p, "data/f2");
    assert_eq!(
        (f2.opens, f2.writes, f2.bytes_written, f2.syncs, f2.closes),
        (1, 3, 12288, 1, 1)
    );
    assert_eq!((f2.stats, f2.accesses), (4, 1));
    let t = counters(&p, "data/t");
    assert_eq!(
        (t.writes, t.reads, t.bytes_read, t.seeks, t.syncs),
        (10, 5, 5000, 3, 1)
    );
    let c = counters(&p, "data/c");
    assert_eq!((c.writes, c.bytes_written), (7, 700));
    // strace sees the kernel's side of stdio: 1000 fwrite calls became 3 write calls.
    let s = counters(&p, "data/s");
    assert_eq!((s.opens, s.writes, s.bytes_written), (1, 3, 10_000));
    assert_eq!(counters(&p, "data/missing").meta_errors, 1);
    assert_eq!(
        (
            counters(&p, "data/f0").renames,
            counters(&p, "data/f1").unlinks
        ),
        (1, 1)
    );
}
