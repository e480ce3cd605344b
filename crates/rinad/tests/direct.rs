//! Integration tests of direct flows: two real `rinad` processes on
//! loopback set a shim-udp flow up, and the two applications' own UDP
//! sockets carry its SDUs, without the daemons.

mod common;

use common::{name, pair, roundtrip, wait_for, Daemon};
use rina::{Client, Flow, QosSpec};
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

/// Registers `echo` at `d` (taking direct flows if `direct`) and echoes
/// every SDU of the first flow it accepts; the thread returns whether that
/// flow was direct, once the flow ends.
fn echo_server(d: &Daemon, direct: bool) -> std::thread::JoinHandle<bool> {
    let mut srv = d.client();
    srv.set_direct(direct);
    srv.register(&name("echo"), None).unwrap();
    std::thread::spawn(move || {
        let req = srv.next_request_timeout(T).unwrap().expect("a request");
        let flow = srv.accept(&req).unwrap();
        let mut buf = vec![0u8; 2048];
        while let Ok(n) = flow.read(&mut buf) {
            if flow.write(&buf[..n]).is_err() {
                break;
            }
        }
        flow.is_direct()
    })
}

fn allocate(d: &Daemon, direct: bool) -> (Client, Flow) {
    let mut c = d.client();
    c.set_direct(direct);
    let flow = c
        .allocate(&name("tester"), &name("echo"), None, &QosSpec::default())
        .unwrap();
    (c, flow)
}

#[test]
fn a_direct_flow_carries_sdus_without_the_daemons_and_ends_at_both() {
    let (alpha, beta) = pair(&["echo"]);
    let srv = echo_server(&beta, true);
    let (mut c, flow) = allocate(&alpha, true);
    assert!(flow.is_direct(), "both ends asked: {:?}", flow.info());
    let before = (alpha.counter("tx_datagrams"), beta.counter("rx_datagrams"));
    for i in 0..50u8 {
        let sdu = vec![i; 1 + 20 * i as usize];
        assert_eq!(roundtrip(&flow, &sdu), sdu, "SDU {i} echoed intact");
    }
    // The daemons' shims saw none of the 100 SDUs.
    assert_eq!(alpha.counter("tx_datagrams"), before.0);
    assert_eq!(beta.counter("rx_datagrams"), before.1);
    // Both daemons list the flow as direct.
    let listed = c.list_flows().unwrap();
    assert!(listed.len() == 1 && listed[0].info.direct, "{listed:?}");
    wait_for("beta to list the flow", T, || {
        let f = beta.client().list_flows().unwrap();
        f.len() == 1 && f[0].info.direct
    });

    // Closing the flow at the client ends it at both daemons, and the
    // server's socket reads end of file.
    flow.deallocate();
    assert!(srv.join().unwrap(), "the server's flow was direct");
    wait_for("alpha to free the flow", T, || {
        alpha.client().list_flows().unwrap().is_empty()
    });
    wait_for("beta to free the flow", T, || {
        beta.client().list_flows().unwrap().is_empty()
    });
}

#[test]
fn the_client_reads_end_of_file_when_the_server_closes_a_direct_flow() {
    let (alpha, beta) = pair(&["echo"]);
    let mut srv = beta.client();
    srv.set_direct(true);
    srv.register(&name("echo"), None).unwrap();
    let server = std::thread::spawn(move || {
        let req = srv.next_request_timeout(T).unwrap().expect("a request");
        let flow = srv.accept(&req).unwrap();
        let mut buf = [0u8; 64];
        let n = flow.read(&mut buf).unwrap();
        flow.write(&buf[..n]).unwrap();
        // Closes the flow (and this client).
    });
    let (_c, flow) = allocate(&alpha, true);
    assert!(flow.is_direct());
    assert_eq!(roundtrip(&flow, b"last"), b"last");
    server.join().unwrap();
    let mut buf = [0u8; 64];
    let end = flow.read_timeout(&mut buf, T);
    assert!(end.is_err(), "end of file, not {end:?}");
    assert!(flow.write(b"after").is_err(), "a write after the end fails");
    wait_for("alpha to free the flow", T, || {
        alpha.client().list_flows().unwrap().is_empty()
    });
}

#[test]
fn a_flow_is_direct_only_if_both_ends_ask() {
    for (client_asks, server_asks) in [(true, false), (false, true)] {
        let (alpha, beta) = pair(&["echo"]);
        let srv = echo_server(&beta, server_asks);
        let (_c, flow) = allocate(&alpha, client_asks);
        assert!(!flow.is_direct(), "{client_asks} {server_asks}");
        let before = alpha.counter("tx_datagrams");
        assert_eq!(
            roundtrip(&flow, b"through the daemons"),
            b"through the daemons"
        );
        assert!(
            alpha.counter("tx_datagrams") > before,
            "the shim carried it"
        );
        flow.deallocate();
        assert!(!srv.join().unwrap(), "{client_asks} {server_asks}");
    }
}
