//! A bounded single-producer/single-consumer ring of fixed-size slots in a
//! byte region shared with a peer that may write anything into it.
//!
//! Layout of one ring (all integers little-endian, offsets in bytes):
//!
//! ```text
//! 0    head: u32   records published by the producer (free-running count of slots)
//! 8    producer_waiting: u32  nonzero: the producer found the ring full and
//!                             waits for a doorbell when slots are freed
//! 64   tail: u32   slots released by the consumer (free-running)
//! 72   consumer_waiting: u32  nonzero: the consumer found the ring empty and
//!                             waits for a doorbell when a record is published
//! 128  slots × slot_size bytes of data
//! ```
//!
//! Notification (event suppression, as virtio's): the two *waiting* words
//! say whether a side sleeping on a doorbell (a packet on a socket, see
//! the daemon) wants to be rung. A consumer about to sleep sets its word and looks at
//! the head once more ([`Consumer::arm`]); a producer, after publishing,
//! rings only if the word is set, clearing it ([`Producer::take_wakeup`]).
//! The same holds the other way for a full ring ([`Producer::arm`],
//! [`Consumer::take_wakeup`]). Both sides put a sequentially consistent
//! fence between their store and their load, so one of them always sees
//! the other (no lost wakeup) and a busy ring costs no doorbell at all. A
//! peer writing garbage into these words only causes spurious or missing
//! doorbells on its own traffic; the daemon's slow heartbeat tick still
//! drains the rings.
//!
//! A *record* (one VMPI buffer) starts at a slot boundary with an 8-byte
//! header `[len: u32][seq: u32]` (`seq` = the head count of its first slot)
//! followed by `len` bytes; it spans as many consecutive slots as it needs,
//! wrapping at the end of the data area. So a slot of 4 KiB (the page size,
//! as in IRATI's `VMPI_BUF_SIZE`) carries small SDUs one per slot and a
//! 64 KiB SDU takes 17 consecutive slots without any fragmentation header.
//!
//! *Restart* (where the producer is set to, [`Producer::set_restarts`]):
//! a producer that finds the ring empty (the consumer's tail
//! equals its head) and its head in the middle of the data area writes a
//! restart header `[u32::MAX][seq]` there, meaning "the rest of this lap is
//! unused", and puts the record at the first slot of the next lap. So a
//! flow whose reader keeps up reuses the first slots over and over: its
//! pages stay mapped and in cache, and a request/response flow touches a
//! few pages of its ring (an eighth of it), not all of them. The skipped
//! slots count as used until the consumer reads past the restart header,
//! so the restart is only taken when the record fits the slots before the
//! old head with an eighth of the ring to spare.
//!
//! Each side keeps its own index privately ([`Producer`] the head,
//! [`Consumer`] the tail) and only *publishes* it in the region, so a peer
//! overwriting our index cannot move us. Every value read from the region
//! (the peer's index, a record's length and sequence number) is validated
//! before use: a bad value is a [`RingError`], never a panic or an access
//! outside the region. A consumer that finds garbage resynchronises by
//! dropping everything published so far ([`Consumer::resync`]); the peer
//! only broke its own traffic.

use crate::buf::SduSource;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use thiserror::Error;

/// Bytes of a ring's header (head and tail on separate cache lines).
pub const RING_HEADER: usize = 128;
/// Bytes of a record's header.
pub const RECORD_HEADER: usize = 8;
/// Largest record a ring carries, whatever its size.
pub const MAX_RECORD: usize = 1 << 20;
/// The length word of a restart header: the rest of the lap is unused.
const RESTART: u32 = u32::MAX;

/// Why a ring operation failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RingError {
    /// The ring has no room for the record now (try again later).
    #[error("the ring is full")]
    Full,
    /// The record is empty or larger than the ring can ever hold.
    #[error("a record of {0} bytes cannot be carried by this ring")]
    BadSize(usize),
    /// The peer's index is further from ours than the ring is long.
    #[error(
        "the peer's index {peer} is inconsistent with ours ({ours}) in a ring of {slots} slots"
    )]
    BadIndex { peer: u32, ours: u32, slots: u32 },
    /// A record header does not belong at this place (wrong sequence number).
    #[error("record at slot count {at} carries sequence {seq}")]
    BadSequence { at: u32, seq: u32 },
    /// A record header announces a length the published slots cannot hold.
    #[error("record of {len} bytes does not fit the {avail} published slots (or the limit)")]
    BadLength { len: u32, avail: u32 },
    /// The record does not fit the caller's buffer.
    #[error("record of {len} bytes does not fit a buffer of {cap}")]
    BufferTooSmall { len: usize, cap: usize },
    /// The region is too small or misaligned for the layout asked for.
    #[error("region of {len} bytes cannot hold {what}")]
    Region { len: usize, what: String },
}

/// A byte region shared with a peer (an `mmap`ed file, a device BAR, or
/// memory of this process in tests). Copies are cheap handles to the same
/// memory; every access is bounds-checked.
#[derive(Debug, Clone, Copy)]
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is only accessed through atomics and bounds-checked
// raw copies (see `Region::new`); handles may move between threads.
unsafe impl Send for Region {}
// SAFETY: as above; no access through `&Region` creates a Rust reference to
// non-atomic shared data.
unsafe impl Sync for Region {}

impl Region {
    /// A region of `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes, aligned to 8
    /// bytes, for as long as this handle or any copy of it is used. Other
    /// parties (another process) may write to the memory at any time; this
    /// module never creates Rust references to it other than to atomics.
    pub unsafe fn new(ptr: NonNull<u8>, len: usize) -> Result<Region, RingError> {
        if !(ptr.as_ptr() as usize).is_multiple_of(8) {
            return Err(RingError::Region {
                len,
                what: "anything: it is not 8-byte aligned".into(),
            });
        }
        Ok(Region { ptr, len })
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The part `[off, off + len)`, if inside.
    pub fn sub(&self, off: usize, len: usize) -> Option<Region> {
        let end = off.checked_add(len)?;
        if end > self.len || !off.is_multiple_of(8) {
            return None;
        }
        // SAFETY: off < = self.len, so the pointer stays inside (or one past) the allocation.
        let p = unsafe { self.ptr.as_ptr().add(off) };
        Some(Region {
            ptr: NonNull::new(p)?,
            len,
        })
    }

    fn check(&self, off: usize, n: usize, align: usize) -> bool {
        off.is_multiple_of(align) && off.checked_add(n).is_some_and(|e| e <= self.len)
    }

    /// The atomic u32 at `off` (4-aligned, inside), or `None`.
    pub fn u32_at(&self, off: usize) -> Option<&AtomicU32> {
        if !self.check(off, 4, 4) {
            return None;
        }
        // SAFETY: inside the region and 4-aligned (the base is 8-aligned);
        // AtomicU32 has the size and alignment of u32 and any bit pattern is
        // valid; the memory lives as long as `self` (contract of `new`).
        Some(unsafe { &*(self.ptr.as_ptr().add(off) as *const AtomicU32) })
    }

    /// The atomic u64 at `off` (8-aligned, inside), or `None`.
    pub fn u64_at(&self, off: usize) -> Option<&AtomicU64> {
        if !self.check(off, 8, 8) {
            return None;
        }
        // SAFETY: as for `u32_at`, with 8-byte alignment.
        Some(unsafe { &*(self.ptr.as_ptr().add(off) as *const AtomicU64) })
    }

    /// Copies `dst.len()` bytes from `off`; false if outside.
    pub fn read(&self, off: usize, dst: &mut [u8]) -> bool {
        if !self.check(off, dst.len(), 1) {
            return false;
        }
        // SAFETY: the source range is inside the region (checked) and cannot
        // overlap `dst`, which is memory of this process borrowed mutably.
        // The peer may write the source concurrently; bytes have no invalid
        // values, so the worst outcome is garbage that the caller validates
        // (the ring's acquire/release indices order every honest write
        // before our read).
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), dst.as_mut_ptr(), dst.len())
        };
        true
    }

    /// Appends `n` bytes from `off` to `out` (into its spare capacity,
    /// which is not zeroed first); false, and `out` unchanged, if outside.
    pub fn append(&self, off: usize, n: usize, out: &mut Vec<u8>) -> bool {
        if !self.check(off, n, 1) {
            return false;
        }
        out.reserve(n);
        let spare = &mut out.spare_capacity_mut()[..n];
        // SAFETY: the source range is inside the region (checked); `spare`
        // is `n` bytes of `out`'s own allocation, distinct from the region.
        // After the copy those `n` bytes are initialised, so the length may
        // cover them. See `read` about concurrent peers.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(off),
                spare.as_mut_ptr().cast::<u8>(),
                n,
            );
            out.set_len(out.len() + n);
        }
        true
    }

    /// Copies `src` to `off`; false if outside.
    pub fn write(&self, off: usize, src: &[u8]) -> bool {
        if !self.check(off, src.len(), 1) {
            return false;
        }
        // SAFETY: the destination range is inside the region (checked) and
        // `src` is a distinct borrow; see `read` about concurrent peers.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(off), src.len())
        };
        true
    }

    /// Fills `[off, off + n)` with `byte`; false if outside.
    pub fn fill(&self, off: usize, n: usize, byte: u8) -> bool {
        if !self.check(off, n, 1) {
            return false;
        }
        // SAFETY: inside the region (checked).
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(off), byte, n) };
        true
    }
}

