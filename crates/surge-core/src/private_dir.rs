//! Directories only their user can write in, made safely in places everybody can write in
//! (`/tmp`, `/dev/shm`), and files opened in them without following links.
//!
//! The threat (issue 31): another local user creates `/tmp/surge-<victim>` (mode 0777) or
//! `/dev/shm/surge-<victim>` first, or a symbolic link of that name, and then swaps or plants
//! what the victim's `surge run` later uses (the job's `bin/`, the lock file, sockets). So a
//! directory is used only when, looked at without following links, it is a directory owned by
//! this user that nobody else can write in, in a parent where nobody else can rename it away
//! (not writable by others, or sticky as `/tmp` is). What fails that check is refused with a
//! message that says who owns the path and what to do, never used.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum PrivateDirError {
    #[error(
        "{path} is owned by uid {owner}, not by you (uid {me}): another user made it first, \
         perhaps to make your job run their files; remove it (as root) or use another directory"
    )]
    Owner { path: PathBuf, owner: u32, me: u32 },
    #[error(
        "{path} is a symbolic link: refusing to follow it (someone may be redirecting your \
         files); remove it or use another directory"
    )]
    Symlink { path: PathBuf },
    #[error("{path} exists and is not a directory")]
    NotDir { path: PathBuf },
    #[error(
        "{path}'s parent {parent} can be written by other users and is not sticky: they could \
         replace {path}; use a directory only you (or a sticky one such as /tmp) can write in"
    )]
    Parent { path: PathBuf, parent: PathBuf },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl PrivateDirError {
    /// True when another user (or a link) holds the path: a caller may go elsewhere.
    pub fn is_squatted(&self) -> bool {
        matches!(
            self,
            PrivateDirError::Owner { .. } | PrivateDirError::Symlink { .. }
        )
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn io<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> PrivateDirError + 'a {
    move |source| PrivateDirError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Checks that `path`'s parent cannot be used by another user to replace `path`.
fn check_parent(path: &Path) -> Result<(), PrivateDirError> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let m = std::fs::metadata(parent).map_err(io("cannot look at", parent))?;
    let mode = m.mode();
    let others_write = mode & 0o022 != 0;
    let sticky = mode & 0o1000 != 0;
    let trusted_owner = m.uid() == 0 || m.uid() == euid();
    if (others_write && !sticky) || !trusted_owner {
        return Err(PrivateDirError::Parent {
            path: path.to_path_buf(),
            parent: parent.to_path_buf(),
        });
    }
    Ok(())
}

/// Makes `path` (one level: its parent must exist) a directory only this user can use
/// (0700), or checks that the one there is: owned by this user and no link. An existing own
/// directory that others could write in is made 0700.
pub fn ensure(path: &Path) -> Result<(), PrivateDirError> {
    check_parent(path)?;
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io("cannot create", path)(e)),
    }
    let m = check(path)?;
    if m.mode() & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
            .map_err(io("cannot make private", path))?;
    }
    Ok(())
}

/// Checks, making nothing, that `path` is a directory of this user's and no link; its
/// metadata.
pub fn check(path: &Path) -> Result<std::fs::Metadata, PrivateDirError> {
    let m = std::fs::symlink_metadata(path).map_err(io("cannot look at", path))?;
    if m.file_type().is_symlink() {
        return Err(PrivateDirError::Symlink {
            path: path.to_path_buf(),
        });
    }
    if !m.is_dir() {
        return Err(PrivateDirError::NotDir {
            path: path.to_path_buf(),
        });
    }
    if m.uid() != euid() {
        return Err(PrivateDirError::Owner {
            path: path.to_path_buf(),
            owner: m.uid(),
            me: euid(),
        });
    }
    Ok(m)
}

/// [`ensure`] for every missing level of `path` below an existing ancestor, and for `path`
/// itself (the levels it makes are 0700; existing ancestors are only checked as parents).
pub fn ensure_all(path: &Path) -> Result<(), PrivateDirError> {
    let mut missing = Vec::new();
    let mut p = path;
    while std::fs::symlink_metadata(p).is_err() {
        missing.push(p);
        match p.parent() {
            Some(up) if !up.as_os_str().is_empty() => p = up,
            _ => break,
        }
    }
    for level in missing.iter().rev() {
        ensure(level)?;
    }
    ensure(path)
}

