//! Small operating-system helpers several commands share: random bytes for ids, free space of
//! a directory, blocking signals so one thread can wait for them, and the clap parser for sizes.

use std::path::Path;

/// `n` random bytes from the kernel (zeros if /dev/urandom cannot be read, which callers treat
/// as "less random", never as an error).
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    b
}

/// Reads into `buf` at `offset` of `f` until `buf` is full or the file ends (retrying
/// interrupted reads); returns the bytes read (fewer only at the end of the file).
pub fn read_full_at(f: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// [`read_full_at`] into several buffers, in order, in one `preadv(2)` as a rule: reads until
/// all are full or the file ends; returns the bytes read (fewer only at the end of the file).
pub fn read_vectored_full_at(
    f: &std::fs::File,
    mut bufs: &mut [std::io::IoSliceMut<'_>],
    offset: u64,
) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    let mut got = 0;
    while bufs.iter().any(|b| !b.is_empty()) {
        let count = bufs.len().min(libc::UIO_MAXIOV as usize) as libc::c_int;
        // SAFETY: `IoSliceMut` has the layout of `struct iovec` on Unix (std guarantees it);
        // each points at memory this function may write, and preadv writes at most their
        // total length into them.
        let n = unsafe {
            libc::preadv(
                f.as_raw_fd(),
                bufs.as_ptr().cast(),
                count,
                (offset + got as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
        got += n as usize;
        std::io::IoSliceMut::advance_slices(&mut bufs, n as usize);
    }
    Ok(got)
}

/// `lseek(2)` `SEEK_DATA` (`hole` false) or `SEEK_HOLE` in `f` from `offset`: the offset
/// found. `SEEK_DATA`: `None` when no data lies at or after `offset`. `SEEK_HOLE`: at or past
/// the end of the file, `offset` itself (everything past the end reads as a hole).
pub fn seek_data_or_hole(
    f: &std::fs::File,
    offset: u64,
    hole: bool,
) -> std::io::Result<Option<u64>> {
    use std::os::fd::AsRawFd;
    let Ok(at) = libc::off_t::try_from(offset) else {
        return Ok(if hole { Some(offset) } else { None });
    };
    let whence = if hole {
        libc::SEEK_HOLE
    } else {
        libc::SEEK_DATA
    };
    // SAFETY: lseek on a descriptor `f` owns; it only moves that descriptor's position, which
    // nothing here relies on (every read and write names its offset).
    let r = unsafe { libc::lseek(f.as_raw_fd(), at, whence) };
    if r >= 0 {
        return Ok(Some(r as u64));
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENXIO) if hole => Ok(Some(offset)),
        Some(libc::ENXIO) => Ok(None),
        _ => Err(e),
    }
}

/// Appends up to `len` bytes read from `f` at `offset` to `buf` (fewer at the end of the file);
/// returns how many. Unlike [`read_full_at`] the bytes are read into the vector's spare
/// capacity, which is never zeroed first: a reused 1 MiB buffer costs no `memset` per read.
pub fn read_full_at_append(
    f: &std::fs::File,
    buf: &mut Vec<u8>,
    len: usize,
    offset: u64,
) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    buf.reserve(len);
    let start = buf.len();
    let mut got = 0;
    while got < len {
        let spare = buf.spare_capacity_mut();
        // SAFETY: `spare` has room for at least `len - got` bytes (reserved above; `got`
        // bytes of it are already counted in the vector's length), and pread writes at most
        // that many into it through a raw pointer (no reference to uninitialised memory).
        let n = unsafe {
            libc::pread(
                f.as_raw_fd(),
                spare.as_mut_ptr().cast(),
                len - got,
                (offset + got as u64) as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
        // SAFETY: pread initialised the next `n` bytes of the spare capacity.
        unsafe { buf.set_len(start + got + n as usize) };
        got += n as usize;
    }
    Ok(got)
}

/// Bytes available to unprivileged users in the file system holding `dir`.
pub fn free_space(dir: &Path) -> std::io::Result<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: `c` is a valid NUL-terminated path and `st` a properly sized out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_bavail * st.f_frsize)
}

/// Blocks `signals` in the calling thread and every thread it starts afterwards (call it before
/// starting any), so that one thread can wait for them with `sigwait` and shut down in order.
/// Returns the set to pass to `sigwait`. Children must reset their mask before exec.
pub fn block_signals(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: plain signal-set manipulation on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in signals {
            libc::sigaddset(&mut set, *s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Waits for one of the signals in `set` (see [`block_signals`]); returns its number.
pub fn wait_signal(set: &libc::sigset_t) -> libc::c_int {
    let mut sig = 0;
    // SAFETY: `set` was initialised by block_signals; `sig` is a valid out-parameter.
    unsafe { libc::sigwait(set, &mut sig) };
    sig
}

/// Blocks SIGINT, SIGTERM and SIGHUP (call before starting any thread) and returns a flag a
/// thread sets when one of them arrives: a daemon's loops check it and stop in order.
pub fn stop_on_signals() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    let set = block_signals(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        wait_signal(&set);
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    stop
}

/// Runs `f` on a thread of its own whose file-system identity is `uid`, `gid` and `groups`
/// (`setfsuid`, `setfsgid` and `setgroups` as raw system calls: on Linux they change the
/// calling thread only, where the libc wrappers of `setgroups` would change every thread), so
/// that what `f` opens is checked against that user's rights and not this process's. For a
/// root process acting for a user; the thread ends with `f`, and the process keeps its own
/// identity. Fails (`EPERM`) when the identity cannot be taken (not root).
pub fn as_fs_user<T: Send>(
    uid: u32,
    gid: u32,
    groups: &[u32],
    f: impl FnOnce() -> std::io::Result<T> + Send,
) -> std::io::Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: raw credential system calls on this thread, with a buffer of
            // `groups.len()` gids; setfsuid/setfsgid return the previous id and take effect
            // only if allowed, which the second call of each checks.
            unsafe {
                if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::syscall(libc::SYS_setfsgid, gid);
                libc::syscall(libc::SYS_setfsuid, uid);
                let now_gid = libc::syscall(libc::SYS_setfsgid, gid);
                let now_uid = libc::syscall(libc::SYS_setfsuid, uid);
                if now_gid != gid as libc::c_long || now_uid != uid as libc::c_long {
                    return Err(std::io::Error::from_raw_os_error(libc::EPERM));
                }
            }
            f()
        })
        .join()
        .unwrap_or_else(|_| {
            Err(std::io::Error::other(
                "the thread acting for a user panicked",
            ))
        })
    })
}

