//! The main job end to end: `rina-demo` with real `rinad` processes, and the
//! promise that it stops everything it started, also on Ctrl-C, SIGTERM and
//! SIGHUP and when its output closes, and that even SIGKILL of the demo
//! takes its children down.

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

mod common;

use common::bin_dir;

const DEMO: &str = env!("CARGO_BIN_EXE_rina-demo");

/// Live processes (pid, command line) that belong to the demo with this
/// pid (its temporary directory is named after it).
fn leftovers(pid: u32) -> Vec<(i32, String)> {
    let tag = format!("rina-demo-{pid}-");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let p: i32 = e.file_name().to_str()?.parse().ok()?;
            let b = std::fs::read(e.path().join("cmdline")).ok()?;
            Some((p, String::from_utf8_lossy(&b).replace('\0', " ")))
        })
        .filter(|(_, c)| c.contains(&tag))
        .collect()
}

fn temp_dirs(pid: u32) -> Vec<PathBuf> {
    let tag = format!("rina-demo-{pid}-");
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&tag))
        .map(|e| e.path())
        .collect()
}

/// A running demo, its progress lines ("* ...") as they are printed.
struct Demo {
    pid: u32,
    lines: mpsc::Receiver<String>,
    exit: mpsc::Receiver<ExitStatus>,
}

/// Starts `rina-demo` with the tools of this build and `args`, its
/// standard output piped and its standard error to `stderr`.
fn spawn_demo(args: &[&str], stderr: Stdio) -> Child {
    Command::new(DEMO)
        .arg("--bin-dir")
        .arg(bin_dir())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("start rina-demo")
}

impl Demo {
    /// Starts the demo with a long goodput test, so it can be stopped in it.
    fn start() -> Demo {
        let mut child = spawn_demo(&["--perf-duration-s", "30"], Stdio::null());
        let pid = child.id();
        let stdout = child.stdout.take().expect("stdout");
        let (line_tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for l in BufReader::new(stdout).lines() {
                let Ok(l) = l else { return };
                if line_tx.send(l).is_err() {
                    return;
                }
            }
        });
        let (exit_tx, exit) = mpsc::channel();
        thread::spawn(move || {
            let _ = exit_tx.send(child.wait().expect("wait for rina-demo"));
        });
        Demo { pid, lines, exit }
    }

    /// Waits (at most `timeout`) for the demo to print a line containing `what`.
    fn wait_for_line(&self, what: &str, timeout: Duration) {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(what) => return,
                Ok(_) => {}
                Err(e) => {
                    self.kill();
                    panic!("no line with {what:?} from rina-demo within {timeout:?}: {e}")
                }
            }
        }
    }

    /// Waits (at most `timeout`) for the demo to exit.
    fn wait_exit(&self, timeout: Duration) -> ExitStatus {
        match self.exit.recv_timeout(timeout) {
            Ok(st) => st,
            Err(e) => {
                self.kill();
                panic!("rina-demo did not exit within {timeout:?}: {e}")
            }
        }
    }

    fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.pid as i32), sig).expect("signal rina-demo");
    }

    fn kill(&self) {
        let _ = kill(Pid::from_raw(self.pid as i32), Signal::SIGKILL);
    }
}

#[test]
fn the_demo_measures_and_cleans_up() {
    let child = spawn_demo(
        &[
            "--json",
            "--echo-count",
            "5",
            "--perf-duration-s",
            "0.5",
            "--sweep-duration-s",
            "0.2",
        ],
        Stdio::piped(),
    );
    let pid = child.id();
    let out = child.wait_with_output().expect("run rina-demo");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "rina-demo failed: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON summary");
    assert_eq!(v["ok"], true);
    assert_eq!(v["echo"]["sent"], 5);
    assert!(
        v["echo"]["received"].as_u64().unwrap() >= 4,
        "{}",
        v["echo"]
    );
    let perf = &v["perf"]["tests"][0];
    assert_eq!(perf["size"], 1400);
    assert!(
        perf["report"]["recv_sdus"].as_u64().unwrap() > 100,
        "{perf}"
    );
    assert!(perf["rx_mbps"].as_f64().unwrap() > 1.0, "{perf}");
    let sweep: Vec<u64> = v["sweep"]["tests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["size"].as_u64().unwrap())
        .collect();
    assert_eq!(sweep, vec![64, 512, 1400]);
    assert!(
        v["echo_net"]["received"].as_u64().unwrap() >= 4,
        "{}",
        v["echo_net"]
    );
    let net = &v["perf_net"]["tests"][0];
    assert!(net["report"]["recv_sdus"].as_u64().unwrap() > 100, "{net}");
    assert_eq!(net["loss_pct"], 0.0, "a reliable flow loses nothing: {net}");
    let names = &v["ipcps_beta"][0]["names"];
    let names: Vec<&str> = names
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n.as_str())
        .collect();
    assert!(
        names.contains(&"echo") && names.contains(&"perf") && names.contains(&"beta.net"),
        "beta's shim holds echo, perf and its normal IPCP's name: {names:?}"
    );
    // Without --keep nothing is left: no process, no directory.
    assert_eq!(leftovers(pid), Vec::new());
    assert_eq!(temp_dirs(pid), Vec::<PathBuf>::new());
}

