//! Cache instances (`type=cache`): the lazy fill. The fill before the job makes the namespace
//! of the PFS directory without copying data: each file is marked
//! [`THROUGH_FILL`](surge_proto::THROUGH_FILL) and its PFS file is linked under its fill name
//! (`.surge-through/<ino>-fill`, which renames of its visible name do not move). A read of such
//! a file goes to that PFS file, at the PFS's rate, and starts a copy of the whole file into
//! the fast tier in the background (one mount at a time, by a claim the metadata server keeps);
//! once the copy is complete the metadata server takes the mark away and reads come from the
//! tier. The PFS file is never written while the mark is on: a write, truncate or `fallocate`
//! first finishes the copy (waiting for another mount's), so the tier copy is complete when
//! the file first changes, or, when the tier is full and nothing clean can be evicted (see
//! `evict`), writes the file through to its PFS file from then on
//! ([`THROUGH_FILL_KEPT`](surge_proto::THROUGH_FILL_KEPT), Liu's fall-back). A copy a read
//! started gives up when the tier is full (the file stays on the PFS): reads evict nothing.
//! Files evicted from the tier are marked as files of the lazy fill again and read the same way.

use super::through::read_at;
use super::{Fs, FsError, FsResult};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use surge_core::Ino;
use surge_proto::{ErrorCode, FillStep, THROUGH_FILL, THROUGH_FILL_KEPT};
use tracing::{debug, info, warn};

/// Bytes copied from the PFS into the tier per step (the claim is renewed at each).
const CHUNK: u64 = 8 << 20;
/// How long a change of a file waits for another mount's copy of it before failing.
const OTHER_COPY_WAIT: Duration = Duration::from_secs(120);

/// The lazy fill of one file on this node.
pub(crate) struct Fill {
    /// The PFS file, opened by its fill name.
    file: Arc<std::fs::File>,
    /// The file's size, as the fill recorded it (it cannot change while the mark is on).
    size: u64,
    /// The background copy holds this shared for each chunk; a change of the file that must
    /// have it on the tier first holds it exclusively.
    lock: tokio::sync::RwLock<()>,
    /// A background copy was started.
    started: AtomicBool,
    /// The background copy stops at its next chunk (a change took over).
    stop: AtomicBool,
    /// The file is on the fast tier now: reads go there.
    done: AtomicBool,
}

/// How a copy into the tier ended.
enum Copied {
    /// The whole file is on the tier (the mark is off).
    Done,
    /// The file is written through to its PFS file for good.
    Kept,
    /// Another mount is copying it (background copies only).
    Elsewhere,
    /// The tier is full.
    Full,
    /// A change of the file took over (background copies only).
    Stopped,
}

/// Opens a cache file's PFS file `path`, for writing too when that is allowed (a file written
/// through once the tier is full), never through a symbolic link; as `user` when given.
pub(super) fn open_pfs_file(
    path: &std::path::Path,
    user: Option<&surge_auth::Caller>,
) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |write: bool| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
    };
    let open = || match open(true) {
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => open(false),
        other => other,
    };
    match user {
        // A root mount acting for the job's user opens with the user's rights: a name under
        // `.surge-through` the user hard-linked to a file they may not read stays unreadable.
        Some(u) => surge_core::sys::as_fs_user(u.uid, u.gid, &u.groups, open),
        None => open(),
    }
}

impl Fs {
    /// The lazy fill of `ino` while its reads still go to the PFS on this node.
    pub(super) fn fill_of(&self, ino: Ino) -> Option<Arc<Fill>> {
        if !self.cache {
            return None;
        }
        self.inodes
            .with(ino, |i| i.fill.clone())
            .flatten()
            .filter(|f| !f.done.load(Ordering::Acquire))
    }

