//! `surge advise`: from a profile and calibrated peaks, an allocation: capacity vs performance
//! fragments (Daley §5.2), access mode (private when metadata-bound, §4.3), hybrid placement
//! (small shared files on the PFS, ExPBB's rule), what to stage in and out (§5.4), a software
//! environment instance (§5.3), and the `#DW` / `#SURGE` lines to paste into a job script.

use crate::model::{FileKind, FileStats, Profile};
use crate::tables::{summarize, Bound, Summary};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use surge_core::peaks::Peaks;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// How the pipelines' I/O overlaps in time, which decides how many share one fragment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Coupling {
    /// Every pipeline does its I/O at the same time: Daley's Table 2 estimate (conservative).
    Tight,
    /// Pipelines do I/O at independent times: one pipeline's demand averaged over its run.
    Loose,
}

#[derive(Clone, Debug)]
pub struct AdviseRequest {
    pub pipelines: u64,
    pub pipelines_per_node: u64,
    pub granularity_bytes: u64,
    pub small_file_bytes: u64,
    pub coupling: Coupling,
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
    pub directives: Vec<String>,
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
        || p.contains(".so.");
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

/// Formats a byte count as a capacity DataWarp accepts (GiB, rounded up).
fn gib(bytes: f64) -> String {
    format!("{}GiB", (bytes / GIB).ceil().max(1.0) as u64)
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
    let env_name = format!(
        "{}-env",
        p.stage
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            })
            .collect::<String>()
    );
    let mut directives = vec![format!(
        "#DW jobdw type=scratch access_mode={access_mode} capacity={}",
        gib(fragments as f64 * granularity as f64)
    )];
    directives.push(format!(
        "#SURGE jobdw bandwidth={} metadata={} capacity={}",
        rate_bytes(target_bw),
        rate_ops(target_md),
        gib(capacity_needed as f64)
    ));
    if !env.is_empty() {
        directives.push(format!("#DW persistentdw name={env_name}"));
    }
    for s in &stage_in {
        let name = s.path.rsplit('/').next().unwrap_or("in");
        directives.push(format!(
            "#DW stage_in source={} destination={var}/{name} type={}",
            s.path, s.kind
        ));
    }
    for s in &stage_out {
        let name = s.path.rsplit('/').next().unwrap_or("out");
        directives.push(format!(
            "#DW stage_out source={var}/{name} destination={} type={}",
            s.path, s.kind
        ));
    }
    if !env.is_empty() {
        notes.push(format!(
            "{} software-environment files ({}) were read: stage them once into a persistent \
             instance shared by every job (`#BB create_persistent name={env_name} capacity={} \
             access_mode=ldbalance type=scratch` in a setup job, Daley §5.3)",
            env.len(),
            surge_core::format_bytes(env_bytes),
            gib(env_bytes as f64)
        ));
    }
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
        software_environment: env,
        software_environment_bytes: env_bytes,
        directives,
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
        "surge advise: stage {} ({}), {} pipeline(s), {:?} coupling\n",
        a.stage,
        a.verdict.label(),
        a.pipelines,
        a.coupling
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
    let _ = writeln!(o, "\nJob script lines:");
    for d in &a.directives {
        let _ = writeln!(o, "{d}");
    }
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
            },
        );
        assert_eq!(a.keep_on_pfs.len(), 1);
        assert_eq!(a.keep_on_pfs[0].path, "/data/namelist.input");
    }
}
