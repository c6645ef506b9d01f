//! What a phase measured, from one process ([`RankResult`]) to all processes of one repetition
//! ([`PhaseResult`]) to all repetitions ([`PhaseSummary`]). The arithmetic lives here, once, and
//! follows IOR: a phase lasts from the first process's start to the last process's end, and its
//! rate is everything moved divided by that time.

use crate::clock::secs;
use crate::histogram::{Histogram, LatencySummary};
use serde::{Deserialize, Serialize};

/// A timed phase of `io` (write, read) or `md` (create, stat, open-close, remove).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Write,
    Read,
    Create,
    Stat,
    OpenClose,
    Remove,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Write => "write",
            Phase::Read => "read",
            Phase::Create => "create",
            Phase::Stat => "stat",
            Phase::OpenClose => "open-close",
            Phase::Remove => "remove",
        }
    }
    pub fn is_data(self) -> bool {
        matches!(self, Phase::Write | Phase::Read)
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One process's part of one phase. Times are CLOCK_MONOTONIC nanoseconds (comparable across
/// the processes of a host).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankResult {
    pub rank: u32,
    /// Transfers (io) or metadata operations (md) completed.
    pub ops: u64,
    pub bytes: u64,
    /// Before open (io) or the first operation (md).
    pub start_ns: u64,
    /// After open, before the first transfer.
    pub io_start_ns: u64,
    /// After the last transfer, before fsync-at-close and close.
    pub io_end_ns: u64,
    /// After close.
    pub end_ns: u64,
    /// True when `--deadline` stopped the process before it finished.
    pub stonewalled: bool,
    /// Transfers whose stamp did not match (only with `--verify`).
    pub verify_errors: u64,
    pub latency: Histogram,
}

/// All processes of one phase of one repetition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseResult {
    pub phase: Phase,
    pub repetition: u32,
    pub procs: u32,
    pub ops: u64,
    pub bytes: u64,
    /// First start to last end, seconds (what the rates divide by).
    pub time_s: f64,
    /// Longest open (io) of any process.
    pub open_s: f64,
    /// First transfer to last transfer.
    pub io_s: f64,
    /// Longest fsync-at-close plus close of any process.
    pub close_s: f64,
    /// Last process's start minus first process's start: how well the barrier held (a busy
    /// machine delays some processes; IOR's phase time counts that, fio's per-job time does not).
    pub start_skew_s: f64,
    /// The longest single process's start-to-end time. `bytes / slowest_rank_s` is how fio
    /// rates a group of jobs (each job timed from its own start); `time_s` is IOR's (first
    /// start to last end). They differ when processes do not overlap well.
    pub slowest_rank_s: f64,
    pub bytes_per_s: f64,
    pub mib_per_s: f64,
    pub ops_per_s: f64,
    pub stonewalled: bool,
    pub verify_errors: u64,
    pub latency: LatencySummary,
    /// Ops completed by each process (what the next phase may touch after a deadline).
    pub ops_by_rank: Vec<u64>,
    #[serde(skip)]
    pub histogram: Histogram,
}

impl PhaseResult {
    /// Combines the processes' results; `ranks` must be non-empty.
    pub fn from_ranks(phase: Phase, repetition: u32, ranks: &[RankResult]) -> PhaseResult {
        let start = ranks.iter().map(|r| r.start_ns).min().unwrap_or(0);
        let end = ranks.iter().map(|r| r.end_ns).max().unwrap_or(0);
        let io_start = ranks.iter().map(|r| r.io_start_ns).min().unwrap_or(0);
        let io_end = ranks.iter().map(|r| r.io_end_ns).max().unwrap_or(0);
        let open_s = ranks
            .iter()
            .map(|r| secs(r.start_ns, r.io_start_ns))
            .fold(0.0, f64::max);
        let close_s = ranks
            .iter()
            .map(|r| secs(r.io_end_ns, r.end_ns))
            .fold(0.0, f64::max);
        let ops: u64 = ranks.iter().map(|r| r.ops).sum();
        let bytes: u64 = ranks.iter().map(|r| r.bytes).sum();
        let time_s = secs(start, end);
        let mut histogram = Histogram::new();
        for r in ranks {
            histogram.merge(&r.latency);
        }
        let mut by_rank = vec![0u64; ranks.len()];
        for r in ranks {
            if let Some(slot) = by_rank.get_mut(r.rank as usize) {
                *slot = r.ops;
            }
        }
        let rate = |x: u64| if time_s > 0.0 { x as f64 / time_s } else { 0.0 };
        PhaseResult {
            phase,
            repetition,
            procs: ranks.len() as u32,
            ops,
            bytes,
            time_s,
            open_s,
            io_s: secs(io_start, io_end),
            close_s,
            start_skew_s: secs(start, ranks.iter().map(|r| r.start_ns).max().unwrap_or(0)),
            slowest_rank_s: ranks
                .iter()
                .map(|r| secs(r.start_ns, r.end_ns))
                .fold(0.0, f64::max),
            bytes_per_s: rate(bytes),
            mib_per_s: rate(bytes) / (1u64 << 20) as f64,
            ops_per_s: rate(ops),
            stonewalled: ranks.iter().any(|r| r.stonewalled),
            verify_errors: ranks.iter().map(|r| r.verify_errors).sum(),
            latency: histogram.summary(),
            ops_by_rank: by_rank,
            histogram,
        }
    }
}

