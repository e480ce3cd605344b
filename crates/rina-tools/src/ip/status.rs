//! The tunnel's state and counters as `rina-ip --status` shows them, and
//! the small Unix stream socket that serves them: each connection gets one
//! JSON document and is closed.

use crate::table::Table;
use serde::{Deserialize, Serialize};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use thiserror::Error;

/// Largest status document read back, in bytes.
const MAX_STATUS: usize = 4 << 20;

/// Longest a status query waits for the whole document.
const QUERY_TIMEOUT: Duration = Duration::from_secs(3);

/// Why the status could not be served or fetched.
#[derive(Debug, Error)]
pub enum StatusError {
    /// Another process answers on the status socket.
    #[error(
        "another rina-ip already answers on {0} (a second tunnel needs its own --status-socket)"
    )]
    InUse(PathBuf),
    /// Something other than a socket is at the status socket's path (it
    /// is left alone).
    #[error("{0} exists and is not a socket: give the status socket another path (--status-socket or status_socket)")]
    NotASocket(PathBuf),
    /// The socket could not be created.
    #[error("cannot listen on {path}: {source}")]
    Listen {
        /// The socket path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Nothing answers on the socket.
    #[error("no rina-ip answers on {path} (is it running? the path is set with --status-socket or status_socket): {source}")]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The answer could not be read or understood.
    #[error("bad status answer from {path}: {detail}")]
    Bad {
        /// The socket path.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
}

/// Counters of one peer, since the tunnel started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerCounters {
    /// IP packets received from the peer and written to the TUN.
    pub packets_in: u64,
    /// Their bytes.
    pub bytes_in: u64,
    /// IP packets read from the TUN and sent to the peer.
    pub packets_out: u64,
    /// Their bytes.
    pub bytes_out: u64,
    /// Packets for the peer dropped because no flow to it was up.
    pub drops_no_flow: u64,
    /// Packets for the peer dropped because they exceed the flow's max SDU.
    pub drops_too_big: u64,
    /// ICMP "too big" errors written to the TUN for those (one per packet
    /// that may not be fragmented; see [`crate::ip::icmp`]).
    #[serde(default)]
    pub too_big_icmp: u64,
    /// ICMP "host unreachable" (ICMPv6 "address unreachable") errors
    /// written to the TUN for packets counted in `drops_no_flow`.
    #[serde(default)]
    pub unreachable_icmp: u64,
    /// IPv4 packets larger than the flow's max SDU, DF clear, sent in
    /// fragments (each fragment is counted in `packets_out`).
    #[serde(default)]
    pub fragmented: u64,
    /// Packets for the peer dropped because its flow stayed full.
    pub drops_full: u64,
    /// SDUs from the peer that were neither IP nor a control frame.
    pub drops_invalid: u64,
    /// IP packets from the peer whose source address does not route back
    /// to it (its longest-prefix match is another peer's prefix, or none):
    /// not written to the TUN (`source_filter`).
    #[serde(default)]
    pub drops_source: u64,
    /// Packets from the peer the TUN did not take.
    pub drops_tun: u64,
    /// Keepalives received.
    pub keepalives_in: u64,
    /// Flows that came up (allocated or accepted).
    pub flows_up: u64,
    /// Flows that came up to replace one that had failed.
    pub reallocations: u64,
    /// Allocation attempts that failed.
    pub alloc_failures: u64,
    /// Flows closed because nothing came on them for `dead_after`.
    pub dead_flows: u64,
}

/// One flow (QoS profile) of a peer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChannelStatus {
    /// QoS profile.
    pub qos: String,
    /// `up`, `allocating`, `waiting` (for the peer to allocate) or `backoff`.
    pub state: String,
    /// Port-id of the flow, when up.
    pub port: Option<u32>,
    /// Largest SDU of the flow, when up.
    pub max_sdu: Option<u32>,
    /// Seconds since the flow came up.
    pub up_s: Option<f64>,
    /// Milliseconds until the next allocation attempt, in back-off.
    pub retry_in_ms: Option<u64>,
    /// The last error seen on this channel.
    pub last_error: Option<String>,
    /// Packets sent on this channel's flows.
    pub packets_out: u64,
}

