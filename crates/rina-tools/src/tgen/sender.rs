//! What a sender does next: the pure decision of `rina-tgen`'s send loop,
//! fed the clock by the binary. A sender writes what falls due before its
//! flow's end, stops at the end however far behind its schedule it is (a
//! source faster than the flow), and never sleeps longer than [`SLICE`]
//! between two looks at whether it must stop (its flow closed): the next
//! SDU of a slow source may be days away.

use std::time::Instant;

/// Longest a sender sleeps before it decides again.
pub const SLICE: std::time::Duration = std::time::Duration::from_millis(100);

/// What a sender does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Sleep until then (at most [`SLICE`] from now), then decide again.
    Sleep(Instant),
    /// Write the next DATA SDU now.
    Data,
    /// Write the next RTT probe now.
    Probe,
    /// Done: the flow's end has come, or nothing more falls due before it.
    Done,
}

/// The step at `now` of a sender whose flow ends at `end`, with its next
/// DATA SDU due at `data` and its next probe at `probe` (`None`: none,
/// or beyond any clock). A probe goes first only when strictly earlier.
pub fn next_step(
    now: Instant,
    end: Instant,
    data: Option<Instant>,
    probe: Option<Instant>,
) -> Step {
    if now >= end {
        return Step::Done;
    }
    let (data, probe) = (data.filter(|&t| t < end), probe.filter(|&t| t < end));
    let (due, step) = match (data, probe) {
        (Some(d), Some(p)) if p < d => (p, Step::Probe),
        (Some(d), _) => (d, Step::Data),
        (None, Some(p)) => (p, Step::Probe),
        (None, None) => return Step::Done,
    };
    if due <= now {
        return step;
    }
    Step::Sleep(now.checked_add(SLICE).map_or(due, |s| s.min(due)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn writes_what_is_due_and_sleeps_at_most_a_slice() {
        let t0 = Instant::now();
        let s = |x: f64| t0 + Duration::from_secs_f64(x);
        let end = s(10.0);
        assert_eq!(next_step(t0, end, Some(t0), None), Step::Data);
        assert_eq!(
            next_step(s(1.0), end, Some(s(0.5)), Some(s(0.7))),
            Step::Data
        );
        assert_eq!(
            next_step(s(1.0), end, Some(s(0.7)), Some(s(0.5))),
            Step::Probe
        );
        assert_eq!(next_step(t0, end, None, Some(t0)), Step::Probe);
        assert_eq!(
            next_step(t0, end, Some(s(0.05)), None),
            Step::Sleep(s(0.05))
        );
        // The next SDU of a source at 0.001 bit/s: 130 days away, so the
        // sender would have slept past its flow's close; it looks again in
        // a slice.
        let end = s(1e9);
        assert_eq!(
            next_step(t0, end, Some(s(1.12e7)), None),
            Step::Sleep(t0 + SLICE)
        );
        assert_eq!(
            next_step(t0, end, Some(s(5.0)), Some(s(0.01))),
            Step::Sleep(s(0.01))
        );
    }

    #[test]
    fn stops_at_the_end_however_far_behind() {
        let t0 = Instant::now();
        let s = |x: f64| t0 + Duration::from_secs_f64(x);
        let end = s(1.0);
        // A source faster than the flow: its SDU of 0.3 s is due at 1.0 s,
        // and it was sent until the schedule, not the clock, reached the end.
        assert_eq!(next_step(s(1.0), end, Some(s(0.3)), None), Step::Done);
        assert_eq!(
            next_step(s(5.0), end, Some(s(0.3)), Some(s(0.1))),
            Step::Done
        );
        assert_eq!(next_step(s(0.9), end, Some(s(0.3)), None), Step::Data);
        // Nothing before the end.
        assert_eq!(next_step(t0, end, Some(s(1.0)), Some(s(2.0))), Step::Done);
        assert_eq!(next_step(t0, end, None, None), Step::Done);
    }
}
