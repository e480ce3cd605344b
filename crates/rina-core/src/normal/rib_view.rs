//! The normal IPCP's state as RIB objects, under IRATI's object names, so
//! that management tools see a running DIF the way CDAP peers will.

use super::NormalIpcp;
use crate::rib::{self, ObjValue, Rib};
use crate::routing;
use std::time::Duration;

/// What the RMT knows of an N-1 port beyond its queues: the cube below it
/// was allocated with, and, for a lane, its primary and the QoS-ids it
/// carries (`lower cube A1 (id 1), lane of 5 for QoS-ids 1,2; `).
fn lane_note(rmt: &crate::rmt::Rmt, port: crate::rmt::PortId) -> String {
    let mut s = String::new();
    if let Some(c) = rmt.lower_cube(port) {
        s += &format!("lower cube {} (id {}), ", c.name, c.id);
    }
    if let Some((_, l)) = rmt.lanes().find(|(p, _)| *p == port) {
        let q: Vec<String> = l.carries.iter().map(u64::to_string).collect();
        s += &format!("lane of {} for QoS-ids {}, ", l.primary, q.join(","));
    }
    s += &format!("sent {}, ", rmt.port_sent(port));
    s
}

/// Creates object `name` in `r` (and its missing parents), ignoring the result.
fn put(r: &mut Rib, name: String, class: &str, value: ObjValue, owner: rib::OwnerId) {
    // Every name here is well formed and the RIB is far from full.
    let _ = r.create_with_parents(&name, class, value, owner);
}

impl NormalIpcp {
    /// A RIB holding this IPCP's address, data-transfer constants, QoS
    /// cubes, directory (static entries, registered names, then the
    /// disseminated directory's answers when it is on), forwarding table, N-1 ports,
    /// neighbours (`/ra/neighbors/pid=<port>`), with routing on its FSO
    /// database (`/ra/fsos/key=<origin>-<neighbour>`: cost, sequence
    /// number, up/down, age as of the latest time seen) and next hops
    /// (`/ra/nexthops/key=<destination>`), and flows. Built on demand: the live state stays in the machines.
    pub fn rib(&self) -> Rib {
        let mut r = Rib::new(rib::Config::default());
        self.put_constants(&mut r);
        self.put_qos_cubes(&mut r);
        self.put_directory(&mut r);
        self.put_forwarding_table(&mut r);
        self.put_n1_flows(&mut r);
        self.put_protection(&mut r);
        self.put_neighbors(&mut r);
        self.put_routing(&mut r);
        // Membership: this IPCP's own enrollment, the members that said
        // hello, and every member the flow-state database knows of.
        self.put_enrollment(&mut r);
        self.put_hello_neighbors(&mut r);
        self.put_members(&mut r);
        self.put_flows(&mut r);
        self.put_sessions(&mut r);
        r
    }

    /// This IPCP's address (`/difm/nam/addr`) and data-transfer constants (`/dt`).
    fn put_constants(&self, r: &mut Rib) {
        let cfg = self.config();
        put(
            r,
            "/difm/nam/addr".into(),
            "address",
            ObjValue::Int(cfg.address as i64),
            rib::OwnerId::NAMESPACE_MANAGER,
        );
        let dt = &cfg.dt;
        put(
            r,
            "/dt".into(),
            "DataTransfer",
            ObjValue::Str(format!(
                "addr {} B, cep {} B, qos {} B, length {} B, seq {} B, ctrl seq {} B, max PDU {} B, MPL {} ms",
                dt.addr.bytes(),
                dt.cep.bytes(),
                dt.qos.bytes(),
                dt.length.bytes(),
                dt.seq.bytes(),
                dt.ctrl_seq.bytes(),
                dt.max_pdu_size,
                dt.max_pdu_lifetime_ms
            )),
            rib::OwnerId::RESOURCE_ALLOCATOR,
        );
    }

