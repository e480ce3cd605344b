//! `rina-cat`: a netcat for RINA flows, see [`rina_tools::cat`].
//!
//! Exit codes: 0 when the session ended normally (the flow's end, after
//! all that came on it was written out); 2 when it cannot start (no
//! daemon, the name refused, the allocation refused or failed); 1 for an
//! error during a session, or a daemon lost while a listener waits for a
//! flow. A standard output that was closed (`| head`)
//! ends the session quietly with 1: not all that came was written, as for
//! any other output error, but the reader that went away needs no
//! message (`--verbose` still says it).

use clap::Parser;
use rina::{AppName, Client, QosSpec};
use rina_tools::cat::{self, Carried, End, Input, InputEnd};
use rina_tools::opts::{self, CommonArgs};
use std::io::{self, Read, Write};
use std::time::Duration;

const TOOL: &str = "rina-cat";

/// Longest --wait-ms: the longest time an option takes ([`opts::MAX_SECONDS`]).
const MAX_WAIT_MS: u64 = opts::MAX_SECONDS as u64 * 1000;

/// A netcat for RINA flows: standard input onto a flow, the flow onto
/// standard output.
///
/// Allocates a flow from --name to application NAME, or with --listen
/// registers NAME and takes one flow (with --keep-listening, one after
/// another). Each read of standard input is one SDU; each SDU that comes
/// is written to standard output at once. The caller closes the flow when
/// its standard input ends (after --wait-ms, if given); a listener leaves
/// the end to its peer. The flow's end ends the session, once all that
/// came on it was written out.
///
/// Examples, a normal DIF "net" between two systems:
///   rina-cat --dif net -l backup > backup.tar       # receives a file
///   tar c dir | rina-cat --dif net backup           # sends one
///   echo hello | rina-cat --dif net --wait-ms 2000 echo   # to `rina-echo server`
#[derive(Debug, Parser)]
#[command(name = "rina-cat", version, verbatim_doc_comment)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
    /// Register NAME and take one flow allocated to it, instead of
    /// allocating one. The end of standard input does not close the flow:
    /// the peer's end of it ends the session.
    #[arg(short = 'l', long)]
    listen: bool,
    /// With --listen: take flows one after another, each served to its
    /// end before the next is taken, until stopped or a session fails
    /// (standard output closed included). A request that comes meanwhile
    /// waits (the daemon withdraws one not answered in about 2 s).
    /// Standard input goes to the flows in turn; what a flow took while its
    /// peer was ending it is lost.
    #[arg(short = 'k', long, requires = "listen")]
    keep_listening: bool,
    /// Never read standard input: only what comes on the flow is written
    /// out. A caller then closes the flow only --wait-ms after it started,
    /// if given; otherwise its peer ends it.
    #[arg(short = 'd', long)]
    no_stdin: bool,
    /// This caller's application name: the source of its flow.
    #[arg(long, default_value = "rina-cat", value_parser = opts::parse_name, conflicts_with = "listen")]
    name: AppName,
    /// Ask for a flow that may lose and reorder SDUs (a shim DIF offers no
    /// other). The default, a reliable in-order flow, is what a byte
    /// stream needs.
    #[arg(long, conflicts_with = "listen")]
    unreliable: bool,
    /// Ask for this QoS cube of the DIF by its QoS-id (normal DIFs only).
    #[arg(long, value_name = "ID", conflicts_with = "listen")]
    qos_cube: Option<u64>,
    /// After standard input ended, keep writing what comes on the flow for
    /// up to MS milliseconds (less if the flow ends first), then close it:
    /// for the answer to a request.
    #[arg(long, value_name = "MS", conflicts_with = "listen",
          value_parser = clap::value_parser!(u64).range(0..=MAX_WAIT_MS))]
    wait_ms: Option<u64>,
    /// Say on standard error what each session carried when it ends (and
    /// the name registered, for a listener).
    #[arg(short = 'v', long)]
    verbose: bool,
    /// The application to allocate a flow to (with --listen: the name to
    /// register).
    #[arg(value_name = "NAME", value_parser = opts::parse_name)]
    target: AppName,
}

/// Writes a line to standard error, `rina-cat: ` first; a standard error
/// that went away is ignored.
fn say(what: std::fmt::Arguments<'_>) {
    let _ = writeln!(io::stderr().lock(), "{TOOL}: {what}");
}

/// Ends the tool with exit code `code`, saying why on standard error (if
/// it is still there).
fn die(context: &str, err: &dyn std::fmt::Display, code: i32) -> ! {
    say(format_args!("{context}: {err}"));
    std::process::exit(code)
}

