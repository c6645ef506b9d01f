//! `surge sim`: a discrete-event simulator of compute nodes, I/O nodes with burst buffers, and
//! the parallel file system, after Liu et al., *On the Role of Burst Buffers in
//! Leadership-Class Storage Systems* (MSST 2012, the CODES model). It answers "will a burst
//! buffer help this job at 1,000 nodes?" and "how much external storage do we need?" before
//! the hardware exists.
//!
//! The pieces, each in its own module:
//! - [`engine`]: the event queue (time, then insertion order) and the seeded generator;
//! - [`system`]: the machine, read from TOML;
//! - [`kernel`]: the I/O kernel language and its parser;
//! - [`model`]: components as FIFO servers, the forwarding and write-behind protocol, the
//!   interpreter that runs every process's kernel;
//! - [`report`] and [`plot`]: summaries, time series, SVG charts;
//! - [`experiment`]: the paper's Figures 3, 4a, 4b, 5 and 6 on the shipped examples;
//! - [`cli`]: the `surge sim` verb.
//!
//! The reference for users is `docs/SIM.md`.

pub mod cli;
pub mod engine;
pub mod experiment;
pub mod kernel;
pub mod model;
pub mod plot;
pub mod report;
pub mod system;
pub mod units;

pub use kernel::{AppSpec, Kernel};
pub use model::{simulate, Outcome, SimOptions};
pub use report::Report;
pub use system::System;

use std::collections::BTreeMap;
use std::path::Path;

/// Reads kernel files and returns their applications in order. Every `--param` must be
/// declared by at least one file, so a typo is an error rather than a silent default.
pub fn load_kernels(
    paths: &[impl AsRef<Path>],
    params: &BTreeMap<String, String>,
) -> anyhow::Result<Vec<AppSpec>> {
    use anyhow::Context;
    let mut apps: Vec<AppSpec> = Vec::new();
    let mut declared = std::collections::BTreeSet::new();
    for p in paths {
        let p = p.as_ref();
        let text = std::fs::read_to_string(p)
            .with_context(|| format!("cannot read kernel {}", p.display()))?;
        let k = kernel::parse(&text, &p.display().to_string(), params)?;
        declared.extend(k.params.keys().cloned());
        for a in k.apps {
            if let Some(prev) = apps.iter().find(|b| b.name == a.name) {
                anyhow::bail!(
                    "{}: application '{}' is already defined at {}",
                    a.origin,
                    a.name,
                    prev.origin
                );
            }
            apps.push(a);
        }
    }
    for name in params.keys() {
        if !declared.contains(name) {
            anyhow::bail!(
                "--param {name}: no kernel declares 'param {name} = ...' (declared: {})",
                if declared.is_empty() {
                    "none".to_string()
                } else {
                    declared.iter().cloned().collect::<Vec<_>>().join(", ")
                }
            );
        }
    }
    Ok(apps)
}

/// Parses `NAME=VALUE` pairs (from `--param`).
pub fn parse_params(pairs: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for p in pairs {
        let (k, v) = p
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--param {p}: expected NAME=VALUE, e.g. procs=8192"))?;
        out.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(out)
}
