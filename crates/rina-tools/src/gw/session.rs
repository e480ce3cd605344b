//! One session of `rina-gw`: a TCP connection and its flow, and the bytes
//! between them, each way on a thread of its own (blocking reads and
//! writes: the flow's back-pressure holds the TCP reader, and the TCP
//! window the flow's reader).

use rina::Flow;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;

/// Largest SDU a session writes, whatever the flow's largest: a TCP read
/// rarely brings more, and the buffer is allocated per session.
pub const MAX_CHUNK: usize = 64 << 10;

/// What a session carried, and how it ended.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Carried {
    /// Bytes from the TCP connection onto the flow.
    pub to_rina: u64,
    /// Bytes from the flow onto the TCP connection.
    pub from_rina: u64,
    /// What ended the TCP-to-flow direction, if not the connection's end.
    pub error: Option<String>,
}

/// Carries bytes between `tcp` and `flow` until either ends, then ends the
/// other: the connection's end (or error) closes the flow, whose daemon
/// still takes and sends what was written on it before (it reads a closed
/// flow to its end, and lingers until its EFCP delivered; the far daemon
/// keeps the flow's end open until its application has taken it); the
/// flow's end closes the connection once what came on the flow was
/// written to it.
pub fn carry(tcp: TcpStream, flow: Flow) -> io::Result<Carried> {
    let flow = Arc::new(flow);
    let back_tcp = tcp.try_clone()?;
    let back_flow = Arc::clone(&flow);
    let back = std::thread::Builder::new()
        .name("rina-gw-from-rina".into())
        .spawn(move || flow_to_tcp(&back_flow, back_tcp))?;
    let (to_rina, error) = tcp_to_flow(&flow, &tcp);
    let from_rina = back.join().unwrap_or(0);
    Ok(Carried {
        to_rina,
        from_rina,
        error,
    })
}

/// TCP reads onto the flow, one SDU each, until the connection ends;
/// then the flow is closed.
fn tcp_to_flow(flow: &Flow, mut tcp: &TcpStream) -> (u64, Option<String>) {
    let mut buf = vec![0u8; flow.max_sdu().clamp(1, MAX_CHUNK)];
    let mut total = 0u64;
    let error = loop {
        match tcp.read(&mut buf) {
            Ok(0) => break None,
            Ok(n) => match flow.write(&buf[..n]) {
                Ok(()) => total += n as u64,
                // The flow ended: the other direction says why, if at all.
                Err(e) if e.kind() == rina::ErrorKind::DaemonGone => break None,
                Err(e) => break Some(format!("writing to the flow: {e}")),
            },
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // Reset by the peer, or shut down by the other direction.
            Err(_) => break None,
        }
    };
    flow.shutdown();
    (total, error)
}

/// SDUs of the flow onto the connection until the flow ends; then the
/// connection is shut down (both ways: a flow has no half-close) and the
/// flow with it, if the connection failed first.
fn flow_to_tcp(flow: &Flow, mut tcp: TcpStream) -> u64 {
    let mut buf = vec![0u8; flow.max_sdu().max(1)];
    let mut total = 0u64;
    while let Ok(n) = flow.read(&mut buf) {
        if n == 0 || tcp.write_all(&buf[..n]).is_err() {
            break;
        }
        total += n as u64;
    }
    let _ = tcp.shutdown(Shutdown::Both);
    flow.shutdown();
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::flows;
    use std::net::TcpListener;

    /// A connected TCP pair on loopback: (the gateway's end, the user's).
    fn tcp_pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let user = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (gw, _) = l.accept().unwrap();
        (gw, user)
    }

    #[test]
    fn bytes_cross_both_ways_and_the_connection_s_end_closes_the_flow() {
        let (gw, mut user) = tcp_pair();
        // A flow of 1000-byte SDUs, its far end played by `peer`.
        let (flow, peer) = flows(1000, 1000);
        let session = std::thread::spawn(move || carry(gw, flow).unwrap());
        let sent: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
        user.write_all(&sent).unwrap();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 1000];
        while got.len() < sent.len() {
            let n = peer.read(&mut buf).unwrap();
            assert!(n <= 1000, "an SDU of {n} bytes on a flow of 1000");
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, sent);
        peer.write(b"answer").unwrap();
        let mut a = [0u8; 6];
        user.read_exact(&mut a).unwrap();
        assert_eq!(&a, b"answer");
        // The user closes: the flow ends (its peer's read fails), and the
        // session says what it carried.
        drop(user);
        assert!(peer.read(&mut buf).is_err(), "the flow still open");
        let c = session.join().unwrap();
        assert_eq!((c.to_rina, c.from_rina, c.error), (50_000, 6, None));
    }

    #[test]
    fn the_flow_s_end_closes_the_connection_after_what_came_on_it() {
        let (gw, mut user) = tcp_pair();
        let (flow, peer) = flows(1000, 1000);
        let session = std::thread::spawn(move || carry(gw, flow).unwrap());
        for _ in 0..10 {
            peer.write(&[7u8; 1000]).unwrap();
        }
        drop(peer);
        let mut got = Vec::new();
        user.read_to_end(&mut got).unwrap();
        assert_eq!(got, vec![7u8; 10_000], "all that came, then the end");
        let c = session.join().unwrap();
        assert_eq!((c.to_rina, c.from_rina), (0, 10_000));
    }
}
