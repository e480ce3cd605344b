#!/bin/sh
# RUSTC_WRAPPER for the fuzz builds (campaign.sh, run.sh): the cryptography
# crates are compiled without coverage instrumentation, comparison tracing
# and debug assertions, as ordinary optimised code. They are audited,
# constant-time code that is not ours, with no data-dependent branches for
# libFuzzer to follow; instrumented, they took two thirds of
# `encrypted_link`'s time (comparison tracing inside curve25519-dalek
# alone a third) and filled libFuzzer's comparison table with noise. Our
# crates, and every other dependency, stay instrumented. The flags come
# last, after cargo-fuzz's RUSTFLAGS, so they win.
rustc="$1"
shift
case " $* " in
*" --crate-name curve25519_dalek "* | *" --crate-name x25519_dalek "* | \
*" --crate-name ed25519_dalek "* | *" --crate-name sha2 "* | *" --crate-name hmac "* | \
*" --crate-name hkdf "* | *" --crate-name ring "*)
    exec "$rustc" "$@" -Cllvm-args=-sanitizer-coverage-level=0 \
        -Cllvm-args=-sanitizer-coverage-trace-compares=false \
        -Cdebug-assertions=off -Coverflow-checks=off
    ;;
esac
exec "$rustc" "$@"
