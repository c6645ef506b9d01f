//! Liu et al.'s experiments (§IV) on the shipped examples (`examples/sim/`): Figure 3 (IOR
//! bandwidth vs scale), 4a (runtime with compute phases), 4b (bandwidth vs request size) and the
//! multi-application study of Figures 5 and 6.
//!
//! Each experiment only chooses kernels, parameters and `--set` overrides and runs the normal
//! simulator; nothing here computes a result the simulator did not produce. A `scale` below 1
//! divides node, file-server and rack counts (and a limited core network) by the same factor,
//! keeping per-node data, per-I/O-node data and every bandwidth ratio, so the curves keep their
//! shape at a fraction of the events.

use crate::engine::NS_PER_S;
use crate::kernel::{self, AppSpec};
use crate::model::{simulate, Outcome, SimOptions};
use crate::plot::{Chart, Line};
use crate::report::{series_rows, AppReport};
use crate::system::System;
use anyhow::Context;
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExperimentName {
    Fig3,
    Fig4a,
    Fig4b,
    Multiapp,
    All,
}

impl ExperimentName {
    pub fn as_str(self) -> &'static str {
        match self {
            ExperimentName::Fig3 => "fig3",
            ExperimentName::Fig4a => "fig4a",
            ExperimentName::Fig4b => "fig4b",
            ExperimentName::Multiapp => "multiapp",
            ExperimentName::All => "all",
        }
    }
}

#[derive(Clone, Debug)]
pub struct ExperimentOptions {
    /// Fraction of the paper's scale, in (0, 1].
    pub scale: f64,
    pub seed: u64,
    /// Directory with `systems/` and `kernels/`; `None`: the copies compiled into the binary.
    pub examples: Option<PathBuf>,
    /// Print one line per simulation to stderr.
    pub verbose: bool,
}

impl Default for ExperimentOptions {
    fn default() -> Self {
        ExperimentOptions {
            scale: 1.0,
            seed: 1,
            examples: None,
            verbose: false,
        }
    }
}

/// The shipped examples, compiled in so `surge sim experiment` works from any directory.
const EMBEDDED: &[(&str, &str)] = &[
    (
        "systems/intrepid.toml",
        include_str!("../../../examples/sim/systems/intrepid.toml"),
    ),
    (
        "systems/intrepid-32k.toml",
        include_str!("../../../examples/sim/systems/intrepid-32k.toml"),
    ),
    (
        "kernels/ior.kernel",
        include_str!("../../../examples/sim/kernels/ior.kernel"),
    ),
    (
        "kernels/ior-compute.kernel",
        include_str!("../../../examples/sim/kernels/ior-compute.kernel"),
    ),
    (
        "kernels/plasma.kernel",
        include_str!("../../../examples/sim/kernels/plasma.kernel"),
    ),
    (
        "kernels/astro.kernel",
        include_str!("../../../examples/sim/kernels/astro.kernel"),
    ),
    (
        "kernels/turbulence1.kernel",
        include_str!("../../../examples/sim/kernels/turbulence1.kernel"),
    ),
];

/// Text and display name of an example file.
fn example(opts: &ExperimentOptions, rel: &str) -> anyhow::Result<(String, String)> {
    match &opts.examples {
        Some(dir) => {
            let p = dir.join(rel);
            let text = std::fs::read_to_string(&p)
                .with_context(|| format!("cannot read {}", p.display()))?;
            Ok((text, p.display().to_string()))
        }
        None => EMBEDDED
            .iter()
            .find(|(n, _)| *n == rel)
            .map(|(n, t)| (t.to_string(), format!("examples/sim/{n} (built in)")))
            .ok_or_else(|| anyhow::anyhow!("no built-in example {rel}")),
    }
}

fn system(opts: &ExperimentOptions, rel: &str, sets: &[String]) -> anyhow::Result<System> {
    let (text, origin) = example(opts, rel)?;
    Ok(System::from_toml(&text, &origin, sets)?)
}

