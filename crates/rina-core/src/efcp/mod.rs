//! EFCP — the Error and Flow Control Protocol — for one connection endpoint,
//! as a sans-IO state machine.
//!
//! A [`Connection`] is both ends of the protocol for one flow at this IPCP:
//! DTP (sequencing, duplicate detection, in-order delivery through a
//! bounded reordering queue, the max-SDU-gap rule, data runs) and DTCP
//! (window and rate flow control, retransmission with cumulative acks, a
//! delayed-ack A-timer, an RFC 6298 RTO). It never reads a clock: every call
//! takes the current [`Instant`].
//!
//! # Driving it
//!
//! * [`Connection::write`] an SDU fragment (already delimited); on
//!   [`EfcpError::WouldBlock`] wait until [`Connection::can_write`].
//! * [`Connection::on_pdu`] for every PDU of this connection from the peer.
//! * After any of those calls (and after [`Connection::handle_timeout`] and
//!   [`Connection::consumed`]), drain [`Connection::poll_transmit`] and
//!   [`Connection::poll_deliver`].
//! * Call [`Connection::handle_timeout`] when [`Connection::poll_timeout`]
//!   says so.
//! * With window flow control, tell the connection when the application
//!   actually consumed delivered SDUs ([`Connection::consumed`]); a driver
//!   that hands SDUs to a bounded sink (a socket) consumes them as soon as
//!   the sink took them. A slow reader thus shrinks the credit.
//!
//! # The PDU model and the IRATI PCI
//!
//! [`Pdu`] is this protocol's own view, independent of the wire format. The
//! normal IPCP translates it to and from `rina_wire::pci` (DT constants
//! give the field widths; widen received numbers with [`widen_seq`]):
//!
//! | [`Pdu`] | PCI type | fields |
//! | --- | --- | --- |
//! | `Data` | DT 0x80 | `seq` → seq_num; `drf` → flag DRF 0x80; [`PduMeta::ecn`] → flag ECN 0x01 |
//! | `Ack` | ACK 0xC1 | `ctrl_seq` → ctrl_seq_num; `ack_sn` → acked_sn; ECN echo → flag ECN |
//! | `Nack` | NACK 0xC2 | `nack_sn` → nack_sn |
//! | `Fc` | FC 0xC4 | `new_rwe` → new_rwe; `rate` → sndr_rate; `frame_ms` → time_frame; my_lwe/my_rwe = 0 |
//! | `AckFc` | ACK_AND_FC 0xC5 | as Ack and Fc; new_lwe = ack_sn + 1; my_lwe = [`PduMeta::echo`] (0: none); last_ctrl_seq_rcvd, my_rwe = 0 |
//! | `Rendezvous` | RENDEZVOUS 0xCF | `next_seq` → my_lwe; other fields 0 |
//!
//! Acks are cumulative and inclusive: `ack_sn` means every sequence number
//! up to and including `ack_sn` was received *or given up* by the receiver
//! (a hole the max-SDU-gap rule allowed to skip is acknowledged, so the
//! sender stops retransmitting it). `new_rwe` is inclusive too: the sender
//! may send sequence numbers up to and including it. Every control PDU
//! carries a control sequence number; one not newer than the last accepted
//! is stale and ignored (every field is cumulative, so nothing is lost).
//!
//! # Data runs and inactivity (delta-t)
//!
//! Δ = MPL + R + A ([`EfcpConfig::delta_t`]), R = `(max_retries + 1) ·
//! max_rto`. Sequence numbers never restart within a connection (they start
//! at 1, or at [`Connection::with_initial_seq`]), so a new data run costs
//! nothing: the sender sets DRF on its first PDU and on the first PDU after
//! Δ with nothing sent and nothing unacknowledged. The receiver ends its
//! run after 2Δ without hearing from the sender (IRATI: 2Δ), handing over
//! what it held. (IRATI's sender waits 3Δ; we use Δ because a sender that
//! keeps an old run past the receiver's reset would be refused, while an
//! early DRF costs nothing.) Without retransmission, a DRF PDU beyond the
//! LWE ends the current run and starts a new one at its seq; with it, a
//! sender starts a run only with everything acknowledged, so its DRF PDU is
//! always LWE+1 and one further ahead is taken as an ordinary PDU. Without
//! a run, a PDU without DRF starts one if the flow does not retransmit (a
//! lost DRF must not block delivery) and is held (bounded) if it does (the
//! DRF PDU will be retransmitted). Such a run begins right after the
//! highest number known not to be new (at most `max_reorder` back), so the
//! PDUs it overtook on the way, the DRF PDU among them, are still taken
//! when they come, and those that never come are given up as any hole is.
//!
//! # Forged and replayed PDUs
//!
//! Nothing from the peer is trusted (see [`Connection::on_pdu`]). The
//! receiver keeps the highest LWE any run reached: sequence numbers never
//! restart within a connection, so a PDU at or below it is a duplicate even
//! with no run live (a replay cannot start a run), and a PDU beyond what
//! the sender may have sent — the advertised RWE with window flow control,
//! `max_reorder + 1` past the LWE with retransmission only,
//! [`MAX_UNRELIABLE_JUMP`] otherwise — is dropped and counted
//! ([`Stats::out_of_window`]) without an answer. A plain unreliable flow
//! that really lost more resynchronises after 2Δ without a PDU taken.
//! Control PDUs acknowledging what was never sent, granting credit beyond
//! what a receiver of the same cube could, carrying a rendezvous outside
//! the window, or jumping the control sequence number by more than
//! [`MAX_CTRL_SEQ_JUMP`] are ignored and counted ([`Stats::ctrl_invalid`]);
//! a stale control PDU still counts for its cumulative fields (ack, RWE),
//! so a poisoned control sequence number cannot stall the flow. What this
//! cannot stop without cryptography: a forged ack within what was sent.
//!
//! # Policies chosen here
//!
//! * Acks (with rtx): at once when a PDU arrives out of order, fills a hole,
//!   is a duplicate or is dropped, and after `ack_every` new in-order PDUs;
//!   otherwise at most A after the first unacknowledged one.
//! * Window updates: the receiver grants `rwe = lwe + buffer − buffered +
//!   received-above-lwe` (so its buffer never overflows), sending an update
//!   at once when the edge moved by a quarter of the buffer, otherwise
//!   within A. A sender whose window stays closed sends a rendezvous (after
//!   one RTO with rtx, else 2A; doubling), which the receiver answers with
//!   its window; this recovers from lost window updates, with or without
//!   retransmission.
//! * Rate: at most `pdus_per_frame` data PDUs per frame; a peer may impose
//!   a tighter rate through `rate`/`frame_ms` of its flow-control PDUs.
//! * Retransmission: see [`dtcp`](self) docs in the source — single timer,
//!   NewReno-style recovery, fast retransmit on 3 duplicate acks, Karn's
//!   rule, back-off reset on new ack, failure after `max_retries`; with
//!   congestion control also nacks and acks naming their PDU.
//! * Congestion control ([`CcConfig`], `cc.rs`): a DCTCP-like or AIMD
//!   congestion window on top of the receiver's window, fed by the ECN
//!   marks RMTs set and by losses (`docs/congestion-control.md`).
//!
//! Per PDU nothing is allocated beyond the payload itself (a
//! [`PduBuf`] with room in front, which the layers below fill with their
//! headers in place), except that a retransmitting sender keeps the buffer
//! as written for retransmission and sends a copy, each time.

