//! Flow-allocator messages of a normal DIF.
//!
//! The flow allocator of a normal IPCP sets up a flow between two
//! applications by name with a request/response handshake, and tears it down
//! with a deallocation message. These messages travel as the payload of
//! management PDUs (PCI type MGMT), addressed to the destination IPCP and
//! relayed by the RMT like data.
//!
//! This is an interim encoding: the next step of the stack carries the same
//! three messages as CDAP — `M_CREATE` / `M_CREATE_R` of an object under
//! `/fa/flows` for the request and its response, `M_DELETE` for the
//! deallocation. Only [`FaMessage::encode`] and [`FaMessage::parse`] know the
//! bytes, so the flow allocator's state machine does not change when the
//! transport does.
//!
//! Every payload starts with the discriminator [`FA_DISCRIMINATOR`] so that
//! other management traffic can share the channel (a receiver hands payloads
//! with any other first byte to layer management). Then a type byte, then
//! the body; integers are big-endian, strings are a u16 length and UTF-8:
//!
//! | type | name | body |
//! | --- | --- | --- |
//! | `0x01` | REQUEST | src addr u64, src CEP-id u64, QoS-id u64, QoS spec (29 B), src name, dst name |
//! | `0x02` | RESPONSE | dst CEP-id u64 (the requester's), src CEP-id u64 (the responder's, 0 unless accepted), result u8, max SDU u32, reason |
//! | `0x03` | DEALLOC | dst CEP-id u64 (the receiver's), src CEP-id u64 (the sender's) |
//!
//! Addresses and CEP-ids are written at 8 bytes whatever the DIF's PCI
//! widths: these messages are few, and their format then does not depend on
//! the data-transfer constants.

use crate::codec::{Reader, WireError, Writer};
use crate::name::AppName;
use crate::qos::{QosSpec, QOS_WIRE_LEN};

/// First byte of every flow-allocator payload of a management PDU.
pub const FA_DISCRIMINATOR: u8 = 0xFA;

const T_REQUEST: u8 = 0x01;
const T_RESPONSE: u8 = 0x02;
const T_DEALLOC: u8 = 0x03;

/// Encoded size of a RESPONSE with an empty reason.
pub const RESPONSE_BASE_LEN: usize = 2 + 8 + 8 + 1 + 4 + 2;

/// Encoded size of a REQUEST with empty names (never valid, but the floor).
pub const REQUEST_BASE_LEN: usize = 2 + 8 + 8 + 8 + QOS_WIRE_LEN + 2 + 2;

/// Outcome of a flow request, as carried in RESPONSE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaResult {
    /// The flow exists at the responder.
    Accepted = 0,
    /// No application with the destination name is registered at the responder.
    NotRegistered = 1,
    /// The destination application refused the flow (or did not answer).
    Refused = 2,
    /// The responder cannot provide the requested QoS (e.g. unknown cube).
    QosNotSatisfiable = 3,
    /// The responder has no resources (too many flows or pending requests).
    NoResources = 4,
}

impl FaResult {
    fn from_u8(v: u8) -> Result<Self, WireError> {
        Ok(match v {
            0 => FaResult::Accepted,
            1 => FaResult::NotRegistered,
            2 => FaResult::Refused,
            3 => FaResult::QosNotSatisfiable,
            4 => FaResult::NoResources,
            _ => {
                return Err(WireError::BadValue {
                    field: "fa.response.result",
                    value: v as u64,
                })
            }
        })
    }
}

/// A flow-allocator message.
// Control messages, a few per flow: boxing the names would only add
// allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaMessage {
    /// Asks the IPCP where `dst` is registered for a flow from `src`.
    Request {
        /// Address of the requesting IPCP.
        src_addr: u64,
        /// CEP-id the requester chose for its end.
        src_cep: u64,
        /// QoS cube the requester chose (both ends use its EFCP policies).
        qos_id: u64,
        /// What the application asked for.
        qos: QosSpec,
        /// Name of the requesting application.
        src: AppName,
        /// Name of the destination application.
        dst: AppName,
    },
    /// Answers a REQUEST.
    Response {
        /// The requester's CEP-id (its `src_cep`).
        dst_cep: u64,
        /// The responder's CEP-id; 0 unless the result is `Accepted`.
        src_cep: u64,
        /// The outcome.
        result: FaResult,
        /// Largest SDU the responder accepts on the flow.
        max_sdu: u32,
        /// Why the flow was not accepted (empty when it was).
        reason: String,
    },
    /// Tears a flow down.
    Dealloc {
        /// The receiver's CEP-id.
        dst_cep: u64,
        /// The sender's CEP-id.
        src_cep: u64,
    },
}

impl FaMessage {
    /// Whether a management payload is a flow-allocator message (by its
    /// first byte); it may still fail to parse.
    pub fn is_fa(payload: &[u8]) -> bool {
        payload.first() == Some(&FA_DISCRIMINATOR)
    }

