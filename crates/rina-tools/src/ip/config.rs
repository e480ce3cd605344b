//! `rina-ip`'s configuration: the TOML file, the command-line flags that
//! override or extend it, and the checked [`Config`] the tunnel runs from.
//!
//! ```toml
//! name = "ip-a"                     # application name registered in the DIF
//! dif = "net"                       # optional: the daemon chooses
//! socket = "/run/rinad.sock"        # optional: rinad's control socket
//! status_socket = "/run/rina-ip-rina0.sock"
//! rings = true                      # shared-memory rings to rinad where the DIF
//!                                   # offers them (default); false: sockets
//! source_filter = true              # a packet from a peer reaches the TUN only
//!                                   # if its source routes back to that peer
//!                                   # (default); false: any source
//!
//! [tun]
//! name = "rina0"
//! addresses = ["10.99.0.1/24", "fd99::1/64"]
//! mtu = 9000                        # optional cap; else the flows' max SDU
//!                                   # (at least 1280 with an IPv6 address)
//! routes = true                     # route every peer prefix to the TUN
//! checksum_offload = true           # TCP/UDP checksums left partial across
//!                                   # the tunnel (default); false: summed by
//!                                   # the kernel on each side, as without
//!                                   # offload (for a peer older than it)
//!
//! [timers]                          # all optional, in milliseconds
//! backoff_initial_ms = 200
//! backoff_max_ms = 5000
//! keepalive_ms = 1000
//! dead_after_ms = 3500
//!
//! [qos.gold]                        # named QoS profiles besides the
//! reliable = true                   # built-in "unreliable" and "reliable"
//!
//! [[peer]]
//! name = "ip-b"
//! prefixes = ["10.99.0.2/32", "fd99::2/128"]
//! qos = "unreliable"                # default profile of this peer
//! initiate = "auto"                 # auto | always | never
//! dscp = { "46" = "gold" }          # DSCP -> profile (one flow per profile)
//! ```

use super::route::{Prefix, PrefixError};
use rina::{AppName, QosSpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use thiserror::Error;

/// Longest interface name Linux takes (IFNAMSIZ less the NUL).
pub const MAX_IFNAME: usize = 15;

/// IPv6's minimum link MTU (RFC 8200 §5): the kernel takes IPv6, and the
/// interface's IPv6 addresses, off a link whose MTU is set below it.
pub const IPV6_MIN_MTU: u32 = 1280;

/// Why a configuration could not be used.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The TOML is malformed or has an unknown key or a value of the wrong type.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// The TOML parser's message, with line and column.
        message: String,
    },
    /// A required setting is given neither in the file nor as a flag.
    #[error("{0} is not set (in the file or with its flag)")]
    Missing(&'static str),
    /// An application name is not valid.
    #[error("{what}: {value:?} is not an application name: {reason}")]
    BadName {
        /// Which setting.
        what: String,
        /// The value.
        value: String,
        /// Why.
        reason: rina::NameError,
    },
    /// An address or prefix is not valid.
    #[error("{what}: {source}")]
    BadPrefix {
        /// Which setting.
        what: String,
        /// Why.
        source: PrefixError,
    },
    /// The TUN interface name is empty, too long or has a bad character.
    #[error("tun.name {0:?}: an interface name has 1 to {MAX_IFNAME} characters, no '/', ':' or white space")]
    BadIfName(String),
    /// A peer names a QoS profile that is neither built in nor in `[qos]`.
    #[error("peer {peer}: unknown QoS profile {qos:?} (built in: \"unreliable\", \"reliable\"; others go in [qos.NAME])")]
    UnknownQos {
        /// The peer.
        peer: String,
        /// The profile.
        qos: String,
    },
    /// A `dscp` key is not a number from 0 to 63.
    #[error("peer {peer}: dscp key {key:?} is not a DSCP value (0-63)")]
    BadDscp {
        /// The peer.
        peer: String,
        /// The key.
        key: String,
    },
    /// Two peers have the same name, or a peer has this tunnel's own name.
    #[error("peer {0}: listed twice, or the same as this tunnel's own name")]
    DuplicatePeer(String),
    /// The same prefix is behind two peers.
    #[error("prefix {prefix} is given for both peer {first} and peer {second}")]
    PrefixClash {
        /// The prefix.
        prefix: String,
        /// First peer.
        first: String,
        /// Second peer.
        second: String,
    },
    /// No peer is configured.
    #[error("no peer is configured (add a [[peer]] table or --peer NAME=PREFIX,...)")]
    NoPeer,
    /// A peer has no prefix.
    #[error("peer {0}: no prefixes (which destinations go to it?)")]
    NoPrefix(String),
    /// Timers that cannot work together.
    #[error("timers: {0}")]
    BadTimers(String),
    /// A `--peer` flag is not `NAME=PREFIX[,PREFIX...][@QOS]`.
    #[error("--peer {0:?}: expected NAME=PREFIX[,PREFIX...][@QOS]")]
    BadPeerFlag(String),
    /// The MTU cap is out of range.
    #[error("tun.mtu {0}: must be between 68 and 65535")]
    BadMtu(u32),
    /// The MTU cap is below IPv6's minimum while the TUN has an IPv6
    /// address: the kernel would take IPv6 off the interface.
    #[error("tun.mtu {mtu}: below IPv6's minimum MTU of 1280, and tun.addresses has the IPv6 address {address}; the kernel turns IPv6 off on a link under 1280 (raise tun.mtu or drop the IPv6 addresses)")]
    MtuBelowIpv6 {
        /// The MTU cap.
        mtu: u32,
        /// The first IPv6 address of the TUN.
        address: Prefix,
    },
    /// A field of a `[qos.NAME]` profile is out of range.
    #[error("qos.{profile}.{field} = {value}: {why}")]
    BadQos {
        /// The profile.
        profile: String,
        /// The field.
        field: &'static str,
        /// Its value, as written.
        value: String,
        /// What it must be.
        why: &'static str,
    },
}

