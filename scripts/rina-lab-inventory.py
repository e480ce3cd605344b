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
number in 1..65535, or (with --eth) a link with an interface on one end
only is an error: such a typo would otherwise leave the link on shim-udp.
So is a node given on two lines, or a key given twice on one line.
Errors are one line naming the file (and line or key), status 1.

Needs Python 3.11+ (tomllib), or an older Python 3 with the `tomli`
package (pip install tomli).
"""
import argparse
import sys

try:
    import tomllib
except ModuleNotFoundError:
    try:
        import tomli as tomllib
    except ModuleNotFoundError:
        sys.exit("rina-lab-inventory.py: needs Python 3.11+ (tomllib) or the `tomli` "
                 f"package (pip install tomli); this is Python {sys.version.split()[0]}")


def load_experiment(path):
    """The experiment file's node names and its links as (name, [a, b])."""
    try:
        with open(path, "rb") as f:
            exp = tomllib.load(f)
    except OSError as e:
        sys.exit(f"{path}: {e.strerror or e}")
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        sys.exit(f"{path}: not valid TOML: {e}")
    nodes = exp.get("nodes", [])
    if not isinstance(nodes, list) or not all(isinstance(x, str) for x in nodes):
        sys.exit(f"{path}: `nodes` must be a list of node names")
    raw = exp.get("link", [])
    if not isinstance(raw, list) or not all(isinstance(l, dict) for l in raw):
        sys.exit(f"{path}: `link` must be [[link]] tables")
    links = []
    for i, l in enumerate(raw, 1):
        where = f"{path}: [[link]] #{i}"
        if "between" not in l:
            sys.exit(f"{where}: no `between`")
        btw = l["between"]
        if not isinstance(btw, list) or len(btw) != 2 or not all(isinstance(x, str) for x in btw):
            sys.exit(f"{where}: `between` must name two nodes, not {btw!r}")
        for x in btw:
            if x not in nodes:
                sys.exit(f"{where}: `between` names `{x}`, not in `nodes`")
        name = l.get("name", f"{btw[0]}--{btw[1]}")
        if not isinstance(name, str):
            sys.exit(f"{where}: `name` must be a string")
        if any(name == m for m, _ in links):
            sys.exit(f"{where}: a second link named `{name}` (give one a `name`)")
        links.append((name, btw))
    return nodes, links


def host_line(where, w, ends):
    """The SSH address and KEY=VALUE pairs of a host line's words `w`."""
    kv = {}
    for x in w[2:]:
        k, eq, v = x.partition("=")
        if not eq:
            sys.exit(f"{where}: `{x}` is not KEY=VALUE")
        if k in kv:
            sys.exit(f"{where}: `{k}` given twice")
        if k == "port" and not v.isdigit():
            sys.exit(f"{where}: port `{v}` is not a number")
        if k == "port" and not 0 < int(v) < 65536:
            sys.exit(f"{where}: port {v} is not between 1 and 65535")
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
    nodes, links = load_experiment(a.experiment)
    ends = dict(links)
    hosts = {}
    first = {}
    try:
        with open(a.hosts, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        sys.exit(f"{a.hosts}: {e.strerror or e}")
    except UnicodeDecodeError as e:
        sys.exit(f"{a.hosts}: not UTF-8 text: {e}")
    for n, line in enumerate(lines, 1):
        w = line.split()
        if not w or w[0].startswith("#"):
            continue
        if len(w) < 2:
            sys.exit(f"{a.hosts}:{n}: want NODE SSH_ADDRESS [KEY=VALUE...]")
        if w[0] in first:
            sys.exit(f"{a.hosts}:{n}: node `{w[0]}` already given on line {first[w[0]]}")
        first[w[0]] = n
        hosts[w[0]] = host_line(f"{a.hosts}:{n}", w, ends)
    missing = [x for x in nodes if x not in hosts]
    if missing:
        sys.exit(f"{a.hosts}: no host for node(s): {', '.join(missing)}")
    unknown = [x for x in hosts if x not in nodes]
    if unknown:
        sys.exit(f"{a.hosts}: not nodes of {a.experiment}: {', '.join(unknown)}")
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
        for l, (ea, eb) in links:
            ia, ib = hosts[ea][1].get(l), hosts[eb][1].get(l)
            if ia and ib:
                out += [f"[link.{q(l)}]", f"eth = {{ {q(ea)} = {q(ia)}, {q(eb)} = {q(ib)} }}", ""]
            elif ia or ib:
                sys.exit(f"link {l}: an interface for {ea if ia else eb} but none for "
                         f"{eb if ia else ea} (give both ends, or neither for shim-udp)")
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1:])
