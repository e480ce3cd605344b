//! Tests against a fake daemon on a `socketpair`; no `rinad` needed.

use crate::sock;
use crate::{AppName, Client, ErrorKind, FlowInfo, IncomingFlow, QosSpec};
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use rina_wire::ctl::{self, CtlError, IpcpInfo, Message, Op, Reply, Request, MAX_CTL_MSG};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::thread::{self, JoinHandle};
use std::time::Duration;

fn pair() -> (OwnedFd, OwnedFd) {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .expect("socketpair")
}

/// Starts a fake daemon running `f` on its end of a fresh control connection.
fn fake_daemon<F: FnOnce(OwnedFd) + Send + 'static>(f: F) -> (Client, JoinHandle<()>) {
    let (a, b) = pair();
    (Client::from_fd(a), thread::spawn(move || f(b)))
}

fn recv_req(fd: &OwnedFd) -> Option<Request> {
    let mut buf = vec![0; MAX_CTL_MSG];
    let p = sock::recv(fd.as_fd(), &mut buf).expect("daemon recv");
    if p.len == 0 {
        return None;
    }
    Some(ctl::decode(&buf[..p.len]).expect("valid request"))
}

fn send_msg(fd: &OwnedFd, m: &Message, attach: Option<&OwnedFd>) {
    let fds: Vec<_> = attach.iter().map(|f| f.as_raw_fd()).collect();
    sock::send(fd.as_fd(), &ctl::encode(m), &fds).expect("daemon send");
}

/// The fake daemon's answer to request `id`: an empty list of IPCPs (a
/// call that takes no part in what the test looks at).
fn reply_no_ipcps(fd: &OwnedFd, id: u64) {
    let result = Ok(Reply::Ipcps { ipcps: Vec::new() });
    send_msg(fd, &Message::Reply { id, result }, None);
}

fn name(s: &str) -> AppName {
    s.parse().expect("valid name")
}

fn info(max_sdu: u32) -> FlowInfo {
    FlowInfo {
        port: 5,
        dif: "udp.net".into(),
        local: name("client"),
        remote: name("echo"),
        qos: QosSpec::default(),
        max_sdu,
        direct: false,
        bundle: None,
    }
}

fn incoming(handle: u64) -> IncomingFlow {
    IncomingFlow {
        handle,
        dif: "udp.net".into(),
        local: name("echo"),
        remote: name("peer"),
        qos: QosSpec::default(),
    }
}

/// Echoes every packet on `fd` until end of file.
fn echo(fd: OwnedFd) {
    let mut buf = vec![0; 65536];
    loop {
        match sock::recv(fd.as_fd(), &mut buf) {
            Ok(p) if p.len > 0 => {
                sock::send(fd.as_fd(), &buf[..p.len], &[]).expect("echo send");
            }
            _ => return,
        }
    }
}

#[test]
fn allocate_gets_a_working_flow_and_queues_requests() {
    let (mut client, daemon) = fake_daemon(|ctl| {
        let req = recv_req(&ctl).expect("a request");
        let Op::Allocate { remote, rings, .. } = &req.op else {
            panic!("expected allocate, got {:?}", req.op)
        };
        assert_eq!(remote.to_string(), "echo");
        assert!(rings, "a client asks for rings by default");
        // A flow request arrives before the reply: the client must queue it.
        send_msg(&ctl, &Message::FlowRequest(incoming(7)), None);
        // A stale reply for another id is ignored.
        send_msg(
            &ctl,
            &Message::Reply {
                id: req.id + 100,
                result: Ok(Reply::Done),
            },
            None,
        );
        let (mine, theirs) = pair();
        // As rinad over an IPCP without rings: the flow's first packet
        // says so, and the socket carries the SDUs.
        use rina_core::shim_hv::flow_rings::Setup;
        sock::send(mine.as_fd(), &Setup::None.encode(), &[]).expect("setup");
        send_msg(
            &ctl,
            &Message::Reply {
                id: req.id,
                result: Ok(Reply::Flow(info(100))),
            },
            Some(&theirs),
        );
        drop(theirs);
        echo(mine);
    });
    let flow = client
        .allocate(&name("client"), &name("echo"), None, &QosSpec::default())
        .expect("allocate");
    assert_eq!(flow.info().port, 5);
    assert_eq!(flow.max_sdu(), 100);

    flow.write(b"hello").expect("write");
    let mut buf = [0u8; 100];
    let n = flow.read(&mut buf).expect("read");
    assert_eq!(&buf[..n], b"hello");

    let full = [7u8; 100];
    flow.write(&full).expect("a max-size SDU");
    let n = flow
        .read_timeout(&mut buf, Duration::from_secs(10))
        .expect("read")
        .expect("an SDU");
    assert_eq!(n, 100);

    let e = flow.write(&[0u8; 101]).expect_err("too large");
    assert_eq!(e.kind, ErrorKind::SduTooLarge);
    assert!(
        e.message.contains("101") && e.message.contains("100"),
        "{e}"
    );
    let e = flow.write(&[]).expect_err("empty");
    assert_eq!(e.kind, ErrorKind::InvalidRequest);

    // A buffer smaller than the SDU: the error says so.
    flow.write(&[1u8; 50]).expect("write");
    let e = flow.read(&mut buf[..10]).expect_err("truncated");
    assert_eq!(e.kind, ErrorKind::SduTooLarge, "{e}");

    assert_eq!(client.pending_requests(), 1);
    let r = client
        .next_request_timeout(Duration::ZERO)
        .expect("no error")
        .expect("the queued request");
    assert_eq!(r.handle, 7);

    flow.deallocate();
    drop(client);
    daemon.join().expect("fake daemon");
}

