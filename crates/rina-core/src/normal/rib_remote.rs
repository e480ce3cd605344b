//! Reading a neighbour's RIB with CDAP, and answering such reads.
//!
//! A reader sends `M_READ` of the subtree's root (`obj_name`) with the
//! number of levels below it in `scope` (absent: all) to a neighbour, in a
//! management PDU on the port to it ([`NormalIpcp::read_remote_rib`]). The
//! neighbour answers as CDAP has it for a scoped read: one `M_READ_R` per
//! object (class, name, instance, and its value rendered as a string), every
//! one but the last flagged `F_RD_INCOMPLETE`, all with the read's invoke
//! id, and its position in the answer (from 0) in `version`, the field CDAP
//! leaves to the application, so that a reader notices a lost part; or one
//! `M_READ_R` whose `result` is not 0 and whose `result_reason` says why
//! (no such object, not readable by this DIF's policy). Large answers are
//! fragmented like any management message.
//!
//! Access policy of the DIF: only a neighbour that is a member (its hellos
//! heard, or announced by the driver) may read, and only under the prefixes
//! of [`NormalConfig::rib_readable`](super::NormalConfig::rib_readable)
//! (default `/`: everything; empty: nothing). Each neighbour is answered
//! at most [`RIB_READ_OBJECTS_PER_S`] objects a second on average (one
//! read may take up to a second's worth more): a short `M_READ` of `/` is
//! answered with one message per object, and a member asking for it over
//! and over would otherwise have this IPCP send as fast as it can ask.
//! A read is charged every object of the view of the RIB built to answer
//! it (built whole, whatever the path), so reads of small or missing
//! subtrees are paid for too. Reads beyond are refused with a reason and
//! counted (`rib_reads_limited`), before anything is built.
//!
//! Management PDUs are unreliable: a read not complete after
//! `alloc_retry * 4` is asked again with a new invoke id (answers to the old
//! one are ignored), and fails after `alloc_timeout`
//! ([`Action::RibRead`] with the reason).

use super::mgmt_cdap::payload_of;
use super::mgmt_rib::Peer;
use super::{Action, N1Port, NormalError, NormalIpcp};
use crate::rib::{OwnerId, ALL_LEVELS};
use crate::rmt::Address;
use crate::time::Instant;
use rina_wire::cdap::{CdapMessage, Flags, Value};
use rina_wire::ctl::RibObjectInfo;
use std::collections::BTreeMap;

/// Why a read of a neighbour's RIB ([`NormalIpcp::read_remote_rib`]) gave
/// no objects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RibReadError {
    /// The neighbour refused it; its reason.
    #[error("{0}")]
    Refused(String),
    /// No complete answer came from the neighbour before the deadline
    /// (asked again meanwhile).
    #[error("no complete answer from address {address} within {within:?}")]
    Timeout {
        /// The neighbour's address.
        address: Address,
        /// How long the read had.
        within: std::time::Duration,
    },
    /// The neighbour's answer numbered an object past [`MAX_READ_OBJECTS`]
    /// or its objects went past [`MAX_READ_BYTES`]: the read ends there.
    #[error("the answer from address {address} is larger than a read takes ({MAX_READ_OBJECTS} objects, {MAX_READ_BYTES} bytes)")]
    TooLarge {
        /// The neighbour's address.
        address: Address,
    },
}

/// Owner shown for objects read from a peer (CDAP does not carry owners).
pub const REMOTE_OWNER: &str = "remote";

/// Most remote reads under way at once.
pub const MAX_REMOTE_READS: usize = 64;

/// Most objects one read of a neighbour's RIB takes (positions in its
/// answer from 0 to this, less one).
pub const MAX_READ_OBJECTS: usize = 100_000;

/// Most bytes of names, classes and values one read of a neighbour's RIB
/// takes (as much as an enrollee takes in one attempt).
pub const MAX_READ_BYTES: usize = 64 << 20;

/// RIB objects a neighbour's reads are answered with per second, on
/// average.
pub const RIB_READ_OBJECTS_PER_S: u64 = 20_000;

/// How far ahead of time a neighbour's reads may have been answered (a
/// burst of [`RIB_READ_OBJECTS_PER_S`] objects).
const RIB_READ_BURST: std::time::Duration = std::time::Duration::from_secs(1);

