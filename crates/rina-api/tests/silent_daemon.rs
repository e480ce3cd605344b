//! Daemons that are alive but stuck. One takes requests and never
//! answers: a blocking call gives up after the library's 30 s with
//! `ETIMEDOUT`, and neither it nor a `RINA_F_NOWAIT` call whose descriptor
//! the program closed leaves a descriptor behind. One never takes
//! connections (its backlog is full), one never reads its connection (its
//! socket buffer fills): connecting and sending give up with `ETIMEDOUT`
//! too, after the timeout these tests shorten. The tests point
//! `RINA_SOCKET` at their own daemon, one at a time ([`ENV`]).

mod common;

use nix::errno::Errno;
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr};
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{mpsc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Held by each test: `RINA_SOCKET` and the library's timeout are the
/// process's.
static ENV: Mutex<()> = Mutex::new(());

/// The shortened timeout of the tests of a stuck daemon.
const SHORT: Duration = Duration::from_millis(500);

/// How long such a test waits for the library before failing: a call
/// blocked for ever must fail the test, not hang it.
const WATCHDOG: Duration = Duration::from_secs(20);

fn env() -> MutexGuard<'static, ()> {
    ENV.lock().unwrap_or_else(|p| p.into_inner())
}

/// Shortens the library's timeout to [`SHORT`] until dropped.
struct ShortTimeout;

impl ShortTimeout {
    fn new() -> Self {
        rina_api::control::set_timeout_for_tests(Some(SHORT));
        ShortTimeout
    }
}

impl Drop for ShortTimeout {
    fn drop(&mut self) {
        rina_api::control::set_timeout_for_tests(None);
    }
}

/// Descriptors open in this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Waits until no control relay thread of the library is left (a closed
/// control descriptor's ends soon after), so that the next test counts
/// descriptors undisturbed.
fn no_relay_left() {
    let relays = || {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|c| c.trim_end() == "rina-api relay")
            .count()
    };
    common::wait_for("the control relays to end", WATCHDOG, || relays() == 0);
}

/// A fresh directory for test `name`'s socket, and the socket's path.
fn socket_path(name: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("rina-api-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.sock"));
    let _ = std::fs::remove_file(&path);
    (dir, path)
}

/// A `SOCK_SEQPACKET` socket listening on `path` with `backlog`.
fn listen(path: &PathBuf, backlog: i32) -> OwnedFd {
    let listener = socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    socket::bind(listener.as_raw_fd(), &UnixAddr::new(path).unwrap()).unwrap();
    socket::listen(&listener, socket::Backlog::new(backlog).unwrap()).unwrap();
    listener
}

/// What a C API call returned in the thread that made it, its `errno`, its
/// message and how long it took.
struct Outcome {
    r: i64,
    errno: Option<i32>,
    message: String,
    took: Duration,
}

/// Runs `call` (C API calls, the last of which is reported) in a thread of
/// its own; fails the test if it has not returned within [`WATCHDOG`] (the
/// thread is left behind, blocked).
fn bounded(what: &str, call: impl FnOnce() -> i64 + Send + 'static) -> Outcome {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let t = Instant::now();
        let r = call();
        let errno = std::io::Error::last_os_error().raw_os_error();
        // SAFETY: the library returns a NUL-terminated string of this thread.
        let message = unsafe { CStr::from_ptr(rina_api::rina_api_last_error()) }
            .to_string_lossy()
            .into_owned();
        let _ = tx.send(Outcome {
            r,
            errno,
            message,
            took: t.elapsed(),
        });
    });
    rx.recv_timeout(WATCHDOG)
        .unwrap_or_else(|_| panic!("{what} still blocked after {WATCHDOG:?}: no timeout"))
}

/// Asserts that `o` is a failure with `ETIMEDOUT` after about [`SHORT`],
/// whose message says `says`.
fn assert_timed_out(what: &str, o: &Outcome, says: &str) {
    assert_eq!(o.r, -1, "{what} succeeded");
    assert_eq!(
        o.errno,
        Some(libc::ETIMEDOUT),
        "{what}: errno {:?} ({})",
        o.errno,
        o.message
    );
    assert!(o.message.contains(says), "{what}: {:?}", o.message);
    assert!(o.took >= SHORT, "{what} gave up after {:?}", o.took);
}

