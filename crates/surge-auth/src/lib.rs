//! Who is who in Surge (DESIGN §8, docs/SECURITY.md).
//!
//! - [`munge`]: MUNGE credentials (what Slurm uses): every client of the manager presents one,
//!   and the manager takes the caller's uid and gid from it, never from a request field.
//! - [`key`]: the cluster key, a secret shared by the manager and its servers (a file readable
//!   by the service user only), created at install.
//! - [`cert`]: the site CA and the servers' certificates for TLS on the data protocol.
//! - [`token`]: capabilities: what the manager (or anyone holding the key) grants a client of
//!   the servers (one instance, or one namespace of it, for one user, until a time), signed with
//!   the key; the servers check one on every connection.
//! - [`Caller`]: a uid with its groups, as the manager and the servers see the other side.

pub mod cert;
pub mod key;
pub mod munge;
pub mod token;

pub use key::Key;
pub use token::{Claims, Rights, Token};

/// A user as the other side of a connection is known: from a MUNGE credential or a capability.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (from the host's group database where the caller was identified).
    pub groups: Vec<u32>,
}

impl Caller {
    /// The user with `uid` and `gid` and the supplementary groups this host's group database
    /// gives them.
    pub fn of(uid: u32, gid: u32) -> Caller {
        Caller {
            uid,
            gid,
            groups: groups_of(uid, gid),
        }
    }

    /// This process's user.
    pub fn me() -> Caller {
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Caller::of(uid, gid)
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// True when the caller is `gid` or has it as a supplementary group.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// The name of `uid` in this host's user database.
pub fn user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: passwd is plain data; getpwuid_r writes into `pw` and `buf` (of the given length)
    // and sets `out` to &pw or null.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr().cast(), buf.len(), &mut out);
        if rc != 0 || out.is_null() || pw.pw_name.is_null() {
            return None;
        }
        Some(
            std::ffi::CStr::from_ptr(pw.pw_name)
                .to_string_lossy()
                .into_owned(),
        )
    }
}

/// The supplementary groups of `uid` (primary group `gid` included) from this host's group
/// database; just `gid` when the user is unknown here.
pub fn groups_of(uid: u32, gid: u32) -> Vec<u32> {
    let Some(name) = user_name(uid) else {
        return vec![gid];
    };
    let Ok(cname) = std::ffi::CString::new(name) else {
        return vec![gid];
    };
    let mut n: libc::c_int = 64;
    loop {
        let mut groups = vec![0 as libc::gid_t; n as usize];
        // SAFETY: `groups` holds `n` entries; getgrouplist writes at most that many and sets
        // `n` to how many it needs.
        let rc = unsafe { libc::getgrouplist(cname.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        if rc >= 0 {
            groups.truncate(n as usize);
            return groups;
        }
        if n <= groups.len() as libc::c_int {
            return vec![gid];
        }
    }
}

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("cluster key {path}: {message}")]
    Key { path: String, message: String },
    #[error("MUNGE: {0}")]
    Munge(String),
    #[error("capability refused: {0}")]
    Token(String),
    #[error("certificates: {0}")]
    Cert(String),
}
