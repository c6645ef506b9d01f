//! What a bounded unmount ([`crate::mount::Mounted::unmount_within`]) needs from the kernel
//! beyond `umount(2)`: whether a mount point is still in this process's mount table, who keeps
//! a busy one busy, a lazy unmount (`MNT_DETACH`), and an abort of a FUSE connection
//! (`/sys/fs/fuse/connections/N/abort`), for a mount that a process outside the job or a copy
//! in another mount namespace (`unshare -m`, a container, a service with `PrivateTmp`) would
//! otherwise hold up for as long as they live.

use std::io;
use std::path::{Path, PathBuf};

/// Where `/sys/fs/fuse/connections` is: the `fusectl` file system, one directory per FUSE
/// connection, named by the connection's device number.
const FUSECTL: &str = "/sys/fs/fuse/connections";

/// The device (`major:minor`) of the mount at `mountpoint` in `/proc/self/mountinfo` (the
/// last one, if several are stacked there); `None` when nothing is mounted there.
pub fn mounted_dev(mountpoint: &Path) -> Option<(u32, u32)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mountpoint.as_os_str().as_encoded_bytes();
    info.lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let dev = f.nth(2)?;
            let point = f.nth(1)?;
            (crate::mount::unescape_mountinfo(point) == want).then_some(dev)
        })
        .next_back()
        .and_then(|dev| {
            let (maj, min) = dev.split_once(':')?;
            Some((maj.parse().ok()?, min.parse().ok()?))
        })
}

/// The FUSE connection of the mount with device `dev`: the kernel's device number
/// (`MKDEV`), which names its directory under `/sys/fs/fuse/connections`.
pub fn connection_id((major, minor): (u32, u32)) -> u32 {
    (major << 20) | minor
}

/// `umount(2)` of `mountpoint`, or with `MNT_DETACH` (a lazy unmount: the name goes at once,
/// the file system when its last user does); a user's mount goes through `fusermount3 -u`
/// (`-z`: lazily).
pub fn umount(mountpoint: &Path, detach: bool) -> io::Result<()> {
    if !crate::mount::is_root() {
        let mut c = std::process::Command::new("fusermount3");
        c.arg("-u").arg("-q");
        if detach {
            c.arg("-z");
        }
        let out = c.arg("--").arg(mountpoint).output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "fusermount3 -u{} {}: {}",
                if detach { " -z" } else { "" },
                mountpoint.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        return Ok(());
    }
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let flags = if detach { libc::MNT_DETACH } else { 0 };
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The processes of this mount namespace whose working directory, root or open files are under
/// `mountpoint`, as `pid (command)`, at most `max` of them (for the message that says why a
/// mount was busy).
pub fn holders(mountpoint: &Path, max: usize) -> Vec<String> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id();
    let under = |link: PathBuf| -> bool {
        std::fs::read_link(link).is_ok_and(|t| t.starts_with(mountpoint))
    };
    let mut found = Vec::new();
    for e in procs.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let dir = e.path();
        let holds = under(dir.join("cwd"))
            || under(dir.join("root"))
            || std::fs::read_dir(dir.join("fd"))
                .map(|fds| fds.flatten().any(|fd| under(fd.path())))
                .unwrap_or(false);
        if holds {
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            found.push(format!("pid {pid} ({})", comm.trim()));
            if found.len() == max {
                break;
            }
        }
    }
    found
}

/// Aborts FUSE connection `id`: every request of it in flight and to come fails
/// (`ENOTCONN`), and the daemon's session ends. As root, `fusectl` is mounted at
/// `/sys/fs/fuse/connections` first where it is not (what systemd does at boot); a user may
/// abort the connections of its own mounts.
pub fn abort_connection(id: u32) -> io::Result<()> {
    let dir = Path::new(FUSECTL).join(id.to_string());
    if !dir.exists() && crate::mount::is_root() && !fusectl_mounted() {
        // SAFETY: valid NUL-terminated strings; no mount data.
        let r = unsafe {
            libc::mount(
                c"fusectl".as_ptr(),
                c"/sys/fs/fuse/connections".as_ptr(),
                c"fusectl".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if r != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("cannot mount fusectl on {FUSECTL}: {e}"),
            ));
        }
    }
    let abort = dir.join("abort");
    std::fs::write(&abort, b"1")
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", abort.display())))
}

fn fusectl_mounted() -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(4) == Some(FUSECTL)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_ids_are_the_kernels_device_numbers() {
        assert_eq!(connection_id((0, 53)), 53);
        assert_eq!(connection_id((1, 2)), (1 << 20) | 2);
    }

    #[test]
    fn a_path_with_nothing_mounted_on_it_has_no_device() {
        assert_eq!(mounted_dev(Path::new("/no/such/mount/point")), None);
        assert!(mounted_dev(Path::new("/")).is_some());
    }
}