#[test]
fn abandoned_and_timed_out_registrations_leave_no_descriptor_behind() {
    let _env = env();
    let (dir, path) = socket_path("silent");
    let listener = listen(&path, 8);
    std::env::set_var("RINA_SOCKET", &path);
    let (accepted, connected) = mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        loop {
            let c = socket::accept(listener.as_raw_fd()).unwrap();
            // SAFETY: accept just returned this descriptor; it is ours.
            held.push(unsafe { OwnedFd::from_raw_fd(c) });
            accepted.send(()).unwrap();
        }
    });

    let fd = rina_api::rina_open();
    assert!(fd >= 0, "rina_open: {}", std::io::Error::last_os_error());
    connected.recv().unwrap();
    let before = open_fds();
    let name = CString::new("silent-test").unwrap();
    // A RINA_F_NOWAIT registration whose descriptor the program closes
    // without waiting for the answer (that never comes)...
    // SAFETY: a NUL-terminated name and a NULL DIF.
    let wfd = unsafe {
        rina_api::rina_register(
            fd,
            std::ptr::null(),
            name.as_ptr(),
            rina_api::RINA_F_NOWAIT as i32,
        )
    };
    assert!(
        wfd >= 0,
        "rina_register: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: wfd is ours, given up here.
    unsafe { libc::close(wfd) };
    // ...and a blocking one that times out.
    let t = Instant::now();
    // SAFETY: a NUL-terminated name and a NULL DIF.
    let r = unsafe { rina_api::rina_register(fd, std::ptr::null(), name.as_ptr(), 0) };
    let errno = std::io::Error::last_os_error().raw_os_error();
    assert_eq!(r, -1);
    assert_eq!(errno, Some(libc::ETIMEDOUT));
    assert!(t.elapsed() >= rina_api::control::REPLY_TIMEOUT);
    assert_eq!(
        open_fds(),
        before,
        "descriptors left open by the abandoned and timed-out calls"
    );
    // SAFETY: fd is the control descriptor opened above.
    unsafe { libc::close(fd) };
    no_relay_left();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn connecting_to_a_daemon_that_does_not_accept_times_out() {
    let _env = env();
    let _short = ShortTimeout::new();
    let start = open_fds();
    let (dir, path) = socket_path("backlog");
    // A daemon that never accepts, its backlog filled by connections it
    // has not taken: a blocking connect would wait for ever.
    let listener = listen(&path, 0);
    let mut queued = Vec::new();
    loop {
        let s = socket::socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .unwrap();
        match socket::connect(s.as_raw_fd(), &UnixAddr::new(&path).unwrap()) {
            Ok(()) => queued.push(s),
            Err(Errno::EAGAIN) => break,
            Err(e) => panic!("filling the backlog: {e}"),
        }
        assert!(queued.len() < 64, "the backlog does not fill");
    }
    std::env::set_var("RINA_SOCKET", &path);

    let o = bounded("rina_open", || rina_api::rina_open().into());
    assert_timed_out(
        "rina_open",
        &o,
        "did not accept the connection within 500 ms",
    );
    assert!(
        o.message.contains(path.to_str().unwrap()),
        "{:?}",
        o.message
    );

    // An allocation connects on its own, blocking or not.
    for flags in [0, rina_api::RINA_F_NOWAIT] {
        let o = bounded("rina_flow_alloc", move || {
            common::alloc(c"backlog-a", c"backlog-b", flags).into()
        });
        assert_timed_out(
            "rina_flow_alloc",
            &o,
            "did not accept the connection within 500 ms",
        );
    }
    drop((listener, queued));
    assert_eq!(open_fds(), start, "descriptors left open by the calls");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sending_to_a_daemon_that_does_not_read_times_out() {
    let _env = env();
    let _short = ShortTimeout::new();
    let start = open_fds();
    let (dir, path) = socket_path("deaf");
    // A daemon that takes the connection and never reads it.
    let listener = listen(&path, 8);
    std::env::set_var("RINA_SOCKET", &path);
    let (tx, accepted) = mpsc::channel();
    let daemon = std::thread::spawn(move || {
        let c = socket::accept(listener.as_raw_fd()).unwrap();
        // SAFETY: accept just returned this descriptor; it is ours.
        let c = unsafe { OwnedFd::from_raw_fd(c) };
        tx.send(c).unwrap();
    });
    let fd = rina_api::rina_open();
    assert!(fd >= 0, "rina_open: {}", std::io::Error::last_os_error());
    let daemon_end = accepted.recv_timeout(WATCHDOG).unwrap();
    daemon.join().unwrap();

    // RINA_F_NOWAIT registrations (returning at once, their descriptors
    // closed) until the connection's buffer is full: the one that finds it
    // full waits for room, which never comes.
    let o = bounded("rina_register", move || {
        let name = CString::new(format!("deaf-{}", "x".repeat(200))).unwrap();
        for _ in 0..1_000_000 {
            // SAFETY: a NUL-terminated name and a NULL DIF.
            let w = unsafe {
                rina_api::rina_register(
                    fd,
                    std::ptr::null(),
                    name.as_ptr(),
                    rina_api::RINA_F_NOWAIT as i32,
                )
            };
            if w < 0 {
                return w.into();
            }
            // SAFETY: w is ours, given up here.
            unsafe { libc::close(w) };
        }
        0
    });
    assert_timed_out(
        "rina_register",
        &o,
        "did not take the request within 500 ms",
    );
    // A blocking call fails the same way.
    let o = bounded("rina_unregister", move || {
        // SAFETY: a NUL-terminated name and a NULL DIF.
        let r = unsafe { rina_api::rina_unregister(fd, std::ptr::null(), c"deaf".as_ptr(), 0) };
        r.into()
    });
    assert_timed_out(
        "rina_unregister",
        &o,
        "did not take the request within 500 ms",
    );
    // SAFETY: fd is the control descriptor opened above.
    unsafe { libc::close(fd) };
    no_relay_left();
    drop(daemon_end);
    assert_eq!(open_fds(), start, "descriptors left open by the calls");
    let _ = std::fs::remove_dir_all(&dir);
}
