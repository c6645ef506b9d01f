//! Connections to servers. A [`Connection`] multiplexes pipelined requests over one stream
//! (replies are matched by request id); a [`ServerPool`] keeps a few connections per server,
//! because a server works through one connection's requests in order, and reconnects when one
//! breaks (a restarted server) or the server closed it for idleness (then requests it had not
//! read are sent again on a new connection).
//!
//! Every wait is bounded by the pool's deadline ([`DEFAULT_DEADLINE`]; `None` waits forever,
//! `surge mount --hard`): connecting, sending and waiting for the reply. A request past it
//! fails with [`ClientError::Timeout`] (EIO for an application) and its connection is dropped,
//! since a server that does not answer one request answers none queued behind it.

use crate::error::ClientError;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use surge_proto::codec;
use surge_proto::frame::CONNECTION_ID;
use surge_proto::transport::{Addr, BoxWrite, Transport};
use surge_proto::{ErrorCode, Request, Response, ServerRef, SocketTransport};
use tokio::sync::oneshot;
use tracing::{debug, warn};

type Reply = Result<(Response, Vec<u8>), ClientError>;

/// How long a request waits for its reply unless told otherwise (`surge mount --deadline`).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(60);

/// A server's notice about the connection itself (request id [`CONNECTION_ID`]) as the error
/// of the requests it leaves unanswered.
/// The request presenting capability `t`, the first on every connection: its claims and a
/// proof made for the connection's channel binding `binding` (see
/// `surge_auth::Token::present`), never the capability itself.
pub(crate) fn authenticate(t: &surge_auth::Token, binding: &[u8]) -> Request {
    Request::Authenticate {
        token: t.present(binding),
    }
}

/// What the server answered to [`authenticate`]: `Ok`, or why not.
pub(crate) fn authenticated(server: &str, resp: Response) -> Result<(), ClientError> {
    match resp {
        Response::Ok => Ok(()),
        Response::Error(e) => Err(ClientError::Remote {
            server: server.to_string(),
            error: e,
        }),
        other => Err(ClientError::transport(
            server,
            format!("Authenticate answered {other:?}"),
        )),
    }
}

pub(crate) fn connection_notice(server: &str, resp: Response) -> ClientError {
    match resp {
        Response::Error(e) if e.code == ErrorCode::IdleClosed => ClientError::Unsent {
            server: server.to_string(),
            message: e.message,
        },
        Response::Error(e) => ClientError::Remote {
            server: server.to_string(),
            error: e,
        },
        other => ClientError::transport(server, format!("unexpected notice {other:?}")),
    }
}

pub struct Connection {
    server: String,
    writer: tokio::sync::Mutex<BoxWrite>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    next_id: AtomicU64,
    dead: AtomicBool,
    /// The client session its requests act for (frame header; 0 for none).
    session: u32,
    /// How long a request may take (see the module doc); `None`: no bound.
    deadline: Option<Duration>,
    /// The channel binding capabilities are presented for on it (empty when clear).
    binding: Vec<u8>,
}

