#!/usr/bin/env bash
# Scale benchmark (not a timed test): idle flows in one rinad, in one run.
# For a shim-udp IPCP and for a normal IPCP (flows looping back inside it),
# it prints the flows reached, the resident memory per idle flow, the
# allocations per second one at a time and with 64 requests outstanding,
# the daemon's CPU while the flows are idle, and the memory left after
# they all close. One at a time is measured twice, alternated: flows the
# application accepts (a request to it, its answer) and flows the daemon
# accepts for it (a registration with `accept`, no round trip to it).
# Each flow has both ends in the daemon: FLOWS=100000 is 50,000
# allocations, 100,000 ports and descriptors in the daemon and as many in
# the benchmark's process. Where the hard descriptor limit is
# lower (and cannot be raised: no CAP_SYS_RESOURCE), that run is cut to
# what it allows and says so. A second run puts every flow in a flow
# bundle (`Op::OpenBundle`: one socket carries all the flows of an
# application), so that no flow holds a descriptor: all FLOWS, whatever
# the limit. The sans-IO core is measured with all FLOWS as well (heap
# bytes per flow, counted exactly, no descriptors).
# Aims (issue 23): <= 4 KiB per idle flow, >= 5,000 allocations/s.
#
#   bash bench/scale.sh                 # 100,000 flows per DIF kind
#   FLOWS=20000 bash bench/scale.sh
#   RESULTS=f.json bash bench/scale.sh  # also write the figures as JSON (the
#                                       # worst of both kinds for the aims)
set -euo pipefail
cd "$(dirname "$0")/.."
FLOWS=${FLOWS:-100000}
OUTSTANDING=${OUTSTANDING:-64}
ONE=${ONE:-4000}        # allocations made one at a time, before the pipelined ones

# Room for both ends of every flow, where this shell may raise its limit.
need=$((FLOWS + 1000))
if [ "$(ulimit -Hn)" != unlimited ] && [ "$(ulimit -Hn)" -lt "$need" ]; then
    ulimit -Hn "$need" 2>/dev/null || echo "bench: the hard descriptor limit stays $(ulimit -Hn)" >&2
fi
ulimit -Sn "$(ulimit -Hn)" 2>/dev/null || true

cargo build --release -q -p rinad --bin rinad --example flow_scale
cargo build --release -q -p rina-core --example flow_scale_core
R=${CARGO_TARGET_DIR:-target}/release
OUT=$(mktemp -d /tmp/rina-bench-scale.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
for dif in udp normal; do
    echo "== $dif: $FLOWS flows in rinad, $ONE allocations one at a time, the rest $OUTSTANDING outstanding"
    extra=()
    # The default CEP-id field (2 bytes) names 65,535 connections; wider
    # for more.
    [ "$dif" = normal ] && [ "$FLOWS" -gt 65000 ] && extra=(--cep-width 4)
    "$R/examples/flow_scale" --rinad "$R/rinad" --dif "$dif" \
        --flows "$FLOWS" --one-at-a-time "$ONE" --outstanding "$OUTSTANDING" "${extra[@]}" \
        | tee "$OUT/$dif.txt"
    echo "== $dif: $FLOWS flows in rinad, in two flow bundles"
    "$R/examples/flow_scale" --rinad "$R/rinad" --dif "$dif" --bundle 1 \
        --flows "$FLOWS" --one-at-a-time "$ONE" --outstanding "$OUTSTANDING" "${extra[@]}" \
        | tee "$OUT/$dif-bundle.txt"
    echo "== $dif: $FLOWS flows in the sans-IO core"
    "$R/examples/flow_scale_core" --dif "$dif" --flows "$FLOWS" | tee "$OUT/$dif-core.txt"
done

python3 - "$OUT" <<'PY'
import json, os, re, sys
out = sys.argv[1]
def figure(name, pattern):
    m = re.search(pattern, open(os.path.join(out, name)).read(), re.M)
    return float(m.group(1)) if m else None
r = {}
for dif in ("udp", "normal"):
    for k, name in (("flows_reached", r"^flows reached: (\d+)"),
                    ("bytes_per_idle_flow", r"^bytes per idle flow: (\d+)"),
                    ("allocs_per_s_one", r"^allocations/s one at a time: (\d+)"),
                    ("allocs_per_s_pipelined", r"^allocations/s with \d+ outstanding: (\d+)"),
                    ("mib_left_after_close", r"\(([\d.]+) MiB more than before")):
        r[f"{dif}_bundle_{k}"] = figure(f"{dif}-bundle.txt", name)
    r[f"{dif}_flows_reached"] = figure(f"{dif}.txt", r"^flows reached: (\d+)")
    r[f"{dif}_bytes_per_idle_flow"] = figure(f"{dif}.txt", r"^bytes per idle flow: (\d+)")
    r[f"{dif}_allocs_per_s_one"] = figure(f"{dif}.txt", r"^allocations/s one at a time: (\d+)")
    r[f"{dif}_allocs_per_s_one_auto"] = figure(f"{dif}.txt", r"^allocations/s one at a time, accepted by the daemon: (\d+)")
    r[f"{dif}_allocs_per_s_pipelined"] = figure(f"{dif}.txt", r"^allocations/s with \d+ outstanding: (\d+)")
    r[f"{dif}_mib_left_after_close"] = figure(f"{dif}.txt", r"\(([\d.]+) MiB more than before")
    r[f"{dif}_core_flows_reached"] = figure(f"{dif}-core.txt", r"^flows reached: (\d+)")
    r[f"{dif}_core_heap_bytes_per_flow"] = figure(f"{dif}-core.txt", r"^heap bytes per idle flow: (\d+)")
worst = lambda keys, f: f(v for v in (r[k] for k in keys) if v is not None)
r["bytes_per_idle_flow"] = worst(["udp_bytes_per_idle_flow", "normal_bytes_per_idle_flow",
                                  "udp_bundle_bytes_per_idle_flow", "normal_bundle_bytes_per_idle_flow"], max)
# Flows one daemon holds: the better of the two ways, for the worse DIF kind.
r["flows_reached"] = min(max(v for v in (r[f"{d}_flows_reached"], r[f"{d}_bundle_flows_reached"]) if v is not None)
                         for d in ("udp", "normal"))
r["flows_reached_fds"] = worst(["udp_flows_reached", "normal_flows_reached"], min)
r["allocs_per_s_bundle"] = worst(["udp_bundle_allocs_per_s_one", "normal_bundle_allocs_per_s_one"], min)
r["allocs_per_s"] = worst(["udp_allocs_per_s_one", "normal_allocs_per_s_one"], min)
r["allocs_per_s_auto"] = worst(["udp_allocs_per_s_one_auto", "normal_allocs_per_s_one_auto"], min)
print(f"aims: >= 100000 idle flows in one daemon (reached: {r['flows_reached']:.0f}; "
      f"{r['flows_reached_fds']:.0f} with a descriptor each), "
      f"<= 4096 B per idle flow (worst: {r['bytes_per_idle_flow']:.0f}), "
      f">= 5000 allocations/s (worst, one at a time: {r['allocs_per_s']:.0f} when the "
      f"application accepts, {r['allocs_per_s_auto']:.0f} when the daemon accepts for it)")
if os.environ.get("RESULTS"):
    json.dump(r, open(os.environ["RESULTS"], "w"))
PY
