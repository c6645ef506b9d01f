//! `surge passthrough-helper` (crates/surge-client/src/lend.rs): root lends kernel FUSE
//! passthrough to mounts users make. A plain `surge run` by a user then moves no file data
//! through its own process; without the helper it moves every byte. The helper maps only
//! files the connecting user owns, only on a real FUSE connection.

mod common;
use common::*;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const USER: &str = "surge-ptuser";

/// The test user's uid and gid, making the user if needed.
fn user() -> (u32, u32) {
    system_user(USER)
}

/// A directory the user owns.
fn owned(parent: &Path, name: &str, uid: u32, gid: u32) -> PathBuf {
    let d = parent.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::os::unix::fs::chown(&d, Some(uid), Some(gid)).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// The helper on `socket`, killed when dropped.
fn helper(dir: &Path, socket: &Path) -> ChildGuard {
    let ready = dir.join("helper.ready");
    let child = Command::new(SURGE)
        .args(["passthrough-helper", "--socket"])
        .arg(socket)
        .arg("--ready-file")
        .arg(&ready)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("helper.log")).unwrap())
        .spawn()
        .expect("start surge passthrough-helper");
    let g = ChildGuard(child);
    wait_for(
        "the passthrough helper to listen",
        Duration::from_secs(10),
        || ready.exists().then_some(()),
    );
    g
}

