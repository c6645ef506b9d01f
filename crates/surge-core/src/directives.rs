//! The burst-buffer directives of a job script: DataWarp's `#DW jobdw`, `#DW persistentdw`,
//! `#DW stage_in`, `#DW stage_out`, `#BB create_persistent` and `#BB destroy_persistent`, HPE
//! Rabbit's (DWS) named `#DW jobdw ... name=` allocations with `#DW copy_in`/`#DW copy_out`, and
//! the `#SURGE` prefix reserved for Surge's own directives. `docs/DIRECTIVES.md` is the user's
//! reference; this module implements it, and the document's examples are run as tests.
//!
//! Boundaries: text in, typed directives (or every error of the script at once) out. No I/O and
//! no environment: paths are kept as written, `$DW_*` variables unexpanded, until the manager
//! knows the mount points and calls [`expand_dw_path`]. Whether a pool or a persistent instance
//! exists, and what a stage does with the files, is the manager's and the stager's business; the
//! parser checks everything that can be checked from the script alone, so that a bad script is
//! rejected before anything is allocated.
//!
//! Directives are read the way Slurm reads them (`_xlate_batch` in its burst-buffer plugins):
//! from the comment block at the top of the script, up to the first line that is not a comment,
//! with a trailing `\` continuing a directive on the next line, which repeats the prefix.

use crate::units::parse_size;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;

/// Longest persistent-instance or pool name accepted (Surge's limit; DataWarp documented none).
pub const MAX_NAME_LEN: usize = 64;

/// Longest name of a Rabbit job allocation (`#DW jobdw ... name=`): the instance Surge makes
/// for it is named `<job tag>_<name>`, and the tag takes at most [`MAX_JOB_TAG_LEN`] + 1 of the
/// [`MAX_NAME_LEN`] characters.
pub const MAX_ALLOCATION_NAME_LEN: usize = 40;

/// Longest job tag a Rabbit allocation's instance name starts with (see the lifecycle).
pub const MAX_JOB_TAG_LEN: usize = 23;

// The tag, `_`, then the name.
const _: () = assert!(MAX_ALLOCATION_NAME_LEN + MAX_JOB_TAG_LEN < MAX_NAME_LEN);

/// Most Rabbit job allocations one job may ask for.
pub const MAX_ALLOCATIONS: usize = 16;

/// Everything a job script asks of the burst buffer, each kind in script order.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Directives {
    /// The job instance (`#DW jobdw`), at most one per job; it lives as long as the job.
    pub jobdw: Option<JobDw>,
    /// Rabbit's named job allocations (`#DW jobdw type=xfs|gfs2|lustre capacity=N name=X`),
    /// several per job, each an instance of its own reached at `$DW_JOB_<name>`.
    #[serde(default)]
    pub allocations: Vec<JobAllocation>,
    /// Persistent instances the job attaches (`#DW persistentdw`), each mounted for the job at
    /// `$DW_PERSISTENT_STRIPED_<name>`.
    pub persistentdw: Vec<PersistentDw>,
    /// Copies from the parallel file system into an instance, before the job runs.
    pub stage_in: Vec<StageDirective>,
    /// Copies from an instance to the parallel file system, after the job ends.
    pub stage_out: Vec<StageDirective>,
    /// Persistent instances the job creates (`#BB create_persistent`).
    pub create_persistent: Vec<CreatePersistent>,
    /// Persistent instances the job destroys (`#BB destroy_persistent`).
    pub destroy_persistent: Vec<DestroyPersistent>,
    /// Lines that look like directives but are not read as such (after the first command,
    /// indented, mis-spelt prefix). The job can run, but the user should be told.
    pub warnings: Vec<DirectiveWarning>,
}

impl Directives {
    /// True when the script asks nothing of the burst buffer (warnings aside).
    pub fn is_empty(&self) -> bool {
        self.jobdw.is_none()
            && self.allocations.is_empty()
            && self.persistentdw.is_empty()
            && self.stage_in.is_empty()
            && self.stage_out.is_empty()
            && self.create_persistent.is_empty()
            && self.destroy_persistent.is_empty()
    }
}

/// `#DW jobdw type=scratch access_mode=striped|private capacity=N [pool=P]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobDw {
    /// Line of the directive in the script (1-based).
    pub line: usize,
    pub kind: InstanceType,
    pub access_mode: AccessMode,
    /// Requested capacity in bytes, as written (the manager rounds it up to the granularity).
    pub capacity: u64,
    /// The pool to allocate from; `None` means the manager's default pool.
    pub pool: Option<String>,
    /// Performance targets of a `#SURGE jobdw` (Daley §5.3): the allocation is sized to meet
    /// them from the pool's calibrated peaks. `None` for `#DW jobdw`. With targets, `capacity`
    /// is the capacity asked for, 0 when only targets were given.
    #[serde(default)]
    pub targets: Option<Targets>,
    /// The `type=cache` keys (all unset for `type=scratch`).
    #[serde(flatten)]
    pub cache: CacheSpec,
}

/// `#DW jobdw type=xfs|gfs2|lustre capacity=N name=NAME` (HPE Rabbit's dialect, told apart
/// from DataWarp's by `name=` or by one of Rabbit's types): a job allocation of its own, reached
/// at `$DW_JOB_<name>` (`-` in the name written `_`), living as long as the job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobAllocation {
    pub line: usize,
    /// As written: a lower-case letter, then lower-case letters, digits or `-`.
    pub name: String,
    pub fs: RabbitFs,
    /// As written: per compute node for xfs and gfs2, for the whole job for lustre (Rabbit's
    /// meaning); see [`JobAllocation::capacity_for`].
    pub capacity: u64,
    /// A Surge key: the pool to allocate from (`None`: the manager's default).
    pub pool: Option<String>,
}

impl JobAllocation {
    /// Surge's access mode for the allocation: xfs and gfs2 are one file system per compute
    /// node on Rabbit (Surge: `private`, a namespace per node); lustre one for the whole job
    /// (Surge: `striped`).
    pub fn access_mode(&self) -> AccessMode {
        self.fs.access_mode()
    }

    /// The variable the job reaches the allocation by: `$DW_JOB_<name>`.
    pub fn var(&self) -> DwVariable {
        DwVariable::JobNamed(allocation_var_suffix(&self.name))
    }

    /// The capacity to allocate for a job of `nodes` compute nodes (xfs and gfs2: per node).
    pub fn capacity_for(&self, nodes: u32) -> u64 {
        match self.access_mode() {
            AccessMode::Private => self.capacity.saturating_mul(u64::from(nodes.max(1))),
            AccessMode::Striped | AccessMode::Ldbalance => self.capacity,
        }
    }
}

/// The part of `$DW_JOB_<name>` after `DW_JOB_` for a Rabbit allocation named `name`: `-`
/// becomes `_` (Rabbit's rule, as a shell variable cannot hold `-`).
pub fn allocation_var_suffix(name: &str) -> String {
    name.replace('-', "_")
}

/// The file system a Rabbit job allocation asks for (`type=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RabbitFs {
    /// One XFS per compute node on Rabbit: Surge's `private`.
    Xfs,
    /// One GFS2 per compute node on Rabbit (shared by the nodes of a chassis there): Surge's
    /// `private`.
    Gfs2,
    /// One Lustre for the whole job on Rabbit: Surge's `striped`.
    Lustre,
}

impl RabbitFs {
    pub fn as_str(self) -> &'static str {
        match self {
            RabbitFs::Xfs => "xfs",
            RabbitFs::Gfs2 => "gfs2",
            RabbitFs::Lustre => "lustre",
        }
    }

    pub fn access_mode(self) -> AccessMode {
        match self {
            RabbitFs::Xfs | RabbitFs::Gfs2 => AccessMode::Private,
            RabbitFs::Lustre => AccessMode::Striped,
        }
    }
}

/// The `type=cache` keys of a `jobdw` or `create_persistent` line.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheSpec {
    /// `type=cache`: the PFS directory the instance mirrors (`pfs=`, absolute).
    #[serde(default)]
    pub pfs: Option<String>,
    /// `type=cache`: DataWarp's `optimization=bandwidth|latency|interactive` (recorded; the
    /// drain is the same for all three so far).
    #[serde(default)]
    pub optimization: Option<String>,
    /// `type=cache`, `fsync=pfs` (a Surge extension of DataWarp's line): an `fsync` in the
    /// job returns once the file is on the PFS. The default, `fsync=tier`, once it is on the
    /// fast tier.
    #[serde(default)]
    pub fsync_pfs: bool,
    /// `type=cache`, `dirty_high=` (a Surge extension): the dirty-data high-water mark at
    /// which writers wait for the drain; `None`: the default (off: see [`DirtyHigh::DEFAULT`]).
    #[serde(default)]
    pub dirty_high: Option<DirtyHigh>,
    /// `type=cache`, `passthrough=on` (a Surge extension, the default): files of one stripe
    /// on a fragment of the mount's host are read and written by kernel passthrough, at the
    /// fast tier's speed, when the tier has room at their open; such a file cannot switch to
    /// writing through to the PFS mid-write, so it may take the tier past its capacity until
    /// it closes. `off`: every write passes the mount, which falls back exactly.
    #[serde(default)]
    pub passthrough: bool,
}

/// `type=cache`: the dirty-data high-water mark (`dirty_high=80%`, `dirty_high=400GiB`,
/// `dirty_high=off`): once the data journaled and not yet on the PFS passes it, writers wait
/// until the drain brings it under three quarters of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DirtyHigh {
    /// A share of the instance's capacity, in percent (0: writers never wait).
    Percent(u8),
    Bytes(u64),
}

impl DirtyHigh {
    /// The default: off. Measured (docs/DIRECTIVES.md, cache item 6), holding writers back
    /// did not make a burst larger than the instance end sooner than evicting clean files
    /// and writing the rest through: the drain copies whole files and the PFS is the bound.
    pub const DEFAULT: DirtyHigh = DirtyHigh::Percent(0);

    /// The mark in bytes for an instance of `capacity` bytes (0: writers never wait).
    pub fn bytes(self, capacity: u64) -> u64 {
        match self {
            DirtyHigh::Percent(p) => capacity / 100 * u64::from(p),
            DirtyHigh::Bytes(b) => b,
        }
    }
}

impl fmt::Display for DirtyHigh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DirtyHigh::Percent(0) | DirtyHigh::Bytes(0) => write!(f, "off"),
            DirtyHigh::Percent(p) => write!(f, "{p}%"),
            DirtyHigh::Bytes(b) => write!(f, "{b}B"),
        }
    }
}

/// `dirty_high=`: a percentage of the capacity (`80%`), a size (`400GiB`), or `off`.
pub fn parse_dirty_high(v: &str) -> Result<DirtyHigh, String> {
    if v == "off" {
        return Ok(DirtyHigh::Percent(0));
    }
    if let Some(p) = v.strip_suffix('%') {
        return match p.parse::<u8>() {
            Ok(p) if p <= 100 => Ok(DirtyHigh::Percent(p)),
            _ => Err(format!(
                "bad dirty_high `{v}`: a percentage of the capacity is 0% to 100%, e.g. \
                 dirty_high=80%"
            )),
        };
    }
    parse_size(v).map(DirtyHigh::Bytes).map_err(|e| {
        format!(
            "bad dirty_high: {e}; give a percentage of the capacity (dirty_high=80%), a size \
             (dirty_high=400GiB) or off"
        )
    })
}

/// What a `#SURGE jobdw` asks of its allocation, per second, for the whole job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Targets {
    /// Bytes per second (read and write: the lower of the two peaks is what is promised).
    pub bandwidth: Option<u64>,
    /// I/O operations per second (4 KiB, read and write).
    pub iops: Option<u64>,
    /// Metadata operations per second (create, stat, remove).
    pub metadata: Option<u64>,
}

/// `#DW persistentdw name=X`: attach an existing persistent instance to the job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersistentDw {
    pub line: usize,
    pub name: String,
}

