//! Surge under a real Slurm (slurmctld, two slurmd, munged; burst_buffer/lua calling
//! `surge bb`) on the many-host test bed of `contrib/slurm/testbed.sh`: hosts are network
//! namespaces, compute hosts have their own mount namespaces and `surge agent`s, the BB
//! servers run on hosts of their own. DataWarp scripts are submitted with `sbatch` by a
//! non-root user, exactly as `testbed.sh sbatch` does for an admin.
//!
//! Needs root, `ip netns` and /dev/fuse (and Slurm 22.05, which the test bed installs).

mod common;
use common::testbed::{ok, sh, unavailable, Bed};
use common::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use surge_testkit::wire::contains;

const TB: &str = "/run/surge-tb";
const MANAGER: &str = "10.78.0.1:7060";
const USER: &str = "sgbbuser";

fn testbed() -> PathBuf {
    testbed::script()
}

struct Job {
    id: u64,
    state: String,
    output: String,
}

/// `testbed.sh sbatch USER SCRIPT` with `script` written to the PFS.
fn sbatch(name: &str, script: &str, extra: &[&str]) -> Job {
    let path = format!("{TB}/pfs/{name}");
    std::fs::write(&path, script).unwrap();
    let out = ok(&format!(
        "{} sbatch {USER} {path} {}",
        testbed().display(),
        extra.join(" ")
    ));
    let line = out
        .lines()
        .find(|l| l.starts_with("job "))
        .unwrap_or_else(|| panic!("no job line in:\n{out}"));
    let f: Vec<&str> = line.split_whitespace().collect();
    let output = std::fs::read_to_string(f[4]).unwrap_or_default();
    Job {
        id: f[1].parse().unwrap(),
        state: f[2].to_string(),
        output,
    }
}

fn surge_tb(args: &str) -> String {
    ok(&format!("{SURGE} {args}"))
}

/// Nothing of any job is left: no active session, no instance, no mount on either compute
/// host (as the agents say and as the hosts' mount tables say).
fn nothing_left(after: &str) {
    nothing_left_within(after, 30);
}

/// The same, waiting up to `secs` (a reconcile comes with the pools hook, every 30 s).
fn nothing_left_within(after: &str, secs: u64) {
    // Slurm reports a job's final state before its teardown hook has finished: wait for it.
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let sessions: serde_json::Value =
            serde_json::from_str(&surge_tb(&format!("session --manager {MANAGER} ls --json")))
                .unwrap();
        let instances: serde_json::Value = serde_json::from_str(&surge_tb(&format!(
            "instance ls --json --manager {MANAGER}"
        )))
        .unwrap();
        let kept: Vec<&serde_json::Value> = instances
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["kind"] != "persistent")
            .collect();
        let agents: serde_json::Value =
            serde_json::from_str(&surge_tb(&format!("bb agents --manager {MANAGER} --json")))
                .unwrap();
        let mounted: usize = agents
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["mounts"].as_array().map_or(0, |m| m.len()))
            .sum();
        let (_, fuse) = sh(&format!(
            "for c in c1 c2; do nsenter --mount={TB}/ns/$c.mnt grep ' /run/surge/jobs/' /proc/self/mountinfo; done"
        ));
        if sessions.as_array().is_some_and(|s| s.is_empty())
            && kept.is_empty()
            && mounted == 0
            && fuse.trim().is_empty()
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{after}: left behind: sessions {sessions}; instances {instances}; agents {agents}; \
             mount tables:\n{fuse}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn write_pfs(rel: &str, bytes: &[u8]) {
    let p = Path::new(TB).join("pfs").join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, bytes).unwrap();
    ok(&format!(
        "chown -R {USER} {TB}/pfs/{}",
        rel.split('/').next().unwrap()
    ));
}

fn slurmctld_log() -> String {
    std::fs::read_to_string(format!("{TB}/log/slurmctld.log")).unwrap_or_default()
}

/// Waits until job `id` is RUNNING.
fn wait_running(id: &str) {
    wait_for(
        &format!("job {id} running"),
        Duration::from_secs(60),
        || {
            let (_, st) = sh(&format!("squeue -h -j {id} -o %T"));
            (st.trim() == "RUNNING").then_some(())
        },
    );
}

fn submit(name: &str, script: &str) -> String {
    let path = format!("{TB}/pfs/{name}");
    std::fs::write(&path, script).unwrap();
    ok(&format!(
        "runuser -u {USER} -- env SLURM_CONF=$SLURM_CONF sbatch --parsable -o {TB}/out/%j.out -D {TB}/pfs {path}"
    ))
    .trim()
    .to_string()
}

