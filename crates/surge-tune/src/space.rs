//! The search space of `surge tune`: what a configuration of a job's burst buffer is, and the
//! dimensions it varies along.
//!
//! | dimension | values | set in the job by |
//! |---|---|---|
//! | fragments | 0 (PFS only), doubling from what the stage-in needs up to `--max-fragments` | `#DW jobdw capacity=` (fragments x granularity) |
//! | access mode | striped, private | `#DW jobdw access_mode=` (and `$DW_JOB_STRIPED`/`$DW_JOB_PRIVATE` in the script) |
//! | hybrid placement | each staged input on the BB or left on the PFS | the stage_in dropped, a symlink in its place |
//! | MPI-IO hints | unset or each value of `--hint KEY=V1,V2` | a ROMIO hints file named by `ROMIO_HINTS` |
//!
//! Stripe size is not a dimension: Surge sets it per instance in the manager's API, but no
//! directive carries it and per-file layout control (`surge layout set`) does not exist yet.
//! ROMIO's `striping_unit` hint is searched instead, which only shapes the MPI-IO library's
//! collective buffers.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use surge_core::directives::{AccessMode, Directives, DwVariable, StageDirective, StageKind};

/// One point of the search space.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Config {
    /// Fragments of the job instance; 0 runs the job on the PFS only (no `#DW jobdw`).
    pub fragments: u64,
    /// `striped` or `private`.
    pub mode: String,
    /// PFS-side paths of stage directives left on the PFS (hybrid placement).
    pub on_pfs: BTreeSet<String>,
    /// MPI-IO hints (ROMIO names) that are set; unset hints are the library's defaults.
    pub hints: BTreeMap<String, String>,
}

impl Config {
    pub fn pfs_only(&self) -> bool {
        self.fragments == 0
    }

