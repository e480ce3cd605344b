//! Data-path benchmark of the sans-IO core (not a test): what the core
//! itself costs per SDU, with no system call, no other process and no
//! scheduler in the way, so that its figures hold still on a shared
//! machine where the daemon benchmarks swing by ±20 %.
//!
//! Two systems, each a shim-udp and a normal IPCP `net` (and, with
//! `--stack`, a normal IPCP `up` stacked on `net`), joined by handing each
//! one's frames straight to the other. An application flow across the top
//! DIF carries `--sdus` SDUs of `--size` bytes one way: the sender's
//! `System::write` to its frames for the medium, the receiver's
//! `handle_frame` to the SDU for the application. It prints nanoseconds
//! and [`rina_core::buf`] copies per SDU on each side. With `--batch N`,
//! the receiver takes each turn's N frames in their buffers with
//! `System::receive_udp_held` and settles once, as `rinad` does with a
//! batch read from its UDP socket (each datagram read into a buffer of its
//! own; here the sender's buffer is handed over, so the kernel's copy that
//! `rinad` pays for is not counted);
//! with `--held-writes` as well, the sender writes the turn's N SDUs with
//! `System::write_held` and settles once, as `rinad` does with the SDUs it
//! takes from an application flow in a turn. `--max-pdu B` sets the
//! largest PDU of `net` (9000 unless given), so that `--size 65000
//! --max-pdu 1450` fragments each SDU as `rina-ip`'s packets are over a
//! 1500-byte link.
//!
//!   cargo run --release -p rina-core --example data_path_core -- --stack [--batch 16 [--held-writes]]

use rina_core::buf;
use rina_core::efcp::EfcpConfig;
use rina_core::normal::{MembershipConfig, NormalConfig, QosCube};
use rina_core::rmt::{FifoConfig, SchedulerConfig};
use rina_core::shim_udp;
use rina_core::system::{AppEvent, NeighborSpec, Output, PortId, System};
use rina_core::Instant;
use rina_wire::{AppName, QosSpec};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant as Clock};

fn name(s: &str) -> AppName {
    s.parse().expect("a valid name")
}

fn udp(i: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7000 + i as u16))
}

/// A normal IPCP's configuration: one unreliable cube, the application
/// `sink` and the upper IPCP `s1.up` at address 2, `s0.up` at 1.
fn normal(dif: &str, me: &str, addr: u64) -> NormalConfig {
    let mut c = NormalConfig::new(dif, addr);
    c.membership = Some(MembershipConfig::new(name(me)));
    c.routing = Some(rina_core::routing::Config::default());
    c.cubes = vec![QosCube::new(1, "best-effort", EfcpConfig::unreliable())];
    c.directory.insert(name("sink"), 2);
    // The upper IPCPs are applications of the lower DIF.
    c.directory.insert(name("s0.up"), 1);
    c.directory.insert(name("s1.up"), 2);
    c.dt.max_pdu_size = 9000;
    c
}

/// System `i` of two.
fn system(i: usize, stack: bool, max_pdu: u32) -> System {
    let peer = 1 - i;
    let fifo = SchedulerConfig::Fifo(FifoConfig { queue_len: 1000 });
    let mut s = System::new(format!("s{i}"));
    let mut sc = shim_udp::Config::new("udp");
    sc.directory
        .insert(name(&format!("s{peer}.net")), udp(peer));
    s.add_shim_udp("udp", sc, None).expect("a shim");
    let nb = |dif: &str, over: &str| NeighborSpec {
        name: name(&format!("s{peer}.{dif}")),
        over: over.into(),
        address: None,
    };
    let me = format!("s{i}.net");
    let mut net = normal("net", &me, i as u64 + 1);
    net.dt.max_pdu_size = max_pdu;
    s.add_normal(
        name(&me),
        net,
        &fifo,
        vec![nb("net", "udp")],
        BTreeMap::new(),
    )
    .expect("net");
    if stack {
        let me = format!("s{i}.up");
        let mut up = normal("up", &me, i as u64 + 1);
        up.dt.max_pdu_size = 8000;
        s.add_normal(name(&me), up, &fifo, vec![nb("up", "net")], BTreeMap::new())
            .expect("up");
    }
    s
}

