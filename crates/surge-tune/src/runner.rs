//! One measured run: the variant of the job script for a configuration, run by `surge run`
//! (the real embedded manager and servers, or `$SURGE_MANAGER`), timed by its own report, and
//! recorded in the history at once (an interrupted tune keeps what it measured).
//!
//! The objective is what the job's user waits for beyond allocation: stage in + job + stage
//! out, from `surge run --report`'s phases. A run that fails (the job's status, a refused
//! allocation, a failed stage) has no time and is never chosen.

use crate::history::{History, Key, Run};
use crate::script::{render, RenderContext};
use crate::search::Measure;
use crate::space::Config;
use anyhow::Context;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The phases the objective sums.
pub const TIMED_PHASES: [&str; 3] = ["stage in", "job", "stage out"];

/// The objective of a run: the seconds of its [`TIMED_PHASES`].
pub fn objective(phases: &[(String, f64)]) -> f64 {
    phases
        .iter()
        .filter(|(name, _)| TIMED_PHASES.contains(&name.as_str()))
        .map(|(_, s)| s)
        .sum()
}

pub struct Runner<'h> {
    pub surge: PathBuf,
    pub script_name: String,
    pub script_text: String,
    pub granularity: u64,
    pub cwd: PathBuf,
    pub pfs_dir: PathBuf,
    pub ompi_romio: Option<String>,
    pub workdir: PathBuf,
    pub nodes: u32,
    pub args: Vec<String>,
    pub history: &'h History,
    pub key: Key,
    /// Budget of new runs, for the progress line.
    pub budget_runs: Option<u64>,
    pub quiet: bool,
    pub count: u64,
    pub best: Option<f64>,
}

impl Runner<'_> {
    pub fn variant(&self, c: &Config, banner: &[String]) -> anyhow::Result<String> {
        render(
            &self.script_text,
            c,
            &RenderContext {
                name: &self.script_name,
                granularity: self.granularity,
                cwd: &self.cwd,
                pfs_dir: &self.pfs_dir,
                ompi_romio: self.ompi_romio.as_deref(),
                banner,
            },
        )
    }
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

impl Measure for Runner<'_> {
    fn run(&mut self, c: &Config) -> anyhow::Result<Run> {
        self.count += 1;
        let n = self.count;
        let text = self.variant(c, &[format!("run {n}: {}", c.key())])?;
        let script = self.workdir.join(format!("run-{n:03}.sh"));
        let report = self.workdir.join(format!("run-{n:03}.json"));
        let log = self.workdir.join(format!("run-{n:03}.log"));
        std::fs::write(&script, &text)
            .with_context(|| format!("cannot write {}", script.display()))?;
        if c.pfs_only() {
            let _ = std::fs::remove_dir_all(&self.pfs_dir);
        }
        let started_at = now_rfc3339();
        let logf = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let mut cmd = Command::new(&self.surge);
        cmd.arg("run")
            .arg("--report")
            .arg(&report)
            .arg("--nodes")
            .arg(self.nodes.to_string())
            .arg(&script)
            .args(&self.args)
            .current_dir(&self.cwd)
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf);
        let status = cmd
            .status()
            .with_context(|| format!("cannot start {} run", self.surge.display()))?;
        if c.pfs_only() {
            let _ = std::fs::remove_dir_all(&self.pfs_dir);
        }
        let rep: serde_json::Value = std::fs::read_to_string(&report)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(serde_json::Value::Null);
        let phases: Vec<(String, f64)> = rep["phases"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|p| {
                        (
                            p["name"].as_str().unwrap_or("?").to_string(),
                            p["seconds"].as_f64().unwrap_or(0.0),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let exit_code = rep["exit_code"]
            .as_i64()
            .map(|c| c as i32)
            .or(status.code());
        let ok = status.success() && exit_code == Some(0);
        let seconds = ok.then(|| objective(&phases));
        let run = Run {
            config: c.clone(),
            ok,
            seconds,
            exit_code,
            phases,
            started_at,
            new: true,
        };
        self.history
            .record(&self.key, &self.script_name, &run)
            .context("cannot record the run")?;
        if let Some(s) = seconds {
            self.best = Some(self.best.map_or(s, |b| b.min(s)));
        }
        if !self.quiet {
            let of = self
                .budget_runs
                .map(|b| format!("/{b}"))
                .unwrap_or_default();
            let res = match seconds {
                Some(s) => format!("{s:>8.3} s"),
                None => format!(
                    "  FAILED (exit {}; see {})",
                    exit_code.map(|c| c.to_string()).unwrap_or("?".into()),
                    log.display()
                ),
            };
            let best = self
                .best
                .map(|b| format!("  best {b:.3} s"))
                .unwrap_or_default();
            let line = format!("surge tune: run {n}{of}  {:<60} {res}{best}", c.key());
            if std::io::stderr().is_terminal() {
                eprintln!("\x1b[2K{line}");
            } else {
                eprintln!("{line}");
            }
        }
        Ok(run)
    }
}
