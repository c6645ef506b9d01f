//! The search: smarter than ExPBB's nested loops, which run the whole product of every value
//! of every knob.
//!
//! 1. **Seed** from `surge profile`'s verdict (Daley's classification): a metadata-bound job
//!    starts in private mode and tries the access mode and hybrid placement first (layout
//!    last); a bandwidth- or IOPS-bound job starts with the most fragments and tries
//!    fragments, layout and MPI-IO hints first (a job without a profile too, from the job as
//!    written). The job as written (and PFS-only, when it is in the space) are always
//!    measured: they are what the result is compared with.
//! 2. **Coordinate descent**: along each dimension in that order, every value is run with the
//!    others fixed at the best so far, and the best is kept; a second pass runs if the first
//!    changed anything. A move that wins by less than 15% is a close call: both ends are run
//!    again and compared by median first. The knobs of a burst buffer are nearly separable
//!    (fragments set bandwidth, the layout how much of it one file gets, the access mode sets
//!    metadata, placement and hints act on their own files), which is why this finds the
//!    optimum of the product in the sum of the dimensions' sizes.
//! 3. **Successive halving** against noise: the best few configurations are run again, the
//!    best third kept, until one is left; a configuration is judged by the median of its runs.
//!
//! Every measurement already in the history counts and costs nothing: a second call with the
//! same job, inputs and pool replays the same decisions from the history.

use crate::history::Run;
use crate::space::{Config, Setting, Space};
use std::collections::BTreeMap;
use std::time::Instant;

/// The least relative gain for which the descent moves to another configuration (smaller
/// differences are run-to-run noise on a shared machine).
pub const MIN_GAIN: f64 = 0.03;

/// Below this relative gap the descent runs both configurations again before moving.
pub const DUEL_GAP: f64 = 0.15;

/// Runs a configuration once (a real `surge run` in `surge tune`).
pub trait Measure {
    fn run(&mut self, c: &Config) -> anyhow::Result<Run>;
}

/// The budget of new runs: a count and/or a deadline.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub runs: Option<u64>,
    pub deadline: Option<Instant>,
}

/// The profile's verdict, as `surge profile` words it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Bandwidth,
    Iops,
    Metadata,
}

impl Verdict {
    pub fn from_label(s: &str) -> Option<Verdict> {
        match s {
            "bandwidth-bound" => Some(Verdict::Bandwidth),
            "iops-bound" | "IOPS-bound" => Some(Verdict::Iops),
            "metadata-bound" => Some(Verdict::Metadata),
            _ => None,
        }
    }
}

/// What the search found.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub best: Option<Config>,
    /// Every run used (history and new), in the order they were taken.
    pub runs: Vec<Run>,
    pub new_runs: u64,
    pub reused_runs: u64,
    pub budget_exhausted: bool,
    /// The decisions, one line each.
    pub trace: Vec<String>,
}

pub struct Search<'a, M: Measure> {
    space: &'a Space,
    measure: M,
    known: BTreeMap<Config, Vec<Run>>,
    used: Vec<Run>,
    /// Per configuration, how many of its history runs have been used so far.
    taken: BTreeMap<Config, usize>,
    new_runs: u64,
    reused: u64,
    budget: Budget,
    exhausted: bool,
    trace: Vec<String>,
}

