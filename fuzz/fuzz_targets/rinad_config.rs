//! rinad's configuration file and run-time `[[ipcp]]` tables.
//! The body is `rinad::fuzzing::config_text`, also run by the crate's tests.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rinad::fuzzing::config_text(data);
});
