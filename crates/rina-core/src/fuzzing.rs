//! Bodies of the fuzz targets that drive whole machines (`fuzz/`, cargo-fuzz,
//! nightly): each takes arbitrary bytes, feeds them to a machine with
//! explicit time taken from the bytes themselves, and checks that nothing
//! panics and the machine's invariants hold. They live here, on stable, so
//! the crate's own tests run them (proptest) and they never rot.
//!
//! Input layout, for every target: a sequence of records `[dt: u8][len:
//! u8][len bytes]`; `dt` advances the clock by that many milliseconds
//! before the record is delivered (so timers fire in between).

use crate::efcp::{Connection, EfcpConfig, Pdu};
use crate::enrollment::{
    AuthKeys, AuthPassword, AuthPolicy, DifContent, Enrollee, EnrolleeConfig, Enroller,
    EnrollerConfig, Membership, NextFree,
};
use crate::mgmt_frag::Reassembler;
use crate::normal::{MembershipConfig, NormalConfig, NormalIpcp};
use crate::rmt::Fifo;
use crate::time::Instant;
use std::time::Duration;

/// Splits `data` into `(time step, record)` pairs (see the module docs).
fn records(data: &[u8]) -> impl Iterator<Item = (Duration, &[u8])> {
    let mut rest = data;
    std::iter::from_fn(move || {
        let [dt, len, tail @ ..] = rest else {
            return None;
        };
        let n = (*len as usize).min(tail.len());
        let (rec, after) = tail.split_at(n);
        rest = after;
        Some((Duration::from_millis(u64::from(*dt)), rec))
    })
}

/// Management-message fragments from three ports, into one reassembler.
/// Invariant: what it holds stays within its bounds.
pub fn mgmt_fragments(data: &[u8]) {
    let max_msg = 4096;
    let mut r = Reassembler::new(max_msg, Duration::from_millis(500), 8);
    let mut now = Instant::ZERO;
    for (i, (dt, rec)) in records(data).enumerate() {
        now = now + dt;
        if r.poll_timeout().is_some_and(|t| t <= now) {
            r.handle_timeout(now);
        }
        if let Ok(Some(msg)) = r.push(now, (i % 3) as _, rec) {
            assert!(msg.len() <= max_msg, "a message over the bound");
        }
        assert!(r.pending_len() <= 8 * 3 + 8, "pending grows without bound");
    }
}

fn content() -> DifContent {
    DifContent {
        config: crate::enrollment::DifConfigBlob(vec![1, 2, 3]),
        neighbors: Vec::new(),
        directory: vec![b"x".to_vec()],
        fsos: Vec::new(),
    }
}

/// Arbitrary enrollment payloads, to a member (enroller) and to an enrollee
/// that has started, under the password and the key policy; the machines
/// also answer each other in between so deeper steps are reached.
pub fn enrollment_payloads(data: &[u8]) {
    let policies: [fn() -> Box<dyn AuthPolicy>; 2] = [
        || Box::new(AuthPassword("pw".into())),
        || {
            Box::new(AuthKeys::new(
                [1; 32],
                vec![AuthKeys::new([2; 32], vec![]).public_key()],
            ))
        },
    ];
    for policy in policies {
        let mut m = Membership::new(policy(), Box::new(NextFree::new(1, 10)), content());
        let mut er = Enroller::new(EnrollerConfig::default());
        let name = |s: &str| s.parse().expect("a valid name");
        let mut ee = Enrollee::new(EnrolleeConfig::new(name("e"), name("m")), policy());
        let mut now = Instant::ZERO;
        ee.start(now);
        for (i, (dt, rec)) in records(data).enumerate() {
            now = now + dt;
            if i % 2 == 0 {
                er.on_message(now, rec, &mut m);
            } else {
                ee.on_message(now, rec);
            }
            // Let them talk too.
            while let Some(b) = ee.poll_transmit() {
                er.on_message(now, &b, &mut m);
            }
            while let Some(b) = er.poll_transmit() {
                ee.on_message(now, &b);
            }
            if er.poll_timeout().is_some_and(|t| t <= now) {
                er.handle_timeout(now, &mut m);
            }
            if ee.poll_timeout().is_some_and(|t| t <= now) {
                ee.handle_timeout(now);
            }
            while ee.poll_event().is_some() {}
            while er.poll_event().is_some() {}
            assert!(m.in_use().iter().all(|a| (1..=10).contains(a)));
        }
    }
}

