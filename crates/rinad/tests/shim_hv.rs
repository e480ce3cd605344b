//! The shim DIF for hypervisors between two real `rinad` processes, a
//! "host" and a "guest", sharing a file in a temporary directory (no VM is
//! booted: a second process stands in for the guest, which maps the same
//! layout it would map from an ivshmem BAR). No root needed.
//!
//! * allocation, data both ways, 64 KiB SDUs, refusal, deallocation and
//!   channel reuse;
//! * a guest that dies: the host's flows close, and a new guest attaches;
//! * garbage written into the shared ring: the host survives, counts it,
//!   and the link works again once the honest guest writes;
//! * a normal DIF over shim-hv carrying SDUs between applications.

mod common;

use common::{held_after_end, name, roundtrip, temp_dir, wait_for, Daemon};
use rina::{Client, ErrorKind, Flow, QosSpec};
use rina_core::shim_hv::link::HEADER;
use rina_core::shim_hv::ring::{Geometry, RING_HEADER};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

/// The geometry the daemon's host side lays out (`daemon::shim_hv::GEOMETRY`).
const GEO: Geometry = Geometry {
    slot_size: 4096,
    slots: 1024,
};

fn hv_config(system: &str, path: &Path, side: &str) -> String {
    format!(
        "[system]\nname = \"{system}\"\n\n[[ipcp]]\nname = \"{system}.hv\"\ntype = \"shim-hv\"\ndif = \"hv\"\npath = \"{}\"\nside = \"{side}\"\nvmpi_id = 3\n",
        path.display()
    )
}

/// A host and a guest daemon over one shared file, both seeing the peer up.
struct Pair {
    host: Daemon,
    guest: Daemon,
    shm: PathBuf,
    _dir: Dir,
}

/// A directory removed on drop.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A host and a guest that announces no credit (as IRATI's shim-hv), both
/// seeing the peer up; the directory goes with the last of the three.
fn no_credit_pair(tag: &str) -> (Daemon, Daemon, Dir) {
    let dir = temp_dir(tag);
    let shm = dir.join("vmpi0");
    let host = Daemon::start_with("host", &hv_config("host", &shm, "host"));
    let guest = Daemon::start_with(
        "guest",
        &format!("{}credit = false\n", hv_config("guest", &shm, "guest")),
    );
    let dir = Dir(dir);
    wait_until_up(&host);
    wait_until_up(&guest);
    (host, guest, dir)
}

fn pair() -> Pair {
    let dir = temp_dir("hvshm");
    let shm = dir.join("vmpi0");
    let host = Daemon::start_with("host", &hv_config("host", &shm, "host"));
    let guest = Daemon::start_with("guest", &hv_config("guest", &shm, "guest"));
    wait_until_up(&host);
    wait_until_up(&guest);
    Pair {
        host,
        guest,
        shm,
        _dir: Dir(dir),
    }
}

fn wait_until_up(d: &Daemon) {
    wait_for(&format!("{} to see its peer", d.name), T, || {
        d.counter("peer_up") == 1
    });
}

/// Registers `n` at `d` and echoes every SDU of every accepted flow.
fn echo_server(d: &Daemon, n: &str) -> JoinHandle<()> {
    echo_server_rings(d, n, false)
}

/// As [`echo_server`], accepting with shared-memory rings if `rings`.
fn echo_server_rings(d: &Daemon, n: &str, rings: bool) -> JoinHandle<()> {
    let mut c = d.client();
    c.set_rings(rings);
    assert_eq!(c.register(&name(n), None).unwrap(), vec!["hv".to_string()]);
    std::thread::spawn(move || {
        while let Ok(Some(req)) = c.next_request_timeout(Duration::from_secs(30)) {
            let Ok(flow) = c.accept(&req) else { continue };
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65_536];
                while let Ok(n) = flow.read(&mut buf) {
                    if flow.write(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    })
}

fn allocate(c: &mut Client, from: &str, to: &str) -> rina::Result<Flow> {
    c.allocate(&name(from), &name(to), Some("hv"), &QosSpec::default())
}

#[test]
fn allocation_data_both_ways_64k_refusal_deallocation_and_reuse() {
    let p = pair();
    assert!(
        p.host.udp_addr().starts_with("vmpi 3 (host"),
        "{}",
        p.host.udp_addr()
    );
    let _srv = echo_server(&p.host, "echo");
    let mut c = p.guest.client();
    let flow = allocate(&mut c, "vm-app", "echo").unwrap();
    assert_eq!(flow.info().dif, "hv");
    assert_eq!(flow.info().max_sdu, 65_536);
    for i in 0..20u8 {
        let sdu = vec![i; 1 + 300 * i as usize];
        assert_eq!(roundtrip(&flow, &sdu), sdu, "SDU {i} echoed intact");
    }
    let big: Vec<u8> = (0..65_536u32).map(|i| (i % 251) as u8).collect();
    for _ in 0..5 {
        assert_eq!(roundtrip(&flow, &big), big, "a 64 KiB SDU passes");
    }
    // A burst larger than the ring (4 MiB) flows with back-pressure, in order.
    let mut buf = vec![0u8; 65_536];
    std::thread::scope(|sc| {
        sc.spawn(|| {
            for k in 0..200u32 {
                let mut s = big.clone();
                s[..4].copy_from_slice(&k.to_le_bytes());
                flow.write(&s).unwrap();
            }
        });
        // Nothing is lost: a full application socket at the receiver holds
        // the ring, a full ring holds the sender's writes.
        let mut last = None;
        let mut got = 0u64;
        while let Some(n) = flow.read_timeout(&mut buf, Duration::from_secs(2)).unwrap() {
            assert_eq!(n, 65_536);
            let k = u32::from_le_bytes(buf[..4].try_into().unwrap());
            assert!(last.is_none_or(|l| k > l), "in order: {k} after {last:?}");
            last = Some(k);
            got += 1;
        }
        let drops: u64 = [&p.host, &p.guest]
            .iter()
            .flat_map(|d| d.client().list_flows().unwrap())
            .map(|f| f.counters.drops_in)
            .sum();
        assert_eq!(
            got + drops,
            200,
            "every SDU is delivered or counted as dropped"
        );
    });
    let stats = c.list_flows().unwrap();
    assert_eq!(stats[0].counters.sdus_out, 225);

    // Refusal with the reason, and a name nobody registered.
    let mut srv = p.host.client();
    srv.register(&name("picky"), Some("hv")).unwrap();
    let t = std::thread::spawn(move || {
        let req = srv.next_request().unwrap();
        assert_eq!(req.remote, name("asker"));
        srv.refuse(&req, "not today").unwrap();
        srv
    });
    let e = allocate(&mut p.guest.client(), "asker", "picky").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Refused, "{e}");
    assert!(e.to_string().contains("not today"), "{e}");
    drop(t.join().unwrap());
    let e = allocate(&mut p.guest.client(), "asker", "nobody").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotRegistered, "{e}");

    // Deallocation at one end frees the flow at both.
    flow.deallocate();
    wait_for("the host to free the flow", T, || {
        p.host.client().list_flows().unwrap().is_empty()
    });

    // Channels are reused: more allocations than there are channels, and
    // 63 at once but not 64.
    for k in 0..70 {
        let f = allocate(&mut c, "vm-app", "echo").unwrap();
        assert_eq!(roundtrip(&f, &[k as u8; 10]), vec![k as u8; 10]);
        drop(f);
    }
    wait_for("the host to free the flows", T, || {
        p.host.client().list_flows().unwrap().is_empty()
    });
    let held: Vec<Flow> = (0..63)
        .map(|_| allocate(&mut c, "vm-app", "echo").unwrap())
        .collect();
    let e = allocate(&mut c, "vm-app", "echo").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoResources, "{e}");
    assert_eq!(roundtrip(&held[62], b"last"), b"last");
}

