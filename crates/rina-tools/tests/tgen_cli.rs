//! `rina-tgen` between two real `rinad` on loopback (shim DIF over UDP): a
//! bidirectional run of a two-flow traffic matrix with RTT probes writes the
//! CSV and JSON files of docs/rina-tgen.md on both sides, and they parse; a
//! server refuses what its flow cannot carry, and ends its reverse traffic
//! when the flow closes; a client faster than its flow stops at its end.

mod common;

use common::{bin_dir, free_port, spawn_rinad, wait_until, Procs};
use rina::{Client, Flow, QosSpec};
use rina_tools::tgen::header::{Header, Kind, HEADER_LEN};
use rina_tools::tgen::metrics::FlowReport;
use rina_tools::tgen::output::{FlowEntry, RunReport};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

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
"closer" = "127.0.0.1:{peer_port}"
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
    let (mut procs, dir, a, b) = two_daemons(&bins, "rina-tgen-cli");
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
/// Alpha and beta up in a fresh directory named after `tag`: their
/// processes, the directory, and alpha's and beta's sockets.
fn two_daemons(bins: &Path, tag: &str) -> (Procs, PathBuf, PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut procs = Procs(Vec::new(), dir.clone());
    start_daemons(&mut procs, bins, &dir);
    let (a, b) = (dir.join("alpha.sock"), dir.join("beta.sock"));
    wait_until("the daemons' sockets", Duration::from_secs(20), || {
        a.exists() && b.exists()
    });
    (procs, dir, a, b)
}

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

/// Sends a HELLO asking for reverse traffic of `source` (JSON) for
/// `duration_s` on a new flow from alpha to the server; the flow.
/// Waits up to `limit` for `child` to exit (killing it after that):
/// whether it exited on its own, and its output.
fn exit_within(mut child: Child, limit: Duration) -> (bool, Output) {
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() && t0.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(20));
    }
    let exited = child.try_wait().unwrap().is_some();
    if !exited {
        let _ = child.kill();
    }
    (exited, child.wait_with_output().unwrap())
}

/// A flow from `evil` to the `tgen` server.
fn to_tgen(c: &mut Client) -> Flow {
    c.allocate(
        &"evil".parse().unwrap(),
        &"tgen".parse().unwrap(),
        None,
        &QosSpec::default(),
    )
    .expect("allocate")
}

fn hello(c: &mut Client, flow: u32, source: &str, duration_s: f64) -> Flow {
    let f = to_tgen(c);
    let body = format!(
        r#"{{"flow":{flow},"source":{source},"seed":1,"duration_s":{duration_s},"direction":"reverse"}}"#
    );
    let h = Header {
        kind: Kind::Hello,
        flow,
        seq: 0,
        send_ns: 0,
    };
    f.write(&h.encode_with(body.as_bytes()))
        .expect("write HELLO");
    f
}

/// The header of the next SDU on `f`, within 10 s.
fn next_header(f: &Flow) -> Header {
    let mut buf = vec![0u8; f.max_sdu().max(HEADER_LEN)];
    let n = f
        .read_timeout(&mut buf, Duration::from_secs(10))
        .expect("read")
        .expect("an SDU within 10 s");
    Header::decode(&buf[..n]).expect("a tgen SDU")
}

