//! libdatawarp for Surge: Cray DataWarp's C staging API over Surge's in-job staging.
//!
//! Codes written for Cori and Shaheen stage files while they run with `dw_stage_file_in`,
//! `dw_query_file_stage`, `dw_wait_file_stage`, ... This crate builds `libdatawarp.so` with
//! those functions (names, arguments, `0`/`-errno` returns and enum values of Cray's documented
//! API; the header is `include/datawarp.h`), so such a program compiles and links unchanged with
//! `-ldatawarp`. Every call goes through [`surge_stage::job`], the library `surge stage`
//! uses: stage tasks are the manager's, run by its copy engine, and follow the job's session.
//!
//! Boundaries: the library works inside a job started by `surge run` (it finds the job through
//! `$SURGE_RUN_DIR`); it holds no state between calls but the failed-stage walk a caller opens;
//! `docs/LIBDATAWARP.md` lists where Surge differs from DataWarp.

mod call;
mod failed;
mod stripe;

use call::{entry, path, paths, put, with_job};
use std::ffi::{c_char, c_int, c_uint};
use std::path::{Path, PathBuf};
use surge_stage::job::{
    covering, JobItem, JobStageError, JobStager, Result, Scope, StageCounts, When,
};
use surge_stage::{Direction, ItemKind};

pub use failed::{dw_close_failed_stage, dw_open_failed_stage, dw_read_failed_stage};
pub use stripe::{dw_get_mds_path, dw_get_stripe_configuration, dw_set_stripe_configuration};

/// `enum dw_stage_type`.
pub const DW_STAGE_IMMEDIATE: c_int = 0;
pub const DW_STAGE_AT_JOB_END: c_int = 1;
pub const DW_REVOKE_STAGE_AT_JOB_END: c_int = 2;
pub const DW_ACTIVATE_DEFERRED_STAGE: c_int = 3;

fn file(bb: PathBuf, pfs: PathBuf) -> JobItem {
    JobItem {
        kind: ItemKind::File,
        bb,
        pfs,
    }
}

fn directory(bb: PathBuf, pfs: PathBuf) -> JobItem {
    JobItem {
        kind: ItemKind::Directory,
        bb,
        pfs,
    }
}

/// `dir/<base name of f>`: where a list stage puts each file.
fn into_dir(dir: &Path, f: &Path) -> Result<PathBuf> {
    let name = f.file_name().ok_or_else(|| {
        JobStageError::Invalid(format!("{} has no file name to stage", f.display()))
    })?;
    Ok(dir.join(name))
}

fn scope_of(kind: ItemKind) -> Scope {
    match kind {
        ItemKind::File => Scope::File,
        ItemKind::Directory | ItemKind::Any => Scope::Directory,
    }
}

/// Starts a stage now.
fn stage_in(items: Vec<JobItem>) -> Result<c_int> {
    with_job(|mut js| async move {
        js.start(Direction::In, &items, When::Now, 0).await?;
        Ok(0)
    })
}

/// A stage-out of the given `dw_stage_type`.
fn stage_out(items: Vec<JobItem>, stage_type: c_int) -> Result<c_int> {
    with_job(|mut js| async move {
        match stage_type {
            DW_STAGE_IMMEDIATE => {
                js.start(Direction::Out, &items, When::Now, 0).await?;
            }
            DW_STAGE_AT_JOB_END => {
                js.start(Direction::Out, &items, When::AtJobEnd, 0).await?;
            }
            DW_REVOKE_STAGE_AT_JOB_END | DW_ACTIVATE_DEFERRED_STAGE => {
                for it in &items {
                    let deferred: Vec<u64> = js
                        .tasks_for(&it.bb, scope_of(it.kind))
                        .await?
                        .into_iter()
                        .filter(|t| t.state == "deferred" && t.direction == "out")
                        .map(|t| t.id)
                        .collect();
                    if deferred.is_empty() {
                        return Err(JobStageError::Invalid(format!(
                            "{} has no stage-out deferred to the job's end",
                            it.bb.display()
                        )));
                    }
                    for id in deferred {
                        if stage_type == DW_REVOKE_STAGE_AT_JOB_END {
                            js.cancel(id).await?;
                        } else {
                            js.activate(id).await?;
                        }
                    }
                }
            }
            other => {
                return Err(JobStageError::Invalid(format!(
                    "stage_type {other} is not DW_STAGE_IMMEDIATE (0), DW_STAGE_AT_JOB_END (1), \
                     DW_REVOKE_STAGE_AT_JOB_END (2) or DW_ACTIVATE_DEFERRED_STAGE (3)"
                )))
            }
        }
        Ok(0)
    })
}