/// `#DW stage_in` or `#DW stage_out` (and Rabbit's `#DW copy_in` / `#DW copy_out`, whose
/// kind is [`StageKind::Any`]). Paths are kept as written (quotes removed), with their
/// `$DW_*` variable unexpanded: see [`StageDirective::expanded`].
///
/// Meaning, as in DataWarp: `type=directory` copies the *contents* of `source` into the
/// directory `destination` (ExPBB Listing 8 stages a project directory into
/// `$DW_JOB_STRIPED` and runs `$DW_JOB_STRIPED/btio`). `type=file` copies one file to
/// `destination`, or into it when `destination` ends with `/` or is a bare `$DW_…` variable
/// (see [`StageDirective::file_target`]). `type=list`: `source` is a list file of `SRC DST`
/// lines read by [`parse_stage_list`], each DST relative to `destination`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageDirective {
    pub line: usize,
    pub kind: StageKind,
    pub source: String,
    pub destination: String,
    /// In (PFS to instance) or out (instance to PFS).
    pub direction: StageDirection,
    /// The instance side: the variable `destination` (stage in) or `source` (stage out) starts
    /// with, which says which instance the stage reads or fills.
    pub instance: DwVariable,
}

/// `#BB create_persistent name=X capacity=N access_mode=striped type=scratch [pool=P]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatePersistent {
    pub line: usize,
    pub name: String,
    pub capacity: u64,
    /// Always `Striped` today: a persistent instance is reached through
    /// `$DW_PERSISTENT_STRIPED_<name>` and outlives the compute nodes a private namespace
    /// belongs to.
    pub access_mode: AccessMode,
    pub kind: InstanceType,
    pub pool: Option<String>,
    /// The `type=cache` keys (all unset for `type=scratch`): a persistent cache is filled
    /// from `pfs=` when it is created, drained by every job that attaches it and before it
    /// is destroyed.
    #[serde(flatten)]
    pub cache: CacheSpec,
}

/// `#BB destroy_persistent name=X [hurry]`. `hurry` (Slurm's word) asks to skip any stage-out
/// still pending for the instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DestroyPersistent {
    pub line: usize,
    pub name: String,
    pub hurry: bool,
}

/// What an instance does with data. `Cache` (read-through, write-behind to the PFS) is later
/// work; `type=cache` mirrors a PFS directory (`pfs=`) with write-behind to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstanceType {
    /// The job moves data itself, with stage directives or by hand.
    Scratch,
    /// Mirrors the PFS directory `pfs=`: filled from it before the job, every change drained
    /// back to it in the background and before the instance goes (`$DW_JOB_STRIPED_CACHE`).
    Cache,
}

/// How compute nodes see an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessMode {
    /// One namespace shared by all compute nodes (`$DW_JOB_STRIPED`).
    Striped,
    /// One namespace per compute node, each with its own metadata server (`$DW_JOB_PRIVATE`).
    Private,
    /// Read-only replicas for many readers (software environments): the stage-in is copied
    /// into every replica, each with its own metadata server, each compute node reads one, and
    /// mounts cache names, attributes and pages for the instance's lifetime (`$DW_JOB_LDBAL`).
    Ldbalance,
}

/// `type=` of a stage directive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StageKind {
    File,
    Directory,
    List,
    /// Rabbit's `copy_in`/`copy_out` (no `type=`): a file or a directory, as the source turns
    /// out to be when the copy runs; a directory's contents go into `destination`.
    Any,
}

/// Which way a stage copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StageDirection {
    /// `stage_in`: PFS to instance, before the job.
    In,
    /// `stage_out`: instance to PFS, after the job.
    Out,
}

/// The DataWarp variables a path on an instance starts with. Their values (mount points) are
/// given to the job in the environment and to [`expand_dw_path`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DwVariable {
    /// `$DW_JOB_STRIPED`: the job instance, striped.
    JobStriped,
    /// `$DW_JOB_PRIVATE`: the job instance, private.
    JobPrivate,
    /// `$DW_JOB_LDBAL`: the job instance, load-balanced read-only replicas.
    JobLdbal,
    /// `$DW_JOB_STRIPED_CACHE`: the job instance, a striped cache of a PFS directory.
    JobStripedCache,
    /// `$DW_PERSISTENT_STRIPED_<name>`: an attached persistent instance (Rabbit's
    /// `$DW_PERSISTENT_<name>` is read as this too: both are set for every attached instance).
    PersistentStriped(String),
    /// `$DW_JOB_<name>`: a Rabbit job allocation; the string is what follows `DW_JOB_` (the
    /// allocation's name with `-` written `_`).
    JobNamed(String),
}

/// An error in a script (or a stage list file): where, what, and what was expected.
/// Displays as `job.sh:5: `capacity=10XB`: bad capacity: ...`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectiveError {
    /// The file name as given to the parser.
    pub file: String,
    /// 1-based line number.
    pub line: usize,
    /// The offending text: a `key=value` token, or the whole directive.
    pub text: String,
    /// What is wrong and what was expected.
    pub message: String,
}

/// All errors of a script, in line order. Displays one error per line.
///
/// When a script has errors, its warnings are reported here too (as errors), so that the user
/// who has to edit the script anyway sees every problem at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectiveErrors(pub Vec<DirectiveError>);

/// A line that looks like a directive but is not read as one. Displays as
/// `job.sh:9: warning: `#DW stage_out ...`: not a directive: ...`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectiveWarning {
    pub file: String,
    pub line: usize,
    pub text: String,
    pub message: String,
}

/// One `SRC DST` line of a `type=list` stage list file, with DST resolved against the
/// directive's `destination`. Paths keep their `$DW_*` variable unexpanded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageEntry {
    /// Line in the list file.
    pub line: usize,
    pub source: String,
    pub destination: String,
}

/// Why a path could not be expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpandError {
    #[error("`{path}` starts with ${variable}, which is not set for this job")]
    Unset { variable: String, path: String },
    #[error("`{path}`: {message}")]
    Invalid { path: String, message: String },
}

// ---------------------------------------------------------------------------------------------
// Display and helpers of the public types
// ---------------------------------------------------------------------------------------------

impl fmt::Display for DirectiveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: `{}`: {}",
            self.file, self.line, self.text, self.message
        )
    }
}

impl std::error::Error for DirectiveError {}

impl fmt::Display for DirectiveErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for DirectiveErrors {}

impl fmt::Display for DirectiveWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: warning: `{}`: {}",
            self.file, self.line, self.text, self.message
        )
    }
}

impl InstanceType {
    /// The word used in directives.
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceType::Scratch => "scratch",
            InstanceType::Cache => "cache",
        }
    }
}

impl AccessMode {
    /// The word used in directives.
    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::Striped => "striped",
            AccessMode::Private => "private",
            AccessMode::Ldbalance => "ldbalance",
        }
    }
}

impl StageKind {
    /// The word used in directives.
    pub fn as_str(self) -> &'static str {
        match self {
            StageKind::File => "file",
            StageKind::Directory => "directory",
            StageKind::List => "list",
            StageKind::Any => "any",
        }
    }
}

impl StageDirection {
    /// The directive word: `stage_in` or `stage_out`.
    pub fn as_str(self) -> &'static str {
        match self {
            StageDirection::In => "stage_in",
            StageDirection::Out => "stage_out",
        }
    }
}

macro_rules! display_as_str {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )*};
}
display_as_str!(
    InstanceType,
    AccessMode,
    StageKind,
    StageDirection,
    RabbitFs
);

impl DwVariable {
    /// The environment variable's name, e.g. `DW_JOB_STRIPED`, `DW_PERSISTENT_STRIPED_proj`.
    pub fn env_name(&self) -> String {
        match self {
            DwVariable::JobStriped => "DW_JOB_STRIPED".to_string(),
            DwVariable::JobPrivate => "DW_JOB_PRIVATE".to_string(),
            DwVariable::JobLdbal => "DW_JOB_LDBAL".to_string(),
            DwVariable::JobStripedCache => "DW_JOB_STRIPED_CACHE".to_string(),
            DwVariable::PersistentStriped(name) => format!("DW_PERSISTENT_STRIPED_{name}"),
            DwVariable::JobNamed(suffix) => format!("DW_JOB_{suffix}"),
        }
    }

    /// The variable of a job instance of access mode `mode`.
    pub fn of_job(mode: AccessMode) -> DwVariable {
        match mode {
            AccessMode::Striped => DwVariable::JobStriped,
            AccessMode::Private => DwVariable::JobPrivate,
            AccessMode::Ldbalance => DwVariable::JobLdbal,
        }
    }

    /// The variable a path on an instance starts with; `None` for a path on the PFS or a path
    /// the parser would reject.
    pub fn of_path(path: &str) -> Option<DwVariable> {
        match classify_path(path) {
            Ok(PathSide::Instance { var, .. }) => Some(var),
            _ => None,
        }
    }
}

impl fmt::Display for DwVariable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "${}", self.env_name())
    }
}

impl StageDirective {
    /// A copy with `source` and `destination` expanded (see [`expand_dw_path`]).
    pub fn expanded(&self, vars: &HashMap<String, String>) -> Result<StageDirective, ExpandError> {
        Ok(StageDirective {
            source: expand_dw_path(&self.source, vars)?,
            destination: expand_dw_path(&self.destination, vars)?,
            ..self.clone()
        })
    }

    /// For `type=file` (and a `copy_in`/`copy_out` whose source is a file), the path the file
    /// is copied to (unexpanded): `destination` itself, or `destination/<file name of source>`
    /// when `destination` ends with `/` or is a bare `$DW_…` variable
    /// (`destination=$DW_JOB_STRIPED/` in Bhimji §2.3). `None` for the other types.
    pub fn file_target(&self) -> Option<String> {
        if !matches!(self.kind, StageKind::File | StageKind::Any) {
            return None;
        }
        let bare_variable = matches!(
            classify_path(&self.destination),
            Ok(PathSide::Instance { ref rest, .. }) if rest.is_empty()
        );
        if self.destination.ends_with('/') || bare_variable {
            let name = self.source.rsplit('/').next().unwrap_or(&self.source);
            Some(format!("{}/{name}", self.destination.trim_end_matches('/')))
        } else {
            Some(self.destination.clone())
        }
    }
}

impl StageEntry {
    /// A copy with `source` and `destination` expanded (see [`expand_dw_path`]).
    pub fn expanded(&self, vars: &HashMap<String, String>) -> Result<StageEntry, ExpandError> {
        Ok(StageEntry {
            line: self.line,
            source: expand_dw_path(&self.source, vars)?,
            destination: expand_dw_path(&self.destination, vars)?,
        })
    }
}

/// Replaces the `$DW_…` (or `${DW_…}`) variable a path starts with by its value in `vars`
/// (keys are variable names without `$`, e.g. `DW_JOB_STRIPED`). A path on the PFS is returned
/// unchanged. Only the leading variable is expanded, as only it is allowed in directives.
pub fn expand_dw_path(path: &str, vars: &HashMap<String, String>) -> Result<String, ExpandError> {
    match classify_path(path) {
        Ok(PathSide::Pfs) => Ok(path.to_string()),
        Ok(PathSide::Instance { var, rest }) => {
            let name = var.env_name();
            let value = vars.get(&name).ok_or_else(|| ExpandError::Unset {
                variable: name.clone(),
                path: path.to_string(),
            })?;
            if rest.is_empty() {
                Ok(value.clone())
            } else {
                Ok(format!("{}{rest}", value.trim_end_matches('/')))
            }
        }
        Err(message) => Err(ExpandError::Invalid {
            path: path.to_string(),
            message,
        }),
    }
}

