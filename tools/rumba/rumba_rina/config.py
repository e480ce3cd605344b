"""Rumba's model of an experiment, as one rinad configuration per node.

Pure functions of the model: no IO, so they are tested without a testbed.

How the model maps onto rinad (README "Using it"):

* a ``ShimUDPDIF`` member is a ``shim-udp`` IPCP bound to the node's address
  (``udp_hosts`` or the node's SSH host name) and a port of its own
  (``udp_base_port`` + its rank among all shim-udp IPCPs of the experiment,
  so several nodes may share one host); its directory holds the names of
  the IPCPs of the other members registered in that DIF;
* a ``ShimEthDIF`` member is a ``shim-eth`` IPCP on the interface the
  testbed gave (``ipcp.ifname``), tagged with the DIF name as VLAN id when
  that name is a number from 1 to 4094, untagged otherwise (testbeds such as
  jFed and Emulab give each link its own interface or VLAN already);
* a ``NormalDIF`` member is a ``normal`` IPCP. The DIF's bootstrapper (the
  member Rumba's enrollment plan makes nobody's enrollee) gets address 1 and
  the DIF's policies; every other member enrolls (no address), through the
  neighbours Rumba's enrollments and data-transfer flows give it. The
  bootstrapper carries the QoS cubes; enrollees learn them when they enroll.
"""

import json
import socket

import rumba.model as mod


class ConfigError(Exception):
    """The model asks for something rinad cannot do (the message says what)."""


#: Rumba QoS-cube keywords (IRATI's and rlite's) and rinad's own, as rinad's.
#: ``delay`` is in milliseconds and ``loss`` in 1/10000 as in IRATI's
#: templates; rinad's own keys pass unchanged.
_CUBE_KEYS = {
    "reliable": ("reliable", lambda v: bool(v)),
    "ordered": None,  # in-order delivery comes with `reliable` in rinad
    "delay": ("delay_us", lambda v: int(v) * 1000),
    "loss": ("loss_ppm", lambda v: int(v) * 100),
    "flow_control": ("flow_control", lambda v: bool(v)),
    "urgency": ("urgency", int),
    "cherish": ("cherish", int),
    "avg_bandwidth_bps": ("avg_bandwidth_bps", int),
    "average_bandwidth": ("avg_bandwidth_bps", int),
    "burst_bytes": ("burst_bytes", int),
    "delay_us": ("delay_us", int),
    "jitter_us": ("jitter_us", int),
    "loss_ppm": ("loss_ppm", int),
    # The cube of each lower DIF that carries this one: {"mr": "A1"}.
    "lower": ("lower", dict),
    # IRATI-only EFCP knobs with no rinad counterpart: ignored.
    "initial_credit": None,
    "data_rxms_nmax": None,
    "initial_rtx_time": None,
}


def _s(value):
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(str(value))


def _v(value):
    """A TOML value: booleans, numbers, strings, arrays, inline tables."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return _s(value)
    if isinstance(value, (list, tuple)):
        return "[%s]" % ", ".join(_v(x) for x in value)
    if isinstance(value, dict):
        return "{ %s }" % ", ".join("%s = %s" % (_s(k), _v(x)) for k, x in value.items())
    raise ConfigError("no TOML for %r" % (value,))


def _kind(dif):
    if isinstance(dif, mod.ShimUDPDIF):
        return "shim-udp"
    if isinstance(dif, mod.ShimEthDIF):
        return "shim-eth"
    if isinstance(dif, mod.NormalDIF):
        return "normal"
    raise ConfigError("DIF %s: rinad has no IPCP for a %s" % (dif.name, type(dif).__name__))


def _udp_host(node, udp_hosts):
    host = (udp_hosts or {}).get(node.name) or node.ssh_config.hostname
    try:
        return socket.gethostbyname(host)
    except OSError as e:
        raise ConfigError("node %s: address %r of its shim-udp IPCPs: %s" % (node.name, host, e))


def udp_addresses(experiment, udp_hosts=None, base_port=7000):
    """``{(dif name, node name): "ip:port"}`` for every shim-udp IPCP."""
    out = {}
    for dif in experiment.dif_ordering:
        if not isinstance(dif, mod.ShimUDPDIF):
            continue
        for node in sorted(dif.members, key=lambda n: n.name):
            host = _udp_host(node, udp_hosts)
            out[(dif.name, node.name)] = "%s:%d" % (host, base_port + len(out))
    return out


def _neighbors(experiment, ipcp):
    """``[(peer ipcp, lower DIF name)]`` of a normal IPCP, from Rumba's
    enrollments and data-transfer flows (both directions)."""
    pairs = []
    for el in experiment.enrollments:
        for e in el:
            if e["dif"] != ipcp.dif:
                continue
            for me, peer in ((e["enrollee"], e["enroller"]), (e["enroller"], e["enrollee"])):
                if me == ipcp:
                    pairs.append((peer, e["lower_dif"].name))
    for fl in experiment.flows:
        for f in fl:
            if f["src"].dif != ipcp.dif:
                continue
            for me, peer in ((f["src"], f["dst"]), (f["dst"], f["src"])):
                if me != ipcp or any(p == peer for p, _ in pairs):
                    continue
                common = [d for d in me.registrations if d in peer.registrations]
                if not common:
                    raise ConfigError(
                        "%s and %s share no lower DIF for their flow" % (me.name, peer.name)
                    )
                pairs.append((peer, common[0].name))
    seen, out = set(), []
    for peer, lower in pairs:
        if (peer.name, lower) not in seen:
            seen.add((peer.name, lower))
            out.append((peer, lower))
    return out


def _cube_lines(cube):
    lines = ["[[ipcp.qos_cube]]", "id = %d" % cube["cube_id"], "name = %s" % _s(cube["name"])]
    for key, value in sorted(cube.items()):
        if key in ("cube_id", "name"):
            continue
        if key not in _CUBE_KEYS:
            raise ConfigError("QoS cube %s: rinad has no parameter %r" % (cube["name"], key))
        conv = _CUBE_KEYS[key]
        if conv is None:
            continue
        name, f = conv
        lines.append("%s = %s" % (name, _v(f(value))))
    return lines


def _policy_lines(dif):
    """The DIF's policies rinad knows: ``rmt`` scheduling (its policy name is
    rinad's: fifo, token-bucket, qta-mux, rate-limit-2d, diffserv, with
    rinad's parameters), ``routing`` and ``directory``; others are refused."""
    lines = []
    for comp, pols in dif.policy.get_policies().items():
        for pol, params in pols.items():
            if comp == "rmt":
                lines.append("[ipcp.scheduler]")
                lines.append("policy = %s" % _s(pol))
                for k, v in sorted(params.items()):
                    lines.append("%s = %s" % (k, _v(v)))
            elif comp in ("routing", "directory"):
                continue  # always link-state routing and a distributed directory
            else:
                raise ConfigError(
                    "DIF %s: rinad has no policy %s for component %s" % (dif.name, pol, comp)
                )
    return lines


