//! Giving memory back after many flows closed: the flow tables shrink and
//! the heap's free pages go back to the system (the allocator keeps them
//! otherwise, and a daemon that once held 100,000 flows would keep their
//! memory for good).

use super::Daemon;
use rina_core::Instant;
use std::time::Duration;

/// Flows that must have closed (and at least half of the most held) before
/// memory is given back.
const TRIM_MIN_CLOSED: usize = 1024;
/// Wait after the threshold is crossed, so that a mass close is over.
const TRIM_DELAY: Duration = Duration::from_secs(1);

impl Daemon {
    /// Watches the number of flows; once enough closed, gives memory back
    /// [`TRIM_DELAY`] later. Called once per turn of the loop.
    pub(super) fn trim_memory(&mut self, now: Instant) {
        let n = self.flows.len();
        if n >= self.flows_peak {
            self.flows_peak = n;
            self.trim_at = None;
            return;
        }
        let closed = self.flows_peak - n;
        match self.trim_at {
            None if closed >= TRIM_MIN_CLOSED && n <= self.flows_peak / 2 => {
                self.trim_at = Some(now + TRIM_DELAY);
            }
            Some(t) if t <= now => {
                self.trim_at = None;
                self.flows_peak = n;
                self.flows.shrink_to_fit();
                self.taken.shrink_to_fit();
                self.allocs.shrink_to_fit();
                self.incoming.shrink_to_fit();
                self.sys.shrink_to_fit();
                rina_core::buf::release_pool();
                crate::sys::trim_heap();
                tracing::debug!(flows = n, closed, "memory of closed flows given back");
            }
            _ => {}
        }
    }
}
