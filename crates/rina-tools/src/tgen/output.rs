//! The files `rina-tgen --out PREFIX` writes (schema in `docs/rina-tgen.md`):
//! `PREFIX.json` (a [`RunReport`]), `PREFIX.csv` (one row per flow and
//! direction) and, with `--samples`, `PREFIX.delays.csv` (every delay).

use super::metrics::FlowReport;
use super::Direction;
use rina_wire::QosSpec;
use serde::{Deserialize, Serialize};
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
    /// One entry per flow.
    pub flows: Vec<FlowEntry>,
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
