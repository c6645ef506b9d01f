//! Test harness: the shared test kit's in-process servers (`surge_testkit::inproc`: real Surge
//! servers inside the test process, a real instance over them, the real protocol) and what the
//! staging tests compare: trees with every kind of entry, snapshots, temporaries.

#![allow(dead_code, unused_imports)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub use surge_testkit::inproc::Cluster;
pub use surge_testkit::Scratch;

/// Deterministic pseudo-random bytes.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut v = vec![0u8; len];
    rng.fill(&mut v);
    v
}

/// Sets atime and mtime with nanoseconds, of the link itself for symlinks. The atime is later
/// than the mtime and recent, so that reading the file (relatime) does not change it.
pub fn set_times(p: &Path, k: i64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let ts = [
        libc::timespec {
            tv_sec: now - 3600 + k,
            tv_nsec: 123_456_789 + k,
        },
        libc::timespec {
            tv_sec: now - 7200 - k * 60,
            tv_nsec: 987_654_321 - k,
        },
    ];
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid path and two timespecs.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(r, 0, "utimensat {}", p.display());
}

fn write(p: &Path, data: &[u8], mode: u32, k: i64) {
    fs::write(p, data).unwrap();
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
    set_times(p, k);
}

/// A mixed tree: empty, small, exactly one chunk, several chunks, sparse-ish, nested
/// directories, symlinks (relative, absolute and dangling), varied modes and times.
pub fn make_tree(root: &Path, chunk: usize) {
    fs::create_dir_all(root.join("a/b/c")).unwrap();
    fs::create_dir_all(root.join("empty-dir")).unwrap();
    fs::create_dir_all(root.join("private")).unwrap();
    write(&root.join("empty"), b"", 0o644, 1);
    write(&root.join("small.txt"), b"hello, burst buffer\n", 0o600, 2);
    write(&root.join("one-chunk.bin"), &bytes(3, chunk), 0o644, 3);
    write(
        &root.join("multi.bin"),
        &bytes(4, chunk * 3 + 1234),
        0o755,
        4,
    );
    // Sparse-ish: a hole, data in the middle of the second chunk, a hole to the end.
    {
        let p = root.join("sparse.bin");
        let f = fs::File::create(&p).unwrap();
        f.set_len(chunk as u64 * 4).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(&bytes(5, 4096), chunk as u64 + 100).unwrap();
        drop(f);
        fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
        set_times(&p, 5);
    }
    write(&root.join("read-only"), b"do not touch", 0o444, 6);
    for i in 0..40 {
        write(
            &root.join(format!("a/b/c/f{i:02}")),
            &bytes(100 + i, 10 + i as usize * 37),
            0o644,
            7 + i as i64,
        );
    }
    write(&root.join("a/b/mid.bin"), &bytes(50, chunk + 1), 0o644, 60);
    std::os::unix::fs::symlink("b/mid.bin", root.join("a/rel-link")).unwrap();
    set_times(&root.join("a/rel-link"), 61);
    std::os::unix::fs::symlink("/nonexistent/target", root.join("dangling")).unwrap();
    set_times(&root.join("dangling"), 62);
    std::os::unix::fs::symlink("a", root.join("dir-link")).unwrap();
    set_times(&root.join("dir-link"), 63);
    fs::set_permissions(root.join("private"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(root.join("a/b"), fs::Permissions::from_mode(0o750)).unwrap();
    // Directory times last: creating entries changes them.
    for (d, k) in [
        ("a/b/c", 70),
        ("a/b", 71),
        ("a", 72),
        ("empty-dir", 73),
        ("private", 74),
    ] {
        set_times(&root.join(d), k);
    }
}

/// What is compared of each entry of a tree.
#[derive(Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: &'static str,
    pub perm: u32,
    pub size: u64,
    pub mtime: (i64, i64),
    pub atime: (i64, i64),
    pub content: Option<u64>,
    pub target: Option<PathBuf>,
}

/// Every entry below `root` (relative path -> entry); directories include their times.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, Entry> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let md = fs::symlink_metadata(&p).unwrap();
            let ft = md.file_type();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let (kind, content, target) = if ft.is_dir() {
                stack.push(p.clone());
                ("dir", None, None)
            } else if ft.is_symlink() {
                ("symlink", None, Some(fs::read_link(&p).unwrap()))
            } else {
                // O_NOATIME: reading must not change the atime being compared (relatime
                // updates it when it is older than the ctime).
                let mut data = Vec::new();
                use std::io::Read;
                use std::os::unix::fs::OpenOptionsExt;
                fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOATIME)
                    .open(&p)
                    .unwrap()
                    .read_to_end(&mut data)
                    .unwrap();
                ("file", Some(xxhash_rust::xxh3::xxh3_64(&data)), None)
            };
            out.insert(
                rel,
                Entry {
                    kind,
                    perm: if ft.is_symlink() {
                        0
                    } else {
                        md.mode() & 0o7777
                    },
                    size: if ft.is_dir() { 0 } else { md.len() },
                    mtime: (md.mtime(), md.mtime_nsec()),
                    atime: (md.atime(), md.atime_nsec()),
                    content,
                    target,
                },
            );
        }
    }
    out
}

/// The differences between two snapshots, one line each.
pub fn diff(a: &BTreeMap<PathBuf, Entry>, b: &BTreeMap<PathBuf, Entry>) -> Vec<String> {
    let mut out = Vec::new();
    for (k, va) in a {
        match b.get(k) {
            None => out.push(format!("{}: missing in the copy", k.display())),
            Some(vb) if va != vb => out.push(format!("{}: {va:?} != {vb:?}", k.display())),
            _ => {}
        }
    }
    for k in b.keys() {
        if !a.contains_key(k) {
            out.push(format!("{}: only in the copy", k.display()));
        }
    }
    out
}

/// Paths below `root` whose name is a stage temporary.
pub fn temps(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if surge_stage::is_temp_name(e.file_name().as_encoded_bytes()) {
                out.push(e.path());
            }
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    out
}
