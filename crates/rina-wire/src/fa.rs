//! Flow-allocator messages of a normal DIF, as CDAP on RIB objects.
//!
//! The flow allocator of a normal IPCP sets up a flow between two
//! applications by creating a flow object on the destination IPCP, and tears
//! it down by deleting it (seed 000, the flow allocator of §7; IRATI's object
//! model). The messages are CDAP ([`crate::cdap`]) in management PDUs (PCI
//! type MGMT) whose payload starts with [`CDAP_MGMT_DISCRIMINATOR`],
//! addressed to the destination IPCP and relayed by the RMT like data:
//!
//! | message | CDAP | object name | value |
//! | --- | --- | --- | --- |
//! | REQUEST | `M_CREATE` | `/fa/flows/key=<requester address>-<requester CEP-id>` | [`Flow`]: names, source address, connection id (QoS-id, source CEP-id), QoS parameters |
//! | RESPONSE | `M_CREATE_R` | the same | [`Flow`]: connection id (both CEP-ids), largest SDU; `result` ([`FaResult`]) and `result_reason` say why a flow was refused |
//! | DEALLOC | `M_DELETE` | `/fa/flows/key=<receiver address>-<receiver CEP-id>` | [`Flow`]: connection id (source = the sender's CEP-id) |
//! | DEALLOC-ACK | `M_DELETE_R` | the same | [`Flow`]: connection id (source = the acknowledger's CEP-id) |
//!
//! Every message has an invoke id, derived from the CEP-id of the end that
//! asked (so a repeated request and its answer carry the same one); the
//! object's class is [`FLOW_CLASS`]. Only [`FaMessage::encode`] and
//! [`FaMessage::parse`] know the bytes.

use crate::cdap::{ApplicationProcessNamingInfo, CdapMessage, InvokeId, ObjVal, OpCode};
use crate::codec::WireError;
use crate::name::AppName;
use crate::qos::QosSpec;

/// First byte of a management payload that holds one encoded CDAP message.
pub const CDAP_MGMT_DISCRIMINATOR: u8 = 0xC0;

/// Class of flow objects.
pub const FLOW_CLASS: &str = "Flow";

/// `max_allowable_gap_sdu` meaning any gap (IRATI's -1).
const ANY_GAP: i32 = -1;

/// Where flow objects live in the RIB.
pub const FLOWS_PATH: &str = "/fa/flows";

