#!/usr/bin/env bash
# The performance benchmark (not a timed test): every figure of the
# performance aims, measured in one run on this machine against iperf3 and
# sockperf measured in the same run, then one table of measured against aim.
#   * bench/foundation.sh: an application over shim-udp vs iperf3 -u, and
#     rina-echo's median round trip vs sockperf, through the daemons and
#     on a direct flow, and through daemons that busy-poll (busy_poll_us),
#     and with every process of the round trip pinned to one vCPU;
#   * bench/normal_dif.sh: one normal DIF, two stacked DIFs, an encrypted
#     DIF vs iperf3 -u (medians of interleaved rounds), a reliable flow
#     beside the unreliable one, and applications on their flows' sockets;
#   * bench/rina_ip.sh (root only): iperf3 TCP through rina-ip vs the bare veth;
#   * bench/scale.sh: idle flows in one daemon, memory per idle flow,
#     flow allocations per second;
#   * bench/core_cost.sh (with valgrind): the core's instructions per SDU
#     over one normal DIF and two stacked, which the extra DIF's cost
#     comes from, free of the host's noise.
#
#   bash bench/performance.sh              # DUR=5 s per measurement
#   sudo DUR=10 bash bench/performance.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-5}
R=$(mktemp -d /tmp/rina-bench-all.XXXXXX)
trap 'rm -rf "$R"' EXIT

cargo build --release -q
echo "== bench/foundation.sh"
RESULTS="$R/foundation.json" DUR="$DUR" bash bench/foundation.sh
echo "== bench/normal_dif.sh"
RESULTS="$R/normal.json" DUR="$DUR" bash bench/normal_dif.sh
if [ "$(id -u)" = 0 ]; then
    echo "== bench/rina_ip.sh"
    RESULTS="$R/rina_ip.json" NO_BUILD=1 DUR="$DUR" bash bench/rina_ip.sh
else
    echo "== bench/rina_ip.sh skipped: it needs root (network namespaces, TUN)"
fi
echo "== bench/core_cost.sh"
RESULTS="$R/core.json" NO_BUILD= bash bench/core_cost.sh
if [ -f bench/scale.sh ]; then
    echo "== bench/scale.sh"
    RESULTS="$R/scale.json" bash bench/scale.sh
fi

python3 - "$R" <<'PY'
import json, os, sys
r = sys.argv[1]
def load(name):
    p = os.path.join(r, name)
    return json.load(open(p)) if os.path.exists(p) else None
f, n, ip, sc = load("foundation.json"), load("normal.json"), load("rina_ip.json"), load("scale.json")
core = load("core.json")
rows = []
def pct(d, k):
    return None if not d or d.get(k) is None else d[k] * 100
def row(what, value, aim, ok, fmt):
    rows.append((what, "not run" if value is None else fmt.format(value), aim,
                 "" if value is None or ok is None else ("met" if ok(value) else "NOT met")))
row("shim-udp / iperf3 -u (1400 B)", f and f["shim_udp_ratio"], ">= 1.00", lambda v: v >= 1.0, "{:.2f}")
row("one normal DIF / iperf3 -u", n and n["normal_ratio"], ">= 0.80", lambda v: v >= 0.8, "{:.2f}")
row("cost of an extra stacked DIF", n and n["stacked_cost"] * 100, "<= 8 %", lambda v: v <= 8, "{:.1f} %")
row("  the same in daemon CPU per GB", pct(n, "stacked_flat_cpu_cost"), "<= 8 %", lambda v: v <= 8, "{:.1f} %")
row("  a layer's core work, instr./SDU", core and core["layer"], "(no aim)", None, "{:.0f}")
row("encryption's cost", n and n["encryption_cost"] * 100, "<= 15 %", lambda v: v <= 15, "{:.1f} %")
row("  the same in daemon CPU per GB", pct(n, "encryption_flat_cpu_cost"), "<= 15 %", lambda v: v <= 15, "{:.1f} %")
row("reliable flow / unreliable, 1 DIF", n and n.get("reliable_ratio"), "(no aim)", None, "{:.2f}")
row("apps on sockets, 1 DIF / iperf3 -u", n and n.get("sockets_ratio"), "(no aim)", None, "{:.2f}")
row("echo median RTT / sockperf", f and f["echo_rtt_ratio"], "<= 1.30", lambda v: v <= 1.3, "{:.2f}")
row("  floor: sockperf via 2 relays", f and f.get("relay_floor_ratio"), "(no aim)", None, "{:.2f}")
row("  echo / sockperf via 2 relays", f and f.get("echo_over_relay_ratio"), "(no aim)", None, "{:.2f}")
row("  the same on a direct flow", f and f.get("echo_direct_rtt_ratio"), "<= 1.30", lambda v: v <= 1.3, "{:.2f}")
row("  through busy-polling daemons", f and f.get("echo_busy_poll_rtt_ratio"), "<= 1.30", lambda v: v <= 1.3, "{:.2f}")
row("  all on one vCPU: echo / sockperf", f and f.get("echo_pinned_rtt_ratio"), "(no aim)", None, "{:.2f}")
row("  all on one vCPU: echo / relays", f and f.get("echo_over_relay_pinned_ratio"), "(no aim)", None, "{:.2f}")
row("iperf3 TCP via rina-ip / veth", ip and ip["rina_ip_ratio"], ">= 0.50", lambda v: v >= 0.5, "{:.3f}")
row("  floor: a plain UDP tunnel / veth", ip and ip.get("plain_tunnel_ratio"), "(no aim)", None, "{:.3f}")
row("  rina-ip / plain UDP tunnel", ip and ip.get("rina_ip_over_plain"), "(no aim)", None, "{:.3f}")
if sc:
    for k, (what, aim, ok, fmt) in {
        "flows_reached": ("idle flows in one daemon", ">= 100000", lambda v: v >= 100000, "{:.0f}"),
        "flows_reached_fds": ("  with a descriptor per flow", "(no aim)", None, "{:.0f}"),
        "bytes_per_idle_flow": ("memory per idle flow", "<= 4096 B", lambda v: v <= 4096, "{:.0f} B"),
        "allocs_per_s": ("flow allocations per second", ">= 5000", lambda v: v >= 5000, "{:.0f}"),
        "allocs_per_s_auto": ("  the daemon accepting for the app", ">= 5000", lambda v: v >= 5000, "{:.0f}"),
        "allocs_per_s_bundle": ("  flows in bundles", ">= 5000", lambda v: v >= 5000, "{:.0f}"),
    }.items():
        if sc.get(k) is not None:
            row(what, sc[k], aim, ok, fmt)
print()
print(f"{'figure':34}{'measured':>12}{'aim':>12}  ")
for what, v, aim, verdict in rows:
    print(f"{what:34}{v:>12}{aim:>12}  {verdict}")
PY
