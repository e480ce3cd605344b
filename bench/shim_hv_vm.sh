#!/usr/bin/env bash
# Shim-hv against the emulated NICs from inside a real QEMU guest (seed 001
# Fig. 4; a benchmark, not a test). Needs root (tap devices), QEMU, iperf3
# and python3. One guest (TCG, $SMP vCPUs, default 1) is booted with
#   * an ivshmem-plain device: the shim-hv DIF to the host's rinad;
#   * a virtio-net-pci NIC (vhost=off) on tap $TAP-v: guest 10.77.0.2/30,
#     host 10.77.0.1;
#   * an e1000 NIC on tap $TAP-e: guest 10.77.0.6/30, host 10.77.0.5
#     (E1000=0 leaves it out);
# and the guest's /init (crates/rinad/tests/qemu/init.sh, kernel argument
# rina.mode=bench) measures guest -> host goodput at the receiver for each
# SDU size of $SIZES, $DUR seconds per point:
#   * rina-perf over shim-hv, shared-memory rings between rina-perf and
#     rinad on both sides (rina-perf's default);
#   * the same with --no-rings on both sides (one system call per SDU);
#   * iperf3 UDP (-l SIZE capped at 65507, -b 0; what the server received)
#     and TCP (-l SIZE) over virtio-net, then over e1000, to iperf3 -s on
#     the host (MTU 1500: UDP datagrams above it are IP-fragmented).
# Prints one table (Mb/s) with the ratios shim-hv / virtio UDP, and writes
# the CSV (sdu_bytes, then one column per series in bit/s) to $CSV.
#
#   sudo bash bench/shim_hv_vm.sh                    # DUR=3, SMP=1, both NICs
#   SIZES=1400,65536 DUR=2 E1000=0 bash bench/shim_hv_vm.sh
#   SMP=2 bash bench/shim_hv_vm.sh                   # two vCPUs (MTTCG)
#   NOBUILD=1 BIN=/some/release bash bench/shim_hv_vm.sh
#   CPU=max bash bench/shim_hv_vm.sh     # TCG's CPU (default max,-erms,-fsrm: see the doc)
#   APPEND='rina.busy_poll=true' bash bench/shim_hv_vm.sh   # more kernel arguments
#
# ACCEL=tcg by default (this project's machines cannot boot a Linux guest
# with their nested KVM; see docs/shim-hv-qemu.md). QEMU, the daemons,
# iperf3, the tap devices and the shared-memory file are removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
t_start=$(date +%s)
DUR=${DUR:-3}
SMP=${SMP:-1}
MEM=${MEM:-512}
ACCEL=${ACCEL:-tcg}
E1000=${E1000:-1}
SIZES=${SIZES:-1400,4000,8192,16384,65536}
TAP=${TAP:-rvb$$}
PORT=${PORT:-5201}
DIF=hv0
TARGET=${CARGO_TARGET_DIR:-target}
CSV=${CSV:-$TARGET/shim_hv_vm.csv}

[ "$(id -u)" = 0 ] || { echo "bench: needs root (tap devices)" >&2; exit 1; }
for c in qemu-system-x86_64 iperf3 python3 ip; do
    command -v "$c" >/dev/null 2>&1 || { echo "bench: $c is needed" >&2; exit 1; }
done
[ "${#TAP}" -le 13 ] || { echo "bench: TAP=$TAP is too long for an interface name" >&2; exit 1; }

if [ -z "${NOBUILD:-}" ]; then
    echo "== cargo build --release -p rinad -p rina-tools"
    cargo build --release -q -p rinad -p rina-tools
fi
BIN=${BIN:-$TARGET/release}
BIN=$(cd "$BIN" && pwd)

echo "== guest image (build-guest.sh --extra $(command -v iperf3) --nic-modules)"
img=$(bash crates/rinad/tests/qemu/build-guest.sh --bin-dir "$BIN" --cache "$TARGET/qemu-guest" \
    --extra "$(command -v iperf3)" --nic-modules)
KERNEL=$(echo "$img" | sed -n 's/^KERNEL=//p')
INITRD=$(echo "$img" | sed -n 's/^INITRD=//p')

