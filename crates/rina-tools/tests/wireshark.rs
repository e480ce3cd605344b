//! The Wireshark dissector (tools/wireshark/rina.lua) against real traffic:
//! tcpdump captures two `rinad` on loopback (a shim-udp DIF and a normal
//! DIF over it, with echo traffic), tshark decodes the capture with the
//! dissector and the decoded fields are checked. Frames of the shim DIF
//! over Ethernet (ARP with application names, an SDU holding a PDU of a DIF
//! with 4-byte addresses) are built with rina-wire's encoders into a pcap
//! file and decoded the same way.
//!
//! `rinactl capture` of every kind of IPCP, decoded the same way: a normal
//! IPCP and the shim-udp or shim-hv under it, captured at once while they
//! carry hellos, an echo and a refused allocation straight on the shim;
//! a shim-eth on VLAN 10 of a veth pair between two network namespaces,
//! from before its normal DIF finds the neighbour by ARP.
//!
//! The live tcpdump capture and the shim-eth capture need root (capturing
//! on `lo`; namespaces), and all need tshark; skipped with a message
//! otherwise. CI runs as root and installs tcpdump and tshark.

mod common;

use common::{bin_dir, free_port, spawn_rinad, wait_until, Procs};
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
        "[system]\nname = \"{me}\"\n[[ipcp]]\nname = \"{me}.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:{port}\"\n[ipcp.directory]\n\"{peer}.net\" = \"127.0.0.1:{peer_port}\"\n\"nobody-here\" = \"127.0.0.1:{peer_port}\"\n\"shim-echo\" = \"127.0.0.1:{peer_port}\"\n[[ipcp]]\nname = \"{me}.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = {addr}\n[[ipcp.neighbor]]\nname = \"{peer}.net\"\nover = \"udp\"\naddress = {peer_addr}\n[ipcp.names]\n\"echo\" = 2\n"
    )
}

/// Starts `rina-echo server` as `name` in DIF `dif` of the daemon at
/// `sock`, stopped with the test's other processes.
fn echo_server(procs: &mut Procs, bins: &Path, sock: &str, dif: &str, name: &str) {
    let server = Command::new(bins.join("rina-echo"))
        .args(["server", "--socket", sock, "--dif", dif, "--name", name])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    procs.0.push(server);
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
    start_udp_daemons(&mut procs, &bins, &dir, pa, pb);
    let a = dir.join("alpha.sock").display().to_string();
    let b = dir.join("beta.sock").display().to_string();
    let ctl = bins.join("rinactl");
    wait_until("the normal DIF to come up", Duration::from_secs(20), || {
        neighbors_up(&ctl, &a)
    });
    run_echo_and_refused_allocation(&mut procs, &bins, &a, &b);
    wait_for_refusal_and_hellos(&pcap);
    stop_tcpdump(tcpdump);
    check_live_capture(&pcap);
}

/// Writes alpha's and beta's configurations (UDP ports `pa` and `pb`) into
/// `dir` and starts their `rinad`.
fn start_udp_daemons(procs: &mut Procs, bins: &Path, dir: &Path, pa: u16, pb: u16) {
    for (me, addr, port, peer, paddr, pport) in [
        ("alpha", 1, pa, "beta", 2, pb),
        ("beta", 2, pb, "alpha", 1, pa),
    ] {
        let conf = dir.join(format!("{me}.toml"));
        std::fs::write(&conf, config(me, addr, port, peer, paddr, pport)).unwrap();
        let child = spawn_rinad(bins, &conf, &dir.join(format!("{me}.sock")));
        procs.0.push(child);
    }
}