mod cc;
mod config;
mod dtcp;
mod dtp;
mod rtt;

pub use cc::{CcConfig, CcPolicy, CcState};
pub use config::{
    CcName, ConfigError, DtcpConfig, EfcpConfig, EfcpTuning, RateFc, RtxConfig, WindowFc,
    DEFAULT_A_TIMER, DEFAULT_MPL,
};
pub use rtt::{RttEstimator, CLOCK_GRANULARITY};

pub use crate::buf::PduBuf;
use crate::time::Instant;
use dtcp::Sender;
use dtp::{Receiver, RxOutcome};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;
use thiserror::Error;

/// How far past the LWE a flow without retransmission or window control
/// accepts a sequence number (its sender is bound by nothing else): a loss
/// burst longer than this stalls delivery for 2Δ, after which the receiver
/// resynchronises on whatever arrives.
pub const MAX_UNRELIABLE_JUMP: u64 = 1 << 16;

/// How far a control sequence number may jump ahead of the last one taken
/// (the peer increments it by one per control PDU; more than this many
/// lost in a row is not plausible).
pub const MAX_CTRL_SEQ_JUMP: u64 = 1 << 16;

/// A PDU of one EFCP connection, as the protocol sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pdu {
    /// A data transfer PDU carrying one delimited fragment.
    Data {
        /// Sequence number (≥ 1).
        seq: u64,
        /// Data run flag: the first PDU of a (new) run.
        drf: bool,
        /// The fragment; EFCP does not look inside.
        payload: PduBuf,
    },
    /// A cumulative ack.
    Ack {
        /// Control sequence number.
        ctrl_seq: u64,
        /// Every seq up to and including this one arrived or was given up.
        ack_sn: u64,
    },
    /// A flow-control update.
    Fc {
        /// Control sequence number.
        ctrl_seq: u64,
        /// Highest seq the sender may send.
        new_rwe: u64,
        /// PDUs per frame the sender may send (0: no rate imposed).
        rate: u64,
        /// Length of the rate frame in milliseconds (0: no rate imposed).
        frame_ms: u64,
    },
    /// An ack and a flow-control update together.
    AckFc {
        /// Control sequence number.
        ctrl_seq: u64,
        /// As in [`Pdu::Ack`].
        ack_sn: u64,
        /// As in [`Pdu::Fc`].
        new_rwe: u64,
        /// As in [`Pdu::Fc`].
        rate: u64,
        /// As in [`Pdu::Fc`].
        frame_ms: u64,
    },
    /// A negative ack: this sequence number is missing at the receiver
    /// (sent by connections with congestion control, once per hole found).
    Nack {
        /// Control sequence number.
        ctrl_seq: u64,
        /// The missing sequence number.
        nack_sn: u64,
    },
    /// The sender's window has been closed for too long: please send your
    /// window again.
    Rendezvous {
        /// Control sequence number.
        ctrl_seq: u64,
        /// The first seq the sender has not sent yet.
        next_seq: u64,
    },
}

