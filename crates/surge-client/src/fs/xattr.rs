//! Extended attributes, stored with the inode by the metadata server: the `user.*` namespace
//! (any user with the file's read/write permission, checked by the kernel), `trusted.*` and
//! `security.*` (`CAP_SYS_ADMIN` to set, checked by the kernel; labels of security modules,
//! as tmpfs keeps them), so `cp -a`, `rsync -X` and `tar --xattrs` keep them.
//!
//! POSIX ACLs, `system.posix_acl_access` and `system.posix_acl_default`, are stored too: the
//! kernel enforces them (the mount asks for FUSE_POSIX_ACL) and the metadata server keeps the
//! mode in step with them, applies `chmod` to them and gives new nodes their directory's
//! default (`surge_server::acl`). A directory with a default ACL is never one whose creates
//! this node makes behind (those could not take the ACL): setting or removing an ACL drops
//! this node's listing of the directory, and a directory made with one is not listed.
//!
//! File capabilities (`security.capability`, `setcap`) are stored as other `security.*`
//! names, and go at every write, truncate and change of owner, as Linux removes them
//! (`FUSE_HANDLE_KILLPRIV_V2` leaves that to this side). The kernel asks for one before every
//! write through the daemon (a `getxattr` of size 0, to clear it), and that question must
//! stay cheap: it is answered here from the inode's [`FL_CAPS`] mark (the metadata server's,
//! in the attributes this node has), without a round trip for every file that has none. A
//! write through this mount clears a marked file's capability before it goes on, a file so
//! marked is not passed through to writers, and the metadata server clears it at the commit
//! of any node's writes, so no written file keeps one. The other `system.*` names are not
//! stored: setting one is `EOPNOTSUPP`, reading one `ENODATA`, answered here.
//!
//! `user.surge.layout` is not stored as an attribute: it reads and sets the layout of a file
//! or the default layout of a directory (`surge layout`; as `lustre.lov` and `lfs setstripe`
//! do on Lustre), as text: `stripe_size=1048576 stripe_count=1 start=3`. It is not listed, so
//! copying tools do not carry one instance's fragment numbers to another file system.
//!
//! `user.surge.cache` (read-only, not listed either) says where a file of a `type=cache`
//! instance holds its data: `tier` (on the fast tier), `pfs` (on the PFS until a mount copies
//! it in: the lazy fill's files not read yet, evicted files) or `through` (written through to
//! the PFS once the tier was full); as `lfs hsm_state` tells on Lustre.

use super::{stale, Fs, FsError, FsResult};
use surge_core::{FileLayout, Ino};
use surge_proto::{FileKind, CAPABILITY_XATTR, FL_CAPS, XATTR_NAME_MAX};

/// The attribute that reads and sets layouts.
pub const LAYOUT_XATTR: &[u8] = b"user.surge.layout";

/// The attribute that says where a cache file's data is (read-only).
pub const CACHE_XATTR: &[u8] = b"user.surge.cache";

/// Where a name's namespace is kept.
enum Namespace {
    Stored,
    /// Not stored: reads say "none", writes are refused.
    NotStored,
    Unknown,
}

fn namespace(name: &[u8]) -> Namespace {
    if name.starts_with(b"user.")
        || name.starts_with(b"trusted.")
        || name.starts_with(b"security.")
        || is_acl(name)
    {
        Namespace::Stored
    } else if name.starts_with(b"system.") {
        Namespace::NotStored
    } else {
        Namespace::Unknown
    }
}

fn is_acl(name: &[u8]) -> bool {
    name == surge_proto::ACL_ACCESS_XATTR || name == surge_proto::ACL_DEFAULT_XATTR
}

fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

fn not_supported(name: &[u8]) -> FsError {
    FsError::new(
        libc::EOPNOTSUPP,
        format!(
            "extended attribute {}: only user.*, trusted.*, security.* and POSIX ACLs are \
             stored",
            show(name)
        ),
    )
}

