//! Configuration of an EFCP connection: the policies of one QoS cube.
//!
//! Every combination is valid as long as [`EfcpConfig::validate`] accepts it:
//! plain unreliable (no DTCP), flow control without retransmission (window,
//! rate or both), retransmission without flow control, and everything at once.

use super::cc::CcConfig;
use std::time::Duration;
use thiserror::Error;

/// The policies of one EFCP connection (both ends use the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EfcpConfig {
    /// Deliver SDUs in sequence order. When false, every new PDU is delivered
    /// the moment it arrives.
    pub in_order: bool,
    /// Largest run of consecutive lost PDUs the flow tolerates.
    ///
    /// The receiver keeps a left window edge (LWE): every sequence number up
    /// to it was received or given up. A *hole* is a run of missing sequence
    /// numbers right after the LWE, followed by something known to exist (a
    /// later PDU, or the sender's next sequence number from a rendezvous).
    /// A hole is never given up before the receiver has waited
    /// [`EfcpConfig::a_timer`] since the PDU behind it arrived, so plain
    /// reordering is not turned into loss. After that wait:
    ///
    /// * `None` — any hole is given up.
    /// * `Some(0)` — no hole is ever given up: delivery waits for the
    ///   retransmission (so this needs [`DtcpConfig::rtx`]).
    /// * `Some(n)` — a hole of at most `n` PDUs is given up. With
    ///   retransmission, a larger hole waits for it (partial reliability:
    ///   only long bursts are repaired). Without retransmission a larger
    ///   hole can never be filled, so it is given up too — delivery never
    ///   blocks — and counted in [`super::Stats::gap_exceeded`]: the QoS
    ///   promise was broken and the IPCP can report it.
    ///
    /// `in_order == false` only changes *when* PDUs are delivered (at once);
    /// the hole rules still decide when the LWE (and so the cumulative ack
    /// and the window) moves past missing PDUs.
    pub max_sdu_gap: Option<u64>,
    /// MPL: the longest a PDU can live in the DIF below.
    pub max_pdu_lifetime: Duration,
    /// Most PDUs the receiver holds out of order: a PDU more than
    /// `max_reorder + 1` past the LWE is dropped (with retransmission) or
    /// forces the oldest holes to be given up (without). Without window flow
    /// control, a retransmitting sender keeps at most `max_reorder + 1` PDUs
    /// unacknowledged, so it never sends what the receiver would drop.
    pub max_reorder: usize,
    /// A: the longest the receiver waits before acting — sending a delayed
    /// ack or a flow-control update, or giving up a hole. (IRATI keeps this
    /// `initialATimer` in the DTP configuration; it is needed without
    /// retransmission too, so it lives here rather than in [`RtxConfig`].)
    pub a_timer: Duration,
    /// Most SDUs written but not yet sent when there is no window flow
    /// control (with it, [`WindowFc::max_closed_queue`] applies).
    pub max_send_queue: usize,
    /// Data transfer control; `None` for a plain unreliable flow.
    pub dtcp: Option<DtcpConfig>,
}

/// Data transfer control: flow control and retransmission control.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DtcpConfig {
    /// Window (credit) flow control.
    pub window: Option<WindowFc>,
    /// Rate-based flow control.
    pub rate: Option<RateFc>,
    /// Retransmission control.
    pub rtx: Option<RtxConfig>,
    /// Congestion control (with retransmission only: it reacts to acks).
    pub cc: Option<CcConfig>,
}

/// Window flow control: the receiver advertises a right window edge (RWE),
/// the highest sequence number the sender may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowFc {
    /// PDUs the sender may send before the first window update.
    pub initial_credit: u64,
    /// SDUs a writer may queue beyond the open window before `write`
    /// answers [`super::EfcpError::WouldBlock`].
    pub max_closed_queue: usize,
    /// Receiver buffer in PDUs: out-of-order PDUs, PDUs ready for
    /// delivery, and PDUs delivered but not yet [consumed]. The RWE granted
    /// is such that this never overflows.
    ///
    /// [consumed]: super::Connection::consumed
    pub receiver_buffer: usize,
}

