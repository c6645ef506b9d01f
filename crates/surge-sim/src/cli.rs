//! The `surge sim` verb: `run` a system with kernels, `check` files, and reproduce the paper's
//! `experiment`s. Flags and help live here; the work is in the library.

use crate::engine::NS_PER_S;
use crate::experiment::{self, ExperimentName, ExperimentOptions};
use crate::model::{simulate, Progress, SimOptions};
use crate::report::write_outputs;
use crate::system::System;
use crate::units::{format_duration, parse_duration};
use crate::{kernel, load_kernels, parse_params};
use anyhow::Context;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

const ABOUT: &str = "Simulate compute nodes, burst buffers and the PFS (Liu et al.'s CODES model)";

const LONG_ABOUT: &str = "\
Simulate compute nodes, I/O nodes with SSD burst buffers, and parallel-file-system servers with \
their disks, event by event, to see what a burst buffer does for a workload before it exists.

A run takes a system description (TOML: counts, bandwidths, latencies, capacities) and one or \
more I/O kernels (a small text language: applications, compute phases, write/read phases, \
barriers, commits). It reports each application's runtime and perceived I/O bandwidth, and \
writes time series of the data moved at the compute nodes and at the storage servers.

The model follows Liu et al., MSST 2012: write-behind at the I/O-forwarding layer (reserve \
burst-buffer space, absorb, acknowledge, drain in the background; direct writes when the \
buffer is full), SSD access time T = L/B + latency, FIFO queues in every component. The \
language and every option are documented in docs/SIM.md.";

const EXAMPLES: &str = "\
Examples:
  # IOR at 8192 processes on Intrepid with Figure 3's 4 GiB burst buffer
  surge sim run examples/sim/systems/intrepid.toml \\
      examples/sim/kernels/ior.kernel --param procs=8192 \\
      --set burst_buffer.capacity=4GiB

  # The same without burst buffer and with half the file servers, as JSON
  surge sim run examples/sim/systems/intrepid.toml \\
      examples/sim/kernels/ior.kernel --param procs=8192 \\
      --set burst_buffer.enabled=false --set file_servers.count=64 --json

  # Three applications for 5 simulated hours; series and plots in out/
  cd examples/sim && surge sim run systems/intrepid-32k.toml \\
      kernels/plasma.kernel kernels/astro.kernel \\
      kernels/turbulence1.kernel --until 5h --out out/

  # Check a kernel, then reproduce Figure 3 at 1/16 scale
  surge sim check my.kernel
  surge sim experiment fig3 --scale 0.0625 --out fig3/";

