//! Unit tests of the directory, with explicit time and a hand-carried
//! network: every message goes through the CDAP object encoding and arrives
//! after a fixed link delay.

use super::*;
use proptest::prelude::*;

fn ms(n: u64) -> Instant {
    Instant::from_nanos(n * 1_000_000)
}

fn app(s: &str) -> AppName {
    s.parse().unwrap()
}

fn entry(name: &str, address: Address, seq: u64, version: u64, alive: bool) -> DirEntry {
    DirEntry {
        name: app(name),
        address,
        seq,
        version,
        alive,
        age: 0,
    }
}

fn drain(m: &mut Directory) -> Vec<DirectoryAction> {
    std::iter::from_fn(|| m.poll_action()).collect()
}

/// A network of directories. The link between `a` and `b` is port `b` at
/// `a` and port `a` at `b`.
struct Net {
    now: Instant,
    delay: Duration,
    nodes: BTreeMap<Address, Directory>,
    links: BTreeSet<(Address, Address)>,
    /// In flight: (arrival, order) -> (to node, on port, encoded entries).
    wire: BTreeMap<(Instant, u64), (Address, PortId, Vec<u8>)>,
    order: u64,
    messages: u64,
}

impl Net {
    fn new(addrs: impl IntoIterator<Item = Address>, cfg: &Config) -> Net {
        Net {
            now: Instant::ZERO,
            delay: Duration::from_millis(5),
            nodes: addrs
                .into_iter()
                .map(|a| (a, Directory::new(a, cfg.clone()).unwrap()))
                .collect(),
            links: BTreeSet::new(),
            wire: BTreeMap::new(),
            order: 0,
            messages: 0,
        }
    }

    fn node(&self, a: Address) -> &Directory {
        &self.nodes[&a]
    }

    fn node_mut(&mut self, a: Address) -> &mut Directory {
        self.nodes.get_mut(&a).unwrap()
    }

    fn link(&mut self, a: Address, b: Address) {
        self.links.insert((a, b));
        self.links.insert((b, a));
        let now = self.now;
        self.node_mut(a).neighbor_up(now, b as PortId).unwrap();
        self.node_mut(b).neighbor_up(now, a as PortId).unwrap();
        self.carry();
    }

    fn cut(&mut self, a: Address, b: Address) {
        self.links.remove(&(a, b));
        self.links.remove(&(b, a));
        self.node_mut(a).neighbor_down(b as PortId).unwrap();
        self.node_mut(b).neighbor_down(a as PortId).unwrap();
    }

    fn register(&mut self, at: Address, name: &str) {
        let now = self.now;
        self.node_mut(at).register(now, app(name)).unwrap();
        self.carry();
    }

    fn unregister(&mut self, at: Address, name: &str) {
        let now = self.now;
        self.node_mut(at).unregister(now, &app(name)).unwrap();
        self.carry();
    }

    /// Puts every queued action on the wire.
    fn carry(&mut self) {
        let addrs: Vec<Address> = self.nodes.keys().copied().collect();
        for a in addrs {
            for act in drain(self.node_mut(a)) {
                let (ports, entries) = match act {
                    DirectoryAction::Flood { to_ports, entries } => (to_ports, entries),
                    DirectoryAction::Send { port, entries } => (vec![port], entries),
                };
                let bytes = encode_entries(&entries);
                for p in ports {
                    let b = p as Address;
                    if !self.links.contains(&(a, b)) {
                        continue;
                    }
                    self.messages += 1;
                    self.order += 1;
                    self.wire.insert(
                        (self.now + self.delay, self.order),
                        (b, a as PortId, bytes.clone()),
                    );
                }
            }
        }
    }

    fn next_event(&self) -> Option<Instant> {
        let t = self.nodes.values().filter_map(|n| n.poll_timeout()).min();
        let w = self.wire.keys().next().map(|k| k.0);
        [t, w].into_iter().flatten().min()
    }

    fn run_until(&mut self, end: Instant) {
        while let Some(t) = self.next_event().filter(|t| *t <= end) {
            self.now = self.now.max(t);
            let now = self.now;
            while let Some(e) = self.wire.first_entry() {
                if e.key().0 > now {
                    break;
                }
                let (to, port, bytes) = e.remove();
                let entries = decode_entries(&bytes).unwrap();
                self.node_mut(to).on_entries(now, port, entries);
            }
            for n in self.nodes.values_mut() {
                if n.poll_timeout().is_some_and(|t| t <= now) {
                    n.handle_timeout(now);
                }
            }
            self.carry();
        }
        self.now = self.now.max(end);
    }

    fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        self.run_until(end);
    }

    fn lookups(&self, name: &str) -> Vec<Option<Address>> {
        self.nodes.values().map(|n| n.lookup(&app(name))).collect()
    }
}

fn line() -> Net {
    let mut net = Net::new([1, 2, 3], &Config::default());
    net.link(1, 2);
    net.link(2, 3);
    net
}

const A: Address = 1;
const B: Address = 2;
const C: Address = 3;

#[test]
fn config_is_validated() {
    let bad = |c: Config| Directory::new(1, c).unwrap_err();
    assert!(matches!(
        bad(Config {
            max_age: Duration::from_secs(1),
            ..Config::default()
        }),
        DirectoryError::InvalidConfig(_)
    ));
    assert!(matches!(
        bad(Config {
            refresh_interval: Duration::from_secs(60),
            ..Config::default()
        }),
        DirectoryError::InvalidConfig(_)
    ));
    assert!(matches!(
        bad(Config {
            max_entries_per_message: 0,
            ..Config::default()
        }),
        DirectoryError::InvalidConfig(_)
    ));
    assert!(matches!(
        bad(Config {
            max_entries: 0,
            ..Config::default()
        }),
        DirectoryError::InvalidConfig(_)
    ));
}

#[test]
fn registration_reaches_the_far_end() {
    let mut net = line();
    net.register(C, "echo");
    assert_eq!(net.node(C).lookup(&app("echo")), Some(C));
    assert_eq!(net.node(A).lookup(&app("echo")), None);
    net.run_for(Duration::from_millis(50));
    // Two hops of 5 ms; the first flood leaves at once, the second at once
    // too (quiet before).
    assert_eq!(net.lookups("echo"), vec![Some(C); 3]);
    let e = net.node(A).entry(net.now, &app("echo"), C).unwrap();
    assert_eq!((e.seq, e.version, e.alive), (1, 1, true));
    assert_eq!(net.node(A).counters().rx_accepted, 1);
    assert_eq!(net.node(B).counters().rx_accepted, 1);
    // B floods it on to A only (not back to C).
    assert_eq!(net.node(B).counters().tx_entries, 1);
}

#[test]
fn moved_application_is_found_at_its_new_place() {
    let mut net = line();
    net.register(C, "echo");
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.node(A).lookup(&app("echo")), Some(C));
    net.unregister(C, "echo");
    net.register(B, "echo");
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.lookups("echo"), vec![Some(B); 3]);
    let b = net.node(A).entry(net.now, &app("echo"), B).unwrap();
    let c = net.node(A).entry(net.now, &app("echo"), C).unwrap();
    assert_eq!((b.version, b.alive), (2, true));
    assert_eq!((c.seq, c.version, c.alive), (2, 1, false));
}

#[test]
fn registration_elsewhere_before_withdrawal_still_wins() {
    // B registers once it knows of C's entry; C withdraws later.
    let mut net = line();
    net.register(C, "echo");
    net.run_for(Duration::from_secs(1));
    net.register(B, "echo");
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.lookups("echo"), vec![Some(B); 3]);
    assert_eq!(net.node(A).lookup_all(&app("echo")), vec![B, C]);
    net.unregister(C, "echo");
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.lookups("echo"), vec![Some(B); 3]);
}

#[test]
fn equal_versions_pick_the_lower_address() {
    let mut d = Directory::new(A, Config::default()).unwrap();
    d.on_entries(
        ms(0),
        9,
        [entry("x", 7, 1, 3, true), entry("x", 5, 1, 3, true)],
    );
    assert_eq!(d.lookup(&app("x")), Some(5));
    d.on_entries(ms(0), 9, [entry("x", 7, 2, 4, true)]);
    assert_eq!(d.lookup(&app("x")), Some(7));
    // A local registration takes one above everything seen.
    d.register(ms(1), app("x")).unwrap();
    assert_eq!(d.entry(ms(1), &app("x"), A).unwrap().version, 5);
    assert_eq!(d.lookup(&app("x")), Some(A));
}

