//! The event queue: events ordered by virtual time, ties broken by the order
//! in which they were scheduled, so a run never depends on heap internals.

use rina_core::Instant;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A heap entry: small and `Copy`, so the heap's sifting moves 24 bytes
/// whatever the size of the event, which waits in the queue's slab.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    at: Instant,
    seq: u64,
    slot: usize,
}

/// A priority queue of events keyed by `(time, insertion sequence)`: the
/// earliest event comes first, and of events at the same instant the one
/// scheduled first.
pub struct EventQueue<E> {
    heap: BinaryHeap<Reverse<Entry>>,
    /// The events, by slot; a slot is free once its event is popped.
    slots: Vec<Option<E>>,
    /// Slots free for the next events.
    free: Vec<usize>,
    seq: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        EventQueue {
            heap: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            seq: 0,
        }
    }
}

impl<E> EventQueue<E> {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Schedules `event` at `at`.
    pub fn push(&mut self, at: Instant, event: E) {
        let seq = self.seq;
        self.seq += 1;
        let slot = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(event);
                i
            }
            None => {
                self.slots.push(Some(event));
                self.slots.len() - 1
            }
        };
        self.heap.push(Reverse(Entry { at, seq, slot }));
    }

    /// Time of the next event, if any.
    pub fn peek_time(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse(e)| e.at)
    }

    /// The next event and its time, left in the queue.
    pub fn peek(&self) -> Option<(Instant, &E)> {
        let Reverse(e) = self.heap.peek()?;
        self.slots[e.slot].as_ref().map(|ev| (e.at, ev))
    }

    /// Removes and returns the next event.
    pub fn pop(&mut self) -> Option<(Instant, E)> {
        let Reverse(e) = self.heap.pop()?;
        let ev = self.slots[e.slot].take()?;
        self.free.push(e.slot);
        Some((e.at, ev))
    }

    /// Number of events waiting.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether no event is waiting.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_then_insertion_order() {
        let mut q = EventQueue::new();
        let t = Instant::from_nanos;
        q.push(t(5), "c");
        q.push(t(1), "a");
        q.push(t(5), "d");
        q.push(t(1), "b");
        q.push(t(3), "x");
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).map(|(_, e)| e).collect();
        assert_eq!(order, ["a", "b", "x", "c", "d"]);
        assert!(q.is_empty());
    }
}
