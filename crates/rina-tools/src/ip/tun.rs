//! The TUN interface: created with `TUNSETIFF` (`IFF_TUN | IFF_NO_PI`, so one
//! read or write is one bare IP packet), brought up and given its MTU with
//! `SIOCSIFFLAGS` / `SIOCSIFMTU`, addressed and routed with iproute2.
//!
//! Why the split: the MTU changes at run time whenever the flows' largest
//! SDU does, so it is an ioctl (no process, no parsing). Addresses and
//! routes are set once at start, for IPv4 and IPv6, several per interface;
//! the ioctls for those are per family, IPv4 keeps one address per label
//! and IPv6 routes need `in6_rtmsg`, so `ip addr replace` / `ip route
//! replace` (idempotent, and iproute2 is wherever TUN is) are clearer.
//!
//! The interface is not persistent: it disappears when the process exits.
//!
//! *Checksum offload* (on unless the configuration turns it off): the
//! interface is created with `IFF_VNET_HDR` and offered `TUN_F_CSUM`, so
//! every read and write starts with a 10-byte `virtio_net_hdr` and the
//! kernel hands over TCP and UDP packets whose checksum is still partial
//! ([`VnetHdr::NEEDS_CSUM`]) instead of summing each one, as a virtio NIC
//! would. Segmentation offload (TSO) is not offered: the MTU is already the
//! flows' largest SDU, up to 64 KiB, so the kernel's packets are as large.

use super::route::Prefix;
use rina::Segments;
use std::ffi::CStr;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::process::Command;
use std::time::Duration;
use thiserror::Error;

/// Why the TUN interface could not be set up.
#[derive(Debug, Error)]
pub enum TunError {
    /// `/dev/net/tun` could not be opened (no TUN support, or no permission).
    #[error("cannot open /dev/net/tun (needs CAP_NET_ADMIN and the tun module): {0}")]
    Open(io::Error),
    /// An ioctl on the interface failed.
    #[error("cannot {what} of {ifname}: {source}")]
    Ioctl {
        /// What was being done.
        what: &'static str,
        /// The interface.
        ifname: String,
        /// The system error.
        source: io::Error,
    },
    /// An `ip` command failed.
    #[error("`{cmd}` failed: {detail}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its error output, or why it could not run.
        detail: String,
    },
}

/// An open TUN interface.
#[derive(Debug)]
pub struct Tun {
    fd: OwnedFd,
    name: String,
    /// Reads and writes carry a [`VnetHdr`].
    vnet: bool,
    /// The kernel took `TUN_F_CSUM`: it may hand over partial checksums.
    csum_offload: bool,
}

/// The legacy `virtio_net_hdr` in front of each packet on a TUN with
/// `IFF_VNET_HDR` (host byte order, as the TUN uses on a little-endian
/// host unless told otherwise).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VnetHdr {
    /// `NEEDS_CSUM` and others.
    pub flags: u8,
    /// Segmentation type (`GSO_NONE` = 0: one packet).
    pub gso_type: u8,
    /// Where the partial checksum's sum starts.
    pub csum_start: u16,
    /// Where its field is, from `csum_start`.
    pub csum_offset: u16,
}

impl VnetHdr {
    /// Bytes on the TUN.
    pub const LEN: usize = 10;
    /// The checksum from `csum_start` on is still to be completed.
    pub const NEEDS_CSUM: u8 = 1;

