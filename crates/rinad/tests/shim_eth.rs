//! The shim DIF over Ethernet 802.1Q on real interfaces: network namespaces
//! joined by veth pairs (made here, removed on drop), `rinad` running in
//! each namespace. Needs root; prints "skipped: ..." and passes otherwise.
//!
//! * two systems with shim DIFs on VLAN 10 and VLAN 20 over one veth pair,
//!   an application in each, isolated from each other; tshark (a decoder we
//!   did not write) sees 802.1Q + 0xD1F0 data and ARP with ptype 0xD1F0;
//!   frames of other VLANs and EtherTypes, truncated and garbage, injected
//!   with a raw socket, are counted and do no harm;
//! * a normal DIF over shim-eth across three namespaces in a line carrying
//!   `rina-echo` end to end.

mod common;

use common::{name, temp_dir, wait_for, Daemon};
use rina::{Client, ErrorKind, QosSpec};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// Why these tests cannot run here, if they cannot.
fn unavailable() -> Option<String> {
    // SAFETY: no arguments, no side effects.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces, veth, raw sockets)".into());
    }
    let ok = Command::new("ip")
        .args(["netns", "list"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    (!ok).then(|| "the `ip` command (iproute2) with netns support is missing".into())
}

fn sh(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace, deleted on drop (with the veth ends inside it).
struct Netns {
    name: String,
}

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!(
            "rinaeth-{}-{}-{tag}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        sh(&["ip", "netns", "add", &name]);
        let ns = Netns { name };
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        // No IPv6 chatter (router solicitations, MLD) on the test links.
        ns.exec(&["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"]);
        ns.exec(&["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"]);
        ns
    }

    fn exec(&self, args: &[&str]) {
        let mut v = vec!["ip", "netns", "exec", &self.name];
        v.extend_from_slice(args);
        sh(&v);
    }

    fn command(&self, prog: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(prog);
        c
    }

    fn mac(&self, ifname: &str) -> [u8; 6] {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.name, "cat"])
            .arg(format!("/sys/class/net/{ifname}/address"))
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&out.stdout);
        let mut m = [0u8; 6];
        for (b, p) in m.iter_mut().zip(s.trim().split(':')) {
            *b = u8::from_str_radix(p, 16).unwrap();
        }
        m
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}

/// A veth pair with one end in each namespace, both up; returns the names.
fn veth(a: &Netns, b: &Netns) -> (String, String) {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let tag = format!("{}{n}", std::process::id() % 100_000);
    let (ea, eb) = (format!("ve{tag}a"), format!("ve{tag}b"));
    sh(&[
        "ip", "link", "add", &ea, "type", "veth", "peer", "name", &eb,
    ]);
    sh(&["ip", "link", "set", &ea, "netns", &a.name]);
    sh(&["ip", "link", "set", &eb, "netns", &b.name]);
    a.exec(&["ip", "link", "set", &ea, "up"]);
    b.exec(&["ip", "link", "set", &eb, "up"]);
    (ea, eb)
}

/// Starts `rinad` inside `ns` with configuration `cfg`.
fn daemon_in(ns: &Netns, tag: &str, cfg: &str) -> Daemon {
    let dir = temp_dir(tag);
    let conf = dir.join("rinad.toml");
    std::fs::write(&conf, cfg).unwrap();
    let socket = dir.join("rinad.sock");
    let log = std::fs::File::create(dir.join("rinad.log")).unwrap();
    // `ip netns exec` execs rinad itself: the child is the daemon.
    let child = ns
        .command(Path::new(env!("CARGO_BIN_EXE_rinad")))
        .arg("--config")
        .arg(&conf)
        .arg("--socket")
        .arg(&socket)
        .arg("--log-level")
        .arg("debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn rinad");
    let mut d = Daemon {
        child,
        socket,
        dir,
        name: tag.into(),
    };
    wait_for("rinad to answer", Duration::from_secs(10), || {
        assert!(
            d.child.try_wait().unwrap().is_none(),
            "rinad exited:\n{}",
            d.log()
        );
        Client::connect_to(&d.socket).is_ok()
    });
    d
}

fn shim_eth(name: &str, dif: &str, ifname: &str) -> String {
    format!("\n[[ipcp]]\nname = \"{name}\"\ntype = \"shim-eth\"\ndif = \"{dif}\"\ninterface = \"{ifname}\"\n")
}

