//! The interposition library (`libsurge_preload.so`, crates/surge-preload) with real programs
//! on a real mount: each runs with and without `LD_PRELOAD`, the results must be the same, and
//! the library's counters (`SURGE_PRELOAD_STATS`) must show the bytes went through it.
//! Kernel passthrough (what the library takes files from) needs root and /dev/fuse.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The library `cargo test` built (in `deps/` beside the `surge` binary: the library's own
/// test, crates/surge-preload/tests/exports.rs, makes cargo build it with the workspace).
fn library() -> PathBuf {
    let lib = Path::new(SURGE)
        .with_file_name("deps")
        .join("libsurge_preload.so");
    assert!(
        lib.exists(),
        "{} is missing: `cargo test --workspace` (or `--test exports`) builds it",
        lib.display()
    );
    lib
}

/// A one-server instance mounted by root (passthrough: its new files are one local object
/// each) and mounted again without passthrough (another node); `None`, said, without root
/// or /dev/fuse.
fn setup(test: &str) -> Option<(Cluster, Mount, Mount)> {
    if skip_without_fuse(test) || skip_without_root(test) {
        return None;
    }
    let c = cluster(1, "1GiB");
    let id = c.create_instance("512MiB", "8MiB", &[]);
    let m = Mount::new(&c, id, 0);
    let other = Mount::with_args(&c, id, 0, &["--no-passthrough"]);
    Some((c, m, other))
}

/// Library counters of the processes that ran with `stats` as their directory, summed.
fn counters(stats: &Path) -> std::collections::BTreeMap<String, u64> {
    let mut sum = std::collections::BTreeMap::new();
    for e in std::fs::read_dir(stats).unwrap().flatten() {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(e.path()).unwrap()).unwrap();
        for (k, n) in v.as_object().unwrap() {
            if k != "pid" {
                *sum.entry(k.clone()).or_insert(0) += n.as_u64().unwrap_or(0);
            }
        }
    }
    sum
}

