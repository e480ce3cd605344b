//! Keys per N-1 flow and authenticated encryption of its frames.
//!
//! When a DIF encrypts, every frame on an N-1 flow is wrapped, outside the
//! rest of SDU protection (TTL, CRC), in one of two forms:
//!
//! ```text
//! clear:  [ 0x00 ][ frame ]
//! sealed: [ 0xAE ][ key id (4, BE) ][ sequence (8, BE) ][ AES-256-GCM(frame) ][ tag (16) ]
//! ```
//!
//! The header of a sealed frame is the AEAD's associated data; the nonce is
//! four zero bytes and the sequence number, which a sender never repeats
//! under one key (every key is fresh, its counter starts at 0). Only port
//! authentication travels in clear on a port that has keys (it proves
//! itself, and is how a restarted peer gets new ones); everything else
//! arrives sealed or is dropped. See [`PortCrypto::open`].
//!
//! **Keys** come from port authentication ([`crate::enrollment::auth`]
//! run on the port): each side's nonce on the wire is the public half of an
//! ephemeral X25519 key ([`ephemeral_public`]), so the proofs of the
//! authentication policy also authenticate the key exchange. Both sides
//! then derive, with HKDF-SHA256 over the shared secret salted by both
//! nonces ([`SessionKeys::derive`]), one key per direction and a key id.
//! A new handshake on an admitted port (after [`Rekey::bytes`] sealed
//! bytes or [`Rekey::after`] time) installs fresh keys; the receiver keeps
//! the previous [`RX_KEYS`] keys so frames in flight still open.
//!
//! **Replay**: each receive key has a sliding window of [`REPLAY_WINDOW`]
//! sequence numbers; a number seen before, or older than the window, is
//! dropped and counted.
//!
//! The crates are `ring` (AES-256-GCM), RustCrypto's `hkdf` and `sha2`
//! and dalek's `x25519-dalek`: audited, constant-time, widely used; this
//! module only frames, counts and chooses keys. `ring` rather than
//! RustCrypto's AEADs for speed: sealing and opening a 1400-byte frame
//! took 8 µs with RustCrypto's ChaCha20-Poly1305 on this project's test
//! machine, about 1 µs with `ring`'s AES-256-GCM (AES-NI, VAES and CLMUL;
//! without them it falls back to constant-time bitsliced AES).

use crate::buf::PduBuf;
use crate::time::Instant;
use hkdf::Hkdf;
use ring::aead::{Aad, LessSafeKey, Nonce as AeadNonce, UnboundKey, AES_256_GCM};
use sha2::Sha256;
use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;
use thiserror::Error;

/// First byte of a frame sent in clear on an encrypting DIF.
pub const CLEAR: u8 = 0x00;
/// First byte of a sealed frame.
pub const SEALED: u8 = 0xAE;
/// Bytes of a sealed frame's header (marker, key id, sequence).
pub const SEALED_HEADER: usize = 1 + 4 + 8;
/// Bytes of the authentication tag.
pub const TAG_LEN: usize = 16;
/// Most bytes encryption adds to a frame.
pub const OVERHEAD: usize = SEALED_HEADER + TAG_LEN;
/// Sequence numbers the replay window of a receive key covers.
pub const REPLAY_WINDOW: u64 = 4096;
/// Receive keys kept per port (the current one and those before it).
pub const RX_KEYS: usize = 3;
/// Name of the cipher suite, as `rinactl` shows it.
pub const SUITE: &str = "x25519-hkdf-sha256-aes256gcm";

const HKDF_INFO: &[u8] = b"rina sdup keys v2: x25519 hkdf-sha256 aes256gcm";

/// When a port's keys are replaced by a new handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rekey {
    /// After this many bytes sealed under one key.
    pub bytes: u64,
    /// After a key has been in use this long.
    pub after: Duration,
}

impl Default for Rekey {
    /// 1 GiB or 10 minutes, whichever comes first.
    fn default() -> Self {
        Rekey {
            bytes: 1 << 30,
            after: Duration::from_secs(600),
        }
    }
}

/// Why a key exchange gave no keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum KeyError {
    /// The peer's public key is a low-order point: the shared secret would
    /// be known to anyone.
    #[error("the peer's ephemeral key is not contributory (low-order point)")]
    NotContributory,
}

/// Why a received frame was not opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum OpenError {
    /// Empty, or shorter than a sealed frame's header and tag.
    #[error("frame too short for its encryption fields")]
    Truncated,
    /// The first byte is neither [`CLEAR`] nor [`SEALED`].
    #[error("unknown protection marker {0:#04x}")]
    BadMarker(u8),
    /// Sealed under a key id this port does not hold (yet, or any more).
    #[error("no key with id {0:#010x} on this port")]
    UnknownKey(u32),
    /// The tag does not verify: tampered with, or not sealed by the peer.
    #[error("authentication tag does not verify")]
    BadTag,
    /// A sequence number seen before, or older than the replay window.
    #[error("replayed or too old (sequence {0})")]
    Replayed(u64),
}