#[test]
fn accept_refuse_and_lists() {
    let (mut client, daemon) = fake_daemon(|ctl| {
        let req = recv_req(&ctl).expect("register");
        assert!(matches!(req.op, Op::Register { .. }));
        send_msg(
            &ctl,
            &Message::Reply {
                id: req.id,
                result: Ok(Reply::Registered {
                    difs: vec!["udp.net".into()],
                }),
            },
            None,
        );
        send_msg(&ctl, &Message::FlowRequest(incoming(1)), None);
        send_msg(&ctl, &Message::FlowRequest(incoming(2)), None);
        let req = recv_req(&ctl).expect("accept");
        assert_eq!(
            req.op,
            Op::Accept {
                handle: 1,
                rings: false,
                direct: false,
                bundle: None,
            }
        );
        let (mine, theirs) = pair();
        send_msg(
            &ctl,
            &Message::Reply {
                id: req.id,
                result: Ok(Reply::Flow(info(1000))),
            },
            Some(&theirs),
        );
        drop(theirs);
        let req = recv_req(&ctl).expect("refuse");
        assert!(matches!(req.op, Op::Refuse { handle: 2, .. }));
        send_msg(
            &ctl,
            &Message::Reply {
                id: req.id,
                result: Ok(Reply::Done),
            },
            None,
        );
        let req = recv_req(&ctl).expect("list");
        assert_eq!(req.op, Op::ListIpcps);
        send_msg(
            &ctl,
            &Message::Reply {
                id: req.id,
                result: Ok(Reply::Ipcps {
                    ipcps: vec![IpcpInfo {
                        name: "a.udp".into(),
                        kind: "shim-udp".into(),
                        dif: "udp.net".into(),
                        address: "127.0.0.1:1".into(),
                        flows: 1,
                        names: vec![],
                        names_more: 0,
                        counters: Default::default(),
                    }],
                }),
            },
            None,
        );
        let req = recv_req(&ctl).expect("allocate");
        send_msg(
            &ctl,
            &Message::Reply {
                id: req.id,
                result: Err(CtlError::new(ErrorKind::Refused, "echo said no")),
            },
            None,
        );
        echo(mine);
    });
    // An application that hands its descriptors to other code turns
    // rings off: the request says so and the flow is its socket.
    client.set_rings(false);
    let difs = client.register(&name("echo"), None).expect("register");
    assert_eq!(difs, vec!["udp.net".to_string()]);
    let r1 = client.next_request().expect("first request");
    let flow = client.accept(&r1).expect("accept");
    assert_eq!(flow.max_sdu(), 1000);
    let r2 = client.next_request().expect("second request");
    client.refuse(&r2, "busy").expect("refuse");
    let ipcps = client.list_ipcps().expect("list");
    assert_eq!(ipcps[0].kind, "shim-udp");
    let e = client
        .allocate(&name("a"), &name("echo"), None, &QosSpec::default())
        .expect_err("refused");
    assert_eq!(e.kind, ErrorKind::Refused);
    assert_eq!(e.message, "echo said no");
    drop(flow);
    daemon.join().expect("fake daemon");
}

#[test]
fn daemon_gone_is_reported_not_hung() {
    let (mut client, daemon) = fake_daemon(|ctl| {
        let _ = recv_req(&ctl);
        drop(ctl);
    });
    let e = client.list_flows().expect_err("daemon closed");
    assert_eq!(e.kind, ErrorKind::DaemonGone, "{e}");
    daemon.join().expect("fake daemon");
    // Later calls fail the same way.
    let e = client.list_difs().expect_err("still gone");
    assert_eq!(e.kind, ErrorKind::DaemonGone, "{e}");
    let e = client
        .next_request_timeout(Duration::from_secs(5))
        .expect_err("gone");
    assert_eq!(e.kind, ErrorKind::DaemonGone, "{e}");
}

#[test]
fn flow_read_after_close_is_daemon_gone() {
    let (a, b) = pair();
    let flow = crate::Flow::from_parts(a, info(100));
    let mut buf = [0u8; 100];
    assert_eq!(
        flow.read_timeout(&mut buf, Duration::from_millis(1))
            .expect("no error"),
        None
    );
    drop(b);
    let e = flow.read(&mut buf).expect_err("closed");
    assert_eq!(e.kind, ErrorKind::DaemonGone);
    assert!(e.message.contains("closed"), "{e}");
    let e = flow.write(b"x").expect_err("closed");
    assert_eq!(e.kind, ErrorKind::DaemonGone, "{e}");
}

#[test]
fn unsent_bytes_counts_what_the_daemon_has_not_taken() {
    let (a, b) = pair();
    let flow = crate::Flow::from_parts(a, info(100));
    assert_eq!(flow.unsent_bytes().unwrap(), 0);
    flow.write(&[1u8; 50]).unwrap();
    let one = flow.unsent_bytes().unwrap();
    assert!(one >= 50, "{one}");
    flow.write(&[2u8; 50]).unwrap();
    let two = flow.unsent_bytes().unwrap();
    assert!(two > one, "{two} after two SDUs, {one} after one");
    // The daemon takes one SDU, then the other: the backlog shrinks to 0.
    let mut buf = [0u8; 100];
    assert_eq!(sock::recv(b.as_fd(), &mut buf).unwrap().len, 50);
    let left = flow.unsent_bytes().unwrap();
    assert!(left > 0 && left < two, "{left}");
    assert_eq!(sock::recv(b.as_fd(), &mut buf).unwrap().len, 50);
    assert_eq!(flow.unsent_bytes().unwrap(), 0);
}

#[test]
fn bad_daemon_answers_are_errors() {
    let (mut client, daemon) = fake_daemon(|ctl| {
        // A flow without its descriptor.
        let req = recv_req(&ctl).expect("allocate");
        send_msg(
            &ctl,
            &Message::Reply {
                id: req.id,
                result: Ok(Reply::Flow(info(10))),
            },
            None,
        );
        // The wrong reply type.
        let req = recv_req(&ctl).expect("list");
        send_msg(
            &ctl,
            &Message::Reply {
                id: req.id,
                result: Ok(Reply::Done),
            },
            None,
        );
        // Garbage.
        let _ = recv_req(&ctl).expect("list");
        sock::send(ctl.as_fd(), b"{not json", &[]).expect("send");
    });
    let e = client
        .allocate(&name("a"), &name("b"), None, &QosSpec::default())
        .expect_err("no fd");
    assert_eq!(e.kind, ErrorKind::Internal, "{e}");
    let e = client.list_names().expect_err("wrong reply");
    assert_eq!(e.kind, ErrorKind::Internal, "{e}");
    let e = client.list_names().expect_err("garbage");
    assert_eq!(e.kind, ErrorKind::Internal, "{e}");
    assert!(e.message.contains("malformed"), "{e}");
    daemon.join().expect("fake daemon");
}

#[test]
fn missing_socket_is_daemon_not_running() {
    let path = std::env::temp_dir().join(format!("rina-test-nosuch-{}.sock", std::process::id()));
    let e = Client::connect_to(&path).expect_err("no daemon");
    assert_eq!(e.kind, ErrorKind::DaemonNotRunning);
    assert!(e.message.contains(&path.display().to_string()), "{e}");
}

#[test]
fn io_error_conversion() {
    let e: crate::Error = std::io::Error::from_raw_os_error(libc::EPIPE).into();
    assert_eq!(e.kind, ErrorKind::DaemonGone);
    let e: crate::Error = std::io::Error::from_raw_os_error(libc::EACCES).into();
    assert_eq!(e.kind, ErrorKind::Internal);
}

