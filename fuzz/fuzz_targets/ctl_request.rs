//! Control-protocol decoder (JSON): client requests and daemon messages.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rina_wire::ctl::{decode, encode, Message, Request};

fuzz_target!(|data: &[u8]| {
    // Invariant: whatever decodes re-encodes to something that decodes to
    // the same value.
    if let Ok(r) = decode::<Request>(data) {
        let v = encode(&r);
        assert_eq!(
            decode::<Request>(&v).expect("an encoded request decodes"),
            r
        );
    }
    if let Ok(m) = decode::<Message>(data) {
        let v = encode(&m);
        assert_eq!(
            decode::<Message>(&v).expect("an encoded message decodes"),
            m
        );
    }
});
