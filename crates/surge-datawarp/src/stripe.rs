//! Layout calls: `dw_get_stripe_configuration` (the stripe size, width and starting fragment of
//! an open file, as the mount reads them in the attribute `user.surge.layout`; a directory's
//! default, or the instance's when it has none), `dw_set_stripe_configuration` (the layout of
//! an empty file, or a directory's default, through the same attribute), and
//! `dw_get_mds_path`.

use crate::call::{entry, entry_ptr, path, put, with_job};
use std::ffi::{c_char, c_int, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use surge_proto::InstanceDescriptor;
use surge_stage::job::{JobStageError, Result};

/// The attribute of a Surge mount that reads and sets layouts.
const LAYOUT_XATTR: &std::ffi::CStr = c"user.surge.layout";

/// `user.surge.layout` of `fd`: `None` when it has none (a directory without a default).
fn layout_xattr(fd: c_int) -> Result<Option<FileLayoutText>> {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its length; the name is NUL-terminated.
    let n = unsafe {
        libc::fgetxattr(
            fd,
            LAYOUT_XATTR.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODATA) => Ok(None),
            _ => Err(JobStageError::Io {
                path: PathBuf::from(format!("(file descriptor {fd}: user.surge.layout)")),
                source: e,
            }),
        };
    }
    let text = String::from_utf8_lossy(&buf[..n as usize]).into_owned();
    let mut out = FileLayoutText::default();
    for item in text.split_whitespace() {
        let Some((k, v)) = item.split_once('=') else {
            continue;
        };
        let v: u64 = v.parse().unwrap_or(0);
        match k {
            "stripe_size" => out.stripe_size = v,
            "stripe_count" => out.stripe_count = v as u32,
            "start" => out.start = v as u32,
            _ => {}
        }
    }
    Ok(Some(out))
}

/// What `user.surge.layout` says (zeros: the instance's).
#[derive(Default)]
struct FileLayoutText {
    stripe_size: u64,
    stripe_count: u32,
    start: u32,
}

/// The layout of the file or directory open as `fd` on a mount of the job: (stripe size,
/// stripe width, starting index). A file's comes from the mount; a directory's default too,
/// with the instance's values for what it leaves open.
fn layout_of(fd: c_int) -> Result<(u64, u32, u32)> {
    let told = layout_xattr(fd)?;
    if let Some(l) = &told {
        if l.stripe_size != 0 && l.stripe_count != 0 {
            return Ok((l.stripe_size, l.stripe_count, l.start));
        }
    }
    let fd_path = PathBuf::from(format!("(file descriptor {fd})"));
    // SAFETY: fstat writes into `st` only.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(JobStageError::Io {
            path: fd_path,
            source: std::io::Error::last_os_error(),
        });
    }
    with_job(|mut js| async move {
        // A FUSE mount is its own device: the mount whose root has the fd's device holds it.
        let mount = js
            .nodes()
            .nodes
            .iter()
            .flat_map(|n| n.mounts.iter())
            .find(|m| {
                std::fs::metadata(&m.path)
                    .is_ok_and(|md| std::os::unix::fs::MetadataExt::dev(&md) == st.st_dev)
            })
            .cloned()
            .ok_or_else(|| {
                JobStageError::Invalid(format!(
                    "file descriptor {fd} is not on a burst-buffer mount of this job"
                ))
            })?;
        let inst = js.instance(mount.instance).await?;
        let desc: InstanceDescriptor =
            serde_json::from_str(&inst.descriptor_json).map_err(|e| {
                JobStageError::Invalid(format!(
                    "instance {}: the manager's descriptor is not valid: {e}",
                    inst.id
                ))
            })?;
        let width = desc.fragments.len() as u32;
        if width == 0 || desc.stripe_size == 0 {
            return Err(JobStageError::Invalid(format!(
                "instance {} has no fragments",
                inst.id
            )));
        }
        let (size, width) = match &told {
            Some(l) => (
                if l.stripe_size == 0 {
                    desc.stripe_size
                } else {
                    l.stripe_size
                },
                if l.stripe_count == 0 {
                    width
                } else {
                    l.stripe_count
                },
            ),
            None => (desc.stripe_size, width),
        };
        let _ = st;
        Ok((size, width, 0))
    })
}

fn as_int(v: u64, what: &str) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| JobStageError::Io {
        path: PathBuf::from(format!("{what} {v}")),
        source: std::io::Error::from_raw_os_error(libc::EOVERFLOW),
    })
}

/// The stripe size, width and starting index of an open file.
///
/// # Safety
/// The out-pointers are NULL or point to writable ints.
#[no_mangle]
pub unsafe extern "C" fn dw_get_stripe_configuration(
    fd: c_int,
    stripe_size: *mut c_int,
    stripe_width: *mut c_int,
    starting_index: *mut c_int,
) -> c_int {
    entry("dw_get_stripe_configuration", || {
        let (size, width, start) = layout_of(fd)?;
        let size = as_int(size, "stripe size")?;
        // SAFETY: as the caller promises.
        unsafe {
            put(stripe_size, size as u32);
            put(stripe_width, width);
            put(starting_index, start);
        }
        Ok(0)
    })
}

/// Sets the layout of an empty file (before it is opened on a node that reads it through a
/// local object: -EBUSY then), or a directory's default for what is made in it.
#[no_mangle]
pub extern "C" fn dw_set_stripe_configuration(
    fd: c_int,
    stripe_size: c_int,
    stripe_width: c_int,
) -> c_int {
    entry("dw_set_stripe_configuration", || {
        if stripe_width <= 0 || stripe_size <= 0 || stripe_size % 4096 != 0 {
            return Err(JobStageError::Invalid(format!(
                "stripe_size {stripe_size} must be a positive multiple of 4096 and stripe_width \
                 {stripe_width} positive"
            )));
        }
        // Asking for what the file has already is no change (and allowed once it holds data).
        if let Ok((size, width, _)) = layout_of(fd) {
            if size == stripe_size as u64 && width == stripe_width as u32 {
                return Ok(0);
            }
        }
        let value = format!("stripe_size={stripe_size} stripe_count={stripe_width}");
        // SAFETY: `value` is valid for its length; the name is NUL-terminated.
        let rc = unsafe {
            libc::fsetxattr(
                fd,
                LAYOUT_XATTR.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        if rc != 0 {
            return Err(JobStageError::Io {
                path: PathBuf::from(format!("(file descriptor {fd}: {value})")),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(0)
    })
}

/// The path prefix for files of `key` (the mount root: a namespace has one metadata server).
/// Allocated with malloc; NULL if `dw_root` is not a mount root of the job.
///
/// # Safety
/// `dw_root` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dw_get_mds_path(dw_root: *const c_char, _key: u64) -> *mut c_char {
    entry_ptr("dw_get_mds_path", || {
        // SAFETY: as the caller promises.
        let root = unsafe { path(dw_root, "dw_root") }?;
        let mount = with_job(|js| async move { js.mount_root(&root) })?;
        let c = CString::new(mount.path.as_os_str().as_bytes())
            .map_err(|e| JobStageError::Invalid(format!("mount path: {e}")))?;
        // SAFETY: strdup copies a NUL-terminated string into malloc'd memory (free()d by the
        // caller, as DataWarp's API says).
        let p = unsafe { libc::strdup(c.as_ptr()) };
        if p.is_null() {
            return Err(JobStageError::Io {
                path: mount.path,
                source: std::io::Error::from_raw_os_error(libc::ENOMEM),
            });
        }
        Ok(p)
    })
}