    /// Opens lazily filled `ino` (`size` bytes) by its PFS fill name.
    pub(super) fn open_fill(&self, ino: Ino, size: u64) -> FsResult<Arc<Fill>> {
        if let Some(f) = self.fill_of(ino) {
            return Ok(f);
        }
        let Some(root) = self.client.desc.cache_pfs.as_deref() else {
            return Err(FsError::new(libc::EIO, "not a cache instance"));
        };
        let path = surge_proto::cache_through_path(std::path::Path::new(root), ino, THROUGH_FILL);
        let file = open_pfs_file(&path, self.pfs_user.as_ref()).map_err(|e| {
            FsError::io(
                &format!(
                    "open {} (inode {ino}, not yet copied from the PFS)",
                    path.display()
                ),
                e,
            )
        })?;
        let fill = Arc::new(Fill {
            file: Arc::new(file),
            size,
            lock: tokio::sync::RwLock::new(()),
            started: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            done: AtomicBool::new(false),
        });
        Ok(self.inodes.with_entry(ino, |i| match &i.fill {
            Some(f) if !f.done.load(Ordering::Acquire) => f.clone(),
            _ => {
                i.fill = Some(fill.clone());
                fill
            }
        }))
    }

    /// The file is on the fast tier (another node copied it): forget its fill here.
    pub(super) fn forget_fill(&self, ino: Ino) {
        if self.cache {
            self.inodes.with(ino, |i| i.fill = None);
        }
    }

    /// A read of lazily filled `ino`: from its PFS file; the first one starts the copy into
    /// the tier in the background.
    pub(super) async fn read_fill(
        &self,
        ino: Ino,
        fill: Arc<Fill>,
        offset: u64,
        len: u64,
    ) -> FsResult<Vec<u8>> {
        if !fill.started.swap(true, Ordering::AcqRel) {
            let client = self.client.clone();
            let f = fill.clone();
            let drop_pages = self.drop_pages.get().cloned();
            tokio::spawn(async move {
                let t = Instant::now();
                match copy_in(&client, ino, &f, f.size, true, drop_pages).await {
                    Ok(Copied::Done) => debug!(
                        "inode {ino}: {} bytes copied from the PFS into the fast tier in {:.2} s",
                        f.size,
                        t.elapsed().as_secs_f64()
                    ),
                    Ok(Copied::Full) => {
                        info!("inode {ino}: the fast tier is full; its reads stay on the PFS")
                    }
                    Ok(_) => {}
                    Err(e) => warn!(
                        "inode {ino}: copying it from the PFS into the fast tier failed ({e}); \
                         its reads stay on the PFS"
                    ),
                }
            });
        }
        read_at(fill.file.clone(), offset, len).await
    }

    /// Before a write, truncate (to `keep` bytes) or `fallocate` of `ino`: if it is lazily
    /// filled and not yet on the tier, copies its first `keep` bytes there and takes the mark
    /// away (waiting for another mount's copy), or, when the tier is full, makes it written
    /// through to its PFS file from now on.
    pub(super) async fn settle_fill(&self, ino: Ino, keep: u64) -> FsResult<()> {
        let Some(fill) = self.fill_of(ino) else {
            return Ok(());
        };
        fill.stop.store(true, Ordering::Release);
        let _changing = fill.lock.write().await;
        if fill.done.load(Ordering::Acquire) {
            return Ok(());
        }
        let t = Instant::now();
        let upto = keep.min(fill.size);
        // A full tier: clean files are evicted first (see `evict`).
        let mut rounds = 0;
        let outcome = loop {
            let evictions = self.evictions();
            let o = copy_in(&self.client, ino, &fill, upto, false, None).await?;
            if matches!(o, Copied::Full)
                && rounds < super::evict::EVICT_ROUNDS
                && self.make_room(ino, upto, evictions).await
            {
                rounds += 1;
                continue;
            }
            break o;
        };
        let kept = match outcome {
            Copied::Done => false,
            Copied::Kept => true,
            Copied::Full => {
                // Written through for good (`CacheThrough` of a marked file).
                let through = self.client.cache_through(ino).await?;
                if through != THROUGH_FILL_KEPT && through != 0 {
                    return Err(FsError::new(
                        libc::EIO,
                        format!("inode {ino}: unexpected state {through} after the fill"),
                    ));
                }
                through != 0
            }
            Copied::Elsewhere | Copied::Stopped => {
                return Err(FsError::new(
                    libc::EIO,
                    format!("inode {ino}: the copy from the PFS was taken over"),
                ))
            }
        };
        fill.done.store(true, Ordering::Release);
        let file = fill.file.clone();
        self.inodes.with(ino, |i| {
            i.fill = None;
            if kept {
                i.through = Some(file);
            }
        });
        if kept {
            info!(
                "inode {ino}: the fast tier is full; written through to its PFS file from now on"
            );
        } else {
            debug!(
                "inode {ino}: {upto} bytes copied from the PFS before its first change ({:.2} s)",
                t.elapsed().as_secs_f64()
            );
        }
        Ok(())
    }
}

