//! The disseminated directory in the normal IPCP: the glue between the flow
//! allocator and the sans-IO [`Directory`] of [`crate::directory`].
//!
//! With [`NormalConfig::dynamic_directory`](super::NormalConfig::dynamic_directory)
//! set, the IPCP owns a [`Directory`] for its address:
//!
//! * [`NormalIpcp::register`] / [`NormalIpcp::unregister`] also register and
//!   withdraw the name there (at the latest time the IPCP has seen);
//! * [`NormalIpcp::neighbor_up`] / [`NormalIpcp::neighbor_down`] (and
//!   [`NormalIpcp::remove_port`]) bring the directory's neighbours up and
//!   down, so a new neighbour gets the whole database;
//! * the directory's [`DirectoryAction::Flood`] and [`DirectoryAction::Send`]
//!   become management PDUs on those ports to the neighbour, like routing's
//!   FSOs: [`CDAP_DISCRIMINATOR`](super::CDAP_DISCRIMINATOR) followed by an unconfirmed CDAP `M_WRITE`
//!   of [`DFT_OBJ_CLASS`] on [`DFT_OBJ_NAME`] whose value is
//!   [`encode_entries`] ([`dft_payload`]). The RIB daemon
//!   ([`super::mgmt_rib`]) hands such a write arriving on a port to the
//!   directory, whose entries go to [`Directory::on_entries`]; a bad value
//!   is counted in `rx_mgmt_malformed`, one arriving while the directory is
//!   off in `rx_mgmt_unhandled`;
//! * [`NormalIpcp::resolve`] and [`NormalIpcp::knows`] look up local
//!   registrations first, then the static directory, then
//!   [`Directory::lookup`].
//!
//! Its timers run in [`NormalIpcp::poll_timeout`] /
//! [`NormalIpcp::handle_timeout`], its counters appear in
//! [`NormalIpcp::counters_map`] as `directory_<name>` (plus
//! `directory_entries`, the database size), and its alive entries in the RIB
//! under `/difm/nsm/dft/key=<name>`.

use super::mgmt_cdap::{write_payload, writes};
use super::{N1Port, NormalIpcp};
use crate::directory::{
    decode_entries, encode_entries, Counters as DirectoryCounters, DirEntry, Directory,
    DirectoryAction, DFT_OBJ_CLASS, DFT_OBJ_NAME,
};
use crate::rmt::Address;
use crate::time::Instant;
use rina_wire::cdap::CdapMessage;
use rina_wire::AppName;

/// The management payload that carries directory `entries` to a neighbour:
/// the discriminator and an unconfirmed CDAP `M_WRITE` on [`DFT_OBJ_NAME`].
pub fn dft_payload(entries: &[DirEntry]) -> Vec<u8> {
    write_payload(DFT_OBJ_CLASS, DFT_OBJ_NAME, encode_entries(entries))
}

impl NormalIpcp {
    /// The disseminated directory, when configured.
    pub fn dynamic_directory(&self) -> Option<&Directory> {
        self.dft.as_ref()
    }

    /// The directory counters, when the disseminated directory is configured.
    pub fn directory_counters(&self) -> Option<&DirectoryCounters> {
        self.dft.as_ref().map(|d| d.counters())
    }

    /// Where the disseminated directory says `name` is, if configured and
    /// known there.
    pub(super) fn dft_lookup(&self, name: &AppName) -> Option<Address> {
        self.dft.as_ref().and_then(|d| d.lookup(name))
    }

    /// A name was registered here.
    pub(super) fn dft_register(&mut self, name: &AppName) {
        let now = self.now;
        if let Some(d) = self.dft.as_mut() {
            // Only fails for a name registered already (kept in step with
            // the flow allocator) or an empty process name (not findable).
            let _ = d.register(now, name.clone());
        }
        self.run_directory(now);
    }

    /// A name was withdrawn here.
    pub(super) fn dft_unregister(&mut self, name: &AppName) {
        let now = self.now;
        if let Some(d) = self.dft.as_mut() {
            let _ = d.unregister(now, name);
        }
        self.run_directory(now);
    }

    /// The neighbour on `port` is up.
    pub(super) fn dft_neighbor_up(&mut self, now: Instant, port: N1Port) {
        if let Some(d) = self.dft.as_mut() {
            // Fails only for a port already up (a cost change).
            let _ = d.neighbor_up(now, port);
        }
        self.run_directory(now);
    }

    /// The neighbour on `port` gets the whole directory again.
    pub(super) fn dft_resync(&mut self, now: Instant, port: N1Port) {
        if let Some(d) = self.dft.as_mut() {
            let _ = d.resync(now, port);
        }
        self.run_directory(now);
    }

    /// The neighbour on `port` is down.
    pub(super) fn dft_neighbor_down(&mut self, now: Instant, port: N1Port) {
        if let Some(d) = self.dft.as_mut() {
            let _ = d.neighbor_down(port);
        }
        self.run_directory(now);
    }

