//! What the interposition library (`crates/surge-preload`) may do with a file open here: read
//! and write its object on this host itself, as the kernel does for a passthrough open, and
//! have this node commit what it wrote (see [`crate::preload`], the socket it asks through).
//!
//! Only files open here by passthrough qualify: every other path to their data (the kernel's
//! passthrough reads and writes, memory maps, what this process reads from the object) then
//! meets the library's writes in the one object file, so a descriptor the library does not
//! handle (a `dup`, an `exec`, an `mmap`) is never out of date. Their size and mtime are
//! already read from the object at each commit (see `passthrough`).

use super::{Fs, FsError, FsResult};
use std::sync::Arc;
use surge_core::Ino;

impl Fs {
    /// The object file of `ino` when it is open here by kernel passthrough; `None` otherwise
    /// (and always on a cache instance, whose files may move to the PFS while open).
    pub fn preload_object(&self, ino: Ino) -> Option<Arc<std::fs::File>> {
        if self.cache {
            return None;
        }
        self.inodes.backing(ino)
    }

    /// Commits what was written into the object of `ino` (open here by passthrough) as a
    /// close does, and drops the kernel's cached attributes of it (the kernel did not see
    /// those writes).
    pub async fn preload_sync(&self, ino: Ino) -> FsResult<()> {
        // What the library wrote counts against the instance's space as the kernel's
        // passthrough writes do: measured every `PASSTHROUGH_ACCOUNTING` and at the close.
        if self.preload_object(ino).is_none() {
            return Err(FsError::new(
                libc::EBADF,
                format!("inode {ino} is not open here by passthrough"),
            ));
        }
        self.commit(ino).await?;
        if let Some(drop_attrs) = self.drop_attrs.get() {
            drop_attrs(ino);
        }
        Ok(())
    }
}
