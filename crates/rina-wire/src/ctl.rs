//! The control protocol between applications (or tools) and `rinad`.
//!
//! Transport: a `SOCK_SEQPACKET` Unix socket. Every packet holds one JSON
//! message: a [`Request`] from the client, a [`Message`] from the daemon.
//! When a reply announces a flow ([`Reply::Flow`]), the flow's own
//! `SOCK_SEQPACKET` descriptor rides on the same packet as `SCM_RIGHTS`.
//! JSON keeps the protocol readable from any language and in `strace`;
//! nothing on the data path uses it.
//!
//! Requests carry an `id` that the daemon echoes in its reply. Incoming
//! flow requests arrive unsolicited as [`Message::FlowRequest`] on the
//! connection that registered the destination name; the client answers with
//! [`Op::Accept`] or [`Op::Refuse`].
//!
//! The daemon knows which user each connection belongs to (`SO_PEERCRED`):
//! a user's names and flows are listed, unregistered and deallocated only
//! by that user or an administrator, management operations need an
//! administrator, and refusals are [`ErrorKind::PermissionDenied`] with the
//! reason. Listings of flows and names come in pages ([`Reply::Flows`]'s
//! `next`). A connection the daemon refuses (too many of its user's) gets a
//! reply with id 0 and the reason before it is closed.

use crate::name::AppName;
use crate::qos::QosSpec;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Path of the daemon's socket when neither a flag nor [`SOCKET_ENV`] names one:
/// `$XDG_RUNTIME_DIR/rinad.sock`, else `/run/rinad.sock` for root, else
/// `/tmp/rinad-<uid>/rinad.sock`: a directory that only its owner may use
/// (the daemon creates it with mode 0700 and refuses one that another user
/// owns or can write to, so nobody can squat another user's socket).
pub fn default_socket_path() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os(SOCKET_ENV) {
        return p.into();
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        return std::path::Path::new(&d).join("rinad.sock");
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        "/run/rinad.sock".into()
    } else {
        private_socket_dir(uid).join("rinad.sock")
    }
}

/// The private directory of user `uid`'s default socket when it has no
/// `$XDG_RUNTIME_DIR`: `/tmp/rinad-<uid>`.
pub fn private_socket_dir(uid: u32) -> std::path::PathBuf {
    format!("/tmp/rinad-{uid}").into()
}

/// Checks that directory `dir` may hold the control socket of user `uid`:
/// a real directory (not a symbolic link) owned by `uid` or root, that
/// other users may not write to unless it is sticky (like `/tmp`, where
/// only an explicit path can point).
/// With `private`, it must be owned by `uid` with mode 0700 or stricter.
/// The error says what is wrong.
pub fn check_socket_dir(dir: &std::path::Path, uid: u32, private: bool) -> Result<(), String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let md = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("cannot inspect socket directory {}: {e}", dir.display()))?;
    let show = dir.display();
    if !md.file_type().is_dir() {
        return Err(format!(
            "socket directory {show} is not a directory (a symbolic link or a file); refusing it"
        ));
    }
    let mode = md.permissions().mode() & 0o7777;
    if private {
        if md.uid() != uid {
            return Err(format!(
                "socket directory {show} belongs to uid {}, not to uid {uid}: another user may have created it to squat the socket; remove it (or set {SOCKET_ENV}/--socket)",
                md.uid()
            ));
        }
        if mode & 0o077 != 0 {
            return Err(format!(
                "socket directory {show} has mode {mode:04o}: it must be private to its owner (0700)"
            ));
        }
        return Ok(());
    }
    if md.uid() != uid && md.uid() != 0 {
        return Err(format!(
            "socket directory {show} belongs to uid {}, neither to uid {uid} nor to root; refusing it",
            md.uid()
        ));
    }
    // A group the owner chose may write there (umask 002 makes such
    // directories); anybody at all may not, unless the sticky bit keeps
    // them from replacing what they do not own.
    let sticky = mode & 0o1000 != 0;
    if mode & 0o002 != 0 && !sticky {
        return Err(format!(
            "socket directory {show} has mode {mode:04o}: any user may replace the socket in it; refusing it"
        ));
    }
    Ok(())
}

