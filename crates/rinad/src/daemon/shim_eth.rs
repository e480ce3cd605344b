//! The Ethernet side of a shim-eth IPCP: its `AF_PACKET` raw socket, the
//! receive and send paths, and its RIB view.
//!
//! The socket is bound to one interface for every EtherType (`ETH_P_ALL`),
//! so that frames of other VLANs and EtherTypes are seen, ignored and
//! counted by the machine. The 802.1Q tag is written in user space; on
//! receive it is read in band, or from `PACKET_AUXDATA` when the kernel
//! stripped it (it always does on receive, there being no VLAN device).
//! Our own transmissions are not looped back (`PACKET_IGNORE_OUTGOING`,
//! and `PACKET_OUTGOING` frames are skipped on older kernels). Frames of
//! the VLANs of the *other* shim-eth IPCPs on the same interface are
//! dropped in the kernel by a socket filter (they are that IPCP's traffic,
//! not foreign frames), so each frame is read once by the daemon; frames of
//! VLANs nobody here serves still reach every IPCP, which counts them.
//!
//! Back-pressure: when the socket's send buffer is full (the qdisc holds
//! what it took), frames wait in order, application flows of the IPCP stop
//! being read and the N-1 ports of normal IPCPs over it are blocked (their
//! PDUs wait in their RMT) until the socket is writable again, as for
//! shim-udp.

use super::shim::STALL_MAX;
use super::*;
use crate::config::IpcpKind;
use rina_core::shim_eth::{self as core_eth, ShimEth};
use rina_core::system::{PduBuf, Rx};
use rina_wire::shim_eth::MacAddr;
use std::ffi::CString;
use std::mem::{size_of, zeroed};
use std::os::fd::{FromRawFd, RawFd};

/// Receive buffer asked for on each packet socket.
const ETH_RCVBUF: usize = 4 << 20;

/// A shim-eth IPCP's socket.
pub(super) struct EthIo {
    pub sock: OwnedFd,
    pub interface: String,
    /// Frames the kernel refused for reasons other than a full buffer.
    pub send_errors: u64,
    /// Frames lost because too many waited for a full send buffer.
    pub send_full: u64,
    /// Frames received that were larger than the interface's MTU when
    /// the IPCP started (its MTU was raised since): cut short by the
    /// kernel, so dropped.
    pub rx_too_large: u64,
    /// Frames of this turn of the loop, sent together at its end
    /// ([`Daemon::flush_eth`]).
    pub out: Vec<PduBuf>,
    /// `sendmmsg` calls made.
    pub tx_syscalls: u64,
    /// Frames waiting for the socket to become writable, in order.
    pub stalled: VecDeque<PduBuf>,
    /// Flows whose reading waits for the stall to end.
    pub parked: Vec<PortId>,
    /// Already in the ready queue.
    pub rx_queued: bool,
    /// Link emulation on transmit (`tx_delay_us`, `tx_loss`), if configured.
    pub impair: Option<Impair>,
    /// Whether the interface is up with a carrier, as last seen.
    pub link_up: bool,
    /// When to look at the interface's state next ([`LINK_CHECK`]).
    pub link_check: Instant,
}

/// How often the state of a shim-eth IPCP's interface is read at least: a
/// carrier lost (a cable pulled, the peer's end of a veth down) or found
/// again is seen at once from the kernel's announcement
/// ([`super::link_watch`]), or within this if that is missed. An interface
/// set down here is also seen by the error its packet socket reports.
const LINK_CHECK: Duration = Duration::from_secs(1);

/// Whether interface `name` is up and has a carrier (`IFF_UP` and
/// `IFF_RUNNING`), asked on socket `fd`; `None` if the kernel does not say.
fn link_running(fd: RawFd, name: &str) -> Option<bool> {
    let mut req = ifreq_for(name)?;
    // SAFETY: fd is a socket, req a valid ifreq naming the interface.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS as _, &mut req) } != 0 {
        return None;
    }
    // SAFETY: SIOCGIFFLAGS filled ifru_flags.
    let flags = i32::from(unsafe { req.ifr_ifru.ifru_flags });
    let want = libc::IFF_UP | libc::IFF_RUNNING;
    Some(flags & want == want)
}

