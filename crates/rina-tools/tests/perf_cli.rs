//! `rina-perf` between two real `rinad` on loopback (shim DIF over UDP):
//! request/response tests (transactions and latency percentiles, several
//! requests outstanding) and parallel flows (`-p N`: per-flow results and
//! their total), as `--json` reports them.

mod common;

use common::{bin_dir, free_port, spawn_rinad, wait_until, Procs};
use rina_tools::perf::PerfReport;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
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
"perf" = "127.0.0.1:{peer_port}"
"#
    )
}

/// Two daemons, alpha and beta, over shim-udp on loopback, in a fresh
/// directory named after `what`: their processes and control sockets.
fn two_daemons(what: &str) -> (Procs, PathBuf, PathBuf) {
    let bins = bin_dir();
    let dir = std::env::temp_dir().join(format!("{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut procs = Procs(Vec::new(), dir.clone());
    let (pa, pb) = (free_port(), free_port());
    for (me, port, pport) in [("alpha", pa, pb), ("beta", pb, pa)] {
        let conf = dir.join(format!("{me}.toml"));
        std::fs::write(&conf, config(me, port, pport)).unwrap();
        let child = spawn_rinad(&bins, &conf, &dir.join(format!("{me}.sock")));
        procs.0.push(child);
    }
    let (a, b) = (dir.join("alpha.sock"), dir.join("beta.sock"));
    wait_until("the daemons' sockets", Duration::from_secs(20), || {
        a.exists() && b.exists()
    });
    (procs, a, b)
}

/// Starts `bin`'s server (rina-perf, rina-echo) under the name `perf` on
/// the daemon at `sock`.
fn serve(procs: &mut Procs, bin: &Path, sock: &Path) {
    let server = Command::new(bin)
        .arg("server")
        .arg("--socket")
        .arg(sock)
        .args(["--name", "perf"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    procs.0.push(server);
}

fn perf(bin: &Path, sock: &Path, args: &[&str]) -> Output {
    Command::new(bin)
        .arg("client")
        .arg("--socket")
        .arg(sock)
        .args(["--dst", "perf", "--json"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run rina-perf")
}

fn report(out: &Output) -> PerfReport {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

#[test]
fn request_response_and_parallel_flows_between_two_daemons() {
    let bins = bin_dir();
    let (mut procs, a, b) = two_daemons("rina-perf-cli");
    let bin = bins.join("rina-perf");
    serve(&mut procs, &bin, &b);

    // Request/response, 4 outstanding, small requests and large responses.
    // The server registers asynchronously: retry until it answers.
    let rr = [
        "--test",
        "rr",
        "--size",
        "64",
        "--response-size",
        "1000",
        "--outstanding",
        "4",
        "--count",
        "300",
    ];
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut out = perf(&bin, &a, &rr);
    while !out.status.success() && Instant::now() < deadline {
        std::thread::park_timeout(Duration::from_millis(100));
        out = perf(&bin, &a, &rr);
    }
    let r = report(&out);
    assert!(r.tests.is_empty(), "{r:?}");
    let t = &r.rr[0];
    assert_eq!(
        (t.request_size, t.response_size, t.outstanding),
        (64, 1000, 4)
    );
    assert_eq!((t.requests, t.transactions, t.lost), (300, 300, 0), "{t:?}");
    assert!(t.tps > 0.0, "{t:?}");
    let l = t.latency_us.expect("latency percentiles");
    assert_eq!(l.count, 300);
    assert!(l.min > 0.0 && l.min <= l.p50 && l.p50 <= l.p99 && l.p99 <= l.max);
    assert_eq!(r.flows.len(), 1);
    assert_eq!(r.flows[0].rr, r.rr);

    // Three parallel flows of request/response: the total is the sum.
    let mut args = rr.to_vec();
    args.extend(["-p", "3"]);
    let r = report(&perf(&bin, &a, &args));
    assert_eq!(r.flows.len(), 3);
    let mut ports: Vec<u32> = r.flows.iter().map(|f| f.port).collect();
    ports.dedup();
    assert_eq!(ports.len(), 3, "three distinct flows: {ports:?}");
    for f in &r.flows {
        assert_eq!(f.error, None);
        assert_eq!(f.rr[0].transactions, 300, "{f:?}");
    }
    assert_eq!(r.rr[0].transactions, 900);
    assert_eq!(r.rr[0].latency_us.map(|l| l.count), Some(900));
    let tps: f64 = r.flows.iter().map(|f| f.rr[0].tps).sum();
    assert!((r.rr[0].tps - tps).abs() < 1e-6);

    // Two parallel throughput flows over a sweep of two sizes, paced.
    let r = report(&perf(
        &bin,
        &a,
        &[
            "-p",
            "2",
            "--sweep",
            "200,1000",
            "--count",
            "500",
            "--rate-mbps",
            "20",
        ],
    ));
    assert_eq!(r.flows.len(), 2);
    assert_eq!(r.tests.len(), 2);
    for (i, size) in [200usize, 1000].into_iter().enumerate() {
        let total = &r.tests[i];
        assert_eq!(total.size, size);
        assert_eq!(total.sent_sdus, 1000);
        let recv: u64 = r.flows.iter().map(|f| f.tests[i].report.recv_sdus).sum();
        assert_eq!(total.report.recv_sdus, recv);
        assert!(recv > 0, "{r:?}");
        let rx: f64 = r.flows.iter().map(|f| f.tests[i].rx_mbps).sum();
        assert!((total.rx_mbps - rx).abs() < 1e-6);
    }
}

/// A test paced slower than one SDU per --duration-s: the sender slept
/// until its next SDU's turn (3 hours at 10^-6 Mb/s, 130 days at 10^-9),
/// whatever the duration; now the test ends on time with the one SDU due.
#[test]
fn a_paced_test_ends_at_its_duration_however_slow_the_pace() {
    let (mut procs, a, b) = two_daemons("rina-perf-slow-pace");
    let bin = bin_dir().join("rina-perf");
    serve(&mut procs, &bin, &b);
    wait_until("the server's registration", Duration::from_secs(20), || {
        rina::Client::connect_to(&b)
            .and_then(|mut c| c.list_names())
            .is_ok_and(|v| v.iter().any(|n| n.name.process_name == "perf"))
    });
    let mut client = Command::new(&bin)
        .arg("client")
        .arg("--socket")
        .arg(&a)
        .args(["--dst", "perf", "--json", "--rate-mbps", "1e-6"])
        .args(["--duration-s", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run rina-perf");
    let t0 = Instant::now();
    while client.try_wait().unwrap().is_none() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let done = client.try_wait().unwrap().is_some();
    if !done {
        let _ = client.kill();
    }
    let out = client.wait_with_output().unwrap();
    assert!(done, "a 1 s test still ran after 20 s");
    let r = report(&out);
    assert_eq!(r.tests[0].sent_sdus, 1, "{r:?}");
    let took = r.tests[0].send_duration_s;
    assert!((0.9..5.0).contains(&took), "{took}");
}

/// A server that takes the flow and reads it, but never answers a STOP:
/// the client reports the size as failed, not as a test in which nothing
/// arrived, and exits 1.
#[test]
fn a_report_that_never_comes_is_a_failed_row_not_an_empty_one() {
    let bins = bin_dir();
    let (_procs, a, b) = two_daemons("rina-perf-silent");
    let mut silent = rina::Client::connect_to(&b).expect("connect to beta");
    silent.register(&"perf".parse().unwrap(), None).unwrap();
    let server = std::thread::spawn(move || {
        let Ok(Some(req)) = silent.next_request_timeout(Duration::from_secs(30)) else {
            return;
        };
        let Ok(flow) = silent.accept(&req) else {
            return;
        };
        let mut buf = vec![0u8; 70_000];
        while let Ok(Some(_)) = flow.read_timeout(&mut buf, Duration::from_secs(15)) {}
    });
    let out = Command::new(bins.join("rina-perf"))
        .arg("client")
        .arg("--socket")
        .arg(&a)
        .args(["--dst", "perf", "--size", "100", "--count", "20"])
        .stdin(Stdio::null())
        .output()
        .expect("run rina-perf");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stderr.contains("no REPORT from the server"), "{stderr}");
    let row = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("100 "))
        .unwrap_or_else(|| panic!("no row for size 100:\n{stdout}"));
    assert!(row.contains("failed"), "{row}");
    server.join().unwrap();
}

/// A client pointed at an echo server (a wrong `--dst`) got its own
/// messages back: rina-perf said only "no REPORT from the server ... after
/// N STOPs" after 6 s, and rina-tgen counted its own echoed DATA as a
/// reverse flow without loss. Both now say the peer echoes.
#[test]
fn a_client_pointed_at_an_echo_server_says_so() {
    let bins = bin_dir();
    let (mut procs, a, b) = two_daemons("rina-perf-echoed");
    serve(&mut procs, &bins.join("rina-echo"), &b);
    let says = "echoes what it is sent (a rina-echo server?)";
    // The server registers asynchronously: retry until the flow is made.
    let deadline = Instant::now() + Duration::from_secs(20);
    let err = loop {
        let out = perf(&bins.join("rina-perf"), &a, &["--count", "10"]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        if !err.contains("cannot allocate") || Instant::now() > deadline {
            assert_eq!(out.status.code(), Some(1), "{err}");
            break err;
        }
        std::thread::park_timeout(Duration::from_millis(100));
    };
    assert!(
        err.contains(says) && err.contains("rina-perf server"),
        "{err}"
    );
    let out = Command::new(bins.join("rina-tgen"))
        .arg("client")
        .arg("--socket")
        .arg(&a)
        .args([
            "--dst",
            "perf",
            "--duration-s",
            "0.3",
            "--interval-s",
            "0",
            "--json",
        ])
        .args(["--report-wait-s", "0.5"])
        .stdin(Stdio::null())
        .output()
        .expect("run rina-tgen");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(
        json.contains(says) && json.contains("rina-tgen server"),
        "{json}"
    );
    assert!(
        !json.contains("\"rev\""),
        "its own echoed DATA is no reverse flow: {json}"
    );
}

/// `--direct` asked of a server that did not ask too gave an ordinary flow
/// and nothing said so: the run looked like one of direct flows.
#[test]
fn direct_asked_but_not_granted_is_said() {
    let bins = bin_dir();
    let (mut procs, a, b) = two_daemons("rina-perf-direct");
    let bin = bins.join("rina-perf");
    serve(&mut procs, &bin, &b);
    let args = ["--count", "10", "--direct"];
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut out = perf(&bin, &a, &args);
    while !out.status.success() && Instant::now() < deadline {
        std::thread::park_timeout(Duration::from_millis(100));
        out = perf(&bin, &a, &args);
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("--direct: flow") && err.contains("goes through the daemons"),
        "{err}"
    );
}

/// rina-echo pointed at a rina-perf server (a wrong `--dst`) gets no
/// echo back, and says that the server may not be an echo server rather
/// than leaving a newcomer with 100 % loss and nothing else.
#[test]
fn an_echo_client_pointed_at_a_perf_server_says_so() {
    let bins = bin_dir();
    let (mut procs, a, b) = two_daemons("rina-echo-at-perf");
    serve(&mut procs, &bins.join("rina-perf"), &b);
    // The server registers asynchronously: retry until the flow is made.
    let deadline = Instant::now() + Duration::from_secs(20);
    let err = loop {
        let out = Command::new(bins.join("rina-echo"))
            .arg("client")
            .arg("--socket")
            .arg(&a)
            .args(["--dst", "perf", "--count", "3", "--interval-ms", "10"])
            .args(["--timeout-ms", "200"])
            .stdin(Stdio::null())
            .output()
            .expect("run rina-echo");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        if !err.contains("cannot allocate") || Instant::now() > deadline {
            assert_eq!(out.status.code(), Some(1), "{err}");
            break err;
        }
        std::thread::park_timeout(Duration::from_millis(100));
    };
    assert!(
        err.contains("rina-echo server") && err.contains("--dst names the server"),
        "{err}"
    );
}

/// `--daemon-accepts`: the servers of rina-perf and rina-echo register so
/// that the daemon accepts their flows; the clients' runs are the same,
/// and the server says who accepted (no flow request reaches it).
#[test]
fn servers_whose_daemon_accepts_serve_as_before() {
    let bins = bin_dir();
    let (mut procs, a, b) = two_daemons("rina-daemon-accepts");
    for (tool, client_args) in [
        ("rina-perf", &["--count", "20", "--json"][..]),
        ("rina-echo", &["--count", "3", "--interval-ms", "10"][..]),
    ] {
        let out_path = procs.1.join(format!("{tool}-server.out"));
        let server = Command::new(bins.join(tool))
            .arg("server")
            .arg("--socket")
            .arg(&b)
            .args(["--name", "perf", "--daemon-accepts", "--max-flows", "1"])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out_path).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        procs.0.push(server);
        // The server registers asynchronously: retry until the flow is made.
        let deadline = Instant::now() + Duration::from_secs(20);
        let run = || {
            Command::new(bins.join(tool))
                .arg("client")
                .arg("--socket")
                .arg(&a)
                .args(["--dst", "perf"])
                .args(client_args)
                .stdin(Stdio::null())
                .output()
                .expect("run the client")
        };
        let mut out = run();
        while !out.status.success() && Instant::now() < deadline {
            std::thread::park_timeout(Duration::from_millis(100));
            out = run();
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{tool} client: {err}");
        // With its one flow served and closed, the server exits.
        let server = procs.0.last_mut().unwrap();
        wait_until(
            &format!("the {tool} server to exit"),
            Duration::from_secs(20),
            || matches!(server.try_wait(), Ok(Some(_))),
        );
        let said = std::fs::read_to_string(&out_path).unwrap();
        assert!(
            said.contains("(the daemon accepts its flows)"),
            "{tool}: {said}"
        );
        assert!(said.contains("accepted flow"), "{tool}: {said}");
        assert!(!said.contains("flow request from"), "{tool}: {said}");
    }
}
