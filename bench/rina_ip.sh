#!/usr/bin/env bash
# rina-ip benchmark (not a timed test): in one run on this machine, two
# network namespaces joined by a veth pair;
#   * iperf3 TCP over the veth itself (no RINA),
#   * iperf3 TCP through rina-ip: TUN -> flow of a normal DIF over a shim
#     DIF over UDP over the same veth -> TUN,
# and prints both goodputs and their ratio. Needs root, iproute2, iperf3.
#
#   sudo bash bench/rina_ip.sh          # DUR=5 seconds per measurement
#   ROUNDS=5 bash bench/rina_ip.sh      # rounds of veth, rina-ip, plain tunnel (3)
#   QOS=reliable MTU=1400 bash bench/rina_ip.sh
#   MAX_PDU=9000 RINGS=0 bash bench/rina_ip.sh   # the DIF's default PDU size, sockets
#   VETH_MTU=9000 MAX_PDU=8950 bash bench/rina_ip.sh   # jumbo frames on the veth
#   OFFLOAD=0 bash bench/rina_ip.sh     # TUNs without checksum offload
#   KEEP=1 bash bench/rina_ip.sh        # leave the namespaces for a look
#   NO_BUILD=1 bash bench/rina_ip.sh    # use the binaries already built
#   RESULTS=f.json bash bench/rina_ip.sh  # also write the figures as JSON
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-5}
# Rounds of the three goodputs (veth, rina-ip, plain tunnel), alternated so
# that the host's drift falls on all three alike; the figures are medians,
# each ratio the median of the rounds' ratios.
ROUNDS=${ROUNDS:-3}
QOS=${QOS:-unreliable}
MTU=${MTU:-}
# The normal DIF's largest PDU: small enough that a PDU and its shim-udp
# datagram cross the veth's 1500-byte MTU without IP fragmentation (the
# daemon then sends a turn's PDUs as one segmentation-offloaded batch).
# MAX_PDU=9000 (rinad's default) shows what fragmentation costs.
MAX_PDU=${MAX_PDU:-1450}
# The veth's MTU (the kernel's default, 1500, unless set): VETH_MTU=9000
# MAX_PDU=8950 shows what jumbo frames do (fewer, larger PDUs, each still
# one datagram on the wire).
VETH_MTU=${VETH_MTU:-}
# rina-ip talks to rinad through shared-memory rings (its default);
# RINGS=0 makes it use the flows' sockets.
RINGS=${RINGS:-1}
RINGS_TOML=true; [ "$RINGS" = 0 ] && RINGS_TOML=false
# rina-ip leaves TCP/UDP checksums partial across the tunnel (its default);
# OFFLOAD=0 makes each kernel sum them, as a TUN without offload does.
OFFLOAD=${OFFLOAD:-1}
OFFLOAD_TOML=true; [ "$OFFLOAD" = 0 ] && OFFLOAD_TOML=false
if [ "$(id -u)" != 0 ]; then
    echo "bench: needs root (network namespaces, TUN)" >&2
    exit 1
fi
# The tools, installed with apt where missing (ping tells when the tunnel
# is up; a fresh machine may have iproute2 without it).
for c in ip:iproute2 iperf3:iperf3 ping:iputils-ping; do
    command -v "${c%%:*}" >/dev/null 2>&1 && continue
    if command -v apt-get >/dev/null 2>&1; then
        apt-get install -y "${c#*:}" >/dev/null 2>&1 ||
            { apt-get update >/dev/null && apt-get install -y "${c#*:}" >/dev/null; }
    fi
    command -v "${c%%:*}" >/dev/null 2>&1 ||
        { echo "bench: ${c%%:*} is missing (apt-get install ${c#*:})" >&2; exit 1; }
done
[ -n "${NO_BUILD:-}" ] || cargo build --release -q -p rinad -p rina-tools
cargo build --release -q -p rina-tools --example udp_tunnel
BIN=${CARGO_TARGET_DIR:-target}/release
BIN=$(cd "$BIN" && pwd)
T=$(mktemp -d /tmp/rina-bench-ip.XXXXXX)
ID=$$
NA=ripbA$ID NB=ripbB$ID VA=rbva$ID VB=rbvb$ID
PIDS=()
cleanup() {
    [ -n "${KEEP:-}" ] && { echo "kept: netns $NA $NB, files in $T"; return; }
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    ip netns del "$NA" 2>/dev/null || true
    ip netns del "$NB" 2>/dev/null || true
    rm -rf "$T"
}
trap cleanup EXIT INT TERM

ip netns add "$NA"
ip netns add "$NB"
ip link add "$VA" type veth peer name "$VB"
ip link set "$VA" netns "$NA"
ip link set "$VB" netns "$NB"
ip -n "$NA" addr add 172.30.9.1/24 dev "$VA"
ip -n "$NB" addr add 172.30.9.2/24 dev "$VB"
for n in "$NA" "$NB"; do ip -n "$n" link set lo up; done
if [ -n "$VETH_MTU" ]; then
    ip -n "$NA" link set "$VA" mtu "$VETH_MTU"
    ip -n "$NB" link set "$VB" mtu "$VETH_MTU"
