//! Backends run a checked [`Experiment`] and return what it measured. The
//! same file runs on all three:
//!
//! - [`local`]: one `rinad` per node on loopback, links as shim-udp with
//!   rate, delay and loss emulated in user space; no root.
//! - [`netns`]: a network namespace per node, a veth pair per link,
//!   shim-eth on a VLAN per link, rate by `tc tbf`, delay and loss in user
//!   space; root.
//! - [`sim`]: the simulator, deterministic, for large or long scenarios.
//! - [`ssh`]: one `rinad` per node on hosts reached over SSH (a testbed),
//!   placed by an inventory file.
//!
//! [`real`] is what `local`, `netns` and `ssh` share (configuration, processes,
//! tools, results); they differ in how links are made. [`run`] adds what is common: the load calibration of seed 003 (a first
//! run with the declared rates, then rates set so the measured average is
//! the target load).

pub mod local;
pub mod netns;
pub mod real;
pub mod sim;
pub mod ssh;
pub mod stack;

use crate::results::RunOutput;
use crate::{Experiment, LabError};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// What a backend gets besides the experiment.
pub struct RunCtx<'a> {
    /// The run's folder (`logs/` below it for per-node logs).
    pub dir: &'a Path,
    /// Called with the fraction done (0..=1) and what is happening.
    pub progress: &'a (dyn Fn(f64, &str) + Sync),
    /// Set on Ctrl-C: stop everything started and return
    /// [`LabError::Interrupted`].
    pub stop: &'a AtomicBool,
}

impl RunCtx<'_> {
    /// Whether the run must stop.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// A way of running experiments.
pub trait Backend {
    /// `local`, `netns` or `sim`.
    fn name(&self) -> &'static str;

    /// Whether this backend can run here, and if not why (root, tools).
    fn check(&self) -> Result<(), LabError>;

    /// Runs `exp` once. Everything it starts is stopped before it returns,
    /// whether it succeeds, fails or is interrupted.
    fn run_once(&mut self, exp: &Experiment, ctx: &RunCtx<'_>) -> Result<RunOutput, LabError>;
}

/// The backend called `name`.
pub fn by_name(name: &str) -> Result<Box<dyn Backend>, LabError> {
    match name {
        "local" => Ok(Box::new(local::Local::default())),
        "netns" => Ok(Box::new(netns::Netns::default())),
        "sim" => Ok(Box::new(sim::Sim::default())),
        "ssh" => Ok(Box::new(ssh::Ssh::default())),
        other => Err(LabError::Unsupported {
            backend: "?",
            reason: format!("no backend `{other}` (local, netns, sim or ssh)"),
        }),
    }
}

/// Runs `exp` on `backend`, calibrating the load first if the experiment
/// asks for it. Returns the measured run and, if calibrated, the rates set.
pub fn run(
    backend: &mut dyn Backend,
    exp: &Experiment,
    ctx: &RunCtx<'_>,
) -> Result<(RunOutput, Experiment), LabError> {
    let mut exp = exp.clone();
    if let Some(load) = exp.load.clone() {
        let mut cal = exp.clone();
        cal.load = None;
        cal.flows.retain(|f| !load.without.contains(&f.class));
        cal = cal.shortened(load.duration);
        let progress =
            |f: f64, what: &str| (ctx.progress)(f * 0.3, &format!("calibrating: {what}"));
        let cal_ctx = RunCtx {
            dir: &ctx.dir.join("calibration"),
            progress: &progress,
            stop: ctx.stop,
        };
        let measured = backend.run_once(&cal, &cal_ctx)?;
        measured.write(cal_ctx.dir)?;
        calibrate(&mut exp, &measured);
        let progress = |f: f64, what: &str| (ctx.progress)(0.3 + f * 0.7, what);
        let main_ctx = RunCtx {
            dir: ctx.dir,
            progress: &progress,
            stop: ctx.stop,
        };
        let mut out = backend.run_once(&exp, &main_ctx)?;
        out.dilation = exp.dilation;
        return Ok((out, exp));
    }
    let mut out = backend.run_once(&exp, ctx)?;
    out.dilation = exp.dilation;
    Ok((out, exp))
}

/// Sets every calibrated link's rate so that its measured average (busier
/// direction) is the target load of it. Links that carried nothing keep
/// their rate.
pub fn calibrate(exp: &mut Experiment, measured: &RunOutput) {
    let Some(load) = exp.load.clone() else { return };
    for &i in &load.links {
        let name = exp.links[i].name.clone();
        if let Some(r) = measured.links.iter().find(|l| l.link == name) {
            let avg = r.avg_bps_ab.max(r.avg_bps_ba);
            if avg > 0.0 {
                exp.links[i].rate_bps = avg / load.target;
            }
        }
    }
}