/// Counts of the stages naming each path (for a file, its latest stage; a task naming several
/// of the paths counts once).
async fn counts(js: &mut JobStager, paths: &[PathBuf], scope: Scope) -> Result<StageCounts> {
    let all = js.tasks().await?;
    let mut seen: Vec<&surge_api::v1::StageTask> = Vec::new();
    for p in paths {
        let loc = js.locate(p)?;
        let hits = covering(&all, &loc, scope);
        if hits.is_empty() {
            return Err(JobStageError::NoStage(p.clone()));
        }
        for t in hits {
            if !seen.iter().any(|s| s.id == t.id) {
                seen.push(t);
            }
        }
    }
    Ok(StageCounts::of(&seen))
}

/// # Safety
/// The out-pointers are NULL or point to writable ints.
unsafe fn query(
    paths: Vec<PathBuf>,
    scope: Scope,
    complete: *mut c_int,
    pending: *mut c_int,
    deferred: *mut c_int,
    failed: *mut c_int,
) -> Result<c_int> {
    let c = with_job(|mut js| async move { counts(&mut js, &paths, scope).await })?;
    // SAFETY: as the caller promises.
    unsafe {
        put(complete, c.complete);
        put(pending, c.pending);
        put(deferred, c.deferred);
        put(failed, c.failed);
    }
    Ok(0)
}

fn wait(paths: Vec<PathBuf>, scope: Scope) -> Result<c_int> {
    with_job(|mut js| async move {
        let mut first_err = None;
        for p in &paths {
            if let Err(e) = js.wait_path(p, scope).await {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(0), Err)
    })
}

/// Ends the pending, deferred or failed stages naming the paths (a terminated failure is
/// forgotten, as in DataWarp).
fn terminate(paths: Vec<PathBuf>, scope: Scope) -> Result<c_int> {
    with_job(|mut js| async move {
        for p in &paths {
            for t in js.tasks_for(p, scope).await? {
                if matches!(
                    t.state.as_str(),
                    "queued" | "running" | "deferred" | "failed"
                ) {
                    js.cancel(t.id).await?;
                }
            }
        }
        Ok(0)
    })
}

/// Stage a PFS file into the burst buffer.
///
/// # Safety
/// Both arguments are NULL or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn dw_stage_file_in(
    dw_file_path: *const c_char,
    pfs_file_path: *const c_char,
) -> c_int {
    entry("dw_stage_file_in", || {
        // SAFETY: as the caller promises.
        let (dw, pfs) = unsafe {
            (
                path(dw_file_path, "dw_file_path")?,
                path(pfs_file_path, "pfs_file_path")?,
            )
        };
        stage_in(vec![file(dw, pfs)])
    })
}

/// Stage a PFS directory's contents into a burst-buffer directory.
///
/// # Safety
/// Both arguments are NULL or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn dw_stage_directory_in(
    dw_directory_path: *const c_char,
    pfs_directory_path: *const c_char,
) -> c_int {
    entry("dw_stage_directory_in", || {
        // SAFETY: as the caller promises.
        let (dw, pfs) = unsafe {
            (
                path(dw_directory_path, "dw_directory_path")?,
                path(pfs_directory_path, "pfs_directory_path")?,
            )
        };
        stage_in(vec![directory(dw, pfs)])
    })
}