    fn encode(self) -> [u8; VnetHdr::LEN] {
        let mut b = [0u8; VnetHdr::LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        // hdr_len and gso_size stay 0: no segmentation.
        b[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
        b
    }

    fn decode(b: &[u8; VnetHdr::LEN]) -> VnetHdr {
        VnetHdr {
            flags: b[0],
            gso_type: b[1],
            csum_start: u16::from_ne_bytes([b[6], b[7]]),
            csum_offset: u16::from_ne_bytes([b[8], b[9]]),
        }
    }
}

fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req
        .ifr_name
        .iter_mut()
        .zip(name.bytes().take(libc::IFNAMSIZ - 1))
    {
        *d = s as libc::c_char;
    }
    req
}

impl Tun {
    /// Creates (or attaches to) the TUN interface `name`, with checksum
    /// offload if `offload` (see the module's documentation).
    pub fn create(name: &str, offload: bool) -> Result<Tun, TunError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            // Non-blocking: a read of an empty TUN returns at once (see
            // `Tun::read`), so the reader polls only when it found none.
            .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open("/dev/net/tun")
            .map_err(TunError::Open)?;
        let fd: OwnedFd = file.into();
        let mut req = ifreq(name);
        let mut flags = libc::IFF_TUN | libc::IFF_NO_PI;
        if offload {
            flags |= libc::IFF_VNET_HDR;
        }
        req.ifr_ifru.ifru_flags = flags as libc::c_short;
        // SAFETY: TUNSETIFF reads and writes one ifreq, which `req` is.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF as _, &mut req) };
        if r < 0 {
            return Err(TunError::Ioctl {
                what: "create the TUN interface (TUNSETIFF)",
                ifname: name.to_owned(),
                source: io::Error::last_os_error(),
            });
        }
        // The kernel may have completed a name pattern such as "rina%d".
        // SAFETY: the kernel leaves a NUL-terminated name in ifr_name.
        let real = unsafe { CStr::from_ptr(req.ifr_name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        // A kernel that refuses the offload still reads and writes the
        // header; it just never hands over a partial checksum.
        // SAFETY: TUNSETOFFLOAD takes its flags by value.
        let csum_offload = offload
            && unsafe {
                libc::ioctl(
                    fd.as_raw_fd(),
                    libc::TUNSETOFFLOAD as _,
                    libc::TUN_F_CSUM as libc::c_ulong,
                )
            } == 0;
        Ok(Tun {
            fd,
            name: real,
            vnet: offload,
            csum_offload,
        })
    }

    /// Whether the kernel hands over (and takes) partial checksums.
    pub fn csum_offload(&self) -> bool {
        self.csum_offload
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ioctl(req)` on a throw-away IPv4 datagram socket.
    fn sock_ioctl(
        &self,
        what: &'static str,
        request: libc::c_ulong,
        req: &mut libc::ifreq,
    ) -> Result<(), TunError> {
        let err = |source| TunError::Ioctl {
            what,
            ifname: self.name.clone(),
            source,
        };
        // SAFETY: plain socket(2) call; the result is checked.
        let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if s < 0 {
            return Err(err(io::Error::last_os_error()));
        }
        // SAFETY: `s` is a descriptor we just opened and own.
        let s = unsafe { OwnedFd::from_raw_fd(s) };
        // SAFETY: the SIOC*IF* requests used here read/write one ifreq.
        let r = unsafe { libc::ioctl(s.as_raw_fd(), request as _, req as *mut libc::ifreq) };
        if r < 0 {
            return Err(err(io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Sets the MTU.
    pub fn set_mtu(&self, mtu: u32) -> Result<(), TunError> {
        let mut req = ifreq(&self.name);
        req.ifr_ifru.ifru_mtu = mtu.min(i32::MAX as u32) as libc::c_int;
        self.sock_ioctl("set the MTU", libc::SIOCSIFMTU, &mut req)
    }

    /// The MTU the kernel has for the interface.
    pub fn mtu(&self) -> Result<u32, TunError> {
        let mut req = ifreq(&self.name);
        self.sock_ioctl("read the MTU", libc::SIOCGIFMTU, &mut req)?;
        // SAFETY: SIOCGIFMTU just filled the MTU member of the union.
        let mtu = unsafe { req.ifr_ifru.ifru_mtu };
        Ok(mtu.max(0) as u32)
    }

    /// Whether the interface is up (`IFF_UP`).
    pub fn is_up(&self) -> Result<bool, TunError> {
        let mut req = ifreq(&self.name);
        self.sock_ioctl("read the flags", libc::SIOCGIFFLAGS, &mut req)?;
        // SAFETY: SIOCGIFFLAGS just filled the flags member of the union.
        let flags = unsafe { req.ifr_ifru.ifru_flags };
        Ok(flags & libc::IFF_UP as libc::c_short != 0)
    }

    /// Brings the interface up.
    pub fn up(&self) -> Result<(), TunError> {
        let mut req = ifreq(&self.name);
        self.sock_ioctl("read the flags", libc::SIOCGIFFLAGS, &mut req)?;
        // SAFETY: SIOCGIFFLAGS just filled the flags member of the union.
        let flags = unsafe { req.ifr_ifru.ifru_flags };
        req.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        self.sock_ioctl("bring up", libc::SIOCSIFFLAGS, &mut req)
    }

    /// Adds `addr` (address and prefix length) to the interface.
    pub fn add_address(&self, addr: &Prefix) -> Result<(), TunError> {
        let a = addr.to_string();
        let mut args = vec!["addr", "replace", &a, "dev", &self.name];
        if addr.addr.is_ipv6() {
            // A point-to-point TUN has no neighbours to detect duplicates with.
            args.push("nodad");
        }
        ip_command(&args)
    }

    /// Routes `prefix` to the interface.
    pub fn add_route(&self, prefix: &Prefix) -> Result<(), TunError> {
        ip_command(&["route", "replace", &prefix.to_string(), "dev", &self.name])
    }

    /// Reads one packet into `buf`, waiting at most `timeout`; `Ok(None)` on
    /// timeout. With offload, its `virtio_net_hdr` goes in `hdr` (else `hdr`
    /// is all zeroes: a packet with its checksums complete).
    pub fn read_timeout(
        &self,
        hdr: &mut VnetHdr,
        buf: &mut [u8],
        timeout: Duration,
    ) -> io::Result<Option<usize>> {
        if !self.wait_readable(timeout)? {
            return Ok(None);
        }
        self.read(hdr, buf)
    }

    /// Waits at most `timeout` for a packet to read; whether one came.
    pub fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, ms) };
            if r >= 0 {
                return Ok(r > 0);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Reads one packet into `buf` without waiting; `Ok(None)` if there is
    /// none. `hdr` as for [`Tun::read_timeout`].
    pub fn read(&self, hdr: &mut VnetHdr, buf: &mut [u8]) -> io::Result<Option<usize>> {
        let part = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: `buf` is valid for writes of its length, borrowed mutably
        // for the call.
        unsafe { self.readv(hdr, &[part]) }
    }

    /// [`Tun::read`] straight into ring memory (a flow's send ring), with no
    /// copy of the packet; the bytes past the room's end go to `spill`, so
    /// the length read may exceed the room's (a packet too big for the
    /// flow is read whole all the same).
    pub fn read_segments(
        &self,
        hdr: &mut VnetHdr,
        room: &Segments,
        spill: &mut [u8],
    ) -> io::Result<Option<usize>> {
        let (parts, k) = iovecs(room);
        let mut all = [NO_IOVEC; 3];
        all[..k].copy_from_slice(&parts[..k]);
        all[k] = libc::iovec {
            iov_base: spill.as_mut_ptr().cast(),
            iov_len: spill.len(),
        };
        // SAFETY: a ring's segments are memory of its mapping, valid for
        // writes while the ring is reserved (see `Segments`); `spill` is
        // borrowed mutably for the call.
        unsafe { self.readv(hdr, &all[..=k]) }
    }

    /// The iovecs of a packet of `parts` (the first three), behind the
    /// virtio header at `hdr` if the TUN has one; how many there are.
    fn behind_header(&self, hdr: *mut u8, parts: &[libc::iovec]) -> ([libc::iovec; 4], usize) {
        let mut iov = [NO_IOVEC; 4];
        let mut k = 0;
        if self.vnet {
            iov[0] = libc::iovec {
                iov_base: hdr.cast(),
                iov_len: VnetHdr::LEN,
            };
            k = 1;
        }
        for p in parts.iter().take(3) {
            iov[k] = *p;
            k += 1;
        }
        (iov, k)
    }

    /// One `readv` of a packet into `parts`, behind the virtio header if the
    /// TUN has one.
    ///
    /// # Safety
    /// Each iovec must cover memory valid for writes of its length.
    unsafe fn readv(&self, hdr: &mut VnetHdr, parts: &[libc::iovec]) -> io::Result<Option<usize>> {
        let mut h = [0u8; VnetHdr::LEN];
        let (iov, k) = self.behind_header(h.as_mut_ptr(), parts);
        loop {
            // SAFETY: `h` is a local buffer; the rest the caller vouches for.
            let n = unsafe { libc::readv(self.fd.as_raw_fd(), iov.as_ptr(), k as libc::c_int) };
            if n >= 0 {
                let n = n as usize;
                if !self.vnet {
                    *hdr = VnetHdr::default();
                    return Ok(Some(n));
                }
                if n < VnetHdr::LEN {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("TUN read of {n} bytes is shorter than its virtio header"),
                    ));
                }
                *hdr = VnetHdr::decode(&h);
                return Ok(Some(n - VnetHdr::LEN));
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(None),
                _ => return Err(e),
            }
        }
    }

    /// Writes one packet; `hdr` says whether its checksum is partial, and
    /// must be all zeroes on a TUN without offload.
    pub fn write(&self, hdr: VnetHdr, pkt: &[u8]) -> io::Result<()> {
        let part = libc::iovec {
            iov_base: pkt.as_ptr() as *mut libc::c_void,
            iov_len: pkt.len(),
        };
        // SAFETY: `pkt` is valid for reads of its length.
        unsafe { self.writev(hdr, &[part]) }
    }

    /// [`Tun::write`] of a packet where it lies in ring memory (a flow's
    /// receive ring), with no copy.
    pub fn write_segments(&self, hdr: VnetHdr, pkt: &Segments) -> io::Result<()> {
        let (parts, k) = iovecs(pkt);
        // SAFETY: a ring's segments are memory of its mapping, valid for
        // reads while the record is held (see `Segments`).
        unsafe { self.writev(hdr, &parts[..k]) }
    }

    /// One `writev` of a packet made of `parts`, behind the virtio header
    /// if the TUN has one.
    ///
    /// # Safety
    /// Each iovec must cover memory valid for reads of its length.
    unsafe fn writev(&self, hdr: VnetHdr, parts: &[libc::iovec]) -> io::Result<()> {
        let h = hdr.encode();
        let (iov, k) = self.behind_header(h.as_ptr().cast_mut(), parts);
        loop {
            // SAFETY: `h` is a local buffer; the rest the caller vouches
            // for; writev does not write through them.
            let n = unsafe { libc::writev(self.fd.as_raw_fd(), iov.as_ptr(), k as libc::c_int) };
            if n >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// The kernel's announcements of one interface's changes (a netlink
/// route socket in the link group, non-blocking), so that the interface
/// set down is seen even when it is set up again at once, before anyone
/// looked at its flags.
#[derive(Debug)]
pub struct LinkWatch {
    fd: OwnedFd,
    ifindex: i32,
}

impl LinkWatch {
    /// Watches the interface `ifname`.
    pub fn open(ifname: &str) -> io::Result<LinkWatch> {
        use nix::sys::socket::{
            self, AddressFamily, NetlinkAddr, SockFlag, SockProtocol, SockType,
        };
        let ifindex = nix::net::if_::if_nametoindex(ifname)?;
        let fd = socket::socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRoute,
        )?;
        socket::bind(
            fd.as_raw_fd(),
            &NetlinkAddr::new(0, libc::RTMGRP_LINK as u32),
        )?;
        Ok(LinkWatch {
            fd,
            ifindex: ifindex as i32,
        })
    }

    /// Reads every announcement waiting: what they said of the interface
    /// (some lost to a full socket buffer count as a down and an MTU of 0,
    /// as they may have been).
    pub fn news(&self) -> LinkNews {
        let mut buf = [0u8; 8192];
        let mut news = LinkNews::default();
        loop {
            // SAFETY: buf is writable for its length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                news.add(link_news_in(&buf[..n as usize], self.ifindex));
                continue;
            }
            if n == 0 {
                return news;
            }
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ENOBUFS) => news.add(LinkNews {
                    down: true,
                    smallest_mtu: Some(0),
                }),
                _ => return news,
            }
        }
    }
}

/// What the kernel announced about an interface since the last look.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkNews {
    /// It was down (or deleted) at some point.
    pub down: bool,
    /// The smallest MTU it was announced with, if any was.
    pub smallest_mtu: Option<u32>,
}

impl LinkNews {
    fn add(&mut self, other: LinkNews) {
        self.down |= other.down;
        self.smallest_mtu = match (self.smallest_mtu, other.smallest_mtu) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

/// What the netlink messages in `b` say of interface `ifindex`: down
/// (`RTM_NEWLINK` without `IFF_UP`, or `RTM_DELLINK`), and the MTUs
/// (`IFLA_MTU`) of its `RTM_NEWLINK`s.
fn link_news_in(mut b: &[u8], ifindex: i32) -> LinkNews {
    // nlmsghdr: length u32, type u16, flags u16, seq u32, pid u32; then
    // ifinfomsg: family u8, pad u8, type u16, index i32, flags u32, change u32;
    // then attributes.
    const NLMSG_HDR: usize = 16;
    const IFINFO: usize = 16;
    let mut news = LinkNews::default();
    while b.len() >= NLMSG_HDR {
        let len = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
        if len < NLMSG_HDR || len > b.len() {
            break;
        }
        let kind = u16::from_ne_bytes([b[4], b[5]]);
        let body = &b[NLMSG_HDR..len];
        if (kind == libc::RTM_NEWLINK || kind == libc::RTM_DELLINK) && body.len() >= 12 {
            let index = i32::from_ne_bytes([body[4], body[5], body[6], body[7]]);
            let flags = u32::from_ne_bytes([body[8], body[9], body[10], body[11]]);
            if index == ifindex {
                news.down |= kind == libc::RTM_DELLINK || flags & libc::IFF_UP as u32 == 0;
                if kind == libc::RTM_NEWLINK {
                    let mtu = body.get(IFINFO..).and_then(mtu_attribute);
                    news.add(LinkNews {
                        down: false,
                        smallest_mtu: mtu,
                    });
                }
            }
        }
        // Messages are 4-byte aligned.
        b = &b[((len + 3) & !3).min(b.len())..];
    }
    news
}

/// The route attribute that holds an interface's MTU (`uapi/linux/if_link.h`).
const IFLA_MTU: u16 = 4;

/// The `IFLA_MTU` among the route attributes `attrs`, if there is one.
fn mtu_attribute(mut attrs: &[u8]) -> Option<u32> {
    // rtattr: length u16 (header included), type u16, value.
    while attrs.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([attrs[0], attrs[1]]));
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        if len < 4 || len > attrs.len() {
            return None;
        }
        if kind == IFLA_MTU && len >= 8 {
            return Some(u32::from_ne_bytes([attrs[4], attrs[5], attrs[6], attrs[7]]));
        }
        attrs = &attrs[((len + 3) & !3).min(attrs.len())..];
    }
    None
}

/// The iovecs of ring memory `seg` (at most two), and how many there are.
fn iovecs(seg: &Segments) -> ([libc::iovec; 2], usize) {
    let mut iov = [NO_IOVEC; 2];
    let mut k = 0;
    for (ptr, n) in seg.parts() {
        iov[k] = libc::iovec {
            iov_base: ptr.cast(),
            iov_len: n,
        };
        k += 1;
    }
    (iov, k)
}

const NO_IOVEC: libc::iovec = libc::iovec {
    iov_base: std::ptr::null_mut(),
    iov_len: 0,
};

/// Runs `ip ARGS...`, turning a failure into its error output.
fn ip_command(args: &[&str]) -> Result<(), TunError> {
    let cmd = format!("ip {}", args.join(" "));
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| TunError::Command {
            cmd: cmd.clone(),
            detail: format!("cannot run ip (is iproute2 installed?): {e}"),
        })?;
    if !out.status.success() {
        return Err(TunError::Command {
            cmd,
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A netlink message of `kind` about interface `index` with `flags`,
    /// and an `IFLA_MTU` of `mtu` if given (after another attribute).
    fn link_msg_mtu(kind: u16, index: i32, flags: u32, mtu: Option<u32>) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&32u32.to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(&[0, 0, 0, 0]);
        m.extend_from_slice(&index.to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&[0; 4]);
        if let Some(mtu) = mtu {
            // IFLA_IFNAME "rt0\0", then IFLA_MTU.
            m.extend_from_slice(&8u16.to_ne_bytes());
            m.extend_from_slice(&3u16.to_ne_bytes());
            m.extend_from_slice(b"rt0\0");
            m.extend_from_slice(&8u16.to_ne_bytes());
            m.extend_from_slice(&IFLA_MTU.to_ne_bytes());
            m.extend_from_slice(&mtu.to_ne_bytes());
            let len = m.len() as u32;
            m[..4].copy_from_slice(&len.to_ne_bytes());
        }
        m
    }

    fn link_msg(kind: u16, index: i32, flags: u32) -> Vec<u8> {
        link_msg_mtu(kind, index, flags, None)
    }

    fn link_down_in(b: &[u8], ifindex: i32) -> bool {
        link_news_in(b, ifindex).down
    }

    #[test]
    fn link_announcements_carry_the_smallest_mtu() {
        let up = libc::IFF_UP as u32;
        let mut m = link_msg_mtu(libc::RTM_NEWLINK, 7, up, Some(1200));
        m.extend(link_msg_mtu(libc::RTM_NEWLINK, 7, up, Some(1500)));
        m.extend(link_msg_mtu(libc::RTM_NEWLINK, 8, up, Some(100)));
        let news = link_news_in(&m, 7);
        assert_eq!(
            news,
            LinkNews {
                down: false,
                smallest_mtu: Some(1200)
            }
        );
        assert_eq!(
            link_news_in(&link_msg(libc::RTM_NEWLINK, 7, up), 7).smallest_mtu,
            None
        );
        // A cut attribute is no MTU, and no panic.
        let m = link_msg_mtu(libc::RTM_NEWLINK, 7, up, Some(1200));
        for cut in 0..m.len() {
            let mut c = m[..cut].to_vec();
            if c.len() >= 4 {
                let len = c.len() as u32;
                c[..4].copy_from_slice(&len.to_ne_bytes());
            }
            assert_ne!(link_news_in(&c, 7).smallest_mtu, Some(0));
        }
    }

    #[test]
    fn link_announcements_are_read_for_one_interface() {
        let up = libc::IFF_UP as u32;
        assert!(link_down_in(&link_msg(libc::RTM_NEWLINK, 7, 0), 7));
        assert!(!link_down_in(&link_msg(libc::RTM_NEWLINK, 7, up), 7));
        assert!(!link_down_in(&link_msg(libc::RTM_NEWLINK, 8, 0), 7));
        assert!(link_down_in(&link_msg(libc::RTM_DELLINK, 7, up), 7));
        // Down then up in one read: the down is not lost.
        let mut two = link_msg(libc::RTM_NEWLINK, 7, 0);
        two.extend(link_msg(libc::RTM_NEWLINK, 7, up));
        assert!(link_down_in(&two, 7));
        // Truncated or lying lengths end the walk without a panic.
        let m = link_msg(libc::RTM_NEWLINK, 7, 0);
        for cut in 0..m.len() {
            assert!(!link_down_in(&m[..cut], 7));
        }
        let mut bad = m.clone();
        bad[..4].copy_from_slice(&4u32.to_ne_bytes());
        assert!(!link_down_in(&bad, 7));
    }
}
