//! Shared code of the RINA command-line tools (`rinactl`, `rina-echo`,
//! `rina-perf`, `rina-demo`).
//!
//! * [`opts`] — options every tool takes (`--socket`, `--dif`, QoS).
//! * [`stats`] — min/avg/max/mdev and percentiles.
//! * [`echo`] — `rina-echo`'s probe format and JSON report.
//! * [`gw`] — `rina-gw`: TCP connections carried over RINA flows.
//! * [`cat`] — `rina-cat`: standard input and output over a RINA flow.
//! * [`ip`] — `rina-ip`: IP over RINA flows through a TUN interface.
//! * [`perf`] — `rina-perf`'s in-band protocol, receiver and JSON report.
//! * [`serving`] — how the servers of `rina-echo` and `rina-perf` take flows.
//! * [`table`] — aligned text tables.
//! * [`tgen`] — `rina-tgen`'s generators, per-flow metrics, traffic matrix and files.

pub mod capture;
pub mod cat;
pub mod echo;
pub mod gw;
pub mod ip;
pub mod opts;
pub mod perf;
pub mod serving;
pub mod stats;
pub mod table;
pub mod tgen;

/// How serving one flow ended (see [`echo::serve_flow`], [`perf::serve_flow`]).
#[derive(Debug)]
pub struct Served {
    /// SDUs handled.
    pub sdus: u64,
    /// Bytes of those SDUs.
    pub bytes: u64,
    /// `None` if the flow was closed; otherwise the error that ended it.
    pub error: Option<rina::Error>,
}

#[cfg(test)]
pub(crate) mod testing {
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    use rina::{Flow, FlowInfo, QosSpec};
    use std::os::fd::OwnedFd;

    /// A flow over a socketpair; the other end plays the peer.
    pub fn flow_pair(max_sdu: u32) -> (Flow, OwnedFd) {
        let (a, b) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .expect("socketpair");
        (Flow::from_parts(a, info(max_sdu)), b)
    }

    /// Two flows joined by a socketpair, with these max SDUs.
    pub fn flows(max_a: u32, max_b: u32) -> (Flow, Flow) {
        let (a, b) = flow_pair(max_a);
        (a, Flow::from_parts(b, info(max_b)))
    }

    /// A "flow" whose reads fail for good (a pipe is not a socket).
    pub fn broken_flow() -> (Flow, OwnedFd) {
        let (r, w) = nix::unistd::pipe().expect("pipe");
        (Flow::from_parts(r, info(100)), w)
    }

    fn info(max_sdu: u32) -> FlowInfo {
        FlowInfo {
            port: 1,
            dif: "test".into(),
            local: "server".parse().expect("name"),
            remote: "client".parse().expect("name"),
            qos: QosSpec::default(),
            max_sdu,
            direct: false,
            bundle: None,
        }
    }
}
