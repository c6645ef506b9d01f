//! The control plane's gRPC API: what the CLI, `surge run` and servers use to talk to
//! `surge manager`. Generated from `proto/surge.proto`; see that file for the meaning of each
//! call. Bulk data never goes through this API (DESIGN §3).
//!
//! Every call carries a fresh MUNGE credential ([`Munge`], header [`MUNGE_HEADER`]); the
//! manager takes the caller's uid and gid from it. [`connect`] gives a client that does so.

/// The gRPC library the API is made with (its `Status` in errors callers match).
pub use tonic;

pub mod v1 {
    tonic::include_proto!("surge.v1");
}

use std::path::PathBuf;
use std::time::Duration;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// The metadata key carrying a call's MUNGE credential.
pub const MUNGE_HEADER: &str = "x-surge-munge";

/// The metadata key carrying the client's release (`CARGO_PKG_VERSION`, e.g. "0.1.0").
pub const VERSION_HEADER: &str = "x-surge-version";

/// This build's release, as clients send it and the manager checks it.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The version rule between a client and the manager (docs/OPERATIONS.md, "Upgrades"): the
/// API only grows (fields and calls are added, never renumbered or removed), so releases of
/// the same major version one minor apart work together, and an upgrade can do the manager
/// and the clients in either order. Further apart, the call is refused with both versions
/// named. `None`: compatible; else why not.
pub fn incompatible(client: &str, manager: &str) -> Option<String> {
    let parse = |v: &str| -> Option<(u64, u64)> {
        let mut it = v.trim().split('.');
        Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
    };
    let (Some(c), Some(m)) = (parse(client), parse(manager)) else {
        return Some(format!(
            "client version {client:?} is not a release number (major.minor.patch)"
        ));
    };
    if c.0 == m.0 && c.1.abs_diff(m.1) <= 1 {
        return None;
    }
    Some(format!(
        "this client is Surge {client} and the manager {manager}: releases work together only \
         within one minor version of the same major one; upgrade the {} (docs/OPERATIONS.md, \
         Upgrades)",
        if (c.0, c.1) < (m.0, m.1) {
            "client"
        } else {
            "manager"
        }
    ))
}

/// How long a client sends the same MUNGE credential (well inside munged's default time to
/// live of 300 s): the manager decodes it once and knows it from its cache for the rest of
/// this time (see the manager's `service::authenticate`), so a client's calls do not each
/// cost a credential on both sides.
pub const CREDENTIAL_REUSE: Duration = Duration::from_secs(30);

/// Adds a MUNGE credential (from the munged at `socket`) to every call: one credential for
/// [`CREDENTIAL_REUSE`], then a fresh one.
#[derive(Clone, Debug)]
pub struct Munge {
    pub socket: PathBuf,
    cred: std::sync::Arc<std::sync::Mutex<Option<(String, std::time::Instant, u32)>>>,
}

impl Munge {
    pub fn new(socket: PathBuf) -> Munge {
        Munge {
            socket,
            cred: Default::default(),
        }
    }

    fn credential(&self) -> Result<String, surge_auth::AuthError> {
        // SAFETY: geteuid has no preconditions. A process that changed its user makes a
        // credential of the new one.
        let euid = unsafe { libc::geteuid() };
        let mut c = self.cred.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((cred, made, uid)) = c.as_ref() {
            if *uid == euid && made.elapsed() < CREDENTIAL_REUSE {
                return Ok(cred.clone());
            }
        }
        let cred = surge_auth::munge::encode(&self.socket)?;
        *c = Some((cred.clone(), std::time::Instant::now(), euid));
        Ok(cred)
    }
}

impl tonic::service::Interceptor for Munge {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let cred = self
            .credential()
            .map_err(|e| tonic::Status::unauthenticated(e.to_string()))?;
        let value = cred
            .parse()
            .map_err(|_| tonic::Status::internal("a MUNGE credential is not header-safe"))?;
        req.metadata_mut().insert(MUNGE_HEADER, value);
        req.metadata_mut().insert(
            VERSION_HEADER,
            tonic::metadata::MetadataValue::from_static(VERSION),
        );
        Ok(req)
    }
}

