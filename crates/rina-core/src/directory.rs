//! The directory of a normal IPCP: which member of the DIF each application
//! is registered at.
//!
//! This is the namespace manager's *directory forwarding table* (DFT), fully
//! replicated and disseminated by controlled flooding, as IRATI's default
//! namespace-manager policy does (`reference/irati.md` §1.1). Every member
//! originates one [`DirEntry`] per application registered locally and floods
//! it; every member keeps the newest entry per (application, origin) and
//! answers [`Directory::lookup`] from that database. When an application
//! unregisters at one system and registers at another, the next lookup
//! anywhere in the DIF answers the new address: the location independence of
//! seed 000 §16.4.3.4, where the echo server moves from System 3 to System 2
//! and the unchanged client reaches it.
//!
//! [`Directory`] is sans-IO like every machine in this crate; its database
//! is the flooded database [`crate::flood::FloodDb`] that
//! [`crate::routing::LinkState`] uses too (judging copies, flooding, database
//! sync, ageing), and it adds what is the directory's own: registrations,
//! versions, withdrawals and copies of its own entries. The caller — the layer management of the
//! IPCP — reports registrations ([`Directory::register`],
//! [`Directory::unregister`]), management flows to neighbours coming up and
//! going down ([`Directory::neighbor_up`], [`Directory::neighbor_down`]),
//! hands over entries received from neighbours ([`Directory::on_entries`]),
//! calls [`Directory::handle_timeout`] when [`Directory::poll_timeout`] says
//! so, and carries out [`Directory::poll_action`]: sending entries on
//! management flows (CDAP `M_WRITE` of a [`DirEntryGroup`] on
//! [`DFT_OBJ_NAME`], see [`encode_entries`] / [`decode_entries`]).
//!
//! # Protocol
//!
//! * **Entries.** An entry says "application `name` is (or, withdrawn, is no
//!   longer) registered at the IPCP with address `address`". Only that IPCP
//!   originates it, so the address is also the origin; the database key is
//!   (name, address). Each change takes the origin's next sequence number
//!   for that name (`seq`); a higher `seq` replaces a lower one, equal ones
//!   are duplicates, lower ones are stale. The last sequence number per name
//!   is kept after the entry is gone, so the origin always moves forward. If
//!   a copy of one of our own entries arrives with a higher `seq` (we
//!   restarted and the DIF remembers us), we jump past it and re-originate
//!   the truth.
//! * **Which registration wins.** When the same name is registered (alive)
//!   at several origins, [`Directory::lookup`] answers the entry with the
//!   highest `version`, ties broken by the lower address. `version` is a
//!   per-name counter with no clock in it: a registration takes one more
//!   than the highest version this member has seen for the name (alive or
//!   withdrawn, from any origin), and keeps it through refreshes and its
//!   withdrawal. So an application that moves (unregistered at C, registered
//!   at B once B has heard of C's entry) is found at B, and an old entry from
//!   C that arrives late — even after C's withdrawal expired — loses to B's.
//!   Every member decides from the same entries with the same rule, so all
//!   members agree once flooding is done. (Two registrations made before
//!   either heard of the other may take the same version; then the lower
//!   address wins everywhere.)
//! * **Versions climb one step at a time.** A received entry whose version
//!   is more than [`MAX_VERSION_STEP`] above the highest this member holds
//!   for the name (0 if none) is dropped and counted (`rx_version_jump`).
//!   Versions grow by one per registration, so no true entry jumps that
//!   far; without the bound, one entry with version `u64::MAX` would take
//!   the name for good (the owner's next registration could not go above
//!   it, and would lose the tie on address). So a registration here can
//!   always outbid what this member holds.
//! * **Withdrawals.** Unregistering floods a tombstone (`alive: false`, next
//!   sequence number, same version). It replaces the alive entry everywhere,
//!   is never refreshed, and expires like any entry after
//!   [`Config::max_age`] — by then every copy of the alive entry it replaced
//!   has expired too, since those were no younger.
//! * **Flooding.** A received entry newer than the database's copy (or
//!   without a copy) is stored and re-flooded on every live port except the
//!   one it came from. What is to be flooded is collected and sent at most
//!   every [`Config::propagation_delay`], in messages of at most
//!   [`Config::max_entries_per_message`] entries.
//! * **Database sync.** A new neighbour gets the whole database
//!   ([`DirectoryAction::Send`]).
//! * **Ageing.** An entry carries its age in whole seconds; it is removed
//!   when the age reaches [`Config::max_age`]. Origins re-originate their
//!   alive entries every [`Config::refresh_interval`], so only the entries
//!   of a member that vanished age out.
//!
//! Everything that reaches an output is iterated in name / address / port
//! order, so two machines fed the same events produce the same actions.

