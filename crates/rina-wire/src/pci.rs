//! EFCP protocol control information (PCI): the header of every PDU of a
//! normal DIF, and the bodies of its control PDUs.
//!
//! The fields follow IRATI's order; their widths come from the DIF's
//! data-transfer constants ([`DtConstants`]), each 1, 2, 4 or 8 bytes, and
//! every field is in **network byte order** (IRATI writes host order):
//!
//! | field | width | notes |
//! | --- | --- | --- |
//! | version | 1 | always [`PCI_VERSION`] |
//! | dst_addr, src_addr | addr | |
//! | qos_id | qos | |
//! | dst_cep, src_cep | cep | connection-endpoint ids |
//! | type | 1 | [`PduType`] code |
//! | flags | 1 | [`flags::DRF`], [`flags::ECN`] |
//! | length | length | whole PDU: header + payload |
//! | seq | seq (DT, MGMT) / ctrl_seq (control PDUs) | |
//! | body | see [`ControlBody`] | control PDUs only |
//!
//! DT and MGMT PDUs carry a payload after the sequence number. Control PDUs
//! carry a fixed body and nothing else. Two quirks of IRATI are fixed here:
//! the control sequence number is written at the ctrl-seq width (IRATI writes
//! it at the seq width), and so is `last_ctrl_seq_rcvd` (IRATI reads and
//! writes it at the seq width in a slot sized for ctrl-seq).
//!
//! Bytes after `length` are link padding and are ignored, as IRATI does.
//!
//! The selective-ack types of IRATI (SACK 0xC9, SNACK 0xCA, SACK_AND_FC 0xCD,
//! SNACK_AND_FC 0xCE) have no defined body there and are not supported: they
//! decode as [`WireError::UnknownType`].

use crate::codec::{Reader, WireError};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The only PCI version this code speaks.
pub const PCI_VERSION: u8 = 1;

/// Width of a PCI field on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u8")]
pub enum FieldWidth {
    /// One byte.
    W1 = 1,
    /// Two bytes.
    W2 = 2,
    /// Four bytes.
    W4 = 4,
    /// Eight bytes.
    W8 = 8,
}

impl FieldWidth {
    /// Every width, smallest first.
    pub const ALL: [FieldWidth; 4] = [
        FieldWidth::W1,
        FieldWidth::W2,
        FieldWidth::W4,
        FieldWidth::W8,
    ];

    /// Number of bytes the field takes.
    pub const fn bytes(self) -> usize {
        self as usize
    }

    /// Largest value the field can hold.
    pub const fn max_value(self) -> u64 {
        match self {
            FieldWidth::W1 => u8::MAX as u64,
            FieldWidth::W2 => u16::MAX as u64,
            FieldWidth::W4 => u32::MAX as u64,
            FieldWidth::W8 => u64::MAX,
        }
    }
}

/// A field width that is not 1, 2, 4 or 8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadFieldWidth(pub u64);

impl fmt::Display for BadFieldWidth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a field width must be 1, 2, 4 or 8 bytes, not {}",
            self.0
        )
    }
}

impl std::error::Error for BadFieldWidth {}

impl TryFrom<u64> for FieldWidth {
    type Error = BadFieldWidth;

    fn try_from(v: u64) -> Result<Self, BadFieldWidth> {
        Ok(match v {
            1 => FieldWidth::W1,
            2 => FieldWidth::W2,
            4 => FieldWidth::W4,
            8 => FieldWidth::W8,
            _ => return Err(BadFieldWidth(v)),
        })
    }
}

impl From<FieldWidth> for u8 {
    fn from(w: FieldWidth) -> u8 {
        w as u8
    }
}

/// The data-transfer constants of a DIF: what its PCI looks like.
///
/// Every member of a DIF must use the same constants. Missing fields take
/// IRATI's defaults (`default.dif`): widths 2 for addresses, CEP ids, QoS
/// ids and length, 4 for sequence numbers, rate and time frame; PDUs of at
/// most 1470 bytes living at most 60 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DtConstants {
    /// Width of `dst_addr` and `src_addr`.
    pub addr: FieldWidth,
    /// Width of `dst_cep` and `src_cep`.
    pub cep: FieldWidth,
    /// Width of `qos_id`.
    pub qos: FieldWidth,
    /// Width of `length`.
    pub length: FieldWidth,
    /// Width of the sequence numbers of DT/MGMT PDUs and of the window
    /// edges and ack/nack numbers in control PDUs.
    pub seq: FieldWidth,
    /// Width of control sequence numbers (`seq` of control PDUs and
    /// `last_ctrl_seq_rcvd`).
    pub ctrl_seq: FieldWidth,
    /// Width of the sender rate in flow-control PDUs.
    pub rate: FieldWidth,
    /// Width of the rate's time frame in flow-control PDUs.
    pub frame: FieldWidth,
    /// Largest PDU, header included, in bytes.
    pub max_pdu_size: u32,
    /// Longest time a PDU may live in the DIF, in milliseconds.
    pub max_pdu_lifetime_ms: u32,
}

/// Length of a DT or MGMT header with the default widths: version (1),
/// destination and source address (2 + 2), QoS-id (2), destination and
/// source CEP-id (2 + 2), type (1), flags (1), length (2), sequence
/// number (4).
const STD_HEADER_LEN: usize = 19;

impl Default for DtConstants {
    fn default() -> Self {
        DtConstants {
            addr: FieldWidth::W2,
            cep: FieldWidth::W2,
            qos: FieldWidth::W2,
            length: FieldWidth::W2,
            seq: FieldWidth::W4,
            ctrl_seq: FieldWidth::W4,
            rate: FieldWidth::W4,
            frame: FieldWidth::W4,
            max_pdu_size: 1470,
            max_pdu_lifetime_ms: 60_000,
        }
    }
}

impl DtConstants {
    /// Length of the fields every PDU starts with, up to and including `length`.
    pub fn base_len(&self) -> usize {
        1 + 2 * self.addr.bytes()
            + self.qos.bytes()
            + 2 * self.cep.bytes()
            + 1
            + 1
            + self.length.bytes()
    }

    /// The `length` field of the PDU `pdu` starts with (the whole PDU's
    /// length, which link padding after it does not change), if `pdu` is
    /// long enough to hold it. Nothing else is checked.
    pub fn pdu_length(&self, pdu: &[u8]) -> Option<u64> {
        uint_at(pdu, self.base_len() - self.length.bytes(), self.length)
    }

    /// Whether DT and MGMT headers have the default widths
    /// ([`DtConstants::default`]: 2-byte addresses, QoS-id, CEP-ids and
    /// length, a 4-byte sequence number), which are read and written at
    /// fixed offsets ([`STD_HEADER_LEN`] bytes) rather than field by field.
    #[inline]
    fn std_data_layout(&self) -> bool {
        self.addr == FieldWidth::W2
            && self.cep == FieldWidth::W2
            && self.qos == FieldWidth::W2
            && self.length == FieldWidth::W2
            && self.seq == FieldWidth::W4
    }

    /// Length of the longest header (or control PDU) of any type.
    pub fn max_header_len(&self) -> usize {
        PduType::ALL
            .iter()
            .map(|&t| header_len(self, t))
            .max()
            .unwrap_or(0)
    }

    /// Largest payload of a DT or MGMT PDU (0 if the constants leave no room).
    pub fn max_data_payload(&self) -> usize {
        (self.max_pdu_size as usize).saturating_sub(header_len(self, PduType::Dt))
    }

