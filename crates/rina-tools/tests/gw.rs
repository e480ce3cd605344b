//! `rina-gw` between two real `rinad` (a normal DIF over shim-udp on
//! loopback): TCP connections accepted by the gateway at alpha cross the
//! DIF on reliable flows to the gateway at beta, which connects each to a
//! TCP server; bytes come back unchanged, each session's end is reported
//! with what it carried, a connection closed at once after its last write
//! has every byte put on the flow, and a request whose server is down is
//! refused with the reason, which the connecting side reports.

mod common;

use common::{bin_dir, normal_pair, Procs};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

/// Starts `rina-gw` with `args`, its standard error into file `log`;
/// returns once it said that its `mappings` are ready: those lines.
fn gateway(procs: &mut Procs, args: &[&str], log: &Path, mappings: usize) -> Vec<String> {
    let mut child = Command::new(bin_dir().join("rina-gw"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("start rina-gw");
    let out = child.stdout.take().unwrap();
    procs.0.push(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (0..mappings)
        .map(|_| {
            let line = rx.recv_timeout(T).unwrap_or_else(|_| {
                panic!("rina-gw {args:?} not ready: {}", read(log));
            });
            assert!(line.starts_with("rina-gw: "), "{line}");
            line
        })
        .collect()
}

/// The port of a ready line `rina-gw: TCP 127.0.0.1:PORT -> RINA APP`.
fn listening_port(line: &str) -> u16 {
    let addr = line.split(' ').nth(2).expect("an address");
    addr.parse::<std::net::SocketAddr>()
        .unwrap_or_else(|e| panic!("{line}: {e}"))
        .port()
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// A TCP port free on loopback now.
fn free_tcp_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A TCP echo server on loopback: its port.
fn echo_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            std::thread::spawn(move || {
                let mut w = c.try_clone().unwrap();
                let _ = std::io::copy(&mut c, &mut w);
            });
        }
    });
    port
}

/// A TCP server on loopback that reads each connection to its end and
/// sends the number of bytes on `tx`: its port.
fn sink_server(tx: mpsc::Sender<usize>) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            let mut all = Vec::new();
            let _ = c.read_to_end(&mut all);
            let _ = tx.send(all.len());
        }
    });
    port
}

/// Through `port`: writes `n` bytes of a pattern of its own (`seed`) and
/// reads them back, checking each.
fn round_trip(port: u16, seed: u8, n: usize) {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(T)).unwrap();
    let data: Vec<u8> = (0..n).map(|i| (i % 241) as u8 ^ seed).collect();
    let mut w = c.try_clone().unwrap();
    let sent = data.clone();
    let writer = std::thread::spawn(move || w.write_all(&sent).unwrap());
    let mut got = vec![0u8; n];
    c.read_exact(&mut got).expect("the echo of every byte");
    assert!(got == data, "client {seed}: the bytes came back changed");
    writer.join().unwrap();
    c.shutdown(Shutdown::Both).unwrap();
}

/// Waits until file `log` holds `n` lines containing `what`.
fn wait_for_lines(log: &Path, what: &str, n: usize) -> String {
    common::wait_until(&format!("{n} lines with `{what}`"), T, || {
        read(log).lines().filter(|l| l.contains(what)).count() >= n
    });
    read(log)
}

