//! `rina-ip` between two network namespaces whose only link is a veth pair
//! carrying a shim DIF over UDP with a normal DIF on top (one `rinad` per
//! namespace). The tunnel subnet exists only on the TUN interfaces, so
//! everything that reaches it went through RINA flows: ping (IPv4 and IPv6,
//! both ways), iperf3 TCP, curl against `python3 -m http.server`, garbage
//! from a peer (counted, not fatal), and recovery after one side's `rinad`
//! is killed and restarted. Needs root; prints "skipped: ..." otherwise.

mod common;

use common::{bin_dir, wait_until};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Tunnel addresses (only on the TUN interfaces).
const A4: &str = "10.203.0.1";
const B4: &str = "10.203.0.2";
const A6: &str = "fd23::1";
const B6: &str = "fd23::2";
/// Underlay (veth) addresses.
const UA: &str = "172.29.7.1";
const UB: &str = "172.29.7.2";
/// Each side sends DSCP 46 (EF) on a reliable flow of its own.
const DSCP: &str = "dscp = { \"46\" = \"reliable\" }\n";
/// The TUN's name in both namespaces.
const TUN: &str = "rtun0";

/// Two namespaces and the processes started in them; all removed on drop.
struct Lab {
    ns: [String; 2],
    procs: Vec<(String, Child)>,
    dir: PathBuf,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for (_, c) in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in &self.ns {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        if std::thread::panicking() {
            // Leave the logs for a look at what failed.
            for f in [
                "rina-ip-a.log",
                "rina-ip-b.log",
                "rinad-a.log",
                "rinad-b.log",
            ] {
                if let Ok(s) = std::fs::read_to_string(self.dir.join(f)) {
                    let tail: Vec<&str> = s.lines().rev().take(30).collect();
                    eprintln!("--- {f} (last lines) ---");
                    for l in tail.into_iter().rev() {
                        eprintln!("{l}");
                    }
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Lab {
    fn ns(&self, side: usize) -> &str {
        &self.ns[side]
    }

    /// A command run inside namespace `side`.
    fn cmd(&self, side: usize, prog: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", self.ns(side), prog]);
        c.stdin(Stdio::null());
        c
    }

    fn run(&self, side: usize, prog: &str, args: &[&str]) -> Output {
        self.cmd(side, prog).args(args).output().expect("run")
    }

    /// Starts a long-running process in namespace `side`, logging to `log`.
    fn spawn(&mut self, what: &str, side: usize, prog: &Path, args: &[&str], log: &str) {
        let out = std::fs::File::create(self.dir.join(log)).unwrap();
        let child = self
            .cmd(side, prog.to_str().unwrap())
            .args(args)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        self.procs.push((what.to_owned(), child));
    }

    /// Kills the process started as `what` and waits for it.
    fn kill(&mut self, what: &str) {
        let i = self.procs.iter().position(|(w, _)| w == what).unwrap();
        let (_, mut c) = self.procs.remove(i);
        c.kill().unwrap();
        c.wait().unwrap();
    }

    fn start_rinad(&mut self, side: usize) {
        let s = ["a", "b"][side];
        let sock = self.dir.join(format!("rinad-{s}.sock"));
        let _ = std::fs::remove_file(&sock);
        let conf = self.dir.join(format!("rinad-{s}.toml"));
        let bin = bin_dir().join("rinad");
        let args = [
            "--config",
            conf.to_str().unwrap(),
            "--socket",
            sock.to_str().unwrap(),
            "--log-level",
            "info",
        ];
        self.spawn(
            &format!("rinad-{s}"),
            side,
            &bin,
            &args,
            &format!("rinad-{s}.log"),
        );
        wait_until("rinad's control socket", Duration::from_secs(20), || {
            sock.exists()
        });
    }

    fn ping(&self, side: usize, dst: &str, count: u32) -> Output {
        let c = count.to_string();
        self.run(side, "ping", &["-c", &c, "-i", "0.2", "-W", "1", dst])
    }

    fn status(&self, side: usize) -> serde_json::Value {
        let s = ["a", "b"][side];
        let sock = self.dir.join(format!("status-{s}.sock"));
        let out = Command::new(bin_dir().join("rina-ip"))
            .args(["--status", "--json", "--status-socket"])
            .arg(&sock)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("status JSON")
    }

    /// Polls until TCP `port` listens in namespace `side`.
    fn wait_listening(&self, side: usize, port: u16) {
        let pat = format!(":{port} ");
        wait_until(
            &format!("port {port} listening"),
            Duration::from_secs(20),
            || String::from_utf8_lossy(&self.run(side, "ss", &["-ltnH"]).stdout).contains(&pat),
        );
    }
}

/// Why this machine cannot run the test, if it cannot.
fn missing() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces, TUN)".into());
    }
    if !Path::new("/dev/net/tun").exists() {
        return Some("no /dev/net/tun".into());
    }
    for tool in ["ip", "ping", "iperf3", "curl", "python3", "ss"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !found {
            return Some(format!("{tool} is not installed"));
        }
    }
    None
}

fn rinad_conf(
    me: &str,
    addr: u64,
    my_ip: &str,
    peer: &str,
    peer_addr: u64,
    peer_ip: &str,
    app: &str,
) -> String {
    format!(
        r#"[system]
name = "{me}"
[[ipcp]]
name = "{me}.udp"
type = "shim-udp"
dif = "udp"
bind = "{my_ip}:7101"
[ipcp.directory]
"{peer}.net" = "{peer_ip}:7101"
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
"{app}" = {peer_addr}
"#
    )
}

/// rina-ip's file for tunnel `me` (name, IPv4, IPv6) to `peer` (the same),
/// with `extra` lines appended to the peer's table.
fn ip_conf(dir: &Path, me: (&str, &str, &str), peer: (&str, &str, &str), extra: &str) -> String {
    let ((me, v4, v6), (peer, p4, p6)) = (me, peer);
    let s = &me[3..];
    format!(
        r#"name = "{me}"
dif = "net"
socket = "{dir}/rinad-{s}.sock"
status_socket = "{dir}/status-{s}.sock"
[tun]
name = "{TUN}"
addresses = ["{v4}/24", "{v6}/64"]
[timers]
backoff_initial_ms = 100
backoff_max_ms = 2000
keepalive_ms = 500
dead_after_ms = 2000
[[peer]]
name = "{peer}"
prefixes = ["{p4}/32", "{p6}/128"]
{extra}"#,
        dir = dir.display()
    )
}

/// "rtt min/avg/max/mdev = a/b/c/d ms" -> b.
fn ping_avg(out: &Output) -> f64 {
    let s = String::from_utf8_lossy(&out.stdout);
    s.lines()
        .find_map(|l| l.split_once(" = ")?.1.split('/').nth(1)?.parse().ok())
        .unwrap_or_else(|| panic!("no rtt in ping output: {s}"))
}

fn assert_ok(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn peer<'a>(status: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    status["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no peer {name} in {status}"))
}

#[test]
fn ip_traffic_crosses_the_tunnel_and_the_tunnel_recovers() {
    if let Some(why) = missing() {
        println!("skipped: {why}");
        return;
    }
    let bins = bin_dir();
    let id = std::process::id();
    let dir = std::env::temp_dir().join(format!("rina-ip-test-{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut lab = Lab {
        ns: [format!("ript-a-{id}"), format!("ript-b-{id}")],
        procs: Vec::new(),
        dir: dir.clone(),
    };
    let (va, vb) = (format!("rta{id}"), format!("rtb{id}"));
    let ip = |args: &[&str]| {
        let o = Command::new("ip").args(args).output().unwrap();
        assert_ok(&format!("ip {}", args.join(" ")), &o);
    };
    ip(&["netns", "add", lab.ns(0)]);
    ip(&["netns", "add", lab.ns(1)]);
    ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]);
    ip(&["link", "set", &va, "netns", lab.ns(0)]);
    ip(&["link", "set", &vb, "netns", lab.ns(1)]);
    for (side, v, addr) in [(0, &va, UA), (1, &vb, UB)] {
        let ns = lab.ns(side).to_owned();
        ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", v]);
        ip(&["-n", &ns, "link", "set", v, "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
    }
    // Nothing but the TUN leads to the tunnel subnet.
    let out = lab.run(0, "ip", &["route", "get", B4]);
    assert!(
        !out.status.success(),
        "{B4} is routable before the tunnel exists"
    );

    std::fs::write(
        dir.join("rinad-a.toml"),
        rinad_conf("a", 1, UA, "b", 2, UB, "ip-b"),
    )
    .unwrap();
    std::fs::write(
        dir.join("rinad-b.toml"),
        rinad_conf("b", 2, UB, "a", 1, UA, "ip-a"),
    )
    .unwrap();
    std::fs::write(
        dir.join("ip-a.toml"),
        ip_conf(&dir, ("ip-a", A4, A6), ("ip-b", B4, B6), DSCP),
    )
    .unwrap();
    // B also accepts a third peer, "ip-junk", which only sends garbage.
    let junk = "dscp = { \"46\" = \"reliable\" }\n[[peer]]\nname = \"ip-junk\"\nprefixes = [\"10.203.0.99/32\"]\ninitiate = \"never\"\n";
    std::fs::write(
        dir.join("ip-b.toml"),
        ip_conf(&dir, ("ip-b", B4, B6), ("ip-a", A4, A6), junk),
    )
    .unwrap();
    lab.start_rinad(0);
    lab.start_rinad(1);
    let rina_ip = bins.join("rina-ip");
    for (side, s) in [(0, "a"), (1, "b")] {
        let conf = dir.join(format!("ip-{s}.toml"));
        lab.spawn(
            &format!("rina-ip-{s}"),
            side,
            &rina_ip,
            &["--config", conf.to_str().unwrap()],
            &format!("rina-ip-{s}.log"),
        );
    }

    // 1. ping, IPv4 and IPv6, both ways.
    let t0 = Instant::now();
    wait_until(
        "a first ping through the tunnel",
        Duration::from_secs(30),
        || {
            lab.run(0, "ping", &["-c", "1", "-W", "1", B4])
                .status
                .success()
        },
    );
    println!("tunnel up {:.1} s after start", t0.elapsed().as_secs_f64());
    for (side, dst) in [(0, B4), (1, A4), (0, B6), (1, A6)] {
        let out = lab.ping(side, dst, 5);
        assert_ok(&format!("ping {dst}"), &out);
        println!(
            "ping {} -> {dst}: avg rtt {:.3} ms",
            ["a", "b"][side],
            ping_avg(&out)
        );
    }

    // The TUN MTU follows the flow's largest SDU.
    let st = lab.status(0);
    let ch = &peer(&st, "ip-b")["channels"][0];
    assert_eq!(ch["state"], "up", "{st}");
    let max_sdu = ch["max_sdu"].as_u64().unwrap();
    let mtu: u64 = String::from_utf8_lossy(
        &lab.run(0, "cat", &[&format!("/sys/class/net/{TUN}/mtu")])
            .stdout,
    )
    .trim()
    .parse()
    .unwrap();
    assert_eq!(mtu, max_sdu.min(65535), "{st}");
    assert_eq!(st["mtu"].as_u64(), Some(mtu));

    // DSCP 46 (TOS 184) goes on the peers' "reliable" flow, the rest on
    // the default one; both ends of both flows count it.
    for (side, name, dst) in [(0, "ip-b", B4), (1, "ip-a", A4)] {
        let sent = |lab: &Lab| -> Vec<u64> {
            let st = lab.status(side);
            let p = peer(&st, name);
            assert_eq!(p["state"], "up", "{st}");
            p["channels"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["packets_out"].as_u64().unwrap())
                .collect()
        };
        wait_until("both flows up", Duration::from_secs(20), || {
            peer(&lab.status(side), name)["state"] == "up"
        });
        let before = sent(&lab);
        let out = lab.run(
            side,
            "ping",
            &["-Q", "184", "-c", "3", "-i", "0.2", "-W", "1", dst],
        );
        assert_ok("ping with DSCP 46", &out);
        let after = sent(&lab);
        assert_eq!(after.len(), 2);
        assert!(after[1] >= before[1] + 3, "{before:?} -> {after:?}");
    }

    // 2. iperf3 TCP through the tunnel.
    lab.procs.push((
        "iperf3".into(),
        lab.cmd(1, "iperf3")
            .args(["-s", "-B", B4])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    ));
    lab.wait_listening(1, 5201);
    let out = lab.run(0, "iperf3", &["-c", B4, "-t", "3", "-J"]);
    assert_ok("iperf3", &out);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("iperf3 JSON");
    let bps = j["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap();
    println!("iperf3 TCP through rina-ip: {:.1} Mb/s goodput", bps / 1e6);
    assert!(bps > 1e6, "goodput {bps} b/s");

    // 3. curl against a web server in the other namespace, IPv4 and IPv6.
    let www = dir.join("www");
    std::fs::create_dir_all(&www).unwrap();
    let token = format!("rina-ip page {id} {:?}", Instant::now());
    std::fs::write(www.join("page.txt"), &token).unwrap();
    lab.procs.push((
        "http".into(),
        lab.cmd(1, "python3")
            .args(["-m", "http.server", "8080", "--bind", "::", "--directory"])
            .arg(&www)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    ));
    lab.wait_listening(1, 8080);
    for url in [
        format!("http://{B4}:8080/page.txt"),
        format!("http://[{B6}]:8080/page.txt"),
    ] {
        let out = lab.run(0, "curl", &["-sS", "--max-time", "10", &url]);
        assert_ok(&format!("curl {url}"), &out);
        assert_eq!(String::from_utf8_lossy(&out.stdout), token, "{url}");
    }

    // 4. Garbage from a configured peer is counted and dropped.
    let mut c = rina::Client::connect_to(dir.join("rinad-a.sock")).unwrap();
    let me: rina::AppName = "ip-junk".parse().unwrap();
    let to: rina::AppName = "ip-b".parse().unwrap();
    let f = c
        .allocate(&me, &to, Some("net"), &rina::QosSpec::default())
        .expect("a flow from ip-junk to ip-b");
    let junk_sdus: [&[u8]; 5] = [
        b"\x80 not ip",
        b"\x45short",
        &[0x60; 41],
        b"\x00\x09 unknown control",
        b"GET / HTTP/1.1\r\n\r\n",
    ];
    for j in junk_sdus {
        f.write(j).unwrap();
    }
    wait_until("garbage counted", Duration::from_secs(10), || {
        peer(&lab.status(1), "ip-junk")["counters"]["drops_invalid"] == junk_sdus.len()
    });
    drop(f);
    assert_ok("ping after garbage", &lab.ping(1, A4, 2));

    // 5. Kill and restart system A's daemon: the tunnel comes back by itself.
    let before = lab.status(1);
    let flows_before = peer(&before, "ip-a")["counters"]["flows_up"]
        .as_u64()
        .unwrap();
    lab.kill("rinad-a");
    wait_until(
        "ip-a to see the daemon gone",
        Duration::from_secs(10),
        || !lab.status(0)["registered"].as_bool().unwrap(),
    );
    assert!(!lab
        .run(0, "ping", &["-c", "1", "-W", "1", B4])
        .status
        .success());
    let t = Instant::now();
    lab.start_rinad(0);
    wait_until("the tunnel to recover", Duration::from_secs(60), || {
        lab.run(0, "ping", &["-c", "1", "-W", "1", B4])
            .status
            .success()
    });
    println!(
        "tunnel recovered {:.2} s after rinad restarted",
        t.elapsed().as_secs_f64()
    );
    assert_ok("ping b -> a after recovery", &lab.ping(1, A4, 3));
    let (sa, sb) = (lab.status(0), lab.status(1));
    let (pa, pb) = (peer(&sa, "ip-b"), peer(&sb, "ip-a"));
    assert_eq!(pa["state"], "up", "{sa}");
    assert!(
        pa["counters"]["reallocations"].as_u64().unwrap() >= 1,
        "{sa}"
    );
    assert!(
        pb["counters"]["flows_up"].as_u64().unwrap() > flows_before,
        "{sb}"
    );
    let text = Command::new(&rina_ip)
        .args(["--status", "--status-socket"])
        .arg(dir.join("status-b.sock"))
        .output()
        .unwrap();
    println!("{}", String::from_utf8_lossy(&text.stdout));
}