/// Arbitrary PDUs to a reliable EFCP connection that is also sending.
/// Invariants: deliveries are in order and never repeat; the receive LWE
/// never moves back.
pub fn efcp_pdus(data: &[u8]) {
    // An odd first byte makes the flow unreliable, whose in-order PDUs the
    // normal IPCP offers to `take_in_order` first.
    let unreliable = data.first().is_some_and(|b| b & 1 == 1);
    let cfg = if unreliable {
        EfcpConfig::unreliable()
    } else {
        EfcpConfig::reliable()
    };
    let mut c = Connection::new(cfg, Instant::ZERO).expect("valid config");
    let mut now = Instant::ZERO;
    let mut last = 0u64;
    let mut lwe = 0u64;
    for (dt, rec) in records(data) {
        now = now + dt;
        // Numbers of three bytes, counted down from u64::MAX when the
        // record's kind byte has its top bit set (8-byte sequence numbers
        // carry any value).
        let top = rec.first().is_some_and(|k| k & 0x80 != 0);
        let num = |i: usize| {
            let mut b = [0u8; 8];
            for (k, x) in rec.iter().skip(1 + i * 3).take(3).enumerate() {
                b[5 + k] = *x;
            }
            let v = u64::from_be_bytes(b);
            if top {
                u64::MAX - v
            } else {
                v
            }
        };
        let pdu = match rec.first().map(|k| k % 5) {
            Some(0) => Pdu::Data {
                seq: num(0),
                drf: num(1) & 1 == 1,
                payload: rec.to_vec().into(),
            },
            Some(1) => Pdu::Ack {
                ctrl_seq: num(0),
                ack_sn: num(1),
            },
            Some(2) => Pdu::Fc {
                ctrl_seq: num(0),
                new_rwe: num(1),
                rate: num(2),
                frame_ms: num(3),
            },
            Some(3) => Pdu::AckFc {
                ctrl_seq: num(0),
                ack_sn: num(1),
                new_rwe: num(2),
                rate: num(3),
                frame_ms: num(4),
            },
            Some(_) => Pdu::Rendezvous {
                ctrl_seq: num(0),
                next_seq: num(1),
            },
            None => continue,
        };
        let _ = c.write(now, rec.to_vec());
        if let Pdu::Data { seq, .. } = &pdu {
            if c.take_in_order(now, *seq, false) {
                assert!(*seq > last, "taken {seq} after {last}");
                last = *seq;
                continue;
            }
        }
        c.on_pdu(now, pdu);
        if c.poll_timeout().is_some_and(|t| t <= now) {
            c.handle_timeout(now);
        }
        while c.poll_transmit(now).is_some() {}
        while let Some(d) = c.poll_deliver() {
            assert!(d.seq > last, "delivered {} after {last}", d.seq);
            last = d.seq;
            c.consumed(now, 1);
        }
        let now_lwe = c.receive_reference();
        assert!(now_lwe >= lwe, "the LWE moved back");
        lwe = now_lwe;
    }
}

/// A whole normal IPCP (a member with a password, two ports) fed arbitrary
/// frames with explicit time; its actions are drained and its timers run.
pub fn normal_ipcp_frames(data: &[u8]) {
    let mut c = NormalConfig::new("net", 1);
    c.dt.max_pdu_size = 1400;
    let mut mc = MembershipConfig::new("m.net".parse().expect("a valid name"));
    mc.password = Some("pw".into());
    c.membership = Some(mc);
    let Ok(mut p) = NormalIpcp::new(c, Box::new(Fifo::new(64))) else {
        return;
    };
    p.add_port(1);
    p.add_port(2);
    let mut now = Instant::ZERO;
    for (i, (dt, rec)) in records(data).enumerate() {
        now = now + dt;
        p.on_frame(now, 1 + (i % 2) as crate::normal::N1Port, rec);
        if p.poll_timeout().is_some_and(|t| t <= now) {
            p.handle_timeout(now);
        }
        while p.poll_action().is_some() {}
    }
}

