//! A flow: a connected `SOCK_SEQPACKET` descriptor carrying one SDU per
//! packet, or two shared-memory rings beside it (see
//! [`Client::set_rings`](crate::Client::set_rings)).

use crate::error::{Error, ErrorKind, Result};
use crate::rings::{Rings, RingsError};
use crate::sock;
use nix::sys::socket::MsgFlags;
use rina_wire::ctl::FlowInfo;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use rina_core::shim_hv::ring::Segments;

/// An allocated flow.
///
/// Each [`Flow::write`] sends one SDU, each [`Flow::read`] returns one SDU.
/// The methods take `&self`, so one thread may read while another writes
/// (share the flow through an `Arc`). Dropping the flow (or
/// [`Flow::deallocate`]) closes the descriptor; the daemon sees end-of-file
/// and frees the flow.
///
/// For an event loop, [`AsFd`] gives the flow's socket to poll for
/// reading: it turns readable when an SDU may be waiting or the flow
/// closed, and [`Flow::try_read`] then takes the SDU without blocking
/// (`None`: nothing after all; poll again). On a flow with rings the
/// socket carries only doorbells, so read it only through the flow, and
/// its turning writable says nothing about room in the send ring: wait for
/// room with [`Flow::write_timeout`] or [`AsyncFlow`](crate::AsyncFlow).
#[derive(Debug)]
pub struct Flow {
    // Dropped first: the rings unmap before the socket closes.
    rings: Option<Rings>,
    fd: OwnedFd,
    info: FlowInfo,
    /// A direct flow's tie to the daemon: closing it deallocates the flow.
    lifeline: Option<OwnedFd>,
    /// How long a read polls before it sleeps, in nanoseconds (0: it
    /// sleeps at once); see [`Flow::set_busy_poll`].
    busy_poll_ns: AtomicU64,
}

impl Flow {
    /// Wraps a flow descriptor received from the daemon and its description.
    pub fn from_parts(fd: OwnedFd, info: FlowInfo) -> Flow {
        Flow {
            rings: None,
            fd,
            info,
            lifeline: None,
            busy_poll_ns: AtomicU64::new(0),
        }
    }

    pub(crate) fn with_rings(fd: OwnedFd, info: FlowInfo, rings: Option<Rings>) -> Flow {
        Flow {
            rings,
            fd,
            info,
            lifeline: None,
            busy_poll_ns: AtomicU64::new(0),
        }
    }

    /// A direct flow: `fd` is the UDP socket connected to the other
    /// application's, `lifeline` the descriptor whose closing deallocates
    /// the flow (see [`Client::set_direct`](crate::Client::set_direct)).
    pub(crate) fn with_lifeline(fd: OwnedFd, info: FlowInfo, lifeline: OwnedFd) -> Flow {
        Flow {
            rings: None,
            fd,
            info,
            lifeline: Some(lifeline),
            busy_poll_ns: AtomicU64::new(0),
        }
    }

    /// Whether SDUs go straight between the two applications' UDP sockets
    /// (see [`Client::set_direct`](crate::Client::set_direct)).
    pub fn is_direct(&self) -> bool {
        self.info.direct
    }

    /// The flow's rings, for its async form.
    #[cfg(feature = "tokio")]
    pub(crate) fn rings(&self) -> Option<&Rings> {
        self.rings.as_ref()
    }

    /// Whether SDUs go through shared-memory rings rather than the socket
    /// (see [`Client::set_rings`](crate::Client::set_rings)).
    pub fn has_rings(&self) -> bool {
        self.rings.is_some()
    }

    /// What the daemon said about the flow: port, DIF, names, QoS, largest SDU.
    pub fn info(&self) -> &FlowInfo {
        &self.info
    }

    /// Largest SDU the flow carries, in bytes.
    pub fn max_sdu(&self) -> usize {
        self.info.max_sdu as usize
    }

