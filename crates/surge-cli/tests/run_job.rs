//! `surge run` end to end: real manager, real servers, real FUSE mounts, real job scripts
//! (issue 3's tests). Each test uses its own fast-tier directory, so they run in parallel.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A job environment: a work directory (the "PFS" the job is submitted from) and a private
/// embedded fast tier.
struct Job {
    fast: Scratch,
    work: tempdir::Dir,
}

mod tempdir {
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new(tag: &str) -> Dir {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let p =
                std::env::temp_dir().join(format!("surge-job-{}-{tag}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl Job {
    fn new(tag: &str) -> Job {
        Job {
            fast: Scratch::new(&format!("fast-{tag}")),
            work: tempdir::Dir::new(tag),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.work.0.join(rel)
    }

    fn script(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn command(&self) -> Command {
        let mut c = Command::new(SURGE);
        c.current_dir(&self.work.0)
            .env("SURGE_FAST_DIR", self.fast.path())
            .env("SURGE_SERVERS", "2")
            .env("SURGE_SERVER_CAPACITY", "1GiB")
            .env("SURGE_GRANULARITY", "64MiB")
            .env_remove("SURGE_MANAGER")
            .env_remove("SURGE_STATE_DIR");
        c
    }

    /// `surge run ARGS`, with a JSON report.
    fn run(&self, args: &[&str]) -> (Output, serde_json::Value) {
        let report = self.path("report.json");
        let _ = std::fs::remove_file(&report);
        let out = self
            .command()
            .arg("run")
            .arg("--report")
            .arg(&report)
            .args(args)
            .output()
            .unwrap();
        let rep = std::fs::read_to_string(&report)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(serde_json::Value::Null);
        (out, rep)
    }
}

fn make_inputs(dir: &Path) {
    std::fs::create_dir_all(dir.join("large")).unwrap();
    std::fs::create_dir_all(dir.join("small")).unwrap();
    for (i, name) in ["alpha", "beta"].iter().enumerate() {
        let mut data = vec![0u8; 3 << 20];
        Rng(i as u64 + 5).fill(&mut data);
        std::fs::write(dir.join(format!("large/{name}.dat")), data).unwrap();
    }
    for i in 0..200 {
        std::fs::write(
            dir.join(format!("small/obj-{i:03}.txt")),
            format!("record {i}: some text\n"),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink("small/obj-000.txt", dir.join("first")).unwrap();
}

#[test]
fn the_demo_job_stages_in_transforms_and_stages_out_byte_identical_results() {
    if skip_without_fuse("the_demo_job_stages_in_transforms_and_stages_out_byte_identical_results")
    {
        return;
    }
    let j = Job::new("demo");
    make_inputs(&j.path("demo-inputs"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo/job.sh");
    let (out, rep) = j.run(&[script.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let res = j.path("demo-results");
    // combined.dat = the large inputs concatenated in name order.
    let mut combined = std::fs::read(j.path("demo-inputs/large/alpha.dat")).unwrap();
    combined.extend(std::fs::read(j.path("demo-inputs/large/beta.dat")).unwrap());
    assert!(
        std::fs::read(res.join("combined.dat")).unwrap() == combined,
        "combined.dat differs"
    );
    for name in ["alpha", "beta"] {
        let sum = Command::new("sha256sum")
            .arg(j.path(&format!("demo-inputs/large/{name}.dat")))
            .output()
            .unwrap();
        let expect = String::from_utf8_lossy(&sum.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string();
        assert_eq!(
            std::fs::read_to_string(res.join(format!("{name}.dat.sha256")))
                .unwrap()
                .trim(),
            expect
        );
    }
    for i in 0..200 {
        let got = std::fs::read_to_string(res.join(format!("small/obj-{i:03}.txt"))).unwrap();
        assert_eq!(got, format!("record {i}: some text\n").to_uppercase());
    }
    let phases: Vec<&str> = rep["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    for p in [
        "allocate",
        "stage in",
        "mount",
        "job",
        "unmount",
        "stage out",
        "release",
    ] {
        assert!(phases.contains(&p), "phase {p} reported: {phases:?}");
    }
    assert_eq!(rep["exit_code"], 0);
}

#[test]
fn stage_in_preserves_trees_modes_mtimes_and_symlinks() {
    if skip_without_fuse("stage_in_preserves_trees_modes_mtimes_and_symlinks") {
        return;
    }
    let j = Job::new("tree");
    make_inputs(&j.path("in"));
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        j.path("in/small/obj-007.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let script = j.script(
        "job.sh",
        "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=256MiB\n\
         #DW stage_in type=directory source=in destination=$DW_JOB_STRIPED/copy\n\
         set -e\nstat -c '%a %Y' $DW_JOB_STRIPED/copy/small/obj-007.txt > seen.txt\n\
         readlink $DW_JOB_STRIPED/copy/first >> seen.txt\n\
         cmp $DW_JOB_STRIPED/copy/large/alpha.dat in/large/alpha.dat\n",
    );
    let (out, _) = j.run(&[script.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let seen = std::fs::read_to_string(j.path("seen.txt")).unwrap();
    let md = std::fs::metadata(j.path("in/small/obj-007.txt")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(seen, format!("600 {}\nsmall/obj-000.txt\n", md.mtime()));
}

#[test]
fn a_failing_job_still_stages_out_tears_down_and_returns_its_status() {
    if skip_without_fuse("a_failing_job_still_stages_out_tears_down_and_returns_its_status") {
        return;
    }
    let j = Job::new("fail");
    let script = j.script(
        "job.sh",
        "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=128MiB\n\
         #DW stage_out type=file source=$DW_JOB_STRIPED/partial.txt destination=out/partial.txt\n\
         echo 'half done' > $DW_JOB_STRIPED/partial.txt\nexit 3\n",
    );
    let (out, rep) = j.run(&[script.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(j.path("out/partial.txt")).unwrap(),
        "half done\n"
    );
    assert_eq!(rep["job_status"], 3);
    // Everything was torn down: no mount left (under this run's own directory: other tests'
    // sessions have the same ids), no server left.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let run_dir = stderr
        .lines()
        .find(|l| l.contains("surge run: mount"))
        .and_then(|l| l.split(" under ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("the mount phase names its directory: {stderr}"));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(run_dir),
        "a mount was left under {run_dir}"
    );
    let leftover = Command::new("pgrep")
        .args(["-f", &j.fast.path().display().to_string()])
        .output()
        .unwrap();
    assert!(
        leftover.stdout.is_empty(),
        "processes left: {}",
        String::from_utf8_lossy(&leftover.stdout)
    );
}

#[test]
fn a_failed_stage_out_keeps_the_instance_and_names_the_files() {
    if skip_without_fuse("a_failed_stage_out_keeps_the_instance_and_names_the_files") {
        return;
    }
    let j = Job::new("sofail");
    std::fs::write(j.path("blocker"), b"a file where a directory is needed").unwrap();
    let script = j.script(
        "job.sh",
        "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=128MiB\n\
         #DW stage_out type=file source=$DW_JOB_STRIPED/good.txt destination=ok/good.txt\n\
         #DW stage_out type=file source=$DW_JOB_STRIPED/result.txt destination=blocker/result.txt\n\
         echo good > $DW_JOB_STRIPED/good.txt\necho precious > $DW_JOB_STRIPED/result.txt\n",
    );
    let (out, rep) = j.run(&[script.to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("result.txt"),
        "the failed file is named:\n{err}"
    );
    assert!(
        rep["kept_instance"].as_u64().is_some(),
        "instance kept: {rep}"
    );
    assert_eq!(
        std::fs::read_to_string(j.path("ok/good.txt")).unwrap(),
        "good\n"
    );
}

#[test]
fn a_persistent_instance_outlives_jobs_and_cannot_be_destroyed_while_in_use() {
    if skip_without_fuse("a_persistent_instance_outlives_jobs_and_cannot_be_destroyed_while_in_use")
    {
        return;
    }
    let j = Job::new("persist");
    let first = j.script(
        "first.sh",
        "#!/bin/bash\n#BB create_persistent name=keep capacity=128MiB access_mode=striped type=scratch\n\
         #DW persistentdw name=keep\n\
         echo 'from the first job' > $DW_PERSISTENT_STRIPED_keep/note.txt\n",
    );
    let (out, _) = j.run(&[first.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let second = j.script(
        "second.sh",
        "#!/bin/bash\n#DW persistentdw name=keep\n\
         cat $DW_PERSISTENT_STRIPED_keep/note.txt > seen.txt\n\
         if surge persistent destroy keep 2> destroy.err; then echo destroyed > destroy.out; fi\n",
    );
    let mut cmd_out = j.command();
    let path = format!(
        "{}:{}",
        Path::new(SURGE).parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    cmd_out.env("PATH", &path);
    let out = cmd_out.arg("run").arg(&second).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(j.path("seen.txt")).unwrap(),
        "from the first job\n"
    );
    assert!(
        !j.path("destroy.out").exists(),
        "destroy must be refused while a job uses it"
    );
    assert!(std::fs::read_to_string(j.path("destroy.err"))
        .unwrap()
        .contains("in use"));
    let third = j.script(
        "third.sh",
        "#!/bin/bash\n#BB destroy_persistent name=keep\ntrue\n",
    );
    let (out, _) = j.run(&[third.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let fourth = j.script(
        "fourth.sh",
        "#!/bin/bash\n#DW persistentdw name=keep\ntrue\n",
    );
    let (out, _) = j.run(&[fourth.to_str().unwrap()]);
    assert!(!out.status.success(), "the instance is gone");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("keep"),
        "{}",
        text(&out)
    );
}

/// A persistent cache instance (`#BB create_persistent ... type=cache pfs=DIR`): filled from
/// its PFS directory when it is made; each job that attaches it reads PFS files through it and
/// its changes are on the PFS when the job ends (drained by the job); destroying it drains
/// first and removes the drain's extra names.
#[test]
fn a_persistent_cache_is_filled_once_drained_by_each_job_and_before_it_goes() {
    if skip_without_fuse("a_persistent_cache_is_filled_once_drained_by_each_job_and_before_it_goes")
    {
        return;
    }
    let j = Job::new("pcache");
    let pfs = j.path("pfs");
    std::fs::create_dir_all(&pfs).unwrap();
    let old: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(pfs.join("old.dat"), &old).unwrap();
    let create = j.script(
        "create.sh",
        &format!(
            "#!/bin/bash\n#BB create_persistent name=ckpt capacity=256MiB access_mode=striped \
             type=cache pfs={}\ntrue\n",
            pfs.display()
        ),
    );
    let (out, _) = j.run(&[create.to_str().unwrap()]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("ckpt from") && t.contains("1 files"),
        "the fill: {t}"
    );

    let new: Vec<u8> = (0..5_000_000u32).map(|i| (i % 241) as u8).collect();
    std::fs::write(j.path("new.dat"), &new).unwrap();
    let use1 = j.script(
        "use1.sh",
        &format!(
            "#!/bin/bash\n#DW persistentdw name=ckpt\nset -e\nc=$DW_PERSISTENT_STRIPED_ckpt\n\
             cmp $c/old.dat {p}/old.dat\n\
             cp new.dat $c/new.dat\n\
             echo more >> $c/old.dat\n\
             mkdir $c/run1 && echo one > $c/run1/a.txt\n",
            p = pfs.display()
        ),
    );
    let (out, _) = j.run(&[use1.to_str().unwrap()]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    // On the PFS when the job ends.
    assert_eq!(std::fs::read(pfs.join("new.dat")).unwrap(), new, "{t}");
    let mut grown = old.clone();
    grown.extend_from_slice(b"more\n");
    assert_eq!(std::fs::read(pfs.join("old.dat")).unwrap(), grown);
    assert_eq!(
        std::fs::read_to_string(pfs.join("run1/a.txt")).unwrap(),
        "one\n"
    );
    // The fill's names stay for the next job (old.dat's fill name was replaced by its copy).
    assert!(pfs.join(".surge-through").is_dir(), "{t}");

    let use2 = j.script(
        "use2.sh",
        "#!/bin/bash\n#DW persistentdw name=ckpt\nset -e\n\
         c=$DW_PERSISTENT_STRIPED_ckpt\n\
         cmp $c/new.dat new.dat\n\
         test \"$(cat $c/run1/a.txt)\" = one\n\
         mv $c/run1 $c/run2\n\
         echo two > $c/run2/b.txt\n",
    );
    let (out, _) = j.run(&[use2.to_str().unwrap()]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert_eq!(
        std::fs::read_to_string(pfs.join("run2/a.txt")).unwrap(),
        "one\n"
    );
    assert_eq!(
        std::fs::read_to_string(pfs.join("run2/b.txt")).unwrap(),
        "two\n"
    );
    assert!(
        !pfs.join("run1").exists(),
        "the rename reached the PFS: {t}"
    );

    let destroy = j.script(
        "destroy.sh",
        "#!/bin/bash\n#BB destroy_persistent name=ckpt\ntrue\n",
    );
    let (out, _) = j.run(&[destroy.to_str().unwrap()]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("destroy persistent"), "{t}");
    assert!(
        !pfs.join(".surge-through").exists(),
        "the drain's names went with the instance: {t}"
    );
    let ls = j
        .command()
        .args(["persistent", "ls", "--json"])
        .output()
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&ls.stdout).unwrap(),
        serde_json::json!([]),
        "{}",
        text(&ls)
    );
}

/// Two jobs attach one persistent cache at the same time (one manager): each drains it, one
/// at a time (the drainer hold: the other waits for the holder), and each job's files are on
/// the PFS byte for byte when that job ends.
#[test]
fn two_jobs_attaching_one_persistent_cache_at_once_both_find_their_files_on_the_pfs() {
    if skip_without_fuse(
        "two_jobs_attaching_one_persistent_cache_at_once_both_find_their_files_on_the_pfs",
    ) {
        return;
    }
    let s = Scratch::new("pcache2");
    let c = cluster(2, "1GiB");
    let m = Manager::start(s.path());
    m.register(&c);
    let j = Job::new("pcache2");
    let pfs = j.path("pfs");
    std::fs::create_dir_all(&pfs).unwrap();
    let run = |script: &Path| {
        let mut cmd = j.command();
        cmd.env("SURGE_MANAGER", &m.grpc)
            .env("SURGE_MUNGE_SOCKET", surge_testkit::munge_socket())
            .arg("run")
            .arg(script);
        cmd
    };
    let create = j.script(
        "create.sh",
        &format!(
            "#!/bin/bash\n#BB create_persistent name=shared capacity=512MiB access_mode=striped \
             type=cache pfs={}\ntrue\n",
            pfs.display()
        ),
    );
    let out = run(&create).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let job = |tag: &str| {
        j.script(
            &format!("{tag}.sh"),
            &format!(
                "#!/bin/bash\n#DW persistentdw name=shared\nset -e\nc=$DW_PERSISTENT_STRIPED_shared\n\
                 mkdir -p mine.{tag}\n\
                 for i in $(seq 12); do\n\
                   head -c 1500000 /dev/urandom > mine.{tag}/$i\n\
                   cp mine.{tag}/$i $c/{tag}$i\n\
                   sleep 0.1\n\
                 done\n"
            ),
        )
    };
    let (a, b) = (job("a"), job("b"));
    let ja = run(&a)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let jb = run(&b)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for (tag, child) in [("a", ja), ("b", jb)] {
        let out = child.wait_with_output().unwrap();
        let t = text(&out);
        assert!(out.status.success(), "job {tag}: {t}");
        for i in 1..=12 {
            assert_eq!(
                std::fs::read(pfs.join(format!("{tag}{i}"))).ok(),
                std::fs::read(j.path(&format!("mine.{tag}/{i}"))).ok(),
                "job {tag}'s file {i} is not on the PFS as written when the job ended: {t}"
            );
        }
    }
    let destroy = j.script(
        "destroy.sh",
        "#!/bin/bash\n#BB destroy_persistent name=shared\ntrue\n",
    );
    let out = run(&destroy).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(!pfs.join(".surge-through").exists());
}

#[test]
fn persistent_and_session_commands_work_outside_jobs_in_the_embedded_default() {
    let j = Job::new("views");
    let first = j.script(
        "make.sh",
        "#!/bin/bash\n#BB create_persistent name=kept capacity=64MiB access_mode=striped type=scratch\ntrue\n",
    );
    let (out, _) = j.run(&[first.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    // No manager given: the commands use the embedded default's state.
    let surge = |args: &[&str]| {
        let o = j.command().args(args).output().unwrap();
        assert!(o.status.success(), "surge {args:?}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    let ls: serde_json::Value =
        serde_json::from_str(&surge(&["persistent", "ls", "--json"])).unwrap();
    assert_eq!(ls[0]["name"], "kept", "{ls}");
    let sessions: serde_json::Value =
        serde_json::from_str(&surge(&["session", "ls", "--all", "--json"])).unwrap();
    assert_eq!(sessions[0]["job"], "make.sh", "{sessions}");
    assert!(surge(&["persistent", "destroy", "kept"]).contains("kept"));
    let ls: serde_json::Value =
        serde_json::from_str(&surge(&["persistent", "ls", "--json"])).unwrap();
    assert_eq!(ls, serde_json::json!([]));
    let left = Command::new("pgrep")
        .args(["-f", &j.fast.path().display().to_string()])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "the manager and servers started for the commands stopped"
    );
}

#[test]
fn private_namespaces_are_per_node_and_striped_ones_are_shared() {
    if skip_without_fuse("private_namespaces_are_per_node_and_striped_ones_are_shared") {
        return;
    }
    let j = Job::new("nodes");
    let path = format!(
        "{}:{}",
        Path::new(SURGE).parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let private = j.script(
        "private.sh",
        "#!/bin/bash\n#DW jobdw type=scratch access_mode=private capacity=128MiB\nset -e\n\
         echo node0 > $DW_JOB_PRIVATE/mine\n\
         surge exec --node 1 -- sh -c 'test ! -e \"$DW_JOB_PRIVATE/mine\" && echo node1 > \"$DW_JOB_PRIVATE/mine\"'\n\
         cat $DW_JOB_PRIVATE/mine > private.txt\n\
         surge exec --node 1 -- sh -c 'cat \"$DW_JOB_PRIVATE/mine\"' >> private.txt\n",
    );
    let out = j
        .command()
        .env("PATH", &path)
        .args(["run", "--nodes", "2"])
        .arg(&private)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(j.path("private.txt")).unwrap(),
        "node0\nnode1\n"
    );
    let striped = j.script(
        "striped.sh",
        "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=128MiB\nset -e\n\
         echo shared > $DW_JOB_STRIPED/common\n\
         surge exec --node 1 -- sh -c 'cat \"$DW_JOB_STRIPED/common\"; test \"$SURGE_NODE\" = 1' > striped.txt\n",
    );
    let out = j
        .command()
        .env("PATH", &path)
        .args(["run", "--nodes", "2"])
        .arg(&striped)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(j.path("striped.txt")).unwrap(),
        "shared\n"
    );
}

/// `type=cache`: the job sees the PFS directory's files, and after it everything it changed
/// (new files, a rewrite, a rename, a removal, a new directory) is on the PFS, byte-identical.
#[test]
fn a_cache_instance_mirrors_its_pfs_directory_and_drains_every_change() {
    if skip_without_fuse("a_cache_instance_mirrors_its_pfs_directory_and_drains_every_change") {
        return;
    }
    let j = Job::new("cache");
    let pfs = j.path("pfs");
    std::fs::create_dir_all(pfs.join("in")).unwrap();
    let input: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(pfs.join("in/input.dat"), &input).unwrap();
    std::fs::write(pfs.join("old.txt"), "old\n").unwrap();
    std::fs::write(pfs.join("gone.txt"), "gone\n").unwrap();
    use std::os::unix::fs::MetadataExt;
    let input_ino = std::fs::metadata(pfs.join("in/input.dat")).unwrap().ino();
    let script = j.script(
        "cache.sh",
        &format!(
            "#!/bin/bash\n#DW jobdw type=cache access_mode=striped capacity=256MiB pfs={}\nset -e\n\
             c=$DW_JOB_STRIPED_CACHE\n\
             cmp $c/in/input.dat {}/in/input.dat\n\
             mkdir -p $c/out/deep\n\
             for i in 1 2 3; do head -c 2000000 $c/in/input.dat | tail -c $((i * 500000)) > $c/out/deep/part.$i; done\n\
             echo new > $c/old.txt\n\
             mv $c/out/deep/part.1 $c/out/first\n\
             rm $c/gone.txt\n\
             chmod 600 $c/out/first\n\
             surge stage wait --drained\n\
             cmp $c/out/first {}/out/first && test ! -e {}/gone.txt\n\
             cd $c && find . -type f | sort | xargs sha256sum > {}/inside.sums\n",
            pfs.display(),
            pfs.display(),
            pfs.display(),
            pfs.display(),
            j.path("").display()
        ),
    );
    let out = j.command().args(["run"]).arg(&script).output().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("surge run: fill") && t.contains("surge run: drain"),
        "{t}"
    );
    let on_pfs = std::process::Command::new("sh")
        .arg("-c")
        .arg("find . -type f ! -name '.*' | sort | xargs sha256sum")
        .current_dir(&pfs)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&on_pfs.stdout),
        std::fs::read_to_string(j.path("inside.sums")).unwrap(),
        "the PFS directory after the job differs from what the job saw"
    );
    assert!(!pfs.join("gone.txt").exists());
    assert_eq!(
        std::fs::read_to_string(pfs.join("old.txt")).unwrap(),
        "new\n"
    );
    // The fill's own writes are not drained back: an input the job only read is the same file.
    assert_eq!(
        std::fs::metadata(pfs.join("in/input.dat")).unwrap().ino(),
        input_ino,
        "the job's input was copied back to the PFS\n{t}"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(pfs.join("out/first"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
}

/// `fsync=pfs`: a file the job fsyncs is on the PFS when fsync returns (with the default
/// `fsync=tier` the drain holds a file written in the last 2 s back, so the `cmp` right after
/// the fsync would fail).
#[test]
fn fsync_pfs_puts_a_file_on_the_pfs_before_fsync_returns() {
    if skip_without_fuse("fsync_pfs_puts_a_file_on_the_pfs_before_fsync_returns") {
        return;
    }
    let j = Job::new("fsyncpfs");
    let pfs = j.path("pfs");
    std::fs::create_dir_all(&pfs).unwrap();
    let script = j.script(
        "fsync.sh",
        &format!(
            "#!/bin/bash\n#DW jobdw type=cache access_mode=striped capacity=64MiB pfs={p} fsync=pfs\nset -e\n\
             head -c 3000000 /dev/urandom > {tmp}\n\
             dd if={tmp} of=$DW_JOB_STRIPED_CACHE/ckpt bs=1M conv=fsync status=none\n\
             cmp {tmp} {p}/ckpt\n",
            p = pfs.display(),
            tmp = j.path("ckpt.src").display()
        ),
    );
    let out = j.command().args(["run"]).arg(&script).output().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert_eq!(
        std::fs::read(pfs.join("ckpt")).unwrap(),
        std::fs::read(j.path("ckpt.src")).unwrap()
    );
}

/// Liu's fall-back under `surge run`: a cache job writing three times its instance's capacity
/// (one file larger than the whole tier, two more beside it at once, one renamed) succeeds, and
/// the PFS holds every byte after the job.
#[test]
fn a_cache_job_writing_more_than_its_capacity_falls_back_to_the_pfs() {
    if skip_without_fuse("a_cache_job_writing_more_than_its_capacity_falls_back_to_the_pfs") {
        return;
    }
    let j = Job::new("cachefull");
    let pfs = j.path("pfs");
    std::fs::create_dir_all(&pfs).unwrap();
    let src = j.path("src");
    std::fs::create_dir_all(&src).unwrap();
    for (name, mib) in [("a", 100u64), ("b", 50), ("c", 50)] {
        let data: Vec<u8> = (0..mib << 20)
            .map(|i| ((i * 2654435761) >> 13) as u8 ^ name.as_bytes()[0])
            .collect();
        std::fs::write(src.join(name), data).unwrap();
    }
    let script = j.script(
        "full.sh",
        &format!(
            "#!/bin/bash\n#DW jobdw type=cache access_mode=striped capacity=64MiB pfs={p} \
             passthrough=off\nset -e\n\
             c=$DW_JOB_STRIPED_CACHE\n\
             dd if={s}/b of=$c/b bs=1M status=none & dd if={s}/c of=$c/c bs=1M status=none &\n\
             dd if={s}/a of=$c/a.tmp bs=1M status=none\n\
             wait\n\
             mv $c/a.tmp $c/a\n\
             for f in a b c; do cmp {s}/$f $c/$f; done\n",
            p = pfs.display(),
            s = src.display()
        ),
    );
    let out = j.command().args(["run"]).arg(&script).output().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for f in ["a", "b", "c"] {
        assert!(
            std::fs::read(pfs.join(f)).unwrap() == std::fs::read(src.join(f)).unwrap(),
            "{f} on the PFS differs from what the job wrote\n{t}"
        );
    }
    assert!(!pfs.join("a.tmp").exists());
    assert!(
        !pfs.join(".surge-through").exists(),
        "the stable names are removed after the drain"
    );
}

/// `type=cache` (`passthrough=on`, the default): a file opened while the tier has room is written by the
/// kernel straight into its tier object (`surge run`, which answers the mount, moves none of
/// its bytes while it is open); a file opened once the tier is full goes through the mount,
/// which falls back to the PFS; everything is on the PFS byte-identical after the job.
#[test]
fn a_cache_job_with_passthrough_on_writes_by_the_kernel_while_the_tier_has_room() {
    if skip_without_fuse(
        "a_cache_job_with_passthrough_on_writes_by_the_kernel_while_the_tier_has_room",
    ) {
        return;
    }
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: kernel passthrough of a job's own mount needs root (this test runs as uid {})", unsafe { libc::geteuid() });
        return;
    }
    let j = Job::new("cachept");
    let pfs = j.path("pfs");
    std::fs::create_dir_all(&pfs).unwrap();
    let src = j.path("src");
    std::fs::create_dir_all(&src).unwrap();
    for (name, mib) in [("a", 80u64), ("b", 40)] {
        let data: Vec<u8> = (0..mib << 20)
            .map(|i| ((i * 2654435761) >> 11) as u8 ^ name.as_bytes()[0])
            .collect();
        std::fs::write(src.join(name), data).unwrap();
    }
    // Each file is written through descriptor 3, held open while the bytes `surge run` read
    // and wrote are counted (its drain starts at the close).
    let script = j.script(
        "pt.sh",
        &format!(
            "#!/bin/bash\n#DW jobdw type=cache access_mode=striped capacity=64MiB pfs={p}\n\
             set -e\nc=$DW_JOB_STRIPED_CACHE\n\
             [ \"$(cat /proc/$PPID/comm)\" = surge ] || {{ echo \"parent is $(cat /proc/$PPID/comm)\"; exit 3; }}\n\
             io() {{ awk '$1==\"rchar:\"{{r=$2}} $1==\"wchar:\"{{w=$2}} END{{print r+w}}' /proc/$PPID/io; }}\n\
             for f in a b; do\n\
               exec 3>$c/$f; x=$(io); cat {s}/$f >&3; y=$(io); exec 3>&-\n\
               echo \"moved $f $((y - x))\"\n\
               cmp {s}/$f $c/$f\n\
             done\n",
            p = pfs.display(),
            s = src.display()
        ),
    );
    let out = j.command().args(["run"]).arg(&script).output().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let moved = |f: &str| -> u64 {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("moved {f} ")))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no 'moved {f}' line: {t}"))
    };
    // a: opened on an empty tier, by passthrough (the process's own chatter is a few KiB).
    assert!(moved("a") < 4 << 20, "a went through surge run: {t}");
    // b: opened with a (80 MiB) on a 64 MiB tier: through the mount, to the PFS.
    assert!(
        moved("b") >= 40 << 20,
        "b did not go through surge run: {t}"
    );
    for f in ["a", "b"] {
        assert!(
            std::fs::read(pfs.join(f)).unwrap() == std::fs::read(src.join(f)).unwrap(),
            "{f} on the PFS differs from what the job wrote\n{t}"
        );
    }
}

/// `access_mode=ldbalance`: the stage-in is in every replica, each node mounts its own replica
/// (node i: replica i mod replicas) read-only, missing names stay missing, writes are refused.
#[test]
fn ldbalance_replicas_are_read_only_and_spread_over_nodes() {
    if skip_without_fuse("ldbalance_replicas_are_read_only_and_spread_over_nodes") {
        return;
    }
    let j = Job::new("ldbal");
    let path = format!(
        "{}:{}",
        Path::new(SURGE).parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let env = j.path("env/pkg");
    std::fs::create_dir_all(&env).unwrap();
    std::fs::write(env.join("__init__.py"), "").unwrap();
    for i in 0..40 {
        std::fs::write(env.join(format!("m{i}.py")), format!("X = {i}\n")).unwrap();
    }
    let script = j.script(
        "ldbal.sh",
        &format!(
            "#!/bin/bash\n#DW jobdw type=scratch access_mode=ldbalance capacity=64MiB\n\
             #DW stage_in type=directory source={} destination=$DW_JOB_LDBAL/env\nset -e\n\
             surge exec --all -- sh -c '\
               cd \"$DW_JOB_LDBAL\"; \
               v=$(PYTHONPATH=env python3 -c \"import pkg.m7 as m; print(m.X)\"); \
               test ! -e env/pkg/nothing.py && test ! -e env/pkg/nothing.py; \
               if touch env/new 2>/dev/null; then w=writable; else w=refused; fi; \
               ns=$(grep \" $DW_JOB_LDBAL \" /proc/self/mountinfo | sed \"s/.* surge:[0-9]*\\/\\([0-9]*\\) .*/\\1/\"); \
               echo \"$SURGE_NODE $v $w $ns\"' | sort > nodes.txt\n",
            j.path("env").display()
        ),
    );
    let out = j
        .command()
        .env("PATH", &path)
        .args(["run", "--nodes", "3"])
        .arg(&script)
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    // The test pool has 2 servers: 2 replicas for 3 nodes, node 2 reads replica 0.
    assert!(t.contains("replica 2/2"), "{t}");
    assert_eq!(
        std::fs::read_to_string(j.path("nodes.txt")).unwrap(),
        "0 7 refused 0\n1 7 refused 1\n2 7 refused 0\n"
    );
}

/// `access_mode=private` with a `stage_out` of `$DW_JOB_PRIVATE/out`: every node's files reach
/// the PFS (node 1's were lost before: only namespace 0 was staged out, and the run said
/// nothing); a path two nodes both wrote is refused before anything is copied, names the path
/// and keeps the instance.
#[test]
fn private_stage_out_takes_every_nodes_files_and_refuses_collisions() {
    if skip_without_fuse("private_stage_out_takes_every_nodes_files_and_refuses_collisions") {
        return;
    }
    let j = Job::new("privout");
    let path = format!(
        "{}:{}",
        Path::new(SURGE).parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run = |name: &str, body: &str| {
        let script = j.script(
            name,
            &format!(
                "#!/bin/bash\n#DW jobdw type=scratch access_mode=private capacity=128MiB\n\
                 #DW stage_out type=directory source=$DW_JOB_PRIVATE/out destination={name}.results\n\
                 set -e\n{body}"
            ),
        );
        let report = j.path(&format!("{name}.report.json"));
        let out = j
            .command()
            .env("PATH", &path)
            .args(["run", "--nodes", "2", "--report"])
            .arg(&report)
            .arg(&script)
            .output()
            .unwrap();
        let rep: serde_json::Value = std::fs::read_to_string(&report)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(serde_json::Value::Null);
        (out, rep)
    };
    let (out, _) = run(
        "merge",
        "mkdir -p $DW_JOB_PRIVATE/out/sub && echo zero > $DW_JOB_PRIVATE/out/sub/node0.txt\n\
         surge exec --node 1 -- sh -c 'mkdir -p \"$DW_JOB_PRIVATE/out/sub\" && echo one > \"$DW_JOB_PRIVATE/out/sub/node1.txt\"'\n",
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(j.path("merge.results/sub/node0.txt")).unwrap(),
        "zero\n"
    );
    assert_eq!(
        std::fs::read_to_string(j.path("merge.results/sub/node1.txt")).unwrap(),
        "one\n",
        "node 1's output reached the PFS"
    );
    let (out, rep) = run(
        "clash",
        "mkdir -p $DW_JOB_PRIVATE/out && echo zero > $DW_JOB_PRIVATE/out/same.txt\n\
         surge exec --node 1 -- sh -c 'mkdir -p \"$DW_JOB_PRIVATE/out\" && echo one > \"$DW_JOB_PRIVATE/out/same.txt\"'\n",
    );
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("same.txt") && err.contains("nodes [0, 1]"),
        "{err}"
    );
    assert!(
        !j.path("clash.results/same.txt").exists(),
        "nothing half-copied"
    );
    assert!(
        rep["kept_instance"].as_u64().is_some(),
        "instance kept: {rep}"
    );
}

/// A script that would leave a marker if it ran.
fn rejected(tag: &str, directives: &str, want: &[&str]) {
    let j = Job::new(tag);
    let script = j.script("job.sh", &format!("#!/bin/bash\n{directives}\ntouch ran\n"));
    let (out, _) = j.run(&[script.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    for w in want {
        assert!(err.contains(w), "error mentions {w:?}:\n{err}");
    }
    assert!(!j.path("ran").exists(), "the job must not run");
    // Nothing was allocated: the embedded manager was never started.
    assert!(
        !j.fast.path().join("state").exists(),
        "nothing may be allocated"
    );
}

#[test]
fn bad_directives_allocate_nothing_and_run_nothing() {
    rejected(
        "bad1",
        "#DW jobdw type=scratch access_mode=striped capacity=10XB",
        &["job.sh:2", "capacity=10XB"],
    );
    rejected(
        "bad2",
        "#DW jobdw type=cache access_mode=striped capacity=1GiB",
        &["job.sh:2", "needs pfs=DIR"],
    );
    rejected(
        "bad3",
        "#DW jobdw type=scratch access_mode=ldbalance capacity=1GiB\n\
         #DW stage_out type=file source=$DW_JOB_LDBAL/x destination=/tmp/x",
        &["job.sh:3", "read-only"],
    );
    rejected(
        "bad4",
        "#DW jobdw type=scratch capacity=1GiB",
        &["job.sh:2", "access_mode"],
    );
    rejected(
        "bad5",
        "#DW jobdw type=scratch access_mode=striped capacity=1GiB\n#DW stage_in type=file source=x destination=/tmp/y",
        &["job.sh:3", "destination"],
    );
    rejected("bad6", "#DW swap 1GiB", &["job.sh:2", "swap"]);
}

#[test]
fn a_script_with_crlf_line_endings_is_refused_naming_the_line() {
    let j = Job::new("crlf");
    let script = j.script(
        "job.sh",
        "#!/bin/bash\r\n#DW jobdw type=scratch access_mode=striped capacity=64MiB\r\ntouch ran\r\n",
    );
    let (out, _) = j.run(&[script.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    for w in ["job.sh:1", "#!/bin/bash\\r", "CRLF", "sed -i"] {
        assert!(err.contains(w), "error mentions {w:?}:\n{err}");
    }
    assert!(!j.path("ran").exists(), "the job must not run");
    assert!(
        !j.fast.path().join("state").exists(),
        "nothing may be allocated"
    );
}

#[test]
fn a_missing_source_fails_before_the_job_runs() {
    rejected(
        "missing",
        "#DW jobdw type=scratch access_mode=striped capacity=64MiB\n\
         #DW stage_in type=directory source=does-not-exist destination=$DW_JOB_STRIPED/in",
        &["job.sh:3", "does-not-exist", "missing"],
    );
}

#[test]
fn a_stage_in_larger_than_the_instance_fails_before_copying() {
    let j = Job::new("toobig");
    std::fs::write(j.path("big.dat"), vec![1u8; 3 << 20]).unwrap();
    let script = j.script(
        "job.sh",
        "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=2MiB\n\
         #DW stage_in type=file source=big.dat destination=$DW_JOB_STRIPED/big.dat\ntouch ran\n",
    );
    let (out, _) = j.run(&[script.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not fit"),
        "{}",
        text(&out)
    );
    assert!(!j.path("ran").exists());
}

#[test]
fn the_manager_keeps_its_state_across_a_restart() {
    let s = Scratch::new("mgr");
    let c = cluster(2, "1GiB");
    let start_manager = || {
        let m = Manager::start(s.path());
        let (grpc, http) = (m.grpc.clone(), m.http.clone());
        (m, grpc, http)
    };
    let (m, addr, _) = start_manager();
    for srv in &c.servers {
        surge(&["server", "register", &srv.addr, "--manager", &addr]);
    }
    surge(&[
        "pool",
        "create",
        "fast",
        "--granularity",
        "32MiB",
        "--manager",
        &addr,
    ]);
    surge(&[
        "persistent",
        "create",
        "survivor",
        "--capacity",
        "100MiB",
        "--manager",
        &addr,
    ]);
    drop(m);
    let (m, addr, http) = start_manager();
    let pools: serde_json::Value =
        serde_json::from_str(&surge(&["pool", "ls", "--json", "--manager", &addr])).unwrap();
    let names: Vec<&str> = pools
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"fast") && names.contains(&"default"),
        "{pools}"
    );
    let p: serde_json::Value =
        serde_json::from_str(&surge(&["persistent", "ls", "--json", "--manager", &addr])).unwrap();
    assert_eq!(p[0]["name"], "survivor");
    assert_eq!(
        p[0]["fragments"], 2,
        "100 MiB at 64 MiB granularity: 2 fragments on 2 servers"
    );
    // The JSON/HTTP read API serves the same view to its owner (with a view token), and
    // nothing to a caller who does not say who they are.
    use std::io::{Read, Write};
    let get = |auth: &str| {
        let mut s = std::net::TcpStream::connect(&http).unwrap();
        write!(
            s,
            "GET /v1/instances HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
        )
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        resp
    };
    let view: serde_json::Value =
        serde_json::from_str(&surge(&["dashboard", "--json", "--manager", &addr])).unwrap();
    let token = view["token"].as_str().unwrap();
    let resp = get(&format!("Authorization: Bearer {token}\r\n"));
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains("\"survivor\""), "{resp}");
    let resp = get("");
    assert!(resp.starts_with("HTTP/1.1 401"), "{resp}");
    assert!(
        !resp.contains("survivor") && resp.contains("MUNGE"),
        "{resp}"
    );
    surge(&["persistent", "destroy", "survivor", "--manager", &addr]);
    let listing: serde_json::Value = serde_json::from_str(&surge(
        &[
            &["server", "status", "--json"][..],
            &c.addrs().iter().map(String::as_str).collect::<Vec<_>>(),
        ]
        .concat(),
    ))
    .unwrap();
    for srv in listing.as_array().unwrap() {
        assert_eq!(
            srv["fragments"].as_array().map(Vec::len),
            Some(0),
            "destroyed everywhere: {srv}"
        );
    }
    drop(m);
}

#[test]
fn ctrl_c_stops_the_job_and_tears_everything_down() {
    if skip_without_fuse("ctrl_c_stops_the_job_and_tears_everything_down") {
        return;
    }
    let j = Job::new("ctrlc");
    let script = j.script(
        "job.sh",
        "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=64MiB\n\
         #DW stage_out type=file source=$DW_JOB_STRIPED/x destination=out/x\n\
         echo data > $DW_JOB_STRIPED/x\ntouch started\nsleep 60\ntouch finished\n",
    );
    let mut child = ChildGuard(j.command().arg("run").arg(&script).spawn().unwrap());
    wait_for("job start", std::time::Duration::from_secs(30), || {
        j.path("started").exists().then_some(())
    });
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.0.id() as i32, libc::SIGINT) };
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed().as_secs() < 30,
            "surge run did not stop after SIGINT"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(130));
    assert!(!j.path("finished").exists(), "the job was stopped");
    assert!(!j.path("out/x").exists(), "no stage-out after an interrupt");
    let leftover = Command::new("pgrep")
        .args(["-f", &j.fast.path().display().to_string()])
        .output()
        .unwrap();
    assert!(
        leftover.stdout.is_empty(),
        "processes left: {}",
        String::from_utf8_lossy(&leftover.stdout)
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&format!("-{}/", child.0.id())),
        "a mount was left:\n{mounts}"
    );
}

#[test]
fn staging_from_inside_a_job_with_surge_stage() {
    if skip_without_fuse("staging_from_inside_a_job_with_surge_stage") {
        return;
    }
    let j = Job::new("instage");
    std::fs::write(j.path("input.dat"), vec![7u8; 5 << 20]).unwrap();
    std::fs::create_dir_all(j.path("tree/sub")).unwrap();
    std::fs::write(j.path("tree/sub/a.txt"), b"a").unwrap();
    // `surge` is found on the job's PATH (this PATH does not have it) and the manager's HTTP
    // API is named in the job's environment.
    let path = "/usr/local/bin:/usr/bin:/bin";
    let script = j.script(
        "job.sh",
        "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=128MiB\nset -e\n\
         exec 3<>/dev/tcp/${SURGE_MANAGER_HTTP%:*}/${SURGE_MANAGER_HTTP##*:}\n\
         printf 'GET /v1/sessions HTTP/1.0\\r\\nAuthorization: MUNGE %s\\r\\n\\r\\n' \
         \"$(munge -n -S $SURGE_MUNGE_SOCKET)\" >&3\n\
         cat <&3 > sessions.http\n\
         id=$(surge stage in input.dat $DW_JOB_STRIPED/input.dat)\n\
         surge stage in --directory --wait tree $DW_JOB_STRIPED/tree > /dev/null\n\
         surge stage wait $id\n\
         cmp input.dat $DW_JOB_STRIPED/input.dat\n\
         test \"$(cat $DW_JOB_STRIPED/tree/sub/a.txt)\" = a\n\
         echo result > $DW_JOB_STRIPED/result.txt\n\
         surge stage out --wait $DW_JOB_STRIPED/result.txt out/result.txt > /dev/null\n\
         surge stage status --json > status.json\n\
         if surge stage in missing-file $DW_JOB_STRIPED/m 2> missing.err; then exit 9; fi\n\
         echo draft > $DW_JOB_STRIPED/late.txt\n\
         surge stage out --at-job-end $DW_JOB_STRIPED/late.txt out/late.txt > /dev/null\n\
         echo final > $DW_JOB_STRIPED/late.txt\n",
    );
    let out = j
        .command()
        .env("PATH", path)
        .arg("run")
        .arg(&script)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(j.path("out/result.txt")).unwrap(),
        "result\n"
    );
    let st: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(j.path("status.json")).unwrap()).unwrap();
    let tasks = st.as_array().unwrap();
    assert_eq!(tasks.len(), 3, "{st}");
    assert!(tasks.iter().all(|t| t["state"] == "done"), "{st}");
    assert_eq!(tasks[0]["bytes_done"], 5 << 20);
    let err = std::fs::read_to_string(j.path("missing.err")).unwrap();
    assert!(
        err.contains("missing-file"),
        "a missing source is named: {err}"
    );
    let http = std::fs::read_to_string(j.path("sessions.http")).unwrap();
    assert!(
        http.starts_with("HTTP/1.") && http.contains(" 200 ") && http.contains("job.sh"),
        "$SURGE_MANAGER_HTTP answers /v1/sessions: {http}"
    );
    // Deferred to the job's end: the content at the end.
    assert_eq!(
        std::fs::read_to_string(j.path("out/late.txt")).unwrap(),
        "final\n"
    );
}

#[test]
fn surge_run_uses_a_configured_manager_and_its_servers() {
    if skip_without_fuse("surge_run_uses_a_configured_manager_and_its_servers") {
        return;
    }
    let s = Scratch::new("cfgmgr");
    let c = cluster(2, "1GiB");
    let _m = Manager::start(s.path());
    _m.register(&c);
    let addr = _m.grpc.clone();
    let j = Job::new("cfg");
    let script = j.script(
        "job.sh",
        "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=200MiB\n\
         echo hi > $DW_JOB_STRIPED/x && cat $DW_JOB_STRIPED/x > seen.txt && echo $SURGE_MANAGER > mgr.txt\n",
    );
    let out = j
        .command()
        .env("SURGE_MANAGER", &addr)
        .env("SURGE_MUNGE_SOCKET", surge_testkit::munge_socket())
        .arg("run")
        .arg(&script)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(j.path("seen.txt")).unwrap(), "hi\n");
    assert_eq!(
        std::fs::read_to_string(j.path("mgr.txt")).unwrap().trim(),
        addr
    );
    assert!(
        !j.fast.path().join("state").exists(),
        "no embedded manager was started"
    );
    let sessions: serde_json::Value = serde_json::from_str(&surge(&[
        "session",
        "ls",
        "--all",
        "--json",
        "--manager",
        &addr,
    ]))
    .unwrap();
    assert_eq!(sessions[0]["state"], "ended", "{sessions}");
    // Liveness: a server that stops is marked down.
    let mut c = c;
    c.servers[1].kill9();
    wait_for(
        "server marked down",
        std::time::Duration::from_secs(20),
        || {
            let p: serde_json::Value =
                serde_json::from_str(&surge(&["pool", "ls", "--json", "--manager", &addr])).ok()?;
            (p[0]["servers_up"] == 1).then_some(())
        },
    );
}

/// The lazy fill of `type=cache`: the fill copies nothing (the job's first read of a PFS file
/// goes to the PFS and copies the file into the tier behind it, after which reads come from
/// the tier), a file the job only reads stays the same PFS file, and files changed in place
/// (appended to, overwritten in the middle, truncated) are on the PFS exactly as changed
/// after the job; a second node reads the same bytes.
#[test]
fn a_cache_reads_pfs_files_lazily_and_copies_them_in_before_a_change() {
    if skip_without_fuse("a_cache_reads_pfs_files_lazily_and_copies_them_in_before_a_change") {
        return;
    }
    let j = Job::new("lazy");
    let path = format!(
        "{}:{}",
        Path::new(SURGE).parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let pfs = j.path("pfs");
    std::fs::create_dir_all(pfs.join("sub")).unwrap();
    let big: Vec<u8> = (0..24_000_000u64)
        .map(|i| ((i * 2654435761) >> 11) as u8)
        .collect();
    std::fs::write(pfs.join("sub/big.dat"), &big).unwrap();
    std::fs::write(pfs.join("app.log"), "line 1\n").unwrap();
    std::fs::write(pfs.join("middle.txt"), "aaaaaaaaaa").unwrap();
    std::fs::write(pfs.join("cut.txt"), "0123456789").unwrap();
    std::os::unix::fs::symlink("sub/big.dat", pfs.join("link")).unwrap();
    use std::os::unix::fs::MetadataExt;
    let big_ino = std::fs::metadata(pfs.join("sub/big.dat")).unwrap().ino();
    let script = j.script(
        "lazy.sh",
        &format!(
            "#!/bin/bash\n#DW jobdw type=cache access_mode=striped capacity=256MiB pfs={p}\nset -e\n\
             c=$DW_JOB_STRIPED_CACHE\n\
             used() {{ df --output=used -B1 $c | tail -1; }}\n\
             before=$(used)\n\
             cmp $c/link {p}/sub/big.dat\n\
             for i in $(seq 100); do [ $(( $(used) - before )) -ge 24000000 ] && break; sleep 0.1; done\n\
             [ $(( $(used) - before )) -ge 24000000 ] || {{ echo \"not copied into the tier: $before -> $(used)\"; exit 1; }}\n\
             cmp $c/sub/big.dat {p}/sub/big.dat\n\
             surge exec --node 1 -- cmp $c/sub/big.dat {p}/sub/big.dat\n\
             echo 'line 2' >> $c/app.log\n\
             printf XY | dd of=$c/middle.txt bs=1 seek=4 conv=notrunc status=none\n\
             truncate -s 4 $c/cut.txt\n\
             test \"$(cat $c/app.log)\" = \"$(printf 'line 1\\nline 2')\"\n\
             test \"$(cat $c/middle.txt)\" = aaaaXYaaaa\n\
             test \"$(cat $c/cut.txt)\" = 0123\n",
            p = pfs.display()
        ),
    );
    let out = j
        .command()
        .env("PATH", &path)
        .args(["run", "--nodes", "2"])
        .arg(&script)
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("4 files (22.89 MiB) read from the PFS until copied into the tier on first read, 0 copied now"),
        "{t}"
    );
    assert_eq!(std::fs::read(pfs.join("sub/big.dat")).unwrap(), big);
    assert_eq!(
        std::fs::metadata(pfs.join("sub/big.dat")).unwrap().ino(),
        big_ino,
        "a file the job only read was copied back\n{t}"
    );
    assert_eq!(
        std::fs::read_to_string(pfs.join("app.log")).unwrap(),
        "line 1\nline 2\n"
    );
    assert_eq!(
        std::fs::read_to_string(pfs.join("middle.txt")).unwrap(),
        "aaaaXYaaaa"
    );
    assert_eq!(
        std::fs::read_to_string(pfs.join("cut.txt")).unwrap(),
        "0123"
    );
    assert!(!pfs.join(".surge-through").exists());
}

/// A PFS file larger than the whole cache instance: read from the PFS (the copy into the tier
/// finds the tier full and gives up), and appending to it writes it through to the PFS file
/// in place (Liu's fall-back), byte-exact after the job.
#[test]
fn a_pfs_file_larger_than_the_cache_is_read_and_appended_on_the_pfs() {
    if skip_without_fuse("a_pfs_file_larger_than_the_cache_is_read_and_appended_on_the_pfs") {
        return;
    }
    let j = Job::new("lazyfull");
    let pfs = j.path("pfs");
    std::fs::create_dir_all(&pfs).unwrap();
    let mut data: Vec<u8> = (0..100u64 << 20)
        .map(|i| ((i * 2654435761) >> 13) as u8)
        .collect();
    std::fs::write(pfs.join("huge"), &data).unwrap();
    let script = j.script(
        "full.sh",
        &format!(
            "#!/bin/bash\n#DW jobdw type=cache access_mode=striped capacity=64MiB pfs={p}\nset -e\n\
             c=$DW_JOB_STRIPED_CACHE\n\
             cmp $c/huge {p}/huge\n\
             echo tail >> $c/huge\n\
             tail -c 5 $c/huge | grep -q tail\n",
            p = pfs.display()
        ),
    );
    let out = j.command().args(["run"]).arg(&script).output().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    data.extend_from_slice(b"tail\n");
    assert!(
        std::fs::read(pfs.join("huge")).unwrap() == data,
        "the PFS file differs from what the job wrote\n{t}"
    );
}

/// The run directory `surge run` mounted under, from its "mount" phase line.
fn run_dir_of(stderr: &str) -> String {
    stderr
        .lines()
        .find(|l| l.contains("surge run: mount"))
        .and_then(|l| l.split(" under ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .map(|r| r.trim_end_matches(';').to_string())
        .unwrap_or_else(|| panic!("the mount phase names its directory: {stderr}"))
}

/// Ends a process this test made the job start (its pid in `pid_file`), if it still runs.
fn end_pid_in(pid_file: &Path) {
    if let Some(pid) = std::fs::read_to_string(pid_file)
        .ok()
        .and_then(|t| t.trim().parse::<i32>().ok())
    {
        // SAFETY: signalling the one process the job started for this test.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// A job whose mount a process outside it still holds when it ends: `how` starts that process
/// (its pid in `holder.pid`), detached from the job's process group so the end of the job does
/// not kill it. `surge run` must end within a bound, stage out, leave no mount and say what it
/// did (`said`).
fn unmount_is_bounded(tag: &str, how: &str, said: &str) {
    let j = Job::new(tag);
    let pid_file = j.path("holder.pid");
    let script = j.script(
        "job.sh",
        &format!(
            "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=128MiB\n\
             #DW stage_out type=file source=$DW_JOB_STRIPED/result.txt destination=out/result.txt\n\
             set -e\necho done > $DW_JOB_STRIPED/result.txt\n\
             {how} </dev/null >/dev/null 2>&1 &\necho $! > {pid}\n\
             for i in $(seq 200); do [ \"$(cat /proc/$(cat {pid})/comm)\" = sleep ] && break; \
             sleep 0.05; done\n",
            pid = pid_file.display()
        ),
    );
    let start = std::time::Instant::now();
    let (out, _) = j.run(&[script.to_str().unwrap()]);
    let took = start.elapsed();
    end_pid_in(&pid_file);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        took < std::time::Duration::from_secs(60),
        "surge run took {took:?} (the holder sleeps 120 s)\n{t}"
    );
    assert_eq!(
        std::fs::read_to_string(j.path("out/result.txt")).unwrap(),
        "done\n",
        "{t}"
    );
    assert!(t.contains(said), "surge run does not say `{said}`:\n{t}");
    let run_dir = run_dir_of(&String::from_utf8_lossy(&out.stderr));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&run_dir),
        "a mount was left under {run_dir}:\n{t}"
    );
}

/// A process that escaped the job (`setsid`) with its working directory in the mount: the
/// mount is busy at the end of the job, so it is detached after a short wait.
#[test]
fn a_process_outside_the_job_in_the_mount_does_not_leave_a_dead_mount() {
    let test = "a_process_outside_the_job_in_the_mount_does_not_leave_a_dead_mount";
    if skip_without_fuse(test) {
        return;
    }
    unmount_is_bounded(
        "busy",
        "setsid sh -c 'cd \"$1\" && exec sleep 120' _ $DW_JOB_STRIPED",
        "detached it (lazy unmount)",
    );
}

/// A mount namespace made during the job (`unshare -m`: what a container or a service with
/// `PrivateTmp` does) holds a copy of the mount: the unmount here succeeds but the FUSE session
/// would last as long as that namespace; its connection is aborted after a short wait.
#[test]
fn a_copy_of_the_mount_in_another_namespace_does_not_hold_up_the_run() {
    let test = "a_copy_of_the_mount_in_another_namespace_does_not_hold_up_the_run";
    if skip_without_fuse(test) || skip_without_root(test) {
        return;
    }
    unmount_is_bounded(
        "mntns",
        "setsid unshare -m --propagation private sleep 120",
        "aborted its connection",
    );
}

/// Times set by `cp -p` and `tar -xp` in the instance are the ones stage-out (a striped
/// scratch instance) and the drain (a cache instance) put on the PFS, not the time of the
/// copy's writes.
#[test]
fn times_set_in_the_instance_reach_the_pfs_by_stage_out_and_the_drain() {
    let test = "times_set_in_the_instance_reach_the_pfs_by_stage_out_and_the_drain";
    if skip_without_fuse(test) {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let j = Job::new("times");
    std::fs::create_dir_all(j.path("in/sub")).unwrap();
    let mut data = vec![0u8; 3 << 20];
    Rng(7).fill(&mut data);
    std::fs::write(j.path("in/big.dat"), &data).unwrap();
    std::fs::write(j.path("in/sub/small.txt"), b"small\n").unwrap();
    let old = std::time::UNIX_EPOCH + std::time::Duration::new(1_250_000_000, 123_456_789);
    for f in ["in/big.dat", "in/sub/small.txt"] {
        std::fs::File::options()
            .write(true)
            .open(j.path(f))
            .unwrap()
            .set_times(
                std::fs::FileTimes::new()
                    .set_accessed(old)
                    .set_modified(old),
            )
            .unwrap();
    }
    let copies = "mkdir -p $D/out/tar\ncp -p in/big.dat $D/out/cp_p.dat\n\
                  tar -C in -cf - . | tar -C $D/out/tar -xpf -\n";
    let scratch = j.script(
        "scratch.sh",
        &format!(
            "#!/bin/bash\n#DW jobdw type=scratch access_mode=striped capacity=256MiB\n\
             #DW stage_out type=directory source=$DW_JOB_STRIPED/out destination=staged\n\
             set -e\nD=$DW_JOB_STRIPED\n{copies}"
        ),
    );
    let (out, _) = j.run(&[scratch.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let pfs = j.path("pfs");
    std::fs::create_dir_all(&pfs).unwrap();
    let cache = j.script(
        "cache.sh",
        &format!(
            "#!/bin/bash\n#DW jobdw type=cache access_mode=striped capacity=256MiB pfs={}\n\
             set -e\nD=$DW_JOB_STRIPED_CACHE\n{copies}",
            pfs.display()
        ),
    );
    let (out, _) = j.run(&[cache.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    for (root, how) in [(j.path("staged"), "stage-out"), (pfs.join("out"), "drain")] {
        for (copy, nsec) in [
            ("cp_p.dat", true),
            ("tar/big.dat", false),
            ("tar/sub/small.txt", false),
        ] {
            let md =
                std::fs::metadata(root.join(copy)).unwrap_or_else(|e| panic!("{how}: {copy}: {e}"));
            assert_eq!(
                (md.mtime(), if nsec { md.mtime_nsec() } else { 0 }),
                (1_250_000_000, if nsec { 123_456_789 } else { 0 }),
                "{how}: the mtime of {copy} on the PFS"
            );
        }
    }
}
