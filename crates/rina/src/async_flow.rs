//! A flow served by the tokio runtime (feature `tokio`).

use crate::error::{Error, ErrorKind, Result};
use crate::flow::{self, Flow};
use crate::sock;
use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::socket::MsgFlags;
use rina_wire::ctl::FlowInfo;
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::Duration;
use tokio::io::unix::AsyncFd;

/// A non-blocking [`Flow`] for async code; made by [`Flow::into_async`].
///
/// Like [`Flow`], one SDU per [`AsyncFlow::write`] and per
/// [`AsyncFlow::read`], and the methods take `&self`. A flow with rings
/// stays one: the runtime waits on its socket for the daemon's doorbells,
/// and on the room doorbell (a pipe) while its send ring is full.
#[derive(Debug)]
pub struct AsyncFlow {
    inner: Inner,
    info: FlowInfo,
}

#[derive(Debug)]
enum Inner {
    /// The socket carries the SDUs.
    Socket(AsyncFd<OwnedFd>),
    /// Rings carry them; `room` (dropped first) is readable when the
    /// daemon freed room a writer asked for or the flow closed, and the
    /// flow's own descriptor when an SDU came or the flow closed.
    Rings(Box<RingsFlow>),
}

/// [`Inner::Rings`]' descriptors (boxed: a flow is larger than a socket).
#[derive(Debug)]
struct RingsFlow {
    room: AsyncFd<OwnedFd>,
    flow: AsyncFd<Flow>,
}

/// Why [`Flow::into_async`] failed, with the flow, unchanged and still
/// usable as a blocking flow.
///
/// Converts into [`Error`], so `?` works in functions returning
/// [`crate::Result`] (the flow is then closed).
#[derive(Debug)]
pub struct IntoAsyncError(Box<(Error, Flow)>);

impl IntoAsyncError {
    /// What went wrong.
    pub fn error(&self) -> &Error {
        &self.0 .0
    }

    /// The flow, back in blocking mode.
    pub fn into_flow(self) -> Flow {
        self.0 .1
    }

    /// The error and the flow.
    pub fn into_parts(self) -> (Error, Flow) {
        *self.0
    }
}

impl fmt::Display for IntoAsyncError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error().fmt(f)
    }
}

impl std::error::Error for IntoAsyncError {}

impl From<IntoAsyncError> for Error {
    fn from(e: IntoAsyncError) -> Error {
        e.0 .0
    }
}

