#!/usr/bin/env bash
# Foundation benchmark (not a timed test): in one run on this machine,
#   * rina-perf over a shim-udp DIF, 1400-byte SDUs   vs  iperf3 -u -l 1400 -b 0
#   * rina-echo round-trip time, 64-byte SDUs          vs  sockperf ping-pong (UDP),
#     through the daemons and on a direct flow (--direct: the two
#     applications' UDP sockets carry the probes, the daemons only set the
#     flow up), and through a second pair of daemons that busy-poll
#     (busy_poll_us = BUSY_POLL_US, default 2000), with their CPU;
#     and, with every process pinned to vCPU PIN_CPU (default 0; PIN_CPU=
#     skips it), the echo, sockperf and sockperf through two relays again:
#     a wake-up is then a task switch, so the ratios show the daemons' own
#     work, not what waking an idle core costs on the host
# all on loopback, and prints the ratios. Needs iperf3, sockperf and python3;
# as root it installs iperf3 and sockperf with apt when they are missing.
#
#   bash bench/foundation.sh            # 5 s per measurement
#   DUR=10 bash bench/foundation.sh
#   RESULTS=f.json bash bench/foundation.sh   # also write the figures as JSON
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-5}
PROBES=${PROBES:-2000}       # echo probes, 1 ms apart (sockperf runs at 1000 msg/s too)
BUSY_POLL_US=${BUSY_POLL_US:-2000}   # the busy-polling daemons' window: longer than the probes' gap
CLIENT_POLL_US=${CLIENT_POLL_US:-0}  # the echo client's own window there (rina-echo --busy-poll-us)
PIN_CPU=${PIN_CPU-0}         # the vCPU of the pinned round trips ('' skips them)

for tool in iperf3 sockperf; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        if [ "$(id -u)" = 0 ]; then
            apt-get install -y "$tool" >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y "$tool" >/dev/null; }
        else
            echo "bench: $tool is missing; install it (apt-get install $tool) or run as root" >&2
            exit 1
        fi
    fi
done
command -v python3 >/dev/null || { echo "bench: python3 is needed to read the JSON results" >&2; exit 1; }

cargo build --release -q
cargo build --release -q -p rina-tools --example udp_relay
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release}
RELAY=$BIN/examples/udp_relay
T=$(mktemp -d /tmp/rina-bench.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$T"
}
trap cleanup EXIT INT TERM

wait_sock() { # path
    for _ in $(seq 100); do
        "$BIN/rinactl" --socket "$1" ipcps >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "bench: rinad on $1 did not come up" >&2; exit 1
}

# A pair of daemons, beta$1 serving and alpha$1 asking, joined by shim-udp;
# $2 is a line for their [system] sections.
daemon_pair() {
    local sfx=$1 extra=$2
    cat > "$T/beta$sfx.toml" <<CONF
[system]
name = "beta$sfx"
$extra
[[ipcp]]
name = "beta$sfx.udp"
type = "shim-udp"
dif = "udp"
bind = "127.0.0.1:0"
CONF
    "$BIN/rinad" --config "$T/beta$sfx.toml" --socket "$T/beta$sfx.sock" --log-level warn 2>"$T/beta$sfx.log" & PIDS+=($!)
    BETA_PID=$!
    wait_sock "$T/beta$sfx.sock"
    local beta
    beta=$("$BIN/rinactl" --socket "$T/beta$sfx.sock" --json ipcps | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["address"])')
    cat > "$T/alpha$sfx.toml" <<CONF
[system]
name = "alpha$sfx"
$extra
[[ipcp]]
name = "alpha$sfx.udp"
type = "shim-udp"
dif = "udp"
bind = "127.0.0.1:0"
[ipcp.directory]
"perf" = "$beta"
"echo" = "$beta"
"echo-direct" = "$beta"
CONF
    "$BIN/rinad" --config "$T/alpha$sfx.toml" --socket "$T/alpha$sfx.sock" --log-level warn 2>"$T/alpha$sfx.log" & PIDS+=($!)
    ALPHA_PID=$!
    wait_sock "$T/alpha$sfx.sock"
}