#[test]
fn tombstone_expires() {
    let cfg = Config::default();
    let mut net = line();
    net.register(C, "echo");
    net.run_for(Duration::from_secs(1));
    let t0 = net.now;
    net.unregister(C, "echo");
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.lookups("echo"), vec![None; 3]);
    for a in [A, B, C] {
        assert_eq!(net.node(a).db_len(), 1, "tombstone kept at {a}");
    }
    // Not refreshed; gone everywhere after max_age (plus at most one second
    // of truncation per hop).
    net.run_until(t0 + (cfg.max_age - Duration::from_secs(3)));
    assert_eq!(net.node(A).db_len(), 1);
    net.run_until(t0 + cfg.max_age + Duration::from_secs(1));
    for a in [A, B, C] {
        assert_eq!(net.node(a).db_len(), 0, "tombstone left at {a}");
        assert_eq!(net.node(a).counters().expired, 1);
    }
    assert_eq!(net.node(A).poll_timeout(), None);
    // C still remembers its sequence number.
    net.register(C, "echo");
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.node(A).entry(net.now, &app("echo"), C).unwrap().seq, 3);
}

#[test]
fn late_old_update_does_not_resurrect() {
    let mut net = line();
    net.register(C, "echo");
    net.run_for(Duration::from_secs(1));
    let old = net.node(A).entry(net.now, &app("echo"), C).unwrap();
    net.unregister(C, "echo");
    net.register(B, "echo");
    net.run_for(Duration::from_secs(1));
    // The old alive entry turns up late at A: stale.
    let now = net.now;
    net.node_mut(A).on_entries(now, B as PortId, [old.clone()]);
    assert_eq!(net.node(A).counters().rx_stale, 1);
    assert_eq!(net.node(A).lookup(&app("echo")), Some(B));
    assert!(drain(net.node_mut(A)).is_empty());
    // Even once C's tombstone has expired, the late copy loses to B's
    // newer version.
    net.run_for(Duration::from_secs(70));
    assert!(net.node(A).entry(net.now, &app("echo"), C).is_none());
    let now = net.now;
    net.node_mut(A).on_entries(now, B as PortId, [old.clone()]);
    assert_eq!(net.node(A).lookup(&app("echo")), Some(B));
    // And at its origin, an old copy of its own entry is stale.
    net.node_mut(C).on_entries(now, B as PortId, [old]);
    assert_eq!(net.node(C).counters().rx_stale, 1);
}

#[test]
fn own_newer_copy_is_overtaken() {
    // C restarted: the DIF still holds C's entry at seq 5.
    let mut d = Directory::new(C, Config::default()).unwrap();
    d.neighbor_up(ms(0), 2).unwrap();
    d.on_entries(ms(0), 2, [entry("echo", C, 5, 4, true)]);
    assert_eq!(d.counters().rx_own_newer, 1);
    let e = d.entry(ms(0), &app("echo"), C).unwrap();
    assert_eq!((e.seq, e.version, e.alive), (6, 4, false));
    d.handle_timeout(ms(0));
    let acts = drain(&mut d);
    assert_eq!(
        acts,
        vec![DirectoryAction::Flood {
            to_ports: vec![2],
            entries: vec![e]
        }]
    );
}

#[test]
fn db_sync_on_neighbour_up() {
    let mut net = Net::new([1, 2, 3, 4], &Config::default());
    net.link(1, 2);
    net.register(1, "a");
    net.register(2, "b");
    net.register(2, "c");
    net.run_for(Duration::from_secs(1));
    assert_eq!(net.node(1).db_len(), 3);
    // 3 joins: one Send with the three entries; 3's own is sent to 2.
    net.register(3, "d");
    net.node_mut(3).handle_timeout(ms(1000));
    let now = net.now;
    net.node_mut(2).neighbor_up(now, 3).unwrap();
    let acts = drain(net.node_mut(2));
    assert_eq!(acts.len(), 1);
    match &acts[0] {
        DirectoryAction::Send { port, entries } => {
            assert_eq!(*port, 3);
            let names: Vec<String> = entries.iter().map(|e| e.name.to_string()).collect();
            assert_eq!(names, ["a", "b", "c"]);
        }
        other => panic!("unexpected {other:?}"),
    }
    if let DirectoryAction::Send { entries, .. } = &acts[0] {
        net.order += 1;
        net.wire.insert(
            (now + net.delay, net.order),
            (3, 2, encode_entries(entries)),
        );
    }
    net.links.insert((2, 3));
    net.links.insert((3, 2));
    net.node_mut(3).neighbor_up(now, 2).unwrap();
    net.carry();
    net.run_for(Duration::from_secs(1));
    for n in [1, 2, 3] {
        assert_eq!(net.node(n).db_len(), 4, "node {n}");
    }
    assert_eq!(net.node(1).lookup(&app("d")), Some(3));
    assert_eq!(net.node(3).lookup(&app("a")), Some(1));
    assert_eq!(net.node(2).counters().db_syncs, 2);
    // Neighbour errors.
    assert_eq!(
        net.node_mut(2).neighbor_up(now, 3),
        Err(DirectoryError::PortUp(3))
    );
    assert_eq!(
        net.node_mut(4).neighbor_down(1),
        Err(DirectoryError::UnknownPort(1))
    );
}

