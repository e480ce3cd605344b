//! The shared-memory side of a shim-hv IPCP: the mapped VMPI region, the
//! polling of its rings, and the send paths.
//!
//! The host side creates the file (`path`, typically under `/dev/shm`),
//! sizes it (a power of two, as a QEMU `ivshmem-plain` device needs) and
//! lays out the header and both rings; the guest side maps the file (or the
//! BAR 2 `resource2` file of an ivshmem PCI device in a VM) and attaches,
//! retrying every tick until the host has laid it out.
//!
//! Notification is by polling, chosen over eventfds for simplicity and
//! because it works unchanged across a VM boundary (an ivshmem-plain device
//! has no doorbell): every [`TICK`] the daemon bumps its heartbeat, checks
//! the peer's, and drains the receive ring; while a ring has data it is
//! drained without sleeping. With `busy_poll = true` the daemon never sleeps
//! (lowest latency, one core busy).
//!
//! Back-pressure, end to end and lossless for applications: when the send
//! ring is full, the SDU waits and the IPCP's flows stop being read until a
//! later tick finds room. At the receiving end, SDUs for an application
//! whose socket is full are held (up to [`RX_QUEUE_MAX`] per flow); when a
//! flow holds that many, the receive ring is not read until the application
//! catches up, so the sender's ring fills and its application's writes
//! block. (The price: one stalled application pauses the other flows of the
//! same device; a normal IPCP's frames are never held.) Frames of a normal
//! IPCP stacked on top are lost instead, as on a congested link. Control
//! messages wait in a bounded backlog.

use super::*;
use rina_core::shim_hv::link::{region_size, Link, LinkConfig, LinkEvent};
use rina_core::shim_hv::ring::{Geometry, Region, RingError};
use rina_core::shim_hv::{self as core_hv, ShimHv, Side};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::ptr::NonNull;

/// Geometry of the rings a host side lays out: 1024 slots of 4 KiB (4 MiB
/// per direction; a 64 KiB SDU takes 17 slots). The file is 16 MiB.
pub const GEOMETRY: Geometry = Geometry {
    slot_size: 4096,
    slots: 1024,
};
/// Interval between two polls of the rings when not busy-polling.
pub const TICK: Duration = Duration::from_millis(1);
/// Control buffers held while the send ring is full.
const BACKLOG_MAX: usize = 256;
/// SDUs held for one application whose socket is full; when a flow holds
/// this many, the receive ring is not read until the application catches up.
const RX_QUEUE_MAX: usize = 64;

/// A shared mapping of a file, unmapped on drop.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn new(file: &std::fs::File, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of `len` bytes of an open file; the
        // kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Mapping { ptr, len })
    }

    fn region(&self) -> Region {
        // SAFETY: the mapping is page-aligned, readable and writable for
        // `len` bytes, and outlives the link using it (both live in
        // `Attached`, the link dropped first).
        unsafe { Region::new(self.ptr, self.len) }.expect("mmap is page-aligned")
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped; no handle is used after.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A link and the mapping it lives in (fields drop in order: link first).
struct Attached {
    link: Link,
    _map: Mapping,
}

/// A shim-hv IPCP's machine and shared memory.
pub(super) struct HvIo {
    pub machine: ShimHv,
    pub path: PathBuf,
    pub busy_poll: bool,
    att: Option<Attached>,
    session: u32,
    pub next_tick: Instant,
    /// Control buffers waiting for room in the send ring.
    backlog: VecDeque<Vec<u8>>,
    /// An application SDU (with its channel header) waiting for room.
    stalled: Option<(PortId, Vec<u8>)>,
    /// Flows whose reading waits for the stall to end.
    parked: Vec<PortId>,
    pub rx_queued: bool,
    /// SDUs waiting for applications' sockets, by flow.
    rx_pending: HashMap<PortId, VecDeque<Vec<u8>>>,
    /// The flow whose full queue pauses the receive ring.
    rx_paused_on: Option<PortId>,
    /// Garbage found in the receive ring (each time, what was published is dropped).
    rx_ring_errors: u64,
    /// Inconsistent indices found in the send ring.
    tx_ring_errors: u64,
    /// Frames of stacked IPCPs lost to a full send ring.
    tx_ring_full: u64,
    /// Control buffers dropped because the backlog was full.
    control_dropped: u64,
    /// Failed attempts to map or attach.
    attach_errors: u64,
}

/// Opens and maps the region: the host creates and lays it out, the guest
/// attaches to what is there.
fn open_region(path: &Path, side: Side, session: u32) -> io::Result<Attached> {
    let to_io = |e: RingError| io::Error::other(e.to_string());
    match side {
        Side::Host => {
            let size = region_size(GEOMETRY);
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(path)?;
            file.set_len(size as u64)?;
            let map = Mapping::new(&file, size)?;
            let link = Link::create(map.region(), GEOMETRY, session, LinkConfig::default())
                .map_err(to_io)?;
            Ok(Attached { link, _map: map })
        }
        Side::Guest => {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)?;
            let len = file.metadata()?.len() as usize;
            if len < rina_core::shim_hv::link::HEADER {
                return Err(io::Error::other("the file is not laid out yet"));
            }
            let map = Mapping::new(&file, len)?;
            let link = Link::attach(map.region(), session, LinkConfig::default()).map_err(to_io)?;
            Ok(Attached { link, _map: map })
        }
    }
}