/// The ephemeral X25519 public key of `secret`: what an encrypting member
/// sends as its authentication nonce.
pub fn ephemeral_public(secret: &[u8; 32]) -> [u8; 32] {
    let s = x25519_dalek::StaticSecret::from(*secret);
    x25519_dalek::PublicKey::from(&s).to_bytes()
}

/// The keys one handshake gave one side of a port.
#[derive(Clone, PartialEq, Eq)]
pub struct SessionKeys {
    /// Identifies the pair on the wire (the same on both sides).
    pub id: u32,
    /// Seals what this side sends.
    pub tx: [u8; 32],
    /// Opens what the peer sends.
    pub rx: [u8; 32],
}

impl fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionKeys(id {:#010x}, <hidden>)", self.id)
    }
}

impl SessionKeys {
    /// Derives the keys of one handshake: `own` is this side's ephemeral
    /// secret, `initiator_nonce` and `responder_nonce` the two public keys
    /// as sent (the one that is not ours is the peer's), `initiator` says
    /// which side this is.
    pub fn derive(
        own: &[u8; 32],
        initiator_nonce: &[u8; 32],
        responder_nonce: &[u8; 32],
        initiator: bool,
    ) -> Result<SessionKeys, KeyError> {
        let peer = if initiator {
            responder_nonce
        } else {
            initiator_nonce
        };
        let shared = x25519_dalek::StaticSecret::from(*own)
            .diffie_hellman(&x25519_dalek::PublicKey::from(*peer));
        if !shared.was_contributory() {
            return Err(KeyError::NotContributory);
        }
        let salt = [&initiator_nonce[..], &responder_nonce[..]].concat();
        let hk = Hkdf::<Sha256>::new(Some(&salt), shared.as_bytes());
        let mut okm = [0u8; 68];
        hk.expand(HKDF_INFO, &mut okm)
            .expect("68 bytes is a valid HKDF-SHA256 length");
        let mut i2r = [0u8; 32];
        let mut r2i = [0u8; 32];
        i2r.copy_from_slice(&okm[..32]);
        r2i.copy_from_slice(&okm[32..64]);
        let id = u32::from_be_bytes([okm[64], okm[65], okm[66], okm[67]]);
        let (tx, rx) = if initiator { (i2r, r2i) } else { (r2i, i2r) };
        Ok(SessionKeys { id, tx, rx })
    }
}

/// Counters of one port's encryption.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CryptoCounters {
    /// Frames sealed.
    pub sealed: u64,
    /// Frames opened.
    pub opened: u64,
    /// Frames taken in clear (port authentication, enrollment before keys).
    pub clear_in: u64,
    /// Frames sent in clear.
    pub clear_out: u64,
    /// Frames dropped: the tag did not verify (tampered or forged).
    pub bad_tag: u64,
    /// Frames dropped: replayed or older than the replay window.
    pub replayed: u64,
    /// Frames dropped: sealed under a key this port does not hold.
    pub unknown_key: u64,
    /// Frames dropped: truncated or with an unknown marker.
    pub malformed: u64,
    /// Frames dropped: in clear where only sealed ones are taken.
    pub clear_refused: u64,
    /// Frames not sent: no key yet where only sealed ones may go.
    pub no_key_out: u64,
    /// Keys installed (the first and every rotation).
    pub keys_installed: u64,
}

impl CryptoCounters {
    /// Name and value of every counter.
    pub fn pairs(&self) -> [(&'static str, u64); 11] {
        [
            ("sealed", self.sealed),
            ("opened", self.opened),
            ("clear_in", self.clear_in),
            ("clear_out", self.clear_out),
            ("bad_tag", self.bad_tag),
            ("replayed", self.replayed),
            ("unknown_key", self.unknown_key),
            ("malformed", self.malformed),
            ("clear_refused", self.clear_refused),
            ("no_key_out", self.no_key_out),
            ("keys_installed", self.keys_installed),
        ]
    }

    /// Frames dropped on receipt for any reason.
    pub fn dropped(&self) -> u64 {
        self.bad_tag + self.replayed + self.unknown_key + self.malformed + self.clear_refused
    }
}

struct TxKey {
    id: u32,
    cipher: LessSafeKey,
    next_seq: u64,
    bytes: u64,
    since: Instant,
}

struct RxKey {
    id: u32,
    cipher: LessSafeKey,
    window: ReplayWindow,
}

/// Sequence numbers seen: the highest, and a bitmap of the
/// [`REPLAY_WINDOW`] numbers up to it.
#[derive(Clone)]
struct ReplayWindow {
    /// Highest sequence number accepted plus one (0: none yet).
    top: u64,
    bits: [u64; (REPLAY_WINDOW / 64) as usize],
}

impl ReplayWindow {
    fn new() -> Self {
        ReplayWindow {
            top: 0,
            bits: [0; (REPLAY_WINDOW / 64) as usize],
        }
    }