# CPU seconds (user + system) the processes have used so far.
cpu_s() {
    local tck sum=0 p
    tck=$(getconf CLK_TCK)
    for p in "$@"; do
        sum=$((sum + $(awk '{print $14 + $15}' "/proc/$p/stat")))
    done
    python3 -c "print($sum / $tck)"
}

daemon_pair "" ""
"$BIN/rina-perf" server --socket "$T/beta.sock" --name perf >/dev/null 2>&1 & PIDS+=($!)
"$BIN/rina-echo" server --socket "$T/beta.sock" --name echo >/dev/null 2>&1 & PIDS+=($!)
"$BIN/rina-echo" server --socket "$T/beta.sock" --name echo-direct --direct >/dev/null 2>&1 & PIDS+=($!)
sleep 0.3

echo "== rina-perf over shim-udp, 1400 B, ${DUR} s"
"$BIN/rina-perf" client --socket "$T/alpha.sock" --dst perf --size 1400 --duration-s "$DUR" --json > "$T/perf.json"
echo "== iperf3 -u -l 1400 -b 0, ${DUR} s"
iperf3 -s -1 -p 5299 >/dev/null 2>&1 & PIDS+=($!)
sleep 0.3
iperf3 -c 127.0.0.1 -p 5299 -u -l 1400 -b 0 -t "$DUR" -J > "$T/iperf.json"
echo "== rina-echo, 64 B, $PROBES probes 1 ms apart"
"$BIN/rina-echo" client --socket "$T/alpha.sock" --dst echo --size 64 --count "$PROBES" --interval-ms 1 --json > "$T/echo.json"
echo "== rina-echo on a direct flow, 64 B, $PROBES probes 1 ms apart"
"$BIN/rina-echo" client --socket "$T/alpha.sock" --dst echo-direct --direct --size 64 --count "$PROBES" --interval-ms 1 --json > "$T/echo-direct.json"
echo "== sockperf ping-pong UDP, 64 B, 1000 msg/s, ${DUR} s"
sockperf server -i 127.0.0.1 -p 11199 >/dev/null 2>&1 & PIDS+=($!)
sleep 0.3
sockperf ping-pong -i 127.0.0.1 -p 11199 -m 64 -t "$DUR" --mps=1000 --full-rtt > "$T/sockperf.txt" 2>&1
# The floor of any design with a daemon at each end: the same sockperf
# through two plain UDP relays (crates/rina-tools/examples/udp_relay.rs),
# which sleep in recv as the daemons do and do nothing else, so that a
# datagram makes three hops each way, as through rinad, not one.
echo "== sockperf ping-pong through two UDP relays (no RINA), 64 B, 1000 msg/s, ${DUR} s"
"$RELAY" 127.0.0.1:11202 127.0.0.1:11199 >/dev/null 2>&1 & PIDS+=($!)
"$RELAY" 127.0.0.1:11201 127.0.0.1:11202 >/dev/null 2>&1 & PIDS+=($!)
sleep 0.3
sockperf ping-pong -i 127.0.0.1 -p 11201 -m 64 -t "$DUR" --mps=1000 --full-rtt > "$T/sockperf-relayed.txt" 2>&1
echo "== rina-echo through daemons that busy-poll for ${BUSY_POLL_US} us, 64 B, $PROBES probes 1 ms apart"
daemon_pair "-poll" "busy_poll_us = $BUSY_POLL_US"
"$BIN/rina-echo" server --socket "$T/beta-poll.sock" --name echo >/dev/null 2>&1 & PIDS+=($!)
sleep 0.3
c0=$(cpu_s "$ALPHA_PID" "$BETA_PID"); w0=$(date +%s.%N)
"$BIN/rina-echo" client --socket "$T/alpha-poll.sock" --dst echo --size 64 --count "$PROBES" --interval-ms 1 --busy-poll-us "$CLIENT_POLL_US" --json > "$T/echo-poll.json"
c1=$(cpu_s "$ALPHA_PID" "$BETA_PID"); w1=$(date +%s.%N)
python3 -c "print('{\"daemons_cores\": %.3f}' % (($c1 - $c0) / ($w1 - $w0)))" > "$T/poll-cpu.json"
kill "$ALPHA_PID" "$BETA_PID" 2>/dev/null || true
if [ -n "$PIN_CPU" ]; then
    # The same round trips with every process on one vCPU. On a VM whose
    # idle vCPUs are slow to wake (about 40 us each on the project's
    # machine), where the processes of a round trip run decides much of
    # its time; pinned, each hop costs what its process does.
    echo "== pinned to vCPU $PIN_CPU: rina-echo through the daemons, sockperf, sockperf through two relays, ${DUR} s each"
    daemon_pair "-pin" ""
    taskset -a -c -p "$PIN_CPU" "$ALPHA_PID" >/dev/null
    taskset -a -c -p "$PIN_CPU" "$BETA_PID" >/dev/null
    taskset -c "$PIN_CPU" "$BIN/rina-echo" server --socket "$T/beta-pin.sock" --name echo >/dev/null 2>&1 & PIDS+=($!)
    sleep 0.3
    taskset -c "$PIN_CPU" "$BIN/rina-echo" client --socket "$T/alpha-pin.sock" --dst echo --size 64 --count "$PROBES" --interval-ms 1 --json > "$T/echo-pin.json"
    kill "$ALPHA_PID" "$BETA_PID" 2>/dev/null || true
    taskset -c "$PIN_CPU" sockperf server -i 127.0.0.1 -p 11299 >/dev/null 2>&1 & PIDS+=($!)
    taskset -c "$PIN_CPU" "$RELAY" 127.0.0.1:11302 127.0.0.1:11299 >/dev/null 2>&1 & PIDS+=($!)
    taskset -c "$PIN_CPU" "$RELAY" 127.0.0.1:11301 127.0.0.1:11302 >/dev/null 2>&1 & PIDS+=($!)
    sleep 0.3
    taskset -c "$PIN_CPU" sockperf ping-pong -i 127.0.0.1 -p 11299 -m 64 -t "$DUR" --mps=1000 --full-rtt > "$T/sockperf-pin.txt" 2>&1
    taskset -c "$PIN_CPU" sockperf ping-pong -i 127.0.0.1 -p 11301 -m 64 -t "$DUR" --mps=1000 --full-rtt > "$T/sockperf-relayed-pin.txt" 2>&1