/// Memory of this process usable as a [`Region`] (tests, simulation).
#[derive(Debug)]
pub struct HeapRegion {
    mem: Box<[AtomicU64]>,
}

impl HeapRegion {
    /// `len` zeroed bytes (rounded up to a multiple of 8).
    pub fn new(len: usize) -> HeapRegion {
        let words = len.div_ceil(8);
        HeapRegion {
            mem: (0..words).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// A handle to it; valid while `self` lives.
    pub fn region(&self) -> Region {
        let ptr = NonNull::new(self.mem.as_ptr() as *mut u8).unwrap_or(NonNull::dangling());
        // SAFETY: the boxed atomics are 8-aligned, live as long as `self`,
        // and are interior-mutable, so writing through this pointer is allowed.
        unsafe { Region::new(ptr, self.mem.len() * 8) }.expect("a boxed u64 slice is 8-aligned")
    }
}

/// Geometry of a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes per slot (a power of two, 64..=65536).
    pub slot_size: u32,
    /// Number of slots (a power of two, 2..=65536).
    pub slots: u32,
}

impl Geometry {
    /// Checks the values (they may come from the peer).
    pub fn validate(self) -> Result<Geometry, RingError> {
        let ok = self.slot_size.is_power_of_two()
            && (64..=65_536).contains(&self.slot_size)
            && self.slots.is_power_of_two()
            && (2..=65_536).contains(&self.slots);
        if ok {
            Ok(self)
        } else {
            Err(RingError::Region {
                len: 0,
                what: format!(
                    "a ring of {} slots of {} bytes (both must be powers of two: slots 2..65536, size 64..65536)",
                    self.slots, self.slot_size
                ),
            })
        }
    }

    /// Bytes of the data area.
    pub fn data_bytes(self) -> usize {
        self.slots as usize * self.slot_size as usize
    }

    /// Bytes of the whole ring (header and data).
    pub fn ring_bytes(self) -> usize {
        RING_HEADER + self.data_bytes()
    }

    /// Largest record payload.
    pub fn max_record(self) -> usize {
        (self.data_bytes() - RECORD_HEADER).min(MAX_RECORD)
    }

    /// Slots a record of `len` payload bytes takes.
    fn slots_for(self, len: usize) -> u32 {
        (RECORD_HEADER + len).div_ceil(self.slot_size as usize) as u32
    }
}

/// The state shared by both ends of a ring.
#[derive(Debug, Clone, Copy)]
struct RingMem {
    region: Region,
    geo: Geometry,
}

impl RingMem {
    fn new(region: Region, geo: Geometry) -> Result<RingMem, RingError> {
        let geo = geo.validate()?;
        if region.len() < geo.ring_bytes() {
            return Err(RingError::Region {
                len: region.len(),
                what: format!("a ring of {} bytes", geo.ring_bytes()),
            });
        }
        Ok(RingMem { region, geo })
    }

    fn head(&self) -> &AtomicU32 {
        self.region.u32_at(0).expect("checked in new")
    }

    fn tail(&self) -> &AtomicU32 {
        self.region.u32_at(64).expect("checked in new")
    }

    fn producer_waiting(&self) -> &AtomicU32 {
        self.region.u32_at(8).expect("checked in new")
    }

    fn consumer_waiting(&self) -> &AtomicU32 {
        self.region.u32_at(72).expect("checked in new")
    }

    /// Clears `flag` if set; whether it was (after a full fence, so that a
    /// store made before by this side is ordered before the load).
    fn take_flag(flag: &AtomicU32) -> bool {
        fence(Ordering::SeqCst);
        flag.load(Ordering::Relaxed) != 0 && flag.swap(0, Ordering::AcqRel) != 0
    }

    /// The data area `[off, off + len)` (wrapping) as at most two raw
    /// segments of the region.
    fn segments(&self, off: usize, len: usize) -> Segments {
        let total = self.geo.data_bytes();
        let first = len.min(total - off);
        let base = self.region.ptr.as_ptr();
        // SAFETY: RingMem::new checked the region holds the header and the
        // whole data area; off < total and first + (len - first) = len <=
        // total, so both segments lie inside the data area.
        unsafe {
            Segments {
                parts: [
                    (base.add(RING_HEADER + off), first),
                    (base.add(RING_HEADER), len - first),
                ],
            }
        }
    }
}

/// A byte range of a ring's data area as at most two raw segments (the
/// second one empty unless the range wraps), for a system call to read
/// into or write from without an intermediate copy. The memory is shared
/// with the peer, which may write it at any time: it must only be handed to
/// the kernel or copied, never borrowed as a Rust slice.
#[derive(Debug, Clone, Copy)]
pub struct Segments {
    parts: [(*mut u8, usize); 2],
}

impl Segments {
    /// The non-empty segments, as (pointer, length).
    pub fn parts(&self) -> impl Iterator<Item = (*mut u8, usize)> + '_ {
        self.parts.iter().copied().filter(|&(_, n)| n > 0)
    }

