//! Link changes as the kernel announces them: a netlink route socket in
//! the link group (`RTMGRP_LINK`), so that a carrier lost or found again
//! on a shim-eth IPCP's interface is seen when it happens rather than at
//! the next periodic look ([`super::shim_eth`]'s `LINK_CHECK`, kept as a
//! backstop). The messages are not parsed: any of them makes every
//! interface's state due to be read now, by the same check as the
//! periodic one.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// A netlink route socket bound to the link group, non-blocking.
pub(super) struct LinkWatch {
    fd: OwnedFd,
}

impl LinkWatch {
    /// Opens the socket in the daemon's network namespace.
    pub fn open() -> io::Result<LinkWatch> {
        use nix::sys::socket::{
            self, AddressFamily, NetlinkAddr, SockFlag, SockProtocol, SockType,
        };
        let fd = socket::socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRoute,
        )?;
        socket::bind(
            fd.as_raw_fd(),
            &NetlinkAddr::new(0, libc::RTMGRP_LINK as u32),
        )?;
        Ok(LinkWatch { fd })
    }

    /// Reads every message waiting; true if there was any, or if some
    /// were lost to a full socket buffer (either way, links may have
    /// changed).
    pub fn drain(&self) -> bool {
        let mut buf = [0u8; 8192];
        let mut any = false;
        loop {
            // SAFETY: buf is writable for its length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                any = true;
                continue;
            }
            if n == 0 {
                return any;
            }
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ENOBUFS) => any = true,
                _ => return any,
            }
        }
    }

    /// The socket, to register with the poller.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Opens a [`LinkWatch`] registered with `poll` under `token`; `None`
/// (logged) if it cannot be opened, and links are then looked at
/// periodically only.
pub(super) fn open_registered(poll: &mio::Poll, token: mio::Token) -> Option<LinkWatch> {
    let w = match LinkWatch::open() {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(error = %e, "no netlink link announcements: link changes are seen within a second");
            return None;
        }
    };
    let reg = poll.registry().register(
        &mut mio::unix::SourceFd(&w.raw_fd()),
        token,
        mio::Interest::READABLE,
    );
    match reg {
        Ok(()) => Some(w),
        Err(e) => {
            tracing::warn!(error = %e, "cannot poll the netlink link announcements");
            None
        }
    }
}
