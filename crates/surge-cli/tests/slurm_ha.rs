//! High availability under a real Slurm (issue 30): `testbed.sh up --ha` brings up three
//! etcd members and two managers on them in hosts of their own; a DataWarp job is submitted
//! with `sbatch`, and while its stage-in runs the leading manager is killed (kill -9). The
//! standby takes over, the job's phases go on against it, and the job completes with its
//! output byte-identical to its input.
//!
//! Needs root, `ip netns` and /dev/fuse (and Slurm 22.05 and etcd, which the test bed
//! installs).

mod common;
use common::testbed::{ok, sh, skip, Bed, TB, USER};
use common::*;
use std::path::Path;
use std::time::{Duration, Instant};

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
