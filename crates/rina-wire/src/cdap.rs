//! CDAP, the Common Distributed Application Protocol, as protobuf.
//!
//! The schema is IRATI's `CDAP.proto` (proto2, package `rina.messages`),
//! written out by hand as `#[derive(prost::Message)]` structs with the same
//! field numbers and wire types, so the build needs neither `protoc` nor a
//! build script. Field numbers of [`CdapMessage`]:
//!
//! | # | field | type | | # | field | type |
//! | --- | --- | --- | --- | --- | --- | --- |
//! | 1 | `absSyntax` | int32 | | 18 | `authPolicy` | [`AuthPolicy`] |
//! | 2 | `opCode` (required) | [`OpCode`] | | 19 | `destAEInst` | string |
//! | 3 | `invokeID` | int32 | | 20 | `destAEName` | string |
//! | 4 | `flags` | [`Flags`] | | 21 | `destApInst` | string |
//! | 5 | `objClass` | string | | 22 | `destApName` | string |
//! | 6 | `objName` | string | | 23 | `srcAEInst` | string |
//! | 7 | `objInst` | int64 | | 24 | `srcAEName` | string |
//! | 8 | `objValue` | [`ObjVal`] | | 25 | `srcApInst` | string |
//! | 9 | `result` (default 0) | int32 | | 26 | `srcApName` | string |
//! | 10 | `scope` | int32 | | 27 | `resultReason` | string |
//! | 11 | `filter` | bytes | | 28 | `version` | int64 |
//!
//! proto2 semantics are kept: every field of [`CdapMessage`] is an `Option`,
//! so "absent" and "zero" stay different. `opCode` is required by the schema;
//! prost would silently read a missing one as 0 (`M_CONNECT`), so the field
//! is kept optional in the struct and [`CdapMessage::decode`] reports its
//! absence. Always decode with [`CdapMessage::decode`], which validates, not
//! with the raw [`prost::Message::decode`].
//!
//! The object-value payloads the layer-management components exchange inside
//! `objValue.byteval` ([`FlowStateObject`], [`FlowStateObjectGroup`],
//! [`Neighbor`], [`EnrollmentInformation`], [`DirectoryForwardingTableEntry`],
//! [`ApplicationProcessNamingInfo`]) are here too; see each type for where its
//! field numbers come from. Their optional fields are plain values (an absent
//! field reads as the default, which is what IRATI's getters return too);
//! their `required` fields are always written.
//!
//! Interop trap: rlite's copy of CDAP.proto has a field 18 of another type
//! (`auth_value`); this module speaks IRATI's.

use crate::name::AppName;
use thiserror::Error;

pub use prost;

/// The abstract syntax IRATI puts in `absSyntax` of M_CONNECT / M_CONNECT_R.
pub const ABSTRACT_SYNTAX: i32 = 0x0073;

/// The auth policy name of IRATI's "no authentication" policy.
pub const AUTH_NONE: &str = "PSOC_authentication-none";

/// An invoke id: names a request so its responses can be matched to it.
pub type InvokeId = i32;

/// Why a CDAP message (or an object value) could not be decoded or built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CdapError {
    /// The bytes are not a well-formed protobuf message of the expected type.
    #[error("malformed protobuf: {0}")]
    Malformed(String),
    /// The message has no `opCode` (field 2), which CDAP requires.
    #[error("CDAP message without an opCode")]
    MissingOpCode,
    /// The `opCode` is not one CDAP defines (0..=17).
    #[error("unknown CDAP opCode {0}")]
    UnknownOpCode(i32),
    /// The `flags` field holds a value CDAP does not define (0..=2).
    #[error("unknown CDAP flags value {0}")]
    UnknownFlags(i32),
    /// A message that must carry an invoke id (every response, M_CONNECT,
    /// M_CANCELREAD) has none.
    #[error("{0} without an invoke id")]
    MissingInvokeId(OpCode),
    /// The invoke id is negative.
    #[error("negative invoke id {0}")]
    NegativeInvokeId(i32),
    /// F_RD_INCOMPLETE is set on a message other than M_READ_R.
    #[error("F_RD_INCOMPLETE set on {0}; only M_READ_R may carry it")]
    MisplacedIncomplete(OpCode),
    /// A response was asked for a message that is itself a response.
    #[error("{0} is a response, not a request")]
    NotARequest(OpCode),
    /// The message carries no object value, or not a `byteval` one.
    #[error("the message has no byte-string object value")]
    NoObjectValue,
}

impl From<prost::DecodeError> for CdapError {
    fn from(e: prost::DecodeError) -> Self {
        CdapError::Malformed(e.to_string())
    }
}

/// CDAP operation codes (`opCode_t`). Requests are even, their responses odd.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum OpCode {
    /// `M_CONNECT`: open an application connection.
    Connect = 0,
    /// `M_CONNECT_R`.
    ConnectR = 1,
    /// `M_RELEASE`: close the application connection.
    Release = 2,
    /// `M_RELEASE_R`.
    ReleaseR = 3,
    /// `M_CREATE`: create an object.
    Create = 4,
    /// `M_CREATE_R`.
    CreateR = 5,
    /// `M_DELETE`: delete an object.
    Delete = 6,
    /// `M_DELETE_R`.
    DeleteR = 7,
    /// `M_READ`: read an object (answered by one or more `M_READ_R`).
    Read = 8,
    /// `M_READ_R`.
    ReadR = 9,
    /// `M_CANCELREAD`: stop a multi-part read (same invoke id as the read).
    CancelRead = 10,
    /// `M_CANCELREAD_R`.
    CancelReadR = 11,
    /// `M_WRITE`: write an object.
    Write = 12,
    /// `M_WRITE_R`.
    WriteR = 13,
    /// `M_START`: start an object.
    Start = 14,
    /// `M_START_R`.
    StartR = 15,
    /// `M_STOP`: stop an object.
    Stop = 16,
    /// `M_STOP_R`.
    StopR = 17,
}

impl OpCode {
    /// Every opcode, in numeric order.
    pub const ALL: [OpCode; 18] = [
        OpCode::Connect,
        OpCode::ConnectR,
        OpCode::Release,
        OpCode::ReleaseR,
        OpCode::Create,
        OpCode::CreateR,
        OpCode::Delete,
        OpCode::DeleteR,
        OpCode::Read,
        OpCode::ReadR,
        OpCode::CancelRead,
        OpCode::CancelReadR,
        OpCode::Write,
        OpCode::WriteR,
        OpCode::Start,
        OpCode::StartR,
        OpCode::Stop,
        OpCode::StopR,
    ];

