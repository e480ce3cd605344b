//! Maps keyed by ids this system hands out itself.
//!
//! Ports, flow ids and CEP-ids are allocated here, so no peer chooses the
//! keys that go into these maps, and a hash without a secret key cannot be
//! driven into collisions from the wire. They sit on the per-PDU path (the
//! RMT's queue per port, a flow by its CEP-id), where SipHash cost about
//! 8 % of the core's time per PDU; FxHash is a multiply and a rotate.
//! Maps with keys a peer chooses (addresses, names, MAC addresses, a
//! peer's port ids) keep the standard library's keyed SipHash.

use std::collections::{HashMap, HashSet};

/// A map keyed by an id this system allocated.
pub type IdMap<K, V> = HashMap<K, V, rustc_hash::FxBuildHasher>;

/// A set of ids this system allocated.
pub type IdSet<K> = HashSet<K, rustc_hash::FxBuildHasher>;
