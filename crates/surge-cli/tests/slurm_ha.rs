//! High availability under a real Slurm (issue 30): `testbed.sh up --ha` brings up three
//! etcd members and two managers on them in hosts of their own; a DataWarp job is submitted
//! with `sbatch`, and while its stage-in runs the leading manager is killed (kill -9). The
//! standby takes over, the job's phases go on against it, and the job completes with its
//! output byte-identical to its input.
//!
//! Its etcd speaks TLS only and asks every client and peer for a certificate of etcd's own CA
//! (issue 31): before the job, clear HTTP to the members' ports and `etcdctl` without the
//! right certificate are checked to be refused, and the managers run on it throughout.
//!
//! Needs root, `ip netns` and /dev/fuse (and Slurm 22.05 and etcd, which the test bed
//! installs).

mod common;
use common::testbed::{ok, sh, skip, Bed, TB, USER};
use common::*;
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The etcd members of `up --ha` (sg-m1, sg-m2, sg-e3).
const MEMBERS: [&str; 3] = ["10.78.0.31", "10.78.0.32", "10.78.0.33"];
/// etcd's CA and certificates, as `testbed.sh` makes them.
const ETLS: &str = "/run/surge-tb/etc/etcd-tls";

/// `etcdctl TLS... --endpoints ENDPOINTS ARGS...` with short timeouts (a refused client fails
/// in seconds, not etcdctl's default minute).
fn etcdctl(tls: &[&str], endpoints: &str, args: &[&str]) -> std::process::Output {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--dial-timeout", "3s", "--command-timeout", "5s"])
        .args(tls)
        .args(["--endpoints", endpoints])
        .args(args)
        .output()
        .expect("run etcdctl")
}

/// What `addr` sends back to a request in clear (`payload`) within 5 s: nothing when it closes
/// the connection or says nothing.
fn clear_reply(addr: &str, payload: &[u8]) -> Vec<u8> {
    let mut s =
        std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // A member may close before it has read everything: the reply is what matters.
    let _ = s.write_all(payload);
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    reply
}

/// The test bed's etcd serves only clients with a certificate of its own CA: clear HTTP/1.1
/// and HTTP/2 (gRPC's, what a clear `etcdctl` speaks) to any member's client or peer port get
/// nothing back; `etcdctl` over `http://`, with the CA but no certificate, or with a client
/// certificate of the site CA (which signs every host's certificate) is refused, and none of
/// their writes lands. The test bed's own `etcdctl` certificate is served (so the refusals
/// are etcd's, not a dead cluster's).
fn etcd_refuses_clients_without_its_certificate() {
    let (found, _) = sh("command -v etcdctl");
    assert!(
        found,
        "etcdctl is missing (testbed.sh up --ha installs etcd-client)"
    );
    let https = MEMBERS.map(|m| format!("https://{m}:2379")).join(",");
    let ca = format!("{ETLS}/ca.crt");
    let (cert, key) = (
        format!("{ETLS}/etcdctl/client.crt"),
        format!("{ETLS}/etcdctl/client.key"),
    );
    let own = ["--cacert", &ca, "--cert", &cert, "--key", &key];
    let o = etcdctl(&own, &https, &["endpoint", "health"]);
    assert!(
        o.status.success(),
        "etcdctl with the test bed's certificate: {}",
        text(&o)
    );

    // Clear text on the wire: HTTP/1.1, and HTTP/2 with prior knowledge (its preface and an
    // empty SETTINGS frame), to the client and the peer port of every member.
    let h1 = b"GET /version HTTP/1.1\r\nHost: etcd\r\n\r\n".to_vec();
    let h2 = [
        &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..],
        &[0, 0, 0, 4, 0, 0, 0, 0, 0],
    ]
    .concat();
    for m in MEMBERS {
        for port in [2379, 2380] {
            for (what, payload) in [("HTTP/1.1", &h1), ("HTTP/2", &h2)] {
                let reply = clear_reply(&format!("{m}:{port}"), payload);
                // Nothing, or at most a TLS alert record (content type 21): no HTTP answer.
                assert!(
                    reply.is_empty() || reply[0] == 21,
                    "{m}:{port} answered {what} in clear: {:?}",
                    String::from_utf8_lossy(&reply)
                );
            }
        }
    }

    // etcdctl without the right certificate: each write refused, and not written.
    let http = MEMBERS.map(|m| format!("http://{m}:2379")).join(",");
    let intruder = Scratch::new("slurm-ha-intruder");
    let o = Command::new(SURGE)
        .args(["cert", "client", "intruder", "--ca-cert"])
        .arg(format!("{TB}/etc/tls/ca.crt"))
        .arg("--out")
        .arg(intruder.path())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "surge cert client with the site CA: {}",
        text(&o)
    );
    let (icert, ikey) = (
        intruder.path().join("client.crt").display().to_string(),
        intruder.path().join("client.key").display().to_string(),
    );
    let cases: [(&str, &[&str], &str); 3] = [
        ("in clear (http://)", &[], &http),
        ("with the CA, no certificate", &["--cacert", &ca], &https),
        (
            "with a certificate of the site CA",
            &["--cacert", &ca, "--cert", &icert, "--key", &ikey],
            &https,
        ),
    ];
    for (i, (what, tls, endpoints)) in cases.iter().enumerate() {
        let t = Instant::now();
        let o = etcdctl(
            tls,
            endpoints,
            &["put", &format!("/surge-tb-probe/{i}"), "x"],
        );
        assert!(
            !o.status.success(),
            "etcdctl {what} was served: {}",
            text(&o)
        );
        eprintln!(
            "etcdctl {what}: refused in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    let o = etcdctl(&own, &https, &["get", "--prefix", "/surge-tb-probe/"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(o.stdout.is_empty(), "a refused etcdctl wrote: {}", text(&o));
}

/// The leader as `testbed.sh status` says it: (name, pid).
fn leader() -> Option<(String, i32)> {
    let (_, out) = sh(&format!("{} status", common::testbed::script().display()));
    out.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            ["manager", name, "leader", "pid", pid] => Some((name.to_string(), pid.parse().ok()?)),
            _ => None,
        }
    })
}

