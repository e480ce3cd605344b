//! `rinactl capture`: what an IPCP sends and receives, as pcap records on a
//! socket the capturing tool reads.
//!
//! Self-contained: while a capture is on, the core keeps bounded copies —
//! a normal IPCP of its N-1 frames (`NormalIpcp::set_tap`), the system of
//! what a shim sends and receives on its medium (`System::set_medium_tap`)
//! — and once per turn of the event loop [`Daemon::drain_captures`] sends
//! each copy as one pcap record (`rina_wire::pcap`; the link type depends
//! on the kind of IPCP) on every capture socket of that IPCP. The sockets
//! are non-blocking: a reader that falls behind loses records (their number
//! is logged when the capture ends), the data path never waits. A capture
//! ends when its reader closes the socket (the daemon watches each socket
//! for the hang-up, so a capture of an idle IPCP ends too) or when its IPCP
//! is destroyed (the reader then reads end of file); the copies stop when
//! the last capture of an IPCP ends. At most [`MAX_CAPTURES`] run at once.

use super::ipcp::Io;
use super::{token, Daemon, T_CAPTURE};
use crate::sys::{self, Sent};
use mio::unix::SourceFd;
use mio::Interest;
use rina_core::system::Machine;
use rina_core::time::Instant;
use rina_wire::ctl::{CtlError, ErrorKind, Reply};
use rina_wire::pcap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tracing::info;

/// Copies the core keeps for a captured IPCP between two turns of the loop.
const TAP_LIMIT: usize = 8192;
/// Send buffer of a capture socket.
const CAPTURE_SNDBUF: usize = 4 << 20;
/// Captures running at once, over all IPCPs (each may hold its socket's
/// send buffer, [`CAPTURE_SNDBUF`], of records).
pub(super) const MAX_CAPTURES: usize = 16;

/// What a capture of an IPCP copies, by its kind.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// A normal IPCP's N-1 frames.
    N1,
    /// A shim-udp's datagrams; its socket's address.
    Udp { local: SocketAddr },
    /// A shim-eth's Ethernet frames.
    Eth,
    /// A shim-hv's VMPI buffers; the device's VMPI-id.
    Hv { vmpi_id: u32 },
}

impl Source {
    fn linktype(self) -> u32 {
        match self {
            Source::N1 => pcap::LINKTYPE_RINA_N1,
            Source::Udp { .. } => pcap::LINKTYPE_RAW,
            Source::Eth => pcap::LINKTYPE_ETHERNET,
            Source::Hv { .. } => pcap::LINKTYPE_RINA_VMPI,
        }
    }
}

/// One capture: the IPCP, the daemon's end of the records' socket.
pub(super) struct Sink {
    /// Its number, in its socket's poll token.
    id: usize,
    ipcp: usize,
    source: Source,
    fd: OwnedFd,
    snaplen: u32,
    /// Records the reader did not take in time.
    dropped: u64,
}

/// The captures running.
#[derive(Default)]
pub(super) struct Captures {
    sinks: Vec<Sink>,
    /// The number of the next capture.
    next: usize,
}

impl Daemon {
    /// Starts a capture of IPCP `ipcp` (an administrator asked): the reply
    /// and the reader's end of the records' socket.
    pub(super) fn start_capture(
        &mut self,
        ipcp: &str,
        snaplen: Option<u32>,
    ) -> Result<(Reply, OwnedFd), CtlError> {
        let i = self.live_named(ipcp)?;
        if self.captures.sinks.len() >= MAX_CAPTURES {
            return Err(CtlError::new(
                ErrorKind::NoResources,
                format!(
                    "{MAX_CAPTURES} captures are running, the most this daemon keeps; \
                     end one (close its reader) first"
                ),
            ));
        }
        let snaplen = snaplen
            .unwrap_or(pcap::MAX_SNAPLEN)
            .clamp(1, pcap::MAX_SNAPLEN);
        let source = self.capture_source(i).ok_or_else(|| {
            CtlError::new(
                ErrorKind::InvalidRequest,
                format!("{ipcp} was removed: nothing to capture"),
            )
        })?;
        let (mine, theirs) = sys::flow_pair(CAPTURE_SNDBUF).map_err(|e| {
            CtlError::new(
                ErrorKind::NoResources,
                format!("cannot open the capture's socket: {e}"),
            )
        })?;
        // Watched for the reader's hang-up ([`Daemon::capture_news`]).
        let id = self.captures.next;
        self.poll
            .registry()
            .register(
                &mut SourceFd(&mine.as_raw_fd()),
                token(T_CAPTURE, id),
                Interest::READABLE,
            )
            .map_err(|e| CtlError::new(ErrorKind::Internal, e.to_string()))?;
        self.captures.next = (id + 1) % (1 << super::SHIFT);
        if !self.captures.sinks.iter().any(|s| s.ipcp == i) {
            self.set_tap(i, source, Some(TAP_LIMIT));
        }
        self.captures.sinks.push(Sink {
            id,
            ipcp: i,
            source,
            fd: mine,
            snaplen,
            dropped: 0,
        });
        info!(ipcp, snaplen, ?source, "capture started");
        let reply = Reply::Capture {
            linktype: source.linktype(),
            snaplen,
        };
        Ok((reply, theirs))
    }