fi
ip -n "$NA" link set "$VA" up
ip -n "$NB" link set "$VB" up

# rinad config: ME ADDR MY_IP PEER PEER_ADDR PEER_IP PEER_APP
system() {
    cat <<CONF
[system]
name = "$1"
[[ipcp]]
name = "$1.udp"
type = "shim-udp"
dif = "udp"
bind = "$3:7101"
[ipcp.directory]
"$4.net" = "$6:7101"
[[ipcp]]
name = "$1.net"
type = "normal"
dif = "net"
address = $2
max_pdu = $MAX_PDU
[[ipcp.neighbor]]
name = "$4.net"
over = "udp"
address = $5
[ipcp.names]
"$7" = $5
CONF
}
# rina-ip config: ME TUN_V4 TUN_V6 PEER PEER_V4 PEER_V6
tunnel() {
    cat <<CONF
name = "$1"
dif = "net"
socket = "$T/$1.rinad.sock"
status_socket = "$T/$1.status.sock"
rings = $RINGS_TOML
[tun]
name = "rbench0"
checksum_offload = $OFFLOAD_TOML
addresses = ["$2/24", "$3/64"]
${MTU:+mtu = $MTU}
[[peer]]
name = "$4"
prefixes = ["$5/32", "$6/128"]
qos = "$QOS"
CONF
}
system a 1 172.30.9.1 b 2 172.30.9.2 ip-b >"$T/a.toml"
system b 2 172.30.9.2 a 1 172.30.9.1 ip-a >"$T/b.toml"
tunnel ip-a 10.201.0.1 fd21::1 ip-b 10.201.0.2 fd21::2 >"$T/ip-a.toml"
tunnel ip-b 10.201.0.2 fd21::2 ip-a 10.201.0.1 fd21::1 >"$T/ip-b.toml"

for s in a b; do
    ns=$NA; [ $s = b ] && ns=$NB
    ip netns exec "$ns" "$BIN/rinad" --config "$T/$s.toml" --socket "$T/ip-$s.rinad.sock" \
        --log-level warn >"$T/rinad-$s.log" 2>&1 &
    PIDS+=($!)
done
for s in a b; do
    ns=$NA; [ $s = b ] && ns=$NB
    for _ in $(seq 100); do [ -S "$T/ip-$s.rinad.sock" ] && break; sleep 0.1; done
    ip netns exec "$ns" "$BIN/rina-ip" --config "$T/ip-$s.toml" >"$T/rina-ip-$s.log" 2>&1 &
    PIDS+=($!)
done
# Wait (up to 30 s) for the tunnel: a ping through it answers.
up=""
for _ in $(seq 60); do
    if ip netns exec "$NA" ping -c 1 -W 1 10.201.0.2 >/dev/null 2>&1; then up=1; break; fi
    sleep 0.5
done
[ -n "$up" ] || { echo "bench: the tunnel did not come up"; cat "$T"/rina-ip-*.log; exit 1; }

ip netns exec "$NB" iperf3 -s >/dev/null 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do ip netns exec "$NB" ss -ltn | grep -q ':5201 ' && break; sleep 0.1; done

goodput() { # DEST -> Mb/s received
    ip netns exec "$NA" iperf3 -c "$1" -t "$DUR" -J \
        | python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e6))'
}
# The floor of any userspace tunnel here: a plain IP-over-UDP tunnel
# (crates/rina-tools/examples/udp_tunnel.rs: TUNs with the same offload and
# MTU, datagrams of the same size sent offloaded, no RINA) over the same veth.
for s in a b; do
    ns=$NA me=172.30.9.1 peer=172.30.9.2 tip=10.203.0.1; [ $s = b ] && ns=$NB me=172.30.9.2 peer=172.30.9.1 tip=10.203.0.2
    SEG=$((MAX_PDU - 16)) ip netns exec "$ns" "$BIN/examples/udp_tunnel" rbplain0 "$tip/24" "$me:7301" "$peer:7301" \
        >"$T/plain-$s.log" 2>&1 &
    PIDS+=($!)
done
for _ in $(seq 40); do ip netns exec "$NA" ping -c 1 -W 1 10.203.0.2 >/dev/null 2>&1 && break; sleep 0.25; done
BASES=() TUNS=() PLAINS=()
for r in $(seq "$ROUNDS"); do
    BASES+=("$(goodput 172.30.9.2)")
    TUNS+=("$(goodput 10.201.0.2)")
    PLAINS+=("$(goodput 10.203.0.2)")
    echo "  round $r: veth ${BASES[-1]}, rina-ip ${TUNS[-1]}, plain tunnel ${PLAINS[-1]} Mb/s" >&2
