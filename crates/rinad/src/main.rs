//! `rinad`: the RINA daemon of one system.
//!
//! It hosts the IPC Manager and every IPC process of the machine, reads one
//! TOML file that declares them, and serves applications and management
//! tools on a Unix socket. See `config` for the file and `daemon` for the
//! event loop.

mod daemon;
mod sys;
mod udp_batch;

use clap::Parser;
use rinad::config;
use std::path::PathBuf;
use std::process::ExitCode;

/// The RINA daemon: IPC Manager and IPC processes of one system.
///
/// rinad reads one TOML file that declares the system's IPC processes
/// (shim-udp, shim-eth, shim-hv and normal IPCPs, their DIFs, neighbours,
/// QoS cubes and policies), creates them, and serves applications and the
/// management tools (rinactl, rina-echo, rina-perf, rina-tgen, rina-ip,
/// rina-gw, rina-cat) on a Unix control socket. Unknown keys and bad
/// values in the file are errors that name the key and the line;
/// `--check` only checks the file.
/// The file may hold only `[system]`: `rinactl ipcp create` and the other
/// management commands build and change the system at run time. SIGHUP
/// (or `rinactl reload`) reads the file again and applies the difference;
/// a file with a mistake changes nothing. It stops cleanly on SIGINT or
/// SIGTERM.
#[derive(Parser, Debug)]
#[command(
    version,
    about,
    after_long_help = "Files and environment:\n  /etc/rina/rinad.toml  the default configuration file\n  RINA_SOCKET           the control socket when neither --socket nor the file's [system] socket says; \n                        otherwise $XDG_RUNTIME_DIR/rinad.sock, /run/rinad.sock for root,\n                        else /tmp/rinad-$UID/rinad.sock\n\nSee also: rinactl(1), rina-echo(1), rina-perf(1), rina-tgen(1), rina-ip(1), rina-gw(1), rina-cat(1), rina-lab(1)."
)]
struct Cli {
    /// Configuration file.
    #[arg(short, long, default_value = config::DEFAULT_CONFIG)]
    config: PathBuf,
    /// Control socket path (overrides the file and $RINA_SOCKET).
    #[arg(short, long)]
    socket: Option<PathBuf>,
    /// Log filter: error, warn, info, debug, trace, or a tracing directive
    /// such as `rinad=debug`.
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Check the configuration file and exit.
    #[arg(long)]
    check: bool,
}

/// The log filter `--log-level` gives. A bare word must be a level: tracing
/// would take `--log-level bogus` as a target named `bogus` and log
/// nothing else.
fn log_filter(spec: &str) -> Result<tracing_subscriber::EnvFilter, String> {
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    for d in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if !d.contains('=') && !LEVELS.contains(&d.to_ascii_lowercase().as_str()) {
            return Err(format!(
                "`{d}` is not a level ({}); a target's level is TARGET=LEVEL, e.g. rinad=debug",
                LEVELS.join(", ")
            ));
        }
    }
    tracing_subscriber::EnvFilter::try_new(spec).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    // `rinad --generate-docs DIR`: its man page and completions (hidden).
    rina_docgen::handle::<Cli>();
    let cli = Cli::parse();
    let filter = match log_filter(&cli.log_level) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("rinad: bad --log-level {:?}: {e}", cli.log_level);
            return ExitCode::from(2);
        }
    };
    // Colours only for a terminal: a log file gets plain text.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cfg = match config::Config::load(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rinad: configuration refused: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.check {
        println!("{}: ok ({} IPCPs)", cli.config.display(), cfg.ipcps.len());
        return ExitCode::SUCCESS;
    }
    let socket = cli
        .socket
        .or_else(|| cfg.system.socket.clone())
        .unwrap_or_else(rina_wire::ctl::default_socket_path);
    let result = daemon::Daemon::new(&cfg, cli.config.clone(), socket).and_then(|d| d.run());
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rinad: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::log_filter;

    #[test]
    fn a_log_level_is_a_level_or_target_equals_level() {
        for ok in [
            "warn",
            "DEBUG",
            "rinad=debug,info",
            "rina_core::normal=trace",
        ] {
            assert!(log_filter(ok).is_ok(), "{ok}");
        }
        let e = log_filter("bogus").unwrap_err();
        assert!(e.contains("`bogus` is not a level"), "{e}");
        assert!(log_filter("info,verbose").is_err());
    }
}
