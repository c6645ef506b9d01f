//! What a run reports: the summary (JSON schema `surge.sim/1`, printed by `--json` and written
//! to `summary.json`), the human table, and the time series as CSV, JSON and SVG plots.

use crate::engine::secs;
use crate::model::stats::Series;
use crate::plot::{Chart, Line};
use crate::system::System;
use crate::units::{format_duration, format_rate};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;
use surge_core::format_bytes;

pub const SCHEMA: &str = "surge.sim/1";

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub schema: String,
    pub system: SystemSummary,
    pub apps: Vec<AppReport>,
    pub totals: Totals,
    pub engine: EngineStats,
}

#[derive(Clone, Debug, Serialize)]
pub struct SystemSummary {
    pub name: String,
    pub compute_nodes: u32,
    pub ions: u32,
    pub file_servers: u32,
    pub luns: u32,
    pub racks: u32,
    pub burst_buffer: bool,
    pub bb_capacity_bytes: u64,
    pub drain: String,
    pub stripe_bytes: u64,
}

impl SystemSummary {
    pub fn of(sys: &System) -> Self {
        SystemSummary {
            name: sys.name.clone(),
            compute_nodes: sys.compute.nodes,
            ions: sys.ions(),
            file_servers: sys.file_servers.count,
            luns: sys.luns(),
            racks: sys.storage.racks,
            burst_buffer: sys.burst_buffer.enabled,
            bb_capacity_bytes: sys.burst_buffer.capacity.0,
            drain: format!("{:?}", sys.burst_buffer.drain).to_lowercase(),
            stripe_bytes: sys.file_servers.stripe_size.0,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct AppReport {
    pub name: String,
    /// `file:line` of the kernel's `app` statement.
    pub origin: String,
    pub processes: u32,
    pub per_node: u32,
    pub first_node: u32,
    pub nodes: u32,
    pub ions: u32,
    pub finished: bool,
    /// From the start of the run to the end of the last process (compute + I/O + commits).
    pub runtime_s: Option<f64>,
    pub write_bytes: u64,
    pub read_bytes: u64,
    /// Time in I/O phases: the union over phases of [first process in, last process out].
    pub io_time_s: f64,
    pub write_time_s: f64,
    pub read_time_s: f64,
    /// Bytes written / write-phase time, the bandwidth the application sees (Liu Fig. 3).
    pub perceived_write_gib_s: f64,
    pub perceived_read_gib_s: f64,
    pub io_phases: u64,
    pub bb_absorbed_bytes: u64,
    pub direct_write_bytes: u64,
    /// Direct writes made because the burst buffer was full (a subset of `direct_write_bytes`).
    pub bb_overflow_bytes: u64,
    pub read_from_bb_bytes: u64,
    pub read_from_pfs_bytes: u64,
    pub commits: u64,
    pub commit_wait_max_s: f64,
    pub commit_wait_mean_s: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Totals {
    pub simulated_s: f64,
    /// `completed` (all work done, buffers drained), `until` (--until reached) or `apps_done`
    /// (--stop-at-app-end).
    pub stopped_by: String,
    pub apps_written_bytes: u64,
    pub pfs_written_bytes: u64,
    pub pfs_read_bytes: u64,
    pub bb_absorbed_bytes: u64,
    pub bb_drained_bytes: u64,
    /// Burst-buffer bytes still reserved or not drained when the run stopped.
    pub bb_left_bytes: u64,
    pub bb_peak_occupancy_bytes: u64,
    pub last_drain_s: Option<f64>,
    /// Mean fraction of time the LUNs were busy.
    pub lun_utilization: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct EngineStats {
    pub seed: u64,
    pub events: u64,
    pub wall_s: f64,
    pub events_per_s: f64,
    pub peak_queue: u64,
    pub processes: u64,
}

const GIB: f64 = (1u64 << 30) as f64;

impl Report {
    /// The human summary printed by `surge sim run`.
    pub fn to_text(&self) -> String {
        let s = &self.system;
        let mut out = String::new();
        let bb = if s.burst_buffer {
            format!(
                "burst buffer {} per ION ({} drain)",
                format_bytes(s.bb_capacity_bytes),
                s.drain
            )
        } else {
            "no burst buffer".to_string()
        };
        let _ = writeln!(
            out,
            "system {}: {} compute nodes, {} I/O nodes, {} file servers ({} LUNs), {}",
            s.name, s.compute_nodes, s.ions, s.file_servers, s.luns, bb
        );
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<14} {:>8} {:>13} {:>10} {:>10} {:>10} {:>12} {:>12} {:>10} {:>10}",
            "app",
            "procs",
            "nodes",
            "runtime",
            "written",
            "read",
            "write time",
            "perceived",
            "absorbed",
            "overflow"
        );
        for a in &self.apps {
            let runtime = a
                .runtime_s
                .map(|r| format_duration((r * 1e9) as u64))
                .unwrap_or_else(|| "unfinished".to_string());
            let _ = writeln!(
                out,
                "{:<14} {:>8} {:>13} {:>10} {:>10} {:>10} {:>12} {:>12} {:>10} {:>10}",
                a.name,
                a.processes,
                format!("{}-{}", a.first_node, a.first_node + a.nodes - 1),
                runtime,
                format_bytes(a.write_bytes),
                format_bytes(a.read_bytes),
                format_duration((a.write_time_s * 1e9) as u64),
                format_rate(a.perceived_write_gib_s * GIB),
                format_bytes(a.bb_absorbed_bytes),
                format_bytes(a.bb_overflow_bytes),
            );
            if a.read_bytes > 0 {
                let _ = writeln!(
                    out,
                    "{:<14} reads: {} in {}, perceived {} ({} from the burst buffer)",
                    "",
                    format_bytes(a.read_bytes),
                    format_duration((a.read_time_s * 1e9) as u64),
                    format_rate(a.perceived_read_gib_s * GIB),
                    format_bytes(a.read_from_bb_bytes)
                );
            }
            if a.commits > 0 {
                let _ = writeln!(
                    out,
                    "{:<14} commits: {}, wait mean {}, max {}",
                    "",
                    a.commits,
                    format_duration((a.commit_wait_mean_s * 1e9) as u64),
                    format_duration((a.commit_wait_max_s * 1e9) as u64)
                );
            }
        }
        let t = &self.totals;
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "storage: {} written by applications, {} written to the file servers, {} read; LUNs busy {:.1}% of the time",
            format_bytes(t.apps_written_bytes),
            format_bytes(t.pfs_written_bytes),
            format_bytes(t.pfs_read_bytes),
            t.lun_utilization * 100.0
        );
        if s.burst_buffer {
            let drained = match t.last_drain_s {
                Some(d) => format!(", last drain at {}", format_duration((d * 1e9) as u64)),
                None => String::new(),
            };
            let _ = writeln!(
                out,
                "burst buffers: {} absorbed, {} drained, peak occupancy {}{}{}",
                format_bytes(t.bb_absorbed_bytes),
                format_bytes(t.bb_drained_bytes),
                format_bytes(t.bb_peak_occupancy_bytes),
                drained,
                if t.bb_left_bytes > 0 {
                    format!(
                        ", {} not drained when the run stopped",
                        format_bytes(t.bb_left_bytes)
                    )
                } else {
                    String::new()
                }
            );
        }
        let e = &self.engine;
        let _ = writeln!(
            out,
            "simulated {} ({}) with {} events in {:.2} s of wall time: {:.2} M events/s (seed {})",
            format_duration((t.simulated_s * 1e9) as u64),
            t.stopped_by,
            e.events,
            e.wall_s,
            e.events_per_s / 1e6,
            e.seed
        );
        out
    }
}

/// Column names of the time-series CSV, before the per-application columns.
const SERIES_COLUMNS: &[&str] = &[
    "time_s",
    "cn_write_gib_s",
    "cn_read_gib_s",
    "storage_write_gib_s",
    "storage_read_gib_s",
    "bb_in_gib_s",
    "bb_out_gib_s",
    "bb_occupancy_gib",
    "lun_utilization",
];

/// The time series as rows of numbers (rates in GiB/s averaged over each bin).
pub fn series_rows(series: &Series, luns: u32) -> Vec<Vec<f64>> {
    let dt = secs(series.sample_ns);
    let rate = |b: u64| b as f64 / GIB / dt;
    series
        .bins
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let mut row = vec![
                i as f64 * dt,
                rate(b.cn_write_bytes),
                rate(b.cn_read_bytes),
                rate(b.storage_write_bytes),
                rate(b.storage_read_bytes),
                rate(b.bb_in_bytes),
                rate(b.bb_out_bytes),
                b.bb_occupancy_bytes as f64 / GIB,
                b.lun_busy_ns as f64 / (series.sample_ns as f64 * f64::from(luns.max(1))),
            ];
            for a in 0..series.apps {
                row.push(rate(series.app_cn[i * series.apps + a]));
            }
            row
        })
        .collect()
}