/// Result code of a read refused because its reader asked for too much.
const RESULT_READ_LIMITED: i32 = 3;

/// A read of a neighbour's RIB under way.
#[derive(Debug)]
pub(super) struct RemoteRead {
    port: N1Port,
    dst: Address,
    path: String,
    depth: Option<u32>,
    invoke: i32,
    /// Objects received, by position in the answer.
    objects: BTreeMap<i64, RibObjectInfo>,
    /// Bytes of their names, classes and values.
    bytes: usize,
    next_retry: Instant,
    deadline: Instant,
}

/// The reads this IPCP asked for, by handle, and how much it answered
/// each neighbour.
#[derive(Debug, Default)]
pub(super) struct RemoteReads {
    reads: BTreeMap<u64, RemoteRead>,
    next_handle: u64,
    /// Per reading neighbour, the time at which what it was answered is
    /// paid for at [`RIB_READ_OBJECTS_PER_S`] (a generic cell rate
    /// algorithm's theoretical arrival time). Entries in the past are as
    /// good as absent and are dropped.
    answered_until: BTreeMap<Address, Instant>,
    /// RIB views built to answer neighbours' reads.
    #[cfg(test)]
    pub(super) built: u64,
}

impl RemoteReads {
    /// Whether neighbour `reader` may be answered now (what it was
    /// answered before is paid for but for a burst).
    fn may_answer(&mut self, now: Instant, reader: Address) -> bool {
        if self.answered_until.len() > MAX_REMOTE_READS {
            self.answered_until.retain(|_, t| *t > now);
        }
        let until = self.answered_until.get(&reader).copied().unwrap_or(now);
        until <= now + RIB_READ_BURST
    }

    /// Charges neighbour `reader` `objects` (those built to answer it).
    fn charge(&mut self, now: Instant, reader: Address, objects: usize) {
        let until = self.answered_until.get(&reader).copied().unwrap_or(now);
        let cost = std::time::Duration::from_nanos(
            (objects as u64).saturating_mul(1_000_000_000 / RIB_READ_OBJECTS_PER_S),
        );
        self.answered_until.insert(reader, until.max(now) + cost);
    }
}

impl RemoteReads {
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.reads
            .values()
            .map(|r| r.next_retry.min(r.deadline))
            .min()
    }
}

impl NormalIpcp {
    /// Starts reading the RIB of the neighbour `neighbor` (its IPCP name as
    /// its hellos give it, or its address) under `path`, `depth` levels
    /// deep (all with `None`). Returns the handle that the outcome,
    /// [`Action::RibRead`], names.
    pub fn read_remote_rib(
        &mut self,
        now: Instant,
        neighbor: &str,
        path: &str,
        depth: Option<u32>,
    ) -> Result<u64, NormalError> {
        self.tick(now);
        let (port, dst) = self
            .find_neighbor(neighbor)
            .ok_or_else(|| NormalError::NoSuchNeighbor(neighbor.to_string()))?;
        if self.rib_reads.reads.len() >= MAX_REMOTE_READS {
            return Err(NormalError::NoResources(format!(
                "{MAX_REMOTE_READS} RIB reads under way"
            )));
        }
        self.rib_reads.next_handle += 1;
        let handle = self.rib_reads.next_handle;
        let read = RemoteRead {
            port,
            dst,
            path: path.to_string(),
            depth,
            invoke: 0,
            objects: BTreeMap::new(),
            bytes: 0,
            next_retry: now,
            deadline: now + self.cfg.alloc_timeout,
        };
        self.rib_reads.reads.insert(handle, read);
        self.send_read(now, handle);
        self.flush(now);
        Ok(handle)
    }

    /// The neighbour named `who` (IPCP name or address): its port and
    /// address.
    fn find_neighbor(&self, who: &str) -> Option<(N1Port, Address)> {
        let by_name = self
            .hello_neighbors()
            .into_iter()
            .find(|(_, n, _)| n.to_string() == who || n.process_name == who)
            .map(|(p, _, a)| (p, a));
        by_name.or_else(|| {
            let addr: Address = who.parse().ok()?;
            self.neighbors
                .iter()
                .find(|(_, (a, _))| *a == addr)
                .map(|(p, (a, _))| (*p, *a))
        })
    }

