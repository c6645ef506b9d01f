//! What a file really holds: `st_blocks` from the space its objects take on the fragments'
//! devices, and `SEEK_DATA`/`SEEK_HOLE` answered from the objects' own holes, so `du`,
//! `tar -S` and `cp --sparse=auto` see a sparse file as sparse (Lustre's glimpse does the same
//! for its OSTs' objects).
//!
//! A regular file's allocation is asked of its fragments (objects on this host are measured
//! here) and remembered per inode with the size and mtime it was measured at: a file that did
//! not change is not asked again. A file open here by passthrough is measured from its
//! backing file. Files of a cache instance whose data is on the PFS (written through, or left
//! there by the lazy fill) are reported dense: what the tier holds of them says nothing of
//! their data, and a copying tool must never take a byte of it for a hole.

use super::{Fs, FsError, FsResult};
use std::os::unix::fs::MetadataExt;
use surge_core::Ino;
use surge_proto::{Attr, FileKind};
use tracing::debug;

/// `st_blocks` when nothing better is known: the size in 512-byte blocks.
pub fn dense_blocks(size: u64) -> u64 {
    size.div_ceil(512)
}

impl Fs {
    /// `st_blocks` (512-byte units) of the file whose attributes are `a` (as this node reports
    /// them: its own writes included).
    pub async fn blocks(&self, a: &Attr) -> u64 {
        if a.kind != FileKind::File {
            return dense_blocks(a.size);
        }
        if a.size == 0 {
            return 0;
        }
        if self.cache && (a.through != 0 || self.pfs_data(a.ino)) {
            return dense_blocks(a.size);
        }
        if let Some(b) = self.inodes.backing(a.ino) {
            if let Ok(md) = b.metadata() {
                return md.blocks();
            }
        }
        let key = (a.size, a.mtime);
        let known = self
            .inodes
            .with(a.ino, |i| i.blocks.filter(|(k, _)| *k == key))
            .flatten();
        if let Some((_, blocks)) = known {
            return blocks;
        }
        match self.client.allocated(a.ino, surge_proto::extent(a)).await {
            Ok(bytes) => {
                let blocks = bytes.div_ceil(512);
                self.inodes.with(a.ino, |i| i.blocks = Some((key, blocks)));
                blocks
            }
            Err(e) => {
                debug!(
                    "inode {}: allocation unknown ({e}): blocks from the size",
                    a.ino
                );
                dense_blocks(a.size)
            }
        }
    }

    /// `lseek(2)` `SEEK_DATA` (`hole` false) or `SEEK_HOLE` on open file `fh` from `offset`.
    /// ENXIO at or past the end of the file, and for `SEEK_DATA` when only holes follow.
    pub async fn seek(&self, fh: u64, offset: i64, hole: bool) -> FsResult<u64> {
        let ino = self.inodes.handle_ino(fh)?;
        let size = self.inodes.size(ino);
        let offset = u64::try_from(offset)
            .ok()
            .filter(|&o| o < size)
            .ok_or_else(|| FsError::new(libc::ENXIO, "seek at or past the end of the file"))?;
        let found = if self.cache && self.pfs_data(ino) {
            // Its data is on the PFS: all of it is taken for data.
            Some(if hole { size } else { offset })
        } else if let Some(b) = self.inodes.backing(ino) {
            surge_core::sys::seek_data_or_hole(&b, offset, hole)
                .map_err(|e| FsError::io("seek in the backing file", e))?
                .map(|o| if hole { o.min(size) } else { o })
        } else {
            self.client.seek(ino, size, offset, hole).await?
        };
        found
            .filter(|&o| o < size || hole)
            .ok_or_else(|| FsError::new(libc::ENXIO, "no data after the offset"))
    }

    /// A cache file this node reads or writes on the PFS (written through, or being filled).
    fn pfs_data(&self, ino: Ino) -> bool {
        self.through_file(ino).is_some() || self.fill_of(ino).is_some()
    }
}
