//! The `sim` backend: the experiment in virtual time, deterministic (every
//! random draw derives from the experiment's seed; no wall clock enters the
//! results but `wall_time_s`), for large or long scenarios.
//!
//! # Engines
//!
//! [`Sim`] picks an engine ([`Engine::choose`]) and says which, and why,
//! in the run's timeline (`engine: protocol ...` / `engine: queueing ...`).
//!
//! - **Protocol engine** (`protocol`), the default for everything it can
//!   run: one `rina-core` [`rina_core::system::System`] per node — the
//!   IPCP machines `rinad` runs, composed into one system — on `rina-sim`'s world:
//!   a shim-udp IPCP per link end, over an emulated link with the
//!   experiment's rate, delay, loss, queue and [`LINK_OVERHEAD`], and a
//!   normal IPCP per DIF the node is a member of, stacked as the file
//!   says, each configured as the real backends configure `rinad`
//!   ([`super::stack`]: the core's standard member, a DIF over links
//!   taking the largest PDU a 1500-byte shim SDU carries, the shims
//!   pacing at [`super::stack::PACE_SHARE`] of the link's rate), with its DIF's QoS cubes (mapped onto the lower DIF's
//!   cubes by `maps_to`) and scheduling policy. The shims pace the N-1
//!   flows at the link's rate, so PDUs wait in the RMT of each DIF, where
//!   its policy orders and drops them, and the systems' resource
//!   allocators set up one N-1 flow per neighbour and lower cube in use
//!   (lanes). Nothing is configured but names: each DIF's bootstrap
//!   member (derived by the resolver) has address 1, routing and the
//!   disseminated directory; the others enroll through it (password,
//!   address grant), link-state routing and the directory converge, then
//!   the traffic starts on the next whole second (the timeline shows
//!   enrollment and convergence at negative times). Flows directly over a
//!   link allocate in its shim DIF (no cube: a shim has none), their
//!   server's name registered in the shim-udp of the link's other end and
//!   in the directory of this end's, as the real backends write it.
//!   Applications are registered by name (a sink `sink-<node>` stands for a node
//!   destination); clients allocate flows by name with the flow's cube
//!   (`QosSpec::cube`) and write SDUs carrying their send time, echo
//!   servers write every SDU back (RTT), sinks time-stamp what arrives
//!   (one-way delay). A link down/up takes both ends' shims down/up (the
//!   N-1 flows over them are torn down at once, routing reroutes, the
//!   allocators set them up again); an application move unregisters it at
//!   the old node (its flows are deallocated) and registers it at the new
//!   one; a node stop drops the node's system (its flows end, the
//!   frames that reach it are lost, its neighbours take it down when its
//!   hellos stop: routing reroutes) and a node start gives it a new one,
//!   built as at the start with fresh nonces and CEP-ids, whose members
//!   enroll again, its applications registering once they can;
//!   the unchanged client allocates again by the same name every
//!   250 ms until it works, each allocation a record (`<flow>#2`,
//!   `served_by` the node that answered). Perf flows run `rina-perf`'s
//!   throughput sweep with the tool's own protocol and receiver
//!   ([`rina_tools::perf`]): per size a test of `per_size`, START, DATA as
//!   fast as the stack takes it (a reliable cube's window and congestion
//!   control make the writer wait; an unreliable writer waits while its
//!   system's RMT queues are full), STOP until the REPORT comes, whose
//!   receive rate is the goodput point, aggregated as the real backends
//!   aggregate the tool's report. Link figures are `rina-sim`'s
//!   link counters over the traffic period. Picked by itself up to
//!   [`PROTOCOL_AUTO_CAP_BITS`] of traffic offered over the run (each tgen
//!   source's mean rate, each echo client's probes and replies, and per
//!   perf flow the fastest link rate at its source, at most at its
//!   destination, times the time it runs): every
//!   PDU of every layer is simulated, so the work grows with the bits;
//!   `--engine protocol` asks for it beyond. Every shipped example runs in
//!   it by itself. Perf from a node with a link without a rate is not run (the
//!   writer would fill it in no time).
//!
//! - **Queueing (PDU-level) engine** (`queueing`), a fast approximation
//!   for what the protocol engine cannot run (perf over links without a
//!   rate) and for runs that offer more traffic than that bound, or when
//!   asked with `--engine queueing`; a test compares it with the protocol engine
//!   on the same congested-link scenario. Each flow's SDUs are cut into PDUs of its DIF
//!   (its largest PDU as every backend configures it,
//!   [`super::stack::max_pdu`], minus a [`PCI_BYTES`] header), routed on a shortest path (fewest hops; ties to the adjacency
//!   written first) of its DIF's adjacency graph; an adjacency over a lower
//!   DIF is replaced, recursively, by that DIF's own path, so a PDU ends up
//!   as a list of link traversals. At each link output the PDU waits in the
//!   scheduler of the *lowest* normal DIF on that hop — the unchanged
//!   `rina-core` policy built by [`SchedulerConfig::build`] from that DIF's
//!   cubes — under the QoS-id its cube maps to there (the `maps_to` chain).
//!   That is what makes seed 003's "SPN only" (FIFO at MR) lose the
//!   differentiation on the IR links and "SPN+MR" keep it. Several DIFs
//!   directly over one link each have their scheduler on it, served round
//!   robin; flows directly over a link shim wait in a FIFO of the link's
//!   `queue` frames. A link sends one frame at a time at its rate (the
//!   scheduler *is* the transmit queue), adds its delay, and loses a frame
//!   with its loss probability (a ChaCha8 stream per link).
//!
//!   Sizes: every normal DIF a PDU is in adds [`PCI_BYTES`]; a lower DIF
//!   whose PDUs cannot hold the upper PDU cuts it into fragments (each with
//!   its own PCI), and every frame on a link pays the shim-udp header and
//!   [`LINK_OVERHEAD`] (Ethernet header, VLAN tag, FCS, preamble and gap). The fragments a
//!   lower DIF makes of one upper PDU go through the hop's queue as one
//!   item of their total size (they leave back to back); fragments of the
//!   flow's own DIF are separate PDUs and an SDU counts as delivered when
//!   all of them are. Goodput against SDU size thus shows what each layer
//!   costs.
//!
//!   Traffic: tgen sources follow [`rina_tools::tgen::gen::Generator`] (the
//!   real tool's schedules), seeded from the experiment seed and the flow's
//!   index, shifted by a random phase within one packet gap (flows of one
//!   matrix do not start in lockstep; the protocol engine does the same);
//!   echo sends a probe every `interval`, the destination writes it back on
//!   the reverse path, the record's delay is RTT / 2; perf keeps a window
//!   of SDUs in flight (at most 256 KiB and 400 SDUs) for `per_size` at
//!   each size, a delivered or lost SDU making room for the next (a closed
//!   loop standing in for flow control), and a size's goodput is timed as
//!   `rina-perf`'s receiver times it: the bits after its first SDU over
//!   the time from the first SDU's arrival to the last's (it counted what
//!   arrived until the current size's period ended, so a size's SDUs
//!   still queued when the next began counted too: 10.4 Mb/s over a 10
//!   Mb/s link; now 8.80 and 9.54 Mb/s at 500 and 1400 bytes, where the
//!   stack, pacing at 97 %, gets 8.55 and 9.25).
//!
//!   A flow of a reliable cube sends what its links and queues drop again
//!   from its source, as EFCP would: after twice the path's propagation
//!   delay (at least 1 ms), doubling each time, at most ten times (it lost
//!   5.2 % and 20.5 % of `cc-loss`'s reliable flows before; now nothing,
//!   and the timeline counts what went again). The model has no
//!   congestion control: over a lossy link it keeps its window where the
//!   stack's EFCP slows down (`cc-loss` at 20 % loss: 6.24 Mb/s in the
//!   model, 2.76 in the stack).
//!
//!   Events act at once, as if routing and the directory converged
//!   instantly: a link down drops what waits on it and what is on the wire,
//!   routes are recomputed (rerouting over an alternative); a node stop
//!   takes its links down; an application move makes every flow to it an
//!   allocation again (`<flow>#2`, `served_by` the new node), PDUs still
//!   on their way to the old place being lost.
//!
//!   Measured: one-way delay per SDU (emission to delivery of its last
//!   fragment) into each flow's statistics and a reservoir of 20 000
//!   samples per class; loss; goodput; hops in the flow's DIF; per link and
//!   direction the average bit/s of the frames sent (overhead included)
//!   during the traffic and the frames dropped (queue or loss), which the
//!   load calibration of [`super::run`] uses. After the traffic stops the
//!   queues drain for two seconds of virtual time.
//!
//! Both engines are deterministic: every draw comes from the experiment's
//! seed, time is virtual, and maps are ordered.
//!
//! The same experiment and seed give the same [`RunOutput`] but for
//! `wall_time_s`.

