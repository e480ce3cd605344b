//! The flooded database that link-state routing ([`crate::routing`]) and the
//! directory ([`crate::directory`]) share: objects with an origin's sequence
//! number and an age, stored newest-per-key, re-flooded to every neighbour
//! but the one they came from, sent whole to a new neighbour, and removed
//! when they reach their maximum age.
//!
//! [`FloodDb`] is sans-IO and knows nothing of what its objects mean: the
//! owner (the routing machine, the directory) decides what to do with a copy
//! of its own objects, when to originate and refresh, and what a change
//! means (a graph to recompute, a name that moved). The database does the
//! part that is the same for both:
//!
//! * **Judging** a received copy against the stored one
//!   ([`FloodDb::too_old`], [`FloodDb::judge`]): a higher sequence number is
//!   newer, an equal one a duplicate, a lower one stale; a new key is refused
//!   when the database is full. "Higher" is serial-number arithmetic (RFC
//!   1982, [`seq_newer`]): the numbers wrap, so that no number, however
//!   large (one forged at the top of the space), leaves an origin unable
//!   to originate a newer one ([`seq_next`]).
//! * **Storing** ([`FloodDb::store`]) with an exact expiry instant (the
//!   object's age is subtracted from the maximum age), and scheduling its
//!   flooding at most every propagation delay.
//! * **Flooding** ([`FloodDb::flush`]): what was stored since the last flood,
//!   grouped by the neighbour it came from, to every other neighbour, in
//!   messages of at most [`Limits::max_per_message`] objects.
//! * **Database sync** ([`FloodDb::sync`]): the whole database for a new
//!   neighbour, except what the next flood will bring it anyway.
//! * **Ageing** ([`FloodDb::expire`], [`Stored::at`]): ages grow with time
//!   in whole seconds; an object is removed when it reaches the maximum age.
//!
//! Neighbours are named by a peer id `P` of the owner's choosing (routing
//! floods once per neighbour address, the directory once per port); a
//! flood is sent on the ports the owner maps those peers to.
//!
//! Everything that reaches an output is iterated in key / peer / port order,
//! so two databases fed the same calls produce the same messages.

use crate::rmt::PortId;
use crate::time::Instant;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// An object that is flooded: a key, the origin's sequence number for that
/// key, and an age.
pub trait Flooded: Clone {
    /// What the database keeps one object per.
    type Key: Ord + Clone;
    /// The object's key.
    fn key(&self) -> Self::Key;
    /// The origin's sequence number: a newer one ([`seq_newer`]) replaces
    /// an older one.
    fn seq(&self) -> u64;
    /// Bits of the sequence number on the wire (at most 64): where it wraps.
    const SEQ_BITS: u32 = 64;
    /// Age in whole seconds when the object was sent (or stored).
    fn age(&self) -> u32;
    /// The same object with another age.
    fn with_age(&self, age: u32) -> Self;
}

/// The values of a `bits`-bit sequence number (`bits` from 2 to 64).
fn seq_mask(bits: u32) -> u64 {
    u64::MAX >> (64 - bits.clamp(2, 64))
}

/// Whether sequence number `a` is newer than `b`, both of `bits` bits, in
/// serial-number arithmetic (RFC 1982): `a` is less than half the number
/// space ahead of `b`. Exactly half apart, neither is newer.
pub fn seq_newer(a: u64, b: u64, bits: u32) -> bool {
    let mask = seq_mask(bits);
    let ahead = a.wrapping_sub(b) & mask;
    ahead != 0 && ahead < mask / 2 + 1
}

/// The sequence number an origin gives its next copy after `seq` (`bits`
/// bits): one more, wrapping to 1 after the largest (0 means "none yet").
pub fn seq_next(seq: u64, bits: u32) -> u64 {
    match seq.wrapping_add(1) & seq_mask(bits) {
        0 => 1,
        n => n,
    }
}

/// Parameters of a flooded database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Age at which an object is removed.
    pub max_age: Duration,
    /// Least time between two floods.
    pub propagation_delay: Duration,
    /// Most objects in one message (at least 1).
    pub max_per_message: usize,
    /// Most objects stored; new keys beyond it are refused.
    pub max_objects: usize,
}