fn kernel(
    opts: &ExperimentOptions,
    rel: &str,
    params: &[(&str, String)],
) -> anyhow::Result<Vec<AppSpec>> {
    let (text, origin) = example(opts, rel)?;
    let map: BTreeMap<String, String> = params
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let k = kernel::parse(&text, &origin, &map)?;
    for name in map.keys() {
        anyhow::ensure!(
            k.params.contains_key(name),
            "{origin} does not declare param {name}"
        );
    }
    Ok(k.apps)
}

fn scaled(n: f64, scale: f64) -> u64 {
    ((n * scale).round() as u64).max(1)
}

/// `--set` overrides that shrink a system by `scale` (nodes, servers, racks, core network).
fn scale_sets(base: &System, scale: f64, servers: u32, racks: u32) -> Vec<String> {
    let mut sets = vec![
        format!(
            "compute.nodes={}",
            scaled(f64::from(base.compute.nodes), scale)
        ),
        format!("file_servers.count={}", scaled(f64::from(servers), scale)),
    ];
    let s = scaled(f64::from(servers), scale);
    let r = if racks == 0 {
        0
    } else {
        scaled(f64::from(racks), scale).min(s)
    };
    sets.push(format!("storage.racks={r}"));
    if let Some(core) = base.storage_network.core_bandwidth.0 {
        sets.push(format!(
            "storage_network.core_bandwidth={}/s",
            (core * scale).round() as u64
        ));
    }
    sets
}

const MIB: u64 = 1 << 20;

fn one_run(
    opts: &ExperimentOptions,
    label: &str,
    sys: &System,
    apps: &[AppSpec],
    sim: SimOptions,
) -> anyhow::Result<Outcome> {
    let out = simulate(sys, apps, &sim, None)?;
    if opts.verbose {
        let r = &out.report;
        let perceived: Vec<String> = r
            .apps
            .iter()
            .map(|a| format!("{} {:.2} GiB/s", a.name, a.perceived_write_gib_s))
            .collect();
        eprintln!(
            "  {label}: {} | {:.1} M events in {:.1} s",
            perceived.join(", "),
            r.engine.events as f64 / 1e6,
            r.engine.wall_s
        );
    }
    Ok(out)
}

/// A table cell.
#[derive(Clone, Debug)]
pub enum Cell {
    Text(String),
    Num(f64, usize),
}

impl Cell {
    /// The number in this cell, if it is one.
    pub fn num(&self) -> Option<f64> {
        match self {
            Cell::Num(v, _) if v.is_finite() => Some(*v),
            _ => None,
        }
    }

    fn render(&self) -> String {
        match self {
            Cell::Text(s) => s.clone(),
            Cell::Num(v, _) if !v.is_finite() => "–".to_string(),
            Cell::Num(v, d) => format!("{v:.d$}"),
        }
    }
    fn json(&self) -> serde_json::Value {
        match self {
            Cell::Text(s) => json!(s),
            Cell::Num(v, _) if !v.is_finite() => serde_json::Value::Null,
            Cell::Num(v, _) => json!(v),
        }
    }
}

/// What an experiment produced.
pub struct ExperimentResult {
    pub name: &'static str,
    pub title: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
    /// Observations computed from the rows, in the words of the paper's claims.
    pub findings: Vec<String>,
    /// (file name, SVG).
    pub charts: Vec<(String, String)>,
    /// Extra files (name, content), e.g. time series.
    pub files: Vec<(String, String)>,
    /// Raw per-run data for scripts.
    pub data: serde_json::Value,
}

