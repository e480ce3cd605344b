//! Batched UDP for shim-udp IPCPs: many datagrams per system call.
//!
//! Sending, a run of datagrams of one size to one peer goes as one
//! segmentation-offload send (`UDP_SEGMENT`: the kernel cuts it into the
//! same datagrams on the wire, on loopback not at all), and the runs of a
//! batch go in one `sendmmsg`. Receiving, the socket asks for coalescing
//! (`UDP_GRO`): one read returns consecutive datagrams of one sender glued
//! together with their size, and `recvmmsg` reads many such at once. What
//! goes on the wire is the same datagrams as one `sendto` each; a peer
//! without either still talks to us.
//!
//! Where the kernel refuses an offload (an old kernel, a path whose MTU is
//! smaller than a datagram) the socket falls back to one datagram per
//! message, still batched.

use nix::sys::socket::{SockaddrLike, SockaddrStorage};
use rina_core::buf::{self, PduBuf};
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;

/// `SOL_UDP` socket options (linux/udp.h).
const SOL_UDP: libc::c_int = 17;
/// Segmentation offload: the size of the datagrams one send is cut into.
const UDP_SEGMENT: libc::c_int = 103;
/// Receive offload: deliver coalesced datagrams with their size.
const UDP_GRO: libc::c_int = 104;
/// Datagrams in one offload send at most (the kernel's `UDP_MAX_SEGMENTS`).
const GSO_MAX_SEGMENTS: usize = 64;
/// Bytes in one offload send at most (an IP packet's payload less headers).
const GSO_MAX_BYTES: usize = 65_000;
/// Messages in one `sendmmsg` or `recvmmsg`.
const MAX_MSGS: usize = 64;
/// Receive messages (each holds a coalesced read of up to 64 KiB).
pub const RX_SLOTS: usize = 16;
/// Bytes per receive message.
const RX_SLOT: usize = 65_536;
/// Room for one control message of an `int` (also fits a `u16`).
type CmsgBuf = [u64; 4];

/// What became of a batch handed to [`Sender::send`].
#[derive(Debug, Default)]
pub struct SendOutcome {
    /// Datagrams the kernel took, from the front of the batch.
    pub sent: usize,
    /// Datagrams refused for another reason than a full socket (lost).
    pub failed: usize,
    /// The socket is full: the datagrams after `sent + failed` wait.
    pub blocked: bool,
    /// The last refusal other than a full socket, for the log.
    pub error: Option<io::Error>,
}

/// Reused buffers of `sendmmsg` for one socket.
pub struct Sender {
    /// Whether segmentation offload is still believed to work.
    gso: bool,
    /// The largest datagram sent in a segmented run (smaller than the
    /// smallest size the kernel refused to segment).
    gso_max: usize,
    /// `sendmmsg` calls made.
    calls: u64,
    iovs: Vec<libc::iovec>,
    addrs: Vec<SockaddrStorage>,
    cmsgs: Vec<CmsgBuf>,
    msgs: Vec<libc::mmsghdr>,
    /// Datagrams per message of the batch being built.
    groups: Vec<usize>,
}

impl Default for Sender {
    fn default() -> Self {
        Sender::new()
    }
}

impl Sender {
    pub fn new() -> Sender {
        Sender {
            gso: true,
            gso_max: usize::MAX,
            calls: 0,
            iovs: Vec::new(),
            addrs: Vec::new(),
            cmsgs: Vec::new(),
            msgs: Vec::new(),
            groups: Vec::new(),
        }
    }

    /// Whether runs are still sent with segmentation offload.
    pub fn offload(&self) -> bool {
        self.gso
    }

