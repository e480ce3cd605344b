//! The `netns` backend (being written).

use super::{Backend, RunCtx};
use crate::results::RunOutput;
use crate::{Experiment, LabError};

/// The `netns` backend.
#[derive(Debug, Default)]
pub struct Netns {}

impl Backend for Netns {
    fn name(&self) -> &'static str {
        "netns"
    }

    fn check(&self) -> Result<(), LabError> {
        Err(LabError::Unsupported {
            backend: "netns",
            reason: "not built yet".into(),
        })
    }

    fn run_once(&mut self, _exp: &Experiment, _ctx: &RunCtx<'_>) -> Result<RunOutput, LabError> {
        self.check()?;
        unreachable!()
    }
}
