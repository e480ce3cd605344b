//! Traffic: the profiles, and each `[[traffic]]` entry expanded into
//! flows (tgen matrices, echo probes, perf runs).

use super::difs::{cube_names, dif_of};
use super::{Dest, Flow, Net, Source};
use crate::model::{self, File, TrafficKind};
use crate::LabError;
use rina_tools::tgen::gen::Profile;
use std::collections::BTreeMap;
use std::time::Duration;
use toml::Spanned;

/// The largest SDU a file asks for, bytes (perf `sdu_sizes`, echo `size`,
/// a profile's `size`): 1 MiB.
pub const MAX_SDU: usize = 1 << 20;

/// The most flows an experiment expands to, every `[[traffic]]` entry
/// together: 400 times the largest shipped example (metro-37's `video-90`,
/// 228 flows).
pub const MAX_FLOWS: usize = 100_000;

/// Traffic profiles by name, each with its declaration.
pub(super) type Profiles<'f> = BTreeMap<String, (&'f model::ProfileDecl, Profile)>;

/// One `[[traffic]]` entry, its DIF, count and times resolved.
struct Entry<'a> {
    net: &'a Net<'a>,
    t: &'a Spanned<model::TrafficDecl>,
    d: &'a model::TrafficDecl,
    /// Index of the entry in the file (flow ids).
    ti: usize,
    /// Directly over the link shims.
    over_links: bool,
    dif: usize,
    count: usize,
    start: Duration,
    stop: Duration,
}

/// The endpoint pairs of an entry, and the link shim each runs over.
struct Ends {
    ends: Vec<(usize, Dest)>,
    shims: Vec<Option<usize>>,
}

/// Resolves the traffic profiles.
pub(super) fn resolve_profiles<'f>(src: &Source, file: &'f File) -> Result<Profiles<'f>, LabError> {
    let mut profiles: Profiles = BTreeMap::new();
    for p in &file.profiles {
        let d = p.get_ref();
        if let Some(size) = d.size.filter(|&s| s > MAX_SDU) {
            return Err(src.err(
                p.span(),
                format!(
                    "profile `{}`: `size` {size} is more than 1 MiB ({MAX_SDU} bytes)",
                    d.name.get_ref()
                ),
            ));
        }
        let prof = d
            .source()
            .profile_keyed(["on", "off"])
            .map_err(|e| src.err(p.span(), format!("profile `{}`: {e}", d.name.get_ref())))?;
        if profiles
            .insert(d.name.get_ref().clone(), (d, prof))
            .is_some()
        {
            return Err(src.err(
                d.name.span(),
                format!("profile `{}` is declared twice", d.name.get_ref()),
            ));
        }
    }
    Ok(profiles)
}

/// Resolves the traffic entries that run in `variant` into flows.
pub(super) fn resolve_traffic(
    net: &Net,
    file: &File,
    variant: Option<&str>,
    profiles: &Profiles,
    duration: Duration,
) -> Result<Vec<Flow>, LabError> {
    let mut flows: Vec<Flow> = Vec::new();
    for (ti, t) in file.traffic.iter().enumerate() {
        if !runs_in(&net.ctx.src, file, t, variant)? {
            continue;
        }
        let e = Entry::new(net, ti, t, duration)?;
        let ends = e.ends()?;
        e.check_flow_count(&ends, flows.len())?;
        match e.d.kind {
            TrafficKind::Tgen => e.tgen_flows(&ends, profiles, &mut flows)?,
            TrafficKind::Echo | TrafficKind::Perf => e.probe_flows(&ends, &mut flows)?,
        }
    }
    Ok(flows)
}

/// Resolves whether entry `t` runs in `variant` (the variants it names
/// must be declared).
fn runs_in(
    src: &Source,
    file: &File,
    t: &Spanned<model::TrafficDecl>,
    variant: Option<&str>,
) -> Result<bool, LabError> {
    let d = t.get_ref();
    for v in &d.variants {
        if !file
            .variants
            .iter()
            .any(|x| x.get_ref().name.get_ref() == v)
        {
            return Err(src.err(
                t.span(),
                format!("traffic names variant `{v}`, which the file does not declare"),
            ));
        }
    }
    Ok(d.variants.is_empty() || variant.is_some_and(|v| d.variants.iter().any(|x| x == v)))
}

