//! `rina-demo`: two RINA systems on this machine, talking over a shim DIF on
//! UDP, measured with `rina-echo` and `rina-perf`.
//!
//! It needs no root and no configuration: it writes two `rinad` configs in a
//! temporary directory, starts the daemons and the servers, runs the clients,
//! prints what they measured and stops everything it started — on success,
//! on error, on Ctrl-C (SIGINT), SIGTERM and SIGHUP. Every child also gets
//! SIGTERM from the kernel if the demo dies without cleaning up (even by
//! SIGKILL), through `PR_SET_PDEATHSIG`; only the temporary directory is
//! then left behind. The binaries are taken from the directory of
//! `rina-demo` itself (the same cargo target directory) unless `--bin-dir`
//! says otherwise.
//!
//! Its options are checked before anything starts (`--echo-count` 1 to
//! 100000, test lengths above 0 and at most 3600 s), and each tool it runs
//! may take what its options ask for plus 60 s before the demo gives up.
//!
//! Exit codes: 0 if every step worked; 1 otherwise, with what failed and the
//! end of the relevant log; 128 + the signal's number when stopped by a
//! signal: 130 on Ctrl-C (SIGINT), 143 on SIGTERM, 129 on SIGHUP; 141 (as
//! for SIGPIPE) when its standard output closed (`rina-demo | head -3`),
//! quietly and also after cleaning up.

use clap::Parser;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rina::{FlowStats, IpcpInfo};
use rina_tools::echo::EchoReport;
use rina_tools::perf::{PerfReport, TestResult};
use rina_tools::table::{self, Table};
use serde::Serialize;
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Runs two RINA systems (alpha, beta) over a shim DIF on UDP/loopback and
/// measures latency and goodput between them.
#[derive(Debug, Parser)]
#[command(name = "rina-demo", version)]
struct Cli {
    /// Keep the temporary directory (configs, sockets, logs) and print its path.
    #[arg(long)]
    keep: bool,
    /// Print a machine-readable JSON summary instead of text.
    #[arg(long)]
    json: bool,
    /// Directory holding rinad, rinactl, rina-echo and rina-perf
    /// (default: the directory of this program).
    #[arg(long, value_name = "DIR")]
    bin_dir: Option<PathBuf>,
    /// Number of echo probes, 50 ms apart (1 to 100000).
    #[arg(
        long,
        default_value_t = 20,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_ECHO_COUNT))
    )]
    echo_count: u32,
    /// Length of the 1400-byte goodput test, in seconds (more than 0, at
    /// most 3600).
    #[arg(long, default_value_t = 3.0, value_parser = parse_test_seconds)]
    perf_duration_s: f64,
    /// Length of each test of the size sweep, in seconds (more than 0, at
    /// most 3600).
    #[arg(long, default_value_t = 1.0, value_parser = parse_test_seconds)]
    sweep_duration_s: f64,
}

/// Most echo probes (`--echo-count`): 83 minutes of them.
const MAX_ECHO_COUNT: u32 = 100_000;
/// Longest goodput test (`--perf-duration-s`, `--sweep-duration-s`), s.
const MAX_TEST_S: f64 = 3600.0;

/// A test's length for clap: a number of seconds above 0 and at most
/// [`MAX_TEST_S`] (not `nan`, negative or infinite), checked before
/// anything starts.
fn parse_test_seconds(s: &str) -> Result<f64, String> {
    match rina_tools::opts::parse_positive_seconds(s) {
        Ok(v) if v <= MAX_TEST_S => Ok(v),
        _ => Err(format!(
            "{s} is not a test length (more than 0 seconds, at most {MAX_TEST_S})"
        )),
    }
}

const DIF: &str = "udp.net";
/// The normal DIF the demo stacks on the shim DIF.
const NET: &str = "net";
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How much longer than it should take a tool may run before the demo
/// gives up on it.
const TOOL_MARGIN: Duration = Duration::from_secs(60);
/// Time between echo probes, and how long a reply may take.
const ECHO_INTERVAL: Duration = Duration::from_millis(50);
const ECHO_TIMEOUT: Duration = Duration::from_secs(1);

/// How long the echo client should take for `count` probes.
fn echo_time(count: u32) -> Duration {
    ECHO_INTERVAL * count + ECHO_TIMEOUT
}

/// How long the demo lets a tool run that should take `expected`.
fn tool_limit(expected: Duration) -> Duration {
    expected + TOOL_MARGIN
}
const SWEEP: &str = "64,512,1400";

/// A step that failed: what, and the logs that may say why.
#[derive(Debug)]
struct Failure {
    what: String,
    logs: Vec<PathBuf>,
}

fn fail<T>(what: impl Into<String>, logs: &[&Path]) -> Result<T, Failure> {
    Err(Failure {
        what: what.into(),
        logs: logs.iter().map(|p| p.to_path_buf()).collect(),
    })
}

/// A process the demo started.
#[derive(Debug)]
struct Proc {
    name: String,
    child: Child,
}

