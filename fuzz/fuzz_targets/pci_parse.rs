//! EFCP PCI decoder: constants from the first 4 input bytes, then a PDU.
//!
//! Byte 0: widths of addr, cep, qos, length (2 bits each: 1, 2, 4, 8 bytes);
//! byte 1: widths of seq, ctrl_seq, rate, frame; bytes 2-3: max_pdu_size
//! (big-endian; 0xffff means u32::MAX). The constants are not validated:
//! parsing must not panic whatever they are.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rina_wire::pci::{header_len, Body, DtConstants, FieldWidth, Pdu};

fn constants(h: [u8; 4]) -> DtConstants {
    let w = |b: u8, i: u32| FieldWidth::ALL[((b >> (6 - 2 * i)) & 3) as usize];
    let m = u16::from_be_bytes([h[2], h[3]]);
    DtConstants {
        addr: w(h[0], 0),
        cep: w(h[0], 1),
        qos: w(h[0], 2),
        length: w(h[0], 3),
        seq: w(h[1], 0),
        ctrl_seq: w(h[1], 1),
        rate: w(h[1], 2),
        frame: w(h[1], 3),
        max_pdu_size: if m == u16::MAX { u32::MAX } else { m as u32 },
        max_pdu_lifetime_ms: 60_000,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((h, pdu)) = data.split_first_chunk::<4>() else {
        return;
    };
    let c = constants(*h);
    let Ok(p) = Pdu::parse(&c, pdu) else {
        return;
    };
    // Invariants: the PDU fits where it was found, its body matches its
    // type, and re-encoding gives back exactly the bytes up to `length`.
    let len = p.pci.length as usize;
    assert!(len <= pdu.len() && len <= c.max_pdu_size as usize);
    let hl = header_len(&c, p.pci.pdu_type);
    match p.body {
        Body::Data(d) => {
            assert!(!p.pci.pdu_type.is_control());
            assert_eq!(hl + d.len(), len);
        }
        Body::Control(b) => {
            assert_eq!(b.pdu_type(), p.pci.pdu_type);
            assert_eq!(hl, len);
        }
    }
    let mut again = Vec::new();
    p.encode(&c, &mut again).expect("a parsed PDU re-encodes");
    assert_eq!(&again[..], &pdu[..len]);
    assert_eq!(Pdu::parse(&c, &again), Ok(p));
});
