//! A normal DIF that assembles itself from real daemons: A is the bootstrap
//! member (an address, the DIF's policies, a password); B and C are
//! configured with only their neighbours' names and the password. They
//! enroll (B through A, C through B), learn addresses by hellos, route with
//! link-state and find names through the disseminated directory, with no
//! address, route or directory entry written for them. D has the wrong
//! password and says so. When B dies, A notices by silence and its flow to
//! C fails in bounded time.

mod common;

use common::free_port;

use common::{echo_server, name, wait_for, Daemon};
use rina::QosSpec;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

/// A system `me` with UDP port `port`, neighbours (name, UDP port), and
/// extra keys for its normal IPCP.
fn system(me: &str, port: u16, peers: &[(&str, u16)], extra: &str) -> String {
    let mut s = format!(
        "[system]\nname = \"{me}\"\n\n[[ipcp]]\nname = \"{me}.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:{port}\"\n\n[ipcp.directory]\n"
    );
    for (p, pp) in peers {
        s += &format!("\"{p}.net\" = \"127.0.0.1:{pp}\"\n");
    }
    s += &format!("\n[[ipcp]]\nname = \"{me}.net\"\ntype = \"normal\"\ndif = \"net\"\n{extra}");
    for (p, _) in peers {
        s += &format!("\n[[ipcp.neighbor]]\nname = \"{p}.net\"\nover = \"udp\"\n");
    }
    s
}

fn rib(d: &Daemon, ipcp: &str, path: &str) -> Vec<(String, String)> {
    d.client()
        .read_rib(ipcp, Some(path), None)
        .map(|v| {
            v.into_iter()
                .map(|o| (o.name, format!("{:?}", o.value)))
                .collect()
        })
        .unwrap_or_default()
}

fn enrollment(d: &Daemon, ipcp: &str) -> String {
    rib(d, ipcp, "/difm/enr")
        .into_iter()
        .find(|(n, _)| n == "/difm/enr")
        .map(|(_, v)| v)
        .unwrap_or_default()
}

fn address(d: &Daemon, ipcp: &str) -> String {
    d.client()
        .list_ipcps()
        .ok()
        .and_then(|v| v.into_iter().find(|i| i.name == ipcp))
        .map(|i| i.address)
        .unwrap_or_default()
}

