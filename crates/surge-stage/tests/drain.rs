//! The drain of a cache instance against real servers (in this process): a tree written into
//! the instance reaches the PFS directory byte-identical with its modes, mtimes and symlinks;
//! renames, removals and rewrites made later reach it in order; a journal entry is forgotten
//! only once it is on the PFS, so a drain that stops (here: a PFS that refuses writes) loses
//! nothing and the next drain finishes the job. When the fast tier is full, clean files (their
//! data on the PFS) are evicted before anything is written through, and writers wait at the
//! dirty high-water mark.

mod common;

use common::*;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use surge_proto::{KeepOpen, NewNode, TimeSet};
use surge_stage::drain::{drain_pass, DrainStats};
use surge_stage::{execute, plan, Direction, ItemKind, Progress, StageItem, StageOptions};
use surge_testkit::inproc::{Cluster, Spec};

async fn cache(tag: &str, pfs: &Path) -> Cluster {
    cache_of(tag, pfs, 256 << 20, false).await
}

/// A cache instance over 2 servers of `capacity`; `fsync_pfs`: `fsync=pfs`.
async fn cache_of(tag: &str, pfs: &Path, capacity: u64, fsync_pfs: bool) -> Cluster {
    Cluster::with(
        tag,
        &Spec {
            servers: 2,
            capacity,
            stripe_size: 1 << 20,
            cache_pfs: Some(pfs.display().to_string()),
            cache_fsync_pfs: fsync_pfs,
            ..Spec::default()
        },
    )
    .await
}

/// A background drain of `c` to `pfs` (as `surge run` runs it); set the flag to end it.
fn start_drain(
    c: &Cluster,
    pfs: &Path,
) -> (
    Arc<std::sync::atomic::AtomicBool>,
    tokio::task::JoinHandle<()>,
) {
    let (stop, task, _) = start_drain_reporting(c, pfs);
    (stop, task)
}

/// [`start_drain`], also giving what the drain reports.
fn start_drain_reporting(
    c: &Cluster,
    pfs: &Path,
) -> (
    Arc<std::sync::atomic::AtomicBool>,
    tokio::task::JoinHandle<()>,
    Arc<surge_stage::drain::DrainState>,
) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let state = Arc::new(surge_stage::drain::DrainState::default());
    let task = tokio::spawn(surge_stage::drain::drain_loop(
        c.new_client(0),
        pfs.to_path_buf(),
        state.clone(),
        stop.clone(),
        std::time::Duration::from_millis(50),
    ));
    (stop, task, state)
}

/// Writes the tree at `src` into the instance root (through the staging engine, as a job's
/// writes through a mount would: creates, data, then attributes).
async fn write_tree(c: &Cluster, src: &Path) {
    let items = [StageItem {
        kind: ItemKind::Directory,
        pfs: src.to_path_buf(),
        instance_path: "/".into(),
    }];
    let p = plan(&c.client, Direction::In, &items).await.expect("plan");
    let opts = StageOptions {
        workers: 4,
        chunk_size: 1 << 20,
        ..StageOptions::default()
    };
    let r = execute(c.client.clone(), &p, &opts, Arc::new(Progress::new()))
        .await
        .expect("execute");
    assert!(r.ok(), "{r:?}");
}

#[test]
fn a_tree_and_later_changes_reach_the_pfs_in_order() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let scratch = surge_testkit::Scratch::new("drain-pfs");
        let pfs = scratch.path().join("pfs");
        std::fs::create_dir_all(&pfs).unwrap();
        let c = cache("drain", &pfs).await;
        let src = c.path().join("src");
        make_tree(&src, 1 << 20);
        write_tree(&c, &src).await;

        let stats = DrainStats::default();
        let n = drain_pass(&c.client, &pfs, &stats).await.expect("drain");
        assert!(n > 0);
        let d = differ(&src, &pfs);
        assert!(d.is_empty(), "PFS differs from what was written: {d:?}");
        assert!(temps_left(&pfs).is_empty());
        // Nothing pending: a second pass does nothing.
        assert_eq!(drain_pass(&c.client, &pfs, &stats).await.unwrap(), 0);

        // Later changes: a rewrite, a rename of a directory, a removal, a new file renamed
        // over an old one (the editor's save).
        let root = 1;
        let top: Vec<String> = std::fs::read_dir(&src)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let dir = top
            .iter()
            .find(|n| src.join(n).is_dir())
            .expect("a directory")
            .clone();
        let file = top
            .iter()
            .find(|n| src.join(n).is_file() && !src.join(n).is_symlink())
            .expect("a file")
            .clone();
        c.client
            .rename(root, dir.as_bytes(), root, b"moved", 0, KeepOpen::All)
            .await
            .unwrap();
        // SAFETY: geteuid/getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let a = c
            .client
            .create(root, b"new.tmp", NewNode::File, 0o640, uid, gid)
            .await
            .unwrap();
        let body = bytes(7, 300_000);
        write_committed(&c, a.ino, 0, &body).await;
        c.client
            .rename(root, b"new.tmp", root, file.as_bytes(), 0, KeepOpen::All)
            .await
            .unwrap();
        drain_pass(&c.client, &pfs, &stats).await.expect("drain");
        assert!(!pfs.join(&dir).exists() && pfs.join("moved").is_dir());
        assert_eq!(std::fs::read(pfs.join(&file)).unwrap(), body);
        assert!(!pfs.join("new.tmp").exists());
        let d = differ(&src.join(&dir), &pfs.join("moved"));
        assert!(d.is_empty(), "{d:?}");
        assert!(stats.bytes.load(std::sync::atomic::Ordering::Relaxed) > 0);
    });
}

