//! The checks made after parsing: what serde cannot see (the order IPCPs
//! stack in, addresses, identities, a shim-eth's interface, cubes and
//! their mapping onto lower cubes). Each error names the key and the IPCP.

use super::*;

/// The normal IPCPs of `all`, by index, in an order where the DIF each
/// neighbour is reached through has a member first: a shim, a normal IPCP
/// earlier in the order, or no IPCP of `all` at all. On a loop, the
/// `over` of a neighbour entry in it, its key, and the IPCPs of the loop.
pub(super) fn stacking_order(all: &[IpcpConfig]) -> Result<Vec<usize>, KeyError> {
    let mut left: Vec<usize> = (0..all.len())
        .filter(|&i| all[i].kind == IpcpKind::Normal)
        .collect();
    let mut order: Vec<usize> = Vec::new();
    // The first neighbour of IPCP `i` whose DIF has no member yet, and an
    // IPCP still waiting in that DIF.
    let blocked = |i: usize, order: &[usize]| -> Option<(usize, usize)> {
        all[i].neighbors.iter().enumerate().find_map(|(k, nb)| {
            let over = nb.over.get_ref();
            let ready = all.iter().all(|o| &o.dif != over)
                || all.iter().enumerate().any(|(j, o)| {
                    &o.dif == over && (o.kind != IpcpKind::Normal || order.contains(&j))
                });
            let waiting = (0..all.len()).find(|&j| &all[j].dif == over && j != i);
            (!ready).then_some((k, waiting?))
        })
    };
    while !left.is_empty() {
        match left.iter().position(|&i| blocked(i, &order).is_none()) {
            Some(p) => order.push(left.remove(p)),
            None => return Err(stacking_loop(all, left[0], |i| blocked(i, &order))),
        }
    }
    Ok(order)
}

/// The error of a stacking loop reached from normal IPCP `start`;
/// `blocked` says which neighbour of an IPCP waits for which IPCP.
pub(super) fn stacking_loop(
    all: &[IpcpConfig],
    start: usize,
    blocked: impl Fn(usize) -> Option<(usize, usize)>,
) -> KeyError {
    // Follow what each waits for until an IPCP comes back: the loop.
    let mut path: Vec<(usize, usize)> = Vec::new();
    let mut cur = start;
    let cycle = loop {
        if let Some(p) = path.iter().position(|&(i, _)| i == cur) {
            break &path[p..];
        }
        let Some((k, next)) = blocked(cur) else {
            break &path[..];
        };
        path.push((cur, k));
        cur = next;
    };
    let names: Vec<&str> = cycle
        .iter()
        .map(|&(i, _)| all[i].name.get_ref().as_str())
        .collect();
    let steps: Vec<String> = cycle
        .iter()
        .map(|&(i, k)| {
            let nb = &all[i].neighbors[k];
            format!(
                "{} reaches neighbour {} over DIF {:?}",
                all[i].name.get_ref(),
                nb.name,
                nb.over.get_ref()
            )
        })
        .collect();
    let (i, k) = cycle.first().copied().unwrap_or((start, 0));
    let span = all[i]
        .neighbors
        .get(k)
        .map_or_else(|| all[i].name.span(), |nb| nb.over.span());
    (
        span,
        format!("ipcp[{i}].neighbor[{k}].over"),
        format!(
            "normal IPCPs {} are stacked on each other in a loop: {}; no DIF of the loop can be created first",
            names.join(", "),
            steps.join(", ")
        ),
    )
}

/// Where a key is wrong, which key, and why.
pub(super) type KeyError = (std::ops::Range<usize>, String, String);