/// Runs a DataWarp job (`body` after its `#DW jobdw` line) as the user under `surge run`
/// (the embedded default) with the helper's socket `socket`, in a home of its own under `w`
/// (`tag`) holding `files`.
fn user_job(
    w: &Path,
    (uid, gid): (u32, u32),
    socket: &Path,
    tag: &str,
    files: &[(&str, &[u8], u32)],
    body: &str,
) -> Output {
    let home = owned(w, &format!("home-{tag}"), uid, gid);
    let fast = owned(w, &format!("fast-{tag}"), uid, gid);
    for (name, data, mode) in files {
        let p = home.join(name);
        std::fs::write(&p, data).unwrap();
        std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)).unwrap();
    }
    let job = home.join("job.sh");
    std::fs::write(
        &job,
        format!(
            "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=1GiB\nset -e\n{body}"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&job, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(SURGE)
        .args(["-v", "run"])
        .arg(&job)
        .current_dir(&home)
        .env("HOME", &home)
        .env("SURGE_FAST_DIR", &fast)
        .env("SURGE_SERVERS", "2")
        .env("SURGE_SERVER_CAPACITY", "1GiB")
        .env("SURGE_GRANULARITY", "256MiB")
        .env("SURGE_PASSTHROUGH_SOCKET", socket)
        // The meter of `job_moves` is /proc/PID/io, which counts read and write system calls:
        // over FUSE over io_uring the kernel moves a request's bytes without any, so these
        // jobs keep to /dev/fuse (the helper registers backing files through the /dev/fuse
        // descriptor on either transport).
        .env("SURGE_FUSE_TRANSPORT", "dev-fuse")
        .env_remove("SURGE_MANAGER")
        .env_remove("SURGE_STATE_DIR")
        .stdin(Stdio::null())
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    out
}

/// The user's job copies a 64 MiB file onto the instance and compares it back; returns how
/// many bytes `surge run` (which answers the mount) read and wrote meanwhile.
fn job_moves(w: &Path, who: (u32, u32), socket: &Path, tag: &str, said: &str) -> u64 {
    let mut data = vec![0u8; 64 << 20];
    Rng(seed() | 1).fill(&mut data);
    let out = user_job(
        w,
        who,
        socket,
        tag,
        &[("src", &data, 0o644)],
        "[ \"$(cat /proc/$PPID/comm)\" = surge ] || { echo \"parent is $(cat /proc/$PPID/comm)\"; exit 3; }\n\
         io() { awk '$1==\"rchar:\"{r=$2} $1==\"wchar:\"{w=$2} END{print r+w}' /proc/$PPID/io; }\n\
         a=$(io)\n\
         cp src \"$DW_JOB_STRIPED/f\"\n\
         sync \"$DW_JOB_STRIPED/f\"\n\
         cmp src \"$DW_JOB_STRIPED/f\"\n\
         b=$(io)\n\
         echo \"moved $((b - a))\"\n",
    );
    // The job's output says what its mount does.
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(said),
        "no '{said}' in {}",
        text(&out)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("moved "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no 'moved' line: {}", text(&out)))
}

#[test]
fn a_users_job_moves_no_file_data_through_its_mount_with_the_helper() {
    let test = "a_users_job_moves_no_file_data_through_its_mount_with_the_helper";
    if skip_without_fuse(test) {
        return;
    }
    if skip_without_root(test) {
        return;
    }
    let (uid, gid) = user();
    let w = Scratch::new("pt-helper");
    std::fs::set_permissions(w.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = w.path().join("pt.sock");
    let _h = helper(w.path(), &socket);
    // With the helper: the kernel copies to and from the fast tier; `surge run` sees only
    // metadata (opens, closes, sizes).
    let with = job_moves(
        w.path(),
        (uid, gid),
        &socket,
        "with",
        "kernel passthrough by the passthrough helper",
    );
    // Without it (no socket there): every byte passes through `surge run` (64 MiB in from
    // the kernel, out to the server, and back for the comparison).
    let without = job_moves(
        w.path(),
        (uid, gid),
        &w.path().join("none.sock"),
        "without",
        "no kernel passthrough (not root, no passthrough helper at",
    );
    eprintln!("surge run moved {with} bytes with the helper, {without} without");
    assert!(
        with < 8 << 20,
        "with the helper, surge run moved {with} bytes for a 64 MiB copy and compare"
    );
    assert!(
        without > 128 << 20,
        "without the helper, surge run moved only {without} bytes: is the test measuring?"
    );
}

/// Sends the helper a hello with `fd_path` opened, then an open of `file` opened, as the
/// user; prints the two answers (python3's socket.send_fds: a client nobody here wrote).
fn probe(uid: u32, gid: u32, socket: &Path, fd_path: &str, file: &Path) -> (i32, i32) {
    let script = r#"
import os, socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[1])
fd = os.open(sys.argv[2], os.O_RDWR)
socket.send_fds(s, [b"H"], [fd])
hello = struct.unpack("<i", s.recv(8))[0]
if hello != 0:
    print(hello, 0); sys.exit()
f = os.open(sys.argv[3], os.O_RDONLY)
socket.send_fds(s, [b"O"], [f])
print(hello, struct.unpack("<i", s.recv(8))[0])
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(socket)
        .arg(fd_path)
        .arg(file)
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let s = String::from_utf8_lossy(&out.stdout);
    let v: Vec<i32> = s
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    assert_eq!(v.len(), 2, "{}", text(&out));
    (v[0], v[1])
}

#[test]
fn the_helper_maps_only_the_users_own_files_on_a_fuse_connection() {
    let test = "the_helper_maps_only_the_users_own_files_on_a_fuse_connection";
    if skip_without_fuse(test) {
        return;
    }
    if skip_without_root(test) {
        return;
    }
    if Command::new("python3")
        .arg("-c")
        .arg("import socket; socket.send_fds")
        .output()
        .map_or(true, |o| !o.status.success())
    {
        skip_without(test, "no python3 with socket.send_fds");
        return;
    }
    let (uid, gid) = user();
    let w = Scratch::new("pt-probe");
    std::fs::set_permissions(w.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = w.path().join("pt.sock");
    let h = helper(w.path(), &socket);
    // A file the user owns and one of root's the user can read.
    let mine = owned(w.path(), "mine", uid, gid).join("f");
    std::fs::write(&mine, b"mine").unwrap();
    std::os::unix::fs::chown(&mine, Some(uid), Some(gid)).unwrap();
    let roots = w.path().join("roots");
    std::fs::write(&roots, b"root's").unwrap();
    std::fs::set_permissions(&roots, std::fs::Permissions::from_mode(0o644)).unwrap();

    // Not a FUSE device: refused at hello.
    let (hello, _) = probe(uid, gid, &socket, "/dev/null", &mine);
    assert_eq!(hello, -libc::EBADF, "a hello with /dev/null");
    // A FUSE device, root's file: refused.
    let (hello, open) = probe(uid, gid, &socket, "/dev/fuse", &roots);
    assert_eq!(hello, 0);
    assert_eq!(open, -libc::EPERM, "root's file mapped for a user");
    // A directory the user owns: refused.
    let (_, open) = probe(uid, gid, &socket, "/dev/fuse", mine.parent().unwrap());
    assert_eq!(open, -libc::EINVAL, "a directory mapped");
    // The user's own file on a connection that never negotiated passthrough: the kernel's
    // own refusal comes back (the helper does not pretend).
    let (_, open) = probe(uid, gid, &socket, "/dev/fuse", &mine);
    assert!(
        open < 0,
        "a backing file on an unmounted FUSE connection: {open}"
    );
    // Stopped, the helper takes its socket with it (mounts then see no helper rather than
    // one that does not answer).
    drop(h);
    assert!(!socket.exists(), "{} left behind", socket.display());
}

/// fsx (xfstests' file-operation checker: it found corrupt reads on the passthrough path
/// once) in a user's job whose files the helper maps.
#[test]
fn fsx_in_a_users_job_with_the_helper() {
    let test = "fsx_in_a_users_job_with_the_helper";
    if skip_without_fuse(test) {
        return;
    }
    if skip_without_root(test) {
        return;
    }
    let fsx = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools/bin/fsx");
    let Ok(bin) = std::fs::read(&fsx) else {
        skip_without(
            test,
            &format!(
                "{} is missing (make setup builds it from ../shared/tools/fs-suites)",
                fsx.display()
            ),
        );
        return;
    };
    let (uid, gid) = user();
    let w = Scratch::new("pt-fsx");
    std::fs::set_permissions(w.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = w.path().join("pt.sock");
    let _h = helper(w.path(), &socket);
    let out = user_job(
        w.path(),
        (uid, gid),
        &socket,
        "fsx",
        &[("fsx", &bin, 0o755)],
        &format!(
            "./fsx -N 20000 -S {} \"$DW_JOB_STRIPED/fsx.dat\" > fsx.out 2>&1 || {{ tail -40 fsx.out; exit 1; }}\n\
             tail -1 fsx.out\n\
             getfattr --only-values -n user.surge.layout \"$DW_JOB_STRIPED/fsx.dat\"; echo\n",
            seed() % 100_000 + 1
        ),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.contains("operations completed A-OK!"),
        "{}",
        text(&out)
    );
    // The file fsx worked on was one the kernel read and wrote itself.
    assert!(
        stdout.contains("stripe_count=1 "),
        "fsx.dat's layout: {}",
        text(&out)
    );
    assert!(
        stderr.contains("registers this mount's backing files"),
        "the mount did not use the helper: {}",
        text(&out)
    );
    eprintln!("{}", stdout.trim());
}