/// The copy of `ino` into the tier found it full after `copied` bytes: removes what it copied
/// (the file stays on the PFS, its reads go there; the space goes to the others) and gives
/// the claim back.
async fn tier_full(client: &crate::instance::InstanceClient, ino: Ino, copied: u64) {
    if copied > 0 {
        if let Err(e) = client.remove_objects(ino, copied).await {
            debug!("inode {ino}: removing its partial copy in the tier: {e}");
        }
    }
    let _ = client.cache_fill(ino, FillStep::Release).await;
}

/// Copies the first `upto` bytes of lazily filled `ino` from its PFS file into the fast tier
/// and takes the mark away. `background`: the read-triggered copy (gives way to another
/// mount's copy and to a change of the file); otherwise the caller holds `fill.lock`
/// exclusively and another mount's copy is waited for. `drop_pages`: called once the whole
/// file is in the tier, before the mark goes: the kernel's pages of the file, cached by the
/// reads through this process from the PFS, are dropped then (in the background of the
/// job), not by the next open of the file, which reads it by kernel passthrough and would
/// otherwise drop them itself (a re-read right after a first read of 2 GiB ran at 0.78 of a
/// scratch instance's, 1.0 once they were gone).
async fn copy_in(
    client: &Arc<crate::instance::InstanceClient>,
    ino: Ino,
    fill: &Fill,
    upto: u64,
    background: bool,
    drop_pages: Option<super::PageDrop>,
) -> FsResult<Copied> {
    let mut off = 0;
    let waiting = Instant::now();
    loop {
        // (Re)claim: one mount copies a file at a time.
        match client.cache_fill(ino, FillStep::Claim).await {
            Ok(THROUGH_FILL) => {}
            Ok(0) => {
                fill.done.store(true, Ordering::Release);
                return Ok(Copied::Done);
            }
            Ok(_) => return Ok(Copied::Kept),
            Err(e) if e.code() == Some(ErrorCode::Busy) => {
                if background {
                    return Ok(Copied::Elsewhere);
                }
                if waiting.elapsed() > OTHER_COPY_WAIT {
                    return Err(FsError::new(
                        libc::EIO,
                        format!(
                            "inode {ino}: another mount has been copying it from the PFS for \
                             over {} s; the change waiting for it fails",
                            OTHER_COPY_WAIT.as_secs()
                        ),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        if off >= upto {
            break;
        }
        let _copying = if background {
            let g = fill.lock.read().await;
            if fill.stop.load(Ordering::Acquire) {
                let _ = client.cache_fill(ino, FillStep::Release).await;
                return Ok(Copied::Stopped);
            }
            Some(g)
        } else {
            None
        };
        let len = CHUNK.min(upto - off);
        let data = read_at(fill.file.clone(), off, len).await?;
        if (data.len() as u64) < len {
            let _ = client.cache_fill(ino, FillStep::Release).await;
            return Err(FsError::new(
                libc::EIO,
                format!(
                    "inode {ino}: its PFS file is shorter ({} bytes) than when the cache was \
                     filled ({} bytes): it was changed outside the job",
                    off + data.len() as u64,
                    fill.size
                ),
            ));
        }
        match client.write(ino, off, &data).await {
            Ok(n) if n == len => {}
            // A short write: a later stripe's fragment is full (the first one's refusal is
            // the error below). What was copied is given back: the file stays on the PFS.
            Ok(n) => {
                debug!("inode {ino}: {n} of {len} bytes at {off} fit in the tier");
                tier_full(client, ino, off + n).await;
                return Ok(Copied::Full);
            }
            Err(e) if e.code() == Some(ErrorCode::NoSpace) => {
                tier_full(client, ino, off).await;
                return Ok(Copied::Full);
            }
            Err(e) => {
                let _ = client.cache_fill(ino, FillStep::Release).await;
                return Err(e.into());
            }
        }
        off += len;
    }
    if let Some(drop_pages) = drop_pages {
        let _ = tokio::task::spawn_blocking(move || drop_pages(ino)).await;
    }
    match client.cache_fill(ino, FillStep::Done).await? {
        0 => {
            fill.done.store(true, Ordering::Release);
            Ok(Copied::Done)
        }
        _ => Ok(Copied::Kept),
    }
}