/// The tests whose flows have rings: one at a time, since one of them
/// looks for ring files among this process's descriptors.
static RINGS_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Flows with shared-memory rings at both applications: SDUs of every
/// size up to 64 KiB both ways, a pipelined burst far larger than the
/// rings with nothing lost and nothing reordered, counters as for socket
/// flows, and closing at one end seen at the other.
#[test]
fn rings_carry_sdus_both_ways_without_loss_and_close() {
    let _one = RINGS_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let p = pair();
    let _srv = echo_server_rings(&p.host, "echo", true);
    let mut c = p.guest.client();
    c.set_rings(true);
    let flow = allocate(&mut c, "vm-app", "echo").unwrap();
    assert!(flow.has_rings(), "shim-hv offers rings");
    for i in 0..20u8 {
        let sdu = vec![i; 1 + 3400 * i as usize];
        assert_eq!(roundtrip(&flow, &sdu), sdu, "SDU {i} echoed intact");
    }
    let big: Vec<u8> = (0..65_536u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(roundtrip(&flow, &big), big, "a 64 KiB SDU passes");
    // 3000 SDUs of 1 to 64 KiB (about 100 MB) pipelined through the echo:
    // the rings (2 MiB each way) fill again and again.
    const N: u32 = 3000;
    let size = |k: u32| 4 + (k as usize * 7919) % 65_533;
    std::thread::scope(|sc| {
        sc.spawn(|| {
            for k in 0..N {
                let mut s = big[..size(k)].to_vec();
                s[..4].copy_from_slice(&k.to_le_bytes());
                flow.write(&s).unwrap();
            }
        });
        let mut buf = vec![0u8; 65_536];
        for k in 0..N {
            let n = flow
                .read_timeout(&mut buf, T)
                .unwrap()
                .unwrap_or_else(|| panic!("echo {k} within {T:?}"));
            assert_eq!(n, size(k), "SDU {k}: its length");
            assert_eq!(
                u32::from_le_bytes(buf[..4].try_into().unwrap()),
                k,
                "in order"
            );
            assert_eq!(&buf[4..n], &big[4..n], "SDU {k}: its bytes");
        }
    });
    let stats = c.list_flows().unwrap();
    assert_eq!(stats[0].counters.sdus_out, 21 + u64::from(N));
    assert_eq!(stats[0].counters.sdus_in, 21 + u64::from(N));
    let drops: u64 = [&p.host, &p.guest]
        .iter()
        .flat_map(|d| d.client().list_flows().unwrap())
        .map(|f| f.counters.drops_in + f.counters.drops_out)
        .sum();
    assert_eq!(drops, 0);
    // A reader that starts late: 200 SDUs of 64 KiB (13 MB) against 4 MiB
    // rings. The host's application ring fills, the host holds what the
    // flow's credit lets the guest send, the guest stops reading the
    // writer's ring (its writer blocks) and the VMPI ring is read on;
    // once the reader runs, everything arrives in order.
    let mut sink = p.host.client();
    sink.set_rings(true);
    sink.register(&name("late"), Some("hv")).unwrap();
    let late = std::thread::spawn(move || {
        let req = sink.next_request().unwrap();
        let f = sink.accept(&req).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let mut buf = vec![0u8; 65_536];
        let mut got = Vec::new();
        while got.len() < 200 {
            match f.read_timeout(&mut buf, T).unwrap() {
                Some(n) => {
                    assert_eq!(n, 65_536);
                    got.push(u32::from_le_bytes(buf[..4].try_into().unwrap()));
                }
                None => break,
            }
        }
        got
    });
    let lf = allocate(&mut c, "vm-app", "late").unwrap();
    for k in 0..200u32 {
        let mut s = big.clone();
        s[..4].copy_from_slice(&k.to_le_bytes());
        lf.write(&s).unwrap();
    }
    assert_eq!(late.join().unwrap(), (0..200).collect::<Vec<u32>>());
    assert!(
        p.guest.counter("credit_waits") > 0,
        "the writer never waited for credit: the test proves nothing"
    );
    assert_eq!(
        p.host.counter("rx_ring_waits"),
        0,
        "the VMPI ring never waited"
    );
    drop(lf);
    // A short buffer: the SDU's head is kept and the error says so.
    flow.write(&big).unwrap();
    let mut small = [0u8; 100];
    let e = loop {
        match flow.read_timeout(&mut small, T) {
            Ok(None) => continue,
            r => break r.unwrap_err(),
        }
    };
    assert_eq!(e.kind(), ErrorKind::SduTooLarge, "{e}");
    assert_eq!(&small[..], &big[..100]);
    // Closing at the guest frees the flows at both ends.
    flow.deallocate();
    wait_for("the host to free the flows", T, || {
        p.host.client().list_flows().unwrap().is_empty()
    });
    // A client that turns rings off gets a socket flow from the same daemons.
    let mut pc = p.guest.client();
    pc.set_rings(false);
    let plain = allocate(&mut pc, "vm-app", "echo").unwrap();
    assert!(!plain.has_rings());
    assert_eq!(roundtrip(&plain, b"plain"), b"plain");
}

/// An application that scribbles over its own ring (found through
/// /proc/self/fd, as any process could) breaks nothing but its own SDUs:
/// the daemon counts and drops what was published, keeps serving the
/// flow and other flows, and does not crash.
#[test]
fn garbage_in_an_application_ring_spoils_only_its_own_sdus() {
    use rina_core::shim_hv::flow_rings::{layout, GEOMETRY as FG};
    let _one = RINGS_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    let p = pair();
    let _srv = echo_server_rings(&p.host, "echo", true);
    let mut c = p.guest.client();
    c.set_rings(true);
    let flow = allocate(&mut c, "vm-app", "echo").unwrap();
    assert!(flow.has_rings());
    // A mark no other flow carries tells this flow's ring files from
    // those of the other tests' flows in this process (rings are the
    // default).
    let mark = format!("garbage-test-{:?}", std::time::Instant::now());
    assert_eq!(roundtrip(&flow, mark.as_bytes()), mark.as_bytes());
    let (_, from_app, len) = layout(FG);
    let carries_mark = |p: &PathBuf| {
        std::fs::read(p).is_ok_and(|b| {
            b.get(from_app..len)
                .is_some_and(|r| r.windows(mark.len()).any(|w| w == mark.as_bytes()))
        })
    };
    // Both ends of the flow live in this process (the echo server is a
    // thread): spoil the application-to-daemon ring of each.
    let memfds: Vec<PathBuf> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            std::fs::read_link(p).is_ok_and(|l| l.to_string_lossy().starts_with("/memfd:rina-flow"))
        })
        .filter(carries_mark)
        .collect();
    assert_eq!(
        memfds.len(),
        2,
        "the flow's ring files among our descriptors"
    );
    for memfd in &memfds {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(memfd)
            .unwrap();
        // A record header with an absurd length at the next record's
        // place, published by moving the head one slot on.
        let mut head = [0u8; 4];
        file.read_exact_at(&mut head, from_app as u64).unwrap();
        let h = u32::from_le_bytes(head);
        let slot = (h % FG.slots) as usize * FG.slot_size as usize;
        let rec = from_app + rina_core::shim_hv::ring::RING_HEADER + slot;
        let mut bad = u32::MAX.to_le_bytes().to_vec();
        bad.extend_from_slice(&h.to_le_bytes());
        file.write_all_at(&bad, rec as u64).unwrap();
        file.write_all_at(&(h + 1).to_le_bytes(), from_app as u64)
            .unwrap();
    }
    // Kick the daemon as the library would: it finds the garbage, drops
    // what was published and goes on.
    use std::os::fd::AsRawFd;
    // SAFETY: sends one byte from a live buffer on our flow's socket.
    let n = unsafe { libc::send(flow.as_raw_fd(), [1u8].as_ptr().cast(), 1, 0) };
    assert_eq!(n, 1);
    wait_for("the daemon to count the garbage", T, || {
        p.guest.client().list_flows().unwrap()[0].counters.drops_out > 0
    });
    // The spoiled flow itself carries SDUs again (the one the garbage
    // overlapped may be lost).
    flow.write(b"again").unwrap();
    flow.write(b"again").unwrap();
    let mut buf = [0u8; 16];
    let n = flow.read_timeout(&mut buf, T).unwrap().expect("an echo");
    assert_eq!(&buf[..n], b"again");
    // The daemon lives, and a new flow (rings or not) works.
    let f2 = allocate(&mut c, "vm-app", "echo").unwrap();
    assert_eq!(roundtrip(&f2, b"fresh"), b"fresh");
    assert_eq!(p.guest.counter("peer_up"), 1);
}

