//! The running gateway: a thread per mapping (a TCP listener, or a
//! registration taking flow requests), a thread pair per session, and a
//! limit on sessions at once. What happens is said on standard error, a
//! line per session; the mappings that are ready, on standard output.

use super::mapping::{RinaToTcp, TcpToRina};
use super::session::{self, Carried};
use rina::{AppName, Client, Flow, IncomingFlow, QosSpec};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// What every mapping of one gateway shares.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The daemon's socket (`None`: the default).
    pub socket: Option<PathBuf>,
    /// The DIF to register in and allocate through (`None`: the daemon's
    /// choice).
    pub dif: Option<String>,
    /// This gateway's name, the source of the flows it allocates.
    pub name: AppName,
    /// What the flows it allocates ask for.
    pub qos: QosSpec,
    /// Ask for shared-memory rings where the DIF offers them.
    pub rings: bool,
    /// Most sessions at once, over all mappings.
    pub max_sessions: usize,
    /// How long a TCP connection for a flow request may take.
    pub connect_timeout: Duration,
}

/// The gateway's sessions: how many are up, and a number for each.
#[derive(Debug, Default)]
pub struct Sessions {
    up: AtomicUsize,
    next: AtomicU64,
}

impl Sessions {
    /// Takes a place if fewer than `most` are up: the session's number.
    fn open(&self, most: usize) -> Option<u64> {
        self.up
            .fetch_update(Relaxed, Relaxed, |n| (n < most).then_some(n + 1))
            .ok()?;
        Some(self.next.fetch_add(1, Relaxed) + 1)
    }

    fn close(&self) {
        self.up.fetch_sub(1, Relaxed);
    }

    /// Sessions up now.
    pub fn up(&self) -> usize {
        self.up.load(Relaxed)
    }
}

fn connect(s: &Settings) -> rina::Result<Client> {
    let mut c = crate::opts::connect(s.socket.as_deref())?;
    c.set_rings(s.rings);
    Ok(c)
}

/// Carries session `id` (described by `what`) on a thread of its own,
/// and gives its place back when it ends.
fn spawn_session(sessions: &Arc<Sessions>, id: u64, what: String, tcp: TcpStream, flow: Flow) {
    let mine = Arc::clone(sessions);
    let run = move || {
        eprintln!(
            "rina-gw: session {id} up: {what} (flow {})",
            flow.info().port
        );
        match session::carry(tcp, flow) {
            Ok(Carried {
                to_rina,
                from_rina,
                error,
            }) => {
                let why = error.map_or(String::new(), |e| format!(" ({e})"));
                eprintln!("rina-gw: session {id} closed: {to_rina} B to RINA, {from_rina} B from RINA{why}");
            }
            Err(e) => eprintln!("rina-gw: session {id} failed: {e}"),
        }
        mine.close();
    };
    let started = std::thread::Builder::new()
        .name(format!("rina-gw-{id}"))
        .spawn(run);
    if let Err(e) = started {
        // The closure (with the connection and the flow) is gone with it.
        eprintln!("rina-gw: session {id}: cannot start a thread: {e}");
        sessions.close();
    }
}

/// Listens on `m.listen` (already bound as `listener`) for ever: each
/// connection gets a flow to `m.app`, allocated on a thread of its own so
/// that a slow allocation holds up no other connection; a connection
/// beyond the limit, or whose allocation fails, is closed.
pub fn tcp_to_rina(s: Arc<Settings>, sessions: Arc<Sessions>, m: TcpToRina, listener: TcpListener) {
    for tcp in listener.incoming() {
        let tcp = match tcp {
            Ok(t) => t,
            Err(e) => {
                // Out of descriptors, say: the next may work.
                eprintln!("rina-gw: accepting on {}: {e}", m.listen);
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let from = tcp
            .peer_addr()
            .map_or_else(|_| "?".into(), |a| a.to_string());
        let Some(id) = sessions.open(s.max_sessions) else {
            eprintln!(
                "rina-gw: {from} -> {}: closed, {} sessions are up (--max-sessions)",
                m.app, s.max_sessions
            );
            continue;
        };
        let (s2, sessions2, app) = (Arc::clone(&s), Arc::clone(&sessions), m.app.clone());
        let allocate = move || match connect(&s2)
            .and_then(|mut c| c.allocate(&s2.name, &app, s2.dif.as_deref(), &s2.qos))
        {
            Ok(flow) => spawn_session(&sessions2, id, format!("{from} -> {app}"), tcp, flow),
            Err(e) => {
                eprintln!("rina-gw: session {id}: {from} -> {app}: cannot allocate a flow: {e}");
                sessions2.close();
            }
        };
        if let Err(e) = std::thread::Builder::new().spawn(allocate) {
            eprintln!("rina-gw: session {id}: cannot start a thread: {e}");
            sessions.close();
        }
    }
}

/// Registers `m.app` (through `client`, already done) and serves its flow
/// requests until the daemon goes: each is accepted once its TCP
/// connection to `m.connect` is up, or refused with the reason. Returns
/// the error that ended it.
pub fn rina_to_tcp(
    s: Arc<Settings>,
    sessions: Arc<Sessions>,
    m: RinaToTcp,
    mut client: Client,
) -> rina::Error {
    loop {
        let req = match client.next_request() {
            Ok(r) => r,
            Err(e) => return e,
        };
        if let Err(e) = answer(&s, &sessions, &m, &mut client, &req) {
            eprintln!("rina-gw: {} -> {}: {e}", req.remote, m.app);
        }
    }
}

/// Accepts request `req` for `m.app` with a TCP connection to `m.connect`,
/// or refuses it with the reason.
fn answer(
    s: &Settings,
    sessions: &Arc<Sessions>,
    m: &RinaToTcp,
    client: &mut Client,
    req: &IncomingFlow,
) -> rina::Result<()> {
    let Some(id) = sessions.open(s.max_sessions) else {
        let why = format!("rina-gw: {} sessions are up", s.max_sessions);
        eprintln!("rina-gw: {} -> {}: refused: {why}", req.remote, m.app);
        return client.refuse(req, &why);
    };
    let tcp = match TcpStream::connect_timeout(&m.connect, s.connect_timeout) {
        Ok(t) => t,
        Err(e) => {
            sessions.close();
            let why = format!("rina-gw: cannot connect to {}: {e}", m.connect);
            eprintln!("rina-gw: {} -> {}: refused: {why}", req.remote, m.app);
            return client.refuse(req, &why);
        }
    };
    match client.accept(req) {
        Ok(flow) => {
            let what = format!("{} -> {} -> {}", req.remote, m.app, m.connect);
            spawn_session(sessions, id, what, tcp, flow);
            Ok(())
        }
        Err(e) => {
            sessions.close();
            Err(e)
        }
    }
}

/// Connects to the daemon and registers `m.app` for a RINA-to-TCP
/// mapping: the client that takes its requests.
pub fn register(s: &Settings, m: &RinaToTcp) -> rina::Result<Client> {
    let mut c = connect(s)?;
    c.register(&m.app, s.dif.as_deref())?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_beyond_the_limit_get_no_place_until_one_closes() {
        let s = Sessions::default();
        assert_eq!((s.open(2), s.open(2)), (Some(1), Some(2)));
        assert_eq!(s.open(2), None, "a third of two");
        assert_eq!(s.up(), 2);
        s.close();
        assert_eq!(s.open(2), Some(3), "numbers are not reused");
        assert_eq!(s.up(), 2);
    }
}
