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
/// A peer of A's that no one is: its flow is re-allocated with back-off
/// for ever, and its prefix (off A's subnet) gets a route on A's TUN.
const GHOST: &str =
    "[[peer]]\nname = \"ip-ghost\"\nprefixes = [\"10.203.1.0/24\"]\ninitiate = \"always\"\n";
/// An address behind the ghost peer.
const GHOST4: &str = "10.203.1.5";
/// The largest SDU of the normal DIF's flows: below the 64 KiB of an IP
/// packet, so that a packet can be too big for the flow.
const NET_MAX_SDU: u32 = 3000;

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
max_sdu = {NET_MAX_SDU}
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
    let mut lab = setup();
    // A offloads checksums and B does not: B completes the checksums A
    // leaves partial, and B's kernel then checks every one of them.
    check_ping_and_mtu(&lab);
    check_too_big(&lab);
    check_no_route(&lab);
    check_backoff(&lab);
    check_tcp(&mut lab);
    check_offload_counters(&lab, false);
    check_garbage(&lab);
    // B without offload: the packets are checked on the copying path.
    check_forged_sources(&lab);
    check_recovery(&mut lab);
    check_tun_down_up(&lab);
    check_mtu_dip(&lab);
    // B restarts with offload: partial checksums now cross as such.
    restart_rina_ip(&mut lab, 1, true);
    check_curl(&lab);
    check_offload_counters(&lab, true);
    // B with offload: they are checked where they lie in the ring.
    check_forged_sources(&lab);
    let text = Command::new(bin_dir().join("rina-ip"))
        .args(["--status", "--status-socket"])
        .arg(lab.dir.join("status-b.sock"))
        .output()
        .unwrap();
    println!("{}", String::from_utf8_lossy(&text.stdout));
    check_tun_deleted(&mut lab);
}

/// A's TUN set down and up again (which takes its IPv6 address away):
/// the tunnel carries IPv4 and IPv6 again, with no restart.
fn check_tun_down_up(lab: &Lab) {
    for state in ["down", "up"] {
        assert_ok(
            &format!("ip link set {TUN} {state}"),
            &lab.run(0, "ip", &["link", "set", TUN, state]),
        );
    }
    let back = pings_come_back(lab, &[B4, B6], "the TUN went down and up");
    println!("tunnel back {back:.2} s after its TUN went down and up");
    // The route to the ghost's prefix (which down took away) is back.
    let out = lab.run(0, "ip", &["route", "get", GHOST4]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains(TUN), "{text}");
}

/// A's TUN MTU set by hand below IPv6's minimum (the kernel takes the
/// TUN's IPv6 addresses away) and back: IPv6 pings get through again with
/// no restart, and IPv4 ones all along.
fn check_mtu_dip(lab: &Lab) {
    let mtu = tun_mtu(lab, 0).to_string();
    for m in ["1200", &mtu] {
        assert_ok(
            &format!("ip link set {TUN} mtu {m}"),
            &lab.run(0, "ip", &["link", "set", TUN, "mtu", m]),
        );
    }
    let back = pings_come_back(lab, &[B6, B4], "the MTU went to 1200 and back");
    println!("IPv6 back {back:.2} s after the MTU went below 1280 and back");
}

/// Waits (10 s at most for each) until a ping from A to each of `dsts`
/// is answered after `what`; the seconds that took.
fn pings_come_back(lab: &Lab, dsts: &[&str], what: &str) -> f64 {
    let t = Instant::now();
    for dst in dsts {
        wait_until(
            &format!("a ping to {dst} after {what}"),
            Duration::from_secs(10),
            || {
                lab.run(0, "ping", &["-c", "1", "-W", "1", dst])
                    .status
                    .success()
            },
        );
    }
    t.elapsed().as_secs_f64()
}

