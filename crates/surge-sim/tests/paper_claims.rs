//! Liu et al.'s qualitative claims, asserted on the shipped examples (`examples/sim/`, the
//! copies compiled into the crate) at reduced scale so the suite stays fast: 1/16 of the
//! paper's node and file-server counts for Figures 3, 4a and 4b, 1/32 for the 5-hour
//! multi-application study. Scaling keeps per-node and per-I/O-node data and every bandwidth
//! ratio; the full-scale numbers are in docs/SIM.md (`surge sim experiment all`).

use surge_sim::experiment::{self, Cell, ExperimentName, ExperimentOptions};

fn opts(scale: f64) -> ExperimentOptions {
    ExperimentOptions {
        scale,
        ..ExperimentOptions::default()
    }
}

fn col(rows: &[Vec<Cell>], c: usize) -> Vec<f64> {
    rows.iter().map(|r| r[c].num().expect("a number")).collect()
}

#[test]
fn fig3_burst_buffer_scales_linearly_and_no_bb_flattens_at_the_storage_limit() {
    let r = experiment::run(ExperimentName::Fig3, &opts(1.0 / 16.0)).unwrap();
    let procs = col(&r.rows, 0);
    let (bb_full, bb_half) = (col(&r.rows, 1), col(&r.rows, 2));
    let (no_full, no_half) = (col(&r.rows, 3), col(&r.rows, 4));
    let tree = col(&r.rows, 5);
    assert!(procs.len() >= 5, "{procs:?}");
    for i in 0..procs.len() {
        // With a BB: at the CN -> ION (tree) limit at every scale, whatever the storage.
        assert!(
            bb_full[i] >= 0.97 * tree[i],
            "{} procs: {} vs tree {}",
            procs[i],
            bb_full[i],
            tree[i]
        );
        assert!(
            (bb_half[i] / bb_full[i] - 1.0).abs() < 0.02,
            "half storage with BB"
        );
        if i > 0 {
            let growth = bb_full[i] / bb_full[i - 1];
            assert!(
                (1.9..=2.1).contains(&growth),
                "linear: x{growth} at {}",
                procs[i]
            );
        }
    }
    let n = procs.len();
    // Without: flat at the largest scales, far below the BB curve; half storage ~ half.
    assert!(
        (no_full[n - 1] / no_full[n - 2] - 1.0).abs() < 0.05,
        "{no_full:?}"
    );
    assert!(no_full[n - 1] < 0.2 * bb_full[n - 1]);
    let ratio = no_half[n - 1] / no_full[n - 1];
    assert!(
        (0.4..=0.6).contains(&ratio),
        "half/full without BB: {ratio}"
    );
}

#[test]
fn fig4a_burst_buffer_overlaps_the_drain_with_computation() {
    let r = experiment::run(ExperimentName::Fig4a, &opts(1.0 / 16.0)).unwrap();
    let (none, no_bb, bb) = (col(&r.rows, 1), col(&r.rows, 2), col(&r.rows, 3));
    let n = none.len();
    for i in 0..n {
        // Two 5-minute compute phases, nothing else: 600 s plus a few control messages.
        assert!((none[i] - 600.0).abs() < 0.01, "{}", none[i]);
        assert!(
            bb[i] <= no_bb[i] + 1e-6,
            "BB never slower: {} vs {}",
            bb[i],
            no_bb[i]
        );
    }
    // At the largest scale the storage is the bottleneck: the BB hides a large part of the
    // I/O cost (the first burst drains during the second compute phase).
    let saved = 1.0 - (bb[n - 1] - 600.0) / (no_bb[n - 1] - 600.0);
    assert!(saved > 0.3, "saved {saved}");
}

#[test]
fn fig4b_bandwidth_falls_once_requests_overflow_the_burst_buffer() {
    let r = experiment::run(ExperimentName::Fig4b, &opts(1.0 / 16.0)).unwrap();
    let req = col(&r.rows, 0);
    let (bb, overflow, no_bb) = (col(&r.rows, 1), col(&r.rows, 2), col(&r.rows, 3));
    assert_eq!(req, vec![1.0, 2.0, 4.0, 8.0, 16.0]);
    let at4 = 2;
    for i in 0..=at4 {
        assert_eq!(overflow[i], 0.0, "fits in 4 GiB up to 4 MiB requests");
        assert!(bb[i] > 1.5 * no_bb[i]);
    }
    assert!(
        overflow[4] > 25.0,
        "16 MiB requests overflow: {}%",
        overflow[4]
    );
    assert!(bb[4] < 0.8 * bb[at4], "and the bandwidth drops: {bb:?}");
}

#[test]
fn multiapp_half_storage_is_enough_with_burst_buffers() {
    let runs = experiment::multiapp_runs(&opts(1.0 / 32.0)).unwrap();
    let get = |bb: bool, half: bool| {
        &runs
            .iter()
            .find(|r| r.bb == bb && r.half == half)
            .expect("configuration")
            .outcome
            .report
    };
    let (bb_full, bb_half) = (get(true, false), get(true, true));
    let (no_full, no_half) = (get(false, false), get(false, true));
    for i in 0..3 {
        let name = &bb_full.apps[i].name;
        let (f, h) = (
            bb_full.apps[i].perceived_write_gib_s,
            bb_half.apps[i].perceived_write_gib_s,
        );
        assert!(
            (h / f - 1.0).abs() < 0.05,
            "{name}: BB half {h} vs full {f}"
        );
        assert!(bb_full.apps[i].finished && bb_half.apps[i].finished);
        // Runtimes are the same too ("no observable difference", Fig. 5c/5d).
        let (rf, rh) = (
            bb_full.apps[i].runtime_s.unwrap(),
            bb_half.apps[i].runtime_s.unwrap(),
        );
        assert!((rh / rf - 1.0).abs() < 0.01, "{name}: runtime {rh} vs {rf}");
    }
    // Without burst buffers halving the storage hurts the big writers.
    for i in 0..2 {
        let (f, h) = (
            no_full.apps[i].perceived_write_gib_s,
            no_half.apps[i].perceived_write_gib_s,
        );
        assert!(
            h < 0.7 * f,
            "{}: no BB half {h} vs full {f}",
            no_full.apps[i].name
        );
    }
    // And the burst buffers accelerate every application.
    for i in 0..3 {
        assert!(
            bb_full.apps[i].perceived_write_gib_s > 1.5 * no_full.apps[i].perceived_write_gib_s
        );
    }
    // Every byte written reaches the storage in each configuration, and the half system's
    // disks are busier (Fig. 6d: "even higher disk utilization").
    for rep in [bb_full, bb_half, no_full, no_half] {
        assert_eq!(rep.totals.pfs_written_bytes, rep.totals.apps_written_bytes);
        assert_eq!(rep.totals.bb_left_bytes, 0);
    }
    assert!(bb_half.totals.lun_utilization > 1.8 * bb_full.totals.lun_utilization);
}