/// Who allocates the flow to a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Initiate {
    /// The side whose own application name sorts first allocates; the other
    /// side only accepts. Both sides configured alike never allocate twice.
    #[default]
    Auto,
    /// This side allocates.
    Always,
    /// This side only accepts.
    Never,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    name: Option<String>,
    dif: Option<String>,
    socket: Option<PathBuf>,
    status_socket: Option<PathBuf>,
    rings: Option<bool>,
    source_filter: Option<bool>,
    #[serde(default)]
    tun: RawTun,
    #[serde(default)]
    timers: RawTimers,
    #[serde(default)]
    qos: BTreeMap<String, RawQos>,
    #[serde(default)]
    peer: Vec<RawPeer>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTun {
    name: Option<String>,
    #[serde(default)]
    addresses: Vec<String>,
    mtu: Option<u32>,
    routes: Option<bool>,
    checksum_offload: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTimers {
    backoff_initial_ms: Option<u64>,
    backoff_max_ms: Option<u64>,
    keepalive_ms: Option<u64>,
    dead_after_ms: Option<u64>,
}

/// A named QoS profile: the fields of a [`QosSpec`].
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQos {
    #[serde(default)]
    reliable: bool,
    #[serde(default)]
    in_order: bool,
    max_delay_ms: Option<f64>,
    max_loss_ppm: Option<u32>,
    bandwidth_bps: Option<u64>,
    max_sdu_gap: Option<u32>,
    /// A QoS cube of the DIF asked for by its QoS-id.
    qos_cube: Option<u64>,
}

impl RawQos {
    /// The spec of profile `name`; fields out of range are refused (a
    /// negative or NaN delay would otherwise ask for a delay of 0).
    fn spec(&self, name: &str) -> Result<QosSpec, ConfigError> {
        let bad = |field, value: String, why| ConfigError::BadQos {
            profile: name.to_owned(),
            field,
            value,
            why,
        };
        if let Some(ms) = self
            .max_delay_ms
            .filter(|ms| !(ms.is_finite() && *ms > 0.0))
        {
            return Err(bad(
                "max_delay_ms",
                ms.to_string(),
                "must be a number of milliseconds above 0 (leave it out for no bound)",
            ));
        }
        if let Some(ppm) = self.max_loss_ppm.filter(|&p| p > 1_000_000) {
            return Err(bad(
                "max_loss_ppm",
                ppm.to_string(),
                "must be at most 1000000 (parts per million)",
            ));
        }
        Ok(QosSpec {
            max_delay_us: self
                .max_delay_ms
                .map(|ms| (ms * 1000.0).round().max(1.0) as u64),
            max_loss_ppm: self.max_loss_ppm,
            avg_bandwidth_bps: self.bandwidth_bps,
            in_order: self.in_order,
            reliable: self.reliable,
            max_sdu_gap: self.max_sdu_gap,
            max_sdu_size: None,
            cube: self.qos_cube,
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPeer {
    name: String,
    #[serde(default)]
    prefixes: Vec<String>,
    qos: Option<String>,
    #[serde(default)]
    initiate: Initiate,
    #[serde(default)]
    dscp: BTreeMap<String, String>,
}

/// Settings given on the command line; they override the file's (`name`,
/// `dif`, ...) or add to them (`addresses`, `peers`).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--name`.
    pub name: Option<String>,
    /// `--dif`.
    pub dif: Option<String>,
    /// `--socket`.
    pub socket: Option<PathBuf>,
    /// `--status-socket`.
    pub status_socket: Option<PathBuf>,
    /// `--no-rings`: the flows use their sockets.
    pub no_rings: bool,
    /// `--no-source-filter`: packets from a peer reach the TUN whatever
    /// their source address.
    pub no_source_filter: bool,
    /// `--tun`.
    pub tun: Option<String>,
    /// `--mtu`.
    pub mtu: Option<u32>,
    /// `--address`, repeated.
    pub addresses: Vec<String>,
    /// `--peer NAME=PREFIX[,PREFIX...][@QOS]`, repeated.
    pub peers: Vec<String>,
}

/// One flow to a peer: a QoS profile and the spec it asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Channel {
    /// Profile name ("unreliable", "reliable" or a `[qos.NAME]`).
    pub qos_name: String,
    /// What the flow is allocated with.
    pub spec: QosSpec,
}

/// A checked peer.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// Its application name.
    pub name: AppName,
    /// Destinations behind it.
    pub prefixes: Vec<Prefix>,
    /// Its flows; the first is the default one.
    pub channels: Vec<Channel>,
    /// DSCP -> index in `channels`.
    pub dscp: [u8; 64],
    /// As configured.
    pub initiate: Initiate,
    /// Whether this side allocates the flows (resolved from `initiate`).
    pub allocates: bool,
}

/// Timers of the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timers {
    /// First delay before re-allocating a failed flow or reconnecting.
    pub backoff_initial: Duration,
    /// Largest such delay.
    pub backoff_max: Duration,
    /// How often a keepalive is sent on every flow.
    pub keepalive: Duration,
    /// A flow on which nothing arrived for this long is closed.
    pub dead_after: Duration,
}

impl Default for Timers {
    fn default() -> Self {
        Timers {
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_millis(5000),
            keepalive: Duration::from_millis(1000),
            dead_after: Duration::from_millis(3500),
        }
    }
}

/// The TUN interface.
#[derive(Debug, Clone)]
pub struct TunConfig {
    /// Interface name.
    pub name: String,
    /// Addresses with their prefix lengths.
    pub addresses: Vec<Prefix>,
    /// Upper bound of the MTU (the flows' max SDU is the other bound).
    pub mtu_cap: Option<u32>,
    /// Add a route to the TUN for each peer prefix not already on-link.
    pub routes: bool,
    /// Create the TUN with checksum offload and send partial checksums
    /// as such (see `packet`).
    pub checksum_offload: bool,
}

/// A checked configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Application name this tunnel registers.
    pub name: AppName,
    /// DIF to register in and allocate through.
    pub dif: Option<String>,
    /// rinad's control socket.
    pub socket: Option<PathBuf>,
    /// Where `--status` asks.
    pub status_socket: PathBuf,
    /// Whether the flows ask rinad for shared-memory rings (the DIF may
    /// not offer them; the flow then uses its socket).
    pub rings: bool,
    /// Whether an IP packet from a peer is written to the TUN only if the
    /// longest prefix holding its source address is one of that peer's
    /// (WireGuard's "allowed IPs"); the others are dropped and counted.
    pub source_filter: bool,
    /// The TUN interface.
    pub tun: TunConfig,
    /// Timers.
    pub timers: Timers,
    /// Peers.
    pub peers: Vec<PeerConfig>,
}

