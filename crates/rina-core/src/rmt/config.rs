//! Typed, serde-deserialisable parameters of the scheduling policies, the
//! QoS-id → (urgency, cherish) map they are built with, and
//! [`SchedulerConfig::build`], which checks the parameters and builds the
//! policy (naming the bad parameter when it cannot).
//!
//! Conventions of every policy here: urgency 0 is the most urgent level and
//! cherish 0 the most cherished (seed 003/004's A1); rates are in bit/s,
//! sizes in bytes, queue lengths and thresholds in PDUs.

use super::diffserv::DiffServ;
use super::qta_mux::QtaMux;
use super::rate_limit::RateLimit2d;
use super::token_bucket::TokenBucketPolicy;
use super::{Fifo, QosId, Scheduler};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use thiserror::Error;

/// Why a scheduling policy could not be built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SchedConfigError {
    /// A parameter has a value the policy cannot use.
    #[error("scheduling policy {policy}: parameter `{param}`: {reason}")]
    BadParam {
        policy: &'static str,
        param: String,
        reason: String,
    },
}

pub(crate) fn bad(
    policy: &'static str,
    param: impl Into<String>,
    reason: impl Into<String>,
) -> SchedConfigError {
    SchedConfigError::BadParam {
        policy,
        param: param.into(),
        reason: reason.into(),
    }
}

/// A cell of the DIF's cherish/urgency matrix.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(deny_unknown_fields)]
pub struct CuCell {
    /// Urgency level, 0 = most urgent.
    pub urgency: u8,
    /// Cherish level, 0 = most cherished.
    pub cherish: u8,
}

impl CuCell {
    /// The cell at (urgency, cherish).
    pub const fn new(urgency: u8, cherish: u8) -> Self {
        CuCell { urgency, cherish }
    }
}

/// Where each QoS cube sits in the C/U matrix: given to a policy when it is
/// built. QoS-ids not in the map go to the `default` cell, or, without one,
/// to the least urgent and least cherished cell of the map.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CuMap {
    cells: BTreeMap<QosId, CuCell>,
    default: Option<CuCell>,
}

impl CuMap {
    /// An empty map (every QoS-id in cell A1).
    pub fn new() -> Self {
        CuMap::default()
    }

    /// Places `qos_id` at (`urgency`, `cherish`).
    pub fn with(mut self, qos_id: QosId, urgency: u8, cherish: u8) -> Self {
        self.cells.insert(qos_id, CuCell::new(urgency, cherish));
        self
    }

    /// Places QoS-ids not in the map at (`urgency`, `cherish`).
    pub fn with_default(mut self, urgency: u8, cherish: u8) -> Self {
        self.default = Some(CuCell::new(urgency, cherish));
        self
    }

    /// Places `qos_id` at `cell`.
    pub fn insert(&mut self, qos_id: QosId, cell: CuCell) {
        self.cells.insert(qos_id, cell);
    }

    /// The cell of `qos_id` (the default cell if it is not in the map).
    pub fn cell(&self, qos_id: QosId) -> CuCell {
        self.cells
            .get(&qos_id)
            .copied()
            .unwrap_or_else(|| self.default_cell())
    }

    /// Whether `qos_id` is in the map.
    pub fn contains(&self, qos_id: QosId) -> bool {
        self.cells.contains_key(&qos_id)
    }

    /// The cell of QoS-ids not in the map.
    pub fn default_cell(&self) -> CuCell {
        self.default.unwrap_or_else(|| {
            CuCell::new(
                self.cells.values().map(|c| c.urgency).max().unwrap_or(0),
                self.cells.values().map(|c| c.cherish).max().unwrap_or(0),
            )
        })
    }

    /// The QoS-ids in the map and their cells.
    pub fn iter(&self) -> impl Iterator<Item = (QosId, CuCell)> + '_ {
        self.cells.iter().map(|(&q, &c)| (q, c))
    }

    /// Number of urgency levels the map uses (highest level + 1).
    pub fn urgency_levels(&self) -> usize {
        self.iter()
            .map(|(_, c)| c.urgency)
            .chain([self.default_cell().urgency])
            .max()
            .map_or(1, |u| usize::from(u) + 1)
    }

    /// Number of cherish levels the map uses (highest level + 1).
    pub fn cherish_levels(&self) -> usize {
        self.iter()
            .map(|(_, c)| c.cherish)
            .chain([self.default_cell().cherish])
            .max()
            .map_or(1, |c| usize::from(c) + 1)
    }
}