/// Largest control message, in bytes.
pub const MAX_CTL_MSG: usize = 1 << 20;

/// Environment variable that overrides the daemon's socket path.
pub const SOCKET_ENV: &str = "RINA_SOCKET";

/// A client's request.
///
/// Decoding is strict: `op` must be one of the operations' names (a number
/// is refused, although serde would take it as the variant's index), and
/// fields an operation does not have are refused.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Request {
    /// Chosen by the client; echoed in the reply.
    pub id: u64,
    /// What is asked.
    #[serde(flatten)]
    pub op: Op,
}

impl<'de> Deserialize<'de> for Request {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        use serde_json::Value;
        let mut v = serde_json::Map::<String, Value>::deserialize(d)?;
        let id = match v.remove("id") {
            Some(id) => u64::deserialize(id).map_err(|e| D::Error::custom(format!("`id`: {e}")))?,
            None => return Err(D::Error::missing_field("id")),
        };
        match v.get("op") {
            Some(Value::String(_)) => {}
            Some(other) => {
                return Err(D::Error::custom(format!(
                    "`op` must be the name of an operation (a string), not {other}"
                )))
            }
            None => return Err(D::Error::missing_field("op")),
        }
        // Operations without parameters (serde ignores extra fields of
        // unit variants).
        let unit =
            matches!(v.get("op"), Some(Value::String(o)) if o == "list_ipcps" || o == "list_difs");
        if let Some(k) = v.keys().find(|k| unit && *k != "op") {
            return Err(D::Error::custom(format!(
                "unknown field `{k}`: this operation takes no parameters"
            )));
        }
        let op = Op::deserialize(Value::Object(v)).map_err(D::Error::custom)?;
        Ok(Request { id, op })
    }
}

