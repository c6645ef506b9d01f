//! `surge bench md`: mdtest's file phases. Each process creates `files` files (create + close,
//! optionally writing `write_bytes`), stats them, opens and closes them (reading `read_bytes`,
//! 0 by default: mdtest's "read" phase), and removes them; each phase is timed from the first
//! process's first operation to the last process's last, and reported in operations per second.
//!
//! Layout (per repetition directory): with unique directories (mdtest `-u`, the default) process
//! `r` works in `md.<r>/`; with `--shared-dir` all processes work in `md.shared/`. Files are
//! `file.<r>.<i>` in both cases. The parent creates the directories before the create phase, so
//! the create phase times file creates only.

use crate::backend::{Backend, OpenFlags};
use crate::buffer::AlignedBuf;
use crate::clock::mono_ns;
use crate::histogram::Histogram;
use crate::ior::PROGRESS_NS;
use crate::result::{Phase, RankResult};
use crate::BenchError;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MdParams {
    /// Files per process (mdtest `-n`).
    pub files: u64,
    pub procs: u32,
    /// All processes in one directory instead of one directory each (mdtest without `-u`).
    pub shared_dir: bool,
    /// Bytes written into each file at create (mdtest `-w`).
    pub write_bytes: u64,
    /// Bytes read from each file in the open-close phase (mdtest `-e`).
    pub read_bytes: u64,
    pub stat: bool,
    pub open_close: bool,
    pub remove: bool,
    pub repetitions: u32,
    /// Stop the create phase after this many seconds; later phases work on what was created
    /// (mdtest's stonewall `-W`).
    pub deadline_s: Option<f64>,
}

impl Default for MdParams {
    fn default() -> Self {
        MdParams {
            files: 1000,
            procs: 1,
            shared_dir: false,
            write_bytes: 0,
            read_bytes: 0,
            stat: true,
            open_close: true,
            remove: true,
            repetitions: 1,
            deadline_s: None,
        }
    }
}

impl MdParams {
    pub fn phases(&self) -> Vec<Phase> {
        let mut v = vec![Phase::Create];
        if self.stat {
            v.push(Phase::Stat);
        }
        if self.open_close {
            v.push(Phase::OpenClose);
        }
        if self.remove {
            v.push(Phase::Remove);
        }
        v
    }

    pub fn total_files(&self) -> u64 {
        self.files * u64::from(self.procs)
    }

    /// The directories each repetition needs, relative to the repetition directory.
    pub fn dirs(&self) -> Vec<String> {
        if self.shared_dir {
            vec!["md.shared".to_string()]
        } else {
            (0..self.procs).map(|r| format!("md.{r:05}")).collect()
        }
    }

    pub fn dir_of(&self, rank: u32) -> String {
        if self.shared_dir {
            "md.shared".to_string()
        } else {
            format!("md.{rank:05}")
        }
    }

    pub fn file_path(&self, rep_dir: &Path, rank: u32, i: u64) -> PathBuf {
        rep_dir
            .join(self.dir_of(rank))
            .join(format!("file.{rank}.{i}"))
    }

    pub fn validate(&self) -> Result<(), BenchError> {
        let bad = |m: String| Err(BenchError::Params(m));
        if self.files == 0 {
            return bad("--files must be at least 1".into());
        }
        if self.procs == 0 || self.procs > 4096 {
            return bad(format!("--procs {} is not in 1..=4096", self.procs));
        }
        if self.repetitions == 0 {
            return bad("--repetitions must be at least 1".into());
        }
        if self.read_bytes > self.write_bytes {
            return bad(format!(
                "--read-bytes ({}) is more than --write-bytes ({}): the files would be too short",
                self.read_bytes, self.write_bytes
            ));
        }
        if self.write_bytes > 1 << 30 || self.read_bytes > 1 << 30 {
            return bad("--write-bytes and --read-bytes are limited to 1 GiB".into());
        }
        if let Some(d) = self.deadline_s {
            if d.is_nan() || d <= 0.0 {
                return bad(format!(
                    "--deadline {d} must be a positive number of seconds"
                ));
            }
        }
        Ok(())
    }
}