impl Fs {
    /// The answer to `getxattr` of `name` of `ino` for a buffer of `size` bytes when it needs
    /// no request (a namespace that is not stored; the kernel's size-0 question before a write
    /// about the file capability of an inode open here and not marked [`FL_CAPS`]): the
    /// adapter replies with it at once. The kernel asks the same size-0 question first when a
    /// program reads the capability (`getcap`); on an inode not open here that goes to the
    /// metadata server, so another node's `setcap` is seen at once.
    pub fn getxattr_here(&self, ino: Ino, name: &[u8], size: u32) -> Option<FsError> {
        match namespace(name) {
            Namespace::Stored
                if size == 0
                    && name == CAPABILITY_XATTR
                    && self.inodes.is_open(ino)
                    && self.inodes.flags(ino).is_some_and(|f| f & FL_CAPS == 0) =>
            {
                Some(FsError::new(libc::ENODATA, "no file capability"))
            }
            Namespace::Stored => None,
            Namespace::NotStored => Some(FsError::new(
                libc::ENODATA,
                format!("no extended attribute {}", show(name)),
            )),
            Namespace::Unknown => Some(not_supported(name)),
        }
    }

    pub async fn getxattr(&self, ino: Ino, name: &[u8], size: u32) -> FsResult<Vec<u8>> {
        if let Some(e) = self.getxattr_here(ino, name, size) {
            return Err(e);
        }
        self.barrier().await?;
        if name == LAYOUT_XATTR {
            return self.layout_text(ino).await.map(String::into_bytes);
        }
        if name == CACHE_XATTR {
            return self.cache_state_text(ino).await.map(String::into_bytes);
        }
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

    /// `groups`: the caller's groups when it is not root and sets an access ACL, which then
    /// clears setgid unless the file's group is among them.
    pub async fn setxattr(
        &self,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        flags: i32,
        groups: Option<Vec<u32>>,
    ) -> FsResult<()> {
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
        if name == CACHE_XATTR {
            return Err(read_only());
        }
        if name == LAYOUT_XATTR {
            let text = std::str::from_utf8(value).map_err(|_| {
                FsError::new(libc::EINVAL, "user.surge.layout: the value is not text")
            })?;
            let layout = FileLayout::parse(text.trim_end_matches(['\0', '\n']))
                .map_err(|e| FsError::new(libc::EINVAL, e.to_string()))?;
            return self.set_layout(ino, layout).await;
        }
        let mut flags = flags;
        if is_acl(name) {
            // The mode and default ACL are copied into files made behind.
            self.listings.drop_dir(ino);
            if let (Some(groups), true) = (groups, name == surge_proto::ACL_ACCESS_XATTR) {
                let a = self.client.getattr(ino).await.map_err(stale)?;
                if a.perm & surge_proto::S_ISGID != 0 && !groups.contains(&a.gid) {
                    flags |= surge_proto::XATTR_ACL_KILL_SGID;
                }
            }
        }
        let a = self
            .client
            .set_xattr(ino, name, value, flags)
            .await
            .map_err(stale)?;
        if is_acl(name) {
            // Again, for a listing gathered meanwhile (see `Listings::gathered`).
            self.listings.drop_dir(ino);
        }
        self.observe(a, false);
        Ok(())
    }

    /// What `user.surge.cache` reads: `tier`, `pfs` or `through` (`ENODATA` outside a cache
    /// instance and for what is not a regular file).
    pub async fn cache_state_text(&self, ino: Ino) -> FsResult<String> {
        if !self.cache {
            return Err(FsError::new(
                libc::ENODATA,
                "user.surge.cache: not a type=cache instance",
            ));
        }
        let a = self.client.getattr(ino).await.map_err(stale)?;
        let a = self.observe(a, false);
        if a.kind != FileKind::File {
            return Err(FsError::new(
                libc::ENODATA,
                "user.surge.cache: not a regular file",
            ));
        }
        Ok(match a.through {
            0 => "tier",
            surge_proto::THROUGH_FILL => "pfs",
            _ => "through",
        }
        .into())
    }

    /// What `user.surge.layout` reads: a file's layout (resolved: the values its bytes are
    /// placed by, and the instance's fragment count), a directory's default (`ENODATA` when it
    /// has none).
    pub async fn layout_text(&self, ino: Ino) -> FsResult<String> {
        let a = self.client.getattr(ino).await.map_err(stale)?;
        let a = self.observe(a, false);
        match a.kind {
            FileKind::File => {
                let l = self.client.resolve_layout(ino, a.layout);
                Ok(format!(
                    "stripe_size={} stripe_count={} start={} fragments={}",
                    l.stripe_size, l.stripe_count, l.start, l.fragments
                ))
            }
            FileKind::Dir if a.layout.is_unset() => Err(FsError::new(
                libc::ENODATA,
                "the directory has no default layout (files made in it get the mount's choice)",
            )),
            FileKind::Dir => Ok(FileLayout {
                start: surge_core::layout::START_ANY,
                ..a.layout
            }
            .to_string()),
            _ => Err(FsError::new(
                libc::ENODATA,
                "no layout: not a file or directory",
            )),
        }
    }

    /// Sets the layout of an empty file, or a directory's default (unset: none). A file open
    /// here on its local object (passthrough) keeps that object: only a layout of one stripe
    /// on the same fragment can be taken then.
    pub async fn set_layout(&self, ino: Ino, mut layout: FileLayout) -> FsResult<()> {
        match self
            .inodes
            .with(ino, |i| (i.opens > 0, i.size > 0, i.backing.is_some()))
        {
            Some((true, true, _)) => {
                return Err(FsError::new(
                    libc::EBUSY,
                    "the file holds data: a layout is chosen before the first write",
                ))
            }
            Some((true, _, true)) => {
                let now = self.client.layout_of(ino).await.map_err(stale)?;
                if layout.stripe_count != 1
                    || (layout.start != surge_core::layout::START_ANY && layout.start != now.start)
                {
                    return Err(FsError::new(
                        libc::EBUSY,
                        format!(
                            "the file is open here on its local object (fragment {}): only one \
                             stripe on that fragment can be set now; set other layouts before \
                             opening it, or on its directory",
                            now.start
                        ),
                    ));
                }
                layout.start = now.start;
            }
            _ => {}
        }
        let a = self.client.set_layout(ino, layout).await.map_err(stale)?;
        self.observe(a, false);
        Ok(())
    }

    pub async fn removexattr(&self, ino: Ino, name: &[u8]) -> FsResult<()> {
        match namespace(name) {
            Namespace::Stored => {}
            _ => return Err(not_supported(name)),
        }
        self.barrier().await?;
        if name == CACHE_XATTR {
            return Err(read_only());
        }
        if name == LAYOUT_XATTR {
            return self.set_layout(ino, FileLayout::default()).await;
        }
        if is_acl(name) {
            self.listings.drop_dir(ino);
        }
        let a = self.client.remove_xattr(ino, name).await.map_err(stale)?;
        if is_acl(name) {
            self.listings.drop_dir(ino);
        }
        self.observe(a, false);
        Ok(())
    }

    /// Before a write of `ino` through this mount: a file capability goes first (see the
    /// module doc), when the inode is marked as having one. Gone already (the kernel asked
    /// and removed it, or another node removed it or wrote) is no failure: the mark this
    /// node kept goes too.
    pub(super) async fn kill_capability(&self, ino: Ino) -> FsResult<()> {
        if self.inodes.flags(ino).is_none_or(|f| f & FL_CAPS == 0) {
            return Ok(());
        }
        match self.client.remove_xattr(ino, CAPABILITY_XATTR).await {
            Ok(a) => {
                self.observe(a, false);
                Ok(())
            }
            Err(e) if e.code() == Some(surge_proto::ErrorCode::NoData) => {
                self.inodes.with(ino, |i| {
                    if let Some(a) = i.attr.as_mut() {
                        a.flags &= !FL_CAPS;
                    }
                });
                Ok(())
            }
            Err(e) => Err(stale(e)),
        }
    }
}

fn read_only() -> FsError {
    FsError::new(
        libc::EPERM,
        "user.surge.cache is read-only: it says where a cache file's data is",
    )
}
