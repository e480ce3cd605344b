//! A normal DIF over a shim DIF over UDP, in real `rinad` processes on
//! loopback: N-1 flows set up by the daemons, applications allocating by
//! name, reliable and unreliable cubes, large SDUs, and a fake neighbour
//! feeding the daemon malformed PDUs.

mod common;

use common::free_port;

use common::{
    counter, echo_server_all, held_after_end, name, normal_over_udp, reliable_in_order, wait_for,
    Daemon,
};
use rina::QosSpec;
use rina_core::normal::LINGER_MAX;
use rina_core::system::ENDED_HOLD_MAX;
use rina_wire::pci::{self, ControlBody, DtConstants, Pci, PduType};
use rina_wire::shim_udp::{AllocResult, Datagram};
use std::net::UdpSocket;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(15);

/// System `me` at `addr` (shim on `port`), neighbour of `peer` at
/// `peer_addr` (shim on `peer_port`), with `names` in its normal IPCP.
fn system(
    me: &str,
    addr: u64,
    port: u16,
    peer: &str,
    peer_addr: u64,
    peer_port: u16,
    names: &str,
) -> String {
    normal_over_udp(me, (addr, port), (peer, peer_addr, peer_port), names, "")
}

/// A system's configuration with PDUs of at most 1450 bytes in its normal
/// DIF, so that large SDUs are cut into many fragments.
fn small_pdus(cfg: String) -> String {
    cfg.replace("crc = true", "crc = true\nmax_pdu = 1450")
}

/// Two systems whose normal IPCPs are neighbours over the shim DIF.
fn pair() -> (Daemon, Daemon) {
    pair_with("\"echo\" = 2", |cfg| cfg)
}

// [`pair`] with `names` in alpha's directory and each configuration
// passed through `edit`.
use common::normal_pair_with as pair_with;

#[test]
fn a_normal_dif_over_shim_udp_carries_flows_by_name() {
    let (alpha, beta) = pair();
    let _srv = echo_server_all(&beta, "net");
    let mut c = alpha.client();

    // Unreliable cube.
    let flow = c
        .allocate(
            &name("probe"),
            &name("echo"),
            Some("net"),
            &QosSpec::default(),
        )
        .unwrap();
    assert_eq!(flow.info().dif, "net");
    let mut buf = vec![0u8; 70_000];
    flow.write(b"over two DIFs").unwrap();
    let n = flow.read_timeout(&mut buf, T).unwrap().expect("echo");
    assert_eq!(&buf[..n], b"over two DIFs");

    // Reliable cube: 64 KiB SDUs (fragmented into 9000-byte PDUs) and a
    // burst that must come back complete and in order.
    let reliable = reliable_in_order();
    let flow = c
        .allocate(&name("bulk"), &name("echo"), Some("net"), &reliable)
        .unwrap();
    assert!(flow.info().max_sdu >= 65_536);
    let big: Vec<u8> = (0..65_536u32).map(|i| (i % 251) as u8).collect();
    flow.write(&big).unwrap();
    let n = flow
        .read_timeout(&mut buf, T)
        .unwrap()
        .expect("echo of 64 KiB");
    assert_eq!(&buf[..n], &big[..]);
    // The same through the flow's socket instead of its rings: the
    // fragments' buffers are joined once for the socket.
    let mut plain = alpha.client();
    plain.set_rings(false);
    let on_socket = plain
        .allocate(&name("bulk2"), &name("echo"), Some("net"), &reliable)
        .unwrap();
    on_socket.write(&big).unwrap();
    let n = on_socket
        .read_timeout(&mut buf, T)
        .unwrap()
        .expect("echo of 64 KiB on a socket");
    assert_eq!(&buf[..n], &big[..]);
    drop(on_socket);
    let echoed = {
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..2000u32 {
                    flow.write(&i.to_be_bytes().repeat(100)).unwrap();
                }
            });
            let mut got = Vec::new();
            while got.len() < 2000 {
                let n = flow
                    .read_timeout(&mut buf, T)
                    .unwrap()
                    .expect("every SDU of the burst comes back");
                got.push(u32::from_be_bytes(buf[..4].try_into().unwrap()));
                assert_eq!(n, 400);
            }
            got
        })
    };
    assert_eq!(echoed, (0..2000).collect::<Vec<_>>());
    let flows = c.list_flows().unwrap();
    assert_eq!(flows.len(), 2);
    assert!(flows.iter().all(|f| f.info.dif == "net"));

    // The RIB shows the DIF as management sees it.
    let rib = c.read_rib("alpha.net", None, None).unwrap();
    let get = |n: &str| {
        rib.iter()
            .find(|o| o.name == n)
            .unwrap_or_else(|| panic!("{n} not in the RIB: {rib:#?}"))
    };
    assert_eq!(get("/difm/nam/addr").value, "1");
    assert_eq!(get("/difm/nsm/dft/key=echo").value, "2");
    assert!(get("/difm/enr/neighs/pn=beta.net")
        .value
        .contains("up on N-1 port"));
    assert!(get("/ra/pduft/key=2").value.starts_with("N-1 ports"));
    assert_eq!(get("/ra/qoscubes/id=2").class, "QoSCube");
    assert_eq!(rib.iter().filter(|o| o.class == "Flow").count(), 2);
    let sub = c.read_rib("alpha.net", Some("/ra/pduft"), Some(1)).unwrap();
    assert!(sub.iter().all(|o| o.name.starts_with("/ra/pduft")));
    let e = c.read_rib("nope", None, None).unwrap_err();
    assert!(e.to_string().contains("alpha.net"), "{e}");
}

