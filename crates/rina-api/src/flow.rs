//! Flow allocation on a connection of its own, and what is known about the
//! flow descriptors handed out.

use crate::control::wait_reply;
use crate::error::{ApiError, Result};
use crate::sys::{self, Deadline, Key};
use rina_wire::ctl::{self, ErrorKind, FlowInfo, Op, Reply, Request};
use rina_wire::{AppName, QosSpec};
use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

/// Flows remembered for `rina_flow_mss_get`; the oldest are forgotten
/// beyond this (socket inodes only grow, so the smallest key is the oldest).
const MAX_REMEMBERED: usize = 65536;

/// Flow socket identity -> largest SDU.
static FLOWS: Mutex<BTreeMap<Key, u32>> = Mutex::new(BTreeMap::new());

/// Starts an allocation on a new daemon connection; returns it: it turns
/// readable when the daemon answers.
pub fn start_alloc(
    dif: Option<String>,
    local: AppName,
    remote: AppName,
    qos: QosSpec,
) -> Result<OwnedFd> {
    let deadline = Deadline::after(crate::control::timeout());
    let c = sys::connect_daemon(&deadline)?;
    let req = Request {
        id: 1,
        op: Op::Allocate {
            local,
            remote,
            dif,
            qos,
            rings: false,
            direct: false,
            bundle: None,
        },
    };
    send_request(&c, &req, &deadline, "the allocation request")?;
    Ok(c)
}

/// Takes the flow out of a reply, remembers its largest SDU and hands its
/// descriptor over.
pub fn take_flow((reply, fd): (Reply, Option<OwnedFd>)) -> Result<RawFd> {
    let Reply::Flow(info) = reply else {
        return Err(ApiError::Protocol(
            "the daemon answered without a flow".into(),
        ));
    };
    let Some(fd) = fd else {
        return Err(ApiError::Protocol(format!(
            "the daemon announced flow {} without its descriptor",
            info.port
        )));
    };
    if let Ok(k) = sys::key(fd.as_raw_fd()) {
        remember(k, info.max_sdu);
    }
    Ok(fd.into_raw_fd())
}

/// Completes an allocation started by [`start_alloc`]; the connection is
/// closed in any case.
pub fn finish_alloc(w: OwnedFd) -> Result<RawFd> {
    take_flow(wait_reply(&w, false)?)
}

/// Whether the socket `key` is a flow this library handed out.
pub fn is_flow(key: Key) -> bool {
    FLOWS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains_key(&key)
}

/// The largest SDU of flow descriptor `fd`: remembered if this library
/// handed it out (or was asked before), else asked of the daemon, which
/// knows every flow by its socket: a descriptor inherited across `exec`,
/// or passed by another process.
pub fn mss(fd: RawFd) -> Result<u32> {
    let k = sys::key(fd)?;
    if let Some(&m) = FLOWS.lock().unwrap_or_else(|p| p.into_inner()).get(&k) {
        return Ok(m);
    }
    let not_a_flow = || ApiError::BadFd(format!("descriptor {fd} is not a RINA flow"));
    // Only a socket can be a flow (a direct flow's is a UDP socket); a
    // control descriptor of this library is none.
    if !sys::is_socket(fd) || crate::control::is_control(k) {
        return Err(not_a_flow());
    }
    let info = ask_daemon(k).map_err(|e| match e {
        ApiError::Daemon(c) if c.kind == ErrorKind::UnknownFlow => {
            ApiError::BadFd(format!("descriptor {fd} is not a RINA flow: {}", c.message))
        }
        other => other,
    })?;
    remember(k, info.max_sdu);
    Ok(info.max_sdu)
}

/// Remembers that socket `k` is a flow whose largest SDU is `max_sdu`.
pub(crate) fn remember(k: Key, max_sdu: u32) {
    let mut flows = FLOWS.lock().unwrap_or_else(|p| p.into_inner());
    flows.insert(k, max_sdu);
    while flows.len() > MAX_REMEMBERED {
        flows.pop_first();
    }
}

/// Asks the daemon, on a connection of its own, which flow has socket
/// `(dev, ino)` as its application end ([`Op::FlowBySocket`]).
fn ask_daemon((dev, ino): Key) -> Result<FlowInfo> {
    let deadline = Deadline::after(crate::control::timeout());
    let c = sys::connect_daemon(&deadline)?;
    let req = Request {
        id: 1,
        op: Op::FlowBySocket { dev, ino },
    };
    send_request(&c, &req, &deadline, "the question about the descriptor")?;
    match wait_reply(&c, true)? {
        (Reply::Flow(info), _) => Ok(info),
        _ => Err(ApiError::Protocol(
            "the daemon answered a question about a flow without one".into(),
        )),
    }
}

/// Sends `req` (`what`, for the message) on the daemon connection `c` of
/// one call, bounded by `deadline`.
fn send_request(c: &OwnedFd, req: &Request, deadline: &Deadline, what: &str) -> Result<()> {
    match sys::send_until(c.as_fd(), &ctl::encode(req), &[], deadline) {
        Ok(true) => Ok(()),
        Ok(false) => Err(ApiError::Timeout(format!(
            "the daemon did not take {what} within {deadline} \
             (it is alive but does not read its control connection)"
        ))),
        Err(e) => Err(ApiError::sys(
            e,
            format!("cannot send {what} to the daemon"),
        )),
    }
}
