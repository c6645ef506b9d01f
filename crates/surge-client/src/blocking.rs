//! Blocking requests from the thread that asks, over a connection of that thread's own.
//!
//! Metadata requests (lookup, getattr, create, unlink, ...) are single round trips whose cost
//! is latency, and metadata rates are bound by it (Daley §5.1). Handing such a request from a
//! FUSE thread to the async runtime adds a thread wake-up each way; on the 2-vCPU machines we
//! measure on that is as much as the round trip itself. So the FUSE threads send metadata
//! requests themselves, each on its own connection per server, and wait on the socket; data
//! requests (striped over many servers, many in flight) still go to the runtime.
//!
//! Waits are bounded like the pool's (see [`crate::conn`]): connecting, and each read and write
//! of a request's socket, by the pool's deadline (socket timeouts, set once per connection).

use crate::conn::ServerPool;
use crate::error::ClientError;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::Duration;
use surge_proto::codec::{self, CodecError};
use surge_proto::frame::CONNECTION_ID;
use surge_proto::transport::Addr;
use surge_proto::{Request, Response, ServerRef};

type TlsStream = surge_proto::record::Stream<TcpStream>;

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(Box<TlsStream>),
}

impl std::os::fd::AsRawFd for Stream {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tls(s) => s.sock.as_raw_fd(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::fd::AsRawFd;
        // A reply is expected soon: see `poll_budget` (unless TLS holds decrypted bytes).
        if !matches!(self, Stream::Tls(s) if s.buffered()) {
            surge_proto::transport::poll_readable(
                self.as_raw_fd(),
                surge_proto::transport::poll_budget("client"),
            );
        }
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Unix(s) => s.write_vectored(bufs),
            Stream::Tls(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Tls(s) => s.flush(),
            _ => Ok(()),
        }
    }
}

/// Wraps `s` (connected to `host`) in TLS when the process's client TLS applies to `host`
/// (see `surge_proto::tls`), and returns its channel binding (empty when clear).
fn secure(s: TcpStream, host: &str) -> std::io::Result<(Stream, Vec<u8>)> {
    let tls = surge_proto::tls::client().map_err(std::io::Error::other)?;
    let Some(tls) = tls.filter(|t| t.applies(host)) else {
        return Ok((Stream::Tcp(s), Vec::new()));
    };
    let name = surge_proto::tls::ClientTls::server_name(host)?;
    let (mut conn, secrets) = tls.connection(name)?;
    let mut s = s;
    surge_proto::record::handshake(&mut conn, &mut s).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!(
                "TLS with {host} (verified against the CA {}): {e}",
                tls.ca.display()
            ),
        )
    })?;
    let binding = surge_proto::tls::binding(&conn)?;
    let keys = surge_proto::record::take_keys(conn, &secrets)?;
    Ok((
        Stream::Tls(Box::new(surge_proto::record::Stream::new(s, keys))),
        binding,
    ))
}

struct Conn {
    stream: Stream,
    /// The channel binding capabilities are presented for (empty when clear).
    binding: Vec<u8>,
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

/// A new connection to `server` (see [`connect_stream`]), authenticated with `token` when
/// there is one.
fn connect(
    server: &ServerRef,
    token: Option<&surge_auth::Token>,
    deadline: Option<Duration>,
) -> Result<Conn, ClientError> {
    let mut conn = connect_stream(server, deadline)?;
    if let Some(t) = token {
        let id = conn.next_id;
        conn.next_id += 1;
        let req = crate::conn::authenticate(t, &conn.binding);
        let f = codec::call_blocking(&mut conn.stream, id, 0, &req, &[])
            .map_err(|e| ClientError::transport(&server.id, format!("Authenticate: {e}")))?;
        crate::conn::authenticated(&server.id, f.response)?;
    }
    Ok(conn)
}

/// A connection to `server`'s first address that answers, within `deadline`, whose reads and
/// writes each wait at most `deadline`.
fn connect_stream(server: &ServerRef, deadline: Option<Duration>) -> Result<Conn, ClientError> {
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
            Addr::Unix(p) => connect_unix(p, deadline).map(|s| (Stream::Unix(s), Vec::new())),
            Addr::Tcp(hp) => connect_tcp(hp, deadline).and_then(|s| {
                s.set_nodelay(true)?;
                s.set_read_timeout(deadline)?;
                s.set_write_timeout(deadline)?;
                secure(s, surge_proto::tls::host_of(hp))
            }),
        };
        match stream {
            Ok((stream, binding)) => {
                return Ok(Conn {
                    stream,
                    binding,
                    next_id: 1,
                    used: std::time::Instant::now(),
                })
            }
            Err(e) => last = format!("cannot connect to {addr}: {e}"),
        }
    }
    Err(ClientError::transport(&server.id, last))
}