/// Outcome of a flow request, as carried in `M_CREATE_R`'s `result`.
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
    fn from_i32(v: i32) -> Result<Self, WireError> {
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

/// A connection id of a flow (`connectionId_t` of IRATI's
/// `FlowMessage.proto`; CEP-ids widened to 64 bits).
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct ConnectionId {
    /// 1: QoS-id (the QoS cube both ends use).
    #[prost(uint64, tag = "1")]
    pub qos_id: u64,
    /// 2: CEP-id of the end that sends the message.
    #[prost(uint64, tag = "2")]
    pub source_cep_id: u64,
    /// 3: CEP-id of the end that receives it (0 when not known yet).
    #[prost(uint64, tag = "3")]
    pub destination_cep_id: u64,
}

/// QoS parameters of a flow (`qosSpecification_t`: fields 2, 3, 8, 9, 10
/// as in IRATI's `QoSSpecification.proto`; 20–23 are ours, for what a
/// [`QosSpec`] says that IRATI's message has no field for).
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct QosSpecification {
    /// 2: QoS-id of the cube chosen.
    #[prost(uint64, optional, tag = "2")]
    pub qosid: Option<u64>,
    /// 3: average bandwidth, bits per second.
    #[prost(uint64, optional, tag = "3")]
    pub average_bandwidth: Option<u64>,
    /// 8: partial delivery allowed (not reliable).
    #[prost(bool, optional, tag = "8")]
    pub partial_delivery: Option<bool>,
    /// 9: in-order delivery.
    #[prost(bool, optional, tag = "9")]
    pub order: Option<bool>,
    /// 10: largest gap of lost SDUs allowed.
    #[prost(int32, optional, tag = "10")]
    pub max_allowable_gap_sdu: Option<i32>,
    /// 20: largest one-way delay, microseconds.
    #[prost(uint64, optional, tag = "20")]
    pub delay_us: Option<u64>,
    /// 21: largest loss, parts per million.
    #[prost(uint32, optional, tag = "21")]
    pub max_loss_ppm: Option<u32>,
    /// 22: every SDU must arrive.
    #[prost(bool, optional, tag = "22")]
    pub reliable: Option<bool>,
    /// 23: largest SDU the application writes.
    #[prost(uint32, optional, tag = "23")]
    pub max_sdu_size: Option<u32>,
}

impl From<&QosSpec> for QosSpecification {
    /// The spec as sent. A `max_sdu_gap` above
    /// [`MAX_SDU_GAP`](crate::qos::MAX_SDU_GAP), which the
    /// flow allocator refuses before it builds a request, has no number
    /// in IRATI's signed field: it is sent as -1, IRATI's "any gap", and
    /// read back as no bound (`None`).
    fn from(q: &QosSpec) -> Self {
        QosSpecification {
            qosid: None,
            average_bandwidth: q.avg_bandwidth_bps,
            partial_delivery: Some(!q.reliable),
            order: Some(q.in_order),
            max_allowable_gap_sdu: q.max_sdu_gap.map(|g| i32::try_from(g).unwrap_or(ANY_GAP)),
            delay_us: q.max_delay_us,
            max_loss_ppm: q.max_loss_ppm,
            reliable: Some(q.reliable),
            max_sdu_size: q.max_sdu_size,
        }
    }
}

impl From<&QosSpecification> for QosSpec {
    /// The spec a request carries; a negative gap (IRATI's "any gap") is
    /// no bound.
    fn from(q: &QosSpecification) -> Self {
        QosSpec {
            max_delay_us: q.delay_us,
            max_loss_ppm: q.max_loss_ppm,
            avg_bandwidth_bps: q.average_bandwidth,
            in_order: q.order.unwrap_or(false),
            reliable: q.reliable.unwrap_or(false),
            max_sdu_gap: q.max_allowable_gap_sdu.and_then(|g| u32::try_from(g).ok()),
            max_sdu_size: q.max_sdu_size,
            cube: None,
        }
    }
}

/// A flow object (`Flow` of IRATI's `FlowMessage.proto`, the fields this
/// flow allocator uses with their numbers; 20 and 21 are ours). EFCP policies are
/// not sent: both ends take them from the QoS cube the QoS-id names.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct Flow {
    /// 1: name of the requesting application.
    #[prost(message, optional, tag = "1")]
    pub source_naming_info: Option<ApplicationProcessNamingInfo>,
    /// 2: name of the destination application.
    #[prost(message, optional, tag = "2")]
    pub destination_naming_info: Option<ApplicationProcessNamingInfo>,
    /// 5: address of the requesting IPCP.
    #[prost(uint64, optional, tag = "5")]
    pub source_address: Option<u64>,
    /// 6: address of the destination IPCP.
    #[prost(uint64, optional, tag = "6")]
    pub destination_address: Option<u64>,
    /// 7: connection ids (one here).
    #[prost(message, repeated, tag = "7")]
    pub connection_ids: Vec<ConnectionId>,
    /// 10: what the application asked for.
    #[prost(message, optional, tag = "10")]
    pub qos_parameters: Option<QosSpecification>,
    /// 20: largest SDU the responder accepts.
    #[prost(uint32, optional, tag = "20")]
    pub max_sdu_size: Option<u32>,
    /// 21 (ours): in a DEALLOC, the sequence number of the last data PDU
    /// its sender sent on the flow, absent if it sent none.
    #[prost(uint64, optional, tag = "21")]
    pub last_seq: Option<u64>,
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
        /// The requester's address.
        dst_addr: u64,
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
    /// Tears a flow down (deletes the receiver's flow object).
    Dealloc {
        /// The receiver's address.
        dst_addr: u64,
        /// The receiver's CEP-id.
        dst_cep: u64,
        /// The sender's CEP-id.
        src_cep: u64,
        /// The sequence number of the last data PDU the sender sent on the
        /// flow (`None`: none, or a sender that does not say): the
        /// receiver closes the flow once it has that PDU, which may come
        /// after the DEALLOC.
        last_seq: Option<u64>,
    },
    /// Acknowledges a DEALLOC: the flow is gone at its sender (or was
    /// never known there).
    DeallocAck {
        /// The acknowledger's address (the deleted object's).
        src_addr: u64,
        /// The DEALLOC's sender's CEP-id.
        dst_cep: u64,
        /// The acknowledger's CEP-id.
        src_cep: u64,
    },
}

/// The name of the flow object of the end at `addr` with CEP-id `cep`.
pub fn flow_obj_name(addr: u64, cep: u64) -> String {
    format!("{FLOWS_PATH}/key={addr}-{cep}")
}

