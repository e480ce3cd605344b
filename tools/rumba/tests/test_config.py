"""The plugin's translation of Rumba's model (real Rumba objects, no
testbed, no root): each node's rinad file, checked by `rinad --check`; and
the translation of rlite's tool command lines."""

import os
import subprocess
import tempfile

import pytest

pytest.importorskip("rumba", reason="Rumba is not installed (pip install rumba)")

import tomllib  # noqa: E402

import rumba.testbeds.local as local  # noqa: E402

from conftest import bin_dir, model  # noqa: E402
from rumba_rina import Experiment, node_configs, translate_command  # noqa: E402


def experiment():
    nodes, difs = model()
    exp = Experiment(local.Testbed(exp_name="rumba-rina-config"), nodes=nodes)
    for ipcp in difs["e1"].ipcps:
        ipcp.ifname = "veth-" + ipcp.node.name  # what a testbed's swap-in sets
    return exp, difs


def test_each_node_gets_its_ipcps_neighbours_and_cubes():
    exp, _ = experiment()
    hosts = {"a": "127.0.0.1", "b": "127.0.0.1", "c": "127.0.0.1"}
    confs = {n: tomllib.loads(t) for n, t in node_configs(exp, udp_hosts=hosts).items()}

    def of(node, kind):
        return next(i for i in confs[node]["ipcp"] if i["type"] == kind)

    # Lower DIFs first: a normal IPCP comes after the shims it uses.
    assert sorted(i["type"] for i in confs["b"]["ipcp"][:2]) == ["shim-eth", "shim-udp"]
    assert confs["b"]["ipcp"][2]["type"] == "normal"
    a_eth = of("a", "shim-eth")
    assert a_eth == {"name": "e1.a", "type": "shim-eth", "dif": "e1", "interface": "veth-a", "untagged": True}
    # The shim-udp directory of b names c's normal IPCP at c's port, and
    # the other way round; each has a port of its own on the shared host.
    b_udp = of("b", "shim-udp")
    c_udp = of("c", "shim-udp")
    assert b_udp["directory"] == {"n1.c": c_udp["bind"]}
    assert c_udp["directory"] == {"n1.b": b_udp["bind"]}
    assert b_udp["bind"] != c_udp["bind"]
    # Exactly one bootstrapper: address 1, the DIF's cubes; the others enroll.
    normals = {n: of(n, "normal") for n in "abc"}
    boot = [n for n, i in normals.items() if i.get("address") == 1]
    assert len(boot) == 1, normals
    cubes = normals[boot[0]]["qos_cube"]
    assert cubes[0] == {"id": 1, "name": "unreliable", "delay_us": 50000}
    assert cubes[1] == {"id": 2, "name": "reliable", "reliable": True, "urgency": 1}
    for n, i in normals.items():
        if n != boot[0]:
            assert "address" not in i and "qos_cube" not in i
    # Neighbours over the lower DIF they share, both ways.
    nb = {n: sorted((x["name"], x["over"]) for x in i["neighbor"]) for n, i in normals.items()}
    assert nb == {
        "a": [("n1.b", "e1")],
        "b": [("n1.a", "e1"), ("n1.c", "u1")],
        "c": [("n1.b", "u1")],
    }


def test_rinad_accepts_every_file():
    exp, _ = experiment()
    rinad = os.path.join(bin_dir(), "rinad")
    with tempfile.TemporaryDirectory() as d:
        for name, text in node_configs(exp, udp_hosts=dict.fromkeys("abc", "127.0.0.1")).items():
            path = os.path.join(d, name + ".toml")
            with open(path, "w") as f:
                f.write(text)
            out = subprocess.run([rinad, "--config", path, "--check"], capture_output=True, text=True)
            assert out.returncode == 0, (name, text, out.stderr)


def test_rlite_tool_command_lines_become_ours():
    assert translate_command("rinaperf -l -z perf-srv -d n1") == "rina-perf server --name perf-srv --dif n1"
    assert (
        translate_command("rinaperf -t rr -s 64 -c 10 -z perf-srv", socket="/x/a.sock")
        == "rina-perf client --socket /x/a.sock --test rr --size 64 --count 10 --dst perf-srv"
    )
    assert translate_command("rina-echo-async -z e -c 3") == "rina-echo client --dst e --count 3"
    assert translate_command("rina-echo --dst e", socket="/s") == "rina-echo --socket /s --dst e"
    assert translate_command("sleep 3") == "sleep 3"
    with pytest.raises(Exception):
        translate_command("rinaperf -X")


def test_metro37_example_gives_37_valid_files():
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("metro37", os.path.join(here, "..", "examples", "metro37.py"))
    metro = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(metro)
    nodes, difs = metro.build()
    assert len(nodes) == 37
    exp = Experiment(local.Testbed(exp_name="rumba-rina-metro37"), nodes=nodes)
    for dif in exp.dif_ordering:
        for ipcp in dif.ipcps:
            if hasattr(ipcp, "ifname"):
                ipcp.ifname = "eth-" + dif.name
    confs = node_configs(exp, udp_hosts=dict.fromkeys((n.name for n in nodes), "127.0.0.1"))
    rinad = os.path.join(bin_dir(), "rinad")
    with tempfile.TemporaryDirectory() as d:
        for name, text in confs.items():
            path = os.path.join(d, name + ".toml")
            with open(path, "w") as f:
                f.write(text)
            out = subprocess.run([rinad, "--config", path, "--check"], capture_output=True, text=True)
            assert out.returncode == 0, (name, text, out.stderr)
    # The seed's cube mapping and scheduler reach the bootstrapper of spn.
    spn = [tomllib.loads(t) for t in confs.values()]
    spn = [i for c in spn for i in c["ipcp"] if i.get("dif") == "spn" and i.get("address") == 1]
    assert len(spn) == 1
    assert spn[0]["qos_cube"][0]["lower"] == {"mr": "A1"}
    assert spn[0]["scheduler"]["policy"] == "qta-mux"
