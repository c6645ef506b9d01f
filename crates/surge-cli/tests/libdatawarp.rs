//! libdatawarp compatibility (issue 19): C and Fortran programs written for Cray DataWarp's
//! staging API, built with the system compilers against `datawarp.h` and `libdatawarp.so`, run
//! inside a real `surge run` job (real manager, servers and FUSE mounts) and stage while they
//! compute; the test then checks the bytes they staged out arrived on the "PFS".

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const DATAWARP_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../surge-datawarp");

/// The directory holding `libdatawarp.so`, built by cargo with this test (surge-datawarp is a
/// dev-dependency of surge-cli).
fn lib_dir() -> PathBuf {
    let debug = Path::new(SURGE).parent().expect("target dir");
    for d in [debug.to_path_buf(), debug.join("deps")] {
        if d.join("libdatawarp.so").exists() {
            return d;
        }
    }
    panic!(
        "libdatawarp.so is not in {} or its deps/: build it with `cargo build -p surge-datawarp`",
        debug.display()
    );
}

/// Why a compiler cannot be used, if it cannot.
fn missing(compiler: &str) -> Option<String> {
    match Command::new(compiler).arg("--version").output() {
        Ok(o) if o.status.success() => None,
        _ => Some(format!(
            "{compiler} is not installed (scripts/setup.sh installs it)"
        )),
    }
}

/// Builds a program with the system compiler, linked as a DataWarp code is (`-ldatawarp`).
fn build(compiler: &str, source: &str, out: &Path) {
    let lib = lib_dir();
    let o = Command::new(compiler)
        .arg("-O1")
        .arg("-I")
        .arg(format!("{DATAWARP_DIR}/include"))
        .arg(format!("{DATAWARP_DIR}/tests/programs/{source}"))
        .arg("-o")
        .arg(out)
        .arg("-L")
        .arg(&lib)
        .arg("-ldatawarp")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{compiler} {source}: {}", text(&o));
}

/// A job: its submit directory (the PFS side) and a private embedded fast tier.
struct Job {
    fast: Scratch,
    work: Scratch,
}

impl Job {
    fn new(tag: &str) -> Job {
        Job {
            fast: Scratch::new(&format!("dwfast-{tag}")),
            work: Scratch::new(&format!("dwwork-{tag}")),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.work.path().join(rel)
    }

    /// Runs `program PFS_DIR` as the body of a job with a 256 MiB striped instance.
    fn run(&self, program: &str) -> Output {
        let script = self.path("job.sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=256MiB\n\
                 ./{program} \"$PWD\"\n"
            ),
        )
        .unwrap();
        Command::new(SURGE)
            .current_dir(self.work.path())
            .env("SURGE_FAST_DIR", self.fast.path())
            .env("SURGE_SERVERS", "2")
            .env("SURGE_SERVER_CAPACITY", "1GiB")
            .env("SURGE_GRANULARITY", "64MiB")
            .env("SURGE_DW_VERBOSE", "1")
            .env_remove("SURGE_MANAGER")
            .env_remove("SURGE_STATE_DIR")
            .arg("run")
            .arg(&script)
            .output()
            .unwrap()
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel))
            .unwrap_or_else(|e| panic!("{rel} did not arrive on the PFS: {e}"))
    }
}

fn input(len: usize, seed: u64) -> Vec<u8> {
    let mut data = vec![0u8; len];
    Rng(seed).fill(&mut data);
    data
}

#[test]
fn a_c_program_written_for_libdatawarp_stages_while_it_computes() {
    if skip_without_fuse("a_c_program_written_for_libdatawarp_stages_while_it_computes") {
        return;
    }
    if let Some(why) = missing("cc") {
        if skip_without(
            "a_c_program_written_for_libdatawarp_stages_while_it_computes",
            &why,
        ) {
            return;
        }
    }
    let j = Job::new("c");
    let data = input(48 << 20, 19);
    std::fs::write(j.path("in.dat"), &data).unwrap();
    std::fs::create_dir_all(j.path("tree/sub")).unwrap();
    std::fs::write(j.path("tree/top.txt"), "top\n").unwrap();
    std::fs::write(j.path("tree/sub/deep.txt"), "deep\n").unwrap();
    std::fs::write(j.path("a.txt"), "a\n").unwrap();
    std::fs::write(j.path("b.txt"), "b\n").unwrap();
    // A regular file where a stage-out wants a directory: that stage fails.
    std::fs::write(j.path("blocker"), "").unwrap();
    build(
        "cc",
        "stage_while_computing.c",
        &j.path("stage_while_computing"),
    );

    let out = j.run("stage_while_computing");
    assert!(out.status.success(), "{}", text(&out));
    let report = j.read("report.txt");
    assert!(report.contains("failures 0"), "{report}");
    eprintln!("the program's report:\n{report}");

    // What the program computed from the staged-in bytes, staged out during the job.
    let hash = data
        .iter()
        .fold(0u64, |s, b| s.wrapping_mul(31).wrapping_add(u64::from(*b)));
    assert_eq!(j.read("out/sum.txt"), format!("{} {hash}\n", data.len()));
    // Deferred to the job's end: the content at the end, not when it was asked for.
    assert_eq!(j.read("out/final.txt"), "final answer\n");
    assert_eq!(j.read("out/early.txt"), "early\n");
    assert_eq!(j.read("out/dir/x.txt"), "x\n");
    assert_eq!(j.read("out/list/a.txt"), "a\n");
    assert_eq!(j.read("out/list/b.txt"), "b\n");
    assert!(
        !j.path("out/revoked.txt").exists(),
        "a revoked stage-out ran"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("stage at job end"),
        "surge run reports the deferred stage: {stderr}"
    );
}

#[test]
fn a_fortran_program_stages_through_bind_c() {
    if skip_without_fuse("a_fortran_program_stages_through_bind_c") {
        return;
    }
    if let Some(why) = missing("gfortran") {
        if skip_without("a_fortran_program_stages_through_bind_c", &why) {
            return;
        }
    }
    let j = Job::new("f");
    let data = input(24 << 20, 90);
    std::fs::write(j.path("in.dat"), &data).unwrap();
    std::fs::create_dir_all(j.path("out")).unwrap();
    build(
        "gfortran",
        "stage_while_computing.f90",
        &j.path("stage_while_computing_f"),
    );

    let out = j.run("stage_while_computing_f");
    assert!(out.status.success(), "{}", text(&out));
    let total: u64 = data.iter().map(|b| u64::from(*b)).sum();
    assert_eq!(
        j.read("out/result_f.txt").trim(),
        format!("{} {total}", data.len())
    );
    let copy = std::fs::read(j.path("out/in_copy.dat")).unwrap();
    assert!(copy == data, "the copy staged out at job end differs");
}
