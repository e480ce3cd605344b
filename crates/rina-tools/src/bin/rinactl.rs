//! `rinactl`: show what the local RINA daemon holds, and change it.
//!
//! Exit codes: 0 on success, 1 if the daemon could not be reached or
//! answered with an error (refused: the message says what and why; with
//! `--json` it is also printed as `{"error": {"kind": .., "message": ..}}`),
//! 2 if the arguments are wrong before the daemon is asked (a usage error,
//! a bad name, KEY=VALUE or number of seconds, a `--set` policy that is not
//! JSON or TOML, a file that cannot be read): then the message is on
//! standard error only, with `--json` too.

use clap::{Parser, Subcommand};
use rina_tools::{opts, table};
use serde::Serialize;
use std::path::PathBuf;

/// Show the IPC processes, DIFs, registered names, flows, RIBs and RMT
/// schedulers of the local RINA daemon; create, destroy and enroll IPC
/// processes, change a normal IPCP's scheduler, EFCP policies, neighbours
/// and registrations, reload the configuration, stop flows, withdraw names.
///
/// Users who are not administrators of the daemon (root, its own user,
/// members of its admin_group) see only their own names and flows, and may
/// not run the commands that change the system.
#[derive(Debug, Parser)]
#[command(name = "rinactl", version, after_help = QUICK_REFERENCE)]
struct Cli {
    /// Daemon socket (default: $RINA_SOCKET, else the per-user default path).
    #[arg(long, value_name = "PATH", global = true)]
    socket: Option<PathBuf>,
    /// Print JSON instead of text: a list as an array, the outcome of a
    /// change as an object.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Clone, Subcommand)]
enum What {
    /// IPC processes: name, kind, DIF, address, flows, names (up to 16
    /// each, and how many more: `rinactl names` lists them all), counters.
    Ipcps,
    /// DIFs and their local IPC processes.
    Difs,
    /// Registered application names.
    Names,
    /// Flows and their counters.
    Flows,
    /// The RIB of an IPC process: its objects (name, class, instance, value,
    /// owner). Administrators only: it shows every user's names and flows.
    Rib {
        /// The IPC process (see `rinactl ipcps`).
        ipcp: String,
        /// Subtree to show, e.g. /ra/pduft (default: the whole RIB).
        path: Option<String>,
        /// Levels below the path to show (default: all).
        #[arg(long)]
        depth: Option<u32>,
        /// Read the RIB of this neighbour of IPCP in its DIF instead (its
        /// IPCP name or address), over the DIF with CDAP.
        #[arg(long, value_name = "NEIGHBOUR")]
        remote: Option<String>,
    },
    /// The RMT scheduling policy of a normal IPC process and the counters of
    /// its queues (per N-1 port); with --set or --set-file, first switch the
    /// policy (queued PDUs are discarded; administrators only). With --json,
    /// one JSON object.
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
    /// Deallocate a flow by port-id (see `rinactl flows`): one of your own,
    /// or any for an administrator.
    Dealloc {
        /// The flow's port-id.
        port: u32,
    },
    /// Withdraw an application's registration (yours, or any for an
    /// administrator), from DIF --dif or from every DIF.
    Unregister {
        /// The application name.
        name: String,
        /// Only from this DIF.
        #[arg(long)]
        dif: Option<String>,
    },
    /// Create, destroy or enroll an IPC process (administrators only).
    Ipcp {
        #[command(subcommand)]
        what: IpcpCmd,
    },
    /// Change the EFCP policies of a QoS cube of a normal IPC process:
    /// the keys of a cube's `efcp` table as KEY=VALUE (a_timer_ms,
    /// max_sdu_gap, window, initial_credit, initial/min/max_rto_ms,
    /// max_retries, ack_every, congestion_control, initial/min/max_window,
    /// gain_shift, rate_pdus, rate_frame_ms), range-checked. Flows
    /// allocated from then on use them
    /// (administrators only).
    #[command(alias = "dif-policy-mod")]
    Efcp {
        /// The normal IPC process.
        ipcp: String,
        /// The QoS cube: its name or QoS-id.
        cube: String,
        /// KEY=VALUE pairs.
        #[arg(required = true, value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
    /// Read the configuration file again (or FILE) and apply the
    /// difference with the running system: the `[system]` table's
    /// administrators, limits and socket permissions (name and socket at
    /// the next start), IPCPs added, removed or changed, neighbours,
    /// static directories, scheduling and EFCP policies; prints one line
    /// per change. A file with a mistake changes nothing; the error names
    /// the key and the line. SIGHUP to rinad does the same (the outcome is
    /// in its log). Administrators only.
    Reload {
        /// The file (default: the one rinad was started with); a relative
        /// path is taken from the current directory.
        file: Option<String>,
    },
    /// Neighbours of a normal IPC process: keep an N-1 flow up to one, or
    /// forget one (administrators only).
    Neighbor {
        #[command(subcommand)]
        what: NeighborCmd,
    },
    /// Register a normal IPC process in a lower DIF, so peers there can
    /// allocate N-1 flows to it (administrators only).
    #[command(alias = "ipcp-register", alias = "register-at-dif")]
    RegisterIpcp {
        /// The normal IPC process.
        ipcp: String,
        /// The lower DIF.
        dif: String,
    },
    /// Withdraw a normal IPC process's registration from a lower DIF
    /// (administrators only).
    #[command(alias = "ipcp-unregister", alias = "unregister-from-dif")]
    UnregisterIpcp {
        /// The normal IPC process.
        ipcp: String,
        /// The lower DIF.
        dif: String,
    },
    /// Write what an IPC process sends and receives as a pcap file, until
    /// Ctrl-C, --count or --duration-s (administrators only): a normal
    /// IPCP's PDUs on its N-1 flows (whatever is below it), a shim-udp's
    /// datagrams (as IP/UDP), a shim-eth's Ethernet frames and ARP, a
    /// shim-hv's VMPI buffers. Decode it with tools/wireshark/rina.lua:
    /// `tshark -X lua_script:tools/wireshark/rina.lua -r FILE`. FILE `-` is
    /// standard output: `rinactl capture a.net - | wireshark -X
    /// lua_script:rina.lua -k -i -`.
    Capture {
        /// The IPC process (see `rinactl ipcps`).
        ipcp: String,
        /// The pcap file to write, or `-` for standard output.
        file: PathBuf,
        /// Stop after this many packets.
        #[arg(long, short = 'c')]
        count: Option<u64>,
        /// Stop after this many seconds.
        #[arg(long, value_name = "S", value_parser = opts::parse_seconds)]
        duration_s: Option<f64>,
        /// Keep at most this many bytes of each packet (default 65535).
        #[arg(long, short = 's', value_name = "BYTES")]
        snaplen: Option<u32>,
    },
}

#[derive(Debug, Clone, Subcommand)]
enum IpcpCmd {
    /// Create an IPC process of any kind with the keys of an `[[ipcp]]`
    /// table of rinad's configuration file, as KEY=VALUE arguments
    /// (`name=a.net type=normal dif=net address=1`; a VALUE that is not
    /// TOML is a string; tables inline: `neighbor=[{name="b.net",over="udp"}]`)
    /// or as a TOML file (--file). A normal IPCP with an address and no
    /// neighbour bootstraps its DIF; without an address it waits for
    /// `rinactl ipcp enroll`.
    Create {
        /// KEY=VALUE pairs.
        #[arg(value_name = "KEY=VALUE", required_unless_present = "file")]
        keys: Vec<String>,
        /// The keys as a TOML document (what follows `[[ipcp]]` in the file).
        #[arg(long, value_name = "FILE", conflicts_with = "keys")]
        file: Option<PathBuf>,
    },
    /// Destroy an IPC process and what rests on it: its application flows
    /// (their applications read end of file), the N-1 flows of the IPC
    /// processes above it and their neighbours over its DIF.
    Destroy {
        /// The IPC process.
        ipcp: String,
    },
    /// Enroll a normal IPC process into its DIF through a neighbour that
    /// is a member, reached over a lower DIF (the neighbour is added if it
    /// is not one yet); prints enrollment's steps, or the failed step.
    Enroll {
        /// The normal IPC process.
        ipcp: String,
        /// The neighbour (a member of the DIF).
        neighbor: String,
        /// The lower DIF that reaches it.
        #[arg(long)]
        over: String,
        /// The neighbour's address, if known.
        #[arg(long)]
        address: Option<u64>,
        /// Give up waiting after this many seconds (default 10; at most
        /// 120).
        #[arg(long, value_name = "S", default_value_t = 10.0, value_parser = opts::parse_seconds)]
        timeout_s: f64,
    },
}

#[derive(Debug, Clone, Subcommand)]
enum NeighborCmd {
    /// Add a neighbour and keep an N-1 flow up to it.
    Add {
        /// The normal IPC process.
        ipcp: String,
        /// The neighbour IPC process's name.
        name: String,
        /// The N-1 DIF that reaches it (a shim DIF or a lower normal DIF).
        #[arg(long)]
        over: String,
        /// Its address, if known (else its hellos tell).
        #[arg(long)]
        address: Option<u64>,
    },
    /// Forget a neighbour and deallocate its N-1 flows.
    Remove {
        /// The normal IPC process.
        ipcp: String,
        /// The neighbour IPC process's name.
        name: String,
    },
}

/// IRATI's console and rlite-ctl commands, and what does the same here.
const QUICK_REFERENCE: &str = "\
Quick reference (IRATI IPCM console | rlite-ctl -> rinactl):
  create-ipcp + assign-to-dif | ipcp-create + ipcp-config  rinactl ipcp create name=N type=T dif=D [KEY=VALUE...]
                              |                              (the keys of an [[ipcp]] table; or --file F)
  (bootstrap: assign-to-dif   | ipcp-config IPCP address   rinactl ipcp create ... type=normal address=1
    with an address)          |                              (an address and no neighbour)
  destroy-ipcp                | ipcp-destroy               rinactl ipcp destroy IPCP
  list-ipcps                  | ipcps-show                 rinactl ipcps, rinactl difs
  -                           | regs-show                  rinactl names
  -                           | flows-show                 rinactl flows
  query-rib                   | ipcp-rib-show              rinactl rib IPCP [PATH]
  -                           | dif-rib-show               rinactl rib IPCP /difm
  register-at-dif             | ipcp-register              rinactl register-ipcp IPCP DIF
  unregister-from-dif         | ipcp-unregister            rinactl unregister-ipcp IPCP DIF
  enroll-to-dif               | ipcp-enroll                rinactl ipcp enroll IPCP NEIGHBOR --over DIF
  -                           | ipcp-lower-flow-alloc      rinactl neighbor add IPCP NEIGHBOR --over DIF
  disc-neigh                  | ipcp-neigh-disconnect      rinactl neighbor remove IPCP NEIGHBOR
  select-policy-set,          | dif-policy-mod,            rinactl sched IPCP --set POLICY (RMT scheduler)
    set-policy-set-param      |   dif-policy-param-mod     rinactl efcp IPCP CUBE KEY=VALUE... (EFCP of a cube)
  -                           | flow-dealloc               rinactl dealloc PORT
  -                           | -                          rinactl unregister NAME
  (restart the IPCM)          | (rerun the script)         rinactl reload [FILE], or kill -HUP rinad";

fn main() {
    rina_tools::opts::quiet_on_closed_stdout();
    rina_docgen::handle::<Cli>();
    let cli = Cli::parse();
    if let Err(e) = run(&cli) {
        if cli.json {
            show_json(&serde_json::json!({
                "error": {"kind": opts::kind_name(e.kind), "message": e.message}
            }));
        }
        opts::die("rinactl", &opts::kind_name(e.kind), &e, 1);
    }
}

/// Prints what a command that changes the system did.
fn done(json: bool, what: &str, detail: serde_json::Value) {
    if json {
        show_json(&serde_json::json!({"done": what, "detail": detail}));
    } else {
        println!("{what}");
    }
}

fn app_name(s: &str) -> rina::AppName {
    opts::parse_name(s).unwrap_or_else(|e| opts::die("rinactl", "bad name", &e, 2))
}

/// Prints the lines of what changed (or them as JSON).
fn changed(json: bool, what: &str, lines: &[String]) {
    if json {
        show_json(&serde_json::json!({"done": what, "changes": lines}));
    } else {
        for l in lines {
            println!("{l}");
        }
    }
}

/// KEY=VALUE arguments as a TOML document, one argument a line (so a
/// mistake's line is the argument's position). A VALUE that is not a TOML
/// value is a string.
fn keys_to_toml(keys: &[String]) -> Result<String, String> {
    let mut doc = String::new();
    for kv in keys {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(format!("{kv:?} is not KEY=VALUE"));
        };
        let k = k.trim();
        if k.is_empty()
            || !k
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(format!("{k:?} is not a key"));
        }
        let v = v.trim();
        let value = if toml::from_str::<toml::Table>(&format!("v = {v}")).is_ok() {
            v.to_string()
        } else {
            toml::Value::String(v.to_string()).to_string()
        };
        doc.push_str(&format!("{k} = {value}\n"));
    }
    Ok(doc)
}