/// The operations a client can ask for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Op {
    /// Register `name` in `dif`, or, without a DIF, in every DIF of the daemon.
    Register {
        name: AppName,
        dif: Option<String>,
        /// Have the daemon accept every flow request for `name` at once,
        /// with this data path, and hand each flow over as a
        /// [`Message::FlowAccepted`] (a listening socket's backlog),
        /// instead of asking with a [`Message::FlowRequest`] first: an
        /// allocation then waits for no round trip to this application.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        accept: Option<AutoAccept>,
    },
    /// Withdraw a registration (from `dif`, or from every DIF).
    Unregister { name: AppName, dif: Option<String> },
    /// Allocate a flow from `local` to `remote`.
    Allocate {
        local: AppName,
        remote: AppName,
        dif: Option<String>,
        qos: QosSpec,
        /// Ask for shared-memory rings as the flow's data path, where the
        /// IPCP offers them: the flow socket's first packet then says
        /// (`rina_core::shim_hv::flow_rings::Setup`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        rings: bool,
        /// Ask for a direct data path, where the IPCP and the other end
        /// agree (shim-udp): the flow's descriptor is then a UDP socket
        /// connected to the other application's, and the reply carries a
        /// second descriptor, the flow's lifeline, whose closing
        /// deallocates the flow ([`FlowInfo::direct`] says which it got).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        direct: bool,
        /// Carry the flow in bundle `bundle` ([`Op::OpenBundle`]) of this
        /// connection instead of a descriptor of its own: the reply then
        /// carries none, and [`FlowInfo::bundle`] says so (`rings` and
        /// `direct` do not apply).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bundle: Option<u32>,
    },
    /// Accept the incoming flow request `handle`; the reply carries the
    /// flow (`rings`, `direct` and `bundle` as for `Allocate`).
    Accept {
        handle: u64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        rings: bool,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        direct: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bundle: Option<u32>,
    },
    /// Open a flow bundle: one socket that carries many flows of this
    /// application ([`crate::bundle`]). The reply is [`Reply::Bundle`]
    /// with the application's end attached. Only this connection may put
    /// flows in it (at most 16 bundles a connection); closing the bundle
    /// closes them all. When this connection closes, the bundle closes
    /// too if it holds no flow, else with its last flow.
    OpenBundle,
    /// Refuse the incoming flow request `handle`.
    Refuse { handle: u64, reason: String },
    /// Deallocate a flow (closing its descriptor does the same).
    Deallocate { port: u32 },
    /// List the IPC processes.
    ListIpcps,
    /// List the DIFs.
    ListDifs,
    /// List registered application names, one page at a time: from the
    /// entry after the first `skip` ones (default 0); the reply says where
    /// the next page starts. A client that is not an administrator sees
    /// only its own user's names.
    ListNames {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        skip: Option<u64>,
    },
    /// List flows with their counters, one page at a time: the flows with
    /// port-ids above `after` (default: from the first); the reply says
    /// where the next page starts. A client that is not an administrator
    /// sees only its own user's flows.
    ListFlows {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<u32>,
    },
    /// The flow whose application end is the socket `dev`/`ino` (its
    /// device and inode, as `fstat` gives them, the same in every process
    /// that holds it): for a flow descriptor a program inherited (across
    /// `exec`) or was passed, of which its library knows nothing. The
    /// reply is [`Reply::Flow`]; [`ErrorKind::UnknownFlow`] if no flow has
    /// that socket, or a client that is not an administrator asks about
    /// another user's flow.
    FlowBySocket { dev: u64, ino: u64 },
    /// Read the RIB of IPCP `ipcp` under `path` (default `/`), `depth`
    /// levels deep (default: all); with `remote`, the RIB of that
    /// neighbour of `ipcp` in its DIF (IPCP name or address), read over the
    /// DIF with CDAP (objects' owner: "remote").
    ReadRib {
        ipcp: String,
        path: Option<String>,
        depth: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        remote: Option<String>,
    },
    /// Read the RMT scheduling policy of normal IPCP `ipcp` and its queue
    /// counters; with `set`, first replace the policy by the one `set`
    /// describes (`{"policy": "qta-mux", ...}`, the fields of the
    /// daemon's `[ipcp.scheduler]` table). Queued PDUs are discarded.
    Scheduler {
        ipcp: String,
        set: Option<serde_json::Value>,
    },
    /// Management (administrators only): make normal IPCP `ipcp` a
    /// neighbour of IPCP `name` reached over DIF `over` (a shim DIF or a
    /// lower normal DIF of this system), at `address` if known. The daemon
    /// registers `ipcp` in `over` and keeps an N-1 flow up, as for an
    /// `[[ipcp.neighbor]]` of the configuration.
    AddNeighbor {
        ipcp: String,
        name: AppName,
        over: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        address: Option<u64>,
    },
    /// Management (administrators only): forget neighbour `name` of normal
    /// IPCP `ipcp` and deallocate its N-1 flows.
    RemoveNeighbor { ipcp: String, name: AppName },
    /// Management (administrators only): register normal IPCP `ipcp` in
    /// the lower DIF `dif` (so peers there may allocate N-1 flows to it).
    RegisterIpcp { ipcp: String, dif: String },
    /// Management (administrators only): withdraw that registration.
    UnregisterIpcp { ipcp: String, dif: String },
    /// Management (administrators only): create an IPC process from
    /// `config`, the keys of one `[[ipcp]]` table of the daemon's
    /// configuration file as a TOML document (`name = "a.net"`, `type =
    /// "normal"`, ..., sub-tables such as `[[neighbor]]` included). Checked
    /// as the file is: a mistake names the key and the line.
    CreateIpcp { config: String },
    /// Management (administrators only): destroy IPCP `ipcp` and what
    /// rests on it (the application flows it carries, the N-1 flows of the
    /// IPCPs above it). The reply says what was torn down.
    DestroyIpcp { ipcp: String },
    /// Management (administrators only): enroll normal IPCP `ipcp` into
    /// its DIF through neighbour `neighbor`, reached over DIF `over` (the
    /// neighbour is added if it is not one yet). Answered once enrollment
    /// succeeds or gives up (or after `timeout_ms`, default 10000), with
    /// its steps.
    Enroll {
        ipcp: String,
        neighbor: AppName,
        over: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        address: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// Management (administrators only): change the EFCP policies of QoS
    /// cube `cube` (name or QoS-id) of normal IPCP `ipcp`: `set` holds the
    /// keys of an `efcp = {...}` table of `[[ipcp.qos_cube]]`. Flows
    /// allocated from then on use them.
    SetEfcp {
        ipcp: String,
        cube: String,
        set: serde_json::Value,
    },
    /// Management (administrators only): read the configuration file
    /// again (`path`, default the one the daemon started with) and apply
    /// the difference with the running system. A file that does not parse
    /// or check changes nothing.
    Reload {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<String>,
    },
    /// Administrators only: capture what IPCP `ipcp` sends and receives —
    /// a normal IPCP on its N-1 flows, a shim on its medium (the link type
    /// of the reply says which, [`crate::pcap`]). The reply carries a `SOCK_SEQPACKET`
    /// descriptor on which every frame arrives as one pcap record
    /// ([`crate::pcap`]), cut at `snaplen` bytes (default and at most
    /// [`crate::pcap::MAX_SNAPLEN`]); closing it ends the capture. Frames
    /// the reader does not take in time are dropped, never delayed.
    Capture {
        ipcp: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        snaplen: Option<u32>,
    },
}