/// Rate-based flow control: at most `pdus_per_frame` data PDUs (new and
/// retransmitted) per `frame`, frames aligned on the connection's creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateFc {
    /// PDUs per frame.
    pub pdus_per_frame: u64,
    /// Length of a frame.
    pub frame: Duration,
}

/// Retransmission control with cumulative acks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtxConfig {
    /// RTO before any RTT sample.
    pub initial_rto: Duration,
    /// Lower bound of the RTO.
    pub min_rto: Duration,
    /// Upper bound of the RTO, including exponential back-off.
    pub max_rto: Duration,
    /// Retransmissions of one PDU before the connection fails.
    pub max_retries: u32,
    /// Ack at once after this many new in-order PDUs (0: only the A-timer
    /// triggers delayed acks).
    pub ack_every: u32,
}

/// Why a configuration is unusable.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// `max_sdu_gap == Some(0)` without retransmission would block forever.
    #[error("max_sdu_gap = 0 (no loss) needs retransmission control")]
    NoLossWithoutRtx,
    /// The receiver buffer of window flow control is zero.
    #[error("window flow control needs a receiver buffer of at least one PDU")]
    ZeroReceiverBuffer,
    /// The initial credit is zero or larger than the receiver buffer.
    #[error("initial credit {credit} must be between 1 and the receiver buffer ({buffer})")]
    BadInitialCredit {
        /// The configured credit.
        credit: u64,
        /// The configured receiver buffer.
        buffer: usize,
    },
    /// Rate flow control with no PDUs per frame or a zero frame.
    #[error("rate flow control needs pdus_per_frame >= 1 and a non-zero frame")]
    BadRate,
    /// The RTO bounds are inconsistent.
    #[error("RTO bounds must satisfy 0 < min_rto <= initial_rto <= max_rto")]
    BadRto,
    /// Without window flow control, the send queue must hold something.
    #[error("max_send_queue must be at least 1")]
    ZeroSendQueue,
    /// Congestion control without retransmission, or windows out of order
    /// (1 <= min <= initial <= max) or a gain shift above 10.
    #[error("congestion control needs retransmission, 1 <= min_window <= initial_window <= max_window and gain_shift <= 10")]
    BadCc,
    /// The sequence-number fields of the wire are too narrow for the
    /// windows: a number received is widened to the nearest one with its
    /// low bits, so everything live at once must span less than half
    /// their range.
    #[error("{bits}-bit sequence numbers cannot carry {span} PDUs past the receiver's LWE (window plus reordering queue); at most {max}")]
    SeqFieldTooNarrow {
        /// The width of the fields, in bits.
        bits: u32,
        /// Sequence numbers that may be live past the LWE.
        span: u64,
        /// The most the width carries.
        max: u64,
    },
    /// A parameter is outside the range it may take.
    #[error("`{key}` must be between {min} and {max}, not {value}")]
    OutOfRange {
        /// The parameter's name, as written in configurations.
        key: &'static str,
        /// Its smallest value.
        min: u64,
        /// Its largest value.
        max: u64,
        /// The value given.
        value: u64,
    },
}

/// Default MPL (IRATI's and rlite's kernel default).
pub const DEFAULT_MPL: Duration = Duration::from_millis(1000);
/// Default A-timer.
pub const DEFAULT_A_TIMER: Duration = Duration::from_millis(20);

impl EfcpConfig {
    /// A plain unreliable flow: no DTCP, delivery on arrival, any gap.
    pub fn unreliable() -> Self {
        EfcpConfig {
            in_order: false,
            max_sdu_gap: None,
            max_pdu_lifetime: DEFAULT_MPL,
            max_reorder: 64,
            a_timer: DEFAULT_A_TIMER,
            max_send_queue: 256,
            dtcp: None,
        }
    }

    /// A reliable in-order flow with window flow control and retransmission.
    pub fn reliable() -> Self {
        EfcpConfig {
            in_order: true,
            max_sdu_gap: Some(0),
            max_pdu_lifetime: DEFAULT_MPL,
            max_reorder: 256,
            a_timer: DEFAULT_A_TIMER,
            max_send_queue: 256,
            dtcp: Some(DtcpConfig {
                window: Some(WindowFc {
                    initial_credit: 64,
                    max_closed_queue: 64,
                    receiver_buffer: 256,
                }),
                rate: None,
                rtx: Some(RtxConfig::default()),
                cc: Some(CcConfig::default()),
            }),
        }
    }

