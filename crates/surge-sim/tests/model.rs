//! The model against closed-form results on trivial machines, and the write-behind protocol.
//!
//! Each test builds a machine where every component is "unlimited" (left out of the event
//! path) except the ones under test, so the expected time is a short formula.

use std::collections::BTreeMap;
use surge_sim::engine::NS_PER_S;
use surge_sim::{kernel, simulate, Outcome, SimOptions, System};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A machine with nothing in the way: every bandwidth unlimited and every latency zero,
/// `nodes` compute nodes on one I/O node, 1 file server, no burst buffer. Tests switch on the
/// components they measure with `sets`.
fn machine(nodes: u32, sets: &[&str]) -> System {
    let text = format!(
        r#"
name = "test"
[compute]
nodes = {nodes}
processes_per_node = 1
nodes_per_ion = {nodes}
link_bandwidth = "unlimited"
link_latency = "0"
[ion]
tree_bandwidth = "unlimited"
tree_latency = "0"
memory_bandwidth = "unlimited"
network_bandwidth = "unlimited"
network_latency = "0"
forward_buffer = "1GiB"
transfer_size = "4MiB"
[burst_buffer]
enabled = false
capacity = "1GiB"
write_bandwidth = "unlimited"
read_bandwidth = "unlimited"
write_latency = "0"
read_latency = "0"
[storage_network]
core_bandwidth = "unlimited"
latency = "0"
[file_servers]
count = 1
nic_bandwidth = "unlimited"
nic_latency = "0"
processing_bandwidth = "unlimited"
stripe_size = "4MiB"
[storage]
racks = 0
rack_bandwidth = "unlimited"
luns_per_server = 1
lun_bandwidth = "unlimited"
lun_latency = "0"
small_request = "0"
small_request_penalty = "0"
"#
    );
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    System::from_toml(&text, "test machine", &sets).unwrap_or_else(|e| panic!("{e}"))
}

fn run(sys: &System, kernel_text: &str) -> Outcome {
    let k = kernel::parse(kernel_text, "test.kernel", &BTreeMap::new())
        .unwrap_or_else(|e| panic!("{e}"));
    simulate(sys, &k.apps, &SimOptions::default(), None).unwrap_or_else(|e| panic!("{e}"))
}

/// Runtime of application `i` in whole nanoseconds.
fn runtime_ns(o: &Outcome, i: usize) -> u64 {
    let s = o.report.apps[i].runtime_s.expect("application finished");
    (s * NS_PER_S as f64).round() as u64
}

/// Time to move `bytes` at `bytes_per_s`, in ns, rounded as the model rounds each piece.
fn xfer(bytes: u64, bytes_per_s: u64) -> u64 {
    (bytes as f64 * NS_PER_S as f64 / bytes_per_s as f64 + 0.5) as u64
}

const ONE_WRITER: &str = "app a {\nprocesses 1\nfile f shared\nwrite f 16MiB\n}";

#[test]
fn one_request_through_one_link_takes_latency_plus_size_over_bandwidth() {
    // A 16 MiB write over a 1 GiB/s, 1 ms CN link: the data takes 1 ms + 16 MiB / (1 GiB/s);
    // the protocol adds three one-way control messages over the same link (request header,
    // grant, acknowledgement), 1 ms each.
    let sys = machine(
        1,
        &["compute.link_bandwidth=1GiB/s", "compute.link_latency=1ms"],
    );
    let o = run(&sys, ONE_WRITER);
    let l = 1_000_000;
    assert_eq!(runtime_ns(&o, 0), 3 * l + (l + 4 * xfer(4 * MIB, GIB)));
    assert_eq!(o.report.apps[0].write_bytes, 16 * MIB);
    assert_eq!(o.report.totals.pfs_written_bytes, 16 * MIB);
}

#[test]
fn pieces_pipeline_through_links_in_series() {
    // CN link 2 GiB/s then the ION's tree port 1 GiB/s: the slow link is busy from the moment
    // the first 4 MiB piece crosses the fast one, so T = p/B1 + S/B2 + latencies.
    let sys = machine(
        1,
        &[
            "compute.link_bandwidth=2GiB/s",
            "compute.link_latency=10us",
            "ion.tree_bandwidth=1GiB/s",
            "ion.tree_latency=20us",
        ],
    );
    let o = run(&sys, ONE_WRITER);
    let lat = 10_000 + 20_000;
    // request + grant + data propagation + acknowledgement = 4 x (CN link + tree) latency.
    let expected = 4 * lat + xfer(4 * MIB, 2 * GIB) + 4 * xfer(4 * MIB, GIB);
    assert_eq!(runtime_ns(&o, 0), expected);
}

