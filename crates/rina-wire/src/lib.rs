//! Wire formats of the RINA stack.
//!
//! This crate holds *formats only*: how names, QoS specs and PDUs look as
//! bytes, and typed views that parse them. It has no state and does no IO,
//! so every other layer (core, daemon, client, tools) may depend on it.
//!
//! * [`name`] — RINA four-part application names.
//! * [`qos`] — the QoS spec an application asks for.
//! * [`pci`] — EFCP PCI: headers and control PDUs of a normal DIF.
//! * [`shim_udp`] — datagrams of the shim DIF over UDP.
//! * [`shim_eth`] — 802.1Q frames and ARP packets of the shim DIF over Ethernet.
//! * [`cdap`] — CDAP messages (IRATI's CDAP.proto as prost structs) and object-value payloads.
//! * [`fa`] — flow-allocator messages of a normal DIF (carried in MGMT PDUs).
//! * [`bundle`] — frames of a flow bundle (many flows over one descriptor).
//! * [`ctl`] — messages between applications/tools and `rinad` on its Unix socket.
//! * [`units`] — quantities as people write them (bit rates with units).
//! * [`codec`] — the bounds-checked byte reader/writer every decoder is built on.

pub mod bundle;
pub mod cdap;
pub mod codec;
pub mod ctl;
pub mod fa;
pub mod name;
pub mod pcap;
pub mod pci;
pub mod qos;
pub mod shim_eth;
pub mod shim_udp;
pub mod units;

pub use codec::WireError;
pub use name::{AppName, NameError};
pub use qos::QosSpec;
