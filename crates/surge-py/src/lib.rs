//! `surge._native`: the Rust half of the `surge` Python package (`python/surge/__init__.py` is
//! the typed, documented face). Three parts, each a thin layer over the Rust libraries:
//!
//! - in-job staging over [`surge_stage::job`] (what `surge stage` and libdatawarp use);
//! - the manager's views (`surge pool ls --json`, ...) over its gRPC API and
//!   [`surge_manager::views`], returned as JSON text;
//! - the native instance API (stat, list, read, write, mkdir of instance paths, no FUSE) over
//!   [`surge_client::InstanceClient`] and [`surge_stage::ns`].
//!
//! Every call runs on a short-lived runtime with the GIL released, and fails with `OSError`
//! (its errno picks the subclass: `FileNotFoundError`, ...) carrying Surge's message.

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use surge_api::v1 as api;
use surge_client::InstanceClient;
use surge_core::NamespaceId;
use surge_proto::{FileKind, NewNode, SetAttr};
use surge_stage::job::{JobItem, JobStageError, JobStager, Scope, StageCounts, When};
use surge_stage::{ns, Direction, ItemKind};

fn os_error(errno: i32, msg: impl std::fmt::Display) -> PyErr {
    PyOSError::new_err((errno, msg.to_string()))
}

fn job_err(e: JobStageError) -> PyErr {
    os_error(e.errno(), e)
}

fn client_err(path: &str, e: surge_client::ClientError) -> PyErr {
    os_error(e.errno(), format!("{path}: {e}"))
}

/// Runs `f` on a runtime of its own, without the GIL.
fn block<T: Send>(py: Python<'_>, f: impl Future<Output = PyResult<T>> + Send) -> PyResult<T> {
    py.detach(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| os_error(libc::EIO, format!("cannot start a runtime: {e}")))?
            .block_on(f)
    })
}

fn task_json(t: &api::StageTask) -> String {
    surge_manager::views::stage_json(t).to_string()
}

// --- in-job staging ---

fn kind(directory: bool) -> ItemKind {
    if directory {
        ItemKind::Directory
    } else {
        ItemKind::File
    }
}

/// Starts a stage-in; returns the task as JSON.
#[pyfunction]
#[pyo3(signature = (bb, pfs, directory=false))]
fn stage_in(py: Python<'_>, bb: PathBuf, pfs: PathBuf, directory: bool) -> PyResult<String> {
    block(py, async move {
        let mut js = JobStager::from_env().await.map_err(job_err)?;
        let item = JobItem {
            kind: kind(directory),
            bb,
            pfs,
        };
        let t = js
            .start(Direction::In, &[item], When::Now, 0)
            .await
            .map_err(job_err)?;
        Ok(t.first().map(task_json).unwrap_or_default())
    })
}

/// Starts (or defers to the job's end) a stage-out; returns the task as JSON.
#[pyfunction]
#[pyo3(signature = (bb, pfs, directory=false, at_job_end=false))]
fn stage_out(
    py: Python<'_>,
    bb: PathBuf,
    pfs: PathBuf,
    directory: bool,
    at_job_end: bool,
) -> PyResult<String> {
    block(py, async move {
        let mut js = JobStager::from_env().await.map_err(job_err)?;
        let item = JobItem {
            kind: kind(directory),
            bb,
            pfs,
        };
        let when = if at_job_end {
            When::AtJobEnd
        } else {
            When::Now
        };
        let t = js
            .start(Direction::Out, &[item], when, 0)
            .await
            .map_err(job_err)?;
        Ok(t.first().map(task_json).unwrap_or_default())
    })
}

/// The job's stage tasks as a JSON list.
#[pyfunction]
fn tasks(py: Python<'_>) -> PyResult<String> {
    block(py, async move {
        let mut js = JobStager::from_env().await.map_err(job_err)?;
        let all = js.tasks().await.map_err(job_err)?;
        Ok(
            serde_json::Value::Array(all.iter().map(surge_manager::views::stage_json).collect())
                .to_string(),
        )
    })
}

