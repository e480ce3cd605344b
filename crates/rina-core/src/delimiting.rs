//! Delimiting: fragmentation of SDUs larger than a PDU, and their reassembly.
//!
//! An application may write SDUs up to the DIF's maximum SDU size (64 KiB or
//! more) over a DIF whose largest PDU is much smaller (1400 bytes, say). The
//! sender cuts each SDU into pieces that fit the user-data field of a DT PDU;
//! the receiver glues them back together. The format is IRATI's default
//! delimiting policy (`kernel/delim-ps-default.c`): the user data of every DT
//! PDU starts with one delimiter byte,
//!
//! | byte | meaning |
//! | --- | --- |
//! | `0x07` | a complete SDU |
//! | `0x05` | the first fragment of an SDU |
//! | `0x04` | a middle fragment |
//! | `0x06` | the last fragment |
//!
//! (bit `0x01` = "holds the start of the SDU", `0x02` = "holds the end",
//! `0x04` = "no length field"). Any other value — IRATI's "SDU sequence number
//! present" bit `0x08` included — is malformed. A payload that is only the
//! delimiter byte, with no data, is malformed too: [`fragment`] never makes one.
//!
//! Sending is a pure function: [`fragments`] yields `(delimiter, piece)` pairs
//! so the caller can put the delimiter byte and the piece straight into the
//! PDU buffer it is building, and [`fragment`] collects ready-made payloads
//! for when copying does not matter.
//!
//! Receiving is the [`Reassembler`], one per flow, fed by DTP in sequence
//! order. On a loss-tolerant flow DTP may skip sequence numbers; the
//! reassembler then throws away whatever SDU it had partly assembled (it can
//! never be completed), ignores middle and last fragments whose first it never
//! saw, and discards an incomplete SDU that has waited longer than its timeout
//! (the driver calls [`Reassembler::handle_timeout`] when
//! [`Reassembler::poll_timeout`] says so). It never delivers an SDU that is
//! not exactly one the peer sent, and never holds more than `max_sdu` bytes.

use crate::buf::PduBuf;
use crate::sdu::Sdu;
use crate::time::Instant;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;
use thiserror::Error;

/// Delimiter byte of a complete (unfragmented) SDU.
pub const COMPLETE: u8 = 0x07;
/// Delimiter byte of the first fragment of an SDU.
pub const FIRST: u8 = 0x05;
/// Delimiter byte of a middle fragment of an SDU.
pub const MIDDLE: u8 = 0x04;
/// Delimiter byte of the last fragment of an SDU.
pub const LAST: u8 = 0x06;

/// Bytes the delimiter adds to every PDU's user data.
pub const DELIMITER_LEN: usize = 1;

/// Which part of an SDU a PDU's user data holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Delimiter {
    /// The whole SDU.
    Complete,
    /// The first fragment.
    First,
    /// A fragment that is neither first nor last.
    Middle,
    /// The last fragment.
    Last,
}

impl Delimiter {
    /// The byte on the wire.
    pub const fn to_byte(self) -> u8 {
        match self {
            Delimiter::Complete => COMPLETE,
            Delimiter::First => FIRST,
            Delimiter::Middle => MIDDLE,
            Delimiter::Last => LAST,
        }
    }

    /// The delimiter a wire byte stands for, if any.
    pub const fn from_byte(b: u8) -> Option<Delimiter> {
        match b {
            COMPLETE => Some(Delimiter::Complete),
            FIRST => Some(Delimiter::First),
            MIDDLE => Some(Delimiter::Middle),
            LAST => Some(Delimiter::Last),
            _ => None,
        }
    }
}

/// Splits a PDU's user data into its delimiter and its piece of SDU.
pub fn parse(payload: &[u8]) -> Result<(Delimiter, &[u8]), DelimitError> {
    match payload {
        [] => Err(DelimitError::Malformed { byte: None }),
        [b, rest @ ..] => match Delimiter::from_byte(*b) {
            None => Err(DelimitError::Malformed { byte: Some(*b) }),
            Some(_) if rest.is_empty() => Err(DelimitError::Malformed { byte: None }),
            Some(d) => Ok((d, rest)),
        },
    }
}

