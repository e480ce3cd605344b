//! `rina-tgen` between two real `rinad` on loopback (shim DIF over UDP): a
//! bidirectional run of a two-flow traffic matrix with RTT probes writes the
//! CSV and JSON files of docs/rina-tgen.md on both sides, and they parse.

mod common;

use common::{bin_dir, free_port, spawn_rinad, wait_until, Procs};
use rina_tools::tgen::metrics::FlowReport;
use rina_tools::tgen::output::{FlowEntry, RunReport};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

fn config(me: &str, port: u16, peer_port: u16) -> String {
    format!(
        r#"[system]
name = "{me}"
[[ipcp]]
name = "{me}.udp"
type = "shim-udp"
dif = "udp"
bind = "127.0.0.1:{port}"
[ipcp.directory]
"tgen" = "127.0.0.1:{peer_port}"
"#
    )
}

const MATRIX: &str = r#"
seed = 11
[[flow]]
peer = "tgen"
profile = "hd-video-call"
duration_s = 2.0
direction = "bidirectional"

[[flow]]
peer = "tgen"
profile = "interactive"
rate_bps = 500000
size = 400
duration_s = 2.0
direction = "bidirectional"
start_s = 0.2
"#;

/// Every CSV has the documented header and rows of as many columns.
fn check_csv(path: &PathBuf, header: &str, rows: usize) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(header), "{}", path.display());
    let cols = header.split(',').count();
    let body: Vec<Vec<String>> = lines
        .map(|l| l.split(',').map(str::to_owned).collect())
        .collect();
    assert!(body.iter().all(|r| r.len() == cols), "{}", path.display());
    if rows > 0 {
        assert_eq!(body.len(), rows, "{}", path.display());
    }
    body
}