/// Stage a NULL-terminated list of PFS files into a burst-buffer directory.
///
/// # Safety
/// `dw_directory_path` is NULL or a NUL-terminated string; `pfs_file_paths` is NULL or a
/// NULL-terminated array of them.
#[no_mangle]
pub unsafe extern "C" fn dw_stage_list_in(
    dw_directory_path: *const c_char,
    pfs_file_paths: *const *const c_char,
) -> c_int {
    entry("dw_stage_list_in", || {
        // SAFETY: as the caller promises.
        let (dir, list) = unsafe {
            (
                path(dw_directory_path, "dw_directory_path")?,
                paths(pfs_file_paths, "pfs_file_paths")?,
            )
        };
        let items = list
            .into_iter()
            .map(|p| Ok(file(into_dir(&dir, &p)?, p)))
            .collect::<Result<Vec<_>>>()?;
        stage_in(items)
    })
}

/// Stage a burst-buffer file to the PFS, now or at job end.
///
/// # Safety
/// Both paths are NULL or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn dw_stage_file_out(
    dw_file_path: *const c_char,
    pfs_file_path: *const c_char,
    stage_type: c_int,
) -> c_int {
    entry("dw_stage_file_out", || {
        // SAFETY: as the caller promises.
        let (dw, pfs) = unsafe {
            (
                path(dw_file_path, "dw_file_path")?,
                path(pfs_file_path, "pfs_file_path")?,
            )
        };
        stage_out(vec![file(dw, pfs)], stage_type)
    })
}

/// Stage a burst-buffer directory's contents to a PFS directory, now or at job end.
///
/// # Safety
/// Both paths are NULL or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn dw_stage_directory_out(
    dw_directory_path: *const c_char,
    pfs_directory_path: *const c_char,
    stage_type: c_int,
) -> c_int {
    entry("dw_stage_directory_out", || {
        // SAFETY: as the caller promises.
        let (dw, pfs) = unsafe {
            (
                path(dw_directory_path, "dw_directory_path")?,
                path(pfs_directory_path, "pfs_directory_path")?,
            )
        };
        stage_out(vec![directory(dw, pfs)], stage_type)
    })
}

/// Stage a NULL-terminated list of burst-buffer files into a PFS directory.
///
/// # Safety
/// `dw_file_paths` is NULL or a NULL-terminated array of NUL-terminated strings;
/// `pfs_directory_path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dw_stage_list_out(
    dw_file_paths: *const *const c_char,
    pfs_directory_path: *const c_char,
    stage_type: c_int,
) -> c_int {
    entry("dw_stage_list_out", || {
        // SAFETY: as the caller promises.
        let (list, dir) = unsafe {
            (
                paths(dw_file_paths, "dw_file_paths")?,
                path(pfs_directory_path, "pfs_directory_path")?,
            )
        };
        let items = list
            .into_iter()
            .map(|p| Ok(file(p.clone(), into_dir(&dir, &p)?)))
            .collect::<Result<Vec<_>>>()?;
        stage_out(items, stage_type)
    })
}

/// Counts of the latest stage of a file.
///
/// # Safety
/// `dw_file_path` is NULL or a NUL-terminated string; the counters are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dw_query_file_stage(
    dw_file_path: *const c_char,
    complete: *mut c_int,
    pending: *mut c_int,
    deferred: *mut c_int,
    failed: *mut c_int,
) -> c_int {
    entry("dw_query_file_stage", || {
        // SAFETY: as the caller promises.
        unsafe {
            let p = path(dw_file_path, "dw_file_path")?;
            query(vec![p], Scope::File, complete, pending, deferred, failed)
        }
    })
}

/// Counts of the stages inside a directory.
///
/// # Safety
/// `dw_directory_path` is NULL or a NUL-terminated string; the counters are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dw_query_directory_stage(
    dw_directory_path: *const c_char,
    complete: *mut c_int,
    pending: *mut c_int,
    deferred: *mut c_int,
    failed: *mut c_int,
) -> c_int {
    entry("dw_query_directory_stage", || {
        // SAFETY: as the caller promises.
        unsafe {
            let p = path(dw_directory_path, "dw_directory_path")?;
            query(
                vec![p],
                Scope::Directory,
                complete,
                pending,
                deferred,
                failed,
            )
        }
    })
}

