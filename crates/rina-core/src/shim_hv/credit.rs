//! Per-channel credit-based flow control of shim-hv (an extension of this
//! implementation; IRATI has none).
//!
//! Without it, the receiving end of a device can only hold back a flow
//! whose application stopped reading by not reading the receive ring at
//! all, which stops every other flow of the device with it. With it, each
//! receiver grants the sender of each application flow a *window*: the
//! sender may have at most that many SDUs and bytes sent that the
//! receiving application has not taken yet. A flow out of credit waits at
//! the sender (its application's writes block), the other channels flow
//! on, and the receiver never holds more for a flow than the window it
//! granted, so it never needs to stop reading the ring.
//!
//! Grants are *cumulative limits* ("you may send until your n-th SDU and
//! your b-th byte"), not increments: a grant lost (a full control
//! backlog) or repeated changes nothing once a later one arrives, and an
//! honest grant is never more than [`Window`] ahead of what the sender has
//! sent, which makes a hostile one easy to recognise.
//!
//! The window is counted in SDUs *and* bytes. SDUs, because what the
//! receiver holds costs per SDU (a queued buffer, a socket's per-packet
//! overhead, at least one slot of an application ring); bytes, because
//! a window of 64 KiB SDUs only counted in SDUs would be 16 MiB of memory.
//! A sender may send while it is below both limits, so an SDU may go
//! past the byte limit by at most one SDU: a window smaller than the
//! largest SDU then still lets every SDU through, one at a time.
//!
//! The receiver grants more once the application took a quarter of the
//! window (in SDUs or bytes) since the last grant: one control message
//! per quarter window, and a sender that used its whole window always gets
//! one (the application eventually takes all it holds).

use thiserror::Error;

/// A window of credit: SDUs and bytes a sender may have outstanding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// SDUs sent and not yet taken by the receiving application.
    pub sdus: u32,
    /// Bytes of them (the last SDU may go past it, see the module doc).
    pub bytes: u32,
}

/// The window a receiver grants by default: 256 SDUs and 1 MiB, a
/// quarter of a VMPI ring's 4 MiB, so that four flows in full flow fill
/// the ring and the ring, not the credit, paces a single fast flow; at
/// most 1 MiB and one SDU held per stalled flow (63 flows: 67 MiB at most,
/// against 4 MiB per flow before credits).
pub const DEFAULT_WINDOW: Window = Window {
    sdus: 256,
    bytes: 1 << 20,
};

/// The largest window a sender takes from a peer: a larger announcement is
/// taken as this, and grants are checked against it.
pub const MAX_WINDOW: Window = Window {
    sdus: 1 << 16,
    bytes: 1 << 28,
};

impl Window {
    /// The window, clamped to [`MAX_WINDOW`]; `None` for a window of zero
    /// SDUs or bytes (on the wire: "no limit on this channel").
    pub fn limited(self) -> Option<Window> {
        if self.sdus == 0 || self.bytes == 0 {
            return None;
        }
        Some(Window {
            sdus: self.sdus.min(MAX_WINDOW.sdus),
            bytes: self.bytes.min(MAX_WINDOW.bytes),
        })
    }
}

/// Why a grant from the peer was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum CreditError {
    /// The grant takes back credit already given (honest grants only grow).
    #[error("grant of {sdus} SDUs / {bytes} bytes is below the limits already granted")]
    Backwards {
        /// The granted SDU limit.
        sdus: u64,
        /// The granted byte limit.
        bytes: u64,
    },
    /// The grant is more than a window ahead of what was sent.
    #[error("grant of {sdus} SDUs / {bytes} bytes is more than a window ahead")]
    TooLarge {
        /// The granted SDU limit.
        sdus: u64,
        /// The granted byte limit.
        bytes: u64,
    },
    /// The channel has no flow, or its sender does not wait for credit.
    #[error("credit for channel {0}, which has no flow limited by credit")]
    NoFlow(u32),
}