/// Median of the successful runs' seconds; `None` if none succeeded.
pub fn median(runs: &[&Run]) -> Option<f64> {
    let mut v: Vec<f64> = runs.iter().filter_map(|r| r.seconds).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

impl<'a, M: Measure> Search<'a, M> {
    pub fn new(space: &'a Space, measure: M, history: Vec<Run>, budget: Budget) -> Self {
        let mut known: BTreeMap<Config, Vec<Run>> = BTreeMap::new();
        for r in history {
            known
                .entry(space.normalize(r.config.clone()))
                .or_default()
                .push(r);
        }
        Search {
            space,
            measure,
            known,
            used: Vec::new(),
            taken: BTreeMap::new(),
            new_runs: 0,
            reused: 0,
            budget,
            exhausted: false,
            trace: Vec::new(),
        }
    }

    fn used_of(&self, c: &Config) -> Vec<&Run> {
        self.used.iter().filter(|r| &r.config == c).collect()
    }

    /// The configuration's score so far (median seconds of the runs used), `None` if it has no
    /// successful run.
    pub fn score(&self, c: &Config) -> Option<f64> {
        median(&self.used_of(c))
    }

    fn out_of_budget(&self) -> bool {
        self.budget.runs.is_some_and(|n| self.new_runs >= n)
            || self.budget.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Makes sure `c` has at least `n` runs, from the history first. False when the budget ran
    /// out first.
    fn ensure(&mut self, c: &Config, n: usize) -> anyhow::Result<bool> {
        let c = self.space.normalize(c.clone());
        loop {
            let have = self.used_of(&c).len();
            if have >= n {
                return Ok(true);
            }
            // A configuration that failed is not run again: failing is deterministic enough
            // (a capacity refused, a mode the job cannot use).
            if have > 0 && self.score(&c).is_none() {
                return Ok(true);
            }
            let taken = self.taken.get(&c).copied().unwrap_or(0);
            if let Some(r) = self.known.get(&c).and_then(|v| v.get(taken)).cloned() {
                self.taken.insert(c.clone(), taken + 1);
                self.reused += 1;
                self.used.push(Run {
                    config: c.clone(),
                    new: false,
                    ..r
                });
                continue;
            }
            if self.out_of_budget() {
                self.exhausted = true;
                return Ok(false);
            }
            let mut r = self.measure.run(&c)?;
            r.config = c.clone();
            r.new = true;
            self.new_runs += 1;
            self.used.push(r);
        }
    }

    fn best_of<'c>(&self, cs: impl Iterator<Item = &'c Config>) -> Option<Config> {
        cs.filter_map(|c| self.score(c).map(|s| (s, c)))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, c)| c.clone())
    }

    fn seed(&self, verdict: Option<Verdict>) -> Config {
        let mut c = self.space.default.clone();
        for d in &self.space.dimensions {
            match (verdict, d.settings.first()) {
                (Some(Verdict::Metadata), Some(Setting::Mode(_))) => {
                    if let Some(s) = d
                        .settings
                        .iter()
                        .find(|s| **s == Setting::Mode("private".into()))
                    {
                        c = s.apply(&c);
                    }
                }
                (Some(Verdict::Bandwidth | Verdict::Iops), Some(Setting::Fragments(_))) => {
                    if let Some(s) = d.settings.last() {
                        c = s.apply(&c);
                    }
                }
                _ => {}
            }
        }
        self.space.normalize(c)
    }

    fn order(&self, verdict: Option<Verdict>) -> Vec<usize> {
        let rank = |i: usize| -> u8 {
            let first = self.space.dimensions[i].settings.first();
            match (verdict, first) {
                (Some(Verdict::Metadata), Some(Setting::Mode(_))) => 0,
                (Some(Verdict::Metadata), Some(Setting::OnPfs(..))) => 1,
                (Some(Verdict::Metadata), Some(Setting::Fragments(_))) => 2,
                (Some(Verdict::Metadata), Some(Setting::Hint(..))) => 3,
                // Small files are one stripe whatever their layout: it matters last.
                (Some(Verdict::Metadata), _) => 4,
                (_, Some(Setting::Fragments(_))) => 0,
                // How a file's bytes spread over the fragments just chosen: the other half
                // of bandwidth.
                (_, Some(Setting::Layout(_))) => 1,
                (_, Some(Setting::Hint(..))) => 2,
                (_, Some(Setting::Mode(_))) => 3,
                _ => 4,
            }
        };
        let mut idx: Vec<usize> = (0..self.space.dimensions.len()).collect();
        idx.sort_by_key(|&i| (rank(i), i));
        idx
    }

    fn finish(self, best: Option<Config>) -> Outcome {
        Outcome {
            best,
            runs: self.used,
            new_runs: self.new_runs,
            reused_runs: self.reused,
            budget_exhausted: self.exhausted,
            trace: self.trace,
        }
    }

    /// Seeded coordinate descent, then successive halving.
    pub fn run(mut self, verdict: Option<Verdict>) -> anyhow::Result<Outcome> {
        let default = self.space.default.clone();
        let seed = self.seed(verdict);
        let pfs_only = self
            .space
            .dimensions
            .iter()
            .flat_map(|d| d.settings.iter())
            .any(|s| *s == Setting::Fragments(0))
            .then(|| self.space.normalize(Setting::Fragments(0).apply(&default)));
        let mut refs = vec![default.clone(), seed.clone()];
        refs.extend(pfs_only);
        for c in &refs {
            if !self.ensure(c, 1)? {
                let best = self.best_of(refs.iter());
                return Ok(self.finish(best));
            }
        }
        let mut current = self
            .best_of([&default, &seed].into_iter().filter(|c| !c.pfs_only()))
            .unwrap_or_else(|| default.clone());
        self.trace.push(format!(
            "seed {} (verdict {:?}); start from {}",
            seed.key(),
            verdict,
            current.key()
        ));
        let order = self.order(verdict);
        'passes: for pass in 0..2 {
            let mut changed = false;
            for &di in &order {
                let dim = self.space.dimensions[di].clone();
                let variants: Vec<Config> = dim
                    .settings
                    .iter()
                    .map(|s| self.space.normalize(s.apply(&current)))
                    .collect();
                for v in &variants {
                    if !self.ensure(v, 1)? {
                        break 'passes;
                    }
                }
                // The descent walks the burst-buffer configurations: from the PFS-only point
                // every other knob means nothing. PFS-only stays measured and in the final
                // ranking.
                if let Some(b) = self.best_of(
                    variants
                        .iter()
                        .chain(std::iter::once(&current))
                        .filter(|c| !c.pfs_only()),
                ) {
                    // A close call is run again (a duel of medians) before the descent moves:
                    // one run each is at the mercy of a busy machine.
                    if let (Some(x), Some(y)) = (self.score(&b), self.score(&current)) {
                        if b != current && x < y && x > y * (1.0 - DUEL_GAP) {
                            let runs = self.used_of(&b).len().max(2);
                            if !self.ensure(&b, runs)? || !self.ensure(&current, runs)? {
                                break 'passes;
                            }
                        }
                    }
                    // A move must beat the current point by more than run-to-run noise.
                    let better = match (self.score(&b), self.score(&current)) {
                        (Some(x), Some(y)) => x < y * (1.0 - MIN_GAIN),
                        (Some(_), None) => true,
                        _ => false,
                    };
                    if b != current && better {
                        self.trace.push(format!(
                            "pass {}: {}: {} ({:.3} s) beats {} ({})",
                            pass + 1,
                            dim.name,
                            b.key(),
                            self.score(&b).unwrap_or(f64::NAN),
                            current.key(),
                            self.score(&current)
                                .map(|s| format!("{s:.3} s"))
                                .unwrap_or_else(|| "failed".into())
                        ));
                        current = b;
                        changed = true;
                    }
                }
            }
            if !changed {
                break;
            }
        }

        // Successive halving over the best few, with the starting point among them.
        let mut ranked: Vec<(f64, Config)> = self
            .used
            .iter()
            .map(|r| r.config.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .filter_map(|c| self.score(&c).map(|s| (s, c)))
            .collect();
        ranked.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut cands: Vec<Config> = ranked.into_iter().take(3).map(|(_, c)| c).collect();
        if !cands.contains(&current) && self.score(&current).is_some() {
            cands.push(current.clone());
        }
        let mut rung = 2;
        while cands.len() > 1 {
            for c in &cands {
                if !self.ensure(c, rung)? {
                    break;
                }
            }
            cands.sort_by(|a, b| {
                self.score(a)
                    .unwrap_or(f64::INFINITY)
                    .total_cmp(&self.score(b).unwrap_or(f64::INFINITY))
            });
            let keep = cands.len().div_ceil(3).max(1);
            self.trace.push(format!(
                "halving with {rung} runs each: keep {}",
                cands[..keep]
                    .iter()
                    .map(|c| format!("{} ({:.3} s)", c.key(), self.score(c).unwrap_or(f64::NAN)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            cands.truncate(keep);
            rung += 1;
            if self.exhausted {
                break;
            }
        }
        let mut best = cands.into_iter().next().unwrap_or_else(|| current.clone());
        // The halving's winner replaces the descent's end point only by more than noise, as
        // every move of the descent: a tuned script differs from the job only where it pays.
        if let (Some(x), Some(y)) = (self.score(&best), self.score(&current)) {
            if best != current && x >= y * (1.0 - MIN_GAIN) {
                self.trace.push(format!(
                    "keep {} ({y:.3} s): {} ({x:.3} s) is not {:.0}% faster",
                    current.key(),
                    best.key(),
                    MIN_GAIN * 100.0
                ));
                best = current;
            }
        }
        Ok(self.finish(Some(best)))
    }

    /// Every configuration once (ExPBB's nested loops), for comparison.
    pub fn exhaustive(mut self) -> anyhow::Result<Outcome> {
        let all = self.space.all();
        for c in &all {
            if !self.ensure(c, 1)? {
                break;
            }
        }
        let best = self.best_of(all.iter());
        self.trace
            .push(format!("exhaustive: {} configurations", all.len()));
        Ok(self.finish(best))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::{build, Layout, SpaceRequest, StripeCount};
    use surge_core::directives::parse_script;

    const UNLIMITED: Budget = Budget {
        runs: None,
        deadline: None,
    };

    fn ok_run(c: &Config, seconds: f64) -> Run {
        Run {
            config: c.clone(),
            ok: true,
            seconds: Some(seconds),
            exit_code: Some(0),
            phases: vec![],
            started_at: String::new(),
            new: true,
        }
    }

    /// A deterministic landscape in which each knob has its own best value (a model of a
    /// burst buffer, not of Surge): the search must find the product's optimum.
    struct Landscape {
        runs: u64,
    }

    impl Measure for Landscape {
        fn run(&mut self, c: &Config) -> anyhow::Result<Run> {
            self.runs += 1;
            let mut t = 10.0;
            t += match c.fragments {
                0 => 6.0,
                f => 4.0 / f as f64,
            };
            if c.mode == "private" {
                t -= 1.5;
            }
            t += match c.hints.get("romio_cb_write").map(String::as_str) {
                Some("enable") => -1.0,
                Some("disable") => 0.5,
                _ => 0.0,
            };
            t += match c.hints.get("cb_nodes").map(String::as_str) {
                Some("2") => -0.7,
                Some("1") => 0.2,
                _ => 0.0,
            };
            // Wide stripes of 1 MiB suit this model's shared file; one stripe does not.
            t += match c.layout {
                Some(Layout {
                    stripe_count: StripeCount::All,
                    stripe_size: Some(s),
                }) if s == 1 << 20 => -0.8,
                Some(Layout {
                    stripe_count: StripeCount::All,
                    ..
                }) => -0.3,
                Some(_) => 0.4,
                None => 0.0,
            };
            Ok(ok_run(c, t))
        }
    }

    fn space() -> Space {
        let d = parse_script(
            "job.sh",
            "#DW jobdw type=scratch access_mode=striped capacity=256MiB\n\
             #DW stage_in type=file source=/pfs/a destination=$DW_JOB_STRIPED/a\nmpirun ./x\n",
        )
        .unwrap();
        build(
            &d,
            &SpaceRequest {
                granularity: 256 << 20,
                max_fragments: 8,
                fragments: None,
                stage_in_bytes: 1,
                modes: vec!["striped".into(), "private".into()],
                pfs_only: true,
                hybrid_candidates: 1,
                hints: vec![
                    (
                        "romio_cb_write".into(),
                        vec!["enable".into(), "disable".into()],
                    ),
                    ("cb_nodes".into(), vec!["1".into(), "2".into()]),
                ],
                stripe_counts: vec![StripeCount::Count(1), StripeCount::All],
                stripe_sizes: vec![1 << 20, 8 << 20],
            },
            |_| Some(100),
        )
        .unwrap()
    }

    #[test]
    fn finds_the_optimum_of_the_product_in_a_third_of_its_runs() {
        let s = space();
        let all = s.all().len() as u64;
        let budget = UNLIMITED;
        let ex = Search::new(&s, Landscape { runs: 0 }, vec![], budget)
            .exhaustive()
            .unwrap();
        let out = Search::new(&s, Landscape { runs: 0 }, vec![], budget)
            .run(Some(Verdict::Bandwidth))
            .unwrap();
        assert_eq!(out.best, ex.best, "{:#?}", out.trace);
        let best = out.best.unwrap();
        assert_eq!(best.fragments, 8);
        assert_eq!(best.mode, "private");
        assert_eq!(best.hints["cb_nodes"], "2");
        assert_eq!(
            best.layout,
            Some(Layout {
                stripe_count: StripeCount::All,
                stripe_size: Some(1 << 20)
            })
        );
        assert!(
            out.new_runs * 3 <= all,
            "{} runs for a space of {all}",
            out.new_runs
        );
    }

    #[test]
    fn a_second_call_reuses_the_history_and_runs_nothing() {
        let s = space();
        let budget = UNLIMITED;
        let first = Search::new(&s, Landscape { runs: 0 }, vec![], budget)
            .run(None)
            .unwrap();
        let second = Search::new(&s, Landscape { runs: 0 }, first.runs.clone(), budget)
            .run(None)
            .unwrap();
        assert_eq!(second.new_runs, 0);
        assert_eq!(second.reused_runs, first.runs.len() as u64);
        assert_eq!(second.best, first.best);
    }

    #[test]
    fn the_budget_stops_the_search_with_the_best_so_far() {
        let s = space();
        let out = Search::new(
            &s,
            Landscape { runs: 0 },
            vec![],
            Budget {
                runs: Some(4),
                deadline: None,
            },
        )
        .run(Some(Verdict::Bandwidth))
        .unwrap();
        assert_eq!(out.new_runs, 4);
        assert!(out.budget_exhausted);
        assert!(out.best.is_some());
    }

    #[test]
    fn layout_comes_right_after_fragments_unless_the_job_is_metadata_bound() {
        let s = space();
        let search = Search::new(&s, Landscape { runs: 0 }, vec![], UNLIMITED);
        let names = |v: Option<Verdict>| -> Vec<String> {
            search
                .order(v)
                .into_iter()
                .map(|i| s.dimensions[i].name.clone())
                .collect()
        };
        for v in [None, Some(Verdict::Bandwidth), Some(Verdict::Iops)] {
            let n = names(v);
            assert_eq!(&n[..2], ["fragments", "layout"], "{v:?}: {n:?}");
        }
        let n = names(Some(Verdict::Metadata));
        assert_eq!(n.first().map(String::as_str), Some("access mode"), "{n:?}");
        assert_eq!(n.last().map(String::as_str), Some("layout"), "{n:?}");
    }

    /// Every configuration within noise of the job as written, one a hair faster.
    struct Flat;

    impl Measure for Flat {
        fn run(&mut self, c: &Config) -> anyhow::Result<Run> {
            let t = match (c.fragments, c.layout) {
                (0, _) => 2.0,
                (
                    _,
                    Some(Layout {
                        stripe_count: StripeCount::Count(1),
                        ..
                    }),
                ) => 0.99,
                _ => 1.0,
            };
            Ok(ok_run(c, t))
        }
    }

    #[test]
    fn a_win_within_noise_leaves_the_job_as_written() {
        let s = space();
        let out = Search::new(&s, Flat, vec![], UNLIMITED).run(None).unwrap();
        assert_eq!(out.best.as_ref(), Some(&s.default), "{:#?}", out.trace);
        assert!(
            out.trace.iter().any(|t| t.starts_with("keep ")),
            "{:#?}",
            out.trace
        );
    }
}