/// Waits until job `id` has left the queue (its teardown done); returns its final state.
fn wait_gone(id: &str) -> String {
    wait_for(&format!("job {id} gone"), Duration::from_secs(120), || {
        let (_, q) = sh(&format!("squeue -h -j {id} -o %T"));
        q.trim().is_empty().then_some(())
    });
    let (_, s) = sh(&format!("scontrol show job {id}"));
    s.split_whitespace()
        .find_map(|w| w.strip_prefix("JobState="))
        .unwrap_or("?")
        .to_string()
}

#[test]
fn datawarp_scripts_run_under_sbatch_on_two_compute_hosts() {
    if let Some(why) = unavailable() {
        if std::env::var("SURGE_SKIP_SLURM").is_ok_and(|v| v == "1") {
            eprintln!("SKIPPED slurm test bed: {why} (SURGE_SKIP_SLURM=1)");
            return;
        }
        panic!("the Slurm test bed needs {why}; set SURGE_SKIP_SLURM=1 to skip it");
    }
    let _ = sh(&format!("{} down", testbed().display()));
    let t = Instant::now();
    let _bed = Bed;
    let up = ok(&format!("{} up", testbed().display()));
    eprintln!("{up}(took {:.1} s)", t.elapsed().as_secs_f64());

    // 1. Striped, 2 nodes: stage in a directory, both nodes read it and write, stage out.
    let mut rng = Rng(seed() | 1);
    let mut data = vec![0u8; 6 << 20];
    rng.fill(&mut data);
    write_pfs("in1/data", &data);
    let job = sbatch(
        "striped.sh",
        &format!(
            "#!/bin/bash\n#SBATCH -N 2\n\
             #DW jobdw type=scratch access_mode=striped capacity=1GiB pool=nvme\n\
             #DW stage_in type=directory source={TB}/pfs/in1 destination=$DW_JOB_STRIPED/in\n\
             #DW stage_out type=directory source=$DW_JOB_STRIPED/out destination={TB}/pfs/out1\n\
             set -e\n\
             echo \"striped at $DW_JOB_STRIPED on $(hostname) as $(id -un)\"\n\
             mkdir -p $DW_JOB_STRIPED/out\n\
             srun -N 2 sh -c 'cp $DW_JOB_STRIPED/in/data $DW_JOB_STRIPED/out/data.$(hostname)'\n\
             srun -N 2 sh -c 'ls $DW_JOB_STRIPED/out > /dev/null; hostname > $DW_JOB_STRIPED/out/host.$(hostname)'\n"
        ),
        &[],
    );
    assert_eq!(job.state, "COMPLETED", "job {}: {}", job.id, job.output);
    assert!(job.output.contains("on sgc1 as sgbbuser"), "{}", job.output);
    for h in ["sgc1", "sgc2"] {
        let got = std::fs::read(format!("{TB}/pfs/out1/data.{h}")).unwrap();
        assert!(got == data, "data.{h} differs from the staged-in file");
        assert_eq!(
            std::fs::read_to_string(format!("{TB}/pfs/out1/host.{h}")).unwrap(),
            format!("{h}\n")
        );
    }
    nothing_left("striped job");
    // The copies ran on the data movers of the BB hosts, not on the manager's host.
    let mlog = std::fs::read_to_string(format!("{TB}/log/manager.log")).unwrap_or_default();
    assert!(mlog.contains("runs on data mover sgbb"), "{mlog}");

    // 1b. Nothing readable crosses the network (issue 31): every frame to and from sgc1 is
    //     captured while a job there writes a file into its striped instance (fragments on
    //     sgbb1 and sgbb2) and reads it back. Control: the job's script, which Slurm sends
    //     to slurmd in clear, is in the capture; the file's content is not.
    let cap = Capture::start("sgc1");
    let job = sbatch(
        "wire.sh",
        "#!/bin/bash\n#SBATCH -N 1 -w sgc1\n\
         #DW jobdw type=scratch access_mode=striped capacity=1GiB pool=nvme\n\
         set -e\nP=surgeclearmark\n\
         yes \"$(echo $P | rev)-payload\" | head -c 16777216 > $DW_JOB_STRIPED/f\n\
         cmp <(yes \"$(echo $P | rev)-payload\" | head -c 16777216) $DW_JOB_STRIPED/f\n",
        &[],
    );
    let wire = cap.stop();
    assert_eq!(job.state, "COMPLETED", "job {}: {}", job.id, job.output);
    assert!(
        wire.len() > 16 << 20,
        "the file's 16 MiB crossed sgc1: {} bytes captured",
        wire.len()
    );
    assert!(
        contains(&wire, b"surgeclearmark"),
        "the capture sees what Slurm sends in clear ({} bytes)",
        wire.len()
    );
    assert!(
        !contains(&wire, b"kramraelcegrus-payload"),
        "the file's content crossed the network in clear"
    );
    eprintln!(
        "captured {} bytes on sgc1: the job script in clear (Slurm), none of the file",
        wire.len()
    );
    nothing_left("wire job");

    // 2. Private, 2 nodes: each node's namespace staged out to the same directory.
    let job = sbatch(
        "private.sh",
        &format!(
            "#!/bin/bash\n#SBATCH -N 2\n\
             #DW jobdw type=scratch access_mode=private capacity=1GiB pool=nvme\n\
             #DW stage_out type=directory source=$DW_JOB_PRIVATE/out destination={TB}/pfs/out2\n\
             srun -N 2 sh -c 'mkdir -p $DW_JOB_PRIVATE/out && n=$(ls $DW_JOB_PRIVATE/out | wc -l) && echo $n > $DW_JOB_PRIVATE/out/seen.$(hostname)'\n"
        ),
        &[],
    );
    assert_eq!(job.state, "COMPLETED", "job {}: {}", job.id, job.output);
    for h in ["sgc1", "sgc2"] {
        // Each node saw only its own namespace (empty when it listed it).
        assert_eq!(
            std::fs::read_to_string(format!("{TB}/pfs/out2/seen.{h}")).unwrap(),
            "0\n"
        );
    }
    nothing_left("private job");

    // 3. A bad directive is refused at sbatch, with its line.
    std::fs::write(
        format!("{TB}/pfs/bad.sh"),
        "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=1GiB pool=nvme\n\
         #DW stage_in type=file source=/x destinaton=$DW_JOB_STRIPED/x\nhostname\n",
    )
    .unwrap();
    let (good, out) = sh(&format!(
        "runuser -u {USER} -- env SLURM_CONF=$SLURM_CONF sbatch {TB}/pfs/bad.sh"
    ));
    assert!(!good, "{out}");
    assert!(
        out.contains("batch script:3") && out.contains("destinaton"),
        "{out}"
    );
    nothing_left("refused job");

    // 3b. A Cori-style script, as NERSC's were written: no `pool=` (burst_buffer/lua alone
    //     refuses `capacity=` without one and ignores DefaultPool; contrib/slurm/job_submit.lua
    //     gives it the site's default pool). Runs on both nodes, stages in and out byte for byte.
    let t3b = Instant::now();
    let mut cori = vec![0u8; 3 << 20];
    rng.fill(&mut cori);
    write_pfs("cori_in/data", &cori);
    let job = sbatch(
        "cori.sh",
        &format!(
            "#!/bin/bash\n#SBATCH -N 2\n\
             #DW jobdw type=scratch access_mode=striped capacity=1GiB\n\
             #DW stage_in type=directory source={TB}/pfs/cori_in destination=$DW_JOB_STRIPED/in\n\
             #DW stage_out type=directory source=$DW_JOB_STRIPED/out destination={TB}/pfs/cori_out\n\
             set -e\nmkdir -p $DW_JOB_STRIPED/out\n\
             srun -N 2 sh -c 'cp $DW_JOB_STRIPED/in/data $DW_JOB_STRIPED/out/data.$(hostname)'\n"
        ),
        &[],
    );
    assert_eq!(job.state, "COMPLETED", "job {}: {}", job.id, job.output);
    for h in ["sgc1", "sgc2"] {
        let got = std::fs::read(format!("{TB}/pfs/cori_out/data.{h}")).unwrap_or_default();
        assert!(
            got == cori,
            "cori_out/data.{h} differs from the staged-in file"
        );
    }
    let log = slurmctld_log();
    assert!(
        log.contains("surge job_submit: pool=nvme added to 1 directive(s)"),
        "the job_submit hook says what it added: {log}"
    );
    assert!(
        log.contains(&format!("surge bb setup job={}", job.id)),
        "{log}"
    );
    nothing_left("Cori-style job");

    // 3c. A bad value without `pool=` is refused at sbatch with Surge's message, naming the
    //     line and the value (before Slurm's own parse, which would say only "Burst Buffer
    //     request invalid").
    let bad_cori = format!("{TB}/pfs/bad_cori.sh");
    std::fs::write(
        &bad_cori,
        "#!/bin/bash\n#SBATCH -N 2\n#DW jobdw type=scratch access_mode=stripd capacity=1GiB\nhostname\n",
    )
    .unwrap();
    let (good, out) = sh(&format!(
        "runuser -u {USER} -- env SLURM_CONF=$SLURM_CONF sbatch {bad_cori}"
    ));
    assert!(!good, "{out}");
    assert!(
        out.contains("batch script:3") && out.contains("stripd") && out.contains("striped"),
        "Surge's message names the line, the value and what it should be: {out}"
    );
    assert!(out.contains("Burst Buffer request invalid"), "{out}");
    // A capacity Slurm itself cannot read gets Surge's message too.
    std::fs::write(
        &bad_cori,
        "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=2.5XB\nhostname\n",
    )
    .unwrap();
    let (good, out) = sh(&format!(
        "runuser -u {USER} -- env SLURM_CONF=$SLURM_CONF sbatch {bad_cori}"
    ));
    assert!(!good, "{out}");
    assert!(
        out.contains("batch script:2") && out.contains("2.5XB"),
        "{out}"
    );
    // The default pool goes on a directive's last line when it is continued with `\`, and on
    //  `--bb` text; held jobs, read back from Slurm, then cancelled.
    let held = |args: &str| {
        let id = ok(&format!(
            "runuser -u {USER} -- env SLURM_CONF=$SLURM_CONF sbatch --parsable --hold {args}"
        ))
        .trim()
        .to_string();
        let (_, job) = sh(&format!(
            "scontrol show job {id}; scontrol write batch_script {id} -"
        ));
        ok(&format!("scancel {id}"));
        wait_gone(&id);
        job
    };
    std::fs::write(
        format!("{TB}/pfs/continued.sh"),
        "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped \\\n#DW   capacity=1GiB\nhostname\n",
    )
    .unwrap();
    let job = held(&format!("{TB}/pfs/continued.sh"));
    assert!(
        job.contains(
            "BurstBuffer=#DW jobdw type=scratch access_mode=striped capacity=1GiB pool=nvme"
        ) && job.contains("\n#DW   capacity=1GiB pool=nvme\nhostname"),
        "{job}"
    );
    std::fs::write(format!("{TB}/pfs/plain.sh"), "#!/bin/bash\nhostname\n").unwrap();
    let job = held(&format!(
        "--bb '#DW jobdw type=scratch access_mode=striped capacity=1GiB' {TB}/pfs/plain.sh"
    ));
    assert!(
        job.contains(
            "BurstBuffer=#DW jobdw type=scratch access_mode=striped capacity=1GiB pool=nvme"
        ),
        "{job}"
    );
    nothing_left("refused Cori-style job");

    // 3d. `surge doctor` on the test bed's hosts, with the daemons' own flags: the manager, a
    //     BB server (registered and up) and a compute node (FUSE, its agent heard) pass; a
    //     compute node the manager does not know is named.
    let doctor = |host: &str, role: &str, flags: &str| {
        let enter = match host {
            "ctl" => String::new(),
            h if h.starts_with('c') => {
                format!("nsenter --net=/run/netns/sg-{h} --mount={TB}/ns/{h}.mnt ")
            }
            h => format!("nsenter --net=/run/netns/sg-{h} "),
        };
        sh(&format!(
            "{enter}{SURGE} doctor --role {role} --config /dev/null -- {flags}"
        ))
    };
    let key = format!("--key-file {TB}/etc/surge.key");
    let (good, out) = doctor(
        "ctl",
        "manager",
        &format!("--state {TB}/state-surge/manager.db --listen {MANAGER} {key} --admin-group $(id -g slurm) --pool nvme"),
    );
    assert!(good, "{out}");
    assert!(out.contains("nvme (2/2 servers up)"), "{out}");
    let (good, out) = doctor(
        "bb1",
        "server",
        &format!("--device /dev/shm/surge-tb/bb1 --capacity 4GiB --listen 0.0.0.0:7070 --advertise 10.78.0.21:7070 --manager {MANAGER} --pool nvme {key}"),
    );
    assert!(good, "{out}");
    assert!(
        out.contains("is up in pool nvme at 10.78.0.21:7070"),
        "{out}"
    );
    assert!(out.contains("is bound by surge server"), "{out}");
    let (good, out) = doctor("c1", "agent", &format!("--manager {MANAGER} --host sgc1"));
    assert!(good, "{out}");
    assert!(out.contains("the manager hears the agent of sgc1"), "{out}");
    let (good, out) = doctor("c1", "agent", &format!("--manager {MANAGER} --host sgc9"));
    assert!(!good, "{out}");
    assert!(
        out.contains("FAIL  agent") && out.contains("no agent called sgc9"),
        "{out}"
    );
    eprintln!(
        "Cori-style jobs and the doctor (3b-3d) took {:.1} s",
        t3b.elapsed().as_secs_f64()
    );

    // 4. A stage-in that fails keeps the job from running; nothing stays allocated.
    let id = submit(
        "missing.sh",
        &format!(
            "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=1GiB pool=nvme\n\
             #DW stage_in type=file source={TB}/pfs/nope destination=$DW_JOB_STRIPED/x\n\
             echo RAN\n"
        ),
    );
    let reason = wait_for("the stage-in failure", Duration::from_secs(60), || {
        let (_, r) = sh(&format!("squeue -h -j {id} -o %r"));
        r.contains("data_in").then_some(r)
    });
    assert!(
        reason.contains("script:3") && reason.contains("nope"),
        "{reason}"
    );
    wait_for("its teardown", Duration::from_secs(30), || {
        slurmctld_log()
            .contains(&format!("surge bb teardown job={id}"))
            .then_some(())
    });
    ok(&format!("scancel {id}"));
    wait_gone(&id);
    assert!(!std::path::Path::new(&format!("{TB}/out/{id}.out")).exists());
    nothing_left("failed stage-in");

    // 4b. scancel right after submit: nothing stays.
    let id = submit(
        "early.sh",
        "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=1GiB pool=nvme\ntrue\n",
    );
    ok(&format!("scancel {id}"));
    wait_gone(&id);
    nothing_left("scancel before setup");
    // scancel right after setup, while the stage-in copies. Slurm 22.05 kills the data_in
    // hook and (not always) calls teardown; else the reconcile the pools hook starts ends it.
    let big = vec![7u8; 256 << 20];
    write_pfs("big/data", &big);
    drop(big);
    let id = submit(
        "stagein.sh",
        &format!(
            "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=1GiB pool=nvme\n\
             #DW stage_in type=directory source={TB}/pfs/big destination=$DW_JOB_STRIPED/big\n\
             echo RAN\n"
        ),
    );
    wait_for("the stage-in", Duration::from_secs(60), || {
        slurmctld_log()
            .contains(&format!("surge bb setup job={id}"))
            .then_some(())
    });
    ok(&format!("scancel {id}"));
    wait_gone(&id);
    nothing_left_within("scancel during stage-in", 75);
    // A session whose teardown never comes (a job Slurm forgot: here one it never had) is
    // ended by that reconcile too.
    surge_tb(&format!(
        "bb setup --manager {MANAGER} --job-id 4000000 --uid 0 --gid 0 --script {TB}/pfs/stagein.sh"
    ));
    nothing_left_within("a session of a job Slurm does not know", 75);
    assert!(
        std::fs::read_to_string(format!("{TB}/log/surge-reconcile.log"))
            .unwrap_or_default()
            .contains("job 4000000: session"),
        "the reconcile log names what it ended"
    );

    // 5. scancel of a running job: stage-out and teardown still run, nothing stays.
    let long = format!(
        "#!/bin/bash\n#SBATCH -N 2\n\
         #DW jobdw type=scratch access_mode=striped capacity=1GiB pool=nvme\n\
         #DW stage_out type=directory source=$DW_JOB_STRIPED/out destination={TB}/pfs/OUT\n\
         mkdir -p $DW_JOB_STRIPED/out\n\
         srun -N 2 sh -c 'echo before > $DW_JOB_STRIPED/out/before.$(hostname)'\n\
         touch {TB}/pfs/OUT.ready\n\
         while [ ! -e {TB}/pfs/OUT.go ]; do sleep 0.2; done\n\
         srun -N 2 sh -c 'echo after > $DW_JOB_STRIPED/out/after.$(hostname)'\n"
    );
    let id = submit("cancel.sh", &long.replace("OUT", "out5"));
    wait_running(&id);
    wait_for("job 5 ready", Duration::from_secs(60), || {
        Path::new(&format!("{TB}/pfs/out5.ready"))
            .exists()
            .then_some(())
    });
    ok(&format!("scancel {id}"));
    let state = wait_gone(&id);
    assert_eq!(state, "CANCELLED");
    nothing_left("scancel");
    for h in ["sgc1", "sgc2"] {
        assert!(Path::new(&format!("{TB}/pfs/out5/before.{h}")).exists());
    }

    // 6. kill -9 of an agent mid-job: restarted, it cleans up and mounts again; the job
    //    completes on both hosts.
    let id = submit("agent.sh", &long.replace("OUT", "out6"));
    wait_for("job 6 ready", Duration::from_secs(60), || {
        Path::new(&format!("{TB}/pfs/out6.ready"))
            .exists()
            .then_some(())
    });
    ok(&format!("kill -9 $(cat {TB}/agent-c2.pid)"));
    ok(&format!("{} up", testbed().display()));
    // The restarted agent detaches the dead mount and mounts the job's instance again.
    wait_for("sgc2 mounted again", Duration::from_secs(30), || {
        let agents: serde_json::Value =
            serde_json::from_str(&surge_tb(&format!("bb agents --manager {MANAGER} --json")))
                .ok()?;
        let a = agents
            .as_array()?
            .iter()
            .find(|a| a["host"] == "sgc2")?
            .clone();
        (a["alive"] == true && a["mounts"].as_array()?.len() == 1).then_some(())
    });
    std::fs::write(format!("{TB}/pfs/out6.go"), "").unwrap();
    assert_eq!(wait_gone(&id), "COMPLETED", "{}", slurmctld_log());
    for f in ["before.sgc1", "before.sgc2", "after.sgc1", "after.sgc2"] {
        assert!(
            Path::new(&format!("{TB}/pfs/out6/{f}")).exists(),
            "{f} was not staged out"
        );
    }
    nothing_left("agent killed");

    // 7. kill -9 of the manager mid-job: restarted, the job completes and is torn down.
    let id = submit("manager.sh", &long.replace("OUT", "out7"));
    wait_for("job 7 ready", Duration::from_secs(60), || {
        Path::new(&format!("{TB}/pfs/out7.ready"))
            .exists()
            .then_some(())
    });
    ok(&format!("kill -9 $(cat {TB}/manager.pid)"));
    ok(&format!("{} up", testbed().display()));
    std::fs::write(format!("{TB}/pfs/out7.go"), "").unwrap();
    assert_eq!(wait_gone(&id), "COMPLETED", "{}", slurmctld_log());
    for f in ["before.sgc1", "after.sgc2"] {
        assert!(
            Path::new(&format!("{TB}/pfs/out7/{f}")).exists(),
            "{f} was not staged out"
        );
    }
    nothing_left("manager killed");

    // 9. Persistent instances through Slurm: one job creates a scratch one and a cache one
    //    (filled from its PFS directory by a stage task) and writes into both, the next reads
    //    them (the cache's changes drained by each job) and the last destroys them.
    let mut pin = vec![0u8; 3 << 20];
    rng.fill(&mut pin);
    write_pfs("pcache9/in.dat", &pin);
    let job = sbatch(
        "pcreate.sh",
        &format!(
            "#!/bin/bash\n\
             #DW create_persistent name=tbpers capacity=1GiB access_mode=striped type=scratch pool=nvme\n\
             #DW create_persistent name=tbcache capacity=1GiB access_mode=striped type=cache \
             pfs={TB}/pfs/pcache9 pool=nvme\n\
             #DW persistentdw name=tbpers\n#DW persistentdw name=tbcache\nset -e\n\
             echo kept > $DW_PERSISTENT_STRIPED_tbpers/note\n\
             cmp $DW_PERSISTENT_STRIPED_tbcache/in.dat {TB}/pfs/pcache9/in.dat\n\
             echo cached > $DW_PERSISTENT_STRIPED_tbcache/note\n"
        ),
        &[],
    );
    assert_eq!(job.state, "COMPLETED", "job {}: {}", job.id, job.output);
    let pnote = format!("{TB}/pfs/pcache9/note");
    assert_eq!(
        std::fs::read_to_string(&pnote).unwrap_or_default(),
        "cached\n",
        "the first job's change to the persistent cache is on the PFS: {}",
        job.output
    );
    let job = sbatch(
        "puse.sh",
        &format!(
            "#!/bin/bash\n#DW persistentdw name=tbpers\n#DW persistentdw name=tbcache\nset -e\n\
             cp $DW_PERSISTENT_STRIPED_tbpers/note {TB}/pfs/note.copy\n\
             cmp $DW_PERSISTENT_STRIPED_tbcache/in.dat {TB}/pfs/pcache9/in.dat\n\
             echo more >> $DW_PERSISTENT_STRIPED_tbcache/note\n"
        ),
        &[],
    );
    assert_eq!(job.state, "COMPLETED", "job {}: {}", job.id, job.output);
    assert_eq!(
        std::fs::read_to_string(&pnote).unwrap_or_default(),
        "cached\nmore\n"
    );
    let through = format!("{TB}/pfs/pcache9/.surge-through");
    assert!(
        Path::new(&through).is_dir(),
        "the persistent cache keeps its fill names between jobs"
    );
    let job = sbatch(
        "pdestroy.sh",
        "#!/bin/bash\n#DW destroy_persistent name=tbpers\n#DW destroy_persistent name=tbcache\ntrue\n",
        &[],
    );
    assert_eq!(job.state, "COMPLETED", "job {}: {}", job.id, job.output);
    assert_eq!(
        std::fs::read_to_string(format!("{TB}/pfs/note.copy")).unwrap(),
        "kept\n"
    );
    assert!(std::fs::read(format!("{TB}/pfs/pcache9/in.dat")).unwrap() == pin);
    wait_for(
        "the persistent instances destroyed",
        Duration::from_secs(30),
        || {
            let left = surge_tb(&format!("instance ls --json --manager {MANAGER}"));
            (!left.contains("tbpers") && !left.contains("tbcache")).then_some(())
        },
    );
    // Its teardown (root) removed them, as the instance's owner.
    wait_for(
        "the destroyed cache's .surge-through removed",
        Duration::from_secs(30),
        || (!Path::new(&through).exists()).then_some(()),
    );

    // 10. A DataWarp type=cache script under Slurm: the lazy fill before the job (a stage
    //     task), both nodes read a PFS file through the cache and write their own, the drain
    //     (a stage task on a data mover, as the job's user) brings every change to the PFS
    //     during and after the job, and nothing is left.
    let mut input = vec![0u8; 5 << 20];
    rng.fill(&mut input);
    write_pfs("cache10/in.dat", &input);
    let job = sbatch(
        "cache.sh",
        &format!(
            "#!/bin/bash\n#SBATCH -N 2\n\
             #DW jobdw type=cache access_mode=striped capacity=1GiB pfs={TB}/pfs/cache10 pool=nvme\n\
             set -e\n\
             srun -N 2 sh -c 'cp $DW_JOB_STRIPED_CACHE/in.dat $DW_JOB_STRIPED_CACHE/out.$(hostname); \
             mkdir -p $DW_JOB_STRIPED_CACHE/d.$(hostname); echo $(hostname) > $DW_JOB_STRIPED_CACHE/d.$(hostname)/who'\n"
        ),
        &[],
    );
    assert_eq!(job.state, "COMPLETED", "job {}: {}", job.id, job.output);
    for h in ["sgc1", "sgc2"] {
        let got = std::fs::read(format!("{TB}/pfs/cache10/out.{h}")).unwrap_or_default();
        assert!(
            got == input,
            "out.{h} on the PFS differs from what the job wrote"
        );
        assert_eq!(
            std::fs::read_to_string(format!("{TB}/pfs/cache10/d.{h}/who")).unwrap_or_default(),
            format!("{h}\n")
        );
    }
    assert!(std::fs::read(format!("{TB}/pfs/cache10/in.dat")).unwrap() == input);
    assert!(!Path::new(&format!("{TB}/pfs/cache10/.surge-through")).exists());
    // The drained files are the job user's.
    let owner = ok(&format!("stat -c %U {TB}/pfs/cache10/out.sgc1"));
    assert_eq!(owner.trim(), USER, "out.sgc1 is owned by {owner}");
    let mlog = std::fs::read_to_string(format!("{TB}/log/manager.log")).unwrap_or_default();
    assert!(
        mlog.contains("(drain_all)") || mlog.contains("(drain)"),
        "{mlog}"
    );
    nothing_left("cache job");

    // 11. Performance targets under Slurm (`bandwidth=` on the `#DW jobdw` line: Slurm passes
    //     only `#DW` lines): sized from the pool's registered peaks (two fragments on the two
    //     BB servers for 1.5 GiB/s of 1 GiB/s servers), and refused up front at setup, with the
    //     best the pool offers, when it cannot meet them.
    let pfs_dir = Path::new(TB).join("pfs");
    let one = peaks_file(&pfs_dir, "peaks11.json", 1200.0, 1000.0, 5000.0);
    let all = peaks_file(&pfs_dir, "peaks11-all.json", 2200.0, 1900.0, 5000.0);
    surge_tb(&format!(
        "pool calibrate --manager {MANAGER} --pool nvme --peaks-file {}",
        one.display()
    ));
    surge_tb(&format!(
        "pool calibrate --manager {MANAGER} --pool nvme --peaks-file {} --aggregate",
        all.display()
    ));
    let job = sbatch(
        "target.sh",
        "#!/bin/bash\n\
         #DW jobdw type=scratch access_mode=striped capacity=64MiB bandwidth=1500MiB/s pool=nvme\n\
         test -d $DW_JOB_STRIPED\n",
        &[],
    );
    assert_eq!(job.state, "COMPLETED", "job {}: {}", job.id, job.output);
    let log = slurmctld_log();
    assert!(
        log.contains(&format!("job {}: ", job.id)) && log.contains("on 2 server(s) promise"),
        "the promise is in the setup's log: {log}"
    );
    nothing_left("target job");
    let id = submit(
        "toomuch.sh",
        "#!/bin/bash\n\
         #DW jobdw type=scratch access_mode=striped capacity=64MiB bandwidth=50GiB/s pool=nvme\n\
         echo RAN\n",
    );
    wait_for("the refusal at setup", Duration::from_secs(60), || {
        slurmctld_log()
            .lines()
            .any(|l| {
                l.contains(&format!("surge bb setup job={id} failed"))
                    && l.contains("the best this pool offers")
            })
            .then_some(())
    });
    ok(&format!("scancel {id}"));
    wait_gone(&id);
    assert!(
        !Path::new(&format!("{TB}/out/{id}.out")).exists(),
        "the job ran"
    );
    nothing_left("refused target");

    // 8. The link between a compute host and the BB hosts is cut mid-job (blackhole routes on
    //    sgc2): its I/O fails with EIO after the agents' deadline (the test bed's 10 s) instead
    //    of hanging, the job fails, its teardown does not wait for ever, and once the link is
    //    back nothing is left.
    let id = submit("cut.sh", &long.replace("OUT", "out8"));
    wait_for("job 8 ready", Duration::from_secs(60), || {
        Path::new(&format!("{TB}/pfs/out8.ready"))
            .exists()
            .then_some(())
    });
    let cut = "for ip in 10.78.0.21 10.78.0.22; do ip -n sg-c2 route add blackhole $ip/32; done";
    let heal = "for ip in 10.78.0.21 10.78.0.22; do ip -n sg-c2 route del blackhole $ip/32; done";
    ok(cut);
    let t = Instant::now();
    std::fs::write(format!("{TB}/pfs/out8.go"), "").unwrap();
    let state = wait_gone(&id);
    let took = t.elapsed();
    ok(heal);
    let output = std::fs::read_to_string(format!("{TB}/out/{id}.out")).unwrap_or_default();
    assert_eq!(state, "FAILED", "{output}");
    assert!(
        output.contains("Input/output error") || output.contains("I/O error"),
        "{output}"
    );
    assert!(took < Duration::from_secs(90), "the cut job took {took:?}");
    // sgc1's output still reached the PFS.
    assert!(Path::new(&format!("{TB}/pfs/out8/after.sgc1")).exists());
    nothing_left("link cut");
}

