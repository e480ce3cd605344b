//! Flow keepalive (`rina_core::normal::keepalive`) in real `rinad`
//! processes: two daemons with a normal DIF over shim-udp on loopback,
//! their one QoS cube with `keepalive_ms`, an application flow left idle.
//! Between live daemons the flow stays up on probes and answers; with the
//! peer daemon killed it ends after the misses, the application told. A
//! reload that changes only `keepalive_ms` keeps the IPCP and its flows and
//! switches them to the new interval.

mod common;

use common::{counter, echo_server_all, free_port, name, normal_over_udp, wait_for, Daemon};
use rina::QosSpec;
use std::time::{Duration, Instant};

/// Deadline for set-up steps (daemons, N-1 flows, allocation).
const T: Duration = Duration::from_secs(15);

/// The configuration of system `me` (normal IPCP `me.net` at `addr` over
/// shim-udp on `port`), neighbour of `peer`; its one QoS cube, `idle`
/// (unreliable, what `QosSpec::default()` gets), has keepalive `ka_ms`.
fn system(me: &str, addr: u64, port: u16, peer: (&str, u64, u16), ka_ms: u64) -> String {
    let cube = format!("\n[[ipcp.qos_cube]]\nid = 1\nname = \"idle\"\nkeepalive_ms = {ka_ms}\n");
    normal_over_udp(me, (addr, port), peer, "\"echo\" = 2", &cube)
}

/// Alpha (address 1) and beta (address 2, where `echo` runs), their normal
/// IPCPs neighbours, both cubes with keepalive `ka_ms`; alpha's ports, to
/// write its configuration again.
fn pair(ka_ms: u64) -> (Daemon, Daemon, (u16, u16)) {
    let (pa, pb) = (free_port(), free_port());
    let alpha = Daemon::start_with("alpha", &system("alpha", 1, pa, ("beta", 2, pb), ka_ms));
    let beta = Daemon::start_with("beta", &system("beta", 2, pb, ("alpha", 1, pa), ka_ms));
    wait_for("the N-1 flow between the normal IPCPs", T, || {
        counter(&alpha, "alpha.net", "neighbors_up") == 1
            && counter(&beta, "beta.net", "neighbors_up") == 1
    });
    (alpha, beta, (pa, pb))
}

/// A flow from alpha to `echo`, checked with one echo.
fn echo_flow(client: &mut rina::Client) -> rina::Flow {
    let flow = client
        .allocate(
            &name("idler"),
            &name("echo"),
            Some("net"),
            &QosSpec::default(),
        )
        .unwrap();
    assert_echoes(&flow, b"hello");
    flow
}

fn assert_echoes(flow: &rina::Flow, sdu: &[u8]) {
    let mut buf = vec![0u8; 2000];
    flow.write(sdu).unwrap();
    let n = flow.read_timeout(&mut buf, T).unwrap().expect("the echo");
    assert_eq!(&buf[..n], sdu);
}

/// Keepalive counters of `ipcp` at `d`: (sent, answered, expired).
fn ka(d: &Daemon, ipcp: &str) -> (u64, u64, u64) {
    (
        counter(d, ipcp, "keepalives_sent"),
        counter(d, ipcp, "keepalives_answered"),
        counter(d, ipcp, "keepalive_expired"),
    )
}

/// The ports of the application flows `d` has up.
fn flows_up(d: &Daemon) -> Vec<u32> {
    let mut c = d.client();
    c.list_flows()
        .unwrap()
        .into_iter()
        .map(|f| f.info.port)
        .collect()
}