use crate::flood::{FloodDb, Flooded, Limits, Verdict};
use crate::rmt::{Address, PortId};
use crate::time::Instant;
use rina_wire::cdap::{
    decode_object, encode_object, ApplicationProcessNamingInfo, DirectoryForwardingTableEntry,
};
use rina_wire::name::AppName;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;
use thiserror::Error;

/// RIB name of the directory forwarding table; updates are CDAP `M_WRITE`
/// (or `M_CREATE`) on this name with a [`DirEntryGroup`] (IRATI's name for
/// the DFT container).
pub const DFT_OBJ_NAME: &str = "/dif/mgmt/nsm/dft";
/// RIB class of the container [`DFT_OBJ_NAME`].
pub const DFT_OBJ_CLASS: &str = "DirectoryForwardingTableEntries";
/// RIB class of one entry.
pub const DFTE_OBJ_CLASS: &str = "DirectoryForwardingTableEntry";

/// Most a received entry's version may be above the highest this member
/// holds for its name (see the module docs): 2^32 registrations.
pub const MAX_VERSION_STEP: u64 = 1 << 32;

/// One directory entry: where `name` is (or was) registered.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DirEntry {
    /// The application.
    pub name: AppName,
    /// Address of the IPC process the application is registered at — also
    /// the only member that originates this entry.
    pub address: Address,
    /// The origin's sequence number for this name: a higher one replaces a
    /// lower one.
    pub seq: u64,
    /// Per-name registration version: among alive entries of one name, the
    /// highest wins (ties: lower address).
    pub version: u64,
    /// False for a withdrawal (tombstone).
    pub alive: bool,
    /// Age in seconds when the entry was sent.
    pub age: u32,
}

impl DirEntry {
    /// The database key: (name, address).
    pub fn key(&self) -> (AppName, Address) {
        (self.name.clone(), self.address)
    }

    /// Whether `self` beats `other` as the location of their (shared) name:
    /// higher version, then lower address.
    fn beats(&self, other: &DirEntry) -> bool {
        (self.version, std::cmp::Reverse(self.address))
            > (other.version, std::cmp::Reverse(other.address))
    }
}

impl Flooded for DirEntry {
    type Key = (AppName, Address);
    fn key(&self) -> Self::Key {
        DirEntry::key(self)
    }
    fn seq(&self) -> u64 {
        self.seq
    }
    fn age(&self) -> u32 {
        self.age
    }
    fn with_age(&self, age: u32) -> Self {
        DirEntry {
            age,
            ..self.clone()
        }
    }
}

/// Parameters of the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Age at which an entry (alive or withdrawn) is removed. Default 60 s:
    /// how long the registrations of a member that vanished linger, and how
    /// long withdrawals are remembered.
    pub max_age: Duration,
    /// How often an origin re-originates its alive entries. Default 20 s;
    /// must be below `max_age`.
    pub refresh_interval: Duration,
    /// Least time between two floods. Default 100 ms. A flood after a quiet
    /// period leaves at once.
    pub propagation_delay: Duration,
    /// Most entries in one message. Default 15 (with names of at most 255
    /// bytes a message stays under 5 kB; larger N-1 flows than the MTU are
    /// the job of [`crate::mgmt_frag`]).
    pub max_entries_per_message: usize,
    /// Most entries in the database; further new keys are dropped and
    /// counted (own entries are always kept). Default 65 536.
    pub max_entries: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_age: Duration::from_secs(60),
            refresh_interval: Duration::from_secs(20),
            propagation_delay: Duration::from_millis(100),
            max_entries_per_message: 15,
            max_entries: 65_536,
        }
    }
}

