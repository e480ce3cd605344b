#!/usr/bin/env bash
# Shim-eth benchmark (seed 000 §16.4.3.3; not a timed test): two network
# namespaces joined by a veth pair shaped to 1 Gb/s with tbf (both ways),
# MTU 1500, and in one run
#   * rina-perf at the largest SDU directly over the shim DIF (VLAN 10),
#   * over one normal DIF over a shim DIF (VLAN 20),
#   * over two normal DIFs stacked on that one,
#   * iperf3 (TCP) over the same link, untagged IPv4,
# then prints goodputs and the three ratios to iperf3 (IRATI: 93.6%, 93.0%,
# 91.9%; aim: 95%, 94%, 93%). Needs root, iproute2 (ip, tc), iperf3 and
# python3; as root it installs iperf3 with apt when missing.
#
#   sudo bash bench/shim_eth.sh              # DUR=10 seconds per measurement
#   NORINGS=1 sudo bash bench/shim_eth.sh    # flows on sockets, not rings
#   RATE=1gbit DUR=5 bash bench/shim_eth.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-10}
RATE=${RATE:-1gbit}
[ "$(id -u)" = 0 ] || { echo "bench: needs root (network namespaces, raw sockets)" >&2; exit 1; }
if ! command -v iperf3 >/dev/null 2>&1; then
    apt-get install -y iperf3 >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y iperf3 >/dev/null; }
fi
command -v python3 >/dev/null || { echo "bench: python3 is needed to read the JSON results" >&2; exit 1; }

cargo build --release -q -p rinad -p rina-tools
BIN=${CARGO_TARGET_DIR:-target}/release
T=$(mktemp -d /tmp/rina-bench-eth.XXXXXX)
NA=rbe-$$-a; NB=rbe-$$-b; EA=rbe$$a; EB=rbe$$b
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    ip netns del "$NA" 2>/dev/null || true
    ip netns del "$NB" 2>/dev/null || true
    rm -rf "$T"
}
trap cleanup EXIT INT TERM

ip netns add "$NA"; ip netns add "$NB"
ip link add "$EA" type veth peer name "$EB"
ip link set "$EA" netns "$NA"; ip link set "$EB" netns "$NB"
for side in "$NA $EA 10.99.0.1" "$NB $EB 10.99.0.2"; do
    set -- $side
    ip netns exec "$1" sysctl -qw net.ipv6.conf.all.disable_ipv6=1
    ip netns exec "$1" ip link set lo up
    ip netns exec "$1" ip link set "$2" up
    ip netns exec "$1" ip addr add "$3/24" dev "$2"
    # 1 ms of traffic as bucket, up to 10 ms queued.
    ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$RATE" burst 125000 latency 10ms
done

# Largest SDUs (MTU 1500): shim = 1500 - 802.1Q tag (4) = 1496. A normal
# DIF adds TTL (1) + DT PCI (19) + delimiter (1): its PDUs fill the shim's
# SDU (max_pdu 1495), its largest unfragmented SDU is 1475; the DIF above
# it gets PDUs of 1474 and SDUs of 1454.
S_ETH=1496; PDU_NET=1495; S_NET=1475; PDU_TOP=1474; S_TOP=1454

