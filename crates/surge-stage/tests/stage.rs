//! The staging engine against real servers (in this process) and a real instance: trees come
//! back byte-identical with their attributes, sources are checked before anything is copied, a
//! failing file does not stop the others, an interrupted stage leaves nothing that looks
//! complete, and checksums catch a corrupted copy.

mod common;

use common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use surge_client::InstanceClient;
use surge_stage::{
    execute, plan, verify, Direction, ItemKind, Progress, StageError, StageItem, StageOptions,
};

const MIB: u64 = 1 << 20;
/// Small chunks and stripes keep the tests quick while files still span several of each.
const CHUNK: u64 = MIB;

fn opts() -> StageOptions {
    StageOptions {
        workers: 8,
        chunk_size: CHUNK,
        ..StageOptions::default()
    }
}

fn dir_item(pfs: &Path, instance_path: &str) -> StageItem {
    StageItem {
        kind: ItemKind::Directory,
        pfs: pfs.to_path_buf(),
        instance_path: instance_path.into(),
    }
}

fn file_item(pfs: &Path, instance_path: &str) -> StageItem {
    StageItem {
        kind: ItemKind::File,
        pfs: pfs.to_path_buf(),
        instance_path: instance_path.into(),
    }
}

async fn stage(
    client: &Arc<InstanceClient>,
    direction: Direction,
    items: &[StageItem],
    opts: &StageOptions,
) -> surge_stage::StageReport {
    let p = plan(client, direction, items).await.expect("plan");
    execute(client.clone(), &p, opts, Arc::new(Progress::new()))
        .await
        .expect("execute")
}

