//! Quantities as people write them in experiment files: rates (`"100Mbps"`,
//! `"1Gbps"`, `2.5e6`), durations (`"10ms"`, `"1.5s"`, `"2m"`) and
//! probabilities. Each parses from a string or a bare number and says what
//! it expected when it cannot.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::time::Duration;

/// A bit rate. A bare number is bit/s.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub struct Rate(pub f64);

impl Rate {
    /// Bit/s.
    pub fn bps(self) -> f64 {
        self.0
    }
}

/// A duration. A bare number is seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct Dur(pub Duration);

impl Dur {
    /// The duration.
    pub fn get(self) -> Duration {
        self.0
    }
}

fn split_number(s: &str) -> Option<(f64, &str)> {
    let s = s.trim();
    let end = s
        .char_indices()
        .find(|&(i, c)| {
            !(c.is_ascii_digit()
                || c == '.'
                || ((c == 'e' || c == 'E')
                    && s[i + 1..].starts_with(|d: char| d.is_ascii_digit() || d == '-'))
                || ((c == '-' || c == '+') && i > 0 && matches!(&s[i - 1..i], "e" | "E")))
        })
        .map(|(i, _)| i)
        .unwrap_or(s.len());
    let n: f64 = s[..end].parse().ok()?;
    Some((n, s[end..].trim()))
}

/// Parses a rate: a number followed by `bps`, `kbps`, `Mbps`, `Gbps` (also
/// `b/s`, `kb/s`, `Mb/s`, `Gb/s`, `k`, `M`, `G`), or nothing (bit/s).
pub fn parse_rate(s: &str) -> Result<Rate, String> {
    let bad =
        || format!("`{s}` is not a rate (write e.g. \"100Mbps\", \"1Gbps\" or bits per second)");
    let (n, unit) = split_number(s).ok_or_else(bad)?;
    let mult = match unit {
        "" | "bps" | "b/s" => 1.0,
        "k" | "kbps" | "kb/s" | "Kbps" => 1e3,
        "M" | "Mbps" | "Mb/s" | "mbps" => 1e6,
        "G" | "Gbps" | "Gb/s" | "gbps" => 1e9,
        _ => return Err(bad()),
    };
    if !(n.is_finite() && n >= 0.0) {
        return Err(bad());
    }
    Ok(Rate(n * mult))
}

/// Parses a duration: a number followed by `ns`, `us`, `ms`, `s`, `m` or
/// `h`, or nothing (seconds).
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
    if !(secs.is_finite() && secs >= 0.0) {
        return Err(bad());
    }
    Ok(Dur(Duration::from_secs_f64(secs)))
}

#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrStr {
    Int(i64),
    Float(f64),
    Str(String),
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match NumOrStr::deserialize(d)? {
            NumOrStr::Int(i) if i >= 0 => Ok(Rate(i as f64)),
            NumOrStr::Float(f) if f.is_finite() && f >= 0.0 => Ok(Rate(f)),
            NumOrStr::Str(s) => parse_rate(&s).map_err(serde::de::Error::custom),
            _ => Err(serde::de::Error::custom("a rate cannot be negative")),
        }
    }
}

impl Serialize for Rate {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b >= 1e9 && (b / 1e9).fract() == 0.0 {
            write!(f, "{}Gbps", b / 1e9)
        } else if b >= 1e6 {
            write!(f, "{}Mbps", b / 1e6)
        } else if b >= 1e3 {
            write!(f, "{}kbps", b / 1e3)
        } else {
            write!(f, "{b}bps")
        }
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match NumOrStr::deserialize(d)? {
            NumOrStr::Int(i) if i >= 0 => Ok(Dur(Duration::from_secs(i as u64))),
            NumOrStr::Float(f) if f.is_finite() && f >= 0.0 => Ok(Dur(Duration::from_secs_f64(f))),
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
    fn rates_parse_with_units() {
        assert_eq!(parse_rate("100Mbps").unwrap().bps(), 100e6);
        assert_eq!(parse_rate("1 Gbps").unwrap().bps(), 1e9);
        assert_eq!(parse_rate("64kb/s").unwrap().bps(), 64e3);
        assert_eq!(parse_rate("2.5e6").unwrap().bps(), 2.5e6);
        assert!(parse_rate("fast")
            .unwrap_err()
            .contains("`fast` is not a rate"));
        assert!(parse_rate("10 furlongs").is_err());
    }

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
    fn display_round_trips() {
        for s in ["1Gbps", "100Mbps", "64kbps"] {
            assert_eq!(parse_rate(s).unwrap().to_string(), s);
        }
        for s in ["10ms", "2s", "250us"] {
            assert_eq!(parse_duration(s).unwrap().to_string(), s);
        }
    }
}
