//! Staging from inside a running job, as a library: what `surge stage` and the libdatawarp
//! compatibility library (`surge-datawarp`) both call.
//!
//! A [`JobStager`] knows the job's mounts (from `$SURGE_RUN_DIR/nodes.json`, written by `surge
//! run`) and talks to the job's manager. Callers speak in the job's own paths: a path under a
//! burst-buffer mount (`$DW_JOB_STRIPED/out/a.dat`) and a PFS path. Stage tasks are the
//! manager's; a path is matched to the tasks whose items name it ([`covering`]), which is how
//! DataWarp's per-file query, wait and terminate calls find "the stage of this file".

pub mod nodes;
pub mod progress;

use self::nodes::{MountInfo, NodesFile};
use self::progress::wait_stage;
use crate::{Direction, ItemKind, StageItem};
use std::path::{Path, PathBuf};
use surge_api::tonic;
use surge_api::v1 as api;

/// Why a staging call from inside a job failed. [`JobStageError::errno`] is the errno a C
/// caller gets (libdatawarp returns `-errno`).
#[derive(Debug, thiserror::Error)]
pub enum JobStageError {
    #[error("not inside a job started by `surge run`: {0}")]
    NotInJob(String),
    #[error("{path} is not in a burst-buffer mount of this job (mounts: {mounts})")]
    NotInMount { path: PathBuf, mounts: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no stage of this job names {0}")]
    NoStage(PathBuf),
    #[error("{path} already has a stage in progress (task {task}); only one at a time per file")]
    Busy { path: PathBuf, task: u64 },
    #[error("stage task {task} failed: {message}")]
    Failed {
        task: u64,
        message: String,
        errno: i32,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("cannot reach the manager at {addr}: {message}")]
    Unreachable { addr: String, message: String },
    #[error("the manager refused: {}", .0.message())]
    Manager(tonic::Status),
}

pub type Result<T> = std::result::Result<T, JobStageError>;

impl JobStageError {
    /// The errno that describes this error best (positive).
    pub fn errno(&self) -> i32 {
        match self {
            JobStageError::NotInJob(_) => libc::ENODEV,
            JobStageError::NotInMount { .. } | JobStageError::Invalid(_) => libc::EINVAL,
            JobStageError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            JobStageError::NoStage(_) => libc::EINVAL,
            JobStageError::Busy { .. } => libc::EBUSY,
            JobStageError::Failed { errno, .. } => *errno,
            JobStageError::Unreachable { .. } => libc::ECONNREFUSED,
            JobStageError::Manager(s) => match s.code() {
                tonic::Code::NotFound => libc::ENOENT,
                tonic::Code::InvalidArgument => libc::EINVAL,
                tonic::Code::FailedPrecondition => libc::EBUSY,
                tonic::Code::ResourceExhausted => libc::ENOSPC,
                tonic::Code::PermissionDenied | tonic::Code::Unauthenticated => libc::EACCES,
                tonic::Code::Unavailable => libc::EAGAIN,
                _ => libc::EIO,
            },
        }
    }
}

/// The errno in a message made from a `std::io::Error` ("... (os error 2)"), else EIO. Stage
/// failures reach us as the manager's text; this recovers the errno the copy saw.
pub fn errno_of_message(msg: &str) -> i32 {
    msg.rfind("(os error ")
        .and_then(|i| {
            let rest = &msg[i + "(os error ".len()..];
            rest[..rest.find(')')?].parse().ok()
        })
        .filter(|e: &i32| *e > 0)
        .unwrap_or(libc::EIO)
}

/// When a stage-out runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    Now,
    /// When the job ends (its script has exited), before its instances are released.
    AtJobEnd,
}

/// One thing to copy, in the job's paths.
#[derive(Clone, Debug)]
pub struct JobItem {
    pub kind: ItemKind,
    /// The path under a burst-buffer mount (destination of a stage-in, source of a stage-out).
    pub bb: PathBuf,
    /// The PFS path (source of a stage-in, destination of a stage-out).
    pub pfs: PathBuf,
}

