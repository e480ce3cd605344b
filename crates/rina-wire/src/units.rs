//! Quantities as people write them in configuration files: bit rates
//! (`"100Mbps"`, `"1Gbps"`, `2.5e6`). Shared by `rinad`'s configuration and
//! `rina-lab`'s experiment files, so a rate means the same in both.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A bit rate. A bare number is bit/s.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub struct Rate(pub f64);

impl Rate {
    /// Bit/s.
    pub fn bps(self) -> f64 {
        self.0
    }
}

/// Splits `"10 Mbps"` into the number and the unit that follows it.
pub fn split_number(s: &str) -> Option<(f64, &str)> {
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

/// A number or a string, as a quantity may be written.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum NumOrStr {
    /// A whole number.
    Int(i64),
    /// A number with a fraction.
    Float(f64),
    /// A number with a unit.
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
}