    /// System calls made to send.
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// Sends `frames` in order, without blocking, as few system calls as
    /// the kernel allows.
    pub fn send<F: AsRef<[u8]>>(&mut self, fd: RawFd, frames: &[(SocketAddr, F)]) -> SendOutcome {
        let mut out = SendOutcome::default();
        let mut done = 0;
        while done < frames.len() {
            self.build(&frames[done..]);
            let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
            self.calls += 1;
            // SAFETY: `msgs` points into `iovs`, `addrs` and `cmsgs`, all
            // built just now for `frames`, which outlive the call; the
            // kernel only reads them (and writes `msg_len`).
            let n = unsafe {
                libc::sendmmsg(
                    fd,
                    self.msgs.as_mut_ptr(),
                    self.msgs.len() as libc::c_uint,
                    flags,
                )
            };
            if n > 0 {
                let k: usize = self.groups[..n as usize].iter().sum();
                done += k;
                out.sent += k;
                continue;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => {
                    out.blocked = true;
                    break;
                }
                Some(libc::EMSGSIZE | libc::EINVAL) if self.groups[0] > 1 => {
                    // Segments larger than the path's MTU (the kernel
                    // will not fragment a segmented send): runs of such
                    // sizes go one datagram per message from now on.
                    let size = frames[done].1.as_ref().len();
                    self.gso_max = self.gso_max.min(size - 1);
                    continue;
                }
                Some(libc::EIO | libc::ENOPROTOOPT | libc::EOPNOTSUPP)
                    if self.gso && self.groups[0] > 1 =>
                {
                    // The kernel or the device cannot segment: go on without.
                    self.gso = false;
                    continue;
                }
                _ => {
                    // The first message is refused; the others may go.
                    done += self.groups[0];
                    out.failed += self.groups[0];
                    out.error = Some(e);
                }
            }
        }
        out
    }

    /// Fills the message vectors for the front of `frames` (at most
    /// [`MAX_MSGS`] messages).
    fn build<F: AsRef<[u8]>>(&mut self, frames: &[(SocketAddr, F)]) {
        self.groups.clear();
        self.addrs.clear();
        let mut i = 0;
        while i < frames.len() && self.groups.len() < MAX_MSGS {
            let peer = frames[i].0;
            let size = frames[i].1.as_ref().len();
            let mut j = i + 1;
            let mut total = size;
            if self.gso && size > 0 && size <= self.gso_max {
                while let Some((p, f)) = frames.get(j) {
                    let l = f.as_ref().len();
                    if *p != peer
                        || l == 0
                        || l > size
                        || j - i == GSO_MAX_SEGMENTS
                        || total + l > GSO_MAX_BYTES
                    {
                        break;
                    }
                    total += l;
                    j += 1;
                    if l < size {
                        // Only the last datagram of a run may be shorter.
                        break;
                    }
                }
            }
            self.groups.push(j - i);
            self.addrs.push(SockaddrStorage::from(peer));
            i = j;
        }
        self.iovs.clear();
        self.iovs
            .extend(frames[..i].iter().map(|(_, f)| libc::iovec {
                iov_base: f.as_ref().as_ptr() as *mut libc::c_void,
                iov_len: f.as_ref().len(),
            }));
        self.cmsgs.clear();
        self.cmsgs.resize(self.groups.len(), [0; 4]);
        self.msgs.clear();
        let mut start = 0;
        for (k, &g) in self.groups.iter().enumerate() {
            // SAFETY: mmsghdr is plain data; all-zero is a valid empty one.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            let a = &self.addrs[k];
            m.msg_hdr.msg_name = a.as_ptr() as *mut libc::c_void;
            m.msg_hdr.msg_namelen = a.len();
            m.msg_hdr.msg_iov = self.iovs[start..].as_mut_ptr();
            m.msg_hdr.msg_iovlen = g as _;
            if g > 1 {
                let size = self.iovs[start].iov_len as u16;
                let c = &mut self.cmsgs[k];
                m.msg_hdr.msg_control = c.as_mut_ptr() as *mut libc::c_void;
                // SAFETY: CMSG_SPACE only computes a size.
                m.msg_hdr.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as _;
                // SAFETY: the control buffer is 32 bytes, aligned for a
                // cmsghdr, and holds one header with two bytes of data.
                unsafe {
                    let h = libc::CMSG_FIRSTHDR(&m.msg_hdr);
                    (*h).cmsg_level = SOL_UDP;
                    (*h).cmsg_type = UDP_SEGMENT;
                    (*h).cmsg_len = libc::CMSG_LEN(2) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(h) as *mut u16, size);
                }
            }
            self.msgs.push(m);
            start += g;
        }
    }
}

/// The smallest and largest datagram size the receive buffers are cut
/// for: every buffer is one of the pool's classes (2,048 or 10,240 bytes
/// with the room), and a message's buffers hold a whole coalesced read
/// (64 KiB) in at most 64.
const RX_CUT_MIN: usize = 1024;
const RX_CUT_MAX: usize = buf::CLASSES[1] - buf::HEADROOM - buf::TAILROOM;

