//! The C API against real daemons: C programs (tests/c) compiled with `cc`
//! against the static and the shared library, talking through two `rinad`
//! over a shim DIF on UDP loopback.

mod common;

use common::{alloc, compile, pair, temp_dir, Killer, Lines, Link};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

/// Held by the tests that call the library in this process: they point
/// `RINA_SOCKET` at their own daemon.
static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Opens a control descriptor at the daemon at `server` and registers
/// `name` on it (in every DIF) with `flags`; then points `RINA_SOCKET` at
/// `client`, where the calls after it go.
fn register_at(
    server: &Path,
    name: &std::ffi::CStr,
    flags: libc::c_uint,
    client: &Path,
) -> libc::c_int {
    std::env::set_var("RINA_SOCKET", server);
    let fd = rina_api::rina_open();
    assert!(fd >= 0, "rina_open: {}", std::io::Error::last_os_error());
    // SAFETY: a NUL-terminated name; a NULL DIF is every DIF.
    let r = unsafe {
        rina_api::rina_register(fd, std::ptr::null(), name.as_ptr(), flags as libc::c_int)
    };
    assert_eq!(r, 0, "rina_register: {}", std::io::Error::last_os_error());
    std::env::set_var("RINA_SOCKET", client);
    fd
}

/// Starts the C server `server` on the daemon at `socket` and waits for
/// its "ready" (its names registered); its output lines follow.
fn start_server(server: &std::path::Path, socket: &std::path::Path) -> (Killer, Lines) {
    // Without cargo's LD_LIBRARY_PATH, which names target/debug before the
    // rpath's deps/: a library an earlier `cargo build` left there would be
    // loaded instead of the one under test.
    let mut srv = Command::new(server)
        .env_remove("LD_LIBRARY_PATH")
        .env("RINA_SOCKET", socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the C server");
    let lines = Lines::new(srv.stdout.take().expect("stdout"));
    let mut srv = Killer(srv);
    let first = lines.next(T);
    if first.as_deref() != Some("ready") {
        panic!(
            "server did not register ({first:?})\n{}",
            srv.0.wait_with_output_checked()
        );
    }
    (srv, lines)
}

/// Runs the C client `client` (tests/c/client.c) with `arg` (none: the
/// echo run) against the daemon at `socket`. Without cargo's
/// LD_LIBRARY_PATH, as in [`start_server`]: a shared-linked client loads
/// the library its rpath names.
#[track_caller]
fn run_client(client: &Path, arg: Option<&str>, socket: &Path) -> Output {
    let mut cmd = Command::new(client);
    cmd.args(arg)
        .env_remove("LD_LIBRARY_PATH")
        .env("RINA_SOCKET", socket);
    cmd.output().expect("run the C client")
}

/// Checks that a client run succeeded and printed `expect` (trimmed);
/// otherwise panics with its exit status, stdout and stderr, then
/// `context`.
#[track_caller]
fn assert_client_said(c: &Output, expect: &str, context: &str) {
    let (out, err) = (
        String::from_utf8_lossy(&c.stdout),
        String::from_utf8_lossy(&c.stderr),
    );
    assert!(
        c.status.success(),
        "client failed: {:?}\n{out}{err}{context}",
        c.status
    );
    assert_eq!(out.trim(), expect, "client stderr: {err}{context}");
}

/// [`run_client`] with `arg`, then [`assert_client_said`] `expect`.
#[track_caller]
fn client_says(client: &Path, arg: &str, socket: &Path, expect: &str) {
    assert_client_said(&run_client(client, Some(arg), socket), expect, "");
}

#[test]
fn c_programs_register_allocate_accept_and_echo() {
    let out = temp_dir("capi");
    let server = compile("server", &out, Link::Shared);
    let client = compile("client", &out, Link::Static);
    let (alpha, beta) = pair(&["capi-echo/1", "capi-refuse"]);

    let (mut srv, lines) = start_server(&server, &beta.socket);

    let c = run_client(&client, None, &alpha.socket);
    let mut got = Vec::new();
    while got.len() < 6 {
        match lines.next(T) {
            Some(l) => got.push(l),
            None => break,
        }
    }
    let srv_out = srv.0.wait_with_output_checked();
    assert_client_said(
        &c,
        "client ok",
        &format!("\nserver said {got:?}\n{srv_out}"),
    );
    // The server saw the names in rlite's syntax and the QoS asked for.
    assert_eq!(
        got[0], "accepted capi-client|1 mss 1400 gap -1 bw 0 loss 10000 in_order 0",
        "{got:?}"
    );
    assert_eq!(
        got[1], "accepted capi-client|2 mss 1400 gap 3 bw 1000000 loss 500 in_order 0",
        "{got:?}"
    );
    assert_eq!(got[2], "refused refuse-me", "{got:?}");
    let mut pair_names: Vec<&str> = got[3..5]
        .iter()
        .map(|l| l.split(' ').nth(1).unwrap_or(""))
        .collect();
    pair_names.sort();
    assert_eq!(pair_names, ["capi-client|3", "capi-client|4"], "{got:?}");
    assert_eq!(got[5], "done", "{got:?}\n{srv_out}");
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn c_program_without_a_daemon_gets_errno() {
    let out = temp_dir("nodaemon");
    let client = compile("client", &out, Link::Static);
    client_says(&client, "nodaemon", &out.join("nobody.sock"), "nodaemon ok");
    let _ = std::fs::remove_dir_all(out);
}

/// A child of fork(2) that uses its parent's control descriptor gets EBADF
/// at once, with a message saying why, instead of waiting 30 s for an
/// answer the parent's relay thread takes; one it opens itself works.
#[test]
fn a_forked_child_is_told_to_open_its_own_control_descriptor() {
    let out = temp_dir("fork");
    let client = compile("client", &out, Link::Static);
    let (alpha, _beta) = pair(&[]);
    client_says(&client, "fork", &alpha.socket, "fork ok");
    let _ = std::fs::remove_dir_all(out);
}

/// A flow descriptor inherited across exec(2) gets its MSS in the new
/// program, whose library never saw it (it asks the daemon), and still
/// carries SDUs; a socket that is no flow gets EBADF.
#[test]
fn a_flow_descriptor_inherited_across_exec_gets_its_mss() {
    let out = temp_dir("exec");
    let server = compile("server", &out, Link::Shared);
    let client = compile("client", &out, Link::Static);
    let (alpha, beta) = pair(&["capi-echo/1", "capi-refuse"]);
    let (_srv, _lines) = start_server(&server, &beta.socket);
    client_says(&client, "exec", &alpha.socket, "inherited ok");
    let _ = std::fs::remove_dir_all(out);
}

/// A program that blocks a signal to take it with sigtimedwait gets it: it
/// is not delivered to the library's relay thread (which does not block
/// it, and whose default action would kill the program).
#[test]
fn a_signal_the_program_blocks_is_not_taken_by_the_relay() {
    let out = temp_dir("signals");
    let client = compile("client", &out, Link::Static);
    let d = common::Daemon::start("signals", &[]);
    client_says(&client, "signals", &d.socket, "signals ok");
    let _ = std::fs::remove_dir_all(out);
}

trait WaitChecked {
    /// Waits for the child (bounded) and returns its exit status and stderr.
    fn wait_with_output_checked(&mut self) -> String;
}

impl WaitChecked for std::process::Child {
    fn wait_with_output_checked(&mut self) -> String {
        let end = std::time::Instant::now() + T;
        let status = loop {
            match self.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if std::time::Instant::now() < end => {
                    std::thread::park_timeout(Duration::from_millis(10))
                }
                _ => break None,
            }
        };
        let mut err = String::new();
        if let Some(e) = self.stderr.as_mut() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        format!("server exit: {status:?}\nserver stderr: {err}")
    }
}

/// `scripts/install-capi.sh` installs the library, the header and a
/// pkg-config file with which an unchanged program builds and runs.
#[test]
fn installed_library_builds_programs_with_pkg_config() {
    if Command::new("pkg-config")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("skipped: pkg-config is not installed");
        return;
    }
    let out = temp_dir("install");
    let prefix = out.join("prefix");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let st = Command::new(root.join("scripts/install-capi.sh"))
        .arg("--prebuilt")
        .arg(common::lib_dir())
        .arg(&prefix)
        .status()
        .expect("run install-capi.sh");
    assert!(st.success());
    for f in [
        "lib/librina_api.so",
        "lib/librina_api.a",
        "include/rina/api.h",
        "lib/pkgconfig/rina-api.pc",
    ] {
        assert!(prefix.join(f).exists(), "{f} not installed");
    }
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "rina-api"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .output()
        .expect("run pkg-config");
    assert!(
        flags.status.success(),
        "{}",
        String::from_utf8_lossy(&flags.stderr)
    );
    let flags = String::from_utf8_lossy(&flags.stdout).into_owned();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/client.c");
    let exe = out.join("client");
    let cc = Command::new("sh")
        .arg("-c")
        .arg(format!("cc \"$0\" -o \"$1\" {flags}"))
        .arg(&src)
        .arg(&exe)
        .output()
        .expect("run cc");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    // It runs against the installed shared library (rpath from the .pc;
    // cargo's LD_LIBRARY_PATH, which names target/, is left out).
    let ldd = Command::new("ldd")
        .arg(&exe)
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .expect("run ldd");
    let ldd = String::from_utf8_lossy(&ldd.stdout).into_owned();
    assert!(
        ldd.contains(&*prefix.join("lib/librina_api.so").to_string_lossy()),
        "{ldd}"
    );
    client_says(&exe, "nodaemon", &out.join("nobody.sock"), "nodaemon ok");
    let _ = std::fs::remove_dir_all(out);
}

