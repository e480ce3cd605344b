//! Sans-IO RINA protocol machines.
//!
//! Every machine here is a plain state machine: it is fed events (a datagram
//! arrived, an application asked for something, a timer fired) together with
//! the current [`time::Instant`], and it answers with actions (send these bytes
//! there, tell the application this). There are no sockets, threads, clocks or
//! random sources in this crate, so the same code runs in `rinad` with real IO
//! and in `rina-sim` with a virtual clock.
//!
//! * [`time`] — the instant type all machines use.
//! * [`buf`] — one buffer per PDU, with room in front for the headers below.
//! * [`delimiting`] — fragmentation of SDUs into PDUs and their reassembly.
//! * [`sdu`] — an SDU as delivered: one buffer, or its fragments' buffers gathered.
//! * [`sdup`] — SDU protection: TTL, CRC-32 and the encryption hook.
//! * [`efcp`] — the Error and Flow Control Protocol (DTP + DTCP) of one connection.
//! * [`normal`] — the data path of the normal IPC process: delimiting, EFCP, PCI, SDU protection and RMT composed.
//! * [`cdap_session`] — a CDAP session over one management flow: connection, invoke ids, responses, timeouts.
//! * [`enrollment`] — joining a DIF: authentication, address assignment, configuration transfer, retries (enrollee and member sides).
//! * [`rib`] — the RIB (a tree of named objects) and the RIB daemon that dispatches CDAP requests to the components owning them.
//! * [`shim_udp`] — the shim IPC process over UDP.
//! * [`shim_eth`] — the shim IPC process over Ethernet 802.1Q: one flow per peer MAC, names resolved with ARP.
//! * [`shim_hv`] — the shim IPC process for hypervisors: VMPI channels over shared-memory rings.
//! * [`rmt`] — relaying and multiplexing: forwarding table, output queues, scheduling policies.
//! * [`routing`] — link-state routing: flow-state objects, flooding, ageing, Dijkstra/ECMP, the forwarding table.
//! * [`directory`] — the namespace manager's directory: application name → member address, replicated by flooding.
//! * [`flood`] — the flooded database routing and the directory share: newest copy per key, flooding, database sync, ageing.
//! * [`mgmt_frag`] — fragmentation and reassembly of management messages larger than an N-1 flow's max SDU.

pub mod buf;
pub mod cdap_session;
pub mod delimiting;
pub mod directory;
pub mod efcp;
pub mod enrollment;
pub mod flood;
pub mod fuzzing;
pub mod ids;
pub mod mgmt_frag;
pub mod normal;
pub mod rib;
pub mod rmt;
pub mod routing;
pub mod sdu;
pub mod sdup;
pub mod shim_eth;
pub mod shim_hv;
mod shim_qos;
pub mod shim_udp;
pub mod system;
pub mod time;

pub use time::Instant;

/// Most flows one IPCP holds at once unless configured otherwise (shim-udp
/// and normal IPCPs): room for 100,000 idle flows with both ends in one
/// system and more. Past it allocations are refused with "no resources";
/// a normal IPCP is also bounded by its CEP-id space (65,535 with the
/// default 2-byte field).
pub const DEFAULT_MAX_FLOWS: usize = 1 << 18;