impl Config {
    /// Checks that the parameters make sense together.
    pub fn validate(&self) -> Result<(), DirectoryError> {
        if self.max_age < Duration::from_secs(2) {
            return Err(DirectoryError::InvalidConfig(
                "max_age must be at least 2 s (ages travel in whole seconds)",
            ));
        }
        if self.refresh_interval.is_zero() || self.refresh_interval >= self.max_age {
            return Err(DirectoryError::InvalidConfig(
                "refresh_interval must be above zero and below max_age",
            ));
        }
        if self.max_entries_per_message == 0 {
            return Err(DirectoryError::InvalidConfig(
                "max_entries_per_message must be at least 1",
            ));
        }
        if self.max_entries == 0 {
            return Err(DirectoryError::InvalidConfig(
                "max_entries must be at least 1",
            ));
        }
        Ok(())
    }
}

/// Why an operation of the directory failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DirectoryError {
    /// The configuration is inconsistent; the text says which parameter.
    #[error("invalid directory configuration: {0}")]
    InvalidConfig(&'static str),
    /// The application is already registered at this IPC process.
    #[error("{0} is already registered here")]
    AlreadyRegistered(AppName),
    /// The application is not registered at this IPC process.
    #[error("{0} is not registered here")]
    NotRegistered(AppName),
    /// The application name has an empty process name.
    #[error("application name with an empty process name")]
    EmptyName,
    /// The application name is not one its text form gives back (too long,
    /// bad characters, `/` in a part); the reason.
    #[error("invalid application name: {0}")]
    InvalidName(String),
    /// The port is already a live neighbour.
    #[error("port {0} is already up")]
    PortUp(PortId),
    /// No live neighbour on this port.
    #[error("no neighbour on port {0}")]
    UnknownPort(PortId),
    /// The bytes are not a [`DirEntryGroup`].
    #[error("malformed directory entry group: {0}")]
    Malformed(String),
}

/// Something the caller must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirectoryAction {
    /// Send `entries` (one CDAP message) on each of `to_ports`.
    Flood {
        /// The management flows to send on, in port order.
        to_ports: Vec<PortId>,
        /// The entries, with their current ages.
        entries: Vec<DirEntry>,
    },
    /// Send `entries` (one CDAP message) on `port` only (database sync).
    Send {
        /// The management flow.
        port: PortId,
        /// The entries, with their current ages.
        entries: Vec<DirEntry>,
    },
}

/// Counters of the directory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Entries received.
    pub rx_entries: u64,
    /// Received entries that were newer and were stored.
    pub rx_accepted: u64,
    /// Received entries with the same sequence number as the stored copy.
    pub rx_duplicate: u64,
    /// Received entries older than the stored copy.
    pub rx_stale: u64,
    /// Received entries already at the maximum age.
    pub rx_too_old: u64,
    /// Received entries whose name is not valid ([`check_name`]).
    pub rx_invalid: u64,
    /// New entries dropped because the database was full.
    pub rx_db_full: u64,
    /// Copies of our own entries newer than ours (we re-originated past them).
    pub rx_own_newer: u64,
    /// Received entries whose version is more than [`MAX_VERSION_STEP`]
    /// above the highest held for their name.
    pub rx_version_jump: u64,
    /// Local registrations.
    pub registrations: u64,
    /// Local withdrawals.
    pub unregistrations: u64,
    /// Own entries originated (changes and refreshes).
    pub originated: u64,
    /// Own entries re-originated only to refresh them.
    pub refreshed: u64,
    /// Entries removed at maximum age.
    pub expired: u64,
    /// Entry copies sent (one per entry per port).
    pub tx_entries: u64,
    /// Messages sent (one per port per batch).
    pub tx_messages: u64,
    /// Database syncs to a new neighbour.
    pub db_syncs: u64,
}

