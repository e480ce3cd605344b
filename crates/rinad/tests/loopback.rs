//! Integration tests: real `rinad` processes on loopback, applications
//! talking through a shim DIF over UDP with the `rina` client library.

mod common;

use common::{name, pair, pair_bound, roundtrip, wait_for, Daemon};
use rina::{Client, ErrorKind, Flow, QosSpec};
use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

/// Registers `n` at `d` and echoes every SDU of every accepted flow, until
/// no request comes for `idle`.
fn echo_server(d: &Daemon, n: &str) -> JoinHandle<()> {
    let mut c = d.client();
    let difs = c.register(&name(n), None).unwrap();
    assert_eq!(difs, vec!["udp".to_string()]);
    std::thread::spawn(move || {
        while let Ok(Some(req)) = c.next_request_timeout(Duration::from_secs(30)) {
            let Ok(flow) = c.accept(&req) else { continue };
            std::thread::spawn(move || echo(flow));
        }
    })
}

fn echo(flow: Flow) {
    let mut buf = vec![0u8; 65536];
    while let Ok(n) = flow.read(&mut buf) {
        if flow.write(&buf[..n]).is_err() {
            return;
        }
    }
}

#[test]
fn register_allocate_accept_read_write_deallocate() {
    let (alpha, beta) = pair(&["echo"]);
    let _srv = echo_server(&beta, "echo");
    let mut c = alpha.client();
    let flow = c
        .allocate(&name("tester/1"), &name("echo"), None, &QosSpec::default())
        .unwrap();
    assert_eq!(flow.info().remote, name("echo"));
    assert_eq!(flow.info().dif, "udp");
    assert_eq!(flow.info().max_sdu, 1400);
    for i in 0..20u8 {
        let sdu = vec![i; 100 + i as usize];
        assert_eq!(roundtrip(&flow, &sdu), sdu, "SDU {i} echoed intact");
    }
    let max = vec![7u8; 1400];
    assert_eq!(roundtrip(&flow, &max), max, "a max-size SDU passes");

    // Both daemons list the flow with its counters.
    let fa = c.list_flows().unwrap();
    assert_eq!(fa.len(), 1);
    assert_eq!(fa[0].counters.sdus_out, 21);
    assert_eq!(fa[0].counters.sdus_in, 21);
    let names = beta.client().list_names().unwrap();
    assert_eq!(names.len(), 1);
    assert_eq!(names[0].name, name("echo"));
    assert!(!names[0].accepts, "the application accepts its flows");
    wait_for("beta to list the flow", T, || {
        beta.client().list_flows().unwrap().len() == 1
    });

    // Deallocation at one end frees the flow at both.
    flow.deallocate();
    wait_for("alpha to free the flow", T, || {
        alpha.client().list_flows().unwrap().is_empty()
    });
    wait_for("beta to free the flow", T, || {
        beta.client().list_flows().unwrap().is_empty()
    });
}

#[test]
fn refusal_carries_the_reason() {
    let (alpha, beta) = pair(&["picky"]);
    let mut srv = beta.client();
    srv.register(&name("picky"), Some("udp")).unwrap();
    let t = std::thread::spawn(move || {
        let req = srv.next_request().unwrap();
        assert_eq!(req.remote, name("asker"));
        assert_eq!(req.local, name("picky"));
        srv.refuse(&req, "not today").unwrap();
        srv
    });
    let err = alpha
        .client()
        .allocate(&name("asker"), &name("picky"), None, &QosSpec::default())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Refused, "{err}");
    assert!(err.to_string().contains("not today"), "{err}");
    drop(t.join().unwrap());
}

#[test]
fn unknown_and_unregistered_names_and_dif() {
    let (alpha, _beta) = pair(&["ghost"]);
    let mut c = alpha.client();
    let e = c
        .allocate(&name("me"), &name("nobody"), None, &QosSpec::default())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NameNotFound, "{e}");
    let e = c
        .allocate(&name("me"), &name("ghost"), None, &QosSpec::default())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotRegistered, "{e}");
    assert!(e.to_string().contains("ghost"), "{e}");
    let e = c.register(&name("me"), Some("nope")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnknownDif, "{e}");
    let e = c
        .allocate(
            &name("me"),
            &name("ghost"),
            Some("nope"),
            &QosSpec::default(),
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnknownDif, "{e}");
}

