"""Loads librina_api and declares the C API's functions (rina/api.h)."""

import ctypes
import ctypes.util
import os

RINA_F_NOWAIT = 1 << 0
RINA_F_NORESP = 1 << 1
RINA_F_ACCEPT = 1 << 2
RINA_FLOW_SPEC_VERSION = 2
RINA_FLOW_SPEC_LOSS_MAX = 10000


class FlowSpecC(ctypes.Structure):
    """struct rina_flow_spec (version 2)."""

    _fields_ = [
        ("version", ctypes.c_uint32),
        ("max_delay", ctypes.c_uint32),
        ("max_sdu_gap", ctypes.c_uint64),
        ("avg_bandwidth", ctypes.c_uint64),
        ("max_loss", ctypes.c_uint16),
        ("in_order_delivery", ctypes.c_uint8),
        ("msg_boundaries", ctypes.c_uint8),
        ("max_jitter", ctypes.c_uint32),
    ]


def _candidates():
    env = os.environ.get("RINA_API_LIB")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "librina_api.so")
    # Used from the repository's source tree: the library cargo built, in
    # $CARGO_TARGET_DIR or the repository's target/, the newer profile
    # first (as setup.py takes it).
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(here, "..", "..", "target")
    built = [os.path.join(target, profile, "librina_api.so") for profile in ("release", "debug")]
    yield from sorted(filter(os.path.isfile, built), key=os.path.getmtime, reverse=True)
    found = ctypes.util.find_library("rina_api")
    if found:
        yield found


def _load():
    tried = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path, use_errno=True)
        except OSError as e:
            tried.append(f"{path}: {e}")
    raise ImportError(
        "cannot load librina_api (set RINA_API_LIB, or install the package with "
        "`pip install ./python` from the repository): " + "; ".join(tried)
    )


lib = _load()
libc = ctypes.CDLL(None, use_errno=True)
libc.free.argtypes = [ctypes.c_void_p]
libc.free.restype = None

_I, _U, _S = ctypes.c_int, ctypes.c_uint, ctypes.c_char_p
for name, args, res in [
    ("rina_open", [], _I),
    ("rina_register", [_I, _S, _S, _I], _I),
    ("rina_unregister", [_I, _S, _S, _I], _I),
    ("rina_register_wait", [_I, _I], _I),
    ("rina_flow_accept", [_I, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(FlowSpecC), _U], _I),
    ("rina_flow_respond", [_I, _I, _I], _I),
    ("rina_flow_alloc", [_S, _S, _S, ctypes.POINTER(FlowSpecC), _U], _I),
    ("rina_flow_alloc_wait", [_I], _I),
    ("rina_flow_spec_unreliable", [ctypes.POINTER(FlowSpecC)], None),
    ("rina_flow_mss_get", [_I], _U),
    ("rina_api_last_error", [], _S),
]:
    f = getattr(lib, name)
    f.argtypes = args
    f.restype = res