    /// Window flow control without retransmission: the receiver's pace
    /// holds the writer back (its `write` answers `WouldBlock` while the
    /// window is closed), nothing is resent, in-order delivery, and a hole
    /// (a PDU the DIF below lost) is given up after the A-timer. For DIFs
    /// over lower layers that do not lose on their own (shim-hv between
    /// VMs, seed 001 Fig. 4(b)), where the only loss would be overrun.
    pub fn flow_controlled() -> Self {
        EfcpConfig {
            in_order: true,
            max_sdu_gap: None,
            max_pdu_lifetime: DEFAULT_MPL,
            max_reorder: 256,
            a_timer: DEFAULT_A_TIMER,
            max_send_queue: 256,
            dtcp: Some(DtcpConfig {
                window: Some(WindowFc {
                    initial_credit: 64,
                    max_closed_queue: 64,
                    receiver_buffer: 256,
                }),
                rate: None,
                rtx: None,
                cc: None,
            }),
        }
    }

    /// Retransmission control, if configured.
    pub fn rtx(&self) -> Option<&RtxConfig> {
        self.dtcp.as_ref().and_then(|d| d.rtx.as_ref())
    }

    /// Window flow control, if configured.
    pub fn window(&self) -> Option<&WindowFc> {
        self.dtcp.as_ref().and_then(|d| d.window.as_ref())
    }

    /// Congestion control, if configured (and retransmission with it).
    pub fn cc(&self) -> Option<&CcConfig> {
        self.dtcp.as_ref().and_then(|d| d.cc.as_ref())
    }

    /// Rate flow control, if configured.
    pub fn rate(&self) -> Option<&RateFc> {
        self.dtcp.as_ref().and_then(|d| d.rate.as_ref())
    }

    /// R: the longest the sender keeps retransmitting one PDU, bounded by
    /// `(max_retries + 1) * max_rto` (zero without retransmission).
    pub fn max_rtx_time(&self) -> Duration {
        self.rtx()
            .map(|r| r.max_rto.saturating_mul(r.max_retries.saturating_add(1)))
            .unwrap_or(Duration::ZERO)
    }

    /// Δ = MPL + R + A, the unit of the delta-t inactivity timers.
    pub fn delta_t(&self) -> Duration {
        self.max_pdu_lifetime
            .saturating_add(self.max_rtx_time())
            .saturating_add(self.a_timer)
    }

    /// How many sequence numbers past the receiver's LWE may be live at
    /// once (sent, or arriving as retransmissions or duplicates): the
    /// window granted (at most the receiver buffer or the initial credit)
    /// and the reordering queue. `None` for a flow without window or
    /// retransmission, whose sender is bound by nothing.
    pub fn seq_span(&self) -> Option<u64> {
        let queue = self.max_reorder as u64 + 1;
        match (self.window(), self.rtx()) {
            (Some(w), _) => Some((w.receiver_buffer as u64).max(w.initial_credit) + queue),
            (None, Some(_)) => Some(queue),
            (None, None) => None,
        }
    }

    /// Checks that sequence-number fields of `bits` bits (the DIF's data
    /// transfer constants) can carry the flow: its [`EfcpConfig::seq_span`]
    /// must be below half their range, or numbers widened on arrival would
    /// be taken for others.
    pub fn check_seq_width(&self, bits: u32) -> Result<(), ConfigError> {
        let Some(span) = self.seq_span() else {
            return Ok(());
        };
        if bits >= 64 {
            return Ok(());
        }
        let max = (1u64 << bits.saturating_sub(1)).saturating_sub(1);
        if span > max {
            return Err(ConfigError::SeqFieldTooNarrow { bits, span, max });
        }
        Ok(())
    }

