//! An SDU as a normal IPCP delivers it: one buffer, or the buffers of the
//! fragments it was reassembled from.
//!
//! An SDU that arrived in one PDU is delivered in that PDU's buffer, past
//! its headers. One that was cut into fragments is delivered as the
//! fragments' own buffers, each past its delimiter, in order: reassembly
//! copies nothing, and the consumer gathers the pieces where it writes
//! them (an application's ring, a `writev`) or asks for one buffer
//! ([`Sdu::into_buf`]), which copies them once.

use crate::buf::{self, PduBuf};
use std::fmt;

/// A delivered SDU (see the module's documentation).
#[derive(Clone)]
pub struct Sdu {
    repr: Repr,
}

#[derive(Clone)]
enum Repr {
    /// The SDU in one buffer.
    One(PduBuf),
    /// The SDU in several buffers, laid end to end; `len` bytes in all.
    Parts { parts: Vec<PduBuf>, len: usize },
}

impl Sdu {
    /// The SDU made of `parts` laid end to end.
    pub fn gathered(mut parts: Vec<PduBuf>) -> Sdu {
        if parts.len() == 1 {
            if let Some(one) = parts.pop() {
                return Sdu::from(one);
            }
        }
        let len = parts.iter().map(|p| p.len()).sum();
        Sdu {
            repr: Repr::Parts { parts, len },
        }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::One(b) => b.len(),
            Repr::Parts { len, .. } => *len,
        }
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The buffers it lies in, in order (one for an SDU that was not
    /// fragmented).
    pub fn parts(&self) -> &[PduBuf] {
        match &self.repr {
            Repr::One(b) => std::slice::from_ref(b),
            Repr::Parts { parts, .. } => parts,
        }
    }

    /// The SDU in one buffer: as it is if it lies in one, else its parts
    /// copied once into a buffer with [`buf::HEADROOM`] in front (an SDU
    /// that goes on as a PDU of the DIF above gets its headers there).
    pub fn into_buf(self) -> PduBuf {
        match self.repr {
            Repr::One(b) => b,
            Repr::Parts { parts, len } => {
                let mut out = PduBuf::empty(buf::HEADROOM, len + buf::TAILROOM);
                for p in &parts {
                    out.extend_from_slice(p);
                }
                buf::count_copy();
                out
            }
        }
    }

    /// Its bytes as a `Vec`: [`PduBuf::into_vec`] if it lies in one
    /// buffer, a copy of its parts otherwise.
    pub fn into_vec(self) -> Vec<u8> {
        match self.repr {
            Repr::One(b) => b.into_vec(),
            Repr::Parts { .. } => self.to_vec(),
        }
    }

    /// A copy of its bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        for p in self.parts() {
            v.extend_from_slice(p);
        }
        v
    }
}

impl From<PduBuf> for Sdu {
    fn from(b: PduBuf) -> Sdu {
        Sdu { repr: Repr::One(b) }
    }
}

impl From<Vec<u8>> for Sdu {
    fn from(v: Vec<u8>) -> Sdu {
        Sdu::from(PduBuf::from(v))
    }
}

impl From<&[u8]> for Sdu {
    fn from(v: &[u8]) -> Sdu {
        Sdu::from(PduBuf::from(v))
    }
}

impl PartialEq for Sdu {
    fn eq(&self, other: &Sdu) -> bool {
        self.len() == other.len() && self.to_vec() == other.to_vec()
    }
}

impl Eq for Sdu {}

impl PartialEq<[u8]> for Sdu {
    fn eq(&self, other: &[u8]) -> bool {
        if self.len() != other.len() {
            return false;
        }
        let mut at = 0;
        self.parts().iter().all(|p| {
            let same = other[at..at + p.len()] == p[..];
            at += p.len();
            same
        })
    }
}

impl PartialEq<PduBuf> for Sdu {
    fn eq(&self, other: &PduBuf) -> bool {
        *self == other[..]
    }
}

impl PartialEq<&[u8]> for Sdu {
    fn eq(&self, other: &&[u8]) -> bool {
        *self == **other
    }
}

impl PartialEq<Vec<u8>> for Sdu {
    fn eq(&self, other: &Vec<u8>) -> bool {
        *self == other[..]
    }
}

impl<const N: usize> PartialEq<[u8; N]> for Sdu {
    fn eq(&self, other: &[u8; N]) -> bool {
        *self == other[..]
    }
}

impl fmt::Debug for Sdu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sdu")
            .field("len", &self.len())
            .field("parts", &self.parts().len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_read_as_one_sdu_and_copy_once_into_a_buffer() {
        let s = Sdu::gathered(vec![PduBuf::from(b"ab"), PduBuf::from(b"cde")]);
        assert_eq!(s.len(), 5);
        assert_eq!(s.parts().len(), 2);
        assert_eq!(s, *b"abcde");
        assert_ne!(s, *b"abcdf");
        assert_ne!(s, *b"abcd");
        let before = buf::stats();
        let b = s.into_buf();
        assert_eq!(buf::stats().copies - before.copies, 1);
        assert_eq!(b, *b"abcde");
        assert!(b.headroom() >= buf::HEADROOM);
    }

    #[test]
    fn one_buffer_stays_as_it_is() {
        let s = Sdu::gathered(vec![PduBuf::from(b"xyz")]);
        assert_eq!(s.parts().len(), 1);
        let before = buf::stats();
        assert_eq!(s.into_buf(), *b"xyz");
        assert_eq!(buf::stats().copies, before.copies);
    }
}
