//! Datagrams of the shim DIF over UDP.
//!
//! One UDP datagram carries one message. The first byte is the type:
//!
//! | type | name | body (big-endian) |
//! | --- | --- | --- |
//! | `0x01` | DATA | dst port-id u32, then exactly one SDU |
//! | `0x02` | ALLOC_REQ | src port-id u32, QoS spec (29 B), src name, dst name (each u16 length + UTF-8), optional direct UDP port u16 |
//! | `0x03` | ALLOC_RESP | dst port-id u32, src port-id u32, result u8, max SDU u32, reason (u16 length + UTF-8), optional direct UDP port u16 |
//! | `0x04` | DEALLOC | dst port-id u32, src port-id u32 |
//! | `0x05` | KEEPALIVE | flags u8 (bit 0: a probe, to be answered), then one or more (dst port-id u32, src port-id u32) pairs: flows the sender holds with the receiver |
//!
//! Port-ids are local to each end; each side learns the other's from the
//! allocation handshake, so a DATA header is only 5 bytes.
//!
//! A direct flow's SDUs bypass the shims: the requester offers the UDP
//! port of a socket of its own for the flow (the optional last field of
//! ALLOC_REQ), the responder answers with the port of its own (of
//! ALLOC_RESP), and each SDU then travels alone in a datagram between those
//! two sockets, with no header. Without both fields the flow is an ordinary
//! one.

use crate::codec::{Reader, WireError, Writer};
use crate::name::AppName;
use crate::qos::QosSpec;

/// Bytes in front of every SDU in a DATA datagram.
pub const DATA_HEADER_LEN: usize = 5;

const T_DATA: u8 = 0x01;
const T_ALLOC_REQ: u8 = 0x02;
const T_ALLOC_RESP: u8 = 0x03;
const T_DEALLOC: u8 = 0x04;
const T_KEEPALIVE: u8 = 0x05;

/// Outcome of an allocation request, as carried in ALLOC_RESP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocResult {
    /// The flow exists on both ends.
    Accepted = 0,
    /// No application with the destination name is registered at the responder.
    NotRegistered = 1,
    /// The destination application refused the flow.
    Refused = 2,
    /// The responder cannot provide the requested QoS.
    QosNotSatisfiable = 3,
    /// The responder has no resources (too many flows or pending requests).
    NoResources = 4,
}

impl AllocResult {
    fn from_u8(v: u8) -> Result<Self, WireError> {
        Ok(match v {
            0 => AllocResult::Accepted,
            1 => AllocResult::NotRegistered,
            2 => AllocResult::Refused,
            3 => AllocResult::QosNotSatisfiable,
            4 => AllocResult::NoResources,
            _ => {
                return Err(WireError::BadValue {
                    field: "alloc_resp.result",
                    value: v as u64,
                })
            }
        })
    }
}

