//! Handing SDUs to applications' flow sockets many at a time.
//!
//! SDUs for an application on a socket (no rings) wait in its flow's
//! held queue while the daemon works through a batch of input, and go
//! out at the end of it with one `sendmmsg` per flow (a full batch at
//! once), each SDU one packet gathered from the buffers it arrived in,
//! instead of one `sendmsg` each. What is left per SDU is the kernel's:
//! its copy into the socket, and the wake-up of a reader that sleeps
//! (the kernel lets the woken application run between the packets of a
//! `sendmmsg` as it did between calls).

use super::held::HeldQueue;
use crate::sys::{self, Sent};
use rina_core::sdu::Sdu;
use std::io;
use std::os::fd::RawFd;

/// Packets one `sendmmsg` carries at most.
pub(super) const BATCH: usize = 64;

/// What [`SendBatch::send`] did with a flow's held SDUs.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Outcome {
    /// SDUs the socket took (removed from the queue).
    pub taken: usize,
    /// SDUs dropped: larger than the socket can ever take, or every SDU
    /// held once the application is gone (removed from the queue).
    pub dropped: usize,
    /// The socket is full: the rest waits for it to become writable.
    pub blocked: bool,
}

/// Reused `sendmmsg` headers and iovecs.
#[derive(Default)]
pub(super) struct SendBatch {
    iovs: Vec<libc::iovec>,
    msgs: Vec<libc::mmsghdr>,
}

impl SendBatch {
    /// Sends the SDUs of `queue` to socket `fd` in order, without blocking,
    /// [`BATCH`] per system call, until the queue is empty or the socket
    /// full.
    pub(super) fn send(&mut self, fd: RawFd, queue: &mut HeldQueue<Sdu>) -> Outcome {
        let mut out = Outcome::default();
        while let Some(front) = queue.front() {
            let step = if front.parts().len() > sys::MAX_IOV {
                // More pieces than one packet gathers: alone, copied.
                match sys::send(fd, &front.to_vec(), None) {
                    Ok(Sent::Done) => Step::Took(1),
                    Ok(Sent::WouldBlock) => Step::Blocked,
                    Ok(Sent::TooBig) => Step::TooBig,
                    Ok(Sent::Closed) | Err(_) => Step::Gone,
                }
            } else {
                self.send_batch(fd, queue)
            };
            match step {
                Step::Took(n) => {
                    queue.drop_front(n);
                    out.taken += n;
                }
                Step::Retry => {}
                Step::Blocked => {
                    out.blocked = true;
                    return out;
                }
                Step::TooBig => {
                    // Larger than the socket can ever take: lost alone.
                    queue.pop_front();
                    out.dropped += 1;
                }
                Step::Gone => {
                    out.dropped += queue.len();
                    queue.clear();
                    return out;
                }
            }
        }
        out
    }

    /// One `sendmmsg` of the SDUs at the front of `queue`.
    fn send_batch(&mut self, fd: RawFd, queue: &HeldQueue<Sdu>) -> Step {
        let n = self.lay_out(queue);
        // SAFETY: the `n` headers point at iovecs in `self.iovs` over
        // buffers of the SDUs in `queue`, untouched until this returns.
        let r = unsafe {
            libc::sendmmsg(
                fd,
                self.msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        match r {
            // Fewer than `n`: the next call says why the next was not.
            1.. => Step::Took(r as usize),
            0 => Step::Blocked,
            _ => match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => Step::Retry,
                Some(libc::EAGAIN) => Step::Blocked,
                Some(libc::EMSGSIZE) => Step::TooBig,
                // EPIPE, ECONNRESET: the application is gone.
                _ => Step::Gone,
            },
        }
    }

    /// Lays out headers and iovecs for the SDUs at the front of `queue`
    /// (at most [`BATCH`], each of at most [`sys::MAX_IOV`] pieces):
    /// how many.
    fn lay_out(&mut self, queue: &HeldQueue<Sdu>) -> usize {
        self.iovs.clear();
        self.msgs.clear();
        let mut counts = [0usize; BATCH];
        let mut n = 0;
        for sdu in queue.iter().take(BATCH) {
            let parts = sdu.parts();
            if parts.len() > sys::MAX_IOV {
                break;
            }
            counts[n] = parts.len();
            self.iovs.extend(parts.iter().map(|p| libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            }));
            n += 1;
        }
        let mut at = 0;
        for &count in &counts[..n] {
            // SAFETY: mmsghdr is plain data; all-zero is a valid empty one.
            let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
            // SAFETY: `at + count` is within `iovs`, laid out above and not
            // moved until the next call.
            m.msg_hdr.msg_iov = unsafe { self.iovs.as_mut_ptr().add(at) };
            m.msg_hdr.msg_iovlen = count as _;
            at += count;
            self.msgs.push(m);
        }
        n
    }
}