/// The invoke id of the exchange started by the end with CEP-id `cep`:
/// never 0, never negative.
fn invoke_of(cep: u64) -> InvokeId {
    (cep % (i32::MAX as u64)) as i32 + 1
}

fn bad(field: &'static str) -> WireError {
    WireError::BadValue { field, value: 0 }
}

impl FaMessage {
    /// Whether a management payload is a CDAP message on a flow object; it
    /// may still fail to parse as a flow-allocator message.
    pub fn is_fa(payload: &[u8]) -> bool {
        payload.first() == Some(&CDAP_MGMT_DISCRIMINATOR)
            && CdapMessage::decode(&payload[1..])
                .is_ok_and(|m| m.obj_class.as_deref() == Some(FLOW_CLASS))
    }

    /// Parses a whole management payload, discriminator included. Never
    /// panics; malformed input is an error.
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        match buf.first() {
            None => {
                return Err(WireError::Truncated {
                    at: 0,
                    need: 1,
                    have: 0,
                })
            }
            Some(&d) if d != CDAP_MGMT_DISCRIMINATOR => {
                return Err(WireError::BadValue {
                    field: "fa.discriminator",
                    value: d as u64,
                })
            }
            Some(_) => {}
        }
        let m = CdapMessage::decode(&buf[1..]).map_err(|_| bad("fa.cdap"))?;
        Self::from_cdap(&m)
    }

    /// The flow-allocator message a decoded CDAP message holds.
    pub fn from_cdap(m: &CdapMessage) -> Result<Self, WireError> {
        if m.obj_class.as_deref() != Some(FLOW_CLASS)
            || !m
                .obj_name
                .as_deref()
                .is_some_and(|n| n.starts_with(FLOWS_PATH))
        {
            return Err(bad("fa.object"));
        }
        let flow: Flow = m
            .obj_value
            .as_ref()
            .ok_or(bad("fa.value"))?
            .to_object()
            .map_err(|_| bad("fa.value"))?;
        let id = flow
            .connection_ids
            .first()
            .cloned()
            .ok_or(bad("fa.connection_id"))?;
        let msg = match m.op_code() {
            OpCode::Create => FaMessage::Request {
                src_addr: flow.source_address.ok_or(bad("fa.source_address"))?,
                src_cep: id.source_cep_id,
                qos_id: id.qos_id,
                qos: flow
                    .qos_parameters
                    .as_ref()
                    .map(QosSpec::from)
                    .unwrap_or_default(),
                src: name_of(flow.source_naming_info.as_ref())?,
                dst: name_of(flow.destination_naming_info.as_ref())?,
            },
            OpCode::CreateR => FaMessage::Response {
                dst_addr: flow.destination_address.unwrap_or(0),
                dst_cep: id.destination_cep_id,
                src_cep: id.source_cep_id,
                result: FaResult::from_i32(m.result.unwrap_or(0))?,
                max_sdu: flow.max_sdu_size.unwrap_or(0),
                reason: m.result_reason.clone().unwrap_or_default(),
            },
            OpCode::Delete => FaMessage::Dealloc {
                dst_addr: flow.destination_address.unwrap_or(0),
                dst_cep: id.destination_cep_id,
                src_cep: id.source_cep_id,
                last_seq: flow.last_seq,
            },
            OpCode::DeleteR => FaMessage::DeallocAck {
                src_addr: flow.source_address.unwrap_or(0),
                dst_cep: id.destination_cep_id,
                src_cep: id.source_cep_id,
            },
            op => return Err(WireError::UnknownType(op as u8)),
        };
        Ok(msg)
    }

    /// The message as CDAP.
    pub fn to_cdap(&self) -> CdapMessage {
        let conn = |qos_id, source_cep_id, destination_cep_id| {
            vec![ConnectionId {
                qos_id,
                source_cep_id,
                destination_cep_id,
            }]
        };
        let (op, name, invoke, flow, result) = match self {
            FaMessage::Request {
                src_addr,
                src_cep,
                qos_id,
                qos,
                src,
                dst,
            } => {
                let mut q = QosSpecification::from(qos);
                q.qosid = Some(*qos_id);
                let flow = Flow {
                    source_naming_info: Some(src.into()),
                    destination_naming_info: Some(dst.into()),
                    source_address: Some(*src_addr),
                    connection_ids: conn(*qos_id, *src_cep, 0),
                    qos_parameters: Some(q),
                    ..Default::default()
                };
                let name = flow_obj_name(*src_addr, *src_cep);
                (OpCode::Create, name, invoke_of(*src_cep), flow, None)
            }
            FaMessage::Response {
                dst_addr,
                dst_cep,
                src_cep,
                result,
                max_sdu,
                reason,
            } => {
                let flow = Flow {
                    destination_address: Some(*dst_addr),
                    connection_ids: conn(0, *src_cep, *dst_cep),
                    max_sdu_size: Some(*max_sdu),
                    ..Default::default()
                };
                let name = flow_obj_name(*dst_addr, *dst_cep);
                let r = (*result as i32, reason.as_str());
                (OpCode::CreateR, name, invoke_of(*dst_cep), flow, Some(r))
            }
            FaMessage::Dealloc {
                dst_addr,
                dst_cep,
                src_cep,
                last_seq,
            } => {
                let flow = Flow {
                    destination_address: Some(*dst_addr),
                    connection_ids: conn(0, *src_cep, *dst_cep),
                    last_seq: *last_seq,
                    ..Default::default()
                };
                let name = flow_obj_name(*dst_addr, *dst_cep);
                (OpCode::Delete, name, invoke_of(*src_cep), flow, None)
            }
            FaMessage::DeallocAck {
                src_addr,
                dst_cep,
                src_cep,
            } => {
                let flow = Flow {
                    source_address: Some(*src_addr),
                    connection_ids: conn(0, *src_cep, *dst_cep),
                    ..Default::default()
                };
                let name = flow_obj_name(*src_addr, *src_cep);
                (
                    OpCode::DeleteR,
                    name,
                    invoke_of(*dst_cep),
                    flow,
                    Some((0, "")),
                )
            }
        };
        let mut m = CdapMessage::new(op).with_invoke_id(invoke);
        m.obj_class = Some(FLOW_CLASS.into());
        m.obj_name = Some(name);
        m.obj_value = Some(ObjVal::object(&flow));
        if let Some((code, reason)) = result {
            m.result = Some(code);
            m.result_reason = (!reason.is_empty()).then(|| reason.to_string());
        }
        m
    }

    /// Appends the encoded message, discriminator first, to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(CDAP_MGMT_DISCRIMINATOR);
        out.extend_from_slice(&self.to_cdap().encode());
    }

    /// The encoded message as a new buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode(&mut v);
        v
    }
}