    /// Checks that `max_pdu_size` holds the largest header plus one byte
    /// and fits the length field.
    pub fn validate(&self) -> Result<(), WireError> {
        let min = self.max_header_len() as u64 + 1;
        let max = self.length.max_value().min(u32::MAX as u64);
        let v = self.max_pdu_size as u64;
        if v < min || v > max {
            return Err(WireError::BadConstant {
                field: "max_pdu_size",
                value: v,
                min,
                max,
            });
        }
        Ok(())
    }

    fn slot(&self, s: Slot) -> FieldWidth {
        match s {
            Slot::Seq => self.seq,
            Slot::CtrlSeq => self.ctrl_seq,
            Slot::Rate => self.rate,
            Slot::Frame => self.frame,
        }
    }
}

/// The kind of a PDU, with IRATI's type codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PduType {
    /// Data transfer: a (fragment of an) SDU of a flow.
    Dt = 0x80,
    /// Layer management: a CDAP message between neighbours.
    Mgmt = 0x40,
    /// Control ack: answers a rendezvous.
    Cack = 0xC0,
    /// Positive acknowledgement.
    Ack = 0xC1,
    /// Negative acknowledgement.
    Nack = 0xC2,
    /// Flow control: window and rate update.
    Fc = 0xC4,
    /// Acknowledgement and flow control.
    AckFc = 0xC5,
    /// Negative acknowledgement and flow control.
    NackFc = 0xC6,
    /// Rendezvous: sent when the window has been closed for too long.
    Rendezvous = 0xCF,
}

impl PduType {
    /// Every supported type.
    pub const ALL: [PduType; 9] = [
        PduType::Dt,
        PduType::Mgmt,
        PduType::Cack,
        PduType::Ack,
        PduType::Nack,
        PduType::Fc,
        PduType::AckFc,
        PduType::NackFc,
        PduType::Rendezvous,
    ];

    /// The type byte on the wire.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The type with this code; [`WireError::UnknownType`] for any other byte.
    pub fn from_code(code: u8) -> Result<Self, WireError> {
        Ok(match code {
            0x80 => PduType::Dt,
            0x40 => PduType::Mgmt,
            0xC0 => PduType::Cack,
            0xC1 => PduType::Ack,
            0xC2 => PduType::Nack,
            0xC4 => PduType::Fc,
            0xC5 => PduType::AckFc,
            0xC6 => PduType::NackFc,
            0xCF => PduType::Rendezvous,
            _ => return Err(WireError::UnknownType(code)),
        })
    }

    /// True for control PDUs (everything but DT and MGMT).
    pub const fn is_control(self) -> bool {
        !matches!(self, PduType::Dt | PduType::Mgmt)
    }

    /// The width of `seq` for this type: `seq` for DT/MGMT, `ctrl_seq` for control PDUs.
    fn seq_width(self, c: &DtConstants) -> FieldWidth {
        if self.is_control() {
            c.ctrl_seq
        } else {
            c.seq
        }
    }
}

/// Bits of the PCI `flags` byte.
pub mod flags {
    /// Data run flag: this is the first PDU of a new run (DTP state reset).
    pub const DRF: u8 = 0x80;
    /// Explicit congestion notification.
    pub const ECN: u8 = 0x01;
}

/// The fields every PDU starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pci {
    /// Protocol version; must be [`PCI_VERSION`].
    pub version: u8,
    /// Address of the destination IPC process.
    pub dst_addr: u64,
    /// Address of the source IPC process.
    pub src_addr: u64,
    /// QoS cube of the connection.
    pub qos_id: u64,
    /// Connection-endpoint id at the destination.
    pub dst_cep: u64,
    /// Connection-endpoint id at the source.
    pub src_cep: u64,
    /// Kind of PDU.
    pub pdu_type: PduType,
    /// Flag bits, see [`flags`].
    pub flags: u8,
    /// Total PDU length, header and payload. Filled in by the decoder;
    /// the encoders compute it and ignore this value.
    pub length: u64,
    /// DT/MGMT: sequence number; control PDUs: control sequence number.
    pub seq: u64,
}

impl Pci {
    /// A PCI of the given type, version 1, every other field zero.
    pub fn new(pdu_type: PduType) -> Self {
        Pci {
            version: PCI_VERSION,
            dst_addr: 0,
            src_addr: 0,
            qos_id: 0,
            dst_cep: 0,
            src_cep: 0,
            pdu_type,
            flags: 0,
            length: 0,
            seq: 0,
        }
    }

    /// Writes the header of a DT or MGMT PDU in place.
    ///
    /// `pdu` is the whole PDU: [`header_len`] bytes of room followed by the
    /// payload, already in place. Exactly the first `header_len` bytes are
    /// written; the length field is set to `pdu.len()` (`self.length` is
    /// ignored). Errors: control type ([`WireError::BodyMismatch`], use
    /// [`encode_control`]), version not 1, `pdu` shorter than the header,
    /// longer than `max_pdu_size`, or a value too wide for its field. On
    /// error the header bytes may be partly written.
    pub fn write_header(&self, c: &DtConstants, pdu: &mut [u8]) -> Result<(), WireError> {
        if self.pdu_type.is_control() {
            return Err(WireError::BodyMismatch(self.pdu_type.code()));
        }
        let total = pdu.len();
        // (It writes nothing into a buffer shorter than the header.)
        if self.write_data_base(c, pdu, total) {
            return Ok(());
        }
        let hl = header_len(c, self.pdu_type);
        if pdu.len() < hl {
            return Err(WireError::Truncated {
                at: 0,
                need: hl,
                have: pdu.len(),
            });
        }
        let mut w = SliceWriter { buf: pdu, pos: 0 };
        self.write_base(c, &mut w, total)?;
        debug_assert_eq!(w.pos, hl);
        Ok(())
    }

    /// [`Pci::write_base`] of a DT or MGMT header whose values all fit, the
    /// one every SDU takes: the fields at their offsets with no error built
    /// per field. False, with nothing written, if anything would be
    /// refused; [`Pci::write_base`] then names the error.
    fn write_data_base(&self, c: &DtConstants, pdu: &mut [u8], total: usize) -> bool {
        if c.std_data_layout() {
            return self.write_std_data(c, pdu, total);
        }
        let fits = |w: FieldWidth, v: u64| v <= w.max_value();
        if self.version != PCI_VERSION
            || self.pdu_type.is_control()
            || total as u64 > c.max_pdu_size as u64
            || !fits(c.addr, self.dst_addr.max(self.src_addr))
            || !fits(c.qos, self.qos_id)
            || !fits(c.cep, self.dst_cep.max(self.src_cep))
            || !fits(c.length, total as u64)
            || !fits(c.seq, self.seq)
        {
            return false;
        }
        let Some(h) = pdu.get_mut(..c.base_len() + c.seq.bytes()) else {
            return false;
        };
        // Every value fits its width and the fields fill `h` exactly, so
        // no write below can fail.
        h[0] = PCI_VERSION;
        let mut at = 1;
        put_at(h, &mut at, c.addr, self.dst_addr);
        put_at(h, &mut at, c.addr, self.src_addr);
        put_at(h, &mut at, c.qos, self.qos_id);
        put_at(h, &mut at, c.cep, self.dst_cep);
        put_at(h, &mut at, c.cep, self.src_cep);
        put_at(h, &mut at, FieldWidth::W1, self.pdu_type.code() as u64);
        put_at(h, &mut at, FieldWidth::W1, self.flags as u64);
        put_at(h, &mut at, c.length, total as u64);
        put_at(h, &mut at, c.seq, self.seq);
        true
    }

