//! Flow bundles in real daemons: many flows over one descriptor each way,
//! reliable flows through a bundle whose reader is late, ends of flows,
//! and packets that are not frames of the bundle.

mod common;

use common::{echo_server_all, name, pair, reliable_in_order, wait_for, Daemon};
use rina::{Bundle, BundleEvent, ErrorKind, QosSpec};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::thread::JoinHandle;
use std::time::Duration;

const T: Duration = Duration::from_secs(15);

/// Descriptors daemon `d` holds open.
fn open_fds(d: &Daemon) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", d.child.id()))
        .unwrap()
        .count()
}

/// Registers `echo` in `dif` at `d`, the daemon accepting its flows into
/// one bundle, and echoes every SDU of every one of them until nothing
/// came for 5 s; returns how many flows ended meanwhile.
fn bundled_echo(d: &Daemon, dif: &str) -> JoinHandle<usize> {
    let mut c = d.client();
    let mut b = c.open_bundle().unwrap();
    c.register_accepting_bundled(&name("echo"), Some(dif), &b)
        .unwrap();
    std::thread::spawn(move || {
        let _registered = c;
        let mut ended = 0;
        loop {
            let (port, sdu) = match b.read_timeout(Duration::from_secs(5)) {
                Ok(Some(BundleEvent::Sdu { port, data })) => (port, data.to_vec()),
                Ok(Some(BundleEvent::Ended { .. })) => {
                    ended += 1;
                    continue;
                }
                _ => return ended,
            };
            if b.write(port, &sdu).is_err() {
                return ended;
            }
        }
    })
}

#[test]
fn hundreds_of_flows_share_one_descriptor_each_way_and_end_with_their_bundle() {
    let (alpha, beta) = pair(&["echo"]);
    let echo = bundled_echo(&beta, "udp");
    let (fds_alpha, fds_beta) = (open_fds(&alpha), open_fds(&beta));
    let mut c = alpha.client();
    let mut bundle = c.open_bundle().unwrap();
    let qos = QosSpec::default();
    let ports: Vec<u32> = (0..300)
        .map(|_| {
            let f = c
                .allocate_bundled(&bundle, &name("me"), &name("echo"), Some("udp"), &qos)
                .unwrap();
            assert_eq!(f.bundle, Some(bundle.id()));
            f.port
        })
        .collect();
    // One socket for the bundle (and the connection) in each daemon, not
    // one per flow.
    assert!(
        open_fds(&alpha) <= fds_alpha + 2,
        "alpha holds a descriptor per flow"
    );
    assert!(
        open_fds(&beta) <= fds_beta + 1,
        "beta holds a descriptor per flow"
    );
    let listed = c.list_flows().unwrap();
    assert_eq!(
        listed
            .iter()
            .filter(|f| f.info.bundle == Some(bundle.id()))
            .count(),
        300
    );
    for k in 0..3 {
        for &p in &ports {
            bundle.write(p, format!("{p}:{k}").as_bytes()).unwrap();
        }
    }
    let mut got: HashMap<u32, Vec<String>> = HashMap::new();
    for _ in 0..900 {
        match bundle.read_timeout(T).unwrap().expect("an echo in time") {
            BundleEvent::Sdu { port, data } => got
                .entry(port)
                .or_default()
                .push(String::from_utf8(data.to_vec()).unwrap()),
            BundleEvent::Ended { port } => panic!("flow {port} ended"),
        }
    }
    for &p in &ports {
        let want: Vec<String> = (0..3).map(|k| format!("{p}:{k}")).collect();
        assert_eq!(got[&p], want, "flow {p}'s echoes, in order");
    }
    // Closing one flow ends it at the other end; closing the bundle, the rest.
    bundle.close_flow(ports[0]).unwrap();
    wait_for("alpha to forget the flow closed", T, || {
        c.list_flows().unwrap().len() == 299
    });
    drop(bundle);
    wait_for("both daemons to forget every flow", T, || {
        c.list_flows().unwrap().is_empty() && beta.client().list_flows().unwrap().is_empty()
    });
    assert_eq!(
        echo.join().unwrap(),
        300,
        "the echo server saw every flow end"
    );
}

/// Two systems whose normal IPCPs are neighbours over the shim DIF, alpha
/// knowing `sink` at beta.
fn normal_pair() -> (Daemon, Daemon) {
    common::normal_pair_with("\"sink\" = 2", |cfg| cfg)
}

