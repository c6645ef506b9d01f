//! Transports: how a client reaches a server. TCP across hosts, Unix sockets when local; the
//! [`Transport`] trait is the seam where RDMA/UCX can be added without touching the protocol.

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use tokio::io::{AsyncRead, AsyncWrite};

/// A server address: `host:port` (or `tcp://host:port`) or `unix:/path/to/socket`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Addr {
    Tcp(String),
    Unix(PathBuf),
}

impl std::str::FromStr for Addr {
    type Err = String;
    fn from_str(s: &str) -> Result<Addr, String> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err(format!("'{s}': empty Unix socket path"));
            }
            return Ok(Addr::Unix(PathBuf::from(p)));
        }
        let hp = s.strip_prefix("tcp://").unwrap_or(s);
        match hp.rsplit_once(':') {
            Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => {
                Ok(Addr::Tcp(hp.to_string()))
            }
            _ => Err(format!(
                "'{s}' is not a server address (expected host:port or unix:/path)"
            )),
        }
    }
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Tcp(hp) => write!(f, "{hp}"),
            Addr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

pub type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
pub type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;
pub type ConnectFuture<'a> = Pin<Box<dyn Future<Output = io::Result<Connected>> + Send + 'a>>;

/// An open byte stream to a server.
pub struct Connected {
    pub read: BoxRead,
    pub write: BoxWrite,
    /// The channel binding a capability is presented for (`surge_auth::Token::present`): the
    /// TLS exporter (RFC 9266) on a TLS connection, empty on a clear one.
    pub binding: Vec<u8>,
}

/// Opens byte streams to servers.
pub trait Transport: Send + Sync + 'static {
    fn connect<'a>(&'a self, addr: &'a Addr) -> ConnectFuture<'a>;
}

/// TCP (with TLS where [`crate::tls::client`] says so) and Unix-domain sockets.
#[derive(Clone, Copy, Debug, Default)]
pub struct SocketTransport;

impl Transport for SocketTransport {
    fn connect<'a>(&'a self, addr: &'a Addr) -> ConnectFuture<'a> {
        Box::pin(async move {
            match addr {
                Addr::Tcp(hp) => {
                    let tls = crate::tls::client().map_err(io::Error::other)?;
                    connect_tcp(hp, tls.as_deref()).await
                }
                Addr::Unix(p) => {
                    let s = tokio::net::UnixStream::connect(p).await?;
                    let (r, w) = s.into_split();
                    Ok(Connected {
                        read: Box::new(r),
                        write: Box::new(w),
                        binding: Vec::new(),
                    })
                }
            }
        })
    }
}

/// Connects to `hp`, over TLS when `tls` applies to its host.
pub async fn connect_tcp(hp: &str, tls: Option<&crate::tls::ClientTls>) -> io::Result<Connected> {
    let s = tokio::net::TcpStream::connect(hp).await?;
    // Requests are small and latency-bound; never wait to coalesce them.
    s.set_nodelay(true)?;
    keepalive(&s)?;
    let host = crate::tls::host_of(hp);
    match tls.filter(|t| t.applies(host)) {
        None => {
            let (r, w) = s.into_split();
            Ok(Connected {
                read: Box::new(r),
                write: Box::new(w),
                binding: Vec::new(),
            })
        }
        Some(t) => {
            let name = crate::tls::ClientTls::server_name(host)?;
            let mut s = s;
            let (mut conn, secrets) = t.connection(name)?;
            crate::record::handshake_async(&mut conn, &mut s)
                .await
                .map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "TLS with {hp} (verified against the CA {}): {e}",
                            t.ca.display()
                        ),
                    )
                })?;
            let binding = crate::tls::binding(&conn)?;
            // Records from here on are sealed and opened in place (see `crate::record`).
            let (opener, sealer) = crate::record::take_keys(conn, &secrets)?;
            let (r, w) = s.into_split();
            Ok(Connected {
                read: Box::new(crate::record::ReadHalf::new(r, opener)),
                write: Box::new(crate::record::WriteHalf::new(w, sealer)),
                binding,
            })
        }
    }
}