/// A file with two names (a hard link made in the job) that changes after the link reached
/// the PFS: both PFS names show the new data and stay one file (a copy renamed onto one name
/// used to leave the other on the old data).
#[test]
fn a_hard_linked_file_changed_later_keeps_its_names_together_on_the_pfs() {
    use std::os::unix::fs::MetadataExt;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let scratch = surge_testkit::Scratch::new("drain-links");
        let pfs = scratch.path().join("pfs");
        std::fs::create_dir_all(&pfs).unwrap();
        let c = cache("drain-links", &pfs).await;
        let stats = DrainStats::default();
        // SAFETY: geteuid/getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let a = c
            .client
            .create(1, b"a", NewNode::File, 0o644, uid, gid)
            .await
            .unwrap();
        let first = bytes(1, 100_000);
        write_committed(&c, a.ino, 0, &first).await;
        c.client.link(a.ino, 1, b"b").await.unwrap();
        drain_pass(&c.client, &pfs, &stats).await.expect("drain");
        assert_eq!(std::fs::read(pfs.join("b")).unwrap(), first);

        // Longer, then shorter: both names follow, whatever their PFS size was.
        let mut size = first.len() as u64;
        for (seed, len) in [(2, 300_000), (3, 50_000)] {
            let body = bytes(seed, len);
            if (len as u64) < size {
                let set = surge_proto::SetAttr {
                    size: Some(len as u64),
                    mtime: Some(TimeSet::Now),
                    ..Default::default()
                };
                c.client.setattr(a.ino, set, size).await.unwrap();
            }
            write_committed(&c, a.ino, 0, &body).await;
            size = len as u64;
            drain_pass(&c.client, &pfs, &stats).await.expect("drain");
            for name in ["a", "b"] {
                assert!(
                    std::fs::read(pfs.join(name)).unwrap() == body,
                    "{name} on the PFS is not what the instance holds after a change of {len} bytes"
                );
            }
            let (ma, mb) = (
                std::fs::metadata(pfs.join("a")).unwrap(),
                std::fs::metadata(pfs.join("b")).unwrap(),
            );
            assert_eq!(
                ma.ino(),
                mb.ino(),
                "a and b are no longer one file on the PFS"
            );
        }
        // A change, then the removal of one name, drained together: when the change is
        // copied the instance has one name left, the PFS still two (found with fsstress: the
        // kept name stayed empty on the PFS). Either name removed.
        for (gone, kept) in [("a", "b"), ("b", "a")] {
            // Both names, on the PFS too (the first round removed one).
            for name in [gone, kept] {
                if !pfs.join(name).exists() {
                    c.client.link(a.ino, 1, name.as_bytes()).await.unwrap();
                }
            }
            drain_pass(&c.client, &pfs, &stats).await.expect("drain");
            let body = bytes(if gone == "a" { 4 } else { 6 }, 200_000);
            write_committed(&c, a.ino, 0, &body).await;
            c.client
                .unlink(1, gone.as_bytes(), KeepOpen::All)
                .await
                .unwrap();
            drain_pass(&c.client, &pfs, &stats).await.expect("drain");
            assert!(!pfs.join(gone).exists(), "{gone} still on the PFS");
            assert!(
                std::fs::read(pfs.join(kept)).unwrap() == body,
                "{kept} on the PFS is not what the instance holds after {gone} was removed"
            );
        }
        assert!(temps_left(&pfs).is_empty());
    });
}

/// What the drain makes on the PFS has the instance's modes, not the drain's umask (a
/// directory, an empty file never written, a file made behind by a mount), and a sparse file
/// stays sparse (found with fsstress in a cache instance: 0777 directories came out 0755, and
/// files with holes of gigabytes filled the PFS with zeros).
#[test]
fn modes_and_holes_reach_the_pfs_as_the_instance_has_them() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // SAFETY: umask has no preconditions; 022 is what a drain usually runs with.
        unsafe { libc::umask(0o022) };
        let scratch = surge_testkit::Scratch::new("drain-modes");
        let pfs = scratch.path().join("pfs");
        std::fs::create_dir_all(&pfs).unwrap();
        let c = cache("drain-modes", &pfs).await;
        // SAFETY: geteuid/getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        c.client
            .create(1, b"d", NewNode::Dir, 0o777, uid, gid)
            .await
            .unwrap();
        c.client
            .create(1, b"empty", NewNode::File, 0o666, uid, gid)
            .await
            .unwrap();
        // A mount that lists the directory it made creates files there behind the
        // application (`NamespaceBatch`).
        let ttl = std::time::Duration::from_secs(10);
        let fs = surge_client::fs::Fs::new(c.new_client(0), ttl, ttl);
        let made = fs
            .mkdir(
                1,
                b"made",
                surge_client::fs::NewPerm::exact(0o755),
                uid,
                gid,
            )
            .await
            .expect("mkdir");
        for i in 0..4 {
            let (_, fh, _) = fs
                .create(
                    made.ino,
                    format!("f{i}").as_bytes(),
                    surge_client::fs::NewPerm::exact(0o666),
                    uid,
                    gid,
                    libc::O_WRONLY,
                )
                .await
                .expect("create");
            fs.release(fh).await.expect("close");
        }
        fs.shutdown().await;
        let sparse = c
            .client
            .create(1, b"sparse", NewNode::File, 0o644, uid, gid)
            .await
            .unwrap();
        let tail = bytes(5, 4096);
        let at = 64u64 << 20;
        write_committed(&c, sparse.ino, at, &tail).await;
        drain_pass(&c.client, &pfs, &DrainStats::default())
            .await
            .expect("drain");
        let mode = |n: &str| std::fs::metadata(pfs.join(n)).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode("d"), 0o777, "directory");
        assert_eq!(mode("empty"), 0o666, "empty file");
        for i in 0..4 {
            assert_eq!(mode(&format!("made/f{i}")), 0o666, "file {i} made behind");
        }
        let m = std::fs::metadata(pfs.join("sparse")).unwrap();
        assert_eq!(m.len(), at + tail.len() as u64);
        assert!(
            m.blocks() * 512 < 4 << 20,
            "the PFS copy of a 64 MiB file with 4 KiB of data takes {} bytes",
            m.blocks() * 512
        );
        let data = std::fs::read(pfs.join("sparse")).unwrap();
        assert!(data[..at as usize].iter().all(|&b| b == 0));
        assert_eq!(&data[at as usize..], &tail[..]);
    });
}

