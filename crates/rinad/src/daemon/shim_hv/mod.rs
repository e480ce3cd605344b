//! The shared-memory side of a shim-hv IPCP: the mapped VMPI region, the
//! polling of its rings, and the send paths.
//!
//! The host side creates the file (`path`, typically under `/dev/shm`),
//! sizes it (a power of two, as a QEMU `ivshmem-plain` device needs) and
//! lays out the header and both rings; the guest side maps the file (or the
//! BAR 2 `resource2` file of an ivshmem PCI device in a VM) and attaches,
//! retrying every tick until the host has laid it out.
//!
//! Notification: doorbells when both daemons run on one machine. The host
//! side listens on a Unix socket next to the file (`PATH.bell`); the guest
//! side connects, and once each has sent the other a hello, a doorbell is
//! a one-byte packet on that connection, each daemon's end in its `mio`
//! loop. (No descriptor crosses: an eventfd or pipe end one daemon sent
//! the other is one open file both hold, whose O_NONBLOCK either can
//! clear; a peer that did, and filled it, would block the other's next
//! ring or drain for good. Each end of the connection is its own daemon's,
//! and is only written and read with `MSG_DONTWAIT`.) A
//! side that finds its receive ring empty (or its send ring full) says so
//! in the ring header and sleeps; the other side rings its doorbell after
//! publishing a record (or freeing slots) only if it asked, so a busy ring
//! costs no system call (see `rina_core::shim_hv::ring`). When to tick is
//! the core's decision (`rina_core::shim_hv::link::Ticker`; when the peer
//! is lost, `Link::tick`'s): the daemon sleeps until the deadline it gives
//! and does the IO. With doorbells it only ticks every `BEAT_EVERY`
//! (50 ms) for heartbeats. Without them (an `ivshmem-plain` device in a VM
//! has no interrupts; no `.bell` socket) it falls back to polling: every
//! `POLL_EVERY` (1 ms) it bumps its heartbeat, checks the peer's and
//! drains the receive ring, draining without sleeping while data comes. With `busy_poll = true` the daemon
//! never sleeps (lowest latency, one core busy); it still rings a peer
//! that sleeps.
//!
//! Copies: an application's SDU is received from its socket straight into
//! the send ring (one `recvmsg` into a reserved record), and handed from
//! the receive ring straight to the peer application's socket (one
//! `sendmsg` from the ring); only SDUs held back, control messages and
//! frames of stacked normal IPCPs are copied in the daemon.
//!
//! Back-pressure, end to end and lossless for applications: when the send
//! ring is full, the SDU waits and the IPCP's flows stop being read until
//! the peer frees slots (its doorbell) or a later tick finds room. Per
//! flow, the machine's credit decides (`rina_core::shim_hv::credit`): a
//! flow whose credit is used up (`ShimHv::may_send`) is not read — only
//! that flow, its application's writes block — until a grant comes in
//! from the peer; at the receiving end, SDUs for an application whose
//! socket (or ring) is full are held, at most the window the machine
//! granted (it drops what goes beyond), and every SDU that reaches the
//! application is told to the machine (`ShimHv::delivered`), which sends
//! the peer more credit. So one stalled application stalls nothing else,
//! and the receive ring is always read. With a peer that does not
//! announce credit, SDUs for an application whose socket is full are held
//! up to [`RX_QUEUE_MAX`] per flow and [`RX_HELD_BYTES_MAX`] over all the
//! IPCP's flows, and then the receive ring is not read
//! until the application catches up (the sender's ring fills and its
//! application's writes block; one stalled application then pauses the
//! other flows of the device, as before credit). A normal IPCP's frames are
//! never held and its flows have no credit. Frames of a normal IPCP stacked on top
//! wait in a bounded backlog ([`N1_BACKLOG_BUFFERS`], [`N1_BACKLOG_BYTES`])
//! while the ring is full and are sent, in order, when the peer frees
//! slots; only what overflows the backlog is lost (counted as
//! `tx_ring_full`). Control messages wait in a backlog of their own.

mod bell;
mod region;
mod service;
mod sock_io;