/// One peer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PeerStatus {
    /// Application name.
    pub name: String,
    /// Prefixes behind it.
    pub prefixes: Vec<String>,
    /// Whether this side allocates its flows (otherwise it waits for them).
    pub allocates: bool,
    /// `up` (every flow), `partial`, or `down`.
    pub state: String,
    /// Its flows.
    pub channels: Vec<ChannelStatus>,
    /// Its counters.
    pub counters: PeerCounters,
}

/// The whole tunnel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// Application name of the tunnel.
    pub name: String,
    /// TUN interface.
    pub tun: String,
    /// Its current MTU.
    pub mtu: u32,
    /// Seconds since start.
    pub uptime_s: f64,
    /// Whether the name is registered (the daemon is reachable).
    pub registered: bool,
    /// The last error talking to the daemon, if any.
    pub daemon_error: Option<String>,
    /// Packets from the TUN that no prefix matched.
    pub drops_no_route: u64,
    /// ICMP "no route" errors sent back for those (see
    /// [`crate::ip::icmp`]).
    #[serde(default)]
    pub no_route_icmp: u64,
    /// ICMP errors that were due but not sent: more than the rate limit
    /// allows (see [`crate::ip::ratelimit`]).
    #[serde(default)]
    pub icmp_rate_limited: u64,
    /// Packets from the TUN that were not valid IP.
    pub drops_tun_invalid: u64,
    /// Flow requests refused (unknown peer or QoS).
    pub refused: u64,
    /// Whether the TUN hands over and takes partial checksums.
    #[serde(default)]
    pub checksum_offload: bool,
    /// Packets sent with their checksum left partial.
    #[serde(default)]
    pub partial_out: u64,
    /// Partial-checksum packets received.
    #[serde(default)]
    pub partial_in: u64,
    /// Peers.
    pub peers: Vec<PeerStatus>,
}

impl Status {
    /// The text `rina-ip --status` prints.
    pub fn render(&self) -> String {
        let mut out = format!(
            "rina-ip {} on {} (mtu {}), {}, up {:.1} s\n",
            self.name,
            self.tun,
            self.mtu,
            if self.registered {
                "registered".to_string()
            } else {
                format!(
                    "NOT registered ({})",
                    self.daemon_error.as_deref().unwrap_or("connecting")
                )
            },
            self.uptime_s
        );
        out.push_str(&format!(
            "no-route drops {}, invalid TUN packets {}, refused flow requests {}, ICMP errors rate-limited {}\n",
            self.drops_no_route, self.drops_tun_invalid, self.refused, self.icmp_rate_limited
        ));
        out.push_str(&if self.checksum_offload {
            format!(
                "checksum offload on: {} packets out and {} in with partial checksums\n\n",
                self.partial_out, self.partial_in
            )
        } else {
            format!(
                "checksum offload off: {} partial-checksum packets in, completed here\n\n",
                self.partial_in
            )
        });
        let mut t = Table::new(&[
            "peer",
            "state",
            "role",
            "pkts in",
            "bytes in",
            "pkts out",
            "bytes out",
            "drops",
            "reallocs",
            "failures",
        ])
        .numeric(&[3, 4, 5, 6, 7, 8, 9]);
        for p in &self.peers {
            let c = &p.counters;
            let drops = c.drops_no_flow
                + c.drops_too_big
                + c.drops_full
                + c.drops_invalid
                + c.drops_source
                + c.drops_tun;
            t.row(vec![
                p.name.clone(),
                p.state.clone(),
                if p.allocates { "allocates" } else { "accepts" }.into(),
                c.packets_in.to_string(),
                c.bytes_in.to_string(),
                c.packets_out.to_string(),
                c.bytes_out.to_string(),
                drops.to_string(),
                c.reallocations.to_string(),
                c.alloc_failures.to_string(),
            ]);
        }
        out.push_str(&t.render());
        out.push('\n');
        let mut f = Table::new(&[
            "peer",
            "qos",
            "flow",
            "port",
            "max sdu",
            "up for",
            "pkts out",
            "last error",
        ])
        .numeric(&[3, 4, 6]);
        for p in &self.peers {
            for ch in &p.channels {
                let state = match ch.retry_in_ms {
                    Some(ms) => format!("{} ({ms} ms)", ch.state),
                    None => ch.state.clone(),
                };
                f.row(vec![
                    p.name.clone(),
                    ch.qos.clone(),
                    state,
                    ch.port.map(|p| p.to_string()).unwrap_or_default(),
                    ch.max_sdu.map(|p| p.to_string()).unwrap_or_default(),
                    ch.up_s.map(|s| format!("{s:.1} s")).unwrap_or_default(),
                    ch.packets_out.to_string(),
                    ch.last_error.clone().unwrap_or_default(),
                ]);
            }
        }
        out.push_str(&f.render());
        out
    }
}