/// The shim-hv IPCP `i` of configuration `cfg`.
pub(super) fn new_ipcp(cfg: &Config, i: usize) -> Result<Ipcp, DaemonError> {
    let ic = &cfg.ipcps[i];
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
    let mut hc = core_hv::Config::new(ic.dif.clone(), side);
    hc.vmpi_id = ic.vmpi_id.unwrap_or(0);
    if let Some(m) = &ic.max_sdu {
        hc.max_sdu = *m.get_ref();
    }
    info!(ipcp = %name, dif = %ic.dif, path = %path.display(), ?side, vmpi_id = hc.vmpi_id,
        max_sdu = hc.max_sdu, busy_poll = ic.busy_poll.unwrap_or(false), "shim-hv IPCP up");
    Ok(Ipcp {
        name,
        dif: ic.dif.clone(),
        imp: Imp::ShimHv(Box::new(HvIo {
            machine: ShimHv::new(hc),
            path,
            busy_poll: ic.busy_poll.unwrap_or(false),
            att,
            session,
            next_tick: Instant::from_nanos(0),
            backlog: VecDeque::new(),
            stalled: None,
            parked: Vec::new(),
            rx_queued: false,
            rx_pending: HashMap::new(),
            rx_paused_on: None,
            rx_ring_errors: 0,
            tx_ring_errors: 0,
            tx_ring_full: 0,
            control_dropped: 0,
            attach_errors: 0,
        })),
    })
}

impl Drop for HvIo {
    fn drop(&mut self) {
        if let Some(a) = &self.att {
            a.link.detach();
        }
    }
}

impl HvIo {
    /// Sends a control buffer the machine asked for, or holds it.
    pub fn send_control(&mut self, buf: Vec<u8>) {
        if self.backlog.is_empty() {
            if let Some(a) = &mut self.att {
                match a.link.send(&[&buf]) {
                    Ok(()) => return,
                    Err(RingError::Full) => {}
                    Err(RingError::BadIndex { .. }) => self.tx_ring_errors += 1,
                    Err(e) => {
                        debug!(error = %e, "control buffer not sent");
                        return;
                    }
                }
            }
        }
        if self.backlog.len() < BACKLOG_MAX {
            self.backlog.push_back(buf);
        } else {
            self.control_dropped += 1;
        }
    }