/// Closing a control descriptor ends its relay, which closes the daemon
/// connection: the daemon withdraws the registrations made on it.
#[test]
fn closing_the_control_descriptor_withdraws_its_names() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let d = common::Daemon::start("solo", &[]);
    std::env::set_var("RINA_SOCKET", &d.socket);
    let names = || {
        let mut c = rina::Client::connect_to(&d.socket).expect("connect");
        c.list_names().expect("names").len()
    };
    let fd = rina_api::rina_open();
    assert!(fd >= 0);
    // SAFETY: NUL-terminated literals.
    let r = unsafe { rina_api::rina_register(fd, std::ptr::null(), c"solo-app|1".as_ptr(), 0) };
    assert_eq!(r, 0);
    assert_eq!(names(), 1);
    // SAFETY: fd is ours.
    assert_eq!(unsafe { libc::close(fd) }, 0);
    common::wait_for("the name to be withdrawn", T, || names() == 0);
    // The descriptor is no longer a control descriptor.
    let r = unsafe { rina_api::rina_register(fd, std::ptr::null(), c"x".as_ptr(), 0) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EBADF)
    );
}

/// A daemon that goes away under a control descriptor: the descriptor
/// polls readable, reads end-of-file (`rina_flow_accept` fails with
/// ECONNRESET), and later calls on it fail with ECONNRESET too.
#[test]
fn a_dead_daemon_is_econnreset_on_the_control_descriptor() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let mut d = common::Daemon::start("mortal", &[]);
    std::env::set_var("RINA_SOCKET", &d.socket);
    let fd = rina_api::rina_open();
    assert!(fd >= 0);
    // SAFETY: NUL-terminated literal.
    let r = unsafe { rina_api::rina_register(fd, std::ptr::null(), c"mortal-app".as_ptr(), 0) };
    assert_eq!(r, 0);
    let _ = d.child.kill();
    let _ = d.child.wait();
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    assert_eq!(unsafe { libc::poll(&mut p, 1, 10_000) }, 1, "no readiness");
    let errno = || std::io::Error::last_os_error().raw_os_error();
    // SAFETY: NULL out-pointers are allowed.
    let r =
        unsafe { rina_api::rina_flow_accept(fd, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
    assert_eq!((r, errno()), (-1, Some(libc::ECONNRESET)));
    // SAFETY: NUL-terminated literal.
    let r = unsafe { rina_api::rina_register(fd, std::ptr::null(), c"again".as_ptr(), 0) };
    assert_eq!((r, errno()), (-1, Some(libc::ECONNRESET)));
    // SAFETY: fd is ours.
    assert_eq!(unsafe { libc::close(fd) }, 0);
}

/// Flow descriptors are not close-on-exec, accepted or allocated, as in
/// rlite: a server that accepts and then execs a handler passes it the
/// flow by number.
#[test]
fn flow_descriptors_survive_exec_whichever_end() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let (alpha, beta) = pair(&["capi-exec"]);
    let server = register_at(&beta.socket, c"capi-exec", 0, &alpha.socket);
    let acceptor = std::thread::spawn(move || {
        // SAFETY: NULL out-pointers are allowed.
        unsafe { rina_api::rina_flow_accept(server, std::ptr::null_mut(), std::ptr::null_mut(), 0) }
    });
    let allocated = alloc(c"capi-exec-client", c"capi-exec", 0);
    let accepted = acceptor.join().unwrap();
    assert!(allocated >= 0 && accepted >= 0, "{allocated} {accepted}");
    // SAFETY: fcntl on descriptors we own.
    let cloexec = |fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } & libc::FD_CLOEXEC;
    assert_eq!(cloexec(allocated), 0, "the allocated flow is close-on-exec");
    assert_eq!(cloexec(accepted), 0, "the accepted flow is close-on-exec");
    for fd in [allocated, accepted, server] {
        // SAFETY: descriptors we own.
        unsafe { libc::close(fd) };
    }
}