    fn slot(seq: u64) -> (usize, u64) {
        let i = seq % REPLAY_WINDOW;
        ((i / 64) as usize, 1u64 << (i % 64))
    }

    /// Whether `seq` is new (not seen, not older than the window).
    fn check(&self, seq: u64) -> bool {
        if seq >= self.top {
            return true;
        }
        if self.top - seq > REPLAY_WINDOW {
            return false;
        }
        let (w, b) = Self::slot(seq);
        self.bits[w] & b == 0
    }

    /// Records `seq`, which [`ReplayWindow::check`] accepted.
    fn mark(&mut self, seq: u64) {
        if seq >= self.top {
            let advance = seq + 1 - self.top;
            if advance >= REPLAY_WINDOW {
                self.bits = [0; (REPLAY_WINDOW / 64) as usize];
            } else {
                for s in self.top..=seq {
                    let (w, b) = Self::slot(s);
                    self.bits[w] &= !b;
                }
            }
            self.top = seq + 1;
        }
        let (w, b) = Self::slot(seq);
        self.bits[w] |= b;
    }
}

/// What [`PortCrypto::open`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened<'a> {
    /// A frame that came in clear (the caller decides whether it may).
    Clear(&'a [u8]),
    /// A frame that was sealed and is authentic and new.
    Sealed(Vec<u8>),
}

/// What [`PortCrypto::open_buf`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenedKind {
    /// The frame came in clear (the caller decides whether it may).
    Clear,
    /// The frame was sealed and is authentic and new.
    Sealed,
}

/// The encryption state of one N-1 port: the current send key, the recent
/// receive keys with their replay windows, and counters.
#[derive(Default)]
pub struct PortCrypto {
    tx: Option<TxKey>,
    rx: VecDeque<RxKey>,
    /// What happened on this port.
    pub counters: CryptoCounters,
}

impl fmt::Debug for PortCrypto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PortCrypto")
            .field("tx_key", &self.tx.as_ref().map(|k| k.id))
            .field("rx_keys", &self.rx.iter().map(|k| k.id).collect::<Vec<_>>())
            .field("counters", &self.counters)
            .finish()
    }
}

impl PortCrypto {
    /// A port with no keys yet.
    pub fn new() -> Self {
        PortCrypto::default()
    }

    /// Installs the keys of a completed handshake at `now`: they seal from
    /// now on, and open alongside the previous ones.
    pub fn install(&mut self, now: Instant, keys: &SessionKeys) {
        self.tx = Some(TxKey {
            id: keys.id,
            cipher: aes_key(&keys.tx),
            next_seq: 0,
            bytes: 0,
            since: now,
        });
        self.rx.retain(|k| k.id != keys.id);
        self.rx.push_front(RxKey {
            id: keys.id,
            cipher: aes_key(&keys.rx),
            window: ReplayWindow::new(),
        });
        self.rx.truncate(RX_KEYS);
        self.counters.keys_installed += 1;
    }

    /// Whether this port has a send key.
    pub fn has_keys(&self) -> bool {
        self.tx.is_some()
    }

    /// Id of the current send key.
    pub fn key_id(&self) -> Option<u32> {
        self.tx.as_ref().map(|k| k.id)
    }

    /// Whether the send key is due for rotation at `now` under `rekey`.
    pub fn rekey_due(&self, now: Instant, rekey: &Rekey) -> bool {
        self.tx.as_ref().is_some_and(|k| {
            k.bytes >= rekey.bytes
                || now.saturating_since(k.since) >= rekey.after
                || k.next_seq >= u64::MAX / 2
        })
    }

    /// When the send key is due for rotation by time, if there is one.
    pub fn rekey_at(&self, rekey: &Rekey) -> Option<Instant> {
        self.tx.as_ref().map(|k| k.since + rekey.after)
    }

    /// Wraps `frame` in clear (for port authentication).
    pub fn clear(&mut self, frame: &[u8]) -> Vec<u8> {
        let mut b = PduBuf::with_headroom(frame);
        self.clear_buf(&mut b);
        b.into_vec()
    }

    /// [`PortCrypto::clear`] where the frame lies: the marker goes into its
    /// room in front.
    pub fn clear_buf(&mut self, frame: &mut PduBuf) {
        self.counters.clear_out += 1;
        frame.push_front(&[CLEAR]);
    }