    /// [`Pci::write_data_base`] with the default widths: the checks of
    /// that function against the widths' known limits, then every field
    /// at its offset, stored at once.
    fn write_std_data(&self, c: &DtConstants, pdu: &mut [u8], total: usize) -> bool {
        const W2: u64 = u16::MAX as u64;
        if self.version != PCI_VERSION
            || self.pdu_type.is_control()
            || total as u64 > c.max_pdu_size as u64
            || (self.dst_addr | self.src_addr | self.qos_id) > W2
            || (self.dst_cep | self.src_cep | total as u64) > W2
            || self.seq > u32::MAX as u64
        {
            return false;
        }
        let Some(h) = pdu.first_chunk_mut::<STD_HEADER_LEN>() else {
            return false;
        };
        // Every value fits its width: the header is one array of known
        // offsets, stored at once.
        let w2 = |v: u64| (v as u16).to_be_bytes();
        let ([d0, d1], [s0, s1], [q0, q1]) =
            (w2(self.dst_addr), w2(self.src_addr), w2(self.qos_id));
        let ([e0, e1], [f0, f1], [l0, l1]) = (w2(self.dst_cep), w2(self.src_cep), w2(total as u64));
        let [n0, n1, n2, n3] = (self.seq as u32).to_be_bytes();
        let (t, fl) = (self.pdu_type.code(), self.flags);
        *h = [
            PCI_VERSION,
            d0,
            d1,
            s0,
            s1,
            q0,
            q1,
            e0,
            e1,
            f0,
            f1,
            t,
            fl,
            l0,
            l1,
            n0,
            n1,
            n2,
            n3,
        ];
        true
    }

    /// Writes everything up to and including `seq`, for a PDU of `total` bytes.
    fn write_base(
        &self,
        c: &DtConstants,
        w: &mut SliceWriter<'_>,
        total: usize,
    ) -> Result<(), WireError> {
        if self.version != PCI_VERSION {
            return Err(WireError::BadVersion(self.version));
        }
        if total as u64 > c.max_pdu_size as u64 {
            return Err(WireError::PduTooLong {
                length: total as u64,
                max: c.max_pdu_size as u64,
            });
        }
        w.put("version", FieldWidth::W1, self.version as u64)?;
        w.put("dst_addr", c.addr, self.dst_addr)?;
        w.put("src_addr", c.addr, self.src_addr)?;
        w.put("qos_id", c.qos, self.qos_id)?;
        w.put("dst_cep", c.cep, self.dst_cep)?;
        w.put("src_cep", c.cep, self.src_cep)?;
        w.put("type", FieldWidth::W1, self.pdu_type.code() as u64)?;
        w.put("flags", FieldWidth::W1, self.flags as u64)?;
        w.put("length", c.length, total as u64)?;
        w.put("seq", self.pdu_type.seq_width(c), self.seq)
    }
}

/// The body of a control PDU, after the control sequence number.
///
/// Sequence numbers and window edges are at the `seq` width,
/// `last_ctrl_seq_rcvd` at the `ctrl_seq` width, `rate` and `frame` at
/// theirs; the fields are on the wire in the order they are listed here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControlBody {
    /// [`PduType::Ack`]: everything up to `ack_sn` arrived.
    Ack { ack_sn: u64 },
    /// [`PduType::Nack`]: `nack_sn` is missing.
    Nack { nack_sn: u64 },
    /// [`PduType::Fc`]: new right window edge, the sender's own window and rate.
    Fc {
        new_rwe: u64,
        my_lwe: u64,
        my_rwe: u64,
        rate: u64,
        frame: u64,
    },
    /// [`PduType::AckFc`]: an ack and a window update together.
    AckFc {
        ack_sn: u64,
        last_ctrl_seq_rcvd: u64,
        new_lwe: u64,
        new_rwe: u64,
        my_lwe: u64,
        my_rwe: u64,
        rate: u64,
        frame: u64,
    },
    /// [`PduType::NackFc`]: a nack and a window update together.
    NackFc {
        nack_sn: u64,
        last_ctrl_seq_rcvd: u64,
        new_lwe: u64,
        new_rwe: u64,
        my_lwe: u64,
        my_rwe: u64,
        rate: u64,
        frame: u64,
    },
    /// [`PduType::Cack`]: answer to a rendezvous, with the full window state.
    Cack {
        last_ctrl_seq_rcvd: u64,
        new_lwe: u64,
        new_rwe: u64,
        my_lwe: u64,
        my_rwe: u64,
        rate: u64,
        frame: u64,
    },
    /// [`PduType::Rendezvous`]: the window has been closed too long; same fields as `Cack`.
    Rendezvous {
        last_ctrl_seq_rcvd: u64,
        new_lwe: u64,
        new_rwe: u64,
        my_lwe: u64,
        my_rwe: u64,
        rate: u64,
        frame: u64,
    },
}

/// Which data-transfer constant sizes a control body field.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Seq,
    CtrlSeq,
    Rate,
    Frame,
}

const ACK: &[(&str, Slot)] = &[("ack_sn", Slot::Seq)];
const NACK: &[(&str, Slot)] = &[("nack_sn", Slot::Seq)];
const FC: &[(&str, Slot)] = &[
    ("new_rwe", Slot::Seq),
    ("my_lwe", Slot::Seq),
    ("my_rwe", Slot::Seq),
    ("rate", Slot::Rate),
    ("frame", Slot::Frame),
];
const ACK_FC: &[(&str, Slot)] = &[
    ("ack_sn", Slot::Seq),
    ("last_ctrl_seq_rcvd", Slot::CtrlSeq),
    ("new_lwe", Slot::Seq),
    ("new_rwe", Slot::Seq),
    ("my_lwe", Slot::Seq),
    ("my_rwe", Slot::Seq),
    ("rate", Slot::Rate),
    ("frame", Slot::Frame),
];
const NACK_FC: &[(&str, Slot)] = &[
    ("nack_sn", Slot::Seq),
    ("last_ctrl_seq_rcvd", Slot::CtrlSeq),
    ("new_lwe", Slot::Seq),
    ("new_rwe", Slot::Seq),
    ("my_lwe", Slot::Seq),
    ("my_rwe", Slot::Seq),
    ("rate", Slot::Rate),
    ("frame", Slot::Frame),
];
const CACK: &[(&str, Slot)] = &[
    ("last_ctrl_seq_rcvd", Slot::CtrlSeq),
    ("new_lwe", Slot::Seq),
    ("new_rwe", Slot::Seq),
    ("my_lwe", Slot::Seq),
    ("my_rwe", Slot::Seq),
    ("rate", Slot::Rate),
    ("frame", Slot::Frame),
];

/// The fields of a control body of type `t`, in wire order (none for DT/MGMT).
fn layout(t: PduType) -> &'static [(&'static str, Slot)] {
    match t {
        PduType::Dt | PduType::Mgmt => &[],
        PduType::Ack => ACK,
        PduType::Nack => NACK,
        PduType::Fc => FC,
        PduType::AckFc => ACK_FC,
        PduType::NackFc => NACK_FC,
        PduType::Cack | PduType::Rendezvous => CACK,
    }
}

impl ControlBody {
    /// The PDU type that carries this body.
    pub fn pdu_type(&self) -> PduType {
        match self {
            ControlBody::Ack { .. } => PduType::Ack,
            ControlBody::Nack { .. } => PduType::Nack,
            ControlBody::Fc { .. } => PduType::Fc,
            ControlBody::AckFc { .. } => PduType::AckFc,
            ControlBody::NackFc { .. } => PduType::NackFc,
            ControlBody::Cack { .. } => PduType::Cack,
            ControlBody::Rendezvous { .. } => PduType::Rendezvous,
        }
    }