/// KEY=VALUE arguments as a JSON object (values read as TOML).
fn keys_to_json(keys: &[String]) -> Result<serde_json::Value, String> {
    let doc = keys_to_toml(keys)?;
    let table: toml::Table = toml::from_str(&doc).map_err(|e| e.message().to_string())?;
    serde_json::to_value(table).map_err(|e| e.to_string())
}

fn ipcp_cmd(json: bool, c: &mut rina::Client, what: &IpcpCmd) -> rina::Result<()> {
    match what {
        IpcpCmd::Create { keys, file } => {
            let text = match file {
                Some(f) => std::fs::read_to_string(f).unwrap_or_else(|e| {
                    opts::die("rinactl", &format!("cannot read {}", f.display()), &e, 2)
                }),
                None => keys_to_toml(keys)
                    .unwrap_or_else(|e| opts::die("rinactl", "bad arguments", &e, 2)),
            };
            changed(json, "ipcp create", &c.create_ipcp(&text)?);
        }
        IpcpCmd::Destroy { ipcp } => changed(json, "ipcp destroy", &c.destroy_ipcp(ipcp)?),
        IpcpCmd::Enroll {
            ipcp,
            neighbor,
            over,
            address,
            timeout_s,
        } => {
            let wait = std::time::Duration::from_secs_f64(timeout_s.clamp(0.1, 120.0));
            c.set_timeout(Some(wait + std::time::Duration::from_secs(5)));
            // The steps are printed as they happen (with --json, all of
            // them in the object at the end).
            let mut live = |s: &str| {
                if !json {
                    println!("  {s}");
                }
            };
            let nb = app_name(neighbor);
            let (addr, steps) = c.enroll(ipcp, &nb, over, *address, Some(wait), &mut live)?;
            if json {
                show_json(
                    &serde_json::json!({"done": "ipcp enroll", "ipcp": ipcp, "address": addr, "steps": steps}),
                );
            } else {
                println!("{ipcp} enrolled through {neighbor}: address {addr}");
            }
        }
    }
    Ok(())
}

