//! Descriptors and credentials over Unix sockets: a message with one descriptor attached
//! (`SCM_RIGHTS`) and the peer's credentials (`SO_PEERCRED`). Used by the passthrough helper
//! (`surge_client::lend`) and the interposition library's socket (`crate::preload`).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Sends `msg` with `fd` attached (if any).
pub fn send(sock: RawFd, msg: &[u8], fd: Option<RawFd>) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: msg.as_ptr() as *mut libc::c_void,
        iov_len: msg.len(),
    };
    // SAFETY: CMSG_SPACE is arithmetic.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    // SAFETY: a zeroed msghdr is valid; the pointers set below outlive the call.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    if let Some(fd) = fd {
        mh.msg_control = cbuf.as_mut_ptr().cast();
        mh.msg_controllen = space as _;
        // SAFETY: the control buffer has room for one header and one descriptor.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&mh);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        }
    }
    // SAFETY: mh describes valid buffers.
    let n = unsafe { libc::sendmsg(sock, &mh, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives a message of at most `buf.len()` bytes and the descriptor attached, if any.
/// `Ok((0, None))` is the end of the connection.
pub fn recv(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: CMSG_SPACE is arithmetic.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    // SAFETY: as in `send`.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf.as_mut_ptr().cast();
    mh.msg_controllen = space as _;
    let n = loop {
        // SAFETY: mh describes valid buffers; descriptors received are closed on exec.
        let n = unsafe { libc::recvmsg(sock, &mut mh, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fd = None;
    // SAFETY: walking the control messages the kernel wrote into cbuf.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&mh);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let raw = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>());
                // More than one descriptor is not part of the protocol: the first is kept,
                // any other is closed with the header's space (only one fits).
                if fd.is_none() {
                    fd = Some(OwnedFd::from_raw_fd(raw));
                } else {
                    libc::close(raw);
                }
            }
            c = libc::CMSG_NXTHDR(&mh, c);
        }
    }
    if mh.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "more descriptors than one sent",
        ));
    }
    Ok((n, fd))
}

/// The credentials of the process at the other end of `fd` (as it was when it connected).
pub fn peer_cred(fd: RawFd) -> io::Result<libc::ucred> {
    // SAFETY: SO_PEERCRED fills the ucred on our stack, of the length given.
    unsafe {
        let mut c: libc::ucred = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        if libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(c)
    }
}