impl Pdu {
    /// This PDU with every sequence number passed through a map: `own`
    /// for those in its sender's own sequence space (a data PDU's number,
    /// a rendezvous' next one), `peer` for those naming PDUs of the other
    /// end (acked and nacked numbers, window edges), `ctrl` for the
    /// control sequence number. Cutting numbers to their fields and
    /// widening them back ([`Connection::widen`]) are such maps.
    pub fn map_numbers(
        self,
        own: impl Fn(u64) -> u64,
        peer: impl Fn(u64) -> u64,
        ctrl: impl Fn(u64) -> u64,
    ) -> Pdu {
        match self {
            Pdu::Data { seq, drf, payload } => Pdu::Data {
                seq: own(seq),
                drf,
                payload,
            },
            Pdu::Ack { ctrl_seq, ack_sn } => Pdu::Ack {
                ctrl_seq: ctrl(ctrl_seq),
                ack_sn: peer(ack_sn),
            },
            Pdu::Fc {
                ctrl_seq,
                new_rwe,
                rate,
                frame_ms,
            } => Pdu::Fc {
                ctrl_seq: ctrl(ctrl_seq),
                new_rwe: peer(new_rwe),
                rate,
                frame_ms,
            },
            Pdu::AckFc {
                ctrl_seq,
                ack_sn,
                new_rwe,
                rate,
                frame_ms,
            } => Pdu::AckFc {
                ctrl_seq: ctrl(ctrl_seq),
                ack_sn: peer(ack_sn),
                new_rwe: peer(new_rwe),
                rate,
                frame_ms,
            },
            Pdu::Nack { ctrl_seq, nack_sn } => Pdu::Nack {
                ctrl_seq: ctrl(ctrl_seq),
                nack_sn: peer(nack_sn),
            },
            Pdu::Rendezvous { ctrl_seq, next_seq } => Pdu::Rendezvous {
                ctrl_seq: ctrl(ctrl_seq),
                next_seq: own(next_seq),
            },
        }
    }
}

/// What a PDU carries besides its [`Pdu`] fields, in the PCI flags and
/// the otherwise unused fields of acks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PduMeta {
    /// Data: an RMT on the way found its queue past the marking threshold
    /// (the PCI's ECN flag). Ack or Ack+FC: the PDUs it covers were marked
    /// (ECN echo, the same flag on the control PDU).
    pub ecn: bool,
    /// Ack or Ack+FC: the sequence number of the data PDU whose arrival
    /// caused it (carried in `my_lwe` of ACK_AND_FC), so the sender can
    /// measure the RTT while a hole holds the cumulative ack back.
    pub echo: Option<u64>,
}

/// An SDU fragment handed to the application side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Its sequence number.
    pub seq: u64,
    /// The fragment.
    pub payload: PduBuf,
}

/// Why an EFCP operation failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EfcpError {
    /// The window is closed and the closed-window queue is full: try again
    /// when [`Connection::can_write`] says so.
    #[error("flow control: the window is closed and the send queue is full")]
    WouldBlock,
    /// The connection failed (see [`Connection::failure`]); nothing more can
    /// be sent.
    #[error("the EFCP connection has failed")]
    Closed,
    /// A PDU was retransmitted `retries` times without being acknowledged.
    #[error("PDU {seq} unacknowledged after {retries} retransmissions")]
    RetriesExhausted {
        /// The PDU that was never acknowledged.
        seq: u64,
        /// Its retransmissions.
        retries: u32,
    },
    /// The destination has had no route for `secs` seconds (the DIF lost
    /// every path to it).
    #[error("no route to the peer for {secs} s")]
    NoRoute {
        /// How long it was unreachable.
        secs: u64,
    },
    /// Nothing came from the peer for `ms` milliseconds, keepalive
    /// probes included (the flow's keepalive gave up on it).
    #[error("nothing heard from the peer for {ms} ms (keepalive)")]
    PeerSilent {
        /// How long the peer was silent, at least.
        ms: u64,
    },
    /// The configuration is unusable.
    #[error("bad EFCP configuration: {0}")]
    Config(#[from] ConfigError),
}

/// Counters of one connection, and its RTT estimate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// New data PDUs sent.
    pub pdus_sent: u64,
    /// Data PDUs retransmitted.
    pub pdus_retransmitted: u64,
    /// Data PDUs received (including duplicates and drops).
    pub pdus_received: u64,
    /// Data PDUs received again, or after their seq was given up.
    pub duplicates: u64,
    /// SDU fragments handed over by [`Connection::poll_deliver`].
    pub delivered: u64,
    /// Data PDUs dropped because they were too far ahead of the LWE.
    pub dropped_queue: u64,
    /// Data PDUs dropped for lack of a data run (with retransmission).
    pub dropped_no_run: u64,
    /// Data PDUs dropped as beyond anything the sender may have sent (the
    /// window rules; forged or from another connection).
    pub out_of_window: u64,
    /// Data PDUs held until their run's (retransmitted) DRF PDU arrived.
    pub held_no_run: u64,
    /// Held PDUs dropped when a lossless run ended with a hole.
    pub dropped_reset: u64,
    /// Sequence numbers given up (never delivered).
    pub skipped: u64,
    /// Holes (runs of given-up seqs) closed by a later delivery.
    pub holes: u64,
    /// Holes larger than `max_sdu_gap` (possible only without rtx).
    pub gap_exceeded: u64,
    /// Data runs started by the receiver.
    pub runs_started: u64,
    /// Data runs started by the sender (PDUs sent with DRF).
    pub runs_sent: u64,
    /// Runs ended by receiver inactivity.
    pub inactivity_resets: u64,
    /// Writes refused with [`EfcpError::WouldBlock`].
    pub would_block: u64,
    /// Ack or Ack+FC PDUs sent.
    pub acks_sent: u64,
    /// Ack or Ack+FC PDUs accepted.
    pub acks_received: u64,
    /// FC or Ack+FC PDUs sent.
    pub fc_sent: u64,
    /// FC or Ack+FC PDUs accepted.
    pub fc_received: u64,
    /// Rendezvous PDUs sent.
    pub rendezvous_sent: u64,
    /// Rendezvous PDUs accepted.
    pub rendezvous_received: u64,
    /// Control PDUs ignored as stale (old control sequence number).
    pub ctrl_stale: u64,
    /// Control PDUs ignored as impossible: acking what was never sent,
    /// granting credit no receiver could, a rendezvous outside the window,
    /// a control sequence number jumping too far, a control PDU of a policy
    /// the connection does not run.
    pub ctrl_invalid: u64,
    /// Retransmission timer expirations.
    pub rto_expirations: u64,
    /// Retransmissions triggered by duplicate acks.
    pub fast_retransmits: u64,
    /// Nacks sent (missing PDUs named).
    pub nacks_sent: u64,
    /// Nacks accepted.
    pub nacks_received: u64,
    /// Data PDUs received with the ECN flag set.
    pub ecn_marked: u64,
    /// Acks accepted that echoed congestion marks.
    pub ecn_echoed: u64,
    /// Congestion window in PDUs (0 without congestion control).
    pub cwnd: u64,
    /// Congestion-window reductions for marks.
    pub ecn_reductions: u64,
    /// Congestion-window reductions for losses and timeouts.
    pub loss_reductions: u64,
    /// Losses taken as damage rather than congestion (the path marks).
    pub losses_ignored: u64,
    /// Times the connection failed.
    pub failures: u64,
    /// Smoothed RTT, once measured.
    pub srtt: Option<Duration>,
    /// RTT variation.
    pub rttvar: Duration,
    /// Current retransmission timeout (zero without rtx).
    pub rto: Duration,
}