    /// Checks that the policies can work together.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_sdu_gap == Some(0) && self.rtx().is_none() {
            return Err(ConfigError::NoLossWithoutRtx);
        }
        if let Some(w) = self.window() {
            if w.receiver_buffer == 0 {
                return Err(ConfigError::ZeroReceiverBuffer);
            }
            if w.initial_credit == 0 || w.initial_credit > w.receiver_buffer as u64 {
                return Err(ConfigError::BadInitialCredit {
                    credit: w.initial_credit,
                    buffer: w.receiver_buffer,
                });
            }
        } else if self.max_send_queue == 0 {
            return Err(ConfigError::ZeroSendQueue);
        }
        if let Some(r) = self.rate() {
            if r.pdus_per_frame == 0 || r.frame.is_zero() {
                return Err(ConfigError::BadRate);
            }
        }
        if let Some(c) = self.cc() {
            if self.rtx().is_none() || !c.valid() {
                return Err(ConfigError::BadCc);
            }
        }
        if let Some(r) = self.rtx() {
            if r.min_rto.is_zero() || r.min_rto > r.initial_rto || r.initial_rto > r.max_rto {
                return Err(ConfigError::BadRto);
            }
        }
        Ok(())
    }
}

impl Default for EfcpConfig {
    fn default() -> Self {
        EfcpConfig::unreliable()
    }
}

impl Default for RtxConfig {
    /// RFC 6298's initial RTO of 1 s, 10 ms .. 60 s, 10 retries, ack every 2.
    fn default() -> Self {
        RtxConfig {
            initial_rto: Duration::from_secs(1),
            min_rto: Duration::from_millis(10),
            max_rto: Duration::from_secs(60),
            max_retries: 10,
            ack_every: 2,
        }
    }
}

/// Congestion-control policy by name, as configuration files write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CcName {
    /// [`super::CcPolicy::Dctcp`].
    Dctcp,
    /// [`super::CcPolicy::Aimd`].
    Aimd,
    /// No congestion control (window flow control only).
    None,
}

/// The EFCP policies and parameters of a QoS cube that a configuration file
/// may set (`[ipcp.qos_cube.efcp]` in rinad, `efcp = { .. }` of a cube in
/// rina-lab). Every field is optional; what is left out keeps the cube's
/// default ([`EfcpConfig::reliable`] and friends). Times in milliseconds.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EfcpTuning {
    /// A-timer: longest delay of an ack or window update.
    pub a_timer_ms: Option<u64>,
    /// Largest hole given up (0: none, reliable).
    pub max_sdu_gap: Option<u64>,
    /// Receiver buffer in PDUs (the window it grants).
    pub window: Option<usize>,
    /// PDUs the sender may send before the first window update.
    pub initial_credit: Option<u64>,
    /// RTO before any RTT sample.
    pub initial_rto_ms: Option<u64>,
    /// Lower bound of the RTO.
    pub min_rto_ms: Option<u64>,
    /// Upper bound of the RTO (back-off included).
    pub max_rto_ms: Option<u64>,
    /// Retransmissions of one PDU before the flow fails.
    pub max_retries: Option<u32>,
    /// Ack after this many in-order PDUs.
    pub ack_every: Option<u32>,
    /// Congestion-control policy (with retransmission only).
    pub congestion_control: Option<CcName>,
    /// Initial congestion window, in PDUs.
    pub initial_window: Option<u64>,
    /// Smallest congestion window, in PDUs.
    pub min_window: Option<u64>,
    /// Largest congestion window, in PDUs.
    pub max_window: Option<u64>,
    /// DCTCP gain g = 2^-gain_shift.
    pub gain_shift: Option<u32>,
    /// Rate-based flow control (DTCP's [`RateFc`], on cubes with DTCP):
    /// at most this many data PDUs per `rate_frame_ms`; 0 turns it off.
    pub rate_pdus: Option<u64>,
    /// The frame of rate-based flow control (default 10 ms).
    pub rate_frame_ms: Option<u64>,
}

