//! Extended attributes, stored with the inode by the metadata server: the `user.*` namespace
//! (any user with the file's read/write permission, checked by the kernel) and `trusted.*`
//! (`CAP_SYS_ADMIN`, checked by the kernel), so `cp -a`, `rsync -X` and `tar --xattrs` keep them.
//!
//! `security.*` (file capabilities, SELinux labels) and `system.*` (POSIX ACLs) are not stored:
//! setting one is `EOPNOTSUPP`, as on a file system without them, so no tool believes an ACL or
//! a capability protects or empowers a file when nothing would enforce it. Reading one is
//! `ENODATA` and is answered here without a round trip: the kernel asks for
//! `security.capability` before every write through the daemon (to clear it), and that
//! question must stay cheap.

use super::{stale, Fs, FsError, FsResult};
use surge_core::Ino;
use surge_proto::XATTR_NAME_MAX;

/// Where a name's namespace is kept.
enum Namespace {
    Stored,
    /// Not stored: reads say "none", writes are refused.
    NotStored,
    Unknown,
}

fn namespace(name: &[u8]) -> Namespace {
    if name.starts_with(b"user.") || name.starts_with(b"trusted.") {
        Namespace::Stored
    } else if name.starts_with(b"security.") || name.starts_with(b"system.") {
        Namespace::NotStored
    } else {
        Namespace::Unknown
    }
}

fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

fn not_supported(name: &[u8]) -> FsError {
    FsError::new(
        libc::EOPNOTSUPP,
        format!(
            "extended attribute {}: only user.* and trusted.* are stored",
            show(name)
        ),
    )
}

impl Fs {
    /// The answer to `getxattr` of `name` when it needs no request (a namespace that is not
    /// stored): the adapter replies with it at once.
    pub fn getxattr_here(&self, name: &[u8]) -> Option<FsError> {
        match namespace(name) {
            Namespace::Stored => None,
            Namespace::NotStored => Some(FsError::new(
                libc::ENODATA,
                format!("no extended attribute {}", show(name)),
            )),
            Namespace::Unknown => Some(not_supported(name)),
        }
    }

    pub async fn getxattr(&self, ino: Ino, name: &[u8]) -> FsResult<Vec<u8>> {
        if let Some(e) = self.getxattr_here(name) {
            return Err(e);
        }
        self.barrier().await?;
        self.client.get_xattr(ino, name).await.map_err(stale)
    }

    /// The names of `ino`'s extended attributes as `listxattr(2)` returns them: each followed
    /// by a NUL byte.
    pub async fn listxattr(&self, ino: Ino) -> FsResult<Vec<u8>> {
        self.barrier().await?;
        let names = self.client.list_xattr(ino).await.map_err(stale)?;
        let mut out = Vec::with_capacity(names.iter().map(|n| n.len() + 1).sum());
        for n in names {
            out.extend_from_slice(&n);
            out.push(0);
        }
        Ok(out)
    }

    pub async fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: i32) -> FsResult<()> {
        match namespace(name) {
            Namespace::Stored => {}
            _ => return Err(not_supported(name)),
        }
        if name.len() > XATTR_NAME_MAX {
            return Err(FsError::new(
                libc::ERANGE,
                "extended attribute name too long",
            ));
        }
        let flags = u32::try_from(flags)
            .ok()
            .filter(|f| f & !(libc::XATTR_CREATE | libc::XATTR_REPLACE) as u32 == 0)
            .ok_or_else(|| FsError::new(libc::EINVAL, format!("setxattr flags {flags:#x}")))?;
        self.barrier().await?;
        let a = self
            .client
            .set_xattr(ino, name, value, flags)
            .await
            .map_err(stale)?;
        self.observe(a, false);
        Ok(())
    }

    pub async fn removexattr(&self, ino: Ino, name: &[u8]) -> FsResult<()> {
        match namespace(name) {
            Namespace::Stored => {}
            _ => return Err(not_supported(name)),
        }
        self.barrier().await?;
        let a = self.client.remove_xattr(ino, name).await.map_err(stale)?;
        self.observe(a, false);
        Ok(())
    }
}
