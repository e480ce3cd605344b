//! Moving SDUs between ring memory and applications' sockets: one
//! `recvmsg` or `sendmsg` straight from or into the ring's slots.

use super::*;

/// Takes the peeked buffer of `n` bytes out of the receive ring into `q`,
/// without its channel header; `None` if it could not be read (it is
/// gone from the ring either way).
pub(super) fn hold_copy<'q>(
    link: &mut Link,
    n: usize,
    q: &'q mut HeldQueue<Vec<u8>>,
) -> Option<&'q HeldQueue<Vec<u8>>> {
    let mut v = vec![0u8; n];
    let ok = link.read_peeked(n, &mut v);
    link.consume(n);
    if !ok {
        return None;
    }
    v.drain(..CHANNEL_HEADER);
    q.push_back(v);
    Some(q)
}

/// The iovecs of `seg` (at most two).
pub(super) fn iovecs(seg: &Segments) -> ([libc::iovec; 2], usize) {
    let mut v = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 2];
    let mut k = 0;
    for (ptr, n) in seg.parts() {
        v[k] = libc::iovec {
            iov_base: ptr.cast(),
            iov_len: n,
        };
        k += 1;
    }
    (v, k)
}

/// Receives one packet from `fd` into ring memory `seg` without blocking.
/// As [`sys::recv`]: the real length of the packet (`MSG_TRUNC`).
pub(super) fn recv_into(fd: RawFd, seg: &Segments) -> io::Result<Recv> {
    let (mut iov, k) = iovecs(seg);
    // SAFETY: an all-zero msghdr is valid; the iovecs point into the ring's
    // data area (inside the mapping, see `Segments`), which the kernel
    // writes; no Rust reference to that memory exists.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = k as _;
    // SAFETY: a valid msghdr whose buffers outlive the call.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT | libc::MSG_TRUNC) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) => Ok(Recv::WouldBlock),
            Some(libc::ECONNRESET) => Ok(Recv::Closed),
            _ => Err(e),
        };
    }
    if n == 0 {
        return Ok(if sys::peer_hung_up(fd) {
            Recv::Closed
        } else {
            Recv::Empty
        });
    }
    Ok(Recv::Packet(n as usize))
}

/// The length of the SDU a non-blocking read of flow `port` got (an empty
/// packet is 0, refused later like any bad SDU), or how serving the flow
/// ends: nothing more to read, or the flow is closed.
pub(super) fn sdu_len(r: io::Result<Recv>, port: PortId) -> Result<usize, FlowService> {
    match r {
        Ok(Recv::Packet(n)) => Ok(n),
        Ok(Recv::Empty) => Ok(0),
        Ok(Recv::WouldBlock) => Err(FlowService::Drained),
        Ok(Recv::Closed) => Err(FlowService::Closed),
        Err(e) => {
            debug!(port, error = %e, "flow read error");
            Err(FlowService::Closed)
        }
    }
}

/// Sends ring memory `seg` as one packet on `fd` without blocking.
pub(super) fn send_from(fd: RawFd, seg: &Segments) -> io::Result<Sent> {
    let (mut iov, k) = iovecs(seg);
    // SAFETY: as in `recv_into`; the kernel only reads the ring memory.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = k as _;
    // SAFETY: a valid msghdr whose buffers outlive the call.
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN) => Ok(Sent::WouldBlock),
            Some(libc::EMSGSIZE) => Ok(Sent::TooBig),
            Some(libc::EPIPE) | Some(libc::ECONNRESET) => Ok(Sent::Closed),
            _ => Err(e),
        };
    }
    Ok(Sent::Done)
}
