//! Flow bundles: many flows over one descriptor.
//!
//! A flow of its own is a descriptor in this process and one in the
//! daemon, and a process may hold only so many (where the limit cannot be
//! raised, 20,000 or fewer). A [`Bundle`] carries any number of flows
//! over one socket, each SDU in a frame that names its flow's port
//! ([`rina_wire::bundle`]): a server with tens of thousands of clients,
//! or a benchmark of idle flows, holds one descriptor for all of them.
//!
//! ```no_run
//! # fn main() -> rina::Result<()> {
//! let mut client = rina::Client::connect()?;
//! let mut bundle = client.open_bundle()?;
//! let qos = rina::QosSpec::default();
//! let (me, echo) = ("me".parse().unwrap(), "echo".parse().unwrap());
//! let flow = client.allocate_bundled(&bundle, &me, &echo, None, &qos)?;
//! bundle.write(flow.port, b"hello")?;
//! match bundle.read()? {
//!     rina::BundleEvent::Sdu { port, data } => println!("{port}: {data:?}"),
//!     rina::BundleEvent::Ended { port } => println!("{port} ended"),
//! }
//! bundle.close_flow(flow.port)?;
//! # Ok(()) }
//! ```
//!
//! The flows of a bundle share its socket both ways: an application that
//! does not read holds up all of them, and what is written on flows whose
//! windows are closed waits in the daemon, in order, while the others go
//! on, up to 1 MiB a bundle; past that the others wait for a window too.
//! Use flows of their own where that matters. In particular, a thread that
//! writes into a bundle and blocks must not be the one that would read
//! what opens the window (an application whose flows loop back into its
//! own bundle): read and write from different threads, or use
//! [`Bundle::try_write`].

use crate::error::{Error, ErrorKind, Result};
use crate::sock;
use nix::errno::Errno;
use nix::sys::socket::{self, MsgFlags};
use rina_wire::bundle::{self as frame, Kind, HEADER};
use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::Duration;

/// Largest SDU a bundle carries, in bytes (a flow's own maximum may be
/// lower): the largest a normal DIF carries.
pub const MAX_BUNDLE_SDU: usize = frame::MAX_SDU;

/// Many flows of this application over one socket to the daemon
/// ([`crate::Client::open_bundle`]). Dropping it closes every flow in it.
#[derive(Debug)]
pub struct Bundle {
    fd: OwnedFd,
    id: u32,
    buf: Vec<u8>,
}

/// What [`Bundle::read`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BundleEvent<'a> {
    /// An SDU of flow `port`.
    Sdu { port: u32, data: &'a [u8] },
    /// Flow `port` ended (its peer deallocated it): every SDU it sent came
    /// before this, and the port is no longer this application's.
    Ended { port: u32 },
}

impl Bundle {
    pub(crate) fn new(fd: OwnedFd, id: u32) -> Bundle {
        Bundle {
            fd,
            id,
            // One byte more than any frame: a longer one is seen as such.
            buf: vec![0; HEADER + MAX_BUNDLE_SDU + 1],
        }
    }

