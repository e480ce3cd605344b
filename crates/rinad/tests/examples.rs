//! Every configuration under `examples/` is accepted by `rinad --check`
//! (except `examples/lab/`, which holds rina-lab experiment files, checked
//! by rina-lab's own tests).

use std::process::Command;

#[test]
fn example_configurations_are_valid() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
    let mut checked = 0;
    for dir in std::fs::read_dir(root).expect("examples/") {
        let dir = dir.unwrap().path();
        if !dir.is_dir() || dir.ends_with("lab") {
            continue;
        }
        for f in std::fs::read_dir(&dir).unwrap() {
            let f = f.unwrap().path();
            if f.extension().is_some_and(|e| e == "toml") {
                let out = Command::new(env!("CARGO_BIN_EXE_rinad"))
                    .arg("--config")
                    .arg(&f)
                    .arg("--check")
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{}: {}",
                    f.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 5, "only {checked} example files found");
}