/// A token bucket: long-term rate and largest burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketParams {
    /// Long-term rate, bit/s.
    pub rate_bps: u64,
    /// Bucket depth, bytes (the largest burst sent at once).
    pub burst_bytes: u64,
}

impl BucketParams {
    fn check(&self, policy: &'static str, param: &str) -> Result<(), SchedConfigError> {
        if self.rate_bps == 0 {
            return Err(bad(policy, format!("{param}.rate_bps"), "must be above 0"));
        }
        if self.burst_bytes == 0 {
            return Err(bad(
                policy,
                format!("{param}.burst_bytes"),
                "must be above 0",
            ));
        }
        Ok(())
    }
}

/// What a policer/shaper does with a PDU beyond its rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Excess {
    /// Drop it (policer).
    #[default]
    Drop,
    /// Hold it until the bucket has the tokens (shaper).
    Delay,
}

/// The `fifo` policy: one bounded FIFO per port (management PDUs first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FifoConfig {
    /// Bound, PDUs.
    #[serde(default = "default_queue_len")]
    pub queue_len: usize,
}

impl Default for FifoConfig {
    fn default() -> Self {
        FifoConfig {
            queue_len: DEFAULT_QUEUE_LEN,
        }
    }
}

/// The `token-bucket` policy: one bucket per port in front of a FIFO.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBucketConfig {
    /// Rate of the port, bit/s.
    pub rate_bps: u64,
    /// Bucket depth, bytes.
    pub burst_bytes: u64,
    /// Drop (police) or delay (shape) PDUs beyond the rate.
    #[serde(default)]
    pub excess: Excess,
    /// Bound of the FIFO, PDUs.
    #[serde(default = "default_queue_len")]
    pub queue_len: usize,
}

/// Against what a QTA-Mux cherish threshold is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Occupancy {
    /// PDUs in the whole multiplexer of the port (one shared buffer, as
    /// seeds 003/004 and RINASim's C/U mux describe it).
    #[default]
    Port,
    /// PDUs in the urgency queue the PDU joins (IRATI's 2018 QTA-Mux, used
    /// in seed 003's experiment, where each urgency queue held 1250 PDUs).
    Urgency,
}

/// Per-cube settings of QTA-Mux (all optional).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QtaCubeConfig {
    /// QoS-id of the cube.
    pub qos_id: QosId,
    /// Drop threshold of this cube, PDUs (instead of its cherish level's).
    #[serde(default)]
    pub threshold: Option<usize>,
    /// Rate limit of the cube's policer/shaper.
    #[serde(default)]
    pub limit: Option<BucketParams>,
    /// Drop or delay PDUs beyond `limit`.
    #[serde(default)]
    pub excess: Excess,
    /// Bound of the shaper's queue (with `excess = "delay"`), PDUs.
    #[serde(default = "default_queue_len")]
    pub shaper_queue_len: usize,
}

impl QtaCubeConfig {
    /// A cube with nothing set.
    pub fn new(qos_id: QosId) -> Self {
        QtaCubeConfig {
            qos_id,
            threshold: None,
            limit: None,
            excess: Excess::Drop,
            shaper_queue_len: DEFAULT_QUEUE_LEN,
        }
    }
}

/// The `qta-mux` policy: policer/shaper per cube, then a cherish/urgency
/// multiplexer (shared buffer, drop threshold per cherish level, strict
/// urgency with a probability of skipping the most urgent level).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QtaMuxConfig {
    /// Drop threshold per cherish level (index = level), PDUs. A PDU is
    /// dropped when the occupancy is at or above its threshold.
    pub cherish_thresholds: Vec<usize>,
    /// What the thresholds are compared with.
    #[serde(default)]
    pub occupancy: Occupancy,
    /// Probability (0..=1) of skipping the most urgent non-empty level in
    /// favour of the next non-empty one (seed 003: 0.05).
    #[serde(default)]
    pub skip_probability: f64,
    /// Seed of the skip draws.
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Bound of the management queue, PDUs.
    #[serde(default = "default_queue_len")]
    pub mgmt_queue_len: usize,
    /// Per-cube thresholds and policers/shapers ("QTA with per-cube limits").
    #[serde(default)]
    pub cubes: Vec<QtaCubeConfig>,
}

