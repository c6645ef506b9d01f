//! Capacity: statfs reports the instance's capacity and use; writing past capacity gives ENOSPC
//! to the application and nothing already written is harmed; freed space is reusable.

mod common;
use common::*;
use std::fs::File;
use std::io::Write;

fn statvfs(p: &std::path::Path) -> (u64, u64) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out-parameter.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    (st.f_blocks * st.f_frsize, st.f_bfree * st.f_frsize)
}

#[test]
fn writing_past_capacity_gives_enospc_and_keeps_what_was_written() {
    if skip_without_fuse("writing_past_capacity_gives_enospc_and_keeps_what_was_written") {
        return;
    }
    let c = cluster(3, "1GiB");
    // 24 MiB over 3 fragments of 8 MiB; 1 MiB stripes.
    let id = c.create_instance("24MiB", "1MiB", &[]);
    let m = Mount::new(&c, id, 0);
    let (total, free0) = statvfs(&m.dir);
    assert_eq!(total, 24 << 20, "statfs reports the instance capacity");
    assert!(free0 > 23 << 20);

    let mut keep = vec![0u8; 5 << 20];
    Rng(42).fill(&mut keep);
    std::fs::write(m.path("keep"), &keep).unwrap();
    let (_, free1) = statvfs(&m.dir);
    assert!(
        free0 - free1 >= 5 << 20,
        "use grows with data: {free0} -> {free1}"
    );

    let mut f = File::create(m.path("fill")).unwrap();
    let chunk = vec![7u8; 1 << 20];
    let mut written = 0u64;
    let err = loop {
        match f.write_all(&chunk) {
            Ok(()) => written += chunk.len() as u64,
            Err(e) => break e,
        }
        assert!(
            written < 64 << 20,
            "no ENOSPC after {written} bytes on a 24 MiB instance"
        );
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "got {err}");
    drop(f);
    assert!(
        written >= 12 << 20,
        "only {written} bytes fit before ENOSPC"
    );

    // What was written before is intact.
    assert!(std::fs::read(m.path("keep")).unwrap() == keep);
    let (_, free_full) = statvfs(&m.dir);
    // Each fragment enforces its own share (as DataWarp's per-fragment file systems did): the
    // stripe that hit a full fragment fails while the others may keep up to about a stripe.
    assert!(
        free_full < 4 << 20,
        "statfs shows the instance full: {free_full} free"
    );

    // Space comes back when the file is removed, and can be used again.
    std::fs::remove_file(m.path("fill")).unwrap();
    let (_, free2) = statvfs(&m.dir);
    assert!(
        free2 >= free1 - (1 << 20),
        "space freed: {free2} vs {free1}"
    );
    std::fs::write(m.path("again"), vec![1u8; 8 << 20]).unwrap();
    assert!(std::fs::read(m.path("keep")).unwrap() == keep);
}

#[test]
fn an_instance_larger_than_a_server_offers_is_refused_and_nothing_is_left_behind() {
    let c = cluster(2, "64MiB");
    let out = std::process::Command::new(SURGE)
        .args([
            "instance",
            "create",
            "--servers",
            &c.addrs().join(","),
            "--capacity",
            "200MiB",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot host"), "error names the cause: {err}");
    // No fragment is left on the server that could host its share.
    let listing = surge(
        &[
            &["server", "status", "--json"][..],
            &c.addrs().iter().map(String::as_str).collect::<Vec<_>>(),
        ]
        .concat(),
    );
    let v: serde_json::Value = serde_json::from_str(&listing).unwrap();
    for server in v.as_array().unwrap() {
        assert_eq!(
            server["fragments"].as_array().map(Vec::len),
            Some(0),
            "left behind: {server}"
        );
        assert_eq!(
            server["namespaces"].as_array().map(Vec::len),
            Some(0),
            "left behind: {server}"
        );
    }
}
