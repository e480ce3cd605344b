//! Dynamic routing in the normal IPCP: the glue between the data path and
//! the link-state machine of [`crate::routing`].
//!
//! # Neighbours
//!
//! The driver announces each N-1 flow to a neighbour with
//! [`NormalIpcp::neighbor_up`] (port, the neighbour's address, a cost) once
//! the port exists ([`NormalIpcp::add_port`]), and its loss with
//! [`NormalIpcp::neighbor_down`] (or just [`NormalIpcp::remove_port`], which
//! takes the neighbour down first). Without routing these calls only record
//! the neighbour ([`NormalIpcp::neighbors`]); with
//! [`NormalConfig::routing`](super::NormalConfig::routing) set they feed the
//! [`LinkState`] machine.
//!
//! # FSO exchange
//!
//! The machine's [`RoutingAction::Flood`] and [`RoutingAction::Send`] become
//! management PDUs sent on the given N-1 ports (not routed: they go to the
//! neighbour on that port, addressed to its address, or to address 0 if it
//! is not known). Their payload is
//! [`CDAP_DISCRIMINATOR`](super::CDAP_DISCRIMINATOR) followed by one
//! encoded [`CdapMessage`]: an unconfirmed `M_WRITE` (no invoke id) of
//! [`FSOS_OBJ_CLASS`] on [`FSOS_OBJ_NAME`] whose value (`byteval`) is
//! [`encode_fsos`]. The IPCP's RIB daemon ([`super::mgmt_rib`]) hands an
//! `M_WRITE` or `M_CREATE` of [`FSOS_OBJ_NAME`] that arrives on port `p` to
//! routing, whose FSOs go to [`LinkState::on_fsos`] as coming from `p`
//! (other operations on it are refused by the daemon). A FSO write with a
//! bad value is counted in `rx_mgmt_malformed` and dropped; one that
//! arrives when routing is off (or before enrollment started it) in
//! `rx_mgmt_unhandled`.
//!
//! # Forwarding table
//!
//! With routing on, **routing owns the whole forwarding table**: on every
//! [`RoutingAction::TableChanged`] the RMT's table is cleared and refilled
//! with the computed next hops (one entry per reachable destination, for
//! any QoS-id) by [`LinkState::fill`]. Static routes set through
//! [`NormalIpcp::rmt_mut`] are therefore overwritten at the first
//! computation and should not be used together with routing.

use super::mgmt_cdap::{write_payload, writes};
use super::{N1Port, NormalIpcp};
use crate::rmt::Address;
use crate::routing::{
    decode_fsos, encode_fsos, Counters as RoutingCounters, LinkState, RoutingAction,
    FSOS_OBJ_CLASS, FSOS_OBJ_NAME,
};
use crate::time::Instant;
use rina_wire::cdap::CdapMessage;
use std::collections::BTreeMap;

/// The management payload that carries `fsos` to a neighbour: the
/// discriminator and an unconfirmed CDAP `M_WRITE` on [`FSOS_OBJ_NAME`].
pub fn fsos_payload(fsos: &[crate::routing::Fso]) -> Vec<u8> {
    write_payload(FSOS_OBJ_CLASS, FSOS_OBJ_NAME, encode_fsos(fsos))
}

