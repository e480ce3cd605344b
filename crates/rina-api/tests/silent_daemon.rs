//! A daemon that takes requests and never answers: a blocking call gives
//! up after the library's 30 s with `ETIMEDOUT`, and neither it nor a
//! `RINA_F_NOWAIT` call whose descriptor the program closed leaves a
//! descriptor behind. (One test per binary: it points `RINA_SOCKET` at its own
//! daemon for the whole process.)

use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::mpsc;
use std::time::Instant;

/// Descriptors open in this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn abandoned_and_timed_out_registrations_leave_no_descriptor_behind() {
    let dir = std::env::temp_dir().join(format!("rina-api-silent-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("silent.sock");
    let listener = socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    socket::bind(listener.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
    socket::listen(&listener, socket::Backlog::new(8).unwrap()).unwrap();
    std::env::set_var("RINA_SOCKET", &path);
    let (accepted, connected) = mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        loop {
            let c = socket::accept(listener.as_raw_fd()).unwrap();
            // SAFETY: accept just returned this descriptor; it is ours.
            held.push(unsafe { OwnedFd::from_raw_fd(c) });
            accepted.send(()).unwrap();
        }
    });

    let fd = rina_api::rina_open();
    assert!(fd >= 0, "rina_open: {}", std::io::Error::last_os_error());
    connected.recv().unwrap();
    let before = open_fds();
    let name = CString::new("silent-test").unwrap();
    // A RINA_F_NOWAIT registration whose descriptor the program closes
    // without waiting for the answer (that never comes)...
    // SAFETY: a NUL-terminated name and a NULL DIF.
    let wfd = unsafe {
        rina_api::rina_register(
            fd,
            std::ptr::null(),
            name.as_ptr(),
            rina_api::RINA_F_NOWAIT as i32,
        )
    };
    assert!(
        wfd >= 0,
        "rina_register: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: wfd is ours, given up here.
    unsafe { libc::close(wfd) };
    // ...and a blocking one that times out.
    let t = Instant::now();
    // SAFETY: a NUL-terminated name and a NULL DIF.
    let r = unsafe { rina_api::rina_register(fd, std::ptr::null(), name.as_ptr(), 0) };
    let errno = std::io::Error::last_os_error().raw_os_error();
    assert_eq!(r, -1);
    assert_eq!(errno, Some(libc::ETIMEDOUT));
    assert!(t.elapsed() >= rina_api::control::REPLY_TIMEOUT);
    assert_eq!(
        open_fds(),
        before,
        "descriptors left open by the abandoned and timed-out calls"
    );
    // SAFETY: fd is the control descriptor opened above.
    unsafe { libc::close(fd) };
    let _ = std::fs::remove_dir_all(&dir);
}