impl Counters {
    /// The counters by name, for listings.
    pub fn to_map(&self) -> BTreeMap<String, u64> {
        [
            ("rx_entries", self.rx_entries),
            ("rx_accepted", self.rx_accepted),
            ("rx_duplicate", self.rx_duplicate),
            ("rx_stale", self.rx_stale),
            ("rx_too_old", self.rx_too_old),
            ("rx_invalid", self.rx_invalid),
            ("rx_db_full", self.rx_db_full),
            ("rx_own_newer", self.rx_own_newer),
            ("rx_version_jump", self.rx_version_jump),
            ("registrations", self.registrations),
            ("unregistrations", self.unregistrations),
            ("originated", self.originated),
            ("refreshed", self.refreshed),
            ("expired", self.expired),
            ("tx_entries", self.tx_entries),
            ("tx_messages", self.tx_messages),
            ("db_syncs", self.db_syncs),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// A stored entry: as received (its age then), when, and when it expires.
type Stored = crate::flood::Stored<DirEntry>;

/// The directory machine of one IPC process.
#[derive(Debug, Clone)]
pub struct Directory {
    address: Address,
    cfg: Config,
    ports: BTreeSet<PortId>,
    /// The flooded entries; copies come from ports.
    db: FloodDb<DirEntry, PortId>,
    /// Applications registered here.
    local: BTreeSet<AppName>,
    /// Names other IPCPs hold alive at this IPCP's own address (an address
    /// collision), newest last; taken by [`Directory::take_foreign`].
    foreign: Vec<(AppName, u64)>,
    /// Last sequence number used per own name, kept after expiry.
    own_seq: BTreeMap<AppName, u64>,
    /// When the earliest own alive entry needs refreshing: kept by every
    /// method that changes own entries or registrations, so that
    /// [`Directory::poll_timeout`], asked after every event, scans nothing.
    refresh_at: Option<Instant>,
    actions: VecDeque<DirectoryAction>,
    counters: Counters,
}

impl Directory {
    /// A directory for the IPC process at `address`, empty, with no
    /// neighbours.
    pub fn new(address: Address, cfg: Config) -> Result<Self, DirectoryError> {
        cfg.validate()?;
        let limits = Limits {
            max_age: cfg.max_age,
            propagation_delay: cfg.propagation_delay,
            max_per_message: cfg.max_entries_per_message,
            max_objects: cfg.max_entries,
        };
        Ok(Directory {
            address,
            cfg,
            ports: BTreeSet::new(),
            db: FloodDb::new(limits),
            local: BTreeSet::new(),
            foreign: Vec::new(),
            own_seq: BTreeMap::new(),
            refresh_at: None,
            actions: VecDeque::new(),
            counters: Counters::default(),
        })
    }

    /// This IPC process's address.
    pub fn address(&self) -> Address {
        self.address
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Live neighbour ports, in order.
    pub fn ports(&self) -> impl Iterator<Item = PortId> + '_ {
        self.ports.iter().copied()
    }

    /// Applications registered at this IPC process, in name order.
    pub fn registered(&self) -> impl Iterator<Item = &AppName> + '_ {
        self.local.iter()
    }

    /// The database, in key order, with ages as of `now`.
    pub fn entries(&self, now: Instant) -> impl Iterator<Item = DirEntry> + '_ {
        self.db.iter().map(move |(_, s)| s.at(now))
    }

    /// The stored entry for `name` at `address`, with its age as of `now`.
    pub fn entry(&self, now: Instant, name: &AppName, address: Address) -> Option<DirEntry> {
        self.db.get(&(name.clone(), address)).map(|s| s.at(now))
    }

    /// Number of entries in the database (alive and withdrawn).
    pub fn db_len(&self) -> usize {
        self.db.len()
    }

    /// Where `name` is registered: the address of its winning alive entry
    /// (highest version, then lowest address), if any.
    pub fn lookup(&self, name: &AppName) -> Option<Address> {
        self.name_entries(name)
            .filter(|e| e.alive)
            .fold(None::<&DirEntry>, |best, e| match best {
                Some(b) if !e.beats(b) => Some(b),
                _ => Some(e),
            })
            .map(|e| e.address)
    }

    /// Every address `name` is registered (alive) at, in address order.
    pub fn lookup_all(&self, name: &AppName) -> Vec<Address> {
        self.name_entries(name)
            .filter(|e| e.alive)
            .map(|e| e.address)
            .collect()
    }

    /// Registers `name` at this IPC process and floods the entry.
    pub fn register(&mut self, now: Instant, name: AppName) -> Result<(), DirectoryError> {
        check_name(&name)?;
        if self.local.contains(&name) {
            return Err(DirectoryError::AlreadyRegistered(name));
        }
        let version = self.highest_version(&name).saturating_add(1);
        self.local.insert(name.clone());
        self.counters.registrations += 1;
        self.originate(now, name, true, version);
        self.update_refresh_at();
        Ok(())
    }

    /// Withdraws the registration of `name` at this IPC process and floods
    /// the tombstone.
    pub fn unregister(&mut self, now: Instant, name: &AppName) -> Result<(), DirectoryError> {
        if !self.local.remove(name) {
            return Err(DirectoryError::NotRegistered(name.clone()));
        }
        self.counters.unregistrations += 1;
        let version = self.own_version(name);
        self.originate(now, name.clone(), false, version);
        self.update_refresh_at();
        Ok(())
    }

    /// A management flow to a neighbour is up on `port`: it gets the whole
    /// database, and future floods.
    pub fn neighbor_up(&mut self, now: Instant, port: PortId) -> Result<(), DirectoryError> {
        if !self.ports.insert(port) {
            return Err(DirectoryError::PortUp(port));
        }
        self.db_sync(now, port);
        Ok(())
    }

    /// What was sent on `port` since it came up may be lost (in a DIF that
    /// encrypts, floods before the port's keys are dropped): the neighbour
    /// gets the whole database again.
    pub fn resync(&mut self, now: Instant, port: PortId) -> Result<(), DirectoryError> {
        if !self.ports.contains(&port) {
            return Err(DirectoryError::UnknownPort(port));
        }
        self.db_sync(now, port);
        Ok(())
    }

    /// The management flow on `port` is gone.
    pub fn neighbor_down(&mut self, port: PortId) -> Result<(), DirectoryError> {
        if !self.ports.remove(&port) {
            return Err(DirectoryError::UnknownPort(port));
        }
        self.db.forget_peer(port);
        Ok(())
    }

    /// Entries arrived from the neighbour on `from_port`.
    pub fn on_entries(
        &mut self,
        now: Instant,
        from_port: PortId,
        entries: impl IntoIterator<Item = DirEntry>,
    ) {
        let avoid = Some(from_port);
        for e in entries {
            self.counters.rx_entries += 1;
            if check_name(&e.name).is_err() {
                self.counters.rx_invalid += 1;
                continue;
            }
            if self.db.too_old(&e) {
                self.counters.rx_too_old += 1;
                continue;
            }
            if e.version
                > self
                    .highest_version(&e.name)
                    .saturating_add(MAX_VERSION_STEP)
            {
                self.counters.rx_version_jump += 1;
                continue;
            }
            if e.address == self.address {
                self.on_own_copy(now, e);
                continue;
            }
            match self.db.judge(&e) {
                Verdict::Duplicate => self.counters.rx_duplicate += 1,
                Verdict::Stale => self.counters.rx_stale += 1,
                Verdict::Full => self.counters.rx_db_full += 1,
                Verdict::Accept => {
                    self.counters.rx_accepted += 1;
                    self.store(now, e, avoid);
                }
            }
        }
        self.update_refresh_at();
    }

    /// When [`Directory::handle_timeout`] next needs to run, if ever. May be
    /// in the past: then run it at once.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [self.db.poll_timeout(), self.refresh_at]
            .into_iter()
            .flatten()
            .min()
    }