use super::held::HeldQueue;
use super::*;
use bell::Bell;
pub(super) use region::Mapping;
use region::{open_region, Attached};
use rina_core::buf::PduBuf;
use rina_core::shim_hv::link::{
    region_size, region_used, Backlog, BacklogOutcome, Link, LinkConfig, LinkEvent, RelayRead,
    Ticker,
};
use rina_core::shim_hv::ring::{Geometry, Region, RingError, Segments};
use rina_core::shim_hv::vmpi::{CHANNEL_HEADER, CONTROL_CHANNEL};
use rina_core::shim_hv::{self as core_hv, ShimHv, Side};
use sock_io::{hold_copy, recv_into, sdu_len, send_from};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::ptr::NonNull;

/// Geometry of the rings a host side lays out: 1024 slots of 4 KiB (4 MiB
/// per direction; a 64 KiB SDU takes 17 slots). The file is 16 MiB.
pub const GEOMETRY: Geometry = Geometry {
    slot_size: 4096,
    slots: 1024,
};

/// Control buffers held while the send ring is full.
const BACKLOG_MAX: usize = 256;

/// Frames of stacked normal IPCPs held while the send ring is full (as
/// many as a second ring of small frames)...
pub const N1_BACKLOG_BUFFERS: usize = 4096;

/// ... and at most this many bytes of them (a second ring's worth).
pub const N1_BACKLOG_BYTES: usize = 4 << 20;

/// SDUs held for one application whose socket is full on a flow without
/// credit (a peer that does not announce it); when such a flow holds this
/// many, the receive ring is not read until the application catches up.
/// (A flow with credit holds at most its window.)
const RX_QUEUE_MAX: usize = 64;

/// Bytes held for applications over all the flows of one shim-hv IPCP:
/// when a flow without credit takes the held bytes to this, the receive
/// ring is not read until they are down to half of it (and the flow it
/// paused for holds under half of [`RX_QUEUE_MAX`]). Twice a ring: 64
/// SDUs of 64 KiB on each of 63 flows were 254 MiB before.
const RX_HELD_BYTES_MAX: usize = 8 << 20;

/// Why the receive ring of a shim-hv IPCP is not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RxPause {
    /// The next SDU, for flow `0` (with rings), waits in the VMPI ring
    /// itself until its application makes room in its ring and kicks.
    InRing(PortId),
    /// SDUs held for applications reached a bound: flow `0` holds
    /// [`RX_QUEUE_MAX`], or all hold [`RX_HELD_BYTES_MAX`] bytes (see
    /// [`rx_may_resume`]).
    Held(PortId),
}

/// Bytes held in `pending`, over all flows.
fn held_bytes(pending: &IdMap<PortId, HeldQueue<Vec<u8>>>) -> usize {
    pending.values().map(HeldQueue::bytes).sum()
}

/// A flow without credit that holds `len` SDUs, with `held` bytes held
/// over all flows, pauses the receive ring.
fn rx_full(len: usize, held: usize) -> bool {
    len >= RX_QUEUE_MAX || held >= RX_HELD_BYTES_MAX
}

/// The receive ring, paused for flow `paused`, may be read again: that
/// flow holds under half of [`RX_QUEUE_MAX`] and all hold under half of
/// [`RX_HELD_BYTES_MAX`].
fn rx_may_resume(paused: PortId, pending: &IdMap<PortId, HeldQueue<Vec<u8>>>) -> bool {
    pending.get(&paused).map_or(0, HeldQueue::len) < RX_QUEUE_MAX / 2
        && held_bytes(pending) < RX_HELD_BYTES_MAX / 2
}