    /// Sends (again) read `handle`, with a fresh invoke id of the session
    /// with the neighbour (answers to the old one are not waited for).
    fn send_read(&mut self, now: Instant, handle: u64) {
        let retry = self.cfg.alloc_retry * 4;
        let Some(r) = self.rib_reads.reads.get_mut(&handle) else {
            return;
        };
        let (port, old) = (r.port, r.invoke);
        r.objects.clear();
        r.next_retry = now + retry;
        let mut m = CdapMessage::read("", &r.path);
        m.obj_class = None;
        if let Some(d) = r.depth {
            m = m.with_scope(d.min(i32::MAX as u32) as i32);
        }
        let peer = Peer::Neighbor(port);
        if old != 0 {
            self.mgmt.settle(peer, old);
        }
        let invoke = self.send_request(now, peer, OwnerId::RIB_DAEMON, m);
        if let Some(r) = self.rib_reads.reads.get_mut(&handle) {
            r.invoke = invoke;
        }
    }

    /// Answers a neighbour's `M_READ` under the DIF's access policy.
    pub(super) fn answer_read(&mut self, now: Instant, port: N1Port, req: &CdapMessage) {
        let Some(&(dst, _)) = self.neighbors.get(&port) else {
            // Not a member we know: nothing of the RIB leaves.
            self.counters.rx_mgmt_malformed += 1;
            return;
        };
        let path = req.obj_name.clone().unwrap_or_else(|| "/".into());
        let depth = match req.scope {
            Some(s) if s >= 0 => s as usize,
            _ => ALL_LEVELS,
        };
        let readable = self.cfg.rib_readable.iter().any(|p| under(&path, p));
        let entries = if !readable {
            Err((
                2,
                format!("{path} is not readable by members of {}", self.cfg.dif),
            ))
        } else if !self.rib_reads.may_answer(now, dst) {
            // Refused before anything is built: a refusal costs nothing
            // in proportion to the RIB.
            self.counters.rib_reads_limited += 1;
            Err((
                RESULT_READ_LIMITED,
                format!(
                    "too many RIB objects read: members of {} are answered at most \
                     {RIB_READ_OBJECTS_PER_S} a second each; ask again later",
                    self.cfg.dif
                ),
            ))
        } else {
            // The view is built whole whatever the path: the reader pays
            // for every object built, at least one.
            let rib = self.rib();
            #[cfg(test)]
            {
                self.rib_reads.built += 1;
            }
            self.rib_reads.charge(now, dst, rib.len().max(1));
            rib.snapshot(&path, depth).map_err(|e| (1, e.to_string()))
        };
        let out: Vec<CdapMessage> = match entries {
            Err((code, reason)) => {
                let Ok(r) = CdapMessage::response_to(req, code, &reason) else {
                    return;
                };
                vec![r]
            }
            Ok(entries) => {
                let n = entries.len();
                entries
                    .into_iter()
                    .enumerate()
                    .filter_map(|(i, e)| {
                        let mut r = CdapMessage::response_to(req, 0, "").ok()?;
                        r.obj_class = Some(e.class);
                        r.obj_name = Some(e.name);
                        r.obj_inst = i64::try_from(e.instance).ok();
                        r = r.with_value(e.value_summary).with_version(i as i64);
                        if i + 1 < n {
                            r = r.with_flags(Flags::RdIncomplete);
                        }
                        Some(r)
                    })
                    .collect()
            }
        };
        self.counters.rib_reads_answered += 1;
        for m in out {
            self.send_management(now, port, dst, &payload_of(&m));
        }
    }

