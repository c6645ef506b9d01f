//! Nothing readable crosses the network (docs/SECURITY.md, "On the wire"): TLS 1.3 between
//! clients and servers, capabilities bound to the connection they are presented on, and
//! revoked when their instance is destroyed. Each attack comes with the victim's own
//! operation as its control. No root or FUSE needed: the clients are `surge stage copy` and
//! this test's own TLS connections.
//!
//! A `surge server` with a certificate of the test's CA listens on loopback and advertises the
//! address of a recording TCP proxy in front of it, so every byte a client exchanges with it
//! passes through the proxy ("the wire").

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;
use surge_proto::codec;
use surge_proto::tls::{ClientTls, Mode};
use surge_proto::{Request, Response};
use surge_testkit::wire::{contains, Proxy};
use surge_testkit::{surge_command, wait_for, Scratch};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_surge"))
}

/// Runs `surge ARGS` with `env`; its stdout, or a panic with its stderr.
fn surge(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = surge_command(bin())
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run surge");
    assert!(
        out.status.success(),
        "surge {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `surge ARGS` expected to fail: its stderr.
fn surge_fails(args: &[&str], env: &[(&str, &str)]) -> String {
    let out = surge_command(bin())
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run surge");
    assert!(!out.status.success(), "surge {args:?} should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A free loopback port.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The test's PKI: a site CA, a server certificate for 127.0.0.1, and another CA.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn make(scratch: &Scratch) -> Pki {
        let dir = scratch.path().join("tls");
        let d = dir.to_str().unwrap();
        surge(&["cert", "ca", "--dir", d], &[]);
        surge(
            &[
                "cert",
                "server",
                "127.0.0.1",
                "--ca-cert",
                &format!("{d}/ca.crt"),
                "--out",
                d,
            ],
            &[],
        );
        surge(&["cert", "ca", "--dir", &format!("{d}/other")], &[]);
        Pki { dir }
    }
    fn ca(&self) -> String {
        self.dir.join("ca.crt").display().to_string()
    }
    fn other_ca(&self) -> String {
        self.dir.join("other/ca.crt").display().to_string()
    }
}

/// A `surge server` with the test's certificate in mode `tls`, behind a recording proxy whose
/// address it advertises; no Unix socket (every client goes through the proxy).
struct TlsServer {
    child: Child,
    proxy: Proxy,
    /// The server's own listening address (behind the proxy).
    direct: String,
}

impl TlsServer {
    fn start(scratch: &Scratch, pki: &Pki, tls: &str) -> TlsServer {
        let direct = format!("127.0.0.1:{}", free_port());
        let proxy = Proxy::start(direct.clone());
        let dev = scratch.path().join("bb");
        let ready = scratch.path().join("ready.json");
        let log = std::fs::File::create(scratch.path().join("server.log")).unwrap();
        let child = surge_command(bin())
            .args(["server", "--device"])
            .arg(&dev)
            .args(["--capacity", "1GiB", "--listen", &direct])
            .args(["--advertise", &proxy.addr, "--tls", tls])
            .arg("--tls-cert")
            .arg(pki.dir.join("server.crt"))
            .arg("--ready-file")
            .arg(&ready)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start surge server");
        wait_for("server ready", Duration::from_secs(20), || {
            ready.exists().then_some(())
        });
        TlsServer {
            child,
            proxy,
            direct,
        }
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Makes an instance on `server` (through the proxy) and returns its id and generation.
fn make_instance(addr: &str, env: &[(&str, &str)]) -> (u64, u64) {
    let out = surge(
        &[
            "instance",
            "create",
            "--servers",
            addr,
            "--capacity",
            "256MiB",
            "--json",
        ],
        env,
    );
    let v: serde_json::Value = serde_json::from_str(&out).expect("descriptor JSON");
    (
        v["instance"].as_u64().expect("instance id"),
        v["generation"].as_u64().unwrap_or(0),
    )
}

/// The content of the victim's file: a marker that cannot appear by chance.
fn secret() -> Vec<u8> {
    b"VICTIM-SECRET-CONTENT-0600 "
        .iter()
        .copied()
        .cycle()
        .take(300_000)
        .collect()
}

/// Copies the secret into instance `id` through `addr` and back out; the copy is compared.
fn victim_round_trip(scratch: &Scratch, addr: &str, id: u64, env: &[(&str, &str)], tag: &str) {
    let src = scratch.path().join(format!("secret-{tag}.txt"));
    std::fs::write(&src, secret()).unwrap();
    let id = id.to_string();
    let base = ["stage", "copy", "--server", addr, "--instance", &id];
    let mut a = base.to_vec();
    let dst = format!("/secret-{tag}.txt");
    let s = src.to_str().unwrap();
    a.extend(["--in", s, &dst]);
    surge(&a, env);
    let back = scratch.path().join(format!("back-{tag}.txt"));
    let mut a = base.to_vec();
    let b = back.to_str().unwrap();
    a.extend(["--out", &dst, b]);
    surge(&a, env);
    assert_eq!(std::fs::read(&back).unwrap(), secret(), "the victim's copy");
}

#[test]
fn the_wire_between_a_client_and_a_server_shows_no_content_and_no_capability() {
    let scratch = Scratch::new("wire-tls");
    let pki = Pki::make(&scratch);
    let srv = TlsServer::start(&scratch, &pki, "auto");
    let ca = pki.ca();
    let on = [("SURGE_TLS", "on"), ("SURGE_TLS_CA", ca.as_str())];
    let (id, _) = make_instance(&srv.proxy.addr, &on);

    // Control: the same copy in clear text (a loopback peer may choose it in mode auto) is
    // visible on the wire, content and capability claims alike: the capture works.
    srv.proxy.take();
    let off = [("SURGE_TLS", "off")];
    victim_round_trip(&scratch, &srv.proxy.addr, id, &off, "clear");
    let clear = srv.proxy.take();
    assert!(contains(&clear, &secret()[..4096]), "clear text is seen");
    assert!(contains(&clear, b"SRG1"), "a capability's claims are seen");

    // Encrypted: the victim's copy works, and the wire holds none of it.
    victim_round_trip(&scratch, &srv.proxy.addr, id, &on, "tls");
    let wire = srv.proxy.take();
    assert!(
        wire.len() > 2 * secret().len(),
        "the copy crossed the proxy"
    );
    assert_eq!(wire[0], surge_proto::tls::HANDSHAKE_BYTE, "a TLS handshake");
    assert!(
        !contains(&wire, b"VICTIM-SECRET"),
        "file content on the wire"
    );
    assert!(!contains(&wire, b"SRG1"), "a capability on the wire");
    assert!(!contains(&wire, b"SRGE"), "a clear frame on the wire");
    eprintln!(
        "captured {} bytes in TLS, {} in clear; no content, no capability",
        wire.len(),
        clear.len()
    );
}

/// A TLS connection to `addr` verified with the CA in `ca`, in a runtime of its own.
fn tls_connect(
    rt: &tokio::runtime::Runtime,
    addr: &str,
    ca: &str,
) -> std::io::Result<surge_proto::transport::Connected> {
    let tls = ClientTls::from_ca_file(Path::new(ca), Mode::On).expect("CA loads");
    rt.block_on(surge_proto::transport::connect_tcp(addr, Some(&tls)))
}

/// Sends `req` (id `id`, presentation bytes as the Authenticate token) and reads the reply.
fn call(
    rt: &tokio::runtime::Runtime,
    c: &mut surge_proto::transport::Connected,
    id: u64,
    req: &Request,
) -> Response {
    rt.block_on(async {
        codec::write_request(&mut c.write, id, 0, req, &[])
            .await
            .expect("send");
        codec::read_response(&mut c.read)
            .await
            .expect("a reply")
            .response
    })
}

fn denied(r: Response) -> String {
    match r {
        Response::Error(e) if e.code == surge_proto::ErrorCode::Denied => e.message,
        other => panic!("expected Denied, got {other:?}"),
    }
}

#[test]
fn a_presented_capability_replayed_on_another_connection_reads_nothing() {
    let scratch = Scratch::new("wire-replay");
    let pki = Pki::make(&scratch);
    let srv = TlsServer::start(&scratch, &pki, "on");
    let ca = pki.ca();
    let on = [("SURGE_TLS", "on"), ("SURGE_TLS_CA", ca.as_str())];
    let (id, _) = make_instance(&srv.proxy.addr, &on);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let token = surge_testkit::instance_token(id);
    let describe = Request::Describe {
        instance: surge_core::InstanceId(id),
    };

    // The victim's connection: its presentation is accepted and it reads.
    let mut a = tls_connect(&rt, &srv.proxy.addr, &ca).expect("TLS");
    let frame = Request::Authenticate {
        token: token.present(&a.binding),
    };
    assert_eq!(call(&rt, &mut a, 1, &frame), Response::Ok);
    assert!(matches!(
        call(&rt, &mut a, 2, &describe),
        Response::Descriptor(_)
    ));

    // The same Authenticate frame, replayed on the attacker's connection: refused, and
    // nothing is read on it.
    let mut b = tls_connect(&rt, &srv.proxy.addr, &ca).expect("TLS");
    let m = denied(call(&rt, &mut b, 1, &frame));
    assert!(m.contains("another connection"), "{m}");
    denied(call(&rt, &mut b, 2, &describe));

    // The capability itself (what a clear-text client of the old protocol sent) is no
    // presentation either.
    let mut c = tls_connect(&rt, &srv.proxy.addr, &ca).expect("TLS");
    let raw = Request::Authenticate {
        token: token.bytes().to_vec(),
    };
    denied(call(&rt, &mut c, 1, &raw));

    // Control: the holder of the capability presents it on a second connection of its own.
    let mut d = tls_connect(&rt, &srv.proxy.addr, &ca).expect("TLS");
    let own = Request::Authenticate {
        token: token.present(&d.binding),
    };
    assert_eq!(call(&rt, &mut d, 1, &own), Response::Ok);

    // A server in mode `on` serves no clear connection at all, even from loopback.
    let mut s = TcpStream::connect(&srv.direct).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let w = codec::frame_prefix(
        describe.opcode(),
        1,
        &codec::encode(&describe).expect("encodes"),
        0,
    );
    s.write_all(&w).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    assert!(
        contains(&got, b"accepts only TLS"),
        "clear connection answered {:?}",
        String::from_utf8_lossy(&got)
    );
}

#[test]
fn a_destroyed_instance_s_capability_no_longer_authenticates() {
    let scratch = Scratch::new("wire-revoke");
    let pki = Pki::make(&scratch);
    let srv = TlsServer::start(&scratch, &pki, "on");
    let ca = pki.ca();
    let on = [("SURGE_TLS", "on"), ("SURGE_TLS_CA", ca.as_str())];
    let (id, generation) = make_instance(&srv.proxy.addr, &on);
    assert_ne!(generation, 0, "an instance gets a generation");
    let rt = tokio::runtime::Runtime::new().unwrap();
    // What the manager hands out: a capability bound to the instance's generation.
    let token = surge_auth::Token::mint(
        &surge_testkit::key(),
        &surge_auth::Claims {
            instance: id,
            ns: None,
            caller: surge_auth::Caller::me(),
            rights: surge_auth::Rights::Instance,
            expires: surge_auth::token::now() + 3600,
            generation,
        },
    );
    let describe = Request::Describe {
        instance: surge_core::InstanceId(id),
    };
    let present = |c: &surge_proto::transport::Connected| Request::Authenticate {
        token: token.present(&c.binding),
    };

    // Control: it works while the instance lives, on a connection that stays open.
    let mut open = tls_connect(&rt, &srv.proxy.addr, &ca).expect("TLS");
    let auth = present(&open);
    assert_eq!(call(&rt, &mut open, 1, &auth), Response::Ok);
    assert!(matches!(
        call(&rt, &mut open, 2, &describe),
        Response::Descriptor(_)
    ));

    surge(
        &[
            "instance",
            "destroy",
            "--server",
            &srv.proxy.addr,
            "--instance",
            &id.to_string(),
        ],
        &on,
    );

    // A new connection: refused at Authenticate.
    let mut c = tls_connect(&rt, &srv.proxy.addr, &ca).expect("TLS");
    let auth = present(&c);
    let m = denied(call(&rt, &mut c, 1, &auth));
    assert!(m.contains("revoked"), "{m}");
    // The connection that authenticated before: its next request is refused too.
    let m = denied(call(&rt, &mut open, 3, &describe));
    assert!(m.contains("revoked"), "{m}");

    // An instance made again under the same id is not covered by the old capability.
    surge(
        &[
            "instance",
            "create",
            "--servers",
            &srv.proxy.addr,
            "--capacity",
            "64MiB",
            "--id",
            &id.to_string(),
        ],
        &on,
    );
    let mut c = tls_connect(&rt, &srv.proxy.addr, &ca).expect("TLS");
    let auth = present(&c);
    let m = denied(call(&rt, &mut c, 1, &auth));
    assert!(m.contains("made again"), "{m}");
}

#[test]
fn a_client_refuses_a_server_whose_certificate_the_ca_did_not_sign() {
    let scratch = Scratch::new("wire-ca");
    let pki = Pki::make(&scratch);
    let srv = TlsServer::start(&scratch, &pki, "on");
    let rt = tokio::runtime::Runtime::new().unwrap();

    // Control: with the site's CA the connection is made.
    tls_connect(&rt, &srv.proxy.addr, &pki.ca()).expect("verified with the site CA");

    // With another CA: refused during the handshake, before anything is sent.
    let e = match tls_connect(&rt, &srv.proxy.addr, &pki.other_ca()) {
        Ok(_) => panic!("a server signed by another CA was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("certificate"), "{e}");

    // The command-line client too: nothing is copied.
    let other = pki.other_ca();
    let env = [("SURGE_TLS", "on"), ("SURGE_TLS_CA", other.as_str())];
    let err = surge_fails(
        &[
            "instance",
            "create",
            "--servers",
            &srv.proxy.addr,
            "--capacity",
            "64MiB",
        ],
        &env,
    );
    assert!(err.contains("certificate"), "{err}");
}

/// A `surge manager` with the test's certificate in mode `tls`, on a loopback port behind a
/// recording proxy; its HTTP API on a port of its own.
struct TlsManager {
    child: Child,
    proxy: Proxy,
    http: String,
}

impl TlsManager {
    fn start(scratch: &Scratch, pki: &Pki, tls: &str) -> TlsManager {
        let dir = scratch.path().join(format!("manager-{tls}"));
        std::fs::create_dir_all(&dir).unwrap();
        let direct = format!("127.0.0.1:{}", free_port());
        let http = format!("127.0.0.1:{}", free_port());
        let proxy = Proxy::start(direct.clone());
        let ready = dir.join("ready.json");
        let child = surge_command(bin())
            .args([
                "manager", "--listen", &direct, "--http", &http, "--tls", tls,
            ])
            .args(["--granularity", "64MiB", "--tls-cert"])
            .arg(pki.dir.join("server.crt"))
            .arg("--state")
            .arg(dir.join("m.db"))
            .arg("--ready-file")
            .arg(&ready)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("manager.log")).unwrap())
            .spawn()
            .expect("start surge manager");
        wait_for("manager ready", Duration::from_secs(20), || {
            ready.exists().then_some(())
        });
        TlsManager { child, proxy, http }
    }
}

impl Drop for TlsManager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The manager's gRPC and HTTP (issue 31): the MUNGE credential that says who a caller is,
/// and what the caller asks (here a persistent instance's name), cross the wire encrypted; a
/// client in clear text is refused where TLS is required. Control: the same calls to a
/// manager in clear show both on the wire.
#[test]
fn the_wire_to_the_manager_shows_no_credential_and_no_request() {
    let scratch = Scratch::new("wire-mgr");
    let pki = Pki::make(&scratch);
    let ca = pki.ca();
    let ask = |m: &TlsManager, env: &[(&str, &str)]| {
        surge(&["pool", "ls", "--manager", &m.proxy.addr], env);
        // Refused for want of servers; the request crossed the wire all the same.
        let err = surge_fails(
            &[
                "persistent",
                "create",
                "topsecret-project",
                "--capacity",
                "64MiB",
                "--manager",
                &m.proxy.addr,
            ],
            env,
        );
        assert!(!err.contains("cannot reach"), "{err}");
    };

    let clear = TlsManager::start(&scratch, &pki, "off");
    ask(&clear, &[("SURGE_TLS", "off")]);
    let wire = clear.proxy.take();
    // (The credential travels in an HTTP/2 header, HPACK-coded: not findable as text; the
    // request's message is.)
    assert!(
        contains(&wire, b"topsecret-project"),
        "the capture sees the request"
    );

    let m = TlsManager::start(&scratch, &pki, "on");
    let on = [("SURGE_TLS", "on"), ("SURGE_TLS_CA", ca.as_str())];
    ask(&m, &on);
    let wire = m.proxy.take();
    assert_eq!(
        wire.first(),
        Some(&surge_proto::tls::HANDSHAKE_BYTE),
        "a TLS handshake"
    );
    assert!(!contains(&wire, b"topsecret"), "a request on the wire");

    // A client in clear text is refused; one that trusts another CA refuses the manager.
    let err = surge_fails(
        &["pool", "ls", "--manager", &m.proxy.addr],
        &[("SURGE_TLS", "off")],
    );
    assert!(!err.contains("default"), "a clear client was served: {err}");
    let other = pki.other_ca();
    let err = surge_fails(
        &["pool", "ls", "--manager", &m.proxy.addr],
        &[("SURGE_TLS", "on"), ("SURGE_TLS_CA", other.as_str())],
    );
    assert!(err.contains("over TLS"), "{err}");

    // HTTPS: the read API answers over TLS only.
    let config = ClientTls::from_ca_file(Path::new(&ca), Mode::On)
        .expect("CA loads")
        .config;
    let name = ClientTls::server_name("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(config, name).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, TcpStream::connect(&m.http).unwrap());
    write!(
        tls,
        "GET /v1/pools HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = tls.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 "), "{answer}");
    let mut plain = TcpStream::connect(&m.http).unwrap();
    write!(
        plain,
        "GET /v1/pools HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    let _ = plain.read_to_string(&mut answer);
    assert!(answer.is_empty(), "HTTP in clear was answered: {answer}");
}