    /// True for the `_R` opcodes (odd numbers).
    pub fn is_response(self) -> bool {
        (self as i32) % 2 == 1
    }

    /// The opcode that answers this request, or `None` for a response.
    pub fn response(self) -> Option<OpCode> {
        if self.is_response() {
            None
        } else {
            OpCode::try_from(self as i32 + 1).ok()
        }
    }

    /// The request this response answers, or `None` for a request.
    pub fn request(self) -> Option<OpCode> {
        if self.is_response() {
            OpCode::try_from(self as i32 - 1).ok()
        } else {
            None
        }
    }

    /// True if a message with this opcode must carry an invoke id.
    pub fn needs_invoke_id(self) -> bool {
        self.is_response() || matches!(self, OpCode::Connect | OpCode::CancelRead)
    }

    /// IRATI's name, e.g. `M_READ_R`.
    pub fn name(self) -> &'static str {
        match self {
            OpCode::Connect => "M_CONNECT",
            OpCode::ConnectR => "M_CONNECT_R",
            OpCode::Release => "M_RELEASE",
            OpCode::ReleaseR => "M_RELEASE_R",
            OpCode::Create => "M_CREATE",
            OpCode::CreateR => "M_CREATE_R",
            OpCode::Delete => "M_DELETE",
            OpCode::DeleteR => "M_DELETE_R",
            OpCode::Read => "M_READ",
            OpCode::ReadR => "M_READ_R",
            OpCode::CancelRead => "M_CANCELREAD",
            OpCode::CancelReadR => "M_CANCELREAD_R",
            OpCode::Write => "M_WRITE",
            OpCode::WriteR => "M_WRITE_R",
            OpCode::Start => "M_START",
            OpCode::StartR => "M_START_R",
            OpCode::Stop => "M_STOP",
            OpCode::StopR => "M_STOP_R",
        }
    }
}

