//! A control plane that holds: connection caps per user, idle timeouts,
//! strict request decoding and range checks, `no_resources` from a full
//! normal DIF.

mod common;

use common::free_port;

use common::users::{as_user, test_user};
use common::{name, wait_for, Daemon};
use rina::{Client, ErrorKind, QosSpec};
use rina_wire::ctl::{self, Message};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

/// A raw control connection: requests written by hand.
fn raw_conn(d: &Daemon) -> OwnedFd {
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    connect(fd.as_raw_fd(), &UnixAddr::new(&d.socket).unwrap()).unwrap();
    fd
}

/// Sends `req` as one packet and returns the daemon's answer (or `None`
/// if it closed the connection).
fn ask(fd: &OwnedFd, req: &str) -> Option<Message> {
    use nix::sys::socket::{recv, send, MsgFlags};
    send(fd.as_raw_fd(), req.as_bytes(), MsgFlags::empty()).unwrap();
    let mut buf = vec![0u8; ctl::MAX_CTL_MSG];
    assert!(readable(fd, T), "no answer");
    let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).unwrap();
    (n > 0).then(|| ctl::decode(&buf[..n]).unwrap())
}

/// Waits until `fd` is readable (or hung up), at most `t`.
fn readable(fd: &OwnedFd, t: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, t.as_millis() as i32) == 1 }
}

