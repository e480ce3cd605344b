//! `rina-gw`: TCP connections over RINA flows (rlite's `rina-gw`), see
//! [`rina_tools::gw`].
//!
//! Runs until stopped. Exit codes: 2 when it cannot start (a port taken,
//! a mapping or a name refused, no daemon to register a name with); 1
//! when every mapping ended (each name of a gateway with no listener
//! withdrawn, `rinactl unregister`). A daemon that goes away is waited
//! for: the names are registered again when it is back, and connections
//! meanwhile are closed with the reason.

use clap::Parser;
use rina::{AppName, QosSpec};
use rina_tools::gw::mapping::{parse_rlite, RinaToTcp, TcpToRina};
use rina_tools::gw::run::{self, Sessions, Settings};
use rina_tools::opts::{self, CommonArgs};
use rina_tools::say;
use std::io::Write;
use std::net::TcpListener;
use std::sync::{mpsc, Arc};
use std::time::Duration;

const TOOL: &str = "rina-gw";

/// TCP connections carried over RINA flows. A gateway at each end: one
/// turns the TCP connections it accepts into flows to an application name
/// (--tcp-to-rina), the other registers that name and turns each flow into
/// a TCP connection to a server (--rina-to-tcp). Runs until stopped.
///
/// Example: ssh across a RINA network (the DIF "net"):
///   server side: rina-gw --dif net --rina-to-tcp ssh-b=127.0.0.1:22
///   client side: rina-gw --dif net --tcp-to-rina 127.0.0.1:2222=ssh-b
///                ssh -p 2222 user@127.0.0.1
#[derive(Debug, Parser)]
#[command(name = "rina-gw", version, verbatim_doc_comment)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    /// LISTEN=APP: listen for TCP connections on LISTEN (HOST:PORT) and
    /// carry each over a new flow to application APP. Repeatable.
    #[arg(long, value_name = "LISTEN=APP")]
    tcp_to_rina: Vec<TcpToRina>,
    /// APP=ADDR: register APP and carry each flow allocated to it over a
    /// new TCP connection to ADDR (HOST:PORT); a request whose connection
    /// fails is refused with the reason. Repeatable.
    #[arg(long, value_name = "APP=ADDR")]
    rina_to_tcp: Vec<RinaToTcp>,
    /// Also the mappings of FILE, written as for rlite's rina-gw: a line
    /// each, `I2R DIF APP IP PORT` (TCP connections to IP:PORT become flows
    /// to APP in DIF) or `R2I DIF APP IP PORT` (APP registered in DIF, its
    /// flows become TCP connections to IP:PORT); `#` starts a comment line.
    #[arg(long, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// This gateway's application name: the source of the flows it
    /// allocates.
    #[arg(long, default_value = "rina-gw", value_parser = opts::parse_name)]
    name: AppName,
    /// Ask for flows that may lose and reorder SDUs (a shim DIF offers no
    /// other). The default, reliable in-order flows, is what a TCP stream
    /// needs: over a lossy flow its bytes would be lost or reordered.
    #[arg(long)]
    unreliable: bool,
    /// Ask for this QoS cube of the DIF by its QoS-id (normal DIFs only).
    #[arg(long, value_name = "ID")]
    qos_cube: Option<u64>,
    /// Most sessions (connection and flow) at once; a connection beyond
    /// it is closed, a flow request refused.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    max_sessions: u64,
    /// How long a TCP connection for a flow request may take, in
    /// milliseconds, before the request is refused: at most 1400, as the
    /// daemon withdraws a request not answered in 1.5 s (shim-udp; 2 s in
    /// a normal DIF), and the requester would then hear no reason.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1400))]
    connect_timeout_ms: u64,
}

/// Ends the gateway with exit code `code`, saying why on standard error
/// (if it is still there).
fn die(tool: &str, context: &str, err: &dyn std::fmt::Display, code: i32) -> ! {
    let _ = writeln!(std::io::stderr().lock(), "{tool}: {context}: {err}");
    std::process::exit(code)
}

