"""The Rumba prototype plugin: Rumba's ``Experiment`` for rinad.

It follows the interface of Rumba 0.9's prototype plugins
(``rumba/prototypes/rlite.py``, ``irati.py``): a subclass of
``rumba.model.Experiment`` with ``_install_prototype``,
``_bootstrap_prototype``, ``_terminate_prototype`` and
``prototype_name``, which reaches the nodes only through Rumba's node
executors (``node.execute_command``, ``node.copy_file``), so it runs on
every Rumba testbed (jFed, Emulab, QEMU, Docker, local) and on any
testbed a script defines.
"""

import json
import shlex
import time

import rumba.log as log
import rumba.model as mod

from rumba_rina.config import _neighbors, node_configs
from rumba_rina.tools import translate_command

logger = log.get_logger(__name__)

#: The binaries the plugin installs or uses.
BINARIES = ["rinad", "rinactl", "rina-echo", "rina-perf", "rina-tgen"]


class Experiment(mod.Experiment):
    """An experiment on rinad (the userspace RINA stack in Rust)."""

    def __init__(
        self,
        testbed,
        nodes=None,
        git_repo=None,
        git_branch="main",
        enrollment_strategy="minimal",
        flows_strategy="full-mesh",
        local_bin_dir=None,
        bin_dir=None,
        work_dir="/tmp/rumba-rina",
        per_node_socket=False,
        udp_hosts=None,
        udp_base_port=7000,
        password=None,
        log_level="info",
        enroll_timeout=60.0,
        eth_mtu=1500,
    ):
        """
        :param testbed: the testbed (any Rumba testbed).
        :param nodes: the nodes.
        :param git_repo: the repository to build from on every node
                         (``cargo install --git``), if ``local_bin_dir`` is
                         not given.
        :param git_branch: its branch.
        :param enrollment_strategy: 'minimal', 'full-mesh' or 'manual'.
        :param flows_strategy: 'minimal', 'full-mesh' or 'manual'.
        :param local_bin_dir: a folder on this machine holding the
                              binaries (e.g. ``target/release``): copied to
                              every node's ``bin_dir`` (default
                              ``/usr/local/bin``) by ``install_prototype``.
        :param bin_dir: where the binaries are on the nodes (default: on
                        the PATH, or ``/usr/local/bin`` once copied).
        :param work_dir: per-node folder on the nodes for the
                         configuration, log, pid file (``work_dir/<node>``).
        :param per_node_socket: give every node's rinad its own control
                                socket in its folder, for nodes that share
                                a host or a file system (the local testbed,
                                network namespaces); otherwise rinad's
                                default path, where the tools look.
        :param udp_hosts: node name -> IP address of its shim-udp IPCPs
                          (default: the node's SSH host name).
        :param udp_base_port: first UDP port of the shim-udp IPCPs.
        :param password: enrollment password of every normal DIF.
        :param log_level: rinad's ``--log-level``.
        :param enroll_timeout: seconds to wait for the normal DIFs.
        :param eth_mtu: MTU of the testbed's Ethernet links (normal DIFs
                        over shim-eth DIFs size their PDUs to fit).
        """
        self.eth_mtu = eth_mtu
        self.local_bin_dir = local_bin_dir
        self.bin_dir = bin_dir or ("/usr/local/bin" if local_bin_dir else None)
        self.work_dir = work_dir
        self.per_node_socket = per_node_socket
        self.udp_hosts = udp_hosts
        self.udp_base_port = udp_base_port
        self.password = password
        self.log_level = log_level
        self.enroll_timeout = enroll_timeout
        mod.Experiment.__init__(
            self,
            testbed,
            nodes,
            git_repo,
            git_branch,
            prototype_logs=[],
            enrollment_strategy=enrollment_strategy,
            flows_strategy=flows_strategy,
            server_decorator=self._decorate_server,
        )

    # ---- where things are on a node --------------------------------------

    def prototype_name(self):
        return "rinad"

    def node_dir(self, node):
        """The node's folder for rinad's files."""
        return "%s/%s" % (self.work_dir, node.name)

    def socket(self, node):
        """The node's control socket, or None for rinad's default path."""
        return "%s/rinad.sock" % self.node_dir(node) if self.per_node_socket else None

    def binary(self, name):
        return "%s/%s" % (self.bin_dir, name) if self.bin_dir else name

    def rinactl(self, node, *args):
        """A rinactl command line for ``node``."""
        words = [self.binary("rinactl")]
        if self.socket(node):
            words += ["--socket", self.socket(node)]
        return " ".join(shlex.quote(w) for w in words + list(args))

    def tool_command(self, cmd, node):
        """A storyboard command line for rinad's tools on ``node``."""
        cmd = translate_command(cmd, self.socket(node))
        words = cmd.split(" ", 1)
        if self.bin_dir and words[0] in BINARIES:
            cmd = " ".join([self.binary(words[0])] + words[1:])
        return cmd

    # ---- Rumba's interface ---------------------------------------------

    def _install_prototype(self):
        if self.local_bin_dir:
            logger.info("copying %s to %s on all nodes", BINARIES, self.bin_dir)
            paths = ["%s/%s" % (self.local_bin_dir, b) for b in BINARIES]
            for node in self.nodes:
                node.execute_command("mkdir -p %s" % shlex.quote(self.bin_dir), as_root=True)
                node.copy_files(paths, self.bin_dir)
        elif self.git_repo:
            logger.info("building rinad from %s on all nodes", self.git_repo)
            cmd = (
                "cargo install --locked --root /usr/local --git %s --branch %s rinad rina-tools"
                % (shlex.quote(self.git_repo), shlex.quote(self.git_branch))
            )
            for node in self.nodes:
                node.execute_command(cmd, as_root=True, time_out=None)
        else:
            logger.info("no local_bin_dir or git_repo: using the binaries on the nodes")

    def _bootstrap_prototype(self):
        sockets = {n.name: self.socket(n) for n in self.nodes if self.socket(n)}
        configs = node_configs(
            self, self.udp_hosts, self.udp_base_port, self.password, sockets or None, self.eth_mtu
        )
        for node in self.nodes:
            self._start_rinad(node, configs[node.name])
        logger.info("rinad started on all nodes")
        self._wait_for_difs()
        logger.info("every normal DIF is up")

    def _start_rinad(self, node, config):
        d = shlex.quote(self.node_dir(node))
        conf = "%s/rinad.toml" % self.node_dir(node)
        # The file travels inside the command: every executor can run a
        # command, not every one can copy a file (the local one cannot).
        node.execute_command(
            "mkdir -p %s && printf '%%s' %s > %s" % (d, shlex.quote(config), shlex.quote(conf)),
            as_root=True,
        )
        node.execute_command("%s --config %s --check" % (self.binary("rinad"), conf), as_root=True)
        start = "nohup %s --config %s --log-level %s > %s/rinad.log 2>&1 < /dev/null & echo $! > %s/rinad.pid" % (
            self.binary("rinad"),
            shlex.quote(conf),
            shlex.quote(self.log_level),
            d,
            d,
        )
        node.execute_command(start, as_root=True)

    def _ipcps(self, node):
        """rinactl's IPCP listing of ``node``, or None if rinad does not answer."""
        try:
            out = node.execute_command(self.rinactl(node, "--json", "ipcps") + " 2>/dev/null || true")
            v = json.loads(out) if out else None
        except ValueError:
            return None
        # {"error": ...} when rinad does not answer yet.
        return v if isinstance(v, list) else None

    def _log_tail(self, node, lines=5):
        try:
            return node.execute_command(
                "tail -n %d %s/rinad.log 2>&1 || true" % (lines, shlex.quote(self.node_dir(node)))
            )
        except Exception as e:  # the node may be gone
            return str(e)

    def _wait_for_difs(self):
        """Waits until every normal IPCP has all the neighbours the model
        gives it (so it has enrolled)."""
        want = {}
        for node in self.nodes:
            for ipcp in node.ipcps:
                if isinstance(ipcp.dif, mod.NormalDIF):
                    want[(node.name, ipcp.name)] = len(_neighbors(self, ipcp))
        deadline = time.monotonic() + self.enroll_timeout
        while True:
            missing = []
            for node in self.nodes:
                listing = {i.get("name"): i for i in (self._ipcps(node) or [])}
                for (n, name), count in want.items():
                    if n != node.name:
                        continue
                    up = listing.get(name, {}).get("counters", {}).get("neighbors_up", 0)
                    if up < count:
                        missing.append("%s (%d of %d neighbours)" % (name, up, count))
            if not missing:
                return
            if time.monotonic() > deadline:
                logs = "".join("\n%s: %s" % (n.name, self._log_tail(n)) for n in self.nodes)
                raise Exception(
                    "normal DIFs not up after %s s: %s; rinad's logs:%s"
                    % (self.enroll_timeout, ", ".join(missing), logs)
                )
            time.sleep(0.5)

    def _terminate_prototype(self, force=False):
        for node in self.nodes:
            d = self.node_dir(node)
            node.execute_command(
                "if [ -f {d}/rinad.pid ]; then kill $(cat {d}/rinad.pid) 2>/dev/null; "
                "rm -f {d}/rinad.pid; fi; true".format(d=shlex.quote(d)),
                as_root=True,
            )

    def terminate_prototype(self, force=False):
        self._terminate_prototype(force)

    def destroy_dif(self, dif):
        raise NotImplementedError(
            "rinad's IPCPs come from its configuration file: to take DIF %s down, "
            "schedule a link down (schedule_link_down) or restart rinad without it" % dif.name
        )

    def export_dif_bandwidth(self, filename, dif):
        raise NotImplementedError(
            "per-DIF bandwidth export is not implemented for rinad; "
            "rinactl --json ipcps and rinactl rib show the counters"
        )

    # ---- storyboard ------------------------------------------------------

    def _decorate_server(self, server):
        """Rumba's server decorator: the server's and its clients' command
        lines become rinad's tools' on each node (add clients to the server
        before adding it to the storyboard)."""
        exp = self
        run_cmd = server._make_run_cmd

        def make_run_cmd(node):
            return _inline_startup(run_cmd(node), lambda c: exp.tool_command(c, node))

        server._make_run_cmd = make_run_cmd
        for client in server.clients:
            self._decorate_client(client)
        return server

    def _decorate_client(self, client):
        if getattr(client, "_rina_decorated", False):
            return
        client._rina_decorated = True
        exp = self
        process = client.process

        def make_process(duration, node=None, proc_id=None):
            p = process(duration, node, proc_id)
            p.startup = exp.tool_command(p.startup, p.node)
            run_cmd = p._make_run_cmd
            p._make_run_cmd = lambda: _inline_startup(run_cmd(), lambda c: c)
            return p

        client.process = make_process


def _inline_startup(cmd, rewrite):
    """Rumba's ``./startup.sh LOGNAME CMD...`` as the same shell line
    without the file (``rewrite`` applied to CMD): Rumba writes startup.sh
    on every node asynchronously and starts the servers at the same time,
    so a server could otherwise run before the file exists (or while it is
    being written). The log stays where Rumba's fetch_logs looks."""
    prefix = "./startup.sh "
    if not cmd.startswith(prefix):
        return rewrite(cmd)
    logname, _, rest = cmd[len(prefix):].partition(" ")
    return "nohup %s > /tmp/%s.rumba.log 2>&1 < /dev/null & echo $!" % (
        rewrite(rest),
        shlex.quote(logname),
    )
