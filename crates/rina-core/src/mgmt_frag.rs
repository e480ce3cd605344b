//! Fragmentation and reassembly of management messages larger than an N-1
//! flow's max SDU.
//!
//! IRATI drops a management PDU (a CDAP message: a flow-state database, a
//! directory sync, enrollment data) that does not fit the N-1 MTU (issue
//! #841 there, `reference/irati.md` §7), so a DIF of fifty members whose
//! database outgrows one PDU cannot enrol anyone. Here every management
//! message on a management flow is cut by [`Fragmenter::split`] into
//! fragments that each fit the flow's max SDU, and put back together by a
//! [`Reassembler`] at the other end. A message that fits travels as a single
//! fragment (`count` 1) with the same 12-byte header, so the receiver never
//! has to guess.
//!
//! # Fragment format
//!
//! All integers big-endian (network byte order):
//!
//! | bytes | field | meaning |
//! | --- | --- | --- |
//! | 0..4 | `msg_id` (u32) | chosen by the sender, distinct among its messages in flight on the flow (a counter: [`Fragmenter::fragment`]) |
//! | 4..6 | `index` (u16) | 0-based position of the fragment |
//! | 6..8 | `count` (u16) | fragments in the message, 1..=65 535 |
//! | 8..12 | `total_len` (u32) | length of the whole message in bytes |
//! | 12.. | payload | bytes `index * L ..` of the message |
//!
//! Every fragment but the last carries the same payload length `L` (> 0);
//! the last carries the rest (`total_len - (count - 1) * L`, > 0 unless the
//! message is empty). A fragment that breaks these rules, or disagrees with
//! earlier fragments of the same message about `count`, `total_len`, `L` or
//! its own bytes, makes the receiver drop the whole message.
//!
//! # Reassembly
//!
//! Messages are keyed by (port, `msg_id`). Fragments may arrive in any order
//! and more than once. Memory is bounded: a message may not exceed
//! `max_msg` bytes, at most `max_pending` messages are incomplete at a time
//! and they hold at most `max_bytes` (four messages' worth unless set):
//! room is made by evicting the oldest message of the port that holds the
//! most, so that one port (a sender that never finishes its messages)
//! evicts its own, not its neighbours'. An incomplete message is dropped
//! `timeout` after its first fragment arrived. The ids of recently completed
//! messages are remembered for `timeout`, so a late duplicate fragment of a
//! delivered message is recognised and does not start a message that can
//! never complete. (A message id must therefore not be reused on a flow
//! within `timeout`; [`Fragmenter::fragment`] counts up. Single-fragment
//! messages are delivered at once and not remembered: a duplicate of one is
//! delivered again, as the N-1 flow delivered it.)

use crate::rmt::PortId;
use crate::time::Instant;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;
use thiserror::Error;

/// Length of the fragment header in bytes.
pub const HEADER_LEN: usize = 12;

/// Why a message could not be fragmented, or a fragment was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FragError {
    /// The max payload leaves no room for data after the header.
    #[error("max payload {0} leaves no room after the {HEADER_LEN}-byte header")]
    MaxPayloadTooSmall(usize),
    /// The message needs more than 65 535 fragments or is over 4 GiB.
    #[error("message of {0} bytes cannot be fragmented at this size")]
    MessageTooLarge(usize),
    /// The fragment is shorter than the header.
    #[error("fragment of {0} bytes is shorter than the header")]
    TooShort(usize),
    /// The header's count is zero or its index is not below the count.
    #[error("fragment index {index} of count {count} is invalid")]
    BadIndex {
        /// The index in the header.
        index: u16,
        /// The count in the header.
        count: u16,
    },
    /// The announced message is longer than the reassembler accepts.
    #[error("message of {0} bytes exceeds the reassembly limit")]
    TooLarge(u32),
    /// The fragment contradicts the header rules or earlier fragments; the
    /// whole message was dropped.
    #[error("fragment of message {0} is inconsistent; message dropped")]
    Inconsistent(u32),
}

/// The header of one fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragHeader {
    /// Message id.
    pub msg_id: u32,
    /// 0-based index of the fragment.
    pub index: u16,
    /// Number of fragments in the message.
    pub count: u16,
    /// Length of the whole message.
    pub total_len: u32,
}