#[test]
fn refresh_keeps_entries_and_vanished_origins_age_out() {
    let cfg = Config::default();
    let mut net = line();
    net.register(C, "echo");
    net.register(A, "srv");
    net.run_for(Duration::from_secs(200));
    assert_eq!(net.lookups("echo"), vec![Some(C); 3]);
    assert!(net.node(C).counters().refreshed >= 9);
    let seq = net.node(A).entry(net.now, &app("echo"), C).unwrap().seq;
    assert!(seq >= 10, "seq {seq}");
    // C vanishes without a word.
    net.cut(2, 3);
    net.nodes.remove(&C);
    net.run_for(cfg.max_age + Duration::from_secs(1));
    assert_eq!(net.node(A).lookup(&app("echo")), None);
    assert_eq!(net.node(B).lookup(&app("echo")), None);
    assert_eq!(net.node(B).lookup(&app("srv")), Some(A));
}

#[test]
fn batching_and_message_size() {
    let cfg = Config {
        max_entries_per_message: 4,
        ..Config::default()
    };
    let mut d = Directory::new(A, cfg).unwrap();
    d.neighbor_up(ms(0), 2).unwrap();
    d.neighbor_up(ms(0), 3).unwrap();
    assert!(drain(&mut d).is_empty()); // empty DB, nothing to sync
    for i in 0..10 {
        d.register(ms(0), app(&format!("app{i}"))).unwrap();
    }
    assert_eq!(d.poll_timeout(), Some(ms(0)));
    d.handle_timeout(ms(0));
    let acts = drain(&mut d);
    assert_eq!(acts.len(), 3);
    assert!(acts
        .iter()
        .all(|a| matches!(a, DirectoryAction::Flood { to_ports, .. } if to_ports == &[2, 3])));
    // The next change waits for the propagation delay.
    d.register(ms(10), app("late")).unwrap();
    assert_eq!(d.poll_timeout(), Some(ms(100)));
    d.handle_timeout(ms(50));
    assert!(drain(&mut d).is_empty());
    d.handle_timeout(ms(100));
    assert_eq!(drain(&mut d).len(), 1);
    assert_eq!(d.counters().tx_messages, 8);
    assert_eq!(d.counters().tx_entries, 22);
}

#[test]
fn local_errors_and_invalid_input() {
    let mut d = Directory::new(A, Config::default()).unwrap();
    d.register(ms(0), app("x")).unwrap();
    assert_eq!(
        d.register(ms(0), app("x")),
        Err(DirectoryError::AlreadyRegistered(app("x")))
    );
    assert_eq!(
        d.unregister(ms(0), &app("y")),
        Err(DirectoryError::NotRegistered(app("y")))
    );
    assert_eq!(
        d.register(ms(0), AppName::default()),
        Err(DirectoryError::EmptyName)
    );
    let mut bad = entry("z", 5, 1, 1, true);
    bad.name = AppName::default();
    let mut old = entry("z", 5, 1, 1, true);
    old.age = 60;
    d.on_entries(ms(0), 1, [bad, old]);
    assert_eq!(d.counters().rx_invalid, 1);
    assert_eq!(d.counters().rx_too_old, 1);
    assert_eq!(d.db_len(), 1);
    assert_eq!(d.registered().cloned().collect::<Vec<_>>(), vec![app("x")]);
}

