//! Two members of a DIF with a password and encryption, joined by one
//! N-1 port and carried by hand with explicit time, a reliable flow between
//! them; frames on the wire can be looked at, tampered with and replayed.

use super::*;
use crate::efcp::EfcpConfig;
use crate::normal::{Action, NormalIpcp};
use crate::normal::{Endpoint, MembershipConfig, NormalConfig, NormalError};
use crate::rmt::Fifo;
use crate::sdup::aead::{Rekey, CLEAR, SEALED};
use rina_wire::pci::{self, Pci, PduType};
use std::time::Duration;

const PORT: N1Port = 1;
const MARKER: &[u8] = b"KNOWN-PAYLOAD-MARKER";
const PASSWORD: &str = "correct horse battery staple";

fn at(ms: u64) -> Instant {
    Instant::ZERO + Duration::from_millis(ms)
}

fn member(addr: u64, rekey: Rekey) -> NormalIpcp {
    member_routing(addr, rekey, None)
}

fn member_routing(addr: u64, rekey: Rekey, routing: Option<crate::routing::Config>) -> NormalIpcp {
    let mut c = NormalConfig::new("net", addr);
    c.routing = routing;
    c.dt.max_pdu_size = 1400;
    let mut m = MembershipConfig::new(format!("m{addr}.net").parse().unwrap());
    m.password = Some(PASSWORD.into());
    m.entropy = [addr as u8; 32];
    m.encryption = Some(rekey);
    c.membership = Some(m);
    let mut p = NormalIpcp::new(c, Box::new(Fifo::new(1000))).unwrap();
    p.add_port(PORT);
    p.rmt_mut().table_mut().set(3 - addr, None, vec![PORT]);
    let ep = Endpoint {
        local_cep: 10 * addr,
        remote_addr: 3 - addr,
        remote_cep: 10 * (3 - addr),
        qos_id: 1,
    };
    p.open_flow(Instant::ZERO, 7, ep, EfcpConfig::reliable())
        .unwrap();
    p
}

fn pair(rekey: Rekey) -> [NormalIpcp; 2] {
    [member(1, rekey), member(2, rekey)]
}

/// What the wire did: every frame as sent, and what was delivered to flow
/// 7 on each side.
#[derive(Default)]
struct Wire {
    frames: Vec<Vec<u8>>,
    delivered: [Vec<Vec<u8>>; 2],
}

/// Carries frames both ways until nothing moves; `hook` turns each frame
/// sent into the frames that arrive (none, it, a changed one, copies).
fn carry(
    net: &mut [NormalIpcp; 2],
    now: Instant,
    wire: &mut Wire,
    hook: &mut dyn FnMut(Vec<u8>) -> Vec<Vec<u8>>,
) {
    loop {
        let mut moved = false;
        for i in 0..2 {
            while let Some(a) = net[i].poll_action() {
                match a {
                    Action::Transmit { frame, .. } => {
                        moved = true;
                        wire.frames.push(frame.to_vec());
                        for f in hook(frame.into_vec()) {
                            net[1 - i].on_frame(now, PORT, &f);
                        }
                    }
                    Action::Deliver { flow: 7, sdu } => wire.delivered[i].push(sdu.into_vec()),
                    _ => {}
                }
            }
        }
        if !moved {
            break;
        }
    }
}

/// Runs timers and the wire from `from` to `to` ms in 10 ms steps; node 0
/// writes `per_step` SDUs of `sdu` every step while `sdus` are left.
#[allow(clippy::too_many_arguments)]
fn run(
    net: &mut [NormalIpcp; 2],
    from: u64,
    to: u64,
    wire: &mut Wire,
    sdus: &mut std::ops::Range<u32>,
    per_step: usize,
    hook: &mut dyn FnMut(Vec<u8>) -> Vec<Vec<u8>>,
) {
    let mut t = from;
    while t <= to {
        let now = at(t);
        for p in net.iter_mut() {
            if p.poll_timeout().is_some_and(|d| d <= now) {
                p.handle_timeout(now);
            }
        }
        for _ in 0..per_step {
            if sdus.start >= sdus.end || !net[0].can_write(7, 300) || !net[0].port_has_keys(PORT) {
                break;
            }
            let i = sdus.next().unwrap();
            let mut sdu = i.to_be_bytes().to_vec();
            sdu.extend_from_slice(MARKER);
            sdu.resize(200, 0x5a);
            net[0].write(now, 7, &sdu).unwrap();
        }
        carry(net, now, wire, hook);
        t += 10;
    }
}