/// Checks a persistent-instance name: a letter, then letters, digits or `_`, at most
/// [`MAX_NAME_LEN`] characters. The name becomes part of the variable
/// `$DW_PERSISTENT_STRIPED_<name>`, hence the shell-variable alphabet; Slurm also refuses a
/// leading digit (numeric names are job ids). `Err` says what is wrong.
pub fn check_persistent_name(name: &str) -> Result<(), String> {
    let rule = format!(
        "a persistent instance name is a letter followed by letters, digits or `_`, at most \
         {MAX_NAME_LEN} characters (it becomes part of $DW_PERSISTENT_STRIPED_<name>)"
    );
    let mut chars = name.chars();
    match chars.next() {
        None => Err(format!("empty name: {rule}")),
        Some(c) if !c.is_ascii_alphabetic() => {
            Err(format!("`{name}` does not start with a letter: {rule}"))
        }
        Some(_) => {
            if let Some(bad) = name
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || *c == '_'))
            {
                Err(format!("`{name}` contains `{bad}`: {rule}"))
            } else if name.len() > MAX_NAME_LEN {
                Err(format!(
                    "`{name}` is {} characters long: {rule}",
                    name.len()
                ))
            } else {
                Ok(())
            }
        }
    }
}

/// Checks a pool name: letters, digits, `_`, `-` or `.`, starting with a letter or digit, at
/// most [`MAX_NAME_LEN`] characters. `Err` says what is wrong.
pub fn check_pool_name(name: &str) -> Result<(), String> {
    let rule = format!(
        "a pool name is letters, digits, `_`, `-` or `.`, starting with a letter or digit, at \
         most {MAX_NAME_LEN} characters"
    );
    match name.chars().next() {
        None => Err(format!("empty pool name: {rule}")),
        Some(c) if !c.is_ascii_alphanumeric() => Err(format!(
            "`{name}` does not start with a letter or digit: {rule}"
        )),
        Some(_) => {
            if let Some(bad) = name
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
            {
                Err(format!("`{name}` contains `{bad}`: {rule}"))
            } else if name.len() > MAX_NAME_LEN {
                Err(format!(
                    "`{name}` is {} characters long: {rule}",
                    name.len()
                ))
            } else {
                Ok(())
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing a script
// ---------------------------------------------------------------------------------------------

/// Parses the directives of the job script `text`; `file` is the name errors are reported with.
/// Returns every error of the script, not just the first.
pub fn parse_script(file: &str, text: &str) -> Result<Directives, DirectiveErrors> {
    let mut parser = Parser::new(file);
    let raws = scan(text, &mut parser.sink);
    for raw in &raws {
        parser.directive(raw);
    }
    parser.check_across_directives();
    parser.finish()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Prefix {
    Dw,
    Bb,
    Surge,
}

impl Prefix {
    const ALL: [Prefix; 3] = [Prefix::Dw, Prefix::Bb, Prefix::Surge];

    fn as_str(self) -> &'static str {
        match self {
            Prefix::Dw => "#DW",
            Prefix::Bb => "#BB",
            Prefix::Surge => "#SURGE",
        }
    }
}

/// The directive words DataWarp, Rabbit and Slurm know, for recognising near-misses.
const KNOWN_WORDS: [&str; 10] = [
    "jobdw",
    "persistentdw",
    "stage_in",
    "stage_out",
    "create_persistent",
    "destroy_persistent",
    "swap",
    "copy_in",
    "copy_out",
    "container",
];

/// Directive words Surge supports, for "did you mean" and "expected one of".
const SUPPORTED_WORDS: [&str; 8] = [
    "jobdw",
    "persistentdw",
    "stage_in",
    "stage_out",
    "copy_in",
    "copy_out",
    "create_persistent",
    "destroy_persistent",
];

/// `line` starts, at column 0, with a prefix followed by whitespace or the end of the line.
fn split_prefix(line: &str) -> Option<(Prefix, &str)> {
    Prefix::ALL.into_iter().find_map(|p| {
        let rest = line.strip_prefix(p.as_str())?;
        (rest.is_empty() || rest.starts_with(char::is_whitespace)).then_some((p, rest))
    })
}

/// One physical line of a directive (continuations give several), prefix removed.
struct Segment {
    line: usize,
    text: String,
}

/// A directive as found in the script, before its words are read.
struct RawDirective {
    prefix: Prefix,
    line: usize,
    segments: Vec<Segment>,
    /// A continuation went wrong (already reported): read it only to know what it was.
    broken: bool,
}

impl RawDirective {
    /// The directive as one line, for messages.
    fn text(&self) -> String {
        let mut text = self.prefix.as_str().to_string();
        for s in &self.segments {
            let t = s.text.trim();
            if !t.is_empty() {
                text.push(' ');
                text.push_str(t);
            }
        }
        text
    }

    fn last_line(&self) -> usize {
        self.segments.last().map_or(self.line, |s| s.line)
    }
}

/// Collects errors and warnings with the file name attached.
struct Sink<'a> {
    file: &'a str,
    errors: Vec<DirectiveError>,
    warnings: Vec<DirectiveWarning>,
}

impl<'a> Sink<'a> {
    fn new(file: &'a str) -> Self {
        Sink {
            file,
            errors: Vec::new(),
            warnings: Vec::new(),
        }
    }

    fn error(&mut self, line: usize, text: impl Into<String>, message: impl Into<String>) {
        self.errors.push(DirectiveError {
            file: self.file.to_string(),
            line,
            text: text.into(),
            message: message.into(),
        });
    }

    fn warn(&mut self, line: usize, text: impl Into<String>, message: impl Into<String>) {
        self.warnings.push(DirectiveWarning {
            file: self.file.to_string(),
            line,
            text: text.into(),
            message: message.into(),
        });
    }
}

/// Finds the directives in the header comment block, joining continued lines, and warns about
/// directive-like lines that will not be read.
fn scan(text: &str, sink: &mut Sink) -> Vec<RawDirective> {
    let mut out = Vec::new();
    let mut pending: Option<RawDirective> = None;
    // The first line that is neither blank nor a comment, once seen: the header ends there.
    let mut header_end: Option<(usize, String)> = None;

    for (index, raw_line) in text.split('\n').enumerate() {
        let n = index + 1;
        let line = raw_line.strip_suffix('\r').unwrap_or(raw_line);
        let trimmed = line.trim();

        if let Some((end, ref end_text)) = header_end {
            if let Some((prefix, _)) = split_prefix(line.trim_start()) {
                sink.warn(
                    n,
                    trimmed,
                    format!(
                        "not a directive, ignored: directives are read only from the comment \
                         block at the top of the script, which ends at line {end} (`{end_text}`); \
                         move this {} line above it",
                        prefix.as_str()
                    ),
                );
            }
            continue;
        }

        if trimmed.is_empty() {
            if let Some(mut d) = pending.take() {
                dangling(sink, &d, &format!("line {n} is blank"));
                d.broken = true;
                out.push(d);
            }
            continue;
        }

        if !trimmed.starts_with('#') {
            if let Some(mut d) = pending.take() {
                dangling(
                    sink,
                    &d,
                    &format!(
                        "line {n} (`{trimmed}`) is not a comment, so the directives end there \
                         (as in Slurm); start the continuation line with `{} `",
                        d.prefix.as_str()
                    ),
                );
                d.broken = true;
                out.push(d);
            }
            header_end = Some((n, trimmed.to_string()));
            continue;
        }

        match split_prefix(line) {
            Some((prefix, rest)) => {
                let (body, continues) = match rest.trim_end().strip_suffix('\\') {
                    Some(body) => (body, true),
                    None => (rest, false),
                };
                let segment = Segment {
                    line: n,
                    text: body.to_string(),
                };
                let directive = match pending.take() {
                    Some(mut d) if d.prefix == prefix => {
                        d.segments.push(segment);
                        d
                    }
                    other => {
                        if let Some(mut d) = other {
                            dangling(
                                sink,
                                &d,
                                &format!(
                                    "line {n} starts with `{}`; a continued directive keeps its \
                                     prefix",
                                    prefix.as_str()
                                ),
                            );
                            d.broken = true;
                            out.push(d);
                        }
                        RawDirective {
                            prefix,
                            line: n,
                            segments: vec![segment],
                            broken: false,
                        }
                    }
                };
                if continues {
                    pending = Some(directive);
                } else {
                    out.push(directive);
                }
            }
            None => {
                if let Some(mut d) = pending.take() {
                    dangling(
                        sink,
                        &d,
                        &format!("line {n} is a comment, not a `{}` line", d.prefix.as_str()),
                    );
                    d.broken = true;
                    out.push(d);
                }
                if let Some(message) = near_miss(line) {
                    sink.warn(n, trimmed, message);
                }
            }
        }
    }
    if let Some(mut d) = pending.take() {
        dangling(sink, &d, "the script ends there");
        d.broken = true;
        out.push(d);
    }
    out
}

fn dangling(sink: &mut Sink, d: &RawDirective, what_follows: &str) {
    sink.error(
        d.last_line(),
        d.text(),
        format!(
            "the directive ends with `\\`, which continues it on the next line, but {what_follows}"
        ),
    );
}

/// A header comment that looks like a directive but is not one: indented, or with the prefix
/// mis-spelt (`#dw`, `# DW`). `##DW` is the usual way to switch a directive off: no warning.
fn near_miss(line: &str) -> Option<String> {
    let t = line.trim_start();
    if t.len() != line.len() && split_prefix(t).is_some() {
        return Some(
            "not a directive, ignored: it is indented, and directives must start at the \
             beginning of the line (like #SBATCH)"
                .to_string(),
        );
    }
    let body = t.strip_prefix('#')?.trim_start();
    let mut words = body.split_whitespace();
    let prefix = words.next()?;
    let word = words.next()?;
    let intended = Prefix::ALL
        .into_iter()
        .find(|p| p.as_str()[1..].eq_ignore_ascii_case(prefix))?;
    KNOWN_WORDS.contains(&word).then(|| {
        format!(
            "not a directive, ignored: write the prefix exactly `{}` (upper case, no space after \
             `#`) for it to count",
            intended.as_str()
        )
    })
}

// ---------------------------------------------------------------------------------------------
// Tokens
// ---------------------------------------------------------------------------------------------

/// One word of a directive: `key=value` or a bare word (`hurry`, the directive name).
#[derive(Clone, Debug)]
struct Token {
    line: usize,
    /// As written, quotes included: what error messages show.
    raw: String,
    key: Option<String>,
    /// The value, quotes removed (for a bare word, the word).
    value: String,
}

struct TokenError {
    line: usize,
    raw: String,
    /// The key, when it could be read, so that "missing key" is not reported on top.
    key: Option<String>,
    message: String,
    /// The error swallowed the rest of the line (an open quote, a comment): keys that would
    /// have followed are not "missing".
    rest_of_line: bool,
}

/// Splits one line of a directive into words at whitespace. A value may be quoted as a whole
/// (`source="/a b"` or `source='/a b'`) to hold spaces; quotes anywhere else are an error, as is
/// a quote left open (a quoted value cannot span lines).
fn tokenize(line: usize, s: &str) -> Vec<Result<Token, TokenError>> {
    let chars: Vec<(usize, char)> = s.char_indices().collect();
    let byte_at = |i: usize| chars.get(i).map_or(s.len(), |&(b, _)| b);
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i].1.is_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        if chars[i].1 == '#' {
            out.push(Err(TokenError {
                line,
                raw: s[byte_at(start)..].trim_end().to_string(),
                key: None,
                message: "a directive cannot end with a comment: put the comment on a line of \
                          its own"
                    .to_string(),
                rest_of_line: true,
            }));
            break;
        }
        let mut eq: Option<usize> = None;
        let mut quoted = false;
        let mut problem: Option<String> = None;
        let mut rest_of_line = false;
        let mut j = i;
        while j < chars.len() && !chars[j].1.is_whitespace() {
            let c = chars[j].1;
            if c == '=' && eq.is_none() {
                eq = Some(j);
            } else if c == '"' || c == '\'' {
                if eq.is_some_and(|e| e + 1 == j) {
                    match (j + 1..chars.len()).find(|&k| chars[k].1 == c) {
                        None => {
                            problem = Some(format!(
                                "the quote {c} is not closed (a quoted value must end on the \
                                 same line)"
                            ));
                            rest_of_line = true;
                            j = chars.len();
                        }
                        Some(close) => {
                            quoted = true;
                            j = close + 1;
                            if j < chars.len() && !chars[j].1.is_whitespace() {
                                problem = Some(
                                    "text after the closing quote: a quote must enclose the \
                                     whole value"
                                        .to_string(),
                                );
                                while j < chars.len() && !chars[j].1.is_whitespace() {
                                    j += 1;
                                }
                            }
                        }
                    }
                    break;
                }
                problem.get_or_insert_with(|| {
                    "a quote may only enclose a whole value, as in \
                     source=\"/path/with spaces\""
                        .to_string()
                });
            }
            j += 1;
        }
        let raw = s[byte_at(start)..byte_at(j)].to_string();
        let key = eq.map(|e| s[byte_at(start)..byte_at(e)].to_string());
        i = j;

        let token = match eq {
            None => Token {
                line,
                raw: raw.clone(),
                key: None,
                value: raw.clone(),
            },
            Some(e) => {
                let value = &s[byte_at(e + 1)..byte_at(j)];
                let value = if quoted && problem.is_none() {
                    &value[1..value.len() - 1]
                } else {
                    value
                };
                Token {
                    line,
                    raw: raw.clone(),
                    key: key.clone(),
                    value: value.to_string(),
                }
            }
        };
        if problem.is_none() {
            if token.key.as_deref() == Some("") {
                problem = Some("`=` with no key before it: expected key=value".to_string());
            } else if token.key.is_some() && token.value.is_empty() {
                problem = Some(format!(
                    "`{}=` has an empty value: write the value right after `=`",
                    token.key.as_deref().unwrap_or_default()
                ));
            }
        }
        out.push(match problem {
            None => Ok(token),
            Some(message) => Err(TokenError {
                line,
                raw,
                key,
                message,
                rest_of_line,
            }),
        });
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Directive grammar
// ---------------------------------------------------------------------------------------------

/// The keys a directive takes.
struct Spec {
    name: &'static str,
    required: &'static [&'static str],
    optional: &'static [&'static str],
    /// Bare words allowed after the directive name.
    flags: &'static [&'static str],
    example: &'static str,
}

