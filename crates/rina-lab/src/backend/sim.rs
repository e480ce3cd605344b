//! The `sim` backend (being written).

use super::{Backend, RunCtx};
use crate::results::RunOutput;
use crate::{Experiment, LabError};

/// The `sim` backend.
#[derive(Debug, Default)]
pub struct Sim {}

impl Backend for Sim {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn check(&self) -> Result<(), LabError> {
        Err(LabError::Unsupported {
            backend: "sim",
            reason: "not built yet".into(),
        })
    }

    fn run_once(&mut self, _exp: &Experiment, _ctx: &RunCtx<'_>) -> Result<RunOutput, LabError> {
        self.check()?;
        unreachable!()
    }
}
