//! A real etcd cluster for tests of the manager's etcd engine: three members of Debian's
//! `etcd-server` on loopback, each with its own data directory and free ports, killed when
//! dropped. `make setup` installs etcd; a test that needs it fails when it is missing.

use crate::{wait_for, ChildGuard, Scratch};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Three etcd members on loopback.
pub struct Etcd {
    pub members: Vec<Member>,
    _dir: Scratch,
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
        assert!(
            Command::new("etcd").arg("--version").output().is_ok(),
            "etcd is not installed (make setup installs Debian's etcd-server)"
        );
        let dir = Scratch::new(&format!("etcd-{tag}"));
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let cluster = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let name = format!("m{i}");
            let client = format!("http://127.0.0.1:{client}");
            let peer = format!("http://127.0.0.1:{peer}");
            let cmd: Vec<String> = [
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
            let mut m = Member {
                name,
                client,
                child: None,
                cmd,
            };
            m.start(&dir);
            members.push(m);
        }
        let e = Etcd { members, _dir: dir };
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

    /// `etcdctl ARGS` against the cluster.
    pub fn ctl(&self, args: &[&str]) -> std::process::Output {
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
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