impl Connection {
    /// Connects to `addr` (within `deadline`, which also bounds each request on it).
    pub async fn open(
        transport: &dyn Transport,
        addr: &Addr,
        server: &str,
        session: u32,
        deadline: Option<Duration>,
    ) -> Result<Arc<Connection>, ClientError> {
        let connecting = transport.connect(addr);
        let connected = match deadline {
            Some(d) => tokio::time::timeout(d, connecting)
                .await
                .unwrap_or_else(|_| {
                    Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no answer within {d:?}"),
                    ))
                }),
            None => connecting.await,
        };
        let connected = connected.map_err(|e| {
            ClientError::transport(server, format!("cannot connect to {addr}: {e}"))
        })?;
        let (mut reader, writer) = (connected.read, connected.write);
        let conn = Arc::new(Connection {
            server: server.to_string(),
            writer: tokio::sync::Mutex::new(writer),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            dead: AtomicBool::new(false),
            session,
            deadline,
            binding: connected.binding,
        });
        let weak = Arc::downgrade(&conn);
        // If the runtime that runs the reader goes away, the connection is dead: mark it so the
        // pool reconnects instead of waiting for replies nobody will read.
        struct ReaderGone(std::sync::Weak<Connection>);
        impl Drop for ReaderGone {
            fn drop(&mut self) {
                if let Some(c) = self.0.upgrade() {
                    c.fail_all("connection reader stopped".into());
                }
            }
        }
        let guard = ReaderGone(weak.clone());
        tokio::spawn(async move {
            let _guard = guard;
            loop {
                let frame = codec::read_response(&mut reader).await;
                let Some(conn) = weak.upgrade() else { break };
                match frame {
                    // The server refuses or closes the connection: no request left is answered.
                    Ok(f) if f.header.request_id == CONNECTION_ID => {
                        let e = connection_notice(&conn.server, f.response);
                        debug!("{}: connection closed by the server: {e}", conn.server);
                        conn.fail_all_with(e);
                        break;
                    }
                    Ok(f) => {
                        let tx = conn.pending.lock().remove(&f.header.request_id);
                        match tx {
                            Some(tx) => {
                                let _ = tx.send(Ok((f.response, f.payload)));
                            }
                            None => debug!(
                                "{}: reply to unknown request {}",
                                conn.server, f.header.request_id
                            ),
                        }
                    }
                    Err(e) => {
                        conn.fail_all(format!("connection lost: {e}"));
                        break;
                    }
                }
            }
        });
        Ok(conn)
    }

    fn fail_all(&self, why: String) {
        self.fail_all_with(ClientError::transport(&self.server, why));
    }

    /// Marks the connection dead and fails every request waiting on it with `e`.
    fn fail_all_with(&self, e: ClientError) {
        self.dead.store(true, Ordering::Release);
        let pending: Vec<_> = self.pending.lock().drain().collect();
        for (_, tx) in pending {
            let _ = tx.send(Err(e.clone()));
        }
    }

    /// The channel binding capabilities are presented for on this connection.
    pub fn binding(&self) -> &[u8] {
        &self.binding
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Sends one request and waits for its reply, within the connection's deadline. `payload`
    /// is sent as bulk bytes.
    pub async fn call(&self, req: &Request, payload: &[u8]) -> Reply {
        self.call_within(req, payload, self.deadline).await
    }

    /// [`call`](Self::call) within `deadline` (`None`: no bound). Past it the connection is
    /// dropped: the requests queued behind this one on the server get no reply either.
    pub async fn call_within(
        &self,
        req: &Request,
        payload: &[u8],
        deadline: Option<Duration>,
    ) -> Reply {
        let Some(d) = deadline else {
            return self.call_unbounded(req, payload).await;
        };
        match tokio::time::timeout(d, self.call_unbounded(req, payload)).await {
            Ok(r) => r,
            Err(_) => {
                let e = ClientError::Timeout {
                    server: self.server.clone(),
                    request: req.name(),
                    after: d,
                };
                warn!("{e}; the connection is dropped and the request fails (EIO)");
                self.fail_all(format!("connection dropped: {e}"));
                Err(e)
            }
        }
    }

    async fn call_unbounded(&self, req: &Request, payload: &[u8]) -> Reply {
        if self.is_dead() {
            return Err(ClientError::transport(
                &self.server,
                "connection closed".into(),
            ));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().insert(id, tx);
        // If this future is dropped in the middle of sending (a caller gave up), the stream
        // holds half a frame: nothing more can be sent on it, so the connection is dead.
        struct CutOff<'a>(&'a Connection, bool);
        impl Drop for CutOff<'_> {
            fn drop(&mut self) {
                if self.1 {
                    self.0
                        .fail_all("a request was abandoned while being sent".into());
                }
            }
        }
        let written = {
            let mut w = self.writer.lock().await;
            let mut guard = CutOff(self, true);
            let r = codec::write_request(&mut *w, id, self.session, req, payload).await;
            guard.1 = false;
            r
        };
        if let Err(e) = written {
            self.pending.lock().remove(&id);
            self.fail_all(format!("send failed: {e}"));
            return Err(ClientError::transport(
                &self.server,
                format!("send failed: {e}"),
            ));
        }
        match rx.await {
            Ok(r) => r,
            Err(_) => Err(ClientError::transport(
                &self.server,
                "connection closed".into(),
            )),
        }
    }
}

