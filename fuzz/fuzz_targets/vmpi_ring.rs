//! A host's VMPI link and shim-hv machine facing a guest that owns the
//! shared memory (honest buffers, writes anywhere in the region, restarts).
//! The body is `rina_core::fuzzing::vmpi_ring`, also run by the crate's tests.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rina_core::fuzzing::vmpi_ring(data);
});