/// The default TUN interface name.
pub const DEFAULT_TUN: &str = "rina0";

/// Where the status socket of the tunnel on interface `tun` is by default:
/// `/run` for root, else `$XDG_RUNTIME_DIR`, else `/tmp` (with the uid).
pub fn default_status_socket(tun: &str) -> PathBuf {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    if uid == 0 {
        return PathBuf::from(format!("/run/rina-ip-{tun}.sock"));
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => Path::new(&d).join(format!("rina-ip-{tun}.sock")),
        _ => PathBuf::from(format!("/tmp/rina-ip-{uid}-{tun}.sock")),
    }
}

impl Config {
    /// Reads `path` (if any), applies `over`, and checks the result.
    pub fn load(path: Option<&Path>, over: &Overrides) -> Result<Config, ConfigError> {
        let raw = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.display().to_string(),
                    source,
                })?;
                parse_raw(&p.display().to_string(), &text)?
            }
            None => RawConfig::default(),
        };
        build(raw, over)
    }

    /// Parses configuration text (`path` only names it in errors), applies
    /// `over`, and checks the result.
    pub fn parse(path: &str, text: &str, over: &Overrides) -> Result<Config, ConfigError> {
        build(parse_raw(path, text)?, over)
    }
}

fn parse_raw(path: &str, text: &str) -> Result<RawConfig, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string().trim_end().to_owned(),
    })
}

