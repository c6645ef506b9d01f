//! `surge bench calibrate`: a target's peaks, found the way Daley found DataWarp's (§4.1):
//! sweep I/O concurrency for bandwidth (8 MiB sequential), IOPS (4 KiB random) and metadata
//! (mdtest create/stat/open-close/remove) until the curve flattens, and keep each curve's best
//! point. Writes [`surge_core::peaks::Peaks`], the file `surge profile` and `surge advise` read.
//!
//! "Flattens": the last two process counts did not beat the best earlier point by more than
//! `flat_gain` (5% by default) on any tracked metric, or the next count exceeds `max_procs`.

use crate::ior::IoParams;
use crate::mdtest::MdParams;
use crate::result::Phase;
use crate::run::{supports_direct, RunContext};
use crate::sweep::{run_point, Metric, Scaling, SweepPoint, SweepResult, SweepSpec};
use crate::workers::Job;
use crate::BenchError;
use serde::{Deserialize, Serialize};
use std::path::Path;
use surge_core::peaks::{MetadataDetail, Peaks, ProcsAtPeak, PEAKS_SCHEMA};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum DirectMode {
    /// O_DIRECT where the file system supports it, buffered I/O with fsync and cache drops where not.
    Auto,
    On,
    Off,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CalibrateSpec {
    pub max_procs: u32,
    /// Aggregate bytes of the bandwidth sweep (strong scaling).
    pub bw_total: u64,
    /// Aggregate bytes of the IOPS sweep.
    pub iops_total: u64,
    /// Total files of the metadata sweep.
    pub md_files: u64,
    /// Stonewall of each phase, seconds.
    pub deadline_s: f64,
    pub direct: DirectMode,
    pub flat_gain: f64,
    pub repetitions: u32,
}

impl Default for CalibrateSpec {
    fn default() -> Self {
        CalibrateSpec {
            max_procs: 64,
            bw_total: 2 << 30,
            iops_total: 512 << 20,
            md_files: 32768,
            deadline_s: 3.0,
            direct: DirectMode::Auto,
            flat_gain: 0.05,
            repetitions: 1,
        }
    }
}

/// Everything calibrate measured: the peaks file's content plus the curves behind it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CalibrateReport {
    /// `surge.bench.calibrate/1`.
    pub schema: String,
    pub peaks: Peaks,
    /// Whether the data sweeps used O_DIRECT.
    pub direct: bool,
    pub spec: CalibrateSpec,
    pub bandwidth: SweepResult,
    pub iops: SweepResult,
    /// 4 KiB random writes with an fsync after each (absent in reports written before it was
    /// measured).
    #[serde(default)]
    pub iops_fsync: Option<SweepResult>,
    pub metadata: SweepResult,
    pub notes: Vec<String>,
}

/// True when the last two values did not beat the best before them by more than `gain`.
pub fn flattened(values: &[f64], gain: f64) -> bool {
    if values.len() < 3 {
        return false;
    }
    let (before, last2) = values.split_at(values.len() - 2);
    let best_before = before.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    last2.iter().all(|&v| v <= best_before * (1.0 + gain))
}

/// The process counts a calibration tries: powers of two up to `max`, then `max` itself.
pub fn procs_ladder(max: u32) -> Vec<u32> {
    crate::sweep::parse_procs_list(&format!("1-{}", max.max(1))).unwrap_or_else(|_| vec![1])
}

/// The mean of create, stat and remove rates at a point (the Peaks definition of metadata_ops).
pub fn metadata_rate(p: &SweepPoint) -> f64 {
    let rates: Vec<f64> = [Phase::Create, Phase::Stat, Phase::Remove]
        .iter()
        .filter_map(|ph| p.phase(*ph).map(|x| x.ops_per_s.mean))
        .collect();
    if rates.is_empty() {
        0.0
    } else {
        rates.iter().sum::<f64>() / rates.len() as f64
    }
}