/// A shim-hv IPCP's shared memory.
pub(super) struct HvIo {
    pub path: PathBuf,
    pub busy_poll: bool,
    att: Option<Attached>,
    session: u32,
    /// When ticks are due (the core decides; see `Ticker`).
    ticker: Ticker,
    /// Control buffers waiting for room in the send ring.
    backlog: Backlog,
    /// Frames of stacked normal IPCPs waiting for room in the send ring.
    n1_backlog: Backlog,
    /// Doorbells, when set up.
    bell: Bell,
    /// The send ring was full and this side asked to be rung when it has room.
    tx_armed: bool,
    /// Until when the receive ring is left unread because frames relayed
    /// from it would find another shim-hv backlog congested (the core's
    /// `RelayGate` decides; the ring is read again then at the latest).
    relay_wake: Option<Instant>,
    /// An application SDU (with its channel header) waiting for room.
    stalled: Option<(PortId, Vec<u8>)>,
    /// Flows whose reading waits for the stall to end.
    parked: Vec<PortId>,
    /// Flows whose reading waits for the peer's credit.
    credit_parked: Vec<PortId>,
    /// Times a flow waited for credit.
    credit_waits: u64,
    /// Times `n1_backlog` became a quarter full and blocked the N-1 ports of
    /// the normal IPCPs over this one.
    upper_blocks: u64,
    /// Times the receive ring waited for an application's full ring.
    rx_ring_waits: u64,
    pub rx_queued: bool,
    /// SDUs waiting for applications' sockets, by flow.
    rx_pending: IdMap<PortId, HeldQueue<Vec<u8>>>,
    /// Why the receive ring is not read, if it is not.
    rx_paused: Option<RxPause>,
    /// The most bytes `rx_pending` held at once.
    rx_held_peak: usize,
    /// Garbage found in the receive ring (each time, what was published is dropped).
    rx_ring_errors: u64,
    /// Inconsistent indices found in the send ring.
    tx_ring_errors: u64,
    /// Failed attempts to map or attach.
    attach_errors: u64,
    /// The last refusal of the file logged (the guest side retries at
    /// every tick; each new reason is logged once).
    attach_refused: Option<String>,
}

impl HvIo {
    /// How many SDUs are held for the application of flow `port`.
    pub(in crate::daemon) fn held_for(&self, port: PortId) -> usize {
        self.rx_pending.get(&port).map_or(0, |q| q.len())
    }
}

/// The machine configuration and shared memory of the shim-hv IPCP of
/// entry `c` of configuration `cfg`.
pub(super) fn new_ipcp(
    ic: &crate::config::IpcpConfig,
) -> Result<(core_hv::Config, Io), DaemonError> {
    let name = ic.name.get_ref().clone();
    let path = ic.path.clone().unwrap_or_default();
    let side = match ic.side {
        Some(crate::config::HvSide::Guest) => Side::Guest,
        _ => Side::Host,
    };
    let session = std::process::id()
        ^ (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos()))
        | 1;
    let att = match open_region(&path, side, session) {
        Ok(a) => Some(a),
        Err(e) if side == Side::Host => {
            return Err(DaemonError::Io {
                what: format!(
                    "IPCP {name}: cannot create the shared-memory file {}",
                    path.display()
                ),
                source: e,
            })
        }
        Err(e) => {
            info!(ipcp = %name, path = %path.display(), error = %e, "shim-hv guest: waiting for the host side");
            None
        }
    };
    let bell = Bell::new(&path, side, &name);
    let mut hc = core_hv::Config::new(ic.dif.clone(), side);
    hc.vmpi_id = ic.vmpi_id.unwrap_or(0);
    if let Some(m) = &ic.max_sdu {
        hc.max_sdu = *m.get_ref();
    }
    if ic.credit == Some(false) {
        hc.credit = None;
    }
    info!(ipcp = %name, dif = %ic.dif, path = %path.display(), ?side, vmpi_id = hc.vmpi_id,
        max_sdu = hc.max_sdu, busy_poll = ic.busy_poll.unwrap_or(false),
        doorbell = %bell.sock_path.display(), "shim-hv IPCP up");
    let io = Io::Hv(Box::new(HvIo {
        path,
        busy_poll: ic.busy_poll.unwrap_or(false),
        att,
        session,
        ticker: Ticker::default(),
        backlog: Backlog::new(BACKLOG_MAX, BACKLOG_MAX * 2048),
        n1_backlog: Backlog::new(N1_BACKLOG_BUFFERS, N1_BACKLOG_BYTES),
        bell,
        tx_armed: false,
        relay_wake: None,
        stalled: None,
        parked: Vec::new(),
        credit_parked: Vec::new(),
        credit_waits: 0,
        upper_blocks: 0,
        rx_ring_waits: 0,
        rx_queued: false,
        rx_pending: IdMap::default(),
        rx_paused: None,
        rx_held_peak: 0,
        rx_ring_errors: 0,
        tx_ring_errors: 0,
        attach_errors: 0,
        attach_refused: None,
    }));
    Ok((hc, io))
}

