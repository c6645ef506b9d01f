//! Two compute nodes (two mounts of one instance): concurrent writers to different files, and
//! close-to-open visibility of each other's files.

mod common;
use common::*;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};

fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng(seed | 1).fill(&mut v);
    v
}

#[test]
fn concurrent_writers_on_two_mounts_see_each_others_closed_files() {
    if skip_without_fuse("concurrent_writers_on_two_mounts_see_each_others_closed_files") {
        return;
    }
    let c = Cluster::start(3, "1GiB");
    let id = c.create_instance("2GiB", "1MiB", &[]);
    let a = Mount::new(&c, id, 0);
    let b = Mount::new(&c, id, 0);
    std::fs::create_dir(a.path("out")).unwrap();
    let seed = seed();
    eprintln!("seed {seed}");
    let writer = |m: &Mount, tag: &'static str| {
        let dir = m.path("out");
        move || {
            for i in 0..12u64 {
                let len = ((seed.wrapping_mul(i + 7)) % (5 << 20)) as usize + 1;
                let mut f = File::create(dir.join(format!("{tag}-{i}"))).unwrap();
                // Several writes per file, in 256 KiB pieces, like an application would.
                for chunk in content(seed ^ i ^ tag.len() as u64, len).chunks(256 * 1024) {
                    f.write_all(chunk).unwrap();
                }
            }
        }
    };
    let ta = std::thread::spawn(writer(&a, "a"));
    let tb = std::thread::spawn(writer(&b, "bb"));
    ta.join().unwrap();
    tb.join().unwrap();
    // Each mount reads every file, its own and the other's.
    for m in [&a, &b] {
        for (tag, i) in ["a", "bb"]
            .iter()
            .flat_map(|t| (0..12u64).map(move |i| (*t, i)))
        {
            let len = ((seed.wrapping_mul(i + 7)) % (5 << 20)) as usize + 1;
            let mut got = Vec::new();
            File::open(m.path(&format!("out/{tag}-{i}")))
                .unwrap()
                .read_to_end(&mut got)
                .unwrap();
            assert!(
                got == content(seed ^ i ^ tag.len() as u64, len),
                "{tag}-{i} differs on {:?}",
                m.dir
            );
        }
    }
}

#[test]
fn a_file_rewritten_on_one_node_is_read_fresh_after_open_on_the_other() {
    if skip_without_fuse("a_file_rewritten_on_one_node_is_read_fresh_after_open_on_the_other") {
        return;
    }
    let c = Cluster::start(2, "1GiB");
    let id = c.create_instance("1GiB", "1MiB", &[]);
    let a = Mount::new(&c, id, 0);
    let b = Mount::new(&c, id, 0);
    std::fs::write(a.path("f"), b"version one").unwrap();
    // B reads it (and caches its attributes and pages).
    assert_eq!(std::fs::read(b.path("f")).unwrap(), b"version one");
    // A rewrites it longer and closes.
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(a.path("f"))
        .unwrap();
    f.write_all(b"version two, which is longer").unwrap();
    drop(f);
    // B opens after A's close: sees the new content and size (close-to-open), even within the
    // attribute cache time.
    assert_eq!(
        std::fs::read(b.path("f")).unwrap(),
        b"version two, which is longer"
    );
    // Appends from B are seen by A after B closes.
    let mut f = OpenOptions::new().append(true).open(b.path("f")).unwrap();
    f.write_all(b"+b").unwrap();
    drop(f);
    assert_eq!(
        std::fs::read(a.path("f")).unwrap(),
        b"version two, which is longer+b"
    );
    // A new file created on A is found on B at once (no negative caching of names).
    assert!(!b.path("new").exists());
    std::fs::write(a.path("new"), b"x").unwrap();
    assert_eq!(std::fs::read(b.path("new")).unwrap(), b"x");
}

#[test]
fn a_name_replaced_on_one_node_leads_to_the_new_file_on_the_other_at_once() {
    if skip_without_fuse("a_name_replaced_on_one_node_leads_to_the_new_file_on_the_other_at_once") {
        return;
    }
    let c = Cluster::start(2, "1GiB");
    let id = c.create_instance("1GiB", "1MiB", &[]);
    // Long name and attribute caches on B: a cached name must still never hide the new file.
    let a = Mount::new(&c, id, 0);
    let b = Mount::with_args(&c, id, 0, &["--attr-ttl", "60", "--entry-ttl", "60"]);
    std::fs::write(a.path("checkpoint"), b"step 1").unwrap();
    assert_eq!(std::fs::read(b.path("checkpoint")).unwrap(), b"step 1");
    // The atomic-save pattern: write a temporary, rename it over the old name.
    std::fs::write(a.path("checkpoint.tmp"), b"step 2, longer").unwrap();
    std::fs::rename(a.path("checkpoint.tmp"), a.path("checkpoint")).unwrap();
    assert_eq!(
        std::fs::read(b.path("checkpoint")).unwrap(),
        b"step 2, longer"
    );
    assert_eq!(
        std::fs::metadata(b.path("checkpoint")).unwrap().len(),
        14,
        "stat follows the new file too"
    );
    // Removed on A: gone on B.
    std::fs::remove_file(a.path("checkpoint")).unwrap();
    let e = std::fs::read(b.path("checkpoint")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
}

/// A directory made on node A keeps its listing on A (creates there skip the metadata server's
/// lookup); names node B adds meanwhile must still behave: `O_CREAT` opens them, `O_TRUNC`
/// truncates them, `O_EXCL` fails, and A sees them once its entry TTL has passed.
#[test]
fn names_another_node_adds_to_a_directory_made_here() {
    if skip_without_fuse("names_another_node_adds_to_a_directory_made_here") {
        return;
    }
    let c = Cluster::start(1, "1GiB");
    let id = c.create_instance("1GiB", "1MiB", &[]);
    let a = Mount::with_args(&c, id, 0, &["--entry-ttl", "1"]);
    let b = Mount::new(&c, id, 0);
    std::fs::create_dir(a.path("d")).unwrap();
    std::fs::write(a.path("d/mine"), b"a").unwrap();
    for n in ["x", "y", "z"] {
        std::fs::write(b.path(&format!("d/{n}")), b"from b").unwrap();
    }
    {
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .open(a.path("d/x"))
            .unwrap();
        f.write_all(b"+a").unwrap();
    }
    assert_eq!(std::fs::read(b.path("d/x")).unwrap(), b"from b+a");
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(a.path("d/y"))
        .unwrap();
    assert_eq!(std::fs::read(b.path("d/y")).unwrap(), b"");
    let e = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(a.path("d/z"))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
    assert_eq!(std::fs::read(a.path("d/z")).unwrap(), b"from b");

    // A fresh directory made on A, then a name added on B: A finds it within its entry TTL.
    std::fs::create_dir(a.path("e")).unwrap();
    std::fs::write(a.path("e/mine"), b"a").unwrap();
    std::fs::write(b.path("e/theirs"), b"from b").unwrap();
    let got = wait_for(
        "A to see e/theirs",
        std::time::Duration::from_secs(5),
        || std::fs::read(a.path("e/theirs")).ok(),
    );
    assert_eq!(got, b"from b");
    // And A's next create there is not confused by the name it did not make.
    std::fs::write(a.path("e/mine2"), b"a2").unwrap();
    let mut names: Vec<_> = std::fs::read_dir(b.path("e"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["mine", "mine2", "theirs"]);
}
