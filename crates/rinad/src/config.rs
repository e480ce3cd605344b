//! The daemon's configuration file.
//!
//! One TOML file per system names the system and declares its IPC processes.
//! Unknown keys and bad values are refused with a message that names the key
//! and the line (the `toml` crate reports both for everything serde checks;
//! checks made after parsing report the line of the offending IPCP).
//!
//! ```toml
//! [system]
//! name = "alpha"
//! # socket = "/tmp/alpha.sock"     # default: see rina_wire::ctl::default_socket_path
//!
//! [[ipcp]]
//! name = "alpha.udp"
//! type = "shim-udp"
//! dif = "udp.net"
//! bind = "127.0.0.1:7001"
//! # max_sdu = 1400
//!
//! [ipcp.directory]               # application name -> UDP address of its shim
//! "echo" = "127.0.0.1:7002"
//! "beta.net" = "127.0.0.1:7002"   # the neighbour normal IPCP, reached over this shim
//!
//! [[ipcp]]
//! name = "alpha.net"              # also its application name in the N-1 DIFs
//! type = "normal"
//! dif = "net"
//! address = 1
//! # max_pdu = 9000                # largest PDU (default 9000); larger SDUs are fragmented
//! # max_sdu = 65536
//! # crc = false                   # CRC-32 on every PDU
//! # ttl = 64                      # hop limit
//!
//! [[ipcp.neighbor]]               # an N-1 flow to set up and keep up
//! name = "beta.net"               # the neighbour IPCP's name
//! over = "udp.net"                # the N-1 DIF that reaches it
//! address = 2                     # its address in this DIF
//!
//! # routing = "link-state"        # or "static" (default): use the table below
//! # directory_mode = "distributed" # or "static" (default): only the names table
//!
//! [ipcp.routes]                   # destination address -> next-hop address (a neighbour)
//! "3" = 2
//!
//! [ipcp.names]                    # application name -> address (static directory)
//! "echo" = 2
//! ```
//!
//! Layer management (enrollment, routing, the directory) will fill the last
//! three tables by itself; until then they are written by hand.

use rina_wire::AppName;
use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use thiserror::Error;
use toml::Spanned;

/// Default path of the configuration file.
pub const DEFAULT_CONFIG: &str = "/etc/rina/rinad.toml";

/// Why a configuration could not be loaded.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The TOML is malformed, or a key is unknown, missing or has a bad value.
    #[error("{path}: {message}")]
    Syntax { path: PathBuf, message: String },
    /// The file parses but describes something that cannot be built.
    #[error("{path}: line {line}: key `{key}`: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        key: String,
        message: String,
    },
}

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// This system.
    pub system: System,
    /// Its IPC processes.
    #[serde(default, rename = "ipcp")]
    pub ipcps: Vec<IpcpConfig>,
}

/// The `[system]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct System {
    /// Name of the system (used in logs and listings).
    pub name: String,
    /// Path of the control socket.
    pub socket: Option<PathBuf>,
}

/// Kinds of IPC process this daemon can host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum IpcpKind {
    /// The shim DIF over UDP.
    #[serde(rename = "shim-udp")]
    ShimUdp,
    /// A normal IPC process.
    #[serde(rename = "normal")]
    Normal,
}

/// How a normal IPCP fills its forwarding table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum RoutingKind {
    /// From the `routes` table of the file (and direct neighbours).
    #[default]
    #[serde(rename = "static")]
    Static,
    /// Link-state routing with the neighbours (the `routes` table is ignored).
    #[serde(rename = "link-state")]
    LinkState,
}

/// Where a normal IPCP learns which member holds an application name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum DirectoryMode {
    /// Only from the `names` table of the file (and local registrations).
    #[default]
    #[serde(rename = "static")]
    Static,
    /// Also from registrations disseminated through the DIF.
    #[serde(rename = "distributed")]
    Distributed,
}

/// A neighbour of a normal IPCP: an N-1 flow the daemon sets up and keeps up.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NeighborConfig {
    /// The neighbour IPCP's application name in the N-1 DIF.
    pub name: AppName,
    /// The N-1 DIF that reaches it: a shim DIF or another normal DIF of
    /// this system (stacking).
    pub over: Spanned<String>,
    /// Its address in this DIF.
    pub address: u64,
}