impl QtaMuxConfig {
    /// Thresholds per cherish level, nothing else.
    pub fn new(cherish_thresholds: Vec<usize>) -> Self {
        QtaMuxConfig {
            cherish_thresholds,
            occupancy: Occupancy::Port,
            skip_probability: 0.0,
            seed: default_seed(),
            mgmt_queue_len: DEFAULT_QUEUE_LEN,
            cubes: Vec::new(),
        }
    }

    /// The settings of cube `qos_id`, created if missing.
    pub fn cube_mut(&mut self, qos_id: QosId) -> &mut QtaCubeConfig {
        let i = match self.cubes.iter().position(|c| c.qos_id == qos_id) {
            Some(i) => i,
            None => {
                self.cubes.push(QtaCubeConfig::new(qos_id));
                self.cubes.len() - 1
            }
        };
        &mut self.cubes[i]
    }
}

/// The limit of one level of the 2-D rate limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LevelLimit {
    /// Credit gained per second by this level, bit/s (Table 3's "+45").
    pub rate_bps: u64,
    /// Largest credit the level keeps; the surplus passes to the next
    /// (less urgent / less cherished) level. Bytes.
    pub max_backlog_bytes: u64,
}

/// The `rate-limit-2d` policy of seed 004 §4: a queue per C/U cell, credit
/// per urgency level and per cherish level.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Limits of the urgency levels (index 0 = most urgent).
    pub urgency: Vec<LevelLimit>,
    /// Limits of the cherish levels (index 0 = most cherished).
    pub cherish: Vec<LevelLimit>,
    /// PDUs each cell's queue may hold.
    #[serde(default = "default_queue_len")]
    pub queue_len: usize,
    /// Bound of the cells of each cherish level, PDUs, if below
    /// `queue_len` (less cherished cells drop sooner).
    #[serde(default)]
    pub cherish_thresholds: Vec<usize>,
    /// Bound of the management queue, PDUs.
    #[serde(default = "default_queue_len")]
    pub mgmt_queue_len: usize,
}

/// One cherish class of the `diffserv` policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DsClass {
    /// Rate limit of the class; PDUs beyond it are dropped. None: no limit.
    #[serde(default)]
    pub limit: Option<BucketParams>,
}

/// The `diffserv` policy (seed 004 Table 4 "DS"): a rate limit per cherish
/// class, over-limit PDUs dropped, then one FIFO.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiffServConfig {
    /// The classes, index = cherish level.
    pub classes: Vec<DsClass>,
    /// Bound of the FIFO, PDUs.
    #[serde(default = "default_queue_len")]
    pub queue_len: usize,
    /// Bound of the management queue, PDUs.
    #[serde(default = "default_queue_len")]
    pub mgmt_queue_len: usize,
}

/// Default bound of queues, PDUs.
pub const DEFAULT_QUEUE_LEN: usize = super::fifo::DEFAULT_FIFO_LEN;

fn default_queue_len() -> usize {
    DEFAULT_QUEUE_LEN
}

fn default_seed() -> u64 {
    1
}

/// A scheduling policy and its parameters, as written in a configuration
/// (`policy = "qta-mux"` plus the policy's fields).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "policy", rename_all = "kebab-case")]
pub enum SchedulerConfig {
    /// One bounded FIFO per port.
    Fifo(FifoConfig),
    /// A token bucket per port (policer or shaper) in front of a FIFO.
    TokenBucket(TokenBucketConfig),
    /// QTA-Mux.
    QtaMux(QtaMuxConfig),
    /// The 2-D urgency/cherish rate limiter.
    #[serde(rename = "rate-limit-2d")]
    RateLimit2d(RateLimitConfig),
    /// DiffServ-like rate limits per cherish class.
    Diffserv(DiffServConfig),
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig::Fifo(FifoConfig::default())
    }
}

