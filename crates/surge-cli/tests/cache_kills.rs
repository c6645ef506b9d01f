//! `type=cache` crash safety: 20 rounds of changes through a mount of a cache instance (new
//! files, rewrites, renames, removals, directories), each followed by a drain (`surge stage
//! drain`) killed at a random point, by `kill -9` of a random server (restarted on its
//! directory) or of the drain itself. After a last drain, the PFS directory holds exactly what
//! the mount holds: every byte acknowledged to the application reached the PFS as written, and
//! so does each file's fill name (what an evicted file is read from).

mod common;
use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Retries an operation through the mount while a restarted server comes back.
fn retry<T>(what: &str, mut f: impl FnMut() -> std::io::Result<T>) -> T {
    let start = Instant::now();
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if start.elapsed() < Duration::from_secs(30) => {
                eprintln!("{what}: {e} (retrying)");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

/// Every regular file under `root` (relative path -> content), skipping the drain's
/// temporaries and its names of files by inode (`.surge-through`, see [`fill_names`]).
fn files(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let t = e.file_type().unwrap();
            if t.is_dir() && p == root.join(".surge-through") {
                continue;
            }
            if t.is_dir() {
                stack.push(p);
            } else if t.is_file() {
                out.insert(
                    p.strip_prefix(root).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                );
            }
        }
    }
    out
}

/// The drain's fill names (`.surge-through/<ino>-fill`, the PFS copy of inode `ino` a file
/// evicted from the fast tier is read from) that do not hold what the mount at `mount` holds
/// in that inode: once everything is drained, none (a removed file's goes with it).
fn stale_fill_names(pfs: &Path, mount: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut by_ino = BTreeMap::new();
    let mut stack = vec![mount.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() {
                by_ino.insert(m.ino(), e.path());
            }
        }
    }
    let mut bad = Vec::new();
    for e in std::fs::read_dir(pfs.join(".surge-through"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        // A link a killed drain made and did not rename yet: replaced by the next copy, or
        // removed with the directory after the job.
        if name.ends_with("-fill.new") {
            continue;
        }
        let Some(ino) = name
            .strip_suffix("-fill")
            .and_then(|i| i.parse::<u64>().ok())
        else {
            bad.push(format!("{name}: not a fill name"));
            continue;
        };
        match by_ino.get(&ino) {
            None => bad.push(format!("{name}: no such file in the mount")),
            Some(p) if std::fs::read(p).unwrap() != std::fs::read(e.path()).unwrap() => {
                bad.push(format!("{name}: differs from {}", p.display()))
            }
            Some(_) => {}
        }
    }
    bad
}

/// A drain is copying a file: one of its temporaries exists.
fn copying(root: &Path) -> bool {
    std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            std::fs::read_dir(e.path())
                .into_iter()
                .flatten()
                .flatten()
                .any(|f| f.file_name().to_string_lossy().ends_with(".surge-drain"))
        })
}

fn drain(c: &Cluster, id: u64, extra: &[&str]) -> Child {
    surge_command()
        .args([
            "stage",
            "drain",
            "--server",
            &c.servers[0].addr,
            "--instance",
        ])
        .arg(id.to_string())
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn every_acknowledged_byte_reaches_the_pfs_across_20_random_kills() {
    if skip_without_fuse("every_acknowledged_byte_reaches_the_pfs_across_20_random_kills") {
        return;
    }
    let mut c = cluster(2, "2GiB");
    let scratch = Scratch::new("cache-kills");
    let pfs = scratch.path().join("pfs");
    std::fs::create_dir_all(&pfs).unwrap();
    let pfs_arg = pfs.display().to_string();
    let id = c.create_instance("1GiB", "1MiB", &["--cache-pfs", &pfs_arg]);
    let m = Mount::new(&c, id, 0);
    let mut rng = Rng(seed() ^ 0x5eed);
    let mut kills = Vec::new();
    // Kills that found the drain still at work.
    let mut hits = 0;
    for round in 0..20u64 {
        // Changes of this round.
        let dir = format!("r{}", round % 4);
        retry("mkdir", || std::fs::create_dir_all(m.path(&dir)));
        for k in 0..3 {
            let mut data = vec![0u8; rng.below(12 << 20) as usize + 1];
            rng.fill(&mut data);
            let name = format!("{dir}/f{round}-{k}");
            retry("write", || std::fs::write(m.path(&name), &data));
        }
        if round > 0 {
            let old = format!("r{}/f{}-0", (round - 1) % 4, round - 1);
            let mut data = vec![0u8; rng.below(2 << 20) as usize + 1];
            rng.fill(&mut data);
            retry("rewrite", || std::fs::write(m.path(&old), &data));
            let from = format!("r{}/f{}-1", (round - 1) % 4, round - 1);
            let to = format!("{dir}/moved{round}");
            retry("rename", || std::fs::rename(m.path(&from), m.path(&to)));
            let gone = format!("r{}/f{}-2", (round - 1) % 4, round - 1);
            retry("remove", || std::fs::remove_file(m.path(&gone)));
        }
        // A drain, killed at a random point.
        // Killed while it copies a file (a temporary exists), a few ms in.
        let mut d = drain(&c, id, &[]);
        let start = Instant::now();
        while d.try_wait().ok().flatten().is_none()
            && start.elapsed() < Duration::from_secs(5)
            && !copying(&pfs)
        {
            std::thread::sleep(Duration::from_micros(500));
        }
        std::thread::sleep(Duration::from_millis(rng.below(5)));
        if d.try_wait().ok().flatten().is_none() {
            hits += 1;
        }
        let victim = rng.below(3);
        if victim == 2 {
            let _ = d.kill();
            kills.push(format!("round {round}: drain"));
        } else {
            c.servers[victim as usize].kill9();
            kills.push(format!("round {round}: server {victim}"));
            std::thread::sleep(Duration::from_millis(rng.below(200)));
            c.servers[victim as usize].restart();
        }
        let _ = d.wait();
    }
    // The last drain runs to the end (the servers are all up).
    let out = drain(&c, id, &["--json"]).wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "final drain: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = files(&m.dir);
    let got = files(&pfs);
    let missing: Vec<_> = want.keys().filter(|k| !got.contains_key(*k)).collect();
    let extra: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
    let differ: Vec<_> = want
        .iter()
        .filter(|(k, v)| got.get(*k).is_some_and(|g| g != *v))
        .map(|(k, _)| k)
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty() && differ.is_empty(),
        "after {kills:?}:\nmissing on the PFS {missing:?}\nonly on the PFS {extra:?}\ndiffer \
         {differ:?}"
    );
    let stale = stale_fill_names(&pfs, &m.dir);
    assert!(stale.is_empty(), "after {kills:?}: {stale:?}");
    // Round 0 leaves 3 files, each later one 2 more (3 new, 1 renamed in, 1 renamed away, 1
    // removed).
    assert_eq!(want.len(), 3 + 19 * 2, "files the rounds leave");
    assert!(
        hits >= 10,
        "only {hits} of 20 kills found the drain still running: {kills:?}"
    );
}