/// Binds the status socket at `path`, replacing a stale socket file but
/// refusing one another process still answers on, and anything that is
/// not a socket (a file named there by mistake is not removed).
pub fn bind(path: &Path) -> Result<UnixListener, StatusError> {
    if UnixStream::connect(path).is_ok() {
        return Err(StatusError::InUse(path.to_owned()));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => {
            return Err(StatusError::NotASocket(path.to_owned()))
        }
        Ok(_) => {
            let _ = std::fs::remove_file(path);
        }
        Err(_) => {}
    }
    UnixListener::bind(path).map_err(|source| StatusError::Listen {
        path: path.to_owned(),
        source,
    })
}

/// Answers every connection on `listener` with the JSON of `status()`. A
/// client that does not read within a second is dropped.
pub fn serve(listener: UnixListener, mut status: impl FnMut() -> Status) {
    for conn in listener.incoming() {
        let mut conn = match conn {
            Ok(c) => c,
            Err(e) => {
                std::thread::sleep(accept_backoff(&e));
                continue;
            }
        };
        let _ = conn.set_write_timeout(Some(Duration::from_secs(1)));
        if let Ok(mut doc) = serde_json::to_vec(&status()) {
            doc.push(b'\n');
            let _ = conn.write_all(&doc);
        }
    }
}

/// How long to wait after `accept` failed with `e`: not at all for a
/// connection that went before it was taken or a signal; a tenth of a
/// second otherwise (out of descriptors or memory, the connection stays
/// queued and `accept` fails again at once: without a pause the thread
/// spun).
fn accept_backoff(e: &std::io::Error) -> Duration {
    match e.raw_os_error() {
        Some(libc::ECONNABORTED | libc::EINTR) => Duration::ZERO,
        _ => Duration::from_millis(100),
    }
}