/// A stored object: as received (its age then), when, and when it expires.
#[derive(Debug, Clone)]
pub struct Stored<O> {
    /// The object, with its age when it was stored.
    pub obj: O,
    /// When it was stored.
    pub rx_at: Instant,
    /// When it reaches the maximum age.
    pub expires_at: Instant,
}

impl<O: Flooded> Stored<O> {
    /// The object with its age as of `now`.
    pub fn at(&self, now: Instant) -> O {
        let aged = (now - self.rx_at).as_secs();
        let age = u64::from(self.obj.age()).saturating_add(aged);
        self.obj.with_age(u32::try_from(age).unwrap_or(u32::MAX))
    }
}

/// How a received copy compares with the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Newer than the stored copy, or a key not stored yet: store it.
    Accept,
    /// The same sequence number as the stored copy.
    Duplicate,
    /// An older sequence number than the stored copy.
    Stale,
    /// A new key, and the database is full.
    Full,
}

/// One message to send: `objects` (with their current ages) on each of
/// `to_ports`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message<O> {
    /// The ports to send it on, in order.
    pub to_ports: Vec<PortId>,
    /// The objects.
    pub objects: Vec<O>,
}

/// A flooded database of objects `O`, whose copies come from peers `P`.
#[derive(Debug, Clone)]
pub struct FloodDb<O: Flooded, P> {
    limits: Limits,
    db: BTreeMap<O::Key, Stored<O>>,
    /// Keys to flood, with the peer not to send them to.
    pending: BTreeMap<O::Key, Option<P>>,
    flush_due: Option<Instant>,
    last_flush: Option<Instant>,
    /// Every stored object's expiry, in time order, kept in step with
    /// `db`: expiring takes what is due, not a scan of the database.
    expiries: BTreeSet<(Instant, O::Key)>,
}

impl<O: Flooded, P: Ord + Copy> FloodDb<O, P> {
    /// An empty database.
    pub fn new(limits: Limits) -> Self {
        FloodDb {
            limits,
            db: BTreeMap::new(),
            pending: BTreeMap::new(),
            flush_due: None,
            last_flush: None,
            expiries: BTreeSet::new(),
        }
    }

    /// The parameters.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Number of objects stored.
    pub fn len(&self) -> usize {
        self.db.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.db.is_empty()
    }

    /// The stored object under `key`.
    pub fn get(&self, key: &O::Key) -> Option<&Stored<O>> {
        self.db.get(key)
    }

    /// Whether an object is stored under `key`.
    pub fn contains(&self, key: &O::Key) -> bool {
        self.db.contains_key(key)
    }

