//! A real etcd cluster for tests of the manager's etcd engine: three members of Debian's
//! `etcd-server` on loopback, each with its own data directory and free ports, killed when
//! dropped; in clear, or TLS only with client certificates ([`Etcd::start_tls`]). `make
//! setup` installs etcd; a test that needs it fails when it is missing.

use crate::{wait_for, ChildGuard, Scratch};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Three etcd members on loopback.
pub struct Etcd {
    pub members: Vec<Member>,
    /// The certificates of a cluster started by [`Etcd::start_tls`].
    pub tls: Option<EtcdPki>,
    _dir: Scratch,
}

/// A TLS cluster's certificates, all made by Surge's own `surge_auth::cert`: a CA (its key
/// kept, so a test can sign a client certificate with `surge cert client`), one certificate
/// for every member (serverAuth and clientAuth: clients, peers and each member's gateway),
/// and a client certificate for `etcdctl`.
pub struct EtcdPki {
    pub ca: PathBuf,
    pub ca_key: PathBuf,
    pub member_cert: PathBuf,
    pub member_key: PathBuf,
    pub ctl_cert: PathBuf,
    pub ctl_key: PathBuf,
}

impl EtcdPki {
    fn make(dir: &Path) -> EtcdPki {
        use surge_auth::cert;
        let d = dir.join("pki");
        let (ca, ca_key) = cert::create_ca(&d, "etcd test CA", 2).expect("etcd test CA");
        let names = ["127.0.0.1".to_string(), "localhost".to_string()];
        let (member_cert, member_key) = (d.join("member.crt"), d.join("member.key"));
        cert::create_signed(
            &ca,
            &ca_key,
            &names,
            cert::Role::Peer,
            2,
            &member_cert,
            &member_key,
        )
        .expect("etcd member certificate");
        let (ctl_cert, ctl_key) = (d.join("etcdctl.crt"), d.join("etcdctl.key"));
        cert::create_signed(
            &ca,
            &ca_key,
            &["etcdctl".to_string()],
            cert::Role::Client,
            2,
            &ctl_cert,
            &ctl_key,
        )
        .expect("etcdctl certificate");
        EtcdPki {
            ca,
            ca_key,
            member_cert,
            member_key,
            ctl_cert,
            ctl_key,
        }
    }

    /// etcd's flags for TLS with client certificates on both its client and peer ports.
    fn member_flags(&self) -> Vec<String> {
        let (ca, cert, key) = (
            self.ca.display().to_string(),
            self.member_cert.display().to_string(),
            self.member_key.display().to_string(),
        );
        [
            "--cert-file",
            &cert,
            "--key-file",
            &key,
            "--trusted-ca-file",
            &ca,
            "--client-cert-auth",
            "--peer-cert-file",
            &cert,
            "--peer-key-file",
            &key,
            "--peer-trusted-ca-file",
            &ca,
            "--peer-client-cert-auth",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }
}

pub struct Member {
    pub name: String,
    pub client: String,
    pub child: Option<ChildGuard>,
    cmd: Vec<String>,
}

/// A TCP port nobody listens on now (bound and released: good enough on a test machine).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Etcd {
    /// Starts three members and waits until the cluster answers.
    pub fn start(tag: &str) -> Etcd {
        Etcd::start_with(tag, false)
    }

    /// Three members speaking only TLS (https:// on client and peer ports), each asking
    /// every client and peer for a certificate signed by the cluster's CA ([`EtcdPki`]).
    pub fn start_tls(tag: &str) -> Etcd {
        Etcd::start_with(tag, true)
    }

    fn start_with(tag: &str, tls: bool) -> Etcd {
        assert!(
            Command::new("etcd").arg("--version").output().is_ok(),
            "etcd is not installed (make setup installs Debian's etcd-server)"
        );
        let dir = Scratch::new(&format!("etcd-{tag}"));
        let pki = tls.then(|| EtcdPki::make(dir.path()));
        let scheme = if tls { "https" } else { "http" };
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}={scheme}://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let name = format!("m{i}");
            let client = format!("{scheme}://127.0.0.1:{client}");
            let peer = format!("{scheme}://127.0.0.1:{peer}");
            let mut cmd: Vec<String> = [
                "--name",
                &name,
                "--data-dir",
                &dir.path().join(&name).display().to_string(),
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
                "--initial-cluster",
                &cluster,
                "--initial-cluster-state",
                "new",
                "--log-level",
                "warn",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            if let Some(p) = &pki {
                cmd.extend(p.member_flags());
            }
            let mut m = Member {
                name,
                client,
                child: None,
                cmd,
            };
            m.start(&dir);
            members.push(m);
        }
        let e = Etcd {
            members,
            tls: pki,
            _dir: dir,
        };
        e.wait_healthy();
        e
    }

    /// The client URLs, comma-separated (what `surge manager --etcd` takes).
    pub fn endpoints(&self) -> String {
        self.members
            .iter()
            .map(|m| m.client.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `etcdctl ARGS` against the cluster (with the CA and etcdctl's client certificate on
    /// a TLS cluster).
    pub fn ctl(&self, args: &[&str]) -> std::process::Output {
        let mut c = Command::new("etcdctl");
        if let Some(p) = &self.tls {
            c.arg("--cacert")
                .arg(&p.ca)
                .arg("--cert")
                .arg(&p.ctl_cert)
                .arg("--key")
                .arg(&p.ctl_key);
        }
        self.ctl_as(c, args)
    }

    /// `etcdctl` as `c` says (its own TLS flags, or none) with `args` against the cluster.
    pub fn ctl_as(&self, mut c: Command, args: &[&str]) -> std::process::Output {
        c.env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(self.endpoints())
            .args(args)
            .output()
            .expect("run etcdctl")
    }

    fn wait_healthy(&self) {
        wait_for("etcd to elect a leader", Duration::from_secs(30), || {
            let o = self.ctl(&["endpoint", "health"]);
            o.status.success().then_some(())
        });
    }
}

impl Member {
    fn start(&mut self, dir: &Scratch) {
        let log =
            std::fs::File::create(dir.path().join(format!("{}.log", self.name))).expect("etcd log");
        let child = Command::new("etcd")
            .args(&self.cmd)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        self.child = Some(ChildGuard(child));
    }
}