/// A parsed shim-udp datagram, borrowing from the receive buffer.
// The large variants are control messages; the hot `Data` variant lives on
// the stack and is never stored, so boxing would only add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Datagram<'a> {
    /// One SDU of an allocated flow.
    Data { dst_port: u32, sdu: &'a [u8] },
    /// Asks the receiver to allocate a flow to `dst` on behalf of `src`.
    AllocReq {
        src_port: u32,
        qos: QosSpec,
        src: AppName,
        dst: AppName,
        /// The UDP port of the requester's own socket for a direct flow
        /// (port 0 is no port: `Some(0)` goes as `None`).
        direct: Option<u16>,
    },
    /// Answers an ALLOC_REQ; `src_port` is the responder's port-id.
    AllocResp {
        dst_port: u32,
        src_port: u32,
        result: AllocResult,
        max_sdu: u32,
        reason: &'a str,
        /// The UDP port of the responder's own socket for a direct flow
        /// (port 0 is no port: `Some(0)` goes as `None`).
        direct: Option<u16>,
    },
    /// Tears a flow down.
    Dealloc { dst_port: u32, src_port: u32 },
    /// Says that the sender still holds these flows with the receiver; a
    /// probe (it heard nothing on them for a while) asks the receiver to
    /// answer at once with a KEEPALIVE naming those it still holds.
    Keepalive { probe: bool, flows: PortPairs<'a> },
}

/// Most port-id pairs in one KEEPALIVE: 64,002 bytes, within a UDP
/// datagram over IPv4.
pub const MAX_KEEPALIVE_PAIRS: usize = 8_000;

/// Bytes of a KEEPALIVE before its pairs: the type and the flags.
pub const KEEPALIVE_HEADER_LEN: usize = 2;

/// The flag of a KEEPALIVE that asks for an answer.
const KEEPALIVE_PROBE: u8 = 0x01;

/// The flows of a KEEPALIVE: (receiver's port-id, sender's port-id)
/// pairs, 8 bytes each, read in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortPairs<'a>(&'a [u8]);

impl<'a> PortPairs<'a> {
    /// The pairs in `bytes`: at least one, whole pairs only.
    pub fn new(bytes: &'a [u8]) -> Result<Self, WireError> {
        if bytes.is_empty() || !bytes.len().is_multiple_of(8) {
            return Err(WireError::BadValue {
                field: "keepalive.length",
                value: bytes.len() as u64,
            });
        }
        Ok(PortPairs(bytes))
    }

    /// How many pairs.
    pub fn len(&self) -> usize {
        self.0.len() / 8
    }

    /// Never: a KEEPALIVE names at least one flow.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The (receiver's port-id, sender's port-id) pairs, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, u32)> + 'a {
        self.0.chunks_exact(8).map(|c| {
            let (d, s) = c.split_at(4);
            let word = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
            (word(d), word(s))
        })
    }
}

/// A KEEPALIVE (a probe if `probe`) for the flows `pairs` (receiver's
/// port-id, sender's port-id), at most [`MAX_KEEPALIVE_PAIRS`] of them
/// (the rest are left out: the caller splits longer lists).
pub fn keepalive(probe: bool, pairs: &[(u32, u32)]) -> Vec<u8> {
    let pairs = &pairs[..pairs.len().min(MAX_KEEPALIVE_PAIRS)];
    let mut out = Vec::with_capacity(KEEPALIVE_HEADER_LEN + 8 * pairs.len());
    out.push(T_KEEPALIVE);
    out.push(if probe { KEEPALIVE_PROBE } else { 0 });
    for (d, s) in pairs {
        out.put_u32_be(*d);
        out.put_u32_be(*s);
    }
    out
}

impl<'a> Datagram<'a> {
    /// Parses a whole datagram. Never panics; malformed input is an error.
    pub fn parse(buf: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(buf);
        let d = match r.u8()? {
            T_DATA => Datagram::Data {
                dst_port: r.u32()?,
                sdu: r.rest(),
            },
            T_ALLOC_REQ => Datagram::AllocReq {
                src_port: r.u32()?,
                qos: QosSpec::decode(&mut r)?,
                src: r.str16("alloc_req.src")?.parse()?,
                dst: r.str16("alloc_req.dst")?.parse()?,
                direct: optional_port(&mut r)?,
            },
            T_ALLOC_RESP => Datagram::AllocResp {
                dst_port: r.u32()?,
                src_port: r.u32()?,
                result: AllocResult::from_u8(r.u8()?)?,
                max_sdu: r.u32()?,
                reason: r.str16("alloc_resp.reason")?,
                direct: optional_port(&mut r)?,
            },
            T_DEALLOC => Datagram::Dealloc {
                dst_port: r.u32()?,
                src_port: r.u32()?,
            },
            T_KEEPALIVE => {
                let flags = r.u8()?;
                if flags & !KEEPALIVE_PROBE != 0 {
                    return Err(WireError::BadValue {
                        field: "keepalive.flags",
                        value: flags as u64,
                    });
                }
                Datagram::Keepalive {
                    probe: flags == KEEPALIVE_PROBE,
                    flows: PortPairs::new(r.rest())?,
                }
            }
            t => return Err(WireError::UnknownType(t)),
        };
        r.finish()?;
        Ok(d)
    }