impl ExperimentResult {
    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "## {}\n", self.title);
        let _ = writeln!(s, "| {} |", self.columns.join(" | "));
        let _ = writeln!(
            s,
            "|{}|",
            self.columns
                .iter()
                .map(|_| "---")
                .collect::<Vec<_>>()
                .join("|")
        );
        for r in &self.rows {
            let cells: Vec<String> = r.iter().map(Cell::render).collect();
            let _ = writeln!(s, "| {} |", cells.join(" | "));
        }
        if !self.findings.is_empty() {
            let _ = writeln!(s);
            for f in &self.findings {
                let _ = writeln!(s, "- {f}");
            }
        }
        s
    }

    pub fn to_json(&self) -> serde_json::Value {
        let rows: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|r| {
                let obj: serde_json::Map<String, serde_json::Value> = self
                    .columns
                    .iter()
                    .zip(r)
                    .map(|(c, v)| (c.clone(), v.json()))
                    .collect();
                serde_json::Value::Object(obj)
            })
            .collect();
        json!({
            "experiment": self.name,
            "title": self.title,
            "rows": rows,
            "findings": self.findings,
            "runs": self.data,
        })
    }

    /// Writes `<name>.md`, `<name>.csv`, `<name>.json`, the charts and extra files.
    pub fn write(&self, dir: &Path) -> anyhow::Result<Vec<String>> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let mut written = Vec::new();
        let mut put = |name: &str, body: &str| -> anyhow::Result<()> {
            let p = dir.join(name);
            std::fs::write(&p, body).with_context(|| format!("cannot write {}", p.display()))?;
            written.push(p.display().to_string());
            Ok(())
        };
        put(&format!("{}.md", self.name), &self.to_markdown())?;
        let mut csv = self.columns.join(",");
        csv.push('\n');
        for r in &self.rows {
            let cells: Vec<String> = r.iter().map(Cell::render).collect();
            csv.push_str(&cells.join(","));
            csv.push('\n');
        }
        put(&format!("{}.csv", self.name), &csv)?;
        put(
            &format!("{}.json", self.name),
            &serde_json::to_string_pretty(&self.to_json())?,
        )?;
        for (n, svg) in &self.charts {
            put(n, svg)?;
        }
        for (n, body) in &self.files {
            put(n, body)?;
        }
        Ok(written)
    }
}

pub fn run(name: ExperimentName, opts: &ExperimentOptions) -> anyhow::Result<ExperimentResult> {
    if opts.verbose {
        eprintln!("{} at scale {}:", name.as_str(), opts.scale);
    }
    match name {
        ExperimentName::Fig3 => fig3(opts),
        ExperimentName::Fig4a => fig4a(opts),
        ExperimentName::Fig4b => fig4b(opts),
        ExperimentName::Multiapp => multiapp(opts),
        ExperimentName::All => anyhow::bail!("'all' is a list of experiments, run them one by one"),
    }
}

/// Process counts of Figures 3 and 4a (2K to 128K), scaled, at least one full I/O node.
fn scale_points(sys: &System, scale: f64) -> Vec<u64> {
    let one_ion = u64::from(sys.compute.nodes_per_ion * sys.compute.processes_per_node);
    (0..7)
        .map(|k| scaled(2048.0 * f64::from(1u32 << k), scale))
        .filter(|&p| p >= one_ion)
        .collect()
}

/// The storage configurations of Figure 3: (label, file servers, racks).
const FULL: (&str, u32, u32) = ("full storage (123 servers)", 123, 16);
const HALF: (&str, u32, u32) = ("half storage (64 servers)", 64, 8);

/// Figure 3's burst buffer: 4 GiB per I/O node at 1.5 GiB/s.
fn fig3_bb(enabled: bool) -> Vec<String> {
    vec![
        format!("burst_buffer.enabled={enabled}"),
        "burst_buffer.capacity=4GiB".into(),
        "burst_buffer.write_bandwidth=1.5GiB/s".into(),
        "burst_buffer.read_bandwidth=1.5GiB/s".into(),
    ]
}

fn sim_opts(opts: &ExperimentOptions, stop_at_app_end: bool) -> SimOptions {
    SimOptions {
        seed: opts.seed,
        stop_when_apps_done: stop_at_app_end,
        ..SimOptions::default()
    }
}

fn perceived(out: &Outcome) -> f64 {
    out.report
        .apps
        .first()
        .map_or(0.0, |a| a.perceived_write_gib_s)
}