#[test]
fn two_flows_sharing_a_link_each_get_half() {
    // Two nodes on one I/O node write 16 MiB each at the same time; each CN link and the
    // shared tree port run at 1 GiB/s. Pieces interleave at the tree port (packetized FIFO):
    // the first flow finishes at 2S/B, the second one piece later, at 2S/B + p/B.
    let sys = machine(
        2,
        &["compute.link_bandwidth=1GiB/s", "ion.tree_bandwidth=1GiB/s"],
    );
    let k = "app a {\nprocesses 1\nfile f per_process\nwrite f 16MiB\n}\n\
             app b {\nprocesses 1\nat 1\nfile f per_process\nwrite f 16MiB\n}";
    let o = run(&sys, k);
    let (s, p) = (16 * MIB, 4 * MIB);
    assert_eq!(o.report.apps[1].first_node, 1);
    assert_eq!(runtime_ns(&o, 0), 2 * xfer(s, GIB));
    assert_eq!(runtime_ns(&o, 1), 2 * xfer(s, GIB) + xfer(p, GIB));
    // Each flow's bandwidth is half the link (within one piece).
    for a in &o.report.apps {
        let share = a.perceived_write_gib_s;
        assert!((0.44..=0.5).contains(&share), "{share}");
    }
}

#[test]
fn two_flows_approach_processor_sharing_as_pieces_shrink() {
    // With 64 KiB pieces the one-piece lag is 1/256 of the transfer: both flows finish at
    // 2S/B, as with an ideal processor-sharing link.
    let sys = machine(
        2,
        &[
            "compute.link_bandwidth=1GiB/s",
            "ion.tree_bandwidth=1GiB/s",
            "ion.transfer_size=64KiB",
        ],
    );
    let k = "app a {\nprocesses 1\nfile f per_process\nwrite f 16MiB\n}\n\
             app b {\nprocesses 1\nat 1\nfile f per_process\nwrite f 16MiB\n}";
    let o = run(&sys, k);
    let ideal = 2 * xfer(16 * MIB, GIB) as i64;
    for i in 0..2 {
        let t = runtime_ns(&o, i) as i64;
        assert!((t - ideal).abs() <= ideal / 256 + 2, "{t} vs {ideal}");
    }
}

#[test]
fn read_from_the_pfs_comes_back_through_the_links() {
    // A read: request header to the ION, the ION's request to the server (storage network
    // latency), then the data crosses LUN -> storage network -> tree -> CN.
    let sys = machine(
        1,
        &[
            "storage.lun_bandwidth=500MiB/s",
            "storage.lun_latency=2ms",
            "storage_network.latency=100us",
            "compute.link_latency=10us",
        ],
    );
    let o = run(&sys, "app a {\nprocesses 1\nfile f shared\nread f 4MiB\n}");
    let expected = 10_000 + 100_000 + (2_000_000 + xfer(4 * MIB, 500 * MIB)) + 100_000 + 10_000;
    assert_eq!(runtime_ns(&o, 0), expected);
    let a = &o.report.apps[0];
    assert_eq!(a.read_bytes, 4 * MIB);
    assert_eq!(a.read_from_pfs_bytes, 4 * MIB);
    assert_eq!(o.report.totals.pfs_read_bytes, 4 * MIB);
}

#[test]
fn small_requests_pay_the_lun_penalty() {
    let sys = machine(
        1,
        &[
            "storage.lun_bandwidth=1GiB/s",
            "storage.small_request=64KiB",
            "storage.small_request_penalty=5ms",
        ],
    );
    let small = run(&sys, "app a {\nprocesses 1\nfile f shared\nwrite f 4KiB\n}");
    let large = run(
        &sys,
        "app a {\nprocesses 1\nfile f shared\nwrite f 64KiB\n}",
    );
    assert_eq!(runtime_ns(&small, 0), 5_000_000 + xfer(4096, GIB));
    assert_eq!(runtime_ns(&large, 0), xfer(65536, GIB));
}

/// A burst buffer at 1 GiB/s with 50 us access latency in front of a slow 100 MiB/s LUN.
fn bb_machine(extra: &[&str]) -> System {
    let mut sets = vec![
        "burst_buffer.enabled=true",
        "burst_buffer.write_bandwidth=1GiB/s",
        "burst_buffer.read_bandwidth=1GiB/s",
        "burst_buffer.write_latency=50us",
        "burst_buffer.read_latency=50us",
        "storage.lun_bandwidth=100MiB/s",
    ];
    sets.extend_from_slice(extra);
    machine(1, &sets)
}

