//! The library `cargo test` builds (this test makes cargo build it with the workspace's
//! features, so `make test` needs no separate `cargo build -p surge-preload`) exports the C
//! entry points a program's calls must reach, under their C names.

use std::path::PathBuf;
use std::process::Command;

fn library() -> PathBuf {
    // target/debug/deps/exports-HASH; cargo builds the library beside it.
    let exe = std::env::current_exe().expect("the test's own path");
    exe.with_file_name("libsurge_preload.so")
}

#[test]
fn the_library_exports_the_calls_it_interposes() {
    let lib = library();
    assert!(lib.is_file(), "{} was not built", lib.display());
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
        .expect("nm (binutils) runs");
    assert!(out.status.success(), "nm -D {}: {:?}", lib.display(), out);
    let text = String::from_utf8_lossy(&out.stdout);
    let exported: Vec<&str> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, kind, name) = (f.next()?, f.next()?, f.next()?);
            (kind == "T").then_some(name)
        })
        .collect();
    for call in [
        "open",
        "open64",
        "openat",
        "creat",
        "__open_2",
        "close",
        "dup2",
        "fcntl",
        "read",
        "write",
        "pread",
        "pwrite",
        "pread64",
        "pwrite64",
        "fsync",
        "fdatasync",
        "lseek",
    ] {
        assert!(
            exported.contains(&call),
            "{} does not export {call} (exported: {})",
            lib.display(),
            exported.len()
        );
    }
}