/// Link emulation in the transmit path: every frame sent is dropped with
/// probability `loss` (a xorshift64* stream from the configured seed), and
/// the others leave `delay` later from a sender thread (order kept: the
/// delay is the same for every frame). At most [`DELAY_QUEUE_MAX`] frames
/// wait for the thread; those beyond, and frames the kernel refuses then,
/// are lost as on a congested link.
pub(super) struct Impair {
    loss: f64,
    rng: u64,
    /// Frames dropped by the emulated loss.
    pub dropped: u64,
    /// Frames dropped because [`DELAY_QUEUE_MAX`] already waited.
    pub delay_queue_full: u64,
    delay: std::time::Duration,
    line: Option<std::sync::mpsc::SyncSender<(std::time::Instant, Vec<u8>)>>,
}

/// Most frames waiting out `tx_delay_us` in the sender thread (ten times
/// netem's default queue; at most 90 MB of jumbo frames): a delay longer
/// than the link drains in that many frames drops the rest, counted
/// (`tx_delay_queue_full`), rather than holding every frame sent.
pub(super) const DELAY_QUEUE_MAX: usize = 10_000;

impl Impair {
    fn new(fd: RawFd, delay_us: u64, loss: f64, seed: u64) -> io::Result<Impair> {
        let delay = std::time::Duration::from_micros(delay_us);
        let line = if delay.is_zero() {
            None
        } else {
            // SAFETY: dup of a valid descriptor; the copy is owned by the thread.
            let dup = unsafe { libc::dup(fd) };
            if dup < 0 {
                return Err(last_err());
            }
            // SAFETY: `dup` is a fresh descriptor nobody else owns.
            let own = unsafe { OwnedFd::from_raw_fd(dup) };
            let (tx, rx) =
                std::sync::mpsc::sync_channel::<(std::time::Instant, Vec<u8>)>(DELAY_QUEUE_MAX);
            std::thread::Builder::new()
                .name("shim-eth-delay".into())
                .spawn(move || {
                    while let Ok((due, frame)) = rx.recv() {
                        let now = std::time::Instant::now();
                        if due > now {
                            std::thread::sleep(due - now);
                        }
                        let _ = send_frame(own.as_raw_fd(), &[&frame]);
                    }
                })?;
            Some(tx)
        };
        Ok(Impair {
            loss,
            rng: seed.max(1),
            dropped: 0,
            delay_queue_full: 0,
            delay,
            line,
        })
    }

    /// Sends (or drops, or delays) one frame made of `parts`.
    fn send(&mut self, fd: RawFd, parts: &[&[u8]]) -> TxResult {
        if self.loss > 0.0 {
            // xorshift64*
            self.rng ^= self.rng >> 12;
            self.rng ^= self.rng << 25;
            self.rng ^= self.rng >> 27;
            let x = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d);
            if ((x >> 11) as f64 / (1u64 << 53) as f64) < self.loss {
                self.dropped += 1;
                return TxResult::Sent;
            }
        }
        match &self.line {
            None => send_frame(fd, parts),
            Some(tx) => {
                let frame = (std::time::Instant::now() + self.delay, parts.concat());
                if let Err(std::sync::mpsc::TrySendError::Full(_)) = tx.try_send(frame) {
                    self.delay_queue_full += 1;
                }
                TxResult::Sent
            }
        }
    }
}

/// Sends a frame through `impair` if there is one, else directly.
pub(super) fn transmit(fd: RawFd, impair: &mut Option<Impair>, parts: &[&[u8]]) -> TxResult {
    match impair {
        Some(i) => i.send(fd, parts),
        None => send_frame(fd, parts),
    }
}

fn last_err() -> io::Error {
    io::Error::last_os_error()
}

/// Index, MAC and MTU of interface `name`.
fn interface_info(fd: RawFd, name: &str) -> io::Result<(i32, MacAddr, u32)> {
    let c = CString::new(name).map_err(|_| io::Error::other("interface name holds a NUL"))?;
    let mut req = ifreq_for(name).ok_or_else(|| io::Error::other("interface name is too long"))?;
    // SAFETY: a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if index == 0 {
        return Err(last_err());
    }
    // SAFETY: fd is a socket, req a valid ifreq naming the interface.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR as _, &mut req) } != 0 {
        return Err(last_err());
    }
    let mut mac = [0u8; 6];
    // SAFETY: SIOCGIFHWADDR filled ifru_hwaddr.
    let data = unsafe { req.ifr_ifru.ifru_hwaddr.sa_data };
    for (d, s) in mac.iter_mut().zip(data.iter()) {
        *d = *s as u8;
    }
    // SAFETY: as above.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFMTU as _, &mut req) } != 0 {
        return Err(last_err());
    }
    // SAFETY: SIOCGIFMTU filled ifru_mtu.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    Ok((index as i32, MacAddr(mac), mtu.max(0) as u32))
}

