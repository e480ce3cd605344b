//! The mappings of `rina-gw` as its command line writes them,
//! `LISTEN=APP` (TCP to RINA) and `APP=ADDR` (RINA to TCP), and as rlite's
//! `rina-gw` configuration file does: a line each, `I2R DIF APP IP PORT`
//! or `R2I DIF APP IP PORT`.

use rina::AppName;
use std::net::{SocketAddr, ToSocketAddrs};
use thiserror::Error;

/// TCP connections accepted on `listen` become flows to `app`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpToRina {
    /// Where to listen for TCP connections.
    pub listen: SocketAddr,
    /// The application each connection's flow goes to.
    pub app: AppName,
    /// The DIF to allocate through (`None`: `--dif`, else the daemon's
    /// choice).
    pub dif: Option<String>,
}

/// Flows allocated to `app` (registered here) become TCP connections to
/// `connect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RinaToTcp {
    /// The name registered.
    pub app: AppName,
    /// Where each flow's TCP connection goes.
    pub connect: SocketAddr,
    /// The DIF to register in (`None`: `--dif`, else every DIF).
    pub dif: Option<String>,
}

/// Why a mapping was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MappingError {
    /// No `=` between the two sides.
    #[error("`{0}` has no `=` between its two sides")]
    NoEquals(String),
    /// The application name is not one.
    #[error("`{name}` is not an application name: {why}")]
    BadName {
        /// The text.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// The address is not `HOST:PORT`, or the host has no address.
    #[error("`{addr}` is not a TCP address (HOST:PORT): {why}")]
    BadAddress {
        /// The text.
        addr: String,
        /// What is wrong with it.
        why: String,
    },
    /// A line of a configuration file is not a mapping.
    #[error("line {line}: {why}")]
    Line {
        /// Its number, from 1.
        line: usize,
        /// What is wrong with it.
        why: String,
    },
}

fn name(s: &str) -> Result<AppName, MappingError> {
    let bad = |why: String| MappingError::BadName {
        name: s.into(),
        why,
    };
    let n: AppName = s.parse().map_err(|e: rina::NameError| bad(e.to_string()))?;
    n.check().map_err(|e| bad(e.to_string()))?;
    Ok(n)
}

/// `HOST:PORT`, the host resolved (its first address).
fn address(s: &str) -> Result<SocketAddr, MappingError> {
    let bad = |why: String| MappingError::BadAddress {
        addr: s.into(),
        why,
    };
    s.to_socket_addrs()
        .map_err(|e| bad(e.to_string()))?
        .next()
        .ok_or_else(|| bad("the host has no address".into()))
}

impl std::str::FromStr for TcpToRina {
    type Err = MappingError;

    /// `LISTEN=APP`: split at the first `=` (an address has none).
    fn from_str(s: &str) -> Result<Self, MappingError> {
        let (l, a) = s
            .split_once('=')
            .ok_or_else(|| MappingError::NoEquals(s.into()))?;
        Ok(TcpToRina {
            listen: address(l)?,
            app: name(a)?,
            dif: None,
        })
    }
}

impl std::str::FromStr for RinaToTcp {
    type Err = MappingError;

    /// `APP=ADDR`: split at the last `=` (a name may hold one).
    fn from_str(s: &str) -> Result<Self, MappingError> {
        let (a, c) = s
            .rsplit_once('=')
            .ok_or_else(|| MappingError::NoEquals(s.into()))?;
        Ok(RinaToTcp {
            app: name(a)?,
            connect: address(c)?,
            dif: None,
        })
    }
}