/// One process's prepared part of one metadata phase.
pub struct MdRankTask {
    params: MdParams,
    rank: u32,
    phase: Phase,
    rep_dir: PathBuf,
    count: u64,
    buf: AlignedBuf,
    deadline_s: Option<f64>,
}

impl MdRankTask {
    /// `limit` is how many files this process created (after a stonewalled create).
    pub fn prepare(
        params: &MdParams,
        rep_dir: &Path,
        rank: u32,
        phase: Phase,
        limit: Option<u64>,
    ) -> Result<MdRankTask, BenchError> {
        if phase.is_data() {
            return Err(BenchError::Params(format!(
                "{phase} is not a phase of the md benchmark"
            )));
        }
        let size = match phase {
            Phase::Create => params.write_bytes,
            Phase::OpenClose => params.read_bytes,
            _ => 0,
        };
        let mut buf = AlignedBuf::new(size as usize)
            .map_err(|e| BenchError::Params(format!("cannot allocate a buffer: {e}")))?;
        buf.fill_pseudo_random(u64::from(rank));
        Ok(MdRankTask {
            params: params.clone(),
            rank,
            phase,
            rep_dir: rep_dir.to_path_buf(),
            count: limit.unwrap_or(u64::MAX).min(params.files),
            buf,
            deadline_s: if phase == Phase::Create {
                params.deadline_s
            } else {
                None
            },
        })
    }

    pub fn run(
        mut self,
        backend: &dyn Backend,
        progress: &mut dyn FnMut(u64),
    ) -> Result<RankResult, BenchError> {
        let start_ns = mono_ns();
        let deadline_at = match self.deadline_s {
            Some(d) => start_ns.saturating_add((d * 1e9) as u64),
            None => u64::MAX,
        };
        let mut hist = Histogram::new();
        let mut prev = start_ns;
        let mut next_progress = start_ns + PROGRESS_NS;
        let mut done = 0u64;
        let mut bytes = 0u64;
        let create = OpenFlags {
            write: true,
            create: true,
            exclusive: true,
            ..OpenFlags::default()
        };
        while done < self.count && prev < deadline_at {
            let path = self.params.file_path(&self.rep_dir, self.rank, done);
            let err = |op: &'static str| {
                let path = path.clone();
                move |source| BenchError::Io {
                    op: op.to_string(),
                    path,
                    source,
                }
            };
            match self.phase {
                Phase::Create => {
                    let f = backend.open(&path, create).map_err(err("create"))?;
                    if !self.buf.as_slice().is_empty() {
                        f.write_all_at(self.buf.as_slice(), 0)
                            .map_err(err("write"))?;
                        bytes += self.buf.as_slice().len() as u64;
                    }
                    f.close().map_err(err("close"))?;
                }
                Phase::Stat => {
                    backend.stat(&path).map_err(err("stat"))?;
                }
                Phase::OpenClose => {
                    let f = backend
                        .open(&path, OpenFlags::read_only())
                        .map_err(err("open"))?;
                    let want = self.buf.as_slice().len();
                    if want > 0 {
                        let n = f.read_at(self.buf.as_mut_slice(), 0).map_err(err("read"))?;
                        bytes += n as u64;
                    }
                    f.close().map_err(err("close"))?;
                }
                Phase::Remove => backend.unlink(&path).map_err(err("remove"))?,
                Phase::Write | Phase::Read => unreachable_phase()?,
            }
            let now = mono_ns();
            hist.record(now - prev);
            prev = now;
            done += 1;
            if now >= next_progress {
                progress(done);
                next_progress = now + PROGRESS_NS;
            }
        }
        Ok(RankResult {
            rank: self.rank,
            ops: done,
            bytes,
            start_ns,
            io_start_ns: start_ns,
            io_end_ns: prev,
            end_ns: prev,
            stonewalled: done < self.count,
            verify_errors: 0,
            latency: hist,
        })
    }
}