done
# Medians: BASE TUN PLAIN, rina-ip / veth, plain / veth, rina-ip / plain;
# then each round's rina-ip / veth.
read -r BASE TUN PLAIN R_TUN R_PLAIN R_OVER R_ROUNDS <<<"$(python3 -c "
import statistics as st
b, t, p = [${BASES[*]/%/,}], [${TUNS[*]/%/,}], [${PLAINS[*]/%/,}]
m = lambda v: st.median(v)
rt = [y / x for x, y in zip(b, t)]
print('%.1f %.1f %.1f %.3f %.3f %.3f' % (m(b), m(t), m(p), m(rt),
      m([y / x for x, y in zip(b, p)]), m([y / x for x, y in zip(p, t)])),
      ','.join('%.3f' % r for r in rt))")"
# Where the CPU goes: each process's CPU time (user + system, from
# /proc/PID/stat) while CPU_BYTES cross the tunnel, per GB. Steadier than
# the goodput on a shared machine, and it says which side to work on.
CPU_BYTES=${CPU_BYTES:-2G}
HZ=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
before=(); for p in "${PIDS[@]:0:4}"; do before+=("$(cpu_ticks "$p")"); done
XFER=$(ip netns exec "$NA" iperf3 -c 10.201.0.2 -n "$CPU_BYTES" -J \
    | python3 -c 'import json,sys; e=json.load(sys.stdin)["end"]; print(e["sum_received"]["bytes"], e["sum_sent"].get("retransmits", 0))')
after=(); for p in "${PIDS[@]:0:4}"; do after+=("$(cpu_ticks "$p")"); done
read -r XFER_BYTES RETRANS <<<"$XFER"
CPU_GB=$(python3 -c "
b, a, hz, gb = [${before[*]/%/,}], [${after[*]/%/,}], $HZ, $XFER_BYTES / 1e9
print(' '.join('%.3f' % ((y - x) / hz / gb) for x, y in zip(b, a)))")
read -r CPU_RINAD_TX CPU_RINAD_RX CPU_IP_TX CPU_IP_RX <<<"$CPU_GB"
MTU_NOW=$(ip netns exec "$NA" cat /sys/class/net/rbench0/mtu)
RTT=$(ip netns exec "$NA" ping -c 10 -i 0.1 -q 10.201.0.2 | sed -n 's/.*= \([0-9.]*\)\/\([0-9.]*\)\/.*/\2/p')
RTT0=$(ip netns exec "$NA" ping -c 10 -i 0.1 -q 172.30.9.2 | sed -n 's/.*= \([0-9.]*\)\/\([0-9.]*\)\/.*/\2/p')
echo "rina-ip benchmark: iperf3 TCP, ${DUR} s each, medians of $ROUNDS alternated rounds, QoS $QOS, TUN MTU $MTU_NOW, DIF max PDU $MAX_PDU, veth MTU ${VETH_MTU:-1500}, rings $RINGS_TOML, checksum offload $OFFLOAD_TOML"
printf "  veth, no RINA        %10s Mb/s   ping avg %s ms\n" "$BASE" "$RTT0"
printf "  through rina-ip      %10s Mb/s   ping avg %s ms\n" "$TUN" "$RTT"
echo "  ratio rina-ip / veth  $R_TUN   (per round: ${R_ROUNDS//,/, })"
printf "  plain UDP tunnel     %10s Mb/s   (no RINA: the floor of a userspace tunnel)\n" "$PLAIN"
echo "  ratio plain tunnel / veth $R_PLAIN, rina-ip / plain tunnel $R_OVER"
echo "  CPU seconds per GB through the tunnel ($CPU_BYTES, $RETRANS TCP retransmissions):"
echo "    rinad sending $CPU_RINAD_TX, rinad receiving $CPU_RINAD_RX, rina-ip sending $CPU_IP_TX, rina-ip receiving $CPU_IP_RX"
if [ -n "${RESULTS:-}" ]; then
    python3 -c "import json; json.dump({'veth_mbps': $BASE, 'rina_ip_mbps': $TUN, 'rina_ip_ratio': $R_TUN, 'cpu_s_per_gb': {'rinad_tx': $CPU_RINAD_TX, 'rinad_rx': $CPU_RINAD_RX, 'rina_ip_tx': $CPU_IP_TX, 'rina_ip_rx': $CPU_IP_RX}, 'tcp_retransmits': $RETRANS, 'plain_tunnel_mbps': $PLAIN, 'plain_tunnel_ratio': $R_PLAIN, 'rina_ip_over_plain': $R_OVER, 'rounds': {'veth_mbps': [${BASES[*]/%/,}], 'rina_ip_mbps': [${TUNS[*]/%/,}], 'plain_tunnel_mbps': [${PLAINS[*]/%/,}]}}, open('$RESULTS', 'w'))"
fi
echo
ip netns exec "$NA" "$BIN/rina-ip" --status --status-socket "$T/ip-a.status.sock"