/// Names (recursively) in an instance directory, as paths relative to it.
async fn instance_names(client: &InstanceClient, dir: &str) -> Vec<PathBuf> {
    let mut ino = client.getattr(1).await.unwrap().ino;
    for c in Path::new(dir).components().skip(1) {
        ino = client
            .lookup(ino, c.as_os_str().as_encoded_bytes())
            .await
            .unwrap()
            .ino;
    }
    let mut out = Vec::new();
    let mut stack = vec![(ino, PathBuf::new())];
    while let Some((d, rel)) = stack.pop() {
        let mut after = 0;
        loop {
            let surge_client::instance::DirPage {
                entries: page,
                done,
                ..
            } = client.readdir(d, after, 1000, false).await.unwrap();
            for e in &page {
                let p = rel
                    .join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&e.name));
                if e.kind == surge_proto::FileKind::Dir {
                    stack.push((e.ino, p.clone()));
                }
                out.push(p);
                after = e.cursor;
            }
            if done || page.is_empty() {
                break;
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_comes_back_byte_identical_with_modes_times_and_symlinks() {
    let c = Cluster::start("roundtrip", 2, 256 * MIB, CHUNK).await;
    let src = c.path().join("src");
    make_tree(&src, CHUNK as usize);
    // Listing a directory or reading a link moves its atime once (relatime: the atime is older
    // than the ctime utimensat just set); a first walk settles them so the copy can be compared.
    let _ = snapshot(&src);
    let before = snapshot(&src);

    let r = stage(
        &c.client,
        Direction::In,
        &[dir_item(&src, "/data/in")],
        &opts(),
    )
    .await;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    let files = before.values().filter(|e| e.kind == "file").count() as u64;
    assert_eq!(r.files, files);
    assert_eq!(r.symlinks, 3);
    assert_eq!(r.dirs, 6, "the top directory and five below it");
    assert_eq!(
        r.bytes,
        before
            .values()
            .map(|e| if e.kind == "file" { e.size } else { 0 })
            .sum::<u64>()
    );

    let out = c.path().join("out");
    let r = stage(
        &c.client,
        Direction::Out,
        &[dir_item(&out, "/data/in")],
        &opts(),
    )
    .await;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    let d = diff(&before, &snapshot(&out));
    assert!(
        d.is_empty(),
        "differences after in and out:\n{}",
        d.join("\n")
    );
    assert!(temps(&out).is_empty());
    assert!(instance_names(&c.client, "/data")
        .await
        .iter()
        .all(|p| !surge_stage::is_temp_name(p.file_name().unwrap().as_encoded_bytes())));
    // The copy of a sparse file stays sparse on the PFS (zero chunks are holes).
    let md = fs::metadata(out.join("sparse.bin")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert!(
        md.blocks() * 512 < 2 * CHUNK,
        "{} bytes allocated",
        md.blocks() * 512
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_file_is_split_across_workers_and_fragments() {
    let c = Cluster::start("large", 3, 512 * MIB, CHUNK).await;
    // DataWarp's striping over every fragment, asked for (a root stager with every fragment
    // on its host would make one stripe otherwise: the next test).
    c.client
        .set_layout(
            1,
            surge_core::FileLayout {
                stripe_count: surge_core::layout::STRIPE_ALL,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let src = c.path().join("big.dat");
    let data = bytes(9, (40 * CHUNK + 4321) as usize);
    fs::write(&src, &data).unwrap();
    let o = StageOptions {
        checksum: true,
        ..opts()
    };
    let progress = Arc::new(Progress::new());
    let p = plan(&c.client, Direction::In, &[file_item(&src, "/big.dat")])
        .await
        .unwrap();
    assert_eq!((p.files, p.bytes), (1, data.len() as u64));
    let r = execute(c.client.clone(), &p, &o, progress.clone())
        .await
        .unwrap();
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert!(r.checksummed);
    let s = progress.snapshot();
    assert_eq!(
        (s.bytes_done, s.files_done, s.finished),
        (data.len() as u64, 1, true)
    );

    let a = c.client.lookup(1, b"big.dat").await.unwrap();
    assert_eq!(a.size, data.len() as u64);
    // Every fragment holds a share of the file.
    for f in 0..3 {
        let len = fs::metadata(c.object_path(f, a.ino)).unwrap().len();
        assert!(len >= 13 * CHUNK, "fragment {f} holds {len} bytes");
    }
    let back = c.client.read(a.ino, 0, a.size).await.unwrap();
    assert!(back == data, "content differs");

    let out = c.path().join("back.dat");
    let r = stage(
        &c.client,
        Direction::Out,
        &[file_item(&out, "/big.dat")],
        &o,
    )
    .await;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert!(fs::read(&out).unwrap() == data);
}

/// A sparse file whose every chunk holds a little data comes back from the instance as sparse
/// as it went in: the blocks of zeros inside a chunk are holes on the PFS, not only the chunks
/// that are all zeros.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_out_keeps_the_holes_inside_each_chunk() {
    let c = Cluster::start("holes", 2, 256 * MIB, CHUNK).await;
    let src = c.path().join("sparse.dat");
    let size = 16 * CHUNK + 4096;
    {
        use std::os::unix::fs::FileExt;
        let f = fs::File::create(&src).unwrap();
        f.set_len(size).unwrap();
        for k in 0..=16 {
            f.write_all_at(&[k as u8 + 1; 4096], k * CHUNK).unwrap();
        }
    }
    let data = fs::read(&src).unwrap();
    let r = stage(
        &c.client,
        Direction::In,
        &[file_item(&src, "/sparse.dat")],
        &opts(),
    )
    .await;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    let out = c.path().join("out.dat");
    let r = stage(
        &c.client,
        Direction::Out,
        &[file_item(&out, "/sparse.dat")],
        &opts(),
    )
    .await;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert!(fs::read(&out).unwrap() == data, "content differs");
    use std::os::unix::fs::MetadataExt;
    let allocated = fs::metadata(&out).unwrap().blocks() * 512;
    assert!(
        allocated < size / 8,
        "{allocated} bytes allocated on the PFS for 68 KiB of data in {size}"
    );
}

/// A root stager with every fragment of the instance on its host (the embedded default run as
/// root, whose job mount reads one-stripe files with kernel passthrough) makes each file one
/// stripe; any other stager keeps the instance's rule (every fragment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_stager_with_every_fragment_here_makes_one_stripe_files() {
    let c = Cluster::start("onestripe", 3, 512 * MIB, CHUNK).await;
    let src = c.path().join("in.dat");
    let data = bytes(4, (5 * CHUNK + 17) as usize);
    fs::write(&src, &data).unwrap();
    let r = stage(
        &c.client,
        Direction::In,
        &[file_item(&src, "/in.dat")],
        &opts(),
    )
    .await;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    let a = c.client.lookup(1, b"in.dat").await.unwrap();
    let l = c.client.layout_of(a.ino).await.unwrap();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!(l.stripe_count, 1, "{l:?}");
        let len = fs::metadata(c.object_path(l.start, a.ino)).unwrap().len();
        assert_eq!(len, data.len() as u64, "the object is the file");
    } else {
        assert_eq!(l.stripe_count, 3, "{l:?}");
    }
    assert!(c.client.read(a.ino, 0, a.size).await.unwrap() == data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_source_fails_the_plan_before_anything_is_copied() {
    let c = Cluster::start("missing", 1, 64 * MIB, CHUNK).await;
    let src = c.path().join("src");
    make_tree(&src, CHUNK as usize);
    let missing = c.path().join("no-such-file");
    let e = plan(
        &c.client,
        Direction::In,
        &[dir_item(&src, "/in"), file_item(&missing, "/in/x")],
    )
    .await
    .unwrap_err();
    assert!(matches!(e, StageError::Missing { .. }), "{e}");
    assert!(e.to_string().contains("no-such-file"), "{e}");
    assert!(instance_names(&c.client, "/").await.is_empty());

    let e = plan(
        &c.client,
        Direction::Out,
        &[dir_item(&c.path().join("o"), "/results")],
    )
    .await
    .unwrap_err();
    assert_eq!(e.to_string(), "source /results does not exist");
    assert!(!c.path().join("o").exists());

    // A directory given as a file (and the reverse) is refused with a hint.
    let e = plan(&c.client, Direction::In, &[file_item(&src, "/in")])
        .await
        .unwrap_err();
    assert!(e.to_string().contains("type=directory"), "{e}");
    let e = plan(
        &c.client,
        Direction::In,
        &[dir_item(&src.join("small.txt"), "/in")],
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("type=file"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_in_larger_than_the_instance_fails_before_copying() {
    let c = Cluster::start("full", 2, 8 * MIB, CHUNK).await;
    let src = c.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a"), bytes(1, (5 * MIB) as usize)).unwrap();
    fs::write(src.join("b"), bytes(2, (4 * MIB) as usize)).unwrap();
    let p = plan(&c.client, Direction::In, &[dir_item(&src, "/in")])
        .await
        .unwrap();
    let e = surge_stage::check_fits(&c.client, &p).await.unwrap_err();
    assert!(matches!(e, StageError::NoSpace { .. }), "{e}");
    assert!(e.to_string().contains("8 MiB"), "{e}");
    let e = execute(c.client.clone(), &p, &opts(), Arc::new(Progress::new()))
        .await
        .unwrap_err();
    assert!(matches!(e, StageError::NoSpace { .. }), "{e}");
    assert!(instance_names(&c.client, "/").await.is_empty());
    assert_eq!(c.client.usage().await.unwrap().used, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_file_is_reported_and_the_others_are_copied() {
    let c = Cluster::start("onefails", 2, 128 * MIB, CHUNK).await;
    let src = c.path().join("src");
    make_tree(&src, CHUNK as usize);
    // Stage-in: a non-empty directory where small.txt must go.
    c.client
        .create(1, b"in", surge_proto::NewNode::Dir, 0o755, 0, 0)
        .await
        .unwrap();
    let in_ino = c.client.lookup(1, b"in").await.unwrap().ino;
    let blocker = c
        .client
        .create(in_ino, b"small.txt", surge_proto::NewNode::Dir, 0o755, 0, 0)
        .await
        .unwrap();
    c.client
        .create(blocker.ino, b"x", surge_proto::NewNode::File, 0o644, 0, 0)
        .await
        .unwrap();
    let r = stage(&c.client, Direction::In, &[dir_item(&src, "/in")], &opts()).await;
    assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
    assert!(
        r.failures[0].path.ends_with("/src/small.txt"),
        "{:?}",
        r.failures
    );
    assert!(r.failures[0].error.contains("rename"), "{:?}", r.failures);
    let total = snapshot(&src).values().filter(|e| e.kind == "file").count() as u64;
    assert_eq!(r.files, total - 1);
    let names = instance_names(&c.client, "/in").await;
    assert!(names.contains(&PathBuf::from("a/b/mid.bin")));
    assert!(
        names
            .iter()
            .all(|p| !surge_stage::is_temp_name(p.file_name().unwrap().as_encoded_bytes())),
        "{names:?}"
    );

    // Stage-out: a directory where multi.bin must go.
    let out = c.path().join("out");
    fs::create_dir_all(out.join("multi.bin/sub")).unwrap();
    let r = stage(&c.client, Direction::Out, &[dir_item(&out, "/in")], &opts()).await;
    assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
    assert_eq!(r.failures[0].path, "/in/multi.bin");
    assert!(out.join("a/b/mid.bin").is_file());
    assert!(temps(&out).is_empty(), "{:?}", temps(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_stage_leaves_no_complete_looking_file_and_the_next_run_cleans_up() {
    let c = Cluster::start("interrupt", 2, 512 * MIB, CHUNK).await;
    let src = c.path().join("src");
    fs::create_dir_all(&src).unwrap();
    for i in 0..3 {
        fs::write(src.join(format!("big{i}")), bytes(i, (48 * CHUNK) as usize)).unwrap();
    }
    for i in 0..200 {
        fs::write(src.join(format!("s{i:03}")), bytes(1000 + i, 3000)).unwrap();
    }
    let before = snapshot(&src);
    let o = StageOptions {
        workers: 2,
        ..opts()
    };

    // Stage-in, dropped (aborted) in the middle.
    let p = plan(&c.client, Direction::In, &[dir_item(&src, "/in")])
        .await
        .unwrap();
    let progress = Arc::new(Progress::new());
    let task = {
        let (client, p, o, progress) = (c.client.clone(), p.clone(), o.clone(), progress.clone());
        tokio::spawn(async move { execute(client, &p, &o, progress).await })
    };
    wait_for_bytes(&progress, &task, 20 * CHUNK).await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    // Give aborted chunk writes already on the wire time to land.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // Whatever carries a real name is complete.
    let names = instance_names(&c.client, "/in").await;
    let in_ino = c.client.lookup(1, b"in").await.unwrap().ino;
    let mut stale = 0;
    for n in &names {
        let name = n.as_os_str().as_encoded_bytes();
        if surge_stage::is_temp_name(name) {
            stale += 1;
            continue;
        }
        let a = c.client.lookup(in_ino, name).await.unwrap();
        let want = &before[n];
        assert_eq!(
            a.size,
            want.size,
            "{} looks complete but is not",
            n.display()
        );
        let data = c.client.read(a.ino, 0, a.size).await.unwrap();
        assert_eq!(
            xxhash_rust::xxh3::xxh3_64(&data),
            want.content.unwrap(),
            "{}",
            n.display()
        );
    }
    assert!(
        stale > 0,
        "the stage was interrupted before writing a temporary: {names:?}"
    );

    // The next run over the same destination removes the temporaries and completes.
    let r = stage(&c.client, Direction::In, &[dir_item(&src, "/in")], &o).await;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.stale_temps_removed, stale);
    let names = instance_names(&c.client, "/in").await;
    assert_eq!(names.len(), before.len(), "{names:?}");

    // Stage-out, cancelled through Progress: files in flight are removed, not left behind.
    let out = c.path().join("out");
    let p = plan(&c.client, Direction::Out, &[dir_item(&out, "/in")])
        .await
        .unwrap();
    let progress = Arc::new(Progress::new());
    let task = {
        let (client, p, o, progress) = (c.client.clone(), p.clone(), o.clone(), progress.clone());
        tokio::spawn(async move { execute(client, &p, &o, progress).await })
    };
    wait_for_bytes(&progress, &task, 20 * CHUNK).await;
    progress.cancel();
    let e = task.await.unwrap().unwrap_err();
    assert!(matches!(e, StageError::Cancelled), "{e}");
    assert!(temps(&out).is_empty(), "{:?}", temps(&out));
    let partial = snapshot(&out);
    for (k, v) in &partial {
        assert_eq!(v.content, before[k].content, "{}", k.display());
    }
    assert!(partial.len() < before.len());

    // Stage-out dropped in the middle, then run again.
    let progress = Arc::new(Progress::new());
    let task = {
        let (client, p, o, progress) = (c.client.clone(), p.clone(), o.clone(), progress.clone());
        tokio::spawn(async move { execute(client, &p, &o, progress).await })
    };
    wait_for_bytes(&progress, &task, 10 * CHUNK).await;
    task.abort();
    let _ = task.await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let left = temps(&out).len() as u64;
    for (k, v) in &snapshot(&out) {
        if !surge_stage::is_temp_name(k.as_os_str().as_encoded_bytes()) {
            assert_eq!(v.content, before[k].content, "{}", k.display());
        }
    }
    let r = stage(&c.client, Direction::Out, &[dir_item(&out, "/in")], &o).await;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.stale_temps_removed, left);
    assert!(temps(&out).is_empty());
    // (Atimes are not compared: the interrupted runs read the sources, which moved them.)
    let d = diff(&without_atimes(before), &without_atimes(snapshot(&out)));
    assert!(d.is_empty(), "{}", d.join("\n"));
}

/// A stage-in stopped hard (kill -9 of `surge stage copy`, here: its future dropped) and what
/// arrived then removed as `rm -rf` through a mount removes it (unlink, then the data of the
/// recorded size): no byte stays held. Before, the temporaries' recorded size was 0 until
/// they were complete, so their objects were never removed (1,684 MiB held in an empty
/// namespace, later stages failing with ENOSPC).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_stage_in_removed_by_hand_leaves_no_space_held() {
    let c = Cluster::start("orphans", 2, 512 * MIB, CHUNK).await;
    let src = c.path().join("src");
    fs::create_dir_all(&src).unwrap();
    for i in 0..3 {
        fs::write(src.join(format!("big{i}")), bytes(i, (48 * CHUNK) as usize)).unwrap();
    }
    for i in 0..50 {
        fs::write(src.join(format!("s{i:03}")), bytes(1000 + i, 3000)).unwrap();
    }
    let o = StageOptions {
        workers: 2,
        ..opts()
    };
    let p = plan(&c.client, Direction::In, &[dir_item(&src, "/in")])
        .await
        .unwrap();
    let progress = Arc::new(Progress::new());
    let task = {
        let (client, p, o, progress) = (c.client.clone(), p.clone(), o.clone(), progress.clone());
        tokio::spawn(async move { execute(client, &p, &o, progress).await })
    };
    wait_for_bytes(&progress, &task, 20 * CHUNK).await;
    task.abort();
    let _ = task.await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let used = || -> u64 {
        (0..2)
            .map(|i| {
                c.servers[i as usize]
                    .registry
                    .fragment(c.instance, i)
                    .expect("fragment")
                    .used()
            })
            .sum()
    };
    assert!(used() > 10 * CHUNK, "the stage wrote data: {}", used());
    // rm -rf /in
    let in_ino = c.client.lookup(1, b"in").await.unwrap().ino;
    for e in surge_stage::ns::list_dir(&c.client, in_ino, false)
        .await
        .unwrap()
    {
        surge_stage::ns::remove(&c.client, in_ino, &e.name)
            .await
            .unwrap();
    }
    c.client.rmdir(1, b"in").await.unwrap();
    assert_eq!(used(), 0, "space held by objects of removed files");
}

/// Names are bytes: names that are not UTF-8 (Latin-1 from an old code, raw bytes) come back
/// the same through stage-in and stage-out, for files and directories.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_are_not_utf8_round_trip() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let c = Cluster::start("bytes", 2, 256 * MIB, CHUNK).await;
    let src = c.path().join("src");
    let latin1 = OsStr::from_bytes(b"caf\xe9");
    let raw = OsStr::from_bytes(b"\xff\xfe-bytes\x01.dat");
    fs::create_dir_all(src.join(latin1)).unwrap();
    fs::write(src.join(latin1).join(raw), b"data under a non-UTF-8 path").unwrap();
    fs::write(src.join(raw), bytes(7, 3 * CHUNK as usize)).unwrap();
    let before = snapshot(&src);
    let r = stage(&c.client, Direction::In, &[dir_item(&src, "/in")], &opts()).await;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    let mut names = instance_names(&c.client, "/in").await;
    names.sort();
    let mut want = vec![
        PathBuf::from(raw),
        PathBuf::from(latin1),
        PathBuf::from(latin1).join(raw),
    ];
    want.sort();
    assert_eq!(names, want);
    let out = c.path().join("out");
    let r = stage(&c.client, Direction::Out, &[dir_item(&out, "/in")], &opts()).await;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    let d = diff(&without_atimes(before), &without_atimes(snapshot(&out)));
    assert!(d.is_empty(), "{}", d.join("\n"));
}

/// Waits until a running stage has copied `n` bytes; fails if it ends first or takes long.
async fn wait_for_bytes<T>(progress: &Progress, task: &tokio::task::JoinHandle<T>, n: u64) {
    let start = std::time::Instant::now();
    while progress.snapshot().bytes_done < n {
        assert!(
            !task.is_finished(),
            "the stage ended before copying {n} bytes: {:?}",
            progress.snapshot()
        );
        assert!(
            start.elapsed().as_secs() < 60,
            "no progress: {:?}",
            progress.snapshot()
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

fn without_atimes(
    mut m: std::collections::BTreeMap<PathBuf, Entry>,
) -> std::collections::BTreeMap<PathBuf, Entry> {
    for e in m.values_mut() {
        e.atime = (0, 0);
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checksums_catch_a_corrupted_copy() {
    let c = Cluster::start("checksum", 2, 128 * MIB, CHUNK).await;
    let src = c.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let data = bytes(77, (5 * CHUNK + 10) as usize);
    fs::write(src.join("x.dat"), &data).unwrap();
    fs::write(src.join("y.dat"), bytes(78, 1000)).unwrap();
    let items = [dir_item(&src, "/in")];
    let o = StageOptions {
        checksum: true,
        ..opts()
    };
    let r = stage(&c.client, Direction::In, &items, &o).await;
    assert!(r.failures.is_empty() && r.checksummed, "{r:?}");
    let p = plan(&c.client, Direction::In, &items).await.unwrap();
    let clean = verify(c.client.clone(), &p, &o, Arc::new(Progress::new()))
        .await
        .unwrap();
    assert!(clean.failures.is_empty() && clean.files == 2, "{clean:?}");

    // Flip one byte of x.dat in the object on the server that holds its third chunk.
    let in_ino = c.client.lookup(1, b"in").await.unwrap().ino;
    let x = c.client.lookup(in_ino, b"x.dat").await.unwrap();
    let piece = c
        .client
        .layout_of(x.ino)
        .await
        .unwrap()
        .pieces(2 * CHUNK + 5, 1)[0];
    let obj = c.object_path(piece.fragment, x.ino);
    let mut bytes_on_disk = fs::read(&obj).unwrap();
    bytes_on_disk[piece.object_offset as usize] ^= 0xff;
    fs::write(&obj, &bytes_on_disk).unwrap();

    let r = verify(c.client.clone(), &p, &o, Arc::new(Progress::new()))
        .await
        .unwrap();
    assert_eq!(r.files, 1);
    assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
    assert!(r.failures[0].path.ends_with("src/x.dat"));
    assert!(
        r.failures[0].error.contains(&format!(
            "checksum mismatch: the copy differs from the source in the {CHUNK} bytes at offset {}",
            2 * CHUNK
        )),
        "{}",
        r.failures[0].error
    );
    assert!(!r.checksummed);
}

/// Issue 31: a stage-out where everything fails (a 10,000-level tree made a 288 MB report and
/// a manager of 2.1 GiB) reports the first `MAX_FAILURES` failures and counts the rest: the
/// report stays small however much failed, and the count is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_where_everything_fails_lists_the_first_failures_and_counts_the_rest() {
    let c = Cluster::start("manyfail", 2, 128 * MIB, CHUNK).await;
    let n = surge_stage::MAX_FAILURES + 150;
    let dir = c
        .client
        .create(1, b"many", surge_proto::NewNode::Dir, 0o755, 0, 0)
        .await
        .unwrap();
    for i in 0..n {
        c.client
            .create(
                dir.ino,
                format!("f{i:04}").as_bytes(),
                surge_proto::NewNode::File,
                0o644,
                0,
                0,
            )
            .await
            .unwrap();
    }
    // Every destination is a non-empty directory: each file fails.
    let out = c.path().join("out");
    for i in 0..n {
        fs::create_dir_all(out.join(format!("f{i:04}/x"))).unwrap();
    }
    let r = stage(
        &c.client,
        Direction::Out,
        &[dir_item(&out, "/many")],
        &opts(),
    )
    .await;
    assert_eq!(r.failures.len(), surge_stage::MAX_FAILURES);
    assert_eq!(r.failures_more, 150);
    assert_eq!(r.failed(), n as u64);
    let json = serde_json::to_string(&r).unwrap();
    assert!(
        json.len() < surge_stage::MAX_FAILURES * 3 * surge_stage::MAX_FAILURE_TEXT,
        "a report of {} bytes",
        json.len()
    );
}