/// One `[[ipcp]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IpcpConfig {
    /// Name of the IPC process, unique in the system.
    pub name: Spanned<String>,
    /// Its kind.
    #[serde(rename = "type")]
    pub kind: IpcpKind,
    /// The DIF it belongs to.
    pub dif: String,
    /// shim-udp: local UDP address to bind.
    pub bind: Option<SocketAddr>,
    /// Largest SDU, in bytes.
    pub max_sdu: Option<Spanned<u32>>,
    /// shim-udp: where each application name lives.
    #[serde(default)]
    pub directory: BTreeMap<AppName, SocketAddr>,
    /// normal: this IPCP's address in its DIF.
    pub address: Option<u64>,
    /// normal: largest PDU, in bytes.
    pub max_pdu: Option<Spanned<u32>>,
    /// normal: CRC-32 on every PDU.
    pub crc: Option<bool>,
    /// normal: initial hop limit (0 turns TTL off).
    pub ttl: Option<u8>,
    /// normal: the N-1 flows to set up.
    #[serde(default, rename = "neighbor")]
    pub neighbors: Vec<NeighborConfig>,
    /// normal: destination address -> next-hop address.
    #[serde(default)]
    pub routes: BTreeMap<String, u64>,
    /// normal: application name -> address of the IPCP where it is registered.
    #[serde(default)]
    pub names: BTreeMap<AppName, u64>,
    /// normal: how the forwarding table is filled.
    pub routing: Option<RoutingKind>,
    /// normal: whether registrations are disseminated through the DIF.
    pub directory_mode: Option<DirectoryMode>,
}

impl Config {
    /// Reads and checks a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parses and checks configuration text; `path` is only used in messages.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_string(),
        })?;
        let invalid =
            |span: std::ops::Range<usize>, key: String, message: String| ConfigError::Invalid {
                path: path.to_owned(),
                line: line_of(text, span.start),
                key,
                message,
            };
        let mut names = HashSet::new();
        for (i, ip) in cfg.ipcps.iter().enumerate() {
            if ip.name.get_ref().is_empty() {
                return Err(invalid(
                    ip.name.span(),
                    format!("ipcp[{i}].name"),
                    "must not be empty".into(),
                ));
            }
            if !names.insert(ip.name.get_ref().clone()) {
                return Err(invalid(
                    ip.name.span(),
                    format!("ipcp[{i}].name"),
                    format!("a second IPCP is named {:?}", ip.name.get_ref()),
                ));
            }
            let key = |k: &str| format!("ipcp[{i}].{k}");
            if ip.kind == IpcpKind::ShimUdp && ip.bind.is_none() {
                return Err(invalid(
                    ip.name.span(),
                    key("bind"),
                    "a shim-udp IPCP needs `bind = \"host:port\"`".into(),
                ));
            }
            if ip.kind == IpcpKind::Normal {
                if ip.address.is_none_or(|a| a == 0) {
                    return Err(invalid(
                        ip.name.span(),
                        key("address"),
                        "a normal IPCP needs `address = N` (N > 0)".into(),
                    ));
                }
                if ip.bind.is_some() || !ip.directory.is_empty() {
                    return Err(invalid(
                        ip.name.span(),
                        key("bind/directory"),
                        "`bind` and `directory` are for shim-udp IPCPs; a normal IPCP has `names` and `neighbor`".into(),
                    ));
                }
                if let Some(m) = &ip.max_pdu {
                    if !(64..=65_000).contains(m.get_ref()) {
                        return Err(invalid(
                            m.span(),
                            key("max_pdu"),
                            format!("must be between 64 and 65000, not {}", m.get_ref()),
                        ));
                    }
                }
                for (k, n) in ip.neighbors.iter().enumerate() {
                    let over = n.over.get_ref();
                    let found = cfg.ipcps.iter().any(|o| &o.dif == over && o.dif != ip.dif);
                    if !found {
                        return Err(invalid(
                            n.over.span(),
                            format!("ipcp[{i}].neighbor[{k}].over"),
                            format!("no other IPCP of this system is in DIF {over:?}"),
                        ));
                    }
                }
                for dst in ip.routes.keys() {
                    if dst.parse::<u64>().is_err() {
                        return Err(invalid(
                            ip.name.span(),
                            key("routes"),
                            format!("route destinations are addresses (numbers), not {dst:?}"),
                        ));
                    }
                }
            } else if ip.address.is_some()
                || !ip.neighbors.is_empty()
                || !ip.names.is_empty()
                || ip.routing.is_some()
                || ip.directory_mode.is_some()
            {
                return Err(invalid(
                    ip.name.span(),
                    key("address/neighbor/names/routing/directory_mode"),
                    "`address`, `neighbor`, `names`, `routing` and `directory_mode` are for normal IPCPs".into(),
                ));
            }
            if let Some(m) = &ip.max_sdu {
                let max = rina_core::shim_udp::DEFAULT_MAX_SDU;
                if *m.get_ref() == 0 || *m.get_ref() > max {
                    return Err(invalid(
                        m.span(),
                        format!("ipcp[{i}].max_sdu"),
                        format!("must be between 1 and {max}, not {}", m.get_ref()),
                    ));
                }
            }
        }
        Ok(cfg)
    }
}

