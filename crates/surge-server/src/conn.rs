//! Connections: one thread per client connection, reading request frames in order and answering
//! each with one response frame, within the bounds of [`crate::admission`] (how many
//! connections) and of the connection's socket (how long a frame may take, how long a
//! connection may stay idle: see `surge_proto::transport::Polled`).
//!
//! Blocking threads rather than an async runtime: a connection's requests are short file or
//! metadata operations, a thread wakes directly on its socket, and the request and reply buffers
//! are reused for the life of the connection (no allocation per 1 MiB write). Clients get
//! parallelism by opening several connections. A malformed frame is answered with an error when
//! its request id is known and the connection is closed; it never takes the server down.

use crate::admission::{Admission, Peer, Ticket};
use crate::registry::Registry;
use std::io::{BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;
use surge_core::{Ino, InstanceId, NamespaceId};
use surge_proto::codec::{self, CodecError};
use surge_proto::frame::CONNECTION_ID;
use surge_proto::transport::Polled;
use surge_proto::{BatchDone, ErrorCode, ErrorReply, LockOp, Request, Response};
use tracing::{debug, warn};

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
            Request::AppendObject {
                instance,
                fragment,
                file,
                at_least,
            } => Response::ObjectAppended {
                offset: reg
                    .fragment(instance, fragment)?
                    .append(file, at_least, payload)?,
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
            Request::LocalFragment { instance, fragment } => {
                let (path, dev, ino) = reg.fragment(instance, fragment)?.local_dir()?;
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
            Request::ObjectAllocated {
                instance,
                fragment,
                file,
            } => Response::Allocated {
                bytes: reg.fragment(instance, fragment)?.allocated(file)?,
            },
            Request::ObjectLength {
                instance,
                fragment,
                file,
            } => Response::Length {
                len: reg.fragment(instance, fragment)?.length(file)?,
            },
            Request::SeekObject {
                instance,
                fragment,
                file,
                offset,
                hole,
            } => Response::Seek {
                offset: reg.fragment(instance, fragment)?.seek(file, offset, hole)?,
            },
            Request::FragmentUsage { instance, fragment } => {
                let f = reg.fragment(instance, fragment)?;
                Response::Usage {
                    capacity: f.capacity,
                    used: f.used() + reg.metadata_under(instance, fragment),
                    room: f.room(),
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
                        let (dirs, reap) = namespace.wait_recall(session, wait_ms);
                        Response::Recall { dirs, reap }
                    }
                    Request::ReleaseLeases { inos, .. } => {
                        namespace.release_leases(session, &inos);
                        Response::Ok
                    }
                    Request::ClaimOrphans { inos, .. } => Response::Recall {
                        dirs: Vec::new(),
                        reap: namespace.claim_orphans(session, &inos)?,
                    },
                    Request::Lock { op, .. } => lock(&namespace.locks, session, op)?,
                    other => namespace.call_as(session, other),
                };
                // Inodes the metadata server forgot: their local objects go too.
                let forgotten: Vec<Ino> = match &resp {
                    Response::Removed { unlinked: u, .. } if u.purged => vec![u.ino],
                    Response::Renamed {
                        replaced: Some(u), ..
                    } if u.purged => vec![u.ino],
                    Response::Ok => purge.into_iter().collect(),
                    Response::Recall { reap, .. } => reap.iter().map(|u| u.ino).collect(),
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

/// A request of the namespace's lock service (see [`crate::locks`]); `Keep` waits.
fn lock(locks: &crate::locks::LockTable, session: u32, op: LockOp) -> Result<Response, ErrorReply> {
    Ok(match op {
        LockOp::Test { owner, range } => Response::Lock(locks.test(session, owner, &range)),
        LockOp::Set {
            owner,
            range,
            pid,
            waiting,
        } => Response::Lock(locks.set(session, owner, &range, pid, waiting, false)?),
        LockOp::Reclaim { owner, range, pid } => {
            Response::Lock(locks.set(session, owner, &range, pid, false, true)?)
        }
        LockOp::Release { ino, owner } => {
            locks.release(session, ino, owner);
            Response::Ok
        }
        LockOp::Keep { after, wait_ms } => Response::LocksReleased(locks.keep(after, wait_ms)),
    })
}

/// How a connection's service ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The peer closed it, or it failed.
    Closed,
    /// No request came within the idle timeout: the peer was told (`IdleClosed`).
    Idle,
}

/// Serves one connection until the peer closes it, sends something unparseable, stalls in the
/// middle of a frame or stays idle past the bounds of `stream` (see [`codec::Waits`]).
/// `ticket` is told when the first request has come (see [`Ticket::spoke`]).
pub fn serve<C: Channel>(
    reg: Arc<Registry>,
    channel: C,
    peer: String,
    ticket: Option<&Ticket>,
) -> Ended {
    debug!("connection from {peer}");
    let _counted = crate::metrics::connection();
    let mut reader = BufReader::with_capacity(C::READ_BUFFER, channel);
    let mut payload = Vec::new();
    let mut out = Vec::new();
    let mut spoke = false;
    let mut ended = Ended::Closed;
    // Sessions that waited for lease recalls here: their leases go when this connection does.
    let mut recall_waits: Vec<(InstanceId, NamespaceId, u32)> = Vec::new();
    // Cache namespaces whose drain requests this connection carried (see `DrainHold`).
    let mut drains: Vec<(InstanceId, NamespaceId, u32)> = Vec::new();
    // Sessions whose locks live while this connection does (it carried their `Keep`).
    let mut keepers: Vec<(InstanceId, NamespaceId, u32)> = Vec::new();
    // Sessions whose metadata requests this connection carried: a session's files open for
    // writing are marked for recovery when its last such connection goes.
    let mut sessions: Vec<(InstanceId, NamespaceId, u32)> = Vec::new();
    // What this connection may do, once it presented a capability.
    let mut grant: Option<surge_auth::Claims> = None;
    loop {
        let limit = grant.is_none().then_some(surge_proto::frame::MAX_ANONYMOUS);
        match codec::read_request_within(&mut reader, &mut payload, limit) {
            Ok(None) => break,
            Ok(Some(frame)) => {
                if !spoke {
                    spoke = true;
                    if let Some(t) = ticket {
                        t.spoke();
                    }
                }
                let op = frame.header.opcode;
                let id = frame.header.request_id;
                let session = frame.header.session;
                if let Request::Authenticate { token } = &frame.request {
                    let binding = reader.get_ref().binding().to_vec();
                    let resp = match crate::access::authenticate(&reg, token, &binding) {
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
                    if codec::write_response(reader.get_mut(), op, id, &resp, &[]).is_err() {
                        break;
                    }
                    continue;
                }
                let checked = crate::access::allowed(grant.as_ref(), &frame.request)
                    .and_then(|()| crate::access::not_revoked(&reg, grant.as_ref()));
                if let Err(e) = checked {
                    debug!("{peer}: request {id} (op {op}) refused: {e}");
                    let resp = Response::Error(e);
                    if codec::write_response(reader.get_mut(), op, id, &resp, &[]).is_err() {
                        break;
                    }
                    continue;
                }
                if let Request::WaitRecall { instance, ns, .. } = &frame.request {
                    if session != 0 && !recall_waits.contains(&(*instance, *ns, session)) {
                        recall_waits.push((*instance, *ns, session));
                    }
                }
                if let Request::Lock {
                    instance,
                    ns,
                    op: LockOp::Keep { .. },
                } = &frame.request
                {
                    if session != 0 && !keepers.contains(&(*instance, *ns, session)) {
                        if let Ok(n) = reg.namespace(*instance, *ns) {
                            n.locks.keeper_opened(session);
                            keepers.push((*instance, *ns, session));
                        }
                    }
                }
                if session != 0 && frame.request.facts().service == surge_proto::Service::Metadata {
                    if let surge_proto::Scope::Namespace(instance, ns) = frame.request.scope() {
                        if !sessions.contains(&(instance, ns, session)) {
                            if let Ok(n) = reg.namespace(instance, ns) {
                                n.session_connected(session);
                                sessions.push((instance, ns, session));
                            }
                        }
                    }
                }
                if let Request::DrainHold { instance, ns, .. }
                | Request::DrainPoll { instance, ns, .. }
                | Request::DrainAck { instance, ns, .. } = &frame.request
                {
                    if session != 0 && !drains.contains(&(*instance, *ns, session)) {
                        if let Ok(n) = reg.namespace(*instance, *ns) {
                            n.drain_connection_opened(session);
                            drains.push((*instance, *ns, session));
                        }
                    }
                }
                let started = std::time::Instant::now();
                let name = frame.request.name();
                if let Request::Read {
                    instance,
                    fragment,
                    file,
                    offset,
                    len,
                } = &frame.request
                {
                    // The data goes from the object to the socket with the fewest copies the
                    // channel allows (`Channel::send_file`). Errors take the general path below.
                    let source = reg
                        .fragment(*instance, *fragment)
                        .and_then(|f| f.read_source(*file, *offset, *len));
                    if let Ok(source) = source {
                        let n = source.as_ref().map_or(0, |(_, n)| *n);
                        let mut head = Vec::new();
                        let w = reader.get_mut();
                        let sent =
                            codec::write_response_head(&mut head, op, id, &Response::Data, n)
                                .and_then(|()| match &source {
                                    Some((obj, n)) => w.send_file(&head, obj.file(), *offset, *n),
                                    None => w.write_all(&head),
                                });
                        crate::metrics::request(name, started.elapsed(), 0, n, false);
                        if let Err(e) = sent {
                            debug!("{peer}: cannot reply: {e}");
                            break;
                        }
                        continue;
                    }
                }
                let resp = handle(&reg, session, frame.request, &payload, &mut out);
                let failed = matches!(resp, Response::Error(_));
                if let Response::Error(e) = &resp {
                    debug!("{peer}: request {id} (op {op}) failed: {e}");
                }
                let written = codec::write_response(reader.get_mut(), op, id, &resp, &out);
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
            Err((_, CodecError::Idle(e))) => {
                // Nothing was read after the last reply: whatever the peer sends from now on
                // is not made, and the peer may send it again elsewhere.
                debug!("{peer}: closing an idle connection ({e})");
                let _ = codec::write_error(
                    reader.get_mut(),
                    0,
                    CONNECTION_ID,
                    ErrorCode::IdleClosed,
                    format!("server closes this connection: {e}"),
                );
                ended = Ended::Idle;
                break;
            }
            Err((id, e)) => {
                match &e {
                    // A TLS peer that closes without close_notify reads as UnexpectedEof.
                    CodecError::Io(ioe)
                        if matches!(
                            ioe.kind(),
                            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::UnexpectedEof
                        ) =>
                    {
                        debug!("{peer}: connection reset ({ioe})")
                    }
                    _ => warn!("{peer}: closing connection: {e}"),
                }
                if let Some(id) = id {
                    let _ =
                        codec::write_error(reader.get_mut(), 0, id, e.reply_code(), e.to_string());
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
    for (instance, ns, session) in keepers {
        if let Ok(n) = reg.namespace(instance, ns) {
            n.locks
                .keeper_closed(session, &format!("{}/{}", instance, ns.0));
        }
    }
    for (instance, ns, session) in sessions {
        if let Ok(n) = reg.namespace(instance, ns) {
            n.session_disconnected(session);
        }
    }
    for (instance, ns, session) in drains {
        if let Ok(n) = reg.namespace(instance, ns) {
            n.drain_connection_closed(session);
        }
    }
    debug!("connection from {peer} closed");
    ended
}

/// Sends `len` bytes of `file` from `offset` to the socket `to` with `sendfile(2)`; bytes the
/// file no longer holds (truncated meanwhile) are sent as zeros, so the frame keeps the length
/// its header announced.
fn send_file(
    out_fd: RawFd,
    to: &mut impl Write,
    file: &std::fs::File,
    offset: u64,
    len: usize,
) -> std::io::Result<()> {
    let mut off = offset as libc::off_t;
    let mut left = len;
    while left > 0 {
        // SAFETY: both descriptors are open for the duration of the call; `off` is a valid
        // out-parameter.
        let n = unsafe { libc::sendfile(out_fd, file.as_raw_fd(), &mut off, left) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::Interrupted => continue,
                // SO_SNDTIMEO ran out: the peer does not take its replies.
                std::io::ErrorKind::WouldBlock => {
                    return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, e))
                }
                _ => return Err(e),
            }
        }
        if n == 0 {
            break;
        }
        left -= n as usize;
    }
    if left > 0 {
        to.write_all(&vec![0u8; left])?;
    }
    Ok(())
}

/// How long a connection closed for idleness is kept (reading and dropping whatever comes) so
/// that the peer reads the `IdleClosed` notice before the close, not a reset.
const LINGER: Duration = Duration::from_secs(1);

/// A client connection as [`serve`] sees it: request frames in, replies out.
pub trait Channel: Read + Write + codec::Waits {
    /// Bytes of the buffer frames are read through: a clear socket's reads are many small
    /// system calls without one; a TLS connection's record layer buffers them already, and a
    /// second buffer would copy each frame's first bytes once more.
    const READ_BUFFER: usize;
    /// Sends a reply: `head` (its frame header and message), then `len` bytes of `file` from
    /// `offset` as its payload (zeros for bytes the file no longer holds), with the fewest
    /// copies the channel allows: `sendfile(2)` in clear (none through this process), the
    /// bytes read straight into the records that carry them in TLS (one).
    fn send_file(
        &mut self,
        head: &[u8],
        file: &std::fs::File,
        offset: u64,
        len: usize,
    ) -> std::io::Result<()>;
    /// The channel binding a capability must be presented for (empty when clear; see
    /// `surge_auth::Token::present`).
    fn binding(&self) -> &[u8];
}

/// A clear connection: reads wait as [`Polled`] says, writes go to the socket.
pub struct Clear<'a, S> {
    polled: Polled<&'a S>,
    sock: &'a S,
}

impl<S: AsFd> Read for Clear<'_, S>
where
    for<'b> &'b S: Read,
{
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.polled.read(buf)
    }
}

impl<S> Write for Clear<'_, S>
where
    for<'b> &'b S: Write,
{
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        (&mut &*self.sock).write(buf)
    }
    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        (&mut &*self.sock).write_vectored(bufs)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<S> codec::Waits for Clear<'_, S> {
    fn waiting(&mut self, phase: codec::Phase) {
        self.polled.waiting(phase)
    }
}

impl<S: AsFd> Channel for Clear<'_, S>
where
    for<'b> &'b S: Read + Write,
{
    const READ_BUFFER: usize = 64 * 1024;
    fn send_file(
        &mut self,
        head: &[u8],
        file: &std::fs::File,
        offset: u64,
        len: usize,
    ) -> std::io::Result<()> {
        self.write_all(head)?;
        let out_fd = self.sock.as_fd().as_raw_fd();
        send_file(out_fd, self, file, offset, len)
    }
    fn binding(&self) -> &[u8] {
        &[]
    }
}

/// The TCP socket under a TLS connection: reads wait as [`Polled`] says (the record layer
/// reads it only when it holds no whole record), writes go to the socket.
struct Wire<'a> {
    polled: Polled<&'a std::net::TcpStream>,
    sock: &'a std::net::TcpStream,
}

impl Read for Wire<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.polled.read(buf)
    }
}

