//! The local fast path (DESIGN §3): on a one-fragment instance whose server runs on this host,
//! the kernel reads and writes the object directly (FUSE passthrough). Sizes, times and capacity
//! accounting still reach the servers at close, so other nodes see the file.

mod common;
use common::*;
use std::io::Write;

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn passthrough_writes_are_committed_accounted_and_seen_by_other_nodes() {
    if skip_without_fuse("passthrough_writes_are_committed_accounted_and_seen_by_other_nodes") {
        return;
    }
    if !root() {
        eprintln!("SKIPPED passthrough_writes_are_committed_accounted_and_seen_by_other_nodes: needs root");
        return;
    }
    let c = Cluster::start(1, "1GiB");
    let id = c.create_instance("512MiB", "8MiB", &[]);
    let fast = Mount::new(&c, id, 0);
    let other = Mount::with_args(&c, id, 0, &["--no-passthrough"]);
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
    let st: serde_json::Value =
        serde_json::from_str(&surge(&["server", "status", "--json", &c.servers[0].addr])).unwrap();
    assert!(st[0]["used"].as_u64().unwrap() >= 24 << 20, "{st}");
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
