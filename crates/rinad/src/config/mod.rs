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
//! # admin_group = "rina"          # administrators besides root and the daemon's user
//! # socket_mode = 0o660           # default 0o666 (requests are checked per user)
//! # socket_group = "rina"         # group of the socket
//! # max_conns_per_user = 128      # control connections of one non-administrator
//! # max_flows_per_user = 5000     # flows (open or being allocated) of one non-administrator;
//!                                 # default: a quarter of the daemon's descriptor limit
//! # idle_timeout_ms = 60000       # close connections that hold nothing and say nothing
//! # busy_poll_us = 2000           # keep polling (yielding the core) this long after the
//!                                 # last event before sleeping: lower latency, more CPU
//!
//! [[ipcp]]
//! name = "alpha.udp"
//! type = "shim-udp"
//! dif = "udp.net"
//! bind = "127.0.0.1:7001"
//! # max_sdu = 1400
//! # peers_only = false            # true: allocation requests only from the addresses
//!                                 # below, none claiming a name below from elsewhere
//! # keepalive_ms = 10000          # check flows this often; one that heard nothing for
//!                                 # three checks (a vanished peer) is deallocated; 0: off
//!
//! [ipcp.directory]               # application name -> UDP address of its shim
//! "echo" = "127.0.0.1:7002"
//! "beta.net" = "127.0.0.1:7002"   # the neighbour normal IPCP, reached over this shim
//!
//! [[ipcp]]
//! name = "alpha.eth"
//! type = "shim-eth"               # one flow per peer MAC, names resolved with ARP
//! dif = "10"                      # the VLAN id is the DIF name
//! interface = "eth1"
//! # vlan = 10                     # default: the DIF name when it is a number (1..4094)
//! # untagged = true               # a plain segment: no 802.1Q tag
//! # tx_delay_us = 1000            # link emulation (no netem needed): delay every frame
//! # tx_loss = 0.01                # sent by 1 ms, drop 1% of them (seeded by tx_seed)
//! # rate = "100Mbps"              # any shim: the link's capacity; normal IPCPs above
//!                                 # pace their N-1 flows at it, so queues form in their RMT
//! # rate_overhead = 24            # bytes per frame the link adds (counted by the pacer)
//!
//! [[ipcp]]
//! name = "alpha.hv"
//! type = "shim-hv"                # VMPI over shared memory, host <-> VM
//! dif = "hv0"
//! path = "/dev/shm/rina-hv0"      # created and sized by the host side; the guest
//! side = "host"                   # maps it (or an ivshmem BAR: .../resource2)
//! # vmpi_id = 0                   # the device's id in this OS: its address
//! # busy_poll = false             # true: spin on the rings (lowest latency, one core)
//! # credit = true                 # false: announce no per-flow credit, as IRATI's
//!                                 # shim-hv (a full application pauses the device)
//!
//! [[ipcp]]
//! name = "alpha.net"              # also its application name in the N-1 DIFs
//! type = "normal"
//! dif = "net"
//! address = 1                     # a bootstrap member; leave it out to enroll
//!                                 # through the first neighbour that is a member
//! # password = "s3cret"           # the DIF's pre-shared enrollment password, proven
//!                                 # by HMAC-SHA256 challenge-response (never sent)
//! # key = "<64 hex digits>"       # or: this member's ed25519 secret key...
//! # trusted_keys = ["<64 hex>"]   # ...and the public keys the DIF trusts
//! # encryption = true             # AES-256-GCM on every N-1 flow, keys agreed
//!                                 # by X25519 at port authentication (needs the above)
//! # rekey_bytes = 1073741824      # new keys after this many bytes per key
//!                                 # (at least 1048576)...
//! # rekey_seconds = 600           # ...or after this many seconds (at least 1)
//! # max_pdu = 9000                # largest PDU (default rina_core::normal::DEFAULT_MAX_PDU,
//!                                 # 9000); larger SDUs are fragmented
//! # max_sdu = 65536
//! # crc = false                   # CRC-32 on every PDU
//! # ttl = 64                      # hop limit
//! # max_flows = 262144            # most flows at once, at least 1 (also for
//!                                 # shim-udp and shim-eth)
//! # cep_id_bytes = 4              # CEP-id field width: 1, 2 (default; 65,535
//!                                 # flows per IPCP), 4 or 8; the same in every member
//! # ecn_threshold = 20            # RMT marks data PDUs leaving this many behind, on every
//!                                 # port (0: off; default: 20, raised on fast ports)
//!
//! [[ipcp.neighbor]]               # an N-1 flow to set up and keep up
//! name = "beta.net"               # the neighbour IPCP's name
//! over = "udp.net"                # the N-1 DIF that reaches it
//! # address = 2                   # its address, if known (else learnt by hello)
//!
//! # routing = "link-state"        # or "static" (default): use the table below
//! # directory_mode = "distributed" # or "static" (default): only the names table
//! # rib_readable = ["/ra", "/dt"]   # RIB subtrees neighbours may read (`rinactl rib --remote`);
//!                                 # default ["/"], [] for none
//!
//! # [ipcp.access]                 # the DIF's access rules (default: anything goes)
//! # register = ["echo", "perf*"]  # process names that may register ("*": any)
//! # allocate = [{ from = "client*", to = "echo" }]   # flows allowed
//!
//! [ipcp.routes]                   # destination address -> next-hop address (a neighbour)
//! "3" = 2
//!
//! [ipcp.names]                    # application name -> address (static directory)
//! "echo" = 2
//!
//! [ipcp.scheduler]                # RMT scheduling policy (default: fifo); see
//! policy = "qta-mux"              # rina_core::rmt::SchedulerConfig for every policy
//! cherish_thresholds = [1250, 50] # and parameter; `rinactl sched` changes it live
//! skip_probability = 0.05
//!
//! [[ipcp.qos_cube]]               # QoS cubes of the DIF (default: 1 "unreliable",
//! id = 1                          # 2 "reliable", both in cell A1)
//! name = "voice"
//! reliable = false                # EFCP with retransmission and in-order delivery
//! # flow_control = false          # window flow control without retransmission
//!                                 # (the receiver paces the writer; VM-to-VM)
//! urgency = 0                     # cell of the cherish/urgency matrix, 0 = most
//! cherish = 1                     # urgent / most cherished
//! # avg_bandwidth_bps = 64000     # declared figures, matched against QoS specs:
//! # burst_bytes = 1500            # delay_us, jitter_us, loss_ppm likewise
//! # lower = { net0 = "A1" }       # stacked: the cube of each N-1 normal DIF that
//!                                 # carries this one (by name or id; default: that
//!                                 # DIF's default cube); one N-1 flow per neighbour
//!                                 # and distinct lower cube
//! # keepalive_ms = 5000           # flows that heard nothing for this long probe
//!                                 # the peer; nothing for 3 of them: deallocated
//!                                 # (10..=3600000; default off; local setting)
//! # efcp = { congestion_control = "dctcp", window = 256, min_rto_ms = 10 }
//!                                 # EFCP policies: a_timer_ms, max_sdu_gap, window,
//!                                 # initial_credit, initial/min/max_rto_ms,
//!                                 # max_retries, ack_every, congestion_control
//!                                 # ("dctcp" default of reliable cubes, "aimd",
//!                                 # "none"), initial/min/max_window, gain_shift,
//!                                 # rate_pdus, rate_frame_ms (rate-based flow
//!                                 # control: PDUs per frame; 0 PDUs: off)
//! ```
//!
//! With `routing = "link-state"` and `directory_mode = "distributed"` the
//! last two tables are not needed; a member without `address` takes both
//! policies (and the address) from the DIF when it enrolls.

