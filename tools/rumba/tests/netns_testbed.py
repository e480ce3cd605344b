"""The test testbed: network namespaces stand in for hosts (Rumba's
testbed and executor interfaces). A module of its own: the storyboard's
process pool, forked when rumba.storyboard is imported, unpickles the
executor by module name."""

import os
import shutil
import subprocess

import rumba.model as mod

TAG = "rr%d" % (os.getpid() % 10000)


def ns(node):
    return "%s-%s" % (TAG, node.name)


def sh(*cmd):
    subprocess.run(cmd, check=True, capture_output=True)


class NetnsExecutor(mod.Executor):
    """Runs a node's commands in its namespace, from its own folder under
    `workdir` (where the storyboard writes its startup.sh)."""

    def __init__(self, workdir):
        self.workdir = workdir

    def execute_command(self, node, command, as_root=False, time_out=3):
        # A home folder per node, as hosts have: the storyboard writes its
        # ./startup.sh on every node at once.
        home = os.path.join(self.workdir, "home", node.name)
        os.makedirs(home, exist_ok=True)
        out = subprocess.run(
            ["ip", "netns", "exec", ns(node), "sh", "-c", command],
            cwd=home,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if out.returncode != 0:
            raise Exception("%s: %r failed: %s" % (node.name, command, out.stderr))
        return out.stdout.rstrip()

    def copy_file(self, node, path, destination):
        shutil.copy(path, destination)

    def fetch_file(self, node, path, destination, sudo=False):
        shutil.copy(path, destination)


class NetnsTestbed(mod.Testbed):
    """One network namespace per node; a veth pair per two-member shim DIF."""

    def __init__(self, workdir):
        mod.Testbed.__init__(self, "rumba-rina-netns", "root", "", "rumba-rina")
        self.executor = NetnsExecutor(workdir)
        self.nodes = []
        self.udp_hosts = {}

    def _swap_in(self, experiment):
        self.nodes = list(experiment.nodes)
        for node in self.nodes:
            sh("ip", "netns", "add", ns(node))
            sh("ip", "-n", ns(node), "link", "set", "lo", "up")
        for k, dif in enumerate(experiment.dif_ordering):
            if isinstance(dif, mod.NormalDIF):
                continue
            members = sorted(dif.members, key=lambda n: n.name)
            assert len(members) == 2, "one link per shim DIF in this testbed"
            ends = ["%s%d%s" % (TAG, k, n.name) for n in members]
            sh("ip", "link", "add", ends[0], "type", "veth", "peer", "name", ends[1])
            for j, (node, end) in enumerate(zip(members, ends)):
                sh("ip", "link", "set", end, "netns", ns(node))
                if isinstance(dif, mod.ShimUDPDIF):
                    addr = "10.%d.%d.%d" % (77, k, j + 1)
                    sh("ip", "-n", ns(node), "addr", "add", addr + "/24", "dev", end)
                    self.udp_hosts[node.name] = addr
                sh("ip", "-n", ns(node), "link", "set", end, "up")
                if isinstance(dif, mod.ShimEthDIF):
                    node.get_ipcp_by_dif(dif).ifname = end

    def _swap_out(self, experiment):
        for node in self.nodes:
            subprocess.run(["ip", "netns", "del", ns(node)], capture_output=True)
