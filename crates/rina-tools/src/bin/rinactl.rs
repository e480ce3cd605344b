//! `rinactl`: show what the local RINA daemon holds.
//!
//! Exit codes: 0 on success, 1 if the daemon could not be reached or
//! answered with an error, 2 if a `--set` policy is not JSON or TOML.

use clap::{Parser, Subcommand};
use rina_tools::{opts, table};
use serde::Serialize;
use std::path::PathBuf;

/// Show the IPC processes, DIFs, registered names, flows, RIBs and RMT
/// schedulers of the local RINA daemon; change a normal IPCP's scheduler.
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
    /// The RMT scheduling policy of a normal IPC process and the counters of
    /// its queues (per N-1 port); with --set or --set-file, first switch the
    /// policy (queued PDUs are discarded). With --json, one JSON object.
    Sched {
        /// The normal IPC process (see `rinactl ipcps`).
        ipcp: String,
        /// The new policy, as JSON (`{"policy":"qta-mux","cherish_thresholds":[100]}`)
        /// or TOML (`policy = "fifo"` or an inline table).
        #[arg(long, value_name = "POLICY", conflicts_with = "set_file")]
        set: Option<String>,
        /// The new policy from a file: the keys of an `[ipcp.scheduler]`
        /// table, in TOML (or JSON).
        #[arg(long, value_name = "FILE")]
        set_file: Option<PathBuf>,
    },
}

fn main() {
    rina_docgen::handle::<Cli>();
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
        What::Sched {
            ipcp,
            set,
            set_file,
        } => {
            let text = match (set, set_file) {
                (Some(s), _) => Some(s.clone()),
                (None, Some(f)) => Some(std::fs::read_to_string(f).unwrap_or_else(|e| {
                    opts::die("rinactl", &format!("cannot read {}", f.display()), &e, 2)
                })),
                (None, None) => None,
            };
            let info = match text {
                Some(t) => {
                    let policy = parse_policy(&t)
                        .unwrap_or_else(|e| opts::die("rinactl", "bad policy", &e, 2));
                    c.set_scheduler(ipcp, policy)?
                }
                None => c.scheduler(ipcp)?,
            };
            if cli.json {
                show_json(&info);
            } else {
                print!("{}", table::sched(std::slice::from_ref(&info)).render());
            }
        }
    }
    Ok(())
}

/// A scheduling policy written as JSON, as a TOML document (`policy =
/// "fifo"`, one key per line) or as a TOML inline table (`{ policy =
/// "fifo" }`).
fn parse_policy(text: &str) -> Result<serde_json::Value, String> {
    let t = text.trim();
    if t.starts_with('{') {
        let json_err = match serde_json::from_str::<serde_json::Value>(t) {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        return match toml::from_str::<toml::Table>(&format!("v = {t}")) {
            Ok(mut table) => serde_json::to_value(table.remove("v")).map_err(|e| e.to_string()),
            Err(e) => Err(format!(
                "neither JSON ({json_err}) nor a TOML inline table ({})",
                e.message()
            )),
        };
    }
    let table: toml::Table = toml::from_str(t).map_err(|e| format!("not TOML: {e}"))?;
    serde_json::to_value(table).map_err(|e| e.to_string())
}

fn show<T: Serialize>(json: bool, list: &[T], render: fn(&[T]) -> table::Table) {
    if json {
        show_json(list);
    } else {
        print!("{}", render(list).render());
    }
}

fn show_json<T: Serialize + ?Sized>(v: &T) {
    match serde_json::to_string_pretty(v) {
        Ok(s) => println!("{s}"),
        Err(e) => opts::die("rinactl", "cannot encode JSON", &e, 1),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_policy;
    use serde_json::json;

    #[test]
    fn policies_are_read_from_json_toml_and_inline_toml() {
        let want = json!({"policy": "qta-mux", "cherish_thresholds": [100, 5]});
        for text in [
            r#"{"policy": "qta-mux", "cherish_thresholds": [100, 5]}"#,
            "policy = \"qta-mux\"\ncherish_thresholds = [100, 5]\n",
            r#"{ policy = "qta-mux", cherish_thresholds = [100, 5] }"#,
        ] {
            assert_eq!(parse_policy(text).unwrap(), want, "{text}");
        }
        let e = parse_policy("{ policy = ").unwrap_err();
        assert!(e.contains("JSON") && e.contains("TOML"), "{e}");
        assert!(parse_policy("policy = ").unwrap_err().contains("TOML"));
    }
}