#[cfg(feature = "tokio")]
#[tokio::test]
async fn async_flow_round_trip() {
    let (a, b) = pair();
    let daemon = thread::spawn(move || echo(b));
    let flow = crate::Flow::from_parts(a, info(2000))
        .into_async()
        .expect("async");
    let mut buf = vec![0u8; 2000];
    for i in 1..=50usize {
        let sdu = vec![i as u8; i * 30];
        flow.write(&sdu).await.expect("write");
        let n = flow.read(&mut buf).await.expect("read");
        assert_eq!(&buf[..n], &sdu[..]);
    }
    let e = flow.write(&[0u8; 2001]).await.expect_err("too large");
    assert_eq!(e.kind, ErrorKind::SduTooLarge);
    drop(flow);
    daemon.join().expect("echo");
}

#[test]
fn into_async_outside_runtime_is_an_error_and_keeps_the_flow() {
    let (a, b) = pair();
    let e = crate::Flow::from_parts(a, info(10))
        .into_async()
        .expect_err("no runtime");
    assert_eq!(e.error().kind, ErrorKind::InvalidRequest, "{e}");
    let flow = e.into_flow();
    // Still blocking (O_NONBLOCK untouched) and still connected.
    let flags = nix::fcntl::fcntl(flow.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFL).expect("flags");
    assert_eq!(flags & libc::O_NONBLOCK, 0);
    let peer = thread::spawn(move || echo(b));
    flow.write(b"still here").expect("write");
    let mut buf = [0u8; 10];
    assert_eq!(flow.read(&mut buf).expect("blocking read"), 10);
    assert_eq!(&buf, b"still here");
    drop(flow);
    peer.join().expect("echo");
    // `?` still works where a crate::Result is returned.
    let (a, _b) = pair();
    let f = || -> crate::Result<crate::AsyncFlow> {
        Ok(crate::Flow::from_parts(a, info(10)).into_async()?)
    };
    assert_eq!(f().expect_err("no runtime").kind, ErrorKind::InvalidRequest);
}

#[test]
fn a_silent_daemon_times_out_and_a_late_reply_is_dropped() {
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let (mut client, daemon) = fake_daemon(move |ctl| {
        // Takes the request, answers nothing until the client gave up.
        let late = recv_req(&ctl).expect("list_flows");
        release_rx.recv().expect("released");
        send_msg(
            &ctl,
            &Message::Reply {
                id: late.id,
                result: Ok(Reply::Flows {
                    flows: vec![],
                    next: None,
                }),
            },
            None,
        );
        let req = recv_req(&ctl).expect("list_ipcps");
        send_msg(
            &ctl,
            &Message::Reply {
                id: req.id,
                result: Ok(Reply::Ipcps { ipcps: vec![] }),
            },
            None,
        );
    });
    assert_eq!(client.timeout(), Some(crate::DEFAULT_TIMEOUT));
    client.set_timeout(Some(Duration::from_millis(100)));
    let t = std::time::Instant::now();
    let e = client.list_flows().expect_err("no answer");
    assert!(t.elapsed() >= Duration::from_millis(100));
    assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
    assert!(
        e.message
            .contains("did not answer the list_flows request within 100 ms"),
        "{e}"
    );
    release_tx.send(()).expect("release");
    // The late reply to list_flows is skipped; the next call gets its own.
    client.set_timeout(None);
    assert_eq!(client.list_ipcps().expect("answered"), vec![]);
    daemon.join().expect("fake daemon");
}

#[test]
fn a_daemon_that_reads_nothing_times_out_the_send() {
    let (a, b) = pair();
    // The smallest send buffer: a few requests fill it.
    nix::sys::socket::setsockopt(&a, nix::sys::socket::sockopt::SndBuf, &1).expect("sndbuf");
    let mut client = Client::from_fd(a);
    client.set_timeout(Some(Duration::from_millis(20)));
    let mut sends_timed_out = false;
    for _ in 0..200 {
        let e = client.list_names().expect_err("no answer");
        assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
        if e.message.contains("did not read the list_names request") {
            sends_timed_out = true;
            break;
        }
        assert!(e.message.contains("did not answer"), "{e}");
    }
    assert!(sends_timed_out, "the send buffer never filled");
    drop(b);
}

#[test]
fn connecting_to_a_stuck_daemon_times_out() {
    use nix::sys::socket::{bind, listen, socket, Backlog, UnixAddr};
    let path = std::env::temp_dir().join(format!("rina-test-stuck-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let l = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("socket");
    bind(l.as_raw_fd(), &UnixAddr::new(&path).expect("addr")).expect("bind");
    // A backlog of 0 takes one connection that is never accepted; the next
    // one waits in connect.
    listen(&l, Backlog::new(0).expect("backlog")).expect("listen");
    let t = std::time::Instant::now();
    let mut held = Vec::new();
    let e = loop {
        match Client::connect_to_timeout(&path, Some(Duration::from_millis(100))) {
            Ok(c) => {
                assert_eq!(c.timeout(), Some(Duration::from_millis(100)));
                held.push(c);
                assert!(held.len() < 10, "the backlog never filled");
            }
            Err(e) => break e,
        }
    };
    assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
    assert!(e.message.contains("did not take the connection"), "{e}");
    assert!(t.elapsed() >= Duration::from_millis(100));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn write_timeout_gives_up_on_a_full_flow_and_sends_once_there_is_room() {
    let (a, b) = pair();
    let flow = crate::Flow::from_parts(a, info(1000));
    // Fill the socket buffer: a zero timeout never waits.
    let mut sent = 0;
    while flow.write_timeout(&[7u8; 1000], Duration::ZERO).unwrap() {
        sent += 1;
        assert!(sent < 100_000, "the socket buffer never filled");
    }
    assert!(sent > 0);
    let t = std::time::Instant::now();
    assert!(!flow
        .write_timeout(&[7u8; 1000], Duration::from_millis(30))
        .unwrap());
    assert!(
        t.elapsed() >= Duration::from_millis(30),
        "{:?}",
        t.elapsed()
    );
    // The daemon takes one SDU: the next write finds room.
    let mut buf = [0u8; 1000];
    assert_eq!(sock::recv(b.as_fd(), &mut buf).unwrap().len, 1000);
    assert!(flow
        .write_timeout(&[8u8; 1000], Duration::from_secs(5))
        .unwrap());
    // An SDU over the flow's maximum is refused before anything is sent.
    let e = flow
        .write_timeout(&[0u8; 1001], Duration::ZERO)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::SduTooLarge, "{e}");
}

/// A fake daemon's end of a flow with rings: the memory file mapped, and
/// the application-to-daemon ring's consumer.
struct FakeRings {
    from_app: rina_core::shim_hv::ring::Consumer,
    to_app: rina_core::shim_hv::ring::Producer,
    _file: std::fs::File,
    /// The write end of the room pipe.
    room: OwnedFd,
}

impl FakeRings {
    /// Publishes `sdu` to the application and rings if it asked (as
    /// rinad's `app_rings` does: a one-byte packet on the flow socket).
    fn deliver(&mut self, daemon_end: &OwnedFd, sdu: &[u8]) {
        self.to_app.push(&[sdu]).expect("room in the ring");
        if self.to_app.take_wakeup() {
            sock::send(daemon_end.as_fd(), &[1], &[]).expect("doorbell");
        }
    }

    /// Takes one SDU from the application and rings if it waits for room.
    fn take(&mut self) -> Vec<u8> {
        let seg = self.from_app.peek().unwrap().expect("an SDU in the ring");
        let n = seg.len();
        let mut v = vec![0; n];
        assert!(self.from_app.read(n, &mut v));
        self.from_app.consume(n);
        if self.from_app.take_wakeup() {
            ring(&self.room);
        }
        v
    }
}

/// Rings the room doorbell (write end `room`), as rinad does: one byte.
fn ring(room: &OwnedFd) {
    assert_eq!(nix::unistd::write(room, &[1]), Ok(1));
}

/// A memory file as long as the rings of `flow_rings::GEOMETRY` need,
/// sealed as rinad seals it.
fn ring_file() -> std::fs::File {
    let file = unsealed_ring_file();
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on a descriptor we own.
    assert_eq!(
        unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) },
        0
    );
    file
}

