//! The drain of a write-behind cache instance (`type=cache`): replays its namespace's journal
//! of changes (kept by the metadata server in the same transaction as each change, see
//! `surge_proto::DrainOp`) on the PFS directory the instance mirrors, in order, and forgets
//! each batch only once it is on the PFS. Runs as the instance's owner, on a host that mounts
//! the PFS.
//!
//! Every step is idempotent, so a batch replayed after a crash (of this worker, of a server,
//! of the host) leaves the PFS as one replay would: a directory or file that exists is kept, a
//! name already removed or renamed is not an error, and file data is copied as the instance
//! holds it when the drain gets there (a later change brings its own entry). File data is
//! written under a temporary name, flushed to stable storage and renamed over its name, so a
//! reader of the PFS never sees a half-copied file and a crash never loses the old copy.
//!
//! Each copy also gets the file's fill name (`THROUGH_DIR/<ino>-fill`, the name the lazy fill
//! links PFS files under): once the journal holds no later change of the file's data, the
//! metadata server counts the file clean (told with the acknowledgement), and may evict it
//! from the fast tier when space is needed; its reads then go to that name. A removal of a
//! file's last name removes its fill name too.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use surge_client::{ClientError, InstanceClient};
use surge_proto::{DrainOp, ErrorCode, FileKind};
use tracing::{debug, warn};

/// Journal entries asked for at once.
const BATCH: u32 = 256;
/// Files copied at once (consecutive journal entries copying files of different paths).
const PARALLEL: usize = 4;
/// Bytes read from the instance per request when copying a file.
const CHUNK: u64 = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("drain journal of the cache instance: {0}")]
    Journal(ClientError),
    #[error("{path}: {what}: {source}")]
    Pfs {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("{path}: reading it from the instance: {source}")]
    Instance { path: PathBuf, source: ClientError },
    #[error("journal entry with a path that leaves the PFS directory: {0:?}")]
    BadPath(String),
    /// Another drainer holds the journal (`Request::DrainHold`): it applies the changes.
    #[error("{0}")]
    Elsewhere(String),
}

/// Counters a caller may read while a drain runs.
#[derive(Debug, Default)]
pub struct DrainStats {
    /// Journal entries applied and forgotten.
    pub entries: AtomicU64,
    /// Files whose data was copied to the PFS.
    pub files: AtomicU64,
    pub bytes: AtomicU64,
    /// Entries pending at the last poll.
    pub pending: AtomicU64,
    /// Nanoseconds during which file data was being copied (the drain's own PFS write rate is
    /// bytes / this).
    pub busy_ns: AtomicU64,
    /// Moves whenever the journal moved on: entries this drainer applied, or the oldest
    /// pending entry advancing while another drainer holds the journal. What a caller that
    /// gives up on a drain making no progress watches.
    pub progress: AtomicU64,
    /// This drainer holds the journal (`Request::DrainHold`): it gives it back when it ends.
    pub holds: AtomicBool,
}

/// How often a drainer renews its hold of the journal while it works.
const HOLD_RENEW: Duration = Duration::from_secs(3);

/// Takes (or renews) the hold of `client`'s journal for this drainer: `Elsewhere` while
/// another drainer holds it.
/// A hold inherited by a restarted server from a drainer that has not come back
/// (`ErrorCode::Again`) is waited for: it lapses within `DRAIN_HOLD`.
async fn hold(client: &InstanceClient, stats: &DrainStats) -> Result<(), DrainError> {
    let start = std::time::Instant::now();
    let mut told = false;
    loop {
        match client.drain_hold(false).await {
            Ok(()) => {
                stats.holds.store(true, Ordering::Relaxed);
                return Ok(());
            }
            Err(e) if e.code() == Some(ErrorCode::Busy) => {
                stats.holds.store(false, Ordering::Relaxed);
                return Err(DrainError::Elsewhere(e.to_string()));
            }
            Err(e)
                if e.code() == Some(ErrorCode::Again)
                    && start.elapsed() < surge_proto::DRAIN_HOLD * 2 =>
            {
                stats.holds.store(false, Ordering::Relaxed);
                if !told {
                    tracing::info!("drain: waiting: {e}");
                    told = true;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(DrainError::Journal(e)),
        }
    }
}

/// Gives the hold of the journal back (a drainer that ends), so another may start at once.
pub async fn release(client: &InstanceClient, stats: &DrainStats) {
    if stats.holds.swap(false, Ordering::Relaxed) {
        if let Err(e) = client.drain_hold(true).await {
            debug!("drain: giving the journal's hold back: {e} (it lapses by itself)");
        }
    }
}

/// The PFS path of a journal path (relative, no `.` or `..`).
fn pfs_path(root: &Path, rel: &[u8]) -> Result<PathBuf, DrainError> {
    let p = Path::new(OsStr::from_bytes(rel));
    if p.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(DrainError::BadPath(String::from_utf8_lossy(rel).into()));
    }
    Ok(root.join(p))
}

pub(crate) fn pfs_err<'a>(
    path: &'a Path,
    what: &'static str,
) -> impl FnOnce(std::io::Error) -> DrainError + 'a {
    move |source| DrainError::Pfs {
        path: path.to_path_buf(),
        what,
        source,
    }
}