/// A message from the daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Message {
    /// The answer to the request with the same `id`.
    Reply {
        id: u64,
        result: Result<Reply, CtlError>,
    },
    /// A peer asks for a flow to a name this connection registered.
    FlowRequest(IncomingFlow),
    /// A step of the operation of request `id`, under way (the steps of
    /// an [`Op::Enroll`] as they happen); its reply follows.
    Progress { id: u64, line: String },
    /// Flow request `handle`, sent to this connection, is gone: its
    /// application did not answer in time, or its requester gave up.
    /// Accepting it now fails with [`ErrorKind::RequestGone`].
    RequestWithdrawn { handle: u64 },
    /// Another connection (an administrator's `rinactl unregister`)
    /// withdrew the registration of `name` in `dif` that this connection
    /// made: no more flow requests for it come here (flows the daemon
    /// accepted for it before still do).
    Unregistered { name: AppName, dif: String },
    /// A flow to a name this connection registered with
    /// [`Op::Register::accept`], accepted by the daemon; its descriptors
    /// are attached as to a [`Reply::Flow`].
    FlowAccepted {
        flow: FlowInfo,
        /// The registration asked for rings ([`AutoAccept::rings`]): the
        /// flow socket's first packet says whether it got them, as after
        /// an [`Op::Accept`] with `rings`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        rings: bool,
    },
}

impl Message {
    /// Whether this message is news the daemon sends on its own (a
    /// request, an accepted flow, a withdrawal), not a step of or the
    /// answer to a request of the client's.
    pub fn is_news(&self) -> bool {
        !matches!(self, Message::Reply { .. } | Message::Progress { .. })
    }
}

/// How the daemon accepts the flow requests of a registration that asked
/// it to ([`Op::Register::accept`]): the data path each flow gets, as
/// [`Op::Accept`] would ask for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoAccept {
    /// Shared-memory rings, where the IPCP offers them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rings: bool,
    /// A direct data path, where the IPCP and the requester agree.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub direct: bool,
    /// Into this bundle of the connection ([`Op::OpenBundle`]), with no
    /// descriptor of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<u32>,
}

/// A successful answer.
// Replies are built once per request, never on the data path: boxing the
// larger variants would only make them clumsier to match.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    /// Done, nothing to report.
    Done,
    /// The name was registered in these DIFs.
    Registered { difs: Vec<String> },
    /// A flow; its descriptor is attached to this packet (none for a flow
    /// in a bundle).
    Flow(FlowInfo),
    /// Answer to [`Op::OpenBundle`]: its number, which
    /// [`Op::Allocate::bundle`] names; its socket is attached.
    Bundle { id: u32 },
    /// Answer to [`Op::ListIpcps`].
    Ipcps { ipcps: Vec<IpcpInfo> },
    /// Answer to [`Op::ListDifs`].
    Difs { difs: Vec<DifInfo> },
    /// Answer to [`Op::ListNames`]: one page; `next` is the `skip` of the
    /// next page, absent on the last one.
    Names {
        names: Vec<NameInfo>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<u64>,
    },
    /// Answer to [`Op::ListFlows`]: one page; `next` is the `after` of the
    /// next page, absent on the last one.
    Flows {
        flows: Vec<FlowStats>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<u32>,
    },
    /// Answer to [`Op::ReadRib`].
    Rib { objects: Vec<RibObjectInfo> },
    /// Answer to [`Op::Scheduler`].
    Scheduler(SchedulerInfo),
    /// What a management operation changed, one line each.
    Changes { changes: Vec<String> },
    /// Answer to [`Op::Enroll`]: enrolled at `address`, through these
    /// steps.
    Enrolled { address: u64, steps: Vec<String> },
    /// Answer to [`Op::Capture`]: the records' socket is attached; write
    /// [`crate::pcap::file_header`] with these values before them.
    Capture { linktype: u32, snaplen: u32 },
}

