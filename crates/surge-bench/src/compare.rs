//! `surge bench compare`: Haider et al.'s normalised metric (seed 004, §III). The same IOR
//! grid (process counts x transfer sizes, write then read, file per process) runs on each
//! target directory (e.g. a burst-buffer instance with local placement, one with pooled
//! placement) and on a baseline directory of the same system (the PFS: their "disk"), and
//! each target's throughput is divided by the baseline's at the same grid point. The ratio
//! isolates the storage architecture (device, interconnect, file system) from the rest of the
//! machine (CPU, memory), which is the same on both sides; Haider et al. read trends from it
//! (where the advantage shrinks as processes and transfer sizes grow), not raw numbers.
//!
//! At each grid point the sides run one after the other, in an order that rotates from point
//! to point (the first writes into fresh memory are slow on some machines and would bias
//! whichever side always went first).

use crate::ior::IoParams;
use crate::result::Phase;
use crate::run::{run_io, RunContext};
use crate::BenchError;
use serde::Serialize;
use std::path::PathBuf;

/// A directory to measure and its name in the table.
#[derive(Clone, Debug, Serialize)]
pub struct Side {
    pub name: String,
    pub path: PathBuf,
}

#[derive(Clone, Debug)]
pub struct CompareSpec {
    pub baseline: Side,
    pub targets: Vec<Side>,
    pub procs: Vec<u32>,
    pub transfers: Vec<u64>,
    /// Bytes over all processes at each point (strong scaling, divided among them).
    pub aggregate: u64,
    /// fsync before close (IOR -e) and page-cache drop before reading: the storage, not the
    /// host's memory.
    pub fsync: bool,
    pub drop_cache: bool,
    pub deadline_s: Option<f64>,
}

/// One grid point: throughput per side and target / baseline.
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub procs: u32,
    pub transfer: u64,
    pub phase: &'static str,
    /// Bytes per second, baseline first, then the targets in order.
    pub bytes_per_s: Vec<f64>,
    /// Each target's throughput divided by the baseline's (Haider's metric).
    pub normalised: Vec<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CompareReport {
    pub schema: &'static str,
    pub baseline: Side,
    pub targets: Vec<Side>,
    pub aggregate: u64,
    pub points: Vec<Point>,
}

fn rate(r: &crate::run::Report, phase: Phase) -> f64 {
    r.summary_of(phase).map_or(0.0, |s| s.bytes_per_s.mean)
}

/// Runs the grid; `on_point` is told each finished point (for progress).
pub fn compare(
    ctx: &RunContext,
    spec: &CompareSpec,
    on_point: &mut dyn FnMut(&Point),
) -> Result<CompareReport, BenchError> {
    if spec.procs.is_empty() || spec.transfers.is_empty() {
        return Err(BenchError::Params(
            "give at least one process count and one transfer size".into(),
        ));
    }
    let sides: Vec<&Side> = std::iter::once(&spec.baseline)
        .chain(spec.targets.iter())
        .collect();
    let mut points = Vec::new();
    let mut turn = 0usize;
    for &procs in &spec.procs {
        for &transfer in &spec.transfers {
            if transfer == 0 || procs == 0 {
                return Err(BenchError::Params(
                    "process counts and transfer sizes must be positive".into(),
                ));
            }
            // Whole transfers per process, at least one.
            let block = (spec.aggregate / u64::from(procs) / transfer).max(1) * transfer;
            let p = IoParams {
                transfer,
                block,
                segments: 1,
                procs,
                fsync: spec.fsync,
                drop_cache: spec.drop_cache,
                deadline_s: spec.deadline_s,
                ..IoParams::default()
            };
            let mut write = vec![0.0; sides.len()];
            let mut read = vec![0.0; sides.len()];
            for k in 0..sides.len() {
                let i = (turn + k) % sides.len();
                let r = run_io(ctx, &sides[i].path, &p)?;
                write[i] = rate(&r, Phase::Write);
                read[i] = rate(&r, Phase::Read);
            }
            turn += 1;
            for (phase, v) in [("write", write), ("read", read)] {
                let base = v[0];
                let point = Point {
                    procs,
                    transfer,
                    phase,
                    normalised: v[1..]
                        .iter()
                        .map(|x| if base > 0.0 { x / base } else { 0.0 })
                        .collect(),
                    bytes_per_s: v,
                };
                on_point(&point);
                points.push(point);
            }
        }
    }
    Ok(CompareReport {
        schema: "surge.compare/1",
        baseline: spec.baseline.clone(),
        targets: spec.targets.clone(),
        aggregate: spec.aggregate,
        points,
    })
}

/// The table: one row per point, MiB/s per side and each target / baseline.
pub fn report_text(r: &CompareReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Haider's normalised metric: each target's throughput / {}'s ({}), same grid point",
        r.baseline.name,
        r.baseline.path.display()
    );
    for t in &r.targets {
        let _ = writeln!(s, "  {}: {}", t.name, t.path.display());
    }
    let _ = write!(s, "\n{:<6} {:>5} {:>9}", "phase", "procs", "transfer");
    let _ = write!(s, " {:>12}", format!("{} MiB/s", r.baseline.name));
    for t in &r.targets {
        let _ = write!(s, " {:>12}", format!("{} MiB/s", t.name));
    }
    for t in &r.targets {
        let _ = write!(s, " {:>12}", format!("{}/{}", t.name, r.baseline.name));
    }
    s.push('\n');
    for p in &r.points {
        let _ = write!(
            s,
            "{:<6} {:>5} {:>9}",
            p.phase,
            p.procs,
            surge_core::format_bytes(p.transfer)
        );
        for b in &p.bytes_per_s {
            let _ = write!(s, " {:>12.0}", b / (1u64 << 20) as f64);
        }
        for n in &p.normalised {
            let _ = write!(s, " {n:>12.2}");
        }
        s.push('\n');
    }
    s
}

/// `NAME=PATH` or `PATH` (named after its last component).
pub fn parse_side(text: &str) -> Result<Side, String> {
    let (name, path) = match text.split_once('=') {
        Some((n, p)) if !n.is_empty() && !p.is_empty() => (n.to_string(), PathBuf::from(p)),
        Some(_) => return Err(format!("'{text}': give NAME=PATH or PATH")),
        None => {
            let p = PathBuf::from(text);
            let n = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| text.to_string());
            (n, p)
        }
    };
    Ok(Side { name, path })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_are_named_or_take_their_directory_name() {
        let s = parse_side("local=/mnt/bb/local").unwrap();
        assert_eq!(
            (s.name.as_str(), s.path),
            ("local", PathBuf::from("/mnt/bb/local"))
        );
        let s = parse_side("/pfs/scratch").unwrap();
        assert_eq!(s.name, "scratch");
        assert!(parse_side("=/x").is_err());
        assert!(parse_side("x=").is_err());
    }
}
