//! Two compute nodes that share no kernel file (issue 32, item 4): two mounts of one striped
//! instance with every file striped over every fragment and nothing passed through to a local
//! object, so what one node learns of the other's work comes only through the servers. Locks
//! (fcntl, flock, OFD), `O_APPEND`, readers of a file saved by write-then-rename, and SQLite.

mod common;
use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A compute node: a mount that stripes every file over every fragment and passes nothing
/// through (no object file of this host is shared with the other mount's kernel).
fn node(c: &Cluster, id: u64) -> Mount {
    Mount::with_args(
        c,
        id,
        0,
        &["--no-passthrough", "--layout", "stripe_count=all"],
    )
}

/// Three servers, one instance striped over them in 64 KiB stripes, two nodes.
fn two_nodes() -> (Cluster, Mount, Mount) {
    let c = cluster(3, "1GiB");
    let id = c.create_instance("2GiB", "64KiB", &[]);
    let a = node(&c, id);
    let b = node(&c, id);
    (c, a, b)
}

/// True (after saying why) when `tool` is not installed: the test cannot run here.
fn missing(test: &str, tool: &str) -> bool {
    let there = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    !there && skip_without(test, &format!("`{tool}` is not installed"))
}

/// The lock client the tests run as separate processes (a process is a POSIX lock owner):
/// `lock.py PATH KIND OP` with KIND `posix`, `flock` or `ofd` and OP
/// - `try`: a non-blocking exclusive lock of the whole file; prints `got` or `busy`;
/// - `hold`: takes it (blocking), prints `held`, then sleeps until killed;
/// - `wait`: takes it blocking, prints `got <unix time>`;
/// - `wait-alarm`: as `wait`, with SIGALRM after 1 s interrupting the wait: prints
///   `interrupted <seconds waited>` (or `got`).
const LOCK_PY: &str = r#"
import errno, fcntl, os, signal, struct, sys, time
path, kind, op = sys.argv[1], sys.argv[2], sys.argv[3]
fd = os.open(path, os.O_RDWR)
F_OFD_SETLK, F_OFD_SETLKW = 37, 38
def lock(block):
    if kind == "posix":
        fcntl.lockf(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
    elif kind == "flock":
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
    else:
        fcntl.fcntl(fd, F_OFD_SETLKW if block else F_OFD_SETLK,
                    struct.pack("hhxxxxqqixxxx", fcntl.F_WRLCK, 0, 0, 0, 0))
if op == "try":
    try:
        lock(False)
        print("got", flush=True)
    except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        print("busy", flush=True)
elif op == "hold":
    lock(True)
    print("held", flush=True)
    while True:
        time.sleep(60)
elif op == "wait":
    lock(True)
    print("got %.6f" % time.time(), flush=True)
elif op == "wait-alarm":
    class Alarm(Exception):
        pass
    def ring(*_):
        raise Alarm()
    signal.signal(signal.SIGALRM, ring)
    t0 = time.time()
    signal.alarm(1)
    try:
        lock(True)
        print("got", flush=True)
    except Alarm:
        print("interrupted %.3f" % (time.time() - t0), flush=True)
"#;

struct LockClient(Child);

impl LockClient {
    fn spawn(path: &std::path::Path, kind: &str, op: &str) -> LockClient {
        LockClient(
            Command::new("python3")
                .args(["-c", LOCK_PY])
                .arg(path)
                .args([kind, op])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("python3"),
        )
    }

    /// The first line the client prints.
    fn line(&mut self) -> String {
        let out = self.0.stdout.as_mut().expect("stdout");
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line).expect("read");
        line.trim().to_string()
    }

    fn run(path: &std::path::Path, kind: &str, op: &str) -> String {
        let mut c = LockClient::spawn(path, kind, op);
        let l = c.line();
        let _ = c.0.wait();
        l
    }
}