/// Everything to undo on exit: processes to stop, the directory to remove.
#[derive(Debug, Default)]
struct Cleanup {
    procs: Vec<Proc>,
    remove_dir: Option<PathBuf>,
    /// Set by [`Undo::run`]: a process started afterwards (by a spawn that
    /// raced with a signal) is stopped at once instead of being recorded.
    stopping: bool,
}

#[derive(Debug, Clone, Default)]
struct Undo(Arc<Mutex<Cleanup>>);

impl Undo {
    fn lock(&self) -> MutexGuard<'_, Cleanup> {
        // A panic while holding the lock leaves usable data: take it anyway.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts `exe` with output to `log` (or stdout to `out` and stderr to `log`).
    fn spawn(
        &self,
        name: &str,
        exe: &Path,
        args: &[&str],
        out: Option<&Path>,
        log: &Path,
    ) -> Result<(), Failure> {
        let open = |p: &Path| {
            File::create(p).or_else(|e| fail(format!("cannot create {}: {e}", p.display()), &[]))
        };
        let err = open(log)?;
        let stdout = match out {
            Some(p) => open(p)?,
            None => err
                .try_clone()
                .or_else(|e| fail(format!("cannot dup a log file: {e}"), &[]))?,
        };
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(err);
        let parent = std::process::id();
        // SAFETY: the closure runs in the forked child before exec and only
        // makes async-signal-safe system calls (prctl, getppid).
        unsafe {
            cmd.pre_exec(move || die_with_parent(parent));
        }
        // The lock is held from before the fork until the child is
        // recorded, so a cleanup that a signal starts meanwhile waits for it
        // and stops it with the others. (Taken after the fork, a cleanup
        // could run and exit the demo in between, leaving the new child to
        // die of its parent-death signal only after the demo was gone.)
        let mut c = self.lock();
        if c.stopping {
            return fail(format!("stopping: {name} not started"), &[]);
        }
        let child = cmd
            .spawn()
            .or_else(|e| fail(format!("cannot start {}: {e}", exe.display()), &[]))?;
        c.procs.push(Proc {
            name: name.to_owned(),
            child,
        });
        Ok(())
    }

    /// The exit status of `name` if it has exited (it is then forgotten).
    fn exited(&self, name: &str) -> Option<ExitStatus> {
        let mut c = self.lock();
        let i = c.procs.iter().position(|p| p.name == name)?;
        match c.procs[i].child.try_wait() {
            Ok(Some(st)) => {
                c.procs.remove(i);
                Some(st)
            }
            Ok(None) => None,
            Err(_) => {
                c.procs.remove(i);
                Some(ExitStatus::default())
            }
        }
    }

    /// Stops every process (SIGTERM, then SIGKILL after 2 s), waits for
    /// them, and removes the directory unless it is kept.
    fn run(&self) {
        self.lock().stop();
    }

    /// Cleans up and exits with `code`. The exit happens with the lock held,
    /// so the main thread and the signal thread never exit at the same time
    /// (the first one decides the exit code; the other one waits forever).
    fn exit(&self, code: i32) -> ! {
        let mut c = self.lock();
        c.stop();
        std::process::exit(code)
    }
}

impl Cleanup {
    fn stop(&mut self) {
        let c = self;
        c.stopping = true;
        for p in &mut c.procs {
            if let (Ok(None), Ok(pid)) = (p.child.try_wait(), i32::try_from(p.child.id())) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        for p in &mut c.procs {
            loop {
                match p.child.try_wait() {
                    Ok(None) if Instant::now() < deadline => {
                        thread::sleep(Duration::from_millis(10))
                    }
                    Ok(None) => {
                        let _ = p.child.kill();
                        let _ = p.child.wait();
                        break;
                    }
                    _ => break,
                }
            }
        }
        c.procs.clear();
        if let Some(d) = c.remove_dir.take() {
            let _ = fs::remove_dir_all(d);
        }
    }
}

/// In a child before exec: ask the kernel for SIGTERM when the parent dies.
///
/// The signal follows the *thread* that forked; the demo starts every child
/// from its main thread, which lives as long as the process.
fn die_with_parent(parent: u32) -> std::io::Result<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes an integer argument and touches
    // no memory of ours.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // The parent may have died before the prctl: then nobody would stop us.
    if u32::try_from(nix::unistd::getppid().as_raw()).ok() != Some(parent) {
        return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
    }
    Ok(())
}

/// Runs the cleanup when the demo ends, however it ends.
struct Guard(Undo);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.run();
    }
}

/// What `--json` prints.
#[derive(Debug, Serialize)]
struct Summary {
    ok: bool,
    dir: Option<PathBuf>,
    dif: String,
    alpha: String,
    beta: String,
    echo: EchoReport,
    perf: PerfReport,
    sweep: PerfReport,
    /// Echo over the normal DIF.
    echo_net: EchoReport,
    /// Reliable goodput over the normal DIF.
    perf_net: PerfReport,
    flows_during_perf_alpha: Vec<FlowStats>,
    flows_during_perf_beta: Vec<FlowStats>,
    flows_alpha: Vec<FlowStats>,
    flows_beta: Vec<FlowStats>,
    ipcps_alpha: Vec<IpcpInfo>,
    ipcps_beta: Vec<IpcpInfo>,
}

