//! `rina-ip`: IP over RINA. Creates a TUN interface and carries the IP
//! packets routed to it over RINA flows to the configured peers.
//!
//! Exit codes: 0 on a clean stop (SIGINT/SIGTERM) or success of `--status`
//! and `--check`; 2 on any error (bad configuration, no TUN, no status
//! answer, the TUN failing while running, e.g. deleted).

use clap::Parser;
use rina_tools::ip::config::{default_status_socket, DEFAULT_TUN};
use rina_tools::ip::{status, Config, Overrides, Tunnel};
use rina_tools::opts;
use std::path::PathBuf;

const TOOL: &str = "rina-ip";

/// IP over RINA: a TUN interface whose packets travel on RINA flows.
#[derive(Debug, Parser)]
#[command(name = "rina-ip", version)]
struct Cli {
    /// Configuration file (TOML; see docs/rina-ip.md). Flags override it.
    #[arg(long, short, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Application name this tunnel registers.
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// DIF to register in and allocate through.
    #[arg(long, value_name = "DIF")]
    dif: Option<String>,
    /// rinad's control socket.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// TUN interface name (default rina0).
    #[arg(long, value_name = "IFNAME")]
    tun: Option<String>,
    /// Cap on the TUN MTU (otherwise the flows' largest SDU).
    #[arg(long, value_name = "BYTES")]
    mtu: Option<u32>,
    /// Address of the TUN with its prefix length (repeat for more, IPv4 or IPv6).
    #[arg(long = "address", value_name = "ADDR/LEN")]
    addresses: Vec<String>,
    /// A peer: its application name, the prefixes behind it, optionally its
    /// QoS profile (repeat for more).
    #[arg(long = "peer", value_name = "NAME=PREFIX[,PREFIX...][@QOS]")]
    peers: Vec<String>,
    /// Use the flows' sockets, not shared-memory rings, between the tunnel
    /// and rinad.
    #[arg(long)]
    no_rings: bool,
    /// Write packets from a peer to the TUN whatever their source address
    /// (by default only those whose source routes back to that peer).
    #[arg(long)]
    no_source_filter: bool,
    /// Unix socket the status is served on / asked from.
    #[arg(long, value_name = "PATH")]
    status_socket: Option<PathBuf>,
    /// Print the state and counters of the running tunnel, then exit.
    #[arg(long)]
    status: bool,
    /// With --status: print JSON.
    #[arg(long, requires = "status")]
    json: bool,
    /// Check the configuration, print what it means, and exit.
    #[arg(long, conflicts_with = "status")]
    check: bool,
}

fn main() {
    rina_docgen::handle::<Cli>();
    let cli = Cli::parse();
    let over = Overrides {
        name: cli.name.clone(),
        dif: cli.dif.clone(),
        socket: cli.socket.clone(),
        status_socket: cli.status_socket.clone(),
        no_rings: cli.no_rings,
        no_source_filter: cli.no_source_filter,
        tun: cli.tun.clone(),
        mtu: cli.mtu,
        addresses: cli.addresses.clone(),
        peers: cli.peers.clone(),
    };
    if cli.status {
        std::process::exit(show_status(&cli, &over));
    }
    let cfg = Config::load(cli.config.as_deref(), &over)
        .unwrap_or_else(|e| opts::die(TOOL, "bad configuration", &e, 2));
    if cli.check {
        print_config(&cfg);
        return;
    }
    let tunnel = Tunnel::start(cfg).unwrap_or_else(|e| opts::die(TOOL, "cannot start", &e, 2));
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .unwrap_or_else(|e| opts::die(TOOL, "cannot catch signals", &e, 2));
    let on_signal = tunnel.clone();
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            on_signal.stop();
        }
    });
    // A signal stops the tunnel; a TUN that fails (deleted) ends it too,
    // and the process with it, rather than leaving it idle.
    let ended = tunnel.wait();
    tunnel.stop();
    if let Err(e) = ended {
        opts::die(TOOL, "stopped", &e, 2);
    }
}

fn show_status(cli: &Cli, over: &Overrides) -> i32 {
    let path = match (&cli.status_socket, &cli.config) {
        (Some(p), _) => p.clone(),
        (None, Some(_)) => match Config::load(cli.config.as_deref(), over) {
            Ok(c) => c.status_socket,
            Err(e) => opts::die(TOOL, "bad configuration", &e, 2),
        },
        (None, None) => default_status_socket(cli.tun.as_deref().unwrap_or(DEFAULT_TUN)),
    };
    match status::query(&path) {
        Ok(s) if cli.json => match serde_json::to_string_pretty(&s) {
            Ok(j) => {
                println!("{j}");
                0
            }
            Err(e) => opts::die(TOOL, "cannot encode JSON", &e, 2),
        },
        Ok(s) => {
            print!("{}", s.render());
            0
        }
        Err(e) => opts::die(TOOL, "no status", &e, 2),
    }
}

fn print_config(c: &Config) {
    println!(
        "name {} in DIF {}",
        c.name,
        c.dif.as_deref().unwrap_or("(any)")
    );
    let addrs: Vec<String> = c.tun.addresses.iter().map(|a| a.to_string()).collect();
    println!(
        "tun {} addresses [{}] mtu cap {} routes {}",
        c.tun.name,
        addrs.join(", "),
        c.tun
            .mtu_cap
            .map(|m| m.to_string())
            .unwrap_or_else(|| "none".into()),
        c.tun.routes
    );
    println!("status socket {}", c.status_socket.display());
    println!(
        "data path to rinad: {}",
        if c.rings {
            "shared-memory rings where the DIF offers them"
        } else {
            "sockets"
        }
    );
    println!(
        "source addresses from a peer: {}",
        if c.source_filter {
            "only those routed back to it"
        } else {
            "any (not filtered)"
        }
    );
    for p in &c.peers {
        let pf: Vec<String> = p.prefixes.iter().map(|x| x.to_string()).collect();
        let ch: Vec<&str> = p.channels.iter().map(|c| c.qos_name.as_str()).collect();
        println!(
            "peer {} prefixes [{}] flows [{}] {}",
            p.name,
            pf.join(", "),
            ch.join(", "),
            if p.allocates {
                "(this side allocates)"
            } else {
                "(the peer allocates)"
            }
        );
    }
}