def _max_pdu(dif, eth_mtu):
    """The DIF's max PDU when some member is over a shim-eth DIF (its
    frames, a TTL byte more, must fit one Ethernet frame with its 802.1Q
    tag), else None (rinad's default). The same on every member: it is part
    of the DIF's wire profile."""
    over_eth = any(isinstance(d, mod.ShimEthDIF) for i in dif.ipcps for d in i.registrations)
    return eth_mtu - 5 if over_eth else None


def _normal_lines(experiment, ipcp, password, eth_mtu):
    dif = ipcp.dif
    lines = ["type = \"normal\"", "dif = %s" % _s(dif.name)]
    max_pdu = _max_pdu(dif, eth_mtu)
    if max_pdu is not None:
        lines.append("max_pdu = %d" % max_pdu)
    if ipcp.dif_bootstrapper:
        lines += ["address = 1", 'routing = "link-state"', 'directory_mode = "distributed"']
    if password:
        lines.append("password = %s" % _s(password))
    for peer, lower in _neighbors(experiment, ipcp):
        lines += ["[[ipcp.neighbor]]", "name = %s" % _s(peer.name), "over = %s" % _s(lower)]
    if ipcp.dif_bootstrapper:
        for cube in dif.qos_cubes:
            lines += _cube_lines(cube)
        lines += _policy_lines(dif)
    return lines


def _shim_udp_lines(experiment, ipcp, addrs):
    dif = ipcp.dif
    lines = [
        'type = "shim-udp"',
        "dif = %s" % _s(dif.name),
        "bind = %s" % _s(addrs[(dif.name, ipcp.node.name)]),
        "[ipcp.directory]",
    ]
    for node in sorted(dif.members, key=lambda n: n.name):
        if node == ipcp.node:
            continue
        for upper in node.ipcps:
            if dif in upper.registrations:
                lines.append("%s = %s" % (_s(upper.name), _s(addrs[(dif.name, node.name)])))
    return lines


def _shim_eth_lines(ipcp):
    dif = ipcp.dif
    if not getattr(ipcp, "ifname", None):
        raise ConfigError(
            "%s: the testbed gave no interface for shim-eth DIF %s" % (ipcp.name, dif.name)
        )
    lines = ['type = "shim-eth"', "dif = %s" % _s(dif.name), "interface = %s" % _s(ipcp.ifname)]
    if not (dif.name.isdigit() and 1 <= int(dif.name) <= 4094):
        lines.append("untagged = true")
    return lines


def node_configs(
    experiment, udp_hosts=None, udp_base_port=7000, password=None, sockets=None, eth_mtu=1500
):
    """One rinad TOML text per node name, from a generated Rumba experiment.

    ``eth_mtu`` is the MTU of the testbed's Ethernet links.

    ``sockets`` maps node names to control-socket paths written into the
    files (default: none, rinad's default path)."""
    addrs = udp_addresses(experiment, udp_hosts, udp_base_port)
    out = {}
    for node in experiment.nodes:
        lines = ["[system]", "name = %s" % _s(node.name)]
        if sockets and node.name in sockets:
            lines.append("socket = %s" % _s(sockets[node.name]))
        for ipcp in node.ipcps:
            kind = _kind(ipcp.dif)
            lines += ["", "[[ipcp]]", "name = %s" % _s(ipcp.name)]
            if kind == "shim-udp":
                lines += _shim_udp_lines(experiment, ipcp, addrs)
            elif kind == "shim-eth":
                lines += _shim_eth_lines(ipcp)
            else:
                lines += _normal_lines(experiment, ipcp, password, eth_mtu)
        out[node.name] = "\n".join(lines) + "\n"
    return out
