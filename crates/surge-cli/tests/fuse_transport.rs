//! The FUSE transport of a mount (issue 34): where the kernel offers FUSE over io_uring
//! (`/sys/module/fuse/parameters/enable_uring` = Y), `surge mount` takes its requests from
//! per-CPU io_uring queues, says so, and counts them there; with the parameter off, or with
//! `--fuse-transport dev-fuse`, it serves `/dev/fuse` and the same work comes out the same.
//!
//! One test on purpose: it flips the kernel's parameter, which every mount made meanwhile would
//! see (the other suites do not care which transport they get; this one does).

mod common;
use common::*;
use std::io::{Read, Write};

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Sets the kernel's `enable_uring` for as long as it lives, and puts the old value back.
struct UringParam(String);

impl UringParam {
    fn set(on: bool) -> UringParam {
        let was = std::fs::read_to_string(PARAM).expect("read enable_uring");
        std::fs::write(PARAM, if on { "Y" } else { "N" }).expect("write enable_uring");
        UringParam(was.trim().to_string())
    }
}

impl Drop for UringParam {
    fn drop(&mut self) {
        let _ = std::fs::write(PARAM, &self.0);
    }
}

/// The mount's request counts over io_uring and over /dev/fuse.
fn counts(m: &Mount) -> (String, u64, u64) {
    let f = m.fuse_stats();
    (
        f["transport"].as_str().unwrap_or("?").to_string(),
        f["uring_requests"].as_u64().unwrap_or(0),
        f["dev_fuse_requests"].as_u64().unwrap_or(0),
    )
}

/// What every side does: 300 files created, stat'ed and half removed, a 9 MiB file written and
/// read back through the daemon (the mount has no passthrough), and a directory listing.
/// Returns the number of kernel requests it makes at least.
fn work(m: &Mount, seed: u64) -> u64 {
    std::fs::create_dir(m.path("d")).unwrap();
    for i in 0..300 {
        std::fs::write(m.path(&format!("d/f{i}")), format!("{i}")).unwrap();
    }
    for i in 0..300 {
        assert_eq!(
            std::fs::read_to_string(m.path(&format!("d/f{i}"))).unwrap(),
            format!("{i}")
        );
    }
    for i in (0..300).step_by(2) {
        std::fs::remove_file(m.path(&format!("d/f{i}"))).unwrap();
    }
    assert_eq!(std::fs::read_dir(m.path("d")).unwrap().count(), 150);
    let mut data = vec![0u8; 9 << 20];
    Rng(seed).fill(&mut data);
    let mut f = std::fs::File::create(m.path("big")).unwrap();
    for c in data.chunks(1 << 20) {
        f.write_all(c).unwrap();
    }
    drop(f);
    let mut back = Vec::new();
    std::fs::File::open(m.path("big"))
        .unwrap()
        .read_to_end(&mut back)
        .unwrap();
    assert!(back == data, "the 9 MiB file read back differs");
    // creates (lookup + create + write + flush + release each), reads, unlinks, the big file
    300 * 4 + 300 * 2 + 150 + 9
}

/// The names of the mount process's threads.
fn threads(m: &Mount) -> Vec<String> {
    let pid = m.child.as_ref().expect("running").id();
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
                .map(|s| s.trim().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn mounts_serve_over_io_uring_where_the_kernel_offers_it_and_over_dev_fuse_otherwise() {
    let test = "mounts_serve_over_io_uring_where_the_kernel_offers_it_and_over_dev_fuse_otherwise";
    if skip_without_fuse(test) || skip_without_root(test) {
        return;
    }
    if !std::path::Path::new(PARAM).exists()
        && skip_without(
            test,
            &format!("this kernel has no FUSE over io_uring ({PARAM})"),
        )
    {
        return;
    }
    let c = cluster(1, "2GiB");

    // 1. Offered: the requests come from the io_uring queues, one per CPU.
    let param = UringParam::set(true);
    let id = c.create_instance("512MiB", "1MiB", &[]);
    let m = Mount::with_args(
        &c,
        id,
        0,
        &["--no-passthrough", "--fuse-transport", "io-uring"],
    );
    assert!(
        m.log().contains("FUSE transport: io_uring"),
        "mount log:\n{}",
        m.log()
    );
    let (_, u0, _) = counts(&m);
    let least = work(&m, 1);
    let (kind, u1, d1) = counts(&m);
    let direct = m.fuse_stats()["uring_direct_replies"].as_u64().unwrap_or(0);
    eprintln!(
        "io_uring: {} requests over io_uring ({direct} reads copied straight into the ring), \
         {d1} over /dev/fuse",
        u1 - u0
    );
    assert_eq!(kind, "io_uring");
    // A root mount reads its own host's objects straight into the requests' ring entries.
    assert!(
        direct >= 100,
        "{direct} reads copied straight into the ring"
    );
    assert!(
        u1 - u0 >= least,
        "{} requests over io_uring for work of at least {least}",
        u1 - u0
    );
    // What still goes through /dev/fuse: forgets (and INIT); far fewer than the requests.
    assert!(d1 < u1 / 4, "{d1} over /dev/fuse, {u1} over io_uring");
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let queues = m.fuse_stats()["queues"].as_u64().unwrap_or(0);
    assert!(queues >= 1, "queues {queues} for CPUs {cpus}");
    let names = threads(&m);
    for q in 0..queues {
        assert!(
            names.iter().any(|n| n == &format!("fuse-uring-{q}")),
            "no thread for queue {q}: {names:?}"
        );
    }
    drop(m);

    // 2. Offered but declined (`--fuse-transport dev-fuse`, for A/B measurements).
    let m = Mount::with_args(
        &c,
        id,
        0,
        &["--no-passthrough", "--fuse-transport", "dev-fuse"],
    );
    assert!(
        m.log()
            .contains("FUSE transport: /dev/fuse (/dev/fuse asked for)"),
        "mount log:\n{}",
        m.log()
    );
    std::fs::remove_dir_all(m.path("d")).unwrap();
    let least = work(&m, 2);
    let (kind, u, d) = counts(&m);
    eprintln!("--fuse-transport dev-fuse: {u} requests over io_uring, {d} over /dev/fuse");
    assert_eq!((kind.as_str(), u), ("dev_fuse", 0));
    assert!(
        d >= least,
        "{d} requests over /dev/fuse for at least {least}"
    );
    drop(m);

    // 3. Not offered (the parameter off): /dev/fuse, and the log says why.
    drop(param);
    let _param = UringParam::set(false);
    let m = Mount::with_args(
        &c,
        id,
        0,
        &["--no-passthrough", "--fuse-transport", "io-uring"],
    );
    assert!(
        m.log()
            .contains("FUSE transport: /dev/fuse (the kernel does not offer"),
        "mount log:\n{}",
        m.log()
    );
    std::fs::remove_dir_all(m.path("d")).unwrap();
    let least = work(&m, 3);
    let (kind, u, d) = counts(&m);
    eprintln!("enable_uring=N: {u} requests over io_uring, {d} over /dev/fuse");
    assert_eq!((kind.as_str(), u), ("dev_fuse", 0));
    assert!(
        d >= least,
        "{d} requests over /dev/fuse for at least {least}"
    );
    assert!(
        !threads(&m).iter().any(|n| n.starts_with("fuse-uring")),
        "io_uring queue threads without io_uring"
    );
}
