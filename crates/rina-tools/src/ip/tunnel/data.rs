//! The tunnel's two data paths: TUN -> flows, and each flow -> TUN.
//!
//! On a flow with shared-memory rings no packet is copied in this
//! process. A packet is read from the TUN straight into the send ring of
//! the flow the last packet went to, behind room for the partial-checksum
//! frame's header if the last packet had one (so at the ring's start if
//! not); and a received packet goes to the TUN from where it lies in the
//! receive ring. A packet read into a ring that turns out to go to another
//! flow, or to need a frame header the last one did not (or the other way
//! round), is copied out and sent the copying way, as on a flow without
//! rings. So is a received partial-checksum packet on a TUN without
//! offload, whose checksum is completed in a copy.

use super::{bump, lock, Counters, End, Live, Shared, MAX_PACKET, TICK, TX_WAIT};
use crate::ip::packet::{self, Frame, IpPacket, PartialCsum, Shape, HEAD, PARTIAL_HEADER};
use crate::ip::tun::VnetHdr;
use crate::ip::{frag, icmp};
use rina::Segments;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

/// What became of a packet read from the TUN into a flow's send ring.
enum InPlace {
    /// Sent on that flow.
    Sent,
    /// Read, but for the copying path: its `n` bytes are in the buffer,
    /// behind room for the frame header.
    Copied(usize),
    /// Nothing read: no flow, no rings or no room.
    NotRead,
    /// Nothing read: the TUN has no packet.
    Empty,
    /// Read and dropped (counted).
    Dropped,
    /// The TUN cannot be read.
    Failed(io::Error),
}

/// What a packet read from the TUN is: its destination, DSCP, length
/// and, if its checksum is partial, where; `None` if it is not a packet to
/// forward (not IP, or offsets outside it, or segmented, which this TUN
/// was not offered). `head` holds the first bytes of the packet's `len`
/// (at least [`HEAD`], or all).
fn classify(
    hdr: &VnetHdr,
    head: &[u8],
    len: usize,
) -> Option<(IpAddr, u8, usize, Option<PartialCsum>)> {
    let (pkt, len) = IpPacket::parse_head(head, len).ok()?;
    if hdr.gso_type != 0 {
        return None;
    }
    let partial = if hdr.flags & VnetHdr::NEEDS_CSUM != 0 {
        let c = PartialCsum {
            start: hdr.csum_start,
            offset: hdr.csum_offset,
        };
        if !c.fits(pkt.version(), len) {
            return None;
        }
        Some(c)
    } else {
        None
    };
    Some((pkt.dst(), pkt.dscp(), len, partial))
}

/// The virtio header that has the TUN complete checksum `csum`.
fn partial_hdr(csum: PartialCsum) -> VnetHdr {
    VnetHdr {
        flags: VnetHdr::NEEDS_CSUM,
        gso_type: 0,
        csum_start: csum.start,
        csum_offset: csum.offset,
    }
}

impl Shared {
    /// TUN -> flows, until the tunnel stops or the TUN fails.
    pub(super) fn tun_loop(self: Arc<Self>) {
        let mut buf = vec![0u8; PARTIAL_HEADER + MAX_PACKET];
        let mut hdr = VnetHdr::default();
        // Where the last packet went (peer, DSCP) and whether its checksum
        // was partial: the next one most likely is the same, so it is read
        // into that flow's ring where its frame begins.
        let mut last = None;
        // The TUN is polled only once a read found it empty: while packets
        // come, each costs its read and no poll.
        let mut wait = true;
        while !self.stopped() {
            if wait {
                match self.tun.wait_readable(TICK) {
                    Ok(true) => wait = false,
                    Ok(false) => continue,
                    Err(e) => return self.tun_failed(&e),
                }
            }
            let got = match last {
                Some(to) => self.read_in_place(to, &mut hdr, &mut buf),
                None => InPlace::NotRead,
            };
            let n = match got {
                InPlace::Sent | InPlace::Dropped => continue,
                InPlace::Empty => {
                    wait = true;
                    continue;
                }
                InPlace::Failed(e) => return self.tun_failed(&e),
                InPlace::Copied(n) => n,
                InPlace::NotRead => match self.tun.read(&mut hdr, &mut buf[PARTIAL_HEADER..]) {
                    Ok(Some(n)) => n,
                    Ok(None) => {
                        wait = true;
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                        bump(&self.drops_tun_invalid);
                        continue;
                    }
                    Err(e) => return self.tun_failed(&e),
                },
            };
            if let Some(to) = self.forward(&hdr, &mut buf, n) {
                last = Some(to);
            }
        }
    }

