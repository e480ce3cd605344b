//! A flow served by the tokio runtime (feature `tokio`).

use crate::error::{Error, Result};
use crate::flow::{self, Flow};
use crate::sock;
use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::socket::MsgFlags;
use rina_wire::ctl::FlowInfo;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use tokio::io::unix::AsyncFd;

/// A non-blocking [`Flow`] for async code; made by [`Flow::into_async`].
///
/// Like [`Flow`], one SDU per [`AsyncFlow::write`] and per
/// [`AsyncFlow::read`], and the methods take `&self`.
#[derive(Debug)]
pub struct AsyncFlow {
    fd: AsyncFd<OwnedFd>,
    info: FlowInfo,
}

impl AsyncFlow {
    pub(crate) fn new(flow: Flow) -> Result<AsyncFlow> {
        let (fd, info) = flow.into_parts();
        let flags = fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)
            .map_err(|e| Error::sys("cannot read the flow's descriptor flags", e))?;
        let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
        fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags))
            .map_err(|e| Error::sys("cannot make the flow non-blocking", e))?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::new(
                crate::ErrorKind::InvalidRequest,
                "Flow::into_async must be called from within a tokio runtime",
            ));
        }
        // SAFETY: `fd` is an open descriptor that the AsyncFd owns from now on;
        // OwnedFd::as_raw_fd always returns that same descriptor.
        let fd = unsafe { AsyncFd::register(fd) }.map_err(io::Error::from)?;
        Ok(AsyncFlow { fd, info })
    }

    /// What the daemon said about the flow.
    pub fn info(&self) -> &FlowInfo {
        &self.info
    }

    /// Largest SDU the flow carries, in bytes.
    pub fn max_sdu(&self) -> usize {
        self.info.max_sdu as usize
    }

    /// Receives one SDU; the same errors as [`Flow::read`].
    pub async fn read(&self, buf: &mut [u8]) -> Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
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

    /// Sends one SDU, waiting while the socket buffer is full; the same errors
    /// as [`Flow::write`].
    pub async fn write(&self, sdu: &[u8]) -> Result<()> {
        flow::check_sdu(&self.info, sdu)?;
        loop {
            let mut guard = self.fd.writable().await?;
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
}

impl AsFd for AsyncFlow {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.get_ref().as_fd()
    }
}

impl AsRawFd for AsyncFlow {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.get_ref().as_raw_fd()
    }
}