    /// The QoS cubes with their EFCP traits (`/ra/qoscubes/id=<id>`).
    fn put_qos_cubes(&self, r: &mut Rib) {
        for c in &self.config().cubes {
            let e = &c.efcp;
            let mut traits = vec![if e.in_order { "in-order" } else { "any order" }.to_string()];
            if e.rtx().is_some() {
                traits.push("retransmission".into());
            }
            if let Some(w) = e.window() {
                traits.push(format!("window {}", w.receiver_buffer));
            }
            if let Some(rt) = e.rate() {
                traits.push(format!("rate {}/{:?}", rt.pdus_per_frame, rt.frame));
            }
            if let Some(g) = e.max_sdu_gap {
                traits.push(format!("max gap {g}"));
            }
            put(
                r,
                format!("/ra/qoscubes/id={}", c.id),
                "QoSCube",
                ObjValue::Str(format!("{}: {}", c.name, traits.join(", "))),
                rib::OwnerId::RESOURCE_ALLOCATOR,
            );
        }
    }

    /// The directory (`/difm/nsm/dft/key=<name>`): static entries, registered
    /// names, then the disseminated directory's answers when it is on.
    fn put_directory(&self, r: &mut Rib) {
        let cfg = self.config();
        for (name, addr) in &cfg.directory {
            put(
                r,
                format!("/difm/nsm/dft/key={name}"),
                "DirectoryForwardingTableEntry",
                ObjValue::Int(*addr as i64),
                rib::OwnerId::NAMESPACE_MANAGER,
            );
        }
        for name in self.names() {
            put(
                r,
                format!("/difm/nsm/dft/key={name}"),
                "DirectoryForwardingTableEntry",
                ObjValue::Int(cfg.address as i64),
                rib::OwnerId::NAMESPACE_MANAGER,
            );
        }
        if let Some(d) = self.dynamic_directory() {
            // Names already shown (static or local) keep their entry.
            let names: std::collections::BTreeSet<_> = d
                .entries(self.now)
                .filter(|e| e.alive)
                .map(|e| e.name)
                .collect();
            for name in names {
                if let Some(addr) = d.lookup(&name) {
                    put(
                        r,
                        format!("/difm/nsm/dft/key={name}"),
                        "DirectoryForwardingTableEntry",
                        ObjValue::Int(addr as i64),
                        rib::OwnerId::NAMESPACE_MANAGER,
                    );
                }
            }
        }
    }

    /// The forwarding table (`/ra/pduft/key=<destination>[-<QoS-id>]`).
    fn put_forwarding_table(&self, r: &mut Rib) {
        for (dst, qos, ports) in self.rmt().table().entries() {
            let key = match qos {
                Some(q) => format!("{dst}-{q}"),
                None => dst.to_string(),
            };
            let ports: Vec<String> = ports.iter().map(|p| p.to_string()).collect();
            put(
                r,
                format!("/ra/pduft/key={key}"),
                "PDUForwardingTableEntry",
                ObjValue::Str(format!("N-1 ports {}", ports.join(","))),
                rib::OwnerId::RESOURCE_ALLOCATOR,
            );
        }
    }

    /// The N-1 ports with their lanes, scheduler and queues (`/rmt/n1flows/pid=<port>`).
    fn put_n1_flows(&self, r: &mut Rib) {
        for port in self.rmt().ports() {
            let q: Vec<String> = self
                .rmt()
                .queue_stats(port)
                .iter()
                .map(|s| {
                    format!(
                        "{}: queued {} sent {} dropped {} max {}",
                        s.queue, s.queued, s.sent, s.dropped, s.max_occupancy
                    )
                })
                .collect();
            put(
                r,
                format!("/rmt/n1flows/pid={port}"),
                "RMTN1Flow",
                ObjValue::Str(format!(
                    "{}{} ({})",
                    lane_note(self.rmt(), port),
                    self.rmt().scheduler_name(),
                    q.join("; ")
                )),
                rib::OwnerId::RESOURCE_ALLOCATOR,
            );
        }
    }

    /// Each N-1 port's SDU protection: suite, key and counters (`/sdup/protection/pid=<port>`).
    fn put_protection(&self, r: &mut Rib) {
        for pp in self.port_protection() {
            let counters: Vec<String> = pp
                .counters
                .pairs()
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            put(
                r,
                format!("/sdup/protection/pid={}", pp.port),
                "SDUProtection",
                ObjValue::Str(format!(
                    "{} key {} ({})",
                    pp.suite,
                    pp.key_id
                        .map_or_else(|| "none yet".to_string(), |k| format!("{k:#010x}")),
                    counters.join(", ")
                )),
                rib::OwnerId::RESOURCE_ALLOCATOR,
            );
        }
    }

