//! Enrollment authentication between real daemons: the password never
//! crosses the wire (checked on a capture of everything the two systems
//! exchanged), a DIF of ed25519 key pairs admits members whose keys it
//! trusts and refuses the others, saying why on both sides, and a member
//! that skips enrollment is admitted only if it authenticates on its N-1
//! port (a configured address without the password gets no frame in).

mod common;

use common::counter;

use common::free_port;

use common::relay::Relay;
use common::{wait_for, Daemon};
use rina_core::enrollment::{auth::hex, AuthKeys, AUTH_KEYS, AUTH_PASSWORD};
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

/// A system `me` with UDP port `port`, neighbours (name, UDP port of the
/// way to them), and extra keys for its normal IPCP.
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

fn address(d: &Daemon, ipcp: &str) -> String {
    d.client()
        .list_ipcps()
        .ok()
        .and_then(|v| v.into_iter().find(|i| i.name == ipcp))
        .map(|i| i.address)
        .unwrap_or_default()
}

fn enrollment(d: &Daemon, ipcp: &str) -> String {
    d.client()
        .read_rib(ipcp, Some("/difm/enr"), None)
        .ok()
        .and_then(|v| v.into_iter().find(|o| o.name == "/difm/enr"))
        .map(|o| format!("{:?}", o.value))
        .unwrap_or_default()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn a_password_enrollment_keeps_the_password_off_the_wire() {
    let pw = "a long pre-shared s3cret";
    let (pa, pb) = (free_port(), free_port());
    let relay = Relay::start(
        format!("127.0.0.1:{pa}").parse().unwrap(),
        format!("127.0.0.1:{pb}").parse().unwrap(),
    );
    let a = Daemon::start_with(
        "a",
        &system(
            "a",
            pa,
            &[("b", relay.port_for_alpha())],
            &format!("address = 1\npassword = \"{pw}\"\n"),
        ),
    );
    let b = Daemon::start_with(
        "b",
        &system(
            "b",
            pb,
            &[("a", relay.port_for_beta())],
            &format!("password = \"{pw}\"\n"),
        ),
    );
    wait_for("B to enroll through the relay", T, || {
        address(&b, "b.net") != "0"
    });
    assert!(enrollment(&b, "b.net").contains("Enrolled"));
    let capture: Vec<u8> = [&relay.captured, &relay.captured_b]
        .iter()
        .flat_map(|c| c.lock().unwrap().concat())
        .collect();
    assert!(
        !contains(&capture, pw.as_bytes()),
        "the password is on the wire"
    );
    assert!(!contains(&capture, &pw.as_bytes()[..8]));
    assert!(
        contains(&capture, AUTH_PASSWORD.as_bytes()),
        "the enrollment went through the relay"
    );
    drop(a);
}

#[test]
fn key_pairs_admit_trusted_members_and_refuse_an_untrusted_key() {
    let public = |s: u8| hex(&AuthKeys::new([s; 32], vec![]).public_key());
    let keys = |s: u8, trusted: &[u8]| {
        let list: Vec<String> = trusted
            .iter()
            .map(|t| format!("\"{}\"", public(*t)))
            .collect();
        format!(
            "key = \"{}\"\ntrusted_keys = [{}]\n",
            hex(&[s; 32]),
            list.join(", ")
        )
    };
    let (pa, pb, pe) = (free_port(), free_port(), free_port());
    let a = Daemon::start_with(
        "a",
        &system(
            "a",
            pa,
            &[("b", pb), ("e", pe)],
            &format!("address = 1\n{}", keys(1, &[1, 2])),
        ),
    );
    let b = Daemon::start_with("b", &system("b", pb, &[("a", pa)], &keys(2, &[1, 2])));
    let e = Daemon::start_with("e", &system("e", pe, &[("a", pa)], &keys(5, &[1])));
    wait_for("B to enroll with its key", T, || {
        address(&b, "b.net") != "0"
    });
    wait_for("E to report its refusal", T, || {
        enrollment(&e, "e.net").contains("not trusted")
    });
    let why = enrollment(&e, "e.net");
    assert!(
        why.contains("step connect") && why.contains(&public(5)),
        "{why}"
    );
    assert_eq!(address(&e, "e.net"), "0");
    // The member says so too, and the enrollee does not retry in a loop.
    wait_for("A to log the refusal", T, || {
        a.log().contains("not trusted")
    });
    assert!(e.log().matches(AUTH_KEYS).count() <= 1, "{}", e.log());
    let tries = a.log().matches("not trusted").count();
    assert!(tries <= 2, "{tries} refusals: {}", a.log());
}

/// A member with a configured address that skips enrollment, neighbour of
/// `a.net` (address 1), knowing `echo` is at 1.
fn static_member(me: &str, port: u16, addr: u64, a_port: u16, extra: &str) -> String {
    format!(
        "[system]\nname = \"{me}\"\n\n[[ipcp]]\nname = \"{me}.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:{port}\"\n\n[ipcp.directory]\n\"a.net\" = \"127.0.0.1:{a_port}\"\n\n[[ipcp]]\nname = \"{me}.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = {addr}\n{extra}\n[[ipcp.neighbor]]\nname = \"a.net\"\nover = \"udp\"\naddress = 1\n\n[ipcp.names]\n\"echo\" = 1\n"
    )
}

#[test]
fn a_member_that_skips_enrollment_without_credentials_is_refused() {
    let (pa, pb, px) = (free_port(), free_port(), free_port());
    let pw = "password = \"s3cret\"\n";
    let a_cfg = system(
        "a",
        pa,
        &[("b", pb), ("x", px)],
        &format!("address = 1\n{pw}"),
    )
    .replace(
        "name = \"b.net\"\nover = \"udp\"\n",
        "name = \"b.net\"\nover = \"udp\"\naddress = 3\n",
    )
    .replace(
        "name = \"x.net\"\nover = \"udp\"\n",
        "name = \"x.net\"\nover = \"udp\"\naddress = 2\n",
    );
    let a = Daemon::start_with("a", &a_cfg);
    // B skips enrollment too, but holds the password: it authenticates on
    // the port and is admitted.
    let b = Daemon::start_with("b", &static_member("b", pb, 3, pa, pw));
    // X has an address and no password.
    let x = Daemon::start_with("x", &static_member("x", px, 2, pa, ""));
    let _srv = common::echo_server(&a, "net");
    wait_for("A to admit B by port authentication", T, || {
        counter(&a, "a.net", "membership_ports_authenticated") >= 1
            && counter(&b, "b.net", "neighbors_up") == 1
    });
    let flow = b
        .client()
        .allocate(
            &common::name("b-app"),
            &common::name("echo"),
            Some("net"),
            &rina::QosSpec::default(),
        )
        .expect("B reaches echo at A");
    flow.write(b"admitted").unwrap();
    let mut buf = [0u8; 64];
    let n = flow.read_timeout(&mut buf, T).unwrap().expect("echo to B");
    assert_eq!(&buf[..n], b"admitted");

    // X's frames are dropped and counted; its flow allocation fails.
    wait_for("A to drop X's frames", T, || {
        counter(&a, "a.net", "membership_unadmitted_dropped") >= 1
    });
    let r = x.client().allocate(
        &common::name("x-app"),
        &common::name("echo"),
        Some("net"),
        &rina::QosSpec::default(),
    );
    assert!(r.is_err(), "X reached echo without enrolling");
    assert_eq!(counter(&a, "a.net", "membership_port_auth_failed"), 0);
}