/// The RMT scheduling policy of a normal IPCP and the counters of its queues.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedulerInfo {
    /// The IPCP.
    pub ipcp: String,
    /// Name of the policy (`fifo`, `qta-mux`, ...).
    pub policy: String,
    /// The policy's parameters, as given (`policy` plus its fields).
    pub config: serde_json::Value,
    /// The N-1 ports and their queues.
    pub ports: Vec<PortQueues>,
}

/// The output queues of one N-1 port of a normal IPCP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortQueues {
    /// The N-1 port (port-id of the flow in the DIF below).
    pub port: u32,
    /// The neighbour IPCP the port reaches, if known.
    pub neighbor: Option<String>,
    /// Its queues, as the policy names them (`fifo`, `mgmt`, `urgency-A`, ...).
    pub queues: Vec<QueueCounters>,
}

/// Counters of one output queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueCounters {
    /// Name of the queue within its port.
    pub queue: String,
    /// PDUs in the queue now.
    pub queued: u64,
    /// PDUs handed to the N-1 flow.
    pub sent: u64,
    /// PDUs dropped.
    pub dropped: u64,
    /// Largest occupancy seen, in PDUs.
    pub max_occupancy: u64,
}

/// One RIB object, as management tools see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RibObjectInfo {
    /// Full object name (its path).
    pub name: String,
    /// Object class.
    pub class: String,
    /// Object instance.
    pub instance: u64,
    /// The value, rendered for people.
    pub value: String,
    /// The component that owns it.
    pub owner: String,
}

/// A flow request waiting for the application's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IncomingFlow {
    /// Names this request in [`Op::Accept`] / [`Op::Refuse`].
    pub handle: u64,
    /// DIF the request came through.
    pub dif: String,
    /// The registered name that is asked for.
    pub local: AppName,
    /// Who asks.
    pub remote: AppName,
    /// What the requester asks for.
    pub qos: QosSpec,
}

/// What both ends know about an allocated flow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowInfo {
    /// Port-id, unique within the daemon.
    pub port: u32,
    /// DIF the flow runs in.
    pub dif: String,
    /// This end's application name.
    pub local: AppName,
    /// The other end's application name.
    pub remote: AppName,
    /// The QoS the flow was allocated with.
    pub qos: QosSpec,
    /// Largest SDU the flow carries, in bytes.
    pub max_sdu: u32,
    /// The flow's SDUs go straight between the two applications' UDP
    /// sockets, not through the daemons (asked with `direct` and agreed
    /// by both ends of a shim-udp flow); the daemon counts none of them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub direct: bool,
    /// The bundle that carries the flow's SDUs ([`Op::OpenBundle`]), in
    /// frames that name its port, when it has no descriptor of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<u32>,
}

/// Counters of one flow, as seen by the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FlowCounters {
    /// SDUs delivered to the application.
    pub sdus_in: u64,
    /// Bytes delivered to the application.
    pub bytes_in: u64,
    /// SDUs written by the application and sent.
    pub sdus_out: u64,
    /// Bytes written by the application and sent.
    pub bytes_out: u64,
    /// SDUs that arrived but could not be delivered (application too slow).
    pub drops_in: u64,
    /// SDUs the application wrote that could not be sent (oversize, send error).
    pub drops_out: u64,
}

/// A flow and its counters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowStats {
    /// The flow.
    #[serde(flatten)]
    pub info: FlowInfo,
    /// IPCP that serves it.
    pub ipcp: String,
    /// Counters since allocation. Those of a flow its peer ended
    /// (`held_after_end`) are gone with it in the IPCP; only what the
    /// daemon counts itself (drops) is left.
    pub counters: FlowCounters,
    /// The peer ended the flow while the daemon held SDUs for the
    /// application that it had not taken: how many are left. The flow's
    /// end stays open until the application has taken them (30 s at most).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_after_end: Option<u64>,
}