/// [`ring_file`] before it is sealed.
fn unsealed_ring_file() -> std::fs::File {
    use rina_core::shim_hv::flow_rings;
    use std::os::fd::FromRawFd;
    let (_, _, len) = flow_rings::layout(flow_rings::GEOMETRY);
    // SAFETY: a NUL-terminated name; the descriptor is checked and owned.
    let file = std::fs::File::from(unsafe {
        let raw = libc::memfd_create(
            c"rina-test".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        );
        assert!(raw >= 0, "memfd_create");
        OwnedFd::from_raw_fd(raw)
    });
    file.set_len(len as u64).unwrap();
    file
}

/// A flow offered rings in `file` with room doorbell `room`: (the
/// application's end, the fake daemon's end, what the application made of
/// the offer).
type Offered = (
    OwnedFd,
    OwnedFd,
    Result<Option<crate::rings::Rings>, crate::rings::RingsError>,
);

/// Offers rings in `file` with room doorbell `room` on a fresh flow socket.
fn offer_rings_in(file: &std::fs::File, room: std::os::fd::BorrowedFd<'_>) -> Offered {
    use rina_core::shim_hv::flow_rings::{Setup, GEOMETRY};
    let (app, daemon) = pair();
    sock::send(
        daemon.as_fd(),
        &Setup::Rings(GEOMETRY).encode(),
        &[file.as_raw_fd(), room.as_raw_fd()],
    )
    .unwrap();
    let r = crate::rings::Rings::setup(app.as_fd(), Duration::from_secs(5));
    (app, daemon, r)
}

/// Whether `fd` is readable within `ms` milliseconds.
#[track_caller]
fn readable_within(fd: std::os::fd::BorrowedFd<'_>, ms: u16) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::from(ms)).expect("poll") == 1
}

/// Offers rings on `daemon_end` as rinad does; returns the daemon's side.
fn offer_rings(daemon_end: &OwnedFd) -> FakeRings {
    use rina_core::shim_hv::flow_rings::{self, Setup};
    use rina_core::shim_hv::ring::{Consumer, Producer, Region};
    let geo = flow_rings::GEOMETRY;
    let (to_off, from_off, len) = flow_rings::layout(geo);
    assert_eq!(to_off, 0);
    let file = ring_file();
    // SAFETY: a shared mapping of the whole file, never unmapped (the test
    // process ends soon).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: page-aligned, `len` bytes, alive for the rest of the process.
    let region = unsafe { Region::new(std::ptr::NonNull::new(p.cast()).unwrap(), len) }.unwrap();
    let from_app = Consumer::new(region.sub(from_off, geo.ring_bytes()).unwrap(), geo).unwrap();
    let to_app = Producer::new(region.sub(0, geo.ring_bytes()).unwrap(), geo).unwrap();
    let (room_rx, room) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    sock::send(
        daemon_end.as_fd(),
        &Setup::Rings(geo).encode(),
        &[file.as_raw_fd(), room_rx.as_raw_fd()],
    )
    .unwrap();
    FakeRings {
        from_app,
        to_app,
        _file: file,
        room,
    }
}

#[test]
fn write_timeout_on_rings_gives_up_on_a_full_ring_and_writes_once_the_daemon_took_one() {
    let (app, daemon) = pair();
    let mut fake = offer_rings(&daemon);
    let rings = crate::rings::Rings::setup(app.as_fd(), Duration::from_secs(5))
        .unwrap()
        .expect("rings offered");
    let flow = crate::Flow::with_rings(app, info(1000), Some(rings));
    assert!(flow.has_rings());
    // Fill the send ring: a zero timeout never waits.
    let mut sent = 0;
    while flow.write_timeout(&[7u8; 1000], Duration::ZERO).unwrap() {
        sent += 1;
        assert!(
            sent <= rina_core::shim_hv::flow_rings::GEOMETRY.data_bytes() / 1000,
            "more SDUs than the ring holds"
        );
    }
    assert!(sent > 0);
    let t = std::time::Instant::now();
    assert!(!flow
        .write_timeout(&[7u8; 1000], Duration::from_millis(30))
        .unwrap());
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(30), "{waited:?}");
    // The daemon takes one SDU (and rings nobody): the writer finds the
    // room when it looks again.
    let seg = fake.from_app.peek().unwrap().expect("an SDU in the ring");
    assert_eq!(seg.len(), 1000);
    fake.from_app.consume(1000);
    assert!(flow
        .write_timeout(&[8u8; 1000], Duration::from_secs(5))
        .unwrap());
    assert!(!flow.write_timeout(&[9u8; 1000], Duration::ZERO).unwrap());
}

/// SDUs of 1000 bytes `flow` takes without waiting.
fn fill(flow: &crate::Flow) -> usize {
    let mut sent = 0;
    while flow.write_timeout(&[7u8; 1000], Duration::ZERO).unwrap() {
        sent += 1;
        assert!(sent <= 1 << 16, "the ring never fills");
    }
    sent
}

