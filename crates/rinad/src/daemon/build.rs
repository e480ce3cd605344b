//! Building the daemon's [`System`] and its drivers from the configuration:
//! shims first, each with the socket or shared memory its driver needs,
//! then normal IPCPs in an order where the DIFs below each one exist.

use super::shim::UdpIo;
use super::*;
use crate::config::{IpcpConfig, IpcpKind};
use mio::net::UdpSocket;
use rina_core::normal::NormalConfig;
use rina_core::system::NeighborSpec;
use rina_core::{shim_udp, system::SystemError};

/// Receive buffer asked for on each UDP socket.
const UDP_RCVBUF: usize = 4 << 20;

fn sys_err(e: SystemError) -> DaemonError {
    DaemonError::Io {
        what: e.to_string(),
        source: io::Error::other("configuration"),
    }
}

/// The system of configuration `cfg` and the drivers of its members (same
/// order), registered with `poll`: shims first, then normal IPCPs in
/// stacking order ([`Config::creation_order`]).
pub(super) fn system(cfg: &Config, poll: &Poll) -> Result<(System, Vec<Ipcp>), DaemonError> {
    let mut sys = System::new(cfg.system.name.clone());
    let mut ipcps = Vec::new();
    for i in cfg.creation_order() {
        let ip = add_one(&mut sys, poll, &cfg.ipcps[i], &cfg.ipcps)?;
        ipcps.push(ip);
    }
    Ok((sys, ipcps))
}

/// Adds the IPCP of `ic` to `sys` (as its next member) with its driver,
/// registered with `poll`; `all` is every `[[ipcp]]` table of the system
/// (shim-eth IPCPs on one interface share it).
pub(super) fn add_one(
    sys: &mut System,
    poll: &Poll,
    ic: &IpcpConfig,
    all: &[IpcpConfig],
) -> Result<Ipcp, DaemonError> {
    let i = sys.members().len();
    let name = ic.name.get_ref().clone();
    let rate = ic.port_rate();
    let io = match ic.kind {
        IpcpKind::Normal => {
            add_normal(sys, ic)?;
            Io::Normal(Box::new(normal::NormalIo {
                sched: ic.scheduler_config(),
            }))
        }
        IpcpKind::ShimUdp => {
            let (sc, io) = udp_ipcp(ic, poll, i)?;
            sys.add_shim_udp(name.clone(), sc, rate).map_err(sys_err)?;
            io
        }
        IpcpKind::ShimEth => {
            let (ec, io) = shim_eth::new_ipcp(ic, all, poll, i)?;
            sys.add_shim_eth(name.clone(), ec, rate).map_err(sys_err)?;
            io
        }
        IpcpKind::ShimHv => {
            let (hc, io) = shim_hv::new_ipcp(ic)?;
            sys.add_shim_hv(name.clone(), hc, rate).map_err(sys_err)?;
            io
        }
    };
    Ok(Ipcp {
        name,
        dif: ic.dif.clone(),
        io,
        cfg: ic.clone(),
    })
}

/// A shim-udp IPCP's machine configuration and its socket, registered as
/// member `i`.
fn udp_ipcp(ic: &IpcpConfig, poll: &Poll, i: usize) -> Result<(shim_udp::Config, Io), DaemonError> {
    let bind = ic
        .bind
        .as_ref()
        .map_or_else(|| ([127, 0, 0, 1], 0).into(), |b| *b.get_ref());
    let mut sock = UdpSocket::bind(bind).map_err(|e| {
        // The usual cause: another rinad (or this one's configuration
        // started twice) holds the port.
        let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
            ", which another program holds (another rinad with this configuration? \
             `ss -ulpn` names it; or give this IPCP another `bind`)"
        } else {
            ""
        };
        io_ctx(format!(
            "IPCP {}: cannot bind UDP {bind}{hint}",
            ic.name.get_ref()
        ))(e)
    })?;
    let _ = nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::RcvBuf, &UDP_RCVBUF);
    poll.registry()
        .register(&mut sock, token(T_UDP, i), Interest::READABLE)
        .map_err(io_ctx("poll register"))?;
    let bound = sock.local_addr().unwrap_or(bind);
    let mut sc = shim_udp::Config::new(ic.dif.clone());
    if let Some(m) = &ic.max_sdu {
        sc.max_sdu = *m.get_ref();
    }
    sc.directory = ic.directory.clone().into_iter().collect();
    if let Some(m) = &ic.max_flows {
        sc.max_flows = *m.get_ref();
    }
    sc.peers_only = ic.peers_only.unwrap_or(false);
    sc.keepalive = ic.udp_keepalive();
    info!(ipcp = %ic.name.get_ref(), dif = %ic.dif, %bound, max_sdu = sc.max_sdu,
        directory = sc.directory.len(), "shim-udp IPCP up");
    Ok((sc, Io::Udp(Box::new(UdpIo::new(sock, bound)))))
}

