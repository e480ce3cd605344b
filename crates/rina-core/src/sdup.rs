//! SDU protection: what a DIF does to a PDU between its RMT and an N-1 flow.
//!
//! Per DIF, three optional protections, applied on the way out in this order
//! and undone in the reverse order on the way in:
//!
//! 1. **Encryption** by a [`Cipher`]: the PDU is sealed in place and may grow
//!    (a nonce in front, a tag behind). [`NullCipher`] does nothing. The
//!    encryption of N-1 flows with keys per flow (AES-256-GCM, keys
//!    from an X25519 exchange at port authentication, replay windows,
//!    rotation) is [`aead`], applied per port around the whole protected
//!    frame after the RMT has chosen the port, since this object is shared
//!    by every port of a DIF.
//! 2. **Hop limit**: one TTL byte in front of the (sealed) PDU. The origin
//!    writes the DIF's initial TTL (default [`DEFAULT_TTL`]); a relaying RMT
//!    reads it, asks [`Sdup::next_ttl`], and drops the PDU when that says
//!    `None`. The TTL is outside the encryption so relays can read it without
//!    the key.
//! 3. **Error check**: a CRC-32 (IEEE, as `crc32fast` computes it) of
//!    everything before it, appended in network byte order.
//!
//! ```text
//! [ TTL (1) ][ PDU, sealed by the cipher (len + cipher overhead) ][ CRC-32 BE (4) ]
//! ```
//!
//! This follows IRATI's layout (`kernel/sdup.c`), but IRATI appends
//! `crc32_le` in host byte order, so a CRC-protected DIF is not
//! wire-compatible with IRATI; a TTL-only DIF is.
//!
//! [`Sdup`] is a pure function object: no state changes on protect or
//! unprotect, so one value can serve every N-1 port of a DIF. Counters of
//! what was dropped and why are kept by the caller, from the errors.

pub mod aead;

use std::borrow::Cow;
use std::fmt;
use thiserror::Error;

/// The initial TTL when the configuration does not say (IRATI's
/// `DEFAULT_TTL_VALUE`).
pub const DEFAULT_TTL: u8 = 64;

/// Bytes of the TTL field.
pub const TTL_LEN: usize = 1;

/// Bytes of the CRC-32 field.
pub const CRC_LEN: usize = 4;

/// Why a frame could not be unprotected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SdupError {
    /// The frame is too short to hold the protection fields.
    #[error("frame too short for its SDU protection fields")]
    Truncated,
    /// The CRC carried by the frame (`found`) is not the one computed over
    /// the frame's bytes (`expected`).
    #[error("bad CRC-32: computed {expected:#010x}, frame carries {found:#010x}")]
    BadCrc { expected: u32, found: u32 },
    /// The frame arrived with a TTL of 0: someone forwarded it past its hop
    /// limit.
    #[error("TTL expired")]
    TtlExpired,
    /// The cipher could not open the PDU (bad tag, wrong key, malformed).
    #[error("cipher: {0}")]
    Cipher(String),
}

/// An encryption policy. Implementations seal a PDU in place (they may grow
/// it, by at most [`Cipher::overhead`] bytes) and open what they sealed.
/// AES-GCM, ChaCha20-Poly1305 and the like plug in here; [`NullCipher`] is
/// the no-op used when a DIF has no encryption.
pub trait Cipher: Send + Sync {
    /// Encrypts `pdu` in place; it may grow by up to [`Cipher::overhead`].
    fn seal(&self, pdu: &mut Vec<u8>);
    /// Decrypts what [`Cipher::seal`] produced, in place, or says why not.
    fn open(&self, pdu: &mut Vec<u8>) -> Result<(), SdupError>;
    /// The most bytes [`Cipher::seal`] adds to a PDU.
    fn overhead(&self) -> usize;
    /// True when seal and open leave the bytes as they are, so
    /// [`Sdup::unprotect`] can borrow the PDU instead of copying it.
    fn is_identity(&self) -> bool {
        false
    }
}

/// No encryption.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NullCipher;

impl Cipher for NullCipher {
    fn seal(&self, _pdu: &mut Vec<u8>) {}
    fn open(&self, _pdu: &mut Vec<u8>) -> Result<(), SdupError> {
        Ok(())
    }
    fn overhead(&self) -> usize {
        0
    }
    fn is_identity(&self) -> bool {
        true
    }
}

/// The SDU protection of a DIF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SdupConfig {
    /// Initial TTL written by the origin of a PDU, or `None` for no TTL field
    /// (and no hop limit). Must be at least 1 to be useful: a frame carrying
    /// TTL 0 is rejected by its receiver.
    pub ttl: Option<u8>,
    /// Append a CRC-32 to every frame and check it on receipt.
    pub crc: bool,
}