#[test]
fn unsatisfiable_qos_and_oversize_sdus() {
    let (alpha, beta) = pair(&["echo"]);
    let _srv = echo_server(&beta, "echo");
    let mut c = alpha.client();
    let reliable = QosSpec {
        reliable: true,
        ..Default::default()
    };
    let e = c
        .allocate(&name("me"), &name("echo"), None, &reliable)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::QosNotSatisfiable, "{e}");

    let flow = c
        .allocate(&name("me"), &name("echo"), None, &QosSpec::default())
        .unwrap();
    let e = flow.write(&vec![0u8; 1401]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::SduTooLarge);
    assert!(
        e.to_string().contains("1401") && e.to_string().contains("1400"),
        "{e}"
    );
    assert_eq!(roundtrip(&flow, b"still fine"), b"still fine");
}

/// Environment variable that turns [`child_application`] into the body of
/// the application process started by [`an_application_that_dies`].
const CHILD_ENV: &str = "RINAD_TEST_CHILD_SOCKET";

/// Not a test by itself: when [`CHILD_ENV`] is set, this is a separate
/// application process that registers a name, allocates a flow and waits
/// to be killed. Without the variable it does nothing.
#[test]
fn child_application() {
    let Ok(sock) = std::env::var(CHILD_ENV) else {
        return;
    };
    let ready_file = std::path::PathBuf::from(format!("{sock}.child-ready"));
    let mut c = Client::connect_to(&sock).unwrap();
    c.register(&name("doomed"), None).unwrap();
    let flow = c
        .allocate(&name("doomed"), &name("echo"), None, &QosSpec::default())
        .unwrap();
    std::fs::write(&ready_file, flow.info().port.to_string()).unwrap();
    loop {
        std::thread::park();
    }
}

#[test]
fn an_application_that_dies() {
    let (alpha, beta) = pair(&["echo"]);
    let _srv = echo_server(&beta, "echo");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_application",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &alpha.socket)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ready_file = format!("{}.child-ready", alpha.socket.display());
    wait_for("the child application to get its flow", T, || {
        std::path::Path::new(&ready_file).exists()
    });
    let mut c = alpha.client();
    assert_eq!(c.list_names().unwrap().len(), 1);
    assert_eq!(c.list_flows().unwrap().len(), 1);
    wait_for("beta to list the flow", T, || {
        beta.client().list_flows().unwrap().len() == 1
    });

    child.kill().unwrap();
    child.wait().unwrap();
    wait_for(
        "alpha to free the dead application's name and flow",
        T,
        || c.list_names().unwrap().is_empty() && c.list_flows().unwrap().is_empty(),
    );
    wait_for("beta to learn the flow is gone", T, || {
        beta.client().list_flows().unwrap().is_empty()
    });
    // The name is free again.
    c.register(&name("doomed"), None).unwrap();
}

#[test]
fn a_daemon_that_dies_does_not_hang_its_applications() {
    let (mut alpha, beta) = pair(&["echo"]);
    let _srv = echo_server(&beta, "echo");
    let mut c = alpha.client();
    let flow = c
        .allocate(&name("me"), &name("echo"), None, &QosSpec::default())
        .unwrap();
    assert_eq!(roundtrip(&flow, b"x"), b"x");
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 100];
        flow.read_timeout(&mut buf, Duration::from_secs(20))
    });
    let socket = alpha.socket.clone();
    alpha.kill();
    let r = reader.join().unwrap();
    let e = r.expect_err("a read on a flow of a dead daemon fails, it does not time out");
    assert_eq!(e.kind(), ErrorKind::DaemonGone, "{e}");
    let e = c.list_flows().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DaemonGone, "{e}");
    let e = Client::connect_to(&socket).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DaemonNotRunning, "{e}");
}

