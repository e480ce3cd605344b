//! QoS cubes: the classes of service a normal DIF offers, and how a QoS
//! spec is matched to one of them.
//!
//! A cube declares what it promises (average bandwidth and burst, delay,
//! jitter, loss — each optional) and where it sits in the DIF's
//! cherish/urgency matrix ([`QosCube::urgency`], [`QosCube::cherish`]),
//! which is what the RMT's QoS scheduling policies are built with
//! ([`cu_map`]).

use super::{NormalConfig, NormalError};
use crate::efcp::EfcpConfig;
use crate::rmt::{CuCell, CuMap};
use rina_wire::qos::MAX_SDU_GAP;
use rina_wire::QosSpec;
use std::collections::{BTreeMap, BTreeSet};

/// A class of service of the DIF: a QoS-id, a name, and the EFCP policies
/// every flow of the class uses (both ends use the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QosCube {
    /// QoS-id, carried in the PCI of every PDU of the class.
    pub id: u64,
    /// Name, for configuration and listings.
    pub name: String,
    /// EFCP policies of the class.
    pub efcp: EfcpConfig,
    /// Average bandwidth a flow of the class may use, bit/s (`None`: not
    /// declared).
    pub avg_bandwidth_bps: Option<u64>,
    /// Largest burst above the average, bytes.
    pub burst_bytes: Option<u64>,
    /// One-way delay the class promises not to exceed, microseconds.
    pub delay_us: Option<u64>,
    /// Delay variation the class promises not to exceed, microseconds.
    pub jitter_us: Option<u64>,
    /// Loss the class promises not to exceed, parts per million of SDUs.
    pub loss_ppm: Option<u32>,
    /// Urgency level in the DIF's C/U matrix, 0 = most urgent.
    pub urgency: u8,
    /// Cherish level in the DIF's C/U matrix, 0 = most cherished.
    pub cherish: u8,
    /// The cube of each N-1 DIF (by DIF name) that carries this cube's
    /// PDUs to neighbours over that DIF, by name or QoS-id in decimal (the
    /// cube mapping across DIFs of seed 003). A DIF not listed carries it
    /// on its default cube. Local configuration: not part of the DIF's
    /// profile given at enrollment.
    pub lower: BTreeMap<String, String>,
    /// Keepalive of the cube's flows (see [`super::keepalive`]): a flow on
    /// which nothing arrived for this long sends a probe, which the peer
    /// answers, and one that hears nothing for
    /// [`super::keepalive::KEEPALIVE_MISSES`] of these is failed. `None`
    /// (the default): off. Local configuration, like [`QosCube::lower`]:
    /// not part of the profile given at enrollment (a flow end without
    /// keepalive still answers the probes of one with it).
    pub keepalive: Option<std::time::Duration>,
}

impl QosCube {
    /// A cube.
    pub fn new(id: u64, name: impl Into<String>, efcp: EfcpConfig) -> Self {
        QosCube {
            id,
            name: name.into(),
            efcp,
            avg_bandwidth_bps: None,
            burst_bytes: None,
            delay_us: None,
            jitter_us: None,
            loss_ppm: None,
            urgency: 0,
            cherish: 0,
            lower: BTreeMap::new(),
            keepalive: None,
        }
    }

    /// The cube with keepalive on its flows every `interval`.
    pub fn with_keepalive(mut self, interval: std::time::Duration) -> Self {
        self.keepalive = Some(interval);
        self
    }

    /// The cube carried on cube `lower_cube` (name or id) of N-1 DIF `dif`.
    pub fn over(mut self, dif: impl Into<String>, lower_cube: impl Into<String>) -> Self {
        self.lower.insert(dif.into(), lower_cube.into());
        self
    }

    /// The cube placed at (`urgency`, `cherish`) of the C/U matrix.
    pub fn with_cell(mut self, urgency: u8, cherish: u8) -> Self {
        self.urgency = urgency;
        self.cherish = cherish;
        self
    }

    /// The cube with an average bandwidth (bit/s) and burst (bytes).
    pub fn with_bandwidth(mut self, avg_bps: u64, burst_bytes: u64) -> Self {
        self.avg_bandwidth_bps = Some(avg_bps);
        self.burst_bytes = Some(burst_bytes);
        self
    }