fn counter(d: &Daemon, ipcp: &str, key: &str) -> u64 {
    d.client()
        .list_ipcps()
        .unwrap()
        .into_iter()
        .find(|i| i.name == ipcp)
        .and_then(|i| i.counters.get(key).copied())
        .unwrap_or_else(|| panic!("no counter {key} on {ipcp}"))
}

/// A capture of one interface (tcpdump, packet-buffered, so nothing is
/// lost when it stops), decoded afterwards with tshark. Stopped on drop.
struct Capture {
    child: Child,
    file: PathBuf,
    err: PathBuf,
    dir: PathBuf,
}

impl Capture {
    /// `None` when tcpdump or tshark is missing.
    fn start(ns: &Netns, ifname: &str) -> Option<Capture> {
        let have = |p: &str| {
            Command::new(p)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok()
        };
        if !have("tcpdump") || !have("tshark") {
            return None;
        }
        let dir = temp_dir("eth-cap");
        let file = dir.join("cap.pcap");
        let err = dir.join("tcpdump.err");
        let child = ns
            .command(Path::new("tcpdump"))
            .args(["-U", "--immediate-mode", "-n", "-i", ifname, "-w"])
            .arg(&file)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .expect("spawn tcpdump");
        let mut c = Capture {
            child,
            file,
            err,
            dir,
        };
        wait_for("tcpdump to listen", T, || {
            assert!(c.child.try_wait().unwrap().is_none(), "tcpdump exited");
            std::fs::read_to_string(&c.err).is_ok_and(|s| s.contains("listening on"))
        });
        Some(c)
    }