fn fig3(opts: &ExperimentOptions) -> anyhow::Result<ExperimentResult> {
    let base = system(opts, "systems/intrepid.toml", &[])?;
    let points = scale_points(&base, opts.scale);
    let configs = [(FULL, true), (HALF, true), (FULL, false), (HALF, false)];
    let mut rows = Vec::new();
    let mut lines: Vec<Vec<(f64, f64)>> = vec![Vec::new(); configs.len()];
    let mut data = Vec::new();
    let tree = base.ion.tree_bandwidth.0.unwrap_or(f64::INFINITY);
    for &procs in &points {
        let apps = kernel(opts, "kernels/ior.kernel", &[("procs", procs.to_string())])?;
        let mut row = vec![Cell::Num(procs as f64, 0)];
        let ions = procs.div_ceil(u64::from(
            base.compute.nodes_per_ion * base.compute.processes_per_node,
        ));
        for (i, ((label, servers, racks), bb)) in configs.iter().enumerate() {
            let mut sets = scale_sets(&base, opts.scale, *servers, *racks);
            sets.extend(fig3_bb(*bb));
            let sys = system(opts, "systems/intrepid.toml", &sets)?;
            let tag = format!("{} {label} procs={procs}", if *bb { "BB" } else { "no BB" });
            let out = one_run(opts, &tag, &sys, &apps, sim_opts(opts, true))?;
            let bw = perceived(&out);
            row.push(Cell::Num(bw, 2));
            lines[i].push((procs as f64, bw));
            data.push(json!({"procs": procs, "bb": bb, "file_servers": sys.file_servers.count,
                "perceived_gib_s": bw, "events": out.report.engine.events, "wall_s": out.report.engine.wall_s}));
        }
        row.push(Cell::Num(ions as f64 * tree / (1u64 << 30) as f64, 2));
        rows.push(row);
    }
    let names = [
        "BB, full storage",
        "BB, half storage",
        "no BB, full storage",
        "no BB, half storage",
    ];
    let mut chart = Chart::new(
        "IOR perceived write bandwidth (Liu Fig. 3)",
        "processes",
        "GiB/s",
    )
    .log2_x()
    .log2_y()
    .markers();
    for (i, l) in lines.iter().enumerate() {
        let line = Line::new(names[i], l.clone());
        chart.line(if i >= 2 { line.dashed() } else { line });
    }
    let mut findings = Vec::new();
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        let get = |r: &Vec<Cell>, i: usize| match r[i] {
            Cell::Num(v, _) => v,
            _ => 0.0,
        };
        let (p0, p1) = (get(first, 0), get(last, 0));
        let growth = get(last, 1) / get(first, 1).max(1e-12);
        findings.push(format!(
            "With a burst buffer, perceived bandwidth grows {:.1}x for {:.0}x more processes ({:.2} -> {:.2} GiB/s, full storage); the tree limit (I/O nodes x 700 MiB/s) is {:.2} GiB/s at the largest scale.",
            growth, p1 / p0, get(first, 1), get(last, 1), get(last, 5)
        ));
        findings.push(format!(
            "Without a burst buffer it flattens at the storage limit: {:.2} GiB/s with full storage and {:.2} GiB/s with half ({:.0}% of full) at {:.0} processes.",
            get(last, 3), get(last, 4), 100.0 * get(last, 4) / get(last, 3).max(1e-12), p1
        ));
        findings.push(format!(
            "With a burst buffer, half the storage gives {:.0}% of the full-storage bandwidth at the largest scale.",
            100.0 * get(last, 2) / get(last, 1).max(1e-12)
        ));
    }
    Ok(ExperimentResult {
        name: "fig3",
        title: format!(
            "Figure 3: IOR perceived write bandwidth (GiB/s) vs processes, scale {}",
            opts.scale
        ),
        columns: vec![
            "processes".into(),
            "BB full".into(),
            "BB half".into(),
            "no BB full".into(),
            "no BB half".into(),
            "tree limit".into(),
        ],
        rows,
        findings,
        charts: vec![("fig3.svg".into(), chart.to_svg())],
        files: Vec::new(),
        data: json!(data),
    })
}

