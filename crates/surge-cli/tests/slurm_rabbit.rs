//! An HPE Rabbit (DWS) job script under a real Slurm (slurmctld, two slurmd, munged;
//! burst_buffer/lua calling `surge bb`; job_submit.lua validating with `surge bb validate`) on
//! the many-host test bed of `contrib/slurm/testbed.sh`, modelled on slurm.rs's Cori-style
//! script: two named allocations (xfs: one namespace per compute host; lustre: one for the
//! job), `#DW copy_in` / `#DW copy_out`, no `pool=` (job_submit.lua adds the site's), and the
//! output on the PFS byte-identical. A Rabbit line Surge does not do is refused at sbatch.
//!
//! Needs root, `ip netns` and /dev/fuse (and Slurm 22.05, which the test bed installs).

mod common;
use common::testbed::{ok, sh, skip, Bed, TB, USER};
use common::*;
use std::path::Path;
use std::time::{Duration, Instant};

const MANAGER: &str = "10.78.0.1:7060";

/// `testbed.sh sbatch USER SCRIPT`: (job id, final state, output).
fn sbatch(name: &str, script: &str) -> (u64, String, String) {
    let path = format!("{TB}/pfs/{name}");
    std::fs::write(&path, script).unwrap();
    let out = ok(&format!(
        "{} sbatch {USER} {path}",
        common::testbed::script().display()
    ));
    let line = out
        .lines()
        .find(|l| l.starts_with("job "))
        .unwrap_or_else(|| panic!("no job line in:\n{out}"));
    let f: Vec<&str> = line.split_whitespace().collect();
    let output = std::fs::read_to_string(f[4]).unwrap_or_default();
    (f[1].parse().unwrap(), f[2].to_string(), output)
}

/// The names of the instances the manager has.
fn instances() -> Vec<String> {
    let out = ok(&format!("{SURGE} instance ls --json --manager {MANAGER}"));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn a_rabbit_script_with_two_named_allocations_runs_under_sbatch_byte_identical() {
    let name = "a_rabbit_script_with_two_named_allocations_runs_under_sbatch_byte_identical";
    if skip(name) {
        return;
    }
    let script = common::testbed::script();
    let _ = sh(&format!("{} down", script.display()));
    let t = Instant::now();
    let _bed = Bed;
    let up = ok(&format!("{} up", script.display()));
    eprintln!("{up}(took {:.1} s)", t.elapsed().as_secs_f64());

    let t = Instant::now();
    let input = Path::new(TB).join("pfs/rabbit_in");
    std::fs::create_dir_all(input.join("sub")).unwrap();
    let mut rng = Rng(seed() | 5);
    let mut data = vec![0u8; 3 << 20];
    rng.fill(&mut data);
    std::fs::write(input.join("data"), &data).unwrap();
    for i in 0..20 {
        std::fs::write(input.join(format!("sub/f{i}")), format!("file {i}\n")).unwrap();
    }
    ok(&format!("chown -R {USER} {}", input.display()));

    let (id, state, output) = sbatch(
        "rabbit.sh",
        &format!(
            "#!/bin/bash\n#SBATCH -N 2\n\
             #DW jobdw type=xfs capacity=256MiB name=node-local\n\
             #DW jobdw type=lustre capacity=1GiB name=shared\n\
             #DW copy_in source={TB}/pfs/rabbit_in destination=$DW_JOB_shared/in\n\
             #DW copy_in source={TB}/pfs/rabbit_in/data destination=$DW_JOB_node_local/\n\
             #DW copy_out source=$DW_JOB_shared/out destination={TB}/pfs/rabbit_out\n\
             set -e\n\
             env | grep '^DW_JOB_' | sed 's/=.*//' | sort\n\
             mkdir -p $DW_JOB_shared/out\n\
             cp -r $DW_JOB_shared/in/. $DW_JOB_shared/out/\n\
             srun -N 2 sh -c 'cmp $DW_JOB_node_local/data $DW_JOB_shared/in/data && cp $DW_JOB_node_local/data $DW_JOB_shared/out/data.$(hostname) && echo x > $DW_JOB_node_local/mine.$(hostname)'\n\
             srun -N 2 sh -c 'ls $DW_JOB_node_local | tr \"\\n\" \" \" > $DW_JOB_shared/out/ls.$(hostname)'\n"
        ),
    );
    assert_eq!(state, "COMPLETED", "job {id}: {output}");
    // $DW_JOB_<name> in the job's environment (Slurm's paths hook), `-` written `_`.
    assert!(
        output.contains("DW_JOB_node_local\nDW_JOB_shared\n"),
        "job {id}: {output}"
    );
    for h in ["sgc1", "sgc2"] {
        // Each host's xfs namespace got the copy_in, and holds only that host's own file.
        let got = std::fs::read(format!("{TB}/pfs/rabbit_out/data.{h}")).unwrap_or_default();
        assert!(
            got == data,
            "rabbit_out/data.{h} differs from the copied-in file"
        );
        assert_eq!(
            std::fs::read_to_string(format!("{TB}/pfs/rabbit_out/ls.{h}")).unwrap(),
            format!("data mine.{h} "),
            "the xfs allocation is per host"
        );
        std::fs::remove_file(format!("{TB}/pfs/rabbit_out/data.{h}")).unwrap();
        std::fs::remove_file(format!("{TB}/pfs/rabbit_out/ls.{h}")).unwrap();
    }
    // The lustre allocation's tree came back byte-identical.
    let (same, diff) = sh(&format!("diff -r {TB}/pfs/rabbit_in {TB}/pfs/rabbit_out"));
    assert!(same, "the copy_out differs from the copy_in:\n{diff}");
    let log = std::fs::read_to_string(format!("{TB}/log/slurmctld.log")).unwrap_or_default();
    assert!(
        log.contains("surge job_submit: pool=nvme added to 2 directive(s)"),
        "job_submit.lua gave both allocations the default pool: {log}"
    );
    // Teardown destroyed both allocations' instances.
    let tag = format!("slurm{id}_");
    wait_for(
        "the job's allocations destroyed",
        Duration::from_secs(30),
        || {
            let left: Vec<String> = instances()
                .into_iter()
                .filter(|n| n.starts_with(&tag))
                .collect();
            left.is_empty().then_some(())
        },
    );
    eprintln!(
        "Rabbit job {id} completed byte-identical in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // A Rabbit line Surge does not do is refused at sbatch, naming the line and the value.
    let bad = format!("{TB}/pfs/bad_rabbit.sh");
    std::fs::write(
        &bad,
        "#!/bin/bash\n#SBATCH -N 1\n#DW jobdw type=raw capacity=1GiB name=blocks\nhostname\n",
    )
    .unwrap();
    let (good, out) = sh(&format!(
        "runuser -u {USER} -- env SLURM_CONF=$SLURM_CONF sbatch {bad}"
    ));
    assert!(!good, "{out}");
    assert!(
        out.contains("batch script:3") && out.contains("type=raw"),
        "{out}"
    );
}
