//! SDUs held for an application that has not taken them yet, counted in
//! SDUs and in bytes, so that what a flow holds is bounded in both.

use super::app_rings::Held;
use std::collections::VecDeque;

/// SDUs held for one flow's application, oldest first, and their bytes.
pub(super) struct HeldQueue<H> {
    q: VecDeque<H>,
    bytes: usize,
}

impl<H> Default for HeldQueue<H> {
    fn default() -> Self {
        HeldQueue {
            q: VecDeque::new(),
            bytes: 0,
        }
    }
}

impl<H: Held> HeldQueue<H> {
    /// SDUs held.
    pub(super) fn len(&self) -> usize {
        self.q.len()
    }

    /// Nothing is held.
    pub(super) fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    /// Bytes of the SDUs held.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The oldest SDU.
    pub(super) fn front(&self) -> Option<&H> {
        self.q.front()
    }

    /// The SDUs held, oldest first.
    pub(super) fn iter(&self) -> impl Iterator<Item = &H> {
        self.q.iter()
    }

    /// Holds `sdu` after the others.
    pub(super) fn push_back(&mut self, sdu: H) {
        self.bytes += sdu.held_len();
        self.q.push_back(sdu);
    }

    /// Takes the oldest SDU.
    pub(super) fn pop_front(&mut self) -> Option<H> {
        let sdu = self.q.pop_front()?;
        self.bytes -= sdu.held_len();
        Some(sdu)
    }

    /// Takes the `n` oldest SDUs (all of them if fewer are held).
    pub(super) fn drop_front(&mut self, n: usize) {
        for _ in 0..n {
            if self.pop_front().is_none() {
                break;
            }
        }
    }

    /// Takes every SDU.
    pub(super) fn clear(&mut self) {
        self.q.clear();
        self.bytes = 0;
    }
}

impl<H: Held> FromIterator<H> for HeldQueue<H> {
    fn from_iter<I: IntoIterator<Item = H>>(sdus: I) -> Self {
        let mut q = HeldQueue::default();
        for sdu in sdus {
            q.push_back(sdu);
        }
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_follow_what_is_held_and_taken() {
        let mut q = HeldQueue::<Vec<u8>>::default();
        q.push_back(vec![0; 100]);
        q.push_back(vec![0; 30]);
        q.push_back(vec![0; 7]);
        assert_eq!((q.len(), q.bytes()), (3, 137));
        assert_eq!(q.pop_front().map(|s| s.len()), Some(100));
        assert_eq!((q.len(), q.bytes()), (2, 37));
        q.drop_front(5);
        assert_eq!((q.len(), q.bytes(), q.is_empty()), (0, 0, true));
        q.push_back(vec![0; 9]);
        q.clear();
        assert_eq!((q.len(), q.bytes()), (0, 0));
    }
}
