"""RINA flows from Python, through the local rinad.

A ctypes binding of the C API (librina_api, rlite's rina/api.h). The
daemon's socket is $RINA_SOCKET, else rinad's default.

Client::

    import rina
    with rina.allocate("echo", local="me", spec=rina.FlowSpec(avg_bandwidth=10**6)) as f:
        f.write(b"hello")
        print(f.read())

Server::

    with rina.Control() as ctl:
        ctl.register("echo")
        while True:
            with ctl.accept() as f:
                f.write(f.read())

Asyncio: :func:`allocate_async`, :meth:`Control.accept_async`,
:meth:`Control.register_async` and :class:`AsyncFlow`.

Names are ``name|instance|entity|instance`` (or ``name/instance/...``).

Errors: what the C API or the daemon refuses, and calls on a closed flow or
Control, raise :class:`RinaError` (an ``OSError`` with the errno the C API
set and its message; an invalid name, an empty or oversized SDU are
RinaError too, EINVAL or EMSGSIZE). Arguments this module checks itself
raise ``TypeError`` (a wrong type: a name that is not a ``str``, a spec not
a :class:`FlowSpec`, a timeout not a number) or ``ValueError`` (a NUL in a
name, a negative or NaN timeout, a :class:`FlowSpec` field out of range).
:meth:`Flow.read` with a timeout raises ``TimeoutError`` when no SDU came
(:meth:`Control.next_request` and :meth:`Control.accept` return None).
"""

import asyncio
import ctypes
import errno
import math
import numbers
import os
import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import Optional

from ._lib import (
    RINA_F_ACCEPT,
    RINA_F_NORESP,
    RINA_F_NOWAIT,
    RINA_FLOW_SPEC_LOSS_MAX,
    FlowSpecC,
    lib,
    libc,
)

__all__ = [
    "RinaError",
    "FlowSpec",
    "Flow",
    "AsyncFlow",
    "FlowRequest",
    "Control",
    "allocate",
    "allocate_async",
]

_NO_BOUND = 2**64 - 1


class RinaError(OSError):
    """A RINA call failed; ``errno`` says how, the message says what."""


def _fail(what):
    e = ctypes.get_errno()
    msg = (lib.rina_api_last_error() or b"").decode("utf-8", "replace")
    raise RinaError(e, f"{what}: {msg or os.strerror(e)}")


def _check(ret, what):
    if ret < 0:
        _fail(what)
    return ret


def _name(s, what):
    if not isinstance(s, str):
        raise TypeError(f"{what} must be a str, not {type(s).__name__}")
    if "\0" in s:
        raise ValueError(f"{what} contains a NUL character")
    return s.encode()


def _dif(d):
    return None if d is None else _name(d, "dif")


# The longest wait poll(2) takes, in milliseconds (a C int: 24.8 days);
# a longer timeout is waited out in several.
_POLL_MAX_MS = 2**31 - 1


def _timeout(timeout):
    """``timeout`` checked: None to wait for ever (as ``math.inf``), else a
    number of seconds, 0 or more, as a float. Anything else raises, naming
    it: TypeError if it is not a number, ValueError if NaN or negative."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(
            f"timeout must be a number of seconds or None, not {type(timeout).__name__}"
        )
    try:
        t = float(timeout)
    except OverflowError:
        # An integer beyond a float's range: for ever if positive.
        t = math.inf if timeout > 0 else -math.inf
    if math.isnan(t) or t < 0:
        raise ValueError(f"timeout must be 0 or more seconds (or None), not {timeout!r}")
    return None if math.isinf(t) else t


def _wait_readable(fd, timeout):
    """Whether ``fd`` turns readable within ``timeout`` seconds (a checked
    :func:`_timeout`; None: for ever) (poll(2), not select(2), which fails
    on descriptors above 1023)."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        if end is None:
            ms = _POLL_MAX_MS
        else:
            left_ms = (end - time.monotonic()) * 1000
            ms = max(0, math.ceil(min(left_ms, _POLL_MAX_MS)))
        if p.poll(ms):
            return True
        if end is not None and time.monotonic() >= end:
            return False


