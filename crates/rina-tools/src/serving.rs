//! How the servers of `rina-echo` and `rina-perf` register and take their
//! flows: requests they accept themselves, or flows the daemon accepted
//! for them (`--daemon-accepts`, [`rina::Client::register_accepting`]).

use crate::opts;
use rina::{AppName, Client, ErrorKind, Flow};

/// Registers `name` (in `dif`, or every DIF) for `tool`'s server, with the
/// daemon accepting its flows if `daemon_accepts`, and says so on stdout;
/// exits with status 2 if it cannot.
pub fn register(
    tool: &str,
    c: &mut Client,
    name: &AppName,
    dif: Option<&str>,
    daemon_accepts: bool,
) {
    let registered = if daemon_accepts {
        c.register_accepting(name, dif)
    } else {
        c.register(name, dif)
    };
    let difs =
        registered.unwrap_or_else(|e| opts::die(tool, &format!("cannot register {name}"), &e, 2));
    let by = if daemon_accepts {
        " (the daemon accepts its flows)"
    } else {
        ""
    };
    println!("registered {name} in {}{by}", difs.join(", "));
}

/// The next flow for `tool`'s server: one the daemon accepted, or a
/// request accepted here (said on stdout). `None` when that flow is lost
/// and the server should go on; exits with status 2 when the daemon is
/// gone or the name was withdrawn.
pub fn next_flow(tool: &str, c: &mut Client, daemon_accepts: bool) -> Option<Flow> {
    if daemon_accepts {
        return match c.next_flow() {
            Ok(f) => Some(f),
            // This process is out of descriptors: other flows may come
            // once some close.
            Err(e) if e.kind() == ErrorKind::NoResources => {
                eprintln!("{tool}: cannot take a flow the daemon accepted: {e}");
                None
            }
            Err(e) => opts::die(tool, "lost the daemon", &e, 2),
        };
    }
    let req = c
        .next_request()
        .unwrap_or_else(|e| opts::die(tool, "lost the daemon", &e, 2));
    println!(
        "flow request from {} to {} in {} (handle {})",
        req.remote, req.local, req.dif, req.handle
    );
    match c.accept(&req) {
        Ok(f) => Some(f),
        Err(e) if e.is_closed() => opts::die(tool, "lost the daemon", &e, 2),
        Err(e) => {
            eprintln!("{tool}: cannot accept flow from {}: {e}", req.remote);
            None
        }
    }
}
