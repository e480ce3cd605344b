//! IP prefixes and the longest-prefix-match table that picks the peer an IP
//! packet goes to.

use serde::{Serialize, Serializer};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
use thiserror::Error;

/// Why a string is not a prefix (`10.0.0.0/8`, `fd00::/64`) or an interface
/// address (`10.0.0.1/24`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PrefixError {
    /// No `/` separates the address from the length.
    #[error("{0:?} has no prefix length (write it as ADDRESS/LENGTH, e.g. 10.0.0.0/24)")]
    NoLength(String),
    /// The part before `/` is not an IPv4 or IPv6 address.
    #[error("{0:?} is not an IPv4 or IPv6 address")]
    BadAddress(String),
    /// The length is not a number, or longer than the address (32 or 128).
    #[error(
        "{0:?} is not a prefix length for this address family (0-32 for IPv4, 0-128 for IPv6)"
    )]
    BadLength(String),
    /// A route prefix has bits set after its length.
    #[error("{given} has bits set after the prefix length; did you mean {masked}?")]
    HostBits {
        /// What was written.
        given: String,
        /// The same prefix with the host bits cleared.
        masked: String,
    },
}

/// An address and a prefix length. As a route, the host bits are zero (see
/// [`Prefix::parse_route`]); as an interface address they are the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Prefix {
    /// The address.
    pub addr: IpAddr,
    /// Bits of the network part.
    pub len: u8,
}

impl Prefix {
    /// Parses `ADDRESS/LENGTH` (an interface address: host bits allowed).
    pub fn parse(s: &str) -> Result<Prefix, PrefixError> {
        let (a, l) = s
            .split_once('/')
            .ok_or_else(|| PrefixError::NoLength(s.to_owned()))?;
        let addr: IpAddr = a
            .trim()
            .parse()
            .map_err(|_| PrefixError::BadAddress(a.to_owned()))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len: u8 = l
            .trim()
            .parse()
            .ok()
            .filter(|&n| n <= max)
            .ok_or_else(|| PrefixError::BadLength(l.to_owned()))?;
        Ok(Prefix { addr, len })
    }

    /// Parses a route prefix: like [`Prefix::parse`], and the bits after the
    /// length must be zero.
    pub fn parse_route(s: &str) -> Result<Prefix, PrefixError> {
        let p = Prefix::parse(s)?;
        let m = p.network();
        if m != p {
            return Err(PrefixError::HostBits {
                given: s.to_owned(),
                masked: m.to_string(),
            });
        }
        Ok(p)
    }

    /// The prefix with its host bits cleared.
    pub fn network(&self) -> Prefix {
        let addr = match self.addr {
            IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask32(self.len))),
            IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask128(self.len))),
        };
        Prefix {
            addr,
            len: self.len,
        }
    }

    /// Whether `ip` is inside this prefix (never across address families).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(p), IpAddr::V4(a)) => {
                let m = mask32(self.len);
                u32::from(p) & m == u32::from(a) & m
            }
            (IpAddr::V6(p), IpAddr::V6(a)) => {
                let m = mask128(self.len);
                u128::from(p) & m == u128::from(a) & m
            }
            _ => false,
        }
    }

    /// Whether every address of `other` is inside this prefix.
    pub fn covers(&self, other: &Prefix) -> bool {
        self.len <= other.len && self.contains(other.addr)
    }
}

fn mask32(len: u8) -> u32 {
    u32::MAX
        .checked_shl(32 - u32::from(len.min(32)))
        .unwrap_or(0)
}

