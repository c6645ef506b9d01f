//! The C library's own functions, found with `dlsym(RTLD_NEXT)` at their first use: what every
//! hook falls back to, and what the library itself calls (never the hooks: a call to `libc::`
//! from this library would land in its own exported symbol).

use libc::{c_char, c_int, c_uint, c_void, iovec, mode_t, off64_t, size_t, ssize_t};
use std::sync::atomic::{AtomicUsize, Ordering};

/// What a function that could not be found returns (with errno ENOSYS).
pub trait Failed {
    fn failed() -> Self;
}
impl Failed for c_int {
    fn failed() -> Self {
        -1
    }
}
impl Failed for ssize_t {
    fn failed() -> Self {
        -1
    }
}
impl Failed for *mut c_void {
    fn failed() -> Self {
        libc::MAP_FAILED
    }
}

/// The address of the next definition of `name` (NUL-terminated), looked up once.
fn next(cache: &AtomicUsize, name: &[u8]) -> usize {
    let p = cache.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    // SAFETY: `name` is NUL-terminated; dlsym has no other precondition.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) } as usize;
    cache.store(p, Ordering::Relaxed);
    p
}

fn enosys() {
    // SAFETY: errno of this thread.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
}

macro_rules! real {
    ($($name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty;)*) => {$(
        /// The C library's function of this name.
        ///
        /// # Safety
        /// As the C function's.
        pub unsafe fn $name($($arg: $ty),*) -> $ret {
            static CACHE: AtomicUsize = AtomicUsize::new(0);
            let p = next(&CACHE, concat!(stringify!($name), "\0").as_bytes());
            if p == 0 {
                enosys();
                return <$ret as Failed>::failed();
            }
            // SAFETY: `p` is the C library's function of this name and type.
            let f: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(p) };
            unsafe { f($($arg),*) }
        }
    )*};
}

/// Variadic functions (`open` and friends, `fcntl`): called with their one optional argument.
macro_rules! real_variadic {
    ($($name:ident ( $($arg:ident : $ty:ty),* ; $opt:ident : $oty:ty ) -> $ret:ty;)*) => {$(
        /// The C library's function of this name, with its optional argument.
        ///
        /// # Safety
        /// As the C function's.
        pub unsafe fn $name($($arg: $ty,)* $opt: $oty) -> $ret {
            static CACHE: AtomicUsize = AtomicUsize::new(0);
            let p = next(&CACHE, concat!(stringify!($name), "\0").as_bytes());
            if p == 0 {
                enosys();
                return <$ret as Failed>::failed();
            }
            // SAFETY: `p` is the C library's variadic function of this name.
            let f: unsafe extern "C" fn($($ty,)* ...) -> $ret = unsafe { std::mem::transmute(p) };
            unsafe { f($($arg,)* $opt) }
        }
    )*};
}

real_variadic! {
    open(path: *const c_char, flags: c_int; mode: c_uint) -> c_int;
    open64(path: *const c_char, flags: c_int; mode: c_uint) -> c_int;
    openat(dirfd: c_int, path: *const c_char, flags: c_int; mode: c_uint) -> c_int;
    openat64(dirfd: c_int, path: *const c_char, flags: c_int; mode: c_uint) -> c_int;
    fcntl(fd: c_int, cmd: c_int; arg: usize) -> c_int;
    fcntl64(fd: c_int, cmd: c_int; arg: usize) -> c_int;
}

real! {
    creat(path: *const c_char, mode: mode_t) -> c_int;
    creat64(path: *const c_char, mode: mode_t) -> c_int;
    __open_2(path: *const c_char, flags: c_int) -> c_int;
    __open64_2(path: *const c_char, flags: c_int) -> c_int;
    __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
    __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int;
    close(fd: c_int) -> c_int;
    fclose(f: *mut libc::FILE) -> c_int;
    close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int;
    closefrom(low: c_int) -> ();
    dup(old: c_int) -> c_int;
    dup2(old: c_int, new: c_int) -> c_int;
    dup3(old: c_int, new: c_int, flags: c_int) -> c_int;
    read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t;
    pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t;
    pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off64_t) -> ssize_t;
    readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t;
    writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t;
    preadv64(fd: c_int, iov: *const iovec, n: c_int, off: off64_t) -> ssize_t;
    pwritev64(fd: c_int, iov: *const iovec, n: c_int, off: off64_t) -> ssize_t;
    preadv64v2(fd: c_int, iov: *const iovec, n: c_int, off: off64_t, flags: c_int) -> ssize_t;
    pwritev64v2(fd: c_int, iov: *const iovec, n: c_int, off: off64_t, flags: c_int) -> ssize_t;
    lseek64(fd: c_int, off: off64_t, whence: c_int) -> off64_t;
    fsync(fd: c_int) -> c_int;
    fdatasync(fd: c_int) -> c_int;
    fstat64(fd: c_int, st: *mut libc::stat64) -> c_int;
    fstatat64(dirfd: c_int, path: *const c_char, st: *mut libc::stat64, flags: c_int) -> c_int;
    __fxstat64(ver: c_int, fd: c_int, st: *mut libc::stat64) -> c_int;
    __fxstatat64(ver: c_int, dirfd: c_int, path: *const c_char, st: *mut libc::stat64, flags: c_int) -> c_int;
    statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: c_uint, st: *mut libc::statx) -> c_int;
    stat64(path: *const c_char, st: *mut libc::stat64) -> c_int;
    lstat64(path: *const c_char, st: *mut libc::stat64) -> c_int;
    __xstat64(ver: c_int, path: *const c_char, st: *mut libc::stat64) -> c_int;
    __lxstat64(ver: c_int, path: *const c_char, st: *mut libc::stat64) -> c_int;
    mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off64_t) -> *mut c_void;
    ftruncate64(fd: c_int, len: off64_t) -> c_int;
    futimens(fd: c_int, times: *const libc::timespec) -> c_int;
    fallocate64(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int;
    posix_fallocate64(fd: c_int, off: off64_t, len: off64_t) -> c_int;
    copy_file_range(fd_in: c_int, off_in: *mut off64_t, fd_out: c_int, off_out: *mut off64_t, len: size_t, flags: c_uint) -> ssize_t;
    sendfile64(out: c_int, fd_in: c_int, off: *mut off64_t, n: size_t) -> ssize_t;
    execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    execv(path: *const c_char, argv: *const *const c_char) -> c_int;
    execvp(file: *const c_char, argv: *const *const c_char) -> c_int;
    execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
}

impl Failed for () {
    fn failed() -> Self {}
}

impl Failed for off64_t {
    fn failed() -> Self {
        -1
    }
}
