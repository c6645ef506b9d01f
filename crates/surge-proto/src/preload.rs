//! The socket between a mount and the interposition library (`crates/surge-preload`,
//! `libsurge_preload.so`): how a process that opened a file through the mount gets the file's
//! object on this host, and has the mount commit what it wrote there (docs/DATAPLANE.md,
//! "The preload path"; docs/SECURITY.md, "The preload socket").
//!
//! Each mount listens on an abstract Unix socket (`SOCK_SEQPACKET`) named after the device
//! number of its file system ([`socket_name`]), so a process finds it from an `fstat` of a
//! descriptor it holds, with no file to create, clean up or squat. Each side checks the
//! other's credentials (`SO_PEERCRED`): the mount answers only processes of its own user (or
//! of the user a root mount acts for, and root); the library talks only to a mount run by
//! itself or by root.
//!
//! Requests are [`REQUEST_LEN`] bytes: an operation byte and a little-endian `u64` inode.
//! Answers are [`ANSWER_LEN`] bytes: a little-endian `i32` (0, or an errno) and the inode.
//! - [`ADOPT`], with the process's descriptor of the file attached (`SCM_RIGHTS`; the inode
//!   field is ignored): the mount checks the descriptor is a regular file of this mount open
//!   here by passthrough, and answers with the file's object opened with the descriptor's
//!   access mode attached. The descriptor is the proof the process opened the file, with the
//!   permission checks of that open.
//! - [`SYNC`]: the process wrote the object of the inode (and flushed it, for `fsync`): the
//!   mount commits the size and mtime to the metadata server as at a close, and drops the
//!   kernel's cached attributes of the inode.

/// Adopt the attached descriptor (see the module doc).
pub const ADOPT: u8 = b'A';
/// Commit what was written to an adopted file's object (see the module doc).
pub const SYNC: u8 = b'S';

pub const REQUEST_LEN: usize = 9;
pub const ANSWER_LEN: usize = 12;

/// The abstract socket name (without its leading NUL) of the mount whose file system has device
/// number `dev` (`st_dev`).
pub fn socket_name(dev: u64) -> String {
    let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0xfff);
    let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0xff);
    format!("surge-preload/{major}:{minor}")
}

pub fn request(op: u8, ino: u64) -> [u8; REQUEST_LEN] {
    let mut m = [0u8; REQUEST_LEN];
    m[0] = op;
    m[1..].copy_from_slice(&ino.to_le_bytes());
    m
}

/// (operation, inode) of a request; `None` when it is not [`REQUEST_LEN`] bytes.
pub fn parse_request(m: &[u8]) -> Option<(u8, u64)> {
    let ino: [u8; 8] = m.get(1..REQUEST_LEN)?.try_into().ok()?;
    (m.len() == REQUEST_LEN).then(|| (m[0], u64::from_le_bytes(ino)))
}

pub fn answer(errno: i32, ino: u64) -> [u8; ANSWER_LEN] {
    let mut m = [0u8; ANSWER_LEN];
    m[..4].copy_from_slice(&errno.to_le_bytes());
    m[4..].copy_from_slice(&ino.to_le_bytes());
    m
}

/// (errno, inode) of an answer; `None` when it is not [`ANSWER_LEN`] bytes.
pub fn parse_answer(m: &[u8]) -> Option<(i32, u64)> {
    if m.len() != ANSWER_LEN {
        return None;
    }
    let errno: [u8; 4] = m[..4].try_into().ok()?;
    let ino: [u8; 8] = m[4..].try_into().ok()?;
    Some((i32::from_le_bytes(errno), u64::from_le_bytes(ino)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_names_follow_the_kernels_device_numbers() {
        // makedev(0, 52) and makedev(259, 70000).
        assert_eq!(socket_name(52), "surge-preload/0:52");
        let dev = (259u64 & 0xfff) << 8 | (70000u64 & 0xff) | ((70000u64 & !0xff) << 12);
        assert_eq!(socket_name(dev), "surge-preload/259:70000");
    }

    #[test]
    fn messages_round_trip_and_wrong_lengths_are_refused() {
        assert_eq!(parse_request(&request(SYNC, 77)), Some((SYNC, 77)));
        assert_eq!(parse_answer(&answer(-5, 9)), Some((-5, 9)));
        assert_eq!(parse_request(&[ADOPT]), None);
        assert_eq!(parse_answer(&[0; 13]), None);
    }
}