fn change(cli: &Cli, c: &mut rina::Client) -> rina::Result<()> {
    let j = cli.json;
    match &cli.what {
        What::Ipcp { what } => ipcp_cmd(j, c, what)?,
        What::Efcp { ipcp, cube, set } => {
            let v =
                keys_to_json(set).unwrap_or_else(|e| opts::die("rinactl", "bad arguments", &e, 2));
            changed(j, "efcp", &c.set_efcp(ipcp, cube, v)?);
        }
        What::Reload { file } => {
            // rinad reads the file: a relative path is the caller's, as
            // for `ipcp create --file` and `capture`.
            let file = file.as_deref().map(|f| match std::path::absolute(f) {
                Ok(p) => p.to_string_lossy().into_owned(),
                Err(e) => opts::die("rinactl", &format!("bad path {f}"), &e, 2),
            });
            changed(j, "reload", &c.reload(file.as_deref())?)
        }
        What::Dealloc { port } => {
            c.deallocate_port(*port)?;
            done(
                j,
                &format!("flow {port} deallocated"),
                serde_json::json!({"port": port}),
            );
        }
        What::Unregister { name, dif } => {
            c.unregister(&app_name(name), dif.as_deref())?;
            done(
                j,
                &format!("{name} unregistered"),
                serde_json::json!({"name": name, "dif": dif}),
            );
        }
        What::Neighbor {
            what:
                NeighborCmd::Add {
                    ipcp,
                    name,
                    over,
                    address,
                },
        } => {
            c.add_neighbor(ipcp, &app_name(name), over, *address)?;
            let d = serde_json::json!({"ipcp": ipcp, "neighbor": name, "over": over, "address": address});
            done(
                j,
                &format!("{name} is a neighbour of {ipcp} over {over}"),
                d,
            );
        }
        What::Neighbor {
            what: NeighborCmd::Remove { ipcp, name },
        } => {
            c.remove_neighbor(ipcp, &app_name(name))?;
            let d = serde_json::json!({"ipcp": ipcp, "neighbor": name});
            done(j, &format!("{name} is no longer a neighbour of {ipcp}"), d);
        }
        What::RegisterIpcp { ipcp, dif } | What::UnregisterIpcp { ipcp, dif } => {
            let on = matches!(cli.what, What::RegisterIpcp { .. });
            c.register_ipcp(ipcp, dif, on)?;
            let verb = if on {
                "registered in"
            } else {
                "unregistered from"
            };
            done(
                j,
                &format!("{ipcp} {verb} DIF {dif}"),
                serde_json::json!({"ipcp": ipcp, "dif": dif}),
            );
        }
        _ => {}
    }
    Ok(())
}