/// One member of an encrypting DIF for [`encrypted_link`]: address `addr`
/// (1 or 2), port 1 to the other, reliable flow 7 to it.
fn encrypting_member(addr: u64) -> Option<NormalIpcp> {
    let mut c = NormalConfig::new("net", addr);
    c.dt.max_pdu_size = 1400;
    let mut mc = MembershipConfig::new(format!("m{addr}.net").parse().ok()?);
    mc.password = Some("pw".into());
    mc.entropy = [addr as u8; 32];
    mc.encryption = Some(crate::sdup::aead::Rekey {
        bytes: 4000,
        after: Duration::from_secs(2),
    });
    c.membership = Some(mc);
    let mut p = NormalIpcp::new(c, Box::new(Fifo::new(64))).ok()?;
    p.add_port(1);
    p.rmt_mut().table_mut().set(3 - addr, None, vec![1]);
    let ep = crate::normal::Endpoint {
        local_cep: 10 * addr,
        remote_addr: 3 - addr,
        remote_cep: 10 * (3 - addr),
        qos_id: 1,
    };
    p.open_flow(Instant::ZERO, 7, ep, EfcpConfig::reliable())
        .ok()?;
    Some(p)
}

/// Two members of an encrypting DIF (password, keys rotating every 4000
/// bytes or 2 s) and an attacker on the wire between them: each record is
/// an operation chosen by its first byte (member 1 writes an SDU; the next
/// frame in one direction is delivered, dropped, delivered with a byte
/// changed, or a captured frame is replayed; arbitrary bytes are injected).
/// Invariants: no panic, and member 2 delivers only SDUs member 1 wrote,
/// each once, in order.
pub fn encrypted_link(data: &[u8]) {
    let (Some(a), Some(b)) = (encrypting_member(1), encrypting_member(2)) else {
        return;
    };
    let mut net = [a, b];
    let mut wire: [std::collections::VecDeque<Vec<u8>>; 2] = Default::default();
    let mut seen: Vec<Vec<u8>> = Vec::new();
    let (mut written, mut delivered) = (0u32, 0u32);
    let mut now = Instant::ZERO;
    for (dt, rec) in records(data) {
        now = now + dt;
        for p in net.iter_mut() {
            if p.poll_timeout().is_some_and(|t| t <= now) {
                p.handle_timeout(now);
            }
        }
        let [op, x, y, ..] = *rec else { continue };
        let dir = usize::from(x & 1);
        match op % 6 {
            0 => {
                if net[0].can_write(7, 100) {
                    let mut sdu = written.to_be_bytes().to_vec();
                    sdu.resize(40 + usize::from(y), 0xa5);
                    if net[0].write(now, 7, &sdu).is_ok() {
                        written += 1;
                    }
                }
            }
            1 => {
                if let Some(f) = wire[dir].pop_front() {
                    net[1 - dir].on_frame(now, 1, &f);
                }
            }
            2 => {
                wire[dir].pop_front();
            }
            3 => {
                if let Some(mut f) = wire[dir].pop_front() {
                    let i = usize::from(y) % f.len().max(1);
                    if let Some(b) = f.get_mut(i) {
                        *b ^= rec.get(3).copied().unwrap_or(1).max(1);
                    }
                    net[1 - dir].on_frame(now, 1, &f);
                }
            }
            4 => {
                if let Some(f) = seen.get(usize::from(y) % seen.len().max(1)) {
                    net[1 - dir].on_frame(now, 1, f);
                }
            }
            _ => net[1 - dir].on_frame(now, 1, &rec[2..]),
        }
        for (i, p) in net.iter_mut().enumerate() {
            while let Some(a) = p.poll_action() {
                match a {
                    crate::normal::Action::Transmit { frame, .. } => {
                        if seen.len() < 256 {
                            seen.push(frame.to_vec());
                        }
                        if wire[i].len() < 256 {
                            wire[i].push_back(frame.into_vec());
                        }
                    }
                    crate::normal::Action::Deliver { flow: 7, sdu } if i == 1 => {
                        let sdu = sdu.to_vec();
                        let n = sdu
                            .get(..4)
                            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                        assert_eq!(n, Some(delivered), "an SDU out of order, twice or forged");
                        assert!(sdu[4..].iter().all(|&b| b == 0xa5), "a forged SDU");
                        delivered += 1;
                        assert!(delivered <= written);
                    }
                    _ => {}
                }
            }
        }
    }
}