impl NormalIpcp {
    /// The N-1 flow on `port` leads to the neighbour at address `neighbor`,
    /// with link cost `cost` (1 for a hop count). Call it after
    /// [`NormalIpcp::add_port`] (a port the RMT does not know is added);
    /// calling it again for the same port changes the cost, or the
    /// neighbour (the old one is taken down first). Without routing it only
    /// records the neighbour. A neighbour with this IPCP's own address is
    /// ignored by routing. A port new to the RMT is new to membership too
    /// (as with [`NormalIpcp::add_port`]): hellos go on it and its
    /// neighbour is taken down when it falls silent, whether its address
    /// came from a hello or from the driver.
    pub fn neighbor_up(&mut self, now: Instant, port: N1Port, neighbor: Address, cost: u32) {
        self.tick(now);
        self.add_port(port);
        if let Some(&(old, _)) = self.neighbors.get(&port) {
            if old != neighbor {
                self.neighbor_down(now, port);
            }
        }
        self.neighbors.insert(port, (neighbor, cost));
        if let Some(r) = self.routing.as_mut() {
            // The only errors are a self-neighbour (ignored) and a port in
            // use by another address (taken down above).
            let _ = r.neighbor_up(now, port, neighbor, cost);
        }
        self.run_routing(now);
        self.dft_neighbor_up(now, port);
    }

    /// The N-1 flow on `port` is gone (the port itself stays until
    /// [`NormalIpcp::remove_port`]). Unknown ports are ignored.
    pub fn neighbor_down(&mut self, now: Instant, port: N1Port) {
        self.tick(now);
        if self.neighbors.remove(&port).is_none() {
            return;
        }
        if let Some(r) = self.routing.as_mut() {
            let _ = r.neighbor_down(now, port);
        }
        self.run_routing(now);
        self.dft_neighbor_down(now, port);
    }

    /// The neighbour on `port` gets this IPCP's routing and directory
    /// databases again: what was flooded to it before may have been lost
    /// (in a DIF that encrypts, before the port had keys). Not a
    /// neighbour: nothing happens.
    pub(super) fn resync_neighbor(&mut self, now: Instant, port: N1Port) {
        if !self.neighbors.contains_key(&port) {
            return;
        }
        if let Some(r) = self.routing.as_mut() {
            let _ = r.resync(now, port);
        }
        self.run_routing(now);
        self.dft_resync(now, port);
    }

