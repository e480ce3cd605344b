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
//! # rekey_bytes = 1073741824      # new keys after this many bytes per key...
//! # rekey_seconds = 600           # ...or after this long
//! # max_pdu = 9000                # largest PDU (default rina_core::normal::DEFAULT_MAX_PDU,
//!                                 # 9000); larger SDUs are fragmented
//! # max_sdu = 65536
//! # crc = false                   # CRC-32 on every PDU
//! # ttl = 64                      # hop limit
//! # max_flows = 262144            # most flows at once (also for shim-udp and shim-eth)
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
    /// shim-hv: the shared-memory file (e.g. under /dev/shm, or an ivshmem BAR).
    pub path: Option<PathBuf>,
    /// shim-hv: which end of the VMPI device this is.
    pub side: Option<HvSide>,
    /// shim-hv: the VMPI-id of the device in this OS (its address; default 0).
    pub vmpi_id: Option<u32>,
    /// shim-hv: poll the rings continuously (one core busy) instead of every millisecond.
    pub busy_poll: Option<bool>,
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
    /// normal: rotate a flow's keys after this many bytes (default 1 GiB).
    pub rekey_bytes: Option<u64>,
    /// normal: rotate a flow's keys after this many seconds (default 600).
    pub rekey_seconds: Option<u64>,
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
    /// [`rina_core::DEFAULT_MAX_FLOWS`], 262,144).
    pub max_flows: Option<usize>,
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
    /// EFCP policies and parameters (window, RTO bounds, A-timer, max gap,
    /// congestion control and its parameters) over the cube's defaults.
    #[serde(default)]
    pub efcp: rina_core::efcp::EfcpTuning,
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
    /// The cube this table describes.
    pub fn cube(&self) -> QosCube {
        let mut efcp = if self.reliable {
            rina_core::efcp::EfcpConfig::reliable()
        } else if self.flow_control {
            rina_core::efcp::EfcpConfig::flow_controlled()
        } else {
            rina_core::efcp::EfcpConfig::unreliable()
        };
        // A bad combination is refused when the IPCP is built (the cube's
        // EFCP configuration is validated there).
        let _ = self.efcp.apply(&mut efcp);
        let mut c =
            QosCube::new(self.id, self.name.clone(), efcp).with_cell(self.urgency, self.cherish);
        c.avg_bandwidth_bps = self.avg_bandwidth_bps;
        c.burst_bytes = self.burst_bytes;
        c.delay_us = self.delay_us;
        c.jitter_us = self.jitter_us;
        c.loss_ppm = self.loss_ppm;
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

/// The normal IPCPs of `all`, by index, in an order where the DIF each
/// neighbour is reached through has a member first: a shim, a normal IPCP
/// earlier in the order, or no IPCP of `all` at all. On a loop, the
/// `over` of a neighbour entry in it, its key, and the IPCPs of the loop.
fn stacking_order(all: &[IpcpConfig]) -> Result<Vec<usize>, KeyError> {
    let mut left: Vec<usize> = (0..all.len())
        .filter(|&i| all[i].kind == IpcpKind::Normal)
        .collect();
    let mut order: Vec<usize> = Vec::new();
    // The first neighbour of IPCP `i` whose DIF has no member yet, and an
    // IPCP still waiting in that DIF.
    let blocked = |i: usize, order: &[usize]| -> Option<(usize, usize)> {
        all[i].neighbors.iter().enumerate().find_map(|(k, nb)| {
            let over = nb.over.get_ref();
            let ready = all.iter().all(|o| &o.dif != over)
                || all.iter().enumerate().any(|(j, o)| {
                    &o.dif == over && (o.kind != IpcpKind::Normal || order.contains(&j))
                });
            let waiting = (0..all.len()).find(|&j| &all[j].dif == over && j != i);
            (!ready).then_some((k, waiting?))
        })
    };
    while !left.is_empty() {
        match left.iter().position(|&i| blocked(i, &order).is_none()) {
            Some(p) => order.push(left.remove(p)),
            None => return Err(stacking_loop(all, left[0], |i| blocked(i, &order))),
        }
    }
    Ok(order)
}

/// The error of a stacking loop reached from normal IPCP `start`;
/// `blocked` says which neighbour of an IPCP waits for which IPCP.
fn stacking_loop(
    all: &[IpcpConfig],
    start: usize,
    blocked: impl Fn(usize) -> Option<(usize, usize)>,
) -> KeyError {
    // Follow what each waits for until an IPCP comes back: the loop.
    let mut path: Vec<(usize, usize)> = Vec::new();
    let mut cur = start;
    let cycle = loop {
        if let Some(p) = path.iter().position(|&(i, _)| i == cur) {
            break &path[p..];
        }
        let Some((k, next)) = blocked(cur) else {
            break &path[..];
        };
        path.push((cur, k));
        cur = next;
    };
    let names: Vec<&str> = cycle
        .iter()
        .map(|&(i, _)| all[i].name.get_ref().as_str())
        .collect();
    let steps: Vec<String> = cycle
        .iter()
        .map(|&(i, k)| {
            let nb = &all[i].neighbors[k];
            format!(
                "{} reaches neighbour {} over DIF {:?}",
                all[i].name.get_ref(),
                nb.name,
                nb.over.get_ref()
            )
        })
        .collect();
    let (i, k) = cycle.first().copied().unwrap_or((start, 0));
    let span = all[i]
        .neighbors
        .get(k)
        .map_or_else(|| all[i].name.span(), |nb| nb.over.span());
    (
        span,
        format!("ipcp[{i}].neighbor[{k}].over"),
        format!(
            "normal IPCPs {} are stacked on each other in a loop: {}; no DIF of the loop can be created first",
            names.join(", "),
            steps.join(", ")
        ),
    )
}

/// Where a key is wrong, which key, and why.
type KeyError = (std::ops::Range<usize>, String, String);

/// Checks IPCP `i` of a configuration whose IPCPs are `all` (for a
/// neighbour's `over` and a lower cube mapping); `runtime`: created at run
/// time, where a normal IPCP may wait for `rinactl ipcp enroll` with
/// neither an address nor a neighbour.
fn check_ipcp(
    i: usize,
    ip: &IpcpConfig,
    all: &[IpcpConfig],
    runtime: bool,
) -> Result<(), KeyError> {
    let key = |k: &str| format!("ipcp[{i}].{k}");
    for (k, v) in [("name", ip.name.get_ref()), ("dif", &ip.dif)] {
        if v.is_empty() || v.len() > MAX_NAME_BYTES {
            let e = format!("must have 1 to {MAX_NAME_BYTES} bytes, not {}", v.len());
            return Err((ip.name.span(), key(k), e));
        }
    }
    if ip.kind == IpcpKind::ShimUdp && ip.bind.is_none() {
        return Err((
            ip.name.span(),
            key("bind"),
            "a shim-udp IPCP needs `bind = \"host:port\"`".into(),
        ));
    }
    check_bind(i, ip, all, runtime)?;
    let hv_keys =
        ip.path.is_some() || ip.side.is_some() || ip.vmpi_id.is_some() || ip.busy_poll.is_some();
    if ip.kind == IpcpKind::ShimHv {
        if ip.path.is_none() || ip.side.is_none() {
            return Err((
                ip.name.span(),
                key("path/side"),
                "a shim-hv IPCP needs `path = \"/dev/shm/...\"` and `side = \"host\"` or `\"guest\"`".into(),
            ));
        }
        if ip.bind.is_some() || !ip.directory.is_empty() {
            return Err((
                ip.name.span(),
                key("bind/directory"),
                "`bind` and `directory` are for shim-udp IPCPs".into(),
            ));
        }
    } else if hv_keys {
        return Err((
            ip.name.span(),
            key("path/side/vmpi_id/busy_poll"),
            "`path`, `side`, `vmpi_id` and `busy_poll` are for shim-hv IPCPs".into(),
        ));
    }
    let eth_keys = ip.interface.is_some()
        || ip.vlan.is_some()
        || ip.untagged.is_some()
        || ip.tx_delay_us.is_some()
        || ip.tx_loss.is_some()
        || ip.tx_seed.is_some();
    if ip.kind == IpcpKind::ShimEth {
        check_shim_eth(ip).map_err(|(span, k, m)| (span, key(k), m))?;
    } else if eth_keys {
        return Err((
            ip.name.span(),
            key("interface/vlan/untagged/tx_*"),
            "`interface`, `vlan`, `untagged` and `tx_delay_us`/`tx_loss`/`tx_seed` are for shim-eth IPCPs".into(),
        ));
    }
    if ip.kind == IpcpKind::Normal {
        check_normal(i, ip, all, runtime)?;
    } else if ip.address.is_some()
        || ip.password.is_some()
        || ip.key.is_some()
        || !ip.trusted_keys.is_empty()
        || ip.encryption.is_some()
        || ip.rekey_bytes.is_some()
        || ip.rekey_seconds.is_some()
        || !ip.neighbors.is_empty()
        || !ip.names.is_empty()
        || ip.routing.is_some()
        || ip.directory_mode.is_some()
        || ip.rib_readable.is_some()
        || ip.access.is_some()
        || ip.cep_id_bytes.is_some()
    {
        return Err((
            ip.name.span(),
            key("address/password/neighbor/names/routing/directory_mode/access/cep_id_bytes"),
            "`address`, `password`, `neighbor`, `names`, `routing`, `directory_mode`, `access` and `cep_id_bytes` are for normal IPCPs".into(),
        ));
    }
    if ip.kind == IpcpKind::Normal && (ip.rate.is_some() || ip.rate_overhead.is_some()) {
        return Err((
            ip.name.span(),
            key("rate"),
            "`rate` and `rate_overhead` are the capacity of a shim's link; a normal IPCP paces its N-1 flows at the rate of the shim below".into(),
        ));
    }
    if let Some(r) = &ip.rate {
        let bps = r.get_ref().bps();
        if !(1e3..=1e12).contains(&bps) {
            return Err((
                r.span(),
                key("rate"),
                format!("must be between 1kbps and 1000Gbps, not {}", r.get_ref()),
            ));
        }
    }
    if ip.kind != IpcpKind::Normal && (ip.scheduler.is_some() || !ip.qos_cubes.is_empty()) {
        return Err((
            ip.name.span(),
            key("scheduler/qos_cube"),
            "`scheduler` and `qos_cube` are for normal IPCPs".into(),
        ));
    }
    if let Some(m) = &ip.max_sdu {
        // A normal IPCP delimits and fragments, up to its default (the
        // documented example's 65536); a shim-udp SDU fits a datagram.
        let max = match ip.kind {
            IpcpKind::Normal => rina_core::normal::DEFAULT_MAX_SDU as u32,
            _ => rina_core::shim_udp::DEFAULT_MAX_SDU,
        };
        if *m.get_ref() == 0 || *m.get_ref() > max {
            return Err((
                m.span(),
                format!("ipcp[{i}].max_sdu"),
                format!("must be between 1 and {max}, not {}", m.get_ref()),
            ));
        }
    }
    Ok(())
}

/// Refuses a shim-udp IPCP `ip` (number `i` of `all`) whose `bind` takes
/// the UDP port of another one: of an IPCP before it in the file, or of
/// any that runs (`runtime`: `all` are the running IPCPs). Port 0 (any
/// free port) takes none.
fn check_bind(
    i: usize,
    ip: &IpcpConfig,
    all: &[IpcpConfig],
    runtime: bool,
) -> Result<(), KeyError> {
    let Some(b) = ip.bind.as_ref().filter(|_| ip.kind == IpcpKind::ShimUdp) else {
        return Ok(());
    };
    let mine = *b.get_ref();
    let clash = |o: &SocketAddr| {
        mine.port() != 0
            && o.port() == mine.port()
            && o.is_ipv4() == mine.is_ipv4()
            && (o.ip() == mine.ip() || o.ip().is_unspecified() || mine.ip().is_unspecified())
    };
    let others = if runtime {
        all
    } else {
        &all[..i.min(all.len())]
    };
    let other = others.iter().find(|o| {
        o.kind == IpcpKind::ShimUdp && o.bind.as_ref().is_some_and(|ob| clash(ob.get_ref()))
    });
    match other {
        Some(o) => Err((
            b.span(),
            format!("ipcp[{i}].bind"),
            format!(
                "{mine} takes the UDP port of shim-udp IPCP {} (bind = {}); two IPCPs cannot bind the same port",
                o.name.get_ref(),
                o.bind.as_ref().map_or(String::new(), |ob| ob.get_ref().to_string())
            ),
        )),
        None => Ok(()),
    }
}

/// The checks of a normal IPCP's own keys (see [`check_ipcp`]).
fn check_normal(
    i: usize,
    ip: &IpcpConfig,
    all: &[IpcpConfig],
    runtime: bool,
) -> Result<(), KeyError> {
    let key = |k: &str| format!("ipcp[{i}].{k}");
    if ip.address == Some(0) {
        return Err((
            ip.name.span(),
            key("address"),
            "addresses start at 1; leave `address` out to enroll".into(),
        ));
    }
    if ip.address.is_none() && ip.neighbors.is_empty() && !runtime {
        return Err((
            ip.name.span(),
            key("address"),
            "a normal IPCP needs `address = N` (a bootstrap member) or a `[[ipcp.neighbor]]` to enroll through".into(),
        ));
    }
    if ip.bind.is_some() || !ip.directory.is_empty() {
        return Err((
            ip.name.span(),
            key("bind/directory"),
            "`bind` and `directory` are for shim-udp IPCPs; a normal IPCP has `names` and `neighbor`".into(),
        ));
    }
    if let Some(w) = &ip.cep_id_bytes {
        if ![1, 2, 4, 8].contains(w.get_ref()) {
            return Err((
                w.span(),
                key("cep_id_bytes"),
                format!("must be 1, 2, 4 or 8, not {}", w.get_ref()),
            ));
        }
    }
    if let Some(m) = &ip.max_pdu {
        if !(64..=65_000).contains(m.get_ref()) {
            return Err((
                m.span(),
                key("max_pdu"),
                format!("must be between 64 and 65000, not {}", m.get_ref()),
            ));
        }
    }
    for (k, n) in ip.neighbors.iter().enumerate() {
        let over = n.over.get_ref();
        let found = all.iter().any(|o| &o.dif == over && o.dif != ip.dif);
        if !found {
            return Err((
                n.over.span(),
                format!("ipcp[{i}].neighbor[{k}].over"),
                format!("no other IPCP of this system is in DIF {over:?}"),
            ));
        }
    }
    if let Some(a) = &ip.access {
        a.get_ref()
            .rules()
            .map_err(|e| (a.span(), key("access"), e.to_string()))?;
    }
    for (k, p) in ip.rib_readable.iter().flatten().enumerate() {
        rina_core::rib::validate_name(p, &rina_core::rib::Config::default()).map_err(|e| {
            let m = format!("{e} (a subtree of the RIB, such as \"/ra\"; [] for none)");
            (ip.name.span(), key(&format!("rib_readable[{k}]")), m)
        })?;
    }
    check_identity(ip).map_err(|(k, m)| (ip.name.span(), key(&k), m))?;
    check_qos(ip).map_err(|(span, k, m)| (span, key(&k), m))?;
    check_lower_cubes(ip, all).map_err(|(span, k, m)| (span, key(&k), m))?;
    for dst in ip.routes.keys() {
        if dst.parse::<u64>().is_err() {
            return Err((
                ip.name.span(),
                key("routes"),
                format!("route destinations are addresses (numbers), not {dst:?}"),
            ));
        }
    }
    check_addresses(ip).map_err(|(span, k, m)| (span, key(&k), m))
}

/// Checks that every address normal IPCP `ip` names fits its DIF's
/// address fields: its own, its neighbours', its routes' destinations
/// and next hops, its static directory's.
fn check_addresses(ip: &IpcpConfig) -> Result<(), (std::ops::Range<usize>, String, String)> {
    let at = |span: std::ops::Range<usize>, k: String, a: u64| {
        ip.check_address(a).map_err(|m| (span, k, m))
    };
    if let Some(a) = ip.address {
        at(ip.name.span(), "address".into(), a)?;
    }
    for (k, n) in ip.neighbors.iter().enumerate() {
        if let Some(a) = n.address {
            at(n.over.span(), format!("neighbor[{k}].address"), a)?;
        }
    }
    // Where every neighbour's address is written, a next hop must be one
    // of them (a route through anything else reaches nobody).
    let known: Option<Vec<u64>> = ip.neighbors.iter().map(|n| n.address).collect();
    for (dst, &hop) in &ip.routes {
        let k = format!("routes.{dst:?}");
        at(ip.name.span(), k.clone(), dst.parse().unwrap_or(0))?;
        at(ip.name.span(), k.clone(), hop)?;
        if let Some(known) = known.as_ref().filter(|k| !k.contains(&hop)) {
            let list: Vec<String> = known.iter().map(u64::to_string).collect();
            let m = format!(
                "next hop {hop} is not a neighbour's address (the neighbours': {})",
                if list.is_empty() {
                    "none".into()
                } else {
                    list.join(", ")
                }
            );
            return Err((ip.name.span(), k, m));
        }
    }
    for (app, &a) in &ip.names {
        at(ip.name.span(), format!("names.\"{app}\""), a)?;
    }
    Ok(())
}

/// Checks what a normal IPCP is known by: its name as an application
/// name, its enrollment key pair; on error, which key and why.
fn check_identity(ip: &IpcpConfig) -> Result<(), (String, String)> {
    if let Err(e) = ip.name.get_ref().parse::<AppName>() {
        let m = format!("a normal IPCP's name is its application name in the DIFs below: {e}");
        return Err(("name".into(), m));
    }
    let is_key =
        |s: &str| rina_core::enrollment::auth::unhex(s.trim()).is_some_and(|v| v.len() == 32);
    let bad = "expected 32 bytes as 64 hex digits";
    if ip.key.as_deref().is_some_and(|k| !is_key(k)) {
        return Err(("key".into(), bad.into()));
    }
    if let Some(n) = ip.trusted_keys.iter().position(|k| !is_key(k)) {
        return Err((format!("trusted_keys[{n}]"), bad.into()));
    }
    if ip.key.is_none() && !ip.trusted_keys.is_empty() {
        return Err(("trusted_keys".into(), "`trusted_keys` needs `key`".into()));
    }
    Ok(())
}

/// The longest `tx_delay_us` (1 s): every frame sent waits out the delay
/// in memory.
pub const MAX_TX_DELAY_US: u64 = 1_000_000;

/// Checks the keys of a shim-eth IPCP; on error, where, which key and why.
fn check_shim_eth(ip: &IpcpConfig) -> Result<(), (std::ops::Range<usize>, &'static str, String)> {
    let name = ip.name.span();
    if ip.interface.as_deref().is_none_or(str::is_empty) {
        return Err((
            name,
            "interface",
            "a shim-eth IPCP needs `interface = \"eth0\"`".into(),
        ));
    }
    if let Some(d) = ip
        .tx_delay_us
        .as_ref()
        .filter(|d| *d.get_ref() > MAX_TX_DELAY_US)
    {
        return Err((
            d.span(),
            "tx_delay_us",
            format!(
                "must be at most {MAX_TX_DELAY_US} (1 s; frames wait out the delay in memory), not {}",
                d.get_ref()
            ),
        ));
    }
    if ip.tx_loss.is_some_and(|l| !(0.0..1.0).contains(&l)) {
        return Err((name, "tx_loss", "must be in [0, 1)".into()));
    }
    if ip.bind.is_some() || !ip.directory.is_empty() || ip.max_sdu.is_some() {
        return Err((
            name,
            "bind/directory/max_sdu",
            "a shim-eth IPCP resolves names with ARP and takes its max SDU from the interface MTU; `bind`, `directory` and `max_sdu` are for shim-udp".into(),
        ));
    }
    match (&ip.vlan, ip.untagged.unwrap_or(false)) {
        (Some(v), true) => Err((
            v.span(),
            "vlan",
            "`vlan` and `untagged = true` exclude each other".into(),
        )),
        (Some(v), false) if !(1..=4094).contains(v.get_ref()) => Err((
            v.span(),
            "vlan",
            format!("must be between 1 and 4094, not {}", v.get_ref()),
        )),
        (None, false) if ip.shim_eth_vlan().is_none() => Err((
            name,
            "vlan",
            format!(
                "a shim-eth IPCP needs `vlan = N` (1..4094), a DIF name that is a VLAN id (not {:?}), or `untagged = true`",
                ip.dif
            ),
        )),
        _ => Ok(()),
    }
}

/// Checks the QoS cubes and the scheduling policy of a normal IPCP (the
/// policy against the cubes' places in the C/U matrix); on error, where,
/// which key and why.
fn check_qos(ip: &IpcpConfig) -> Result<(), (std::ops::Range<usize>, String, String)> {
    let mut ids = HashSet::new();
    for (k, c) in ip.qos_cubes.iter().enumerate() {
        let key = |f: &str| format!("qos_cube[{k}].{f}");
        let (span, c) = (c.span(), c.get_ref());
        if !ids.insert(c.id) {
            return Err((span, key("id"), format!("QoS-id {} is used twice", c.id)));
        }
        if c.name.is_empty() {
            return Err((span, key("name"), "must not be empty".into()));
        }
        if c.burst_bytes.is_some() && c.avg_bandwidth_bps.is_none() {
            return Err((span, key("burst_bytes"), "needs `avg_bandwidth_bps`".into()));
        }
        if c.jitter_us.is_some() && c.delay_us.is_none() {
            return Err((span, key("jitter_us"), "needs `delay_us`".into()));
        }
    }
    if let Some(s) = &ip.scheduler {
        if let Ok(v) = serde_json::to_value(s.get_ref()) {
            check_sched_bounds(&v).map_err(|m| (s.span(), "scheduler".to_string(), m))?;
        }
        let cu = rina_core::normal::cubes::cu_map(&ip.cubes());
        if let Err(e) = s.get_ref().build(&cu) {
            let SchedConfigError::BadParam { param, .. } = &e;
            return Err((s.span(), format!("scheduler.{param}"), e.to_string()));
        }
    }
    Ok(())
}

/// Checks the `lower` mapping of each QoS cube of normal IPCP `ip`: each DIF
/// named must be a normal DIF this IPCP has a neighbour over, and the cube
/// named must exist there when that DIF's cubes are known from this file
/// (its IPCP here is a bootstrap member or lists its cubes); otherwise the
/// daemon checks when it sets up the N-1 flows.
fn check_lower_cubes(
    ip: &IpcpConfig,
    all: &[IpcpConfig],
) -> Result<(), (std::ops::Range<usize>, String, String)> {
    for (k, c) in ip.qos_cubes.iter().enumerate() {
        let (span, c) = (c.span(), c.get_ref());
        for (dif, r) in &c.lower {
            let key = format!("qos_cube[{k}].lower.{dif}");
            if !ip.neighbors.iter().any(|n| n.over.get_ref() == dif) {
                return Err((
                    span,
                    key,
                    format!(
                        "QoS cube {} maps to DIF {dif:?}, but no `[[ipcp.neighbor]]` of this IPCP is over it",
                        c.name
                    ),
                ));
            }
            let Some(lower) = all.iter().find(|o| &o.dif == dif && o.dif != ip.dif) else {
                continue;
            };
            if lower.kind != IpcpKind::Normal {
                return Err((
                    span,
                    key,
                    format!(
                        "QoS cube {} maps to a cube of DIF {dif:?}, a shim DIF without QoS cubes",
                        c.name
                    ),
                ));
            }
            if lower.address.is_none() && lower.qos_cubes.is_empty() {
                continue;
            }
            let cubes = lower.cubes();
            if r.find(&cubes).is_none() {
                return Err((
                    span,
                    key,
                    format!(
                        "QoS cube {} maps to cube {r} of DIF {dif:?}, which offers {}",
                        c.name,
                        rina_core::normal::cubes::cube_list(&cubes)
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod cube_mapping_tests {
    use super::*;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("t.toml"), s)
    }

    /// Seed 003: MR DIF with A1..B2 over a shim, SPN DIF above it with
    /// Gold and Silver over A1, Sensitive BE over A2, Bronze over B1, BE
    /// over B2; `extra` is appended to the last cube.
    fn seed003(a1: &str, extra: &str) -> String {
        let mut s = String::from(
            "[system]\nname = \"a\"\n\
             [[ipcp]]\nname = \"a.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:1\"\n\
             [[ipcp]]\nname = \"a.mr\"\ntype = \"normal\"\ndif = \"mr\"\naddress = 1\n\
             [[ipcp.neighbor]]\nname = \"b.mr\"\nover = \"udp\"\n",
        );
        for (id, n, u, c) in [
            (1, "A1", 0, 0),
            (2, "A2", 0, 1),
            (3, "B1", 1, 0),
            (4, "B2", 1, 1),
        ] {
            s += &format!(
                "[[ipcp.qos_cube]]\nid = {id}\nname = \"{n}\"\nurgency = {u}\ncherish = {c}\n"
            );
        }
        s += "[[ipcp]]\nname = \"a.spn\"\ntype = \"normal\"\ndif = \"spn\"\naddress = 1\n\
              [[ipcp.neighbor]]\nname = \"b.spn\"\nover = \"mr\"\n";
        for (id, n, lower) in [
            (1, "gold", a1),
            (2, "silver", "\"A1\""),
            (3, "sensitive-be", "\"A2\""),
            (4, "bronze", "3"),
            (5, "be", "\"B2\""),
        ] {
            s += &format!(
                "[[ipcp.qos_cube]]\nid = {id}\nname = \"{n}\"\nlower = {{ mr = {lower} }}\n"
            );
        }
        s + extra
    }

    #[test]
    fn the_mapping_of_seed_003_is_expressible() {
        let cfg = parse(&seed003("\"A1\"", "")).unwrap();
        let spn = &cfg.ipcps[2];
        let mr = cfg.ipcps[1].cubes();
        let map: Vec<(String, String)> = spn
            .qos_cubes
            .iter()
            .map(|c| {
                let c = c.get_ref();
                (
                    c.name.clone(),
                    c.lower["mr"].find(&mr).unwrap().name.clone(),
                )
            })
            .collect();
        let want = [
            ("gold", "A1"),
            ("silver", "A1"),
            ("sensitive-be", "A2"),
            ("bronze", "B1"),
            ("be", "B2"),
        ];
        assert_eq!(map, want.map(|(a, b)| (a.to_string(), b.to_string())));
    }

    #[test]
    fn a_bad_mapping_names_the_cube_and_what_the_dif_below_offers() {
        let e = parse(&seed003("\"C1\"", "")).unwrap_err().to_string();
        assert!(
            e.contains("qos_cube[0].lower.mr")
                && e.contains("QoS cube gold maps to cube \"C1\" of DIF \"mr\"")
                && e.contains("which offers A1 (1), A2 (2), B1 (3), B2 (4)"),
            "{e}"
        );
        let e = parse(&seed003("9", "")).unwrap_err().to_string();
        assert!(e.contains("cube 9 of DIF"), "{e}");
        let e = parse(&seed003("\"A1\"", "lower = { udp = \"x\" }\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no `[[ipcp.neighbor]]`") || e.contains("duplicate"),
            "{e}"
        );
    }
}

impl IpcpConfig {
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
        if let Some(m) = self.max_flows {
            nc.max_flows = m;
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
    fn only_a_regular_file_of_bounded_size_is_read() {
        let d = std::env::temp_dir().join(format!("rinad-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let good = d.join("good.toml");
        std::fs::write(&good, GOOD).unwrap();
        assert_eq!(Config::load(&good).unwrap().system.name, "alpha");
        // A device that never ends and a directory: refused, not read.
        let e = Config::load(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/dev/zero: not a regular file"), "{e}");
        let e = Config::load(&d).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        // A FIFO with no writer: refused at once (the open does not wait).
        let fifo = d.join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = Config::load(&fifo).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        // Too large: refused by its size, unread.
        let big = d.join("big.toml");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_CONFIG_BYTES + 1)
            .unwrap();
        let e = Config::load(&big).unwrap_err().to_string();
        assert!(e.contains("more than a configuration file may have"), "{e}");
        // The caller's own refusal, asked of the opened file.
        let e = Config::load_with(&good, |m| Err(format!("{} bytes, no", m.len())))
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with(&format!("good.toml: {} bytes, no", GOOD.len())),
            "{e}"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

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
        assert!(
            e.contains("unknown field `bnd`: did you mean `bind`?"),
            "{e}"
        );
        // Nothing near: every key is listed.
        let bad = GOOD.replace("bind =", "zzzzzzz =");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(
            e.contains(
                "unknown field `zzzzzzz`: no key of that name; the keys are name, type, dif, bind"
            ),
            "{e}"
        );
        // In [system] too.
        let bad = GOOD.replace("name = \"alpha\"", "nmae = \"alpha\"");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("did you mean `name`?"), "{e}");
    }

    #[test]
    fn dif_and_ipcp_names_are_1_to_255_bytes() {
        let e = parse(&GOOD.replace("dif = \"udp\"", "dif = \"\"")).unwrap_err();
        assert!(
            e.to_string()
                .contains("key `ipcp[0].dif`: must have 1 to 255 bytes, not 0"),
            "{e}"
        );
        let long = "d".repeat(256);
        let e = parse(&GOOD.replace("dif = \"udp\"", &format!("dif = \"{long}\""))).unwrap_err();
        assert!(e.to_string().contains("not 256"), "{e}");
        let e =
            parse(&GOOD.replace("name = \"a.udp\"", &format!("name = \"{long}\""))).unwrap_err();
        assert!(
            e.to_string()
                .contains("key `ipcp[0].name`: must have 1 to 255 bytes"),
            "{e}"
        );
        let ok = "d".repeat(255);
        parse(&GOOD.replace("dif = \"udp\"", &format!("dif = \"{ok}\""))).unwrap();
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
    fn two_shim_udp_ipcps_binding_one_port_are_refused_naming_the_second() {
        let second = |bind: &str| {
            format!("{GOOD}\n[[ipcp]]\nname = \"b.udp\"\ntype = \"shim-udp\"\ndif = \"udp2\"\nbind = \"{bind}\"\n")
        };
        for bind in ["127.0.0.1:7001", "0.0.0.0:7001"] {
            let e = parse(&second(bind)).unwrap_err().to_string();
            assert!(
                e.contains("line 19")
                    && e.contains("`ipcp[1].bind`")
                    && e.contains("shim-udp IPCP a.udp (bind = 127.0.0.1:7001)"),
                "{e}"
            );
        }
        // Another port, another address or any free port: no clash.
        for bind in [
            "127.0.0.1:7002",
            "127.0.0.2:7001",
            "127.0.0.1:0",
            "[::1]:7001",
        ] {
            parse(&second(bind)).unwrap();
        }
        // At run time, against the IPCPs that run.
        let running = parse(GOOD).unwrap().ipcps;
        let e = Config::parse_ipcp(
            "ipcp create",
            "name = \"b.udp\"\ntype = \"shim-udp\"\ndif = \"u2\"\nbind = \"127.0.0.1:7001\"\n",
            &running,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("line 4") && e.contains("`bind`") && e.contains("a.udp"),
            "{e}"
        );
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
        assert_eq!(n.neighbors[0].address, Some(2));
        assert_eq!(n.routes["3"], 2);
        assert_eq!(n.names[&"echo".parse().unwrap()], 3);
    }

    #[test]
    fn max_sdu_is_bounded_by_what_each_kind_carries() {
        // A normal IPCP fragments: its documented 65536 is accepted (it was
        // refused as more than a UDP datagram holds); a shim-udp's is not.
        let with = |after: &str, v: u32| TWO.replacen(after, &format!("{after}\nmax_sdu = {v}"), 1);
        parse(&with("crc = true", 65_536)).unwrap();
        let e = parse(&with("crc = true", 65_537)).unwrap_err().to_string();
        assert!(e.contains("ipcp[1].max_sdu") && e.contains("65536"), "{e}");
        let e = parse(&with("bind = \"127.0.0.1:7001\"", 65_536))
            .unwrap_err()
            .to_string();
        assert!(e.contains("ipcp[0].max_sdu") && e.contains("65502"), "{e}");
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
        // Without an address it enrolls through its neighbour...
        let c = parse(&TWO.replace("address = 1\n", "")).unwrap();
        assert_eq!(c.ipcps[1].address, None);
        // ...so it needs one.
        let lone = TWO.replace("address = 1\n", "");
        let lone = &lone[..lone.find("[[ipcp.neighbor]]").unwrap()];
        let e = parse(lone).unwrap_err().to_string();
        assert!(e.contains("ipcp[1].address") && e.contains("enroll"), "{e}");
        let e = parse(&TWO.replace("\"3\" = 2", "\"three\" = 2"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("routes"), "{e}");
        let e = parse(&TWO.replace("crc = true", "crc = true\nbind = \"127.0.0.1:1\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("shim-udp"), "{e}");
    }

    #[test]
    fn a_static_route_goes_through_a_neighbour() {
        let e = parse(&TWO.replace("\"3\" = 2", "\"3\" = 9"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("routes.\"3\"")
                && e.contains("next hop 9 is not a neighbour's address (the neighbours': 2)"),
            "{e}"
        );
        // A neighbour whose address is learnt at run time: nothing to check.
        parse(
            &TWO.replace("\"3\" = 2", "\"3\" = 9")
                .replace("over = \"udp\"\naddress = 2\n", "over = \"udp\"\n"),
        )
        .unwrap();
    }

    #[test]
    fn rib_readable_takes_rib_subtrees_only() {
        let with =
            |v: &str| TWO.replace("crc = true\n", &format!("crc = true\nrib_readable = {v}\n"));
        for ok in ["[]", "[\"/\"]", "[\"/ra\", \"/difm/enr\"]"] {
            parse(&with(ok)).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        // An empty string read as "everything" in the DIF's policy.
        for bad in ["[\"\"]", "[\"/ra\", \"ra\"]", "[\"/ra/\"]"] {
            let e = parse(&with(bad)).unwrap_err().to_string();
            assert!(
                e.contains("line 15:") && e.contains("`ipcp[1].rib_readable["),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn addresses_wider_than_the_difs_address_field_are_refused() {
        // Two-byte address fields: 65535 fits, 65536 would be cut short.
        parse(&TWO.replace("address = 1\n", "address = 65535\n")).unwrap();
        for (from, to, key, line) in [
            (
                "address = 1\n",
                "address = 70000\n",
                "`ipcp[1].address`",
                15,
            ),
            (
                "address = 2\n",
                "address = 65536\n",
                "`ipcp[1].neighbor[0].address`",
                23,
            ),
            (
                "\"3\" = 2",
                "\"70000\" = 2",
                "`ipcp[1].routes.\"70000\"`",
                15,
            ),
            ("\"3\" = 2", "\"3\" = 70000", "`ipcp[1].routes.\"3\"`", 15),
            (
                "\"echo\" = 3",
                "\"echo\" = 70000",
                "`ipcp[1].names.\"echo\"`",
                15,
            ),
        ] {
            let e = parse(&TWO.replace(from, to)).unwrap_err().to_string();
            assert!(
                e.contains(&format!("line {line}:"))
                    && e.contains(key)
                    && e.contains("does not fit DIF \"net\"")
                    && e.contains("2 bytes, addresses are at most 65535"),
                "{to}: {e}"
            );
        }
        // At run time (`rinactl ipcp create`) too.
        let running = parse(TWO).unwrap().ipcps;
        let e = Config::parse_ipcp(
            "ipcp create",
            "name = \"c.net\"\ntype = \"normal\"\ndif = \"net2\"\naddress = 70000\n",
            &running,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("`address`") && e.contains("at most 65535"),
            "{e}"
        );
    }

    #[test]
    fn scheduler_and_qos_cubes_parse() {
        let with = format!(
            "{TWO}\n[ipcp.scheduler]\npolicy = \"qta-mux\"\ncherish_thresholds = [100, 10]\n\
             [[ipcp.qos_cube]]\nid = 1\nname = \"voice\"\nurgency = 0\ncherish = 1\ndelay_us = 5000\n\
             [[ipcp.qos_cube]]\nid = 2\nname = \"bulk\"\nreliable = true\nurgency = 1\n\
             efcp = {{ congestion_control = \"aimd\", min_rto_ms = 5, window = 128 }}\n\
             [[ipcp.qos_cube]]\nid = 3\nname = \"vm\"\nflow_control = true\n"
        );
        let c = parse(&with).unwrap();
        let n = &c.ipcps[1];
        assert_eq!(n.scheduler_config().name(), "qta-mux");
        let cubes = n.cubes();
        assert_eq!(cubes.len(), 3);
        assert_eq!((cubes[0].urgency, cubes[0].cherish), (0, 1));
        // flow_control: a window, nothing resent.
        assert!(cubes[2].efcp.window().is_some() && cubes[2].efcp.rtx().is_none());
        assert!(cubes[0].efcp.window().is_none());
        assert_eq!(cubes[0].delay_us, Some(5000));
        assert!(cubes[1].is_reliable() && !cubes[0].is_reliable());
        // EFCP policies per cube: AIMD congestion control, RTO, window.
        let cc = cubes[1].efcp.cc().unwrap();
        assert_eq!(cc.policy, rina_core::efcp::CcPolicy::Aimd);
        assert_eq!(
            cubes[1].efcp.rtx().unwrap().min_rto,
            std::time::Duration::from_millis(5)
        );
        assert_eq!(cubes[1].efcp.window().unwrap().receiver_buffer, 128);
        // Without the tables: fifo and the default cubes.
        let c = parse(TWO).unwrap();
        assert_eq!(c.ipcps[1].scheduler_config().name(), "fifo");
        assert_eq!(c.ipcps[1].cubes().len(), 2);
    }

    #[test]
    fn scheduler_mistakes_name_key_and_line() {
        // Line 32 is the `[ipcp.scheduler]` header.
        let sched = |body: &str| format!("{TWO}\n[ipcp.scheduler]\n{body}");
        let e = parse(&sched("policy = \"qta-mux\"\ncherish_thresholds = [0]\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 32") && e.contains("ipcp[1].scheduler.cherish_thresholds[0]"),
            "{e}"
        );
        let e = parse(&sched("policy = \"fifo\"\nqueue_size = 3\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 3") && e.contains("queue_size"), "{e}");
        let e = parse(&sched("policy = \"wfq\"\n")).unwrap_err().to_string();
        assert!(e.contains("wfq"), "{e}");
        // A cube at cherish level 2 needs three thresholds.
        let e = parse(&format!(
            "{}[[ipcp.qos_cube]]\nid = 1\nname = \"x\"\ncherish = 2\n",
            sched("policy = \"qta-mux\"\ncherish_thresholds = [5, 5]\n")
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("scheduler.cherish_thresholds") && e.contains("level 2"),
            "{e}"
        );
        let cube = "[[ipcp.qos_cube]]\nid = 1\nname = \"x\"\n";
        let e = parse(&format!("{TWO}\n{cube}{cube}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 35") && e.contains("qos_cube[1].id"), "{e}");
        let e = parse(&GOOD_SHIM_WITH_SCHED.replace("X", "[ipcp.scheduler]\npolicy = \"fifo\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("for normal IPCPs"), "{e}");
    }

    #[test]
    fn queue_bounds_and_system_keys_are_range_checked() {
        let sched = |body: &str| format!("{TWO}\n[ipcp.scheduler]\n{body}");
        let e = parse(&sched(
            "policy = \"fifo\"\nqueue_len = 9223372036854775807\n",
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("queue_len") && e.contains("out of range"), "{e}");
        let with_system =
            |line: &str| TWO.replacen("[system]\n", &format!("[system]\n{line}\n"), 1);
        let c = parse(&with_system(
            "socket_mode = \"0660\"\nsocket_group = \"rina\"",
        ))
        .unwrap();
        assert_eq!(c.system.socket_mode(), 0o660);
        assert_eq!(
            parse(&with_system("socket_mode = 0o600"))
                .unwrap()
                .system
                .socket_mode(),
            0o600
        );
        for (bad, key) in [
            ("socket_mode = \"rw\"", "system.socket_mode"),
            ("socket_mode = 0o7777", "system.socket_mode"),
            ("max_conns_per_user = 0", "system.max_conns_per_user"),
            ("max_flows_per_user = 0", "system.max_flows_per_user"),
            ("idle_timeout_ms = 0", "system.idle_timeout_ms"),
            ("busy_poll_us = 1000001", "system.busy_poll_us"),
        ] {
            let e = parse(&with_system(bad)).unwrap_err().to_string();
            assert!(e.contains(key), "{bad}: {e}");
        }
        let poll = |line: &str| parse(&with_system(line)).unwrap().system.busy_poll();
        assert_eq!(poll(""), None, "off by default");
        assert_eq!(poll("busy_poll_us = 0"), None, "0 is off");
        assert_eq!(
            poll("busy_poll_us = 2000"),
            Some(std::time::Duration::from_micros(2000))
        );
        let c = parse(TWO).unwrap();
        assert_eq!(c.system.socket_mode(), DEFAULT_SOCKET_MODE);
        assert_eq!(c.system.conns_per_user(), DEFAULT_CONNS_PER_USER);
    }

    const GOOD_SHIM_WITH_SCHED: &str = "[system]\nname = \"a\"\n[[ipcp]]\nname = \"u\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:1\"\nX\n";
}

#[cfg(test)]
mod shim_eth_tests {
    use super::*;

    const ETH: &str = r#"
[system]
name = "alpha"

[[ipcp]]
name = "a.10"
type = "shim-eth"
dif = "10"
interface = "eth1"

[[ipcp]]
name = "a.lan"
type = "shim-eth"
dif = "lan"
interface = "eth1"
vlan = 20
"#;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("t.toml"), s)
    }

    #[test]
    fn vlan_from_key_or_dif_name_or_untagged() {
        let c = parse(ETH).unwrap();
        assert_eq!(c.ipcps[0].kind, IpcpKind::ShimEth);
        assert_eq!(c.ipcps[0].shim_eth_vlan(), Some(10));
        assert_eq!(c.ipcps[1].shim_eth_vlan(), Some(20));
        let u = parse(&ETH.replace("vlan = 20", "untagged = true")).unwrap();
        assert_eq!(u.ipcps[1].shim_eth_vlan(), None);
    }

    /// Frames wait out `tx_delay_us` in memory: a delay of hours would
    /// hold every frame sent meanwhile. At most a second, refused where
    /// it is written.
    #[test]
    fn a_tx_delay_above_one_second_is_refused_with_key_and_line() {
        let ok = parse(&ETH.replace("vlan = 20", "vlan = 20\ntx_delay_us = 1000000")).unwrap();
        assert_eq!(
            ok.ipcps[1].tx_delay_us.as_ref().map(|d| *d.get_ref()),
            Some(1_000_000)
        );
        let e = parse(&ETH.replace("vlan = 20", "vlan = 20\ntx_delay_us = 86400000000"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 17") && e.contains("ipcp[1].tx_delay_us") && e.contains("at most"),
            "{e}"
        );
    }

    #[test]
    fn shim_eth_mistakes_name_key_and_line() {
        let e = parse(&ETH.replace("vlan = 20", "vlan = 4095"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 16") && e.contains("ipcp[1].vlan"), "{e}");
        let e = parse(&ETH.replace("vlan = 20", ""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 12") && e.contains("VLAN id"), "{e}");
        let e = parse(&ETH.replace("vlan = 20", "vlan = 20\nuntagged = true"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("exclude each other"), "{e}");
        let e = parse(&ETH.replacen("interface = \"eth1\"\n", "", 1))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 6") && e.contains("ipcp[0].interface"),
            "{e}"
        );
        let e = parse(&ETH.replacen("dif = \"10\"", "dif = \"10\"\nmax_sdu = 100", 1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("MTU"), "{e}");
        let e = parse(&ETH.replace("vlan = 20", "vlan = 20\nbogus = 1"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 17") && e.contains("bogus"), "{e}");
    }
}

#[cfg(test)]
mod shim_hv_tests {
    use super::*;

    const HV: &str = r#"[system]
name = "h"

[[ipcp]]
name = "h.hv"
type = "shim-hv"
dif = "hv0"
path = "/dev/shm/x"
side = "guest"
vmpi_id = 4
"#;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("t.toml"), s)
    }

    #[test]
    fn shim_hv_keys_parse_and_mistakes_name_key_and_line() {
        let c = parse(HV).unwrap();
        assert_eq!(c.ipcps[0].kind, IpcpKind::ShimHv);
        assert_eq!(c.ipcps[0].side, Some(HvSide::Guest));
        assert_eq!(c.ipcps[0].vmpi_id, Some(4));
        let e = parse(&HV.replacen("side = \"guest\"\n", "", 1))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 5") && e.contains("ipcp[0].path/side"),
            "{e}"
        );
        let e = parse(&HV.replacen("\"guest\"", "\"vm\"", 1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("side"), "{e}");
        let e = parse(&HV.replacen("shim-hv", "shim-udp", 1).replacen(
            "path = \"/dev/shm/x\"\n",
            "bind = \"127.0.0.1:1\"\npath = \"/dev/shm/x\"\n",
            1,
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("are for shim-hv IPCPs"), "{e}");
    }
}

#[cfg(test)]
mod runtime_tests {
    use super::*;

    fn running() -> Vec<IpcpConfig> {
        let text = "[system]\nname = \"s\"\n[[ipcp]]\nname = \"s.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:0\"\n";
        Config::parse(Path::new("t.toml"), text).unwrap().ipcps
    }

    #[test]
    fn an_ipcp_given_at_run_time_is_checked_against_the_running_ones() {
        let r = running();
        // A member waiting for `rinactl ipcp enroll`: no address, no neighbour.
        let ok = Config::parse_ipcp(
            "c",
            "name = \"s.net\"\ntype = \"normal\"\ndif = \"net\"\n",
            &r,
        );
        assert!(ok.is_ok(), "{ok:?}");
        assert_eq!(ok.unwrap().raw["dif"].as_str(), Some("net"));
        let e = Config::parse_ipcp(
            "c",
            "name = \"s.udp\"\ntype = \"shim-udp\"\ndif = \"u2\"\nbind = \"127.0.0.1:0\"\n",
            &r,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("line 1") && e.contains("`name`") && e.contains("runs already"),
            "{e}"
        );
        let text = "name = \"s.net\"\ntype = \"normal\"\ndif = \"net\"\n[[neighbor]]\nname = \"t.net\"\nover = \"eth\"\n";
        let e = Config::parse_ipcp("c", text, &r).unwrap_err().to_string();
        assert!(
            e.contains("line 6") && e.contains("neighbor[0].over"),
            "{e}"
        );
        let e = Config::parse_ipcp(
            "c",
            "name = \"x\"\ntype = \"normal\"\ndif = \"net\"\nadress = 3\n",
            &r,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("line 4") && e.contains("adress"), "{e}");
    }
}

#[cfg(test)]
mod stacking_tests {
    use super::*;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("t.toml"), s)
    }

    /// A shim and normal DIFs `top` over `net` over the shim, the upper
    /// one first in the file; `net_over` is the DIF under `net`.
    fn stack(net_over: &str) -> String {
        format!(
            "[system]\nname = \"a\"\n\
             [[ipcp]]\nname = \"a.top\"\ntype = \"normal\"\ndif = \"top\"\naddress = 1\n\
             [[ipcp.neighbor]]\nname = \"b.top\"\nover = \"net\"\n\
             [[ipcp]]\nname = \"a.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = 1\n\
             [[ipcp.neighbor]]\nname = \"b.net\"\nover = \"{net_over}\"\n\
             [[ipcp]]\nname = \"a.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:0\"\n"
        )
    }

    #[test]
    fn ipcps_are_created_shims_first_then_each_normal_after_the_difs_below() {
        let cfg = parse(&stack("udp")).unwrap();
        let names: Vec<&str> = cfg
            .creation_order()
            .into_iter()
            .map(|i| cfg.ipcps[i].name.get_ref().as_str())
            .collect();
        assert_eq!(names, ["a.udp", "a.net", "a.top"]);
    }

    #[test]
    fn a_stacking_loop_is_refused_naming_the_ipcps_and_a_neighbour_line() {
        let text = stack("top");
        let e = parse(&text).unwrap_err().to_string();
        let line = text.lines().position(|l| l == "over = \"net\"").unwrap() + 1;
        assert_eq!(
            e,
            format!(
                "t.toml: line {line}: key `ipcp[0].neighbor[0].over`: normal IPCPs a.top, a.net \
                 are stacked on each other in a loop: a.top reaches neighbour b.top over DIF \"net\", \
                 a.net reaches neighbour b.net over DIF \"top\"; no DIF of the loop can be created first"
            )
        );
        // An IPCP that only rests on the loop is not named as part of it.
        let text = format!(
            "{text}[[ipcp]]\nname = \"a.up\"\ntype = \"normal\"\ndif = \"up\"\naddress = 1\n\
             [[ipcp.neighbor]]\nname = \"b.up\"\nover = \"net\"\n"
        );
        let e = parse(&text).unwrap_err().to_string();
        assert!(
            e.contains("normal IPCPs a.top, a.net are") && !e.contains("a.up"),
            "{e}"
        );
    }

    #[test]
    fn enrollment_keys_and_ipcp_names_are_checked_with_the_file() {
        let with = |extra: &str| {
            stack("udp").replacen("address = 1\n", &format!("address = 1\n{extra}"), 1)
        };
        let key = "11".repeat(32);
        parse(&with(&format!(
            "key = \"{key}\"\ntrusted_keys = [\"{key}\"]\n"
        )))
        .unwrap();
        let e = parse(&with("key = \"abc\"\n")).unwrap_err().to_string();
        assert!(
            e.contains("line 4") && e.contains("`ipcp[0].key`") && e.contains("64 hex digits"),
            "{e}"
        );
        let e = parse(&with(&format!(
            "key = \"{key}\"\ntrusted_keys = [\"{key}\", \"zz\"]\n"
        )))
        .unwrap_err()
        .to_string();
        assert!(e.contains("`ipcp[0].trusted_keys[1]`"), "{e}");
        let e = parse(&with(&format!("trusted_keys = [\"{key}\"]\n")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`ipcp[0].trusted_keys`") && e.contains("needs `key`"),
            "{e}"
        );
        let e = parse(&stack("udp").replace("\"a.top\"", "\"a top\""))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`ipcp[0].name`") && e.contains("application name"),
            "{e}"
        );
    }
}