mod check;
#[cfg(test)]
mod tests;

use check::*;
use rina_core::efcp::{ConfigError as EfcpError, EfcpConfig};
use rina_core::normal::access::{AccessRules, FlowRule, NamePattern, PatternError};
use rina_core::normal::QosCube;
use rina_core::rmt::{SchedConfigError, SchedulerConfig};
use rina_wire::AppName;
use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use thiserror::Error;
use toml::Spanned;

/// The longest `tx_delay_us` (1 s): every frame sent waits out the delay
/// in memory.
pub const MAX_TX_DELAY_US: u64 = 1_000_000;

/// Smallest `rekey_bytes`: a key seals at least this much (1 MiB), so a
/// flow does not agree new keys every few PDUs.
pub const MIN_REKEY_BYTES: u64 = 1 << 20;
/// Smallest `rekey_seconds`.
pub const MIN_REKEY_SECONDS: u64 = 1;

/// Shortest `keepalive_ms` of a shim-udp IPCP other than 0 (off).
pub const MIN_KEEPALIVE_MS: u64 = 100;

/// Longest `keepalive_ms` of a shim-udp IPCP: an hour.
pub const MAX_KEEPALIVE_MS: u64 = 3_600_000;

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
    /// The path is not one to read: not a regular file, too large, or
    /// not readable by the user who asked for it.
    #[error("{path}: {reason}")]
    Refused { path: PathBuf, reason: String },
    /// The file parses but describes something that cannot be built.
    #[error("{path}: line {line}: key `{key}`: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        key: String,
        message: String,
    },
}

/// A TOML error as people read it: serde's ``unknown field `bnd`, expected
/// one of`` and the forty keys of every IPCP kind becomes the unknown key
/// and the known ones closest to it.
fn readable(message: &str) -> String {
    let message = message.trim_end();
    let Some((head, expected)) = message.split_once(", expected one of ") else {
        return message.to_string();
    };
    let Some(unknown) = head
        .rsplit_once("unknown field `")
        .and_then(|(_, k)| k.strip_suffix('`'))
    else {
        return message.to_string();
    };
    let known: Vec<&str> = expected.split(", ").map(|k| k.trim_matches('`')).collect();
    let mut near: Vec<(usize, &str)> = known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(unknown, k), *k))
        .filter(|(d, k)| *d <= (k.len().max(unknown.len()) / 3).max(1))
        .collect();
    near.sort();
    let hint = match near.as_slice() {
        [] => format!("no key of that name; the keys are {}", known.join(", ")),
        [(_, k), ..] => format!("did you mean `{k}`?"),
    };
    format!("{}: {hint}", head)
}

/// Longest IPCP or DIF name, in bytes (as long as an application name's
/// part may be).
pub const MAX_NAME_BYTES: usize = 255;

