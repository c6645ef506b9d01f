//! Performance-target allocation (DESIGN §6, Daley §5.3): from `#SURGE jobdw bandwidth=...
//! iops=... metadata=... capacity=...` and the calibrated peaks of one fragment, the fragments
//! to allocate, what they promise and why, or a refusal with the best the pool can offer.
//!
//! The model is the one Daley used to size DataWarp allocations: data bandwidth and IOPS add up
//! with fragments (an instance stripes every file over all of them); metadata does not, since
//! a striped namespace has one metadata service, while a private namespace has one per compute
//! node. A fragment's bandwidth is the lower of its read and write peaks, its IOPS the lower of
//! its read and write IOPS, so the promise holds for either direction. Pure arithmetic: no
//! state, no I/O; the caller gives the peaks and the pool's free fragments.

use surge_core::directives::{AccessMode, Targets};
use surge_core::peaks::Peaks;

/// What an allocation of `fragments` gives.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Offer {
    pub fragments: u64,
    pub capacity: u64,
    /// Bytes per second.
    pub bandwidth: f64,
    pub iops: f64,
    pub metadata: f64,
}

/// The allocation chosen for a set of targets.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Sizing {
    pub offer: Offer,
    /// One line per target: asked, promised, and what decided it.
    pub why: Vec<String>,
}

/// The pool cannot meet the targets.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{}; the best this pool offers is {} fragment(s): {}", reasons.join("; "), best.fragments, describe(best))]
pub struct Unmet {
    pub reasons: Vec<String>,
    pub best: Offer,
}

fn per_fragment(a: f64, b: f64) -> f64 {
    match (a > 0.0, b > 0.0) {
        (true, true) => a.min(b),
        (true, false) => a,
        (false, true) => b,
        (false, false) => 0.0,
    }
}

fn gib_s(b: f64) -> String {
    format!("{:.2} GiB/s", b / (1u64 << 30) as f64)
}

fn ops(o: f64) -> String {
    if o >= 1000.0 {
        format!("{:.1}k/s", o / 1000.0)
    } else {
        format!("{o:.0}/s")
    }
}

pub fn describe(o: &Offer) -> String {
    format!(
        "{}, {} bandwidth, {} IOPS, {} metadata",
        surge_core::format_bytes(o.capacity),
        gib_s(o.bandwidth),
        ops(o.iops),
        ops(o.metadata)
    )
}

/// What `fragments` fragments give in `mode` on `nodes` compute nodes.
pub fn offer(
    peaks: &Peaks,
    granularity: u64,
    fragments: u64,
    mode: AccessMode,
    nodes: u32,
) -> Offer {
    let services = match mode {
        AccessMode::Striped => 1.0,
        // ldbalance: one replica per node (capped by the servers; counted here by nodes).
        AccessMode::Private | AccessMode::Ldbalance => f64::from(nodes.max(1)),
    };
    Offer {
        fragments,
        capacity: fragments.saturating_mul(granularity),
        bandwidth: fragments as f64 * per_fragment(peaks.read_bw, peaks.write_bw),
        iops: fragments as f64 * per_fragment(peaks.read_iops, peaks.write_iops),
        metadata: services * peaks.metadata_ops,
    }
}