    /// The neighbours with their addresses and costs (`/ra/neighbors/pid=<port>`).
    fn put_neighbors(&self, r: &mut Rib) {
        for (port, addr, cost) in self.neighbors() {
            put(
                r,
                format!("/ra/neighbors/pid={port}"),
                "Neighbor",
                ObjValue::Str(format!("address {addr}, cost {cost}")),
                rib::OwnerId::RESOURCE_ALLOCATOR,
            );
        }
    }

    /// With routing on, its FSO database and next hops (`/ra/fsos`, `/ra/nexthops`).
    fn put_routing(&self, r: &mut Rib) {
        let Some(ls) = self.routing() else {
            return;
        };
        for f in ls.fsos(self.now) {
            put(
                r,
                format!("{}/key={}-{}", routing::FSOS_OBJ_NAME, f.origin, f.neighbor),
                routing::FSO_OBJ_CLASS,
                ObjValue::Str(format!(
                    "cost {} seq {} {} age {} s",
                    f.cost,
                    f.seq,
                    if f.up { "up" } else { "down" },
                    f.age
                )),
                rib::OwnerId::RESOURCE_ALLOCATOR,
            );
        }
        for (dst, ports) in ls.next_hops() {
            let cost = ls.routes().get(dst).map(|route| route.cost);
            let ports: Vec<String> = ports.iter().map(|p| p.to_string()).collect();
            put(
                r,
                format!("/ra/nexthops/key={dst}"),
                "NextHop",
                ObjValue::Str(format!(
                    "cost {} via N-1 ports {}",
                    cost.unwrap_or(0),
                    ports.join(",")
                )),
                rib::OwnerId::RESOURCE_ALLOCATOR,
            );
        }
    }

    /// This IPCP's own enrollment, when membership is on (`/difm/enr`).
    fn put_enrollment(&self, r: &mut Rib) {
        if let Some(rep) = self.enrollment_report() {
            let st = &rep.status;
            put(
                r,
                crate::enrollment::OBJ_ENROLLMENT.into(),
                crate::enrollment::CLASS_ENROLLMENT,
                ObjValue::Str(format!(
                    "via {}: {:?} at step {}, {} attempt(s){}",
                    rep.via,
                    st.phase,
                    st.step.name(),
                    st.attempts,
                    st.last_error
                        .as_ref()
                        .map_or_else(String::new, |e| format!("; last error: {e}"))
                )),
                rib::OwnerId::ENROLLMENT,
            );
        } else if self.mship.is_some() {
            put(
                r,
                crate::enrollment::OBJ_ENROLLMENT.into(),
                crate::enrollment::CLASS_ENROLLMENT,
                ObjValue::Str(if self.is_enrolled() {
                    "member by configuration (bootstrap)".into()
                } else {
                    "not enrolled: no member heard yet".into()
                }),
                rib::OwnerId::ENROLLMENT,
            );
        }
    }

    /// The members that said hello (`/difm/enr/hello/pn=<name>`).
    fn put_hello_neighbors(&self, r: &mut Rib) {
        for (port, name, addr) in self.hello_neighbors() {
            put(
                r,
                format!("/difm/enr/hello/pn={name}"),
                "Neighbor",
                ObjValue::Str(format!("address {addr}, N-1 port {port}")),
                rib::OwnerId::ENROLLMENT,
            );
        }
    }

    /// With routing on, every member the flow-state database knows of and
    /// whether it is reachable (`/difm/members/addr=<address>`).
    fn put_members(&self, r: &mut Rib) {
        let Some(ls) = self.routing() else {
            return;
        };
        let address = self.config().address;
        let mut members: std::collections::BTreeSet<u64> = ls
            .fsos(self.now)
            .flat_map(|f| [f.origin, f.neighbor])
            .collect();
        members.insert(address);
        for m in members {
            let state = if m == address {
                "this IPCP"
            } else if ls.next_hops().contains_key(&m) {
                "reachable"
            } else {
                "unreachable"
            };
            put(
                r,
                format!("/difm/members/addr={m}"),
                "Member",
                ObjValue::Str(state.into()),
                rib::OwnerId::ENROLLMENT,
            );
        }
    }

