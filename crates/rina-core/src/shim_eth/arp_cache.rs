//! The ARP cache of a shim-eth IPCP: its entries by name, and the same
//! names in the order they expire, so that the next expiry, the expired
//! entries and the entry to evict are found without a scan of the cache.

use super::ArpEntry;
use crate::time::Instant;
use rina_wire::AppName;
use std::collections::{BTreeMap, BTreeSet};

/// Names and where they live, ordered by name and by expiry.
#[derive(Debug, Default)]
pub(super) struct ArpCache {
    entries: BTreeMap<AppName, ArpEntry>,
    /// Every entry's `(expires, name)`: the order of expiry.
    by_expiry: BTreeSet<(Instant, AppName)>,
}

impl ArpCache {
    /// The entry of `name`, if any.
    pub(super) fn get(&self, name: &AppName) -> Option<&ArpEntry> {
        self.entries.get(name)
    }

    /// Whether `name` has an entry.
    pub(super) fn contains(&self, name: &AppName) -> bool {
        self.entries.contains_key(name)
    }

    /// Number of entries.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// The entries, by name.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&AppName, &ArpEntry)> {
        self.entries.iter()
    }

    /// Puts (or replaces) the entry of `name`.
    pub(super) fn insert(&mut self, name: AppName, entry: ArpEntry) {
        if let Some(old) = self.entries.get(&name) {
            self.by_expiry.remove(&(old.expires, name.clone()));
        }
        self.by_expiry.insert((entry.expires, name.clone()));
        self.entries.insert(name, entry);
    }

    /// Removes the entry of `name`.
    pub(super) fn remove(&mut self, name: &AppName) -> Option<ArpEntry> {
        let e = self.entries.remove(name)?;
        self.by_expiry.remove(&(e.expires, name.clone()));
        Some(e)
    }

    /// Moves the expiry of `name`'s entry to `expires`.
    pub(super) fn set_expires(&mut self, name: &AppName, expires: Instant) {
        if let Some(e) = self.entries.get(name).copied() {
            self.insert(name.clone(), ArpEntry { expires, ..e });
        }
    }

    /// When the first entry expires, if there is one.
    pub(super) fn next_expiry(&self) -> Option<Instant> {
        self.by_expiry.first().map(|(t, _)| *t)
    }

    /// The names whose entries expired at `now`, soonest first.
    pub(super) fn expired(&self, now: Instant) -> Vec<AppName> {
        self.by_expiry
            .iter()
            .take_while(|(t, _)| *t <= now)
            .map(|(_, n)| n.clone())
            .collect()
    }

    /// The name whose entry expires first among those `keep` does not
    /// hold on to (it is asked of the entries in order of expiry).
    pub(super) fn first_to_evict(&self, keep: impl Fn(&ArpEntry) -> bool) -> Option<AppName> {
        self.by_expiry
            .iter()
            .find(|(_, n)| self.entries.get(n).is_some_and(|e| !keep(e)))
            .map(|(_, n)| n.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rina_wire::shim_eth::MacAddr;

    fn at(ms: u64) -> Instant {
        Instant::from_nanos(ms * 1_000_000)
    }

    fn entry(last: u8, ms: u64) -> ArpEntry {
        ArpEntry {
            mac: MacAddr([2, 0, 0, 0, 0, last]),
            expires: at(ms),
        }
    }

    #[test]
    fn the_order_of_expiry_follows_inserts_moves_and_removals() {
        let mut c = ArpCache::default();
        let n = |s: &str| -> AppName { s.parse().unwrap() };
        c.insert(n("a"), entry(1, 30));
        c.insert(n("b"), entry(2, 10));
        c.insert(n("c"), entry(3, 20));
        assert_eq!(c.next_expiry(), Some(at(10)));
        // Replaced: its old place in the order is gone.
        c.insert(n("b"), entry(2, 40));
        assert_eq!(c.next_expiry(), Some(at(20)));
        assert_eq!(c.expired(at(30)), vec![n("c"), n("a")]);
        c.set_expires(&n("c"), at(50));
        assert_eq!(c.expired(at(30)), vec![n("a")]);
        // Entries kept are passed over.
        assert_eq!(c.first_to_evict(|e| e.mac.0[5] == 1), Some(n("b")));
        assert_eq!(c.remove(&n("b")), Some(entry(2, 40)));
        assert_eq!(c.first_to_evict(|_| true), None);
        assert_eq!(c.len(), 2);
        c.remove(&n("a"));
        c.remove(&n("c"));
        assert_eq!((c.len(), c.next_expiry()), (0, None));
        assert!(c.expired(at(1000)).is_empty());
    }
}