impl Spec {
    fn keys(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.required.iter().chain(self.optional).copied()
    }

    /// "type, access_mode, capacity and pool", for messages.
    fn key_list(&self) -> String {
        let keys: Vec<&str> = self.keys().chain(self.flags.iter().copied()).collect();
        join_and(&keys)
    }
}

const JOBDW: Spec = Spec {
    name: "jobdw",
    required: &["type", "access_mode", "capacity"],
    optional: &[
        "pool",
        "pfs",
        "optimization",
        "fsync",
        "dirty_high",
        "passthrough",
        "bandwidth",
        "iops",
        "metadata",
    ],
    flags: &[],
    example: "#DW jobdw type=scratch access_mode=striped capacity=100GiB",
};

const SURGE_JOBDW: Spec = Spec {
    name: "jobdw",
    required: &[],
    optional: &[
        "type",
        "access_mode",
        "capacity",
        "pool",
        "bandwidth",
        "iops",
        "metadata",
    ],
    flags: &[],
    example: "#SURGE jobdw bandwidth=4GiB/s metadata=50k/s capacity=100GiB",
};

const RABBIT_JOBDW: Spec = Spec {
    name: "jobdw",
    required: &["type", "capacity", "name"],
    optional: &["pool", "profile", "requires"],
    flags: &[],
    example: "#DW jobdw type=xfs capacity=10GiB name=scratch",
};

const COPY_IN: Spec = Spec {
    name: "copy_in",
    required: &["source", "destination"],
    optional: &["profile"],
    flags: &[],
    example: "#DW copy_in source=/pfs/input destination=$DW_JOB_scratch/input",
};

const COPY_OUT: Spec = Spec {
    name: "copy_out",
    required: &["source", "destination"],
    optional: &["profile"],
    flags: &[],
    example: "#DW copy_out source=$DW_JOB_scratch/output destination=/pfs/output",
};

const PERSISTENTDW: Spec = Spec {
    name: "persistentdw",
    required: &["name"],
    optional: &[],
    flags: &[],
    example: "#DW persistentdw name=myproject",
};

const STAGE_IN: Spec = Spec {
    name: "stage_in",
    required: &["type", "source", "destination"],
    optional: &[],
    flags: &[],
    example: "#DW stage_in type=directory source=/pfs/input destination=$DW_JOB_STRIPED/input",
};

const STAGE_OUT: Spec = Spec {
    name: "stage_out",
    required: &["type", "source", "destination"],
    optional: &[],
    flags: &[],
    example: "#DW stage_out type=directory source=$DW_JOB_STRIPED/output destination=/pfs/output",
};

const CREATE_PERSISTENT: Spec = Spec {
    name: "create_persistent",
    required: &["name", "capacity", "access_mode", "type"],
    optional: &[
        "pool",
        "pfs",
        "optimization",
        "fsync",
        "dirty_high",
        "passthrough",
    ],
    flags: &[],
    example: "#BB create_persistent name=myproject capacity=1TiB access_mode=striped type=scratch",
};

const DESTROY_PERSISTENT: Spec = Spec {
    name: "destroy_persistent",
    required: &["name"],
    optional: &[],
    flags: &["hurry"],
    example: "#BB destroy_persistent name=myproject",
};

/// DataWarp options that exist but Surge does not take, with the reason.
fn unsupported_key(key: &str) -> Option<&'static str> {
    match key {
        "modified_threshold"
        | "read_ahead"
        | "sync_on_close"
        | "sync_to_pfs"
        | "write_window_length"
        | "write_window_multiplier" => Some(
            "is a DataWarp cache-mode option that Surge does not take (its cache drains every \
             change in the background, in order; see docs/DIRECTIVES.md, type=cache)",
        ),
        "max_mds" => Some("is a DataWarp option that Surge does not support yet"),
        _ => None,
    }
}

/// One directive being read: its words and what went wrong while splitting them.
struct Ctx<'r> {
    raw: &'r RawDirective,
    text: String,
    args: Vec<Token>,
    /// Keys whose token could not be split: they are not "missing".
    failed_keys: Vec<String>,
    /// A token error swallowed the rest of a line: no key is reported missing.
    incomplete: bool,
}

/// A path on an instance used by a stage directive, checked against the attached instances
/// once the whole script is read (directives may come in any order).
struct StageRef {
    var: DwVariable,
    line: usize,
    text: String,
}

struct Parser<'a> {
    sink: Sink<'a>,
    out: Directives,
    /// Lines of every `jobdw`, read or not.
    jobdw_lines: Vec<usize>,
    /// The first `jobdw` had errors: its access mode is unknown, so checks that need it stay
    /// quiet rather than add consequences of an error already reported.
    jobdw_unread: bool,
    /// Names of `persistentdw` as written, with their line, valid or not.
    attached: Vec<(String, usize)>,
    /// A `persistentdw` whose name could not be read.
    attach_unread: bool,
    created: Vec<(String, usize)>,
    destroyed: Vec<(String, usize)>,
    stage_refs: Vec<StageRef>,
    /// Names of Rabbit allocations as written, with their line, valid or not.
    allocation_names: Vec<(String, usize)>,
    /// A Rabbit `jobdw` whose name could not be read.
    allocation_unread: bool,
}

impl<'a> Parser<'a> {
    fn new(file: &'a str) -> Self {
        Parser {
            sink: Sink::new(file),
            out: Directives::default(),
            jobdw_lines: Vec::new(),
            jobdw_unread: false,
            attached: Vec::new(),
            attach_unread: false,
            created: Vec::new(),
            destroyed: Vec::new(),
            stage_refs: Vec::new(),
            allocation_names: Vec::new(),
            allocation_unread: false,
        }
    }

    fn finish(mut self) -> Result<Directives, DirectiveErrors> {
        self.sink.warnings.sort_by_key(|w| w.line);
        if self.sink.errors.is_empty() {
            self.out.warnings = self.sink.warnings;
            return Ok(self.out);
        }
        let mut errors = self.sink.errors;
        errors.extend(self.sink.warnings.into_iter().map(|w| DirectiveError {
            file: w.file,
            line: w.line,
            text: w.text,
            message: w.message,
        }));
        errors.sort_by_key(|e| e.line);
        Err(DirectiveErrors(errors))
    }

    fn directive(&mut self, raw: &RawDirective) {
        let mut words = Vec::new();
        let mut failed_keys = Vec::new();
        let mut first_failed = false;
        let mut incomplete = false;
        for segment in &raw.segments {
            for token in tokenize(segment.line, &segment.text) {
                match token {
                    Ok(t) => words.push(t),
                    Err(e) => {
                        if words.is_empty() && failed_keys.is_empty() {
                            first_failed = true;
                        }
                        self.sink.error(e.line, e.raw, e.message);
                        failed_keys.push(e.key.unwrap_or_default());
                        incomplete |= e.rest_of_line;
                    }
                }
            }
        }
        let text = raw.text();
        let prefix = raw.prefix.as_str();
        if first_failed {
            return;
        }
        if words.is_empty() {
            if failed_keys.is_empty() {
                self.sink.error(
                    raw.line,
                    text,
                    format!(
                        "empty directive: expected a directive name after `{prefix}`, one of {}",
                        join_or(&SUPPORTED_WORDS)
                    ),
                );
            }
            return;
        }
        let name = words.remove(0);
        if name.key.is_some() {
            self.sink.error(
                name.line,
                name.raw,
                format!(
                    "expected a directive name after `{prefix}` (one of {}), found a key=value",
                    join_or(&SUPPORTED_WORDS)
                ),
            );
            return;
        }
        let ctx = Ctx {
            raw,
            text,
            args: words,
            failed_keys,
            incomplete,
        };
        match (raw.prefix, name.value.as_str()) {
            (Prefix::Dw, "jobdw") => self.jobdw(&ctx),
            (Prefix::Dw, "persistentdw") => self.persistentdw(&ctx),
            (Prefix::Dw, "stage_in") => self.stage(&ctx, StageDirection::In),
            (Prefix::Dw, "stage_out") => self.stage(&ctx, StageDirection::Out),
            (Prefix::Dw, "copy_in") => self.copy(&ctx, StageDirection::In),
            (Prefix::Dw, "copy_out") => self.copy(&ctx, StageDirection::Out),
            (Prefix::Dw, "container") => self.sink.error(
                raw.line,
                ctx.text,
                "`#DW container` (Rabbit's user containers, run on the Rabbit nodes) is not \
                 something Surge does: its BB servers run no user code; run the container on the \
                 compute nodes, with the job's $DW_JOB_<name> paths",
            ),
            // `#BB` is the original form; Slurm 18.08 and CLE6.0UP06 accept `#DW` too.
            (Prefix::Dw | Prefix::Bb, "create_persistent") => self.create_persistent(&ctx),
            (Prefix::Dw | Prefix::Bb, "destroy_persistent") => self.destroy_persistent(&ctx),
            (Prefix::Dw, "swap") => self.sink.error(
                raw.line,
                ctx.text,
                "`#DW swap` (swap space for compute nodes on the burst buffer) is a DataWarp \
                 directive that Surge does not support",
            ),
            (
                Prefix::Bb,
                word @ ("jobdw" | "persistentdw" | "stage_in" | "stage_out" | "swap" | "copy_in"
                | "copy_out" | "container"),
            ) => self.sink.error(
                raw.line,
                ctx.text,
                format!("`{word}` is a `#DW` directive: write `#DW {word} ...`"),
            ),
            (Prefix::Surge, "jobdw") => self.jobdw(&ctx),
            (Prefix::Surge, word) => self.sink.error(
                raw.line,
                ctx.text,
                format!(
                    "unknown directive `#SURGE {word}`; Surge's own directives are: jobdw \
                     (performance targets, e.g. `{}`)",
                    SURGE_JOBDW.example
                ),
            ),
            (prefix, word) => {
                let expected: &[&str] = match prefix {
                    Prefix::Bb => &["create_persistent", "destroy_persistent"],
                    _ => &SUPPORTED_WORDS,
                };
                let hint = suggest(word, expected)
                    .map(|s| format!(" (did you mean `{s}`?)"))
                    .unwrap_or_default();
                self.sink.error(
                    name.line,
                    name.raw,
                    format!(
                        "unknown directive `{} {word}`{hint}; expected one of {}",
                        prefix.as_str(),
                        join_or(expected)
                    ),
                );
            }
        }
    }