/// A client of the manager whose calls are authenticated with MUNGE.
pub type Client = v1::manager_client::ManagerClient<InterceptedService<Channel, Munge>>;

/// Errors of [`connect`].
#[derive(Debug)]
pub struct ConnectError(pub String);

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConnectError {}

/// A manager's answer that is an error, kept whole (its code says whether to retry).
#[derive(Debug)]
pub struct ManagerStatus(pub tonic::Status);

impl std::fmt::Display for ManagerStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.message())
    }
}

impl std::error::Error for ManagerStatus {}

/// Turns a gRPC error into the manager's own message, its status kept whole (its code says
/// whether to retry: see [`manager_gone`]).
pub fn status_err(s: tonic::Status) -> anyhow::Error {
    anyhow::Error::new(ManagerStatus(s))
}

/// True when `e` says the manager went away (it died, lost its lead, or none answers yet)
/// rather than that the request was wrong: an idempotent request may then be made again, to
/// the next leader.
pub fn manager_gone(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.is::<ConnectError>() {
            return true;
        }
        let status = err
            .downcast_ref::<ManagerStatus>()
            .map(|s| &s.0)
            .or_else(|| err.downcast_ref::<tonic::Status>());
        if let Some(s) = status {
            return match s.code() {
                // Cancelled: the connection under the call went (tower's "operation was
                // canceled" when a dying manager's channel is dropped).
                tonic::Code::Unavailable | tonic::Code::Cancelled => true,
                tonic::Code::Unknown | tonic::Code::Internal => {
                    let m = s.message();
                    m.contains("transport") || m.contains("connection") || m.contains("h2")
                }
                _ => false,
            };
        }
        cur = err.source();
    }
    false
}

static MUNGE_SOCKET: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Makes [`munge_socket`] answer `socket` for the rest of this process (`surge run` calls it
/// with the munged its embedded manager uses). A second call is ignored.
pub fn use_munge_socket(socket: PathBuf) {
    let _ = MUNGE_SOCKET.set(socket);
}

/// The munged socket a client uses: the one given to [`use_munge_socket`]; else
/// `$SURGE_MUNGE_SOCKET`; else the system's when a munged answers there (a host where munged
/// died keeps its socket file); else that of the embedded default (`surge run` with no manager
/// starts a munged of its own in `$SURGE_FAST_DIR`, default `/dev/shm/surge-$USER`, under
/// `run/munge/`) when it exists; else the system's (whose error then names it).
pub fn munge_socket() -> PathBuf {
    if let Some(s) = MUNGE_SOCKET.get() {
        return s.clone();
    }
    if std::env::var_os(surge_auth::munge::SOCKET_ENV).is_some() {
        return surge_auth::munge::socket();
    }
    let system = PathBuf::from(surge_auth::munge::SYSTEM_SOCKET);
    if surge_auth::munge::answers(&system) {
        return system;
    }
    let fast = std::env::var_os("SURGE_FAST_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(format!("/dev/shm/surge-{}", surge_core::sys::user_name()))
        });
    // Another user's directory under our default name would hand our credentials to their
    // munged: only a directory of our own is looked in.
    if surge_core::private_dir::check(&fast).is_err() {
        return system;
    }
    let embedded = fast.join("run/munge/munge.socket");
    if embedded.exists() {
        embedded
    } else {
        system
    }
}

/// Connects to the manager at `addr` (`host:port`), authenticating every call with the munged
/// of [`munge_socket`].
pub async fn connect(addr: &str) -> Result<Client, ConnectError> {
    connect_with(addr, munge_socket()).await
}

