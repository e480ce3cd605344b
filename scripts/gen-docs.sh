#!/usr/bin/env bash
# Man pages and shell completions of every binary, generated from their
# clap definitions (each binary's hidden `--generate-docs DIR`, see
# crates/rina-docgen), into DIR (default target/dist): DIR/man/man1/*.1,
# DIR/completions/{*.bash,_*,*.fish}.
#
# Uses the release binaries in $CARGO_TARGET_DIR/release (target/release
# by default; BIN_DIR to override), building them if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/dist}
bins=${BIN_DIR:-${CARGO_TARGET_DIR:-target}/release}
tools="rinactl rina-echo rina-perf rina-tgen rina-ip rina-demo rina-lab rinad"
for t in $tools; do
    if [ ! -x "$bins/$t" ]; then
        cargo build --release -p rinad -p rina-tools -p rina-lab
        break
    fi
done
mkdir -p "$out"
missing=""
for t in $tools; do
    if "$bins/$t" --generate-docs "$out" >/dev/null 2>&1; then
        echo "$t: done"
    else
        missing="$missing $t"
    fi
done
if [ -n "$missing" ]; then
    echo "no --generate-docs in:$missing (their main() does not call rina_docgen::handle yet)" >&2
fi
echo "man pages: $out/man/man1, completions: $out/completions"