/// Whether a stage-in task runs now, as the leading manager says (asked with the test bed's
/// munged, as root: an administrator sees every session's tasks).
fn stage_in_running(rt: &tokio::runtime::Runtime, managers: &str) -> bool {
    rt.block_on(async {
        let Ok(mut c) = surge_api::connect_with(managers, "/run/munge/munge.socket.2".into()).await
        else {
            return false;
        };
        c.list_stages_page(surge_api::v1::ListStagesPageRequest {
            session: 0,
            before: 0,
            limit: 50,
        })
        .await
        .map(|r| {
            r.into_inner()
                .tasks
                .iter()
                .any(|t| t.direction == "in" && t.state == "running")
        })
        .unwrap_or(false)
    })
}

#[test]
fn the_leader_killed_during_a_jobs_stage_in_and_the_job_completes_byte_identical() {
    let name = "the_leader_killed_during_a_jobs_stage_in_and_the_job_completes_byte_identical";
    if skip(name) {
        return;
    }
    common::testbed::use_tls_here();
    let script = common::testbed::script();
    let _ = sh(&format!("{} down", script.display()));
    let t = Instant::now();
    let _bed = Bed;
    let up = ok(&format!("{} up --ha", script.display()));
    eprintln!("{up}(took {:.1} s)", t.elapsed().as_secs_f64());
    let managers = "10.78.0.31:7060,10.78.0.32:7060";
    etcd_refuses_clients_without_its_certificate();
    let (first, pid) = leader().expect("testbed.sh status names no leader");
    eprintln!("leader: manager {first} pid {pid}");

    // An input large enough that its stage-in is still running when the leader is killed.
    let input = Path::new(TB).join("pfs/hain");
    std::fs::create_dir_all(&input).unwrap();
    let mut rng = Rng(seed() | 3);
    for i in 0..256 {
        let mut data = vec![0u8; 2 << 20];
        rng.fill(&mut data);
        std::fs::write(input.join(format!("part-{i:03}")), data).unwrap();
    }
    ok(&format!("chown -R {USER} {}", input.display()));
    let job = Path::new(TB).join("pfs/ha.sh");
    std::fs::write(
        &job,
        format!(
            "#!/bin/bash\n#SBATCH -N 1\n\
             #DW jobdw type=scratch access_mode=striped capacity=2GiB\n\
             #DW stage_in type=directory source={TB}/pfs/hain destination=$DW_JOB_STRIPED/in\n\
             #DW stage_out type=directory source=$DW_JOB_STRIPED/out destination={TB}/pfs/haout\n\
             set -e\n\
             mkdir -p $DW_JOB_STRIPED/out\n\
             cp -r $DW_JOB_STRIPED/in/. $DW_JOB_STRIPED/out/\n\
             echo copied $(ls $DW_JOB_STRIPED/out | wc -l) files\n"
        ),
    )
    .unwrap();
    let id = ok(&format!(
        "runuser -u {USER} -- env SLURM_CONF=$SLURM_CONF sbatch --parsable -o {TB}/out/%j.out \
         -D {TB}/pfs {}",
        job.display()
    ))
    .trim()
    .to_string();
    // Kill the leader as soon as the job's stage-in runs.
    let rt = tokio::runtime::Runtime::new().unwrap();
    wait_for("the stage-in running", Duration::from_secs(120), || {
        stage_in_running(&rt, managers).then_some(())
    });
    // SAFETY: killing the test bed's own daemon.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let killed = Instant::now();
    eprintln!("killed the leader {first} (pid {pid}) during the stage-in of job {id}");
    let (second, _) = wait_for("a new leader", Duration::from_secs(30), || {
        leader().filter(|(n, _)| *n != first)
    });
    eprintln!(
        "manager {second} leads {:.1} s after the kill",
        killed.elapsed().as_secs_f64()
    );

    // The job completes, its output byte-identical to its input.
    wait_for(&format!("job {id} gone"), Duration::from_secs(300), || {
        let (_, q) = sh(&format!("squeue -h -j {id} -o %T"));
        q.trim().is_empty().then_some(())
    });
    let (_, s) = sh(&format!("scontrol show job {id}"));
    let out = std::fs::read_to_string(format!("{TB}/out/{id}.out")).unwrap_or_default();
    assert!(
        s.contains("JobState=COMPLETED") && s.contains("ExitCode=0:0"),
        "job {id} did not complete:\n{s}\noutput:\n{out}\n{}",
        sh(&format!("tail -30 {TB}/log/slurmctld.log")).1
    );
    let (same, diff) = sh(&format!("diff -r {TB}/pfs/hain {TB}/pfs/haout"));
    assert!(same, "the output differs from the input:\n{diff}");
    assert!(out.contains("copied 256 files"), "{out}");
    eprintln!("job {id} completed after the failover; output byte-identical");
}