    /// Sends one SDU. Blocks while the flow's socket buffer is full
    /// (backpressure).
    ///
    /// Fails with [`ErrorKind::SduTooLarge`] if `sdu` is longer than the flow's
    /// maximum, [`ErrorKind::InvalidRequest`] if it is empty (an empty packet
    /// would read as "flow closed") and [`ErrorKind::DaemonGone`] if the flow
    /// was closed.
    pub fn write(&self, sdu: &[u8]) -> Result<()> {
        check_sdu(&self.info, sdu)?;
        if let Some(r) = &self.rings {
            return r
                .write(self.fd.as_fd(), sdu)
                .map_err(|e| rings_error(&self.info, e));
        }
        sock::send_sdu(self.fd.as_fd(), sdu, MsgFlags::empty())
            .map_err(|e| write_error(&self.info, sdu.len(), e))
    }

    /// Like [`Flow::write`], but waits at most `timeout` for room; `false`
    /// if there was none by then (the SDU was not sent). A zero timeout
    /// never waits.
    pub fn write_timeout(&self, sdu: &[u8], timeout: Duration) -> Result<bool> {
        check_sdu(&self.info, sdu)?;
        let deadline = std::time::Instant::now().checked_add(timeout);
        if let Some(r) = &self.rings {
            // A deadline too far away to represent is none: wait for room.
            return r
                .write_until(self.fd.as_fd(), sdu, deadline)
                .map_err(|e| rings_error(&self.info, e));
        }
        let Some(deadline) = deadline else {
            return self.write(sdu).map(|()| true);
        };
        sock::send_until(self.fd.as_fd(), sdu, Some(deadline))
            .map_err(|e| write_error(&self.info, sdu.len(), e))
    }

    /// Receives one SDU into `buf`; returns its length.
    ///
    /// Fails with [`ErrorKind::DaemonGone`] once the flow is closed (by the
    /// daemon, or by the peer through it), and with [`ErrorKind::SduTooLarge`]
    /// if the SDU did not fit in `buf` (its first `buf.len()` bytes are in
    /// `buf`, the rest is lost). A buffer of [`Flow::max_sdu`] bytes always fits.
    pub fn read(&self, buf: &mut [u8]) -> Result<usize> {
        if let Some(n) = self.poll_for(buf, None)? {
            return Ok(n);
        }
        if let Some(r) = &self.rings {
            return match r.read(self.fd.as_fd(), buf, None) {
                Ok(Some(n)) => Ok(n),
                Ok(None) => Err(Error::new(
                    ErrorKind::Internal,
                    "a read without deadline timed out",
                )),
                Err(e) => Err(rings_error(&self.info, e)),
            };
        }
        let n = sock::recv_sdu(self.fd.as_fd(), buf, MsgFlags::empty())
            .map_err(|e| Error::sys(&format!("cannot read from flow {}", self.info.port), e))?;
        read_result(&self.info, buf.len(), n)
    }

    /// Like [`Flow::read`], but waits at most `timeout`; `None` if no SDU came.
    pub fn read_timeout(&self, buf: &mut [u8], timeout: Duration) -> Result<Option<usize>> {
        let start = std::time::Instant::now();
        let deadline = start.checked_add(timeout);
        if let Some(n) = self.poll_for(buf, deadline)? {
            return Ok(Some(n));
        }
        let timeout = timeout.saturating_sub(start.elapsed());
        if let Some(r) = &self.rings {
            return r
                .read(self.fd.as_fd(), buf, deadline)
                .map_err(|e| rings_error(&self.info, e));
        }
        let ready = sock::wait_readable(self.fd.as_fd(), Some(timeout))
            .map_err(|e| Error::sys(&format!("cannot poll flow {}", self.info.port), e))?;
        if !ready {
            return Ok(None);
        }
        self.read(buf).map(Some)
    }