impl Drop for HvIo {
    fn drop(&mut self) {
        if let Some(a) = &self.att {
            a.link.detach();
        }
        if self.bell.listener.is_some() {
            let _ = std::fs::remove_file(&self.bell.sock_path);
        }
    }
}

impl HvIo {
    /// A flow now holds `len` SDUs: notes the bytes held over all flows,
    /// and says whether that pauses the receive ring for a flow without
    /// credit ([`rx_full`]).
    fn note_held(&mut self, len: usize) -> bool {
        let held = held_bytes(&self.rx_pending);
        self.rx_held_peak = self.rx_held_peak.max(held);
        rx_full(len, held)
    }

    /// Whether this side sleeps on its doorbell between ticks.
    fn sleeps_on_bell(&self) -> bool {
        self.bell.on() && !self.busy_poll
    }

    /// Rings the peer if it sleeps on an empty receive ring (call after
    /// publishing).
    fn wake_peer_for_data(&mut self) {
        if let Some(a) = &self.att {
            if self.bell.on() && a.link.peer_wants_data() {
                self.bell.ring();
            }
        }
    }

    /// Sends a control buffer the machine asked for, or holds it.
    pub fn send_control(&mut self, buf: Vec<u8>) {
        let Some(a) = &mut self.att else {
            // Not attached: it waits (the peer cannot be up anyway).
            let _ = self.backlog.queue_only(&[&buf]);
            return;
        };
        match self.backlog.send(&mut a.link, &[&buf]) {
            BacklogOutcome::Sent => self.wake_peer_for_data(),
            BacklogOutcome::Queued | BacklogOutcome::Overflow => {}
            BacklogOutcome::Failed(RingError::BadIndex { .. }) => self.tx_ring_errors += 1,
            BacklogOutcome::Failed(e) => debug!(error = %e, "control buffer not sent"),
        }
    }

    /// Sends what waited for room; true if nothing waits any more.
    fn flush(&mut self, m: &mut ShimHv) -> bool {
        let Some(a) = &mut self.att else {
            return false;
        };
        let mut sent = false;
        let mut done = true;
        for bl in [&mut self.backlog, &mut self.n1_backlog] {
            let before = bl.len();
            match bl.flush(&mut a.link) {
                Ok(true) => {}
                Ok(false) => done = false,
                Err(_) => {
                    self.tx_ring_errors += 1;
                    done = false;
                }
            }
            sent |= bl.len() < before;
            if !done {
                break;
            }
        }
        if done {
            if let Some((port, b)) = &self.stalled {
                match a.link.send(&[b]) {
                    Ok(()) => {
                        sent = true;
                        self.stalled = None;
                    }
                    Err(RingError::Full) => done = false,
                    Err(RingError::BadIndex { .. }) => {
                        self.tx_ring_errors += 1;
                        done = false;
                    }
                    Err(_) => {
                        let (port, len) = (*port, b.len() - CHANNEL_HEADER);
                        m.unsend(port, len);
                        self.stalled = None;
                    }
                }
            }
        }
        if sent {
            self.wake_peer_for_data();
        }
        if done {
            self.tx_armed = false;
        }
        done
    }

    /// Bytes the first waiting buffer needs.
    fn waiting_len(&self) -> Option<usize> {
        self.backlog
            .front_len()
            .or(self.n1_backlog.front_len())
            .or(self.stalled.as_ref().map(|(_, b)| b.len()))
    }

    /// The send ring is full: with doorbells, asks the peer to ring when
    /// it has room. True if room appeared meanwhile (flush again now).
    fn arm_tx(&mut self) -> bool {
        if !self.sleeps_on_bell() {
            return false;
        }
        let Some(len) = self.waiting_len() else {
            return false;
        };
        let Some(a) = &mut self.att else {
            return false;
        };
        self.tx_armed = true;
        !a.link.arm_tx(len)
    }

