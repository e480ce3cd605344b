//! `rina-lab`: one experiment file, one command, four backends.
//!
//! - [`model`]: the experiment file as written (TOML), [`resolve`]: checked
//!   and derived ([`Experiment`]), every error naming its line;
//! - [`backend`]: `local` (one `rinad` per node on loopback, no root),
//!   `netns` (a namespace per node, shim-eth over veth, root), `sim`
//!   (the deterministic simulator over the same protocol machines) and
//!   `ssh` (hosts of a testbed, placed by an inventory file);
//! - [`results`]: per-flow metrics (CSV and JSON), the summary table,
//!   [`plot`]: delay CDFs, goodput against SDU size, RTT against hops.
//!
//! The file format is documented in `docs/rina-lab.md`; the scenarios in
//! `examples/lab/` use all of it.

pub mod backend;
pub mod model;
pub mod plot;
pub mod report;
pub mod resolve;
pub mod results;
pub mod units;

pub use resolve::{load, Experiment};

use thiserror::Error;

/// What can go wrong in `rina-lab`.
#[derive(Debug, Error)]
pub enum LabError {
    /// The experiment file is wrong at this line and column.
    #[error("line {line}, column {col}: {msg}")]
    At {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        col: usize,
        /// What is wrong.
        msg: String,
    },
    /// `--variant` names a variant the file does not have.
    #[error("no variant `{name}` in the file ({})", variants_it_has(known))]
    NoVariant {
        /// The name asked for.
        name: String,
        /// The names the file has.
        known: Vec<String>,
    },
    /// The backend cannot run this experiment here (and says why).
    #[error("backend {backend}: {reason}")]
    Unsupported {
        /// Backend name.
        backend: &'static str,
        /// Why.
        reason: String,
    },
    /// Something the backend started failed.
    #[error("backend {backend}: {what}")]
    Backend {
        /// Backend name.
        backend: &'static str,
        /// What failed.
        what: String,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The run was interrupted (Ctrl-C).
    #[error("interrupted")]
    Interrupted,
}

/// What [`LabError::NoVariant`] says the file has.
fn variants_it_has(known: &[String]) -> String {
    if known.is_empty() {
        "it has none: run it without --variant".into()
    } else {
        format!("it has: {}", known.join(", "))
    }
}

impl LabError {
    /// An IO error on `path`.
    pub fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        LabError::Io {
            path: path.as_ref().display().to_string(),
            source,
        }
    }
}