    fn tun_failed(&self, e: &io::Error) {
        log!("cannot read the TUN: {e}; stopping");
        self.end(End::TunFailed(format!(
            "cannot read {}: {e}",
            self.tun.name()
        )));
    }

    /// Sends the packet of `n` bytes at `buf[PARTIAL_HEADER..]` (read with
    /// `hdr`) where it goes, from this buffer: the frame header, if any,
    /// goes in the room in front. Its peer, DSCP and whether its checksum
    /// is partial, if it has a route.
    fn forward(&self, hdr: &VnetHdr, buf: &mut [u8], n: usize) -> Option<(usize, u8, bool)> {
        let pkt = &buf[PARTIAL_HEADER..][..n];
        let Some((dst, dscp, len, partial)) = classify(hdr, &pkt[..n.min(HEAD)], n) else {
            bump(&self.drops_tun_invalid);
            return None;
        };
        let Some(pi) = self.routes.lookup(dst) else {
            self.no_route(&pkt[..len]);
            return None;
        };
        let sdu = match partial {
            Some(csum) => {
                buf[..PARTIAL_HEADER].copy_from_slice(&csum.header());
                &buf[..PARTIAL_HEADER + len]
            }
            None => &buf[PARTIAL_HEADER..][..len],
        };
        self.send(pi, dscp, sdu, partial.is_some());
        Some((pi, dscp, partial.is_some()))
    }

    /// Reads the next packet from the TUN into the send ring of the flow
    /// for `dscp` to peer `pi`, behind room for the frame header if
    /// `partial`, and sends it there if that is where it goes, its checksum
    /// partial or not as expected; else copies it to `buf` for the copying
    /// path.
    fn read_in_place(
        &self,
        (pi, dscp, partial): (usize, u8, bool),
        hdr: &mut VnetHdr,
        buf: &mut [u8],
    ) -> InPlace {
        let Some((ci, live)) = self.pick(pi, dscp) else {
            return InPlace::NotRead;
        };
        let max = (PARTIAL_HEADER + MAX_PACKET).min(live.flow.max_sdu());
        if max <= PARTIAL_HEADER {
            return InPlace::NotRead;
        }
        let mut got = InPlace::NotRead;
        let sent = live.flow.write_in_place(max, |room| {
            let (what, len) = self.fill((pi, dscp, partial), hdr, buf, room, max);
            got = what;
            len
        });
        match sent {
            Ok(Some(len)) if len > 0 => {
                self.count_out(pi, ci, len, partial);
                InPlace::Sent
            }
            Ok(_) => got,
            Err(e) => {
                bump(&self.peers[pi].counters.drops_no_flow);
                self.fail(pi, ci, live.gen, &format!("write failed: {e}"));
                match got {
                    InPlace::Sent => InPlace::Dropped,
                    other => other,
                }
            }
        }
    }

