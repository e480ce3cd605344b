//! One buffer per PDU: the bytes of a PDU with room in front for the
//! headers the layers below add.
//!
//! A normal IPCP copies an SDU once, into a [`PduBuf`] with
//! [`HEADROOM`] bytes free in front; from there the delimiter, the PCI, the
//! SDU protection header, the shim's header and the headers of every
//! stacked DIF below are written into that room ([`PduBuf::prepend`]), and
//! the same buffer waits in EFCP and the RMT and reaches the driver, which
//! writes it with one system call. A reliable flow's retransmission queue
//! keeps the buffer as the application wrote it, and each transmission is
//! one copy of it (which the PCI and protection then change in place).
//!
//! Each thread counts the buffers made and the bytes copied into them
//! ([`stats`]), so a test can check that a path makes no copy it should
//! not.
//!
//! *Recycling.* A PDU's buffer of 0.5-2 KiB or 2-10 KiB is larger than
//! glibc's per-thread cache takes (1 KiB), so each `malloc` and `free` of
//! one went through the allocator's bins: about 280 and 150 instructions,
//! two of each per SDU. Such buffers are allocated at their class's size
//! ([`CLASSES`]) and, when dropped, kept in a small per-thread free list
//! (at most [`POOL_MAX`] of each class) that the next buffer of the class is taken
//! from. [`release_pool`] hands them back to the allocator (the daemon
//! calls it when it gives memory back after many flows closed). A kept
//! buffer keeps its first [`HEADROOM`] bytes as they were, so the room of
//! the next buffer made from it is not zeroed again: room is only ever
//! written (by [`PduBuf::prepend`]) before it is part of the PDU, so its
//! old bytes are never read.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::ops::{Deref, DerefMut};

/// Room kept in front of an SDU when it is first copied: the delimiter,
/// the largest PCI, a TTL and the shim's header of the DIF it enters and
/// of two more DIFs stacked under it. A layer that finds too little room
/// moves the bytes once ([`BufStats::grown`]).
pub const HEADROOM: usize = 128;

/// Room kept after an SDU when it is first copied: an authentication tag
/// of link encryption and a CRC.
pub const TAILROOM: usize = 32;

thread_local! {
    static STATS: Cell<BufStats> = const { Cell::new(BufStats { made: 0, copies: 0, grown: 0 }) };
    static POOL: RefCell<[Vec<Vec<u8>>; 2]> = const { RefCell::new([Vec::new(), Vec::new()]) };
}

/// The capacities recycled buffers have: a request of more than the
/// previous class (or of more than 512 bytes, which the allocator's own
/// cache serves) and at most this is given a buffer of exactly this.
pub const CLASSES: [usize; 2] = [2048, 10240];

/// Requests of at most this many bytes are left to the allocator.
const SMALL: usize = 512;

/// Buffers kept per class and thread: at most 2 MiB and 2.5 MiB.
pub const POOL_MAX: [usize; 2] = [1024, 256];

/// The class of a buffer of capacity `cap` requested, if it is recycled.
fn class_of(cap: usize) -> Option<usize> {
    if cap <= SMALL {
        return None;
    }
    CLASSES.iter().position(|&c| cap <= c)
}

/// A `Vec` of `room` bytes (the room in front of a PDU, whose values do
/// not matter) with capacity for at least `cap`: a recycled one of its
/// class if there is one, whose kept bytes are not written again.
fn alloc(cap: usize, room: usize) -> Vec<u8> {
    let Some(k) = class_of(cap) else {
        let mut v = Vec::with_capacity(cap);
        v.resize(room, 0);
        return v;
    };
    let reused = POOL
        .try_with(|p| p.try_borrow_mut().ok().and_then(|mut p| p[k].pop()))
        .ok()
        .flatten();
    let mut v = reused.unwrap_or_else(|| Vec::with_capacity(CLASSES[k]));
    if v.len() >= room {
        v.truncate(room);
    } else {
        v.resize(room, 0);
    }
    v
}

/// Keeps `v` for reuse if it has exactly a class's capacity and the
/// class's list has room; frees it otherwise.
fn recycle(mut v: Vec<u8>) {
    let Some(k) = CLASSES.iter().position(|&c| c == v.capacity()) else {
        return;
    };
    // The room's bytes stay for the next buffer (see the module's docs).
    v.truncate(HEADROOM);
    let _ = POOL.try_with(|p| {
        if let Ok(mut p) = p.try_borrow_mut() {
            if p[k].len() < POOL_MAX[k] {
                p[k].push(v);
            }
        }
    });
}