/// Checks IPCP `i` of a configuration whose IPCPs are `all` (for a
/// neighbour's `over` and a lower cube mapping); `runtime`: created at run
/// time, where a normal IPCP may wait for `rinactl ipcp enroll` with
/// neither an address nor a neighbour.
pub(super) fn check_ipcp(
    i: usize,
    ip: &IpcpConfig,
    all: &[IpcpConfig],
    runtime: bool,
) -> Result<(), KeyError> {
    let key = |k: &str| format!("ipcp[{i}].{k}");
    for (k, v) in [("name", ip.name.get_ref()), ("dif", &ip.dif)] {
        if v.is_empty() || v.len() > MAX_NAME_BYTES {
            let e = format!("must have 1 to {MAX_NAME_BYTES} bytes, not {}", v.len());
            return Err((ip.name.span(), key(k), e));
        }
    }
    if ip.kind == IpcpKind::ShimUdp && ip.bind.is_none() {
        return Err((
            ip.name.span(),
            key("bind"),
            "a shim-udp IPCP needs `bind = \"host:port\"`".into(),
        ));
    }
    check_bind(i, ip, all, runtime)?;
    if let Some(k) = &ip.keepalive_ms {
        let ms = *k.get_ref();
        if ip.kind != IpcpKind::ShimUdp {
            let e = "`keepalive_ms` is for shim-udp IPCPs".to_string();
            return Err((k.span(), key("keepalive_ms"), e));
        }
        if ms != 0 && !(MIN_KEEPALIVE_MS..=MAX_KEEPALIVE_MS).contains(&ms) {
            let e = format!(
                "must be 0 (off) or {MIN_KEEPALIVE_MS} to {MAX_KEEPALIVE_MS} (an hour), not {ms}"
            );
            return Err((k.span(), key("keepalive_ms"), e));
        }
    }
    check_counts(ip).map_err(|(span, k, m)| (span, key(k), m))?;
    let hv_keys = ip.path.is_some()
        || ip.side.is_some()
        || ip.vmpi_id.is_some()
        || ip.busy_poll.is_some()
        || ip.credit.is_some();
    if ip.kind == IpcpKind::ShimHv {
        if ip.path.is_none() || ip.side.is_none() {
            return Err((
                ip.name.span(),
                key("path/side"),
                "a shim-hv IPCP needs `path = \"/dev/shm/...\"` and `side = \"host\"` or `\"guest\"`".into(),
            ));
        }
        if ip.bind.is_some() || !ip.directory.is_empty() {
            return Err((
                ip.name.span(),
                key("bind/directory"),
                "`bind` and `directory` are for shim-udp IPCPs".into(),
            ));
        }
    } else if hv_keys {
        return Err((
            ip.name.span(),
            key("path/side/vmpi_id/busy_poll/credit"),
            "`path`, `side`, `vmpi_id`, `busy_poll` and `credit` are for shim-hv IPCPs".into(),
        ));
    }
    let eth_keys = ip.interface.is_some()
        || ip.vlan.is_some()
        || ip.untagged.is_some()
        || ip.tx_delay_us.is_some()
        || ip.tx_loss.is_some()
        || ip.tx_seed.is_some();
    if ip.kind == IpcpKind::ShimEth {
        check_shim_eth(ip).map_err(|(span, k, m)| (span, key(k), m))?;
    } else if eth_keys {
        return Err((
            ip.name.span(),
            key("interface/vlan/untagged/tx_*"),
            "`interface`, `vlan`, `untagged` and `tx_delay_us`/`tx_loss`/`tx_seed` are for shim-eth IPCPs".into(),
        ));
    }
    if ip.kind == IpcpKind::Normal {
        check_normal(i, ip, all, runtime)?;
    } else if ip.address.is_some()
        || ip.password.is_some()
        || ip.key.is_some()
        || !ip.trusted_keys.is_empty()
        || ip.encryption.is_some()
        || ip.rekey_bytes.is_some()
        || ip.rekey_seconds.is_some()
        || !ip.neighbors.is_empty()
        || !ip.names.is_empty()
        || ip.routing.is_some()
        || ip.directory_mode.is_some()
        || ip.rib_readable.is_some()
        || ip.access.is_some()
        || ip.cep_id_bytes.is_some()
    {
        return Err((
            ip.name.span(),
            key("address/password/neighbor/names/routing/directory_mode/access/cep_id_bytes"),
            "`address`, `password`, `neighbor`, `names`, `routing`, `directory_mode`, `access` and `cep_id_bytes` are for normal IPCPs".into(),
        ));
    }
    if ip.kind == IpcpKind::Normal && (ip.rate.is_some() || ip.rate_overhead.is_some()) {
        return Err((
            ip.name.span(),
            key("rate"),
            "`rate` and `rate_overhead` are the capacity of a shim's link; a normal IPCP paces its N-1 flows at the rate of the shim below".into(),
        ));
    }
    if let Some(r) = &ip.rate {
        let bps = r.get_ref().bps();
        if !(1e3..=1e12).contains(&bps) {
            return Err((
                r.span(),
                key("rate"),
                format!("must be between 1kbps and 1000Gbps, not {}", r.get_ref()),
            ));
        }
    }
    if ip.kind != IpcpKind::Normal && (ip.scheduler.is_some() || !ip.qos_cubes.is_empty()) {
        return Err((
            ip.name.span(),
            key("scheduler/qos_cube"),
            "`scheduler` and `qos_cube` are for normal IPCPs".into(),
        ));
    }
    if let Some(m) = &ip.max_sdu {
        // A normal IPCP delimits and fragments, up to its default (the
        // documented example's 65536); a shim-udp SDU fits a datagram.
        let max = match ip.kind {
            IpcpKind::Normal => rina_core::normal::DEFAULT_MAX_SDU as u32,
            _ => rina_core::shim_udp::DEFAULT_MAX_SDU,
        };
        if *m.get_ref() == 0 || *m.get_ref() > max {
            return Err((
                m.span(),
                format!("ipcp[{i}].max_sdu"),
                format!("must be between 1 and {max}, not {}", m.get_ref()),
            ));
        }
    }
    Ok(())
}