fn fig4a(opts: &ExperimentOptions) -> anyhow::Result<ExperimentResult> {
    let base = system(opts, "systems/intrepid.toml", &[])?;
    let points = scale_points(&base, opts.scale);
    // (label, block per phase, burst buffer)
    let configs = [
        ("no I/O", "0", false),
        ("I/O, no BB", "80MiB", false),
        ("I/O, 20 GiB BB", "80MiB", true),
    ];
    let mut rows = Vec::new();
    let mut lines: Vec<Vec<(f64, f64)>> = vec![Vec::new(); configs.len()];
    let mut data = Vec::new();
    for &procs in &points {
        let mut row = vec![Cell::Num(procs as f64, 0)];
        for (i, (label, block, bb)) in configs.iter().enumerate() {
            let apps = kernel(
                opts,
                "kernels/ior-compute.kernel",
                &[("procs", procs.to_string()), ("block", block.to_string())],
            )?;
            let mut sets = scale_sets(&base, opts.scale, FULL.1, FULL.2);
            sets.push(format!("burst_buffer.enabled={bb}"));
            sets.push("burst_buffer.capacity=20GiB".into());
            sets.push("burst_buffer.write_bandwidth=1.5GiB/s".into());
            sets.push("burst_buffer.read_bandwidth=1.5GiB/s".into());
            let sys = system(opts, "systems/intrepid.toml", &sets)?;
            let out = one_run(
                opts,
                &format!("{label} procs={procs}"),
                &sys,
                &apps,
                sim_opts(opts, false),
            )?;
            let a = &out.report.apps[0];
            let runtime = a.runtime_s.unwrap_or(f64::NAN);
            row.push(Cell::Num(runtime, 1));
            lines[i].push((procs as f64, runtime));
            data.push(
                json!({"procs": procs, "config": label, "runtime_s": runtime,
                "write_time_s": a.write_time_s, "commit_wait_max_s": a.commit_wait_max_s,
                "bb_overflow_bytes": a.bb_overflow_bytes, "events": out.report.engine.events}),
            );
        }
        rows.push(row);
    }
    let mut chart = Chart::new(
        "Runtime with two 5-minute compute phases (Liu Fig. 4a)",
        "processes",
        "runtime (s)",
    )
    .log2_x()
    .markers();
    for (i, l) in lines.iter().enumerate() {
        chart.line(Line::new(configs[i].0, l.clone()));
    }
    let mut findings = Vec::new();
    if let Some(last) = rows.last() {
        let get = |i: usize| match last[i] {
            Cell::Num(v, _) => v,
            _ => 0.0,
        };
        let io_cost_no_bb = get(2) - get(1);
        let io_cost_bb = get(3) - get(1);
        findings.push(format!(
            "At {:.0} processes: {:.0} s without I/O, {:.0} s with I/O and no burst buffer (+{:.0} s), {:.0} s with the burst buffer (+{:.0} s, {:.0}% of the I/O cost saved by overlapping the drain with computation).",
            get(0), get(1), get(2), io_cost_no_bb, get(3), io_cost_bb,
            100.0 * (1.0 - io_cost_bb / io_cost_no_bb.max(1e-12))
        ));
    }
    Ok(ExperimentResult {
        name: "fig4a",
        title: format!(
            "Figure 4a: application runtime (s) with compute phases, scale {}",
            opts.scale
        ),
        columns: vec![
            "processes".into(),
            "no I/O".into(),
            "I/O no BB".into(),
            "I/O with BB".into(),
        ],
        rows,
        findings,
        charts: vec![("fig4a.svg".into(), chart.to_svg())],
        files: Vec::new(),
        data: json!(data),
    })
}