/// Largest configuration file read, in bytes (seed 003's 37-system
/// network takes a few KiB per system).
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

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
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct System {
    /// Name of the system (used in logs and listings).
    pub name: String,
    /// Path of the control socket.
    pub socket: Option<PathBuf>,
    /// Members of this group are administrators of the daemon, as are root
    /// and the user the daemon runs as.
    pub admin_group: Option<String>,
    /// Permissions of the control socket: `0o660` or `"0660"` (default
    /// 0666: every local user may connect; requests are checked per user).
    pub socket_mode: Option<Spanned<SocketMode>>,
    /// Group of the control socket (with `socket_mode = 0o660`, only its
    /// members and the owner may connect).
    pub socket_group: Option<String>,
    /// Control connections one user who is not an administrator may hold
    /// open at once (default [`DEFAULT_CONNS_PER_USER`]).
    pub max_conns_per_user: Option<Spanned<usize>>,
    /// Flows one user who is not an administrator may hold at once, open
    /// or being allocated or accepted (default: a quarter of the daemon's
    /// descriptor limit, [`DEFAULT_FLOWS_SHARE`]).
    pub max_flows_per_user: Option<Spanned<usize>>,
    /// A control connection that holds nothing (no registered name, no
    /// flow, no request in progress) and sends nothing for this long is
    /// closed, in milliseconds (default [`DEFAULT_IDLE_TIMEOUT_MS`]).
    pub idle_timeout_ms: Option<Spanned<u64>>,
    /// After the last event, the daemon keeps polling its descriptors
    /// without sleeping for this long, in microseconds, yielding the core
    /// to any other runnable process between polls (default 0: it sleeps
    /// at once). Saves the wake-ups that make a round trip through the
    /// daemons slow, at the cost of a core kept busy while traffic comes.
    pub busy_poll_us: Option<Spanned<u64>>,
}

/// Default of `max_conns_per_user`.
pub const DEFAULT_CONNS_PER_USER: usize = 128;
/// Default of `max_flows_per_user`: this share of the daemon's descriptor
/// limit (one descriptor per flow), so that one user leaves most of them
/// to the others.
pub const DEFAULT_FLOWS_SHARE: u64 = 4;
/// Default of `idle_timeout_ms`.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 60_000;
/// Largest `busy_poll_us`: a second of polling after the last event.
pub const MAX_BUSY_POLL_US: u64 = 1_000_000;
/// Default mode of the control socket.
pub const DEFAULT_SOCKET_MODE: u32 = 0o666;
/// Largest queue bound or drop threshold a scheduling policy may ask for,
/// in PDUs: larger ones would let queues grow without a useful bound.
pub const MAX_QUEUE_PDUS: u64 = 1 << 20;

/// A file mode, written as a TOML integer (`0o660`) or an octal string (`"0660"`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum SocketMode {
    /// An integer (TOML's `0o660`).
    Int(u32),
    /// Octal digits.
    Text(String),
}

impl SocketMode {
    /// The permission bits, or why they are not valid.
    pub fn bits(&self) -> Result<u32, String> {
        let m = match self {
            SocketMode::Int(m) => *m,
            SocketMode::Text(t) => u32::from_str_radix(t.trim_start_matches("0o"), 8)
                .map_err(|_| format!("{t:?} is not an octal mode like \"0660\""))?,
        };
        if m > 0o777 {
            return Err(format!(
                "{m:o} is not a mode of read/write bits (0 to 0777)"
            ));
        }
        Ok(m)
    }
}

impl System {
    /// Mode of the control socket.
    pub fn socket_mode(&self) -> u32 {
        self.socket_mode
            .as_ref()
            .and_then(|m| m.get_ref().bits().ok())
            .unwrap_or(DEFAULT_SOCKET_MODE)
    }

    /// Connections per non-administrator user.
    pub fn conns_per_user(&self) -> usize {
        self.max_conns_per_user
            .as_ref()
            .map_or(DEFAULT_CONNS_PER_USER, |m| *m.get_ref())
    }

    /// Flows per non-administrator user, given the daemon's descriptor
    /// limit `fd_limit`.
    pub fn flows_per_user(&self, fd_limit: u64) -> usize {
        self.max_flows_per_user.as_ref().map_or_else(
            || usize::try_from(fd_limit / DEFAULT_FLOWS_SHARE).unwrap_or(usize::MAX),
            |m| *m.get_ref(),
        )
    }

    /// How long the daemon keeps polling after its last event, if at all.
    pub fn busy_poll(&self) -> Option<std::time::Duration> {
        self.busy_poll_us
            .as_ref()
            .map(|m| *m.get_ref())
            .filter(|&us| us > 0)
            .map(std::time::Duration::from_micros)
    }

    /// Idle timeout of control connections.
    pub fn idle_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(
            self.idle_timeout_ms
                .as_ref()
                .map_or(DEFAULT_IDLE_TIMEOUT_MS, |m| *m.get_ref()),
        )
    }
}

