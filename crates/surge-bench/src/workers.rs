//! Separate worker processes behind a barrier, as IOR's MPI ranks are. The parent starts N copies
//! of a worker command (the `surge` binary re-executing itself as `surge bench worker`) and
//! talks to each over its stdin/stdout, one JSON message per line:
//!
//! ```text
//! parent -> worker: Start{rank, job}        worker: sets up signals, picks the backend
//! parent -> all:    Phase{dir, phase, ...}  each worker prepares (buffers, orders, cache drop)
//! all -> parent:    Ready                   ... the barrier: the parent waits for every Ready,
//! parent -> all:    Go                      then releases all workers at once
//! workers -> parent: Progress{ops}* then Done{RankResult} or Failed{error}
//! ```
//!
//! Each worker stamps its phase with CLOCK_MONOTONIC, so the parent computes phase times from
//! the workers' own clocks rather than from pipe round trips.

use crate::backend;
use crate::cleanup;
use crate::ior::{IoParams, IoRankTask};
use crate::mdtest::{MdParams, MdRankTask};
use crate::progress::ProgressLine;
use crate::result::{Phase, RankResult};
use crate::BenchError;
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::Duration;

/// The benchmark a worker runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Job {
    Io(IoParams),
    Md(MdParams),
}

#[derive(Debug, Serialize, Deserialize)]
pub enum ToWorker {
    Start {
        rank: u32,
        parent_pid: u32,
        backend: String,
        job: Job,
    },
    Phase {
        dir: PathBuf,
        phase: Phase,
        limit: Option<u64>,
        deadline_s: Option<f64>,
    },
    Go,
    Exit,
}

#[derive(Debug, Serialize, Deserialize)]
pub enum FromWorker {
    Ready,
    Progress { ops: u64 },
    Done(RankResult),
    Failed { error: String },
}

/// How to start a worker process: a program and the arguments that make it one.
#[derive(Clone, Debug)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<OsString>,
}

impl WorkerCommand {
    /// This very executable re-run as `surge bench worker`.
    pub fn current_exe() -> Result<WorkerCommand, BenchError> {
        let program = std::env::current_exe().map_err(|e| {
            BenchError::Setup(format!(
                "cannot find the surge executable to start workers: {e}"
            ))
        })?;
        Ok(WorkerCommand {
            program,
            args: vec!["bench".into(), "worker".into()],
        })
    }
}

/// Running workers of one benchmark.
pub struct WorkerPool {
    children: Vec<Child>,
    stdins: Vec<ChildStdin>,
    rx: Receiver<(u32, Option<FromWorker>)>,
}

fn send(stdin: &mut ChildStdin, msg: &ToWorker) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stdin.write_all(&line)?;
    stdin.flush()
}