    /// Sorts a directive's words into its keys and flags, reporting unknown, repeated and
    /// missing ones.
    fn args(&mut self, ctx: &Ctx, spec: &Spec) -> HashMap<&'static str, Token> {
        let mut found: HashMap<&'static str, Token> = HashMap::new();
        // Keys written without a value: already reported, so not "missing" as well.
        let mut mentioned: Vec<&'static str> = Vec::new();
        for token in &ctx.args {
            match &token.key {
                None => {
                    if let Some(flag) = spec.flags.iter().copied().find(|f| *f == token.value) {
                        self.insert_once(&mut found, flag, token);
                    } else if let Some(key) = spec.keys().find(|k| *k == token.value) {
                        mentioned.push(key);
                        self.sink.error(
                            token.line,
                            &token.raw,
                            format!("`{key}` needs a value, as in `{key}=...`: {}", spec.example),
                        );
                    } else {
                        self.sink.error(
                            token.line,
                            &token.raw,
                            format!(
                                "expected key=value; {} takes {}",
                                spec.name,
                                spec.key_list()
                            ),
                        );
                    }
                }
                Some(key) => {
                    if let Some(known) = spec.keys().find(|k| k == key) {
                        self.insert_once(&mut found, known, token);
                    } else if spec.flags.contains(&key.as_str()) {
                        self.sink.error(
                            token.line,
                            &token.raw,
                            format!("`{key}` takes no value: write just `{key}`"),
                        );
                    } else {
                        let message = match unsupported_key(key) {
                            Some(why) => format!("`{key}` {why}"),
                            None => {
                                let keys: Vec<&str> = spec.keys().collect();
                                let hint = if key == "access" {
                                    " (did you mean `access_mode`?)".to_string()
                                } else {
                                    suggest(key, &keys)
                                        .map(|s| format!(" (did you mean `{s}`?)"))
                                        .unwrap_or_default()
                                };
                                format!(
                                    "unknown key `{key}`{hint}; {} takes {}",
                                    spec.name,
                                    spec.key_list()
                                )
                            }
                        };
                        self.sink.error(token.line, &token.raw, message);
                    }
                }
            }
        }
        if !ctx.raw.broken && !ctx.incomplete {
            let missing: Vec<String> = spec
                .required
                .iter()
                .filter(|k| {
                    !found.contains_key(*k)
                        && !mentioned.contains(k)
                        && !ctx.failed_keys.iter().any(|f| f == *k)
                })
                .map(|k| format!("{k}="))
                .collect();
            if !missing.is_empty() {
                let missing: Vec<&str> = missing.iter().map(String::as_str).collect();
                let required: Vec<&str> = spec.required.to_vec();
                self.sink.error(
                    ctx.raw.line,
                    &ctx.text,
                    format!(
                        "missing {}: {} needs {}, as in `{}`",
                        join_and(&missing),
                        spec.name,
                        join_and(&required),
                        spec.example
                    ),
                );
            }
        }
        found
    }

    fn insert_once(
        &mut self,
        found: &mut HashMap<&'static str, Token>,
        key: &'static str,
        token: &Token,
    ) {
        match found.get(key) {
            Some(first) => self.sink.error(
                token.line,
                &token.raw,
                format!(
                    "`{key}` is given twice (first on line {}: `{}`); give each key once",
                    first.line, first.raw
                ),
            ),
            None => {
                found.insert(key, token.clone());
            }
        }
    }

    /// Reads a value with `parse`, reporting its error against the token.
    fn value<T>(
        &mut self,
        token: Option<&Token>,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Option<T> {
        let token = token?;
        match parse(&token.value) {
            Ok(v) => Some(v),
            Err(message) => {
                self.sink.error(token.line, &token.raw, message);
                None
            }
        }
    }

    /// The `type=cache` keys of a `jobdw` or `create_persistent` line (`pfs=` required with
    /// `type=cache`, none of them with `type=scratch`).
    fn cache_keys(
        &mut self,
        ctx: &Ctx,
        args: &HashMap<&'static str, Token>,
        kind: Option<InstanceType>,
        directive: &str,
    ) -> CacheSpec {
        let name = if directive == "create_persistent" {
            " name=myrun"
        } else {
            ""
        };
        let pfs = self.value(args.get("pfs"), parse_cache_pfs);
        let optimization = self.value(args.get("optimization"), |v| match v {
            "bandwidth" | "latency" | "interactive" => Ok(v.to_string()),
            _ => Err(format!(
                "unknown optimization `{v}`{}; expected bandwidth, latency or interactive",
                hint(v, &["bandwidth", "latency", "interactive"])
            )),
        });
        let fsync_pfs = self.value(args.get("fsync"), |v| match v {
            "pfs" => Ok(true),
            "tier" => Ok(false),
            _ => Err(format!(
                "unknown fsync `{v}`{}; expected pfs (fsync returns once the file is on the PFS) \
                 or tier (once it is on the fast tier, the default)",
                hint(v, &["pfs", "tier"])
            )),
        });
        let dirty_high = self.value(args.get("dirty_high"), parse_dirty_high);
        let passthrough = self.value(args.get("passthrough"), |v| match v {
            "on" => Ok(true),
            "off" => Ok(false),
            _ => Err(format!(
                "unknown passthrough `{v}`{}; expected on (kernel passthrough for files on the \
                 mount's host, the default: the tier's capacity may be exceeded until they \
                 close) or off (every write through the mount, which can fall back to the PFS \
                 mid-write)",
                hint(v, &["on", "off"])
            )),
        });
        match (
            kind,
            args.get("pfs"),
            args.get("optimization")
                .or(args.get("fsync"))
                .or(args.get("dirty_high"))
                .or(args.get("passthrough")),
        ) {
            (Some(InstanceType::Cache), None, _) if !ctx.raw.broken && !ctx.incomplete => {
                self.sink.error(
                    ctx.raw.line,
                    &ctx.text,
                    format!(
                        "type=cache needs pfs=DIR, the PFS directory the cache mirrors, as in \
                         `#DW {directive}{name} type=cache access_mode=striped capacity=1TiB \
                         pfs=/lus/scratch/run`"
                    ),
                )
            }
            (Some(InstanceType::Scratch), Some(t), _)
            | (Some(InstanceType::Scratch), _, Some(t)) => self.sink.error(
                t.line,
                &t.raw,
                format!(
                    "{}= is for type=cache instances; this one is type=scratch",
                    t.key.as_deref().unwrap_or("pfs")
                ),
            ),
            _ => {}
        }
        CacheSpec {
            pfs,
            optimization,
            fsync_pfs: fsync_pfs.unwrap_or(false),
            dirty_high,
            passthrough: passthrough.unwrap_or(kind == Some(InstanceType::Cache)),
        }
    }

    fn jobdw(&mut self, ctx: &Ctx) {
        if ctx.raw.prefix == Prefix::Dw && is_rabbit_jobdw(ctx) {
            self.rabbit_jobdw(ctx);
            return;
        }
        let errors_before = self.sink.errors.len();
        let first = self.jobdw_lines.first().copied();
        self.jobdw_lines.push(ctx.raw.line);
        if let Some(first) = first {
            self.sink.error(
                ctx.raw.line,
                &ctx.text,
                format!(
                    "a job has at most one `#DW jobdw` or `#SURGE jobdw` (the first is on line \
                     {first}); to use more storage, attach persistent instances with \
                     `#DW persistentdw`"
                ),
            );
        }
        // `#SURGE jobdw`: performance targets; type and access mode default to DataWarp's
        // usual scratch/striped, capacity to what the targets need.
        let surge = ctx.raw.prefix == Prefix::Surge;
        let args = self.args(ctx, if surge { &SURGE_JOBDW } else { &JOBDW });
        let kind = match args.get("type") {
            None if surge => Some(InstanceType::Scratch),
            t => self.value(t, parse_instance_type),
        };
        let access_mode = match args.get("access_mode") {
            None if surge => Some(AccessMode::Striped),
            t => self.value(t, parse_access_mode),
        };
        let capacity = match args.get("capacity") {
            None if surge => Some(0),
            t => self.value(t, parse_capacity),
        };
        let pool = self.value(args.get("pool"), parse_pool);
        let cache = self.cache_keys(ctx, &args, kind, "jobdw");
        if let (Some(InstanceType::Cache), Some(m)) = (kind, access_mode) {
            if m != AccessMode::Striped {
                let t = args.get("access_mode");
                self.sink.error(
                    t.map_or(ctx.raw.line, |t| t.line),
                    t.map_or(ctx.text.clone(), |t| t.raw.clone()),
                    format!(
                        "a type=cache instance is access_mode=striped in Surge so far \
                         ($DW_JOB_STRIPED_CACHE); access_mode={m} caches are not built"
                    ),
                );
            }
        }
        // Targets on a `#DW jobdw` line too (Surge extension keys, as `pfs=` is): a batch
        // system that sees only `#DW` lines (Slurm's `Directive=DW`) passes them on.
        let any_target = ["bandwidth", "iops", "metadata"]
            .iter()
            .any(|k| args.contains_key(k));
        let targets = if surge || any_target {
            let t = Targets {
                bandwidth: self.value(args.get("bandwidth"), |v| {
                    parse_target(v, "bandwidth", "4GiB/s")
                }),
                iops: self.value(args.get("iops"), |v| parse_target(v, "iops", "200k/s")),
                metadata: self.value(args.get("metadata"), |v| {
                    parse_target(v, "metadata", "50k/s")
                }),
            };
            let named = ["bandwidth", "iops", "metadata", "capacity"]
                .iter()
                .any(|k| args.contains_key(k));
            if surge && !named && !ctx.raw.broken && !ctx.incomplete {
                self.sink.error(
                    ctx.raw.line,
                    &ctx.text,
                    format!(
                        "`#SURGE jobdw` needs at least one of bandwidth=, iops=, metadata= or \
                         capacity=, as in `{}`",
                        SURGE_JOBDW.example
                    ),
                );
            }
            Some(t)
        } else {
            None
        };
        let ok = self.sink.errors.len() == errors_before && !ctx.raw.broken;
        match (kind, access_mode, capacity) {
            (Some(kind), Some(access_mode), Some(capacity)) if ok => {
                self.out.jobdw = Some(JobDw {
                    line: ctx.raw.line,
                    kind,
                    access_mode,
                    capacity,
                    pool,
                    targets,
                    cache,
                });
            }
            _ if first.is_none() => self.jobdw_unread = true,
            _ => {}
        }
    }

    /// Rabbit's `#DW jobdw type=xfs|gfs2|lustre capacity=N name=NAME`: one named allocation.
    fn rabbit_jobdw(&mut self, ctx: &Ctx) {
        let errors_before = self.sink.errors.len();
        // DataWarp's keys on a Rabbit line: said plainly rather than "unknown key".
        let mut args = Vec::new();
        for t in &ctx.args {
            match t.key.as_deref() {
                Some(
                    k
                    @ ("access_mode" | "pfs" | "optimization" | "bandwidth" | "iops" | "metadata"),
                ) => self.sink.error(
                    t.line,
                    &t.raw,
                    format!(
                        "`{k}=` is DataWarp's (or Surge's `#SURGE jobdw`), and this jobdw is \
                         Rabbit's (it has name= or type=xfs|gfs2|lustre|raw), whose type says how \
                         the compute nodes share it: xfs and gfs2 one per node, lustre one for \
                         the job; drop `{k}=`, or write DataWarp's jobdw without name="
                    ),
                ),
                _ => args.push(t.clone()),
            }
        }
        let ctx = Ctx {
            raw: ctx.raw,
            text: ctx.text.clone(),
            args,
            failed_keys: ctx.failed_keys.clone(),
            incomplete: ctx.incomplete,
        };
        let args = self.args(&ctx, &RABBIT_JOBDW);
        let fs = self.value(args.get("type"), parse_rabbit_fs);
        let capacity = self.value(args.get("capacity"), parse_capacity);
        let pool = self.value(args.get("pool"), parse_pool);
        if let Some(t) = args.get("profile") {
            self.sink.error(
                t.line,
                &t.raw,
                "Rabbit storage profiles (profile=) are an NNF administrator's settings that \
                 Surge does not have; drop profile= (Surge's pools are chosen with pool=)",
            );
        }
        // `requires=copy-offload` starts Rabbit's copy-offload daemon; Surge's job-initiated
        // copies (`surge stage`, libdatawarp) are always there, so it asks for nothing more.
        self.value(args.get("requires"), |v| match v {
            "copy-offload" => Ok(()),
            _ => Err(format!(
                "unknown requires `{v}`{}; Rabbit's only value is copy-offload",
                hint(v, &["copy-offload"])
            )),
        });
        let name = match args.get("name") {
            Some(t) => {
                let first = self
                    .allocation_names
                    .iter()
                    .find(|(n, _)| *n == t.value)
                    .map(|(_, l)| *l);
                if let Some(first) = first {
                    self.sink.error(
                        t.line,
                        &t.raw,
                        format!(
                            "two job allocations are named `{}` (the first on line {first}); a \
                             name is unique within a job, as $DW_JOB_{} names one allocation",
                            t.value,
                            allocation_var_suffix(&t.value)
                        ),
                    );
                }
                self.allocation_names.push((t.value.clone(), t.line));
                self.value(Some(t), |v| {
                    check_allocation_name(v).map(|()| v.to_string())
                })
            }
            None => None,
        };
        if name.is_none() {
            self.allocation_unread = true;
        }
        if self.allocation_names.len() == MAX_ALLOCATIONS + 1 {
            self.sink.error(
                ctx.raw.line,
                &ctx.text,
                format!("a job has at most {MAX_ALLOCATIONS} Rabbit job allocations"),
            );
        }
        if self.sink.errors.len() != errors_before || ctx.raw.broken {
            return;
        }
        if let (Some(name), Some(fs), Some(capacity)) = (name, fs, capacity) {
            self.out.allocations.push(JobAllocation {
                line: ctx.raw.line,
                name,
                fs,
                capacity,
                pool,
            });
        }
    }

    /// Rabbit's `#DW copy_in` / `#DW copy_out`: a stage without `type=`, the source's kind
    /// deciding when it runs.
    fn copy(&mut self, ctx: &Ctx, direction: StageDirection) {
        let spec = match direction {
            StageDirection::In => &COPY_IN,
            StageDirection::Out => &COPY_OUT,
        };
        self.stage_with(ctx, direction, spec, true);
    }

    fn persistentdw(&mut self, ctx: &Ctx) {
        let errors_before = self.sink.errors.len();
        let args = self.args(ctx, &PERSISTENTDW);
        let Some(token) = args.get("name") else {
            self.attach_unread = true;
            return;
        };
        if let Some((_, first)) = self.attached.iter().find(|(n, _)| *n == token.value) {
            self.sink.error(
                token.line,
                &token.raw,
                format!(
                    "persistent instance `{}` is attached twice (first on line {first}); attach \
                     it once",
                    token.value
                ),
            );
        }
        self.attached.push((token.value.clone(), ctx.raw.line));
        let name = self.value(Some(token), |v| {
            check_persistent_name(v).map(|()| v.to_string())
        });
        if let Some(name) = name {
            if self.sink.errors.len() == errors_before && !ctx.raw.broken {
                self.out.persistentdw.push(PersistentDw {
                    line: ctx.raw.line,
                    name,
                });
            }
        }
    }

    fn stage(&mut self, ctx: &Ctx, direction: StageDirection) {
        let spec = match direction {
            StageDirection::In => &STAGE_IN,
            StageDirection::Out => &STAGE_OUT,
        };
        self.stage_with(ctx, direction, spec, false);
    }

    /// A stage directive: DataWarp's (`type=` given) or Rabbit's `copy` (none: [`StageKind::Any`]).
    fn stage_with(&mut self, ctx: &Ctx, direction: StageDirection, spec: &Spec, copy: bool) {
        let errors_before = self.sink.errors.len();
        let args = self.args(ctx, spec);
        let kind = if copy {
            if let Some(t) = args.get("profile") {
                self.sink.error(
                    t.line,
                    &t.raw,
                    "Rabbit copy profiles (profile=) are an NNF administrator's settings that \
                     Surge does not have; drop profile= (Surge copies data, modes and times, \
                     never extended attributes)",
                );
            }
            Some(StageKind::Any)
        } else {
            self.value(args.get("type"), parse_stage_kind)
        };
        let word = spec.name;
        let source = self.value(args.get("source"), |v| {
            stage_path(v, direction, End::Source, word)
        });
        let destination = self.value(args.get("destination"), |v| {
            stage_path(v, direction, End::Destination, word)
        });
        if let (Some(StageKind::File), Some(token)) = (kind, args.get("source")) {
            if token.value.ends_with('/') {
                self.sink.error(
                    token.line,
                    &token.raw,
                    "type=file copies one file, but the source ends with `/`; to copy a \
                     directory use type=directory",
                );
            }
        }
        // The end on the instance: where the variable that names the instance is.
        let instance_end = match direction {
            StageDirection::In => (&destination, args.get("destination")),
            StageDirection::Out => (&source, args.get("source")),
        };
        let var = match instance_end {
            (Some(PathSide::Instance { var, .. }), Some(token))
                if direction == StageDirection::Out && *var == DwVariable::JobLdbal =>
            {
                self.sink.error(
                    token.line,
                    &token.raw,
                    "$DW_JOB_LDBAL is read-only (access_mode=ldbalance: replicas of what was \
                     staged in); a job cannot write there, so there is nothing to stage out",
                );
                None
            }
            (Some(PathSide::Instance { var, .. }), Some(token)) => {
                self.stage_refs.push(StageRef {
                    var: var.clone(),
                    line: token.line,
                    text: token.raw.clone(),
                });
                Some(var.clone())
            }
            _ => None,
        };
        if self.sink.errors.len() != errors_before || ctx.raw.broken {
            return;
        }
        if let (Some(kind), Some(source), Some(destination), Some(instance)) =
            (kind, args.get("source"), args.get("destination"), var)
        {
            let stage = StageDirective {
                line: ctx.raw.line,
                kind,
                source: source.value.clone(),
                destination: destination.value.clone(),
                direction,
                instance,
            };
            match direction {
                StageDirection::In => self.out.stage_in.push(stage),
                StageDirection::Out => self.out.stage_out.push(stage),
            }
        }
    }

    fn create_persistent(&mut self, ctx: &Ctx) {
        // Rabbit's form (`type=xfs|gfs2|lustre|raw name=... capacity=...`, no access_mode).
        if let Some(t) = ctx.args.iter().find(|t| {
            t.key.as_deref() == Some("type")
                && matches!(t.value.as_str(), "xfs" | "gfs2" | "lustre" | "raw")
        }) {
            self.sink.error(
                t.line,
                &t.raw,
                format!(
                    "Rabbit's `create_persistent {}` is not read by Surge: a persistent instance \
                     is DataWarp's, shared by the jobs that attach it; write `#BB \
                     create_persistent name=NAME capacity=SIZE access_mode=striped \
                     type=scratch` (NAME of letters, digits and `_`), which jobs attach with \
                     `#DW persistentdw name=NAME` either way",
                    t.raw
                ),
            );
            return;
        }
        let errors_before = self.sink.errors.len();
        let args = self.args(ctx, &CREATE_PERSISTENT);
        if let Some(token) = args.get("name") {
            self.created.push((token.value.clone(), token.line));
        }
        let name = self.value(args.get("name"), |v| {
            check_persistent_name(v).map(|()| v.to_string())
        });
        let capacity = self.value(args.get("capacity"), parse_capacity);
        let access_mode = self.value(args.get("access_mode"), |v| match parse_access_mode(v)? {
            AccessMode::Striped => Ok(AccessMode::Striped),
            AccessMode::Private => Err("a persistent instance must be access_mode=striped: jobs \
                                        reach it through $DW_PERSISTENT_STRIPED_<name>, while \
                                        private namespaces belong to the compute nodes of one job"
                .to_string()),
            AccessMode::Ldbalance => Err("access_mode=ldbalance is for job instances in Surge \
                                          so far (#DW jobdw ... access_mode=ldbalance, filled by \
                                          its stage_in); a persistent instance must be \
                                          access_mode=striped"
                .to_string()),
        });
        let kind = self.value(args.get("type"), parse_instance_type);
        let pool = self.value(args.get("pool"), parse_pool);
        let cache = self.cache_keys(ctx, &args, kind, "create_persistent");
        if self.sink.errors.len() != errors_before || ctx.raw.broken {
            return;
        }
        if let (Some(name), Some(capacity), Some(access_mode), Some(kind)) =
            (name, capacity, access_mode, kind)
        {
            self.out.create_persistent.push(CreatePersistent {
                line: ctx.raw.line,
                name,
                capacity,
                access_mode,
                kind,
                pool,
                cache,
            });
        }
    }

    fn destroy_persistent(&mut self, ctx: &Ctx) {
        let errors_before = self.sink.errors.len();
        let args = self.args(ctx, &DESTROY_PERSISTENT);
        if let Some(token) = args.get("name") {
            self.destroyed.push((token.value.clone(), token.line));
        }
        let name = self.value(args.get("name"), |v| {
            check_persistent_name(v).map(|()| v.to_string())
        });
        if self.sink.errors.len() != errors_before || ctx.raw.broken {
            return;
        }
        if let Some(name) = name {
            self.out.destroy_persistent.push(DestroyPersistent {
                line: ctx.raw.line,
                name,
                hurry: args.contains_key("hurry"),
            });
        }
    }

    /// Checks that need the whole script: stage paths name instances the job has, and persistent
    /// instances are not created, attached and destroyed in contradictory ways.
    fn check_across_directives(&mut self) {
        for r in std::mem::take(&mut self.stage_refs) {
            let message = match &r.var {
                DwVariable::JobStriped | DwVariable::JobPrivate | DwVariable::JobLdbal => {
                    let wanted = match r.var {
                        DwVariable::JobPrivate => AccessMode::Private,
                        DwVariable::JobLdbal => AccessMode::Ldbalance,
                        _ => AccessMode::Striped,
                    };
                    match &self.out.jobdw {
                        Some(j) if j.kind == InstanceType::Cache => Some(format!(
                            "{} is not set: the jobdw on line {} is type=cache, which sets \
                             $DW_JOB_STRIPED_CACHE (and fills and drains itself from pfs=)",
                            r.var, j.line
                        )),
                        Some(j) if j.access_mode != wanted => Some(format!(
                            "{} is not set: the jobdw on line {} has access_mode={}, which sets \
                             {other}; use {other}, or access_mode={wanted}",
                            r.var,
                            j.line,
                            j.access_mode,
                            other = DwVariable::of_job(j.access_mode)
                        )),
                        None if self.jobdw_lines.is_empty() && self.allocation_names.is_empty() => {
                            Some(format!(
                                "{} is the job instance, but the script has no `#DW jobdw` to \
                                 create one; add e.g. `#DW jobdw type=scratch \
                                 access_mode={wanted} capacity=100GiB`",
                                r.var
                            ))
                        }
                        None if self.jobdw_lines.is_empty() => Some(format!(
                            "{} is DataWarp's job instance, but this script's jobdw lines are \
                             Rabbit's named allocations (line {}); use $DW_JOB_<name> of one \
                             of them",
                            r.var, self.allocation_names[0].1
                        )),
                        _ => None,
                    }
                }
                DwVariable::JobStripedCache => Some(
                    "stage_in and stage_out do not apply to $DW_JOB_STRIPED_CACHE: a type=cache \
                     instance is filled from its pfs= directory before the job and drains every \
                     change back to it; stage from and to that directory's files directly"
                        .to_string(),
                ),
                DwVariable::JobNamed(suffix) => {
                    let defined = self
                        .allocation_names
                        .iter()
                        .any(|(n, _)| allocation_var_suffix(n) == *suffix);
                    (!defined && !self.allocation_unread).then(|| {
                        let mut vars: Vec<String> = Vec::new();
                        for (n, _) in &self.allocation_names {
                            let v = format!("DW_JOB_{}", allocation_var_suffix(n));
                            if !vars.contains(&v) {
                                vars.push(v);
                            }
                        }
                        let vars: Vec<&str> = vars.iter().map(String::as_str).collect();
                        let wanted = format!("DW_JOB_{suffix}");
                        let hint = suggest(&wanted, &vars)
                            .map(|s| format!(" (did you mean ${s}?)"))
                            .unwrap_or_default();
                        let have = if vars.is_empty() {
                            "the script defines none".to_string()
                        } else {
                            let v: Vec<String> = vars.iter().map(|v| format!("${v}")).collect();
                            let v: Vec<&str> = v.iter().map(String::as_str).collect();
                            format!("the script defines {}", join_and(&v))
                        };
                        format!(
                            "{} names no job allocation{hint}: add `#DW jobdw type=xfs \
                             capacity=10GiB name={}` ({have})",
                            r.var,
                            suffix.replace('_', "-")
                        )
                    })
                }
                DwVariable::PersistentStriped(name) => {
                    let attached = self.attached.iter().any(|(n, _)| n == name);
                    (!attached && !self.attach_unread).then(|| {
                        let created = self
                            .created
                            .iter()
                            .find(|(n, _)| n == name)
                            .map(|(_, line)| {
                                format!(" (line {line} creates it, which does not attach it)")
                            })
                            .unwrap_or_default();
                        format!(
                            "{} is set only for a persistent instance the job attaches; add \
                             `#DW persistentdw name={name}`{created}",
                            r.var
                        )
                    })
                }
            };
            if let Some(message) = message {
                self.sink.error(r.line, r.text, message);
            }
        }

        repeated(&mut self.sink, &self.created, "created", "create");
        repeated(&mut self.sink, &self.destroyed, "destroyed", "destroy");
        for (name, line) in &self.destroyed {
            if let Some((_, created)) = self.created.iter().find(|(n, _)| n == name) {
                self.sink.error(
                    *line,
                    format!("name={name}"),
                    format!(
                        "this job both creates (line {created}) and destroys persistent instance \
                         `{name}`; do that in separate jobs"
                    ),
                );
            }
            if let Some((_, attached)) = self.attached.iter().find(|(n, _)| n == name) {
                self.sink.error(
                    *line,
                    format!("name={name}"),
                    format!(
                        "this job both attaches (line {attached}) and destroys persistent \
                         instance `{name}`; destroy it in a later job"
                    ),
                );
            }
        }
    }
}