    /// Sends one SDU written straight into the flow's send ring, with no
    /// copy: `fill` gets room for `max` bytes and returns how many it wrote
    /// (0 sends nothing). The room is memory shared with the daemon, as at
    /// most two raw segments ([`Segments::parts`]), for a system call such
    /// as `readv` to fill or for [`Segments::write_at`]; never borrow it as
    /// a slice. `Ok(None)`, with `fill` not called, when the flow has no
    /// rings or its ring no room for `max` bytes now: send with
    /// [`Flow::write_timeout`] then, which waits for room.
    ///
    /// Fails with [`ErrorKind::SduTooLarge`] if `max` is over
    /// [`Flow::max_sdu`] and [`ErrorKind::DaemonGone`] if the flow was
    /// closed.
    pub fn write_in_place(
        &self,
        max: usize,
        fill: impl FnOnce(&Segments) -> usize,
    ) -> Result<Option<usize>> {
        if max > self.max_sdu() {
            return Err(Error::new(
                ErrorKind::SduTooLarge,
                format!(
                    "room for {max} bytes asked on flow {}, whose largest SDU is {}",
                    self.info.port,
                    self.max_sdu()
                ),
            ));
        }
        let Some(r) = &self.rings else {
            return Ok(None);
        };
        r.write_in_place(self.fd.as_fd(), max, fill)
            .map_err(|e| rings_error(&self.info, e))
    }

    /// Receives one SDU where it lies in the flow's receive ring, with no
    /// copy: `f` gets its bytes (memory shared with the daemon, as at most
    /// two raw segments, for `writev` or [`Segments::to_vec`]; never borrow
    /// it as a slice) and the SDU is released when `f` returns. Waits at
    /// most `timeout` for one; `None` if none came.
    ///
    /// Fails with [`ErrorKind::InvalidRequest`] on a flow without rings
    /// ([`Flow::has_rings`]; read it with [`Flow::read_timeout`]) and with
    /// [`ErrorKind::DaemonGone`] once the flow is closed.
    pub fn read_in_place<R>(
        &self,
        timeout: Duration,
        f: impl FnOnce(&Segments) -> R,
    ) -> Result<Option<R>> {
        let Some(r) = &self.rings else {
            return Err(Error::new(
                ErrorKind::InvalidRequest,
                format!(
                    "flow {} has no rings to read in place: read it with Flow::read",
                    self.info.port
                ),
            ));
        };
        let deadline = std::time::Instant::now().checked_add(timeout);
        r.read_in_place(self.fd.as_fd(), deadline, f)
            .map_err(|e| rings_error(&self.info, e))
    }

    /// Makes reads poll the flow for up to `window` before they sleep
    /// (`None`, the default: they sleep at once), yielding the core between
    /// polls. A reply that comes within the window costs no wake-up, and on
    /// rings the daemon rings no doorbell for it; the price is a core kept
    /// busy while the reader waits. For a client that expects an answer
    /// soon after it asks (a request-response loop); a reader that waits
    /// long between SDUs only burns the window each time.
    pub fn set_busy_poll(&self, window: Option<Duration>) {
        let ns = window.map_or(0, |w| u64::try_from(w.as_nanos()).unwrap_or(u64::MAX));
        self.busy_poll_ns.store(ns, Ordering::Relaxed);
    }

    /// Sets how many bytes written on the flow may wait in its send ring
    /// for the daemon before writers wait (whole slots, at most the ring;
    /// [`SEND_LIMIT`](rina_core::shim_hv::flow_rings::SEND_LIMIT), 1 MiB,
    /// unless set), as `SO_SNDBUF` does for a socket; returns the bytes
    /// set, `None` for a flow without rings (its socket buffer is the
    /// kernel's). A smaller buffer keeps less data queued in front of a
    /// slow flow; a larger one rides out longer stalls of the daemon.
    pub fn set_send_buffer(&self, bytes: usize) -> Option<usize> {
        self.rings.as_ref().map(|r| r.set_send_limit(bytes))
    }