fn gone(e: &ClientError) -> bool {
    matches!(e.code(), Some(ErrorCode::NotFound | ErrorCode::Stale))
}

fn ignore_missing(r: std::io::Result<()>) -> std::io::Result<()> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Sets the times of `path` itself (a symbolic link's own, not its target's).
fn set_times(path: &Path, atime: surge_proto::Timestamp, mtime: surge_proto::Timestamp) {
    let ts = |t: surge_proto::Timestamp| libc::timespec {
        tv_sec: t.secs as libc::time_t,
        tv_nsec: i64::from(t.nsec) as _,
    };
    let times = [ts(atime), ts(mtime)];
    if let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) {
        // SAFETY: `c` is a NUL-terminated path and `times` two valid timespecs.
        unsafe {
            libc::utimensat(
                libc::AT_FDCWD,
                c.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
    }
}

pub use surge_proto::{cache_through_path as through_path, CACHE_THROUGH_DIR as THROUGH_DIR};

/// Removes the stable names of written-through files (`THROUGH_DIR`): once the job's mounts
/// are gone and the journal is empty they are extra links to files that have their names, or
/// to files the job removed. Also run before a fill, for what a crashed job left.
pub fn clear_through(root: &Path) -> Result<(), DrainError> {
    let dir = root.join(THROUGH_DIR);
    ignore_missing(std::fs::remove_dir_all(&dir))
        .map_err(pfs_err(&dir, "cannot remove the written-through names in"))
}

/// Where the copy of `dst` is written before it is renamed onto it (one name per file: a copy
/// a crash interrupted is overwritten by the next one, or removed with its file's name).
fn temp_of(dst: &Path) -> PathBuf {
    let name = dst.file_name().unwrap_or_default().to_string_lossy();
    dst.with_file_name(format!(".{name}.surge-drain"))
}

/// How many names the regular file at `dst` has on the PFS, its fill name (the one of `ino`)
/// not counted; 0 when there is none.
fn pfs_names(root: &Path, ino: u64, dst: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::symlink_metadata(dst) else {
        return 0;
    };
    if !m.is_file() {
        return 0;
    }
    let fill = std::fs::symlink_metadata(through_path(root, ino, surge_proto::THROUGH_FILL))
        .is_ok_and(|f| (f.dev(), f.ino()) == (m.dev(), m.ino()));
    m.nlink() - u64::from(fill)
}

/// Gives `file`, the PFS copy of inode `ino`, the inode's fill name in `root` (replacing an
/// older copy's): a name renames do not move, which the file's reads go to once it is evicted
/// from the fast tier. False (logged) when the PFS refuses it: the file is then not evicted.
fn link_fill(root: &Path, ino: u64, file: &Path) -> bool {
    let name = through_path(root, ino, surge_proto::THROUGH_FILL);
    let dir = root.join(THROUGH_DIR);
    let tmp = dir.join(format!("{ino}-fill.new"));
    let r = (|| {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(file)?;
        match std::fs::symlink_metadata(&name) {
            // Linked already (a copy found up to date, a replay).
            Ok(n) if (n.dev(), n.ino()) == (m.dev(), m.ino()) => return Ok(()),
            Ok(_) => {}
            Err(_) if std::fs::symlink_metadata(&dir).is_err() => {
                std::fs::create_dir_all(&dir)?;
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
            }
            Err(_) => {}
        }
        ignore_missing(std::fs::remove_file(&tmp))?;
        std::fs::hard_link(file, &tmp)?;
        std::fs::rename(&tmp, &name)
    })();
    if let Err(e) = r {
        let _ = std::fs::remove_file(&tmp);
        debug!(
            "drain: cannot link {} to {} ({e}); the file stays on the fast tier",
            file.display(),
            name.display()
        );
        return false;
    }
    true
}

/// Removes the fill name of inode `ino`, whose last name went.
fn unlink_fill(root: &Path, ino: u64) -> Result<(), DrainError> {
    let name = through_path(root, ino, surge_proto::THROUGH_FILL);
    ignore_missing(std::fs::remove_file(&name)).map_err(pfs_err(&name, "cannot remove"))
}

/// What a copy of a file's data did.
#[derive(Default)]
struct Copied {
    bytes: u64,
    /// The PFS copy has the file's fill name (see [`link_fill`]).
    linked: bool,
}

/// Copies inode `ino`'s data to `dst` (under a temporary name, flushed, renamed over it),
/// unless `dst` already has its size and mtime, and gives the copy the inode's fill name.
async fn copy_file(
    client: &InstanceClient,
    root: &Path,
    seq: u64,
    ino: u64,
    dst: &Path,
) -> Result<Copied, DrainError> {
    let attr = match client.getattr(ino).await {
        Ok(a) => a,
        Err(e) if gone(&e) => return Ok(Copied::default()),
        Err(source) => {
            return Err(DrainError::Instance {
                path: dst.to_path_buf(),
                source,
            })
        }
    };
    if attr.kind != FileKind::File {
        return Ok(Copied::default());
    }
    // Journaled after the file went through to the PFS: its data is there already (and no
    // longer on the fast tier). The mount waited for every entry before the switch.
    // Made by the lazy fill and still (or for good) on the PFS: the PFS holds its data.
    if attr.through >= surge_proto::THROUGH_FILL_KEPT || (attr.through != 0 && seq > attr.through) {
        return Ok(Copied::default());
    }
    if let Ok(m) = std::fs::symlink_metadata(dst) {
        use std::os::unix::fs::MetadataExt;
        if m.is_file()
            && m.len() == attr.size
            && m.mtime() == attr.mtime.secs
            && m.mtime_nsec() == i64::from(attr.mtime.nsec)
        {
            return Ok(Copied {
                bytes: 0,
                linked: attr.through == 0 && link_fill(root, ino, dst),
            });
        }
    }
    let dir = dst.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir).map_err(pfs_err(dir, "cannot create the directory"))?;
    // A file whose PFS copy has more than one name besides its fill name (hard links: the
    // job's `Link` entries made them, or the PFS had them) is written in place, so that every
    // name sees the new data: a copy renamed onto one name would leave the others on the old
    // data. The PFS is asked, not the instance: the instance's link count is that of the
    // journal's end (a name removed later is still on the PFS at this entry). Any other file
    // is copied to a temporary and renamed onto its name (readers of the PFS never see half
    // a copy).
    let in_place = pfs_names(root, ino, dst) > 1;
    let tmp = if in_place {
        dst.to_path_buf()
    } else {
        temp_of(dst)
    };
    let f = if in_place {
        std::fs::OpenOptions::new()
            .write(true)
            .open(dst)
            .map_err(pfs_err(dst, "cannot open"))?
    } else {
        std::fs::File::create(&tmp).map_err(pfs_err(&tmp, "cannot create"))?
    };
    // The next chunk is read from the instance while the last one is written to the PFS.
    let mut file = Some(f);
    let mut writing: Option<tokio::task::JoinHandle<std::io::Result<std::fs::File>>> = None;
    let mut off = 0;
    // What a failed copy leaves: no temporary (a file written in place keeps its names).
    let discard = (!in_place).then_some(tmp.as_path());
    let fail = |tmp: Option<&Path>| {
        if let Some(t) = tmp {
            let _ = std::fs::remove_file(t);
        }
    };
    while off < attr.size {
        let len = CHUNK.min(attr.size - off);
        let data = match client.read(ino, off, len).await {
            Ok(d) => d,
            Err(e) => {
                if let Some(w) = writing.take() {
                    let _ = w.await;
                }
                fail(discard);
                if gone(&e) {
                    return Ok(Copied::default());
                }
                return Err(DrainError::Instance {
                    path: dst.to_path_buf(),
                    source: e,
                });
            }
        };
        if let Some(w) = writing.take() {
            file = Some(join_write(w, &tmp, discard).await?);
        }
        let Some(f) = file.take() else {
            break;
        };
        // A new copy keeps the file's holes: a block of zeros is not written (the size is
        // set at the end), so a sparse file does not fill the PFS with zeros.
        let at = off;
        writing = Some(tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::FileExt;
            if in_place {
                f.write_all_at(&data, at)?;
            } else {
                crate::pfs::write_data_at(&f, &data, at)?;
            }
            Ok(f)
        }));
        off += len;
    }
    if let Some(w) = writing.take() {
        file = Some(join_write(w, &tmp, discard).await?);
    }
    let Some(f) = file else {
        fail(discard);
        return Ok(Copied::default());
    };
    f.set_len(attr.size)
        .map_err(pfs_err(&tmp, "cannot set the size of"))?;
    f.set_permissions(std::fs::Permissions::from_mode(u32::from(attr.perm)))
        .map_err(pfs_err(&tmp, "cannot set the mode of"))?;
    f.sync_all().map_err(pfs_err(&tmp, "cannot flush"))?;
    drop(f);
    set_times(&tmp, attr.atime, attr.mtime);
    if in_place {
        return Ok(Copied {
            bytes: attr.size,
            linked: attr.through == 0 && link_fill(root, ino, dst),
        });
    }
    // Before the rename: a name replaced later by a copy of a newer version keeps this one.
    let linked = attr.through == 0 && link_fill(root, ino, &tmp);
    std::fs::rename(&tmp, dst).map_err(pfs_err(dst, "cannot rename the copy onto"))?;
    Ok(Copied {
        bytes: attr.size,
        linked,
    })
}

