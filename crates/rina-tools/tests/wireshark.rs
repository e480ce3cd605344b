//! The Wireshark dissector (tools/wireshark/rina.lua) against real traffic:
//! tcpdump captures two `rinad` on loopback (a shim-udp DIF and a normal
//! DIF over it, with echo traffic), tshark decodes the capture with the
//! dissector and the decoded fields are checked. Frames of the shim DIF
//! over Ethernet (ARP with application names, an SDU holding a PDU of a DIF
//! with 4-byte addresses) are built with rina-wire's encoders into a pcap
//! file and decoded the same way.
//!
//! Needs root (capturing on `lo`), tcpdump and tshark; skipped with a
//! message otherwise. CI runs as root and installs both.

mod common;

use common::{bin_dir, free_port, wait_until, Procs};
use rina_wire::pci::{self, DtConstants, FieldWidth, Pci, PduType};
use rina_wire::shim_eth::{Arp, ArpOp, FrameHeader, MacAddr, ETH_P_ARP, ETH_P_RINA};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

fn dissector() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/wireshark/rina.lua")
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Why this machine cannot run the test, if it cannot.
fn cannot_run(needs_root: bool) -> Option<&'static str> {
    // SAFETY: getuid has no preconditions.
    if needs_root && unsafe { libc::getuid() } != 0 {
        return Some("skipped: capturing on lo needs root");
    }
    if !have("tshark") {
        return Some("skipped: tshark is not installed");
    }
    if needs_root && !have("tcpdump") {
        return Some("skipped: tcpdump is not installed");
    }
    None
}

/// Runs tshark on `pcap` with the dissector and `opts`, printing `fields`
/// tab-separated, one row per packet.
fn tshark(pcap: &Path, opts: &[&str], fields: &[&str]) -> Vec<Vec<String>> {
    let (out, err, ok) = tshark_raw(pcap, opts, fields);
    assert!(ok, "tshark failed: {err}");
    assert!(!err.contains("Lua"), "the dissector raised an error: {err}");
    out
}

