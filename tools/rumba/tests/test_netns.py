"""A Rumba experiment, written as for rlite, runs on rinad through the plugin.

Network namespaces stand in for hosts: a testbed defined here (Rumba's
testbed interface: ``_swap_in`` sets up the nodes and gives each shim-eth
IPCP its interface, as jFed and Emulab do) creates one namespace per node,
a veth pair per shim-eth DIF and a veth pair with IPv4 addresses per
shim-udp DIF, and its executor (Rumba's executor interface) runs each
node's commands in its namespace. Everything else is Rumba's own: the
model, the enrollment plan, ``swap_in``/``bootstrap_prototype``, the
storyboard with an rlite-style ``rinaperf`` server and client, and
``fetch_logs``.

Rumba's SSH executor against namespaces running sshd is test_ssh.py; the
real testbeds (jFed, Emulab) need their accounts (see docs/rumba.md).

Needs root (ip netns, raw sockets); skipped otherwise. CI runs as root.
"""

import os
import shutil
import tempfile

import pytest

rumba = pytest.importorskip("rumba", reason="Rumba is not installed (pip install rumba)")

from conftest import bin_dir, model  # noqa: E402
from netns_testbed import NetnsTestbed  # noqa: E402
from rumba_rina import Experiment  # noqa: E402

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)")

def test_a_rumba_storyboard_runs_rinaperf_over_a_normal_dif_on_rinad():
    # Imported here: the storyboard's process pool forks on import, and its
    # workers must know the executor (in conftest, loaded by then).
    import rumba.storyboard as sb

    exp = None
    work = tempfile.mkdtemp(prefix="rumba-rina-")
    testbed = NetnsTestbed(work)
    nodes, _ = model()
    a, _, c = nodes
    try:
        # The udp_hosts are known only once the testbed made the links:
        # the experiment reads them at bootstrap.
        exp = Experiment(
            testbed,
            nodes=nodes,
            bin_dir=bin_dir(),
            work_dir=os.path.join(work, "nodes"),
            per_node_socket=True,
            udp_hosts=testbed.udp_hosts,
            enroll_timeout=30,
        )
        exp.swap_in()
        exp.install_prototype()
        exp.bootstrap_prototype()

        # The storyboard as an rlite experiment writes it.
        client = sb.Client("rinaperf", options="-d n1 -z perf-srv -c 300 -s 400", nodes=[a])
        server = sb.Server(
            "rinaperf",
            arrival_rate=0.01,
            mean_duration=4,
            options="-l -d n1 -z perf-srv",
            nodes=[c],
            clients=[client],
        )
        story = sb.StoryBoard(duration=8, experiment=exp)
        story.add_server(server)
        story.generate_script(clean=True)
        story.schedule_action(
            story.run_client, args=[client, 5], kwargs={"node": a, "proc_id": "perf_a"}, c_time=2
        )
        story.start()
        logs = os.path.join(work, "logs")
        os.mkdir(logs)
        story.fetch_logs(logs)
        got = open(os.path.join(logs, "a", "perf_a.rumba.log")).read()
        served = open(os.path.join(logs, "c", "server_%s.rumba.log" % server.id)).read()
        assert "PERF" in got and "perf-srv" in got, got
        assert "registered perf-srv in n1" in served, served
        assert "flow request from" in served, served
    finally:
        if exp is not None:
            try:
                exp.terminate_prototype()
            except Exception:
                pass
        testbed._swap_out(None)
        for f in os.listdir("/tmp"):
            if f.endswith(".rumba.log") and f.startswith(("perf_a", "server_", "rinaperf_")):
                os.unlink(os.path.join("/tmp", f))
        shutil.rmtree(work, ignore_errors=True)