impl<'a> Entry<'a> {
    /// Resolves entry `ti`'s DIF (or the link shims), count, start and stop.
    fn new(
        net: &'a Net<'a>,
        ti: usize,
        t: &'a Spanned<model::TrafficDecl>,
        duration: Duration,
    ) -> Result<Self, LabError> {
        let src = &net.ctx.src;
        let d = t.get_ref();
        let over_links = d.dif.get_ref() == "links";
        let dif = if over_links {
            if net.difs.is_empty() {
                return Err(src.err(
                    d.dif.span(),
                    "traffic over `links` needs at least one normal DIF declared",
                ));
            }
            0
        } else {
            dif_of(src, net.difs, &d.dif)?
        };
        let count = d.count.unwrap_or(1);
        if count == 0 || count > 10_000 {
            return Err(src.err(t.span(), "`count` must be between 1 and 10000"));
        }
        let start = d.start.map(|x| x.get()).unwrap_or_default();
        if let Some(s) = d.stop.filter(|s| s.get() > duration) {
            return Err(src.err(
                t.span(),
                format!(
                    "traffic stops at {:?}, after the end of the experiment ({:?}): \
                     `stop` is at most the `duration`",
                    s.get(),
                    duration
                ),
            ));
        }
        let stop = d.stop.map(|x| x.get()).unwrap_or(duration);
        if start >= stop {
            let why = if d.stop.is_some() {
                "its `stop`"
            } else {
                "the end of the experiment"
            };
            return Err(src.err(
                t.span(),
                format!("traffic starts at {start:?}, not before it stops at {stop:?} ({why})"),
            ));
        }
        Ok(Entry {
            net,
            t,
            d,
            ti,
            over_links,
            dif,
            count,
            start,
            stop,
        })
    }

    /// Resolves node `n` (written `s`) as a member of the entry's DIF.
    fn member(&self, s: &Spanned<String>, n: usize) -> Result<usize, LabError> {
        let difs = self.net.difs;
        if self.over_links || difs[self.dif].has_member(n) {
            Ok(n)
        } else {
            Err(self.net.ctx.src.err(
                s.span(),
                format!(
                    "`{}` is not a member of DIF `{}`",
                    s.get_ref(),
                    difs[self.dif].name
                ),
            ))
        }
    }

    /// Resolves cube `s` of the entry's DIF to its QoS-id (none: the first).
    fn cube_id(&self, s: Option<&Spanned<String>>) -> Result<u64, LabError> {
        let (src, difs, dif) = (&self.net.ctx.src, self.net.difs, self.dif);
        match s {
            None => Ok(difs[dif].cubes[0].id),
            Some(s) if self.over_links => Err(src.err(s.span(), "a link shim has no QoS cubes")),
            Some(s) => difs[dif]
                .cubes
                .iter()
                .find(|c| &c.name == s.get_ref())
                .map(|c| c.id)
                .ok_or_else(|| {
                    src.err(
                        s.span(),
                        format!(
                            "DIF `{}` has no cube `{}` (it has {})",
                            difs[dif].name,
                            s.get_ref(),
                            cube_names(&difs[dif])
                        ),
                    )
                }),
        }
    }

    /// Resolves the endpoint pairs and the link shim of each.
    fn ends(&self) -> Result<Ends, LabError> {
        let ends = self.endpoints()?;
        let shims = self.shims(&ends)?;
        Ok(Ends { ends, shims })
    }