#[test]
fn a_dead_guest_closes_the_host_flows_and_a_new_guest_attaches() {
    let mut p = pair();
    let mut gc = p.guest.client();
    gc.register(&name("vm-echo"), None).unwrap();
    let t = std::thread::spawn(move || {
        let req = gc.next_request().unwrap();
        let f = gc.accept(&req).unwrap();
        (gc, f)
    });
    let host_flow = allocate(&mut p.host.client(), "host-app", "vm-echo").unwrap();
    let (_gc, guest_flow) = t.join().unwrap();
    host_flow.write(b"hello vm").unwrap();
    let mut buf = [0u8; 64];
    let n = guest_flow.read_timeout(&mut buf, T).unwrap().unwrap();
    assert_eq!(&buf[..n], b"hello vm");

    p.guest.kill();
    let e = host_flow
        .read_timeout(&mut buf, T)
        .expect_err("the host's flow closes when the guest dies");
    assert_eq!(e.kind(), ErrorKind::DaemonGone, "{e}");
    wait_for("the host to see the peer gone", T, || {
        p.host.counter("peer_up") == 0
    });
    assert!(p.host.client().list_flows().unwrap().is_empty());
    assert_eq!(p.host.counter("peer_losses"), 1);
    let e = allocate(&mut p.host.client(), "host-app", "vm-echo").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoResources, "{e}");

    // A new guest maps the same file and the DIF works again.
    let guest2 = Daemon::start_with("guest2", &hv_config("guest2", &p.shm, "guest"));
    wait_until_up(&guest2);
    wait_until_up(&p.host);
    let _srv = echo_server(&p.host, "echo");
    let f = allocate(&mut guest2.client(), "vm-app", "echo").unwrap();
    assert_eq!(roundtrip(&f, b"again"), b"again");
}

#[test]
fn garbage_in_the_ring_is_counted_and_the_host_survives() {
    let p = pair();
    let _srv = echo_server(&p.host, "echo");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&p.shm)
        .unwrap();
    // The guest -> host ring: its head, then every slot header.
    let ring = (HEADER + GEO.ring_bytes().next_multiple_of(4096)) as u64;
    let mut garbage = vec![0u8; GEO.data_bytes()];
    let mut x: u32 = 0x1234_5678;
    for b in garbage.iter_mut() {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    file.write_all_at(&garbage, ring + RING_HEADER as u64)
        .unwrap();
    file.write_all_at(&7u32.to_le_bytes(), ring).unwrap();
    wait_for("the host to count the garbage", T, || {
        p.host.counter("rx_ring_errors") >= 1
    });
    // A head beyond the ring is refused as well.
    file.write_all_at(&0xdead_beefu32.to_le_bytes(), ring)
        .unwrap();
    let before = p.host.counter("rx_ring_errors");
    wait_for("the host to count the bad head", T, || {
        p.host.counter("rx_ring_errors") > before
    });
    // The honest guest's next buffers put the ring right again.
    let mut c = p.guest.client();
    let mut ok = None;
    for _ in 0..5 {
        if let Ok(f) = allocate(&mut c, "vm-app", "echo") {
            ok = Some(f);
            break;
        }
    }
    let f = ok.expect("an allocation succeeds after the garbage");
    assert_eq!(roundtrip(&f, b"still here"), b"still here");
    assert!(p.host.client().list_ipcps().is_ok());
}

/// A host and a guest daemon over one shim-hv DIF and a normal DIF "net"
/// over it, with `app` in its directory at the host.
fn normal_over_hv(tag: &str, app: &str) -> (Dir, Daemon, Daemon) {
    let dir = temp_dir(tag);
    let shm = dir.join("vmpi0");
    let normal = |me: &str, addr: u64, peer: &str, peer_addr: u64| {
        format!(
            "\n[[ipcp]]\nname = \"{me}.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = {addr}\n\n[[ipcp.neighbor]]\nname = \"{peer}.net\"\nover = \"hv\"\naddress = {peer_addr}\n\n[ipcp.names]\n\"{app}\" = 1\n"
        )
    };
    let host = Daemon::start_with(
        "host",
        &(hv_config("host", &shm, "host") + &normal("host", 1, "guest", 2)),
    );
    let guest = Daemon::start_with(
        "guest",
        &(hv_config("guest", &shm, "guest") + &normal("guest", 2, "host", 1)),
    );
    (Dir(dir), host, guest)
}

