#!/usr/bin/env bash
# Shim-hv benchmark (seed 001 Fig. 4; not a timed test), on one machine with
# processes standing in for the host and the VMs, in one run:
#   (a) rina-perf directly over a shim-hv DIF (guest -> host), SDU sizes
#       250..4000 step 250, then 8 KiB, 16 KiB, 32 KiB, 64 KiB;
#       against iperf3 UDP (-l SIZE -b 0) and TCP (-l SIZE) over loopback;
#   (b) rina-perf over a normal DIF over two shim-hv DIFs (VM1 -> host -> VM2),
#       on a cube with window flow control and no retransmission;
#   (c) latency: rina-echo round trips of 64-byte SDUs guest -> host -> guest
#       (one every 2 ms), and the CPU time both idle daemons of (a) burn in
#       IDLE seconds (with doorbells they sleep; polling wakes them 1000/s).
# The application uses shared-memory rings with rinad (rina-perf's default;
# NORINGS=1 passes --no-rings, one system call per SDU on the flow socket).
# Prints one table (goodput in Mb/s, receiver side: iperf3 UDP is what its
# server received) and the ratio of (a) to iperf3 UDP per size (aim: >= 1.5
# from 1400 B up), and writes it as CSV (sdu_bytes, shim_hv_bps,
# iperf3_udp_bps, iperf3_tcp_bps, normal_over_hv_bps, iperf3_udp_sent_bps)
# to $CSV, and as a rina-lab run with its plot next to it. Needs iperf3
# and python3; as root it installs iperf3 with apt when missing. No root
# needed otherwise.
#
#   bash bench/shim_hv.sh                 # DUR=3 seconds per size
#   DUR=1 BUSY=true bash bench/shim_hv.sh # busy-polling shims
#   BIN=/some/release NOBUILD=1 bash bench/shim_hv.sh   # other binaries
#   SIZES=1400,65536 bash bench/shim_hv.sh              # some sizes only
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-3}
RINGS=${NORINGS:+--no-rings}
BUSY=${BUSY:-false}
IDLE=${IDLE:-5}
if ! command -v iperf3 >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get install -y iperf3 >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y iperf3 >/dev/null; }
fi
command -v iperf3 >/dev/null || { echo "bench: iperf3 is needed" >&2; exit 1; }
command -v python3 >/dev/null || { echo "bench: python3 is needed" >&2; exit 1; }

[ -n "${NOBUILD:-}" ] || cargo build --release -q -p rinad -p rina-tools -p rina-lab
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release}
CSV=${CSV:-${CARGO_TARGET_DIR:-target}/shim_hv.csv}
T=$(mktemp -d /tmp/rina-bench-hv.XXXXXX)
SHM=/dev/shm/rina-bench-hv-$$
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$T" "$SHM"-*
}
trap cleanup EXIT INT TERM

SIZES=${SIZES:-$(python3 -c 'print(",".join(str(s) for s in list(range(250, 4001, 250)) + [8192, 16384, 32768, 65536]))')}

wait_up() { # socket ipcp-index
    for _ in $(seq 200); do
        if "$BIN/rinactl" --socket "$1" --json ipcps 2>/dev/null |
            python3 -c 'import json,sys; sys.exit(0 if all(i["counters"].get("peer_up",1)==1 for i in json.load(sys.stdin)) else 1)'; then
            return 0
        fi
        sleep 0.05
    done
    echo "bench: $1 did not come up" >&2; exit 1
}