fn run(cli: &Cli) -> rina::Result<()> {
    let mut c = opts::connect(cli.socket.as_deref())?;
    match &cli.what {
        What::Ipcps => show(cli.json, &c.list_ipcps()?, table::ipcps),
        What::Difs => show(cli.json, &c.list_difs()?, table::difs),
        What::Names => show(cli.json, &c.list_names()?, table::names),
        What::Flows => show(cli.json, &c.list_flows()?, table::flows),
        What::Rib {
            ipcp,
            path,
            depth,
            remote,
        } => {
            let objects = match remote {
                Some(n) => c.read_remote_rib(ipcp, n, path.as_deref(), *depth)?,
                None => c.read_rib(ipcp, path.as_deref(), *depth)?,
            };
            show(cli.json, &objects, table::rib)
        }
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
        What::Capture {
            ipcp,
            file,
            count,
            duration_s,
            snaplen,
        } => capture(cli.json, &mut c, ipcp, file, *count, *duration_s, *snaplen)?,
        _ => change(cli, &mut c)?,
    }
    Ok(())
}

/// `rinactl capture`: the daemon's records into FILE until a limit or a
/// signal; a summary on standard error (standard output may be the file),
/// or as JSON on standard output with --json and a file.
fn capture(
    json: bool,
    c: &mut rina::Client,
    ipcp: &str,
    file: &std::path::Path,
    count: Option<u64>,
    duration_s: Option<f64>,
    snaplen: Option<u32>,
) -> rina::Result<()> {
    use rina_tools::capture::{copy_records, Limits};
    use std::sync::{atomic::AtomicBool, Arc};
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register(sig, Arc::clone(&stop));
    }
    // The daemon first: a refused capture leaves FILE as it was.
    let (linktype, snaplen, sock) = c.capture(ipcp, snaplen)?;
    let until = duration_s
        .map(|d| std::time::Instant::now() + std::time::Duration::from_secs_f64(d.min(1e9)));
    let to_stdout = file.as_os_str() == "-";
    let mut out: Box<dyn std::io::Write> = if to_stdout {
        Box::new(std::io::stdout().lock())
    } else {
        let f = std::fs::File::create(file).unwrap_or_else(|e| {
            opts::die(
                "rinactl",
                &format!("cannot create {}", file.display()),
                &e,
                2,
            )
        });
        Box::new(std::io::BufWriter::new(f))
    };
    let limits = Limits { count, until };
    let stats = copy_records(&sock, &mut out, linktype, snaplen, limits, &stop)
        .unwrap_or_else(|e| opts::die("rinactl", "capture", &e, 1));
    drop(out);
    if json && !to_stdout {
        show_json(
            &serde_json::json!({"ipcp": ipcp, "file": file, "packets": stats.packets, "bytes": stats.bytes}),
        );
    } else {
        eprintln!(
            "rinactl: {} packets of {ipcp} written to {}",
            stats.packets,
            file.display()
        );
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
    use super::{keys_to_json, keys_to_toml, parse_policy};

    #[test]
    fn key_value_arguments_become_toml_one_line_each() {
        let args: Vec<String> = [
            "name=a.net",
            "address=1",
            "crc=true",
            "bind=127.0.0.1:0",
            "neighbor=[{name = \"b.net\", over = \"udp\"}]",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let doc = keys_to_toml(&args).unwrap();
        let t: toml::Table = toml::from_str(&doc).unwrap();
        assert_eq!(t["name"].as_str(), Some("a.net"));
        assert_eq!(t["address"].as_integer(), Some(1));
        assert_eq!(t["crc"].as_bool(), Some(true));
        assert_eq!(t["bind"].as_str(), Some("127.0.0.1:0"));
        assert_eq!(t["neighbor"][0]["over"].as_str(), Some("udp"));
        assert_eq!(doc.lines().count(), args.len());
        assert!(keys_to_toml(&["novalue".into()]).is_err());
        assert!(keys_to_toml(&["a b=1".into()]).is_err());
        let v = keys_to_json(&["window=8".into(), "congestion_control=aimd".into()]).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"window": 8, "congestion_control": "aimd"})
        );
    }
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
