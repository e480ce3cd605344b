//! The access rules of a DIF (issue 18) between two real daemons: A's
//! normal IPCP lets only `echo` and `client*` register and only `client*`
//! allocate flows to `echo`; B's has no rules, so what A refuses crosses
//! the DIF and the refusal's reason reaches B's application.

mod common;

use common::counter;

use common::free_port;

use common::{wait_for, Daemon};
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

fn system(me: &str, port: u16, peer: &str, peer_port: u16, extra: &str) -> String {
    format!(
        "[system]\nname = \"{me}\"\n\n[[ipcp]]\nname = \"{me}.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:{port}\"\n\n[ipcp.directory]\n\"{peer}.net\" = \"127.0.0.1:{peer_port}\"\n\n[[ipcp]]\nname = \"{me}.net\"\ntype = \"normal\"\ndif = \"net\"\nrouting = \"link-state\"\ndirectory_mode = \"distributed\"\n{extra}\n[[ipcp.neighbor]]\nname = \"{peer}.net\"\nover = \"udp\"\n"
    )
}

const RULES: &str = "address = 1\n\n[ipcp.access]\nregister = [\"echo\", \"client*\"]\nallocate = [{ from = \"client*\", to = \"echo\" }]\n";

#[test]
fn the_difs_access_rules_refuse_registrations_and_flows_and_say_why() {
    let (pa, pb) = (free_port(), free_port());
    let a = Daemon::start_with("a", &system("a", pa, "b", pb, RULES));
    let b = Daemon::start_with("b", &system("b", pb, "a", pa, "address = 2\n"));
    wait_for("routes both ways", T, || {
        counter(&a, "a.net", "routing_destinations") >= 1
            && counter(&b, "b.net", "routing_destinations") >= 1
    });

    // Registration at A: a name the rules do not list is refused, why said.
    let err = a
        .client()
        .register(&common::name("rogue"), Some("net"))
        .expect_err("rogue may not register in net");
    let msg = err.to_string();
    // A's own decision: not worded as a peer's refusal.
    assert!(
        msg.contains("access rules") && msg.contains("rogue") && !msg.contains("by the peer"),
        "{msg}"
    );

    let _srv = common::echo_server(&a, "net");
    // A flow from a name the rules do not let allocate: refused by A, the
    // reason at B's application (asked again while B's directory does not
    // know echo yet).
    let t0 = std::time::Instant::now();
    let msg = loop {
        let err = b
            .client()
            .allocate(
                &common::name("rogue"),
                &common::name("echo"),
                Some("net"),
                &rina::QosSpec::default(),
            )
            .expect_err("rogue may not allocate flows to echo");
        let msg = err.to_string();
        if msg.contains("access rules") || t0.elapsed() > T {
            break msg;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        msg.contains("access rules") && msg.contains("rogue") && msg.contains("echo"),
        "{msg}"
    );
    assert!(counter(&a, "a.net", "alloc_refused") >= 1);

    // An allowed one works.
    let flow = b
        .client()
        .allocate(
            &common::name("client-b"),
            &common::name("echo"),
            Some("net"),
            &rina::QosSpec::default(),
        )
        .expect("client-b may allocate flows to echo");
    flow.write(b"allowed").unwrap();
    let mut buf = [0u8; 64];
    let n = flow.read_timeout(&mut buf, T).unwrap().expect("an echo");
    assert_eq!(&buf[..n], b"allowed");
}

#[test]
fn a_bad_access_pattern_is_refused_at_start_with_its_key() {
    let cfg = system(
        "c",
        free_port(),
        "d",
        free_port(),
        "address = 1\n\n[ipcp.access]\nregister = [\"a*b\"]\n",
    );
    let dir = common::temp_dir("access-bad");
    let path = dir.join("rinad.toml");
    std::fs::write(&path, cfg).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rinad"))
        .arg("--config")
        .arg(&path)
        .arg("--check")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("access") && err.contains("a*b"), "{err}");
}

#[test]
fn a_name_refused_by_one_dif_is_registered_in_none() {
    // Without a DIF a name goes to every DIF: shim `udp` would take
    // `rogue`, `net`'s rules do not. The refusal must leave nothing behind
    // (before, `rogue` stayed registered in `udp` under an error reply).
    let a = Daemon::start_with("a", &system("a", free_port(), "b", free_port(), RULES));
    let mut c = a.client();
    let err = c
        .register(&common::name("rogue"), None)
        .expect_err("net's rules refuse rogue");
    assert!(err.to_string().contains("access rules"), "{err}");
    let names: Vec<String> = c
        .list_names()
        .unwrap()
        .iter()
        .map(|n| format!("{} in {}", n.name, n.dif))
        .collect();
    assert!(!names.iter().any(|n| n.starts_with("rogue")), "{names:?}");
    // The same connection may still register it where it is allowed.
    c.register(&common::name("rogue"), Some("udp"))
        .expect("udp has no rules");
    // And a name every DIF takes goes to both.
    let difs = c.register(&common::name("echo"), None).unwrap();
    assert_eq!(difs.len(), 2, "{difs:?}");
}
