#!/usr/bin/env bash
# Builds the C API (crates/rina-api) and installs it under PREFIX:
#   PREFIX/lib/librina_api.so, PREFIX/lib/librina_api.a,
#   PREFIX/include/rina/api.h, PREFIX/lib/pkgconfig/rina-api.pc
# Then: PKG_CONFIG_PATH=PREFIX/lib/pkgconfig cc prog.c $(pkg-config --cflags --libs rina-api)
# (not needed for PREFIX=/usr or /usr/local, whose pkgconfig dirs are searched).
#
# usage: scripts/install-capi.sh [--debug | --prebuilt DIR] PREFIX
#   --debug          install a debug build (quicker to build)
#   --prebuilt DIR   install the libraries already built in DIR (no cargo;
#                    the tests use it)
set -euo pipefail

profile=release
target=""
case "${1:-}" in
--debug)
    profile=debug
    shift
    ;;
--prebuilt)
    target=$(realpath "${2:?--prebuilt needs a directory}")
    shift 2
    ;;
esac
if [ $# -ne 1 ]; then
    echo "usage: $0 [--debug | --prebuilt DIR] PREFIX" >&2
    exit 2
fi
prefix=$(realpath -m "$1")
cd "$(dirname "$0")/.."

if [ -z "$target" ]; then
    if [ "$profile" = release ]; then
        cargo build --release -p rina-api
    else
        cargo build -p rina-api
    fi
    target=${CARGO_TARGET_DIR:-target}/$profile
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

install -d "$prefix/lib/pkgconfig" "$prefix/include/rina"
install -m 755 "$target/librina_api.so" "$prefix/lib/"
install -m 644 "$target/librina_api.a" "$prefix/lib/"
install -m 644 crates/rina-api/include/rina/api.h "$prefix/include/rina/"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" \
    crates/rina-api/rina-api.pc.in >"$prefix/lib/pkgconfig/rina-api.pc"
echo "installed the RINA C API in $prefix (pkg-config: $prefix/lib/pkgconfig/rina-api.pc)"
