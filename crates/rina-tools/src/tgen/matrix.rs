//! The traffic matrix: a TOML file listing the flows one client process
//! runs, so that many flows need few processes.
//!
//! ```toml
//! seed = 42                 # optional: base seed of every flow's generators
//! dif = "net"               # optional: default DIF of the flows
//!
//! [[flow]]
//! peer = "tgen"             # application name of the rina-tgen server
//! profile = "voip"          # a profile name (rina-tgen profiles)
//! count = 5                 # optional: this many identical flows (default 1;
//!                           #   at most MAX_FLOWS in the whole file)
//! start_s = 0.0             # optional: start, s after the process starts (at most 1e9)
//! duration_s = 600          # optional (default 10; at most 1e9)
//! direction = "bidirectional"   # or "forward", "reverse"
//! # optional overrides: rate_bps, size, on_s, off_s
//! # optional QoS cube: max_delay_ms, max_loss_ppm, bandwidth_bps,
//! #   in_order, reliable, max_sdu_gap, max_sdu, qos_cube; dif = "..."
//! ```

use super::gen::SourceSpec;
use super::Direction;
use crate::opts::{QosArgs, MAX_SECONDS};
use serde::Deserialize;

/// The most flows a matrix expands to, every entry's `count` together (as
/// many as a rina-lab experiment may hold).
pub const MAX_FLOWS: usize = 100_000;

/// A parsed matrix file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Matrix {
    /// Base seed; flow `i` draws from `seed + i`.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Default DIF.
    #[serde(default)]
    pub dif: Option<String>,
    /// The flows.
    #[serde(default, rename = "flow")]
    pub flows: Vec<MatrixFlow>,
}

/// One `[[flow]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatrixFlow {
    /// Server's application name.
    pub peer: String,
    /// Profile name.
    pub profile: String,
    /// Rate override, bit/s.
    #[serde(default)]
    pub rate_bps: Option<f64>,
    /// Size override, bytes.
    #[serde(default)]
    pub size: Option<usize>,
    /// ON mean override, s.
    #[serde(default)]
    pub on_s: Option<f64>,
    /// OFF mean override, s.
    #[serde(default)]
    pub off_s: Option<f64>,
    /// Copies of this flow.
    #[serde(default = "one")]
    pub count: u32,
    /// Start, s from the process start.
    #[serde(default)]
    pub start_s: f64,
    /// Length, s.
    #[serde(default = "ten")]
    pub duration_s: f64,
    /// Direction.
    #[serde(default)]
    pub direction: Direction,
    /// DIF of this flow.
    #[serde(default)]
    pub dif: Option<String>,
    /// QoS cube: max one-way delay, ms.
    #[serde(default)]
    pub max_delay_ms: Option<f64>,
    /// QoS cube: max loss, ppm.
    #[serde(default)]
    pub max_loss_ppm: Option<u32>,
    /// QoS cube: average bandwidth, bit/s.
    #[serde(default)]
    pub bandwidth_bps: Option<u64>,
    /// QoS cube: in-order delivery.
    #[serde(default)]
    pub in_order: bool,
    /// QoS cube: reliable delivery.
    #[serde(default)]
    pub reliable: bool,
    /// QoS cube: max consecutive losses.
    #[serde(default)]
    pub max_sdu_gap: Option<u32>,
    /// QoS cube: largest SDU.
    #[serde(default)]
    pub max_sdu: Option<u32>,
    /// QoS cube asked for by its QoS-id.
    #[serde(default)]
    pub qos_cube: Option<u64>,
    /// Seed of this entry's first flow (the next copies take the next
    /// seeds); default: the file's seed plus the flow's number. A seed
    /// above a TOML integer's 2^63 - 1 is written as a string.
    #[serde(default, deserialize_with = "seed")]
    pub seed: Option<u64>,
}

/// A seed: a TOML integer, or a string for the 64-bit seeds TOML cannot
/// hold as integers.
fn seed<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Seed {
        Int(u64),
        Text(String),
    }
    match Seed::deserialize(d)? {
        Seed::Int(x) => Ok(Some(x)),
        Seed::Text(t) => t
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("seed {t:?} is not a 64-bit number"))),
    }
}

fn one() -> u32 {
    1
}

fn ten() -> f64 {
    10.0
}

