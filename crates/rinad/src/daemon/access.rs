//! Who may do what on the control socket, and how many connections each
//! user may hold.
//!
//! Every control connection carries the credentials of the process that
//! opened it (`SO_PEERCRED`). Administrators are root, the user the daemon
//! runs as, and members of the configured `admin_group`. A name registered
//! by a user can be unregistered, and its flows listed or deallocated, only
//! by that user or an administrator; management commands (reading a RIB,
//! changing a scheduling policy) need an administrator; listings show a
//! user who is not an administrator only their own names and flows.
//!
//! Connections: a user who is not an administrator may hold
//! `max_conns_per_user` of them; the last [`ADMIN_RESERVE`] of the
//! daemon's [`MAX_CONNS`] are kept for administrators; a connection that
//! holds nothing (no name, no flow, no request in progress) and says
//! nothing for `idle_timeout_ms` is closed.
//!
//! Flows: every flow costs the daemon a descriptor, so a user who is not an
//! administrator may hold `max_flows_per_user` flows (open, or being
//! allocated or accepted; default a quarter of the daemon's descriptor
//! limit), and none once fewer than [`fd_reserve`] descriptors are left:
//! those are kept for administrators and the daemon's own N-1 flows. A
//! descriptor that cannot be made is logged at most once a second, with the
//! count of those not logged ([`Throttle`]).

use super::*;
use crate::sys::PeerCred;
use std::collections::HashSet;

/// Connections of [`MAX_CONNS`] that only administrators may take.
pub const ADMIN_RESERVE: usize = 64;

/// The access policy of the daemon, from its configuration.
pub(super) struct Access {
    /// The user the daemon runs as.
    euid: u32,
    /// The `admin_group`'s id.
    admin_gid: Option<u32>,
    /// Users listed as members of `admin_group`.
    admin_uids: Vec<u32>,
    /// Connections per non-administrator.
    pub per_user: usize,
    /// Idle timeout of connections that hold nothing.
    pub idle: Duration,
    /// The daemon's descriptor limit (`RLIMIT_NOFILE`).
    fd_limit: usize,
    /// Flows (open or in progress) per non-administrator.
    flows_per_user: usize,
    /// The `max_flows_per_user` key was set (else the default applies).
    flows_configured: bool,
    /// Flows (open or in progress) per user, administrators included.
    held: HashMap<u32, usize>,
    /// Warnings that a descriptor could not be made.
    pub no_fd: Throttle,
}

/// Descriptors users who are not administrators leave free, of a daemon
/// whose limit is `fd_limit`: an eighth, at least 64, at most 4,096.
pub(super) fn fd_reserve(fd_limit: usize) -> usize {
    (fd_limit / 8).clamp(64, 4096)
}

/// Descriptors the daemon holds besides flows and connections (listener,
/// poller, signal pipes, logs, media), counted generously.
const FD_BASE: usize = 32;

/// A warning that may come once per flow, logged at most once per
/// [`Throttle::EVERY`] with the count of those left out.
#[derive(Default)]
pub(super) struct Throttle {
    /// When a line was last logged.
    last: Option<Instant>,
    /// Occurrences since then, not logged.
    skipped: u64,
}

impl Throttle {
    /// Least time between two lines.
    pub const EVERY: Duration = Duration::from_secs(1);

    /// One more occurrence at `now`: `Some(n)` if it is to be logged, `n`
    /// being how many were left out before it.
    pub fn hit(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_since(t) < Self::EVERY => {
                self.skipped += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.skipped))
            }
        }
    }
}

/// Why a flow was not given to a user.
#[derive(Debug)]
pub(super) enum FlowRefusal {
    /// The user holds `max_flows_per_user` flows already.
    UserLimit {
        uid: u32,
        limit: usize,
        configured: bool,
    },
    /// Too few of the daemon's descriptors are left for users who are not
    /// administrators.
    Reserve { left: usize, fd_limit: usize },
}

impl FlowRefusal {
    /// The error the client gets.
    pub(super) fn error(&self) -> CtlError {
        let m = match self {
            FlowRefusal::UserLimit { uid, limit, configured } => format!(
                "user {uid} already holds {limit} flows (open or being allocated), the most one user may (max_flows_per_user{}); close some",
                if *configured { "" } else { ", by default a quarter of the daemon's descriptor limit" }
            ),
            FlowRefusal::Reserve { left, fd_limit } => format!(
                "the daemon has about {left} of its {fd_limit} descriptors left, kept for administrators and its own N-1 flows"
            ),
        };
        CtlError::new(ErrorKind::NoResources, m)
    }
}