/// A flow request the daemon withdrew before the server came to accept it
/// (nobody answered within the accept timeout) is passed over:
/// `rina_flow_accept` gives the next live one, not EINVAL, so an rlite
/// server that exits when accepting fails keeps serving.
#[test]
fn accept_passes_over_a_request_the_daemon_withdrew() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let (alpha, beta) = pair(&["capi-slow"]);
    let server = register_at(&beta.socket, c"capi-slow", 0, &alpha.socket);
    let alloc = |local: &std::ffi::CStr| alloc(local, c"capi-slow", rina_api::RINA_F_NOWAIT);
    let first = alloc(c"capi-given-up");
    assert!(first >= 0);
    let refused = || {
        let mut c = rina::Client::connect_to(&beta.socket).expect("connect");
        let ipcps = c.list_ipcps().expect("ipcps");
        ipcps
            .iter()
            .map(|i| i.counters.get("alloc_refused").copied().unwrap_or(0))
            .sum::<u64>()
    };
    common::wait_for("the unanswered request to be withdrawn", T, || {
        refused() >= 1
    });
    let second = alloc(c"capi-patient");
    assert!(second >= 0);
    let mut remote: *mut std::ffi::c_char = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; a NULL spec is allowed.
    let flow = unsafe { rina_api::rina_flow_accept(server, &mut remote, std::ptr::null_mut(), 0) };
    let errno = std::io::Error::last_os_error();
    assert!(flow >= 0, "accept failed: {errno}");
    // SAFETY: remote came from strdup.
    let who = unsafe { std::ffi::CStr::from_ptr(remote) }
        .to_string_lossy()
        .into_owned();
    assert!(who.starts_with("capi-patient"), "{who}");
    // SAFETY: pointers and descriptors we own.
    unsafe {
        libc::free(remote.cast());
        for fd in [flow, first, second, server] {
            libc::close(fd);
        }
    }
}