#[test]
fn write_behind_acknowledges_at_burst_buffer_speed() {
    // Liu Eq. 1 per 4 MiB piece: T = L/B + latency; the 16 MiB request is acknowledged when
    // its four pieces are on the SSD, long before the 100 MiB/s LUN could have taken them.
    let o = run(&bb_machine(&[]), ONE_WRITER);
    let per_piece = xfer(4 * MIB, GIB) + 50_000;
    assert_eq!(runtime_ns(&o, 0), 4 * per_piece);
    let a = &o.report.apps[0];
    assert_eq!(a.bb_absorbed_bytes, 16 * MIB);
    assert_eq!(a.bb_overflow_bytes, 0);
    // The drain still writes every byte to the file servers, at the LUN's pace.
    let t = &o.report.totals;
    assert_eq!(t.pfs_written_bytes, 16 * MIB);
    assert_eq!(t.bb_drained_bytes, 16 * MIB);
    assert_eq!(t.bb_left_bytes, 0);
    let drained_at = t.last_drain_s.expect("drained");
    assert!(
        drained_at >= 16.0 * MIB as f64 / (100.0 * MIB as f64),
        "{drained_at}"
    );
}

#[test]
fn commit_waits_for_the_drain() {
    let o = run(
        &bb_machine(&[]),
        "app a {\nprocesses 1\nfile f shared\nwrite f 16MiB\ncommit\n}",
    );
    let t = &o.report.totals;
    let drained_at = t.last_drain_s.expect("drained");
    let runtime = o.report.apps[0].runtime_s.expect("finished");
    assert!(runtime >= drained_at, "{runtime} < {drained_at}");
    // The LUN needs 160 ms for 16 MiB; the commit waited for most of it.
    assert!(o.report.apps[0].commit_wait_max_s > 0.1);
    assert_eq!(o.report.apps[0].commits, 1);
}

#[test]
fn a_full_burst_buffer_falls_back_to_direct_writes() {
    // 8 MiB of buffer that is not drained before a commit (lazy drain, watermark 100%), and
    // four 4 MiB requests: the first two are absorbed, the last two take the original path.
    let sys = bb_machine(&[
        "burst_buffer.capacity=8MiB",
        "burst_buffer.drain=lazy",
        "burst_buffer.high_watermark=1.0",
    ]);
    let o = run(
        &sys,
        "app a {\nprocesses 1\nfile f shared\nwrite f 16MiB request 4MiB\ncommit\n}",
    );
    let a = &o.report.apps[0];
    assert_eq!(a.bb_absorbed_bytes, 8 * MIB);
    assert_eq!(a.bb_overflow_bytes, 8 * MIB);
    assert_eq!(a.direct_write_bytes, 8 * MIB);
    let t = &o.report.totals;
    assert_eq!(
        t.pfs_written_bytes,
        16 * MIB,
        "every byte reaches the PFS once"
    );
    assert_eq!(t.bb_peak_occupancy_bytes, 8 * MIB);
    assert_eq!(t.bb_left_bytes, 0);
}

#[test]
fn space_freed_by_the_drain_is_granted_again() {
    // Same, with the eager drain and a 1 MiB/s LUN: request 3 overflows (the drain of request
    // 1 takes 4 s), and while it waits behind the drain at the LUN, request 1's space comes
    // back, so request 4 is absorbed again.
    let sys = bb_machine(&["burst_buffer.capacity=8MiB", "storage.lun_bandwidth=1MiB/s"]);
    let o = run(
        &sys,
        "app a {\nprocesses 1\nfile f shared\nwrite f 16MiB request 4MiB\n}",
    );
    let a = &o.report.apps[0];
    assert_eq!(a.bb_absorbed_bytes, 12 * MIB);
    assert_eq!(a.bb_overflow_bytes, 4 * MIB);
    assert_eq!(o.report.totals.pfs_written_bytes, 16 * MIB);
}

#[test]
fn lazy_drain_waits_for_commit() {
    let sys = bb_machine(&[
        "burst_buffer.drain=\"lazy\"",
        "burst_buffer.high_watermark=0.9",
    ]);
    // No commit: nothing is drained, and the report says what is left.
    let o = run(&sys, ONE_WRITER);
    assert_eq!(o.report.totals.bb_drained_bytes, 0);
    assert_eq!(o.report.totals.bb_left_bytes, 16 * MIB);
    assert_eq!(o.report.totals.pfs_written_bytes, 0);
    // With a commit after an hour of compute, the storage sees nothing before the commit.
    let o = run(
        &sys,
        "app a {\nprocesses 1\nfile f shared\nwrite f 16MiB\ncompute 1h\ncommit f\n}",
    );
    assert_eq!(o.report.totals.pfs_written_bytes, 16 * MIB);
    let first_storage_bin = o
        .series
        .bins
        .iter()
        .position(|b| b.storage_write_bytes > 0)
        .expect("storage traffic");
    assert_eq!(
        first_storage_bin, 360,
        "the drain starts at the commit (bin of 10 s)"
    );
}