    /// Fills `room` of the flow for `dscp` to peer `pi` (whose largest SDU
    /// is `max_sdu`) with the next packet of the TUN, behind room for the
    /// frame header if `partial`: what became of it, and the SDU's length
    /// if it is to be sent from there. A packet the room cannot hold is
    /// too big for the flow (see [`Shared::too_big`]).
    fn fill(
        &self,
        (pi, dscp, partial): (usize, u8, bool),
        hdr: &mut VnetHdr,
        buf: &mut [u8],
        room: &Segments,
        max_sdu: usize,
    ) -> (InPlace, usize) {
        let pkt = room.skip(if partial { PARTIAL_HEADER } else { 0 });
        // What the room cannot hold goes to `buf`, behind where the room's
        // part will be copied: a packet too large for the flow is read
        // whole, to be cut into fragments (or quoted in an ICMP error).
        let spill_at = (PARTIAL_HEADER + pkt.len()).min(buf.len());
        let n = match self.tun.read_segments(hdr, &pkt, &mut buf[spill_at..]) {
            Ok(Some(n)) => n,
            Ok(None) => return (InPlace::Empty, 0),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                bump(&self.drops_tun_invalid);
                return (InPlace::Dropped, 0);
            }
            Err(e) => return (InPlace::Failed(e), 0),
        };
        if n > pkt.len() {
            if !pkt.read_at(0, &mut buf[PARTIAL_HEADER..spill_at]) {
                bump(&self.drops_tun_invalid);
                return (InPlace::Dropped, 0);
            }
            return (InPlace::Copied(n), 0);
        }
        let mut head = [0u8; HEAD];
        let h = n.min(HEAD);
        if pkt.read_at(0, &mut head[..h]) {
            if n == pkt.len() && packet::cut(&head[..h], n) {
                return (self.cut_in_place(&head[..h], &pkt, n, buf, max_sdu), 0);
            }
            if let Some((dst, d, len, csum)) = classify(hdr, &head[..h], n) {
                let here = self.routes.lookup(dst) == Some(pi)
                    && self.channel(pi, d) == self.channel(pi, dscp);
                match csum {
                    Some(c) if here && partial => {
                        room.write_at(0, &c.header());
                        return (InPlace::Sent, PARTIAL_HEADER + len);
                    }
                    None if here && !partial => return (InPlace::Sent, len),
                    _ => {}
                }
            }
        }
        if !pkt.read_at(0, &mut buf[PARTIAL_HEADER..][..n]) {
            bump(&self.drops_tun_invalid);
            return (InPlace::Dropped, 0);
        }
        (InPlace::Copied(n), 0)
    }

    /// A packet read into a ring's room of `n` bytes (`pkt`, first bytes
    /// `head`) that the room cut: too big for the flow, whose largest SDU
    /// is `max_sdu`. Its first bytes go to `buf` for the ICMP error.
    fn cut_in_place(
        &self,
        head: &[u8],
        pkt: &Segments,
        n: usize,
        buf: &mut [u8],
        max_sdu: usize,
    ) -> InPlace {
        let quote = &mut buf[..n.min(icmp::MAX_QUOTE)];
        let head = if pkt.read_at(0, quote) { quote } else { head };
        let dst = IpPacket::parse_head(head, usize::MAX).map(|(p, _)| p.dst());
        match dst.ok().and_then(|d| self.routes.lookup(d)) {
            Some(pi) => self.too_big(pi, head, max_sdu),
            None => self.no_route(head),
        }
        InPlace::Dropped
    }

    /// Drops a packet (its first bytes `head`) whose destination no peer's
    /// prefix covers, and tells its sender with an ICMP "no route" error
    /// through the TUN where one is due.
    fn no_route(&self, head: &[u8]) {
        bump(&self.drops_no_route);
        let head = &head[..head.len().min(icmp::MAX_QUOTE)];
        if self.write_icmp(icmp::no_route(head)) {
            bump(&self.no_route_icmp);
        }
    }

    /// Drops a packet for peer `pi` (its first bytes `head`) because no
    /// flow to the peer is up (it is being allocated again, or in
    /// back-off), and tells its sender with an ICMP "host unreachable"
    /// ("address unreachable" in ICMPv6) where one is due, so that it
    /// fails at once rather than waiting out its timeouts.
    fn no_flow(&self, pi: usize, head: &[u8]) {
        let c = &self.peers[pi].counters;
        bump(&c.drops_no_flow);
        let head = &head[..head.len().min(icmp::MAX_QUOTE)];
        if self.write_icmp(icmp::unreachable(head)) {
            bump(&c.unreachable_icmp);
        }
    }

    /// Writes ICMP error `e` (if one is due) to the TUN, unless more
    /// errors than [`crate::ip::ratelimit`] allows were written lately
    /// (then counted in `icmp_rate_limited`); whether it was written.
    fn write_icmp(&self, e: Option<Vec<u8>>) -> bool {
        let Some(e) = e else {
            return false;
        };
        if !lock(&self.icmp_bucket).take(Instant::now()) {
            bump(&self.icmp_rate_limited);
            return false;
        }
        self.tun.write(VnetHdr::default(), &e).is_ok()
    }

    /// Drops a packet for peer `pi` that its flow, whose largest SDU is
    /// `max_sdu`, cannot carry, and tells its sender (its first bytes are
    /// `head`) with an ICMP "too big" error through the TUN where one is
    /// due, so that path-MTU discovery sends smaller packets: the TUN's
    /// MTU was raised past the flows' (by hand), or packets queued before
    /// a flow with a smaller SDU came up.
    fn too_big(&self, pi: usize, head: &[u8], max_sdu: usize) {
        let c = &self.peers[pi].counters;
        bump(&c.drops_too_big);
        let head = &head[..head.len().min(icmp::MAX_QUOTE)];
        if self.write_icmp(icmp::too_big(head, self.mtu_for(max_sdu))) {
            bump(&c.too_big_icmp);
        }
    }

    /// Writes `sdu` to peer `pi` on the flow for `dscp`, counting it.
    fn send(&self, pi: usize, dscp: u8, sdu: &[u8], partial: bool) {
        let c = &self.peers[pi].counters;
        let ip = if partial { &sdu[PARTIAL_HEADER..] } else { sdu };
        let Some((ci, live)) = self.pick(pi, dscp) else {
            return self.no_flow(pi, ip);
        };
        if sdu.len() > live.flow.max_sdu() {
            return self.oversize(pi, ci, &live, sdu, partial);
        }
        match live.flow.write_timeout(sdu, TX_WAIT) {
            Ok(true) => self.count_out(pi, ci, sdu.len(), partial),
            Ok(false) => bump(&c.drops_full),
            Err(e) if e.kind == rina::ErrorKind::SduTooLarge => {
                self.too_big(pi, ip, live.flow.max_sdu())
            }
            Err(e) => {
                self.fail(pi, ci, live.gen, &format!("write failed: {e}"));
                self.no_flow(pi, ip);
            }
        }
    }

    /// Sends the SDU `sdu` (a partial-checksum frame if `partial`), too
    /// large for flow `ci` of peer `pi`, in IPv4 fragments that fit it if
    /// its packet may be fragmented (its checksum completed first: a
    /// partial one cannot be split); any other is dropped with an ICMP
    /// "too big" error ([`Shared::too_big`]). The far end's kernel puts the
    /// fragments back together.
    fn oversize(&self, pi: usize, ci: usize, live: &Live, sdu: &[u8], partial: bool) {
        let max = live.flow.max_sdu();
        let ip = if partial { &sdu[PARTIAL_HEADER..] } else { sdu };
        if !frag::may_fragment(ip) {
            return self.too_big(pi, ip, max);
        }
        let completed;
        let pkt = if partial {
            let mut whole = ip.to_vec();
            let csum = PartialCsum {
                start: u16::from_be_bytes([sdu[2], sdu[3]]),
                offset: u16::from_be_bytes([sdu[4], sdu[5]]),
            };
            packet::complete_checksum(&mut whole, csum);
            completed = whole;
            &completed[..]
        } else {
            ip
        };
        let c = &self.peers[pi].counters;
        let written = frag::fragment_v4(pkt, max.min(MAX_PACKET), |f| {
            match live.flow.write_timeout(f, TX_WAIT) {
                Ok(true) => {
                    self.count_out(pi, ci, f.len(), false);
                    true
                }
                Ok(false) => {
                    bump(&c.drops_full);
                    false
                }
                Err(e) => {
                    bump(&c.drops_no_flow);
                    self.fail(pi, ci, live.gen, &format!("write failed: {e}"));
                    false
                }
            }
        });
        match written {
            Ok(_) => bump(&c.fragmented),
            // Malformed options, or a flow too small for 8 bytes of data.
            Err(_) => self.too_big(pi, ip, max),
        }
    }

    /// Counts an SDU of `len` bytes sent on flow `ci` of peer `pi`.
    fn count_out(&self, pi: usize, ci: usize, len: usize, partial: bool) {
        let peer = &self.peers[pi];
        bump(&peer.counters.packets_out);
        bump(&peer.slots[ci].packets_out);
        peer.counters.bytes_out.fetch_add(len as u64, Relaxed);
        if partial {
            bump(&self.partial_out);
        }
    }

    /// Flow -> TUN, until the flow closes or is replaced.
    pub(super) fn flow_loop(self: Arc<Self>, pi: usize, ci: usize, live: Arc<Live>) {
        let c = &self.peers[pi].counters;
        // From where the packets lie in the ring, unless their checksums
        // are to be completed here.
        let in_place = live.flow.has_rings() && self.tun.csum_offload();
        let mut buf = if in_place {
            Vec::new()
        } else {
            vec![0u8; live.flow.max_sdu().max(MAX_PACKET)]
        };
        while !self.stopped() {
            let got = if in_place {
                live.flow
                    .read_in_place(TICK, |sdu| self.deliver_in_place(pi, sdu))
            } else {
                live.flow
                    .read_timeout(&mut buf, TICK)
                    .map(|n| n.map(|n| self.deliver(pi, &mut buf[..n])))
            };
            match got {
                Ok(Some(())) => live.last_rx_ms.store(self.now_ms(), Relaxed),
                Ok(None) => {}
                Err(e) if crate::opts::is_transient(&e) => bump(&c.drops_invalid),
                Err(e) => return self.fail(pi, ci, live.gen, &e.to_string()),
            }
        }
    }

    /// Whether the IP packet of the SDU from peer `pi` whose first bytes
    /// are `head` (checked by [`Shape::parse`]) may be written to the TUN:
    /// with `source_filter`, only if its source address routes back to
    /// `pi`, so that no peer speaks for addresses that are not behind it.
    fn source_ok(&self, pi: usize, head: &[u8]) -> bool {
        !self.cfg.source_filter
            || packet::source(head).is_some_and(|src| self.routes.source_ok(src, pi))
    }

    /// Writes the IP packet of SDU `b` from peer `pi` to the TUN
    /// (completing its checksum first if the TUN takes none partial),
    /// unless its source is not the peer's ([`Shared::source_ok`]); a
    /// keepalive is counted.
    fn deliver(&self, pi: usize, b: &mut [u8]) {
        let c = &self.peers[pi].counters;
        let (hdr, at, len) = match Frame::parse(b) {
            Ok(Frame::Keepalive) => return bump(&c.keepalives_in),
            Err(_) => return bump(&c.drops_invalid),
            Ok(_) if !self.source_ok(pi, b) => return bump(&c.drops_source),
            Ok(Frame::Ip(p)) => (VnetHdr::default(), 0, p.bytes().len()),
            Ok(Frame::Partial(p, csum)) => {
                bump(&self.partial_in);
                let len = p.bytes().len();
                if self.tun.csum_offload() {
                    (partial_hdr(csum), PARTIAL_HEADER, len)
                } else {
                    // This TUN takes whole packets only.
                    packet::complete_checksum(&mut b[PARTIAL_HEADER..][..len], csum);
                    (VnetHdr::default(), PARTIAL_HEADER, len)
                }
            }
        };
        self.count_in(c, len, self.tun.write(hdr, &b[at..at + len]));
    }

    /// [`Shared::deliver`] of an SDU where it lies in the receive ring,
    /// on a TUN that takes partial checksums.
    fn deliver_in_place(&self, pi: usize, sdu: &Segments) {
        let c = &self.peers[pi].counters;
        let mut head = [0u8; HEAD];
        let h = sdu.len().min(HEAD);
        if !sdu.read_at(0, &mut head[..h]) {
            return bump(&c.drops_invalid);
        }
        let (hdr, at, len) = match Shape::parse(&head[..h], sdu.len()) {
            Ok(Shape::Keepalive) => return bump(&c.keepalives_in),
            Err(_) => return bump(&c.drops_invalid),
            Ok(_) if !self.source_ok(pi, &head[..h]) => return bump(&c.drops_source),
            Ok(Shape::Ip { len }) => (VnetHdr::default(), 0, len),
            Ok(Shape::Partial { len, csum }) => {
                bump(&self.partial_in);
                (partial_hdr(csum), PARTIAL_HEADER, len)
            }
        };
        let pkt = sdu.skip(at).prefix(len);
        self.count_in(c, len, self.tun.write_segments(hdr, &pkt));
    }

    /// Counts a packet of `len` bytes written to the TUN (or not).
    fn count_in(&self, c: &Counters, len: usize, written: io::Result<()>) {
        match written {
            Ok(()) => {
                bump(&c.packets_in);
                c.bytes_in.fetch_add(len as u64, Relaxed);
            }
            Err(_) => bump(&c.drops_tun),
        }
    }
}