#[test]
fn a_drain_that_fails_keeps_the_journal_and_the_next_one_finishes() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let scratch = surge_testkit::Scratch::new("drain-fail");
        let pfs = scratch.path().join("pfs");
        std::fs::create_dir_all(&pfs).unwrap();
        let c = cache("drain-fail", &pfs).await;
        let src = c.path().join("src");
        make_tree(&src, 1 << 20);
        write_tree(&c, &src).await;
        // The PFS directory is unusable (a file where it should be: refused even to root).
        let aside = scratch.path().join("pfs.aside");
        std::fs::rename(&pfs, &aside).unwrap();
        std::fs::write(&pfs, b"not a directory").unwrap();
        let stats = DrainStats::default();
        let e = drain_pass(&c.client, &pfs, &stats).await.unwrap_err();
        assert!(e.to_string().contains(&pfs.display().to_string()), "{e}");
        std::fs::remove_file(&pfs).unwrap();
        std::fs::rename(&aside, &pfs).unwrap();
        drain_pass(&c.client, &pfs, &stats).await.expect("drain");
        let d = differ(&src, &pfs);
        assert!(d.is_empty(), "{d:?}");
    });
}

/// [`diff`] without access times (reading the source to write it moved them), and without the
/// drain's own names (`THROUGH_DIR`, removed after the job).
fn differ(a: &Path, b: &Path) -> Vec<String> {
    let strip = |p: &Path| {
        snapshot(p)
            .into_iter()
            .filter(|(k, _)| !k.starts_with(surge_stage::drain::THROUGH_DIR))
            .map(|(k, v)| {
                (
                    k,
                    format!("{v:?}")
                        .split(", atime")
                        .next()
                        .unwrap_or("")
                        .to_string()
                        + &format!("{:?}{:?}", v.content, v.target),
                )
            })
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let (x, y) = (strip(a), strip(b));
    x.iter()
        .filter(|(k, v)| y.get(*k) != Some(v))
        .map(|(k, v)| format!("{}: {v} != {:?}", k.display(), y.get(k)))
        .chain(
            y.keys()
                .filter(|k| !x.contains_key(*k))
                .map(|k| format!("{}: extra", k.display())),
        )
        .collect()
}

fn temps_left(root: &Path) -> Vec<std::path::PathBuf> {
    walk(root)
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".surge-drain"))
        .collect()
}

fn walk(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

/// `fsync=pfs`: an fsync in the job returns only once the file is on the PFS; without a drain
/// it does not return (it would fail after the stall limit), with one the PFS holds the file's
/// bytes the moment it returns.
#[test]
fn fsync_pfs_returns_once_the_file_is_on_the_pfs() {
    use std::time::{Duration, Instant};
    use surge_client::fs::Fs;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let scratch = surge_testkit::Scratch::new("drain-fsync");
        let pfs = scratch.path().join("pfs");
        std::fs::create_dir_all(&pfs).unwrap();
        let c = cache_of("drain-fsync", &pfs, 256 << 20, true).await;
        let fs = Fs::new(c.new_client(0), Duration::ZERO, Duration::ZERO);
        // SAFETY: geteuid/getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let (_, fh, _) = fs
            .create(
                1,
                b"ckpt.0",
                surge_client::fs::NewPerm::exact(0o644),
                uid,
                gid,
                libc::O_WRONLY,
            )
            .await
            .expect("create");
        let body = bytes(11, 3 << 20);
        for (i, chunk) in body.chunks(1 << 20).enumerate() {
            fs.write(fh, (i as u64) << 20, chunk, false)
                .await
                .expect("write");
        }
        // No drain runs: the fsync waits (it is given up here, not failed: the stall limit is
        // a minute).
        let waited = tokio::time::timeout(Duration::from_millis(1500), fs.fsync(fh)).await;
        assert!(
            waited.is_err(),
            "fsync=pfs returned with nothing draining: {waited:?}"
        );
        assert!(!pfs.join("ckpt.0").exists());

        let (stop, drain) = start_drain(&c, &pfs);
        let t = Instant::now();
        fs.fsync(fh).await.expect("fsync with a drain running");
        assert_eq!(
            std::fs::read(pfs.join("ckpt.0")).expect("on the PFS when fsync returned"),
            body
        );
        assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
        // A second fsync with nothing new returns at once.
        let t = Instant::now();
        fs.fsync(fh).await.expect("fsync");
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        fs.release(fh).await.expect("close");
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        drain.await.unwrap();
    });
}

