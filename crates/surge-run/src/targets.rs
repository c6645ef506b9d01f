//! `#SURGE jobdw` in `surge run` and `surge bb setup`: the performance targets go to the
//! manager with the job instance's request; the manager sizes the instance from the calibrated
//! peaks it keeps per server (`surge pool peaks`) and records what it promised and why with
//! the instance, or refuses before anything is allocated, with the best the pool offers.
//! `--peaks FILE` (`$SURGE_PEAKS`) sends peaks to assume for every server instead. With
//! `--measure-targets`, a short `surge bench io` on the job's mount (before the job) measures
//! what was promised.

use anyhow::Context;
use std::path::Path;
use surge_api::v1 as api;
use surge_core::directives::JobDw;
use surge_core::peaks::Peaks;
use surge_manager::targets::{gib_s, ops, Promise};

/// The targets of a `#SURGE jobdw` as the API carries them (`None` for `#DW jobdw`).
pub fn request_targets(j: &JobDw) -> Option<api::Targets> {
    j.targets.map(|t| api::Targets {
        bandwidth: t.bandwidth.unwrap_or(0),
        iops: t.iops.unwrap_or(0),
        metadata: t.metadata.unwrap_or(0),
    })
}

/// Peaks given with the job (`--peaks`), as the API carries them; only for `#SURGE jobdw`.
pub fn given_peaks(j: &JobDw, peaks: Option<&Path>, script: &str) -> anyhow::Result<String> {
    match (peaks, j.targets.is_some()) {
        (Some(p), true) => {
            let pk = Peaks::load(p)
                .with_context(|| format!("{script}:{}: cannot read the peaks", j.line))?;
            Ok(serde_json::to_string(&pk)?)
        }
        _ => Ok(String::new()),
    }
}

/// What the manager promised for a job instance (its `promise_json`), if it was sized by
/// targets.
pub fn promise_of(i: &api::Instance) -> Option<Promise> {
    serde_json::from_str(&i.promise_json).ok()
}

/// One line: what the promise is.
pub fn detail(p: &Promise) -> String {
    format!(
        "{} fragment(s) on {} server(s) promise {}, {} bandwidth, {} IOPS, {} metadata",
        p.offer.fragments,
        p.servers.len(),
        surge_core::format_bytes(p.offer.capacity),
        gib_s(p.offer.bandwidth),
        ops(p.offer.iops),
        ops(p.offer.metadata)
    )
}

/// Measures the promise on the job's mount: `surge bench io` with as many processes as the
/// calibration behind the promise peaked at, 8 MiB transfers, fsync before close, page cache dropped
/// before reading; returns the JSON
/// `{write_bytes_per_s, read_bytes_per_s, promised_bytes_per_s, procs}` and a one-line summary.
pub fn measure(mount: &Path, p: &Promise) -> anyhow::Result<(serde_json::Value, String)> {
    let exe = std::env::current_exe().context("cannot find the surge executable")?;
    let procs = u64::from(p.procs).clamp(1, 16);
    // Half the capacity at most, 1 GiB at most, whole 8 MiB transfers per process.
    let total = (p.offer.capacity / 2).min(1 << 30);
    let block = (total / procs / (8 << 20)).max(1) * (8 << 20);
    let out = std::process::Command::new(exe)
        .args(["bench", "io"])
        .arg(mount)
        // fsync before close and the page cache dropped before reading: the storage, not
        // this host's memory, is measured.
        .args(["--json", "--fsync", "--drop-cache", "-t", "8MiB"])
        .args(["-n", &procs.to_string(), "-b", &block.to_string()])
        .output()
        .context("cannot run surge bench io on the mount")?;
    anyhow::ensure!(
        out.status.success(),
        "surge bench io on {} failed: {}",
        mount.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let rep: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("unreadable surge bench io output")?;
    let rate = |phase: &str| {
        rep["summary"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["phase"] == phase))
            .and_then(|s| s["bytes_per_s"]["mean"].as_f64())
            .unwrap_or(0.0)
    };
    let (w, rd) = (rate("write"), rate("read"));
    let promised = p.offer.bandwidth;
    let gib = |b: f64| b / (1u64 << 30) as f64;
    let line = format!(
        "bandwidth promised {:.2} GiB/s, measured write {:.2} GiB/s ({:.0}%), read {:.2} GiB/s \
         ({:.0}%), {procs} process(es)",
        gib(promised),
        gib(w),
        100.0 * w / promised.max(1.0),
        gib(rd),
        100.0 * rd / promised.max(1.0)
    );
    Ok((
        serde_json::json!({
            "promised_bytes_per_s": promised,
            "write_bytes_per_s": w,
            "read_bytes_per_s": rd,
            "write_ratio": w / promised.max(1.0),
            "read_ratio": rd / promised.max(1.0),
            "procs": procs,
        }),
        line,
    ))
}
