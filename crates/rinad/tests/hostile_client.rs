//! A hostile application against a real `rinad`: what it does to the
//! resources the daemon shares with it (the memory file of a flow's
//! rings) breaks at most its own flow, never the daemon.

mod common;

use common::{name, pair, Daemon};
use rina::{Flow, QosSpec};
use std::os::fd::AsRawFd;
use std::thread::JoinHandle;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

/// The tests look for the flow's descriptors in this process: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The descriptors of this process whose target starts with `prefix`.
fn fds_named(prefix: &str) -> Vec<i32> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            target
                .to_str()?
                .starts_with(prefix)
                .then(|| e.file_name().to_str()?.parse().ok())?
        })
        .collect()
}

/// beta's `sink`, on a client without rings (only the attacker's rings are
/// touched): accepts one flow and reads it until it is quiet for 3 s; the
/// SDUs it read.
fn sink(beta: &Daemon) -> JoinHandle<Vec<Vec<u8>>> {
    let mut srv = beta.client();
    srv.set_rings(false);
    srv.register(&name("sink"), None).unwrap();
    std::thread::spawn(move || {
        let req = srv.next_request_timeout(T).unwrap().expect("a request");
        let flow = srv.accept(&req).unwrap();
        let mut buf = vec![0u8; 2048];
        let mut got = Vec::new();
        while let Ok(Some(n)) = flow.read_timeout(&mut buf, Duration::from_secs(3)) {
            got.push(buf[..n].to_vec());
        }
        got
    })
}

/// A flow with rings from alpha's application `me` to `sink`, its first
/// SDU `first` written, and the descriptor of its ring file here.
fn ring_flow(alpha: &Daemon, me: &str, first: &[u8]) -> (Flow, i32) {
    let mut c = alpha.client();
    c.set_rings(true);
    let flow = c
        .allocate(&name(me), &name("sink"), None, &QosSpec::default())
        .unwrap();
    assert!(flow.has_rings(), "the flow got rings");
    flow.write(first).unwrap();
    let files = fds_named("/memfd:rina-flow");
    assert_eq!(files.len(), 1, "one ring file in this process");
    (flow, files[0])
}

/// An application that cuts the memory file of its flow's rings short
/// (`ftruncate` to zero) and kicks the daemon: the daemon's mapping of the
/// file must not fault (SIGBUS would kill it with every flow it serves).
/// The daemon seals the file against shrinking, so the cut is refused and
/// the flow keeps working.
#[test]
fn an_application_cutting_its_ring_file_short_does_not_kill_the_daemon() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (alpha, beta) = pair(&["sink"]);
    let reader = sink(&beta);
    let (flow, file) = ring_flow(&alpha, "cutter", b"before");
    // SAFETY: a descriptor this process holds; nothing here touches the
    // mapping after the cut.
    let cut = unsafe { libc::ftruncate(file, 0) };
    assert_ne!(cut, 0, "the cut was refused (the file is sealed)");
    // The doorbell: one byte on the flow socket makes the daemon read the
    // ring (and fault, if the file was cut).
    // SAFETY: a valid socket and a one-byte buffer.
    unsafe { libc::send(flow.as_raw_fd(), [1u8].as_ptr().cast(), 1, 0) };
    // The daemon read the ring after the cut: the flow still works...
    flow.write(b"after").unwrap();
    let got = reader.join().unwrap();
    assert_eq!(got, vec![b"before".to_vec(), b"after".to_vec()]);
    // ... and the daemon is alive and answers.
    let ipcps = alpha
        .client()
        .list_ipcps()
        .expect("the daemon survives a cut ring file");
    assert_eq!(ipcps.len(), 1);
}