/// Liu's fall-back: a file larger than the whole fast tier is written through to the PFS once
/// the tier is full (what it held drained first), keeps its PFS file across a rename made
/// while it is written, gives its fast-tier space back (a new small file then fits), reads
/// back from the PFS, and lands byte-identical.
#[test]
fn a_file_larger_than_the_fast_tier_is_written_through_to_the_pfs() {
    use std::time::Duration;
    use surge_client::fs::Fs;
    use surge_stage::drain::{clear_through, THROUGH_DIR};
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let scratch = surge_testkit::Scratch::new("drain-through");
        let pfs = scratch.path().join("pfs");
        std::fs::create_dir_all(&pfs).unwrap();
        let c = cache_of("drain-through", &pfs, 8 << 20, false).await;
        let (stop, drain) = start_drain(&c, &pfs);
        let fs = Fs::new(c.new_client(0), Duration::ZERO, Duration::ZERO);
        // SAFETY: geteuid/getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let (big, fh, _) = fs
            .create(
                1,
                b"big",
                surge_client::fs::NewPerm::exact(0o644),
                uid,
                gid,
                libc::O_RDWR,
            )
            .await
            .expect("create");
        // Three times the instance's capacity, in 1 MiB writes.
        let mut body = bytes(21, 24 << 20);
        for (i, chunk) in body.chunks(1 << 20).enumerate() {
            fs.write(fh, (i as u64) << 20, chunk, false)
                .await
                .unwrap_or_else(|e| panic!("write {i} of a file larger than the tier: {e}"));
        }
        // Renamed while open, then written again: the mount's PFS file is the stable name.
        fs.rename(1, b"big", 1, b"renamed", 0)
            .await
            .expect("rename");
        let tail = bytes(22, 1 << 20);
        fs.write(fh, body.len() as u64, &tail, false)
            .await
            .expect("write after the rename");
        body.extend_from_slice(&tail);
        fs.fsync(fh).await.expect("fsync");
        let back = fs.read(fh, 5 << 20, 1 << 20).await.expect("read back");
        assert_eq!(back, body[5 << 20..6 << 20], "read back from the PFS");
        fs.release(fh).await.expect("close");
        // The big file's fast-tier copy is gone: a new file fits.
        let u = c.client.usage().await.expect("usage");
        assert!(u.used < u.capacity / 2, "fast tier still full: {u:?}");
        let (_, sfh, _) = fs
            .create(
                1,
                b"small",
                surge_client::fs::NewPerm::exact(0o644),
                uid,
                gid,
                libc::O_WRONLY,
            )
            .await
            .expect("create small");
        let small = bytes(23, 3 << 20);
        fs.write(sfh, 0, &small, false).await.expect("small fits");
        fs.release(sfh).await.expect("close small");
        // fio's way: the file preallocated first, larger than the room left.
        let (pre, pfh, _) = fs
            .create(
                1,
                b"pre",
                surge_client::fs::NewPerm::exact(0o644),
                uid,
                gid,
                libc::O_RDWR,
            )
            .await
            .expect("create pre");
        fs.fallocate(pfh, 0, 16 << 20, 0)
            .await
            .expect("fallocate larger than the room left");
        let pre_body = bytes(24, 2 << 20);
        fs.write(pfh, 1 << 20, &pre_body, false)
            .await
            .expect("write pre");
        fs.release(pfh).await.expect("close pre");
        let a = c.client.getattr(pre.ino).await.expect("getattr pre");
        assert!(a.through != 0 && a.size == 16 << 20, "{a:?}");
        let a = c.client.getattr(big.ino).await.expect("getattr");
        assert!(a.through != 0, "the big file is marked written through");
        assert_eq!(a.size, body.len() as u64);

        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        drain.await.unwrap();
        assert_eq!(std::fs::read(pfs.join("renamed")).unwrap(), body);
        assert!(!pfs.join("big").exists());
        assert_eq!(std::fs::read(pfs.join("small")).unwrap(), small);
        let mut want = vec![0u8; 16 << 20];
        want[1 << 20..3 << 20].copy_from_slice(&pre_body);
        assert_eq!(std::fs::read(pfs.join("pre")).unwrap(), want);
        assert!(pfs.join(THROUGH_DIR).is_dir());
        clear_through(&pfs).expect("clear");
        assert!(!pfs.join(THROUGH_DIR).exists());
        assert_eq!(std::fs::read(pfs.join("renamed")).unwrap(), body);
    });
}

