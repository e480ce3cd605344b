//! Shim-UDP datagram decoder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rina_wire::shim_udp::Datagram;

fuzz_target!(|data: &[u8]| {
    let Ok(d) = Datagram::parse(data) else {
        return;
    };
    // Invariant: re-encoding parses back to the same value, and that
    // encoding is a fixed point (unused QoS bits and name spellings are
    // normalised on the first pass, so `v` may differ from `data`).
    let v = d.to_vec();
    let d2 = Datagram::parse(&v).expect("an encoded datagram parses");
    assert_eq!(d2, d);
    assert_eq!(d2.to_vec(), v);
});