/// Why fragmenting or reassembling failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DelimitError {
    /// An SDU must hold at least one byte.
    #[error("empty SDU")]
    EmptySdu,
    /// The SDU is larger than the flow's maximum SDU size.
    #[error("SDU of {size} bytes is larger than the maximum of {max}")]
    SduTooLarge { size: usize, max: usize },
    /// The PDU user-data budget cannot hold a delimiter and one byte of data.
    #[error("a PDU payload of {max_payload} bytes cannot carry a fragment (need at least 2)")]
    PayloadTooSmall { max_payload: usize },
    /// The payload is empty, has no data after the delimiter, or the
    /// delimiter byte (`byte`, if there was one) is not a known value.
    #[error("malformed delimiter {byte:02x?}")]
    Malformed { byte: Option<u8> },
    /// Reassembling would exceed the maximum SDU size; the partial SDU was
    /// discarded. `size` is what the SDU would have grown to.
    #[error("reassembled SDU would be {size} bytes, more than the maximum of {max}; discarded")]
    Oversize { size: usize, max: usize },
}

/// How many PDUs an SDU of `len` bytes takes with `max_payload` bytes of
/// user data per PDU (`max_payload` >= 2).
pub fn fragment_count(len: usize, max_payload: usize) -> usize {
    let piece = max_payload.saturating_sub(DELIMITER_LEN).max(1);
    len.div_ceil(piece)
}

/// Where the fragments of an SDU of a given length lie: `(delimiter, at,
/// len)` triples in order, for an SDU that is not a slice
/// ([`crate::buf::SduSource`]). Each PDU's user data is the delimiter byte
/// followed by the piece, at most `max_payload` bytes in all.
#[derive(Debug, Clone)]
pub struct Spans {
    at: usize,
    len: usize,
    piece: usize,
}

impl Iterator for Spans {
    type Item = (Delimiter, usize, usize);

    fn next(&mut self) -> Option<Self::Item> {
        if self.at >= self.len {
            return None;
        }
        let at = self.at;
        let n = self.piece.min(self.len - at);
        self.at += n;
        let d = match (at == 0, self.at == self.len) {
            (true, true) => Delimiter::Complete,
            (true, false) => Delimiter::First,
            (false, false) => Delimiter::Middle,
            (false, true) => Delimiter::Last,
        };
        Some((d, at, n))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = (self.len - self.at).div_ceil(self.piece);
        (n, Some(n))
    }
}

impl ExactSizeIterator for Spans {}

/// The fragments of an SDU: `(delimiter, piece)` pairs in order. Each PDU's
/// user data is the delimiter byte followed by the piece, at most
/// `max_payload` bytes in all.
#[derive(Debug, Clone)]
pub struct Fragments<'a> {
    sdu: &'a [u8],
    spans: Spans,
}

impl<'a> Iterator for Fragments<'a> {
    type Item = (Delimiter, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let (d, at, n) = self.spans.next()?;
        Some((d, &self.sdu[at..at + n]))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.spans.size_hint()
    }
}

impl ExactSizeIterator for Fragments<'_> {}

/// Cuts `sdu` into fragments whose user data (delimiter included) is at most
/// `max_payload` bytes. `max_sdu` is the flow's largest SDU.
pub fn fragments(
    sdu: &[u8],
    max_sdu: usize,
    max_payload: usize,
) -> Result<Fragments<'_>, DelimitError> {
    Ok(Fragments {
        sdu,
        spans: spans(sdu.len(), max_sdu, max_payload)?,
    })
}

/// [`fragments`] of an SDU of `len` bytes, as spans.
pub fn spans(len: usize, max_sdu: usize, max_payload: usize) -> Result<Spans, DelimitError> {
    if len == 0 {
        return Err(DelimitError::EmptySdu);
    }
    if len > max_sdu {
        return Err(DelimitError::SduTooLarge {
            size: len,
            max: max_sdu,
        });
    }
    if max_payload < DELIMITER_LEN + 1 {
        return Err(DelimitError::PayloadTooSmall { max_payload });
    }
    Ok(Spans {
        at: 0,
        len,
        piece: max_payload - DELIMITER_LEN,
    })
}

