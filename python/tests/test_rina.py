"""The Python package against real daemons (see conftest.py)."""

import asyncio
import concurrent.futures
import errno
import math
import os
import queue
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import rina
from conftest import EXAMPLES, wait_for


def test_blocking_flow_echoes_and_carries_the_qos_spec(server):
    srv = server("echo_server.py", "py-echo")
    spec = rina.FlowSpec(avg_bandwidth=1_000_000, max_loss=5.0)
    with rina.allocate("py-echo", local="pytest|1", dif="udp", spec=spec) as flow:
        assert flow.mss == 1400
        for n in (1, 100, 1400):
            sdu = bytes([n % 256]) * n
            flow.write(sdu)
            assert flow.read(timeout=5) == sdu
    assert srv.line() == "accepted pytest|1 bw=1000000 loss=5.0 gap=None in_order=False"


def test_asyncio_flows_in_parallel(server):
    srv = server("echo_server_async.py", "py-echo-async")

    async def one(n):
        flow = await rina.allocate_async("py-echo-async", local=f"pytest-async|{n}")
        assert isinstance(flow, rina.AsyncFlow)
        with flow:
            for i in range(5):
                sdu = f"{n}:{i}".encode()
                await flow.write(sdu)
                assert await asyncio.wait_for(flow.read(), 5) == sdu
        return n

    async def main():
        return await asyncio.gather(*(one(n) for n in range(3)))

    assert asyncio.run(main()) == [0, 1, 2]
    accepted = sorted(srv.line() for _ in range(3))
    assert accepted == [f"accepted pytest-async|{n}" for n in range(3)]


def test_refusal_and_unknown_names_raise(server):
    server("echo_server.py", "py-echo")
    with pytest.raises(rina.RinaError) as e:
        rina.allocate("py-echo", local="refuse-me")
    assert e.value.errno == errno.ECONNREFUSED
    assert "refused" in str(e.value)
    with pytest.raises(rina.RinaError) as e:
        rina.allocate("nobody-at-all", dif="udp")
    assert e.value.errno == errno.EHOSTUNREACH
    assert "nobody-at-all" in str(e.value)
    # Known in the directory, registered by nobody.
    with pytest.raises(rina.RinaError) as e:
        rina.allocate("py-nobody")
    assert e.value.errno == errno.EHOSTUNREACH


def test_bad_arguments_raise(daemons):
    with pytest.raises(rina.RinaError) as e:
        rina.allocate("a|b|c|d|e")
    assert e.value.errno == errno.EINVAL
    with pytest.raises(rina.RinaError) as e:
        rina.allocate("py-echo", dif="no-such-dif")
    assert e.value.errno == errno.ENXIO
    with pytest.raises(TypeError):
        rina.allocate(b"py-echo")
    with pytest.raises(ValueError):
        rina.allocate("py\0echo")
    with pytest.raises(ValueError):
        rina.allocate("py-echo", spec=rina.FlowSpec(max_loss=150))
    with pytest.raises(TypeError):
        rina.allocate("py-echo", spec={"max_loss": 1})


def test_registration_blocking_and_async(daemons):
    with rina.Control() as ctl, rina.Control() as other:
        ctl.register("py-temp")
        with pytest.raises(rina.RinaError) as e:
            other.register("py-temp")
        assert e.value.errno == errno.EBUSY
        ctl.unregister("py-temp")
        asyncio.run(other.register_async("py-temp", "udp"))
        # Both controls belong to one user, who may withdraw its own names
        # from either (another user could not: EACCES, tested in rinad);
        # once withdrawn, the name is gone for both.
        ctl.unregister("py-temp")
        with pytest.raises(rina.RinaError) as e:
            other.unregister("py-temp")
        assert e.value.errno == errno.EINVAL
        # Nothing asked for a flow: no request within the timeout.
        assert other.next_request(timeout=0.05) is None


def test_flow_limits(server):
    server("echo_server.py", "py-echo")
    with rina.allocate("py-echo") as flow:
        with pytest.raises(rina.RinaError) as e:
            flow.write(b"x" * 1401)
        assert e.value.errno == errno.EMSGSIZE
        with pytest.raises(TimeoutError):
            flow.read(timeout=0.05)


