//! Command-line options shared by the tools.

use clap::Args;
use rina::{AppName, Client, QosSpec};
use std::path::PathBuf;

/// Makes a closed standard output end the tool quietly, as it ends `cat`
/// or `ping` (`rina-echo client ... | head -3`): Rust ignores `SIGPIPE`,
/// so the next `println!` would panic with "Broken pipe" instead. Flows
/// are not affected: the library sends on them with `MSG_NOSIGNAL`, so a
/// closed flow is still an error, never a signal. Called first in `main`.
pub fn quiet_on_closed_stdout() {
    // SAFETY: `signal` with `SIG_DFL` installs no handler; nothing else
    // runs yet when `main` calls it.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

/// Where the daemon is and which DIF to use.
#[derive(Debug, Clone, Default, Args)]
pub struct CommonArgs {
    /// Daemon socket (default: $RINA_SOCKET, else $XDG_RUNTIME_DIR/rinad.sock,
    /// /run/rinad.sock for root, /tmp/rinad-$UID/rinad.sock).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// DIF to register in / allocate through (default: the daemon chooses).
    #[arg(long, value_name = "NAME")]
    pub dif: Option<String>,
    /// Do not ask for shared-memory rings where the DIF offers them
    /// (shim-hv, shim-udp, normal DIFs): the flow's socket then carries
    /// every SDU.
    #[arg(long)]
    pub no_rings: bool,
}

impl CommonArgs {
    /// Connects to the daemon named by `--socket` or the default path, with
    /// rings asked for unless `--no-rings`.
    pub fn connect(&self) -> rina::Result<Client> {
        let mut c = connect(self.socket.as_deref())?;
        c.set_rings(!self.no_rings);
        Ok(c)
    }

    /// The DIF as the client API takes it.
    pub fn dif(&self) -> Option<&str> {
        self.dif.as_deref()
    }
}

/// Connects to the daemon at `socket`, or at the default path.
pub fn connect(socket: Option<&std::path::Path>) -> rina::Result<Client> {
    match socket {
        Some(p) => Client::connect_to(p),
        None => Client::connect(),
    }
}

/// QoS requirements of a flow, as command-line options.
#[derive(Debug, Clone, Default, Args)]
pub struct QosArgs {
    /// Largest acceptable one-way delay, in milliseconds (0 or more).
    #[arg(long, value_name = "MS", value_parser = parse_non_negative)]
    pub max_delay_ms: Option<f64>,
    /// Largest acceptable loss, in parts per million of SDUs.
    #[arg(long, value_name = "PPM")]
    pub max_loss_ppm: Option<u32>,
    /// Average bandwidth the flow will use, in bits per second.
    #[arg(long, value_name = "BPS")]
    pub bandwidth_bps: Option<u64>,
    /// Ask for in-order delivery.
    #[arg(long)]
    pub in_order: bool,
    /// Ask for reliable delivery (retransmission).
    #[arg(long)]
    pub reliable: bool,
    /// Largest number of consecutive SDUs that may be lost.
    #[arg(long, value_name = "N")]
    pub max_sdu_gap: Option<u32>,
    /// Largest SDU the application will write, in bytes.
    #[arg(long, value_name = "BYTES")]
    pub max_sdu: Option<u32>,
    /// Ask for this QoS cube of the DIF by its QoS-id (normal DIFs only;
    /// `rinactl rib <ipcp> /ra/qoscubes` lists them).
    #[arg(long, value_name = "ID")]
    pub qos_cube: Option<u64>,
}

impl QosArgs {
    /// The QoS spec these options ask for.
    pub fn spec(&self) -> QosSpec {
        QosSpec {
            max_delay_us: self
                .max_delay_ms
                .map(|ms| (ms.max(0.0) * 1000.0).round() as u64),
            max_loss_ppm: self.max_loss_ppm,
            avg_bandwidth_bps: self.bandwidth_bps,
            in_order: self.in_order,
            reliable: self.reliable,
            max_sdu_gap: self.max_sdu_gap,
            max_sdu_size: self.max_sdu,
            cube: self.qos_cube,
        }
    }
}

impl QosArgs {
    /// Checks that `--max-sdu`, when given, holds the largest SDU the run
    /// writes (`largest` bytes, of the kind `what` names: "probes"): the
    /// DIF is told the flow's SDUs are at most that large, so a smaller
    /// figure is a mistake (it was taken, and larger SDUs written anyway).
    pub fn check_max_sdu(&self, largest: usize, what: &str) -> Result<(), String> {
        match self.max_sdu {
            Some(m) if (m as usize) < largest => Err(format!(
                "{m} bytes is less than the {what} of {largest} bytes this run writes \
                 (--max-sdu is the largest SDU the application writes)"
            )),
            _ => Ok(()),
        }
    }
}

/// The longest time an option takes, in seconds (about 31 years): beyond
/// it a deadline would no longer fit a clock's `Instant`.
pub const MAX_SECONDS: f64 = 1e9;

/// A number of seconds for clap: finite, 0 or more, at most
/// [`MAX_SECONDS`] (`nan` or `-1` would wait for ever or panic).
pub fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=MAX_SECONDS).contains(&v) => Ok(v),
        Ok(_) => Err(format!(
            "{s} is not a number of seconds (0 or more, at most {MAX_SECONDS:e})"
        )),
        Err(e) => Err(e.to_string()),
    }
}