#[test]
fn tcp_connections_cross_a_normal_dif_through_two_gateways() {
    let (mut procs, a, b) = normal_pair("gw", |_| "\"web\" = 2\n\"sink\" = 2\n\"down\" = 2".into());
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let dir = procs.1.clone();
    let (log_a, log_b) = (dir.join("gw-a.log"), dir.join("gw-b.log"));
    let (sunk_tx, sunk) = mpsc::channel();
    let echo_port = echo_server();
    let (sink_at, down_at) = (sink_server(sunk_tx), free_tcp_port());
    // Beta's gateway takes its mappings from a file written for rlite's.
    let conf = dir.join("gw-b.conf");
    let lines = format!(
        "# beta's gateway\nR2I net web 127.0.0.1 {echo_port}\n\nR2I net sink 127.0.0.1 {sink_at}\nR2I net down 127.0.0.1 {down_at}\n"
    );
    std::fs::write(&conf, lines).unwrap();
    let args = ["--socket", b, "--config", conf.to_str().unwrap()];
    gateway(&mut procs, &args, &log_b, 3);
    // Alpha's gateway listens on ports the system picks, and says which.
    let maps = ["web", "sink", "down", "nobody"].map(|app| format!("127.0.0.1:0={app}"));
    let mut args: Vec<&str> = vec!["--socket", a, "--dif", "net"];
    for m in &maps {
        args.extend(["--tcp-to-rina", m.as_str()]);
    }
    let ready = gateway(&mut procs, &args, &log_a, 4);
    let [web_port, sink_port, down_port, nobody_port] =
        [0, 1, 2, 3].map(|i| listening_port(&ready[i]));

    // Three connections at once, 300 KB each way each.
    let n = 300_000;
    let clients: Vec<_> = (0..3u8)
        .map(|seed| std::thread::spawn(move || round_trip(web_port, seed, n)))
        .collect();
    for c in clients {
        c.join().expect("a client failed");
    }
    let carried = format!("closed: {n} B to RINA, {n} B from RINA");
    wait_for_lines(&log_a, &carried, 3);
    let log = wait_for_lines(&log_b, &carried, 3);
    // Beta's sessions name who asked, the name and the server.
    let to_server = format!("rina-gw -> web -> 127.0.0.1:{echo_port}");
    assert_eq!(log.matches(&to_server).count(), 3, "{log}");

    // 2 MB written and the connection closed at once: alpha's gateway
    // puts all of it on the flow before closing it, beta's daemon keeps
    // the flow's end open until its gateway has taken all it holds, and
    // the server behind beta gets every byte and then the end. (Before,
    // beta's daemon dropped what its gateway had not taken when the flow
    // ended: under load, the last 145 KB once.)
    let mut c = TcpStream::connect(("127.0.0.1", sink_port)).unwrap();
    c.write_all(&vec![5u8; 2_000_000]).unwrap();
    drop(c);
    wait_for_lines(&log_a, "closed: 2000000 B to RINA, 0 B from RINA", 1);
    let got = sunk.recv_timeout(T).expect("the server's connection ended");
    assert_eq!(got, 2_000_000, "bytes from 2 MB");

    // The server behind `down` does not answer: beta's gateway refuses the
    // flow with the reason, alpha's closes the connection and says why;
    // `nobody` is no one's name.
    for port in [down_port, nobody_port] {
        let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.set_read_timeout(Some(T)).unwrap();
        let mut buf = [0u8; 16];
        assert!(
            matches!(c.read(&mut buf), Ok(0) | Err(_)),
            "a connection with no flow stays open"
        );
    }
    let log = wait_for_lines(&log_a, "cannot allocate a flow", 2);
    let why = format!("cannot connect to 127.0.0.1:{down_at}");
    assert!(
        log.contains(&why),
        "the refusal's reason is not reported: {log}"
    );
    assert!(log.contains("-> nobody: cannot allocate a flow"), "{log}");
    assert_eq!(log.matches(" up: ").count(), 4, "{log}");
    eprintln!("alpha's gateway:\n{log}beta's gateway:\n{}", read(&log_b));
}

/// A TCP server that takes no connection: a listening socket with a
/// backlog of 0 whose one queued connection is never accepted, so that
/// the kernel drops further SYNs and their connections time out. Its port,
/// and what must live as long as it should.
fn deaf_server() -> (u16, (TcpListener, TcpStream)) {
    use nix::sys::socket::{
        bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, SockaddrIn,
    };
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn::new(127, 0, 0, 1, 0),
    )
    .unwrap();
    listen(&fd, Backlog::new(0).unwrap()).unwrap();
    let l = TcpListener::from(fd);
    let port = l.local_addr().unwrap().port();
    let queued = TcpStream::connect(("127.0.0.1", port)).unwrap();
    (port, (l, queued))
}