impl Write for Wire<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        (&mut &*self.sock).write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A TLS 1.3 connection (see `surge_proto::tls`): rustls's handshake, then records sealed
/// and opened in place by `surge_proto::record`.
pub struct Tls<'a> {
    stream: surge_proto::record::Stream<Wire<'a>>,
    binding: Vec<u8>,
}

impl Read for Tls<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stream.read(buf)
    }
}

impl Write for Tls<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.write(buf)
    }
    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        self.stream.write_vectored(bufs)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
    }
}

impl codec::Waits for Tls<'_> {
    fn waiting(&mut self, phase: codec::Phase) {
        self.stream.sock.polled.waiting(phase)
    }
}

impl Channel for Tls<'_> {
    const READ_BUFFER: usize = 0;
    fn send_file(
        &mut self,
        head: &[u8],
        file: &std::fs::File,
        offset: u64,
        len: usize,
    ) -> std::io::Result<()> {
        self.stream.write_file(head, file, offset, len)
    }
    fn binding(&self) -> &[u8] {
        &self.binding
    }
}

/// A socket the server serves connections on.
trait Socket: AsFd + Send + 'static
where
    for<'a> &'a Self: Read + Write,
{
    fn set_write_timeout(&self, t: Option<Duration>) -> std::io::Result<()>;
    /// The TCP stream, to speak TLS on (a Unix socket never does: it never leaves the host).
    fn tcp(&self) -> Option<&std::net::TcpStream>;
}

