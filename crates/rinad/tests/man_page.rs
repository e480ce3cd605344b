//! `rinad --generate-docs DIR` writes its man page and shell completions
//! from its command-line definition (crates/rina-docgen), like the tools.

use std::process::Command;

#[test]
fn rinad_generates_its_man_page_and_completions() {
    let dir = std::env::temp_dir().join(format!("rinad-docs-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_rinad"))
        .arg("--generate-docs")
        .arg(&dir)
        .output()
        .expect("run rinad");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in [
        "man/man1/rinad.1",
        "completions/rinad.bash",
        "completions/_rinad",
        "completions/rinad.fish",
    ] {
        assert!(dir.join(f).is_file(), "no {f}");
    }
    let page = std::fs::read_to_string(dir.join("man/man1/rinad.1")).expect("page");
    for want in ["\\-\\-config", "\\-\\-check", "rinad.toml", "RINA_SOCKET"] {
        assert!(page.contains(want), "the page lacks {want}: {page}");
    }
    // The option stays out of --help.
    let help = Command::new(env!("CARGO_BIN_EXE_rinad"))
        .arg("--help")
        .output()
        .expect("run rinad");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(!help.contains("generate-docs"), "{help}");
    let _ = std::fs::remove_dir_all(&dir);
}