    /// Decodes what was captured so far: one line per frame, fields
    /// separated by `|`.
    fn decode(&self, fields: &[&str]) -> Vec<String> {
        let mut cmd = Command::new("tshark");
        cmd.arg("-r")
            .arg(&self.file)
            .args(["-T", "fields", "-E", "separator=|"]);
        for f in fields {
            cmd.args(["-e", f]);
        }
        let out = cmd.output().expect("run tshark -r");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A predicate over the decoded fields of one frame.
type FieldCheck = dyn Fn(&[&str]) -> bool;

/// Sends raw frames on `ifname` from inside `ns` (a thread that enters the
/// namespace, so the test process stays where it is).
fn inject(ns: &Netns, ifname: &str, frames: Vec<Vec<u8>>) {
    let path = format!("/var/run/netns/{}", ns.name);
    let ifname = std::ffi::CString::new(ifname).unwrap();
    std::thread::spawn(move || {
        let f = std::fs::File::open(&path).unwrap();
        // SAFETY: plain system calls on descriptors we own; setns only
        // affects this thread.
        unsafe {
            assert_eq!(libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET), 0);
            let raw = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
            assert!(raw >= 0, "raw socket: {}", std::io::Error::last_os_error());
            let sock = OwnedFd::from_raw_fd(raw);
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_ifindex = libc::if_nametoindex(ifname.as_ptr()) as i32;
            sll.sll_halen = 6;
            for fr in frames {
                let r = libc::sendto(
                    sock.as_raw_fd(),
                    fr.as_ptr().cast(),
                    fr.len(),
                    0,
                    (&sll as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                );
                assert_eq!(r, fr.len() as isize, "{}", std::io::Error::last_os_error());
            }
        }
    })
    .join()
    .unwrap();
}

/// An echo server thread registered as `app` in `dif` at `d`: echoes every
/// SDU of every flow it accepts.
fn echo_server(d: &Daemon, app: &str, dif: &str) -> std::thread::JoinHandle<()> {
    let mut c = d.client();
    c.register(&name(app), Some(dif)).unwrap();
    std::thread::spawn(move || {
        while let Ok(req) = c.next_request() {
            let Ok(flow) = c.accept(&req) else { return };
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 2000];
                while let Ok(n) = flow.read(&mut buf) {
                    if flow.write(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    })
}

fn ping(flow: &rina::Flow, sdu: &[u8]) {
    flow.write(sdu).unwrap();
    let mut buf = vec![0u8; 2000];
    // Unreliable: retry a lost probe a few times.
    for _ in 0..5 {
        if let Some(n) = flow.read_timeout(&mut buf, Duration::from_secs(2)).unwrap() {
            assert_eq!(&buf[..n], sdu);
            return;
        }
        flow.write(sdu).unwrap();
    }
    panic!("no echo");
}

#[test]
fn two_vlans_on_one_veth_are_isolated_decoded_by_tshark_and_robust() {
    if let Some(why) = unavailable() {
        println!("skipped: {why}");
        return;
    }
    let (na, nb) = (Netns::new("a"), Netns::new("b"));
    let (ea, eb) = veth(&na, &nb);
    let b = daemon_in(&nb, "eth-b", &two_vlans_config("b", &eb));
    let a = daemon_in(&na, "eth-a", &two_vlans_config("a", &ea));
    let cap = Capture::start(&nb, &eb);

    let _s10 = echo_server(&b, "ten", "10");
    let _s20 = echo_server(&b, "twenty", "20");
    let mut ca = a.client();
    let (f10, f20) = check_vlans_are_isolated(&mut ca, &b);

    // The RIB shows the ARP cache and the per-flow counters.
    let mac_b = check_rib(&a, &nb, &eb);

    // A decoder we did not write agrees with ours.
    check_tshark_decoding(cap);

    // Foreign, truncated and garbage frames are counted and harmless. (An
    // empty tagged frame cannot be tried: the kernel drops it on receive.)
    check_bad_frames_are_harmless(&na, &ea, mac_b, &b, &f10, &f20);
    let mut b = b;
    assert!(b.child.try_wait().unwrap().is_none(), "rinad b died");
    b.kill();
}

/// The configuration of system `sys`: shim-eth IPCPs on VLANs 10 and 20 of
/// `ifname`.
fn two_vlans_config(sys: &str, ifname: &str) -> String {
    format!("[system]\nname = \"{sys}\"\n")
        + &shim_eth(&format!("{sys}.10"), "10", ifname)
        + &shim_eth(&format!("{sys}.20"), "20", ifname)
}

/// Allocates flows on VLANs 10 and 20 through `ca`, checks the echoes, the
/// isolation of the names, the MTU and b's counters; the two flows.
fn check_vlans_are_isolated(ca: &mut Client, b: &Daemon) -> (rina::Flow, rina::Flow) {
    let f10 = ca
        .allocate(&name("c10"), &name("ten"), Some("10"), &QosSpec::default())
        .unwrap();
    assert_eq!(f10.max_sdu(), 1496, "MTU 1500 less the 802.1Q tag");
    ping(&f10, b"over vlan 10");
    ping(&f10, &[0x5a; 1496]);
    // The VLAN-10 name does not exist in VLAN 20, and the reverse.
    let e = ca
        .allocate(&name("c"), &name("ten"), Some("20"), &QosSpec::default())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NameNotFound, "{e}");
    assert!(e.to_string().contains("does not resolve"), "{e}");
    let e = ca
        .allocate(&name("c"), &name("twenty"), Some("10"), &QosSpec::default())
        .unwrap_err();
    assert!(e.to_string().contains("does not resolve"), "{e}");
    let f20 = ca
        .allocate(
            &name("c20"),
            &name("twenty"),
            Some("20"),
            &QosSpec::default(),
        )
        .unwrap();
    ping(&f20, b"over vlan 20");
    // Too large for the MTU: refused with a clear error, flow unharmed.
    let e = f10.write(&[0; 1497]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::SduTooLarge, "{e}");
    ping(&f10, b"still fine");
    // A sibling's VLAN is filtered in the kernel: not even read.
    assert_eq!(counter(b, "b.20", "rx_other_vlan"), 0);
    assert_eq!(counter(b, "b.10", "rx_other_vlan"), 0);
    let flows_b10 = b.client().list_flows().unwrap();
    assert_eq!(flows_b10.len(), 2);
    assert!(flows_b10
        .iter()
        .any(|f| f.info.dif == "10" && f.counters.sdus_in >= 3));
    assert!(flows_b10
        .iter()
        .any(|f| f.info.dif == "20" && f.counters.sdus_in >= 1));
    (f10, f20)
}

/// Checks a.10's RIB: the ARP entry for ten holds b's MAC (on `eb` in
/// `nb`), and the flow counters; b's MAC.
fn check_rib(a: &Daemon, nb: &Netns, eb: &str) -> [u8; 6] {
    let rib = a.client().read_rib("a.10", None, None).unwrap();
    let arp = rib
        .iter()
        .find(|o| o.name == "/shim/arp/key=ten")
        .expect("ARP entry for ten");
    let mac_b = nb.mac(eb);
    let mac_b_text = mac_b.map(|x| format!("{x:02x}")).join(":");
    assert!(arp.value.contains(&mac_b_text), "{arp:?}");
    let sdus_out = rib
        .iter()
        .find(|o| o.name.starts_with("/shim/flows/pid=") && o.name.ends_with("/sdus_out"))
        .expect("flow counters");
    assert!(sdus_out.value.parse::<u64>().unwrap() >= 3, "{sdus_out:?}");
    mac_b
}

/// Waits until tshark finds the expected data and ARP frames of both VLANs
/// in the capture (stopped at the end), if there is one.
fn check_tshark_decoding(cap: Option<Capture>) {
    if let Some(cap) = cap {
        let fields = [
            "vlan.id",
            "vlan.etype",
            "arp.proto.type",
            "arp.opcode",
            "arp.src.proto",
            "frame.len",
        ];
        let checks: [(&str, &FieldCheck); 4] = [
            // 14 + 4 + 1496: a full-size SDU.
            ("a full-size VLAN 10 data frame", &|f| {
                f[0] == "10" && f[1] == "0xd1f0" && f[5] == "1514"
            }),
            ("a VLAN 20 data frame", &|f| {
                f[0] == "20" && f[1] == "0xd1f0"
            }),
            ("a VLAN 10 ARP request with ptype 0xd1f0", &|f| {
                f[0] == "10" && f[1] == "0x0806" && f[2] == "0xd1f0" && f[3] == "1"
            }),
            ("a VLAN 10 ARP reply with ptype 0xd1f0 from ten", &|f| {
                f[0] == "10" && f[2] == "0xd1f0" && f[3] == "2" && f[4] == "74656e"
            }),
        ];
        let missing = || {
            let lines = cap.decode(&fields);
            let split: Vec<Vec<&str>> = lines.iter().map(|l| l.split('|').collect()).collect();
            checks
                .iter()
                .filter(|(_, p)| !split.iter().any(|f| f.len() == fields.len() && p(f)))
                .map(|(what, _)| what.to_string())
                .collect::<Vec<_>>()
        };
        let end = std::time::Instant::now() + T;
        while !missing().is_empty() && std::time::Instant::now() < end {
            std::thread::park_timeout(Duration::from_millis(100));
        }
        let m = missing();
        assert!(
            m.is_empty(),
            "tshark did not see {m:?} in {:?}",
            cap.decode(&fields)
        );
    } else {
        println!("tshark not available: wire decoding not checked");
    }
}

/// Injects frames of another VLAN (one with an inner tag of b's VLAN 10)
/// and EtherType, truncated and garbage ones from `ea` in `na` to b (MAC
/// `mac_b`), checks b counts them and the flows still work.
fn check_bad_frames_are_harmless(
    na: &Netns,
    ea: &str,
    mac_b: [u8; 6],
    b: &Daemon,
    f10: &rina::Flow,
    f20: &rina::Flow,
) {
    let mac_a = na.mac(ea);
    let frame = |vlan: Option<u16>, et: u16, payload: &[u8]| {
        let mut f = mac_b.to_vec();
        f.extend_from_slice(&mac_a);
        if let Some(v) = vlan {
            f.extend_from_slice(&[0x81, 0x00]);
            f.extend_from_slice(&v.to_be_bytes());
        }
        f.extend_from_slice(&et.to_be_bytes());
        f.extend_from_slice(payload);
        f
    };
    let before = |k: &str| counter(b, "b.10", k);
    let (v0, e0, t0, g0) = (
        before("rx_other_vlan"),
        before("rx_other_ethertype"),
        before("rx_truncated"),
        before("rx_garbage"),
    );
    let mut arp_ipv4 = vec![0, 1, 0x08, 0x00, 6, 4, 0, 1];
    arp_ipv4.extend_from_slice(&[0; 20]);
    // Sent in VLAN 30 with an inner tag 10: the kernel strips the outer
    // tag (reported out of band), the inner one stays in the frame.
    let mut double = frame(Some(30), 0x8100, &[0x00, 0x0a, 0xd1, 0xf0]);
    double.extend_from_slice(b"vlan 30 inside 10");
    inject(
        na,
        ea,
        vec![
            frame(Some(30), 0xd1f0, b"vlan 30"),
            double,
            frame(Some(10), 0x88b5, b"other ethertype"),
            frame(Some(10), 0x0806, &[0, 1, 0xd1, 0xf0, 6]),
            frame(Some(10), 0x0806, &arp_ipv4),
            frame(
                Some(10),
                0x0806,
                &[0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 0, 0, 0],
            ),
        ],
    );
    wait_for("the injected frames to be counted", T, || {
        before("rx_garbage") == g0 + 2
    });
    // VLAN 30 is nobody's here, inner tag or not: both IPCPs counted both.
    assert_eq!(before("rx_other_vlan"), v0 + 2);
    assert_eq!(counter(b, "b.20", "rx_other_vlan"), 2);
    assert_eq!(before("rx_other_ethertype"), e0 + 1);
    assert_eq!(before("rx_truncated"), t0 + 1);
    ping(f10, b"after the garbage");
    ping(f20, b"after the garbage");
}

#[test]
fn rina_echo_over_a_normal_dif_over_shim_eth_across_three_namespaces() {
    if let Some(why) = unavailable() {
        println!("skipped: {why}");
        return;
    }
    let (na, nb, nc) = (Netns::new("a"), Netns::new("b"), Netns::new("c"));
    let (ab_a, ab_b) = veth(&na, &nb);
    let (bc_b, bc_c) = veth(&nb, &nc);
    // One normal DIF "net" (addresses 1, 2, 3) over VLAN 10 (A-B) and
    // VLAN 11 (B-C); B relays.
    let normal = |me: &str, addr: u64, peers: &[(&str, u64, &str)], routes: &[(u64, u64)]| {
        let mut s = format!(
            "\n[[ipcp]]\nname = \"{me}.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = {addr}\nmax_pdu = 1400\n"
        );
        for (p, pa, over) in peers {
            s += &format!(
                "\n[[ipcp.neighbor]]\nname = \"{p}.net\"\nover = \"{over}\"\naddress = {pa}\n"
            );
        }
        s += "\n[ipcp.routes]\n";
        for (d, h) in routes {
            s += &format!("\"{d}\" = {h}\n");
        }
        s += "\n[ipcp.names]\n\"echo\" = 3\n";
        s
    };
    let sys = |me: &str| format!("[system]\nname = \"{me}\"\n");
    let c_cfg =
        sys("c") + &shim_eth("c.11", "11", &bc_c) + &normal("c", 3, &[("b", 2, "11")], &[(1, 2)]);
    let b_cfg = sys("b")
        + &shim_eth("b.10", "10", &ab_b)
        + &shim_eth("b.11", "11", &bc_b)
        + &normal("b", 2, &[("a", 1, "10"), ("c", 3, "11")], &[]);
    let a_cfg =
        sys("a") + &shim_eth("a.10", "10", &ab_a) + &normal("a", 1, &[("b", 2, "10")], &[(3, 2)]);
    let c = daemon_in(&nc, "eth-c", &c_cfg);
    let b = daemon_in(&nb, "eth-b", &b_cfg);
    let a = daemon_in(&na, "eth-a", &a_cfg);
    wait_for("both N-1 flows of B over shim-eth", T, || {
        counter(&b, "b.net", "neighbors_up") == 2
    });

    let bin = tool_dir();
    let mut server = nc
        .command(&bin.join("rina-echo"))
        .args(["server", "--dif", "net", "--name", "echo", "--socket"])
        .arg(&c.socket)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn rina-echo server");
    wait_for("the echo server to register", T, || {
        c.client()
            .list_names()
            .unwrap()
            .iter()
            .any(|n| n.name == name("echo"))
    });
    let out = na
        .command(&bin.join("rina-echo"))
        .args([
            "client",
            "--dif",
            "net",
            "--dst",
            "echo",
            "--count",
            "20",
            "--interval-ms",
            "20",
            "--size",
            "1000",
            "--json",
            "--socket",
        ])
        .arg(&a.socket)
        .output()
        .expect("run rina-echo client");
    let _ = server.kill();
    let _ = server.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "rina-echo client failed: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["sent"], 20);
    assert!(report["received"].as_u64().unwrap() >= 18, "{report}");
    // The SDUs crossed B: both of its shim-eth IPCPs carried them.
    for ipcp in ["b.10", "b.11"] {
        let flows = b
            .client()
            .read_rib(ipcp, Some("/shim/flows"), None)
            .unwrap();
        let sdus_in: u64 = flows
            .iter()
            .filter(|o| o.name.ends_with("/sdus_in"))
            .map(|o| o.value.parse::<u64>().unwrap())
            .sum();
        assert!(sdus_in >= 18, "{ipcp}: {flows:?}");
    }
}

/// Where `rina-echo` is: next to `rinad`, built first if this test runs
/// alone (`cargo test -p rinad` does not build other packages' binaries).
fn tool_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_rinad"))
        .parent()
        .expect("bin dir")
        .to_path_buf();
    if !dir.join("rina-echo").exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "rina-tools", "--bin", "rina-echo"]);
        if dir.ends_with("release") {
            cmd.arg("--release");
        }
        assert!(
            cmd.status().expect("run cargo").success(),
            "building rina-echo"
        );
    }
    dir
}