/// The exit status when standard output closed: 128 + SIGPIPE, what a
/// shell shows for a program that SIGPIPE killed.
const STDOUT_CLOSED: i32 = 128 + libc::SIGPIPE;

/// Writes `text` on standard output. If it closed (the reader of
/// `rina-demo | head -1` is gone: EPIPE, SIGPIPE being ignored, as Rust
/// sets it) or fails otherwise, the demo stops: it cleans up (stops its
/// children, removes its directory) and exits with [`STDOUT_CLOSED`],
/// quietly for a closed pipe. (Killed by SIGPIPE instead, as before, it
/// left its directory behind.)
fn emit(undo: &Undo, text: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        drop(out);
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("rina-demo: cannot write to standard output: {e}");
        }
        undo.exit(STDOUT_CLOSED);
    }
}

fn main() {
    // No `quiet_on_closed_stdout`: SIGPIPE would kill the demo before its
    // cleanup. `emit` sees the closed output and stops instead.
    rina_docgen::handle::<Cli>();
    let cli = Cli::parse();
    let undo = Undo::default();
    let handler = undo.clone();
    match signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ]) {
        Ok(mut signals) => {
            thread::spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    let name = Signal::try_from(sig).map_or("a signal", |s| s.as_str());
                    eprintln!("rina-demo: {name}, stopping everything");
                    handler.exit(128 + sig);
                }
            });
        }
        Err(e) => eprintln!("rina-demo: cannot catch SIGINT/SIGTERM/SIGHUP: {e}"),
    }
    let guard = Guard(undo.clone());
    let code = match run(&cli, &undo) {
        Ok(()) => 0,
        Err(f) => {
            eprintln!("rina-demo: FAILED: {}", f.what);
            for log in &f.logs {
                eprintln!("--- last lines of {} ---", log.display());
                eprint!("{}", tail(log, 20));
            }
            1
        }
    };
    // Exits without running the guard (`undo.exit` does its work).
    std::mem::forget(guard);
    undo.exit(code);
}

/// Runs the whole demo: sets up, starts everything, measures and reports.
fn run(cli: &Cli, undo: &Undo) -> Result<(), Failure> {
    let d = Demo::prepare(cli, undo)?;
    d.start_daemons()?;
    d.start_servers()?;
    let echo = d.echo_shim()?;
    let (perf, during_alpha, during_beta) = d.perf_shim()?;
    let (echo_net, perf_net) = d.over_net()?;
    let sweep = d.sweep()?;
    let end = d.end_state()?;
    d.check_running()?;

    let summary = Summary {
        ok: true,
        dir: cli.keep.then(|| d.dir.clone()),
        dif: DIF.into(),
        alpha: d.alpha_addr,
        beta: d.beta_addr,
        echo,
        perf,
        sweep,
        echo_net,
        perf_net,
        flows_during_perf_alpha: during_alpha,
        flows_during_perf_beta: during_beta,
        flows_alpha: end.flows_alpha,
        flows_beta: end.flows_beta,
        ipcps_alpha: end.ipcps_alpha,
        ipcps_beta: end.ipcps_beta,
    };
    if cli.json {
        match serde_json::to_string_pretty(&summary) {
            Ok(s) => emit(undo, &format!("{s}\n")),
            Err(e) => return fail(format!("cannot encode the summary: {e}"), &[]),
        }
    } else {
        emit(undo, &summary_text(cli, &summary).unwrap_or_default());
    }
    Ok(())
}

/// The demo's setting: its programs, its directory and the files and
/// addresses of both systems.
struct Demo<'a> {
    cli: &'a Cli,
    undo: &'a Undo,
    bins: Bins,
    dir: PathBuf,
    alpha_addr: String,
    beta_addr: String,
    alpha_sock: PathBuf,
    beta_sock: PathBuf,
    alpha_log: PathBuf,
    beta_log: PathBuf,
    echo_log: PathBuf,
    perf_log: PathBuf,
}

/// What `rinactl` shows on both systems at the end.
struct EndState {
    flows_alpha: Vec<FlowStats>,
    flows_beta: Vec<FlowStats>,
    ipcps_alpha: Vec<IpcpInfo>,
    ipcps_beta: Vec<IpcpInfo>,
}

impl<'a> Demo<'a> {
    /// Finds the programs, makes the directory, picks two UDP ports and
    /// writes both `rinad` configs.
    fn prepare(cli: &'a Cli, undo: &'a Undo) -> Result<Demo<'a>, Failure> {
        let bins = find_bins(cli.bin_dir.as_deref())?;
        let dir = make_temp_dir()?;
        if !cli.keep {
            undo.lock().remove_dir = Some(dir.clone());
        } else if !cli.json {
            emit(
                undo,
                &format!("working directory (kept): {}\n", dir.display()),
            );
        }

