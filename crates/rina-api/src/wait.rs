//! The wait descriptors `RINA_F_NOWAIT` calls handed out, so that
//! `rina_flow_alloc_wait` and `rina_register_wait` take only those: any
//! other descriptor would be read from and then closed.

use crate::error::Result;
use crate::sys::{self, Key};
use std::collections::BTreeSet;
use std::os::fd::{IntoRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

/// Wait descriptors remembered; the oldest are forgotten beyond this
/// (socket inodes only grow, so the smallest key is the oldest), as a
/// program that closes its wait descriptors itself never waits on them.
const MAX_HANDLES: usize = 65536;

/// Socket identities of the wait descriptors not yet waited on.
static HANDLES: Mutex<BTreeSet<Key>> = Mutex::new(BTreeSet::new());

fn handles() -> std::sync::MutexGuard<'static, BTreeSet<Key>> {
    HANDLES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Hands `fd` to the program as a wait descriptor.
pub fn hand_out(fd: OwnedFd) -> Result<RawFd> {
    let key = sys::key(std::os::fd::AsRawFd::as_raw_fd(&fd))?;
    let mut h = handles();
    h.insert(key);
    while h.len() > MAX_HANDLES {
        h.pop_first();
    }
    Ok(fd.into_raw_fd())
}

/// Whether the descriptor with identity `key` is a wait descriptor handed
/// out and not yet waited on.
pub fn is_handle(key: Key) -> bool {
    handles().contains(&key)
}

/// The wait descriptor with identity `key` is being waited on (and then
/// closed): no longer one.
pub fn taken(key: Key) {
    handles().remove(&key);
}
