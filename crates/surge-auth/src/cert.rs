//! Certificates for TLS on the servers' data protocol (docs/SECURITY.md, "Certificates"): a
//! site CA made at install (`surge cert ca`) or brought by the site, and one certificate per
//! burst-buffer host signed by it (`surge cert server`), naming the addresses clients use.
//! Clients trust the CA's certificate only; keys are written 0600 and never overwritten.
//! The same CA signs what the manager's etcd needs: members' certificates valid both ways
//! (`surge cert server --peer`) and the manager's client certificate (`surge cert client`).

use crate::AuthError;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Where certificates are when nothing says otherwise.
pub const DEFAULT_DIR: &str = "/etc/surge/tls";
/// The CA's certificate (every host) and key (the host that signs, kept offline at best).
pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
/// A burst-buffer host's certificate and key.
pub const SERVER_CERT: &str = "server.crt";
pub const SERVER_KEY: &str = "server.key";
/// A client's certificate and key (the manager's, for an etcd that asks for one).
pub const CLIENT_CERT: &str = "client.crt";
pub const CLIENT_KEY: &str = "client.key";

/// What a certificate signed by the CA may be used for (its extended key usage): a TLS peer
/// checks it, so a certificate works only in the role it was made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Serves TLS (serverAuth): burst-buffer hosts, the manager.
    Server,
    /// Serves and dials with the same certificate (serverAuth and clientAuth): an etcd member,
    /// which presents it to clients, to its peers when it dials them, and to itself (its
    /// gateway dials its own gRPC port).
    Peer,
    /// Dials only (clientAuth), named by its common name: the manager to its etcd.
    Client,
}

fn err(message: impl Into<String>) -> AuthError {
    AuthError::Cert(message.into())
}

/// The certificate directory: `$SURGE_TLS_DIR`, else [`DEFAULT_DIR`].
pub fn default_dir() -> PathBuf {
    std::env::var_os("SURGE_TLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| DEFAULT_DIR.into())
}

/// Writes `text` to a new file `path` with `mode`; an existing file is never overwritten.
fn write_new(path: &Path, text: &str, mode: u32) -> Result<(), AuthError> {
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() && !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(|e| err(format!("cannot create {}: {e}", dir.display())))?;
        }
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => err(format!(
                "{} exists: not overwritten (remove it first to make a new one)",
                path.display()
            )),
            _ => err(format!("cannot create {}: {e}", path.display())),
        })?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| err(format!("cannot write {}: {e}", path.display())))
}

fn read(path: &Path, what: &str) -> Result<String, AuthError> {
    std::fs::read_to_string(path)
        .map_err(|e| err(format!("cannot read the {what} {}: {e}", path.display())))
}

fn validity(p: &mut CertificateParams, days: u32) {
    let now = time::OffsetDateTime::now_utc();
    // An hour of slack for clocks a little behind the signer's.
    p.not_before = now - time::Duration::hours(1);
    p.not_after = now + time::Duration::days(i64::from(days));
}