/// Where a client learns a server's addresses anew when none of those it has answers (a
/// server restarted elsewhere, or on another port, and registered again): the manager.
pub trait Resolve: Send + Sync {
    /// The addresses server `id` registered last.
    fn addrs(
        &self,
        id: &str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<String>, String>> + Send>>;
}

/// [`Resolve`] by asking the manager at an address (`host:port`, or several, comma-separated)
/// for the servers it knows.
pub struct ManagerResolver {
    pub manager: String,
}

impl Resolve for ManagerResolver {
    fn addrs(
        &self,
        id: &str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<String>, String>> + Send>>
    {
        let (manager, id) = (self.manager.clone(), id.to_string());
        Box::pin(async move {
            let mut c = surge_api::connect(&manager)
                .await
                .map_err(|e| format!("manager {manager}: {e:#}"))?;
            let list = c
                .list_servers(surge_api::v1::Empty {})
                .await
                .map_err(|e| format!("manager {manager}: {}", e.message()))?
                .into_inner();
            list.servers
                .into_iter()
                .find(|s| s.id == id)
                .map(|s| s.addrs)
                .ok_or_else(|| format!("manager {manager} knows no server {id}"))
        })
    }
}

/// How often a pool asks where its server is at most.
const RESOLVE_EVERY: Duration = Duration::from_secs(1);

/// What a pool learnt of its server's addresses: what it uses now, and when it last asked.
struct Where {
    addrs: Vec<Addr>,
    raw: Vec<String>,
    asked: Option<std::time::Instant>,
}

/// A few connections to one server, used round-robin.
pub struct ServerPool {
    /// The server as the instance's descriptor gave it (its addresses then: see
    /// [`ServerPool::server_now`]).
    pub server: ServerRef,
    place: Mutex<Where>,
    resolve: Option<Arc<dyn Resolve>>,
    /// One question to the resolver at a time; the others wait for its answer.
    resolving: tokio::sync::Mutex<()>,
    /// Counts the moves learnt (a caller that waited sees whether the one before it moved).
    moves: AtomicU64,
    transport: Arc<dyn Transport>,
    slots: Vec<tokio::sync::Mutex<Option<Arc<Connection>>>>,
    next: AtomicUsize,
    session: u32,
    /// The capability every connection of the pool presents first.
    token: Option<Arc<surge_auth::Token>>,
    deadline: Option<Duration>,
    /// The key of a FUSE thread's own connection for this pool ([`crate::blocking::call`]):
    /// one per server and capability, so two mounts of one process never share one.
    inline_key: String,
}

impl ServerPool {
    pub fn new(server: ServerRef, connections: usize) -> Result<ServerPool, ClientError> {
        Self::with_transport(server, connections, Arc::new(SocketTransport))
    }

    pub fn with_transport(
        server: ServerRef,
        connections: usize,
        transport: Arc<dyn Transport>,
    ) -> Result<ServerPool, ClientError> {
        let addrs = usable_addrs(&server)?;
        Ok(ServerPool {
            place: Mutex::new(Where {
                addrs,
                raw: server.addrs.clone(),
                asked: None,
            }),
            resolve: None,
            resolving: tokio::sync::Mutex::new(()),
            moves: AtomicU64::new(0),
            transport,
            slots: (0..connections.max(1))
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
            next: AtomicUsize::new(0),
            session: 0,
            inline_key: server.id.clone(),
            server,
            token: None,
            deadline: Some(DEFAULT_DEADLINE),
        })
    }

    /// The pool's connections present `token` (a capability) before anything else.
    pub fn with_token(mut self, token: Arc<surge_auth::Token>) -> ServerPool {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        token.bytes().hash(&mut h);
        self.inline_key = format!("{}#{:x}", self.server.id, h.finish());
        self.token = Some(token);
        self
    }

    pub(crate) fn inline_key(&self) -> &str {
        &self.inline_key
    }

    pub fn token(&self) -> Option<&surge_auth::Token> {
        self.token.as_deref()
    }

    /// When none of the server's addresses answers, the pool asks `resolve` where it is now
    /// (at most once a second) and connects there.
    pub fn with_resolver(mut self, resolve: Option<Arc<dyn Resolve>>) -> ServerPool {
        self.resolve = resolve;
        self
    }

    /// The server with the addresses the pool uses now.
    pub fn server_now(&self) -> ServerRef {
        ServerRef {
            id: self.server.id.clone(),
            addrs: self.place.lock().raw.clone(),
        }
    }

    /// Asks the resolver for the server's addresses; true when they changed (and are used
    /// from now on), also when they changed while this caller waited for another's question.
    /// The resolver is asked at most once a second: a caller waits for that second rather
    /// than fail. False without a resolver, or when the answer is the same or unusable here.
    pub async fn resolve_again(&self) -> bool {
        let Some(r) = &self.resolve else {
            return false;
        };
        let seen = self.moves.load(Ordering::Acquire);
        let _one = self.resolving.lock().await;
        if self.moves.load(Ordering::Acquire) != seen {
            return true;
        }
        let asked = self.place.lock().asked;
        if let Some(t) = asked {
            tokio::time::sleep(RESOLVE_EVERY.saturating_sub(t.elapsed())).await;
        }
        self.place.lock().asked = Some(std::time::Instant::now());
        let raw = match r.addrs(&self.server.id).await {
            Ok(a) => a,
            Err(e) => {
                warn!(
                    "server {}: cannot learn where it is now: {e}",
                    self.server.id
                );
                return false;
            }
        };
        let fresh = ServerRef {
            id: self.server.id.clone(),
            addrs: raw.clone(),
        };
        let Ok(addrs) = usable_addrs(&fresh) else {
            return false;
        };
        let mut p = self.place.lock();
        if p.raw == raw {
            return false;
        }
        warn!(
            "server {} moved: {:?} -> {:?} (as the manager says); connecting there",
            self.server.id, p.raw, raw
        );
        p.addrs = addrs;
        p.raw = raw;
        self.moves.fetch_add(1, Ordering::Release);
        true
    }

