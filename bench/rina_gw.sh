#!/usr/bin/env bash
# rina-gw benchmark (not a timed test): in one run on this machine,
#   * iperf3 TCP on loopback, client to server (no RINA),
#   * iperf3 TCP through rina-gw: the client's connection accepted by the
#     gateway at alpha, carried on a reliable flow of a normal DIF over
#     shim-udp on loopback to the gateway at beta, which connects to the
#     same server,
# in ROUNDS alternated rounds, and prints both goodputs (medians) and
# their ratio. Needs iperf3 and python3 (iperf3 installed with apt when
# run as root); no root otherwise.
#
#   bash bench/rina_gw.sh            # DUR=5 seconds per measurement, ROUNDS=3
#   NO_BUILD=1 BIN=/other/target/release bash bench/rina_gw.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-5}
ROUNDS=${ROUNDS:-3}
if ! command -v iperf3 >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        apt-get install -y iperf3 >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y iperf3 >/dev/null; }
    else
        echo "bench: iperf3 is missing; install it (apt-get install iperf3) or run as root" >&2
        exit 1
    fi
fi
[ -n "${NO_BUILD:-}" ] || cargo build --release -q -p rinad -p rina-tools
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release}
T=$(mktemp -d /tmp/rina-bench-gw.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$T"
}
trap cleanup EXIT INT TERM

free_port() { python3 -c 'import socket,sys; s=socket.socket(socket.AF_INET, getattr(socket, sys.argv[1])); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' "$1"; }
PA=$(free_port SOCK_DGRAM); PB=$(free_port SOCK_DGRAM)
SRV=$(free_port SOCK_STREAM); GW=$(free_port SOCK_STREAM)

# system NAME ADDR PORT PEER PEER_ADDR PEER_PORT
system() {
    cat <<CONF
[system]
name = "$1"
[[ipcp]]
name = "$1.udp"
type = "shim-udp"
dif = "udp"
bind = "127.0.0.1:$3"
[ipcp.directory]
"$4.net" = "127.0.0.1:$6"
[[ipcp]]
name = "$1.net"
type = "normal"
dif = "net"
address = $2
[[ipcp.neighbor]]
name = "$4.net"
over = "udp"
address = $5
[ipcp.names]
"iperf" = 2
CONF
}
system alpha 1 "$PA" beta 2 "$PB" >"$T/alpha.toml"
system beta 2 "$PB" alpha 1 "$PA" >"$T/beta.toml"
for s in alpha beta; do
    "$BIN/rinad" --config "$T/$s.toml" --socket "$T/$s.sock" --log-level warn >"$T/rinad-$s.log" 2>&1 &
    PIDS+=($!)
done
for s in alpha beta; do
    for _ in $(seq 100); do [ -S "$T/$s.sock" ] && break; sleep 0.1; done
done
for _ in $(seq 100); do
    "$BIN/rinactl" --socket "$T/alpha.sock" --json ipcps 2>/dev/null |
        python3 -c 'import json,sys; sys.exit(0 if any(i["name"]=="alpha.net" and i["counters"]["neighbors_up"]==1 for i in json.load(sys.stdin)) else 1)' && break
    sleep 0.2
done
iperf3 -s -B 127.0.0.1 -p "$SRV" >/dev/null 2>&1 &
PIDS+=($!)
"$BIN/rina-gw" --socket "$T/beta.sock" --dif net --rina-to-tcp "iperf=127.0.0.1:$SRV" >"$T/gw-b.out" 2>"$T/gw-b.log" &
PIDS+=($!)
for _ in $(seq 100); do [ -s "$T/gw-b.out" ] && break; sleep 0.1; done
"$BIN/rina-gw" --socket "$T/alpha.sock" --dif net --tcp-to-rina "127.0.0.1:$GW=iperf" >"$T/gw-a.out" 2>"$T/gw-a.log" &
PIDS+=($!)
for _ in $(seq 100); do [ -s "$T/gw-a.out" ] && break; sleep 0.1; done
for _ in $(seq 50); do python3 -c "import socket; socket.create_connection(('127.0.0.1', $SRV), 1)" 2>/dev/null && break; sleep 0.1; done

goodput() { # PORT -> Mb/s received
    iperf3 -c 127.0.0.1 -p "$1" -t "$DUR" -J |
        python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e6))'
}
direct=(); gw=()
for r in $(seq "$ROUNDS"); do
    direct+=("$(goodput "$SRV")")
    gw+=("$(goodput "$GW")")
    echo "round $r: loopback ${direct[-1]} Mb/s, through rina-gw ${gw[-1]} Mb/s"
done
python3 - "${direct[*]}" "${gw[*]}" <<'PY'
import statistics, sys
d = [float(x) for x in sys.argv[1].split()]
g = [float(x) for x in sys.argv[2].split()]
md, mg = statistics.median(d), statistics.median(g)
ratios = [b / a for a, b in zip(d, g)]
print(f"iperf3 TCP on loopback {md:,.0f} Mb/s; through two rina-gw and a normal DIF {mg:,.0f} Mb/s; "
      f"ratio {statistics.median(ratios):.3f} (per round {', '.join(f'{x:.3f}' for x in ratios)})")
PY
echo "sessions (alpha's gateway):"
cat "$T/gw-a.log"