/// What one system call did with the front of a flow's queue.
enum Step {
    /// The socket took this many SDUs.
    Took(usize),
    /// Interrupted before anything was sent: again.
    Retry,
    /// The socket is full.
    Blocked,
    /// The front SDU is larger than the socket can ever take.
    TooBig,
    /// The application is gone.
    Gone,
}

#[cfg(test)]
mod tests {
    use super::*;
    use rina_core::buf::PduBuf;
    use std::os::fd::{AsRawFd, OwnedFd};

    /// SDU `k` of `len` bytes, its bytes all `k`, in `parts` buffers.
    fn sdu(k: u8, len: usize, parts: usize) -> Sdu {
        let bytes = vec![k; len];
        let step = len.div_ceil(parts);
        Sdu::gathered(
            bytes
                .chunks(step)
                .map(|c| PduBuf::from(c.to_vec()))
                .collect(),
        )
    }

    /// The packets waiting on `fd`, each as read.
    fn read_all(fd: &OwnedFd) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 70_000];
        while let Ok(sys::Recv::Packet(n)) = sys::recv(fd.as_raw_fd(), &mut buf) {
            got.push(buf[..n].to_vec());
        }
        got
    }

    #[test]
    fn every_sdu_arrives_whole_and_in_order_gathered_from_its_parts() {
        let (ours, theirs) = sys::flow_pair(4 << 20).unwrap();
        sys::set_nonblocking(theirs.as_raw_fd()).unwrap();
        // More than a batch, of one part and of several, and one in more
        // pieces than a packet gathers (sent alone, copied).
        let shape = |k: usize| match k {
            70 => (2_000, 2_000),
            _ => (100 + k * 7, 1 + k % 5),
        };
        let mut q: HeldQueue<Sdu> = (0..151)
            .map(|k| {
                let (len, parts) = shape(k);
                sdu(k as u8, len, parts)
            })
            .collect();
        assert!(q.iter().nth(70).unwrap().parts().len() > sys::MAX_IOV);
        let out = SendBatch::default().send(ours.as_raw_fd(), &mut q);
        assert_eq!(
            out,
            Outcome {
                taken: 151,
                dropped: 0,
                blocked: false
            }
        );
        assert!(q.is_empty());
        let got = read_all(&theirs);
        assert_eq!(got.len(), 151);
        for (k, p) in got.iter().enumerate() {
            assert_eq!(p, &vec![k as u8; shape(k).0], "SDU {k}");
        }
    }

    #[test]
    fn a_full_socket_keeps_the_rest_in_order_for_later() {
        let (ours, theirs) = sys::flow_pair(16 << 10).unwrap();
        sys::set_nonblocking(theirs.as_raw_fd()).unwrap();
        let mut q: HeldQueue<Sdu> = (0..200u8).map(|k| sdu(k, 1400, 2)).collect();
        let mut batch = SendBatch::default();
        let first = batch.send(ours.as_raw_fd(), &mut q);
        assert!(first.blocked, "a 16 KiB socket cannot take 280 KB");
        assert!(first.taken > 0 && first.taken < 200);
        assert_eq!(first.dropped, 0);
        assert_eq!(q.len(), 200 - first.taken);
        // The reader catches up; what was held follows, nothing lost.
        let mut got = read_all(&theirs);
        while !q.is_empty() {
            batch.send(ours.as_raw_fd(), &mut q);
            got.extend(read_all(&theirs));
        }
        assert_eq!(got.len(), 200);
        for (k, p) in got.iter().enumerate() {
            assert_eq!(p, &vec![k as u8; 1400], "SDU {k}");
        }
    }

    #[test]
    fn an_sdu_too_large_is_dropped_alone_and_a_gone_reader_drops_all() {
        let (ours, theirs) = sys::flow_pair(8 << 10).unwrap();
        sys::set_nonblocking(theirs.as_raw_fd()).unwrap();
        // Larger than the send buffer can ever hold: EMSGSIZE.
        let mut q: HeldQueue<Sdu> = [sdu(1, 100, 1), sdu(2, 1 << 20, 3), sdu(3, 100, 1)]
            .into_iter()
            .collect();
        let out = SendBatch::default().send(ours.as_raw_fd(), &mut q);
        assert_eq!(
            out,
            Outcome {
                taken: 2,
                dropped: 1,
                blocked: false
            }
        );
        assert_eq!(read_all(&theirs), vec![vec![1u8; 100], vec![3u8; 100]]);
        drop(theirs);
        let mut q: HeldQueue<Sdu> = (0..5u8).map(|k| sdu(k, 100, 1)).collect();
        let out = SendBatch::default().send(ours.as_raw_fd(), &mut q);
        assert_eq!(
            out,
            Outcome {
                taken: 0,
                dropped: 5,
                blocked: false
            }
        );
        assert!(q.is_empty());
    }
}