impl Stats {
    /// The counters by name, for listings (durations in microseconds).
    pub fn to_map(&self) -> BTreeMap<String, u64> {
        [
            ("pdus_sent", self.pdus_sent),
            ("pdus_retransmitted", self.pdus_retransmitted),
            ("pdus_received", self.pdus_received),
            ("duplicates", self.duplicates),
            ("delivered", self.delivered),
            ("dropped_queue", self.dropped_queue),
            ("dropped_no_run", self.dropped_no_run),
            ("out_of_window", self.out_of_window),
            ("held_no_run", self.held_no_run),
            ("dropped_reset", self.dropped_reset),
            ("skipped", self.skipped),
            ("holes", self.holes),
            ("gap_exceeded", self.gap_exceeded),
            ("runs_started", self.runs_started),
            ("runs_sent", self.runs_sent),
            ("inactivity_resets", self.inactivity_resets),
            ("would_block", self.would_block),
            ("acks_sent", self.acks_sent),
            ("acks_received", self.acks_received),
            ("fc_sent", self.fc_sent),
            ("fc_received", self.fc_received),
            ("rendezvous_sent", self.rendezvous_sent),
            ("rendezvous_received", self.rendezvous_received),
            ("ctrl_stale", self.ctrl_stale),
            ("ctrl_invalid", self.ctrl_invalid),
            ("rto_expirations", self.rto_expirations),
            ("fast_retransmits", self.fast_retransmits),
            ("nacks_sent", self.nacks_sent),
            ("nacks_received", self.nacks_received),
            ("ecn_marked", self.ecn_marked),
            ("ecn_echoed", self.ecn_echoed),
            ("cwnd", self.cwnd),
            ("ecn_reductions", self.ecn_reductions),
            ("loss_reductions", self.loss_reductions),
            ("losses_ignored", self.losses_ignored),
            ("failures", self.failures),
            ("srtt_us", self.srtt.map_or(0, |d| d.as_micros() as u64)),
            ("rttvar_us", self.rttvar.as_micros() as u64),
            ("rto_us", self.rto.as_micros() as u64),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// Widens a sequence number received in `bits` bits (1..=64) to the u64
/// nearest to `reference` (e.g. the LWE, or the next seq to send) with those
/// low bits — serial-number arithmetic for narrow PCI fields.
pub fn widen_seq(reference: u64, wire: u64, bits: u32) -> u64 {
    if bits >= 64 {
        return wire;
    }
    let modulus = 1u64 << bits;
    let mask = modulus - 1;
    let wire = wire & mask;
    let base = reference & !mask;
    let candidate = base | wire;
    let half = modulus / 2;
    if candidate > reference && candidate - reference > half && candidate >= modulus {
        candidate - modulus
    } else if candidate < reference && reference - candidate > half {
        candidate.checked_add(modulus).unwrap_or(candidate)
    } else {
        candidate
    }
}

/// One EFCP connection endpoint (sending and receiving halves).
#[derive(Debug)]
pub struct Connection {
    cfg: EfcpConfig,
    snd: Sender,
    rcv: Receiver,
    stats: Stats,
    ctrl_seq_out: u64,
    last_ctrl_in: u64,
    ack_now: bool,
    ack_deadline: Option<Instant>,
    unacked_in_order: u32,
    fc_now: bool,
    fc_deadline: Option<Instant>,
    last_adv_rwe: u64,
    /// Whether the last data PDU taken was marked (DCTCP's receiver state).
    ce_state: bool,
    /// The last data PDU taken, named by the next ack.
    last_rx_seq: u64,
    /// Control PDUs built ahead of the ordinary ack (an ack closing a run
    /// of PDUs of one congestion state), sent first.
    ctrl_out: VecDeque<(Pdu, PduMeta)>,
    /// Missing sequence numbers to nack.
    nacks: VecDeque<u64>,
    /// No DTCP policy at all (retransmission, window, rate, congestion
    /// control): data PDUs may take [`Connection::send_direct`] and
    /// [`Connection::take_in_order`].
    plain: bool,
}

/// Most missing sequence numbers waiting to be nacked.
const MAX_PENDING_NACKS: usize = 256;

impl Connection {
    /// A connection whose first data PDU will carry sequence number 1.
    ///
    /// The peer is taken to start at 1 as well (this stack's convention), so
    /// the receive window rules hold from the first PDU.
    pub fn new(cfg: EfcpConfig, now: Instant) -> Result<Self, EfcpError> {
        let mut c = Self::with_initial_seq(cfg, now, 1)?;
        c.expect_peer_initial_seq(1);
        Ok(c)
    }

    /// Declares the peer's first sequence number: until it is known (or a
    /// first data run ends), the first DRF PDU may start a run anywhere.
    pub fn expect_peer_initial_seq(&mut self, first: u64) {
        self.rcv.expect_first(first.max(1));
    }

    /// A connection whose first data PDU will carry `initial_seq` (≥ 1; 0 is
    /// taken as 1) — for an initial-sequence-number policy fed by a seeded
    /// random source.
    pub fn with_initial_seq(
        cfg: EfcpConfig,
        now: Instant,
        initial_seq: u64,
    ) -> Result<Self, EfcpError> {
        cfg.validate()?;
        let initial_seq = initial_seq.max(1);
        let mut c = Connection {
            snd: Sender::new(&cfg, now, initial_seq),
            rcv: Receiver::new(&cfg, now),
            stats: Stats::default(),
            ctrl_seq_out: 0,
            last_ctrl_in: 0,
            ack_now: false,
            ack_deadline: None,
            unacked_in_order: 0,
            fc_now: false,
            fc_deadline: None,
            last_adv_rwe: 0,
            ce_state: false,
            last_rx_seq: 0,
            ctrl_out: VecDeque::new(),
            nacks: VecDeque::new(),
            plain: cfg.rtx().is_none()
                && cfg.window().is_none()
                && cfg.rate().is_none()
                && cfg.cc().is_none(),
            cfg,
        };
        c.refresh_rtt_stats();
        Ok(c)
    }

    /// The configuration.
    pub fn config(&self) -> &EfcpConfig {
        &self.cfg
    }

    /// Counters and the RTT estimate.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Why the connection failed, if it did.
    pub fn failure(&self) -> Option<&EfcpError> {
        self.snd.failure()
    }

    /// Whether the connection failed.
    pub fn is_failed(&self) -> bool {
        self.snd.failure().is_some()
    }

    /// Whether [`Connection::write`] would accept an SDU now.
    pub fn can_write(&self) -> bool {
        self.snd.can_write()
    }

    /// How many fragments [`Connection::write`] would take now, so that a
    /// caller can write a fragmented SDU whole or not at all.
    pub fn write_capacity(&self) -> usize {
        self.snd.write_capacity()
    }

    /// SDUs written but not yet sent.
    pub fn send_queue_len(&self) -> usize {
        self.snd.queued()
    }

    /// PDUs sent and not yet acknowledged (with rtx).
    pub fn in_flight(&self) -> usize {
        self.snd.in_flight()
    }

    /// The sequence number the next new PDU will carry.
    pub fn next_seq(&self) -> u64 {
        self.snd.next_seq()
    }

    /// The right window edge the sender works with (window FC only).
    pub fn send_rwe(&self) -> Option<u64> {
        self.snd.snd_rwe()
    }

    /// The sequence number of the last data PDU numbered for sending,
    /// `None` before the first was sent: what a deallocation tells the
    /// peer to wait for.
    pub fn last_sent_seq(&self) -> Option<u64> {
        (self.stats.pdus_sent > 0).then(|| self.snd.next_seq().wrapping_sub(1))
    }

    /// Whether the receiver has taken every data PDU up to `seq`
    /// (delivered it, or given up on it): its LWE, or the floor an ended
    /// run left, is at or above `seq`.
    pub fn received_through(&self, seq: u64) -> bool {
        self.rcv.base().is_some_and(|b| b >= seq)
    }

    /// The receiver's LWE, while a data run is live.
    pub fn receive_lwe(&self) -> Option<u64> {
        self.rcv.lwe()
    }

    /// PDUs occupying the receiver buffer: out of order, ready, and
    /// delivered but not consumed (the last only with window FC).
    pub fn receiver_buffered(&self) -> usize {
        self.rcv.buffered()
    }

    /// PDUs ready for [`Connection::poll_deliver`].
    pub fn deliverable(&self) -> usize {
        self.rcv.ready_len()
    }

    /// Delivered SDUs not yet reported as consumed.
    pub fn unconsumed(&self) -> usize {
        self.rcv.unconsumed()
    }

    /// Queues an SDU fragment for sending.
    pub fn write(&mut self, _now: Instant, payload: impl Into<PduBuf>) -> Result<(), EfcpError> {
        self.snd.write(payload.into(), &mut self.stats)
    }

    /// The short way out for a connection without DTCP policies: with
    /// nothing queued, numbers a data PDU that the caller sends at once,
    /// instead of [`Connection::write`] and [`Connection::poll_transmit`]
    /// (which would number it the same). `None`, nothing changed, when the
    /// connection has DTCP policies, failed, or has anything queued: the
    /// caller writes the PDU the ordinary way.
    pub fn send_direct(&mut self, now: Instant) -> Option<(u64, bool)> {
        if !self.plain {
            return None;
        }
        self.snd.number_direct(now, &mut self.stats)
    }

    /// The short way in for a connection without DTCP policies: takes
    /// data PDU `seq` if it is the next of the live run with nothing held
    /// above it or waiting to be delivered, and counts it delivered; the
    /// caller hands its payload over at once, as if from
    /// [`Connection::poll_deliver`]. False, nothing changed, otherwise:
    /// the caller gives the PDU to [`Connection::on_pdu_meta`].
    pub fn take_in_order(&mut self, now: Instant, seq: u64, ecn: bool) -> bool {
        if !self.plain || !self.rcv.take_next(now, seq, &mut self.stats) {
            return false;
        }
        // What `on_data` does besides the receiver, without DTCP.
        self.stats.ecn_marked += u64::from(ecn);
        self.ce_state = ecn;
        self.last_rx_seq = seq;
        true
    }

    /// The reference to widen received sequence numbers against: the LWE
    /// of the live run, else the last one reached.
    pub fn receive_reference(&self) -> u64 {
        self.rcv.base().unwrap_or(0)
    }

    /// A PDU as read from a wire whose sequence-number fields are
    /// `seq_bits` wide and whose control sequence number is `ctrl_bits`
    /// wide (1..=64 each), its numbers widened to the values this end
    /// works with ([`widen_seq`]): a data PDU's sequence number and a
    /// rendezvous' next one against [`Connection::receive_reference`];
    /// acked, nacked and echoed numbers and window edges against
    /// [`Connection::next_seq`]; the control sequence number against the
    /// last one taken from the peer, so that it keeps counting up after
    /// its field wraps.
    pub fn widen(
        &self,
        pdu: Pdu,
        mut meta: PduMeta,
        seq_bits: u32,
        ctrl_bits: u32,
    ) -> (Pdu, PduMeta) {
        let rx = self.receive_reference();
        let tx = |v| widen_seq(self.snd.next_seq(), v, seq_bits);
        let c = |v| widen_seq(self.last_ctrl_in, v, ctrl_bits);
        meta.echo = meta.echo.map(tx);
        let pdu = pdu.map_numbers(|v| widen_seq(rx, v, seq_bits), tx, c);
        (pdu, meta)
    }

    /// The highest sequence number the peer may have sent by the window
    /// rules, above [`Connection::receive_reference`]:
    ///
    /// * window flow control: the highest right window edge this end
    ///   advertised (or the initial credit above the base);
    /// * retransmission without window: `max_reorder + 1` past the LWE
    ///   (such a sender keeps no more unacknowledged);
    /// * neither: [`MAX_UNRELIABLE_JUMP`] past it (the sender is bound by
    ///   nothing; a flow that lost more resynchronises after 2Δ).
    fn rx_ceiling(&self) -> u64 {
        let base = self.rcv.base().unwrap_or(0);
        if let Some(w) = self.cfg.window() {
            self.last_adv_rwe.max(base.saturating_add(w.initial_credit))
        } else if self.cfg.rtx().is_some() {
            base.saturating_add(self.cfg.max_reorder as u64 + 1)
        } else {
            base.saturating_add(MAX_UNRELIABLE_JUMP)
        }
    }

    /// Processes a PDU of this connection received from the peer.
    ///
    /// Nothing here trusts the peer: data outside the receive window,
    /// replays of earlier runs, and control PDUs acknowledging what was
    /// never sent or granting credit no receiver could are counted
    /// ([`Stats::out_of_window`], [`Stats::duplicates`],
    /// [`Stats::ctrl_invalid`]) and change nothing.
    pub fn on_pdu(&mut self, now: Instant, pdu: Pdu) {
        self.on_pdu_meta(now, pdu, PduMeta::default());
    }

    /// [`Connection::on_pdu`] with what the PCI carried besides the PDU's
    /// fields (the ECN flag, the PDU an ack names).
    pub fn on_pdu_meta(&mut self, now: Instant, pdu: Pdu, meta: PduMeta) {
        let ece = meta.ecn;
        match pdu {
            Pdu::Data { seq, drf, payload } => self.on_data(now, seq, drf, payload, meta.ecn),
            Pdu::Ack { ctrl_seq, ack_sn } => {
                if !self.snd.valid_ack(ack_sn) {
                    self.stats.ctrl_invalid += 1;
                } else {
                    let fresh = self.fresh(ctrl_seq);
                    self.stats.acks_received += u64::from(fresh);
                    self.stats.ecn_echoed += u64::from(fresh && ece);
                    self.snd
                        .on_ack(now, ack_sn, false, fresh, ece, meta.echo, &mut self.stats);
                }
            }
            Pdu::Nack { ctrl_seq, nack_sn } => {
                if !self.snd.valid_nack(nack_sn) {
                    self.stats.ctrl_invalid += 1;
                } else if self.fresh(ctrl_seq) {
                    self.stats.nacks_received += 1;
                    self.snd.on_nack(now, nack_sn, &mut self.stats);
                }
            }
            Pdu::Fc {
                ctrl_seq,
                new_rwe,
                rate,
                frame_ms,
            } => {
                if !self.snd.valid_rwe(new_rwe) {
                    self.stats.ctrl_invalid += 1;
                } else {
                    let fresh = self.fresh(ctrl_seq);
                    self.stats.fc_received += u64::from(fresh);
                    self.snd.on_fc(new_rwe, rate, frame_ms, fresh);
                }
            }
            Pdu::AckFc {
                ctrl_seq,
                ack_sn,
                new_rwe,
                rate,
                frame_ms,
            } => {
                if !self.snd.valid_ack(ack_sn) || !self.snd.valid_rwe(new_rwe) {
                    self.stats.ctrl_invalid += 1;
                } else {
                    let fresh = self.fresh(ctrl_seq);
                    self.stats.acks_received += u64::from(fresh);
                    self.stats.fc_received += u64::from(fresh);
                    self.stats.ecn_echoed += u64::from(fresh && ece);
                    let grew = self.snd.on_fc(new_rwe, rate, frame_ms, fresh);
                    self.snd
                        .on_ack(now, ack_sn, grew, fresh, ece, meta.echo, &mut self.stats);
                }
            }
            Pdu::Rendezvous { ctrl_seq, next_seq } => {
                let ceiling = self.rx_ceiling();
                // Answered whether fresh or not (the answer is idempotent
                // and at most one is pending), so a poisoned control
                // sequence number cannot silence the receiver.
                let fresh = self.fresh(ctrl_seq);
                self.stats.rendezvous_received += u64::from(fresh);
                if self
                    .rcv
                    .on_rendezvous(now, next_seq, ceiling, &mut self.stats)
                {
                    self.fc_now = self.cfg.window().is_some();
                    self.ack_now = self.cfg.rtx().is_some();
                }
            }
        }
        self.refresh_rtt_stats();
    }

    fn on_data(&mut self, now: Instant, seq: u64, drf: bool, payload: PduBuf, ecn: bool) {
        let had_run = self.rcv.lwe().is_some();
        let ceiling = self.rx_ceiling();
        self.stats.ecn_marked += u64::from(ecn);
        let cc = self.cfg.cc().is_some();
        if cc && ecn != self.ce_state && self.unacked_in_order > 0 {
            // DCTCP's receiver: the PDUs acked so far had the other
            // congestion state; say so in an ack of their own.
            if let Some(ack) = self.build_ack() {
                self.ctrl_out.push_back(ack);
            }
        }
        let known = self.rcv.edge().max(self.rcv.lwe().unwrap_or(0));
        let outcome = self
            .rcv
            .on_data(now, seq, drf, payload, ceiling, &mut self.stats);
        if !matches!(
            outcome,
            RxOutcome::OutOfWindow | RxOutcome::DroppedNoRun | RxOutcome::DroppedQueue
        ) {
            self.ce_state = ecn;
            self.last_rx_seq = seq;
        }
        if cc && outcome == RxOutcome::OutOfOrder {
            let lwe = self.rcv.lwe().unwrap_or(0);
            for missing in known.max(lwe) + 1..seq {
                if self.nacks.len() >= MAX_PENDING_NACKS {
                    break;
                }
                self.nacks.push_back(missing);
            }
        }
        if !had_run && self.rcv.lwe().is_some() && self.last_adv_rwe == 0 {
            // The sender starts with the initial credit.
            if let (Some(w), Some(lwe)) = (self.cfg.window(), self.rcv.lwe()) {
                self.last_adv_rwe = lwe.min(seq - 1).saturating_add(w.initial_credit);
            }
        }
        if self.cfg.rtx().is_some() {
            self.ack_policy(now, outcome);
        }
        self.window_policy(now);
    }

    /// Whether a control PDU is newer than the last one taken. A stale one
    /// still counts for its cumulative fields (an ack that advances, a
    /// window that grows), not for duplicate acks or rates. A control
    /// sequence number more than [`MAX_CTRL_SEQ_JUMP`] ahead is treated as
    /// stale and counted as invalid, so one forged PDU cannot make every
    /// later genuine one stale.
    fn fresh(&mut self, ctrl_seq: u64) -> bool {
        if ctrl_seq <= self.last_ctrl_in {
            self.stats.ctrl_stale += 1;
            return false;
        }
        if ctrl_seq - self.last_ctrl_in > MAX_CTRL_SEQ_JUMP {
            self.stats.ctrl_invalid += 1;
            return false;
        }
        self.last_ctrl_in = ctrl_seq;
        true
    }

    fn ack_policy(&mut self, now: Instant, outcome: RxOutcome) {
        match outcome {
            RxOutcome::InOrder => {
                self.unacked_in_order += 1;
                let every = self.cfg.rtx().map_or(0, |r| r.ack_every);
                if (every > 0 && self.unacked_in_order >= every) || self.cfg.a_timer.is_zero() {
                    self.ack_now = true;
                } else if self.ack_deadline.is_none() {
                    self.ack_deadline = Some(now + self.cfg.a_timer);
                }
            }
            RxOutcome::FilledHole
            | RxOutcome::OutOfOrder
            | RxOutcome::Duplicate
            | RxOutcome::DroppedQueue => self.ack_now = true,
            // Nothing to tell a sender that did not send it.
            RxOutcome::DroppedNoRun | RxOutcome::HeldNoRun | RxOutcome::OutOfWindow => {}
        }
    }

    fn window_policy(&mut self, now: Instant) {
        let Some(w) = self.cfg.window() else {
            return;
        };
        let Some(rwe) = self.rcv.rwe(w.receiver_buffer) else {
            return;
        };
        if rwe <= self.last_adv_rwe {
            return;
        }
        let threshold = (w.receiver_buffer as u64 / 4).max(1);
        if rwe - self.last_adv_rwe >= threshold || self.cfg.a_timer.is_zero() {
            self.fc_now = true;
        } else if self.fc_deadline.is_none() {
            self.fc_deadline = Some(now + self.cfg.a_timer);
        }
    }

    /// Hands over the next SDU fragment for the application, if any.
    pub fn poll_deliver(&mut self) -> Option<Delivery> {
        self.rcv.poll_deliver(&mut self.stats)
    }

    /// The application consumed `n` delivered SDU fragments: their buffer
    /// space is free again (window flow control grants it as credit).
    pub fn consumed(&mut self, now: Instant, n: usize) {
        self.rcv.consumed(n);
        self.window_policy(now);
    }

    /// The next PDU to send, if any: control PDUs first, then
    /// retransmissions, then new data as window and rate allow.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<Pdu> {
        self.poll_transmit_meta(now).map(|(p, _)| p)
    }

    /// [`Connection::poll_transmit`] with what the PCI must carry besides
    /// the PDU's fields (ECN echo, the PDU an ack names).
    pub fn poll_transmit_meta(&mut self, now: Instant) -> Option<(Pdu, PduMeta)> {
        if let Some(out) = self.ctrl_out.pop_front() {
            return Some(out);
        }
        let ack_due = self.ack_now || self.ack_deadline.is_some_and(|d| now >= d);
        let fc_due = self.fc_now || self.fc_deadline.is_some_and(|d| now >= d);
        if ack_due || fc_due {
            if let Some(out) = self.build_ack() {
                return Some(out);
            }
        }
        if let Some(nack) = self.poll_nack() {
            return Some((nack, PduMeta::default()));
        }
        if let Some(next_seq) = self.snd.take_rendezvous() {
            self.ctrl_seq_out += 1;
            return Some((
                Pdu::Rendezvous {
                    ctrl_seq: self.ctrl_seq_out,
                    next_seq,
                },
                PduMeta::default(),
            ));
        }
        self.snd
            .poll_data(now, &mut self.stats)
            .map(|p| (p, PduMeta::default()))
    }

    fn poll_nack(&mut self) -> Option<Pdu> {
        let lwe = self.rcv.lwe()?;
        while let Some(nack_sn) = self.nacks.pop_front() {
            if nack_sn > lwe {
                self.ctrl_seq_out += 1;
                self.stats.nacks_sent += 1;
                return Some(Pdu::Nack {
                    ctrl_seq: self.ctrl_seq_out,
                    nack_sn,
                });
            }
        }
        None
    }

    /// Builds the ack and/or window update due now (clearing what made it
    /// due), with the ECN echo and the PDU it names.
    fn build_ack(&mut self) -> Option<(Pdu, PduMeta)> {
        let meta = PduMeta {
            ecn: self.ce_state && self.cfg.cc().is_some(),
            echo: (self.last_rx_seq > 0).then_some(self.last_rx_seq),
        };
        let lwe = self.rcv.lwe();
        let rwe = self
            .cfg
            .window()
            .and_then(|w| self.rcv.rwe(w.receiver_buffer));
        let rtx = self.cfg.rtx().is_some();
        self.ack_now = false;
        self.fc_now = false;
        self.ack_deadline = None;
        self.fc_deadline = None;
        self.unacked_in_order = 0;
        let lwe = lwe?;
        let (rate, frame_ms) = match self.cfg.rate() {
            Some(r) => (
                r.pdus_per_frame,
                r.frame.as_nanos().div_ceil(1_000_000) as u64,
            ),
            None => (0, 0),
        };
        self.ctrl_seq_out += 1;
        let ctrl_seq = self.ctrl_seq_out;
        match (rtx, rwe) {
            (true, Some(rwe)) => {
                self.last_adv_rwe = self.last_adv_rwe.max(rwe);
                self.stats.acks_sent += 1;
                self.stats.fc_sent += 1;
                Some(Pdu::AckFc {
                    ctrl_seq,
                    ack_sn: lwe,
                    new_rwe: rwe,
                    rate,
                    frame_ms,
                })
            }
            (true, None) => {
                self.stats.acks_sent += 1;
                Some(Pdu::Ack {
                    ctrl_seq,
                    ack_sn: lwe,
                })
            }
            (false, Some(rwe)) => {
                self.last_adv_rwe = self.last_adv_rwe.max(rwe);
                self.stats.fc_sent += 1;
                Some(Pdu::Fc {
                    ctrl_seq,
                    new_rwe: rwe,
                    rate,
                    frame_ms,
                })
            }
            (false, None) => {
                self.ctrl_seq_out -= 1;
                None
            }
        }
        .map(|p| (p, meta))
    }

    /// When [`Connection::handle_timeout`] next needs to run, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.snd.poll_timeout(),
            self.rcv.hole_deadline(),
            self.rcv.inactivity_deadline(),
            self.ack_deadline,
            self.fc_deadline,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Runs the timers that are due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.snd.handle_timeout(now, &mut self.stats);
        if self.rcv.check_inactivity(now, &mut self.stats) {
            self.ack_deadline = None;
            self.fc_deadline = None;
            self.ack_now = false;
            self.fc_now = false;
        }
        if self.rcv.on_hole_timeout(now, &mut self.stats) {
            if self.cfg.rtx().is_some() {
                self.ack_now = true;
            }
            self.window_policy(now);
        }
        if self.ack_deadline.is_some_and(|d| now >= d) {
            self.ack_deadline = None;
            self.ack_now = true;
        }
        if self.fc_deadline.is_some_and(|d| now >= d) {
            self.fc_deadline = None;
            self.fc_now = true;
        }
        self.refresh_rtt_stats();
    }

    fn refresh_rtt_stats(&mut self) {
        if self.cfg.rtx().is_some() {
            let rtt = self.snd.rtt();
            self.stats.srtt = rtt.srtt();
            self.stats.rttvar = rtt.rttvar();
            self.stats.rto = rtt.rto();
        }
        if let Some(c) = self.snd.cc_state() {
            self.stats.cwnd = c.cwnd.floor() as u64;
            self.stats.ecn_reductions = c.ecn_reductions;
            self.stats.loss_reductions = c.loss_reductions;
            self.stats.losses_ignored = c.losses_ignored;
        }
    }

    /// The congestion controller's state, with congestion control.
    pub fn congestion(&self) -> Option<&CcState> {
        self.snd.cc_state()
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod direct_tests;

#[cfg(test)]
mod stress_tests;

#[cfg(test)]
mod peer_tests;
