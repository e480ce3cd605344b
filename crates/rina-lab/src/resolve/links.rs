//! Links: the point-to-point shims, and a variant's link rates.

use super::nodes::Ctx;
use super::{Link, Source, DEFAULT_LINK_QUEUE, UNLIMITED_BPS};
use crate::model::{File, LinkDecl, VariantDecl};
use crate::units::Rate;
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
    if let Some(r) = d.rate {
        check_rate(r, "rate").map_err(|e| src.err(l.span(), format!("link `{name}`: {e}")))?;
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
        check_rate(*rate, "rate").map_err(|e| {
            src.err(
                v.name.span(),
                format!("variant `{}`: link `{sel}`: {e}", v.name.get_ref()),
            )
        })?;
        for i in hit {
            links[i].rate_bps = rate.bps();
        }
    }
    Ok(())
}

/// The range of link rates, bit/s: what `rinad` takes for a shim's `rate`.
pub const RATE_RANGE: std::ops::RangeInclusive<f64> = 1e3..=1e12;

/// Checks a rate (a link's, a variant's, a cube's `bandwidth`: `key`)
/// against [`RATE_RANGE`] (a rate of 0, or of a fraction of a bit a
/// second, would never send a frame).
pub(super) fn check_rate(r: Rate, key: &str) -> Result<(), String> {
    let b = r.bps();
    if RATE_RANGE.contains(&b) {
        return Ok(());
    }
    // 1e-300 bit/s written out in full would be 300 zeros.
    let shown = if b == 0.0 || (1.0..1e15).contains(&b) {
        r.to_string()
    } else if b.is_infinite() {
        // "1e300G": a number, times 1e9 past f64's range.
        "a rate past any number (inf)".to_string()
    } else {
        format!("{b:e}bps")
    };
    Err(format!(
        "`{key}` must be between 1kbps and 1000Gbps, not {shown}"
    ))
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