/// A path under a mount of the job: the mount and the path inside the instance namespace.
#[derive(Clone, Debug)]
pub struct Located {
    pub mount: MountInfo,
    pub inner: String,
}

/// What a query counts (DataWarp's `complete`, `pending`, `deferred`, `failed`), in stage tasks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StageCounts {
    pub complete: u32,
    pub pending: u32,
    pub deferred: u32,
    pub failed: u32,
}

impl StageCounts {
    pub fn of(tasks: &[&api::StageTask]) -> StageCounts {
        let mut c = StageCounts::default();
        for t in tasks {
            match t.state.as_str() {
                "done" => c.complete += 1,
                "queued" | "running" => c.pending += 1,
                "deferred" => c.deferred += 1,
                "failed" => c.failed += 1,
                _ => {}
            }
        }
        c
    }
}

/// Whether a query is about one file or a directory tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    File,
    Directory,
}

/// `p` is `dir` or lies under it (instance paths, absolute, no trailing slash but `/`).
pub fn is_under(p: &str, dir: &str) -> bool {
    p == dir || dir == "/" || p.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

/// Whether a task's item names the located path: for a file, an item copying exactly that file
/// or a directory holding it; for a directory, any item inside it or a directory holding it.
fn item_covers(item: &StageItem, inner: &str, scope: Scope) -> bool {
    let ip = item.instance_path.as_str();
    match (scope, item.kind) {
        (Scope::File, ItemKind::File) => ip == inner,
        // A copy_out item (`Any`): a file or a directory, so whatever either would cover.
        (Scope::File, ItemKind::Directory | ItemKind::Any) => is_under(inner, ip),
        (Scope::Directory, ItemKind::File) => is_under(ip, inner),
        (Scope::Directory, ItemKind::Directory | ItemKind::Any) => {
            is_under(ip, inner) || is_under(inner, ip)
        }
    }
}

/// The tasks (not terminated) that name a located path; for a file, only the latest one
/// (DataWarp: one stage per file at a time, and a new one replaces the last).
pub fn covering<'a>(
    tasks: &'a [api::StageTask],
    loc: &Located,
    scope: Scope,
) -> Vec<&'a api::StageTask> {
    let mut hits: Vec<&api::StageTask> = tasks
        .iter()
        .filter(|t| {
            t.state != "cancelled"
                && t.instance == loc.mount.instance
                && t.namespace == loc.mount.ns
                && serde_json::from_str::<Vec<StageItem>>(&t.items_json)
                    .is_ok_and(|items| items.iter().any(|i| item_covers(i, &loc.inner, scope)))
        })
        .collect();
    if scope == Scope::File {
        hits.sort_by_key(|t| t.id);
        hits = hits.pop().into_iter().collect();
    }
    hits
}

fn pending(t: &api::StageTask) -> bool {
    t.in_progress()
}

/// A connection to the manager of the job this process runs in.
pub struct JobStager {
    nodes: NodesFile,
    mgr: surge_api::Client,
}

impl JobStager {
    /// The job found through `$SURGE_RUN_DIR` (set by `surge run` for the script and every
    /// process it starts).
    pub async fn from_env() -> Result<JobStager> {
        let nodes = NodesFile::from_env().map_err(|e| JobStageError::NotInJob(format!("{e:#}")))?;
        JobStager::connect(nodes).await
    }

    pub async fn connect(nodes: NodesFile) -> Result<JobStager> {
        let mgr =
            surge_api::connect(&nodes.manager)
                .await
                .map_err(|e| JobStageError::Unreachable {
                    addr: nodes.manager.clone(),
                    message: format!("{e:#}"),
                })?;
        Ok(JobStager { nodes, mgr })
    }

    pub fn nodes(&self) -> &NodesFile {
        &self.nodes
    }

    /// The manager connection (to follow a task with [`wait_stage`]).
    pub fn manager(&mut self) -> &mut surge_api::Client {
        &mut self.mgr
    }

