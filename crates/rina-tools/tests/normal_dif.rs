//! The tools over a normal DIF: two real `rinad`, each with a shim DIF over
//! UDP and a normal DIF on top, `rina-echo` and `rina-perf` between them.

mod common;

use common::{bin_dir, free_port, spawn_rinad, Procs};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn config(me: &str, addr: u64, port: u16, peer: &str, peer_addr: u64, peer_port: u16) -> String {
    format!(
        r#"[system]
name = "{me}"
[[ipcp]]
name = "{me}.udp"
type = "shim-udp"
dif = "udp"
bind = "127.0.0.1:{port}"
[ipcp.directory]
"{peer}.net" = "127.0.0.1:{peer_port}"
[[ipcp]]
name = "{me}.net"
type = "normal"
dif = "net"
address = {addr}
[[ipcp.neighbor]]
name = "{peer}.net"
over = "udp"
address = {peer_addr}
[ipcp.names]
"echo" = 2
"perf" = 2
"#
    )
}

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
    let dir = std::env::temp_dir().join(format!("rina-tools-normal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut procs = Procs(Vec::new(), dir.clone());
    let (pa, pb) = (free_port(), free_port());
    for (me, addr, port, peer, paddr, pport) in [
        ("alpha", 1, pa, "beta", 2, pb),
        ("beta", 2, pb, "alpha", 1, pa),
    ] {
        let conf = dir.join(format!("{me}.toml"));
        std::fs::write(&conf, config(me, addr, port, peer, paddr, pport)).unwrap();
        let child = spawn_rinad(&bins, &conf, &dir.join(format!("{me}.sock")));
        procs.0.push(child);
    }
    let a = dir.join("alpha.sock");
    let b = dir.join("beta.sock");
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let ctl = bins.join("rinactl");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = run(&ctl, &["--socket", a, "--json", "ipcps"]);
        let up = out.status.success()
            && serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .ok()
                .and_then(|v| {
                    v.as_array()?
                        .iter()
                        .find(|i| i["name"] == "alpha.net")
                        .map(|i| i["counters"]["neighbors_up"] == 1)
                })
                .unwrap_or(false);
        if up {
            break;
        }
        assert!(Instant::now() < deadline, "the normal DIF did not come up");
        std::thread::park_timeout(Duration::from_millis(50));
    }
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