/// A control descriptor passed where a wait descriptor belongs fails with
/// EBADF at once and stays usable: the wait does not eat a flow request
/// meant for it, nor close it (which would withdraw its names).
#[test]
fn a_control_descriptor_is_not_taken_for_a_wait_descriptor() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let d = common::Daemon::start("waits", &[]);
    std::env::set_var("RINA_SOCKET", &d.socket);
    let fd = rina_api::rina_open();
    assert!(fd >= 0);
    let errno = || std::io::Error::last_os_error().raw_os_error();
    let t = std::time::Instant::now();
    assert_eq!(
        (rina_api::rina_flow_alloc_wait(fd), errno()),
        (-1, Some(libc::EBADF))
    );
    assert_eq!(
        (rina_api::rina_register_wait(fd, fd), errno()),
        (-1, Some(libc::EBADF))
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // SAFETY: NUL-terminated literal.
    let r = unsafe { rina_api::rina_register(fd, std::ptr::null(), c"waits-app".as_ptr(), 0) };
    assert_eq!(r, 0, "the control descriptor no longer works");
    // SAFETY: fd is ours.
    assert_eq!(unsafe { libc::close(fd) }, 0);
}

/// The inode of the socket open as `fd`, if it is open.
fn inode(fd: libc::c_int) -> Option<libc::ino_t> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: a buffer of the size fstat fills.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: fstat succeeded, filling it.
    Some(unsafe { st.assume_init() }.st_ino)
}