#[test]
fn a_late_reader_of_a_bundle_gets_every_sdu_of_its_reliable_flows_then_their_ends() {
    const SDUS: u32 = 6_000;
    const LEN: usize = 1_000;
    let (alpha, beta) = normal_pair();
    let mut sink = beta.client();
    let mut inbox = sink.open_bundle().unwrap();
    sink.register_accepting_bundled(&name("sink"), Some("net"), &inbox)
        .unwrap();
    let mut c = alpha.client();
    let out = c.open_bundle().unwrap();
    let ports: Vec<u32> = (0..2)
        .map(|_| {
            c.allocate_bundled(
                &out,
                &name("src"),
                &name("sink"),
                Some("net"),
                &reliable_in_order(),
            )
            .unwrap()
            .port
        })
        .collect();
    // 12 MB, far more than the windows, the daemons' holds and the bundle
    // sockets take while beta's application does not read: the writer
    // blocks, and each flow's window holds up the other's SDUs behind it.
    let writer = std::thread::spawn(move || {
        let mut sdu = vec![0u8; LEN];
        for k in 0..SDUS {
            for &p in &ports {
                sdu[..4].copy_from_slice(&k.to_be_bytes());
                sdu[4..8].copy_from_slice(&p.to_be_bytes());
                out.write(p, &sdu).unwrap();
            }
        }
        // Closed at once: what is still on its way arrives before the ends.
        for &p in &ports {
            out.close_flow(p).unwrap();
        }
        out
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(!writer.is_finished(), "the writer was held back");
    let mut next: HashMap<u32, u32> = HashMap::new();
    let mut ended = 0;
    while ended < 2 {
        match inbox.read_timeout(T).unwrap().expect("more in time") {
            BundleEvent::Sdu { port, data } => {
                assert_eq!(data.len(), LEN);
                let k = u32::from_be_bytes(data[..4].try_into().unwrap());
                let n = next.entry(port).or_default();
                assert_eq!(k, *n, "flow {port}: SDU {k} came where {n} was due");
                *n += 1;
            }
            BundleEvent::Ended { port } => {
                assert_eq!(next.get(&port), Some(&SDUS), "flow {port} ended early");
                ended += 1;
            }
        }
    }
    let _out = writer.join().unwrap();
    assert_eq!(next.len(), 2);
}

#[test]
fn what_is_not_a_frame_of_its_own_flows_is_counted_and_dropped() {
    let (alpha, beta) = pair(&["echo"]);
    let _echo = echo_server_all(&beta, "udp");
    let qos = QosSpec::default();
    // Another application's flow, with a descriptor of its own.
    let mut other = alpha.client();
    let theirs = other
        .allocate(&name("other"), &name("echo"), Some("udp"), &qos)
        .unwrap();
    let mut c = alpha.client();
    let mut bundle = c.open_bundle().unwrap();
    let mine = c
        .allocate_bundled(&bundle, &name("me"), &name("echo"), Some("udp"), &qos)
        .unwrap();
    // Nor may it put its flows in another connection's bundle.
    let foreign: Bundle = other.open_bundle().unwrap();
    let e = c
        .allocate_bundled(&foreign, &name("me"), &name("echo"), Some("udp"), &qos)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest, "{e}");
    // A connection holds a bounded number of bundles (each a descriptor).
    let more: Vec<Bundle> = (1..16).map(|_| c.open_bundle().unwrap()).collect();
    let e = c.open_bundle().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoResources, "{e}");
    drop(more);
    let fd = bundle.as_raw_fd();
    let send = |pkt: &[u8]| {
        // SAFETY: a valid socket and buffer.
        let n = unsafe { libc::send(fd, pkt.as_ptr().cast(), pkt.len(), 0) };
        assert_eq!(n as usize, pkt.len());
    };
    let mut forged =
        rina_wire::bundle::header(rina_wire::bundle::Kind::Sdu, theirs.info().port).to_vec();
    forged.extend_from_slice(b"not yours");
    send(&forged);
    send(&[9, 9, 9]);
    send(&[7, 0, 0, 0, 1, 0, 0, 0, 1]);
    send(&rina_wire::bundle::header(
        rina_wire::bundle::Kind::End,
        theirs.info().port,
    ));
    // The bundle's own flow still works, and the other flow is untouched.
    bundle.write(mine.port, b"ping").unwrap();
    match bundle.read_timeout(T).unwrap().expect("the echo") {
        BundleEvent::Sdu { port, data } => assert_eq!((port, data), (mine.port, &b"ping"[..])),
        e => panic!("{e:?}"),
    }
    let mut buf = [0u8; 64];
    assert_eq!(
        theirs
            .read_timeout(&mut buf, Duration::from_millis(300))
            .unwrap(),
        None,
        "the forged SDU went on another application's flow"
    );
    assert_eq!(common::roundtrip(&theirs, b"still open"), b"still open");
    // Counted: the daemon says how many when the bundle closes.
    let closed = format!("bundle closed bundle={} ", bundle.id());
    drop(bundle);
    wait_for("the bundle to close", T, || alpha.log().contains(&closed));
    let log = alpha.log();
    let line = log.lines().find(|l| l.contains(&closed)).unwrap();
    assert!(line.contains("bad_frames=4"), "{line}");
}