    /// Polls for an SDU for the busy-poll window (at most until `deadline`);
    /// `None` if none came or the window is 0.
    fn poll_for(
        &self,
        buf: &mut [u8],
        deadline: Option<std::time::Instant>,
    ) -> Result<Option<usize>> {
        let ns = self.busy_poll_ns.load(Ordering::Relaxed);
        if ns == 0 {
            return Ok(None);
        }
        let now = std::time::Instant::now();
        let end = now
            .checked_add(Duration::from_nanos(ns))
            .map_or(deadline, |e| Some(deadline.map_or(e, |d| d.min(e))));
        loop {
            let got = match &self.rings {
                Some(r) => r
                    .take(self.fd.as_fd(), buf)
                    .map_err(|e| rings_error(&self.info, e))?,
                None => self.try_read(buf)?,
            };
            if got.is_some() {
                return Ok(got);
            }
            if end.is_some_and(|e| std::time::Instant::now() >= e) {
                return Ok(None);
            }
            std::thread::yield_now();
        }
    }

    /// Takes the next SDU into `buf` without waiting; `None` if there is
    /// none yet (the descriptor of [`AsFd`] turns readable when one comes).
    /// The same errors as [`Flow::read`].
    pub fn try_read(&self, buf: &mut [u8]) -> Result<Option<usize>> {
        if let Some(r) = &self.rings {
            return r
                .read(self.fd.as_fd(), buf, Some(std::time::Instant::now()))
                .map_err(|e| rings_error(&self.info, e));
        }
        match sock::recv_sdu(self.fd.as_fd(), buf, MsgFlags::MSG_DONTWAIT) {
            Err(nix::errno::Errno::EAGAIN) => Ok(None),
            Err(e) => Err(Error::sys(
                &format!("cannot read from flow {}", self.info.port),
                e,
            )),
            Ok(n) => read_result(&self.info, buf.len(), n).map(Some),
        }
    }

    /// Ends the flow for both directions without closing the descriptor:
    /// readers and writers blocked on it return [`ErrorKind::DaemonGone`],
    /// and the daemon deallocates the flow. Use it to stop a thread that
    /// waits on the flow.
    pub fn shutdown(&self) {
        // ENOTCONN once the other end is gone: nothing left to end.
        let _ = nix::sys::socket::shutdown(self.fd.as_raw_fd(), nix::sys::socket::Shutdown::Both);
    }

    /// Bytes written on the flow that the daemon has not taken yet: still
    /// in the flow's socket buffer (`SIOCOUTQ`, with the kernel's per-packet
    /// overhead) or in its send ring (whole slots). Zero once the daemon
    /// holds everything written; it shrinks as the flow drains, so a writer
    /// waiting for an answer queued behind its own data can tell a slow
    /// flow from a stuck one.
    pub fn unsent_bytes(&self) -> Result<usize> {
        if let Some(r) = &self.rings {
            return r.unsent_bytes().map_err(|e| rings_error(&self.info, e));
        }
        let mut n: libc::c_int = 0;
        // SAFETY: SIOCOUTQ on a socket we own writes one int through the
        // valid pointer.
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
        if rc != 0 {
            return Err(Error::sys(
                &format!("cannot query flow {}", self.info.port),
                nix::errno::Errno::last(),
            ));
        }
        Ok(n.max(0) as usize)
    }

    /// Closes the flow. The same as dropping it; spelled out for readability.
    pub fn deallocate(self) {
        drop(self)
    }

    /// Splits the flow into its descriptor and description. A flow with
    /// rings loses them (SDUs in them are lost, and the descriptor alone
    /// carries nothing): split only flows without. A direct flow's lifeline
    /// stays open until the process exits (the flow lives until then, or
    /// until the other end closes it).
    pub fn into_parts(mut self) -> (OwnedFd, FlowInfo) {
        if let Some(l) = self.lifeline.take() {
            let _ = l.into_raw_fd();
        }
        (self.fd, self.info)
    }