/// An `ifreq` naming interface `name` (NUL-terminated), if the name fits.
fn ifreq_for(name: &str) -> Option<libc::ifreq> {
    if name.len() >= libc::IFNAMSIZ {
        return None;
    }
    // SAFETY: ifreq is plain data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    Some(req)
}

fn set_int(fd: RawFd, level: i32, opt: i32, v: i32) -> io::Result<()> {
    // SAFETY: a valid pointer to an int of the given size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&v as *const i32).cast(),
            size_of::<i32>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(last_err())
    }
}

/// A classic BPF program that drops frames tagged (out of band, as the
/// kernel leaves them on receive) with one of `vlans`, and keeps the rest.
fn sibling_filter(vlans: &[u16]) -> Vec<libc::sock_filter> {
    const LD_ABS_W: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const AND_K: u16 = 0x54; // BPF_ALU | BPF_AND | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const SKF_AD_OFF: i32 = -0x1000;
    const SKF_AD_VLAN_TAG: i32 = 44;
    const SKF_AD_VLAN_TAG_PRESENT: i32 = 48;
    let ins = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let n = vlans.len().min(200);
    let mut p = vec![
        ins(
            LD_ABS_W,
            0,
            0,
            (SKF_AD_OFF + SKF_AD_VLAN_TAG_PRESENT) as u32,
        ),
        // No tag: keep (jump to the accept at 4 + n).
        ins(JEQ_K, (n + 2) as u8, 0, 0),
        ins(LD_ABS_W, 0, 0, (SKF_AD_OFF + SKF_AD_VLAN_TAG) as u32),
        ins(AND_K, 0, 0, 0x0fff),
    ];
    for (k, &v) in vlans[..n].iter().enumerate() {
        // A sibling's VLAN: jump to the drop at 5 + n.
        p.push(ins(JEQ_K, (n - k) as u8, 0, v as u32));
    }
    p.push(ins(RET_K, 0, 0, u32::MAX));
    p.push(ins(RET_K, 0, 0, 0));
    p
}