def _spec(spec):
    if spec is None:
        return None
    if not isinstance(spec, FlowSpec):
        raise TypeError(f"spec must be a rina.FlowSpec or None, not {type(spec).__name__}")
    return spec._to_c()


@dataclass
class FlowSpec:
    """QoS asked of a flow; the defaults ask for nothing (best effort).

    ``max_sdu_gap=0`` asks for a reliable, in-order flow
    (:meth:`FlowSpec.reliable`); ``max_loss`` is a percentage.
    """

    max_delay_us: int = 0
    max_sdu_gap: Optional[int] = None
    avg_bandwidth: int = 0
    max_loss: Optional[float] = None
    in_order: bool = False
    max_jitter_us: int = 0

    @classmethod
    def reliable(cls):
        """No SDU may be lost, SDUs arrive in order."""
        return cls(max_sdu_gap=0, in_order=True)

    def _to_c(self):
        c = FlowSpecC()
        lib.rina_flow_spec_unreliable(ctypes.byref(c))
        if not 0 <= self.max_delay_us < 2**32:
            raise ValueError(f"max_delay_us {self.max_delay_us} is out of range")
        if not 0 <= self.max_jitter_us < 2**32:
            raise ValueError(f"max_jitter_us {self.max_jitter_us} is out of range")
        if not 0 <= self.avg_bandwidth < 2**64:
            raise ValueError(f"avg_bandwidth {self.avg_bandwidth} is out of range")
        c.max_delay = self.max_delay_us
        c.max_jitter = self.max_jitter_us
        c.avg_bandwidth = self.avg_bandwidth
        if self.max_sdu_gap is not None:
            if not 0 <= self.max_sdu_gap < _NO_BOUND:
                raise ValueError(f"max_sdu_gap {self.max_sdu_gap} is out of range")
            c.max_sdu_gap = self.max_sdu_gap
        if self.max_loss is not None:
            if not 0 <= self.max_loss <= 100:
                raise ValueError(f"max_loss {self.max_loss} is not a percentage")
            c.max_loss = round(self.max_loss * RINA_FLOW_SPEC_LOSS_MAX / 100)
        c.in_order_delivery = 1 if self.in_order else 0
        return c

    @classmethod
    def _from_c(cls, c):
        return cls(
            max_delay_us=c.max_delay,
            max_sdu_gap=None if c.max_sdu_gap == _NO_BOUND else c.max_sdu_gap,
            avg_bandwidth=c.avg_bandwidth,
            max_loss=None
            if c.max_loss >= RINA_FLOW_SPEC_LOSS_MAX
            else c.max_loss * 100 / RINA_FLOW_SPEC_LOSS_MAX,
            in_order=bool(c.in_order_delivery),
            max_jitter_us=c.max_jitter,
        )