fn name(what: &str, value: &str) -> Result<AppName, ConfigError> {
    value.parse().map_err(|reason| ConfigError::BadName {
        what: what.to_owned(),
        value: value.to_owned(),
        reason,
    })
}

fn prefix(what: String, s: &str, route: bool) -> Result<Prefix, ConfigError> {
    let r = if route {
        Prefix::parse_route(s)
    } else {
        Prefix::parse(s)
    };
    r.map_err(|source| ConfigError::BadPrefix { what, source })
}

/// Parses `NAME=PREFIX[,PREFIX...][@QOS]`.
fn peer_flag(s: &str) -> Result<RawPeer, ConfigError> {
    let bad = || ConfigError::BadPeerFlag(s.to_owned());
    let (name, rest) = s.split_once('=').ok_or_else(bad)?;
    let (prefixes, qos) = match rest.rsplit_once('@') {
        Some((p, q)) => (p, Some(q.to_owned())),
        None => (rest, None),
    };
    if name.is_empty() || prefixes.is_empty() {
        return Err(bad());
    }
    Ok(RawPeer {
        name: name.to_owned(),
        prefixes: prefixes.split(',').map(|p| p.trim().to_owned()).collect(),
        qos,
        initiate: Initiate::Auto,
        dscp: BTreeMap::new(),
    })
}

/// Checks the raw settings, with `over` applied, into a [`Config`].
fn build(mut raw: RawConfig, over: &Overrides) -> Result<Config, ConfigError> {
    let name_s = over
        .name
        .clone()
        .or(raw.name.take())
        .ok_or(ConfigError::Missing("name"))?;
    let me = name("name", &name_s)?;
    let tun_name = check_tun_name(over.tun.clone().or(raw.tun.name.take()))?;
    let addresses = tun_addresses(&raw.tun.addresses, &over.addresses)?;
    let mtu_cap = check_mtu(over.mtu.or(raw.tun.mtu), &addresses)?;
    let timers = build_timers(&raw.timers)?;
    let profiles = qos_profiles(&raw.qos)?;
    let peers = build_peers(std::mem::take(&mut raw.peer), &over.peers, &me, &profiles)?;
    let status_socket = over
        .status_socket
        .clone()
        .or(raw.status_socket)
        .unwrap_or_else(|| default_status_socket(&tun_name));
    Ok(Config {
        name: me,
        dif: over.dif.clone().or(raw.dif),
        socket: over.socket.clone().or(raw.socket),
        status_socket,
        rings: !over.no_rings && raw.rings.unwrap_or(true),
        source_filter: !over.no_source_filter && raw.source_filter.unwrap_or(true),
        tun: TunConfig {
            name: tun_name,
            addresses,
            mtu_cap,
            routes: raw.tun.routes.unwrap_or(true),
            checksum_offload: raw.tun.checksum_offload.unwrap_or(true),
        },
        timers,
        peers,
    })
}