/// A non-blocking `AF_PACKET` raw socket bound to `interface` for every
/// EtherType, with auxiliary data on, that does not receive frames of the
/// VLANs in `siblings`; its MAC and MTU.
pub(super) fn open_socket(
    interface: &str,
    siblings: &[u16],
) -> io::Result<(OwnedFd, MacAddr, u32)> {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket call.
    let raw = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            proto as i32,
        )
    };
    if raw < 0 {
        return Err(last_err());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let (index, mac, mtu) = interface_info(raw, interface)?;
    if !siblings.is_empty() {
        let prog = sibling_filter(siblings);
        let fprog = libc::sock_fprog {
            len: prog.len() as u16,
            filter: prog.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: fprog points at `prog`, alive for the call; the kernel copies it.
        let r = unsafe {
            libc::setsockopt(
                raw,
                libc::SOL_SOCKET,
                libc::SO_ATTACH_FILTER,
                (&fprog as *const libc::sock_fprog).cast(),
                size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(last_err());
        }
    }
    // SAFETY: sockaddr_ll is plain data.
    let mut sll: libc::sockaddr_ll = unsafe { zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = index;
    // SAFETY: a valid sockaddr_ll and its size.
    let r = unsafe {
        libc::bind(
            raw,
            (&sll as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(last_err());
    }
    set_int(raw, libc::SOL_PACKET, libc::PACKET_AUXDATA, 1)?;
    // Older kernels lack it; outgoing frames are then skipped by type.
    let _ = set_int(raw, libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, 1);
    // Past net.core.rmem_max when allowed (root), else up to it.
    if set_int(
        raw,
        libc::SOL_SOCKET,
        libc::SO_RCVBUFFORCE,
        ETH_RCVBUF as i32,
    )
    .is_err()
    {
        let _ = set_int(raw, libc::SOL_SOCKET, libc::SO_RCVBUF, ETH_RCVBUF as i32);
    }
    Ok((fd, mac, mtu))
}

/// Most frames taken from the socket by one `recvmmsg`.
const RX_BATCH: usize = 32;

/// The VLAN id in the `PACKET_AUXDATA` control message of `msg`, if any.
///
/// # Safety
/// `msg` must be a header the kernel just filled by a receive into live
/// buffers (its control pointer and length describe what it wrote).
unsafe fn aux_vlan(msg: &libc::msghdr) -> Option<u16> {
    let mut vlan = None;
    let mut c = libc::CMSG_FIRSTHDR(msg);
    while !c.is_null() {
        if (*c).cmsg_level == libc::SOL_PACKET
            && (*c).cmsg_type == libc::PACKET_AUXDATA
            && (*c).cmsg_len as usize
                >= libc::CMSG_LEN(size_of::<libc::tpacket_auxdata>() as u32) as usize
        {
            let aux: libc::tpacket_auxdata = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
            if aux.tp_status & libc::TP_STATUS_VLAN_VALID != 0 || aux.tp_vlan_tci != 0 {
                vlan = Some(aux.tp_vlan_tci & 0x0fff);
            }
        }
        c = libc::CMSG_NXTHDR(msg, c);
    }
    vlan
}

/// Receives up to [`RX_BATCH`] frames without blocking, into `buf` cut in
/// slots of `slot` bytes. For each received message, in order: its length
/// and out-of-band VLAN, or `None` for one to skip (our own transmission,
/// or larger than a slot). An empty result means nothing was waiting.
/// Returns how many were larger than a slot (cut short by the kernel).
fn recv_batch(
    fd: RawFd,
    buf: &mut [u8],
    slot: usize,
    out: &mut Vec<Option<(usize, Option<u16>)>>,
) -> io::Result<u64> {
    out.clear();
    let n = (buf.len() / slot.max(1)).clamp(1, RX_BATCH);
    let slot = slot.min(buf.len());
    // SAFETY: plain data, all zeroes is valid.
    let mut from: [libc::sockaddr_ll; RX_BATCH] = unsafe { zeroed() };
    // u64 words keep each control buffer aligned for cmsghdr.
    let mut ctrl = [[0u64; 8]; RX_BATCH];
    // SAFETY: plain data.
    let mut iov: [libc::iovec; RX_BATCH] = unsafe { zeroed() };
    // SAFETY: plain data.
    let mut msgs: [libc::mmsghdr; RX_BATCH] = unsafe { zeroed() };
    let base = buf.as_mut_ptr();
    for k in 0..n {
        iov[k] = libc::iovec {
            // SAFETY: k * slot + slot <= n * slot <= buf.len().
            iov_base: unsafe { base.add(k * slot) }.cast(),
            iov_len: slot,
        };
        let h = &mut msgs[k].msg_hdr;
        h.msg_name = (&mut from[k] as *mut libc::sockaddr_ll).cast();
        h.msg_namelen = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        h.msg_iov = &mut iov[k];
        h.msg_iovlen = 1;
        h.msg_control = ctrl[k].as_mut_ptr().cast();
        h.msg_controllen = size_of::<[u64; 8]>() as _;
    }
    // SAFETY: every header points at live buffers of the stated sizes.
    let got = unsafe {
        libc::recvmmsg(
            fd,
            msgs.as_mut_ptr(),
            n as u32,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    if got < 0 {
        let e = last_err();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
            _ => Err(e),
        };
    }
    let mut too_large = 0;
    for (k, m) in msgs.iter().enumerate().take(got as usize) {
        let len = m.msg_len as usize;
        if from[k].sll_pkttype == libc::PACKET_OUTGOING {
            out.push(None);
            continue;
        }
        if m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
            too_large += 1;
            out.push(None);
            continue;
        }
        // SAFETY: the kernel just filled this header.
        out.push(Some((len, unsafe { aux_vlan(&m.msg_hdr) })));
    }
    Ok(too_large)
}

/// Outcome of a send.
pub(super) enum TxResult {
    Sent,
    /// The send buffer is full.
    Full,
    /// Refused for another reason.
    Failed(io::Error),
}

/// Sends `parts` as one frame.
fn send_frame(fd: RawFd, parts: &[&[u8]]) -> TxResult {
    let iov: Vec<libc::iovec> = parts
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut _,
            iov_len: p.len(),
        })
        .collect();
    // SAFETY: plain data.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut _;
    msg.msg_iovlen = iov.len() as _;
    // SAFETY: the iovecs point at live slices; the kernel only reads them.
    let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT) };
    if r >= 0 {
        return TxResult::Sent;
    }
    let e = last_err();
    match e.kind() {
        io::ErrorKind::WouldBlock => TxResult::Full,
        _ => TxResult::Failed(e),
    }
}

/// Most frames handed to the kernel by one `sendmmsg`.
const TX_BATCH: usize = 64;

/// What one [`send_batch`] did.
struct BatchOutcome {
    /// Frames the kernel took.
    sent: usize,
    /// Frames it refused for good (each counted once).
    failed: usize,
    /// It stopped at a full send buffer: the frames after
    /// `sent + failed` were not tried.
    blocked: bool,
    /// The last refusal, for the log.
    error: Option<io::Error>,
    /// `sendmmsg` calls made.
    calls: u64,
}

/// Sends `frames` in order, [`TX_BATCH`] to a `sendmmsg`, until they are
/// all gone or the socket is full. A frame the kernel refuses for another
/// reason is counted and skipped.
fn send_batch<F: AsRef<[u8]>>(fd: RawFd, frames: &[F]) -> BatchOutcome {
    let mut o = BatchOutcome {
        sent: 0,
        failed: 0,
        blocked: false,
        error: None,
        calls: 0,
    };
    let mut iov: Vec<libc::iovec> = Vec::with_capacity(TX_BATCH);
    // SAFETY: plain data.
    let mut msgs: Vec<libc::mmsghdr> = Vec::with_capacity(TX_BATCH);
    while o.sent + o.failed < frames.len() {
        let rest = &frames[o.sent + o.failed..];
        let n = rest.len().min(TX_BATCH);
        iov.clear();
        iov.extend(rest[..n].iter().map(|f| libc::iovec {
            iov_base: f.as_ref().as_ptr() as *mut _,
            iov_len: f.as_ref().len(),
        }));
        msgs.clear();
        for v in iov.iter_mut() {
            // SAFETY: plain data.
            let mut m: libc::mmsghdr = unsafe { zeroed() };
            m.msg_hdr.msg_iov = v;
            m.msg_hdr.msg_iovlen = 1;
            msgs.push(m);
        }
        o.calls += 1;
        // SAFETY: each header points at one live iovec over a live frame;
        // the kernel only reads them (and writes `msg_len`).
        let r =
            unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), n as libc::c_uint, libc::MSG_DONTWAIT) };
        if r > 0 {
            o.sent += r as usize;
            continue;
        }
        let e = last_err();
        if e.kind() == io::ErrorKind::WouldBlock {
            o.blocked = true;
            return o;
        }
        // The first frame of the batch was refused: skip it.
        o.failed += 1;
        o.error = Some(e);
    }
    o
}