    /// The field values in wire order (as many as `layout(self.pdu_type())` has).
    fn values(&self) -> [u64; 8] {
        match *self {
            ControlBody::Ack { ack_sn } => [ack_sn, 0, 0, 0, 0, 0, 0, 0],
            ControlBody::Nack { nack_sn } => [nack_sn, 0, 0, 0, 0, 0, 0, 0],
            ControlBody::Fc {
                new_rwe,
                my_lwe,
                my_rwe,
                rate,
                frame,
            } => [new_rwe, my_lwe, my_rwe, rate, frame, 0, 0, 0],
            ControlBody::AckFc {
                ack_sn: sn,
                last_ctrl_seq_rcvd,
                new_lwe,
                new_rwe,
                my_lwe,
                my_rwe,
                rate,
                frame,
            }
            | ControlBody::NackFc {
                nack_sn: sn,
                last_ctrl_seq_rcvd,
                new_lwe,
                new_rwe,
                my_lwe,
                my_rwe,
                rate,
                frame,
            } => [
                sn,
                last_ctrl_seq_rcvd,
                new_lwe,
                new_rwe,
                my_lwe,
                my_rwe,
                rate,
                frame,
            ],
            ControlBody::Cack {
                last_ctrl_seq_rcvd,
                new_lwe,
                new_rwe,
                my_lwe,
                my_rwe,
                rate,
                frame,
            }
            | ControlBody::Rendezvous {
                last_ctrl_seq_rcvd,
                new_lwe,
                new_rwe,
                my_lwe,
                my_rwe,
                rate,
                frame,
            } => [
                last_ctrl_seq_rcvd,
                new_lwe,
                new_rwe,
                my_lwe,
                my_rwe,
                rate,
                frame,
                0,
            ],
        }
    }

    /// The body of control type `t` from its field values in wire order;
    /// `None` for DT/MGMT.
    fn from_values(t: PduType, v: [u64; 8]) -> Option<Self> {
        Some(match t {
            PduType::Dt | PduType::Mgmt => return None,
            PduType::Ack => ControlBody::Ack { ack_sn: v[0] },
            PduType::Nack => ControlBody::Nack { nack_sn: v[0] },
            PduType::Fc => ControlBody::Fc {
                new_rwe: v[0],
                my_lwe: v[1],
                my_rwe: v[2],
                rate: v[3],
                frame: v[4],
            },
            PduType::AckFc => ControlBody::AckFc {
                ack_sn: v[0],
                last_ctrl_seq_rcvd: v[1],
                new_lwe: v[2],
                new_rwe: v[3],
                my_lwe: v[4],
                my_rwe: v[5],
                rate: v[6],
                frame: v[7],
            },
            PduType::NackFc => ControlBody::NackFc {
                nack_sn: v[0],
                last_ctrl_seq_rcvd: v[1],
                new_lwe: v[2],
                new_rwe: v[3],
                my_lwe: v[4],
                my_rwe: v[5],
                rate: v[6],
                frame: v[7],
            },
            PduType::Cack => ControlBody::Cack {
                last_ctrl_seq_rcvd: v[0],
                new_lwe: v[1],
                new_rwe: v[2],
                my_lwe: v[3],
                my_rwe: v[4],
                rate: v[5],
                frame: v[6],
            },
            PduType::Rendezvous => ControlBody::Rendezvous {
                last_ctrl_seq_rcvd: v[0],
                new_lwe: v[1],
                new_rwe: v[2],
                my_lwe: v[3],
                my_rwe: v[4],
                rate: v[5],
                frame: v[6],
            },
        })
    }
}

/// What follows the PCI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Body<'a> {
    /// Payload of a DT or MGMT PDU (padding excluded).
    Data(&'a [u8]),
    /// Body of a control PDU.
    Control(ControlBody),
}

/// A parsed PDU, borrowing its payload from the receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pdu<'a> {
    /// The header.
    pub pci: Pci,
    /// The payload or control body; always of the kind `pci.pdu_type` says.
    pub body: Body<'a>,
}

/// Length of the header of a PDU of type `t`: up to and including `seq` for
/// DT/MGMT, the whole PDU for control types.
pub fn header_len(c: &DtConstants, t: PduType) -> usize {
    if !t.is_control() {
        return c.base_len() + c.seq.bytes();
    }
    c.base_len()
        + t.seq_width(c).bytes()
        + layout(t)
            .iter()
            .map(|&(_, s)| c.slot(s).bytes())
            .sum::<usize>()
}

/// Appends a DT or MGMT PDU: header, then `payload`.
///
/// The length field is computed (header + payload); `pci.length` is ignored.
/// On error `out` is left as it was; see [`Pci::write_header`] for the errors.
pub fn encode_data(
    c: &DtConstants,
    pci: &Pci,
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    if pci.pdu_type.is_control() {
        return Err(WireError::BodyMismatch(pci.pdu_type.code()));
    }
    let start = out.len();
    out.resize(start + header_len(c, pci.pdu_type), 0);
    out.extend_from_slice(payload);
    let r = pci.write_header(c, &mut out[start..]);
    if r.is_err() {
        out.truncate(start);
    }
    r
}

/// Appends a control PDU.
///
/// `pci.pdu_type` must be `body.pdu_type()` ([`WireError::BodyMismatch`]
/// otherwise); `pci.seq` is the control sequence number. The length field is
/// computed; `pci.length` is ignored. On error `out` is left as it was.
pub fn encode_control(
    c: &DtConstants,
    pci: &Pci,
    body: &ControlBody,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let t = body.pdu_type();
    if pci.pdu_type != t {
        return Err(WireError::BodyMismatch(pci.pdu_type.code()));
    }
    let start = out.len();
    let hl = header_len(c, t);
    out.resize(start + hl, 0);
    let mut w = SliceWriter {
        buf: &mut out[start..],
        pos: 0,
    };
    let r = pci.write_base(c, &mut w, hl).and_then(|()| {
        let values = body.values();
        for (&(name, slot), &v) in layout(t).iter().zip(values.iter()) {
            w.put(name, c.slot(slot), v)?;
        }
        Ok(())
    });
    if r.is_err() {
        out.truncate(start);
    }
    r
}

/// The reading of well-formed DT and MGMT PDUs of one DIF, the way it
/// takes decided once from its constants (fixed offsets for the default
/// widths, [`DtConstants::default`]; else field by field) rather than per
/// PDU: what a receiver keeps for the PDUs of every SDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataParser {
    c: DtConstants,
    std: bool,
}

impl DataParser {
    /// The reader of the PDUs of a DIF with constants `c`.
    pub fn new(c: &DtConstants) -> Self {
        DataParser {
            c: *c,
            std: c.std_data_layout(),
        }
    }

    /// The PCI of the well-formed DT or MGMT PDU in `buf`, and where its
    /// payload is (`pci.length` ends it): what [`Pdu::parse`] gives for
    /// it. `None` for anything else (a control PDU, or one that is
    /// malformed), which [`Pdu::parse`] then parses or names the error of.
    #[inline]
    pub fn parse(&self, buf: &[u8]) -> Option<(Pci, std::ops::Range<usize>)> {
        let (pci, hl) = self.parse_pci(buf)?;
        Some((pci, hl..pci.length as usize))
    }