/// `key=value` for every key set, in the order of the struct, as
/// `rinactl efcp IPCP CUBE key=value...` takes them.
impl std::fmt::Display for EfcpTuning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cc = self.congestion_control.map(|c| match c {
            CcName::Dctcp => "dctcp",
            CcName::Aimd => "aimd",
            CcName::None => "none",
        });
        let keys: [(&str, Option<String>); 16] = [
            ("a_timer_ms", self.a_timer_ms.map(|v| v.to_string())),
            ("max_sdu_gap", self.max_sdu_gap.map(|v| v.to_string())),
            ("window", self.window.map(|v| v.to_string())),
            ("initial_credit", self.initial_credit.map(|v| v.to_string())),
            ("initial_rto_ms", self.initial_rto_ms.map(|v| v.to_string())),
            ("min_rto_ms", self.min_rto_ms.map(|v| v.to_string())),
            ("max_rto_ms", self.max_rto_ms.map(|v| v.to_string())),
            ("max_retries", self.max_retries.map(|v| v.to_string())),
            ("ack_every", self.ack_every.map(|v| v.to_string())),
            ("congestion_control", cc.map(str::to_string)),
            ("initial_window", self.initial_window.map(|v| v.to_string())),
            ("min_window", self.min_window.map(|v| v.to_string())),
            ("max_window", self.max_window.map(|v| v.to_string())),
            ("gain_shift", self.gain_shift.map(|v| v.to_string())),
            ("rate_pdus", self.rate_pdus.map(|v| v.to_string())),
            ("rate_frame_ms", self.rate_frame_ms.map(|v| v.to_string())),
        ];
        let set = keys.iter().filter_map(|(k, v)| Some((k, v.as_ref()?)));
        for (i, (key, v)) in set.enumerate() {
            let sep = if i == 0 { "" } else { " " };
            write!(f, "{sep}{key}={v}")?;
        }
        Ok(())
    }
}

/// Largest window, credit or congestion window an EFCP tuning may ask
/// for, in PDUs (each PDU may be held in memory).
pub const MAX_WINDOW_PDUS: u64 = 1 << 20;
/// Largest time an EFCP tuning may give, in milliseconds (ten minutes).
pub const MAX_TUNING_MS: u64 = 600_000;

