//! Direct flows on shim-udp IPCPs: the two applications' own UDP sockets,
//! connected to each other, carry the SDUs; the daemons only set the flow
//! up (the core's [`rina_core::shim_udp::ShimUdp::allocate_direct`]
//! negotiates it) and end it.
//!
//! The application gets two descriptors: the UDP socket, and the flow's
//! lifeline, one end of a socket pair whose other end the daemon reads as
//! it reads any flow's socket, so that closing it deallocates the flow.
//! The daemon keeps a duplicate of the UDP socket and shuts it down when
//! the flow ends, so that the application reads end of file, as on any
//! other flow.

use super::*;
use std::net::{SocketAddr, UdpSocket};

impl Daemon {
    /// A new UDP socket for a direct flow of member `i`, on the address of
    /// its shim-udp socket with a port of the kernel's choice; `None` for
    /// other IPCP kinds, or when the socket cannot be made (the flow is
    /// then an ordinary one).
    pub(super) fn direct_socket(&self, i: usize) -> Option<UdpSocket> {
        let Some(Io::Udp(u)) = self.ipcps.get(i).map(|p| &p.io) else {
            return None;
        };
        match UdpSocket::bind(SocketAddr::new(u.bind.ip(), 0)) {
            Ok(s) => Some(s),
            Err(e) => {
                warn!(error = %e, "no socket for a direct flow; the flow goes through the daemon");
                None
            }
        }
    }

    /// `sock` connected to `peer`, or `None` (logged) if that fails.
    pub(super) fn connect_direct(sock: UdpSocket, peer: SocketAddr) -> Option<UdpSocket> {
        match sock.connect(peer) {
            Ok(()) => Some(sock),
            Err(e) => {
                warn!(%peer, error = %e, "cannot connect a direct flow's socket");
                None
            }
        }
    }

    /// Opens direct flow `info` of member `i` for connection `owner` on
    /// `sock` (connected), with `pair` as its lifeline; returns what the
    /// application gets: the socket and its end of the lifeline.
    pub(super) fn open_direct_flow(
        &mut self,
        i: usize,
        owner: usize,
        mut info: FlowInfo,
        sock: UdpSocket,
        pair: (OwnedFd, OwnedFd),
    ) -> Result<(FlowInfo, Vec<OwnedFd>), CtlError> {
        let kept = sock.try_clone().map_err(|e| {
            CtlError::new(
                ErrorKind::NoResources,
                format!("cannot keep the direct flow's socket: {e}"),
            )
        })?;
        info.direct = true;
        let (info, lifeline) = self.open_flow_with(i, owner, info, false, pair)?;
        if let Some(slot) = self.flows.get_mut(&info.port) {
            slot.direct = Some(OwnedFd::from(kept));
        }
        Ok((info, vec![OwnedFd::from(sock), lifeline]))
    }
}

/// Ends a direct flow's socket for the application too: its reads return
/// end of file, its writes fail.
pub(super) fn shut_direct(sock: &OwnedFd) {
    let _ = nix::sys::socket::shutdown(sock.as_raw_fd(), nix::sys::socket::Shutdown::Both);
}
