//! Connections: one thread per client connection, reading request frames in order and answering
//! each with one response frame.
//!
//! Blocking threads rather than an async runtime: a connection's requests are short file or
//! metadata operations, a thread wakes directly on its socket, and the request and reply buffers
//! are reused for the life of the connection (no allocation per 1 MiB write). Clients get
//! parallelism by opening several connections. A malformed frame is answered with an error when
//! its request id is known and the connection is closed; it never takes the server down.

use crate::registry::Registry;
use std::io::{BufReader, Read, Write};
use std::sync::Arc;
use surge_core::{Ino, InstanceId, NamespaceId};
use surge_proto::codec::{self, CodecError};
use surge_proto::transport::Polled;
use surge_proto::{BatchDone, ErrorCode, ErrorReply, Request, Response};
use tracing::{debug, info, warn};

/// Answers one request acting for client `session` (frame header; 0 for none). Read data is
/// placed in `out` and sent as the payload.
pub fn handle(
    reg: &Registry,
    session: u32,
    req: Request,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Response {
    out.clear();
    let r: Result<Response, ErrorReply> = (|| {
        Ok(match req {
            Request::Status => Response::Status(reg.status()),
            Request::CreateFragment {
                instance,
                fragment,
                capacity,
                descriptor,
            } => {
                reg.create_fragment(instance, fragment, capacity, descriptor)?;
                Response::Ok
            }
            Request::DestroyFragment { instance, fragment } => {
                reg.destroy_fragment(instance, fragment)?;
                Response::Ok
            }
            Request::CreateNamespace {
                instance,
                ns,
                descriptor,
                root_uid,
                root_gid,
                root_perm,
            } => {
                reg.create_namespace(instance, ns, descriptor, (root_uid, root_gid, root_perm))?;
                Response::Ok
            }
            Request::DestroyNamespace { instance, ns } => {
                reg.destroy_namespace(instance, ns)?;
                Response::Ok
            }
            Request::Describe { instance } => Response::Descriptor(reg.describe(instance)?),
            Request::Write {
                instance,
                fragment,
                file,
                offset,
            } => Response::Written {
                len: reg
                    .fragment(instance, fragment)?
                    .write(file, offset, payload)?,
            },
            Request::Read {
                instance,
                fragment,
                file,
                offset,
                len,
            } => {
                reg.fragment(instance, fragment)?
                    .read(file, offset, len, out)?;
                Response::Data
            }
            Request::TruncateObject {
                instance,
                fragment,
                file,
                len,
            } => {
                reg.fragment(instance, fragment)?.truncate(file, len)?;
                Response::Ok
            }
            Request::RemoveObject {
                instance,
                fragment,
                file,
            } => {
                reg.fragment(instance, fragment)?.remove(file)?;
                Response::Ok
            }
            Request::SyncObject {
                instance,
                fragment,
                file,
            } => {
                reg.fragment(instance, fragment)?.sync(file)?;
                Response::Ok
            }
            Request::LocalObject {
                instance,
                fragment,
                file,
            } => {
                let (path, dev, ino) = reg.fragment(instance, fragment)?.local_object(file)?;
                Response::LocalObject { path, dev, ino }
            }
            Request::ObjectChanged {
                instance,
                fragment,
                file,
            } => {
                reg.fragment(instance, fragment)?.changed(file)?;
                Response::Ok
            }
            Request::AllocateObject {
                instance,
                fragment,
                file,
                offset,
                len,
                mode,
            } => {
                reg.fragment(instance, fragment)?
                    .allocate(file, offset, len, mode)?;
                Response::Ok
            }
            Request::FragmentUsage { instance, fragment } => {
                let f = reg.fragment(instance, fragment)?;
                Response::Usage {
                    capacity: f.capacity,
                    used: f.used(),
                }
            }
            meta => {
                let (instance, ns) = meta.namespace().ok_or_else(|| {
                    ErrorReply::new(
                        ErrorCode::Invalid,
                        format!("unhandled opcode {}", meta.opcode()),
                    )
                })?;
                let purge = match &meta {
                    Request::Purge { ino, .. } => Some(*ino),
                    _ => None,
                };
                let namespace = reg.namespace(instance, ns)?;
                let resp = match meta {
                    Request::WaitRecall { wait_ms, .. } => {
                        Response::Recall(namespace.wait_recall(session, wait_ms))
                    }
                    Request::ReleaseLeases { inos, .. } => {
                        namespace.release_leases(session, &inos);
                        Response::Ok
                    }
                    other => namespace.call_as(session, other),
                };
                // Inodes the metadata server forgot: their local objects go too.
                let forgotten: Vec<Ino> = match &resp {
                    Response::Removed { unlinked: u, .. } if u.purged => vec![u.ino],
                    Response::Renamed {
                        replaced: Some(u), ..
                    } if u.purged => vec![u.ino],
                    Response::Ok => purge.into_iter().collect(),
                    Response::BatchDone(results) => results
                        .iter()
                        .flatten()
                        .filter_map(|r| match r {
                            BatchDone::Unlinked { unlinked: u, .. } if u.purged => Some(u.ino),
                            _ => None,
                        })
                        .collect(),
                    _ => Vec::new(),
                };
                for ino in forgotten {
                    reg.remove_local_objects(instance, surge_core::FileId { ns, ino });
                }
                resp
            }
        })
    })();
    r.unwrap_or_else(Response::Error)
}

/// Serves one connection until the peer closes it or sends something unparseable.
pub fn serve<S: Read>(reg: Arc<Registry>, stream: S, mut writer: impl Write, peer: String) {
    debug!("connection from {peer}");
    let _counted = crate::metrics::connection();
    let mut reader = BufReader::with_capacity(64 * 1024, stream);
    let mut payload = Vec::new();
    let mut out = Vec::new();
    // Sessions that waited for lease recalls here: their leases go when this connection does.
    let mut recall_waits: Vec<(InstanceId, NamespaceId, u32)> = Vec::new();
    // What this connection may do, once it presented a capability.
    let mut grant: Option<surge_auth::Claims> = None;
    loop {
        match codec::read_request(&mut reader, &mut payload) {
            Ok(None) => break,
            Ok(Some(frame)) => {
                let op = frame.header.opcode;
                let id = frame.header.request_id;
                let session = frame.header.session;
                if let Request::Authenticate { token } = &frame.request {
                    let resp = match crate::access::authenticate(&reg.key, token) {
                        Ok(claims) => {
                            debug!(
                                "{peer}: acts for uid {} ({:?}, instance {})",
                                claims.caller.uid, claims.rights, claims.instance
                            );
                            grant = Some(claims);
                            Response::Ok
                        }
                        Err(e) => {
                            warn!("{peer}: capability refused: {e}");
                            Response::Error(e)
                        }
                    };
                    if codec::write_response(&mut writer, op, id, &resp, &[]).is_err() {
                        break;
                    }
                    continue;
                }
                if let Err(e) = crate::access::allowed(grant.as_ref(), &frame.request) {
                    debug!("{peer}: request {id} (op {op}) refused: {e}");
                    let resp = Response::Error(e);
                    if codec::write_response(&mut writer, op, id, &resp, &[]).is_err() {
                        break;
                    }
                    continue;
                }
                if let Request::WaitRecall { instance, ns, .. } = &frame.request {
                    if session != 0 && !recall_waits.contains(&(*instance, *ns, session)) {
                        recall_waits.push((*instance, *ns, session));
                    }
                }
                let started = std::time::Instant::now();
                let name = frame.request.name();
                let resp = handle(&reg, session, frame.request, &payload, &mut out);
                let failed = matches!(resp, Response::Error(_));
                if let Response::Error(e) = &resp {
                    debug!("{peer}: request {id} (op {op}) failed: {e}");
                }
                let written = codec::write_response(&mut writer, op, id, &resp, &out);
                crate::metrics::request(name, started.elapsed(), payload.len(), out.len(), failed);
                if let Err(e) = written {
                    debug!("{peer}: cannot reply: {e}");
                    break;
                }
                // Do not keep a huge read buffer alive for an idle connection.
                if out.capacity() > 16 << 20 {
                    out = Vec::new();
                }
                if payload.capacity() > 16 << 20 {
                    payload = Vec::new();
                }
            }
            Err((id, e)) => {
                match &e {
                    CodecError::Io(ioe) if ioe.kind() == std::io::ErrorKind::ConnectionReset => {
                        debug!("{peer}: connection reset")
                    }
                    _ => warn!("{peer}: closing connection: {e}"),
                }
                if let Some(id) = id {
                    let _ = codec::write_error(&mut writer, 0, id, e.reply_code(), e.to_string());
                }
                break;
            }
        }
    }
    for (instance, ns, session) in recall_waits {
        if let Ok(n) = reg.namespace(instance, ns) {
            n.recall_connection_closed(session);
        }
    }
    debug!("connection from {peer} closed");
}

/// Accepts TCP connections forever, one thread each.
pub fn accept_tcp(reg: Arc<Registry>, listener: std::net::TcpListener) {
    for conn in listener.incoming() {
        match conn {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                let peer = s.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                let Ok(w) = s.try_clone() else { continue };
                let reg = reg.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("conn-{peer}"))
                    .spawn(move || serve(reg, Polled(s), w, peer));
                if let Err(e) = spawned {
                    warn!("cannot start a connection thread: {e}");
                }
            }
            Err(e) => {
                warn!("accept failed: {e}");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    }
}

/// Accepts Unix-socket connections forever, one thread each.
pub fn accept_unix(reg: Arc<Registry>, listener: std::os::unix::net::UnixListener) {
    for conn in listener.incoming() {
        match conn {
            Ok(s) => {
                let Ok(w) = s.try_clone() else { continue };
                let reg = reg.clone();
                let spawned = std::thread::Builder::new()
                    .name("conn-unix".into())
                    .spawn(move || serve(reg, Polled(s), w, "unix".into()));
                if let Err(e) = spawned {
                    warn!("cannot start a connection thread: {e}");
                }
            }
            Err(e) => {
                info!("unix accept failed: {e}");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    }
}