    /// The flows with their endpoints and counters (`/fa/flows/key=<flow>`),
    /// and for a flow with DTCP its state ([`dtcp_state`]).
    fn put_flows(&self, r: &mut Rib) {
        for (flow, ep) in self.flows() {
            let c = self.flow_counters(flow).copied().unwrap_or_default();
            let e = self.flow_stats(flow).copied().unwrap_or_default();
            let dtcp = self
                .flows
                .get(&flow)
                .filter(|f| f.efcp.config().dtcp.is_some())
                .map_or_else(String::new, |_| dtcp_state(&e));
            put(
                r,
                format!("/fa/flows/key={flow}"),
                "Flow",
                ObjValue::Str(format!(
                    "cep {} -> address {} cep {}, qos-id {}; SDUs in {} out {}; \
                     EFCP duplicates {} out_of_window {} ctrl_invalid {} inactivity_resets {}{dtcp}",
                    ep.local_cep,
                    ep.remote_addr,
                    ep.remote_cep,
                    ep.qos_id,
                    c.sdus_in,
                    c.sdus_out,
                    e.duplicates,
                    e.out_of_window,
                    e.ctrl_invalid,
                    e.inactivity_resets
                )),
                rib::OwnerId::FLOW_ALLOCATOR,
            );
        }
    }

    /// The RIB daemon's CDAP sessions, one object per peer
    /// (`/difm/cdap/sessions/peer=port-<N-1 port>` for a neighbour,
    /// `peer=addr-<address>` for a member reached by address), with their
    /// state (idle, connecting, open; implicit where no opening is needed)
    /// and counters.
    fn put_sessions(&self, r: &mut Rib) {
        for (peer, s) in self.mgmt.sessions() {
            let key = match peer {
                super::mgmt_rib::Peer::Neighbor(p) => format!("port-{p}"),
                super::mgmt_rib::Peer::Remote(a) => format!("addr-{a}"),
            };
            let c = &s.counters;
            let state = match peer {
                super::mgmt_rib::Peer::Neighbor(_) if self.mship.is_some() => s.state.name(),
                // Members at an address, and neighbours the driver
                // configured: no opening needed.
                _ => "implicit",
            };
            let value = format!(
                "state {state}, requests in {}, requests out {}, answers in {}, unmatched answers {}, outstanding {}",
                c.rx_requests,
                c.tx_requests,
                c.rx_responses,
                c.rx_unmatched,
                s.outstanding()
            );
            // Well-formed names; the RIB is far from full.
            let _ = r.create_with_parents(
                &format!("/difm/cdap/sessions/peer={key}"),
                "CdapSession",
                ObjValue::Str(value),
                rib::OwnerId::RIB_DAEMON,
            );
        }
    }
}

/// What a flow's DTCP is doing, as `key value` pairs after the EFCP
/// counters: data PDUs sent and resent (and why), acks and nacks each
/// way, window updates, congestion marks and window reductions, the
/// congestion window in PDUs (0 without congestion control), and the
/// smoothed RTT (0 before a sample), its variation and the RTO in
/// microseconds.
fn dtcp_state(e: &crate::efcp::Stats) -> String {
    let us = |d: Duration| d.as_micros();
    format!(
        "; DTCP pdus_sent {} retransmitted {} rto_expirations {} fast_retransmits {} \
         acks_sent {} acks_received {} nacks_sent {} nacks_received {} fc_sent {} fc_received {} \
         ecn_marked {} ecn_echoed {} ecn_reductions {} loss_reductions {} cwnd {} \
         srtt_us {} rttvar_us {} rto_us {}",
        e.pdus_sent,
        e.pdus_retransmitted,
        e.rto_expirations,
        e.fast_retransmits,
        e.acks_sent,
        e.acks_received,
        e.nacks_sent,
        e.nacks_received,
        e.fc_sent,
        e.fc_received,
        e.ecn_marked,
        e.ecn_echoed,
        e.ecn_reductions,
        e.loss_reductions,
        e.cwnd,
        e.srtt.map_or(0, us),
        us(e.rttvar),
        us(e.rto),
    )
}
