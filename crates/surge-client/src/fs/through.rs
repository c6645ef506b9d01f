//! Cache instances (`type=cache`) when the fast tier is full: Liu's fall-back to writing
//! through. A write the servers refuse for want of space switches its file to the PFS: what
//! the file holds so far is drained there first (the drain replays every change before the
//! switch, this file's data included), the drain gives the PFS file a stable name
//! (`cache_through_path`: `CACHE_THROUGH_DIR/<ino>-<entry>`, so renames journaled later do not
//! move it under the mount), the
//! fast tier's copy is removed (its space goes to the other files) and from then on this
//! file's reads, writes, truncates and syncs go to the PFS file. The metadata server keeps the
//! file's attributes as for any other file and journals only attribute changes for it.
//!
//! Also `fsync=pfs`: an `fsync` that returns once the drain copied everything before it.

use super::{Fs, FsError, FsResult};
use std::sync::Arc;
use std::time::{Duration, Instant};
use surge_core::Ino;
use tracing::{info, warn};

/// How long a wait for the drain (`fsync=pfs`, a switch to writing through) goes on without
/// the drain making progress before it fails.
pub(super) const DRAIN_STALL: Duration = Duration::from_secs(60);

impl Fs {
    /// The lock a switch of `ino` to writing through holds exclusively (see `through_locks`).
    pub(super) fn through_lock(&self, ino: Ino) -> &tokio::sync::RwLock<()> {
        &self.through_locks[(ino as usize) % self.through_locks.len()]
    }

    /// The PFS file of `ino` if it is written through and open here.
    pub(super) fn through_file(&self, ino: Ino) -> Option<Arc<std::fs::File>> {
        if !self.cache {
            return None;
        }
        self.inodes.with(ino, |i| i.through.clone()).flatten()
    }

    /// Waits until every change journaled up to entry `target` is on the PFS (`applied`: until
    /// the drain applied every entry up to it, see `DrainProgress::applied_upto`). `what`
    /// names the waiter in the error when the drain stops making progress for
    /// [`DRAIN_STALL`].
    pub(super) async fn wait_drained(
        &self,
        target: u64,
        what: &str,
        applied: bool,
    ) -> FsResult<()> {
        let mut oldest = None;
        let mut moved = Instant::now();
        let check = |p: &surge_proto::DrainProgress| {
            if oldest != Some(p.oldest_entry) {
                oldest = Some(p.oldest_entry);
                moved = Instant::now();
                return Ok(());
            }
            if moved.elapsed() <= DRAIN_STALL {
                return Ok(());
            }
            Err(FsError::new(
                libc::EIO,
                format!(
                    "{what}: the drain to {} made no progress for {} s ({} change(s) \
                         pending)",
                    self.client.desc.cache_pfs.as_deref().unwrap_or("the PFS"),
                    DRAIN_STALL.as_secs(),
                    p.pending
                ),
            ))
        };
        if applied {
            self.client.wait_applied(target, check).await
        } else {
            self.client.wait_drained(target, check).await
        }
    }

    /// `fsync=pfs`: waits until everything journaled so far (the commit just made included)
    /// is on the PFS.
    pub(super) async fn wait_on_pfs(&self, ino: Ino) -> FsResult<()> {
        let newest = self.client.drain_progress().await?.newest;
        self.wait_drained(
            newest,
            &format!("fsync of inode {ino} (fsync=pfs; the file is on the fast tier only)"),
            false,
        )
        .await
    }

    /// The PFS file of written-through `ino` (`through` is its `Through` journal entry),
    /// opened once the drain gave it its stable name.
    pub(super) async fn open_through(
        &self,
        ino: Ino,
        through: u64,
    ) -> FsResult<Arc<std::fs::File>> {
        if let Some(f) = self.through_file(ino) {
            return Ok(f);
        }
        let Some(root) = self.client.desc.cache_pfs.as_deref() else {
            return Err(FsError::new(libc::EIO, "not a cache instance"));
        };
        // A file of the lazy fill has its PFS file linked by the fill, not by the drain.
        if through < surge_proto::THROUGH_FILL_KEPT {
            // Copies of other files moved after the `Through` need not be done.
            self.wait_drained(
                through,
                &format!("inode {ino}, written through to the PFS"),
                true,
            )
            .await?;
        }
        let path = surge_proto::cache_through_path(std::path::Path::new(root), ino, through);
        let f = super::fill::open_pfs_file(&path, self.pfs_user.as_ref())
            .map_err(|e| FsError::io(&format!("open {}", path.display()), e))?;
        let f = Arc::new(f);
        Ok(self
            .inodes
            .with_entry(ino, |i| i.through.get_or_insert(f).clone()))
    }

    /// The fast tier refused a write (or `fallocate`) of `ino` for want of space: from now on
    /// the file is written through to the PFS. Returns its PFS file; a switch that fails is
    /// the ENOSPC the caller would have had, with the reason.
    pub(super) async fn go_through(&self, ino: Ino) -> FsResult<Arc<std::fs::File>> {
        self.switch_through(ino).await.map_err(|e| {
            warn!("inode {ino}: the fast tier is full and writing through failed: {e}");
            FsError::new(
                libc::ENOSPC,
                format!("the fast tier is full and writing through to the PFS failed: {e}"),
            )
        })
    }

    async fn switch_through(&self, ino: Ino) -> FsResult<Arc<std::fs::File>> {
        let _switch = self.through_lock(ino).write().await;
        if let Some(f) = self.through_file(ino) {
            return Ok(f);
        }
        let t = Instant::now();
        // What this node wrote so far, in the journal before the switch.
        self.commit(ino).await?;
        let seq = self.client.cache_through(ino).await?;
        let f = self.open_through(ino, seq).await?;
        // The PFS holds the file now: its fast-tier copy gives its space to the others.
        self.inodes.take_touched(ino);
        let size = self.inodes.size(ino);
        if let Err(e) = self.client.remove_objects(ino, size).await {
            warn!("inode {ino} written through: its fast-tier copy stays ({e})");
        }
        info!(
            "inode {ino}: the fast tier is full, written through to {} from now on (switch took \
             {:.2} s)",
            self.client.desc.cache_pfs.as_deref().unwrap_or("the PFS"),
            t.elapsed().as_secs_f64()
        );
        Ok(f)
    }
}

/// Runs `op` (I/O on a PFS file) off the async threads: the PFS is slow. `what` names it in
/// the error.
pub(super) async fn on_pfs<T: Send + 'static>(
    what: &str,
    op: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> FsResult<T> {
    tokio::task::spawn_blocking(op)
        .await
        .map_err(|e| FsError::new(libc::EIO, format!("{what}: {e}")))?
        .map_err(|e| FsError::io(what, e))
}

/// `pread` of up to `len` bytes at `offset` of `f` (short only at the end of the file).
pub(super) async fn read_at(f: Arc<std::fs::File>, offset: u64, len: u64) -> FsResult<Vec<u8>> {
    on_pfs("read from the PFS", move || {
        let mut buf = vec![0u8; len as usize];
        let got = surge_core::sys::read_full_at(&f, &mut buf, offset)?;
        buf.truncate(got);
        Ok(buf)
    })
    .await
}