    /// What a capture of IPCP `i` copies; `None` if it was removed.
    fn capture_source(&self, i: usize) -> Option<Source> {
        let machine = &self.sys.member(i)?.machine;
        Some(match (&self.ipcps[i].io, machine) {
            (_, Machine::Normal(_)) => Source::N1,
            (Io::Udp(u), _) => Source::Udp {
                local: u.sock.local_addr().unwrap_or(u.bind),
            },
            (Io::Eth(_), _) => Source::Eth,
            (Io::Hv(_), Machine::ShimHv(m)) => Source::Hv {
                vmpi_id: m.config().vmpi_id,
            },
            _ => return None,
        })
    }

    /// Starts (`limit` given) or stops the copies of IPCP `i`.
    fn set_tap(&mut self, i: usize, source: Source, limit: Option<usize>) {
        match source {
            Source::N1 => {
                if let Some(nm) = self.sys.member_mut(i).and_then(|m| m.normal_mut()) {
                    nm.set_tap(limit);
                }
            }
            _ => self.sys.set_medium_tap(i, limit),
        }
    }

    /// Copies the core lost for IPCP `i` because nobody took them in time.
    fn tap_dropped(&self, i: usize, source: Source) -> u64 {
        match source {
            Source::N1 => self
                .sys
                .member(i)
                .and_then(|m| m.normal())
                .map_or(0, |nm| nm.tap_dropped()),
            _ => self.sys.medium_tap_dropped(i),
        }
    }

    /// The next copy kept for IPCP `i` as a packet of its capture's link
    /// type, with when the core saw it.
    fn next_packet(&mut self, i: usize, source: Source) -> Option<(Instant, Vec<u8>)> {
        if let Source::N1 = source {
            let t = self.sys.member_mut(i)?.normal_mut()?.poll_tapped()?;
            let head = pcap::n1_header(t.outbound, t.port);
            return Some((t.at, [&head[..], &t.frame].concat()));
        }
        let t = self.sys.poll_medium_tapped(i)?;
        let packet = match source {
            Source::Udp { local } => {
                let peer = t
                    .peer
                    .unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0));
                let (src, dst) = if t.outbound {
                    (local, peer)
                } else {
                    (peer, local)
                };
                [pcap::ip_udp_header(src, dst, &t.frame), t.frame].concat()
            }
            Source::Eth => match t.aux_vlan {
                Some(vlan) => pcap::vlan_tagged(&t.frame, vlan),
                None => t.frame,
            },
            Source::Hv { vmpi_id } => {
                let head = pcap::vmpi_header(t.outbound, vmpi_id);
                [&head[..], &t.frame].concat()
            }
            Source::N1 => return None,
        };
        Some((t.at, packet))
    }

    /// Sends the copies the captured IPCPs kept as records to their
    /// captures; ends the captures whose reader left.
    pub(super) fn drain_captures(&mut self) {
        if self.captures.sinks.is_empty() {
            return;
        }
        let now = self.now();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        let mut ipcps: Vec<(usize, Source)> = self
            .captures
            .sinks
            .iter()
            .map(|s| (s.ipcp, s.source))
            .collect();
        ipcps.sort_unstable_by_key(|&(i, _)| i);
        ipcps.dedup_by_key(|&mut (i, _)| i);
        let mut gone = false;
        for (i, source) in ipcps {
            while let Some((t, packet)) = self.next_packet(i, source) {
                let at = wall.saturating_sub(now.saturating_since(t));
                for s in self.captures.sinks.iter_mut().filter(|s| s.ipcp == i) {
                    let rec = pcap::record(at, &[&packet], s.snaplen);
                    match sys::send(s.fd.as_raw_fd(), &rec, None) {
                        Ok(Sent::Done) => {}
                        Ok(Sent::WouldBlock) | Ok(Sent::TooBig) => s.dropped += 1,
                        Ok(Sent::Closed) | Err(_) => {
                            s.snaplen = 0;
                            gone = true;
                        }
                    }
                }
            }
        }
        if gone {
            self.end_captures();
        }
    }

    /// Capture `id`'s socket is readable or hung up: the capture ends if
    /// its reader left (what a reader writes is never read).
    pub(super) fn capture_news(&mut self, id: usize) {
        let Some(s) = self.captures.sinks.iter_mut().find(|s| s.id == id) else {
            return;
        };
        if sys::peer_hung_up(s.fd.as_raw_fd()) {
            s.snaplen = 0;
            self.end_captures();
        }
    }

    /// Ends the captures of IPCP `i`, which is being destroyed: what it
    /// copied goes out first, then the readers read end of file.
    pub(super) fn end_captures_of(&mut self, i: usize) {
        if !self.captures.sinks.iter().any(|s| s.ipcp == i) {
            return;
        }
        self.drain_captures();
        for s in self.captures.sinks.iter_mut().filter(|s| s.ipcp == i) {
            s.snaplen = 0;
        }
        self.end_captures();
    }

    /// Forgets the captures whose reader left (marked with snaplen 0),
    /// closing their sockets, and stops the copies of IPCPs no capture
    /// watches any more.
    fn end_captures(&mut self) {
        let (ended, kept): (Vec<Sink>, Vec<Sink>) = std::mem::take(&mut self.captures.sinks)
            .into_iter()
            .partition(|s| s.snaplen == 0);
        self.captures.sinks = kept;
        for s in ended {
            let _ = self
                .poll
                .registry()
                .deregister(&mut SourceFd(&s.fd.as_raw_fd()));
            let name = self.ipcps[s.ipcp].name.clone();
            let lost = self.tap_dropped(s.ipcp, s.source);
            info!(ipcp = %name, dropped = s.dropped, not_copied = lost, "capture ended");
            if self.captures.sinks.iter().any(|k| k.ipcp == s.ipcp) {
                continue;
            }
            self.set_tap(s.ipcp, s.source, None);
        }
    }
}
