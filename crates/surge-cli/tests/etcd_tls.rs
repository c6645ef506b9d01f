//! The manager's traffic to its etcd store, encrypted and authenticated (issue 31: nothing
//! readable crosses the network; docs/SECURITY.md, "The manager's etcd"). A real three-member
//! etcd speaking only TLS, with client certificates required on its client and peer ports,
//! every certificate made by Surge (`surge_auth::cert`, `surge cert client`). Each refusal
//! comes with its control: the same operation with the right certificates works.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use surge_testkit::etcd::Etcd;
use surge_testkit::wire::{contains, Proxy};

/// `surge cert client NAME` signed by `ca` (its key beside it), into `out`: the paths of
/// the certificate and key.
fn client_cert(ca: &Path, name: &str, out: &Path) -> (PathBuf, PathBuf) {
    let o = surge_command()
        .args(["cert", "client", name, "--ca-cert"])
        .arg(ca)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run surge cert client");
    assert!(o.status.success(), "{}", text(&o));
    (out.join("client.crt"), out.join("client.key"))
}

/// The options of a manager on `endpoints` with the CA `ca` and the client certificate
/// `cert` (its key beside it as client.key).
fn etcd_args(endpoints: &str, ca: &Path, cert: Option<&Path>) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "--etcd".into(),
        endpoints.into(),
        "--etcd-prefix".into(),
        "/surge-test/".into(),
        "--etcd-ca".into(),
        ca.display().to_string(),
    ];
    if let Some(c) = cert {
        a.extend(["--etcd-cert".into(), c.display().to_string()]);
        a.extend([
            "--etcd-key".into(),
            c.with_file_name("client.key").display().to_string(),
        ]);
    }
    a
}

/// A manager with `args` in `dir` (no certificate directory of the host's: `SURGE_TLS_DIR`
/// is `dir`), waited for.
fn manager(dir: &Path, args: &[String]) -> Manager {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let tls_dir = dir.display().to_string();
    Manager::start_env(dir, &a, &[("SURGE_TLS_DIR", &tls_dir)])
}

