//! Flows past the old cap of 4,096 per IPCP, with no `max_flows` in the
//! file: 10,000 flows (both ends of 5,000) in one shim-udp IPCP, then in
//! one normal IPCP. The 100,000-flow figures, and the memory and speed,
//! are a benchmark (`bench/scale.sh`), not this test; this machine's
//! descriptor limit (one per flow end here and in the daemon) bounds a test.
//! One test in this file, as its descriptors share this process's limit.

mod common;

use common::{name, wait_for, Daemon};
use rina::QosSpec;
use std::time::Duration;

/// Allocations; each makes two flows in the daemon.
const PAIRS: usize = 5_000;

/// Fills daemon `d` with `PAIRS` flows from `src` to `sink` and closes them.
fn fill(d: &Daemon) {
    // Sockets: with rings each flow would hold three descriptors in this
    // process, and 2 × PAIRS flows would pass its hard limit.
    let mut srv = d.client();
    srv.set_rings(false);
    srv.register(&name("sink"), None).unwrap();
    let sink = std::thread::spawn(move || {
        let mut kept = Vec::new();
        while kept.len() < PAIRS {
            let Ok(Some(req)) = srv.next_request_timeout(Duration::from_secs(20)) else {
                break;
            };
            kept.push(srv.accept(&req).expect("accept"));
        }
        (srv, kept)
    });
    let mut c = d.client();
    c.set_rings(false);
    let flows: Vec<_> = (0..PAIRS)
        .map(|i| {
            c.allocate(&name("src"), &name("sink"), None, &QosSpec::default())
                .unwrap_or_else(|e| panic!("flow {i}: {e}"))
        })
        .collect();
    let (_srv, kept) = sink.join().unwrap();
    assert_eq!(kept.len(), PAIRS);
    let listed = c.list_flows().unwrap();
    assert_eq!(listed.len(), 2 * PAIRS, "both ends of every flow");
    drop(flows);
    drop(kept);
    wait_for("every flow to close", Duration::from_secs(60), || {
        c.list_flows().map(|f| f.is_empty()).unwrap_or(false)
    });
}

#[test]
fn ten_thousand_flows_in_one_ipcp_without_configuring_a_limit() {
    let limit = rina::raise_fd_limit(2 * PAIRS as u64 + 1000);
    if limit < 2 * PAIRS as u64 + 1000 {
        eprintln!(
            "skipped: the descriptor limit is {limit}, too low for {} flows",
            2 * PAIRS
        );
        return;
    }
    let port = common::free_port();
    let udp = Daemon::start_with(
        "scale-udp",
        &format!(
            "[system]\nname = \"s\"\n\n[[ipcp]]\nname = \"s.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:{port}\"\n\n[ipcp.directory]\n\"sink\" = \"127.0.0.1:{port}\"\n"
        ),
    );
    fill(&udp);
    drop(udp);
    let normal = Daemon::start_with(
        "scale-normal",
        "[system]\nname = \"s\"\n\n[[ipcp]]\nname = \"s.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = 1\n\n[ipcp.names]\n\"sink\" = 1\n",
    );
    fill(&normal);
}