        // Two free UDP ports from below the kernel's ephemeral range (see
        // rina::ports), distinct.
        let port = || {
            rina::ports::unused_loopback_udp_port()
                .or_else(|e| fail(format!("cannot find a free UDP port: {e}"), &[]))
        };
        let (pa, pb) = (port()?, port()?);
        let alpha_addr = format!("127.0.0.1:{pa}");
        let beta_addr = format!("127.0.0.1:{pb}");
        let p = |f: &str| dir.join(f);
        write(
            &p("alpha.toml"),
            &config(
                "alpha",
                1,
                &alpha_addr,
                &[("echo", &beta_addr), ("perf", &beta_addr)],
                ("beta", 2, &beta_addr),
            ),
        )?;
        write(
            &p("beta.toml"),
            &config(
                "beta",
                2,
                &beta_addr,
                &[("echo-client", &alpha_addr), ("perf-client", &alpha_addr)],
                ("alpha", 1, &alpha_addr),
            ),
        )?;
        Ok(Demo {
            cli,
            undo,
            bins,
            alpha_sock: p("alpha.sock"),
            beta_sock: p("beta.sock"),
            alpha_log: p("alpha.log"),
            beta_log: p("beta.log"),
            echo_log: p("echo-server.log"),
            perf_log: p("perf-server.log"),
            dir,
            alpha_addr,
            beta_addr,
        })
    }

    /// Starts `rinad` alpha and beta and waits until both answer.
    fn start_daemons(&self) -> Result<(), Failure> {
        self.say(&format!(
            "starting rinad alpha ({}) and beta ({}) in {}",
            self.alpha_addr,
            self.beta_addr,
            self.dir.display()
        ));
        for (name, sock, log) in [
            ("alpha", &self.alpha_sock, &self.alpha_log),
            ("beta", &self.beta_sock, &self.beta_log),
        ] {
            let cfg = self.dir.join(format!("{name}.toml"));
            self.undo.spawn(
                name,
                &self.bins.rinad,
                &["--config", s(&cfg), "--socket", s(sock)],
                None,
                log,
            )?;
        }
        wait_ready(self.undo, "alpha", &self.alpha_sock, &self.alpha_log)?;
        wait_ready(self.undo, "beta", &self.beta_sock, &self.beta_log)
    }

    /// Starts the echo and perf servers on beta and waits until both are
    /// registered.
    fn start_servers(&self) -> Result<(), Failure> {
        self.say("starting rina-echo server and rina-perf server on beta");
        let beta_s = s(&self.beta_sock);
        self.undo.spawn(
            "echo-server",
            &self.bins.echo,
            &["server", "--socket", beta_s, "--name", "echo"],
            None,
            &self.echo_log,
        )?;
        self.undo.spawn(
            "perf-server",
            &self.bins.perf,
            &["server", "--socket", beta_s, "--name", "perf"],
            None,
            &self.perf_log,
        )?;
        wait_registered(
            self.undo,
            &self.beta_sock,
            &[
                ("echo-server", &self.echo_log),
                ("perf-server", &self.perf_log),
            ],
            &self.beta_log,
        )
    }

    /// Says what the demo does next (not with `--json`).
    fn say(&self, msg: &str) {
        if !self.cli.json {
            emit(self.undo, &format!("* {msg}\n"));
        }
    }

    /// Runs `name` (a tool of [`Bins`]) to completion, calling `during`
    /// every 250 ms; returns its standard output. Fails if it runs
    /// [`TOOL_MARGIN`] longer than `expected`.
    fn tool(
        &self,
        name: &str,
        exe: &Path,
        args: &[&str],
        logs: &[&Path],
        expected: Duration,
        during: &mut dyn FnMut(),
    ) -> Result<String, Failure> {
        let out = self.dir.join(format!("{name}.out"));
        let err = self.dir.join(format!("{name}.log"));
        self.undo.spawn(name, exe, args, Some(&out), &err)?;
        let limit = tool_limit(expected);
        let deadline = Instant::now() + limit;
        let mut all_logs: Vec<&Path> = vec![&err];
        all_logs.extend_from_slice(logs);
        let mut next_call = Instant::now() + Duration::from_millis(250);
        let status = loop {
            if let Some(st) = self.undo.exited(name) {
                break st;
            }
            if Instant::now() >= next_call {
                during();
                next_call = Instant::now() + Duration::from_millis(250);
            }
            if Instant::now() > deadline {
                return fail(
                    format!(
                        "{name} did not finish within {:.1} s ({:.1} s expected, plus {} s)",
                        limit.as_secs_f64(),
                        expected.as_secs_f64(),
                        TOOL_MARGIN.as_secs()
                    ),
                    &all_logs,
                );
            }
            thread::sleep(Duration::from_millis(20));
        };
        let text = fs::read_to_string(&out).unwrap_or_default();
        if !status.success() {
            return fail(
                format!(
                    "{name} failed ({status}): {} {}",
                    exe.display(),
                    args.join(" ")
                ),
                &all_logs,
            );
        }
        Ok(text)
    }

    /// rina-echo from alpha, through the DIF the daemon chooses or `dif`.
    fn echo_client(&self, dif: Option<&str>) -> Result<EchoReport, Failure> {
        let count = self.cli.echo_count.to_string();
        let interval = ECHO_INTERVAL.as_millis().to_string();
        let timeout = ECHO_TIMEOUT.as_millis().to_string();
        let mut args = vec!["client", "--socket", s(&self.alpha_sock)];
        if let Some(d) = dif {
            args.extend(["--dif", d]);
        }
        args.extend([
            "--dst",
            "echo",
            "--count",
            &count,
            "--interval-ms",
            &interval,
            "--timeout-ms",
            &timeout,
            "--json",
        ]);
        let name = dif.map_or("echo-client".to_string(), |d| format!("echo-client-{d}"));
        let out = self.tool(
            &name,
            &self.bins.echo,
            &args,
            &[&self.alpha_log, &self.beta_log, &self.echo_log],
            echo_time(self.cli.echo_count),
            &mut || {},
        )?;
        parse(&out, "rina-echo client")
    }

    /// Echo over the shim DIF; fails if no reply came back.
    fn echo_shim(&self) -> Result<EchoReport, Failure> {
        self.say(&format!(
            "alpha: rina-echo client, {} probes 50 ms apart",
            self.cli.echo_count
        ));
        let echo = self.echo_client(None)?;
        if echo.received == 0 {
            return fail(
                "rina-echo client got no reply from beta",
                &[&self.alpha_log, &self.beta_log, &self.echo_log],
            );
        }
        Ok(echo)
    }

    /// Goodput of 1400-byte SDUs over the shim DIF, with the last flow
    /// tables of alpha and beta seen while it ran.
    fn perf_shim(&self) -> Result<(PerfReport, Vec<FlowStats>, Vec<FlowStats>), Failure> {
        let secs = format!("{}", self.cli.perf_duration_s);
        self.say(&format!(
            "alpha: rina-perf client, 1400-byte SDUs for {secs} s"
        ));
        // The flows are gone once the clients exit: show their counters as the
        // daemons saw them during the goodput test.
        let mut during_alpha: Vec<FlowStats> = Vec::new();
        let mut during_beta: Vec<FlowStats> = Vec::new();
        let perf = self.perf_client(
            "perf-client",
            &["--size", "1400", "--duration-s", &secs],
            "rina-perf client",
            Duration::from_secs_f64(self.cli.perf_duration_s),
            &mut || {
                for (sock, keep) in [
                    (&self.alpha_sock, &mut during_alpha),
                    (&self.beta_sock, &mut during_beta),
                ] {
                    if let Ok(f) = ctl_client(sock).and_then(|mut c| c.list_flows()) {
                        if !f.is_empty() {
                            *keep = f;
                        }
                    }
                }
            },
        )?;
        Ok((perf, during_alpha, during_beta))
    }

    /// Echo and reliable goodput over the normal DIF, once it has a route.
    fn over_net(&self) -> Result<(EchoReport, PerfReport), Failure> {
        wait_net(self.undo, "alpha", &self.alpha_sock, &self.alpha_log)?;
        self.say(&format!(
            "alpha: rina-echo client over the normal DIF {NET} (stacked on {DIF})"
        ));
        let echo_net = self.echo_client(Some(NET))?;
        let secs_net = format!("{}", self.cli.perf_duration_s);
        self.say(&format!(
            "alpha: rina-perf client --reliable over {NET}, 1400-byte SDUs for {secs_net} s"
        ));
        let perf_net = self.perf_client(
            "perf-client-net",
            &[
                "--dif",
                NET,
                "--size",
                "1400",
                "--duration-s",
                &secs_net,
                "--reliable",
            ],
            "rina-perf client --dif net",
            Duration::from_secs_f64(self.cli.perf_duration_s),
            &mut || {},
        )?;
        Ok((echo_net, perf_net))
    }

    /// Goodput over the shim DIF for each size of [`SWEEP`].
    fn sweep(&self) -> Result<PerfReport, Failure> {
        let secs = format!("{}", self.cli.sweep_duration_s);
        self.say(&format!(
            "alpha: rina-perf client --sweep {SWEEP}, {secs} s each"
        ));
        self.perf_client(
            "perf-sweep",
            &["--sweep", SWEEP, "--duration-s", &secs],
            "rina-perf client --sweep",
            Duration::from_secs_f64(self.cli.sweep_duration_s) * SWEEP.split(',').count() as u32,
            &mut || {},
        )
    }

    /// Runs `rina-perf client` from alpha against beta's `perf` server with
    /// `extra` arguments, for `expected`, calling `during` while it runs;
    /// parses its JSON report (`what` names it in errors).
    fn perf_client(
        &self,
        name: &str,
        extra: &[&str],
        what: &str,
        expected: Duration,
        during: &mut dyn FnMut(),
    ) -> Result<PerfReport, Failure> {
        let mut args = vec!["client", "--socket", s(&self.alpha_sock), "--dst", "perf"];
        args.extend_from_slice(extra);
        args.push("--json");
        let out = self.tool(
            name,
            &self.bins.perf,
            &args,
            &[&self.alpha_log, &self.beta_log, &self.perf_log],
            expected,
            during,
        )?;
        parse(&out, what)
    }

    /// Runs `rinactl --json WHAT` on system `name`; returns its output.
    fn ctl(&self, name: &str, sock: &Path, what: &str, log: &Path) -> Result<String, Failure> {
        self.tool(
            &format!("rinactl-{name}-{what}"),
            &self.bins.ctl,
            &["--socket", s(sock), "--json", what],
            &[log],
            Duration::ZERO,
            &mut || {},
        )
    }

    /// The flows and IPC processes of alpha and beta, from `rinactl`.
    fn end_state(&self) -> Result<EndState, Failure> {
        let (alpha_sock, alpha_log) = (&self.alpha_sock, &self.alpha_log);
        let (beta_sock, beta_log) = (&self.beta_sock, &self.beta_log);
        let flows_alpha: Vec<FlowStats> = parse(
            &self.ctl("alpha", alpha_sock, "flows", alpha_log)?,
            "rinactl flows",
        )?;
        let flows_beta: Vec<FlowStats> = parse(
            &self.ctl("beta", beta_sock, "flows", beta_log)?,
            "rinactl flows",
        )?;
        let ipcps_alpha: Vec<IpcpInfo> = parse(
            &self.ctl("alpha", alpha_sock, "ipcps", alpha_log)?,
            "rinactl ipcps",
        )?;
        let ipcps_beta: Vec<IpcpInfo> = parse(
            &self.ctl("beta", beta_sock, "ipcps", beta_log)?,
            "rinactl ipcps",
        )?;
        Ok(EndState {
            flows_alpha,
            flows_beta,
            ipcps_alpha,
            ipcps_beta,
        })
    }

    /// Fails if a daemon or a server exited during the demo.
    fn check_running(&self) -> Result<(), Failure> {
        for (name, log) in [
            ("alpha", &self.alpha_log),
            ("beta", &self.beta_log),
            ("echo-server", &self.echo_log),
            ("perf-server", &self.perf_log),
        ] {
            if let Some(st) = self.undo.exited(name) {
                return fail(format!("{name} exited during the demo ({st})"), &[log]);
            }
        }
        Ok(())
    }
}