    /// The neighbours announced with [`NormalIpcp::neighbor_up`]:
    /// (port, address, cost), in port order.
    pub fn neighbors(&self) -> impl Iterator<Item = (N1Port, Address, u32)> + '_ {
        self.neighbors.iter().map(|(p, (a, c))| (*p, *a, *c))
    }

    /// The link-state machine, when routing is configured (FSO database,
    /// routes, next hops).
    pub fn routing(&self) -> Option<&LinkState> {
        self.routing.as_ref()
    }

    /// The routing counters, when routing is configured.
    pub fn routing_counters(&self) -> Option<&RoutingCounters> {
        self.routing.as_ref().map(|r| r.counters())
    }

    /// Every counter by name: the data-path counters
    /// ([`super::Counters::to_map`]), the routing counters prefixed with
    /// `routing_` when routing is on, and `routing_fsos` (database size) and
    /// `routing_destinations` (reachable destinations), and the directory
    /// counters prefixed with `directory_` plus `directory_entries`
    /// (database size) when the disseminated directory is on, and the
    /// encryption counters of all N-1 ports summed, prefixed with
    /// `encryption_`, when encrypting (per port: the RIB's
    /// `/sdup/protection/pid=N`), and the RIB daemon's dispatch counters
    /// prefixed with `rib_daemon_`.
    pub fn counters_map(&self) -> BTreeMap<String, u64> {
        let mut m = self.counters().to_map();
        if let Some(r) = &self.routing {
            for (k, v) in r.counters().to_map() {
                m.insert(format!("routing_{k}"), v);
            }
            m.insert("routing_fsos".into(), r.db_len() as u64);
            m.insert("routing_destinations".into(), r.next_hops().len() as u64);
        }
        if let Some(d) = &self.dft {
            for (k, v) in d.counters().to_map() {
                m.insert(format!("directory_{k}"), v);
            }
            m.insert("directory_entries".into(), d.db_len() as u64);
        }
        if let Some(c) = self.membership_counters() {
            for (k, v) in c.to_map() {
                m.insert(format!("membership_{k}"), v);
            }
        }
        let d = self.mgmt.daemon().counters();
        let g = self.mgmt.counters();
        for (k, v) in [
            ("dispatched", d.dispatched),
            ("refused_not_allowed", d.refused_not_allowed),
            ("refused_no_owner", d.refused_no_owner),
            ("refused_bad_name", d.refused_bad_name),
            ("refused_busy", d.refused_busy),
            ("rx_unmatched", g.rx_unmatched),
            ("rx_not_object", g.rx_not_object),
            ("sessions_evicted", g.sessions_evicted),
        ] {
            m.insert(format!("rib_daemon_{k}"), v);
        }
        for (k, v) in self.mgmt_reasm.counters().to_map() {
            m.insert(format!("mgmt_frag_{k}"), v);
        }
        for pp in self.port_protection() {
            for (k, v) in pp.counters.pairs() {
                *m.entry(format!("encryption_{k}")).or_default() += v;
            }
        }
        m
    }

    /// A CDAP message on the flow-state objects, from the RIB daemon: a
    /// neighbour's FSOs. A bad value (or one through the loopback) is
    /// counted as malformed; without a routing machine it is counted as
    /// unhandled.
    pub(super) fn on_fsos_cdap(&mut self, now: Instant, port: Option<N1Port>, msg: &CdapMessage) {
        if self.routing.is_none() {
            self.counters.rx_mgmt_unhandled += 1;
            return;
        }
        if !writes(msg, FSOS_OBJ_NAME) {
            self.counters.rx_mgmt_malformed += 1;
            return;
        }
        let Some((fsos, port)) = self.written_object(port, msg, decode_fsos) else {
            return;
        };
        if let Some(r) = self.routing.as_mut() {
            r.on_fsos(now, port, fsos);
        }
        self.run_routing(now);
    }

    /// Runs the routing timers that are due.
    pub(super) fn routing_timeout(&mut self, now: Instant) {
        let Some(r) = self.routing.as_mut() else {
            return;
        };
        if r.poll_timeout().is_some_and(|t| t <= now) {
            r.handle_timeout(now);
        }
        self.run_routing(now);
    }

    /// Carries out what the routing machine asks: FSO messages to
    /// neighbours, table refills.
    fn run_routing(&mut self, now: Instant) {
        let mut out = Vec::new();
        let mut restarted = Vec::new();
        let Some(r) = self.routing.as_mut() else {
            return;
        };
        while let Some(a) = r.poll_action() {
            match a {
                RoutingAction::Flood { to_ports, fsos } => {
                    out.push((to_ports, fsos_payload(&fsos)));
                }
                RoutingAction::Send { port, fsos } => out.push((vec![port], fsos_payload(&fsos))),
                RoutingAction::TableChanged => r.fill(self.rmt.table_mut()),
                RoutingAction::NeighborRestarted { port } => restarted.push(port),
            }
        }
        self.send_to_neighbors(now, out);
        // A neighbour that lost its state lost its directory too.
        for port in restarted {
            self.dft_resync(now, port);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::normal::layer_mgmt_tests::mgmt_frame;
    use crate::normal::{Action, NormalConfig, CDAP_DISCRIMINATOR};
    use crate::rmt::Fifo;
    use crate::routing::{self, Fso};

    fn ms(n: u64) -> Instant {
        Instant::from_nanos(n * 1_000_000)
    }

    fn ipcp(addr: Address, routing: bool) -> NormalIpcp {
        let mut c = NormalConfig::new("net", addr);
        c.routing = routing.then(routing::Config::default);
        NormalIpcp::new(c, Box::new(Fifo::new(100))).unwrap()
    }

    /// A line 1 - 2 - 3: port `b` at node `a` leads to node `b`.
    fn line() -> Vec<NormalIpcp> {
        let mut v: Vec<NormalIpcp> = (1..=3).map(|a| ipcp(a, true)).collect();
        for (a, b) in [(1u64, 2u64), (2, 3)] {
            v[a as usize - 1].add_port(b as N1Port);
            v[b as usize - 1].add_port(a as N1Port);
        }
        v
    }

    /// Carries frames (port `b` of node `a` is port `a` of node `b`) until
    /// nothing moves; returns the other actions.
    fn carry(now: Instant, net: &mut [NormalIpcp]) -> Vec<(usize, Action)> {
        let mut out = Vec::new();
        loop {
            let mut moved = false;
            for i in 0..net.len() {
                while let Some(a) = net[i].poll_action() {
                    match a {
                        Action::Transmit { port, frame } => {
                            moved = true;
                            let j = port as usize - 1;
                            net[j].on_frame(now, i as N1Port + 1, &frame);
                        }
                        a => out.push((i, a)),
                    }
                }
            }
            if !moved {
                return out;
            }
        }
    }

    /// Runs timers and carries frames until `until`.
    fn run(net: &mut [NormalIpcp], until: Instant) -> Vec<(usize, Action)> {
        let mut out = Vec::new();
        loop {
            let Some(t) = net.iter().filter_map(|p| p.poll_timeout()).min() else {
                return out;
            };
            if t > until {
                return out;
            }
            for p in net.iter_mut() {
                if p.poll_timeout().is_some_and(|x| x <= t) {
                    p.handle_timeout(t);
                }
            }
            out.extend(carry(t, net));
        }
    }

    #[test]
    fn a_line_of_three_converges_and_carries_a_flow_without_static_routes() {
        let mut net = line();
        net[0].neighbor_up(ms(0), 2, 2, 1);
        net[1].neighbor_up(ms(0), 1, 1, 1);
        net[1].neighbor_up(ms(0), 3, 3, 1);
        net[2].neighbor_up(ms(0), 2, 2, 1);
        carry(ms(0), &mut net);
        run(&mut net, ms(1000));
        let t: Vec<_> = net[0]
            .rmt()
            .table()
            .entries()
            .map(|(d, q, p)| (d, q, p.to_vec()))
            .collect();
        assert_eq!(t, vec![(2, None, vec![2]), (3, None, vec![2])]);
        assert_eq!(
            net[2].routing().unwrap().next_hops().get(&1),
            Some(&vec![2])
        );
        assert_eq!(net[1].routing().unwrap().db_len(), 4);
        assert_eq!(net[1].counters().rx_mgmt_malformed, 0);

        // A flow allocated by name from 1 to 3 over the computed routes.
        let echo: rina_wire::AppName = "echo".parse().unwrap();
        net[2].register(echo.clone()).unwrap();
        net[0].set_directory(echo.clone(), 3);
        net[0]
            .allocate(ms(1000), 1, "me".parse().unwrap(), echo, Default::default())
            .unwrap();
        let acts = carry(ms(1000), &mut net);
        let Some((2, Action::FlowRequest { handle, .. })) = acts.first().cloned() else {
            panic!("no flow request: {acts:?}");
        };
        net[2].accept(ms(1000), handle, 9).unwrap();
        let acts = carry(ms(1000), &mut net);
        assert!(matches!(
            acts.as_slice(),
            [(0, Action::Allocated { flow: 1, .. })]
        ));
        net[0].write(ms(1000), 1, b"hello").unwrap();
        let acts = carry(ms(1000), &mut net);
        assert_eq!(
            acts,
            vec![(
                2,
                Action::Deliver {
                    flow: 9,
                    sdu: b"hello".to_vec().into()
                }
            )]
        );

        // The RIB shows the FSO database and next hops.
        let rib = net[0].rib();
        for n in [
            "/ra/fsos/key=1-2",
            "/ra/fsos/key=3-2",
            "/ra/nexthops/key=3",
            "/ra/neighbors/pid=2",
        ] {
            assert!(rib.contains(n), "{n} missing");
        }
        let fso = rib.get("/ra/fsos/key=2-3").unwrap();
        assert_eq!(fso.class, routing::FSO_OBJ_CLASS);
        let m = net[1].counters_map();
        assert!(m["routing_rx_accepted"] > 0);
        assert_eq!(m["routing_destinations"], 2);
    }

    #[test]
    fn a_lost_neighbour_is_routed_around_no_more() {
        let mut net = line();
        net[0].neighbor_up(ms(0), 2, 2, 1);
        net[1].neighbor_up(ms(0), 1, 1, 1);
        net[1].neighbor_up(ms(0), 3, 3, 1);
        net[2].neighbor_up(ms(0), 2, 2, 1);
        run(&mut net, ms(1000));
        assert_eq!(net[0].rmt().table().len(), 2);
        net[1].remove_port(3);
        net[2].neighbor_down(ms(1000), 2);
        carry(ms(1000), &mut net);
        run(&mut net, ms(2000));
        let t: Vec<_> = net[0].rmt().table().entries().map(|(d, _, _)| d).collect();
        assert_eq!(t, vec![2]);
        assert!(net[1].neighbors().all(|(p, _, _)| p == 1));
        assert_eq!(net[2].rmt().table().len(), 0);
    }

    #[test]
    fn cdap_payloads_malformed_foreign_and_without_routing() {
        let mut p = ipcp(1, true);
        p.add_port(2);
        p.neighbor_up(ms(0), 2, 2, 1);
        while p.poll_action().is_some() {}
        // Not CDAP at all.
        p.on_frame(
            ms(1),
            2,
            &mgmt_frame(&p, 2, &[CDAP_DISCRIMINATOR, 0xff, 0xff]),
        );
        // An FSO write whose value is not an FSO group.
        let bad = CdapMessage::write(FSOS_OBJ_CLASS, FSOS_OBJ_NAME, 7i32);
        let mut payload = vec![CDAP_DISCRIMINATOR];
        payload.extend(bad.encode());
        p.on_frame(ms(1), 2, &mgmt_frame(&p, 2, &payload));
        assert_eq!(p.counters().rx_mgmt_malformed, 2);
        assert!(p.poll_action().is_none());
        // An object nobody owns for writing: the RIB daemon refuses it
        // (an unconfirmed write: nobody to tell).
        let other = CdapMessage::write("Foo", "/foo", 1i32);
        let mut payload = vec![CDAP_DISCRIMINATOR];
        payload.extend(other.encode());
        p.on_frame(ms(1), 2, &mgmt_frame(&p, 2, &payload));
        assert!(p.poll_action().is_none());
        let d = p.rib_daemon().daemon().counters();
        assert_eq!((d.refused_not_allowed, d.unanswerable), (1, 1));
        // A good FSO write is taken.
        let fso = Fso {
            origin: 2,
            neighbor: 1,
            cost: 1,
            seq: 1,
            up: true,
            age: 0,
        };
        p.on_frame(ms(1), 2, &mgmt_frame(&p, 2, &fsos_payload(&[fso])));
        assert_eq!(p.routing_counters().unwrap().rx_accepted, 1);
        assert_eq!(p.counters().rx_mgmt_malformed, 2);
        p.handle_timeout(ms(200));
        assert_eq!(p.rmt().table().len(), 1);

        // Without routing the same payload has no machine to go to.
        let mut q = ipcp(1, false);
        q.add_port(2);
        q.neighbor_up(ms(0), 2, 2, 1);
        assert!(q.poll_action().is_none());
        assert!(q.routing().is_none() && q.routing_counters().is_none());
        assert_eq!(q.neighbors().collect::<Vec<_>>(), vec![(2, 2, 1)]);
        q.on_frame(ms(1), 2, &mgmt_frame(&q, 2, &fsos_payload(&[fso])));
        assert!(q.poll_action().is_none());
        assert_eq!(q.counters().rx_mgmt_unhandled, 1);
        assert_eq!(q.poll_timeout(), None);
    }
}
