//! Flow-allocator message decoder (payloads of management PDUs).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rina_wire::fa::FaMessage;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = FaMessage::parse(data) else {
        return;
    };
    // Invariant: what parses re-encodes to something that parses back to
    // the same message, and that encoding is a fixed point.
    let v = m.to_vec();
    let m2 = FaMessage::parse(&v).expect("an encoded FA message parses");
    assert_eq!(m2, m);
    assert_eq!(m2.to_vec(), v);
});
