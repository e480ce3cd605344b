#!/usr/bin/env bash
# Congestion-control benchmark (issue 21; not a timed test: the machine is
# noisy). As root, in one run:
#   1. iperf3 TCP between two network namespaces over a veth pair shaped
#      by tbf to 1 Gb/s (burst and queue as rina-lab's netns backend sets
#      them: 1 ms of traffic, 1000 frames of 1600 bytes), for DUR seconds;
#   2. one reliable rina-perf flow over the same kind of link, with
#      rina-lab's netns backend (examples/lab/cc-1g.toml: namespaces, veth,
#      tbf, rinad over shim-eth), 6 s;
#   3. one, three and ten reliable flows over a 10 Mb/s bottleneck with a
#      100-frame queue (examples/lab/cc-1.toml, cc-share.toml, cc-10.toml),
#      and three in a DIF stacked on the congested one (cc-stack.toml);
#   4. one reliable flow and an iperf3 TCP flow on one 10 Mb/s tbf veth
#      (examples/lab/cc-tcp.toml, iperf3 started in the run's namespaces),
# and prints reliable goodput against iperf3 TCP (aim: >= 95 %), the share
# of each flow with Jain's fairness index, and the RINA flow's share
# against TCP (aim: between half and twice its share).
#
#   sudo bash bench/congestion.sh            # DUR=6
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-6}
if [ "$(id -u)" != 0 ]; then
    echo "bench: needs root (network namespaces, tbf)" >&2
    exit 1
fi
if ! command -v iperf3 >/dev/null 2>&1; then
    apt-get install -y iperf3 >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y iperf3 >/dev/null; }
