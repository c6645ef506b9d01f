//! Daley's Tables 1-3 and the verdict, derived from a [`Profile`]'s raw counters and, when
//! given, calibrated [`Peaks`] (`surge bench calibrate`).
//!
//! The arithmetic is the paper's (Daley et al., FGCS 2020, §4.2.1 and §4.4): rates are per second
//! *of I/O time* of their kind (bandwidth = bytes / data time, metadata rate = metadata ops /
//! metadata time); "% of peak" divides by the calibrated peak; "pipelines to saturate" is
//! ceil(100 / % of peak), the data peak being the larger of the bandwidth and IOPS percentages.
//! Fed the paper's own Table 2 numbers, [`table2_from_totals`] reproduces its last six rows
//! (see the tests). The verdict follows §3: a stage is metadata-, IOPS- or bandwidth-bound
//! depending on whether its I/O time is dominated by open/close/stat calls, small transfers or
//! large transfers.

use crate::model::{Counters, Profile, SMALL_IO_BYTES};
use serde::{Deserialize, Serialize};
use surge_core::peaks::Peaks;

const MIB: f64 = 1024.0 * 1024.0;

/// Table 1: resource requirements of the stage.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Table1 {
    pub processes: usize,
    /// Most threads any one process had (Daley's "compute threads").
    pub threads: u32,
    /// Most threads of any one process that made I/O calls (Daley's "I/O threads").
    pub io_threads: u32,
    /// Largest peak resident memory of any process, MiB (Daley's "peak memory footprint").
    pub peak_memory_mib: f64,
    /// Sum of the sizes of all storage files touched, MiB (Daley's "total file size").
    pub total_file_size_mib: f64,
    /// Regular files among them.
    pub files: usize,
}

/// Table 2: performance of the stage.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Table2 {
    pub wall_time_s: f64,
    pub io_time_pct: f64,
    pub data_time_s: f64,
    pub meta_time_s: f64,
    /// Of the data time, seconds in transfers of at most 100 KiB and syncs (IOPS-class).
    pub small_data_time_s: f64,
    pub large_data_time_s: f64,
    pub sync_time_s: f64,
    pub io_mib: f64,
    pub read_mib: f64,
    pub write_mib: f64,
    pub read_write_ops: u64,
    pub syncs: u64,
    pub mean_transfer_kib: f64,
    pub metadata_ops: u64,
    pub bandwidth_mib_s: f64,
    pub read_write_rate_ops_s: f64,
    pub metadata_rate_ops_s: f64,
    /// Present when peaks were given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peaks: Option<PeakUse>,
}

/// The peak-relative rows of Table 2 and the pipelines estimates.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PeakUse {
    /// The peaks file's measured path.
    pub peaks_path: String,
    pub peak_bandwidth_mib_s: f64,
    pub peak_iops: f64,
    pub peak_metadata_ops_s: f64,
    pub pct_peak_bandwidth: f64,
    pub pct_peak_iops: f64,
    pub pct_peak_metadata: f64,
    /// Daley's estimate: every pipeline does its I/O at the same time (tightly coupled), so
    /// ceil(100 / max(% bandwidth, % IOPS)).
    pub pipelines_to_saturate_data: u64,
    pub pipelines_to_saturate_metadata: u64,
    /// The other bound: pipelines do their I/O at independent times (loosely coupled, what
    /// Daley observed, §4.2.2), so the demand of one pipeline is averaged over its wall time.
    pub pipelines_to_saturate_data_sustained: u64,
    pub pipelines_to_saturate_metadata_sustained: u64,
    /// One pipeline's average demand (over its wall time) as % of each peak. Unlike the rates
    /// above, these do not depend on how fast each kind of call was on the profiled storage,
    /// so they rank the resources fairly when the profile was not taken on the target.
    pub pct_sustained_bandwidth: f64,
    pub pct_sustained_iops: f64,
    pub pct_sustained_metadata: f64,
}

/// Table 3: data movement.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Table3 {
    /// Share of bytes moved to files under `--data-path` (None without `--data-path`).
    pub user_io_pct: Option<f64>,
    /// Bytes moved / total file size.
    pub data_reuse: f64,
    pub user_data_reuse: Option<f64>,
    pub read_write_ratio: Option<f64>,
    pub read_write_ratio_user: Option<f64>,
}