/// The sending side of a channel limited by the peer's credit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxCredit {
    window: Window,
    sent_sdus: u64,
    sent_bytes: u64,
    limit_sdus: u64,
    limit_bytes: u64,
}

impl TxCredit {
    /// A sender that nothing sent yet, with the peer's initial window.
    pub fn new(window: Window) -> TxCredit {
        TxCredit {
            window,
            sent_sdus: 0,
            sent_bytes: 0,
            limit_sdus: u64::from(window.sdus),
            limit_bytes: u64::from(window.bytes),
        }
    }

    /// Whether one more SDU (of any size) may go.
    pub fn can_send(&self) -> bool {
        self.sent_sdus < self.limit_sdus && self.sent_bytes < self.limit_bytes
    }

    /// An SDU of `len` bytes went.
    pub fn on_sent(&mut self, len: usize) {
        self.sent_sdus += 1;
        self.sent_bytes += len as u64;
    }

    /// An SDU of `len` bytes accounted by [`TxCredit::on_sent`] did not go
    /// after all.
    pub fn unsend(&mut self, len: usize) {
        self.sent_sdus = self.sent_sdus.saturating_sub(1);
        self.sent_bytes = self.sent_bytes.saturating_sub(len as u64);
    }

    /// Takes a grant of the peer: the new cumulative limits.
    pub fn on_grant(&mut self, sdus: u64, bytes: u64) -> Result<(), CreditError> {
        if sdus < self.limit_sdus || bytes < self.limit_bytes {
            return Err(CreditError::Backwards { sdus, bytes });
        }
        let max_sdus = self.sent_sdus.saturating_add(u64::from(self.window.sdus));
        let max_bytes = self.sent_bytes.saturating_add(u64::from(self.window.bytes));
        if sdus > max_sdus || bytes > max_bytes {
            return Err(CreditError::TooLarge { sdus, bytes });
        }
        self.limit_sdus = sdus;
        self.limit_bytes = bytes;
        Ok(())
    }

    /// SDUs that may still go before the next grant (0 when blocked).
    pub fn sdus_left(&self) -> u64 {
        if self.sent_bytes >= self.limit_bytes {
            return 0;
        }
        self.limit_sdus.saturating_sub(self.sent_sdus)
    }
}

/// The receiving side of a channel whose sender this end limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxCredit {
    window: Window,
    received_sdus: u64,
    received_bytes: u64,
    delivered_sdus: u64,
    delivered_bytes: u64,
    granted_sdus: u64,
    granted_bytes: u64,
}

impl RxCredit {
    /// A receiver that granted `window` and received nothing yet.
    pub fn new(window: Window) -> RxCredit {
        RxCredit {
            window,
            received_sdus: 0,
            received_bytes: 0,
            delivered_sdus: 0,
            delivered_bytes: 0,
            granted_sdus: u64::from(window.sdus),
            granted_bytes: u64::from(window.bytes),
        }
    }

    /// The window granted.
    pub fn window(&self) -> Window {
        self.window
    }

    /// Takes an SDU of `len` bytes; false if the sender had no credit for
    /// it (it is then not counted: drop it).
    pub fn on_data(&mut self, len: usize) -> bool {
        if self.received_sdus >= self.granted_sdus || self.received_bytes >= self.granted_bytes {
            return false;
        }
        self.received_sdus += 1;
        self.received_bytes += len as u64;
        true
    }

    /// Takes back an SDU of `len` bytes counted by [`RxCredit::on_data`]
    /// (the driver left it where it was, to take it again).
    pub fn unreceive(&mut self, len: usize) {
        self.received_sdus = self.received_sdus.saturating_sub(1);
        self.received_bytes = self.received_bytes.saturating_sub(len as u64);
        self.delivered_sdus = self.delivered_sdus.min(self.received_sdus);
        self.delivered_bytes = self.delivered_bytes.min(self.received_bytes);
    }

    /// SDUs received so far.
    pub fn received(&self) -> u64 {
        self.received_sdus
    }

