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
        })
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