/// A valid application name from naming information: the parts exactly
/// as sent, refused ([`WireError::BadName`]) unless they are a valid name
/// whose text form reads back as the same parts ([`AppName::check`]).
fn name_of(n: Option<&ApplicationProcessNamingInfo>) -> Result<AppName, WireError> {
    let n = AppName::from(n.ok_or(bad("fa.name"))?);
    n.check()?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::name::NameError;
    use proptest::prelude::*;

    fn name(s: &str) -> AppName {
        s.parse().unwrap()
    }

    fn every_type() -> Vec<FaMessage> {
        let qos = QosSpec {
            reliable: true,
            in_order: true,
            max_sdu_size: Some(1400),
            max_delay_us: Some(20_000),
            max_sdu_gap: Some(0),
            ..Default::default()
        };
        vec![
            FaMessage::Request {
                src_addr: 3,
                src_cep: 0x1234,
                qos_id: 2,
                qos,
                src: name("perf/1"),
                dst: name("echo//srv"),
            },
            FaMessage::Response {
                dst_addr: 3,
                dst_cep: 0x1234,
                src_cep: 9,
                result: FaResult::Accepted,
                max_sdu: 65_536,
                reason: String::new(),
            },
            FaMessage::Response {
                dst_addr: 3,
                dst_cep: 1,
                src_cep: 0,
                result: FaResult::Refused,
                max_sdu: 0,
                reason: "busy".into(),
            },
            FaMessage::Dealloc {
                dst_addr: 7,
                dst_cep: 9,
                src_cep: 0x1234,
                last_seq: Some(41),
            },
            FaMessage::Dealloc {
                dst_addr: 7,
                dst_cep: 9,
                src_cep: 0x1234,
                last_seq: None,
            },
            FaMessage::DeallocAck {
                src_addr: 7,
                dst_cep: 0x1234,
                src_cep: 9,
            },
        ]
    }

    #[test]
    fn round_trips_every_type() {
        for m in every_type() {
            let v = m.to_vec();
            assert!(FaMessage::is_fa(&v));
            assert_eq!(FaMessage::parse(&v).unwrap(), m);
        }
    }

    #[test]
    fn cdap_view() {
        let [req, acc, _, del, _, ack] = every_type().try_into().unwrap();
        let r = req.to_cdap();
        assert_eq!(r.op_code(), OpCode::Create);
        assert_eq!(r.obj_name.as_deref(), Some("/fa/flows/key=3-4660"));
        let a = acc.to_cdap();
        assert_eq!(a.op_code(), OpCode::CreateR);
        assert_eq!(a.obj_name, r.obj_name);
        assert_eq!(a.invoke_id, r.invoke_id);
        let d = del.to_cdap();
        let k = ack.to_cdap();
        assert_eq!(d.op_code(), OpCode::Delete);
        assert_eq!(k.op_code(), OpCode::DeleteR);
        assert_eq!(d.obj_name.as_deref(), Some("/fa/flows/key=7-9"));
        assert_eq!(d.invoke_id, k.invoke_id);
        assert_eq!(k.obj_name, d.obj_name, "the ack names the deleted object");
    }

    #[test]
    fn malformed_is_an_error() {
        assert!(matches!(
            FaMessage::parse(&[]),
            Err(WireError::Truncated { .. })
        ));
        assert!(matches!(
            FaMessage::parse(&[0x01, 3]),
            Err(WireError::BadValue {
                field: "fa.discriminator",
                ..
            })
        ));
        assert!(FaMessage::parse(&[CDAP_MGMT_DISCRIMINATOR, 0x77]).is_err());
        // Another class is not the flow allocator's.
        let mut m = every_type()[0].to_cdap();
        m.obj_class = Some("Neighbor".into());
        let mut v = vec![CDAP_MGMT_DISCRIMINATOR];
        v.extend_from_slice(&m.encode());
        assert!(!FaMessage::is_fa(&v));
        assert!(FaMessage::parse(&v).is_err());
        // A result code nobody defined.
        let mut m = every_type()[1].to_cdap();
        m.result = Some(42);
        assert!(FaMessage::from_cdap(&m).is_err());
        // A request whose source name is empty (not a valid name).
        let mut m = every_type()[0].to_cdap();
        let mut f: Flow = m.obj_value.as_ref().unwrap().to_object().unwrap();
        f.source_naming_info = Some(ApplicationProcessNamingInfo::default());
        m.obj_value = Some(ObjVal::object(&f));
        assert!(FaMessage::from_cdap(&m).is_err());
    }

    /// A request whose naming information for `which` (1: source, 2:
    /// destination) is replaced by `parts`.
    fn request_naming(which: u8, parts: [&str; 4]) -> CdapMessage {
        let mut m = every_type()[0].to_cdap();
        let mut f: Flow = m.obj_value.as_ref().unwrap().to_object().unwrap();
        let n = ApplicationProcessNamingInfo {
            process_name: parts[0].into(),
            process_instance: parts[1].into(),
            entity_name: parts[2].into(),
            entity_instance: parts[3].into(),
        };
        match which {
            1 => f.source_naming_info = Some(n),
            _ => f.destination_naming_info = Some(n),
        }
        m.obj_value = Some(ObjVal::object(&f));
        m
    }

    #[test]
    fn names_whose_parts_hold_a_slash_are_refused() {
        // Read as text, "admin/1" would become process "admin", instance "1".
        let m = request_naming(1, ["admin/1", "", "", ""]);
        assert_eq!(
            FaMessage::from_cdap(&m),
            Err(WireError::BadName(NameError::ReadsAsAnother(
                "admin/1".into()
            )))
        );
        let m = request_naming(2, ["perf", "", "data/7", ""]);
        assert!(matches!(
            FaMessage::from_cdap(&m),
            Err(WireError::BadName(NameError::ReadsAsAnother(_)))
        ));
        let m = request_naming(1, ["a", "b", "c", "d/e"]);
        assert!(matches!(
            FaMessage::from_cdap(&m),
            Err(WireError::BadName(_))
        ));
        // A valid name is taken part by part.
        let m = request_naming(1, ["perf", "1", "data", "7"]);
        let Ok(FaMessage::Request { src, .. }) = FaMessage::from_cdap(&m) else {
            panic!("a valid name is refused");
        };
        assert_eq!(src, name("perf/1/data/7"));
        let m = request_naming(2, ["echo", "", "srv", ""]);
        let Ok(FaMessage::Request { dst, .. }) = FaMessage::from_cdap(&m) else {
            panic!("a valid name is refused");
        };
        assert_eq!(dst, name("echo//srv"));
    }

    fn request(qos: QosSpec) -> FaMessage {
        FaMessage::Request {
            src_addr: 3,
            src_cep: 5,
            qos_id: 1,
            qos,
            src: name("perf"),
            dst: name("echo"),
        }
    }

    /// The QoS parameters a request carries on the wire.
    fn sent_qos(m: &FaMessage) -> QosSpecification {
        let f: Flow = m.to_cdap().obj_value.unwrap().to_object().unwrap();
        f.qos_parameters.unwrap()
    }

    #[test]
    fn qos_round_trips() {
        let full = QosSpec {
            max_delay_us: Some(u64::MAX),
            max_loss_ppm: Some(1_000_000),
            avg_bandwidth_bps: Some(u64::MAX),
            in_order: true,
            reliable: false,
            max_sdu_gap: Some(crate::qos::MAX_SDU_GAP),
            max_sdu_size: Some(u32::MAX),
            cube: None,
        };
        let gap = |g| QosSpec {
            max_sdu_gap: g,
            ..QosSpec::default()
        };
        for q in [
            QosSpec::default(),
            full,
            gap(Some(0)),
            gap(Some(7)),
            gap(None),
        ] {
            let m = request(q);
            assert_eq!(FaMessage::parse(&m.to_vec()).unwrap(), m, "{q:?}");
        }
        assert_eq!(
            sent_qos(&request(full)).max_allowable_gap_sdu,
            Some(i32::MAX)
        );
    }

    #[test]
    fn a_gap_the_request_cannot_carry_is_sent_as_any_gap() {
        // Not 2147483647, a bound the application did not ask for: IRATI's
        // "any gap", which reads back as no bound.
        let asked = QosSpec {
            max_sdu_gap: Some(u32::MAX),
            ..QosSpec::default()
        };
        let m = request(asked);
        assert_eq!(sent_qos(&m).max_allowable_gap_sdu, Some(-1));
        let FaMessage::Request { qos, .. } = FaMessage::parse(&m.to_vec()).unwrap() else {
            panic!("not a request");
        };
        assert_eq!(qos.max_sdu_gap, None);
    }

    fn any_qos() -> impl Strategy<Value = QosSpec> {
        use proptest::option::of;
        (
            (of(any::<u64>()), of(any::<u32>()), of(any::<u64>())),
            (any::<bool>(), any::<bool>()),
            (of(0..=crate::qos::MAX_SDU_GAP), of(any::<u32>())),
        )
            .prop_map(|((d, l, b), (io, rel), (g, s))| QosSpec {
                max_delay_us: d,
                max_loss_ppm: l,
                avg_bandwidth_bps: b,
                in_order: io,
                reliable: rel,
                max_sdu_gap: g,
                max_sdu_size: s,
                cube: None,
            })
    }

    fn any_name() -> impl Strategy<Value = AppName> {
        (
            "[a-z0-9.]{1,20}",
            "[a-z0-9]{0,5}",
            "[a-z0-9]{0,5}",
            "[a-z0-9]{0,5}",
        )
            .prop_map(|(a, b, c, d)| AppName {
                process_name: a,
                process_instance: b,
                entity_name: c,
                entity_instance: d,
            })
    }

    proptest! {
        #[test]
        fn request_round_trip(
            a in any::<u64>(), c in any::<u64>(), q in any::<u64>(), qos in any_qos(),
            src in any_name(), dst in any_name(),
        ) {
            let msg = FaMessage::Request { src_addr: a, src_cep: c, qos_id: q, qos, src, dst };
            prop_assert_eq!(FaMessage::parse(&msg.to_vec()).unwrap(), msg);
        }

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = FaMessage::parse(&bytes);
        }

        #[test]
        fn parse_never_panics_after_the_discriminator(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let mut v = vec![CDAP_MGMT_DISCRIMINATOR];
            v.extend_from_slice(&bytes);
            let _ = FaMessage::parse(&v);
        }

        #[test]
        fn response_round_trip(
            a in any::<u64>(), d in any::<u64>(), s in any::<u64>(), r in 0i32..5,
            m in any::<u32>(), reason in "[a-z ]{0,40}",
        ) {
            let msg = FaMessage::Response {
                dst_addr: a, dst_cep: d, src_cep: s, result: FaResult::from_i32(r).unwrap(),
                max_sdu: m, reason,
            };
            prop_assert_eq!(FaMessage::parse(&msg.to_vec()).unwrap(), msg);
        }
    }
}