/// Min, mean, max and standard deviation over repetitions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub min: f64,
    pub mean: f64,
    pub max: f64,
    pub stddev: f64,
}

impl Stats {
    pub fn of(values: &[f64]) -> Stats {
        if values.is_empty() {
            return Stats::default();
        }
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        Stats {
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            mean,
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            stddev: var.sqrt(),
        }
    }
}

/// One phase over all repetitions, as in IOR's "Summary of all tests".
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseSummary {
    pub phase: Phase,
    pub repetitions: u32,
    pub procs: u32,
    pub mib_per_s: Stats,
    pub bytes_per_s: Stats,
    pub ops_per_s: Stats,
    pub time_s: Stats,
    /// Latency over every operation of every repetition.
    pub latency: LatencySummary,
    pub stonewalled: bool,
    pub verify_errors: u64,
}

impl PhaseSummary {
    /// Summaries in phase order for every phase present in `results`.
    pub fn of_all(results: &[PhaseResult]) -> Vec<PhaseSummary> {
        let mut phases: Vec<Phase> = results.iter().map(|r| r.phase).collect();
        phases.sort();
        phases.dedup();
        phases
            .into_iter()
            .map(|phase| {
                let rs: Vec<&PhaseResult> = results.iter().filter(|r| r.phase == phase).collect();
                let col =
                    |f: fn(&PhaseResult) -> f64| -> Vec<f64> { rs.iter().map(|r| f(r)).collect() };
                let mut h = Histogram::new();
                for r in &rs {
                    h.merge(&r.histogram);
                }
                PhaseSummary {
                    phase,
                    repetitions: rs.len() as u32,
                    procs: rs.first().map(|r| r.procs).unwrap_or(0),
                    mib_per_s: Stats::of(&col(|r| r.mib_per_s)),
                    bytes_per_s: Stats::of(&col(|r| r.bytes_per_s)),
                    ops_per_s: Stats::of(&col(|r| r.ops_per_s)),
                    time_s: Stats::of(&col(|r| r.time_s)),
                    latency: h.summary(),
                    stonewalled: rs.iter().any(|r| r.stonewalled),
                    verify_errors: rs.iter().map(|r| r.verify_errors).sum(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(rank: u32, start: u64, end: u64, ops: u64, bytes: u64) -> RankResult {
        let mut latency = Histogram::new();
        for _ in 0..ops {
            latency.record(1000);
        }
        RankResult {
            rank,
            ops,
            bytes,
            start_ns: start,
            io_start_ns: start + 10_000_000,
            io_end_ns: end - 20_000_000,
            end_ns: end,
            latency,
            ..RankResult::default()
        }
    }

    #[test]
    fn phase_time_runs_from_first_start_to_last_end() {
        // Two processes, 1 GiB each; the phase spans 0.5 s .. 2.5 s = 2 s.
        let ranks = [
            rank(0, 500_000_000, 2_000_000_000, 128, 1 << 30),
            rank(1, 1_000_000_000, 2_500_000_000, 128, 1 << 30),
        ];
        let p = PhaseResult::from_ranks(Phase::Write, 0, &ranks);
        assert_eq!(p.bytes, 2 << 30);
        assert_eq!(p.ops, 256);
        assert!((p.time_s - 2.0).abs() < 1e-9);
        assert!((p.mib_per_s - 1024.0).abs() < 1e-9, "{}", p.mib_per_s);
        assert!((p.bytes_per_s - (1u64 << 30) as f64).abs() < 1e-3);
        assert!((p.ops_per_s - 128.0).abs() < 1e-9);
        assert!((p.open_s - 0.01).abs() < 1e-9);
        assert!((p.close_s - 0.02).abs() < 1e-9);
        assert!((p.start_skew_s - 0.5).abs() < 1e-9);
        assert!((p.slowest_rank_s - 1.5).abs() < 1e-9);
        assert!((p.io_s - (2.48 - 0.51)).abs() < 1e-9);
        assert_eq!(p.latency.ops, 256);
        assert_eq!(p.ops_by_rank, vec![128, 128]);
    }

    #[test]
    fn stats_over_repetitions() {
        let s = Stats::of(&[1.0, 2.0, 3.0]);
        assert_eq!((s.min, s.mean, s.max), (1.0, 2.0, 3.0));
        assert!((s.stddev - (2.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert_eq!(Stats::of(&[]), Stats::default());
    }

    #[test]
    fn summary_groups_by_phase() {
        let r = |phase, rep, end| {
            PhaseResult::from_ranks(phase, rep, &[rank(0, 0, end, 100, 100 << 20)])
        };
        let results = [
            r(Phase::Write, 0, 1_000_000_000),
            r(Phase::Read, 0, 500_000_000),
            r(Phase::Write, 1, 2_000_000_000),
            r(Phase::Read, 1, 500_000_000),
        ];
        let s = PhaseSummary::of_all(&results);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].phase, Phase::Write);
        assert_eq!(s[0].repetitions, 2);
        assert!((s[0].mib_per_s.max - 100.0).abs() < 1e-9);
        assert!((s[0].mib_per_s.min - 50.0).abs() < 1e-9);
        assert!((s[1].mib_per_s.mean - 200.0).abs() < 1e-9);
        assert_eq!(s[1].latency.ops, 200);
    }
}