#[test]
fn db_is_bounded() {
    let cfg = Config {
        max_entries: 3,
        ..Config::default()
    };
    let mut d = Directory::new(A, cfg).unwrap();
    d.on_entries(
        ms(0),
        1,
        (0..5).map(|i| entry(&format!("n{i}"), 9, 1, 1, true)),
    );
    assert_eq!(d.db_len(), 3);
    assert_eq!(d.counters().rx_db_full, 2);
    // Own registrations are always kept.
    d.register(ms(0), app("mine")).unwrap();
    assert_eq!(d.db_len(), 4);
}

/// Entries that claim to be this IPCP's own, for names it never
/// registered (a forged or hostile management message can carry
/// thousands), each with a new name: the sequence numbers kept for its own
/// names stay bounded, however many come and however long (the database
/// expires what they made this IPCP withdraw, and more come).
#[test]
fn forged_own_entries_keep_memory_bounded() {
    let cfg = Config {
        max_entries: 3,
        max_age: Duration::from_secs(4),
        refresh_interval: Duration::from_secs(2),
        ..Config::default()
    };
    let mut d = Directory::new(A, cfg).unwrap();
    d.neighbor_up(ms(0), 1).unwrap();
    d.register(ms(0), app("mine")).unwrap();
    for round in 0..20u64 {
        let now = ms(round * 5_000);
        d.on_entries(
            now,
            1,
            (0..1_000).map(|i| entry(&format!("f{round}-{i}"), A, 1, 1, true)),
        );
        d.handle_timeout(now);
        drain(&mut d);
        assert!(
            d.own_seq.len() <= 2 * 3 + 1,
            "round {round}: {} own sequence numbers kept",
            d.own_seq.len()
        );
    }
    // The registered name is still announced.
    d.handle_timeout(ms(100_000));
    assert!(d.db.get(&(app("mine"), A)).is_some_and(|s| s.obj.alive));
}

#[test]
fn wire_round_trip_and_irati_form() {
    let es = vec![
        entry("rina.apps.echotime.server/1", 42, 7, 3, true),
        DirEntry {
            age: 12,
            ..entry("x//e/i", u64::MAX, u64::MAX, 0, false)
        },
    ];
    let bytes = encode_entries(&es);
    assert_eq!(decode_entries(&bytes).unwrap(), es);
    let w = dfte_to_wire(&es[0]);
    assert_eq!(w.ipc_process_synonym, 42);
    assert_eq!(w.seqnum, 7);
    assert_eq!(w.application_name.process_name, "rina.apps.echotime.server");
    let back = dfte_from_wire(&w).unwrap();
    assert_eq!((back.version, back.alive, back.age), (0, true, 0));
    assert!(matches!(
        decode_entries(&[0xff, 0xff]),
        Err(DirectoryError::Malformed(_))
    ));
    let empty = DirEntryGroup {
        entries: vec![DirEntryMessage::default()],
    };
    assert!(entries_from_wire(&empty).is_err());
}