/// Counts of the latest stages of a list of files.
///
/// # Safety
/// `dw_file_paths` is NULL or a NULL-terminated array of NUL-terminated strings; the counters
/// are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn dw_query_list_stage(
    dw_file_paths: *const *const c_char,
    complete: *mut c_int,
    pending: *mut c_int,
    deferred: *mut c_int,
    failed: *mut c_int,
) -> c_int {
    entry("dw_query_list_stage", || {
        // SAFETY: as the caller promises.
        unsafe {
            let list = paths(dw_file_paths, "dw_file_paths")?;
            query(list, Scope::File, complete, pending, deferred, failed)
        }
    })
}

/// Waits for the stage of a file.
///
/// # Safety
/// `dw_file_path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dw_wait_file_stage(dw_file_path: *const c_char) -> c_int {
    entry("dw_wait_file_stage", || {
        // SAFETY: as the caller promises.
        let p = unsafe { path(dw_file_path, "dw_file_path") }?;
        wait(vec![p], Scope::File)
    })
}

/// Waits for the stages inside a directory.
///
/// # Safety
/// `dw_directory_path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dw_wait_directory_stage(dw_directory_path: *const c_char) -> c_int {
    entry("dw_wait_directory_stage", || {
        // SAFETY: as the caller promises.
        let p = unsafe { path(dw_directory_path, "dw_directory_path") }?;
        wait(vec![p], Scope::Directory)
    })
}

/// Waits for the stages of a list of files.
///
/// # Safety
/// `dw_file_paths` is NULL or a NULL-terminated array of NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn dw_wait_list_stage(dw_file_paths: *const *const c_char) -> c_int {
    entry("dw_wait_list_stage", || {
        // SAFETY: as the caller promises.
        let list = unsafe { paths(dw_file_paths, "dw_file_paths") }?;
        wait(list, Scope::File)
    })
}

/// Terminates the stage of a file.
///
/// # Safety
/// `dw_file_path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dw_terminate_file_stage(dw_file_path: *const c_char) -> c_int {
    entry("dw_terminate_file_stage", || {
        // SAFETY: as the caller promises.
        let p = unsafe { path(dw_file_path, "dw_file_path") }?;
        terminate(vec![p], Scope::File)
    })
}

/// Terminates the stages inside a directory.
///
/// # Safety
/// `dw_directory_path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dw_terminate_directory_stage(dw_directory_path: *const c_char) -> c_int {
    entry("dw_terminate_directory_stage", || {
        // SAFETY: as the caller promises.
        let p = unsafe { path(dw_directory_path, "dw_directory_path") }?;
        terminate(vec![p], Scope::Directory)
    })
}

/// Terminates the stages of a list of files.
///
/// # Safety
/// `dw_file_paths` is NULL or a NULL-terminated array of NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn dw_terminate_list_stage(dw_file_paths: *const *const c_char) -> c_int {
    entry("dw_terminate_list_stage", || {
        // SAFETY: as the caller promises.
        let list = unsafe { paths(dw_file_paths, "dw_file_paths") }?;
        terminate(list, Scope::File)
    })
}

/// Files in flight for the later stages of an instance.
///
/// # Safety
/// `dw_instance_path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn dw_set_stage_concurrency(
    dw_instance_path: *const c_char,
    concurrent_stages: c_uint,
) -> c_int {
    entry("dw_set_stage_concurrency", || {
        // SAFETY: as the caller promises.
        let p = unsafe { path(dw_instance_path, "dw_instance_path") }?;
        with_job(|mut js| async move {
            js.set_concurrency(&p, concurrent_stages).await?;
            Ok(0)
        })
    })
}

/// Why this thread's last failing call failed (Surge's addition to the API).
#[no_mangle]
pub extern "C" fn surge_dw_last_error() -> *const c_char {
    call::last_error()
}