/// Sweeps `spec` over the ladder until every metric in `metrics` has flattened. Notes in the
/// result say when the ladder ran out first.
fn sweep_until_flat(
    ctx: &RunContext,
    path: &Path,
    spec: &SweepSpec,
    gain: f64,
    metrics: &[&dyn Fn(&SweepPoint) -> f64],
    on_point: &mut dyn FnMut(&str, &SweepPoint),
) -> Result<SweepResult, BenchError> {
    let mut points: Vec<SweepPoint> = Vec::new();
    let mut first = None;
    let mut notes: Vec<String> = Vec::new();
    let mut flat = false;
    for &n in &spec.procs {
        let (point, report) = run_point(ctx, path, spec, n)?;
        on_point(&spec.title, &point);
        points.push(point);
        for note in &report.notes {
            if !notes.contains(note) {
                notes.push(note.clone());
            }
        }
        first.get_or_insert(report);
        let all_flat = metrics.iter().all(|m| {
            let series: Vec<f64> = points.iter().map(m).collect();
            flattened(&series, gain)
        });
        if all_flat {
            flat = true;
            break;
        }
    }
    if !flat {
        notes.push(format!(
            "{}: the curve had not flattened at {} processes (raise --max-procs); the peak may \
             be higher",
            spec.title,
            points.last().map(|p| p.procs).unwrap_or(0)
        ));
    }
    let Some(first) = first else {
        return Err(BenchError::Params("no process counts to try".into()));
    };
    Ok(SweepResult {
        schema: "surge.bench.sweep/1".into(),
        title: spec.title.clone(),
        path: first.path,
        fs_type: first.fs_type,
        host: first.host,
        started_at: first.started_at,
        scaling: spec.scaling,
        metric: spec.metric,
        points,
        notes,
    })
}

/// The best point of a curve by `metric`: (value, procs).
pub fn peak_of(points: &[SweepPoint], metric: &dyn Fn(&SweepPoint) -> f64) -> (f64, u32) {
    points
        .iter()
        .map(|p| (metric(p), p.procs))
        .fold((0.0, 0), |best, x| if x.0 > best.0 { x } else { best })
}

fn rate(phase: Phase, bytes: bool) -> impl Fn(&SweepPoint) -> f64 {
    move |p: &SweepPoint| {
        p.phase(phase)
            .map(|x| {
                if bytes {
                    x.mib_per_s.mean * (1u64 << 20) as f64
                } else {
                    x.ops_per_s.mean
                }
            })
            .unwrap_or(0.0)
    }
}