impl Socket for std::net::TcpStream {
    fn set_write_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        std::net::TcpStream::set_write_timeout(self, t)
    }
    fn tcp(&self) -> Option<&std::net::TcpStream> {
        Some(self)
    }
}

impl Socket for std::os::unix::net::UnixStream {
    fn set_write_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        std::os::unix::net::UnixStream::set_write_timeout(self, t)
    }
    fn tcp(&self) -> Option<&std::net::TcpStream> {
        None
    }
}

/// How a TCP peer speaks, from its first byte: `Some(true)` TLS, `Some(false)` clear frames,
/// `None` nothing within `wait` (or the peer left).
fn speaks_tls(sock: &std::net::TcpStream, wait: Option<Duration>) -> Option<bool> {
    let fd = sock.as_raw_fd();
    let ready = match wait {
        Some(w) => matches!(surge_proto::transport::wait_readable(fd, w), Ok(true)),
        None => matches!(
            surge_proto::transport::wait_readable(fd, Duration::from_secs(3600 * 24)),
            Ok(true)
        ),
    };
    if !ready {
        return None;
    }
    let mut b = [0u8; 1];
    match sock.peek(&mut b) {
        Ok(1) => Some(b[0] == surge_proto::tls::HANDSHAKE_BYTE),
        _ => None,
    }
}

