//! Failed operations, seen (issue 33 item 6): every operation the mount answers with an error
//! is logged once, with the operation's name and the errno, and counted per operation and
//! errno for the mount's `--stats-file` (Mountpoint-s3's `fuse_error!` is the model).
//!
//! What a program meets in normal work (a lookup of a name that is not there, `EEXIST` from
//! `O_EXCL`, `ENODATA` from `getxattr`, a permission refused) is logged at debug level: a
//! compiler's search path makes thousands of those a second. What an admin must hear of (an
//! I/O error, a server that cannot be reached, a stale handle, the tier full) is logged at
//! warn, and counted like the others.

use super::FsError;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use tracing::{debug, warn};

/// Failed operations of one mount, per operation and errno.
#[derive(Default)]
pub struct Failures {
    counts: Mutex<BTreeMap<(&'static str, i32), u64>>,
}

impl Failures {
    /// Notes that `op` (a FUSE operation's name, e.g. `"lookup"`) failed with `e`, logs it
    /// and returns its errno.
    pub fn note(&self, op: &'static str, e: &FsError) -> i32 {
        *self.counts.lock().entry((op, e.errno)).or_insert(0) += 1;
        if expected(e.errno) {
            debug!(op, errno = errno_name(e.errno), "{op}: {e}");
        } else {
            warn!(op, errno = errno_name(e.errno), "{op} failed: {e}");
        }
        e.errno
    }

    /// The failures so far: `{"lookup": {"ENOENT": 3}, ...}`.
    pub fn snapshot(&self) -> BTreeMap<&'static str, BTreeMap<String, u64>> {
        let mut out: BTreeMap<&'static str, BTreeMap<String, u64>> = BTreeMap::new();
        for (&(op, errno), &n) in self.counts.lock().iter() {
            out.entry(op).or_default().insert(errno_name(errno), n);
        }
        out
    }

    /// Failures of `op` with `errno` so far.
    pub fn get(&self, op: &str, errno: i32) -> u64 {
        self.counts
            .lock()
            .iter()
            .filter(|((o, e), _)| *o == op && *e == errno)
            .map(|(_, n)| *n)
            .sum()
    }
}

/// Errnos a program meets in normal work, which say nothing of the mount's health.
fn expected(errno: i32) -> bool {
    matches!(
        errno,
        libc::ENOENT
            | libc::EEXIST
            | libc::ENODATA
            | libc::ENOTEMPTY
            | libc::ERANGE
            | libc::EAGAIN
            | libc::EINTR
            | libc::ENOTDIR
            | libc::EISDIR
            | libc::EACCES
            | libc::EPERM
            | libc::ENAMETOOLONG
            | libc::EINVAL
            | libc::EOPNOTSUPP
            | libc::ENOSYS
            | libc::EXDEV
            | libc::ELOOP
            | libc::EMLINK
            | libc::EFBIG
            | libc::EROFS
            | libc::ENOTTY
            | libc::EDEADLK
            | libc::E2BIG
            | libc::ETXTBSY
            | libc::EBADF
    )
}

/// The symbolic name of `errno` (`"ENOENT"`), or `"errno N"` for one not listed.
pub fn errno_name(errno: i32) -> String {
    const NAMES: &[(i32, &str)] = &[
        (libc::EPERM, "EPERM"),
        (libc::ENOENT, "ENOENT"),
        (libc::EINTR, "EINTR"),
        (libc::EIO, "EIO"),
        (libc::ENXIO, "ENXIO"),
        (libc::E2BIG, "E2BIG"),
        (libc::EBADF, "EBADF"),
        (libc::EAGAIN, "EAGAIN"),
        (libc::ENOMEM, "ENOMEM"),
        (libc::EACCES, "EACCES"),
        (libc::EBUSY, "EBUSY"),
        (libc::EEXIST, "EEXIST"),
        (libc::EXDEV, "EXDEV"),
        (libc::ENOTDIR, "ENOTDIR"),
        (libc::EISDIR, "EISDIR"),
        (libc::EINVAL, "EINVAL"),
        (libc::ENFILE, "ENFILE"),
        (libc::EMFILE, "EMFILE"),
        (libc::ENOTTY, "ENOTTY"),
        (libc::ETXTBSY, "ETXTBSY"),
        (libc::EFBIG, "EFBIG"),
        (libc::ENOSPC, "ENOSPC"),
        (libc::ESPIPE, "ESPIPE"),
        (libc::EROFS, "EROFS"),
        (libc::EMLINK, "EMLINK"),
        (libc::ERANGE, "ERANGE"),
        (libc::EDEADLK, "EDEADLK"),
        (libc::ENAMETOOLONG, "ENAMETOOLONG"),
        (libc::ENOLCK, "ENOLCK"),
        (libc::ENOSYS, "ENOSYS"),
        (libc::ENOTEMPTY, "ENOTEMPTY"),
        (libc::ELOOP, "ELOOP"),
        (libc::ENODATA, "ENODATA"),
        (libc::EPROTO, "EPROTO"),
        (libc::EOVERFLOW, "EOVERFLOW"),
        (libc::EOPNOTSUPP, "EOPNOTSUPP"),
        (libc::ECONNREFUSED, "ECONNREFUSED"),
        (libc::ECONNRESET, "ECONNRESET"),
        (libc::ENOTCONN, "ENOTCONN"),
        (libc::ETIMEDOUT, "ETIMEDOUT"),
        (libc::EHOSTUNREACH, "EHOSTUNREACH"),
        (libc::ESTALE, "ESTALE"),
        (libc::EDQUOT, "EDQUOT"),
        (libc::ECANCELED, "ECANCELED"),
    ];
    NAMES
        .iter()
        .find(|(n, _)| *n == errno)
        .map_or_else(|| format!("errno {errno}"), |(_, s)| (*s).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_counted_per_operation_and_errno() {
        let f = Failures::default();
        assert_eq!(
            f.note("lookup", &FsError::new(libc::ENOENT, "x")),
            libc::ENOENT
        );
        f.note("lookup", &FsError::new(libc::ENOENT, "y"));
        f.note("write", &FsError::new(libc::EIO, "server gone"));
        assert_eq!(f.get("lookup", libc::ENOENT), 2);
        assert_eq!(f.get("write", libc::EIO), 1);
        assert_eq!(f.get("write", libc::ENOENT), 0);
        let s = f.snapshot();
        assert_eq!(s["lookup"]["ENOENT"], 2);
        assert_eq!(s["write"]["EIO"], 1);
        assert_eq!(errno_name(4095), "errno 4095");
    }

    #[test]
    fn health_errors_are_not_the_expected_ones() {
        for e in [
            libc::EIO,
            libc::ESTALE,
            libc::ENOSPC,
            libc::ENOTCONN,
            libc::ETIMEDOUT,
        ] {
            assert!(!expected(e), "{}", errno_name(e));
        }
        assert!(expected(libc::ENOENT));
    }
}