    /// Resolves the endpoint pairs: `pairs`, then `from` with `to` or `app`.
    fn endpoints(&self) -> Result<Vec<(usize, Dest)>, LabError> {
        let (ctx, d) = (self.net.ctx, self.d);
        let mut ends: Vec<(usize, Dest)> = Vec::new();
        for p in &d.pairs {
            let a = self.member(&p[0], ctx.node(&p[0])?)?;
            let b = self.member(&p[1], ctx.node(&p[1])?)?;
            ends.push((a, Dest::Node(b)));
        }
        if !d.from.is_empty() {
            let dest = self.dest_of_from()?;
            for s in &d.from {
                for n in ctx.node_set(std::slice::from_ref(s))? {
                    if !self.net.difs[self.dif].has_member(n) {
                        if s.get_ref().starts_with('@') || s.get_ref() == "*" {
                            continue; // groups select the members among them
                        }
                        self.member(s, n)?;
                    }
                    if Dest::Node(n) != dest
                        && !matches!(dest, Dest::App(a) if self.net.apps[a].node == n)
                    {
                        ends.push((n, dest));
                    }
                }
            }
        }
        if ends.is_empty() {
            let why = if d.from.is_empty() {
                "traffic has no endpoints: give `pairs`, or `from` with `to` or `app`"
            } else {
                "traffic has no endpoints: every `from` node is where it would go"
            };
            return Err(ctx.src.err(self.t.span(), why));
        }
        Ok(ends)
    }

    /// Resolves the destination of `from`: node `to` or application `app`.
    fn dest_of_from(&self) -> Result<Dest, LabError> {
        let ctx = self.net.ctx;
        Ok(match (&self.d.to, &self.d.app) {
            (Some(to), None) => Dest::Node(self.member(to, ctx.node(to)?)?),
            (None, Some(app)) => self.app_dest(app)?,
            _ => {
                return Err(ctx.src.err(
                    self.t.span(),
                    "with `from`, give exactly one of `to` (a node) and `app`",
                ))
            }
        })
    }

    /// Resolves destination application `app`, registered in the entry's DIF.
    fn app_dest(&self, app: &Spanned<String>) -> Result<Dest, LabError> {
        let (src, apps, difs) = (&self.net.ctx.src, self.net.apps, self.net.difs);
        let ai = apps
            .iter()
            .position(|x| &x.name == app.get_ref())
            .ok_or_else(|| {
                src.err(
                    app.span(),
                    format!("unknown application `{}` (not in [[app]])", app.get_ref()),
                )
            })?;
        if apps[ai].dif != self.dif {
            return Err(src.err(
                app.span(),
                format!(
                    "application `{}` is registered in DIF `{}`, not `{}`",
                    app.get_ref(),
                    difs[apps[ai].dif].name,
                    difs[self.dif].name
                ),
            ));
        }
        Ok(Dest::App(ai))
    }

    /// Resolves the link shim each endpoint pair runs over (over `links`
    /// only: the link between the two ends).
    fn shims(&self, ends: &[(usize, Dest)]) -> Result<Vec<Option<usize>>, LabError> {
        let (ctx, links, apps) = (self.net.ctx, self.net.links, self.net.apps);
        let mut shims: Vec<Option<usize>> = Vec::new();
        for &(a, b) in ends {
            if !self.over_links {
                shims.push(None);
                continue;
            }
            let bn = match b {
                Dest::Node(n) => n,
                Dest::App(x) => apps[x].node,
            };
            let l = links
                .iter()
                .position(|l| (l.a == a && l.b == bn) || (l.a == bn && l.b == a))
                .ok_or_else(|| {
                    ctx.src.err(
                        self.t.span(),
                        format!(
                            "`{}` and `{}` share no link, so no link shim joins them",
                            ctx.nodes[a], ctx.nodes[bn]
                        ),
                    )
                })?;
            shims.push(Some(l));
        }
        Ok(shims)
    }

    /// The name of a destination in flow ids.
    fn dest_name(&self, x: Dest) -> String {
        match x {
            Dest::Node(n) => self.net.ctx.nodes[n].clone(),
            Dest::App(a) => self.net.apps[a].name.clone(),
        }
    }

