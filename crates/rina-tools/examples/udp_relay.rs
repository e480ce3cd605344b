//! A plain UDP relay for the benchmarks: the floor of any design that puts
//! a process between an application and the network at each end.
//!
//! `udp_relay LISTEN NEXT` takes datagrams on `LISTEN`, sends them on to
//! `NEXT` from a socket of its own, and sends what `NEXT` answers back to
//! whoever spoke last on `LISTEN`. It does nothing else: no header, no
//! queue, no protocol. Each direction is a thread blocked in `recv`, so a
//! datagram costs one wake-up of a sleeping process, as it does through a
//! sleeping `rinad`. `bench/foundation.sh` chains two (one for each
//! daemon) between `sockperf` and its server: the round trip through them
//! is what the daemons' two extra hops each way cost before any RINA work.
//!
//!   cargo run --release -p rina-tools --example udp_relay -- 127.0.0.1:11201 127.0.0.1:11199

use std::net::{SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [listen, next] = args.as_slice() else {
        eprintln!("usage: udp_relay LISTEN_ADDR NEXT_ADDR");
        std::process::exit(2);
    };
    let parse = |s: &str| -> SocketAddr {
        s.parse().unwrap_or_else(|e| {
            eprintln!("udp_relay: bad address {s:?}: {e}");
            std::process::exit(2)
        })
    };
    let (listen, next) = (parse(listen), parse(next));
    let front = UdpSocket::bind(listen).unwrap_or_else(|e| {
        eprintln!("udp_relay: cannot bind {listen}: {e}");
        std::process::exit(1)
    });
    let back = UdpSocket::bind(SocketAddr::new(listen.ip(), 0))
        .and_then(|b| b.connect(next).map(|()| b))
        .unwrap_or_else(|e| {
            eprintln!("udp_relay: cannot reach {next}: {e}");
            std::process::exit(1)
        });
    let (front, back) = (Arc::new(front), Arc::new(back));
    let last_peer: Arc<Mutex<Option<SocketAddr>>> = Arc::new(Mutex::new(None));

    let answers = {
        let (front, back, last_peer) = (front.clone(), back.clone(), last_peer.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            loop {
                let n = match back.recv(&mut buf) {
                    Ok(n) => n,
                    Err(e) if refused(&e) => continue,
                    Err(_) => return,
                };
                let peer = *last_peer.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(peer) = peer {
                    let _ = front.send_to(&buf[..n], peer);
                }
            }
        })
    };
    let mut buf = vec![0u8; 65536];
    loop {
        let (n, from) = match front.recv_from(&mut buf) {
            Ok(got) => got,
            Err(e) if refused(&e) => continue,
            Err(_) => break,
        };
        *last_peer.lock().unwrap_or_else(|p| p.into_inner()) = Some(from);
        let _ = back.send(&buf[..n]);
    }
    let _ = answers.join();
}

/// An ICMP "port unreachable" from an earlier send, reported on a later
/// receive: the far end was not up yet; not a reason to stop.
fn refused(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::ConnectionRefused
}