    /// The bundle's number, as the daemon knows it.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Sends one SDU on flow `port` of the bundle. Blocks while the
    /// bundle's socket is full (back-pressure for all its flows).
    ///
    /// Fails with [`ErrorKind::InvalidRequest`] for an empty SDU,
    /// [`ErrorKind::SduTooLarge`] over [`MAX_BUNDLE_SDU`] and
    /// [`ErrorKind::DaemonGone`] once the daemon closed the bundle. An SDU
    /// for a port that is not a flow of this bundle (or one that ended)
    /// is dropped by the daemon, and counted.
    pub fn write(&self, port: u32, sdu: &[u8]) -> Result<()> {
        if sdu.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidRequest,
                format!("empty SDU on bundled flow {port}: an SDU has at least one byte"),
            ));
        }
        if sdu.len() > MAX_BUNDLE_SDU {
            return Err(Error::new(
                ErrorKind::SduTooLarge,
                format!(
                    "SDU of {} bytes is larger than the {MAX_BUNDLE_SDU} bytes a bundle carries",
                    sdu.len()
                ),
            ));
        }
        self.send(Kind::Sdu, port, sdu, MsgFlags::empty())
            .map(|_| ())
    }

    /// Like [`Bundle::write`], but never waits: `false` if the bundle's
    /// socket had no room (the SDU was not sent).
    pub fn try_write(&self, port: u32, sdu: &[u8]) -> Result<bool> {
        if sdu.is_empty() || sdu.len() > MAX_BUNDLE_SDU {
            return self.write(port, sdu).map(|()| true);
        }
        self.send(Kind::Sdu, port, sdu, MsgFlags::MSG_DONTWAIT)
    }

    /// Closes flow `port` of the bundle (as closing a flow's descriptor
    /// does: what it wrote still goes to the peer, in the time the daemon
    /// gives it).
    pub fn close_flow(&self, port: u32) -> Result<()> {
        self.send(Kind::End, port, &[], MsgFlags::empty())
            .map(|_| ())
    }

    fn send(&self, kind: Kind, port: u32, sdu: &[u8], flags: MsgFlags) -> Result<bool> {
        let h = frame::header(kind, port);
        let iov = [IoSlice::new(&h), IoSlice::new(sdu)];
        loop {
            match socket::sendmsg::<()>(
                self.fd.as_raw_fd(),
                &iov,
                &[],
                flags | MsgFlags::MSG_NOSIGNAL,
                None,
            ) {
                Ok(_) => return Ok(true),
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) if flags.contains(MsgFlags::MSG_DONTWAIT) => return Ok(false),
                Err(e) => return Err(self.error("write to", e)),
            }
        }
    }

    /// Receives the next SDU or end of one of the bundle's flows. Blocks
    /// until one comes.
    ///
    /// Fails with [`ErrorKind::DaemonGone`] once the daemon closed the
    /// bundle (every flow in it is then gone), and with
    /// [`ErrorKind::Internal`] if the daemon sent what is not a frame.
    pub fn read(&mut self) -> Result<BundleEvent<'_>> {
        let n = sock::recv_sdu(self.fd.as_fd(), &mut self.buf, MsgFlags::empty())
            .map_err(|e| self.error("read from", e))?;
        self.event(n)
    }

    /// Like [`Bundle::read`], but waits at most `timeout`; `None` if
    /// nothing came.
    pub fn read_timeout(&mut self, timeout: Duration) -> Result<Option<BundleEvent<'_>>> {
        let ready = sock::wait_readable(self.fd.as_fd(), Some(timeout))
            .map_err(|e| self.error("poll", e))?;
        if !ready {
            return Ok(None);
        }
        self.read().map(Some)
    }

    fn event(&self, n: usize) -> Result<BundleEvent<'_>> {
        if n == 0 {
            return Err(Error::new(
                ErrorKind::DaemonGone,
                format!("bundle {} is closed (the daemon closed it)", self.id),
            ));
        }
        if n >= self.buf.len() {
            return Err(Error::new(
                ErrorKind::SduTooLarge,
                format!(
                    "bundle {}: the daemon sent a frame of {n} bytes, more than any SDU (its tail was lost)",
                    self.id
                ),
            ));
        }
        let f = frame::parse(&self.buf[..n]).map_err(|e| {
            Error::new(
                ErrorKind::Internal,
                format!("bundle {}: the daemon sent {e}", self.id),
            )
        })?;
        Ok(match f.kind {
            Kind::Sdu => BundleEvent::Sdu {
                port: f.port,
                data: f.payload,
            },
            Kind::End => BundleEvent::Ended { port: f.port },
        })
    }

    fn error(&self, what: &str, e: Errno) -> Error {
        let err = Error::sys(&format!("cannot {what} bundle {}", self.id), e);
        if err.kind() == ErrorKind::DaemonGone {
            Error::new(
                ErrorKind::DaemonGone,
                format!("bundle {} is closed (the daemon closed it)", self.id),
            )
        } else {
            err
        }
    }
}

impl AsFd for Bundle {
    /// The bundle's socket, to wait on with `poll` or `epoll`: readable
    /// when an SDU or an end came.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Bundle {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
