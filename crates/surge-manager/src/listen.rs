//! The connections the manager accepts, bounded so that no caller can starve the others
//! (issue 31): ~21k half-open HTTP connections from one user once took every descriptor, and
//! HTTP, gRPC and MUNGE were then refused to everyone and servers were marked down.
//!
//! - A [`Gate`] per listener counts live connections in all and per peer address; past either
//!   limit a new connection is closed at once (the process keeps descriptors for its servers,
//!   etcd and munged: the global limit is set below the descriptor limit).
//! - HTTP connections must send their request headers within a deadline and are closed when
//!   idle; gRPC connections are kept alive by HTTP/2 pings (a peer that stops answering is
//!   dropped), since agents' long polls are legitimately silent for 30 s.
//! - **TLS** (rustls, TLS 1.3; docs/SECURITY.md "On the wire"): with a certificate, a
//!   connection whose first byte opens a TLS handshake is decrypted, and one in clear is
//!   served only from where [`ServerTls::required_from`] allows it (loopback, in `auto`).
//!   Handshakes run beside the accept loop, so a slow one holds up nobody else.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use surge_proto::tls::{ServerTls, HANDSHAKE_BYTE};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tracing::warn;

/// How long a new connection has to say its first byte and finish a TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an HTTP client has to send a request's headers (a connection that sends none is
/// closed after this).
pub const HTTP_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Limits on one listener's live connections.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub global: usize,
    pub per_addr: usize,
}

/// Counts a listener's live connections.
pub struct Gate {
    name: &'static str,
    limits: Limits,
    total: AtomicUsize,
    per: Mutex<HashMap<IpAddr, usize>>,
    refused: AtomicU64,
}

/// One admitted connection; dropping it frees its place.
pub struct Permit {
    gate: Arc<Gate>,
    ip: IpAddr,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.gate.total.fetch_sub(1, Ordering::SeqCst);
        let mut per = self.gate.per.lock();
        if let Some(n) = per.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                per.remove(&self.ip);
            }
        }
    }
}

impl Gate {
    pub fn new(name: &'static str, limits: Limits) -> Arc<Gate> {
        Arc::new(Gate {
            name,
            limits,
            total: AtomicUsize::new(0),
            per: Mutex::new(HashMap::new()),
            refused: AtomicU64::new(0),
        })
    }

    /// A place for a connection from `ip`, if the limits allow one.
    pub fn admit(self: &Arc<Gate>, ip: IpAddr) -> Option<Permit> {
        let mut per = self.per.lock();
        let mine = per.get(&ip).copied().unwrap_or(0);
        let total = self.total.load(Ordering::SeqCst);
        if total >= self.limits.global || mine >= self.limits.per_addr {
            let n = self.refused.fetch_add(1, Ordering::Relaxed);
            // Said once, then every 1000th: a flood must not flood the log too.
            if n.is_multiple_of(1000) {
                warn!(
                    "{}: refusing connections from {ip} ({mine} open from it, {total} in all; \
                     limits {} per address, {} in all; {} refused so far)",
                    self.name,
                    self.limits.per_addr,
                    self.limits.global,
                    n + 1
                );
            }
            return None;
        }
        per.insert(ip, mine + 1);
        self.total.fetch_add(1, Ordering::SeqCst);
        Some(Permit {
            gate: self.clone(),
            ip,
        })
    }

    /// Connections refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// An admitted connection's stream: in clear, or decrypted.
enum Conn {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// A connection with its place at the gate.
pub struct Gated {
    inner: Conn,
    _permit: Permit,
}

impl Gated {
    fn tcp(&self) -> &TcpStream {
        match &self.inner {
            Conn::Plain(s) => s,
            Conn::Tls(t) => t.get_ref().0,
        }
    }

    /// True when the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(self.inner, Conn::Tls(_))
    }
}

/// The first byte the peer of `s` sends, within `d` (nothing is consumed).
async fn first_byte(s: &TcpStream, d: Duration) -> Option<u8> {
    let mut b = [0u8; 1];
    match tokio::time::timeout(d, s.peek(&mut b)).await {
        Ok(Ok(1)) => Some(b[0]),
        _ => None,
    }
}

/// Makes an admitted connection ready to serve: TLS when its first byte opens a handshake
/// and `tls` is set; clear text when the peer may use it. `None`: closed (it said nothing in
/// time, its handshake failed, or it spoke clear text where TLS is required).
async fn ready(
    s: TcpStream,
    permit: Permit,
    tls: Option<&(Arc<ServerTls>, tokio_rustls::TlsAcceptor)>,
    name: &'static str,
) -> Option<Gated> {
    let first = first_byte(&s, HANDSHAKE_TIMEOUT).await?;
    let peer = s.peer_addr().ok();
    let inner = match tls {
        Some((_, acceptor)) if first == HANDSHAKE_BYTE => {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(s)).await {
                Ok(Ok(t)) => Conn::Tls(Box::new(t)),
                Ok(Err(e)) => {
                    tracing::debug!("{name}: TLS handshake with {peer:?}: {e}");
                    return None;
                }
                Err(_) => return None,
            }
        }
        Some((t, _)) if t.required_from(peer.map(|p| p.ip())) => {
            refuse_clear(name, peer);
            return None;
        }
        _ => Conn::Plain(s),
    };
    Some(Gated {
        inner,
        _permit: permit,
    })
}