/// Runs echoes from alpha (socket `a`) to a server at beta (socket `b`)
/// over the normal DIF, then a refused allocation straight on the shim DIF.
fn run_echo_and_refused_allocation(procs: &mut Procs, bins: &Path, a: &str, b: &str) {
    echo_server(procs, bins, b, "net", "echo");
    let echo = [
        "client", "--socket", a, "--dif", "net", "--dst", "echo", "--count", "2",
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
        a,
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
}

/// Waits until the capture holds the refusal of the direct allocation (and
/// so everything sent before it) and a hello each way.
fn wait_for_refusal_and_hellos(pcap: &Path) {
    // Hellos come once a second. Each look is a whole tshark run, which
    // takes seconds when CI runs other tests beside this one: the deadline
    // leaves room for several.
    wait_until(
        "the refusal and hellos in the capture",
        Duration::from_secs(30),
        || {
            let (rows, _, _) = tshark_raw(
                pcap,
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
}

/// Decodes the stopped capture and checks the shim-udp allocations, the
/// hellos and DT PDUs both ways, the flow allocator's CDAP and the refusal.
fn check_live_capture(pcap: &Path) {
    let rows = tshark(
        pcap,
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
        std::fs::metadata(pcap).map_or(0, |m| m.len())
    );
    // The N-1 flow of the normal DIF: ALLOC_REQ for beta.net, accepted.
    assert!(has(&[(0, "0x02"), (1, "beta.net")]), "{dump}");
    assert!(has(&[(0, "0x03"), (2, "0")]), "{dump}");
    // Hellos: CDAP M_WRITE (12) of /difm/enr/hello in MGMT PDUs both ways,
    // to the neighbour's address or to 0 (the neighbour on the N-1 flow).
    for (src, dst) in [("1", "2"), ("2", "1")] {
        assert!(
            [dst, "0"].iter().any(|d| has(&[
                (3, "0x40"),
                (4, src),
                (5, d),
                (6, "12"),
                (7, "/difm/enr/hello")
            ])),
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

/// An Ethernet frame holding `payload` in a UDP datagram from 10.0.0.1:5001
/// to 10.0.0.2:5002 (checksums left zero: tshark does not check them).
fn udp_frame(payload: &[u8]) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 0xb, 2, 0, 0, 0, 0, 0xa, 0x08, 0x00];
    let ip_len = (20 + 8 + payload.len()) as u16;
    f.extend([0x45, 0]);
    f.extend(ip_len.to_be_bytes());
    f.extend([0, 1, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
    f.extend(5001u16.to_be_bytes());
    f.extend(5002u16.to_be_bytes());
    f.extend((8 + payload.len() as u16).to_be_bytes());
    f.extend([0, 0]);
    f.extend(payload);
    f
}

#[test]
fn tshark_decodes_the_direct_port_of_shim_udp_allocations_and_keepalives() {
    if let Some(why) = cannot_run(false) {
        println!("{why}");
        return;
    }
    use rina_wire::shim_udp::{AllocResult, Datagram};
    let dir = std::env::temp_dir().join(format!("rina-wireshark-direct-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let req = |direct| Datagram::AllocReq {
        src_port: 3,
        qos: rina_wire::QosSpec::default(),
        src: "client".parse().unwrap(),
        dst: "echo".parse().unwrap(),
        direct,
    };
    let resp = Datagram::AllocResp {
        dst_port: 3,
        src_port: 8,
        result: AllocResult::Accepted,
        max_sdu: 1400,
        reason: "",
        direct: Some(40_002),
    };
    let mut frames: Vec<Vec<u8>> = [req(Some(40_001)), resp, req(None)]
        .iter()
        .map(|d| udp_frame(&d.to_vec()))
        .collect();
    frames.push(udp_frame(&rina_wire::shim_udp::keepalive(
        true,
        &[(8, 3), (9, 4)],
    )));
    let pcap = dir.join("direct.pcap");
    write_pcap(&pcap, &frames);
    let rows = tshark(
        &pcap,
        &[],
        &[
            "rina.shim_udp.type",
            "rina.shim_udp.dst_name",
            "rina.shim_udp.direct_port",
            "rina.shim_udp.dst_port",
            "rina.shim_udp.src_port",
            "rina.shim_udp.probe",
        ],
    );
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert_eq!(rows[0][..3], ["0x02", "echo", "40001"], "{rows:?}");
    assert_eq!(rows[1][0], "0x03", "{rows:?}");
    assert_eq!(rows[1][2], "40002", "{rows:?}");
    assert_eq!(rows[2][..2], ["0x02", "echo"], "{rows:?}");
    assert!(rows[2].get(2).is_none_or(|v| v.is_empty()), "{rows:?}");
    assert_eq!(rows[3][0], "0x05", "{rows:?}");
    assert_eq!(
        rows[3][3..],
        ["8", "3", "1"],
        "the first pair, a probe: {rows:?}"
    );
    // The type is named, in the tree and the summary.
    let info = tshark(&pcap, &[], &["_ws.col.Info"]);
    assert_eq!(info[3], ["shim-udp KEEPALIVE probe, 2 flow(s)"], "{info:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Starts `rinad` for system `me` with configuration `conf`; its socket.
fn start_daemon(procs: &mut Procs, dir: &Path, me: &str, conf: &str) -> String {
    let path = dir.join(format!("{me}.toml"));
    std::fs::write(&path, conf).unwrap();
    let sock = dir.join(format!("{me}.sock"));
    let child = spawn_rinad(&bin_dir(), &path, &sock);
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
fn rinactl_capture_of_shim_udp_and_a_normal_ipcp_over_it_decodes_in_tshark() {
    capture_and_decode(Lower::ShimUdp);
}

#[test]
fn rinactl_capture_of_shim_hv_and_a_normal_ipcp_over_it_decodes_in_tshark() {
    capture_and_decode(Lower::ShimHv);
}

/// `rinactl capture` of alpha.net and of the shim under it (`lower`) while
/// they say hello, carry an echo and a refused allocation straight on the
/// shim, decoded by tshark with the dissector.
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
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut procs = Procs(Vec::new(), dir.clone());
    let (pa, pb) = (free_port(), free_port());
    let (ca, cb) = match lower {
        Lower::ShimUdp => (
            config("alpha", 1, pa, "beta", 2, pb),
            config("beta", 2, pb, "alpha", 1, pa),
        ),
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
    // The normal IPCP's N-1 frames and, at once, the shim's own medium.
    let pcap = dir.join("n1.pcap");
    let shim_pcap = dir.join("shim.pcap");
    let capture = start_capture(&ctl, &a, "alpha.net", &pcap, Some(6));
    let shim_capture = start_capture(&ctl, &a, &format!("alpha.{tag}"), &shim_pcap, Some(6));
    echo_server(&mut procs, &bins, &b, "net", "echo");
    let echo = [
        "client", "--socket", &a, "--dif", "net", "--dst", "echo", "--count", "2",
    ];
    wait_until(
        "an echo over the normal DIF",
        Duration::from_secs(3),
        || run(&bins.join("rina-echo"), &echo).status.success(),
    );
    // Straight over the shim DIF, to a name nobody registered: the shim's
    // allocation request and its refusal.
    let direct = [
        "client",
        "--socket",
        &a,
        "--dif",
        tag,
        "--dst",
        "nobody-here",
        "--count",
        "1",
    ];
    assert!(!run(&bins.join("rina-echo"), &direct).status.success());
    {
        // An echo straight on the shim DIF: the application's SDUs the
        // daemon sends behind the shim's header (in place on shim-udp,
        // ring to ring on shim-hv).
        echo_server(&mut procs, &bins, &b, tag, "shim-echo");
        let echo = [
            "client",
            "--socket",
            &a,
            "--dif",
            tag,
            "--dst",
            "shim-echo",
            "--count",
            "2",
        ];
        wait_until("an echo over the shim DIF", Duration::from_secs(3), || {
            run(&bins.join("rina-echo"), &echo).status.success()
        });
    }
    let summary = finish_capture(capture);
    assert!(summary["packets"].as_u64().unwrap() >= 6, "{summary}");
    let shim_summary = finish_capture(shim_capture);
    match lower {
        Lower::ShimUdp => check_shim_udp(&shim_pcap, &shim_summary, pa, pb),
        Lower::ShimHv => check_shim_hv(&shim_pcap, &shim_summary),
    }

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

/// Starts `rinactl capture` of `ipcp` into `pcap` (for `secs` seconds, or
/// until SIGINT) and waits until the daemon has started it (the file
/// header is written after the daemon's answer).
fn start_capture(ctl: &Path, sock: &str, ipcp: &str, pcap: &Path, secs: Option<u32>) -> Child {
    let mut cmd = Command::new(ctl);
    cmd.args(["--socket", sock, "--json", "capture", ipcp])
        .arg(pcap)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(s) = secs {
        cmd.args(["--duration-s", &s.to_string()]);
    }
    let child = cmd.spawn().unwrap();
    wait_until("the capture to start", Duration::from_secs(10), || {
        std::fs::metadata(pcap).is_ok_and(|m| m.len() >= 24)
    });
    child
}

/// Waits for a capture to end; its JSON summary.
fn finish_capture(c: Child) -> serde_json::Value {
    let out = c.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Whether some row has every `(column, value)` of `want`.
fn has_row(rows: &[Vec<String>], want: &[(usize, &str)]) -> bool {
    rows.iter().any(|r| {
        want.iter()
            .all(|(i, v)| r.get(*i).map(String::as_str) == Some(*v))
    })
}

const HELLO: &str = "/difm/enr/hello";

/// `rinactl capture` of alpha.udp (UDP port `pa`, its peer on `pb`): the
/// datagrams as IP/UDP both ways, shim-udp headers, the normal DIF's
/// PDUs inside, the allocation request and its refusal.
fn check_shim_udp(pcap: &Path, summary: &serde_json::Value, pa: u16, pb: u16) {
    let rows = tshark(
        pcap,
        &[],
        &[
            "udp.srcport",
            "udp.dstport",
            "rina.shim_udp.type",
            "rina.shim_udp.dst_name",
            "rina.shim_udp.result",
            "rina.efcp.pdu_type",
            "rina.efcp.src_addr",
            "rina.cdap.obj_name",
            "ip.src",
        ],
    );
    let dump = format!("{rows:?}");
    assert_eq!(rows.len() as u64, summary["packets"].as_u64().unwrap());
    let (pa, pb) = (pa.to_string(), pb.to_string());
    for (from, to, src) in [(&pa, &pb, "1"), (&pb, &pa, "2")] {
        let hello = [
            (0, from.as_str()),
            (1, to.as_str()),
            (2, "0x01"),
            (5, "0x40"),
            (6, src),
            (7, HELLO),
            (8, "127.0.0.1"),
        ];
        assert!(has_row(&rows, &hello), "{dump}");
        let dt = [(0, from.as_str()), (2, "0x01"), (5, "0x80"), (6, src)];
        assert!(has_row(&rows, &dt), "{dump}");
    }
    assert!(
        has_row(&rows, &[(0, &pa), (2, "0x02"), (3, "nobody-here")]),
        "{dump}"
    );
    assert!(has_row(&rows, &[(0, &pb), (2, "0x03"), (4, "1")]), "{dump}");
    // The echo straight on the shim: accepted, then its SDUs both ways
    // (DATA that holds no PDU of a normal DIF).
    assert!(
        has_row(&rows, &[(0, &pa), (2, "0x02"), (3, "shim-echo")]),
        "{dump}"
    );
    assert!(has_row(&rows, &[(0, &pb), (2, "0x03"), (4, "0")]), "{dump}");
    for (from, to) in [(&pa, &pb), (&pb, &pa)] {
        let sdu = [(0, from.as_str()), (1, to.as_str()), (2, "0x01"), (5, "")];
        assert!(has_row(&rows, &sdu), "{dump}");
    }
}

/// `rinactl capture` of alpha.hv (VMPI-id 3): the VMPI buffers both ways,
/// the normal DIF's PDUs on a data channel, the allocation request on the
/// control channel and its refusal.
fn check_shim_hv(pcap: &Path, summary: &serde_json::Value) {
    let rows = tshark(
        pcap,
        &[],
        &[
            "rina.vmpi.direction",
            "rina.vmpi.vmpi_id",
            "rina.vmpi.channel",
            "rina.vmpi.cmd",
            "rina.vmpi.ctl.dst_name",
            "rina.vmpi.ctl.response",
            "rina.efcp.pdu_type",
            "rina.efcp.src_addr",
            "rina.cdap.obj_name",
        ],
    );
    let dump = format!("{rows:?}");
    assert_eq!(rows.len() as u64, summary["packets"].as_u64().unwrap());
    assert!(rows.iter().all(|r| r[1] == "3"), "{dump}");
    for (dir, src) in [("1", "1"), ("0", "2")] {
        let data = |r: &Vec<String>| r[0] == dir && r[2] != "0" && !r[2].is_empty() && r[7] == src;
        assert!(
            rows.iter()
                .any(|r| data(r) && r[6] == "0x40" && r[8] == HELLO),
            "{dump}"
        );
        assert!(rows.iter().any(|r| data(r) && r[6] == "0x80"), "{dump}");
    }
    // Data channels both ways: the normal IPCP's and the echo's straight
    // on the shim (its SDUs go ring to ring in the daemons).
    for dir in ["0", "1"] {
        let mut channels: Vec<&str> = rows
            .iter()
            .filter(|r| r[0] == dir && r[2] != "0" && !r[2].is_empty())
            .map(|r| r[2].as_str())
            .collect();
        channels.sort_unstable();
        channels.dedup();
        assert!(channels.len() >= 2, "direction {dir}: {channels:?}\n{dump}");
    }
    let request = [(0, "1"), (2, "0"), (3, "0"), (4, "nobody-here")];
    assert!(has_row(&rows, &request), "{dump}");
    assert!(
        has_row(&rows, &[(0, "0"), (2, "0"), (3, "1"), (5, "1")]),
        "{dump}"
    );
}

/// Runs a command; panics with its error output if it fails.
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

/// A network namespace, deleted on drop (with the veth end inside it).
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("rinacap-{}-{tag}", std::process::id());
        sh(&["ip", "netns", "add", &name]);
        let ns = Netns(name);
        // No IPv6 chatter (router solicitations, MLD) on the test link.
        for key in ["all", "default"] {
            let k = format!("net.ipv6.conf.{key}.disable_ipv6=1");
            sh(&["ip", "netns", "exec", &ns.0, "sysctl", "-qw", &k]);
        }
        ns
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.0])
            .stderr(Stdio::null())
            .status();
    }
}

/// A shim-eth IPCP on VLAN 10 of `ifname` and a normal IPCP over it.
fn eth_config(me: &str, addr: u64, ifname: &str, peer: &str, peer_addr: u64) -> String {
    format!(
        "[system]\nname = \"{me}\"\n[[ipcp]]\nname = \"{me}.eth\"\ntype = \"shim-eth\"\ndif = \"10\"\ninterface = \"{ifname}\"\n[[ipcp]]\nname = \"{me}.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = {addr}\nmax_pdu = 1400\n[[ipcp.neighbor]]\nname = \"{peer}.net\"\nover = \"10\"\naddress = {peer_addr}\n[ipcp.names]\n\"echo\" = 2\n"
    )
}

/// Starts `rinad` inside namespace `ns`; its socket.
fn start_daemon_in(procs: &mut Procs, ns: &Netns, dir: &Path, me: &str, conf: &str) -> String {
    let path = dir.join(format!("{me}.toml"));
    std::fs::write(&path, conf).unwrap();
    let sock = dir.join(format!("{me}.sock"));
    // `ip netns exec` execs rinad itself: the child is the daemon.
    let child = Command::new("ip")
        .args(["netns", "exec", &ns.0])
        .arg(bin_dir().join("rinad"))
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
    let s = sock.display().to_string();
    let ctl = bin_dir().join("rinactl");
    wait_until("the daemon to answer", Duration::from_secs(10), || {
        run(&ctl, &["--socket", &s, "ipcps"]).status.success()
    });
    s
}

/// `rinactl capture` of a shim-eth IPCP from before its normal DIF comes
/// up: the ARP exchange that finds the neighbour (application names as
/// protocol addresses), the frames with their VLAN tag both ways (the
/// kernel strips a received frame's tag; the capture puts it back), the
/// normal DIF's PDUs inside.
#[test]
fn rinactl_capture_of_shim_eth_decodes_in_tshark() {
    if let Some(why) = cannot_run(false) {
        println!("{why}");
        return;
    }
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        println!("skipped: network namespaces and veth pairs need root");
        return;
    }
    let ok = Command::new("ip")
        .args(["netns", "list"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        println!("skipped: the ip command (iproute2) with netns support is missing");
        return;
    }
    let bins = bin_dir();
    let dir = std::env::temp_dir().join(format!("rina-capture-eth-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (na, nb) = (Netns::new("a"), Netns::new("b"));
    let tag = std::process::id() % 100_000;
    let (ea, eb) = (format!("vc{tag}a"), format!("vc{tag}b"));
    sh(&[
        "ip", "link", "add", &ea, "type", "veth", "peer", "name", &eb,
    ]);
    sh(&["ip", "link", "set", &ea, "netns", &na.0]);
    sh(&["ip", "link", "set", &eb, "netns", &nb.0]);
    for (ns, e) in [(&na, &ea), (&nb, &eb)] {
        sh(&["ip", "netns", "exec", &ns.0, "ip", "link", "set", e, "up"]);
    }
    let mut procs = Procs(Vec::new(), dir.clone());
    let a = start_daemon_in(
        &mut procs,
        &na,
        &dir,
        "alpha",
        &eth_config("alpha", 1, &ea, "beta", 2),
    );
    let ctl = bins.join("rinactl");
    let pcap = dir.join("eth.pcap");
    let capture = start_capture(&ctl, &a, "alpha.eth", &pcap, None);
    let b = start_daemon_in(
        &mut procs,
        &nb,
        &dir,
        "beta",
        &eth_config("beta", 2, &eb, "alpha", 1),
    );
    wait_until("the normal DIF to come up", Duration::from_secs(20), || {
        neighbors_up(&ctl, &a)
    });
    echo_server(&mut procs, &bins, &b, "net", "echo");
    let echo = [
        "client", "--socket", &a, "--dif", "net", "--dst", "echo", "--count", "2",
    ];
    wait_until(
        "an echo over the normal DIF",
        Duration::from_secs(10),
        || run(&bins.join("rina-echo"), &echo).status.success(),
    );
    // A hello each way after the echo (once a second), then stop.
    std::thread::sleep(Duration::from_millis(2200));
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(capture.id() as libc::pid_t, libc::SIGINT) };
    let summary = finish_capture(capture);
    check_shim_eth(&pcap, &summary);
}

fn check_shim_eth(pcap: &Path, summary: &serde_json::Value) {
    let rows = tshark(
        pcap,
        &[],
        &[
            "vlan.id",
            "eth.type",
            "rina.shim_eth.arp.op",
            "rina.shim_eth.arp.spa",
            "rina.shim_eth.arp.tpa",
            "rina.efcp.pdu_type",
            "rina.efcp.src_addr",
            "rina.efcp.dst_addr",
            "rina.cdap.obj_name",
        ],
    );
    let dump = format!("{rows:?}");
    assert_eq!(rows.len() as u64, summary["packets"].as_u64().unwrap());
    // Every frame on VLAN 10, sent or received.
    assert!(rows.iter().all(|r| r[0] == "10"), "{dump}");
    // The neighbour found by ARP (whichever side asked first): who has
    // alpha.net or beta.net, and the answer of the one asked for.
    let arp = |op: &str, who: usize, name: &str| {
        rows.iter().any(|r| r[2] == op && r[who].starts_with(name))
    };
    assert!(
        ["alpha.net", "beta.net"]
            .iter()
            .any(|n| arp("1", 4, n) && arp("2", 3, n)),
        "{dump}"
    );
    for (src, dst) in [("1", "2"), ("2", "1")] {
        let hello = [(5, "0x40"), (6, src), (7, dst), (8, HELLO)];
        assert!(has_row(&rows, &hello), "{dump}");
        assert!(has_row(&rows, &[(5, "0x80"), (6, src), (7, dst)]), "{dump}");
    }
    // The flow allocator's request for echo: a CDAP M_CREATE of a flow.
    assert!(
        rows.iter()
            .any(|r| r[5] == "0x40" && r[8].starts_with("/fa/flows/key=")),
        "{dump}"
    );
}

/// An untagged shim-eth data frame holding `sdu`.
fn eth_data_frame(sdu: &[u8]) -> Vec<u8> {
    let mut f = FrameHeader {
        dst: MacAddr([2, 0, 0, 0, 0, 0xb]),
        src: MacAddr([2, 0, 0, 0, 0, 0xa]),
        vlan: None,
        ethertype: ETH_P_RINA,
    }
    .to_vec();
    f.extend(sdu);
    f
}

/// The dissector's preferences for the widths of `c`.
fn width_prefs(c: &DtConstants) -> Vec<String> {
    [
        ("addr", c.addr),
        ("cep", c.cep),
        ("qos", c.qos),
        ("length", c.length),
        ("seq", c.seq),
        ("ctrl_seq", c.ctrl_seq),
        ("rate", c.rate),
        ("frame", c.frame),
    ]
    .iter()
    .flat_map(|(n, w)| ["-o".to_string(), format!("rina_efcp.{n}:{}", w.bytes())])
    .collect()
}

/// The values of every control PDU field in
/// [`tshark_decodes_every_control_pdu_field_by_field_at_other_widths`],
/// each needing the width that test gives its field.
#[derive(Clone, Copy)]
struct CtlValues {
    sn: u64,
    lcsr: u64,
    lwe: u64,
    rwe: u64,
    mlwe: u64,
    mrwe: u64,
    rate: u64,
    frame: u64,
}

const CTL_VALUES: CtlValues = CtlValues {
    sn: 1 << 40,
    lcsr: 60_001,
    lwe: (1 << 41) + 1,
    rwe: (1 << 41) + 2,
    mlwe: (1 << 41) + 3,
    mrwe: (1 << 41) + 4,
    rate: 1 << 35,
    frame: 60_002,
};

/// One control PDU body of every type, with the values `v`.
fn every_control_body(v: CtlValues) -> Vec<pci::ControlBody> {
    use pci::ControlBody as B;
    let CtlValues {
        sn,
        lcsr,
        lwe,
        rwe,
        mlwe,
        mrwe,
        rate,
        frame,
    } = v;
    vec![
        B::Ack { ack_sn: sn },
        B::Nack { nack_sn: sn },
        B::Fc {
            new_rwe: rwe,
            my_lwe: mlwe,
            my_rwe: mrwe,
            rate,
            frame,
        },
        B::AckFc {
            ack_sn: sn,
            last_ctrl_seq_rcvd: lcsr,
            new_lwe: lwe,
            new_rwe: rwe,
            my_lwe: mlwe,
            my_rwe: mrwe,
            rate,
            frame,
        },
        B::NackFc {
            nack_sn: sn,
            last_ctrl_seq_rcvd: lcsr,
            new_lwe: lwe,
            new_rwe: rwe,
            my_lwe: mlwe,
            my_rwe: mrwe,
            rate,
            frame,
        },
        B::Cack {
            last_ctrl_seq_rcvd: lcsr,
            new_lwe: lwe,
            new_rwe: rwe,
            my_lwe: mlwe,
            my_rwe: mrwe,
            rate,
            frame,
        },
        B::Rendezvous {
            last_ctrl_seq_rcvd: lcsr,
            new_lwe: lwe,
            new_rwe: rwe,
            my_lwe: mlwe,
            my_rwe: mrwe,
            rate,
            frame,
        },
    ]
}

/// What tshark must show of [`every_control_body`]'s bodies, in order:
/// ack_sn, nack_sn, last_ctrl_seq_rcvd, new_lwe, new_rwe, my_lwe, my_rwe,
/// rate, frame (empty where the type has no such field).
fn control_fields_wanted(v: CtlValues) -> Vec<Vec<String>> {
    let s = |v: u64| v.to_string();
    let e = String::new;
    let win = [v.lcsr, v.lwe, v.rwe, v.mlwe, v.mrwe, v.rate, v.frame].map(s);
    let sn = s(v.sn);
    vec![
        vec![sn.clone(), e(), e(), e(), e(), e(), e(), e(), e()],
        vec![e(), sn.clone(), e(), e(), e(), e(), e(), e(), e()],
        [vec![e(), e(), e(), e()], win[2..].to_vec()].concat(),
        [vec![sn.clone(), e()], win.to_vec()].concat(),
        [vec![e(), sn], win.to_vec()].concat(),
        [vec![e(), e()], win.to_vec()].concat(),
        [vec![e(), e()], win.to_vec()].concat(),
    ]
}

#[test]
fn tshark_decodes_every_control_pdu_field_by_field_at_other_widths() {
    if let Some(why) = cannot_run(false) {
        println!("{why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("rina-wireshark-ctl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Every width differs from its default, and every value needs its width.
    let c = DtConstants {
        addr: FieldWidth::W4,
        cep: FieldWidth::W1,
        qos: FieldWidth::W1,
        length: FieldWidth::W4,
        seq: FieldWidth::W8,
        ctrl_seq: FieldWidth::W2,
        rate: FieldWidth::W8,
        frame: FieldWidth::W2,
        ..DtConstants::default()
    };
    let bodies = every_control_body(CTL_VALUES);
    let frames: Vec<Vec<u8>> = bodies
        .iter()
        .map(|b| {
            let mut p = Pci::new(b.pdu_type());
            (p.dst_addr, p.src_addr, p.qos_id) = (70_000, 70_001, 200);
            (p.dst_cep, p.src_cep, p.seq) = (201, 202, 60_000);
            let mut sdu = vec![64u8];
            pci::encode_control(&c, &p, b, &mut sdu).unwrap();
            eth_data_frame(&sdu)
        })
        .collect();
    let pcap = dir.join("ctl.pcap");
    write_pcap(&pcap, &frames);
    let fields = [
        "rina.efcp.pdu_type",
        "rina.efcp.dst_addr",
        "rina.efcp.src_addr",
        "rina.efcp.qos_id",
        "rina.efcp.dst_cep",
        "rina.efcp.src_cep",
        "rina.efcp.ctrl_seq",
        "rina.efcp.ack_sn",
        "rina.efcp.nack_sn",
        "rina.efcp.last_ctrl_seq_rcvd",
        "rina.efcp.new_lwe",
        "rina.efcp.new_rwe",
        "rina.efcp.my_lwe",
        "rina.efcp.my_rwe",
        "rina.efcp.rate",
        "rina.efcp.frame",
        "rina.efcp.padding",
    ];
    let prefs = width_prefs(&c);
    let prefs: Vec<&str> = prefs.iter().map(String::as_str).collect();
    let rows = tshark(&pcap, &prefs, &fields);
    assert_eq!(rows.len(), bodies.len(), "{rows:?}");
    let hdr = [70_000, 70_001, 200, 201, 202, 60_000].map(|v: u64| v.to_string());
    let want = control_fields_wanted(CTL_VALUES);
    for (i, (row, want)) in rows.iter().zip(want).enumerate() {
        let code = format!("0x{:02x}", bodies[i].pdu_type().code());
        assert_eq!(row[0], code, "{rows:?}");
        assert_eq!(row[1..7], hdr, "{code}: {rows:?}");
        assert_eq!(row[7..16], want[..], "{code}: {rows:?}");
        assert_eq!(
            row.get(17).map_or("", |v| v.as_str()),
            "",
            "{code}: {rows:?}"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn tshark_decodes_cdap_of_every_opcode_with_negative_integers() {
    if let Some(why) = cannot_run(false) {
        println!("{why}");
        return;
    }
    use rina_wire::cdap::{CdapMessage, ObjVal, OpCode, Value};
    let dir = std::env::temp_dir().join(format!("rina-wireshark-cdap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c = DtConstants::default();
    // Responses refused as the RIB daemon refuses (negative results), a
    // negative object instance and version, negative object values.
    let values = [
        Value::Int(-3),
        Value::SInt64(-(1 << 40) - 1),
        Value::Int64(-5),
        Value::SInt(7),
    ];
    let msgs: Vec<CdapMessage> = OpCode::ALL
        .iter()
        .enumerate()
        .map(|(i, &op)| {
            let mut m = CdapMessage::new(op);
            m.invoke_id = Some(i as i32 + 1);
            m.obj_name = Some(format!("/obj{i}"));
            m.result = (i % 2 == 1).then_some(-7);
            m.obj_inst = Some(-(i as i64) - 1);
            m.version = Some(-(1 << 40) - 1);
            m.obj_value = Some(ObjVal::from(values[i % values.len()].clone()));
            m
        })
        .collect();
    let frames: Vec<Vec<u8>> = msgs
        .iter()
        .map(|m| {
            let mut payload = vec![0xC0];
            payload.extend(m.encode());
            let mut p = Pci::new(PduType::Mgmt);
            (p.dst_addr, p.src_addr) = (1, 2);
            let mut sdu = vec![64u8];
            pci::encode_data(&c, &p, &payload, &mut sdu).unwrap();
            eth_data_frame(&sdu)
        })
        .collect();
    let pcap = dir.join("cdap.pcap");
    write_pcap(&pcap, &frames);
    let fields = [
        "rina.cdap.opcode",
        "rina.cdap.invoke_id",
        "rina.cdap.obj_name",
        "rina.cdap.result",
        "rina.cdap.obj_inst",
        "rina.cdap.version",
        "rina.cdap.value.int",
    ];
    let rows = tshark(&pcap, &[], &fields);
    assert_eq!(rows.len(), msgs.len(), "{rows:?}");
    let ints = ["-3", "-1099511627777", "-5", "7"];
    for (i, row) in rows.iter().enumerate() {
        let want = [
            i.to_string(),
            (i + 1).to_string(),
            format!("/obj{i}"),
            if i % 2 == 1 { "-7" } else { "" }.to_string(),
            (-(i as i64) - 1).to_string(),
            "-1099511627777".to_string(),
            ints[i % ints.len()].to_string(),
        ];
        assert_eq!(row[..], want[..], "{:?}: {rows:?}", OpCode::ALL[i]);
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Malformed frames a capture may hold: the dissector marks them or leaves
/// them undecoded, and never raises a Lua error.
#[test]
fn tshark_shows_malformed_frames_without_lua_errors() {
    if let Some(why) = cannot_run(false) {
        println!("{why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("rina-wireshark-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hdr = |ethertype| FrameHeader {
        dst: MacAddr::BROADCAST,
        src: MacAddr([2, 0, 0, 0, 0, 0xa]),
        vlan: None,
        ethertype,
    };
    // An IPv4 ARP cut after 7 bytes (Wireshark's ARP dissector throws).
    let mut arp = hdr(ETH_P_ARP).to_vec();
    arp.extend([0, 1, 8, 0, 6, 4, 0]);
    // A management PDU whose CDAP message ends inside a fixed32 field.
    let mut p = Pci::new(PduType::Mgmt);
    p.dst_addr = 1;
    let mut cut = vec![64u8];
    let cdap = [0xC0, 0x10, 0x04, 0x7d, 0xaa, 0xbb, 0xcc];
    pci::encode_data(&DtConstants::default(), &p, &cdap, &mut cut).unwrap();
    // An empty SDU, decoded as a PDU when told to ("always").
    let frames = [arp, eth_data_frame(&cut), eth_data_frame(&[])];
    let pcap = dir.join("bad.pcap");
    write_pcap(&pcap, &frames);
    let out = Command::new("tshark")
        .arg("-r")
        .arg(&pcap)
        .arg("-X")
        .arg(format!("lua_script:{}", dissector().display()))
        .args(["-o", "rina_shim_udp.efcp:always", "-V"])
        .output()
        .expect("run tshark");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("Lua Error"), "{text}");
    // Still decoded as far as the bytes go.
    assert!(text.contains("[field cut short]"), "{text}");
    assert_eq!(text.matches("\nFrame ").count(), 2, "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Frames of a DIF that encrypts its N-1 flows, as rina-core wraps them:
/// a handshake in clear decodes as the PDU behind the marker, a sealed
/// frame shows its header and tag, whether they come from a shim-eth
/// capture or from `rinactl capture` of the normal IPCP.
#[test]
fn tshark_decodes_the_encryption_wrapper_of_n1_frames() {
    if let Some(why) = cannot_run(false) {
        println!("{why}");
        return;
    }
    use rina_core::sdup::aead::{PortCrypto, SessionKeys};
    use rina_wire::pcap;
    let dir = std::env::temp_dir().join(format!("rina-wireshark-aead-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut p = Pci::new(PduType::Mgmt);
    (p.dst_addr, p.src_addr, p.seq) = (5, 6, 3);
    let mut pdu = vec![64u8];
    let cdap = rina_wire::cdap::CdapMessage::new(rina_wire::cdap::OpCode::Write).encode();
    pci::encode_data(
        &DtConstants::default(),
        &p,
        &[&[0xC0][..], &cdap].concat(),
        &mut pdu,
    )
    .unwrap();
    let mut crypto = PortCrypto::new();
    let keys = SessionKeys {
        id: 0xdead_beef,
        tx: [7; 32],
        rx: [8; 32],
    };
    crypto.install(rina_core::Instant::ZERO, &keys);
    let clear = crypto.clear(&pdu);
    crypto.seal(&pdu).unwrap();
    let sealed = crypto.seal(&pdu).unwrap();
    let fields = [
        "rina.efcp.aead.marker",
        "rina.efcp.aead.key_id",
        "rina.efcp.aead.seq",
        "rina.efcp.aead.tag",
        "rina.efcp.ttl",
        "rina.efcp.version",
        "rina.efcp.dst_addr",
        "rina.cdap.opcode",
    ];
    let eth = dir.join("eth.pcap");
    write_pcap(&eth, &[eth_data_frame(&clear), eth_data_frame(&sealed)]);
    // The same frames as `rinactl capture` writes them (link type USER0).
    let n1 = dir.join("n1.pcap");
    let mut file = pcap::file_header(pcap::LINKTYPE_RINA_N1, pcap::MAX_SNAPLEN).to_vec();
    for f in [&clear, &sealed] {
        let hdr = pcap::n1_header(true, 3);
        file.extend(pcap::record(Duration::ZERO, &[&hdr, f], pcap::MAX_SNAPLEN));
    }
    std::fs::write(&n1, file).unwrap();
    let tag: String = sealed[sealed.len() - 16..]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    for pcap in [&eth, &n1] {
        let rows = tshark(pcap, &[], &fields);
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(
            rows[0],
            ["0x00", "", "", "", "64", "1", "5", "12"],
            "{rows:?}"
        );
        assert_eq!(rows[1][..4], ["0xae", "0xdeadbeef", "1", &tag], "{rows:?}");
        assert!(rows[1][4..].iter().all(String::is_empty), "{rows:?}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `rinactl capture` of a normal IPCP is always decoded as EFCP: a PDU of
/// a DIF whose widths are not the preferences' is flagged, not shown as if
/// its fields were right.
#[test]
fn tshark_flags_a_pdu_that_does_not_fit_the_width_preferences() {
    if let Some(why) = cannot_run(false) {
        println!("{why}");
        return;
    }
    use rina_wire::pcap;
    let dir = std::env::temp_dir().join(format!("rina-wireshark-fit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c = DtConstants {
        addr: FieldWidth::W4,
        ..DtConstants::default()
    };
    let mut p = Pci::new(PduType::Dt);
    (p.dst_addr, p.src_addr) = (70_000, 3);
    let mut frame = vec![64u8];
    pci::encode_data(&c, &p, &[0x07, b'h', b'i'], &mut frame).unwrap();
    let mut file = pcap::file_header(pcap::LINKTYPE_RINA_N1, pcap::MAX_SNAPLEN).to_vec();
    let hdr = pcap::n1_header(false, 1);
    file.extend(pcap::record(
        Duration::ZERO,
        &[&hdr, &frame],
        pcap::MAX_SNAPLEN,
    ));
    let path = dir.join("n1.pcap");
    std::fs::write(&path, file).unwrap();
    let fields = ["rina.efcp.misfit", "rina.efcp.dst_addr"];
    let rows = tshark(&path, &[], &fields);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(!rows[0][0].is_empty(), "not flagged: {rows:?}");
    let rows = tshark(&path, &["-o", "rina_efcp.addr:4"], &fields);
    assert_eq!(rows[0], ["", "70000"], "{rows:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A short frame of a DIF with CRC-32, padded to Ethernet's 60 bytes as a
/// NIC sends it: the CRC is read right after the PDU, where the sender put
/// it, and the padding after that.
#[test]
fn tshark_reads_the_crc_after_the_pdu_not_at_the_end_of_a_padded_frame() {
    if let Some(why) = cannot_run(false) {
        println!("{why}");
        return;
    }
    use rina_core::sdup::{NullCipher, Sdup, SdupConfig};
    let dir = std::env::temp_dir().join(format!("rina-wireshark-crc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut p = Pci::new(PduType::Ack);
    (p.dst_addr, p.src_addr) = (1, 2);
    let mut pdu = Vec::new();
    let body = pci::ControlBody::Ack { ack_sn: 7 };
    pci::encode_control(&DtConstants::default(), &p, &body, &mut pdu).unwrap();
    let cfg = SdupConfig {
        ttl: Some(64),
        crc: true,
    };
    let mut sdu = Vec::new();
    Sdup::new(cfg, Box::new(NullCipher)).protect(&pdu, 64, &mut sdu);
    let crc = format!("0x{:08x}", crc32_ieee(&sdu[..sdu.len() - 4]));
    let mut frame = eth_data_frame(&sdu);
    let pad = 60 - frame.len();
    frame.resize(60, 0);
    let pcap = dir.join("crc.pcap");
    write_pcap(&pcap, &[frame]);
    let fields = ["rina.efcp.ack_sn", "rina.efcp.crc", "rina.efcp.padding"];
    let rows = tshark(&pcap, &["-o", "rina_efcp.crc:TRUE"], &fields);
    assert_eq!(rows[0], ["7", &crc, &"00".repeat(pad)], "{rows:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The CRC-32 rina-core's SDU protection appends (IEEE), computed here
/// bit by bit so that the test does not trust the code it checks.
fn crc32_ieee(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A management PDU from address 1 to 2 carrying `payload`, in a tagged
/// shim-eth frame between two fixed MAC addresses.
fn mgmt_eth_frame(payload: &[u8]) -> Vec<u8> {
    let (mac_a, mac_b) = (MacAddr([2, 0, 0, 0, 0, 0xa]), MacAddr([2, 0, 0, 0, 0, 0xb]));
    let mut p = Pci::new(PduType::Mgmt);
    (p.src_addr, p.dst_addr) = (1, 2);
    let mut sdu = vec![64u8];
    pci::encode_data(&DtConstants::default(), &p, payload, &mut sdu).unwrap();
    let mut f = FrameHeader {
        dst: mac_b,
        src: mac_a,
        vlan: Some(10),
        ethertype: ETH_P_RINA,
    }
    .to_vec();
    f.extend(&sdu);
    f
}

/// A management fragment header (`0xF6`, message id, index, count, total
/// length) and `data`.
fn mgmt_fragment(msg_id: u32, index: u16, count: u16, total: u32, data: &[u8]) -> Vec<u8> {
    let mut v = vec![0xF6];
    v.extend(msg_id.to_be_bytes());
    v.extend(index.to_be_bytes());
    v.extend(count.to_be_bytes());
    v.extend(total.to_be_bytes());
    v.extend(data);
    v
}

/// Hostile fragments: one whose reassembled message is itself a fragment
/// (the daemon drops such a message; the dissector recursed once per 13
/// bytes of nesting in the first pass, 545 MB for one 65 KB frame, and
/// without end in a second pass, until Lua's stack overflowed), one that
/// says it has no pieces, and a reassembled message that is not CDAP.
/// Each is marked malformed, with no Lua error, in one pass and in two.
#[test]
fn tshark_marks_hostile_management_fragments_without_lua_errors() {
    if let Some(why) = cannot_run(false) {
        println!("{why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("rina-wireshark-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let never_completes = mgmt_fragment(2, 0, 2, 100, &[0x10, 0x08]);
    let mut nested = vec![0xC0, 0x10, 0x08];
    // As deep as one PDU takes (each level costs the dissector a copy).
    for i in 0..60 {
        nested = mgmt_fragment(i + 10, 0, 1, nested.len() as u32, &nested);
    }
    let payloads = [
        mgmt_fragment(1, 0, 1, never_completes.len() as u32, &never_completes),
        nested,
        mgmt_fragment(3, 0, 0, 0, &[]),
        mgmt_fragment(4, 0, 1, 2, &[0xC0, 0x08]),
    ];
    let frames: Vec<Vec<u8>> = payloads.iter().map(|p| mgmt_eth_frame(p)).collect();
    let pcap = dir.join("hostile.pcap");
    write_pcap(&pcap, &frames);
    for passes in [&[][..], &["-2"]] {
        let rows = tshark(&pcap, passes, &["_ws.expert.message"]);
        assert_eq!(rows.len(), 4, "{rows:?}");
        let all = rows.concat().join(" ");
        assert!(!all.contains("Lua Error"), "{passes:?}: {rows:?}");
        for r in &rows[..2] {
            assert!(
                r.join(" ")
                    .contains("fragment inside a reassembled message"),
                "{passes:?}: {rows:?}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn tshark_reassembles_a_management_message_cut_into_fragments() {
    if let Some(why) = cannot_run(false) {
        println!("{why}");
        return;
    }
    use rina_core::mgmt_frag::Fragmenter;
    use rina_core::normal::{CDAP_DISCRIMINATOR, FRAGMENT_DISCRIMINATOR};
    use rina_wire::cdap::CdapMessage;
    let dir = std::env::temp_dir().join(format!("rina-wireshark-frag-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A flooded database too large for one PDU, as enrollment sends it.
    let msg = CdapMessage::write("FlowStateObjects", "/ra/fsos", vec![7u8; 3000]);
    let mut whole = vec![CDAP_DISCRIMINATOR];
    whole.extend(msg.encode());
    let frags = Fragmenter::split(41, &whole, 1200).unwrap();
    assert_eq!(frags.len(), 3);
    // The pieces out of order, as a lower DIF may deliver them.
    let frames: Vec<Vec<u8>> = [&frags[1], &frags[0], &frags[2]]
        .iter()
        .map(|f| mgmt_eth_frame(&[&[FRAGMENT_DISCRIMINATOR][..], f].concat()))
        .collect();
    let pcap = dir.join("frag.pcap");
    write_pcap(&pcap, &frames);
    let fields = [
        "rina.mgmt.frag.index",
        "rina.mgmt.frag.reassembled_in",
        "rina.cdap.opcode",
        "rina.cdap.obj_name",
    ];
    // Two passes: every piece points to the frame that completed it.
    let rows = tshark(&pcap, &["-2"], &fields);
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert_eq!(rows[0][..2], ["1", "3"], "{rows:?}");
    assert_eq!(rows[1][..2], ["0", "3"], "{rows:?}");
    assert!(rows[0].get(3).is_none_or(|v| v.is_empty()), "{rows:?}");
    assert_eq!(rows[2][0], "2", "{rows:?}");
    assert_eq!(rows[2][1], "3", "{rows:?}");
    assert_eq!(
        rows[2][3], "/ra/fsos",
        "the message decoded whole: {rows:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