hv() { # system ipcp dif path side
    printf '\n[[ipcp]]\nname = "%s.%s"\ntype = "shim-hv"\ndif = "%s"\npath = "%s"\nside = "%s"\nbusy_poll = %s\n' "$1" "$2" "$3" "$4" "$5" "$BUSY"
}
net() { # system address neighbour neighbour-address over [route-dst route-hop]
    printf '\n[[ipcp]]\nname = "%s.net"\ntype = "normal"\ndif = "net"\naddress = %s\n' "$1" "$2"
    shift 2
    while [ $# -ge 3 ] && [ "$1" != "--" ]; do
        printf '\n[[ipcp.neighbor]]\nname = "%s.net"\nover = "%s"\naddress = %s\n' "$1" "$3" "$2"
        shift 3
    done
    # VM-to-VM: window flow control, no retransmission (the issue's cube).
    printf '\n[[ipcp.qos_cube]]\nid = 1\nname = "vm"\nflow_control = true\n'
    printf '\n[ipcp.routes]\n'
    [ "${1:-}" = "--" ] && printf '"%s" = %s\n' "$2" "$3"
    printf '\n[ipcp.names]\n"perfb" = 3\n'
}
start() { # name config
    printf '[system]\nname = "%s"\n%s\n' "$1" "$2" > "$T/$1.toml"
    "$BIN/rinad" --config "$T/$1.toml" --socket "$T/$1.sock" --log-level warn 2>"$T/$1.log" & PIDS+=($!)
    eval "PID_$1=$!"
}
cpu_ticks() { # pid: user + system clock ticks
    awk '{print $14 + $15}' "/proc/$1/stat"
}

# (a) host <-> guest over one shim-hv DIF.
start host "$(hv host hv hv "$SHM-a" host)"
sleep 0.2
start guest "$(hv guest hv hv "$SHM-a" guest)"
wait_up "$T/host.sock"; wait_up "$T/guest.sock"
"$BIN/rina-perf" server --socket "$T/host.sock" --name perf $RINGS >/dev/null 2>&1 & PIDS+=($!)
sleep 0.3
echo "== (a) rina-perf over shim-hv, ${DUR} s per size"
"$BIN/rina-perf" client --socket "$T/guest.sock" --dif hv --dst perf --sweep "$SIZES" --duration-s "$DUR" --csv $RINGS > "$T/a.csv"

# (c) latency and idle CPU over the same pair.
"$BIN/rina-echo" server --socket "$T/host.sock" --name echo >/dev/null 2>&1 & PIDS+=($!)
sleep 0.3
echo "== (c) rina-echo round trips over shim-hv; CPU of the idle daemons over ${IDLE} s"
"$BIN/rina-echo" client --socket "$T/guest.sock" --dif hv --dst echo --count 500 --interval-ms 2 --size 64 --json > "$T/echo.json" || true
sleep 0.5
h0=$(cpu_ticks "$PID_host"); g0=$(cpu_ticks "$PID_guest")
sleep "$IDLE"
h1=$(cpu_ticks "$PID_host"); g1=$(cpu_ticks "$PID_guest")
CLK=$(getconf CLK_TCK)
python3 - "$T/echo.json" "$h0" "$h1" "$g0" "$g1" "$CLK" "$IDLE" "$BUSY" <<'PY'
import json, sys
f, h0, h1, g0, g1, clk, idle, busy = sys.argv[1:]
try:
    r = json.load(open(f))["rtt_ms"]
    print(f"RTT 64 B (ms): min {r['min']:.3f}  p50 {r['p50']:.3f}  p90 {r['p90']:.3f}  p99 {r['p99']:.3f}  max {r['max']:.3f}")
except Exception as e:
    print(f"RTT: no result ({e})")
for who, a, b in (("host", h0, h1), ("guest", g0, g1)):
    pct = (int(b) - int(a)) / int(clk) / float(idle) * 100
    print(f"idle CPU {who} daemon: {pct:.1f} % of a core (busy_poll={busy})")
PY

# (b) VM1 -> host -> VM2 over a normal DIF over two shim-hv DIFs.
start h2 "$(hv h2 hv1 hv1 "$SHM-b1" host)$(hv h2 hv2 hv2 "$SHM-b2" host)$(net h2 1 vm1 2 hv1 vm2 3 hv2)"
sleep 0.2
start vm1 "$(hv vm1 hv hv1 "$SHM-b1" guest)$(net vm1 2 h2 1 hv1 -- 3 1)"
start vm2 "$(hv vm2 hv hv2 "$SHM-b2" guest)$(net vm2 3 h2 1 hv2 -- 2 1)"
wait_up "$T/h2.sock"; wait_up "$T/vm1.sock"; wait_up "$T/vm2.sock"
"$BIN/rina-perf" server --socket "$T/vm2.sock" --dif net --name perfb >/dev/null 2>&1 & PIDS+=($!)
ok=
for _ in $(seq 100); do
    if "$BIN/rina-perf" client --socket "$T/vm1.sock" --dif net --dst perfb --size 1000 --count 10 >/dev/null 2>&1; then ok=1; break; fi
    sleep 0.2
done
[ -n "$ok" ] || { echo "bench: the normal DIF over shim-hv did not come up" >&2; exit 1; }
echo "== (b) rina-perf over a normal DIF over two shim-hv DIFs, ${DUR} s per size"
"$BIN/rina-perf" client --socket "$T/vm1.sock" --dif net --dst perfb --sweep "$SIZES" --duration-s "$DUR" --csv > "$T/b.csv"

echo "== iperf3 UDP and TCP over loopback, ${DUR} s per size"
iperf3 -s -p 5399 >/dev/null 2>&1 & PIDS+=($!)
sleep 0.3
for s in ${SIZES//,/ }; do
    u=$(( s > 65507 ? 65507 : s ))
    iperf3 -c 127.0.0.1 -p 5399 -u -l "$u" -b 0 -t "$DUR" -J > "$T/udp-$s.json" || true
    iperf3 -c 127.0.0.1 -p 5399 -l "$s" -t "$DUR" -J > "$T/tcp-$s.json" || true
done

python3 - "$T" "$SIZES" "$CSV" <<'PY'
import csv, json, sys
t, sizes, out = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], sys.argv[3]
def perf(f):
    rows = {}
    for r in csv.reader(open(f)):
        if r and r[0].isdigit():
            rows[int(r[0])] = (float(r[5]), float(r[3]))
    return rows
def ip(kind, s, key="sum_received"):
    try:
        j = json.load(open(f"{t}/{kind}-{s}.json"))["end"]
        # What the server received (iperf3 3.12 has it for UDP too; older
        # ones only report the sender's "sum").
        return j.get(key, j.get("sum"))["bits_per_second"] / 1e6
    except Exception:
        return float("nan")
a, b = perf(f"{t}/a.csv"), perf(f"{t}/b.csv")
print()
nan = (float("nan"), float("nan"))
rows = []
print(f"{'SDU':>6} {'shim-hv':>10} {'loss%':>6} {'normal/hv':>10} {'loss%':>6} {'iperf3 UDP':>11} {'UDP sent':>10} {'iperf3 TCP':>11} {'hv/UDP':>7} {'hv/sent':>7} {'hv/TCP':>7}")
for s in sizes:
    u, us, tc = ip("udp", s), ip("udp", s, "sum_sent"), ip("tcp", s)
    (ha, la), (hb, lb) = a.get(s, nan), b.get(s, nan)
    print(f"{s:>6} {ha:>10.1f} {la:>6.1f} {hb:>10.1f} {lb:>6.1f} {u:>11.1f} {us:>10.1f} {tc:>11.1f} {ha/u:>7.2f} {ha/us:>7.2f} {ha/tc:>7.2f}")
    rows.append((s, ha * 1e6, u * 1e6, tc * 1e6, hb * 1e6, us * 1e6))
print("\n(goodput in Mb/s at the receiver; iperf3 UDP: what its server received, UDP sent:")
print(" what its client sent; aim: hv/UDP >= 1.5 from 1400 B up)")
with open(out, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["sdu_bytes", "shim_hv_bps", "iperf3_udp_bps", "iperf3_tcp_bps", "normal_over_hv_bps", "iperf3_udp_sent_bps"])
    for r in rows:
        w.writerow([r[0]] + [f"{v:.0f}" if v == v else "" for v in r[1:]])
print(f"CSV: {out}")
# The same points as a rina-lab run, for `rina-lab plot` (goodput against SDU size).
import os
series = (("app over shim-hv (Fig. 4a)", 1), ("normal DIF over shim-hv (Fig. 4b)", 4),
          ("iperf3 UDP loopback", 2), ("iperf3 TCP loopback", 3))
points = [{"series": name, "sdu_bytes": r[0], "goodput_bps": r[k]}
          for r in rows for name, k in series if r[k] == r[k]]
run = {"backend": "bench", "experiment": "shim-hv seed 001 Fig. 4", "variant": None,
       "wall_time_s": 0.0, "duration_s": 0.0, "flows": [], "samples": [], "goodput": points,
       "links": [], "timeline": []}
d = os.path.join(os.path.dirname(out) or ".", "shim_hv_run")
os.makedirs(d, exist_ok=True)
json.dump({"schema": 1, "run": run}, open(os.path.join(d, "run.json"), "w"))
print(f"run: {d}")
PY
RUN_DIR="$(dirname "$CSV")/shim_hv_run"
if [ -x "$BIN/rina-lab" ] && "$BIN/rina-lab" plot "$RUN_DIR" >/dev/null 2>&1; then
    echo "plots: $RUN_DIR/plots/goodput_sdu.{png,svg}"
fi
