//! A hostile application against a real `rinad`: what it does to the
//! resources the daemon shares with it (the memory file of a flow's
//! rings) breaks at most its own flow, never the daemon.

mod common;

use common::{name, pair};
use rina::QosSpec;
use std::os::fd::AsRawFd;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

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

/// An application that cuts the memory file of its flow's rings short
/// (`ftruncate` to zero) and kicks the daemon: the daemon's mapping of the
/// file must not fault (SIGBUS would kill it with every flow it serves).
/// The daemon seals the file against shrinking, so the cut is refused and
/// the flow keeps working.
#[test]
fn an_application_cutting_its_ring_file_short_does_not_kill_the_daemon() {
    let (alpha, beta) = pair(&["sink"]);
    let mut srv = beta.client();
    // The reading end without rings: only the attacker's file is cut.
    srv.set_rings(false);
    srv.register(&name("sink"), None).unwrap();
    let reader = std::thread::spawn(move || {
        let req = srv.next_request_timeout(T).unwrap().expect("a request");
        let flow = srv.accept(&req).unwrap();
        let mut buf = vec![0u8; 2048];
        let mut got = Vec::new();
        while let Ok(Some(n)) = flow.read_timeout(&mut buf, Duration::from_secs(3)) {
            got.push(buf[..n].to_vec());
        }
        got
    });
    let mut c = alpha.client();
    c.set_rings(true);
    let flow = c
        .allocate(&name("cutter"), &name("sink"), None, &QosSpec::default())
        .unwrap();
    assert!(flow.has_rings(), "the flow got rings");
    flow.write(b"before").unwrap();

    let files = fds_named("/memfd:rina-flow");
    assert_eq!(files.len(), 1, "one ring file in this process");
    // SAFETY: a descriptor this process holds; nothing here touches the
    // mapping after the cut.
    let cut = unsafe { libc::ftruncate(files[0], 0) };
    // The doorbell: one byte on the flow socket makes the daemon read the
    // ring (and fault, if the file was cut).
    // SAFETY: a valid socket and a one-byte buffer.
    unsafe { libc::send(flow.as_raw_fd(), [1u8].as_ptr().cast(), 1, 0) };
    std::thread::sleep(Duration::from_millis(300));

    // The daemon is alive and answers.
    let ipcps = alpha
        .client()
        .list_ipcps()
        .expect("the daemon survives a cut ring file");
    assert_eq!(ipcps.len(), 1);
    assert_ne!(cut, 0, "the cut was refused (the file is sealed)");
    // And, the cut refused, the flow itself still works.
    flow.write(b"after").unwrap();
    let got = reader.join().unwrap();
    assert_eq!(got, vec![b"before".to_vec(), b"after".to_vec()]);
}