/// A connection to the one manager at `addr`: TLS when this process has the site CA and the
/// manager is on another host (or `SURGE_TLS=on`; see `surge_proto::tls::client`).
async fn channel(addr: &str) -> Result<tonic::transport::Channel, ConnectError> {
    let hostport = addr.strip_prefix("http://").unwrap_or(addr);
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{hostport}"))
        .map_err(|e| ConnectError(format!("'{addr}' is not a manager address: {e}")))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    let tls = surge_proto::tls::client().map_err(ConnectError)?;
    let host = surge_proto::tls::host_of(hostport).to_string();
    let Some(tls) = tls.filter(|t| t.applies(&host)) else {
        return endpoint
            .connect()
            .await
            .map_err(|e| ConnectError(format!("cannot reach the manager at {addr}: {e}")));
    };
    let name = surge_proto::tls::ClientTls::server_name(&host)
        .map_err(|e| ConnectError(format!("manager {addr}: {e}")))?;
    let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
    let target = hostport.to_string();
    let connect = tower::service_fn(move |_: tonic::transport::Uri| {
        let (connector, name, target) = (connector.clone(), name.clone(), target.clone());
        async move {
            let tcp =
                tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&target))
                    .await
                    .map_err(|_| {
                        std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")
                    })??;
            tcp.set_nodelay(true)?;
            let t = tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name, tcp))
                .await
                .map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out")
                })??;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(t))
        }
    });
    endpoint.connect_with_connector(connect).await.map_err(|e| {
        let mut m = format!(
            "cannot reach the manager at {addr} over TLS (trusting {}): {e}",
            tls.ca.display()
        );
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            m.push_str(&format!(": {s}"));
            src = s.source();
        }
        ConnectError(m)
    })
}

/// How long a connection to a manager (and its TLS handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a client of several managers (`host:port,host:port`: a leader and its standbys
/// on etcd) keeps trying while none answers: long enough for a standby to take over after the
/// leader died (its lease, ~3 s, then its start).
pub const FAILOVER_WAIT: Duration = Duration::from_secs(30);

/// [`connect`] with the munged at `socket`. `addr` may list several managers separated by
/// commas: the first that accepts the connection is the leader (standbys do not listen), and
/// while none does the list is tried again for [`FAILOVER_WAIT`].
pub async fn connect_with(addr: &str, socket: PathBuf) -> Result<Client, ConnectError> {
    let addrs: Vec<&str> = addr
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    if addrs.is_empty() {
        return Err(ConnectError(format!("'{addr}' names no manager")));
    }
    let mut pauses = surge_core::backoff::Backoff::new(FAILOVER_WAIT, Duration::from_millis(200));
    let ch = 'found: loop {
        let mut last = None;
        for a in &addrs {
            match channel(a).await {
                Ok(ch) => break 'found ch,
                Err(e) => last = Some(e),
            }
        }
        let e = last.unwrap_or_else(|| ConnectError(format!("'{addr}' names no manager")));
        match pauses.next() {
            Some(pause) if addrs.len() > 1 => tokio::time::sleep(pause).await,
            _ => return Err(e),
        }
    };
    Ok(v1::manager_client::ManagerClient::with_interceptor(
        ch,
        Munge::new(socket),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_one_minor_apart_work_together_and_others_are_told_why_not() {
        assert_eq!(incompatible("0.1.0", "0.1.7"), None);
        assert_eq!(incompatible("0.2.0", "0.1.0"), None);
        assert_eq!(incompatible("0.1.3", "0.2.0"), None);
        let e = incompatible("0.3.0", "0.1.0").expect("two minors apart");
        assert!(
            e.contains("0.3.0") && e.contains("0.1.0") && e.contains("upgrade the manager"),
            "{e}"
        );
        let e = incompatible("1.1.0", "2.1.0").expect("another major");
        assert!(e.contains("upgrade the client"), "{e}");
        assert!(incompatible("x", "0.1.0").is_some());
    }
}
