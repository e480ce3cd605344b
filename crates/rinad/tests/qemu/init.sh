#!/bin/sh
# /init of the shim-hv test guest (built by build-guest.sh, booted by
# crates/rinad/tests/qemu_guest.rs). Runs the guest side of rinad on the
# ivshmem-plain device's BAR 2 and drives traffic over the shim-hv DIF:
#
#   1. guest -> host: rina-echo client to `echo`, rina-perf client to `perf`
#      (servers on the host);
#   2. host -> guest: serves `vm-echo` and `vm-perf` (one flow each) for
#      clients on the host;
#
# then powers off. Every line for the test starts with GUEST-; results are
# `GUEST-RESULT ...` lines, failures `GUEST-FAIL ...`.
#
# Kernel command line knobs (defaults in brackets): rina.dif [hv0],
# rina.echo_count [20], rina.echo_size [1000], rina.perf_s [2],
# rina.perf_sizes [1400,65536], rina.serve_s [90], rina.busy_poll [false],
# rina.log [info].

export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
exec </dev/console >/dev/console 2>&1

up() { cut -d' ' -f1 /proc/uptime; }
arg() {
    for w in $(cat /proc/cmdline); do
        case "$w" in "rina.$1="*) echo "${w#*=}"; return ;; esac
    done
    echo "$2"
}
finish() {
    echo "GUEST-DONE uptime=$(up)"
    sync
    poweroff -f
    sleep 5
    echo o >/proc/sysrq-trigger
}
fail() {
    echo "GUEST-FAIL $*"
    echo "--- guest rinad log (tail) ---"
    tail -n 40 /tmp/rinad.log 2>/dev/null
    finish
}
# "key":value from a one-line JSON object (numbers only).
jnum() { echo "$2" | sed -n "s/.*\"$1\":\([-0-9.e+]*\).*/\1/p" | head -n1; }

echo "GUEST-BOOT uptime=$(up) kernel=$(uname -r)"
DIF=$(arg dif hv0)
S=/run/rinad.sock

dev=""
for d in /sys/bus/pci/devices/*; do
    if [ "$(cat "$d/vendor")" = 0x1af4 ] && [ "$(cat "$d/device")" = 0x1110 ]; then
        dev="$d"
        break
    fi
done
[ -n "$dev" ] || fail "no ivshmem device (1af4:1110) on the PCI bus"
# Memory decoding on; no driver is needed to map the BAR from sysfs.
echo 1 >"$dev/enable" 2>/dev/null
res="$dev/resource2"
[ -e "$res" ] || fail "$res missing"
echo "GUEST-DEV ${dev##*/} resource2=$(stat -c %s "$res") bytes"

cat >/run/rinad.toml <<TOML
[system]
name = "vm"

[[ipcp]]
name = "vm.hv"
type = "shim-hv"
dif = "$DIF"
path = "$res"
side = "guest"
vmpi_id = 1
busy_poll = $(arg busy_poll false)
TOML
rinad --config /run/rinad.toml --socket "$S" --log-level "$(arg log info)" >/tmp/rinad.log 2>&1 &
rinad_pid=$!

i=0
until rinactl --socket "$S" --json ipcps 2>/dev/null | grep -q '"peer_up": *1'; do
    kill -0 "$rinad_pid" 2>/dev/null || fail "rinad exited"
    i=$((i + 1))
    [ "$i" -gt 300 ] && fail "the shim-hv peer is not up after 30 s"
    sleep 0.1
done
echo "GUEST-UP uptime=$(up) shim-hv peer up"
rinactl --socket "$S" ipcps

