//! `rina-gw`: TCP connections carried over RINA flows, as rlite's
//! `rina-gw` does, so that unmodified TCP programs (ssh, a web server and
//! its browser) talk across a RINA network without root or a TUN.
//!
//! Two kinds of mapping, any number of each in one process:
//! * *TCP to RINA* (`LISTEN=APP`): each TCP connection accepted on
//!   `LISTEN` becomes a flow to application `APP`;
//! * *RINA to TCP* (`APP=ADDR`): `APP` is registered, and each flow
//!   allocated to it becomes a TCP connection to `ADDR`; a request whose
//!   connection fails is refused with the reason. Each request's
//!   connection is tried on a thread of its own (at most
//!   `--connect-timeout-ms`, below the daemon's wait for an answer), so a
//!   server that does not answer holds up no other request.
//!
//! The mappings come from the command line (their DIF `--dif`) or from a
//! file written for rlite's `rina-gw` (`--config`, each line with its
//! DIF; [`mapping::parse_rlite`]).
//!
//! A name withdrawn (`rinactl unregister`) ends its mapping; a daemon that
//! goes away is waited for, and the names registered again when it is
//! back. The log goes to standard error, a line per session; one that
//! went away silences it, nothing more.
//!
//! The gateways at the two ends of a flow carry the bytes as they come:
//! each TCP read is one SDU (at most the flow's largest), each SDU one TCP
//! write. The flows ask for reliable, in-order delivery by default, which
//! a normal DIF gives; a flow that may lose or reorder bytes breaks the
//! TCP stream it carries, so `--unreliable` is for shims on a reliable
//! medium only. A connection or flow that ends ends the other (a flow has
//! no half-close). What was written before is put on the flow first, and
//! the far daemon keeps the flow's end open until its gateway has taken
//! it (`System::hold_ended` in `rina-core`), so it all arrives.
//!
//! * [`mapping`] — the mappings as the command line writes them.
//! * [`session`] — one connection and its flow, the bytes between them.
//! * [`run`] — the listeners and registrations, the session limit.

pub mod mapping;
pub mod run;
pub mod session;