/// Sizes an allocation. `capacity` is the capacity asked for (0: only targets);
/// `free_fragments` what the pool can give now.
pub fn size(
    targets: &Targets,
    capacity: u64,
    mode: AccessMode,
    nodes: u32,
    peaks: &Peaks,
    granularity: u64,
    free_fragments: u64,
) -> Result<Sizing, Unmet> {
    let g = granularity.max(1);
    let one = offer(peaks, g, 1, mode, nodes);
    let mut need = capacity.div_ceil(g).max(1);
    let mut why = Vec::new();
    let mut reasons = Vec::new();
    if capacity > 0 {
        why.push(format!(
            "capacity {} asked: {} fragment(s) of {}",
            surge_core::format_bytes(capacity),
            capacity.div_ceil(g),
            surge_core::format_bytes(g)
        ));
    }
    for (name, asked, each) in [
        ("bandwidth", targets.bandwidth, one.bandwidth),
        ("iops", targets.iops, one.iops),
    ] {
        let Some(asked) = asked else { continue };
        let shown = |v: f64| {
            if name == "bandwidth" {
                gib_s(v)
            } else {
                ops(v)
            }
        };
        if each <= 0.0 {
            reasons.push(format!(
                "{name}={} cannot be promised: the peaks file has no {name} peak",
                shown(asked as f64)
            ));
            continue;
        }
        let f = (asked as f64 / each).ceil() as u64;
        why.push(format!(
            "{name} {} asked: {f} fragment(s) of {} each",
            shown(asked as f64),
            shown(each)
        ));
        need = need.max(f);
    }
    if let Some(asked) = targets.metadata {
        let have = one.metadata;
        if (asked as f64) > have {
            reasons.push(match mode {
                AccessMode::Striped => format!(
                    "metadata={} exceeds the {} one striped metadata service sustains (fragments \
                     do not add metadata services); use access_mode=private (one service per \
                     compute node) or a lower target",
                    ops(asked as f64),
                    ops(have)
                ),
                AccessMode::Private | AccessMode::Ldbalance => format!(
                    "metadata={} exceeds the {} of {} compute node(s)' metadata services; \
                     run on more nodes or lower the target",
                    ops(asked as f64),
                    ops(have),
                    nodes.max(1)
                ),
            });
        } else {
            why.push(format!(
                "metadata {} asked: {} metadata service(s) give {}",
                ops(asked as f64),
                if mode != AccessMode::Striped {
                    nodes.max(1)
                } else {
                    1
                },
                ops(have)
            ));
        }
    }
    if need > free_fragments {
        reasons.push(format!(
            "{need} fragment(s) are needed but the pool has {free_fragments} free"
        ));
    }
    if !reasons.is_empty() {
        return Err(Unmet {
            reasons,
            best: offer(peaks, g, free_fragments.min(need), mode, nodes),
        });
    }
    Ok(Sizing {
        offer: offer(peaks, g, need, mode, nodes),
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use surge_core::peaks::{MetadataDetail, ProcsAtPeak, PEAKS_SCHEMA};

    const GIB: u64 = 1 << 30;

    /// Daley's Cori fragment: 6 GiB/s, 90K IOPS, 25K metadata operations per second.
    fn cori() -> Peaks {
        Peaks {
            schema: PEAKS_SCHEMA.into(),
            path: "/bb".into(),
            host: "h".into(),
            measured_at: "2026-01-01T00:00:00Z".into(),
            read_bw: 6.5 * GIB as f64,
            write_bw: 6.0 * GIB as f64,
            read_iops: 95_000.0,
            write_iops: 90_000.0,
            metadata_ops: 25_000.0,
            procs_at_peak: ProcsAtPeak::default(),
            metadata_detail: MetadataDetail::default(),
        }
    }

    fn t(bw: Option<u64>, iops: Option<u64>, md: Option<u64>) -> Targets {
        Targets {
            bandwidth: bw,
            iops,
            metadata: md,
        }
    }

    #[test]
    fn bandwidth_sets_fragments_from_the_lower_of_read_and_write() {
        let s = size(
            &t(Some(20 * GIB), None, None),
            0,
            AccessMode::Striped,
            1,
            &cori(),
            200 * GIB,
            100,
        )
        .unwrap();
        // 20 / 6 GiB/s = 3.33: 4 fragments, promising 24 GiB/s.
        assert_eq!(s.offer.fragments, 4);
        assert_eq!(s.offer.capacity, 800 * GIB);
        assert_eq!(s.offer.bandwidth, 24.0 * GIB as f64);
    }

    #[test]
    fn the_largest_need_wins() {
        let s = size(
            &t(Some(6 * GIB), Some(400_000), None),
            2000 * GIB,
            AccessMode::Striped,
            1,
            &cori(),
            200 * GIB,
            100,
        )
        .unwrap();
        assert_eq!(s.offer.fragments, 10, "{:?}", s.why);
    }

    #[test]
    fn striped_metadata_beyond_one_service_is_refused_and_private_scales_with_nodes() {
        let e = size(
            &t(None, None, Some(50_000)),
            0,
            AccessMode::Striped,
            4,
            &cori(),
            200 * GIB,
            100,
        )
        .unwrap_err();
        assert!(e.to_string().contains("access_mode=private"), "{e}");
        let s = size(
            &t(None, None, Some(50_000)),
            0,
            AccessMode::Private,
            2,
            &cori(),
            200 * GIB,
            100,
        )
        .unwrap();
        assert_eq!(s.offer.metadata, 50_000.0);
    }

    #[test]
    fn a_pool_too_small_is_refused_with_its_best_offer() {
        let e = size(
            &t(Some(60 * GIB), None, None),
            0,
            AccessMode::Striped,
            1,
            &cori(),
            200 * GIB,
            3,
        )
        .unwrap_err();
        assert_eq!(e.best.fragments, 3);
        assert!(
            e.to_string()
                .contains("10 fragment(s) are needed but the pool has 3 free"),
            "{e}"
        );
        assert!(e.to_string().contains("18.00 GiB/s"), "{e}");
    }
}