impl WorkerPool {
    pub fn start(
        cmd: &WorkerCommand,
        procs: u32,
        backend: &str,
        job: &Job,
    ) -> Result<WorkerPool, BenchError> {
        let (tx, rx) = channel();
        let mut pool = WorkerPool {
            children: Vec::new(),
            stdins: Vec::new(),
            rx,
        };
        for rank in 0..procs {
            let mut child = Command::new(&cmd.program)
                .args(&cmd.args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| {
                    BenchError::Setup(format!(
                        "cannot start worker process {} ({}): {e}",
                        rank,
                        cmd.program.display()
                    ))
                })?;
            cleanup::register_pid(child.id());
            let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
                pool.children.push(child);
                return Err(BenchError::Setup("worker pipes were not created".into()));
            };
            pool.children.push(child);
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let msg = match line {
                        Ok(l) => serde_json::from_str::<FromWorker>(&l).unwrap_or_else(|e| {
                            FromWorker::Failed {
                                error: format!("sent a message the parent cannot read ({e}): {l}"),
                            }
                        }),
                        Err(_) => break,
                    };
                    if tx.send((rank, Some(msg))).is_err() {
                        return;
                    }
                }
                let _ = tx.send((rank, None));
            });
            send(
                &mut stdin,
                &ToWorker::Start {
                    rank,
                    parent_pid: std::process::id(),
                    backend: backend.to_string(),
                    job: job.clone(),
                },
            )
            .map_err(|e| BenchError::Worker {
                rank,
                message: format!("cannot send the job: {e}"),
            })?;
            pool.stdins.push(stdin);
        }
        Ok(pool)
    }

    fn procs(&self) -> u32 {
        self.stdins.len() as u32
    }

    fn lost(&mut self, rank: u32) -> BenchError {
        let status = self
            .children
            .get_mut(rank as usize)
            .and_then(|c| c.wait().ok())
            .map(|s| s.to_string())
            .unwrap_or_else(|| "unknown status".into());
        BenchError::Worker {
            rank,
            message: format!("exited unexpectedly ({status}); see its error above"),
        }
    }

    /// Runs one phase on every worker: prepare, barrier, go, collect. `limits[rank]` caps each
    /// worker's operations.
    pub fn run_phase(
        &mut self,
        dir: &Path,
        phase: Phase,
        limits: &[Option<u64>],
        deadline_s: Option<f64>,
        progress: &mut ProgressLine,
    ) -> Result<Vec<RankResult>, BenchError> {
        let n = self.procs();
        for rank in 0..n {
            let msg = ToWorker::Phase {
                dir: dir.to_path_buf(),
                phase,
                limit: limits.get(rank as usize).copied().flatten(),
                deadline_s,
            };
            send(&mut self.stdins[rank as usize], &msg).map_err(|e| BenchError::Worker {
                rank,
                message: format!("cannot send the {phase} phase: {e}"),
            })?;
        }
        // The barrier: every worker prepared before any starts.
        let mut ready = 0;
        while ready < n {
            match self.rx.recv() {
                Ok((_, Some(FromWorker::Ready))) => ready += 1,
                Ok((rank, Some(FromWorker::Failed { error }))) => {
                    return Err(BenchError::Worker {
                        rank,
                        message: error,
                    })
                }
                Ok((rank, None)) => return Err(self.lost(rank)),
                Ok((_, Some(_))) => {}
                Err(_) => return Err(BenchError::Setup("all workers are gone".into())),
            }
        }
        for rank in 0..n {
            send(&mut self.stdins[rank as usize], &ToWorker::Go).map_err(|e| {
                BenchError::Worker {
                    rank,
                    message: format!("cannot start the {phase} phase: {e}"),
                }
            })?;
        }
        progress.start_phase(phase, n);
        let mut results: Vec<Option<RankResult>> = (0..n).map(|_| None).collect();
        let mut done = 0;
        while done < n {
            match self.rx.recv_timeout(Duration::from_millis(200)) {
                Ok((rank, Some(FromWorker::Progress { ops }))) => progress.update(rank, ops),
                Ok((rank, Some(FromWorker::Done(r)))) => {
                    progress.update(rank, r.ops);
                    if let Some(slot) = results.get_mut(rank as usize) {
                        *slot = Some(r);
                    }
                    done += 1;
                }
                Ok((rank, Some(FromWorker::Failed { error }))) => {
                    return Err(BenchError::Worker {
                        rank,
                        message: error,
                    })
                }
                Ok((rank, Some(FromWorker::Ready))) => {
                    return Err(BenchError::Worker {
                        rank,
                        message: "out of step with the parent".into(),
                    })
                }
                Ok((rank, None)) => return Err(self.lost(rank)),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(BenchError::Setup("all workers are gone".into()))
                }
            }
            progress.draw(false);
        }
        progress.finish_phase();
        Ok(results.into_iter().flatten().collect())
    }

    /// Tells the workers to exit and reaps them.
    pub fn shutdown(mut self) {
        for stdin in &mut self.stdins {
            let _ = send(stdin, &ToWorker::Exit);
        }
        self.stdins.clear();
        for child in &mut self.children {
            let _ = child.wait();
            cleanup::unregister_pid(child.id());
        }
        self.children.clear();
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        // Error path: workers may be mid-phase; stop them before their directory goes.
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
            cleanup::unregister_pid(child.id());
        }
    }
}