#[test]
fn names_unknown_to_the_normal_dif_are_refused() {
    let (alpha, _beta) = pair();
    let mut c = alpha.client();
    let e = c
        .allocate(
            &name("x"),
            &name("nobody"),
            Some("net"),
            &QosSpec::default(),
        )
        .unwrap_err();
    assert_eq!(e.kind(), rina::ErrorKind::NameNotFound, "{e}");
    // In the directory, but nobody registered it at beta.
    let e = c
        .allocate(&name("x"), &name("echo"), Some("net"), &QosSpec::default())
        .unwrap_err();
    assert_eq!(e.kind(), rina::ErrorKind::NotRegistered, "{e}");
}

/// Plays the neighbour `fake.net` over raw UDP: answers alpha's N-1 flow
/// request, then sends it a corpus of malformed frames.
#[test]
fn malformed_pdus_from_a_neighbour_crash_nothing() {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(T)).unwrap();
    let fake = sock.local_addr().unwrap().port();
    let pa = free_port();
    let alpha = Daemon::start_with("alpha", &system("alpha", 1, pa, "fake", 2, fake, ""));
    // alpha (address 1 < 2) asks for the N-1 flow.
    let mut buf = [0u8; 2048];
    let (n, from) = sock.recv_from(&mut buf).unwrap();
    let Datagram::AllocReq { src_port, dst, .. } = Datagram::parse(&buf[..n]).unwrap() else {
        panic!("expected an allocation request")
    };
    assert_eq!(dst, name("fake.net"));
    let resp = Datagram::AllocResp {
        dst_port: src_port,
        src_port: 77,
        result: AllocResult::Accepted,
        max_sdu: 65_000,
        reason: "",
        direct: None,
    };
    sock.send_to(&resp.to_vec(), from).unwrap();
    wait_for("the N-1 flow to the fake neighbour", T, || {
        counter(&alpha, "alpha.net", "neighbors_up") == 1
    });

    // Frames as alpha's DIF protects them: TTL byte, PDU, CRC-32.
    let c = DtConstants {
        max_pdu_size: 1400,
        ..DtConstants::default()
    };
    let protect = |pdu: &[u8], ttl: u8| {
        let mut f = vec![ttl];
        f.extend_from_slice(pdu);
        let crc = crc32(&f);
        f.extend_from_slice(&crc.to_be_bytes());
        f
    };
    let mut dt = Pci::new(PduType::Dt);
    dt.dst_addr = 1;
    dt.src_addr = 2;
    dt.dst_cep = 12345;
    dt.seq = 1;
    let mut good_dt = Vec::new();
    pci::encode_data(&c, &dt, &[0x07, 1, 2, 3], &mut good_dt).unwrap();
    let mut ack = Pci::new(PduType::Ack);
    ack.dst_addr = 1;
    ack.dst_cep = 999;
    let mut good_ack = Vec::new();
    pci::encode_control(&c, &ack, &ControlBody::Ack { ack_sn: 5 }, &mut good_ack).unwrap();
    let mut mgmt = Pci::new(PduType::Mgmt);
    mgmt.dst_addr = 1;
    let mut bad_mgmt = Vec::new();
    pci::encode_data(&c, &mgmt, &[0xff; 40], &mut bad_mgmt).unwrap();
    let mut wrong_version = good_dt.clone();
    wrong_version[0] = 9;
    let mut bad_crc = protect(&good_dt, 64);
    let last = bad_crc.len() - 1;
    bad_crc[last] ^= 1;
    let corpus: Vec<Vec<u8>> = vec![
        vec![],
        vec![64],
        vec![0xff; 3],
        protect(&[], 64),
        protect(&good_dt[..10], 64),
        protect(&wrong_version, 64),
        bad_crc,
        protect(&good_dt, 0),
        protect(&good_dt, 64),
        protect(&good_ack, 64),
        protect(&bad_mgmt, 64),
        protect(&[0xAA; 1500], 64),
        protect(&(0..=255u8).collect::<Vec<_>>(), 64),
    ];
    for frame in &corpus {
        let d = Datagram::Data {
            dst_port: src_port,
            sdu: frame,
        };
        sock.send_to(&d.to_vec(), from).unwrap();
    }
    let bad = |a: &Daemon| {
        [
            "rx_malformed",
            "rx_bad_protection",
            "rx_unknown_cep",
            "rx_ttl_expired",
            "rx_fa_malformed",
            "rx_mgmt_unhandled",
        ]
        .iter()
        .map(|k| counter(a, "alpha.net", k))
        .sum::<u64>()
            + counter(a, "alpha.udp", "rx_malformed")
    };
    wait_for("every bad frame to be counted", T, || {
        let n = bad(&alpha);
        if n < corpus.len() as u64 {
            eprintln!(
                "{n} of {} counted: {:?}",
                corpus.len(),
                alpha.client().list_ipcps().unwrap()
            );
        }
        n >= corpus.len() as u64
    });
    // Still alive and serving.
    assert_eq!(alpha.client().list_ipcps().unwrap().len(), 2);
    assert_eq!(counter(&alpha, "alpha.net", "neighbors_up"), 1);
}

