//! Every run `surge tune` makes, in SQLite, keyed by the job (its script's text), its inputs
//! (each stage-in source's size, file count and newest modification time) and the pool (the
//! manager, or the embedded servers and granularity, and the host). A later call with the same
//! key starts from these measurements instead of running them again; a changed script, changed
//! inputs or another pool is another key.
//!
//! Default location: `$SURGE_TUNE_DB`, else `$XDG_DATA_HOME/surge/tune.db`, else
//! `~/.local/share/surge/tune.db`.

use crate::space::Config;
use rusqlite::{params, Connection};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("tune history {path}: {source}")]
    Sql {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("tune history {path}: cannot create its directory: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What identifies "the same tuning problem".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key {
    pub job: String,
    pub inputs: String,
    pub pool: String,
}

/// One measured run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub config: Config,
    /// The job ran and exited 0 (and staged out).
    pub ok: bool,
    /// The objective: stage in + job + stage out, seconds (None when the run failed).
    pub seconds: Option<f64>,
    pub exit_code: Option<i32>,
    /// `surge run --report`'s phases: name and seconds.
    pub phases: Vec<(String, f64)>,
    pub started_at: String,
    /// True when this call ran it; false when it came from the history.
    #[serde(default)]
    pub new: bool,
}

pub struct History {
    conn: Connection,
    path: PathBuf,
}

pub fn default_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SURGE_TUNE_DB").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let base = std::env::var_os("XDG_DATA_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("surge/tune.db")
}

impl History {
    pub fn open(path: &Path) -> Result<History, HistoryError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| HistoryError::Dir {
                path: path.to_path_buf(),
                source,
            })?;
        }
        let sql = |source| HistoryError::Sql {
            path: path.to_path_buf(),
            source,
        };
        let conn = Connection::open(path).map_err(sql)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(sql)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS runs (
                id INTEGER PRIMARY KEY,
                job_key TEXT NOT NULL,
                inputs_key TEXT NOT NULL,
                pool_key TEXT NOT NULL,
                job_path TEXT NOT NULL,
                config_key TEXT NOT NULL,
                config_json TEXT NOT NULL,
                ok INTEGER NOT NULL,
                seconds REAL,
                exit_code INTEGER,
                phases_json TEXT NOT NULL,
                started_at TEXT NOT NULL,
                surge_version TEXT NOT NULL
            );
            CREATE INDEX IF NOT EXISTS runs_by_problem
                ON runs(job_key, inputs_key, pool_key, config_key);",
        )
        .map_err(sql)?;
        Ok(History {
            conn,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, source: rusqlite::Error) -> HistoryError {
        HistoryError::Sql {
            path: self.path.clone(),
            source,
        }
    }

    pub fn record(&self, key: &Key, job_path: &str, run: &Run) -> Result<(), HistoryError> {
        let config_json = serde_json::to_string(&run.config).unwrap_or_default();
        let phases_json = serde_json::to_string(&run.phases).unwrap_or_default();
        self.conn
            .execute(
                "INSERT INTO runs (job_key, inputs_key, pool_key, job_path, config_key, \
                 config_json, ok, seconds, exit_code, phases_json, started_at, surge_version) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                params![
                    key.job,
                    key.inputs,
                    key.pool,
                    job_path,
                    run.config.key(),
                    config_json,
                    run.ok,
                    run.seconds,
                    run.exit_code,
                    phases_json,
                    run.started_at,
                    env!("CARGO_PKG_VERSION"),
                ],
            )
            .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Every run of this problem, oldest first. Rows a newer Surge wrote in a shape this one
    /// cannot read are skipped.
    pub fn runs(&self, key: &Key) -> Result<Vec<Run>, HistoryError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT config_json, ok, seconds, exit_code, phases_json, started_at FROM runs \
                 WHERE job_key = ?1 AND inputs_key = ?2 AND pool_key = ?3 ORDER BY id",
            )
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map(params![key.job, key.inputs, key.pool], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, bool>(1)?,
                    r.get::<_, Option<f64>>(2)?,
                    r.get::<_, Option<i32>>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, String>(5)?,
                ))
            })
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for row in rows {
            let (cfg, ok, seconds, exit_code, phases, started_at) = row.map_err(|e| self.err(e))?;
            let Ok(config) = serde_json::from_str::<Config>(&cfg) else {
                tracing::warn!("tune history: skipping a run whose configuration is unreadable");
                continue;
            };
            out.push(Run {
                config,
                ok,
                seconds,
                exit_code,
                phases: serde_json::from_str(&phases).unwrap_or_default(),
                started_at,
                new: false,
            });
        }
        Ok(out)
    }

    /// Number of runs of every problem of this job script (for messages).
    pub fn count_for_job(&self, job: &str) -> Result<u64, HistoryError> {
        self.conn
            .query_row(
                "SELECT COUNT(*) FROM runs WHERE job_key = ?1",
                params![job],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n.max(0) as u64)
            .map_err(|e| self.err(e))
    }
}