/// A length of time in seconds for clap: as [`parse_seconds`], and more
/// than 0.
pub fn parse_positive_seconds(s: &str) -> Result<f64, String> {
    match parse_seconds(s) {
        Ok(v) if v > 0.0 => Ok(v),
        _ => Err(format!(
            "{s} is not a length of time (more than 0 seconds, at most {MAX_SECONDS:e})"
        )),
    }
}

/// A positive, finite number for clap (a rate, an interval).
pub fn parse_positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        Ok(_) => Err(format!("{s} is not a number above 0")),
        Err(e) => Err(e.to_string()),
    }
}

/// A finite number, 0 or more, for clap (a delay bound).
pub fn parse_non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        Ok(_) => Err(format!("{s} is not a number, 0 or more")),
        Err(e) => Err(e.to_string()),
    }
}

/// Parses an application name for clap.
pub fn parse_name(s: &str) -> Result<AppName, String> {
    s.parse().map_err(|e: rina::NameError| e.to_string())
}

/// Says on stderr that a flow asked for with `--direct` is an ordinary
/// one (the daemons grant a direct flow only over shim-udp, and only when
/// the server asks for one too), so that a run is not taken for a
/// measurement of direct flows when it was not.
pub fn note_if_not_direct(tool: &str, asked: bool, flow: &rina::Flow) {
    if asked && !flow.is_direct() {
        eprintln!(
            "{tool}: --direct: flow {} in {} goes through the daemons (a direct flow needs a \
             shim-udp DIF and a server that asks for one too, with --direct)",
            flow.info().port,
            flow.info().dif
        );
    }
}

/// Prints `tool: context: error (kind)` to stderr and exits with `code`.
pub fn die(tool: &str, context: &str, err: &dyn std::fmt::Display, code: i32) -> ! {
    eprintln!("{tool}: {context}: {err}");
    std::process::exit(code)
}

/// True for a flow error after which the flow still works: only an SDU too
/// large for the buffer or the flow (that one SDU is lost). Anything else
/// (the flow closed, a failing descriptor) ends the flow's service: retrying
/// would fail the same way forever.
pub fn is_transient(e: &rina::Error) -> bool {
    e.kind() == rina::ErrorKind::SduTooLarge
}

/// The snake_case name of an error kind, as in the control protocol.
pub fn kind_name(kind: rina::ErrorKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{kind:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        q: QosArgs,
    }

    #[test]
    fn qos_options_become_a_spec() {
        let t = T::parse_from([
            "t",
            "--max-delay-ms",
            "2.5",
            "--max-loss-ppm",
            "100",
            "--bandwidth-bps",
            "1000000",
            "--in-order",
            "--max-sdu",
            "1400",
        ]);
        let q = t.q.spec();
        assert_eq!(q.max_delay_us, Some(2500));
        assert_eq!(q.max_loss_ppm, Some(100));
        assert_eq!(q.avg_bandwidth_bps, Some(1_000_000));
        assert!(q.in_order && !q.reliable);
        assert_eq!(q.max_sdu_gap, None);
        assert_eq!(q.max_sdu_size, Some(1400));
        assert_eq!(T::parse_from(["t"]).q.spec(), QosSpec::default());
    }

    #[test]
    fn numbers_out_of_range_are_refused() {
        for bad in ["nan", "inf", "-1", "1e300", "x"] {
            assert!(parse_seconds(bad).is_err(), "{bad}");
            assert!(parse_positive_seconds(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_seconds("0"), Ok(0.0));
        assert!(parse_positive_seconds("0").is_err());
        assert_eq!(parse_positive_seconds("2.5"), Ok(2.5));
        for bad in ["nan", "inf", "-1", "0"] {
            assert!(parse_positive(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_positive("1e9"), Ok(1e9));
        assert!(parse_non_negative("-0.5").is_err());
        assert!(parse_non_negative("nan").is_err());
        assert_eq!(parse_non_negative("0"), Ok(0.0));
    }

    #[test]
    fn kind_names_are_snake_case() {
        assert_eq!(
            kind_name(rina::ErrorKind::DaemonNotRunning),
            "daemon_not_running"
        );
    }
}