fi

python3 - "$T" <<'PY'
import json, re, sys
t = sys.argv[1]
perf = json.load(open(f"{t}/perf.json"))["tests"][0]
ip = json.load(open(f"{t}/iperf.json"))["end"]["sum"]
echo = json.load(open(f"{t}/echo.json"))
direct = json.load(open(f"{t}/echo-direct.json"))
poll = json.load(open(f"{t}/echo-poll.json"))
poll_cores = json.load(open(f"{t}/poll-cpu.json"))["daemons_cores"]
def percentiles(name, port):
    sp = open(f"{t}/{name}").read()
    pct = {float(m.group(1)): float(m.group(2)) for m in re.finditer(r"percentile\s+([\d.]+)\s*=\s*([\d.]+)", sp)}
    if 50.0 not in pct or 99.0 not in pct:
        sys.exit(f"bench: sockperf gave no percentiles (is port {port} taken?); its output ends:\n" + sp[-600:])
    return pct
pct = percentiles("sockperf.txt", 11199)
relayed = percentiles("sockperf-relayed.txt", 11201)
rina_rx, ip_rx = perf["rx_mbps"], ip["bits_per_second"] / 1e6
rina_p50, sp_p50 = echo["rtt_ms"]["p50"] * 1000, pct[50.0]
rina_p99, sp_p99 = echo["rtt_ms"]["p99"] * 1000, pct[99.0]
direct_p50, direct_p99 = direct["rtt_ms"]["p50"] * 1000, direct["rtt_ms"]["p99"] * 1000
print()
print(f"{'':28}{'RINA':>12}{'baseline':>12}{'ratio':>9}")
print(f"{'goodput rx, Mb/s':28}{rina_rx:12.1f}{ip_rx:12.1f}{rina_rx/ip_rx:9.2f}   (aim >= 1.00)")
print(f"{'loss, %':28}{perf['loss_pct']:12.2f}{ip.get('lost_percent', 0):12.2f}")
print(f"{'RTT p50, us':28}{rina_p50:12.1f}{sp_p50:12.1f}{rina_p50/sp_p50:9.2f}   (aim <= 1.30)")
print(f"{'RTT p99, us':28}{rina_p99:12.1f}{sp_p99:12.1f}{rina_p99/sp_p99:9.2f}")
print(f"{'direct flow RTT p50, us':28}{direct_p50:12.1f}{sp_p50:12.1f}{direct_p50/sp_p50:9.2f}   (aim <= 1.30)")
print(f"{'direct flow RTT p99, us':28}{direct_p99:12.1f}{sp_p99:12.1f}{direct_p99/sp_p99:9.2f}")
poll_p50, poll_p99 = poll["rtt_ms"]["p50"] * 1000, poll["rtt_ms"]["p99"] * 1000
print(f"{'busy-polling RTT p50, us':28}{poll_p50:12.1f}{sp_p50:12.1f}{poll_p50/sp_p50:9.2f}   (aim <= 1.30)")
print(f"{'busy-polling RTT p99, us':28}{poll_p99:12.1f}{sp_p99:12.1f}{poll_p99/sp_p99:9.2f}")
print(f"  (the two busy-polling daemons used {poll_cores:.2f} cores together during their echo run)")
relay_p50 = relayed[50.0]
print(f"{'via 2 UDP relays p50, us':28}{relay_p50:12.1f}{sp_p50:12.1f}{relay_p50/sp_p50:9.2f}   (the floor with a daemon at each end)")
print(f"  (rina-echo through the daemons takes {rina_p50/relay_p50:.2f}x the round trip through two relays that do no work)")
import os
pinned = {}
if os.path.exists(f"{t}/echo-pin.json"):
    pin_p50 = json.load(open(f"{t}/echo-pin.json"))["rtt_ms"]["p50"] * 1000
    sp_pin = percentiles("sockperf-pin.txt", 11299)[50.0]
    relay_pin = percentiles("sockperf-relayed-pin.txt", 11301)[50.0]
    print("every process on one vCPU (a wake-up is a task switch, not an idle core's wake-up):")
    print(f"{'pinned RTT p50, us':28}{pin_p50:12.1f}{sp_pin:12.1f}{pin_p50/sp_pin:9.2f}   (no aim)")
    print(f"{'pinned via 2 relays p50, us':28}{relay_pin:12.1f}{sp_pin:12.1f}{relay_pin/sp_pin:9.2f}")
    print(f"  (pinned, rina-echo through the daemons takes {pin_p50/relay_pin:.2f}x the round trip through the two relays)")
    pinned = {"echo_pinned_p50_us": pin_p50, "sockperf_pinned_p50_us": sp_pin,
              "echo_pinned_rtt_ratio": pin_p50 / sp_pin, "relayed_pinned_p50_us": relay_pin,
              "echo_over_relay_pinned_ratio": pin_p50 / relay_pin}
if os.environ.get("RESULTS"):
    json.dump({"shim_udp_mbps": rina_rx, "iperf3_udp_mbps": ip_rx, "shim_udp_ratio": rina_rx / ip_rx,
               "echo_p50_us": rina_p50, "sockperf_p50_us": sp_p50, "echo_rtt_ratio": rina_p50 / sp_p50,
               "echo_direct_p50_us": direct_p50, "echo_direct_rtt_ratio": direct_p50 / sp_p50,
               "echo_busy_poll_p50_us": poll_p50, "echo_busy_poll_rtt_ratio": poll_p50 / sp_p50,
               "busy_poll_daemons_cores": poll_cores,
               "relayed_sockperf_p50_us": relay_p50, "relay_floor_ratio": relay_p50 / sp_p50,
               "echo_over_relay_ratio": rina_p50 / relay_p50, **pinned},
              open(os.environ["RESULTS"], "w"))
PY
