//! TLS 1.3 on the data protocol (docs/SECURITY.md, "On the wire"): servers present a
//! certificate signed by the site CA, clients verify it against the CA's certificate, and
//! both sides derive the connection's channel binding (RFC 9266 `tls-exporter`), which the
//! client's capability proof is made for (`surge_auth::Token::present`).
//!
//! What is encrypted ([`Mode`]): `auto` (the default) encrypts every TCP connection that leaves
//! the host wherever certificates are installed, and leaves loopback TCP and Unix sockets (which
//! never leave the host: the embedded `surge run`, a mount beside its server) in clear; `on`
//! encrypts loopback TCP too; `off` is for a private fabric, and sends everything in clear.
//! A server that has a certificate never serves a clear connection from another host, and a
//! client that has the CA never sends one to another host: neither side can be talked down.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// RFC 9266's exporter label for channel bindings.
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-Channel-Binding";
/// Bytes of a channel binding.
pub const BINDING_LEN: usize = 32;
/// The first byte of a TLS handshake record: how a server tells TLS from a clear frame.
pub const HANDSHAKE_BYTE: u8 = 0x16;

/// Where TLS is used (`SURGE_TLS`, `surge server --tls`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Never: everything in clear (a private fabric).
    Off,
    /// On every TCP connection that leaves the host, when certificates are installed.
    Auto,
    /// On every TCP connection, loopback included; certificates required.
    On,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "off" => Ok(Mode::Off),
            "auto" => Ok(Mode::Auto),
            "on" => Ok(Mode::On),
            _ => Err(format!("'{s}': TLS mode is on, auto or off")),
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Off => "off",
            Mode::Auto => "auto",
            Mode::On => "on",
        })
    }
}

/// The host of `host:port` (`[v6]:port` gives `v6`).
pub fn host_of(hp: &str) -> &str {
    let h = hp.rsplit_once(':').map_or(hp, |(h, _)| h);
    h.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(h)
}

/// True for names and addresses that never leave the host.
pub fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The crypto provider: ring, TLS 1.3 suites only, AES-128-GCM first (the fastest with AES
/// instructions, which every x86 and Arm server CPU has).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring as r;
    let mut p = r::default_provider();
    p.cipher_suites = vec![
        r::cipher_suite::TLS13_AES_128_GCM_SHA256,
        r::cipher_suite::TLS13_AES_256_GCM_SHA384,
        r::cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(p)
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read certificates from {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no certificate", path.display()));
    }
    Ok(certs)
}

/// A client's TLS: the CA it trusts and where it uses TLS.
pub struct ClientTls {
    pub config: Arc<rustls::ClientConfig>,
    pub mode: Mode,
    /// The CA file it was loaded from (for messages).
    pub ca: PathBuf,
}

impl ClientTls {
    /// Trusts the certificates in `ca` (PEM).
    pub fn from_ca_file(ca: &Path, mode: Mode) -> Result<ClientTls, String> {
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(ca)? {
            roots
                .add(c)
                .map_err(|e| format!("{}: not a usable CA certificate: {e}", ca.display()))?;
        }
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        // After the handshake, records are Surge's own (`crate::record`).
        config.enable_secret_extraction = true;
        Ok(ClientTls {
            config: Arc::new(config),
            mode,
            ca: ca.to_path_buf(),
        })
    }

    /// True when a connection to `host` is encrypted.
    pub fn applies(&self, host: &str) -> bool {
        match self.mode {
            Mode::Off => false,
            Mode::Auto => !is_loopback(host),
            Mode::On => true,
        }
    }

    /// A connection to the server named `name`, and the traffic secrets its handshake will
    /// leave for the record layer (`crate::record::take_keys`): the key log that keeps them is
    /// this connection's alone, in a copy of the configuration.
    pub fn connection(
        &self,
        name: ServerName<'static>,
    ) -> std::io::Result<(rustls::Connection, Arc<crate::record::TrafficSecrets>)> {
        let secrets = Arc::new(crate::record::TrafficSecrets::default());
        let mut config = (*self.config).clone();
        config.key_log = secrets.clone();
        let conn = rustls::ClientConnection::new(Arc::new(config), name)
            .map_err(|e| std::io::Error::other(format!("TLS: {e}")))?;
        Ok((conn.into(), secrets))
    }

    /// The name the server's certificate must carry for a connection to `host`.
    pub fn server_name(host: &str) -> std::io::Result<ServerName<'static>> {
        ServerName::try_from(host.to_string()).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("'{host}' is not a name a certificate can carry: {e}"),
            )
        })
    }
}

/// The CA file clients trust: `$SURGE_TLS_CA`, else `ca.crt` in the certificate directory
/// (`$SURGE_TLS_DIR`, else `/etc/surge/tls`).
pub fn default_ca() -> PathBuf {
    if let Some(p) = std::env::var_os("SURGE_TLS_CA") {
        return p.into();
    }
    cert_dir().join("ca.crt")
}

/// `$SURGE_TLS_DIR`, else `/etc/surge/tls`.
pub fn cert_dir() -> PathBuf {
    std::env::var_os("SURGE_TLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/etc/surge/tls".into())
}

