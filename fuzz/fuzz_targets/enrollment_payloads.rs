//! Arbitrary enrollment payloads to a member and an enrollee (password and key policies).
//! The body is `rina_core::fuzzing::enrollment_payloads`, also run by the crate's tests.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rina_core::fuzzing::enrollment_payloads(data);
});