/// clap value parser for sizes (`--capacity 10GiB`), with the units of [`crate::units`].
pub fn size_arg(s: &str) -> Result<u64, String> {
    crate::units::parse_size(s).map_err(|e| e.to_string())
}

/// clap value parser for durations in seconds (`--attr-ttl 10`, `--idle-timeout 0.5s`): a
/// non-negative number, with an optional `s`.
pub fn secs_arg(s: &str) -> Result<std::time::Duration, String> {
    s.trim_end_matches('s')
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0 && *v < 1e12)
        .map(std::time::Duration::from_secs_f64)
        .ok_or_else(|| format!("'{s}' is not a duration in seconds (e.g. 1s, 0.5)"))
}

/// Raises this process's soft limit of open files (`RLIMIT_NOFILE`) to its hard limit;
/// returns the soft limit in force after.
pub fn raise_nofile_limit() -> std::io::Result<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write and read the one struct on our stack.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if r.rlim_cur < r.rlim_max {
            let want = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                r.rlim_cur = r.rlim_max;
            }
        }
    }
    Ok(r.rlim_cur)
}

/// This host's name up to the first dot (what Slurm and `surge run` sessions call it); empty if
/// the kernel does not say.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for its length.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end])
        .split('.')
        .next()
        .unwrap_or("")
        .to_string()
}

/// This process's user's name (effective uid) from the user database, `uid<N>` when it has
/// none. Default directory names (`/dev/shm/surge-<name>`, `$TMPDIR/surge-<name>`) use it, not
/// `$USER`, which a caller sets at will (and `sudo -E` keeps for root).
pub fn user_name() -> String {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let mut buf = vec![0u8; 4096];
    // SAFETY: passwd is plain data; getpwuid_r writes into `pw` and `buf` (of the given
    // length) and sets `out` to &pw or null.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut out);
        if rc == 0 && !out.is_null() && !pw.pw_name.is_null() {
            if let Ok(name) = std::ffi::CStr::from_ptr(pw.pw_name).to_str() {
                if !name.is_empty() {
                    return name.to_string();
                }
            }
        }
    }
    format!("uid{uid}")
}
