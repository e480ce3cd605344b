//! The link emulator of the `local` backend: a UDP relay per link.
//!
//! Each link has two sockets on loopback, one facing each end's shim-udp
//! IPCP (whose directory points at it). A datagram from end A's shim is
//! accepted only from that shim's address, then:
//!
//! 1. dropped if the link is down;
//! 2. dropped if the transmit queue (frames whose serialisation has not
//!    finished) already holds `queue` frames;
//! 3. dropped with probability `loss` (a ChaCha8 stream per direction,
//!    seeded from the experiment seed and the link index) once the loss is
//!    on ([`Relay::set_lossy`]: the run turns it on when traffic starts);
//! 4. otherwise serialised at `rate` (payload plus [`LINK_OVERHEAD`] bytes,
//!    back to back after the previous frame) and sent from the socket
//!    facing end B after the link's `delay`.
//!
//! Per direction, one thread receives, decides and sends each frame at
//! its due time, so frames leave in order.

use crate::backend::sim::{mix, LINK_OVERHEAD};
use nix::errno::Errno;
use nix::poll::{ppoll, PollFd, PollFlags};
use nix::sys::time::TimeSpec;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a link does to frames.
#[derive(Debug, Clone, Copy)]
pub struct LinkParams {
    /// Rate, bit/s.
    pub rate_bps: f64,
    /// One-way delay.
    pub delay: Duration,
    /// Loss probability per frame.
    pub loss: f64,
    /// Transmit queue, frames.
    pub queue: usize,
    /// Seed of the loss draws.
    pub seed: u64,
}

/// Counters of one direction.
#[derive(Debug, Default)]
pub struct DirStats {
    /// Bytes accepted for transmission (payload plus overhead).
    pub bytes: AtomicU64,
    /// Frames dropped (down, queue full or random loss).
    pub dropped: AtomicU64,
}

/// A running link emulator; stops its threads when dropped.
pub struct Relay {
    /// Where end A's shim sends (the socket facing A).
    pub addr_a: SocketAddr,
    /// Where end B's shim sends.
    pub addr_b: SocketAddr,
    /// A to B counters.
    pub ab: Arc<DirStats>,
    /// B to A counters.
    pub ba: Arc<DirStats>,
    up: Arc<AtomicBool>,
    lossy: Arc<AtomicBool>,
    quit: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Relay {
    /// Starts relaying between the shims bound at `shim_a` and `shim_b`.
    pub fn start(p: LinkParams, shim_a: SocketAddr, shim_b: SocketAddr) -> io::Result<Relay> {
        let sa = UdpSocket::bind("127.0.0.1:0")?;
        let sb = UdpSocket::bind("127.0.0.1:0")?;
        let addr_a = sa.local_addr()?;
        let addr_b = sb.local_addr()?;
        let up = Arc::new(AtomicBool::new(true));
        let lossy = Arc::new(AtomicBool::new(false));
        let quit = Arc::new(AtomicBool::new(false));
        let ab = Arc::new(DirStats::default());
        let ba = Arc::new(DirStats::default());
        let mut threads = Vec::new();
        for (dir, rx, tx, from, to, st) in [
            (
                0u64,
                sa.try_clone()?,
                sb.try_clone()?,
                shim_a,
                shim_b,
                ab.clone(),
            ),
            (1u64, sb, sa, shim_b, shim_a, ba.clone()),
        ] {
            let pump = Pump {
                rx,
                tx,
                from,
                to,
                p,
                rng: ChaCha8Rng::seed_from_u64(mix(p.seed, dir)),
                stats: st,
                up: up.clone(),
                lossy: lossy.clone(),
                quit: quit.clone(),
            };
            threads.push(
                std::thread::Builder::new()
                    .name("rina-lab-link".into())
                    .spawn(move || pump.run())?,
            );
        }
        Ok(Relay {
            addr_a,
            addr_b,
            ab,
            ba,
            up,
            lossy,
            quit,
            threads,
        })
    }

    /// Takes the link down (every frame dropped) or up again.
    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
    }