#[test]
fn reads_hit_the_burst_buffer_while_data_is_not_drained() {
    let k = "app a {\nprocesses 1\nfile f shared\nwrite f 8MiB\nread f 8MiB\n}";
    let o = run(&bb_machine(&[]), k);
    let a = &o.report.apps[0];
    assert_eq!(
        a.read_from_bb_bytes,
        8 * MIB,
        "the drain is slow: data still in the SSD"
    );
    assert_eq!(o.report.totals.pfs_read_bytes, 0);
    // After a commit the data is on the PFS only.
    let k = "app a {\nprocesses 1\nfile f shared\nwrite f 8MiB\ncommit\nread f 8MiB\n}";
    let o = run(&bb_machine(&[]), k);
    assert_eq!(o.report.apps[0].read_from_pfs_bytes, 8 * MIB);
    assert_eq!(o.report.totals.pfs_read_bytes, 8 * MIB);
}

#[test]
fn barriers_align_processes_and_phases_are_measured_across_them() {
    // Two processes, one on a slow node: the barrier makes the fast one wait, and the phase
    // time is from the first process in to the last one out.
    let sys = machine(2, &["storage.lun_bandwidth=1GiB/s"]);
    let k =
        "app a {\nprocesses 2\nfile f per_process\nbarrier\nwrite f 16MiB\nbarrier\ncompute 1s\n}";
    let o = run(&sys, k);
    let a = &o.report.apps[0];
    // Both write 16 MiB to one LUN: 32 MiB at 1 GiB/s, then 1 s of compute.
    let io = 2 * xfer(16 * MIB, GIB);
    assert_eq!(runtime_ns(&o, 0), io + NS_PER_S);
    assert!((a.write_time_s - io as f64 / 1e9).abs() < 1e-9);
    assert_eq!(a.write_bytes, 32 * MIB);
}

#[test]
fn placement_errors_name_the_application() {
    let sys = machine(4, &[]);
    let k = kernel::parse(
        "app big {\nprocesses 8\nfile f shared\nwrite f 1MiB\n}",
        "k",
        &BTreeMap::new(),
    )
    .unwrap();
    let e = simulate(&sys, &k.apps, &SimOptions::default(), None)
        .err()
        .expect("too big")
        .to_string();
    assert!(
        e.contains("'big' needs 8 compute nodes") && e.contains("has 4"),
        "{e}"
    );
    let k = kernel::parse(
        "app a {\nprocesses 2\nfile f shared\nwrite f 1MiB\n}\napp b {\nprocesses 1\nat 1\nfile f shared\nwrite f 1MiB\n}",
        "k",
        &BTreeMap::new(),
    )
    .unwrap();
    let e = simulate(&sys, &k.apps, &SimOptions::default(), None)
        .err()
        .expect("overlap")
        .to_string();
    assert!(
        e.contains("'b' (nodes 1-1) overlaps 'a' (nodes 0-1)"),
        "{e}"
    );
}

#[test]
fn programs_beyond_the_model_limits_are_refused_up_front() {
    let sys = machine(4, &[]);
    let refuse = |text: &str| {
        let k = kernel::parse(text, "k", &BTreeMap::new()).unwrap();
        simulate(&sys, &k.apps, &SimOptions::default(), None)
            .err()
            .expect("refused")
            .to_string()
    };
    let e = refuse("app a {\nprocesses 4\nfile f shared\nrepeat 4000 {\nwrite f 1PiB\n}\n}");
    assert!(
        e.contains("k:1: application 'a' writes more than 2 EiB"),
        "{e}"
    );
    let e = refuse("app a {\nprocesses 1\nrepeat 100000 {\ncompute 1000d\n}\n}");
    assert!(e.contains("more than 18 years"), "{e}");
    let e = refuse(
        "app a {\nprocesses 1\nfile f shared\nrepeat 2000 {\nrepeat 1000 {\nwrite f 1B\n}\n}\n}",
    );
    assert!(e.contains("2000000 write/read statements"), "{e}");
}

#[test]
fn until_stops_the_clock() {
    let sys = machine(1, &[]);
    let k = "app a {\nprocesses 1\nfile f shared\ncompute 2h\nwrite f 1MiB\n}";
    let k = kernel::parse(k, "k", &BTreeMap::new()).unwrap();
    let opts = SimOptions {
        until: Some(3600 * NS_PER_S),
        ..SimOptions::default()
    };
    let o = simulate(&sys, &k.apps, &opts, None).unwrap();
    assert!(!o.report.apps[0].finished);
    assert_eq!(o.report.totals.stopped_by, "until");
    assert!(o.report.totals.simulated_s <= 3600.0);
}