/// A link that goes down is seen at once, not after the neighbour's dead
/// interval (3.5 s) nor at the next periodic look at the links (every
/// second): both ends hear the kernel announce it. The N-1 flow over it is torn down
/// (the neighbour is down, routing goes around it) and set up again when
/// the link comes back.
#[test]
fn a_link_set_down_takes_its_neighbour_down_at_once_and_back_when_up() {
    if let Some(why) = unavailable() {
        println!("skipped: {why}");
        return;
    }
    let (na, nb) = (Netns::new("a"), Netns::new("b"));
    let (ea, eb) = veth(&na, &nb);
    let cfg = |me: &str, addr: u64, peer: &str, peer_addr: u64, ifname: &str| {
        format!("[system]\nname = \"{me}\"\n")
            + &shim_eth(&format!("{me}.10"), "10", ifname)
            + &format!(
                "\n[[ipcp]]\nname = \"{me}.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = {addr}\nmax_pdu = 1400\n\
                 \n[[ipcp.neighbor]]\nname = \"{peer}.net\"\nover = \"10\"\naddress = {peer_addr}\n"
            )
    };
    let b = daemon_in(&nb, "link-b", &cfg("b", 2, "a", 1, &eb));
    let a = daemon_in(&na, "link-a", &cfg("a", 1, "b", 2, &ea));
    let up = |d: &Daemon, ipcp: &str| counter(d, ipcp, "neighbors_up");
    wait_for("the neighbours to come up", T, || {
        up(&a, "a.net") == 1 && up(&b, "b.net") == 1
    });

    // Three times, so that a periodic look at the links (once a second)
    // could not pass by luck: the kernel's announcement is what is tested.
    for round in 0..3 {
        let t0 = std::time::Instant::now();
        na.exec(&["ip", "link", "set", &ea, "down"]);
        // The dead interval would take at least 2.5 s (3.5 s after the last
        // hello, sent every second).
        wait_for(
            "a's neighbour to go down with its link",
            Duration::from_millis(500),
            || up(&a, "a.net") == 0,
        );
        let left = Duration::from_millis(500)
            .saturating_sub(t0.elapsed())
            .max(Duration::from_millis(1));
        wait_for("b's neighbour to go down with its carrier", left, || {
            up(&b, "b.net") == 0
        });
        eprintln!(
            "round {round}: both neighbours down {:?} after the link",
            t0.elapsed()
        );

        na.exec(&["ip", "link", "set", &ea, "up"]);
        wait_for("the neighbours to come back with the link", T, || {
            up(&a, "a.net") == 1 && up(&b, "b.net") == 1
        });
    }
}