/// Refuses a shim-udp IPCP `ip` (number `i` of `all`) whose `bind` takes
/// the UDP port of another one: of an IPCP before it in the file, or of
/// any that runs (`runtime`: `all` are the running IPCPs). Port 0 (any
/// free port) takes none.
pub(super) fn check_bind(
    i: usize,
    ip: &IpcpConfig,
    all: &[IpcpConfig],
    runtime: bool,
) -> Result<(), KeyError> {
    let Some(b) = ip.bind.as_ref().filter(|_| ip.kind == IpcpKind::ShimUdp) else {
        return Ok(());
    };
    let mine = *b.get_ref();
    let clash = |o: &SocketAddr| {
        mine.port() != 0
            && o.port() == mine.port()
            && o.is_ipv4() == mine.is_ipv4()
            && (o.ip() == mine.ip() || o.ip().is_unspecified() || mine.ip().is_unspecified())
    };
    let others = if runtime {
        all
    } else {
        &all[..i.min(all.len())]
    };
    let other = others.iter().find(|o| {
        o.kind == IpcpKind::ShimUdp && o.bind.as_ref().is_some_and(|ob| clash(ob.get_ref()))
    });
    match other {
        Some(o) => Err((
            b.span(),
            format!("ipcp[{i}].bind"),
            format!(
                "{mine} takes the UDP port of shim-udp IPCP {} (bind = {}); two IPCPs cannot bind the same port",
                o.name.get_ref(),
                o.bind.as_ref().map_or(String::new(), |ob| ob.get_ref().to_string())
            ),
        )),
        None => Ok(()),
    }
}

/// Checks the counts that 0 (or a small number) would make useless: a
/// `max_flows` of 0 refuses every flow, a `rekey_bytes` below
/// [`MIN_REKEY_BYTES`] or a `rekey_seconds` of 0 agree new keys every few
/// PDUs. On error, where, which key and why.
pub(super) fn check_counts(
    ip: &IpcpConfig,
) -> Result<(), (std::ops::Range<usize>, &'static str, String)> {
    if let Some(m) = ip.max_flows.as_ref().filter(|m| *m.get_ref() == 0) {
        let why =
            "must be at least 1 (0 would refuse every flow); leave it out for the default".into();
        return Err((m.span(), "max_flows", why));
    }
    if let Some(b) = ip
        .rekey_bytes
        .as_ref()
        .filter(|b| *b.get_ref() < MIN_REKEY_BYTES)
    {
        let why = format!(
            "must be at least {MIN_REKEY_BYTES} (1 MiB), not {}: each new key costs a handshake",
            b.get_ref()
        );
        return Err((b.span(), "rekey_bytes", why));
    }
    if let Some(s) = ip
        .rekey_seconds
        .as_ref()
        .filter(|s| *s.get_ref() < MIN_REKEY_SECONDS)
    {
        let why = format!("must be at least {MIN_REKEY_SECONDS}, not {}", s.get_ref());
        return Err((s.span(), "rekey_seconds", why));
    }
    Ok(())
}

