//! The files `rina-tgen --out PREFIX` writes (schema in `docs/rina-tgen.md`):
//! `PREFIX.json` (a [`RunReport`]), `PREFIX.csv` (one row per flow and
//! direction) and, with `--samples`, `PREFIX.delays.csv` (every delay).

use super::metrics::FlowReport;
use super::Direction;
use rina_wire::QosSpec;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Version of the JSON schema.
pub const SCHEMA_VERSION: u32 = 1;

/// Everything one process measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// Always `rina-tgen`.
    pub tool: String,
    /// [`SCHEMA_VERSION`].
    pub schema: u32,
    /// `client` or `server`.
    pub role: String,
    /// Start of the run, ns since the Unix epoch.
    pub started_ns: u64,
    /// End of the run, ns since the Unix epoch.
    pub ended_ns: u64,
    /// One entry per flow (a server's: the flows still open and the last
    /// `--keep-flows` that ended).
    pub flows: Vec<FlowEntry>,
    /// A server's totals over every flow that ended, also those no longer
    /// in `flows`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub totals: Option<Totals>,
}

/// What a server measured on every flow that ended, summed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Flows that ended.
    pub flows: u64,
    /// Of those, flows whose entry was dropped from the report, being
    /// older than the last `--keep-flows`.
    pub flows_dropped: u64,
    /// Of those, flows that ended with an error.
    pub errors: u64,
    /// SDUs the senders wrote (as in each report's `sent_sdus`).
    pub sent_sdus: u64,
    /// Distinct SDUs received.
    pub recv_sdus: u64,
    /// Their bytes.
    pub recv_bytes: u64,
    /// SDUs lost.
    pub lost_sdus: u64,
    /// Duplicate SDUs.
    pub duplicates: u64,
    /// Reordered SDUs.
    pub reordered: u64,
    /// SDUs too late to be checked for duplication.
    pub late_unchecked: u64,
}

impl Totals {
    /// Adds a flow that ended.
    fn add(&mut self, e: &FlowEntry) {
        self.flows += 1;
        self.errors += u64::from(e.error.is_some());
        for r in &e.reports {
            self.sent_sdus = self.sent_sdus.saturating_add(r.sent_sdus);
            self.recv_sdus += r.recv_sdus;
            self.recv_bytes += r.recv_bytes;
            self.lost_sdus = self.lost_sdus.saturating_add(r.lost_sdus);
            self.duplicates += r.duplicates;
            self.reordered += r.reordered;
            self.late_unchecked += r.late_unchecked;
        }
    }
}

/// The flows a server saw end: the entries of the last `keep`, and the
/// [`Totals`] of all. Its size depends on `keep`, not on how many flows
/// a long-running server has seen.
#[derive(Debug, Clone)]
pub struct FlowLog {
    keep: usize,
    entries: VecDeque<FlowEntry>,
    totals: Totals,
}

impl FlowLog {
    /// An empty log keeping the entries of the last `keep` flows.
    pub fn new(keep: usize) -> FlowLog {
        FlowLog {
            keep,
            entries: VecDeque::new(),
            totals: Totals::default(),
        }
    }

    /// Adds a flow that ended; drops the oldest entry beyond `keep`.
    pub fn push(&mut self, e: FlowEntry) {
        self.totals.add(&e);
        self.entries.push_back(e);
        while self.entries.len() > self.keep {
            self.entries.pop_front();
            self.totals.flows_dropped += 1;
        }
    }

    /// The entries kept, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = &FlowEntry> {
        self.entries.iter()
    }

    /// The totals over every flow pushed.
    pub fn totals(&self) -> &Totals {
        &self.totals
    }
}

/// One flow and what was measured on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowEntry {
    /// Flow id.
    pub flow: u32,
    /// The other end's application name.
    pub peer: String,
    /// DIF the flow went through.
    pub dif: String,
    /// Profile name.
    pub profile: String,
    /// Configured direction.
    pub direction: Direction,
    /// Seed of the forward generator.
    pub seed: u64,
    /// QoS asked for.
    pub qos: QosSpec,
    /// Error that ended the flow early, if any.
    pub error: Option<String>,
    /// Per direction: `fwd`, `rev`, `rtt`.
    pub reports: Vec<FlowReport>,
    /// SDUs and bytes this end wrote (a client's own count, which stands
    /// when the server's REPORT, and so the `fwd` report, never came).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent: Option<SentCount>,
    /// A client's time from the allocation request that succeeded to the
    /// flow, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_ms: Option<f64>,
}