/// Reports a name that appears more than once in `list`.
fn repeated(sink: &mut Sink, list: &[(String, usize)], verb: &str, verb_once: &str) {
    for (i, (name, line)) in list.iter().enumerate() {
        if let Some((_, first)) = list[..i].iter().find(|(n, _)| n == name) {
            sink.error(
                *line,
                format!("name={name}"),
                format!(
                    "persistent instance `{name}` is {verb} twice (first on line {first}); \
                     {verb_once} it once"
                ),
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------------------------

fn parse_instance_type(v: &str) -> Result<InstanceType, String> {
    match v {
        "scratch" => Ok(InstanceType::Scratch),
        "cache" => Ok(InstanceType::Cache),
        _ => Err(format!(
            "unknown type `{v}`{}; expected type=scratch",
            hint(v, &["scratch", "cache"])
        )),
    }
}

fn parse_access_mode(v: &str) -> Result<AccessMode, String> {
    match v {
        "striped" => Ok(AccessMode::Striped),
        "private" => Ok(AccessMode::Private),
        "ldbalance" => Ok(AccessMode::Ldbalance),
        "striped,private" | "private,striped" => Err(format!(
            "access_mode={v} (both namespaces in one instance) is not supported yet; choose \
             access_mode=striped or access_mode=private"
        )),
        _ => Err(format!(
            "unknown access_mode `{v}`{}; expected access_mode=striped, private or ldbalance",
            hint(v, &["striped", "private", "ldbalance"])
        )),
    }
}

/// A performance target: a rate (`4GiB/s`, `200k/s`) more than zero.
fn parse_target(v: &str, key: &str, example: &str) -> Result<u64, String> {
    match crate::units::parse_rate(v) {
        Ok(0) => Err(format!(
            "{key} must be more than zero, e.g. {key}={example}"
        )),
        Ok(r) => Ok(r),
        Err(e) => Err(format!("bad {key}: {e}")),
    }
}

fn parse_capacity(v: &str) -> Result<u64, String> {
    match parse_size(v) {
        Ok(0) => Err("capacity must be more than zero, e.g. capacity=100GiB".to_string()),
        Ok(bytes) => Ok(bytes),
        Err(e) => Err(format!("bad capacity: {e}")),
    }
}

/// `pfs=`: an absolute, plain directory path (not `/`).
fn parse_cache_pfs(v: &str) -> Result<String, String> {
    let p = std::path::Path::new(v);
    if !p.is_absolute() {
        return Err(format!(
            "pfs={v} is not an absolute path; give the PFS directory the cache mirrors, e.g. \
             pfs=/lus/scratch/run"
        ));
    }
    if p.components().any(|c| {
        matches!(
            c,
            std::path::Component::ParentDir | std::path::Component::CurDir
        )
    }) || v.contains('$')
        || v.chars().any(char::is_control)
    {
        return Err(format!(
            "pfs={v}: write a plain absolute path, without `.`, `..` or `$`"
        ));
    }
    if p.parent().is_none() {
        return Err("pfs=/ would mirror the whole file system; name a directory".to_string());
    }
    Ok(v.trim_end_matches('/').to_string())
}

fn parse_pool(v: &str) -> Result<String, String> {
    check_pool_name(v).map(|()| v.to_string())
}

fn parse_stage_kind(v: &str) -> Result<StageKind, String> {
    match v {
        "file" => Ok(StageKind::File),
        "directory" => Ok(StageKind::Directory),
        "list" => Ok(StageKind::List),
        _ => Err(format!(
            "unknown stage type `{v}`{}; expected type=file, type=directory or type=list",
            hint(v, &["file", "directory", "list"])
        )),
    }
}

/// Where a path points.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PathSide {
    /// The parallel file system (any path not starting with a `$DW_…` variable).
    Pfs,
    /// An instance: the variable, then `rest` (empty or starting with `/`).
    Instance { var: DwVariable, rest: String },
}

/// Classifies a path and checks what can be checked without the file system. Only a leading
/// `$DW_…` variable is allowed: DataWarp expanded nothing else, and a `$SCRATCH` kept literally
/// would silently copy nothing.
fn classify_path(path: &str) -> Result<PathSide, String> {
    if let Some(c) = path.chars().find(|c| c.is_control()) {
        return Err(format!(
            "the path contains the control character {c:?}; expected a plain path"
        ));
    }
    let Some(after) = path.strip_prefix('$') else {
        if path.contains('$') {
            return Err(
                "a `$` variable may only start a path, and only the $DW_… variables are \
                        expanded; write the full path"
                    .to_string(),
            );
        }
        if path.starts_with('~') {
            return Err("`~` is not expanded in directives; write the full path".to_string());
        }
        return Ok(PathSide::Pfs);
    };
    let (name, rest) = match after.strip_prefix('{') {
        Some(braced) => match braced.find('}') {
            Some(close) => (&braced[..close], &braced[close + 1..]),
            None => return Err("`${` is not closed by `}`".to_string()),
        },
        None => {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            after.split_at(end)
        }
    };
    let var = dw_variable(name)?;
    if !rest.is_empty() && !rest.starts_with('/') {
        return Err(format!("expected `/` after {var}, found `{rest}`"));
    }
    if rest.contains('$') {
        return Err("a `$` variable may only start a path".to_string());
    }
    if rest.split('/').any(|part| part == "..") {
        return Err(format!(
            "`..` is not allowed in a path under {var}: it could leave the instance"
        ));
    }
    Ok(PathSide::Instance {
        var,
        rest: rest.to_string(),
    })
}

fn dw_variable(name: &str) -> Result<DwVariable, String> {
    const EXPECTED: &str =
        "$DW_JOB_STRIPED, $DW_JOB_PRIVATE, $DW_JOB_LDBAL or $DW_PERSISTENT_STRIPED_<name>";
    if name == "DW_JOB_STRIPED" {
        Ok(DwVariable::JobStriped)
    } else if name == "DW_JOB_PRIVATE" {
        Ok(DwVariable::JobPrivate)
    } else if name == "DW_JOB_LDBAL" {
        Ok(DwVariable::JobLdbal)
    } else if name == "DW_JOB_STRIPED_CACHE" {
        Ok(DwVariable::JobStripedCache)
    } else if let Some(instance) = name
        .strip_prefix("DW_PERSISTENT_STRIPED_")
        .or_else(|| name.strip_prefix("DW_PERSISTENT_"))
    {
        // `$DW_PERSISTENT_<name>` is Rabbit's name of what DataWarp calls
        // `$DW_PERSISTENT_STRIPED_<name>`: both are set for an attached instance.
        check_persistent_name(instance)
            .map(|()| DwVariable::PersistentStriped(instance.to_string()))
            .map_err(|e| format!("bad ${name}: {e}"))
    } else if let Some(suffix) = name
        .strip_prefix("DW_JOB_")
        .filter(|s| s.starts_with(|c: char| c.is_ascii_lowercase()))
    {
        // Rabbit's `$DW_JOB_<name>`: its names are lower case, DataWarp's variables upper.
        if let Some(bad) = suffix
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_'))
        {
            return Err(format!(
                "${name} contains `{bad}`: $DW_JOB_<name> is a Rabbit allocation's name, lower \
                 case letters, digits and `_` (for the name's `-`)"
            ));
        }
        Ok(DwVariable::JobNamed(suffix.to_string()))
    } else if name.is_empty() {
        Err("`$` must be followed by a variable name".to_string())
    } else if name.starts_with("DW_") {
        let hint = suggest(name, &["DW_JOB_STRIPED", "DW_JOB_PRIVATE", "DW_JOB_LDBAL"])
            .map(|s| format!(" (did you mean ${s}?)"))
            .unwrap_or_default();
        Err(format!(
            "unknown variable ${name}{hint}; expected {EXPECTED}"
        ))
    } else {
        Err(format!(
            "${name} is not expanded in directives (only $DW_JOB_STRIPED, $DW_JOB_PRIVATE and \
             $DW_PERSISTENT_STRIPED_<name> are); write the full path"
        ))
    }
}

/// A Rabbit `jobdw` line: it has `name=`, or its type is one of Rabbit's. Everything else is
/// DataWarp's (whose `jobdw` never had a name).
fn is_rabbit_jobdw(ctx: &Ctx) -> bool {
    ctx.args.iter().any(|t| match t.key.as_deref() {
        Some("name") => true,
        Some("type") => matches!(t.value.as_str(), "xfs" | "gfs2" | "lustre" | "raw"),
        _ => false,
    })
}

fn parse_rabbit_fs(v: &str) -> Result<RabbitFs, String> {
    match v {
        "xfs" => Ok(RabbitFs::Xfs),
        "gfs2" => Ok(RabbitFs::Gfs2),
        "lustre" => Ok(RabbitFs::Lustre),
        "raw" => Err(
            "type=raw (a bare block device per compute node) is not something Surge \
                      gives: its instances are file systems; use type=xfs for one per node"
                .to_string(),
        ),
        "scratch" | "cache" => Err(format!(
            "type={v} is DataWarp's, but name= makes this jobdw Rabbit's; write Rabbit's \
             type=xfs, gfs2 or lustre, or drop name= for DataWarp's `#DW jobdw type={v} \
             access_mode=striped capacity=...`"
        )),
        _ => Err(format!(
            "unknown type `{v}`{}; a Rabbit jobdw takes type=xfs, gfs2 or lustre",
            hint(v, &["xfs", "gfs2", "lustre"])
        )),
    }
}

/// Checks a Rabbit allocation name: a lower-case letter, then lower-case letters, digits or
/// `-` (Rabbit's rule), at most [`MAX_ALLOCATION_NAME_LEN`] characters.
pub fn check_allocation_name(name: &str) -> Result<(), String> {
    let rule = format!(
        "a job allocation's name is a lower-case letter followed by lower-case letters, digits \
         or `-`, at most {MAX_ALLOCATION_NAME_LEN} characters (as Rabbit's)"
    );
    match name.chars().next() {
        None => Err(format!("empty name: {rule}")),
        Some(c) if !c.is_ascii_lowercase() => Err(format!(
            "`{name}` does not start with a lower-case letter: {rule}"
        )),
        Some(_) => {
            if let Some(bad) = name
                .chars()
                .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
            {
                Err(format!("`{name}` contains `{bad}`: {rule}"))
            } else if name.len() > MAX_ALLOCATION_NAME_LEN {
                Err(format!(
                    "`{name}` is {} characters long: {rule}",
                    name.len()
                ))
            } else {
                Ok(())
            }
        }
    }
}

/// Which end of a copy a path is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    Source,
    Destination,
}

/// Checks a stage path and that it is on the right side: stage_in reads the PFS and writes an
/// instance, stage_out the reverse.
fn stage_path(
    path: &str,
    direction: StageDirection,
    end: End,
    word: &str,
) -> Result<PathSide, String> {
    let side = classify_path(path)?;
    let wants_instance = matches!(
        (direction, end),
        (StageDirection::In, End::Destination) | (StageDirection::Out, End::Source)
    );
    if word.starts_with("copy_") {
        // Rabbit also copies between two allocations; Surge's stage tasks have one end on the
        // PFS.
        return match (wants_instance, &side) {
            (true, PathSide::Pfs) => Err(format!(
                "{word} copies {} the burst buffer: its {} must start with $DW_JOB_<name>, \
                 $DW_PERSISTENT_<name> (or DataWarp's $DW_JOB_STRIPED, ...)",
                if direction == StageDirection::In {
                    "into"
                } else {
                    "out of"
                },
                if direction == StageDirection::In {
                    "destination"
                } else {
                    "source"
                },
            )),
            (false, PathSide::Instance { var, .. }) => Err(format!(
                "{word}: both ends are in the burst buffer ({var} here); Surge copies between \
                 the burst buffer and the parallel file system only, so copy from one instance \
                 to the other in the job (cp -r)"
            )),
            _ => Ok(side),
        };
    }
    match (wants_instance, &side) {
        (true, PathSide::Pfs) => Err(match direction {
            StageDirection::In => "stage_in copies into the burst buffer: its destination must \
                                   start with $DW_JOB_STRIPED, $DW_JOB_PRIVATE or \
                                   $DW_PERSISTENT_STRIPED_<name>"
                .to_string(),
            StageDirection::Out => "stage_out copies from the burst buffer: its source must \
                                    start with $DW_JOB_STRIPED, $DW_JOB_PRIVATE or \
                                    $DW_PERSISTENT_STRIPED_<name>"
                .to_string(),
        }),
        (false, PathSide::Instance { var, .. }) => Err(match direction {
            StageDirection::In => format!(
                "stage_in copies from the parallel file system: its source cannot be in the \
                     burst buffer ({var}); to copy out of the burst buffer use stage_out"
            ),
            StageDirection::Out => format!(
                "stage_out copies to the parallel file system: its destination cannot be in \
                     the burst buffer ({var}); to copy into the burst buffer use stage_in"
            ),
        }),
        _ => Ok(side),
    }
}

// ---------------------------------------------------------------------------------------------
// Stage list files
// ---------------------------------------------------------------------------------------------

/// Reads the list file of a `type=list` stage directive: one `SRC DST` pair per line, blank
/// lines and lines starting with `#` ignored, a path quoted as a whole (`"a b"`) if it holds
/// spaces. SRC obeys the directive's rule for `source` (stage_in: a PFS path; stage_out: a path
/// under the directive's instance variable). DST is either relative, and then taken inside the
/// directive's `destination` directory, or a full path obeying the rule for `destination`.
/// `list_file` is the name errors are reported with. Every error of the file is returned.
pub fn parse_stage_list(
    list_file: &str,
    text: &str,
    stage: &StageDirective,
) -> Result<Vec<StageEntry>, DirectiveErrors> {
    let mut sink = Sink::new(list_file);
    let mut entries: Vec<StageEntry> = Vec::new();
    if stage.kind != StageKind::List {
        sink.error(
            stage.line,
            format!("type={}", stage.kind),
            "not a type=list stage directive: only type=list has a list file",
        );
        return Err(DirectiveErrors(sink.errors));
    }
    for (index, raw_line) in text.split('\n').enumerate() {
        let n = index + 1;
        let line = raw_line.strip_suffix('\r').unwrap_or(raw_line).trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields = match split_fields(line) {
            Ok(fields) => fields,
            Err(message) => {
                sink.error(n, line, message);
                continue;
            }
        };
        let [src, dst] = fields.as_slice() else {
            sink.error(
                n,
                line,
                format!(
                    "expected two paths, `SOURCE DESTINATION`, found {}",
                    fields.len()
                ),
            );
            continue;
        };
        match list_entry(stage, src, dst) {
            Ok(destination) => {
                if let Some(first) = entries.iter().find(|e| e.destination == destination) {
                    sink.error(
                        n,
                        line,
                        format!(
                            "destination {destination} is also the destination of line {}; each \
                             file needs its own destination",
                            first.line
                        ),
                    );
                } else {
                    entries.push(StageEntry {
                        line: n,
                        source: src.clone(),
                        destination,
                    });
                }
            }
            Err(message) => sink.error(n, line, message),
        }
    }
    if sink.errors.is_empty() {
        Ok(entries)
    } else {
        Err(DirectiveErrors(sink.errors))
    }
}

/// Checks one list entry; returns its destination resolved against the directive's.
fn list_entry(stage: &StageDirective, src: &str, dst: &str) -> Result<String, String> {
    let same_instance = |path: &str, what: &str| -> Result<(), String> {
        match classify_path(path)? {
            PathSide::Instance { var, .. } if var == stage.instance => Ok(()),
            PathSide::Instance { var, .. } => Err(format!(
                "{what} {path} is under {var}, but the directive's instance is {}",
                stage.instance
            )),
            PathSide::Pfs => Err(format!(
                "{what} {path} must be in the burst buffer, under {}",
                stage.instance
            )),
        }
    };
    match stage.direction {
        StageDirection::In => {
            if let PathSide::Instance { var, .. } = classify_path(src)? {
                return Err(format!(
                    "source {src} is in the burst buffer ({var}); a stage_in list names files \
                     on the parallel file system"
                ));
            }
        }
        StageDirection::Out => same_instance(src, "source")?,
    }
    let relative = !dst.starts_with('/') && !dst.starts_with('$');
    let destination = if relative {
        format!(
            "{}/{}",
            stage.destination.trim_end_matches('/'),
            dst.trim_start_matches("./")
        )
    } else {
        dst.to_string()
    };
    match stage.direction {
        StageDirection::In => same_instance(&destination, "destination")?,
        StageDirection::Out => {
            if let PathSide::Instance { var, .. } = classify_path(&destination)? {
                return Err(format!(
                    "destination {destination} is in the burst buffer ({var}); a stage_out list \
                     copies to the parallel file system"
                ));
            }
        }
    }
    Ok(destination)
}

/// Splits a list-file line at whitespace; a field may be quoted as a whole.
fn split_fields(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut chars = line.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        let mut field = String::new();
        if c == '"' || c == '\'' {
            chars.next();
            let mut closed = false;
            for d in chars.by_ref() {
                if d == c {
                    closed = true;
                    break;
                }
                field.push(d);
            }
            if !closed {
                return Err(format!("the quote {c} is not closed"));
            }
            if chars.peek().is_some_and(|d| !d.is_whitespace()) {
                return Err(
                    "text after a closing quote: a quote must enclose the whole path".to_string(),
                );
            }
        } else {
            while let Some(&d) = chars.peek() {
                if d.is_whitespace() {
                    break;
                }
                if d == '"' || d == '\'' {
                    return Err("a quote may only enclose a whole path, as in \"/a b\"".to_string());
                }
                field.push(d);
                chars.next();
            }
        }
        if field.is_empty() {
            return Err("empty path".to_string());
        }
        fields.push(field);
    }
    Ok(fields)
}

// ---------------------------------------------------------------------------------------------
// Messages
// ---------------------------------------------------------------------------------------------

/// "a, b and c".
fn join_and(items: &[&str]) -> String {
    join_with(items, "and")
}

/// "a, b or c".
fn join_or(items: &[&str]) -> String {
    join_with(items, "or")
}

fn join_with(items: &[&str], word: &str) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} {word} {last}", init.join(", ")),
    }
}

