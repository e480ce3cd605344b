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
    // Nothing of the run is left behind.
    let ns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    let mine = format!("rlab{}-", std::process::id());
    assert!(
        !String::from_utf8_lossy(&ns.stdout).contains(&mine),
        "namespaces left behind"
    );
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