fn series_header(report: &Report) -> Vec<String> {
    let mut cols: Vec<String> = SERIES_COLUMNS.iter().map(|s| s.to_string()).collect();
    for a in &report.apps {
        cols.push(format!("{}_cn_gib_s", a.name));
    }
    cols
}

/// Writes `summary.json`, `series.csv`, `series.json` and the plots into `dir`.
pub fn write_outputs(dir: &Path, report: &Report, series: &Series) -> anyhow::Result<Vec<String>> {
    use anyhow::Context;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let write = |name: &str, body: &str| -> anyhow::Result<String> {
        let p = dir.join(name);
        std::fs::write(&p, body).with_context(|| format!("cannot write {}", p.display()))?;
        Ok(p.display().to_string())
    };
    let mut written = Vec::new();
    written.push(write(
        "summary.json",
        &serde_json::to_string_pretty(report)?,
    )?);
    let rows = series_rows(series, report.system.luns);
    let header = series_header(report);
    let mut csv = header.join(",");
    csv.push('\n');
    for r in &rows {
        let cells: Vec<String> = r.iter().map(|v| format!("{v:.6}")).collect();
        csv.push_str(&cells.join(","));
        csv.push('\n');
    }
    written.push(write("series.csv", &csv)?);
    let mut obj = serde_json::Map::new();
    obj.insert("schema".into(), "surge.sim.series/1".into());
    obj.insert("sample_s".into(), secs(series.sample_ns).into());
    for (c, name) in header.iter().enumerate() {
        let col: Vec<f64> = rows.iter().map(|r| r[c]).collect();
        obj.insert(name.clone(), serde_json::to_value(col)?);
    }
    written.push(write("series.json", &serde_json::to_string(&obj)?)?);
    let col = |c: usize| -> Vec<(f64, f64)> { rows.iter().map(|r| (r[0], r[c])).collect() };
    let sample = format_duration(series.sample_ns);
    let mut cn = Chart::new(
        &format!("Data rate at the compute nodes ({sample} average)"),
        "simulated time (s)",
        "GiB/s",
    );
    for (a, app) in report.apps.iter().enumerate() {
        cn.line(Line::new(
            &format!("{} (write+read)", app.name),
            col(SERIES_COLUMNS.len() + a),
        ));
    }
    written.push(write("cn_rate.svg", &cn.to_svg())?);
    let mut st = Chart::new(
        &format!("Data rate at the storage servers ({sample} average)"),
        "simulated time (s)",
        "GiB/s",
    );
    st.line(Line::new("write", col(3)));
    if rows.iter().any(|r| r[4] > 0.0) {
        st.line(Line::new("read", col(4)));
    }
    written.push(write("storage_rate.svg", &st.to_svg())?);
    if report.system.burst_buffer {
        let mut bb = Chart::new(
            "Burst-buffer occupancy (all I/O nodes)",
            "simulated time (s)",
            "GiB",
        );
        bb.line(Line::new("occupancy", col(7)));
        written.push(write("bb_occupancy.svg", &bb.to_svg())?);
    }
    Ok(written)
}
