//! `rina-tgen`'s generator and metrics in the simulator: the generator's
//! SDUs, with their real headers, are written into a shim-udp flow of a
//! `rina-sim` world; every SDU delivered is decoded and fed to
//! `FlowMetrics` with the virtual receive time.

use rina_core::shim_udp::{Config, PortId};
use rina_core::Instant;
use rina_sim::scenario::{addr, millis, name};
use rina_sim::world::Ctx;
use rina_sim::{App, Command, LinkConfig, Node, ShimEvent, ShimNode, World};
use rina_tools::tgen::gen::{Generator, Profile};
use rina_tools::tgen::header::{Header, Kind};
use rina_tools::tgen::metrics::{FlowMetrics, FlowReport};
use rina_wire::QosSpec;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

/// A shim node that also keeps the bytes of every SDU delivered to its
/// applications (the plain node keeps only the first 8 bytes).
struct Tap {
    inner: ShimNode,
    got: Vec<(Instant, PortId, Vec<u8>)>,
}

impl Node for Tap {
    type Command = Command;
    type Event = ShimEvent;

    fn addrs(&self) -> Vec<SocketAddr> {
        self.inner.addrs()
    }

    fn on_datagram(
        &mut self,
        ctx: &mut Ctx<'_, ShimEvent>,
        to: SocketAddr,
        from: SocketAddr,
        payload: &[u8],
    ) {
        let before: BTreeMap<PortId, usize> = self
            .inner
            .flows()
            .iter()
            .map(|(p, f)| (*p, f.delivered.len()))
            .collect();
        self.inner.on_datagram(ctx, to, from, payload);
        for (p, f) in self.inner.flows() {
            if f.delivered.len() > before.get(p).copied().unwrap_or(0) {
                // The SDU is the tail of the datagram, after the shim header.
                let len = f.delivered.last().unwrap().len;
                self.got
                    .push((ctx.now(), *p, payload[payload.len() - len..].to_vec()));
            }
        }
    }

    fn on_timeout(&mut self, ctx: &mut Ctx<'_, ShimEvent>) {
        self.inner.on_timeout(ctx)
    }

    fn on_command(&mut self, ctx: &mut Ctx<'_, ShimEvent>, cmd: Command) {
        self.inner.on_command(ctx, cmd)
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.inner.poll_timeout()
    }
}

/// Runs `profile` (seed `seed`) for `secs` from A to B over `link`, and
/// returns B's report of the flow.
fn run(link: LinkConfig, profile: Profile, seed: u64, secs: f64) -> FlowReport {
    let mut w: World<Tap> = World::new(seed);
    w.set_tracing(false);
    // No liveness check: the world runs until idle, which a periodic
    // check would never let it be while the flow is up.
    let mut ca = Config::new("udp");
    ca.directory.insert(name("tgen"), addr(2));
    ca.keepalive = None;
    let mut cb = Config::new("udp");
    cb.keepalive = None;
    let a = w.add_node(Tap {
        inner: ShimNode::new(addr(1), ca),
        got: Vec::new(),
    });
    let b = w.add_node(Tap {
        inner: ShimNode::new(addr(2), cb),
        got: Vec::new(),
    });
    w.connect(addr(1), addr(2), link);
    w.node_mut(b)
        .inner
        .register(name("tgen"), App::sink())
        .unwrap();
    let port = w.node_mut(a).inner.reserve_port();
    w.schedule(
        millis(0),
        a,
        Command::Allocate {
            port,
            local: name("tgen-client"),
            remote: name("tgen"),
            qos: QosSpec::default(),
        },
    );
    // The allocation needs one round trip; traffic starts at 1 s.
    w.run_until(millis(1000)).unwrap();
    assert!(
        w.node(a).inner.flow(port).unwrap().allocated_at.is_some(),
        "flow not allocated"
    );
    let t0 = 1_000_000_000u64;
    let end = (secs * 1e9) as u64;
    let (mut sent, mut bytes) = (0u64, 0u64);
    for p in Generator::new(profile, seed).take_while(|p| p.at_ns < end) {
        let at = t0 + p.at_ns;
        let mut sdu = vec![0u8; p.size];
        Header::data(7, sent, at).write(&mut sdu);
        w.schedule(
            Instant::from_nanos(at),
            a,
            Command::WriteBytes { port, sdu },
        );
        sent += 1;
        bytes += p.size as u64;
    }
    w.run_until_idle().unwrap();
    assert_eq!(w.node(a).inner.flow(port).unwrap().written, sent);
    let mut m = FlowMetrics::new(7, 1 << 20);
    for (at, _, sdu) in &w.node(b).got {
        let h = Header::decode(sdu).expect("a tgen SDU");
        assert_eq!(h.kind, Kind::Data);
        m.on_sdu(at.as_nanos(), &h, sdu.len());
    }
    m.on_fin(sent, bytes);
    m.report("fwd", true, true)
}