    /// Seals `frame` under the current key, or `None` (counted) without
    /// one.
    pub fn seal(&mut self, frame: &[u8]) -> Option<Vec<u8>> {
        let mut b = PduBuf::with_room(SEALED_HEADER, frame, TAG_LEN);
        self.seal_buf(&mut b).then(|| b.into_vec())
    }

    /// [`PortCrypto::seal`] where the frame lies: the header goes into its
    /// room in front, the body is encrypted in place and the tag appended.
    /// False (counted, the frame unchanged) without a key.
    pub fn seal_buf(&mut self, frame: &mut PduBuf) -> bool {
        let Some(k) = self.tx.as_mut() else {
            self.counters.no_key_out += 1;
            return false;
        };
        let seq = k.next_seq;
        k.next_seq += 1;
        k.bytes += frame.len() as u64;
        let head = frame.prepend(SEALED_HEADER);
        head[0] = SEALED;
        head[1..5].copy_from_slice(&k.id.to_be_bytes());
        head[5..].copy_from_slice(&seq.to_be_bytes());
        let (aad, body) = frame.split_at_mut(SEALED_HEADER);
        // Sealing fails only for inputs beyond AES-GCM's limit (64 GiB).
        let Ok(tag) = k
            .cipher
            .seal_in_place_separate_tag(nonce(seq), Aad::from(&*aad), body)
        else {
            frame.advance(SEALED_HEADER);
            return false;
        };
        frame.extend_from_slice(tag.as_ref());
        self.counters.sealed += 1;
        true
    }

    /// Unwraps a received frame: a clear one as it is, a sealed one
    /// decrypted if its key is held, its tag verifies and its sequence
    /// number is new. Every failure is counted. Never panics.
    pub fn open<'a>(&mut self, frame: &'a [u8]) -> Result<Opened<'a>, OpenError> {
        if let Some((&CLEAR, rest)) = frame.split_first() {
            self.counters.clear_in += 1;
            return Ok(Opened::Clear(rest));
        }
        let mut b = PduBuf::from(frame.to_vec());
        self.open_buf(&mut b)?;
        Ok(Opened::Sealed(b.into_vec()))
    }

    /// [`PortCrypto::open`] where the frame lies: the marker and header
    /// are dropped from the front, a sealed body is decrypted in place and
    /// its tag dropped from the end. On an error the frame is left
    /// unusable (it is to be dropped).
    pub fn open_buf(&mut self, frame: &mut PduBuf) -> Result<OpenedKind, OpenError> {
        let r = self.open_inner(frame);
        let c = &mut self.counters;
        match &r {
            Ok(OpenedKind::Clear) => c.clear_in += 1,
            Ok(OpenedKind::Sealed) => c.opened += 1,
            Err(OpenError::Truncated | OpenError::BadMarker(_)) => c.malformed += 1,
            Err(OpenError::UnknownKey(_)) => c.unknown_key += 1,
            Err(OpenError::BadTag) => c.bad_tag += 1,
            Err(OpenError::Replayed(_)) => c.replayed += 1,
        }
        r
    }

    fn open_inner(&mut self, frame: &mut PduBuf) -> Result<OpenedKind, OpenError> {
        match frame.first() {
            None => Err(OpenError::Truncated),
            Some(&CLEAR) => {
                frame.advance(1);
                Ok(OpenedKind::Clear)
            }
            Some(&SEALED) => {
                if frame.len() < OVERHEAD {
                    return Err(OpenError::Truncated);
                }
                let (head, body) = frame.split_at_mut(SEALED_HEADER);
                let id = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
                let mut s = [0u8; 8];
                s.copy_from_slice(&head[5..13]);
                let seq = u64::from_be_bytes(s);
                let key = self
                    .rx
                    .iter_mut()
                    .find(|k| k.id == id)
                    .ok_or(OpenError::UnknownKey(id))?;
                if !key.window.check(seq) {
                    return Err(OpenError::Replayed(seq));
                }
                let len = key
                    .cipher
                    .open_in_place(nonce(seq), Aad::from(&*head), body)
                    .map_err(|_| OpenError::BadTag)?
                    .len();
                key.window.mark(seq);
                frame.advance(SEALED_HEADER);
                frame.truncate(len);
                Ok(OpenedKind::Sealed)
            }
            Some(&m) => Err(OpenError::BadMarker(m)),
        }
    }
}

fn nonce(seq: u64) -> AeadNonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&seq.to_be_bytes());
    AeadNonce::assume_unique_for_key(n)
}

/// An AES-256-GCM key from 32 bytes (the only length it is given).
fn aes_key(bytes: &[u8; 32]) -> LessSafeKey {
    let k = UnboundKey::new(&AES_256_GCM, bytes).expect("AES-256-GCM takes a 32-byte key");
    LessSafeKey::new(k)
}

#[cfg(test)]
mod tests;