/// The capacity of a receive buffer for datagrams of `cut` bytes.
fn rx_capacity(cut: usize) -> usize {
    let need = buf::HEADROOM + cut + buf::TAILROOM;
    buf::CLASSES
        .into_iter()
        .find(|&c| need <= c)
        .unwrap_or(need)
}

/// An iovec over the `cut` bytes past `b`'s room.
fn iovec_after_room(b: &mut PduBuf, cut: usize) -> libc::iovec {
    let (v, _) = b.parts_mut();
    debug_assert!(v.capacity() - v.len() >= cut);
    libc::iovec {
        // SAFETY: past the room, within the capacity (every receive buffer
        // has room for `cut` bytes after it: `rx_capacity`).
        iov_base: unsafe { v.as_mut_ptr().add(v.len()) } as *mut libc::c_void,
        iov_len: cut,
    }
}

/// Reused buffers of `recvmmsg` for shim-udp sockets.
///
/// Each of the [`RX_SLOTS`] messages reads into a list of PDU buffers
/// (with [`buf::HEADROOM`] in front) of `cut` bytes each, `cut` being the
/// datagram size the last coalesced read had. A coalesced read of
/// datagrams of that size, or a single datagram no larger, then lands one
/// datagram per buffer, and the buffer goes up the stack as the PDU's own:
/// no copy out of the read. Any other read (another size, small datagrams
/// coalesced) is copied out datagram by datagram, and the next reads are
/// cut for its size.
pub struct Receiver {
    cut: usize,
    /// `RX_SLOTS` lists of `per_slot` buffers, each empty past its room.
    bufs: Vec<PduBuf>,
    per_slot: usize,
    iovs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_storage>,
    cmsgs: Vec<CmsgBuf>,
    msgs: Vec<libc::mmsghdr>,
    got: Vec<(Option<SocketAddr>, PduBuf)>,
    /// The cut `iovs` and `msgs` were laid out for (0: not yet).
    built: usize,
    /// Buffers handed up by the last read, to be replaced (with their
    /// iovecs) before the next.
    taken: Vec<usize>,
    /// Messages the kernel filled in the last read, whose lengths and
    /// flags are reset before the next.
    filled: usize,
    /// Datagrams copied out of a read rather than handed up in their buffer.
    copied: u64,
}

impl Default for Receiver {
    fn default() -> Self {
        Receiver::new()
    }
}

impl Receiver {
    pub fn new() -> Receiver {
        Receiver {
            // A datagram of up to 1,888 bytes lands in its own buffer
            // from the first read.
            cut: buf::CLASSES[0] - buf::HEADROOM - buf::TAILROOM,
            bufs: Vec::new(),
            per_slot: 0,
            iovs: Vec::new(),
            names: Vec::new(),
            cmsgs: Vec::new(),
            msgs: Vec::new(),
            got: Vec::new(),
            built: 0,
            taken: Vec::new(),
            filled: 0,
            copied: 0,
        }
    }

    /// Datagrams copied out of a read so far (the rest went up in the
    /// buffer they were read into).
    pub fn copied(&self) -> u64 {
        self.copied
    }