/// An application that makes the descriptor the daemon rings when it
/// frees room in the application's send ring (it receives it with the
/// rings) blocking, fills its counter, and asks for that doorbell: the
/// daemon's next ring must not block its event loop (every flow and
/// client it serves would stop for good).
#[test]
fn an_application_cannot_make_the_daemon_block_on_its_room_doorbell() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (alpha, beta) = pair(&["sink"]);
    let reader = sink(&beta);
    let (flow, file) = ring_flow(&alpha, "blocker", b"first");
    let rooms: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let fd: i32 = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            let t = target.to_str()?;
            (t.starts_with("anon_inode:[eventfd]") || t.starts_with("pipe:")).then_some(fd)
        })
        .collect();
    assert!(!rooms.is_empty(), "the room doorbell is in this process");
    for &room in &rooms {
        // SAFETY: descriptors of this process; an 8-byte buffer for each
        // read and write.
        unsafe {
            let mut v = [0u8; 8];
            libc::read(room, v.as_mut_ptr().cast(), 8);
            let max: u64 = 0xffff_ffff_ffff_fffe;
            libc::write(room, (&max as *const u64).cast(), 8);
            let fl = libc::fcntl(room, libc::F_GETFL);
            libc::fcntl(room, libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
    // "I wait for room": the producer's waiting word of the send ring,
    // which follows the receive ring in the file.
    let (_, from_app, _) =
        rina_core::shim_hv::flow_rings::layout(rina_core::shim_hv::flow_rings::GEOMETRY);
    let one = 1u32.to_le_bytes();
    // SAFETY: a write of 4 bytes into the ring file at its offset.
    let n = unsafe { libc::pwrite(file, one.as_ptr().cast(), 4, (from_app + 8) as i64) };
    assert_eq!(n, 4);
    // An SDU: the daemon takes it and, asked to, rings the room doorbell.
    flow.write(b"second").unwrap();

    // The daemon still answers.
    let answered = alpha.answers_within(T);
    assert!(
        matches!(answered, Some(Ok(1))),
        "the daemon hangs on the doorbell: {answered:?}"
    );
    flow.write(b"third").unwrap();
    assert_eq!(reader.join().unwrap().len(), 3, "the flow kept working");
}

/// A normal IPCP `me.net` at `addr` over a shim-udp DIF, with one
/// neighbour; `echo` lives at address 2.
fn normal_system(me: &str, addr: u64, port: u16, peer: &str, peer_port: u16) -> String {
    let peer_addr = 3 - addr;
    format!(
        "[system]\nname = \"{me}\"\n\n[[ipcp]]\nname = \"{me}.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:{port}\"\n\n[ipcp.directory]\n\"{peer}.net\" = \"127.0.0.1:{peer_port}\"\n\n[[ipcp]]\nname = \"{me}.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = {addr}\n\n[[ipcp.neighbor]]\nname = \"{peer}.net\"\nover = \"udp\"\naddress = {peer_addr}\n\n[ipcp.names]\n\"echo\" = 2\n"
    )
}

/// An application that writes a tail no reader could have (further from
/// the head than the ring is long) into its receive ring, the one the
/// daemon fills, on a flow of a normal DIF: SDUs for it find no room and
/// are held, and the daemon must wait for the application to kick, as for
/// a full ring, not try again at once in a loop (its one thread would spin
/// at full speed for as long as the application likes, with every flow it
/// serves).
#[test]
fn an_application_scribbling_its_ring_tail_does_not_make_the_daemon_spin() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (pa, pb) = (common::free_port(), common::free_port());
    let alpha = Daemon::start_with("alpha", &normal_system("alpha", 1, pa, "beta", pb));
    let beta = Daemon::start_with("beta", &normal_system("beta", 2, pb, "alpha", pa));
    let mut srv = beta.client();
    srv.set_rings(false);
    srv.register(&name("echo"), Some("net")).unwrap();
    let server = std::thread::spawn(move || {
        let req = srv.next_request_timeout(T).unwrap().expect("a request");
        let flow = srv.accept(&req).unwrap();
        // A first SDU, then the word that the tail is garbage; then a few
        // SDUs.
        let mut go = [0u8; 8];
        for _ in 0..2 {
            flow.read_timeout(&mut go, T).unwrap().expect("an SDU");
        }
        for k in 0..8u8 {
            flow.write(&[k; 100]).unwrap();
        }
        std::thread::sleep(Duration::from_secs(4));
    });
    let mut c = alpha.client();
    c.set_rings(true);
    let mut flow = None;
    common::wait_for("a flow over the normal DIF", T, || {
        flow = c
            .allocate(
                &name("scribbler"),
                &name("echo"),
                Some("net"),
                &QosSpec::default(),
            )
            .ok();
        flow.is_some()
    });
    let flow = flow.unwrap();
    assert!(flow.has_rings(), "the flow got rings");
    flow.write(b"hello").unwrap();
    let files = fds_named("/memfd:rina-flow");
    assert_eq!(files.len(), 1, "one ring file in this process");
    let (to_app, _, _) =
        rina_core::shim_hv::flow_rings::layout(rina_core::shim_hv::flow_rings::GEOMETRY);
    let garbage = (u32::MAX / 2).to_le_bytes();
    // SAFETY: a write of 4 bytes into the ring file at its offset (the
    // receive ring's published tail).
    let n = unsafe { libc::pwrite(files[0], garbage.as_ptr().cast(), 4, (to_app + 64) as i64) };
    assert_eq!(n, 4);
    flow.write(b"go").unwrap();
    // The SDUs arrive at alpha, which cannot put them in the ring.
    std::thread::sleep(Duration::from_millis(500));
    let before = common::cpu_time(alpha.child.id());
    std::thread::sleep(Duration::from_secs(2));
    let used = common::cpu_time(alpha.child.id()) - before;
    assert!(
        used < Duration::from_millis(500),
        "the daemon spun: {used:?} of CPU in 2 s"
    );
    assert!(matches!(alpha.answers_within(T), Some(Ok(2))));
    drop(flow);
    server.join().unwrap();
}