/// Hands this thread's recycled buffers back to the allocator.
pub fn release_pool() {
    let _ = POOL.try_with(|p| {
        if let Ok(mut p) = p.try_borrow_mut() {
            for l in p.iter_mut() {
                *l = Vec::new();
            }
        }
    });
}

/// Buffers this thread keeps for reuse, per class.
pub fn pooled() -> [usize; 2] {
    POOL.try_with(|p| {
        p.try_borrow()
            .map(|p| [p[0].len(), p[1].len()])
            .unwrap_or_default()
    })
    .unwrap_or_default()
}

/// What this thread's [`PduBuf`]s have cost so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BufStats {
    /// Buffers made by copying bytes in ([`PduBuf::with_headroom`],
    /// [`Clone`]); buffers adopted from a `Vec` are not counted.
    pub made: u64,
    /// Times a buffer's bytes were copied: into a new buffer, or moved to
    /// make room in front or to give a `Vec` back.
    pub copies: u64,
    /// Times a buffer had too little room in front and was moved.
    pub grown: u64,
}

/// This thread's [`BufStats`] so far.
pub fn stats() -> BufStats {
    STATS.with(Cell::get)
}

/// Counts a buffer made by copying bytes in from elsewhere than a
/// [`PduBuf`] constructor (the parts of a gathered [`crate::sdu::Sdu`]).
pub(crate) fn count_copy() {
    count(1, 1, 0);
}

fn count(made: u64, copies: u64, grown: u64) {
    STATS.with(|s| {
        let mut v = s.get();
        v.made += made;
        v.copies += copies;
        v.grown += grown;
        s.set(v);
    });
}

/// The bytes of an SDU that are not a slice of this process's memory (an
/// application's shared-memory ring, which the application may rewrite
/// while it is read): the SDU is copied from it straight into the buffers
/// of its PDUs ([`PduBuf::with_room_from`]), with no copy in between.
pub trait SduSource {
    /// The SDU's length.
    fn len(&self) -> usize;

    /// Whether the SDU is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends the SDU's bytes `at..at + n` to `out`; false (and `out`
    /// unchanged) if the source cannot give them.
    fn append_to(&self, at: usize, n: usize, out: &mut Vec<u8>) -> bool;
}

impl SduSource for &[u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }

    fn append_to(&self, at: usize, n: usize, out: &mut Vec<u8>) -> bool {
        match at.checked_add(n).and_then(|end| self.get(at..end)) {
            Some(b) => {
                out.extend_from_slice(b);
                true
            }
            None => false,
        }
    }
}

impl SduSource for PduBuf {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }

    fn append_to(&self, at: usize, n: usize, out: &mut Vec<u8>) -> bool {
        (&**self).append_to(at, n, out)
    }
}

/// The bytes of one PDU, `buf[head..]`, with `head` bytes of room in front.
#[derive(Default)]
pub struct PduBuf {
    buf: Vec<u8>,
    head: usize,
}

impl PduBuf {
    /// A copy of `bytes` with `headroom` bytes free in front of it (and the
    /// room for `tailroom` more after it without moving).
    pub fn with_room(headroom: usize, bytes: &[u8], tailroom: usize) -> PduBuf {
        let mut buf = alloc(headroom + bytes.len() + tailroom, headroom);
        buf.extend_from_slice(bytes);
        count(1, 1, 0);
        PduBuf {
            buf,
            head: headroom,
        }
    }

    /// A copy of bytes `at..at + n` of `src` with `headroom` bytes free in
    /// front of it (and room for `tailroom` more after it); `None` if the
    /// source could not give them.
    pub fn with_room_from(
        headroom: usize,
        src: &dyn SduSource,
        at: usize,
        n: usize,
        tailroom: usize,
    ) -> Option<PduBuf> {
        let mut buf = alloc(headroom + n + tailroom, headroom);
        if !src.append_to(at, n, &mut buf) || buf.len() != headroom + n {
            recycle(buf);
            return None;
        }
        count(1, 1, 0);
        Some(PduBuf {
            buf,
            head: headroom,
        })
    }

