//! Applications: each registered at a node, in a DIF.

use super::difs::dif_of;
use super::nodes::Ctx;
use super::{App, Dif};
use crate::model::File;
use crate::LabError;

/// Resolves the application registrations.
pub(super) fn resolve_apps(ctx: &Ctx, file: &File, difs: &[Dif]) -> Result<Vec<App>, LabError> {
    let src = &ctx.src;
    let mut apps: Vec<App> = Vec::new();
    for a in &file.apps {
        let d = a.get_ref();
        let node = ctx.node(&d.node)?;
        let dif = dif_of(src, difs, &d.dif)?;
        if !difs[dif].has_member(node) {
            return Err(src.err(
                d.node.span(),
                format!(
                    "`{}` is not a member of DIF `{}`",
                    ctx.nodes[node], difs[dif].name
                ),
            ));
        }
        if apps.iter().any(|x| &x.name == d.name.get_ref()) {
            return Err(src.err(
                d.name.span(),
                format!("application `{}` is declared twice", d.name.get_ref()),
            ));
        }
        apps.push(App {
            name: d.name.get_ref().clone(),
            node,
            dif,
            role: d.role,
        });
    }
    Ok(apps)
}
