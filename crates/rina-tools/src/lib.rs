//! Shared code of the RINA command-line tools (`rinactl`, `rina-echo`,
//! `rina-perf`, `rina-demo`).
//!
//! * [`opts`] — options every tool takes (`--socket`, `--dif`, QoS).
//! * [`stats`] — min/avg/max/mdev and percentiles.
//! * [`echo`] — `rina-echo`'s probe format and JSON report.
//! * [`perf`] — `rina-perf`'s in-band protocol, receiver and JSON report.
//! * [`table`] — aligned text tables.

pub mod echo;
pub mod opts;
pub mod perf;
pub mod stats;
pub mod table;