/// CRC-32 (IEEE), as the SDU-protection policy computes it.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn n1_flows_come_up_without_anyone_talking_to_the_initiator() {
    // Only beta (the higher address, which waits to be called) is asked;
    // alpha must set up the N-1 flow on its own timer.
    let (pa, pb) = (free_port(), free_port());
    let beta = Daemon::start_with("beta", &system("beta", 2, pb, "alpha", 1, pa, ""));
    let dir = common::temp_dir("alpha-untouched");
    let conf = dir.join("alpha.toml");
    std::fs::write(&conf, system("alpha", 1, pa, "beta", 2, pb, "")).unwrap();
    // Started without ever connecting to its socket: nothing wakes it.
    let mut alpha = std::process::Command::new(env!("CARGO_BIN_EXE_rinad"))
        .arg("--config")
        .arg(&conf)
        .arg("--socket")
        .arg(dir.join("alpha.sock"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let up = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for("alpha to call beta by itself", T, || {
            counter(&beta, "beta.net", "neighbors_up") == 1
        })
    }));
    let _ = alpha.kill();
    let _ = alpha.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(up.is_ok(), "alpha never set up its N-1 flow");
}

/// A writer of large SDUs on an unreliable flow, flat out: the daemon
/// takes from one flow per turn about what the RMT sends in a turn, so the
/// writer's own RMT queue never overflows (before, a turn took 64 SDUs of
/// 45 PDUs each into a queue of 1,000 PDUs that sends 256 a turn, and
/// dropped whole SDUs, which a TCP through `rina-ip` paid for with
/// retransmissions). What is lost, if anything, is lost at the receiver.
#[test]
fn large_sdus_written_flat_out_do_not_overflow_the_writers_rmt() {
    let (alpha, beta) = pair_with("\"sink\" = 2", small_pdus);
    let mut srv = beta.client();
    srv.register(&name("sink"), Some("net")).unwrap();
    let sink = std::thread::spawn(move || {
        let req = srv
            .next_request_timeout(T)
            .unwrap()
            .expect("a flow request");
        let flow = srv.accept(&req).unwrap();
        let mut buf = vec![0u8; 70_000];
        let mut got = 0u64;
        while let Ok(Some(_)) = flow.read_timeout(&mut buf, Duration::from_secs(2)) {
            got += 1;
        }
        got
    });
    let mut c = alpha.client();
    let flow = c
        .allocate(
            &name("src"),
            &name("sink"),
            Some("net"),
            &QosSpec::default(),
        )
        .unwrap();
    let sdu = vec![0x5au8; 60_000];
    let sent = 600u64;
    for _ in 0..sent {
        flow.write(&sdu).unwrap();
    }
    let got = sink.join().unwrap();
    let queued = counter(&alpha, "alpha.net", "rmt_queued");
    let drops = counter(&alpha, "alpha.net", "rmt_queue_drops");
    assert_eq!(drops, 0, "the writer's RMT dropped {drops} PDUs");
    // 600 SDUs of 42 fragments each went through the queue.
    assert!(queued >= sent * 42, "{queued} PDUs queued");
    assert!(got > 0, "nothing arrived");
}

/// SDUs cut into fragments reach an application that does not read for a
/// while: past what its socket or ring holds, the daemon holds each SDU in
/// the buffers of its fragments and gathers them into the socket or the
/// ring when room comes. Every SDU the reader gets is whole and in order,
/// more arrive than the socket or ring alone could hold but no more than
/// it and the daemon's 4 MiB per flow (the daemon once held 1,024 SDUs
/// whatever their size), and what the reader got plus what the daemon
/// dropped is what the DIF delivered.
#[test]
fn fragmented_sdus_held_for_a_late_reader_arrive_whole_and_in_order() {
    for rings in [false, true] {
        held_sdus_arrive_whole(rings);
    }
}