#[test]
fn a_server_refuses_what_its_flow_cannot_carry_and_stops_when_flows_close() {
    let bins = bin_dir();
    let (mut procs, _dir, a, b) = two_daemons(&bins, "rina-tgen-limits");
    let tgen = bins.join("rina-tgen");
    start_server(&mut procs, &tgen, &b, 3, &[]);
    let mut c = Client::connect_to(&a).expect("connect to alpha");
    // SDUs of 1 TiB: the server allocated its send buffer for them, and
    // the allocation failing aborted it. Now refused: a FIN of nothing sent.
    let huge = hello(&mut c, 7, r#"{"profile":"cbr","size":1099511627776}"#, 5.0);
    let fin = next_header(&huge);
    assert_eq!(
        (fin.kind, fin.flow, fin.seq, fin.send_ns),
        (Kind::Fin, 7, 0, 0)
    );
    // Larger than the flow carries, though a valid profile.
    let max_sdu = huge.max_sdu();
    let big = format!(r#"{{"profile":"cbr","size":{}}}"#, max_sdu + 1);
    let too_big = hello(&mut c, 8, &big, 5.0);
    assert_eq!(next_header(&too_big).kind, Kind::Fin);
    // One SDU now, the next in 130 days: the reverse thread slept until
    // then, so the server never saw its flows closed nor exited.
    let slow = hello(&mut c, 9, r#"{"profile":"cbr","rate_bps":0.001}"#, 1e9);
    assert_eq!(next_header(&slow).kind, Kind::Data);
    drop((huge, too_big, slow));
    let server = procs.0.pop().unwrap();
    let (exited, out) = exit_within(server, Duration::from_secs(10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        exited,
        "the server did not exit once its flows closed: {err}"
    );
    assert!(out.status.success(), "{err}");
    let huge_said = "its HELLO's source is refused: SDU size 1099511627776 is more than \
                     1048576 bytes (1 MiB): no reverse traffic";
    let big_said = format!(
        "its HELLO asks for SDUs of {} bytes, more than the flow's maximum SDU of {} bytes: \
         no reverse traffic",
        max_sdu + 1,
        max_sdu
    );
    let logged = |flow: u32, what: &str| {
        err.lines()
            .any(|l| l.starts_with(&format!("rina-tgen: flow {flow} from ")) && l.ends_with(what))
    };
    assert!(logged(7, huge_said) && logged(8, &big_said), "{err}");
    let json = &out.stdout[out.stdout.iter().position(|&c| c == b'{').unwrap()..];
    let srv: RunReport = serde_json::from_slice(json).expect("JSON on stdout");
    let error = |flow: u32| {
        srv.flows
            .iter()
            .find(|f| f.flow == flow)
            .and_then(|f| f.error.clone())
    };
    assert_eq!(error(7).as_deref(), Some(huge_said));
    assert_eq!(error(8), Some(big_said));
    assert_eq!(error(9), None);
}

/// What a peer did to a long-running server: one SDU numbered 2^26 - 1
/// per flow, then close. The server kept every flow's whole measurement
/// for ever (8 MiB of duplicate bitmap each: 40 such flows grew it by
/// 322 MiB); now it lists the last `--keep-flows` that ended, in its
/// report and files, and totals every one.
#[test]
fn a_server_lists_its_last_flows_and_totals_all_of_them() {
    let bins = bin_dir();
    let (mut procs, dir, a, b) = two_daemons(&bins, "rina-tgen-keep");
    let tgen = bins.join("rina-tgen");
    let out = dir.join("srv");
    let out_arg = out.to_str().unwrap();
    start_server(
        &mut procs,
        &tgen,
        &b,
        4,
        &["--keep-flows", "2", "--out", out_arg],
    );
    let mut c = Client::connect_to(&a).expect("connect to alpha");
    for flow in 1..=4 {
        let f = to_tgen(&mut c);
        let mut data = [0u8; HEADER_LEN];
        Header::data(flow, (1 << 26) - 1, 0).write(&mut data);
        f.write(&data).expect("write DATA");
        // The FIN says one SDU of 28 bytes was sent; the REPORT comes
        // once the server measured it.
        let fin = Header {
            kind: Kind::Fin,
            flow,
            seq: 1,
            send_ns: HEADER_LEN as u64,
        };
        f.write(&fin.encode_with(&[])).expect("write FIN");
        assert_eq!(next_header(&f).kind, Kind::Report);
    }
    let server = procs.0.pop().unwrap();
    let (exited, so) = exit_within(server, Duration::from_secs(10));
    assert!(exited && so.status.success(), "{so:?}");
    let json = &so.stdout[so.stdout.iter().position(|&c| c == b'{').unwrap()..];
    let srv: RunReport = serde_json::from_slice(json).expect("JSON on stdout");
    let file: RunReport =
        serde_json::from_str(&std::fs::read_to_string(dir.join("srv.json")).unwrap()).unwrap();
    for r in [&srv, &file] {
        // Flows 3 and 4 end as their closes reach the server, which may be
        // in either order (each waits for its own acknowledgement).
        let mut kept: Vec<u32> = r.flows.iter().map(|f| f.flow).collect();
        kept.sort_unstable();
        assert_eq!(kept, vec![3, 4], "the last two flows that ended");
        let t = r.totals.as_ref().expect("a server's totals");
        assert_eq!((t.flows, t.flows_dropped, t.errors), (4, 2, 0));
        assert_eq!((t.sent_sdus, t.recv_sdus, t.lost_sdus), (4, 4, 0));
        assert_eq!(t.recv_bytes, 4 * HEADER_LEN as u64);
    }
    check_csv(&dir.join("srv.csv"), FlowReport::CSV_HEADER, 2);
}

/// A client at 10^12 bit/s for 1 s, far faster than its flow: it sent what
/// its schedule held before the end (4.5 billion SDUs), for hours; now it
/// stops when the clock reaches the end.
/// Starts `rina-tgen server` at beta (socket `b`) for `max_flows` flows
/// with `extra` options, its output piped, and waits for its registration.
fn start_server(procs: &mut Procs, tgen: &Path, b: &Path, max_flows: u32, extra: &[&str]) {
    let server = Command::new(tgen)
        .arg("server")
        .arg("--socket")
        .arg(b)
        .args(["--max-flows", &max_flows.to_string()])
        .args(extra)
        .args(["--interval-s", "0", "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    procs.0.push(server);
    wait_until("the server's registration", Duration::from_secs(20), || {
        Client::connect_to(b)
            .and_then(|mut c| c.list_names())
            .is_ok_and(|v| v.iter().any(|n| n.name.process_name == "tgen"))
    });
}

/// A client asked for more than it can send stops at its end by the
/// clock. On daemons of its own: the flood over shim-udp may take the
/// flow's deallocation with it, so the server may never see it end.
#[test]
fn a_client_behind_its_schedule_stops_at_its_end() {
    let bins = bin_dir();
    let (mut procs, _dir, a, b) = two_daemons(&bins, "rina-tgen-fast");
    let tgen = bins.join("rina-tgen");
    start_server(&mut procs, &tgen, &b, 1, &[]);
    check_fast_client_stops_at_its_end(&tgen, &a);
}

fn check_fast_client_stops_at_its_end(tgen: &Path, a: &Path) {
    let client = Command::new(tgen)
        .arg("client")
        .arg("--socket")
        .arg(a)
        .args(["--rate-bps", "1e12", "--size", "28", "--duration-s", "1"])
        .args(["--direction", "forward", "--interval-s", "0", "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (done, out) = exit_within(client, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(done, "a 1 s client still ran after 30 s: {err}");
    let r: RunReport = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let sent = r.flows[0].sent.as_ref().expect("forward: what was sent");
    assert!(sent.sdus > 0, "{r:?}");
}

#[test]
fn a_client_stops_when_its_flow_closes() {
    let bins = bin_dir();
    let (_procs, _dir, a, b) = two_daemons(&bins, "rina-tgen-closed");
    // A peer that takes the flow, reads its HELLO and closes it.
    let mut srv = Client::connect_to(&b).expect("connect to beta");
    srv.register(&"closer".parse().unwrap(), None)
        .expect("register");
    let client = Command::new(bins.join("rina-tgen"))
        .arg("client")
        .arg("--socket")
        .arg(&a)
        .args([
            "--dst",
            "closer",
            "--rate-bps",
            "0.001",
            "--duration-s",
            "1e9",
        ])
        .args(["--direction", "forward", "--interval-s", "0", "--json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let req = srv
        .next_request_timeout(Duration::from_secs(20))
        .expect("a request")
        .expect("a request within 20 s");
    let flow = srv.accept(&req).expect("accept");
    assert_eq!(next_header(&flow).kind, Kind::Hello);
    drop(flow);
    // Its next SDU was 130 days away, and it slept until then.
    let (done, out) = exit_within(client, Duration::from_secs(15));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        done,
        "the client still ran 15 s after its flow closed: {err}"
    );
    let r: RunReport = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    let e = r.flows[0].error.as_deref().unwrap_or_default();
    assert!(e.contains("closed before its end"), "{r:?}");
}
