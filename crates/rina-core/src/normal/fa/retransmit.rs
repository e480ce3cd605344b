//! Repeating a message until it is answered or its time runs out: the flow
//! allocator's REQUESTs (until the peer answers) and DEALLOCs (until the
//! peer acknowledges). Management PDUs are not retransmitted by EFCP, so
//! every request of the flow allocator goes through one of these.
//!
//! A sans-IO machine of its own: it holds the messages and their timers,
//! and [`Retransmit::handle_timeout`] says what to send again and what to
//! give up; the flow allocator decides what an answer or a give-up means.

use crate::rmt::Address;
use crate::time::Instant;
use std::collections::BTreeMap;
use std::time::Duration;

/// One message being repeated.
#[derive(Debug)]
struct Entry {
    to: Address,
    message: Vec<u8>,
    next_retry: Instant,
    deadline: Instant,
}

/// What a timeout asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::normal) enum Due<K> {
    /// Send `message` to `to` again.
    Resend { to: Address, message: Vec<u8> },
    /// Nothing answered `key`'s message in time: it is given up.
    Expired {
        key: K,
        to: Address,
        message: Vec<u8>,
    },
}

/// Messages repeated until answered, by key, in key order.
#[derive(Debug)]
pub(in crate::normal) struct Retransmit<K> {
    entries: BTreeMap<K, Entry>,
}

impl<K: Ord + Copy> Retransmit<K> {
    pub(in crate::normal) fn new() -> Self {
        Retransmit {
            entries: BTreeMap::new(),
        }
    }

    /// `message` was sent to `to` at `now`: repeat it every `retry` until
    /// [`Retransmit::stop`], for at most `timeout`.
    pub(in crate::normal) fn start(
        &mut self,
        now: Instant,
        key: K,
        to: Address,
        message: Vec<u8>,
        retry: Duration,
        timeout: Duration,
    ) {
        let e = Entry {
            to,
            message,
            next_retry: now + retry,
            deadline: now + timeout,
        };
        self.entries.insert(key, e);
    }

    /// The answer came (or the message is no longer wanted): returns where
    /// it went and what it was.
    pub(in crate::normal) fn stop(&mut self, key: &K) -> Option<(Address, Vec<u8>)> {
        self.entries.remove(key).map(|e| (e.to, e.message))
    }

    /// The message being repeated for `key`.
    pub(in crate::normal) fn message(&self, key: &K) -> Option<&[u8]> {
        self.entries.get(key).map(|e| e.message.as_slice())
    }

    /// Messages being repeated.
    pub(in crate::normal) fn len(&self) -> usize {
        self.entries.len()
    }

    /// When [`Retransmit::handle_timeout`] next has something to do.
    pub(in crate::normal) fn poll_timeout(&self) -> Option<Instant> {
        self.entries
            .values()
            .map(|e| e.next_retry.min(e.deadline))
            .min()
    }

    /// What is due at `now`, in key order: messages past their deadline
    /// are given up (and forgotten), the others due are sent again and
    /// next repeated `retry` later.
    pub(in crate::normal) fn handle_timeout(
        &mut self,
        now: Instant,
        retry: Duration,
    ) -> Vec<Due<K>> {
        let mut out = Vec::new();
        let mut expired = Vec::new();
        for (key, e) in &mut self.entries {
            if now >= e.deadline {
                expired.push(*key);
            } else if now >= e.next_retry {
                e.next_retry = now + retry;
                out.push(Due::Resend {
                    to: e.to,
                    message: e.message.clone(),
                });
            }
        }
        for key in expired {
            if let Some(e) = self.entries.remove(&key) {
                out.push(Due::Expired {
                    key,
                    to: e.to,
                    message: e.message,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Instant {
        Instant::from_nanos(n * 1_000_000)
    }

    const RETRY: Duration = Duration::from_millis(250);
    const TIMEOUT: Duration = Duration::from_millis(1000);

    #[test]
    fn a_message_is_repeated_every_retry_until_stopped() {
        let mut r = Retransmit::new();
        r.start(ms(0), 7u32, 2, b"req".to_vec(), RETRY, TIMEOUT);
        assert_eq!(r.poll_timeout(), Some(ms(250)));
        assert!(r.handle_timeout(ms(249), RETRY).is_empty());
        let resend = Due::Resend {
            to: 2,
            message: b"req".to_vec(),
        };
        assert_eq!(r.handle_timeout(ms(250), RETRY), vec![resend.clone()]);
        assert_eq!(r.poll_timeout(), Some(ms(500)));
        // A late timer call repeats once, and the next is a retry later.
        assert_eq!(r.handle_timeout(ms(700), RETRY), vec![resend]);
        assert_eq!(r.poll_timeout(), Some(ms(950)));
        assert_eq!(r.stop(&7), Some((2, b"req".to_vec())));
        assert_eq!(r.poll_timeout(), None);
        assert!(r.handle_timeout(ms(5000), RETRY).is_empty());
    }

    #[test]
    fn an_unanswered_message_is_given_up_at_its_deadline_in_key_order() {
        let mut r = Retransmit::new();
        r.start(ms(0), 2u32, 9, b"b".to_vec(), RETRY, TIMEOUT);
        r.start(ms(0), 1u32, 8, b"a".to_vec(), RETRY, TIMEOUT);
        r.start(ms(500), 3u32, 7, b"c".to_vec(), RETRY, TIMEOUT);
        let due = r.handle_timeout(ms(1000), RETRY);
        assert_eq!(
            due,
            vec![
                Due::Resend {
                    to: 7,
                    message: b"c".to_vec()
                },
                Due::Expired {
                    key: 1,
                    to: 8,
                    message: b"a".to_vec()
                },
                Due::Expired {
                    key: 2,
                    to: 9,
                    message: b"b".to_vec()
                },
            ]
        );
        assert_eq!(r.len(), 1);
        assert_eq!(r.message(&3), Some(&b"c"[..]));
        assert_eq!(r.stop(&1), None, "given up: forgotten");
    }
}
