//! The search space of `surge tune`: what a configuration of a job's burst buffer is, and the
//! dimensions it varies along.
//!
//! | dimension | values | set in the job by |
//! |---|---|---|
//! | fragments | 0 (PFS only), doubling from what the stage-in needs up to `--max-fragments` | `#DW jobdw capacity=` (fragments x granularity) |
//! | access mode | striped, private | `#DW jobdw access_mode=` (and `$DW_JOB_STRIPED`/`$DW_JOB_PRIVATE` in the script) |
//! | hybrid placement | each staged input on the BB or left on the PFS | the stage_in dropped, a symlink in its place |
//! | MPI-IO hints | unset or each value of `--hint KEY=V1,V2` | a ROMIO hints file named by `ROMIO_HINTS` |
//! | layout | the mount's choice (nothing set), each `--stripe-counts` value, with each of `--stripe-sizes` where the count is not 1 | `surge layout set "$DW_JOB_STRIPED" --stripe-count N --stripe-size S` before the job's commands |
//!
//! A layout is a directory default (docs/DATAPLANE.md, "Layout"): it shapes the files the job
//! makes, not those staged in before it runs. Layouts that lie the same way over an instance
//! are one configuration ([`Space::normalize`]): on one fragment every count is one stripe.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
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
    /// The default layout set on the instance's root before the job runs; `None`: the mount's
    /// choice (nothing set, as the job is written). Histories from before layouts were
    /// searched have no such field: their runs had the mount's choice.
    #[serde(default)]
    pub layout: Option<Layout>,
}

/// How many fragments a file's stripes go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StripeCount {
    Count(u32),
    /// Every fragment of the instance.
    All,
}

impl StripeCount {
    /// Reads `1`, `4` or `all` (what `surge layout set --stripe-count` takes). 0 is refused:
    /// it would mean the mount's choice, which the tuner always tries.
    pub fn parse(text: &str) -> Result<StripeCount, String> {
        match text.trim() {
            "all" | "-1" => Ok(StripeCount::All),
            t => match t.parse::<u32>() {
                Ok(0) => Err(format!(
                    "stripe count '{text}': 0 is the mount's choice, which is always tried; \
                     give 1, 2, ... or all"
                )),
                Ok(n) => Ok(StripeCount::Count(n)),
                Err(_) => Err(format!(
                    "stripe count '{text}' is not a number of fragments or `all`"
                )),
            },
        }
    }
}

impl fmt::Display for StripeCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StripeCount::Count(n) => write!(f, "{n}"),
            StripeCount::All => write!(f, "all"),
        }
    }
}

/// In JSON as `surge layout get --json` writes it: a number, or `"all"`.
impl Serialize for StripeCount {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            StripeCount::Count(n) => s.serialize_u32(*n),
            StripeCount::All => s.serialize_str("all"),
        }
    }
}

impl<'de> Deserialize<'de> for StripeCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<StripeCount, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            N(u32),
            Word(String),
        }
        match Repr::deserialize(d)? {
            Repr::N(n) => StripeCount::parse(&n.to_string()),
            Repr::Word(w) => StripeCount::parse(&w),
        }
        .map_err(serde::de::Error::custom)
    }
}

/// A layout the tuner sets as the default of the job instance's root (`surge layout set`):
/// the files the job makes there, and in the directories it makes, get it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Layout {
    pub stripe_count: StripeCount,
    /// Bytes per stripe; `None`: the instance's (8 MiB, DataWarp's). Means nothing with one
    /// stripe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stripe_size: Option<u64>,
}

impl Layout {
    /// The arguments of `surge layout set` that set it.
    pub fn set_args(&self) -> String {
        let mut a = format!("--stripe-count {}", self.stripe_count);
        if let Some(s) = self.stripe_size {
            a += &format!(" --stripe-size {}", stripe_size_text(s));
        }
        a
    }
}

/// What reports print: the words of the attribute `user.surge.layout`.
impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stripe_count={}", self.stripe_count)?;
        if let Some(s) = self.stripe_size {
            write!(f, " stripe_size={}", stripe_size_text(s))?;
        }
        Ok(())
    }
}

/// A stripe size in the largest binary unit that divides it (stripe sizes are multiples of
/// 4 KiB): `1MiB`, `64KiB`; read back exactly by `surge layout set --stripe-size`.
pub fn stripe_size_text(bytes: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    UNITS
        .iter()
        .find(|(u, _)| bytes >= *u && bytes.is_multiple_of(*u))
        .map(|(u, name)| format!("{}{name}", bytes / u))
        .unwrap_or_else(|| bytes.to_string())
}