/// Stops (`true`) or resumes daemon `d`.
fn freeze(d: &Daemon, stop: bool) {
    let sig = if stop { libc::SIGSTOP } else { libc::SIGCONT };
    // SAFETY: a signal to our own child process.
    assert_eq!(unsafe { libc::kill(d.child.id() as i32, sig) }, 0);
}

/// Opens a bundle at `d` whose flows the daemon accepts for `sink` in `net`.
fn bundled_sink(d: &Daemon) -> (rina::Client, Bundle) {
    let mut c = d.client();
    let b = c.open_bundle().unwrap();
    c.register_accepting_bundled(&name("sink"), Some("net"), &b)
        .unwrap();
    (c, b)
}

/// Reads `bundle` until `flows` of its flows have ended: how many SDUs
/// each brought (numbered in their first 4 bytes, checked to come in
/// order), ends only after them.
fn read_until_ended(bundle: &mut Bundle, flows: usize) -> HashMap<u32, u32> {
    let mut next: HashMap<u32, u32> = HashMap::new();
    let mut ended = 0;
    while ended < flows {
        match bundle.read_timeout(T).unwrap().expect("more in time") {
            BundleEvent::Sdu { port, data } => {
                let k = u32::from_be_bytes(data[..4].try_into().unwrap());
                let n = next.entry(port).or_default();
                assert_eq!(k, *n, "flow {port}: SDU {k} came where {n} was due");
                *n += 1;
            }
            BundleEvent::Ended { .. } => ended += 1,
        }
    }
    next
}

/// `n` reliable flows from `src` to `sink` in `bundle`.
fn reliable_flows(c: &mut rina::Client, bundle: &Bundle, n: usize) -> Vec<u32> {
    (0..n)
        .map(|_| {
            c.allocate_bundled(
                bundle,
                &name("src"),
                &name("sink"),
                Some("net"),
                &reliable_in_order(),
            )
            .unwrap()
            .port
        })
        .collect()
}

/// Writes SDUs numbered `0..sdus` of `len` bytes on each of `ports`.
fn write_numbered(bundle: &Bundle, ports: &[u32], sdus: u32, len: usize) {
    let mut sdu = vec![7u8; len];
    for k in 0..sdus {
        for &p in ports {
            sdu[..4].copy_from_slice(&k.to_be_bytes());
            bundle.write(p, &sdu).unwrap();
        }
    }
}

/// A sink at `d` whose flows the daemon accepts for `sink` in `net`, each
/// on a socket of its own (1 MiB: few SDUs fit, so windows shut soon).
fn socket_sink(d: &Daemon) -> rina::Client {
    let mut sink = d.client();
    sink.set_rings(false);
    sink.register_accepting(&name("sink"), Some("net")).unwrap();
    sink
}

/// Reads `flows` flows of `sink` to their ends, each SDU of 1,000 bytes
/// numbered in order: how many each brought, sorted.
fn read_socket_flows(sink: &mut rina::Client, flows: usize) -> Vec<u32> {
    let mut counts = Vec::new();
    for _ in 0..flows {
        let flow = sink.next_flow_timeout(T).unwrap().expect("the flow");
        let mut buf = vec![0u8; 2_000];
        let mut next = 0u32;
        while let Ok(n) = flow.read(&mut buf) {
            assert_eq!(n, 1_000);
            let k = u32::from_be_bytes(buf[..4].try_into().unwrap());
            assert_eq!(k, next, "SDU {k} came where {next} was due");
            next += 1;
        }
        counts.push(next);
    }
    counts.sort_unstable();
    counts
}