class Flow:
    """An allocated flow: one :meth:`write` is one SDU, one :meth:`read` one SDU.

    Closing it (or leaving its ``with`` block) deallocates it.
    """

    def __init__(self, fd, remote=None, spec=None):
        self._sock = socket.socket(fileno=fd)
        self.mss = lib.rina_flow_mss_get(fd)
        #: The peer's name (accepted flows).
        self.remote = remote
        #: The QoS the peer asked for (accepted flows).
        self.spec = spec

    def _live(self, what):
        """The flow's socket; :class:`RinaError` (EBADF) if it is closed."""
        if self._sock is None:
            raise RinaError(errno.EBADF, f"{what}: the flow is closed")
        return self._sock

    def fileno(self):
        return self._live("fileno").fileno()

    def _bufsize(self):
        # One byte more than the largest SDU (64 KiB if unknown).
        return (self.mss or 65535) + 1

    def _check_sdu(self, sdu):
        if not sdu:
            raise RinaError(errno.EINVAL, "an SDU may not be empty")
        if self.mss and len(sdu) > self.mss:
            raise RinaError(errno.EMSGSIZE, f"SDU of {len(sdu)} bytes, the flow carries {self.mss}")

    def write(self, sdu):
        """Sends one SDU (blocks while the flow is full)."""
        sock = self._live("write to the flow")
        self._check_sdu(sdu)
        try:
            sock.send(sdu)
        except OSError as e:
            raise RinaError(e.errno, f"write to the flow: {e.strerror}") from None

    def read(self, timeout=None):
        """Receives one SDU; ``b""`` once the flow is closed. Raises
        :class:`TimeoutError` if nothing came within ``timeout`` seconds
        (None or ``math.inf``: waits for ever; a negative or NaN timeout
        raises ValueError)."""
        timeout = _timeout(timeout)
        sock = self._live("read from the flow")
        if timeout is not None:
            if not _wait_readable(sock.fileno(), timeout):
                raise TimeoutError(f"no SDU within {timeout} s")
        try:
            return sock.recv(self._bufsize())
        except OSError as e:
            raise RinaError(e.errno, f"read from the flow: {e.strerror}") from None

    def into_async(self):
        """This flow as an :class:`AsyncFlow` (this object is then unusable)."""
        self._live("into_async")
        f = AsyncFlow.__new__(AsyncFlow)
        f._sock, f.mss, f.remote, f.spec = self._sock, self.mss, self.remote, self.spec
        f._sock.setblocking(False)
        self._sock = None
        return f

    def close(self):
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class AsyncFlow(Flow):
    """A flow for asyncio: ``await flow.read()``, ``await flow.write(sdu)``."""

    def __init__(self, fd, remote=None, spec=None):
        super().__init__(fd, remote, spec)
        self._sock.setblocking(False)

    async def write(self, sdu):
        sock = self._live("write to the flow")
        self._check_sdu(sdu)
        try:
            await asyncio.get_running_loop().sock_sendall(sock, sdu)
        except OSError as e:
            raise RinaError(e.errno, f"write to the flow: {e.strerror}") from None

    async def read(self):
        sock = self._live("read from the flow")
        try:
            return await asyncio.get_running_loop().sock_recv(sock, self._bufsize())
        except OSError as e:
            raise RinaError(e.errno, f"read from the flow: {e.strerror}") from None


# The futures waiting for a descriptor to turn readable, by (loop,
# descriptor): a loop has one reader per descriptor, which wakes them all.
_waiting = {}


def _wake(waiters):
    for f in waiters:
        if not f.done():
            f.set_result(None)


async def _readable(fd):
    loop = asyncio.get_running_loop()
    key = (loop, fd)
    waiters = _waiting.get(key)
    if waiters is None:
        waiters = []
        # A reader the loop may still hold for an earlier descriptor of
        # this number, closed from another thread (see _drop_waiters) and
        # not yet removed there, would be kept, so the new descriptor never
        # reached the loop's selector: it goes first.
        loop.remove_reader(fd)
        loop.add_reader(fd, _wake, waiters)
        _waiting[key] = waiters
    fut = loop.create_future()
    waiters.append(fut)
    try:
        await fut
    finally:
        waiters.remove(fut)
        # Unless the descriptor was closed meanwhile (_drop_waiters took
        # the entry; another may be there now, for a new descriptor).
        if not waiters and _waiting.get(key) is waiters:
            _waiting.pop(key, None)
            loop.remove_reader(fd)


def _dropped(loop, key, waiters):
    """On ``loop``: the reader of the closed descriptor goes (unless a new
    descriptor of that number has one already), its waiters wake."""
    if key not in _waiting:
        loop.remove_reader(key[1])
    _wake(waiters)