/// The worker side: `surge bench worker`. Reads its job on stdin and answers on stdout.
pub fn worker_main() -> Result<(), BenchError> {
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut out = std::io::stdout().lock();
    let mut next = || -> Result<Option<ToWorker>, BenchError> {
        match lines.next() {
            None => Ok(None),
            Some(Err(e)) => Err(BenchError::Setup(format!(
                "worker cannot read its input: {e}"
            ))),
            Some(Ok(l)) => serde_json::from_str(&l)
                .map(Some)
                .map_err(|e| BenchError::Setup(format!("worker got a bad message ({e}): {l}"))),
        }
    };
    let Some(ToWorker::Start {
        rank,
        parent_pid,
        backend: backend_name,
        job,
    }) = next()?
    else {
        return Err(BenchError::Setup(
            "`surge bench worker` is started by `surge bench`, not by hand".into(),
        ));
    };
    cleanup::worker_signals(parent_pid);
    let backend = backend::by_name(&backend_name)
        .ok_or_else(|| BenchError::Setup(format!("unknown backend '{backend_name}'")))?;
    let reply = |out: &mut std::io::StdoutLock, msg: &FromWorker| -> Result<(), BenchError> {
        let mut line = serde_json::to_vec(msg)
            .map_err(|e| BenchError::Setup(format!("cannot encode a reply: {e}")))?;
        line.push(b'\n');
        out.write_all(&line)
            .and_then(|_| out.flush())
            .map_err(|e| BenchError::Setup(format!("worker {rank} lost its parent: {e}")))
    };
    loop {
        let (dir, phase, limit, deadline_s) = match next()? {
            Some(ToWorker::Phase {
                dir,
                phase,
                limit,
                deadline_s,
            }) => (dir, phase, limit, deadline_s),
            Some(ToWorker::Exit) | None => return Ok(()),
            Some(other) => {
                return Err(BenchError::Setup(format!(
                    "worker {rank} got {other:?} out of order"
                )))
            }
        };
        enum Task {
            Io(IoRankTask),
            Md(MdRankTask),
        }
        let task = match &job {
            Job::Io(p) => IoRankTask::prepare(&*backend, p, &dir, rank, phase, limit, deadline_s)
                .map(Task::Io),
            Job::Md(p) => MdRankTask::prepare(p, &dir, rank, phase, limit).map(Task::Md),
        };
        let task = match task {
            Ok(t) => t,
            Err(e) => {
                reply(
                    &mut out,
                    &FromWorker::Failed {
                        error: e.to_string(),
                    },
                )?;
                return Ok(());
            }
        };
        reply(&mut out, &FromWorker::Ready)?;
        match next()? {
            Some(ToWorker::Go) => {}
            Some(ToWorker::Exit) | None => return Ok(()),
            Some(other) => {
                return Err(BenchError::Setup(format!(
                    "worker {rank} got {other:?} instead of Go"
                )))
            }
        }
        let mut report = |ops: u64| {
            // A failed progress write means the parent is gone; the final reply will say so.
            let _ = reply(&mut out, &FromWorker::Progress { ops });
        };
        let result = match task {
            Task::Io(t) => t.run(&*backend, &mut report),
            Task::Md(t) => t.run(&*backend, &mut report),
        };
        match result {
            Ok(r) => reply(&mut out, &FromWorker::Done(r))?,
            Err(e) => {
                reply(
                    &mut out,
                    &FromWorker::Failed {
                        error: e.to_string(),
                    },
                )?;
                return Ok(());
            }
        }
    }
}
