//! Timed events: links down and up, nodes stopping and starting,
//! applications moving.

use super::{Event, EventKind, Net, Source};
use crate::model::{EventAction, EventDecl, File};
use crate::LabError;
use std::time::Duration;
use toml::Spanned;

/// Resolves the timed events, in time order.
pub(super) fn resolve_events(
    net: &Net,
    file: &File,
    duration: Duration,
) -> Result<Vec<Event>, LabError> {
    let mut events: Vec<Event> = Vec::new();
    for e in &file.events {
        let d = e.get_ref();
        let what = event_kind(net, e)?;
        if d.at.get() > duration {
            return Err(net
                .ctx
                .src
                .err(e.span(), "event after the end of the experiment"));
        }
        events.push(Event {
            at: d.at.get(),
            what,
        });
    }
    events.sort_by_key(|e| e.at);
    Ok(events)
}

/// Resolves what one event does.
fn event_kind(net: &Net, e: &Spanned<EventDecl>) -> Result<EventKind, LabError> {
    let (ctx, src) = (net.ctx, &net.ctx.src);
    let d = e.get_ref();
    let link = |s: &Spanned<String>| {
        net.links
            .iter()
            .position(|l| &l.name == s.get_ref())
            .ok_or_else(|| src.err(s.span(), format!("unknown link `{}`", s.get_ref())))
    };
    let uses: &[&str] = match d.action {
        EventAction::LinkDown | EventAction::LinkUp => &["link"],
        EventAction::NodeStop | EventAction::NodeStart => &["node"],
        EventAction::AppMove => &["app", "to"],
    };
    let fields = [
        ("link", &d.link),
        ("node", &d.node),
        ("app", &d.app),
        ("to", &d.to),
    ];
    for (key, v) in fields {
        if let (Some(v), false) = (v, uses.contains(&key)) {
            return Err(src.err(
                v.span(),
                format!(
                    "`{key}` does not belong to this event (it takes `{}`)",
                    uses.join("`, `")
                ),
            ));
        }
    }
    Ok(match d.action {
        EventAction::LinkDown => EventKind::LinkDown(link(&need(src, e, &d.link, "link")?)?),
        EventAction::LinkUp => EventKind::LinkUp(link(&need(src, e, &d.link, "link")?)?),
        EventAction::NodeStop => EventKind::NodeStop(ctx.node(&need(src, e, &d.node, "node")?)?),
        EventAction::NodeStart => EventKind::NodeStart(ctx.node(&need(src, e, &d.node, "node")?)?),
        EventAction::AppMove => app_move(net, e)?,
    })
}

/// Resolves an application move: the application and the node it moves to.
fn app_move(net: &Net, e: &Spanned<EventDecl>) -> Result<EventKind, LabError> {
    let (ctx, src, apps, difs) = (net.ctx, &net.ctx.src, net.apps, net.difs);
    let d = e.get_ref();
    let a = need(src, e, &d.app, "app")?;
    let ai = apps
        .iter()
        .position(|x| &x.name == a.get_ref())
        .ok_or_else(|| src.err(a.span(), format!("unknown application `{}`", a.get_ref())))?;
    let to = need(src, e, &d.to, "to")?;
    let tn = ctx.node(&to)?;
    if !difs[apps[ai].dif].has_member(tn) {
        return Err(src.err(
            to.span(),
            format!(
                "`{}` is not a member of DIF `{}`",
                to.get_ref(),
                difs[apps[ai].dif].name
            ),
        ));
    }
    Ok(EventKind::AppMove { app: ai, to: tn })
}

/// Resolves a field (`what`) that event `e` needs for its action.
fn need(
    src: &Source,
    e: &Spanned<EventDecl>,
    o: &Option<Spanned<String>>,
    what: &str,
) -> Result<Spanned<String>, LabError> {
    o.clone()
        .ok_or_else(|| src.err(e.span(), format!("this event needs `{what}`")))
}
