//! The walk over failed stages (`dw_open_failed_stage`, `dw_read_failed_stage`,
//! `dw_close_failed_stage`): a snapshot, taken at open, of the burst-buffer paths under a
//! directory whose stage failed, each with the errno the copy saw.

use crate::call::{entry, path, with_job};
use std::ffi::{c_char, c_int, CString};
use std::os::unix::ffi::OsStrExt;
use surge_stage::job::{errno_of_message, failures, is_under, JobStageError};
use surge_stage::StageItem;

/// `dw_failed_stage_t`.
#[allow(non_camel_case_types)]
pub struct dw_failed_stage_state {
    entries: Vec<(CString, c_int)>,
    next: usize,
}

/// Opens a walk over the failed stages under `dw_instance_path`.
///
/// # Safety
/// `dw_instance_path` is NULL or a NUL-terminated string; `handle` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dw_open_failed_stage(
    dw_instance_path: *const c_char,
    handle: *mut *mut dw_failed_stage_state,
) -> c_int {
    entry("dw_open_failed_stage", || {
        if handle.is_null() {
            return Err(JobStageError::Invalid("handle is NULL".into()));
        }
        // SAFETY: as the caller promises.
        let root = unsafe { path(dw_instance_path, "dw_instance_path") }?;
        let entries = with_job(|mut js| async move {
            let loc = js.locate(&root)?;
            let mut entries = Vec::new();
            for t in js.tasks().await? {
                if t.state != "failed"
                    || t.instance != loc.mount.instance
                    || t.namespace != loc.mount.ns
                {
                    continue;
                }
                let mut inner: Vec<(String, c_int)> = failures(&t)
                    .into_iter()
                    .map(|(p, e)| (p, errno_of_message(&e)))
                    .collect();
                if inner.is_empty() {
                    // The task failed as a whole (a missing source, no space): each of its
                    // burst-buffer paths failed.
                    let errno = errno_of_message(&t.error);
                    let items: Vec<StageItem> =
                        serde_json::from_str(&t.items_json).unwrap_or_default();
                    inner = items
                        .into_iter()
                        .map(|i| (i.instance_path, errno))
                        .collect();
                }
                for (p, errno) in inner {
                    if !p.starts_with('/') || !is_under(&p, &loc.inner) {
                        continue;
                    }
                    let full = loc.mount.path.join(p.trim_start_matches('/'));
                    if let Ok(c) = CString::new(full.as_os_str().as_bytes()) {
                        entries.push((c, errno));
                    }
                }
            }
            Ok(entries)
        })?;
        let h = Box::new(dw_failed_stage_state { entries, next: 0 });
        // SAFETY: checked non-NULL above; the caller passes a writable pointer.
        unsafe { *handle = Box::into_raw(h) };
        Ok(0)
    })
}

/// Reads the next failed path: its length (> 0), 0 at the end, or -errno.
///
/// # Safety
/// `handle` comes from `dw_open_failed_stage` and is not closed; `path` has `path_size`
/// writable bytes; `ret_errno` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dw_read_failed_stage(
    handle: *mut dw_failed_stage_state,
    path: *mut c_char,
    path_size: c_int,
    ret_errno: *mut c_int,
) -> c_int {
    entry("dw_read_failed_stage", || {
        if handle.is_null() || path.is_null() {
            return Err(JobStageError::Invalid("handle or path is NULL".into()));
        }
        // SAFETY: a live handle from dw_open_failed_stage, used by one thread at a time.
        let h = unsafe { &mut *handle };
        let Some((p, errno)) = h.entries.get(h.next) else {
            return Ok(0);
        };
        let bytes = p.as_bytes_with_nul();
        if path_size < 0 || bytes.len() > path_size as usize {
            return Err(JobStageError::Io {
                path: std::path::PathBuf::from(p.to_string_lossy().into_owned()),
                source: std::io::Error::from_raw_os_error(libc::ENAMETOOLONG),
            });
        }
        // SAFETY: `path` has room for `path_size` >= bytes.len() bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), path, bytes.len());
            if !ret_errno.is_null() {
                *ret_errno = -errno;
            }
        }
        h.next += 1;
        Ok((bytes.len() - 1) as c_int)
    })
}

/// Ends a walk and frees its handle.
///
/// # Safety
/// `handle` is NULL or comes from `dw_open_failed_stage` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn dw_close_failed_stage(handle: *mut dw_failed_stage_state) -> c_int {
    entry("dw_close_failed_stage", || {
        if handle.is_null() {
            return Err(JobStageError::Invalid("handle is NULL".into()));
        }
        // SAFETY: from Box::into_raw in dw_open_failed_stage, closed once.
        drop(unsafe { Box::from_raw(handle) });
        Ok(0)
    })
}