def test_bad_timeouts_raise_naming_the_timeout(server):
    server("echo_server.py", "py-echo")
    with rina.allocate("py-echo") as flow, rina.Control() as ctl:
        for bad in (math.nan, -1, -math.inf):
            for call in (flow.read, ctl.next_request, ctl.accept):
                with pytest.raises(ValueError, match="timeout must be 0 or more seconds"):
                    call(timeout=bad)
        for call in (flow.read, ctl.next_request, ctl.accept):
            with pytest.raises(TypeError, match="timeout must be a number"):
                call(timeout="1")
        # Past what poll(2) takes (2**31 - 1 ms), or for ever: OverflowError
        # ("cannot convert float infinity to integer") before.
        for long in (math.inf, 1e300, 2**40, 2**2000):
            flow.write(b"ping")
            assert flow.read(timeout=long) == b"ping"


class _Poll:
    """A poll(2) that records its waits and answers the third."""

    def __init__(self):
        self.waits = []

    def register(self, fd, events):
        pass

    def poll(self, ms):
        assert isinstance(ms, int) and 0 <= ms <= 2**31 - 1, ms
        self.waits.append(ms)
        return [(0, select.POLLIN)] if len(self.waits) == 3 else []


@pytest.mark.parametrize("timeout", [2**40, 1e300, None])
def test_long_waits_are_cut_to_what_poll_takes(monkeypatch, timeout):
    p = _Poll()
    monkeypatch.setattr(rina.select, "poll", lambda: p)
    assert rina._wait_readable(0, timeout)
    assert p.waits == [2**31 - 1] * 3


def test_no_daemon_raises(daemons, tmp_path):
    os.environ["RINA_SOCKET"] = str(tmp_path / "nobody.sock")
    try:
        with pytest.raises(rina.RinaError) as e:
            rina.Control()
        assert e.value.errno == errno.ECONNREFUSED
        assert "rinad" in str(e.value)
    finally:
        os.environ["RINA_SOCKET"] = daemons.alpha


@pytest.mark.parametrize("mode", [[], ["--async"]])
def test_example_client(server, daemons, mode):
    server("echo_server.py", "py-echo")
    out = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, "echo_client.py"), *mode, "py-echo", "2"],
        env=dict(os.environ, RINA_SOCKET=daemons.alpha),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("\n") == (3 if mode else 2), out.stdout


def control_at(sock):
    """A Control on the daemon at ``sock`` (rina_open reads RINA_SOCKET)."""
    old = os.environ["RINA_SOCKET"]
    os.environ["RINA_SOCKET"] = sock
    try:
        return rina.Control()
    finally:
        os.environ["RINA_SOCKET"] = old


def allocate_in_thread(remote, local):
    """Starts an allocation in a thread; returns a queue that gets its flow,
    or the exception it raised."""
    out = queue.Queue()

    def run():
        try:
            out.put(rina.allocate(remote, local=local))
        except Exception as e:  # handed to the test
            out.put(e)

    threading.Thread(target=run, daemon=True).start()
    return out


@pytest.mark.parametrize("use_async", [False, True])
def test_accept_passes_over_a_withdrawn_request(daemons, use_async):
    # A name of its own: the other case's is withdrawn asynchronously.
    name = "py-slow-async" if use_async else "py-slow"
    with control_at(daemons.beta) as ctl:
        ctl.register(name)
        # Nobody answers within beta's accept timeout: the daemon refuses
        # on the server's behalf; the request it passed on is stale.
        with pytest.raises(rina.RinaError) as e:
            rina.allocate(name, local="py-impatient")
        assert e.value.errno == errno.ECONNREFUSED
        client = allocate_in_thread(name, "py-patient")
        if use_async:
            flow = asyncio.run(asyncio.wait_for(ctl.accept_async(), 10))
        else:
            flow = ctl.accept(timeout=10)
        peer = client.get(timeout=10)
        assert isinstance(peer, rina.Flow), peer
        with flow, peer:
            assert flow.remote == "py-patient"


def test_a_request_dropped_unanswered_is_refused_at_once(daemons):
    with control_at(daemons.beta) as ctl:
        ctl.register("py-dropped")
        client = allocate_in_thread("py-dropped", "py-dropper")
        req = ctl.next_request(timeout=10)
        assert req is not None and req.remote == "py-dropper"
        start = time.monotonic()
        del req
        res = client.get(timeout=10)
        took = time.monotonic() - start
        assert isinstance(res, rina.RinaError) and res.errno == errno.ECONNREFUSED, res
        # Not left to beta's accept timeout (1.5 s) to refuse it.
        assert took < 1.0, took