    /// Sends what waited for room; true if nothing waits any more.
    fn flush(&mut self) -> bool {
        let Some(a) = &mut self.att else {
            return false;
        };
        while let Some(b) = self.backlog.front() {
            match a.link.send(&[b]) {
                Ok(()) => {
                    self.backlog.pop_front();
                }
                Err(RingError::Full) => return false,
                Err(RingError::BadIndex { .. }) => {
                    self.tx_ring_errors += 1;
                    return false;
                }
                Err(_) => {
                    self.backlog.pop_front();
                }
            }
        }
        if let Some((port, b)) = &self.stalled {
            match a.link.send(&[b]) {
                Ok(()) => {}
                Err(RingError::Full) => return false,
                Err(RingError::BadIndex { .. }) => {
                    self.tx_ring_errors += 1;
                    return false;
                }
                Err(_) => {
                    let (port, len) = (*port, b.len());
                    self.machine.unsend(port, len);
                }
            }
            self.stalled = None;
        }
        true
    }

    /// Its address, for listings: the VMPI-id, side and file.
    pub fn address(&self) -> String {
        let c = self.machine.config();
        let side = match c.side {
            Side::Host => "host",
            Side::Guest => "guest",
        };
        let state = if self.machine.is_peer_up() {
            "peer up"
        } else if self.att.is_some() {
            "peer down"
        } else {
            "not attached"
        };
        format!(
            "vmpi {} ({side}, {}, {state})",
            c.vmpi_id,
            self.path.display()
        )
    }

    /// IPCP-wide counters, the machine's and the driver's.
    pub fn counters(&self) -> BTreeMap<String, u64> {
        let mut c = self.machine.counters().to_map();
        c.insert("rx_ring_errors".into(), self.rx_ring_errors);
        c.insert("tx_ring_errors".into(), self.tx_ring_errors);
        c.insert("tx_ring_full".into(), self.tx_ring_full);
        c.insert("control_dropped".into(), self.control_dropped);
        c.insert("attach_errors".into(), self.attach_errors);
        c.insert("peer_up".into(), u64::from(self.machine.is_peer_up()));
        c
    }

