//! Management-message fragments from several ports into one reassembler.
//! The body is `rina_core::fuzzing::mgmt_fragments`, also run by the crate's tests.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rina_core::fuzzing::mgmt_fragments(data);
});