def test_several_tasks_accept_on_one_control(daemons):
    with control_at(daemons.beta) as ctl:
        ctl.register("py-many")

        async def main():
            accepting = [asyncio.create_task(ctl.accept_async()) for _ in range(3)]
            clients = await asyncio.gather(
                *(rina.allocate_async("py-many", local=f"py-many|{n}") for n in range(3))
            )
            accepted = await asyncio.wait_for(asyncio.gather(*accepting), 10)
            for f in clients + accepted:
                f.close()
            return sorted(f.remote for f in accepted)

        assert asyncio.run(main()) == [f"py-many|{n}" for n in range(3)]


def test_closed_flows_and_controls_raise_ebadf(server):
    server("echo_server.py", "py-echo")
    flow = rina.allocate("py-echo")
    flow.close()
    aflow = asyncio.run(rina.allocate_async("py-echo"))
    aflow.close()
    ctl = rina.Control()
    ctl.close()
    calls = [
        flow.read,
        lambda: flow.write(b"x"),
        flow.fileno,
        flow.into_async,
        lambda: asyncio.run(aflow.read()),
        lambda: asyncio.run(aflow.write(b"x")),
        lambda: ctl.register("py-closed"),
        lambda: ctl.next_request(timeout=0.01),
        ctl.accept,
        lambda: asyncio.run(ctl.accept_async()),
        ctl.fileno,
    ]
    for call in calls:
        with pytest.raises(rina.RinaError) as e:
            call()
        assert e.value.errno == errno.EBADF
        assert "closed" in str(e.value)


def test_example_server_survives_a_withdrawn_request(server):
    srv = server("echo_server.py", "py-echo")
    # Stopped, the server answers nothing: the daemon refuses the flow on
    # its behalf, and the server finds the request stale when it resumes.
    srv.proc.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(rina.RinaError) as e:
            rina.allocate("py-echo", local="py-given-up")
        assert e.value.errno == errno.ECONNREFUSED
    finally:
        srv.proc.send_signal(signal.SIGCONT)
    with rina.allocate("py-echo", local="py-later") as flow:
        flow.write(b"still there")
        assert flow.read(timeout=5) == b"still there"
    assert srv.line() == "withdrawn py-given-up"


