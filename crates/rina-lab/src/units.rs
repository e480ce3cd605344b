//! Quantities as people write them in experiment files: rates (`"100Mbps"`,
//! `"1Gbps"`, `2.5e6`), durations (`"10ms"`, `"1.5s"`, `"2m"`) and
//! probabilities. Each parses from a string or a bare number and says what
//! it expected when it cannot.

pub use rina_wire::units::{parse_rate, Rate};
use rina_wire::units::{split_number, NumOrStr};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::time::Duration;

/// A duration. A bare number is seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct Dur(pub Duration);

impl Dur {
    /// The duration.
    pub fn get(self) -> Duration {
        self.0
    }
}

/// The longest duration an experiment file takes: a year (8760 h). Every
/// time of an experiment (its length, a link's delay, an event, a period)
/// is far below it, and times stay far from `Duration`'s limit when a run
/// is dilated or lengthened.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// `secs` as a duration, if it is a number of seconds between 0 and
/// [`MAX_DURATION`]; `written` is how it was written, for the error.
fn checked_secs(secs: f64, written: &str) -> Result<Dur, String> {
    if !(secs.is_finite() && secs >= 0.0) {
        return Err(format!(
            "`{written}` is not a duration (write e.g. \"10ms\", \"1.5s\", \"2m\")"
        ));
    }
    match Duration::try_from_secs_f64(secs) {
        Ok(d) if d <= MAX_DURATION => Ok(Dur(d)),
        _ => Err(format!(
            "`{written}` is longer than a year (8760h), the longest duration an \
             experiment takes"
        )),
    }
}

/// Parses a duration: a number followed by `ns`, `us`, `ms`, `s`, `m` or
/// `h`, or nothing (seconds), at most [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Dur, String> {
    let bad = || format!("`{s}` is not a duration (write e.g. \"10ms\", \"1.5s\", \"2m\")");
    let (n, unit) = split_number(s).ok_or_else(bad)?;
    let secs = match unit {
        "ns" => n * 1e-9,
        "us" | "µs" => n * 1e-6,
        "ms" => n * 1e-3,
        "" | "s" => n,
        "m" | "min" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(bad()),
    };
    checked_secs(secs, s)
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match NumOrStr::deserialize(d)? {
            NumOrStr::Int(i) if i >= 0 => {
                checked_secs(i as f64, &i.to_string()).map_err(serde::de::Error::custom)
            }
            NumOrStr::Float(f) if f.is_finite() && f >= 0.0 => {
                // 1e20 as written, not its 21 digits.
                let written = if f >= 1e6 {
                    format!("{f:e}")
                } else {
                    f.to_string()
                };
                checked_secs(f, &written).map_err(serde::de::Error::custom)
            }
            NumOrStr::Str(s) => parse_duration(&s).map_err(serde::de::Error::custom),
            _ => Err(serde::de::Error::custom("a duration cannot be negative")),
        }
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl fmt::Display for Dur {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        if ns == 0 {
            write!(f, "0s")
        } else if ns.is_multiple_of(1_000_000_000) {
            write!(f, "{}s", ns / 1_000_000_000)
        } else if ns.is_multiple_of(1_000_000) {
            write!(f, "{}ms", ns / 1_000_000)
        } else if ns.is_multiple_of(1_000) {
            write!(f, "{}us", ns / 1_000)
        } else {
            write!(f, "{ns}ns")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(
            parse_duration("10ms").unwrap().get(),
            Duration::from_millis(10)
        );
        assert_eq!(
            parse_duration("1.5s").unwrap().get(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            parse_duration("2m").unwrap().get(),
            Duration::from_secs(120)
        );
        assert_eq!(
            parse_duration("250us").unwrap().get(),
            Duration::from_micros(250)
        );
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn durations_past_a_year_are_refused_not_a_panic() {
        // Duration::from_secs_f64 panicked on 1e20 s (above u64::MAX s).
        for s in ["1e20s", "1e20", "1e300h", "8761h"] {
            let e = parse_duration(s).unwrap_err();
            assert!(e.contains(&format!("`{s}` is longer than a year")), "{e}");
        }
        assert_eq!(parse_duration("8760h").unwrap().get(), MAX_DURATION);
        type Map = std::collections::BTreeMap<String, Dur>;
        for (text, written) in [
            ("d = 1e20", "1e20"),
            ("d = 31536001", "31536001"),
            ("d = 9223372036854775807", "9223372036854775807"),
        ] {
            let e = toml::from_str::<Map>(text).unwrap_err().to_string();
            assert!(
                e.contains(&format!("`{written}` is longer than a year")),
                "{text}: {e}"
            );
        }
        let ok = toml::from_str::<Map>("d = 31536000").unwrap();
        assert_eq!(ok["d"].get(), MAX_DURATION);
    }

    #[test]
    fn display_round_trips() {
        for s in ["1Gbps", "100Mbps", "64kbps"] {
            assert_eq!(parse_rate(s).unwrap().to_string(), s);
        }
        for s in ["10ms", "2s", "250us"] {
            assert_eq!(parse_duration(s).unwrap().to_string(), s);
        }
    }
}
