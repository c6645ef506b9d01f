//! Calibrated peaks of a storage target: what `surge bench calibrate` writes and what
//! `surge profile` (percent of peak, pipelines to saturate), `surge advise` and
//! performance-target allocation read. The JSON schema is documented in `docs/peaks.md`.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// The schema tag written in every peaks file; bumped on incompatible changes.
pub const PEAKS_SCHEMA: &str = "surge.peaks/1";

/// Peak rates of one target (a BB mount, one fragment, the PFS, a local disk) as measured by
/// sweeping I/O concurrency until the curve flattens (Daley §3.1.1, §4.1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Peaks {
    /// Always [`PEAKS_SCHEMA`].
    pub schema: String,
    /// The path that was measured.
    pub path: String,
    /// Host name of the machine the measurement ran on.
    pub host: String,
    /// RFC 3339 time of the measurement.
    pub measured_at: String,
    /// Sequential read bandwidth at the peak, bytes per second (IOR, 8 MiB transfers).
    pub read_bw: f64,
    /// Sequential write bandwidth at the peak, bytes per second.
    pub write_bw: f64,
    /// Random 4 KiB read operations per second at the peak.
    pub read_iops: f64,
    /// Random 4 KiB write operations per second at the peak.
    pub write_iops: f64,
    /// Random 4 KiB writes per second at the peak with an fsync after every write (IOR `-Y`,
    /// Daley's fsyncPerWrite: what a database or a checkpoint library that syncs gets). 0 when
    /// not measured (peaks files written before it was).
    #[serde(default)]
    pub write_iops_fsync: f64,
    /// Metadata operations per second at the peak (mdtest; the mean of create, stat and remove
    /// rates unless `metadata_detail` says otherwise).
    pub metadata_ops: f64,
    /// Process counts at which each peak was reached, for "pipelines to saturate".
    pub procs_at_peak: ProcsAtPeak,
    /// Per-phase metadata rates (ops/s), when measured.
    #[serde(default)]
    pub metadata_detail: MetadataDetail,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcsAtPeak {
    pub read_bw: u32,
    pub write_bw: u32,
    pub read_iops: u32,
    pub write_iops: u32,
    pub metadata_ops: u32,
    #[serde(default)]
    pub write_iops_fsync: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MetadataDetail {
    #[serde(default)]
    pub create: f64,
    #[serde(default)]
    pub stat: f64,
    #[serde(default)]
    pub open_close: f64,
    #[serde(default)]
    pub remove: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum PeaksError {
    #[error("cannot read peaks file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("peaks file {path} is not valid: {source}")]
    Parse {
        path: String,
        source: serde_json::Error,
    },
    #[error("peaks file {path} has schema '{found}', expected '{PEAKS_SCHEMA}'")]
    Schema { path: String, found: String },
}

impl Peaks {
    /// Reads and validates a peaks file.
    pub fn load(path: &Path) -> Result<Peaks, PeaksError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| PeaksError::Io {
            path: p.clone(),
            source,
        })?;
        let peaks: Peaks = serde_json::from_str(&text).map_err(|source| PeaksError::Parse {
            path: p.clone(),
            source,
        })?;
        if peaks.schema != PEAKS_SCHEMA {
            return Err(PeaksError::Schema {
                path: p,
                found: peaks.schema,
            });
        }
        Ok(peaks)
    }
}