#[test]
fn malformed_datagrams_are_counted_and_dropped() {
    let (alpha, beta) = pair(&["echo"]);
    let _srv = echo_server(&beta, "echo");
    let flow = alpha
        .client()
        .allocate(&name("me"), &name("echo"), None, &QosSpec::default())
        .unwrap();
    assert_eq!(roundtrip(&flow, b"before"), b"before");
    let junk = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let target = beta.udp_addr();
    for d in [&b""[..], &[0xff, 1, 2, 3], &[0x02, 0, 0], &[0x03; 40]] {
        junk.send_to(d, &target).unwrap();
    }
    // Data for a flow that does not exist, from a stranger.
    junk.send_to(&[0x01, 0, 0, 0, 99, b'x'], &target).unwrap();
    wait_for("beta to count the bad datagrams", T, || {
        beta.counter("rx_malformed") == 4 && beta.counter("rx_unknown_flow") == 1
    });
    assert_eq!(
        roundtrip(&flow, b"after"),
        b"after",
        "the flow is undisturbed"
    );
    assert_eq!(beta.client().list_names().unwrap().len(), 1);
}

#[test]
fn bad_configuration_is_refused_naming_key_and_line() {
    let dir = common::temp_dir("badcfg");
    let conf = dir.join("bad.toml");
    std::fs::write(
        &conf,
        "[system]\nname = \"x\"\n\n[[ipcp]]\nname = \"x.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbnd = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rinad"))
        .arg("--config")
        .arg(&conf)
        .arg("--socket")
        .arg(dir.join("s"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 8") && err.contains("bnd"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_second_daemon_on_the_same_socket_is_refused() {
    let a = Daemon::start("solo", &[]);
    let conf = a.dir.join("rinad.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_rinad"))
        .arg("--config")
        .arg(&conf)
        .arg("--socket")
        .arg(&a.socket)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already listening"), "{err}");
    // The first one still answers.
    assert_eq!(a.client().list_ipcps().unwrap().len(), 1);
}

#[test]
fn many_flows_between_two_systems() {
    let (alpha, beta) = pair(&["echo"]);
    let _srv = echo_server(&beta, "echo");
    let mut c = alpha.client();
    let flows: Vec<Flow> = (0..16)
        .map(|i| {
            c.allocate(
                &name(&format!("me/{i}")),
                &name("echo"),
                None,
                &QosSpec::default(),
            )
            .unwrap()
        })
        .collect();
    for (i, f) in flows.iter().enumerate() {
        let sdu = format!("flow {i}");
        assert_eq!(roundtrip(f, sdu.as_bytes()), sdu.as_bytes());
    }
    let ports: std::collections::HashSet<u32> = flows.iter().map(|f| f.info().port).collect();
    assert_eq!(ports.len(), 16, "port-ids are unique");
}

#[test]
fn shim_udp_over_ipv6() {
    let (alpha, beta) = pair_bound("[::1]:0", &["echo"]);
    assert!(beta.udp_addr().starts_with("[::1]:"), "{}", beta.udp_addr());
    let _srv = echo_server(&beta, "echo");
    let flow = alpha
        .client()
        .allocate(&name("v6"), &name("echo"), None, &QosSpec::default())
        .unwrap();
    assert_eq!(roundtrip(&flow, b"over IPv6"), b"over IPv6");
}

#[test]
fn a_flow_works_with_tokio() {
    let (alpha, beta) = pair(&["echo"]);
    let _srv = echo_server(&beta, "echo");
    let flow = alpha
        .client()
        .allocate(&name("async"), &name("echo"), None, &QosSpec::default())
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let flow = flow.into_async().unwrap();
        let mut buf = vec![0u8; 2048];
        for i in 0..50u32 {
            let sdu = i.to_be_bytes().repeat(1 + i as usize);
            flow.write(&sdu).await.unwrap();
            let n = tokio::time::timeout(T, flow.read(&mut buf))
                .await
                .expect("reply within the deadline")
                .unwrap();
            assert_eq!(&buf[..n], &sdu[..]);
        }
    });
}

