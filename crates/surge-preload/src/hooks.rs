//! The exported C functions. Each looks at its call only when the library is active and the
//! descriptor is adopted ([`table`]); everything else goes to the C library at once.
//! `stat`/`stat64` (and `pread`/`pread64`, ...) have one layout on the 64-bit Linux targets
//! this library is built for, so each pair shares one body.

use crate::table::{self, Adopted};
use crate::{active, guarded, real, stats};
use libc::{c_char, c_int, c_uint, c_void, iovec, mode_t, off64_t, size_t, ssize_t};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const _: () = assert!(std::mem::size_of::<libc::stat>() == std::mem::size_of::<libc::stat64>());
const _: () = assert!(std::mem::size_of::<libc::off_t>() == std::mem::size_of::<off64_t>());

fn errno() -> c_int {
    // SAFETY: errno of this thread.
    unsafe { *libc::__errno_location() }
}

fn set_errno(e: c_int) {
    // SAFETY: errno of this thread.
    unsafe { *libc::__errno_location() = e };
}

/// The adopted descriptor `fd`, when the library is active.
fn adopted(fd: c_int) -> Option<Arc<Adopted>> {
    if !active() {
        return None;
    }
    guarded(|| table::get(fd)).flatten()
}

/// Returns `r`'s value, or -1 with errno set.
fn ret<T: From<i8>>(r: Result<T, c_int>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => {
            set_errno(e);
            T::from(-1)
        }
    }
}

/// The result of a C library call: its value, or its errno.
fn check<T: Copy + PartialOrd + From<i8>>(v: T) -> Result<T, c_int> {
    if v < T::from(0) {
        Err(errno())
    } else {
        Ok(v)
    }
}

// ---- open: through the mount, then adopted ----