    /// Refreshes own entries, expires old ones and floods what is pending,
    /// each if it is due.
    pub fn handle_timeout(&mut self, now: Instant) {
        // Refresh before expiring, so a late call never lets a true entry die.
        let refresh: Vec<(AppName, u64)> = self
            .own_alive()
            .filter(|s| now >= s.rx_at + self.cfg.refresh_interval)
            .map(|s| (s.obj.name.clone(), s.obj.version))
            .collect();
        for (name, version) in refresh {
            self.counters.refreshed += 1;
            self.originate(now, name, true, version);
        }

        self.counters.expired += self.db.expire(now).len() as u64;

        if self.db.flush_due(now) {
            self.flush(now);
        }
        self.update_refresh_at();
    }

    /// Recomputes [`Directory::refresh_at`] from the own alive entries.
    fn update_refresh_at(&mut self) {
        self.refresh_at = self
            .own_alive()
            .map(|s| s.rx_at + self.cfg.refresh_interval)
            .min();
    }

    /// The next thing the caller must do, if any.
    pub fn poll_action(&mut self) -> Option<DirectoryAction> {
        self.actions.pop_front()
    }

    fn name_entries<'a>(&'a self, name: &AppName) -> impl Iterator<Item = &'a DirEntry> + 'a {
        self.db
            .range((name.clone(), Address::MIN)..=(name.clone(), Address::MAX))
            .map(|s| &s.obj)
    }

    fn own_alive(&self) -> impl Iterator<Item = &Stored> + '_ {
        self.local
            .iter()
            .filter_map(|n| self.db.get(&(n.clone(), self.address)))
            .filter(|s| s.obj.alive)
    }

    /// The version of our own entry for `name` (or one above anything seen).
    fn own_version(&self, name: &AppName) -> u64 {
        match self.db.get(&(name.clone(), self.address)) {
            Some(s) => s.obj.version,
            None => self.highest_version(name).saturating_add(1),
        }
    }

    /// The highest version held for `name` (alive or withdrawn, from any
    /// origin), 0 if none.
    fn highest_version(&self, name: &AppName) -> u64 {
        self.name_entries(name)
            .map(|e| e.version)
            .max()
            .unwrap_or(0)
    }

    /// A copy of one of our own entries came back.
    /// Names another IPCP holds alive at this IPCP's own address, with the
    /// sequence numbers seen, since the last call: entries this IPCP never
    /// originated with a sequence number above its own (it withdraws them,
    /// as any stale copy of its own). A sign that two members share an
    /// address.
    pub fn take_foreign(&mut self) -> Vec<(AppName, u64)> {
        std::mem::take(&mut self.foreign)
    }

    fn on_own_copy(&mut self, now: Instant, e: DirEntry) {
        let ours = self.own_seq.get(&e.name).copied().unwrap_or(0);
        let newer = crate::flood::seq_newer(e.seq, ours, DirEntry::SEQ_BITS);
        if newer && e.alive && !self.local.contains(&e.name) && self.foreign.len() < 64 {
            self.foreign.push((e.name.clone(), e.seq));
        }
        if newer {
            self.counters.rx_own_newer += 1;
            // The name comes from the message: a new one takes room among
            // the kept sequence numbers.
            if !self.own_seq.contains_key(&e.name) && !self.own_seq_room() {
                self.counters.rx_db_full += 1;
                return;
            }
            self.own_seq.insert(e.name.clone(), e.seq);
            let alive = self.local.contains(&e.name);
            if !alive && !self.db.contains(&e.key()) && !self.db.has_room() {
                self.counters.rx_db_full += 1;
                return;
            }
            // Keep the version the DIF knows unless we hold a current one.
            let version = match self.db.get(&e.key()) {
                Some(s) => s.obj.version.max(e.version),
                None => e.version,
            };
            self.originate(now, e.name, alive, version);
        } else if e.seq == ours {
            self.counters.rx_duplicate += 1;
        } else {
            self.counters.rx_stale += 1;
        }
    }

    /// Whether `own_seq` has room for one more name. It keeps the sequence
    /// numbers of entries gone from the database too, so copies claiming
    /// to be ours for ever new names would grow it without end: past twice
    /// the database's bound, it forgets the names that are neither in the
    /// database nor registered here (at most the database's bound plus the
    /// registrations stay, so this happens at most once per that many new
    /// names).
    fn own_seq_room(&mut self) -> bool {
        let cap = self.cfg.max_entries.saturating_mul(2);
        if self.own_seq.len() < cap {
            return true;
        }
        let (db, local, me) = (&self.db, &self.local, self.address);
        self.own_seq
            .retain(|n, _| local.contains(n) || db.contains(&(n.clone(), me)));
        self.own_seq.len() < cap
    }

    /// Originates our entry for `name` with the next sequence number.
    fn originate(&mut self, now: Instant, name: AppName, alive: bool, version: u64) {
        let seq = self.own_seq.entry(name.clone()).or_insert(0);
        *seq = crate::flood::seq_next(*seq, DirEntry::SEQ_BITS);
        let entry = DirEntry {
            name,
            address: self.address,
            seq: *seq,
            version,
            alive,
            age: 0,
        };
        self.counters.originated += 1;
        self.store(now, entry, None);
    }

    /// Stores a newer entry and schedules its flooding.
    fn store(&mut self, now: Instant, entry: DirEntry, avoid: Option<PortId>) {
        self.db.store(now, entry, avoid);
    }

    /// Sends the whole database to a new neighbour, except what the next
    /// flood will bring it anyway.
    fn db_sync(&mut self, now: Instant, port: PortId) {
        self.counters.db_syncs += 1;
        for entries in self.db.sync(now, port) {
            self.counters.tx_messages += 1;
            self.counters.tx_entries += entries.len() as u64;
            self.actions
                .push_back(DirectoryAction::Send { port, entries });
        }
    }

    fn flush(&mut self, now: Instant) {
        let peers: BTreeMap<PortId, PortId> = self.ports.iter().map(|p| (*p, *p)).collect();
        for m in self.db.flush(now, &peers) {
            self.counters.tx_messages += m.to_ports.len() as u64;
            self.counters.tx_entries += (m.objects.len() * m.to_ports.len()) as u64;
            self.actions.push_back(DirectoryAction::Flood {
                to_ports: m.to_ports,
                entries: m.objects,
            });
        }
    }
}

