//! `rinactl`: show what the local RINA daemon holds.
//!
//! Exit codes: 0 on success, 1 if the daemon could not be reached or
//! answered with an error.

use clap::{Parser, Subcommand};
use rina_tools::{opts, table};
use serde::Serialize;
use std::path::PathBuf;

/// Show the IPC processes, DIFs, registered names, flows and RIBs of the local RINA daemon.
#[derive(Debug, Parser)]
#[command(name = "rinactl", version)]
struct Cli {
    /// Daemon socket (default: $RINA_SOCKET, else the per-user default path).
    #[arg(long, value_name = "PATH", global = true)]
    socket: Option<PathBuf>,
    /// Print the list as a JSON array instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Clone, Subcommand)]
enum What {
    /// IPC processes: name, kind, DIF, address, flows, names, counters.
    Ipcps,
    /// DIFs and their local IPC processes.
    Difs,
    /// Registered application names.
    Names,
    /// Flows and their counters.
    Flows,
    /// The RIB of an IPC process: its objects (name, class, instance, value, owner).
    Rib {
        /// The IPC process (see `rinactl ipcps`).
        ipcp: String,
        /// Subtree to show, e.g. /ra/pduft (default: the whole RIB).
        path: Option<String>,
        /// Levels below the path to show (default: all).
        #[arg(long)]
        depth: Option<u32>,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(&cli) {
        opts::die("rinactl", &opts::kind_name(e.kind), &e, 1);
    }
}

fn run(cli: &Cli) -> rina::Result<()> {
    let mut c = opts::connect(cli.socket.as_deref())?;
    match &cli.what {
        What::Ipcps => show(cli.json, &c.list_ipcps()?, table::ipcps),
        What::Difs => show(cli.json, &c.list_difs()?, table::difs),
        What::Names => show(cli.json, &c.list_names()?, table::names),
        What::Flows => show(cli.json, &c.list_flows()?, table::flows),
        What::Rib { ipcp, path, depth } => show(
            cli.json,
            &c.read_rib(ipcp, path.as_deref(), *depth)?,
            table::rib,
        ),
    }
    Ok(())
}

fn show<T: Serialize>(json: bool, list: &[T], render: fn(&[T]) -> table::Table) {
    if json {
        match serde_json::to_string_pretty(list) {
            Ok(s) => println!("{s}"),
            Err(e) => opts::die("rinactl", "cannot encode JSON", &e, 1),
        }
    } else {
        print!("{}", render(list).render());
    }
}