/// One IPC process of the daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IpcpInfo {
    /// IPCP name.
    pub name: String,
    /// Kind (`shim-udp`, `normal`, ...).
    pub kind: String,
    /// DIF it belongs to.
    pub dif: String,
    /// Its address in that DIF (for shim-udp, the bound UDP address).
    pub address: String,
    /// Allocated flows.
    pub flows: usize,
    /// Application names registered in it that the client may see (an
    /// administrator all, anyone else their user's): at most
    /// [`IPCP_NAMES_LISTED`] of them, and no more than
    /// [`IPCP_NAME_BYTES`] of their encoding, so that a listing of IPCPs
    /// fits a control message however many names users register.
    pub names: Vec<AppName>,
    /// How many more names it has that the client may see, not in
    /// `names` ([`Op::ListNames`] pages through all of them; absent, as
    /// from a daemon that listed every name: 0).
    #[serde(default)]
    pub names_more: u64,
    /// IPCP-wide counters (datagrams, malformed input, ...).
    pub counters: BTreeMap<String, u64>,
}

/// Most names an [`IpcpInfo`] lists.
pub const IPCP_NAMES_LISTED: usize = 16;
/// Most bytes of encoded names an [`IpcpInfo`] lists (a name is at most
/// 255 bytes, but its JSON escapes may make it six times as long).
pub const IPCP_NAME_BYTES: usize = 1 << 10;

/// A DIF known to the daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DifInfo {
    /// DIF name.
    pub name: String,
    /// DIF type.
    pub kind: String,
    /// Local IPCPs in it.
    pub ipcps: Vec<String>,
}

/// A registered application name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NameInfo {
    /// The name.
    pub name: AppName,
    /// DIF it is registered in.
    pub dif: String,
    /// IPCP that holds the registration.
    pub ipcp: String,
    /// The daemon accepts the flow requests for it itself
    /// ([`Op::Register::accept`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub accepts: bool,
}

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// No daemon listens on the socket (reported by the client library).
    DaemonNotRunning,
    /// The connection to the daemon was lost (reported by the client library).
    DaemonGone,
    /// No DIF has the given name.
    UnknownDif,
    /// The daemon has no DIF to serve the request in.
    NoDif,
    /// The destination name is not known in the DIF.
    NameNotFound,
    /// The destination name is known but no application registered it there.
    NotRegistered,
    /// The name is already registered in that DIF.
    NameInUse,
    /// The peer application refused the flow.
    Refused,
    /// No QoS cube of the DIF satisfies the spec.
    QosNotSatisfiable,
    /// An SDU is larger than the flow's maximum.
    SduTooLarge,
    /// The peer did not answer in time.
    Timeout,
    /// The request is malformed or names something that does not exist.
    InvalidRequest,
    /// The flow request answered is no longer pending: answered already,
    /// or withdrawn (its application did not answer in time, or the
    /// requester gave up).
    RequestGone,
    /// No port-id or flow with this number.
    UnknownFlow,
    /// The daemon or the peer ran out of resources.
    NoResources,
    /// The client's user may not do this (another user's name or flow, or
    /// a management command of administrators); the message says why.
    PermissionDenied,
    /// Anything else; the message says what.
    Internal,
}

/// An error with its kind and a sentence for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CtlError {
    /// Machine-readable kind.
    pub kind: ErrorKind,
    /// What went wrong, for people.
    pub message: String,
}

impl CtlError {
    /// Builds an error.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        CtlError {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for CtlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CtlError {}

/// Encodes a control message as one packet.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    // Serialising these types cannot fail: all map keys are strings.
    serde_json::to_vec(msg).unwrap_or_default()
}

