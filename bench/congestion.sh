#!/usr/bin/env bash
# Congestion-control benchmark (issue 21; not a timed test: the machine is
# noisy). As root, in one run:
#   1. iperf3 TCP between two network namespaces over a veth pair shaped
#      by tbf to RATE (default 1gbit), for DUR seconds;
#   2. one reliable rina-perf flow over the same kind of link, with
#      rina-lab's netns backend (examples/lab/cc-1g.toml: namespaces, veth,
#      tbf, rinad over shim-eth);
#   3. three reliable flows sharing a 10 Mb/s bottleneck
#      (examples/lab/cc-share.toml),
# and prints reliable goodput against iperf3 TCP (aim: >= 95 %) and the
# share of each flow with Jain's fairness index.
#
#   sudo bash bench/congestion.sh            # DUR=10 RATE=1gbit
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-10}
RATE=${RATE:-1gbit}
if [ "$(id -u)" != 0 ]; then
    echo "bench: needs root (network namespaces, tbf)" >&2
    exit 1
fi
if ! command -v iperf3 >/dev/null 2>&1; then
    apt-get install -y iperf3 >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y iperf3 >/dev/null; }
fi
cargo build --release -q -p rinad -p rina-tools -p rina-lab
BIN=target/release
T=$(mktemp -d /tmp/rina-bench-cc.XXXXXX)
NS_A=rbcc-a-$$
NS_B=rbcc-b-$$
cleanup() {
    ip netns del "$NS_A" 2>/dev/null || true
    ip netns del "$NS_B" 2>/dev/null || true
    rm -rf "$T"
}
trap cleanup EXIT INT TERM

# 1. iperf3 TCP over a tbf-shaped veth between two namespaces.
ip netns add "$NS_A"
ip netns add "$NS_B"
ip link add va type veth peer name vb
ip link set va netns "$NS_A"
ip link set vb netns "$NS_B"
ip -n "$NS_A" addr add 10.99.0.1/24 dev va
ip -n "$NS_B" addr add 10.99.0.2/24 dev vb
for ns in "$NS_A:va" "$NS_B:vb"; do
    n=${ns%%:*}; d=${ns##*:}
    ip -n "$n" link set lo up
    ip -n "$n" link set "$d" up
    ip netns exec "$n" tc qdisc add dev "$d" root tbf rate "$RATE" burst 256kb latency 20ms
done
ip netns exec "$NS_B" iperf3 -s -1 -D -p 5299 --logfile "$T/iperf3-server.log"
sleep 0.5
ip netns exec "$NS_A" iperf3 -c 10.99.0.2 -p 5299 -t "$DUR" -J >"$T/iperf3.json"
TCP_BPS=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"])' "$T/iperf3.json")

# 2. and 3. rina-lab on netns.
"$BIN/rina-lab" run examples/lab/cc-1g.toml --backend netns --out "$T/cc-1g" --no-plots >/dev/null
"$BIN/rina-lab" run examples/lab/cc-share.toml --backend netns --out "$T/cc-share" --no-plots >/dev/null

python3 - "$TCP_BPS" "$T/cc-1g/run.json" "$T/cc-share/run.json" <<'PY'
import json, sys
tcp = float(sys.argv[1])
def goodputs(path):
    run = json.load(open(path))
    by = {}
    for p in run.get("goodput", []):
        by[p["series"]] = max(by.get(p["series"], 0.0), p["goodput_bps"])
    return by
one = goodputs(sys.argv[2])
rina = max(one.values()) if one else 0.0
print(f"iperf3 TCP over tbf veth      {tcp/1e6:9.1f} Mb/s")
print(f"rina-perf reliable (netns)     {rina/1e6:9.1f} Mb/s   ratio {rina/tcp*100 if tcp else 0:5.1f} %  (aim >= 95 %)")
share = goodputs(sys.argv[3])
x = list(share.values())
if x:
    jain = sum(x) ** 2 / (len(x) * sum(v * v for v in x))
    for k, v in sorted(share.items()):
        print(f"  share {k:30s} {v/1e6:7.2f} Mb/s")
    print(f"3 flows over 10 Mb/s: total {sum(x)/1e6:.2f} Mb/s, utilisation {sum(x)/10e6*100:.1f} %, Jain {jain:.3f}")
PY