/// What bounds the stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bound {
    BandwidthBound,
    IopsBound,
    MetadataBound,
    /// No I/O at all.
    NoIo,
}

impl Bound {
    pub fn label(self) -> &'static str {
        match self {
            Bound::BandwidthBound => "bandwidth-bound",
            Bound::IopsBound => "IOPS-bound",
            Bound::MetadataBound => "metadata-bound",
            Bound::NoIo => "no I/O",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub bound: Bound,
    /// One sentence with the numbers that decided it.
    pub reason: String,
    /// Share of the I/O time in metadata calls.
    pub metadata_share_pct: f64,
    /// Share of the data time in small transfers and syncs.
    pub small_share_pct: f64,
    /// How the small/large split was measured: "time" (per-call times by size, the shim and
    /// strace) or "mean-size" (only the mean transfer size was known, Darshan).
    pub small_large_basis: String,
    /// When peaks were given: the resource that saturates first as pipelines are added
    /// (Daley §5.1), and after how many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limiter_at_scale: Option<LimiterAtScale>,
    /// Remarks a reader should not miss (e.g. "I/O is only 2% of the wall time").
    #[serde(default)]
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LimiterAtScale {
    pub bound: Bound,
    pub pipelines: u64,
}

/// Everything derived from a profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub table1: Table1,
    pub table2: Table2,
    pub table3: Table3,
    pub verdict: Verdict,
    /// Reads / writes per transfer-size bucket over all storage files.
    pub hist_read: [u64; 10],
    pub hist_write: [u64; 10],
}

/// The inputs of Table 2, so that the paper's own numbers can be fed through the same code.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    pub wall_time_s: f64,
    pub data_time_s: f64,
    pub meta_time_s: f64,
    pub small_data_time_s: f64,
    pub large_data_time_s: f64,
    pub sync_time_s: f64,
    pub read_bytes: f64,
    pub write_bytes: f64,
    pub read_write_ops: u64,
    pub syncs: u64,
    pub metadata_ops: u64,
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

fn pipelines(pct: f64) -> u64 {
    if pct > 0.0 {
        (100.0 / pct).ceil().max(1.0) as u64
    } else {
        0
    }
}

/// Byte-weighted peak: the rate at which `r` bytes read at `peak_r` and `w` bytes written at
/// `peak_w` would move together.
fn mixed_peak(r: f64, w: f64, peak_r: f64, peak_w: f64) -> f64 {
    let (r, w) = if r + w > 0.0 { (r, w) } else { (1.0, 1.0) };
    let t = ratio(r, peak_r) + ratio(w, peak_w);
    ratio(r + w, t)
}

/// Table 2 from totals, with the peak rows when peaks are given.
pub fn table2_from_totals(t: &Totals, peaks: Option<&Peaks>) -> Table2 {
    let io_time = t.data_time_s + t.meta_time_s;
    let bytes = t.read_bytes + t.write_bytes;
    let mut out = Table2 {
        wall_time_s: t.wall_time_s,
        io_time_pct: 100.0 * ratio(io_time, t.wall_time_s),
        data_time_s: t.data_time_s,
        meta_time_s: t.meta_time_s,
        small_data_time_s: t.small_data_time_s,
        large_data_time_s: t.large_data_time_s,
        sync_time_s: t.sync_time_s,
        io_mib: bytes / MIB,
        read_mib: t.read_bytes / MIB,
        write_mib: t.write_bytes / MIB,
        read_write_ops: t.read_write_ops,
        syncs: t.syncs,
        mean_transfer_kib: ratio(bytes, t.read_write_ops as f64) / 1024.0,
        metadata_ops: t.metadata_ops,
        bandwidth_mib_s: ratio(bytes / MIB, t.data_time_s),
        read_write_rate_ops_s: ratio(t.read_write_ops as f64, t.data_time_s),
        metadata_rate_ops_s: ratio(t.metadata_ops as f64, t.meta_time_s),
        peaks: None,
    };
    if let Some(p) = peaks {
        let peak_bw = mixed_peak(t.read_bytes, t.write_bytes, p.read_bw, p.write_bw) / MIB;
        let peak_iops = mixed_peak(t.read_bytes, t.write_bytes, p.read_iops, p.write_iops);
        let pct_bw = 100.0 * ratio(out.bandwidth_mib_s, peak_bw);
        let pct_iops = 100.0 * ratio(out.read_write_rate_ops_s, peak_iops);
        let pct_md = 100.0 * ratio(out.metadata_rate_ops_s, p.metadata_ops);
        // Sustained demand: what one pipeline asks for on average over its whole run.
        let sus_bw = 100.0 * ratio(ratio(bytes / MIB, t.wall_time_s), peak_bw);
        let sus_iops = 100.0 * ratio(ratio(t.read_write_ops as f64, t.wall_time_s), peak_iops);
        let sus_md = 100.0 * ratio(ratio(t.metadata_ops as f64, t.wall_time_s), p.metadata_ops);
        out.peaks = Some(PeakUse {
            peaks_path: p.path.clone(),
            peak_bandwidth_mib_s: peak_bw,
            peak_iops,
            peak_metadata_ops_s: p.metadata_ops,
            pct_peak_bandwidth: pct_bw,
            pct_peak_iops: pct_iops,
            pct_peak_metadata: pct_md,
            pipelines_to_saturate_data: pipelines(pct_bw.max(pct_iops)),
            pipelines_to_saturate_metadata: pipelines(pct_md),
            pipelines_to_saturate_data_sustained: pipelines(sus_bw.max(sus_iops)),
            pipelines_to_saturate_metadata_sustained: pipelines(sus_md),
            pct_sustained_bandwidth: sus_bw,
            pct_sustained_iops: sus_iops,
            pct_sustained_metadata: sus_md,
        });
    }
    out
}

fn totals_of(c: &Counters, wall_time_s: f64) -> Totals {
    Totals {
        wall_time_s,
        data_time_s: c.data_time_ns() as f64 / 1e9,
        meta_time_s: c.meta_time_ns as f64 / 1e9,
        small_data_time_s: c.small_data_time_ns as f64 / 1e9,
        large_data_time_s: c.large_data_time_ns as f64 / 1e9,
        sync_time_s: c.sync_time_ns as f64 / 1e9,
        read_bytes: c.bytes_read_total() as f64,
        write_bytes: c.bytes_written_total() as f64,
        read_write_ops: c.data_ops(),
        syncs: c.syncs,
        metadata_ops: c.meta_ops(),
    }
}

/// The verdict of §3 from Table 2's times, plus the limiter at scale of §5.1 when peaks exist.
pub fn verdict(t2: &Table2) -> Verdict {
    let io = t2.data_time_s + t2.meta_time_s;
    let mut notes = Vec::new();
    let split_known = t2.small_data_time_s + t2.large_data_time_s > 0.0;
    let basis = if split_known { "time" } else { "mean-size" };
    let small_share = if split_known {
        100.0
            * ratio(
                t2.small_data_time_s,
                t2.small_data_time_s + t2.large_data_time_s,
            )
    } else if t2.mean_transfer_kib * 1024.0 <= SMALL_IO_BYTES as f64 {
        100.0
    } else {
        0.0
    };
    let md_share = 100.0 * ratio(t2.meta_time_s, io);
    // Daley §5.1: the resource a pipeline uses the largest share of saturates first. The
    // shares are ranked on average demand (see PeakUse); the count is Daley's estimate.
    let limiter_at_scale = t2.peaks.as_ref().map(|p| {
        let data_bound = if p.pct_sustained_iops > p.pct_sustained_bandwidth {
            Bound::IopsBound
        } else {
            Bound::BandwidthBound
        };
        if p.pct_sustained_metadata > p.pct_sustained_bandwidth.max(p.pct_sustained_iops) {
            LimiterAtScale {
                bound: Bound::MetadataBound,
                pipelines: p.pipelines_to_saturate_metadata,
            }
        } else {
            LimiterAtScale {
                bound: data_bound,
                pipelines: p.pipelines_to_saturate_data,
            }
        }
    });
    if io <= 0.0 && t2.read_write_ops == 0 && t2.metadata_ops == 0 {
        return Verdict {
            bound: Bound::NoIo,
            reason: "the stage made no file I/O calls".into(),
            metadata_share_pct: 0.0,
            small_share_pct: 0.0,
            small_large_basis: basis.into(),
            limiter_at_scale: None,
            notes,
        };
    }
    let (bound, reason) = if t2.meta_time_s >= t2.data_time_s {
        (
            Bound::MetadataBound,
            format!(
                "{:.0}% of I/O time is metadata: {:.3} s in {} metadata ops vs {:.3} s in {} read/write ops \
                 (mean transfer {:.1} KiB)",
                md_share, t2.meta_time_s, t2.metadata_ops, t2.data_time_s, t2.read_write_ops,
                t2.mean_transfer_kib
            ),
        )
    } else if small_share > 50.0 {
        (
            Bound::IopsBound,
            if split_known {
                format!(
                    "data time dominates ({:.3} s vs {:.3} s metadata) and {:.0}% of it is in transfers \
                     of at most 100 KiB and syncs ({:.3} s, {} syncs); mean transfer {:.1} KiB",
                    t2.data_time_s, t2.meta_time_s, small_share, t2.small_data_time_s, t2.syncs,
                    t2.mean_transfer_kib
                )
            } else {
                format!(
                    "data time dominates ({:.3} s vs {:.3} s metadata) and the mean transfer is {:.1} KiB, \
                     at most 100 KiB",
                    t2.data_time_s, t2.meta_time_s, t2.mean_transfer_kib
                )
            },
        )
    } else {
        (
            Bound::BandwidthBound,
            if split_known {
                format!(
                    "data time dominates ({:.3} s vs {:.3} s metadata) and {:.0}% of it is in transfers of \
                     over 100 KiB; {:.1} MiB at {:.0} MiB/s, mean transfer {:.1} KiB",
                    t2.data_time_s, t2.meta_time_s, 100.0 - small_share, t2.io_mib,
                    t2.bandwidth_mib_s, t2.mean_transfer_kib
                )
            } else {
                format!(
                    "data time dominates ({:.3} s vs {:.3} s metadata) and the mean transfer is {:.1} KiB; \
                     {:.1} MiB at {:.0} MiB/s",
                    t2.data_time_s, t2.meta_time_s, t2.mean_transfer_kib, t2.io_mib,
                    t2.bandwidth_mib_s
                )
            },
        )
    };
    if t2.io_time_pct < 5.0 && t2.wall_time_s > 0.0 {
        notes.push(format!(
            "I/O is only {:.1}% of the wall time: a faster storage tier can save at most that much",
            t2.io_time_pct
        ));
    }
    if t2.sync_time_s > 0.5 * t2.data_time_s && t2.sync_time_s > 0.0 {
        notes.push(format!(
            "{:.0}% of the data time is in {} fsync/fdatasync calls: the stage waits on durability \
             (relaxing it, e.g. SQLite synchronous=OFF, is the cheap fix where data safety allows)",
            100.0 * ratio(t2.sync_time_s, t2.data_time_s),
            t2.syncs
        ));
    }
    if let Some(p) = &t2.peaks {
        let over: Vec<String> = [
            ("bandwidth", p.pct_peak_bandwidth),
            ("IOPS", p.pct_peak_iops),
            ("metadata", p.pct_peak_metadata),
        ]
        .iter()
        .filter(|(_, pct)| *pct > 100.0)
        .map(|(name, pct)| format!("{name} {pct:.0}%"))
        .collect();
        if !over.is_empty() {
            notes.push(format!(
                "the profiled storage was faster than the calibrated peaks ({}): the profile was \
                 not taken on the target storage, so the tightly-coupled pipeline estimates are \
                 pessimistic; the sustained ones hold",
                over.join(", ")
            ));
        }
    }
    if let Some(l) = &limiter_at_scale {
        if l.bound != bound {
            notes.push(format!(
                "at scale the first resource to saturate is different: {} after {} pipelines (Daley §5.1)",
                l.bound.label(),
                l.pipelines
            ));
        }
    }
    Verdict {
        bound,
        reason,
        metadata_share_pct: md_share,
        small_share_pct: small_share,
        small_large_basis: basis.into(),
        limiter_at_scale,
        notes,
    }
}

/// Derives Tables 1-3 and the verdict.
pub fn summarize(p: &Profile, peaks: Option<&Peaks>) -> Summary {
    let storage: Vec<_> = p.files.iter().filter(|f| f.is_storage()).collect();
    let mut all = Counters::default();
    let mut user = Counters::default();
    let mut total_size = 0u64;
    let mut user_size = 0u64;
    let mut regular = 0;
    for f in &storage {
        all.merge(&f.counters);
        let sized = !matches!(
            f.kind,
            crate::model::FileKind::Directory | crate::model::FileKind::Missing
        );
        let size = if sized { f.counters.size_estimate() } else { 0 };
        if sized && size > 0 {
            regular += 1;
        }
        total_size += size;
        if p.is_user_data(&f.path) {
            user.merge(&f.counters);
            user_size += size;
        }
    }
    let table1 = Table1 {
        processes: p.processes.len(),
        threads: p.processes.iter().map(|x| x.threads).max().unwrap_or(0),
        io_threads: p.processes.iter().map(|x| x.io_threads).max().unwrap_or(0),
        peak_memory_mib: p
            .processes
            .iter()
            .map(|x| x.peak_rss_bytes)
            .max()
            .unwrap_or(0)
            .max(p.max_rss_children_bytes) as f64
            / MIB,
        total_file_size_mib: total_size as f64 / MIB,
        files: regular,
    };
    let table2 = table2_from_totals(&totals_of(&all, p.wall_time_s), peaks);
    let has_user = !p.data_paths.is_empty();
    let rw = |c: &Counters| {
        let w = c.bytes_written_total();
        (w > 0).then(|| c.bytes_read_total() as f64 / w as f64)
    };
    let table3 = Table3 {
        user_io_pct: has_user
            .then(|| 100.0 * ratio(user.bytes_total() as f64, all.bytes_total() as f64)),
        data_reuse: ratio(all.bytes_total() as f64, total_size as f64),
        user_data_reuse: has_user.then(|| ratio(user.bytes_total() as f64, user_size as f64)),
        read_write_ratio: rw(&all),
        read_write_ratio_user: if has_user { rw(&user) } else { None },
    };
    let verdict = verdict(&table2);
    Summary {
        table1,
        table2,
        table3,
        verdict,
        hist_read: all.hist_read,
        hist_write: all.hist_write,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use surge_core::peaks::{MetadataDetail, ProcsAtPeak, PEAKS_SCHEMA};

    /// Daley's estimate of Cori's one-fragment peaks (§4.2.1): 6 GiB/s, 90K IOPS, 25K md ops/s.
    fn cori_peaks() -> Peaks {
        Peaks {
            schema: PEAKS_SCHEMA.into(),
            path: "cori-1-fragment".into(),
            host: "cori".into(),
            measured_at: "2017-01-01T00:00:00Z".into(),
            read_bw: 6.0 * 1024.0 * MIB,
            write_bw: 6.0 * 1024.0 * MIB,
            read_iops: 90_000.0,
            write_iops: 90_000.0,
            write_iops_fsync: 0.0,
            metadata_ops: 25_000.0,
            procs_at_peak: ProcsAtPeak::default(),
            metadata_detail: MetadataDetail::default(),
        }
    }

    /// Table 2's columns: (wall, data s, meta s, MiB, rw ops, md ops) and the expected
    /// (% bw, % iops, % md, pipelines data, pipelines md) as printed in the paper.
    #[test]
    fn reproduces_daley_table2_peak_rows() {
        let cols = [
            (
                "SWarp rsmpl",
                10.7,
                1.87,
                0.30,
                2711.5,
                784,
                413,
                23.6,
                0.5,
                5.5,
                5,
                19,
            ),
            (
                "SWarp coadd",
                4.7,
                0.97,
                0.26,
                1422.8,
                430,
                318,
                23.8,
                0.5,
                4.9,
                5,
                21,
            ),
            (
                "CAMP db", 15.3, 0.78, 1.28, 25.3, 7413, 11963, 0.5, 10.5, 37.3, 10, 3,
            ),
            (
                "CAMP reprj",
                9.2,
                0.57,
                0.95,
                34.7,
                1735,
                7820,
                1.0,
                3.4,
                33.0,
                30,
                4,
            ),
        ];
        let peaks = cori_peaks();
        for (name, wall, d, m, mib, ops, md, bw_pct, iops_pct, md_pct, pd, pm) in cols {
            let t = Totals {
                wall_time_s: wall,
                data_time_s: d,
                meta_time_s: m,
                read_bytes: mib * MIB / 2.0,
                write_bytes: mib * MIB / 2.0,
                read_write_ops: ops,
                metadata_ops: md,
                ..Totals::default()
            };
            let t2 = table2_from_totals(&t, Some(&peaks));
            let p = t2.peaks.unwrap();
            let close = |a: f64, b: f64| (a - b).abs() <= 0.06 + 0.01 * b;
            assert!(
                close(p.pct_peak_bandwidth, bw_pct),
                "{name}: bw {}",
                p.pct_peak_bandwidth
            );
            assert!(
                close(p.pct_peak_iops, iops_pct),
                "{name}: iops {}",
                p.pct_peak_iops
            );
            assert!(
                close(p.pct_peak_metadata, md_pct),
                "{name}: md {}",
                p.pct_peak_metadata
            );
            assert_eq!(p.pipelines_to_saturate_data, pd, "{name}: data pipelines");
            assert_eq!(p.pipelines_to_saturate_metadata, pm, "{name}: md pipelines");
        }
    }

    #[test]
    fn daley_stages_get_daley_verdicts() {
        // SWarp: data time dominates, large transfers; CAMP: metadata time dominates.
        let swarp = Totals {
            wall_time_s: 10.7,
            data_time_s: 1.87,
            meta_time_s: 0.30,
            read_bytes: 2711.5 * MIB,
            read_write_ops: 784,
            metadata_ops: 413,
            ..Totals::default()
        };
        let camp = Totals {
            wall_time_s: 15.3,
            data_time_s: 0.78,
            meta_time_s: 1.28,
            read_bytes: 25.3 * MIB,
            read_write_ops: 7413,
            metadata_ops: 11963,
            ..Totals::default()
        };
        let s = verdict(&table2_from_totals(&swarp, Some(&cori_peaks())));
        assert_eq!(s.bound, Bound::BandwidthBound, "{}", s.reason);
        assert_eq!(s.small_large_basis, "mean-size");
        let c = verdict(&table2_from_totals(&camp, Some(&cori_peaks())));
        assert_eq!(c.bound, Bound::MetadataBound, "{}", c.reason);
        assert_eq!(
            c.limiter_at_scale.map(|l| (l.bound, l.pipelines)),
            Some((Bound::MetadataBound, 3))
        );
    }

    #[test]
    fn small_transfers_dominating_data_time_are_iops_bound() {
        let t = Totals {
            wall_time_s: 2.0,
            data_time_s: 1.0,
            meta_time_s: 0.1,
            small_data_time_s: 0.9,
            large_data_time_s: 0.1,
            read_bytes: 40.0 * MIB,
            read_write_ops: 10_000,
            metadata_ops: 10,
            ..Totals::default()
        };
        let v = verdict(&table2_from_totals(&t, None));
        assert_eq!(v.bound, Bound::IopsBound);
        assert!(v.reason.contains("90%"), "{}", v.reason);
    }

    #[test]
    fn little_io_time_is_flagged() {
        let t = Totals {
            wall_time_s: 100.0,
            data_time_s: 0.5,
            meta_time_s: 0.1,
            large_data_time_s: 0.5,
            read_bytes: 400.0 * MIB,
            read_write_ops: 100,
            metadata_ops: 10,
            ..Totals::default()
        };
        let v = verdict(&table2_from_totals(&t, None));
        assert_eq!(v.bound, Bound::BandwidthBound);
        assert!(
            v.notes.iter().any(|n| n.contains("0.6% of the wall time")),
            "{:?}",
            v.notes
        );
    }
}