fn fig4b(opts: &ExperimentOptions) -> anyhow::Result<ExperimentResult> {
    let base = system(opts, "systems/intrepid.toml", &[])?;
    let procs = scaled(32768.0, opts.scale).max(u64::from(
        base.compute.nodes_per_ion * base.compute.processes_per_node,
    ));
    let mut rows = Vec::new();
    let mut lines: Vec<Vec<(f64, f64)>> = vec![Vec::new(); 2];
    let mut data = Vec::new();
    for req_mib in [1u64, 2, 4, 8, 16] {
        let apps = kernel(
            opts,
            "kernels/ior.kernel",
            &[
                ("procs", procs.to_string()),
                ("request", format!("{req_mib}MiB")),
                ("block", format!("{}MiB", 4 * req_mib)),
            ],
        )?;
        let mut row = vec![Cell::Num(req_mib as f64, 0)];
        for (i, bb) in [true, false].into_iter().enumerate() {
            let mut sets = scale_sets(&base, opts.scale, FULL.1, FULL.2);
            sets.extend(fig3_bb(bb));
            let sys = system(opts, "systems/intrepid.toml", &sets)?;
            let label = format!("{} request={req_mib}MiB", if bb { "BB" } else { "no BB" });
            let out = one_run(opts, &label, &sys, &apps, sim_opts(opts, true))?;
            let a = &out.report.apps[0];
            row.push(Cell::Num(a.perceived_write_gib_s, 2));
            if bb {
                row.push(Cell::Num(
                    100.0 * a.bb_overflow_bytes as f64 / a.write_bytes.max(1) as f64,
                    0,
                ));
            }
            lines[i].push(((req_mib * MIB) as f64 / MIB as f64, a.perceived_write_gib_s));
            data.push(
                json!({"request_mib": req_mib, "bb": bb, "perceived_gib_s": a.perceived_write_gib_s,
                "bb_overflow_bytes": a.bb_overflow_bytes, "write_bytes": a.write_bytes}),
            );
        }
        rows.push(row);
    }
    let mut chart = Chart::new(
        &format!("IOR bandwidth vs request size, {procs} processes, 4 GiB BB (Liu Fig. 4b)"),
        "request size (MiB)",
        "GiB/s",
    )
    .log2_x()
    .markers();
    chart.line(Line::new("4 GiB burst buffer", lines[0].clone()));
    chart.line(Line::new("no burst buffer", lines[1].clone()).dashed());
    let mut findings = Vec::new();
    let num = |r: &Vec<Cell>, i: usize| match r[i] {
        Cell::Num(v, _) => v,
        _ => 0.0,
    };
    if let Some((best, _)) = rows
        .iter()
        .enumerate()
        .max_by(|a, b| num(a.1, 1).total_cmp(&num(b.1, 1)))
    {
        findings.push(format!(
            "With the burst buffer the bandwidth peaks at {:.0} MiB requests ({:.2} GiB/s, {:.0}% overflow); at {:.0} MiB {:.0}% of the data overflows and the bandwidth drops to {:.2} GiB/s (no BB: {:.2} GiB/s).",
            num(&rows[best], 0), num(&rows[best], 1), num(&rows[best], 2),
            num(rows.last().unwrap_or(&rows[best]), 0),
            num(rows.last().unwrap_or(&rows[best]), 2),
            num(rows.last().unwrap_or(&rows[best]), 1),
            num(rows.last().unwrap_or(&rows[best]), 3),
        ));
    }
    Ok(ExperimentResult {
        name: "fig4b",
        title: format!(
            "Figure 4b: IOR perceived bandwidth (GiB/s) vs request size, {procs} processes, scale {}",
            opts.scale
        ),
        columns: vec![
            "request MiB".into(),
            "BB".into(),
            "BB overflow %".into(),
            "no BB".into(),
        ],
        rows,
        findings,
        charts: vec![("fig4b.svg".into(), chart.to_svg())],
        files: Vec::new(),
        data: json!(data),
    })
}

/// One configuration of the multi-application study.
pub struct MultiappRun {
    pub label: &'static str,
    pub bb: bool,
    pub half: bool,
    pub outcome: Outcome,
}