    /// The cube with delay and jitter bounds (microseconds).
    pub fn with_delay(mut self, delay_us: u64, jitter_us: Option<u64>) -> Self {
        self.delay_us = Some(delay_us);
        self.jitter_us = jitter_us;
        self
    }

    /// The cube with a loss bound (parts per million).
    pub fn with_loss(mut self, loss_ppm: u32) -> Self {
        self.loss_ppm = Some(loss_ppm);
        self
    }

    /// The cube's cell in the C/U matrix.
    pub fn cell(&self) -> CuCell {
        CuCell::new(self.urgency, self.cherish)
    }

    /// The default cubes of a DIF: 1 "unreliable" and 2 "reliable".
    pub fn defaults() -> Vec<QosCube> {
        vec![
            QosCube::new(1, "unreliable", EfcpConfig::unreliable()),
            QosCube::new(2, "reliable", EfcpConfig::reliable()),
        ]
    }

    /// Whether the cube retransmits and delivers in order.
    pub fn is_reliable(&self) -> bool {
        self.efcp.rtx().is_some() && self.efcp.in_order
    }

    /// Whether the cube never gives up a lost PDU (so it loses nothing).
    pub fn is_lossless(&self) -> bool {
        self.is_reliable() && self.efcp.max_sdu_gap == Some(0)
    }
}

/// Whether `qos` asks for retransmission and in-order delivery.
fn wants_reliable(qos: &QosSpec) -> bool {
    qos.reliable || wants_lossless(qos) || qos.in_order
}

/// Whether `qos` asks that nothing be lost.
fn wants_lossless(qos: &QosSpec) -> bool {
    qos.reliable || qos.max_loss_ppm == Some(0) || qos.max_sdu_gap == Some(0)
}

/// Where each cube sits in the C/U matrix, for the RMT's policies.
pub fn cu_map(cubes: &[QosCube]) -> CuMap {
    let mut m = CuMap::new();
    for c in cubes {
        m.insert(c.id, c.cell());
    }
    m
}

/// How the cubes of a DIF ride on the cubes of one N-1 DIF: which lower
/// cubes the resource allocator needs an N-1 flow of, per neighbour, and
/// which of this DIF's QoS-ids each carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LowerPlan {
    /// The lower cube whose N-1 flow is the primary (it carries the
    /// management PDUs): the most urgent, then most cherished, of those
    /// used.
    pub primary: u64,
    /// Lower QoS-id -> (its name, the QoS-ids of this DIF it carries).
    pub lanes: BTreeMap<u64, (String, BTreeSet<u64>)>,
}

/// The cube of `lower` that `name` (a name, or a QoS-id in decimal) names.
pub fn find_cube<'a>(lower: &'a [QosCube], name: &str) -> Option<&'a QosCube> {
    lower
        .iter()
        .find(|c| c.name == name)
        .or_else(|| lower.iter().find(|c| c.id.to_string() == name))
}

