//! The control plane's gRPC API: what the CLI, `surge run` and servers use to talk to
//! `surge manager`. Generated from `proto/surge.proto`; see that file for the meaning of each
//! call. Bulk data never goes through this API (DESIGN §3).
//!
//! Every call carries a fresh MUNGE credential ([`Munge`], header [`MUNGE_HEADER`]); the
//! manager takes the caller's uid and gid from it. [`connect`] gives a client that does so.

pub mod v1 {
    tonic::include_proto!("surge.v1");
}

use std::path::PathBuf;
use std::time::Duration;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// The metadata key carrying a call's MUNGE credential.
pub const MUNGE_HEADER: &str = "x-surge-munge";

/// Adds a fresh MUNGE credential (from the munged at `socket`) to every call.
#[derive(Clone, Debug)]
pub struct Munge {
    pub socket: PathBuf,
}

impl tonic::service::Interceptor for Munge {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let cred = surge_auth::munge::encode(&self.socket)
            .map_err(|e| tonic::Status::unauthenticated(e.to_string()))?;
        let value = cred
            .parse()
            .map_err(|_| tonic::Status::internal("a MUNGE credential is not header-safe"))?;
        req.metadata_mut().insert(MUNGE_HEADER, value);
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

/// [`connect`] with the munged at `socket`.
pub async fn connect_with(addr: &str, socket: PathBuf) -> Result<Client, ConnectError> {
    let url = if addr.starts_with("http://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    let ch = tonic::transport::Endpoint::from_shared(url)
        .map_err(|e| ConnectError(format!("'{addr}' is not a manager address: {e}")))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| ConnectError(format!("cannot reach the manager at {addr}: {e}")))?;
    Ok(v1::manager_client::ManagerClient::with_interceptor(
        ch,
        Munge { socket },
    ))
}