    /// Gives every message `per_slot` buffers of `cut` bytes: new ones in
    /// place of those handed up last time (or of all, with every iovec and
    /// message laid out anew, if the cut changed).
    fn refill(&mut self) {
        let cut = self.cut;
        let fresh = || PduBuf::empty(buf::HEADROOM, rx_capacity(cut) - buf::HEADROOM);
        if self.built == cut {
            // Only what the last read took or wrote changes: a read that
            // found nothing costs no set-up.
            if !self.taken.is_empty() {
                for i in self.taken.drain(..) {
                    self.bufs[i] = fresh();
                    self.iovs[i] = iovec_after_room(&mut self.bufs[i], cut);
                }
                // The headers point at the iovecs afresh after those writes.
                let base = self.iovs.as_mut_ptr();
                for (k, m) in self.msgs.iter_mut().enumerate() {
                    // SAFETY: within `iovs`, which holds RX_SLOTS * per_slot.
                    m.msg_hdr.msg_iov = unsafe { base.add(k * self.per_slot) };
                }
            }
            for m in &mut self.msgs[..self.filled] {
                m.msg_len = 0;
                m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
                m.msg_hdr.msg_controllen = std::mem::size_of::<CmsgBuf>() as _;
                m.msg_hdr.msg_flags = 0;
            }
            self.filled = 0;
            return;
        }
        // Buffers with room enough are kept across a change of cut.
        let per_slot = RX_SLOT.div_ceil(cut);
        self.per_slot = per_slot;
        let spare = |b: &PduBuf| b.capacity() - b.headroom() - b.len();
        for b in &mut self.bufs {
            if !b.is_empty() || spare(b) < cut {
                *b = fresh();
            }
        }
        self.bufs.resize_with(RX_SLOTS * per_slot, fresh);
        self.iovs.clear();
        self.iovs
            .extend(self.bufs.iter_mut().map(|b| iovec_after_room(b, cut)));
        // SAFETY: sockaddr_storage is plain data; zero is valid.
        self.names.resize(RX_SLOTS, unsafe { std::mem::zeroed() });
        self.cmsgs.resize(RX_SLOTS, [0; 4]);
        self.msgs.clear();
        for k in 0..RX_SLOTS {
            // SAFETY: mmsghdr is plain data; all-zero is a valid empty one.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            m.msg_hdr.msg_name = &mut self.names[k] as *mut _ as *mut libc::c_void;
            m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as _;
            // SAFETY: within `iovs`, which holds RX_SLOTS * per_slot.
            m.msg_hdr.msg_iov = unsafe { self.iovs.as_mut_ptr().add(k * per_slot) };
            m.msg_hdr.msg_iovlen = per_slot as _;
            m.msg_hdr.msg_control = self.cmsgs[k].as_mut_ptr() as *mut libc::c_void;
            m.msg_hdr.msg_controllen = std::mem::size_of::<CmsgBuf>() as _;
            self.msgs.push(m);
        }
        self.taken.clear();
        self.filled = 0;
        self.built = cut;
    }

    /// Reads what waits on `fd`, up to [`RX_SLOTS`] coalesced reads, without
    /// blocking; the number of reads (0: nothing waited). Their datagrams
    /// are in [`Receiver::datagrams`] until the next call.
    pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        self.got.clear();
        self.refill();
        let n = loop {
            // SAFETY: every header points into buffers owned by `self`,
            // sized as declared (each iovec is spare capacity of a buffer
            // in `bufs`, untouched until the call returns); no timeout.
            let n = unsafe {
                libc::recvmmsg(
                    fd,
                    self.msgs.as_mut_ptr(),
                    RX_SLOTS as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if n >= 0 {
                self.filled = n as usize;
                break n as usize;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return Ok(0),
                _ => return Err(e),
            }
        };
        let mut next_cut = None;
        for k in 0..n {
            let m = &self.msgs[k];
            let from = sockaddr_of(&self.names[k], m.msg_hdr.msg_namelen);
            let segment = gro_segment(&m.msg_hdr);
            let len = (m.msg_len as usize).min(self.per_slot * self.cut);
            if m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                // Cut short (larger than a read holds): dropped whole.
                continue;
            }
            // The next reads are cut for a coalesced read's datagram size,
            // or for a single datagram too large for the cut (one that fits
            // already lands in a buffer of its own).
            let resize = if segment == 0 {
                len > self.cut
            } else {
                segment != self.cut
            };
            let size = if segment == 0 { len } else { segment };
            if resize && (RX_CUT_MIN..=RX_CUT_MAX).contains(&size) {
                next_cut = Some(size);
            }
            self.take_read(k, from, len, segment);
        }
        if let Some(c) = next_cut {
            self.cut = c;
        }
        Ok(n)
    }