/// (a) An idle flow between two live daemons, keepalive every 200 ms: after
/// many intervals it is still up at both ends and still carries SDUs, the
/// daemons having sent probes and answered them, and none expired.
/// (b) The peer daemon killed (SIGKILL: it tells nothing), the survivor's
/// flow ends after the misses (3 to 4 intervals of silence), counted as
/// expired, and the application reading it is told.
#[test]
fn an_idle_flow_lives_on_probes_and_ends_when_its_peer_is_killed() {
    let interval = Duration::from_millis(200);
    let (alpha, mut beta, _) = pair(interval.as_millis() as u64);
    let _srv = echo_server_all(&beta, "net");
    let mut c = alpha.client();
    let flow = echo_flow(&mut c);
    let port = flow.info().port;

    // (a) Idle for 8 intervals, probes sent and answered: a flow whose
    // probes went unanswered would have ended after 3.
    let t0 = Instant::now();
    wait_for("8 intervals with 5 probes sent and answered", T, || {
        let (a, b) = (ka(&alpha, "alpha.net"), ka(&beta, "beta.net"));
        t0.elapsed() >= interval * 8 && a.0 + b.0 >= 5 && a.1 + b.1 >= 5
    });
    let idle = t0.elapsed();
    let (a, b) = (ka(&alpha, "alpha.net"), ka(&beta, "beta.net"));
    eprintln!(
        "idle {idle:?}: probes sent {} + {}, answered {} + {}",
        a.0, b.0, a.1, b.1
    );
    // At most one per end per interval (counted from the allocation).
    let most = 2 * (t0.elapsed().as_millis() / interval.as_millis()) as u64 + 4;
    assert!(a.0 + b.0 <= most, "{} probes in {idle:?}", a.0 + b.0);
    assert_eq!(
        (a.2, b.2),
        (0, 0),
        "a keepalive expired between live daemons"
    );
    assert!(
        flows_up(&alpha).contains(&port),
        "the flow is gone at alpha"
    );
    assert_eq!(flows_up(&beta).len(), 1, "the flow is gone at beta");
    assert_echoes(&flow, b"still here");

    // (b) The peer killed: nothing more is heard, the flow ends after the
    // misses (the application's read fails), and alpha counts it.
    let probes_before = ka(&alpha, "alpha.net").0;
    beta.kill();
    let killed = Instant::now();
    let limit = interval * 4 + Duration::from_millis(1500);
    let mut buf = vec![0u8; 2000];
    let end = loop {
        let left = limit.saturating_sub(killed.elapsed());
        assert!(
            !left.is_zero(),
            "the flow still up {limit:?} after the kill"
        );
        match flow.read_timeout(&mut buf, left) {
            Ok(Some(n)) => panic!("an SDU of {n} bytes from a killed peer"),
            Ok(None) => continue,
            Err(e) => break e,
        }
    };
    let took = killed.elapsed();
    eprintln!("the flow ended {took:?} after the kill: {end}");
    // Not before two probes went unanswered.
    assert!(took >= interval * 2, "ended {took:?} after the kill");
    let (sent, _, expired) = ka(&alpha, "alpha.net");
    assert_eq!(expired, 1, "keepalive_expired at alpha");
    assert!(
        sent >= probes_before + 2,
        "{probes_before} -> {sent} probes"
    );
    wait_for("the flow gone from alpha's list", T, || {
        !flows_up(&alpha).contains(&port)
    });
    assert!(flow.write(b"anyone?").is_err(), "writing to an ended flow");
}

/// A reload that changes only a cube's `keepalive_ms` keeps the IPCP (not
/// created again: its N-1 flow and the application flow stay up and carry
/// SDUs) and puts the new interval in force on the flow up: from 2 s to
/// 50 ms at alpha, alpha alone probes at about 20 a second, where at 2 s
/// a second saw at most one probe per end. Back to 2 s, the rate drops.
#[test]
fn a_reload_changing_only_keepalive_keeps_the_ipcp_and_its_flows() {
    let (alpha, beta, (pa, pb)) = pair(2000);
    let _srv = echo_server_all(&beta, "net");
    let mut c = alpha.client();
    let flow = echo_flow(&mut c);
    let port = flow.info().port;
    let ups = counter(&alpha, "alpha.net", "neighbors_up");

    let write = |ka_ms: u64| {
        std::fs::write(
            alpha.dir.join("rinad.toml"),
            system("alpha", 1, pa, ("beta", 2, pb), ka_ms),
        )
        .unwrap();
    };
    write(50);
    let before = ka(&alpha, "alpha.net").0;
    let changes = c.reload(None).unwrap();
    let reloaded = Instant::now();
    eprintln!("reload to 50 ms: {changes:?}");
    assert_eq!(
        changes,
        ["alpha.net: keepalive of QoS cube idle 2000 ms -> 50 ms (1 flow(s) up switched)"]
    );
    // 10 probes at 50 ms take ~0.5 s; at 2 s they would take 10 s.
    wait_for(
        "10 probes at the new interval",
        Duration::from_secs(4),
        || ka(&alpha, "alpha.net").0 >= before + 10,
    );
    let took = reloaded.elapsed();
    eprintln!("10 probes {took:?} after the reload");
    assert!(took < Duration::from_secs(4));
    // The same IPCP, the same flows.
    assert!(
        flows_up(&alpha).contains(&port),
        "the flow is gone at alpha"
    );
    assert_eq!(flows_up(&beta).len(), 1, "the flow is gone at beta");
    assert_eq!(counter(&alpha, "alpha.net", "neighbors_up"), ups);
    assert_echoes(&flow, b"after the reload");
    let (_, answered, expired) = ka(&beta, "beta.net");
    assert!(answered >= 10, "beta answered {answered}");
    assert_eq!(expired + ka(&alpha, "alpha.net").2, 0);

    // Back to 2 s: a second brings at most one probe more.
    write(2000);
    let changes = c.reload(None).unwrap();
    assert_eq!(
        changes,
        ["alpha.net: keepalive of QoS cube idle 50 ms -> 2000 ms (1 flow(s) up switched)"]
    );
    let after = ka(&alpha, "alpha.net").0;
    std::thread::sleep(Duration::from_secs(1));
    let more = ka(&alpha, "alpha.net").0 - after;
    assert!(more <= 1, "{more} probes in a second at 2 s");
    assert_echoes(&flow, b"and after the second");
    assert_eq!(c.reload(None).unwrap(), ["nothing changed"]);
}