    /// Turns the flow into an [`AsyncFlow`](crate::AsyncFlow) served by the
    /// current tokio runtime (sets `O_NONBLOCK`). Must be called from within
    /// a runtime; on error (no runtime, for one) the flow is handed back,
    /// unchanged, in the [`IntoAsyncError`](crate::IntoAsyncError).
    #[cfg(feature = "tokio")]
    pub fn into_async(self) -> std::result::Result<crate::AsyncFlow, crate::IntoAsyncError> {
        crate::AsyncFlow::new(self)
    }
}

/// The error of a ring operation on flow `info`.
pub(crate) fn rings_error(info: &FlowInfo, e: RingsError) -> Error {
    match e {
        RingsError::Closed => closed(info),
        RingsError::Sys(e) => Error::sys(&format!("flow {} rings", info.port), e),
        RingsError::TooLarge(n) => Error::new(
            ErrorKind::SduTooLarge,
            format!(
                "SDU of {n} bytes on flow {} did not fit the buffer; its tail was lost",
                info.port
            ),
        ),
        RingsError::Ring(e) => Error::new(
            ErrorKind::Internal,
            format!("flow {}: the daemon's ring is broken ({e})", info.port),
        ),
        RingsError::BadSetup(why) => Error::new(
            ErrorKind::Internal,
            format!("flow {}: the rings could not be set up: {why}", info.port),
        ),
    }
}

/// Checks an SDU before it is written: not empty, not larger than the flow allows.
pub(crate) fn check_sdu(info: &FlowInfo, sdu: &[u8]) -> Result<()> {
    if sdu.is_empty() {
        return Err(Error::new(
            ErrorKind::InvalidRequest,
            format!(
                "empty SDU on flow {}: an empty packet would read as end of flow",
                info.port
            ),
        ));
    }
    if sdu.len() > info.max_sdu as usize {
        return Err(Error::new(
            ErrorKind::SduTooLarge,
            format!(
                "SDU of {} bytes is larger than the {} bytes flow {} carries",
                sdu.len(),
                info.max_sdu,
                info.port
            ),
        ));
    }
    Ok(())
}

pub(crate) fn write_error(info: &FlowInfo, len: usize, e: nix::errno::Errno) -> Error {
    match e {
        nix::errno::Errno::EMSGSIZE => Error::new(
            ErrorKind::SduTooLarge,
            format!(
                "SDU of {len} bytes is larger than the socket of flow {} accepts",
                info.port
            ),
        ),
        e => {
            let err = Error::sys(&format!("cannot write to flow {}", info.port), e);
            if err.kind == ErrorKind::DaemonGone {
                closed(info)
            } else {
                err
            }
        }
    }
}

/// Interprets the result of a `recv` with `MSG_TRUNC` (`n` is the real length).
pub(crate) fn read_result(info: &FlowInfo, cap: usize, n: usize) -> Result<usize> {
    if n == 0 {
        return Err(closed(info));
    }
    if n > cap {
        return Err(Error::new(
            ErrorKind::SduTooLarge,
            format!(
                "SDU of {n} bytes on flow {} did not fit the {cap}-byte buffer; its tail was lost",
                info.port
            ),
        ));
    }
    Ok(n)
}

pub(crate) fn closed(info: &FlowInfo) -> Error {
    Error::new(
        ErrorKind::DaemonGone,
        format!(
            "flow {} to {} is closed (the daemon or the peer ended it)",
            info.port, info.remote
        ),
    )
}

impl AsFd for Flow {
    /// The flow's socket: it turns readable when an SDU may be waiting or
    /// the flow closed, with rings or without (see [`Flow`]).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Flow {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl IntoRawFd for Flow {
    /// The flow's descriptor; a direct flow's lifeline stays open until the
    /// process exits (see [`Flow::into_parts`]).
    fn into_raw_fd(self) -> RawFd {
        self.into_parts().0.into_raw_fd()
    }
}