/// Cuts `sdu` into PDU payloads (delimiter byte + piece, at most
/// `max_payload` bytes each) and appends them to `out`. Returns how many were
/// appended. On error nothing is appended.
pub fn fragment(
    sdu: &[u8],
    max_sdu: usize,
    max_payload: usize,
    out: &mut Vec<Vec<u8>>,
) -> Result<usize, DelimitError> {
    let frags = fragments(sdu, max_sdu, max_payload)?;
    let n = frags.len();
    out.reserve(n);
    for (d, piece) in frags {
        let mut p = Vec::with_capacity(DELIMITER_LEN + piece.len());
        p.push(d.to_byte());
        p.extend_from_slice(piece);
        out.push(p);
    }
    Ok(n)
}

/// Reassembly counters of one flow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// SDUs delivered (complete ones and reassembled ones).
    pub sdus_complete: u64,
    /// PDU payloads pushed in.
    pub fragments_in: u64,
    /// Partial SDUs discarded because a sequence number was skipped.
    pub discarded_gap: u64,
    /// Partial SDUs discarded because they waited longer than the timeout.
    pub discarded_timeout: u64,
    /// Partial or complete SDUs discarded for exceeding the maximum SDU size.
    pub discarded_oversize: u64,
    /// Partial SDUs discarded because a new SDU began before they ended
    /// (with no sequence gap: a confused sender), or a malformed payload
    /// broke them.
    pub discarded_interrupted: u64,
    /// Middle or last fragments dropped because their first was never seen
    /// (lost, timed out or discarded).
    pub discarded_orphan: u64,
    /// Payloads that were empty or had an unknown delimiter.
    pub malformed: u64,
}

impl Counters {
    /// The counters by name, for listings.
    pub fn to_map(&self) -> BTreeMap<String, u64> {
        [
            ("sdus_complete", self.sdus_complete),
            ("fragments_in", self.fragments_in),
            ("discarded_gap", self.discarded_gap),
            ("discarded_timeout", self.discarded_timeout),
            ("discarded_oversize", self.discarded_oversize),
            ("discarded_interrupted", self.discarded_interrupted),
            ("discarded_orphan", self.discarded_orphan),
            ("malformed", self.malformed),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// An SDU being put together.
#[derive(Debug)]
struct Partial {
    held: Held,
    started: Instant,
}

/// The fragments of an SDU received so far: first the fragments' own
/// buffers, each past its delimiter (fragments handed over in buffers),
/// then the bytes of the rest copied into one buffer (fragments handed
/// over as slices, or buffers past the bound on what the parts may cost).
#[derive(Debug, Default)]
struct Held {
    parts: Vec<PduBuf>,
    /// Bytes in `parts`, and what their buffers take in all.
    parts_len: usize,
    parts_cap: usize,
    rest: Vec<u8>,
}

impl Held {
    fn len(&self) -> usize {
        self.parts_len + self.rest.len()
    }

    /// Appends a copy of `data`, growing geometrically but never past
    /// `max_sdu` (the caller checked that the SDU stays within it).
    fn extend_from_slice(&mut self, data: &[u8], max_sdu: usize) {
        let v = &mut self.rest;
        let size = v.len() + data.len();
        if v.capacity() < size {
            let want = (size * 2).min(max_sdu).max(size);
            v.reserve_exact(want - v.len());
        }
        v.extend_from_slice(data);
    }

    /// Appends the fragment in `b` without a copy, unless the buffers
    /// held would then take more than `bound` bytes (many tiny
    /// fragments): then it, and the rest of the SDU, is copied.
    fn push_buf(&mut self, b: PduBuf, max_sdu: usize, bound: usize) {
        if self.rest.is_empty() && self.parts_cap + b.capacity() <= bound {
            self.parts_len += b.len();
            self.parts_cap += b.capacity();
            self.parts.push(b);
        } else {
            self.extend_from_slice(&b, max_sdu - self.parts_len);
        }
    }

    fn into_vec(self) -> Vec<u8> {
        if self.parts.is_empty() {
            return self.rest;
        }
        let mut v = Vec::with_capacity(self.len());
        for p in &self.parts {
            v.extend_from_slice(p);
        }
        v.extend_from_slice(&self.rest);
        v
    }

    fn into_sdu(self) -> Sdu {
        let mut parts = self.parts;
        if !self.rest.is_empty() {
            parts.push(PduBuf::from(self.rest));
        }
        Sdu::gathered(parts)
    }
}

/// What a fragment that was accepted does to the SDU being put together;
/// its data are the payload past the delimiter.
enum Piece {
    /// It is a whole SDU.
    Whole,
    /// It starts an SDU.
    First,
    /// It continues the SDU, and ends it if `last`.
    More { last: bool },
}

/// Reassembles the SDUs of one flow from its PDUs' user data.
#[derive(Debug)]
pub struct Reassembler {
    max_sdu: usize,
    timeout: Duration,
    last_seq: Option<u64>,
    partial: Option<Partial>,
    counters: Counters,
    /// The sum of the discard counters and `malformed`, kept as they grow.
    discarded: u64,
}

impl Reassembler {
    /// A reassembler for SDUs of at most `max_sdu` bytes that discards an
    /// incomplete SDU `timeout` after its first fragment arrived.
    pub fn new(max_sdu: usize, timeout: Duration) -> Self {
        Reassembler {
            max_sdu,
            timeout,
            last_seq: None,
            partial: None,
            counters: Counters::default(),
            discarded: 0,
        }
    }

    /// The largest SDU this reassembler builds.
    pub fn max_sdu(&self) -> usize {
        self.max_sdu
    }

    /// How long an incomplete SDU may wait for its remaining fragments.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Payloads and partial SDUs thrown away so far, for any reason: the
    /// sum of the `discarded_*` counters and `malformed`.
    pub fn discarded(&self) -> u64 {
        self.discarded
    }

    /// Bytes of the SDU being assembled (0 if none).
    pub fn partial_len(&self) -> usize {
        self.partial.as_ref().map_or(0, |p| p.held.len())
    }

    /// Forgets the partial SDU and the last sequence number (flow reset),
    /// without counting anything.
    pub fn clear(&mut self) {
        self.partial = None;
        self.last_seq = None;
    }

    /// When [`Reassembler::handle_timeout`] should next be called, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.partial.as_ref().map(|p| p.started + self.timeout)
    }

    /// Discards the partial SDU if its first fragment arrived `timeout` or
    /// more before `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(deadline) = self.poll_timeout() {
            if now >= deadline {
                self.partial = None;
                self.counters.discarded_timeout += 1;
                self.discarded += 1;
            }
        }
    }