/// The checks of a normal IPCP's own keys (see [`check_ipcp`]).
pub(super) fn check_normal(
    i: usize,
    ip: &IpcpConfig,
    all: &[IpcpConfig],
    runtime: bool,
) -> Result<(), KeyError> {
    let key = |k: &str| format!("ipcp[{i}].{k}");
    if ip.address == Some(0) {
        return Err((
            ip.name.span(),
            key("address"),
            "addresses start at 1; leave `address` out to enroll".into(),
        ));
    }
    if ip.address.is_none() && ip.neighbors.is_empty() && !runtime {
        return Err((
            ip.name.span(),
            key("address"),
            "a normal IPCP needs `address = N` (a bootstrap member) or a `[[ipcp.neighbor]]` to enroll through".into(),
        ));
    }
    if ip.bind.is_some() || !ip.directory.is_empty() {
        return Err((
            ip.name.span(),
            key("bind/directory"),
            "`bind` and `directory` are for shim-udp IPCPs; a normal IPCP has `names` and `neighbor`".into(),
        ));
    }
    if let Some(w) = &ip.cep_id_bytes {
        if ![1, 2, 4, 8].contains(w.get_ref()) {
            return Err((
                w.span(),
                key("cep_id_bytes"),
                format!("must be 1, 2, 4 or 8, not {}", w.get_ref()),
            ));
        }
    }
    if let Some(m) = &ip.max_pdu {
        if !(64..=65_000).contains(m.get_ref()) {
            return Err((
                m.span(),
                key("max_pdu"),
                format!("must be between 64 and 65000, not {}", m.get_ref()),
            ));
        }
    }
    for (k, n) in ip.neighbors.iter().enumerate() {
        let over = n.over.get_ref();
        let found = all.iter().any(|o| &o.dif == over && o.dif != ip.dif);
        if !found {
            return Err((
                n.over.span(),
                format!("ipcp[{i}].neighbor[{k}].over"),
                format!("no other IPCP of this system is in DIF {over:?}"),
            ));
        }
    }
    if let Some(a) = &ip.access {
        a.get_ref()
            .rules()
            .map_err(|e| (a.span(), key("access"), e.to_string()))?;
    }
    for (k, p) in ip.rib_readable.iter().flatten().enumerate() {
        rina_core::rib::validate_name(p, &rina_core::rib::Config::default()).map_err(|e| {
            let m = format!("{e} (a subtree of the RIB, such as \"/ra\"; [] for none)");
            (ip.name.span(), key(&format!("rib_readable[{k}]")), m)
        })?;
    }
    check_identity(ip).map_err(|(k, m)| (ip.name.span(), key(&k), m))?;
    check_qos(ip).map_err(|(span, k, m)| (span, key(&k), m))?;
    check_lower_cubes(ip, all).map_err(|(span, k, m)| (span, key(&k), m))?;
    for dst in ip.routes.keys() {
        if dst.parse::<u64>().is_err() {
            return Err((
                ip.name.span(),
                key("routes"),
                format!("route destinations are addresses (numbers), not {dst:?}"),
            ));
        }
    }
    check_addresses(ip).map_err(|(span, k, m)| (span, key(&k), m))
}

