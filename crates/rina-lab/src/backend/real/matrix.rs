//! One `rina-tgen` per node: the tgen flows a node sends run in one client
//! process from a traffic matrix (`rina-tgen client --matrix`), so that
//! seed 003's 150 flows cost 8 processes, not 150 (37 daemons and their
//! traffic share two cores).
//!
//! A flow is run this way when it is a tgen flow to a destination that
//! does not move during it (one [`Job`]); a flow split around application
//! moves keeps one client per part, which the backend restarts while the
//! directory learns where the application went. A grouped flow whose
//! allocation fails is retried by `rina-tgen` itself (`--alloc-retry-s`)
//! for up to a quarter of its time, then runs for what is left. In a
//! dilated experiment the wait for each flow's REPORT is dilated too.

use super::{kind_name, safe, Job, ProfileFields};
use crate::model::TrafficKind;
use crate::Experiment;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The tgen flows one node sends, run by one process.
#[derive(Debug, Clone)]
pub struct Group {
    /// Sending node.
    pub node: usize,
    /// Jobs (indices), in matrix order: job `jobs[k]` is the matrix's flow
    /// `k + 1`.
    pub jobs: Vec<usize>,
    /// Process name (and the stem of its files).
    pub proc: String,
}

/// The groups of `jobs`: every tgen job that is its flow's only part, by
/// sending node.
pub fn groups(exp: &Experiment, jobs: &[Job]) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    for (k, j) in jobs.iter().enumerate() {
        let f = &exp.flows[j.flow];
        let parts = jobs.iter().filter(|o| o.flow == j.flow).count();
        if f.kind != TrafficKind::Tgen || parts != 1 {
            continue;
        }
        match out.iter_mut().find(|g| g.node == f.from) {
            Some(g) => g.jobs.push(k),
            None => out.push(Group {
                node: f.from,
                jobs: vec![k],
                proc: format!("tgen {}", exp.nodes[f.from]),
            }),
        }
    }
    out
}

/// Name of a group's files (`out/<stem>.json`, `conf/<stem>.toml`).
pub fn stem(exp: &Experiment, g: &Group) -> String {
    safe(&format!("tgen-{}", exp.nodes[g.node]))
}

/// Seconds a grouped flow's allocation is retried: a quarter of its time,
/// at most 10 s (of the experiment's own time scale).
fn retry_s(len: Duration) -> f64 {
    (len.as_secs_f64() / 4.0).min(10.0)
}

/// The traffic matrix of a group (TOML): one `[[flow]]` per job, with the
/// job's destination, DIF, cube, source, start, length and seed (the seed
/// a client of its own would have had).
pub fn matrix_text(exp: &Experiment, jobs: &[Job], g: &Group) -> String {
    let mut t = format!(
        "# {} tgen flows sent by {} (rina-lab)\n",
        g.jobs.len(),
        exp.nodes[g.node]
    );
    for &k in &g.jobs {
        let j = &jobs[k];
        let f = &exp.flows[j.flow];
        let _ = writeln!(t, "\n# {}\n[[flow]]", j.id);
        let _ = writeln!(t, "peer = {:?}", j.dst);
        let _ = writeln!(t, "dif = {:?}", j.dif);
        if let Some(p) = &f.profile {
            let pf = ProfileFields::of(p);
            let _ = writeln!(t, "profile = {:?}", pf.name);
            let _ = writeln!(t, "rate_bps = {:?}", pf.rate_bps);
            let _ = writeln!(t, "size = {}", pf.size);
            if let Some((on, off)) = pf.on_off {
                let _ = writeln!(t, "on_s = {on:?}\noff_s = {off:?}");
            }
        } else {
            let _ = writeln!(t, "profile = \"cbr\"");
        }
        if f.shim.is_none() && f.cube != 0 {
            let _ = writeln!(t, "qos_cube = {}", f.cube);
        }
        let _ = writeln!(t, "start_s = {:?}", j.start.as_secs_f64());
        let len = j.stop.saturating_sub(j.start);
        let _ = writeln!(t, "duration_s = {:?}", len.as_secs_f64().max(0.05));
        let _ = writeln!(t, "direction = \"forward\"");
        // As a string: TOML's integers stop at 2^63 - 1.
        let _ = writeln!(t, "seed = \"{}\"", super::flow_seed(exp.seed, j.flow));
    }
    t
}

/// The command line of a group's client.
pub fn command(
    mut c: Command,
    exp: &Experiment,
    jobs: &[Job],
    g: &Group,
    sock: &Path,
    matrix: &Path,
) -> Command {
    let shortest = g
        .jobs
        .iter()
        .map(|&k| jobs[k].stop.saturating_sub(jobs[k].start))
        .min()
        .unwrap_or_default();
    c.arg("client")
        .arg("--socket")
        .arg(sock)
        .arg("--name")
        .arg(format!(
            "{}-{}",
            kind_name(TrafficKind::Tgen),
            exp.nodes[g.node]
        ))
        .arg("--matrix")
        .arg(matrix)
        .arg("--alloc-retry-s")
        .arg(format!("{:.3}", retry_s(shortest)))
        .arg("--report-wait-s")
        .arg(format!(
            "{:.1}",
            super::REPORT_WAIT_S / exp.dilation.unwrap_or(1.0)
        ))
        .arg("--json")
        .arg("--interval-s")
        .arg("0");
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use rina_tools::tgen::matrix::Matrix;

    #[test]
    fn seed_003_runs_one_tgen_per_sending_node() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/lab/metro-37.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let exp = crate::resolve::load(&text, Some("spn-mr-90"))
            .unwrap()
            .dilated(0.05);
        let jobs = super::super::plan(&exp).unwrap().1;
        let gs = groups(&exp, &jobs);
        let tgen = exp
            .flows
            .iter()
            .filter(|f| f.kind == TrafficKind::Tgen)
            .count();
        assert_eq!(gs.iter().map(|g| g.jobs.len()).sum::<usize>(), tgen);
        let senders: std::collections::BTreeSet<usize> = exp
            .flows
            .iter()
            .filter(|f| f.kind == TrafficKind::Tgen)
            .map(|f| f.from)
            .collect();
        assert_eq!(gs.len(), senders.len());
        assert!(gs.len() < 30, "{} processes", gs.len());
        // Every group's matrix is one rina-tgen reads back, flow for flow.
        for g in &gs {
            let plans = Matrix::parse(&matrix_text(&exp, &jobs, g))
                .unwrap()
                .plans(0, None)
                .unwrap();
            assert_eq!(plans.len(), g.jobs.len());
            for (p, &k) in plans.iter().zip(&g.jobs) {
                let (j, f) = (&jobs[k], &exp.flows[jobs[k].flow]);
                assert_eq!(p.peer, j.dst);
                assert_eq!(p.dif.as_deref(), Some(j.dif.as_str()));
                assert_eq!(p.qos.qos_cube, Some(f.cube));
                assert!((p.duration_s - (j.stop - j.start).as_secs_f64()).abs() < 1e-6);
                let want = f.profile.as_ref().unwrap().mean_rate_bps();
                let got = p.source.profile().unwrap().mean_rate_bps();
                assert!((got / want - 1.0).abs() < 1e-6, "{} {got} {want}", j.id);
                assert_eq!(p.seed, super::super::flow_seed(exp.seed, j.flow));
            }
        }
    }
}