/// After an open returned `fd` (opened with `flags`): forgets what the library knew of that
/// number (a descriptor closed behind its back) and asks the mount to adopt it.
fn opened(fd: c_int, flags: c_int) {
    if fd < 0 || !active() {
        return;
    }
    let saved = errno();
    guarded(|| {
        table::forget(fd);
        let kept =
            libc::O_APPEND | libc::O_DIRECT | libc::O_DSYNC | libc::O_PATH | libc::O_DIRECTORY;
        if flags & kept != 0 {
            return;
        }
        // SAFETY: stat64 is plain old data.
        let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` was just opened; `st` is ours.
        if unsafe { real::fstat64(fd, &mut st) } != 0 {
            return;
        }
        // Only regular files of file systems without a device (FUSE's major number is 0).
        let major = ((st.st_dev >> 32) & 0xffff_f000) | ((st.st_dev >> 8) & 0xfff);
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || major != 0 {
            return;
        }
        if crate::lazy() {
            table::candidate(fd, st.st_dev);
        } else {
            table::adopt(fd, st.st_dev);
        }
    });
    set_errno(saved);
}

/// The adopted descriptor `fd`; with `SURGE_PRELOAD_ADOPT=fsync`, a candidate (a regular
/// file of a FUSE mount opened since) is adopted now.
fn adopted_at_sync(fd: c_int) -> Option<Arc<Adopted>> {
    if let Some(a) = adopted(fd) {
        return Some(a);
    }
    if !active() || !crate::lazy() {
        return None;
    }
    guarded(|| {
        let dev = table::take_candidate(fd)?;
        table::adopt(fd, dev)?;
        table::get(fd)
    })
    .flatten()
}

/// # Safety
/// As open(2); `mode` is read only with `O_CREAT` or `O_TMPFILE`.
#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    let fd = unsafe { real::open(path, flags, mode) };
    opened(fd, flags);
    fd
}

/// # Safety
/// As open(2).
#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    let fd = unsafe { real::open64(path, flags, mode) };
    opened(fd, flags);
    fd
}

/// # Safety
/// As openat(2).
#[no_mangle]
pub unsafe extern "C" fn openat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    let fd = unsafe { real::openat(dirfd, path, flags, mode) };
    opened(fd, flags);
    fd
}

/// # Safety
/// As openat(2).
#[no_mangle]
pub unsafe extern "C" fn openat64(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    let fd = unsafe { real::openat64(dirfd, path, flags, mode) };
    opened(fd, flags);
    fd
}

/// # Safety
/// As creat(2).
#[no_mangle]
pub unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    let fd = unsafe { real::creat(path, mode) };
    opened(fd, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC);
    fd
}

/// # Safety
/// As creat(2).
#[no_mangle]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: mode_t) -> c_int {
    let fd = unsafe { real::creat64(path, mode) };
    opened(fd, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC);
    fd
}

/// # Safety
/// As open(2) (the fortified entry point).
#[no_mangle]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    let fd = unsafe { real::__open_2(path, flags) };
    opened(fd, flags);
    fd
}

/// # Safety
/// As open(2) (the fortified entry point).
#[no_mangle]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    let fd = unsafe { real::__open64_2(path, flags) };
    opened(fd, flags);
    fd
}

/// # Safety
/// As openat(2) (the fortified entry point).
#[no_mangle]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    let fd = unsafe { real::__openat_2(dirfd, path, flags) };
    opened(fd, flags);
    fd
}

/// # Safety
/// As openat(2) (the fortified entry point).
#[no_mangle]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    let fd = unsafe { real::__openat64_2(dirfd, path, flags) };
    opened(fd, flags);
    fd
}

// ---- close: the kernel's (the mount commits at the close) ----

/// Forgets `fd` if adopted (its object is closed).
fn closing(fd: c_int) {
    if active() {
        guarded(|| {
            drop(table::forget(fd));
            if crate::lazy() {
                table::take_candidate(fd);
            }
        });
    }
}

/// # Safety
/// As close(2).
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    closing(fd);
    unsafe { real::close(fd) }
}

/// # Safety
/// As fclose(3).
#[no_mangle]
pub unsafe extern "C" fn fclose(f: *mut libc::FILE) -> c_int {
    if !f.is_null() {
        // SAFETY: a stream the caller owns.
        closing(unsafe { libc::fileno(f) });
    }
    unsafe { real::fclose(f) }
}

/// # Safety
/// As close_range(2).
#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 && active() {
        guarded(|| table::forget_range(first, last));
    }
    unsafe { real::close_range(first, last, flags) }
}

/// # Safety
/// As closefrom(3).
#[no_mangle]
pub unsafe extern "C" fn closefrom(low: c_int) {
    if active() && low >= 0 {
        guarded(|| table::forget_range(low as u32, u32::MAX));
    }
    unsafe { real::closefrom(low) }
}

/// After a call that made `new` a duplicate of `old` (or failed: `new` < 0).
fn duplicated(old: c_int, new: c_int) {
    if new >= 0 && new != old && active() {
        let saved = errno();
        guarded(|| table::duplicated(old, new));
        set_errno(saved);
    }
}

/// # Safety
/// As dup(2).
#[no_mangle]
pub unsafe extern "C" fn dup(old: c_int) -> c_int {
    let new = unsafe { real::dup(old) };
    duplicated(old, new);
    new
}

/// # Safety
/// As dup2(2).
#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    let r = unsafe { real::dup2(old, new) };
    duplicated(old, r);
    r
}

/// # Safety
/// As dup3(2).
#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    let r = unsafe { real::dup3(old, new, flags) };
    duplicated(old, r);
    r
}

/// `fcntl(F_SETFL)` adding flags the library leaves to the kernel (appends, direct or
/// synchronous I/O): the descriptor goes back to the kernel first.
fn setfl(fd: c_int, cmd: c_int, arg: usize) {
    let kept = (libc::O_APPEND | libc::O_DIRECT | libc::O_DSYNC) as usize;
    if cmd != libc::F_SETFL || arg & kept == 0 {
        return;
    }
    if let Some(a) = adopted(fd) {
        guarded(|| {
            let _ = table::sync_if_dirty(&a);
            table::forget_file(&a);
            stats::FORWARDED.bump();
        });
    }
}

/// # Safety
/// As fcntl(2); `arg` is passed on as given.
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    setfl(fd, cmd, arg);
    let r = unsafe { real::fcntl(fd, cmd, arg) };
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        duplicated(fd, r);
    }
    r
}

/// # Safety
/// As fcntl(2); `arg` is passed on as given.
#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    setfl(fd, cmd, arg);
    let r = unsafe { real::fcntl64(fd, cmd, arg) };
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        duplicated(fd, r);
    }
    r
}

// ---- data ----

/// A read or write at the descriptor's own offset (the kernel's): `io(object, position)`
/// does it, and the offset moves by what it did.
fn at_offset(
    fd: c_int,
    a: &Adopted,
    io: impl FnOnce(c_int, off64_t) -> ssize_t,
) -> Result<ssize_t, c_int> {
    let _offset = a.offset.lock();
    // SAFETY: `fd` is the caller's open descriptor.
    let pos = check(unsafe { real::lseek64(fd, 0, libc::SEEK_CUR) })?;
    let n = check(io(a.object.as_raw_fd(), pos))?;
    if n > 0 {
        // SAFETY: as above.
        check(unsafe { real::lseek64(fd, pos + n as off64_t, libc::SEEK_SET) })?;
    }
    Ok(n)
}

fn counted_read(r: Result<ssize_t, c_int>) -> Result<ssize_t, c_int> {
    if let Ok(n) = r {
        stats::READS.bump();
        stats::READ_BYTES.add(n as u64);
    }
    r
}

fn counted_write(a: &Adopted, r: Result<ssize_t, c_int>) -> Result<ssize_t, c_int> {
    if let Ok(n) = r {
        stats::WRITES.bump();
        stats::WRITE_BYTES.add(n as u64);
        if n > 0 {
            a.dirty.store(true, Ordering::SeqCst);
        }
    }
    r
}

/// # Safety
/// As read(2).
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    if let Some(a) = adopted(fd) {
        // SAFETY (closure): the caller's buffer, as given.
        let r = guarded(|| {
            counted_read(at_offset(fd, &a, |o, pos| unsafe {
                real::pread64(o, buf, n, pos)
            }))
        });
        if let Some(r) = r {
            return ret(r);
        }
    }
    unsafe { real::read(fd, buf, n) }
}

/// # Safety
/// As write(2).
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    if let Some(a) = adopted(fd) {
        // SAFETY (closure): the caller's buffer, as given.
        let r = guarded(|| {
            counted_write(
                &a,
                at_offset(fd, &a, |o, pos| unsafe { real::pwrite64(o, buf, n, pos) }),
            )
        });
        if let Some(r) = r {
            return ret(r);
        }
    }
    unsafe { real::write(fd, buf, n) }
}

/// # Safety
/// As pread(2).
#[no_mangle]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t {
    if let Some(a) = adopted(fd) {
        // SAFETY (closure): the caller's buffer, as given.
        let r = guarded(|| {
            counted_read(check(unsafe {
                real::pread64(a.object.as_raw_fd(), buf, n, off)
            }))
        });
        if let Some(r) = r {
            return ret(r);
        }
    }
    unsafe { real::pread64(fd, buf, n, off) }
}

/// # Safety
/// As pread(2).
#[no_mangle]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t {
    unsafe { pread64(fd, buf, n, off) }
}

/// # Safety
/// As pwrite(2).
#[no_mangle]
pub unsafe extern "C" fn pwrite64(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    off: off64_t,
) -> ssize_t {
    if let Some(a) = adopted(fd) {
        // SAFETY (closure): the caller's buffer, as given.
        let r = guarded(|| {
            counted_write(
                &a,
                check(unsafe { real::pwrite64(a.object.as_raw_fd(), buf, n, off) }),
            )
        });
        if let Some(r) = r {
            return ret(r);
        }
    }
    unsafe { real::pwrite64(fd, buf, n, off) }
}

/// # Safety
/// As pwrite(2).
#[no_mangle]
pub unsafe extern "C" fn pwrite(fd: c_int, buf: *const c_void, n: size_t, off: off64_t) -> ssize_t {
    unsafe { pwrite64(fd, buf, n, off) }
}

/// # Safety
/// As readv(2).
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    if let Some(a) = adopted(fd) {
        // SAFETY (closure): the caller's vector, as given.
        let r = guarded(|| {
            counted_read(at_offset(fd, &a, |o, pos| unsafe {
                real::preadv64(o, iov, n, pos)
            }))
        });
        if let Some(r) = r {
            return ret(r);
        }
    }
    unsafe { real::readv(fd, iov, n) }
}

/// # Safety
/// As writev(2).
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    if let Some(a) = adopted(fd) {
        // SAFETY (closure): the caller's vector, as given.
        let r = guarded(|| {
            counted_write(
                &a,
                at_offset(fd, &a, |o, pos| unsafe { real::pwritev64(o, iov, n, pos) }),
            )
        });
        if let Some(r) = r {
            return ret(r);
        }
    }
    unsafe { real::writev(fd, iov, n) }
}

/// # Safety
/// As preadv(2).
#[no_mangle]
pub unsafe extern "C" fn preadv64(fd: c_int, iov: *const iovec, n: c_int, off: off64_t) -> ssize_t {
    if let Some(a) = adopted(fd) {
        // SAFETY (closure): the caller's vector, as given.
        let r = guarded(|| {
            counted_read(check(unsafe {
                real::preadv64(a.object.as_raw_fd(), iov, n, off)
            }))
        });
        if let Some(r) = r {
            return ret(r);
        }
    }
    unsafe { real::preadv64(fd, iov, n, off) }
}

/// # Safety
/// As preadv(2).
#[no_mangle]
pub unsafe extern "C" fn preadv(fd: c_int, iov: *const iovec, n: c_int, off: off64_t) -> ssize_t {
    unsafe { preadv64(fd, iov, n, off) }
}

/// # Safety
/// As pwritev(2).
#[no_mangle]
pub unsafe extern "C" fn pwritev64(
    fd: c_int,
    iov: *const iovec,
    n: c_int,
    off: off64_t,
) -> ssize_t {
    if let Some(a) = adopted(fd) {
        // SAFETY (closure): the caller's vector, as given.
        let r = guarded(|| {
            counted_write(
                &a,
                check(unsafe { real::pwritev64(a.object.as_raw_fd(), iov, n, off) }),
            )
        });
        if let Some(r) = r {
            return ret(r);
        }
    }
    unsafe { real::pwritev64(fd, iov, n, off) }
}

/// # Safety
/// As pwritev(2).
#[no_mangle]
pub unsafe extern "C" fn pwritev(fd: c_int, iov: *const iovec, n: c_int, off: off64_t) -> ssize_t {
    unsafe { pwritev64(fd, iov, n, off) }
}

/// `preadv2`/`pwritev2` flags the object serves as the kernel would (hints about waiting);
/// any other (`RWF_DSYNC`, `RWF_SYNC`, `RWF_APPEND`, atomic writes) goes to the kernel.
const RWF_HINTS: c_int = libc::RWF_HIPRI | libc::RWF_NOWAIT;

/// # Safety
/// As preadv2(2).
#[no_mangle]
pub unsafe extern "C" fn preadv64v2(
    fd: c_int,
    iov: *const iovec,
    n: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    if flags & !RWF_HINTS == 0 {
        if let Some(a) = adopted(fd) {
            // SAFETY (closure): the caller's vector, as given.
            let r = guarded(|| {
                counted_read(if off == -1 {
                    at_offset(fd, &a, |o, pos| unsafe { real::preadv64(o, iov, n, pos) })
                } else {
                    check(unsafe { real::preadv64(a.object.as_raw_fd(), iov, n, off) })
                })
            });
            if let Some(r) = r {
                return ret(r);
            }
        }
    } else if let Err(e) = before_kernel(fd) {
        set_errno(e);
        return -1;
    }
    unsafe { real::preadv64v2(fd, iov, n, off, flags) }
}

/// # Safety
/// As preadv2(2).
#[no_mangle]
pub unsafe extern "C" fn preadv2(
    fd: c_int,
    iov: *const iovec,
    n: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    unsafe { preadv64v2(fd, iov, n, off, flags) }
}

/// # Safety
/// As pwritev2(2).
#[no_mangle]
pub unsafe extern "C" fn pwritev64v2(
    fd: c_int,
    iov: *const iovec,
    n: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    if flags & !RWF_HINTS == 0 {
        if let Some(a) = adopted(fd) {
            // SAFETY (closure): the caller's vector, as given.
            let r = guarded(|| {
                counted_write(
                    &a,
                    if off == -1 {
                        at_offset(fd, &a, |o, pos| unsafe { real::pwritev64(o, iov, n, pos) })
                    } else {
                        check(unsafe { real::pwritev64(a.object.as_raw_fd(), iov, n, off) })
                    },
                )
            });
            if let Some(r) = r {
                return ret(r);
            }
        }
    } else if let Err(e) = before_kernel(fd) {
        set_errno(e);
        return -1;
    }
    unsafe { real::pwritev64v2(fd, iov, n, off, flags) }
}

/// # Safety
/// As pwritev2(2).
#[no_mangle]
pub unsafe extern "C" fn pwritev2(
    fd: c_int,
    iov: *const iovec,
    n: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    unsafe { pwritev64v2(fd, iov, n, off, flags) }
}

/// `lseek` of an adopted descriptor: positions that depend on the data come from the object
/// (the kernel's cached size may predate this process's writes).
fn seek(fd: c_int, a: &Adopted, off: off64_t, whence: c_int) -> Result<off64_t, c_int> {
    let _offset = a.offset.lock();
    let object = a.object.as_raw_fd();
    let to = match whence {
        libc::SEEK_END => {
            let size = object_stat(a)?.st_size;
            size.checked_add(off)
                .filter(|&p| p >= 0)
                .ok_or(libc::EINVAL)?
        }
        // SAFETY: the object is ours; its own offset is never used for I/O.
        libc::SEEK_DATA | libc::SEEK_HOLE => check(unsafe { real::lseek64(object, off, whence) })?,
        // SAFETY: the caller's descriptor.
        _ => return check(unsafe { real::lseek64(fd, off, whence) }),
    };
    // SAFETY: the caller's descriptor.
    check(unsafe { real::lseek64(fd, to, libc::SEEK_SET) })
}

/// # Safety
/// As lseek(2).
#[no_mangle]
pub unsafe extern "C" fn lseek64(fd: c_int, off: off64_t, whence: c_int) -> off64_t {
    if let Some(a) = adopted(fd) {
        if let Some(r) = guarded(|| seek(fd, &a, off, whence)) {
            return ret(r);
        }
    }
    unsafe { real::lseek64(fd, off, whence) }
}

/// # Safety
/// As lseek(2).
#[no_mangle]
pub unsafe extern "C" fn lseek(fd: c_int, off: off64_t, whence: c_int) -> off64_t {
    unsafe { lseek64(fd, off, whence) }
}

/// `fsync` (`data_only`: `fdatasync`) of an adopted descriptor: the object to stable storage,
/// then the mount commits size and mtime.
fn sync(a: &Adopted, data_only: bool) -> Result<c_int, c_int> {
    let object = a.object.as_raw_fd();
    // SAFETY: the object is ours.
    check(unsafe {
        if data_only {
            real::fdatasync(object)
        } else {
            real::fsync(object)
        }
    })?;
    stats::FSYNCS.bump();
    table::sync(a)?;
    Ok(0)
}

/// # Safety
/// As fsync(2).
#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    if let Some(a) = adopted_at_sync(fd) {
        if let Some(r) = guarded(|| sync(&a, false)) {
            return ret(r);
        }
    }
    unsafe { real::fsync(fd) }
}

/// # Safety
/// As fdatasync(2).
#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    if let Some(a) = adopted_at_sync(fd) {
        if let Some(r) = guarded(|| sync(&a, true)) {
            return ret(r);
        }
    }
    unsafe { real::fdatasync(fd) }
}

// ---- attributes: the kernel's, with size, blocks and mtime from the object ----

fn object_stat(a: &Adopted) -> Result<libc::stat64, c_int> {
    // SAFETY: stat64 is plain old data.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: the object is ours; `st` is ours.
    check(unsafe { real::fstat64(a.object.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// Overlays what the object says on attributes the kernel gave (`size`, `blocks`, `mtime`).
fn overlay(a: &Adopted, size: &mut i64, blocks: &mut i64, mtime: (&mut i64, &mut i64)) {
    let Ok(o) = object_stat(a) else { return };
    *size = o.st_size;
    *blocks = (*blocks).max(o.st_blocks);
    // Only while this process's writes are not committed: afterwards the mount's time is the
    // file's (an application may have set it since).
    if a.dirty.load(Ordering::SeqCst) && (o.st_mtime, o.st_mtime_nsec) > (*mtime.0, *mtime.1) {
        *mtime.0 = o.st_mtime;
        *mtime.1 = o.st_mtime_nsec;
    }
}

/// After a `stat` by name that succeeded: a file this process has adopted gets the same
/// correction as `fstat` of its descriptor (else the kernel's cached size, from before this
/// process's writes, would be what the program sees until its `fsync` or `close`).
fn overlay_named_stat(r: c_int, st: *mut libc::stat64) {
    if r != 0 || st.is_null() {
        return;
    }
    // SAFETY: the caller's buffer, filled by the C library just now.
    let st = unsafe { &mut *st };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return;
    }
    if let Some(a) = table::by_inode(st.st_dev, st.st_ino) {
        guarded(|| {
            overlay(
                &a,
                &mut st.st_size,
                &mut st.st_blocks,
                (&mut st.st_mtime, &mut st.st_mtime_nsec),
            )
        });
    }
}

/// # Safety
/// As stat(2).
#[no_mangle]
pub unsafe extern "C" fn stat64(path: *const c_char, st: *mut libc::stat64) -> c_int {
    let r = unsafe { real::stat64(path, st) };
    overlay_named_stat(r, st);
    r
}

/// # Safety
/// As stat(2).
#[no_mangle]
pub unsafe extern "C" fn stat(path: *const c_char, st: *mut libc::stat64) -> c_int {
    unsafe { stat64(path, st) }
}

/// # Safety
/// As lstat(2).
#[no_mangle]
pub unsafe extern "C" fn lstat64(path: *const c_char, st: *mut libc::stat64) -> c_int {
    let r = unsafe { real::lstat64(path, st) };
    overlay_named_stat(r, st);
    r
}

/// # Safety
/// As lstat(2).
#[no_mangle]
pub unsafe extern "C" fn lstat(path: *const c_char, st: *mut libc::stat64) -> c_int {
    unsafe { lstat64(path, st) }
}

/// # Safety
/// As `__xstat64` (stat for programs built against glibc before 2.33).
#[no_mangle]
pub unsafe extern "C" fn __xstat64(
    ver: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
) -> c_int {
    let r = unsafe { real::__xstat64(ver, path, st) };
    overlay_named_stat(r, st);
    r
}

/// # Safety
/// As `__xstat64`.
#[no_mangle]
pub unsafe extern "C" fn __xstat(ver: c_int, path: *const c_char, st: *mut libc::stat64) -> c_int {
    unsafe { __xstat64(ver, path, st) }
}

/// # Safety
/// As `__lxstat64` (lstat for programs built against glibc before 2.33).
#[no_mangle]
pub unsafe extern "C" fn __lxstat64(
    ver: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
) -> c_int {
    let r = unsafe { real::__lxstat64(ver, path, st) };
    overlay_named_stat(r, st);
    r
}

/// # Safety
/// As `__lxstat64`.
#[no_mangle]
pub unsafe extern "C" fn __lxstat(ver: c_int, path: *const c_char, st: *mut libc::stat64) -> c_int {
    unsafe { __lxstat64(ver, path, st) }
}

fn overlay_stat(fd: c_int, r: c_int, st: *mut libc::stat64) {
    if r != 0 || st.is_null() {
        return;
    }
    if let Some(a) = adopted(fd) {
        // SAFETY: the caller's buffer, filled by the C library just now.
        let st = unsafe { &mut *st };
        guarded(|| {
            overlay(
                &a,
                &mut st.st_size,
                &mut st.st_blocks,
                (&mut st.st_mtime, &mut st.st_mtime_nsec),
            )
        });
    }
}

/// # Safety
/// As fstat(2).
#[no_mangle]
pub unsafe extern "C" fn fstat64(fd: c_int, st: *mut libc::stat64) -> c_int {
    let r = unsafe { real::fstat64(fd, st) };
    overlay_stat(fd, r, st);
    r
}

/// # Safety
/// As fstat(2).
#[no_mangle]
pub unsafe extern "C" fn fstat(fd: c_int, st: *mut libc::stat64) -> c_int {
    unsafe { fstat64(fd, st) }
}

/// # Safety
/// As `__fxstat64` (what programs built against glibc before 2.33 call for fstat).
#[no_mangle]
pub unsafe extern "C" fn __fxstat64(ver: c_int, fd: c_int, st: *mut libc::stat64) -> c_int {
    let r = unsafe { real::__fxstat64(ver, fd, st) };
    overlay_stat(fd, r, st);
    r
}

/// # Safety
/// As `__fxstat64`.
#[no_mangle]
pub unsafe extern "C" fn __fxstat(ver: c_int, fd: c_int, st: *mut libc::stat64) -> c_int {
    unsafe { __fxstat64(ver, fd, st) }
}

/// Whether `path` is empty with `AT_EMPTY_PATH`: the call is about `dirfd` itself.
fn about_fd(path: *const c_char, flags: c_int) -> bool {
    // SAFETY: the caller's NUL-terminated path (only its first byte is read).
    flags & libc::AT_EMPTY_PATH != 0 && (path.is_null() || unsafe { *path } == 0)
}

/// # Safety
/// As fstatat(2).
#[no_mangle]
pub unsafe extern "C" fn fstatat64(
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    let r = unsafe { real::fstatat64(dirfd, path, st, flags) };
    if about_fd(path, flags) {
        overlay_stat(dirfd, r, st);
    } else {
        overlay_named_stat(r, st);
    }
    r
}

/// # Safety
/// As fstatat(2).
#[no_mangle]
pub unsafe extern "C" fn fstatat(
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    unsafe { fstatat64(dirfd, path, st, flags) }
}

/// # Safety
/// As fstatat(2).
#[no_mangle]
pub unsafe extern "C" fn newfstatat(
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    unsafe { fstatat64(dirfd, path, st, flags) }
}

/// # Safety
/// As `__fxstatat64`.
#[no_mangle]
pub unsafe extern "C" fn __fxstatat64(
    ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    let r = unsafe { real::__fxstatat64(ver, dirfd, path, st, flags) };
    if about_fd(path, flags) {
        overlay_stat(dirfd, r, st);
    } else {
        overlay_named_stat(r, st);
    }
    r
}

/// # Safety
/// As statx(2).
#[no_mangle]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    st: *mut libc::statx,
) -> c_int {
    let r = unsafe { real::statx(dirfd, path, flags, mask, st) };
    if r == 0 && !st.is_null() {
        // SAFETY: the caller's buffer, filled by the C library just now.
        let (regular, dev, ino) = unsafe {
            (
                u32::from((*st).stx_mode) & libc::S_IFMT == libc::S_IFREG,
                libc::makedev((*st).stx_dev_major, (*st).stx_dev_minor),
                (*st).stx_ino,
            )
        };
        let file = if about_fd(path, flags) {
            adopted(dirfd)
        } else if regular {
            table::by_inode(dev, ino)
        } else {
            None
        };
        if let Some(a) = file {
            // SAFETY: the caller's buffer, filled by the C library just now.
            let st = unsafe { &mut *st };
            guarded(|| {
                let (mut size, mut blocks) = (st.stx_size as i64, st.stx_blocks as i64);
                let (mut sec, mut nsec) = (st.stx_mtime.tv_sec, i64::from(st.stx_mtime.tv_nsec));
                overlay(&a, &mut size, &mut blocks, (&mut sec, &mut nsec));
                st.stx_size = size as u64;
                st.stx_blocks = blocks as u64;
                st.stx_mtime.tv_sec = sec;
                st.stx_mtime.tv_nsec = nsec as u32;
            });
        }
    }
    r
}

// ---- calls the kernel serves: what was written here is committed first ----

/// Before a call on `fd` the kernel serves: commits this process's writes to it, so the
/// kernel (and the mount behind it) see the file as written.
fn before_kernel(fd: c_int) -> Result<(), c_int> {
    match adopted(fd) {
        Some(a) => guarded(|| {
            stats::FORWARDED.bump();
            if !a.dirty.load(Ordering::SeqCst) {
                return Ok(());
            }
            table::sync(&a)?;
            // The mount dropped the kernel's attributes; a stat has the kernel fetch them
            // now (the size is what `copy_file_range` and `sendfile` check ranges against).
            // SAFETY: stat64 is plain old data; `fd` is the caller's.
            let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
            unsafe { real::fstat64(fd, &mut st) };
            Ok(())
        })
        .unwrap_or(Ok(())),
        None => Ok(()),
    }
}

/// # Safety
/// As mmap(2).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off64_t,
) -> *mut c_void {
    if flags & libc::MAP_ANONYMOUS == 0 {
        if let Err(e) = before_kernel(fd) {
            set_errno(e);
            return libc::MAP_FAILED;
        }
    }
    unsafe { real::mmap64(addr, len, prot, flags, fd, off) }
}

/// # Safety
/// As mmap(2).
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off64_t,
) -> *mut c_void {
    unsafe { mmap64(addr, len, prot, flags, fd, off) }
}

/// # Safety
/// As ftruncate(2).
#[no_mangle]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off64_t) -> c_int {
    if let Err(e) = before_kernel(fd) {
        set_errno(e);
        return -1;
    }
    unsafe { real::ftruncate64(fd, len) }
}

/// # Safety
/// As ftruncate(2).
#[no_mangle]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: off64_t) -> c_int {
    unsafe { ftruncate64(fd, len) }
}

/// # Safety
/// As fallocate(2).
#[no_mangle]
pub unsafe extern "C" fn fallocate64(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int {
    if let Err(e) = before_kernel(fd) {
        set_errno(e);
        return -1;
    }
    unsafe { real::fallocate64(fd, mode, off, len) }
}

/// # Safety
/// As fallocate(2).
#[no_mangle]
pub unsafe extern "C" fn fallocate(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int {
    unsafe { fallocate64(fd, mode, off, len) }
}

/// # Safety
/// As posix_fallocate(3) (returns the error).
#[no_mangle]
pub unsafe extern "C" fn posix_fallocate64(fd: c_int, off: off64_t, len: off64_t) -> c_int {
    if let Err(e) = before_kernel(fd) {
        return e;
    }
    unsafe { real::posix_fallocate64(fd, off, len) }
}

/// # Safety
/// As posix_fallocate(3) (returns the error).
#[no_mangle]
pub unsafe extern "C" fn posix_fallocate(fd: c_int, off: off64_t, len: off64_t) -> c_int {
    unsafe { posix_fallocate64(fd, off, len) }
}

/// # Safety
/// As futimens(3).
#[no_mangle]
pub unsafe extern "C" fn futimens(fd: c_int, times: *const libc::timespec) -> c_int {
    if let Err(e) = before_kernel(fd) {
        set_errno(e);
        return -1;
    }
    unsafe { real::futimens(fd, times) }
}

// ---- copies between descriptors: done here when an adopted one takes part ----

/// Largest piece a copy moves at once (its buffer).
const COPY_CHUNK: usize = 1 << 20;

/// Reads from `fd` (at `off`, else at its offset) into `buf`: from the object when adopted.
fn read_any(fd: c_int, buf: &mut [u8], off: Option<off64_t>) -> Result<ssize_t, c_int> {
    let p = buf.as_mut_ptr().cast();
    // SAFETY: our buffer, of its length; the descriptors are the caller's.
    match (table::get(fd), off) {
        (Some(a), Some(o)) => counted_read(check(unsafe {
            real::pread64(a.object.as_raw_fd(), p, buf.len(), o)
        })),
        (Some(a), None) => counted_read(at_offset(fd, &a, |o, pos| unsafe {
            real::pread64(o, p, buf.len(), pos)
        })),
        (None, Some(o)) => check(unsafe { real::pread64(fd, p, buf.len(), o) }),
        (None, None) => check(unsafe { real::read(fd, p, buf.len()) }),
    }
}

/// Writes `buf` to `fd` (at `off`, else at its offset): into the object when adopted.
fn write_any(fd: c_int, buf: &[u8], off: Option<off64_t>) -> Result<ssize_t, c_int> {
    let p = buf.as_ptr().cast();
    // SAFETY: our buffer, of its length; the descriptors are the caller's.
    match (table::get(fd), off) {
        (Some(a), Some(o)) => counted_write(
            &a,
            check(unsafe { real::pwrite64(a.object.as_raw_fd(), p, buf.len(), o) }),
        ),
        (Some(a), None) => {
            let r = at_offset(fd, &a, |o, pos| unsafe {
                real::pwrite64(o, p, buf.len(), pos)
            });
            counted_write(&a, r)
        }
        (None, Some(o)) => check(unsafe { real::pwrite64(fd, p, buf.len(), o) }),
        (None, None) => check(unsafe { real::write(fd, p, buf.len()) }),
    }
}

/// Copies up to `len` bytes from `fd_in` to `fd_out` by reads and writes (`copy_file_range`
/// and `sendfile` of an adopted descriptor: the kernel would check the ranges against its
/// cached size, which predates this process's writes). `off_in`/`off_out`: positions to use
/// and advance, else the descriptors' offsets. Returns what was copied; an error only when
/// nothing was.
fn copy(
    fd_in: c_int,
    mut off_in: Option<&mut off64_t>,
    fd_out: c_int,
    mut off_out: Option<&mut off64_t>,
    len: usize,
) -> Result<ssize_t, c_int> {
    let mut buf = vec![0u8; len.min(COPY_CHUNK)];
    let mut done: usize = 0;
    while done < len {
        let want = (len - done).min(buf.len());
        let n = match read_any(fd_in, &mut buf[..want], off_in.as_deref().copied()) {
            Ok(0) => break,
            Ok(n) => n as usize,
            Err(e) if done == 0 => return Err(e),
            Err(_) => break,
        };
        let mut put = 0;
        while put < n {
            let at = off_out.as_deref().map(|o| o + put as off64_t);
            match write_any(fd_out, &buf[put..n], at) {
                Ok(w) if w > 0 => put += w as usize,
                Ok(_) => break,
                Err(e) if done + put == 0 => return Err(e),
                Err(_) => break,
            }
        }
        if let Some(o) = off_in.as_deref_mut() {
            *o += put as off64_t;
        }
        if let Some(o) = off_out.as_deref_mut() {
            *o += put as off64_t;
        }
        done += put;
        if put < n {
            // The input moved past what was written: put its offset back (no offset given).
            if off_in.is_none() {
                // SAFETY: the caller's descriptor.
                unsafe { real::lseek64(fd_in, put as off64_t - n as off64_t, libc::SEEK_CUR) };
            }
            break;
        }
    }
    stats::COPIES.bump();
    Ok(done as ssize_t)
}

/// Whether two ranges of one file overlap (`copy_file_range` refuses that with EINVAL).
fn same_file_overlap(fd_in: c_int, a: off64_t, fd_out: c_int, b: off64_t, len: usize) -> bool {
    let (Some(x), Some(y)) = (table::get(fd_in), table::get(fd_out)) else {
        return false;
    };
    x.ino == y.ino && x.dev == y.dev && a < b + len as off64_t && b < a + len as off64_t
}

/// # Safety
/// As copy_file_range(2).
#[no_mangle]
pub unsafe extern "C" fn copy_file_range(
    fd_in: c_int,
    off_in: *mut off64_t,
    fd_out: c_int,
    off_out: *mut off64_t,
    len: size_t,
    flags: c_uint,
) -> ssize_t {
    if flags == 0 && (adopted(fd_in).is_some() || adopted(fd_out).is_some()) {
        // SAFETY: the caller's offsets, when given.
        let (oi, oo) = unsafe { (off_in.as_mut(), off_out.as_mut()) };
        let r = guarded(|| {
            let ai = oi
                .as_deref()
                .copied()
                .unwrap_or_else(|| unsafe { real::lseek64(fd_in, 0, libc::SEEK_CUR) });
            let ao = oo
                .as_deref()
                .copied()
                .unwrap_or_else(|| unsafe { real::lseek64(fd_out, 0, libc::SEEK_CUR) });
            if same_file_overlap(fd_in, ai, fd_out, ao, len) {
                return Err(libc::EINVAL);
            }
            copy(fd_in, oi, fd_out, oo, len)
        });
        if let Some(r) = r {
            return ret(r);
        }
    }
    unsafe { real::copy_file_range(fd_in, off_in, fd_out, off_out, len, flags) }
}

/// # Safety
/// As sendfile(2).
#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    out: c_int,
    fd_in: c_int,
    off: *mut off64_t,
    n: size_t,
) -> ssize_t {
    if adopted(fd_in).is_some() || adopted(out).is_some() {
        // SAFETY: the caller's offset, when given.
        let oi = unsafe { off.as_mut() };
        if let Some(r) = guarded(|| copy(fd_in, oi, out, None, n)) {
            return ret(r);
        }
    }
    unsafe { real::sendfile64(out, fd_in, off, n) }
}

/// # Safety
/// As sendfile(2).
#[no_mangle]
pub unsafe extern "C" fn sendfile(
    out: c_int,
    fd_in: c_int,
    off: *mut off64_t,
    n: size_t,
) -> ssize_t {
    unsafe { sendfile64(out, fd_in, off, n) }
}

// ---- exec: what was written here is committed first ----

fn before_exec() {
    if active() {
        guarded(table::sync_all);
    }
}

/// # Safety
/// As execve(2).
#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    before_exec();
    unsafe { real::execve(path, argv, envp) }
}

/// # Safety
/// As execv(3).
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    before_exec();
    unsafe { real::execv(path, argv) }
}

/// # Safety
/// As execvp(3).
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    before_exec();
    unsafe { real::execvp(file, argv) }
}

/// # Safety
/// As execvpe(3).
#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    before_exec();
    unsafe { real::execvpe(file, argv, envp) }
}
