//! The directory over emulated links: unchanged `Directory` machines whose
//! entry batches travel as CDAP object values, cut by `mgmt_frag` into
//! fragments that fit a 1400-byte N-1 max SDU and put back together at the
//! other end. Links have delay and jitter (which reorders fragments).

use rina_core::directory::{decode_entries, encode_entries, Config, Directory, DirectoryAction};
use rina_core::mgmt_frag::{Fragmenter, Reassembler};
use rina_core::rmt::{Address, PortId};
use rina_core::Instant;
use rina_sim::world::Ctx;
use rina_sim::{LinkConfig, Node, World};
use rina_wire::name::AppName;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

/// Max SDU of every N-1 flow.
const MTU: usize = 1400;

/// The end of the link from node `a` to node `b`; the port-id of that flow
/// at `a` is `b`.
fn end(a: Address, b: Address) -> SocketAddr {
    SocketAddr::from(([10, 2, a as u8, b as u8], 7000))
}

fn app(s: &str) -> AppName {
    s.parse().unwrap()
}

fn secs(n: u64) -> Instant {
    Instant::ZERO + Duration::from_secs(n)
}

#[derive(Debug)]
enum Cmd {
    Up(Address),
    Register(String),
    Unregister(String),
}

#[derive(Debug, Clone, PartialEq)]
enum Ev {}

struct DirNode {
    addr: Address,
    peers: Vec<Address>,
    live: BTreeSet<Address>,
    dir: Directory,
    frag: BTreeMap<Address, Fragmenter>,
    reasm: Reassembler,
    fragments_sent: u64,
    largest_message: usize,
    errors: u64,
}

impl DirNode {
    fn new(addr: Address, peers: Vec<Address>, cfg: Config) -> Self {
        DirNode {
            addr,
            peers,
            live: BTreeSet::new(),
            dir: Directory::new(addr, cfg).unwrap(),
            frag: BTreeMap::new(),
            reasm: Reassembler::new(1 << 22, Duration::from_secs(5), 64),
            fragments_sent: 0,
            largest_message: 0,
            errors: 0,
        }
    }

    fn carry(&mut self, ctx: &mut Ctx<'_, Ev>) {
        while let Some(a) = self.dir.poll_action() {
            let (ports, entries) = match a {
                DirectoryAction::Flood { to_ports, entries } => (to_ports, entries),
                DirectoryAction::Send { port, entries } => (vec![port], entries),
            };
            let bytes = encode_entries(&entries);
            self.largest_message = self.largest_message.max(bytes.len());
            for p in ports {
                let b = Address::from(p);
                let frags = self
                    .frag
                    .entry(b)
                    .or_default()
                    .fragment(&bytes, MTU)
                    .unwrap();
                for f in frags {
                    assert!(f.len() <= MTU);
                    self.fragments_sent += 1;
                    ctx.transmit(end(self.addr, b), end(b, self.addr), f);
                }
            }
        }
    }
}

impl Node for DirNode {
    type Command = Cmd;
    type Event = Ev;

    fn addrs(&self) -> Vec<SocketAddr> {
        self.peers.iter().map(|&b| end(self.addr, b)).collect()
    }

    fn on_datagram(
        &mut self,
        ctx: &mut Ctx<'_, Ev>,
        to: SocketAddr,
        _: SocketAddr,
        payload: &[u8],
    ) {
        let SocketAddr::V4(v4) = to else { return };
        let peer = Address::from(v4.ip().octets()[3]);
        if !self.live.contains(&peer) {
            return;
        }
        match self.reasm.push(ctx.now(), peer as PortId, payload) {
            Ok(Some(msg)) => match decode_entries(&msg) {
                Ok(es) => self.dir.on_entries(ctx.now(), peer as PortId, es),
                Err(_) => self.errors += 1,
            },
            Ok(None) => {}
            Err(_) => self.errors += 1,
        }
        self.carry(ctx);
    }

    fn on_timeout(&mut self, ctx: &mut Ctx<'_, Ev>) {
        let now = ctx.now();
        self.dir.handle_timeout(now);
        self.reasm.handle_timeout(now);
        self.carry(ctx);
    }

