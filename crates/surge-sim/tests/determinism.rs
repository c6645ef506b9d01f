//! The same inputs and seed give the same run, event for event; the seed only matters where
//! the kernels ask for randomness.

use std::collections::BTreeMap;
use surge_sim::{kernel, simulate, Report, SimOptions, System};

const SYSTEM: &str = include_str!("../../../examples/sim/systems/intrepid-32k.toml");

fn run(kernel_text: &str, seed: u64) -> Report {
    let sys = System::from_toml(
        SYSTEM,
        "intrepid-32k.toml",
        &[
            "compute.nodes=512".into(),
            "file_servers.count=4".into(),
            "storage.racks=1".into(),
        ],
    )
    .unwrap();
    let k = kernel::parse(kernel_text, "k", &BTreeMap::new()).unwrap();
    let opts = SimOptions {
        seed,
        ..SimOptions::default()
    };
    simulate(&sys, &k.apps, &opts, None).unwrap().report
}

/// The report without the wall-clock fields.
fn fingerprint(r: &Report) -> String {
    let mut v = serde_json::to_value(r).unwrap();
    let e = v["engine"].as_object_mut().unwrap();
    e.remove("wall_s");
    e.remove("events_per_s");
    v.to_string()
}

const TWO_APPS: &str = "
app writer {
    nodes 256
    per_node 4
    file out per_process
    repeat 3 {
        compute 60s jitter 20%
        write out 24MiB request 8MiB
        barrier
    }
    commit
}
app reader {
    nodes 128
    per_node 4
    file data shared
    write data 8MiB
    barrier
    compute 30s
    read data 8MiB request 1MiB
}";

#[test]
fn same_seed_same_run() {
    let a = run(TWO_APPS, 7);
    let b = run(TWO_APPS, 7);
    assert_eq!(fingerprint(&a), fingerprint(&b));
    assert!(
        a.engine.events > 100_000,
        "a real run: {} events",
        a.engine.events
    );
}

#[test]
fn the_seed_changes_jittered_compute_and_file_placement() {
    let a = run(TWO_APPS, 7);
    let b = run(TWO_APPS, 8);
    assert_ne!(a.apps[0].runtime_s, b.apps[0].runtime_s);
    // The bytes moved do not depend on the seed.
    assert_eq!(a.totals.pfs_written_bytes, b.totals.pfs_written_bytes);
    assert_eq!(a.apps[1].read_bytes, b.apps[1].read_bytes);
}