/// Runs the multi-application study: PlasmaPhysics (16K nodes), AstroPhysics and Turbulence1
/// (8K nodes each) for 5 simulated hours, burst buffer off/on x full/half storage.
pub fn multiapp_runs(opts: &ExperimentOptions) -> anyhow::Result<Vec<MultiappRun>> {
    let base = system(opts, "systems/intrepid-32k.toml", &[])?;
    let s = opts.scale;
    let mut apps = Vec::new();
    for (k, nodes) in [
        ("kernels/plasma.kernel", 16384.0),
        ("kernels/astro.kernel", 8192.0),
        ("kernels/turbulence1.kernel", 8192.0),
    ] {
        apps.extend(kernel(opts, k, &[("nodes", scaled(nodes, s).to_string())])?);
    }
    let mut runs = Vec::new();
    for (label, bb, half) in [
        ("(a) no BB, full storage", false, false),
        ("(b) no BB, half storage", false, true),
        ("(c) BB, full storage", true, false),
        ("(d) BB, half storage", true, true),
    ] {
        let (servers, racks) = if half { (64, 8) } else { (128, 16) };
        let mut sets = scale_sets(&base, s, servers, racks);
        sets.push(format!("burst_buffer.enabled={bb}"));
        let sys = system(opts, "systems/intrepid-32k.toml", &sets)?;
        let sim = SimOptions {
            seed: opts.seed,
            until: Some(5 * 3600 * NS_PER_S),
            ..SimOptions::default()
        };
        let outcome = one_run(opts, label, &sys, &apps, sim)?;
        runs.push(MultiappRun {
            label,
            bb,
            half,
            outcome,
        });
    }
    Ok(runs)
}

fn multiapp(opts: &ExperimentOptions) -> anyhow::Result<ExperimentResult> {
    let runs = multiapp_runs(opts)?;
    let mut rows = Vec::new();
    let mut data = Vec::new();
    let mut charts = Vec::new();
    let mut files = Vec::new();
    for r in &runs {
        let rep = &r.outcome.report;
        for a in &rep.apps {
            rows.push(app_row(r.label, a));
        }
        let t = &rep.totals;
        rows.push(vec![
            Cell::Text(r.label.to_string()),
            Cell::Text("storage".into()),
            Cell::Num(t.pfs_written_bytes as f64 / (1u64 << 40) as f64, 2),
            Cell::Num(t.last_drain_s.unwrap_or(f64::NAN), 0),
            Cell::Num(t.lun_utilization * 100.0, 1),
            Cell::Num(f64::NAN, 0),
            Cell::Num(f64::NAN, 0),
        ]);
        data.push(json!({"config": r.label, "report": rep}));
        let rows_ts = series_rows(&r.outcome.series, rep.system.luns);
        let letter = &r.label[1..2];
        let ncols = 9;
        let mut cn = Chart::new(
            &format!(
                "Fig. 5{letter}: data rate at the compute nodes, {}",
                &r.label[4..]
            ),
            "simulated time (s)",
            "GiB/s (10 s average)",
        );
        for (i, a) in rep.apps.iter().enumerate() {
            cn.line(Line::new(
                &a.name,
                rows_ts.iter().map(|row| (row[0], row[ncols + i])).collect(),
            ));
        }
        charts.push((format!("fig5{letter}.svg"), cn.to_svg()));
        let mut st = Chart::new(
            &format!(
                "Fig. 6{letter}: data rate at the storage servers, {}",
                &r.label[4..]
            ),
            "simulated time (s)",
            "GiB/s (10 s average)",
        );
        st.line(Line::new(
            "write",
            rows_ts.iter().map(|row| (row[0], row[3])).collect(),
        ));
        charts.push((format!("fig6{letter}.svg"), st.to_svg()));
        let mut csv =
            String::from("time_s,cn_gib_s,storage_gib_s,bb_occupancy_gib,lun_utilization");
        for a in &rep.apps {
            let _ = write!(csv, ",{}_cn_gib_s", a.name);
        }
        csv.push('\n');
        for row in &rows_ts {
            let _ = write!(
                csv,
                "{:.0},{:.4},{:.4},{:.4},{:.4}",
                row[0],
                row[1] + row[2],
                row[3] + row[4],
                row[7],
                row[8]
            );
            for i in 0..rep.apps.len() {
                let _ = write!(csv, ",{:.4}", row[ncols + i]);
            }
            csv.push('\n');
        }
        files.push((format!("series_{letter}.csv"), csv));
    }
    let findings = multiapp_findings(&runs);
    Ok(ExperimentResult {
        name: "multiapp",
        title: format!(
            "Figures 5-6: PlasmaPhysics + AstroPhysics + Turbulence1 for 5 simulated hours, scale {}",
            opts.scale
        ),
        columns: vec![
            "configuration".into(),
            "app".into(),
            "written TiB".into(),
            "runtime s / last drain s".into(),
            "perceived GiB/s / LUN busy %".into(),
            "write time s".into(),
            "BB absorbed %".into(),
        ],
        rows,
        findings,
        charts,
        files,
        data: json!(data),
    })
}

