//! Servers on a cluster are registered with an address other hosts can reach: a server
//! listening on a wildcard address must say which (`--advertise`), and the manager refuses to
//! register a wildcard address (clients would connect to their own host).

mod common;
use common::*;
use std::process::Stdio;
use std::time::Duration;

fn servers_json(http: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(http).unwrap();
    write!(s, "GET /v1/servers HTTP/1.0\r\n\r\n").unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    let body = r.split("\r\n\r\n").nth(1).expect("a body");
    serde_json::from_str(body).expect("JSON")
}

#[test]
fn a_wildcard_listener_registers_only_with_an_advertised_address() {
    let dir = Scratch::new("advertise");
    let m = Manager::start(dir.path());

    // Without --advertise: refused before registering, saying what to do.
    let o = surge_command()
        .args(["server", "--device"])
        .arg(dir.path().join("bb0"))
        .args([
            "--capacity",
            "256MiB",
            "--listen",
            "0.0.0.0:0",
            "--manager",
            &m.grpc,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("wildcard") && err.contains("--advertise"),
        "{err}"
    );

    // With it: registered under the advertised address, the wildcard nowhere.
    let ready = dir.path().join("bb1.ready");
    let _server = ChildGuard(
        surge_command()
            .args(["server", "--device"])
            .arg(dir.path().join("bb1"))
            .args(["--capacity", "256MiB", "--listen", "0.0.0.0:0"])
            .args([
                "--advertise",
                "127.0.0.1",
                "--manager",
                &m.grpc,
                "--ready-file",
            ])
            .arg(&ready)
            .stderr(std::fs::File::create(dir.path().join("bb1.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let servers = wait_for("the server registered", Duration::from_secs(20), || {
        let v = servers_json(&m.http);
        (v.as_array()?.len() == 1).then_some(v)
    });
    let addrs: Vec<String> = servers[0]["addrs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    assert!(
        addrs.iter().all(|a| !a.starts_with("0.0.0.0"))
            && addrs.iter().any(|a| a.starts_with("127.0.0.1:")),
        "{addrs:?}"
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&ready).unwrap()).unwrap();
    let port = addrs[0].rsplit_once(':').unwrap().1.to_string();
    assert!(
        r["addrs"]
            .to_string()
            .contains(&format!("127.0.0.1:{port}")),
        "{r}"
    );
    // And it serves there: a job instance on it works.
    surge(&[
        "persistent",
        "create",
        "adv",
        "--capacity",
        "64MiB",
        "--manager",
        &m.grpc,
    ]);

    // By hand: a wildcard address is refused by the manager.
    let o = surge_command()
        .args([
            "server",
            "register",
            &format!("0.0.0.0:{port}"),
            "--manager",
            &m.grpc,
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("wildcard"), "{err}");
}
