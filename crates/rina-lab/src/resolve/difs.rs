//! Normal DIFs, lower DIFs first: members, what each runs over and its
//! adjacencies, bootstrap member and enrollment order, QoS cubes and
//! scheduling policy; a variant's cube mappings.

use super::nodes::Ctx;
use super::{Adjacency, Cube, Dif, Link, Lower, Over, Source};
use crate::model::{self, File};
use crate::LabError;
use rina_core::rmt::SchedulerConfig;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use toml::Spanned;

/// What each DIF is resolved against.
struct Scope<'a, 'b> {
    ctx: &'a Ctx<'b>,
    links: &'a [Link],
    var: Option<&'a model::VariantDecl>,
    /// Declaration index of each DIF name.
    names: BTreeMap<&'a str, usize>,
    /// Position in dependency order of each declaration index.
    pos_of: BTreeMap<usize, usize>,
}

/// The bootstrap member of a DIF and the order its members enroll in.
struct Enrollment {
    bootstrap: usize,
    order: Vec<usize>,
    via: BTreeMap<usize, usize>,
}

/// Resolves the DIFs in dependency order, then the variant's DIF settings.
pub(super) fn resolve_difs(
    ctx: &Ctx,
    file: &File,
    links: &[Link],
    var: Option<&model::VariantDecl>,
) -> Result<Vec<Dif>, LabError> {
    let src = &ctx.src;
    let decls: Vec<&Spanned<model::DifDecl>> = file.difs.iter().collect();
    let names = dif_names(src, &decls)?;
    let order = dependency_order(src, &decls, &names)?;
    let pos_of: BTreeMap<usize, usize> = order.iter().enumerate().map(|(p, &i)| (i, p)).collect();
    let scope = Scope {
        ctx,
        links,
        var,
        names,
        pos_of,
    };
    let mut difs: Vec<Dif> = Vec::new();
    for &i in &order {
        let dif = scope.dif(decls[i].get_ref(), &difs)?;
        difs.push(dif);
    }
    if let Some(v) = var {
        variant_difs(&mut difs, v, src)?;
    }
    Ok(difs)
}

/// Resolves the DIF names to declaration indices (unique, not `links`).
fn dif_names<'a>(
    src: &Source,
    decls: &[&'a Spanned<model::DifDecl>],
) -> Result<BTreeMap<&'a str, usize>, LabError> {
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, d) in decls.iter().enumerate() {
        let n = d.get_ref().name.get_ref().as_str();
        if n == "links" {
            return Err(src.err(
                d.get_ref().name.span(),
                "`links` is reserved for the link shims",
            ));
        }
        if names.insert(n, i).is_some() {
            return Err(src.err(
                d.get_ref().name.span(),
                format!("DIF `{n}` is declared twice"),
            ));
        }
    }
    Ok(names)
}

/// Resolves the dependency order: topological order over `over`.
fn dependency_order(
    src: &Source,
    decls: &[&Spanned<model::DifDecl>],
    names: &BTreeMap<&str, usize>,
) -> Result<Vec<usize>, LabError> {
    let mut order: Vec<usize> = Vec::new();
    let mut state = vec![0u8; decls.len()]; // 0 new, 1 visiting, 2 done
    for i in 0..decls.len() {
        visit(i, decls, names, &mut state, &mut order, src)?;
    }
    Ok(order)
}

