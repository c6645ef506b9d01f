//! The file-system core ([`surge_client::fs::Fs`]) driven without a kernel, against real servers
//! in this process (`surge_testkit::inproc`): what one node sees of its own changes, and what
//! its caches save, counted in requests sent (`InstanceClient::counts`).

use std::sync::Arc;
use std::time::Duration;
use surge_client::fs::{Fs, NewPerm};
use surge_testkit::inproc::{Cluster, Spec};

const TTL: Duration = Duration::from_secs(10);

fn ids() -> (u32, u32) {
    // SAFETY: geteuid/getegid have no preconditions.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

async fn cluster(tag: &str, access_mode: &'static str) -> Cluster {
    Cluster::with(
        tag,
        &Spec {
            servers: 2,
            capacity: 256 << 20,
            stripe_size: 64 << 10,
            access_mode,
            nodes: 1,
            ..Spec::default()
        },
    )
    .await
}

fn names_of(items: &[surge_client::fs::DirItem]) -> Vec<String> {
    let mut v: Vec<String> = items
        .iter()
        .map(|i| String::from_utf8_lossy(&i.name).into_owned())
        .filter(|n| n != "." && n != "..")
        .collect();
    v.sort();
    v
}

/// `os.mkdir('d'); fhs = [open(f'd/{n}', 'w') for n in names]; os.listdir('d')` must list every
/// name, in a private namespace (creates made behind) and in a shared one (under the
/// directory's lease); and a name unlinked behind must be gone from the next listing.
async fn listing_after_changes_behind(access_mode: &'static str) {
    let c = cluster(&format!("listing-{access_mode}"), access_mode).await;
    let fs = Fs::new(c.new_client(0), TTL, TTL);
    let (uid, gid) = ids();
    let d = fs
        .mkdir(1, b"d", NewPerm::exact(0o755), uid, gid)
        .await
        .expect("mkdir");
    let mut want = Vec::new();
    let mut fhs = Vec::new();
    for i in 0..40 {
        let name = format!("f{i:02}");
        let (_, fh, _) = fs
            .create(
                d.ino,
                name.as_bytes(),
                NewPerm::exact(0o644),
                uid,
                gid,
                libc::O_WRONLY,
            )
            .await
            .expect("create");
        fhs.push(fh);
        want.push(name);
    }
    let behind =
        fs.client().counts().get("NamespaceBatch") > 0 || fs.client().counts().get("Create") < 40;
    assert!(
        behind,
        "the creates were made behind (else this tests nothing)"
    );
    let got = names_of(&fs.readdir(d.ino, 0).await.expect("readdir"));
    assert_eq!(
        got, want,
        "a listing right after the creates shows them all"
    );
    for fh in fhs {
        fs.release(fh).await.expect("close");
    }
    // tempfile's pattern: create, write, close, unlink, list.
    fs.unlink(d.ino, b"f07").await.expect("unlink");
    fs.unlink(d.ino, b"f13").await.expect("unlink");
    want.retain(|n| n != "f07" && n != "f13");
    let got = names_of(&fs.readdir(d.ino, 0).await.expect("readdir"));
    assert_eq!(
        got, want,
        "a listing right after unlinks no longer shows them"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_right_after_changes_behind_shows_them_in_a_private_namespace() {
    listing_after_changes_behind("private").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_right_after_changes_behind_shows_them_in_a_shared_namespace() {
    listing_after_changes_behind("striped").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_in_a_directory_made_here_ask_no_lookups_and_go_in_batches() {
    let c = cluster("counts", "private").await;
    let fs = Arc::new(Fs::new(c.new_client(0), TTL, TTL));
    let (uid, gid) = ids();
    let d = fs
        .mkdir(1, b"d", NewPerm::exact(0o755), uid, gid)
        .await
        .expect("mkdir");
    let counts = || fs.client().counts().snapshot();
    let before = counts();
    for i in 0..200 {
        let name = format!("n{i}");
        // What the kernel does before each create: look the name up.
        let e = fs.lookup(d.ino, name.as_bytes()).await.expect_err("absent");
        assert_eq!(e.errno, libc::ENOENT);
        let (_, fh, _) = fs
            .create(
                d.ino,
                name.as_bytes(),
                NewPerm::exact(0o644),
                uid,
                gid,
                libc::O_WRONLY,
            )
            .await
            .expect("create");
        assert!(
            fs.release_fast(fh),
            "an empty file closes without a request"
        );
    }
    fs.fsyncdir().await.expect("fsync of the directory");
    let after = counts();
    let delta =
        |op: &str| after.get(op).copied().unwrap_or(0) - before.get(op).copied().unwrap_or(0);
    assert_eq!(
        delta("Lookup"),
        0,
        "absent names answered from the listing: {after:?}"
    );
    assert_eq!(delta("Create"), 0, "creates made behind: {after:?}");
    let batches = delta("NamespaceBatch");
    assert!(
        (1..=20).contains(&batches),
        "200 creates in few batches, not one each: {batches} ({after:?})"
    );
    // And the server has them all.
    let other = Fs::new(c.new_client(0), TTL, TTL);
    let d2 = other.lookup(1, b"d").await.expect("lookup d");
    let mut n = 0;
    let mut offset = 0;
    loop {
        let items = other.readdir(d2.ino, offset).await.expect("readdir");
        let Some(last) = items.last() else { break };
        offset = last.offset;
        n += names_of(&items).len();
    }
    assert_eq!(n, 200);
}