    /// One object (or the refusal) of a read this IPCP asked for.
    pub(super) fn on_read_response(&mut self, port: Option<N1Port>, msg: &CdapMessage) {
        let found = self
            .rib_reads
            .reads
            .iter()
            .find(|(_, r)| Some(r.port) == port && Some(r.invoke) == msg.invoke_id)
            .map(|(h, _)| *h);
        let Some(handle) = found else {
            self.counters.rx_mgmt_malformed += 1;
            return;
        };
        if msg.result.unwrap_or(0) != 0 {
            self.rib_reads.reads.remove(&handle);
            let reason = msg.result_reason.clone().unwrap_or_default();
            self.actions.push_back(Action::RibRead {
                handle,
                result: Err(RibReadError::Refused(reason)),
            });
            return;
        }
        let Some(r) = self.rib_reads.reads.get_mut(&handle) else {
            return;
        };
        let value = match msg.value() {
            Some(Value::Str(s)) => s,
            Some(v) => format!("{v:?}"),
            None => String::new(),
        };
        let pos = msg.version.unwrap_or(0);
        if let Some(name) = &msg.obj_name {
            let class = msg.obj_class.clone().unwrap_or_default();
            // The peer numbers the parts and may send any number of them
            // before the deadline: positions and bytes are bounded.
            r.bytes += name.len() + class.len() + value.len();
            let in_range = usize::try_from(pos).is_ok_and(|p| p < MAX_READ_OBJECTS);
            if !in_range || r.bytes > MAX_READ_BYTES {
                let address = r.dst;
                self.rib_reads.reads.remove(&handle);
                self.counters.rx_mgmt_malformed += 1;
                self.actions.push_back(Action::RibRead {
                    handle,
                    result: Err(RibReadError::TooLarge { address }),
                });
                return;
            }
            let old = r.objects.insert(
                pos,
                RibObjectInfo {
                    name: name.clone(),
                    class,
                    instance: msg.obj_inst.map_or(0, |i| i as u64),
                    value,
                    owner: REMOTE_OWNER.into(),
                },
            );
            if let Some(o) = old {
                r.bytes -= o.name.len() + o.class.len() + o.value.len();
            }
        }
        // The last part came; complete only if none before it was lost
        // (else the read is asked again when its retry is due).
        // `pos` is the peer's: at i64::MAX, `pos + 1` overflows.
        let whole = !msg.is_incomplete()
            && i64::try_from(r.objects.len()).ok() == pos.checked_add(1)
            && r.objects.keys().next_back() == Some(&pos);
        if whole {
            if let Some(r) = self.rib_reads.reads.remove(&handle) {
                self.actions.push_back(Action::RibRead {
                    handle,
                    result: Ok(r.objects.into_values().collect()),
                });
            }
        }
    }

    /// Repeats reads not complete in time, fails those past their deadline.
    pub(super) fn rib_read_timeout(&mut self, now: Instant) {
        let due: Vec<(u64, bool)> = self
            .rib_reads
            .reads
            .iter()
            .filter(|(_, r)| now >= r.next_retry || now >= r.deadline)
            .map(|(h, r)| (*h, now >= r.deadline))
            .collect();
        for (handle, expired) in due {
            if !expired {
                self.send_read(now, handle);
                continue;
            }
            if let Some(r) = self.rib_reads.reads.remove(&handle) {
                self.mgmt.settle(Peer::Neighbor(r.port), r.invoke);
                self.actions.push_back(Action::RibRead {
                    handle,
                    result: Err(RibReadError::Timeout {
                        address: r.dst,
                        within: self.cfg.alloc_timeout,
                    }),
                });
            }
        }
    }
}

/// Whether object `name` is `prefix` or under it. Only `/` is the whole
/// RIB: a prefix that is not an object name (`""`, `ra`) has nothing under
/// it, so a slip in the policy closes rather than opens.
fn under(name: &str, prefix: &str) -> bool {
    let p = prefix.trim_end_matches('/');
    if p.is_empty() {
        return prefix.starts_with('/');
    }
    p.starts_with('/') && (name == p || name.strip_prefix(p).is_some_and(|r| r.starts_with('/')))
}

#[cfg(test)]
mod tests {
    use super::under;

    #[test]
    fn a_readable_prefix_covers_its_subtree_and_only_slash_covers_all() {
        assert!(under("/ra", "/ra"));
        assert!(under("/ra/pduft", "/ra"));
        assert!(under("/ra/pduft", "/ra/"));
        assert!(!under("/rax", "/ra"));
        assert!(!under("/", "/ra"));
        assert!(under("/difm/enr", "/"));
        // Not object names: nothing is under them (an empty string in the
        // policy opened the whole RIB).
        for bad in ["", "ra", "ra/pduft"] {
            assert!(!under("/ra/pduft", bad), "{bad:?}");
            assert!(!under("/", bad), "{bad:?}");
        }
    }
}