    /// Checks that the entry's flows (profiles × endpoint pairs ×
    /// directions × `count`), with the `before` of the entries before it,
    /// stay within [`MAX_FLOWS`], and that it lists no profile or pair
    /// twice (each would only multiply the flows).
    fn check_flow_count(&self, ends: &Ends, before: usize) -> Result<(), LabError> {
        let (src, d) = (&self.net.ctx.src, self.d);
        if let Some(p) = first_repeat(d.profiles.iter().map(|p| p.get_ref())) {
            return Err(src.err(
                d.profiles[p].span(),
                format!(
                    "profile `{}` is listed twice in this traffic's `profiles`",
                    d.profiles[p].get_ref()
                ),
            ));
        }
        if let Some(p) = first_repeat(d.pairs.iter().map(|[a, b]| (a.get_ref(), b.get_ref()))) {
            let [a, b] = &d.pairs[p];
            return Err(src.err(
                a.span(),
                format!(
                    "pair [\"{}\", \"{}\"] is listed twice in this traffic's `pairs`",
                    a.get_ref(),
                    b.get_ref()
                ),
            ));
        }
        let per_end = match d.kind {
            TrafficKind::Tgen => d.profiles.len().max(1) * (1 + usize::from(d.bidirectional)),
            TrafficKind::Echo | TrafficKind::Perf => 1,
        };
        let n = per_end
            .saturating_mul(ends.ends.len())
            .saturating_mul(self.count);
        if n > MAX_FLOWS.saturating_sub(before) {
            return Err(src.err(
                self.t.span(),
                format!(
                    "this [[traffic]] (flows `t{}.…`) expands to {n} flows \
                     ({}endpoint pairs × `count`), with {before} before it: an \
                     experiment runs at most {MAX_FLOWS} flows",
                    self.ti,
                    if d.kind == TrafficKind::Tgen {
                        "`profiles` × directions × "
                    } else {
                        ""
                    },
                ),
            ));
        }
        Ok(())
    }