#[test]
fn the_send_ring_holds_the_send_buffer_not_the_whole_ring() {
    use rina_core::shim_hv::flow_rings::{GEOMETRY, SEND_LIMIT};
    // A 1000-byte SDU takes 4 slots of 256 bytes (1,024 bytes).
    let (flow, _daemon, mut fake) = ring_flow();
    let sent = fill(&flow);
    assert_eq!(sent, SEND_LIMIT / 1024, "1 MiB by default");
    assert!(sent < GEOMETRY.data_bytes() / 1024 / 2);
    // The daemon takes one: room for one more, not for the whole ring.
    assert_eq!(fake.take(), vec![7u8; 1000]);
    assert_eq!(fill(&flow), 1);
    // A smaller buffer, set on a full flow, takes nothing more until the
    // daemon took what is over it.
    assert_eq!(flow.set_send_buffer(64 * 1024), Some(64 * 1024));
    assert_eq!(fill(&flow), 0);
    for _ in 0..sent - 63 {
        fake.take();
    }
    assert_eq!(fill(&flow), 1);
    // As large as the ring at most: the ring itself.
    assert_eq!(
        flow.set_send_buffer(usize::MAX),
        Some(GEOMETRY.data_bytes())
    );
    assert_eq!(fill(&flow), GEOMETRY.data_bytes() / 1024 - 64);
}

/// A flow with rings over a fake daemon's end: (the flow, the daemon's
/// socket end, the daemon's rings).
fn ring_flow() -> (crate::Flow, OwnedFd, FakeRings) {
    let (app, daemon) = pair();
    let fake = offer_rings(&daemon);
    let rings = crate::rings::Rings::setup(app.as_fd(), Duration::from_secs(5))
        .unwrap()
        .expect("rings offered");
    (
        crate::Flow::with_rings(app, info(1000), Some(rings)),
        daemon,
        fake,
    )
}

#[test]
fn a_flow_with_rings_turns_readable_when_an_sdu_comes_and_when_it_closes() {
    let (flow, daemon, mut fake) = ring_flow();
    let mut buf = [0u8; 1000];
    // Nothing yet: a non-blocking read asks for the doorbell.
    assert_eq!(flow.try_read(&mut buf).unwrap(), None);
    assert!(!readable_within(flow.as_fd(), 0));
    fake.deliver(&daemon, b"one");
    assert!(readable_within(flow.as_fd(), 5000), "the doorbell rang");
    assert_eq!(flow.try_read(&mut buf).unwrap(), Some(3));
    assert_eq!(&buf[..3], b"one");
    // Emptied: the descriptor is quiet again, though the doorbell was
    // never read by a blocking call.
    assert_eq!(flow.try_read(&mut buf).unwrap(), None);
    assert!(!readable_within(flow.as_fd(), 0));
    // SDUs published while the reader did not ask ring nobody, and are
    // there at the next read.
    fake.deliver(&daemon, b"two");
    fake.deliver(&daemon, b"three");
    assert!(readable_within(flow.as_fd(), 5000));
    assert_eq!(flow.try_read(&mut buf).unwrap(), Some(3));
    assert_eq!(flow.try_read(&mut buf).unwrap(), Some(5));
    assert_eq!(flow.try_read(&mut buf).unwrap(), None);
    // The daemon closes the flow: readable, and the read says closed.
    drop(daemon);
    assert!(readable_within(flow.as_fd(), 5000));
    let e = flow.try_read(&mut buf).expect_err("closed");
    assert_eq!(e.kind, ErrorKind::DaemonGone, "{e}");
}

#[test]
fn a_writer_waiting_for_room_on_rings_learns_that_the_flow_closed() {
    let (flow, daemon, _fake) = ring_flow();
    // Fill the ring to the daemon, which reads nothing.
    let sdu = [7u8; 1000];
    let mut n = 0;
    while flow.write_timeout(&sdu, Duration::ZERO).unwrap() {
        n += 1;
        assert!(n < 1_000_000, "the ring never filled");
    }
    // A writer waits for room; the daemon closes the flow.
    let flow = std::sync::Arc::new(flow);
    let f = flow.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || tx.send(f.write(&sdu)));
    assert!(
        rx.recv_timeout(Duration::from_millis(100)).is_err(),
        "no room yet"
    );
    drop(daemon);
    let e = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the writer never learnt that the flow closed")
        .expect_err("closed");
    assert_eq!(e.kind, ErrorKind::DaemonGone, "{e}");
}

#[test]
fn shutdown_wakes_a_reader_blocked_on_rings() {
    let (flow, _daemon, _fake) = ring_flow();
    let flow = std::sync::Arc::new(flow);
    let f = flow.clone();
    let reader = thread::spawn(move || f.read(&mut [0u8; 1000]));
    thread::sleep(Duration::from_millis(20));
    flow.shutdown();
    let e = reader.join().unwrap().expect_err("closed");
    assert_eq!(e.kind, ErrorKind::DaemonGone, "{e}");
}

#[test]
fn an_async_flow_with_rings_reads_and_waits_for_room() {
    let (flow, daemon, mut fake) = ring_flow();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let flow = flow.into_async().expect("rings can be async");
        assert!(flow.has_rings());
        // Fill the send ring.
        let mut sent = 0;
        while tokio::time::timeout(Duration::from_millis(50), flow.write(&[7u8; 1000]))
            .await
            .is_ok()
        {
            sent += 1;
            assert!(
                sent <= rina_core::shim_hv::flow_rings::GEOMETRY.data_bytes() / 1000,
                "more SDUs than the ring holds"
            );
        }
        assert!(sent > 0);
        // The daemon takes one, then delivers one, from another thread.
        let daemon = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            assert_eq!(fake.take(), vec![7u8; 1000]);
            std::thread::sleep(Duration::from_millis(30));
            fake.deliver(&daemon, b"hello");
            (fake, daemon)
        });
        tokio::time::timeout(Duration::from_secs(10), flow.write(&[8u8; 1000]))
            .await
            .expect("woken when room was made")
            .unwrap();
        let mut buf = [0u8; 1000];
        let n = tokio::time::timeout(Duration::from_secs(10), flow.read(&mut buf))
            .await
            .expect("woken when an SDU came")
            .unwrap();
        assert_eq!(&buf[..n], b"hello");
        daemon.join().unwrap();
    });
}

/// Reads one SDU from `flow` in another thread (with `read_timeout` of
/// 10 s if `timed`, else `read`) while this one sleeps `after` and then
/// calls `send`; the SDU read.
fn read_while(flow: &crate::Flow, timed: bool, after: Duration, send: impl FnOnce()) -> Vec<u8> {
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut b = [0u8; 100];
            let n = if timed {
                flow.read_timeout(&mut b, Duration::from_secs(10)).unwrap()
            } else {
                Some(flow.read(&mut b).unwrap())
            };
            b[..n.expect("an SDU within the timeout")].to_vec()
        });
        std::thread::sleep(after);
        send();
        reader.join().unwrap()
    })
}