/// One step of the random scenario.
#[derive(Debug, Clone)]
enum Op {
    Register(usize, usize),
    Unregister(usize, usize),
    Move(usize, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..6, 0usize..3).prop_map(|(n, a)| Op::Register(n, a)),
        (0usize..6, 0usize..3).prop_map(|(n, a)| Op::Unregister(n, a)),
        (0usize..6, 0usize..3).prop_map(|(n, a)| Op::Move(n, a)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random registrations, withdrawals and moves over a small random
    /// connected graph: once flooding settles, every node answers the same,
    /// and the answer is where the name was registered most recently among
    /// the places it still is — also after refreshes and expiry.
    #[test]
    fn random_operations_converge(
        n in 2u64..7,
        extra in proptest::collection::vec((0u64..7, 0u64..7), 0..6),
        parents in proptest::collection::vec(any::<u64>(), 6),
        ops in proptest::collection::vec(op(), 1..25),
        gap_ms in prop_oneof![0u64..400, 800u64..1000],
    ) {
        let cfg = Config::default();
        let mut net = Net::new(1..=n, &cfg);
        // A random spanning tree, plus extra edges.
        for b in 2..=n {
            let a = 1 + parents[(b - 2) as usize] % (b - 1);
            net.link(a, b);
        }
        for (a, b) in extra {
            let (a, b) = (1 + a % n, 1 + b % n);
            if a != b && !net.links.contains(&(a, b)) {
                net.link(a, b);
            }
        }
        let names = ["x", "y", "z"];
        // Where each name is registered, with the order of registration.
        let mut at: BTreeMap<usize, BTreeMap<Address, u64>> = BTreeMap::new();
        let mut clock = 0u64;
        let settle = Duration::from_millis(100 * (n + 2) + 50);
        for o in ops {
            clock += 1;
            match o {
                Op::Register(node, a) => {
                    let node = 1 + node as u64 % n;
                    if at.entry(a).or_default().contains_key(&node) { continue; }
                    net.register(node, names[a]);
                    at.entry(a).or_default().insert(node, clock);
                }
                Op::Unregister(node, a) => {
                    let node = 1 + node as u64 % n;
                    if at.entry(a).or_default().remove(&node).is_none() { continue; }
                    net.unregister(node, names[a]);
                }
                Op::Move(node, a) => {
                    let to = 1 + node as u64 % n;
                    let regs = at.entry(a).or_default();
                    let from: Vec<Address> = regs.keys().copied().filter(|x| *x != to).collect();
                    for f in from {
                        regs.remove(&f);
                        net.unregister(f, names[a]);
                    }
                    if !at[&a].contains_key(&to) {
                        net.register(to, names[a]);
                        at.entry(a).or_default().insert(to, clock);
                    }
                }
            }
            // Sometimes let the flood settle, sometimes not.
            net.run_for(Duration::from_millis(gap_ms));
            if clock.is_multiple_of(3) {
                net.run_for(settle);
            }
        }
        net.run_for(settle);
        let expected = |a: usize, at: &BTreeMap<usize, BTreeMap<Address, u64>>| {
            at.get(&a).and_then(|m| m.iter().max_by_key(|(addr, t)| (**t, std::cmp::Reverse(**addr))).map(|(addr, _)| *addr))
        };
        for (a, name) in names.iter().enumerate() {
            let got = net.lookups(name);
            prop_assert!(got.windows(2).all(|w| w[0] == w[1]), "{} disagrees: {:?}", name, got);
            let regs: Vec<Address> = at.get(&a).map(|m| m.keys().copied().collect()).unwrap_or_default();
            match got[0] {
                None => prop_assert!(regs.is_empty(), "{} lost: {:?}", name, regs),
                Some(x) => prop_assert!(regs.contains(&x), "{} at {} not in {:?}", name, x, regs),
            }
            // With settled flooding between registrations, the latest wins;
            // without, concurrent registrations may tie and go to the lower
            // address — always one of the registered places (checked above).
            if gap_ms >= settle.as_millis() as u64 {
                prop_assert_eq!(got[0], expected(a, &at), "{}", name);
            }
        }
        // Refreshes keep everything, tombstones go.
        net.run_for(cfg.max_age * 2);
        for (a, name) in names.iter().enumerate() {
            let got = net.lookups(name);
            prop_assert!(got.windows(2).all(|w| w[0] == w[1]));
            let regs: Vec<Address> = at.get(&a).map(|m| m.keys().copied().collect()).unwrap_or_default();
            prop_assert_eq!(got[0].is_some(), !regs.is_empty());
        }
        let alive: usize = at.values().map(|m| m.len()).sum();
        for node in net.nodes.values() {
            prop_assert_eq!(node.db_len(), alive);
        }
    }

    /// Arbitrary entries never panic the machine and never break the bounds.
    #[test]
    fn arbitrary_entries_never_panic(es in proptest::collection::vec(
        (0usize..3, 0u64..4, 0u64..5, 0u64..5, any::<bool>(), 0u32..100, 0u32..3), 0..60)) {
        let cfg = Config { max_entries: 5, ..Config::default() };
        let mut d = Directory::new(1, cfg).unwrap();
        d.neighbor_up(ms(0), 1).unwrap();
        d.register(ms(0), app("x")).unwrap();
        for (i, (name, addr, seq, version, alive, age, port)) in es.into_iter().enumerate() {
            let t = ms(i as u64 * 500);
            d.on_entries(t, port, [DirEntry {
                name: app(["x", "y", "z"][name]), address: addr, seq, version, alive, age,
            }]);
            d.handle_timeout(t);
            drain(&mut d);
            prop_assert!(d.db_len() <= 6);
            prop_assert_eq!(d.lookup(&app("x")).is_some(), true);
        }
    }
}

#[test]
fn entries_with_names_the_text_form_refuses_are_dropped_counted_and_never_flooded() {
    let long = AppName {
        process_name: "x".repeat(100_000),
        ..Default::default()
    };
    let slash = AppName {
        process_name: "a/b".into(),
        ..Default::default()
    };
    let spaced = AppName {
        process_name: "a b".into(),
        ..Default::default()
    };
    // From the wire: the message is malformed.
    let bytes = encode_entries(&[DirEntry {
        name: long.clone(),
        ..entry("ok", 9, 1, 1, true)
    }]);
    assert!(matches!(
        decode_entries(&bytes),
        Err(DirectoryError::InvalidName(_))
    ));
    // Handed over anyway: each is counted and dropped, the good one kept.
    let mut d = Directory::new(A, Config::default()).unwrap();
    d.neighbor_up(ms(0), 2).unwrap();
    d.neighbor_up(ms(0), 3).unwrap();
    drain(&mut d);
    let bad = [long.clone(), slash.clone(), spaced.clone()].map(|name| DirEntry {
        name,
        ..entry("ok", 9, 1, 1, true)
    });
    d.on_entries(
        ms(0),
        2,
        bad.into_iter().chain([entry("ok", 9, 1, 1, true)]),
    );
    assert_eq!(d.counters().rx_invalid, 3);
    assert_eq!(d.lookup(&long), None);
    assert_eq!(d.db_len(), 1);
    d.handle_timeout(ms(1000));
    let flooded: Vec<AppName> = drain(&mut d)
        .into_iter()
        .flat_map(|a| match a {
            DirectoryAction::Flood { entries, .. } | DirectoryAction::Send { entries, .. } => {
                entries
            }
        })
        .map(|e| e.name)
        .collect();
    assert_eq!(flooded, vec![app("ok")]);
    // Nor may such a name be registered here.
    assert!(matches!(
        d.register(ms(0), slash),
        Err(DirectoryError::InvalidName(_))
    ));
    assert!(matches!(
        d.register(ms(0), long),
        Err(DirectoryError::InvalidName(_))
    ));
}

#[test]
fn a_version_far_above_the_highest_held_is_dropped_and_the_owner_can_always_outbid() {
    let srv = app("srv");
    let mut d = Directory::new(5, Config::default()).unwrap();
    d.neighbor_up(ms(0), 1).unwrap();
    d.register(ms(0), srv.clone()).unwrap();
    let ours = d.entry(ms(0), &srv, 5).unwrap().version;
    // A member claiming the name with the highest version there is: dropped.
    let forged = |version, seq| DirEntry {
        version,
        ..entry("srv", 3, seq, 0, true)
    };
    d.on_entries(ms(1), 1, [forged(u64::MAX, 1)]);
    assert_eq!(d.counters().rx_version_jump, 1);
    assert_eq!(d.lookup(&srv), Some(5));
    assert_eq!(d.db_len(), 1);
    // So is one for a name held nowhere here, and a copy of our own.
    d.on_entries(
        ms(1),
        1,
        [DirEntry {
            version: MAX_VERSION_STEP + 1,
            ..entry("new", 3, 1, 0, true)
        }],
    );
    d.on_entries(
        ms(1),
        1,
        [DirEntry {
            version: u64::MAX,
            ..entry("srv", 5, 9, 0, true)
        }],
    );
    assert_eq!(d.counters().rx_version_jump, 3);
    assert_eq!(d.entry(ms(1), &srv, 5).unwrap().version, ours);
    // One step up is taken (the highest version wins)...
    d.on_entries(ms(2), 1, [forged(ours + MAX_VERSION_STEP, 2)]);
    assert_eq!(d.lookup(&srv), Some(3));
    // ...and the owner's next registration outbids it.
    d.unregister(ms(3), &srv).unwrap();
    d.register(ms(4), srv.clone()).unwrap();
    assert_eq!(d.lookup(&srv), Some(5));
    assert_eq!(
        d.entry(ms(4), &srv, 5).unwrap().version,
        ours + MAX_VERSION_STEP + 1
    );
}