/// The interface's MTU raised after the IPCP started (its receive buffers
/// are cut for the MTU it started with): a frame larger than those is cut
/// short by the kernel and dropped, and it is counted (`rx_too_large`),
/// not lost unseen.
#[test]
fn frames_larger_than_the_mtu_the_ipcp_started_with_are_counted() {
    if let Some(why) = unavailable() {
        println!("skipped: {why}");
        return;
    }
    let (na, nb) = (Netns::new("biga"), Netns::new("bigb"));
    let (ea, eb) = veth(&na, &nb);
    let cfg = String::from("[system]\nname = \"b\"\n") + &shim_eth("b.10", "10", &eb);
    let b = daemon_in(&nb, "eth-big", &cfg);
    na.exec(&["ip", "link", "set", "dev", &ea, "mtu", "9000"]);
    nb.exec(&["ip", "link", "set", "dev", &eb, "mtu", "9000"]);
    let mut frame = nb.mac(&eb).to_vec();
    frame.extend_from_slice(&na.mac(&ea));
    frame.extend_from_slice(&[0x81, 0x00, 0x00, 10, 0xd1, 0xf0]);
    frame.extend_from_slice(&[7u8; 4000]);
    inject(&na, &ea, vec![frame]);
    wait_for("the frame to be counted", T, || {
        counter(&b, "b.10", "rx_too_large") == 1
    });
    let mut b = b;
    assert!(b.child.try_wait().unwrap().is_none(), "rinad b died");
}