    fn on_command(&mut self, ctx: &mut Ctx<'_, Ev>, cmd: Cmd) {
        let now = ctx.now();
        match cmd {
            Cmd::Up(b) => {
                self.live.insert(b);
                self.dir.neighbor_up(now, b as PortId).unwrap();
            }
            Cmd::Register(n) => self.dir.register(now, app(&n)).unwrap(),
            Cmd::Unregister(n) => self.dir.unregister(now, &app(&n)).unwrap(),
        }
        self.carry(ctx);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        [self.dir.poll_timeout(), self.reasm.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
    }
}

/// A line of `n` nodes (1 – 2 – … – n); links listed, not yet up.
fn line(seed: u64, n: Address, link: LinkConfig, cfg: &Config) -> (World<DirNode>, Vec<usize>) {
    let mut world = World::new(seed);
    let mut ids = vec![usize::MAX];
    for a in 1..=n {
        let peers: Vec<Address> = [a.wrapping_sub(1), a + 1]
            .into_iter()
            .filter(|p| (1..=n).contains(p))
            .collect();
        ids.push(world.add_node(DirNode::new(a, peers, cfg.clone())));
    }
    for a in 1..n {
        world.connect(end(a, a + 1), end(a + 1, a), link.clone());
    }
    (world, ids)
}

fn up(world: &mut World<DirNode>, ids: &[usize], at: Instant, a: Address, b: Address) {
    world.schedule(at, ids[a as usize], Cmd::Up(b));
    world.schedule(at, ids[b as usize], Cmd::Up(a));
}

/// Seed 000 §16.4.3.4: the echo server registers at System 3, the client at
/// System 1 finds it; the server moves to System 2, the unchanged client
/// finds it there.
#[test]
fn location_independence() {
    let cfg = Config::default();
    let link = LinkConfig::ideal(Duration::from_millis(5)).jitter(Duration::from_millis(2));
    let (mut w, ids) = line(1, 3, link, &cfg);
    up(&mut w, &ids, Instant::ZERO, 1, 2);
    up(&mut w, &ids, Instant::ZERO, 2, 3);
    let server = "rina.apps.echotime.server";
    w.schedule(secs(1), ids[3], Cmd::Register(server.into()));
    w.run_until(secs(2)).unwrap();
    assert_eq!(w.node(ids[1]).dir.lookup(&app(server)), Some(3));
    w.schedule(secs(3), ids[3], Cmd::Unregister(server.into()));
    w.schedule(secs(3), ids[2], Cmd::Register(server.into()));
    w.run_until(secs(4)).unwrap();
    for (a, &id) in ids.iter().enumerate().skip(1) {
        assert_eq!(w.node(id).dir.lookup(&app(server)), Some(2), "at {a}");
    }
    // Still so after several refresh periods and the tombstone's expiry.
    w.run_until(secs(100)).unwrap();
    for &id in &ids[1..] {
        let n = w.node(id);
        assert_eq!(n.dir.lookup(&app(server)), Some(2));
        assert_eq!(n.dir.db_len(), 1);
        assert_eq!(n.errors, 0);
    }
}

/// A 50-member DIF with 20 applications per member: the directory sync a
/// joining member receives is one message far larger than the N-1 max SDU.
/// It arrives fragmented (and reordered by jitter) and is reassembled.
#[test]
fn fifty_member_dif_syncs_a_directory_larger_than_the_mtu() {
    let cfg = Config {
        // One message per sync or flood: the worst case for the MTU.
        max_entries_per_message: 100_000,
        ..Config::default()
    };
    let link = LinkConfig::ideal(Duration::from_millis(2)).jitter(Duration::from_millis(1));
    let (mut w, ids) = line(5, 51, link, &cfg);
    for a in 1..50 {
        up(&mut w, &ids, Instant::ZERO, a, a + 1);
    }
    for a in 1..=50u64 {
        for i in 0..20 {
            w.schedule(
                Instant::ZERO + Duration::from_millis(10),
                ids[a as usize],
                Cmd::Register(format!("member{a}.app{i}/1/entity")),
            );
        }
    }
    w.run_until(secs(5)).unwrap();
    for (a, &id) in ids.iter().enumerate().take(51).skip(1) {
        assert_eq!(w.node(id).dir.db_len(), 1000, "member {a}");
    }
    // Member 51 joins at member 50.
    let t0 = secs(6);
    up(&mut w, &ids, t0, 50, 51);
    w.run_until(secs(7)).unwrap();
    let joined = w.node(ids[51]);
    let at50 = w.node(ids[50]);
    eprintln!(
        "DB sync of 1000 entries: {} bytes in one message, {} fragments reassembled at member 51",
        at50.largest_message,
        joined.reasm.counters().rx_fragments
    );
    assert!(at50.largest_message > 20 * MTU);
    assert_eq!(joined.dir.db_len(), 1000);
    assert_eq!(joined.dir.lookup(&app("member1.app7/1/entity")), Some(1));
    assert_eq!(joined.reasm.counters().reassembled, 1);
    assert_eq!(joined.reasm.pending_len(), 0);
    for &id in &ids[1..] {
        assert_eq!(w.node(id).errors, 0);
    }
}
