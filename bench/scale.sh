#!/usr/bin/env bash
# Scale benchmark (not a timed test): idle flows in one rinad, in one run.
# For a shim-udp IPCP and for a normal IPCP (flows looping back inside it),
# it prints the flows reached, the resident memory per idle flow, the
# allocations per second one at a time and with 64 requests outstanding,
# the daemon's CPU while the flows are idle, and the memory left after
# they all close. Each flow has both ends in the daemon: FLOWS=100000 is
# 50,000 allocations, 100,000 ports and descriptors in the daemon and as
# many in the benchmark's process. Where the hard descriptor limit is
# lower (and cannot be raised: no CAP_SYS_RESOURCE), the run is cut to
# what it allows and says so; the sans-IO core is then measured with all
# FLOWS as well (heap bytes per flow, counted exactly, no descriptors).
# Aims (issue 23): <= 4 KiB per idle flow, >= 5,000 allocations/s.
#
#   bash bench/scale.sh                 # 100,000 flows per DIF kind
#   FLOWS=20000 bash bench/scale.sh
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
for dif in udp normal; do
    echo "== $dif: $FLOWS flows in rinad, $ONE allocations one at a time, the rest $OUTSTANDING outstanding"
    extra=()
    # The default CEP-id field (2 bytes) names 65,535 connections; wider
    # for more.
    [ "$dif" = normal ] && [ "$FLOWS" -gt 65000 ] && extra=(--cep-width 4)
    target/release/examples/flow_scale --rinad target/release/rinad --dif "$dif" \
        --flows "$FLOWS" --one-at-a-time "$ONE" --outstanding "$OUTSTANDING" "${extra[@]}"
    echo "== $dif: $FLOWS flows in the sans-IO core"
    target/release/examples/flow_scale_core --dif "$dif" --flows "$FLOWS"
done