mod protocol;
mod queueing;

use super::{Backend, RunCtx};
use crate::results::{RunOutput, TimelineEntry};
use crate::{Experiment, LabError};
#[cfg(doc)]
use rina_core::rmt::SchedulerConfig;

/// Bytes of header every normal DIF adds to a PDU carrying one SDU
/// (data-transfer PCI 19, delimiter 1, TTL 1: what
/// [`rina_core::normal::NormalConfig::sdu_overhead`] gives for the standard
/// member, no CRC; a test checks they agree).
pub const PCI_BYTES: usize = 21;
/// Bytes every frame costs on a link beyond its payload: Ethernet header
/// (14), VLAN tag (4), FCS (4), preamble (8) and inter-frame gap (12).
pub const LINK_OVERHEAD: usize = 42;
pub use super::stack::LINK_MTU;

/// The `sim` backend.
#[derive(Debug, Default)]
pub struct Sim {
    /// Events the last run processed.
    pub last_events: u64,
    /// The engine asked for (`--engine`); `None` picks one by what the
    /// experiment needs.
    pub engine: Option<Engine>,
}

/// Which engine runs an experiment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// The real protocol machines: a `rina-core` `System` per node.
    Protocol,
    /// PDU-level queueing over the real schedulers: a fast approximation.
    Queueing,
}

