//! Running out of descriptors: at the accepting daemon, and in the
//! requesting application. One test in this file, because it lowers this
//! process's own descriptor limit for a moment.

mod common;

use common::{name, pair};
use rina::{ErrorKind, QosSpec};
use std::collections::BTreeSet;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

/// The descriptors open in process `pid` (`self` for this one).
fn open_fds(pid: &str) -> BTreeSet<u64> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// The descriptor limit below which exactly `free` numbers are unused in `pid`.
fn limit_leaving(pid: &str, free: usize) -> u64 {
    let open = open_fds(pid);
    let mut left = free;
    let mut n = 0;
    loop {
        if !open.contains(&n) {
            if left == 0 {
                return n;
            }
            left -= 1;
        }
        n += 1;
    }
}

fn set_limit(pid: i32, soft: u64, hard: u64) {
    let r = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: a valid rlimit; a null pointer for the old one.
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &r, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
}

fn limit(pid: i32) -> (u64, u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit to fill.
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut r) };
    assert_eq!(rc, 0);
    (r.rlim_cur, r.rlim_max)
}

#[test]
fn running_out_of_descriptors_fails_the_allocation_with_the_reason() {
    let (alpha, beta) = pair(&["echo"]);
    let mut srv = beta.client();
    srv.register(&name("echo"), None).unwrap();
    // A round trip: the daemon has seen the earlier clients go (their
    // descriptors are closed) before its descriptors are counted.
    srv.list_difs().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        let mut outcomes = Vec::new();
        let mut flows = Vec::new();
        while let Ok(Some(req)) = srv.next_request_timeout(Duration::from_secs(5)) {
            match srv.accept(&req) {
                Ok(f) => {
                    outcomes.push(Ok(()));
                    flows.push(f);
                }
                Err(e) => outcomes.push(Err(e)),
            }
            // Refused, accepted, and the one this process cannot receive.
            if outcomes.len() == 3 {
                break;
            }
        }
        // Close nothing (the connection, the flow) while the test counts
        // on this process's descriptors.
        let _ = done_rx.recv();
        drop((srv, flows));
        outcomes
    });
    let mut c = alpha.client();
    c.set_timeout(Some(T));
    let allocate =
        |c: &mut rina::Client| c.allocate(&name("me"), &name("echo"), None, &QosSpec::default());

    // The accepting daemon has one descriptor left; a flow needs two.
    let pid = beta.child.id() as i32;
    let before = limit(pid);
    let cut = limit_leaving(&pid.to_string(), 1);
    set_limit(pid, cut, before.1);
    let e = allocate(&mut c).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Refused, "{e}");
    assert!(
        e.message.contains("cannot open a descriptor") && e.message.contains("limit"),
        "{e}"
    );
    set_limit(pid, before.0, before.1);
    let flow = allocate(&mut c).expect("allocation works again");
    drop(flow);

    // This process is at its own limit: the flow's descriptor cannot be
    // received, and the error says so.
    let me = std::process::id() as i32;
    let mine = limit(me);
    // The lowest free number, taken: every number below the limit is in use.
    let plug = std::fs::File::open("/dev/null").unwrap();
    let lowest = std::os::fd::AsRawFd::as_raw_fd(&plug) as u64;
    set_limit(me, lowest + 1, mine.1);
    let e = allocate(&mut c).map(drop);
    set_limit(me, mine.0, mine.1);
    drop(plug);
    let e = e.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoResources, "{e}");
    assert!(e.message.contains("RLIMIT_NOFILE"), "{e}");
    drop(c);
    drop(alpha);
    done_tx.send(()).unwrap();
    let outcomes = server.join().unwrap();
    let first = outcomes[0].as_ref().unwrap_err();
    assert_eq!(first.kind, ErrorKind::NoResources, "{first}");
    assert!(first.message.contains("descriptor"), "{first}");
}