fn mask128(len: u8) -> u128 {
    u128::MAX
        .checked_shl(128 - u32::from(len.min(128)))
        .unwrap_or(0)
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl FromStr for Prefix {
    type Err = PrefixError;
    fn from_str(s: &str) -> Result<Prefix, PrefixError> {
        Prefix::parse(s)
    }
}

impl Serialize for Prefix {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Destination prefix -> peer index, searched longest prefix first.
///
/// A linear scan over prefixes sorted by decreasing length: a tunnel has a
/// handful of peers with a few prefixes each, for which this beats a trie.
#[derive(Debug, Clone, Default)]
pub struct RouteTable {
    entries: Vec<(Prefix, usize)>,
}

impl RouteTable {
    /// A table of `(prefix, peer)` entries. For equal prefixes the first
    /// entry wins.
    pub fn new(entries: impl IntoIterator<Item = (Prefix, usize)>) -> RouteTable {
        let mut entries: Vec<(Prefix, usize)> =
            entries.into_iter().map(|(p, i)| (p.network(), i)).collect();
        // Stable: equal lengths keep their order.
        entries.sort_by_key(|e| std::cmp::Reverse(e.0.len));
        RouteTable { entries }
    }

    /// The peer of the longest prefix holding `dst`.
    pub fn lookup(&self, dst: IpAddr) -> Option<usize> {
        self.entries
            .iter()
            .find(|(p, _)| p.contains(dst))
            .map(|&(_, i)| i)
    }

    /// Whether a packet from `src` may come from peer `peer`: the longest
    /// prefix holding `src` is one of that peer's, so a reply to it would
    /// go back to that peer (WireGuard's "allowed IPs"). A source no
    /// prefix holds, or one a longer prefix of another peer holds, may not.
    pub fn source_ok(&self, src: IpAddr, peer: usize) -> bool {
        self.lookup(src) == Some(peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn prefixes_parse_and_reject_with_reasons() {
        let p = Prefix::parse("10.1.2.3/24").unwrap();
        assert_eq!(p.network().to_string(), "10.1.2.0/24");
        assert_eq!(Prefix::parse("fd00::1/64").unwrap().len, 64);
        assert!(matches!(
            Prefix::parse("10.0.0.0"),
            Err(PrefixError::NoLength(_))
        ));
        assert!(matches!(
            Prefix::parse("10.0.0/8"),
            Err(PrefixError::BadAddress(_))
        ));
        assert!(matches!(
            Prefix::parse("10.0.0.0/33"),
            Err(PrefixError::BadLength(_))
        ));
        assert!(Prefix::parse("::/129").is_err());
        let e = Prefix::parse_route("10.1.2.3/24").unwrap_err();
        assert!(e.to_string().contains("10.1.2.0/24"), "{e}");
        assert!(Prefix::parse_route("0.0.0.0/0").is_ok());
        assert!(Prefix::parse_route("::/0").is_ok());
    }

    #[test]
    fn longest_prefix_wins_and_families_do_not_mix() {
        let t = RouteTable::new([
            (Prefix::parse("10.0.0.0/8").unwrap(), 0),
            (Prefix::parse("10.1.0.0/16").unwrap(), 1),
            (Prefix::parse("10.1.2.3/32").unwrap(), 2),
            (Prefix::parse("::/0").unwrap(), 3),
            (Prefix::parse("fd00::/64").unwrap(), 4),
        ]);
        assert_eq!(t.lookup(ip("10.9.9.9")), Some(0));
        assert_eq!(t.lookup(ip("10.1.9.9")), Some(1));
        assert_eq!(t.lookup(ip("10.1.2.3")), Some(2));
        assert_eq!(t.lookup(ip("11.0.0.1")), None);
        assert_eq!(t.lookup(ip("fd00::7")), Some(4));
        assert_eq!(t.lookup(ip("2001:db8::1")), Some(3));
    }

    #[test]
    fn a_source_is_allowed_only_from_the_peer_it_routes_back_to() {
        // Peer 0 has 10.0.0.0/8 and fd00::/16; peer 1 the /24 inside it.
        let t = RouteTable::new([
            (Prefix::parse("10.0.0.0/8").unwrap(), 0),
            (Prefix::parse("fd00::/16").unwrap(), 0),
            (Prefix::parse("10.1.2.0/24").unwrap(), 1),
        ]);
        // In its own prefix.
        assert!(t.source_ok(ip("10.9.9.9"), 0));
        assert!(t.source_ok(ip("fd00::9"), 0));
        assert!(t.source_ok(ip("10.1.2.3"), 1));
        // In its own prefix, but another peer's longer prefix holds it.
        assert!(!t.source_ok(ip("10.1.2.3"), 0));
        // Outside the peer's prefixes (another's, or no one's).
        assert!(!t.source_ok(ip("10.9.9.9"), 1));
        assert!(!t.source_ok(ip("fd00::9"), 1));
        assert!(!t.source_ok(ip("192.168.1.1"), 0));
        assert!(!t.source_ok(ip("2001:db8::1"), 0));
        assert!(!t.source_ok(ip("10.1.2.3"), 7), "no such peer");
    }

    #[test]
    fn covers_is_containment() {
        let a = Prefix::parse("10.0.0.0/8").unwrap();
        let b = Prefix::parse("10.2.0.0/16").unwrap();
        assert!(a.covers(&b) && !b.covers(&a));
        assert!(!a.covers(&Prefix::parse("fd00::/8").unwrap()));
    }
}