/// A peer that never answers: its flow stays in back-off, retried with
/// growing delays bounded by `backoff_max_ms` (2 s here), each failure
/// counted with its reason; packets for it are dropped as "no flow", and
/// their sender is told at once with an ICMP "host unreachable" (counted),
/// rather than left to time out.
fn check_backoff(lab: &Lab) {
    wait_until(
        "failed allocations to ip-ghost",
        Duration::from_secs(30),
        || {
            peer(&lab.status(0), "ip-ghost")["counters"]["alloc_failures"]
                .as_u64()
                .unwrap()
                >= 3
        },
    );
    let st = lab.status(0);
    let g = peer(&st, "ip-ghost");
    assert_eq!(g["state"], "down", "{st}");
    let ch = &g["channels"][0];
    assert!(
        ch["last_error"].as_str().is_some_and(|e| !e.is_empty()),
        "{st}"
    );
    if ch["state"] == "backoff" {
        assert!(ch["retry_in_ms"].as_u64().unwrap() <= 2000, "{st}");
    }
    let counter = |lab: &Lab, k: &str| peer(&lab.status(0), "ip-ghost")["counters"][k].as_u64();
    let before = counter(lab, "drops_no_flow").unwrap();
    let icmp_before = counter(lab, "unreachable_icmp");
    let t = Instant::now();
    let out = lab.run(0, "ping", &["-c", "1", "-W", "5", GHOST4]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("Destination Host Unreachable"), "{text}");
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    assert!(counter(lab, "drops_no_flow").unwrap() > before);
    assert!(counter(lab, "unreachable_icmp").unwrap() > icmp_before.unwrap());
    // A flood gets no more errors than the rate limit allows: a burst of
    // 50, then 1000 a second.
    let limited = |lab: &Lab| lab.status(0)["icmp_rate_limited"].as_u64().unwrap();
    let (icmp_before, limited_before) = (counter(lab, "unreachable_icmp").unwrap(), limited(lab));
    let t = Instant::now();
    let flood = format!(
        "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         for i in range(5000):\n    s.sendto(b'x', ('{GHOST4}', 9))\n"
    );
    assert_ok("a UDP flood", &lab.run(0, "python3", &["-c", &flood]));
    std::thread::sleep(Duration::from_millis(200));
    let answered = counter(lab, "unreachable_icmp").unwrap() - icmp_before;
    let allowed = 50 + (1000.0 * t.elapsed().as_secs_f64()) as u64 + 1;
    assert!(
        answered <= allowed,
        "{answered} errors in {:?}",
        t.elapsed()
    );
    assert!(
        limited(lab) > limited_before,
        "{answered} answered, none limited"
    );
    println!(
        "a flood of 5000 packets to a peer without a flow: {answered} answered in {:?}",
        t.elapsed()
    );
}

/// B's TUN deleted under it: B's rina-ip says so and exits with status 2
/// (a supervisor can restart it), rather than idling for ever.
fn check_tun_deleted(lab: &mut Lab) {
    assert_ok("ip link del", &lab.run(1, "ip", &["link", "del", TUN]));
    let i = lab
        .procs
        .iter()
        .position(|(w, _)| w == "rina-ip-b")
        .unwrap();
    let mut status = None;
    wait_until("rina-ip-b to exit", Duration::from_secs(10), || {
        status = lab.procs[i].1.try_wait().unwrap();
        status.is_some()
    });
    assert_eq!(status.unwrap().code(), Some(2));
    let log = std::fs::read_to_string(lab.dir.join("rina-ip-b.log")).unwrap();
    assert!(log.contains("the TUN interface failed"), "{log}");
    assert!(
        !lab.dir.join("status-b.sock").exists(),
        "status socket left behind"
    );
}