fn held_sdus_arrive_whole(rings: bool) {
    const SDUS: u32 = 400;
    const LEN: usize = 30_000;
    // A socket holds 1 MiB, a ring 4 MiB: about 35 and 138 of these SDUs,
    // and at most 70 and 140 (the kernel doubles a socket's buffer to
    // count its overhead in).
    let (holds, holds_at_most) = if rings { (138, 140) } else { (35, 70) };
    let (alpha, beta) = pair_with("\"late\" = 2", small_pdus);
    let (flow, late) = early_to_late(&alpha, &beta, rings, &QosSpec::default());
    assert_eq!(late.has_rings(), rings);
    let mut sdu = vec![0u8; LEN];
    for i in 0..SDUS {
        sdu[..4].copy_from_slice(&i.to_le_bytes());
        sdu[4..].fill(i as u8);
        flow.write(&sdu).unwrap();
    }
    // The reader has read nothing yet: wait until the DIF stops delivering.
    let port = late.info().port;
    wait_until_delivery_stops(&beta, port, SDUS);
    let mut buf = vec![0u8; LEN + 1];
    let mut read = 0u64;
    let mut next = 0u32;
    while let Some(n) = late.read_timeout(&mut buf, Duration::from_secs(1)).unwrap() {
        assert_eq!(n, LEN, "rings {rings}: SDU {read} has {n} bytes");
        let i = u32::from_le_bytes(buf[..4].try_into().unwrap());
        assert!(i >= next, "rings {rings}: SDU {i} after {next}");
        assert!(
            buf[4..n].iter().all(|&b| b == i as u8),
            "rings {rings}: SDU {i} is corrupt"
        );
        next = i + 1;
        read += 1;
    }
    let c = flow_counters(&beta, port);
    // Beyond the socket or ring, the daemon holds 4 MiB of a flow's SDUs
    // for a reader that does not read (1,024 SDUs of these would be 29 MiB).
    let held_at_most = holds_at_most + (4 << 20) / LEN as u64 + 1;
    assert!(
        read <= held_at_most,
        "rings {rings}: {read} SDUs read, more than the {held_at_most} the socket or ring \
         and 4 MiB hold ({} delivered, {} dropped)",
        c.sdus_in,
        c.drops_in
    );
    assert!(
        read > holds,
        "rings {rings}: {read} SDUs read, no more than the {holds} the socket or ring holds \
         ({} delivered, {} dropped)",
        c.sdus_in,
        c.drops_in
    );
    assert_eq!(
        read + c.drops_in,
        c.sdus_in,
        "rings {rings}: read plus dropped is not what the DIF delivered"
    );
}

/// A flow from `early` at `alpha` to `late` at `beta` (registered in DIF
/// `net`), with or without rings, for `qos`: the writer's end and the
/// reader's.
fn early_to_late(
    alpha: &Daemon,
    beta: &Daemon,
    rings: bool,
    qos: &QosSpec,
) -> (rina::Flow, rina::Flow) {
    let mut srv = beta.client();
    srv.set_rings(rings);
    srv.register(&name("late"), Some("net")).unwrap();
    let acceptor = std::thread::spawn(move || {
        let req = srv
            .next_request_timeout(T)
            .unwrap()
            .expect("a flow request");
        srv.accept(&req).unwrap()
    });
    let mut c = alpha.client();
    c.set_rings(rings);
    let flow = c
        .allocate(&name("early"), &name("late"), Some("net"), qos)
        .unwrap();
    (flow, acceptor.join().unwrap())
}

/// The counters of flow `port` in daemon `d`.
fn flow_counters(d: &Daemon, port: u32) -> rina::FlowCounters {
    let all = d.client().list_flows().unwrap();
    all.iter()
        .find(|f| f.info.port == port)
        .expect("the flow")
        .counters
}

/// Waits until daemon `d` has delivered `sdus` SDUs on flow `port`, or
/// none more for 500 ms; returns the flow's counters then.
fn wait_until_delivery_stops(d: &Daemon, port: u32, sdus: u32) -> rina::FlowCounters {
    let mut last = (u64::MAX, std::time::Instant::now());
    wait_for("the DIF to deliver the burst", T, || {
        let n = flow_counters(d, port).sdus_in;
        if n != last.0 {
            last = (n, std::time::Instant::now());
        }
        n == u64::from(sdus) || last.1.elapsed() > Duration::from_millis(500)
    });
    flow_counters(d, port)
}

/// A reliable cube whose window (8,192 PDUs) is wider than what the daemon
/// holds for a late reader on a flow without one (1,024 SDUs beyond the
/// socket or ring): the window bounds what is held, so the daemon keeps
/// every SDU the DIF delivers, and a reader that starts late still gets
/// all of them, in order, with none dropped. Before the daemon asked the
/// core whether a flow's window bounds it, SDUs beyond its own bound were
/// dropped there and their credit given back, and the reliable flow lost
/// them for good.
#[test]
fn a_reliable_flow_wider_than_the_daemons_hold_loses_nothing_to_a_late_reader() {
    for rings in [false, true] {
        wide_window_loses_nothing(rings);
    }
}

/// Two cubes, the reliable one with a window of 8,192 PDUs.
fn wide_reliable_cube(cfg: String) -> String {
    cfg.replace(
        "crc = true",
        "crc = true\n\n[[ipcp.qos_cube]]\nid = 1\nname = \"unreliable\"\n\n\
         [[ipcp.qos_cube]]\nid = 2\nname = \"reliable\"\nreliable = true\n\n\
         [ipcp.qos_cube.efcp]\nwindow = 8192\n",
    )
}

