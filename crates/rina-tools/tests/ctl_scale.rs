//! `rinactl flows` with 10,000 flows: the listing comes in pages, each far
//! under the control protocol's 1 MiB message limit.

mod common;

use common::{bin_dir, free_port, wait_until, Procs};
use rina::{Client, QosSpec};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Flows in the daemon: both ends of 5,000 flows to itself.
const FLOWS: usize = 10_000;

#[test]
fn rinactl_lists_ten_thousand_flows() {
    let limit = rina::raise_fd_limit(3 * FLOWS as u64);
    // This process holds the applications' ends of all of them, the daemon its own.
    if limit < FLOWS as u64 + 1000 {
        eprintln!("skipped: the descriptor limit is {limit}, too low for {FLOWS} flows");
        return;
    }
    let started = Instant::now();
    let bins = bin_dir();
    let dir = std::env::temp_dir().join(format!("rina-tools-ctl-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut procs = Procs(Vec::new(), dir.clone());
    let port = free_port();
    let conf = dir.join("s.toml");
    std::fs::write(
        &conf,
        format!(
            "[system]\nname = \"s\"\n\n[[ipcp]]\nname = \"s.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:{port}\"\nmax_flows = 20000\n\n[ipcp.directory]\n\"sink\" = \"127.0.0.1:{port}\"\n"
        ),
    )
    .unwrap();
    let sock = dir.join("s.sock");
    procs.0.push(
        Command::new(bins.join("rinad"))
            .arg("--config")
            .arg(&conf)
            .arg("--socket")
            .arg(&sock)
            .arg("--log-level")
            .arg("warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until("rinad to answer", Duration::from_secs(10), || {
        Client::connect_to(&sock).is_ok()
    });

    // A sink that accepts every flow and keeps it.
    // Sockets: with rings each flow would hold three descriptors in this
    // process (the socket, the memory file and the room pipe), and ten
    // thousand flows would pass the hard limit of 20,000.
    let mut srv = Client::connect_to(&sock).unwrap();
    srv.set_rings(false);
    srv.register(&"sink".parse().unwrap(), None).unwrap();
    let sink = std::thread::spawn(move || {
        let mut kept = Vec::new();
        while kept.len() < FLOWS / 2 {
            let Ok(Some(req)) = srv.next_request_timeout(Duration::from_secs(10)) else {
                break;
            };
            kept.push(srv.accept(&req).expect("accept"));
        }
        (srv, kept)
    });
    let mut c = Client::connect_to(&sock).unwrap();
    c.set_rings(false);
    let (me, sink_name) = ("src".parse().unwrap(), "sink".parse().unwrap());
    let flows: Vec<_> = (0..FLOWS / 2)
        .map(|i| {
            c.allocate(&me, &sink_name, None, &QosSpec::default())
                .unwrap_or_else(|e| panic!("flow {i}: {e}"))
        })
        .collect();
    let (_srv, kept) = sink.join().unwrap();
    assert_eq!(flows.len() + kept.len(), FLOWS);

    let out = Command::new(bins.join("rinactl"))
        .args(["--socket", sock.to_str().unwrap(), "--json", "flows"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.len(), FLOWS);
    let mut ports: Vec<u64> = listed.iter().map(|f| f["port"].as_u64().unwrap()).collect();
    ports.dedup();
    assert_eq!(ports.len(), FLOWS, "every flow once, in port order");
    // The table too.
    let out = Command::new(bins.join("rinactl"))
        .args(["--socket", sock.to_str().unwrap(), "flows"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).lines().count() > FLOWS);
    eprintln!("{FLOWS} flows set up and listed in {:?}", started.elapsed());
    drop(flows);
    drop(kept);
}