    /// A CDAP message on the directory forwarding table, from the RIB
    /// daemon: a neighbour's entries. A bad value (or one through the
    /// loopback) is counted as malformed; without a directory machine it is
    /// counted as unhandled.
    pub(super) fn on_directory_cdap(
        &mut self,
        now: Instant,
        port: Option<N1Port>,
        msg: &CdapMessage,
    ) {
        if self.dft.is_none() {
            self.counters.rx_mgmt_unhandled += 1;
            return;
        }
        if !writes(msg, DFT_OBJ_NAME) {
            self.counters.rx_mgmt_malformed += 1;
            return;
        }
        let Some((entries, port)) = self.written_object(port, msg, decode_entries) else {
            return;
        };
        if let Some(d) = self.dft.as_mut() {
            d.on_entries(now, port, entries);
        }
        self.run_directory(now);
    }

    /// Runs the directory timers that are due.
    pub(super) fn directory_timeout(&mut self, now: Instant) {
        let Some(d) = self.dft.as_mut() else {
            return;
        };
        if d.poll_timeout().is_some_and(|t| t <= now) {
            d.handle_timeout(now);
        }
        self.run_directory(now);
    }

    /// Sends what the directory asks for to the neighbours.
    fn run_directory(&mut self, now: Instant) {
        let Some(d) = self.dft.as_mut() else {
            return;
        };
        let mut out = Vec::new();
        while let Some(a) = d.poll_action() {
            match a {
                DirectoryAction::Flood { to_ports, entries } => {
                    out.push((to_ports, dft_payload(&entries)));
                }
                DirectoryAction::Send { port, entries } => {
                    out.push((vec![port], dft_payload(&entries)));
                }
            }
        }
        self.send_to_neighbors(now, out);
        self.check_address_conflict(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::directory;
    use crate::normal::layer_mgmt_tests::mgmt_frame;
    use crate::normal::CDAP_DISCRIMINATOR;
    use crate::normal::{Action, NormalConfig};
    use crate::rmt::Fifo;

    fn ms(n: u64) -> Instant {
        Instant::from_nanos(n * 1_000_000)
    }

    #[test]
    fn entries_in_and_out_without_routing() {
        let mut c = NormalConfig::new("net", 1);
        c.dynamic_directory = Some(directory::Config::default());
        let mut p = NormalIpcp::new(c, Box::new(Fifo::new(100))).unwrap();
        p.add_port(2);
        p.neighbor_up(ms(0), 2, 2, 1);
        let echo: AppName = "echo".parse().unwrap();
        p.register(echo.clone()).unwrap();
        p.handle_timeout(ms(0));
        let mut sent = 0;
        while let Some(a) = p.poll_action() {
            assert!(matches!(a, Action::Transmit { port: 2, .. }));
            sent += 1;
        }
        assert_eq!(sent, 1, "the flood of the registration");
        assert_eq!(p.directory_counters().unwrap().registrations, 1);

        // A bad value is malformed; another object is refused.
        let bad = CdapMessage::write(DFT_OBJ_CLASS, DFT_OBJ_NAME, 7i32);
        let mut payload = vec![CDAP_DISCRIMINATOR];
        payload.extend(bad.encode());
        p.on_frame(ms(1), 2, &mgmt_frame(&p, 2, &payload));
        assert_eq!(p.counters().rx_mgmt_malformed, 1);
        let other = CdapMessage::write("Foo", "/foo", 1i32);
        let mut payload = vec![CDAP_DISCRIMINATOR];
        payload.extend(other.encode());
        p.on_frame(ms(1), 2, &mgmt_frame(&p, 2, &payload));
        assert!(p.poll_action().is_none());
        assert_eq!(p.rib_daemon().daemon().counters().refused_not_allowed, 1);

        // A neighbour's entry is learnt.
        let srv: AppName = "srv".parse().unwrap();
        assert!(!p.knows(&srv));
        let e = DirEntry {
            name: srv.clone(),
            address: 2,
            seq: 1,
            version: 1,
            alive: true,
            age: 0,
        };
        p.on_frame(ms(2), 2, &mgmt_frame(&p, 2, &dft_payload(&[e])));
        assert_eq!(p.resolve(&srv), Some(2));
        assert_eq!(p.resolve(&echo), Some(1));
        // The static directory wins over the disseminated one.
        p.set_directory(srv.clone(), 5);
        assert_eq!(p.resolve(&srv), Some(5));
        assert_eq!(p.counters_map()["directory_entries"], 2);

        p.unregister(&echo);
        assert_eq!(p.directory_counters().unwrap().unregistrations, 1);
        p.remove_port(2);
        assert_eq!(p.dynamic_directory().unwrap().ports().count(), 0);
    }
}