/// Starts the demo, stops it with `sig` during the goodput test, and checks
/// the exit code and that no process and no directory is left.
fn stops_everything_on(sig: Signal, code: i32) {
    let demo = Demo::start();
    // Printed once both daemons answer and both servers are registered,
    // right before the perf client starts.
    demo.wait_for_line("alpha: rina-perf client", Duration::from_secs(30));
    let started = leftovers(demo.pid);
    let count = |what: &str| started.iter().filter(|(_, c)| c.contains(what)).count();
    assert_eq!(count("rinad"), 2, "{started:?}");
    assert_eq!(count("rina-echo server"), 1, "{started:?}");
    assert_eq!(count("rina-perf server"), 1, "{started:?}");
    demo.signal(sig);
    let status = demo.wait_exit(Duration::from_secs(15));
    assert_eq!(status.code(), Some(code), "{status}");
    // The demo waited for every child before exiting.
    assert_eq!(leftovers(demo.pid), Vec::new());
    assert_eq!(temp_dirs(demo.pid), Vec::<PathBuf>::new());
}

#[test]
fn ctrl_c_stops_every_process_the_demo_started() {
    stops_everything_on(Signal::SIGINT, 130);
}

#[test]
fn sigterm_stops_every_process_the_demo_started() {
    stops_everything_on(Signal::SIGTERM, 143);
}

#[test]
fn sighup_stops_every_process_the_demo_started() {
    stops_everything_on(Signal::SIGHUP, 129);
}

/// Options out of range are refused before anything starts: exit 2 with
/// the option named. Before, `--echo-count 0` and `--perf-duration-s 0`
/// started both daemons and servers and failed later in a client, and
/// `nan` was taken.
#[test]
fn options_out_of_range_are_refused_before_anything_starts() {
    for (opt, value) in [
        ("--echo-count", "0"),
        ("--echo-count", "100001"),
        ("--perf-duration-s", "nan"),
        ("--perf-duration-s", "0"),
        ("--perf-duration-s", "3601"),
        ("--sweep-duration-s", "-1"),
        ("--sweep-duration-s", "inf"),
    ] {
        let t0 = Instant::now();
        let child = spawn_demo(&[&format!("{opt}={value}")], Stdio::piped());
        let pid = child.id();
        let out = child.wait_with_output().expect("run rina-demo");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{opt} {value}: {err}");
        assert!(
            err.contains(&format!("invalid value '{value}' for '{opt} ")),
            "{opt} {value}: {err}"
        );
        assert!(out.stdout.is_empty(), "{opt} {value}: started");
        assert!(t0.elapsed() < Duration::from_secs(5), "{opt} {value}");
        assert_eq!(temp_dirs(pid), Vec::<PathBuf>::new());
    }
}

/// `rina-demo | head -1`: the demo's output closes after its first line.
/// It was killed by SIGPIPE at its next line, before its cleanup, and left
/// its directory behind; now it cleans up and exits with 141, quietly.
#[test]
fn a_closed_output_stops_the_demo_and_it_cleans_up() {
    let mut child = spawn_demo(&["--perf-duration-s", "30"], Stdio::piped());
    let pid = child.id();
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut first = String::new();
    stdout.read_line(&mut first).expect("read a line");
    assert!(first.starts_with("* starting rinad"), "{first:?}");
    drop(stdout);
    let end = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for rina-demo") {
            break st;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("rina-demo ran on with its output closed");
        }
        thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read stderr");
    assert_eq!(status.code(), Some(141), "{status}: {err}");
    assert_eq!(err, "");
    assert_eq!(leftovers(pid), Vec::new());
    assert_eq!(temp_dirs(pid), Vec::<PathBuf>::new());
}

/// SIGKILL leaves the demo no chance to clean up: the kernel stops its
/// children (PR_SET_PDEATHSIG). Only the temporary directory stays.
#[test]
fn sigkill_of_the_demo_still_takes_its_children_down() {
    let demo = Demo::start();
    demo.wait_for_line("alpha: rina-perf client", Duration::from_secs(30));
    // The line is printed just before the client is started: wait until it
    // runs, so that it is among the children watched below.
    let end = Instant::now() + Duration::from_secs(10);
    let started = loop {
        let now = leftovers(demo.pid);
        if now.iter().any(|(_, c)| c.contains("rina-perf client")) {
            break now;
        }
        assert!(Instant::now() < end, "no rina-perf client started: {now:?}");
        thread::sleep(Duration::from_millis(20));
    };
    assert!(started.len() >= 4, "{started:?}");
    // Descriptors that become readable when each child exits.
    let pidfds: Vec<OwnedFd> = started
        .iter()
        .filter_map(|&(p, _)| {
            // SAFETY: pidfd_open takes a pid and flags, returns a new fd or -1.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, p, 0) };
            // A child that already exited (ESRCH) needs no waiting.
            (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
        })
        .collect();
    demo.signal(Signal::SIGKILL);
    let status = demo.wait_exit(Duration::from_secs(15));
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    let end = Instant::now() + Duration::from_secs(10);
    let mut alive: Vec<&OwnedFd> = pidfds.iter().collect();
    while !alive.is_empty() {
        let left = end.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "children still alive: {:?}",
            leftovers(demo.pid)
        );
        let mut fds: Vec<PollFd> = alive
            .iter()
            .map(|f| PollFd::new(f.as_fd(), PollFlags::POLLIN))
            .collect();
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        poll(&mut fds, PollTimeout::from(ms)).expect("poll");
        let done: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        alive = alive
            .into_iter()
            .zip(done)
            .filter(|(_, d)| !d)
            .map(|(f, _)| f)
            .collect();
    }
    // A child started after the list above was taken (none should be) is
    // given the same time to go.
    while !leftovers(demo.pid).is_empty() && Instant::now() < end {
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(leftovers(demo.pid), Vec::new());
    for d in temp_dirs(demo.pid) {
        std::fs::remove_dir_all(d).expect("remove the demo's directory");
    }
}