    /// A copy of `bytes` with [`HEADROOM`] free in front and [`TAILROOM`]
    /// after.
    pub fn with_headroom(bytes: &[u8]) -> PduBuf {
        PduBuf::with_room(HEADROOM, bytes, TAILROOM)
    }

    /// An empty buffer with `headroom` free in front, for a PDU that is
    /// written rather than copied (a control PDU).
    pub fn empty(headroom: usize, capacity: usize) -> PduBuf {
        let buf = alloc(headroom + capacity, headroom);
        PduBuf {
            buf,
            head: headroom,
        }
    }

    /// Bytes the allocation holds, room and PDU together (what keeping
    /// the buffer costs).
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Bytes free in front.
    pub fn headroom(&self) -> usize {
        self.head
    }

    /// Makes `n` more bytes at the front and returns them (zeroed only if
    /// the buffer had to grow; the caller writes all of them).
    #[inline]
    pub fn prepend(&mut self, n: usize) -> &mut [u8] {
        if self.head < n {
            self.grow_front(n);
        }
        self.head -= n;
        &mut self.buf[self.head..self.head + n]
    }

    /// Moves the bytes into a new buffer with room for `n` more in front
    /// (and [`HEADROOM`] beyond): the path a PDU whose headroom ran out
    /// takes, out of line so that [`PduBuf::prepend`] inlines.
    #[cold]
    #[inline(never)]
    fn grow_front(&mut self, n: usize) {
        let extra = n - self.head + HEADROOM;
        let mut buf = alloc(extra + self.buf.len(), extra);
        buf.extend_from_slice(&self.buf);
        recycle(std::mem::replace(&mut self.buf, buf));
        self.head += extra;
        count(0, 1, 1);
    }

    /// Writes `bytes` in front.
    pub fn push_front(&mut self, bytes: &[u8]) {
        self.prepend(bytes.len()).copy_from_slice(bytes);
    }

    /// Drops the first `n` bytes (all of them if fewer), keeping the room.
    pub fn advance(&mut self, n: usize) {
        self.head = (self.head + n).min(self.buf.len());
    }

    /// Appends `bytes` at the end.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Keeps the first `len` bytes.
    pub fn truncate(&mut self, len: usize) {
        self.buf.truncate(self.head + len);
    }

    /// The whole allocation and where the PDU starts in it, for code that
    /// works on a `Vec` with headroom ([`crate::sdup::Sdup::protect_buf`]).
    pub fn parts_mut(&mut self) -> (&mut Vec<u8>, &mut usize) {
        (&mut self.buf, &mut self.head)
    }

    /// The bytes as a `Vec`: free when there is no room in front, one move
    /// otherwise.
    pub fn into_vec(mut self) -> Vec<u8> {
        if self.head > 0 {
            self.buf.drain(..self.head);
            count(0, 1, 0);
        }
        std::mem::take(&mut self.buf)
    }
}

impl Drop for PduBuf {
    /// Recycles the buffer (see the module's documentation).
    fn drop(&mut self) {
        recycle(std::mem::take(&mut self.buf));
    }
}

impl Clone for PduBuf {
    /// A copy with the same room in front.
    fn clone(&self) -> PduBuf {
        let mut buf = alloc(self.buf.capacity(), self.head);
        buf.extend_from_slice(&self.buf[self.head..]);
        count(1, 1, 0);
        PduBuf {
            buf,
            head: self.head,
        }
    }
}

impl From<Vec<u8>> for PduBuf {
    /// Adopts `v` without copying (and without room in front).
    fn from(v: Vec<u8>) -> PduBuf {
        PduBuf { buf: v, head: 0 }
    }
}

impl From<&[u8]> for PduBuf {
    fn from(b: &[u8]) -> PduBuf {
        PduBuf::with_headroom(b)
    }
}

impl<const N: usize> From<&[u8; N]> for PduBuf {
    fn from(b: &[u8; N]) -> PduBuf {
        PduBuf::with_headroom(b)
    }
}

impl Deref for PduBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.head..]
    }
}

impl DerefMut for PduBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.head..]
    }
}

impl AsRef<[u8]> for PduBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl PartialEq for PduBuf {
    /// The same bytes, whatever the room around them.
    fn eq(&self, other: &PduBuf) -> bool {
        **self == **other
    }
}