fn refused(m: Option<Message>) -> (ErrorKind, String) {
    match m {
        Some(Message::Reply { result: Err(e), .. }) => (e.kind, e.message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

const WITH_NORMAL: &str = "[system]\nname = \"v\"\n\n[[ipcp]]\nname = \"v.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = 1\n";

#[test]
fn numeric_ops_and_out_of_range_parameters_are_refused() {
    let d = Daemon::start_with("v", WITH_NORMAL);
    let c = raw_conn(&d);
    let (k, m) = refused(ask(&c, r#"{"id":1,"op":7}"#));
    assert_eq!(k, ErrorKind::InvalidRequest);
    assert!(m.contains("name of an operation"), "{m}");
    let (k, m) = refused(ask(
        &c,
        r#"{"id":2,"op":"deallocate","port":18446744073709551615}"#,
    ));
    assert_eq!(k, ErrorKind::InvalidRequest);
    assert!(m.contains("18446744073709551615"), "{m}");
    let (k, m) = refused(ask(&c, r#"{"id":3,"op":"list_ipcps","verbose":true}"#));
    assert_eq!(k, ErrorKind::InvalidRequest);
    assert!(m.contains("verbose"), "{m}");
    let (k, m) = refused(ask(
        &c,
        r#"{"id":4,"op":"scheduler","ipcp":"v.net","set":{"policy":"fifo","queue_len":18446744073709551615}}"#,
    ));
    assert_eq!(k, ErrorKind::InvalidRequest);
    assert!(m.contains("queue_len") && m.contains("out of range"), "{m}");
    let (k, m) = refused(ask(
        &c,
        r#"{"id":5,"op":"allocate","local":"a","remote":"b","dif":null,"qos":{"max_loss_ppm":2000000}}"#,
    ));
    assert_eq!(k, ErrorKind::InvalidRequest);
    assert!(m.contains("max_loss_ppm"), "{m}");
    // A gap a flow request cannot carry is refused, not sent as another.
    let (k, m) = refused(ask(
        &c,
        r#"{"id":7,"op":"allocate","local":"a","remote":"b","dif":null,"qos":{"max_sdu_gap":4294967295}}"#,
    ));
    assert_eq!(k, ErrorKind::InvalidRequest);
    assert!(
        m.contains("qos.max_sdu_gap = 4294967295 is out of range"),
        "{m}"
    );
    // The policy in force is unchanged, and the connection still serves.
    let info = d.client().scheduler("v.net").unwrap();
    assert_eq!(info.config["queue_len"], serde_json::json!(1000));
    assert!(matches!(
        ask(&c, r#"{"id":6,"op":"list_difs"}"#),
        Some(Message::Reply {
            id: 6,
            result: Ok(_)
        })
    ));
}

#[test]
fn one_users_idle_connections_leave_others_working() {
    let (Some(a), Some(b)) = (test_user("rinatest-a"), test_user("rinatest-b")) else {
        return;
    };
    rina::raise_fd_limit(8192);
    let d = Daemon::start("flood", &[]);
    let path = d.socket.clone();
    // b opens 2,000 connections and says nothing on them.
    let held: Vec<rina::Result<Client>> = as_user(b, move || {
        (0..2000)
            .map(|_| Client::connect_to_timeout(&path, Some(T)))
            .collect()
    });
    assert!(
        held.iter().all(|c| c.is_ok()),
        "connecting is never blocked"
    );
    let mut held: Vec<Client> = held.into_iter().map(Result::unwrap).collect();
    // The daemon keeps only b's share, and says why to the others.
    let e = held.last_mut().unwrap().list_difs().unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoResources, "{e}");
    assert!(e.message.contains("max_conns_per_user"), "{e}");
    assert!(held[0].list_difs().is_ok());
    // a and root are served.
    let path = d.socket.clone();
    let difs = as_user(a, move || {
        Client::connect_to_timeout(&path, Some(T))
            .and_then(|mut c| c.list_difs())
            .map(|v| v.len())
    });
    assert_eq!(difs, Ok(1));
    assert_eq!(d.client().list_difs().unwrap().len(), 1);
}

#[test]
fn administrators_keep_a_share_when_users_fill_the_daemon() {
    let Some(b) = test_user("rinatest-b") else {
        return;
    };
    rina::raise_fd_limit(8192);
    let d = Daemon::start_with(
        "full",
        "[system]\nname = \"full\"\nmax_conns_per_user = 5000\n",
    );
    let path = d.socket.clone();
    let mut held: Vec<Client> = as_user(b, move || {
        (0..1100)
            .map(|_| Client::connect_to_timeout(&path, Some(T)).unwrap())
            .collect()
    });
    let e = held.last_mut().unwrap().list_difs().unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoResources, "{e}");
    assert!(e.message.contains("not administrators"), "{e}");
    // Root, an administrator, still gets in.
    assert!(d.client().list_difs().is_ok());
}

#[test]
fn idle_connections_that_hold_nothing_are_closed() {
    let d = Daemon::start_with(
        "idle",
        "[system]\nname = \"idle\"\nidle_timeout_ms = 300\n\n[[ipcp]]\nname = \"idle.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:0\"\n",
    );
    let mut holder = d.client();
    holder.register(&name("kept"), None).unwrap();
    let silent = raw_conn(&d);
    // The silent one is closed: it reads the end of the stream.
    assert!(readable(&silent, T), "the idle connection is never closed");
    let mut b = [0u8; 64];
    let n = nix::sys::socket::recv(
        silent.as_raw_fd(),
        &mut b,
        nix::sys::socket::MsgFlags::empty(),
    )
    .unwrap();
    assert_eq!(n, 0, "the idle connection was closed");
    // The one holding a name, idle for longer, is still served.
    assert_eq!(holder.list_names().unwrap().len(), 1);
}

#[test]
fn a_client_waiting_for_an_enrollment_is_not_idle() {
    // x.net is nobody: the enrollment runs until its own timeout, far
    // beyond the idle timeout.
    let d = Daemon::start_with(
        "enr",
        "[system]\nname = \"enr\"\nidle_timeout_ms = 300\n\n[[ipcp]]\nname = \"enr.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:0\"\n\n[ipcp.directory]\n\"x.net\" = \"127.0.0.1:9\"\n\n[[ipcp]]\nname = \"enr.net\"\ntype = \"normal\"\ndif = \"net\"\n\n[[ipcp.neighbor]]\nname = \"x.net\"\nover = \"udp\"\n",
    );
    let mut c = d.client();
    let wait = Duration::from_secs(2);
    let t0 = std::time::Instant::now();
    let e = c
        .enroll(
            "enr.net",
            &name("x.net"),
            "udp",
            None,
            Some(wait),
            &mut |_| {},
        )
        .expect_err("nobody to enroll with");
    assert_eq!(e.kind, ErrorKind::Timeout, "{e}");
    assert!(t0.elapsed() >= wait, "answered after {:?}", t0.elapsed());
}

/// A normal IPCP `me.net` at `addr` over a shim-udp DIF, with one
/// neighbour and at most `max_flows` flows.
fn normal_system(
    me: &str,
    addr: u64,
    port: u16,
    peer: &str,
    peer_port: u16,
    max_flows: usize,
) -> String {
    let peer_addr = 3 - addr;
    format!(
        "[system]\nname = \"{me}\"\n\n[[ipcp]]\nname = \"{me}.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:{port}\"\n\n[ipcp.directory]\n\"{peer}.net\" = \"127.0.0.1:{peer_port}\"\n\n[[ipcp]]\nname = \"{me}.net\"\ntype = \"normal\"\ndif = \"net\"\naddress = {addr}\nmax_flows = {max_flows}\n\n[[ipcp.neighbor]]\nname = \"{peer}.net\"\nover = \"udp\"\naddress = {peer_addr}\n\n[ipcp.names]\n\"echo\" = 2\n"
    )
}

#[test]
fn a_full_normal_dif_answers_no_resources() {
    let (pa, pb) = (free_port(), free_port());
    let alpha = Daemon::start_with("alpha", &normal_system("alpha", 1, pa, "beta", pb, 8));
    let beta = Daemon::start_with("beta", &normal_system("beta", 2, pb, "alpha", pa, 1));
    let mut srv = beta.client();
    srv.register(&name("echo"), Some("net")).unwrap();
    let accepter = std::thread::spawn(move || {
        let mut flows = Vec::new();
        while let Ok(Some(req)) = srv.next_request_timeout(T) {
            if let Ok(f) = srv.accept(&req) {
                flows.push(f);
            }
        }
        flows.len()
    });
    let mut c = alpha.client();
    let mut first = None;
    wait_for("the first flow over the normal DIF", T, || {
        match c.allocate(&name("a"), &name("echo"), Some("net"), &QosSpec::default()) {
            Ok(f) => {
                first = Some(f);
                true
            }
            Err(_) => false,
        }
    });
    // beta holds one flow, its most: the next is refused for resources.
    let e = c
        .allocate(&name("a"), &name("echo"), Some("net"), &QosSpec::default())
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoResources, "{e}");
    drop(first);
    drop(alpha);
    drop(beta);
    let _ = accepter.join();
}

/// Accepts every flow request `c` gets and keeps the flows, until none
/// comes for a while; returns how each accept went.
fn accept_all(mut c: Client) -> std::thread::JoinHandle<Vec<rina::Result<rina::Flow>>> {
    std::thread::spawn(move || {
        let mut got = Vec::new();
        while let Ok(Some(req)) = c.next_request_timeout(Duration::from_secs(3)) {
            got.push(c.accept(&req));
        }
        got
    })
}

#[test]
fn a_users_flows_are_limited_and_other_users_still_get_theirs() {
    let (Some(a), Some(b)) = (test_user("rinatest-a"), test_user("rinatest-b")) else {
        return;
    };
    let limit = "max_flows_per_user = 3";
    let beta = Daemon::start_system("beta", limit, "127.0.0.1:0", &[]);
    let addr = beta.udp_addr();
    let alpha = Daemon::start_system(
        "alpha",
        limit,
        "127.0.0.1:0",
        &[("echo", addr.clone()), ("echo-a", addr)],
    );
    let mut srv = beta.client();
    srv.register(&name("echo"), None).unwrap();
    let srv = accept_all(srv);
    let connect = |u, d: &Daemon| {
        let path = d.socket.clone();
        as_user(u, move || Client::connect_to(path).unwrap())
    };
    let allocate =
        |c: &mut Client, to: &str| c.allocate(&name("app"), &name(to), None, &QosSpec::default());

    // a holds its three flows; the fourth is refused, and says why.
    let mut ca = connect(a, &alpha);
    let mut held: Vec<rina::Flow> = (0..3).map(|_| allocate(&mut ca, "echo").unwrap()).collect();
    let e = allocate(&mut ca, "echo").unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoResources, "{e}");
    assert!(
        e.message.contains("max_flows_per_user")
            && e.message.contains("3 flows")
            && e.message.contains(&a.uid.to_string()),
        "{e}"
    );
    // Another connection of a is the same user: refused as well.
    let e = allocate(&mut connect(a, &alpha), "echo").unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoResources, "{e}");
    // b and root, an administrator, are served (root beyond the limit).
    let _fb = allocate(&mut connect(b, &alpha), "echo").expect("b allocates");
    let mut root = alpha.client();
    let _fr: Vec<rina::Flow> = (0..4)
        .map(|_| allocate(&mut root, "echo").unwrap())
        .collect();
    // a closes a flow: it may have another.
    drop(held.pop());
    wait_for("a to be allowed a flow again", T, || {
        allocate(&mut ca, "echo").map(|f| held.push(f)).is_ok()
    });

    // Accepting takes a flow too: a accepts at beta, three and no more;
    // the requester is told why.
    let mut ca_beta = connect(a, &beta);
    ca_beta.register(&name("echo-a"), None).unwrap();
    let acceptor = accept_all(ca_beta);
    let _ok: Vec<rina::Flow> = (0..3)
        .map(|_| allocate(&mut root, "echo-a").unwrap())
        .collect();
    let e = allocate(&mut root, "echo-a").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Refused, "{e}");
    assert!(e.message.contains("max_flows_per_user"), "{e}");
    drop((alpha, beta));
    let accepts = acceptor.join().unwrap();
    assert_eq!(accepts.iter().filter(|r| r.is_ok()).count(), 3);
    let refused = accepts
        .iter()
        .find_map(|r| r.as_ref().err())
        .expect("a refusal");
    assert_eq!(refused.kind, ErrorKind::NoResources, "{refused}");
    assert!(refused.message.contains("max_flows_per_user"), "{refused}");
    let _ = srv.join();
}

/// The resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS");
    kb << 10
}

/// Sends `n` requests for the list of names on `c` (they fit its buffer).
fn ask_names(c: &OwnedFd, n: u64) {
    use nix::sys::socket::{send, MsgFlags};
    for id in 1..=n {
        let req = format!(r#"{{"id":{id},"op":"list_names"}}"#);
        send(c.as_raw_fd(), req.as_bytes(), MsgFlags::MSG_DONTWAIT).unwrap();
    }
}

/// Bytes `c` sent that its peer has not read yet (`SIOCOUTQ`).
fn unread_by_peer(c: &OwnedFd) -> i32 {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one int.
    let rc = unsafe { libc::ioctl(c.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    assert_eq!(rc, 0, "SIOCOUTQ: {}", std::io::Error::last_os_error());
    n
}

#[test]
fn a_client_that_does_not_read_its_answers_is_not_read_either() {
    let d = Daemon::start("deaf", &[]);
    // 256 long names: a page of the listing is 64 KiB.
    let mut holder = d.client();
    for i in 0..256 {
        let n = format!("{i:03}-{}", "n".repeat(200));
        holder.register(&name(&n), None).unwrap();
    }
    let before = rss(d.child.id());
    // 12 connections ask for 120 pages each and read none.
    const ASKED: u64 = 120;
    let deaf: Vec<(OwnedFd, u64)> = (0..12)
        .map(|_| {
            let c = raw_conn(&d);
            ask_names(&c, ASKED);
            (c, ASKED)
        })
        .collect();
    // Each round trip of another client is a turn of the daemon's loop,
    // which reads up to 64 requests of each connection: after 20, it read
    // all it was going to.
    for _ in 0..20 {
        assert!(holder.list_difs().is_ok(), "others are served");
    }
    // It stopped reading each of them after a few answers, and holds
    // little for them (it held all 7.5 MB of answers of each).
    for (c, _) in &deaf {
        assert!(unread_by_peer(c) > 0, "the daemon read every request");
    }
    let grown = rss(d.child.id()).saturating_sub(before);
    assert!(grown < 32 << 20, "the daemon grew by {grown} bytes");
    // A client that reads at last gets every answer, in order.
    let mut buf = vec![0u8; ctl::MAX_CTL_MSG];
    for (c, sent) in &deaf {
        for id in 1..=*sent {
            assert!(readable(c, T), "answer {id} of {sent} never came");
            let n = nix::sys::socket::recv(
                c.as_raw_fd(),
                &mut buf,
                nix::sys::socket::MsgFlags::empty(),
            )
            .unwrap();
            match ctl::decode::<Message>(&buf[..n]) {
                Ok(Message::Reply {
                    id: got,
                    result: Ok(rina_wire::ctl::Reply::Names { names, .. }),
                }) => assert!(
                    got == id && !names.is_empty(),
                    "answer {got}, expected {id}"
                ),
                other => panic!("answer {id}: {other:?}"),
            }
        }
    }
}

/// The descriptors process `pid` holds.
fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

const ONE_SHIM: &str = "[system]\nname = \"cap\"\n\n[[ipcp]]\nname = \"cap.udp\"\ntype = \"shim-udp\"\ndif = \"udp\"\nbind = \"127.0.0.1:0\"\n";

#[test]
fn a_capture_of_an_idle_ipcp_ends_when_its_reader_closes() {
    let d = Daemon::start_with("cap", ONE_SHIM);
    let pid = d.child.id();
    let mut c = d.client();
    // The daemon holds the connection. It may still hold the one its start
    // was probed with (closed when it reads its end): the count must
    // settle first.
    c.list_ipcps().unwrap();
    let mut before = fd_count(pid);
    wait_for("the daemon's descriptors to settle", T, || {
        std::thread::sleep(Duration::from_millis(100));
        let now = fd_count(pid);
        std::mem::replace(&mut before, now) == now
    });
    // Nothing crosses the shim: only the readers' hang-up ends them.
    for round in 0..20 {
        let readers: Vec<OwnedFd> = (0..10)
            .map(|_| c.capture("cap.udp", None).unwrap().2)
            .collect();
        let now = fd_count(pid);
        assert!(
            now >= before + 10,
            "round {round}: {now} descriptors, {before} before"
        );
        drop(readers);
        wait_for("the daemon to close the captures' sockets", T, || {
            fd_count(pid) <= before
        });
    }
}

#[test]
fn captures_beyond_the_limit_are_refused_until_one_ends() {
    let d = Daemon::start_with("cap", ONE_SHIM);
    let mut c = d.client();
    let mut readers: Vec<OwnedFd> = (0..16)
        .map(|_| c.capture("cap.udp", None).unwrap().2)
        .collect();
    let e = c.capture("cap.udp", None).expect_err("a 17th capture");
    assert_eq!(e.kind, ErrorKind::NoResources, "{e}");
    assert!(e.message.contains("16 captures are running"), "{e}");
    drop(readers.pop());
    wait_for("a capture to end", T, || c.capture("cap.udp", None).is_ok());
}
