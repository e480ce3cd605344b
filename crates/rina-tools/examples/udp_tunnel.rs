//! A plain IP-over-UDP tunnel for the benchmarks: the floor of any
//! userspace tunnel between two TUNs on this host, to set `rina-ip` beside.
//!
//! `udp_tunnel TUN ADDRESS/LEN LOCAL_UDP PEER_UDP` creates TUN `TUN` (with
//! checksum offload and MTU 65530, as `rina-ip` does), gives it `ADDRESS`,
//! and carries every packet it reads to the peer as UDP datagrams of at
//! most `SEG` bytes of packet each (1434 by default, a 1450-byte datagram,
//! as `rina-ip`'s PDUs in `bench/rina_ip.sh`), sent in one segmentation-
//! offloaded `sendmsg` straight from the read buffer (no copy); it reads
//! the peer's datagrams with `UDP_GRO`, puts each packet back together
//! (one copy) and writes it to the TUN. It has no flows, no names, no
//! headers but a 16-byte one per datagram (packet number, segment index
//! and count, the packet's `virtio_net_hdr` fields), no queue, no policy:
//! one thread per direction, asleep in `read`/`recvmsg`.
//!
//!   udp_tunnel tun0 10.9.0.1/24 172.30.9.1:7301 172.30.9.2:7301

use rina_tools::ip::route::Prefix;
use rina_tools::ip::tun::{Tun, VnetHdr};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;

/// Bytes of header in front of each segment.
const HDR: usize = 16;
/// The largest packet read from the TUN.
const MAX_PKT: usize = 65536;
/// `SOL_UDP` options (linux/udp.h): the segment size of offloaded sends,
/// and coalesced receives (also the type of their control message).
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [tun, addr, local, peer] = args.as_slice() else {
        die("usage: udp_tunnel TUN ADDRESS/LEN LOCAL_UDP PEER_UDP");
    };
    let seg: usize = std::env::var("SEG")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1434);
    let addr = Prefix::parse(addr).unwrap_or_else(|e| die(&format!("bad address: {e}")));
    let local: SocketAddr = local.parse().unwrap_or_else(|_| die("bad LOCAL_UDP"));
    let peer: SocketAddr = peer.parse().unwrap_or_else(|_| die("bad PEER_UDP"));
    let tun = Tun::create(tun, true).unwrap_or_else(|e| die(&format!("cannot create TUN: {e}")));
    tun.set_mtu(65530)
        .and_then(|()| tun.add_address(&addr))
        .and_then(|()| tun.up())
        .unwrap_or_else(|e| die(&format!("cannot set the TUN up: {e}")));
    let sock = UdpSocket::bind(local)
        .and_then(|s| s.connect(peer).map(|()| s))
        .unwrap_or_else(|e| die(&format!("cannot open the UDP socket: {e}")));
    set_udp_opt(&sock, UDP_SEGMENT, (HDR + seg) as libc::c_int);
    set_udp_opt(&sock, UDP_GRO, 1);
    let (tun, sock) = (Arc::new(tun), Arc::new(sock));
    let out = {
        let (tun, sock) = (tun.clone(), sock.clone());
        std::thread::spawn(move || tun_to_udp(&tun, &sock, seg))
    };
    udp_to_tun(&tun, &sock);
    let _ = out.join();
}

fn die(msg: &str) -> ! {
    eprintln!("udp_tunnel: {msg}");
    std::process::exit(2)
}

fn set_udp_opt(sock: &UdpSocket, opt: libc::c_int, v: libc::c_int) {
    // SAFETY: an int option on a socket we own.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        die(&format!(
            "setsockopt({opt}): {}",
            std::io::Error::last_os_error()
        ));
    }
}

