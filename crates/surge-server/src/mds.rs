//! The metadata service of one namespace: a thread that owns the namespace's SQLite store and
//! answers requests from every connection.
//!
//! Group commit: the thread takes every request that is waiting, runs them in one transaction
//! (each in its own savepoint, so one failing request does not undo the others), commits once
//! and then replies. One client sees one transaction per operation; many clients share commits,
//! which is what lets the metadata rate grow with concurrency (Daley §5.1).

use crate::meta::{self, Ops};
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use surge_core::{InstanceId, NamespaceId};
use surge_proto::{ErrorCode, ErrorReply, Request, Response};
use tracing::{error, info, warn};

const MAX_BATCH: usize = 256;

struct Job {
    req: Request,
    reply: mpsc::SyncSender<Response>,
}

/// A running metadata service. Dropping it stops the thread after the requests in flight.
pub struct Namespace {
    pub instance: InstanceId,
    pub ns: NamespaceId,
    pub dir: PathBuf,
    tx: parking_lot::Mutex<Option<mpsc::Sender<Job>>>,
    thread: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Namespace {
    /// Opens the store in `dir` (created if missing) and starts the service thread.
    pub fn start(
        dir: &Path,
        instance: InstanceId,
        ns: NamespaceId,
        root: (u32, u32, u16),
    ) -> anyhow::Result<Namespace> {
        std::fs::create_dir_all(dir)?;
        let conn = meta::open(&dir.join("meta.db"), root.0, root.1, root.2)?;
        report_orphans(&conn, instance, ns);
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name(format!("mds-{instance}-{}", ns.0))
            .spawn(move || serve(conn, rx))?;
        Ok(Namespace {
            instance,
            ns,
            dir: dir.to_path_buf(),
            tx: parking_lot::Mutex::new(Some(tx)),
            thread: parking_lot::Mutex::new(Some(thread)),
        })
    }

    /// Runs one metadata request and waits for its committed result.
    pub fn call(&self, req: Request) -> Response {
        let (reply, rx) = mpsc::sync_channel(1);
        let sent = match self.tx.lock().as_ref() {
            Some(tx) => tx.send(Job { req, reply }).is_ok(),
            None => false,
        };
        if !sent {
            return Response::Error(ErrorReply::new(
                ErrorCode::UnknownNamespace,
                format!("namespace {}/{} is shutting down", self.instance, self.ns.0),
            ));
        }
        rx.recv().unwrap_or_else(|_| {
            Response::Error(ErrorReply::new(
                ErrorCode::Io,
                "metadata service stopped while handling the request",
            ))
        })
    }

    /// Stops the service thread and waits for it.
    pub fn stop(&self) {
        self.tx.lock().take();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        self.stop();
    }
}

fn report_orphans(conn: &Connection, instance: InstanceId, ns: NamespaceId) {
    let ops = Ops { tx: conn };
    match ops.orphans() {
        Ok(o) if !o.is_empty() => warn!(
            "namespace {instance}/{}: {} unlinked inodes still hold data (a client stopped before \
             closing them); their objects are kept until the instance is destroyed",
            ns.0,
            o.len()
        ),
        Ok(_) => {}
        Err(e) => warn!("namespace {instance}/{}: cannot list orphans: {e}", ns.0),
    }
}

fn is_read_only(req: &Request) -> bool {
    matches!(
        req,
        Request::Lookup { .. }
            | Request::GetAttr { .. }
            | Request::Readlink { .. }
            | Request::ReadDir { .. }
            | Request::NamespaceStats { .. }
    )
}

fn execute(ops: &Ops<'_>, req: &Request) -> Result<Response, ErrorReply> {
    Ok(match req {
        Request::Lookup { parent, name, .. } => Response::Attr(ops.lookup(*parent, name)?),
        Request::GetAttr { ino, .. } => Response::Attr(ops.getattr(*ino)?),
        Request::SetAttr { ino, set, .. } => Response::Attr(ops.setattr(*ino, set)?),
        Request::Create {
            parent,
            name,
            node,
            perm,
            uid,
            gid,
            ..
        } => Response::Attr(ops.create(*parent, name, node, *perm, *uid, *gid)?),
        Request::Link {
            ino,
            new_parent,
            new_name,
            ..
        } => Response::Attr(ops.link(*ino, *new_parent, new_name)?),
        Request::Unlink { parent, name, .. } => Response::Unlinked(ops.unlink(*parent, name)?),
        Request::Rmdir { parent, name, .. } => {
            ops.rmdir(*parent, name)?;
            Response::Ok
        }
        Request::Rename {
            parent,
            name,
            new_parent,
            new_name,
            flags,
            ..
        } => Response::Renamed {
            replaced: ops.rename(*parent, name, *new_parent, new_name, *flags)?,
        },
        Request::Readlink { ino, .. } => Response::Target(ops.readlink(*ino)?),
        Request::ReadDir {
            ino,
            after,
            max,
            plus,
            ..
        } => {
            let (entries, done) = ops.readdir(*ino, *after, *max, *plus)?;
            Response::Dir { entries, done }
        }
        Request::CommitWrite {
            ino, size, mtime, ..
        } => Response::Attr(ops.commit_write(*ino, *size, *mtime)?),
        Request::Purge { ino, .. } => {
            ops.purge(*ino)?;
            Response::Ok
        }
        Request::NamespaceStats { .. } => Response::NamespaceStats {
            inodes: ops.inode_count()?,
        },
        other => {
            return Err(ErrorReply::new(
                ErrorCode::Invalid,
                format!("opcode {} is not a metadata request", other.opcode()),
            ))
        }
    })
}

fn run_batch(conn: &mut Connection, batch: &[Job]) -> rusqlite::Result<Vec<Response>> {
    let mut tx = conn.transaction()?;
    let mut out = Vec::with_capacity(batch.len());
    for job in batch {
        if is_read_only(&job.req) {
            let r = execute(&Ops { tx: &tx }, &job.req);
            out.push(r.unwrap_or_else(Response::Error));
            continue;
        }
        let sp = tx.savepoint()?;
        match execute(&Ops { tx: &sp }, &job.req) {
            Ok(r) => {
                sp.commit()?;
                out.push(r);
            }
            // Dropping the savepoint rolls back this request's changes only.
            Err(e) => out.push(Response::Error(e)),
        }
    }
    tx.commit()?;
    Ok(out)
}

fn serve(mut conn: Connection, rx: mpsc::Receiver<Job>) {
    let name = std::thread::current().name().unwrap_or("mds").to_string();
    info!("{name}: metadata service started");
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while let Ok(first) = rx.recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        match run_batch(&mut conn, &batch) {
            Ok(replies) => {
                for (job, r) in batch.drain(..).zip(replies) {
                    let _ = job.reply.send(r);
                }
            }
            Err(e) => {
                error!("{name}: metadata transaction failed: {e}");
                for job in batch.drain(..) {
                    let _ = job.reply.send(Response::Error(ErrorReply::new(
                        ErrorCode::Io,
                        format!("metadata store: {e}"),
                    )));
                }
            }
        }
    }
    info!("{name}: metadata service stopped");
}