/// The client TLS of mode `mode` with the CA at `ca`: `None` when nothing is encrypted
/// (`off`, or `auto` without a CA file); an error when `on` and the CA cannot be loaded.
pub fn client_with(mode: Mode, ca: &Path) -> Result<Option<ClientTls>, String> {
    match mode {
        Mode::Off => Ok(None),
        Mode::Auto if !ca.exists() => Ok(None),
        _ => ClientTls::from_ca_file(ca, mode).map(Some),
    }
}

/// This process's client TLS, from `SURGE_TLS` (`on`, `auto`, `off`; default `auto`) and the
/// CA file ([`default_ca`]); loaded once.
pub fn client() -> Result<Option<Arc<ClientTls>>, String> {
    static CLIENT: std::sync::OnceLock<Result<Option<Arc<ClientTls>>, String>> =
        std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let mode = match std::env::var("SURGE_TLS") {
                Ok(v) if !v.is_empty() => {
                    v.parse::<Mode>().map_err(|e| format!("SURGE_TLS: {e}"))?
                }
                _ => Mode::Auto,
            };
            Ok(client_with(mode, &default_ca())?.map(Arc::new))
        })
        .clone()
}

/// A server's TLS: its certificate and key, and which peers must use it.
pub struct ServerTls {
    pub config: Arc<rustls::ServerConfig>,
    pub mode: Mode,
}

impl ServerTls {
    /// Presents the certificate chain in `cert` with the key in `key` (PEM).
    pub fn from_files(cert: &Path, key: &Path, mode: Mode) -> Result<ServerTls, String> {
        let chain = certs(cert)?;
        let key = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| format!("cannot read the key {}: {e}", key.display()))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| format!("TLS: {e}"))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| format!("{} and its key: {e}", cert.display()))?;
        // No session tickets: a client's idle-connection check (a peek at its socket) must not
        // find bytes nobody asked for; connections are long-lived, resumption gains nothing.
        // (And `crate::record` takes over after the handshake: no message of rustls's follows it.)
        config.send_tls13_tickets = 0;
        config.enable_secret_extraction = true;
        Ok(ServerTls {
            config: Arc::new(config),
            mode,
        })
    }

    /// A connection from a client, and the traffic secrets its handshake will leave for the
    /// record layer (see `ClientTls::connection`).
    pub fn connection(
        &self,
    ) -> std::io::Result<(rustls::Connection, Arc<crate::record::TrafficSecrets>)> {
        let secrets = Arc::new(crate::record::TrafficSecrets::default());
        let mut config = (*self.config).clone();
        config.key_log = secrets.clone();
        let conn = rustls::ServerConnection::new(Arc::new(config))
            .map_err(|e| std::io::Error::other(format!("TLS: {e}")))?;
        Ok((conn.into(), secrets))
    }

    /// True when a peer at `ip` must use TLS (it may always choose to).
    pub fn required_from(&self, ip: Option<std::net::IpAddr>) -> bool {
        match self.mode {
            Mode::Off => false,
            Mode::Auto => !ip.is_some_and(|ip| ip.is_loopback()),
            Mode::On => true,
        }
    }
}

/// What a listener's `--tls MODE --tls-cert CERT --tls-key KEY` ask for (a server's data
/// protocol, the manager's gRPC and HTTP): `Ok(None)` when it speaks clear text only (mode
/// `off`, or `auto` without a certificate, which `say` is told for the log), an error naming
/// the flag when the certificate or key cannot be used. CERT defaults to server.crt in the
/// certificate directory, KEY to server.key beside CERT.
pub fn server_from_flags(
    mode: Mode,
    cert: Option<&Path>,
    key: Option<&Path>,
    say: impl FnOnce(&str),
) -> Result<Option<Arc<ServerTls>>, String> {
    let cert = cert.map_or_else(|| cert_dir().join("server.crt"), Path::to_path_buf);
    let key = key.map_or_else(|| cert.with_file_name("server.key"), Path::to_path_buf);
    match mode {
        Mode::Off => Ok(None),
        Mode::Auto if !cert.exists() => {
            say(&format!(
                "no certificate at {}: clear text (make one with `surge cert server`, or say \
                 --tls off on a private fabric)",
                cert.display()
            ));
            Ok(None)
        }
        mode => ServerTls::from_files(&cert, &key, mode)
            .map(|t| Some(Arc::new(t)))
            .map_err(|e| format!("--tls {mode}: {e}")),
    }
}

/// The channel binding of an established TLS connection (RFC 9266 `tls-exporter`).
pub fn binding(conn: &rustls::Connection) -> std::io::Result<Vec<u8>> {
    conn.export_keying_material(vec![0u8; BINDING_LEN], EXPORTER_LABEL, None)
        .map_err(|e| std::io::Error::other(format!("TLS exporter: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_loopback() {
        assert_eq!(host_of("10.0.0.1:7070"), "10.0.0.1");
        assert_eq!(host_of("[::1]:7070"), "::1");
        assert_eq!(host_of("bb1:7070"), "bb1");
        assert!(is_loopback("127.0.0.1") && is_loopback("::1") && is_loopback("localhost"));
        assert!(!is_loopback("10.0.0.1") && !is_loopback("bb1"));
    }
}