fn wide_window_loses_nothing(rings: bool) {
    // More than a ring (about 2,730 of these) and the daemon's own bound
    // (1,024) hold together, fewer than the window lets through.
    const SDUS: u32 = 6_000;
    const LEN: usize = 1_400;
    let (alpha, beta) = pair_with("\"late\" = 2", wide_reliable_cube);
    let reliable = reliable_in_order();
    let (flow, late) = early_to_late(&alpha, &beta, rings, &reliable);
    let writer = write_numbered(flow, SDUS, LEN);
    // The reader reads nothing until the DIF stops delivering.
    let port = late.info().port;
    let held = wait_until_delivery_stops(&beta, port, SDUS);
    let next = read_numbered(&late, SDUS, LEN, &format!("rings {rings}"));
    let _flow = writer.join().unwrap();
    let c = flow_counters(&beta, port);
    assert_eq!(
        (next, c.drops_in),
        (SDUS, 0),
        "rings {rings}: SDUs read and dropped ({} delivered before the reader started)",
        held.sdus_in
    );
    assert!(
        held.sdus_in > 2_730 + 1_024,
        "rings {rings}: the DIF delivered only {} SDUs before the reader started, \
         fewer than the ring and the daemon's own bound hold",
        held.sdus_in
    );
}

/// A writer on its flow's socket far ahead of a narrow window (16 PDUs)
/// and of a reader that starts late: the SDU the closed window refused
/// waits in the sender's daemon, which stops reading the writer's socket
/// until the flow is writable, so the writer blocks. The reader gets
/// every SDU in order, and neither daemon drops one.
#[test]
fn a_socket_writer_ahead_of_a_narrow_window_loses_nothing() {
    const SDUS: u32 = 3_000;
    const LEN: usize = 1_000;
    let narrow = |cfg: String| wide_reliable_cube(cfg).replace("window = 8192", "window = 16");
    let (alpha, beta) = pair_with("\"late\" = 2", narrow);
    let reliable = reliable_in_order();
    let (flow, late) = early_to_late(&alpha, &beta, false, &reliable);
    assert!(!flow.has_rings() && !late.has_rings());
    let sender_port = flow.info().port;
    let writer = write_numbered(flow, SDUS, LEN);
    // The reader starts once the flow has stopped delivering: the window
    // and the sockets are full, the writer blocked.
    let port = late.info().port;
    let held = wait_until_delivery_stops(&beta, port, SDUS);
    assert!(
        held.sdus_in < u64::from(SDUS),
        "the whole burst was delivered before the reader started: nothing waited"
    );
    let next = read_numbered(&late, SDUS, LEN, "socket");
    let _flow = writer.join().unwrap();
    assert_eq!(next, SDUS, "SDUs read");
    assert_eq!(
        flow_counters(&alpha, sender_port).drops_out,
        0,
        "dropped by the sender's daemon"
    );
    assert_eq!(
        flow_counters(&beta, port).drops_in,
        0,
        "dropped by the reader's daemon"
    );
}

/// Writes `sdus` SDUs of `len` bytes on `flow` from a thread of its own,
/// each its number (4 bytes) and then that number's low byte throughout;
/// the thread gives the flow back.
fn write_numbered(flow: rina::Flow, sdus: u32, len: usize) -> std::thread::JoinHandle<rina::Flow> {
    std::thread::spawn(move || {
        let mut sdu = vec![0u8; len];
        for i in 0..sdus {
            sdu[..4].copy_from_slice(&i.to_le_bytes());
            sdu[4..].fill(i as u8);
            flow.write(&sdu).unwrap();
        }
        flow
    })
}

/// Reads what [`write_numbered`] wrote, up to `sdus` SDUs or until none
/// comes for `T`, checking that each is whole, intact and the next one
/// due (`what` names the case in a failure): how many it read.
fn read_numbered(flow: &rina::Flow, sdus: u32, len: usize, what: &str) -> u32 {
    let mut buf = vec![0u8; len + 1];
    let mut next = 0u32;
    while next < sdus {
        let Some(n) = flow.read_timeout(&mut buf, T).unwrap() else {
            break;
        };
        assert_eq!(n, len, "{what}: SDU {next} has {n} bytes");
        let i = u32::from_le_bytes(buf[..4].try_into().unwrap());
        assert_eq!(i, next, "{what}: SDU {i} where {next} was due");
        assert!(
            buf[4..n].iter().all(|&b| b == i as u8),
            "{what}: SDU {i} is corrupt"
        );
        next += 1;
    }
    next
}