/// Every frame through one network interface (a packet socket, as tcpdump opens), kept in
/// memory until [`Capture::stop`].
struct Capture {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<u8>>,
}

impl Capture {
    fn start(ifname: &str) -> Capture {
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket calls on a descriptor this function owns; every pointer is to
        // a live local of the size given.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto)) };
        assert!(
            fd >= 0,
            "packet socket: {}",
            std::io::Error::last_os_error()
        );
        let name = std::ffi::CString::new(ifname).unwrap();
        // SAFETY: as above.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        assert!(index > 0, "no interface {ifname}");
        // SAFETY: sockaddr_ll is plain data; zero is a valid value of each field.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = index as i32;
        let size = 256i32 << 20;
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 200_000,
        };
        // SAFETY: as above.
        unsafe {
            assert_eq!(
                libc::bind(
                    fd,
                    &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                ),
                0,
                "bind to {ifname}: {}",
                std::io::Error::last_os_error()
            );
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                &size as *const i32 as *const libc::c_void,
                4,
            );
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const libc::timeval as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as u32,
            );
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut all = Vec::new();
            let mut buf = vec![0u8; 65536];
            while !s.load(std::sync::atomic::Ordering::SeqCst) {
                // SAFETY: `buf` is a live buffer of its length.
                let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
                if n > 0 && all.len() < 1 << 30 {
                    all.extend_from_slice(&buf[..n as usize]);
                }
            }
            // SAFETY: closing the descriptor opened above, used by nothing else.
            unsafe { libc::close(fd) };
            all
        });
        Capture { stop, thread }
    }

    fn stop(self) -> Vec<u8> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().expect("the capture thread")
    }
}