/// The machine configuration and socket of the shim-eth IPCP of entry `c`
/// of configuration `cfg`, registered with the poller as member `i`.
pub(super) fn new_ipcp(
    ic: &crate::config::IpcpConfig,
    all: &[crate::config::IpcpConfig],
    poll: &Poll,
    i: usize,
) -> Result<(core_eth::Config, Io), DaemonError> {
    let name = ic.name.get_ref().clone();
    let interface = ic.interface.clone().unwrap_or_default();
    let vlan = ic.shim_eth_vlan();
    let siblings: Vec<u16> = all
        .iter()
        .filter(|o| o.kind == IpcpKind::ShimEth && o.interface == ic.interface)
        .filter_map(|o| o.shim_eth_vlan())
        .filter(|&v| Some(v) != vlan)
        .collect();
    let (sock, mac, mtu) = open_socket(&interface, &siblings).map_err(io_ctx(format!(
        "IPCP {name}: cannot open a raw socket on interface {interface:?} (root or CAP_NET_RAW is needed)"
    )))?;
    poll.registry()
        .register(
            &mut SourceFd(&sock.as_raw_fd()),
            token(T_ETH, i),
            Interest::READABLE,
        )
        .map_err(io_ctx("poll register"))?;
    let impair = match (
        ic.tx_delay_us.as_ref().map_or(0, |d| *d.get_ref()),
        ic.tx_loss.unwrap_or(0.0),
    ) {
        (0, l) if l <= 0.0 => None,
        (d, l) => Some(
            Impair::new(sock.as_raw_fd(), d, l, ic.tx_seed.unwrap_or(1))
                .map_err(io_ctx(format!("IPCP {name}: link emulation thread")))?,
        ),
    };
    let mut cfg = core_eth::Config::new(ic.dif.clone(), vlan, mac, mtu);
    if let Some(m) = &ic.max_flows {
        cfg.max_flows = *m.get_ref();
    }
    info!(ipcp = %name, dif = %ic.dif, %interface, %mac, vlan = vlan.unwrap_or(0), mtu,
        max_sdu = cfg.max_sdu(), "shim-eth IPCP up");
    let io = Io::Eth(Box::new(EthIo {
        sock,
        interface,
        send_errors: 0,
        send_full: 0,
        rx_too_large: 0,
        out: Vec::new(),
        tx_syscalls: 0,
        stalled: VecDeque::new(),
        parked: Vec::new(),
        rx_queued: false,
        impair,
        link_up: true,
        link_check: Instant::ZERO,
    }));
    Ok((cfg, io))
}