/// Checks the bounds of a scheduling policy's parameters that the policy
/// itself does not: queue bounds and drop thresholds (`*queue_len`,
/// `*threshold*`, in PDUs) must be at most [`MAX_QUEUE_PDUS`]. The error
/// names the parameter.
pub fn check_sched_bounds(v: &serde_json::Value) -> Result<(), String> {
    fn walk(path: &str, v: &serde_json::Value) -> Result<(), String> {
        use serde_json::Value;
        match v {
            Value::Object(m) => m.iter().try_for_each(|(k, v)| {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                walk(&p, v)
            }),
            Value::Array(a) => a
                .iter()
                .enumerate()
                .try_for_each(|(i, v)| walk(&format!("{path}[{i}]"), v)),
            Value::Number(n) => {
                let key = path.rsplit('.').next().unwrap_or(path);
                let queue = key.contains("queue_len") || key.contains("threshold");
                match n.as_u64() {
                    Some(x) if queue && x > MAX_QUEUE_PDUS => Err(format!(
                        "{path} = {x} is out of range: queue bounds and thresholds are at most {MAX_QUEUE_PDUS} PDUs"
                    )),
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }
    walk("", v)
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
    /// The shim DIF over Ethernet 802.1Q.
    #[serde(rename = "shim-eth")]
    ShimEth,
    /// The shim DIF for hypervisors (VMPI over shared memory).
    #[serde(rename = "shim-hv")]
    ShimHv,
}

/// Which end of a shim-hv VMPI device an IPCP is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum HvSide {
    /// The hypervisor: creates and sizes the shared-memory file.
    #[serde(rename = "host")]
    Host,
    /// The virtual machine: maps what the host created.
    #[serde(rename = "guest")]
    Guest,
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
    /// Its address in this DIF, if known (otherwise learnt from its hellos).
    #[serde(default)]
    pub address: Option<u64>,
}

/// `[ipcp.access]`: the DIF's access rules (see
/// [`rina_core::normal::access`]). Patterns match an application's process
/// name: `"echo"` exactly, `"perf*"` by prefix, `"*"` any.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessConfig {
    /// Names that may register; absent: any.
    pub register: Option<Vec<String>>,
    /// Allowed flows (`{ from = "client*", to = "echo" }`); absent: any.
    pub allocate: Option<Vec<FlowRuleConfig>>,
}

/// One allowed kind of flow in [`AccessConfig::allocate`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowRuleConfig {
    /// Who may ask.
    pub from: String,
    /// For a flow to whom.
    pub to: String,
}

impl AccessConfig {
    /// The rules, patterns checked.
    pub fn rules(&self) -> Result<AccessRules, PatternError> {
        let pats = |v: &Vec<String>| -> Result<Vec<NamePattern>, PatternError> {
            v.iter().map(|s| NamePattern::new(s)).collect()
        };
        Ok(AccessRules {
            register: self.register.as_ref().map(pats).transpose()?,
            allocate: self
                .allocate
                .as_ref()
                .map(|rs| {
                    rs.iter()
                        .map(|r| {
                            Ok(FlowRule {
                                from: NamePattern::new(&r.from)?,
                                to: NamePattern::new(&r.to)?,
                            })
                        })
                        .collect::<Result<Vec<_>, PatternError>>()
                })
                .transpose()?,
        })
    }
}