fi
cargo build --release -q -p rinad -p rina-tools -p rina-lab
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release}
T=$(mktemp -d /tmp/rina-bench-cc.XXXXXX)
NS_A=rbcc-a-$$
NS_B=rbcc-b-$$
LAB_PID=
CLEANED=
# cleanup runs once, on any exit (Ctrl-C and SIGTERM exit 130 and 143
# through it). The backgrounded rina-lab (step 4) runs in a session of its
# own, so that a Ctrl-C to the terminal's process group does not reach it:
# it gets exactly one SIGINT, from here, which makes it tear down its
# namespaces and exit (a second one would make it exit at once, leaving
# them behind).
cleanup() {
    [ -n "$CLEANED" ] && return
    CLEANED=1
    trap '' INT TERM
    if [ -n "$LAB_PID" ] && kill -0 "$LAB_PID" 2>/dev/null; then
        kill -INT "$LAB_PID" 2>/dev/null || true
        for _ in $(seq 300); do
            kill -0 "$LAB_PID" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$LAB_PID" 2>/dev/null; then
            echo "bench: rina-lab ($LAB_PID) still running 30 s after SIGINT: killing it and its namespaces" >&2
            kill -KILL "$LAB_PID" 2>/dev/null || true
            wait "$LAB_PID" 2>/dev/null || true
            for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^rlab$LAB_PID-" || true); do
                ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
                ip netns del "$ns" 2>/dev/null || true
            done
        fi
        wait "$LAB_PID" 2>/dev/null || true
    fi
    for f in "$T"/*.pid; do
        [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
    done
    ip netns del "$NS_A" 2>/dev/null || true
    ip netns del "$NS_B" 2>/dev/null || true
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# 1. iperf3 TCP over a tbf-shaped veth between two namespaces.
ip netns add "$NS_A"
ip netns add "$NS_B"
ip link add "va$$" type veth peer name "vb$$"
ip link set "va$$" netns "$NS_A"
ip link set "vb$$" netns "$NS_B"
ip -n "$NS_A" addr add 10.99.0.1/24 dev "va$$"
ip -n "$NS_B" addr add 10.99.0.2/24 dev "vb$$"
for ns in "$NS_A:va$$" "$NS_B:vb$$"; do
    n=${ns%%:*}; d=${ns##*:}
    ip -n "$n" link set lo up
    ip -n "$n" link set "$d" up
    ip netns exec "$n" tc qdisc add dev "$d" root tbf rate 1gbit burst 125000b limit 1600000b
done
ip netns exec "$NS_B" iperf3 -s -1 -D -p 5299 --logfile "$T/iperf3-server.log" -I "$T/iperf3-server.pid"
sleep 0.5
ip netns exec "$NS_A" iperf3 -c 10.99.0.2 -p 5299 -t "$DUR" -J >"$T/iperf3.json"
TCP_BPS=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"])' "$T/iperf3.json")
ip netns del "$NS_A"
ip netns del "$NS_B"

# 2. and 3. rina-lab on netns. A failed run leaves its row empty; an
# interrupted one (Ctrl-C reaches it too: status 130) ends the benchmark.
for e in cc-1g cc-1 cc-share cc-10 cc-stack; do
    rc=0
    "$BIN/rina-lab" run "examples/lab/$e.toml" --backend netns --out "$T/$e" --no-plots >/dev/null || rc=$?
    [ "$rc" != 130 ] || exit 130
done

# 4. A reliable flow against iperf3 TCP on one 10 Mb/s tbf veth: rina-lab
# makes the namespaces rlab<pid>-<node> and the veth ends rl<pid>a0 and
# rl<pid>b0; iperf3 runs over the same pair, with addresses of its own.
# setsid: see cleanup (bash starts it without job control, so setsid execs
# it in the same process: $! is rina-lab's pid, the one in the names).
setsid "$BIN/rina-lab" run examples/lab/cc-tcp.toml --backend netns --out "$T/cc-tcp" --no-plots >/dev/null &
LAB_PID=$!
for _ in $(seq 200); do
    ip -n "rlab$LAB_PID-1" link show "rl${LAB_PID}b0" >/dev/null 2>&1 && break
    sleep 0.05
done
ip -n "rlab$LAB_PID-0" addr add 10.98.0.1/24 dev "rl${LAB_PID}a0"
ip -n "rlab$LAB_PID-1" addr add 10.98.0.2/24 dev "rl${LAB_PID}b0"
ip netns exec "rlab$LAB_PID-1" iperf3 -s -1 -D -p 5298 --logfile "$T/iperf3-share-server.log" -I "$T/iperf3-share-server.pid"
sleep 0.5
ip netns exec "rlab$LAB_PID-0" iperf3 -c 10.98.0.2 -p 5298 -t 10 -J >"$T/iperf3-share.json" || true
rc=0
wait "$LAB_PID" || rc=$?
LAB_PID=
[ "$rc" != 130 ] || exit 130

python3 - "$TCP_BPS" "$T" <<'PY'
import json, sys
tcp, t = float(sys.argv[1]), sys.argv[2]
def flows(name):
    try:
        run = json.load(open(f"{t}/{name}/run.json"))["run"]
    except (OSError, ValueError, KeyError):
        return []
    return [f for f in run["flows"] if f["kind"] == "perf"]
def jain(x):
    return sum(x) ** 2 / (len(x) * sum(v * v for v in x)) if sum(x) else 0.0
one = flows("cc-1g")
rina = one[0]["goodput_bps"] if one else 0.0
print(f"iperf3 TCP over 1 Gb/s tbf veth   {tcp/1e6:9.1f} Mb/s")
print(f"rina-perf reliable (netns)        {rina/1e6:9.1f} Mb/s   ratio {rina/tcp*100 if tcp else 0:5.1f} %  (aim >= 95 %)")
for name, n in (("cc-1", 1), ("cc-share", 3), ("cc-10", 10), ("cc-stack", 3)):
    fl = flows(name)
    x = [f["goodput_bps"] for f in fl]
    done = sum(1 for f in fl if f["error"] is None and f["received"] == f["sent"])
    label = f"{n} flows" + (" stacked" if name == "cc-stack" else "")
    print(f"{label} over 10 Mb/s: {done}/{len(fl)} complete, total {sum(x)/1e6:.2f} Mb/s, "
          f"utilisation {sum(x)/10e6*100:.1f} %, Jain {jain(x):.3f}, "
          f"min {min(x, default=0)/1e6:.2f} max {max(x, default=0)/1e6:.2f} Mb/s")
fl = flows("cc-tcp")
r = fl[0]["goodput_bps"] if fl else 0.0
try:
    s = json.load(open(f"{t}/iperf3-share.json"))
    tcp_share = s["end"]["sum_received"]["bits_per_second"]
    per_s = [round(i["sum"]["bits_per_second"] / 1e6, 1) for i in s["intervals"]]
except (OSError, ValueError, KeyError):
    tcp_share, per_s = 0.0, []
print(f"reliable flow against iperf3 TCP on 10 Mb/s: RINA {r/1e6:.2f} Mb/s = {r/5e6:.2f} x its share "
      f"(aim 0.5..2); TCP {tcp_share/1e6:.2f} Mb/s over its 10 s, per second {per_s}")
PY