/// The server side of a TLS handshake on `sock`, within `wait`; the connection and its
/// channel binding.
fn handshake(
    sock: &std::net::TcpStream,
    tls: &surge_proto::tls::ServerTls,
    wait: Option<Duration>,
) -> std::io::Result<(surge_proto::record::Keys, Vec<u8>)> {
    let (mut conn, secrets) = tls.connection()?;
    sock.set_read_timeout(wait)?;
    surge_proto::record::handshake(&mut conn, &mut &*sock)?;
    sock.set_read_timeout(None)?;
    let binding = surge_proto::tls::binding(&conn)?;
    Ok((surge_proto::record::take_keys(conn, &secrets)?, binding))
}

/// Serves socket `s` of `name` until it ends: in TLS when the peer starts a handshake (and
/// this server has a certificate), in clear when it may (see `ServerTls::required_from`).
fn serve_socket<S: Socket>(
    reg: Arc<Registry>,
    s: &S,
    tls: Option<&surge_proto::tls::ServerTls>,
    limits: &crate::admission::ConnLimits,
    name: String,
    ticket: &Ticket,
) -> Ended
where
    for<'a> &'a S: Read + Write,
{
    let (idle, frame) = (limits.idle_timeout, limits.frame_timeout);
    let clear = |reg| {
        let polled = Polled::bounded(s, idle, frame);
        serve(reg, Clear { polled, sock: s }, name.clone(), Some(ticket))
    };
    let tcp = s.tcp();
    let Some(sock) = tcp.filter(|_| tls.is_some()) else {
        return clear(reg);
    };
    let Some(tls) = tls else {
        return Ended::Closed;
    };
    match speaks_tls(sock, limits.idle_timeout) {
        None => Ended::Closed,
        Some(true) => match handshake(sock, tls, limits.frame_timeout) {
            Ok((keys, binding)) => {
                let wire = Wire {
                    polled: Polled::bounded(sock, idle, frame),
                    sock,
                };
                let stream = surge_proto::record::Stream::new(wire, keys);
                serve(reg, Tls { stream, binding }, name.clone(), Some(ticket))
            }
            Err(e) => {
                warn!("{name}: TLS handshake failed: {e}");
                Ended::Closed
            }
        },
        Some(false) if tls.required_from(sock.peer_addr().ok().map(|a| a.ip())) => {
            warn!("{name}: refused a clear connection: this server speaks TLS to other hosts");
            let _ = codec::write_error(
                &mut &*sock,
                0,
                CONNECTION_ID,
                ErrorCode::Denied,
                "this server accepts only TLS connections: give the client the site's CA \
                 (SURGE_TLS_CA, default /etc/surge/tls/ca.crt; docs/SECURITY.md)"
                    .into(),
            );
            drain(sock.as_raw_fd());
            Ended::Closed
        }
        Some(false) => clear(reg),
    }
}