/// Simulate compute nodes, burst buffers and the PFS (Liu et al.'s CODES model).
#[derive(clap::Args, Debug)]
#[command(about = ABOUT, long_about = LONG_ABOUT, after_long_help = EXAMPLES)]
pub struct SimArgs {
    #[command(subcommand)]
    pub command: SimCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum SimCommand {
    /// Simulate a system running one or more I/O kernels.
    Run(RunArgs),
    /// Parse and validate kernel and system files (errors name file and line).
    Check(CheckArgs),
    /// Reproduce one of Liu et al.'s experiments (Figures 3, 4a, 4b, 5-6) on the shipped examples.
    Experiment(ExperimentArgs),
}

/// Simulate a system running one or more I/O kernels.
#[derive(clap::Args, Debug)]
#[command(after_long_help = EXAMPLES)]
pub struct RunArgs {
    /// System description (TOML), e.g. examples/sim/systems/intrepid.toml.
    pub system: PathBuf,
    /// I/O kernel files; their applications run side by side, each on its own nodes.
    #[arg(required = true)]
    pub kernels: Vec<PathBuf>,
    /// Override a system key, e.g. --set burst_buffer.enabled=false --set file_servers.count=64.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Set a kernel parameter declared with `param NAME = DEFAULT`, e.g. --param procs=8192.
    #[arg(long = "param", value_name = "NAME=VALUE")]
    pub param: Vec<String>,
    /// Seed of the random generator (compute jitter, file placement). Same seed, same result.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Width of a time-series sample (simulated time), e.g. 10s (as Liu's Figures 5 and 6).
    #[arg(long, default_value = "10s", value_parser = parse_duration_arg)]
    pub sample: u64,
    /// Stop at this simulated time even if work remains, e.g. 5h.
    #[arg(long, value_parser = parse_duration_arg)]
    pub until: Option<u64>,
    /// Stop when every application has finished, without waiting for burst buffers to drain.
    #[arg(long)]
    pub stop_at_app_end: bool,
    /// Write summary.json, series.csv, series.json and SVG plots into this directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print the summary as JSON (schema surge.sim/1) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Parse and validate kernel and system files.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// Files to check: `.toml` files are system descriptions, anything else a kernel.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Kernel parameters, as for `run`.
    #[arg(long = "param", value_name = "NAME=VALUE")]
    pub param: Vec<String>,
    /// System overrides, as for `run`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Reproduce one of the paper's experiments.
#[derive(clap::Args, Debug)]
#[command(after_long_help = "\
Experiments (Liu et al., MSST 2012, Section IV):
  fig3      IOR perceived bandwidth vs processes (2K-128K): full/half storage, with/without BB
  fig4a     runtime of two 5-minute compute phases each followed by 4 x 20 MiB writes per
            process: no I/O, I/O without BB, I/O with a 20 GiB BB (incl. the final drain)
  fig4b     IOR bandwidth vs request size (1-16 MiB) at 32K processes with a 4 GiB BB
  multiapp  PlasmaPhysics + AstroPhysics + Turbulence1 on 32K nodes for 5 simulated hours,
            BB on/off x full/half storage (Figures 5 and 6)
  all       every experiment above

--scale 1 is the paper's size (fig4a and multiapp take a while); --scale 0.0625 divides the
node and file-server counts by 16 and keeps every ratio, for a quick look.")]
pub struct ExperimentArgs {
    /// Which experiment.
    #[arg(value_enum)]
    pub name: ExperimentName,
    /// Fraction of the paper's scale (compute nodes, file servers, racks, core network).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Directory with systems/ and kernels/ (default: the copies built into surge).
    #[arg(long, value_name = "DIR")]
    pub examples: Option<PathBuf>,
    /// Write CSV, JSON, SVG and a Markdown table per experiment into this directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Seed of the random generator, as for `run`.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
}

fn parse_duration_arg(s: &str) -> Result<u64, String> {
    parse_duration(s)
}

pub fn run(args: SimArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        SimCommand::Run(a) => run_sim(a),
        SimCommand::Check(a) => check(a),
        SimCommand::Experiment(a) => run_experiment(a),
    }
}

/// A live progress line on a terminal; silent otherwise.
pub struct ProgressLine {
    enabled: bool,
    until: Option<u64>,
    label: String,
}

impl ProgressLine {
    pub fn new(label: &str, until: Option<u64>) -> Self {
        ProgressLine {
            enabled: std::io::stderr().is_terminal(),
            until,
            label: label.to_string(),
        }
    }

    pub fn update(&self, p: Progress) {
        if !self.enabled {
            return;
        }
        let of = self
            .until
            .map(|u| format!(" of {}", format_duration(u)))
            .unwrap_or_default();
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r\x1b[2K{}simulated {}{of} · {} M events · {:.1} M events/s",
            self.label,
            format_duration(p.now),
            p.events / 1_000_000,
            p.events as f64 / p.wall_s.max(1e-9) / 1e6
        );
        let _ = err.flush();
    }

    pub fn clear(&self) {
        if self.enabled {
            let _ = write!(std::io::stderr().lock(), "\r\x1b[2K");
        }
    }
}

fn run_sim(a: RunArgs) -> anyhow::Result<ExitCode> {
    let params = parse_params(&a.param)?;
    let system = System::load(&a.system, &a.set)?;
    let apps = load_kernels(&a.kernels, &params)?;
    let opts = SimOptions {
        seed: a.seed,
        sample: a.sample.max(1),
        until: a.until,
        stop_when_apps_done: a.stop_at_app_end,
    };
    let line = ProgressLine::new("", a.until);
    let mut cb = |p: Progress| line.update(p);
    let outcome = simulate(&system, &apps, &opts, Some(&mut cb))?;
    line.clear();
    tracing::debug!(
        events = outcome.report.engine.events,
        wall_s = outcome.report.engine.wall_s,
        "simulation finished"
    );
    if let Some(dir) = &a.out {
        let files = write_outputs(dir, &outcome.report, &outcome.series)?;
        if !a.json {
            eprintln!("wrote {}", files.join(", "));
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&outcome.report)?);
    } else {
        print!("{}", outcome.report.to_text());
    }
    Ok(ExitCode::SUCCESS)
}

