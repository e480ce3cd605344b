#!/usr/bin/env bash
# Man pages and shell completions of every binary, generated from their
# clap definitions (each binary's hidden `--generate-docs DIR`, see
# crates/rina-docgen), into DIR (default target/dist in the repository; a
# relative DIR is taken from the caller's directory): DIR/man/man1/*.1,
# DIR/completions/{*.bash,_*,*.fish}.
#
# Uses the release binaries in $CARGO_TARGET_DIR/release (target/release
# by default), building them if missing; or those in BIN_DIR (relative to
# the caller's directory), which must all be there: nothing is built then.
# Exits non-zero, with the tool's own error, if any tool fails.
set -euo pipefail
out=""
if [ -n "${1:-}" ]; then
    out=$(realpath -m -- "$1")
fi
bins=""
if [ -n "${BIN_DIR:-}" ]; then
    bins=$(realpath -m -- "$BIN_DIR")
fi
cd "$(dirname "$0")/.."
out=${out:-target/dist}
tools="rinactl rina-echo rina-perf rina-tgen rina-ip rina-gw rina-cat rina-demo rina-lab rinad"
if [ -n "$bins" ]; then
    missing=""
    for t in $tools; do
        [ -x "$bins/$t" ] || missing="$missing $t"
    done
    if [ -n "$missing" ]; then
        echo "gen-docs: BIN_DIR=$BIN_DIR ($bins) lacks:$missing (build them there, or unset BIN_DIR to use and build \$CARGO_TARGET_DIR/release)" >&2
        exit 1
    fi
else
    bins=${CARGO_TARGET_DIR:-target}/release
    for t in $tools; do
        if [ ! -x "$bins/$t" ]; then
            cargo build --release -p rinad -p rina-tools -p rina-lab
            break
        fi
    done
fi
mkdir -p "$out"
failed=""
for t in $tools; do
    # The tool's stdout lists the files written; its stderr says why it failed.
    if "$bins/$t" --generate-docs "$out" >/dev/null; then
        echo "$t: done"
    else
        echo "$t: --generate-docs $out failed (status $?)" >&2
        failed="$failed $t"
    fi
done
if [ -n "$failed" ]; then
    echo "gen-docs: failed for:$failed" >&2
    exit 1
fi
echo "man pages: $out/man/man1, completions: $out/completions"