    /// The mount a path lies in, and the path inside the instance.
    pub fn locate(&self, path: &Path) -> Result<Located> {
        match self.nodes.locate(path) {
            Some((m, inner)) => Ok(Located {
                mount: m.clone(),
                inner,
            }),
            None => Err(JobStageError::NotInMount {
                path: path.to_path_buf(),
                mounts: self
                    .nodes
                    .nodes
                    .iter()
                    .flat_map(|n| n.mounts.iter().map(|m| m.path.display().to_string()))
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// The mount whose root is `path` (a `$DW_JOB_STRIPED`-like directory).
    pub fn mount_root(&self, path: &Path) -> Result<MountInfo> {
        let loc = self.locate(path)?;
        if loc.inner != "/" {
            return Err(JobStageError::Invalid(format!(
                "{} is inside the mount {}, not its root",
                path.display(),
                loc.mount.path.display()
            )));
        }
        Ok(loc.mount)
    }

    /// All stage tasks of this job, with live progress.
    pub async fn tasks(&mut self) -> Result<Vec<api::StageTask>> {
        Ok(self
            .mgr
            .list_stages(api::ListStagesRequest {
                session: self.nodes.session,
            })
            .await
            .map_err(JobStageError::Manager)?
            .into_inner()
            .tasks)
    }

    /// The tasks naming `path` (see [`covering`]); `NoStage` if there are none.
    pub async fn tasks_for(&mut self, path: &Path, scope: Scope) -> Result<Vec<api::StageTask>> {
        let loc = self.locate(path)?;
        let all = self.tasks().await?;
        let hits: Vec<api::StageTask> = covering(&all, &loc, scope).into_iter().cloned().collect();
        if hits.is_empty() {
            return Err(JobStageError::NoStage(path.to_path_buf()));
        }
        Ok(hits)
    }

    /// Starts (or, for [`When::AtJobEnd`], records) copies: one task per instance namespace
    /// the items touch. Sources are checked here first, so a missing one fails with its own
    /// errno before the manager is asked; a file or directory with a stage in progress is
    /// refused (`Busy`); a task that fails while planned is an error (`Failed`).
    pub async fn start(
        &mut self,
        direction: Direction,
        items: &[JobItem],
        when: When,
        workers: u32,
    ) -> Result<Vec<api::StageTask>> {
        if items.is_empty() {
            return Err(JobStageError::Invalid("nothing to stage".into()));
        }
        let existing = self.tasks().await?;
        // (instance, namespace) -> items, in the callers' order.
        let mut groups: Vec<((u64, u32), Vec<StageItem>)> = Vec::new();
        for it in items {
            let source = match direction {
                Direction::In => &it.pfs,
                Direction::Out => &it.bb,
            };
            let meta = std::fs::metadata(source).map_err(|e| JobStageError::Io {
                path: source.clone(),
                source: e,
            })?;
            let want_dir = it.kind == ItemKind::Directory;
            if meta.is_dir() != want_dir {
                return Err(JobStageError::Io {
                    path: source.clone(),
                    source: std::io::Error::from_raw_os_error(if want_dir {
                        libc::ENOTDIR
                    } else {
                        libc::EISDIR
                    }),
                });
            }
            let loc = self.locate(&it.bb)?;
            let scope = if want_dir {
                Scope::Directory
            } else {
                Scope::File
            };
            if let Some(t) = covering(&existing, &loc, scope)
                .into_iter()
                .find(|t| pending(t))
            {
                return Err(JobStageError::Busy {
                    path: it.bb.clone(),
                    task: t.id,
                });
            }
            let pfs = std::path::absolute(&it.pfs).map_err(|e| JobStageError::Io {
                path: it.pfs.clone(),
                source: e,
            })?;
            let key = (loc.mount.instance, loc.mount.ns);
            let item = StageItem {
                kind: it.kind,
                pfs,
                instance_path: loc.inner,
            };
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => v.push(item),
                None => groups.push((key, vec![item])),
            }
        }
        let mut out = Vec::new();
        for ((instance, namespace), items) in groups {
            let items_json = serde_json::to_string(&items)
                .map_err(|e| JobStageError::Invalid(format!("stage items: {e}")))?;
            let t = self
                .mgr
                .start_stage(api::StartStageRequest {
                    session: self.nodes.session,
                    instance,
                    namespace,
                    direction: direction.as_str().into(),
                    items_json,
                    workers,
                    checksum: false,
                    deferred: when == When::AtJobEnd,
                    origin: String::new(),
                })
                .await
                .map_err(JobStageError::Manager)?
                .into_inner();
            // Planning failed (a source vanished, the stage-in does not fit): say so now.
            if t.state == "failed" {
                let message = failure_message(&t);
                return Err(JobStageError::Failed {
                    task: t.id,
                    errno: errno_of_message(&message),
                    message,
                });
            }
            out.push(t);
        }
        Ok(out)
    }

    /// An instance the job uses (its descriptor tells its layout).
    pub async fn instance(&mut self, id: u64) -> Result<api::Instance> {
        Ok(self
            .mgr
            .get_instance(api::GetInstanceRequest {
                id,
                persistent_name: String::new(),
            })
            .await
            .map_err(JobStageError::Manager)?
            .into_inner())
    }

    /// Starts deferred tasks now.
    pub async fn activate(&mut self, id: u64) -> Result<api::StageTask> {
        Ok(self
            .mgr
            .activate_stage(api::GetStageRequest { id })
            .await
            .map_err(JobStageError::Manager)?
            .into_inner())
    }

    /// Terminates a task (deferred, queued or running) and returns it ended.
    pub async fn cancel(&mut self, id: u64) -> Result<api::StageTask> {
        Ok(self
            .mgr
            .cancel_stage(api::GetStageRequest { id })
            .await
            .map_err(JobStageError::Manager)?
            .into_inner())
    }

    /// Files in flight for the later stage tasks of the instance mounted at `path`.
    pub async fn set_concurrency(&mut self, path: &Path, concurrency: u32) -> Result<()> {
        let loc = self.locate(path)?;
        self.mgr
            .set_stage_concurrency(api::SetStageConcurrencyRequest {
                session: self.nodes.session,
                instance: loc.mount.instance,
                concurrency,
            })
            .await
            .map_err(JobStageError::Manager)?;
        Ok(())
    }

    /// Waits for the task to end (quietly) and returns it; a failed task is an error.
    pub async fn wait(&mut self, t: api::StageTask) -> Result<api::StageTask> {
        let id = t.id;
        let done = wait_stage(&mut self.mgr, t, "", true, || false)
            .await
            .map_err(|e| JobStageError::Unreachable {
                addr: self.nodes.manager.clone(),
                message: format!("while waiting for stage task {id}: {e:#}"),
            })?;
        if done.state == "failed" {
            let message = failure_message(&done);
            return Err(JobStageError::Failed {
                task: done.id,
                errno: errno_of_message(&message),
                message,
            });
        }
        Ok(done)
    }

    /// Waits for every pending task naming `path`; deferred ones are not waited for (they run
    /// at the end of the job). Fails with the first failure.
    pub async fn wait_path(&mut self, path: &Path, scope: Scope) -> Result<()> {
        let tasks = self.tasks_for(path, scope).await?;
        let mut first_err = None;
        for t in tasks.into_iter().filter(|t| t.state != "deferred") {
            if let Err(e) = self.wait(t).await {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// A task's reason for failing: its error and its first failed file, preferring one whose
/// error names an errno (put last, so that [`errno_of_message`] finds the errno that copy saw).
pub fn failure_message(t: &api::StageTask) -> String {
    let all = failures(t);
    let first = all
        .iter()
        .find(|(_, e)| e.contains("(os error "))
        .or(all.first())
        .map(|(path, error)| match path.is_empty() {
            // The copy's top (a destination directory that cannot be made or used).
            true => error.clone(),
            false => format!("{path}: {error}"),
        });
    match (t.error.is_empty(), first) {
        (false, Some(f)) => format!("{}; first: {f}", t.error),
        (false, None) => t.error.clone(),
        (true, Some(f)) => f,
        (true, None) => "failed".into(),
    }
}

/// The files a task could not copy: (path, error), the path on the side of the instance when
/// it is known (the source of a stage-out, the destination of a stage-in).
pub fn failures(t: &api::StageTask) -> Vec<(String, String)> {
    let v: Vec<serde_json::Value> = serde_json::from_str(&t.failures_json).unwrap_or_default();
    v.iter()
        .map(|f| {
            let key = if t.direction == "in" {
                "destination"
            } else {
                "path"
            };
            (
                f[key].as_str().unwrap_or_default().to_string(),
                f["error"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: u64, state: &str, items: &[(ItemKind, &str)]) -> api::StageTask {
        let items: Vec<StageItem> = items
            .iter()
            .map(|(k, p)| StageItem {
                kind: *k,
                pfs: PathBuf::from("/pfs/x"),
                instance_path: p.to_string(),
            })
            .collect();
        api::StageTask {
            id,
            instance: 7,
            namespace: 0,
            state: state.into(),
            items_json: serde_json::to_string(&items).unwrap(),
            ..Default::default()
        }
    }

    fn loc(inner: &str) -> Located {
        Located {
            mount: MountInfo {
                path: PathBuf::from("/bb"),
                instance: 7,
                ns: 0,
                var: "DW_JOB_STRIPED".into(),
            },
            inner: inner.into(),
        }
    }

    #[test]
    fn a_file_query_sees_only_the_latest_task_naming_the_file_or_its_directory() {
        let tasks = vec![
            task(1, "done", &[(ItemKind::File, "/a/f")]),
            task(2, "running", &[(ItemKind::Directory, "/a")]),
            task(3, "done", &[(ItemKind::File, "/a/fg")]),
        ];
        let hits = covering(&tasks, &loc("/a/f"), Scope::File);
        assert_eq!(hits.iter().map(|t| t.id).collect::<Vec<_>>(), vec![2]);
        assert!(covering(&tasks, &loc("/a/g"), Scope::File)[0].id == 2);
        assert!(covering(&tasks, &loc("/b"), Scope::File).is_empty());
        // "/a/fg" is not under "/a/f".
        assert!(covering(&tasks[..1], &loc("/a/fg"), Scope::File).is_empty());
    }

    #[test]
    fn a_directory_query_counts_every_task_inside_or_around_it() {
        let tasks = vec![
            task(1, "done", &[(ItemKind::File, "/d/x")]),
            task(2, "failed", &[(ItemKind::File, "/d/sub/y")]),
            task(3, "deferred", &[(ItemKind::Directory, "/")]),
            task(4, "done", &[(ItemKind::File, "/e/z")]),
            task(5, "cancelled", &[(ItemKind::File, "/d/w")]),
        ];
        let hits = covering(&tasks, &loc("/d"), Scope::Directory);
        assert_eq!(hits.iter().map(|t| t.id).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(
            StageCounts::of(&hits),
            StageCounts {
                complete: 1,
                pending: 0,
                deferred: 1,
                failed: 1
            }
        );
    }

    #[test]
    fn tasks_of_another_instance_or_namespace_do_not_match() {
        let mut t = task(1, "done", &[(ItemKind::File, "/f")]);
        t.namespace = 1;
        assert!(covering(&[t], &loc("/f"), Scope::File).is_empty());
    }

    #[test]
    fn the_errno_of_an_io_message_is_recovered() {
        assert_eq!(
            errno_of_message("/p/x: No such file or directory (os error 2)"),
            2
        );
        assert_eq!(errno_of_message("1 file(s) could not be copied"), libc::EIO);
        assert_eq!(errno_of_message("(os error x)"), libc::EIO);
    }
}