fn check(a: CheckArgs) -> anyhow::Result<ExitCode> {
    let params = parse_params(&a.param)?;
    let mut results = Vec::new();
    let mut failed = false;
    for f in &a.files {
        let name = f.display().to_string();
        let is_system = f.extension().is_some_and(|e| e == "toml");
        let outcome: Result<serde_json::Value, String> = if is_system {
            System::load(f, &a.set)
                .map(|s| {
                    serde_json::json!({
                        "kind": "system",
                        "name": s.name,
                        "compute_nodes": s.compute.nodes,
                        "ions": s.ions(),
                        "file_servers": s.file_servers.count,
                        "luns": s.luns(),
                        "burst_buffer": s.burst_buffer.enabled,
                        "bb_capacity_bytes": s.burst_buffer.capacity.0,
                    })
                })
                .map_err(|e| e.to_string())
        } else {
            std::fs::read_to_string(f)
                .map_err(|e| format!("cannot read {name}: {e}"))
                .and_then(|text| kernel::parse(&text, &name, &params).map_err(|e| e.to_string()))
                .map(|k| {
                    let apps: Vec<serde_json::Value> = k
                        .apps
                        .iter()
                        .map(|app| {
                            let t = app.totals();
                            serde_json::json!({
                                "name": app.name,
                                "processes": app.nodes.map_or(serde_json::json!(app.processes), |_| serde_json::Value::Null),
                                "nodes": app.nodes,
                                "per_node": app.per_node,
                                "write_bytes_per_process": t.write_bytes,
                                "read_bytes_per_process": t.read_bytes,
                                "write_requests_per_process": t.write_requests,
                                "read_requests_per_process": t.read_requests,
                                "io_phases": t.io_phases,
                                "compute_s": t.compute_ns as f64 / NS_PER_S as f64,
                                "barriers": t.barriers,
                                "commits": t.commits,
                            })
                        })
                        .collect();
                    serde_json::json!({ "kind": "kernel", "params": k.params, "apps": apps })
                })
        };
        match outcome {
            Ok(v) => {
                if !a.json {
                    println!("{name}: ok");
                    print_check_detail(&v);
                }
                results.push(serde_json::json!({ "file": name, "ok": true, "detail": v }));
            }
            Err(e) => {
                failed = true;
                if !a.json {
                    eprintln!("{e}");
                }
                results.push(serde_json::json!({ "file": name, "ok": false, "error": e }));
            }
        }
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn print_check_detail(v: &serde_json::Value) {
    let get = |k: &str| v.get(k).cloned().unwrap_or(serde_json::Value::Null);
    if get("kind") == "system" {
        println!(
            "  system {}: {} compute nodes, {} I/O nodes, {} file servers, {} LUNs, burst buffer {}",
            get("name").as_str().unwrap_or("?"),
            get("compute_nodes"),
            get("ions"),
            get("file_servers"),
            get("luns"),
            if get("burst_buffer") == true {
                surge_core::format_bytes(get("bb_capacity_bytes").as_u64().unwrap_or(0))
            } else {
                "off".to_string()
            }
        );
        return;
    }
    if let Some(apps) = v.get("apps").and_then(|a| a.as_array()) {
        for app in apps {
            let b = |k: &str| {
                surge_core::format_bytes(app.get(k).and_then(|x| x.as_u64()).unwrap_or(0))
            };
            let who = match app.get("nodes").and_then(|n| n.as_u64()) {
                Some(n) => format!("{n} nodes"),
                None => format!(
                    "{} processes",
                    app.get("processes").cloned().unwrap_or_default()
                ),
            };
            println!(
                "  app {}: {who}; per process: writes {} in {} requests, reads {} in {} requests, {} I/O phases, {} of compute, {} barriers, {} commits",
                app.get("name").and_then(|n| n.as_str()).unwrap_or("?"),
                b("write_bytes_per_process"),
                app.get("write_requests_per_process").cloned().unwrap_or_default(),
                b("read_bytes_per_process"),
                app.get("read_requests_per_process").cloned().unwrap_or_default(),
                app.get("io_phases").cloned().unwrap_or_default(),
                format_duration((app.get("compute_s").and_then(|x| x.as_f64()).unwrap_or(0.0) * 1e9) as u64),
                app.get("barriers").cloned().unwrap_or_default(),
                app.get("commits").cloned().unwrap_or_default(),
            );
        }
    }
}

fn run_experiment(a: ExperimentArgs) -> anyhow::Result<ExitCode> {
    if !(a.scale > 0.0 && a.scale <= 1.0) {
        anyhow::bail!(
            "--scale {}: expected a fraction in (0, 1], e.g. 0.0625",
            a.scale
        );
    }
    let opts = ExperimentOptions {
        scale: a.scale,
        seed: a.seed,
        examples: a.examples.clone(),
        verbose: !a.json,
    };
    let names = match a.name {
        ExperimentName::All => vec![
            ExperimentName::Fig3,
            ExperimentName::Fig4a,
            ExperimentName::Fig4b,
            ExperimentName::Multiapp,
        ],
        n => vec![n],
    };
    let mut all = Vec::new();
    for n in names {
        let result =
            experiment::run(n, &opts).with_context(|| format!("experiment {}", n.as_str()))?;
        if let Some(dir) = &a.out {
            let files = result.write(&dir.join(n.as_str()))?;
            if !a.json {
                eprintln!("wrote {}", files.join(", "));
            }
        }
        if !a.json {
            println!("{}", result.to_markdown());
        }
        all.push(result.to_json());
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
    }
    Ok(ExitCode::SUCCESS)
}