/// The cubes of a DIF as a listing: `A1 (1), A2 (2)`.
pub fn cube_list(cubes: &[QosCube]) -> String {
    cubes
        .iter()
        .map(|c| format!("{} ({})", c.name, c.id))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How `upper` (the cubes of a DIF) ride on `lower` (the cubes of N-1 DIF
/// `lower_dif`, whose default cube is `default`): each upper cube on the
/// lower cube its [`QosCube::lower`] names for `lower_dif`, else on the
/// default. A cube that names a lower cube `lower` does not have is an
/// error naming both and listing what `lower_dif` offers.
pub fn lower_plan(
    upper: &[QosCube],
    lower_dif: &str,
    lower: &[QosCube],
    default: u64,
) -> Result<LowerPlan, String> {
    let mut lanes: BTreeMap<u64, (String, BTreeSet<u64>)> = BTreeMap::new();
    let default = lower
        .iter()
        .find(|c| c.id == default)
        .ok_or_else(|| format!("DIF {lower_dif} has no default QoS cube {default}"))?;
    for u in upper {
        let l = match u.lower.get(lower_dif) {
            Some(name) => find_cube(lower, name).ok_or_else(|| {
                format!(
                    "QoS cube {} ({}) maps to cube {name:?} of DIF {lower_dif}, which offers {}",
                    u.name,
                    u.id,
                    cube_list(lower)
                )
            })?,
            None => default,
        };
        lanes
            .entry(l.id)
            .or_insert_with(|| (l.name.clone(), BTreeSet::new()))
            .1
            .insert(u.id);
    }
    if lanes.is_empty() {
        lanes.insert(default.id, (default.name.clone(), BTreeSet::new()));
    }
    let primary = lower
        .iter()
        .filter(|c| lanes.contains_key(&c.id))
        .min_by_key(|c| (c.urgency, c.cherish, c.id))
        .map_or(default.id, |c| c.id);
    Ok(LowerPlan { primary, lanes })
}

/// Which figures some cube of the DIF declares: a figure no cube declares
/// is not matched (the DIF does not characterise it, as before cubes had
/// figures); once one does, a cube that does not cannot promise it.
#[derive(Clone, Copy)]
struct Declared {
    delay: bool,
    loss: bool,
    bandwidth: bool,
}

impl Declared {
    fn of(cubes: &[QosCube]) -> Self {
        Declared {
            delay: cubes.iter().any(|c| c.delay_us.is_some()),
            loss: cubes.iter().any(|c| c.loss_ppm.is_some()),
            bandwidth: cubes.iter().any(|c| c.avg_bandwidth_bps.is_some()),
        }
    }
}

/// Whether cube `c` meets the delay, loss and bandwidth figures of `qos`;
/// if not, why.
fn meets(c: &QosCube, qos: &QosSpec, d: Declared) -> Result<(), String> {
    if let Some(want) = qos.max_delay_us {
        match c.delay_us {
            Some(has) if has > want => {
                return Err(format!("delay up to {has} µs, above the {want} µs asked"))
            }
            None if d.delay => return Err("no delay bound".into()),
            _ => {}
        }
    }
    if let Some(want) = qos.max_loss_ppm.filter(|&l| l > 0) {
        match c.loss_ppm {
            _ if c.is_lossless() => {}
            Some(has) if has > want => {
                return Err(format!("loss up to {has} ppm, above the {want} ppm asked"))
            }
            None if d.loss => return Err("no loss bound".into()),
            _ => {}
        }
    }
    if let Some(want) = qos.avg_bandwidth_bps {
        match c.avg_bandwidth_bps {
            Some(has) if has < want => {
                return Err(format!("{has} bit/s, below the {want} bit/s asked"))
            }
            None if d.bandwidth => return Err("no bandwidth declared".into()),
            _ => {}
        }
    }
    Ok(())
}

/// Whether `c` has the EFCP policies `qos` needs; if not, why.
fn efcp_fits(c: &QosCube, qos: &QosSpec) -> Result<(), &'static str> {
    if wants_lossless(qos) && !c.is_lossless() {
        return Err("it does not retransmit, deliver in order and lose nothing");
    }
    if wants_reliable(qos) && !c.is_reliable() {
        return Err("it does not retransmit and deliver in order");
    }
    Ok(())
}

/// Refuses what no cube of the DIF can serve: SDUs above the DIF's
/// maximum, or a gap above [`MAX_SDU_GAP`], which a flow request cannot
/// carry (it would reach the destination as another QoS).
fn check_limits(cfg: &NormalConfig, qos: &QosSpec) -> Result<(), NormalError> {
    if let Some(g) = qos.max_sdu_gap.filter(|&g| g > MAX_SDU_GAP) {
        return Err(NormalError::QosNotSatisfiable(format!(
            "max_sdu_gap = {g} is above {MAX_SDU_GAP}, the largest gap a flow request of DIF {} carries",
            cfg.dif
        )));
    }
    if let Some(s) = qos.max_sdu_size {
        if s as usize > cfg.max_sdu {
            return Err(NormalError::QosNotSatisfiable(format!(
                "SDUs of {s} bytes exceed the maximum of {} bytes of DIF {}",
                cfg.max_sdu, cfg.dif
            )));
        }
    }
    Ok(())
}

/// The cube that serves `qos` among `cubes` of a DIF configured by `cfg`.
///
/// * A spec asking for reliability (`reliable`, `max_loss_ppm = 0`,
///   `max_sdu_gap = 0`) gets the first cube that retransmits, delivers in
///   order and never gives up a hole; `in_order` alone gets the first cube
///   that retransmits and delivers in order.
/// * Anything else gets the first cube without retransmission, or the first
///   cube at all if every cube retransmits.
/// * Only cubes whose declared figures meet the spec's delay, loss and
///   bandwidth are considered (see [`QosCube`]; a figure no cube of the DIF
///   declares is not matched). The refusal says what each cube lacks.
/// * `max_sdu_size` above the DIF's maximum SDU cannot be served, nor
///   `max_sdu_gap` above [`MAX_SDU_GAP`].
pub(crate) fn choose<'a>(
    cfg: &NormalConfig,
    cubes: &'a [QosCube],
    qos: &QosSpec,
) -> Result<&'a QosCube, NormalError> {
    if let Some(id) = qos.cube {
        return choose_named(cfg, cubes, &id.to_string(), qos);
    }
    check_limits(cfg, qos)?;
    let names = || {
        cubes
            .iter()
            .map(|c| format!("{} ({})", c.id, c.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let d = Declared::of(cubes);
    if wants_reliable(qos) {
        let lossless = wants_lossless(qos);
        let fitting: Vec<&QosCube> = cubes.iter().filter(|c| efcp_fits(c, qos).is_ok()).collect();
        if fitting.is_empty() {
            return Err(NormalError::QosNotSatisfiable(format!(
                "DIF {} has no QoS cube that retransmits{} (cubes: {})",
                cfg.dif,
                if lossless {
                    ", delivers in order and loses nothing"
                } else {
                    " and delivers in order"
                },
                names()
            )));
        }
        return fitting
            .iter()
            .find(|c| meets(c, qos, d).is_ok())
            .copied()
            .ok_or_else(|| refusal(cfg, &fitting, qos, d));
    }
    if cubes.is_empty() {
        return Err(NormalError::QosNotSatisfiable(format!(
            "DIF {} has no QoS cubes",
            cfg.dif
        )));
    }
    let ok: Vec<&QosCube> = cubes.iter().filter(|c| meets(c, qos, d).is_ok()).collect();
    ok.iter()
        .find(|c| c.efcp.rtx().is_none())
        .or_else(|| ok.first())
        .copied()
        .ok_or_else(|| refusal(cfg, &cubes.iter().collect::<Vec<_>>(), qos, d))
}

/// The refusal listing why each of `cubes` does not meet `qos`.
fn refusal(cfg: &NormalConfig, cubes: &[&QosCube], qos: &QosSpec, d: Declared) -> NormalError {
    let why: Vec<String> = cubes
        .iter()
        .filter_map(|c| {
            meets(c, qos, d)
                .err()
                .map(|w| format!("{} ({}): {w}", c.id, c.name))
        })
        .collect();
    NormalError::QosNotSatisfiable(format!(
        "no QoS cube of DIF {} meets the spec: {}",
        cfg.dif,
        why.join("; ")
    ))
}

/// The cube named `name` (its name, or its id in decimal) if it serves
/// `qos`; a refusal saying why not otherwise.
pub fn choose_named<'a>(
    cfg: &NormalConfig,
    cubes: &'a [QosCube],
    name: &str,
    qos: &QosSpec,
) -> Result<&'a QosCube, NormalError> {
    check_limits(cfg, qos)?;
    let c = cubes
        .iter()
        .find(|c| c.name == name || c.id.to_string() == name)
        .ok_or_else(|| {
            NormalError::QosNotSatisfiable(format!("DIF {} has no QoS cube {name}", cfg.dif))
        })?;
    let d = Declared::of(cubes);
    efcp_fits(c, qos)
        .map_err(|w| w.to_string())
        .and_then(|()| meets(c, qos, d))
        .map_err(|w| {
            NormalError::QosNotSatisfiable(format!(
                "QoS cube {} ({}) of DIF {} does not serve the spec: {w}",
                c.id, c.name, cfg.dif
            ))
        })?;
    Ok(c)
}

