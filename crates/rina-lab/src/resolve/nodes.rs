//! Nodes and groups: the names the rest of the file refers to.

use super::Source;
use crate::model::File;
use crate::LabError;
use std::collections::BTreeMap;
use toml::Spanned;

/// The nodes and groups resolved so far, and where errors point.
pub(super) struct Ctx<'a> {
    pub(super) src: Source<'a>,
    pub(super) nodes: Vec<String>,
    pub(super) groups: BTreeMap<String, Vec<usize>>,
}

impl Ctx<'_> {
    pub(super) fn node(&self, s: &Spanned<String>) -> Result<usize, LabError> {
        self.nodes
            .iter()
            .position(|n| n == s.get_ref())
            .ok_or_else(|| {
                self.src.err(
                    s.span(),
                    format!("unknown node `{}` (not in `nodes`)", s.get_ref()),
                )
            })
    }

    /// Expands node names, `@group` and `*`.
    pub(super) fn node_set(&self, list: &[Spanned<String>]) -> Result<Vec<usize>, LabError> {
        let mut out = Vec::new();
        for s in list {
            let name = s.get_ref();
            let add: Vec<usize> = if name == "*" {
                (0..self.nodes.len()).collect()
            } else if let Some(g) = name.strip_prefix('@') {
                self.groups.get(g).cloned().ok_or_else(|| {
                    self.src
                        .err(s.span(), format!("unknown group `{g}` (not in `[groups]`)"))
                })?
            } else {
                vec![self.node(s)?]
            };
            for n in add {
                if !out.contains(&n) {
                    out.push(n);
                }
            }
        }
        Ok(out)
    }
}

/// Resolves the node names and the groups.
pub(super) fn resolve_nodes<'a>(src: Source<'a>, file: &File) -> Result<Ctx<'a>, LabError> {
    if let Some(n) = &file.experiment.nodes {
        return Err(src.err(
            n.span(),
            "`nodes` is inside [experiment]: write it at the top of the file, before any [table]",
        ));
    }
    let mut nodes: Vec<String> = Vec::new();
    for n in &file.nodes {
        let name = n.get_ref();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        {
            return Err(src.err(
                n.span(),
                format!("node name `{name}`: use letters, digits, `-`, `_` and `.` only"),
            ));
        }
        if nodes.contains(name) {
            return Err(src.err(n.span(), format!("node `{name}` is declared twice")));
        }
        nodes.push(name.clone());
    }
    if nodes.is_empty() {
        return Err(LabError::At {
            line: 1,
            col: 1,
            msg: "`nodes` is empty".into(),
        });
    }
    let mut ctx = Ctx {
        src,
        nodes,
        groups: BTreeMap::new(),
    };
    for (g, members) in &file.groups {
        let set = ctx.node_set(members)?;
        ctx.groups.insert(g.clone(), set);
    }
    Ok(ctx)
}
