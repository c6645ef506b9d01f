//! Blocking requests from the thread that asks, over a connection of that thread's own.
//!
//! Metadata requests (lookup, getattr, create, unlink, ...) are single round trips whose cost
//! is latency, and metadata rates are bound by it (Daley §5.1). Handing such a request from a
//! FUSE thread to the async runtime adds a thread wake-up each way; on the 2-vCPU machines we
//! measure on that is as much as the round trip itself. So the FUSE threads send metadata
//! requests themselves, each on its own connection per server, and wait on the socket; data
//! requests (striped over many servers, many in flight) still go to the runtime.

use crate::error::ClientError;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use surge_proto::codec;
use surge_proto::transport::Addr;
use surge_proto::{Request, Response, ServerRef};

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl std::os::fd::AsRawFd for Stream {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        // A reply is expected soon: see `poll_budget`.
        surge_proto::transport::poll_readable(
            self.as_raw_fd(),
            surge_proto::transport::poll_budget("client"),
        );
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Unix(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct Conn {
    stream: Stream,
    next_id: u64,
    /// When its last reply came.
    used: std::time::Instant,
}

/// A connection idle this long is checked before use: a server that restarted meanwhile
/// closed it, and a request written to it would fail (unsafe to retry unless idempotent).
const CHECK_IDLE: std::time::Duration = std::time::Duration::from_millis(1);

impl Conn {
    /// False when the server closed the connection (or it failed) while it was idle.
    fn open(&self) -> bool {
        use std::os::fd::AsRawFd;
        matches!(
            surge_proto::transport::peek(self.stream.as_raw_fd()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
        )
    }
}

thread_local! {
    static CONNS: RefCell<HashMap<String, Conn>> = RefCell::new(HashMap::new());
    static INLINE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with single requests sent from this thread (see the module doc).
pub fn inline<T>(f: impl FnOnce() -> T) -> T {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            INLINE.with(|c| c.set(self.0));
        }
    }
    let _reset = Reset(INLINE.with(|c| c.replace(true)));
    f()
}

/// True while this thread runs requests inline.
pub fn is_inline() -> bool {
    INLINE.with(|c| c.get())
}

/// A new connection to `server`, authenticated with `token` when there is one.
fn connect(server: &ServerRef, token: Option<&surge_auth::Token>) -> Result<Conn, ClientError> {
    let mut conn = connect_stream(server)?;
    if let Some(t) = token {
        let req = Request::Authenticate {
            token: t.bytes().to_vec(),
        };
        let id = conn.next_id;
        conn.next_id += 1;
        match codec::call_blocking(&mut conn.stream, id, 0, &req, &[]) {
            Ok(f) => match f.response {
                Response::Ok => {}
                Response::Error(e) => {
                    return Err(ClientError::Remote {
                        server: server.id.clone(),
                        error: e,
                    })
                }
                other => {
                    return Err(ClientError::transport(
                        &server.id,
                        format!("Authenticate answered {other:?}"),
                    ))
                }
            },
            Err(e) => return Err(ClientError::transport(&server.id, format!("Authenticate: {e}"))),
        }
    }
    Ok(conn)
}

fn connect_stream(server: &ServerRef) -> Result<Conn, ClientError> {
    let mut last = String::from("no usable address");
    for a in &server.addrs {
        let addr: Addr = match a.parse() {
            Ok(x) => x,
            Err(e) => {
                last = e;
                continue;
            }
        };
        let stream = match &addr {
            Addr::Unix(p) => UnixStream::connect(p).map(Stream::Unix),
            Addr::Tcp(hp) => TcpStream::connect(hp.as_str()).and_then(|s| {
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            }),
        };
        match stream {
            Ok(stream) => {
                return Ok(Conn {
                    stream,
                    next_id: 1,
                    used: std::time::Instant::now(),
                })
            }
            Err(e) => last = format!("cannot connect to {addr}: {e}"),
        }
    }
    Err(ClientError::transport(&server.id, last))
}

/// Requests that can be sent again on a new connection if the old one broke.
fn idempotent(req: &Request) -> bool {
    matches!(
        req,
        Request::Lookup { .. }
            | Request::GetAttr { .. }
            | Request::Readlink { .. }
            | Request::ReadDir { .. }
            | Request::GetXattr { .. }
            | Request::ListXattr { .. }
            | Request::RemoveObject { .. }
            | Request::Status
    )
}

/// Sends `req` to `server` for client session `session` and waits for the reply, on this
/// thread's connection to it (opened with capability `token`).
pub fn call(
    server: &ServerRef,
    session: u32,
    token: Option<&surge_auth::Token>,
    req: &Request,
) -> Result<Response, ClientError> {
    // One connection per server and capability (two mounts of one process never share one).
    let key = match token {
        Some(t) => {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            t.bytes().hash(&mut h);
            format!("{}#{:x}", server.id, h.finish())
        }
        None => server.id.clone(),
    };
    for attempt in 0..2 {
        let result = CONNS.with(|c| {
            let mut conns = c.borrow_mut();
            if conns
                .get(&key)
                .is_some_and(|c| c.used.elapsed() > CHECK_IDLE && !c.open())
            {
                tracing::debug!(
                    "{}: idle connection closed by the server; reconnecting",
                    server.id
                );
                conns.remove(&key);
            }
            if !conns.contains_key(&key) {
                conns.insert(key.clone(), connect(server, token)?);
            }
            let Some(conn) = conns.get_mut(&key) else {
                return Err(ClientError::transport(&server.id, "no connection".into()));
            };
            let id = conn.next_id;
            conn.next_id += 1;
            match codec::call_blocking(&mut conn.stream, id, session, req, &[]) {
                Ok(f) => {
                    conn.used = std::time::Instant::now();
                    Ok(f.response)
                }
                Err(e) => {
                    conns.remove(&key);
                    Err(ClientError::transport(
                        &server.id,
                        format!("{}: {e}", req.name()),
                    ))
                }
            }
        });
        match result {
            Ok(Response::Error(e)) => {
                return Err(ClientError::Remote {
                    server: server.id.clone(),
                    error: e,
                })
            }
            Ok(r) => return Ok(r),
            Err(e) if attempt == 0 && idempotent(req) => {
                tracing::debug!("retrying after a broken connection: {e}");
            }
            Err(e) => return Err(e),
        }
    }
    Err(ClientError::transport(&server.id, "unreachable".into()))
}