/// A manager with `args` that must stop by itself (refused): its log.
fn refused(dir: &Path, args: &[String]) -> String {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let tls_dir = dir.display().to_string();
    let mut child = Manager::spawn(dir, &a, &[("SURGE_TLS_DIR", &tls_dir)]);
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.0.try_wait().expect("wait for the manager") {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "the manager still runs after {:?} (a hang, not a refusal): {}",
            start.elapsed(),
            std::fs::read_to_string(dir.join("manager.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!status.success(), "the manager should have been refused");
    assert!(!dir.join("m.ready").exists(), "a refused manager served");
    std::fs::read_to_string(dir.join("manager.log")).expect("manager log")
}

/// A one-server pool for persistent instances, registered with manager `m`.
fn pool(m: &str) -> Cluster {
    let c = cluster(1, "1GiB");
    surge(&["server", "register", &c.servers[0].addr, "--manager", m]);
    c
}

fn persistent(m: &str, name: &str) {
    surge(&[
        "persistent",
        "create",
        name,
        "--capacity",
        "64MiB",
        "--manager",
        m,
    ]);
}

fn persistent_names(m: &str) -> Vec<String> {
    let v: serde_json::Value =
        serde_json::from_str(&surge(&["persistent", "ls", "--json", "--manager", m])).unwrap();
    v.as_array()
        .expect("a list")
        .iter()
        .filter_map(|i| i["name"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn a_manager_with_the_ca_and_its_client_certificate_keeps_its_state_in_a_tls_etcd() {
    let etcd = Etcd::start_tls("tls-state");
    let pki = etcd.tls.as_ref().expect("a TLS cluster");
    let dir = Scratch::new("etcd-tls-state");
    let (cert, _) = client_cert(&pki.ca, "surge-manager", &dir.path().join("client"));
    let args = etcd_args(&etcd.endpoints(), &pki.ca, Some(&cert));
    assert!(etcd.endpoints().starts_with("https://"));
    let m = manager(dir.path(), &args);
    let _c = pool(&m.grpc);
    persistent(&m.grpc, "tlskept");
    assert_eq!(persistent_names(&m.grpc), ["tlskept"]);
    // It is in etcd (read with etcdctl's own certificate), not somewhere else.
    let o = etcd.ctl(&["get", "--prefix", "/surge-test/persistent/", "--keys-only"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("tlskept"),
        "{}",
        text(&o)
    );

    // A new manager on the same cluster finds it.
    drop(m);
    let m = manager(dir.path(), &args);
    assert_eq!(persistent_names(&m.grpc), ["tlskept"]);
}

#[test]
fn a_tls_etcd_refuses_managers_and_etcdctl_without_the_right_certificates_and_says_why() {
    let etcd = Etcd::start_tls("tls-refuse");
    let pki = etcd.tls.as_ref().expect("a TLS cluster");
    let eps = etcd.endpoints();
    let first = eps.split(',').next().unwrap().to_string();
    let dir = Scratch::new("etcd-tls-refuse");
    let (cert, _) = client_cert(&pki.ca, "surge-manager", &dir.path().join("client"));
    // Another site's CA, and a client certificate it signed.
    let other = dir.path().join("other");
    let o = surge_command()
        .args(["cert", "ca", "--dir"])
        .arg(&other)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let other_ca = other.join("ca.crt");
    let (other_cert, _) = client_cert(&other_ca, "intruder", &other.join("client"));

    let case = |tag: &str, args: Vec<String>, why: &[&str]| {
        let d = dir.path().join(tag);
        std::fs::create_dir_all(&d).unwrap();
        let log = refused(&d, &args);
        assert!(
            log.contains(&first),
            "{tag}: the member is not named: {log}"
        );
        assert!(
            why.iter().any(|w| log.contains(w)),
            "{tag}: no {why:?} in: {log}"
        );
        eprintln!("{tag}: {}", log.lines().last().unwrap_or(""));
    };
    // The members' certificates are not signed by the CA the manager trusts.
    case(
        "other-ca",
        etcd_args(&eps, &other_ca, Some(&cert)),
        &["UnknownIssuer"],
    );
    // No client certificate: the members ask for one.
    case(
        "no-cert",
        etcd_args(&eps, &pki.ca, None),
        &["BadCertificate", "without a certificate: --etcd-cert"],
    );
    // A client certificate another CA signed.
    case(
        "other-cert",
        etcd_args(&eps, &pki.ca, Some(&other_cert)),
        &[
            "BadCertificate",
            "is --etcd-cert signed by the CA the members trust",
        ],
    );
    // No CA at all: named before anything is sent.
    let d = dir.path().join("no-ca");
    std::fs::create_dir_all(&d).unwrap();
    let log = refused(
        &d,
        &[
            "--etcd".to_string(),
            eps.clone(),
            "--etcd-prefix".into(),
            "/surge-test/".into(),
        ],
    );
    assert!(
        log.contains("etcd CA certificate") && log.contains("ca.crt"),
        "{log}"
    );

    // etcdctl: without a client certificate, and in clear, refused; with one, served.
    let bare = |args: &[&str]| -> Output {
        let mut c = Command::new("etcdctl");
        c.args(["--dial-timeout", "3s", "--command-timeout", "5s"])
            .args(args);
        etcd.ctl_as(c, &["put", "/surge-test/probe", "x"])
    };
    let ca = pki.ca.display().to_string();
    let o = bare(&["--cacert", &ca]);
    assert!(
        !o.status.success(),
        "etcdctl without a certificate was served: {}",
        text(&o)
    );
    let clear: Vec<String> = eps
        .split(',')
        .map(|e| e.replacen("https", "http", 1))
        .collect();
    let o = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([
            "--dial-timeout",
            "3s",
            "--command-timeout",
            "5s",
            "--endpoints",
        ])
        .arg(clear.join(","))
        .args(["put", "/surge-test/probe", "x"])
        .output()
        .unwrap();
    assert!(
        !o.status.success(),
        "etcdctl in clear was served: {}",
        text(&o)
    );
    let o = etcd.ctl(&["put", "/surge-test/probe", "x"]);
    assert!(o.status.success(), "{}", text(&o));

    // And the manager with the right CA and certificate is served (the control).
    let right = dir.path().join("right");
    std::fs::create_dir_all(&right).unwrap();
    let m = manager(&right, &etcd_args(&eps, &pki.ca, Some(&cert)));
    let _c = pool(&m.grpc);
}

/// What the wire between a manager and its only etcd member shows while it makes a
/// persistent instance named `name`: the manager reaches the member through a recording
/// proxy.
fn wire_of(etcd: &Etcd, dir: &Path, args_for: impl Fn(&str) -> Vec<String>, name: &str) -> Vec<u8> {
    let member = etcd.members[0].client.clone();
    let (scheme, hostport) = member.split_once("://").unwrap();
    let proxy = Proxy::start(hostport.to_string());
    let m = manager(dir, &args_for(&format!("{scheme}://{}", proxy.addr)));
    let _c = pool(&m.grpc);
    persistent(&m.grpc, name);
    assert_eq!(persistent_names(&m.grpc), [name]);
    drop(m);
    proxy.take()
}

#[test]
fn the_wire_between_the_manager_and_a_tls_etcd_shows_no_instance_name() {
    let name = "wiretapped_pers";
    // Control: in clear, the name is on the wire (so the capture would see it).
    let clear = Etcd::start("tls-wire-clear");
    let d = Scratch::new("etcd-wire-clear");
    let wire = wire_of(
        &clear,
        d.path(),
        |e| {
            ["--etcd", e, "--etcd-prefix", "/surge-test/"]
                .iter()
                .map(|s| s.to_string())
                .collect()
        },
        name,
    );
    assert!(
        contains(&wire, name.as_bytes()),
        "the clear wire does not show the name"
    );
    drop(clear);

    let etcd = Etcd::start_tls("tls-wire");
    let pki = etcd.tls.as_ref().expect("a TLS cluster");
    let d = Scratch::new("etcd-wire-tls");
    let (cert, _) = client_cert(&pki.ca, "surge-manager", &d.path().join("client"));
    let ca = pki.ca.clone();
    let wire = wire_of(&etcd, d.path(), |e| etcd_args(e, &ca, Some(&cert)), name);
    assert!(
        wire.len() > 10_000,
        "only {} bytes crossed the proxy",
        wire.len()
    );
    assert!(
        !contains(&wire, name.as_bytes()),
        "the name crossed the wire in clear"
    );
    assert!(
        !contains(&wire, b"/surge-test/"),
        "a key crossed the wire in clear"
    );
    // TLS records from the first byte: a handshake (0x16), TLS 1.x.
    assert_eq!(&wire[..2], &[0x16, 0x03], "not a TLS handshake");
    // The instance really is in etcd.
    let o = etcd.ctl(&["get", "--prefix", "/surge-test/persistent/", "--keys-only"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(name),
        "{}",
        text(&o)
    );
}