#[test]
fn lossy_link_10ms_2pct() {
    // 100 Mb/s, 10 ms one way, 2 % loss; Poisson 2 Mb/s for 100 s (~17,900
    // SDUs: 1σ of the loss estimate is 0.1 percentage point).
    let link = LinkConfig::new(100_000_000, Duration::from_millis(10)).loss(0.02);
    let r = run(link, Profile::named("interactive").unwrap(), 42, 100.0);
    let d = r.delay.unwrap();
    println!(
        "sent {} recv {} loss {:.3}% delay min/avg/p99/max {:.1}/{:.1}/{:.1}/{:.1} us jitter {:.2} us",
        r.sent_sdus, r.recv_sdus, r.loss_pct, d.min_us, d.avg_us, d.p99_us, d.max_us, d.jitter_us
    );
    assert!(r.sent_sdus > 17_000);
    // Never faster than the propagation delay; 1400 B at 100 Mb/s adds 112 µs.
    assert!(d.min_us >= 10_000.0, "{d:?}");
    assert!(d.min_us <= 10_200.0, "{d:?}");
    // Tolerance: ±0.5 percentage point (5σ).
    assert!((r.loss_pct - 2.0).abs() <= 0.5, "loss {}", r.loss_pct);
    assert_eq!(r.duplicates, 0);
    assert_eq!(r.reordered, 0);
    // The histogram counts every SDU received.
    let hist: u64 = r.histogram.as_ref().unwrap().iter().map(|b| b[2]).sum();
    assert_eq!(hist, r.recv_sdus);
    assert_eq!(r.samples_us.as_ref().unwrap().len() as u64, r.recv_sdus);
}

#[test]
fn clean_link_loses_nothing_and_reports_nothing_twice() {
    // No loss, but up to 3 ms of jitter per datagram, which reorders them.
    let mut link = LinkConfig::new(100_000_000, Duration::from_millis(5));
    link.jitter = Duration::from_millis(3);
    let r = run(link, Profile::named("file-sharing").unwrap(), 9, 30.0);
    let d = r.delay.unwrap();
    println!(
        "sent {} recv {} reordered {} delay min/avg/max {:.1}/{:.1}/{:.1} us jitter {:.1} us",
        r.sent_sdus, r.recv_sdus, r.reordered, d.min_us, d.avg_us, d.max_us, d.jitter_us
    );
    assert!(r.sent_sdus > 1000);
    assert_eq!(r.loss_pct, 0.0);
    assert_eq!(r.lost_sdus, 0);
    assert_eq!(r.recv_sdus, r.sent_sdus);
    assert_eq!(r.duplicates, 0);
    assert!(d.min_us >= 5_000.0 && d.max_us <= 8_200.0, "{d:?}");
    assert!(d.jitter_us > 0.0);
    // Uniform jitter in [0, 3] ms: the mean delay is about 5 + 1.5 ms.
    assert!((d.avg_us - 6_500.0).abs() < 200.0, "{d:?}");
}

#[test]
fn same_seed_same_report() {
    let link = LinkConfig::new(10_000_000, Duration::from_millis(10)).loss(0.02);
    let p = Profile::named("voip").unwrap();
    assert_eq!(run(link.clone(), p.clone(), 3, 20.0), run(link, p, 3, 20.0));
}