#[test]
fn a_burst_larger_than_a_turns_budget_is_read_to_its_end() {
    // 60 SDUs of 5,000 bytes (300 KB, more than the 256 KiB one turn
    // reads) wait in the bundle when the daemon looks; nothing more comes.
    let (alpha, beta) = normal_pair();
    let (_sink, mut inbox) = bundled_sink(&beta);
    let mut c = alpha.client();
    let out = c.open_bundle().unwrap();
    let ports = reliable_flows(&mut c, &out, 30);
    freeze(&alpha, true);
    write_numbered(&out, &ports, 2, 5_000);
    freeze(&alpha, false);
    let mut got = 0;
    while got < 60 {
        match inbox
            .read_timeout(T)
            .unwrap()
            .expect("every SDU of the burst")
        {
            BundleEvent::Sdu { .. } => got += 1,
            BundleEvent::Ended { port } => panic!("flow {port} ended"),
        }
    }
    // The largest SDU a normal DIF carries goes through bundles whole.
    let max = vec![9u8; rina::MAX_BUNDLE_SDU];
    out.write(ports[0], &max).unwrap();
    match inbox.read_timeout(T).unwrap().expect("the largest SDU") {
        BundleEvent::Sdu { data, .. } => assert_eq!(data.len(), 65_536),
        e => panic!("{e:?}"),
    }
}

#[test]
fn a_bundle_closed_while_its_windows_are_shut_still_delivers_all_it_was_written() {
    const SDUS: u32 = 3_000;
    let (alpha, beta) = normal_pair();
    // The sink, on flows of its own, reads nothing yet: flow A's window
    // closes, and alpha holds the rest of what was written behind it.
    let mut sink = socket_sink(&beta);
    let mut c = alpha.client();
    let out = c.open_bundle().unwrap();
    let ports = reliable_flows(&mut c, &out, 2);
    write_numbered(&out, &ports[..1], SDUS, 1_000);
    write_numbered(&out, &ports[1..], 1, 1_000);
    std::thread::sleep(Duration::from_millis(300));
    let closed = format!("bundle closed bundle={} ", out.id());
    drop(out);
    // The daemon sees the close though it waits for a window.
    wait_for("alpha to see the bundle closed", T, || {
        alpha.log().contains(&closed)
    });
    let counts = read_socket_flows(&mut sink, 2);
    assert_eq!(
        counts,
        [1, SDUS],
        "every SDU of both flows, before their ends"
    );
    wait_for("alpha to forget both flows", T, || {
        c.list_flows().unwrap().is_empty()
    });
}

#[test]
fn what_an_application_wrote_before_it_closed_its_bundle_goes_though_it_read_nothing() {
    const SDUS: u32 = 500;
    let (alpha, beta) = normal_pair();
    let (mut sink, mut inbox) = bundled_sink(&beta);
    let mut c = alpha.client();
    let out = c.open_bundle().unwrap();
    let ports = reliable_flows(&mut c, &out, 1);
    let at_beta = sink.next_bundled_flow(T).unwrap().expect("the flow").port;
    // Beta's application floods the flow back to alpha's, which reads
    // nothing: alpha holds what it can for its bundle, whose socket fills,
    // and a send to it fails once the application has closed it.
    let flood = vec![0xffu8; 1_400];
    for _ in 0..6_000 {
        if !inbox.try_write(at_beta, &flood).unwrap() {
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    freeze(&alpha, true);
    write_numbered(&out, &ports, SDUS, 1_000);
    drop(out);
    freeze(&alpha, false);
    let got = read_until_ended(&mut inbox, 1);
    assert_eq!(
        got.get(&at_beta),
        Some(&SDUS),
        "every SDU written before the close"
    );
}

#[test]
fn flows_close_while_another_flow_of_the_bundle_waits_for_its_window() {
    const SDUS: u32 = 2_200;
    let (alpha, beta) = normal_pair();
    let mut sink = socket_sink(&beta);
    let mut c = alpha.client();
    let out = c.open_bundle().unwrap();
    let ports = reliable_flows(&mut c, &out, 2);
    // A's window shuts (the sink reads nothing) with SDUs behind it.
    write_numbered(&out, &ports[..1], SDUS, 1_000);
    std::thread::sleep(Duration::from_millis(300));
    // B closes at once all the same, and A lingers with what it holds.
    out.close_flow(ports[1]).unwrap();
    wait_for("alpha to close B", T, || c.list_flows().unwrap().len() == 1);
    out.close_flow(ports[0]).unwrap();
    let counts = read_socket_flows(&mut sink, 2);
    assert_eq!(counts, [0, SDUS], "all of A, then its end; B's end");
    wait_for("alpha to forget A", T, || {
        c.list_flows().unwrap().is_empty()
    });
}