/// Reads a stripe size as `surge layout set --stripe-size` takes it (`1MiB`), checked the way
/// the mount checks it, so a bad value is named before any run.
pub fn parse_stripe_size(text: &str) -> Result<u64, String> {
    let bytes = surge_core::parse_size(text).map_err(|e| format!("stripe size '{text}': {e}"))?;
    surge_core::FileLayout {
        stripe_size: bytes,
        stripe_count: 0,
        start: 0,
    }
    .check(u32::MAX)
    .map_err(|e| format!("stripe size '{text}': {e}"))?;
    Ok(bytes)
}

impl Config {
    pub fn pfs_only(&self) -> bool {
        self.fragments == 0
    }

    /// The layout of the files the job makes, in words: `stripe_count=all stripe_size=1MiB`,
    /// the mount's choice, or none without a burst buffer.
    pub fn layout_text(&self) -> String {
        match &self.layout {
            _ if self.pfs_only() => "none (PFS only)".into(),
            Some(l) => l.to_string(),
            None => "mount's choice".into(),
        }
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
        // Absent: the mount's choice (so keys written before layouts were searched still read
        // the same).
        if let Some(l) = &self.layout {
            parts.push(format!("stripe-count={}", l.stripe_count));
            if let Some(s) = l.stripe_size {
                parts.push(format!("stripe-size={}", stripe_size_text(s)));
            }
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
    /// The instance root's default layout (`None`: the mount's choice).
    Layout(Option<Layout>),
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
            Setting::Layout(l) => c.layout = *l,
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
    /// Stripe counts to try besides the mount's choice (empty: layouts are not searched).
    pub stripe_counts: Vec<StripeCount>,
    /// Stripe sizes to try with each count other than 1 (empty: the instance's).
    pub stripe_sizes: Vec<u64>,
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
        layout: None,
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

    // Layouts: the mount's choice first (the job as written), then each count, with each
    // stripe size where the count spreads a file over more than one fragment.
    if j.access_mode == AccessMode::Ldbalance {
        if !req.stripe_counts.is_empty() {
            notes.push(
                "layouts are not searched: a read-only (ldbalance) instance holds only what is \
                 staged in"
                    .into(),
            );
        }
    } else if !req.stripe_counts.is_empty() {
        let mut settings = vec![Setting::Layout(None)];
        for &count in &req.stripe_counts {
            let sizes: Vec<Option<u64>> =
                if count == StripeCount::Count(1) || req.stripe_sizes.is_empty() {
                    vec![None]
                } else {
                    req.stripe_sizes.iter().copied().map(Some).collect()
                };
            for stripe_size in sizes {
                let s = Setting::Layout(Some(Layout {
                    stripe_count: count,
                    stripe_size,
                }));
                if !settings.contains(&s) {
                    settings.push(s);
                }
            }
        }
        dims.push(Dimension {
            name: "layout".into(),
            settings,
        });
        if job_stages(d).any(|s| s.direction == surge_core::directives::StageDirection::In) {
            notes.push(
                "a layout shapes what the job writes: files staged in before it runs keep the \
                 layout the stage-in gave them"
                    .into(),
            );
        }
    }
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

    /// One configuration for what runs the same way. PFS-only runs have no instance: their
    /// mode, placement and layout are the default's. A layout is taken for what it does on
    /// the configuration's fragments: a count of one stripe has no stripe size, a count of at
    /// least the fragments is every fragment (and on one fragment, one stripe).
    pub fn normalize(&self, mut c: Config) -> Config {
        if c.pfs_only() {
            c.mode = self.default.mode.clone();
            c.on_pfs.clear();
            c.layout = None;
        }
        if let Some(l) = &mut c.layout {
            let fragments = u32::try_from(c.fragments).unwrap_or(u32::MAX);
            let stripes = match l.stripe_count {
                StripeCount::All => fragments,
                StripeCount::Count(n) => n.min(fragments),
            };
            if stripes <= 1 {
                l.stripe_count = StripeCount::Count(1);
                l.stripe_size = None;
            } else if stripes == fragments {
                l.stripe_count = StripeCount::All;
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use surge_core::directives::parse_script;

    fn request(fragments: Vec<u64>) -> SpaceRequest {
        SpaceRequest {
            granularity: 64 << 20,
            max_fragments: 8,
            fragments: Some(fragments),
            stage_in_bytes: 1,
            modes: vec!["striped".into()],
            pfs_only: true,
            hybrid_candidates: 0,
            hints: Vec::new(),
            stripe_counts: vec![StripeCount::Count(1), StripeCount::All],
            stripe_sizes: vec![1 << 20, 8 << 20],
        }
    }

    fn space_of(script: &str, req: &SpaceRequest) -> Space {
        build(&parse_script("job.sh", script).unwrap(), req, |_| Some(1)).unwrap()
    }

    const JOB: &str = "#DW jobdw type=scratch access_mode=striped capacity=128MiB\n./app\n";

    fn layout(count: StripeCount, size: Option<u64>) -> Option<Layout> {
        Some(Layout {
            stripe_count: count,
            stripe_size: size,
        })
    }

    #[test]
    fn the_layout_dimension_starts_with_the_mounts_choice_and_sizes_only_wide_stripes() {
        let s = space_of(JOB, &request(vec![1, 2, 4]));
        let dim = s.dimensions.iter().find(|d| d.name == "layout").unwrap();
        assert_eq!(
            dim.settings,
            vec![
                Setting::Layout(None),
                Setting::Layout(layout(StripeCount::Count(1), None)),
                Setting::Layout(layout(StripeCount::All, Some(1 << 20))),
                Setting::Layout(layout(StripeCount::All, Some(8 << 20))),
            ]
        );
        assert_eq!(s.default.layout, None);
    }

    #[test]
    fn layouts_that_lie_the_same_way_are_one_configuration() {
        let s = space_of(JOB, &request(vec![1, 2, 4]));
        let at = |fragments: u64, l: Option<Layout>| {
            s.normalize(Config {
                fragments,
                layout: l,
                ..s.default.clone()
            })
            .layout
        };
        // One fragment: every count is one stripe, and a stripe size means nothing.
        assert_eq!(
            at(1, layout(StripeCount::All, Some(1 << 20))),
            layout(StripeCount::Count(1), None)
        );
        // A count at or above the fragments is every fragment.
        assert_eq!(
            at(2, layout(StripeCount::Count(4), Some(1 << 20))),
            layout(StripeCount::All, Some(1 << 20))
        );
        assert_eq!(
            at(4, layout(StripeCount::Count(2), None)),
            layout(StripeCount::Count(2), None)
        );
        // No instance, no layout.
        assert_eq!(at(0, layout(StripeCount::All, None)), None);
        // PFS only once; at 1 fragment the mount's choice and one stripe; at 2 and 4 all four.
        assert_eq!(s.all().len(), 1 + 2 + 4 + 4);
    }

    #[test]
    fn no_stripe_counts_no_layout_dimension_and_a_read_only_instance_has_none() {
        let mut req = request(vec![1, 2]);
        req.stripe_counts.clear();
        let s = space_of(JOB, &req);
        assert!(s.dimensions.iter().all(|d| d.name != "layout"));
        let ro = space_of(
            "#DW jobdw type=scratch access_mode=ldbalance capacity=128MiB\n\
             #DW stage_in type=file source=/pfs/a destination=$DW_JOB_LDBAL/a\n./app\n",
            &request(vec![1, 2]),
        );
        assert!(ro.dimensions.iter().all(|d| d.name != "layout"));
        assert!(
            ro.notes.iter().any(|n| n.contains("ldbalance")),
            "{:?}",
            ro.notes
        );
    }

    #[test]
    fn bad_stripe_counts_and_sizes_are_named() {
        assert_eq!(StripeCount::parse("all"), Ok(StripeCount::All));
        assert_eq!(StripeCount::parse("4"), Ok(StripeCount::Count(4)));
        let e = StripeCount::parse("0").unwrap_err();
        assert!(e.contains("'0'") && e.contains("mount's choice"), "{e}");
        let e = StripeCount::parse("many").unwrap_err();
        assert!(e.contains("'many'"), "{e}");
        assert_eq!(parse_stripe_size("1MiB"), Ok(1 << 20));
        let e = parse_stripe_size("3KiB").unwrap_err();
        assert!(e.contains("'3KiB'") && e.contains("4 KiB"), "{e}");
        let e = parse_stripe_size("big").unwrap_err();
        assert!(e.contains("'big'"), "{e}");
    }

    #[test]
    fn a_layout_reads_as_surge_layout_writes_it() {
        let l = Layout {
            stripe_count: StripeCount::All,
            stripe_size: Some(64 << 10),
        };
        assert_eq!(l.to_string(), "stripe_count=all stripe_size=64KiB");
        assert_eq!(l.set_args(), "--stripe-count all --stripe-size 64KiB");
        let json = serde_json::to_string(&l).unwrap();
        assert_eq!(json, r#"{"stripe_count":"all","stripe_size":65536}"#);
        assert_eq!(serde_json::from_str::<Layout>(&json).unwrap(), l);
        let one: Layout = serde_json::from_str(r#"{"stripe_count":1}"#).unwrap();
        assert_eq!(one.set_args(), "--stripe-count 1");
        let c = |fragments| Config {
            fragments,
            mode: "striped".into(),
            on_pfs: BTreeSet::new(),
            hints: BTreeMap::new(),
            layout: None,
        };
        assert_eq!(c(1).layout_text(), "mount's choice");
        assert_eq!(c(0).layout_text(), "none (PFS only)");
        assert_eq!(stripe_size_text(3 << 30), "3GiB");
    }
}