fn app_row(label: &str, a: &AppReport) -> Vec<Cell> {
    vec![
        Cell::Text(label.to_string()),
        Cell::Text(a.name.clone()),
        Cell::Num(a.write_bytes as f64 / (1u64 << 40) as f64, 2),
        Cell::Num(a.runtime_s.unwrap_or(f64::NAN), 0),
        Cell::Num(a.perceived_write_gib_s, 2),
        Cell::Num(a.write_time_s, 0),
        Cell::Num(
            100.0 * a.bb_absorbed_bytes as f64 / a.write_bytes.max(1) as f64,
            0,
        ),
    ]
}

/// The paper's claims about Figures 5 and 6, measured on the runs.
pub fn multiapp_findings(runs: &[MultiappRun]) -> Vec<String> {
    let find = |bb: bool, half: bool| runs.iter().find(|r| r.bb == bb && r.half == half);
    let mut out = Vec::new();
    if let (Some(full), Some(half)) = (find(true, false), find(true, true)) {
        let ratios: Vec<String> = full
            .outcome
            .report
            .apps
            .iter()
            .zip(&half.outcome.report.apps)
            .map(|(f, h)| {
                format!(
                    "{} {:.0}%",
                    f.name,
                    100.0 * h.perceived_write_gib_s / f.perceived_write_gib_s.max(1e-12)
                )
            })
            .collect();
        out.push(format!(
            "With burst buffers, half the storage keeps the perceived bandwidth of each application (half/full: {}).",
            ratios.join(", ")
        ));
        out.push(format!(
            "With burst buffers, LUNs are busy {:.1}% of the time with full storage and {:.1}% with half; the last drain ends at {:.0} s and {:.0} s.",
            full.outcome.report.totals.lun_utilization * 100.0,
            half.outcome.report.totals.lun_utilization * 100.0,
            full.outcome.report.totals.last_drain_s.unwrap_or(f64::NAN),
            half.outcome.report.totals.last_drain_s.unwrap_or(f64::NAN),
        ));
    }
    if let (Some(full), Some(half)) = (find(false, false), find(false, true)) {
        let ratios: Vec<String> = full
            .outcome
            .report
            .apps
            .iter()
            .zip(&half.outcome.report.apps)
            .map(|(f, h)| {
                format!(
                    "{} {:.0}%",
                    f.name,
                    100.0 * h.perceived_write_gib_s / f.perceived_write_gib_s.max(1e-12)
                )
            })
            .collect();
        out.push(format!(
            "Without burst buffers, halving the storage cuts the perceived bandwidth (half/full: {}).",
            ratios.join(", ")
        ));
    }
    if let (Some(nobb), Some(bb)) = (find(false, false), find(true, false)) {
        let ratios: Vec<String> = nobb
            .outcome
            .report
            .apps
            .iter()
            .zip(&bb.outcome.report.apps)
            .map(|(n, b)| {
                format!(
                    "{} {:.1}x",
                    n.name,
                    b.perceived_write_gib_s / n.perceived_write_gib_s.max(1e-12)
                )
            })
            .collect();
        out.push(format!(
            "Burst buffers accelerate the perceived bandwidth under the mixed workload (BB/no BB, full storage: {}).",
            ratios.join(", ")
        ));
    }
    out
}