/// A burst of two files into a full tier (fio's checkpoint: both open at once): the second
/// switches to writing through without waiting for a copy of the first, which is still being
/// written; the first is copied once, when complete, not once while written and again after.
#[test]
fn a_switch_to_writing_through_does_not_copy_another_file_being_written() {
    use std::sync::atomic::Ordering;
    use std::time::Duration;
    use surge_client::fs::Fs;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let scratch = surge_testkit::Scratch::new("drain-burst");
        let pfs = scratch.path().join("pfs");
        std::fs::create_dir_all(&pfs).unwrap();
        let c = cache_of("drain-burst", &pfs, 8 << 20, false).await;
        let (stop, drain, state) = start_drain_reporting(&c, &pfs);
        let fs = Fs::new(c.new_client(0), Duration::ZERO, Duration::ZERO);
        // SAFETY: geteuid/getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let (_, afh, _) = fs
            .create(
                1,
                b"a",
                surge_client::fs::NewPerm::exact(0o644),
                uid,
                gid,
                libc::O_RDWR,
            )
            .await
            .expect("create a");
        let a_body = bytes(31, 4 << 20);
        fs.write(afh, 0, &a_body[..2 << 20], false)
            .await
            .expect("write a");
        // Its copy is journaled (a mount commits files being written every second).
        fs.fsync(afh).await.expect("commit a");
        let (_, bfh, _) = fs
            .create(
                1,
                b"b",
                surge_client::fs::NewPerm::exact(0o644),
                uid,
                gid,
                libc::O_RDWR,
            )
            .await
            .expect("create b");
        let b_body = bytes(32, 12 << 20);
        for (i, chunk) in b_body.chunks(1 << 20).enumerate() {
            fs.write(bfh, (i as u64) << 20, chunk, false)
                .await
                .unwrap_or_else(|e| panic!("write {i} of b: {e}"));
        }
        fs.release(bfh).await.expect("close b");
        assert_eq!(
            state.stats.files.load(Ordering::Relaxed),
            1,
            "only b's part on the tier was copied before b wrote through"
        );
        fs.write(afh, 2 << 20, &a_body[2 << 20..], false)
            .await
            .expect("write the rest of a");
        fs.release(afh).await.expect("close a");
        stop.store(true, Ordering::SeqCst);
        drain.await.unwrap();
        assert_eq!(std::fs::read(pfs.join("a")).unwrap(), a_body);
        assert_eq!(std::fs::read(pfs.join("b")).unwrap(), b_body);
        assert_eq!(
            state.stats.files.load(Ordering::Relaxed),
            2,
            "a copied once, complete"
        );
    });
}

/// Reads all of `name` in the root through `fs` (open, read, close).
/// Writes `body` at `offset` of `ino` through the instance and commits the size it ends at
/// (as a mount's close does: the change is journaled).
async fn write_committed(c: &Cluster, ino: u64, offset: u64, body: &[u8]) {
    c.client.write(ino, offset, body).await.unwrap();
    c.client
        .commit_write(ino, offset + body.len() as u64, TimeSet::Now, false)
        .await
        .unwrap();
}

async fn read_all(fs: &surge_client::fs::Fs, name: &[u8]) -> Vec<u8> {
    let a = fs.lookup(1, name).await.expect("lookup");
    let o = fs.open(a.ino, true, false, false).await.expect("open");
    let mut out = Vec::new();
    loop {
        let d = fs
            .read(o.fh, out.len() as u64, 1 << 20)
            .await
            .expect("read");
        if d.is_empty() {
            break;
        }
        out.extend_from_slice(&d);
    }
    fs.release(o.fh).await.expect("close");
    out
}

/// Creates `name` in the root through `fs` with `body` (1 MiB writes) and closes it.
async fn write_file(fs: &surge_client::fs::Fs, name: &[u8], body: &[u8]) -> u64 {
    // SAFETY: geteuid/getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let (a, fh, _) = fs
        .create(
            1,
            name,
            surge_client::fs::NewPerm::exact(0o644),
            uid,
            gid,
            libc::O_WRONLY,
        )
        .await
        .expect("create");
    for (i, chunk) in body.chunks(1 << 20).enumerate() {
        fs.write(fh, (i as u64) << 20, chunk, false)
            .await
            .unwrap_or_else(|e| panic!("write {i} of {}: {e}", String::from_utf8_lossy(name)));
    }
    fs.release(fh).await.expect("close");
    a.ino
}

async fn through(c: &Cluster, ino: u64) -> u64 {
    c.client.getattr(ino).await.expect("getattr").through
}

/// Waits (at most 30 s) until `ino`, read from the PFS, is copied into the fast tier.
async fn wait_on_tier(c: &Cluster, ino: u64) {
    let what = format!("inode {ino} copied into the fast tier");
    surge_testkit::wait_for_async(&what, Duration::from_secs(30), || async {
        (through(c, ino).await == 0).then_some(())
    })
    .await
}

/// Waits (at most 30 s) until the journal is empty.
async fn wait_drained(c: &Cluster) {
    surge_testkit::wait_for_async(
        "the drain to empty the journal",
        Duration::from_secs(30),
        || async {
            (c.client.drain_progress().await.expect("progress").pending == 0).then_some(())
        },
    )
    .await
}