/// Runs the three sweeps and derives the peaks.
pub fn calibrate(
    ctx: &RunContext,
    path: &Path,
    spec: &CalibrateSpec,
    on_point: &mut dyn FnMut(&str, &SweepPoint),
) -> Result<CalibrateReport, BenchError> {
    if spec.max_procs == 0 || spec.deadline_s.is_nan() || spec.deadline_s <= 0.0 {
        return Err(BenchError::Params(
            "--max-procs and --deadline must be positive".into(),
        ));
    }
    let mut notes = Vec::new();
    let direct = match spec.direct {
        DirectMode::On => true,
        DirectMode::Off => false,
        DirectMode::Auto => {
            let ok = supports_direct(ctx.backend.clone(), path)?;
            if !ok {
                notes.push(format!(
                    "{} does not support O_DIRECT: data sweeps used buffered I/O with fsync at \
                     close and page-cache drops before reads",
                    path.display()
                ));
            }
            ok
        }
    };
    let ladder = procs_ladder(spec.max_procs);
    let io_template = |transfer: u64, random: bool| IoParams {
        transfer,
        block: transfer,
        segments: 1,
        random,
        direct,
        fsync: !direct,
        drop_cache: !direct,
        reorder: true,
        repetitions: spec.repetitions,
        deadline_s: Some(spec.deadline_s),
        ..IoParams::default()
    };
    let bw_spec = SweepSpec {
        title: "Bandwidth at 8 MiB transfers".into(),
        procs: ladder.clone(),
        template: Job::Io(io_template(8 << 20, false)),
        scaling: Scaling::Strong {
            total: spec.bw_total,
        },
        metric: Metric::Bandwidth,
    };
    let iops_spec = SweepSpec {
        title: "IOPS at 4 KiB random transfers".into(),
        procs: ladder.clone(),
        template: Job::Io(io_template(4096, true)),
        scaling: Scaling::Strong {
            total: spec.iops_total,
        },
        metric: Metric::Iops,
    };
    // Writes only: an fsync after each 4 KiB write (IOR -Y). Each write waits for the storage,
    // so a smaller total than the IOPS sweep's reaches the stonewall anyway.
    let fsync_spec = SweepSpec {
        title: "IOPS at 4 KiB random writes with fsync per write".into(),
        procs: ladder.clone(),
        template: Job::Io(IoParams {
            read: false,
            fsync_per_write: true,
            fsync: false,
            drop_cache: false,
            ..io_template(4096, true)
        }),
        scaling: Scaling::Strong {
            total: (spec.iops_total / 8).max(4096 * u64::from(spec.max_procs)),
        },
        metric: Metric::Iops,
    };
    let md_spec = SweepSpec {
        title: "Metadata operations".into(),
        procs: ladder,
        template: Job::Md(MdParams {
            repetitions: spec.repetitions,
            deadline_s: Some(spec.deadline_s),
            ..MdParams::default()
        }),
        scaling: Scaling::Strong {
            total: spec.md_files,
        },
        metric: Metric::MetadataOps,
    };
    let (wbw, rbw) = (rate(Phase::Write, true), rate(Phase::Read, true));
    let bandwidth = sweep_until_flat(ctx, path, &bw_spec, spec.flat_gain, &[&wbw, &rbw], on_point)?;
    let (wops, rops) = (rate(Phase::Write, false), rate(Phase::Read, false));
    let iops = sweep_until_flat(
        ctx,
        path,
        &iops_spec,
        spec.flat_gain,
        &[&wops, &rops],
        on_point,
    )?;
    let iops_fsync = sweep_until_flat(ctx, path, &fsync_spec, spec.flat_gain, &[&wops], on_point)?;
    let metadata = sweep_until_flat(
        ctx,
        path,
        &md_spec,
        spec.flat_gain,
        &[&metadata_rate],
        on_point,
    )?;

    let (write_bw, p_wbw) = peak_of(&bandwidth.points, &wbw);
    let (read_bw, p_rbw) = peak_of(&bandwidth.points, &rbw);
    let (write_iops, p_wops) = peak_of(&iops.points, &wops);
    let (read_iops, p_rops) = peak_of(&iops.points, &rops);
    let (write_iops_fsync, p_fops) = peak_of(&iops_fsync.points, &wops);
    let (metadata_ops, p_md) = peak_of(&metadata.points, &metadata_rate);
    let at_md = metadata.points.iter().find(|p| p.procs == p_md);
    let md_rate = |ph: Phase| {
        at_md
            .and_then(|p| p.phase(ph))
            .map(|x| x.ops_per_s.mean)
            .unwrap_or(0.0)
    };
    let peaks = Peaks {
        schema: PEAKS_SCHEMA.to_string(),
        path: std::fs::canonicalize(path)
            .unwrap_or_else(|_| path.to_path_buf())
            .display()
            .to_string(),
        host: crate::host_name(),
        measured_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        read_bw,
        write_bw,
        read_iops,
        write_iops,
        write_iops_fsync,
        metadata_ops,
        procs_at_peak: ProcsAtPeak {
            read_bw: p_rbw,
            write_bw: p_wbw,
            read_iops: p_rops,
            write_iops: p_wops,
            metadata_ops: p_md,
            write_iops_fsync: p_fops,
        },
        metadata_detail: MetadataDetail {
            create: md_rate(Phase::Create),
            stat: md_rate(Phase::Stat),
            open_close: md_rate(Phase::OpenClose),
            remove: md_rate(Phase::Remove),
        },
    };
    for s in [&bandwidth, &iops, &iops_fsync, &metadata] {
        notes.extend(
            s.notes
                .iter()
                .filter(|n| n.contains("not flattened"))
                .cloned(),
        );
    }
    Ok(CalibrateReport {
        schema: "surge.bench.calibrate/1".into(),
        peaks,
        direct,
        spec: spec.clone(),
        bandwidth,
        iops,
        iops_fsync: Some(iops_fsync),
        metadata,
        notes,
    })
}