/// The text summary (without `--json`).
fn summary_text(cli: &Cli, s: &Summary) -> Result<String, std::fmt::Error> {
    let mut o = String::new();
    writeln!(o)?;
    writeln!(
        o,
        "=== RINA demo: alpha ({}) <-> beta ({}): shim-udp DIF {} and a normal DIF on top ===",
        s.alpha, s.beta, s.dif
    )?;
    let e = &s.echo;
    writeln!(o)?;
    writeln!(
        o,
        "echo: {} probes of {} bytes, 50 ms apart",
        e.sent, e.size
    )?;
    writeln!(
        o,
        "  received {}/{}, loss {:.1}%",
        e.received, e.sent, e.loss_pct
    )?;
    if let Some(r) = e.rtt_ms {
        writeln!(
            o,
            "  rtt min/avg/p99/max = {:.3}/{:.3}/{:.3}/{:.3} ms (p50 {:.3}, mdev {:.3})",
            r.min, r.avg, r.p99, r.max, r.p50, r.mdev
        )?;
    }
    writeln!(o)?;
    writeln!(o, "goodput: 1400-byte SDUs for {} s", cli.perf_duration_s)?;
    for t in &s.perf.tests {
        writeln!(
            o,
            "  sender   {:>9.2} Mb/s  {:>9.0} SDU/s  ({} SDUs)",
            t.tx_mbps, t.tx_sdus_per_s, t.sent_sdus
        )?;
        writeln!(
            o,
            "  receiver {:>9.2} Mb/s  {:>9.0} SDU/s  ({} SDUs, loss {:.2}%)",
            t.rx_mbps, t.rx_sdus_per_s, t.report.recv_sdus, t.loss_pct
        )?;
    }
    let e = &s.echo_net;
    writeln!(o)?;
    writeln!(
        o,
        "over the normal DIF {NET} (EFCP, RMT, stacked on {}): echo {} probes",
        s.dif, e.sent
    )?;
    writeln!(
        o,
        "  received {}/{}, loss {:.1}%",
        e.received, e.sent, e.loss_pct
    )?;
    if let Some(r) = e.rtt_ms {
        writeln!(
            o,
            "  rtt min/avg/p99/max = {:.3}/{:.3}/{:.3}/{:.3} ms (p50 {:.3}, mdev {:.3})",
            r.min, r.avg, r.p99, r.max, r.p50, r.mdev
        )?;
    }
    for t in &s.perf_net.tests {
        writeln!(
            o,
            "  reliable goodput {:>9.2} Mb/s, {} of {} SDUs delivered in order",
            t.rx_mbps, t.report.recv_sdus, t.sent_sdus
        )?;
    }
    writeln!(o)?;
    writeln!(
        o,
        "size sweep over {} ({} s per size):",
        s.dif, cli.sweep_duration_s
    )?;
    write!(o, "{}", indent(&sweep_table(&s.sweep.tests).render()))?;
    for (name, flows) in [
        ("alpha", &s.flows_during_perf_alpha),
        ("beta", &s.flows_during_perf_beta),
    ] {
        writeln!(o)?;
        writeln!(
            o,
            "flows on {name} during the goodput test (last `rinactl flows` snapshot):"
        )?;
        if flows.is_empty() {
            writeln!(o, "  (no snapshot taken)")?;
        } else {
            write!(o, "{}", indent(&table::flows(flows).render()))?;
        }
    }
    for (name, flows) in [("alpha", &s.flows_alpha), ("beta", &s.flows_beta)] {
        writeln!(o)?;
        writeln!(o, "flows on {name} at the end (rinactl flows):")?;
        if flows.is_empty() {
            writeln!(o, "  (none: the clients closed theirs)")?;
        } else {
            write!(o, "{}", indent(&table::flows(flows).render()))?;
        }
    }
    for (name, ipcps) in [("alpha", &s.ipcps_alpha), ("beta", &s.ipcps_beta)] {
        writeln!(o)?;
        writeln!(o, "IPC processes on {name} (rinactl ipcps):")?;
        write!(o, "{}", indent(&table::ipcps(ipcps).render()))?;
    }
    writeln!(o)?;
    match &s.dir {
        Some(d) => writeln!(o, "configs, sockets and logs kept in {}", d.display())?,
        None => writeln!(
            o,
            "all processes stopped; run with --keep to keep configs and logs"
        )?,
    }
    Ok(o)
}