impl Drop for LockClient {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn fcntl_flock_and_ofd_locks_exclude_across_nodes_and_wake_waiters() {
    let test = "fcntl_flock_and_ofd_locks_exclude_across_nodes_and_wake_waiters";
    if skip_without_fuse(test) || missing(test, "python3") {
        return;
    }
    let (_c, a, b) = two_nodes();
    std::fs::write(a.path("lockfile"), b"x").unwrap();
    for kind in ["posix", "flock", "ofd"] {
        let mut holder = LockClient::spawn(&a.path("lockfile"), kind, "hold");
        assert_eq!(holder.line(), "held", "{kind}");
        assert_eq!(
            LockClient::run(&b.path("lockfile"), kind, "try"),
            "busy",
            "{kind}: a lock held on node A must refuse node B's non-blocking lock"
        );
        assert_eq!(
            LockClient::run(&a.path("lockfile"), kind, "try"),
            "busy",
            "{kind}: and another process of node A's"
        );
        // A blocking lock on B waits for A's release, and gets the lock soon after it.
        let mut waiter = LockClient::spawn(&b.path("lockfile"), kind, "wait");
        holds_for(
            &format!("{kind}: B's blocking lock waits while A holds the lock"),
            Duration::from_millis(800),
            || {
                let st = waiter.0.try_wait().unwrap();
                check(st.is_none(), || format!("it returned: {st:?}"))
            },
        );
        let released = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        drop(holder);
        let got = waiter.line();
        let at: f64 = got
            .strip_prefix("got ")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{kind}: waiter said {got:?}"));
        let latency = at - released;
        eprintln!(
            "{kind}: B's wait ended {:.1} ms after A's release",
            latency * 1e3
        );
        assert!(latency < 2.0, "{kind}: {latency} s from release to grant");
        drop(waiter);
        assert_eq!(LockClient::run(&a.path("lockfile"), kind, "try"), "got");
    }
}

/// A lock outlives a restart of the metadata server (kill -9, started again on its
/// directories): the mount that held it reclaims it when its lock keeper reconnects, and the
/// restarted server grants only reclaims during its grace period, so the other node never
/// gets a lock that was held; once the holder lets go, it does.
#[test]
fn a_lock_held_across_a_restart_of_the_metadata_server_still_excludes() {
    let test = "a_lock_held_across_a_restart_of_the_metadata_server_still_excludes";
    if skip_without_fuse(test) || missing(test, "python3") {
        return;
    }
    let (mut c, a, b) = two_nodes();
    std::fs::write(a.path("lockfile"), b"x").unwrap();
    let mut holder = LockClient::spawn(&a.path("lockfile"), "posix", "hold");
    assert_eq!(holder.line(), "held");
    assert_eq!(LockClient::run(&b.path("lockfile"), "posix", "try"), "busy");
    // Namespace 0's metadata server is the instance's first fragment's.
    c.servers[0]
        .extra
        .extend(["--lock-grace".to_string(), "2".to_string()]);
    c.servers[0].restart();
    let back = Instant::now();
    holds_for(
        "node B's lock refused while node A holds it, through the grace period and after",
        Duration::from_secs(4),
        || {
            let said = LockClient::run(&b.path("lockfile"), "posix", "try");
            check(said == "busy", || {
                format!(
                    "B got the lock {:?} after the restart; A's mount log:\n{}",
                    back.elapsed(),
                    a.log()
                )
            })
        },
    );
    assert!(
        a.log().contains("1 lock(s) of this node reclaimed, 0 lost"),
        "A's mount log:\n{}",
        a.log()
    );
    drop(holder);
    wait_for(
        "node B's lock once A let go",
        Duration::from_secs(10),
        || (LockClient::run(&b.path("lockfile"), "posix", "try") == "got").then_some(()),
    );
}

#[test]
fn a_blocked_lock_wait_is_interrupted_by_a_signal() {
    let test = "a_blocked_lock_wait_is_interrupted_by_a_signal";
    if skip_without_fuse(test) || missing(test, "python3") {
        return;
    }
    let (_c, a, b) = two_nodes();
    std::fs::write(a.path("lockfile"), b"x").unwrap();
    let mut holder = LockClient::spawn(&a.path("lockfile"), "posix", "hold");
    assert_eq!(holder.line(), "held");
    let t = Instant::now();
    let said = LockClient::run(&b.path("lockfile"), "posix", "wait-alarm");
    assert!(said.starts_with("interrupted"), "B's wait: {said:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // The interrupted wait left nothing behind: once A lets go, B locks at once.
    drop(holder);
    assert_eq!(LockClient::run(&b.path("lockfile"), "posix", "try"), "got");
}

#[test]
fn locks_of_a_killed_mount_are_released() {
    let test = "locks_of_a_killed_mount_are_released";
    if skip_without_fuse(test) || missing(test, "python3") {
        return;
    }
    let (_c, mut a, b) = two_nodes();
    std::fs::write(a.path("lockfile"), b"x").unwrap();
    let mut holder = LockClient::spawn(&a.path("lockfile"), "posix", "hold");
    assert_eq!(holder.line(), "held");
    assert_eq!(LockClient::run(&b.path("lockfile"), "posix", "try"), "busy");
    // Node A dies (its mount process), its lock holder still running.
    let mut child = a.child.take().expect("mount process");
    child.kill().unwrap();
    child.wait().unwrap();
    let t = Instant::now();
    loop {
        if LockClient::run(&b.path("lockfile"), "posix", "try") == "got" {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the dead node's lock is still held"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("lock of the killed mount released after {:?}", t.elapsed());
    drop(holder);
    a.child = None;
}

/// Lines of [`LINE`] bytes: `tag writer index` and padding.
const LINE: usize = 48;

fn line(tag: char, writer: usize, i: usize) -> String {
    let head = format!("{tag}{writer} {i:06} ");
    format!("{head}{}\n", "x".repeat(LINE - head.len() - 1))
}

#[test]
fn appends_from_two_nodes_lose_no_line() {
    let test = "appends_from_two_nodes_lose_no_line";
    if skip_without_fuse(test) {
        return;
    }
    let (_c, a, b) = two_nodes();
    appends_lose_no_line(&a, &b);
}

/// A file of one stripe: one node appends by kernel passthrough straight into its object (what
/// a job's node makes of its own files), the other through its server (a node of another host,
/// or one that cannot pass it through). Appends from both land one after another: the server
/// appends at the object's end as the kernel does (before, the metadata server placed the
/// second node's appends at a size that did not count the first node's, over its lines).
#[test]
fn appends_to_a_file_passed_through_on_one_node_and_not_on_the_other_lose_no_line() {
    let test = "appends_to_a_file_passed_through_on_one_node_and_not_on_the_other_lose_no_line";
    if skip_without_fuse(test) || skip_without_root(test) {
        return;
    }
    let c = cluster(2, "1GiB");
    let id = c.create_instance("2GiB", "64KiB", &[]);
    let a = Mount::with_args(&c, id, 0, &["--layout", "stripe_count=1"]);
    let b = Mount::with_args(&c, id, 0, &["--no-passthrough"]);
    appends_lose_no_line(&a, &b);
    // Node a's opens were passed through: its appends never reached its daemon; node b's
    // went to the object's server.
    let (ra, rb) = (a.requests(), b.requests());
    let n = |r: &std::collections::BTreeMap<String, u64>, k: &str| r.get(k).copied().unwrap_or(0);
    assert_eq!(
        n(&ra, "Append") + n(&ra, "AppendObject"),
        0,
        "node a: {ra:?}"
    );
    assert_eq!(n(&rb, "Append"), 0, "node b: {rb:?}");
    assert!(n(&rb, "AppendObject") >= 3000, "node b: {rb:?}");
}

/// Two writers on each of nodes `a` and `b` append lines to one file with `O_APPEND`; every
/// line is there once, whole, in each writer's order, as both nodes read it.
fn appends_lose_no_line(a: &Mount, b: &Mount) {
    std::fs::write(a.path("log"), b"").unwrap();
    const PER_WRITER: usize = 1500;
    let mut threads = Vec::new();
    for (tag, m) in [('a', a), ('b', b)] {
        for w in 0..2 {
            let path = m.path("log");
            threads.push(std::thread::spawn(move || {
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .unwrap();
                for i in 0..PER_WRITER {
                    let l = line(tag, w, i);
                    // One write(2) per line: a short write would split it.
                    assert_eq!(f.write(l.as_bytes()).unwrap(), LINE);
                }
            }));
        }
    }
    for t in threads {
        t.join().unwrap();
    }
    for m in [a, b] {
        let mut text = String::new();
        std::fs::File::open(m.path("log"))
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        // Each writer's lines, in the order they are in the file.
        let mut seen: std::collections::HashMap<String, Vec<usize>> = Default::default();
        let mut bad = 0;
        for l in text.split_inclusive('\n') {
            let mut parts = l.split(' ');
            let (Some(who), Some(i)) = (parts.next(), parts.next()) else {
                bad += 1;
                continue;
            };
            if l.len() != LINE || !l.ends_with('\n') {
                bad += 1;
                continue;
            }
            match i.parse::<usize>() {
                Ok(i) => seen.entry(who.to_string()).or_default().push(i),
                Err(_) => bad += 1,
            }
        }
        let total: usize = seen.values().map(Vec::len).sum();
        eprintln!(
            "{:?}: {total} of {} lines whole, {} lost, {bad} torn, {} bytes",
            m.dir,
            4 * PER_WRITER,
            (4 * PER_WRITER).saturating_sub(total),
            text.len()
        );
        assert_eq!(bad, 0, "torn or overwritten lines");
        assert_eq!(total, 4 * PER_WRITER, "lines lost");
        for (who, got) in &seen {
            assert!(
                got.iter().copied().eq(0..PER_WRITER),
                "{who}: its lines are not all there in the order it wrote them"
            );
        }
    }
}

#[test]
fn a_file_replaced_by_rename_on_one_node_is_never_stale_on_the_other() {
    let test = "a_file_replaced_by_rename_on_one_node_is_never_stale_on_the_other";
    if skip_without_fuse(test) {
        return;
    }
    let (_c, a, b) = two_nodes();
    std::fs::write(a.path("target"), format!("{:08}\n", 0)).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (dir, stop) = (a.dir.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let tmp = dir.join("target.tmp");
                std::fs::write(&tmp, format!("{n:08}\n").repeat(512)).unwrap();
                std::fs::rename(&tmp, dir.join("target")).unwrap();
            }
            n
        })
    };
    let (mut reads, mut stale, mut other) = (0u64, 0u64, Vec::new());
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) {
        let r = std::fs::File::open(b.path("target")).and_then(|mut f| {
            let mut s = String::new();
            f.read_to_string(&mut s)?;
            let len = f.metadata()?.len();
            Ok((s, len))
        });
        match r {
            Ok((s, len)) => {
                reads += 1;
                // Whole versions only: the file is written before it is renamed into place.
                let first = s.lines().next().unwrap_or("").to_string();
                assert!(
                    s.len() == 9 || s == format!("{first}\n").repeat(512),
                    "a read mixed versions ({} bytes)",
                    s.len()
                );
                let _ = len;
            }
            Err(e) if e.raw_os_error() == Some(libc::ESTALE) => stale += 1,
            Err(e) => other.push(e.to_string()),
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let saves = writer.join().unwrap();
    eprintln!("{saves} saves on A, {reads} reads on B, {stale} ESTALE, {other:?}");
    assert_eq!(stale, 0, "ESTALE on the reading node");
    assert!(other.is_empty(), "{other:?}");
}

/// `sqlite3 DB` with `script` on stdin; its output.
fn sqlite(db: &std::path::Path, script: &str) -> std::process::Child {
    // SURGE_TEST_STRACE=FILE: each sqlite3 runs under `strace -f -o FILE.<pid>`.
    let mut cmd = match std::env::var("SURGE_TEST_STRACE") {
        Ok(f) => {
            let mut c = Command::new("strace");
            c.args(["-ff", "-o", &f, "sqlite3"]);
            c
        }
        Err(_) => Command::new("sqlite3"),
    };
    let mut c = cmd
        .arg(db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sqlite3");
    c.stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    c
}

fn sqlite_done(c: Child, logs: &[&Mount]) -> String {
    let o = c.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() || !err.trim().is_empty() {
        for m in logs {
            eprintln!("log of the mount at {:?}:\n{}", m.dir, m.log());
        }
        panic!("sqlite3: {}", text(&o));
    }
    String::from_utf8_lossy(&o.stdout).to_string()
}

#[test]
fn sqlite_in_rollback_mode_written_from_two_nodes_stays_whole() {
    let test = "sqlite_in_rollback_mode_written_from_two_nodes_stays_whole";
    if skip_without_fuse(test) || missing(test, "sqlite3") {
        return;
    }
    let (_c, a, b) = two_nodes();
    sqlite_done(
        sqlite(
            &a.path("db"),
            "PRAGMA journal_mode=delete; CREATE TABLE t(node TEXT, i INTEGER, pad TEXT);\n",
        ),
        &[&a],
    );
    const ROWS: usize = 300;
    let script = |node: &str| {
        let mut s = String::from(".timeout 60000\n");
        for i in 0..ROWS {
            s.push_str(&format!(
                "INSERT INTO t VALUES('{node}', {i}, hex(randomblob(200)));\n"
            ));
        }
        s
    };
    let t = Instant::now();
    let (ca, cb) = (
        sqlite(&a.path("db"), &script("a")),
        sqlite(&b.path("db"), &script("b")),
    );
    sqlite_done(ca, &[&a, &b]);
    sqlite_done(cb, &[&a, &b]);
    eprintln!("{} inserts from two nodes in {:?}", 2 * ROWS, t.elapsed());
    for m in [&a, &b] {
        let out = sqlite_done(sqlite(
            &m.path("db"),
            "PRAGMA integrity_check;\nSELECT node, count(*), count(DISTINCT i) FROM t GROUP BY node;\n",
        ), &[m]);
        assert_eq!(
            out,
            format!("ok\na|{ROWS}|{ROWS}\nb|{ROWS}|{ROWS}\n"),
            "on {:?}",
            m.dir
        );
    }
}

/// MPI-IO with ROMIO's data sieving (`romio_ds_write=enable`) from two nodes: each of two
/// ranks writes every other 4 KiB block of one file, 30 rounds, through a strided view;
/// ROMIO writes each round by reading the whole extent, changing its blocks and writing it
/// back under an fcntl lock. Every block must hold its rank's last round: a lock not
/// coordinated between the nodes, or a read under the lock served from a stale cache, loses
/// the other rank's blocks (tests/mpi/romio_sieve.c counts them).
#[test]
fn romio_data_sieving_from_two_nodes_loses_no_block() {
    let test = "romio_data_sieving_from_two_nodes_loses_no_block";
    if skip_without_fuse(test) || missing(test, "mpicc") || missing(test, "mpirun") {
        return;
    }
    let scratch = Scratch::new("romio");
    let prog = scratch.path().join("romio_sieve");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mpi/romio_sieve.c");
    let cc = Command::new("mpicc")
        .args(["-O1", "-o"])
        .arg(&prog)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "mpicc: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let (_c, a, b) = two_nodes();
    let mut mpirun = Command::new("mpirun");
    if surge_testkit::is_root() {
        mpirun.arg("--allow-run-as-root");
    }
    let out = mpirun
        .args(["--oversubscribe", "-np", "2", "--mca", "io", "romio321"])
        .arg(&prog)
        .arg(a.path("shared.dat"))
        .arg(b.path("shared.dat"))
        .env_remove("ROMIO_HINTS")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && text.contains("blocks 128 wrong 0"),
        "ROMIO data sieving from two nodes: {text}\nnode A:\n{}\nnode B:\n{}",
        a.log(),
        b.log()
    );
    eprintln!("{}", text.trim());
}

/// Node A writes a file and dies before closing it (its mount process killed). Its writes
/// reached the servers (`write(2)` returned), so nothing it acknowledged is lost: the next
/// open on another node finds the size recovered from the objects, the bytes as A wrote
/// them, and a later extension over them reads them too (before: the size stayed as last
/// committed, 0, so A's bytes were unseen, held space until the instance went, and showed up
/// in the "hole" of the first node that extended the file over them).
#[test]
fn a_killed_writers_acknowledged_bytes_are_recovered_at_the_next_open() {
    let test = "a_killed_writers_acknowledged_bytes_are_recovered_at_the_next_open";
    if skip_without_fuse(test) {
        return;
    }
    let (_c, a, b) = two_nodes();
    killed_writer_is_recovered(a, &b, 3 * 64 * 1024 + 100);
}

/// The same with the writer's file passed through to its kernel (a root mount on the servers'
/// host: the default job's path), and another mount reading it.
#[test]
fn a_killed_passthrough_writers_bytes_are_recovered_at_the_next_open() {
    let test = "a_killed_passthrough_writers_bytes_are_recovered_at_the_next_open";
    if skip_without_fuse(test) || skip_without_root(test) {
        return;
    }
    let c = cluster(1, "1GiB");
    let id = c.create_instance("1GiB", "1MiB", &[]);
    let a = Mount::new(&c, id, 0);
    let b = Mount::with_args(&c, id, 0, &["--no-passthrough"]);
    killed_writer_is_recovered(a, &b, 5 * 1024 * 1024 + 7);
}

/// `a` writes `len` bytes into a new file, another into a file it closes, and a third it
/// only opens; `a` is killed with the first still open; `b` then sees the first recovered
/// (and asks its objects), the second as it was closed and the third empty.
fn killed_writer_is_recovered(mut a: Mount, b: &Mount, len: usize) {
    use std::os::unix::fs::FileExt;
    let body: Vec<u8> = (0..len).map(|i| b'a' + (i % 23) as u8).collect();
    std::fs::write(a.path("closed"), b"closed before the crash\n").unwrap();
    let mut open = std::fs::File::create(a.path("open")).unwrap();
    open.write_all(&body).unwrap();
    let _untouched = std::fs::File::create(a.path("untouched")).unwrap();
    assert_eq!(
        std::fs::metadata(b.path("open")).unwrap().len(),
        0,
        "committed so far"
    );
    let mut child = a.child.take().expect("mount process");
    child.kill().unwrap();
    child.wait().unwrap();
    drop(open);
    // The metadata server marks A's files when A's connections go; the kernel closes them
    // as the process dies, and the server sees it a moment later.
    let before = b.requests();
    let t = Instant::now();
    let got = loop {
        let got = std::fs::read(b.path("open")).unwrap();
        if got.len() == len || t.elapsed() > Duration::from_secs(10) {
            break got;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(got.len(), len, "size after the writer's crash");
    assert!(
        got == body,
        "the recovered bytes differ from what was written"
    );
    let reqs = b.requests();
    let n = |r: &std::collections::BTreeMap<String, u64>, k: &str| r.get(k).copied().unwrap_or(0);
    assert_eq!(
        n(&reqs, "Recovered") - n(&before, "Recovered"),
        1,
        "{reqs:?}"
    );
    // Recovered once: the next open asks nothing of the objects.
    let asked = n(&reqs, "ObjectLength");
    assert_eq!(std::fs::read(b.path("open")).unwrap().len(), len);
    assert_eq!(n(&b.requests(), "ObjectLength"), asked);
    // An extension past the end reads A's bytes, then zeros, then the new byte.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(b.path("open"))
        .unwrap();
    f.write_all_at(b"B", len as u64 + 99).unwrap();
    drop(f);
    let got = std::fs::read(b.path("open")).unwrap();
    assert_eq!(got.len(), len + 100);
    assert!(got[..len] == body[..]);
    assert!(got[len..len + 99].iter().all(|&x| x == 0));
    assert_eq!(got[len + 99], b'B');
    assert_eq!(
        std::fs::read(b.path("closed")).unwrap(),
        b"closed before the crash\n"
    );
    assert_eq!(std::fs::metadata(b.path("untouched")).unwrap().len(), 0);
    a.child = None;
}

/// Bytes of the instance in use, as `df` on mount `m` shows them.
fn used(m: &Mount) -> u64 {
    used_bytes(&m.dir)
}

/// `n` servers whose `--orphan-grace` is 1 s, an instance over them in 64 KiB stripes (its
/// id), and two nodes on it.
fn nodes_with_a_short_orphan_grace(n: usize) -> (Cluster, u64, Mount, Mount) {
    let c = Cluster::start_with(
        std::path::Path::new(SURGE),
        n,
        "1GiB",
        &["--orphan-grace", "1"],
    );
    let id = c.create_instance("1GiB", "64KiB", &[]);
    let a = node(&c, id);
    let b = node(&c, id);
    (c, id, a, b)
}

/// Kills the mount process of `m` (as a lost node's).
fn kill_mount(m: &mut Mount) {
    let mut child = m.child.take().expect("mount process");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A mount killed while it holds unlinked files open (one removed while open, one made with
/// `O_TMPFILE`) does not keep their space until the instance is destroyed: once the servers'
/// `--orphan-grace` is over, another mount of the namespace removes their data. The control:
/// while the holder lives, its files keep their data past that grace.
#[test]
fn unlinked_files_a_killed_mount_held_open_give_their_space_back() {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let test = "unlinked_files_a_killed_mount_held_open_give_their_space_back";
    if skip_without_fuse(test) {
        return;
    }
    let (c, _, mut a, b) = nodes_with_a_short_orphan_grace(3);
    // B makes files in a directory of its own: it waits for lease recalls, as such a mount does.
    std::fs::create_dir(b.path("bdir")).unwrap();
    std::fs::write(b.path("bdir/x"), b"x").unwrap();
    let base = used(&b);
    const MIB: u64 = 1 << 20;
    let (held, body) = unlinked_open_file(&a.path("held"), 4 * MIB as usize);
    let tmp = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(&a.dir)
        .unwrap();
    // Written, never committed: the metadata server still says 0 bytes.
    tmp.write_all_at(&body[..2 * MIB as usize], 0).unwrap();
    let taken = wait_for("6 MiB in use", Duration::from_secs(10), || {
        let u = used(&b);
        (u >= base + 6 * MIB).then_some(u)
    });
    // The control: A lives, so three times the grace later its files are whole.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        used(&b) >= base + 6 * MIB,
        "A's files lost space while A lives"
    );
    let mut got = vec![0u8; body.len()];
    held.read_exact_at(&mut got, 0).unwrap();
    assert!(got == body, "A's unlinked file changed while A lives");
    let mut got = vec![0u8; 2 * MIB as usize];
    tmp.read_exact_at(&mut got, 0).unwrap();
    assert!(got[..] == body[..2 * MIB as usize], "A's O_TMPFILE changed");
    kill_mount(&mut a);
    drop((held, tmp));
    let t = Instant::now();
    let left = loop {
        let u = used(&b);
        if u + 5 * MIB <= taken || t.elapsed() > Duration::from_secs(20) {
            break u;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        left + 5 * MIB <= taken,
        "the space of the files A held stays taken after A went: {left} bytes in use, {taken} \
         with them, {base} before"
    );
    let logs: String = c
        .servers
        .iter()
        .map(|s| std::fs::read_to_string(&s.log).unwrap_or_default())
        .collect();
    assert!(
        logs.contains("left open by a mount that went, forgotten"),
        "the metadata server does not say it forgot them: {logs}"
    );
    // B still works, and its own file is whole.
    assert_eq!(std::fs::read(b.path("bdir/x")).unwrap(), b"x");
    a.child = None;
}

/// Where no mount waits for recalls when a mount holding unlinked files open goes, the next
/// mount to start removes their data (it asks for them as it starts).
#[test]
fn a_mount_that_starts_removes_the_files_a_killed_mount_held_open() {
    let test = "a_mount_that_starts_removes_the_files_a_killed_mount_held_open";
    if skip_without_fuse(test) {
        return;
    }
    // B only reads: it never waits for recalls.
    let (c, id, mut a, b) = nodes_with_a_short_orphan_grace(2);
    let base = used(&b);
    const MIB: u64 = 1 << 20;
    let (f, _) = unlinked_open_file(&a.path("held"), 3 * MIB as usize);
    let taken = wait_for("3 MiB in use", Duration::from_secs(10), || {
        let u = used(&b);
        (u >= base + 3 * MIB).then_some(u)
    });
    kill_mount(&mut a);
    drop(f);
    // Past the grace, nobody has taken them yet.
    std::thread::sleep(Duration::from_secs(3));
    assert!(used(&b) >= taken, "taken with no mount waiting for recalls");
    let _c = node(&c, id);
    let left = wait_for("the space back", Duration::from_secs(20), || {
        let u = used(&b);
        (u + 3 * MIB <= taken).then_some(u)
    });
    assert!(left < base + MIB, "{left} bytes in use, {base} before");
    a.child = None;
}

/// A mount that unmounts cleanly leaves no file to recover: another node's opens of the files
/// it wrote and closed, or opened and never wrote, ask nothing of the objects.
#[test]
fn a_clean_unmount_leaves_nothing_to_recover() {
    let test = "a_clean_unmount_leaves_nothing_to_recover";
    if skip_without_fuse(test) {
        return;
    }
    let (_c, a, b) = two_nodes();
    std::fs::write(a.path("written"), b"data\n").unwrap();
    let untouched = std::fs::File::create(a.path("untouched")).unwrap();
    drop(untouched);
    let w = std::fs::OpenOptions::new()
        .write(true)
        .open(a.path("written"))
        .unwrap();
    drop(w);
    drop(a);
    let before = b.requests();
    assert_eq!(std::fs::read(b.path("written")).unwrap(), b"data\n");
    assert_eq!(std::fs::read(b.path("untouched")).unwrap(), b"");
    let reqs = b.requests();
    let n = |r: &std::collections::BTreeMap<String, u64>, k: &str| r.get(k).copied().unwrap_or(0);
    assert_eq!(
        (
            n(&reqs, "ObjectLength") - n(&before, "ObjectLength"),
            n(&reqs, "Recovered") - n(&before, "Recovered")
        ),
        (0, 0),
        "{reqs:?}"
    );
}