    /// Hands up the datagrams of message `k` (`len` bytes, coalesced in
    /// datagrams of `segment` bytes, 0 for one datagram).
    fn take_read(&mut self, k: usize, from: Option<SocketAddr>, len: usize, segment: usize) {
        let first = k * self.per_slot;
        let cut = self.cut;
        // The buffers the kernel wrote, with the bytes it wrote in each.
        let used = len.div_ceil(cut).max(1);
        for j in 0..used {
            let filled = len.saturating_sub(j * cut).min(cut);
            let (v, _) = self.bufs[first + j].parts_mut();
            // SAFETY: the kernel wrote `len` bytes across the iovecs in
            // order, `cut` into each but the last: these `filled` bytes
            // past the room (within the capacity, as `refill` checked).
            unsafe { v.set_len(v.len() + filled) };
        }
        if segment == cut || (segment == 0 && len <= cut) {
            // One datagram per buffer: each is the datagram's own.
            for j in 0..used {
                let b = std::mem::replace(&mut self.bufs[first + j], PduBuf::from(Vec::new()));
                self.got.push((from, b));
                self.taken.push(first + j);
            }
            return;
        }
        // Laid across the buffers otherwise: copied out one by one.
        let size = if segment == 0 { len.max(1) } else { segment };
        let mut at = 0;
        loop {
            let n = size.min(len - at);
            let mut d = PduBuf::empty(buf::HEADROOM, n + buf::TAILROOM);
            let mut left = n;
            let mut pos = at;
            while left > 0 {
                let (j, off) = (pos / cut, pos % cut);
                let part = &self.bufs[first + j][off..];
                let take = part.len().min(left);
                d.extend_from_slice(&part[..take]);
                (left, pos) = (left - take, pos + take);
            }
            self.got.push((from, d));
            self.copied += 1;
            at += n;
            if at >= len {
                break;
            }
        }
        for j in 0..used {
            self.bufs[first + j].truncate(0);
        }
    }

    /// The datagrams of the last [`Receiver::recv`], in order, each with its
    /// sender, in its own buffer with [`buf::HEADROOM`] in front.
    pub fn datagrams(&mut self) -> std::vec::Drain<'_, (Option<SocketAddr>, PduBuf)> {
        self.got.drain(..)
    }
}

/// Asks `fd` to coalesce received datagrams; false where the kernel cannot.
pub fn enable_gro(fd: RawFd) -> bool {
    let on: libc::c_int = 1;
    // SAFETY: an int option, passed by pointer with its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            SOL_UDP,
            UDP_GRO,
            &on as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    r == 0
}

/// The datagram size of a coalesced read (its `UDP_GRO` control message),
/// 0 for a single datagram.
fn gro_segment(h: &libc::msghdr) -> usize {
    // SAFETY: the kernel filled the control buffer and set its length;
    // CMSG_FIRSTHDR/NXTHDR stay within it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == SOL_UDP && (*c).cmsg_type == UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                return usize::try_from(v).unwrap_or(0);
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    0
}

