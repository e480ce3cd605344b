//! Three systems in a line, A - B - C, each with a shim DIF over UDP to its
//! neighbours and one normal DIF across all three: A reaches C through B's
//! relaying, a flow from A to C fails cleanly when B's daemon dies, and A
//! takes a restarted B back.

mod common;

use common::free_port;

use common::{echo_server, name, wait_for, Daemon};
use rina::{ErrorKind, QosSpec};
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

/// One system: `me` at `addr` with UDP port `port`; `peers` are its
/// neighbours (name, address, UDP port); `routes` are (destination, next hop).
fn system(
    me: &str,
    addr: u64,
    port: u16,
    peers: &[(&str, u64, u16)],
    routes: &[(u64, u64)],
    names: &[(&str, u64)],
) -> String {
    system_with(me, addr, port, peers, routes, names, "")
}

/// Like [`system`], with extra keys for the normal IPCP (e.g. `routing`).
fn system_with(
    me: &str,
    addr: u64,
    port: u16,
    peers: &[(&str, u64, u16)],
    routes: &[(u64, u64)],
    names: &[(&str, u64)],
    extra: &str,
) -> String {
    let mut s = format!(
        "[system]\nname = \"{me}\"\n\n[[ipcp]]\nname = \"{me}.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:{port}\"\n\n[ipcp.directory]\n"
    );
    for (p, _, pp) in peers {
        s += &format!("\"{p}.net\" = \"127.0.0.1:{pp}\"\n");
    }
    s += &format!(
        "\n[[ipcp]]\nname = \"{me}.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = {addr}\n{extra}"
    );
    for (p, pa, _) in peers {
        s += &format!("\n[[ipcp.neighbor]]\nname = \"{p}.net\"\nover = \"udp\"\naddress = {pa}\n");
    }
    s += "\n[ipcp.routes]\n";
    for (d, h) in routes {
        s += &format!("\"{d}\" = {h}\n");
    }
    s += "\n[ipcp.names]\n";
    for (n, a) in names {
        s += &format!("\"{n}\" = {a}\n");
    }
    s
}

fn counter(d: &Daemon, ipcp: &str, key: &str) -> u64 {
    d.client()
        .list_ipcps()
        .map(|v| {
            v.into_iter()
                .find(|i| i.name == ipcp)
                .and_then(|i| i.counters.get(key).copied())
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

#[test]
fn a_reaches_c_through_b_and_fails_cleanly_when_b_dies() {
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let c = Daemon::start_with("c", &system("c", 3, pc, &[("b", 2, pb)], &[(1, 2)], &[]));
    let mut b = Daemon::start_with(
        "b",
        &system("b", 2, pb, &[("a", 1, pa), ("c", 3, pc)], &[], &[]),
    );
    let a = Daemon::start_with(
        "a",
        &system("a", 1, pa, &[("b", 2, pb)], &[(3, 2)], &[("echo", 3)]),
    );
    wait_for("both N-1 flows of B", T, || {
        counter(&b, "b.net", "neighbors_up") == 2
    });

    let server = echo_server(&c, "net");
    let reliable = QosSpec {
        reliable: true,
        ..Default::default()
    };
    let flow = a
        .client()
        .allocate(&name("pinger"), &name("echo"), Some("net"), &reliable)
        .unwrap();
    let mut buf = vec![0u8; 70_000];
    for i in 0..50u32 {
        let sdu = i.to_be_bytes().repeat(50);
        flow.write(&sdu).unwrap();
        let n = flow
            .read_timeout(&mut buf, T)
            .unwrap()
            .expect("echo through B");
        assert_eq!(&buf[..n], &sdu[..]);
    }
    assert!(
        counter(&b, "b.net", "relayed") >= 100,
        "B relayed both directions"
    );

    // B dies: A's retransmissions go unanswered until the connection gives
    // up, and the application's read fails instead of hanging. (About 20 s
    // on an idle machine; the retransmission timer backs off from an RTT
    // that a loaded machine stretches, hence the long bound.)
    b.kill();
    flow.write(b"anyone there?").unwrap();
    let started = std::time::Instant::now();
    let r = flow.read_timeout(&mut buf, Duration::from_secs(300));
    let e = r.expect_err("the flow fails, it does not time out");
    assert_eq!(e.kind(), ErrorKind::DaemonGone, "{e}");
    eprintln!("flow failed {:?} after B died", started.elapsed());
    drop(server);
}

#[test]
fn link_state_routing_finds_c_without_static_routes() {
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let ls = "routing = \"link-state\"\n";
    let c = Daemon::start_with("c", &system_with("c", 3, pc, &[("b", 2, pb)], &[], &[], ls));
    let b = Daemon::start_with(
        "b",
        &system_with("b", 2, pb, &[("a", 1, pa), ("c", 3, pc)], &[], &[], ls),
    );
    let a = Daemon::start_with(
        "a",
        &system_with("a", 1, pa, &[("b", 2, pb)], &[], &[("echo", 3)], ls),
    );
    wait_for("A to learn a route to C", T, || {
        counter(&a, "a.net", "routing_destinations") == 2
    });
    let server = echo_server(&c, "net");
    let flow = a
        .client()
        .allocate(
            &name("pinger"),
            &name("echo"),
            Some("net"),
            &QosSpec::default(),
        )
        .unwrap();
    let mut buf = vec![0u8; 2048];
    flow.write(b"routed").unwrap();
    let n = flow.read_timeout(&mut buf, T).unwrap().expect("echo via B");
    assert_eq!(&buf[..n], b"routed");
    assert!(counter(&b, "b.net", "relayed") >= 2);
    let rib = a
        .client()
        .read_rib("a.net", Some("/ra/nexthops"), None)
        .unwrap();
    assert!(
        rib.iter().any(|o| o.name == "/ra/nexthops/key=3"),
        "{rib:#?}"
    );
    drop(flow);
    drop(server);
}

/// A server that answers every SDU with `tag`, registered as `echo` in DIF
/// `net` at `d`, until its control connection is dropped (the returned
/// sender ends it).
fn tagged_server(d: &Daemon, tag: &'static [u8]) -> std::sync::mpsc::Sender<()> {
    let mut srv = d.client();
    srv.register(&name("echo"), Some("net")).unwrap();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || loop {
        if stopped.try_recv().is_ok() {
            return; // dropping `srv` withdraws the registration
        }
        let Ok(Some(req)) = srv.next_request_timeout(Duration::from_millis(100)) else {
            continue;
        };
        let Ok(flow) = srv.accept(&req) else { continue };
        std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            while flow.read(&mut buf).is_ok() {
                if flow.write(tag).is_err() {
                    return;
                }
            }
        });
    });
    stop
}