#[test]
fn a_normal_dif_over_shim_hv_carries_sdus() {
    let (_d, host, guest) = normal_over_hv("hvnormal", "echo");
    let mut c = host.client();
    c.register(&name("echo"), Some("net")).unwrap();
    let _srv = std::thread::spawn(move || {
        while let Ok(Some(req)) = c.next_request_timeout(Duration::from_secs(30)) {
            let Ok(flow) = c.accept(&req) else { continue };
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65_536];
                while let Ok(n) = flow.read(&mut buf) {
                    if flow.write(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let flow = allocate_retrying(&guest, "vm-app", "echo", "net", false);
    assert_eq!(flow.info().dif, "net");
    for i in 0..20u8 {
        let sdu = vec![i; 100 + 50 * i as usize];
        assert_eq!(roundtrip(&flow, &sdu), sdu);
    }
}

/// Seed 001 Fig. 4(b): two "VMs", each a guest of its own shim-hv DIF to
/// one "host", and a normal DIF "net" over both with the host relaying;
/// `cubes` (TOML) replaces the DIF's default QoS cubes when not empty.
/// `sink` is registered at vm2 by the caller.
struct VmToVm {
    host: Daemon,
    vm1: Daemon,
    vm2: Daemon,
    _dir: Dir,
}

fn vm_to_vm(tag: &str, cubes: &str) -> VmToVm {
    let dir = temp_dir(tag);
    let (shm1, shm2) = (dir.join("vmpi1"), dir.join("vmpi2"));
    let hv = |system: &str, ipcp: &str, dif: &str, path: &Path, side: &str| {
        format!(
            "\n[[ipcp]]\nname = \"{system}.{ipcp}\"\ntype = \"shim-hv\"\ndif = \"{dif}\"\npath = \"{}\"\nside = \"{side}\"\n",
            path.display()
        )
    };
    let net = |me: &str, addr: u64, nbs: &[(&str, u64, &str)], routes: &[(u64, u64)]| {
        let mut s = format!(
            "\n[[ipcp]]\nname = \"{me}.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = {addr}\n"
        );
        for (n, a, over) in nbs {
            s += &format!(
                "\n[[ipcp.neighbor]]\nname = \"{n}.net\"\nover = \"{over}\"\naddress = {a}\n"
            );
        }
        s += cubes;
        s += "\n[ipcp.routes]\n";
        for (d, h) in routes {
            s += &format!("\"{d}\" = {h}\n");
        }
        s + "\n[ipcp.names]\n\"echo\" = 3\n\"sink\" = 3\n"
    };
    let host = Daemon::start_with(
        "host",
        &("[system]\nname = \"host\"\n".to_string()
            + &hv("host", "hv1", "hv1", &shm1, "host")
            + &hv("host", "hv2", "hv2", &shm2, "host")
            + &net("host", 1, &[("vm1", 2, "hv1"), ("vm2", 3, "hv2")], &[])),
    );
    let vm1 = Daemon::start_with(
        "vm1",
        &("[system]\nname = \"vm1\"\n".to_string()
            + &hv("vm1", "hv", "hv1", &shm1, "guest")
            + &net("vm1", 2, &[("host", 1, "hv1")], &[(3, 1)])),
    );
    let vm2 = Daemon::start_with(
        "vm2",
        &("[system]\nname = \"vm2\"\n".to_string()
            + &hv("vm2", "hv", "hv2", &shm2, "guest")
            + &net("vm2", 3, &[("host", 1, "hv2")], &[(2, 1)])),
    );
    VmToVm {
        host,
        vm1,
        vm2,
        _dir: Dir(dir),
    }
}

/// Allocates a flow from `d`'s application `from` to `dst` over DIF `dif`,
/// retrying while the DIF comes up.
fn allocate_retrying(d: &Daemon, from: &str, dst: &str, dif: &str, rings: bool) -> Flow {
    let mut flow = None;
    wait_for(
        &format!("a flow to {dst} over {dif}"),
        Duration::from_secs(20),
        || {
            let mut c = d.client();
            c.set_rings(rings);
            flow = c
                .allocate(&name(from), &name(dst), Some(dif), &QosSpec::default())
                .ok();
            flow.is_some()
        },
    );
    flow.unwrap()
}

/// An IPCP counter of `d`'s IPCP named `ipcp`.
fn ipcp_counter(d: &Daemon, ipcp: &str, key: &str) -> u64 {
    let ipcps = d.client().list_ipcps().unwrap();
    let ip = ipcps.iter().find(|i| i.name == ipcp).expect("the IPCP");
    ip.counters.get(key).copied().unwrap_or(0)
}

#[test]
fn vm_to_vm_through_the_host_over_a_normal_dif() {
    let vms = vm_to_vm("hvvm2vm", "");
    let mut c = vms.vm2.client();
    c.register(&name("echo"), Some("net")).unwrap();
    let _srv = std::thread::spawn(move || {
        while let Ok(Some(req)) = c.next_request_timeout(Duration::from_secs(30)) {
            let Ok(flow) = c.accept(&req) else { continue };
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65_536];
                while let Ok(n) = flow.read(&mut buf) {
                    if flow.write(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let flow = allocate_retrying(&vms.vm1, "vm1-app", "echo", "net", false);
    assert_eq!(flow.info().dif, "net");
    // Over the normal DIF too, an application may ask for rings.
    let mut rc = vms.vm1.client();
    rc.set_rings(true);
    let ringed = rc
        .allocate(
            &name("vm1-r"),
            &name("echo"),
            Some("net"),
            &QosSpec::default(),
        )
        .unwrap();
    assert!(ringed.has_rings());
    for i in 0..20u8 {
        let sdu = vec![i; 1 + 3000 * i as usize];
        assert_eq!(roundtrip(&ringed, &sdu), sdu);
    }
    for i in 0..20u8 {
        let sdu = vec![i; 200 + 100 * i as usize];
        assert_eq!(roundtrip(&flow, &sdu), sdu);
    }
    // The host relayed: both of its shim-hv IPCPs carried buffers.
    let ipcps = vms.host.client().list_ipcps().unwrap();
    for ip in ipcps.iter().filter(|i| i.name.contains(".hv")) {
        assert!(
            ip.counters["rx_buffers"] > 20,
            "{}: {:?}",
            ip.name,
            ip.counters
        );
    }
}

/// Seed 001 Fig. 4(b) with flow control and no retransmission: vm1 writes
/// as fast as it can, vm2's application reads slower; the cube's window
/// holds vm1's writer back, so nothing is lost on the way (no hop drops,
/// no SDU dropped for a full application socket) and nothing is resent.
#[test]
fn vm_to_vm_flow_control_holds_a_fast_writer_back_without_loss() {
    flow_control_vm_to_vm(false);
}

/// The same with shared-memory rings at both applications.
#[test]
fn vm_to_vm_flow_control_with_rings_at_both_ends() {
    flow_control_vm_to_vm(true);
}

fn flow_control_vm_to_vm(rings: bool) {
    let cube = "\n[[ipcp.qos_cube]]\nid = 1\nname = \"vm\"\nflow_control = true\n";
    let vms = vm_to_vm(if rings { "hvvmfcr" } else { "hvvmfc" }, cube);
    let mut c = vms.vm2.client();
    c.set_rings(rings);
    c.register(&name("sink"), Some("net")).unwrap();
    const N: u32 = 6000;
    let (tx, rx) = std::sync::mpsc::channel();
    let _srv = std::thread::spawn(move || {
        let req = c.next_request().unwrap();
        let flow = c.accept(&req).unwrap();
        let mut buf = vec![0u8; 65_536];
        let mut got = Vec::new();
        while let Ok(Some(n)) = flow.read_timeout(&mut buf, Duration::from_secs(5)) {
            assert_eq!(n, 4000);
            got.push(u32::from_le_bytes(buf[..4].try_into().unwrap()));
            if got.len() % 100 == 0 {
                // A slow reader: ~100 SDUs per millisecond at most.
                std::thread::sleep(Duration::from_millis(1));
            }
            if got.len() as u32 == N {
                break;
            }
        }
        // The flow stays open (its counters listed) until the test ends.
        let _ = tx.send((got, flow));
    });
    let flow = allocate_retrying(&vms.vm1, "vm1-app", "sink", "net", rings);
    assert_eq!(flow.has_rings(), rings);
    let mut sdu = vec![7u8; 4000];
    let t0 = std::time::Instant::now();
    for k in 0..N {
        sdu[..4].copy_from_slice(&k.to_le_bytes());
        flow.write(&sdu).unwrap();
    }
    let (got, _sink) = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    eprintln!(
        "vm1 -> vm2 with window flow control (rings: {rings}): {} of {N} SDUs of 4000 B in {:?}",
        got.len(),
        t0.elapsed()
    );
    assert_eq!(got.len() as u32, N, "every SDU arrived");
    assert!(got.windows(2).all(|w| w[0] < w[1]), "in order");
    for (d, ipcp) in [
        (&vms.vm1, "vm1.hv"),
        (&vms.host, "host.hv1"),
        (&vms.host, "host.hv2"),
    ] {
        assert_eq!(
            ipcp_counter(d, ipcp, "tx_ring_full"),
            0,
            "{ipcp} lost frames"
        );
    }
    let drops: u64 = vms
        .vm2
        .client()
        .list_flows()
        .unwrap()
        .iter()
        .map(|f| f.counters.drops_in)
        .sum();
    assert_eq!(drops, 0, "vm2 dropped SDUs for a full application socket");
}

/// Both daemons connect over `PATH.bell`; a side whose receive
/// ring is empty sleeps on that connection (it only ticks every 50 ms for
/// heartbeats) and is woken by the other side's doorbell.
#[test]
fn doorbells_wake_the_waiting_side_without_polling() {
    let p = pair();
    wait_for("doorbells on both sides", T, || {
        p.host.counter("doorbell") == 1 && p.guest.counter("doorbell") == 1
    });
    assert!(
        p.host.udp_addr().contains("doorbells"),
        "{}",
        p.host.udp_addr()
    );
    let _srv = echo_server(&p.host, "echo");
    let flow = allocate(&mut p.guest.client(), "vm-app", "echo").unwrap();
    assert_eq!(roundtrip(&flow, b"warm"), b"warm");
    let counters = |d: &Daemon| (d.counter("ticks"), d.counter("bell_wakeups"));
    let (host0, guest0) = (counters(&p.host), counters(&p.guest));
    let start = std::time::Instant::now();
    const N: u64 = 100;
    for k in 0..N {
        let sdu = k.to_le_bytes();
        assert_eq!(roundtrip(&flow, &sdu), sdu);
    }
    let elapsed = start.elapsed();
    let (host1, guest1) = (counters(&p.host), counters(&p.guest));
    for (who, (t0, w0), (t1, w1)) in [("host", host0, host1), ("guest", guest0, guest1)] {
        // Each round trip wakes each side once by its doorbell (a side that
        // was still busy needs none).
        assert!(
            w1 - w0 >= N / 2,
            "{who}: {} doorbell wakeups for {N} round trips",
            w1 - w0
        );
        // Heartbeat ticks only (20 a second), not a poll every millisecond.
        let allowed = 5 + (elapsed.as_secs_f64() * 40.0) as u64;
        assert!(
            t1 - t0 <= allowed,
            "{who}: {} ticks in {elapsed:?}: it polls",
            t1 - t0
        );
    }
    // Waiting for ticks, 100 round trips would take seconds.
    assert!(
        elapsed < Duration::from_millis(1500),
        "{N} round trips took {elapsed:?}"
    );
}

/// A normal DIF over shim-hv with the receiving daemon stopped: the
/// sender's ring fills, the frames that follow wait in the shim's backlog,
/// and while that is half full the normal IPCP stops reading the
/// application, whose writes block: far more than ring and backlog hold
/// is written, nothing overflows, and once the receiver runs again every
/// SDU arrives, in order.
#[test]
fn a_full_ring_loses_no_frame_of_a_normal_dif() {
    let (_d, host, guest) = normal_over_hv("hvfull", "sink");
    wait_for("doorbells on both sides", T, || {
        host.counter("doorbell") == 1 && guest.counter("doorbell") == 1
    });
    let mut c = host.client();
    c.register(&name("sink"), Some("net")).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let _srv = std::thread::spawn(move || {
        let req = c.next_request().unwrap();
        let flow = c.accept(&req).unwrap();
        let mut buf = vec![0u8; 65_536];
        let mut got = Vec::new();
        while let Ok(Some(n)) = flow.read_timeout(&mut buf, Duration::from_secs(5)) {
            assert_eq!(n, 4000);
            got.push(u32::from_le_bytes(buf[..4].try_into().unwrap()));
        }
        // The flow stays open (its counters listed) until the test ends.
        let _ = tx.send((got, flow));
    });
    let flow = allocate_retrying(&guest, "vm-app", "sink", "net", false);
    // 5000 frames of ~4 KiB (20 MB): one ring slot each; the ring takes
    // 1024, the backlog up to 1024 (4 MiB) and, at a quarter of that, blocks the
    // N-1 port above: the rest waits in the normal IPCP's RMT, where the
    // scheduling policy decides what is dropped (this cube has no flow
    // control); without the block the backlog would overflow.
    const N: u32 = 5000;
    let pid = host.child.id() as libc::pid_t;
    // SAFETY: signals our own child process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let writer = std::thread::spawn(move || {
        let mut sdu = vec![7u8; 4000];
        for k in 0..N {
            sdu[..4].copy_from_slice(&k.to_le_bytes());
            flow.write(&sdu).unwrap();
        }
        flow
    });
    let parks = |d: &Daemon| d.counter("upper_blocks");
    // Well within the peer's 1 s liveness timeout.
    let deadline = std::time::Instant::now() + Duration::from_millis(400);
    while parks(&guest) == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    let (got, _sink) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let _flow = writer.join().unwrap();
    assert!(
        guest.counter("tx_backlog_queued") > 0 && parks(&guest) > 0,
        "the ring never filled: the test proves nothing"
    );
    assert_eq!(guest.counter("tx_ring_full"), 0, "nothing overflowed");
    // This cube has no flow control: a sink thread slower than the burst
    // that follows SIGCONT may lose SDUs at its socket, counted there.
    let dropped_at_sink: u64 = host
        .client()
        .list_flows()
        .unwrap()
        .iter()
        .map(|f| f.counters.drops_in)
        .sum();
    let dropped_in_rmt: u64 = guest
        .client()
        .list_ipcps()
        .unwrap()
        .iter()
        .filter(|ip| ip.kind == "normal")
        .map(|ip| ip.counters["rmt_queue_drops"])
        .sum();
    eprintln!(
        "{} arrived, {dropped_at_sink} dropped at the sink, {dropped_in_rmt} by the RMT's policy",
        got.len()
    );
    assert_eq!(
        got.len() as u64 + dropped_at_sink + dropped_in_rmt,
        u64::from(N),
        "every SDU arrived, or was counted at the sink or in the RMT"
    );
    assert!(got.windows(2).all(|w| w[0] < w[1]), "in order");
    assert_eq!(guest.counter("peer_losses"), 0);
}

/// Two flows over one shim-hv device, the application of one of them no
/// longer reading: with per-flow credit, its writer is held back (and
/// loses nothing), while the other flow goes on delivering at the rate it
/// has alone. (Before credit, the receiving daemon stopped reading the
/// whole ring once the stalled flow held 64 SDUs, and the other flow
/// stopped with it.)
#[test]
fn a_stalled_application_does_not_stall_the_other_flows_of_the_device() {
    stalled_flow_does_not_stall_the_device(false);
}

/// The same with shared-memory rings at the applications.
#[test]
fn a_stalled_application_with_rings_does_not_stall_the_other_flows() {
    let _one = RINGS_TESTS.lock().unwrap_or_else(|e| e.into_inner());
    stalled_flow_does_not_stall_the_device(true);
}

/// Sends `n` SDUs of `len` bytes on `tx` while a thread reads them from
/// `rx`; the time it took for all of them to arrive (panics if they do not
/// within `T`).
fn stream(tx: &Flow, rx: &Flow, n: u32, len: usize) -> Duration {
    let start = std::time::Instant::now();
    std::thread::scope(|sc| {
        let reader = sc.spawn(move || {
            let mut buf = vec![0u8; 65_536];
            for k in 0..n {
                let got = rx.read_timeout(&mut buf, T).unwrap();
                let Some(m) = got else {
                    panic!("SDU {k} of {n} of the other flow did not arrive within {T:?}");
                };
                assert_eq!(m, len);
                assert_eq!(u32::from_le_bytes(buf[..4].try_into().unwrap()), k);
            }
        });
        let mut sdu = vec![3u8; len];
        for k in 0..n {
            sdu[..4].copy_from_slice(&k.to_le_bytes());
            // A writer held back that long fails the test (not hangs it).
            let went = tx.write_timeout(&sdu, T).unwrap();
            assert!(
                went,
                "SDU {k} of {n} of the other flow could not be written within {T:?}"
            );
        }
        reader.join().unwrap();
    });
    start.elapsed()
}

fn stalled_flow_does_not_stall_the_device(rings: bool) {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Arc;
    let p = pair();
    // Two applications at the host, accepting one flow each.
    let accept_one = |n: &str| {
        let mut c = p.host.client();
        c.set_rings(rings);
        c.register(&name(n), Some("hv")).unwrap();
        std::thread::spawn(move || {
            let req = c.next_request().unwrap();
            (c.accept(&req).unwrap(), c)
        })
    };
    let (slow_srv, fast_srv) = (accept_one("slow"), accept_one("fast"));
    let mut c = p.guest.client();
    c.set_rings(rings);
    let to_slow = allocate(&mut c, "vm-slow", "slow").unwrap();
    let to_fast = allocate(&mut c, "vm-fast", "fast").unwrap();
    let (slow, _c1) = slow_srv.join().unwrap();
    let (fast, _c2) = fast_srv.join().unwrap();
    assert_eq!(to_fast.has_rings(), rings);

    const N: u32 = 20_000;
    const LEN: usize = 1000;
    // The other flow's rate alone.
    let alone = stream(&to_fast, &fast, N, LEN);

    // The slow application stops reading; its writer writes on until it
    // is held back (its writes block).
    let written = Arc::new(AtomicU32::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (written, stop) = (written.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut sdu = vec![9u8; LEN];
            while !stop.load(Ordering::Relaxed) {
                let k = written.load(Ordering::Relaxed);
                sdu[..4].copy_from_slice(&k.to_le_bytes());
                if to_slow.write(&sdu).is_err() {
                    break;
                }
                written.store(k + 1, Ordering::Relaxed);
            }
            to_slow
        })
    };
    let mut last = u32::MAX;
    wait_for("the stalled flow's writer to be held back", T, || {
        std::thread::sleep(Duration::from_millis(300));
        let now = written.load(Ordering::Relaxed);
        std::mem::replace(&mut last, now) == now
    });
    eprintln!("stalled flow: {last} SDUs written before its writer blocked");

    // The other flow still delivers everything, at much its rate alone.
    let beside = stream(&to_fast, &fast, N, LEN);
    let rate = |d: Duration| f64::from(N) / d.as_secs_f64();
    eprintln!(
        "other flow: {:.0} SDUs/s alone, {:.0} SDUs/s beside the stalled one",
        rate(alone),
        rate(beside)
    );
    assert!(
        rate(beside) >= rate(alone) / 3.0,
        "the other flow slowed down from {alone:?} to {beside:?} for {N} SDUs"
    );
    if !rings {
        // Credit held the stalled flow back at the sender, not the ring.
        assert!(p.guest.counter("credit_waits") > 0);
        assert_eq!(p.host.counter("rx_ring_waits"), 0);
    }

    // The stalled application reads again: nothing was lost, in order.
    stop.store(true, Ordering::Relaxed);
    let mut buf = vec![0u8; 65_536];
    let mut got = 0u32;
    let reader = std::thread::spawn(move || {
        while let Ok(Some(n)) = slow.read_timeout(&mut buf, Duration::from_secs(3)) {
            assert_eq!(n, LEN);
            assert_eq!(u32::from_le_bytes(buf[..4].try_into().unwrap()), got);
            got += 1;
        }
        (got, slow)
    });
    let _to_slow = writer.join().unwrap();
    let (got, _slow) = reader.join().unwrap();
    assert_eq!(got, written.load(Ordering::Relaxed), "every SDU arrived");
    for d in [&p.host, &p.guest] {
        assert_eq!(d.counter("rx_over_credit"), 0);
        assert_eq!(d.counter("rx_bad_credit"), 0);
    }
}

/// A guest that announces no credit (`credit = false`, as IRATI's
/// shim-hv) writes on eight flows whose applications at the host do not
/// read: the host holds their SDUs up to 64 per flow and 8 MiB over all
/// flows, and then stops reading the ring (the guest's writers block).
/// It held 63 SDUs a flow before, whatever their size: 30 MB here, and
/// 254 MiB with 63 flows of 64 KiB SDUs. Once the applications read,
/// every SDU arrives, in order (the pause ends). (A paused ring takes no
/// control message either: no allocation while the applications stall.)
#[test]
fn without_credit_what_the_host_holds_is_bounded_in_bytes() {
    const FLOWS: usize = 8;
    const LEN: usize = 60_000;
    const CAP: u64 = 8 << 20;
    let (host, guest, _dir) = no_credit_pair("hvnocredit");
    let mut srv = host.client();
    // On sockets: with rings, an SDU the application has no room for
    // waits in the VMPI ring itself, and nothing is held.
    srv.set_rings(false);
    srv.register(&name("sink"), Some("hv")).unwrap();
    let accepting = std::thread::spawn(move || {
        let flows: Vec<Flow> = (0..FLOWS)
            .map(|_| {
                let req = srv.next_request().unwrap();
                srv.accept(&req).unwrap()
            })
            .collect();
        (flows, srv)
    });
    let mut c = guest.client();
    // All allocated first: a paused ring takes no allocation either.
    let flows: Vec<Flow> = (0..FLOWS)
        .map(|k| allocate(&mut c, &format!("vm{k}"), "sink").unwrap())
        .collect();
    // One writer, round-robin over the flows, so that they fill alike: a
    // flow that ran ahead would reach its 64 held SDUs (its next SDU then
    // waits in the ring, which pauses it) before the IPCP's 8 MiB were.
    let writer = std::thread::spawn(move || {
        let mut written = vec![0u32; FLOWS];
        let mut sdu = vec![0u8; LEN];
        'all: loop {
            for (k, f) in flows.iter().enumerate() {
                sdu[4..].fill(k as u8);
                sdu[..4].copy_from_slice(&written[k].to_le_bytes());
                // Blocked for 3 s: held back for good.
                if !f.write_timeout(&sdu, Duration::from_secs(3)).unwrap() {
                    break 'all;
                }
                written[k] += 1;
            }
        }
        (written, flows)
    });
    let (sinks, _srv) = accepting.join().unwrap();
    let (written, flows) = writer.join().unwrap();
    let peak = host.counter("rx_held_peak");
    eprintln!(
        "held at most {peak} bytes; {} bytes held now",
        host.counter("rx_held_bytes")
    );
    assert!(
        peak >= CAP,
        "the bound was never reached: the test proves nothing"
    );
    assert!(
        peak < CAP + LEN as u64,
        "{peak} bytes held, beyond {CAP} and one SDU"
    );
    // The applications read: everything arrives, in order.
    let readers: Vec<JoinHandle<u32>> = sinks
        .into_iter()
        .map(|sink| {
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65_536];
                let mut got = 0u32;
                while let Ok(Some(n)) = sink.read_timeout(&mut buf, Duration::from_secs(3)) {
                    assert_eq!(n, LEN);
                    assert_eq!(u32::from_le_bytes(buf[..4].try_into().unwrap()), got);
                    got += 1;
                }
                got
            })
        })
        .collect();
    let got: Vec<u32> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    drop(flows);
    assert_eq!(got, written, "every SDU arrived, on every flow");
    assert_eq!(host.counter("rx_held_bytes"), 0);
}

/// A guest without credit writes SDUs to a host application that does
/// not read, more than the application's socket takes (the host holds the
/// rest), and closes its flow. The host keeps the flow's end open until
/// the application has read them all, and then it ends. Before, the host
/// handed the socket what fitted and dropped the held SDUs with the flow.
#[test]
fn sdus_the_host_holds_when_the_guest_closes_still_reach_the_application() {
    const SDUS: u32 = 40;
    const LEN: usize = 60_000;
    let (host, guest, _dir) = no_credit_pair("hvended");
    let mut srv = host.client();
    srv.set_rings(false);
    srv.register(&name("sink"), Some("hv")).unwrap();
    let accepting = std::thread::spawn(move || {
        let req = srv.next_request().unwrap();
        (srv.accept(&req).unwrap(), srv)
    });
    let mut c = guest.client();
    let flow = allocate(&mut c, "vm", "sink").unwrap();
    let (sink, _srv) = accepting.join().unwrap();
    let mut sdu = vec![0u8; LEN];
    for i in 0..SDUS {
        sdu[..4].copy_from_slice(&i.to_le_bytes());
        flow.write(&sdu).unwrap();
    }
    wait_for("the host to hold SDUs", T, || {
        host.counter("rx_held_bytes") > 0
    });
    drop(flow);
    // The end reaches the host while it holds SDUs for the application:
    // the host lists the flow as ended, with what it holds.
    let held = held_after_end(&host, sink.info().port);
    assert!(held > 0, "nothing held at the end");
    let mut buf = vec![0u8; 65_536];
    let mut got = 0u32;
    let end = loop {
        match sink.read_timeout(&mut buf, T) {
            Ok(Some(n)) => {
                assert_eq!(n, LEN);
                assert_eq!(u32::from_le_bytes(buf[..4].try_into().unwrap()), got);
                got += 1;
            }
            Ok(None) => panic!("neither an SDU nor the end after {got} SDUs"),
            Err(e) => break e,
        }
    };
    assert_eq!(got, SDUS, "SDUs read before the end ({end})");
    assert_eq!(end.kind(), ErrorKind::DaemonGone, "{end}");
    assert_eq!(host.counter("rx_held_bytes"), 0);
}

/// A same-user process that speaks the doorbell protocol of `PATH.bell`
/// and makes blocking every descriptor it shares with the daemon (an
/// eventfd it sends, one it receives: one open file each, whose
/// O_NONBLOCK both hold), with the counter of the one it sent nearly
/// full: the daemon must go on serving. Then it speaks the current
/// exchange and floods the connection without ever reading it.
#[test]
fn a_doorbell_peer_cannot_block_the_daemon() {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let dir = temp_dir("hvbell");
    let _dir = Dir(dir.clone());
    let shm = dir.join("vmpi0");
    let host = Daemon::start_with("host", &hv_config("host", &shm, "host"));
    let bell = dir.join("vmpi0.bell");
    wait_for("the doorbell socket", T, || bell.exists());
    let connect = || {
        use nix::sys::socket::{self as s, AddressFamily, SockFlag, SockType, UnixAddr};
        let fd = s::socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        s::connect(fd.as_raw_fd(), &UnixAddr::new(&bell).unwrap()).unwrap();
        fd
    };
    let make_blocking = |fd: i32| {
        // SAFETY: fcntl on a descriptor of this process.
        unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    };
    let answers = |what: &str| {
        let answered = host.answers_within(T);
        assert!(
            matches!(answered, Some(Ok(1))),
            "{what}: the daemon hangs on its doorbell: {answered:?}"
        );
    };

    // The exchange of eventfds (SCM_RIGHTS), as daemons spoke it.
    let conn = connect();
    // SAFETY: eventfd has no preconditions; a fresh descriptor.
    let mine = unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, libc::EFD_CLOEXEC)) };
    let iov = [std::io::IoSlice::new(b"RINAHVB1")];
    let fds = [mine.as_raw_fd()];
    let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
    nix::sys::socket::sendmsg::<()>(
        conn.as_raw_fd(),
        &iov,
        &cmsg,
        nix::sys::socket::MsgFlags::empty(),
        None,
    )
    .unwrap();
    make_blocking(mine.as_raw_fd());
    let max: u64 = 0xffff_ffff_ffff_fffe;
    // SAFETY: writes 8 bytes from a live u64.
    unsafe { libc::write(mine.as_raw_fd(), (&max as *const u64).cast(), 8) };
    // Whatever comes back (an answer, or the daemon closing): its
    // descriptors are made blocking too.
    let mut buf = [0u8; 16];
    let mut space = nix::cmsg_space!([i32; 4]);
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut theirs = Vec::new();
    if let Ok(msg) = nix::sys::socket::recvmsg::<()>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        nix::sys::socket::MsgFlags::MSG_CMSG_CLOEXEC,
    ) {
        for c in msg.cmsgs().unwrap() {
            if let nix::sys::socket::ControlMessageOwned::ScmRights(v) = c {
                for f in v {
                    make_blocking(f);
                    // SAFETY: the kernel installed it for us.
                    theirs.push(unsafe { OwnedFd::from_raw_fd(f) });
                }
            }
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    answers("eventfds made blocking");

    // The current exchange: a hello each way, then one-byte doorbells on
    // the connection; this peer floods it and never reads.
    let conn2 = connect();
    nix::sys::socket::send(
        conn2.as_raw_fd(),
        b"RINAHVB2",
        nix::sys::socket::MsgFlags::empty(),
    )
    .unwrap();
    make_blocking(conn2.as_raw_fd());
    for _ in 0..10_000 {
        if nix::sys::socket::send(
            conn2.as_raw_fd(),
            b"x",
            nix::sys::socket::MsgFlags::MSG_DONTWAIT,
        )
        .is_err()
        {
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    answers("a flooded doorbell connection");
    drop((conn, conn2, theirs));
}

/// A guest that publishes a tail no reader could have in the ring the host
/// fills (further from the head than the ring is long), and keeps its
/// heartbeat and its doorbell connection: the host's SDUs find no room,
/// and the host must wait for a doorbell or its next tick, as on a full
/// ring, not try again at once in a loop (its one thread would spin at
/// full speed for as long as the guest likes).
#[test]
fn a_guest_publishing_a_garbage_tail_does_not_make_the_host_spin() {
    let p = pair();
    let _srv = echo_server(&p.guest, "echo");
    let mut c = p.host.client();
    let f = allocate(&mut c, "host-app", "echo").unwrap();
    assert_eq!(roundtrip(&f, b"hello"), b"hello");
    // The guest stops reading (stopped), but its heartbeat goes on.
    // SAFETY: a signal to a child process of this test.
    unsafe { libc::kill(p.guest.child.id() as i32, libc::SIGSTOP) };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p.shm)
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let beat = {
        let (file, stop) = (file.try_clone().unwrap(), stop.clone());
        std::thread::spawn(move || {
            let mut b = [0u8; 8];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                file.read_exact_at(&mut b, 136).unwrap();
                let next = u64::from_le_bytes(b).wrapping_add(1);
                file.write_all_at(&next.to_le_bytes(), 136).unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    // The host -> guest ring's published tail.
    let tail = (HEADER + 64) as u64;
    file.write_all_at(&(u32::MAX / 2).to_le_bytes(), tail)
        .unwrap();
    for k in 0..4u8 {
        f.write(&[k; 200]).unwrap();
    }
    // Once the host found the garbage (no room for its SDUs), it must
    // wait, not spin.
    wait_for("the host to find the garbage tail", T, || {
        p.host.counter("tx_ring_errors") > 0
    });
    let before = common::cpu_time(p.host.child.id());
    std::thread::sleep(Duration::from_secs(2));
    let used = common::cpu_time(p.host.child.id()) - before;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    beat.join().unwrap();
    // SAFETY: as above.
    unsafe { libc::kill(p.guest.child.id() as i32, libc::SIGCONT) };
    assert!(
        used < Duration::from_millis(500),
        "the host spun: {used:?} of CPU in 2 s"
    );
    assert!(p.host.counter("tx_ring_errors") > 0, "the garbage was seen");
    assert!(p.host.client().list_ipcps().is_ok());
}

/// A tmpfs of `size` mounted at `dir`, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts it, or says why it cannot be done here.
    fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        // SAFETY: no arguments, no side effects.
        if unsafe { libc::geteuid() } != 0 {
            return Err("needs root (mounts a tmpfs)".into());
        }
        std::fs::create_dir_all(dir).unwrap();
        let ok = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            Ok(Tmpfs(dir.to_path_buf()))
        } else {
            Err("cannot mount a tmpfs".into())
        }
    }

    /// Fills what is left of it with a file.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.0.join("filler")).unwrap();
        let chunk = vec![7u8; 4096];
        while f.write_all(&chunk).is_ok() {}
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// The shared file on a file system that another user fills up (as
/// anyone may fill `/dev/shm`) after the host created it: a page of the
/// rings first touched then has no memory behind it, and touching it kills
/// the daemon (SIGBUS) with every flow it serves. The host must have the
/// rings' memory from the start (or refuse to start, saying why), so that
/// traffic that goes all around the rings finds every page there.
#[test]
fn a_full_file_system_under_the_shared_file_does_not_kill_the_daemons() {
    let dir = temp_dir("hvfull");
    let _dir = Dir(dir.clone());
    let fs = match Tmpfs::mount(&dir.join("shm"), "24m") {
        Ok(fs) => fs,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let shm = fs.0.join("vmpi0");
    let host = Daemon::start_with("host", &hv_config("host", &shm, "host"));
    // It answers requests: its IPCPs are built (the control socket may
    // take a connection before).
    wait_for("the host's ticks", T, || host.counter("ticks") > 0);
    fs.fill();
    let guest = Daemon::start_with("guest", &hv_config("guest", &shm, "guest"));
    wait_until_up(&host);
    wait_until_up(&guest);
    let _srv = echo_server(&guest, "echo");
    let mut c = host.client();
    let f = allocate(&mut c, "host-app", "echo").unwrap();
    // 64 KiB SDUs take 17 slots each: 80 of them go around both rings.
    let mut buf = vec![0u8; 65_536];
    let mut echoed = 0;
    for k in 0..80u8 {
        let sdu = vec![k; 65_536];
        let back = f.write(&sdu).and_then(|()| f.read_timeout(&mut buf, T));
        match back {
            Ok(Some(n)) if buf[..n] == sdu[..] => echoed += 1,
            _ => break,
        }
    }
    let (mut host, mut guest) = (host, guest);
    let host_exit = host.child.try_wait().unwrap();
    let guest_exit = guest.child.try_wait().unwrap();
    assert!(
        host_exit.is_none() && guest_exit.is_none(),
        "after {echoed} round trips: host {host_exit:?}, guest {guest_exit:?}"
    );
    assert_eq!(echoed, 80);
}

/// Someone who may write the file at the host's path (here: every user)
/// made it before the host did, laid out as a host would: the guest side,
/// which waits for a layout to appear there, must not take it, for its
/// maker could cut it short under the guest's mapping, and the guest's
/// next heartbeat would kill it (SIGBUS). It says why and waits.
#[test]
fn a_guest_does_not_take_a_file_another_user_could_cut_short() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir("hvsquat");
    let _dir = Dir(dir.clone());
    let shm = dir.join("vmpi0");
    let file = std::fs::File::create(&shm).unwrap();
    let mut hdr = Vec::new();
    hdr.extend_from_slice(b"RINA-HV1");
    for word in [1u32, GEO.slot_size, GEO.slots] {
        hdr.extend_from_slice(&word.to_le_bytes());
    }
    file.set_len(rina_core::shim_hv::link::region_size(GEO) as u64)
        .unwrap();
    file.write_all_at(&hdr, 0).unwrap();
    std::fs::set_permissions(&shm, std::fs::Permissions::from_mode(0o666)).unwrap();
    let mut guest = Daemon::start_with("guest", &hv_config("guest", &shm, "guest"));
    // A few ticks: it took the file or refused it.
    wait_for("the guest's ticks", T, || guest.counter("ticks") >= 3);
    // Its maker cuts it short.
    file.set_len(0).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let exit = guest.child.try_wait().unwrap();
    assert!(exit.is_none(), "the guest died: {exit:?}");
    assert!(guest.client().list_ipcps().is_ok());
    let log = guest.log();
    assert!(
        log.contains("writable by every user (mode 666)"),
        "the guest says why: {log}"
    );
}

/// A peer that publishes a well-formed buffer larger than any the DIF
/// carries (100 KB; SDUs are at most 64 KiB): it is dropped and counted
/// as garbage, not dropped unseen.
#[test]
fn a_buffer_larger_than_any_sdu_is_counted() {
    use rina_core::shim_hv::ring::{Producer, Region};
    let dir = temp_dir("hvbig");
    let _dir = Dir(dir.clone());
    let shm = dir.join("vmpi0");
    let host = Daemon::start_with("host", &hv_config("host", &shm, "host"));
    // It answers requests: its IPCPs are built (the control socket may
    // take a connection before).
    wait_for("the host's ticks", T, || host.counter("ticks") > 0);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&shm)
        .unwrap();
    let len = file.metadata().unwrap().len() as usize;
    // SAFETY: a shared mapping of the whole file, unmapped below; only
    // the ring code touches it, through the region.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: the mapping is page-aligned and lives until the munmap.
    let region = unsafe { Region::new(std::ptr::NonNull::new(p.cast()).unwrap(), len) }.unwrap();
    // The guest -> host ring, written as the guest would.
    let ring = region
        .sub(
            HEADER + GEO.ring_bytes().next_multiple_of(4096),
            GEO.ring_bytes(),
        )
        .unwrap();
    let mut tx = Producer::new(ring, GEO).unwrap();
    // On the control channel (its first 4 bytes, 0).
    tx.push(&[&[0u8; 100_000]]).unwrap();
    let tail = ring.u32_at(64).unwrap();
    wait_for("the host to take the buffer", T, || {
        tail.load(std::sync::atomic::Ordering::Acquire) == tx.head()
    });
    assert_eq!(host.counter("rx_ring_errors"), 1, "dropped unseen");
    // SAFETY: unmaps what was mapped above; the region is not used after.
    unsafe { libc::munmap(p, len) };
}

/// The host's doorbell socket is for those who may use the shared file,
/// whatever the daemon's umask: with umask 0 it was left writable, so any
/// local user could connect, take the guest's place as the doorbell peer
/// (a newer connection replaces the older) and leave the two daemons
/// polling every 50 ms instead of ringing each other.
#[test]
fn the_doorbell_socket_is_no_more_open_than_the_shared_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir("hvbellmode");
    let _dir = Dir(dir.clone());
    let shm = dir.join("vmpi0");
    let host = Daemon::start_with_umask("host", &hv_config("host", &shm, "host"), Some(0));
    wait_for("the host's ticks", T, || host.counter("ticks") > 0);
    let file = std::fs::metadata(&shm).unwrap().permissions().mode() & 0o777;
    let bell = std::fs::metadata(dir.join("vmpi0.bell"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(file, 0o600);
    assert_eq!(bell, 0o600, "the doorbell socket has mode {bell:o}");
}