#[test]
fn an_empty_packet_does_not_close_the_flow() {
    use std::os::fd::AsRawFd;
    let (alpha, beta) = pair(&["echo"]);
    let _srv = echo_server(&beta, "echo");
    let mut c = alpha.client();
    // The socket carries the SDUs (no rings), as for a C or Python client.
    c.set_rings(false);
    let flow = c
        .allocate(&name("raw"), &name("echo"), None, &QosSpec::default())
        .unwrap();
    // A client in another language may write a zero-length packet; the
    // Rust API refuses to, so write it on the descriptor directly.
    // SAFETY: a valid descriptor and an empty buffer.
    let n = unsafe { libc::send(flow.as_raw_fd(), [].as_ptr(), 0, libc::MSG_NOSIGNAL) };
    assert_eq!(n, 0);
    assert_eq!(roundtrip(&flow, b"still open"), b"still open");
    let f = &c.list_flows().unwrap()[0];
    assert_eq!(
        f.counters.drops_out, 1,
        "the empty SDU was counted and dropped"
    );
    assert_eq!(f.counters.sdus_out, 1);
}

/// A burst on shim-udp, through the batched send (`sendmmsg`, segmented
/// runs) and receive (`recvmmsg`, coalesced reads) of both daemons, with
/// the application on its socket and on shared-memory rings: every SDU
/// that arrives is intact and in order, most of the burst crosses
/// loopback, and each SDU the receiving daemon took in is either read or
/// counted as dropped for a reader that fell behind. SDU sizes vary so
/// that runs of one size end and start.
#[test]
fn a_burst_arrives_intact_and_in_order_through_the_batches() {
    const N: u32 = 3000;
    let size = |k: u32| [1400usize, 1400, 1400, 700, 1400, 64, 1400][k as usize % 7];
    let sdu = |k: u32| {
        let mut v = vec![(k % 251) as u8; size(k)];
        v[..4].copy_from_slice(&k.to_be_bytes());
        v
    };
    for rings in [false, true] {
        let (alpha, beta) = pair(&["sink"]);
        let mut srv = beta.client();
        srv.set_rings(rings);
        srv.register(&name("sink"), None).unwrap();
        let reader = std::thread::spawn(move || {
            let req = srv.next_request_timeout(T).unwrap().expect("a request");
            let flow = srv.accept(&req).unwrap();
            let mut got = Vec::new();
            let mut buf = vec![0u8; 2048];
            while let Ok(Some(n)) = flow.read_timeout(&mut buf, Duration::from_secs(2)) {
                got.push(buf[..n].to_vec());
            }
            // What beta's daemon took from the network for this flow, and
            // dropped because this reader fell behind (an unreliable flow
            // to a slow reader drops, counted, rather than blocking).
            let f = srv.list_flows().unwrap().remove(0).counters;
            (got, f.sdus_in, f.drops_in)
        });
        let mut c = alpha.client();
        c.set_rings(rings);
        let flow = c
            .allocate(&name("burst"), &name("sink"), None, &QosSpec::default())
            .unwrap();
        assert_eq!(flow.has_rings(), rings);
        for k in 0..N {
            flow.write(&sdu(k)).unwrap();
        }
        let (got, taken_in, dropped_in) = reader.join().unwrap();
        let mut last = None;
        for g in &got {
            let k = u32::from_be_bytes(g[..4].try_into().unwrap());
            assert_eq!(*g, sdu(k), "SDU {k} intact (rings {rings})");
            assert!(
                last.is_none_or(|l| k > l),
                "{k} after {last:?} (rings {rings})"
            );
            last = Some(k);
        }
        // Loopback takes nearly all of the burst through the batches; what
        // the reader then gets depends on how fast it is scheduled (on a
        // loaded host it falls behind), but every SDU is either read or
        // counted as dropped at the daemon.
        assert!(
            taken_in as u32 > N / 2,
            "{taken_in} of {N} crossed loopback (rings {rings})"
        );
        assert_eq!(
            got.len() as u64 + dropped_in,
            taken_in,
            "read {} and dropped {dropped_in} of the {taken_in} taken in (rings {rings})",
            got.len()
        );
        let (tx, calls) = (alpha.counter("tx_datagrams"), alpha.counter("tx_syscalls"));
        println!(
            "rings {rings}: {} of {N} SDUs arrived ({dropped_in} dropped for the slow reader); alpha sent {tx} datagrams in {calls} calls (gso {}), beta read in {} calls (gro {})",
            got.len(),
            alpha.counter("tx_gso"),
            beta.counter("rx_syscalls"),
            beta.counter("rx_gro"),
        );
    }
}