/// The TUN interface name (the default if unset), checked to be one Linux takes.
fn check_tun_name(tun_name: Option<String>) -> Result<String, ConfigError> {
    let tun_name = tun_name.unwrap_or_else(|| DEFAULT_TUN.to_owned());
    if tun_name.is_empty()
        || tun_name.len() > MAX_IFNAME
        || tun_name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control())
    {
        return Err(ConfigError::BadIfName(tun_name));
    }
    Ok(tun_name)
}

/// The TUN addresses: the file's, then the flags'.
fn tun_addresses(file: &[String], flags: &[String]) -> Result<Vec<Prefix>, ConfigError> {
    let mut addresses = Vec::new();
    for (i, a) in file.iter().chain(flags).enumerate() {
        addresses.push(prefix(format!("tun.addresses[{i}]"), a, false)?);
    }
    Ok(addresses)
}

/// The MTU cap, if any, checked to be in range, and to be IPv6's minimum
/// at least if the TUN has an IPv6 address among `addresses`.
fn check_mtu(mtu_cap: Option<u32>, addresses: &[Prefix]) -> Result<Option<u32>, ConfigError> {
    if let Some(m) = mtu_cap {
        if !(68..=65535).contains(&m) {
            return Err(ConfigError::BadMtu(m));
        }
        if let Some(a) = addresses.iter().find(|a| a.addr.is_ipv6()) {
            if m < IPV6_MIN_MTU {
                return Err(ConfigError::MtuBelowIpv6 {
                    mtu: m,
                    address: *a,
                });
            }
        }
    }
    Ok(mtu_cap)
}

/// The timers (defaults where unset), checked to work together.
fn build_timers(raw: &RawTimers) -> Result<Timers, ConfigError> {
    let d = Timers::default();
    let ms = |v: Option<u64>, dflt: Duration| v.map(Duration::from_millis).unwrap_or(dflt);
    let timers = Timers {
        backoff_initial: ms(raw.backoff_initial_ms, d.backoff_initial),
        backoff_max: ms(raw.backoff_max_ms, d.backoff_max),
        keepalive: ms(raw.keepalive_ms, d.keepalive),
        dead_after: ms(raw.dead_after_ms, d.dead_after),
    };
    if timers.backoff_initial.is_zero() || timers.backoff_max < timers.backoff_initial {
        return Err(ConfigError::BadTimers(
            "backoff_initial_ms must be above 0 and at most backoff_max_ms".into(),
        ));
    }
    if timers.keepalive.is_zero() || timers.dead_after < timers.keepalive * 2 {
        return Err(ConfigError::BadTimers(
            "keepalive_ms must be above 0 and dead_after_ms at least twice keepalive_ms".into(),
        ));
    }
    Ok(timers)
}

/// The QoS profiles by name: the built-in ones, then those of `[qos]`.
fn qos_profiles(raw: &BTreeMap<String, RawQos>) -> Result<BTreeMap<String, QosSpec>, ConfigError> {
    let mut profiles: BTreeMap<String, QosSpec> = BTreeMap::new();
    profiles.insert("unreliable".into(), QosSpec::default());
    profiles.insert(
        "reliable".into(),
        QosSpec {
            reliable: true,
            in_order: true,
            ..QosSpec::default()
        },
    );
    for (n, q) in raw {
        profiles.insert(n.clone(), q.spec(n)?);
    }
    Ok(profiles)
}