/// Adds the normal IPCP of `ic` with its neighbours, static routes and
/// directory.
fn add_normal(sys: &mut System, ic: &IpcpConfig) -> Result<(), DaemonError> {
    let (app_name, nc) = normal_config(ic)?;
    let neighbors = ic
        .neighbors
        .iter()
        .filter(|nb| sys.member_in(nb.over.get_ref()).is_some())
        .map(|nb| NeighborSpec {
            name: nb.name.clone(),
            over: nb.over.get_ref().clone(),
            address: nb.address,
        })
        .collect();
    let routes = ic
        .routes
        .iter()
        .filter_map(|(d, &h)| d.parse().ok().map(|d| (d, h)))
        .collect();
    let j = sys
        .add_normal(app_name, nc, &ic.scheduler_config(), neighbors, routes)
        .map_err(|e| match e {
            SystemError::FrameTooLarge { .. } => DaemonError::Io {
                what: format!("{e}; lower its max_pdu"),
                source: io::Error::other("configuration"),
            },
            e => sys_err(e),
        })?;
    if let Some(n) = sys.member_mut(j).and_then(|m| m.normal_mut()) {
        for (app, &addr) in &ic.names {
            n.set_directory(app.clone(), addr);
        }
    }
    info!(ipcp = %ic.name.get_ref(), dif = %ic.dif, address = ic.address.unwrap_or(0), neighbors = ic.neighbors.len(),
        "normal IPCP up");
    Ok(())
}

/// The key-pair authentication policy of a normal IPCP, if configured.
fn auth_keys(
    ic: &crate::config::IpcpConfig,
) -> Result<Option<rina_core::enrollment::AuthKeys>, DaemonError> {
    let name = ic.name.get_ref();
    let bad = |what: &str| DaemonError::Io {
        what: format!("IPCP {name}: {what}"),
        source: io::Error::other("expected 32 bytes as 64 hex digits"),
    };
    let parse = |s: &str, what: &str| -> Result<[u8; 32], DaemonError> {
        rina_core::enrollment::auth::unhex(s.trim())
            .and_then(|v| <[u8; 32]>::try_from(v).ok())
            .ok_or_else(|| bad(what))
    };
    let Some(key) = &ic.key else {
        if !ic.trusted_keys.is_empty() {
            return Err(bad("`trusted_keys` needs `key`"));
        }
        return Ok(None);
    };
    let secret = parse(key, "bad `key`")?;
    let trusted = ic
        .trusted_keys
        .iter()
        .map(|k| parse(k, "bad entry in `trusted_keys`"))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(rina_core::enrollment::AuthKeys::new(secret, trusted)))
}

/// The name and machine configuration of the normal IPCP of `ic`.
fn normal_config(ic: &IpcpConfig) -> Result<(AppName, NormalConfig), DaemonError> {
    let name = ic.name.get_ref().clone();
    let app_name: AppName = name.parse().map_err(|e| DaemonError::Io {
        what: format!("IPCP {name}: its name is not a valid application name"),
        source: io::Error::other(format!("{e}")),
    })?;
    let mut nc = ic.normal_config();
    let mut membership = rina_core::normal::MembershipConfig::new(app_name.clone());
    membership.password = ic.password.clone();
    membership.keys = auth_keys(ic)?;
    if let Some(k) = &membership.keys {
        // What the other members list in `trusted_keys`.
        tracing::info!(
            ipcp = %name,
            public_key = %rina_core::enrollment::auth::hex(&k.public_key()),
            "enrollment key pair"
        );
    }
    if ic.encryption == Some(true) {
        let d = rina_core::sdup::aead::Rekey::default();
        membership.encryption = Some(rina_core::sdup::aead::Rekey {
            // Both at least their floor: checked with the file.
            bytes: ic.rekey_bytes.as_ref().map_or(d.bytes, |b| *b.get_ref()),
            after: ic
                .rekey_seconds
                .as_ref()
                .map_or(d.after, |s| std::time::Duration::from_secs(*s.get_ref())),
        });
    }
    let seed = crate::sys::random_seed().map_err(|source| DaemonError::Io {
        what: format!("IPCP {name}: no randomness for enrollment nonces"),
        source,
    })?;
    membership.entropy = seed;
    // CEP-ids from a random point: a daemon started again does not reuse
    // those of the flows its peers may still hold.
    let [a, b, c, d, ..] = crate::sys::random_seed().unwrap_or(seed);
    nc.first_cep = u64::from(u32::from_le_bytes([a, b, c, d]));
    nc.membership = Some(membership);
    Ok((app_name, nc))
}
