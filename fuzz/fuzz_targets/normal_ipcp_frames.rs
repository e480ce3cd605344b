//! A whole normal IPCP fed arbitrary frames with explicit time.
//! The body is `rina_core::fuzzing::normal_ipcp_frames`, also run by the crate's tests.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rina_core::fuzzing::normal_ipcp_frames(data);
});
