//! HPE Rabbit (DWS) job scripts under `surge run`, end to end: real manager, real servers,
//! real FUSE mounts. Two named allocations (an xfs one, private to each compute node, and a
//! lustre one, shared by the job), `#DW copy_in` / `#DW copy_out`, `$DW_JOB_<name>` on every
//! node, and what comes back to the PFS byte-identical (docs/DIRECTIVES.md, "HPE Rabbit").

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A job environment: a work directory (the "PFS" the job is submitted from) and a private
/// embedded fast tier.
struct Job {
    fast: Scratch,
    work: PathBuf,
}

impl Drop for Job {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

impl Job {
    fn new(tag: &str) -> Job {
        let work = std::env::temp_dir().join(format!("surge-rabbit-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work).unwrap();
        Job {
            fast: Scratch::new(&format!("fast-rabbit-{tag}")),
            work,
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.work.join(rel)
    }

    /// `surge run --nodes N script`, with `surge` on the job's PATH (for `surge exec`).
    fn run(&self, nodes: u32, text: &str) -> Output {
        let script = self.path("job.sh");
        std::fs::write(&script, text).unwrap();
        let path = format!(
            "{}:{}",
            Path::new(SURGE).parent().unwrap().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Command::new(SURGE)
            .current_dir(&self.work)
            .env("SURGE_FAST_DIR", self.fast.path())
            .env("SURGE_SERVERS", "2")
            .env("SURGE_SERVER_CAPACITY", "1GiB")
            .env("SURGE_GRANULARITY", "64MiB")
            .env("PATH", path)
            .env_remove("SURGE_MANAGER")
            .env_remove("SURGE_STATE_DIR")
            .args(["run", "--nodes", &nodes.to_string()])
            .arg(&script)
            .output()
            .unwrap()
    }
}

/// Inputs: two 3 MiB files of random bytes and 100 small ones in a subdirectory.
fn make_inputs(dir: &Path) {
    std::fs::create_dir_all(dir.join("large")).unwrap();
    std::fs::create_dir_all(dir.join("small")).unwrap();
    for (i, name) in ["alpha", "beta"].iter().enumerate() {
        let mut data = vec![0u8; 3 << 20];
        Rng(i as u64 + 11).fill(&mut data);
        std::fs::write(dir.join(format!("large/{name}.dat")), data).unwrap();
    }
    for i in 0..100 {
        std::fs::write(
            dir.join(format!("small/obj-{i:03}.txt")),
            format!("record {i}\n"),
        )
        .unwrap();
    }
}

/// Every regular file under `a` is under `b` with the same bytes, and `b` has nothing else.
fn assert_same_tree(a: &Path, b: &Path) {
    fn files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                files(root, &p, out);
            } else {
                out.push(p.strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    let (mut fa, mut fb) = (Vec::new(), Vec::new());
    files(a, a, &mut fa);
    files(b, b, &mut fb);
    fa.sort();
    fb.sort();
    assert_eq!(
        fa,
        fb,
        "{} and {} hold the same files",
        a.display(),
        b.display()
    );
    for f in &fa {
        assert!(
            std::fs::read(a.join(f)).unwrap() == std::fs::read(b.join(f)).unwrap(),
            "{} differs",
            f.display()
        );
    }
}

const TWO_ALLOCATIONS: &str = "#!/bin/bash
#DW jobdw type=xfs capacity=64MiB name=node-local
#DW jobdw type=lustre capacity=256MiB name=shared
#DW copy_in source=inputs destination=$DW_JOB_shared/in
#DW copy_in source=inputs/large/alpha.dat destination=$DW_JOB_node_local/
#DW copy_out source=$DW_JOB_shared/out destination=results
#DW copy_out source=$DW_JOB_node_local/local.dat destination=results-local/
set -e
env | grep '^DW_JOB_' | sort > env-node0.txt
surge exec --node 1 -- sh -c 'env | grep \"^DW_JOB_\" | sort' > env-node1.txt
# The lustre allocation is one namespace for the job: node 1 writes, node 0 reads.
mkdir -p $DW_JOB_shared/out
cp -r $DW_JOB_shared/in/. $DW_JOB_shared/out/
surge exec --node 1 -- sh -c 'echo from-node-1 > \"$DW_JOB_shared/out/node1.txt\"'
# The xfs allocation is one namespace per node, each filled by the copy_in.
surge exec --node 1 -- sh -c 'cmp \"$DW_JOB_node_local/alpha.dat\" \"$DW_JOB_shared/in/large/alpha.dat\" && echo mine > \"$DW_JOB_node_local/only-node-1\"'
test ! -e $DW_JOB_node_local/only-node-1
cp $DW_JOB_node_local/alpha.dat $DW_JOB_node_local/local.dat
";

#[test]
fn a_rabbit_script_with_an_xfs_and_a_lustre_allocation_copies_in_and_out_byte_identical() {
    if skip_without_fuse(
        "a_rabbit_script_with_an_xfs_and_a_lustre_allocation_copies_in_and_out_byte_identical",
    ) {
        return;
    }
    let j = Job::new("two");
    make_inputs(&j.path("inputs"));
    let out = j.run(2, TWO_ALLOCATIONS);
    assert!(out.status.success(), "{}", text(&out));

    // copy_out of the lustre allocation's directory: the inputs, byte-identical, and node 1's
    // file.
    let node1 = j.path("results/node1.txt");
    assert_eq!(std::fs::read_to_string(&node1).unwrap(), "from-node-1\n");
    std::fs::remove_file(node1).unwrap();
    assert_same_tree(&j.path("inputs"), &j.path("results"));
    // copy_out of one file of the xfs allocation into a directory.
    assert!(
        std::fs::read(j.path("results-local/local.dat")).unwrap()
            == std::fs::read(j.path("inputs/large/alpha.dat")).unwrap(),
        "results-local/local.dat is alpha.dat"
    );

    // $DW_JOB_<name> on both nodes, `-` written `_`; the xfs one differs per node, the lustre
    // one is the same namespace (its path may differ per emulated node).
    for node in ["env-node0.txt", "env-node1.txt"] {
        let env = std::fs::read_to_string(j.path(node)).unwrap();
        let names: Vec<&str> = env
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, _)| k))
            .collect();
        assert_eq!(
            names,
            ["DW_JOB_node_local", "DW_JOB_shared"],
            "{node}: {env}"
        );
    }
}

#[test]
fn a_rabbit_script_surge_refuses_allocates_nothing_and_runs_nothing() {
    for (tag, directives, want) in [
        (
            "raw",
            "#DW jobdw type=raw capacity=1GiB name=blocks",
            &["job.sh:2", "type=raw"][..],
        ),
        (
            "undefined",
            "#DW jobdw type=xfs capacity=1GiB name=scratch\n\
             #DW copy_in source=inputs destination=$DW_JOB_scrach/in",
            &[
                "job.sh:3",
                "$DW_JOB_scrach",
                "did you mean $DW_JOB_scratch?",
            ][..],
        ),
        (
            "container",
            "#DW jobdw type=xfs capacity=1GiB name=a\n#DW container name=c profile=p",
            &["job.sh:3", "#DW container"][..],
        ),
    ] {
        let j = Job::new(tag);
        let out = j.run(1, &format!("#!/bin/bash\n{directives}\ntouch ran\n"));
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        for w in want {
            assert!(err.contains(w), "{tag}: error mentions {w:?}:\n{err}");
        }
        assert!(!j.path("ran").exists(), "{tag}: the job must not run");
        assert!(
            !j.fast.path().join("state").exists(),
            "{tag}: nothing may be allocated"
        );
    }
}

/// A setup that fails on the second allocation (it does not fit the pool) destroys the first:
/// nothing of the job stays allocated, and the job does not run.
#[test]
fn an_allocation_that_does_not_fit_leaves_nothing_allocated() {
    if skip_without_fuse("an_allocation_that_does_not_fit_leaves_nothing_allocated") {
        return;
    }
    let j = Job::new("nofit");
    let out = j.run(
        1,
        "#!/bin/bash\n#DW jobdw type=xfs capacity=64MiB name=fits\n\
         #DW jobdw type=lustre capacity=100GiB name=too-big\ntouch ran\n",
    );
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("job.sh:3"), "the error names the line: {err}");
    assert!(
        err.contains("destroy named") && err.contains("$DW_JOB_fits: instance job"),
        "the allocation made before is destroyed: {err}"
    );
    assert!(!j.path("ran").exists(), "the job must not run");
}