/// The checked peers: the file's, then those of the `--peer` flags.
fn build_peers(
    mut raw_peers: Vec<RawPeer>,
    flags: &[String],
    me: &AppName,
    profiles: &BTreeMap<String, QosSpec>,
) -> Result<Vec<PeerConfig>, ConfigError> {
    for p in flags {
        raw_peers.push(peer_flag(p)?);
    }
    if raw_peers.is_empty() {
        return Err(ConfigError::NoPeer);
    }
    let mut peers: Vec<PeerConfig> = Vec::new();
    for rp in raw_peers {
        let peer = build_peer(rp, me, &peers, profiles)?;
        peers.push(peer);
    }
    Ok(peers)
}

/// Checks one peer against this tunnel's name `me` and the peers before it.
fn build_peer(
    rp: RawPeer,
    me: &AppName,
    peers: &[PeerConfig],
    profiles: &BTreeMap<String, QosSpec>,
) -> Result<PeerConfig, ConfigError> {
    let pname = name(&format!("peer {}", rp.name), &rp.name)?;
    if pname == *me || peers.iter().any(|p| p.name == pname) {
        return Err(ConfigError::DuplicatePeer(rp.name));
    }
    if rp.prefixes.is_empty() {
        return Err(ConfigError::NoPrefix(rp.name));
    }
    let prefixes = peer_prefixes(&rp, peers)?;
    let (channels, dscp) = peer_channels(&rp, profiles)?;
    let allocates = match rp.initiate {
        Initiate::Always => true,
        Initiate::Never => false,
        Initiate::Auto => me.to_string() < pname.to_string(),
    };
    Ok(PeerConfig {
        name: pname,
        prefixes,
        channels,
        dscp,
        initiate: rp.initiate,
        allocates,
    })
}

/// A peer's prefixes, without repeats; none may be behind an earlier peer.
fn peer_prefixes(rp: &RawPeer, peers: &[PeerConfig]) -> Result<Vec<Prefix>, ConfigError> {
    let mut prefixes = Vec::new();
    for (i, s) in rp.prefixes.iter().enumerate() {
        let p = prefix(format!("peer {} prefixes[{i}]", rp.name), s, true)?;
        for other in peers {
            if other.prefixes.contains(&p) {
                return Err(ConfigError::PrefixClash {
                    prefix: p.to_string(),
                    first: other.name.to_string(),
                    second: rp.name.clone(),
                });
            }
        }
        if !prefixes.contains(&p) {
            prefixes.push(p);
        }
    }
    Ok(prefixes)
}