/// One `[[ipcp]]` table.
#[derive(Debug, Clone, Deserialize)]
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
    pub bind: Option<Spanned<SocketAddr>>,
    /// Largest SDU, in bytes.
    pub max_sdu: Option<Spanned<u32>>,
    /// shim-udp: where each application name lives.
    #[serde(default)]
    pub directory: BTreeMap<AppName, SocketAddr>,
    /// normal: this IPCP's address in its DIF.
    pub address: Option<u64>,
    /// shim-eth: the Ethernet interface.
    pub interface: Option<String>,
    /// shim-eth: the VLAN id (1..=4094); default: the DIF name if it is a number.
    pub vlan: Option<Spanned<u16>>,
    /// shim-eth: no 802.1Q tag (a plain segment).
    pub untagged: Option<bool>,
    /// shim-eth: link emulation, one-way delay added to every frame sent,
    /// microseconds, at most [`MAX_TX_DELAY_US`] (frames wait in a sender
    /// thread; order is kept).
    pub tx_delay_us: Option<Spanned<u64>>,
    /// shim-eth: link emulation, probability of dropping a frame sent (0..1).
    pub tx_loss: Option<f64>,
    /// shim-eth: seed of the `tx_loss` draws (default 1).
    pub tx_seed: Option<u64>,
    /// shims: the capacity of the link under this IPCP (`"10Mbps"`, or
    /// bit/s). Normal IPCPs above pace their N-1 flows over it at this
    /// rate, so their PDUs queue in their RMT, where the scheduling policy
    /// decides, instead of in the kernel or the network.
    pub rate: Option<Spanned<rina_wire::units::Rate>>,
    /// shims: bytes the link adds to every frame beyond this shim's own
    /// datagram or frame (headers below it, preamble, gap), counted by the
    /// pacer of `rate` (default 0).
    pub rate_overhead: Option<u32>,
    /// shim-udp: take allocation requests only from the addresses in its
    /// directory, and none claiming a name there from another address.
    pub peers_only: Option<bool>,
    /// shim-udp: how often flows are checked for a live peer, in
    /// milliseconds (default 10,000; 0 turns the check off): a flow with
    /// nothing received for three checks is deallocated.
    pub keepalive_ms: Option<Spanned<u64>>,
    /// shim-hv: the shared-memory file (e.g. under /dev/shm, or an ivshmem BAR).
    pub path: Option<PathBuf>,
    /// shim-hv: which end of the VMPI device this is.
    pub side: Option<HvSide>,
    /// shim-hv: the VMPI-id of the device in this OS (its address; default 0).
    pub vmpi_id: Option<u32>,
    /// shim-hv: poll the rings continuously (one core busy) instead of every millisecond.
    pub busy_poll: Option<bool>,
    /// shim-hv: announce per-flow credit to the peer (default true); false
    /// speaks as IRATI's shim-hv, which has none.
    pub credit: Option<bool>,
    /// normal: the DIF's pre-shared enrollment password (proven by
    /// challenge-response in both directions, never sent).
    pub password: Option<String>,
    /// normal: this member's ed25519 secret key (32 bytes in hex); with
    /// `trusted_keys`, enrollment authenticates by key pairs.
    pub key: Option<String>,
    /// normal: the ed25519 public keys (hex) of the DIF's members.
    #[serde(default)]
    pub trusted_keys: Vec<String>,
    /// normal: encrypt every N-1 flow (needs `password` or `key`).
    pub encryption: Option<bool>,
    /// normal: rotate a flow's keys after this many bytes (default 1 GiB;
    /// at least [`MIN_REKEY_BYTES`]).
    pub rekey_bytes: Option<Spanned<u64>>,
    /// normal: rotate a flow's keys after this many seconds (default 600;
    /// at least [`MIN_REKEY_SECONDS`]).
    pub rekey_seconds: Option<Spanned<u64>>,
    /// normal: largest PDU, in bytes.
    pub max_pdu: Option<Spanned<u32>>,
    /// normal: CRC-32 on every PDU.
    pub crc: Option<bool>,
    /// normal: initial hop limit (0 turns TTL off).
    pub ttl: Option<u8>,
    /// normal: the RMT sets the ECN flag of data PDUs that leave this many
    /// behind in their queue, on every port (0 turns marking off). Left
    /// out, it is 20 raised with a port's rate (65 on a port that is not
    /// paced; `rina_core::rmt::EcnMarking`). Reliable flows with
    /// congestion control slow down on the marks.
    pub ecn_threshold: Option<usize>,
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
    /// normal: the RIB subtrees a neighbour that is a member may read with
    /// CDAP (default `["/"]`: all; `[]`: none).
    pub rib_readable: Option<Vec<String>>,
    /// normal: which application names may register in the DIF and
    /// allocate flows to which (default: any).
    pub access: Option<Spanned<AccessConfig>>,
    /// normal: the RMT scheduling policy (default: fifo).
    pub scheduler: Option<Spanned<SchedulerConfig>>,
    /// normal and shim-udp: most flows (allocated and being allocated) at
    /// once; beyond it allocations are answered `no_resources` (default
    /// [`rina_core::DEFAULT_MAX_FLOWS`], 262,144; at least 1).
    pub max_flows: Option<Spanned<usize>>,
    /// normal: width in bytes of the CEP-id fields of the DIF's PCI: 1, 2
    /// (the default: 65,535 connections per IPCP), 4 or 8. Every member of
    /// the DIF must use the same.
    pub cep_id_bytes: Option<Spanned<u8>>,
    /// normal: the DIF's QoS cubes (default: [`QosCube::defaults`]).
    #[serde(default, rename = "qos_cube")]
    pub qos_cubes: Vec<Spanned<QosCubeConfig>>,
    /// The table as written (without positions): what a reload compares.
    #[serde(skip)]
    pub raw: toml::Table,
}

/// One `[[ipcp.qos_cube]]` table of a normal IPCP.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosCubeConfig {
    /// QoS-id, unique in the DIF (carried in every PDU of the cube).
    pub id: u64,
    /// Name, for listings and `--qos-cube`.
    pub name: String,
    /// Retransmission and in-order delivery (the built-in reliable EFCP
    /// policies) rather than none.
    #[serde(default)]
    pub reliable: bool,
    /// Window flow control without retransmission: the receiving
    /// application's pace holds the writer back, nothing is resent (ignored
    /// with `reliable`, which has both).
    #[serde(default)]
    pub flow_control: bool,
    /// Urgency level in the C/U matrix, 0 = most urgent.
    #[serde(default)]
    pub urgency: u8,
    /// Cherish level in the C/U matrix, 0 = most cherished.
    #[serde(default)]
    pub cherish: u8,
    /// Declared average bandwidth, bit/s.
    pub avg_bandwidth_bps: Option<u64>,
    /// Declared burst, bytes (needs `avg_bandwidth_bps`).
    pub burst_bytes: Option<u64>,
    /// Declared one-way delay bound, microseconds.
    pub delay_us: Option<u64>,
    /// Declared jitter bound, microseconds (needs `delay_us`).
    pub jitter_us: Option<u64>,
    /// Declared loss bound, parts per million.
    pub loss_ppm: Option<u32>,
    /// The cube of each N-1 DIF that carries this cube's PDUs to the
    /// neighbours over that DIF (`lower = { mr = "A1" }`, by name or id).
    /// A DIF not listed carries it on its default cube.
    #[serde(default)]
    pub lower: BTreeMap<String, LowerCubeRef>,
    /// Keepalive of the cube's flows, milliseconds (10 to 3,600,000;
    /// absent: off): a flow that heard nothing for this long probes its
    /// peer, and one that hears nothing for three of them is deallocated
    /// ([`QosCube::keepalive`]).
    pub keepalive_ms: Option<u64>,
    /// EFCP policies and parameters (window, RTO bounds, A-timer, max gap,
    /// congestion control and its parameters) over the cube's defaults;
    /// checked with the file as a change of a running cube is
    /// ([`QosCubeConfig::efcp_config`]).
    #[serde(default)]
    pub efcp: Option<Spanned<rina_core::efcp::EfcpTuning>>,
}