/// `rina_register_wait` after the program closed its control descriptor
/// fails with EBADF (the names went with it) and still closes the wait
/// descriptor, as api.h says.
#[test]
fn a_wait_descriptor_is_closed_when_its_control_descriptor_is_gone() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let d = common::Daemon::start("regwait", &[]);
    std::env::set_var("RINA_SOCKET", &d.socket);
    let fd = rina_api::rina_open();
    assert!(fd >= 0);
    // SAFETY: NUL-terminated literal.
    let wfd = unsafe {
        rina_api::rina_register(
            fd,
            std::ptr::null(),
            c"regwait-app".as_ptr(),
            rina_api::RINA_F_NOWAIT as libc::c_int,
        )
    };
    assert!(wfd >= 0, "{:?}", std::io::Error::last_os_error());
    let ino = inode(wfd).expect("wfd is open");
    // SAFETY: fd is ours.
    assert_eq!(unsafe { libc::close(fd) }, 0);
    let errno = || std::io::Error::last_os_error().raw_os_error();
    assert_eq!(
        (rina_api::rina_register_wait(fd, wfd), errno()),
        (-1, Some(libc::EBADF))
    );
    // Closed (the number may have been given to another descriptor since).
    assert_ne!(inode(wfd), Some(ino), "wfd was left open");
}

/// A flow descriptor passed where a wait descriptor belongs fails with
/// EBADF at once, and the flow is neither read nor closed: it still
/// carries an SDU.
#[test]
fn a_flow_descriptor_is_not_taken_for_a_wait_descriptor() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let (alpha, beta) = pair(&["capi-flowwait"]);
    let server = register_at(&beta.socket, c"capi-flowwait", 0, &alpha.socket);
    let wfd = alloc(
        c"capi-flowwaiter",
        c"capi-flowwait",
        rina_api::RINA_F_NOWAIT,
    );
    assert!(wfd >= 0);
    // SAFETY: NULL out-pointers are allowed.
    let accepted = unsafe {
        rina_api::rina_flow_accept(server, std::ptr::null_mut(), std::ptr::null_mut(), 0)
    };
    assert!(accepted >= 0);
    let flow = rina_api::rina_flow_alloc_wait(wfd);
    assert!(flow >= 0, "{:?}", std::io::Error::last_os_error());
    // SAFETY: a valid buffer of the length given.
    assert_eq!(
        unsafe { libc::write(accepted, b"hi".as_ptr().cast(), 2) },
        2
    );
    let errno = || std::io::Error::last_os_error().raw_os_error();
    let t = std::time::Instant::now();
    assert_eq!(
        (rina_api::rina_flow_alloc_wait(flow), errno()),
        (-1, Some(libc::EBADF))
    );
    assert_eq!(
        (rina_api::rina_register_wait(server, flow), errno()),
        (-1, Some(libc::EBADF))
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let mut buf = [0u8; 16];
    // SAFETY: a valid buffer of the length given; flow is open.
    let n = unsafe { libc::read(flow, buf.as_mut_ptr().cast(), buf.len()) };
    assert_eq!(
        n,
        2,
        "the flow lost its SDU: {:?}",
        std::io::Error::last_os_error()
    );
    assert_eq!(&buf[..2], b"hi");
    for fd in [flow, accepted, server] {
        // SAFETY: descriptors we own.
        assert_eq!(unsafe { libc::close(fd) }, 0);
    }
}

/// A wait descriptor the program made non-blocking fails with EAGAIN while
/// the answer has not come, and stays open for the next try (as in rlite,
/// whose event-driven programs call the wait speculatively).
#[test]
fn a_non_blocking_wait_descriptor_is_eagain_until_the_answer_comes() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let (alpha, beta) = pair(&["capi-later"]);
    let server = register_at(&beta.socket, c"capi-later", 0, &alpha.socket);
    let wfd = alloc(c"capi-early", c"capi-later", rina_api::RINA_F_NOWAIT);
    assert!(wfd >= 0);
    // SAFETY: fcntl on a descriptor we own.
    unsafe { libc::fcntl(wfd, libc::F_SETFL, libc::O_NONBLOCK) };
    // The server has not accepted: nothing to finish yet.
    let errno = || std::io::Error::last_os_error().raw_os_error();
    assert_eq!(
        (rina_api::rina_flow_alloc_wait(wfd), errno()),
        (-1, Some(libc::EAGAIN))
    );
    // SAFETY: fcntl on a descriptor we own.
    assert!(
        unsafe { libc::fcntl(wfd, libc::F_GETFD) } >= 0,
        "wfd was closed"
    );
    // SAFETY: NULL out-pointers are allowed.
    let accepted = unsafe {
        rina_api::rina_flow_accept(server, std::ptr::null_mut(), std::ptr::null_mut(), 0)
    };
    assert!(accepted >= 0);
    let mut p = libc::pollfd {
        fd: wfd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    assert_eq!(unsafe { libc::poll(&mut p, 1, 10_000) }, 1, "no answer");
    let flow = rina_api::rina_flow_alloc_wait(wfd);
    assert!(flow >= 0, "{:?}", std::io::Error::last_os_error());
    for fd in [flow, accepted, server] {
        // SAFETY: descriptors we own.
        unsafe { libc::close(fd) };
    }
}