/// A full fast tier evicts clean files (copied in from the PFS, unchanged), least recently
/// used first, before anything goes through to the PFS: never a dirty file (changed, not yet
/// drained: no drain runs here), nor one open on another node. Evicted files read back
/// byte-identical from the PFS.
#[test]
fn clean_files_are_evicted_least_recently_used_first_never_dirty_or_open_ones() {
    use std::time::Duration;
    use surge_client::fs::Fs;
    use surge_proto::THROUGH_FILL;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let scratch = surge_testkit::Scratch::new("evict-lru");
        let pfs = scratch.path().join("pfs");
        std::fs::create_dir_all(&pfs).unwrap();
        let body = |i: u64| bytes(30 + i, 4 << 20);
        for (i, n) in ["a", "b", "c"].iter().enumerate() {
            std::fs::write(pfs.join(n), body(i as u64)).unwrap();
        }
        // Room for four such files and a half.
        let c = cache_of("evict-lru", &pfs, 18 << 20, false).await;
        surge_stage::fill::fill_lazy(&c.client, &pfs, || false)
            .await
            .expect("fill");
        c.client.drain_ack(u64::MAX, Vec::new()).await.unwrap();
        let mut node1 = Fs::new(c.new_client(0), Duration::ZERO, Duration::ZERO);
        node1.set_dirty_high(0);
        let node2 = Fs::new(c.new_client(0), Duration::ZERO, Duration::ZERO);

        // Written in the job and never drained: dirty, and the least recently used of all.
        let dirty_body = bytes(40, 4 << 20);
        let dirty = write_file(&node1, b"dirty", &dirty_body).await;
        node1.report_use().await;
        // Read once each: copied into the tier behind the reads.
        let mut inos = Vec::new();
        for (i, n) in ["a", "b", "c"].iter().enumerate() {
            assert_eq!(read_all(&node1, n.as_bytes()).await, body(i as u64));
            inos.push(node1.lookup(1, n.as_bytes()).await.unwrap().ino);
        }
        let [a, b, cc] = inos[..] else { unreachable!() };
        for ino in [a, b, cc] {
            wait_on_tier(&c, ino).await;
        }
        node1.report_use().await;
        // `a` is used again; `c` is held open on the other node.
        assert_eq!(read_all(&node1, b"a").await, body(0));
        node1.report_use().await;
        let held = node2
            .open(cc, true, false, false)
            .await
            .expect("open c on node 2");

        // The tier is nearly full: a new file takes `b`'s room (the least recently used clean
        // file), not the PFS's.
        let new_body = bytes(41, 4 << 20);
        let new = write_file(&node1, b"new", &new_body).await;
        node1.report_use().await;
        assert_eq!(
            through(&c, new).await,
            0,
            "the new file went through to the PFS"
        );
        assert_eq!(through(&c, b).await, THROUGH_FILL, "b was not evicted");
        for ino in [a, cc, dirty] {
            assert_eq!(through(&c, ino).await, 0, "inode {ino} was evicted");
        }
        // Next: `c` is older than `a` but open; the dirty files are never taken.
        let new2 = write_file(&node1, b"new2", &bytes(42, 4 << 20)).await;
        assert_eq!(through(&c, new2).await, 0);
        assert_eq!(through(&c, a).await, THROUGH_FILL, "a was not evicted");
        for ino in [cc, dirty, new] {
            assert_eq!(through(&c, ino).await, 0, "inode {ino} was evicted");
        }
        // Evicted files read back from the PFS; the others from the tier.
        assert_eq!(read_all(&node1, b"b").await, body(1));
        assert_eq!(read_all(&node1, b"a").await, body(0));
        let mut back = Vec::new();
        while back.len() < 4 << 20 {
            back.extend(
                node2
                    .read(held.fh, back.len() as u64, 1 << 20)
                    .await
                    .unwrap(),
            );
        }
        assert_eq!(back, body(2));
        node2.release(held.fh).await.unwrap();
        assert_eq!(read_all(&node1, b"dirty").await, dirty_body);
        assert_eq!(read_all(&node1, b"new").await, new_body);
    });
}

/// A file the drain copied gets its fill name on the PFS and is clean from then on: a full
/// tier evicts it (the new file stays on the tier) and it reads back from the PFS; its fill
/// name goes when its last name does.
#[test]
fn a_drained_file_is_evicted_and_its_fill_name_goes_with_its_last_name() {
    use std::time::Duration;
    use surge_client::fs::Fs;
    use surge_proto::THROUGH_FILL;
    use surge_stage::drain::THROUGH_DIR;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let scratch = surge_testkit::Scratch::new("evict-drained");
        let pfs = scratch.path().join("pfs");
        std::fs::create_dir_all(&pfs).unwrap();
        let c = cache_of("evict-drained", &pfs, 8 << 20, false).await;
        let (stop, drain) = start_drain(&c, &pfs);
        let mut fs = Fs::new(c.new_client(0), Duration::ZERO, Duration::ZERO);
        fs.set_dirty_high(0);
        let body1 = bytes(50, 4 << 20);
        let w1 = write_file(&fs, b"w1", &body1).await;
        fs.report_use().await;
        wait_drained(&c).await;
        let fill = pfs.join(THROUGH_DIR).join(format!("{w1}-fill"));
        assert_eq!(std::fs::read(&fill).expect("the fill name"), body1);

        let body2 = bytes(51, 6 << 20);
        let w2 = write_file(&fs, b"w2", &body2).await;
        assert_eq!(through(&c, w2).await, 0, "w2 went through to the PFS");
        assert_eq!(through(&c, w1).await, THROUGH_FILL, "w1 was not evicted");
        assert_eq!(read_all(&fs, b"w1").await, body1);
        // Its first read started a copy into the tier, which has no room for it (w2 took
        // it): the copy gives up, the file stays on the PFS and still reads back whole.
        surge_testkit::holds_for_async(
            "w1 stays on the PFS",
            Duration::from_millis(500),
            || async {
                let t = through(&c, w1).await;
                surge_testkit::check(t == THROUGH_FILL, || {
                    format!("copied into a full tier ({t})")
                })
            },
        )
        .await;
        assert_eq!(read_all(&fs, b"w1").await, body1);

        fs.unlink(1, b"w1").await.expect("unlink");
        wait_drained(&c).await;
        assert!(!pfs.join("w1").exists());
        assert!(!fill.exists(), "the fill name of a removed file stays");
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        drain.await.unwrap();
        assert_eq!(std::fs::read(pfs.join("w2")).unwrap(), body2);
    });
}

