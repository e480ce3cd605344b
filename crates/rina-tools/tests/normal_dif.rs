//! The tools over a normal DIF: two real `rinad`, each with a shim DIF over
//! UDP and a normal DIF on top, `rina-echo` and `rina-perf` between them.

mod common;

use common::{bin_dir, normal_pair};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn run(bin: &Path, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run the tool")
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

#[test]
fn rina_echo_and_rina_perf_run_over_a_normal_dif() {
    let bins = bin_dir();
    let (mut procs, a, b) = normal_pair("normal", |_| "\"echo\" = 2\n\"perf\" = 2".into());
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    for (tool, name) in [("rina-echo", "echo"), ("rina-perf", "perf")] {
        let child = Command::new(bins.join(tool))
            .args(["server", "--socket", b, "--dif", "net", "--name", name])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        procs.0.push(child);
    }
    // The servers register asynchronously: retry the first client briefly.
    let echo_args = [
        "client",
        "--socket",
        a,
        "--dif",
        "net",
        "--dst",
        "echo",
        "--count",
        "5",
        "--interval-ms",
        "20",
        "--json",
    ];
    let mut echo = run(&bins.join("rina-echo"), &echo_args);
    while !echo.status.success() && Instant::now() < deadline {
        std::thread::park_timeout(Duration::from_millis(100));
        echo = run(&bins.join("rina-echo"), &echo_args);
    }
    let e = json(&echo);
    assert_eq!(e["dif"], "net");
    assert_eq!(e["received"], 5, "{e}");

    let perf = run(
        &bins.join("rina-perf"),
        &[
            "client",
            "--socket",
            a,
            "--dif",
            "net",
            "--dst",
            "perf",
            "--size",
            "1400",
            "--count",
            "3000",
            "--reliable",
            "--json",
        ],
    );
    let p = json(&perf);
    let t = &p["tests"][0];
    assert_eq!(t["report"]["recv_sdus"], 3000, "{p}");
    assert_eq!(t["loss_pct"], 0.0, "{p}");
    assert!(t["rx_mbps"].as_f64().unwrap() > 1.0, "{p}");
}
