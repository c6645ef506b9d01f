//! The POSIX side of a stage: attributes read from and applied to files, directories and
//! symlinks on the PFS, temporary files, and flushing the destination file system.

use crate::names;
use crate::plan::Meta;
use std::ffi::CString;
use std::fs::{File, OpenOptions, Permissions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use surge_proto::Timestamp;

pub(crate) fn meta_of(md: &std::fs::Metadata) -> Meta {
    Meta {
        perm: (md.mode() & 0o7777) as u16,
        uid: md.uid(),
        gid: md.gid(),
        atime: Timestamp {
            secs: md.atime(),
            nsec: md.atime_nsec() as u32,
        },
        mtime: Timestamp {
            secs: md.mtime(),
            nsec: md.mtime_nsec() as u32,
        },
    }
}

fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))
}

/// Sets atime and mtime of `path` (of the link itself when `nofollow`).
pub(crate) fn set_times(path: &Path, meta: &Meta, nofollow: bool) -> io::Result<()> {
    let c = cpath(path)?;
    let ts = [
        libc::timespec {
            tv_sec: meta.atime.secs as _,
            tv_nsec: meta.atime.nsec as _,
        },
        libc::timespec {
            tv_sec: meta.mtime.secs as _,
            tv_nsec: meta.mtime.nsec as _,
        },
    ];
    let flags = if nofollow {
        libc::AT_SYMLINK_NOFOLLOW
    } else {
        0
    };
    // SAFETY: `c` is a valid NUL-terminated path and `ts` holds the two timespecs utimensat reads.
    if unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Gives an open file its final owner, mode and times (owner first: chown clears set-id bits).
pub(crate) fn finish_file(file: &File, meta: &Meta, owner: Option<(u32, u32)>) -> io::Result<()> {
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(file, Some(uid), Some(gid))?;
    }
    file.set_permissions(Permissions::from_mode(u32::from(meta.perm)))?;
    let times = std::fs::FileTimes::new()
        .set_accessed(meta.atime.to_system_time())
        .set_modified(meta.mtime.to_system_time());
    file.set_times(times)
}

/// Gives a directory its final owner, mode and times.
pub(crate) fn finish_dir(path: &Path, meta: &Meta, owner: Option<(u32, u32)>) -> io::Result<()> {
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
    }
    std::fs::set_permissions(path, Permissions::from_mode(u32::from(meta.perm)))?;
    set_times(path, meta, false)
}

/// Gives a symlink its owner and times (a symlink's mode means nothing on Linux).
pub(crate) fn finish_symlink(
    path: &Path,
    meta: &Meta,
    owner: Option<(u32, u32)>,
) -> io::Result<()> {
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
    }
    set_times(path, meta, true)
}

/// Largest single write to the PFS. Writes of several MiB into ext4's page cache were measured
/// at times 5-10x slower than the same bytes in 1 MiB writes (kernel 6.18, bench/stage.sh).
const PFS_WRITE: usize = 1 << 20;

/// `write_all_at` in pieces of at most [`PFS_WRITE`] bytes.
pub(crate) fn write_all_at(file: &File, data: &[u8], offset: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    for (i, piece) in data.chunks(PFS_WRITE).enumerate() {
        file.write_all_at(piece, offset + (i * PFS_WRITE) as u64)?;
    }
    Ok(())
}

/// The unit in which a copy leaves holes: a block of zeros this long (at a multiple of it in
/// the file) is not written, so the destination gets a hole there (it reads back as zeros).
/// The page size and the block of ext4 and XFS: the finest hole those file systems keep.
pub(crate) const HOLE_BLOCK: usize = 4096;

/// Whether `b` is all zeros.
pub(crate) fn is_zero(b: &[u8]) -> bool {
    b.chunks(64).all(|c| c.iter().fold(0u8, |a, &x| a | x) == 0)
}

/// The ranges of `data` (to be written at file offset `offset`) holding something else than
/// zeros, in [`HOLE_BLOCK`]s aligned in the file, adjacent blocks merged.
pub(crate) fn data_runs(data: &[u8], offset: u64) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    // The first block ends at the next multiple of HOLE_BLOCK in the file.
    let mut start = 0;
    let mut end = (HOLE_BLOCK - (offset % HOLE_BLOCK as u64) as usize).min(data.len());
    while start < data.len() {
        if !is_zero(&data[start..end]) {
            match runs.last_mut() {
                Some(r) if r.end == start => r.end = end,
                _ => runs.push(start..end),
            }
        }
        start = end;
        end = (end + HOLE_BLOCK).min(data.len());
    }
    runs
}

/// Writes the blocks of `data` that are not all zeros at `offset` of `file` (a new file, sized
/// by the caller): the others stay holes, so a sparse file stays sparse on the PFS.
pub(crate) fn write_data_at(file: &File, data: &[u8], offset: u64) -> io::Result<()> {
    for r in data_runs(data, offset) {
        write_all_at(file, &data[r.clone()], offset + r.start as u64)?;
    }
    Ok(())
}

/// A second descriptor of a file, opened for direct I/O (`O_DIRECT`), or `None` where the file
/// system refuses it. Large stage-out writes go through it: one copy from the chunk buffer to
/// the device instead of a copy into the page cache and a writeback, and, on the machines
/// measured, far steadier than large buffered writes (bench/stage.sh).
pub(crate) fn open_direct(path: &Path) -> Option<File> {
    OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()
}

/// Refuses a path that goes through a symbolic link someone else owns (neither this user
/// nor root), as the kernel's `protected_symlinks` does in sticky directories, but for
/// every directory: a stage-out into a shared directory where another user planted
/// `out -> ~them/loot` must not write into their directory (issue 31). Links of one's own
/// and root's (`/scratch -> /lustre/scratch`) are followed. Only what exists is looked at.
pub(crate) fn check_links(path: &Path) -> io::Result<()> {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let mut prefix = PathBuf::new();
    for c in path.components() {
        prefix.push(c);
        match std::fs::symlink_metadata(&prefix) {
            Ok(m) if m.file_type().is_symlink() && m.uid() != me && m.uid() != 0 => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{} is a symbolic link owned by uid {} (not you, not root): not followed",
                        prefix.display(),
                        m.uid()
                    ),
                ));
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Creates a new temporary file for `final_path` in the same directory (mode 0600 until it is
/// complete), refusing a directory reached through another user's link ([`check_links`]).
pub(crate) fn create_temp(final_path: &Path) -> io::Result<(File, PathBuf)> {
    let dir = final_path.parent().unwrap_or(Path::new("/"));
    check_links(dir)?;
    let name = final_path.file_name().map(|n| n.as_bytes()).unwrap_or(b"");
    loop {
        let tmp = dir.join(std::ffi::OsStr::from_bytes(&names::temp_name(name)));
        match OpenOptions::new()
            .write(true)
            .read(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
        {
            Ok(f) => return Ok((f, tmp)),
            // A clash of random suffixes: draw another.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Removes the temporaries an interrupted stage left in `dir`; returns how many.
pub(crate) fn remove_stale_temps(dir: &Path) -> io::Result<u64> {
    let mut n = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if names::is_temp_name(e.file_name().as_bytes()) {
            match std::fs::remove_file(e.path()) {
                Ok(()) => n += 1,
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(err),
            }
        }
    }
    Ok(n)
}

/// Flushes the file system holding `path` to stable storage.
pub(crate) fn syncfs(path: &Path) -> io::Result<()> {
    let f = File::open(path)?;
    use std::os::fd::AsRawFd;
    // SAFETY: `f` is an open descriptor for the duration of the call.
    if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
