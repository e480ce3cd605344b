#!/usr/bin/env python3
"""Writes a rina-lab ssh inventory (docs/rina-lab.md, "The ssh backend")
for an experiment file and a testbed's host list.

    rina-lab-inventory.py EXPERIMENT.toml HOSTS [--user U] [--key FILE]
                          [--dir DIR] [--eth] > inventory.toml

HOSTS has one line per node: `NODE SSH_ADDRESS [KEY=VALUE...]`, keys:
`ip=ADDR` (the host's address for shim-udp links, when SSH_ADDRESS is a
name), `port=N`, `user=U`, and `LINK=IFACE` (with --eth: the interface of
this node on the link named LINK, `a--b` unless the file names it).
Without --eth every link is shim-udp between the hosts' `ip` (or
addresses); with --eth, links whose both ends give an interface are
shim-eth on them. Lines starting with # are ignored. A key that is
neither of the above nor a link of this node, a port that is not a
number, or (with --eth) a link with an interface on one end only is an
error: such a typo would otherwise leave the link on shim-udp.
"""
import argparse
import sys
import tomllib


def links_of(exp):
    out = []
    for l in exp.get("link", []):
        a, b = l["between"]
        out.append(l.get("name", f"{a}--{b}"))
    return out


def host_line(where, w, ends):
    """The SSH address and KEY=VALUE pairs of a host line's words `w`."""
    kv = {}
    for x in w[2:]:
        k, eq, v = x.partition("=")
        if not eq:
            sys.exit(f"{where}: `{x}` is not KEY=VALUE")
        if k == "port" and not v.isdigit():
            sys.exit(f"{where}: port `{v}` is not a number")
        if k not in ("ip", "port", "user"):
            if k not in ends:
                sys.exit(f"{where}: `{k}` is neither ip, port, user nor a link of the experiment "
                         "(a link is named a--b after its ends unless the file names it)")
            if w[0] not in ends[k]:
                sys.exit(f"{where}: link `{k}` is between {' and '.join(ends[k])}, not {w[0]}")
        kv[k] = v
    return (w[1], kv)


def q(s):
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("experiment")
    p.add_argument("hosts")
    p.add_argument("--user")
    p.add_argument("--key")
    p.add_argument("--dir")
    p.add_argument("--eth", action="store_true")
    a = p.parse_args(argv)
    with open(a.experiment, "rb") as f:
        exp = tomllib.load(f)
    nodes = exp.get("nodes", [])
    links = links_of(exp)
    ends = {l: link["between"] for l, link in zip(links, exp.get("link", []))}
    hosts = {}
    with open(a.hosts) as f:
        for n, line in enumerate(f, 1):
            w = line.split()
            if not w or w[0].startswith("#"):
                continue
            if len(w) < 2:
                sys.exit(f"{a.hosts}:{n}: want NODE SSH_ADDRESS [KEY=VALUE...]")
            hosts[w[0]] = host_line(f"{a.hosts}:{n}", w, ends)
    missing = [x for x in nodes if x not in hosts]
    if missing:
        sys.exit(f"no host for node(s): {', '.join(missing)}")
    unknown = [x for x in hosts if x not in nodes]
    if unknown:
        sys.exit(f"not nodes of the experiment: {', '.join(unknown)}")
    out = []
    for k in ("user", "key", "dir"):
        v = getattr(a, k)
        if v:
            out.append(f"{k} = {q(v)}")
    out.append("")
    for node in nodes:
        addr, kv = hosts[node]
        out += ["[[host]]", f"name = {q(node)}", f"address = {q(addr)}"]
        for k in ("ip", "user"):
            if k in kv:
                out.append(f"{k} = {q(kv[k])}")
        if "port" in kv:
            out.append(f"port = {int(kv['port'])}")
        out += [f"nodes = [{q(node)}]", ""]
    if a.eth:
        for l, link in zip(links, exp.get("link", [])):
            ea, eb = link["between"]
            ia, ib = hosts[ea][1].get(l), hosts[eb][1].get(l)
            if ia and ib:
                out += [f"[link.{q(l)}]", f"eth = {{ {q(ea)} = {q(ia)}, {q(eb)} = {q(ib)} }}", ""]
            elif ia or ib:
                sys.exit(f"link {l}: an interface for {ea if ia else eb} but none for "
                         f"{eb if ia else ea} (give both ends, or neither for shim-udp)")
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1:])
