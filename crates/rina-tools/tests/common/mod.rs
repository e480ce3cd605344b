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