def _drop_waiters(fd):
    """Before ``fd`` is closed: the tasks waiting for it to turn readable
    (:func:`_readable`) wake to find it closed, and the loops forget it (a
    loop polling a closed descriptor never sees it ready again, nor a new
    one given its number). On another thread's loop that is done there,
    soon."""
    try:
        here = asyncio.get_running_loop()
    except RuntimeError:
        here = None
    # A copy: other threads' loops may change it meanwhile.
    for key in list(_waiting):
        if key[1] != fd:
            continue
        waiters = _waiting.pop(key, None)
        if waiters is None:
            continue
        loop = key[0]
        if loop is here:
            _dropped(loop, key, waiters)
        else:
            try:
                loop.call_soon_threadsafe(_dropped, loop, key, waiters)
            except RuntimeError:
                pass  # the loop is closed: nothing waits there any more


def allocate(remote, local="python", dif=None, spec=None):
    """Allocates a flow from ``local`` to ``remote`` (in ``dif`` if given)
    with ``spec`` (a :class:`FlowSpec`; best effort if None)."""
    c = _spec(spec)
    fd = lib.rina_flow_alloc(
        _dif(dif),
        _name(local, "local"),
        _name(remote, "remote"),
        ctypes.byref(c) if c is not None else None,
        0,
    )
    return Flow(_check(fd, f"allocate a flow to {remote}"))


async def allocate_async(remote, local="python", dif=None, spec=None):
    """Like :func:`allocate`, without blocking the event loop; returns an
    :class:`AsyncFlow`."""
    c = _spec(spec)
    wfd = lib.rina_flow_alloc(
        _dif(dif),
        _name(local, "local"),
        _name(remote, "remote"),
        ctypes.byref(c) if c is not None else None,
        RINA_F_NOWAIT,
    )
    _check(wfd, f"allocate a flow to {remote}")
    try:
        await _readable(wfd)
    except BaseException:
        os.close(wfd)
        raise
    fd = lib.rina_flow_alloc_wait(wfd)
    return AsyncFlow(_check(fd, f"allocate a flow to {remote}"))


class FlowRequest:
    """A flow request taken from a :class:`Control`, not answered yet.
    One dropped without an answer is refused, so that its requester
    learns at once rather than after the DIF's accept timeout."""

    def __init__(self, ctl, handle, remote, spec):
        self._ctl = ctl
        self._handle = handle
        self._answered = False
        #: The requester's name.
        self.remote = remote
        #: The QoS it asked for.
        self.spec = spec

    def accept(self):
        """Accepts the request; returns the flow. Raises :class:`RinaError`
        with EINVAL if the request was withdrawn meanwhile (its requester
        gave up, or the DIF's accept timeout passed)."""
        what = f"accept the flow from {self.remote}"
        ctl = self._ctl._live(what)
        self._answered = True
        fd = lib.rina_flow_respond(ctl, self._handle, 0)
        return Flow(_check(fd, what), self.remote, self.spec)

    def _accept_unless_gone(self):
        """:meth:`accept`, or None if the request was withdrawn meanwhile."""
        try:
            return self.accept()
        except RinaError as e:
            if e.errno == errno.EINVAL:
                return None
            raise

    def refuse(self):
        """Refuses the request; the requester's allocation fails (a flow
        the daemon accepted, registered with ``accept``, is closed: its
        requester sees it end)."""
        fd = self._ctl._live("refuse the flow")
        self._answered = True
        _check(lib.rina_flow_respond(fd, self._handle, 1), "refuse the flow")

    def __del__(self):
        # Dropped unanswered: refuse it (errors ignored: the request may be
        # withdrawn already, the Control closed or the daemon gone).
        if getattr(self, "_answered", True) or self._ctl._fd < 0:
            return
        self._answered = True
        lib.rina_flow_respond(self._ctl._fd, self._handle, 1)


