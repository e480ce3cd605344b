//! An N-1 flow bound to the authenticated peer, between real daemons
//! (issue 18): A and B are members of a DIF with a password, an echo flow
//! runs between them; an impostor on the same UDP network, whose normal
//! IPCP takes A's name and address but lacks the password, keeps
//! allocating N-1 flows to B in A's name. B holds each as a claim that
//! never authenticates and tears it down; the working N-1 flow and the
//! echo flow over it never notice.

mod common;

use common::counter;

use common::free_port;

use common::{wait_for, Daemon};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);

/// A system `sys` whose normal IPCP is `me.net` at `addr` with `password`,
/// its neighbour `peer.net` reached at `peer_port`.
fn system(
    sys: &str,
    me: &str,
    addr: u64,
    port: u16,
    peer: &str,
    peer_port: u16,
    password: &str,
) -> String {
    format!(
        "[system]\nname = \"{sys}\"\n\n[[ipcp]]\nname = \"{sys}.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:{port}\"\n\n[ipcp.directory]\n\"{peer}.net\" = \"127.0.0.1:{peer_port}\"\n\n[[ipcp]]\nname = \"{me}.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = {addr}\npassword = \"{password}\"\nrouting = \"link-state\"\n\n[ipcp.names]\n\"echo\" = 2\n\n[[ipcp.neighbor]]\nname = \"{peer}.net\"\nover = \"udp\"\n"
    )
}

#[test]
fn an_impostor_claiming_a_neighbour_leaves_its_n1_flow_and_traffic_intact() {
    const PW: &str = "the DIF's password";
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let a = Daemon::start_with("a", &system("a", "a", 1, pa, "b", pb, PW));
    let b = Daemon::start_with("b", &system("b", "b", 2, pb, "a", pa, PW));
    wait_for("routes both ways", T, || {
        counter(&a, "a.net", "routing_destinations") >= 1
            && counter(&b, "b.net", "routing_destinations") >= 1
    });
    let _srv = common::echo_server(&b, "net");
    let flow = a
        .client()
        .allocate(
            &common::name("client"),
            &common::name("echo"),
            Some("net"),
            &rina::QosSpec::default(),
        )
        .expect("a flow from A to echo at B");
    let mut buf = [0u8; 256];
    let mut echoes = 0u32;
    let mut echo = || {
        let msg = format!("echo {echoes}");
        flow.write(msg.as_bytes()).unwrap();
        let n = flow
            .read_timeout(&mut buf, Duration::from_secs(2))
            .unwrap()
            .unwrap_or_else(|| panic!("no answer to {msg:?}"));
        assert_eq!(&buf[..n], msg.as_bytes());
        echoes += 1;
    };
    echo();

    // The impostor: A's IPCP name and address, a guessed password.
    let c = Daemon::start_with("c", &system("c", "a", 1, pc, "b", pb, "a guess"));
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(13) {
        echo();
        std::thread::sleep(Duration::from_millis(50));
    }
    let claims = counter(&b, "b.net", "n1_claims");
    let refused = counter(&b, "b.net", "n1_claims_refused");
    assert!(claims >= 1, "the impostor's flow reached B as a claim");
    assert!(refused >= 1, "B tore the claim down ({claims} claims)");
    assert_eq!(counter(&b, "b.net", "n1_claims_admitted"), 0);
    assert!(counter(&b, "b.net", "membership_port_auth_failed") >= 1);
    assert!(echoes > 100, "the echo flow went on: {echoes}");
    drop(c);
}