#[test]
fn members_enroll_with_nothing_but_a_name_and_a_password() {
    let (pa, pb, pc, pd) = (free_port(), free_port(), free_port(), free_port());
    let pw = "password = \"s3cret\"\n";
    let bootstrap =
        format!("address = 1\n{pw}routing = \"link-state\"\ndirectory_mode = \"distributed\"\n");
    let a = Daemon::start_with("a", &system("a", pa, &[("b", pb), ("d", pd)], &bootstrap));
    let b = Daemon::start_with("b", &system("b", pb, &[("a", pa), ("c", pc)], pw));
    let c = Daemon::start_with("c", &system("c", pc, &[("b", pb)], pw));
    let d = Daemon::start_with(
        "d",
        &system("d", pd, &[("a", pa)], "password = \"guess\"\n"),
    );
    let started = Instant::now();
    wait_for("B and C to enroll", T, || {
        address(&b, "b.net") != "0" && address(&c, "c.net") != "0"
    });
    eprintln!("B and C enrolled {:?} after start", started.elapsed());
    let (ab, ac) = (address(&b, "b.net"), address(&c, "c.net"));
    assert!(ab != ac && ab != "1" && ac != "1", "addresses {ab} {ac}");
    let e = enrollment(&c, "c.net");
    assert!(e.contains("via b.net") && e.contains("Enrolled"), "{e}");

    // The policies came with enrollment: C routes and has the directory.
    let count = |path: &str| {
        rib(&c, "c.net", path)
            .iter()
            .filter(|(n, _)| n.starts_with(&format!("{path}/")))
            .count()
    };
    wait_for("C to know every member and route to both", T, || {
        count("/difm/members") == 3 && count("/ra/nexthops") == 2
    });
    let server = echo_server(&c, "net");
    wait_for("A to learn where echo is", T, || {
        rib(&a, "a.net", "/difm/nsm/dft")
            .iter()
            .any(|(n, _)| n.contains("echo"))
    });
    let flow = a
        .client()
        .allocate(
            &name("pinger"),
            &name("echo"),
            Some("net"),
            &QosSpec::default(),
        )
        .unwrap();
    let mut buf = vec![0u8; 4096];
    for i in 0..20u32 {
        let sdu = i.to_be_bytes().repeat(25);
        flow.write(&sdu).unwrap();
        let n = flow.read_timeout(&mut buf, T).unwrap().expect("echo via B");
        assert_eq!(&buf[..n], &sdu[..]);
    }

    // What rinactl shows: members, neighbours (named and addressed by
    // hello), forwarding table, directory.
    let neigh: Vec<_> = rib(&b, "b.net", "/difm/enr/hello")
        .into_iter()
        .filter(|(n, _)| n.contains("pn="))
        .collect();
    assert_eq!(neigh.len(), 2, "{neigh:?}");
    assert!(neigh
        .iter()
        .any(|(n, v)| n.ends_with("pn=a.net") && v.contains("address 1")));

    // D's password is wrong: it says which step failed and why.
    wait_for("D to report its failure", T, || {
        enrollment(&d, "d.net").contains("bad password")
    });
    assert_eq!(address(&d, "d.net"), "0");
    assert!(d.log().contains("bad password"), "{}", d.log());
    assert!(a.log().contains("refused a member"), "{}", a.log());

    // B dies: A hears nothing from it for 3.5 s, takes it down, and the
    // flow to C (unreliable: it has no retransmissions to exhaust) fails
    // once C has had no route for 6 s.
    let mut b = b;
    b.kill();
    let killed = Instant::now();
    let r = loop {
        let _ = flow.write(b"anyone there?");
        match flow.read_timeout(&mut buf, Duration::from_millis(500)) {
            Ok(Some(_)) | Ok(None) if killed.elapsed() < Duration::from_secs(30) => continue,
            other => break other,
        }
    };
    let took = killed.elapsed();
    assert!(r.is_err(), "the flow failed: {r:?}");
    eprintln!("A's flow to C failed {took:?} after B died");
    assert!(took < Duration::from_secs(15), "took {took:?}");
    assert!(a.log().contains("neighbour silent"), "{}", a.log());
    drop(server);
}

/// A restarted daemon knows nothing of the N-1 flow its neighbour still
/// holds: the neighbour notices the silence, sets the flow up again, and
/// the newcomer enrolls anew. Here the enrollee restarts, twice (the
/// bootstrap member restarting is `rina-ip`'s test's).
#[test]
fn a_restarted_neighbour_is_taken_back() {
    let (pa, pb) = (free_port(), free_port());
    let bootstrap = "address = 1\nrouting = \"link-state\"\ndirectory_mode = \"distributed\"\n";
    let a = Daemon::start_with("a", &system("a", pa, &[("b", pb)], bootstrap));
    let b_cfg = system("b", pb, &[("a", pa)], "");
    for round in 0..2 {
        let b = Daemon::start_with("b", &b_cfg);
        let started = Instant::now();
        wait_for("B to enroll", T, || address(&b, "b.net") != "0");
        let server = echo_server(&b, "net");
        let mut buf = vec![0u8; 4096];
        // A allocates as soon as the DIF knows where `echo` is.
        let mut flow = None;
        wait_for("A to reach echo at B", T, || {
            flow = a
                .client()
                .allocate(
                    &name("pinger"),
                    &name("echo"),
                    Some("net"),
                    &QosSpec::default(),
                )
                .ok();
            flow.is_some()
        });
        let flow = flow.unwrap();
        flow.write(b"back").unwrap();
        let n = flow.read_timeout(&mut buf, T).unwrap().expect("echo");
        assert_eq!(&buf[..n], b"back");
        eprintln!(
            "round {round}: B reachable {:?} after its start",
            started.elapsed()
        );
        drop(flow);
        drop(b);
        drop(server);
    }
    assert!(a.log().contains("N-1 flow silent"), "{}", a.log());
}
