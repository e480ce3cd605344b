//! `rinactl capture`: what a normal IPCP sends and receives on its N-1
//! flows, as pcap records on a socket the capturing tool reads.
//!
//! Self-contained: the normal IPCP's machine keeps copies of its N-1 frames
//! while a capture is on (`NormalIpcp::set_tap`, bounded), and once per
//! turn of the event loop [`Daemon::drain_captures`] sends each copy as one
//! pcap record (`rina_wire::pcap`) on every capture socket of that IPCP.
//! The sockets are non-blocking: a reader that falls behind loses records
//! (their number is logged when the capture ends), the data path never
//! waits. A capture ends when its reader closes the socket; the copies stop
//! when the last capture of an IPCP ends.

use super::Daemon;
use crate::sys::{self, Sent};
use rina_wire::ctl::{CtlError, ErrorKind, Reply};
use rina_wire::pcap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tracing::info;

/// Copies a normal IPCP keeps for its captures between two turns of the loop.
const TAP_LIMIT: usize = 8192;
/// Send buffer of a capture socket.
const CAPTURE_SNDBUF: usize = 4 << 20;

/// One capture: the IPCP, the daemon's end of the records' socket.
pub(super) struct Sink {
    ipcp: usize,
    fd: OwnedFd,
    snaplen: u32,
    /// Records the reader did not take in time.
    dropped: u64,
}

/// The captures running.
#[derive(Default)]
pub(super) struct Captures {
    sinks: Vec<Sink>,
}

impl Daemon {
    /// Starts a capture of normal IPCP `ipcp` (an administrator asked):
    /// the reply and the reader's end of the records' socket.
    pub(super) fn start_capture(
        &mut self,
        ipcp: &str,
        snaplen: Option<u32>,
    ) -> Result<(Reply, OwnedFd), CtlError> {
        let Some(i) = self.ipcps.iter().position(|ip| ip.name == ipcp) else {
            let known: Vec<&str> = self.ipcps.iter().map(|ip| ip.name.as_str()).collect();
            return Err(CtlError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "no IPCP named {ipcp:?}; this system has {}",
                    known.join(", ")
                ),
            ));
        };
        let snaplen = snaplen
            .unwrap_or(pcap::MAX_SNAPLEN)
            .clamp(1, pcap::MAX_SNAPLEN);
        let kind = self.kind(i);
        let Some(nm) = self.sys.member_mut(i).and_then(|m| m.normal_mut()) else {
            return Err(CtlError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "{ipcp} is a {kind} IPCP: capture the normal IPCPs above it here, and a shim's \
                     own traffic on its medium (tcpdump -i IFACE, or udp port for shim-udp)"
                ),
            ));
        };
        let (mine, theirs) = sys::flow_pair(CAPTURE_SNDBUF).map_err(|e| {
            CtlError::new(
                ErrorKind::NoResources,
                format!("cannot open the capture's socket: {e}"),
            )
        })?;
        if !self.captures.sinks.iter().any(|s| s.ipcp == i) {
            nm.set_tap(Some(TAP_LIMIT));
        }
        self.captures.sinks.push(Sink {
            ipcp: i,
            fd: mine,
            snaplen,
            dropped: 0,
        });
        info!(ipcp, snaplen, "capture started");
        let reply = Reply::Capture {
            linktype: pcap::LINKTYPE_RINA_N1,
            snaplen,
        };
        Ok((reply, theirs))
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
        let mut ipcps: Vec<usize> = self.captures.sinks.iter().map(|s| s.ipcp).collect();
        ipcps.sort_unstable();
        ipcps.dedup();
        let mut gone = false;
        for i in ipcps {
            let Some(nm) = self.sys.member_mut(i).and_then(|m| m.normal_mut()) else {
                continue;
            };
            while let Some(t) = nm.poll_tapped() {
                let at = wall.saturating_sub(now.saturating_since(t.at));
                let head = pcap::n1_header(t.outbound, t.port);
                for s in self.captures.sinks.iter_mut().filter(|s| s.ipcp == i) {
                    let rec = pcap::record(at, &[&head, &t.frame], s.snaplen);
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

    /// Forgets the captures whose reader left (marked with snaplen 0) and
    /// stops the copies of IPCPs no capture watches any more.
    fn end_captures(&mut self) {
        let (ended, kept): (Vec<Sink>, Vec<Sink>) = std::mem::take(&mut self.captures.sinks)
            .into_iter()
            .partition(|s| s.snaplen == 0);
        self.captures.sinks = kept;
        for s in ended {
            let name = self.ipcps[s.ipcp].name.clone();
            info!(ipcp = %name, dropped = s.dropped, "capture ended");
            if self.captures.sinks.iter().any(|k| k.ipcp == s.ipcp) {
                continue;
            }
            if let Some(nm) = self.sys.member_mut(s.ipcp).and_then(|m| m.normal_mut()) {
                nm.set_tap(None);
            }
        }
    }
}