    /// Total bytes.
    pub fn len(&self) -> usize {
        self.parts[0].1 + self.parts[1].1
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The same bytes less the first `n` (all of them if fewer).
    pub fn skip(&self, n: usize) -> Segments {
        let a = n.min(self.parts[0].1);
        let b = (n - a).min(self.parts[1].1);
        let (p0, l0) = self.parts[0];
        let (p1, l1) = self.parts[1];
        // SAFETY: a <= l0 and b <= l1, so the pointers stay inside (or one
        // past the end of) their segments.
        unsafe {
            Segments {
                parts: [(p0.add(a), l0 - a), (p1.add(b), l1 - b)],
            }
        }
    }

    /// The first `n` bytes (all of them if fewer).
    pub fn prefix(&self, n: usize) -> Segments {
        let a = n.min(self.parts[0].1);
        let b = (n - a).min(self.parts[1].1);
        Segments {
            parts: [(self.parts[0].0, a), (self.parts[1].0, b)],
        }
    }

    /// Copies the bytes at offset `off` into `dst`; false (and nothing
    /// copied) if they are not all there.
    pub fn read_at(&self, off: usize, dst: &mut [u8]) -> bool {
        if off.checked_add(dst.len()).is_none_or(|e| e > self.len()) {
            return false;
        }
        let mut rest = &mut dst[..];
        for (ptr, n) in self.skip(off).parts() {
            let k = n.min(rest.len());
            let (now, later) = rest.split_at_mut(k);
            // SAFETY: the segment has n >= k bytes inside the ring; `now`
            // is memory of this process, not in the ring. A peer may write
            // the ring meanwhile: bytes have no invalid values.
            unsafe { std::ptr::copy_nonoverlapping(ptr, now.as_mut_ptr(), k) };
            rest = later;
        }
        true
    }

    /// Copies `src` to offset `off`; false (and nothing written) if it
    /// does not fit.
    pub fn write_at(&self, off: usize, src: &[u8]) -> bool {
        if off.checked_add(src.len()).is_none_or(|e| e > self.len()) {
            return false;
        }
        let mut rest = src;
        for (ptr, n) in self.skip(off).parts() {
            let k = n.min(rest.len());
            // SAFETY: the segment has n >= k bytes inside the ring; `rest`
            // is memory of this process, not in the ring.
            unsafe { std::ptr::copy_nonoverlapping(rest.as_ptr(), ptr, k) };
            rest = &rest[k..];
        }
        true
    }
}

impl Segments {
    /// A copy of the bytes (for a capture).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        for (src, n) in self.parts() {
            let at = v.len();
            v.resize(at + n, 0);
            // SAFETY: the segment has n bytes inside a ring's data area (see
            // `Segments`); `v` has n bytes from `at`, memory of this process.
            // A peer may write the ring meanwhile: bytes have no invalid
            // values.
            unsafe { std::ptr::copy_nonoverlapping(src, v.as_mut_ptr().add(at), n) };
        }
        v
    }

    /// Copies all of `self` to the start of `dst` (ring memory to ring
    /// memory, for example an application's ring to a VMPI ring); false
    /// (and nothing copied) if `dst` is shorter.
    pub fn copy_to(&self, dst: &Segments) -> bool {
        if dst.len() < self.len() {
            return false;
        }
        let mut off = 0;
        for (src, n) in self.parts() {
            let mut done = 0;
            for (d, m) in dst.skip(off + done).parts() {
                if done == n {
                    break;
                }
                let k = m.min(n - done);
                // SAFETY: `src` has n bytes and `d` m >= k bytes, both inside
                // ring data areas (see `Segments`); the two rings are
                // distinct memory, so the ranges do not overlap. A peer may
                // write either concurrently: bytes have no invalid values.
                unsafe { std::ptr::copy_nonoverlapping(src.add(done), d, k) };
                done += k;
            }
            off += n;
        }
        true
    }
}

impl RingMem {
    /// Byte offset in the region of the data at slot count `idx` plus `skip`.
    fn data_off(&self, idx: u32, skip: usize) -> usize {
        let start = (idx & (self.geo.slots - 1)) as usize * self.geo.slot_size as usize;
        (start + skip) % self.geo.data_bytes()
    }

    /// Copies `dst` from the data area starting at `off` (wrapping).
    fn read_wrapped(&self, off: usize, dst: &mut [u8]) -> bool {
        let total = self.geo.data_bytes();
        let first = dst.len().min(total - off);
        let (a, b) = dst.split_at_mut(first);
        self.region.read(RING_HEADER + off, a) && self.region.read(RING_HEADER, b)
    }

    /// Appends `n` bytes of the data area starting at `off` (wrapping) to
    /// `out`.
    fn append_wrapped(&self, off: usize, n: usize, out: &mut Vec<u8>) -> bool {
        let total = self.geo.data_bytes();
        let first = n.min(total.saturating_sub(off));
        let before = out.len();
        let ok = self.region.append(RING_HEADER + off, first, out)
            && self.region.append(RING_HEADER, n - first, out);
        if !ok {
            out.truncate(before);
        }
        ok
    }

    /// Copies `src` to the data area starting at `off` (wrapping); returns the next offset.
    fn write_wrapped(&self, off: usize, src: &[u8]) -> usize {
        let total = self.geo.data_bytes();
        let first = src.len().min(total - off);
        self.region.write(RING_HEADER + off, &src[..first]);
        self.region.write(RING_HEADER, &src[first..]);
        (off + src.len()) % total
    }
}

/// The payload of the record a [`Consumer`] peeked at, read in place.
#[derive(Debug)]
pub struct Record<'a> {
    ring: &'a Consumer,
    len: usize,
}

impl SduSource for Record<'_> {
    fn len(&self) -> usize {
        self.len
    }

    fn append_to(&self, at: usize, n: usize, out: &mut Vec<u8>) -> bool {
        if at.checked_add(n).is_none_or(|end| end > self.len) {
            return false;
        }
        let mem = &self.ring.mem;
        mem.append_wrapped(mem.data_off(self.ring.tail, RECORD_HEADER + at), n, out)
    }
}

/// The writing end of a ring.
#[derive(Debug)]
pub struct Producer {
    mem: RingMem,
    head: u32,
    restarts: bool,
    /// Slots this producer fills at most (all of them unless limited).
    limit: u32,
    /// The first slot of the record reserved, past a restart the
    /// reservation takes: the restart is made only when the record is
    /// committed, so a reservation given up leaves the ring as it was.
    reserved: Option<u32>,
}

impl Producer {
    /// The producer of the ring laid out in `region`, resuming from the head
    /// published there (a fresh ring has zeroes).
    pub fn new(region: Region, geo: Geometry) -> Result<Producer, RingError> {
        let mem = RingMem::new(region, geo)?;
        let head = mem.head().load(Ordering::Acquire);
        let limit = mem.geo.slots;
        Ok(Producer {
            mem,
            head,
            restarts: false,
            limit,
            reserved: None,
        })
    }

    /// Lets this producer fill at most `slots` of the ring's slots (at most
    /// all of them): a record that would take the slots in use past that
    /// finds the ring full, so [`Producer::arm`] and the consumer's
    /// doorbell work as for a full ring. A record always goes into an
    /// empty ring, so one larger than the limit is not refused for good.
    /// A flow's send ring is its send buffer, and a whole ring ahead of a
    /// slow path is seconds of data queued in front of it (see
    /// `flow_rings::SEND_LIMIT`).
    pub fn set_limit(&mut self, slots: u32) {
        self.limit = slots.min(self.mem.geo.slots);
    }

    /// The slots this producer fills at most.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Makes this producer restart at the first slot of the next lap when
    /// it finds the ring empty (see the module's documentation): for a
    /// ring per flow, whose pages should stay few. A link carrying bursts
    /// for many flows keeps its whole capacity instead. The consumer
    /// follows restarts whether or not its producer makes them.
    pub fn set_restarts(&mut self, on: bool) {
        self.restarts = on;
    }

    /// Geometry of the ring.
    pub fn geometry(&self) -> Geometry {
        self.mem.geo
    }

    /// Its private head (slots published so far).
    pub fn head(&self) -> u32 {
        self.head
    }

    /// Starts again from the head published in the region (after the peer
    /// reset the ring).
    pub fn adopt(&mut self) {
        self.head = self.mem.head().load(Ordering::Acquire);
    }