/// Checks that every address normal IPCP `ip` names fits its DIF's
/// address fields: its own, its neighbours', its routes' destinations
/// and next hops, its static directory's.
pub(super) fn check_addresses(
    ip: &IpcpConfig,
) -> Result<(), (std::ops::Range<usize>, String, String)> {
    let at = |span: std::ops::Range<usize>, k: String, a: u64| {
        ip.check_address(a).map_err(|m| (span, k, m))
    };
    if let Some(a) = ip.address {
        at(ip.name.span(), "address".into(), a)?;
    }
    for (k, n) in ip.neighbors.iter().enumerate() {
        if let Some(a) = n.address {
            at(n.over.span(), format!("neighbor[{k}].address"), a)?;
        }
    }
    // Where every neighbour's address is written, a next hop must be one
    // of them (a route through anything else reaches nobody).
    let known: Option<Vec<u64>> = ip.neighbors.iter().map(|n| n.address).collect();
    for (dst, &hop) in &ip.routes {
        let k = format!("routes.{dst:?}");
        at(ip.name.span(), k.clone(), dst.parse().unwrap_or(0))?;
        at(ip.name.span(), k.clone(), hop)?;
        if let Some(known) = known.as_ref().filter(|k| !k.contains(&hop)) {
            let list: Vec<String> = known.iter().map(u64::to_string).collect();
            let m = format!(
                "next hop {hop} is not a neighbour's address (the neighbours': {})",
                if list.is_empty() {
                    "none".into()
                } else {
                    list.join(", ")
                }
            );
            return Err((ip.name.span(), k, m));
        }
    }
    for (app, &a) in &ip.names {
        at(ip.name.span(), format!("names.\"{app}\""), a)?;
    }
    Ok(())
}

/// Checks what a normal IPCP is known by: its name as an application
/// name, its enrollment key pair; on error, which key and why.
pub(super) fn check_identity(ip: &IpcpConfig) -> Result<(), (String, String)> {
    if let Err(e) = ip.name.get_ref().parse::<AppName>() {
        let m = format!("a normal IPCP's name is its application name in the DIFs below: {e}");
        return Err(("name".into(), m));
    }
    let is_key =
        |s: &str| rina_core::enrollment::auth::unhex(s.trim()).is_some_and(|v| v.len() == 32);
    let bad = "expected 32 bytes as 64 hex digits";
    if ip.key.as_deref().is_some_and(|k| !is_key(k)) {
        return Err(("key".into(), bad.into()));
    }
    if let Some(n) = ip.trusted_keys.iter().position(|k| !is_key(k)) {
        return Err((format!("trusted_keys[{n}]"), bad.into()));
    }
    if ip.key.is_none() && !ip.trusted_keys.is_empty() {
        return Err(("trusted_keys".into(), "`trusted_keys` needs `key`".into()));
    }
    Ok(())
}

/// Checks the keys of a shim-eth IPCP; on error, where, which key and why.
pub(super) fn check_shim_eth(
    ip: &IpcpConfig,
) -> Result<(), (std::ops::Range<usize>, &'static str, String)> {
    let name = ip.name.span();
    if ip.interface.as_deref().is_none_or(str::is_empty) {
        return Err((
            name,
            "interface",
            "a shim-eth IPCP needs `interface = \"eth0\"`".into(),
        ));
    }
    if let Some(d) = ip
        .tx_delay_us
        .as_ref()
        .filter(|d| *d.get_ref() > MAX_TX_DELAY_US)
    {
        return Err((
            d.span(),
            "tx_delay_us",
            format!(
                "must be at most {MAX_TX_DELAY_US} (1 s; frames wait out the delay in memory), not {}",
                d.get_ref()
            ),
        ));
    }
    if ip.tx_loss.is_some_and(|l| !(0.0..1.0).contains(&l)) {
        return Err((name, "tx_loss", "must be in [0, 1)".into()));
    }
    if ip.bind.is_some() || !ip.directory.is_empty() || ip.max_sdu.is_some() {
        return Err((
            name,
            "bind/directory/max_sdu",
            "a shim-eth IPCP resolves names with ARP and takes its max SDU from the interface MTU; `bind`, `directory` and `max_sdu` are for shim-udp".into(),
        ));
    }
    match (&ip.vlan, ip.untagged.unwrap_or(false)) {
        (Some(v), true) => Err((
            v.span(),
            "vlan",
            "`vlan` and `untagged = true` exclude each other".into(),
        )),
        (Some(v), false) if !(1..=4094).contains(v.get_ref()) => Err((
            v.span(),
            "vlan",
            format!("must be between 1 and 4094, not {}", v.get_ref()),
        )),
        (None, false) if ip.shim_eth_vlan().is_none() => Err((
            name,
            "vlan",
            format!(
                "a shim-eth IPCP needs `vlan = N` (1..4094), a DIF name that is a VLAN id (not {:?}), or `untagged = true`",
                ip.dif
            ),
        )),
        _ => Ok(()),
    }
}