/// SDUs an application writes just before it closes its flow reach the
/// other end before the end of the flow does. The sending daemon reads
/// what the application left in its ring before it deallocates; the
/// receiving IPCP, which may take the SDUs and the DEALLOC in one batch,
/// hands the SDUs out before it closes the flow. Twenty flows a case,
/// since the two need to arrive together.
#[test]
fn sdus_written_just_before_a_close_reach_the_reader() {
    let (alpha, beta) = pair_with("\"late\" = 2", |cfg| cfg);
    for (rings, qos, what) in [
        (false, QosSpec::default(), "socket, unreliable"),
        (false, reliable_in_order(), "socket, reliable"),
        (true, QosSpec::default(), "rings, unreliable"),
        (true, reliable_in_order(), "rings, reliable"),
    ] {
        for round in 0..20 {
            let (flow, late) = early_to_late(&alpha, &beta, rings, &qos);
            for i in 0..5u8 {
                flow.write(&[i; 100]).unwrap();
            }
            drop(flow);
            let mut buf = [0u8; 200];
            let mut got = Vec::new();
            while let Ok(Some(n)) = late.read_timeout(&mut buf, T) {
                got.push(buf[..n].to_vec());
            }
            let want: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 100]).collect();
            assert_eq!(got, want, "{what}, flow {round}");
        }
    }
}

/// Writes SDUs of 1,000 bytes on `flow` until one has waited 500 ms: the
/// sender's daemon holds an SDU the shut window refused and reads no more.
fn write_until_blocked(flow: &rina::Flow) {
    let sdu = [7u8; 1_000];
    let start = Instant::now();
    while flow
        .write_timeout(&sdu, Duration::from_millis(500))
        .unwrap()
    {
        assert!(start.elapsed() < T * 4, "the writer never blocked");
    }
}

/// Waits until daemon `d` no longer lists flow `port` (`what` says which).
fn wait_unlisted(d: &Daemon, port: u32, what: &str) {
    wait_for(what, T, || {
        std::thread::sleep(Duration::from_millis(50));
        !listed(d, port)
    });
}

/// Whether daemon `d` lists flow `port`.
fn listed(d: &Daemon, port: u32) -> bool {
    let flows = d.client().list_flows().unwrap();
    flows.iter().any(|f| f.info.port == port)
}

/// An application closes its reliable flow while the sender's daemon holds
/// an SDU the window refused, and the window never opens again (the
/// reader's application accepted the flow and never reads). The flow
/// stays for the SDUs left in case the window opens, but no longer than
/// the system gives a closed flow ([`LINGER_MAX`]); then it is closed and
/// counted (`app_close_expired`). Before, the daemon did not look at the
/// application's socket while it held the SDU, so it missed the close
/// (its one event), and a ring flow stayed open while an SDU was held: both
/// flows were still listed, with their descriptors, slots and the user's
/// quota, 40 s after the close, and would have been for good.
///
/// The other way, the reader's application wrote more than the closing
/// application's socket or ring takes: when the system ends the flow, the
/// daemon still holds some for an application that has gone, so the flow
/// closes at once. (For a while, the daemon kept such a flow open another
/// [`ENDED_HOLD_MAX`] for an application that would never read.)
#[test]
fn a_flow_closed_while_its_window_stays_shut_is_closed_after_linger_max() {
    let (alpha, beta) = pair_with("\"late\" = 2", wide_reliable_cube);
    let reliable = reliable_in_order();
    let mut flows = Vec::new();
    let mut readers = Vec::new();
    for rings in [false, true] {
        let (flow, late) = early_to_late(&alpha, &beta, rings, &reliable);
        assert_eq!(flow.has_rings(), rings);
        write_until_blocked(&flow);
        let sdu = [3u8; 1_400];
        for _ in 0..4_000 {
            if !late
                .write_timeout(&sdu, Duration::from_millis(500))
                .unwrap()
            {
                break;
            }
        }
        flows.push(flow);
        readers.push(late);
    }
    let ports: Vec<u32> = flows.iter().map(|f| f.info().port).collect();
    drop(flows);
    let closed = Instant::now();
    // Kept a while, for the SDUs left should the window open.
    std::thread::sleep(Duration::from_secs(2));
    for &port in &ports {
        assert!(listed(&alpha, port), "flow {port} closed at once");
    }
    wait_for(
        "the flows to be closed after LINGER_MAX",
        LINGER_MAX + Duration::from_secs(10),
        || {
            std::thread::sleep(Duration::from_millis(250));
            ports.iter().all(|&port| !listed(&alpha, port))
        },
    );
    assert!(
        closed.elapsed() >= LINGER_MAX - Duration::from_secs(1),
        "closed after {:?}, before LINGER_MAX",
        closed.elapsed()
    );
    assert_eq!(counter(&alpha, "alpha.net", "app_close_expired"), 2);
    assert_eq!(counter(&alpha, "alpha.net", "ended_hold_expired"), 0);
    drop(readers);
}