impl Eq for PduBuf {}

impl PartialEq<[u8]> for PduBuf {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

impl PartialEq<Vec<u8>> for PduBuf {
    fn eq(&self, other: &Vec<u8>) -> bool {
        **self == other[..]
    }
}

impl PartialEq<&[u8]> for PduBuf {
    fn eq(&self, other: &&[u8]) -> bool {
        **self == **other
    }
}

impl<const N: usize> PartialEq<[u8; N]> for PduBuf {
    fn eq(&self, other: &[u8; N]) -> bool {
        **self == other[..]
    }
}

impl PartialEq<PduBuf> for Vec<u8> {
    fn eq(&self, other: &PduBuf) -> bool {
        self[..] == **other
    }
}

impl fmt::Debug for PduBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Like a byte slice, so test failures read the same as before.
        fmt::Debug::fmt(&**self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_go_in_front_without_moving_the_bytes() {
        let before = stats();
        let mut b = PduBuf::with_headroom(b"payload");
        let at = b.as_ptr();
        b.push_front(&[1]);
        b.prepend(4).copy_from_slice(&[9, 9, 9, 9]);
        assert_eq!(&b[..], b"\x09\x09\x09\x09\x01payload");
        assert_eq!(b.headroom(), HEADROOM - 5);
        // SAFETY-free pointer arithmetic check: the payload did not move.
        assert_eq!(b[5..].as_ptr(), at);
        let s = stats();
        assert_eq!((s.made - before.made, s.copies - before.copies), (1, 1));
        assert_eq!(s.grown, before.grown);
    }

    #[test]
    fn too_little_room_moves_once_and_keeps_the_bytes() {
        let before = stats();
        let mut b = PduBuf::from(vec![1, 2, 3]);
        b.push_front(&[0]);
        assert_eq!(b, vec![0, 1, 2, 3]);
        assert_eq!(b.headroom(), HEADROOM);
        b.push_front(&[7; 10]);
        assert_eq!(b.len(), 14);
        assert_eq!(stats().grown - before.grown, 1);
        b.advance(11);
        assert_eq!(b, vec![1, 2, 3]);
        b.truncate(2);
        b.extend_from_slice(&[5]);
        assert_eq!(b.into_vec(), vec![1, 2, 5]);
    }

    #[test]
    fn a_clone_is_a_copy_with_the_same_room() {
        let a = PduBuf::with_headroom(b"abc");
        let mut c = a.clone();
        c[0] = b'x';
        assert_eq!(a, *b"abc");
        assert_eq!(c, *b"xbc");
        assert_eq!(c.headroom(), HEADROOM);
    }

    #[test]
    fn a_dropped_pdu_buffer_is_reused_by_the_next_of_its_class() {
        release_pool();
        let sdu = [7u8; 1400];
        let a = PduBuf::with_headroom(&sdu);
        let at = a.as_ptr();
        assert_eq!(pooled(), [0, 0]);
        drop(a);
        assert_eq!(pooled(), [1, 0]);
        // The next buffer of 0.5-2 KiB is the same memory, cleared and refilled.
        let b = PduBuf::with_room(HEADROOM, &[1u8; 600], TAILROOM);
        assert_eq!(b.as_ptr(), at);
        assert_eq!(&b[..], &[1u8; 600][..]);
        assert_eq!(pooled(), [0, 0]);
        // A jumbo PDU is of the second class; a small one and one over
        // 10 KiB are left to the allocator.
        drop(PduBuf::with_headroom(&[0u8; 9000]));
        drop(PduBuf::with_headroom(&[0u8; 100]));
        drop(PduBuf::with_headroom(&[0u8; 20_000]));
        drop(PduBuf::from(vec![0u8; 3000]));
        assert_eq!(pooled(), [0, 1]);
        drop(b);
        release_pool();
        assert_eq!(pooled(), [0, 0]);
    }

    #[test]
    fn the_pool_keeps_at_most_its_bound() {
        release_pool();
        let many: Vec<PduBuf> = (0..POOL_MAX[0] + 10)
            .map(|_| PduBuf::with_headroom(&[3u8; 1000]))
            .collect();
        drop(many);
        assert_eq!(pooled(), [POOL_MAX[0], 0]);
        release_pool();
    }
}