    /// [`DataParser::parse`], with the header length for the range.
    #[inline]
    fn parse_pci(&self, buf: &[u8]) -> Option<(Pci, usize)> {
        if self.std {
            return Self::parse_std(&self.c, buf);
        }
        let c = &self.c;
        let base = c.base_len();
        let hl = base + c.seq.bytes();
        if buf.len() < hl || buf[0] != PCI_VERSION {
            return None;
        }
        let mut at = 1;
        let mut field = |w: FieldWidth| {
            let v = uint_at(buf, at, w);
            at += w.bytes();
            v
        };
        let dst_addr = field(c.addr)?;
        let src_addr = field(c.addr)?;
        let qos_id = field(c.qos)?;
        let dst_cep = field(c.cep)?;
        let src_cep = field(c.cep)?;
        let pdu_type = match field(FieldWidth::W1)? {
            0x80 => PduType::Dt,
            0x40 => PduType::Mgmt,
            _ => return None,
        };
        let flags = field(FieldWidth::W1)? as u8;
        let length = field(c.length)?;
        let seq = field(c.seq)?;
        if length < hl as u64 || length > c.max_pdu_size as u64 || length > buf.len() as u64 {
            return None;
        }
        let pci = Pci {
            version: PCI_VERSION,
            dst_addr,
            src_addr,
            qos_id,
            dst_cep,
            src_cep,
            pdu_type,
            flags,
            length,
            seq,
        };
        Some((pci, hl))
    }

    /// [`DataParser::parse_pci`] with the default widths: one length
    /// check, then every field at a fixed offset of the header.
    #[inline]
    fn parse_std(c: &DtConstants, buf: &[u8]) -> Option<(Pci, usize)> {
        let h: &[u8; STD_HEADER_LEN] = buf.first_chunk()?;
        if h[0] != PCI_VERSION {
            return None;
        }
        let w2 = |i: usize| u16::from_be_bytes([h[i], h[i + 1]]) as u64;
        let pdu_type = match h[11] {
            0x80 => PduType::Dt,
            0x40 => PduType::Mgmt,
            _ => return None,
        };
        let length = w2(13);
        if length < STD_HEADER_LEN as u64
            || length > c.max_pdu_size as u64
            || length > buf.len() as u64
        {
            return None;
        }
        let pci = Pci {
            version: PCI_VERSION,
            dst_addr: w2(1),
            src_addr: w2(3),
            qos_id: w2(5),
            dst_cep: w2(7),
            src_cep: w2(9),
            pdu_type,
            flags: h[12],
            length,
            seq: u32::from_be_bytes([h[15], h[16], h[17], h[18]]) as u64,
        };
        Some((pci, STD_HEADER_LEN))
    }
}

impl<'a> Pdu<'a> {
    /// Parses one PDU from `buf`. Never panics, whatever the constants and bytes.
    ///
    /// The version must be 1; the type one of [`PduType`]; the length field
    /// at least the header length ([`WireError::BadValue`]), at most
    /// `max_pdu_size` ([`WireError::PduTooLong`]) and at most `buf.len()`
    /// ([`WireError::Truncated`]). Bytes after `length` are padding and are
    /// ignored. A control PDU must be exactly as long as its type says
    /// ([`WireError::Trailing`] otherwise).
    pub fn parse(c: &DtConstants, buf: &'a [u8]) -> Result<Self, WireError> {
        if let Some(p) = Pdu::parse_data(c, buf) {
            return Ok(p);
        }
        Pdu::parse_any(c, buf)
    }

    /// [`Pdu::parse`] of a well-formed DT or MGMT PDU, the one every SDU
    /// takes: one length check, then the fields at their offsets, with no
    /// error built per field. `None` for anything else (a control PDU, or
    /// one that is malformed), which [`Pdu::parse_any`] then parses or
    /// names the error of; where this gives a PDU, that gives the same.
    fn parse_data(c: &DtConstants, buf: &'a [u8]) -> Option<Self> {
        let (pci, hl) = DataParser::new(c).parse_pci(buf)?;
        let body = Body::Data(buf.get(hl..pci.length as usize)?);
        Some(Pdu { pci, body })
    }

    /// [`Pdu::parse`] field by field, for any PDU: the path that names what
    /// is wrong with a malformed one.
    fn parse_any(c: &DtConstants, buf: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(buf);
        let version = r.u8()?;
        if version != PCI_VERSION {
            return Err(WireError::BadVersion(version));
        }
        let dst_addr = uint(&mut r, c.addr)?;
        let src_addr = uint(&mut r, c.addr)?;
        let qos_id = uint(&mut r, c.qos)?;
        let dst_cep = uint(&mut r, c.cep)?;
        let src_cep = uint(&mut r, c.cep)?;
        let pdu_type = PduType::from_code(r.u8()?)?;
        let flags = r.u8()?;
        let length = uint(&mut r, c.length)?;

        let hl = header_len(c, pdu_type);
        if length < hl as u64 {
            return Err(WireError::BadValue {
                field: "length",
                value: length,
            });
        }
        if length > c.max_pdu_size as u64 {
            return Err(WireError::PduTooLong {
                length,
                max: c.max_pdu_size as u64,
            });
        }
        if length > buf.len() as u64 {
            let at = c.base_len();
            return Err(WireError::Truncated {
                at,
                need: length as usize - at,
                have: buf.len() - at,
            });
        }
        // length <= buf.len(), so it fits usize; the reader is past the base fields.
        let mut r = Reader::new(&buf[..length as usize]);
        r.bytes(c.base_len())?;
        let seq = uint(&mut r, pdu_type.seq_width(c))?;
        let pci = Pci {
            version,
            dst_addr,
            src_addr,
            qos_id,
            dst_cep,
            src_cep,
            pdu_type,
            flags,
            length,
            seq,
        };
        let mut values = [0u64; 8];
        for (&(_, slot), v) in layout(pdu_type).iter().zip(values.iter_mut()) {
            *v = uint(&mut r, c.slot(slot))?;
        }
        let body = match ControlBody::from_values(pdu_type, values) {
            None => Body::Data(r.rest()),
            Some(b) => {
                r.finish()?;
                Body::Control(b)
            }
        };
        Ok(Pdu { pci, body })
    }

    /// Appends the encoded PDU to `out` (with [`encode_data`] or
    /// [`encode_control`]); `pci.length` is recomputed.
    pub fn encode(&self, c: &DtConstants, out: &mut Vec<u8>) -> Result<(), WireError> {
        match &self.body {
            Body::Data(p) => encode_data(c, &self.pci, p, out),
            Body::Control(b) => encode_control(c, &self.pci, b, out),
        }
    }
}

/// Reads a big-endian unsigned field of width `w`.
fn uint(r: &mut Reader<'_>, w: FieldWidth) -> Result<u64, WireError> {
    // One fixed-size read per width: no loop and no copy of unknown length
    // on the path every PDU takes.
    Ok(match w {
        FieldWidth::W1 => r.u8()? as u64,
        FieldWidth::W2 => r.u16()? as u64,
        FieldWidth::W4 => r.u32()? as u64,
        FieldWidth::W8 => r.u64()?,
    })
}

/// The big-endian unsigned field of width `w` at `at` in `buf`; `None`
/// past its end.
#[inline(always)]
fn uint_at(buf: &[u8], at: usize, w: FieldWidth) -> Option<u64> {
    let b = buf.get(at..)?;
    Some(match w {
        FieldWidth::W1 => *b.first()? as u64,
        FieldWidth::W2 => u16::from_be_bytes(*b.first_chunk()?) as u64,
        FieldWidth::W4 => u32::from_be_bytes(*b.first_chunk()?) as u64,
        FieldWidth::W8 => u64::from_be_bytes(*b.first_chunk()?),
    })
}