fn connect_tcp(hp: &str, deadline: Option<Duration>) -> std::io::Result<TcpStream> {
    let Some(d) = deadline else {
        return TcpStream::connect(hp);
    };
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    for sa in std::net::ToSocketAddrs::to_socket_addrs(hp)? {
        match TcpStream::connect_timeout(&sa, d) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Connects to a Unix socket within `deadline`. A server that does not accept (stopped) fills
/// its listen queue, and a blocking connect then waits for room; the kernel bounds that wait
/// by the socket's send timeout, so it is set before connecting.
fn connect_unix(path: &std::path::Path, deadline: Option<Duration>) -> std::io::Result<UnixStream> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let Some(d) = deadline else {
        return UnixStream::connect(path);
    };
    // SAFETY: sockaddr_un is plain old data; all zeros is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("socket path {} is too long", path.display()),
        ));
    }
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: a new socket; on success its descriptor is owned by the UnixStream at once.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is the socket just made, owned by nothing else.
    let s = unsafe { UnixStream::from_raw_fd(fd) };
    s.set_read_timeout(Some(d))?;
    s.set_write_timeout(Some(d))?;
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    // SAFETY: `addr` is a valid sockaddr_un of at least `len` bytes.
    let r = unsafe {
        libc::connect(
            fd,
            (&addr as *const libc::sockaddr_un).cast(),
            len as libc::socklen_t,
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::WouldBlock {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the server accepted no connection within {d:?}"),
            ));
        }
        return Err(e);
    }
    Ok(s)
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

/// How a request on this thread's connection went wrong.
enum Failed {
    /// The server closed the connection without reading the request: send it again.
    Unsent(ClientError),
    /// Safe to send again only if the request is idempotent (the connection broke).
    Broken(ClientError),
    /// Final (a deadline passed, the server refused the connection).
    Final(ClientError),
}

/// Sends `req` to `pool`'s server for the pool's client session and waits for the reply, on
/// this thread's connection to it (opened with the pool's capability), each wait bounded by
/// the pool's deadline (`None`: no bound).
pub fn call(pool: &ServerPool, req: &Request) -> Result<Response, ClientError> {
    call_with(pool, req, &[])
}

/// [`call`] with `payload` after the request (a small write's bytes).
pub fn call_with(
    pool: &ServerPool,
    req: &Request,
    payload: &[u8],
) -> Result<Response, ClientError> {
    let (server, session, token, deadline) =
        (&pool.server, pool.session(), pool.token(), pool.deadline());
    let key = pool.inline_key();
    let mut broken = 0;
    let mut unsent = 0;
    loop {
        let result = CONNS.with(|c| {
            let mut conns = c.borrow_mut();
            if conns
                .get(key)
                .is_some_and(|c| c.used.elapsed() > CHECK_IDLE && !c.open())
            {
                tracing::debug!(
                    "{}: idle connection closed by the server; reconnecting",
                    server.id
                );
                conns.remove(key);
            }
            if !conns.contains_key(key) {
                // Where the server is now; asked again of the manager when it moved.
                let c = match connect(&pool.server_now(), token, deadline) {
                    Err(ClientError::Transport { .. }) if pool.resolve_again_blocking() => {
                        connect(&pool.server_now(), token, deadline)
                    }
                    c => c,
                };
                conns.insert(key.to_string(), c.map_err(Failed::Final)?);
            }
            let Some(conn) = conns.get_mut(key) else {
                return Err(Failed::Final(ClientError::transport(
                    &server.id,
                    "no connection".into(),
                )));
            };
            let id = conn.next_id;
            conn.next_id += 1;
            match codec::call_blocking(&mut conn.stream, id, session, req, payload) {
                Ok(f) if f.header.request_id == CONNECTION_ID => {
                    conns.remove(key);
                    match crate::conn::connection_notice(&server.id, f.response) {
                        e @ ClientError::Unsent { .. } => Err(Failed::Unsent(e)),
                        e => Err(Failed::Final(e)),
                    }
                }
                Ok(f) => {
                    conn.used = std::time::Instant::now();
                    Ok(f.response)
                }
                Err(e) => {
                    conns.remove(key);
                    let timed_out = match &e {
                        CodecError::Io(io) | CodecError::Stalled(_, io) => matches!(
                            io.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ),
                        _ => false,
                    };
                    match deadline {
                        Some(after) if timed_out => {
                            let e = ClientError::Timeout {
                                server: server.id.clone(),
                                request: req.name(),
                                after,
                            };
                            tracing::warn!("{e}; the request fails (EIO)");
                            Err(Failed::Final(e))
                        }
                        _ => Err(Failed::Broken(ClientError::transport(
                            &server.id,
                            format!("{}: {e}", req.name()),
                        ))),
                    }
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
            Err(Failed::Unsent(e)) if unsent < 3 => {
                tracing::debug!("{e}; sending {} again", req.name());
                unsent += 1;
            }
            Err(Failed::Broken(e)) if broken == 0 && idempotent(req) => {
                tracing::debug!("retrying after a broken connection: {e}");
                broken += 1;
            }
            Err(Failed::Unsent(e) | Failed::Broken(e) | Failed::Final(e)) => return Err(e),
        }
    }
}