/// SDUs delivered to the receiving application outside the timed part
/// (those sent during a turn of the timers).
static LATE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Hands frames across until both systems are quiet; returns what the
/// applications were told.
fn settle(sys: &mut [System; 2], now: Instant) -> Vec<(usize, AppEvent)> {
    let mut events = Vec::new();
    loop {
        let mut quiet = true;
        for i in 0..2 {
            while let Some(o) = sys[i].poll_output() {
                quiet = false;
                match o {
                    Output::ToMedium { frame, .. } => {
                        sys[1 - i].handle_frame(now, 0, udp(i), &frame)
                    }
                    Output::App(ev) => events.push((i, ev)),
                    Output::ToApp { .. } => {
                        LATE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
        }
        if quiet {
            return events;
        }
    }
}

/// Runs both systems' timers and frames for `ms` milliseconds from `t`.
fn run(sys: &mut [System; 2], t: &mut Instant, ms: u64) -> Vec<(usize, AppEvent)> {
    let mut events = Vec::new();
    for _ in 0..ms {
        *t = *t + Duration::from_millis(1);
        for s in sys.iter_mut() {
            if s.poll_timeout().is_some_and(|d| d <= *t) {
                s.handle_timeout(*t);
            }
        }
        events.extend(settle(sys, *t));
    }
    events
}

fn main() {
    let (mut stack, mut sdus, mut size) = (false, 200_000usize, 1400usize);
    let (mut batch, mut held_writes, mut max_pdu) = (1usize, false, 9000u32);
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        match k.as_str() {
            "--stack" => stack = true,
            "--sdus" => sdus = it.next().and_then(|v| v.parse().ok()).expect("--sdus N"),
            "--size" => size = it.next().and_then(|v| v.parse().ok()).expect("--size B"),
            "--batch" => batch = it.next().and_then(|v| v.parse().ok()).expect("--batch N"),
            "--held-writes" => held_writes = true,
            "--max-pdu" => max_pdu = it.next().and_then(|v| v.parse().ok()).expect("--max-pdu B"),
            _ => panic!("unknown argument {k}"),
        }
    }
    let top = if stack { "up" } else { "net" };
    let mut sys = [system(0, stack, max_pdu), system(1, stack, max_pdu)];
    let mut t = Instant::ZERO;
    run(&mut sys, &mut t, 8000);
    sys[1].register(top, name("sink")).expect("register");
    let port = sys[0]
        .allocate(t, Some(top), name("src"), name("sink"), QosSpec::default())
        .expect("allocate");
    let mut handle = None;
    let mut theirs: Option<PortId> = None;
    for _ in 0..2000 {
        for (i, ev) in run(&mut sys, &mut t, 1) {
            if let (1, AppEvent::FlowRequest { handle: h, .. }) = (i, &ev) {
                handle = Some(*h);
            }
        }
        if let Some(h) = handle.take() {
            theirs = Some(sys[1].accept(t, h).expect("accept").0);
        }
        if theirs.is_some() && sys[0].can_write(port, size) {
            break;
        }
    }
    assert!(theirs.is_some(), "the flow did not come up");
    let sdu = vec![0x5a; size];
    LATE.store(0, std::sync::atomic::Ordering::Relaxed);
    let (mut tx_ns, mut rx_ns, mut got) = (0u128, 0u128, 0usize);
    let mut refused = 0usize;
    let (mut tx_copies, mut rx_copies) = (0u64, 0u64);
    let mut out = Vec::new();
    for _ in 0..sdus / batch.max(1) {
        let c0 = buf::stats();
        let w = Clock::now();
        for _ in 0..batch.max(1) {
            let res = if held_writes {
                sys[0].write_held(t, port, &sdu)
            } else {
                sys[0].write(t, port, &sdu)
            };
            if res.is_err() {
                refused += 1;
            }
        }
        if held_writes {
            sys[0].settle(t);
        }
        while let Some(o) = sys[0].poll_output() {
            if let Output::ToMedium { frame, .. } = o {
                out.push(frame);
            }
        }
        tx_ns += w.elapsed().as_nanos();
        let c1 = buf::stats();
        let r = Clock::now();
        if batch > 1 {
            for f in out.drain(..) {
                // Every SDU rides a normal DIF: nothing comes back here.
                let _ = sys[1].receive_udp_held(t, 0, udp(0), f);
            }
            sys[1].settle(t);
        } else {
            for f in out.drain(..) {
                sys[1].handle_frame(t, 0, udp(0), &f);
            }
        }
        while let Some(o) = sys[1].poll_output() {
            if let Output::ToApp { sdu, .. } = o {
                got += usize::from(sdu.len() == size);
            }
        }
        rx_ns += r.elapsed().as_nanos();
        let c2 = buf::stats();
        tx_copies += c1.copies - c0.copies;
        rx_copies += c2.copies - c1.copies;
        t = t + Duration::from_micros(10);
        for s in sys.iter_mut() {
            if s.poll_timeout().is_some_and(|d| d <= t) {
                s.handle_timeout(t);
            }
        }
        settle(&mut sys, t);
    }
    let n = (sdus / batch.max(1) * batch.max(1)) as f64;
    println!(
        "core data path: {} DIF{}, {sdus} SDUs of {size} B",
        if stack { 2 } else { 1 },
        if stack { "s stacked" } else { "" }
    );
    let late = LATE.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "  delivered {} of {sdus} ({late} of them sent in a turn of the timers, not timed; writes refused: {refused})",
        got + late
    );
    println!(
        "  send    {:7.0} ns/SDU   buffer copies/SDU {:.2}",
        tx_ns as f64 / n,
        tx_copies as f64 / n
    );
    println!(
        "  receive {:7.0} ns/SDU   buffer copies/SDU {:.2}",
        rx_ns as f64 / n,
        rx_copies as f64 / n
    );
    println!(
        "  both    {:7.0} ns/SDU   ({:.2} Gb/s of SDUs on one core)",
        (tx_ns + rx_ns) as f64 / n,
        size as f64 * 8.0 * n / (tx_ns + rx_ns) as f64
    );
}
