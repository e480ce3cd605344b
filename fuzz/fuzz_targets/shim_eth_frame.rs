//! Shim-eth frame and ARP decoders.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rina_wire::shim_eth::{Arp, Frame, ETH_P_8021Q};

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = Frame::parse(data) {
        // Invariant: a frame re-encodes to the bytes it came from, unless its
        // tag carried priority bits (dropped) or a second tag follows.
        if f.header.ethertype != ETH_P_8021Q && (data.len() < 16 || data[14] & 0xf0 == 0) {
            assert_eq!(f.to_vec(), data);
        }
        if let Ok(a) = Arp::parse(f.payload) {
            let mut v = Vec::new();
            a.encode(&mut v).expect("a parsed ARP packet encodes");
            assert_eq!(Arp::parse(&v).expect("an encoded ARP packet parses"), a);
        }
    }
    let _ = Arp::parse(data);
});