fn unreachable_phase() -> Result<(), BenchError> {
    Err(BenchError::Params("data phase in the md benchmark".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::PosixBackend;

    fn run_phase(p: &MdParams, dir: &Path, phase: Phase, limit: Option<u64>) -> Vec<RankResult> {
        (0..p.procs)
            .map(|r| {
                MdRankTask::prepare(p, dir, r, phase, limit)
                    .unwrap()
                    .run(&PosixBackend, &mut |_| {})
                    .unwrap()
            })
            .collect()
    }

    fn setup(p: &MdParams, dir: &Path) {
        for d in p.dirs() {
            std::fs::create_dir(dir.join(d)).unwrap();
        }
    }

    #[test]
    fn unique_dirs_hold_each_process_files() {
        let tmp = tempfile::tempdir().unwrap();
        let p = MdParams {
            files: 5,
            procs: 2,
            write_bytes: 10,
            read_bytes: 10,
            ..MdParams::default()
        };
        setup(&p, tmp.path());
        let c = run_phase(&p, tmp.path(), Phase::Create, None);
        assert_eq!(c.iter().map(|r| r.ops).sum::<u64>(), 10);
        assert_eq!(c[0].bytes, 50);
        for r in 0..2u32 {
            let mut names: Vec<String> = std::fs::read_dir(tmp.path().join(format!("md.0000{r}")))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            let expect: Vec<String> = (0..5).map(|i| format!("file.{r}.{i}")).collect();
            assert_eq!(names, expect);
        }
        let s = run_phase(&p, tmp.path(), Phase::Stat, None);
        assert_eq!(s[1].ops, 5);
        let o = run_phase(&p, tmp.path(), Phase::OpenClose, None);
        assert_eq!(o[0].bytes, 50);
        let r = run_phase(&p, tmp.path(), Phase::Remove, None);
        assert_eq!(r[0].ops + r[1].ops, 10);
        assert_eq!(
            std::fs::read_dir(tmp.path().join("md.00000"))
                .unwrap()
                .count(),
            0
        );
    }

    #[test]
    fn shared_dir_holds_all_files() {
        let tmp = tempfile::tempdir().unwrap();
        let p = MdParams {
            files: 4,
            procs: 3,
            shared_dir: true,
            ..MdParams::default()
        };
        setup(&p, tmp.path());
        run_phase(&p, tmp.path(), Phase::Create, None);
        assert_eq!(p.dirs(), vec!["md.shared"]);
        assert_eq!(
            std::fs::read_dir(tmp.path().join("md.shared"))
                .unwrap()
                .count(),
            12
        );
    }

    #[test]
    fn later_phases_touch_only_what_was_created() {
        let tmp = tempfile::tempdir().unwrap();
        let p = MdParams {
            files: 10,
            ..MdParams::default()
        };
        setup(&p, tmp.path());
        let c = run_phase(&p, tmp.path(), Phase::Create, Some(3));
        assert!(!c[0].stonewalled);
        assert_eq!(c[0].ops, 3);
        let s = run_phase(&p, tmp.path(), Phase::Stat, Some(3));
        assert_eq!(s[0].ops, 3);
        // Without the limit the stat of file 3 fails, naming the file.
        let e = MdRankTask::prepare(&p, tmp.path(), 0, Phase::Stat, None)
            .unwrap()
            .run(&PosixBackend, &mut |_| {})
            .unwrap_err();
        assert!(e.to_string().contains("file.0.3"), "{e}");
    }

    #[test]
    fn create_is_exclusive_like_mdtest() {
        let tmp = tempfile::tempdir().unwrap();
        let p = MdParams {
            files: 2,
            ..MdParams::default()
        };
        setup(&p, tmp.path());
        run_phase(&p, tmp.path(), Phase::Create, None);
        let e = MdRankTask::prepare(&p, tmp.path(), 0, Phase::Create, None)
            .unwrap()
            .run(&PosixBackend, &mut |_| {})
            .unwrap_err();
        assert!(e.to_string().contains("create"), "{e}");
    }
}