/// A QoS cube of an N-1 DIF, by name or by QoS-id.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum LowerCubeRef {
    /// By QoS-id.
    Id(u64),
    /// By name (or a QoS-id written as a string).
    Name(String),
}

impl LowerCubeRef {
    /// As [`QosCube::lower`] holds it: the name, or the id in decimal.
    pub fn key(&self) -> String {
        match self {
            LowerCubeRef::Id(id) => id.to_string(),
            LowerCubeRef::Name(n) => n.clone(),
        }
    }

    /// The cube of `cubes` it names, if any.
    pub fn find<'a>(&self, cubes: &'a [QosCube]) -> Option<&'a QosCube> {
        rina_core::normal::cubes::find_cube(cubes, &self.key())
    }
}

impl std::fmt::Display for LowerCubeRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LowerCubeRef::Id(id) => write!(f, "{id}"),
            LowerCubeRef::Name(n) => write!(f, "{n:?}"),
        }
    }
}

impl QosCubeConfig {
    /// The cube's EFCP policies before its `efcp` table: the built-in
    /// reliable, flow-controlled or unreliable ones.
    fn base_efcp(&self) -> EfcpConfig {
        if self.reliable {
            EfcpConfig::reliable()
        } else if self.flow_control {
            EfcpConfig::flow_controlled()
        } else {
            EfcpConfig::unreliable()
        }
    }

    /// The cube's EFCP policies: its base with its `efcp` table over them,
    /// checked as the core checks a change of a running cube
    /// (`NormalIpcp::set_cube_efcp`): every key tunes something the cube
    /// has, each is in range, the policies work together and sequence
    /// numbers of `seq_bits` bits carry the window. On error, the key (a
    /// key of the table when one is to blame) and why.
    pub fn efcp_config(&self, seq_bits: u32) -> Result<EfcpConfig, (String, String)> {
        let mut efcp = self.base_efcp();
        let Some(tuning) = &self.efcp else {
            return Ok(efcp);
        };
        let tuning = tuning.get_ref();
        let unused = tuning.inapplicable(&efcp);
        if !unused.is_empty() {
            let has = if efcp.dtcp.is_none() {
                "DTCP (retransmission, flow or congestion control): it is neither `reliable` nor `flow_control`"
            } else {
                "retransmission (it is not `reliable`)"
            };
            let m = format!(
                "QoS cube {} has no {has}; {} would tune nothing",
                self.name,
                unused.join(", ")
            );
            return Err((format!("efcp.{}", unused[0]), m));
        }
        let key = |e: &EfcpError| match e {
            EfcpError::OutOfRange { key, .. } => format!("efcp.{key}"),
            _ => "efcp".to_string(),
        };
        tuning
            .apply(&mut efcp)
            .and_then(|()| efcp.check_seq_width(seq_bits))
            .map_err(|e| (key(&e), e.to_string()))?;
        Ok(efcp)
    }

    /// The cube this table describes (checked with the file: a bad `efcp`
    /// table, were one not refused, would leave the base policies, not
    /// part of it).
    pub fn cube(&self) -> QosCube {
        let efcp = self
            .efcp_config(u32::MAX)
            .unwrap_or_else(|_| self.base_efcp());
        let mut c =
            QosCube::new(self.id, self.name.clone(), efcp).with_cell(self.urgency, self.cherish);
        c.avg_bandwidth_bps = self.avg_bandwidth_bps;
        c.burst_bytes = self.burst_bytes;
        c.delay_us = self.delay_us;
        c.jitter_us = self.jitter_us;
        c.loss_ppm = self.loss_ppm;
        c.keepalive = self.keepalive_ms.map(std::time::Duration::from_millis);
        c.lower = self
            .lower
            .iter()
            .map(|(d, r)| (d.clone(), r.key()))
            .collect();
        c
    }
}