/// Orders DIF `root` after the DIFs it is (indirectly) over, depth first
/// (post-order, each DIF's `over` in the order written). Iterative, with
/// an explicit stack: a chain of DIFs each over the next is as long as the
/// file makes it.
fn visit(
    root: usize,
    decls: &[&Spanned<model::DifDecl>],
    names: &BTreeMap<&str, usize>,
    state: &mut [u8],
    order: &mut Vec<usize>,
    src: &Source<'_>,
) -> Result<(), LabError> {
    if state[root] == 2 {
        return Ok(());
    }
    state[root] = 1;
    // Each DIF being visited, and the next of its `over` to look at.
    let mut stack: Vec<(usize, usize)> = vec![(root, 0)];
    while let Some((i, k)) = stack.last_mut() {
        let i = *i;
        let Some(o) = decls[i].get_ref().over.get(*k) else {
            state[i] = 2;
            order.push(i);
            stack.pop();
            continue;
        };
        *k += 1;
        let n = o.get_ref().as_str();
        if n == "links" {
            continue;
        }
        let j = *names.get(n).ok_or_else(|| {
            src.err(
                o.span(),
                format!("unknown lower DIF `{n}` (write \"links\" or a declared DIF)"),
            )
        })?;
        match state[j] {
            2 => {}
            1 => {
                let d = decls[j].get_ref();
                return Err(src.err(
                    d.name.span(),
                    format!("DIF `{}` is (indirectly) over itself", d.name.get_ref()),
                ));
            }
            _ => {
                state[j] = 1;
                stack.push((j, 0));
            }
        }
    }
    Ok(())
}

impl Scope<'_, '_> {
    /// Resolves one DIF (`difs`: the DIFs before it in dependency order).
    fn dif(&self, d: &model::DifDecl, difs: &[Dif]) -> Result<Dif, LabError> {
        let src = &self.ctx.src;
        let name = d.name.get_ref().clone();
        let members = self.ctx.node_set(&d.members)?;
        if members.len() < 2 {
            return Err(src.err(
                d.name.span(),
                format!("DIF `{name}` needs at least two members"),
            ));
        }
        let (over, adjacencies) = self.lowers(d, &members, difs)?;
        if let Some(p) = &d.adjacency {
            if p.is_empty() {
                return Err(src.err(d.name.span(), "`adjacency` is empty"));
            }
        }
        check_max_pdu(src, d)?;
        let enrollment = self.enrollment(d, &members, &adjacencies)?;
        let cubes = self.cubes(d, &over, difs)?;
        let scheduler = self.scheduler(d, &cubes)?;
        Ok(Dif {
            name,
            members,
            over,
            adjacencies,
            scheduler,
            cubes,
            password: d.password.clone(),
            max_pdu: d.max_pdu,
            bootstrap: enrollment.bootstrap,
            enrollment_order: enrollment.order,
            enrolls_via: enrollment.via,
        })
    }

    /// Resolves what a DIF runs over, and its adjacencies over each lower.
    fn lowers(
        &self,
        d: &model::DifDecl,
        members: &[usize],
        difs: &[Dif],
    ) -> Result<(Vec<Lower>, Vec<Adjacency>), LabError> {
        let mut over = Vec::new();
        let mut adjacencies = Adjacencies::default();
        let is_member = self.membership(members);
        for o in &d.over {
            if o.get_ref() == "links" {
                self.link_adjacencies(&is_member, &mut adjacencies);
                // Several links between one pair: the first carries the DIF.
                over.push(Lower::Links);
            } else {
                let lower = self.pos_of[&self.names[o.get_ref().as_str()]];
                over.push(Lower::Dif(lower));
                let in_lower = self.membership(&difs[lower].members);
                let m = (members, &is_member[..], &in_lower[..]);
                self.dif_adjacencies(d, m, lower, &mut adjacencies)?;
            }
        }
        self.check_adjacency(d, &is_member, &over, difs)?;
        Ok((over, adjacencies.list))
    }

    /// Whether each node (by index) is in `members`.
    fn membership(&self, members: &[usize]) -> Vec<bool> {
        let mut is = vec![false; self.ctx.nodes.len()];
        for &m in members {
            is[m] = true;
        }
        is
    }

