//! The `netns` backend on the README's experiment (line-3, shortened):
//! the same checks as on `local`. Needs root; without it the test prints
//! "skipped: needs root" and passes.

#[path = "real_common/mod.rs"]
mod common;

use rina_lab::backend::{netns::Netns, Backend};
use std::time::Duration;

#[test]
fn line_3_runs_on_netns_with_emulated_link_delays() {
    let mut be = Netns::default();
    if let Err(e) = be.check() {
        if e.to_string().contains("needs root") {
            println!("skipped: needs root");
            return;
        }
    }
    common::ensure_binaries();
    be.check().expect("netns backend usable");
    let text = std::fs::read_to_string(common::example("line-3.toml")).unwrap();
    let exp = rina_lab::load(&text, None)
        .unwrap()
        .shortened(Duration::from_secs(3));
    let dir = common::run_dir("netns-line-3");
    let out = common::run(&mut be, &exp, &dir);
    common::check_line_3(&out, &dir);
    // Nothing of the run is left behind (looked at between runs: the
    // other tests of this file run theirs in threads of this process).
    let left = rina_lab::backend::netns::namespaces_left();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

/// A link delay longer than shim-eth's delay line takes (1 s) is refused
/// before anything starts, naming the link.
#[test]
fn a_link_delay_above_one_second_is_refused_on_netns() {
    if Netns::default().check().is_err() {
        println!("skipped: needs root");
        return;
    }
    common::ensure_binaries();
    let exp = rina_lab::load(&common::echo_experiment(2000, 0.0), None).unwrap();
    let dir = common::run_dir("netns-delay-2s");
    let ctx_stop = std::sync::atomic::AtomicBool::new(false);
    let progress = |_: f64, _: &str| {};
    let ctx = rina_lab::backend::RunCtx {
        dir: &dir,
        progress: &progress,
        stop: &ctx_stop,
    };
    let e = Netns::default().run_once(&exp, &ctx).unwrap_err();
    assert!(e.to_string().contains("at most 1 s"), "{e}");
}

#[test]
fn netns_link_delay_adds_to_the_rtt() {
    if Netns::default().check().is_err() {
        println!("skipped: needs root");
        return;
    }
    common::ensure_binaries();
    // Links without delay, then two 5 ms links (delay in rinad's shim-eth
    // transmit path): 4 x 5 ms more on the minimum RTT.
    let mut rtt = Vec::new();
    for delay in [0, 5] {
        let exp = rina_lab::load(&common::echo_experiment(delay, 0.0), None).unwrap();
        let dir = common::run_dir(&format!("netns-delay-{delay}"));
        let out = common::run(&mut Netns::default(), &exp, &dir);
        let e = &out.flows[0];
        assert_eq!(e.error, None, "{e:?}");
        assert!(e.received * 10 >= e.sent * 9, "{e:?}");
        println!(
            "netns links {delay} ms: RTT min {:.2} avg {:.2} ms",
            2.0 * e.delay_min_ms.unwrap(),
            e.rtt_avg_ms.unwrap()
        );
        rtt.push(2.0 * e.delay_min_ms.unwrap());
    }
    let added = rtt[1] - rtt[0];
    assert!(rtt[1] >= 20.0, "RTT {} ms below 4 x 5 ms", rtt[1]);
    assert!(
        (15.0..45.0).contains(&added),
        "added {added} ms, not about 20"
    );
}

#[test]
fn real_daemons_schedule_urgent_first_at_a_tbf_link_one_dif_and_a_stack() {
    if Netns::default().check().is_err() {
        println!("skipped: needs root");
        return;
    }
    common::ensure_binaries();
    for file in ["qos-2.toml", "qos-2-stack.toml"] {
        let mut outs = Vec::new();
        for v in ["qta", "fifo"] {
            let exp = common::qos_2(file, v);
            let dir = common::run_dir(&format!("netns-{file}-{v}"));
            outs.push(common::run(&mut Netns::default(), &exp, &dir));
        }
        common::check_qos_2(&format!("netns {file}"), &outs[0], &outs[1]);
    }
}

/// Whether `iperf3` runs here, installed with apt-get if missing (as the
/// bench scripts do).
fn iperf3_available() -> bool {
    let have = || {
        std::process::Command::new("iperf3")
            .arg("-v")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !have() {
        let apt = |args: &[&str]| {
            std::process::Command::new("apt-get")
                .args(args)
                .output()
                .is_ok_and(|o| o.status.success())
        };
        let _ = apt(&["install", "-y", "iperf3"])
            || (apt(&["update"]) && apt(&["install", "-y", "iperf3"]));
    }
    have()
}

/// Runs an iperf3 TCP flow for `secs` from node 0 to node 1 of the netns
/// run of this process, over the veth pair of link 0 (the one rina-lab
/// shaped with tbf); returns iperf3's JSON report.
fn iperf3_over_link_0(secs: u32) -> serde_json::Value {
    let pid = std::process::id();
    let (na, nb) = (format!("rlab{pid}-0"), format!("rlab{pid}-1"));
    let (da, db) = (format!("rl{pid}a0"), format!("rl{pid}b0"));
    let ip = |args: &[&str]| {
        let st = std::process::Command::new("ip")
            .args(args)
            .status()
            .unwrap();
        assert!(st.success(), "ip {args:?}");
    };
    ip(&["-n", &na, "addr", "add", "10.78.0.1/24", "dev", &da]);
    ip(&["-n", &nb, "addr", "add", "10.78.0.2/24", "dev", &db]);
    let mut server = std::process::Command::new("ip")
        .args(["netns", "exec", &nb, "iperf3", "-s", "-1", "-p", "5302"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_listening(&nb, 5302, &mut server);
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &na,
            "iperf3",
            "-c",
            "10.78.0.2",
            "-p",
            "5302",
        ])
        .args(["-t", &secs.to_string(), "-J"])
        .output()
        .unwrap();
    // One-shot server: gone after the test; killed if the client failed.
    let _ = server.kill();
    let _ = server.wait();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "iperf3 client: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Waits until something listens on TCP `port` in namespace `ns` (the
/// iperf3 server `server` started there), for at most 10 s: a client
/// started before that is refused, and how long a start takes depends on
/// the host's load.
fn wait_listening(ns: &str, port: u16, server: &mut std::process::Child) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let filter = format!("sport = :{port}");
    loop {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", ns, "ss", "-Hltn", &filter])
            .output()
            .unwrap();
        if !out.stdout.is_empty() {
            return;
        }
        if let Some(st) = server.try_wait().unwrap() {
            panic!("the iperf3 server in {ns} ended before listening: {st}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nothing listens on port {port} in {ns} after 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_reliable_flow_shares_a_tbf_link_with_iperf3_tcp() {
    let mut be = Netns::default();
    if be.check().is_err() {
        println!("skipped: needs root (network namespaces, veth, tc)");
        return;
    }
    if !iperf3_available() {
        println!("skipped: iperf3 is missing and could not be installed");
        return;
    }
    common::ensure_binaries();
    // Issue 21: a reliable rina-perf flow (6 s, from 2 s) and an iperf3
    // TCP flow (9 s, from the start of the traffic) on one 10 Mb/s veth
    // pair shaped by tbf (100 frames of queue). Two flows: the RINA flow's
    // share is 5 Mb/s; it must get between half and twice that.
    let text = std::fs::read_to_string(common::example("cc-tcp.toml")).unwrap();
    let exp = rina_lab::load(&text, None).unwrap();
    let dir = common::run_dir("netns-cc-tcp");
    let (tx, traffic) = std::sync::mpsc::channel();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let progress = move |_: f64, what: &str| {
        if what.starts_with("traffic") {
            let _ = tx.send(());
        }
    };
    let ctx = rina_lab::backend::RunCtx {
        dir: &dir,
        progress: &progress,
        stop: &stop,
    };
    let (out, tcp) = std::thread::scope(|s| {
        let h = s.spawn(|| be.run_once(&exp, &ctx));
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while traffic.recv_timeout(Duration::from_millis(100)).is_err() {
            if h.is_finished() {
                panic!("the run ended before its traffic: {:?}", h.join().unwrap());
            }
            assert!(
                std::time::Instant::now() < deadline,
                "traffic did not start within 60 s"
            );
        }
        let tcp = iperf3_over_link_0(9);
        (h.join().unwrap().expect("the run"), tcp)
    });
    out.write(&dir).unwrap();
    let rates = common::reliable_perf_flows(&out, &dir);
    let rina = rates[0];
    let tcp_avg = tcp["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap();
    let tcp_s: Vec<f64> = tcp["intervals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["sum"]["bits_per_second"].as_f64().unwrap() / 1e6)
        .collect();
    println!(
        "RINA {:.2} Mb/s; iperf3 TCP {:.2} Mb/s over its 9 s, per second (sender) {tcp_s:.1?}",
        rina / 1e6,
        tcp_avg / 1e6
    );
    assert!(tcp_avg > 0.0, "iperf3 carried nothing");
    let share = 10e6 / 2.0;
    assert!(
        (share / 2.0..=share * 2.0).contains(&rina),
        "RINA got {:.2} Mb/s, not within half and twice its share of {:.1}",
        rina / 1e6,
        share / 1e6
    );
}
