//! `rinactl capture`: copies the pcap records the daemon sends on a
//! capture's socket into a pcap file (or a pipe to Wireshark), after the
//! file header, until a count, a duration or a signal says stop.

use rina_wire::pcap;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// When to stop.
#[derive(Debug, Clone, Copy, Default)]
pub struct Limits {
    /// After this many packets.
    pub count: Option<u64>,
    /// At this time.
    pub until: Option<Instant>,
}

/// What was written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Packets written.
    pub packets: u64,
    /// Bytes of the file, header included.
    pub bytes: u64,
}

/// Why a capture stopped before its limits.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The file or pipe could not be written.
    #[error("cannot write the capture: {0}")]
    Write(io::Error),
    /// The daemon's socket failed.
    #[error("the daemon's capture socket: {0}")]
    Socket(io::Error),
}

/// Writes the file header for `linktype` and `snaplen`, then every record
/// read from `sock` (one per packet), flushing each so a reader at the far
/// end of a pipe sees it at once. Stops at the limits, when `stop` is set
/// (checked at least every 100 ms), or when the daemon closes the socket.
pub fn copy_records(
    sock: &OwnedFd,
    out: &mut dyn Write,
    linktype: u32,
    snaplen: u32,
    limits: Limits,
    stop: &AtomicBool,
) -> Result<Stats, CaptureError> {
    let head = pcap::file_header(linktype, snaplen);
    out.write_all(&head).map_err(CaptureError::Write)?;
    out.flush().map_err(CaptureError::Write)?;
    let mut stats = Stats {
        packets: 0,
        bytes: head.len() as u64,
    };
    let mut buf = vec![0u8; pcap::RECORD_HEADER_LEN + pcap::MAX_SNAPLEN as usize + 64];
    while !stop.load(Ordering::Relaxed) && !matches!(limits.count, Some(c) if stats.packets >= c) {
        let now = Instant::now();
        let wait = match limits.until {
            Some(t) if t <= now => break,
            Some(t) => (t - now).min(Duration::from_millis(100)),
            None => Duration::from_millis(100),
        };
        let mut fds = [nix::poll::PollFd::new(
            sock.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        let ms = nix::poll::PollTimeout::try_from(wait.as_millis() as i32)
            .unwrap_or(nix::poll::PollTimeout::ZERO);
        match nix::poll::poll(&mut fds, ms) {
            Ok(0) | Err(nix::Error::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(CaptureError::Socket(e.into())),
        }
        // SAFETY: `buf` is valid for `buf.len()` bytes; the descriptor is ours.
        let n = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        match n {
            0 => break, // the daemon ended the capture (it stopped)
            n if n < 0 => {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => continue,
                    _ => return Err(CaptureError::Socket(e)),
                }
            }
            n => {
                let rec = &buf[..n as usize];
                out.write_all(rec).map_err(CaptureError::Write)?;
                out.flush().map_err(CaptureError::Write)?;
                stats.packets += 1;
                stats.bytes += rec.len() as u64;
            }
        }
    }
    Ok(stats)
}