    /// Free slots, as far as the peer's tail can be trusted.
    pub fn free_slots(&self) -> Result<u32, RingError> {
        let tail = self.mem.tail().load(Ordering::Acquire);
        let used = self.head.wrapping_sub(tail);
        if used > self.mem.geo.slots {
            return Err(RingError::BadIndex {
                peer: tail,
                ours: self.head,
                slots: self.mem.geo.slots,
            });
        }
        Ok(self.mem.geo.slots - used)
    }

    /// Checks there is room for a record of `len` payload bytes, within
    /// the limit.
    fn make_room(&mut self, len: usize) -> Result<(), RingError> {
        self.check_room(len, true)
    }

    /// Checks there is room for a record of `len` payload bytes, within the
    /// limit if `limited`.
    fn check_room(&mut self, len: usize, limited: bool) -> Result<(), RingError> {
        if len == 0 || len > self.mem.geo.max_record() {
            return Err(RingError::BadSize(len));
        }
        let need = self.mem.geo.slots_for(len);
        let tail = self.mem.tail().load(Ordering::Acquire);
        let ahead = tail.wrapping_sub(self.head);
        if ahead != 0 && ahead <= self.mem.geo.slots {
            // The consumer skipped past our head (it resynchronised on
            // garbage published in our name): continue from its tail.
            self.head = tail;
        }
        let free = self.free_slots()?;
        let used = self.mem.geo.slots - free;
        if need > free || (limited && used > 0 && used + need > self.limit) {
            return Err(RingError::Full);
        }
        Ok(())
    }

    /// Reserves room for a record of at most `max` payload bytes and
    /// returns where its payload goes, for the caller to fill (for example
    /// with one `recvmsg` straight from a socket); [`Producer::commit`]
    /// then publishes the bytes actually written. Nothing is published,
    /// nor the ring changed, until then: a reservation not committed is
    /// simply given up, and a second one replaces the first.
    pub fn reserve(&mut self, max: usize) -> Result<Segments, RingError> {
        self.make_room(max)?;
        let at = self.restart_to(max).unwrap_or(self.head);
        self.reserved = Some(at);
        Ok(self.mem.segments(self.mem.data_off(at, RECORD_HEADER), max))
    }

    /// Publishes the record reserved by the last [`Producer::reserve`]
    /// (of `max` bytes) with its first `len` bytes.
    pub fn commit(&mut self, max: usize, len: usize) -> Result<(), RingError> {
        if len == 0 || len > max {
            return Err(RingError::BadSize(len));
        }
        let at = self.reserved.take().unwrap_or(self.head);
        self.move_head(at);
        // The room checked at reservation can only have grown since (the
        // consumer frees slots, never takes them), unless the peer wrote
        // garbage over its tail: check again. Not against the limit: a
        // restart made the slots it skips count as used until the
        // consumer reads past them, and the limit was met before it.
        self.check_room(len, false)?;
        self.write_header(len);
        self.publish(len);
        Ok(())
    }

    /// Where a record of `len` bytes goes past a restart, if it is to take
    /// one: on an empty ring with the head in the middle of the data area,
    /// the start of the next lap, if the record fits the slots before the
    /// head with an eighth of the ring to spare.
    fn restart_to(&self, len: usize) -> Option<u32> {
        let slots = self.mem.geo.slots;
        let pos = self.head & (slots - 1);
        if !self.restarts {
            return None;
        }
        // Until the consumer reads past the restart header, the slots it
        // skips count as used: restart only if an eighth of the ring stays
        // free meanwhile.
        let need = self.mem.geo.slots_for(len);
        if pos < need || pos - need < (slots / 8).max(1) {
            return None;
        }
        if self.mem.tail().load(Ordering::Acquire) != self.head {
            return None;
        }
        Some(self.head.wrapping_add(slots - pos))
    }

    /// Puts the next record at slot count `at`: past a restart (see
    /// [`Producer::restart_to`]) if it is not the head, with a restart
    /// header at the head saying the rest of this lap is unused.
    fn move_head(&mut self, at: u32) {
        if at == self.head {
            return;
        }
        let mut hdr = [0u8; RECORD_HEADER];
        hdr[..4].copy_from_slice(&RESTART.to_le_bytes());
        hdr[4..].copy_from_slice(&self.head.to_le_bytes());
        self.mem
            .write_wrapped(self.mem.data_off(self.head, 0), &hdr);
        self.head = at;
    }

    fn write_header(&self, len: usize) {
        let mut hdr = [0u8; RECORD_HEADER];
        hdr[..4].copy_from_slice(&(len as u32).to_le_bytes());
        hdr[4..].copy_from_slice(&self.head.to_le_bytes());
        self.mem
            .write_wrapped(self.mem.data_off(self.head, 0), &hdr);
    }

    fn publish(&mut self, len: usize) {
        self.head = self.head.wrapping_add(self.mem.geo.slots_for(len));
        self.mem.head().store(self.head, Ordering::Release);
    }

    /// After publishing: whether the consumer asked for a doorbell (it
    /// found the ring empty and sleeps); its request is cleared.
    pub fn take_wakeup(&self) -> bool {
        RingMem::take_flag(self.mem.consumer_waiting())
    }

    /// The ring is full and this producer is about to sleep until the
    /// consumer rings: asks for that doorbell, then looks once more.
    /// Returns true if the ring still has no room for `len` bytes (sleep),
    /// false if room appeared meanwhile (try again now). A tail the
    /// consumer published that no honest one could is no room either: the
    /// caller sleeps until the consumer rings or its next tick, instead of
    /// trying again at once, over and over, for as long as the garbage
    /// stays.
    pub fn arm(&mut self, len: usize) -> bool {
        self.mem.producer_waiting().store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.make_room(len).is_err()
    }

    /// Publishes one record made of `parts` laid end to end.
    pub fn push(&mut self, parts: &[&[u8]]) -> Result<(), RingError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        self.make_room(len)?;
        self.reserved = None;
        self.move_head(self.restart_to(len).unwrap_or(self.head));
        let mut hdr = [0u8; RECORD_HEADER];
        hdr[..4].copy_from_slice(&(len as u32).to_le_bytes());
        hdr[4..].copy_from_slice(&self.head.to_le_bytes());
        let mut off = self
            .mem
            .write_wrapped(self.mem.data_off(self.head, 0), &hdr);
        for p in parts {
            off = self.mem.write_wrapped(off, p);
        }
        self.publish(len);
        Ok(())
    }
}

/// The reading end of a ring.
#[derive(Debug)]
pub struct Consumer {
    mem: RingMem,
    tail: u32,
}

impl Consumer {
    /// The consumer of the ring laid out in `region`, resuming from the tail
    /// published there.
    pub fn new(region: Region, geo: Geometry) -> Result<Consumer, RingError> {
        let mem = RingMem::new(region, geo)?;
        let tail = mem.tail().load(Ordering::Acquire);
        Ok(Consumer { mem, tail })
    }

    /// Geometry of the ring.
    pub fn geometry(&self) -> Geometry {
        self.mem.geo
    }

    /// Its private tail.
    pub fn tail(&self) -> u32 {
        self.tail
    }

    /// Starts again from the tail published in the region.
    pub fn adopt(&mut self) {
        self.tail = self.mem.tail().load(Ordering::Acquire);
    }

    /// Drops everything published so far (after garbage was found). A head
    /// that is itself implausible is not adopted (publishing it as our tail
    /// would wedge an honest producer): we wait for the producer to publish
    /// a sane one, which its next record does.
    pub fn resync(&mut self) {
        let head = self.mem.head().load(Ordering::Acquire);
        if head.wrapping_sub(self.tail) <= self.mem.geo.slots {
            self.tail = head;
        }
        self.mem.tail().store(self.tail, Ordering::Release);
    }

