//! The traffic phase of a run: clients started at their times, events applied, links counted.

use super::launch::Launcher;
use super::{matrix, safe, Job, Procs, RunPlan, Server};
use crate::backend::RunCtx;
use crate::resolve::{Event, EventKind};
use crate::results::TimelineEntry;
use crate::LabError;
use std::time::{Duration, Instant};

/// Per link: bytes sent A to B, B to A, and frames dropped.
type Counters = Vec<(u64, u64, u64)>;

/// The links' counters when traffic started and when it ended.
pub(super) struct LinkCounters {
    pub(super) base: Counters,
    pub(super) end: Counters,
}

/// What the traffic phase starts and stops programs with, and notes.
struct Traffic<'a> {
    launch: &'a Launcher<'a>,
    servers: &'a [Server],
    procs: &'a mut Procs,
    timeline: &'a mut Vec<TimelineEntry>,
    /// The node each application is at.
    app_at: Vec<usize>,
}

/// Runs the traffic of `plan`: applies the events and starts the clients
/// at their times until every client is done after the experiment's
/// duration, or the time allowed for the last reports has passed.
pub(super) fn run_traffic(
    launch: &Launcher<'_>,
    ctx: &RunCtx<'_>,
    plan: &mut RunPlan,
    procs: &mut Procs,
    timeline: &mut Vec<TimelineEntry>,
) -> Result<LinkCounters, LabError> {
    let exp = launch.exp;
    let RunPlan {
        servers,
        jobs,
        groups,
        ..
    } = plan;
    launch.fab.traffic_starts();
    let t0 = Instant::now();
    let mut events = exp.events.clone();
    events.sort_by_key(|e| e.at);
    let mut next_event = 0;
    let last_end = jobs
        .iter()
        .map(|j| j.stop)
        .max()
        .unwrap_or_default()
        .max(exp.duration);
    // Room for the clients' last reports (their wait is dilated too).
    let hard_end = last_end + Duration::from_secs_f64(10.0 / exp.dilation.unwrap_or(1.0));
    let mut tr = Traffic {
        launch,
        servers,
        procs,
        timeline,
        app_at: exp.apps.iter().map(|a| a.node).collect(),
    };
    let link_base = launch.link_counters();
    let mut link_end: Option<Counters> = None;
    loop {
        if ctx.stopped() {
            return Err(LabError::Interrupted);
        }
        let t = t0.elapsed();
        while next_event < events.len() && events[next_event].at <= t {
            next_event += 1;
            tr.apply(&events[next_event - 1])?;
        }
        tr.start_groups(groups, jobs, t)?;
        tr.run_clients(jobs, t)?;
        if link_end.is_none() && t >= exp.duration {
            link_end = Some(launch.link_counters());
        }
        let running = tr.running(jobs);
        (ctx.progress)(
            0.1 + 0.9 * (t.as_secs_f64() / last_end.as_secs_f64().max(1e-3)).min(1.0),
            &format!("traffic: {:.1} s, {running} clients to go", t.as_secs_f64()),
        );
        if (running == 0 && t >= exp.duration) || t >= hard_end {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let traffic_time = t0.elapsed();
    let link_end = link_end.unwrap_or_else(|| launch.link_counters());
    tr.note_still_running(jobs, traffic_time);
    Ok(LinkCounters {
        base: link_base,
        end: link_end,
    })
}

impl Traffic<'_> {
    /// Applies event `e` and notes it in the timeline.
    fn apply(&mut self, e: &Event) -> Result<(), LabError> {
        let (exp, fab) = (self.launch.exp, self.launch.fab);
        let what = match e.what {
            EventKind::LinkDown(l) => {
                fab.set_link(l, false)?;
                format!("link {} down", exp.links[l].name)
            }
            EventKind::LinkUp(l) => {
                fab.set_link(l, true)?;
                format!("link {} up", exp.links[l].name)
            }
            EventKind::NodeStop(n) => {
                self.procs.kill(&format!("rinad {n}"));
                format!("node {} stopped", exp.nodes[n])
            }
            EventKind::NodeStart(n) => self.start_node(n)?,
            EventKind::AppMove { app, to } => self.move_app(app, to)?,
        };
        self.timeline.push(TimelineEntry {
            t_s: e.at.as_secs_f64(),
            what,
        });
        Ok(())
    }

    /// Starts node `n`'s `rinad` again, then (once it answers) the servers
    /// of the names at `n`; returns the timeline's line.
    fn start_node(&mut self, n: usize) -> Result<String, LabError> {
        self.launch.start_rinad(self.procs, n)?;
        // Its servers come back once its socket is there.
        let until = Instant::now() + Duration::from_secs(3);
        while !self.launch.answers(n) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        for s in self
            .servers
            .iter()
            .filter(|s| s.node == n && s.app.is_none_or(|a| self.app_at[a] == n))
        {
            self.procs.kill(&s.proc_name());
            self.launch.start_server(self.procs, s)?;
        }
        Ok(format!("node {} started", self.launch.exp.nodes[n]))
    }

    /// Moves application `app` to node `to`: stops its servers where it
    /// was and starts them there; returns the timeline's line.
    fn move_app(&mut self, app: usize, to: usize) -> Result<String, LabError> {
        let exp = self.launch.exp;
        let from = self.app_at[app];
        for s in self
            .servers
            .iter()
            .filter(|s| s.app == Some(app) && s.node == from)
        {
            self.procs.kill(&s.proc_name());
        }
        for s in self
            .servers
            .iter()
            .filter(|s| s.app == Some(app) && s.node == to)
        {
            self.launch.start_server(self.procs, s)?;
        }
        self.app_at[app] = to;
        Ok(format!(
            "application {} moved from {} to {}",
            exp.apps[app].name, exp.nodes[from], exp.nodes[to]
        ))
    }

    /// Starts, at `t`, each group's `rina-tgen` not yet started.
    fn start_groups(
        &mut self,
        groups: &[matrix::Group],
        jobs: &mut [Job],
        t: Duration,
    ) -> Result<(), LabError> {
        let exp = self.launch.exp;
        for (g, file) in groups.iter().zip(&self.launch.matrix_at) {
            if !jobs[g.jobs[0]].started {
                let child = self.launch.spawn_group(jobs, g, file)?;
                self.procs.add(g.proc.clone(), child);
                for &k in &g.jobs {
                    jobs[k].started = true;
                }
                self.timeline.push(TimelineEntry {
                    t_s: t.as_secs_f64(),
                    what: format!(
                        "rina-tgen of {} started ({} flows)",
                        exp.nodes[g.node],
                        g.jobs.len()
                    ),
                });
            }
        }
        Ok(())
    }

    /// Starts, at `t`, the clients of the jobs no group runs whose time has
    /// come, after marking for a new start those whose allocation failed.
    fn run_clients(&mut self, jobs: &mut [Job], t: Duration) -> Result<(), LabError> {
        let exp = self.launch.exp;
        for j in jobs.iter_mut().filter(|j| j.group.is_none()) {
            self.retry_if_allocation_failed(j, t);
            if !j.started && j.attempt_at <= t {
                j.started = true;
                let f = &exp.flows[j.flow];
                let child = self.launch.spawn_client(j, t)?;
                self.procs.add(j.proc.clone(), child);
                self.timeline.push(TimelineEntry {
                    t_s: t.as_secs_f64(),
                    what: match j.failed {
                        0 => format!("{} started ({} -> {})", j.id, exp.nodes[f.from], j.dst),
                        n => format!("{} started again (allocation failed {n} time(s))", j.id),
                    },
                });
            }
        }
        Ok(())
    }

    /// If job `j`'s client exited at `t` because it could not allocate its
    /// flow, and there are tries and time left, marks it to start again in
    /// 200 ms.
    fn retry_if_allocation_failed(&mut self, j: &mut Job, t: Duration) {
        if j.started && j.failed < 100 && t + Duration::from_millis(300) < j.stop {
            if let Some(Some(st)) = self.procs.status(&j.proc) {
                let errs = std::fs::read_to_string(
                    self.launch.dirs.outs.join(format!("{}.err", safe(&j.id))),
                )
                .unwrap_or_default();
                if !st.success() && errs.contains("cannot allocate") {
                    self.procs.kill(&j.proc);
                    j.started = false;
                    j.failed += 1;
                    j.attempt_at = t + Duration::from_millis(200);
                }
            }
        }
    }

    /// How many clients are still to start or still running.
    fn running(&mut self, jobs: &[Job]) -> usize {
        jobs.iter()
            .filter(|j| !j.started || matches!(self.procs.status(&j.proc), Some(None)))
            .count()
    }

    /// Notes in the timeline the clients still running when traffic ended
    /// (`traffic_time` after it began): they are stopped.
    fn note_still_running(&mut self, jobs: &[Job], traffic_time: Duration) {
        for j in jobs {
            if matches!(self.procs.status(&j.proc), Some(None)) {
                self.timeline.push(TimelineEntry {
                    t_s: traffic_time.as_secs_f64(),
                    what: format!("{} still running: stopped", j.id),
                });
            }
        }
    }
}