impl SchedulerConfig {
    /// The same policy with every rate (token buckets, per-cube and
    /// per-class limits, the rate limiter's levels) multiplied by `f`;
    /// bursts, backlogs and queue lengths unchanged. For experiments run
    /// at a fraction of their rates.
    pub fn scaled(&self, f: f64) -> SchedulerConfig {
        let r = |x: &mut u64| *x = ((*x as f64) * f).round().max(1.0) as u64;
        let mut c = self.clone();
        match &mut c {
            SchedulerConfig::Fifo(_) => {}
            SchedulerConfig::TokenBucket(t) => r(&mut t.rate_bps),
            SchedulerConfig::QtaMux(q) => {
                for l in q.cubes.iter_mut().filter_map(|c| c.limit.as_mut()) {
                    r(&mut l.rate_bps);
                }
            }
            SchedulerConfig::RateLimit2d(l) => {
                for x in l.urgency.iter_mut().chain(l.cherish.iter_mut()) {
                    if x.rate_bps > 0 {
                        r(&mut x.rate_bps);
                    }
                }
            }
            SchedulerConfig::Diffserv(d) => {
                for l in d.classes.iter_mut().filter_map(|c| c.limit.as_mut()) {
                    r(&mut l.rate_bps);
                }
            }
        }
        c
    }

    /// The policy's name (as the built scheduler reports it).
    pub fn name(&self) -> &'static str {
        match self {
            SchedulerConfig::Fifo(_) => "fifo",
            SchedulerConfig::TokenBucket(_) => "token-bucket",
            SchedulerConfig::QtaMux(_) => "qta-mux",
            SchedulerConfig::RateLimit2d(_) => "rate-limit-2d",
            SchedulerConfig::Diffserv(_) => "diffserv",
        }
    }

    /// Checks the parameters against each other and against `cu` (the
    /// cubes' places in the C/U matrix), and builds the policy.
    pub fn build(&self, cu: &CuMap) -> Result<Box<dyn Scheduler>, SchedConfigError> {
        let name = self.name();
        Ok(match self {
            SchedulerConfig::Fifo(c) => {
                nonzero(name, "queue_len", c.queue_len)?;
                Box::new(Fifo::new(c.queue_len))
            }
            SchedulerConfig::TokenBucket(c) => {
                BucketParams {
                    rate_bps: c.rate_bps,
                    burst_bytes: c.burst_bytes,
                }
                .check(name, "bucket")?;
                nonzero(name, "queue_len", c.queue_len)?;
                Box::new(TokenBucketPolicy::new(c.clone()))
            }
            SchedulerConfig::QtaMux(c) => {
                check_qta(c, cu)?;
                Box::new(QtaMux::new(c.clone(), cu.clone()))
            }
            SchedulerConfig::RateLimit2d(c) => {
                check_rlim(c, cu)?;
                Box::new(RateLimit2d::new(c.clone(), cu.clone()))
            }
            SchedulerConfig::Diffserv(c) => {
                check_ds(c, cu)?;
                Box::new(DiffServ::new(c.clone(), cu.clone()))
            }
        })
    }
}

fn nonzero(policy: &'static str, param: &str, v: usize) -> Result<(), SchedConfigError> {
    if v == 0 {
        return Err(bad(policy, param, "must be above 0"));
    }
    Ok(())
}

/// Every cube's level must exist in a dimension with `n` levels.
/// Most levels a scheduler's dimension can have: a cube's level is a
/// byte, so any past these could never be used (and the 2-D limiter
/// makes a queue per pair of levels, up front).
pub const MAX_LEVELS: usize = 256;

/// Most cubes a `qta-mux` policy may list settings for.
pub const MAX_QTA_CUBES: usize = 4096;

fn check_levels(
    policy: &'static str,
    param: &str,
    n: usize,
    cu: &CuMap,
    level: impl Fn(CuCell) -> u8,
) -> Result<(), SchedConfigError> {
    if n > MAX_LEVELS {
        return Err(bad(
            policy,
            param,
            format!("{n} levels; a cube's level is 0 to 255, so at most {MAX_LEVELS}"),
        ));
    }
    let cells = cu.iter().map(|(q, c)| (q.to_string(), c));
    let default = std::iter::once(("(default)".to_string(), cu.default_cell()));
    for (q, c) in cells.chain(default) {
        if usize::from(level(c)) >= n {
            return Err(bad(
                policy,
                param,
                format!(
                    "QoS cube {q} is at level {} but only {n} level(s) are configured",
                    level(c)
                ),
            ));
        }
    }
    Ok(())
}