/// Says on standard output that a mapping is ready; a closed output is
/// not the gateway's end.
fn ready(what: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "rina-gw: {what}").and_then(|()| out.flush());
}

fn main() {
    // SIGPIPE stays ignored (Rust's default), unlike the other tools: a
    // gateway outlives its terminal, and its sockets and flows say a
    // closed peer with an error, never a signal.
    rina_docgen::handle::<Cli>();
    let mut cli = Cli::parse();
    // The command line's mappings use --dif; a file's name their own.
    for m in &mut cli.tcp_to_rina {
        m.dif.clone_from(&cli.common.dif);
    }
    for m in &mut cli.rina_to_tcp {
        m.dif.clone_from(&cli.common.dif);
    }
    if let Some(path) = &cli.config {
        let at = path.display();
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| die(TOOL, &format!("cannot read {at}"), &e, 2));
        let (i2r, r2i) = parse_rlite(&text).unwrap_or_else(|e| die(TOOL, &at.to_string(), &e, 2));
        cli.tcp_to_rina.extend(i2r);
        cli.rina_to_tcp.extend(r2i);
    }
    if cli.tcp_to_rina.is_empty() && cli.rina_to_tcp.is_empty() {
        die(
            TOOL,
            "nothing to do",
            &"give at least one --tcp-to-rina LISTEN=APP or --rina-to-tcp APP=ADDR, or a --config FILE with one",
            2,
        );
    }
    let settings = Arc::new(Settings {
        socket: cli.common.socket.clone(),
        name: cli.name.clone(),
        qos: QosSpec {
            reliable: !cli.unreliable,
            in_order: !cli.unreliable,
            cube: cli.qos_cube,
            ..QosSpec::default()
        },
        rings: !cli.common.no_rings,
        max_sessions: cli.max_sessions as usize,
        connect_timeout: Duration::from_millis(cli.connect_timeout_ms),
    });
    let sessions = Arc::new(Sessions::default());
    // Everything is bound and registered before anything is served, so
    // that a port taken or a name refused stops the gateway at once.
    let mut listeners = Vec::new();
    for m in &cli.tcp_to_rina {
        let l = TcpListener::bind(m.listen)
            .unwrap_or_else(|e| die(TOOL, &format!("cannot listen on {}", m.listen), &e, 2));
        let at = l.local_addr().map_or(m.listen, |a| a);
        ready(&format!("TCP {at} -> RINA {}", m.app));
        listeners.push((m.clone(), l));
    }
    let mut clients = Vec::new();
    for m in &cli.rina_to_tcp {
        let c = run::register(&settings, m)
            .unwrap_or_else(|e| die(TOOL, &format!("cannot register {}", m.app), &e, 2));
        ready(&format!("RINA {} -> TCP {}", m.app, m.connect));
        clients.push((m.clone(), c));
    }
    let listening = !listeners.is_empty();
    for (m, l) in listeners {
        let (s, n) = (Arc::clone(&settings), Arc::clone(&sessions));
        std::thread::spawn(move || run::tcp_to_rina(s, n, m, l));
    }
    // A registration ends only when its name is withdrawn; the others
    // serve on. With no listener, the last one's end is the gateway's.
    let (ended_tx, ended) = mpsc::channel();
    let registrations = clients.len();
    for (m, c) in clients {
        let (s, n, tx) = (
            Arc::clone(&settings),
            Arc::clone(&sessions),
            ended_tx.clone(),
        );
        std::thread::spawn(move || {
            let app = m.app.clone();
            let _ = tx.send((app, run::rina_to_tcp(s, n, m, c)));
        });
    }
    drop(ended_tx);
    for (k, (app, e)) in ended.iter().enumerate() {
        say!("{app}: no more flow requests: {e}");
        if k + 1 == registrations && !listening {
            die(TOOL, "every mapping ended", &"no name left to serve", 1);
        }
    }
    // Listeners only (or left): they run until the process is stopped.
    loop {
        std::thread::park();
    }
}
