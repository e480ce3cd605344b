"""Real rinad daemons for the tests: `beta` serves, `alpha` knows beta's
names; both with one shim-udp IPCP in DIF "udp" on loopback. The tests'
own process talks to alpha (RINA_SOCKET); servers run as subprocesses
talking to beta."""

import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "python", "examples")
SERVER_NAMES = [
    "py-echo",
    "py-echo-async",
    "py-nobody",
    "py-slow",
    "py-slow-async",
    "py-many",
    "py-sig",
    "py-dropped",
    "py-backlog",
    "py-cancel-accept-before",
    "py-cancel-accept-during",
    "py-cancel-accept-after",
]


def rinad_path():
    env = os.environ.get("RINAD")
    if env:
        return env
    # Where cargo builds it, the newer profile first, as setup.py looks for
    # the library.
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    built = [os.path.join(target, profile, "rinad") for profile in ("release", "debug")]
    built = [p for p in built if os.path.isfile(p)]
    if built:
        return max(built, key=os.path.getmtime)
    pytest.fail(f"rinad not found in {target}: build it (cargo build -p rinad) or set RINAD")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, cond, timeout=10.0):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def answers(path):
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        try:
            s.connect(path)
            return True
        except OSError:
            return False


class Daemons:
    def __init__(self):
        self.rinad = rinad_path()
        self.dir = tempfile.mkdtemp(prefix="rina-py-")
        self.procs = []
        pa, pb = free_port(), free_port()
        try:
            self.beta = self._start("beta", pb, {})
            self.alpha = self._start("alpha", pa, {n: pb for n in SERVER_NAMES})
        except BaseException:
            # The fixture never hands this object out to be stopped.
            self.stop()
            raise

    def _start(self, name, port, directory):
        conf = os.path.join(self.dir, f"{name}.toml")
        with open(conf, "w") as f:
            f.write(
                f'[system]\nname = "{name}"\n[[ipcp]]\nname = "{name}.udp"\n'
                f'type = "shim-udp"\ndif = "udp"\nbind = "127.0.0.1:{port}"\n'
                "max_sdu = 1400\n[ipcp.directory]\n"
            )
            for n, p in directory.items():
                f.write(f'"{n}" = "127.0.0.1:{p}"\n')
        sock = os.path.join(self.dir, f"{name}.sock")
        log = open(os.path.join(self.dir, f"{name}.log"), "w")
        self.procs.append(
            subprocess.Popen(
                [self.rinad, "--config", conf, "--socket", sock],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        )
        wait_for(f"rinad {name} to answer", lambda: answers(sock))
        return sock

    def stop(self):
        for p in self.procs:
            p.kill()
            p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def daemons():
    d = Daemons()
    old = os.environ.get("RINA_SOCKET")
    os.environ["RINA_SOCKET"] = d.alpha
    yield d
    if old is None:
        os.environ.pop("RINA_SOCKET", None)
    else:
        os.environ["RINA_SOCKET"] = old
    d.stop()


class Server:
    """An example server script running against beta; its lines in a queue."""

    def __init__(self, daemons, script, name):
        env = dict(os.environ, RINA_SOCKET=daemons.beta)
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(EXAMPLES, script), name],
            env=env,
            cwd=daemons.dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # Ctrl-C as at a terminal: a shell that started these tests in
            # the background (`cmd &`, as CI may) left SIGINT ignored, and
            # the example would inherit that.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        first = self.line()
        if first != "ready":
            self.proc.kill()
            pytest.fail(f"{script} did not register: {first!r} {self.proc.stderr.read()}")

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def line(self, timeout=10.0):
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def stop(self):
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def server(daemons):
    started = []

    def start(script, name):
        s = Server(daemons, script, name)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()
