//! xfstests (fstests, the Linux file-system QA suite), a subset that fits `make test`: run by
//! `tests/xfstests/run.sh` against tmpfs and against Surge's `local` (what a plain `surge run`
//! job gets: files of one stripe on this host, kernel passthrough) and `striped` instance kinds,
//! each mounted by mount(8) through the `mount.fuse.surge` helper (this crate's binary).
//! Every test of the subset must pass on tmpfs and on both kinds. The whole comparison
//! (100 tests of the quick group, and bindfs) is `tests/xfstests/run.sh` (docs/SEMANTICS.md).
//!
//! xfstests is built by `make setup` from `../shared/tools/fs-suites` into `.tools/xfstests`;
//! without that folder the test says it skips, as it does without root or FUSE.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The subset: each passes on tmpfs here and names what it pins down on Surge.
const SUBSET: &[(&str, &str)] = &[
    (
        "generic/001",
        "copies and compares a tree of files (rw, dir)",
    ),
    ("generic/011", "directory operations from several processes"),
    (
        "generic/023",
        "rename of files and directories over each other",
    ),
    (
        "generic/035",
        "fstat of an open directory or file renamed over",
    ),
    (
        "generic/004",
        "O_TMPFILE: unnamed files written, named by linkat, O_EXCL ones never",
    ),
    (
        "generic/389",
        "O_TMPFILE takes the umask, or a directory's default ACL",
    ),
    (
        "generic/078",
        "RENAME_WHITEOUT over every kind of name, in one directory and across two",
    ),
    (
        "generic/215",
        "c/mtime move after a write through a shared memory map",
    ),
    (
        "generic/426",
        "open_by_handle of files the kernel forgot; ESTALE once unlinked",
    ),
    (
        "generic/467",
        "open_by_handle of directories, their path rebuilt through \"..\"",
    ),
    (
        "generic/477",
        "open_by_handle after the file system was unmounted and mounted again",
    ),
    // POSIX ACLs (about a second each).
    (
        "generic/053",
        "ACLs of many kinds read back after a remount",
    ),
    (
        "generic/099",
        "ACLs: enforcement, mask, chmod, default inheritance",
    ),
    (
        "generic/105",
        "a directory whose ACL gives no execute refuses the walk",
    ),
    (
        "generic/237",
        "setfacl by another user than the owner fails",
    ),
    ("generic/307", "setfacl moves ctime"),
    (
        "generic/319",
        "a directory inherits its parent's default ACL",
    ),
    (
        "generic/375",
        "setfacl and chmod by a user outside the group clear setgid",
    ),
    (
        "generic/444",
        "setgid inherited under a default ACL by a user outside the group",
    ),
    (
        "generic/529",
        "listxattr of a file with an ACL into a too small buffer: ERANGE",
    ),
    (
        "generic/103",
        "a file of one stripe takes what df shows free (the host's servers share the space)",
    ),
    (
        "generic/528",
        "statx reports a birth time that stays (FUSE_STATX)",
    ),
    (
        "generic/553",
        "copy_file_range into an immutable file: EPERM (chattr +i kept and enforced)",
    ),
    (
        "generic/555",
        "xfs_io chattr +ia needs CAP_LINUX_IMMUTABLE and -ia takes them off",
    ),
    (
        "generic/478",
        "an OFD lock is gone for other openers once the close of its open file returns",
    ),
    (
        "generic/003",
        "atime as relatime, noatime and strictatime say; never on a read-only mount",
    ),
    // Sized scratch file systems (tests/xfstests/mkfs-sized: a new instance of that size).
    (
        "generic/015",
        "writes to a full 256 MiB file system get ENOSPC; its space comes back when freed",
    ),
    (
        "generic/312",
        "a fallocate larger than the file system fails with ENOSPC",
    ),
    // fsx with preallocation (-x) on files made behind (a few seconds each).
    (
        "generic/075",
        "fsx, buffered, with files reserved past their end right after they are made",
    ),
    ("generic/112", "fsx with AIO, the same"),
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The xfstests tree `make setup` builds; `None` (said) when its source is absent.
fn xfstests(test: &str) -> Option<PathBuf> {
    let suites = std::env::var_os("SURGE_FS_SUITES")
        .map_or_else(|| repo().join("../shared/tools/fs-suites"), PathBuf::from);
    if !suites.join("xfstests-full.tar.gz").exists() {
        skip_without(
            test,
            &format!(
                "{} is absent (xfstests is built from its xfstests-full.tar.gz; set \
                 SURGE_FS_SUITES to its path)",
                suites.display()
            ),
        );
        return None;
    }
    let dir = repo().join(".tools/xfstests");
    assert!(
        dir.join("check").exists() && dir.join("src/open_by_handle").exists(),
        "{} is not built although {} is there: run `make setup`",
        dir.display(),
        suites.display()
    );
    Some(dir)
}

fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn xfstests_subset_passes_on_tmpfs_and_on_surge() {
    let test = "xfstests_subset_passes_on_tmpfs_and_on_surge";
    if skip_without_fuse(test) || skip_without_root(test) {
        return;
    }
    let Some(xfs) = xfstests(test) else {
        return;
    };
    let out = Scratch::new("xfstests");
    let tests: Vec<&str> = SUBSET.iter().map(|(t, _)| *t).collect();
    let run = Command::new(repo().join("tests/xfstests/run.sh"))
        .env("SURGE", SURGE)
        .env("XFSTESTS_DIR", &xfs)
        .args(["--fs", "tmpfs,local,striped", "--tests", &tests.join(" ")])
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("run tests/xfstests/run.sh");
    let text =
        String::from_utf8_lossy(&run.stdout).into_owned() + &String::from_utf8_lossy(&run.stderr);
    eprintln!("{text}");
    for fs in ["tmpfs", "local", "striped"] {
        let pass = lines(&out.path().join(format!("{fs}.pass")));
        let missing: Vec<String> = SUBSET
            .iter()
            .filter(|(t, _)| !pass.iter().any(|p| p == t))
            .map(|(t, why)| {
                let bad = out.path().join(format!("results/{fs}/{t}.out.bad"));
                let diff = std::fs::read_to_string(&bad).unwrap_or_default();
                format!(
                    "{t} ({why}):\n{}",
                    diff.lines().take(15).collect::<Vec<_>>().join("\n")
                )
            })
            .collect();
        assert!(
            missing.is_empty(),
            "on {fs}, xfstests did not pass:\n{}\n(logs under {}; mount logs there too)",
            missing.join("\n"),
            out.path().display()
        );
    }
    assert!(run.status.success(), "run.sh failed:\n{text}");
}
