//! CDAP message decoder (protobuf), plus the object-value payload decoders.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rina_wire::cdap::{
    decode_object, encode_object, CdapMessage, DirectoryForwardingTableEntry,
    EnrollmentInformation, FlowStateObjectGroup, Neighbor,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = CdapMessage::decode(data) {
        // Invariants: a decoded message validates, re-encodes to bytes that
        // decode to the same message, and that encoding is a fixed point
        // (unknown fields and duplicate fields are dropped on the first pass,
        // so `v` may differ from `data`).
        assert_eq!(m.validate(), Ok(()));
        let v = m.encode();
        let m2 = CdapMessage::decode(&v).expect("an encoded message decodes");
        assert_eq!(m2, m);
        assert_eq!(m2.encode(), v);
    }
    // The payload decoders see the same bytes; they must not panic either.
    if let Ok(g) = decode_object::<FlowStateObjectGroup>(data) {
        assert_eq!(decode_object::<FlowStateObjectGroup>(&encode_object(&g)), Ok(g));
    }
    if let Ok(e) = decode_object::<DirectoryForwardingTableEntry>(data) {
        assert_eq!(
            decode_object::<DirectoryForwardingTableEntry>(&encode_object(&e)),
            Ok(e)
        );
    }
    let _ = decode_object::<Neighbor>(data);
    let _ = decode_object::<EnrollmentInformation>(data);
});