/// The result of a chunk's write to the PFS (the temporary is removed if it failed).
async fn join_write(
    w: tokio::task::JoinHandle<std::io::Result<std::fs::File>>,
    tmp: &Path,
    discard: Option<&Path>,
) -> Result<std::fs::File, DrainError> {
    let r = w
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
    r.map_err(|source| {
        if let Some(t) = discard {
            let _ = std::fs::remove_file(t);
        }
        DrainError::Pfs {
            path: tmp.to_path_buf(),
            what: "cannot write",
            source,
        }
    })
}

/// Makes regular file `p` if it does not exist; never truncates it (a `Data` entry brings the
/// content).
fn create_file(p: &Path) -> Result<(), DrainError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(p)
        .map(drop)
        .map_err(pfs_err(p, "cannot create"))
}

/// Applies one journal entry to the PFS directory `root`; returns the inode whose data it
/// copied and gave its fill name (see [`link_fill`]).
async fn apply(
    client: &InstanceClient,
    root: &Path,
    seq: u64,
    op: &DrainOp,
    stats: &DrainStats,
) -> Result<Option<u64>, DrainError> {
    match op {
        DrainOp::Mkdir { path } => {
            let p = pfs_path(root, path)?;
            std::fs::create_dir_all(&p).map_err(pfs_err(&p, "cannot create the directory"))?;
        }
        DrainOp::Create { path } => {
            let p = pfs_path(root, path)?;
            if let Some(dir) = p.parent() {
                std::fs::create_dir_all(dir).map_err(pfs_err(dir, "cannot create"))?;
            }
            create_file(&p)?;
        }
        DrainOp::Symlink { path, target } => {
            let p = pfs_path(root, path)?;
            if std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()) {
                let _ = std::fs::remove_file(&p);
            }
            std::os::unix::fs::symlink(OsStr::from_bytes(target), &p)
                .map_err(pfs_err(&p, "cannot create the symbolic link"))?;
        }
        DrainOp::Data { ino, path } => {
            let p = pfs_path(root, path)?;
            let c = copy_file(client, root, seq, *ino, &p).await?;
            if c.bytes > 0 {
                stats.files.fetch_add(1, Ordering::Relaxed);
                stats.bytes.fetch_add(c.bytes, Ordering::Relaxed);
            }
            return Ok(c.linked.then_some(*ino));
        }
        DrainOp::Attr { ino, path } => {
            let p = pfs_path(root, path)?;
            match (client.getattr(*ino).await, std::fs::symlink_metadata(&p)) {
                (Ok(a), Ok(m)) => {
                    if !m.is_symlink() {
                        std::fs::set_permissions(
                            &p,
                            std::fs::Permissions::from_mode(u32::from(a.perm)),
                        )
                        .map_err(pfs_err(&p, "cannot set the mode of"))?;
                    }
                    set_times(&p, a.atime, a.mtime);
                }
                (Ok(_), Err(_)) => {}
                (Err(e), _) if gone(&e) => {}
                (Err(source), _) => return Err(DrainError::Instance { path: p, source }),
            }
        }
        DrainOp::Unlink { path, gone } => {
            let p = pfs_path(root, path)?;
            ignore_missing(std::fs::remove_file(&p)).map_err(pfs_err(&p, "cannot remove"))?;
            let _ = std::fs::remove_file(temp_of(&p));
            if let Some(ino) = gone {
                unlink_fill(root, *ino)?;
            }
        }
        DrainOp::Rmdir { path } => {
            let p = pfs_path(root, path)?;
            ignore_missing(std::fs::remove_dir(&p))
                .map_err(pfs_err(&p, "cannot remove the directory"))?;
        }
        DrainOp::Rename { from, to, gone } => {
            let (f, t) = (pfs_path(root, from)?, pfs_path(root, to)?);
            if let Some(ino) = gone {
                unlink_fill(root, *ino)?;
            }
            // A copy of the old name a crash interrupted: the name's data now comes with the
            // new name's entries.
            let _ = std::fs::remove_file(temp_of(&f));
            match std::fs::rename(&f, &t) {
                Ok(()) => {}
                // Replayed after a crash: done before, or never made here.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if std::fs::symlink_metadata(&t).is_err() {
                        debug!(
                            "drain: rename of {} that the PFS does not have",
                            f.display()
                        );
                    }
                }
                Err(e) => {
                    return Err(DrainError::Pfs {
                        path: f,
                        what: "cannot rename",
                        source: e,
                    })
                }
            }
        }
        DrainOp::Through { ino, path } => {
            let stable = through_path(root, *ino, seq);
            // Made by an earlier application of this very entry (a replay after a crash): it
            // is the file, whatever later entries did to the visible name since.
            if std::fs::symlink_metadata(&stable).is_err() {
                let dir = root.join(THROUGH_DIR);
                std::fs::create_dir_all(&dir).map_err(pfs_err(&dir, "cannot create"))?;
                let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
                // Every change before this entry is applied: `p` is the file, with its data.
                let p = pfs_path(root, path)?;
                if std::fs::symlink_metadata(&p).is_err() {
                    create_file(&p)?;
                }
                std::fs::hard_link(&p, &stable)
                    .map_err(pfs_err(&stable, "cannot link the file written through to"))?;
            }
        }
        DrainOp::Link { from, to } => {
            let (f, t) = (pfs_path(root, from)?, pfs_path(root, to)?);
            match std::fs::hard_link(&f, &t) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(DrainError::Pfs {
                        path: t,
                        what: "cannot link",
                        source: e,
                    })
                }
            }
        }
    }
    Ok(None)
}