@pytest.fixture
def fd_1500():
    """Descriptor 1500 may be opened: the soft RLIMIT_NOFILE is raised
    (within the hard one) for the test if it is lower, and restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 1501
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"descriptor 1500 needs RLIMIT_NOFILE above 1500; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    yield 1500
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_timeouts_work_on_descriptors_above_1023(server, fd_1500):
    server("echo_server.py", "py-echo")
    with rina.allocate("py-echo") as flow:
        high = os.dup2(flow.fileno(), fd_1500)
        with rina.Flow(high) as same:
            with pytest.raises(TimeoutError):
                same.read(timeout=0.05)
            same.write(b"up high")
            assert same.read(timeout=5) == b"up high"


def sleeping_in_a_call(pid):
    """Whether the main thread of process ``pid`` sleeps in a system call."""
    with open(f"/proc/{pid}/task/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "S"


def test_ctrl_c_stops_a_server_waiting_for_requests(server):
    srv = server("echo_server.py", "py-echo")
    # After "ready" the server's one sleep is the wait for a request: the
    # signal must come then, not before the wait begins.
    wait_for("the server to wait for a request", lambda: sleeping_in_a_call(srv.proc.pid))
    srv.proc.send_signal(signal.SIGINT)
    try:
        srv.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail("the server did not stop on SIGINT")
    assert "KeyboardInterrupt" in srv.proc.stderr.read()


def test_a_signal_handler_does_not_break_the_wait_for_a_request(daemons):
    with control_at(daemons.beta) as ctl:
        ctl.register("py-sig")
        enough = threading.Event()
        ticks = []

        def tick(*_):
            ticks.append(None)
            if len(ticks) >= 3:
                enough.set()

        out = queue.Queue()

        def client():
            # Once signals have come while the server waits.
            enough.wait(10)
            try:
                out.put(rina.allocate("py-sig", local="py-sig-client"))
            except Exception as e:  # handed to the test
                out.put(e)

        old = signal.signal(signal.SIGALRM, tick)
        threading.Thread(target=client, daemon=True).start()
        signal.setitimer(signal.ITIMER_REAL, 0.02, 0.02)
        try:
            req = ctl.next_request()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        assert req.remote == "py-sig-client"
        with req.accept():
            peer = out.get(timeout=10)
            assert isinstance(peer, rina.Flow), peer
            peer.close()


def test_a_registration_with_accept_gets_flows_the_daemon_accepted(daemons):
    with control_at(daemons.beta) as ctl:
        ctl.register("py-backlog", accept=True)
        # The allocation completes while the server reads nothing: the
        # daemon accepted it.
        spec = rina.FlowSpec(max_loss=2.0)
        with rina.allocate("py-backlog", local="py-eager|1", spec=spec) as client:
            flow = ctl.accept(timeout=10)
            assert flow is not None
            with flow:
                assert flow.remote == "py-eager|1"
                assert flow.spec.max_loss == 2.0
                client.write(b"ping")
                assert flow.read(timeout=5) == b"ping"
                flow.write(b"pong")
                assert client.read(timeout=5) == b"pong"
        # One taken as a request and refused is closed: its client reads
        # the end of the flow.
        with rina.allocate("py-backlog", local="py-eager|2") as client:
            req = ctl.next_request(timeout=10)
            assert req is not None and req.remote == "py-eager|2"
            req.refuse()
            assert client.read(timeout=5) == b""


class _Spy:
    """rina's C library, recording each wait descriptor rina_register()
    hands out with its socket's inode (to tell it from a later descriptor
    given the same number)."""

    def __init__(self, lib):
        self._lib = lib
        self.wait_fds = []

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def rina_register(self, fd, dif, name, flags):
        wfd = self._lib.rina_register(fd, dif, name, flags)
        if wfd >= 0 and flags & rina.RINA_F_NOWAIT:
            self.wait_fds.append((wfd, os.fstat(wfd).st_ino))
        return wfd


@pytest.fixture
def spy(monkeypatch):
    s = _Spy(rina.lib)
    monkeypatch.setattr(rina, "lib", s)
    return s


def still_open(fd, ino):
    """Whether descriptor ``fd`` is still the socket with inode ``ino``."""
    try:
        return os.fstat(fd).st_ino == ino
    except OSError:
        return False


def test_register_async_closes_its_wait_descriptor_when_the_control_closes(daemons, spy):
    async def main():
        ctl = rina.Control()
        task = asyncio.create_task(ctl.register_async("py-closed-meanwhile"))
        await asyncio.sleep(0)  # the task waits for the daemon's answer
        ctl.close()
        with pytest.raises(rina.RinaError) as e:
            await asyncio.wait_for(task, 10)
        assert e.value.errno == errno.EBADF

    asyncio.run(main())
    [(wfd, ino)] = spy.wait_fds
    assert not still_open(wfd, ino), "the wait descriptor leaked"


@pytest.mark.parametrize("answered", [True, False])
def test_a_cancelled_register_async_withdraws_the_name(daemons, spy, answered):
    name = "py-cancelled-reg"

    async def main():
        with rina.Control() as ctl, rina.Control() as other:
            task = asyncio.create_task(ctl.register_async(name))
            await asyncio.sleep(0)  # the task waits for the daemon's answer
            [(wfd, ino)] = spy.wait_fds
            if answered:
                # The answer comes while the loop is blocked: the name is
                # registered, the task has not seen it.
                assert rina._wait_readable(wfd, 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # Withdrawn in the background, while the loop runs.
            end = time.monotonic() + 10
            while True:
                try:
                    other.register(name)
                    break
                except rina.RinaError as e:
                    assert e.errno == errno.EBUSY
                    if time.monotonic() > end:
                        pytest.fail("the cancelled registration was not withdrawn")
                    await asyncio.sleep(0.01)
            other.unregister(name)
            assert not still_open(wfd, ino), "the wait descriptor leaked"

    asyncio.run(main())


@pytest.mark.parametrize("where", ["loop", "thread"])
@pytest.mark.parametrize("call", ["accept_async", "next_request_async"])
def test_closing_a_control_wakes_the_tasks_waiting_on_it(daemons, where, call):
    async def main():
        loop = asyncio.get_running_loop()
        ctl = rina.Control()
        fd = ctl.fileno()
        tasks = [asyncio.create_task(getattr(ctl, call)()) for _ in range(2)]
        await asyncio.sleep(0)  # both wait for the descriptor
        assert (loop, fd) in rina._waiting
        if where == "loop":
            ctl.close()
        else:
            await loop.run_in_executor(None, ctl.close)
        for t in tasks:
            with pytest.raises(rina.RinaError) as e:
                await asyncio.wait_for(t, 10)
            assert e.value.errno == errno.EBADF
        assert not [k for k in rina._waiting if k[1] == fd]
        # A descriptor given the number next is waited on afresh.
        a, b = socket.socketpair()
        with a, b:
            if b.fileno() == fd:
                a, b = b, a
            moved = a.fileno() != fd
            if moved:
                os.dup2(a.fileno(), fd)
            try:
                b.send(b"x")
                await asyncio.wait_for(rina._readable(fd), 10)
            finally:
                if moved:
                    os.close(fd)

    asyncio.run(main())


class _GatedExecutor(concurrent.futures.ThreadPoolExecutor):
    """An event loop's executor whose one job stops at a gate, ``before``
    it runs or ``after``; ``reached`` is set when it gets there."""

    def __init__(self, loop, where):
        super().__init__(max_workers=1)
        self.loop, self.where = loop, where
        self.reached = asyncio.Event()
        self.go = threading.Event()

    def hold(self):
        self.loop.call_soon_threadsafe(self.reached.set)
        assert self.go.wait(10)

    def submit(self, fn, *args):
        def job():
            if self.where == "before":
                self.hold()
            r = fn(*args)
            if self.where == "after":
                self.hold()
            return r

        return super().submit(job)


@pytest.mark.parametrize("when", ["before", "during", "after"])
def test_a_cancelled_accept_async_does_not_leave_a_flow_to_the_gc(daemons, monkeypatch, when):
    """accept_async cancelled while its answer is under way in the executor:
    before the answer the request is refused; after it, the flow is closed
    (its requester reads its end)."""
    accepted = []
    executor = []
    accept = rina.FlowRequest._accept_unless_gone

    def recording(req):
        flow = accept(req)
        accepted.append(flow)
        if when == "during":
            executor[0].hold()
        return flow

    monkeypatch.setattr(rina.FlowRequest, "_accept_unless_gone", recording)
    with control_at(daemons.beta) as ctl:
        # A name per case: the last case's Control is closed, but the
        # daemon may not have withdrawn its name yet.
        name = f"py-cancel-accept-{when}"
        ctl.register(name)
        client = allocate_in_thread(name, f"py-cancelled|{when}")

        async def main():
            loop = asyncio.get_running_loop()
            ex = _GatedExecutor(loop, None if when == "during" else when)
            executor.append(ex)
            loop.set_default_executor(ex)
            task = asyncio.create_task(ctl.accept_async())
            try:
                await asyncio.wait_for(ex.reached.wait(), 10)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                if when == "after":
                    [flow] = accepted
                    assert flow._sock is None, "the accepted flow was left open"
            finally:
                ex.go.set()

        asyncio.run(main())  # waits for the executor's job
        res = client.get(timeout=10)
        if when == "before":
            assert accepted == []
            assert isinstance(res, rina.RinaError) and res.errno == errno.ECONNREFUSED, res
        else:
            [flow] = accepted
            assert flow._sock is None, "the accepted flow was left open"
            assert isinstance(res, rina.Flow), res
            with res:
                assert res.read(timeout=5) == b""


@pytest.mark.parametrize("newer", ["release", "debug"])
def test_the_library_is_looked_for_in_cargo_target_dir_newest_first(monkeypatch, tmp_path, newer):
    older = "debug" if newer == "release" else "release"
    for age, profile in enumerate((older, newer)):
        (tmp_path / profile).mkdir()
        lib = tmp_path / profile / "librina_api.so"
        lib.write_bytes(b"")
        os.utime(lib, (1_000_000 + age, 1_000_000 + age))
    monkeypatch.delenv("RINA_API_LIB", raising=False)
    monkeypatch.setenv("CARGO_TARGET_DIR", str(tmp_path))
    found = [p for p in rina._lib._candidates() if p.startswith(str(tmp_path))]
    assert found == [str(tmp_path / p / "librina_api.so") for p in (newer, older)]