/// A blocking `rina_flow_accept` is interrupted by a signal whose handler
/// was installed without `SA_RESTART` (EINTR, as a read(2) would be), so a
/// server waiting for requests can stop on Ctrl-C.
#[test]
fn a_signal_interrupts_a_blocking_accept() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let d = common::Daemon::start("sig", &[]);
    std::env::set_var("RINA_SOCKET", &d.socket);
    let fd = rina_api::rina_open();
    assert!(fd >= 0);
    // SAFETY: NUL-terminated literal.
    let r = unsafe { rina_api::rina_register(fd, std::ptr::null(), c"sig-app".as_ptr(), 0) };
    assert_eq!(r, 0);
    extern "C" fn nothing(_: libc::c_int) {}
    // SAFETY: installs a handler that does nothing, without SA_RESTART.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = nothing as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let accepting = std::thread::spawn(move || {
        // SAFETY: pthread_self has no preconditions.
        tx.send(unsafe { libc::pthread_self() }).expect("send");
        // SAFETY: NULL out-pointers are allowed.
        let r = unsafe {
            rina_api::rina_flow_accept(fd, std::ptr::null_mut(), std::ptr::null_mut(), 0)
        };
        (r, std::io::Error::last_os_error().raw_os_error())
    });
    let thread = rx.recv().expect("thread id");
    // A signal may come before the call blocks: signal until it returns.
    let end = std::time::Instant::now() + T;
    while !accepting.is_finished() {
        assert!(
            std::time::Instant::now() < end,
            "the accept was never interrupted"
        );
        // SAFETY: the thread is not joined yet, so its id is valid.
        unsafe { libc::pthread_kill(thread, libc::SIGUSR1) };
        std::thread::park_timeout(Duration::from_millis(10));
    }
    assert_eq!(accepting.join().expect("join"), (-1, Some(libc::EINTR)));
    // SAFETY: fd is ours.
    assert_eq!(unsafe { libc::close(fd) }, 0);
}

/// A request taken with `RINA_F_NORESP` and never answered is forgotten
/// once the daemon withdraws it: a server that drops such handles does not
/// grow without bound. Responding to it then fails with EINVAL, as before.
#[test]
fn an_unanswered_noresp_handle_is_forgotten_when_withdrawn() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let (alpha, beta) = pair(&["capi-noresp"]);
    let server = register_at(&beta.socket, c"capi-noresp", 0, &alpha.socket);
    let wfd = alloc(c"capi-unanswered", c"capi-noresp", rina_api::RINA_F_NOWAIT);
    assert!(wfd >= 0);
    let h = accept_noresp(server);
    assert!(h > 0);
    let conn = rina_api::control::lookup(server).expect("control descriptor");
    assert_eq!(conn.pending_handles(), 1);
    // The accept timeout passes: the daemon refuses on the server's behalf.
    let errno = || std::io::Error::last_os_error().raw_os_error();
    assert_eq!(
        (rina_api::rina_flow_alloc_wait(wfd), errno()),
        (-1, Some(libc::ECONNREFUSED))
    );
    common::wait_for("the handle to be forgotten", T, || {
        conn.pending_handles() == 0
    });
    assert_eq!(
        (rina_api::rina_flow_respond(server, h, 0), errno()),
        (-1, Some(libc::EINVAL))
    );
    // SAFETY: fd is ours.
    unsafe { libc::close(server) };
}