    /// The send ring has no room for `len` bytes of a flow's rings: with
    /// doorbells, asks the peer to ring when it has. True if room appeared
    /// meanwhile (try again now).
    fn arm_tx_for(&mut self, len: usize) -> bool {
        if !self.sleeps_on_bell() {
            return false;
        }
        let Some(a) = &mut self.att else {
            return false;
        };
        self.tx_armed = true;
        !a.link.arm_tx(len)
    }

    /// Flow `port` waits for the VMPI ring to take data again: read once
    /// it does. Each flow is kept once, however often it is served (an
    /// application that keeps kicking a flow while the ring is stalled
    /// must not grow the list).
    fn park(&mut self, port: PortId) {
        if !self.parked.contains(&port) {
            self.parked.push(port);
        }
    }

    /// Flow `port` has no credit: it is not read until a grant comes.
    fn park_for_credit(&mut self, port: PortId) {
        if !self.credit_parked.contains(&port) {
            self.credit_parked.push(port);
            self.credit_waits += 1;
        }
    }

    /// Whether application SDUs or control buffers wait for room.
    pub fn stalled(&self) -> bool {
        self.stalled.is_some() || !self.backlog.is_empty()
    }

    /// Its address, for listings: the VMPI-id, side and file.
    pub fn address(&self, m: &ShimHv) -> String {
        let c = m.config();
        let side = match c.side {
            Side::Host => "host",
            Side::Guest => "guest",
        };
        let state = if m.is_peer_up() {
            "peer up"
        } else if self.att.is_some() {
            "peer down"
        } else {
            "not attached"
        };
        let bell = if self.bell.on() { ", doorbells" } else { "" };
        format!(
            "vmpi {} ({side}, {}, {state}{bell})",
            c.vmpi_id,
            self.path.display()
        )
    }

    /// IPCP-wide counters, the machine's and the driver's.
    pub fn counters(&self, m: &ShimHv) -> BTreeMap<String, u64> {
        let mut c = m.counters().to_map();
        c.insert("rx_ring_errors".into(), self.rx_ring_errors);
        c.insert("tx_ring_errors".into(), self.tx_ring_errors);
        c.insert("tx_ring_full".into(), self.n1_backlog.overflow());
        c.insert("tx_backlog_queued".into(), self.n1_backlog.queued());
        c.insert("tx_backlog_len".into(), self.n1_backlog.len() as u64);
        c.insert("relay_pauses".into(), m.relay_pauses());
        c.insert("upper_blocks".into(), self.upper_blocks);
        c.insert("rx_ring_waits".into(), self.rx_ring_waits);
        c.insert("rx_held_bytes".into(), held_bytes(&self.rx_pending) as u64);
        c.insert("rx_held_peak".into(), self.rx_held_peak as u64);
        c.insert("credit_waits".into(), self.credit_waits);
        c.insert("control_dropped".into(), self.backlog.overflow());
        c.insert("attach_errors".into(), self.attach_errors);
        c.insert("peer_up".into(), u64::from(m.is_peer_up()));
        c.insert("doorbell".into(), u64::from(self.bell.on()));
        c.insert("bell_rung".into(), self.bell.rung);
        c.insert("bell_wakeups".into(), self.bell.wakeups);
        c.insert("bell_errors".into(), self.bell.errors);
        c.insert("ticks".into(), self.ticker.ticks());
        c
    }

    /// Its RIB: address, names and flows with their counters.
    pub fn rib(&self, m: &ShimHv) -> rina_core::rib::Rib {
        use rina_core::rib::{self, ObjValue, Rib};
        let mut r = Rib::new(rib::Config::default());
        let _ = r.create_with_parents(
            "/shim/addr",
            "address",
            ObjValue::Str(self.address(m)),
            rib::OwnerId::NAMESPACE_MANAGER,
        );
        for (port, f) in m.flows() {
            let _ = r.create_with_parents(
                &format!("/shim/flows/pid={port}"),
                "Flow",
                ObjValue::Str(format!(
                    "{} -> {} on channel {}; SDUs in {} out {}",
                    f.local, f.remote, f.channel, f.counters.sdus_in, f.counters.sdus_out
                )),
                rib::OwnerId::FLOW_ALLOCATOR,
            );
        }
        r
    }
}
