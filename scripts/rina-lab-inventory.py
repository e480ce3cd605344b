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
shim-eth on them. Lines starting with # are ignored.
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
    hosts = {}
    with open(a.hosts) as f:
        for n, line in enumerate(f, 1):
            w = line.split()
            if not w or w[0].startswith("#"):
                continue
            if len(w) < 2:
                sys.exit(f"{a.hosts}:{n}: want NODE SSH_ADDRESS [KEY=VALUE...]")
            kv = dict(x.split("=", 1) for x in w[2:] if "=" in x)
            hosts[w[0]] = (w[1], kv)
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
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1:])