/// The 1-based line of byte offset `pos` in `text`.
fn line_of(text: &str, pos: usize) -> usize {
    text.as_bytes()[..pos.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("t.toml"), s)
    }

    const GOOD: &str = r#"
[system]
name = "alpha"

[[ipcp]]
name = "a.udp"
type = "shim-udp"
dif = "udp"
bind = "127.0.0.1:7001"

[ipcp.directory]
"echo" = "127.0.0.1:7002"
"perf//x" = "[::1]:7003"
"#;

    #[test]
    fn good_file_parses() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.system.name, "alpha");
        assert_eq!(c.ipcps.len(), 1);
        assert_eq!(c.ipcps[0].directory.len(), 2);
        assert!(c.ipcps[0].directory[&"perf//x".parse().unwrap()].is_ipv6());
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let bad = GOOD.replace("bind =", "bnd =");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("line 9"), "{e}");
        assert!(e.contains("bnd"), "{e}");
    }

    #[test]
    fn bad_value_names_line() {
        let bad = GOOD.replace("127.0.0.1:7002", "nowhere");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("line 12"), "{e}");
        let bad = GOOD.replace("\"shim-udp\"", "\"shim-usb\"");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("line 7") && e.contains("shim-usb"), "{e}");
    }

    #[test]
    fn semantic_errors_name_key_and_line() {
        let bad = GOOD.replace("bind = \"127.0.0.1:7001\"\n", "");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("line 6") && e.contains("ipcp[0].bind"), "{e}");
        let bad = format!("{GOOD}\n[[ipcp]]\nname = \"a.udp\"\ntype = \"shim-udp\"\ndif = \"x\"\nbind = \"127.0.0.1:1\"\n");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("line 16") && e.contains("second IPCP"), "{e}");
        let bad = GOOD.replace("bind =", "max_sdu = 0\nbind =");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("line 9") && e.contains("max_sdu"), "{e}");
    }

    #[test]
    fn missing_system_is_refused() {
        let e = parse("[[ipcp]]\nname='x'\n").unwrap_err().to_string();
        assert!(e.contains("system") || e.contains("type"), "{e}");
    }
}

#[cfg(test)]
mod normal_tests {
    use super::*;

    const TWO: &str = r#"
[system]
name = "alpha"

[[ipcp]]
name = "a.udp"
type = "shim-udp"
dif = "udp"
bind = "127.0.0.1:7001"

[ipcp.directory]
"b.net" = "127.0.0.1:7002"

[[ipcp]]
name = "a.net"
type = "normal"
dif = "net"
address = 1
crc = true

[[ipcp.neighbor]]
name = "b.net"
over = "udp"
address = 2

[ipcp.routes]
"3" = 2

[ipcp.names]
"echo" = 3
"#;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("t.toml"), s)
    }

    #[test]
    fn a_normal_ipcp_over_a_shim_parses() {
        let c = parse(TWO).unwrap();
        let n = &c.ipcps[1];
        assert_eq!(n.kind, IpcpKind::Normal);
        assert_eq!(n.address, Some(1));
        assert_eq!(n.neighbors[0].address, 2);
        assert_eq!(n.routes["3"], 2);
        assert_eq!(n.names[&"echo".parse().unwrap()], 3);
    }

    #[test]
    fn normal_mistakes_name_key_and_line() {
        let e = parse(&TWO.replace("over = \"udp\"", "over = \"nope\""))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 23") && e.contains("neighbor[0].over"),
            "{e}"
        );
        let e = parse(&TWO.replace("address = 1\n", ""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("ipcp[1].address"), "{e}");
        let e = parse(&TWO.replace("\"3\" = 2", "\"three\" = 2"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("routes"), "{e}");
        let e = parse(&TWO.replace("crc = true", "crc = true\nbind = \"127.0.0.1:1\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("shim-udp"), "{e}");
    }
}