/// What the end of the input does, for these options.
fn input_end(cli: &Cli) -> InputEnd {
    match (cli.listen, cli.wait_ms, cli.no_stdin) {
        (true, _, _) => InputEnd::KeepOpen,
        (false, Some(ms), _) => InputEnd::CloseAfter(Duration::from_millis(ms)),
        (false, None, true) => InputEnd::KeepOpen,
        (false, None, false) => InputEnd::CloseAfter(Duration::ZERO),
    }
}

/// Starts the thread that reads standard input (nothing with
/// --no-stdin).
fn start_input(cli: &Cli) -> Input {
    let input: Box<dyn Read + Send> = if cli.no_stdin {
        Box::new(io::empty())
    } else {
        Box::new(io::stdin())
    };
    Input::start(input, input_end(cli)).unwrap_or_else(|e| die("cannot start a thread", &e, 2))
}

/// Connects to the daemon, or exits with 2.
fn connect(cli: &Cli) -> Client {
    cli.common
        .connect()
        .unwrap_or_else(|e| die("cannot connect to the daemon", &e, 2))
}

/// Carries one session on `flow` (described by `what`: `flow 7 to NAME`)
/// of `client` and says how it ended: its exit code. A daemon that died
/// ends a flow as its peer would: the control connection tells them apart.
fn session(cli: &Cli, client: &mut Client, what: &str, flow: rina::Flow, input: &Input) -> i32 {
    let Carried {
        sent,
        received,
        end,
    } = cat::carry(flow, input, io::stdout().lock());
    let carried = format!("{sent} B sent, {received} B received");
    match end {
        End::Closed if daemon_gone(client) => {
            say(format_args!("{what}: lost the daemon ({carried})"));
            1
        }
        End::Closed => {
            if cli.verbose {
                say(format_args!("{what} closed: {carried}"));
            }
            0
        }
        End::OutputGone => {
            if cli.verbose {
                say(format_args!("{what}: standard output closed: {carried}"));
            }
            1
        }
        End::Failed(e) => {
            say(format_args!("{what} failed: {e} ({carried})"));
            1
        }
    }
}

/// Whether `client`'s daemon has gone (its control connection closed).
fn daemon_gone(client: &mut Client) -> bool {
    matches!(client.list_difs(), Err(e) if e.is_closed())
}

/// The caller: allocates a flow to the target and carries it.
fn call(cli: &Cli) -> i32 {
    let mut client = connect(cli);
    let qos = QosSpec {
        reliable: !cli.unreliable,
        in_order: !cli.unreliable,
        cube: cli.qos_cube,
        ..QosSpec::default()
    };
    let flow = client
        .allocate(&cli.name, &cli.target, cli.common.dif(), &qos)
        .unwrap_or_else(|e| die(&format!("cannot allocate a flow to {}", cli.target), &e, 2));
    let what = format!("flow {} to {}", flow.info().port, cli.target);
    let input = start_input(cli);
    session(cli, &mut client, &what, flow, &input)
}

/// The listener: registers the target and carries the flows allocated to
/// it, one (or, with --keep-listening, one after another).
fn listen(cli: &Cli) -> i32 {
    let mut client = connect(cli);
    let (name, dif) = (&cli.target, cli.common.dif());
    let difs = client
        .register(name, dif)
        .unwrap_or_else(|e| die(&format!("cannot register {name}"), &e, 2));
    if cli.verbose {
        say(format_args!("{name} registered in {}", difs.join(", ")));
    }
    let input = start_input(cli);
    loop {
        let req = client
            .next_request()
            .unwrap_or_else(|e| die(&format!("{name}: no more flow requests"), &e, 1));
        let flow = match client.accept(&req) {
            Ok(f) => f,
            Err(e) if e.is_closed() => die("lost the daemon", &e, 1),
            // Withdrawn while a session ran, say: the next may come.
            Err(e) => {
                say(format_args!(
                    "cannot accept a flow from {}: {e}",
                    req.remote
                ));
                continue;
            }
        };
        if !cli.keep_listening {
            // Later callers are refused at once, not left to time out.
            let _ = client.unregister(name, dif);
        }
        let what = format!("flow {} from {}", flow.info().port, req.remote);
        let code = session(cli, &mut client, &what, flow, &input);
        if code != 0 || !cli.keep_listening {
            return code;
        }
    }
}

fn main() {
    // SIGPIPE stays ignored (Rust's default): a closed standard output is
    // an error on write, which ends the session with exit code 1.
    rina_docgen::handle::<Cli>();
    let cli = Cli::parse();
    let code = if cli.listen { listen(&cli) } else { call(&cli) };
    std::process::exit(code)
}