/// Says (once a minute at most) that a peer spoke clear text where TLS is required.
fn refuse_clear(name: &'static str, peer: Option<std::net::SocketAddr>) {
    static LAST: Mutex<Option<std::time::Instant>> = Mutex::new(None);
    let mut last = LAST.lock();
    if last.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
        *last = Some(std::time::Instant::now());
        warn!(
            "{name}: refused a connection in clear text from {peer:?}: TLS is required from \
             it (the client needs the site CA: SURGE_TLS_CA, or ca.crt in $SURGE_TLS_DIR or \
             /etc/surge/tls)"
        );
    }
}

/// The TLS of a manager listener: `tls`'s certificate, offering HTTP/2 and HTTP/1.1 by ALPN
/// (what browsers ask for; gRPC clients that offer nothing get HTTP/2 all the same).
pub fn acceptor(tls: Arc<ServerTls>) -> (Arc<ServerTls>, tokio_rustls::TlsAcceptor) {
    let mut config = (*tls.config).clone();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    (tls, tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

macro_rules! both {
    ($self:ident, $s:ident => $e:expr) => {
        match &mut $self.inner {
            Conn::Plain($s) => {
                let $s = Pin::new($s);
                $e
            }
            Conn::Tls($s) => {
                let $s = Pin::new(&mut **$s);
                $e
            }
        }
    };
}

impl AsyncRead for Gated {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        both!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for Gated {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        both!(self, s => s.poll_write(cx, buf))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        both!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        both!(self, s => s.poll_shutdown(cx))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        both!(self, s => s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match &self.inner {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(t) => t.is_write_vectored(),
        }
    }
}

impl tonic::transport::server::Connected for Gated {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.tcp().connect_info()
    }
}

/// Accepts the next connection the gate admits (TCP_NODELAY set: small replies leave at once).
async fn accept(listener: &TcpListener, gate: &Arc<Gate>) -> (TcpStream, Permit) {
    loop {
        let (s, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of descriptors or a connection reset before accept: wait a little, not
                // a busy loop.
                warn!("{}: accept: {e}", gate.name);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(permit) = gate.admit(peer.ip()) else {
            drop(s);
            continue;
        };
        if let Err(e) = s.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY: {e}");
        }
        return (s, permit);
    }
}

/// The admitted connections of `listener`, made ready ([`ready`]: TLS or clear) each in its
/// own task, as tonic's `serve_with_incoming` takes them.
pub fn incoming(
    listener: TcpListener,
    gate: Arc<Gate>,
    tls: Option<Arc<ServerTls>>,
) -> impl futures::Stream<Item = std::io::Result<Gated>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<Gated>(256);
    let tls = tls.map(|t| Arc::new(acceptor(t)));
    tokio::spawn(async move {
        loop {
            let (s, permit) = accept(&listener, &gate).await;
            let (tx, tls) = (tx.clone(), tls.clone());
            tokio::spawn(async move {
                if let Some(c) = ready(s, permit, tls.as_deref(), "gRPC API").await {
                    let _ = tx.send(c).await;
                }
            });
        }
    });
    futures::stream::unfold(rx, |mut rx| async move {
        let c = rx.recv().await?;
        Some((Ok(c), rx))
    })
}

/// Serves `router` over HTTP/1 and HTTP/2 (HTTPS with `tls`) on `listener`: each connection
/// admitted by `gate`, its request headers read within [`HTTP_HEADER_TIMEOUT`].
pub async fn serve_http(
    listener: TcpListener,
    router: axum::Router,
    gate: Arc<Gate>,
    tls: Option<Arc<ServerTls>>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::service::TowerToHyperService;
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HTTP_HEADER_TIMEOUT)
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(20)))
        .keep_alive_timeout(Duration::from_secs(10));
    let builder = Arc::new(builder);
    let tls = tls.map(|t| Arc::new(acceptor(t)));
    loop {
        let (s, permit) = accept(&listener, &gate).await;
        let svc = TowerToHyperService::new(router.clone());
        let (b, tls) = (builder.clone(), tls.clone());
        tokio::spawn(async move {
            // A connection with nothing to say within the deadline is closed (hyper's header
            // timeout covers the requests of a connection that spoke; this, one that never
            // does, which the protocol detection would otherwise wait on for ever).
            let Some(conn) = ready(s, permit, tls.as_deref(), "HTTP API").await else {
                return;
            };
            let _ = b.serve_connection(TokioIo::new(conn), svc).await;
        });
    }
}

/// Connections a process may hold, from its descriptor limit, less a reserve for everything
/// else it opens (servers, etcd, munged, the state database, logs).
pub fn descriptor_budget(reserve: usize) -> usize {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into `r`.
    let cur = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
        r.rlim_cur as usize
    } else {
        1024
    };
    cur.saturating_sub(reserve).max(64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_past_its_share_is_refused_and_others_are_not() {
        let g = Gate::new(
            "test",
            Limits {
                global: 5,
                per_addr: 2,
            },
        );
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = g.admit(a).unwrap();
        let _a2 = g.admit(a).unwrap();
        assert!(g.admit(a).is_none(), "a third from one address");
        let _b1 = g.admit(b).unwrap();
        drop(a1);
        let _a3 = g.admit(a).expect("a place freed by a closed connection");
        let _b2 = g.admit(b).unwrap();
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        let _c1 = g.admit(c).unwrap();
        let d: IpAddr = "10.0.0.4".parse().unwrap();
        assert!(g.admit(d).is_none(), "past the global limit");
        assert_eq!(g.refused(), 2);
    }
}
