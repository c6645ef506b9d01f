//! `#SURGE jobdw` in `surge run`: the performance targets become a capacity (fragments x the
//! pool's granularity) by `surge_manager::targets::size`, from the calibrated peaks of one
//! fragment (`--peaks`, `$SURGE_PEAKS`) and the pool's free fragments; the run says what it
//! promised and why, or refuses before anything is allocated, with the best the pool offers.
//! With `--measure-targets`, a short `surge bench io` on the job's mount (before the job)
//! measures what was promised.

use anyhow::Context;
use std::path::Path;
use surge_api::v1 as api;
use surge_core::directives::JobDw;
use surge_core::peaks::Peaks;
use surge_manager::cli::status_err;
use surge_manager::targets::{describe, size, Sizing};

/// The allocation a `#SURGE jobdw` resolved to.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub capacity: u64,
    pub sizing: Sizing,
    pub peaks: Peaks,
    pub peaks_file: String,
}

impl Resolved {
    pub fn detail(&self) -> String {
        format!(
            "{} fragment(s) promise {}",
            self.sizing.offer.fragments,
            describe(&self.sizing.offer)
        )
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "offer": self.sizing.offer,
            "why": self.sizing.why,
            "peaks_file": self.peaks_file,
        })
    }
}

/// Sizes the job instance of a `#SURGE jobdw`; `None` for a `#DW jobdw`.
pub async fn resolve(
    c: &mut surge_api::Client,
    j: &JobDw,
    pool: &str,
    nodes: u32,
    peaks: Option<&Path>,
    script: &str,
) -> anyhow::Result<Option<Resolved>> {
    let Some(targets) = &j.targets else {
        return Ok(None);
    };
    let Some(peaks_path) = peaks else {
        anyhow::bail!(
            "{script}:{}: `#SURGE jobdw` sizes the allocation from the calibrated peaks of one \
             fragment: give --peaks FILE or SURGE_PEAKS (written by `surge bench calibrate` on a \
             one-fragment instance, docs/peaks.md); nothing was allocated",
            j.line
        );
    };
    let p = Peaks::load(peaks_path)
        .with_context(|| format!("{script}:{}: cannot read the peaks", j.line))?;
    let pools = c
        .list_pools(api::Empty {})
        .await
        .map_err(status_err)?
        .into_inner()
        .pools;
    let chosen = pools
        .iter()
        .find(|x| x.name == pool)
        .or_else(|| {
            pools
                .iter()
                .find(|x| pool.is_empty() && x.name == "default")
        })
        .or_else(|| pools.first().filter(|_| pool.is_empty()))
        .with_context(|| format!("{script}:{}: pool '{pool}' does not exist", j.line))?;
    let g = chosen.granularity.max(1);
    let free = chosen.free / g;
    let sizing = size(targets, j.capacity, j.access_mode, nodes, &p, g, free).map_err(|e| {
        anyhow::anyhow!(
            "{script}:{}: pool {} cannot meet the targets: {e}; nothing was allocated",
            j.line,
            chosen.name
        )
    })?;
    Ok(Some(Resolved {
        capacity: sizing.offer.capacity,
        sizing,
        peaks: p,
        peaks_file: peaks_path.display().to_string(),
    }))
}

/// Measures the promise on the job's mount: `surge bench io` with as many processes as the
/// calibration needed per fragment, 8 MiB transfers, fsync before close, page cache dropped
/// before reading; returns the JSON
/// `{write_bytes_per_s, read_bytes_per_s, promised_bytes_per_s}` and a one-line summary.
pub fn measure(mount: &Path, r: &Resolved) -> anyhow::Result<(serde_json::Value, String)> {
    let exe = std::env::current_exe().context("cannot find the surge executable")?;
    let procs =
        (u64::from(r.peaks.procs_at_peak.write_bw.max(1)) * r.sizing.offer.fragments).clamp(1, 16);
    // Half the capacity at most, 1 GiB at most, whole 8 MiB transfers per process.
    let total = (r.capacity / 2).min(1 << 30);
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
    let promised = r.sizing.offer.bandwidth;
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
            "procs": procs,
        }),
        line,
    ))
}