/// Allocates a flow to `echo` in `net` from `a` and returns who answered,
/// retrying while the DIF is still learning where `echo` is.
fn who_answers(a: &Daemon, expect: &[u8]) -> Vec<u8> {
    let deadline = std::time::Instant::now() + T;
    let mut last = Vec::new();
    while std::time::Instant::now() < deadline {
        if let Ok(flow) = a.client().allocate(
            &name("asker"),
            &name("echo"),
            Some("net"),
            &QosSpec::default(),
        ) {
            let mut buf = [0u8; 256];
            if flow.write(b"who?").is_ok() {
                if let Ok(Some(n)) = flow.read_timeout(&mut buf, Duration::from_secs(2)) {
                    last = buf[..n].to_vec();
                    if last == expect {
                        return last;
                    }
                }
            }
        }
        std::thread::park_timeout(Duration::from_millis(100));
    }
    last
}

#[test]
fn an_application_that_moves_is_found_at_its_new_place() {
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let dynamic = "routing = \"link-state\"\ndirectory_mode = \"distributed\"\n";
    let c = Daemon::start_with(
        "c",
        &system_with("c", 3, pc, &[("b", 2, pb)], &[], &[], dynamic),
    );
    let b = Daemon::start_with(
        "b",
        &system_with("b", 2, pb, &[("a", 1, pa), ("c", 3, pc)], &[], &[], dynamic),
    );
    // No static directory anywhere: A learns where `echo` is from the DIF.
    let a = Daemon::start_with(
        "a",
        &system_with("a", 1, pa, &[("b", 2, pb)], &[], &[], dynamic),
    );

    let stop_c = tagged_server(&c, b"C");
    assert_eq!(who_answers(&a, b"C"), b"C", "found at C");

    // The application moves from C to B; the client does not change.
    stop_c.send(()).unwrap();
    let _stop_b = tagged_server(&b, b"B");
    assert_eq!(who_answers(&a, b"B"), b"B", "found at its new place, B");
}

/// One echo from A to `echo` at C over a fresh flow, within `wait`.
fn echoes(a: &Daemon, wait: Duration) -> bool {
    let Ok(flow) = a.client().allocate(
        &name("pinger"),
        &name("echo"),
        Some("net"),
        &QosSpec::default(),
    ) else {
        return false;
    };
    let mut buf = vec![0u8; 64];
    flow.write(b"ping").is_ok() && matches!(flow.read_timeout(&mut buf, wait), Ok(Some(4)))
}

/// B, the relay, with every address written in the configuration, is
/// killed and started again: A notices the silence on its N-1 flow, sets
/// one up again, and reaches C through the new B.
#[test]
fn a_restarted_relay_with_configured_addresses_is_taken_back() {
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let c = Daemon::start_with("c", &system("c", 3, pc, &[("b", 2, pb)], &[(1, 2)], &[]));
    let b_cfg = system("b", 2, pb, &[("a", 1, pa), ("c", 3, pc)], &[], &[]);
    let mut b = Daemon::start_with("b", &b_cfg);
    let a = Daemon::start_with(
        "a",
        &system("a", 1, pa, &[("b", 2, pb)], &[(3, 2)], &[("echo", 3)]),
    );
    let server = echo_server(&c, "net");
    wait_for("A to reach echo at C", T, || {
        echoes(&a, Duration::from_secs(1))
    });
    server.join().unwrap();

    b.kill();
    wait_for("A to time B out", T, || {
        counter(&a, "a.net", "membership_neighbor_timeouts") >= 1
    });
    let _b = Daemon::start_with("b", &b_cfg);
    let started = std::time::Instant::now();
    let server = echo_server(&c, "net");
    wait_for("A to reach echo at C through the new B", T, || {
        echoes(&a, Duration::from_secs(1))
    });
    eprintln!("C reachable {:?} after B started again", started.elapsed());
    drop(server);
}