/// Waits for a task; returns it as JSON; a failed task raises.
#[pyfunction]
fn wait(py: Python<'_>, task: u64) -> PyResult<String> {
    block(py, async move {
        let mut js = JobStager::from_env().await.map_err(job_err)?;
        let t = js
            .tasks()
            .await
            .map_err(job_err)?
            .into_iter()
            .find(|t| t.id == task)
            .ok_or_else(|| os_error(libc::ENOENT, format!("this job has no stage task {task}")))?;
        let done = js.wait(t).await.map_err(job_err)?;
        Ok(task_json(&done))
    })
}

/// Waits for every stage naming a path (deferred ones excepted).
#[pyfunction]
#[pyo3(signature = (path, directory=false))]
fn wait_path(py: Python<'_>, path: PathBuf, directory: bool) -> PyResult<()> {
    block(py, async move {
        let mut js = JobStager::from_env().await.map_err(job_err)?;
        let scope = if directory {
            Scope::Directory
        } else {
            Scope::File
        };
        js.wait_path(&path, scope).await.map_err(job_err)
    })
}

/// Terminates a task; returns it as JSON.
#[pyfunction]
fn cancel(py: Python<'_>, task: u64) -> PyResult<String> {
    block(py, async move {
        let mut js = JobStager::from_env().await.map_err(job_err)?;
        Ok(task_json(&js.cancel(task).await.map_err(job_err)?))
    })
}

/// Counts of the stages naming a path: (complete, pending, deferred, failed).
#[pyfunction]
#[pyo3(signature = (path, directory=false))]
fn query(py: Python<'_>, path: PathBuf, directory: bool) -> PyResult<(u32, u32, u32, u32)> {
    block(py, async move {
        let mut js = JobStager::from_env().await.map_err(job_err)?;
        let scope = if directory {
            Scope::Directory
        } else {
            Scope::File
        };
        let hits = js.tasks_for(&path, scope).await.map_err(job_err)?;
        let c = StageCounts::of(&hits.iter().collect::<Vec<_>>());
        Ok((c.complete, c.pending, c.deferred, c.failed))
    })
}

// --- the manager's views ---

/// A view of the manager at `addr` as a JSON list: pools, servers, instances, sessions or
/// stages.
#[pyfunction]
fn manager_view(py: Python<'_>, addr: String, what: String) -> PyResult<String> {
    use surge_manager::views;
    block(py, async move {
        let mut c = surge_api::connect(&addr)
            .await
            .map_err(|e| os_error(libc::ECONNREFUSED, format!("{e:#}")))?;
        let status = |s: tonic::Status| os_error(libc::EIO, s.message());
        let v: Vec<serde_json::Value> = match what.as_str() {
            "pools" => c
                .list_pools(api::Empty {})
                .await
                .map_err(status)?
                .into_inner()
                .pools
                .iter()
                .map(views::pool_json)
                .collect(),
            "servers" => c
                .list_servers(api::Empty {})
                .await
                .map_err(status)?
                .into_inner()
                .servers
                .iter()
                .map(views::server_json)
                .collect(),
            "instances" => c
                .list_instances(api::Empty {})
                .await
                .map_err(status)?
                .into_inner()
                .instances
                .iter()
                .map(views::instance_json)
                .collect(),
            "sessions" => c
                .list_sessions(api::Empty {})
                .await
                .map_err(status)?
                .into_inner()
                .sessions
                .iter()
                .map(views::session_json)
                .collect(),
            "stages" => c
                .list_stages(api::ListStagesRequest { session: 0 })
                .await
                .map_err(status)?
                .into_inner()
                .tasks
                .iter()
                .map(views::stage_json)
                .collect(),
            other => {
                return Err(os_error(
                    libc::EINVAL,
                    format!("no view '{other}': pools, servers, instances, sessions or stages"),
                ))
            }
        };
        Ok(serde_json::Value::Array(v).to_string())
    })
}

// --- the native instance API ---