fn sweep_table(tests: &[TestResult]) -> Table {
    let mut t = Table::new(&[
        "SIZE", "SENT", "RECV", "LOSS%", "TX_Mb/s", "RX_Mb/s", "RX_SDU/s",
    ])
    .numeric(&[0, 1, 2, 3, 4, 5, 6]);
    for r in tests {
        t.row(vec![
            r.size.to_string(),
            r.sent_sdus.to_string(),
            r.report.recv_sdus.to_string(),
            format!("{:.2}", r.loss_pct),
            format!("{:.2}", r.tx_mbps),
            format!("{:.2}", r.rx_mbps),
            format!("{:.0}", r.rx_sdus_per_s),
        ]);
    }
    t
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("  {l}\n")).collect()
}

/// The programs the demo runs.
struct Bins {
    rinad: PathBuf,
    ctl: PathBuf,
    echo: PathBuf,
    perf: PathBuf,
}

fn find_bins(dir: Option<&Path>) -> Result<Bins, Failure> {
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => {
            let exe = std::env::current_exe()
                .or_else(|e| fail(format!("cannot find where rina-demo is: {e}"), &[]))?;
            match exe.parent() {
                Some(d) => d.to_path_buf(),
                None => return fail("cannot find where rina-demo is", &[]),
            }
        }
    };
    let find = |name: &str| {
        let p = dir.join(name);
        if p.is_file() {
            Ok(p)
        } else {
            fail(
                format!(
                    "{} not found; build the whole workspace first: cargo build --release",
                    p.display()
                ),
                &[],
            )
        }
    };
    Ok(Bins {
        rinad: find("rinad")?,
        ctl: find("rinactl")?,
        echo: find("rina-echo")?,
        perf: find("rina-perf")?,
    })
}