    /// Parses a whole management payload, discriminator included. Never
    /// panics; malformed input is an error.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(buf);
        let d = r.u8()?;
        if d != FA_DISCRIMINATOR {
            return Err(WireError::BadValue {
                field: "fa.discriminator",
                value: d as u64,
            });
        }
        let m = match r.u8()? {
            T_REQUEST => FaMessage::Request {
                src_addr: r.u64()?,
                src_cep: r.u64()?,
                qos_id: r.u64()?,
                qos: QosSpec::decode(&mut r)?,
                src: r.str16("fa.request.src")?.parse()?,
                dst: r.str16("fa.request.dst")?.parse()?,
            },
            T_RESPONSE => FaMessage::Response {
                dst_cep: r.u64()?,
                src_cep: r.u64()?,
                result: FaResult::from_u8(r.u8()?)?,
                max_sdu: r.u32()?,
                reason: r.str16("fa.response.reason")?.to_string(),
            },
            T_DEALLOC => FaMessage::Dealloc {
                dst_cep: r.u64()?,
                src_cep: r.u64()?,
            },
            t => return Err(WireError::UnknownType(t)),
        };
        r.finish()?;
        Ok(m)
    }

    /// Appends the encoded message, discriminator first, to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(FA_DISCRIMINATOR);
        match self {
            FaMessage::Request {
                src_addr,
                src_cep,
                qos_id,
                qos,
                src,
                dst,
            } => {
                out.push(T_REQUEST);
                out.put_u64_be(*src_addr);
                out.put_u64_be(*src_cep);
                out.put_u64_be(*qos_id);
                qos.encode(out);
                out.put_str16(&src.to_string());
                out.put_str16(&dst.to_string());
            }
            FaMessage::Response {
                dst_cep,
                src_cep,
                result,
                max_sdu,
                reason,
            } => {
                out.push(T_RESPONSE);
                out.put_u64_be(*dst_cep);
                out.put_u64_be(*src_cep);
                out.push(*result as u8);
                out.put_u32_be(*max_sdu);
                out.put_str16(reason);
            }
            FaMessage::Dealloc { dst_cep, src_cep } => {
                out.push(T_DEALLOC);
                out.put_u64_be(*dst_cep);
                out.put_u64_be(*src_cep);
            }
        }
    }

    /// The encoded message as a new buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode(&mut v);
        v
    }
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
            FaMessage::Request {
                src_addr: 3,
                src_cep: 0x1234,
                qos_id: 2,
                qos,
                src: name("perf/1"),
                dst: name("echo//srv"),
            },
            FaMessage::Response {
                dst_cep: 0x1234,
                src_cep: 9,
                result: FaResult::Accepted,
                max_sdu: 65_536,
                reason: String::new(),
            },
            FaMessage::Response {
                dst_cep: 1,
                src_cep: 0,
                result: FaResult::Refused,
                max_sdu: 0,
                reason: "busy".into(),
            },
            FaMessage::Dealloc {
                dst_cep: 9,
                src_cep: 0x1234,
            },
        ];
        for m in msgs {
            let v = m.to_vec();
            assert!(FaMessage::is_fa(&v));
            assert_eq!(FaMessage::parse(&v).unwrap(), m);
        }
    }

    #[test]
    fn fixed_layout() {
        let v = FaMessage::Dealloc {
            dst_cep: 1,
            src_cep: 2,
        }
        .to_vec();
        assert_eq!(v, [0xFA, 3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]);
        let r = FaMessage::Response {
            dst_cep: 1,
            src_cep: 2,
            result: FaResult::NoResources,
            max_sdu: 7,
            reason: String::new(),
        }
        .to_vec();
        assert_eq!(r.len(), RESPONSE_BASE_LEN);
        let q = FaMessage::Request {
            src_addr: 1,
            src_cep: 2,
            qos_id: 1,
            qos: QosSpec::default(),
            src: name("a"),
            dst: name("b"),
        }
        .to_vec();
        assert_eq!(q.len(), REQUEST_BASE_LEN + 2);
    }

    #[test]
    fn malformed_is_an_error() {
        assert!(matches!(
            FaMessage::parse(&[]),
            Err(WireError::Truncated { .. })
        ));
        assert!(matches!(
            FaMessage::parse(&[0x01, T_DEALLOC]),
            Err(WireError::BadValue {
                field: "fa.discriminator",
                ..
            })
        ));
        assert_eq!(
            FaMessage::parse(&[FA_DISCRIMINATOR, 0x77]),
            Err(WireError::UnknownType(0x77))
        );
        let mut v = FaMessage::Dealloc {
            dst_cep: 1,
            src_cep: 2,
        }
        .to_vec();
        v.push(0);
        assert_eq!(FaMessage::parse(&v), Err(WireError::Trailing(1)));
        let mut r = FaMessage::Response {
            dst_cep: 1,
            src_cep: 2,
            result: FaResult::Accepted,
            max_sdu: 7,
            reason: String::new(),
        }
        .to_vec();
        r[18] = 42;
        assert!(matches!(
            FaMessage::parse(&r),
            Err(WireError::BadValue {
                field: "fa.response.result",
                ..
            })
        ));
        // A request whose source name is empty (not a valid name).
        let mut q = vec![FA_DISCRIMINATOR, T_REQUEST];
        q.extend_from_slice(&[0; 24]);
        QosSpec::default().encode(&mut q);
        q.extend_from_slice(&[0, 0, 0, 1, b'b']);
        assert!(matches!(FaMessage::parse(&q), Err(WireError::BadName(_))));
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = FaMessage::parse(&bytes);
        }

        #[test]
        fn parse_never_panics_after_the_discriminator(
            t in 0u8..5,
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let mut v = vec![FA_DISCRIMINATOR, t];
            v.extend_from_slice(&bytes);
            let _ = FaMessage::parse(&v);
        }

        #[test]
        fn response_round_trip(
            d in any::<u64>(), s in any::<u64>(), r in 0u8..5, m in any::<u32>(),
            reason in "[a-z ]{0,40}",
        ) {
            let msg = FaMessage::Response {
                dst_cep: d, src_cep: s, result: FaResult::from_u8(r).unwrap(),
                max_sdu: m, reason,
            };
            prop_assert_eq!(FaMessage::parse(&msg.to_vec()).unwrap(), msg);
        }
    }
}
