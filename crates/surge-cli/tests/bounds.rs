//! Every bound of docs/DATAPLANE.md "Bounds", pinned by a client that tries to go past it: a
//! read larger than the limit, frames announced and never sent, floods of connections, idle
//! connections, and a server that stops answering (SIGSTOP) under real mounts.

mod common;
use common::wire::{call, closed, connect, error_code, read_frame, read_response};
use common::*;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};
use surge_core::{FileId, InstanceId, NamespaceId};
use surge_proto::codec::{encode, frame_prefix};
use surge_proto::frame::{CONNECTION_ID, MAX_IO, MAX_PAYLOAD};
use surge_proto::{ErrorCode, Request, Response};

const MIB: u64 = 1 << 20;

fn pid(s: &Server) -> u32 {
    s.child.as_ref().expect("server running").id()
}

fn file(ino: u64) -> FileId {
    FileId {
        ns: NamespaceId(0),
        ino,
    }
}

#[test]
fn a_read_over_the_limit_is_refused_before_anything_is_allocated() {
    let c = cluster(1, "1GiB");
    let addr = c.servers[0].addr.clone();
    let id = InstanceId(c.create_instance("64MiB", "1MiB", &[]));
    let mut s = connect(&addr);
    let write = Request::Write {
        instance: id,
        fragment: 0,
        file: file(2),
        offset: 0,
    };
    assert_eq!(
        call(&mut s, 1, &write, b"x").0,
        Response::Written { len: 1 }
    );
    let (_, peak_before) = common::wire::memory(pid(&c.servers[0]));

    let read = |len: u32| Request::Read {
        instance: id,
        fragment: 0,
        file: file(2),
        offset: 0,
        len,
    };
    for (n, len) in [(2, 1 << 30), (3, u32::MAX)] {
        match call(&mut s, n, &read(len), &[]).0 {
            Response::Error(e) => {
                assert_eq!(e.code, ErrorCode::TooLarge, "{e}");
                assert!(
                    e.message.contains(&format!("read of {len} bytes"))
                        && e.message.contains(&MAX_IO.to_string()),
                    "the error names the length and the limit: {e}"
                );
            }
            other => panic!("a read of {len} bytes was answered: {other:?}"),
        }
    }
    // The limit itself is served, on the same connection.
    let (resp, data) = call(&mut s, 4, &read(MAX_IO), &[]);
    assert_eq!((resp, data), (Response::Data, b"x".to_vec()));

    let (_, peak_after) = common::wire::memory(pid(&c.servers[0]));
    assert!(
        peak_after < peak_before + 64 * MIB,
        "the server's peak memory grew from {} to {} MiB",
        peak_before / MIB,
        peak_after / MIB
    );
    // Clients learn the limits from Status.
    match call(&mut s, 5, &Request::Status, &[]).0 {
        Response::Status(st) => {
            assert_eq!(st.limits.max_io, MAX_IO);
            assert_eq!(st.limits.max_payload, MAX_PAYLOAD);
            assert_eq!(st.limits.idle_timeout_ms, 300_000);
            assert_eq!(st.limits.frame_timeout_ms, 30_000);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn frames_announced_and_not_sent_hold_little_memory_and_are_cut_off() {
    let c = surge_testkit::procs::Cluster::start_with(
        Path::new(SURGE),
        1,
        "1GiB",
        &["--frame-timeout", "2"],
    );
    let addr = c.servers[0].addr.clone();
    let id = InstanceId(c.create_instance("64MiB", "1MiB", &[]));
    let write = Request::Write {
        instance: id,
        fragment: 0,
        file: file(2),
        offset: 0,
    };

    // Over the limit: refused from the header alone.
    let mut s = connect(&addr);
    s.write_all(&frame_prefix(
        write.opcode(),
        1,
        &encode(&write).expect("encodes"),
        64 << 20,
    ))
    .unwrap();
    assert_eq!(error_code(read_response(&mut s)), ErrorCode::TooLarge);

    let (rss_before, _) = common::wire::memory(pid(&c.servers[0]));
    let started = Instant::now();
    let mut stalled: Vec<_> = (0..8)
        .map(|i| {
            let mut s = connect(&addr);
            let mut w = frame_prefix(
                write.opcode(),
                100 + i,
                &encode(&write).expect("encodes"),
                MAX_PAYLOAD as usize,
            );
            w.extend_from_slice(&[7u8; 64 << 10]);
            s.write_all(&w).unwrap();
            s
        })
        .collect();
    holds_for(
        "the server's memory stays bounded while 8 frames stall",
        Duration::from_millis(500),
        || {
            let (rss_stalled, _) = common::wire::memory(pid(&c.servers[0]));
            check(rss_stalled < rss_before + 40 * MIB, || {
                format!(
                    "8 announced {} MiB payloads took {} MiB of its memory",
                    MAX_PAYLOAD as u64 / MIB,
                    (rss_stalled.saturating_sub(rss_before)) / MIB
                )
            })
        },
    );
    // Each is answered with TimedOut once the frame timeout has passed, and closed.
    for (i, s) in stalled.iter_mut().enumerate() {
        let (h, r) = read_response(s).expect("a reply to the cut-off frame");
        assert_eq!(h.request_id, 100 + i as u64);
        assert!(
            matches!(&r, Response::Error(e) if e.code == ErrorCode::TimedOut),
            "{r:?}"
        );
        assert!(closed(s));
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(8),
        "stalled frames were cut after {took:?} with a 2 s frame timeout"
    );
    common::wire::alive(&addr);
    let logs = c.server_logs();
    assert!(logs.contains("frame cut off in its payload"), "{logs}");
}

#[test]
fn an_idle_connection_is_closed_with_a_notice_and_what_came_after_is_not_made() {
    let c = surge_testkit::procs::Cluster::start_with(
        Path::new(SURGE),
        1,
        "1GiB",
        &["--idle-timeout", "0.5"],
    );
    let addr = c.servers[0].addr.clone();
    let id = InstanceId(c.create_instance("64MiB", "1MiB", &[]));
    let mut s = connect(&addr);
    assert!(matches!(
        call(&mut s, 1, &Request::Status, &[]).0,
        Response::Status(_)
    ));
    let idle_from = Instant::now();
    // The server gives up on the connection after 0.5 s; a write sent after that is not made.
    std::thread::sleep(Duration::from_millis(900));
    let write = Request::Write {
        instance: id,
        fragment: 0,
        file: file(3),
        offset: 0,
    };
    let _ = s.write_all(&{
        let mut w = frame_prefix(write.opcode(), 2, &encode(&write).expect("encodes"), 5);
        w.extend_from_slice(b"hello");
        w
    });
    let (h, r, _) = read_frame(&mut s).expect("the idle notice");
    assert_eq!(h.request_id, CONNECTION_ID);
    match r {
        Response::Error(e) => {
            assert_eq!(e.code, ErrorCode::IdleClosed);
            assert!(e.message.contains("no request for"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert!(read_frame(&mut s).is_none(), "nothing after the notice");
    assert!(idle_from.elapsed() >= Duration::from_millis(500));
    // The write after the notice was never made.
    let mut t = connect(&addr);
    let read = Request::Read {
        instance: id,
        fragment: 0,
        file: file(3),
        offset: 0,
        len: 5,
    };
    assert_eq!(call(&mut t, 1, &read, &[]), (Response::Data, Vec::new()));
    // A connection that keeps asking is never idle.
    for n in 2..8 {
        std::thread::sleep(Duration::from_millis(200));
        assert!(matches!(
            call(&mut t, n, &Request::Status, &[]).0,
            Response::Status(_)
        ));
    }
}

#[test]
fn a_mount_keeps_working_across_idle_closes() {
    if skip_without_fuse("a_mount_keeps_working_across_idle_closes") {
        return;
    }
    let c = surge_testkit::procs::Cluster::start_with(
        Path::new(SURGE),
        2,
        "1GiB",
        &["--idle-timeout", "0.3"],
    );
    let id = c.create_instance("256MiB", "1MiB", &[]);
    let m = Mount::with_args(&c, id, 0, &["--no-passthrough"]);
    let data: Vec<u8> = (0..3 * MIB as usize).map(|i| (i % 251) as u8).collect();
    std::fs::create_dir(m.path("d")).unwrap();
    for round in 0..4 {
        // Every connection of the mount (pooled, per FUSE thread, lease recalls) goes idle
        // and is closed between rounds.
        std::thread::sleep(Duration::from_millis(700));
        let f = m.path(&format!("d/f{round}"));
        std::fs::write(&f, &data).unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), data, "round {round}");
        assert_eq!(std::fs::read_dir(m.path("d")).unwrap().count(), round + 1);
        assert!(std::fs::metadata(m.path("absent")).is_err());
    }
    let log = m.log();
    assert!(
        !log.contains("WARN") && !log.contains("ERROR"),
        "the mount saw the closes:\n{log}"
    );
}

/// `surge server` under an open-file limit of `soft`:`hard`, with `extra` flags; its address
/// and log.
fn server_with_nofile(
    scratch: &Scratch,
    soft: u64,
    hard: u64,
    extra: &[&str],
) -> (ChildGuard, String, std::path::PathBuf) {
    let ready = scratch.path().join("ready");
    let log = scratch.path().join("server.log");
    let mut cmd = common::surge_command();
    cmd.args(["server", "--device"])
        .arg(scratch.path().join("bb"))
        .args([
            "--capacity",
            "1GiB",
            "--listen",
            "127.0.0.1:0",
            "--ready-file",
        ])
        .arg(&ready)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    // SAFETY: only setrlimit between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let r = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let child = ChildGuard(cmd.spawn().expect("start surge server"));
    let addr = wait_for("server ready file", Duration::from_secs(20), || {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&ready).ok()?).ok()?;
        v["addrs"][0].as_str().map(str::to_string)
    });
    (child, addr, log)
}

/// Runs `surge ARGS`, killed after `within`; its output if it succeeded in time.
fn surge_within(args: &[&str], within: Duration) -> Result<String, String> {
    let mut child = ChildGuard(
        common::surge_command()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let start = Instant::now();
    while child.0.try_wait().unwrap().is_none() {
        if start.elapsed() > within {
            return Err(format!("surge {args:?} did not finish within {within:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut out = String::new();
    let mut err = String::new();
    let _ = child.0.stdout.take().unwrap().read_to_string(&mut out);
    let _ = child.0.stderr.take().unwrap().read_to_string(&mut err);
    match child.0.wait().unwrap().success() {
        true => Ok(out),
        false => Err(format!("surge {args:?} failed: {out}{err}")),
    }
}

#[test]
fn floods_of_connections_do_not_lock_clients_out() {
    let scratch = Scratch::new("flood");
    // A soft limit of 200 would leave no room for connections: the server raises it to the
    // hard 300 and serves 300 - 256 = 44 connections, 16 per peer.
    let (server, addr, log) =
        server_with_nofile(&scratch, 200, 300, &["--max-connections-per-peer", "16"]);
    let pid = server.0.id();

    // A client that was there before the flood.
    let mut old = connect(&addr);
    assert!(matches!(
        call(&mut old, 1, &Request::Status, &[]).0,
        Response::Status(st) if st.limits.max_connections == 44
            && st.limits.max_connections_per_peer == 16
    ));

    // One peer gets 16 connections, then a clear refusal.
    let mut flood: Vec<_> = (0..16).map(|_| connect_from("127.0.0.2", &addr)).collect();
    let mut one_more = connect_from("127.0.0.2", &addr);
    let (h, r) = read_response(&mut one_more).expect("a refusal");
    assert_eq!(h.request_id, CONNECTION_ID);
    match r {
        Response::Error(e) => {
            assert_eq!(e.code, ErrorCode::ConnectionLimit);
            assert!(
                e.message.contains("16 connections from 127.0.0.2")
                    && e.message.contains("--max-connections-per-peer"),
                "{e}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Ten more peers, 16 silent connections each: 176 in all, far past the 44 allowed (and,
    // at one descriptor or two each, past what the open-file limit holds).
    for p in 3..13 {
        for _ in 0..16 {
            flood.push(connect_from(&format!("127.0.0.{p}"), &addr));
        }
    }
    holds_for(
        "the server's descriptors stay bounded under the flood",
        Duration::from_millis(1200),
        || {
            let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
                .unwrap()
                .count();
            check(fds < 150, || {
                format!("it holds {fds} descriptors of its 300")
            })
        },
    );

    // The client that was there keeps working, and a new client gets in (a connection silent
    // for more than a second makes room for it).
    assert!(matches!(
        call(&mut old, 2, &Request::Status, &[]).0,
        Response::Status(_)
    ));
    let out = surge_within(&["server", "status", &addr], Duration::from_secs(20)).unwrap();
    assert!(out.contains("server "), "{out}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("refusing a connection") && text.contains("closed a connection silent"),
        "{text}"
    );
    drop(flood);
}

fn os_error(r: std::io::Result<impl std::fmt::Debug>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.raw_os_error().unwrap_or(0),
    }
}

#[test]
fn a_stopped_server_gives_eio_within_the_deadline_and_mounts_recover() {
    if skip_without_fuse("a_stopped_server_gives_eio_within_the_deadline_and_mounts_recover") {
        return;
    }
    let c = cluster(1, "2GiB");
    let shared = c.create_instance("256MiB", "1MiB", &[]);
    let private = c.create_instance("256MiB", "1MiB", &["--access-mode", "private"]);
    // No name cache on the soft mount: its lookup of an absent name must reach the server
    // (a listing of the root it wrote to could answer it for `--entry-ttl`).
    let soft = Mount::with_args(
        &c,
        shared,
        0,
        &["--deadline", "2", "--no-passthrough", "--entry-ttl", "0"],
    );
    let hard = Mount::with_args(&c, shared, 0, &["--hard", "--no-passthrough"]);
    let behind = Mount::with_args(&c, private, 0, &["--deadline", "2", "--no-passthrough"]);
    std::fs::write(soft.path("a"), vec![1u8; 1 << 20]).unwrap();
    let open_a = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(soft.path("a"))
        .unwrap();
    std::fs::create_dir(behind.path("d")).unwrap();
    std::fs::write(behind.path("d/first"), b"1").unwrap();

    let server = pid(&c.servers[0]) as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(server, libc::SIGSTOP) };
    // Every thread of the server stopped ('T' in /proc) before anything is asked of it: a
    // thread busy when the signal came stops a moment later, and could still answer.
    wait_for("the server stopped", Duration::from_secs(10), || {
        let tasks = std::fs::read_dir(format!("/proc/{server}/task")).ok()?;
        tasks
            .flatten()
            .all(|t| {
                std::fs::read_to_string(t.path().join("stat"))
                    .ok()
                    .and_then(|st| {
                        st.rsplit_once(')')
                            .map(|(_, r)| r.trim_start().starts_with('T'))
                    })
                    .unwrap_or(true)
            })
            .then_some(())
    });
    let stopped = Instant::now();
    // A hard mount waits for as long as it takes.
    let hard_dir = hard.path("");
    let waiting = std::thread::spawn(move || {
        let r = std::fs::metadata(hard_dir.join("made-later"));
        (
            r.map(|m| m.len()).map_err(|e| e.raw_os_error()),
            Instant::now(),
        )
    });
    // Soft mounts fail with EIO within the deadline: a lookup (answered on the FUSE thread),
    // a write (through the async pool), and a listing that waits for creates made behind.
    let timed = |what: &str, f: &mut dyn FnMut() -> i32| {
        let t = Instant::now();
        let errno = f();
        let took = t.elapsed();
        assert_eq!(errno, libc::EIO, "{what}: errno {errno}");
        assert!(
            took >= Duration::from_millis(1500) && took < Duration::from_secs(8),
            "{what} failed after {took:?} with a 2 s deadline"
        );
    };
    timed("lookup", &mut || {
        os_error(std::fs::metadata(soft.path("absent")))
    });
    timed("write", &mut || os_error(open_a.write_at(&[2u8; 4096], 0)));
    for i in 0..5 {
        // Answered at once: made behind (an empty file: data would go to the server).
        std::fs::File::create(behind.path(&format!("d/f{i}"))).unwrap();
    }
    timed("readdir", &mut || {
        os_error(std::fs::read_dir(behind.path("d")).and_then(|d| d.collect::<Result<Vec<_>, _>>()))
    });
    assert!(
        !waiting.is_finished(),
        "the hard mount gave up while the server was stopped"
    );

    // SAFETY: as above.
    unsafe { libc::kill(server, libc::SIGCONT) };
    let resumed = Instant::now();
    let (r, done) = waiting.join().unwrap();
    assert_eq!(r, Err(Some(libc::ENOENT)));
    assert!(
        done >= resumed,
        "hard mount answered while stopped, after {:?}",
        done - stopped
    );

    // Everything works again, and the creates made behind were made.
    open_a.write_at(&[3u8; 4096], 0).unwrap();
    let mut back = vec![0u8; 4096];
    open_a.read_at(&mut back, 0).unwrap();
    assert_eq!(back, vec![3u8; 4096]);
    assert!(std::fs::metadata(soft.path("absent")).is_err());
    let mut names: Vec<String> = std::fs::read_dir(behind.path("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["f0", "f1", "f2", "f3", "f4", "first"]);
    let log = soft.log();
    assert!(log.contains("no reply to"), "the mount logs why:\n{log}");
    let log = behind.log();
    assert!(
        log.contains("not taken by the metadata server within"),
        "{log}"
    );
}