// ---------------------------------------------------------------------------
// Wire form.

/// One directory entry on the wire (ours; no IRATI counterpart): IRATI's
/// `directoryForwardingTableEntry_t` (name, address, `seqnum` = [`DirEntry::seq`])
/// plus what our conflict and ageing rules need.
///
/// Field numbers (ours): 1 the IRATI entry, 2 version, 3 withdrawn (so that
/// an absent field means alive), 4 age in seconds.
#[derive(Clone, PartialEq, Eq, Hash, rina_wire::cdap::prost::Message)]
#[prost(prost_path = "::rina_wire::cdap::prost")]
pub struct DirEntryMessage {
    /// 1: name, address and sequence number, as IRATI writes them.
    #[prost(message, optional, tag = "1")]
    pub entry: Option<DirectoryForwardingTableEntry>,
    /// 2: per-name registration version.
    #[prost(uint64, tag = "2")]
    pub version: u64,
    /// 3: true for a withdrawal (tombstone).
    #[prost(bool, tag = "3")]
    pub withdrawn: bool,
    /// 4: age in seconds.
    #[prost(uint32, tag = "4")]
    pub age: u32,
}

/// A batch of directory entries: the object value of a CDAP message on
/// [`DFT_OBJ_NAME`]. Field numbers (ours): 1 the entries.
#[derive(Clone, PartialEq, Eq, Hash, rina_wire::cdap::prost::Message)]
#[prost(prost_path = "::rina_wire::cdap::prost")]
pub struct DirEntryGroup {
    /// 1: the entries.
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<DirEntryMessage>,
}