fn counters(p: &NormalIpcp) -> CryptoCounters {
    p.port_protection()[0].counters
}

fn in_order(d: &[Vec<u8>], n: u32) {
    let got: Vec<u32> = d
        .iter()
        .map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
        .collect();
    assert_eq!(got, (0..n).collect::<Vec<_>>());
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn encrypting_members_agree_keys_admit_and_carry_only_sealed_data() {
    let mut net = pair(Rekey::default());
    let mut wire = Wire::default();
    let mut sdus = 0..300;
    run(&mut net, 0, 5_000, &mut wire, &mut sdus, 10, &mut |f| {
        vec![f]
    });
    in_order(&wire.delivered[1], 300);
    for p in &net {
        let pp = p.port_protection();
        assert_eq!(pp.len(), 1);
        assert!(pp[0].key_id.is_some());
        let c = pp[0].counters;
        assert!(c.sealed > 300 / 2 && c.opened > 300 / 2, "{c:?}");
        assert_eq!(c.dropped(), 0, "{c:?}");
        assert!(p.port_admitted(PORT));
    }
    // No frame shows the password or the payload; all but the handshakes
    // (port authentication, in clear) and the hellos before keys are
    // sealed.
    let mut clear = 0;
    for f in &wire.frames {
        assert!(!contains(f, MARKER), "payload in clear");
        assert!(!contains(f, PASSWORD.as_bytes()), "password on the wire");
        match f[0] {
            SEALED => {}
            CLEAR => clear += 1,
            m => panic!("marker {m:#x}"),
        }
    }
    assert!(clear <= 16, "only the handshakes go in clear: {clear}");
    assert!(wire.frames.len() > 300);
}

#[test]
fn tampered_frames_are_counted_and_dropped_and_the_reliable_flow_recovers() {
    let mut net = pair(Rekey::default());
    let mut wire = Wire::default();
    let mut sdus = 0..200;
    let mut k = 0u64;
    let mut tamper = |mut f: Vec<u8>| {
        k += 1;
        if f[0] == SEALED && k.is_multiple_of(5) {
            let i = f.len() / 2;
            f[i] ^= 1;
        }
        vec![f]
    };
    run(&mut net, 0, 20_000, &mut wire, &mut sdus, 5, &mut tamper);
    in_order(&wire.delivered[1], 200);
    let bad: u64 = net.iter().map(|p| counters(p).bad_tag).sum();
    assert!(bad >= 40, "every 5th sealed frame: {bad}");
    assert_eq!(net[1].counters().rx_malformed, 0, "nothing forged got past");
}

#[test]
fn replayed_frames_are_counted_and_dropped_and_data_arrives_once() {
    let mut net = pair(Rekey::default());
    let mut wire = Wire::default();
    let mut sdus = 0..200;
    let mut seen: Vec<Vec<u8>> = Vec::new();
    let mut replay = |f: Vec<u8>| {
        // Each frame arrives, then again, then one captured earlier (in
        // either direction).
        let old = seen.get(seen.len() / 2).cloned();
        seen.push(f.clone());
        let mut v = vec![f.clone(), f];
        v.extend(old);
        v
    };
    run(&mut net, 0, 10_000, &mut wire, &mut sdus, 5, &mut replay);
    in_order(&wire.delivered[1], 200);
    let c = counters(&net[1]);
    assert!(c.replayed >= 200, "{c:?}");
    // Frames this side sent, played back to it, fail: each direction has
    // its own key.
    assert!(c.bad_tag > 0, "reflections refused: {c:?}");
}

#[test]
fn keys_rotate_by_volume_during_traffic_without_loss() {
    let rekey = Rekey {
        bytes: 16_000,
        after: Duration::from_secs(3600),
    };
    let mut net = pair(rekey);
    let mut wire = Wire::default();
    let mut sdus = 0..1000;
    run(&mut net, 0, 20_000, &mut wire, &mut sdus, 10, &mut |f| {
        vec![f]
    });
    in_order(&wire.delivered[1], 1000);
    let c = counters(&net[0]);
    // 1000 sealed frames of ~230 B: a new key every ~70.
    assert!(c.keys_installed >= 8, "{c:?}");
    for p in &net {
        let c = counters(p);
        assert_eq!(c.dropped(), 0, "{c:?}");
    }
}

#[test]
fn keys_rotate_by_time() {
    let rekey = Rekey {
        bytes: u64::MAX,
        after: Duration::from_secs(5),
    };
    let mut net = pair(rekey);
    let mut wire = Wire::default();
    let mut sdus = 0..100;
    run(&mut net, 0, 31_000, &mut wire, &mut sdus, 1, &mut |f| {
        vec![f]
    });
    in_order(&wire.delivered[1], 100);
    for p in &net {
        let c = counters(p);
        // At first, then every 5 s (each side may also install the
        // peer's handshake of the same round).
        assert!((6..=16).contains(&c.keys_installed), "{c:?}");
    }
}

#[test]
fn a_forged_clear_frame_on_a_keyed_port_is_refused() {
    let mut net = pair(Rekey::default());
    let mut wire = Wire::default();
    run(&mut net, 0, 3_000, &mut wire, &mut (0..0), 0, &mut |f| {
        vec![f]
    });
    assert!(net[1].port_has_keys(PORT));
    // A data PDU in clear, with valid SDU protection, for flow 7's CEP.
    let mut dt = Pci::new(PduType::Dt);
    dt.src_addr = 1;
    dt.dst_addr = 2;
    dt.dst_cep = 20;
    dt.src_cep = 10;
    dt.qos_id = 1;
    dt.seq = 1_000_000;
    dt.flags = rina_wire::pci::flags::DRF;
    let mut pdu = Vec::new();
    pci::encode_data(&net[1].cfg.dt, &dt, b"forged", &mut pdu).unwrap();
    let mut frame = vec![CLEAR];
    net[1].sdup.protect(&pdu, 64, &mut frame);
    let before = counters(&net[1]);
    net[1].on_frame(at(3_010), PORT, &frame);
    let after = counters(&net[1]);
    assert_eq!(after.clear_refused, before.clear_refused + 1);
    assert_eq!(net[1].flow_counters(7).unwrap().sdus_in, 0);
    // Nor may it come sealed under a made-up key.
    let mut sealed = vec![SEALED, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 9];
    sealed.extend_from_slice(&frame);
    sealed.extend_from_slice(&[0; 16]);
    net[1].on_frame(at(3_020), PORT, &sealed);
    assert_eq!(counters(&net[1]).unknown_key, before.unknown_key + 1);
}

#[test]
fn a_member_with_the_wrong_password_gets_no_keys() {
    let mut net = pair(Rekey::default());
    if let Some(m) = net[1].mship.as_mut() {
        m.cfg.password = Some("guess".into());
    }
    let mut wire = Wire::default();
    run(&mut net, 0, 5_000, &mut wire, &mut (0..0), 0, &mut |f| {
        vec![f]
    });
    for p in &net {
        assert!(!p.port_has_keys(PORT));
        assert!(!p.port_admitted(PORT));
        assert_eq!(counters(p).sealed, 0);
    }
}

#[test]
fn encryption_without_authentication_is_refused() {
    let mut c = NormalConfig::new("net", 1);
    let mut m = MembershipConfig::new("m1.net".parse().unwrap());
    m.encryption = Some(Rekey::default());
    c.membership = Some(m);
    assert!(matches!(
        NormalIpcp::new(c, Box::new(Fifo::new(10))),
        Err(NormalError::EncryptionWithoutAuthentication)
    ));
}

#[test]
fn routes_and_directory_floods_sent_before_keys_are_sent_again_once_keyed() {
    // As at enrollment: both neighbours come up (and flood) before the
    // port has keys, so those floods are dropped as "no key".
    let cfg = crate::routing::Config {
        // Refreshes far away, so only the resync can bring the routes.
        refresh_interval: Duration::from_secs(600),
        max_age: Duration::from_secs(1800),
        ..Default::default()
    };
    let mut net = [1, 2].map(|a| member_routing(a, Rekey::default(), Some(cfg.clone())));
    for (i, p) in net.iter_mut().enumerate() {
        p.neighbor_up(at(0), PORT, 2 - i as u64, 1);
    }
    let mut wire = Wire::default();
    run(&mut net, 0, 2_000, &mut wire, &mut (0..0), 0, &mut |f| {
        vec![f]
    });
    for (i, p) in net.iter().enumerate() {
        assert!(counters(p).no_key_out >= 1, "floods went before keys");
        let hops = p.routing().unwrap().next_hops();
        assert_eq!(
            hops.get(&(2 - i as u64)),
            Some(&vec![PORT]),
            "member {} routes to its neighbour within 2 s: {hops:?}",
            i + 1
        );
    }
}