    /// The stored objects, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&O::Key, &Stored<O>)> + '_ {
        self.db.iter()
    }

    /// The stored objects with keys in `range`, in key order.
    pub fn range<R: std::ops::RangeBounds<O::Key>>(
        &self,
        range: R,
    ) -> impl Iterator<Item = &Stored<O>> + '_ {
        self.db.range(range).map(|(_, s)| s)
    }

    /// Whether a received object is already at the maximum age.
    pub fn too_old(&self, obj: &O) -> bool {
        Duration::from_secs(u64::from(obj.age())) >= self.limits.max_age
    }

    /// How a received object compares with the stored copy of its key.
    pub fn judge(&self, obj: &O) -> Verdict {
        match self.db.get(&obj.key()) {
            Some(s) if obj.seq() == s.obj.seq() => Verdict::Duplicate,
            Some(s) if seq_newer(obj.seq(), s.obj.seq(), O::SEQ_BITS) => Verdict::Accept,
            // Older, or exactly half the number space away (neither newer).
            Some(_) => Verdict::Stale,
            None if self.db.len() >= self.limits.max_objects => Verdict::Full,
            None => Verdict::Accept,
        }
    }

    /// Whether a new key can be stored (the database is not full).
    pub fn has_room(&self) -> bool {
        self.db.len() < self.limits.max_objects
    }

    /// Stores `obj` (replacing its key's copy, which is returned) and
    /// schedules its flooding to every peer but `from`.
    pub fn store(&mut self, now: Instant, obj: O, from: Option<P>) -> Option<O> {
        let key = obj.key();
        let life = Duration::from_secs(u64::from(obj.age()));
        let expires_at = now + self.limits.max_age.saturating_sub(life);
        let old = self.db.insert(
            key.clone(),
            Stored {
                obj,
                rx_at: now,
                expires_at,
            },
        );
        if let Some(o) = &old {
            self.expiries.remove(&(o.expires_at, key.clone()));
        }
        self.expiries.insert((expires_at, key.clone()));
        self.pending.insert(key, from);
        if self.flush_due.is_none() {
            let earliest = self
                .last_flush
                .map_or(now, |t| t + self.limits.propagation_delay);
            self.flush_due = Some(earliest.max(now));
        }
        old.map(|s| s.obj)
    }

    /// Removes the objects that reached the maximum age by `now` and
    /// returns them (as stored), in key order.
    pub fn expire(&mut self, now: Instant) -> Vec<O> {
        let mut old = Vec::new();
        while self.expiries.first().is_some_and(|(t, _)| *t <= now) {
            if let Some((_, k)) = self.expiries.pop_first() {
                old.push(k);
            }
        }
        old.sort();
        let mut gone = Vec::with_capacity(old.len());
        for k in old {
            self.pending.remove(&k);
            if let Some(s) = self.db.remove(&k) {
                gone.push(s.obj);
            }
        }
        gone
    }

    /// When the next flood or expiry is due, if any.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [self.flush_due, self.expiries.first().map(|(t, _)| *t)]
            .into_iter()
            .flatten()
            .min()
    }

    /// Whether a flood is scheduled (something waits to be flooded).
    pub fn flood_scheduled(&self) -> bool {
        self.flush_due.is_some()
    }

    /// Whether a flood is due at `now`.
    pub fn flush_due(&self, now: Instant) -> bool {
        self.flush_due.is_some_and(|t| now >= t)
    }

    /// Peer `peer` is gone: what came from it is flooded to every peer.
    pub fn forget_peer(&mut self, peer: P) {
        for from in self.pending.values_mut() {
            if *from == Some(peer) {
                *from = None;
            }
        }
    }

    /// The flood of everything stored since the last one: each object to
    /// the ports of `peers` (peer → port) but the peer it came from.
    pub fn flush(&mut self, now: Instant, peers: &BTreeMap<P, PortId>) -> Vec<Message<O>> {
        self.flush_due = None;
        self.last_flush = Some(now);
        let mut groups: BTreeMap<Option<P>, Vec<O>> = BTreeMap::new();
        for (k, from) in std::mem::take(&mut self.pending) {
            if let Some(s) = self.db.get(&k) {
                groups.entry(from).or_default().push(s.at(now));
            }
        }
        let mut out = Vec::new();
        for (from, objects) in groups {
            let to_ports: Vec<PortId> = peers
                .iter()
                .filter(|(p, _)| Some(**p) != from)
                .map(|(_, port)| *port)
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            if to_ports.is_empty() {
                continue;
            }
            for chunk in objects.chunks(self.limits.max_per_message.max(1)) {
                out.push(Message {
                    to_ports: to_ports.clone(),
                    objects: chunk.to_vec(),
                });
            }
        }
        out
    }

    /// The whole database for a new neighbour `peer`, as messages, except
    /// what the next flood will bring it anyway.
    pub fn sync(&self, now: Instant, peer: P) -> Vec<Vec<O>> {
        let objects: Vec<O> = self
            .db
            .iter()
            .filter(|(k, _)| match self.pending.get(k) {
                Some(from) => *from == Some(peer),
                None => true,
            })
            .map(|(_, s)| s.at(now))
            .collect();
        objects
            .chunks(self.limits.max_per_message.max(1))
            .map(<[O]>::to_vec)
            .collect()
    }
}

#[cfg(test)]
mod tests;
