#!/usr/bin/env bash
# Runs every fuzz target for SECONDS_PER_TARGET seconds (default 30) with
# cargo-fuzz on the nightly toolchain. Exits non-zero if any target crashes;
# the crashing input is saved under fuzz/artifacts/<target>/.
#
# Usage: fuzz/run.sh [SECONDS_PER_TARGET]
set -uo pipefail

secs="${1:-30}"
case "$secs" in
    '' | *[!0-9]*) echo "usage: $0 [SECONDS_PER_TARGET]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")" || exit 2
# The cryptography crates are built uninstrumented (see rustc-wrapper.sh).
# A target folder built before this wrapper keeps them instrumented until
# `cargo clean` (cargo does not track the wrapper).
export RUSTC_WRAPPER="$PWD/rustc-wrapper.sh"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz not found; installing it" >&2
    cargo install cargo-fuzz --locked || exit 2
fi
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "the nightly toolchain is needed: rustup toolchain install nightly" >&2
    exit 2
fi

mkdir -p target/logs
targets=$(cargo +nightly fuzz list) || exit 2
failed=0
summary=""
for t in $targets; do
    mkdir -p "corpus/$t"
    extra=()
    [ -d "seeds/$t" ] && extra+=("seeds/$t")
    args=("-max_total_time=$secs" "-print_final_stats=1")
    [ -f "dicts/$t.dict" ] && args+=("-dict=dicts/$t.dict")
    log="target/logs/$t.log"
    echo "== $t: ${secs}s" >&2
    if cargo +nightly fuzz run "$t" "corpus/$t" "${extra[@]}" -- "${args[@]}" >"$log" 2>&1; then
        result="ok"
    else
        result="CRASH (see $log, input in artifacts/$t/)"
        failed=1
        tail -n 40 "$log" >&2
    fi
    execs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -n 1)
    if [ -z "$execs" ]; then
        # A crash stops the run before the final stats: take the last status line.
        execs=$(grep -oE '^#[0-9]+' "$log" | tail -n 1 | tr -d '#')
    fi
    rate=$(grep -oE '^stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -n 1)
    cov=$(grep -oE '^#[0-9]+.*cov: [0-9]+' "$log" | tail -n 1 | grep -oE 'cov: [0-9]+$')
    summary+=$(printf '%-20s %12s execs %8s/s  %-10s %s' "$t" "${execs:-?}" "${rate:-?}" "${cov:-}" "$result")$'\n'
done

printf '\n%s' "$summary"
exit "$failed"