impl EfcpTuning {
    /// Checks every parameter given against its range, before any is
    /// applied; the error names the first one out of range.
    pub fn check_ranges(&self) -> Result<(), ConfigError> {
        let check = |key: &'static str, v: Option<u64>, min: u64, max: u64| match v {
            Some(value) if !(min..=max).contains(&value) => Err(ConfigError::OutOfRange {
                key,
                min,
                max,
                value,
            }),
            _ => Ok(()),
        };
        let w = MAX_WINDOW_PDUS;
        check("a_timer_ms", self.a_timer_ms, 0, MAX_TUNING_MS)?;
        check("max_sdu_gap", self.max_sdu_gap, 0, w)?;
        check("window", self.window.map(|v| v as u64), 1, w)?;
        check("initial_credit", self.initial_credit, 1, w)?;
        check("initial_rto_ms", self.initial_rto_ms, 1, MAX_TUNING_MS)?;
        check("min_rto_ms", self.min_rto_ms, 1, MAX_TUNING_MS)?;
        check("max_rto_ms", self.max_rto_ms, 1, MAX_TUNING_MS)?;
        check("max_retries", self.max_retries.map(u64::from), 0, 1000)?;
        check("ack_every", self.ack_every.map(u64::from), 1, 1 << 16)?;
        check("initial_window", self.initial_window, 1, w)?;
        check("min_window", self.min_window, 1, w)?;
        check("max_window", self.max_window, 1, w)?;
        check("gain_shift", self.gain_shift.map(u64::from), 0, 10)?;
        check("rate_pdus", self.rate_pdus, 0, w)?;
        check("rate_frame_ms", self.rate_frame_ms, 1, MAX_TUNING_MS)
    }

    /// Applies the settings to `cfg` and checks the result.
    pub fn apply(&self, cfg: &mut EfcpConfig) -> Result<(), ConfigError> {
        self.check_ranges()?;
        let ms = Duration::from_millis;
        if let Some(v) = self.a_timer_ms {
            cfg.a_timer = ms(v);
        }
        if self.max_sdu_gap.is_some() {
            cfg.max_sdu_gap = self.max_sdu_gap;
        }
        if let Some(d) = cfg.dtcp.as_mut() {
            if let Some(w) = d.window.as_mut() {
                if let Some(v) = self.window {
                    w.receiver_buffer = v;
                    w.initial_credit = w.initial_credit.min(v as u64);
                }
                if let Some(v) = self.initial_credit {
                    w.initial_credit = v;
                }
            }
            if let Some(r) = d.rtx.as_mut() {
                let set = |slot: &mut Duration, v: Option<u64>| {
                    if let Some(v) = v {
                        *slot = ms(v);
                    }
                };
                set(&mut r.initial_rto, self.initial_rto_ms);
                set(&mut r.min_rto, self.min_rto_ms);
                set(&mut r.max_rto, self.max_rto_ms);
                r.max_retries = self.max_retries.unwrap_or(r.max_retries);
                r.ack_every = self.ack_every.unwrap_or(r.ack_every);
            }
            self.apply_cc(d);
            self.apply_rate(d);
        }
        cfg.validate()
    }

    /// Every key `cfg` has a value for, as this tuning writes it: what a
    /// cube's EFCP is, in the words that change it.
    pub fn of(cfg: &EfcpConfig) -> EfcpTuning {
        let ms = |d: Duration| Some(d.as_millis().min(u128::from(u64::MAX)) as u64);
        let d = cfg.dtcp.as_ref();
        let w = d.and_then(|d| d.window.as_ref());
        let r = d.and_then(|d| d.rtx.as_ref());
        let c = d.and_then(|d| d.cc.as_ref());
        EfcpTuning {
            a_timer_ms: ms(cfg.a_timer),
            max_sdu_gap: cfg.max_sdu_gap,
            window: w.map(|w| w.receiver_buffer),
            initial_credit: w.map(|w| w.initial_credit),
            initial_rto_ms: r.and_then(|r| ms(r.initial_rto)),
            min_rto_ms: r.and_then(|r| ms(r.min_rto)),
            max_rto_ms: r.and_then(|r| ms(r.max_rto)),
            max_retries: r.map(|r| r.max_retries),
            ack_every: r.map(|r| r.ack_every),
            congestion_control: d.map(|d| match d.cc.map(|c| c.policy) {
                Some(super::CcPolicy::Dctcp) => CcName::Dctcp,
                Some(super::CcPolicy::Aimd) => CcName::Aimd,
                None => CcName::None,
            }),
            initial_window: c.map(|c| c.initial_window),
            min_window: c.map(|c| c.min_window),
            max_window: c.map(|c| c.max_window),
            gain_shift: c.map(|c| c.gain_shift),
            rate_pdus: d.map(|d| d.rate.map_or(0, |r| r.pdus_per_frame)),
            rate_frame_ms: d.and_then(|d| d.rate).and_then(|r| ms(r.frame)),
        }
    }

    /// The keys set here that `cfg` has no use for (it has no window flow
    /// control, no retransmission control, no DTCP at all), in the order
    /// of the struct: applied, they would change nothing.
    pub fn inapplicable(&self, cfg: &EfcpConfig) -> Vec<&'static str> {
        let d = cfg.dtcp.as_ref();
        let (window, rtx) = (
            d.is_some_and(|d| d.window.is_some()),
            d.is_some_and(|d| d.rtx.is_some()),
        );
        [
            ("window", self.window.is_some() && !window),
            ("initial_credit", self.initial_credit.is_some() && !window),
            ("initial_rto_ms", self.initial_rto_ms.is_some() && !rtx),
            ("min_rto_ms", self.min_rto_ms.is_some() && !rtx),
            ("max_rto_ms", self.max_rto_ms.is_some() && !rtx),
            ("max_retries", self.max_retries.is_some() && !rtx),
            ("ack_every", self.ack_every.is_some() && !rtx),
            (
                "congestion_control",
                self.congestion_control.is_some() && d.is_none(),
            ),
            (
                "initial_window",
                self.initial_window.is_some() && d.is_none(),
            ),
            ("min_window", self.min_window.is_some() && d.is_none()),
            ("max_window", self.max_window.is_some() && d.is_none()),
            ("gain_shift", self.gain_shift.is_some() && d.is_none()),
            ("rate_pdus", self.rate_pdus.is_some() && d.is_none()),
            ("rate_frame_ms", self.rate_frame_ms.is_some() && d.is_none()),
        ]
        .into_iter()
        .filter(|(_, unused)| *unused)
        .map(|(k, _)| k)
        .collect()
    }

    fn apply_rate(&self, d: &mut DtcpConfig) {
        let frame = |f: Option<&RateFc>| {
            self.rate_frame_ms
                .map(Duration::from_millis)
                .or(f.map(|r| r.frame))
                .unwrap_or(Duration::from_millis(10))
        };
        match self.rate_pdus {
            Some(0) => d.rate = None,
            Some(n) => {
                d.rate = Some(RateFc {
                    pdus_per_frame: n,
                    frame: frame(d.rate.as_ref()),
                })
            }
            None => {
                if let Some(r) = d.rate.as_mut() {
                    r.frame = frame(Some(r));
                }
            }
        }
    }

    fn apply_cc(&self, d: &mut DtcpConfig) {
        let policy = match self.congestion_control {
            Some(CcName::None) => {
                d.cc = None;
                return;
            }
            Some(CcName::Dctcp) => Some(super::CcPolicy::Dctcp),
            Some(CcName::Aimd) => Some(super::CcPolicy::Aimd),
            None => None,
        };
        if d.cc.is_none() && policy.is_none() {
            return;
        }
        let mut c = d.cc.unwrap_or_default();
        if let Some(p) = policy {
            c.policy = p;
        }
        c.initial_window = self.initial_window.unwrap_or(c.initial_window);
        c.min_window = self.min_window.unwrap_or(c.min_window);
        c.max_window = self.max_window.unwrap_or(c.max_window);
        c.gain_shift = self.gain_shift.unwrap_or(c.gain_shift);
        d.cc = Some(c);
    }
}