/// The sender's address as the kernel wrote it.
fn sockaddr_of(s: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    // SAFETY: the kernel wrote `len` bytes of an address at `s`.
    let a =
        unsafe { SockaddrStorage::from_raw(s as *const _ as *const libc::sockaddr, Some(len)) }?;
    if let Some(v4) = a.as_sockaddr_in() {
        return Some(SocketAddr::V4((*v4).into()));
    }
    a.as_sockaddr_in6().map(|v6| SocketAddr::V6((*v6).into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    fn pair() -> (UdpSocket, UdpSocket) {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.set_nonblocking(true).unwrap();
        b.set_nonblocking(true).unwrap();
        (a, b)
    }

    /// Everything received on `b`, datagram by datagram, and the number of
    /// reads the kernel made of them.
    fn drain(rx: &mut Receiver, b: &UdpSocket) -> (Vec<Vec<u8>>, usize) {
        let (mut out, mut reads) = (Vec::new(), 0);
        loop {
            let n = rx.recv(b.as_raw_fd()).unwrap();
            if n == 0 {
                break;
            }
            reads += n;
            out.extend(rx.datagrams().map(|(_, d)| {
                assert_eq!(d.headroom(), buf::HEADROOM);
                d.to_vec()
            }));
        }
        (out, reads)
    }

    #[test]
    fn a_batch_arrives_as_the_same_datagrams_in_order_with_or_without_gro() {
        for gro in [true, false] {
            let (a, b) = pair();
            if gro {
                assert!(enable_gro(b.as_raw_fd()), "UDP_GRO on this kernel");
            }
            let to = b.local_addr().unwrap();
            // Runs of equal sizes, a shorter one ending a run, an empty
            // datagram, a larger one: every kind of boundary.
            let sizes = [1400, 1400, 1400, 700, 1400, 0, 1400, 9000, 9000, 3];
            let data: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(k, &n)| vec![k as u8; n])
                .collect();
            let frames: Vec<(SocketAddr, &[u8])> =
                data.iter().map(|d| (to, d.as_slice())).collect();
            let mut tx = Sender::new();
            let out = tx.send(a.as_raw_fd(), &frames);
            assert_eq!((out.sent, out.failed, out.blocked), (10, 0, false));
            let mut rx = Receiver::new();
            // Loopback delivers at once.
            let (got, reads) = drain(&mut rx, &b);
            let want = data;
            assert_eq!(got, want, "gro {gro}");
            assert!(tx.offload(), "the kernel took the segmented runs");
            if gro {
                // The runs stayed whole from the send to the read.
                assert!(reads < want.len(), "{reads} reads of {}", want.len());
            } else {
                assert_eq!(reads, want.len());
            }
        }
    }

    #[test]
    fn a_receiver_reused_over_many_reads_keeps_every_datagram_and_sender() {
        // Between reads the receiver renews only what the last read used:
        // buffers handed up, the lengths and flags the kernel wrote. Rounds
        // of other sizes and senders, with reads that find nothing between
        // them, must still come back exact.
        let (a, b) = pair();
        let c = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(enable_gro(b.as_raw_fd()));
        let to = b.local_addr().unwrap();
        let mut tx = Sender::new();
        let mut rx = Receiver::new();
        // (size, count): a lone datagram is read without a GRO control
        // message, and the coalesced read after it needs the room for one.
        let rounds: [(usize, usize); 9] = [
            (1400, 40),
            (1400, 1),
            (1400, 40),
            (9000, 11),
            (64, 40),
            (1200, 1),
            (1200, 40),
            (2000, 40),
            (1400, 40),
        ];
        for (r, &(size, count)) in rounds.iter().enumerate() {
            let from = if r % 2 == 0 { &a } else { &c };
            // Fewer at a time than the socket buffer holds.
            assert!(size * count <= 100_000);
            let data: Vec<Vec<u8>> = (0..count).map(|k| vec![(k ^ r) as u8; size]).collect();
            let frames: Vec<(SocketAddr, &[u8])> =
                data.iter().map(|d| (to, d.as_slice())).collect();
            assert_eq!(tx.send(from.as_raw_fd(), &frames).sent, data.len());
            let mut got = Vec::new();
            while rx.recv(b.as_raw_fd()).unwrap() > 0 {
                for (who, d) in rx.datagrams() {
                    assert_eq!(who, Some(from.local_addr().unwrap()), "round {r}");
                    assert_eq!(d.headroom(), buf::HEADROOM);
                    got.push(d.to_vec());
                }
            }
            assert!(got == data, "round {r}: {size}-byte datagrams differ");
            assert_eq!(rx.recv(b.as_raw_fd()).unwrap(), 0);
        }
    }

    #[test]
    fn senders_are_told_apart_and_a_full_batch_of_runs_goes_in_order() {
        let (a, b) = pair();
        let c = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(enable_gro(b.as_raw_fd()));
        let to = b.local_addr().unwrap();
        let data: Vec<Vec<u8>> = (0..300u32).map(|k| k.to_be_bytes().repeat(300)).collect();
        let frames: Vec<(SocketAddr, &[u8])> = data.iter().map(|d| (to, d.as_slice())).collect();
        let mut tx = Sender::new();
        let mut rx = Receiver::new();
        // Fewer at a time than the socket buffer holds.
        for (k, chunk) in frames.chunks(100).enumerate() {
            let out = tx.send(a.as_raw_fd(), chunk);
            assert_eq!(out.sent, chunk.len());
            let copied = rx.copied();
            let mut got = Vec::new();
            while rx.recv(b.as_raw_fd()).unwrap() > 0 {
                for (from, d) in rx.datagrams() {
                    assert_eq!(from, Some(a.local_addr().unwrap()));
                    got.push(d.to_vec());
                }
            }
            let want: Vec<Vec<u8>> = chunk.iter().map(|(_, d)| d.to_vec()).collect();
            assert_eq!(got, want);
            // The first reads of coalesced 1,200-byte datagrams are copied
            // out; the reads after them are cut for 1,200 bytes, and each
            // datagram goes up in the buffer it was read into.
            if k > 0 {
                assert_eq!(rx.copied(), copied, "chunk {k}");
            }
        }
        let out = tx.send(c.as_raw_fd(), &[(to, b"from c")]);
        assert_eq!(out.sent, 1);
        let mut rx = Receiver::new();
        assert_eq!(rx.recv(b.as_raw_fd()).unwrap(), 1);
        assert_eq!(
            rx.datagrams().next().unwrap().0,
            Some(c.local_addr().unwrap())
        );
    }
}
