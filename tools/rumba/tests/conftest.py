"""Shared helpers of the plugin's tests: the Rumba model of the test
network and where rinad's binaries are."""

import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def bin_dir():
    """The folder of rinad and the tools (RINAD's folder, else target/)."""
    env = os.environ.get("RINAD")
    if env:
        return os.path.dirname(os.path.abspath(env))
    for profile in ("debug", "release"):
        d = os.path.join(REPO, "target", profile)
        if os.path.exists(os.path.join(d, "rinad")):
            return d
    pytest.fail("rinad not found: build it (cargo build -p rinad -p rina-tools) or set RINAD")


def model():
    """Three nodes in a line: a --e1 (Ethernet)-- b --u1 (UDP)-- c, and a
    normal DIF n1 over both with two QoS cubes. Returns (nodes, DIFs)."""
    import rumba.model as mod

    e1 = mod.ShimEthDIF("e1")
    u1 = mod.ShimUDPDIF("u1")
    n1 = mod.NormalDIF("n1")
    n1.add_qos_cube("unreliable", delay=50)
    n1.add_qos_cube("reliable", reliable=True, ordered=True, urgency=1)
    a = mod.Node("a", difs=[e1, n1], dif_registrations={n1: [e1]})
    b = mod.Node("b", difs=[e1, u1, n1], dif_registrations={n1: [e1, u1]})
    c = mod.Node("c", difs=[u1, n1], dif_registrations={n1: [u1]})
    return [a, b, c], {"e1": e1, "u1": u1, "n1": n1}