/// Traffic offered over a run (bits: each source's rate times the time it
/// runs) above which the protocol engine is only used when asked for: it
/// simulates every PDU of every layer, at half a second to a second of
/// wall time per Gbit on one core (`goodput-sdu`, 36 Gbit over the shim
/// and one and two DIFs, 19-34 s; each variant of seed 003's `metro-37`,
/// 17 Gbit over 37 nodes, 11-27 s; the host's speed drifts), so this
/// bound is a few minutes: seed 003 at the paper's 600 s (172 Gbit) runs
/// on the stack by itself.
pub const PROTOCOL_AUTO_CAP_BITS: f64 = 200e9;

impl Engine {
    /// The engine called `name` (`protocol` or `queueing`).
    pub fn by_name(name: &str) -> Result<Engine, String> {
        match name {
            "protocol" => Ok(Engine::Protocol),
            "queueing" => Ok(Engine::Queueing),
            other => Err(format!("no engine `{other}` (protocol or queueing)")),
        }
    }

    /// The engine for `exp`, and why; `asked` is the engine asked for.
    pub fn choose(exp: &Experiment, asked: Option<Engine>) -> Result<(Engine, String), LabError> {
        const PROTOCOL: &str = "engine: protocol (a rina-core System per node on rina-sim: \
                                shims paced at the link rate, every DIF's RMT and scheduler, \
                                enrollment, link-state routing, directory, EFCP)";
        match asked {
            Some(Engine::Queueing) => Ok((
                Engine::Queueing,
                "engine: queueing (PDU-level approximation, rina-core schedulers, instant \
                 routing), as asked"
                    .into(),
            )),
            Some(Engine::Protocol) => match protocol::eligible(exp, None) {
                Ok(()) => Ok((Engine::Protocol, PROTOCOL.into())),
                Err(why) => Err(LabError::Unsupported {
                    backend: "sim",
                    reason: format!("the protocol engine cannot run {why}"),
                }),
            },
            None => Ok(
                match protocol::eligible(exp, Some(PROTOCOL_AUTO_CAP_BITS)) {
                    Ok(()) => (Engine::Protocol, PROTOCOL.into()),
                    Err(why) => (
                        Engine::Queueing,
                        format!(
                            "engine: queueing (PDU-level approximation, rina-core schedulers, \
                         instant routing); not the protocol engine because of {why}"
                        ),
                    ),
                },
            ),
        }
    }
}

/// A 64-bit mix of a seed and a stream number (splitmix64).
pub(crate) fn mix(seed: u64, stream: u64) -> u64 {
    let mut z = seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Backend for Sim {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn check(&self) -> Result<(), LabError> {
        Ok(())
    }

    fn run_once(&mut self, exp: &Experiment, ctx: &RunCtx<'_>) -> Result<RunOutput, LabError> {
        let wall = std::time::Instant::now();
        let (engine, why) = Engine::choose(exp, self.engine)?;
        let mut out = RunOutput {
            backend: "sim".into(),
            experiment: exp.name.clone(),
            variant: exp.variant.clone(),
            duration_s: exp.duration.as_secs_f64(),
            ..Default::default()
        };
        out.timeline.push(TimelineEntry {
            t_s: 0.0,
            what: why,
        });
        match engine {
            Engine::Protocol => {
                self.last_events = protocol::run(exp, ctx, &mut out)?;
            }
            Engine::Queueing => {
                let mut e = queueing::Engine::new(exp)?;
                e.run(ctx)?;
                self.last_events = e.steps;
                e.output(&mut out);
            }
        }
        out.wall_time_s = wall.elapsed().as_secs_f64();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    /// The queueing engine's PDU header is the standard member's.
    #[test]
    fn pci_bytes_are_the_standard_members() {
        let c = rina_core::normal::NormalConfig::standard("x", 0);
        assert_eq!(super::PCI_BYTES, c.sdu_overhead());
    }
}