/// One flow to run, after expanding `count`.
#[derive(Debug, Clone)]
pub struct FlowPlan {
    /// Flow id (1, 2, ... in file order).
    pub flow: u32,
    /// Server name.
    pub peer: String,
    /// DIF, if any.
    pub dif: Option<String>,
    /// Source.
    pub source: SourceSpec,
    /// QoS.
    pub qos: QosArgs,
    /// Start, s.
    pub start_s: f64,
    /// Length, s.
    pub duration_s: f64,
    /// Direction.
    pub direction: Direction,
    /// Seed of the forward generator (the reverse one uses `!seed`).
    pub seed: u64,
}

impl Matrix {
    /// Parses a matrix.
    pub fn parse(text: &str) -> Result<Matrix, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// The flows, `count` expanded, checked; `default_seed` unless the file has one.
    pub fn plans(
        &self,
        default_seed: u64,
        default_dif: Option<&str>,
    ) -> Result<Vec<FlowPlan>, String> {
        let base = self.seed.unwrap_or(default_seed);
        let mut out = Vec::new();
        for (i, f) in self.flows.iter().enumerate() {
            let first = out.len() as u32 + 1;
            let source = SourceSpec {
                profile: f.profile.clone(),
                rate_bps: f.rate_bps,
                size: f.size,
                on_s: f.on_s,
                off_s: f.off_s,
            };
            let profile = source
                .profile()
                .map_err(|e| format!("flow entry {}: {e}", i + 1))?;
            if let Some(m) = f.max_sdu.filter(|&m| (m as usize) < profile.max_size()) {
                return Err(format!(
                    "flow entry {} (peer {}): max_sdu = {m} is less than the SDUs of {} bytes its profile writes",
                    i + 1,
                    f.peer,
                    profile.max_size()
                ));
            }
            if !(f.start_s.is_finite() && (0.0..=MAX_SECONDS).contains(&f.start_s)) {
                return Err(format!(
                    "flow entry {} (peer {}): start_s = {} is not a time: it must be 0 or more seconds after the start, at most {MAX_SECONDS:e}",
                    i + 1,
                    f.peer,
                    f.start_s
                ));
            }
            if !(f.duration_s.is_finite() && f.duration_s > 0.0 && f.duration_s <= MAX_SECONDS) {
                return Err(format!(
                    "flow entry {} (peer {}): duration_s = {} is not a length of time: it must be more than 0 seconds, at most {MAX_SECONDS:e}",
                    i + 1,
                    f.peer,
                    f.duration_s
                ));
            }
            if let Some(d) = f.max_delay_ms.filter(|d| !(d.is_finite() && *d >= 0.0)) {
                return Err(format!(
                    "flow entry {} (peer {}): max_delay_ms = {d} is not a delay: it must be 0 or more milliseconds",
                    i + 1,
                    f.peer
                ));
            }
            let total = out.len() as u64 + u64::from(f.count);
            if total > MAX_FLOWS as u64 {
                return Err(format!(
                    "flow entry {} (peer {}): count = {} makes {total} flows, more than the {MAX_FLOWS} a matrix may hold",
                    i + 1,
                    f.peer,
                    f.count
                ));
            }
            out.reserve(f.count as usize);
            for _ in 0..f.count {
                let flow = out.len() as u32 + 1;
                out.push(FlowPlan {
                    flow,
                    peer: f.peer.clone(),
                    dif: f
                        .dif
                        .clone()
                        .or_else(|| self.dif.clone())
                        .or_else(|| default_dif.map(str::to_owned)),
                    source: source.clone(),
                    qos: QosArgs {
                        max_delay_ms: f.max_delay_ms,
                        max_loss_ppm: f.max_loss_ppm,
                        bandwidth_bps: f.bandwidth_bps,
                        in_order: f.in_order,
                        reliable: f.reliable,
                        max_sdu_gap: f.max_sdu_gap,
                        max_sdu: f.max_sdu,
                        qos_cube: f.qos_cube,
                    },
                    start_s: f.start_s,
                    duration_s: f.duration_s,
                    direction: f.direction,
                    seed: match f.seed {
                        Some(s) => s.wrapping_add(u64::from(flow - first)),
                        None => base.wrapping_add(flow as u64),
                    },
                });
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_003_table_i_in_one_file() {
        let text = r#"
seed = 7
dif = "spn"
[[flow]]
peer = "tgen"
profile = "hd-video-call"
count = 15
duration_s = 600
reliable = true
[[flow]]
peer = "tgen"
profile = "online-gaming"
count = 15
[[flow]]
peer = "tgen"
profile = "voip"
count = 15
direction = "forward"
[[flow]]
peer = "tgen"
profile = "file-sharing"
count = 15
dif = "other"
[[flow]]
peer = "tgen"
profile = "interactive"
count = 15
start_s = 1.5
size = 500
seed = 1000
[[flow]]
peer = "tgen"
profile = "voip"
seed = "17388166129998380965"
"#;
        let p = Matrix::parse(text).unwrap().plans(0, None).unwrap();
        assert_eq!(p.len(), 76);
        assert_eq!(p[0].flow, 1);
        assert_eq!(p[74].flow, 75);
        assert_eq!(p[75].seed, 17388166129998380965);
        assert!(p[0].qos.reliable && p[0].qos.spec().reliable);
        assert_eq!(p[0].duration_s, 600.0);
        assert_eq!(p[0].dif.as_deref(), Some("spn"));
        assert_eq!(p[45].dif.as_deref(), Some("other"));
        assert_eq!(p[30].direction, Direction::Forward);
        assert_eq!(p[15].direction, Direction::Bidirectional);
        assert_eq!(p[74].source.size, Some(500));
        assert_eq!(p[3].seed, 11);
        assert_eq!((p[60].seed, p[74].seed), (1000, 1014));
        assert!(Matrix::parse("[[flow]]\npeer = \"x\"\nprofile = \"nope\"")
            .unwrap()
            .plans(0, None)
            .is_err());
        assert!(Matrix::parse("bogus = 1").is_err());
        assert!(Matrix::parse("[[flow]]\npeer = \"x\"\nprofile = \"cbr\"\nseed = \"-1\"").is_err());
    }

    #[test]
    fn a_matrix_of_too_many_flows_is_refused_naming_the_entry() {
        let m = |counts: &[u64]| {
            let mut t = String::new();
            for c in counts {
                t += &format!("[[flow]]\npeer = \"tgen\"\nprofile = \"voip\"\ncount = {c}\n");
            }
            Matrix::parse(&t).unwrap().plans(1, None)
        };
        // Four billion flows were expanded until memory ran out.
        let e = m(&[4_000_000_000]).unwrap_err();
        assert!(
            e.contains("flow entry 1 (peer tgen): count = 4000000000 makes 4000000000 flows, more than the 100000"),
            "{e}"
        );
        let e = m(&[60_000, 40_001]).unwrap_err();
        assert!(
            e.contains("flow entry 2 (peer tgen): count = 40001 makes 100001"),
            "{e}"
        );
        let p = m(&[60_000, 40_000]).unwrap();
        assert_eq!((p.len(), p[99_999].flow), (100_000, 100_000));
    }

    #[test]
    fn a_bad_start_or_duration_is_named_with_its_value() {
        let m = |extra: &str| {
            Matrix::parse(&format!(
                "[[flow]]\npeer = \"tgen\"\nprofile = \"voip\"\n{extra}"
            ))
            .unwrap()
            .plans(1, None)
            .unwrap_err()
        };
        let e = m("start_s = -1.0");
        assert!(e.contains("flow entry 1 (peer tgen): start_s = -1"), "{e}");
        let e = m("duration_s = 0.0");
        assert!(e.contains("duration_s = 0 is not a length of time"), "{e}");
        // Beyond MAX_SECONDS: the client's clock arithmetic panicked.
        let e = m("start_s = 1e20");
        assert!(
            e.contains("start_s = 100000000000000000000 is not a time") && e.contains("1e9"),
            "{e}"
        );
        let e = m("duration_s = 1e19");
        assert!(
            e.contains("duration_s = 10000000000000000000 is not"),
            "{e}"
        );
        let p = Matrix::parse(
            "[[flow]]\npeer = \"t\"\nprofile = \"voip\"\nstart_s = 1e9\nduration_s = 1e9",
        )
        .unwrap()
        .plans(1, None)
        .unwrap();
        assert_eq!((p[0].start_s, p[0].duration_s), (1e9, 1e9));
        // A max_sdu below the profile's SDUs was asked of the DIF, and
        // larger SDUs written all the same.
        let e = m("max_sdu = 100");
        assert!(
            e.contains("max_sdu = 100 is less than the SDUs of 160 bytes"),
            "{e}"
        );
        // A negative delay bound was taken as 0 ms.
        let e = m("max_delay_ms = -5.0");
        assert!(e.contains("max_delay_ms = -5 is not a delay"), "{e}");
        // ON and OFF periods of a source without them were dropped.
        let e = Matrix::parse("[[flow]]\npeer = \"tgen\"\nprofile = \"cbr\"\non_s = 2.0")
            .unwrap()
            .plans(1, None)
            .unwrap_err();
        assert!(
            e.contains("flow entry 1: profile cbr has no ON and OFF periods, so on_s"),
            "{e}"
        );
    }
}