/// CPU seconds (user and system) process `pid` has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command's name, which is in parentheses.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks as f64 / hz
}

/// CPU seconds `pid` uses over the next `d`.
fn cpu_over(pid: u32, d: Duration) -> f64 {
    let c0 = cpu_seconds(pid);
    std::thread::sleep(d);
    cpu_seconds(pid) - c0
}

/// Daemons with `busy_poll_us` carry flows as any other, keep polling
/// (and so use CPU) for the window after their last event, and then sleep:
/// a daemon that kept spinning would hold a core for ever.
#[test]
fn busy_polling_daemons_carry_flows_and_sleep_once_the_window_is_over() {
    let poll = "busy_poll_us = 1000000";
    let beta = common::Daemon::start_system("beta", poll, "127.0.0.1:0", &[]);
    let addr = beta.udp_addr();
    let alpha = common::Daemon::start_system("alpha", poll, "127.0.0.1:0", &[("echo", addr)]);
    let _srv = echo_server(&beta, "echo");
    let mut c = alpha.client();
    let flow = c
        .allocate(&name("tester/1"), &name("echo"), None, &QosSpec::default())
        .unwrap();
    for i in 0..50u8 {
        let sdu = vec![i; 64 + i as usize];
        assert_eq!(roundtrip(&flow, &sdu), sdu);
    }
    // Within the second after the last SDU, the daemon polls on.
    let spinning = cpu_over(alpha.child.id(), Duration::from_millis(500));
    drop(flow);
    drop(c);
    // A second and a half after the last event, it sleeps.
    std::thread::sleep(Duration::from_millis(1500));
    let idle = cpu_over(alpha.child.id(), Duration::from_secs(1));
    println!("alpha's CPU: {spinning:.2} s in 0.5 s of its window, {idle:.2} s in 1 s after it");
    assert!(
        spinning >= 0.05,
        "polled on after the last SDU: {spinning:.2} s of CPU in 0.5 s"
    );
    assert!(
        idle < 0.05,
        "slept after the window: {idle:.2} s of CPU in 1 s"
    );
}

/// SDUs an application writes just before it closes its shim-udp flow
/// reach the other end before the end of the flow does, with sockets and
/// with rings at both ends. Twenty flows a case.
#[test]
fn sdus_written_just_before_a_close_reach_the_reader() {
    let (alpha, beta) = pair(&["late", "late-rings"]);
    for (rings, late) in [(false, "late"), (true, "late-rings")] {
        let mut srv = beta.client();
        srv.set_rings(rings);
        srv.register(&name(late), None).unwrap();
        let (tx, accepted) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            while let Ok(Some(req)) = srv.next_request_timeout(T) {
                if tx.send(srv.accept(&req).unwrap()).is_err() {
                    return;
                }
            }
        });
        let mut c = alpha.client();
        c.set_rings(rings);
        for round in 0..20 {
            let flow = c
                .allocate(&name("early"), &name(late), None, &QosSpec::default())
                .unwrap();
            let reader = accepted.recv_timeout(T).unwrap();
            for i in 0..5u8 {
                flow.write(&[i; 100]).unwrap();
            }
            drop(flow);
            let mut buf = [0u8; 200];
            let mut got = Vec::new();
            while let Ok(Some(n)) = reader.read_timeout(&mut buf, T) {
                got.push(buf[..n].to_vec());
            }
            let want: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 100]).collect();
            assert_eq!(got, want, "rings {rings}, flow {round}");
        }
    }
}

/// A daemon that cannot start (its UDP port is taken) says why and leaves
/// no control socket behind for clients to find.
#[test]
fn a_daemon_that_cannot_start_leaves_no_socket_behind() {
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap();
    let dir = common::temp_dir("nobind");
    let conf = dir.join("rinad.toml");
    std::fs::write(
        &conf,
        format!("[system]\nname = \"x\"\n\n[[ipcp]]\nname = \"x.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"{port}\"\n"),
    )
    .unwrap();
    let socket = dir.join("rinad.sock");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rinad"))
        .arg("--config")
        .arg(&conf)
        .arg("--socket")
        .arg(&socket)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains(&port.to_string()), "{err}");
    assert!(
        !socket.exists(),
        "the socket of a daemon that did not start"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
