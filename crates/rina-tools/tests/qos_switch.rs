//! Switching the RMT scheduling policy of a running normal IPCP: two real
//! `rinad` on loopback (a shim DIF over UDP, a normal DIF with two QoS
//! cubes in different cells of the C/U matrix on top), paced `rina-perf`
//! traffic between them, and `rinactl sched` reading the queue counters
//! and switching alpha's port from FIFO to QTA-Mux and back.

mod common;

use common::{bin_dir, normal_pair, wait_until, Procs};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// The tail of each normal IPCP's configuration: cube 1 (what an
/// unreliable flow gets) is at urgency B, cherish 1; cube 2 (reliable) at
/// urgency A, cherish 0. Beta starts with QTA-Mux from its file; alpha
/// with the default FIFO.
fn tail(me: &str) -> String {
    let sched = if me == "beta" {
        "[ipcp.scheduler]\npolicy = \"qta-mux\"\ncherish_thresholds = [200, 100]\n"
    } else {
        ""
    };
    format!(
        r#""perf" = 2
[[ipcp.qos_cube]]
id = 1
name = "unreliable"
urgency = 1
cherish = 1
[[ipcp.qos_cube]]
id = 2
name = "reliable"
reliable = true
urgency = 0
cherish = 0
{sched}"#
    )
}

fn run(bin: &Path, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run the tool")
}