/// A reader that busy-polls takes an SDU the daemon publishes while it
/// waits without asking for a doorbell, so the daemon rings none; one that
/// sleeps asks for one. Past its window, a polling reader sleeps and the
/// doorbell wakes it.
#[test]
fn a_busy_polling_reader_takes_sdus_without_doorbells_and_sleeps_after_its_window() {
    let ms = Duration::from_millis;
    for (window, doorbell_expected) in [(Some(Duration::from_secs(10)), false), (None, true)] {
        let (flow, daemon, mut fake) = ring_flow();
        flow.set_busy_poll(window);
        let got = read_while(&flow, true, ms(30), || fake.deliver(&daemon, b"hello"));
        assert_eq!(got, b"hello");
        assert_eq!(
            readable_within(flow.as_fd(), 0),
            doorbell_expected,
            "window {window:?}: a doorbell on the socket"
        );
    }
    // A window shorter than the wait: the reader sleeps, the doorbell wakes it.
    let (flow, daemon, mut fake) = ring_flow();
    flow.set_busy_poll(Some(ms(5)));
    let got = read_while(&flow, false, ms(100), || fake.deliver(&daemon, b"late"));
    assert_eq!(got, b"late");
    // A socket flow polls too.
    let (app, daemon) = pair();
    let flow = crate::Flow::from_parts(app, info(1000));
    flow.set_busy_poll(Some(Duration::from_secs(10)));
    let send = || {
        sock::send(daemon.as_fd(), b"sock", &[]).unwrap();
    };
    assert_eq!(read_while(&flow, true, ms(30), send), b"sock");
}

#[test]
fn an_sdu_written_in_place_reaches_the_daemon_and_one_read_in_place_is_released() {
    let (flow, daemon, mut fake) = ring_flow();
    // Written through the room's segments: the daemon gets exactly the
    // bytes written, not the room asked for.
    let sent = flow
        .write_in_place(1000, |room| {
            assert!(room.len() >= 1000, "room for {}", room.len());
            assert!(room.write_at(0, b"in place"));
            8
        })
        .unwrap();
    assert_eq!(sent, Some(8));
    assert_eq!(fake.take(), b"in place");
    // Nothing written: nothing sent.
    assert_eq!(flow.write_in_place(1000, |_| 0).unwrap(), Some(0));
    // More room than the flow's largest SDU is refused, before any fill.
    let e = flow
        .write_in_place(1001, |_| unreachable!())
        .expect_err("too large");
    assert_eq!(e.kind, ErrorKind::SduTooLarge, "{e}");
    // A full ring: `None`, and fill is not called.
    while flow
        .write_in_place(1000, |room| {
            assert!(room.write_at(0, &[7u8; 1000]));
            1000
        })
        .unwrap()
        .is_some()
    {}
    assert_eq!(flow.write_in_place(1000, |_| unreachable!()).unwrap(), None);
    // Read in place: `f` sees the SDU's bytes, which are then released.
    fake.deliver(&daemon, b"first");
    fake.deliver(&daemon, b"second");
    let got = flow.read_in_place(Duration::from_secs(5), |sdu| sdu.to_vec());
    assert_eq!(got.unwrap().as_deref(), Some(&b"first"[..]));
    let mut buf = [0u8; 1000];
    assert_eq!(flow.try_read(&mut buf).unwrap(), Some(6));
    assert_eq!(&buf[..6], b"second");
    // Nothing comes: `None` at the deadline.
    let none = flow.read_in_place(Duration::from_millis(20), |_| unreachable!());
    assert_eq!(none.unwrap(), None::<()>);
    // Closed: said so.
    drop(daemon);
    let e = flow
        .read_in_place(Duration::from_secs(5), |_| ())
        .expect_err("closed");
    assert_eq!(e.kind, ErrorKind::DaemonGone, "{e}");
}

#[test]
fn a_flow_without_rings_sends_nothing_in_place_and_refuses_to_read_in_place() {
    let (app, _daemon) = pair();
    let flow = crate::Flow::from_parts(app, info(1000));
    assert_eq!(flow.write_in_place(100, |_| unreachable!()).unwrap(), None);
    let e = flow
        .read_in_place(Duration::from_millis(1), |_| ())
        .expect_err("no rings");
    assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e}");
}

#[test]
fn a_withdrawn_request_is_never_handed_out() {
    let (sent_tx, sent) = std::sync::mpsc::channel();
    let (mut client, daemon) = fake_daemon(move |ctl| {
        let req = recv_req(&ctl).expect("register");
        // Requests and a withdrawal arrive while a call waits: queued,
        // then the withdrawn one is dropped from the queue.
        send_msg(&ctl, &Message::FlowRequest(incoming(1)), None);
        send_msg(&ctl, &Message::FlowRequest(incoming(2)), None);
        send_msg(&ctl, &Message::RequestWithdrawn { handle: 1 }, None);
        send_msg(
            &ctl,
            &Message::Reply {
                id: req.id,
                result: Ok(Reply::Registered {
                    difs: vec!["udp.net".into()],
                }),
            },
            None,
        );
        // A request and its withdrawal, both unread when the application
        // asks for the next request.
        send_msg(&ctl, &Message::FlowRequest(incoming(3)), None);
        send_msg(&ctl, &Message::RequestWithdrawn { handle: 3 }, None);
        send_msg(&ctl, &Message::FlowRequest(incoming(4)), None);
        sent_tx.send(()).unwrap();
        // Held until the client is done.
        let _ = recv_req(&ctl);
    });
    client.register(&name("echo"), None).unwrap();
    assert_eq!(client.pending_requests(), 1, "request 1 was withdrawn");
    sent.recv().unwrap();
    assert_eq!(client.next_request().unwrap().handle, 2);
    let next = client
        .next_request_timeout(Duration::from_secs(10))
        .unwrap()
        .expect("a request");
    assert_eq!(
        next.handle, 4,
        "request 3 was withdrawn before it was handed out"
    );
    drop(client);
    daemon.join().unwrap();
}