#[cfg(test)]
mod tuning_tests {
    use super::*;

    #[test]
    fn a_toml_table_tunes_the_reliable_cube() {
        let t: EfcpTuning = toml::from_str(
            "congestion_control = \"aimd\"\nmin_rto_ms = 5\nwindow = 128\ninitial_window = 4",
        )
        .unwrap();
        let mut c = EfcpConfig::reliable();
        t.apply(&mut c).unwrap();
        let cc = c.cc().unwrap();
        assert_eq!(cc.policy, super::super::CcPolicy::Aimd);
        assert_eq!(cc.initial_window, 4);
        assert_eq!(c.rtx().unwrap().min_rto, Duration::from_millis(5));
        assert_eq!(c.window().unwrap().receiver_buffer, 128);
        let off: EfcpTuning = toml::from_str("congestion_control = \"none\"").unwrap();
        off.apply(&mut c).unwrap();
        assert!(c.cc().is_none());
        // Congestion control needs retransmission.
        let mut u = EfcpConfig::unreliable();
        let on: EfcpTuning = toml::from_str("congestion_control = \"dctcp\"").unwrap();
        assert_eq!(on.apply(&mut u), Ok(()), "no DTCP: nothing to control");
        let mut f = EfcpConfig::flow_controlled();
        assert_eq!(on.apply(&mut f), Err(ConfigError::BadCc));
        assert!(toml::from_str::<EfcpTuning>("bogus = 1").is_err());
    }

    #[test]
    fn rate_based_flow_control_is_set_and_turned_off_by_the_tuning() {
        let mut c = EfcpConfig::reliable();
        let t: EfcpTuning = toml::from_str("rate_pdus = 50\nrate_frame_ms = 20").unwrap();
        t.apply(&mut c).unwrap();
        let want = RateFc {
            pdus_per_frame: 50,
            frame: Duration::from_millis(20),
        };
        assert_eq!(c.rate(), Some(&want));
        // The frame alone keeps the rate; 0 PDUs turns it off.
        let t: EfcpTuning = toml::from_str("rate_frame_ms = 5").unwrap();
        t.apply(&mut c).unwrap();
        assert_eq!(
            c.rate().map(|r| (r.pdus_per_frame, r.frame)),
            Some((50, Duration::from_millis(5)))
        );
        let off: EfcpTuning = toml::from_str("rate_pdus = 0").unwrap();
        off.apply(&mut c).unwrap();
        assert_eq!(c.rate(), None);
        let bad: EfcpTuning = toml::from_str("rate_pdus = 5\nrate_frame_ms = 0").unwrap();
        assert!(matches!(
            bad.apply(&mut c),
            Err(ConfigError::OutOfRange {
                key: "rate_frame_ms",
                ..
            })
        ));
    }
}