    /// Slots published and not yet consumed.
    pub fn available(&self) -> Result<u32, RingError> {
        let head = self.mem.head().load(Ordering::Acquire);
        let avail = head.wrapping_sub(self.tail);
        if avail > self.mem.geo.slots {
            return Err(RingError::BadIndex {
                peer: head,
                ours: self.tail,
                slots: self.mem.geo.slots,
            });
        }
        Ok(avail)
    }

    /// Validates the next record; its length, or `None` if the ring is
    /// empty. Nothing is consumed.
    fn next_len(&mut self) -> Result<Option<usize>, RingError> {
        let avail = self.available()?;
        if avail == 0 {
            // Keep our published tail right even if the peer overwrote it,
            // so an honest producer is never left looking at garbage.
            if self.mem.tail().load(Ordering::Relaxed) != self.tail {
                self.mem.tail().store(self.tail, Ordering::Release);
            }
            return Ok(None);
        }
        let (mut len, mut avail) = (self.header()?, avail);
        if len == RESTART {
            // The producer restarted at the next lap: skip the rest of this
            // one (privately; the tail is published with the next record
            // consumed).
            let slots = self.mem.geo.slots;
            let rest = slots - (self.tail & (slots - 1));
            if rest >= avail || rest == slots {
                return Err(RingError::BadLength { len, avail });
            }
            self.tail = self.tail.wrapping_add(rest);
            avail -= rest;
            len = self.header()?;
        }
        let n = len as usize;
        if n == 0 || n > self.mem.geo.max_record() || self.mem.geo.slots_for(n) > avail {
            return Err(RingError::BadLength { len, avail });
        }
        Ok(Some(n))
    }