/// One namespace of an instance, reached without FUSE.
#[pyclass(module = "surge._native")]
struct Instance {
    client: std::sync::Arc<InstanceClient>,
}

fn parse(path: &str) -> PyResult<PathBuf> {
    ns::parse_instance_path(path).map_err(|e| os_error(libc::EINVAL, e))
}

fn attr_json(a: &surge_proto::Attr) -> String {
    let kind = match a.kind {
        FileKind::Dir => "directory",
        FileKind::Symlink => "symlink",
        FileKind::File => "file",
        FileKind::Fifo => "fifo",
        FileKind::Socket => "socket",
        FileKind::CharDev => "char-device",
        FileKind::BlockDev => "block-device",
    };
    serde_json::json!({
        "ino": a.ino, "kind": kind, "mode": a.perm, "nlink": a.nlink, "uid": a.uid,
        "gid": a.gid, "size": a.size, "mtime": a.mtime.secs, "ctime": a.ctime.secs,
    })
    .to_string()
}

#[pymethods]
impl Instance {
    /// Connects to namespace `ns` of an instance the manager at `manager` knows, by id or by
    /// persistent name.
    #[new]
    #[pyo3(signature = (manager, instance, ns=0))]
    fn new(py: Python<'_>, manager: String, instance: String, ns: u32) -> PyResult<Instance> {
        block(py, async move {
            let mut c = surge_api::connect(&manager)
                .await
                .map_err(|e| os_error(libc::ECONNREFUSED, format!("{e:#}")))?;
            let (id, name) = match instance.parse::<u64>() {
                Ok(id) => (id, String::new()),
                Err(_) => (0, instance.clone()),
            };
            // The manager gives the descriptor and a capability for its servers, if this
            // user may use the instance (checked with MUNGE).
            let cap = c
                .get_capability(api::GetCapabilityRequest {
                    instance: id,
                    persistent_name: name,
                    namespace: ns,
                    all_namespaces: false,
                })
                .await
                .map_err(|s| {
                    let errno = if s.code() == tonic::Code::PermissionDenied {
                        libc::EACCES
                    } else {
                        libc::ENOENT
                    };
                    os_error(errno, s.message())
                })?
                .into_inner();
            let desc: surge_proto::InstanceDescriptor = serde_json::from_str(&cap.descriptor_json)
                .map_err(|e| os_error(libc::EIO, format!("instance {instance}: {e}")))?;
            let token = surge_auth::Token::from_text(&cap.token)
                .map_err(|e| os_error(libc::EIO, e.to_string()))?;
            let client = InstanceClient::new(desc, NamespaceId(ns), token)
                .map_err(|e| client_err(&instance, e))?;
            Ok(Instance {
                client: std::sync::Arc::new(client),
            })
        })
    }

    /// Attributes of a path, as JSON.
    fn stat(&self, py: Python<'_>, path: String) -> PyResult<String> {
        let c = self.client.clone();
        block(py, async move {
            let a = ns::resolve(&c, &parse(&path)?)
                .await
                .map_err(|e| client_err(&path, e))?;
            Ok(attr_json(&a))
        })
    }

    /// Names in a directory.
    fn listdir(&self, py: Python<'_>, path: String) -> PyResult<Vec<String>> {
        let c = self.client.clone();
        block(py, async move {
            let a = ns::resolve(&c, &parse(&path)?)
                .await
                .map_err(|e| client_err(&path, e))?;
            let entries = ns::list_dir(&c, a.ino, false)
                .await
                .map_err(|e| client_err(&path, e))?;
            Ok(entries
                .iter()
                .filter(|e| e.name != b"." && e.name != b"..")
                .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                .collect())
        })
    }

