//! `rina-ip`: IP over RINA flows (what IRATI's `iporinad` does).
//!
//! A TUN interface on one side, one RINA flow per peer (and per QoS profile
//! the peer's DSCP mapping asks for) on the other. IP packets read from the
//! TUN go to the peer whose prefix is the longest match for their
//! destination; SDUs from the flows go to the TUN. Flows that fail are
//! re-allocated with back-off; the state and counters are served on a
//! small Unix socket for `rina-ip --status`. See `docs/rina-ip.md`.
//!
//! * [`config`] — TOML file and flags, checked.
//! * [`route`] — prefixes and the longest-prefix-match table.
//! * [`packet`] — checked IP packet views and the keepalive frame.
//! * [`icmp`] — the ICMP errors for packets the tunnel cannot deliver.
//! * [`frag`] — IPv4 fragmentation, for packets larger than a flow.
//! * [`ratelimit`] — the token bucket that bounds those errors.
//! * [`tun`] — the TUN interface.
//! * [`backoff`] — bounded exponential back-off.
//! * [`status`] — state and counters, their socket and their text form.
//! * [`tunnel`] — the threads that run it all.

pub mod backoff;
pub mod config;
pub mod frag;
pub mod icmp;
pub mod packet;
pub mod ratelimit;
pub mod route;
pub mod status;
pub mod tun;
pub mod tunnel;

pub use config::{Config, ConfigError, Overrides};
pub use status::Status;
pub use tunnel::Tunnel;

use thiserror::Error;

/// Why the tunnel could not start, or ended.
#[derive(Debug, Error)]
pub enum IpError {
    /// The configuration is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The TUN interface could not be set up.
    #[error(transparent)]
    Tun(#[from] tun::TunError),
    /// The status socket could not be set up.
    #[error(transparent)]
    Status(#[from] status::StatusError),
    /// A thread could not be started.
    #[error("cannot start a thread: {0}")]
    Thread(std::io::Error),
    /// The TUN interface failed while the tunnel ran (it was deleted, or
    /// cannot be read any more).
    #[error("the TUN interface failed: {0}")]
    TunLost(String),
}