/// The IRATI part of an entry: name, address and sequence number.
pub fn dfte_to_wire(e: &DirEntry) -> DirectoryForwardingTableEntry {
    DirectoryForwardingTableEntry {
        application_name: ApplicationProcessNamingInfo::from(&e.name),
        ipc_process_synonym: e.address,
        seqnum: e.seq,
    }
}

/// Whether `name` is a valid application name, as the flow allocator
/// takes names from the wire ([`AppName::check`]): its text form parses
/// (at most [`MAX_NAME_LEN`](rina_wire::name::MAX_NAME_LEN) bytes, no
/// control characters or white space) back to the same name.
pub fn check_name(name: &AppName) -> Result<(), DirectoryError> {
    if name.process_name.is_empty() {
        return Err(DirectoryError::EmptyName);
    }
    name.check()
        .map_err(|e| DirectoryError::InvalidName(e.to_string()))
}

/// An entry from IRATI's form alone: alive, version 0, age 0. Fails on a
/// name that is not valid ([`check_name`]).
pub fn dfte_from_wire(w: &DirectoryForwardingTableEntry) -> Result<DirEntry, DirectoryError> {
    let name = AppName::from(&w.application_name);
    check_name(&name)?;
    Ok(DirEntry {
        name,
        address: w.ipc_process_synonym,
        seq: w.seqnum,
        version: 0,
        alive: true,
        age: 0,
    })
}