    /// The canonical text of the configuration: the history's key and what reports print.
    pub fn key(&self) -> String {
        let mut parts = Vec::new();
        if self.pfs_only() {
            parts.push("pfs-only".to_string());
        } else {
            parts.push(format!("fragments={}", self.fragments));
            parts.push(format!("mode={}", self.mode));
            if !self.on_pfs.is_empty() {
                parts.push(format!(
                    "on-pfs={}",
                    self.on_pfs.iter().cloned().collect::<Vec<_>>().join(",")
                ));
            }
        }
        if !self.hints.is_empty() {
            parts.push(format!(
                "hints={}",
                self.hints
                    .iter()
                    .map(|(k, v)| format!("{k}:{v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            ));
        }
        parts.join(" ")
    }
}

/// One setting along one dimension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Setting {
    Fragments(u64),
    Mode(String),
    /// A staged path (PFS side) and whether it stays on the PFS.
    OnPfs(String, bool),
    /// A hint and its value (`None`: unset).
    Hint(String, Option<String>),
}

impl Setting {
    pub fn apply(&self, c: &Config) -> Config {
        let mut c = c.clone();
        match self {
            Setting::Fragments(f) => c.fragments = *f,
            Setting::Mode(m) => c.mode = m.clone(),
            Setting::OnPfs(p, true) => {
                c.on_pfs.insert(p.clone());
            }
            Setting::OnPfs(p, false) => {
                c.on_pfs.remove(p);
            }
            Setting::Hint(k, Some(v)) => {
                c.hints.insert(k.clone(), v.clone());
            }
            Setting::Hint(k, None) => {
                c.hints.remove(k);
            }
        }
        c
    }
}

/// A dimension: a name and the settings along it.
#[derive(Clone, Debug)]
pub struct Dimension {
    pub name: String,
    pub settings: Vec<Setting>,
}

/// A staged path that can stay on the PFS.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HybridCandidate {
    /// The PFS side as written in the directive (stage_in source, stage_out destination).
    pub pfs_path: String,
    pub direction: String,
    /// Bytes on the PFS when known (stage-in sources).
    pub bytes: Option<u64>,
}

/// What the tuner knows of the job when it builds the space.
#[derive(Clone, Debug)]
pub struct SpaceRequest {
    pub granularity: u64,
    pub max_fragments: u64,
    /// Explicit fragment counts (`--fragments`), replacing the doubling.
    pub fragments: Option<Vec<u64>>,
    /// Bytes the job stages into its job instance (the least capacity that works).
    pub stage_in_bytes: u64,
    pub modes: Vec<String>,
    pub pfs_only: bool,
    pub hybrid_candidates: usize,
    /// Hint dimensions: key and the values to try besides unset.
    pub hints: Vec<(String, Vec<String>)>,
}

#[derive(Clone, Debug)]
pub struct Space {
    /// The job as written.
    pub default: Config,
    pub dimensions: Vec<Dimension>,
    pub hybrid: Vec<HybridCandidate>,
    /// Why a dimension or value is missing (printed in the report).
    pub notes: Vec<String>,
}

fn job_stages(d: &Directives) -> impl Iterator<Item = &StageDirective> {
    d.stage_in
        .iter()
        .chain(d.stage_out.iter())
        .filter(|s| matches!(s.instance, DwVariable::JobStriped | DwVariable::JobPrivate))
}

/// The instance-side path of a stage directive without its variable ("" for the root).
pub fn instance_rest(s: &StageDirective) -> String {
    let side = match s.direction {
        surge_core::directives::StageDirection::In => {
            s.file_target().unwrap_or_else(|| s.destination.clone())
        }
        surge_core::directives::StageDirection::Out => s.source.clone(),
    };
    let rest = side
        .trim_start_matches("${DW_JOB_STRIPED}")
        .trim_start_matches("${DW_JOB_PRIVATE}")
        .trim_start_matches("$DW_JOB_STRIPED")
        .trim_start_matches("$DW_JOB_PRIVATE");
    rest.trim_matches('/').to_string()
}

/// The PFS side of a stage directive as written.
pub fn pfs_side(s: &StageDirective) -> &str {
    match s.direction {
        surge_core::directives::StageDirection::In => &s.source,
        surge_core::directives::StageDirection::Out => &s.destination,
    }
}

/// Whether a stage directive can be replaced by a symlink to its PFS side.
fn linkable(s: &StageDirective) -> bool {
    s.kind != StageKind::List && !instance_rest(s).is_empty()
}

pub fn build(
    d: &Directives,
    req: &SpaceRequest,
    pfs_size: impl Fn(&str) -> Option<u64>,
) -> anyhow::Result<Space> {
    let Some(j) = &d.jobdw else {
        anyhow::bail!(
            "the job has no `#DW jobdw`: there is no burst-buffer allocation for surge tune to \
             size; add e.g. `#DW jobdw type=scratch access_mode=striped capacity=1GiB`"
        );
    };
    let g = req.granularity.max(1);
    let mode = j.access_mode.as_str();
    let default = Config {
        fragments: j.capacity.div_ceil(g).max(1),
        mode: mode.into(),
        on_pfs: BTreeSet::new(),
        hints: BTreeMap::new(),
    };
    let mut notes = Vec::new();
    let mut dims = Vec::new();

    // Fragments: doubling from the least that holds the stage-in.
    let least = req.stage_in_bytes.div_ceil(g).max(1);
    let mut frags: Vec<u64> = match &req.fragments {
        Some(v) => v.iter().copied().filter(|&f| f >= least).collect(),
        None => {
            let mut v = Vec::new();
            let mut f = least;
            while f <= req.max_fragments.max(least) {
                v.push(f);
                f *= 2;
            }
            v
        }
    };
    if !frags.contains(&default.fragments) {
        frags.push(default.fragments);
    }
    let all_linkable = job_stages(d).all(linkable);
    if req.pfs_only {
        if all_linkable {
            frags.insert(0, 0);
        } else {
            notes.push(
                "PFS-only is not tried: a stage directive of the job instance is a list or \
                 fills the instance's root, which a symlink cannot replace"
                    .into(),
            );
        }
    }
    frags.sort_unstable();
    frags.dedup();
    dims.push(Dimension {
        name: "fragments".into(),
        settings: frags.into_iter().map(Setting::Fragments).collect(),
    });

    // A read-only (ldbalance) instance keeps its mode: its job writes nothing there.
    let mut modes: Vec<String> = if j.access_mode == AccessMode::Ldbalance {
        Vec::new()
    } else {
        req.modes.clone()
    };
    if !modes.contains(&default.mode) {
        modes.insert(0, default.mode.clone());
    }
    if modes.len() > 1 {
        dims.push(Dimension {
            name: "access mode".into(),
            settings: modes.into_iter().map(Setting::Mode).collect(),
        });
    }

    // Hybrid placement: the smallest staged paths first (ExPBB: small shared files on the PFS).
    // Only inputs: an output left on the PFS through a link is lost if the job replaces the
    // link (unlink and create, as SQLite's and many writers' "remove the old file" do).
    let mut cands: Vec<HybridCandidate> = job_stages(d)
        .filter(|s| linkable(s) && s.direction == surge_core::directives::StageDirection::In)
        .map(|s| HybridCandidate {
            pfs_path: pfs_side(s).to_string(),
            direction: if s.direction == surge_core::directives::StageDirection::In {
                "in".into()
            } else {
                "out".into()
            },
            bytes: if s.direction == surge_core::directives::StageDirection::In {
                pfs_size(pfs_side(s))
            } else {
                None
            },
        })
        .collect();
    cands.sort_by_key(|c| (c.direction != "in", c.bytes.unwrap_or(u64::MAX)));
    cands.dedup_by(|a, b| a.pfs_path == b.pfs_path);
    if cands.len() > req.hybrid_candidates {
        notes.push(format!(
            "hybrid placement: {} staged paths, the {} smallest are tried on the PFS \
             (--hybrid-candidates)",
            cands.len(),
            req.hybrid_candidates
        ));
        cands.truncate(req.hybrid_candidates);
    }
    for c in &cands {
        dims.push(Dimension {
            name: format!("{} on the PFS", c.pfs_path),
            settings: vec![
                Setting::OnPfs(c.pfs_path.clone(), false),
                Setting::OnPfs(c.pfs_path.clone(), true),
            ],
        });
    }
    for (k, vals) in &req.hints {
        let mut settings = vec![Setting::Hint(k.clone(), None)];
        settings.extend(
            vals.iter()
                .map(|v| Setting::Hint(k.clone(), Some(v.clone()))),
        );
        dims.push(Dimension {
            name: format!("hint {k}"),
            settings,
        });
    }
    notes.push(
        "stripe size is not searched: no directive sets an instance's stripe size and per-file \
         layout control (surge layout set) is not there yet"
            .into(),
    );
    Ok(Space {
        default,
        dimensions: dims,
        hybrid: cands,
        notes,
    })
}

impl Space {
    /// The product of the dimensions' sizes (PFS-only points counted once per combination of
    /// the other knobs; [`Space::all`] collapses them).
    pub fn size(&self) -> u64 {
        self.dimensions
            .iter()
            .map(|d| d.settings.len() as u64)
            .product()
    }

    /// Every configuration (for `--exhaustive`), PFS-only variants collapsed to one per hint
    /// setting (mode and placement mean nothing without an instance).
    pub fn all(&self) -> Vec<Config> {
        let mut out: Vec<Config> = vec![self.default.clone()];
        for d in &self.dimensions {
            let mut next = Vec::new();
            for c in &out {
                for s in &d.settings {
                    next.push(s.apply(c));
                }
            }
            out = next;
        }
        let mut seen = BTreeSet::new();
        out.into_iter()
            .map(|c| self.normalize(c))
            .filter(|c| seen.insert(c.clone()))
            .collect()
    }

    /// PFS-only runs have no instance: their mode and placement are the default's.
    pub fn normalize(&self, mut c: Config) -> Config {
        if c.pfs_only() {
            c.mode = self.default.mode.clone();
            c.on_pfs.clear();
        }
        c
    }
}