    /// Takes the user data of the DT PDU with sequence number `seq`, handed
    /// over by DTP in sequence order, and returns the SDU it completes, if
    /// any. Losses (skipped sequence numbers) are not errors: they are
    /// counted and what they spoil is dropped. Errors are for payloads that
    /// are malformed and for SDUs that grow beyond the maximum; either way the
    /// partial SDU, if any, is gone.
    pub fn push(
        &mut self,
        now: Instant,
        seq: u64,
        payload: &[u8],
    ) -> Result<Option<Vec<u8>>, DelimitError> {
        self.push_ref(now, seq, payload)
            .map(|o| o.map(Cow::into_owned))
    }

    /// Like [`Reassembler::push`], for a fragment in a buffer of its own,
    /// which is kept rather than copied: a complete (unfragmented) SDU
    /// comes back in that same buffer, past its delimiter, and a
    /// reassembled one as its fragments' buffers ([`Sdu`]). Should tiny
    /// fragments make the buffers held cost more than twice the largest
    /// SDU, the rest of that SDU is copied into one buffer instead.
    pub fn push_buf(
        &mut self,
        now: Instant,
        seq: u64,
        mut payload: PduBuf,
    ) -> Result<Option<Sdu>, DelimitError> {
        let Some(piece) = self.accept(now, seq, &payload)? else {
            return Ok(None);
        };
        payload.advance(DELIMITER_LEN);
        match piece {
            Piece::Whole => Ok(Some(Sdu::from(payload))),
            Piece::First => {
                let mut held = Held::default();
                held.push_buf(payload, self.max_sdu, usize::MAX);
                self.partial = Some(Partial { held, started: now });
                Ok(None)
            }
            Piece::More { last } => {
                let bound = 2 * self.max_sdu + crate::buf::CLASSES[1];
                let Some(p) = self.partial.as_mut() else {
                    return Ok(None);
                };
                p.held.push_buf(payload, self.max_sdu, bound);
                if !last {
                    return Ok(None);
                }
                Ok(self.partial.take().map(|p| p.held.into_sdu()))
            }
        }
    }

