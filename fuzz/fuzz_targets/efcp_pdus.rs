//! Arbitrary (forged) PDUs to a reliable EFCP connection: deliveries stay in order.
//! The body is `rina_core::fuzzing::efcp_pdus`, also run by the crate's tests.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rina_core::fuzzing::efcp_pdus(data);
});