impl Config {
    /// Reads and checks a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Self::load_with(path, |_| Ok(()))
    }

    /// [`Config::load`] of a file that `allowed` accepts, asked of the
    /// file as opened (a reload asked for by a user: may that user read
    /// it?). Only a regular file of at most [`MAX_CONFIG_BYTES`] is read:
    /// the path is opened without blocking and the file measured first,
    /// so that neither a FIFO nor a device (`/dev/zero`) holds the daemon.
    pub fn load_with(
        path: &Path,
        allowed: impl FnOnce(&std::fs::Metadata) -> Result<(), String>,
    ) -> Result<Config, ConfigError> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let read = |source| ConfigError::Read {
            path: path.to_owned(),
            source,
        };
        let refused = |reason: String| ConfigError::Refused {
            path: path.to_owned(),
            reason,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(read)?;
        let meta = file.metadata().map_err(read)?;
        if !meta.is_file() {
            return Err(refused("not a regular file".into()));
        }
        allowed(&meta).map_err(refused)?;
        let too_large = |size: u64| {
            refused(format!(
                "{size} bytes, more than a configuration file may have ({MAX_CONFIG_BYTES})"
            ))
        };
        if meta.len() > MAX_CONFIG_BYTES {
            return Err(too_large(meta.len()));
        }
        let mut text = String::new();
        file.take(MAX_CONFIG_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(read)?;
        if text.len() as u64 > MAX_CONFIG_BYTES {
            return Err(too_large(text.len() as u64));
        }
        Self::parse(path, &text)
    }

    /// Parses and checks the keys of one `[[ipcp]]` table given at run
    /// time (`rinactl ipcp create`), as a TOML document, against the IPCPs
    /// that run (`running`): its name must be new, its neighbours' DIFs
    /// must have a member. `what` names the text in messages.
    pub fn parse_ipcp(
        what: &str,
        text: &str,
        running: &[IpcpConfig],
    ) -> Result<IpcpConfig, ConfigError> {
        let path = Path::new(what);
        let mut ip: IpcpConfig = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: path.to_owned(),
            message: readable(&e.to_string()),
        })?;
        ip.raw = toml::from_str(text).unwrap_or_default();
        let invalid =
            |span: std::ops::Range<usize>, key: String, message: String| ConfigError::Invalid {
                path: path.to_owned(),
                line: line_of(text, span.start),
                key: key.trim_start_matches("ipcp[0].").to_string(),
                message,
            };
        if ip.name.get_ref().is_empty() {
            let e = "must not be empty".to_string();
            return Err(invalid(ip.name.span(), "name".into(), e));
        }
        if running
            .iter()
            .any(|o| o.name.get_ref() == ip.name.get_ref())
        {
            let e = format!("an IPCP named {:?} runs already", ip.name.get_ref());
            return Err(invalid(ip.name.span(), "name".into(), e));
        }
        check_ipcp(0, &ip, running, true).map_err(|(span, k, m)| invalid(span, k, m))?;
        Ok(ip)
    }

    /// Parses and checks configuration text; `path` is only used in messages.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let mut cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: path.to_owned(),
            message: readable(&e.to_string()),
        })?;
        if let Ok(mut t) = toml::from_str::<toml::Table>(text) {
            if let Some(toml::Value::Array(a)) = t.remove("ipcp") {
                for (ip, v) in cfg.ipcps.iter_mut().zip(a) {
                    if let toml::Value::Table(t) = v {
                        ip.raw = t;
                    }
                }
            }
        }
        let invalid =
            |span: std::ops::Range<usize>, key: String, message: String| ConfigError::Invalid {
                path: path.to_owned(),
                line: line_of(text, span.start),
                key,
                message,
            };
        if let Some(m) = &cfg.system.socket_mode {
            m.get_ref()
                .bits()
                .map_err(|e| invalid(m.span(), "system.socket_mode".into(), e))?;
        }
        if let Some(m) = &cfg.system.max_conns_per_user {
            if *m.get_ref() == 0 {
                let e = "must be at least 1".to_string();
                return Err(invalid(m.span(), "system.max_conns_per_user".into(), e));
            }
        }
        if let Some(m) = &cfg.system.max_flows_per_user {
            if *m.get_ref() == 0 {
                let e = "must be at least 1".to_string();
                return Err(invalid(m.span(), "system.max_flows_per_user".into(), e));
            }
        }
        if let Some(m) = &cfg.system.idle_timeout_ms {
            if *m.get_ref() == 0 || *m.get_ref() > 86_400_000 {
                let e = format!("must be 1 to 86400000 (a day), not {}", m.get_ref());
                return Err(invalid(m.span(), "system.idle_timeout_ms".into(), e));
            }
        }
        if let Some(m) = &cfg.system.busy_poll_us {
            if *m.get_ref() > MAX_BUSY_POLL_US {
                let e = format!(
                    "must be 0 to {MAX_BUSY_POLL_US} (a second), not {}",
                    m.get_ref()
                );
                return Err(invalid(m.span(), "system.busy_poll_us".into(), e));
            }
        }
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
            check_ipcp(i, ip, &cfg.ipcps, false).map_err(|(span, k, m)| invalid(span, k, m))?;
        }
        stacking_order(&cfg.ipcps).map_err(|(span, k, m)| invalid(span, k, m))?;
        Ok(cfg)
    }

    /// The indices of its IPCPs in an order to create them in: shims
    /// first, then each normal IPCP after the DIFs its neighbours are
    /// reached through (a DIF may be stacked on another normal DIF). A
    /// parsed file has no loop ([`Config::parse`] refuses one); were there
    /// one, its IPCPs would come last, in file order.
    pub fn creation_order(&self) -> Vec<usize> {
        let shims = (0..self.ipcps.len()).filter(|&i| self.ipcps[i].kind != IpcpKind::Normal);
        let normals = stacking_order(&self.ipcps).unwrap_or_else(|_| {
            (0..self.ipcps.len())
                .filter(|&i| self.ipcps[i].kind == IpcpKind::Normal)
                .collect()
        });
        shims.chain(normals).collect()
    }
}

impl IpcpConfig {
    /// A shim-udp IPCP's liveness check: every `keepalive_ms`, none for 0,
    /// by default every [`rina_core::shim_udp::DEFAULT_KEEPALIVE`].
    pub fn udp_keepalive(&self) -> Option<std::time::Duration> {
        match &self.keepalive_ms {
            Some(k) => (*k.get_ref() > 0).then(|| std::time::Duration::from_millis(*k.get_ref())),
            None => Some(rina_core::shim_udp::DEFAULT_KEEPALIVE),
        }
    }

