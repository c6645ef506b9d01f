//! Path-level helpers over the inode-based [`InstanceClient`]: resolving `/a/b/c`, listing a
//! whole directory, removing a file and its data. Instance paths are kept as `PathBuf`s (their
//! bytes are the names the metadata service stores). The staging engine and the Python
//! package's native instance API (`surge-py`) use them.

use crate::StageError;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use surge_client::{ClientError, InstanceClient};
use surge_core::Ino;
use surge_proto::{Attr, DirEntry, KeepOpen, Unlinked};
use tracing::warn;

/// The root directory of every namespace.
pub const ROOT: Ino = 1;
/// Entries asked per directory page (the metadata service's maximum).
const READDIR_PAGE: u32 = 4096;

/// Parses an instance path: absolute, `.` and repeated `/` dropped, `..` refused (it could
/// leave the namespace).
pub fn parse_instance_path(p: &str) -> Result<PathBuf, StageError> {
    if !p.starts_with('/') {
        return Err(StageError::BadPath {
            path: p.to_string(),
            message: "an instance path must be absolute from the instance root (e.g. /input)"
                .into(),
        });
    }
    let mut out = PathBuf::from("/");
    for c in Path::new(p).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(StageError::BadPath {
                    path: p.to_string(),
                    message: "`..` is not allowed in an instance path".into(),
                })
            }
        }
    }
    Ok(out)
}

/// The last component of a path as bytes (empty for `/`).
pub fn file_name(p: &Path) -> &[u8] {
    p.file_name().map(|n| n.as_bytes()).unwrap_or_default()
}

/// Looks up every component of an absolute instance path (symlinks are not followed).
pub async fn resolve(client: &InstanceClient, path: &Path) -> Result<Attr, ClientError> {
    let mut attr = client.getattr(ROOT).await?;
    for c in path.components() {
        if let Component::Normal(n) = c {
            attr = client.lookup(attr.ino, n.as_bytes()).await?;
        }
    }
    Ok(attr)
}

/// Every entry of a directory (all pages), with attributes when `plus`.
pub async fn list_dir(
    client: &InstanceClient,
    ino: Ino,
    plus: bool,
) -> Result<Vec<DirEntry>, ClientError> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let surge_client::instance::DirPage {
            entries: page,
            done,
            ..
        } = client.readdir(ino, after, READDIR_PAGE, plus).await?;
        if let Some(last) = page.last() {
            after = last.cursor;
        }
        let empty = page.is_empty();
        out.extend(page);
        if done || empty {
            return Ok(out);
        }
    }
}

/// Frees the data of an inode whose last name went away (by unlink or by a rename over it).
pub async fn drop_unlinked(client: &InstanceClient, u: Unlinked) {
    if !u.orphaned {
        return;
    }
    let r = if u.purged {
        if u.size == 0 {
            return;
        }
        client.remove_objects(u.ino, u.size).await
    } else {
        client.purge(u.ino, u.size).await
    };
    if let Err(e) = r {
        warn!("could not free the data of unlinked inode {}: {e}", u.ino);
    }
}

/// Removes a file (or symlink) and its data.
pub async fn remove(client: &InstanceClient, parent: Ino, name: &[u8]) -> Result<(), ClientError> {
    let u = client.unlink(parent, name, KeepOpen::Only(vec![])).await?;
    drop_unlinked(client, u).await;
    Ok(())
}

pub fn is_errno(e: &ClientError, errno: i32) -> bool {
    e.errno() == errno
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_paths_are_normalised_and_checked() {
        assert_eq!(parse_instance_path("/").unwrap(), PathBuf::from("/"));
        assert_eq!(
            parse_instance_path("//in/./a//b/").unwrap(),
            PathBuf::from("/in/a/b")
        );
        assert!(parse_instance_path("in/a").is_err());
        assert!(parse_instance_path("/in/../etc").is_err());
    }
}