    /// [`resolve_again`](Self::resolve_again) from a thread that may not wait on the runtime
    /// (a FUSE thread sending inline): asked on a thread of its own.
    pub fn resolve_again_blocking(&self) -> bool {
        if self.resolve.is_none() {
            return false;
        }
        std::thread::scope(|sc| {
            sc.spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map(|rt| rt.block_on(self.resolve_again()))
                    .unwrap_or(false)
            })
            .join()
            .unwrap_or(false)
        })
    }

    /// The pool's requests wait at most `deadline` for their replies (`None`: forever).
    pub fn with_deadline(mut self, deadline: Option<Duration>) -> ServerPool {
        self.deadline = deadline;
        self
    }

    pub fn deadline(&self) -> Option<Duration> {
        self.deadline
    }

    /// The pool's requests act for client session `session` (frame header).
    pub fn with_session(mut self, session: u32) -> ServerPool {
        self.session = session;
        self
    }

    pub fn session(&self) -> u32 {
        self.session
    }

    /// A new connection of the pool's session (the first of its addresses that answers),
    /// outside the pool: also for a request that waits long (the pool's connections each
    /// serve their requests in order).
    pub async fn dedicated(&self) -> Result<Arc<Connection>, ClientError> {
        // The deadline bounds the whole attempt, every address and the capability's answer
        // included: a hung server costs a caller one deadline, not one per address.
        match self.deadline {
            Some(d) => tokio::time::timeout(d, self.dedicated_unbounded())
                .await
                .unwrap_or_else(|_| {
                    Err(ClientError::transport(
                        &self.server.id,
                        format!("no connection within {d:?}"),
                    ))
                }),
            None => self.dedicated_unbounded().await,
        }
    }

    async fn dedicated_unbounded(&self) -> Result<Arc<Connection>, ClientError> {
        match self.dedicated_once().await {
            Err(e) if matches!(e, ClientError::Transport { .. }) && self.resolve_again().await => {
                self.dedicated_once().await
            }
            r => r,
        }
    }

    async fn dedicated_once(&self) -> Result<Arc<Connection>, ClientError> {
        let mut last = None;
        let addrs = self.place.lock().addrs.clone();
        for addr in &addrs {
            let opened = Connection::open(
                &*self.transport,
                addr,
                &self.server.id,
                self.session,
                self.deadline,
            );
            match opened.await {
                Ok(c) => {
                    if let Some(t) = &self.token {
                        let (resp, _) = c.call(&authenticate(t, c.binding()), &[]).await?;
                        authenticated(&self.server.id, resp)?;
                    }
                    return Ok(c);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| ClientError::transport(&self.server.id, "no address".into())))
    }

    async fn connection(&self) -> Result<Arc<Connection>, ClientError> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let mut slot = self.slots[i].lock().await;
        if let Some(c) = slot.as_ref() {
            if !c.is_dead() {
                return Ok(c.clone());
            }
        }
        let c = self.dedicated().await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Sends a request on one of the pool's connections, within the pool's deadline.
    pub async fn call(&self, req: &Request, payload: &[u8]) -> Reply {
        self.call_within(req, payload, self.deadline).await
    }

    /// [`call`](Self::call) within `deadline` (`None`: no bound). A request the server did not
    /// read because it closed an idle connection is sent again on a new one.
    pub async fn call_within(
        &self,
        req: &Request,
        payload: &[u8],
        deadline: Option<Duration>,
    ) -> Reply {
        let mut unsent = 0;
        let r = loop {
            let conn = self.connection().await?;
            match conn.call_within(req, payload, deadline).await {
                Err(ClientError::Unsent { message, .. }) if unsent < 3 => {
                    debug!(
                        "{}: {message}; sending {} again",
                        self.server.id,
                        req.name()
                    );
                    unsent += 1;
                }
                r => break r?,
            }
        };
        match r {
            (Response::Error(e), _) => Err(ClientError::Remote {
                server: self.server.id.clone(),
                error: e,
            }),
            ok => Ok(ok),
        }
    }
}

/// The addresses of a server this host can use: Unix sockets only when the socket exists here.
fn usable_addrs(server: &ServerRef) -> Result<Vec<Addr>, ClientError> {
    let mut out = Vec::new();
    for a in &server.addrs {
        let addr: Addr = a
            .parse()
            .map_err(|e: String| ClientError::transport(&server.id, e))?;
        match &addr {
            Addr::Unix(p) if !p.exists() => {}
            _ => out.push(addr),
        }
    }
    if out.is_empty() {
        return Err(ClientError::transport(
            &server.id,
            format!("no usable address among {:?}", server.addrs),
        ));
    }
    Ok(out)
}
