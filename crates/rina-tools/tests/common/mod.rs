//! Helpers shared by the tools' integration tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kills the processes it holds when dropped, and removes the directory.
pub struct Procs(pub Vec<Child>, pub PathBuf);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

/// A free UDP port on loopback, from below the ephemeral range.
pub fn free_port() -> u16 {
    rina::ports::unused_loopback_udp_port().expect("a free UDP port on loopback")
}

/// Re-checks `cond` until it holds; panics naming `what` after `timeout`.
/// For conditions with no event to wait on (a file appearing, a process
/// exiting, a daemon answering).
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < end,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::park_timeout(Duration::from_millis(20));
    }
}

/// The directory holding `rinad` and the tools, building `rinad` first if
/// this test binary runs alone (`cargo test -p rina-tools` does not build
/// other packages' binaries).
pub fn bin_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_rina-echo"))
        .parent()
        .expect("bin dir")
        .to_path_buf();
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

/// Starts `rinad` from `bins` with configuration `conf` and control socket
/// `socket`, its output discarded.
pub fn spawn_rinad(bins: &Path, conf: &Path, socket: &Path) -> Child {
    Command::new(bins.join("rinad"))
        .arg("--config")
        .arg(conf)
        .arg("--socket")
        .arg(socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The configuration of system `me` (address `addr`, shim-udp on UDP
/// `port`) for [`normal_pair`]: a normal DIF `net` over shim-udp DIF `udp`,
/// neighbour of `peer`; `tail` is the lines of the normal IPCP's
/// `[ipcp.names]` table (its static directory) and any tables of it after
/// (`[[ipcp.qos_cube]]`, `[ipcp.scheduler]`).
pub fn normal_over_udp(
    me: &str,
    (addr, port): (u64, u16),
    (peer, peer_addr, peer_port): (&str, u64, u16),
    tail: &str,
) -> String {
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
{tail}
"#
    )
}

/// Two `rinad`, alpha (address 1) and beta (address 2), in a directory
/// named after `tag`, their normal IPCPs neighbours in DIF `net` over
/// shim-udp on loopback, each with the [`normal_over_udp`] `tail` that
/// `tail` gives for its name; returns once the DIF is up: the processes
/// and the two control sockets.
pub fn normal_pair(tag: &str, tail: impl Fn(&str) -> String) -> (Procs, PathBuf, PathBuf) {
    let bins = bin_dir();
    let dir = std::env::temp_dir().join(format!("rina-tools-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut procs = Procs(Vec::new(), dir.clone());
    let (pa, pb) = (free_port(), free_port());
    for (me, addr, port, peer, paddr, pport) in [
        ("alpha", 1, pa, "beta", 2, pb),
        ("beta", 2, pb, "alpha", 1, pa),
    ] {
        let conf = dir.join(format!("{me}.toml"));
        let text = normal_over_udp(me, (addr, port), (peer, paddr, pport), &tail(me));
        std::fs::write(&conf, text).unwrap();
        procs
            .0
            .push(spawn_rinad(&bins, &conf, &dir.join(format!("{me}.sock"))));
    }
    let (a, b) = (dir.join("alpha.sock"), dir.join("beta.sock"));
    let ctl = bins.join("rinactl");
    wait_until("the normal DIF up", Duration::from_secs(20), || {
        let out = Command::new(&ctl)
            .arg("--socket")
            .arg(&a)
            .args(["--json", "ipcps"])
            .stdin(Stdio::null())
            .output()
            .expect("run rinactl");
        out.status.success()
            && serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .ok()
                .and_then(|v| {
                    v.as_array()?
                        .iter()
                        .find(|i| i["name"] == "alpha.net")
                        .map(|i| i["counters"]["neighbors_up"] == 1)
                })
                .unwrap_or(false)
    });
    (procs, a, b)
}
