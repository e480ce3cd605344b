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

use super::route::Prefix;
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
    /// Creates (or attaches to) the TUN interface `name`.
    pub fn create(name: &str) -> Result<Tun, TunError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(TunError::Open)?;
        let fd: OwnedFd = file.into();
        let mut req = ifreq(name);
        req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
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
        Ok(Tun { fd, name: real })
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
    /// timeout.
    pub fn read_timeout(&self, buf: &mut [u8], timeout: Duration) -> io::Result<Option<usize>> {
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        loop {
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, ms) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if r == 0 {
                return Ok(None);
            }
            break;
        }
        loop {
            // SAFETY: `buf` is valid for `buf.len()` bytes of writes.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 0 {
                return Ok(Some(n as usize));
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(None),
                _ => return Err(e),
            }
        }
    }

    /// Writes one packet.
    pub fn write(&self, pkt: &[u8]) -> io::Result<()> {
        loop {
            // SAFETY: `pkt` is valid for `pkt.len()` bytes of reads.
            let n = unsafe { libc::write(self.fd.as_raw_fd(), pkt.as_ptr().cast(), pkt.len()) };
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
