//! The `local` backend (being written).

use super::{Backend, RunCtx};
use crate::results::RunOutput;
use crate::{Experiment, LabError};

/// The `local` backend.
#[derive(Debug, Default)]
pub struct Local {}

impl Backend for Local {
    fn name(&self) -> &'static str {
        "local"
    }

    fn check(&self) -> Result<(), LabError> {
        Err(LabError::Unsupported {
            backend: "local",
            reason: "not built yet".into(),
        })
    }

    fn run_once(&mut self, _exp: &Experiment, _ctx: &RunCtx<'_>) -> Result<RunOutput, LabError> {
        self.check()?;
        unreachable!()
    }
}
