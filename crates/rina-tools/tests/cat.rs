//! `rina-cat` between two real `rinad` (a normal DIF over shim-udp on
//! loopback): 1 MiB piped into a caller comes out of a listener's standard
//! output unchanged, and both end with 0; a request to `rina-echo` gets its
//! answer within `--wait-ms`; a name nobody registered is refused with
//! exit code 2, naming it; `--keep-listening` serves callers one after the
//! other; a listener whose daemon dies says so and exits with 1.

mod common;

use common::{bin_dir, normal_pair};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

/// A `rina-cat` (or other tool) running, killed if the test ends first;
/// its standard output and error go to files.
struct Run {
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Run {
    /// Starts `tool` with `args` and `stdin`, its outputs into files of
    /// `dir` named after `tag`.
    fn start(tool: &str, args: &[&str], stdin: Stdio, dir: &Path, tag: &str) -> Run {
        let (out, err) = (
            dir.join(format!("{tag}.out")),
            dir.join(format!("{tag}.err")),
        );
        let child = Command::new(bin_dir().join(tool))
            .args(args)
            .stdin(stdin)
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("start {tool}: {e}"));
        Run { child, out, err }
    }

    /// Its exit code, waiting at most [`T`].
    fn code(&mut self) -> Option<i32> {
        let mut status = None;
        common::wait_until(&format!("{:?} to exit", self.err), T, || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        status.and_then(|s| s.code())
    }

    /// Waits until its standard error holds `n` lines containing `what`.
    fn wait_for(&self, what: &str, n: usize) {
        common::wait_until(
            &format!("{n} lines with `{what}` from {:?}", self.err),
            T,
            || self.stderr().lines().filter(|l| l.contains(what)).count() >= n,
        );
    }

    fn stdout(&self) -> Vec<u8> {
        std::fs::read(&self.out).unwrap_or_default()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }
}

/// Runs a `rina-cat` caller with `args`, `input` on its standard input,
/// to its end: it, and its exit code.
fn call(args: &[&str], input: &[u8], dir: &Path, tag: &str) -> (Run, Option<i32>) {
    let mut run = Run::start("rina-cat", args, Stdio::piped(), dir, tag);
    let mut stdin = run.child.stdin.take().unwrap();
    let input = input.to_vec();
    // A thread: a caller that does not read would block a large write.
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let code = run.code();
    writer.join().unwrap().expect("the caller took its input");
    (run, code)
}

/// `n` pseudo-random bytes (xorshift).
fn noise(n: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[test]
fn a_mebibyte_crosses_unchanged_and_a_name_nobody_has_is_refused() {
    let (procs, a, b) = normal_pair("cat-bulk", |_| "\"bulk\" = 2".into());
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let dir = procs.1.clone();
    let listen = ["--socket", b, "--dif", "net", "-l", "-v", "bulk"];
    let mut listener = Run::start("rina-cat", &listen, Stdio::null(), &dir, "listener");
    listener.wait_for("bulk registered in net", 1);
    let data = noise(1 << 20);
    let start = Instant::now();
    let (caller, code) = call(
        &["--socket", a, "--dif", "net", "-v", "bulk"],
        &data,
        &dir,
        "caller",
    );
    assert_eq!(code, Some(0), "{}", caller.stderr());
    assert_eq!(listener.code(), Some(0), "{}", listener.stderr());
    eprintln!(
        "1 MiB through rina-cat, both ended, in {:?}",
        start.elapsed()
    );
    let got = listener.stdout();
    assert_eq!(got.len(), data.len(), "{}", listener.stderr());
    assert!(got == data, "the bytes came out changed");
    let said = caller.stderr();
    assert!(
        said.contains("to bulk closed: 1048576 B sent, 0 B received"),
        "{said}"
    );
    let said = listener.stderr();
    assert!(
        said.contains("from rina-cat closed: 0 B sent, 1048576 B received"),
        "{said}"
    );

    let (caller, code) = call(
        &["--socket", a, "--dif", "net", "nobody"],
        b"",
        &dir,
        "nobody",
    );
    let said = caller.stderr();
    assert_eq!(code, Some(2), "{said}");
    assert!(
        said.contains("rina-cat: cannot allocate a flow to nobody: "),
        "{said}"
    );
}

#[test]
fn a_request_gets_its_answer_within_the_wait() {
    let (procs, a, b) = normal_pair("cat-echo", |_| "\"echo\" = 2".into());
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let dir = procs.1.clone();
    let server = ["server", "--socket", b, "--dif", "net", "--name", "echo"];
    let echo = Run::start("rina-echo", &server, Stdio::null(), &dir, "echo");
    common::wait_until("rina-echo registered", T, || {
        String::from_utf8_lossy(&echo.stdout()).contains("registered echo")
    });
    let start = Instant::now();
    let args = ["--socket", a, "--dif", "net", "--wait-ms", "1000", "echo"];
    let (caller, code) = call(&args, b"hello\n", &dir, "caller");
    let took = start.elapsed();
    assert_eq!(code, Some(0), "{}", caller.stderr());
    assert_eq!(String::from_utf8_lossy(&caller.stdout()), "hello\n");
    // The echo server never closes: the wait ended the session.
    assert!(took >= Duration::from_millis(1000), "ended after {took:?}");
}

#[test]
fn keep_listening_serves_callers_one_after_the_other() {
    let (procs, a, b) = normal_pair("cat-keep", |_| "\"svc\" = 2".into());
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let dir = procs.1.clone();
    let listen = ["--socket", b, "--dif", "net", "-l", "-k", "-v", "svc"];
    let mut listener = Run::start("rina-cat", &listen, Stdio::null(), &dir, "listener");
    listener.wait_for("svc registered in net", 1);
    for (k, word) in ["first\n", "second\n"].into_iter().enumerate() {
        let args = ["--socket", a, "--dif", "net", "--name", "caller", "svc"];
        let (caller, code) = call(&args, word.as_bytes(), &dir, &format!("caller{k}"));
        assert_eq!(code, Some(0), "caller {k}: {}", caller.stderr());
        listener.wait_for("from caller closed", k + 1);
    }
    assert_eq!(
        String::from_utf8_lossy(&listener.stdout()),
        "first\nsecond\n"
    );
    let said = listener.stderr();
    assert_eq!(said.matches("0 B sent, ").count(), 2, "{said}");
    assert!(
        listener.child.try_wait().unwrap().is_none(),
        "it stopped: {said}"
    );
}

/// The listener's daemon dies during a session: it ends the flow as a peer
/// would, but the listener tells them apart, says it lost the daemon and
/// exits with 1 (its output may be cut short). Before, it exited with 0,
/// as after a whole transfer.
#[test]
fn a_listener_whose_daemon_dies_says_so_and_exits_with_1() {
    let (mut procs, a, b) = normal_pair("cat-crash", |_| "\"crash\" = 2".into());
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let dir = procs.1.clone();
    let listen = ["--socket", b, "--dif", "net", "-l", "-v", "crash"];
    let mut listener = Run::start("rina-cat", &listen, Stdio::null(), &dir, "listener");
    listener.wait_for("crash registered in net", 1);
    let args = ["--socket", a, "--dif", "net", "crash"];
    let mut caller = Run::start("rina-cat", &args, Stdio::piped(), &dir, "caller");
    let mut stdin = caller.child.stdin.take().unwrap();
    stdin.write_all(b"first\n").unwrap();
    common::wait_until("the line at the listener", T, || {
        listener.stdout() == b"first\n"
    });
    // Beta's daemon (the second process) dies.
    let beta = &mut procs.0[1];
    beta.kill().unwrap();
    beta.wait().unwrap();
    let code = listener.code();
    let said = listener.stderr();
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("lost the daemon"), "{said}");
    drop(stdin);
}