/// The local application writes until the shut window blocks it (the
/// peer's application never reads), and the peer writes more than the
/// local socket or ring takes and closes. The local writer is not left
/// blocked on an SDU the ended flow will never take: its writes are
/// dropped, and it still reads every SDU the peer sent, then the end.
/// Before, the daemon kept the SDU that waited for the window and read
/// the application no more: its writer stayed blocked (30 s, until the
/// flow's end closed), and with rings its close went unseen as long.
#[test]
fn a_writer_blocked_when_the_peer_ends_the_flow_is_released_and_reads_all_it_sent() {
    const LEN: usize = 1_400;
    let narrow = |cfg: String| wide_reliable_cube(cfg).replace("window = 8192", "window = 64");
    let (alpha, beta) = pair_with("\"late\" = 2", narrow);
    for rings in [false, true] {
        let what = if rings { "rings" } else { "socket" };
        // A little more than the socket (about 910 of these) or the ring
        // (about 2,730) takes, less than that and a window: all of it
        // reaches the reader's daemon, which holds the rest.
        let sdus: u32 = if rings { 2_780 } else { 940 };
        let (early, late) = early_to_late(&alpha, &beta, rings, &reliable_in_order());
        let (early_port, port) = (early.info().port, late.info().port);
        write_until_blocked(&late);
        drop(write_numbered(early, sdus, LEN).join().unwrap());
        wait_unlisted(&alpha, early_port, "the peer's flow to close");
        let held = held_after_end(&beta, port);
        assert!(held > 0, "{what}: nothing held, the test proves nothing");
        // The blocked writer is released: its writes go (and are dropped).
        let start = Instant::now();
        let sdu = [7u8; 1_000];
        let wrote = late.write_timeout(&sdu, Duration::from_secs(3));
        assert!(
            !matches!(wrote, Ok(false)),
            "{what}: the writer is still blocked after {:?}",
            start.elapsed()
        );
        assert_eq!(read_numbered(&late, sdus, LEN, what), sdus, "{what}");
        let mut buf = vec![0u8; LEN];
        let end = late.read_timeout(&mut buf, T).unwrap_err();
        assert_eq!(end.kind(), rina::ErrorKind::DaemonGone, "{what}: {end}");
    }
    assert_eq!(counter(&beta, "beta.net", "ended_hold_expired"), 0);
}

/// A writer that closes its reliable flow right after its last write,
/// while the sender's daemon holds an SDU the narrow window refused and
/// more wait in the socket (or ring), loses none of them to a reader that
/// starts late: the daemon sees the close, but the flow stays, drains as
/// the window opens, and closes once all has gone (well within
/// [`LINGER_MAX`]).
#[test]
fn a_writer_that_closes_ahead_of_a_late_reader_loses_nothing() {
    // More than two rings (the writer's and the reader's) hold.
    const SDUS: u32 = 12_000;
    const LEN: usize = 1_000;
    let narrow = |cfg: String| wide_reliable_cube(cfg).replace("window = 8192", "window = 16");
    let (alpha, beta) = pair_with("\"late\" = 2", narrow);
    let reliable = reliable_in_order();
    for rings in [false, true] {
        let (flow, late) = early_to_late(&alpha, &beta, rings, &reliable);
        let sender_port = flow.info().port;
        let writer = write_numbered(flow, SDUS, LEN);
        // The writer closes its flow as soon as its last write is taken.
        let closer = std::thread::spawn(move || drop(writer.join().unwrap()));
        let port = late.info().port;
        let held = wait_until_delivery_stops(&beta, port, SDUS);
        assert!(
            held.sdus_in < u64::from(SDUS),
            "rings {rings}: the whole burst was delivered before the reader started"
        );
        let what = if rings { "rings" } else { "socket" };
        assert_eq!(read_numbered(&late, SDUS, LEN, what), SDUS, "{what}");
        closer.join().unwrap();
        wait_for("the sender's flow to close", T, || {
            std::thread::sleep(Duration::from_millis(50));
            !listed(&alpha, sender_port)
        });
    }
    assert_eq!(counter(&alpha, "alpha.net", "app_close_expired"), 0);
}

/// The peer writes a burst on a wide reliable flow and closes it while the
/// reader has read nothing. The peer closes once the burst is acknowledged,
/// so its close comes while the reader's daemon holds most of it (beyond
/// the socket or ring): the flow's end stays open until the reader has
/// taken every SDU, and then closes. Before, the daemon handed the reader
/// what fitted and dropped the rest with the flow: `rina-gw` lost 145 KB
/// of 2 MB so once.
#[test]
fn a_reader_late_for_a_flow_its_peer_closed_still_gets_all_that_was_delivered() {
    const SDUS: u32 = 6_000;
    const LEN: usize = 1_400;
    let (alpha, beta) = pair_with("\"late\" = 2", wide_reliable_cube);
    for rings in [false, true] {
        let what = if rings { "rings" } else { "socket" };
        let (flow, late) = early_to_late(&alpha, &beta, rings, &reliable_in_order());
        let sender_port = flow.info().port;
        drop(write_numbered(flow, SDUS, LEN).join().unwrap());
        wait_unlisted(&alpha, sender_port, "the peer's flow to close");
        // The close has reached the reader's daemon, which lists the flow
        // with what its application has to read.
        let port = late.info().port;
        let held = held_after_end(&beta, port);
        assert!(held > 0 && held <= u64::from(SDUS), "{what}: {held} held");
        assert_eq!(read_numbered(&late, SDUS, LEN, what), SDUS, "{what}");
        let mut buf = vec![0u8; LEN];
        let end = late.read_timeout(&mut buf, T).unwrap_err();
        assert_eq!(end.kind(), rina::ErrorKind::DaemonGone, "{what}: {end}");
        assert!(!listed(&beta, port), "{what}: still listed after the end");
    }
    assert_eq!(counter(&beta, "beta.net", "ended_hold_expired"), 0);
}