    /// Its RIB: address, names and flows with their counters.
    pub fn rib(&self) -> rina_core::rib::Rib {
        use rina_core::rib::{self, ObjValue, Rib};
        let mut r = Rib::new(rib::Config::default());
        let _ = r.create_with_parents(
            "/shim/addr",
            "address",
            ObjValue::Str(self.address()),
            rib::OwnerId::NAMESPACE_MANAGER,
        );
        for (port, f) in self.machine.flows() {
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

impl Daemon {
    /// When the next shim-hv tick is due (now, for busy-polling IPCPs).
    pub(super) fn hv_timeout(&self) -> Option<Instant> {
        self.ipcps
            .iter()
            .filter_map(|ip| match &ip.imp {
                Imp::ShimHv(h) if h.busy_poll => Some(Instant::from_nanos(0)),
                Imp::ShimHv(h) => Some(h.next_tick),
                _ => None,
            })
            .min()
    }

    /// Runs the due ticks of shim-hv IPCPs: attach, heartbeats, sends held
    /// back, and a poll of the receive ring.
    pub(super) fn hv_ticks(&mut self, now: Instant) {
        for i in 0..self.ipcps.len() {
            let ipcp = &mut self.ipcps[i];
            let name = &ipcp.name;
            let Imp::ShimHv(h) = &mut ipcp.imp else {
                continue;
            };
            if !h.busy_poll && h.next_tick > now {
                continue;
            }
            h.next_tick = now + TICK;
            if h.att.is_none() && h.machine.config().side == Side::Guest {
                match open_region(&h.path, Side::Guest, h.session) {
                    Ok(a) => {
                        info!(ipcp = %name, "shim-hv guest attached");
                        h.att = Some(a);
                    }
                    Err(_) => h.attach_errors += 1,
                }
            }
            let Some(a) = &mut h.att else {
                continue;
            };
            match a.link.tick(now) {
                Some(LinkEvent::Up) => {
                    info!(ipcp = %name, "shim-hv peer up");
                    h.machine.peer_up();
                }
                Some(LinkEvent::Down) => {
                    warn!(ipcp = %name, "shim-hv peer gone; its flows are closed");
                    h.machine.peer_lost();
                    h.backlog.clear();
                    h.stalled = None;
                }
                None => {}
            }
            if h.flush() {
                for port in std::mem::take(&mut h.parked) {
                    self.mark_flow_ready(port);
                }
            }
            self.mark_udp_ready(i);
        }
    }

    /// Takes up to [`BUDGET`] buffers from the receive ring of shim-hv IPCP
    /// `i`; true if there may be more.
    pub(super) fn service_hv(&mut self, i: usize) -> bool {
        let now = self.now();
        if let Imp::ShimHv(h) = &mut self.ipcps[i].imp {
            // Queues of flows closed meanwhile are dropped, and do not pause.
            h.rx_pending.retain(|p, _| self.flows.contains_key(p));
            if h.rx_paused_on
                .is_some_and(|p| !h.rx_pending.contains_key(&p))
            {
                h.rx_paused_on = None;
            }
            if h.rx_paused_on.is_some() {
                return false;
            }
        }
        for _ in 0..BUDGET {
            let Imp::ShimHv(h) = &mut self.ipcps[i].imp else {
                return false;
            };
            let Some(a) = &mut h.att else {
                return false;
            };
            let n = match a.link.recv(&mut self.buf) {
                Ok(Some(n)) => n,
                Ok(None) => return false,
                Err(e) => {
                    h.rx_ring_errors += 1;
                    debug!(ipcp = %self.ipcps[i].name, error = %e, "garbage in the receive ring; dropped what was published");
                    return false;
                }
            };
            match h.machine.on_buffer(now, &self.buf[..n]) {
                core_hv::Received::Deliver { port, sdu } => {
                    if let Some(fs) = self.flows.get(&port) {
                        let fd = fs.fd.as_raw_fd();
                        let q = h.rx_pending.get(&port);
                        let sent = if q.is_some_and(|q| !q.is_empty()) {
                            Ok(Sent::WouldBlock)
                        } else {
                            sys::send(fd, sdu, None)
                        };
                        match sent {
                            Ok(Sent::Done) => {}
                            Ok(Sent::WouldBlock) => {
                                let q = h.rx_pending.entry(port).or_default();
                                q.push_back(sdu.to_vec());
                                let full = q.len() >= RX_QUEUE_MAX;
                                let _ = self.poll.registry().reregister(
                                    &mut SourceFd(&fd),
                                    token(T_FLOW, port as usize),
                                    Interest::READABLE | Interest::WRITABLE,
                                );
                                if full {
                                    h.rx_paused_on = Some(port);
                                    return false;
                                }
                            }
                            _ => {
                                if let Some(c) = h.machine.flow_counters_mut(port) {
                                    c.drops_in += 1;
                                }
                            }
                        }
                    } else if let Some(&(j, _)) = self.n1_owner.get(&port) {
                        if let Imp::Normal(nm) = &mut self.ipcps[j].imp {
                            nm.machine.on_frame(now, port, sdu);
                        }
                    } else if self.n1_pending.contains_key(&port) && self.early_n1.len() < BUDGET {
                        self.early_n1.push((port, sdu.to_vec()));
                    }
                }
                core_hv::Received::Control => {}
                core_hv::Received::Dropped(reason) => {
                    debug!(ipcp = %self.ipcps[i].name, ?reason, "VMPI buffer dropped");
                }
            }
        }
        true
    }

    /// The application's socket of shim-hv flow `port` can take more: hand
    /// it what was held, and read the ring again if it was paused for it.
    pub(super) fn hv_flush_rx(&mut self, port: PortId) {
        let Some(slot) = self.flows.get(&port) else {
            return;
        };
        let (fd, i) = (slot.fd.as_raw_fd(), slot.ipcp);
        let Imp::ShimHv(h) = &mut self.ipcps[i].imp else {
            return;
        };
        let Some(q) = h.rx_pending.get_mut(&port) else {
            return;
        };
        while let Some(sdu) = q.front() {
            match sys::send(fd, sdu, None) {
                Ok(Sent::Done) => {
                    q.pop_front();
                }
                Ok(Sent::WouldBlock) => break,
                _ => {
                    q.clear();
                }
            }
        }
        let (len, empty) = (q.len(), q.is_empty());
        if empty {
            h.rx_pending.remove(&port);
            let _ = self.poll.registry().reregister(
                &mut SourceFd(&fd),
                token(T_FLOW, port as usize),
                Interest::READABLE,
            );
        }
        if h.rx_paused_on == Some(port) && len < RX_QUEUE_MAX / 2 {
            h.rx_paused_on = None;
            self.mark_udp_ready(i);
        }
    }

    /// Reads up to [`BUDGET`] SDUs written by the application on shim-hv
    /// flow `port` and puts them in the send ring.
    pub(super) fn service_hv_flow(&mut self, port: PortId) -> FlowService {
        let Some(slot) = self.flows.get(&port) else {
            return FlowService::Drained;
        };
        let i = slot.ipcp;
        let fd = slot.fd.as_raw_fd();
        let Imp::ShimHv(h) = &mut self.ipcps[i].imp else {
            return FlowService::Drained;
        };
        if h.stalled.is_some() || !h.backlog.is_empty() {
            h.parked.push(port);
            return FlowService::Drained;
        }
        let cap = self.buf.len() - HEADROOM;
        for _ in 0..BUDGET {
            let n = match sys::recv(fd, &mut self.buf[HEADROOM..]) {
                Ok(Recv::Packet(n)) => n,
                Ok(Recv::Empty) => 0,
                Ok(Recv::WouldBlock) => return FlowService::Drained,
                Ok(Recv::Closed) => return FlowService::Closed,
                Err(e) => {
                    debug!(port, error = %e, "flow read error");
                    return FlowService::Closed;
                }
            };
            if n > cap {
                if let Some(c) = h.machine.flow_counters_mut(port) {
                    c.drops_out += 1;
                }
                continue;
            }
            let hdr = match h.machine.send_header(port, n) {
                Ok(h) => h,
                Err(e) => {
                    debug!(port, error = %e, "SDU not sent");
                    continue;
                }
            };
            let Some(a) = &mut h.att else {
                h.machine.unsend(port, n);
                continue;
            };
            let sdu = &self.buf[HEADROOM..HEADROOM + n];
            match a.link.send(&[&hdr, sdu]) {
                Ok(()) => {}
                Err(e @ (RingError::Full | RingError::BadIndex { .. })) => {
                    if matches!(e, RingError::BadIndex { .. }) {
                        h.tx_ring_errors += 1;
                    }
                    let mut b = hdr.to_vec();
                    b.extend_from_slice(sdu);
                    h.stalled = Some((port, b));
                    h.parked.push(port);
                    return FlowService::Drained;
                }
                Err(e) => {
                    h.machine.unsend(port, n);
                    debug!(port, error = %e, "SDU not sent");
                }
            }
        }
        FlowService::More
    }

    /// Writes a frame of a normal IPCP on its N-1 flow `port` of shim-hv
    /// IPCP `lower`. A full ring loses it, as a link would.
    pub(super) fn hv_n1_transmit(&mut self, lower: usize, port: PortId, frame: &[u8]) {
        let Imp::ShimHv(h) = &mut self.ipcps[lower].imp else {
            return;
        };
        let Ok(hdr) = h.machine.send_header(port, frame.len()) else {
            return;
        };
        let Some(a) = &mut h.att else {
            h.machine.unsend(port, frame.len());
            return;
        };
        if let Err(e) = a.link.send(&[&hdr, frame]) {
            match e {
                RingError::Full => h.tx_ring_full += 1,
                RingError::BadIndex { .. } => h.tx_ring_errors += 1,
                _ => {}
            }
            h.machine.unsend(port, frame.len());
        }
    }
}