/// Reads packets from the TUN and sends each as one offloaded batch of
/// segments, each a header and a slice of the read buffer.
fn tun_to_udp(tun: &Tun, sock: &UdpSocket, seg: usize) {
    let mut pkt = vec![0u8; MAX_PKT];
    let mut hdrs = vec![[0u8; HDR]; MAX_PKT.div_ceil(seg)];
    let mut iov: Vec<libc::iovec> = Vec::with_capacity(2 * hdrs.len());
    let mut number: u32 = 0;
    loop {
        let mut vh = VnetHdr::default();
        let n = match tun.read_timeout(&mut vh, &mut pkt, std::time::Duration::from_secs(3600)) {
            Ok(Some(n)) => n,
            Ok(None) => continue,
            Err(e) => die(&format!("TUN read: {e}")),
        };
        number = number.wrapping_add(1);
        let count = n.div_ceil(seg);
        iov.clear();
        for (i, chunk) in pkt[..n].chunks(seg).enumerate() {
            let h = &mut hdrs[i];
            h[0..4].copy_from_slice(&number.to_be_bytes());
            h[4..6].copy_from_slice(&(i as u16).to_be_bytes());
            h[6..8].copy_from_slice(&(count as u16).to_be_bytes());
            h[8] = vh.flags;
            h[9] = vh.gso_type;
            h[10..12].copy_from_slice(&vh.csum_start.to_be_bytes());
            h[12..14].copy_from_slice(&vh.csum_offset.to_be_bytes());
            iov.push(libc::iovec {
                iov_base: h.as_mut_ptr().cast(),
                iov_len: HDR,
            });
            iov.push(libc::iovec {
                iov_base: chunk.as_ptr() as *mut libc::c_void,
                iov_len: chunk.len(),
            });
        }
        // One offloaded send carries at most 64 segments and 64 KiB.
        let per = (65_000 / (HDR + seg)).clamp(1, 64);
        for batch in iov.chunks_mut(2 * per) {
            send_batch(sock, batch);
        }
    }
}

/// Sends the segments of `iov` (header, slice, header, slice...) in one
/// `sendmsg`, which the kernel cuts at the socket's `UDP_SEGMENT` size.
fn send_batch(sock: &UdpSocket, iov: &mut [libc::iovec]) {
    // SAFETY: a zeroed msghdr is valid; the iovecs point into the caller's
    // headers and packet, alive and unchanged for the call.
    let r = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len();
        libc::sendmsg(sock.as_raw_fd(), &msg, 0)
    };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::ConnectionRefused {
            eprintln!("udp_tunnel: send: {e}");
        }
    }
}

/// Reads the peer's (coalesced) datagrams and writes each packet to the
/// TUN once its segments are all in.
fn udp_to_tun(tun: &Tun, sock: &UdpSocket) {
    let mut buf = vec![0u8; 65536];
    let mut pkt: Vec<u8> = Vec::with_capacity(MAX_PKT);
    let (mut cur, mut next_idx) = (None::<u32>, 0u16);
    loop {
        let (n, gso) = match recv_gro(sock, &mut buf) {
            Ok(got) => got,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => continue,
            Err(e) => die(&format!("UDP receive: {e}")),
        };
        let step = if gso == 0 { n } else { gso };
        for d in buf[..n].chunks(step) {
            if d.len() < HDR {
                continue;
            }
            let number = u32::from_be_bytes([d[0], d[1], d[2], d[3]]);
            let idx = u16::from_be_bytes([d[4], d[5]]);
            let count = u16::from_be_bytes([d[6], d[7]]);
            if idx == 0 {
                pkt.clear();
                (cur, next_idx) = (Some(number), 0);
            }
            if cur != Some(number) || idx != next_idx {
                cur = None; // a segment lost or out of order: drop the packet
                continue;
            }
            pkt.extend_from_slice(&d[HDR..]);
            next_idx += 1;
            if next_idx == count {
                let vh = VnetHdr {
                    flags: d[8],
                    gso_type: d[9],
                    csum_start: u16::from_be_bytes([d[10], d[11]]),
                    csum_offset: u16::from_be_bytes([d[12], d[13]]),
                };
                if let Err(e) = tun.write(vh, &pkt) {
                    eprintln!("udp_tunnel: TUN write: {e}");
                }
                cur = None;
            }
        }
    }
}

/// One `recvmsg` with `UDP_GRO`: the bytes and the segment size of the
/// coalesced datagrams (0 for a single one).
fn recv_gro(sock: &UdpSocket, buf: &mut [u8]) -> std::io::Result<(usize, usize)> {
    let mut cbuf = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: a zeroed msghdr is valid; `iov` and `cbuf` outlive the call;
    // the control messages are walked with the kernel's macros within
    // `msg_controllen`.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf);
        let n = libc::recvmsg(sock.as_raw_fd(), &mut msg, 0);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut gso = 0usize;
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == UDP_GRO {
                let mut v: libc::c_int = 0;
                std::ptr::copy_nonoverlapping(
                    libc::CMSG_DATA(c),
                    (&mut v as *mut libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>(),
                );
                gso = v.max(0) as usize;
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        Ok((n as usize, gso))
    }
}
