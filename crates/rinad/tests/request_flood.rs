//! A flood of flow requests from the network at an application that does
//! not read its control connection for a while: the requests it cannot
//! take are refused to the requester, and the application keeps its
//! connection and its registrations.

mod common;

use common::{name, Daemon};
use rina::QosSpec;
use rina_wire::shim_udp::Datagram;
use std::net::UdpSocket;
use std::time::Duration;

/// An application registers `srv` with the client library and then does
/// something else for a while (it reads its flow requests only when it
/// asks for the next one). Meanwhile four hosts that reach the shim-udp
/// port send allocation requests for `srv`, 64 each (the shim's pending
/// limit per host; 256 in all, its whole limit) every 1.7 s for 13.6 s,
/// each expiring unanswered and withdrawn: about 3,600 messages for the
/// application. The daemon must neither disconnect
/// the application (which unregisters its name and loses everything it
/// held) nor queue for it without bound.
#[test]
fn a_flood_of_flow_requests_does_not_cost_an_idle_application_its_registration() {
    let d = Daemon::start("beta", &[]);
    let shim = d.udp_addr();
    let mut app = d.client();
    app.register(&name("srv"), None).unwrap();

    // Four hosts: 127.0.0.1 to 127.0.0.4 (all of 127/8 is loopback).
    let socks: Vec<UdpSocket> = (1..=4)
        .map(|h| UdpSocket::bind(format!("127.0.0.{h}:0")).unwrap())
        .collect();
    for round in 0..8u32 {
        for (h, sock) in socks.iter().enumerate() {
            for k in 0..64u32 {
                let req = Datagram::AllocReq {
                    src_port: round * 1_000 + h as u32 * 100 + k + 1,
                    qos: QosSpec::default(),
                    src: name("flooder"),
                    dst: name("srv"),
                    direct: None,
                };
                sock.send_to(&req.to_vec(), &shim).unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(1_700));
    }

    assert!(
        !d.log().contains("does not read its replies"),
        "the application was disconnected"
    );
    let names = d.client().list_names().unwrap();
    assert!(
        names.iter().any(|n| n.name == name("srv")),
        "srv is still registered: {names:?}"
    );
    // The application, back, still talks to the daemon on its connection.
    app.list_names()
        .expect("the application's connection works");
    // The requests it could not take were refused to the requester.
    let (sock, mut buf) = (&socks[0], [0u8; 2048]);
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut refused = 0;
    while let Ok(n) = sock.recv(&mut buf) {
        if matches!(
            Datagram::parse(&buf[..n]),
            Ok(Datagram::AllocResp { result, .. }) if result != rina_wire::shim_udp::AllocResult::Accepted
        ) {
            refused += 1;
        }
    }
    assert!(refused > 0, "the requester heard refusals");
}
