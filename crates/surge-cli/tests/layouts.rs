//! Layouts per file (docs/DATAPLANE.md, "Layout"): chosen when a file is made, kept by the
//! metadata server, read and set through a mount (`surge layout`, `user.surge.layout`), a
//! directory's passed on to what is made in it; and the mount's own choice where no default
//! says otherwise (one stripe on a fragment of its host when passthrough serves it, every
//! fragment otherwise).

mod common;
use common::*;
use std::path::Path;

fn layout(p: &Path) -> serde_json::Value {
    let out = surge(&["layout", "get", "--json", &p.display().to_string()]);
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn set(p: &Path, args: &[&str]) -> std::process::Output {
    surge_command()
        .args(["layout", "set"])
        .arg(p)
        .args(args)
        .output()
        .expect("run surge layout set")
}

#[test]
fn layouts_are_kept_per_file_and_directories_pass_their_default_on() {
    if skip_without_fuse("layouts_are_kept_per_file_and_directories_pass_their_default_on") {
        return;
    }
    let c = cluster(2, "1GiB");
    let id = c.create_instance("512MiB", "8MiB", &[]);
    // Without passthrough the mount's choice is the instance's rule: every fragment.
    let m = Mount::with_args(&c, id, 0, &["--no-passthrough"]);
    let other = Mount::with_args(&c, id, 0, &["--no-passthrough"]);
    std::fs::write(m.path("plain"), b"x").unwrap();
    let l = layout(&m.path("plain"));
    assert_eq!(l["kind"], "file");
    assert_eq!(l["stripe_count"], 2, "{l}");
    assert_eq!(l["stripe_size"], 8 << 20, "{l}");

    // A directory's default reaches files and subdirectories made in it later.
    std::fs::create_dir(m.path("d")).unwrap();
    let out = set(
        &m.path("d"),
        &["--stripe-size", "64KiB", "--stripe-count", "1"],
    );
    assert!(out.status.success(), "{out:?}");
    std::fs::create_dir(m.path("d/sub")).unwrap();
    let mut data = vec![0u8; 1 << 20];
    Rng(3).fill(&mut data);
    std::fs::write(m.path("d/sub/f"), &data).unwrap();
    let l = layout(&m.path("d/sub/f"));
    assert_eq!(l["stripe_size"], 64 << 10, "{l}");
    assert_eq!(l["stripe_count"], 1, "{l}");
    assert_eq!(layout(&m.path("d/sub"))["default"], true);
    // Another node reads the bytes where this layout put them.
    assert!(std::fs::read(other.path("d/sub/f")).unwrap() == data);

    // An empty file takes a layout (made by `set` when missing); one with data refuses, and
    // the message says why.
    let out = set(
        &m.path("wide"),
        &["--stripe-size", "1MiB", "--stripe-count", "all"],
    );
    assert!(out.status.success(), "{out:?}");
    std::fs::write(m.path("wide"), &data).unwrap();
    let l = layout(&m.path("wide"));
    assert_eq!(l["stripe_size"], 1 << 20, "{l}");
    assert_eq!(l["stripe_count"], 2, "{l}");
    let out = set(&m.path("wide"), &["--stripe-count", "1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("first write"), "{err}");
    assert!(std::fs::read(other.path("wide")).unwrap() == data);

    // Mistakes are named before anything is touched.
    let out = set(&m.path("d"), &["--stripe-count", "3"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("stripe_count=3") && err.contains("above the instance's fragments"),
        "{err}"
    );
    // (this one by the command itself: nothing reaches the mount)
    let out = set(&m.path("d"), &["--stripe-size", "1000"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("1000"), "{err}");

    // Unset: back to the mount's choice.
    surge(&["layout", "unset", &m.path("d").display().to_string()]);
    assert_eq!(layout(&m.path("d"))["default"], false);
    std::fs::write(m.path("d/later"), b"y").unwrap();
    assert_eq!(layout(&m.path("d/later"))["stripe_count"], 2);
    // The attribute is not listed (copying tools do not carry it to other file systems).
    let listed = xattr_names(&m.path("d/sub/f"));
    assert!(!listed.contains("surge.layout"), "{listed}");
}

fn xattr_names(p: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut buf = [0u8; 1024];
    // SAFETY: a NUL-terminated path and a buffer writable for its length.
    let n = unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n >= 0, "listxattr: {}", std::io::Error::last_os_error());
    String::from_utf8_lossy(&buf[..n as usize]).into_owned()
}

/// As root, a mount makes each new file one stripe on a fragment of its host, round robin,
/// and the kernel writes it directly: no Write request reaches a server, the object on the
/// fragment's device is the file byte for byte, and another node (through the servers) reads
/// it. A directory default of every fragment still stripes.
#[test]
fn a_root_mount_places_new_files_on_its_own_fragments_and_passes_them_through() {
    let test = "a_root_mount_places_new_files_on_its_own_fragments_and_passes_them_through";
    if skip_without_fuse(test) {
        return;
    }
    if skip_without_root(test) {
        return;
    }
    let c = cluster(2, "1GiB");
    let id = c.create_instance("512MiB", "8MiB", &[]);
    let m = Mount::new(&c, id, 0);
    let other = Mount::with_args(&c, id, 0, &["--no-passthrough"]);
    let mut data = vec![0u8; 12 << 20];
    Rng(5).fill(&mut data);
    let mut starts = std::collections::BTreeSet::new();
    for i in 0..4 {
        let p = m.path(&format!("f{i}"));
        std::fs::write(&p, &data).unwrap();
        let l = layout(&p);
        assert_eq!(l["stripe_count"], 1, "{l}");
        starts.insert(l["start"].as_u64().unwrap());
        assert!(std::fs::read(other.path(&format!("f{i}"))).unwrap() == data);
    }
    assert_eq!(starts.len(), 2, "files spread over both local fragments");
    let sent = m.requests();
    assert_eq!(
        sent.get("Write").copied().unwrap_or(0),
        0,
        "the kernel wrote the data, not the mount: {sent:?}"
    );
    assert!(m.log().contains("passthrough available"), "{}", m.log());

    // A directory that asks for every fragment gets DataWarp's striping, through the daemon.
    std::fs::create_dir(m.path("shared")).unwrap();
    assert!(set(&m.path("shared"), &["--stripe-count", "all"])
        .status
        .success());
    std::fs::write(m.path("shared/ckpt"), &data).unwrap();
    assert_eq!(layout(&m.path("shared/ckpt"))["stripe_count"], 2);
    assert!(m.requests().get("Write").copied().unwrap_or(0) > 0);
    assert!(std::fs::read(other.path("shared/ckpt")).unwrap() == data);
}