/// A system `me` with one shim-udp IPCP, `me.udp` in DIF `udp`, on UDP
/// `port`, checking its flows every `ka_ms`, its directory `dir`.
fn udp_system(me: &str, port: u16, ka_ms: u64, dir: &str) -> String {
    format!(
        "[system]\nname = \"{me}\"\n[[ipcp]]\nname = \"{me}.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:{port}\"\nkeepalive_ms = {ka_ms}\n[ipcp.directory]\n{dir}"
    )
}

/// Alpha and beta, each with a shim-udp IPCP checking every `ka_ms`,
/// alpha's knowing `echo` at beta's; alpha's UDP port and directory entry
/// (to write its configuration again), and a client of beta's with `echo`
/// registered.
fn udp_pair(ka_ms: u64) -> (Daemon, Daemon, (u16, String), rina::Client) {
    let (pa, pb) = (free_port(), free_port());
    let beta = Daemon::start_with("beta", &udp_system("beta", pb, ka_ms, ""));
    let echo_at_beta = format!("\"echo\" = \"127.0.0.1:{pb}\"\n");
    let alpha = Daemon::start_with("alpha", &udp_system("alpha", pa, ka_ms, &echo_at_beta));
    let mut srv = beta.client();
    srv.register(&name("echo"), Some("udp")).unwrap();
    (alpha, beta, (pa, echo_at_beta), srv)
}

/// A flow to `echo` over DIF `udp`, with one SDU written.
fn udp_flow(client: &mut rina::Client) -> rina::Flow {
    let flow = client
        .allocate(
            &name("idler"),
            &name("echo"),
            Some("udp"),
            &QosSpec::default(),
        )
        .unwrap();
    flow.write(b"hello").unwrap();
    flow
}