/// A host's end of a VMPI device (the shim DIF for hypervisors: its
/// [`Link`](crate::shim_hv::link::Link) and [`ShimHv`](crate::shim_hv::ShimHv)
/// machine, with "echo" registered, accepting every flow and echoing every
/// SDU) facing a hostile guest, which owns the shared memory. Each record
/// is an operation chosen by its first byte: the guest sends a buffer the
/// honest way (arbitrary bytes, an allocation request, or data on a
/// channel); writes the record's bytes anywhere in the region (the link's
/// header, either ring's indices, record headers, payloads); beats and
/// drains its receive ring; or restarts (a new session). After each record
/// the host ticks its link, takes every buffer the ring gives and hands it
/// to the machine, and sends what the machine transmits.
/// Invariants: no panic; no buffer longer than the link's maximum; while
/// the guest has written nothing outside the ring protocol, the host
/// receives exactly the buffers the guest sent, in order, and never sees
/// garbage. Returns how many buffers the host received and how many SDUs
/// it echoed (for tests).
pub fn vmpi_ring(data: &[u8]) -> (usize, usize) {
    use crate::shim_hv::link::{region_size, Link, LinkConfig, LinkEvent};
    use crate::shim_hv::ring::{Geometry, HeapRegion};
    use crate::shim_hv::{vmpi, Action, Config, Received, ShimHv, Side};
    // Small rings, so records wrap and the ring fills.
    let geo = Geometry {
        slot_size: 64,
        slots: 16,
    };
    let mem = HeapRegion::new(region_size(geo));
    let region = mem.region();
    let (Ok(mut host), Ok(mut guest)) = (
        Link::create(region, geo, 11, LinkConfig::default()),
        Link::attach(region, 22, LinkConfig::default()),
    ) else {
        panic!("a fresh region lays out");
    };
    let mut hv = ShimHv::new(Config::new("hv", Side::Host));
    let _ = hv.register("echo".parse().expect("a valid name"));
    let max = host.max_buffer();
    let mut buf = vec![0u8; max];
    let mut sent: std::collections::VecDeque<Vec<u8>> = Default::default();
    let mut tampered = false;
    let (mut now, mut next_port, mut session) = (Instant::ZERO, 1u32, 22u32);
    let (mut received, mut echoed) = (0, 0);
    for (dt, rec) in records(data) {
        now = now + dt;
        let [op, x, rest @ ..] = rec else { continue };
        let mut guest_send = |guest: &mut Link, b: Vec<u8>| {
            if guest.send(&[&b]).is_ok() && !tampered {
                sent.push_back(b);
            }
        };
        match op % 6 {
            0 => guest_send(&mut guest, rest.to_vec()),
            1 => {
                let req = vmpi::Control::AllocateReq {
                    channel: 1 + u32::from(*x) % 63,
                    src: "vm-app".parse().expect("a valid name"),
                    dst: if x & 0x80 == 0 { "echo" } else { "nobody" }
                        .parse()
                        .expect("a valid name"),
                    credit: (x & 0x40 != 0).then_some(crate::shim_hv::credit::Window {
                        sdus: u32::from(*x),
                        bytes: u32::from(*x) * 100,
                    }),
                };
                guest_send(&mut guest, req.to_buffer());
            }
            2 => {
                let mut b = vmpi::header(1 + u32::from(*x) % 63).to_vec();
                b.extend_from_slice(rest);
                guest_send(&mut guest, b);
            }
            3 => {
                let off = usize::from(u16::from_le_bytes([*x, rest.first().copied().unwrap_or(0)]));
                let off = off % region.len();
                let bytes = rest.get(1..).unwrap_or(&[]);
                let n = bytes.len().min(region.len() - off);
                region.write(off, &bytes[..n]);
                tampered |= n > 0;
            }
            4 => {
                let _ = guest.tick(now);
                let mut gbuf = vec![0u8; max];
                for _ in 0..64 {
                    if !matches!(guest.recv(&mut gbuf), Ok(Some(_))) {
                        break;
                    }
                }
            }
            _ => {
                session = session.wrapping_add(1).max(1);
                if let Ok(g) = Link::attach(region, session, LinkConfig::default()) {
                    guest = g;
                }
            }
        }
        match host.tick(now) {
            Some(LinkEvent::Up) => hv.peer_up(),
            Some(LinkEvent::Down) => hv.peer_lost(),
            None => {}
        }
        if hv.poll_timeout().is_some_and(|t| t <= now) {
            hv.handle_timeout(now);
        }
        for _ in 0..64 {
            let n = match host.recv(&mut buf) {
                Ok(Some(n)) => n,
                Ok(None) => break,
                Err(e) => {
                    assert!(tampered, "an honest ring reported garbage: {e}");
                    continue;
                }
            };
            assert!(n <= max, "a buffer longer than the link carries");
            received += 1;
            if !tampered {
                let want = sent.pop_front();
                assert_eq!(
                    want.as_deref(),
                    Some(&buf[..n]),
                    "a buffer lost, changed or reordered"
                );
            }
            if let Received::Deliver { port, sdu } = hv.on_buffer(now, &buf[..n]) {
                if let Ok(h) = hv.send_header(port, sdu.len()) {
                    if host.send(&[&h, sdu]).is_err() {
                        hv.unsend(port, sdu.len());
                    } else {
                        echoed += 1;
                    }
                }
            }
        }
        while let Some(a) = hv.poll_action() {
            match a {
                Action::Transmit { buf } => {
                    let _ = host.send(&[&buf]);
                }
                Action::FlowRequest { handle, .. } => {
                    let _ = hv.accept(handle, next_port);
                    next_port += 1;
                }
                _ => {}
            }
        }
    }
    (received, echoed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn mgmt_fragments_never_panic(data in proptest::collection::vec(any::<u8>(), 0..600)) {
            mgmt_fragments(&data);
        }

        #[test]
        fn enrollment_payloads_never_panic(data in proptest::collection::vec(any::<u8>(), 0..600)) {
            enrollment_payloads(&data);
        }

        #[test]
        fn efcp_pdus_keep_their_invariants(data in proptest::collection::vec(any::<u8>(), 0..600)) {
            efcp_pdus(&data);
        }

        #[test]
        fn encrypted_link_delivers_only_what_was_written(data in proptest::collection::vec(any::<u8>(), 0..2000)) {
            encrypted_link(&data);
        }

        #[test]
        fn vmpi_ring_keeps_honest_buffers_in_order(data in proptest::collection::vec(any::<u8>(), 0..2000)) {
            vmpi_ring(&data);
        }

        #[test]
        fn normal_ipcp_frames_never_panic(data in proptest::collection::vec(any::<u8>(), 0..600)) {
            normal_ipcp_frames(&data);
        }
    }

    #[test]
    fn vmpi_ring_carries_an_honest_guests_flow_and_checks_order() {
        // Beat, beat (the link comes up), allocate channel 6 to echo, send
        // "hi" on it: the host receives both buffers and echoes one SDU.
        let honest = [1, 2, 4, 0, 1, 2, 4, 0, 0, 2, 1, 5, 0, 4, 2, 5, b'h', b'i'];
        assert_eq!(vmpi_ring(&honest), (2, 1));
        // A guest that rewrites the host's ring header: received buffers
        // are no longer checked against what was sent, and nothing panics.
        let mut hostile = honest.to_vec();
        hostile.extend_from_slice(&[0, 6, 3, 0x00, 0x20, 0xff, 0xff, 0xff, 0, 3, 0, 1, 0]);
        vmpi_ring(&hostile);
    }

    #[test]
    fn records_cover_the_input() {
        let r: Vec<_> = records(&[5, 2, 9, 9, 0, 10, 1]).collect();
        assert_eq!(
            r,
            vec![
                (Duration::from_millis(5), &[9u8, 9][..]),
                (Duration::ZERO, &[1u8][..])
            ]
        );
    }
}