impl EthIo {
    /// Sends `frames` in order until they are gone or the socket is full:
    /// through the link emulation frame by frame if there is one, else in
    /// `sendmmsg` batches. Returns how many were taken (sent, or refused
    /// for good and counted) and whether it stopped at a full socket.
    fn send_now<F: AsRef<[u8]>>(&mut self, frames: &[F]) -> (usize, bool) {
        if self.impair.is_none() {
            let o = send_batch(self.sock.as_raw_fd(), frames);
            self.tx_syscalls += o.calls;
            self.send_errors += o.failed as u64;
            if let Some(e) = &o.error {
                debug!(interface = %self.interface, error = %e, "frame not sent");
            }
            return (o.sent + o.failed, o.blocked);
        }
        for (n, f) in frames.iter().enumerate() {
            match transmit(self.sock.as_raw_fd(), &mut self.impair, &[f.as_ref()]) {
                TxResult::Sent => {}
                TxResult::Full => return (n, true),
                TxResult::Failed(e) => {
                    self.send_errors += 1;
                    debug!(interface = %self.interface, error = %e, "frame not sent");
                }
            }
        }
        (frames.len(), false)
    }

    /// Keeps frames for when the socket is writable again, at most
    /// [`STALL_MAX`]; beyond that they are lost (counted).
    fn stall(&mut self, rest: impl Iterator<Item = PduBuf>) {
        for f in rest {
            if self.stalled.len() < STALL_MAX {
                self.stalled.push_back(f);
            } else {
                self.send_full += 1;
            }
        }
    }

    /// Its address, for listings.
    pub fn address(&self, m: &ShimEth) -> String {
        let c = m.config();
        match c.vlan {
            Some(v) => format!("{} {} vlan {v}", self.interface, c.mac),
            None => format!("{} {} untagged", self.interface, c.mac),
        }
    }

    /// Its RIB: address, ARP cache and flows with their counters.
    pub fn rib(&self, m: &ShimEth, now: Instant) -> rina_core::rib::Rib {
        use rina_core::rib::{self, ObjValue, Rib};
        let mut r = Rib::new(rib::Config::default());
        let put = |r: &mut Rib, name: String, class: &str, v: ObjValue, owner| {
            let _ = r.create_with_parents(&name, class, v, owner);
        };
        put(
            &mut r,
            "/shim/addr".into(),
            "address",
            ObjValue::Str(self.address(m)),
            rib::OwnerId::NAMESPACE_MANAGER,
        );
        if let Some(app) = m.registered() {
            put(
                &mut r,
                "/shim/app".into(),
                "RegisteredApplication",
                ObjValue::Str(app.to_string()),
                rib::OwnerId::NAMESPACE_MANAGER,
            );
        }
        for (name, e) in m.arp_cache() {
            let left = e.expires.saturating_since(now).as_secs();
            put(
                &mut r,
                format!("/shim/arp/key={name}"),
                "ArpEntry",
                ObjValue::Str(format!("{} (expires in {left}s)", e.mac)),
                rib::OwnerId::NAMESPACE_MANAGER,
            );
        }
        for (port, f) in m.flows() {
            let base = format!("/shim/flows/pid={port}");
            let peer = f.peer.map_or("resolving".to_string(), |m| m.to_string());
            put(
                &mut r,
                base.clone(),
                "Flow",
                ObjValue::Str(format!("{} -> {} at {peer}", f.local, f.remote)),
                rib::OwnerId::FLOW_ALLOCATOR,
            );
            let c = f.counters;
            for (k, v) in [
                ("sdus_in", c.sdus_in),
                ("bytes_in", c.bytes_in),
                ("sdus_out", c.sdus_out),
                ("bytes_out", c.bytes_out),
                ("drops_in", c.drops_in),
                ("drops_out", c.drops_out),
            ] {
                put(
                    &mut r,
                    format!("{base}/{k}"),
                    "counter",
                    ObjValue::Int(v as i64),
                    rib::OwnerId::FLOW_ALLOCATOR,
                );
            }
        }
        r
    }
}

