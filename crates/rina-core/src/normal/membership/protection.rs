//! Encryption of N-1 flows in a DIF that encrypts ([`crate::sdup::aead`]
//! frames, keys from port authentication).
//!
//! On the way out, after the RMT chose the port, a frame is sealed under
//! the port's key. A port without keys yet carries only what leads to
//! them, in clear: membership hellos (a hello starts an enrollment),
//! enrollment and its fragments, and port authentication (which is always
//! sent in clear, past the RMT, so a peer that lost its keys can still read
//! it). On the way in, a sealed frame must open under one of the port's
//! keys; a clear frame must be a management PDU for this IPCP that is
//! enrollment or port authentication (and, before keys, a hello or a
//! fragment; admission still drops those from a port not admitted, except
//! at an enrollee).
//! Everything else is counted and dropped. Admission then waits for keys:
//! a port is admitted when a handshake on it installed them. Keys rotate by
//! a new handshake after the configured volume or time, and a port whose
//! peer seals under a key this side never got starts one too.

use super::{MembershipMachine, MsOut, N1Port};
use crate::sdup::aead::{self, CryptoCounters, PortCrypto, SessionKeys};
use crate::time::Instant;

/// What `rinactl` shows of one N-1 port's protection.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PortProtection {
    /// The N-1 port.
    pub port: N1Port,
    /// The cipher suite ([`aead::SUITE`]).
    pub suite: &'static str,
    /// Id of the key that seals, or `None` before keys are agreed.
    pub key_id: Option<u32>,
    /// Its counters.
    pub counters: CryptoCounters,
}

impl MembershipMachine {
    /// Whether this IPCP encrypts its N-1 flows.
    pub(in crate::normal) fn encrypting(&self) -> bool {
        self.cfg.encryption.is_some() && self.cfg.authenticates()
    }

    pub(in crate::normal) fn port_has_keys(&self, port: N1Port) -> bool {
        self.crypto.get(&port).is_some_and(PortCrypto::has_keys)
    }

    /// The encryption state of `port` (made when first asked for).
    pub(in crate::normal) fn crypto_mut(&mut self, port: N1Port) -> &mut PortCrypto {
        self.crypto.entry(port).or_default()
    }

    /// When keys rotate.
    pub(in crate::normal) fn rekey_policy(&self) -> aead::Rekey {
        self.cfg.encryption.unwrap_or_default()
    }

    /// Installs the keys of a completed handshake on `port`.
    pub(super) fn install_keys(&mut self, now: Instant, port: N1Port, keys: &SessionKeys) {
        if !self.encrypting() {
            return;
        }
        let c = self.crypto.entry(port).or_default();
        let first = !c.has_keys();
        c.install(now, keys);
        if first {
            // Routing and directory floods sent since the neighbour came
            // up (at enrollment, before keys) were dropped here: send the
            // databases again, now sealed.
            self.out.push_back(MsOut::Resync { port });
        }
    }

    /// The protection of each of `ports`, for `rinactl` (empty when not
    /// encrypting).
    pub(in crate::normal) fn port_protection(
        &self,
        ports: impl Iterator<Item = N1Port>,
    ) -> Vec<PortProtection> {
        if !self.encrypting() {
            return Vec::new();
        }
        ports
            .map(|port| {
                let c = self.crypto.get(&port);
                PortProtection {
                    port,
                    suite: aead::SUITE,
                    key_id: c.and_then(PortCrypto::key_id),
                    counters: c.map(|c| c.counters).unwrap_or_default(),
                }
            })
            .collect()
    }

    /// Rotates the keys of every port whose key is due by time.
    pub(super) fn rekey_by_time(&mut self, now: Instant) {
        if !self.encrypting() {
            return;
        }
        let rekey = self.rekey_policy();
        let due: Vec<N1Port> = self
            .crypto
            .iter()
            .filter(|(_, c)| c.rekey_due(now, &rekey))
            .map(|(p, _)| *p)
            .collect();
        for p in due {
            self.start_rekey(now, p);
        }
    }
}

#[cfg(test)]
mod tests;