impl FragHeader {
    /// Parses the header of `frag`; returns it and the payload.
    pub fn parse(frag: &[u8]) -> Result<(FragHeader, &[u8]), FragError> {
        if frag.len() < HEADER_LEN {
            return Err(FragError::TooShort(frag.len()));
        }
        let h = FragHeader {
            msg_id: u32::from_be_bytes([frag[0], frag[1], frag[2], frag[3]]),
            index: u16::from_be_bytes([frag[4], frag[5]]),
            count: u16::from_be_bytes([frag[6], frag[7]]),
            total_len: u32::from_be_bytes([frag[8], frag[9], frag[10], frag[11]]),
        };
        if h.count == 0 || h.index >= h.count {
            return Err(FragError::BadIndex {
                index: h.index,
                count: h.count,
            });
        }
        Ok((h, &frag[HEADER_LEN..]))
    }

    /// Writes the header to the front of `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.msg_id.to_be_bytes());
        out.extend_from_slice(&self.index.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
        out.extend_from_slice(&self.total_len.to_be_bytes());
    }
}

/// The sending side: cuts messages into fragments.
#[derive(Debug, Clone, Default)]
pub struct Fragmenter {
    next_id: u32,
}

impl Fragmenter {
    /// A fragmenter whose first message id is 0.
    pub fn new() -> Self {
        Fragmenter::default()
    }

    /// Splits `msg` with the next message id (wrapping).
    pub fn fragment(&mut self, msg: &[u8], max_payload: usize) -> Result<Vec<Vec<u8>>, FragError> {
        let out = Self::split(self.next_id, msg, max_payload)?;
        self.next_id = self.next_id.wrapping_add(1);
        Ok(out)
    }

    /// Splits `msg` into fragments of at most `max_payload` bytes each,
    /// header included (`max_payload` is the N-1 flow's max SDU). An empty
    /// message gives one header-only fragment.
    pub fn split(msg_id: u32, msg: &[u8], max_payload: usize) -> Result<Vec<Vec<u8>>, FragError> {
        let room = max_payload
            .checked_sub(HEADER_LEN)
            .filter(|r| *r > 0)
            .ok_or(FragError::MaxPayloadTooSmall(max_payload))?;
        let total_len =
            u32::try_from(msg.len()).map_err(|_| FragError::MessageTooLarge(msg.len()))?;
        let count = msg.len().div_ceil(room).max(1);
        let count = u16::try_from(count).map_err(|_| FragError::MessageTooLarge(msg.len()))?;
        let mut out = Vec::with_capacity(usize::from(count));
        for index in 0..count {
            let start = usize::from(index) * room;
            let end = (start + room).min(msg.len());
            let mut f = Vec::with_capacity(HEADER_LEN + end - start);
            FragHeader {
                msg_id,
                index,
                count,
                total_len,
            }
            .write(&mut f);
            f.extend_from_slice(&msg[start..end]);
            out.push(f);
        }
        Ok(out)
    }
}

/// Counters of a reassembler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Fragments pushed.
    pub rx_fragments: u64,
    /// Fragments refused as malformed (short, bad index, too large).
    pub rx_malformed: u64,
    /// Fragments already held (identical copies).
    pub rx_duplicate: u64,
    /// Fragments of messages delivered recently (late duplicates).
    pub rx_late: u64,
    /// Messages dropped because a fragment was inconsistent.
    pub inconsistent: u64,
    /// Messages delivered.
    pub delivered: u64,
    /// Messages delivered from more than one fragment.
    pub reassembled: u64,
    /// Incomplete messages dropped at their timeout.
    pub timed_out: u64,
    /// Incomplete messages evicted to make room for a new one.
    pub evicted: u64,
    /// Incomplete messages dropped because their port went away.
    pub port_dropped: u64,
}

