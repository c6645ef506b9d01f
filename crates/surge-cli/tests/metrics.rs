//! Prometheus metrics (issue 19): a real manager and real servers are scraped over HTTP, the
//! text is parsed with the Prometheus project's own OpenMetrics parser (the Python client's
//! `prometheus_client.openmetrics.parser`), and the values are checked against what the
//! components hold, before and after real work moves them. The Grafana dashboard in `contrib/`
//! may only name metrics that the components export.

mod common;
use common::*;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const PARSER: &str = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
families, samples = [], []
for fam in text_string_to_metric_families(sys.stdin.read()):
    families.append({"name": fam.name, "type": fam.type})
    for s in fam.samples:
        samples.append({"name": s.name, "labels": s.labels, "value": s.value})
print(json.dumps({"families": families, "samples": samples}))
"#;

/// Why the parser cannot run here, if it cannot.
fn parser_missing() -> Option<String> {
    let ok = Command::new("python3")
        .args(["-c", "import prometheus_client.openmetrics.parser"])
        .output()
        .is_ok_and(|o| o.status.success());
    (!ok).then(|| {
        "python3 with prometheus_client is not installed (scripts/setup.sh installs it)".into()
    })
}

/// One sample: its name, labels and value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

struct Scrape {
    samples: Vec<Sample>,
    /// (family name, type): a family is exported even before it has a sample.
    families: Vec<(String, String)>,
}

impl Scrape {
    /// `GET http://addr/metrics`, checked and parsed.
    fn of(addr: &str) -> Scrape {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let (head, body) = resp.split_once("\r\n\r\n").expect("an HTTP response");
        assert!(
            head.starts_with("HTTP/1.") && head.contains(" 200"),
            "{head}"
        );
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/openmetrics-text"),
            "{head}"
        );
        let mut p = Command::new("python3")
            .args(["-c", PARSER])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        p.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
        let out = p.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "the OpenMetrics parser refused the text of {addr}: {}\n{body}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        Scrape {
            samples: v["samples"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| Sample {
                    name: s["name"].as_str().unwrap().to_string(),
                    labels: serde_json::from_value(s["labels"].clone()).unwrap(),
                    value: s["value"].as_f64().unwrap(),
                })
                .collect(),
            families: v["families"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| {
                    (
                        f["name"].as_str().unwrap().to_string(),
                        f["type"].as_str().unwrap().to_string(),
                    )
                })
                .collect(),
        }
    }

    /// The samples named `name` whose labels include `labels`.
    fn all(&self, name: &str, labels: &[(&str, &str)]) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect()
    }

    /// The sum of those samples (0 if there are none).
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.all(name, labels).iter().map(|s| s.value).sum()
    }

    /// The one sample's value.
    fn one(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let v = self.all(name, labels);
        assert_eq!(v.len(), 1, "one {name} {labels:?}: {v:?}");
        v[0].value
    }
}

/// A manager (with its HTTP API) and servers with `--metrics`, registered with it.
struct Deployment {
    dir: Scratch,
    manager: String,
    manager_http: String,
    servers: Vec<(String, String)>,
    _children: Vec<ChildGuard>,
}

fn ready(file: &Path) -> serde_json::Value {
    wait_for("ready file", Duration::from_secs(20), || {
        serde_json::from_str(&std::fs::read_to_string(file).ok()?).ok()
    })
}