    /// Checks that every pair written in `adjacency` names two members
    /// that a lower DIF of this one has both (over links the links are
    /// the adjacencies): a pair no lower DIF joins would be left out.
    fn check_adjacency(
        &self,
        d: &model::DifDecl,
        is_member: &[bool],
        over: &[Lower],
        difs: &[Dif],
    ) -> Result<(), LabError> {
        let name = d.name.get_ref();
        let lowers: Vec<(usize, Vec<bool>)> = over
            .iter()
            .filter_map(|l| match l {
                Lower::Dif(x) => Some((*x, self.membership(&difs[*x].members))),
                Lower::Links => None,
            })
            .collect();
        for p in d.adjacency.iter().flatten() {
            let (a, b) = (self.ctx.node(&p[0])?, self.ctx.node(&p[1])?);
            for (s, n) in [(&p[0], a), (&p[1], b)] {
                if !is_member[n] {
                    return Err(self.ctx.src.err(
                        s.span(),
                        format!("`{}` is not a member of DIF `{name}`", s.get_ref()),
                    ));
                }
            }
            let joined = lowers.iter().any(|(_, m)| m[a] && m[b]);
            if !joined {
                return Err(self.ctx.src.err(
                    p[0].span(),
                    format!(
                        "adjacency `{}`-`{}`: no DIF that `{name}` runs over has both \
                         (`adjacency` pairs are over lower DIFs; over links, the links are the adjacencies)",
                        p[0].get_ref(),
                        p[1].get_ref()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Resolves the adjacencies over links: members that share a link.
    fn link_adjacencies(&self, is_member: &[bool], adjacencies: &mut Adjacencies) {
        for (li, l) in self.links.iter().enumerate() {
            if is_member[l.a] && is_member[l.b] {
                adjacencies.add(l.a, l.b, Over::Link(li));
            }
        }
    }

    /// Resolves the adjacencies over lower DIF `lower`: the pairs written
    /// in `adjacency`, or else every pair of members. `m`: this DIF's
    /// members, and whether each node is a member of it and of the lower.
    fn dif_adjacencies(
        &self,
        d: &model::DifDecl,
        m: (&[usize], &[bool], &[bool]),
        lower: usize,
        adjacencies: &mut Adjacencies,
    ) -> Result<(), LabError> {
        let (members, is_member, in_lower) = m;
        let name = d.name.get_ref();
        match &d.adjacency {
            Some(pairs) => {
                for p in pairs {
                    let a = self.ctx.node(&p[0])?;
                    let b = self.ctx.node(&p[1])?;
                    for (s, n) in [(&p[0], a), (&p[1], b)] {
                        if !is_member[n] {
                            return Err(self.ctx.src.err(
                                s.span(),
                                format!("`{}` is not a member of DIF `{name}`", s.get_ref()),
                            ));
                        }
                    }
                    if in_lower[a] && in_lower[b] {
                        adjacencies.add(a, b, Over::Dif(lower));
                    }
                }
            }
            None => {
                for (x, &a) in members.iter().enumerate() {
                    if !in_lower[a] {
                        continue;
                    }
                    for &b in &members[x + 1..] {
                        if in_lower[b] {
                            adjacencies.add(a, b, Over::Dif(lower));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Derives the bootstrap member and the enrollment order, breadth first
    /// over the adjacencies; every member must be reached.
    fn enrollment(
        &self,
        d: &model::DifDecl,
        members: &[usize],
        adjacencies: &[Adjacency],
    ) -> Result<Enrollment, LabError> {
        // Each node's neighbours, in the order of `members`.
        let mut position = vec![usize::MAX; self.ctx.nodes.len()];
        for (i, &m) in members.iter().enumerate() {
            position[m] = i;
        }
        let mut neighbours: Vec<Vec<usize>> = vec![Vec::new(); self.ctx.nodes.len()];
        for x in adjacencies {
            neighbours[x.a].push(x.b);
            neighbours[x.b].push(x.a);
        }
        for n in &mut neighbours {
            n.sort_by_key(|&m| position[m]);
        }
        let degree = |n: usize| neighbours[n].len();
        let bootstrap = *members
            .iter()
            .max_by(|&&x, &&y| degree(x).cmp(&degree(y)).then(y.cmp(&x)))
            .expect("two members");
        let mut enrollment_order = vec![bootstrap];
        let mut enrolls_via = BTreeMap::new();
        let mut queue = VecDeque::from([bootstrap]);
        let mut seen = BTreeSet::from([bootstrap]);
        while let Some(n) = queue.pop_front() {
            for &m in &neighbours[n] {
                if seen.insert(m) {
                    enrolls_via.insert(m, n);
                    enrollment_order.push(m);
                    queue.push_back(m);
                }
            }
        }
        if enrollment_order.len() != members.len() {
            let nodes = &self.ctx.nodes;
            let cut: Vec<&str> = members
                .iter()
                .filter(|m| !seen.contains(m))
                .map(|&m| nodes[m].as_str())
                .collect();
            return Err(self.ctx.src.err(
                d.name.span(),
                format!(
                    "DIF `{}`: members {} cannot reach `{}`: no link or lower-DIF adjacency joins them",
                    d.name.get_ref(),
                    cut.join(", "),
                    nodes[bootstrap]
                ),
            ));
        }
        Ok(Enrollment {
            bootstrap,
            order: enrollment_order,
            via: enrolls_via,
        })
    }

    /// Resolves a DIF's QoS cubes (two default ones if it declares none).
    fn cubes(
        &self,
        d: &model::DifDecl,
        over: &[Lower],
        difs: &[Dif],
    ) -> Result<Vec<Cube>, LabError> {
        let name = d.name.get_ref();
        let mut cubes: Vec<Cube> = Vec::new();
        let decl_cubes: Vec<model::CubeDecl> = if d.cubes.is_empty() {
            default_cubes()
        } else {
            d.cubes.iter().map(|c| c.get_ref().clone()).collect()
        };
        for (k, c) in decl_cubes.iter().enumerate() {
            let cname = c.name.get_ref().clone();
            let id = c.id.unwrap_or(k as u64 + 1);
            if cubes.iter().any(|x| x.name == cname || x.id == id) {
                return Err(self.ctx.src.err(
                    c.name.span(),
                    format!("DIF `{name}`: cube `{cname}` (id {id}) repeats a name or id"),
                ));
            }
            let maps_to = self.maps_to(d, c, over, difs)?;
            let keepalive = c.keepalive.as_ref().map(|k| k.get_ref().get());
            if let (Some(k), Some(s)) = (keepalive, &c.keepalive) {
                rina_core::normal::keepalive::check_interval(k).map_err(|m| {
                    self.ctx.src.err(
                        s.span(),
                        format!("DIF `{name}`: cube `{cname}`: `keepalive`: {m}"),
                    )
                })?;
            }
            let mut efcp = if c.reliable {
                rina_core::efcp::EfcpConfig::reliable()
            } else {
                rina_core::efcp::EfcpConfig::unreliable()
            };
            let unused = c.efcp.inapplicable(&efcp);
            let checked = if unused.is_empty() {
                c.efcp.apply(&mut efcp).map_err(|e| e.to_string())
            } else {
                Err(format!("{} would tune nothing here", unused.join(", ")))
            };
            if let Err(m) = checked {
                return Err(self.ctx.src.err(
                    c.name.span(),
                    format!("DIF `{name}`: cube `{cname}`: `efcp`: {m}"),
                ));
            }
            self.check_bounds(name, c)?;
            cubes.push(Cube {
                name: cname,
                id,
                urgency: c.urgency,
                cherish: c.cherish,
                reliable: c.reliable,
                maps_to,
                bandwidth_bps: c.bandwidth.map(|r| r.bps()),
                delay: c.delay.map(|x| x.get()),
                keepalive,
                loss: c.loss,
                efcp: c.efcp.clone(),
            });
        }
        Ok(cubes)
    }

    /// Checks a cube's declared `loss` (a probability: finite, in [0, 1])
    /// and `bandwidth` (1 kbit/s to 1000 Gbit/s, as a link's rate). Unchecked, -0.5 and NaN became a bound of no loss at
    /// all, which meets any flow's, 7.0 a loss of 7 000 000 ppm and
    /// 1e300G the largest bandwidth there is.
    fn check_bounds(&self, dif: &str, c: &model::CubeDecl) -> Result<(), LabError> {
        let cname = c.name.get_ref();
        let err = |m: String| {
            self.ctx
                .src
                .err(c.name.span(), format!("DIF `{dif}`: cube `{cname}`: {m}"))
        };
        if let Some(l) = c.loss.filter(|l| !(0.0..=1.0).contains(l)) {
            return Err(err(format!("`loss` {l} is not a probability in [0, 1]")));
        }
        if let Some(b) = c.bandwidth {
            super::links::check_rate(b, "bandwidth").map_err(err)?;
        }
        Ok(())
    }

    /// Resolves the cube of each lower DIF that cube `c` rides on: the one
    /// it names, else the lower's cube of the same name, else its first.
    fn maps_to(
        &self,
        d: &model::DifDecl,
        c: &model::CubeDecl,
        over: &[Lower],
        difs: &[Dif],
    ) -> Result<BTreeMap<usize, u64>, LabError> {
        let src = &self.ctx.src;
        let name = d.name.get_ref();
        let cname = c.name.get_ref();
        let mut maps_to = BTreeMap::new();
        for (lname, cube) in &c.maps_to {
            let lower = match self.names.get(lname.as_str()) {
                Some(&j) if d.over.iter().any(|o| o.get_ref() == lname) => self.pos_of[&j],
                _ => {
                    return Err(src.err(
                        cube.span(),
                        format!("cube `{cname}`: `{lname}` is not a DIF that `{name}` runs over"),
                    ))
                }
            };
            let lc = difs[lower]
                .cubes
                .iter()
                .find(|x| &x.name == cube.get_ref())
                .ok_or_else(|| {
                    src.err(
                        cube.span(),
                        format!(
                            "cube `{cname}` maps to `{}`, which DIF `{lname}` does not have (it has {})",
                            cube.get_ref(),
                            cube_names(&difs[lower])
                        ),
                    )
                })?;
            maps_to.insert(lower, lc.id);
        }
        for o in over {
            if let Lower::Dif(lower) = *o {
                maps_to.entry(lower).or_insert_with(|| {
                    let l = &difs[lower];
                    l.cubes
                        .iter()
                        .find(|x| &x.name == cname)
                        .unwrap_or(&l.cubes[0])
                        .id
                });
            }
        }
        Ok(maps_to)
    }

    /// Resolves a DIF's scheduling policy (the variant's, else its own),
    /// which must build with the DIF's cubes.
    fn scheduler(&self, d: &model::DifDecl, cubes: &[Cube]) -> Result<SchedulerConfig, LabError> {
        let name = d.name.get_ref();
        let scheduler = self
            .var
            .and_then(|v| v.scheduler.get(name).cloned())
            .or_else(|| d.scheduler.clone())
            .unwrap_or_default();
        // The policy must build with this DIF's C/U map.
        let mut cu = rina_core::rmt::CuMap::new();
        for c in cubes {
            cu = cu.with(c.id, c.urgency, c.cherish);
        }
        if let Err(e) = scheduler.build(&cu) {
            return Err(self
                .ctx
                .src
                .err(d.name.span(), format!("DIF `{name}`: {e}")));
        }
        Ok(scheduler)
    }
}

/// Checks that a DIF's `max_pdu`, if given, is a size its members accept
/// (above the largest PCI, within the length field), as `rinad` and the
/// simulator would only find out when they start the IPCP.
fn check_max_pdu(src: &Source, d: &model::DifDecl) -> Result<(), LabError> {
    let Some(m) = d.max_pdu else {
        return Ok(());
    };
    let name = d.name.get_ref();
    let mut dt = rina_core::normal::NormalConfig::standard(name.clone(), 0).dt;
    dt.max_pdu_size = m;
    dt.validate()
        .map_err(|e| src.err(d.name.span(), format!("DIF `{name}`: `max_pdu`: {e}")))
}

/// A DIF's adjacencies as they are found, in that order, with the set of
/// pairs already joined: whether a pair is already adjacent is a look-up,
/// not a scan of the list (which made a DIF over another with every pair
/// of N members adjacent take time in N⁴).
#[derive(Debug, Default)]
struct Adjacencies {
    /// The adjacencies, in the order found.
    list: Vec<Adjacency>,
    /// Each adjacent pair, smaller node index first.
    pairs: BTreeSet<(usize, usize)>,
}

impl Adjacencies {
    /// Adds `a`-`b` over `over` unless the two (either way round) are
    /// already adjacent (the first lower that joins them carries the
    /// adjacency); whether it was added.
    fn add(&mut self, a: usize, b: usize, over: Over) -> bool {
        if !self.pairs.insert((a.min(b), a.max(b))) {
            return false;
        }
        self.list.push(Adjacency { a, b, over });
        true
    }
}

/// Resolves a variant's cube mappings and the DIFs its schedulers name.
fn variant_difs(difs: &mut [Dif], v: &model::VariantDecl, src: &Source) -> Result<(), LabError> {
    map_all_cubes(difs, v, src)?;
    for dname in v.scheduler.keys() {
        if !difs.iter().any(|d| &d.name == dname) {
            return Err(src.err(
                v.name.span(),
                format!("variant `{}`: no DIF `{dname}`", v.name.get_ref()),
            ));
        }
    }
    Ok(())
}

/// A variant's `maps_to`: every cube of the named DIF rides on the one
/// named cube of each named lower DIF.
fn map_all_cubes(difs: &mut [Dif], v: &model::VariantDecl, src: &Source) -> Result<(), LabError> {
    let vname = v.name.get_ref();
    for (dname, lowers) in &v.maps_to {
        let err = |what: String| src.err(v.name.span(), format!("variant `{vname}`: {what}"));
        let d = difs
            .iter()
            .position(|d| &d.name == dname)
            .ok_or_else(|| err(format!("no DIF `{dname}`")))?;
        for (lname, cube) in lowers {
            let l = difs
                .iter()
                .position(|x| &x.name == lname)
                .filter(|&l| difs[d].over.contains(&Lower::Dif(l)))
                .ok_or_else(|| err(format!("`{lname}` is not a DIF that `{dname}` runs over")))?;
            let id = difs[l]
                .cubes
                .iter()
                .find(|c| &c.name == cube)
                .map(|c| c.id)
                .ok_or_else(|| err(format!("DIF `{lname}` has no cube `{cube}`")))?;
            for c in &mut difs[d].cubes {
                c.maps_to.insert(l, id);
            }
        }
    }
    Ok(())
}

/// Resolves a DIF name to its index.
pub(super) fn dif_of(src: &Source, difs: &[Dif], s: &Spanned<String>) -> Result<usize, LabError> {
    difs.iter()
        .position(|d| &d.name == s.get_ref())
        .ok_or_else(|| {
            src.err(
                s.span(),
                format!(
                    "unknown DIF `{}` (declared: {})",
                    s.get_ref(),
                    difs.iter()
                        .map(|d| d.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })
}

/// The names of a DIF's cubes, for error messages.
pub(super) fn cube_names(d: &Dif) -> String {
    d.cubes
        .iter()
        .map(|c| format!("`{}`", c.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The cubes of a DIF that declares none.
fn default_cubes() -> Vec<model::CubeDecl> {
    let c = |name: &str, reliable: bool| model::CubeDecl {
        name: Spanned::new(0..0, name.to_string()),
        id: None,
        urgency: 0,
        cherish: 0,
        reliable,
        maps_to: BTreeMap::new(),
        bandwidth: None,
        delay: None,
        loss: None,
        keepalive: None,
        efcp: Default::default(),
    };
    vec![c("best-effort", false), c("reliable", true)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_is_adjacent_once_either_way_round_over_the_first_lower() {
        let mut adj = Adjacencies::default();
        assert!(adj.add(3, 1, Over::Link(0)));
        assert!(adj.add(1, 2, Over::Dif(0)));
        // The same pair either way round, over a later lower: not added.
        assert!(!adj.add(1, 3, Over::Dif(0)));
        assert!(!adj.add(3, 1, Over::Dif(1)));
        assert!(!adj.add(2, 1, Over::Link(4)));
        assert!(adj.add(2, 3, Over::Dif(1)));
        let got: Vec<(usize, usize, Over)> = adj.list.iter().map(|x| (x.a, x.b, x.over)).collect();
        assert_eq!(
            got,
            [
                (3, 1, Over::Link(0)),
                (1, 2, Over::Dif(0)),
                (2, 3, Over::Dif(1))
            ]
        );
        assert_eq!(adj.pairs, BTreeSet::from([(1, 3), (1, 2), (2, 3)]));
    }
}
