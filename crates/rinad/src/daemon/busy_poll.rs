//! Busy polling: after its last event the daemon may keep polling its
//! descriptors for a while instead of sleeping (`busy_poll_us`).
//!
//! A round trip through two daemons wakes six processes; on a virtual
//! machine each wake-up of an idle core costs 15-20 µs, most of such a
//! round trip. A daemon that is still polling when the next datagram or
//! SDU comes needs no wake-up. Between polls it yields its core, so an
//! application on the same core that became runnable is not kept waiting
//! for the end of a time slice. The window starts again at every event and
//! ends at the first poll after it that finds nothing, when it has run out;
//! a daemon with nothing to do sleeps as before.

use std::time::{Duration, Instant};

/// How the daemon waits for its next events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wait {
    /// Poll without sleeping; if nothing came, yield and poll again.
    Spin,
    /// Sleep until an event or the timeout (`None`: no timeout).
    Sleep(Option<Duration>),
}

/// The busy-polling window and when it was last renewed.
#[derive(Debug)]
pub(super) struct BusyPoll {
    window: Option<Duration>,
    last_event: Instant,
}

impl BusyPoll {
    /// A window of `window` after each event (`None`: never spin).
    pub(super) fn new(window: Option<Duration>) -> Self {
        BusyPoll {
            window,
            last_event: Instant::now(),
        }
    }

    /// How to wait at `now`, with the daemon's own `timeout` (zero when it
    /// has work ready, else its next deadline).
    pub(super) fn plan(&self, timeout: Option<Duration>, now: Instant) -> Wait {
        match self.window {
            Some(w)
                if timeout != Some(Duration::ZERO)
                    && now.saturating_duration_since(self.last_event) < w =>
            {
                Wait::Spin
            }
            _ => Wait::Sleep(timeout),
        }
    }

    /// Renews the window: a poll at `now` found events.
    pub(super) fn saw_events(&mut self, now: Instant) {
        self.last_event = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn without_a_window_the_daemon_sleeps_with_its_own_timeout() {
        let t0 = Instant::now();
        let mut b = BusyPoll::new(None);
        b.saw_events(t0);
        assert_eq!(b.plan(Some(5 * MS), t0), Wait::Sleep(Some(5 * MS)));
        assert_eq!(b.plan(None, t0), Wait::Sleep(None));
    }

    #[test]
    fn within_the_window_it_spins_and_after_it_sleeps() {
        let t0 = Instant::now();
        let mut b = BusyPoll::new(Some(2 * MS));
        b.saw_events(t0);
        assert_eq!(b.plan(Some(50 * MS), t0 + MS), Wait::Spin);
        assert_eq!(b.plan(None, t0 + MS), Wait::Spin);
        assert_eq!(b.plan(None, t0 + 2 * MS), Wait::Sleep(None));
        // An event renews the window from when it came.
        b.saw_events(t0 + 3 * MS);
        assert_eq!(b.plan(None, t0 + 4 * MS), Wait::Spin);
        assert_eq!(b.plan(Some(MS), t0 + 6 * MS), Wait::Sleep(Some(MS)));
    }

    #[test]
    fn work_ready_is_polled_for_without_waiting_either_way() {
        let t0 = Instant::now();
        let mut b = BusyPoll::new(Some(2 * MS));
        b.saw_events(t0);
        let zero = Some(Duration::ZERO);
        assert_eq!(b.plan(zero, t0 + MS), Wait::Sleep(zero));
        assert_eq!(b.plan(zero, t0 + 9 * MS), Wait::Sleep(zero));
    }
}