impl Counters {
    /// The counters by name, for listings.
    pub fn to_map(&self) -> BTreeMap<String, u64> {
        [
            ("rx_fragments", self.rx_fragments),
            ("rx_malformed", self.rx_malformed),
            ("rx_duplicate", self.rx_duplicate),
            ("rx_late", self.rx_late),
            ("inconsistent", self.inconsistent),
            ("delivered", self.delivered),
            ("reassembled", self.reassembled),
            ("timed_out", self.timed_out),
            ("evicted", self.evicted),
            ("port_dropped", self.port_dropped),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

type Key = (PortId, u32);

/// An incomplete message.
#[derive(Debug, Clone)]
struct Pending {
    count: u16,
    total_len: u32,
    /// Payload length of the non-last fragments, once known.
    frag_len: Option<usize>,
    /// The fragments received, by index: only those (a fragment claiming
    /// 65,535 parts reserves nothing for the others).
    parts: BTreeMap<u16, Vec<u8>>,
    received: u16,
    bytes: usize,
    started: Instant,
    deadline: Instant,
}

impl Pending {
    /// Whether a fragment with this header and payload fits what is known.
    fn accepts(&self, h: &FragHeader, payload: &[u8]) -> bool {
        if h.count != self.count || h.total_len != self.total_len {
            return false;
        }
        let last = h.index + 1 == h.count;
        let total = self.total_len as usize;
        let n = usize::from(self.count);
        if last {
            if let Some(l) = self.frag_len {
                return (n - 1) * l + payload.len() == total;
            }
            payload.len() <= total && (!payload.is_empty() || total == 0)
        } else {
            match self.frag_len {
                Some(l) => payload.len() == l,
                // (n - 1) * L < total <= n * L
                None => {
                    let l = payload.len();
                    let fits_last = match self.parts.get(&(self.count - 1)) {
                        Some(last) => (n - 1) * l + last.len() == total,
                        None => true,
                    };
                    l > 0 && (n - 1) * l < total && n * l >= total && fits_last
                }
            }
        }
    }
}

/// The receiving side: puts fragments from any number of ports back
/// together.
#[derive(Debug, Clone)]
pub struct Reassembler {
    max_msg: usize,
    max_bytes: usize,
    timeout: Duration,
    max_pending: usize,
    pending: BTreeMap<Key, Pending>,
    /// Recently delivered messages, with when they are forgotten.
    done: BTreeMap<Key, Instant>,
    done_order: VecDeque<(Instant, Key)>,
    bytes: usize,
    counters: Counters,
}

impl Reassembler {
    /// A reassembler accepting messages of at most `max_msg` bytes, dropping
    /// incomplete ones `timeout` after their first fragment, with at most
    /// `max_pending` (at least 1) incomplete at a time.
    pub fn new(max_msg: usize, timeout: Duration, max_pending: usize) -> Self {
        Reassembler {
            max_msg,
            max_bytes: max_msg.saturating_mul(4),
            timeout,
            max_pending: max_pending.max(1),
            pending: BTreeMap::new(),
            done: BTreeMap::new(),
            done_order: VecDeque::new(),
            bytes: 0,
            counters: Counters::default(),
        }
    }

    /// At most `max_bytes` (at least `max_msg`) held for incomplete
    /// messages.
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes.max(self.max_msg);
        self
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Incomplete messages held.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Payload bytes held for incomplete messages.
    pub fn pending_bytes(&self) -> usize {
        self.bytes
    }

    /// A fragment arrived on `from_port`. Returns the whole message when
    /// this fragment completes it; `Ok(None)` while it is incomplete, and
    /// for duplicates.
    pub fn push(
        &mut self,
        now: Instant,
        from_port: PortId,
        frag: &[u8],
    ) -> Result<Option<Vec<u8>>, FragError> {
        self.counters.rx_fragments += 1;
        self.forget_done(now);
        let (h, payload) = FragHeader::parse(frag).inspect_err(|_| {
            self.counters.rx_malformed += 1;
        })?;
        if h.total_len as usize > self.max_msg {
            self.counters.rx_malformed += 1;
            return Err(FragError::TooLarge(h.total_len));
        }
        // Every fragment carries at least one byte (but an empty message's
        // one), so a count above the length is a lie.
        if usize::from(h.count) > (h.total_len as usize).max(1) {
            self.counters.inconsistent += 1;
            return Err(FragError::Inconsistent(h.msg_id));
        }
        let key = (from_port, h.msg_id);
        if self.done.contains_key(&key) {
            self.counters.rx_late += 1;
            return Ok(None);
        }
        // Fast path: a message in one fragment.
        if h.count == 1 && !self.pending.contains_key(&key) {
            if payload.len() != h.total_len as usize {
                self.counters.inconsistent += 1;
                return Err(FragError::Inconsistent(h.msg_id));
            }
            self.counters.delivered += 1;
            return Ok(Some(payload.to_vec()));
        }
        if !self.pending.contains_key(&key) {
            if self.pending.len() >= self.max_pending {
                self.evict_from_largest(|p| (1, p.bytes));
            }
            self.pending.insert(
                key,
                Pending {
                    count: h.count,
                    total_len: h.total_len,
                    frag_len: None,
                    parts: BTreeMap::new(),
                    received: 0,
                    bytes: 0,
                    started: now,
                    deadline: now + self.timeout,
                },
            );
        }
        let Some(p) = self.pending.get_mut(&key) else {
            return Ok(None);
        };
        if let Some(held) = p.parts.get(&h.index) {
            if h.count == p.count && h.total_len == p.total_len && held.as_slice() == payload {
                self.counters.rx_duplicate += 1;
                return Ok(None);
            }
            self.drop_inconsistent(key);
            return Err(FragError::Inconsistent(h.msg_id));
        }
        if !p.accepts(&h, payload) {
            self.drop_inconsistent(key);
            return Err(FragError::Inconsistent(h.msg_id));
        }
        if h.index + 1 < h.count {
            p.frag_len = Some(payload.len());
        }
        while self.bytes + payload.len() > self.max_bytes {
            match self.evict_from_largest(|p| (p.bytes, 1)) {
                // This message was the one to go.
                Some(k) if k == key => return Ok(None),
                Some(_) => {}
                None => break,
            }
        }
        let Some(p) = self.pending.get_mut(&key) else {
            return Ok(None);
        };
        p.parts.insert(h.index, payload.to_vec());
        p.received += 1;
        p.bytes += payload.len();
        self.bytes += payload.len();
        if p.received < p.count {
            return Ok(None);
        }
        let Some(p) = self.pending.remove(&key) else {
            return Ok(None);
        };
        self.bytes -= p.bytes;
        if p.bytes != p.total_len as usize {
            self.counters.inconsistent += 1;
            return Err(FragError::Inconsistent(h.msg_id));
        }
        let mut msg = Vec::with_capacity(p.bytes);
        for part in p.parts.into_values() {
            msg.extend_from_slice(&part);
        }
        self.counters.delivered += 1;
        self.counters.reassembled += 1;
        let until = now + self.timeout;
        self.done.insert(key, until);
        self.done_order.push_back((until, key));
        // Bound the memory of delivered ids too.
        while self.done_order.len() > self.max_pending.saturating_mul(16) {
            if let Some((t, k)) = self.done_order.pop_front() {
                if self.done.get(&k) == Some(&t) {
                    self.done.remove(&k);
                }
            }
        }
        Ok(Some(msg))
    }

    /// When [`Reassembler::handle_timeout`] next needs to run, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let pending = self.pending.values().map(|p| p.deadline).min();
        let done = self.done_order.front().map(|(t, _)| *t);
        [pending, done].into_iter().flatten().min()
    }

    /// Drops incomplete messages whose time is up; returns how many.
    pub fn handle_timeout(&mut self, now: Instant) -> usize {
        self.forget_done(now);
        let old: Vec<Key> = self
            .pending
            .iter()
            .filter(|(_, p)| now >= p.deadline)
            .map(|(k, _)| *k)
            .collect();
        for k in &old {
            if let Some(p) = self.pending.remove(k) {
                self.bytes -= p.bytes;
                self.counters.timed_out += 1;
            }
        }
        old.len()
    }

    /// The flow on `port` is gone: drops its incomplete messages.
    pub fn drop_port(&mut self, port: PortId) {
        let keys: Vec<Key> = self
            .pending
            .range((port, 0)..=(port, u32::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            if let Some(p) = self.pending.remove(&k) {
                self.bytes -= p.bytes;
                self.counters.port_dropped += 1;
            }
        }
        self.done.retain(|k, _| k.0 != port);
        self.done_order.retain(|(_, k)| k.0 != port);
    }

    fn forget_done(&mut self, now: Instant) {
        while let Some((t, k)) = self.done_order.front().copied() {
            if t > now {
                break;
            }
            self.done_order.pop_front();
            if self.done.get(&k) == Some(&t) {
                self.done.remove(&k);
            }
        }
    }

    /// Evicts the oldest incomplete message of the port that holds the
    /// most of them by `weight` (messages or bytes, each message counted
    /// as `weight` gives it); which one went.
    fn evict_from_largest(&mut self, weight: impl Fn(&Pending) -> (usize, usize)) -> Option<Key> {
        let mut held: BTreeMap<PortId, (usize, usize)> = BTreeMap::new();
        for ((port, _), p) in &self.pending {
            let (a, b) = weight(p);
            let e = held.entry(*port).or_default();
            *e = (e.0 + a, e.1 + b);
        }
        let port = held
            .iter()
            .max_by_key(|(port, w)| (**w, std::cmp::Reverse(**port)))?
            .0;
        let k = self
            .pending
            .iter()
            .filter(|((p, _), _)| p == port)
            .min_by_key(|(k, p)| (p.started, **k))
            .map(|(k, _)| *k)?;
        let p = self.pending.remove(&k)?;
        self.bytes -= p.bytes;
        self.counters.evicted += 1;
        Some(k)
    }

    fn drop_inconsistent(&mut self, key: Key) {
        if let Some(p) = self.pending.remove(&key) {
            self.bytes -= p.bytes;
        }
        self.counters.inconsistent += 1;
    }
}

#[cfg(test)]
mod tests;