/// Why a connection was not taken.
#[derive(Debug)]
pub(super) enum Refusal {
    /// The user holds its share of connections already.
    UserLimit { uid: u32, limit: usize },
    /// The daemon serves as many connections as it may for non-administrators.
    Full { limit: usize },
}

impl Refusal {
    /// The error sent to the refused client before it is closed.
    pub(super) fn error(&self) -> CtlError {
        let m = match self {
            Refusal::UserLimit { uid, limit } => format!(
                "user {uid} already holds {limit} control connections, the most one user may (max_conns_per_user); close some"
            ),
            Refusal::Full { limit } => format!(
                "the daemon serves {limit} control connections, the most it takes from users who are not administrators"
            ),
        };
        CtlError::new(ErrorKind::NoResources, m)
    }
}

impl Access {
    /// The policy of `sys`; fails if `admin_group` names no group.
    pub(super) fn new(sys: &crate::config::System) -> Result<Access, DaemonError> {
        let (admin_gid, admin_uids) = match &sys.admin_group {
            Some(g) => {
                let (gid, uids) = sys::group_members(g)
                    .map_err(io_ctx(format!("admin_group {g:?} cannot be resolved")))?;
                (Some(gid), uids)
            }
            None => (None, Vec::new()),
        };
        Ok(Access {
            euid: sys::euid(),
            admin_gid,
            admin_uids,
            per_user: sys.conns_per_user(),
            idle: sys.idle_timeout(),
            fd_limit: usize::MAX,
            flows_per_user: sys.flows_per_user(u64::MAX),
            flows_configured: sys.max_flows_per_user.is_some(),
            held: HashMap::new(),
            no_fd: Throttle::default(),
        })
    }

    /// Puts the policy `fresh` (made by [`Access::new`] from `sys`, a
    /// reloaded `[system]` table) in force: the descriptor limit, the flows
    /// users hold and the warnings' throttle carry over.
    pub(super) fn replace(&mut self, mut fresh: Access, sys: &crate::config::System) {
        fresh.fd_limit = self.fd_limit;
        fresh.flows_per_user = sys.flows_per_user(u64::try_from(self.fd_limit).unwrap_or(u64::MAX));
        fresh.held = std::mem::take(&mut self.held);
        fresh.no_fd = std::mem::take(&mut self.no_fd);
        *self = fresh;
    }

    /// The daemon's descriptor limit is `fd_limit`: the default number of
    /// flows per user follows from it.
    pub(super) fn set_fd_limit(&mut self, sys: &crate::config::System, fd_limit: u64) {
        self.fd_limit = usize::try_from(fd_limit).unwrap_or(usize::MAX);
        self.flows_per_user = sys.flows_per_user(fd_limit);
    }

    /// User `uid` holds one more flow (open or in progress).
    pub(super) fn charge(&mut self, uid: u32) {
        *self.held.entry(uid).or_default() += 1;
    }

    /// User `uid` holds one flow less.
    pub(super) fn discharge(&mut self, uid: u32) {
        if let std::collections::hash_map::Entry::Occupied(mut e) = self.held.entry(uid) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }

    /// Whether the peer with credentials `c` is an administrator.
    pub(super) fn is_admin(&self, c: &PeerCred) -> bool {
        c.uid == 0
            || c.uid == self.euid
            || self.admin_uids.contains(&c.uid)
            || self
                .admin_gid
                .is_some_and(|g| c.gid == g || c.groups.contains(&g))
    }
}

impl Daemon {
    /// Whether a new connection from `cred` may be served, given those open.
    pub(super) fn admit(&self, cred: &PeerCred, admin: bool) -> Result<(), Refusal> {
        if admin {
            return Ok(());
        }
        let limit = MAX_CONNS - ADMIN_RESERVE;
        if self.conns.values().filter(|c| !c.admin).count() >= limit {
            return Err(Refusal::Full { limit });
        }
        let mine = self
            .conns
            .values()
            .filter(|c| c.cred.uid == cred.uid)
            .count();
        if mine >= self.access.per_user {
            return Err(Refusal::UserLimit {
                uid: cred.uid,
                limit: self.access.per_user,
            });
        }
        Ok(())
    }

