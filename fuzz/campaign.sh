#!/usr/bin/env bash
# A fuzz campaign: every target (or the ones named) runs until RUNS
# executions or MAX_SECONDS, whichever comes first, with cargo-fuzz on the
# nightly toolchain, niced so it can share the machine. Prints a table of
# executions, rate, coverage (libFuzzer's `cov:` edges), corpus size and
# result; exits non-zero on a crash (the input is in artifacts/<target>/).
#
# Usage: fuzz/campaign.sh [RUNS] [MAX_SECONDS] [TARGET...]
#        (defaults: 10000000 runs, 3600 s per target, every target)
#
# SANITIZER=none builds without AddressSanitizer but with overflow checks
# and debug assertions (cargo fuzz -s none -a): about 3x the executions per
# second on the machine-level targets, which reach no `unsafe` code, so
# ASan could only find there what a Rust panic already reports, while the
# overflow checks find arithmetic that -O alone would wrap silently.
# The default stays ASan (SANITIZER=address).
set -uo pipefail

runs="${1:-10000000}"
secs="${2:-3600}"
shift 2 2>/dev/null || shift $#
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
if [ $# -gt 0 ]; then targets="$*"; else targets=$(cargo +nightly fuzz list) || exit 2; fi
mkdir -p target/logs
flags=(-O -s "${SANITIZER:-address}")
[ "${SANITIZER:-address}" = none ] && flags+=(-a)
cargo +nightly fuzz build "${flags[@]}" >target/logs-build.txt 2>&1 || { tail -n 30 target/logs-build.txt; exit 2; }

failed=0
printf '%-20s %12s %9s %8s %8s %s\n' target execs exec/s cov corpus result
for t in $targets; do
    mkdir -p "corpus/$t"
    extra=()
    [ -d "seeds/$t" ] && extra+=("seeds/$t")
    args=("-runs=$runs" "-max_total_time=$secs" "-print_final_stats=1" "-rss_limit_mb=2048")
    [ -f "dicts/$t.dict" ] && args+=("-dict=dicts/$t.dict")
    log="target/logs/campaign-$t.log"
    start=$(date +%s)
    if nice -n 19 cargo +nightly fuzz run "${flags[@]}" "$t" "corpus/$t" "${extra[@]}" -- "${args[@]}" >"$log" 2>&1; then
        result="ok"
    else
        result="CRASH (see fuzz/$log, input in fuzz/artifacts/$t/)"
        failed=1
    fi
    took=$(( $(date +%s) - start ))
    execs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -n 1)
    [ -z "$execs" ] && execs=$(grep -oE '^#[0-9]+' "$log" | tail -n 1 | tr -d '#')
    rate=$(grep -oE '^stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -n 1)
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -n 1 | grep -oE '[0-9]+')
    corp=$(ls "corpus/$t" | wc -l)
    printf '%-20s %12s %9s %8s %8s %s (%ss)\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "$corp" "$result" "$took"
done
exit "$failed"