impl std::fmt::Display for OpCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Values of the `flags` field (`flagValues_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Flags {
    /// `F_NO_FLAGS`.
    NoFlags = 0,
    /// `F_SYNC`: set on READ/WRITE to ask for a synchronous operation.
    Sync = 1,
    /// `F_RD_INCOMPLETE`: set on every M_READ_R of a read but the last.
    RdIncomplete = 2,
}

/// An object value (`objVal_t`): nine optional fields of which one is
/// normally set. [`ObjVal::value`] gives the [`Value`] view.
///
/// `floatval` and `doubleval` are `fixed32` / `fixed64` in IRATI's schema;
/// [`Value::Float`] and [`Value::Double`] carry the IEEE-754 bit patterns.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct ObjVal {
    /// 1: `int32 intval`.
    #[prost(int32, optional, tag = "1")]
    pub intval: Option<i32>,
    /// 2: `sint32 sintval`.
    #[prost(sint32, optional, tag = "2")]
    pub sintval: Option<i32>,
    /// 3: `int64 int64val`.
    #[prost(int64, optional, tag = "3")]
    pub int64val: Option<i64>,
    /// 4: `sint64 sint64val`.
    #[prost(sint64, optional, tag = "4")]
    pub sint64val: Option<i64>,
    /// 5: `string strval`.
    #[prost(string, optional, tag = "5")]
    pub strval: Option<String>,
    /// 6: `bytes byteval`: an encoded payload message, or any bytes.
    #[prost(bytes = "vec", optional, tag = "6")]
    pub byteval: Option<Vec<u8>>,
    /// 7: `fixed32 floatval`.
    #[prost(fixed32, optional, tag = "7")]
    pub floatval: Option<u32>,
    /// 8: `fixed64 doubleval`.
    #[prost(fixed64, optional, tag = "8")]
    pub doubleval: Option<u64>,
    /// 9: `bool boolval`.
    #[prost(bool, optional, tag = "9")]
    pub boolval: Option<bool>,
}

/// The Rust view of an [`ObjVal`]: which field is set, and its value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `intval`.
    Int(i32),
    /// `sintval` (zig-zag encoded).
    SInt(i32),
    /// `int64val`.
    Int64(i64),
    /// `sint64val` (zig-zag encoded).
    SInt64(i64),
    /// `strval`.
    Str(String),
    /// `byteval`.
    Bytes(Vec<u8>),
    /// `floatval`.
    Float(f32),
    /// `doubleval`.
    Double(f64),
    /// `boolval`.
    Bool(bool),
}

impl ObjVal {
    /// The first field that is set, in field-number order; `None` if none is.
    pub fn value(&self) -> Option<Value> {
        let v = if let Some(v) = self.intval {
            Value::Int(v)
        } else if let Some(v) = self.sintval {
            Value::SInt(v)
        } else if let Some(v) = self.int64val {
            Value::Int64(v)
        } else if let Some(v) = self.sint64val {
            Value::SInt64(v)
        } else if let Some(v) = &self.strval {
            Value::Str(v.clone())
        } else if let Some(v) = &self.byteval {
            Value::Bytes(v.clone())
        } else if let Some(v) = self.floatval {
            Value::Float(f32::from_bits(v))
        } else if let Some(v) = self.doubleval {
            Value::Double(f64::from_bits(v))
        } else {
            Value::Bool(self.boolval?)
        };
        Some(v)
    }

    /// A value holding `m` encoded in `byteval`.
    pub fn object<M: prost::Message>(m: &M) -> Self {
        ObjVal {
            byteval: Some(m.encode_to_vec()),
            ..Default::default()
        }
    }

    /// Decodes `byteval` as the payload message `M`.
    pub fn to_object<M: prost::Message + Default>(&self) -> Result<M, CdapError> {
        decode_object(self.byteval.as_deref().ok_or(CdapError::NoObjectValue)?)
    }
}

impl From<Value> for ObjVal {
    fn from(v: Value) -> Self {
        let mut o = ObjVal::default();
        match v {
            Value::Int(v) => o.intval = Some(v),
            Value::SInt(v) => o.sintval = Some(v),
            Value::Int64(v) => o.int64val = Some(v),
            Value::SInt64(v) => o.sint64val = Some(v),
            Value::Str(v) => o.strval = Some(v),
            Value::Bytes(v) => o.byteval = Some(v),
            Value::Float(v) => o.floatval = Some(v.to_bits()),
            Value::Double(v) => o.doubleval = Some(v.to_bits()),
            Value::Bool(v) => o.boolval = Some(v),
        }
        o
    }
}

impl From<i32> for ObjVal {
    /// An `intval`.
    fn from(v: i32) -> Self {
        Value::Int(v).into()
    }
}

impl From<i64> for ObjVal {
    /// An `int64val`.
    fn from(v: i64) -> Self {
        Value::Int64(v).into()
    }
}

impl From<bool> for ObjVal {
    fn from(v: bool) -> Self {
        Value::Bool(v).into()
    }
}

impl From<&str> for ObjVal {
    fn from(v: &str) -> Self {
        Value::Str(v.to_string()).into()
    }
}

impl From<String> for ObjVal {
    fn from(v: String) -> Self {
        Value::Str(v).into()
    }
}

impl From<Vec<u8>> for ObjVal {
    /// A `byteval`.
    fn from(v: Vec<u8>) -> Self {
        Value::Bytes(v).into()
    }
}

/// Authentication policy carried by M_CONNECT / M_CONNECT_R (`authPolicy_t`).
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct AuthPolicy {
    /// 1: policy name, e.g. [`AUTH_NONE`].
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    /// 2: supported versions.
    #[prost(string, repeated, tag = "2")]
    pub versions: Vec<String>,
    /// 3: opaque policy-specific value (credentials, challenge, ...).
    #[prost(bytes = "vec", optional, tag = "3")]
    pub options: Option<Vec<u8>>,
}

impl AuthPolicy {
    /// A policy `name`, version "1", with an opaque `options` value (omitted
    /// when empty).
    pub fn new(name: &str, options: Vec<u8>) -> Self {
        AuthPolicy {
            name: Some(name.to_string()),
            versions: vec!["1".to_string()],
            options: (!options.is_empty()).then_some(options),
        }
    }

    /// IRATI's "no authentication" policy.
    pub fn none() -> Self {
        AuthPolicy::new(AUTH_NONE, Vec::new())
    }
}

/// One CDAP message (`CDAPMessage`). See the module doc for the field table.
///
/// Build messages with the constructors ([`CdapMessage::create`],
/// [`CdapMessage::response_to`], ...) and the `with_*` methods; read the
/// opcode and flags with [`CdapMessage::op_code`] and [`CdapMessage::flags`].
/// `Default` is the empty protobuf message, which has no opcode and is not a
/// valid CDAP message.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct CdapMessage {
    /// 1: abstract syntax ([`ABSTRACT_SYNTAX`] on M_CONNECT / M_CONNECT_R).
    #[prost(int32, optional, tag = "1")]
    pub abs_syntax: Option<i32>,
    /// 2: opcode; required by the schema, checked by [`CdapMessage::decode`].
    #[prost(enumeration = "OpCode", optional, tag = "2")]
    op_code: Option<i32>,
    /// 3: invoke id; absent on a request that wants no reply.
    #[prost(int32, optional, tag = "3")]
    pub invoke_id: Option<i32>,
    /// 4: flags.
    #[prost(enumeration = "Flags", optional, tag = "4")]
    flags: Option<i32>,
    /// 5: class of the object.
    #[prost(string, optional, tag = "5")]
    pub obj_class: Option<String>,
    /// 6: name of the object, unique in its class.
    #[prost(string, optional, tag = "6")]
    pub obj_name: Option<String>,
    /// 7: object instance.
    #[prost(int64, optional, tag = "7")]
    pub obj_inst: Option<i64>,
    /// 8: value of the object.
    #[prost(message, optional, tag = "8")]
    pub obj_value: Option<ObjVal>,
    /// 9: result of the operation, 0 = success (absent means 0).
    #[prost(int32, optional, tag = "9", default = "0")]
    pub result: Option<i32>,
    /// 10: scope of a READ/WRITE.
    #[prost(int32, optional, tag = "10")]
    pub scope: Option<i32>,
    /// 11: filter script.
    #[prost(bytes = "vec", optional, tag = "11")]
    pub filter: Option<Vec<u8>>,
    /// 18: authentication policy (M_CONNECT / M_CONNECT_R).
    #[prost(message, optional, tag = "18")]
    pub auth_policy: Option<AuthPolicy>,
    /// 19: destination AE instance.
    #[prost(string, optional, tag = "19")]
    pub dest_ae_inst: Option<String>,
    /// 20: destination AE name.
    #[prost(string, optional, tag = "20")]
    pub dest_ae_name: Option<String>,
    /// 21: destination AP instance.
    #[prost(string, optional, tag = "21")]
    pub dest_ap_inst: Option<String>,
    /// 22: destination AP name.
    #[prost(string, optional, tag = "22")]
    pub dest_ap_name: Option<String>,
    /// 23: source AE instance.
    #[prost(string, optional, tag = "23")]
    pub src_ae_inst: Option<String>,
    /// 24: source AE name.
    #[prost(string, optional, tag = "24")]
    pub src_ae_name: Option<String>,
    /// 25: source AP instance.
    #[prost(string, optional, tag = "25")]
    pub src_ap_inst: Option<String>,
    /// 26: source AP name.
    #[prost(string, optional, tag = "26")]
    pub src_ap_name: Option<String>,
    /// 27: explanation of the result.
    #[prost(string, optional, tag = "27")]
    pub result_reason: Option<String>,
    /// 28: RIB / class version, for application use.
    #[prost(int64, optional, tag = "28")]
    pub version: Option<i64>,
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

impl CdapMessage {
    /// A message with only its opcode set.
    pub fn new(op: OpCode) -> Self {
        CdapMessage {
            op_code: Some(op as i32),
            ..Default::default()
        }
    }

    fn object_op(op: OpCode, class: &str, name: &str) -> Self {
        CdapMessage {
            obj_class: Some(class.to_string()),
            obj_name: Some(name.to_string()),
            ..CdapMessage::new(op)
        }
    }

    /// M_CONNECT from `src` to `dest` with `auth` and the abstract syntax.
    pub fn connect(auth: AuthPolicy, src: &AppName, dest: &AppName) -> Self {
        CdapMessage {
            abs_syntax: Some(ABSTRACT_SYNTAX),
            auth_policy: Some(auth),
            ..CdapMessage::new(OpCode::Connect)
        }
        .with_src(src)
        .with_dest(dest)
    }

    /// M_RELEASE.
    pub fn release() -> Self {
        CdapMessage::new(OpCode::Release)
    }

    /// M_CREATE of object `class`/`name` with `value`.
    pub fn create(class: &str, name: &str, value: impl Into<ObjVal>) -> Self {
        CdapMessage::object_op(OpCode::Create, class, name).with_value(value)
    }

    /// M_DELETE of object `class`/`name`.
    pub fn delete(class: &str, name: &str) -> Self {
        CdapMessage::object_op(OpCode::Delete, class, name)
    }

    /// M_READ of object `class`/`name`.
    pub fn read(class: &str, name: &str) -> Self {
        CdapMessage::object_op(OpCode::Read, class, name)
    }

    /// M_WRITE of `value` to object `class`/`name`.
    pub fn write(class: &str, name: &str, value: impl Into<ObjVal>) -> Self {
        CdapMessage::object_op(OpCode::Write, class, name).with_value(value)
    }

    /// M_START of object `class`/`name` (add a value with `with_value`).
    pub fn start(class: &str, name: &str) -> Self {
        CdapMessage::object_op(OpCode::Start, class, name)
    }

    /// M_STOP of object `class`/`name` (add a value with `with_value`).
    pub fn stop(class: &str, name: &str) -> Self {
        CdapMessage::object_op(OpCode::Stop, class, name)
    }

    /// M_CANCELREAD of the read with invoke id `invoke_id`.
    pub fn cancel_read(invoke_id: InvokeId) -> Self {
        CdapMessage::new(OpCode::CancelRead).with_invoke_id(invoke_id)
    }

    /// The response to request `req`: same invoke id and object, `result`
    /// (0 = success) and `reason` (omitted when empty). A response to
    /// M_CONNECT also gets the abstract syntax and `req`'s names swapped.
    pub fn response_to(req: &CdapMessage, result: i32, reason: &str) -> Result<Self, CdapError> {
        let op = req.op_code();
        let rop = op.response().ok_or(CdapError::NotARequest(op))?;
        let mut r = CdapMessage {
            invoke_id: req.invoke_id,
            obj_class: req.obj_class.clone(),
            obj_name: req.obj_name.clone(),
            obj_inst: req.obj_inst,
            result: Some(result),
            result_reason: non_empty(reason),
            ..CdapMessage::new(rop)
        };
        if op == OpCode::Connect {
            r.abs_syntax = Some(ABSTRACT_SYNTAX);
            r = r.with_src(&req.dest_name()).with_dest(&req.src_name());
        }
        Ok(r)
    }

    /// Sets the invoke id.
    pub fn with_invoke_id(mut self, id: InvokeId) -> Self {
        self.invoke_id = Some(id);
        self
    }

    /// Sets the object value.
    pub fn with_value(mut self, v: impl Into<ObjVal>) -> Self {
        self.obj_value = Some(v.into());
        self
    }

    /// Sets the object value to `m` encoded in `byteval`.
    pub fn with_object<M: prost::Message>(self, m: &M) -> Self {
        self.with_value(ObjVal::object(m))
    }

    /// Sets the flags.
    pub fn with_flags(mut self, f: Flags) -> Self {
        self.set_flags(f);
        self
    }

    /// Sets the object instance.
    pub fn with_obj_inst(mut self, i: i64) -> Self {
        self.obj_inst = Some(i);
        self
    }

    /// Sets the scope.
    pub fn with_scope(mut self, s: i32) -> Self {
        self.scope = Some(s);
        self
    }

    /// Sets the filter.
    pub fn with_filter(mut self, f: Vec<u8>) -> Self {
        self.filter = Some(f);
        self
    }

    /// Sets the version.
    pub fn with_version(mut self, v: i64) -> Self {
        self.version = Some(v);
        self
    }

    /// Sets the authentication policy.
    pub fn with_auth(mut self, a: AuthPolicy) -> Self {
        self.auth_policy = Some(a);
        self
    }

    /// Sets the four source name fields (empty parts are omitted).
    pub fn with_src(mut self, n: &AppName) -> Self {
        self.src_ap_name = non_empty(&n.process_name);
        self.src_ap_inst = non_empty(&n.process_instance);
        self.src_ae_name = non_empty(&n.entity_name);
        self.src_ae_inst = non_empty(&n.entity_instance);
        self
    }

    /// Sets the four destination name fields (empty parts are omitted).
    pub fn with_dest(mut self, n: &AppName) -> Self {
        self.dest_ap_name = non_empty(&n.process_name);
        self.dest_ap_inst = non_empty(&n.process_instance);
        self.dest_ae_name = non_empty(&n.entity_name);
        self.dest_ae_inst = non_empty(&n.entity_instance);
        self
    }

    /// The source name fields as an [`AppName`] (not checked for validity).
    pub fn src_name(&self) -> AppName {
        AppName {
            process_name: self.src_ap_name().to_string(),
            process_instance: self.src_ap_inst().to_string(),
            entity_name: self.src_ae_name().to_string(),
            entity_instance: self.src_ae_inst().to_string(),
        }
    }

    /// The destination name fields as an [`AppName`] (not checked).
    pub fn dest_name(&self) -> AppName {
        AppName {
            process_name: self.dest_ap_name().to_string(),
            process_instance: self.dest_ap_inst().to_string(),
            entity_name: self.dest_ae_name().to_string(),
            entity_instance: self.dest_ae_inst().to_string(),
        }
    }

    /// True if the opcode is a response (`_R`).
    pub fn is_response(&self) -> bool {
        self.op_code().is_response()
    }

    /// True if F_RD_INCOMPLETE is set: more M_READ_R follow for this read.
    pub fn is_incomplete(&self) -> bool {
        self.flags() == Flags::RdIncomplete
    }

    /// The object value as a [`Value`], if one is set.
    pub fn value(&self) -> Option<Value> {
        self.obj_value.as_ref()?.value()
    }

    /// The object value's `byteval` decoded as payload message `M`.
    pub fn object<M: prost::Message + Default>(&self) -> Result<M, CdapError> {
        self.obj_value
            .as_ref()
            .ok_or(CdapError::NoObjectValue)?
            .to_object()
    }

    /// Checks what the schema and CDAP require beyond protobuf well-formedness:
    /// an opcode that is present and known, known flags, an invoke id where
    /// one is needed and never negative, F_RD_INCOMPLETE only on M_READ_R.
    pub fn validate(&self) -> Result<(), CdapError> {
        let raw = self.op_code.ok_or(CdapError::MissingOpCode)?;
        let op = OpCode::try_from(raw).map_err(|_| CdapError::UnknownOpCode(raw))?;
        if let Some(f) = self.flags {
            let f = Flags::try_from(f).map_err(|_| CdapError::UnknownFlags(f))?;
            if f == Flags::RdIncomplete && op != OpCode::ReadR {
                return Err(CdapError::MisplacedIncomplete(op));
            }
        }
        match self.invoke_id {
            None if op.needs_invoke_id() => Err(CdapError::MissingInvokeId(op)),
            Some(i) if i < 0 => Err(CdapError::NegativeInvokeId(i)),
            _ => Ok(()),
        }
    }

    /// Decodes and validates one message ([`CdapMessage::validate`]).
    /// Never panics; anything malformed is an error.
    pub fn decode(buf: &[u8]) -> Result<CdapMessage, CdapError> {
        let m = <CdapMessage as prost::Message>::decode(buf)?;
        m.validate()?;
        Ok(m)
    }

    /// The message as protobuf bytes.
    pub fn encode(&self) -> Vec<u8> {
        prost::Message::encode_to_vec(self)
    }
}

/// Encodes an object-value payload message.
pub fn encode_object<M: prost::Message>(m: &M) -> Vec<u8> {
    m.encode_to_vec()
}

/// Decodes an object-value payload message. Never panics.
pub fn decode_object<M: prost::Message + Default>(buf: &[u8]) -> Result<M, CdapError> {
    Ok(M::decode(buf)?)
}

/// Naming information of an application process
/// (`applicationProcessNamingInfo_t`, IRATI's
/// `ApplicationProcessNamingInfoMessage.proto`: same field numbers).
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct ApplicationProcessNamingInfo {
    /// 1: process name (required).
    #[prost(string, required, tag = "1")]
    pub process_name: String,
    /// 2: process instance.
    #[prost(string, tag = "2")]
    pub process_instance: String,
    /// 3: entity name.
    #[prost(string, tag = "3")]
    pub entity_name: String,
    /// 4: entity instance.
    #[prost(string, tag = "4")]
    pub entity_instance: String,
}

impl From<&AppName> for ApplicationProcessNamingInfo {
    fn from(n: &AppName) -> Self {
        ApplicationProcessNamingInfo {
            process_name: n.process_name.clone(),
            process_instance: n.process_instance.clone(),
            entity_name: n.entity_name.clone(),
            entity_instance: n.entity_instance.clone(),
        }
    }
}

impl From<&ApplicationProcessNamingInfo> for AppName {
    /// The four parts as they are (not checked for validity).
    fn from(n: &ApplicationProcessNamingInfo) -> Self {
        AppName {
            process_name: n.process_name.clone(),
            process_instance: n.process_instance.clone(),
            entity_name: n.entity_name.clone(),
            entity_instance: n.entity_instance.clone(),
        }
    }
}

/// A flow state object of link-state routing (`flowStateObject_t`; field
/// numbers of IRATI's current `FlowStateMessage.proto`).
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct FlowStateObject {
    /// 1: name of the IPC process.
    #[prost(string, tag = "1")]
    pub name: String,
    /// 2: its addresses.
    #[prost(uint64, repeated, packed = "false", tag = "2")]
    pub addresses: Vec<u64>,
    /// 3: name of the neighbour IPC process.
    #[prost(string, tag = "3")]
    pub neighbor_name: String,
    /// 4: the neighbour's addresses.
    #[prost(uint64, repeated, packed = "false", tag = "4")]
    pub neighbor_addresses: Vec<u64>,
    /// 5: cost of the N-1 flow.
    #[prost(uint32, tag = "5")]
    pub cost: u32,
    /// 6: sequence number, to discard old information.
    #[prost(uint32, tag = "6")]
    pub sequence_number: u32,
    /// 7: true if the N-1 flow is up.
    #[prost(bool, tag = "7")]
    pub state: bool,
    /// 8: age of the object, in seconds.
    #[prost(uint32, tag = "8")]
    pub age: u32,
}

/// A group of flow state objects (`flowStateObjectGroup_t`).
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct FlowStateObjectGroup {
    /// 1: the objects.
    #[prost(message, repeated, tag = "1")]
    pub flow_state_objects: Vec<FlowStateObject>,
}

/// A neighbour of an IPC process (`neighbor_t`).
///
/// Field numbers: 1 and 2 as in IRATI's `NeighborMessage.proto`; the rest
/// follow the order of the current IRATI schema's fields (AE name, AE
/// instance, address, supporting DIFs) as 3–6. An older IRATI version
/// numbered `address` 3 and `supportingDifs` 4 without the AE fields; which
/// one the final IRATI code uses could not be checked.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct Neighbor {
    /// 1: application process name.
    #[prost(string, tag = "1")]
    pub ap_name: String,
    /// 2: application process instance.
    #[prost(string, tag = "2")]
    pub ap_instance: String,
    /// 3: application entity name.
    #[prost(string, tag = "3")]
    pub ae_name: String,
    /// 4: application entity instance.
    #[prost(string, tag = "4")]
    pub ae_instance: String,
    /// 5: address in the DIF.
    #[prost(uint64, tag = "5")]
    pub address: u64,
    /// 6: names of the N-1 DIFs through which it is reachable.
    #[prost(string, repeated, tag = "6")]
    pub supporting_difs: Vec<String>,
}

/// What an enrolling member and the DIF tell each other
/// (`enrollmentInformation_t`; 1–3 as in IRATI's
/// `EnrollmentInformationMessage.proto`, `token` = 4 is ours/unverified).
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct EnrollmentInformation {
    /// 1: address assigned to (or held by) the member.
    #[prost(uint64, tag = "1")]
    pub address: u64,
    /// 2: N-1 DIFs the member can be reached through.
    #[prost(string, repeated, tag = "2")]
    pub supporting_difs: Vec<String>,
    /// 3: the member may start before enrollment completes.
    #[prost(bool, tag = "3")]
    pub start_early: bool,
    /// 4: opaque token.
    #[prost(string, tag = "4")]
    pub token: String,
}

/// The configuration a member gives an enrollee as the `/dt` object
/// (ours, in the spirit of IRATI's `dif_configuration_t`): the DIF's name,
/// its data-transfer constants and SDU protection (the *wire profile*,
/// which both sides must already share to talk at all), the largest SDU,
/// which layer-management policies run, and the QoS cubes.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct DifConfiguration {
    /// 1: the DIF's name.
    #[prost(string, tag = "1")]
    pub dif_name: String,
    /// 2: bytes of an address.
    #[prost(uint32, tag = "2")]
    pub address_length: u32,
    /// 3: bytes of a CEP-id.
    #[prost(uint32, tag = "3")]
    pub cep_id_length: u32,
    /// 4: bytes of a QoS-id.
    #[prost(uint32, tag = "4")]
    pub qos_id_length: u32,
    /// 5: bytes of the length field.
    #[prost(uint32, tag = "5")]
    pub length_length: u32,
    /// 6: bytes of a sequence number.
    #[prost(uint32, tag = "6")]
    pub seq_num_length: u32,
    /// 7: bytes of a control sequence number.
    #[prost(uint32, tag = "7")]
    pub ctrl_seq_num_length: u32,
    /// 8: bytes of a rate.
    #[prost(uint32, tag = "8")]
    pub rate_length: u32,
    /// 9: bytes of a time frame.
    #[prost(uint32, tag = "9")]
    pub frame_length: u32,
    /// 10: largest PDU.
    #[prost(uint32, tag = "10")]
    pub max_pdu_size: u32,
    /// 11: longest PDU lifetime, ms.
    #[prost(uint32, tag = "11")]
    pub max_pdu_lifetime_ms: u32,
    /// 12: initial TTL of SDU protection (0: no TTL field).
    #[prost(uint32, tag = "12")]
    pub ttl: u32,
    /// 13: SDU protection appends a CRC-32.
    #[prost(bool, tag = "13")]
    pub crc: bool,
    /// 14: largest SDU of the DIF's flows.
    #[prost(uint64, tag = "14")]
    pub max_sdu: u64,
    /// 15: link-state routing runs.
    #[prost(bool, tag = "15")]
    pub link_state_routing: bool,
    /// 16: the directory is disseminated.
    #[prost(bool, tag = "16")]
    pub distributed_directory: bool,
    /// 17: the QoS cubes.
    #[prost(message, repeated, tag = "17")]
    pub qos_cubes: Vec<QosCubeInfo>,
}

/// A QoS cube as carried in [`DifConfiguration`].
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct QosCubeInfo {
    /// 1: QoS-id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// 2: name.
    #[prost(string, tag = "2")]
    pub name: String,
    /// 3: EFCP retransmits and delivers in order.
    #[prost(bool, tag = "3")]
    pub reliable: bool,
}

/// A directory entry: where an application is registered
/// (`directoryForwardingTableEntry_t`, IRATI's field numbers).
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct DirectoryForwardingTableEntry {
    /// 1: the application (required).
    #[prost(message, required, tag = "1")]
    pub application_name: ApplicationProcessNamingInfo,
    /// 2: address of the IPC process it is registered at (required).
    #[prost(uint64, required, tag = "2")]
    pub ipc_process_synonym: u64,
    /// 3: sequence number.
    #[prost(uint64, tag = "3")]
    pub seqnum: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn name(s: &str) -> AppName {
        s.parse().unwrap()
    }

    /// Appends a length-delimited field (`tag` already shifted) to `v`.
    fn ld(v: &mut Vec<u8>, tag: &[u8], body: &[u8]) {
        v.extend_from_slice(tag);
        v.push(body.len() as u8);
        v.extend_from_slice(body);
    }

    /// Every field of CDAPMessage, written out by hand: proves the numbers
    /// and wire types against IRATI's schema.
    fn hand_encoded() -> Vec<u8> {
        let mut v = vec![
            0x08, 0x73, // 1 absSyntax varint 0x73
            0x10, 0x09, // 2 opCode varint M_READ_R
            0x18, 0x2a, // 3 invokeID 42
            0x20, 0x02, // 4 flags F_RD_INCOMPLETE
        ];
        ld(&mut v, &[0x2a], b"cls"); // 5 objClass
        ld(&mut v, &[0x32], b"obj"); // 6 objName
        v.extend_from_slice(&[0x38, 0x07]); // 7 objInst 7
        ld(&mut v, &[0x42], &[0x2a, 0x01, b'x']); // 8 objValue { 5 strval "x" }
        v.push(0x48); // 9 result -1: ten-byte varint
        v.extend_from_slice(&[0xff; 9]);
        v.push(0x01);
        v.extend_from_slice(&[0x50, 0x03]); // 10 scope 3
        ld(&mut v, &[0x5a], &[0xde, 0xad]); // 11 filter
                                            // 18 authPolicy { 1 name "n", 2 versions "1", 3 options 0x01 }
        ld(
            &mut v,
            &[0x92, 0x01],
            &[0x0a, 0x01, b'n', 0x12, 0x01, b'1', 0x1a, 0x01, 0x01],
        );
        ld(&mut v, &[0x9a, 0x01], b"dai"); // 19 destAEInst
        ld(&mut v, &[0xa2, 0x01], b"dae"); // 20 destAEName
        ld(&mut v, &[0xaa, 0x01], b"dpi"); // 21 destApInst
        ld(&mut v, &[0xb2, 0x01], b"dpn"); // 22 destApName
        ld(&mut v, &[0xba, 0x01], b"sai"); // 23 srcAEInst
        ld(&mut v, &[0xc2, 0x01], b"sae"); // 24 srcAEName
        ld(&mut v, &[0xca, 0x01], b"spi"); // 25 srcApInst
        ld(&mut v, &[0xd2, 0x01], b"spn"); // 26 srcApName
        ld(&mut v, &[0xda, 0x01], b"why"); // 27 resultReason
        v.extend_from_slice(&[0xe0, 0x01, 0x05]); // 28 version 5
        v
    }

    fn expected() -> CdapMessage {
        CdapMessage {
            abs_syntax: Some(0x73),
            invoke_id: Some(42),
            obj_class: Some("cls".into()),
            obj_name: Some("obj".into()),
            obj_inst: Some(7),
            obj_value: Some("x".into()),
            result: Some(-1),
            scope: Some(3),
            filter: Some(vec![0xde, 0xad]),
            auth_policy: Some(AuthPolicy {
                name: Some("n".into()),
                versions: vec!["1".into()],
                options: Some(vec![1]),
            }),
            dest_ae_inst: Some("dai".into()),
            dest_ae_name: Some("dae".into()),
            dest_ap_inst: Some("dpi".into()),
            dest_ap_name: Some("dpn".into()),
            src_ae_inst: Some("sai".into()),
            src_ae_name: Some("sae".into()),
            src_ap_inst: Some("spi".into()),
            src_ap_name: Some("spn".into()),
            result_reason: Some("why".into()),
            version: Some(5),
            ..CdapMessage::new(OpCode::ReadR)
        }
        .with_flags(Flags::RdIncomplete)
    }

    #[test]
    fn hand_encoded_bytes_decode_to_the_fields() {
        let m = CdapMessage::decode(&hand_encoded()).unwrap();
        assert_eq!(m, expected());
        assert_eq!(m.op_code(), OpCode::ReadR);
        assert!(m.is_incomplete());
        assert_eq!(m.src_name(), name("spn/spi/sae/sai"));
        assert_eq!(m.dest_name(), name("dpn/dpi/dae/dai"));
        // prost writes fields in tag order, so our encoding is exactly this.
        assert_eq!(m.encode(), hand_encoded());
    }

    #[test]
    fn obj_val_field_numbers() {
        let cases: [(&[u8], Value); 9] = [
            (&[0x08, 0x05], Value::Int(5)),
            (&[0x10, 0x01], Value::SInt(-1)),
            (&[0x18, 0x80, 0x01], Value::Int64(128)),
            (&[0x20, 0x03], Value::SInt64(-2)),
            (&[0x2a, 0x02, b'h', b'i'], Value::Str("hi".into())),
            (&[0x32, 0x01, 0x09], Value::Bytes(vec![9])),
            (&[0x3d, 0x00, 0x00, 0x80, 0x3f], Value::Float(1.0)),
            (&[0x41, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f], Value::Double(1.0)),
            (&[0x48, 0x01], Value::Bool(true)),
        ];
        for (bytes, val) in cases {
            let o: ObjVal = decode_object(bytes).unwrap();
            assert_eq!(o.value(), Some(val.clone()));
            assert_eq!(encode_object(&ObjVal::from(val)), bytes);
        }
        assert_eq!(ObjVal::default().value(), None);
    }

    #[test]
    fn opcode_required_and_known() {
        // invokeID 1 only: no opCode.
        assert_eq!(
            CdapMessage::decode(&[0x18, 0x01]),
            Err(CdapError::MissingOpCode)
        );
        // An explicit M_CONNECT (0) is present, not missing.
        let m = CdapMessage::decode(&[0x10, 0x00, 0x18, 0x01]).unwrap();
        assert_eq!(m.op_code(), OpCode::Connect);
        assert_eq!(
            CdapMessage::decode(&[0x10, 18]),
            Err(CdapError::UnknownOpCode(18))
        );
        assert_eq!(
            CdapMessage::decode(&[0x10, 0x08, 0x20, 0x03]),
            Err(CdapError::UnknownFlags(3))
        );
        assert!(matches!(
            CdapMessage::decode(&[0x10]),
            Err(CdapError::Malformed(_))
        ));
    }

    #[test]
    fn validation_rules() {
        // Responses, M_CONNECT and M_CANCELREAD need an invoke id.
        for op in OpCode::ALL {
            let r = CdapMessage::new(op).validate();
            if op.needs_invoke_id() {
                assert_eq!(r, Err(CdapError::MissingInvokeId(op)));
            } else {
                assert_eq!(r, Ok(()));
            }
        }
        assert_eq!(
            CdapMessage::read("c", "n").with_invoke_id(-3).validate(),
            Err(CdapError::NegativeInvokeId(-3))
        );
        assert_eq!(
            CdapMessage::read("c", "n")
                .with_flags(Flags::RdIncomplete)
                .validate(),
            Err(CdapError::MisplacedIncomplete(OpCode::Read))
        );
        assert_eq!(
            CdapMessage::read("c", "n")
                .with_flags(Flags::Sync)
                .validate(),
            Ok(())
        );
    }

    #[test]
    fn opcode_pairs() {
        for op in OpCode::ALL {
            assert_eq!(op.is_response(), (op as i32) % 2 == 1);
            if let Some(r) = op.response() {
                assert_eq!(r.request(), Some(op));
            }
            assert!(op.name().starts_with("M_"));
        }
        assert_eq!(OpCode::Read.response(), Some(OpCode::ReadR));
        assert_eq!(OpCode::StopR.response(), None);
        assert_eq!(OpCode::Connect.request(), None);
        assert_eq!(OpCode::CancelReadR.to_string(), "M_CANCELREAD_R");
    }

    #[test]
    fn constructors() {
        let src = name("a/1/mgmt");
        let dst = name("b//mgmt/2");
        let c = CdapMessage::connect(AuthPolicy::none(), &src, &dst).with_invoke_id(1);
        assert_eq!(c.abs_syntax, Some(ABSTRACT_SYNTAX));
        assert_eq!(c.src_name(), src);
        assert_eq!(c.dest_name(), dst);
        assert_eq!(c.src_ae_inst, None);
        let r = CdapMessage::response_to(&c, 0, "").unwrap();
        assert_eq!(r.op_code(), OpCode::ConnectR);
        assert_eq!(r.invoke_id, Some(1));
        assert_eq!(r.result, Some(0));
        assert_eq!(r.result_reason, None);
        assert_eq!(r.src_name(), dst);
        assert_eq!(r.dest_name(), src);
        assert_eq!(r.validate(), Ok(()));
        assert_eq!(
            CdapMessage::response_to(&r, 0, ""),
            Err(CdapError::NotARequest(OpCode::ConnectR))
        );

        let w = CdapMessage::write("k", "/x", 5i64).with_invoke_id(9);
        let wr = CdapMessage::response_to(&w, -2, "no").unwrap();
        assert_eq!(wr.op_code(), OpCode::WriteR);
        assert_eq!(wr.obj_class(), "k");
        assert_eq!(wr.obj_name(), "/x");
        assert_eq!(wr.result_reason(), "no");
        assert_eq!(w.value(), Some(Value::Int64(5)));
        assert_eq!(CdapMessage::cancel_read(4).invoke_id, Some(4));
        assert_eq!(
            CdapMessage::read("c", "n").result(),
            0,
            "result defaults to 0"
        );
    }

    #[test]
    fn payloads_round_trip_and_field_numbers() {
        let dft = DirectoryForwardingTableEntry {
            application_name: (&name("echo/1")).into(),
            ipc_process_synonym: 0,
            seqnum: 0,
        };
        // Required fields are written even when they hold the default.
        assert_eq!(
            encode_object(&dft),
            [0x0a, 0x09, 0x0a, 0x04, b'e', b'c', b'h', b'o', 0x12, 0x01, b'1', 0x10, 0x00]
        );
        let m = CdapMessage::create("dft", "/dft/echo", ObjVal::object(&dft));
        assert_eq!(m.object::<DirectoryForwardingTableEntry>(), Ok(dft.clone()));
        assert_eq!(
            AppName::from(&dft.application_name),
            name("echo/1"),
            "naming info converts back"
        );
        assert_eq!(
            CdapMessage::read("a", "b").object::<Neighbor>(),
            Err(CdapError::NoObjectValue)
        );

        // proto2 repeated scalars are unpacked: one tag per element.
        let fso = FlowStateObject {
            addresses: vec![1, 2],
            ..Default::default()
        };
        assert_eq!(encode_object(&fso), [0x10, 0x01, 0x10, 0x02]);
        let g = FlowStateObjectGroup {
            flow_state_objects: vec![
                fso,
                FlowStateObject {
                    name: "a".into(),
                    neighbor_name: "b".into(),
                    neighbor_addresses: vec![3],
                    cost: 1,
                    sequence_number: 2,
                    state: true,
                    age: 4,
                    ..Default::default()
                },
            ],
        };
        assert_eq!(
            decode_object::<FlowStateObjectGroup>(&encode_object(&g)),
            Ok(g)
        );

        let n = Neighbor {
            ap_name: "a".into(),
            address: 0x10,
            supporting_difs: vec!["eth".into()],
            ..Default::default()
        };
        assert_eq!(
            encode_object(&n),
            [0x0a, 0x01, b'a', 0x28, 0x10, 0x32, 0x03, b'e', b't', b'h']
        );
        let e = EnrollmentInformation {
            address: 7,
            supporting_difs: vec!["x".into()],
            start_early: true,
            token: "t".into(),
        };
        assert_eq!(
            encode_object(&e),
            [0x08, 0x07, 0x12, 0x01, b'x', 0x18, 0x01, 0x22, 0x01, b't']
        );
        assert!(decode_object::<Neighbor>(&[0x0a, 0x05]).is_err());
    }

    fn opt<T: std::fmt::Debug + Clone>(
        s: impl Strategy<Value = T>,
    ) -> impl Strategy<Value = Option<T>> {
        proptest::option::of(s)
    }

    fn obj_val() -> impl Strategy<Value = ObjVal> {
        (
            (opt(any::<i32>()), opt(any::<i32>()), opt(any::<i64>())),
            (
                opt(any::<i64>()),
                opt(".{0,8}"),
                opt(proptest::collection::vec(any::<u8>(), 0..16)),
            ),
            (opt(any::<u32>()), opt(any::<u64>()), opt(any::<bool>())),
        )
            .prop_map(|((a, b, c), (d, e, f), (g, h, i))| ObjVal {
                intval: a,
                sintval: b,
                int64val: c,
                sint64val: d,
                strval: e,
                byteval: f,
                floatval: g,
                doubleval: h,
                boolval: i,
            })
    }

    fn message() -> impl Strategy<Value = CdapMessage> {
        let s = || opt("[a-z/]{0,6}");
        (
            (0..18i32, opt(0..i32::MAX), opt(0..3i32), opt(any::<i32>())),
            (
                s(),
                s(),
                opt(any::<i64>()),
                opt(obj_val()),
                opt(any::<i32>()),
            ),
            (
                opt(any::<i32>()),
                opt(proptest::collection::vec(any::<u8>(), 0..8)),
            ),
            opt((opt(".{0,4}"), proptest::collection::vec(".{0,3}", 0..3))),
            (
                s(),
                s(),
                s(),
                s(),
                s(),
                s(),
                s(),
                s(),
                s(),
                opt(any::<i64>()),
            ),
        )
            .prop_map(|(a, b, c, auth, names)| {
                let (op, invoke, flags, abs) = a;
                let op = OpCode::try_from(op).unwrap();
                let mut m = CdapMessage::new(op);
                m.abs_syntax = abs;
                // Keep only what validates: an invoke id where needed, the
                // incomplete flag on M_READ_R only.
                m.invoke_id = invoke.or(op.needs_invoke_id().then_some(1));
                m.flags = flags.filter(|&f| f != 2 || op == OpCode::ReadR);
                (m.obj_class, m.obj_name, m.obj_inst, m.obj_value, m.result) = b;
                (m.scope, m.filter) = c;
                m.auth_policy = auth.map(|(name, versions)| AuthPolicy {
                    name,
                    versions,
                    options: Some(vec![1, 2]),
                });
                (
                    m.dest_ae_inst,
                    m.dest_ae_name,
                    m.dest_ap_inst,
                    m.dest_ap_name,
                    m.src_ae_inst,
                    m.src_ae_name,
                    m.src_ap_inst,
                    m.src_ap_name,
                    m.result_reason,
                    m.version,
                ) = names;
                m
            })
    }

    proptest! {
        #[test]
        fn round_trip(m in message()) {
            let bytes = m.encode();
            prop_assert_eq!(CdapMessage::decode(&bytes), Ok(m));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(m) = CdapMessage::decode(&bytes) {
                // Whatever decodes re-encodes to something that decodes the same.
                prop_assert_eq!(CdapMessage::decode(&m.encode()), Ok(m));
            }
            let _ = decode_object::<FlowStateObjectGroup>(&bytes);
            let _ = decode_object::<DirectoryForwardingTableEntry>(&bytes);
        }

        #[test]
        fn decode_mutated_never_panics(m in message(), at in any::<prop::sample::Index>(), b in any::<u8>()) {
            let mut bytes = m.encode();
            if !bytes.is_empty() {
                let i = at.index(bytes.len());
                bytes[i] = b;
            }
            let _ = CdapMessage::decode(&bytes);
        }
    }
}