impl Deployment {
    fn start(servers: usize) -> Deployment {
        let dir = Scratch::new("metrics");
        let mut children = Vec::new();
        let log = |n: &str| std::fs::File::create(dir.path().join(n)).unwrap();
        let mgr = Manager::start(dir.path());
        children.push(mgr.child);
        let (manager, manager_http) = (mgr.grpc, mgr.http);
        let mut addrs = Vec::new();
        for i in 0..servers {
            let r = dir.path().join(format!("s{i}.ready"));
            children.push(ChildGuard(
                surge_command()
                    .arg("server")
                    .arg("--device")
                    .arg(dir.path().join(format!("bb{i}")))
                    .args(["--capacity", "1GiB", "--listen", "127.0.0.1:0"])
                    .args(["--metrics", "127.0.0.1:0", "--manager", &manager])
                    .arg("--ready-file")
                    .arg(&r)
                    .stderr(log(&format!("server-{i}.log")))
                    .spawn()
                    .unwrap(),
            ));
            let v = ready(&r);
            addrs.push((
                v["addrs"][0].as_str().unwrap().to_string(),
                v["metrics"]
                    .as_str()
                    .expect("the ready file names the metrics address")
                    .to_string(),
            ));
        }
        Deployment {
            dir,
            manager,
            manager_http,
            servers: addrs,
            _children: children,
        }
    }

    fn scrape_servers(&self) -> Vec<Scrape> {
        self.servers.iter().map(|(_, m)| Scrape::of(m)).collect()
    }
}

fn sum_over(scrapes: &[Scrape], name: &str, labels: &[(&str, &str)]) -> f64 {
    scrapes.iter().map(|s| s.sum(name, labels)).sum()
}

