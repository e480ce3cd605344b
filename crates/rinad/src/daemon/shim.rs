//! The UDP side of a shim-udp IPCP: its socket and send back-pressure.

use rina_core::shim_udp::{PortId, ShimUdp};
use std::net::SocketAddr;

/// A shim-udp IPCP's machine and socket.
pub(super) struct ShimIo {
    pub machine: ShimUdp,
    pub sock: mio::net::UdpSocket,
    pub bind: SocketAddr,
    /// Datagrams the kernel refused for reasons other than a full buffer.
    pub send_errors: u64,
    /// A datagram waiting for the socket to become writable.
    pub stalled: Option<(SocketAddr, Vec<u8>)>,
    /// Flows whose reading waits for the stall to end.
    pub parked: Vec<PortId>,
    /// Already in the ready queue.
    pub rx_queued: bool,
}