impl AsyncFlow {
    /// Everything that can fail is checked or undone before the flow is
    /// given up, so an error hands it back as it was.
    pub(crate) fn new(flow: Flow) -> std::result::Result<AsyncFlow, IntoAsyncError> {
        let fail = |error, flow| Err(IntoAsyncError(Box::new((error, flow))));
        if tokio::runtime::Handle::try_current().is_err() {
            return fail(
                Error::new(
                    ErrorKind::InvalidRequest,
                    "Flow::into_async must be called from within a tokio runtime",
                ),
                flow,
            );
        }
        if let Some(r) = flow.rings() {
            let room = match r.writable_fd(flow.as_fd()) {
                Ok(fd) => fd,
                Err(e) => return fail(flow::rings_error(flow.info(), e), flow),
            };
            let info = flow.info().clone();
            // SAFETY: `room` is an open descriptor the AsyncFd owns from now on.
            let room = match unsafe { AsyncFd::register(room) } {
                Ok(fd) => fd,
                Err(e) => return fail(register_error(e.into_parts().1), flow),
            };
            // SAFETY: the flow's descriptor (its epoll descriptor) lives as
            // long as the flow, which the AsyncFd owns from now on.
            return match unsafe { AsyncFd::register(flow) } {
                Ok(flow) => Ok(AsyncFlow {
                    inner: Inner::Rings(Box::new(RingsFlow { room, flow })),
                    info,
                }),
                Err(e) => {
                    let (flow, cause) = e.into_parts();
                    fail(register_error(cause), flow)
                }
            };
        }
        let old = match fcntl(flow.as_raw_fd(), FcntlArg::F_GETFL) {
            Ok(f) => OFlag::from_bits_truncate(f),
            Err(e) => {
                return fail(
                    Error::sys("cannot read the flow's descriptor flags", e),
                    flow,
                )
            }
        };
        if let Err(e) = fcntl(flow.as_raw_fd(), FcntlArg::F_SETFL(old | OFlag::O_NONBLOCK)) {
            return fail(Error::sys("cannot make the flow non-blocking", e), flow);
        }
        let (fd, info) = flow.into_parts();
        // SAFETY: `fd` is an open descriptor that the AsyncFd owns from now on;
        // OwnedFd::as_raw_fd always returns that same descriptor.
        match unsafe { AsyncFd::register(fd) } {
            Ok(fd) => Ok(AsyncFlow {
                inner: Inner::Socket(fd),
                info,
            }),
            Err(e) => {
                let (fd, cause) = e.into_parts();
                // Back to the flags it had; if even that fails, the flow is
                // still correct, only non-blocking.
                let _ = fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(old));
                fail(register_error(cause), Flow::from_parts(fd, info))
            }
        }
    }

    /// What the daemon said about the flow.
    pub fn info(&self) -> &FlowInfo {
        &self.info
    }

    /// Largest SDU the flow carries, in bytes.
    pub fn max_sdu(&self) -> usize {
        self.info.max_sdu as usize
    }

    /// Whether SDUs go through shared-memory rings (see [`Flow::has_rings`]).
    pub fn has_rings(&self) -> bool {
        matches!(self.inner, Inner::Rings(_))
    }

    /// Receives one SDU; the same errors as [`Flow::read`].
    pub async fn read(&self, buf: &mut [u8]) -> Result<usize> {
        let fd = match &self.inner {
            Inner::Socket(fd) => fd,
            Inner::Rings(r) => loop {
                let flow = &r.flow;
                if let Some(n) = flow.get_ref().try_read(buf)? {
                    return Ok(n);
                }
                // Empty, and the doorbell asked for: wait for it (a
                // doorbell rung since the runtime last looked wakes at once).
                flow.readable().await?.clear_ready();
            },
        };
        loop {
            let mut guard = fd.readable().await?;
            let r = guard.try_io(|fd| {
                sock::recv_sdu(fd.get_ref().as_fd(), buf, MsgFlags::MSG_DONTWAIT)
                    .map_err(io::Error::from)
            });
            match r {
                Ok(Ok(n)) => return flow::read_result(&self.info, buf.len(), n),
                Ok(Err(e)) => {
                    let errno = Errno::from_raw(e.raw_os_error().unwrap_or(0));
                    return Err(Error::sys(
                        &format!("cannot read from flow {}", self.info.port),
                        errno,
                    ));
                }
                Err(_would_block) => continue,
            }
        }
    }

    /// Sends one SDU, waiting while the socket buffer (or the send ring) is
    /// full; the same errors as [`Flow::write`].
    pub async fn write(&self, sdu: &[u8]) -> Result<()> {
        flow::check_sdu(&self.info, sdu)?;
        let fd = match &self.inner {
            Inner::Socket(fd) => fd,
            Inner::Rings(r) => loop {
                let (room, flow) = (&r.room, &r.flow);
                if flow.get_ref().write_timeout(sdu, Duration::ZERO)? {
                    return Ok(());
                }
                // Full, and the doorbell asked for: wait for it.
                room.readable().await?.clear_ready();
            },
        };
        loop {
            let mut guard = fd.writable().await?;
            let r = guard.try_io(|fd| {
                sock::send_sdu(fd.get_ref().as_fd(), sdu, MsgFlags::MSG_DONTWAIT)
                    .map_err(io::Error::from)
            });
            match r {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => {
                    let errno = Errno::from_raw(e.raw_os_error().unwrap_or(0));
                    return Err(flow::write_error(&self.info, sdu.len(), errno));
                }
                Err(_would_block) => continue,
            }
        }
    }

    fn fd(&self) -> BorrowedFd<'_> {
        match &self.inner {
            Inner::Socket(fd) => fd.get_ref().as_fd(),
            Inner::Rings(r) => r.flow.get_ref().as_fd(),
        }
    }
}

fn register_error(cause: io::Error) -> Error {
    let errno = Errno::from_raw(cause.raw_os_error().unwrap_or(0));
    Error::sys("cannot register the flow with the tokio runtime", errno)
}

impl AsFd for AsyncFlow {
    /// What the runtime polls for reading (see [`Flow`]'s [`AsFd`]).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd()
    }
}

impl AsRawFd for AsyncFlow {
    fn as_raw_fd(&self) -> RawFd {
        self.fd().as_raw_fd()
    }
}