/// Flow requests to a server that does not answer are tried at once, not
/// one after the other: four at the same time each get the connection's
/// own refusal (timed out after 1 s) back, where one at a time the last
/// would have waited past the daemon's 2 s and heard only that no one
/// answered.
#[test]
fn requests_to_a_server_that_does_not_answer_are_refused_at_once_with_the_reason() {
    let (mut procs, a, b) = normal_pair("gw-deaf", |_| "\"deaf\" = 2".into());
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let dir = procs.1.clone();
    let (deaf_port, _deaf) = deaf_server();
    let to = format!("deaf=127.0.0.1:{deaf_port}");
    let args = [
        "--socket",
        b,
        "--dif",
        "net",
        "--connect-timeout-ms",
        "1000",
        "--rina-to-tcp",
        &to,
    ];
    gateway(&mut procs, &args, &dir.join("gw-b.log"), 1);
    let log_a = dir.join("gw-a.log");
    let args = [
        "--socket",
        a,
        "--dif",
        "net",
        "--tcp-to-rina",
        "127.0.0.1:0=deaf",
    ];
    let port = listening_port(&gateway(&mut procs, &args, &log_a, 1)[0]);
    let clients: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
                c.set_read_timeout(Some(T)).unwrap();
                matches!(c.read(&mut [0u8; 16]), Ok(0) | Err(_))
            })
        })
        .collect();
    for c in clients {
        assert!(c.join().unwrap(), "a connection with no flow stays open");
    }
    let log = wait_for_lines(&log_a, "cannot allocate a flow", 4);
    let why = format!("cannot connect to 127.0.0.1:{deaf_port}");
    assert_eq!(log.matches(&why).count(), 4, "{log}");
}

/// A daemon that restarts is waited for: the gateway registers its name
/// again, and connections are carried again once the DIF is back. A name
/// withdrawn by an administrator ends its mapping, and with it a gateway
/// that has no other (exit code 1, saying why).
#[test]
fn a_restarted_daemon_gets_the_name_again_and_a_withdrawn_name_ends_the_gateway() {
    let (mut procs, a, b) = normal_pair("gw-restart", |_| "\"web\" = 2".into());
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let dir = procs.1.clone();
    let log_b = dir.join("gw-b.log");
    let echo = format!("web=127.0.0.1:{}", echo_server());
    gateway(
        &mut procs,
        &["--socket", b, "--dif", "net", "--rina-to-tcp", &echo],
        &log_b,
        1,
    );
    let ready = gateway(
        &mut procs,
        &[
            "--socket",
            a,
            "--dif",
            "net",
            "--tcp-to-rina",
            "127.0.0.1:0=web",
        ],
        &dir.join("gw-a.log"),
        1,
    );
    let port = listening_port(&ready[0]);
    round_trip(port, 1, 10_000);

    // Beta's daemon killed and started again on the same socket.
    let bins = bin_dir();
    let _ = procs.0[1].kill();
    let _ = procs.0[1].wait();
    procs.0[1] = common::spawn_rinad(&bins, &dir.join("beta.toml"), Path::new(b));
    wait_for_lines(&log_b, "web registered again", 1);
    // Once alpha's DIF has beta again, a connection goes through.
    common::wait_until("a connection through the DIF again", T, || {
        let Ok(mut c) = TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        c.set_read_timeout(Some(T)).unwrap();
        let mut got = [0u8; 5];
        c.write_all(b"again").is_ok() && c.read_exact(&mut got).is_ok() && &got == b"again"
    });

    // The name withdrawn: beta's gateway, which has no other mapping, ends.
    let out = Command::new(bins.join("rinactl"))
        .args(["--socket", b, "unregister", "web"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gw_b = &mut procs.0[2];
    let mut code = None;
    common::wait_until("beta's gateway to exit", T, || {
        code = gw_b.try_wait().unwrap().map(|s| s.code());
        code.is_some()
    });
    assert_eq!(code, Some(Some(1)));
    let log = read(&log_b);
    assert!(log.contains("web: no more flow requests"), "{log}");
}