/// Back-pressure (`dirty_high=80%`): with the dirty data over the high-water mark, a writer
/// waits for the drain (here: none runs yet) instead of filling the tier, and goes on once the
/// drain brought it under the low-water mark; its file stays on the tier.
#[test]
fn writers_wait_at_the_dirty_high_water_mark_until_the_drain_catches_up() {
    use std::time::Duration;
    use surge_client::fs::Fs;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let scratch = surge_testkit::Scratch::new("dirty-high");
        let pfs = scratch.path().join("pfs");
        std::fs::create_dir_all(&pfs).unwrap();
        // High-water mark 16 MiB, low 12 MiB; room for five 4 MiB files.
        let c = cache_of("dirty-high", &pfs, 20 << 20, false).await;
        let mut fs = Fs::new(c.new_client(0), Duration::ZERO, Duration::ZERO);
        fs.set_dirty_high(16 << 20);
        let fs = std::sync::Arc::new(fs);
        for i in 0..4u64 {
            write_file(&fs, format!("f{i}").as_bytes(), &bytes(60 + i, 4 << 20)).await;
            fs.report_use().await;
        }
        let last = bytes(64, 4 << 20);
        let writer = {
            let (fs, last) = (fs.clone(), last.clone());
            tokio::spawn(async move { write_file(&fs, b"f4", &last).await })
        };
        surge_testkit::holds_for_async(
            "a write past the dirty high-water mark waits for the drain",
            Duration::from_millis(1500),
            || async { surge_testkit::check(!writer.is_finished(), || "it returned".into()) },
        )
        .await;
        let (stop, drain) = start_drain(&c, &pfs);
        let f4 = tokio::time::timeout(Duration::from_secs(30), writer)
            .await
            .expect("the writer still waits with the drain running")
            .unwrap();
        assert_eq!(through(&c, f4).await, 0, "f4 went through to the PFS");
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        drain.await.unwrap();
        assert_eq!(std::fs::read(pfs.join("f4")).unwrap(), last);
    });
}

/// The drain holds back a file being written (open on a mount and changed within the settle
/// time), not one closed on every mount: that one is complete and copied at once.
#[test]
fn the_drain_holds_back_open_files_only() {
    use std::time::Duration;
    use surge_client::fs::Fs;
    use surge_stage::drain::drain_pass_settled;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let scratch = surge_testkit::Scratch::new("drain-open");
        let pfs = scratch.path().join("pfs");
        std::fs::create_dir_all(&pfs).unwrap();
        let c = cache("drain-open", &pfs).await;
        let fs = Fs::new(c.new_client(0), Duration::ZERO, Duration::ZERO);
        let closed = bytes(70, 300_000);
        write_file(&fs, b"closed", &closed).await;
        fs.report_use().await;
        // SAFETY: geteuid/getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let (_, fh, _) = fs
            .create(
                1,
                b"open",
                surge_client::fs::NewPerm::exact(0o644),
                uid,
                gid,
                libc::O_WRONLY,
            )
            .await
            .expect("create");
        let open = bytes(71, 200_000);
        fs.write(fh, 0, &open, false).await.expect("write");
        fs.flush(fh).await.expect("commit");

        // Both changed just now; a settle time far longer than the test.
        let settle = Some(Duration::from_secs(600));
        let stats = DrainStats::default();
        drain_pass_settled(&c.client, &pfs, &stats, settle)
            .await
            .expect("drain");
        assert_eq!(std::fs::read(pfs.join("closed")).unwrap(), closed);
        assert!(
            std::fs::read(pfs.join("open"))
                .unwrap_or_default()
                .is_empty(),
            "a file being written was copied"
        );
        fs.release(fh).await.expect("close");
        fs.report_use().await;
        drain_pass_settled(&c.client, &pfs, &stats, settle)
            .await
            .expect("drain");
        assert_eq!(std::fs::read(pfs.join("open")).unwrap(), open);
    });
}

