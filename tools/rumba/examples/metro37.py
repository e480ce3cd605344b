#!/usr/bin/env python3
"""Seed 003's 37-node metro network (examples/lab/metro-37.toml) as a Rumba
experiment on rinad, on a jFed testbed (Fed4FIRE's Virtual Wall).

    pip install rumba ./tools/rumba
    python3 tools/rumba/examples/metro37.py --jfed-cert ~/jfed.pem \\
        --jfed-user USER --jfed-proj PROJECT --bin-dir target/release

It reads the lab file: one shim-eth DIF per `[[link]]`, one normal DIF per
`[[dif]]` with its members (groups expanded), its lower DIFs ("links" is
the node's links to other members), its QoS cubes with their cube mapping
(`maps_to`), and its RMT scheduler. Rumba's own enrollment plan decides the
adjacencies (full mesh of data-transfer flows over shared lower DIFs, so
the 15 PE-PE pairs of `adjacency` become all PE pairs over mr). The
traffic of the lab file is rina-lab's; here a storyboard runs a rina-perf
flow from each client to the video server as an example.

`build(path)` only builds the model: the plugin's test uses it to check
that all 37 rinad files are valid.
"""

import argparse
import os
import tomllib

import rumba.model as mod

LAB = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "lab", "metro-37.toml")


def _members(spec, groups):
    out = []
    for m in spec:
        out += groups[m[1:]] if m.startswith("@") else [m]
    return out


def build(path=LAB):
    """(nodes, normal DIFs by name) of the lab file, as Rumba's model."""
    with open(path, "rb") as f:
        lab = tomllib.load(f)
    groups = lab.get("groups", {})
    links = {}  # node -> [(peer, shim DIF)]
    for k, link in enumerate(lab["link"]):
        a, b = link["between"]
        dif = mod.ShimEthDIF("l%d" % k)
        links.setdefault(a, []).append((b, dif))
        links.setdefault(b, []).append((a, dif))
    difs = {}
    member_of = {}  # node -> [normal DIF]
    regs = {}  # node -> {normal DIF: [lower DIFs]}
    for d in lab["dif"]:
        dif = mod.NormalDIF(d["name"], add_default_qos_cubes=False)
        for cube in d.get("cube", []):
            kw = {k: v for k, v in cube.items() if k in ("urgency", "cherish", "reliable", "flow_control")}
            if "maps_to" in cube:
                kw["lower"] = cube["maps_to"]
            dif.add_qos_cube(cube["name"], **kw)
        sched = dict(d.get("scheduler", {}))
        if sched:
            dif.add_policy("rmt", sched.pop("policy"), **sched)
        difs[d["name"]] = dif
        members = _members(d["members"], groups)
        for node in members:
            member_of.setdefault(node, []).append(dif)
            lower = []
            for over in d["over"]:
                if over == "links":
                    lower += [s for peer, s in links.get(node, []) if peer in members]
                elif node in _members(next(x for x in lab["dif"] if x["name"] == over)["members"], groups):
                    lower.append(difs[over])
            regs.setdefault(node, {})[dif] = lower
    nodes = []
    for name in lab["nodes"]:
        shims = [s for _, s in links.get(name, [])]
        nodes.append(mod.Node(name, difs=shims + member_of.get(name, []), dif_registrations=regs.get(name, {})))
    return nodes, difs


def main():
    import rumba.storyboard as sb
    import rumba.testbeds.jfed as jfed

    from rumba_rina import Experiment

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jfed-cert", required=True)
    p.add_argument("--jfed-user", required=True)
    p.add_argument("--jfed-proj", required=True)
    p.add_argument("--bin-dir", help="local folder of rinad and the tools, copied to the nodes")
    p.add_argument("--duration", type=float, default=60)
    a = p.parse_args()
    nodes, difs = build()
    tb = jfed.Testbed(exp_name="metro37", username=a.jfed_user, cert_file=a.jfed_cert,
                      proj_name=a.jfed_proj, authority="wall2.ilabt.iminds.be")
    exp = Experiment(tb, nodes=nodes, local_bin_dir=a.bin_dir)
    by_name = {n.name: n for n in nodes}
    exp.swap_in()
    exp.install_prototype()
    exp.bootstrap_prototype()
    try:
        client = sb.Client("rina-perf", options="client --dif video --dst video-srv --duration-s 10",
                           nodes=[by_name[c] for c in ("c-2-1", "c-2-2", "c-0-2")])
        server = sb.Server("rina-perf", arrival_rate=0.2, mean_duration=10,
                           options="server --dif video --name video-srv", nodes=[by_name["s"]],
                           clients=[client])
        story = sb.StoryBoard(duration=a.duration, experiment=exp)
        story.add_server(server)
        story.start()
        story.fetch_logs()
    finally:
        exp.terminate_prototype()
        exp.swap_out()


if __name__ == "__main__":
    main()
