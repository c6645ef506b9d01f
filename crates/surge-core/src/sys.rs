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

/// clap value parser for sizes (`--capacity 10GiB`), with the units of [`crate::units`].
pub fn size_arg(s: &str) -> Result<u64, String> {
    crate::units::parse_size(s).map_err(|e| e.to_string())
}