impl Daemon {
    /// When the state of a shim-eth IPCP's interface is to be read next.
    pub(super) fn eth_timeout(&self) -> Option<Instant> {
        self.ipcps
            .iter()
            .filter_map(|ip| match &ip.io {
                Io::Eth(e) => Some(e.link_check),
                _ => None,
            })
            .min()
    }

    /// The kernel announced link changes ([`super::link_watch`]): every
    /// interface's state is read now.
    pub(super) fn on_link_news(&mut self) {
        if !self.links.as_ref().is_some_and(|w| w.drain()) {
            return;
        }
        let now = self.now();
        for ip in &mut self.ipcps {
            if let Io::Eth(e) = &mut ip.io {
                e.link_check = now;
            }
        }
        self.eth_link_checks(now);
    }

    /// Reads the state of the interfaces whose look is due: a link that
    /// went down or came back is told to the system.
    pub(super) fn eth_link_checks(&mut self, now: Instant) {
        for i in 0..self.ipcps.len() {
            let Io::Eth(e) = &mut self.ipcps[i].io else {
                continue;
            };
            if e.link_check > now {
                continue;
            }
            e.link_check = now + LINK_CHECK;
            if let Some(up) = link_running(e.sock.as_raw_fd(), &e.interface) {
                self.eth_link(i, up);
            }
        }
    }

    /// The link of shim-eth IPCP `i` is `up` (or not): a change tears the
    /// N-1 flows over it down at once, so routing goes around it, or sets
    /// them up again ([`System::medium_down`], [`System::medium_up`]).
    fn eth_link(&mut self, i: usize, up: bool) {
        let ip = &mut self.ipcps[i];
        let Io::Eth(e) = &mut ip.io else {
            return;
        };
        if e.link_up == up {
            return;
        }
        e.link_up = up;
        info!(ipcp = %ip.name, interface = %e.interface, up, "link state");
        let now = self.now();
        if up {
            self.sys.medium_up(now, i);
        } else {
            self.sys.medium_down(now, i);
        }
    }

    /// Receives up to [`BUDGET`] frames of shim-eth IPCP `i`, a batch at a
    /// time; true if there may be more.
    pub(super) fn service_eth(&mut self, i: usize) -> bool {
        let now = self.now();
        let mut batch = Vec::with_capacity(RX_BATCH);
        let mut taken = 0;
        let Some(Machine::ShimEth(m)) = self.machine(i) else {
            return false;
        };
        // Room for the largest frame: MTU, headers, a stray second tag.
        let slot = (m.config().mtu as usize + 64).next_multiple_of(64);
        while taken < BUDGET {
            let Io::Eth(ip) = &mut self.ipcps[i].io else {
                return false;
            };
            match recv_batch(ip.sock.as_raw_fd(), &mut self.buf, slot, &mut batch) {
                Ok(too_large) => ip.rx_too_large += too_large,
                Err(e) => {
                    if e.raw_os_error() == Some(libc::ENETDOWN) {
                        // The interface was set down: its socket says so once.
                        self.eth_link(i, false);
                    } else {
                        debug!(ipcp = %self.ipcps[i].name, error = %e, "packet receive error");
                    }
                    return true;
                }
            }
            if batch.is_empty() {
                return false;
            }
            taken += batch.len();
            for (k, m) in batch.iter().enumerate() {
                let Some((len, vlan)) = *m else {
                    continue;
                };
                let rx = Rx::Eth {
                    frame: &self.buf[k * slot..k * slot + len],
                    aux_vlan: vlan,
                };
                if let Some((port, sdu)) = self.sys.receive(now, i, rx) {
                    super::shim::straight_to_app(&mut self.flows, &mut self.sys, i, port, sdu);
                }
            }
        }
        true
    }