/// `sh -c script`, with the library when `stats` is given (its counters written there);
/// panics with its output when it fails.
fn sh(script: &str, stats: Option<&Path>) -> String {
    let mut c = Command::new("sh");
    c.arg("-c").arg(script);
    if let Some(dir) = stats {
        std::fs::create_dir_all(dir).unwrap();
        c.env("LD_PRELOAD", library())
            .env("SURGE_PRELOAD_STATS", dir.join("%p.json"));
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{script} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn dd_cp_and_cat_through_the_library_write_what_the_mount_and_another_node_read() {
    let Some((_c, m, other)) =
        setup("dd_cp_and_cat_through_the_library_write_what_the_mount_and_another_node_read")
    else {
        return;
    };
    assert!(
        m.log().contains("preload socket"),
        "mount log:\n{}",
        m.log()
    );
    let scratch = Scratch::new("preload");
    let src = scratch.path().join("src");
    let mut data = vec![0u8; (10 << 20) + 12345];
    Rng(seed()).fill(&mut data);
    std::fs::write(&src, &data).unwrap();
    let stats = scratch.path().join("stats");
    let (s, d) = (src.display(), m.dir.display());
    let copy = scratch.path().join("copy");
    sh(
        &format!(
            "dd if={s} of={d}/dd1m bs=1M status=none && \
             dd if={s} of={d}/dd4k bs=4k conv=fsync status=none && \
             cp {s} {d}/cp && cat {d}/dd1m > {}",
            copy.display()
        ),
        Some(&stats),
    );
    // Without the library, on this mount and on another node after the close.
    for name in ["dd1m", "dd4k", "cp"] {
        assert!(std::fs::read(m.path(name)).unwrap() == data, "{name} here");
        assert!(
            std::fs::read(other.path(name)).unwrap() == data,
            "{name} elsewhere"
        );
        let md = std::fs::metadata(other.path(name)).unwrap();
        assert_eq!(md.len(), data.len() as u64, "{name}: size elsewhere");
    }
    assert!(
        std::fs::read(&copy).unwrap() == data,
        "cat through the library"
    );
    let n = counters(&stats);
    let size = data.len() as u64;
    assert!(n["adopted"] >= 4, "{n:?}");
    // dd's writes, and cp's copy_file_range (done by the library as reads and writes), went
    // through the library.
    assert!(
        n["write_bytes"] >= 3 * size,
        "the writes went through the library: {n:?}"
    );
    assert!(n["copies"] >= 1, "{n:?}");
    assert!(
        n["read_bytes"] >= size,
        "cat's reads went through the library: {n:?}"
    );
    assert!(n["fsyncs"] >= 1, "{n:?}");
}

#[test]
fn a_c_program_sees_the_same_file_with_and_without_the_library() {
    let Some((_c, m, other)) = setup("a_c_program_sees_the_same_file_with_and_without_the_library")
    else {
        return;
    };
    let scratch = Scratch::new("preload-c");
    let bin = scratch.path().join("semantics");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/preload/semantics.c");
    let cc = Command::new("cc")
        .args(["-O1", "-Wall", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("run cc");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let stats = scratch.path().join("stats");
    let with = sh(
        &format!("{} {}/with", bin.display(), m.dir.display()),
        Some(&stats),
    );
    let without = sh(
        &format!("{} {}/without", bin.display(), m.dir.display()),
        None,
    );
    // Adopted at the first fsync instead of at the open (SURGE_PRELOAD_ADOPT=fsync).
    let lazy_stats = scratch.path().join("lazy-stats");
    let lazy = sh(
        &format!(
            "SURGE_PRELOAD_ADOPT=fsync {} {}/lazy",
            bin.display(),
            m.dir.display()
        ),
        Some(&lazy_stats),
    );
    assert_eq!(
        (with.as_str(), without.as_str(), lazy.as_str()),
        ("ok\n", "ok\n", "ok\n")
    );
    let a = std::fs::read(other.path("with")).unwrap();
    let b = std::fs::read(other.path("without")).unwrap();
    let c = std::fs::read(other.path("lazy")).unwrap();
    assert_eq!(a.len(), 21012);
    assert!(a == b && b == c, "the runs left different files");
    let l = counters(&lazy_stats);
    assert!(l["adopted"] >= 1 && l["fsyncs"] >= 1, "{l:?}");
    let n = counters(&stats);
    assert!(
        n["adopted"] >= 2 && n["writes"] >= 3 && n["fsyncs"] >= 1,
        "{n:?}"
    );
    // The mmap went to the kernel (the fork then gave every descriptor back to it).
    assert!(n["forwarded"] >= 1, "{n:?}");
}

#[test]
fn fsx_through_the_library() {
    let Some((_c, m, _other)) = setup("fsx_through_the_library") else {
        return;
    };
    let Some(fsx) = tool("fsx") else {
        return;
    };
    // -E: fsx makes copy_file_range a raw system call, which no interposition library sees;
    // the kernel then copies by the size it cached before this process's writes
    // (docs/DATAPLANE.md, "The preload path").
    let scratch = Scratch::new("preload-fsx");
    let stats = scratch.path().join("stats");
    let file = m.path("fsx.dat");
    sh(
        &format!("{} -q -E -N 20000 -S 7 {}", fsx.display(), file.display()),
        Some(&stats),
    );
    let n = counters(&stats);
    assert!(
        n["adopted"] >= 1 && n["writes"] > 0 && n["reads"] > 0,
        "{n:?}"
    );
}

/// The socket answers only the mount's user and root: another user's connection is closed
/// unanswered (docs/SECURITY.md, "The preload socket").
#[test]
fn the_preload_socket_answers_no_other_user() {
    let Some((_c, m, _other)) = setup("the_preload_socket_answers_no_other_user") else {
        return;
    };
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(&m.dir).unwrap().dev();
    let name = surge_proto::preload::socket_name(dev);
    let probe = format!(
        "import socket\n\
         s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n\
         s.connect(b'\\0{name}')\n\
         try:\n\
         \x20   s.send(bytes([{op}]) + bytes(8))\n\
         \x20   print(len(s.recv(64)))\n\
         except ConnectionError:\n\
         \x20   print(0)\n",
        op = surge_proto::preload::SYNC
    );
    let run = |uid: Option<&str>| {
        let mut c = match uid {
            Some(u) => {
                let mut c = Command::new("setpriv");
                c.args([
                    &format!("--reuid={u}"),
                    &format!("--regid={u}"),
                    "--clear-groups",
                    "/usr/bin/python3",
                ]);
                c
            }
            None => Command::new("/usr/bin/python3"),
        };
        let out = c.arg("-c").arg(&probe).output().unwrap();
        assert!(
            out.status.success(),
            "{}\nmount log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            m.log()
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    // Root (the mount's user) gets an answer (EBADF: that inode is not open here).
    assert_eq!(run(None), surge_proto::preload::ANSWER_LEN.to_string());
    assert_eq!(
        run(Some("65534")),
        "0",
        "nobody's connection is closed unanswered"
    );
}

/// `SURGE_CLIENT=preload surge run job.sh`: the job's programs run with the library (found
/// next to `surge`), and what they write is the job's data.
#[test]
fn surge_run_gives_a_job_the_library_when_asked() {
    let test = "surge_run_gives_a_job_the_library_when_asked";
    if skip_without_fuse(test) || skip_without_root(test) {
        return;
    }
    let lib = library();
    let fast = Scratch::new("preload-run-fast");
    let work = Scratch::new("preload-run");
    let stats = work.path().join("stats");
    std::fs::create_dir_all(&stats).unwrap();
    let script = work.path().join("job.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\n\
             #DW jobdw type=scratch access_mode=striped capacity=256MiB\n\
             set -e\n\
             case \"$LD_PRELOAD\" in *libsurge_preload.so*) ;; *) echo \"no library: $LD_PRELOAD\"; exit 3 ;; esac\n\
             export SURGE_PRELOAD_STATS={}/%p.json\n\
             dd if=/dev/zero of=$DW_JOB_STRIPED/f bs=1M count=8 conv=fsync status=none\n\
             test $(stat -c %s $DW_JOB_STRIPED/f) = 8388608\n",
            stats.display()
        ),
    )
    .unwrap();
    let out = Command::new(SURGE)
        .current_dir(work.path())
        .env("SURGE_CLIENT", "preload")
        .env("SURGE_FAST_DIR", fast.path())
        .env("SURGE_SERVERS", "2")
        .env("SURGE_SERVER_CAPACITY", "1GiB")
        .env("SURGE_GRANULARITY", "64MiB")
        .env_remove("SURGE_MANAGER")
        .env_remove("SURGE_STATE_DIR")
        .env_remove("LD_PRELOAD")
        .arg("run")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{} ({}):\n{}{}",
        script.display(),
        lib.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let n = counters(&stats);
    assert!(
        n.get("write_bytes").copied().unwrap_or(0) >= 8 << 20,
        "{n:?}"
    );
}

/// The project's tool directory (`scripts/setup.sh` installs pjdfstest and builds fsstress
/// into it).
fn tool(name: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.tools/bin")
        .join(name);
    if p.exists() {
        return Some(p);
    }
    // pjdfstest is always installed by `make setup`; fsx and fsstress only where
    // ../shared/tools/fs-suites is (tests/fs_suites.rs says the same).
    assert!(
        name != "pjdfstest",
        "{} is missing: run `make setup`",
        p.display()
    );
    skip_without(
        &format!("{name} through the library"),
        &format!("{} is absent (make setup builds it)", p.display()),
    );
    None
}

/// pjdfstest (POSIX conformance, the whole Rust suite in one process) with the library on a
/// passthrough mount: the same 0 failures as without it (tests/fs_suites.rs), and the library
/// took files (it adopts every passthrough file pjdfstest opens for writing).
#[test]
fn pjdfstest_through_the_library() {
    let Some((_c, m, _other)) = setup("pjdfstest_through_the_library") else {
        return;
    };
    let Some(pjd) = tool("pjdfstest") else {
        return;
    };
    let scratch = Scratch::new("preload-pjd");
    let conf = scratch.path().join("pjd.toml");
    write_pjdfstest_conf(&conf);
    let dir = m.path("pjd");
    std::fs::create_dir(&dir).unwrap();
    let stats = scratch.path().join("stats");
    std::fs::create_dir_all(&stats).unwrap();
    let out = Command::new(pjd)
        .arg("-c")
        .arg(&conf)
        .arg("-p")
        .arg(&dir)
        .current_dir(&dir)
        .env("LD_PRELOAD", library())
        .env("SURGE_PRELOAD_STATS", stats.join("%p.json"))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let summary = text
        .lines()
        .find(|l| l.starts_with("Summary:"))
        .unwrap_or_else(|| panic!("pjdfstest printed no summary:\n{text}"));
    let failed: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_end().ends_with("FAILED"))
        .collect();
    assert!(
        summary.starts_with("Summary: 0 failed"),
        "pjdfstest through the library: {summary}\n{}",
        failed.join("\n")
    );
    let n = counters(&stats);
    assert!(
        n.get("adopted").copied().unwrap_or(0) > 0,
        "the library took no file: {n:?}"
    );
    eprintln!("pjdfstest through the library: {summary}; library counters {n:?}");
}

/// The whole of a file up to 16 MiB, else its first and last MiB (fsstress leaves sparse
/// files of gigabytes: reading their holes through two mounts takes minutes).
fn sample(path: &Path, size: u64) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).unwrap();
    let mut out = Vec::new();
    if size <= 16 << 20 {
        f.read_to_end(&mut out).unwrap();
        return out;
    }
    let mut part = vec![0u8; 1 << 20];
    f.read_exact(&mut part).unwrap();
    out.extend_from_slice(&part);
    f.seek(SeekFrom::Start(size - (1 << 20))).unwrap();
    f.read_exact(&mut part).unwrap();
    out.extend_from_slice(&part);
    out
}

/// fsstress (namespace and data operations from 4 processes) with the library: it finishes
/// without an error, everything it left reads back without it, and the library moved bytes.
#[test]
fn fsstress_through_the_library() {
    let Some((c, m, other)) = setup("fsstress_through_the_library") else {
        return;
    };
    let Some(fsstress) = tool("fsstress") else {
        return;
    };
    let scratch = Scratch::new("preload-fsstress");
    let stats = scratch.path().join("stats");
    std::fs::create_dir_all(&stats).unwrap();
    let dir = m.path("stress");
    std::fs::create_dir(&dir).unwrap();
    let started = std::time::Instant::now();
    let out = Command::new(&fsstress)
        .arg("-d")
        .arg(&dir)
        .args(["-n", "1000", "-p", "4", "-s", "1"])
        .env("LD_PRELOAD", library())
        .env("SURGE_PRELOAD_STATS", stats.join("%p.json"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "fsstress through the library failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("fsstress ran {:?}", started.elapsed());
    // Everything it left is there, and reads the same here and on the other node.
    let mut files = 0;
    let mut stack = vec![std::path::PathBuf::from("stress")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(m.dir.join(&d)).unwrap() {
            let e = e.unwrap();
            let rel = d.join(e.file_name());
            let md = std::fs::symlink_metadata(e.path()).unwrap();
            if md.is_dir() {
                stack.push(rel);
            } else if md.is_file() {
                let there = other.dir.join(&rel);
                let size = md.len();
                assert_eq!(
                    std::fs::metadata(&there).unwrap().len(),
                    size,
                    "{}: size on the other node",
                    rel.display()
                );
                assert!(
                    sample(&e.path(), size) == sample(&there, size),
                    "{} differs on the other node",
                    rel.display()
                );
                files += 1;
            }
        }
    }
    assert!(files > 0, "fsstress left no file");
    let n = counters(&stats);
    assert!(
        n.get("write_bytes").copied().unwrap_or(0) > 0,
        "no byte went through the library: {n:?}"
    );
    let logs = c.server_logs();
    assert!(!logs.contains("ERROR"), "a server logged an error:\n{logs}");
    eprintln!("fsstress -p 4 -n 1000 through the library: {files} files, counters {n:?}");
}
