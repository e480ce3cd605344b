//! The RINA application API: talk to the local `rinad`, register names,
//! allocate and accept flows.
//!
//! A [`Client`] is a connection to the daemon's control socket (a
//! `SOCK_SEQPACKET` Unix socket; see [`rina_wire::ctl`] for the protocol). A
//! [`Flow`] is a connected `SOCK_SEQPACKET` descriptor handed over by the
//! daemon, and where the DIF offers them (by default; see
//! [`Client::set_rings`]) two shared-memory rings beside it that carry the
//! SDUs without a system call each. Either way a flow can be used with
//! `poll`, `epoll` or any event loop: [`std::os::fd::AsFd`] gives the
//! descriptor that turns readable, and [`Flow::try_read`] reads without
//! blocking.
//!
//! ```no_run
//! use rina::{AppName, Client, QosSpec};
//! # fn main() -> rina::Result<()> {
//! let mut client = Client::connect()?;
//! let me: AppName = "demo-client".parse().expect("valid name");
//! let echo: AppName = "echo".parse().expect("valid name");
//! let flow = client.allocate(&me, &echo, None, &QosSpec::default())?;
//! flow.write(b"hello")?;
//! let mut buf = vec![0; flow.max_sdu()];
//! let n = flow.read(&mut buf)?;
//! println!("{:?}", &buf[..n]);
//! # Ok(()) }
//! ```
//!
//! Control operations are blocking, each bounded by the client's timeout
//! ([`DEFAULT_TIMEOUT`], see [`Client::set_timeout`]). Async programs run them in
//! `tokio::task::spawn_blocking` and turn the flows they get into
//! [`AsyncFlow`]s with [`Flow::into_async`] (feature `tokio`, on by default).
//!
//! * [`client`] — the control connection.
//! * [`flow`] — blocking flows.
//! * [`bundle`] — many flows over one descriptor, for tens of thousands of
//!   flows in one process.
//! * [`error`] — the error type.

#[cfg(feature = "tokio")]
mod async_flow;
pub mod bundle;
pub mod client;
pub mod error;
mod fd_limit;
pub mod flow;
pub mod ports;
mod rings;
mod sock;

#[cfg(feature = "tokio")]
pub use async_flow::{AsyncFlow, IntoAsyncError};
pub use bundle::{Bundle, BundleEvent, MAX_BUNDLE_SDU};
pub use client::{Client, DEFAULT_TIMEOUT, MAX_ARRIVED};
pub use error::{Error, ErrorKind, Result};
pub use fd_limit::raise_fd_limit;
pub use flow::{Flow, Segments};

pub use rina_wire::ctl::{
    default_socket_path, DifInfo, FlowCounters, FlowInfo, FlowStats, IncomingFlow, IpcpInfo,
    NameInfo, PortQueues, QueueCounters, RibObjectInfo, SchedulerInfo, SOCKET_ENV,
};
pub use rina_wire::{AppName, NameError, QosSpec};

#[cfg(test)]
mod tests;