    /// Starts (or stops) the random loss. Links start lossless so that
    /// enrollment is not at the mercy of the loss draws; the run turns the
    /// loss on when traffic starts.
    pub fn set_lossy(&self, lossy: bool) {
        self.lossy.store(lossy, Ordering::Relaxed);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.quit.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

struct Pump {
    rx: UdpSocket,
    tx: UdpSocket,
    from: SocketAddr,
    to: SocketAddr,
    p: LinkParams,
    rng: ChaCha8Rng,
    stats: Arc<DirStats>,
    up: Arc<AtomicBool>,
    lossy: Arc<AtomicBool>,
    quit: Arc<AtomicBool>,
}

impl Pump {
    /// Receives, applies down/queue/loss/rate, and sends each frame at its
    /// due time, all on one thread: `ppoll` waits for the next datagram or
    /// the next due time, whichever comes first (its timeout is precise to
    /// the thread's timer slack, lowered to 1 µs; a socket's receive
    /// timeout is rounded to the kernel's tick, several milliseconds).
    /// One wake-up per frame received and one per due time, where a
    /// receiving thread handing frames to a sending one took three.
    fn run(mut self) {
        let _ = nix::sys::prctl::set_timerslack(1_000);
        if self.rx.set_nonblocking(true).is_err() {
            return;
        }
        // Frames accepted and their due times, in order.
        let mut line: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
        // End of serialisation of the frames accepted, oldest first.
        let mut departures: VecDeque<Instant> = VecDeque::new();
        let mut last_departure = Instant::now();
        let mut buf = vec![0u8; 65536];
        while !self.quit.load(Ordering::Relaxed) {
            let now = Instant::now();
            while line.front().is_some_and(|(due, _)| *due <= now) {
                if let Some((_, frame)) = line.pop_front() {
                    let _ = self.tx.send_to(&frame, self.to);
                }
            }
            let wait = line
                .front()
                .map_or(QUIT_CHECK, |(due, _)| due.saturating_duration_since(now))
                .min(QUIT_CHECK);
            let mut fds = [PollFd::new(self.rx.as_fd(), PollFlags::POLLIN)];
            match ppoll(&mut fds, Some(TimeSpec::from_duration(wait)), None) {
                Ok(0) | Err(Errno::EINTR) => continue,
                Ok(_) => {}
                Err(_) => return,
            }
            // A bounded batch, so that a flood cannot hold back the frames
            // falling due meanwhile.
            for _ in 0..RECV_BATCH {
                let n = match self.rx.recv_from(&mut buf) {
                    Ok((n, src)) if src == self.from => n,
                    Ok(_) => continue,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                let now = Instant::now();
                let accepted = self.accept(n, now, &mut departures, &mut last_departure);
                if let Some(departure) = accepted {
                    line.push_back((departure + self.p.delay, buf[..n].to_vec()));
                }
            }
        }
    }

    /// Applies down, queue, rate and loss to a frame of `n` bytes received
    /// at `now`; its departure time if it is to be sent.
    fn accept(
        &mut self,
        n: usize,
        now: Instant,
        departures: &mut VecDeque<Instant>,
        last_departure: &mut Instant,
    ) -> Option<Instant> {
        if !self.up.load(Ordering::Relaxed) {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        while departures.front().is_some_and(|d| *d <= now) {
            departures.pop_front();
        }
        if departures.len() >= self.p.queue {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let wire = n + LINK_OVERHEAD;
        let start = (*last_departure).max(now);
        let departure = start + Duration::from_secs_f64(wire as f64 * 8.0 / self.p.rate_bps);
        *last_departure = departure;
        departures.push_back(departure);
        self.stats.bytes.fetch_add(wire as u64, Ordering::Relaxed);
        if self.p.loss > 0.0
            && self.lossy.load(Ordering::Relaxed)
            && self.rng.gen::<f64>() < self.p.loss
        {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(departure)
    }
}

/// Most datagrams received per wake-up.
const RECV_BATCH: usize = 64;

/// How often an idle pump looks at its quit flag.
const QUIT_CHECK: Duration = Duration::from_millis(50);

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (UdpSocket, UdpSocket) {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        b.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        (a, b)
    }

    #[test]
    fn relay_adds_the_link_delay_and_keeps_order() {
        let (a, b) = pair();
        let p = LinkParams {
            rate_bps: 1e9,
            delay: Duration::from_millis(5),
            loss: 0.0,
            queue: 100,
            seed: 1,
        };
        let r = Relay::start(p, a.local_addr().unwrap(), b.local_addr().unwrap()).unwrap();
        let t0 = Instant::now();
        for i in 0..10u8 {
            a.send_to(&[i; 100], r.addr_a).unwrap();
        }
        let mut buf = [0u8; 200];
        for i in 0..10u8 {
            let (n, from) = b.recv_from(&mut buf).unwrap();
            assert_eq!((n, buf[0], from), (100, i, r.addr_b));
        }
        assert!(t0.elapsed() >= Duration::from_millis(5));
        // One frame alone: about the link delay.
        std::thread::sleep(Duration::from_millis(50));
        let t1 = Instant::now();
        a.send_to(b"one", r.addr_a).unwrap();
        b.recv_from(&mut buf).unwrap();
        let one = t1.elapsed();
        println!("one frame over a 5 ms link: {one:?}");
        assert!(
            one >= Duration::from_millis(5) && one < Duration::from_millis(15),
            "{one:?}"
        );
        // And back.
        b.send_to(b"x", r.addr_b).unwrap();
        let (n, from) = a.recv_from(&mut buf).unwrap();
        assert_eq!((n, from), (1, r.addr_a));
    }

    #[test]
    fn relay_rate_limits_and_drops_beyond_its_queue() {
        let (a, b) = pair();
        // 1 Mb/s: a 1000-byte frame (plus overhead) takes about 8.3 ms.
        let p = LinkParams {
            rate_bps: 1e6,
            delay: Duration::ZERO,
            loss: 0.0,
            queue: 5,
            seed: 1,
        };
        let r = Relay::start(p, a.local_addr().unwrap(), b.local_addr().unwrap()).unwrap();
        let t0 = Instant::now();
        for _ in 0..20 {
            a.send_to(&[0u8; 1000], r.addr_a).unwrap();
        }
        let mut got = 0;
        b.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut buf = [0u8; 2000];
        while b.recv_from(&mut buf).is_ok() {
            got += 1;
        }
        assert!((5..=7).contains(&got), "got {got}");
        assert!(r.ab.dropped.load(Ordering::Relaxed) >= 13);
        // Five frames at 8.3 ms each.
        assert!(t0.elapsed() >= Duration::from_millis(40));
        r.set_up(false);
        a.send_to(&[0u8; 10], r.addr_a).unwrap();
        b.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        assert!(b.recv_from(&mut buf).is_err());
    }
}