/// A file open on a mount whose metadata server's mtime is younger than this is still being
/// written (a cache mount commits files being written every second): its copy waits, so a file
/// is copied once it is complete instead of once per commit. A file closed on every mount (as
/// the metadata server knows from the mounts' reports, within a second) is copied at once.
pub const SETTLE: Duration = Duration::from_secs(2);

/// True when the `Data` entry's inode is open on a mount (`open`) and changed within
/// `settle` (it is being written). A file closed everywhere is complete: copied at once.
async fn unsettled(client: &InstanceClient, op: &DrainOp, settle: Duration, open: &[u64]) -> bool {
    let DrainOp::Data { ino, .. } = op else {
        return false;
    };
    if open.binary_search(ino).is_err() {
        return false;
    }
    let Ok(a) = client.getattr(*ino).await else {
        return false;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mtime = Duration::new(a.mtime.secs.max(0) as u64, a.mtime.nsec);
    now.saturating_sub(mtime) < settle
}

/// Applies the journal until it is empty; returns the entries applied. An entry that fails
/// stops the pass (and stays in the journal): later changes may depend on it.
pub async fn drain_pass(
    client: &InstanceClient,
    root: &Path,
    stats: &DrainStats,
) -> Result<u64, DrainError> {
    let r = drain_pass_settled(client, root, stats, None).await;
    release(client, stats).await;
    r
}

/// [`drain_pass`] that, with `settle`, stops at the first file written within `settle`
/// (the entries before it are applied and forgotten; it and the rest wait for the next pass).
pub async fn drain_pass_settled(
    client: &InstanceClient,
    root: &Path,
    stats: &DrainStats,
    settle: Option<Duration>,
) -> Result<u64, DrainError> {
    // One drainer at a time (`Request::DrainHold`), renewed while this pass works.
    hold(client, stats).await?;
    let work = drain_pass_held(client, root, stats, settle);
    let renew = async {
        loop {
            tokio::time::sleep(HOLD_RENEW).await;
            if let Err(e) = hold(client, stats).await {
                return e;
            }
        }
    };
    tokio::select! {
        r = work => r,
        e = renew => Err(e),
    }
}

async fn drain_pass_held(
    client: &InstanceClient,
    root: &Path,
    stats: &DrainStats,
    settle: Option<Duration>,
) -> Result<u64, DrainError> {
    let mut applied = 0;
    loop {
        let (entries, pending, open) = client
            .drain_poll(0, BATCH)
            .await
            .map_err(DrainError::Journal)?;
        stats.pending.store(pending, Ordering::Relaxed);
        if entries.is_empty() {
            return Ok(applied);
        }
        // A mount waits for everything before a `Through` entry (the fast tier is full): what
        // comes before it is not held back.
        let urgent_upto = entries
            .iter()
            .filter(|e| matches!(e.op, DrainOp::Through { .. }))
            .map(|e| e.seq)
            .max()
            .unwrap_or(0);
        let mut done = 0;
        let mut waiting = false;
        let mut failed = None;
        let mut linked = Vec::new();
        while done < entries.len() {
            // The next entry; with it, while they copy files of other paths, the next ones
            // (independent: they are copied at once).
            // Creates and mkdirs between them join the group: a copy makes its file's
            // directory and renames its copy onto the name, so neither depends on them (a
            // checkpoint's journal is "create a, data a, create b, data b": without this the
            // two files were copied one after the other, at one writer's rate).
            let mut group = vec![&entries[done]];
            if matches!(entries[done].op, DrainOp::Data { .. }) {
                let mut copies = 1;
                while let Some(next) = entries.get(done + group.len()) {
                    match &next.op {
                        DrainOp::Create { .. } | DrainOp::Mkdir { .. } => {}
                        DrainOp::Data { path, .. } => {
                            if copies >= PARALLEL
                                || group.iter().any(
                                    |g| matches!(&g.op, DrainOp::Data { path: p, .. } if p == path),
                                )
                            {
                                break;
                            }
                            copies += 1;
                        }
                        _ => break,
                    }
                    group.push(next);
                }
                // Trailing creates wait for the next group (they may precede its copies).
                while group.len() > 1 && !matches!(group[group.len() - 1].op, DrainOp::Data { .. })
                {
                    group.pop();
                }
            }
            if let Some(s) = settle.filter(|_| group[0].seq > urgent_upto) {
                let mut settled = 0;
                for g in &group {
                    if unsettled(client, &g.op, s, &open).await {
                        waiting = true;
                        break;
                    }
                    settled += 1;
                }
                group.truncate(settled);
            }
            if group.is_empty() {
                break;
            }
            let t = std::time::Instant::now();
            debug!(
                "drain: applying {:?}",
                group.iter().map(|g| (g.seq, &g.op)).collect::<Vec<_>>()
            );
            let results = futures::future::join_all(
                group
                    .iter()
                    .map(|g| apply(client, root, g.seq, &g.op, stats)),
            )
            .await;
            if matches!(group[0].op, DrainOp::Data { .. }) {
                stats
                    .busy_ns
                    .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
            // Only the entries before the first failure count as applied (the others are
            // applied again: every step is idempotent).
            for r in results {
                match r {
                    Ok(l) => {
                        done += 1;
                        linked.extend(l);
                    }
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            if failed.is_some() || waiting {
                break;
            }
        }
        if done > 0 {
            client
                .drain_ack(entries[done - 1].seq, linked)
                .await
                .map_err(DrainError::Journal)?;
        }
        applied += done as u64;
        stats.entries.fetch_add(done as u64, Ordering::Relaxed);
        stats.progress.fetch_add(done as u64, Ordering::Relaxed);
        stats
            .pending
            .store(pending.saturating_sub(done as u64), Ordering::Relaxed);
        if let Some(e) = failed {
            return Err(e);
        }
        if waiting {
            return Ok(applied);
        }
    }
}

/// What a background drain reports back.
#[derive(Debug, Default)]
pub struct DrainState {
    pub stats: DrainStats,
    /// The last error (the drain retries: a server may come back, the PFS may get room).
    pub error: parking_lot::Mutex<Option<String>>,
}

/// How long a finishing drain may go without the journal moving before it is given up (the
/// job's teardown, a drain task, `surge run`).
pub const DRAIN_STALL: Duration = Duration::from_secs(60);

/// Waits for the drain `task` (a [`drain_loop`] reporting into `state`) to end, calling `tick`
/// every `every`. While `stopping()` holds, a journal that does not move for `stall` aborts the
/// task and gives the reason: the last error and what is not on the PFS.
pub async fn watch(
    state: &DrainState,
    task: &tokio::task::JoinHandle<()>,
    stall: Duration,
    every: Duration,
    stopping: impl Fn() -> bool,
    mut tick: impl FnMut(),
) -> Result<(), String> {
    let (mut last, mut since) = (u64::MAX, std::time::Instant::now());
    while !task.is_finished() {
        tokio::time::sleep(every).await;
        tick();
        let done = state.stats.progress.load(Ordering::Relaxed);
        if !stopping() || done != last {
            (last, since) = (done, std::time::Instant::now());
        } else if since.elapsed() > stall {
            task.abort();
            return Err(format!(
                "made no progress for {} s: {}; {} change(s) not on the PFS",
                stall.as_secs(),
                state.error.lock().clone().unwrap_or_default(),
                state.stats.pending.load(Ordering::Relaxed)
            ));
        }
    }
    Ok(())
}

/// Drains in the background until `stop` is set and the journal is empty (or `stop` is set
/// and `give_up` too): polls every `every` when idle, retries after errors (a server being
/// restarted, a full PFS), logging each new error once. While another drainer holds the
/// journal (a persistent cache used by two jobs, a drain started by hand) this one waits; told
/// to stop then, it ends once every change journaled before the stop is on the PFS.
pub async fn drain_loop(
    client: Arc<InstanceClient>,
    root: PathBuf,
    state: Arc<DrainState>,
    stop: Arc<AtomicBool>,
    every: Duration,
) {
    // The newest journal entry when the stop came (what must be on the PFS before the end).
    let mut stop_at: Option<u64> = None;
    let mut oldest_seen = 0;
    loop {
        // While the job runs, files still being written wait (see [`SETTLE`]); once told to
        // stop (the job is over, its files closed), everything goes.
        let stopping = stop.load(Ordering::SeqCst);
        let settle = (!stopping).then_some(SETTLE);
        match drain_pass_settled(&client, &root, &state.stats, settle).await {
            Ok(_) => {
                *state.error.lock() = None;
                if stopping {
                    release(&client, &state.stats).await;
                    return;
                }
            }
            Err(DrainError::Elsewhere(why)) => {
                let st = &state.stats;
                if let Ok(p) = client.drain_progress().await {
                    st.pending.store(p.pending, Ordering::Relaxed);
                    if p.oldest_entry != oldest_seen {
                        oldest_seen = p.oldest_entry;
                        st.progress.fetch_add(1, Ordering::Relaxed);
                    }
                    if stopping {
                        let upto = *stop_at.get_or_insert(p.newest);
                        if p.drained_upto(upto) {
                            return;
                        }
                    }
                }
                let mut last = state.error.lock();
                if last.as_deref() != Some(why.as_str()) {
                    tracing::info!("drain of {}: waiting: {why}", root.display());
                }
                *last = Some(why);
            }
            Err(e) => {
                let text = e.to_string();
                let mut last = state.error.lock();
                if last.as_deref() != Some(text.as_str()) {
                    warn!("drain of {}: {text} (retrying)", root.display());
                }
                *last = Some(text);
            }
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_paths_stay_inside_the_pfs_directory() {
        let root = Path::new("/pfs/dir");
        assert_eq!(
            pfs_path(root, b"a/b").unwrap(),
            PathBuf::from("/pfs/dir/a/b")
        );
        assert!(pfs_path(root, b"../etc/passwd").is_err());
        assert!(pfs_path(root, b"/etc/passwd").is_err());
        assert!(pfs_path(root, b"a/./b").is_ok_and(|p| p == Path::new("/pfs/dir/a/b")));
    }
}
