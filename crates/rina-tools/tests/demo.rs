//! The main job end to end: `rina-demo` with real `rinad` processes, and the
//! promise that it stops everything it started, also on Ctrl-C.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DEMO: &str = env!("CARGO_BIN_EXE_rina-demo");

/// The directory with `rinad` and the tools, building `rinad` if this test
/// runs alone (`cargo test -p rina-tools` does not build other packages' binaries).
fn bin_dir() -> PathBuf {
    let dir = Path::new(DEMO).parent().expect("bin dir").to_path_buf();
    if !dir.join("rinad").exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "rinad"]);
        if dir.ends_with("release") {
            cmd.arg("--release");
        }
        assert!(cmd.status().expect("run cargo").success(), "building rinad");
    }
    dir
}

/// Command lines of live processes that belong to the demo with this pid
/// (its temporary directory is named after it).
fn leftovers(pid: u32) -> Vec<String> {
    let tag = format!("rina-demo-{pid}-");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .filter(|c| c.contains(&tag))
        .collect()
}

fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if cond() {
            return;
        }
        std::thread::park_timeout(Duration::from_millis(20));
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

#[test]
fn the_demo_measures_and_cleans_up() {
    let child = Command::new(DEMO)
        .arg("--bin-dir")
        .arg(bin_dir())
        .args(["--json", "--echo-count", "5", "--perf-duration-s", "0.5"])
        .args(["--sweep-duration-s", "0.2"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rina-demo");
    let pid = child.id();
    let out = child.wait_with_output().expect("run rina-demo");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "rina-demo failed: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON summary");
    assert_eq!(v["ok"], true);
    assert_eq!(v["echo"]["sent"], 5);
    assert!(
        v["echo"]["received"].as_u64().unwrap() >= 4,
        "{}",
        v["echo"]
    );
    let perf = &v["perf"]["tests"][0];
    assert_eq!(perf["size"], 1400);
    assert!(
        perf["report"]["recv_sdus"].as_u64().unwrap() > 100,
        "{perf}"
    );
    assert!(perf["rx_mbps"].as_f64().unwrap() > 1.0, "{perf}");
    let sweep: Vec<u64> = v["sweep"]["tests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["size"].as_u64().unwrap())
        .collect();
    assert_eq!(sweep, vec![64, 512, 1400]);
    let names = &v["ipcps_beta"][0]["names"];
    assert!(
        names.as_array().unwrap().len() == 2,
        "beta holds echo and perf: {names}"
    );
    // Without --keep nothing is left: no process, no directory.
    assert_eq!(leftovers(pid), Vec::<String>::new());
    let tag = format!("rina-demo-{pid}-");
    let dirs: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&tag))
        .collect();
    assert!(dirs.is_empty(), "temporary directory left: {dirs:?}");
}

#[test]
fn ctrl_c_stops_every_process_the_demo_started() {
    let mut child = Command::new(DEMO)
        .arg("--bin-dir")
        .arg(bin_dir())
        .args(["--json", "--perf-duration-s", "30"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start rina-demo");
    let pid = child.id();
    wait_until(
        "the demo to start its daemons and servers",
        Duration::from_secs(30),
        || {
            leftovers(pid)
                .iter()
                .filter(|c| c.contains("rina-perf client"))
                .count()
                == 1
        },
    );
    let started = leftovers(pid);
    assert!(
        started.iter().filter(|c| c.contains("rinad")).count() == 2,
        "{started:?}"
    );
    let status = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .expect("kill -INT");
    assert!(status.success());
    let mut code = None;
    wait_until(
        "the demo to exit after Ctrl-C",
        Duration::from_secs(15),
        || {
            code = child.try_wait().ok().flatten().map(|s| s.code());
            code.is_some()
        },
    );
    assert_eq!(code, Some(Some(130)));
    wait_until("every child to be gone", Duration::from_secs(5), || {
        leftovers(pid).is_empty()
    });
}
