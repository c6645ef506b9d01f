//! The description of a running job's emulated compute nodes, written by `surge run` into the
//! run directory and read by `surge exec` and `surge stage` inside the job.

use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MountInfo {
    pub path: PathBuf,
    pub instance: u64,
    pub ns: u32,
    /// The DataWarp variable naming this mount (`DW_JOB_STRIPED`, ...).
    pub var: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeInfo {
    pub node: u32,
    /// The environment a process on this node gets.
    pub env: BTreeMap<String, String>,
    pub mounts: Vec<MountInfo>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodesFile {
    pub session: u64,
    pub manager: String,
    pub run_dir: PathBuf,
    pub nodes: Vec<NodeInfo>,
}

impl NodesFile {
    pub fn path(run_dir: &Path) -> PathBuf {
        run_dir.join("nodes.json")
    }

    pub fn write(&self) -> anyhow::Result<()> {
        let p = Self::path(&self.run_dir);
        std::fs::write(&p, serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("cannot write {}", p.display()))
    }

    /// The running job's description, found through `$SURGE_RUN_DIR`.
    pub fn from_env() -> anyhow::Result<NodesFile> {
        let dir = std::env::var_os("SURGE_RUN_DIR").context(
            "SURGE_RUN_DIR is not set: this command runs inside a job started by `surge run`",
        )?;
        let p = Self::path(Path::new(&dir));
        let text = std::fs::read(&p).with_context(|| format!("cannot read {}", p.display()))?;
        serde_json::from_slice(&text).with_context(|| format!("{} is not valid", p.display()))
    }

    /// The mount a path lies in (on any node), and the path inside the instance.
    pub fn locate(&self, path: &Path) -> Option<(&MountInfo, String)> {
        let abs = std::path::absolute(path).ok()?;
        self.nodes
            .iter()
            .flat_map(|n| n.mounts.iter())
            .find_map(|m| {
                let rest = abs.strip_prefix(&m.path).ok()?;
                let inner = format!("/{}", rest.display());
                Some((
                    m,
                    if inner == "/" {
                        inner
                    } else {
                        inner.trim_end_matches('/').to_string()
                    },
                ))
            })
    }
}