    /// Appends the encoded datagram to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Datagram::Data { dst_port, sdu } => {
                out.extend_from_slice(&data_header(*dst_port));
                out.extend_from_slice(sdu);
            }
            Datagram::AllocReq {
                src_port,
                qos,
                src,
                dst,
                direct,
            } => {
                out.push(T_ALLOC_REQ);
                out.put_u32_be(*src_port);
                qos.encode(out);
                out.put_str16(&src.to_string());
                out.put_str16(&dst.to_string());
                if let Some(p) = direct.filter(|&p| p != 0) {
                    out.extend_from_slice(&p.to_be_bytes());
                }
            }
            Datagram::AllocResp {
                dst_port,
                src_port,
                result,
                max_sdu,
                reason,
                direct,
            } => {
                out.push(T_ALLOC_RESP);
                out.put_u32_be(*dst_port);
                out.put_u32_be(*src_port);
                out.push(*result as u8);
                out.put_u32_be(*max_sdu);
                out.put_str16(reason);
                if let Some(p) = direct.filter(|&p| p != 0) {
                    out.extend_from_slice(&p.to_be_bytes());
                }
            }
            Datagram::Dealloc { dst_port, src_port } => {
                out.push(T_DEALLOC);
                out.put_u32_be(*dst_port);
                out.put_u32_be(*src_port);
            }
            Datagram::Keepalive { probe, flows } => {
                out.push(T_KEEPALIVE);
                out.push(if *probe { KEEPALIVE_PROBE } else { 0 });
                out.extend_from_slice(flows.0);
            }
        }
    }

    /// The encoded datagram as a new buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode(&mut v);
        v
    }
}

/// The optional last field of ALLOC_REQ and ALLOC_RESP: a direct flow's
/// UDP port, if the bytes are there (port 0 is no port).
fn optional_port(r: &mut Reader<'_>) -> Result<Option<u16>, WireError> {
    if r.remaining() == 0 {
        return Ok(None);
    }
    Ok(Some(r.u16()?).filter(|&p| p != 0))
}