/// A peer's flows (the default profile's first) and its DSCP -> flow map.
fn peer_channels(
    rp: &RawPeer,
    profiles: &BTreeMap<String, QosSpec>,
) -> Result<(Vec<Channel>, [u8; 64]), ConfigError> {
    let mut channels: Vec<Channel> = Vec::new();
    let mut channel_of = |qos: &str| -> Result<u8, ConfigError> {
        let spec = *profiles.get(qos).ok_or_else(|| ConfigError::UnknownQos {
            peer: rp.name.clone(),
            qos: qos.to_owned(),
        })?;
        // Profiles with the same spec share a flow: the accepting side
        // tells flows apart by their spec.
        if let Some(i) = channels.iter().position(|c| c.spec == spec) {
            return Ok(i as u8);
        }
        channels.push(Channel {
            qos_name: qos.to_owned(),
            spec,
        });
        Ok((channels.len() - 1) as u8)
    };
    channel_of(rp.qos.as_deref().unwrap_or("unreliable"))?;
    let mut dscp = [0u8; 64];
    for (k, q) in &rp.dscp {
        let v: usize =
            k.trim()
                .parse()
                .ok()
                .filter(|&v| v < 64)
                .ok_or_else(|| ConfigError::BadDscp {
                    peer: rp.name.clone(),
                    key: k.clone(),
                })?;
        dscp[v] = channel_of(q)?;
    }
    Ok((channels, dscp))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
name = "ip-a"
dif = "net"
[tun]
name = "rtest0"
addresses = ["10.99.0.1/24", "fd99::1/64"]
mtu = 9000
[timers]
keepalive_ms = 500
dead_after_ms = 2000
[qos.gold]
reliable = true
max_delay_ms = 5
[[peer]]
name = "ip-b"
prefixes = ["10.99.0.2/32", "fd99::2/128"]
dscp = { "46" = "gold", "10" = "unreliable" }
[[peer]]
name = "ip-0"
prefixes = ["10.50.0.0/16"]
qos = "reliable"
"#;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse("t.toml", text, &Overrides::default())
    }

    #[test]
    fn a_full_file_is_understood() {
        let c = parse(FULL).unwrap();
        assert_eq!(c.name.to_string(), "ip-a");
        assert_eq!(c.dif.as_deref(), Some("net"));
        assert_eq!(c.tun.name, "rtest0");
        assert_eq!(c.tun.addresses.len(), 2);
        assert_eq!(c.tun.mtu_cap, Some(9000));
        assert!(c.tun.routes);
        assert!(c.tun.checksum_offload, "on unless turned off");
        assert!(c.source_filter, "on unless turned off");
        let off =
            parse(&FULL.replace("mtu = 9000", "mtu = 9000\nchecksum_offload = false")).unwrap();
        assert!(!off.tun.checksum_offload);
        assert_eq!(c.timers.keepalive, Duration::from_millis(500));
        let b = &c.peers[0];
        // "ip-a" < "ip-b": this side allocates; "ip-0" < "ip-a": it does not.
        assert!(b.allocates && !c.peers[1].allocates);
        assert_eq!(b.channels.len(), 2, "{:?}", b.channels);
        assert_eq!(b.channels[0].qos_name, "unreliable");
        assert_eq!(b.channels[1].qos_name, "gold");
        assert!(b.channels[1].spec.reliable);
        assert_eq!(b.channels[1].spec.max_delay_us, Some(5000));
        assert_eq!((b.dscp[46], b.dscp[10], b.dscp[0]), (1, 0, 0));
        assert_eq!(c.peers[1].channels[0].qos_name, "reliable");
        assert_eq!(c.status_socket, default_status_socket("rtest0"));
    }

    #[test]
    fn source_filtering_is_on_unless_the_file_or_a_flag_turns_it_off() {
        assert!(parse(FULL).unwrap().source_filter);
        let on = FULL.replace(
            "name = \"ip-a\"\n",
            "name = \"ip-a\"\nsource_filter = true\n",
        );
        assert!(parse(&on).unwrap().source_filter);
        let off = on.replace("source_filter = true", "source_filter = false");
        assert!(!parse(&off).unwrap().source_filter);
        let flag = Overrides {
            no_source_filter: true,
            ..Overrides::default()
        };
        assert!(!Config::parse("t.toml", FULL, &flag).unwrap().source_filter);
        assert!(!Config::parse("t.toml", &on, &flag).unwrap().source_filter);
        let e = parse(&on.replace("source_filter = true", "source_filter = 1"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("source_filter"), "{e}");
    }

    #[test]
    fn flags_override_and_extend_the_file() {
        let over = Overrides {
            name: Some("ip-z".into()),
            tun: Some("other0".into()),
            addresses: vec!["192.168.9.1/24".into()],
            peers: vec!["ip-c=192.168.9.0/24,fd98::/64@reliable".into()],
            ..Overrides::default()
        };
        let c = Config::parse("t.toml", FULL, &over).unwrap();
        assert_eq!(c.name.to_string(), "ip-z");
        assert_eq!(c.tun.name, "other0");
        assert_eq!(c.tun.addresses.len(), 3);
        let p = &c.peers[2];
        assert_eq!(p.name.to_string(), "ip-c");
        assert_eq!(p.prefixes.len(), 2);
        assert_eq!(p.channels[0].qos_name, "reliable");
        // Flags alone are enough.
        let over = Overrides {
            name: Some("a".into()),
            peers: vec!["b=10.0.0.0/8".into()],
            ..Overrides::default()
        };
        assert!(Config::load(None, &over).is_ok());
    }

    #[test]
    fn mistakes_get_clear_errors() {
        let err = |t: &str| parse(t).unwrap_err().to_string();
        assert!(err("").contains("name is not set"));
        let e = err("name = \"a\"\nbogus = 1\n");
        assert!(e.contains("line 2") && e.contains("bogus"), "{e}");
        assert!(err("name = \"a\"").contains("no peer"));
        let e = err("name = \"a\"\n[[peer]]\nname = \"b\"\nprefixes = [\"10.0.0.1/8\"]\n");
        assert!(e.contains("did you mean 10.0.0.0/8"), "{e}");
        let e = err("name = \"a\"\n[[peer]]\nname = \"b\"\nprefixes = [\"10.0.0.0/8\"]\nqos = \"platinum\"\n");
        assert!(e.contains("unknown QoS profile \"platinum\""), "{e}");
        let e = err("name = \"a\"\n[[peer]]\nname = \"b\"\nprefixes = [\"10.0.0.0/8\"]\ndscp = { \"64\" = \"reliable\" }\n");
        assert!(e.contains("dscp key \"64\""), "{e}");
        let e = err("name = \"a\"\n[[peer]]\nname = \"a\"\nprefixes = [\"10.0.0.0/8\"]\n");
        assert!(e.contains("peer a"), "{e}");
        let e = err("name = \"a\"\n[[peer]]\nname = \"b\"\nprefixes = [\"10.0.0.0/8\"]\n[[peer]]\nname = \"c\"\nprefixes = [\"10.0.0.0/8\"]\n");
        assert!(e.contains("both peer b and peer c"), "{e}");
        let e = err("name = \"a\"\n[tun]\nname = \"much-too-long-name\"\n[[peer]]\nname = \"b\"\nprefixes = [\"10.0.0.0/8\"]\n");
        assert!(e.contains("interface name"), "{e}");
        let e = err("name = \"a\"\n[timers]\nkeepalive_ms = 1000\ndead_after_ms = 1500\n[[peer]]\nname = \"b\"\nprefixes = [\"10.0.0.0/8\"]\n");
        assert!(e.contains("twice"), "{e}");
        let peer = "[[peer]]\nname = \"b\"\nprefixes = [\"10.0.0.0/8\"]\n";
        for (q, said) in [
            ("max_delay_ms = -5.0", "qos.fast.max_delay_ms = -5"),
            ("max_delay_ms = nan", "qos.fast.max_delay_ms = NaN"),
            ("max_delay_ms = 0.0", "qos.fast.max_delay_ms = 0"),
            ("max_loss_ppm = 2000000", "qos.fast.max_loss_ppm = 2000000"),
        ] {
            let e = err(&format!("name = \"a\"\n[qos.fast]\n{q}\n{peer}"));
            assert!(e.contains(said), "{q}: {e}");
        }
        let c = parse(&format!(
            "name = \"a\"\n[qos.fast]\nmax_delay_ms = 0.0001\n{peer}qos = \"fast\"\n"
        ))
        .unwrap();
        assert_eq!(c.peers[0].channels[0].spec.max_delay_us, Some(1));
        let e = Config::parse(
            "t",
            "name = \"a\"",
            &Overrides {
                peers: vec!["b".into()],
                ..Overrides::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("NAME=PREFIX"), "{e}");
    }

    #[test]
    fn an_mtu_below_1280_is_refused_with_an_ipv6_address_only() {
        let e = parse(&FULL.replace("mtu = 9000", "mtu = 1200"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tun.mtu 1200") && e.contains("fd99::1/64") && e.contains("1280"),
            "{e}"
        );
        let over = Overrides {
            mtu: Some(1279),
            ..Overrides::default()
        };
        assert!(matches!(
            Config::parse("t.toml", FULL, &over),
            Err(ConfigError::MtuBelowIpv6 { mtu: 1279, .. })
        ));
        // 1280 is enough; without an IPv6 address any MTU IPv4 takes is.
        assert!(parse(&FULL.replace("mtu = 9000", "mtu = 1280")).is_ok());
        let v4_only = FULL
            .replace("mtu = 9000", "mtu = 576")
            .replace(", \"fd99::1/64\"", "");
        assert_eq!(parse(&v4_only).unwrap().tun.mtu_cap, Some(576));
    }
}