    /// Whether the sender may send more than it did, by the last grant.
    pub fn has_room(&self) -> bool {
        self.received_sdus < self.granted_sdus && self.received_bytes < self.granted_bytes
    }

    /// The limits granted last, to send again.
    pub fn granted(&self) -> (u64, u64) {
        (self.granted_sdus, self.granted_bytes)
    }

    /// SDUs received and not delivered yet.
    pub fn held(&self) -> u64 {
        self.received_sdus - self.delivered_sdus
    }

    /// The application took `sdus` SDUs of `bytes` bytes (or they were
    /// dropped after they were received); the new limits to grant, when a
    /// quarter of the window was taken since the last grant.
    pub fn on_delivered(&mut self, sdus: u64, bytes: u64) -> Option<(u64, u64)> {
        self.delivered_sdus = (self.delivered_sdus + sdus).min(self.received_sdus);
        self.delivered_bytes = (self.delivered_bytes + bytes).min(self.received_bytes);
        let sdus = self.delivered_sdus + u64::from(self.window.sdus);
        let bytes = self.delivered_bytes + u64::from(self.window.bytes);
        let quarter_sdus = u64::from(self.window.sdus / 4).max(1);
        let quarter_bytes = u64::from(self.window.bytes / 4).max(1);
        let due = sdus.saturating_sub(self.granted_sdus) >= quarter_sdus
            || bytes.saturating_sub(self.granted_bytes) >= quarter_bytes;
        if !due {
            return None;
        }
        self.granted_sdus = self.granted_sdus.max(sdus);
        self.granted_bytes = self.granted_bytes.max(bytes);
        Some((self.granted_sdus, self.granted_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Window = Window {
        sdus: 8,
        bytes: 1000,
    };

    #[test]
    fn a_sender_stops_at_the_window_and_goes_on_with_grants() {
        let mut tx = TxCredit::new(W);
        let mut rx = RxCredit::new(W);
        for _ in 0..8 {
            assert!(tx.can_send());
            tx.on_sent(10);
            assert!(rx.on_data(10));
        }
        assert!(!tx.can_send());
        assert!(!rx.on_data(10), "beyond the window");
        // One SDU taken: not a quarter yet.
        assert_eq!(rx.on_delivered(1, 10), None);
        let (s, b) = rx.on_delivered(1, 10).expect("a quarter of the SDUs");
        assert_eq!((s, b), (10, 1020));
        tx.on_grant(s, b).unwrap();
        assert_eq!(tx.sdus_left(), 2);
    }

    #[test]
    fn bytes_limit_with_one_sdu_of_overshoot() {
        let mut tx = TxCredit::new(W);
        tx.on_sent(999);
        assert!(tx.can_send(), "one byte of credit left lets any SDU go");
        tx.on_sent(60_000);
        assert!(!tx.can_send());
        assert_eq!(tx.sdus_left(), 0);
        let mut rx = RxCredit::new(W);
        assert!(rx.on_data(999) && rx.on_data(60_000));
        assert!(!rx.on_data(1));
        // Taking both: a grant of a window past what was delivered.
        assert_eq!(rx.on_delivered(2, 60_999), Some((10, 61_999)));
        assert_eq!(rx.held(), 0);
    }

    #[test]
    fn bad_grants_are_refused() {
        let mut tx = TxCredit::new(W);
        assert!(matches!(
            tx.on_grant(100, 1000),
            Err(CreditError::TooLarge { .. })
        ));
        assert!(matches!(
            tx.on_grant(u64::MAX, u64::MAX),
            Err(CreditError::TooLarge { .. })
        ));
        assert!(matches!(
            tx.on_grant(7, 1000),
            Err(CreditError::Backwards { .. })
        ));
        tx.on_grant(8, 1000).expect("the same limits again");
        assert_eq!(Window { sdus: 0, bytes: 5 }.limited(), None);
        assert_eq!(
            Window {
                sdus: u32::MAX,
                bytes: u32::MAX
            }
            .limited(),
            Some(MAX_WINDOW)
        );
    }
}