/// B's tunnel file: it also accepts a third peer, "ip-junk", which sends
/// garbage and packets with forged sources; with `offload` false its TUN takes whole checksums only.
fn ip_b_conf(dir: &Path, offload: bool) -> String {
    let junk = "dscp = { \"46\" = \"reliable\" }\n[[peer]]\nname = \"ip-junk\"\nprefixes = [\"10.203.0.99/32\"]\ninitiate = \"never\"\n";
    ip_conf(dir, ("ip-b", B4, B6), ("ip-a", A4, A6), junk)
        .replace("[tun]\n", &format!("[tun]\nchecksum_offload = {offload}\n"))
}

/// The namespaces, the veth, both daemons and both tunnels (B's without
/// checksum offload), up to a first ping through the tunnel.
fn setup() -> Lab {
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
        ip_conf(
            &dir,
            ("ip-a", A4, A6),
            ("ip-b", B4, B6),
            &format!("{DSCP}{GHOST}"),
        ),
    )
    .unwrap();
    lab.start_rinad(0);
    lab.start_rinad(1);
    let conf = dir.join("ip-a.toml");
    lab.spawn(
        "rina-ip-a",
        0,
        &bin_dir().join("rina-ip"),
        &["--config", conf.to_str().unwrap()],
        "rina-ip-a.log",
    );
    let t0 = Instant::now();
    restart_rina_ip(&mut lab, 1, false);
    println!("tunnel up {:.1} s after start", t0.elapsed().as_secs_f64());
    lab
}

/// (Re)starts the tunnel on side `side` (B) with checksum offload or not,
/// and waits for a ping through it.
fn restart_rina_ip(lab: &mut Lab, side: usize, offload: bool) {
    assert_eq!(side, 1, "only B's file is rewritten");
    if lab.procs.iter().any(|(w, _)| w == "rina-ip-b") {
        lab.kill("rina-ip-b");
    }
    let conf = lab.dir.join("ip-b.toml");
    std::fs::write(&conf, ip_b_conf(&lab.dir, offload)).unwrap();
    lab.spawn(
        "rina-ip-b",
        1,
        &bin_dir().join("rina-ip"),
        &["--config", conf.to_str().unwrap()],
        "rina-ip-b.log",
    );
    wait_until("a ping through the tunnel", Duration::from_secs(30), || {
        lab.run(0, "ping", &["-c", "1", "-W", "1", B4])
            .status
            .success()
    });
    wait_until("B's flows up", Duration::from_secs(20), || {
        peer(&lab.status(1), "ip-a")["state"] == "up"
    });
}

/// Ping, IPv4 and IPv6, both ways; the TUN MTU; DSCP 46 on its own flow.
fn check_ping_and_mtu(lab: &Lab) {
    for (side, dst) in [(0, B4), (1, A4), (0, B6), (1, A6)] {
        let out = lab.ping(side, dst, 5);
        assert_ok(&format!("ping {dst}"), &out);
        println!(
            "ping {} -> {dst}: avg rtt {:.3} ms",
            ["a", "b"][side],
            ping_avg(&out)
        );
    }

    // The TUN MTU follows the flow's largest SDU, less the partial-checksum
    // frame's 6 bytes where the TUN offloads (A) and not where not (B).
    for (side, name, room) in [(0, "ip-b", 6), (1, "ip-a", 0)] {
        let st = lab.status(side);
        assert_eq!(st["checksum_offload"], side == 0, "{st}");
        let ch = &peer(&st, name)["channels"][0];
        assert_eq!(ch["state"], "up", "{st}");
        let max_sdu = ch["max_sdu"].as_u64().unwrap();
        let mtu: u64 = String::from_utf8_lossy(
            &lab.run(side, "cat", &[&format!("/sys/class/net/{TUN}/mtu")])
                .stdout,
        )
        .trim()
        .parse()
        .unwrap();
        assert_eq!(mtu, (max_sdu - room).min(65535), "{st}");
        assert_eq!(st["mtu"].as_u64(), Some(mtu));
    }

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
        let before = sent(lab);
        let out = lab.run(
            side,
            "ping",
            &["-Q", "184", "-c", "3", "-i", "0.2", "-W", "1", dst],
        );
        assert_ok("ping with DSCP 46", &out);
        let after = sent(lab);
        assert_eq!(after.len(), 2);
        assert!(after[1] >= before[1] + 3, "{before:?} -> {after:?}");
    }
}

