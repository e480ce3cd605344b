//! Helpers shared by the tools' integration tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

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