/// One entry in our wire form.
pub fn entry_to_wire(e: &DirEntry) -> DirEntryMessage {
    DirEntryMessage {
        entry: Some(dfte_to_wire(e)),
        version: e.version,
        withdrawn: !e.alive,
        age: e.age,
    }
}

/// One entry from our wire form.
pub fn entry_from_wire(w: &DirEntryMessage) -> Result<DirEntry, DirectoryError> {
    let dfte = w
        .entry
        .as_ref()
        .ok_or_else(|| DirectoryError::Malformed("entry without a DFT entry".into()))?;
    Ok(DirEntry {
        version: w.version,
        alive: !w.withdrawn,
        age: w.age,
        ..dfte_from_wire(dfte)?
    })
}

/// A batch of entries as a [`DirEntryGroup`].
pub fn entries_to_wire(entries: &[DirEntry]) -> DirEntryGroup {
    DirEntryGroup {
        entries: entries.iter().map(entry_to_wire).collect(),
    }
}

/// A batch of entries from a [`DirEntryGroup`]; fails on the first bad one.
pub fn entries_from_wire(g: &DirEntryGroup) -> Result<Vec<DirEntry>, DirectoryError> {
    g.entries.iter().map(entry_from_wire).collect()
}

/// A batch of entries encoded as the CDAP object value.
pub fn encode_entries(entries: &[DirEntry]) -> Vec<u8> {
    encode_object(&entries_to_wire(entries))
}

/// A batch of entries decoded from a CDAP object value. Never panics.
pub fn decode_entries(bytes: &[u8]) -> Result<Vec<DirEntry>, DirectoryError> {
    let g: DirEntryGroup =
        decode_object(bytes).map_err(|e| DirectoryError::Malformed(e.to_string()))?;
    entries_from_wire(&g)
}

#[cfg(test)]
mod tests;