/// A's TUN MTU, as the kernel has it.
fn tun_mtu(lab: &Lab, side: usize) -> u64 {
    let out = lab.run(side, "cat", &[&format!("/sys/class/net/{TUN}/mtu")]);
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// With A's TUN MTU raised by hand past the flows' SDU, an IPv4 packet too
/// big for its flow without DF crosses in fragments; one with DF, or an
/// IPv6 one, is answered with an ICMP "too big" error carrying the
/// tunnel's MTU, and counted; the sender's path-MTU discovery then gets
/// packets of that size through.
fn check_too_big(lab: &Lab) {
    let mtu = tun_mtu(lab, 0);
    assert!(mtu < 5000, "MTU {mtu}: no packet can be too big");
    let set_mtu = |m: u64| {
        assert_ok(
            "ip link set mtu",
            &lab.run(0, "ip", &["link", "set", TUN, "mtu", &m.to_string()]),
        )
    };
    set_mtu(9000);
    let counters = |lab: &Lab| peer(&lab.status(0), "ip-b")["counters"].clone();
    // DF clear: the tunnel cuts the packet into fragments that fit the
    // flow, and B's kernel puts them together (before any "too big" has
    // taught A's kernel the path's MTU, so that A's kernel sends them whole).
    let before = counters(lab);
    assert_ok(
        "ping -M dont -s 5000 through a 3000-byte flow",
        &lab.run(
            0,
            "ping",
            &[
                "-M", "dont", "-s", "5000", "-c", "2", "-i", "0.2", "-W", "2", B4,
            ],
        ),
    );
    let after = counters(lab);
    let grew = |k: &str| after[k].as_u64().unwrap() - before[k].as_u64().unwrap();
    assert!(grew("fragmented") >= 2, "{before} -> {after}");
    assert_eq!(grew("drops_too_big"), 0, "{before} -> {after}");
    let before = counters(lab);
    for dst in [B4, B6] {
        let out = lab.run(
            0,
            "ping",
            &["-M", "do", "-s", "5000", "-c", "1", "-W", "2", dst],
        );
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        println!("ping -M do -s 5000 {dst} with the TUN MTU at 9000: {text}");
        assert!(!out.status.success(), "{text}");
        let said = [format!("mtu = {mtu}"), format!("mtu={mtu}")];
        assert!(said.iter().any(|s| text.contains(s)), "{text}");
    }
    let after = counters(lab);
    let grew = |k: &str| after[k].as_u64().unwrap() - before[k].as_u64().unwrap();
    assert!(grew("drops_too_big") >= 2, "{before} -> {after}");
    assert!(grew("too_big_icmp") >= 2, "{before} -> {after}");
    // Path-MTU discovery took the size: large pings now get through.
    assert_ok(
        "ping -s 5000 after the ICMP error",
        &lab.run(
            0,
            "ping",
            &["-M", "want", "-s", "5000", "-c", "2", "-W", "2", B4],
        ),
    );
    set_mtu(mtu);
}

/// A ping to an address of the tunnel's subnet that no peer's prefix
/// covers is answered at once with an ICMP "no route" error (IPv4 and
/// IPv6), not left to time out; both are counted.
fn check_no_route(lab: &Lab) {
    let before = lab.status(0)["no_route_icmp"].as_u64().unwrap();
    for (dst, said) in [
        ("10.203.0.77", "Destination Net Unreachable"),
        ("fd23::77", "No route"),
    ] {
        let t = Instant::now();
        let out = lab.run(0, "ping", &["-c", "1", "-W", "5", dst]);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{text}");
        assert!(text.contains(said), "{text}");
        assert!(
            t.elapsed() < Duration::from_secs(4),
            "{:?}: {text}",
            t.elapsed()
        );
    }
    let after = lab.status(0)["no_route_icmp"].as_u64().unwrap();
    assert!(after >= before + 2, "{before} -> {after}");
}

/// iperf3 TCP from A to B, then curl from A against a web server in B.
fn check_tcp(lab: &mut Lab) {
    let iperf3 = lab
        .cmd(1, "iperf3")
        .args(["-s", "-B", B4])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    lab.procs.push(("iperf3".into(), iperf3));
    lab.wait_listening(1, 5201);
    let out = lab.run(0, "iperf3", &["-c", B4, "-t", "3", "-J"]);
    assert_ok("iperf3", &out);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("iperf3 JSON");
    let bps = j["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap();
    println!("iperf3 TCP through rina-ip: {:.1} Mb/s goodput", bps / 1e6);
    assert!(bps > 1e6, "goodput {bps} b/s");

    let www = lab.dir.join("www");
    std::fs::create_dir_all(&www).unwrap();
    let http = lab
        .cmd(1, "python3")
        .args(["-m", "http.server", "8080", "--bind", "::", "--directory"])
        .arg(&www)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    lab.procs.push(("http".into(), http));
    lab.wait_listening(1, 8080);
    check_curl(lab);
}

/// A fresh page fetched from B's web server, IPv4 and IPv6.
fn check_curl(lab: &Lab) {
    let token = format!("rina-ip page {:?}", Instant::now());
    std::fs::write(lab.dir.join("www").join("page.txt"), &token).unwrap();
    for url in [
        format!("http://{B4}:8080/page.txt"),
        format!("http://[{B6}]:8080/page.txt"),
    ] {
        let out = lab.run(0, "curl", &["-sS", "--max-time", "10", &url]);
        assert_ok(&format!("curl {url}"), &out);
        assert_eq!(String::from_utf8_lossy(&out.stdout), token, "{url}");
    }
}

/// A's TCP traffic left its checksums partial and B received it so; with
/// `b_offloads`, B's replies did too.
fn check_offload_counters(lab: &Lab, b_offloads: bool) {
    let (sa, sb) = (lab.status(0), lab.status(1));
    let n = |s: &serde_json::Value, k: &str| s[k].as_u64().unwrap();
    assert!(n(&sa, "partial_out") > 0, "{sa}");
    assert!(n(&sb, "partial_in") > 0, "{sb}");
    assert_eq!(sb["checksum_offload"], b_offloads, "{sb}");
    if b_offloads {
        assert!(n(&sb, "partial_out") > 0, "{sb}");
        assert!(n(&sa, "partial_in") > 0, "{sa}");
    } else {
        assert_eq!(n(&sb, "partial_out"), 0, "{sb}");
    }
}

/// A flow from `ip-junk` (a configured peer of B that no tunnel runs) to
/// B's tunnel, through A's daemon, with the client that holds it.
fn junk_flow(lab: &Lab) -> (rina::Client, rina::Flow) {
    let mut c = rina::Client::connect_to(lab.dir.join("rinad-a.sock")).unwrap();
    let me: rina::AppName = "ip-junk".parse().unwrap();
    let to: rina::AppName = "ip-b".parse().unwrap();
    let f = c
        .allocate(&me, &to, Some("net"), &rina::QosSpec::default())
        .expect("a flow from ip-junk to ip-b");
    (c, f)
}

/// Garbage from a configured peer is counted and dropped; a flow from a
/// name that is no peer is refused.
fn check_garbage(lab: &Lab) {
    let (mut c, f) = junk_flow(lab);
    // A partial-checksum frame whose field lies inside the IP header.
    let mut bad_partial = vec![0u8, 2, 0, 4, 0, 0];
    bad_partial.extend_from_slice(&[0x45, 0, 0, 20]);
    bad_partial.extend_from_slice(&[0; 16]);
    let junk_sdus: [&[u8]; 6] = [
        b"\x80 not ip",
        b"\x45short",
        &[0x60; 41],
        b"\x00\x09 unknown control",
        b"GET / HTTP/1.1\r\n\r\n",
        &bad_partial,
    ];
    for j in junk_sdus {
        f.write(j).unwrap();
    }
    wait_until("garbage counted", Duration::from_secs(10), || {
        peer(&lab.status(1), "ip-junk")["counters"]["drops_invalid"] == junk_sdus.len()
    });
    drop(f);
    assert_ok("ping after garbage", &lab.ping(1, A4, 2));

    // A flow from a name that is no peer is refused, with the reason.
    let refused_before = lab.status(1)["refused"].as_u64().unwrap();
    let stranger: rina::AppName = "ip-stranger".parse().unwrap();
    let to: rina::AppName = "ip-b".parse().unwrap();
    let e = c
        .allocate(&stranger, &to, Some("net"), &rina::QosSpec::default())
        .expect_err("a flow from a stranger");
    assert_eq!(e.kind(), rina::ErrorKind::Refused, "{e}");
    assert!(e.to_string().contains("not a configured peer"), "{e}");
    assert_eq!(
        lab.status(1)["refused"].as_u64().unwrap(),
        refused_before + 1
    );
}

/// The one's-complement sum of `b` as big-endian 16-bit words, not folded.
fn sum16(b: &[u8]) -> u32 {
    b.chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
        .sum()
}

fn fold(mut s: u32) -> u16 {
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// An SDU carrying a UDP datagram from `src` to `dst` port `port` with
/// `payload`, its IPv4 header checksum and UDP checksum right; with
/// `partial`, in a partial-checksum frame (the UDP checksum field holding
/// the pseudo-header's sum, as the kernel hands it to an offloading TUN).
fn udp_sdu(src: &str, dst: &str, port: u16, payload: &[u8], partial: bool) -> Vec<u8> {
    let (src, dst): (std::net::IpAddr, std::net::IpAddr) =
        (src.parse().unwrap(), dst.parse().unwrap());
    let ulen = (8 + payload.len()) as u16;
    let mut udp = Vec::new();
    udp.extend_from_slice(&40000u16.to_be_bytes());
    udp.extend_from_slice(&port.to_be_bytes());
    udp.extend_from_slice(&ulen.to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(payload);
    let (mut ip, addrs) = match (src, dst) {
        (std::net::IpAddr::V4(s), std::net::IpAddr::V4(d)) => {
            let mut h = vec![0x45, 0];
            h.extend_from_slice(&(20 + ulen).to_be_bytes());
            h.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
            h.extend_from_slice(&s.octets());
            h.extend_from_slice(&d.octets());
            let c = !fold(sum16(&h));
            h[10..12].copy_from_slice(&c.to_be_bytes());
            (h, [&s.octets()[..], &d.octets()[..]].concat())
        }
        (std::net::IpAddr::V6(s), std::net::IpAddr::V6(d)) => {
            let mut h = vec![0x60, 0, 0, 0];
            h.extend_from_slice(&ulen.to_be_bytes());
            h.extend_from_slice(&[17, 64]);
            h.extend_from_slice(&s.octets());
            h.extend_from_slice(&d.octets());
            (h, [&s.octets()[..], &d.octets()[..]].concat())
        }
        _ => panic!("mixed families"),
    };
    let pseudo = sum16(&addrs) + 17 + u32::from(ulen);
    let field = if partial {
        fold(pseudo)
    } else {
        match !fold(pseudo + sum16(&udp)) {
            0 => 0xffff,
            c => c,
        }
    };
    udp[6..8].copy_from_slice(&field.to_be_bytes());
    let at = ip.len() as u16;
    ip.extend_from_slice(&udp);
    if partial {
        let [s0, s1] = at.to_be_bytes();
        let mut f = vec![0, 2, s0, s1, 0, 6];
        f.extend_from_slice(&ip);
        f
    } else {
        ip
    }
}

/// B's peer `ip-junk` (prefix 10.203.0.99/32) sends UDP datagrams on its
/// flow to a socket listening on B: those from 10.203.0.99 reach it, and
/// those from any other source (B's own address, its peer A's, one no
/// peer has; IPv4 and IPv6; whole and in partial-checksum frames) are
/// dropped before the TUN and counted in `drops_source`.
fn check_forged_sources(lab: &Lab) {
    const PORT: u16 = 9977;
    const JUNK4: &str = "10.203.0.99";
    let listener = lab
        .cmd(1, "python3")
        .args([
            "-c",
            "import socket\n\
             s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n\
             s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)\n\
             s.bind(('::', 9977))\n\
             s.settimeout(30)\n\
             while True:\n\
             \x20   try:\n\
             \x20       d, a = s.recvfrom(2000)\n\
             \x20   except socket.timeout:\n\
             \x20       break\n\
             \x20   print(d.decode(), a[0], flush=True)\n\
             \x20   if d == b'end':\n\
             \x20       break\n",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    wait_until("the UDP listener", Duration::from_secs(10), || {
        String::from_utf8_lossy(&lab.run(1, "ss", &["-lunH"]).stdout).contains(&format!(":{PORT} "))
    });
    let counters = |side: usize, name: &str| peer(&lab.status(side), name)["counters"].clone();
    let n =
        |c: &serde_json::Value, k: &str| c[k].as_u64().unwrap_or_else(|| panic!("no {k} in {c}"));
    let before = counters(1, "ip-junk");
    // The forged ones first, so that all have come (one flow keeps the
    // order) when "end", a good one, tells the listener to stop.
    let mut good = Vec::new();
    let mut forged = Vec::new();
    for partial in [false, true] {
        good.push((format!("good-{partial}"), JUNK4, B4, partial));
        for (src, dst) in [
            (B4, B4),
            (A4, B4),
            ("10.203.0.50", B4),
            (B6, B6),
            (A6, B6),
            ("fd23::99", B6),
        ] {
            forged.push((format!("forged-{src}-{partial}"), src, dst, partial));
        }
    }
    good.push(("end".to_owned(), JUNK4, B4, false));
    let (_c, f) = junk_flow(lab);
    for (token, src, dst, partial) in forged.iter().chain(&good) {
        f.write(&udp_sdu(src, dst, PORT, token.as_bytes(), *partial))
            .unwrap();
    }
    wait_until("forged sources counted", Duration::from_secs(10), || {
        let c = counters(1, "ip-junk");
        n(&c, "drops_source") >= n(&before, "drops_source") + forged.len() as u64
            && n(&c, "packets_in") >= n(&before, "packets_in") + good.len() as u64
    });
    drop(f);
    let out = listener.wait_with_output().unwrap();
    let after = counters(1, "ip-junk");
    assert_eq!(
        n(&after, "drops_source") - n(&before, "drops_source"),
        forged.len() as u64,
        "{after}"
    );
    assert_eq!(
        n(&after, "packets_in") - n(&before, "packets_in"),
        good.len() as u64,
        "{after}"
    );
    assert_eq!(
        n(&after, "drops_invalid"),
        n(&before, "drops_invalid"),
        "{after}"
    );
    let mut got: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    got.sort();
    let mut want: Vec<String> = good
        .iter()
        .map(|(t, src, _, _)| format!("{t} ::ffff:{src}"))
        .collect();
    want.sort();
    assert_eq!(got, want, "what B's UDP socket received");
    // The tunnel's own traffic passes the filter.
    assert_eq!(n(&counters(1, "ip-a"), "drops_source"), 0);
    assert_eq!(n(&counters(0, "ip-b"), "drops_source"), 0);
}

/// Kill and restart system A's daemon: the tunnel comes back by itself.
fn check_recovery(lab: &mut Lab) {
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
}