/// A new CA (`CN=<name>`, valid `days`): its certificate and key as PEM.
pub fn make_ca(name: &str, days: u32) -> Result<(String, String), AuthError> {
    let key = KeyPair::generate().map_err(|e| err(format!("cannot make a key: {e}")))?;
    let mut p = CertificateParams::new(Vec::<String>::new())
        .map_err(|e| err(format!("CA parameters: {e}")))?;
    p.distinguished_name.push(DnType::CommonName, name);
    p.distinguished_name
        .push(DnType::OrganizationName, "Surge burst buffer");
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    validity(&mut p, days);
    let cert = p
        .self_signed(&key)
        .map_err(|e| err(format!("cannot sign the CA: {e}")))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A server certificate for `names` (DNS names or IP addresses: what clients connect to),
/// signed by the CA of `ca_cert_pem` / `ca_key_pem`, valid `days`: certificate and key as PEM.
pub fn make_server(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    names: &[String],
    days: u32,
) -> Result<(String, String), AuthError> {
    make_signed(ca_cert_pem, ca_key_pem, names, Role::Server, days)
}

/// A certificate signed by the CA of `ca_cert_pem` / `ca_key_pem` for `role`, valid `days`:
/// certificate and key as PEM. `names` are the DNS names or IP addresses peers connect to
/// (servers and peers), or one name, its common name (clients).
pub fn make_signed(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    names: &[String],
    role: Role,
    days: u32,
) -> Result<(String, String), AuthError> {
    let Some(first) = names.first() else {
        return Err(err(match role {
            Role::Server | Role::Peer => {
                "a server certificate needs the names or addresses clients reach the server by"
            }
            Role::Client => "a client certificate needs a name",
        }));
    };
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(|e| err(format!("the CA key: {e}")))?;
    let issuer = Issuer::from_ca_cert_pem(ca_cert_pem, ca_key)
        .map_err(|e| err(format!("the CA certificate: {e}")))?;
    let key = KeyPair::generate().map_err(|e| err(format!("cannot make a key: {e}")))?;
    let mut p = match role {
        Role::Server | Role::Peer => CertificateParams::new(names.to_vec())
            .map_err(|e| err(format!("names {names:?}: {e}")))?,
        // A client is known by its common name alone: it is connected to, not connected to.
        Role::Client => {
            if names.len() > 1 {
                return Err(err(format!(
                    "a client certificate has one name, not {names:?}"
                )));
            }
            CertificateParams::new(Vec::<String>::new())
                .map_err(|e| err(format!("client parameters: {e}")))?
        }
    };
    p.distinguished_name.push(DnType::CommonName, first);
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = match role {
        Role::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
        Role::Peer => vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        Role::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
    };
    validity(&mut p, days);
    let cert = p
        .signed_by(&key, &issuer)
        .map_err(|e| err(format!("cannot sign the certificate: {e}")))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Makes a CA in `dir` ([`CA_CERT`] 0644, [`CA_KEY`] 0600); never overwrites.
pub fn create_ca(dir: &Path, name: &str, days: u32) -> Result<(PathBuf, PathBuf), AuthError> {
    let (cert, key) = make_ca(name, days)?;
    let (cp, kp) = (dir.join(CA_CERT), dir.join(CA_KEY));
    if cp.exists() {
        return Err(err(format!("{} exists: not overwritten", cp.display())));
    }
    write_new(&kp, &key, 0o600)?;
    write_new(&cp, &cert, 0o644)?;
    Ok((cp, kp))
}

/// Makes a server certificate for `names` signed by the CA at `ca_cert` / `ca_key`, written to
/// `cert_out` (0644) and `key_out` (0600); never overwrites.
pub fn create_server(
    ca_cert: &Path,
    ca_key: &Path,
    names: &[String],
    days: u32,
    cert_out: &Path,
    key_out: &Path,
) -> Result<(), AuthError> {
    create_signed(
        ca_cert,
        ca_key,
        names,
        Role::Server,
        days,
        cert_out,
        key_out,
    )
}

/// Makes a certificate for `role` and `names` ([`make_signed`]) signed by the CA at
/// `ca_cert` / `ca_key`, written to `cert_out` (0644) and `key_out` (0600); never overwrites.
pub fn create_signed(
    ca_cert: &Path,
    ca_key: &Path,
    names: &[String],
    role: Role,
    days: u32,
    cert_out: &Path,
    key_out: &Path,
) -> Result<(), AuthError> {
    let (cert, key) = make_signed(
        &read(ca_cert, "CA certificate")?,
        &read(ca_key, "CA key")?,
        names,
        role,
        days,
    )?;
    if cert_out.exists() {
        return Err(err(format!(
            "{} exists: not overwritten",
            cert_out.display()
        )));
    }
    write_new(key_out, &key, 0o600)?;
    write_new(cert_out, &cert, 0o644)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_certificate_is_signed_by_the_ca_and_names_its_host() {
        let (ca, ca_key) = make_ca("test CA", 1).unwrap();
        let (cert, key) = make_server(&ca, &ca_key, &["bb1".into(), "10.0.0.1".into()], 1).unwrap();
        assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(key.contains("PRIVATE KEY"));
        assert!(make_server(&ca, &ca_key, &[], 1).is_err());
    }

    #[test]
    fn a_client_certificate_has_one_name_and_a_peer_certificate_its_hosts() {
        let (ca, ca_key) = make_ca("test CA", 1).unwrap();
        let one = ["surge-manager".to_string()];
        let (cert, _) = make_signed(&ca, &ca_key, &one, Role::Client, 1).unwrap();
        assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"));
        let two = ["a".to_string(), "b".to_string()];
        assert!(make_signed(&ca, &ca_key, &two, Role::Client, 1).is_err());
        assert!(make_signed(&ca, &ca_key, &[], Role::Client, 1).is_err());
        assert!(make_signed(&ca, &ca_key, &two, Role::Peer, 1).is_ok());
        assert!(make_signed(&ca, &ca_key, &[], Role::Peer, 1).is_err());
    }

    #[test]
    fn files_are_never_overwritten_and_keys_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let (c, k) = create_ca(d.path(), "t", 1).unwrap();
        assert_eq!(
            std::fs::metadata(&k).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(create_ca(d.path(), "t", 1).is_err());
        let (sc, sk) = (d.path().join("s.crt"), d.path().join("s.key"));
        create_server(&c, &k, &["127.0.0.1".into()], 1, &sc, &sk).unwrap();
        assert!(create_server(&c, &k, &["127.0.0.1".into()], 1, &sc, &sk).is_err());
    }
}