/// Admits connection `s` of `peer` and serves it on a thread of its own, or refuses it.
fn admit<S: Socket>(
    reg: &Arc<Registry>,
    admission: &Arc<Admission>,
    tls: Option<Arc<surge_proto::tls::ServerTls>>,
    s: S,
    peer: Peer,
    name: String,
) where
    for<'a> &'a S: Read + Write,
{
    let fd = s.as_fd().as_raw_fd();
    let ticket = match admission.admit(peer, fd) {
        Ok(t) => t,
        Err(why) => return refuse(s, why),
    };
    let limits = admission.limits().clone();
    // A peer that does not take its replies cannot hold the thread past the frame timeout.
    let _ = s.set_write_timeout(limits.frame_timeout);
    let reg = reg.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("conn-{name}"))
        .spawn(move || {
            let ended = serve_socket(reg, &s, tls.as_deref(), &limits, name, &ticket);
            if ended == Ended::Idle {
                linger(s.as_fd().as_raw_fd());
            }
            // The ticket goes before the socket closes (see `Ticket`).
            drop(ticket);
            drop(s);
        });
    if let Err(e) = spawned {
        warn!("cannot start a connection thread: {e}");
    }
}

/// Tells a refused peer why (`ConnectionLimit`, request id `CONNECTION_ID`) and closes.
fn refuse<S: Socket>(s: S, why: String)
where
    for<'a> &'a S: Read + Write,
{
    let fd = s.as_fd().as_raw_fd();
    let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
    let _ = codec::write_error(
        &mut &s,
        0,
        CONNECTION_ID,
        ErrorCode::ConnectionLimit,
        format!("connection refused: {why}"),
    );
    // What the peer sent already is dropped, so closing does not reset the connection
    // before the peer reads why.
    drain(fd);
}