/// A name registered with `RINA_F_ACCEPT`: the daemon accepts its
/// requests itself, so an allocation completes while the program reads
/// nothing; `rina_flow_accept` then hands the flow over, and with
/// `RINA_F_NORESP` a handle whose refusal closes the flow.
#[test]
fn a_name_registered_with_accept_gets_flows_the_daemon_accepted() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let (alpha, beta) = pair(&["capi-backlog"]);
    let server = register_at(
        &beta.socket,
        c"capi-backlog",
        rina_api::RINA_F_ACCEPT,
        &alpha.socket,
    );
    let alloc = |local: &std::ffi::CStr| alloc(local, c"capi-backlog", 0);
    let errno = || std::io::Error::last_os_error();
    // Blocking allocations that complete with nobody answering on beta.
    let first = alloc(c"capi-early|1");
    assert!(first >= 0, "allocation failed: {}", errno());
    let second = alloc(c"capi-early|2");
    assert!(second >= 0, "allocation failed: {}", errno());
    let mut remote: *mut std::ffi::c_char = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; a NULL spec is allowed.
    let flow = unsafe { rina_api::rina_flow_accept(server, &mut remote, std::ptr::null_mut(), 0) };
    assert!(flow >= 0, "accept failed: {}", errno());
    // SAFETY: remote came from strdup.
    let who = unsafe { std::ffi::CStr::from_ptr(remote) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: remote came from strdup.
    unsafe { libc::free(remote.cast()) };
    assert!(who.starts_with("capi-early|1"), "{who}");
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(flow, libc::F_GETFD) };
    assert_eq!(
        flags & libc::FD_CLOEXEC,
        0,
        "the accepted flow is close-on-exec"
    );
    // SAFETY: descriptors we own, buffers of the given length.
    unsafe {
        assert_eq!(libc::write(first, b"ping".as_ptr().cast(), 4), 4);
        let mut buf = [0u8; 16];
        assert_eq!(libc::read(flow, buf.as_mut_ptr().cast(), buf.len()), 4);
        assert_eq!(&buf[..4], b"ping");
    }
    let h = accept_noresp(server);
    assert!(h > 0, "accept failed: {}", errno());
    assert_eq!(rina_api::rina_flow_respond(server, h, 1), 0);
    // The refused flow is closed: its other end reads the end of the flow.
    let mut pfd = libc::pollfd {
        fd: second,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; then a buffer of the given length.
    unsafe {
        assert_eq!(libc::poll(&mut pfd, 1, T.as_millis() as libc::c_int), 1);
        let mut buf = [0u8; 16];
        assert_eq!(libc::read(second, buf.as_mut_ptr().cast(), buf.len()), 0);
        for fd in [flow, first, second, server] {
            libc::close(fd);
        }
    }
}

/// `rina_flow_accept` of the next request on `server` with
/// `RINA_F_NORESP`, names and spec not asked for: the request's handle.
fn accept_noresp(server: libc::c_int) -> libc::c_int {
    // SAFETY: NULL out-pointers are allowed.
    unsafe {
        rina_api::rina_flow_accept(
            server,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            rina_api::RINA_F_NORESP,
        )
    }
}

/// A descriptor that no `RINA_F_NOWAIT` call returned (a file, a socket of
/// the program's) fails with EBADF at once, and is neither read from nor
/// closed.
#[test]
fn a_descriptor_of_the_program_is_not_taken_for_a_wait_descriptor() {
    let file = std::fs::File::open("/proc/self/status").unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    let errno = || std::io::Error::last_os_error().raw_os_error();
    assert_eq!(
        (rina_api::rina_flow_alloc_wait(fd), errno()),
        (-1, Some(libc::EBADF))
    );
    let (a, b) = std::os::unix::net::UnixDatagram::pair().unwrap();
    b.send(b"app-data").unwrap();
    let sfd = std::os::fd::AsRawFd::as_raw_fd(&a);
    assert_eq!(
        (rina_api::rina_flow_alloc_wait(sfd), errno()),
        (-1, Some(libc::EBADF))
    );
    let mut buf = [0u8; 16];
    assert_eq!(a.recv(&mut buf).unwrap(), 8, "the datagram is still there");
    // SAFETY: fcntl on a descriptor we own.
    assert!(
        unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0,
        "the file is open"
    );
}

/// A call that fails in an `atexit` handler or a thread key's destructor,
/// after the thread's own storage is gone, returns -1 with errno (it
/// aborted the program: the library's error text lived there).
#[test]
fn c_program_failing_in_exit_handlers_gets_errno() {
    let out = temp_dir("exithandlers");
    let client = compile("client", &out, Link::Shared);
    let c = run_client(&client, Some("exit"), &out.join("nobody.sock"));
    let said = String::from_utf8_lossy(&c.stdout);
    assert!(c.status.success(), "{:?}\n{said}", c.status);
    assert!(said.contains("key destructor ok"), "{said}");
    assert!(said.contains("atexit ok"), "{said}");
    let _ = std::fs::remove_dir_all(out);
}