    /// normal: the QoS cubes of the DIF (the configured ones, else the defaults).
    pub fn cubes(&self) -> Vec<QosCube> {
        if self.qos_cubes.is_empty() {
            QosCube::defaults()
        } else {
            self.qos_cubes.iter().map(|c| c.get_ref().cube()).collect()
        }
    }

    /// normal: the machine configuration this table describes, but for
    /// membership (names, keys, nonces) and the random first CEP-id, which
    /// the daemon adds: the core's standard member
    /// ([`rina_core::normal::NormalConfig::standard`]) with what the file
    /// says over it. The lab's simulator starts from the same standard
    /// member, so one experiment configures the same stack in both.
    pub fn normal_config(&self) -> rina_core::normal::NormalConfig {
        let mut nc =
            rina_core::normal::NormalConfig::standard(self.dif.clone(), self.address.unwrap_or(0));
        if let Some(m) = &self.max_pdu {
            nc.dt.max_pdu_size = *m.get_ref();
        }
        if let Some(m) = &self.max_sdu {
            nc.max_sdu = *m.get_ref() as usize;
        }
        if let Some(w) = &self.cep_id_bytes {
            nc.dt.cep = match w.get_ref() {
                1 => rina_wire::pci::FieldWidth::W1,
                4 => rina_wire::pci::FieldWidth::W4,
                8 => rina_wire::pci::FieldWidth::W8,
                _ => rina_wire::pci::FieldWidth::W2,
            };
        }
        if let Some(crc) = self.crc {
            nc.sdup.crc = crc;
        }
        if self.routing == Some(RoutingKind::LinkState) {
            nc.routing = Some(rina_core::routing::Config::default());
        }
        if self.directory_mode == Some(DirectoryMode::Distributed) {
            nc.dynamic_directory = Some(rina_core::directory::Config::default());
        }
        if let Some(r) = &self.rib_readable {
            nc.rib_readable = r.clone();
        }
        if let Some(a) = &self.access {
            // Checked with the file; were it not, nothing would be allowed.
            nc.access = a
                .get_ref()
                .rules()
                .unwrap_or(rina_core::normal::access::AccessRules {
                    register: Some(Vec::new()),
                    allocate: Some(Vec::new()),
                });
        }
        nc.sdup.ttl = match self.ttl {
            Some(0) => None,
            Some(t) => Some(t),
            None => nc.sdup.ttl,
        };
        nc.cubes = self.cubes();
        if let Some(m) = &self.max_flows {
            nc.max_flows = *m.get_ref();
        }
        match self.ecn_threshold {
            Some(0) => nc.ecn = None,
            Some(t) => nc.ecn = Some(rina_core::rmt::EcnMarking::fixed(t)),
            None => {}
        }
        nc
    }

    /// normal: the largest address the PCI of its DIF carries (its
    /// address fields are as wide as the core's data-transfer constants
    /// make them; no key changes that width).
    pub fn max_address(&self) -> u64 {
        rina_core::normal::NormalConfig::new(self.dif.clone(), 0)
            .dt
            .addr
            .max_value()
    }

    /// normal: `a` as an address in its DIF, or why it cannot be one (a
    /// larger one would be cut short in every PDU).
    pub fn check_address(&self, a: u64) -> Result<(), String> {
        let max = self.max_address();
        if a <= max {
            return Ok(());
        }
        let bytes = rina_core::normal::NormalConfig::new(self.dif.clone(), 0)
            .dt
            .addr
            .bytes();
        Err(format!(
            "address {a} does not fit DIF {:?}: its PCI's address fields are {bytes} bytes, addresses are at most {max}",
            self.dif
        ))
    }

    /// shims: the pacing of normal IPCPs' N-1 flows over this shim, from
    /// `rate` and `rate_overhead`, counting this shim's own header too.
    pub fn port_rate(&self) -> Option<rina_core::rmt::PortRate> {
        let r = self.rate.as_ref()?.get_ref().bps();
        let own = match self.kind {
            IpcpKind::ShimUdp => rina_wire::shim_udp::DATA_HEADER_LEN,
            IpcpKind::ShimEth => {
                rina_wire::shim_eth::ETH_HEADER_LEN
                    + if self.shim_eth_vlan().is_some() {
                        rina_wire::shim_eth::VLAN_TAG_LEN
                    } else {
                        0
                    }
            }
            IpcpKind::ShimHv => 4,
            IpcpKind::Normal => return None,
        };
        Some(
            rina_core::rmt::PortRate::new(r as u64)
                .overhead(self.rate_overhead.unwrap_or(0).saturating_add(own as u32)),
        )
    }

    /// normal: the RMT scheduling policy (fifo unless configured).
    pub fn scheduler_config(&self) -> SchedulerConfig {
        self.scheduler
            .as_ref()
            .map(|s| s.get_ref().clone())
            .unwrap_or_default()
    }

    /// shim-eth: the VLAN id, from `vlan` or else from a numeric DIF name;
    /// `None` when untagged (or not a shim-eth IPCP).
    pub fn shim_eth_vlan(&self) -> Option<u16> {
        if self.untagged == Some(true) {
            return None;
        }
        match &self.vlan {
            Some(v) => Some(*v.get_ref()),
            None => self
                .dif
                .parse::<u16>()
                .ok()
                .filter(|v| (1..=4094).contains(v)),
        }
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
