//! Concurrency sweeps (Daley Figures 3-5): one configuration run at 1, 2, 4... processes, in
//! strong scaling by default (a fixed aggregate size or file count split over the processes,
//! as Daley did) or weak scaling (fixed per-process size). Produces the curve as a table, JSON,
//! CSV and an SVG plot.

use crate::histogram::LatencySummary;
use crate::result::{Phase, Stats};
use crate::run::{run_io, run_md, Report, RunContext};
use crate::workers::Job;
use crate::BenchError;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;

/// How the work changes with the process count.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scaling {
    /// Fixed total: bytes (io) or files (md) divided among the processes.
    Strong { total: u64 },
    /// Fixed per process: the template's block or files per process.
    Weak,
}

/// What the plot's y axis shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// MiB/s (Daley Figure 3).
    Bandwidth,
    /// Transfers per second (Figure 4).
    Iops,
    /// Metadata operations per second (Figure 5).
    MetadataOps,
}

impl Metric {
    pub fn of(&self, s: &PointPhase) -> Stats {
        match self {
            Metric::Bandwidth => s.mib_per_s.clone(),
            Metric::Iops | Metric::MetadataOps => s.ops_per_s.clone(),
        }
    }
    pub fn unit(&self) -> &'static str {
        match self {
            Metric::Bandwidth => "MiB/s",
            Metric::Iops => "IOPS",
            Metric::MetadataOps => "ops/s",
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SweepSpec {
    pub title: String,
    pub procs: Vec<u32>,
    /// The configuration; its process count (and size under strong scaling) is replaced per point.
    pub template: Job,
    pub scaling: Scaling,
    pub metric: Metric,
}

/// One phase at one process count.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PointPhase {
    pub phase: Phase,
    pub mib_per_s: Stats,
    pub ops_per_s: Stats,
    pub latency: LatencySummary,
    pub stonewalled: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SweepPoint {
    pub procs: u32,
    /// The exact parameters of this point.
    pub params: Job,
    pub phases: Vec<PointPhase>,
}

impl SweepPoint {
    pub fn phase(&self, phase: Phase) -> Option<&PointPhase> {
        self.phases.iter().find(|p| p.phase == phase)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SweepResult {
    /// `surge.bench.sweep/1`.
    pub schema: String,
    pub title: String,
    pub path: String,
    pub fs_type: String,
    pub host: String,
    pub started_at: String,
    pub scaling: Scaling,
    pub metric: Metric,
    pub points: Vec<SweepPoint>,
    pub notes: Vec<String>,
}

/// The parameters of the point at `procs`.
pub fn point_params(spec: &SweepSpec, procs: u32) -> Result<Job, BenchError> {
    let n = u64::from(procs);
    match (&spec.template, spec.scaling) {
        (Job::Io(t), scaling) => {
            let mut p = t.clone();
            p.procs = procs;
            if let Scaling::Strong { total } = scaling {
                // Each process gets an equal share, whole transfers per block.
                let per_segment = total / n / p.segments;
                p.block = per_segment / p.transfer * p.transfer;
                if p.block == 0 {
                    return Err(BenchError::Params(format!(
                        "aggregate {} split over {procs} processes and {} segments is less than \
                         one --transfer ({}) each",
                        total, p.segments, p.transfer
                    )));
                }
            }
            Ok(Job::Io(p))
        }
        (Job::Md(t), scaling) => {
            let mut p = t.clone();
            p.procs = procs;
            if let Scaling::Strong { total } = scaling {
                p.files = (total / n).max(1);
            }
            Ok(Job::Md(p))
        }
    }
}

fn point_of(procs: u32, params: Job, report: &Report) -> SweepPoint {
    SweepPoint {
        procs,
        params,
        phases: report
            .summary
            .iter()
            .map(|s| PointPhase {
                phase: s.phase,
                mib_per_s: s.mib_per_s.clone(),
                ops_per_s: s.ops_per_s.clone(),
                latency: s.latency.clone(),
                stonewalled: s.stonewalled,
            })
            .collect(),
    }
}

/// Runs one point.
pub fn run_point(
    ctx: &RunContext,
    path: &Path,
    spec: &SweepSpec,
    procs: u32,
) -> Result<(SweepPoint, Report), BenchError> {
    let params = point_params(spec, procs)?;
    let report = match &params {
        Job::Io(p) => run_io(ctx, path, p)?,
        Job::Md(p) => run_md(ctx, path, p)?,
    };
    Ok((point_of(procs, params, &report), report))
}

/// Runs every point; `on_point` sees each as it completes (for a live table).
pub fn run_sweep(
    ctx: &RunContext,
    path: &Path,
    spec: &SweepSpec,
    on_point: &mut dyn FnMut(&SweepPoint),
) -> Result<SweepResult, BenchError> {
    if spec.procs.is_empty() {
        return Err(BenchError::Params("--procs lists no process counts".into()));
    }
    // Check every point's parameters before running the first.
    for &n in &spec.procs {
        match point_params(spec, n)? {
            Job::Io(p) => p.validate()?,
            Job::Md(p) => p.validate()?,
        }
    }
    let mut points = Vec::new();
    let mut first: Option<Report> = None;
    let mut notes = Vec::new();
    for &n in &spec.procs {
        let (point, report) = run_point(ctx, path, spec, n)?;
        on_point(&point);
        points.push(point);
        for note in &report.notes {
            if !notes.contains(note) {
                notes.push(note.clone());
            }
        }
        first.get_or_insert(report);
    }
    let first = first.ok_or_else(|| BenchError::Params("no points".into()))?;
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

/// The phases that occur in a sweep, in order.
pub fn phases_of(points: &[SweepPoint]) -> Vec<Phase> {
    let mut v: Vec<Phase> = points
        .iter()
        .flat_map(|p| p.phases.iter().map(|x| x.phase))
        .collect();
    v.sort();
    v.dedup();
    v
}

/// CSV with one row per process count and phase.
pub fn to_csv(r: &SweepResult) -> String {
    let mut out = String::from(
        "procs,phase,mib_per_s_min,mib_per_s_mean,mib_per_s_max,ops_per_s_min,ops_per_s_mean,\
         ops_per_s_max,lat_p50_us,lat_p99_us,lat_max_us,stonewalled\n",
    );
    for p in &r.points {
        for ph in &p.phases {
            let _ = writeln!(
                out,
                "{},{},{:.3},{:.3},{:.3},{:.1},{:.1},{:.1},{:.2},{:.2},{:.2},{}",
                p.procs,
                ph.phase.name(),
                ph.mib_per_s.min,
                ph.mib_per_s.mean,
                ph.mib_per_s.max,
                ph.ops_per_s.min,
                ph.ops_per_s.mean,
                ph.ops_per_s.max,
                ph.latency.p50_us,
                ph.latency.p99_us,
                ph.latency.max_us,
                ph.stonewalled
            );
        }
    }
    out
}

/// The table header and one row per point, in the sweep's metric.
pub fn table_header(metric: Metric, phases: &[Phase]) -> String {
    let mut s = format!("{:>6}", "procs");
    for ph in phases {
        let _ = write!(s, " {:>18}", format!("{} {}", ph.name(), metric.unit()));
    }
    s
}

pub fn table_row(metric: Metric, phases: &[Phase], p: &SweepPoint) -> String {
    let mut s = format!("{:>6}", p.procs);
    for ph in phases {
        match p.phase(*ph) {
            Some(x) => {
                let _ = write!(s, " {:>18.1}", metric.of(x).mean);
            }
            None => {
                let _ = write!(s, " {:>18}", "-");
            }
        }
    }
    s
}

/// Parses `1,2,4,8` or `1-16` (powers of two from 1 to 16 inclusive of the ends).
pub fn parse_procs_list(text: &str) -> Result<Vec<u32>, String> {
    let t = text.trim();
    if let Some((a, b)) = t.split_once('-') {
        let lo: u32 = a
            .trim()
            .parse()
            .map_err(|_| format!("'{a}' is not a process count"))?;
        let hi: u32 = b
            .trim()
            .parse()
            .map_err(|_| format!("'{b}' is not a process count"))?;
        if lo == 0 || hi < lo {
            return Err(format!("'{t}': expected LOW-HIGH with 1 <= LOW <= HIGH"));
        }
        let mut v = Vec::new();
        let mut n = lo;
        while n < hi {
            v.push(n);
            n = n.saturating_mul(2);
        }
        v.push(hi);
        return Ok(v);
    }
    let mut v = Vec::new();
    for part in t.split(',') {
        let n: u32 = part
            .trim()
            .parse()
            .map_err(|_| format!("'{part}' in '{t}' is not a process count"))?;
        if n == 0 {
            return Err(format!("'{t}': process counts start at 1"));
        }
        v.push(n);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ior::IoParams;
    use crate::mdtest::MdParams;

    #[test]
    fn strong_scaling_splits_the_aggregate_in_whole_transfers() {
        let spec = SweepSpec {
            title: "t".into(),
            procs: vec![1, 3],
            template: Job::Io(IoParams {
                transfer: 8 << 20,
                ..IoParams::default()
            }),
            scaling: Scaling::Strong { total: 1 << 30 },
            metric: Metric::Bandwidth,
        };
        let Job::Io(p1) = point_params(&spec, 1).unwrap() else {
            panic!()
        };
        assert_eq!((p1.procs, p1.block), (1, 1 << 30));
        let Job::Io(p3) = point_params(&spec, 3).unwrap() else {
            panic!()
        };
        // 1 GiB / 3 = 341.33 MiB -> 42 transfers of 8 MiB = 336 MiB.
        assert_eq!((p3.procs, p3.block), (3, 336 << 20));
        assert!(point_params(&spec, 1000).is_err());
    }

    #[test]
    fn strong_scaling_splits_the_file_count_and_weak_keeps_it() {
        let mut spec = SweepSpec {
            title: "t".into(),
            procs: vec![1, 4],
            template: Job::Md(MdParams {
                files: 10,
                ..MdParams::default()
            }),
            scaling: Scaling::Strong { total: 65536 },
            metric: Metric::MetadataOps,
        };
        let Job::Md(p) = point_params(&spec, 4).unwrap() else {
            panic!()
        };
        assert_eq!((p.procs, p.files), (4, 16384));
        spec.scaling = Scaling::Weak;
        let Job::Md(p) = point_params(&spec, 4).unwrap() else {
            panic!()
        };
        assert_eq!((p.procs, p.files), (4, 10));
    }

    #[test]
    fn procs_lists() {
        assert_eq!(parse_procs_list("1,2,4").unwrap(), vec![1, 2, 4]);
        assert_eq!(parse_procs_list("1-16").unwrap(), vec![1, 2, 4, 8, 16]);
        assert_eq!(parse_procs_list("1-6").unwrap(), vec![1, 2, 4, 6]);
        assert!(parse_procs_list("0,1").is_err());
        assert!(parse_procs_list("a").unwrap_err().contains("'a'"));
    }

    #[test]
    fn csv_has_a_row_per_point_and_phase() {
        let ph = |phase, v: f64| PointPhase {
            phase,
            mib_per_s: Stats {
                min: v,
                mean: v,
                max: v,
                stddev: 0.0,
            },
            ops_per_s: Stats::default(),
            latency: LatencySummary::default(),
            stonewalled: false,
        };
        let r = SweepResult {
            schema: "surge.bench.sweep/1".into(),
            title: "t".into(),
            path: "/x".into(),
            fs_type: "tmpfs".into(),
            host: "h".into(),
            started_at: "now".into(),
            scaling: Scaling::Weak,
            metric: Metric::Bandwidth,
            points: vec![SweepPoint {
                procs: 2,
                params: Job::Io(IoParams::default()),
                phases: vec![ph(Phase::Write, 10.0), ph(Phase::Read, 20.0)],
            }],
            notes: vec![],
        };
        let csv = to_csv(&r);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(
            lines[1].starts_with("2,write,10.000,10.000,10.000,"),
            "{}",
            lines[1]
        );
        assert!(lines[2].starts_with("2,read,20.000"), "{}", lines[2]);
        assert_eq!(
            table_row(Metric::Bandwidth, &phases_of(&r.points), &r.points[0])
                .split_whitespace()
                .collect::<Vec<_>>(),
            vec!["2", "10.0", "20.0"]
        );
    }
}