    /// Resolves a tgen entry: flows per profile, endpoint pair, direction
    /// and count.
    fn tgen_flows(
        &self,
        ends: &Ends,
        profiles: &Profiles,
        flows: &mut Vec<Flow>,
    ) -> Result<(), LabError> {
        let (src, d) = (&self.net.ctx.src, self.d);
        if d.profiles.is_empty() {
            return Err(src.err(self.t.span(), "tgen traffic needs `profiles`"));
        }
        for pname in &d.profiles {
            let (pd, prof) = profiles.get(pname.get_ref()).ok_or_else(|| {
                src.err(
                    pname.span(),
                    format!("unknown profile `{}` (not in [[profile]])", pname.get_ref()),
                )
            })?;
            let cube = self.cube_id(pd.cube.as_ref())?;
            for &(a, b) in &ends.ends {
                let mut dirs = vec![(a, b)];
                if d.bidirectional {
                    match b {
                        Dest::Node(bn) => dirs.push((bn, Dest::Node(a))),
                        Dest::App(_) => {
                            return Err(src.err(
                                self.t.span(),
                                "`bidirectional` needs node endpoints, not `app`",
                            ))
                        }
                    }
                }
                let shim = ends.shim_of(a, b);
                for (x, y) in dirs {
                    for k in 0..self.count {
                        flows.push(Flow {
                            id: suffix(
                                format!(
                                    "t{}.{}.{}>{}",
                                    self.ti,
                                    pname.get_ref(),
                                    self.net.ctx.nodes[x],
                                    self.dest_name(y)
                                ),
                                k,
                                self.count,
                            ),
                            kind: d.kind,
                            dif: self.dif,
                            shim,
                            class: pname.get_ref().clone(),
                            cube,
                            from: x,
                            to: y,
                            profile: Some(prof.clone()),
                            interval: Duration::ZERO,
                            size: 0,
                            sdu_sizes: Vec::new(),
                            per_size: Duration::ZERO,
                            start: self.start,
                            stop: self.stop,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Resolves an echo or perf entry: flows per endpoint pair and count.
    fn probe_flows(&self, ends: &Ends, flows: &mut Vec<Flow>) -> Result<(), LabError> {
        let (src, d) = (&self.net.ctx.src, self.d);
        let cube = self.cube_id(d.cube.as_ref())?;
        let class = d.class.clone().unwrap_or_else(|| match d.kind {
            TrafficKind::Echo => "echo".into(),
            _ => "perf".into(),
        });
        if d.kind == TrafficKind::Perf && d.sdu_sizes.is_empty() {
            return Err(src.err(self.t.span(), "perf traffic needs `sdu_sizes`"));
        }
        if d.sdu_sizes.iter().any(|&s| s == 0 || s > MAX_SDU) {
            return Err(src.err(
                self.t.span(),
                "`sdu_sizes` must be between 1 byte and 1 MiB",
            ));
        }
        if d.kind == TrafficKind::Echo && d.size.is_some_and(|s| s < rina_tools::echo::PROBE_HEADER)
        {
            return Err(src.err(
                self.t.span(),
                format!(
                    "echo `size` must be at least {} bytes (a probe's sequence number and time)",
                    rina_tools::echo::PROBE_HEADER
                ),
            ));
        }
        if d.kind == TrafficKind::Echo && d.size.is_some_and(|s| s > MAX_SDU) {
            return Err(src.err(
                self.t.span(),
                format!("echo `size` must be at most 1 MiB ({MAX_SDU} bytes)"),
            ));
        }
        let interval = d
            .interval
            .map(|x| x.get())
            .unwrap_or(Duration::from_millis(100));
        let whole_ms = !interval.is_zero() && interval.subsec_nanos() % 1_000_000 == 0;
        if d.kind == TrafficKind::Echo && !whole_ms {
            // rina-echo sends every `--interval-ms`: every backend runs the
            // interval written only if it is whole milliseconds.
            return Err(src.err(
                self.t.span(),
                format!(
                    "echo traffic `t{}.{class}`: `interval` {interval:?} is not a whole \
                     number of milliseconds from 1 ms up (rina-echo sends every \
                     `--interval-ms`; write e.g. \"1ms\", \"20ms\", \"1s\")",
                    self.ti
                ),
            ));
        }
        if interval.is_zero() {
            return Err(src.err(self.t.span(), "`interval` must be above zero"));
        }
        for &(a, b) in &ends.ends {
            for k in 0..self.count {
                flows.push(Flow {
                    id: suffix(
                        format!(
                            "t{}.{class}.{}>{}",
                            self.ti,
                            self.net.ctx.nodes[a],
                            self.dest_name(b)
                        ),
                        k,
                        self.count,
                    ),
                    kind: d.kind,
                    dif: self.dif,
                    shim: ends.shim_of(a, b),
                    class: class.clone(),
                    cube,
                    from: a,
                    to: b,
                    profile: None,
                    interval,
                    size: d.size.unwrap_or(64),
                    sdu_sizes: d.sdu_sizes.clone(),
                    per_size: d
                        .per_size
                        .map(|x| x.get())
                        .unwrap_or(Duration::from_secs(2)),
                    start: self.start,
                    stop: self.stop,
                });
            }
        }
        Ok(())
    }
}

impl Ends {
    /// The link shim of endpoint pair `(a, b)` (its first occurrence).
    fn shim_of(&self, a: usize, b: Dest) -> Option<usize> {
        self.ends
            .iter()
            .position(|e| *e == (a, b))
            .and_then(|i| self.shims[i])
    }
}

/// The position of the first item of `items` equal to one before it.
fn first_repeat<T: Ord>(items: impl Iterator<Item = T>) -> Option<usize> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, x) in items.enumerate() {
        if !seen.insert(x) {
            return Some(i);
        }
    }
    None
}

/// A flow id, with `.k` appended when the entry runs `count` > 1 flows.
fn suffix(id: String, k: usize, count: usize) -> String {
    if count == 1 {
        id
    } else {
        format!("{id}.{k}")
    }
}