#[test]
fn manager_and_servers_export_metrics_that_move_with_the_work() {
    if let Some(why) = parser_missing() {
        if skip_without(
            "manager_and_servers_export_metrics_that_move_with_the_work",
            &why,
        ) {
            return;
        }
    }
    let d = Deployment::start(2);
    // Both servers registered and seen up.
    let before = wait_for("two servers up", Duration::from_secs(20), || {
        let m = Scrape::of(&d.manager_http);
        (m.sum("surge_pool_servers_up", &[("pool", "default")]) == 2.0).then_some(m)
    });
    assert_eq!(
        before.one("surge_pool_capacity_bytes", &[("pool", "default")]),
        2.0 * 1024.0 * 1024.0 * 1024.0
    );
    assert_eq!(before.all("surge_server_up", &[]).len(), 2);
    let s0 = d.scrape_servers();
    for s in &s0 {
        assert_eq!(s.one("surge_server_capacity_bytes", &[]), 1073741824.0);
        assert_eq!(s.one("surge_server_used_bytes", &[]), 0.0);
    }

    // Work: a persistent instance, and 6 MiB written into it by the native client.
    let out = surge(&[
        "persistent",
        "create",
        "metrics",
        "--capacity",
        "128MiB",
        "--json",
        "--manager",
        &d.manager,
    ]);
    let inst: serde_json::Value = serde_json::from_str(&out).unwrap();
    let id = inst["id"].as_u64().unwrap().to_string();
    let data = d.dir.path().join("in.dat");
    let mut bytes = vec![0u8; 6 << 20];
    Rng(7).fill(&mut bytes);
    std::fs::write(&data, &bytes).unwrap();
    surge(&[
        "stage",
        "copy",
        "--server",
        &d.servers[0].0,
        "--instance",
        &id,
        "--in",
        data.to_str().unwrap(),
        "/in.dat",
    ]);

    let s1 = d.scrape_servers();
    let writes = sum_over(&s1, "surge_server_requests_total", &[("op", "Write")]);
    assert!(writes >= 1.0, "Write requests counted: {writes}");
    let received = sum_over(&s1, "surge_server_received_bytes_total", &[("op", "Write")]);
    assert!(
        received >= (6 << 20) as f64,
        "written bytes counted: {received}"
    );
    let timed = sum_over(
        &s1,
        "surge_server_request_duration_seconds_count",
        &[("op", "Write")],
    );
    assert_eq!(timed, writes, "every Write is in the latency histogram");
    let used: f64 = s1
        .iter()
        .map(|s| s.one("surge_server_used_bytes", &[]))
        .sum();
    assert!(
        used >= (6 << 20) as f64,
        "the servers hold the bytes: {used}"
    );
    let frag_used = sum_over(
        &s1,
        "surge_server_fragment_used_bytes",
        &[("instance_id", &id)],
    );
    assert_eq!(frag_used, used, "per-fragment use adds up");
    assert!(
        sum_over(&s1, "surge_server_connections_accepted_total", &[]) >= 2.0,
        "connections counted"
    );
    // A request that fails is counted as an error (an instance that does not exist).
    let errors_before = sum_over(&s1, "surge_server_request_errors_total", &[]);
    let bad = surge_command()
        .args([
            "instance",
            "show",
            "--server",
            &d.servers[0].0,
            "--instance",
            "1",
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let errors_after = sum_over(
        &d.scrape_servers(),
        "surge_server_request_errors_total",
        &[],
    );
    assert!(
        errors_after > errors_before,
        "{errors_before} -> {errors_after}"
    );

    // The manager sees the instance and, after its next liveness check, its use.
    let after = wait_for("instance use reported", Duration::from_secs(20), || {
        let m = Scrape::of(&d.manager_http);
        (m.sum("surge_instance_used_bytes", &[("name", "metrics")]) >= (6 << 20) as f64)
            .then_some(m)
    });
    assert_eq!(
        after.one(
            "surge_instance_capacity_bytes",
            &[("instance_id", &id), ("kind", "persistent")]
        ),
        (128 << 20) as f64
    );
    assert_eq!(
        before.one("surge_pool_free_bytes", &[("pool", "default")])
            - after.one("surge_pool_free_bytes", &[("pool", "default")]),
        (128 << 20) as f64,
        "the pool's free space drops by the instance"
    );

    // Stage tasks of a job: counters and task states move.
    if fuse_unavailable().is_none() {
        let work = Scratch::new("metrics-job");
        std::fs::write(work.path().join("input.dat"), vec![3u8; 3 << 20]).unwrap();
        std::fs::write(
            work.path().join("job.sh"),
            "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=64MiB\n\
             #DW stage_in type=file source=input.dat destination=$DW_JOB_STRIPED/input.dat\n\
             cmp input.dat $DW_JOB_STRIPED/input.dat\n",
        )
        .unwrap();
        let o = Command::new(SURGE)
            .current_dir(work.path())
            .env("SURGE_MANAGER", &d.manager)
            .env("SURGE_MUNGE_SOCKET", surge_testkit::munge_socket())
            .args(["run", "job.sh"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let m = Scrape::of(&d.manager_http);
        assert_eq!(
            m.one(
                "surge_stage_tasks",
                &[("direction", "in"), ("state", "done")]
            ),
            1.0
        );
        assert_eq!(
            m.one("surge_stage_copied_bytes_total", &[("direction", "in")]),
            (3 << 20) as f64
        );
        assert_eq!(m.one("surge_sessions", &[("state", "ended")]), 1.0);
        let servers = d.scrape_servers();
        dashboard_names_only_exported_metrics(&[&m, &servers[0], &servers[1]]);
    } else {
        eprintln!("the stage-task part of this test needs FUSE: skipped");
    }
}

/// Every `surge_*` metric a panel of the Grafana dashboard queries is one the components export.
fn dashboard_names_only_exported_metrics(scrapes: &[&Scrape]) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../contrib/grafana/surge-dashboard.json"
    );
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut exprs = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    assert!(exprs.len() >= 10, "the dashboard has its panels");
    // The sample names each family has, whether or not it has samples yet.
    let mut exported = std::collections::HashSet::new();
    for s in scrapes {
        for (name, kind) in &s.families {
            let suffixes: &[&str] = match kind.as_str() {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_count", "_sum"],
                _ => &[""],
            };
            for suf in suffixes {
                exported.insert(format!("{name}{suf}"));
            }
        }
    }
    for e in &exprs {
        let mut rest = e.as_str();
        while let Some(i) = rest.find("surge_") {
            let name: String = rest[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                exported.contains(name.as_str()),
                "the dashboard queries {name}, which nothing exports (in `{e}`)"
            );
            rest = &rest[i + name.len()..];
        }
    }
}