/// A reader that never reads a flow its peer closed with SDUs held for it
/// does not keep the flow for good: its end closes [`ENDED_HOLD_MAX`]
/// after the close, counted (`ended_hold_expired`), with what was held;
/// the reader finds what fitted in its socket, and then the end.
#[test]
fn a_flow_its_peer_closed_is_not_kept_past_ended_hold_max_for_a_reader_that_never_reads() {
    const SDUS: u32 = 6_000;
    const LEN: usize = 1_400;
    let (alpha, beta) = pair_with("\"late\" = 2", wide_reliable_cube);
    let (flow, late) = early_to_late(&alpha, &beta, false, &reliable_in_order());
    let sender_port = flow.info().port;
    drop(write_numbered(flow, SDUS, LEN).join().unwrap());
    wait_unlisted(&alpha, sender_port, "the peer's flow to close");
    let closed = Instant::now();
    wait_for(
        "the end to close after ENDED_HOLD_MAX",
        ENDED_HOLD_MAX + Duration::from_secs(10),
        || {
            std::thread::sleep(Duration::from_millis(250));
            counter(&beta, "beta.net", "ended_hold_expired") == 1
        },
    );
    assert!(
        closed.elapsed() >= ENDED_HOLD_MAX - Duration::from_secs(1),
        "closed after {:?}, before ENDED_HOLD_MAX",
        closed.elapsed()
    );
    let mut buf = vec![0u8; LEN];
    let mut read = 0;
    let end = loop {
        match late.read_timeout(&mut buf, T) {
            Ok(Some(_)) => read += 1,
            Ok(None) => panic!("neither an SDU nor the end after {read} SDUs"),
            Err(e) => break e,
        }
    };
    assert_eq!(end.kind(), rina::ErrorKind::DaemonGone, "{end}");
    assert!(read > 0 && read < SDUS, "read {read} of {SDUS}");
}

/// The peer writes a last SDU and closes while the local application has
/// more than 128 SDUs written that its daemon has not read (the window is
/// shut: the peer reads nothing). The daemon hands the last SDU to the
/// application's socket and closes its end: the application reads the SDU
/// and then the end of the flow. Before, the daemon read at most 128 of
/// the packets left before it closed its end, and the application's next
/// read was "Connection reset by peer", ahead of the SDU.
#[test]
fn the_peers_last_sdu_comes_before_the_end_however_much_the_reader_left_unsent() {
    let (alpha, beta) = pair_with("\"late\" = 2", |cfg| cfg);
    let (flow, late) = early_to_late(&alpha, &beta, false, &reliable_in_order());
    write_until_blocked(&flow);
    late.write(b"bye").unwrap();
    drop(late);
    let mut buf = vec![0u8; 2_000];
    // Once the end has reached the daemon.
    let port = flow.info().port;
    wait_for("the flow to end at alpha", T, || {
        std::thread::sleep(Duration::from_millis(50));
        !listed(&alpha, port)
    });
    assert_eq!(flow.read_timeout(&mut buf, T).unwrap(), Some(3));
    assert_eq!(&buf[..3], b"bye");
    let end = flow.read_timeout(&mut buf, T).unwrap_err();
    assert_eq!(end.kind(), rina::ErrorKind::DaemonGone, "{end}");
    assert!(
        end.to_string().contains("is closed"),
        "not a plain end: {end}"
    );
}

#[test]
fn a_request_nobody_answers_is_refused_before_the_requester_gives_up_and_never_handed_out() {
    let (alpha, beta) = pair();
    // beta's server registers, then does not look at its requests.
    let mut server = beta.client();
    server.register(&name("echo"), Some("net")).unwrap();
    let mut c = alpha.client();
    let e = c
        .allocate(&name("x"), &name("echo"), Some("net"), &QosSpec::default())
        .unwrap_err();
    // The responder's accept_timeout (2 s) ends before the requester's
    // alloc_timeout (3 s): a refusal that says why, not a timeout.
    assert_eq!(e.kind(), rina::ErrorKind::Refused, "{e}");
    assert!(e.to_string().contains("did not answer in time"), "{e}");
    // The request was withdrawn before the server looked: it never sees it.
    let late = server
        .next_request_timeout(Duration::from_millis(300))
        .unwrap();
    assert!(
        late.is_none(),
        "a withdrawn request was handed out: {late:?}"
    );
}