#[test]
fn flows_the_daemon_accepted_are_queued_across_calls_and_handed_out_in_order() {
    let (mut client, daemon) = fake_daemon(|ctl| {
        let req = recv_req(&ctl).expect("register");
        assert_eq!(
            req.op,
            Op::Register {
                name: name("srv"),
                dif: None,
                accept: Some(ctl::AutoAccept {
                    rings: false,
                    direct: false,
                    bundle: None,
                }),
            }
        );
        // A flow arrives before the registration's reply, another while
        // the client waits for a listing: neither is lost.
        let (mine1, theirs1) = pair();
        let mut first = info(1000);
        first.local = name("srv");
        let news = Message::FlowAccepted {
            flow: first.clone(),
            rings: false,
        };
        send_msg(&ctl, &news, Some(&theirs1));
        send_msg(
            &ctl,
            &Message::Reply {
                id: req.id,
                result: Ok(Reply::Registered {
                    difs: vec!["udp.net".into()],
                }),
            },
            None,
        );
        let req = recv_req(&ctl).expect("list");
        let (mine2, theirs2) = pair();
        let mut second = first;
        second.port = 6;
        let news = Message::FlowAccepted {
            flow: second,
            rings: false,
        };
        send_msg(&ctl, &news, Some(&theirs2));
        reply_no_ipcps(&ctl, req.id);
        drop((theirs1, theirs2));
        thread::spawn(move || echo(mine1));
        thread::spawn(move || echo(mine2));
        // The connection stays up until the client closes it.
        assert!(recv_req(&ctl).is_none());
    });
    client.set_rings(false);
    assert_eq!(
        client.register_accepting(&name("srv"), None).unwrap(),
        vec!["udp.net".to_string()]
    );
    assert!(client.list_ipcps().unwrap().is_empty());
    assert_eq!(client.accepted_flows(), 2);
    assert_eq!(client.pending_requests(), 0);
    for port in [5, 6] {
        let flow = client.next_flow().unwrap();
        assert_eq!(flow.info().port, port);
        flow.write(b"abc").unwrap();
        let mut buf = [0u8; 8];
        let n = flow.read_timeout(&mut buf, Duration::from_secs(5)).unwrap();
        assert_eq!(n, Some(3));
    }
    assert!(client
        .next_flow_timeout(Duration::from_millis(50))
        .unwrap()
        .is_none());
    drop(client);
    daemon.join().unwrap();
}

#[test]
fn flows_accepted_past_the_bound_while_a_call_waits_are_closed() {
    // Both ends of every flow are descriptors of this process.
    crate::raise_fd_limit(8_000);
    let (mut client, daemon) = fake_daemon(|ctl| {
        let req = recv_req(&ctl).expect("list");
        // More accepted flows than the client holds, then the answer.
        let mut ours = Vec::new();
        for port in 0..crate::MAX_ARRIVED as u32 + 3 {
            let (mine, theirs) = pair();
            let mut i = info(1000);
            i.port = port;
            send_msg(
                &ctl,
                &Message::FlowAccepted {
                    flow: i,
                    rings: false,
                },
                Some(&theirs),
            );
            ours.push(mine);
        }
        reply_no_ipcps(&ctl, req.id);
        // The last three were closed by the client: their other ends read
        // the end of the flow; the first is still open.
        let mut buf = [0u8; 8];
        for fd in &ours[crate::MAX_ARRIVED..] {
            assert!(readable_within(fd.as_fd(), 5000));
            assert_eq!(sock::recv(fd.as_fd(), &mut buf).expect("recv").len, 0);
        }
        assert!(!readable_within(ours[0].as_fd(), 50));
        assert!(recv_req(&ctl).is_none());
    });
    assert!(client.list_ipcps().unwrap().is_empty());
    assert_eq!(client.accepted_flows(), crate::MAX_ARRIVED);
    // Held until the fake daemon has looked: it is open.
    let first = client.next_flow().unwrap();
    assert_eq!(first.info().port, 0);
    drop(client);
    daemon.join().unwrap();
    drop(first);
}

/// Descriptors of this process that point at `path`.
fn fds_to(path: &std::path::Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l == path)
        .count()
}

/// Descriptors of this process whose link in /proc/self/fd names `what`
/// (a memfd's name, say).
fn fds_naming(what: &str) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy().contains(what))
        .count()
}

#[test]
fn a_packet_with_more_descriptors_than_fit_hands_over_those_received_and_leaks_none() {
    let (app, daemon) = pair();
    let path = std::env::temp_dir().join(format!("rina-fds-{}", std::process::id()));
    let f = std::fs::File::create(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let path = std::path::PathBuf::from(format!("{} (deleted)", path.display()));
    sock::send(daemon.as_fd(), b"x", &[f.as_raw_fd(); sock::MAX_FDS + 2]).unwrap();
    drop(f);
    assert_eq!(fds_to(&path), 0, "only in flight");
    let mut buf = [0u8; 16];
    let p = sock::recv(app.as_fd(), &mut buf).unwrap();
    assert_eq!(p.len, 1);
    assert!(p.fds_lost, "two did not fit");
    assert_eq!(p.fds.len(), sock::MAX_FDS, "those that fit are handed over");
    assert_eq!(fds_to(&path), sock::MAX_FDS);
    drop(p);
    assert_eq!(fds_to(&path), 0, "none left open");
}

/// Set in a child process of this test binary running one test alone.
const ALONE_ENV: &str = "RINA_TEST_ALONE";

/// Runs test `name` (the caller) alone in a child process of this test
/// binary, for a test that changes what the whole process shares (its
/// descriptor limit) while other tests run in threads beside it. True in
/// the child, where the test does its work; in the parent, false once the
/// child passed.
#[track_caller]
fn in_a_process_of_its_own(name: &str) -> bool {
    if std::env::var_os(ALONE_ENV).is_some() {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([&format!("tests::{name}"), "--exact", "--test-threads=1"])
        .env(ALONE_ENV, name)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{name} failed in its process:\n{text}"
    );
    assert!(text.contains("1 passed"), "{name} did not run:\n{text}");
    false
}

/// The lowest descriptor number free in this process.
fn lowest_free_fd() -> i32 {
    std::fs::File::open("/dev/null").unwrap().as_raw_fd()
}

#[test]
fn rings_offered_at_the_descriptor_limit_fail_and_leave_no_memory_file_open() {
    use rina_core::shim_hv::flow_rings::{self, Setup};
    use std::os::fd::FromRawFd;
    if !in_a_process_of_its_own(
        "rings_offered_at_the_descriptor_limit_fail_and_leave_no_memory_file_open",
    ) {
        return;
    }
    let (app, daemon) = pair();
    let geo = flow_rings::GEOMETRY;
    let (_, _, len) = flow_rings::layout(geo);
    // SAFETY: a NUL-terminated name; the descriptor is checked and owned.
    let file = std::fs::File::from(unsafe {
        let raw = libc::memfd_create(c"rina-at-limit".as_ptr(), libc::MFD_CLOEXEC);
        assert!(raw >= 0, "memfd_create");
        OwnedFd::from_raw_fd(raw)
    });
    file.set_len(len as u64).unwrap();
    let (room_rx, room_tx) = nix::unistd::pipe().unwrap();
    sock::send(
        daemon.as_fd(),
        &Setup::Rings(geo).encode(),
        &[file.as_raw_fd(), room_rx.as_raw_fd()],
    )
    .unwrap();
    // Only in flight now.
    drop((file, room_rx, room_tx));
    assert_eq!(fds_naming("memfd:rina-at-limit"), 0);
    // Room for one more descriptor: the memory file comes in, the room
    // pipe does not.
    let low = lowest_free_fd();
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid pointer to an rlimit.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut old) }, 0);
    let tight = libc::rlimit {
        rlim_cur: low as u64 + 1,
        rlim_max: old.rlim_max,
    };
    // SAFETY: a valid pointer to an rlimit (this process runs this test
    // alone).
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &tight) }, 0);
    let r = crate::rings::Rings::setup(app.as_fd(), Duration::from_secs(5));
    // SAFETY: as above.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &old) }, 0);
    match r {
        Err(crate::rings::RingsError::BadSetup(why)) => assert!(why.contains("lost"), "{why}"),
        other => panic!("rings set up without their doorbell: {other:?}"),
    }
    assert_eq!(
        fds_naming("memfd:rina-at-limit"),
        0,
        "the memory file that came in was closed"
    );
    assert_eq!(lowest_free_fd(), low);
}