# The interface bound to the driver $1 (waits up to 5 s for it).
nic_of() {
    i=0
    while [ "$i" -lt 50 ]; do
        for n in /sys/class/net/*; do
            d=$(readlink "$n/device/driver" 2>/dev/null)
            [ "${d##*/}" = "$1" ] && { echo "${n##*/}"; return; }
        done
        i=$((i + 1))
        sleep 0.1
    done
}
bench() {
    sizes=$(arg bench_sizes 1400,4000,8192,16384,65536)
    secs=$(arg bench_s 3)
    port=$(arg iperf_port 5201)
    if [ -s /lib/modules/order ]; then
        while read -r m; do
            insmod "/lib/modules/$m" || echo "GUEST-BENCH-FAIL insmod $m"
        done </lib/modules/order
    fi
    ip link set lo up
    nics=""
    for kind in virtio e1000; do
        addr=$(arg "${kind}_ip" "")
        peer=$(arg "${kind}_peer" "")
        [ -n "$addr" ] && [ -n "$peer" ] || continue
        drv=virtio_net
        [ "$kind" = e1000 ] && drv=e1000
        ifc=$(nic_of "$drv")
        if [ -z "$ifc" ]; then
            echo "GUEST-BENCH-FAIL no $drv interface"
            continue
        fi
        ip addr add "$addr" dev "$ifc"
        ip link set "$ifc" up
        i=0
        until ping -c 1 -W 1 "$peer" >/dev/null 2>&1; do
            i=$((i + 1))
            [ "$i" -gt 10 ] && break
        done
        echo "GUEST-NIC $kind $ifc $addr peer $peer mtu $(cat "/sys/class/net/$ifc/mtu") ping_tries=$i"
        nics="$nics $kind:$peer"
    done
    for mode in rings norings; do
        dst=perf
        flag=""
        if [ "$mode" = norings ]; then
            dst=perf-nr
            flag=--no-rings
        fi
        # shellcheck disable=SC2086 # $flag is empty or one word
        out=$(rina-perf client --socket "$S" --dif "$DIF" --dst "$dst" --name "vm-perf-$mode" $flag \
            --duration-s "$secs" --sweep "$sizes" --csv 2>&1)
        echo "$out" | sed "s/^/GUEST-BENCH-PERF $mode /"
        echo "GUEST-BENCH-STEP $mode done uptime=$(up)"
    done
    for kp in $nics; do
        kind=${kp%%:*}
        peer=${kp#*:}
        for s in $(echo "$sizes" | tr , ' '); do
            u=$s
            [ "$u" -gt 65507 ] && u=65507
            for proto in udp tcp; do
                if [ "$proto" = udp ]; then
                    set -- -u -l "$u" -b 0
                else
                    set -- -l "$s"
                fi
                # One retry: the server may still be closing the last test.
                for try in 1 2; do
                    out=$(iperf3 -c "$peer" -p "$port" "$@" -t "$secs" -i 0 -J 2>&1 | tr -d '\n')
                    case "$out" in *'"error"'*) sleep 1 ;; *) break ;; esac
                done
                echo "GUEST-BENCH-IPERF $kind $proto $s $out"
            done
        done
        echo "GUEST-BENCH-STEP $kind done uptime=$(up)"
    done
}
if [ "$(arg mode test)" = bench ]; then
    bench
    finish
fi

# 1. guest -> host
n=$(arg echo_count 20)
out=$(rina-echo client --socket "$S" --dif "$DIF" --dst echo --name vm-echo-client \
    --count "$n" --interval-ms 20 --size "$(arg echo_size 1000)" --json 2>&1)
echo "GUEST-JSON echo $out"
recv=$(jnum received "$out")
avg=$(echo "$out" | sed -n 's/.*"rtt_ms":{[^}]*"avg":\([0-9.e+-]*\).*/\1/p')
p50=$(echo "$out" | sed -n 's/.*"rtt_ms":{[^}]*"p50":\([0-9.e+-]*\).*/\1/p')
if [ "$recv" = "$n" ]; then
    echo "GUEST-RESULT echo ok $recv/$n rtt_avg_ms=$avg rtt_p50_ms=$p50"
else
    echo "GUEST-RESULT echo fail ${recv:-0}/$n"
fi

out=$(rina-perf client --socket "$S" --dif "$DIF" --dst perf --name vm-perf-client \
    --duration-s "$(arg perf_s 2)" --sweep "$(arg perf_sizes 1400,65536)" --csv 2>&1)
echo "$out" | sed 's/^/GUEST-PERF-CSV /'
echo "$out" | grep '^[0-9]' | while IFS=, read -r size sent recv loss tx rx rxps; do
    echo "GUEST-RESULT perf size=$size sent=$sent recv=$recv loss_pct=$loss rx_mbps=$rx"
done

# 2. host -> guest
rina-echo server --socket "$S" --dif "$DIF" --name vm-echo --max-flows 1 >/tmp/echo-server.log 2>&1 &
e_pid=$!
rina-perf server --socket "$S" --dif "$DIF" --name vm-perf --max-flows 1 >/tmp/perf-server.log 2>&1 &
p_pid=$!
i=0
until [ "$(rinactl --socket "$S" names 2>/dev/null | grep -c 'vm-echo\|vm-perf')" -ge 2 ]; do
    i=$((i + 1))
    [ "$i" -gt 100 ] && fail "the guest servers did not register"
    sleep 0.1
done
echo "GUEST-SERVING vm-echo vm-perf"
serve_s=$(arg serve_s 90)
i=0
while kill -0 "$e_pid" 2>/dev/null || kill -0 "$p_pid" 2>/dev/null; do
    i=$((i + 1))
    if [ "$i" -gt $((serve_s * 10)) ]; then
        echo "GUEST-RESULT serve timeout after ${serve_s} s"
        kill "$e_pid" "$p_pid" 2>/dev/null
        break
    fi
    sleep 0.1
done
wait "$e_pid" 2>/dev/null
wait "$p_pid" 2>/dev/null
sed 's/^/GUEST-LOG echo-server: /' /tmp/echo-server.log
sed 's/^/GUEST-LOG perf-server: /' /tmp/perf-server.log
rinactl --socket "$S" ipcps
finish
