//! Users and groups by name and by id (the host's user database through libc's reentrant
//! calls): the configuration file names the manager's admin group, and `surge doctor` checks
//! who owns key files and devices.

use std::ffi::{CStr, CString};

/// A user of the host's user database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// Buffer size for the `get*_r` calls (glibc's own default is 1024; large groups need more).
const BUF_LEN: usize = 1 << 16;

fn user_from(pw: &libc::passwd) -> User {
    // SAFETY: a passwd filled by getpw*_r points its name into the buffer that outlives `pw`.
    let name = unsafe { CStr::from_ptr(pw.pw_name) }
        .to_string_lossy()
        .into_owned();
    User {
        name,
        uid: pw.pw_uid,
        gid: pw.pw_gid,
    }
}

/// The user called `name`, if the user database has one.
pub fn user_by_name(name: &str) -> Option<User> {
    let c = CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; BUF_LEN];
    // SAFETY: passwd is plain data; getpwnam_r writes into `pw` and `buf` (of the given
    // length) and sets `out` to &pw or null.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwnam_r(c.as_ptr(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut out);
        (rc == 0 && !out.is_null()).then(|| user_from(&pw))
    }
}

/// The user with uid `uid`, if the user database has one.
pub fn user_by_uid(uid: u32) -> Option<User> {
    let mut buf = vec![0 as libc::c_char; BUF_LEN];
    // SAFETY: as in user_by_name.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut out: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out);
        (rc == 0 && !out.is_null()).then(|| user_from(&pw))
    }
}

/// The gid of the group called `name`, if the group database has one.
pub fn group_by_name(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; BUF_LEN];
    // SAFETY: group is plain data; getgrnam_r writes into `gr` and `buf` (of the given
    // length) and sets `out` to &gr or null.
    unsafe {
        let mut gr: libc::group = std::mem::zeroed();
        let mut out: *mut libc::group = std::ptr::null_mut();
        let rc = libc::getgrnam_r(c.as_ptr(), &mut gr, buf.as_mut_ptr(), buf.len(), &mut out);
        (rc == 0 && !out.is_null()).then_some(gr.gr_gid)
    }
}

/// The name of the group with gid `gid`, if the group database has one.
pub fn group_name(gid: u32) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; BUF_LEN];
    // SAFETY: as in group_by_name.
    unsafe {
        let mut gr: libc::group = std::mem::zeroed();
        let mut out: *mut libc::group = std::ptr::null_mut();
        let rc = libc::getgrgid_r(gid, &mut gr, buf.as_mut_ptr(), buf.len(), &mut out);
        if rc != 0 || out.is_null() {
            return None;
        }
        Some(CStr::from_ptr(gr.gr_name).to_string_lossy().into_owned())
    }
}

/// `uid` as "name (uid N)", or "uid N" when the user database does not know it.
pub fn describe_uid(uid: u32) -> String {
    match user_by_uid(uid) {
        Some(u) => format!("{} (uid {uid})", u.name),
        None => format!("uid {uid}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_found_by_name_and_by_uid() {
        let root = user_by_name("root").expect("root is in every user database");
        assert_eq!((root.uid, root.gid), (0, 0));
        assert_eq!(user_by_uid(0).map(|u| u.name).as_deref(), Some("root"));
        assert_eq!(group_by_name("root"), Some(0));
        assert_eq!(group_name(0).as_deref(), Some("root"));
        assert_eq!(user_by_name("no-such-user-surge-test"), None);
        assert_eq!(group_by_name("no-such-group-surge-test"), None);
        assert_eq!(describe_uid(0), "root (uid 0)");
    }
}