/// Rows, stderr and success of a tshark run (a capture still being written
/// may end in a cut packet, which tshark reports as an error).
fn tshark_raw(pcap: &Path, opts: &[&str], fields: &[&str]) -> (Vec<Vec<String>>, String, bool) {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(pcap)
        .arg("-X")
        .arg(format!("lua_script:{}", dissector().display()))
        .args(opts)
        .args(["-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("run tshark");
    let rows = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split('\t').map(str::to_owned).collect())
        .collect();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (rows, err, out.status.success())
}

fn config(me: &str, addr: u64, port: u16, peer: &str, peer_addr: u64, peer_port: u16) -> String {
    format!(
        "[system]\nname = \"{me}\"\n[[ipcp]]\nname = \"{me}.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:{port}\"\n[ipcp.directory]\n\"{peer}.net\" = \"127.0.0.1:{peer_port}\"\n\"nobody-here\" = \"127.0.0.1:{peer_port}\"\n[[ipcp]]\nname = \"{me}.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = {addr}\n[[ipcp.neighbor]]\nname = \"{peer}.net\"\nover = \"udp\"\naddress = {peer_addr}\n[ipcp.names]\n\"echo\" = 2\n"
    )
}

fn run(bin: &Path, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run the tool")
}

/// Starts tcpdump on lo for the two UDP ports and waits until it listens.
fn start_tcpdump(pcap: &Path, a: u16, b: u16) -> Child {
    let mut c = Command::new("tcpdump")
        // Immediate mode: packets are written as they come, not when a
        // ring block fills (a stopped tcpdump loses unread blocks).
        .args(["-i", "lo", "--immediate-mode", "-U", "-w"])
        .arg(pcap)
        .arg(format!("udp port {a} or udp port {b}"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tcpdump");
    let err = c.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    loop {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(l) if l.contains("listening on") => return c,
            Ok(_) => {}
            Err(_) => panic!("tcpdump did not start listening"),
        }
    }
}

/// Stops tcpdump with SIGTERM so it writes out what it holds.
fn stop_tcpdump(mut c: Child) {
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
    let _ = c.wait();
}

fn neighbors_up(ctl: &Path, sock: &str) -> bool {
    let out = run(ctl, &["--socket", sock, "--json", "ipcps"]);
    out.status.success()
        && serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .ok()
            .and_then(|v| {
                v.as_array()?
                    .iter()
                    .find(|i| i["kind"] == "normal")
                    .map(|i| i["counters"]["neighbors_up"] == 1)
            })
            .unwrap_or(false)
}

#[test]
fn tshark_decodes_shim_udp_efcp_and_cdap_of_a_live_capture() {
    if let Some(why) = cannot_run(true) {
        println!("{why}");
        return;
    }
    let bins = bin_dir();
    let dir = std::env::temp_dir().join(format!("rina-wireshark-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut procs = Procs(Vec::new(), dir.clone());
    let (pa, pb) = (free_port(), free_port());
    let pcap = dir.join("capture.pcap");
    let tcpdump = start_tcpdump(&pcap, pa, pb);
    for (me, addr, port, peer, paddr, pport) in [
        ("alpha", 1, pa, "beta", 2, pb),
        ("beta", 2, pb, "alpha", 1, pa),
    ] {
        let conf = dir.join(format!("{me}.toml"));
        std::fs::write(&conf, config(me, addr, port, peer, paddr, pport)).unwrap();
        let child = Command::new(bins.join("rinad"))
            .arg("--config")
            .arg(&conf)
            .arg("--socket")
            .arg(dir.join(format!("{me}.sock")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        procs.0.push(child);
    }
    let a = dir.join("alpha.sock").display().to_string();
    let b = dir.join("beta.sock").display().to_string();
    let ctl = bins.join("rinactl");
    wait_until("the normal DIF to come up", Duration::from_secs(20), || {
        neighbors_up(&ctl, &a)
    });
    let server = Command::new(bins.join("rina-echo"))
        .args(["server", "--socket", &b, "--dif", "net", "--name", "echo"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    procs.0.push(server);
    let echo = [
        "client", "--socket", &a, "--dif", "net", "--dst", "echo", "--count", "2",
    ];
    // The server registers asynchronously: retry until the name answers.
    let mut ok = false;
    wait_until(
        "an echo over the normal DIF",
        Duration::from_secs(20),
        || {
            ok = run(&bins.join("rina-echo"), &echo).status.success();
            ok
        },
    );
    // Straight over the shim DIF, to a name nobody registered there.
    let direct = [
        "client",
        "--socket",
        &a,
        "--dif",
        "udp",
        "--dst",
        "nobody-here",
        "--count",
        "1",
        "--max-delay-ms",
        "50",
    ];
    assert!(!run(&bins.join("rina-echo"), &direct).status.success());
    // Wait until the capture holds the refusal of that allocation (and so
    // everything sent before it) and a hello each way (once a second).
    wait_until(
        "the refusal and hellos in the capture",
        Duration::from_secs(10),
        || {
            let (rows, _, _) = tshark_raw(
                &pcap,
                &[],
                &[
                    "rina.shim_udp.result",
                    "rina.cdap.obj_name",
                    "rina.efcp.src_addr",
                ],
            );
            let hello_from = |a: &str| {
                rows.iter()
                    .any(|r| r.len() == 3 && r[1] == "/difm/enr/hello" && r[2] == a)
            };
            rows.iter().any(|r| r[0] == "1") && hello_from("1") && hello_from("2")
        },
    );
    stop_tcpdump(tcpdump);

    let rows = tshark(
        &pcap,
        &[],
        &[
            "rina.shim_udp.type",
            "rina.shim_udp.dst_name",
            "rina.shim_udp.result",
            "rina.efcp.pdu_type",
            "rina.efcp.src_addr",
            "rina.efcp.dst_addr",
            "rina.cdap.opcode",
            "rina.cdap.obj_name",
            "rina.mgmt.fa.dst_name",
            "rina.qos.max_delay_us",
        ],
    );
    let has = |want: &[(usize, &str)]| {
        rows.iter().any(|r| {
            want.iter()
                .all(|(i, v)| r.get(*i).map(String::as_str) == Some(*v))
        })
    };
    let dump = format!(
        "{rows:?} (capture of {} bytes)",
        std::fs::metadata(&pcap).map_or(0, |m| m.len())
    );
    // The N-1 flow of the normal DIF: ALLOC_REQ for beta.net, accepted.
    assert!(has(&[(0, "0x02"), (1, "beta.net")]), "{dump}");
    assert!(has(&[(0, "0x03"), (2, "0")]), "{dump}");
    // Hellos: CDAP M_WRITE (12) of /difm/enr/hello in MGMT PDUs both ways.
    for (src, dst) in [("1", "2"), ("2", "1")] {
        assert!(
            has(&[
                (3, "0x40"),
                (4, src),
                (5, dst),
                (6, "12"),
                (7, "/difm/enr/hello")
            ]),
            "{dump}"
        );
        // Echo traffic in DT PDUs.
        assert!(has(&[(3, "0x80"), (4, src), (5, dst)]), "{dump}");
    }
    // The flow allocator creates a flow object on the peer: CDAP M_CREATE
    // (4) of /fa/flows/key=..., answered by M_CREATE_R (5).
    for op in ["4", "5"] {
        assert!(
            rows.iter()
                .any(|r| r.get(3).map(String::as_str) == Some("0x40")
                    && r.get(6).map(String::as_str) == Some(op)
                    && r.get(7).is_some_and(|n| n.starts_with("/fa/flows/key="))),
            "{dump}"
        );
    }
    // The direct allocation: ALLOC_REQ for nobody-here with its QoS (50 ms),
    // answered "not registered" (1).
    assert!(
        has(&[(0, "0x02"), (1, "nobody-here"), (9, "50000")]),
        "{dump}"
    );
    assert!(has(&[(0, "0x03"), (2, "1")]), "{dump}");
}

/// Writes Ethernet frames as a pcap file (link type 1).
fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut out = Vec::new();
    for v in [0xa1b2_c3d4u32.to_le_bytes().to_vec(), vec![2, 0, 4, 0]] {
        out.extend(v);
    }
    out.extend([0u8; 8]); // thiszone, sigfigs
    out.extend(65535u32.to_le_bytes());
    out.extend(1u32.to_le_bytes());
    for (i, f) in frames.iter().enumerate() {
        out.extend((i as u32 + 1).to_le_bytes());
        out.extend(0u32.to_le_bytes());
        out.extend((f.len() as u32).to_le_bytes());
        out.extend((f.len() as u32).to_le_bytes());
        out.extend(f);
    }
    std::fs::write(path, out).unwrap();
}

#[test]
fn tshark_decodes_shim_eth_arp_and_preference_widths() {
    if let Some(why) = cannot_run(false) {
        println!("{why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("rina-wireshark-eth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mac_a = MacAddr([2, 0, 0, 0, 0, 0xa]);
    let mac_b = MacAddr([2, 0, 0, 0, 0, 0xb]);
    let hdr = |dst, src, ethertype| FrameHeader {
        dst,
        src,
        vlan: Some(10),
        ethertype,
    };
    let request = Arp {
        op: ArpOp::Request,
        sha: mac_a,
        spa: b"a.net",
        tha: MacAddr::ZERO,
        tpa: b"b.net|1",
    }
    .to_frame(hdr(MacAddr::BROADCAST, mac_a, ETH_P_ARP))
    .unwrap();
    let reply = Arp {
        op: ArpOp::Reply,
        sha: mac_b,
        spa: b"b.net|1",
        tha: mac_a,
        tpa: b"a.net",
    }
    .to_frame(hdr(mac_a, mac_b, ETH_P_ARP))
    .unwrap();
    // A DT PDU of a DIF with 4-byte addresses, behind the TTL byte.
    let dt = DtConstants {
        addr: FieldWidth::W4,
        ..DtConstants::default()
    };
    let mut p = Pci::new(PduType::Dt);
    p.dst_addr = 70_000;
    p.src_addr = 3;
    p.seq = 9;
    let mut sdu = vec![64u8];
    pci::encode_data(&dt, &p, &[0x07, b'h', b'i'], &mut sdu).unwrap();
    let mut data = hdr(mac_b, mac_a, ETH_P_RINA).to_vec();
    data.extend(&sdu);
    let pcap = dir.join("eth.pcap");
    write_pcap(&pcap, &[request, reply, data]);

    let fields = [
        "rina.shim_eth.arp.op",
        "rina.shim_eth.arp.spa",
        "rina.shim_eth.arp.tpa",
        "rina.efcp.pdu_type",
        "rina.efcp.dst_addr",
        "rina.efcp.src_addr",
        "rina.efcp.seq",
        "rina.efcp.delimiter",
    ];
    let rows = tshark(&pcap, &["-o", "rina_efcp.addr:4"], &fields);
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_eq!(rows[0][..3], ["1", "a.net", "b.net|1"], "{rows:?}");
    assert_eq!(rows[1][..3], ["2", "b.net|1", "a.net"], "{rows:?}");
    assert_eq!(
        rows[2][3..],
        ["0x80", "70000", "3", "9", "0x07"],
        "{rows:?}"
    );
    // With the default 2-byte addresses the length field does not fit:
    // the SDU is left undecoded rather than decoded wrongly.
    let rows = tshark(&pcap, &[], &fields);
    assert_eq!(rows[2][3], "", "{rows:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Starts `rinad` for system `me` with configuration `conf`; its socket.
fn start_daemon(procs: &mut Procs, dir: &Path, me: &str, conf: &str) -> String {
    let path = dir.join(format!("{me}.toml"));
    std::fs::write(&path, conf).unwrap();
    let sock = dir.join(format!("{me}.sock"));
    let child = Command::new(bin_dir().join("rinad"))
        .arg("--config")
        .arg(&path)
        .arg("--socket")
        .arg(&sock)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    procs.0.push(child);
    sock.display().to_string()
}

/// A shim-hv IPCP (`side` of the shared file `shm`) and a normal IPCP over it.
fn hv_config(me: &str, addr: u64, side: &str, shm: &Path, peer: &str, peer_addr: u64) -> String {
    format!(
        "[system]\nname = \"{me}\"\n[[ipcp]]\nname = \"{me}.hv\"\ntype = \"shim-hv\"\ndif = \"hv\"\npath = \"{}\"\nside = \"{side}\"\nvmpi_id = 3\n[[ipcp]]\nname = \"{me}.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = {addr}\n[[ipcp.neighbor]]\nname = \"{peer}.net\"\nover = \"hv\"\naddress = {peer_addr}\n[ipcp.names]\n\"echo\" = 2\n",
        shm.display()
    )
}

/// What the normal DIF of the capture test runs over.
#[derive(Clone, Copy)]
enum Lower {
    ShimUdp,
    ShimHv,
}

#[test]
fn rinactl_capture_of_a_normal_ipcp_over_shim_udp_decodes_in_tshark() {
    capture_and_decode(Lower::ShimUdp);
}

#[test]
fn rinactl_capture_of_a_normal_ipcp_over_shim_hv_decodes_in_tshark() {
    capture_and_decode(Lower::ShimHv);
}

/// `rinactl capture` of alpha.net (over `lower`) while it says hello and
/// carries an echo, decoded by tshark with the dissector.
fn capture_and_decode(lower: Lower) {
    if let Some(why) = cannot_run(false) {
        println!("{why}");
        return;
    }
    let bins = bin_dir();
    let tag = match lower {
        Lower::ShimUdp => "udp",
        Lower::ShimHv => "hv",
    };
    let dir = std::env::temp_dir().join(format!("rina-capture-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut procs = Procs(Vec::new(), dir.clone());
    let (ca, cb) = match lower {
        Lower::ShimUdp => {
            let (pa, pb) = (free_port(), free_port());
            (
                config("alpha", 1, pa, "beta", 2, pb),
                config("beta", 2, pb, "alpha", 1, pa),
            )
        }
        Lower::ShimHv => {
            let shm = dir.join("vmpi0");
            (
                hv_config("alpha", 1, "host", &shm, "beta", 2),
                hv_config("beta", 2, "guest", &shm, "alpha", 1),
            )
        }
    };
    let a = start_daemon(&mut procs, &dir, "alpha", &ca);
    if matches!(lower, Lower::ShimHv) {
        // The host side lays out the shared file before the guest maps it.
        let shm = dir.join("vmpi0");
        wait_until("the shared file", Duration::from_secs(10), || shm.exists());
    }
    let b = start_daemon(&mut procs, &dir, "beta", &cb);
    let ctl = bins.join("rinactl");
    wait_until("the normal DIF to come up", Duration::from_secs(20), || {
        neighbors_up(&ctl, &a)
    });
    // A shim's own traffic is captured on its medium: refused, saying so.
    let pcap = dir.join("n1.pcap");
    let pcap_s = pcap.display().to_string();
    let shim_name = format!("alpha.{tag}");
    let shim = run(&ctl, &["--socket", &a, "capture", &shim_name, &pcap_s]);
    assert_eq!(shim.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&shim.stderr).contains("tcpdump"));

    let capture = Command::new(&ctl)
        .args(["--socket", &a, "--json", "capture", "alpha.net", &pcap_s])
        .args(["--duration-s", "4"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let server = Command::new(bins.join("rina-echo"))
        .args(["server", "--socket", &b, "--dif", "net", "--name", "echo"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    procs.0.push(server);
    let echo = [
        "client", "--socket", &a, "--dif", "net", "--dst", "echo", "--count", "2",
    ];
    wait_until(
        "an echo over the normal DIF",
        Duration::from_secs(3),
        || run(&bins.join("rina-echo"), &echo).status.success(),
    );
    let out = capture.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(summary["packets"].as_u64().unwrap() >= 6, "{summary}");

    let rows = tshark(
        &pcap,
        &[],
        &[
            "rina.n1.direction",
            "rina.efcp.pdu_type",
            "rina.efcp.src_addr",
            "rina.efcp.dst_addr",
            "rina.cdap.obj_name",
            "rina.mgmt.fa.dst_name",
        ],
    );
    let has = |want: &[(usize, &str)]| {
        rows.iter().any(|r| {
            want.iter()
                .all(|(i, v)| r.get(*i).map(String::as_str) == Some(*v))
        })
    };
    let dump = format!("{rows:?}");
    assert_eq!(rows.len() as u64, summary["packets"].as_u64().unwrap());
    // Hellos: sent by alpha (1 -> 2), received from beta (2 -> 1).
    for (dir, src, dst) in [("1", "1", "2"), ("0", "2", "1")] {
        let hello = [
            (0, dir),
            (1, "0x40"),
            (2, src),
            (3, dst),
            (4, "/difm/enr/hello"),
        ];
        assert!(has(&hello), "{dump}");
        // The echo's data both ways.
        assert!(has(&[(0, dir), (1, "0x80"), (2, src), (3, dst)]), "{dump}");
    }
    // The flow allocator's request for echo, sent: a CDAP M_CREATE of a
    // flow object.
    let fa_request = rows.iter().any(|r| {
        r.first().map(String::as_str) == Some("1")
            && r.get(1).map(String::as_str) == Some("0x40")
            && r.get(4).is_some_and(|o| o.starts_with("/fa/flows/key="))
    });
    assert!(fa_request, "{dump}");
}
