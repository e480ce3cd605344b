//! What encryption of N-1 flows costs in CPU (issue 18), without a network:
//!
//! 1. AES-256-GCM sealing and opening of 1400-byte frames alone
//!    (`sdup::aead::PortCrypto`);
//! 2. two normal IPCPs (members with a password) joined in memory, one
//!    writing 1400-byte SDUs on an unreliable flow to the other, every
//!    frame carried by hand: the whole data path, with and without
//!    encryption.
//!
//! `cargo run --release -p rina-core --example encryption_cost [SDUS]`

use rina_core::efcp::EfcpConfig;
use rina_core::normal::{Action, Endpoint, MembershipConfig, NormalConfig, NormalIpcp};
use rina_core::rmt::Fifo;
use rina_core::sdup::aead::{ephemeral_public, PortCrypto, Rekey, SessionKeys};
use rina_core::time::Instant;
use std::time::Duration;

const SDU: usize = 1400;

fn member(addr: u64, encrypt: bool) -> NormalIpcp {
    let mut c = NormalConfig::new("net", addr);
    c.dt.max_pdu_size = 9000;
    let mut m = MembershipConfig::new(format!("m{addr}.net").parse().unwrap());
    m.password = Some("bench".into());
    m.entropy = [addr as u8; 32];
    m.encryption = encrypt.then(Rekey::default);
    c.membership = Some(m);
    let mut p = NormalIpcp::new(c, Box::new(Fifo::new(100_000))).unwrap();
    p.add_port(1);
    p.rmt_mut().table_mut().set(3 - addr, None, vec![1]);
    let ep = Endpoint {
        local_cep: 10 * addr,
        remote_addr: 3 - addr,
        remote_cep: 10 * (3 - addr),
        qos_id: 1,
    };
    p.open_flow(Instant::ZERO, 7, ep, EfcpConfig::unreliable())
        .unwrap();
    p
}

/// Carries frames both ways until nothing moves; returns bytes delivered.
fn carry(net: &mut [NormalIpcp; 2], now: Instant) -> usize {
    let mut delivered = 0;
    loop {
        let mut moved = false;
        for i in 0..2 {
            // A driver's turn: timers that are due (among them the end of
            // a port's burst, which lets the RMT hand down more).
            if net[i].poll_timeout().is_some_and(|t| t <= now) {
                net[i].handle_timeout(now);
            }
            while let Some(a) = net[i].poll_action() {
                match a {
                    Action::Transmit { frame, .. } => {
                        moved = true;
                        net[1 - i].on_frame(now, 1, &frame);
                    }
                    Action::Deliver { sdu, .. } => delivered += sdu.len(),
                    _ => {}
                }
            }
        }
        if !moved {
            return delivered;
        }
    }
}

fn data_path(sdus: usize, encrypt: bool) -> f64 {
    let mut net = [member(1, encrypt), member(2, encrypt)];
    // Let the members authenticate (and agree keys) on the port.
    let mut now = Instant::ZERO;
    for _ in 0..30 {
        for p in net.iter_mut() {
            if p.poll_timeout().is_some_and(|t| t <= now) {
                p.handle_timeout(now);
            }
        }
        carry(&mut net, now);
        now = now + Duration::from_millis(100);
    }
    let sdu = vec![0x5a; SDU];
    let start = std::time::Instant::now();
    let mut delivered = 0;
    for k in 0..sdus {
        net[0].write(now, 7, &sdu).unwrap();
        if k % 64 == 63 {
            delivered += carry(&mut net, now);
        }
    }
    delivered += carry(&mut net, now);
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(delivered, sdus * SDU, "every SDU delivered");
    if encrypt {
        let c = net[1].port_protection()[0].counters;
        assert!(c.opened as usize >= sdus, "{c:?}");
    }
    delivered as f64 * 8.0 / secs / 1e6
}

fn aead_only(frames: usize) -> f64 {
    let (a, b) = ([1u8; 32], [2u8; 32]);
    let (na, nb) = (ephemeral_public(&a), ephemeral_public(&b));
    let (mut tx, mut rx) = (PortCrypto::new(), PortCrypto::new());
    tx.install(
        Instant::ZERO,
        &SessionKeys::derive(&a, &na, &nb, true).unwrap(),
    );
    rx.install(
        Instant::ZERO,
        &SessionKeys::derive(&b, &na, &nb, false).unwrap(),
    );
    let frame = vec![0x5a; SDU + 30];
    let start = std::time::Instant::now();
    for _ in 0..frames {
        let sealed = tx.seal(&frame).unwrap();
        rx.open(&sealed).unwrap();
    }
    (frames * frame.len()) as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e6
}

fn main() {
    let sdus: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    println!("{SDU}-byte SDUs, {sdus} of them, one thread");
    println!(
        "seal + open alone (AES-256-GCM):        {:8.0} Mb/s",
        aead_only(sdus)
    );
    let plain = data_path(sdus, false);
    let enc = data_path(sdus, true);
    println!("normal IPCP to normal IPCP, plain:      {plain:8.0} Mb/s");
    println!("normal IPCP to normal IPCP, encrypted:  {enc:8.0} Mb/s");
    println!(
        "encryption costs {:.1} % of the data path's throughput",
        (1.0 - enc / plain) * 100.0
    );
}