/// " (did you mean `x`?)" or nothing.
fn hint(word: &str, candidates: &[&str]) -> String {
    suggest(word, candidates)
        .map(|s| format!(" (did you mean `{s}`?)"))
        .unwrap_or_default()
}

/// The candidate closest to `word` if it is close enough to be a typo: same letters in another
/// case, or one edit away (two for words of five letters or more).
fn suggest<'c>(word: &str, candidates: &[&'c str]) -> Option<&'c str> {
    let lower = word.to_ascii_lowercase();
    candidates
        .iter()
        .map(|c| (edit_distance(&lower, &c.to_ascii_lowercase()), *c))
        .filter(|(d, c)| *d <= if c.len() >= 5 { 2 } else { 1 })
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(above + 1)
                .min(row[j] + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<(Option<String>, String)> {
        tokenize(1, s)
            .into_iter()
            .map(|t| match t {
                Ok(t) => (t.key, t.value),
                Err(e) => panic!("{}: {}", e.raw, e.message),
            })
            .collect()
    }

    #[test]
    fn tokens_split_at_whitespace_and_the_first_equals_sign() {
        assert_eq!(
            words("  stage_in source=/a=b\tdestination=$DW_JOB_STRIPED "),
            vec![
                (None, "stage_in".to_string()),
                (Some("source".to_string()), "/a=b".to_string()),
                (
                    Some("destination".to_string()),
                    "$DW_JOB_STRIPED".to_string()
                ),
            ]
        );
    }

    #[test]
    fn a_quoted_value_keeps_its_spaces_and_loses_its_quotes() {
        assert_eq!(
            words(r#"source="/my data/in" destination='$DW_JOB_STRIPED/a b'"#),
            vec![
                (Some("source".to_string()), "/my data/in".to_string()),
                (
                    Some("destination".to_string()),
                    "$DW_JOB_STRIPED/a b".to_string()
                ),
            ]
        );
    }

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("capcity", "capacity"), 1);
        assert_eq!(edit_distance("stagein", "stage_in"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
        assert_eq!(suggest("Capacity", &["capacity", "pool"]), Some("capacity"));
        assert_eq!(suggest("xyz", &["capacity", "pool"]), None);
    }

    #[test]
    fn classify_path_reads_the_leading_variable() {
        assert_eq!(
            classify_path("${DW_PERSISTENT_STRIPED_proj}/a"),
            Ok(PathSide::Instance {
                var: DwVariable::PersistentStriped("proj".to_string()),
                rest: "/a".to_string()
            })
        );
        assert_eq!(classify_path("relative/path"), Ok(PathSide::Pfs));
        assert!(classify_path("$DW_JOB_STRIPEDX").is_err());
    }
}
