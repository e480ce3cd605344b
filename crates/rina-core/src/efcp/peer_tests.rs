//! What a peer can do to a connection with crafted control PDUs: nothing
//! that panics, spins the driver or holds memory without bound.

use super::*;

fn at_ms(n: u64) -> Instant {
    Instant::ZERO + Duration::from_millis(n)
}

fn with_rate(mut cfg: EfcpConfig, pdus_per_frame: u64, frame: Duration) -> EfcpConfig {
    cfg.dtcp.as_mut().unwrap().rate = Some(RateFc {
        pdus_per_frame,
        frame,
    });
    cfg
}

/// A flow-control PDU first tightens our rate to 1 PDU per u64::MAX ms
/// (a legal "tighter" rate), then a second one carries rate u64::MAX: the
/// product compared in `Sender::on_fc` (1.8e19 * 1.8e25) is beyond u128
/// (it overflowed: a panic in a debug build).
#[test]
fn a_rate_update_with_extreme_figures_does_not_overflow() {
    let cfg = with_rate(
        EfcpConfig::flow_controlled(),
        100,
        Duration::from_millis(10),
    );
    let mut c = Connection::new(cfg, Instant::ZERO).unwrap();
    c.on_pdu(
        at_ms(1),
        Pdu::Fc {
            ctrl_seq: 1,
            new_rwe: 0,
            rate: 1,
            frame_ms: u64::MAX,
        },
    );
    c.on_pdu(
        at_ms(2),
        Pdu::Fc {
            ctrl_seq: 2,
            new_rwe: 0,
            rate: u64::MAX,
            frame_ms: 1,
        },
    );
}

/// A rate-controlled sender whose frame budget is used up and whose window
/// is closed, with SDUs queued: `poll_timeout` named the end of the rate
/// frame, which nothing moved (`poll_data` returns at the closed window
/// before the frame rolls), so it stayed in the past for as long as the
/// peer kept its window shut: the driver spun.
#[test]
fn the_rate_deadline_does_not_stay_in_the_past_while_the_window_is_shut() {
    // Window of 4 (initial credit), 4 PDUs per 10 ms frame.
    let mut cfg = with_rate(EfcpConfig::flow_controlled(), 4, Duration::from_millis(10));
    let w = cfg.dtcp.as_mut().unwrap().window.as_mut().unwrap();
    w.initial_credit = 4;
    let mut c = Connection::new(cfg, Instant::ZERO).unwrap();
    for i in 0..8u8 {
        c.write(Instant::ZERO, vec![i]).unwrap();
    }
    let mut sent = 0;
    while c.poll_transmit(Instant::ZERO).is_some() {
        sent += 1;
    }
    assert_eq!(sent, 4, "the window's worth, the frame's worth");
    // The peer never opens its window. Drive the connection as a driver
    // does: run the timers when due, drain what is to send.
    let mut spins = 0;
    let mut now = at_ms(20);
    for _ in 0..1000 {
        let Some(due) = c.poll_timeout() else { break };
        if due > now {
            now = due; // a sleeping driver would wake at `due`
            continue;
        }
        c.handle_timeout(now);
        while c.poll_transmit(now).is_some() {}
        if c.poll_timeout().is_some_and(|d| d <= now) {
            spins += 1;
        }
    }
    assert_eq!(
        spins,
        0,
        "poll_timeout stayed at or before `now` right after handle_timeout \
         ({spins} of 1000 turns; deadline {:?}, now {now:?})",
        c.poll_timeout()
    );
}

/// A peer that grants `next_seq - 1 + most` with every AckFc (allowed by
/// `valid_rwe`, which measures from what we sent, not from what was acked)
/// and acks one PDU at a time kept our retransmission queue growing
/// without bound while the application wrote (204,038 PDUs in 200 rounds
/// without congestion control, 21,700 with). It now holds at most twice
/// what a receiver of the cube can have open.
fn forged_credit_growth(cfg: EfcpConfig, echo_each: bool) -> usize {
    let w = *cfg.window().unwrap();
    let most = ((w.receiver_buffer as u64).max(w.initial_credit) + cfg.max_reorder as u64 + 1) * 2;
    let mut c = Connection::new(cfg, Instant::ZERO).unwrap();
    let mut ctrl = 0u64;
    let mut max_in_flight = 0;
    for round in 0..200u64 {
        let now = at_ms(1 + round);
        while c.can_write() {
            c.write(now, vec![0u8; 1000]).unwrap();
        }
        let mut sent = Vec::new();
        while let Some(p) = c.poll_transmit(now) {
            if let Pdu::Data { seq, .. } = p {
                sent.push(seq);
            }
        }
        let snd_una = c.next_seq() - c.in_flight() as u64;
        // Ack the oldest (keeps the RTO from firing), grant far ahead.
        ctrl += 1;
        let mut rwe = c.next_seq() - 1 + most;
        c.on_pdu_meta(
            now,
            Pdu::AckFc {
                ctrl_seq: ctrl,
                ack_sn: snd_una,
                new_rwe: rwe,
                rate: 0,
                frame_ms: 0,
            },
            PduMeta::default(),
        );
        if echo_each {
            // Name every PDU just sent as received above a hole (so it
            // leaves the congestion window's pipe); each grows the window
            // by one so it is no duplicate ack.
            for s in sent {
                ctrl += 1;
                rwe += 1;
                c.on_pdu_meta(
                    now,
                    Pdu::AckFc {
                        ctrl_seq: ctrl,
                        ack_sn: snd_una,
                        new_rwe: rwe.min(c.next_seq() - 1 + most),
                        rate: 0,
                        frame_ms: 0,
                    },
                    PduMeta {
                        ecn: false,
                        echo: Some(s),
                    },
                );
            }
        }
        assert!(!c.is_failed());
        max_in_flight = max_in_flight.max(c.in_flight());
    }
    max_in_flight
}

#[test]
fn credit_granted_ahead_of_acks_holds_a_bounded_retransmission_queue() {
    let mut cfg = EfcpConfig::reliable();
    cfg.dtcp.as_mut().unwrap().cc = None;
    let w = *cfg.window().unwrap();
    let bound = 2 * (w.receiver_buffer + cfg.max_reorder + 1);
    let n = forged_credit_growth(cfg, false);
    assert!(
        n <= bound,
        "{n} PDUs kept for retransmission, window bound {bound}"
    );
}

#[test]
fn credit_granted_ahead_of_acks_holds_a_bounded_queue_under_congestion_control() {
    let cfg = EfcpConfig::reliable();
    let w = *cfg.window().unwrap();
    let bound = 2 * (w.receiver_buffer + cfg.max_reorder + 1);
    let n = forged_credit_growth(cfg, true);
    assert!(
        n <= bound,
        "{n} PDUs kept for retransmission, window bound {bound}"
    );
}