/// A root mount acting for a user (the compute-node agent's mount of a job's cache instance)
/// opens the job's PFS files with the user's rights, not root's: a fill name the user
/// hard-linked to a file they may not read (possible where `fs.protected_hardlinks` is 0; the
/// test makes the link as root) does not hand them its content, while a file they may read is
/// read as before. Needs root (to act for another user).
#[test]
fn a_root_mount_opens_the_users_pfs_files_with_the_users_rights() {
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;
    use surge_client::fs::Fs;
    use surge_stage::drain::THROUGH_DIR;
    if surge_testkit::skip_without_root(
        "a_root_mount_opens_the_users_pfs_files_with_the_users_rights",
    ) {
        return;
    }
    let (uid, gid) = surge_testkit::system_user("surge-attacker");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let scratch = surge_testkit::Scratch::new("pfs-as-user");
        let top = scratch.path();
        std::fs::set_permissions(top, std::fs::Permissions::from_mode(0o755)).unwrap();
        let pfs = top.join("pfs");
        std::fs::create_dir_all(&pfs).unwrap();
        let readable = bytes(50, 100_000);
        std::fs::write(pfs.join("readable"), &readable).unwrap();
        std::fs::write(pfs.join("stolen"), bytes(51, 100_000)).unwrap();
        let secret = top.join("secret");
        std::fs::write(&secret, vec![b'S'; 100_000]).unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = cache(&format!("pfs-as-user-{uid}"), &pfs).await;
        surge_stage::fill::fill_lazy(&c.client, &pfs, || false)
            .await
            .expect("fill");
        for d in [pfs.clone(), pfs.join(THROUGH_DIR)] {
            std::os::unix::fs::chown(&d, Some(uid), Some(gid)).unwrap();
        }
        let fs = Fs::new(
            c.client_for(0, surge_auth::Caller::of(uid, gid)),
            Duration::ZERO,
            Duration::ZERO,
        );
        // The attack: the fill name of `stolen` now names root's 0600 file.
        let ino = fs.lookup(1, b"stolen").await.expect("lookup").ino;
        let fill = pfs.join(THROUGH_DIR).join(format!("{ino}-fill"));
        std::fs::remove_file(&fill).unwrap();
        std::fs::hard_link(&secret, &fill).unwrap();
        let err = fs
            .open(ino, true, false, false)
            .await
            .expect_err("root's 0600 file opened for the user through the mount");
        assert_eq!(err.errno, libc::EACCES, "{err:?}");
        // What the user may read reads as before.
        assert_eq!(read_all(&fs, b"readable").await, readable);
    });
}

/// One drainer at a time (`Request::DrainHold`): while a drain runs, a second drainer of the
/// same journal (another job's drain of a persistent cache, `surge stage drain` by hand) is
/// refused with the reason, takes nothing from the journal, and, told to stop, ends once the
/// first drained everything journaled before the stop. A drainer that ends gives the hold
/// back, and the next one starts at once.
#[test]
fn a_second_drainer_waits_for_the_one_holding_the_journal() {
    use std::sync::atomic::Ordering;
    use surge_stage::drain::{drain_loop, DrainState};
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let scratch = surge_testkit::Scratch::new("two-drainers");
        let pfs = scratch.path().join("pfs");
        std::fs::create_dir_all(&pfs).unwrap();
        let c = cache("two-drainers", &pfs).await;
        let src = c.path().join("src");
        make_tree(&src, 1 << 20);
        write_tree(&c, &src).await;

        // The first drainer holds the journal and drains it.
        let (stop_a, a) = start_drain(&c, &pfs);
        // Until the first drainer holds the journal (a probe that gets the hold first gives
        // it back at once).
        let probe = c.new_client(0);
        let t = std::time::Instant::now();
        while probe.drain_hold(false).await.is_ok() {
            probe.drain_hold(true).await.expect("release");
            assert!(
                t.elapsed() < std::time::Duration::from_secs(10),
                "the first drainer never held the journal"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let other = c.new_client(0);
        let stats = DrainStats::default();
        let refused = drain_pass(&other, &pfs, &stats)
            .await
            .expect_err("a second drainer was let in while the first ran")
            .to_string();
        assert!(refused.contains("another drainer"), "{refused}");
        assert_eq!(stats.entries.load(Ordering::Relaxed), 0);
        let e = other.drain_poll(0, 10).await.expect_err("entries taken");
        assert!(e.to_string().contains("another drainer"), "{e}");
        other
            .drain_progress()
            .await
            .expect("counting is for everyone");

        // A later change; the second drainer, told to stop, ends once the first drained it.
        let late = c.path().join("late");
        std::fs::create_dir_all(&late).unwrap();
        std::fs::write(late.join("late.txt"), b"late\n").unwrap();
        write_tree(&c, &late).await;
        let state_b = Arc::new(DrainState::default());
        let b = tokio::spawn(drain_loop(
            other.clone(),
            pfs.clone(),
            state_b.clone(),
            Arc::new(std::sync::atomic::AtomicBool::new(true)),
            std::time::Duration::from_millis(20),
        ));
        tokio::time::timeout(std::time::Duration::from_secs(30), b)
            .await
            .expect("the waiting drainer ended")
            .unwrap();
        assert_eq!(
            state_b.stats.entries.load(Ordering::Relaxed),
            0,
            "the waiting drainer applied entries"
        );
        assert_eq!(std::fs::read(pfs.join("late.txt")).unwrap(), b"late\n");

        // The first ends and gives the hold back: the second drains at once.
        stop_a.store(true, Ordering::SeqCst);
        a.await.unwrap();
        std::fs::write(late.join("later.txt"), b"later\n").unwrap();
        write_tree(&c, &late).await;
        let n = drain_pass(&other, &pfs, &stats)
            .await
            .expect("the hold was given back");
        assert!(n > 0);
        assert_eq!(std::fs::read(pfs.join("later.txt")).unwrap(), b"later\n");

        // A drainer that dies (its connections close) without giving the hold back: the hold
        // goes with its connections, not DRAIN_HOLD later.
        let dying = c.new_client(0);
        dying.drain_hold(false).await.expect("the hold is free");
        let e = drain_pass(&other, &pfs, &stats).await.unwrap_err();
        assert!(e.to_string().contains("another drainer"), "{e}");
        drop(dying);
        let t = std::time::Instant::now();
        while drain_pass(&other, &pfs, &stats).await.is_err() {
            assert!(
                t.elapsed() < std::time::Duration::from_secs(5),
                "the hold of a closed drainer stayed"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    });
}
