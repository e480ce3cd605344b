//! Load calibration: the target load and the links it is calibrated on.

use super::links::select_links;
use super::{Flow, Link, Load, Source};
use crate::model::{File, VariantDecl};
use crate::LabError;
use std::time::Duration;

/// Resolves the load calibration (the variant's target, else `[load]`'s).
pub(super) fn resolve_load(
    src: &Source,
    file: &File,
    var: Option<&VariantDecl>,
    links: &[Link],
    flows: &[Flow],
    duration: Duration,
) -> Result<Option<Load>, LabError> {
    let Some(l) = &file.load else {
        return Ok(None);
    };
    let d = l.get_ref();
    let target = var.and_then(|v| v.load).unwrap_or(d.target);
    if !(target > 0.0 && target < 1.0) {
        return Err(src.err(
            l.span(),
            format!("load target {target} is not between 0 and 1"),
        ));
    }
    let mut sel = Vec::new();
    for s in &d.links {
        let hit = select_links(links, s.get_ref());
        if hit.is_empty() {
            return Err(src.err(s.span(), format!("no link or link group `{}`", s.get_ref())));
        }
        sel.extend(hit);
    }
    sel.sort_unstable();
    sel.dedup();
    for w in &d.without {
        let known = file
            .profiles
            .iter()
            .any(|p| p.get_ref().name.get_ref() == w.get_ref())
            || flows.iter().any(|f| &f.class == w.get_ref());
        if !known {
            return Err(src.err(w.span(), format!("no traffic class `{}`", w.get_ref())));
        }
    }
    Ok(Some(Load {
        target,
        links: sel,
        duration: d.duration.map(|x| x.get()).unwrap_or(duration),
        without: d.without.iter().map(|w| w.get_ref().clone()).collect(),
    }))
}
