//! Bounds-checked reading and writing of big-endian fields.
//!
//! Every decoder in this crate reads through [`Reader`], whose methods return
//! [`WireError`] instead of panicking when the input is short or malformed.

use thiserror::Error;

/// Why a sequence of bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// The input ended before a field of `need` bytes could be read at `at`.
    #[error("truncated: needed {need} bytes at offset {at}, only {have} left")]
    Truncated { at: usize, need: usize, have: usize },
    /// The type/opcode byte is not one this format defines.
    #[error("unknown message type 0x{0:02x}")]
    UnknownType(u8),
    /// A version field does not match the version this code speaks.
    #[error("unsupported version {0}")]
    BadVersion(u8),
    /// A text field is not valid UTF-8.
    #[error("field {0} is not valid UTF-8")]
    BadUtf8(&'static str),
    /// A field holds a value outside its allowed range.
    #[error("field {field} has invalid value {value}")]
    BadValue { field: &'static str, value: u64 },
    /// A name field could not be parsed as a RINA application name.
    #[error("bad application name: {0}")]
    BadName(#[from] crate::name::NameError),
    /// Bytes were left over after a message that must fill the whole input.
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    /// A value to encode does not fit the width its field has on the wire.
    #[error("field {field}: value {value} does not fit in {width} bytes")]
    FieldOverflow {
        field: &'static str,
        value: u64,
        width: u8,
    },
    /// A PDU is longer than the largest PDU its DIF allows.
    #[error("PDU of {length} bytes is longer than the maximum of {max} bytes")]
    PduTooLong { length: u64, max: u64 },
    /// The PDU type says one kind of body, the message holds another.
    #[error("PDU type 0x{0:02x} does not match the body it is given")]
    BodyMismatch(u8),
    /// A configuration constant of a wire format is outside its allowed range.
    #[error("constant {field} = {value} is outside the allowed range {min}..={max}")]
    BadConstant {
        field: &'static str,
        value: u64,
        min: u64,
        max: u64,
    },
}

/// A cursor over a byte slice that never reads out of bounds.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Starts reading at the beginning of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Takes the next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.remaining() < n {
            return Err(WireError::Truncated {
                at: self.pos,
                need: n,
                have: self.remaining(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// Takes everything that is left.
    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    /// Reads one byte.
    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.array::<1>()?[0])
    }
    /// Reads a big-endian u16.
    pub fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.array()?))
    }
    /// Reads a big-endian u32.
    pub fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    /// Reads a big-endian u64.
    pub fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// Reads a UTF-8 string prefixed by its u16 length.
    pub fn str16(&mut self, field: &'static str) -> Result<&'a str, WireError> {
        let n = self.u16()? as usize;
        std::str::from_utf8(self.bytes(n)?).map_err(|_| WireError::BadUtf8(field))
    }

    /// Fails if any bytes are left.
    pub fn finish(&self) -> Result<(), WireError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(WireError::Trailing(n)),
        }
    }
}

/// `s` cut to at most `max` bytes, on a character boundary, so that a text
/// field always fits the room a message has for it.
pub fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Appends big-endian fields to a buffer.
pub trait Writer {
    /// Appends a u16 in network byte order.
    fn put_u16_be(&mut self, v: u16);
    /// Appends a u32 in network byte order.
    fn put_u32_be(&mut self, v: u32);
    /// Appends a u64 in network byte order.
    fn put_u64_be(&mut self, v: u64);
    /// Appends a string prefixed by its u16 length. Text longer than 65,535
    /// bytes is cut to the last whole character that fits
    /// ([`truncate_utf8`]), so [`Reader::str16`] always reads it back;
    /// callers that must not lose text bound it first.
    fn put_str16(&mut self, s: &str);
}

impl Writer for Vec<u8> {
    fn put_u16_be(&mut self, v: u16) {
        self.extend_from_slice(&v.to_be_bytes());
    }
    fn put_u32_be(&mut self, v: u32) {
        self.extend_from_slice(&v.to_be_bytes());
    }
    fn put_u64_be(&mut self, v: u64) {
        self.extend_from_slice(&v.to_be_bytes());
    }
    fn put_str16(&mut self, s: &str) {
        let s = truncate_utf8(s, u16::MAX as usize);
        // At most u16::MAX bytes now, so the length fits.
        self.put_u16_be(s.len() as u16);
        self.extend_from_slice(s.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_input_is_an_error_not_a_panic() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.u16().unwrap(), 0x0102);
        assert_eq!(
            r.u32(),
            Err(WireError::Truncated {
                at: 2,
                need: 4,
                have: 1
            })
        );
    }

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate_utf8("héllo", 2), "h");
        assert_eq!(truncate_utf8("héllo", 3), "hé");
        assert_eq!(truncate_utf8("abc", 10), "abc");
    }

    #[test]
    fn str16_cut_keeps_whole_characters() {
        // 65,536 bytes; cutting at 65,535 would split the 'é'.
        let s = "a".repeat(65_534) + "é";
        let mut v = Vec::new();
        v.put_str16(&s);
        let mut r = Reader::new(&v);
        assert_eq!(r.str16("x"), Ok(&s[..65_534]));
        assert_eq!(r.finish(), Ok(()));
        // What fits is written whole.
        let s = "a".repeat(65_533) + "é";
        let mut v = Vec::new();
        v.put_str16(&s);
        assert_eq!(Reader::new(&v).str16("x"), Ok(s.as_str()));
    }

    #[test]
    fn str16_rejects_bad_utf8() {
        let mut r = Reader::new(&[0, 2, 0xff, 0xfe]);
        assert_eq!(r.str16("x"), Err(WireError::BadUtf8("x")));
    }
}