/// Asks the tunnel answering on `path` for its status: the whole document
/// within 3 s (a server that trickles it is given up on).
pub fn query(path: &Path) -> Result<Status, StatusError> {
    let s = UnixStream::connect(path).map_err(|source| StatusError::Connect {
        path: path.to_owned(),
        source,
    })?;
    let bad = |detail: String| StatusError::Bad {
        path: path.to_owned(),
        detail,
    };
    let deadline = Instant::now() + QUERY_TIMEOUT;
    let (mut doc, mut buf) = (Vec::new(), vec![0u8; 64 << 10]);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(bad(format!(
                "no whole answer within {} s",
                QUERY_TIMEOUT.as_secs()
            )));
        }
        s.set_read_timeout(Some(left))
            .map_err(|e| bad(e.to_string()))?;
        match (&s).read(&mut buf) {
            Ok(0) => break,
            Ok(n) if doc.len() + n > MAX_STATUS => {
                return Err(bad(format!("an answer of more than {MAX_STATUS} bytes")))
            }
            Ok(n) => doc.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // The read's own timeout (what was left of the deadline): the
            // check above says so, naming the deadline.
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return Err(bad(e.to_string())),
        }
    }
    serde_json::from_slice(&doc).map_err(|e| bad(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Status {
        Status {
            name: "ip-a".into(),
            tun: "rtest0".into(),
            mtu: 1400,
            uptime_s: 3.0,
            registered: true,
            daemon_error: None,
            drops_no_route: 2,
            no_route_icmp: 2,
            icmp_rate_limited: 0,
            drops_tun_invalid: 0,
            checksum_offload: true,
            partial_out: 7,
            partial_in: 5,
            refused: 1,
            peers: vec![PeerStatus {
                name: "ip-b".into(),
                prefixes: vec!["10.0.0.2/32".into()],
                allocates: true,
                state: "up".into(),
                channels: vec![ChannelStatus {
                    qos: "unreliable".into(),
                    state: "up".into(),
                    port: Some(7),
                    max_sdu: Some(1400),
                    up_s: Some(2.5),
                    retry_in_ms: None,
                    last_error: None,
                    packets_out: 4,
                }],
                counters: PeerCounters {
                    packets_in: 5,
                    drops_full: 1,
                    drops_invalid: 2,
                    drops_source: 4,
                    ..PeerCounters::default()
                },
            }],
        }
    }

    #[test]
    fn a_file_at_the_status_path_is_refused_and_left_alone() {
        let dir = std::env::temp_dir().join(format!("rina-ip-notsock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("precious.txt");
        std::fs::write(&file, "keep me").unwrap();
        let e = bind(&file).unwrap_err();
        assert!(matches!(e, StatusError::NotASocket(_)), "{e}");
        assert!(e.to_string().contains("precious.txt"), "{e}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
        assert!(matches!(bind(&dir), Err(StatusError::NotASocket(_))));
        // A stale socket (nobody answers) is replaced.
        let sock = dir.join("stale.sock");
        drop(UnixListener::bind(&sock).unwrap());
        assert!(bind(&sock).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn status_is_served_and_read_back() {
        let dir = std::env::temp_dir().join(format!("rina-ip-status-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let l = bind(&path).unwrap();
        std::thread::spawn(move || serve(l, sample));
        assert!(matches!(bind(&path), Err(StatusError::InUse(_))));
        let got = query(&path).unwrap();
        assert_eq!(got, sample());
        let text = got.render();
        assert!(
            text.contains("ip-b") && text.contains("allocates"),
            "{text}"
        );
        // drops add up: 1 full + 2 invalid + 4 with a source not theirs.
        assert!(
            text.lines()
                .any(|l| l.starts_with("ip-b") && l.contains(" 7 ")),
            "{text}"
        );
        // The flow row: port 7, max SDU 1400, 4 packets out, one cell each.
        let row: Vec<&str> = text
            .lines()
            .find(|l| l.starts_with("ip-b") && l.contains("unreliable"))
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(
            row,
            ["ip-b", "unreliable", "up", "7", "1400", "2.5", "s", "4"],
            "{text}"
        );
        let _ = std::fs::remove_dir_all(&dir);
        assert!(matches!(
            query(&dir.join("none.sock")),
            Err(StatusError::Connect { .. })
        ));
    }

    /// A server that sends its answer a byte every 200 ms (or never ends
    /// it): the query gives up after its 3 s, not after 4 MiB of bytes
    /// (nine days).
    #[test]
    fn a_trickled_answer_is_given_up_on_after_the_query_timeout() {
        let dir = std::env::temp_dir().join(format!("rina-ip-trickle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let l = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            while c.write_all(b" ").is_ok() {
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || tx.send(query(&p)).unwrap());
        let got = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the query still waits after 10 s");
        let _ = std::fs::remove_dir_all(&dir);
        match got {
            Err(StatusError::Bad { detail, .. }) => {
                assert!(detail.contains("within 3 s"), "{detail}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn accept_fails_for_want_of_descriptors_wait_before_trying_again() {
        let e = |n| std::io::Error::from_raw_os_error(n);
        assert!(accept_backoff(&e(libc::EMFILE)) >= Duration::from_millis(100));
        assert!(accept_backoff(&e(libc::ENFILE)) >= Duration::from_millis(100));
        assert_eq!(accept_backoff(&e(libc::ECONNABORTED)), Duration::ZERO);
    }
}