/// Shuts the sending side of `fd` and reads what comes until the peer closes or [`LINGER`]
/// has passed.
fn linger(fd: RawFd) {
    // SAFETY: `fd` is the caller's open socket.
    unsafe { libc::shutdown(fd, libc::SHUT_WR) };
    let until = std::time::Instant::now() + LINGER;
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || !matches!(surge_proto::transport::wait_readable(fd, left), Ok(true)) {
            return;
        }
        if drain(fd) == 0 {
            return;
        }
    }
}

/// Reads and drops what is queued on `fd` without waiting; returns the bytes read (0 also when
/// the peer closed).
fn drain(fd: RawFd) -> usize {
    let mut buf = [0u8; 4096];
    let mut total = 0;
    loop {
        // SAFETY: reading into our stack buffer from the caller's open socket, not waiting.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n <= 0 {
            return total;
        }
        total += n as usize;
    }
}

/// Accepts TCP connections forever, one thread each, within the bounds of `admission`, in
/// TLS with `tls` (see [`serve_socket`]).
pub fn accept_tcp(
    reg: Arc<Registry>,
    admission: Arc<Admission>,
    tls: Option<Arc<surge_proto::tls::ServerTls>>,
    listener: std::net::TcpListener,
) {
    for conn in listener.incoming() {
        match conn {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                let addr = s.peer_addr().ok();
                let peer = addr.map_or(Peer::Unknown, |a| Peer::Ip(a.ip()));
                let name = addr.map(|a| a.to_string()).unwrap_or_default();
                admit(&reg, &admission, tls.clone(), s, peer, name);
            }
            Err(e) => accept_failed(&e),
        }
    }
}

/// Accepts Unix-socket connections forever, one thread each, within the bounds of
/// `admission` (a peer is a uid).
pub fn accept_unix(
    reg: Arc<Registry>,
    admission: Arc<Admission>,
    listener: std::os::unix::net::UnixListener,
) {
    for conn in listener.incoming() {
        match conn {
            Ok(s) => {
                let peer = Peer::of_unix(s.as_fd().as_raw_fd());
                let name = match &peer {
                    Peer::Uid(u) => format!("unix-uid{u}"),
                    _ => "unix".into(),
                };
                admit(&reg, &admission, None, s, peer, name);
            }
            Err(e) => accept_failed(&e),
        }
    }
}

/// An accept that failed: out of descriptors (the bounds keep a reserve, so only when
/// something else took them) or a connection gone before it was accepted.
fn accept_failed(e: &std::io::Error) {
    warn!("accept failed: {e}");
    std::thread::sleep(Duration::from_millis(50));
}

#[cfg(test)]
mod tests {
    use super::send_file;
    use std::io::{Read, Write};

    #[test]
    fn a_reply_sent_from_a_file_keeps_its_announced_length() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("object");
        std::fs::File::create(&path)
            .unwrap()
            .write_all(b"0123456789")
            .unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        // From offset 4 within the file, then past its end (a truncation while the header
        // announcing 20 bytes was sent): the rest comes as zeros.
        use std::os::fd::AsRawFd;
        send_file(a.as_raw_fd(), &mut &a, &f, 4, 20).unwrap();
        drop(a);
        let mut got = Vec::new();
        b.read_to_end(&mut got).unwrap();
        let mut want = b"456789".to_vec();
        want.resize(20, 0);
        assert_eq!(got, want);
    }
}