/// Decodes one packet; the error names what was wrong.
pub fn decode<'a, T: Deserialize<'a>>(buf: &'a [u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_json_is_readable_and_round_trips() {
        let r = Request {
            id: 3,
            op: Op::Allocate {
                local: "perf".parse().unwrap(),
                remote: "echo/1".parse().unwrap(),
                dif: Some("udp".into()),
                qos: QosSpec::default(),
                rings: false,
                direct: false,
                bundle: None,
            },
        };
        let v = encode(&r);
        let s = std::str::from_utf8(&v).unwrap();
        assert!(s.contains(r#""op":"allocate""#), "{s}");
        assert!(s.contains(r#""remote":"echo/1""#), "{s}");
        assert_eq!(decode::<Request>(&v).unwrap(), r);
        assert!(!s.contains("rings"), "{s}");
        assert!(!s.contains("direct"), "{s}");
        // Older clients say nothing about rings or direct paths.
        let old: Request = decode(br#"{"id":1,"op":"accept","handle":4}"#).unwrap();
        assert_eq!(
            old.op,
            Op::Accept {
                handle: 4,
                rings: false,
                direct: false,
                bundle: None,
            }
        );
        let bundled: Request = decode(br#"{"id":1,"op":"accept","handle":4,"bundle":2}"#).unwrap();
        assert!(matches!(
            bundled.op,
            Op::Accept {
                bundle: Some(2),
                ..
            }
        ));
        assert!(!s.contains("bundle"), "{s}");
        let new: Request = decode(br#"{"id":1,"op":"accept","handle":4,"direct":true}"#).unwrap();
        assert!(matches!(new.op, Op::Accept { direct: true, .. }));
    }

    #[test]
    fn a_registration_accepts_for_its_application_only_when_asked() {
        // Without `accept` (every client before it): the daemon asks.
        let old: Request = decode(br#"{"id":1,"op":"register","name":"a","dif":null}"#).unwrap();
        assert!(matches!(old.op, Op::Register { accept: None, .. }));
        let plain = Op::Register {
            name: "a".parse().unwrap(),
            dif: None,
            accept: None,
        };
        let text = String::from_utf8(encode(&plain)).unwrap();
        assert!(!text.contains("accept"), "{text}");
        let new: Request =
            decode(br#"{"id":1,"op":"register","name":"a","dif":null,"accept":{"rings":true}}"#)
                .unwrap();
        assert!(matches!(
            new.op,
            Op::Register {
                accept: Some(AutoAccept {
                    rings: true,
                    direct: false,
                    bundle: None,
                }),
                ..
            }
        ));
        let bad = decode::<Request>(
            br#"{"id":1,"op":"register","name":"a","dif":null,"accept":{"ring":true}}"#,
        );
        assert!(bad.is_err(), "a misspelt data path is refused, not ignored");
    }

    #[test]
    fn only_replies_and_progress_are_not_news() {
        let progress = Message::Progress {
            id: 1,
            line: "x".into(),
        };
        assert!(!progress.is_news());
        assert!(Message::RequestWithdrawn { handle: 1 }.is_news());
    }

    #[test]
    fn messages_round_trip() {
        let flow = FlowInfo {
            port: 4,
            dif: "d".into(),
            local: "a".parse().unwrap(),
            remote: "b".parse().unwrap(),
            qos: QosSpec::default(),
            max_sdu: 1400,
            direct: false,
            bundle: Some(3),
        };
        let msgs = [
            Message::Reply {
                id: 1,
                result: Err(CtlError::new(ErrorKind::Refused, "no")),
            },
            Message::Reply {
                id: 2,
                result: Ok(Reply::Flow(flow.clone())),
            },
            Message::Reply {
                id: 3,
                result: Ok(Reply::Bundle { id: 7 }),
            },
            Message::FlowRequest(IncomingFlow {
                handle: 9,
                dif: "d".into(),
                local: "a".parse().unwrap(),
                remote: "b".parse().unwrap(),
                qos: QosSpec::default(),
            }),
            Message::RequestWithdrawn { handle: 9 },
            Message::Unregistered {
                name: "a".parse().unwrap(),
                dif: "d".into(),
            },
            Message::FlowAccepted {
                flow: FlowInfo {
                    port: 5,
                    direct: true,
                    ..flow.clone()
                },
                rings: true,
            },
        ];
        for m in msgs {
            assert_eq!(decode::<Message>(&encode(&m)).unwrap(), m);
        }
    }

    #[test]
    fn scheduler_op_and_reply_round_trip() {
        let r = Request {
            id: 7,
            op: Op::Scheduler {
                ipcp: "a.net".into(),
                set: Some(serde_json::json!({"policy": "fifo", "queue_len": 10})),
            },
        };
        let v = encode(&r);
        let s = std::str::from_utf8(&v).unwrap();
        assert!(s.contains(r#""op":"scheduler""#), "{s}");
        assert_eq!(decode::<Request>(&v).unwrap(), r);
        let m = Message::Reply {
            id: 7,
            result: Ok(Reply::Scheduler(SchedulerInfo {
                ipcp: "a.net".into(),
                policy: "fifo".into(),
                config: serde_json::json!({"policy": "fifo"}),
                ports: vec![PortQueues {
                    port: 3,
                    neighbor: Some("b.net".into()),
                    queues: vec![QueueCounters {
                        queue: "fifo".into(),
                        queued: 1,
                        sent: 2,
                        dropped: 3,
                        max_occupancy: 4,
                    }],
                }],
            })),
        };
        assert_eq!(decode::<Message>(&encode(&m)).unwrap(), m);
    }

    #[test]
    fn ops_are_names_and_fields_are_checked() {
        for bad in [
            r#"{"id":1,"op":7}"#,
            r#"{"id":1,"op":"7"}"#,
            r#"{"id":1,"op":null}"#,
            r#"{"id":1}"#,
            r#"{"op":"list_difs"}"#,
            r#"{"id":-1,"op":"list_difs"}"#,
            r#"{"id":1,"op":"deallocate","port":18446744073709551615}"#,
            r#"{"id":1,"op":"deallocate","port":3,"force":true}"#,
            r#"{"id":1,"op":"list_flows","after":"x"}"#,
            r#"{"id":1,"op":"list_difs","all":true}"#,
        ] {
            let e = decode::<Request>(bad.as_bytes());
            assert!(e.is_err(), "{bad} was accepted as {e:?}");
        }
        let e = decode::<Request>(br#"{"id":1,"op":7}"#).unwrap_err();
        assert!(e.to_string().contains("name of an operation"), "{e}");
        let ok: Request = decode(br#"{"id":2,"op":"list_flows"}"#).unwrap();
        assert_eq!(ok.op, Op::ListFlows { after: None });
        let ok: Request = decode(br#"{"id":2,"op":"list_flows","after":9}"#).unwrap();
        assert_eq!(ok.op, Op::ListFlows { after: Some(9) });
        let by_socket = Request {
            id: 3,
            op: Op::FlowBySocket {
                dev: u64::MAX,
                ino: 12345,
            },
        };
        let text = String::from_utf8(encode(&by_socket)).unwrap();
        assert!(text.contains(r#""op":"flow_by_socket""#), "{text}");
        assert_eq!(decode::<Request>(text.as_bytes()).unwrap(), by_socket);
    }

    #[test]
    fn socket_directories_are_judged() {
        use std::os::unix::fs::PermissionsExt;
        let base = std::env::temp_dir().join(format!("rina-wire-sockdir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let dir = |name: &str, mode: u32| {
            let d = base.join(name);
            std::fs::create_dir(&d).unwrap();
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
            d
        };
        assert!(check_socket_dir(&dir("private", 0o700), me, true).is_ok());
        let e = check_socket_dir(&dir("shared", 0o750), me, true).unwrap_err();
        assert!(e.contains("0750") && e.contains("private"), "{e}");
        assert!(check_socket_dir(&dir("group", 0o775), me, false).is_ok());
        let e = check_socket_dir(&dir("open", 0o777), me, false).unwrap_err();
        assert!(e.contains("any user"), "{e}");
        assert!(check_socket_dir(&dir("sticky", 0o1777), me, false).is_ok());
        let e = check_socket_dir(&base.join("private"), me.wrapping_add(1), true).unwrap_err();
        assert!(e.contains("squat"), "{e}");
        let link = base.join("link");
        std::os::unix::fs::symlink(base.join("private"), &link).unwrap();
        let e = check_socket_dir(&link, me, true).unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(decode::<Request>(b"{\"id\":1,\"op\":\"fly\"}").is_err());
        assert!(decode::<Request>(b"\xff\xfe").is_err());
    }
}