impl Default for SdupConfig {
    /// TTL [`DEFAULT_TTL`], no CRC.
    fn default() -> Self {
        SdupConfig {
            ttl: Some(DEFAULT_TTL),
            crc: false,
        }
    }
}

/// A received frame with its protection removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unprotected<'a> {
    /// The TTL the frame carried (at least 1), or `None` if the DIF has no TTL.
    pub ttl: Option<u8>,
    /// The PDU: borrowed from the frame when there is no cipher, owned
    /// (decrypted) otherwise.
    pub pdu: Cow<'a, [u8]>,
}

/// Protects PDUs on the way to an N-1 flow and unprotects them on the way in.
pub struct Sdup {
    cfg: SdupConfig,
    cipher: Box<dyn Cipher>,
    /// Whether the cipher leaves bytes as they are (asked once, not per
    /// frame).
    identity: bool,
}

impl fmt::Debug for Sdup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sdup")
            .field("cfg", &self.cfg)
            .field("cipher_overhead", &self.cipher.overhead())
            .field("cipher_identity", &self.cipher.is_identity())
            .finish()
    }
}

impl Sdup {
    /// SDU protection with `cfg` and `cipher`.
    pub fn new(cfg: SdupConfig, cipher: Box<dyn Cipher>) -> Self {
        let identity = cipher.is_identity();
        Sdup {
            cfg,
            cipher,
            identity,
        }
    }

    /// SDU protection with `cfg` and no encryption.
    pub fn without_cipher(cfg: SdupConfig) -> Self {
        Sdup::new(cfg, Box::new(NullCipher))
    }

    /// The configuration.
    pub fn config(&self) -> &SdupConfig {
        &self.cfg
    }

    /// The TTL an origin writes, or `None` if the DIF has no TTL.
    pub fn initial_ttl(&self) -> Option<u8> {
        self.cfg.ttl
    }

    /// Bytes added in front of the PDU (the TTL).
    pub fn header_len(&self) -> usize {
        if self.cfg.ttl.is_some() {
            TTL_LEN
        } else {
            0
        }
    }

    /// Bytes added after the PDU, at most (cipher overhead and CRC).
    pub fn trailer_len(&self) -> usize {
        self.cipher.overhead() + if self.cfg.crc { CRC_LEN } else { 0 }
    }

    /// Most bytes protection adds to a PDU: a DIF's max PDU size is the N-1
    /// flow's max SDU size less this.
    pub fn overhead(&self) -> usize {
        self.header_len() + self.trailer_len()
    }

    /// The TTL a relay forwards a frame with, having received it with `ttl`;
    /// `None` means the hop limit is exhausted and the PDU must be dropped.
    pub fn next_ttl(ttl: u8) -> Option<u8> {
        if ttl <= 1 {
            None
        } else {
            Some(ttl - 1)
        }
    }

    /// Appends the protected frame of `pdu` to `out` (the CRC covers only
    /// what this call appends). `ttl` is written if the DIF has a TTL and
    /// ignored otherwise. Copies `pdu` once; with a cipher, twice.
    pub fn protect(&self, pdu: &[u8], ttl: u8, out: &mut Vec<u8>) {
        let start = out.len();
        out.reserve(self.overhead() + pdu.len());
        if self.cfg.ttl.is_some() {
            out.push(ttl);
        }
        if self.identity {
            out.extend_from_slice(pdu);
        } else {
            let mut sealed = pdu.to_vec();
            self.cipher.seal(&mut sealed);
            out.extend_from_slice(&sealed);
        }
        self.append_crc(out, start);
    }

    /// Turns `buf`, which holds exactly a PDU, into its protected frame. The
    /// TTL is inserted in front (a move of the PDU by one byte); use
    /// [`Sdup::protect_in_headroom`] to avoid even that.
    pub fn protect_in_place(&self, buf: &mut Vec<u8>, ttl: u8) {
        self.cipher.seal(buf);
        if self.cfg.ttl.is_some() {
            buf.insert(0, ttl);
        }
        self.append_crc(buf, 0);
    }

    /// Protects the PDU in `pdu` where it lies: the TTL goes into its room
    /// in front and the CRC after it; only a cipher copies.
    pub fn protect_buf(&self, pdu: &mut crate::buf::PduBuf, ttl: u8) {
        let (buf, head) = pdu.parts_mut();
        *head = self.protect_in_headroom(buf, *head, ttl);
    }

