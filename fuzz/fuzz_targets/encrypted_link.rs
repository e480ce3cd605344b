//! Two members of an encrypting DIF with an attacker on the wire between
//! them (drops, changes, replays, injects). The body is
//! `rina_core::fuzzing::encrypted_link`, also run by the crate's tests.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rina_core::fuzzing::encrypted_link(data);
});