/// The 5-byte header that precedes an SDU in a DATA datagram.
pub fn data_header(dst_port: u32) -> [u8; DATA_HEADER_LEN] {
    let p = dst_port.to_be_bytes();
    [T_DATA, p[0], p[1], p[2], p[3]]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn name(s: &str) -> AppName {
        s.parse().unwrap()
    }

    #[test]
    fn round_trips_every_type() {
        let qos = QosSpec {
            reliable: true,
            max_sdu_size: Some(1400),
            ..Default::default()
        };
        let msgs = [
            Datagram::Data {
                dst_port: 7,
                sdu: b"hello",
            },
            Datagram::AllocReq {
                src_port: 1,
                qos,
                src: name("perf/1"),
                dst: name("echo//srv"),
                direct: None,
            },
            Datagram::AllocReq {
                src_port: 2,
                qos,
                src: name("perf/1"),
                dst: name("echo//srv"),
                direct: Some(40_000),
            },
            Datagram::AllocResp {
                dst_port: 1,
                src_port: 9,
                result: AllocResult::Refused,
                max_sdu: 1400,
                reason: "busy",
                direct: None,
            },
            Datagram::AllocResp {
                dst_port: 2,
                src_port: 10,
                result: AllocResult::Accepted,
                max_sdu: 1400,
                reason: "",
                direct: Some(40_001),
            },
            Datagram::Dealloc {
                dst_port: 9,
                src_port: 1,
            },
            Datagram::Keepalive {
                probe: true,
                flows: PortPairs::new(&[0, 0, 0, 7, 0, 0, 0, 3, 0, 1, 0, 0, 0, 0, 0, 9]).unwrap(),
            },
            Datagram::Keepalive {
                probe: false,
                flows: PortPairs::new(&[0, 0, 0, 7, 0, 0, 0, 3]).unwrap(),
            },
        ];
        for m in msgs {
            let v = m.to_vec();
            assert_eq!(Datagram::parse(&v).unwrap(), m);
        }
    }

    #[test]
    fn malformed_is_an_error() {
        assert_eq!(
            Datagram::parse(&[]).unwrap_err().to_string(),
            "truncated: needed 1 bytes at offset 0, only 0 left"
        );
        assert_eq!(Datagram::parse(&[0x77]), Err(WireError::UnknownType(0x77)));
        assert!(matches!(
            Datagram::parse(&[T_DEALLOC, 0, 0, 0, 1, 0, 0, 0, 2, 9]),
            Err(WireError::Trailing(1))
        ));
        assert!(matches!(
            Datagram::parse(&[T_ALLOC_RESP, 0, 0, 0, 1, 0, 0, 0, 2, 42, 0, 0, 0, 0, 0, 0]),
            Err(WireError::BadValue { .. })
        ));
    }

    /// Port 0 is no port: a direct port of 0 goes as none, so what is
    /// read back is what the receiver acts on.
    #[test]
    fn a_direct_port_of_zero_goes_as_none() {
        let resp = |direct| Datagram::AllocResp {
            dst_port: 1,
            src_port: 2,
            result: AllocResult::Accepted,
            max_sdu: 1400,
            reason: "",
            direct,
        };
        assert_eq!(resp(Some(0)).to_vec(), resp(None).to_vec());
        let req = |direct| Datagram::AllocReq {
            src_port: 1,
            qos: QosSpec::default(),
            src: name("a"),
            dst: name("b"),
            direct,
        };
        assert_eq!(req(Some(0)).to_vec(), req(None).to_vec());
        assert_eq!(Datagram::parse(&req(Some(0)).to_vec()).unwrap(), req(None));
    }

    #[test]
    fn a_keepalive_names_whole_pairs_and_at_least_one() {
        let v = keepalive(true, &[(7, 3), (65_536, 9)]);
        let Ok(Datagram::Keepalive { probe, flows }) = Datagram::parse(&v) else {
            panic!("{v:?}");
        };
        assert!(probe);
        assert_eq!(flows.len(), 2);
        assert_eq!(flows.iter().collect::<Vec<_>>(), [(7, 3), (65_536, 9)]);
        for bad in [
            &[T_KEEPALIVE, 0][..],
            &v[..v.len() - 1],
            &[T_KEEPALIVE, 1, 0, 0, 0, 7],
        ] {
            assert!(
                matches!(
                    Datagram::parse(bad),
                    Err(WireError::BadValue {
                        field: "keepalive.length",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        let mut flagged = keepalive(false, &[(7, 3)]);
        flagged[1] = 0x02;
        assert!(matches!(
            Datagram::parse(&flagged),
            Err(WireError::BadValue {
                field: "keepalive.flags",
                value: 2
            })
        ));
        let many: Vec<(u32, u32)> = (0..MAX_KEEPALIVE_PAIRS as u32 + 5)
            .map(|p| (p, p))
            .collect();
        let v = keepalive(false, &many);
        assert!(v.len() <= 65_507, "one datagram: {} bytes", v.len());
        let Ok(Datagram::Keepalive {
            probe: false,
            flows,
        }) = Datagram::parse(&v)
        else {
            panic!("a full KEEPALIVE parses");
        };
        assert_eq!(flows.len(), MAX_KEEPALIVE_PAIRS);
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Datagram::parse(&bytes);
        }

        #[test]
        fn data_round_trip(port in any::<u32>(), sdu in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let v = Datagram::Data { dst_port: port, sdu: &sdu }.to_vec();
            prop_assert_eq!(v.len(), DATA_HEADER_LEN + sdu.len());
            prop_assert_eq!(Datagram::parse(&v).unwrap(), Datagram::Data { dst_port: port, sdu: &sdu });
        }
    }
}