fn make_temp_dir() -> Result<PathBuf, Failure> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let base = std::env::temp_dir();
    for i in 0..100u32 {
        let d = base.join(format!(
            "rina-demo-{}-{:08x}",
            std::process::id(),
            nanos.wrapping_add(i)
        ));
        if d.to_str().is_none() {
            return fail(
                format!(
                    "the temporary directory {} is not UTF-8; set TMPDIR",
                    d.display()
                ),
                &[],
            );
        }
        match fs::create_dir(&d) {
            Ok(()) => return Ok(d),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return fail(format!("cannot create {}: {e}", d.display()), &[]),
        }
    }
    fail(
        format!("cannot create a directory in {}", base.display()),
        &[],
    )
}

/// A `rinad` config: one shim-udp IPCP bound to `bind`, with a directory.
/// A system with a shim DIF over UDP and a normal DIF over it, whose only
/// neighbour is `peer` (name, address, UDP address); the servers live at
/// address 2 (beta).
fn config(
    system: &str,
    address: u64,
    bind: &str,
    directory: &[(&str, &str)],
    peer: (&str, u64, &str),
) -> String {
    let (peer, peer_address, peer_bind) = peer;
    let mut s = format!(
        "[system]\nname = \"{system}\"\n\n[[ipcp]]\nname = \"{system}.udp\"\ntype = \"shim-udp\"\ndif = \"{DIF}\"\nbind = \"{bind}\"\n\n[ipcp.directory]\n"
    );
    for (name, addr) in directory {
        s.push_str(&format!("\"{name}\" = \"{addr}\"\n"));
    }
    s.push_str(&format!("\"{peer}.{NET}\" = \"{peer_bind}\"\n"));
    s.push_str(&format!(
        "\n[[ipcp]]\nname = \"{system}.{NET}\"\ntype = \"normal\"\ndif = \"{NET}\"\naddress = {address}\nrouting = \"link-state\"\n\n[[ipcp.neighbor]]\nname = \"{peer}.{NET}\"\nover = \"{DIF}\"\naddress = {peer_address}\n\n[ipcp.names]\n\"echo\" = 2\n\"perf\" = 2\n"
    ));
    s
}