/// Writes `v` (which fits) big-endian at `*at` in `buf` as a field of
/// width `w`, and moves `*at` past it; writes nothing past the end.
#[inline(always)]
fn put_at(buf: &mut [u8], at: &mut usize, w: FieldWidth, v: u64) {
    fn put<const N: usize>(buf: &mut [u8], at: usize, bytes: [u8; N]) {
        if let Some(d) = buf.get_mut(at..).and_then(|b| b.first_chunk_mut::<N>()) {
            *d = bytes;
        }
    }
    match w {
        FieldWidth::W1 => put(buf, *at, [v as u8]),
        FieldWidth::W2 => put(buf, *at, (v as u16).to_be_bytes()),
        FieldWidth::W4 => put(buf, *at, (v as u32).to_be_bytes()),
        FieldWidth::W8 => put(buf, *at, v.to_be_bytes()),
    }
    *at += w.bytes();
}

/// Writes big-endian fields into a fixed slice, checking bounds and widths.
struct SliceWriter<'b> {
    buf: &'b mut [u8],
    pos: usize,
}

impl SliceWriter<'_> {
    fn put(&mut self, field: &'static str, w: FieldWidth, v: u64) -> Result<(), WireError> {
        if v > w.max_value() {
            return Err(WireError::FieldOverflow {
                field,
                value: v,
                width: w.bytes() as u8,
            });
        }
        match w {
            FieldWidth::W1 => self.put_array([v as u8]),
            FieldWidth::W2 => self.put_array((v as u16).to_be_bytes()),
            FieldWidth::W4 => self.put_array((v as u32).to_be_bytes()),
            FieldWidth::W8 => self.put_array(v.to_be_bytes()),
        }
    }

    /// Writes `bytes` at the cursor: one store of a size known at compile
    /// time, not a call to `memcpy` for a field of a few bytes.
    fn put_array<const N: usize>(&mut self, bytes: [u8; N]) -> Result<(), WireError> {
        let have = self.buf.len().saturating_sub(self.pos);
        let Some(dst) = self
            .buf
            .get_mut(self.pos..)
            .and_then(|b| b.first_chunk_mut::<N>())
        else {
            return Err(WireError::Truncated {
                at: self.pos,
                need: N,
                have,
            });
        };
        *dst = bytes;
        self.pos += N;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn d() -> DtConstants {
        DtConstants::default()
    }

    fn pci(t: PduType) -> Pci {
        Pci {
            dst_addr: 0x0102,
            src_addr: 0x0304,
            qos_id: 0x0506,
            dst_cep: 0x0708,
            src_cep: 0x090a,
            flags: flags::DRF,
            seq: 0x0b0c_0d0e,
            ..Pci::new(t)
        }
    }

    fn data(c: &DtConstants, p: &Pci, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        encode_data(c, p, payload, &mut v).unwrap();
        v
    }

    fn control(c: &DtConstants, p: &Pci, b: &ControlBody) -> Vec<u8> {
        let mut v = Vec::new();
        encode_control(c, p, b, &mut v).unwrap();
        v
    }

    #[test]
    fn default_sizes_are_irati_sizes() {
        let c = d();
        assert_eq!(c.base_len(), 15);
        let want = [
            (PduType::Dt, 19),
            (PduType::Mgmt, 19),
            (PduType::Ack, 23),
            (PduType::Nack, 23),
            (PduType::Fc, 39),
            (PduType::Cack, 47),
            (PduType::Rendezvous, 47),
            (PduType::AckFc, 51),
            (PduType::NackFc, 51),
        ];
        for (t, n) in want {
            assert_eq!(header_len(&c, t), n, "{t:?}");
        }
        assert_eq!(c.max_header_len(), 51);
        assert_eq!(c.max_data_payload(), 1470 - 19);
        c.validate().unwrap();
    }

    #[test]
    fn dt_layout_with_default_constants() {
        let c = d();
        let v = data(&c, &pci(PduType::Dt), b"hi");
        #[rustfmt::skip]
        let want = [
            1,                      // version
            0x01, 0x02,             // dst_addr @1
            0x03, 0x04,             // src_addr @3
            0x05, 0x06,             // qos_id @5
            0x07, 0x08,             // dst_cep @7
            0x09, 0x0a,             // src_cep @9
            0x80,                   // type @11
            0x80,                   // flags @12
            0x00, 21,               // length @13
            0x0b, 0x0c, 0x0d, 0x0e, // seq @15
            b'h', b'i',
        ];
        assert_eq!(v, want);
        let p = Pdu::parse(&c, &v).unwrap();
        assert_eq!(
            p.pci,
            Pci {
                length: 21,
                ..pci(PduType::Dt)
            }
        );
        assert_eq!(p.body, Body::Data(b"hi"));
    }

    #[test]
    fn ack_fc_layout_with_default_constants() {
        let c = d();
        let body = ControlBody::AckFc {
            ack_sn: 0x11,
            last_ctrl_seq_rcvd: 0x22,
            new_lwe: 0x33,
            new_rwe: 0x44,
            my_lwe: 0x55,
            my_rwe: 0x66,
            rate: 0x77,
            frame: 0x88,
        };
        let v = control(&c, &pci(PduType::AckFc), &body);
        assert_eq!(v.len(), 51);
        assert_eq!(&v[11..15], &[0xC5, 0x80, 0, 51]);
        assert_eq!(&v[15..19], &[0x0b, 0x0c, 0x0d, 0x0e]); // ctrl seq
        let mut tail = Vec::new();
        for x in [0x11u32, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88] {
            tail.extend_from_slice(&x.to_be_bytes());
        }
        assert_eq!(&v[19..], &tail[..]);
        let p = Pdu::parse(&c, &v).unwrap();
        assert_eq!(p.body, Body::Control(body));
        assert_eq!(p.pci.seq, 0x0b0c_0d0e);
    }

    #[test]
    fn ctrl_seq_and_last_ctrl_seq_rcvd_use_the_ctrl_seq_width() {
        // IRATI's quirk: both at the seq width. Here: at the ctrl-seq width.
        let c = DtConstants {
            seq: FieldWidth::W2,
            ctrl_seq: FieldWidth::W8,
            ..d()
        };
        let body = ControlBody::Cack {
            last_ctrl_seq_rcvd: u64::MAX - 1,
            new_lwe: 1,
            new_rwe: 2,
            my_lwe: 3,
            my_rwe: 4,
            rate: 5,
            frame: 6,
        };
        let p = Pci {
            seq: u64::MAX,
            ..pci(PduType::Cack)
        };
        let v = control(&c, &p, &body);
        assert_eq!(v.len(), 15 + 8 + 8 + 4 * 2 + 4 + 4);
        assert_eq!(&v[15..23], &[0xff; 8]);
        assert_eq!(&v[23..31], &(u64::MAX - 1).to_be_bytes());
        assert_eq!(Pdu::parse(&c, &v).unwrap().body, Body::Control(body));
    }

    #[test]
    fn write_header_in_place() {
        let c = d();
        let hl = header_len(&c, PduType::Mgmt);
        let mut buf = vec![0xee; hl + 5];
        buf[hl..].copy_from_slice(b"cdap!");
        let p = Pci {
            length: 9999, // ignored
            ..pci(PduType::Mgmt)
        };
        p.write_header(&c, &mut buf).unwrap();
        assert_eq!(buf, data(&c, &p, b"cdap!"));
        let got = Pdu::parse(&c, &buf).unwrap();
        assert_eq!(got.pci.length, (hl + 5) as u64);
        assert_eq!(got.body, Body::Data(b"cdap!"));

        assert_eq!(
            p.write_header(&c, &mut buf[..hl - 1]),
            Err(WireError::Truncated {
                at: 0,
                need: hl,
                have: hl - 1
            })
        );
        assert_eq!(
            pci(PduType::Ack).write_header(&c, &mut buf),
            Err(WireError::BodyMismatch(0xC1))
        );
    }

    #[test]
    fn values_too_wide_are_errors() {
        let c = DtConstants {
            addr: FieldWidth::W1,
            ..d()
        };
        let mut out = vec![7];
        let p = Pci {
            dst_addr: 256,
            ..Pci::new(PduType::Dt)
        };
        assert_eq!(
            encode_data(&c, &p, b"x", &mut out),
            Err(WireError::FieldOverflow {
                field: "dst_addr",
                value: 256,
                width: 1
            })
        );
        assert_eq!(out, [7], "out is unchanged on error");

        let p = Pci {
            seq: 1 << 32,
            ..Pci::new(PduType::Dt)
        };
        assert!(matches!(
            encode_data(&d(), &p, b"", &mut out),
            Err(WireError::FieldOverflow { field: "seq", .. })
        ));

        let b = ControlBody::Fc {
            new_rwe: 1,
            my_lwe: 2,
            my_rwe: 3,
            rate: 1 << 40,
            frame: 0,
        };
        assert_eq!(
            encode_control(&d(), &Pci::new(PduType::Fc), &b, &mut out),
            Err(WireError::FieldOverflow {
                field: "rate",
                value: 1 << 40,
                width: 4
            })
        );
        assert_eq!(out, [7]);

        // The computed length does not fit a one-byte length field
        // (constants that `validate` would refuse).
        let c = DtConstants {
            length: FieldWidth::W1,
            ..d()
        };
        assert!(c.validate().is_err());
        assert_eq!(
            encode_data(&c, &Pci::new(PduType::Dt), &[0; 300], &mut out),
            Err(WireError::FieldOverflow {
                field: "length",
                value: 318,
                width: 1
            })
        );
    }

    #[test]
    fn encoder_refuses_bad_pdus() {
        let c = d();
        let mut out = Vec::new();
        assert_eq!(
            encode_data(&c, &Pci::new(PduType::Dt), &[0; 1452], &mut out),
            Err(WireError::PduTooLong {
                length: 1471,
                max: 1470
            })
        );
        encode_data(&c, &Pci::new(PduType::Dt), &[0; 1451], &mut out).unwrap();
        out.clear();
        let p = Pci {
            version: 2,
            ..Pci::new(PduType::Dt)
        };
        assert_eq!(
            encode_data(&c, &p, b"", &mut out),
            Err(WireError::BadVersion(2))
        );
        assert_eq!(
            encode_data(&c, &Pci::new(PduType::Nack), b"", &mut out),
            Err(WireError::BodyMismatch(0xC2))
        );
        assert_eq!(
            encode_control(
                &c,
                &Pci::new(PduType::Nack),
                &ControlBody::Ack { ack_sn: 1 },
                &mut out
            ),
            Err(WireError::BodyMismatch(0xC2))
        );
        assert!(out.is_empty());
    }

    #[test]
    fn padding_is_trimmed() {
        let c = d();
        let mut v = data(&c, &pci(PduType::Dt), b"abc");
        v.extend_from_slice(&[0; 40]);
        let p = Pdu::parse(&c, &v).unwrap();
        assert_eq!(p.body, Body::Data(b"abc"));
        assert_eq!(p.pci.length, 22);

        let b = ControlBody::Nack { nack_sn: 5 };
        let mut v = control(&c, &pci(PduType::Nack), &b);
        v.extend_from_slice(&[0xff; 3]);
        assert_eq!(Pdu::parse(&c, &v).unwrap().body, Body::Control(b));
    }

    #[test]
    fn malformed_pdus_are_errors() {
        let c = d();
        let v = data(&c, &pci(PduType::Dt), b"payload");

        // Truncated inside the header.
        assert_eq!(
            Pdu::parse(&c, &v[..10]),
            Err(WireError::Truncated {
                at: 9,
                need: 2,
                have: 1
            })
        );
        assert!(matches!(
            Pdu::parse(&c, &[]),
            Err(WireError::Truncated { .. })
        ));
        // The length field says more than the buffer holds.
        assert_eq!(
            Pdu::parse(&c, &v[..v.len() - 1]),
            Err(WireError::Truncated {
                at: 15,
                need: 11,
                have: 10
            })
        );
        // Bad version.
        let mut b = v.clone();
        b[0] = 2;
        assert_eq!(Pdu::parse(&c, &b), Err(WireError::BadVersion(2)));
        // Unknown type (SACK is not supported).
        b = v.clone();
        b[11] = 0xC9;
        assert_eq!(Pdu::parse(&c, &b), Err(WireError::UnknownType(0xC9)));
        // Length smaller than the header.
        b = v.clone();
        b[13..15].copy_from_slice(&18u16.to_be_bytes());
        assert_eq!(
            Pdu::parse(&c, &b),
            Err(WireError::BadValue {
                field: "length",
                value: 18
            })
        );
        // Longer than max_pdu_size.
        let small = DtConstants {
            max_pdu_size: 20,
            ..c
        };
        assert_eq!(
            Pdu::parse(&small, &v),
            Err(WireError::PduTooLong {
                length: 26,
                max: 20
            })
        );
        // A DT header announcing a control type: the body does not match.
        b = v.clone();
        b[11] = PduType::Ack.code();
        assert_eq!(Pdu::parse(&c, &b), Err(WireError::Trailing(3)));
        // A control PDU shorter than its type needs.
        let ack = control(&c, &pci(PduType::Ack), &ControlBody::Ack { ack_sn: 1 });
        b = ack.clone();
        b[11] = PduType::Fc.code();
        assert!(matches!(
            Pdu::parse(&c, &b),
            Err(WireError::BadValue {
                field: "length",
                ..
            })
        ));
    }

    #[test]
    fn constants_serde_and_validation() {
        let c: DtConstants = serde_json::from_str("{}").unwrap();
        assert_eq!(c, d());
        let c: DtConstants =
            serde_json::from_str(r#"{"addr": 4, "seq": 8, "max_pdu_size": 9000}"#).unwrap();
        assert_eq!(c.addr, FieldWidth::W4);
        assert_eq!(c.seq, FieldWidth::W8);
        assert_eq!(c.cep, FieldWidth::W2);
        assert_eq!(c.max_pdu_size, 9000);
        c.validate().unwrap();
        let e = serde_json::from_str::<DtConstants>(r#"{"addr": 3}"#).unwrap_err();
        assert!(e.to_string().contains("not 3"), "{e}");
        assert!(serde_json::from_str::<DtConstants>(r#"{"address": 2}"#).is_err());
        assert_eq!(serde_json::to_string(&FieldWidth::W8).unwrap(), "8");
        assert_eq!(
            serde_json::from_str::<FieldWidth>("1").unwrap(),
            FieldWidth::W1
        );
        for w in FieldWidth::ALL {
            assert_eq!(w.max_value(), u64::MAX >> (64 - 8 * w.bytes()));
        }

        let tiny = DtConstants {
            max_pdu_size: 51,
            ..d()
        };
        assert_eq!(
            tiny.validate(),
            Err(WireError::BadConstant {
                field: "max_pdu_size",
                value: 51,
                min: 52,
                max: 65535
            })
        );
        DtConstants {
            max_pdu_size: 52,
            ..d()
        }
        .validate()
        .unwrap();
        let wide = DtConstants {
            max_pdu_size: 70_000,
            ..d()
        };
        assert!(wide.validate().is_err());
    }

    fn width() -> impl Strategy<Value = FieldWidth> {
        prop::sample::select(FieldWidth::ALL.to_vec())
    }

    fn constants() -> impl Strategy<Value = DtConstants> {
        (
            [width(), width(), width(), width()],
            [width(), width(), width(), width()],
            any::<u32>(),
            // A quarter with the default data widths, which DT and MGMT
            // headers take a fixed-offset path for.
            prop::bool::weighted(0.25),
        )
            .prop_map(
                |([addr, cep, qos, length], [seq, ctrl_seq, rate, frame], m, std)| {
                    let c = DtConstants {
                        addr,
                        cep,
                        qos,
                        length,
                        seq,
                        ctrl_seq,
                        rate,
                        frame,
                        max_pdu_size: m,
                        max_pdu_lifetime_ms: 1000,
                    };
                    if !std {
                        return c;
                    }
                    let d = DtConstants::default();
                    DtConstants {
                        addr: d.addr,
                        cep: d.cep,
                        qos: d.qos,
                        length: d.length,
                        seq: d.seq,
                        ..c
                    }
                },
            )
    }

    /// Valid constants: max_pdu_size set to the most the length field allows.
    fn valid_constants() -> impl Strategy<Value = DtConstants> {
        constants().prop_map(|c| DtConstants {
            max_pdu_size: c.length.max_value().min(1 << 20) as u32,
            ..c
        })
    }

    proptest! {
        #[test]
        fn round_trip_every_type(
            c in valid_constants(),
            t in prop::sample::select(PduType::ALL.to_vec()),
            raw in any::<[u64; 14]>(),
            fl in any::<u8>(),
            payload in prop::collection::vec(any::<u8>(), 0..300),
            padding in prop::collection::vec(any::<u8>(), 0..8),
        ) {
            prop_assert!(c.validate().is_ok());
            let m = |v: u64, w: FieldWidth| v & w.max_value();
            let p = Pci {
                version: 1,
                dst_addr: m(raw[0], c.addr),
                src_addr: m(raw[1], c.addr),
                qos_id: m(raw[2], c.qos),
                dst_cep: m(raw[3], c.cep),
                src_cep: m(raw[4], c.cep),
                pdu_type: t,
                flags: fl,
                length: raw[5], // ignored by the encoder
                seq: m(raw[6], t.seq_width(&c)),
            };
            let mut values = [0u64; 8];
            for (i, &(_, slot)) in layout(t).iter().enumerate() {
                values[i] = m(raw[6 + i], c.slot(slot)) ^ (i as u64 & c.slot(slot).max_value());
            }
            let room = c.max_data_payload();
            let payload = &payload[..payload.len().min(room)];
            let mut v = vec![0xaa; 3];
            let body = match ControlBody::from_values(t, values) {
                Some(b) => {
                    encode_control(&c, &p, &b, &mut v).unwrap();
                    Body::Control(b)
                }
                None => {
                    encode_data(&c, &p, payload, &mut v).unwrap();
                    Body::Data(payload)
                }
            };
            let v = &v[3..];
            let want_len = header_len(&c, t) + if t.is_control() { 0 } else { payload.len() };
            prop_assert_eq!(v.len(), want_len);
            let mut padded = v.to_vec();
            padded.extend_from_slice(&padding);
            let got = Pdu::parse(&c, &padded).unwrap();
            prop_assert_eq!(got, Pdu { pci: Pci { length: want_len as u64, ..p }, body });
            let mut again = Vec::new();
            got.encode(&c, &mut again).unwrap();
            prop_assert_eq!(&again[..], v);
        }

        #[test]
        fn the_data_fast_paths_agree_with_the_field_by_field_ones(
            c in constants(),
            t in prop::sample::select(PduType::ALL.to_vec()),
            raw in any::<[u64; 6]>(),
            narrow in prop::array::uniform6(prop::bool::weighted(0.9)),
            fl in any::<u8>(),
            version in prop::sample::select(vec![1u8, 1, 1, 0, 2]),
            total in 0usize..400,
            bytes in prop::collection::vec(any::<u8>(), 0..300),
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
        ) {
            // Parsing: arbitrary bytes, and a valid header with a few
            // bytes changed, give the same PDU or the same error.
            prop_assert_eq!(Pdu::parse(&c, &bytes), Pdu::parse_any(&c, &bytes));
            let mut v = Vec::new();
            let p = Pci { qos_id: 1, ..Pci::new(PduType::Dt) };
            if encode_data(&c, &p, &bytes[..bytes.len().min(40)], &mut v).is_ok() {
                prop_assert!(Pdu::parse_data(&c, &v).is_some(), "a DT PDU takes the fast path");
                for (at, b) in &flips {
                    let i = at.index(v.len());
                    v[i] = *b;
                }
                prop_assert_eq!(Pdu::parse(&c, &v), Pdu::parse_any(&c, &v));
            }
            // Writing: values that fit their widths or not (a narrowed one
            // fits), the same bytes or the same error.
            let m = |k: usize, w: FieldWidth| if narrow[k] { raw[k] & w.max_value() } else { raw[k] };
            let pci = Pci {
                version,
                dst_addr: m(0, c.addr),
                src_addr: m(1, c.addr),
                qos_id: m(2, c.qos),
                dst_cep: m(3, c.cep),
                src_cep: m(4, c.cep),
                pdu_type: t,
                flags: fl,
                length: 0,
                seq: m(5, c.seq),
            };
            let (mut fast, mut slow) = (vec![0x5a; total], vec![0x5a; total]);
            let got = pci.write_header(&c, &mut fast);
            let want = if t.is_control() {
                Err(WireError::BodyMismatch(t.code()))
            } else if total < header_len(&c, t) {
                Err(WireError::Truncated { at: 0, need: header_len(&c, t), have: total })
            } else {
                let mut w = SliceWriter { buf: &mut slow, pos: 0 };
                pci.write_base(&c, &mut w, total)
            };
            prop_assert_eq!(&got, &want);
            if got.is_ok() {
                prop_assert_eq!(fast, slow);
                let mut again = vec![0; total];
                prop_assert!(pci.write_data_base(&c, &mut again, total), "the fast path wrote it");
            }
        }

        #[test]
        fn parse_never_panics(
            c in constants(),
            bytes in prop::collection::vec(any::<u8>(), 0..300),
        ) {
            if let Ok(p) = Pdu::parse(&c, &bytes) {
                // Whatever parses re-encodes to the same bytes.
                let mut again = Vec::new();
                p.encode(&c, &mut again).unwrap();
                prop_assert_eq!(&again[..], &bytes[..p.pci.length as usize]);
            }
        }

        #[test]
        fn mutated_pdus_never_panic(
            c in valid_constants(),
            t in prop::sample::select(PduType::ALL.to_vec()),
            payload in prop::collection::vec(any::<u8>(), 0..40),
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut v = Vec::new();
            let p = Pci { qos_id: 1, ..Pci::new(t) };
            match ControlBody::from_values(t, [1; 8]) {
                Some(b) => encode_control(&c, &p, &b, &mut v).unwrap(),
                None => encode_data(&c, &p, &payload, &mut v).unwrap(),
            }
            for (i, x) in flips {
                let i = i.index(v.len());
                v[i] ^= x;
            }
            let v = &v[..cut.index(v.len() + 1)];
            if let Ok(p) = Pdu::parse(&c, v) {
                let mut again = Vec::new();
                p.encode(&c, &mut again).unwrap();
                prop_assert_eq!(&again[..], &v[..p.pci.length as usize]);
            }
        }
    }
}