#[test]
fn rings_whose_room_doorbell_is_not_a_pipe_are_refused() {
    let file = ring_file();
    // Always readable: a writer waiting for room would never sleep.
    let zero = std::fs::File::open("/dev/zero").unwrap();
    match offer_rings_in(&file, zero.as_fd()).2 {
        Err(crate::rings::RingsError::BadSetup(why)) => {
            assert!(why.contains("not a pipe"), "{why}")
        }
        other => panic!("rings with /dev/zero for a doorbell: {other:?}"),
    }
    let (rx, _tx) = nix::unistd::pipe().unwrap();
    assert!(matches!(offer_rings_in(&file, rx.as_fd()).2, Ok(Some(_))));
}

#[test]
fn clearing_a_room_doorbell_that_never_empties_ends() {
    let zero = std::fs::File::open("/dev/zero").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        crate::rings::reset(zero.as_fd());
        let _ = tx.send(());
    });
    assert!(
        rx.recv_timeout(Duration::from_secs(5)).is_ok(),
        "still reading /dev/zero"
    );
}

#[test]
fn a_write_on_a_full_ring_returns_at_its_deadline_though_the_daemon_keeps_ringing() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let file = ring_file();
    let (room_rx, room) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK).unwrap();
    let (app, daemon, rings) = offer_rings_in(&file, room_rx.as_fd());
    let flow = crate::Flow::with_rings(app, info(1000), Some(rings.unwrap().expect("rings")));
    fill(&flow);
    // The daemon filled the doorbell (1 MiB, the default most a pipe may
    // be made): a write with a zero timeout looks at the ring once more,
    // it does not read until the doorbell is clear.
    // SAFETY: fcntl on a descriptor we own.
    let cap = unsafe { libc::fcntl(room.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20) };
    assert_eq!(cap, 1 << 20, "a pipe of 1 MiB");
    let bytes = vec![1u8; 1 << 16];
    while nix::unistd::write(&room, &bytes).is_ok() {}
    assert!(!flow.write_timeout(&[7u8; 1000], Duration::ZERO).unwrap());
    let mut left: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    assert_eq!(
        unsafe { libc::ioctl(room_rx.as_raw_fd(), libc::FIONREAD, &mut left) },
        0
    );
    assert!(
        left >= cap / 2,
        "the doorbell was read down to {left} bytes"
    );
    // And it rings without pause, faster than the writer can read: the
    // doorbell is never clear.
    let stop = Arc::new(AtomicBool::new(false));
    let ringer = {
        let stop = stop.clone();
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = nix::unistd::write(&room, &bytes);
            }
        })
    };
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let t = std::time::Instant::now();
        let r = flow.write_timeout(&[7u8; 1000], Duration::from_millis(20));
        let _ = tx.send((r.map_err(|e| e.to_string()), t.elapsed()));
        drop(flow);
    });
    let got = rx.recv_timeout(Duration::from_secs(5));
    stop.store(true, Ordering::Relaxed);
    ringer.join().unwrap();
    let (r, took) = got.expect("the write returned");
    assert_eq!(r, Ok(false), "nothing written");
    assert!(took < Duration::from_secs(2), "{took:?}");
    drop(daemon);
}

/// CPU time this thread has used.
fn thread_cpu_time() -> Duration {
    // SAFETY: rusage is plain data; all-zero is a valid one.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to an rusage.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) }, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

#[test]
fn a_write_on_a_full_ring_whose_room_doorbell_hung_up_sleeps_until_its_deadline() {
    let file = ring_file();
    let (room_rx, room) = nix::unistd::pipe().unwrap();
    let (app, daemon, rings) = offer_rings_in(&file, room_rx.as_fd());
    let flow = crate::Flow::with_rings(app, info(1000), Some(rings.unwrap().expect("rings")));
    fill(&flow);
    // The daemon closes its end of the doorbell, not the flow: the read
    // end is readable (hung up) for good.
    drop(room);
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let now = flow.write_timeout(&[7u8; 1000], Duration::ZERO);
        let (t, cpu) = (std::time::Instant::now(), thread_cpu_time());
        let later = flow.write_timeout(&[7u8; 1000], Duration::from_millis(300));
        let took = (t.elapsed(), thread_cpu_time() - cpu);
        let _ = tx.send((
            now.map_err(|e| e.to_string()),
            later.map_err(|e| e.to_string()),
            took,
        ));
        drop(flow);
    });
    let (now, later, (took, cpu)) = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the writes returned");
    assert_eq!(now, Ok(false));
    assert_eq!(later, Ok(false));
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(
        cpu < Duration::from_millis(150),
        "it spun: {cpu:?} of CPU in {took:?}"
    );
    drop(daemon);
}

#[test]
fn a_ring_file_that_could_shrink_under_the_mapping_is_refused() {
    let (rx, _tx) = nix::unistd::pipe().unwrap();
    let refused = |file: &std::fs::File| match offer_rings_in(file, rx.as_fd()).2 {
        Err(crate::rings::RingsError::BadSetup(why)) => {
            assert!(why.contains("sealed"), "{why}");
        }
        other => panic!("rings in a file that can shrink: {other:?}"),
    };
    // Neither a memfd without seals...
    let file = unsealed_ring_file();
    refused(&file);
    // ...nor one sealed only against growing...
    // SAFETY: fcntl on a descriptor we own.
    assert_eq!(
        unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_GROW) },
        0
    );
    refused(&file);
    // ...nor a file that cannot be sealed.
    let (_, _, len) =
        rina_core::shim_hv::flow_rings::layout(rina_core::shim_hv::flow_rings::GEOMETRY);
    let plain = tempfile_of(len);
    refused(&plain);
    // Sealed against shrinking, as rinad seals it: taken.
    assert!(matches!(
        offer_rings_in(&ring_file(), rx.as_fd()).2,
        Ok(Some(_))
    ));
}

/// An unnamed regular file of `len` bytes (no seals possible).
fn tempfile_of(len: usize) -> std::fs::File {
    let path = std::env::temp_dir().join(format!("rina-plain-{}", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let _ = std::fs::remove_file(&path);
    f.set_len(len as u64).unwrap();
    f
}
