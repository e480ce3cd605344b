//! SDUs a driver holds for applications that have not taken them yet
//! (their socket or ring is full): how many it may hold, and flows their
//! peer ended while it held some.
//!
//! A driver holds delivered SDUs while an application does not read. On a
//! flow whose own window bounds them ([`System::paced_by_reader`]) it holds
//! every one: dropping one would lose an SDU of a reliable flow. On any
//! other flow it holds at most [`MAX_HELD_SDUS`] SDUs and
//! [`MAX_HELD_BYTES`] bytes, and drops beyond, as a link would
//! ([`System::may_hold`]).
//!
//! When a flow ends at the far side ([`AppEvent::Deallocated`]), what was
//! delivered before is the application's: on a reliable flow the peer
//! counted it as received. A driver that holds some of it keeps the flow's
//! end open to the application until it has taken them, for
//! [`ENDED_HOLD_MAX`] at most. The system keeps the port meanwhile, so that
//! no new flow takes it, and says when the time is over
//! ([`AppEvent::HoldExpired`]).

use super::member::PortId;
use super::{AppEvent, Output, System};
use crate::time::Instant;
use std::time::Duration;

/// Longest the end of a flow its peer ended stays open to its application
/// for the SDUs the driver still holds for it ([`System::hold_ended`]): as
/// long as a flow closed by its application waits for what it wrote
/// ([`crate::normal::LINGER_MAX`]).
pub const ENDED_HOLD_MAX: Duration = Duration::from_secs(30);

/// SDUs a driver may hold for one flow's application on a flow its window
/// does not bound ([`System::may_hold`]).
pub const MAX_HELD_SDUS: usize = 1024;

/// Bytes a driver may hold so for one flow's application: with large SDUs
/// this bound comes first (64 SDUs of 64 KiB, where [`MAX_HELD_SDUS`]
/// alone would let it hold 64 MiB).
pub const MAX_HELD_BYTES: usize = 4 << 20;

impl System {
    /// Whether a driver that holds `sdus` SDUs of `bytes` bytes for the
    /// application of flow `port` may hold one more: always on a flow its
    /// own window bounds ([`System::paced_by_reader`]), else below
    /// [`MAX_HELD_SDUS`] and [`MAX_HELD_BYTES`]. An SDU it may not hold is
    /// dropped and counted, as a link would lose it.
    pub fn may_hold(&self, port: PortId, sdus: usize, bytes: usize) -> bool {
        (sdus < MAX_HELD_SDUS && bytes < MAX_HELD_BYTES) || self.paced_by_reader(port)
    }

    /// The driver still holds SDUs delivered on flow `port`, which the
    /// system just reported [`AppEvent::Deallocated`], that its application
    /// has not taken: the port stays taken until the driver calls
    /// [`System::release_ended`], or until [`ENDED_HOLD_MAX`] later, when
    /// the system counts it ([`super::Counters::ended_hold_expired`]) and
    /// reports [`AppEvent::HoldExpired`]; what is still held then is lost.
    /// False, and nothing kept, for a port that is still in use or
    /// already kept (its deadline stays).
    pub fn hold_ended(&mut self, now: Instant, port: PortId) -> bool {
        self.tick(now);
        if self.port_in_use(port) || self.ended_held.contains_key(&port) {
            return false;
        }
        self.ended_held.insert(port, now + ENDED_HOLD_MAX);
        true
    }

    /// The application took what was held for ended flow `port` (or
    /// closed its end): the port is free again and no
    /// [`AppEvent::HoldExpired`] comes for it.
    pub fn release_ended(&mut self, port: PortId) {
        self.ended_held.remove(&port);
    }

    /// Whether ended flow `port` is kept for its application
    /// ([`System::hold_ended`]).
    pub fn is_held_ended(&self, port: PortId) -> bool {
        self.ended_held.contains_key(&port)
    }

    /// When the first kept ended flow's time is over.
    pub(super) fn ended_timeout(&self) -> Option<Instant> {
        self.ended_held.values().copied().min()
    }

    /// Reports the kept ended flows whose time is over.
    pub(super) fn expire_ended(&mut self, now: Instant) {
        let due: Vec<PortId> = self
            .ended_held
            .iter()
            .filter(|(_, &t)| t <= now)
            .map(|(&p, _)| p)
            .collect();
        for port in due {
            self.ended_held.remove(&port);
            self.counters.ended_hold_expired += 1;
            self.out
                .push_back(Output::App(AppEvent::HoldExpired { port }));
        }
    }
}