/// A new directory `<base>.<random>` in `base`'s parent, made by this call (0700): where to
/// go when `base` is squatted.
pub fn fresh(base: &Path) -> Result<PathBuf, PrivateDirError> {
    check_parent(base)?;
    let name = base
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "surge".into());
    let mut last = None;
    for _ in 0..16 {
        let r = u64::from_le_bytes(crate::sys::random_bytes::<8>());
        let p = base.with_file_name(format!("{name}.{r:012x}"));
        match std::fs::DirBuilder::new().mode(0o700).create(&p) {
            Ok(()) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(io("cannot create", &p)(e)),
        }
    }
    Err(io("cannot create a fresh directory beside", base)(
        last.unwrap_or_else(|| std::io::Error::other("every name taken")),
    ))
}

/// Opens (creating, 0600, never truncating) a file in a private directory without following
/// a link at its last component.
pub fn open_nofollow(path: &Path) -> Result<File, PrivateDirError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                PrivateDirError::Symlink {
                    path: path.to_path_buf(),
                }
            } else {
                io("cannot open", path)(e)
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "surge-private-dir-test-{}-{:x}",
            std::process::id(),
            u64::from_le_bytes(crate::sys::random_bytes::<8>())
        ));
        std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
        d
    }

    #[test]
    fn makes_a_0700_directory_and_accepts_it_again() {
        let s = scratch();
        let d = s.join("mine");
        ensure(&d).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        ensure(&d).unwrap();
        std::fs::remove_dir_all(&s).unwrap();
    }

    #[test]
    fn an_own_directory_others_could_write_in_is_tightened() {
        let s = scratch();
        let d = s.join("open");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        ensure(&d).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        std::fs::remove_dir_all(&s).unwrap();
    }

    #[test]
    fn a_symlink_is_refused_not_followed() {
        let s = scratch();
        let target = s.join("elsewhere");
        std::fs::create_dir(&target).unwrap();
        let d = s.join("link");
        std::os::unix::fs::symlink(&target, &d).unwrap();
        let e = ensure(&d).unwrap_err();
        assert!(e.is_squatted(), "{e}");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        std::fs::remove_dir_all(&s).unwrap();
    }

    #[test]
    fn a_file_in_the_way_is_refused() {
        let s = scratch();
        let d = s.join("file");
        std::fs::write(&d, b"x").unwrap();
        assert!(matches!(ensure(&d), Err(PrivateDirError::NotDir { .. })));
        std::fs::remove_dir_all(&s).unwrap();
    }

    #[test]
    fn a_parent_others_can_write_without_sticky_is_refused() {
        let s = scratch();
        std::fs::set_permissions(&s, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = ensure(&s.join("x")).unwrap_err();
        assert!(matches!(e, PrivateDirError::Parent { .. }), "{e}");
        std::fs::set_permissions(&s, std::fs::Permissions::from_mode(0o1777)).unwrap();
        ensure(&s.join("x")).unwrap();
        std::fs::remove_dir_all(&s).unwrap();
    }

    #[test]
    fn the_lock_is_opened_without_following_a_link_or_truncating() {
        let s = scratch();
        let victim = s.join("precious");
        std::fs::write(&victim, b"keep me").unwrap();
        let lock = s.join("lock");
        std::os::unix::fs::symlink(&victim, &lock).unwrap();
        assert!(matches!(
            open_nofollow(&lock),
            Err(PrivateDirError::Symlink { .. })
        ));
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        let own = s.join("own");
        std::fs::write(&own, b"data").unwrap();
        open_nofollow(&own).unwrap();
        assert_eq!(std::fs::read(&own).unwrap(), b"data", "not truncated");
        std::fs::remove_dir_all(&s).unwrap();
    }

    #[test]
    fn fresh_directories_are_new_and_private() {
        let s = scratch();
        let a = fresh(&s.join("base")).unwrap();
        let b = fresh(&s.join("base")).unwrap();
        assert_ne!(a, b);
        assert_eq!(std::fs::metadata(&a).unwrap().mode() & 0o777, 0o700);
        std::fs::remove_dir_all(&s).unwrap();
    }
}