/// shim-udp's own liveness check (`keepalive_ms` of a shim-udp IPCP, here
/// 200 ms): a flow left idle between live daemons stays, on probes and
/// answers alone; with the requesting daemon killed (SIGKILL: it tells
/// nothing), the flow ends at the survivor after three silent checks, its
/// application told. Without the check it stayed for ever, with the
/// server's thread serving it.
#[test]
fn a_shim_udp_flow_whose_peer_daemon_is_killed_ends_at_the_survivor() {
    let interval = Duration::from_millis(200);
    let (mut alpha, beta, _, mut srv) = udp_pair(interval.as_millis() as u64);
    // The server reads until its flow ends, and says when.
    let server = std::thread::spawn(move || {
        let req = srv.next_request().unwrap();
        let flow = srv.accept(&req).unwrap();
        let mut buf = vec![0u8; 2000];
        let mut sdus = 0;
        loop {
            match flow.read(&mut buf) {
                Ok(n) if n > 0 => sdus += 1,
                _ => return (Instant::now(), sdus),
            }
        }
    });
    let mut c = alpha.client();
    let _flow = udp_flow(&mut c);
    // Idle, both ends up: each hears the other's KEEPALIVEs, and nothing
    // expires (without them, the flow would go after three checks).
    let t0 = Instant::now();
    wait_for("8 intervals, 5 KEEPALIVEs heard at each end", T, || {
        t0.elapsed() >= interval * 8
            && alpha.counter("keepalives_received") >= 5
            && beta.counter("keepalives_received") >= 5
    });
    assert_eq!(alpha.counter("keepalive_expired"), 0);
    assert_eq!(beta.counter("keepalive_expired"), 0);
    assert_eq!(flows_up(&beta).len(), 1, "the flow is gone at beta");
    assert!(
        !server.is_finished(),
        "the server's flow ended between live daemons"
    );

    alpha.kill();
    let killed = Instant::now();
    let (ended, sdus) = server.join().unwrap();
    let took = ended.saturating_duration_since(killed);
    eprintln!("beta's flow ended {took:?} after alpha was killed");
    assert_eq!(sdus, 1, "the one SDU came");
    // Two to four intervals (the third silent check; the first after the
    // kill may still count what came just before), with room for a
    // loaded machine.
    assert!(took >= interval * 2, "ended {took:?} after the kill");
    assert!(
        took <= interval * 4 + Duration::from_millis(1500),
        "ended {took:?} after the kill"
    );
    assert_eq!(beta.counter("keepalive_expired"), 1);
    wait_for("the flow gone from beta's list", T, || {
        flows_up(&beta).is_empty()
    });
}

/// A reload that changes a shim-udp IPCP's `keepalive_ms` and `directory`
/// keeps the IPCP and its flow (before, it was created again, its flows
/// lost) and puts both in force: with the check off, the flow outlives its
/// peer's daemon; on again, it ends a few intervals later.
#[test]
fn a_reload_changes_a_shim_udp_check_and_directory_in_place() {
    let ms = 200;
    let interval = Duration::from_millis(ms);
    let (alpha, mut beta, (pa, echo_at_beta), mut srv) = udp_pair(ms);
    let server = std::thread::spawn(move || {
        let req = srv.next_request().unwrap();
        let flow = srv.accept(&req).unwrap();
        let mut buf = vec![0u8; 2000];
        let mut sdus = 0;
        while sdus < 2 && flow.read(&mut buf).is_ok_and(|n| n > 0) {
            sdus += 1;
        }
        // The flow, kept open: closing it would tell alpha.
        (sdus, flow)
    });
    let mut c = alpha.client();
    let flow = udp_flow(&mut c);
    let port = flow.info().port;

    let write = |ka: u64, dir: &str| {
        std::fs::write(
            alpha.dir.join("rinad.toml"),
            udp_system("alpha", pa, ka, dir),
        )
        .unwrap();
    };
    write(0, &format!("{echo_at_beta}\"other\" = \"127.0.0.1:9\"\n"));
    let changes = c.reload(None).unwrap();
    assert_eq!(
        changes,
        [
            "alpha.udp: other is at 127.0.0.1:9",
            "alpha.udp: keepalive 200 ms -> off (1 flow(s) up checked afresh)"
        ]
    );
    // The same IPCP and flow: it still carries SDUs.
    flow.write(b"after the reload").unwrap();
    let (sdus, _beta_flow) = server.join().unwrap();
    assert_eq!(sdus, 2, "both SDUs came");
    assert!(flows_up(&alpha).contains(&port));

    // Off: the flow outlives its peer's daemon by many intervals.
    beta.kill();
    std::thread::sleep(interval * 8);
    assert!(flows_up(&alpha).contains(&port), "ended with the check off");
    assert_eq!(alpha.counter("keepalive_expired"), 0);

    // On again: three silent checks from the reload end it.
    write(ms, &echo_at_beta);
    let changes = c.reload(None).unwrap();
    assert_eq!(
        changes,
        [
            "alpha.udp: directory entry other removed",
            "alpha.udp: keepalive off -> 200 ms (1 flow(s) up checked afresh)"
        ]
    );
    let reloaded = Instant::now();
    wait_for("the flow ended by the check", T, || {
        !flows_up(&alpha).contains(&port)
    });
    let took = reloaded.elapsed();
    eprintln!("the flow ended {took:?} after the check was on again");
    assert!(took >= interval * 2, "ended {took:?} after the reload");
    assert_eq!(alpha.counter("keepalive_expired"), 1);
    assert_eq!(c.reload(None).unwrap(), ["nothing changed"]);
}
