#!/usr/bin/env bash
# The sans-IO core's work per SDU in instructions (not a timed test): what
# the extra stacked DIF's cost comes from, measured without the host's
# noise. `data_path_core --batch 32 --held-writes` (two systems joined in
# memory, one application flow carrying 1400-byte SDUs, a turn's 32 SDUs
# written and received in batches as rinad does) runs under callgrind
# with 50,000 and 150,000 SDUs over one normal DIF and over two stacked;
# the difference between the two counts, over 100,000, is the work per
# SDU on both sides with the set-up cancelled out. A layer is two stacked
# less one. Needs valgrind (apt-get install valgrind); prints that it
# skipped otherwise.
#
#   bash bench/core_cost.sh
#   RESULTS=out.json bash bench/core_cost.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v valgrind >/dev/null; then
    echo "core_cost: skipped, valgrind is not installed (apt-get install valgrind)"
    exit 0
fi
[ -n "${NO_BUILD:-}" ] || cargo build --release -q -p rina-core --example data_path_core
BIN=${BIN:-${CARGO_TARGET_DIR:-target}/release}/examples/data_path_core
T=$(mktemp -d /tmp/rina-core-cost.XXXXXX)
trap 'rm -rf "$T"' EXIT

# Instructions callgrind counted in a run of data_path_core with $1 SDUs
# and the options after it.
instructions() {
    local n=$1
    shift
    valgrind --tool=callgrind --callgrind-out-file="$T/cg.$n.$*" \
        "$BIN" "$@" --batch 32 --held-writes --sdus "$n" --size 1400 >/dev/null 2>"$T/log"
    sed -n 's/^summary: *//p' "$T/cg.$n.$*"
}

per_sdu() {
    local lo hi
    lo=$(instructions 50000 "$@")
    hi=$(instructions 150000 "$@")
    echo $(((hi - lo) / 100000))
}

one=$(per_sdu)
two=$(per_sdu --stack)
layer=$((two - one))
echo "core instructions per 1400-byte SDU, both sides (callgrind): one normal DIF $one, two stacked $two, a layer $layer"
if [ -n "${RESULTS:-}" ]; then
    printf '{"one_dif": %d, "two_stacked": %d, "layer": %d}\n' "$one" "$two" "$layer" > "$RESULTS"
fi