    /// Whether connection `conn` may start one more flow (allocate or
    /// accept): always for an administrator, else within its user's share
    /// and the descriptors left to users.
    pub(super) fn may_open_flow(&self, conn: usize) -> Result<(), FlowRefusal> {
        let Some(c) = self.conns.get(&conn) else {
            return Ok(());
        };
        if c.admin {
            return Ok(());
        }
        let a = &self.access;
        let uid = c.cred.uid;
        if a.held.get(&uid).copied().unwrap_or(0) >= a.flows_per_user {
            return Err(FlowRefusal::UserLimit {
                uid,
                limit: a.flows_per_user,
                configured: a.flows_configured,
            });
        }
        // Two descriptors while a flow is made, one while it is open (none
        // for a flow in a bundle, one for the bundle).
        let in_use = FD_BASE
            + self.ipcps.len()
            + self.conns.len()
            + (self.flows.len() - self.bundled)
            + self.bundles.len()
            + self.allocs.len()
            + 2;
        let left = a.fd_limit.saturating_sub(in_use);
        if left < fd_reserve(a.fd_limit) {
            return Err(FlowRefusal::Reserve {
                left,
                fd_limit: a.fd_limit,
            });
        }
        Ok(())
    }

    /// Logs, at most once a second, that a descriptor for a flow could not
    /// be made (`what` of it), with how many such lines were left out.
    pub(super) fn warn_no_descriptor(&mut self, what: &str, error: &CtlError) {
        let now = self.now();
        if let Some(skipped) = self.access.no_fd.hit(now) {
            warn!(error = %error.message, more_not_logged = skipped, "{what}: no descriptor");
        }
    }

    /// Whether connection `conn` is an administrator's.
    pub(super) fn conn_admin(&self, conn: usize) -> bool {
        self.conns.get(&conn).is_some_and(|c| c.admin)
    }

    /// The user of connection `conn` (`u32::MAX`, nobody's, if it is gone).
    pub(super) fn conn_uid(&self, conn: usize) -> u32 {
        self.conns.get(&conn).map_or(u32::MAX, |c| c.cred.uid)
    }

    /// Refuses a management command `what` to a client that is not an administrator.
    pub(super) fn require_admin(&self, conn: usize, what: &str) -> Result<(), CtlError> {
        if self.conn_admin(conn) {
            return Ok(());
        }
        Err(CtlError::new(
            ErrorKind::PermissionDenied,
            format!(
                "{what} is a management command: only root, the daemon's user (uid {}) or members of its admin_group may use it, not uid {}",
                self.access.euid,
                self.conn_uid(conn)
            ),
        ))
    }

    /// Whether `conn` may act on something of user `owner`.
    pub(super) fn may_touch(&self, conn: usize, owner: u32) -> bool {
        self.conn_admin(conn) || self.conn_uid(conn) == owner
    }

    /// Closes the connections that hold nothing and were silent for the
    /// idle timeout; returns when to look again.
    pub(super) fn sweep_idle(&mut self, now: Instant) -> Instant {
        let idle = self.access.idle;
        let mut busy: HashSet<usize> = self.allocs.values().map(|a| a.conn).collect();
        busy.extend(self.incoming.values().map(|i| i.conn));
        // A client waiting for an enrollment or a remote RIB read waits
        // for the daemon, not the other way round.
        busy.extend(self.enrolls.iter().map(|e| e.conn()));
        busy.extend(self.rib_reads.values().map(|&(conn, _)| conn));
        // Its bundles close with it if they hold no flow.
        busy.extend(self.bundles.values().map(|b| b.owner));
        for (&id, c) in &self.conns {
            let silent = now.saturating_since(c.last_seen) >= idle;
            let holds = c.flows > 0 || !c.names.is_empty() || !c.out.is_empty();
            if silent && !holds && !busy.contains(&id) {
                debug!(
                    conn = id,
                    uid = c.cred.uid,
                    "closing an idle control connection"
                );
                self.closing.push(id);
            }
        }
        now + (idle / 4).max(Duration::from_millis(10))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttled_warning_comes_once_a_second_with_the_count_left_out() {
        let mut t = Throttle::default();
        let at = |ms: u64| Instant::from_nanos(ms * 1_000_000);
        assert_eq!(t.hit(at(5)), Some(0));
        for ms in 6..1000 {
            assert_eq!(t.hit(at(ms)), None);
        }
        assert_eq!(t.hit(at(1005)), Some(994));
        assert_eq!(t.hit(at(1006)), None);
        assert_eq!(t.hit(at(3000)), Some(1));
    }

    #[test]
    fn the_descriptor_reserve_is_an_eighth_within_bounds() {
        assert_eq!(fd_reserve(20_000), 2_500);
        assert_eq!(fd_reserve(1_024), 128);
        assert_eq!(fd_reserve(100), 64);
        assert_eq!(fd_reserve(1 << 20), 4_096);
    }
}