T=$(mktemp -d /tmp/rina-bench-hvvm.XXXXXX)
SHM=/dev/shm/rina-bench-hvvm-$$
PIDS=()
TAPS=()
QEMU_PID=""
cleanup() {
    [ -n "$QEMU_PID" ] && kill "$QEMU_PID" 2>/dev/null || true
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for t in "${TAPS[@]}"; do ip link del "$t" 2>/dev/null || true; done
    rm -rf "$T" "$SHM" "$SHM.bell"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- host side: tap devices, rinad with the shim-hv IPCP, servers ----------
tap() { # name host-address/prefix
    ip tuntap add dev "$1" mode tap
    TAPS+=("$1")
    ip addr add "$2" dev "$1"
    ip link set "$1" up
}
tap "$TAP-v" 10.77.0.1/30
[ "$E1000" = 1 ] && tap "$TAP-e" 10.77.0.5/30

printf '[system]\nname = "host"\n\n[[ipcp]]\nname = "host.hv"\ntype = "shim-hv"\ndif = "%s"\npath = "%s"\nside = "host"\n' \
    "$DIF" "$SHM" >"$T/host.toml"
"$BIN/rinad" --config "$T/host.toml" --socket "$T/host.sock" --log-level warn 2>"$T/host.log" &
PIDS+=($!)
for _ in $(seq 100); do [ -S "$T/host.sock" ] && [ -s "$SHM" ] && break; sleep 0.05; done
[ -s "$SHM" ] || { echo "bench: the host rinad did not create $SHM" >&2; cat "$T/host.log" >&2; exit 1; }
"$BIN/rina-perf" server --socket "$T/host.sock" --dif "$DIF" --name perf >"$T/perf.log" 2>&1 &
PIDS+=($!)
"$BIN/rina-perf" server --socket "$T/host.sock" --dif "$DIF" --name perf-nr --no-rings >"$T/perf-nr.log" 2>&1 &
PIDS+=($!)
iperf3 -s -p "$PORT" >"$T/iperf3.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do
    n=$("$BIN/rinactl" --socket "$T/host.sock" names 2>/dev/null | grep -c 'perf' || true)
    [ "$n" -ge 2 ] && break
    sleep 0.05
done

# --- the guest ---------------------------------------------------------------
cpu=()
# Without ERMS/FSRM: TCG emulates `rep movsb` (glibc's memcpy from a few
# KiB up, the kernel's copies) one byte per emulated iteration; real CPUs
# copy at memory speed.
[ "$ACCEL" = tcg ] && cpu=(-cpu "${CPU:-max,-erms,-fsrm}")
npoints=$(echo "$SIZES" | tr , '\n' | wc -l)
nics=1
args="console=ttyS0 quiet panic=-1 rina.mode=bench rina.dif=$DIF rina.bench_s=$DUR rina.bench_sizes=$SIZES"
[ -n "${APPEND:-}" ] && args="$args $APPEND"
args="$args rina.iperf_port=$PORT rina.virtio_ip=10.77.0.2/30 rina.virtio_peer=10.77.0.1"
net=(-netdev "tap,id=nv,ifname=$TAP-v,script=no,downscript=no,vhost=off"
    -device "virtio-net-pci,netdev=nv,mac=52:54:00:77:00:02")
if [ "$E1000" = 1 ]; then
    nics=2
    args="$args rina.e1000_ip=10.77.0.6/30 rina.e1000_peer=10.77.0.5"
    net+=(-netdev "tap,id=ne,ifname=$TAP-e,script=no,downscript=no"
        -device "e1000,netdev=ne,mac=52:54:00:77:00:06")
fi
# Boot, two rina-perf sweeps and 2 iperf3 runs per size and NIC, with slack
# for TCG.
limit=$((120 + npoints * DUR * (2 + 2 * nics) * 3))
echo "== QEMU ($ACCEL${cpu[1]:+ -cpu ${cpu[1]}}, $SMP vCPU, ${MEM} MiB): shim-hv, virtio-net$([ "$E1000" = 1 ] && echo ', e1000'); sizes $SIZES, ${DUR} s per point (at most ${limit} s)"
t_qemu=$(date +%s)
qemu-system-x86_64 -M q35 -accel "$ACCEL" "${cpu[@]}" -m "$MEM" -smp "$SMP" \
    -nographic -no-reboot -nic none -kernel "$KERNEL" -initrd "$INITRD" -append "$args" \
    -object "memory-backend-file,id=hv0,share=on,mem-path=$SHM,size=16M" -device ivshmem-plain,memdev=hv0 \
    "${net[@]}" </dev/null >"$T/console.log" 2>&1 &
QEMU_PID=$!
shown=0
progress() { # the guest's NIC and step lines not shown yet
    grep -E '^GUEST-(NIC|BENCH-STEP|BENCH-FAIL|FAIL)' "$T/console.log" 2>/dev/null | tr -d '\r' |
        tail -n +$((shown + 1)) | sed 's/^/  /' >"$T/progress" || true
    if [ -s "$T/progress" ]; then
        cat "$T/progress"
        shown=$((shown + $(wc -l <"$T/progress")))
    fi
}
while kill -0 "$QEMU_PID" 2>/dev/null; do
    if [ $(($(date +%s) - t_qemu)) -gt "$limit" ]; then
        echo "bench: the guest did not finish in ${limit} s; killing QEMU" >&2
        kill "$QEMU_PID" 2>/dev/null || true
        break
    fi
    progress
    sleep 1
done
wait "$QEMU_PID" 2>/dev/null || true
QEMU_PID=""
progress
t_end=$(date +%s)
cp "$T/console.log" "${CSV%.csv}.console.log" 2>/dev/null || true
if grep -q '^GUEST-FAIL' "$T/console.log" || ! grep -q '^GUEST-DONE' "$T/console.log"; then
    echo "bench: the guest failed; serial console:" >&2
    tr -d '\r' <"$T/console.log" | tail -n 60 >&2
    exit 1
fi

python3 - "$T/console.log" "$SIZES" "$CSV" "$SMP" "$ACCEL${cpu[1]:+ -cpu ${cpu[1]}}" "$DUR" <<'PY'
import csv, json, math, sys
log, sizes, out, smp, accel, dur = sys.argv[1:]
sizes = [int(s) for s in sizes.split(",")]
nan = float("nan")
perf = {"rings": {}, "norings": {}}
ip = {}
for line in open(log, errors="replace"):
    line = line.rstrip("\r\n")
    if line.startswith("GUEST-BENCH-PERF "):
        _, mode, row = line.split(" ", 2)
        r = row.split(",")
        if r[0].isdigit():
            # size,sent_sdus,recv_sdus,loss_pct,tx_mbps,rx_mbps,rx_sdus_per_s
            perf[mode][int(r[0])] = (float(r[5]) * 1e6, float(r[3]))
    elif line.startswith("GUEST-BENCH-IPERF "):
        _, nic, proto, size, js = line.split(" ", 4)
        try:
            # iperf3 may print a warning before the JSON (UDP -l > MSS).
            end = json.loads(js[js.find("{"):])["end"]
            # What the server received (iperf3 >= 3.12 reports it to the
            # client for UDP as well; older ones only have the sender's sum).
            s = end.get("sum_received") or end["sum"]
            ip[(nic, proto, int(size))] = s["bits_per_second"]
        except Exception as e:
            print(f"bench: iperf3 {nic} {proto} {size}: no result ({e}): {js[:200]}", file=sys.stderr)
series = [
    ("shim_hv_bps", lambda s: perf["rings"].get(s, (nan,))[0]),
    ("shim_hv_norings_bps", lambda s: perf["norings"].get(s, (nan,))[0]),
    ("virtio_udp_bps", lambda s: ip.get(("virtio", "udp", s), nan)),
    ("virtio_tcp_bps", lambda s: ip.get(("virtio", "tcp", s), nan)),
    ("e1000_udp_bps", lambda s: ip.get(("e1000", "udp", s), nan)),
    ("e1000_tcp_bps", lambda s: ip.get(("e1000", "tcp", s), nan)),
]
rows = [[s] + [f(s) for _, f in series] for s in sizes]
def r(a, b):
    return a / b if b and not math.isnan(a) and not math.isnan(b) else nan
print()
print(f"guest -> host goodput at the receiver, Mb/s ({accel}, {smp} vCPU, {dur} s per point)")
hdr = ["SDU", "hv rings", "loss%", "hv no-rings", "loss%", "virtio UDP", "virtio TCP",
       "e1000 UDP", "e1000 TCP", "hv/vUDP", "hv-nr/vUDP"]
w = [6, 9, 6, 11, 6, 10, 10, 10, 10, 8, 10]
print(" ".join(h.rjust(n) for h, n in zip(hdr, w)))
for row in rows:
    s = row[0]
    la = perf["rings"].get(s, (nan, nan))[1]
    lb = perf["norings"].get(s, (nan, nan))[1]
    cells = [str(s), f"{row[1]/1e6:.1f}", f"{la:.1f}", f"{row[2]/1e6:.1f}", f"{lb:.1f}",
             f"{row[3]/1e6:.1f}", f"{row[4]/1e6:.1f}", f"{row[5]/1e6:.1f}", f"{row[6]/1e6:.1f}",
             f"{r(row[1], row[3]):.2f}", f"{r(row[2], row[3]):.2f}"]
    print(" ".join(c.rjust(n) for c, n in zip(cells, w)))
print("(rina-perf: rx rate of its server on the host; iperf3 UDP: what the host's server received;")
print(" UDP -l is capped at 65507; NIC MTU 1500)")
with open(out, "w", newline="") as f:
    wr = csv.writer(f)
    wr.writerow(["sdu_bytes"] + [n for n, _ in series])
    for row in rows:
        wr.writerow([row[0]] + ["" if math.isnan(v) else f"{v:.0f}" for v in row[1:]])
print(f"CSV: {out}")
PY
echo "guest: QEMU start to power-off $((t_end - t_qemu)) s; whole script $(($(date +%s) - t_start)) s"