    /// Sends a frame of shim-eth IPCP `i` (ARP, or a frame of a normal
    /// IPCP above) with the others of this turn of the loop. A full socket
    /// keeps it, in order, and blocks the N-1 ports over it until the
    /// socket is writable.
    pub(super) fn eth_send(&mut self, i: usize, frame: PduBuf) {
        let Io::Eth(ip) = &mut self.ipcps[i].io else {
            return;
        };
        if !ip.stalled.is_empty() {
            ip.stall(std::iter::once(frame));
            return;
        }
        if ip.out.is_empty() {
            self.udp.dirty.push(i);
        }
        ip.out.push(frame);
        if ip.out.len() >= BUDGET {
            self.flush_eth(i);
        }
    }

    /// Sends the frames gathered for shim-eth IPCP `i`.
    pub(super) fn flush_eth(&mut self, i: usize) {
        let Io::Eth(ip) = &mut self.ipcps[i].io else {
            return;
        };
        if ip.out.is_empty() {
            return;
        }
        let mut out = std::mem::take(&mut ip.out);
        let (taken, blocked) = ip.send_now(&out);
        if blocked {
            ip.stall(out.drain(taken..));
        }
        out.clear();
        ip.out = out;
        if blocked {
            self.eth_blocked(i);
        }
    }

    /// Sends frames of application flow `port` on shim-eth IPCP `i`; true
    /// if the socket is full (what it did not take waits, and the flow
    /// with it).
    pub(super) fn send_eth_frames(&mut self, i: usize, port: PortId, frames: &[&[u8]]) -> bool {
        let Io::Eth(ip) = &mut self.ipcps[i].io else {
            return false;
        };
        let (sent, blocked) = ip.send_now(frames);
        if !blocked {
            return false;
        }
        ip.stall(frames[sent..].iter().map(|f| PduBuf::from(f.to_vec())));
        if !ip.parked.contains(&port) {
            ip.parked.push(port);
        }
        self.eth_blocked(i);
        true
    }

    /// The socket of shim-eth IPCP `i` is full: wait until it is writable,
    /// and tell the system.
    fn eth_blocked(&mut self, i: usize) {
        let Io::Eth(ip) = &mut self.ipcps[i].io else {
            return;
        };
        let _ = self.poll.registry().reregister(
            &mut SourceFd(&ip.sock.as_raw_fd()),
            token(T_ETH, i),
            Interest::READABLE | Interest::WRITABLE,
        );
        let now = self.now();
        self.sys.medium_blocked(now, i);
    }

    /// The socket of shim-eth IPCP `i` is writable again: send what waited,
    /// read the parked flows and open the N-1 ports over it.
    pub(super) fn eth_unstall(&mut self, i: usize) {
        let Io::Eth(ip) = &mut self.ipcps[i].io else {
            return;
        };
        let mut waiting = std::mem::take(&mut ip.stalled);
        let (taken, blocked) = ip.send_now(waiting.make_contiguous());
        waiting.drain(..taken);
        ip.stalled = waiting;
        if blocked {
            return;
        }
        let _ = self.poll.registry().reregister(
            &mut SourceFd(&ip.sock.as_raw_fd()),
            token(T_ETH, i),
            Interest::READABLE,
        );
        for port in std::mem::take(&mut ip.parked) {
            self.mark_flow_ready(port);
        }
        let now = self.now();
        self.sys.medium_writable(now, i);
        self.drain_outputs();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames sent faster than a long `tx_delay_us` lets them go wait in
    /// a bounded queue: beyond [`DELAY_QUEUE_MAX`] they are dropped and
    /// counted, not held in memory without end.
    #[test]
    fn the_delay_line_holds_a_bounded_number_of_frames() {
        let (a, _b) = std::os::unix::net::UnixDatagram::pair().unwrap();
        let mut imp = Impair::new(a.as_raw_fd(), 1_000_000, 0.0, 1).unwrap();
        let frame = [0u8; 64];
        let extra = 100;
        for _ in 0..DELAY_QUEUE_MAX + extra {
            imp.send(a.as_raw_fd(), &[&frame]);
        }
        // The thread may have taken one frame out to wait on it.
        assert!(
            (extra as u64 - 1..=extra as u64).contains(&imp.delay_queue_full),
            "{} frames dropped",
            imp.delay_queue_full
        );
    }
}