/// `rinactl --json sched <args>` as JSON (panics on failure).
fn sched(ctl: &Path, sock: &str, args: &[&str]) -> Value {
    let mut all = vec!["--socket", sock, "--json", "sched"];
    all.extend_from_slice(args);
    let out = run(ctl, &all);
    assert!(
        out.status.success(),
        "rinactl sched {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

/// `sent` of queue `name`, summed over the ports; `None` if no port has it.
fn sent(info: &Value, name: &str) -> Option<u64> {
    let mut found = None;
    for p in info["ports"].as_array()? {
        for q in p["queues"].as_array()? {
            if q["queue"] == name {
                *found.get_or_insert(0) += q["sent"].as_u64()?;
            }
        }
    }
    found
}

/// Names of alpha's queues on its port to beta.
fn queues(info: &Value) -> Vec<String> {
    info["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["neighbor"] == "beta.net")
        .flat_map(|p| p["queues"].as_array().into_iter().flatten())
        .filter_map(|q| q["queue"].as_str().map(str::to_owned))
        .collect()
}

/// Polls alpha until queue `name` has sent `more` PDUs beyond `from`.
fn wait_sent(ctl: &Path, sock: &str, name: &str, from: u64, more: u64) -> Value {
    let mut last = Value::Null;
    wait_until(
        &format!("{more} more PDUs sent from queue {name}"),
        Duration::from_secs(20),
        || {
            last = sched(ctl, sock, &["alpha.net"]);
            sent(&last, name).is_some_and(|s| s >= from + more)
        },
    );
    last
}

#[test]
fn rinactl_switches_a_running_port_from_fifo_to_qta_mux_and_back() {
    let bins = bin_dir();
    let (mut procs, a, b) = normal_pair("qos-switch", tail);
    let dir = procs.1.clone();
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let ctl = bins.join("rinactl");

    check_initial_policies(&ctl, a, b);
    start_paced_traffic(&mut procs, &bins, &ctl, a, b);
    check_switch_from_fifo_to_qta_mux(&ctl, a);
    check_urgent_cube_uses_urgent_queue(&mut procs, &bins, &ctl, a);
    check_bad_policies_are_refused(&ctl, a);
    check_back_to_fifo_from_a_file(&ctl, a, &dir);
    check_table(&ctl, a);
}

/// Waits for alpha's port to beta (FIFO) and checks beta took QTA-Mux from
/// its file.
fn check_initial_policies(ctl: &Path, a: &str, b: &str) {
    // The port to beta exists once the N-1 flow is up.
    wait_until("alpha's N-1 port to beta", Duration::from_secs(20), || {
        let out = run(ctl, &["--socket", a, "--json", "sched", "alpha.net"]);
        out.status.success()
            && serde_json::from_slice::<Value>(&out.stdout)
                .is_ok_and(|v| queues(&v) == ["fifo"] && v["policy"] == "fifo")
    });
    // Beta took QTA-Mux from its file, with a queue per urgency level of
    // its two cubes.
    let vb = sched(ctl, b, &["beta.net"]);
    assert_eq!(vb["policy"], "qta-mux", "{vb}");
    assert_eq!(
        vb["config"]["cherish_thresholds"],
        serde_json::json!([200, 100])
    );
}

/// Starts the perf server at beta and, once registered, a paced unreliable
/// perf client at alpha (cube 1) that runs throughout.
fn start_paced_traffic(procs: &mut Procs, bins: &Path, ctl: &Path, a: &str, b: &str) {
    // Paced unreliable traffic alpha -> beta (cube 1), running throughout.
    procs.0.push(
        Command::new(bins.join("rina-perf"))
            .args(["server", "--socket", b, "--dif", "net", "--name", "perf"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until("perf registered at beta", Duration::from_secs(10), || {
        let out = run(ctl, &["--socket", b, "--json", "names"]);
        String::from_utf8_lossy(&out.stdout).contains("\"perf\"")
    });
    procs.0.push(
        Command::new(bins.join("rina-perf"))
            .args([
                "client",
                "--socket",
                a,
                "--dif",
                "net",
                "--dst",
                "perf",
                "--size",
                "1000",
                "--rate-mbps",
                "4",
                "--duration-s",
                "120",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
}

/// Checks the FIFO counter grows, switches alpha's port to QTA-Mux and
/// checks its queues and that the traffic leaves through urgency-B.
fn check_switch_from_fifo_to_qta_mux(ctl: &Path, a: &str) {
    // FIFO: the one queue's counter grows with the traffic (~500 PDU/s;
    // hellos alone would take minutes to add 300).
    let v = sched(ctl, a, &["alpha.net"]);
    let fifo0 = sent(&v, "fifo").expect("a fifo queue");
    wait_sent(ctl, a, "fifo", fifo0, 300);

    // Switch to QTA-Mux: its queues replace the FIFO, with fresh counters.
    let v = sched(
        ctl,
        a,
        &[
            "alpha.net",
            "--set",
            r#"{"policy": "qta-mux", "cherish_thresholds": [200, 100], "skip_probability": 0.05}"#,
        ],
    );
    assert_eq!(v["policy"], "qta-mux", "{v}");
    assert_eq!(v["config"]["skip_probability"], 0.05, "{v}");
    // The multiplexer's queues (management, one per urgency level), then
    // the per-cube policers, named by QoS-id and C/U cell.
    assert_eq!(
        queues(&v),
        [
            "mgmt",
            "urgency-A",
            "urgency-B",
            "qos-1 (B2)",
            "qos-2 (A1)",
            "qos-other (B2)"
        ],
        "{v}"
    );
    let b0 = sent(&v, "urgency-B").unwrap();
    assert!(b0 < 300, "counters start afresh: {v}");
    // The traffic (cube 1, urgency B) leaves through urgency-B; nothing
    // uses cube 2, so urgency-A stays idle.
    let v = wait_sent(ctl, a, "urgency-B", b0, 300);
    assert_eq!(sent(&v, "urgency-A"), Some(0), "{v}");
    assert_eq!(sent(&v, "qos-2 (A1)"), Some(0), "{v}");
    assert!(sent(&v, "qos-1 (B2)") >= sent(&v, "urgency-B"), "{v}");
}

/// Starts a second perf client on cube 2 and checks its PDUs leave through
/// the urgent queue.
fn check_urgent_cube_uses_urgent_queue(procs: &mut Procs, bins: &Path, ctl: &Path, a: &str) {
    // A second flow that names cube 2 (`--qos-cube 2`, cell A1) leaves
    // through the urgent queue.
    procs.0.push(
        Command::new(bins.join("rina-perf"))
            .args([
                "client",
                "--socket",
                a,
                "--dif",
                "net",
                "--dst",
                "perf",
                "--qos-cube",
                "2",
                "--size",
                "1000",
                "--rate-mbps",
                "2",
                "--duration-s",
                "120",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let v = wait_sent(ctl, a, "urgency-A", 0, 100);
    assert!(sent(&v, "qos-2 (A1)").unwrap() >= 100, "{v}");
}

/// Checks bad policies, bad syntax and a shim IPCP are refused and leave
/// alpha on QTA-Mux.
fn check_bad_policies_are_refused(ctl: &Path, a: &str) {
    // A bad policy is refused, naming the parameter, and changes nothing.
    for (bad, names) in [
        (
            r#"{"policy": "qta-mux", "cherish_thresholds": [0, 5]}"#,
            "cherish_thresholds[0]",
        ),
        // Cube 1 is at cherish level 1: one threshold is not enough.
        (
            r#"{"policy": "qta-mux", "cherish_thresholds": [10]}"#,
            "cherish_thresholds",
        ),
        (r#"{"policy": "qta-mux"}"#, "cherish_thresholds"),
        (r#"{"policy": "fifo", "queue_size": 4}"#, "queue_size"),
        ("policy = \"wfq\"", "wfq"),
    ] {
        let out = run(ctl, &["--socket", a, "sched", "alpha.net", "--set", bad]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{bad}: {err}");
        assert!(err.contains(names), "{bad}: {err}");
    }
    let out = run(
        ctl,
        &["--socket", a, "sched", "alpha.net", "--set", "{ policy ="],
    );
    assert_eq!(out.status.code(), Some(2), "not JSON nor TOML");
    let out = run(ctl, &["--socket", a, "sched", "alpha.udp"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("only normal IPCPs"),
        "{err}"
    );
    let v = sched(ctl, a, &["alpha.net"]);
    assert_eq!(v["policy"], "qta-mux", "{v}");
}

/// Switches alpha back to FIFO from a TOML file and checks its counter grows.
fn check_back_to_fifo_from_a_file(ctl: &Path, a: &str, dir: &Path) {
    // Back to FIFO, from a TOML file; its counter grows again.
    let file = dir.join("fifo.toml");
    std::fs::write(&file, "policy = \"fifo\"\nqueue_len = 500\n").unwrap();
    let v = sched(ctl, a, &["alpha.net", "--set-file", file.to_str().unwrap()]);
    assert_eq!(v["policy"], "fifo", "{v}");
    assert_eq!(v["config"]["queue_len"], 500, "{v}");
    assert_eq!(queues(&v), ["fifo"], "{v}");
    let f0 = sent(&v, "fifo").unwrap();
    wait_sent(ctl, a, "fifo", f0, 300);
}

/// Checks `rinactl sched`'s table names the policy, the neighbour and the queue.
fn check_table(ctl: &Path, a: &str) {
    let out = run(ctl, &["--socket", a, "sched", "alpha.net"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let mut lines = text.lines();
    assert!(lines.next().unwrap().starts_with("IPCP"), "{text}");
    let row = lines.next().unwrap_or_default();
    assert!(
        row.contains("alpha.net") && row.contains("fifo") && row.contains("beta.net"),
        "{text}"
    );
}