    /// [`Reassembler::push_buf`] of the common fragment: a whole SDU in
    /// one PDU while no SDU is being put together. It comes back in
    /// `payload`'s buffer, past its delimiter, counted as `push_buf` would
    /// count it; with nothing partial there is no timeout to run and no
    /// gap that could spoil anything. Any other fragment is handed back
    /// untouched (`Err`), for [`Reassembler::push_buf`].
    #[inline]
    pub fn push_whole(&mut self, seq: u64, mut payload: PduBuf) -> Result<Sdu, PduBuf> {
        let whole = self.partial.is_none()
            && payload.len() > DELIMITER_LEN
            && payload.len() - DELIMITER_LEN <= self.max_sdu
            && payload[0] == COMPLETE;
        if !whole {
            return Err(payload);
        }
        self.counters.fragments_in += 1;
        self.counters.sdus_complete += 1;
        self.last_seq = Some(seq);
        payload.advance(DELIMITER_LEN);
        Ok(Sdu::from(payload))
    }

    /// Like [`Reassembler::push`], but a complete (unfragmented) SDU is
    /// returned as a slice of `payload` instead of a copy.
    pub fn push_ref<'a>(
        &mut self,
        now: Instant,
        seq: u64,
        payload: &'a [u8],
    ) -> Result<Option<Cow<'a, [u8]>>, DelimitError> {
        let Some(piece) = self.accept(now, seq, payload)? else {
            return Ok(None);
        };
        let data = &payload[DELIMITER_LEN..];
        match piece {
            Piece::Whole => Ok(Some(Cow::Borrowed(data))),
            Piece::First => {
                self.partial = Some(Partial {
                    held: Held {
                        rest: data.to_vec(),
                        ..Held::default()
                    },
                    started: now,
                });
                Ok(None)
            }
            Piece::More { last } => {
                let Some(p) = self.partial.as_mut() else {
                    return Ok(None);
                };
                p.held.extend_from_slice(data, self.max_sdu);
                if !last {
                    return Ok(None);
                }
                Ok(self.partial.take().map(|p| Cow::Owned(p.held.into_vec())))
            }
        }
    }

    /// Takes in the fragment `payload` with sequence number `seq`: counts
    /// it, drops what a gap or a malformed or oversized fragment spoils,
    /// and says what the fragment does (`None`: nothing, an orphan).
    fn accept(
        &mut self,
        now: Instant,
        seq: u64,
        payload: &[u8],
    ) -> Result<Option<Piece>, DelimitError> {
        self.counters.fragments_in += 1;
        self.handle_timeout(now);
        let gap = self.last_seq.is_some_and(|l| l.wrapping_add(1) != seq);
        self.last_seq = Some(seq);
        if gap && self.partial.take().is_some() {
            self.counters.discarded_gap += 1;
            self.discarded += 1;
        }
        let (delim, data) = match parse(payload) {
            Ok(x) => x,
            Err(e) => {
                self.counters.malformed += 1;
                self.discarded += 1;
                // The malformed PDU held a piece we will never have.
                if self.partial.take().is_some() {
                    self.counters.discarded_interrupted += 1;
                    self.discarded += 1;
                }
                return Err(e);
            }
        };
        match delim {
            Delimiter::Complete | Delimiter::First => {
                if self.partial.take().is_some() {
                    self.counters.discarded_interrupted += 1;
                    self.discarded += 1;
                }
                if data.len() > self.max_sdu {
                    return Err(self.oversize(data.len()));
                }
                if delim == Delimiter::Complete {
                    self.counters.sdus_complete += 1;
                    return Ok(Some(Piece::Whole));
                }
                Ok(Some(Piece::First))
            }
            Delimiter::Middle | Delimiter::Last => {
                let Some(p) = self.partial.as_ref() else {
                    self.counters.discarded_orphan += 1;
                    self.discarded += 1;
                    return Ok(None);
                };
                let size = p.held.len() + data.len();
                if size > self.max_sdu {
                    self.partial = None;
                    return Err(self.oversize(size));
                }
                let last = delim == Delimiter::Last;
                if last {
                    self.counters.sdus_complete += 1;
                }
                Ok(Some(Piece::More { last }))
            }
        }
    }

    fn oversize(&mut self, size: usize) -> DelimitError {
        self.counters.discarded_oversize += 1;
        self.discarded += 1;
        DelimitError::Oversize {
            size,
            max: self.max_sdu,
        }
    }
}

#[cfg(test)]
mod tests;
