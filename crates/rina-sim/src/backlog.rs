//! Frames that full links pushed back to a node running a
//! [`System`], held per medium the way a full
//! socket buffer holds them: in order, the medium blocked in the system
//! until the link has room, then sent again and the medium made writable.
//! The driver half of [`Node::on_link_full`](crate::Node::on_link_full)
//! for every node that runs the real system over the simulator's links.

use crate::world::Ctx;
use rina_core::system::{MediumId, System};
use rina_core::Instant;
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

/// Frames a link pushed back, oldest first, each with its peer; and when
/// to look again.
type Held = (VecDeque<(SocketAddr, Vec<u8>)>, Instant);

/// Frames waiting for room, per medium, and when to look again.
#[derive(Debug, Default)]
pub struct LinkBacklogs {
    held: BTreeMap<MediumId, Held>,
}

impl LinkBacklogs {
    /// Queues `frame` for `peer` behind the frames `medium` holds back, if
    /// it holds any (frames keep their order); gives it back otherwise, to
    /// be sent at once.
    pub fn queue_behind(
        &mut self,
        medium: MediumId,
        peer: SocketAddr,
        frame: Vec<u8>,
    ) -> Option<Vec<u8>> {
        match self.held.get_mut(&medium) {
            Some((q, _)) => {
                q.push_back((peer, frame));
                None
            }
            None => Some(frame),
        }
    }

    /// Holds a frame the link of `medium` refused until `room_at`; the
    /// first one held blocks the medium in `sys`.
    pub fn hold(
        &mut self,
        sys: &mut System,
        now: Instant,
        medium: MediumId,
        peer: SocketAddr,
        frame: Vec<u8>,
        room_at: Instant,
    ) {
        let fresh = !self.held.contains_key(&medium);
        let e = self
            .held
            .entry(medium)
            .or_insert_with(|| (VecDeque::new(), room_at));
        e.0.push_back((peer, frame));
        e.1 = room_at;
        if fresh {
            sys.medium_blocked(now, medium);
        }
    }

    /// When [`LinkBacklogs::retry`] must run next, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.held.values().map(|(_, t)| *t).min()
    }

    /// Frames held, over every medium.
    pub fn frames(&self) -> usize {
        self.held.values().map(|(q, _)| q.len()).sum()
    }

    /// Forgets every frame held (the node stopped).
    pub fn clear(&mut self) {
        self.held.clear();
    }

    /// Sends again, from each medium's own address (`local`), what the
    /// links that have room by now held back. A medium whose frames all
    /// went (nothing came back since the last try) is writable again in
    /// `sys`; the frames a link refuses again come back through
    /// [`LinkBacklogs::hold`], in order, and are looked at right after.
    pub fn retry<E>(
        &mut self,
        ctx: &mut Ctx<'_, E>,
        sys: &mut System,
        local: impl Fn(MediumId) -> Option<SocketAddr>,
    ) {
        let now = ctx.now();
        let due: Vec<MediumId> = self
            .held
            .iter()
            .filter(|(_, (_, t))| *t <= now)
            .map(|(m, _)| *m)
            .collect();
        for m in due {
            let Some((q, _)) = self.held.remove(&m) else {
                continue;
            };
            if q.is_empty() {
                sys.medium_writable(now, m);
                continue;
            }
            let Some(from) = local(m) else {
                continue;
            };
            self.held
                .insert(m, (VecDeque::new(), now + Duration::from_nanos(1)));
            for (peer, frame) in q {
                ctx.transmit(from, peer, frame);
            }
        }
    }
}
