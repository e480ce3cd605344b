"""A Rumba script runs on rinad through the plugin and Rumba's own SSH
executor (paramiko), against network namespaces that each run sshd — the
same stand-in for hosts as rina-lab's ssh backend test.

Each node's namespace has a management link to the test's namespace and
runs Debian's sshd on it with a key made for the test (offered by an
ssh-agent the test starts, so nothing under ~/.ssh is read or written);
the experiment links (a shim-eth and a shim-udp DIF) are veth pairs
between the namespaces. Rumba's SSH executor then runs every command of
the plugin (write the files, rinad --check, start rinad, rinactl, the
client) over SSH.

Needs root, sshd, ssh-keygen and ssh-agent; skipped otherwise.
"""

import os
import shutil
import subprocess
import tempfile
import time

import pytest

pytest.importorskip("rumba", reason="Rumba is not installed (pip install rumba)")

import rumba.model as mod  # noqa: E402
from rumba.executors.ssh import SSHExecutor  # noqa: E402

from conftest import bin_dir, model  # noqa: E402
from netns_testbed import NetnsTestbed, ns, sh  # noqa: E402
from rumba_rina import Experiment  # noqa: E402

SSHD = "/usr/sbin/sshd"
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces, sshd)"),
    pytest.mark.skipif(
        not (os.path.exists(SSHD) and shutil.which("ssh-keygen") and shutil.which("ssh-agent")),
        reason="needs openssh-server and openssh-client",
    ),
]


class SshNetnsTestbed(NetnsTestbed):
    """NetnsTestbed whose nodes are reached over SSH, like a real testbed's."""

    def __init__(self, workdir):
        NetnsTestbed.__init__(self, workdir)
        self.username = "root"
        self.executor = SSHExecutor(self)
        self.work = workdir
        self.sshd = []

    def _swap_in(self, experiment):
        NetnsTestbed._swap_in(self, experiment)
        key = os.path.join(self.work, "host_key")
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key)
        os.makedirs("/run/sshd", exist_ok=True)
        for k, node in enumerate(self.nodes):
            outer, inner = "%sm%d" % (ns(node)[:6], k), "%sn%d" % (ns(node)[:6], k)
            sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            sh("ip", "link", "set", inner, "netns", ns(node))
            sh("ip", "addr", "add", "10.78.%d.1/30" % k, "dev", outer)
            sh("ip", "link", "set", outer, "up")
            sh("ip", "-n", ns(node), "addr", "add", "10.78.%d.2/30" % k, "dev", inner)
            sh("ip", "-n", ns(node), "link", "set", inner, "up")
            conf = os.path.join(self.work, "sshd-%s.conf" % node.name)
            with open(conf, "w") as f:
                f.write(
                    "ListenAddress 10.78.%d.2\nHostKey %s\nAuthorizedKeysFile %s\n"
                    "PermitRootLogin yes\nPasswordAuthentication no\nStrictModes no\n"
                    "UsePAM no\nPidFile %s/sshd-%s.pid\n"
                    % (k, key, os.path.join(self.work, "authorized_keys"), self.work, node.name)
                )
            self.sshd.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", ns(node), SSHD, "-D", "-e", "-f", conf],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            node.ssh_config.hostname = "10.78.%d.2" % k
            node.ssh_config.set_username("root")

    def _swap_out(self, experiment):
        for p in self.sshd:
            # Its sessions first (they outlive the listener), by their ids.
            for pid in children(p.pid):
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
            p.kill()
            p.wait()
        NetnsTestbed._swap_out(self, experiment)
        for k in range(len(self.nodes)):
            subprocess.run(["ip", "link", "del", "%sm%d" % (ns(self.nodes[k])[:6], k)], capture_output=True)


def children(pid):
    """The ids of the processes whose parent is `pid`."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(d))
    return out


def wait_port(host, port=22, timeout=10.0):
    import socket

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    pytest.fail("sshd on %s did not listen" % host)


def test_a_rumba_script_runs_over_rumbas_ssh_executor_on_sshd_namespaces():
    work = tempfile.mkdtemp(prefix="rumba-rina-ssh-")
    agent_sock = os.path.join(work, "agent.sock")
    old_sock = os.environ.get("SSH_AUTH_SOCK")
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", agent_sock], stdout=subprocess.DEVNULL)
    testbed = SshNetnsTestbed(work)
    exp = None
    server_pid = None
    try:
        for _ in range(100):
            if os.path.exists(agent_sock):
                break
            time.sleep(0.05)
        os.environ["SSH_AUTH_SOCK"] = agent_sock
        user_key = os.path.join(work, "user_key")
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", user_key)
        shutil.copy(user_key + ".pub", os.path.join(work, "authorized_keys"))
        subprocess.run(["ssh-add", "-q", user_key], check=True, env=dict(os.environ))
        nodes, _ = model()
        a, _, c = nodes
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
        for n in nodes:
            wait_port(n.ssh_config.hostname)
        exp.install_prototype()
        exp.bootstrap_prototype()
        # The storyboard's way to start a server, then a client, over SSH.
        srv = exp.tool_command("rina-echo-async -l -d n1 -z ssh-echo", c)
        server_pid = c.execute_command("nohup %s > %s/echo.log 2>&1 < /dev/null & echo $!" % (srv, work))
        cli = exp.tool_command("rina-echo-async -d n1 -z ssh-echo -c 3", a)
        out = ""
        for _ in range(50):
            try:
                out = a.execute_command(cli)
                break
            except Exception:  # the server registers asynchronously
                time.sleep(0.2)
        assert "3" in out and "ssh-echo" in out, out
    finally:
        if exp is not None:
            try:
                exp.terminate_prototype()
            except Exception:
                pass
            for n in exp.nodes:
                if n.ssh_config.client is not None:
                    n.ssh_config.client.close()
        testbed._swap_out(None)
        agent.kill()
        agent.wait()
        if old_sock is None:
            os.environ.pop("SSH_AUTH_SOCK", None)
        else:
            os.environ["SSH_AUTH_SOCK"] = old_sock
        if server_pid:
            try:
                os.kill(int(server_pid), 15)
            except (OSError, ValueError):
                pass
        shutil.rmtree(work, ignore_errors=True)