#[test]
fn bidirectional_run_between_two_daemons_writes_csv_and_json() {
    let bins = bin_dir();
    let dir = std::env::temp_dir().join(format!("rina-tgen-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut procs = Procs(Vec::new(), dir.clone());
    start_daemons(&mut procs, &bins, &dir);
    let (a, b) = (dir.join("alpha.sock"), dir.join("beta.sock"));
    wait_until("the daemons' sockets", Duration::from_secs(20), || {
        a.exists() && b.exists()
    });
    let tgen = bins.join("rina-tgen");
    procs.0.push(spawn_server(&tgen, &b, &dir));
    std::fs::write(dir.join("matrix.toml"), MATRIX).unwrap();
    // The server registers asynchronously: wait until its name is
    // registered at beta (a client run that failed half-way would use up
    // the server's two flows).
    wait_until("the server's registration", Duration::from_secs(20), || {
        rina::Client::connect_to(&b)
            .and_then(|mut c| c.list_names())
            .is_ok_and(|v| v.iter().any(|n| n.name.process_name == "tgen"))
    });
    let out = run_client(&tgen, &a, &dir);
    let cli = check_client_report(&out, &dir);
    check_client_csv(&dir);

    // The server exits after its two flows closed; its files hold `fwd`.
    let server = procs.0.pop().unwrap();
    check_server(server, &dir, &cli);
    check_unknown_destination(&tgen, &a);
}

/// A flow to a name nobody registered: its error once, and no empty table.
fn check_unknown_destination(tgen: &Path, a: &Path) {
    let out = Command::new(tgen)
        .arg("client")
        .arg("--socket")
        .arg(a)
        .args(["--dst", "nobody", "--duration-s", "1"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}{err}");
    let said: Vec<&str> = err.lines().filter(|l| l.contains("nobody")).collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].contains("cannot allocate a flow to nobody"),
        "{err}"
    );
    assert!(!stdout.contains("FLOW"), "an empty table: {stdout}");
}

/// Writes alpha's and beta's configurations into `dir` and starts their
/// `rinad` on two free loopback ports.
fn start_daemons(procs: &mut Procs, bins: &Path, dir: &Path) {
    let (pa, pb) = (free_port(), free_port());
    for (me, port, pport) in [("alpha", pa, pb), ("beta", pb, pa)] {
        let conf = dir.join(format!("{me}.toml"));
        std::fs::write(&conf, config(me, port, pport)).unwrap();
        let child = spawn_rinad(bins, &conf, &dir.join(format!("{me}.sock")));
        procs.0.push(child);
    }
}

/// Spawns `rina-tgen server` at beta (socket `b`), for two flows, writing
/// `dir/srv.*` and its JSON report on stdout.
fn spawn_server(tgen: &Path, b: &Path, dir: &Path) -> Child {
    Command::new(tgen)
        .arg("server")
        .arg("--socket")
        .arg(b)
        .args([
            "--name",
            "tgen",
            "--max-flows",
            "2",
            "--samples",
            "100000",
            "--interval-s",
            "0",
            "--json",
            "--out",
        ])
        .arg(dir.join("srv"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Runs `rina-tgen client` at alpha (socket `a`) with the matrix and RTT
/// probes, writing `dir/cli.*`; its output.
fn run_client(tgen: &Path, a: &Path, dir: &Path) -> Output {
    Command::new(tgen)
        .arg("client")
        .arg("--socket")
        .arg(a)
        .arg("--matrix")
        .arg(dir.join("matrix.toml"))
        .args([
            "--rtt",
            "--probe-interval-ms",
            "20",
            "--samples",
            "100000",
            "--interval-s",
            "0.5",
            "--json",
            "--out",
        ])
        .arg(dir.join("cli"))
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Checks the client succeeded and its JSON (stdout and `cli.json`, the
/// same) reports both flows in full; the report.
fn check_client_report(out: &Output, dir: &Path) -> RunReport {
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // stdout is the same JSON as the file.
    let stdout: RunReport = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let cli: RunReport =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cli.json")).unwrap())
            .expect("cli.json parses");
    assert_eq!(stdout, cli);
    assert_eq!(
        (cli.tool.as_str(), cli.schema, cli.role.as_str()),
        ("rina-tgen", 1, "client")
    );
    assert_eq!(cli.flows.len(), 2);
    for f in &cli.flows {
        check_client_flow(f);
    }
    cli
}

/// Checks one flow of the client's report: its three directions, their
/// delays, the reverse samples and the forward rate; prints each direction.
fn check_client_flow(f: &FlowEntry) {
    assert_eq!(f.error, None, "{f:?}");
    assert_eq!(f.dif, "udp");
    let dirs: Vec<&str> = f.reports.iter().map(|r| r.direction.as_str()).collect();
    assert_eq!(dirs, ["fwd", "rev", "rtt"]);
    for r in &f.reports {
        println!(
            "flow {} {}: sent {} recv {} loss {:.2}% goodput {:.3} Mb/s delay {:?}",
            f.flow,
            r.direction,
            r.sent_sdus,
            r.recv_sdus,
            r.loss_pct,
            r.goodput_bps / 1e6,
            r.delay
        );
        assert!(r.recv_sdus > 0, "{r:?}");
        assert_eq!(r.duplicates, 0);
        let d = r.delay.unwrap();
        assert!(
            d.min_us >= 0.0 && d.min_us <= d.p50_us && d.p50_us <= d.max_us,
            "{d:?}"
        );
    }
    let rev = &f.reports[1];
    assert!(rev.fin_received, "{rev:?}");
    assert_eq!(rev.samples_us.as_ref().unwrap().len() as u64, rev.recv_sdus);
    let hist: u64 = rev.histogram.as_ref().unwrap().iter().map(|b| b[2]).sum();
    assert_eq!(hist, rev.recv_sdus);
    // ~1.5 Mb/s (flow 1) or ~0.5 Mb/s (flow 2) over 2 s, on loopback.
    let target = if f.profile == "hd-video-call" {
        1.5e6
    } else {
        0.5e6
    };
    let fwd = &f.reports[0];
    assert!(fwd.fin_received);
    let sent_bps = fwd.sent_bytes.unwrap() as f64 * 8.0 / 2.0;
    assert!(
        (sent_bps - target).abs() / target < 0.35,
        "{sent_bps} vs {target}"
    );
}

/// Checks the client's `cli.csv` and `cli.delays.csv`.
fn check_client_csv(dir: &Path) {
    let rows = check_csv(&dir.join("cli.csv"), FlowReport::CSV_HEADER, 6);
    assert_eq!(rows[0][0], "1");
    assert_eq!(rows[0][1], "fwd");
    assert_eq!(rows[0][3], "hd-video-call");
    for r in &rows {
        let loss: f64 = r[9].parse().unwrap();
        assert!((0.0..=100.0).contains(&loss));
    }
    let delays = check_csv(
        &dir.join("cli.delays.csv"),
        "flow,direction,index,delay_us",
        0,
    );
    assert!(delays.len() > 100);
    assert!(delays.iter().all(|r| r[3].parse::<f64>().is_ok()));
}

/// Waits for the server to exit and checks its JSON (file and stdout) and
/// CSV agree with what the client got in the REPORT.
fn check_server(mut server: Child, dir: &Path, cli: &RunReport) {
    wait_until("the server to exit", Duration::from_secs(10), || {
        server.try_wait().unwrap().is_some()
    });
    let so = server.wait_with_output().unwrap();
    assert!(so.status.success());
    let srv: RunReport =
        serde_json::from_str(&std::fs::read_to_string(dir.join("srv.json")).unwrap())
            .expect("srv.json parses");
    assert_eq!(srv.role, "server");
    assert_eq!(srv.flows.len(), 2);
    let from_stdout: RunReport =
        serde_json::from_slice(&so.stdout[so.stdout.iter().position(|&c| c == b'{').unwrap()..])
            .unwrap();
    assert_eq!(from_stdout.flows.len(), 2);
    for f in &srv.flows {
        let c = cli.flows.iter().find(|c| c.flow == f.flow).unwrap();
        assert_eq!(f.reports.len(), 1);
        let (s, cf) = (&f.reports[0], &c.reports[0]);
        assert_eq!(s.direction, "fwd");
        assert_eq!(f.profile, c.profile);
        // What the client got in the REPORT is what the server measured.
        assert_eq!(s.recv_sdus, cf.recv_sdus);
        assert_eq!(s.sent_sdus, cf.sent_sdus);
    }
    check_csv(&dir.join("srv.csv"), FlowReport::CSV_HEADER, 2);
}