async def _answer_off_loop(loop, req):
    """``req._accept_unless_gone()`` in ``loop``'s default executor (the
    answer is a round trip to the local daemon). The job runs on if the
    caller is cancelled: then a request it has not answered yet is refused,
    and a flow it accepted is closed, by the job or here, whichever comes
    last, rather than dropped for the garbage collector."""
    lock = threading.Lock()
    state = {"abandoned": False, "flow": None}

    def answer():
        with lock:
            abandoned = state["abandoned"]
        if abandoned:
            try:
                req.refuse()
            except RinaError:
                pass  # withdrawn, or the Control closed
            return None
        flow = req._accept_unless_gone()
        with lock:
            abandoned = state["abandoned"]
            if not abandoned:
                state["flow"] = flow
        if abandoned and flow is not None:
            flow.close()
            return None
        return flow

    try:
        return await loop.run_in_executor(None, answer)
    except BaseException:
        with lock:
            state["abandoned"] = True
            flow, state["flow"] = state["flow"], None
        if flow is not None:
            flow.close()
        raise


class Control:
    """A control descriptor (rina_open): registers names and receives the
    flow requests for them. Closing it withdraws the registrations."""

    def __init__(self):
        # Wait descriptors of cancelled register_async calls, by loop (see
        # _undo_registration).
        self._undoing = {}
        self._fd = _check(lib.rina_open(), "connect to rinad")

    def _live(self, what):
        """The control descriptor; :class:`RinaError` (EBADF) if closed."""
        if self._fd < 0:
            raise RinaError(errno.EBADF, f"{what}: the control descriptor is closed")
        return self._fd

    def fileno(self):
        return self._live("fileno")

    def register(self, name, dif=None, accept=False):
        """Registers ``name`` in ``dif`` (every DIF if None). With
        ``accept``, the daemon accepts every flow request for it at once
        (as a listening TCP socket's backlog does), so that an allocation
        waits for no round trip to this program: :meth:`accept` and
        :meth:`next_request` then hand over flows already accepted, and
        refusing one closes it."""
        what = f"register {name}"
        flags = RINA_F_ACCEPT if accept else 0
        _check(lib.rina_register(self._live(what), _dif(dif), _name(name, "name"), flags), what)

    def unregister(self, name, dif=None):
        """Withdraws a registration made here."""
        what = f"unregister {name}"
        _check(lib.rina_unregister(self._live(what), _dif(dif), _name(name, "name"), 0), what)

    async def register_async(self, name, dif=None, accept=False):
        """Like :meth:`register`, without blocking the event loop.

        The request goes to the daemon at once. Cancelled while the answer
        has not come, the registration is undone in the background: when
        the answer comes, the name is withdrawn if it was registered. That
        is done by a reader on the event loop, so the loop must go on
        running for it; if it stops first, the name stays registered until
        the Control is closed. If the Control is closed meanwhile, raises
        :class:`RinaError` (EBADF)."""
        what = f"register {name}"
        flags = RINA_F_NOWAIT | (RINA_F_ACCEPT if accept else 0)
        dif_c, name_c = _dif(dif), _name(name, "name")
        loop = asyncio.get_running_loop()
        wfd = _check(lib.rina_register(self._live(what), dif_c, name_c, flags), what)
        try:
            await _readable(wfd)
        except BaseException:
            self._undo_registration(loop, wfd, dif_c, name_c)
            raise
        if self._fd < 0:
            # Closed meanwhile (its names went with it).
            os.close(wfd)
            self._live(what)
        _check(lib.rina_register_wait(self._fd, wfd), what)

    def _undo_registration(self, loop, wfd, dif, name):
        """A registration asked with ``wfd`` was abandoned: when its answer
        comes, withdraws the name if it was registered. The answer is taken
        by a reader on ``loop`` (it blocks nothing); the withdrawal is sent
        without waiting for its answer (the library drops an answer nobody
        waits for)."""

        def answered():
            loop.remove_reader(wfd)
            self._undoing.pop(wfd, None)
            fd = self._fd
            if fd < 0:
                # The Control was closed: its names went with it.
                os.close(wfd)
                return
            # Readable: this does not block. Closes wfd, whatever it says.
            if lib.rina_register_wait(fd, wfd) == 0:
                w = lib.rina_unregister(fd, dif, name, RINA_F_NOWAIT)
                if w >= 0:
                    os.close(w)

        self._undoing[wfd] = loop
        loop.add_reader(wfd, answered)

    def next_request(self, timeout=None):
        """Waits for the next flow request (at most ``timeout`` seconds:
        then returns None); answer it with its accept() or refuse(). For a
        name registered with ``accept``, the request is a flow the daemon
        accepted already: accept() hands it over, refuse() closes it.
        ``timeout`` is as :meth:`Flow.read`'s."""
        timeout = _timeout(timeout)
        fd = self._live("take a flow request")
        if timeout is not None:
            if not _wait_readable(fd, timeout):
                return None
        return self._take()

    def _take(self):
        remote = ctypes.c_void_p()
        spec = FlowSpecC()
        fd = self._live("take a flow request")
        while True:
            h = lib.rina_flow_accept(fd, ctypes.byref(remote), ctypes.byref(spec), RINA_F_NORESP)
            # Interrupted by a signal: its Python handler runs here (and may
            # raise, KeyboardInterrupt on Ctrl-C) before the retry (PEP 475).
            if h >= 0 or ctypes.get_errno() != errno.EINTR:
                break
        _check(h, "take a flow request")
        try:
            name = ctypes.string_at(remote.value).decode("utf-8", "replace")
        finally:
            libc.free(remote.value)
        return FlowRequest(self, h, name, FlowSpec._from_c(spec))

    def accept(self, timeout=None):
        """Accepts the next flow request; returns the flow (None on timeout).
        A request withdrawn before it could be accepted (its requester gave
        up, or the DIF's accept timeout passed) is passed over, as
        rina_flow_accept() does in C. ``timeout`` is as :meth:`Flow.read`'s."""
        timeout = _timeout(timeout)
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if end is None else max(0.0, end - time.monotonic())
            req = self.next_request(left)
            if req is None:
                return None
            flow = req._accept_unless_gone()
            if flow is not None:
                return flow

    async def next_request_async(self):
        """Waits for the next flow request without blocking the event loop.
        Several tasks may wait on one Control: each request goes to one.
        Closing the Control wakes them: they raise :class:`RinaError`
        (EBADF)."""
        while True:
            fd = self._live("take a flow request")
            await _readable(fd)
            # Another task woken with this one may have taken the request.
            if self._fd == fd and _wait_readable(fd, 0):
                return self._take()

    async def accept_async(self):
        """Accepts the next flow request; returns an :class:`AsyncFlow`.
        Withdrawn requests are passed over, as by :meth:`accept`.

        The answer is given in the loop's default executor. Cancelled while
        it is under way, the call does not give up the request silently: a
        request not answered yet is refused, and a flow accepted meanwhile
        is closed (its requester sees it end). Closing the Control while it
        waits raises :class:`RinaError` (EBADF)."""
        loop = asyncio.get_running_loop()
        while True:
            req = await self.next_request_async()
            flow = await _answer_off_loop(loop, req)
            if flow is not None:
                return flow.into_async()

    def close(self):
        fd = self._fd
        if fd >= 0:
            self._fd = -1
            # Tasks waiting on it wake (and raise EBADF) rather than wait
            # for ever on a descriptor their loop no longer polls.
            _drop_waiters(fd)
            os.close(fd)
        # Cancelled registrations whose loop stopped before their answer
        # came: their readers will not run, the names went with fd.
        for wfd, loop in list(self._undoing.items()):
            if loop.is_closed():
                del self._undoing[wfd]
                os.close(wfd)

    def __del__(self):
        # A Control dropped without close() still withdraws its names.
        if getattr(self, "_fd", -1) >= 0:
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
