//! Integration tests: a registration that has the daemon accept its flow
//! requests (`Client::register_accepting`), with real `rinad` processes.
//! The daemon accepts at once and hands each flow over as news; the
//! application never sees a request, and one that does not read its
//! flows holds a bounded number before the daemon refuses more.

mod common;

use common::{name, pair, roundtrip, wait_for, Daemon};
use rina::{Client, ErrorKind, Flow, QosSpec};
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

/// Echoes one SDU of `flow` back, upper-cased, so that an answer cannot be
/// the question come back some other way.
fn answer_one(flow: &Flow) {
    let mut buf = vec![0u8; 65536];
    let n = flow
        .read_timeout(&mut buf, T)
        .unwrap()
        .expect("a question within the deadline");
    flow.write(&buf[..n].to_ascii_uppercase()).unwrap();
}

#[test]
fn the_daemon_accepts_for_a_registration_that_asks_and_hands_the_flows_over() {
    let (alpha, beta) = pair(&["srv"]);
    let mut srv = beta.client();
    assert_eq!(
        srv.register_accepting(&name("srv"), None).unwrap(),
        vec!["udp".to_string()]
    );
    let listed = beta.client().list_names().unwrap();
    assert_eq!(listed.len(), 1);
    assert!(
        listed[0].accepts,
        "beta lists srv as accepted by the daemon"
    );
    let mut c = alpha.client();
    // Allocations complete while the server reads nothing: the daemon
    // accepted them, not the application.
    let flows: Vec<Flow> = (0..3)
        .map(|k| {
            c.allocate(
                &name(&format!("tester/{k}")),
                &name("srv"),
                None,
                &QosSpec::default(),
            )
            .unwrap()
        })
        .collect();
    for (k, flow) in flows.iter().enumerate() {
        let got = srv.next_flow_timeout(T).unwrap().expect("an accepted flow");
        assert_eq!(got.info().remote, name(&format!("tester/{k}")));
        assert_eq!(got.info().local, name("srv"));
        flow.write(format!("hello {k}").as_bytes()).unwrap();
        answer_one(&got);
        let mut buf = vec![0u8; 100];
        let n = flow.read_timeout(&mut buf, T).unwrap().unwrap();
        assert_eq!(&buf[..n], format!("HELLO {k}").as_bytes());
    }
    assert_eq!(srv.pending_requests(), 0, "no request was asked of it");
    assert_eq!(srv.accepted_flows(), 0);
    assert!(srv
        .next_flow_timeout(Duration::from_millis(200))
        .unwrap()
        .is_none());
}

#[test]
fn a_normal_dif_accepts_for_its_application_with_rings_and_with_sockets() {
    let d = Daemon::start_with(
        "acc-net",
        "[system]\nname = \"s\"\n\n[[ipcp]]\nname = \"s.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = 1\n\n[ipcp.names]\n\"rings\" = 1\n\"socks\" = 1\n",
    );
    let mut srv = d.client();
    srv.register_accepting(&name("rings"), Some("net")).unwrap();
    srv.set_rings(false);
    srv.register_accepting(&name("socks"), Some("net")).unwrap();
    let mut c = d.client();
    for to in ["rings", "socks"] {
        let flow = c
            .allocate(&name("src"), &name(to), Some("net"), &QosSpec::default())
            .unwrap();
        // Taken after its name is gone, and after the client's setting
        // changed: the flow keeps the data path it was accepted with.
        srv.unregister(&name(to), None).unwrap();
        srv.set_rings(to == "socks");
        let got = srv.next_flow().unwrap();
        assert_eq!(got.info().local, name(to));
        assert_eq!(got.has_rings(), to == "rings", "the flow to {to}");
        let sdu = vec![b'x'; 1000];
        let srv_thread = std::thread::spawn(move || {
            answer_one(&got);
            got
        });
        assert_eq!(roundtrip(&flow, &sdu), vec![b'X'; 1000]);
        let got = srv_thread.join().unwrap();
        // Either end's close deallocates the flow.
        drop(got);
        let mut buf = [0u8; 16];
        let end = flow.read_timeout(&mut buf, T);
        assert!(
            matches!(&end, Err(e) if e.kind == ErrorKind::DaemonGone),
            "the flow to {to} ends when the accepting end closes, got {end:?}"
        );
    }
}

#[test]
fn flows_accepted_for_an_application_that_does_not_read_are_bounded() {
    let d = Daemon::start_with(
        "acc-bound",
        "[system]\nname = \"s\"\n\n[[ipcp]]\nname = \"s.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = 1\n\n[ipcp.names]\n\"lazy\" = 1\n",
    );
    // Both ends of every flow held are descriptors here.
    rina::raise_fd_limit(16_000);
    let mut lazy = d.client();
    lazy.set_rings(false);
    lazy.register_accepting(&name("lazy"), Some("net")).unwrap();
    let mut c = d.client();
    c.set_rings(false);
    let mut flows = Vec::new();
    let refused = loop {
        match c.allocate(
            &name("src"),
            &name("lazy"),
            Some("net"),
            &QosSpec::default(),
        ) {
            Ok(f) => flows.push(f),
            Err(e) => break e,
        }
        // The bound is the control socket's buffer (its size is the
        // kernel's to cap) and the daemon's queue of news behind it.
        assert!(
            flows.len() <= 6_000,
            "the daemon kept accepting for an application that reads nothing"
        );
    };
    assert_eq!(refused.kind, ErrorKind::Refused, "{refused}");
    assert!(
        refused.message.contains("does not read"),
        "the refusal says why: {refused}"
    );
    let held = flows.len();
    assert!(held >= 512, "only {held} flows before the bound");
    eprintln!("{held} flows accepted for an application that read none");
    // What was accepted is all there, in order, and works.
    for (k, flow) in flows.iter().enumerate() {
        let got = lazy
            .next_flow_timeout(T)
            .unwrap()
            .unwrap_or_else(|| panic!("accepted flow {k} of {held} was not handed over"));
        if k % 97 == 0 {
            flow.write(b"ping").unwrap();
            answer_one(&got);
            let mut buf = [0u8; 8];
            let n = flow.read_timeout(&mut buf, T).unwrap().unwrap();
            assert_eq!(&buf[..n], b"PING");
        }
    }
    // Once read, the queue has room again.
    c.allocate(
        &name("src"),
        &name("lazy"),
        Some("net"),
        &QosSpec::default(),
    )
    .unwrap();
    assert!(lazy.next_flow_timeout(T).unwrap().is_some());
}

#[test]
fn flows_queued_for_an_application_that_leaves_are_deallocated() {
    let (alpha, beta) = pair(&["gone"]);
    let mut srv = beta.client();
    srv.register_accepting(&name("gone"), None).unwrap();
    let mut c = alpha.client();
    let flow = c
        .allocate(&name("tester"), &name("gone"), None, &QosSpec::default())
        .unwrap();
    // The application leaves without taking its flow: the descriptors
    // queued for it close with its connection, and the flow goes.
    drop(srv);
    let mut buf = [0u8; 16];
    let end = flow.read_timeout(&mut buf, T);
    assert!(
        matches!(&end, Err(e) if e.kind == ErrorKind::DaemonGone),
        "the flow ends once its accepting application is gone, got {end:?}"
    );
    let mut admin = beta.client();
    wait_for("beta to hold no flow", T, || {
        admin.list_flows().unwrap().is_empty()
    });
    // The name is free again, for an application that asks first.
    let mut again: Client = beta.client();
    again.register(&name("gone"), None).unwrap();
}