    /// Protects the PDU `buf[start..]`, writing the TTL into the headroom
    /// byte `buf[start - 1]` when there is one, and appending the CRC.
    /// Bytes before the frame are left alone. Returns the offset at which the
    /// frame now starts (`start - 1` with a TTL and headroom, `start`
    /// otherwise). Without a cipher nothing is copied.
    pub fn protect_in_headroom(&self, buf: &mut Vec<u8>, start: usize, ttl: u8) -> usize {
        let mut start = start.min(buf.len());
        if !self.identity {
            let mut pdu = buf.split_off(start);
            self.cipher.seal(&mut pdu);
            buf.extend_from_slice(&pdu);
        }
        if self.cfg.ttl.is_some() {
            if start > 0 {
                start -= 1;
                buf[start] = ttl;
            } else {
                buf.insert(0, ttl);
            }
        }
        self.append_crc(buf, start);
        start
    }

    fn append_crc(&self, buf: &mut Vec<u8>, start: usize) {
        if self.cfg.crc {
            let crc = crc32fast::hash(&buf[start..]);
            buf.extend_from_slice(&crc.to_be_bytes());
        }
    }

    /// [`Sdup::unprotect`] where the frame lies: the TTL is dropped from
    /// its front and the CRC from its end, so the frame becomes the PDU
    /// (a cipher other than the identity decrypts into a new buffer).
    /// Returns the TTL the frame carried.
    pub fn unprotect_buf(&self, frame: &mut crate::buf::PduBuf) -> Result<Option<u8>, SdupError> {
        if self.identity {
            // What `unprotect` checks, in its order, with the frame
            // trimmed where it lies.
            let mut len = frame.len();
            if self.cfg.crc {
                len = self.check_crc(frame)?.len();
            }
            let ttl = match self.cfg.ttl {
                None => None,
                Some(_) => match frame[..len].first() {
                    None => return Err(SdupError::Truncated),
                    Some(0) => return Err(SdupError::TtlExpired),
                    Some(&t) => Some(t),
                },
            };
            frame.truncate(len);
            frame.advance(usize::from(ttl.is_some()));
            return Ok(ttl);
        }
        let (ttl, pdu) = {
            let un = self.unprotect(frame)?;
            match un.pdu {
                Cow::Borrowed(p) => (un.ttl, Err(p.len())),
                Cow::Owned(v) => (un.ttl, Ok(v)),
            }
        };
        match pdu {
            Err(len) => {
                frame.advance(usize::from(ttl.is_some()));
                frame.truncate(len);
            }
            Ok(v) => *frame = v.into(),
        }
        Ok(ttl)
    }

    /// Where the PDU of a frame with its CRC stands in clear after the TTL
    /// (a CRC and no cipher), the offset of the PDU: link padding after
    /// the CRC can then be found from the PDU's own length. `None` where
    /// there is no CRC to find, or the PDU is not in clear.
    pub fn clear_pdu_before_crc(&self) -> Option<usize> {
        (self.cfg.crc && self.identity).then_some(usize::from(self.cfg.ttl.is_some()))
    }

    /// The frame without its CRC, if the CRC is right.
    fn check_crc<'a>(&self, frame: &'a [u8]) -> Result<&'a [u8], SdupError> {
        let split = frame
            .len()
            .checked_sub(CRC_LEN)
            .ok_or(SdupError::Truncated)?;
        let (data, tail) = frame.split_at(split);
        let found = u32::from_be_bytes([tail[0], tail[1], tail[2], tail[3]]);
        let expected = crc32fast::hash(data);
        if found != expected {
            return Err(SdupError::BadCrc { expected, found });
        }
        Ok(data)
    }

    /// Checks and strips the protection of a received frame: CRC, then TTL,
    /// then the cipher. Never panics, whatever the bytes.
    pub fn unprotect<'a>(&self, frame: &'a [u8]) -> Result<Unprotected<'a>, SdupError> {
        let mut body = frame;
        if self.cfg.crc {
            body = self.check_crc(body)?;
        }
        let ttl = match self.cfg.ttl {
            None => None,
            Some(_) => {
                let (&t, rest) = body.split_first().ok_or(SdupError::Truncated)?;
                if t == 0 {
                    return Err(SdupError::TtlExpired);
                }
                body = rest;
                Some(t)
            }
        };
        let pdu = if self.identity {
            Cow::Borrowed(body)
        } else {
            let mut pdu = body.to_vec();
            self.cipher.open(&mut pdu)?;
            Cow::Owned(pdu)
        };
        Ok(Unprotected { ttl, pdu })
    }
}

#[cfg(test)]
mod tests;
