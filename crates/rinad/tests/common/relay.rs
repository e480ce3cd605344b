//! An on-path UDP relay between two shim-udp IPCPs: records what each side
//! sends and injects datagrams from the address the receiver knows as its
//! peer (an attacker on the path, or a capture).

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The on-path relay: `to_beta` is alpha's idea of beta, `to_alpha` is
/// beta's idea of alpha. Records every datagram each side sends.
pub struct Relay {
    to_beta: UdpSocket,
    to_alpha: UdpSocket,
    beta: SocketAddr,
    alpha: SocketAddr,
    /// What alpha sent.
    pub captured: Arc<Mutex<Vec<Vec<u8>>>>,
    /// What beta sent.
    pub captured_b: Arc<Mutex<Vec<Vec<u8>>>>,
    stop: Arc<AtomicBool>,
}

impl Relay {
    pub fn start(alpha: SocketAddr, beta: SocketAddr) -> Relay {
        let a_side = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b_side = UdpSocket::bind("127.0.0.1:0").unwrap();
        let captured = Arc::new(Mutex::new(Vec::new()));
        let captured_b = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        for (rx, tx, to, record) in [
            (
                a_side.try_clone().unwrap(),
                b_side.try_clone().unwrap(),
                beta,
                captured.clone(),
            ),
            (
                b_side.try_clone().unwrap(),
                a_side.try_clone().unwrap(),
                alpha,
                captured_b.clone(),
            ),
        ] {
            let stop = stop.clone();
            rx.set_read_timeout(Some(Duration::from_millis(50)))
                .unwrap();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 70_000];
                while !stop.load(Ordering::Relaxed) {
                    let Ok(n) = rx.recv(&mut buf) else { continue };
                    record.lock().unwrap().push(buf[..n].to_vec());
                    let _ = tx.send_to(&buf[..n], to);
                }
            });
        }
        Relay {
            to_beta: b_side,
            to_alpha: a_side,
            beta,
            alpha,
            captured,
            captured_b,
            stop,
        }
    }

    pub fn port_for_alpha(&self) -> u16 {
        self.to_alpha.local_addr().unwrap().port()
    }

    pub fn port_for_beta(&self) -> u16 {
        self.to_beta.local_addr().unwrap().port()
    }

    /// Sends a datagram to beta from alpha's address (as beta knows it).
    pub fn inject_to_beta(&self, d: &[u8]) {
        self.to_beta.send_to(d, self.beta).unwrap();
    }

    pub fn inject_to_alpha(&self, d: &[u8]) {
        self.to_alpha.send_to(d, self.alpha).unwrap();
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