/// Waits until `system`'s normal IPCP has a route to its neighbour.
fn wait_net(undo: &Undo, system: &str, sock: &Path, log: &Path) -> Result<(), Failure> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let ipcp = format!("{system}.{NET}");
    while Instant::now() < deadline {
        if let Some(st) = undo.exited(system) {
            return fail(format!("rinad {system} exited ({st})"), &[log]);
        }
        if let Ok(list) = ctl_client(sock).and_then(|mut c| c.list_ipcps()) {
            let routed = list.iter().any(|i| {
                i.name == ipcp && i.counters.get("routing_destinations").copied().unwrap_or(0) >= 1
            });
            if routed {
                return Ok(());
            }
        }
        thread::sleep(Duration::from_millis(50));
    }
    fail(
        format!("the normal DIF {NET} did not come up on {system} within 10 s"),
        &[log],
    )
}

fn write(path: &Path, text: &str) -> Result<(), Failure> {
    fs::write(path, text).or_else(|e| fail(format!("cannot write {}: {e}", path.display()), &[]))
}

fn s(p: &Path) -> &str {
    // Paths under the temporary directory, checked to be UTF-8 when made.
    p.to_str().unwrap_or("")
}

/// A control connection for the demo's own queries: a stuck daemon makes
/// them fail in 2 s, well within the demo's step timeouts.
fn ctl_client(sock: &Path) -> rina::Result<rina::Client> {
    rina::Client::connect_to_timeout(sock, Some(Duration::from_secs(2)))
}

/// Waits until the daemon `name` answers `list_ipcps` on `sock`.
fn wait_ready(undo: &Undo, name: &str, sock: &Path, log: &Path) -> Result<(), Failure> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut last = String::from("no answer");
    while Instant::now() < deadline {
        if let Some(st) = undo.exited(name) {
            return fail(format!("rinad {name} exited at start ({st})"), &[log]);
        }
        match ctl_client(sock).and_then(|mut c| c.list_ipcps()) {
            Ok(_) => return Ok(()),
            Err(e) => last = e.to_string(),
        }
        thread::sleep(Duration::from_millis(50));
    }
    fail(
        format!(
            "rinad {name} did not answer on {} within {} s: {last}",
            sock.display(),
            READY_TIMEOUT.as_secs()
        ),
        &[log],
    )
}

/// Waits until `echo` and `perf` are registered on beta.
fn wait_registered(
    undo: &Undo,
    sock: &Path,
    servers: &[(&str, &Path)],
    daemon_log: &Path,
) -> Result<(), Failure> {
    let deadline = Instant::now() + READY_TIMEOUT;
    while Instant::now() < deadline {
        for (name, log) in servers {
            if let Some(st) = undo.exited(name) {
                return fail(format!("{name} exited at start ({st})"), &[log, daemon_log]);
            }
        }
        if let Ok(names) = ctl_client(sock).and_then(|mut c| c.list_names()) {
            let has = |n: &str| names.iter().any(|i| i.name.process_name == n);
            if has("echo") && has("perf") {
                return Ok(());
            }
        }
        thread::sleep(Duration::from_millis(50));
    }
    let mut logs: Vec<&Path> = servers.iter().map(|(_, l)| *l).collect();
    logs.push(daemon_log);
    fail(
        "the echo and perf servers did not register on beta within 10 s",
        &logs,
    )
}

fn parse<T: serde::de::DeserializeOwned>(text: &str, what: &str) -> Result<T, Failure> {
    serde_json::from_str(text).or_else(|e| {
        fail(
            format!(
                "cannot read the JSON output of {what}: {e}; it was: {}",
                text.trim()
            ),
            &[],
        )
    })
}

/// The last `n` lines of a file (or why it cannot be read).
fn tail(path: &Path, n: usize) -> String {
    match fs::read(path) {
        Ok(b) => {
            let text = String::from_utf8_lossy(&b);
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(n);
            let mut s = lines[from..].join("\n");
            if !s.is_empty() {
                s.push('\n');
            }
            if s.is_empty() {
                "(empty)\n".into()
            } else {
                s
            }
        }
        Err(e) => format!("(cannot read: {e})\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The limits follow the options: 1900 probes take 95 s, which the
    /// fixed 90 s limit cut short after the daemons had run for it.
    #[test]
    fn a_tools_limit_follows_what_it_was_asked_to_do() {
        assert_eq!(echo_time(1900), Duration::from_secs(96));
        assert!(tool_limit(echo_time(MAX_ECHO_COUNT)) > Duration::from_secs(5000));
        let hour = Duration::from_secs_f64(MAX_TEST_S);
        assert_eq!(tool_limit(hour), hour + TOOL_MARGIN);
        assert_eq!(tool_limit(Duration::ZERO), TOOL_MARGIN);
    }

    #[test]
    fn test_lengths_are_positive_finite_and_bounded() {
        assert_eq!(parse_test_seconds("0.25"), Ok(0.25));
        assert_eq!(parse_test_seconds("3600"), Ok(3600.0));
        for bad in ["0", "-1", "nan", "inf", "3600.5", "x"] {
            let e = parse_test_seconds(bad).unwrap_err();
            assert!(e.starts_with(&format!("{bad} is not a test length")), "{e}");
        }
    }
}
