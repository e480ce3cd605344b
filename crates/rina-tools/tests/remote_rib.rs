//! `rinactl rib --remote`: a member reads its neighbour's RIB over the DIF
//! (CDAP `M_READ` in management PDUs), with two real `rinad`: A bootstraps
//! the normal DIF, B enrolls through A, then B reads A's RIB.

mod common;

use common::{bin_dir, free_port, spawn_rinad, wait_until, Procs};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// A system `me` with UDP port `port`, one neighbour (name, UDP port), and
/// extra keys for its normal IPCP.
fn system(me: &str, port: u16, peer: (&str, u16), extra: &str) -> String {
    let (p, pp) = peer;
    format!(
        "[system]\nname = \"{me}\"\n\n[[ipcp]]\nname = \"{me}.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:{port}\"\n\n[ipcp.directory]\n\"{p}.net\" = \"127.0.0.1:{pp}\"\n\n[[ipcp]]\nname = \"{me}.net\"\ntype = \"normal\"\ndif = \"net\"\n{extra}\n[[ipcp.neighbor]]\nname = \"{p}.net\"\nover = \"udp\"\n"
    )
}

fn run(bin: &Path, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run the tool")
}

#[test]
fn rinactl_reads_a_neighbours_rib_over_the_dif() {
    let bins = bin_dir();
    let dir = std::env::temp_dir().join(format!("rina-tools-remote-rib-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut procs = Procs(Vec::new(), dir.clone());
    let (pa, pb) = (free_port(), free_port());
    let pw = "password = \"s3cret\"\n";
    // A lets its members read /difm and /ra only.
    let boot = format!(
        "address = 1\n{pw}routing = \"link-state\"\ndirectory_mode = \"distributed\"\nrib_readable = [\"/difm\", \"/ra\"]\n"
    );
    for (me, port, peer, extra) in [
        ("a", pa, ("b", pb), boot.as_str()),
        ("b", pb, ("a", pa), pw),
    ] {
        let conf = dir.join(format!("{me}.toml"));
        std::fs::write(&conf, system(me, port, peer, extra)).unwrap();
        let child = spawn_rinad(&bins, &conf, &dir.join(format!("{me}.sock")));
        procs.0.push(child);
    }
    let b = dir.join("b.sock");
    let b = b.to_str().unwrap();
    let ctl = bins.join("rinactl");
    let read = |path: &str, remote: &str| {
        run(
            &ctl,
            &[
                "--socket", b, "--json", "rib", "b.net", path, "--remote", remote,
            ],
        )
    };
    // Until B has enrolled and heard A's hello, A is no neighbour yet.
    let mut objects = serde_json::Value::Null;
    wait_until("B to read A's RIB", Duration::from_secs(30), || {
        let out = read("/difm/nam", "a.net");
        if !out.status.success() {
            return false;
        }
        objects = serde_json::from_slice(&out.stdout).expect("JSON output");
        true
    });
    let list = objects.as_array().expect("a list of objects");
    let addr = list
        .iter()
        .find(|o| o["name"] == "/difm/nam/addr")
        .unwrap_or_else(|| panic!("A's address object in {objects}"));
    assert_eq!(addr["value"], "1", "{objects}");
    assert_eq!(addr["owner"], "remote");

    // By address, in a table: A's neighbours include B.
    let out = run(
        &ctl,
        &[
            "--socket",
            b,
            "rib",
            "b.net",
            "/ra/neighbors",
            "--remote",
            "1",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("/ra/neighbors"), "{text}");

    // Who is no neighbour cannot be read; what A lacks is refused with
    // A's reason.
    let out = read("/", "nobody.net");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no neighbour nobody.net"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = read("/ra/no/such/thing", "a.net");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/ra/no/such/thing"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = read("/dt", "a.net");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/dt is not readable by members of net"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(procs);
}
