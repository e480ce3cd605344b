#!/usr/bin/env bash
# Normal-DIF benchmark (not a timed test): in one run on this machine,
# rina-perf with 1400-byte SDUs
#   * over the shim DIF over UDP alone,
#   * over one normal DIF over that shim DIF,
#   * over two normal DIFs stacked in the same daemons,
#   * over a normal DIF with a password and encryption (AES-256-GCM on
#     its N-1 flow), beside the plain one over the same shim DIF,
#   * on a reliable flow (retransmission, window flow control and the
#     DCTCP-like congestion control of the reliable cube) over one normal
#     DIF, beside the unreliable one,
#   * with both applications on the flow's socket (--no-rings, as the C
#     API and Python use flows) over one normal DIF,
# against iperf3 -u -l 1400 -b 0 on loopback, and prints the ratios and the
# cost of the extra DIF. Needs iperf3 and python3 (iperf3 installed with apt
# when run as root).
#
#   bash bench/normal_dif.sh          # DUR=5 seconds per measurement, ROUNDS=3
#   RESULTS=f.json bash bench/normal_dif.sh   # also write the figures as JSON
#   CPU_RATE=300 bash bench/normal_dif.sh     # the paced rate of the CPU-cost runs, Mb/s
#   NO_BUILD=1 BIN=/other/target/release bash bench/normal_dif.sh   # other binaries
#
# Goodput flat out on two shared cores varies by +-20 % between rounds, so
# the costs of encryption and of an extra stacked DIF are also given as
# CPU: the two daemons' CPU seconds (from /proc, user and system) per
# delivered gigabyte while each path runs flat out (the figure
# bench/performance.sh compares with the aims), and the same at a paced
# load (CPU_RATE, default 300 Mb/s, below what any carries). Paced, the
# daemons wake for nearly every SDU, so that figure is mostly the cost of
# a wake-up and cannot resolve what a DIF or the cipher adds per PDU.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${DUR:-5}
ROUNDS=${ROUNDS:-3}
SIZE=${SIZE:-1400}
if ! command -v iperf3 >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        apt-get install -y iperf3 >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y iperf3 >/dev/null; }
    else
        echo "bench: iperf3 is missing; install it (apt-get install iperf3) or run as root" >&2
        exit 1
    fi
fi
# NO_BUILD=1 uses the binaries already built; BIN=DIR takes them from DIR
# (e.g. another commit's build, for a before/after comparison).
[ -n "${NO_BUILD:-}" ] || cargo build --release -q
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release}
T=$(mktemp -d /tmp/rina-bench-normal.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$T"
}
trap cleanup EXIT INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PA=$(free_port); PB=$(free_port)

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
"$4.sec" = "127.0.0.1:$6"
"perf" = "127.0.0.1:$6"

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
"$4.top" = $5
"perf" = 2
"perf-sock" = 2

[[ipcp]]
name = "$1.top"
type = "normal"
dif = "top"
address = $2

[[ipcp.neighbor]]
name = "$4.top"
over = "net"
address = $5

[ipcp.names]
"perf" = 2

[[ipcp]]
name = "$1.sec"
type = "normal"
dif = "sec"
address = $2
password = "bench password"
encryption = true

[[ipcp.neighbor]]
name = "$4.sec"
over = "udp"
address = $5