    /// `size` bytes (all if negative) of a file from `offset`.
    #[pyo3(signature = (path, offset=0, size=-1))]
    fn read<'p>(
        &self,
        py: Python<'p>,
        path: String,
        offset: u64,
        size: i64,
    ) -> PyResult<Bound<'p, PyBytes>> {
        let c = self.client.clone();
        let data = block(py, async move {
            let a = ns::resolve(&c, &parse(&path)?)
                .await
                .map_err(|e| client_err(&path, e))?;
            if a.kind == FileKind::Dir {
                return Err(os_error(libc::EISDIR, format!("{path} is a directory")));
            }
            let end = if size < 0 {
                a.size
            } else {
                a.size.min(offset.saturating_add(size as u64))
            };
            let len = end.saturating_sub(offset);
            c.read(a.ino, offset, len)
                .await
                .map_err(|e| client_err(&path, e))
        })?;
        Ok(PyBytes::new(py, &data))
    }

    /// Creates a file holding `data` (its parent must exist; an existing file is an error).
    fn write(&self, py: Python<'_>, path: String, data: Vec<u8>) -> PyResult<u64> {
        let c = self.client.clone();
        block(py, async move {
            let p = parse(&path)?;
            let (parent, name) = parent_and_name(&c, &p, &path).await?;
            // SAFETY: getuid/getgid have no preconditions.
            let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
            let a = c
                .create(
                    parent,
                    name.as_os_str().as_bytes(),
                    NewNode::File,
                    0o644,
                    uid,
                    gid,
                )
                .await
                .map_err(|e| client_err(&path, e))?;
            let mut offset = 0u64;
            for piece in data.chunks(8 << 20) {
                c.write(a.ino, offset, piece)
                    .await
                    .map_err(|e| client_err(&path, e))?;
                offset += piece.len() as u64;
            }
            let set = SetAttr {
                size: Some(data.len() as u64),
                ..SetAttr::default()
            };
            c.setattr(a.ino, set, 0)
                .await
                .map_err(|e| client_err(&path, e))?;
            Ok(data.len() as u64)
        })
    }

    /// Creates a directory (its parent must exist).
    fn mkdir(&self, py: Python<'_>, path: String) -> PyResult<()> {
        let c = self.client.clone();
        block(py, async move {
            let p = parse(&path)?;
            let (parent, name) = parent_and_name(&c, &p, &path).await?;
            // SAFETY: as above.
            let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
            c.create(
                parent,
                name.as_os_str().as_bytes(),
                NewNode::Dir,
                0o755,
                uid,
                gid,
            )
            .await
            .map_err(|e| client_err(&path, e))?;
            Ok(())
        })
    }
}

/// The inode of a path's parent directory, and the path's last name.
async fn parent_and_name(
    c: &InstanceClient,
    p: &Path,
    shown: &str,
) -> PyResult<(surge_core::Ino, PathBuf)> {
    let name = p
        .file_name()
        .ok_or_else(|| os_error(libc::EINVAL, format!("{shown} names no file")))?;
    let parent = p.parent().unwrap_or(Path::new("/"));
    let a = ns::resolve(c, parent)
        .await
        .map_err(|e| client_err(shown, e))?;
    if a.kind != FileKind::Dir {
        return Err(os_error(
            libc::ENOTDIR,
            format!("{}: not a directory", parent.display()),
        ));
    }
    Ok((a.ino, PathBuf::from(name)))
}

/// Whether this process runs inside a `surge run` job.
#[pyfunction]
fn in_job() -> bool {
    surge_stage::job::nodes::NodesFile::from_env().is_ok()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(stage_in, m)?)?;
    m.add_function(wrap_pyfunction!(stage_out, m)?)?;
    m.add_function(wrap_pyfunction!(tasks, m)?)?;
    m.add_function(wrap_pyfunction!(wait, m)?)?;
    m.add_function(wrap_pyfunction!(wait_path, m)?)?;
    m.add_function(wrap_pyfunction!(cancel, m)?)?;
    m.add_function(wrap_pyfunction!(query, m)?)?;
    m.add_function(wrap_pyfunction!(manager_view, m)?)?;
    m.add_function(wrap_pyfunction!(in_job, m)?)?;
    m.add_class::<Instance>()?;
    Ok(())
}