/// Writes the peaks file atomically (a temporary file renamed over the target).
pub fn write_peaks(out: &Path, peaks: &Peaks) -> Result<(), BenchError> {
    let text = serde_json::to_string_pretty(peaks)
        .map_err(|e| BenchError::Setup(format!("cannot encode the peaks: {e}")))?;
    let tmp = out.with_extension("json.tmp");
    let io = |op: &str, p: &Path| {
        let op = op.to_string();
        let path = p.to_path_buf();
        move |source| BenchError::Io { op, path, source }
    };
    std::fs::write(&tmp, text + "\n").map_err(io("write", &tmp))?;
    std::fs::rename(&tmp, out).map_err(io("rename onto", out))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::histogram::LatencySummary;
    use crate::result::Stats;
    use crate::sweep::PointPhase;

    #[test]
    fn flattening_needs_two_points_without_gain() {
        assert!(!flattened(&[1.0, 2.0], 0.05));
        assert!(!flattened(&[1.0, 2.0, 4.0], 0.05));
        assert!(!flattened(&[1.0, 2.0, 2.0, 2.2], 0.05));
        assert!(flattened(&[1.0, 2.0, 2.05, 2.0], 0.05));
        assert!(flattened(&[1.0, 3.0, 2.0, 1.5], 0.05), "a drop is flat too");
    }

    #[test]
    fn ladder_is_powers_of_two_then_the_max() {
        assert_eq!(procs_ladder(64), vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(procs_ladder(12), vec![1, 2, 4, 8, 12]);
        assert_eq!(procs_ladder(1), vec![1]);
    }

    fn point(procs: u32, rates: &[(Phase, f64)]) -> SweepPoint {
        SweepPoint {
            procs,
            params: Job::Md(MdParams::default()),
            phases: rates
                .iter()
                .map(|&(phase, v)| PointPhase {
                    phase,
                    mib_per_s: Stats {
                        min: v,
                        mean: v,
                        max: v,
                        stddev: 0.0,
                    },
                    ops_per_s: Stats {
                        min: v,
                        mean: v,
                        max: v,
                        stddev: 0.0,
                    },
                    latency: LatencySummary::default(),
                    stonewalled: false,
                })
                .collect(),
        }
    }

    #[test]
    fn metadata_rate_is_the_mean_of_create_stat_remove() {
        let p = point(
            4,
            &[
                (Phase::Create, 10.0),
                (Phase::Stat, 40.0),
                (Phase::OpenClose, 1000.0),
                (Phase::Remove, 25.0),
            ],
        );
        assert_eq!(metadata_rate(&p), 25.0);
    }

    #[test]
    fn peak_takes_the_best_point_and_its_procs() {
        let pts = vec![
            point(1, &[(Phase::Read, 100.0)]),
            point(2, &[(Phase::Read, 300.0)]),
            point(4, &[(Phase::Read, 250.0)]),
        ];
        let (v, n) = peak_of(&pts, &rate(Phase::Read, false));
        assert_eq!((v, n), (300.0, 2));
        let (v, _) = peak_of(&pts, &rate(Phase::Read, true));
        assert_eq!(v, 300.0 * 1048576.0);
    }

    #[test]
    fn peaks_file_round_trips_through_surge_core() {
        let tmp = tempfile::tempdir().unwrap();
        let peaks = Peaks {
            schema: PEAKS_SCHEMA.into(),
            path: "/dev/shm".into(),
            host: "h".into(),
            measured_at: "2024-01-01T00:00:00Z".into(),
            read_bw: 6.5 * (1u64 << 30) as f64,
            write_bw: 5.3 * (1u64 << 30) as f64,
            read_iops: 94_000.0,
            write_iops: 85_000.0,
            write_iops_fsync: 4_000.0,
            metadata_ops: 25_000.0,
            procs_at_peak: ProcsAtPeak::default(),
            metadata_detail: MetadataDetail::default(),
        };
        let out = tmp.path().join("peaks.json");
        write_peaks(&out, &peaks).unwrap();
        assert_eq!(Peaks::load(&out).unwrap(), peaks);
    }
}