[ipcp.names]
"perf" = 2
CONF
}
system alpha 1 "$PA" beta 2 "$PB" > "$T/alpha.toml"
system beta 2 "$PB" alpha 1 "$PA" > "$T/beta.toml"
"$BIN/rinad" --config "$T/beta.toml" --socket "$T/beta.sock" --log-level warn 2>"$T/beta.log" & PIDS+=($!)
DAEMONS=($!)
"$BIN/rinad" --config "$T/alpha.toml" --socket "$T/alpha.sock" --log-level warn 2>"$T/alpha.log" & PIDS+=($!)
DAEMONS+=($!)
up() { "$BIN/rinactl" --socket "$T/alpha.sock" --json ipcps 2>/dev/null | python3 -c '
import json,sys
ipcps = {i["name"]: i for i in json.load(sys.stdin)}
ok = all(ipcps[n]["counters"].get("neighbors_up") == 1 for n in ("alpha.top", "alpha.sec"))
sys.exit(0 if ok and ipcps["alpha.sec"]["counters"].get("encryption_keys_installed", 0) >= 1 else 1)'; }
for _ in $(seq 100); do up && break; sleep 0.1; done
up || { echo "bench: the DIFs did not come up" >&2; tail "$T"/*.log >&2; exit 1; }
for dif in udp net top sec; do
    "$BIN/rina-perf" server --socket "$T/beta.sock" --name perf --dif "$dif" >/dev/null 2>&1 & PIDS+=($!)
done
"$BIN/rina-perf" server --socket "$T/beta.sock" --name perf-sock --dif net --no-rings >/dev/null 2>&1 & PIDS+=($!)
sleep 0.3
iperf3 -s -p 5298 >/dev/null 2>&1 & PIDS+=($!)
sleep 0.3
# Where the cores go flat out (the profile behind the daemon's one thread,
# see "A second core" in docs/performance.md): each daemon's CPU ticks and the
# machine's busy and total ticks (/proc/stat) around each run.
each() { for p in "${DAEMONS[@]}"; do awk '{print $14 + $15}' "/proc/$p/stat"; done | tr '\n' ' '; }
machine() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9}' /proc/stat; }
# Rounds interleave the paths, so a burst of load elsewhere on the machine
# hits one round of every path rather than all of one path; the table
# gives each path's median and its range over the rounds.
for r in $(seq "$ROUNDS"); do
    for path in udp net top sec rel sock; do
        dif=$path
        qos=()
        dst=perf
        [ "$path" = rel ] && dif=net && qos=(--reliable --in-order)
        [ "$path" = sock ] && dif=net && dst=perf-sock && qos=(--no-rings)
        echo "== round $r/$ROUNDS: rina-perf over DIF $dif${qos[*]:+ ${qos[*]}}, $SIZE B, $DUR s"
        s0="$(each)$(machine)"
        "$BIN/rina-perf" client --socket "$T/alpha.sock" --dst "$dst" --dif "$dif" --size "$SIZE" \
            --duration-s "$DUR" "${qos[@]}" --json > "$T/perf-$path-$r.json"
        echo "$s0 $(each)$(machine)" > "$T/share-$path-$r"
    done
    echo "== round $r/$ROUNDS: iperf3 -u -l $SIZE -b 0, $DUR s"
    iperf3 -c 127.0.0.1 -p 5298 -u -l "$SIZE" -b 0 -t "$DUR" -J > "$T/iperf-$r.json"
done

# CPU ticks (user + system) of both daemons.
ticks() { for p in "${DAEMONS[@]}"; do cat "/proc/$p/stat"; done | awk '{s += $14 + $15} END {print s}'; }
CPU_RATE=${CPU_RATE:-300}
for r in $(seq "$ROUNDS"); do
    for dif in net top sec; do
        echo "== round $r/$ROUNDS: CPU cost over DIF $dif, $CPU_RATE Mb/s paced, $DUR s"
        before=$(ticks)
        "$BIN/rina-perf" client --socket "$T/alpha.sock" --dst perf --dif "$dif" --size "$SIZE" \
            --duration-s "$DUR" --rate-mbps "$CPU_RATE" --json > "$T/cpu-$dif-$r.json"
        echo $(( $(ticks) - before )) > "$T/cpu-$dif-$r.ticks"
    done
done

python3 - "$T" "$ROUNDS" "$(getconf CLK_TCK)" <<'PY'
import json, os, statistics, sys
t, rounds = sys.argv[1], int(sys.argv[2])
ips = [json.load(open(f"{t}/iperf-{r}.json"))["end"]["sum"]["bits_per_second"] / 1e6
       for r in range(1, rounds + 1)]
paths = ("udp", "net", "top", "sec", "rel", "sock")
rx = {d: [json.load(open(f"{t}/perf-{d}-{r}.json"))["tests"][0] for r in range(1, rounds + 1)]
      for d in paths}
med = statistics.median
ip = med(ips)
mbps = {d: [x["rx_mbps"] for x in rx[d]] for d in paths}
m = {d: med(v) for d, v in mbps.items()}
print()
print(f"medians of {rounds} interleaved rounds of each path")
print(f"{'path':34}{'rx Mb/s':>10}{'range':>17}{'loss %':>9}{'vs iperf3':>11}")
print(f"{'iperf3 UDP':34}{ip:10.1f}{min(ips):8.0f}-{max(ips):<8.0f}{'':>9}{1.0:11.2f}")
labels = {"udp": "shim-udp only", "net": "normal DIF / shim-udp", "top": "normal / normal / shim-udp",
          "sec": "encrypted normal DIF / shim-udp", "rel": "reliable flow, normal DIF",
          "sock": "normal DIF, apps on sockets"}
for d in paths:
    loss = med([x["loss_pct"] for x in rx[d]])
    v = mbps[d]
    print(f"{labels[d]:34}{m[d]:10.1f}{min(v):8.0f}-{max(v):<8.0f}{loss:9.2f}{m[d]/ip:11.2f}")
cost = 1 - m["top"] / m["net"]
per_round = [1 - a / b for a, b in zip(mbps["top"], mbps["net"])]
print(f"\none normal DIF: {m['net']/ip:.2f} of iperf3 (aim >= 0.80)")
print(f"extra stacked DIF costs {cost*100:.1f}% of goodput (aim <= 8%; per round "
      + ", ".join(f"{c*100:.0f}%" for c in per_round) + ")")
enc = 1 - m["sec"] / m["net"]
print(f"encryption costs {enc*100:.1f}% of one normal DIF's goodput (aim <= 15%)")
rel = m["rel"] / m["net"]
print(f"a reliable flow (retransmission, flow and congestion control) carries {rel:.2f} of an "
      "unreliable one's goodput over one normal DIF (per round "
      + ", ".join(f"{a / b:.2f}" for a, b in zip(mbps["rel"], mbps["net"])) + ")")
sock = m["sock"] / ip
print(f"applications on their flows' sockets (no rings, as with the C API and Python) get "
      f"{sock:.2f} of iperf3 over one normal DIF ({m['sock'] / m['net']:.2f} of applications on rings)")
hz = int(sys.argv[3])
cpu = {}
for d in ("net", "top", "sec"):
    per = []
    for r in range(1, rounds + 1):
        ticks = int(open(f"{t}/cpu-{d}-{r}.ticks").read())
        res = json.load(open(f"{t}/cpu-{d}-{r}.json"))["tests"][0]
        gb = res["report"]["recv_bytes"] / 1e9
        per.append(ticks / hz / gb if gb > 0 else float("inf"))
    cpu[d] = per
cpu_cost = med(cpu["sec"]) / med(cpu["net"]) - 1
print(f"daemons' CPU per delivered GB at a paced load: plain {med(cpu['net']):.2f} s, "
      f"encrypted {med(cpu['sec']):.2f} s: encryption adds {cpu_cost*100:.1f}% CPU "
      "(per round " + ", ".join(f"{a/b*100-100:.0f}%" for a, b in zip(cpu["sec"], cpu["net"])) + ")")
stack_cpu = med(cpu["top"]) / med(cpu["net"]) - 1
print(f"daemons' CPU per delivered GB at a paced load: one DIF {med(cpu['net']):.2f} s, "
      f"two stacked {med(cpu['top']):.2f} s: the extra DIF adds {stack_cpu*100:.1f}% CPU "
      "(per round " + ", ".join(f"{a/b*100-100:.0f}%" for a, b in zip(cpu["top"], cpu["net"])) + ")")
# Each share file: before and after the run, the receiving and the sending
# rinad's ticks (DAEMONS is beta, alpha), the machine's busy and total ticks.
ncpu = os.cpu_count() or 1
print(f"\nflat out, where the {ncpu} cores went (medians of the rounds; the rest is the"
      " applications and the kernel's work for them):")
print(f"{'path':34}{'sending rinad':>14}{'receiving':>11}{'the rest':>10}{'idle':>7}")
share = {}
for d in paths:
    rows = []
    for r in range(1, rounds + 1):
        a = [int(x) for x in open(f"{t}/share-{d}-{r}").read().split()]
        (rx0, tx0, b0, t0), (rx1, tx1, b1, t1) = a[:4], a[4:]
        span = (t1 - t0) / ncpu  # ticks of one core over the run
        rows.append(((tx1 - tx0) / span, (rx1 - rx0) / span, (b1 - b0) / span, (t1 - t0 - (b1 - b0)) / span))
    tx, rxd, busy, idle = (med([row[k] for row in rows]) for k in range(4))
    share[d] = {"sending_rinad": tx, "receiving_rinad": rxd, "busy": busy, "idle": idle}
    print(f"{labels[d]:34}{tx:14.2f}{rxd:11.2f}{busy - tx - rxd:10.2f}{idle:7.2f}")
# CPU per delivered byte flat out: the two daemons' cores over the goodput.
# The paced runs above wake the daemons for nearly every SDU, so their CPU
# is mostly the cost of a wake-up and cannot resolve what a DIF adds per
# PDU; flat out, turns are full batches and the per-PDU work shows.
flat = {d: (share[d]["sending_rinad"] + share[d]["receiving_rinad"]) / (m[d] / 8000) for d in paths}
stack_flat = flat["top"] / flat["net"] - 1
enc_flat = flat["sec"] / flat["net"] - 1
print(f"\nflat out, the daemons' CPU per delivered GB: one DIF {flat['net']:.2f} s, two stacked "
      f"{flat['top']:.2f} s (the extra DIF adds {stack_flat*100:.1f}%), encrypted {flat['sec']:.2f} s "
      f"(encryption adds {enc_flat*100:.1f}%)")
if os.environ.get("RESULTS"):
    json.dump({"iperf3_udp_mbps": ip, "mbps": m, "normal_ratio": m["net"] / ip,
               "stacked_flat_cpu_cost": stack_flat, "encryption_flat_cpu_cost": enc_flat,
               "flat_cpu_s_per_gb": flat,
               "stacked_cost": cost, "encryption_cost": enc, "reliable_ratio": rel, "sockets_ratio": sock,
               "encryption_cpu_cost": cpu_cost, "stacked_cpu_cost": stack_cpu,
               "flat_out_cores": share}, open(os.environ["RESULTS"], "w"))
PY
