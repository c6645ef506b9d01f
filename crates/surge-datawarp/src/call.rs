//! The frame of every exported call: C arguments in, `0`/`-errno` out, panics caught, the
//! reason kept for `surge_dw_last_error`, and one short-lived runtime and manager connection
//! per call (no threads outlive a call, so a program may fork between calls).

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString, OsStr};
use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use surge_stage::job::{JobStageError, JobStager, Result};

/// Longest list accepted (a list must end with NULL; this stops a walk off a list that does
/// not).
const MAX_LIST: usize = 1 << 20;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: String) {
    if std::env::var("SURGE_DW_VERBOSE").is_ok_and(|v| !v.is_empty() && v != "0") {
        eprintln!("libdatawarp: {msg}");
    }
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// The reason of this thread's last failure (valid until its next call).
pub(crate) fn last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// A "no stage names this path" about a path that does not exist is ENOENT, as DataWarp says.
fn refine(e: JobStageError) -> JobStageError {
    match e {
        JobStageError::NoStage(p) if std::fs::symlink_metadata(&p).is_err() => JobStageError::Io {
            path: p,
            source: std::io::Error::from_raw_os_error(libc::ENOENT),
        },
        e => e,
    }
}

/// Runs an exported call's body: its value, or `-errno` with the reason recorded.
pub(crate) fn entry(what: &str, body: impl FnOnce() -> Result<c_int>) -> c_int {
    LAST_ERROR.with(|e| *e.borrow_mut() = CString::default());
    match std::panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            let e = refine(e);
            set_error(format!("{what}: {e}"));
            -e.errno()
        }
        Err(_) => {
            set_error(format!(
                "{what}: internal error (a panic); please report it"
            ));
            -libc::EIO
        }
    }
}

/// Like [`entry`] for calls that return a pointer (NULL on failure).
pub(crate) fn entry_ptr<T>(what: &str, body: impl FnOnce() -> Result<*mut T>) -> *mut T {
    let mut out = std::ptr::null_mut();
    entry(what, || {
        out = body()?;
        Ok(0)
    });
    out
}

/// Runs `f` with a connection to the manager of the job this process runs in.
pub(crate) fn with_job<T, F, Fut>(f: F) -> Result<T>
where
    F: FnOnce(JobStager) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| JobStageError::Io {
            path: PathBuf::from("(async runtime)"),
            source: e,
        })?;
    rt.block_on(async move { f(JobStager::from_env().await?).await })
}

/// A path argument.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
pub(crate) unsafe fn path(p: *const c_char, name: &str) -> Result<PathBuf> {
    if p.is_null() {
        return Err(JobStageError::Invalid(format!("{name} is NULL")));
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let bytes = unsafe { CStr::from_ptr(p) }.to_bytes();
    if bytes.is_empty() {
        return Err(JobStageError::Invalid(format!("{name} is empty")));
    }
    Ok(PathBuf::from(OsStr::from_bytes(bytes)))
}

/// A NULL-terminated list of paths (at least one).
///
/// # Safety
/// `list` is NULL or an array of NUL-terminated strings ending with a NULL pointer.
pub(crate) unsafe fn paths(list: *const *const c_char, name: &str) -> Result<Vec<PathBuf>> {
    if list.is_null() {
        return Err(JobStageError::Invalid(format!("{name} is NULL")));
    }
    let mut out = Vec::new();
    for i in 0..MAX_LIST {
        // SAFETY: the list ends with NULL, which we stop at.
        let p = unsafe { *list.add(i) };
        if p.is_null() {
            if out.is_empty() {
                return Err(JobStageError::Invalid(format!("{name} is an empty list")));
            }
            return Ok(out);
        }
        // SAFETY: entries are NUL-terminated strings.
        out.push(unsafe { path(p, name) }?);
    }
    Err(JobStageError::Invalid(format!(
        "{name} has no NULL within {MAX_LIST} entries"
    )))
}

/// Stores a count into an optional `int *`.
///
/// # Safety
/// `p` is NULL or points to a writable int.
pub(crate) unsafe fn put(p: *mut c_int, v: u32) {
    if !p.is_null() {
        // SAFETY: checked non-NULL; the caller passes a writable int.
        unsafe { *p = v.min(c_int::MAX as u32) as c_int };
    }
}
