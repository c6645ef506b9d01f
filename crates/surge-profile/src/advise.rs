//! `surge advise`: from a profile and calibrated peaks, an allocation: capacity vs performance
//! fragments (Daley §5.2), access mode (private when metadata-bound, §4.3), hybrid placement
//! (small shared files on the PFS, ExPBB's rule), what to stage in and out (§5.4), a software
//! environment instance (§5.3), and the `#DW` / `#SURGE` lines to paste into a job script.

use crate::model::{FileKind, FileStats, Profile};
use crate::tables::{summarize, Bound, Summary};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use surge_core::peaks::Peaks;

/// How the pipelines' I/O overlaps in time, which decides how many share one fragment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Coupling {
    /// Every pipeline does its I/O at the same time: Daley's Table 2 estimate (conservative).
    Tight,
    /// Pipelines do I/O at independent times: one pipeline's demand averaged over its run.
    Loose,
}

impl Coupling {
    /// The words a report prints (not the enum's name).
    pub fn label(self) -> &'static str {
        match self {
            Coupling::Tight => "pipelines doing I/O at the same time",
            Coupling::Loose => "pipelines doing I/O at different times",
        }
    }
}

#[derive(Clone, Debug)]
pub struct AdviseRequest {
    pub pipelines: u64,
    pub pipelines_per_node: u64,
    pub granularity_bytes: u64,
    pub small_file_bytes: u64,
    pub coupling: Coupling,
    /// Where the list of software-environment files will be written (`--env-list`): with it,
    /// the advice includes a setup job that stages them into a persistent instance, and the
    /// job attaches that instance. Without it, no line refers to an instance that no job
    /// creates.
    pub env_list: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    pub path: String,
    pub size_bytes: u64,
    pub processes: u32,
    pub io_time_pct: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageTask {
    /// "file" or "directory" (DataWarp's stage types).
    #[serde(rename = "type")]
    pub kind: String,
    pub path: String,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Advice {
    pub stage: String,
    pub verdict: Bound,
    pub pipelines: u64,
    pub coupling: Coupling,
    pub capacity_per_pipeline_bytes: u64,
    pub capacity_needed_bytes: u64,
    pub granularity_bytes: u64,
    pub fragments_for_capacity: u64,
    /// Pipelines one fragment sustains before its data performance saturates.
    pub pipelines_per_fragment: u64,
    pub fragments_for_performance: u64,
    pub fragments: u64,
    /// "capacity" or "performance": which need sets the fragment count.
    pub bound_by: String,
    pub access_mode: String,
    pub access_mode_reason: String,
    /// Aggregate demand of all pipelines, for a `#SURGE jobdw` performance target.
    pub target_bandwidth_bytes_s: f64,
    pub target_metadata_ops_s: f64,
    pub keep_on_pfs: Vec<Placement>,
    pub stage_in: Vec<StageTask>,
    pub stage_out: Vec<StageTask>,
    /// Read-only software environment (Python packages, shared libraries) worth a persistent
    /// instance staged once (Daley §5.3-5.4).
    pub software_environment: Vec<String>,
    pub software_environment_bytes: u64,
    /// Name of the persistent instance for the software environment (a valid
    /// `#DW persistentdw` name).
    pub software_environment_instance: String,
    /// The job's directive lines: they parse with Surge's own parser and run under
    /// `surge run` as printed (after the setup job, when there is one).
    pub directives: Vec<String>,
    /// The performance-target line that can replace `directives[0]` (the `#DW jobdw`): the
    /// pipelines' aggregate demand and the capacity their data needs, as Surge keys on a
    /// `#DW jobdw` line (what `#SURGE jobdw` asks, in the form Slurm also passes to Surge);
    /// `surge run --peaks` or the manager sizes it from the calibrated peaks.
    pub target_directive: String,
    /// Lines of a setup job to run once before `directives` (creates the software-environment
    /// instance and stages the `--env-list` into it); empty without `--env-list`.
    pub setup_directives: Vec<String>,
    pub notes: Vec<String>,
    pub summary: Summary,
}

/// Paths that are part of a software environment rather than the workflow's data.
fn is_software(f: &FileStats) -> bool {
    let p = &f.path;
    let pattern = [
        "/site-packages/",
        "/dist-packages/",
        "/lib/python",
        "/lib64/python",
        "/__pycache__/",
        "/.pyenv/",
        "/conda/",
        "/miniconda",
        "/anaconda",
        "/usr/lib/",
        "/usr/lib64/",
        "/usr/share/",
        "/usr/local/lib/",
        "/lib/x86_64-linux-gnu/",
    ]
    .iter()
    .any(|s| p.contains(s))
        || p.ends_with(".so")
        || p.contains(".so.")
        // Python sources: the interpreter stats them to validate the bytecode it reads, so
        // they go with the bytecode.
        || p.ends_with(".py")
        || p.ends_with(".pyc");
    pattern && f.counters.bytes_written_total() == 0
}

/// System files no one stages (configuration, locale, devices).
fn is_system(path: &str) -> bool {
    [
        "/etc/",
        "/usr/",
        "/bin/",
        "/sbin/",
        "/lib/",
        "/lib64/",
        "/var/lib/",
        "/var/cache/",
        "/run/",
    ]
    .iter()
    .any(|s| path.starts_with(s))
}

fn parent(path: &str) -> String {
    match path.rfind('/') {
        Some(0) => "/".into(),
        Some(i) => path[..i].to_string(),
        None => ".".into(),
    }
}

pub use surge_core::capacity_text;

/// A path as a directive value: quoted as a whole when it has whitespace (the parser's rule:
/// the quote opens right after `=` and closes the word; no escapes inside).
pub fn directive_value(path: &str) -> String {
    if !path.chars().any(char::is_whitespace) {
        path.to_string()
    } else if !path.contains('"') {
        format!("\"{path}\"")
    } else {
        format!("'{path}'")
    }
}

/// A persistent-instance name the parser accepts (`check_persistent_name`): a letter, then
/// letters, digits or `_`, at most 64 characters, derived from the stage name.
pub fn persistent_name_for(stage: &str, suffix: &str) -> String {
    let mut name: String = stage
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        name.insert_str(0, "s_");
    }
    let room = 64 - suffix.len() - 1;
    name.truncate(room);
    format!("{name}_{suffix}")
}

/// The `type=list` file staging the software environment: one `SOURCE DESTINATION` line per
/// file, the destination being the file's absolute path made relative (so the tree keeps its
/// shape under the instance).
pub fn env_list_text(a: &Advice) -> String {
    let mut out = String::from(
        "# surge advise: software-environment files, staged once into a persistent instance\n",
    );
    for f in &a.software_environment {
        let rel = f.trim_start_matches('/');
        out.push_str(&format!(
            "{} {}\n",
            directive_value(f),
            directive_value(rel)
        ));
    }
    out
}

/// Formats a rate the way `surge_core::parse_rate` reads it.
fn rate_bytes(b: f64) -> String {
    let mib = b / (1024.0 * 1024.0);
    if mib >= 1024.0 {
        format!("{:.1}GiB/s", mib / 1024.0)
    } else {
        format!("{}MiB/s", mib.ceil().max(1.0) as u64)
    }
}

fn rate_ops(o: f64) -> String {
    if o >= 1000.0 {
        format!("{}k/s", (o / 1000.0).ceil() as u64)
    } else {
        format!("{}/s", o.ceil().max(1.0) as u64)
    }
}

pub fn advise(p: &Profile, peaks: &Peaks, req: &AdviseRequest) -> Advice {
    let summary = summarize(p, Some(peaks));
    let t2 = &summary.table2;
    let mut notes = Vec::new();
    let n = req.pipelines.max(1);
    let pk = t2.peaks.clone().unwrap_or_default();
    let total_io_ns: u64 = p
        .files
        .iter()
        .filter(|f| f.is_storage())
        .map(|f| f.counters.data_time_ns() + f.counters.meta_time_ns)
        .sum();

    let data_paths_given = !p.data_paths.is_empty();
    let mut env = Vec::new();
    let mut env_bytes = 0u64;
    let mut keep_on_pfs = Vec::new();
    let mut per_pipeline = 0u64;
    let mut inputs: BTreeMap<String, Vec<(String, u64)>> = BTreeMap::new();
    let mut outputs: BTreeMap<String, Vec<(String, u64)>> = BTreeMap::new();
    for f in p.files.iter().filter(|f| f.is_storage()) {
        if matches!(f.kind, FileKind::Directory | FileKind::Missing) {
            continue;
        }
        let c = &f.counters;
        let size = c.size_estimate();
        if is_software(f) {
            env.push(f.path.clone());
            env_bytes += size;
            continue;
        }
        let io_pct = 100.0 * (c.data_time_ns() + c.meta_time_ns) as f64 / total_io_ns.max(1) as f64;
        // ExPBB's hybrid rule: a small file with shared access and significant I/O time is
        // better served by the PFS than by many BB nodes' metadata.
        if size < req.small_file_bytes && f.processes > 1 && io_pct >= 1.0 {
            keep_on_pfs.push(Placement {
                path: f.path.clone(),
                size_bytes: size,
                processes: f.processes,
                io_time_pct: io_pct,
            });
            continue;
        }
        per_pipeline += size;
        let stageable = if data_paths_given {
            p.is_user_data(&f.path)
        } else {
            !is_system(&f.path) && !f.path.starts_with("/tmp/")
        };
        if !stageable {
            continue;
        }
        let read_first = c.bytes_read_total() > 0
            && (c.first_write_ns == 0 || c.first_read_ns < c.first_write_ns);
        if read_first {
            inputs
                .entry(parent(&f.path))
                .or_default()
                .push((f.path.clone(), size));
        }
        let written = c.bytes_written_total() > 0;
        let kept = f.exists_after.unwrap_or(c.unlinks == 0);
        if written && kept {
            outputs
                .entry(parent(&f.path))
                .or_default()
                .push((f.path.clone(), size));
        }
    }
    // Group: a directory with several inputs is staged as a directory (one task, parallel copy).
    let group = |m: BTreeMap<String, Vec<(String, u64)>>| -> Vec<StageTask> {
        let mut v = Vec::new();
        for (dir, files) in m {
            if files.len() > 3 {
                v.push(StageTask {
                    kind: "directory".into(),
                    path: dir,
                    bytes: files.iter().map(|f| f.1).sum(),
                });
            } else {
                v.extend(files.into_iter().map(|(path, bytes)| StageTask {
                    kind: "file".into(),
                    path,
                    bytes,
                }));
            }
        }
        v
    };
    let stage_in = group(inputs);
    let stage_out = group(outputs);

    let capacity_needed = per_pipeline.saturating_mul(n);
    let granularity = req.granularity_bytes.max(1);
    let fragments_for_capacity = capacity_needed.div_ceil(granularity).max(1);
    let per_fragment = match req.coupling {
        Coupling::Tight => pk.pipelines_to_saturate_data,
        Coupling::Loose => pk.pipelines_to_saturate_data_sustained,
    }
    .max(1);
    let fragments_for_performance = n.div_ceil(per_fragment).max(1);
    let fragments = fragments_for_capacity.max(fragments_for_performance);
    let bound_by = if fragments_for_performance > fragments_for_capacity {
        "performance"
    } else {
        "capacity"
    };
    // Whether one striped metadata service saturates is judged on the sustained estimate (the
    // optimistic one): if even pipelines that never overlap exceed it, it surely saturates. The
    // tight estimate rates metadata by the speed of the profiled storage, which on a fast local
    // disk exceeds any BB peak and would call every stage metadata-limited.
    let md_per_server = pk.pipelines_to_saturate_metadata_sustained;
    let verdict = summary.verdict.bound;
    let (access_mode, access_reason) = if verdict == Bound::MetadataBound {
        (
            "private",
            format!(
                "metadata-bound: a private namespace gives every compute node its own metadata \
                 service (Daley §4.3 measured 5x less I/O time for CAMP-builddb); one striped \
                 metadata service saturates after {md_per_server} pipelines"
            ),
        )
    } else if md_per_server > 0 && n > md_per_server {
        (
            "private",
            format!(
                "{n} pipelines exceed the {md_per_server} one striped metadata service sustains; \
                 private mode scales metadata with compute nodes"
            ),
        )
    } else {
        (
            "striped",
            format!(
                "{}: striping over {fragments} fragment(s) adds bandwidth with every fragment \
                 (Daley §5.2), and {n} pipeline(s) stay under the {md_per_server} one metadata \
                 service sustains",
                verdict.label()
            ),
        )
    };
    if access_mode == "private" && md_per_server > 0 && req.pipelines_per_node > md_per_server {
        notes.push(format!(
            "{} pipelines per compute node exceed the {md_per_server} one node's metadata service \
             sustains: spread pipelines over more nodes",
            req.pipelines_per_node
        ));
    }
    if access_mode == "private" {
        notes.push(
            "private namespaces are visible to one compute node only: files shared between \
             pipelines on different nodes must stay in a striped instance or on the PFS"
                .into(),
        );
    }
    // The performance target is the aggregate average demand: what N pipelines need to keep
    // the pace they had when profiled (bursts above it are what extra fragments absorb).
    let bw_each = t2.io_mib * 1024.0 * 1024.0 / t2.wall_time_s.max(1e-9);
    let md_each = t2.metadata_ops as f64 / t2.wall_time_s.max(1e-9);
    let target_bw = bw_each * n as f64;
    let target_md = md_each * n as f64;
    if bound_by == "performance" {
        notes.push(format!(
            "performance, not capacity, sets the size: {n} pipeline(s) need {fragments_for_performance} \
             fragment(s) for bandwidth but only {fragments_for_capacity} for {} of data \
             (Daley §5.2: reserve one fragment per {per_fragment} pipelines here)",
            surge_core::format_bytes(capacity_needed)
        ));
    }
    if req.coupling == Coupling::Tight && pk.pipelines_to_saturate_data_sustained > per_fragment {
        notes.push(format!(
            "this assumes every pipeline does I/O at the same time; if their I/O does not overlap \
             one fragment sustains up to {} pipelines (--coupling loose). Daley predicted 5 and \
             measured 16 for SWarp",
            pk.pipelines_to_saturate_data_sustained
        ));
    }

    let var = if access_mode == "private" {
        "$DW_JOB_PRIVATE"
    } else {
        "$DW_JOB_STRIPED"
    };
    let env_name = persistent_name_for(&p.stage, "env");
    // One capacity, said once: what the fragments give (the capacity need is inside it).
    let capacity = fragments.saturating_mul(granularity);
    let mut directives = vec![format!(
        "#DW jobdw type=scratch access_mode={access_mode} capacity={}",
        capacity_text(capacity)
    )];
    let mut setup_directives = Vec::new();
    if !env.is_empty() {
        match &req.env_list {
            Some(list) => {
                let env_var = format!("$DW_PERSISTENT_STRIPED_{env_name}");
                let env_capacity = env_bytes.div_ceil(granularity).max(1) * granularity;
                setup_directives.push(format!(
                    "#BB create_persistent name={env_name} capacity={} access_mode=striped \
                     type=scratch",
                    capacity_text(env_capacity)
                ));
                setup_directives.push(format!("#DW persistentdw name={env_name}"));
                setup_directives.push(format!(
                    "#DW stage_in type=list source={} destination={env_var}",
                    directive_value(list)
                ));
                directives.push(format!("#DW persistentdw name={env_name}"));
                notes.push(format!(
                    "{} software-environment files ({}) were read: the setup job stages them once \
                     into the persistent instance {env_name}, which every job attaches (Daley \
                     §5.3); point the job at it, e.g. PYTHONPATH under \
                     $DW_PERSISTENT_STRIPED_{env_name} (the list is {list})",
                    env.len(),
                    surge_core::format_bytes(env_bytes),
                ));
            }
            None => notes.push(format!(
                "{} software-environment files ({}) were read: a persistent instance staged once \
                 and shared by every job serves them from the burst buffer (Daley §5.3); give \
                 --env-list FILE for the setup job that creates it",
                env.len(),
                surge_core::format_bytes(env_bytes),
            )),
        }
    }
    let mut used_names: Vec<String> = Vec::new();
    let mut unique = |path: &str, fallback: &str| -> String {
        let base = path
            .rsplit('/')
            .next()
            .filter(|n| !n.is_empty())
            .unwrap_or(fallback)
            .to_string();
        let mut name = base.clone();
        let mut k = 2;
        while used_names.contains(&name) {
            name = format!("{base}-{k}");
            k += 1;
        }
        used_names.push(name.clone());
        name
    };
    for s in &stage_in {
        let name = unique(&s.path, "in");
        directives.push(format!(
            "#DW stage_in source={} destination={} type={}",
            directive_value(&s.path),
            directive_value(&format!("{var}/{name}")),
            s.kind
        ));
    }
    for s in &stage_out {
        let name = unique(&s.path, "out");
        directives.push(format!(
            "#DW stage_out source={} destination={} type={}",
            directive_value(&format!("{var}/{name}")),
            directive_value(&s.path),
            s.kind
        ));
    }
    let target_directive = format!(
        "#DW jobdw type=scratch access_mode={access_mode} capacity={} bandwidth={} metadata={}",
        capacity_text(capacity_needed),
        rate_bytes(target_bw),
        rate_ops(target_md),
    );
    if !data_paths_given {
        notes.push(
            "no --data-path was given to surge profile: stage lists are guessed from paths \
             outside system directories"
                .into(),
        );
    }
    Advice {
        stage: p.stage.clone(),
        verdict,
        pipelines: n,
        coupling: req.coupling,
        capacity_per_pipeline_bytes: per_pipeline,
        capacity_needed_bytes: capacity_needed,
        granularity_bytes: granularity,
        fragments_for_capacity,
        pipelines_per_fragment: per_fragment,
        fragments_for_performance,
        fragments,
        bound_by: bound_by.into(),
        access_mode: access_mode.into(),
        access_mode_reason: access_reason,
        target_bandwidth_bytes_s: target_bw,
        target_metadata_ops_s: target_md,
        keep_on_pfs,
        stage_in,
        stage_out,
        software_environment_instance: if env.is_empty() {
            String::new()
        } else {
            env_name
        },
        software_environment: env,
        software_environment_bytes: env_bytes,
        directives,
        target_directive,
        setup_directives,
        notes,
        summary,
    }
}

/// The terminal rendering.
pub fn render(a: &Advice) -> String {
    use std::fmt::Write;
    let fb = surge_core::format_bytes;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "surge advise: stage {} ({}), {} pipeline(s), sized for {}\n",
        a.stage,
        a.verdict.label(),
        a.pipelines,
        a.coupling.label()
    );
    let _ = writeln!(o, "Capacity and fragments (Daley §5.2)");
    let _ = writeln!(
        o,
        "  capacity per pipeline        {}",
        fb(a.capacity_per_pipeline_bytes)
    );
    let _ = writeln!(
        o,
        "  capacity needed              {}",
        fb(a.capacity_needed_bytes)
    );
    let _ = writeln!(
        o,
        "  fragments for capacity       {}  (granularity {})",
        a.fragments_for_capacity,
        fb(a.granularity_bytes)
    );
    let _ = writeln!(
        o,
        "  fragments for performance    {}  ({} pipelines per fragment)",
        a.fragments_for_performance, a.pipelines_per_fragment
    );
    let _ = writeln!(
        o,
        "  => fragments                 {}  (set by {})",
        a.fragments, a.bound_by
    );
    let _ = writeln!(
        o,
        "\nAccess mode: {}\n  {}",
        a.access_mode, a.access_mode_reason
    );
    if !a.keep_on_pfs.is_empty() {
        let _ = writeln!(
            o,
            "\nHybrid placement: keep on the PFS (small, shared, costly; ExPBB)"
        );
        for k in &a.keep_on_pfs {
            let _ = writeln!(
                o,
                "  {}  ({}, {} processes, {:.1}% of I/O time)",
                k.path,
                fb(k.size_bytes),
                k.processes,
                k.io_time_pct
            );
        }
    }
    let _ = writeln!(
        o,
        "\nStage in ({} task(s)): files read before written",
        a.stage_in.len()
    );
    for s in a.stage_in.iter().take(30) {
        let _ = writeln!(o, "  {:<9} {}  ({})", s.kind, s.path, fb(s.bytes));
    }
    let _ = writeln!(
        o,
        "Stage out ({} task(s)): files written and kept",
        a.stage_out.len()
    );
    for s in a.stage_out.iter().take(30) {
        let _ = writeln!(o, "  {:<9} {}  ({})", s.kind, s.path, fb(s.bytes));
    }
    if !a.software_environment.is_empty() {
        let _ = writeln!(
            o,
            "Software environment: {} files, {}",
            a.software_environment.len(),
            fb(a.software_environment_bytes)
        );
    }
    if !a.setup_directives.is_empty() {
        let _ = writeln!(
            o,
            "\nSetup job, run once (creates the software-environment instance):"
        );
        for d in &a.setup_directives {
            let _ = writeln!(o, "{d}");
        }
    }
    let _ = writeln!(o, "\nJob script lines:");
    for d in &a.directives {
        let _ = writeln!(o, "{d}");
    }
    let _ = writeln!(
        o,
        "\nOr, instead of the #DW jobdw line, by performance target (the pipelines' average \
         demand; `surge run --peaks PEAKS`, or the manager under Slurm, sizes it from the \
         calibrated peaks):"
    );
    let _ = writeln!(o, "{}", a.target_directive);
    if !a.notes.is_empty() {
        let _ = writeln!(o, "\nNotes:");
        for n in &a.notes {
            let _ = writeln!(o, "  - {n}");
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Counters, Process, Source};
    use surge_core::peaks::{MetadataDetail, ProcsAtPeak, PEAKS_SCHEMA};

    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

    fn peaks() -> Peaks {
        Peaks {
            schema: PEAKS_SCHEMA.into(),
            path: "/bb".into(),
            host: "h".into(),
            measured_at: "2026-01-01T00:00:00Z".into(),
            read_bw: 6.0 * GIB,
            write_bw: 6.0 * GIB,
            read_iops: 90_000.0,
            write_iops: 90_000.0,
            write_iops_fsync: 0.0,
            metadata_ops: 25_000.0,
            procs_at_peak: ProcsAtPeak::default(),
            metadata_detail: MetadataDetail::default(),
        }
    }

    fn file(path: &str, c: Counters, procs: u32) -> FileStats {
        FileStats {
            path: path.into(),
            exists_after: None,
            kind: FileKind::Regular,
            processes: procs,
            counters: c,
        }
    }

    /// A SWarp-like pipeline: 1.4 GiB/s while doing I/O, 1 GiB per pipeline.
    fn swarp() -> Profile {
        let mut p = Profile::new("swarp", Source::default());
        p.wall_time_s = 10.0;
        p.data_paths = vec!["/data".into()];
        p.processes = vec![Process::default()];
        let gib = GIB as u64;
        p.files = vec![
            file(
                "/data/in/img.fits",
                Counters {
                    reads: 128,
                    bytes_read: gib / 2,
                    read_time_ns: 350_000_000,
                    large_data_time_ns: 350_000_000,
                    size_seen: gib / 2,
                    max_byte_read: gib / 2,
                    first_read_ns: 5,
                    ..Counters::default()
                },
                1,
            ),
            file(
                "/data/out/resamp.fits",
                Counters {
                    writes: 128,
                    bytes_written: gib / 2,
                    write_time_ns: 350_000_000,
                    large_data_time_ns: 350_000_000,
                    max_byte_written: gib / 2,
                    first_write_ns: 9,
                    ..Counters::default()
                },
                1,
            ),
        ];
        p
    }

    #[test]
    fn bandwidth_bound_stage_is_sized_by_performance_and_striped() {
        let a = advise(
            &swarp(),
            &peaks(),
            &AdviseRequest {
                pipelines: 64,
                pipelines_per_node: 1,
                granularity_bytes: 200 * GIB as u64,
                small_file_bytes: 1 << 20,
                coupling: Coupling::Tight,
                env_list: None,
            },
        );
        assert_eq!(a.verdict, Bound::BandwidthBound);
        assert_eq!(a.access_mode, "striped");
        // 1 GiB at 0.7 s = 1463 MiB/s per pipeline, 23.8% of 6 GiB/s: 5 pipelines per fragment.
        assert_eq!(a.pipelines_per_fragment, 5);
        assert_eq!(a.fragments_for_performance, 13);
        assert_eq!(a.fragments_for_capacity, 1);
        assert_eq!(a.bound_by, "performance");
        assert!(a.directives[0]
            .starts_with("#DW jobdw type=scratch access_mode=striped capacity=2600GiB"));
        assert!(a
            .directives
            .iter()
            .any(|d| d == "#DW stage_in source=/data/in/img.fits destination=$DW_JOB_STRIPED/img.fits type=file"));
        assert!(a
            .directives
            .iter()
            .any(|d| d.starts_with("#DW stage_out source=$DW_JOB_STRIPED/resamp.fits")));
    }

    #[test]
    fn small_shared_costly_files_stay_on_the_pfs() {
        let mut p = swarp();
        p.files.push(file(
            "/data/namelist.input",
            Counters {
                opens: 1280,
                reads: 1280,
                bytes_read: 12 * 1024 * 1280,
                meta_time_ns: 200_000_000,
                size_seen: 12 * 1024,
                ..Counters::default()
            },
            1280,
        ));
        let a = advise(
            &p,
            &peaks(),
            &AdviseRequest {
                pipelines: 1,
                pipelines_per_node: 1,
                granularity_bytes: 200 * GIB as u64,
                small_file_bytes: 1 << 20,
                coupling: Coupling::Tight,
                env_list: None,
            },
        );
        assert_eq!(a.keep_on_pfs.len(), 1);
        assert_eq!(a.keep_on_pfs[0].path, "/data/namelist.input");
    }

    /// A stage named like a workflow step (dashes, a leading digit), with a software
    /// environment, inputs whose names collide and a path with a space: every line advise
    /// prints parses with the directive parser as printed.
    #[test]
    fn printed_lines_parse_with_surges_own_parser() {
        let mut p = swarp();
        p.stage = "1st py-stage".into();
        p.data_paths = vec!["/data".into()];
        let lib = file(
            "/opt/conda/lib/python3.11/site-packages/numpy/core.so",
            Counters {
                opens: 1,
                reads: 4,
                bytes_read: 1 << 20,
                size_seen: 1 << 20,
                first_read_ns: 1,
                ..Counters::default()
            },
            1,
        );
        p.files.push(lib);
        let mut twin = p.files[0].clone();
        twin.path = "/data/other run/img.fits".into();
        p.files.push(twin);
        let a = advise(
            &p,
            &peaks(),
            &AdviseRequest {
                pipelines: 3,
                pipelines_per_node: 1,
                granularity_bytes: 256 << 20,
                small_file_bytes: 1 << 20,
                coupling: Coupling::Loose,
                env_list: Some("/home/u/env list.txt".into()),
            },
        );
        let job = format!("#!/bin/bash\n{}\ntrue\n", a.directives.join("\n"));
        let d = surge_core::directives::parse_script("job.sh", &job)
            .unwrap_or_else(|e| panic!("{e}\n{job}"));
        let jobdw = d.jobdw.expect("a jobdw");
        assert_eq!(jobdw.capacity, a.fragments * (256 << 20));
        assert_eq!(d.persistentdw.len(), 1);
        assert_eq!(d.stage_in.len(), 2, "{job}");
        assert_ne!(d.stage_in[0].destination, d.stage_in[1].destination);
        assert!(
            surge_core::directives::check_persistent_name(&a.software_environment_instance).is_ok(),
            "{}",
            a.software_environment_instance
        );
        let setup = format!("#!/bin/bash\n{}\ntrue\n", a.setup_directives.join("\n"));
        let s = surge_core::directives::parse_script("setup.sh", &setup)
            .unwrap_or_else(|e| panic!("{e}\n{setup}"));
        assert_eq!(s.create_persistent.len(), 1);
        assert_eq!(s.stage_in[0].source, "/home/u/env list.txt");
        assert!(env_list_text(&a).contains(
            "/opt/conda/lib/python3.11/site-packages/numpy/core.so \
             opt/conda/lib/python3.11/site-packages/numpy/core.so"
        ));
        let text = render(&a);
        assert!(!text.contains("Loose"), "{text}");
        // The performance-target line replaces the #DW jobdw one and parses too.
        let alt = job.replacen(&a.directives[0], &a.target_directive, 1);
        let d = surge_core::directives::parse_script("job.sh", &alt)
            .unwrap_or_else(|e| panic!("{e}\n{alt}"));
        let t = d.jobdw.unwrap().targets.expect("targets");
        assert!(t.bandwidth.is_some() && t.metadata.is_some());
        assert!(a.directives.iter().all(|d| !d.starts_with("#SURGE")));
        // One form for `surge run` and Slurm (which passes only `#DW` lines to Surge).
        assert!(a.target_directive.starts_with("#DW jobdw type=scratch "));
    }

    #[test]
    fn capacities_are_printed_exactly() {
        assert_eq!(capacity_text(200 << 30), "200GiB");
        assert_eq!(capacity_text(7 * (256 << 20)), "1792MiB");
        assert_eq!(capacity_text(1), "1MiB");
        assert_eq!(persistent_name_for("py-stage", "env"), "py_stage_env");
        assert_eq!(persistent_name_for("9x", "env"), "s_9x_env");
        assert_eq!(persistent_name_for(&"a".repeat(100), "env").len(), 64);
    }
}