/// What one end of a flow wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentCount {
    /// SDUs written.
    pub sdus: u64,
    /// Their bytes, header included.
    pub bytes: u64,
}

impl RunReport {
    /// The summary CSV.
    pub fn csv(&self) -> String {
        let mut s = String::from(FlowReport::CSV_HEADER);
        s.push('\n');
        for f in &self.flows {
            for r in &f.reports {
                s.push_str(&r.csv_row(&f.peer, &f.profile));
                s.push('\n');
            }
        }
        s
    }

    /// The raw-delay CSV: `flow,direction,seq_of_arrival,delay_us`.
    pub fn samples_csv(&self) -> String {
        let mut s = String::from("flow,direction,index,delay_us\n");
        for f in &self.flows {
            for r in &f.reports {
                for (i, d) in r.samples_us.iter().flatten().enumerate() {
                    s.push_str(&format!("{},{},{i},{d:.3}\n", f.flow, r.direction));
                }
            }
        }
        s
    }

    /// Writes `PREFIX.json`, `PREFIX.csv` and, if any report has samples,
    /// `PREFIX.delays.csv`. Returns the paths written.
    pub fn write_files(&self, prefix: &Path) -> std::io::Result<Vec<PathBuf>> {
        let with = |ext: &str| {
            let mut p = prefix.as_os_str().to_owned();
            p.push(ext);
            PathBuf::from(p)
        };
        let mut out = Vec::new();
        let json = with(".json");
        let mut f = std::fs::File::create(&json)?;
        serde_json::to_writer(&mut f, self)?;
        f.write_all(b"\n")?;
        out.push(json);
        let csv = with(".csv");
        std::fs::write(&csv, self.csv())?;
        out.push(csv);
        if self
            .flows
            .iter()
            .any(|f| f.reports.iter().any(|r| r.samples_us.is_some()))
        {
            let d = with(".delays.csv");
            std::fs::write(&d, self.samples_csv())?;
            out.push(d);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tgen::header::Header;
    use crate::tgen::metrics::FlowMetrics;

    fn entry(flow: u32, sdus: u64) -> FlowEntry {
        let mut m = FlowMetrics::new(flow, 0);
        for seq in 0..sdus {
            m.on_sdu(10, &Header::data(flow, seq, 0), 100);
        }
        m.on_fin(sdus + 1, 0);
        FlowEntry {
            flow,
            peer: "client".into(),
            dif: "udp".into(),
            profile: "cbr".into(),
            direction: Direction::Forward,
            seed: 1,
            qos: QosSpec::default(),
            error: flow.is_multiple_of(2).then(|| "closed early".into()),
            reports: vec![m.report("fwd", true, false)],
            sent: None,
            allocation_ms: None,
        }
    }

    #[test]
    fn a_flow_log_keeps_the_last_entries_and_totals_of_all() {
        let mut log = FlowLog::new(3);
        for flow in 1..=10 {
            log.push(entry(flow, u64::from(flow)));
        }
        let kept: Vec<u32> = log.entries().map(|e| e.flow).collect();
        assert_eq!(kept, vec![8, 9, 10]);
        let t = log.totals();
        assert_eq!((t.flows, t.flows_dropped, t.errors), (10, 7, 5));
        // 1 + 2 + ... + 10 received, one more sent each.
        assert_eq!((t.recv_sdus, t.recv_bytes), (55, 5500));
        assert_eq!((t.sent_sdus, t.lost_sdus), (65, 10));
        let mut none = FlowLog::new(0);
        none.push(entry(1, 1));
        assert_eq!(none.entries().count(), 0);
        assert_eq!((none.totals().flows, none.totals().recv_sdus), (1, 1));
    }
}
