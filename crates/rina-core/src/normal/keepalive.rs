//! Flow keepalive: how a flow finds out that its peer is gone when
//! nothing else would tell it (a flow that carries nothing, or on which
//! only the far end would speak).
//!
//! # Policy
//!
//! Opt-in per QoS cube ([`QosCube::keepalive`](super::QosCube::keepalive),
//! an interval). Every interval, a flow of such a cube looks back. Unless
//! the peer said something of its own in the interval (a data or control
//! PDU, or a probe of its own), the flow sends a probe, which the peer
//! answers at once. If nothing at all arrived in the interval (answers
//! included), it is a miss; after [`KEEPALIVE_MISSES`] misses in a row
//! (so after 3 to 4 intervals of silence, two probes unanswered) the flow
//! is failed
//! ([`Action::FlowFailed`](super::Action::FlowFailed) with
//! [`EfcpError::PeerSilent`]), which a driver deallocates and reports to
//! the application, and counted (`keepalive_expired`).
//!
//! A probe to a peer that restarted reaches a member with no end of the
//! connection, which answers it with a DEALLOC of the flow object
//! (`connections_gone`, [`super::fa`]): such a flow ends within one
//! interval and a round trip, not after the misses.
//!
//! So a peer that restarted is probed within an interval, whichever end
//! is silent; between two live idle ends with the same interval, one
//! probe and its answer per interval keep both alive (the end that hears
//! the other's probes does not probe), and a flow busy in both directions
//! sends none.
//!
//! # Wire
//!
//! No new PDU type and no new field: a probe and its answer are IRATI's
//! control-ack PDU (CACK, 0xC0), which this EFCP does not otherwise send,
//! addressed like the flow's other control PDUs. A probe has
//! `last_ctrl_seq_rcvd` 0 and carries its own number (from 1) as its
//! control sequence number; the answer carries control sequence number 0
//! and the probe's number in `last_ctrl_seq_rcvd` (never 0). All their
//! other fields are 0. A flow end answers probes whether or not its own
//! cube has keepalive (the keepalive is local configuration, not part of
//! the DIF's profile), and never answers an answer.
//!
//! # A new setting
//!
//! [`NormalIpcp::set_cube_keepalive`] changes a cube's interval (or turns
//! it on or off) on a running IPCP, e.g. when its configuration file is
//! read again: the flows allocated afterwards take it, and so do the flows
//! of the cube that are up. Such a flow starts a fresh interval there and
//! then (its misses forgotten, its probe numbering kept), so a peer gone
//! silent before the change is failed 3 to 4 new intervals after it; a
//! flow turned off stops probing but still answers. Switching the flows
//! up is what an operator changing the setting means (shorter intervals
//! to find dead peers sooner, or off because probes cost too much), it
//! is local (the peer is not asked, as with the setting itself), and it
//! only touches each flow's own timer.

use super::{Flow, FlowId, NormalIpcp};
use crate::efcp::EfcpError;
use crate::time::Instant;
use rina_wire::pci::ControlBody;
use std::time::Duration;

/// Intervals in a row with nothing heard after which a flow is failed.
pub const KEEPALIVE_MISSES: u32 = 3;

/// Shortest keepalive interval a cube may have.
pub const MIN_KEEPALIVE: Duration = Duration::from_millis(10);

/// Longest keepalive interval a cube may have.
pub const MAX_KEEPALIVE: Duration = Duration::from_secs(3600);

/// Why a keepalive interval is refused.
pub fn check_interval(interval: Duration) -> Result<(), String> {
    if (MIN_KEEPALIVE..=MAX_KEEPALIVE).contains(&interval) {
        Ok(())
    } else {
        Err(format!(
            "the keepalive interval must be {} ms to {} s, not {} ms",
            MIN_KEEPALIVE.as_millis(),
            MAX_KEEPALIVE.as_secs(),
            interval.as_millis()
        ))
    }
}

/// The keepalive state of one flow.
#[derive(Debug)]
pub(super) struct Keepalive {
    interval: Duration,
    /// When the flow next looks back.
    next: Instant,
    /// Intervals in a row with nothing heard.
    missed: u32,
    /// The number of the last probe sent.
    probes: u64,
    /// An answer to a probe arrived since the flow last looked.
    answered: bool,
}

impl Keepalive {
    /// Keepalive every `interval`, from `now`.
    pub(super) fn new(now: Instant, interval: Duration) -> Self {
        Keepalive {
            interval,
            next: now + interval,
            missed: 0,
            probes: 0,
            answered: false,
        }
    }

    /// When the flow next looks back.
    pub(super) fn due(&self) -> Instant {
        self.next
    }

    /// Keepalive every `interval` from `now` on: a fresh interval, the
    /// misses and answers so far forgotten, the probe numbering kept.
    fn restart(&mut self, now: Instant, interval: Duration) {
        self.interval = interval;
        self.next = now + interval;
        self.missed = 0;
        self.answered = false;
    }
}

/// What a flow's look back asks for.
enum Tick {
    /// The peer is alive, or not due yet.
    Nothing,
    /// Send probe number `n`.
    Probe(u64),
    /// Nothing heard for too long: fail the flow.
    Expired(Duration),
}