# system NAME ADDR IFACE PEER PEER_ADDR
system() {
    cat <<CONF
[system]
name = "$1"

[[ipcp]]
name = "$1.10"
type = "shim-eth"
dif = "10"
interface = "$3"

[[ipcp]]
name = "$1.20"
type = "shim-eth"
dif = "20"
interface = "$3"

[[ipcp]]
name = "$1.net"
type = "normal"
dif = "net"
address = $2
max_pdu = $PDU_NET

[[ipcp.neighbor]]
name = "$4.net"
over = "20"
address = $5

[ipcp.names]
"$4.top" = $5
"perf" = 2

[[ipcp]]
name = "$1.top"
type = "normal"
dif = "top"
address = $2
max_pdu = $PDU_TOP

[[ipcp.neighbor]]
name = "$4.top"
over = "net"
address = $5

[ipcp.names]
"perf" = 2
CONF
}
system alpha 1 "$EA" beta 2 > "$T/alpha.toml"
system beta 2 "$EB" alpha 1 > "$T/beta.toml"
ip netns exec "$NB" "$BIN/rinad" --config "$T/beta.toml" --socket "$T/beta.sock" --log-level warn 2>"$T/beta.log" & PIDS+=($!)
ip netns exec "$NA" "$BIN/rinad" --config "$T/alpha.toml" --socket "$T/alpha.sock" --log-level warn 2>"$T/alpha.log" & PIDS+=($!)
up() { "$BIN/rinactl" --socket "$1" --json ipcps 2>/dev/null | python3 -c '
import json,sys
ipcps = {i["name"]: i for i in json.load(sys.stdin)}
sys.exit(0 if all(i["counters"].get("neighbors_up") == 1 for n, i in ipcps.items() if i["kind"] == "normal") else 1)' 2>/dev/null; }
for _ in $(seq 100); do up "$T/alpha.sock" && up "$T/beta.sock" && break; sleep 0.1; done
up "$T/alpha.sock" || { echo "bench: the DIFs did not come up" >&2; tail "$T"/*.log >&2; exit 1; }
RINGS=${NORINGS:+--no-rings}
for dif in 10 net top; do
    # shellcheck disable=SC2086
    ip netns exec "$NB" "$BIN/rina-perf" server --socket "$T/beta.sock" --name perf --dif "$dif" $RINGS >/dev/null 2>&1 & PIDS+=($!)
done
sleep 0.3
run() { # dif size
    echo "== rina-perf over DIF $1, $2 B, $DUR s"
    # shellcheck disable=SC2086
    ip netns exec "$NA" "$BIN/rina-perf" client --socket "$T/alpha.sock" --dst perf --dif "$1" --size "$2" \
        --duration-s "$DUR" $RINGS --json > "$T/perf-$1.json"
}
run 10 "$S_ETH"
run net "$S_NET"
run top "$S_TOP"
echo "== iperf3 (TCP) over the same link, $DUR s"
ip netns exec "$NB" iperf3 -s -1 -p 5297 >/dev/null 2>&1 & PIDS+=($!)
sleep 0.3
ip netns exec "$NA" iperf3 -c 10.99.0.2 -p 5297 -t "$DUR" -J > "$T/iperf.json"
"$BIN/rinactl" --socket "$T/beta.sock" --json ipcps > "$T/beta-ipcps.json"

python3 - "$T" "$S_ETH" "$S_NET" "$S_TOP" <<'PY'
import json, sys
t = sys.argv[1]
sizes = dict(zip(("10", "net", "top"), sys.argv[2:5]))
ip = json.load(open(f"{t}/iperf.json"))["end"]["sum_received"]["bits_per_second"] / 1e6
rx = {d: json.load(open(f"{t}/perf-{d}.json"))["tests"][0] for d in ("10", "net", "top")}
print()
print(f"{'path':38}{'SDU B':>7}{'rx Mb/s':>10}{'loss %':>9}{'vs iperf3':>11}")
print(f"{'iperf3 TCP':38}{'':>7}{ip:10.1f}{'':>9}{1.0:11.3f}")
labels = {"10": "app / shim-eth", "net": "app / normal / shim-eth", "top": "app / normal / normal / shim-eth"}
for d in ("10", "net", "top"):
    r = rx[d]
    print(f"{labels[d]:38}{sizes[d]:>7}{r['rx_mbps']:10.1f}{r['loss_pct']:9.2f}{r['rx_mbps']/ip:11.3f}")
print()
print("ratios to iperf3: " + ", ".join(f"{rx[d]['rx_mbps']/ip*100:.1f}%" for d in ("10", "net", "top"))
      + "  (aim 95% / 94% / 93%; IRATI 93.6% / 93.0% / 91.9%)")
PY
