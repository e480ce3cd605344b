//! Links: the point-to-point shims, and a variant's link rates.

use super::nodes::Ctx;
use super::{Link, Source, DEFAULT_LINK_QUEUE, UNLIMITED_BPS};
use crate::model::{File, LinkDecl, VariantDecl};
use crate::LabError;
use toml::Spanned;

/// Resolves the links, then the variant's link rates.
pub(super) fn resolve_links(
    ctx: &Ctx,
    file: &File,
    var: Option<&VariantDecl>,
) -> Result<Vec<Link>, LabError> {
    let mut links: Vec<Link> = Vec::new();
    for l in &file.links {
        let link = resolve_link(ctx, l, &links)?;
        links.push(link);
    }
    if let Some(v) = var {
        variant_rates(&ctx.src, v, &mut links)?;
    }
    Ok(links)
}

/// Resolves one link (`links`: the links declared before it).
fn resolve_link(ctx: &Ctx, l: &Spanned<LinkDecl>, links: &[Link]) -> Result<Link, LabError> {
    let src = &ctx.src;
    let d = l.get_ref();
    let a = ctx.node(&d.between[0])?;
    let b = ctx.node(&d.between[1])?;
    if a == b {
        return Err(src.err(l.span(), "a link needs two different nodes"));
    }
    let name = d
        .name
        .clone()
        .unwrap_or_else(|| format!("{}--{}", ctx.nodes[a], ctx.nodes[b]));
    if links.iter().any(|x| x.name == name) {
        return Err(src.err(l.span(), format!("link `{name}` is declared twice")));
    }
    let loss = d.loss.unwrap_or(0.0);
    if !(0.0..1.0).contains(&loss) {
        return Err(src.err(
            l.span(),
            format!("link `{name}`: loss {loss} is not in [0, 1)"),
        ));
    }
    let rate_bps = d.rate.map(|r| r.bps()).unwrap_or(UNLIMITED_BPS);
    if rate_bps <= 0.0 {
        return Err(src.err(l.span(), format!("link `{name}`: rate must be above 0")));
    }
    let queue = d.queue.unwrap_or(DEFAULT_LINK_QUEUE);
    if queue == 0 {
        return Err(src.err(
            l.span(),
            format!("link `{name}`: queue must hold at least one frame"),
        ));
    }
    Ok(Link {
        name,
        a,
        b,
        rate_bps,
        delay: d.delay.map(|x| x.get()).unwrap_or_default(),
        loss,
        queue,
        groups: d.groups.clone(),
    })
}

/// Resolves a variant's link rates, replacing the declared ones.
fn variant_rates(src: &Source, v: &VariantDecl, links: &mut [Link]) -> Result<(), LabError> {
    for (sel, rate) in &v.rate {
        let hit = select_links(links, sel);
        if hit.is_empty() {
            return Err(src.err(
                v.name.span(),
                format!("variant: no link or link group `{sel}`"),
            ));
        }
        for i in hit {
            links[i].rate_bps = rate.bps();
        }
    }
    Ok(())
}

/// Links selected by name, or by `@group` / group name.
pub(super) fn select_links(links: &[Link], sel: &str) -> Vec<usize> {
    let g = sel.strip_prefix('@').unwrap_or(sel);
    links
        .iter()
        .enumerate()
        .filter(|(_, l)| l.name == sel || l.groups.iter().any(|x| x == g))
        .map(|(i, _)| i)
        .collect()
}