    /// The length word of the header at the tail, after checking its
    /// sequence number.
    fn header(&self) -> Result<u32, RingError> {
        let mut hdr = [0u8; RECORD_HEADER];
        let off = self.mem.data_off(self.tail, 0);
        if !self.mem.read_wrapped(off, &mut hdr) {
            return Err(RingError::BadLength { len: 0, avail: 0 });
        }
        let len = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
        let seq = u32::from_le_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]);
        if seq != self.tail {
            return Err(RingError::BadSequence { at: self.tail, seq });
        }
        Ok(len)
    }

    /// Takes the next record into `buf`; its length, or `None` if the ring
    /// is empty. On error nothing is consumed; call [`Consumer::resync`] to
    /// go on past garbage.
    pub fn pop(&mut self, buf: &mut [u8]) -> Result<Option<usize>, RingError> {
        let Some(n) = self.next_len()? else {
            return Ok(None);
        };
        if n > buf.len() {
            return Err(RingError::BufferTooSmall {
                len: n,
                cap: buf.len(),
            });
        }
        let off = self.mem.data_off(self.tail, RECORD_HEADER);
        if !self.mem.read_wrapped(off, &mut buf[..n]) {
            return Err(RingError::BadLength {
                len: n as u32,
                avail: 0,
            });
        }
        self.advance(n);
        Ok(Some(n))
    }

    /// The next record without taking it: where its payload lies, to copy
    /// a prefix with [`Consumer::read`] or hand it to a system call. The
    /// caller then calls [`Consumer::consume`]. The peer can rewrite the
    /// payload meanwhile (it only spoils its own record); the length was
    /// checked and stays valid.
    pub fn peek(&mut self) -> Result<Option<Segments>, RingError> {
        let Some(n) = self.next_len()? else {
            return Ok(None);
        };
        Ok(Some(
            self.mem
                .segments(self.mem.data_off(self.tail, RECORD_HEADER), n),
        ))
    }

    /// Copies the first `dst.len()` bytes of the record seen by
    /// [`Consumer::peek`] (of `len` bytes) into `dst`; false if longer.
    pub fn read(&self, len: usize, dst: &mut [u8]) -> bool {
        dst.len() <= len
            && self
                .mem
                .read_wrapped(self.mem.data_off(self.tail, RECORD_HEADER), dst)
    }

    /// The record seen by [`Consumer::peek`] (of `len` bytes) as an
    /// [`SduSource`]: a normal IPCP copies its fragments from the ring
    /// straight into their PDUs' buffers.
    pub fn record(&self, len: usize) -> Record<'_> {
        Record { ring: self, len }
    }

    /// Releases the record seen by [`Consumer::peek`] (of `len` bytes).
    pub fn consume(&mut self, len: usize) {
        self.advance(len);
    }

    fn advance(&mut self, n: usize) {
        self.tail = self.tail.wrapping_add(self.mem.geo.slots_for(n));
        self.mem.tail().store(self.tail, Ordering::Release);
    }

    /// The ring looked empty and this consumer is about to sleep until the
    /// producer rings: asks for that doorbell, then looks once more.
    /// Returns true if the ring is still empty (sleep), false if a record
    /// came meanwhile (read on). Garbage counts as not empty, so that the
    /// caller reads it and resynchronises.
    pub fn arm(&self) -> bool {
        self.mem.consumer_waiting().store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        matches!(self.available(), Ok(0))
    }

    /// After consuming: whether the producer asked for a doorbell (it found
    /// the ring full and sleeps); its request is cleared.
    pub fn take_wakeup(&self) -> bool {
        RingMem::take_flag(self.mem.producer_waiting())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GEO: Geometry = Geometry {
        slot_size: 64,
        slots: 8,
    };

    fn pair(mem: &HeapRegion) -> (Producer, Consumer) {
        let r = mem.region();
        let mut p = Producer::new(r, GEO).unwrap();
        p.set_restarts(true);
        (p, Consumer::new(r, GEO).unwrap())
    }

    /// Whether the record at the consumer's tail, of `len` bytes, crosses
    /// the end of the data area.
    fn wraps(c: &Consumer, len: usize) -> bool {
        c.mem.data_off(c.tail(), 0) + RECORD_HEADER + len > GEO.data_bytes()
    }

    #[test]
    fn segments_copy_between_rings_across_both_wraps() {
        let (ma, mb) = (
            HeapRegion::new(GEO.ring_bytes()),
            HeapRegion::new(GEO.ring_bytes()),
        );
        let (mut pa, mut ca) = pair(&ma);
        let (mut pb, mut cb) = pair(&mb);
        let mut buf = [0u8; 512];
        // One record stays in each ring, so that they never empty (and
        // never restart at their first slot): records wrap at the end.
        pa.push(&[&[1u8; 10]]).unwrap();
        pb.push(&[&[2u8; 10]]).unwrap();
        let mut behind = vec![1u8; 10];
        let (mut wrapped_src, mut wrapped_dst) = (false, false);
        for k in 0..11u8 {
            let len = 60 + 17 * usize::from(k);
            let rec: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(k + 1)).collect();
            pa.push(&[&rec]).unwrap();
            if k % 3 == 0 {
                // Offset the two rings differently so that source and
                // destination wrap at different points.
                pb.push(&[&[9u8; 70]]).unwrap();
                assert_eq!(cb.pop(&mut buf).unwrap(), Some(10));
                pb.push(&[&[2u8; 10]]).unwrap();
                assert_eq!(cb.pop(&mut buf).unwrap(), Some(70));
            }
            // Take the older record of ring a.
            assert_eq!(ca.pop(&mut buf).unwrap(), Some(behind.len()));
            assert_eq!(&buf[..behind.len()], &behind[..]);
            behind = rec.clone();
            wrapped_src |= wraps(&ca, len);
            let src = ca.peek().unwrap().unwrap();
            assert_eq!(src.len(), len);
            // Any range of it reads back, across the wrap or not.
            let mut part = vec![0u8; len - 7];
            assert!(src.read_at(5, &mut part));
            assert_eq!(part, rec[5..len - 2]);
            assert!(!src.read_at(len - 3, &mut [0u8; 4]), "past the end");
            let dst = pb.reserve(len).unwrap();
            assert!(!src.copy_to(&dst.skip(dst.len() - len + 1)), "too short");
            assert!(src.copy_to(&dst));
            pb.commit(len, len).unwrap();
            pb.push(&[&[2u8; 10]]).unwrap();
            // Leave the record in ring a: it is popped next round.
            assert_eq!(cb.pop(&mut buf).unwrap(), Some(10));
            wrapped_dst |= wraps(&cb, len);
            assert_eq!(cb.pop(&mut buf).unwrap(), Some(len));
            assert_eq!(&buf[..len], &rec[..]);
        }
        assert!(wrapped_src && wrapped_dst, "no record crossed the end");
    }

    #[test]
    fn a_record_read_in_place_gives_any_range_across_the_wrap() {
        let mem = HeapRegion::new(GEO.ring_bytes());
        let (mut p, mut c) = pair(&mem);
        let mut buf = [0u8; 512];
        // One record always stays behind, so the ring never restarts and
        // records cross the end of the data area.
        p.push(&[b"lead"]).unwrap();
        let mut wrapped = false;
        for k in 0..12u8 {
            let len = 90 + 13 * usize::from(k);
            let rec: Vec<u8> = (0..len).map(|i| (i as u8) ^ k.wrapping_mul(37)).collect();
            p.push(&[&rec]).unwrap();
            c.pop(&mut buf).unwrap().unwrap();
            wrapped |= wraps(&c, len);
            assert_eq!(c.peek().unwrap().unwrap().len(), len);
            let r = c.record(len);
            assert_eq!(SduSource::len(&r), len);
            // The whole record, and pieces of it as fragments are taken.
            for (at, n) in [(0, len), (0, 7), (5, 60), (len - 1, 1), (len, 0)] {
                let mut out = vec![0xee];
                assert!(r.append_to(at, n, &mut out), "{at}+{n} of {len}");
                assert_eq!(out[0], 0xee);
                assert_eq!(&out[1..], &rec[at..at + n], "{at}+{n} of {len}");
            }
            // Past the record's end: nothing, and `out` untouched.
            let mut out = vec![1, 2];
            assert!(!r.append_to(len - 3, 4, &mut out));
            assert!(!r.append_to(usize::MAX, 2, &mut out));
            assert_eq!(out, [1, 2]);
        }
        assert!(wrapped, "no record crossed the end");
    }

    #[test]
    fn records_pass_in_order_and_span_slots_with_wrap() {
        let mem = HeapRegion::new(GEO.ring_bytes());
        let (mut p, mut c) = pair(&mem);
        let mut buf = vec![0u8; 1024];
        assert_eq!(c.pop(&mut buf).unwrap(), None);
        // One record is always left in the ring, so it never restarts.
        p.push(&[b"lead"]).unwrap();
        let mut behind = b"lead".to_vec();
        let mut wrapped = false;
        for round in 0..50u32 {
            // Sizes that take 1, 2 and 3 slots, crossing the end of the ring.
            let sizes = [10usize, 100, 150];
            for (k, &s) in sizes.iter().enumerate() {
                let data: Vec<u8> = (0..s)
                    .map(|i| (i as u32 + round + k as u32) as u8)
                    .collect();
                p.push(&[&data[..3], &data[3..]]).unwrap();
                let n = c.pop(&mut buf).unwrap().unwrap();
                assert_eq!(&buf[..n], &behind[..], "round {round} size {s}");
                wrapped |= wraps(&c, s);
                behind = data;
            }
        }
        assert!(wrapped, "no record crossed the end");
    }

    #[test]
    fn an_empty_ring_restarts_at_its_first_slot_when_the_record_fits_before() {
        let mem = HeapRegion::new(GEO.ring_bytes());
        let (mut p, mut c) = pair(&mem);
        let mut buf = [0u8; 600];
        // 100 bytes take 2 slots: the head goes to 2, then 4.
        p.push(&[&[1u8; 100]]).unwrap();
        p.push(&[&[2u8; 100]]).unwrap();
        assert_eq!(c.pop(&mut buf).unwrap(), Some(100));
        // Not empty: no restart, the record follows at slot 4.
        p.push(&[&[3u8; 10]]).unwrap();
        assert_eq!(p.head(), 5);
        assert_eq!(c.pop(&mut buf).unwrap(), Some(100));
        assert_eq!(buf[0], 2);
        assert_eq!(c.pop(&mut buf).unwrap(), Some(10));
        // Empty, head at slot 5: a 3-slot record restarts at slot 8 (the
        // first slot of the next lap), a restart header at slot 5.
        p.push(&[&[4u8; 150]]).unwrap();
        assert_eq!(p.head(), 11);
        assert_eq!(c.available().unwrap(), 6, "the skipped slots count");
        assert_eq!(c.pop(&mut buf).unwrap(), Some(150));
        assert_eq!(&buf[..150], &[4u8; 150][..]);
        assert_eq!(c.tail(), 11);
        assert_eq!(c.pop(&mut buf).unwrap(), None);
        // Empty at slot 3: a record of 4 slots does not fit before it, so it
        // goes on from slot 3 (and wraps).
        p.push(&[&[5u8; 200]]).unwrap();
        assert_eq!(p.head(), 15);
        assert_eq!(c.pop(&mut buf).unwrap(), Some(200));
        assert_eq!(&buf[..200], &[5u8; 200][..]);
        // A request/response exchange stays in the first two slots (with 8
        // slots, a restart keeps one free).
        for k in 0..20u8 {
            p.push(&[&[k; 30]]).unwrap();
            assert!(p.head() & (GEO.slots - 1) <= 2, "round {k}");
            assert_eq!(c.pop(&mut buf).unwrap(), Some(30));
            assert_eq!(buf[..30], [k; 30]);
        }
        // A reservation restarts too; its commit publishes the restart.
        assert_eq!(p.head() & (GEO.slots - 1), 2);
        let seg = p.reserve(40).unwrap();
        assert_eq!(seg.len(), 40);
        p.commit(40, 20).unwrap();
        assert_eq!(p.head() & (GEO.slots - 1), 1);
        assert_eq!(c.pop(&mut buf).unwrap(), Some(20));
    }

    #[test]
    fn a_forged_restart_is_an_error_and_resync_recovers() {
        let mem = HeapRegion::new(GEO.ring_bytes());
        let (mut p, mut c) = pair(&mem);
        let r = mem.region();
        let mut buf = [0u8; 600];
        p.push(&[&[1u8; 10]]).unwrap();
        // A restart header at slot 0 (a whole lap) is refused.
        r.write(RING_HEADER, &RESTART.to_le_bytes());
        assert!(matches!(c.pop(&mut buf), Err(RingError::BadLength { .. })));
        c.resync();
        assert_eq!(c.pop(&mut buf).unwrap(), None);
        // A restart at slot 1 whose lap is not all published is refused.
        p.push(&[&[2u8; 100]]).unwrap();
        assert_eq!((c.tail(), p.head()), (1, 3));
        r.write(RING_HEADER + 64, &RESTART.to_le_bytes());
        assert!(matches!(c.pop(&mut buf), Err(RingError::BadLength { .. })));
        c.resync();
        // A restart followed by a header that is not the next lap's.
        let t = c.tail();
        assert_eq!(t, 3);
        let mut hdr = RESTART.to_le_bytes().to_vec();
        hdr.extend_from_slice(&t.to_le_bytes());
        r.write(RING_HEADER + c.mem.data_off(t, 0), &hdr);
        r.u32_at(0).unwrap().store(t + 5 + 1, Ordering::Release);
        assert!(matches!(
            c.pop(&mut buf),
            Err(RingError::BadSequence { at: 8, .. })
        ));
        c.resync();
        // The honest producer goes on.
        p.adopt();
        p.push(&[b"fine"]).unwrap();
        assert_eq!(c.pop(&mut buf).unwrap(), Some(4));
        assert_eq!(&buf[..4], b"fine");
    }

    #[test]
    fn full_ring_refuses_then_accepts_after_consumption() {
        let mem = HeapRegion::new(GEO.ring_bytes());
        let (mut p, mut c) = pair(&mem);
        let rec = [7u8; 100]; // 2 slots each
        for _ in 0..4 {
            p.push(&[&rec]).unwrap();
        }
        assert_eq!(p.push(&[&rec]), Err(RingError::Full));
        let mut buf = [0u8; 200];
        assert_eq!(c.pop(&mut buf).unwrap(), Some(100));
        p.push(&[&rec]).unwrap();
        assert_eq!(p.push(&[&[]]), Err(RingError::BadSize(0)));
        let too_big = vec![0u8; GEO.max_record() + 1];
        assert_eq!(
            p.push(&[&too_big]),
            Err(RingError::BadSize(GEO.max_record() + 1))
        );
        // The largest record fills the whole ring once it is empty.
        while c.pop(&mut buf).unwrap().is_some() {}
        let max = vec![9u8; GEO.max_record()];
        p.push(&[&max]).unwrap();
        let mut big = vec![0u8; GEO.max_record()];
        assert_eq!(c.pop(&mut big).unwrap(), Some(max.len()));
        assert_eq!(big, max);
    }

    #[test]
    fn a_limited_producer_fills_only_its_share_and_the_consumer_rings_it() {
        let mem = HeapRegion::new(GEO.ring_bytes());
        let (mut p, mut c) = pair(&mem);
        p.set_restarts(false);
        p.set_limit(5);
        assert_eq!(p.limit(), 5);
        let rec = [7u8; 100]; // 2 slots each
        p.push(&[&rec]).unwrap();
        p.push(&[&rec]).unwrap();
        // A third would take 6 of the 8 slots: over the limit, so the
        // producer sleeps, asking for the doorbell.
        assert_eq!(p.push(&[&rec]), Err(RingError::Full));
        assert!(p.arm(rec.len()), "still no room: sleep");
        let mut buf = [0u8; 600];
        assert_eq!(c.pop(&mut buf).unwrap(), Some(100));
        assert!(c.take_wakeup(), "the consumer rings the sleeping producer");
        p.push(&[&rec]).unwrap();
        // A record larger than the limit still goes into an empty ring.
        while c.pop(&mut buf).unwrap().is_some() {}
        let big = [1u8; 400]; // 7 slots
        p.push(&[&big]).unwrap();
        assert_eq!(p.push(&[&[2u8; 10]]), Err(RingError::Full));
        assert_eq!(c.pop(&mut buf).unwrap(), Some(400));
        // A limit above the ring is the ring.
        p.set_limit(1000);
        assert_eq!(p.limit(), GEO.slots);
        for _ in 0..4 {
            p.push(&[&rec]).unwrap();
        }
    }

    /// A producer that restarts, limited to 3 slots, with its head in the
    /// middle of the data area and the ring empty.
    fn limited_in_mid_lap(mem: &HeapRegion) -> (Producer, Consumer) {
        let (mut p, mut c) = pair(mem);
        p.set_restarts(true);
        p.set_limit(3);
        let mut buf = [0u8; 64];
        for _ in 0..5 {
            p.push(&[&[3u8; 40]]).unwrap();
            assert_eq!(c.pop(&mut buf).unwrap(), Some(40));
        }
        (p, c)
    }

    #[test]
    fn a_limited_producer_that_restarts_commits_what_it_reserved() {
        let mem = HeapRegion::new(GEO.ring_bytes());
        let (mut p, mut c) = limited_in_mid_lap(&mem);
        let mut buf = [0u8; 600];
        // The reservation restarts at the next lap: the three slots it
        // skips count as used, which with the record is over the limit,
        // and still the record reserved is published.
        let room = p.reserve(50).unwrap();
        assert!(room.write_at(0, &[9u8; 20]));
        p.commit(50, 20).unwrap();
        assert_eq!(c.pop(&mut buf).unwrap(), Some(20));
        assert_eq!(&buf[..20], &[9u8; 20]);
        // And the next reservation, past the restart, is within the limit.
        let room = p.reserve(50).unwrap();
        assert!(room.write_at(0, b"next"));
        p.commit(50, 4).unwrap();
        assert_eq!(c.pop(&mut buf).unwrap(), Some(4));
        assert_eq!(&buf[..4], b"next");
    }

    #[test]
    fn a_reservation_given_up_leaves_the_ring_as_it_was() {
        let mem = HeapRegion::new(GEO.ring_bytes());
        let (mut p, mut c) = limited_in_mid_lap(&mem);
        let mut buf = [0u8; 600];
        let head = p.head();
        // A reservation that would restart, not committed (the bytes went
        // elsewhere): the head stays, and nothing counts as used.
        p.reserve(50).unwrap();
        assert_eq!(p.head(), head);
        assert_eq!(p.free_slots().unwrap(), GEO.slots);
        // So a record pushed next is within the limit, and read.
        p.push(&[b"pushed"]).unwrap();
        assert_eq!(c.pop(&mut buf).unwrap(), Some(6));
        assert_eq!(&buf[..6], b"pushed");
        // Given up again, then a reservation committed: read too.
        p.reserve(50).unwrap();
        let room = p.reserve(50).unwrap();
        assert!(room.write_at(0, b"kept"));
        p.commit(50, 4).unwrap();
        assert_eq!(c.pop(&mut buf).unwrap(), Some(4));
        assert_eq!(&buf[..4], b"kept");
    }

    #[test]
    fn garbage_head_and_headers_are_errors_and_resync_recovers() {
        let mem = HeapRegion::new(GEO.ring_bytes());
        let (mut p, mut c) = pair(&mem);
        let r = mem.region();
        let mut buf = [0u8; 600];
        // A head far ahead of our tail.
        r.u32_at(0).unwrap().store(1000, Ordering::Release);
        assert!(matches!(c.pop(&mut buf), Err(RingError::BadIndex { .. })));
        c.resync();
        assert!(c.pop(&mut buf).is_err(), "still garbage");
        // The honest producer's next record publishes a sane head again.
        p.push(&[b"kept"]).unwrap();
        assert_eq!(c.pop(&mut buf).unwrap(), Some(4));
        assert_eq!(&buf[..4], b"kept");
        // A record header with a wrong sequence number or length.
        p.push(&[b"abcd"]).unwrap();
        let at = RING_HEADER + c.mem.data_off(c.tail(), 0);
        r.write(at + 4, &77u32.to_le_bytes());
        assert!(matches!(
            c.pop(&mut buf),
            Err(RingError::BadSequence { .. })
        ));
        r.write(at + 4, &c.tail().to_le_bytes());
        r.write(at, &5000u32.to_le_bytes());
        assert!(matches!(c.pop(&mut buf), Err(RingError::BadLength { .. })));
        // The peer overwriting the published tail does not move the producer
        // beyond what it can check.
        r.u32_at(64).unwrap().store(u32::MAX / 2, Ordering::Release);
        assert!(matches!(p.push(&[b"x"]), Err(RingError::BadIndex { .. })));
    }

    #[test]
    fn doorbell_requests_are_made_only_by_a_waiting_side_and_taken_once() {
        let mem = HeapRegion::new(GEO.ring_bytes());
        let (mut p, mut c) = pair(&mem);
        let mut buf = [0u8; 600];
        // Nobody waits: publishing asks for no doorbell.
        p.push(&[b"a"]).unwrap();
        assert!(!p.take_wakeup());
        // A consumer with data to read does not go to sleep.
        assert!(!c.arm(), "a record is there: read on");
        assert_eq!(c.pop(&mut buf).unwrap(), Some(1));
        // An empty ring: the consumer sleeps, the next record rings once.
        assert!(c.arm());
        p.push(&[b"b"]).unwrap();
        assert!(p.take_wakeup(), "the sleeping consumer is rung");
        p.push(&[b"c"]).unwrap();
        assert!(!p.take_wakeup(), "one doorbell per sleep");
        // A full ring: the producer sleeps until the consumer frees slots.
        let big = [1u8; 400]; // 7 slots
        while c.pop(&mut buf).unwrap().is_some() {}
        assert!(!c.take_wakeup(), "the producer did not ask");
        p.push(&[&big]).unwrap();
        assert_eq!(p.push(&[&big]), Err(RingError::Full));
        assert!(p.arm(big.len()), "still full: sleep");
        assert_eq!(c.pop(&mut buf).unwrap(), Some(400));
        assert!(c.take_wakeup(), "the sleeping producer is rung");
        assert!(!c.take_wakeup());
        assert!(!p.arm(big.len()), "room now: no sleep");
        p.push(&[&big]).unwrap();
    }

    /// A consumer that publishes a tail no honest one could (further from
    /// the head than the ring is long) leaves the producer no room until
    /// it publishes a sane one: a producer arming for room must sleep, not
    /// be told to try again at once, which it would do in a loop (a hostile
    /// application or guest would keep its daemon spinning).
    #[test]
    fn a_garbage_tail_gives_no_room_and_a_producer_arming_on_it_sleeps() {
        let mem = HeapRegion::new(GEO.ring_bytes());
        let (mut p, _c) = pair(&mem);
        p.push(&[b"a"]).unwrap();
        mem.region()
            .u32_at(64)
            .unwrap()
            .store(u32::MAX / 2, Ordering::Release);
        assert!(matches!(p.push(&[b"b"]), Err(RingError::BadIndex { .. })));
        assert!(p.arm(1), "no room with a garbage tail: sleep");
        // The consumer publishes a sane tail again (past the first
        // record): room, and no sleep.
        mem.region().u32_at(64).unwrap().store(1, Ordering::Release);
        assert!(!p.arm(1), "room again: try now");
        p.push(&[b"c"]).unwrap();
    }

    #[test]
    fn reserved_records_are_filled_in_place_and_peeked_records_read_in_place() {
        let mem = HeapRegion::new(GEO.ring_bytes());
        let (mut p, mut c) = pair(&mem);
        let mut buf = [0u8; 600];
        for round in 0..20u8 {
            // Reserve room for 300 bytes, write 130 through the raw
            // segments (wrapping every few rounds), publish those.
            let seg = p.reserve(300).unwrap();
            assert_eq!(seg.len(), 300);
            let data: Vec<u8> = (0..130u8).map(|i| i ^ round).collect();
            let mut k = 0;
            for (ptr, n) in seg.parts() {
                let m = n.min(data.len() - k);
                // SAFETY: the segment is inside the ring (reserve), m <= n.
                unsafe { std::ptr::copy_nonoverlapping(data[k..].as_ptr(), ptr, m) };
                k += m;
            }
            p.commit(300, 130).unwrap();
            let seg = c.peek().unwrap().unwrap();
            assert_eq!(seg.len(), 130);
            let mut first = [0u8; 4];
            assert!(c.read(130, &mut first));
            assert_eq!(first, data[..4]);
            let mut got = Vec::new();
            for (ptr, n) in seg.parts() {
                // SAFETY: the segment is inside the ring (peek).
                got.extend_from_slice(unsafe { std::slice::from_raw_parts(ptr, n) });
            }
            assert_eq!(got, data, "round {round}");
            c.consume(130);
            assert_eq!(c.pop(&mut buf).unwrap(), None);
        }
        assert_eq!(p.commit(300, 301), Err(RingError::BadSize(301)));
        // No room for the reservation: full, nothing published.
        p.push(&[&[0u8; 400]]).unwrap();
        assert!(matches!(p.reserve(100), Err(RingError::Full)));
        assert_eq!(c.pop(&mut buf).unwrap(), Some(400));
        assert_eq!(c.pop(&mut buf).unwrap(), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        /// Whatever the peer writes anywhere in the ring, the consumer
        /// returns records or errors, never panics, and only hands out
        /// lengths within its buffer.
        #[test]
        fn garbage_never_panics(
            writes in proptest::collection::vec((0usize..GEO.ring_bytes(), proptest::collection::vec(any::<u8>(), 1..16)), 0..24),
            honest in proptest::collection::vec(1usize..300, 0..6),
        ) {
            let mem = HeapRegion::new(GEO.ring_bytes());
            let (mut p, mut c) = pair(&mem);
            let r = mem.region();
            for len in honest {
                let _ = p.push(&[&vec![1u8; len]]);
            }
            for (off, bytes) in &writes {
                let n = bytes.len().min(GEO.ring_bytes() - off);
                r.write(*off, &bytes[..n]);
            }
            let mut buf = vec![0u8; 512];
            for _ in 0..32 {
                match c.pop(&mut buf) {
                    Ok(Some(n)) => prop_assert!(n <= buf.len()),
                    Ok(None) => break,
                    Err(_) => c.resync(),
                }
                let _ = p.push(&[b"after"]);
            }
        }

        /// Records pushed, reserved and committed, or reserved and given
        /// up, in any order, by a producer that restarts and is limited:
        /// the consumer reads exactly those published, in order, and once
        /// it has read them all the producer always has room again.
        #[test]
        fn records_come_out_as_published_whatever_is_given_up(
            ops in proptest::collection::vec((0u8..4, 1usize..200, 0usize..200), 1..80),
            limit in 1u32..=GEO.slots,
        ) {
            let mem = HeapRegion::new(GEO.ring_bytes());
            let (mut p, mut c) = pair(&mem);
            p.set_restarts(true);
            p.set_limit(limit);
            let mut model = std::collections::VecDeque::new();
            let mut buf = vec![0u8; 512];
            for (i, &(op, max, len)) in ops.iter().enumerate() {
                let rec: Vec<u8> = (0..len.min(max).max(1)).map(|k| (k + i) as u8).collect();
                match op {
                    0 => {
                        if p.push(&[&rec]).is_ok() {
                            model.push_back(rec);
                        }
                    }
                    1 => {
                        if let Ok(room) = p.reserve(max) {
                            prop_assert!(room.write_at(0, &rec));
                            p.commit(max, rec.len()).unwrap();
                            model.push_back(rec);
                        }
                    }
                    2 => {
                        let _ = p.reserve(max);
                    }
                    _ => match c.pop(&mut buf).unwrap() {
                        Some(n) => {
                            let want = model.pop_front().expect("a record was published");
                            prop_assert_eq!(&buf[..n], &want[..]);
                        }
                        None => prop_assert!(model.is_empty()),
                    },
                }
            }
            while let Some(n) = c.pop(&mut buf).unwrap() {
                let want = model.pop_front().expect("a record was published");
                prop_assert_eq!(&buf[..n], &want[..]);
            }
            prop_assert!(model.is_empty());
            p.push(&[b"room again"]).unwrap();
            prop_assert_eq!(c.pop(&mut buf).unwrap(), Some(10));
        }
    }
}