/// A stable 128-bit hash as hex (xxh3), for keys.
pub fn hash_hex(bytes: &[u8]) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::{Layout, StripeCount};
    use std::collections::{BTreeMap, BTreeSet};

    fn problem() -> Key {
        Key {
            job: "j".into(),
            inputs: "i".into(),
            pool: "p".into(),
        }
    }

    #[test]
    fn runs_are_kept_per_problem_and_read_back() {
        let t = tempfile::tempdir().unwrap();
        let db = t.path().join("sub/tune.db");
        let key = problem();
        let run = Run {
            config: Config {
                fragments: 2,
                mode: "striped".into(),
                on_pfs: BTreeSet::from(["/pfs/a".to_string()]),
                hints: BTreeMap::from([("cb_nodes".to_string(), "1".to_string())]),
                layout: None,
            },
            ok: true,
            seconds: Some(1.5),
            exit_code: Some(0),
            phases: vec![("job".into(), 1.5)],
            started_at: "2026-01-01T00:00:00Z".into(),
            new: true,
        };
        {
            let h = History::open(&db).unwrap();
            h.record(&key, "job.sh", &run).unwrap();
        }
        let h = History::open(&db).unwrap();
        let got = h.runs(&key).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].config, run.config);
        assert_eq!(got[0].seconds, Some(1.5));
        assert!(!got[0].new);
        let other = Key {
            pool: "q".into(),
            ..key.clone()
        };
        assert!(h.runs(&other).unwrap().is_empty());
        assert_eq!(h.count_for_job("j").unwrap(), 1);
    }

    fn run_with(layout: Option<Layout>) -> Run {
        Run {
            config: Config {
                fragments: 2,
                mode: "striped".into(),
                on_pfs: BTreeSet::new(),
                hints: BTreeMap::new(),
                layout,
            },
            ok: true,
            seconds: Some(1.0),
            exit_code: Some(0),
            phases: vec![],
            started_at: String::new(),
            new: true,
        }
    }

    #[test]
    fn the_layout_is_part_of_the_configuration_and_read_back() {
        let t = tempfile::tempdir().unwrap();
        let db = t.path().join("tune.db");
        let key = problem();
        let all = Some(Layout {
            stripe_count: StripeCount::All,
            stripe_size: Some(1 << 20),
        });
        let one = Some(Layout {
            stripe_count: StripeCount::Count(1),
            stripe_size: None,
        });
        let h = History::open(&db).unwrap();
        for l in [None, all, one] {
            h.record(&key, "job.sh", &run_with(l)).unwrap();
        }
        let got: Vec<Option<Layout>> = h
            .runs(&key)
            .unwrap()
            .into_iter()
            .map(|r| r.config.layout)
            .collect();
        assert_eq!(got, vec![None, all, one]);
        // Three configurations, three keys; the mount's choice keeps the key it had before
        // layouts were searched.
        assert_eq!(run_with(None).config.key(), "fragments=2 mode=striped");
        assert_eq!(
            run_with(all).config.key(),
            "fragments=2 mode=striped stripe-count=all stripe-size=1MiB"
        );
        assert_eq!(
            run_with(one).config.key(),
            "fragments=2 mode=striped stripe-count=1"
        );
    }

    #[test]
    fn runs_recorded_before_layouts_were_searched_had_the_mounts_choice() {
        let t = tempfile::tempdir().unwrap();
        let db = t.path().join("tune.db");
        let key = problem();
        let h = History::open(&db).unwrap();
        // A row as the tuner wrote it before layouts: no "layout" in the configuration.
        h.conn
            .execute(
                "INSERT INTO runs (job_key, inputs_key, pool_key, job_path, config_key, \
                 config_json, ok, seconds, exit_code, phases_json, started_at, surge_version) \
                 VALUES ('j', 'i', 'p', 'job.sh', 'fragments=2 mode=striped', \
                 '{\"fragments\":2,\"mode\":\"striped\",\"on_pfs\":[],\"hints\":{}}', \
                 1, 1.0, 0, '[]', '', '0.1.0')",
                [],
            )
            .unwrap();
        let got = h.runs(&key).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].config, run_with(None).config);
    }
}