impl Flow {
    /// Looks back over the interval that ended, if one did.
    fn keepalive_tick(&mut self, now: Instant, ctrl_seq_max: u64) -> Tick {
        let heard = std::mem::take(&mut self.heard);
        let Some(k) = self.ka.as_mut() else {
            return Tick::Nothing;
        };
        if now < k.next {
            self.heard = heard;
            return Tick::Nothing;
        }
        k.next = now + k.interval;
        let answered = std::mem::take(&mut k.answered);
        if heard {
            k.missed = 0;
            return Tick::Nothing;
        }
        if answered {
            k.missed = 0;
        } else {
            k.missed += 1;
        }
        if k.missed >= KEEPALIVE_MISSES {
            let silent = k.interval * k.missed;
            self.ka = None;
            return Tick::Expired(silent);
        }
        // Numbered from 1 within the control sequence number's width.
        k.probes = if k.probes >= ctrl_seq_max.max(1) {
            1
        } else {
            k.probes + 1
        };
        Tick::Probe(k.probes)
    }
}

impl NormalIpcp {
    /// Sets the keepalive of QoS cube `id` to `interval` (`None`: off) at
    /// `now`, checked first: the flows of the cube allocated from now on
    /// take it, and those up switch to it at once (see the [module
    /// documentation](self)), but for one already failed. Returns how many
    /// flows up switched.
    pub fn set_cube_keepalive(
        &mut self,
        now: Instant,
        id: u64,
        interval: Option<Duration>,
    ) -> Result<usize, super::NormalError> {
        let bad = |reason: String| super::NormalError::BadCube { id, reason };
        if let Some(i) = interval {
            check_interval(i).map_err(bad)?;
        }
        let c = self
            .cfg
            .cubes
            .iter_mut()
            .find(|c| c.id == id)
            .ok_or_else(|| bad("no such cube".into()))?;
        c.keepalive = interval;
        let switched: Vec<FlowId> = self
            .flows
            .iter_mut()
            .filter(|(_, f)| f.ep.qos_id == id && !f.failure_reported)
            .map(|(&fid, f)| {
                match (interval, f.ka.as_mut()) {
                    (None, _) => f.ka = None,
                    (Some(i), Some(k)) => k.restart(now, i),
                    (Some(i), None) => f.ka = Some(Keepalive::new(now, i)),
                }
                fid
            })
            .collect();
        for &fid in &switched {
            self.rearm(fid);
        }
        Ok(switched.len())
    }

    /// Runs the keepalive of flow `id` at `now`: sends a probe, or fails
    /// the flow, if its interval ended without a word from the peer.
    pub(super) fn keepalive_timeout(&mut self, now: Instant, id: FlowId) {
        let max = self.cfg.dt.ctrl_seq.max_value();
        let (flows, mut out) = self.split_out();
        let Some(f) = flows.get_mut(&id) else {
            return;
        };
        match f.keepalive_tick(now, max) {
            Tick::Nothing => {}
            Tick::Probe(n) => {
                out.counters().keepalives_sent += 1;
                out.send_control(now, f, n, probe());
            }
            Tick::Expired(silent) => {
                out.counters().keepalive_expired += 1;
                if !f.failure_reported {
                    f.failure_reported = true;
                    let ms = u64::try_from(silent.as_millis()).unwrap_or(u64::MAX);
                    out.fail(id, EfcpError::PeerSilent { ms });
                }
            }
        }
    }

    /// A CACK arrived on flow `id` with control sequence number
    /// `ctrl_seq`: a probe (`last_ctrl_seq_rcvd` 0) is the peer's word, and
    /// answered; an answer shows the peer alive, but does not spare the
    /// next probe (the peer may have restarted since).
    pub(super) fn on_keepalive(
        &mut self,
        now: Instant,
        id: FlowId,
        ctrl_seq: u64,
        body: &ControlBody,
    ) {
        let ControlBody::Cack {
            last_ctrl_seq_rcvd, ..
        } = *body
        else {
            return;
        };
        let mask = self.cfg.dt.ctrl_seq.max_value();
        let (flows, mut out) = self.split_out();
        let Some(f) = flows.get_mut(&id) else {
            return;
        };
        if last_ctrl_seq_rcvd != 0 {
            if let Some(k) = f.ka.as_mut() {
                k.answered = true;
            }
            return;
        }
        f.heard = true;
        out.counters().keepalives_answered += 1;
        let echo = (ctrl_seq & mask).max(1);
        out.send_control(now, f, 0, answer(echo));
    }
}

/// A probe's body.
fn probe() -> ControlBody {
    cack(0)
}

/// The body of the answer to probe number `n`.
fn answer(n: u64) -> ControlBody {
    cack(n)
}

fn cack(last_ctrl_seq_rcvd: u64) -> ControlBody {
    ControlBody::Cack {
        last_ctrl_seq_rcvd,
        new_lwe: 0,
        new_rwe: 0,
        my_lwe: 0,
        my_rwe: 0,
        rate: 0,
        frame: 0,
    }
}
