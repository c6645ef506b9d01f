//! The local fast path (DESIGN §3): on a one-fragment instance whose server runs on this host,
//! the kernel reads and writes the object directly (FUSE passthrough). Sizes, times and capacity
//! accounting still reach the servers at close, so other nodes see the file.

mod common;
use common::*;
use std::io::Write;

/// A one-fragment instance of `capacity` on one local server, mounted twice: with passthrough
/// (`fast`) and without (`other`, standing for another node). `None` (with the reason printed)
/// without `/dev/fuse` or root.
fn setup(test: &str, capacity: &str) -> Option<(Cluster, Mount, Mount)> {
    if skip_without_fuse(test) {
        return None;
    }
    if skip_without_root(test) {
        return None;
    }
    let c = cluster(1, "1GiB");
    let id = c.create_instance(capacity, "8MiB", &[]);
    let fast = Mount::new(&c, id, 0);
    let other = Mount::with_args(&c, id, 0, &["--no-passthrough"]);
    Some((c, fast, other))
}

/// Bytes the server at `addr` counts as used (`surge server status --json`).
fn server_used(addr: &str) -> u64 {
    let st: serde_json::Value =
        serde_json::from_str(&surge(&["server", "status", "--json", addr])).unwrap();
    st[0]["used"]
        .as_u64()
        .unwrap_or_else(|| panic!("no used bytes in {st}"))
}

#[test]
fn passthrough_writes_are_committed_accounted_and_seen_by_other_nodes() {
    let Some((c, fast, other)) = setup(
        "passthrough_writes_are_committed_accounted_and_seen_by_other_nodes",
        "512MiB",
    ) else {
        return;
    };
    let mut data = vec![0u8; 24 << 20];
    Rng(9).fill(&mut data);
    let mut f = std::fs::File::create(fast.path("big")).unwrap();
    for chunk in data.chunks(1 << 20) {
        f.write_all(chunk).unwrap();
    }
    // While open, this node sees its own size.
    assert_eq!(std::fs::metadata(fast.path("big")).unwrap().len(), 24 << 20);
    drop(f);
    assert!(
        fast.log().contains("passthrough available"),
        "mount log:\n{}",
        fast.log()
    );
    // Another node reads it after close, through the servers.
    assert!(std::fs::read(other.path("big")).unwrap() == data);
    // The servers accounted for what the kernel wrote directly.
    let used = server_used(&c.servers[0].addr);
    assert!(used >= 24 << 20, "used {used}");
    // And the other way: written by the other node, read through passthrough.
    std::fs::write(other.path("small"), b"from the other node").unwrap();
    assert_eq!(
        std::fs::read(fast.path("small")).unwrap(),
        b"from the other node"
    );
    // Truncate up and down through a passthrough file.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(fast.path("small"))
        .unwrap();
    f.set_len(4).unwrap();
    f.set_len(10).unwrap();
    drop(f);
    assert_eq!(
        std::fs::read(other.path("small")).unwrap(),
        b"from\0\0\0\0\0\0"
    );
}

#[test]
fn fallocate_on_a_passthrough_file_reserves_space_and_extends_it() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let Some((c, fast, other)) = setup(
        "fallocate_on_a_passthrough_file_reserves_space_and_extends_it",
        "64MiB",
    ) else {
        return;
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(fast.path("pre"))
        .unwrap();
    // SAFETY: fallocate on a descriptor owned by `f`.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 16 << 20) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    assert_eq!(f.metadata().unwrap().len(), 16 << 20);
    // Reserved before any write: the server counts it.
    let used = server_used(&c.servers[0].addr);
    assert!(used >= 16 << 20, "used {used}");
    // A reservation past the capacity fails and changes nothing.
    // SAFETY: as above.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 128 << 20) };
    assert_eq!(rc, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ENOSPC)
    );
    assert_eq!(f.metadata().unwrap().len(), 16 << 20);
    // Writes into the reserved range go through the kernel (passthrough) as before.
    f.write_all_at(b"tail", (16 << 20) - 4).unwrap();
    drop(f);
    let back = std::fs::read(other.path("pre")).unwrap();
    assert_eq!(back.len(), 16 << 20);
    assert_eq!(&back[back.len() - 4..], b"tail");
    assert!(back[..back.len() - 4].iter().all(|&b| b == 0));
}

/// fsx's failure on the passthrough path (`fsx -S 1`, op 240): a hole punched past the size
/// the mount last committed, in bytes the kernel wrote directly, must punch them; so must
/// `KEEP_SIZE` reserve there, and both must read back through another node.
#[test]
fn punch_hole_in_bytes_the_kernel_wrote_directly() {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let Some((_c, fast, other)) = setup("punch_hole_in_bytes_the_kernel_wrote_directly", "64MiB")
    else {
        return;
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(fast.path("holes"))
        .unwrap();
    // Nothing committed yet: the mount's size of the file is 0; the kernel wrote 256 KiB.
    f.write_all_at(&vec![0xabu8; 256 << 10], 0).unwrap();
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate on a descriptor owned by `f`.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), punch, 4096, 65536) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    // SAFETY: as above.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, 512 << 10) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    let mut buf = vec![0u8; 256 << 10];
    f.read_exact_at(&mut buf, 0).unwrap();
    let check = |buf: &[u8], who: &str| {
        for (i, &b) in buf.iter().enumerate() {
            let hole = (4096..4096 + 65536).contains(&i);
            assert_eq!(b, if hole { 0 } else { 0xab }, "{who}: byte {i}");
        }
    };
    check(&buf, "this node");
    assert_eq!(f.metadata().unwrap().len(), 256 << 10, "KEEP_SIZE kept it");
    drop(f);
    let back = std::fs::read(other.path("holes")).unwrap();
    assert_eq!(back.len(), 256 << 10);
    check(&back, "another node");
}

/// Object files under a server's device directory (every `frag-*` directory).
fn objects_on(device: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![device.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.parent().is_some_and(|d| {
                d.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("frag-"))
            }) && p.file_name().is_some_and(|n| n != "fragment.json")
            {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn removed_files_leave_no_objects_behind() {
    let Some((c, fast, other)) = setup("removed_files_leave_no_objects_behind", "64MiB") else {
        return;
    };
    // Empty files (their objects are created by the passthrough open), written ones, one
    // truncated to zero, one replaced by a rename; removed on this node and on the other.
    for i in 0..20 {
        std::fs::File::create(fast.path(&format!("e{i}"))).unwrap();
    }
    std::fs::write(fast.path("data"), vec![7u8; 100_000]).unwrap();
    std::fs::write(fast.path("cut"), vec![7u8; 100_000]).unwrap();
    std::fs::File::options()
        .write(true)
        .open(fast.path("cut"))
        .unwrap()
        .set_len(0)
        .unwrap();
    std::fs::write(fast.path("new"), b"new").unwrap();
    std::fs::rename(fast.path("new"), fast.path("data")).unwrap();
    assert!(!objects_on(&c.servers[0].device).is_empty());
    for i in 0..10 {
        std::fs::remove_file(fast.path(&format!("e{i}"))).unwrap();
    }
    for i in 10..20 {
        std::fs::remove_file(other.path(&format!("e{i}"))).unwrap();
    }
    std::fs::remove_file(other.path("cut")).unwrap();
    std::fs::remove_file(fast.path("data")).unwrap();
    // The file the rename replaced is kept 5 s for readers on other nodes (SEMANTICS.md,
    // name caching), then removed.
    let t = std::time::Instant::now();
    loop {
        let left = objects_on(&c.servers[0].device);
        if left.is_empty() {
            break;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(15),
            "objects left behind: {left:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