fn check_qta(c: &QtaMuxConfig, cu: &CuMap) -> Result<(), SchedConfigError> {
    const P: &str = "qta-mux";
    if c.cherish_thresholds.is_empty() {
        return Err(bad(
            P,
            "cherish_thresholds",
            "needs one threshold per cherish level",
        ));
    }
    for (i, &t) in c.cherish_thresholds.iter().enumerate() {
        nonzero(P, &format!("cherish_thresholds[{i}]"), t)?;
    }
    check_levels(
        P,
        "cherish_thresholds",
        c.cherish_thresholds.len(),
        cu,
        |x| x.cherish,
    )?;
    if !(0.0..=1.0).contains(&c.skip_probability) {
        return Err(bad(
            P,
            "skip_probability",
            format!("{} is not within 0..=1", c.skip_probability),
        ));
    }
    nonzero(P, "mgmt_queue_len", c.mgmt_queue_len)?;
    if c.cubes.len() > MAX_QTA_CUBES {
        return Err(bad(
            P,
            "cubes",
            format!("{} cubes listed; at most {MAX_QTA_CUBES}", c.cubes.len()),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, cube) in c.cubes.iter().enumerate() {
        if !seen.insert(cube.qos_id) {
            return Err(bad(
                P,
                format!("cubes[{i}].qos_id"),
                format!("QoS-id {} listed twice", cube.qos_id),
            ));
        }
        if let Some(t) = cube.threshold {
            nonzero(P, &format!("cubes[{i}].threshold"), t)?;
        }
        if let Some(l) = &cube.limit {
            l.check(P, &format!("cubes[{i}].limit"))?;
        }
        nonzero(
            P,
            &format!("cubes[{i}].shaper_queue_len"),
            cube.shaper_queue_len,
        )?;
    }
    Ok(())
}

fn check_rlim(c: &RateLimitConfig, cu: &CuMap) -> Result<(), SchedConfigError> {
    const P: &str = "rate-limit-2d";
    for (dim, levels) in [("urgency", &c.urgency), ("cherish", &c.cherish)] {
        if levels.is_empty() {
            return Err(bad(P, dim, "needs at least one level"));
        }
        for (i, l) in levels.iter().enumerate() {
            if l.max_backlog_bytes == 0 {
                return Err(bad(
                    P,
                    format!("{dim}[{i}].max_backlog_bytes"),
                    "must be above 0",
                ));
            }
        }
        if levels.iter().all(|l| l.rate_bps == 0) {
            return Err(bad(
                P,
                dim,
                "every level has rate 0: nothing could ever be sent",
            ));
        }
    }
    check_levels(P, "urgency", c.urgency.len(), cu, |x| x.urgency)?;
    check_levels(P, "cherish", c.cherish.len(), cu, |x| x.cherish)?;
    nonzero(P, "queue_len", c.queue_len)?;
    nonzero(P, "mgmt_queue_len", c.mgmt_queue_len)?;
    for (i, &t) in c.cherish_thresholds.iter().enumerate() {
        nonzero(P, &format!("cherish_thresholds[{i}]"), t)?;
    }
    Ok(())
}

fn check_ds(c: &DiffServConfig, cu: &CuMap) -> Result<(), SchedConfigError> {
    const P: &str = "diffserv";
    if c.classes.is_empty() {
        return Err(bad(P, "classes", "needs one class per cherish level"));
    }
    for (i, cl) in c.classes.iter().enumerate() {
        if let Some(l) = &cl.limit {
            l.check(P, &format!("classes[{i}].limit"))?;
        }
    }
    check_levels(P, "classes", c.classes.len(), cu, |x| x.cherish)?;
    nonzero(P, "queue_len", c.queue_len)?;
    nonzero(P, "mgmt_queue_len", c.mgmt_queue_len)?;
    Ok(())
}
