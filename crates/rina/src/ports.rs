//! UDP ports for the shim-udp IPCPs that tools and tests configure on
//! loopback.
//!
//! Binding port 0 and releasing it hands out a port from the kernel's
//! ephemeral range, which any other process may be given by the kernel
//! before the daemon binds it (a test once failed so, with others running
//! beside it). The ports here come from below that range, where the kernel
//! never picks one on its own, in an order that differs per process.

use std::io;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// The lowest port handed out.
const LOW: u32 = 10_000;

/// The first port of the kernel's ephemeral range (32768 when unknown).
fn ephemeral_low() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .filter(|&p: &u32| p > LOW + 1000)
        .unwrap_or(32_768)
}

/// A UDP port on 127.0.0.1 that nothing holds now, from below the kernel's
/// ephemeral range; successive calls in a process give different ports.
pub fn unused_loopback_udp_port() -> io::Result<u16> {
    static START: OnceLock<u32> = OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let span = ephemeral_low() - LOW;
    let start = *START.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        std::process::id().wrapping_mul(7919).wrapping_add(nanos)
    });
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = LOW + start.wrapping_add(n) % span;
        let port = u16::try_from(port).expect("below the ephemeral range");
        if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        "every UDP port below the ephemeral range is in use on 127.0.0.1",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_bindable_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50)
            .map(|_| unused_loopback_udp_port().unwrap())
            .collect();
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ports.len());
        for p in ports {
            assert!(u32::from(p) >= LOW && u32::from(p) < ephemeral_low());
            UdpSocket::bind(("127.0.0.1", p)).unwrap();
        }
    }
}