/// Checks the QoS cubes and the scheduling policy of a normal IPCP (the
/// policy against the cubes' places in the C/U matrix); on error, where,
/// which key and why.
pub(super) fn check_qos(ip: &IpcpConfig) -> Result<(), (std::ops::Range<usize>, String, String)> {
    let mut ids = HashSet::new();
    let seq_bits = (ip.normal_config().dt.seq.bytes() * 8) as u32;
    for (k, c) in ip.qos_cubes.iter().enumerate() {
        let key = |f: &str| format!("qos_cube[{k}].{f}");
        let (span, c) = (c.span(), c.get_ref());
        if !ids.insert(c.id) {
            return Err((span, key("id"), format!("QoS-id {} is used twice", c.id)));
        }
        if c.name.is_empty() {
            return Err((span, key("name"), "must not be empty".into()));
        }
        if c.burst_bytes.is_some() && c.avg_bandwidth_bps.is_none() {
            return Err((span, key("burst_bytes"), "needs `avg_bandwidth_bps`".into()));
        }
        if c.jitter_us.is_some() && c.delay_us.is_none() {
            return Err((span, key("jitter_us"), "needs `delay_us`".into()));
        }
        if let Some(ms) = c.keepalive_ms {
            let d = std::time::Duration::from_millis(ms);
            rina_core::normal::keepalive::check_interval(d)
                .map_err(|m| (span.clone(), key("keepalive_ms"), m))?;
        }
        if let Err((k, m)) = c.efcp_config(seq_bits) {
            let span = c.efcp.as_ref().map_or(span, |e| e.span());
            return Err((span, key(&k), m));
        }
    }
    if let Some(s) = &ip.scheduler {
        if let Ok(v) = serde_json::to_value(s.get_ref()) {
            check_sched_bounds(&v).map_err(|m| (s.span(), "scheduler".to_string(), m))?;
        }
        let cu = rina_core::normal::cubes::cu_map(&ip.cubes());
        if let Err(e) = s.get_ref().build(&cu) {
            let SchedConfigError::BadParam { param, .. } = &e;
            return Err((s.span(), format!("scheduler.{param}"), e.to_string()));
        }
    }
    Ok(())
}

/// Checks the `lower` mapping of each QoS cube of normal IPCP `ip`: each DIF
/// named must be a normal DIF this IPCP has a neighbour over, and the cube
/// named must exist there when that DIF's cubes are known from this file
/// (its IPCP here is a bootstrap member or lists its cubes); otherwise the
/// daemon checks when it sets up the N-1 flows.
pub(super) fn check_lower_cubes(
    ip: &IpcpConfig,
    all: &[IpcpConfig],
) -> Result<(), (std::ops::Range<usize>, String, String)> {
    for (k, c) in ip.qos_cubes.iter().enumerate() {
        let (span, c) = (c.span(), c.get_ref());
        for (dif, r) in &c.lower {
            let key = format!("qos_cube[{k}].lower.{dif}");
            if !ip.neighbors.iter().any(|n| n.over.get_ref() == dif) {
                return Err((
                    span,
                    key,
                    format!(
                        "QoS cube {} maps to DIF {dif:?}, but no `[[ipcp.neighbor]]` of this IPCP is over it",
                        c.name
                    ),
                ));
            }
            let Some(lower) = all.iter().find(|o| &o.dif == dif && o.dif != ip.dif) else {
                continue;
            };
            if lower.kind != IpcpKind::Normal {
                return Err((
                    span,
                    key,
                    format!(
                        "QoS cube {} maps to a cube of DIF {dif:?}, a shim DIF without QoS cubes",
                        c.name
                    ),
                ));
            }
            if lower.address.is_none() && lower.qos_cubes.is_empty() {
                continue;
            }
            let cubes = lower.cubes();
            if r.find(&cubes).is_none() {
                return Err((
                    span,
                    key,
                    format!(
                        "QoS cube {} maps to cube {r} of DIF {dif:?}, which offers {}",
                        c.name,
                        rina_core::normal::cubes::cube_list(&cubes)
                    ),
                ));
            }
        }
    }
    Ok(())
}