#[cfg(test)]
mod figure_tests {
    use super::*;

    /// Seed 003's SPN cubes with figures: Gold (A1) is fast and nearly
    /// lossless, BE (C2) promises little.
    fn spn() -> (NormalConfig, Vec<QosCube>) {
        let u = EfcpConfig::unreliable;
        let cubes = vec![
            QosCube::new(1, "gold", u())
                .with_cell(0, 0)
                .with_delay(5_000, Some(1_000))
                .with_loss(100)
                .with_bandwidth(2_000_000, 15_000),
            QosCube::new(4, "bronze", u())
                .with_cell(2, 0)
                .with_delay(500_000, None)
                .with_loss(1_000)
                .with_bandwidth(10_000_000, 150_000),
            QosCube::new(5, "be", u())
                .with_cell(2, 1)
                .with_bandwidth(100_000_000, 150_000),
            QosCube::new(6, "files", EfcpConfig::reliable()).with_cell(2, 0),
        ];
        (NormalConfig::new("spn", 1), cubes)
    }

    fn pick(q: QosSpec) -> Result<u64, String> {
        let (cfg, cubes) = spn();
        choose(&cfg, &cubes, &q)
            .map(|c| c.id)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn delay_loss_and_bandwidth_pick_the_cube_that_can_give_them() {
        assert_eq!(pick(QosSpec::default()), Ok(1), "first cube without rtx");
        let delay = |us| QosSpec {
            max_delay_us: Some(us),
            ..Default::default()
        };
        assert_eq!(pick(delay(10_000)), Ok(1));
        assert_eq!(pick(delay(600_000)), Ok(1), "first that meets it");
        let q = QosSpec {
            avg_bandwidth_bps: Some(5_000_000),
            ..Default::default()
        };
        assert_eq!(pick(q), Ok(4), "gold's 2 Mb/s is too little");
        let q = QosSpec {
            avg_bandwidth_bps: Some(5_000_000),
            max_delay_us: Some(1_000_000),
            max_loss_ppm: Some(500),
            ..Default::default()
        };
        // bronze loses up to 1000 ppm, be declares no bound.
        let why = pick(q).unwrap_err();
        assert!(why.contains("1 (gold): 2000000 bit/s, below"), "{why}");
        assert!(why.contains("4 (bronze): loss up to 1000 ppm"), "{why}");
        assert!(why.contains("5 (be): no delay bound"), "{why}");
        let why = pick(delay(1_000)).unwrap_err();
        assert!(
            why.contains("delay up to 5000 µs, above the 1000 µs asked"),
            "{why}"
        );
        // A reliable cube is lossless: it meets any loss figure.
        let q = QosSpec {
            reliable: true,
            max_loss_ppm: Some(10),
            ..Default::default()
        };
        assert_eq!(pick(q), Ok(6));
    }

    #[test]
    fn a_gap_a_flow_request_cannot_carry_is_refused() {
        let gap = |g| QosSpec {
            max_sdu_gap: Some(g),
            ..Default::default()
        };
        assert_eq!(pick(gap(MAX_SDU_GAP)), Ok(1));
        let why = pick(gap(u32::MAX)).unwrap_err();
        assert!(
            why.contains("max_sdu_gap = 4294967295 is above 2147483647"),
            "{why}"
        );
        let (cfg, cubes) = spn();
        assert!(choose_named(&cfg, &cubes, "be", &gap(MAX_SDU_GAP + 1)).is_err());
    }

    #[test]
    fn a_dif_without_figures_matches_as_before() {
        let cfg = NormalConfig::new("plain", 1);
        let cubes = QosCube::defaults();
        let q = QosSpec {
            max_delay_us: Some(1),
            avg_bandwidth_bps: Some(u64::MAX),
            max_loss_ppm: Some(5),
            ..Default::default()
        };
        assert_eq!(choose(&cfg, &cubes, &q).unwrap().id, 1);
    }

    #[test]
    fn a_cube_may_be_named_if_it_serves_the_spec() {
        let (cfg, cubes) = spn();
        let q = QosSpec::default();
        assert_eq!(choose_named(&cfg, &cubes, "bronze", &q).unwrap().id, 4);
        assert_eq!(choose_named(&cfg, &cubes, "5", &q).unwrap().name, "be");
        let q = QosSpec {
            max_delay_us: Some(1_000),
            ..Default::default()
        };
        let e = choose_named(&cfg, &cubes, "gold", &q)
            .unwrap_err()
            .to_string();
        assert!(e.contains("gold") && e.contains("5000 µs"), "{e}");
        let e = choose_named(&cfg, &cubes, "platinum", &q)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no QoS cube platinum"), "{e}");
        let q = QosSpec {
            reliable: true,
            ..Default::default()
        };
        assert!(choose_named(&cfg, &cubes, "gold", &q).is_err());
    }

    #[test]
    fn a_spec_that_names_a_cube_gets_it_or_a_reason() {
        let (cfg, cubes) = spn();
        // Without a cube the DIF picks the first that serves (id 1); with
        // one, that cube, if it serves the rest of the spec.
        assert_eq!(choose(&cfg, &cubes, &QosSpec::default()).unwrap().id, 1);
        let q = QosSpec {
            cube: Some(4),
            ..Default::default()
        };
        assert_eq!(choose(&cfg, &cubes, &q).unwrap().name, "bronze");
        let q = QosSpec {
            cube: Some(99),
            ..Default::default()
        };
        let e = choose(&cfg, &cubes, &q).unwrap_err().to_string();
        assert!(e.contains("no QoS cube 99"), "{e}");
    }

    /// Seed 003: Gold and Silver over A1, Sensitive BE over A2, Bronze
    /// over B1, BE over B2 of the MR DIF.
    #[test]
    fn the_mapping_of_seed_003_plans_four_lanes_with_management_on_a1() {
        let u = EfcpConfig::unreliable;
        let mr = vec![
            QosCube::new(4, "B2", u()).with_cell(1, 1),
            QosCube::new(1, "A1", u()).with_cell(0, 0),
            QosCube::new(2, "A2", u()).with_cell(0, 1),
            QosCube::new(3, "B1", u()).with_cell(1, 0),
        ];
        let spn = vec![
            QosCube::new(1, "gold", u()).over("mr", "A1"),
            QosCube::new(2, "silver", u()).over("mr", "1"),
            QosCube::new(3, "sensitive-be", u()).over("mr", "A2"),
            QosCube::new(4, "bronze", u()).over("mr", "B1"),
            QosCube::new(5, "be", u()).over("mr", "B2"),
        ];
        let p = lower_plan(&spn, "mr", &mr, 4).unwrap();
        assert_eq!(p.primary, 1, "A1 is the most urgent and cherished");
        let lanes: Vec<(u64, &str, Vec<u64>)> = p
            .lanes
            .iter()
            .map(|(id, (n, c))| (*id, n.as_str(), c.iter().copied().collect()))
            .collect();
        assert_eq!(
            lanes,
            [
                (1, "A1", vec![1, 2]),
                (2, "A2", vec![3]),
                (3, "B1", vec![4]),
                (4, "B2", vec![5])
            ]
        );
        // Another N-1 DIF is not mapped: everything on its default cube.
        let p = lower_plan(&spn, "other", &mr, 3).unwrap();
        assert_eq!(p.primary, 3);
        assert_eq!(p.lanes.len(), 1);
        assert_eq!(p.lanes[&3].1.len(), 5);
        // A cube the DIF below does not have.
        let bad = vec![QosCube::new(1, "gold", u()).over("mr", "C1")];
        let e = lower_plan(&bad, "mr", &mr, 1).unwrap_err();
        assert_eq!(
            e,
            "QoS cube gold (1) maps to cube \"C1\" of DIF mr, which offers B2 (4), A1 (1), A2 (2), B1 (3)"
        );
    }

    #[test]
    fn the_cu_map_places_each_cube() {
        let (_, cubes) = spn();
        let m = cu_map(&cubes);
        assert_eq!(m.cell(1), CuCell::new(0, 0));
        assert_eq!(m.cell(5), CuCell::new(2, 1));
        assert_eq!((m.urgency_levels(), m.cherish_levels()), (3, 2));
    }
}