/// Turns on TCP keepalive: a connection to a host that vanished (no close, no reset) fails
/// after about a minute of silence, instead of waiting for ever for a reply that has no
/// deadline (see `surge-client` `namespace_batch`). A stopped server's kernel still answers.
pub fn keepalive(s: &impl std::os::fd::AsRawFd) -> io::Result<()> {
    let fd = s.as_raw_fd();
    for (level, opt, val) in [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 30),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 10),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3),
    ] {
        let v: libc::c_int = val;
        // SAFETY: setting an int option on the caller's open socket from our stack.
        let r = unsafe {
            libc::setsockopt(
                fd,
                level,
                opt,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// How long a thread polls a socket before sleeping in `read` when it expects data soon (a
/// reply to a request it just sent; the next request of a client that just got its reply). A
/// sleeping vCPU of a virtual machine takes tens of microseconds to wake, as long as a metadata
/// round trip itself, so a short poll halves the latency at the cost of a little CPU.
pub const POLL_BEFORE_SLEEP: std::time::Duration = std::time::Duration::from_micros(50);

/// The poll budget for `side` ("client" or "server"): [`POLL_BEFORE_SLEEP`] unless
/// `SURGE_POLL_US_<SIDE>` (microseconds; 0 turns polling off) says otherwise. Read once.
pub fn poll_budget(side: &'static str) -> std::time::Duration {
    static CLIENT: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    static SERVER: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    let cell = if side == "server" { &SERVER } else { &CLIENT };
    *cell.get_or_init(|| {
        std::env::var(format!("SURGE_POLL_US_{}", side.to_uppercase()))
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(POLL_BEFORE_SLEEP, std::time::Duration::from_micros)
    })
}

/// Peeks at socket `fd` without blocking: `Ok(0)` when the peer closed it, `Ok(1)` when data
/// waits, an error (`WouldBlock` when nothing does yet) otherwise.
pub fn peek(fd: std::os::fd::RawFd) -> io::Result<usize> {
    let mut b = 0u8;
    // SAFETY: peeking one byte into a local on a socket the caller owns, without blocking.
    let n = unsafe {
        libc::recv(
            fd,
            (&mut b as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Polls (without blocking) until `fd` has data to read or `max` has passed; true when data
/// (or the peer's close) is there.
pub fn poll_readable(fd: std::os::fd::RawFd, max: std::time::Duration) -> bool {
    let start = std::time::Instant::now();
    loop {
        if peek(fd).is_ok() {
            return true;
        }
        if start.elapsed() >= max {
            return false;
        }
        // Give the CPU to any other runnable thread (on a machine with few cores that is
        // often the very thread that will answer); with none, this is a cheap spin.
        // SAFETY: no arguments, no memory touched.
        unsafe { libc::sched_yield() };
    }
}

/// Sleeps until `fd` is readable (data, the peer's close, an error) or `timeout` has passed;
/// false when it passed.
pub fn wait_readable(fd: std::os::fd::RawFd, timeout: std::time::Duration) -> io::Result<bool> {
    let until = std::time::Instant::now() + timeout;
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        // Rounded up, so a wait never ends before its time; at most ~24 days per call.
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd on the stack, for the call's duration.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n > 0 {
            return Ok(true);
        }
        if n == 0 {
            if std::time::Instant::now() >= until {
                return Ok(false);
            }
            continue;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// A blocking socket of the server's, whose reads poll briefly before sleeping (see
/// [`POLL_BEFORE_SLEEP`]) and whose sleeps are bounded: by an idle timeout while the frame
/// reader waits for a frame to begin, by a frame timeout once one began (see
/// [`crate::codec::Waits`]). A wait that runs out fails with `TimedOut`.
pub struct Polled<S> {
    pub inner: S,
    idle: Option<std::time::Duration>,
    frame: Option<std::time::Duration>,
    /// When the current frame must be whole; `None` between frames.
    deadline: Option<std::time::Instant>,
    in_frame: bool,
    /// A poll within the current frame ran out: its bytes come slower than the poll's
    /// budget (a slow link), so its other reads sleep at once instead of spinning each time
    /// (at 2 Gbit/s that spinning was a third of a server's CPU for the writes it took).
    slow_frame: bool,
}

impl<S> Polled<S> {
    /// Waits without bounds.
    pub fn new(inner: S) -> Polled<S> {
        Polled::bounded(inner, None, None)
    }

    /// Waits up to `idle` for a frame to begin and up to `frame` for it to end.
    pub fn bounded(
        inner: S,
        idle: Option<std::time::Duration>,
        frame: Option<std::time::Duration>,
    ) -> Polled<S> {
        Polled {
            inner,
            idle,
            frame,
            deadline: None,
            in_frame: false,
            slow_frame: false,
        }
    }

    /// How long the next read may sleep.
    fn wait(&self) -> Option<std::time::Duration> {
        if self.in_frame {
            self.deadline
                .map(|d| d.saturating_duration_since(std::time::Instant::now()))
        } else {
            self.idle
        }
    }
}

impl<S> crate::codec::Waits for Polled<S> {
    fn waiting(&mut self, phase: crate::codec::Phase) {
        match phase {
            crate::codec::Phase::Idle => {
                self.in_frame = false;
                self.slow_frame = false;
                self.deadline = None;
            }
            crate::codec::Phase::Frame if !self.in_frame => {
                self.in_frame = true;
                self.slow_frame = false;
                self.deadline = self.frame.map(|f| std::time::Instant::now() + f);
            }
            crate::codec::Phase::Frame => {}
        }
    }
}

impl<S: std::io::Read + std::os::fd::AsFd> std::io::Read for Polled<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::fd::AsRawFd;
        let fd = self.inner.as_fd().as_raw_fd();
        let poll = !(self.in_frame && self.slow_frame);
        if !(poll && poll_readable(fd, poll_budget("server"))) {
            if poll && self.in_frame {
                self.slow_frame = true;
            }
            if let Some(wait) = self.wait() {
                if !wait_readable(fd, wait)? {
                    let what = if self.in_frame {
                        format!(
                            "frame not whole within {:?} of its first byte",
                            self.frame.unwrap_or_default()
                        )
                    } else {
                        format!("no request for {:?}", self.idle.unwrap_or_default())
                    };
                    return Err(io::Error::new(io::ErrorKind::TimedOut, what));
                }
            }
        }
        self.inner.read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses() {
        assert_eq!(
            "127.0.0.1:7001".parse(),
            Ok(Addr::Tcp("127.0.0.1:7001".into()))
        );
        assert_eq!("tcp://bb1:7001".parse(), Ok(Addr::Tcp("bb1:7001".into())));
        assert_eq!(
            "unix:/run/surge/s.sock".parse(),
            Ok(Addr::Unix(PathBuf::from("/run/surge/s.sock")))
        );
        assert!("bb1".parse::<Addr>().is_err());
        assert!("bb1:notaport".parse::<Addr>().is_err());
        assert!("unix:".parse::<Addr>().is_err());
    }
}
