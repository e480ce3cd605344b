//! The mappings of `rina-gw` as its command line writes them:
//! `LISTEN=APP` (TCP to RINA) and `APP=ADDR` (RINA to TCP).

use rina::AppName;
use std::net::{SocketAddr, ToSocketAddrs};
use thiserror::Error;

/// TCP connections accepted on `listen` become flows to `app`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpToRina {
    /// Where to listen for TCP connections.
    pub listen: SocketAddr,
    /// The application each connection's flow goes to.
    pub app: AppName,
}

/// Flows allocated to `app` (registered here) become TCP connections to
/// `connect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RinaToTcp {
    /// The name registered.
    pub app: AppName,
    /// Where each flow's TCP connection goes.
    pub connect: SocketAddr,
}

/// Why a mapping was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MappingError {
    /// No `=` between the two sides.
    #[error("`{0}` has no `=` between its two sides")]
    NoEquals(String),
    /// The application name is not one.
    #[error("`{name}` is not an application name: {why}")]
    BadName {
        /// The text.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// The address is not `HOST:PORT`, or the host has no address.
    #[error("`{addr}` is not a TCP address (HOST:PORT): {why}")]
    BadAddress {
        /// The text.
        addr: String,
        /// What is wrong with it.
        why: String,
    },
}

fn name(s: &str) -> Result<AppName, MappingError> {
    let bad = |why: String| MappingError::BadName {
        name: s.into(),
        why,
    };
    let n: AppName = s.parse().map_err(|e: rina::NameError| bad(e.to_string()))?;
    n.check().map_err(|e| bad(e.to_string()))?;
    Ok(n)
}

/// `HOST:PORT`, the host resolved (its first address).
fn address(s: &str) -> Result<SocketAddr, MappingError> {
    let bad = |why: String| MappingError::BadAddress {
        addr: s.into(),
        why,
    };
    s.to_socket_addrs()
        .map_err(|e| bad(e.to_string()))?
        .next()
        .ok_or_else(|| bad("the host has no address".into()))
}

impl std::str::FromStr for TcpToRina {
    type Err = MappingError;

    /// `LISTEN=APP`: split at the first `=` (an address has none).
    fn from_str(s: &str) -> Result<Self, MappingError> {
        let (l, a) = s
            .split_once('=')
            .ok_or_else(|| MappingError::NoEquals(s.into()))?;
        Ok(TcpToRina {
            listen: address(l)?,
            app: name(a)?,
        })
    }
}

impl std::str::FromStr for RinaToTcp {
    type Err = MappingError;

    /// `APP=ADDR`: split at the last `=` (a name may hold one).
    fn from_str(s: &str) -> Result<Self, MappingError> {
        let (a, c) = s
            .rsplit_once('=')
            .ok_or_else(|| MappingError::NoEquals(s.into()))?;
        Ok(RinaToTcp {
            app: name(a)?,
            connect: address(c)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_kinds_parse_and_bad_ones_say_what_is_wrong() {
        let t: TcpToRina = "127.0.0.1:8080=web/1".parse().unwrap();
        assert_eq!(t.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(t.app.to_string(), "web/1");
        let r: RinaToTcp = "a=b=127.0.0.1:22".parse().unwrap();
        assert_eq!(r.app.process_name, "a=b");
        assert_eq!(r.connect.port(), 22);
        assert_eq!(
            "web".parse::<RinaToTcp>(),
            Err(MappingError::NoEquals("web".into()))
        );
        let e = "127.0.0.1=web".parse::<TcpToRina>().unwrap_err();
        assert!(matches!(e, MappingError::BadAddress { .. }), "{e}");
        let e = "127.0.0.1:1=".parse::<TcpToRina>().unwrap_err();
        assert!(matches!(e, MappingError::BadName { .. }), "{e}");
        let e = "a b=127.0.0.1:1".parse::<RinaToTcp>().unwrap_err();
        assert!(
            e.to_string().contains("`a b` is not an application name"),
            "{e}"
        );
        let e = "web=127.0.0.1:99999".parse::<RinaToTcp>().unwrap_err();
        assert!(matches!(e, MappingError::BadAddress { .. }), "{e}");
    }
}