/// The mappings of a configuration file as rlite's `rina-gw` reads it: a
/// line each, `I2R DIF APP IP PORT` (TCP connections to IP:PORT become
/// flows to APP in DIF) or `R2I DIF APP IP PORT` (APP registered in DIF,
/// its flows become TCP connections to IP:PORT); blank lines and those
/// starting with `#` are passed over. A line that is neither says which.
pub fn parse_rlite(text: &str) -> Result<(Vec<TcpToRina>, Vec<RinaToTcp>), MappingError> {
    let (mut i2r, mut r2i) = (Vec::new(), Vec::new());
    for (k, raw) in text.lines().enumerate() {
        let bad = |why: String| MappingError::Line { line: k + 1, why };
        let words: Vec<&str> = raw.split_whitespace().collect();
        match words.as_slice() {
            [] => {}
            [w, ..] if w.starts_with('#') => {}
            [kind @ ("I2R" | "R2I"), dif, app, ip, port] => {
                // An IPv6 address without its brackets, as rlite writes it.
                let addr = if ip.contains(':') && !ip.starts_with('[') {
                    format!("[{ip}]:{port}")
                } else {
                    format!("{ip}:{port}")
                };
                let (dif, app) = (
                    Some(dif.to_string()),
                    name(app).map_err(|e| bad(e.to_string()))?,
                );
                let addr = address(&addr).map_err(|e| bad(e.to_string()))?;
                if *kind == "I2R" {
                    i2r.push(TcpToRina {
                        listen: addr,
                        app,
                        dif,
                    });
                } else {
                    r2i.push(RinaToTcp {
                        app,
                        connect: addr,
                        dif,
                    });
                }
            }
            [kind @ ("I2R" | "R2I"), ..] => {
                return Err(bad(format!(
                    "`{kind}` takes four words, DIF APP IP PORT, not {}",
                    words.len() - 1
                )))
            }
            [w, ..] => {
                return Err(bad(format!(
                    "`{w}` is not a mapping (I2R DIF APP IP PORT, or R2I DIF APP IP PORT)"
                )))
            }
        }
    }
    Ok((i2r, r2i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_kinds_parse_and_bad_ones_say_what_is_wrong() {
        let t: TcpToRina = "127.0.0.1:8080=web/1".parse().unwrap();
        assert_eq!(t.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(t.app.to_string(), "web/1");
        let r: RinaToTcp = "a=b=127.0.0.1:22".parse().unwrap();
        assert_eq!(r.app.process_name, "a=b");
        assert_eq!(r.connect.port(), 22);
        assert_eq!(
            "web".parse::<RinaToTcp>(),
            Err(MappingError::NoEquals("web".into()))
        );
        let e = "127.0.0.1=web".parse::<TcpToRina>().unwrap_err();
        assert!(matches!(e, MappingError::BadAddress { .. }), "{e}");
        let e = "127.0.0.1:1=".parse::<TcpToRina>().unwrap_err();
        assert!(matches!(e, MappingError::BadName { .. }), "{e}");
        let e = "a b=127.0.0.1:1".parse::<RinaToTcp>().unwrap_err();
        assert!(
            e.to_string().contains("`a b` is not an application name"),
            "{e}"
        );
        let e = "web=127.0.0.1:99999".parse::<RinaToTcp>().unwrap_err();
        assert!(matches!(e, MappingError::BadAddress { .. }), "{e}");
    }

    #[test]
    fn rlite_s_configuration_file_reads_and_bad_lines_are_named() {
        let text = "# rina-gw.conf\n\nI2R n.DIF web 127.0.0.1 8080\n  R2I udp.DIF ssh/1 ::1 22 \n";
        let (i2r, r2i) = parse_rlite(text).unwrap();
        assert_eq!(
            i2r,
            [TcpToRina {
                listen: "127.0.0.1:8080".parse().unwrap(),
                app: name("web").unwrap(),
                dif: Some("n.DIF".into()),
            }]
        );
        assert_eq!(r2i.len(), 1);
        assert_eq!(r2i[0].connect, "[::1]:22".parse().unwrap());
        assert_eq!(
            (r2i[0].app.to_string(), r2i[0].dif.as_deref()),
            ("ssh/1".into(), Some("udp.DIF"))
        );
        let line = |t: &str| parse_rlite(t).unwrap_err().to_string();
        assert_eq!(
            line("# ok\nI2R n.DIF web 127.0.0.1"),
            "line 2: `I2R` takes four words, DIF APP IP PORT, not 3"
        );
        assert!(line("X2Y a b c d").starts_with("line 1: `X2Y` is not a mapping"));
        assert!(line("R2I d web 127.0.0.1 http").contains("is not a TCP address"));
    }
}
