//! The flow allocator alone: two [`FlowAllocator`]s talk to each other
//! through their [`FaOut`]s, with no IPCP around them, so what is tested
//! is the machine behind its narrow interface (a [`Ctx`] in, [`FaOut`]s
//! out) and nothing else.

use super::{Ctx, FaOut, FlowAllocator};
use crate::ids::IdMap;
use crate::normal::{Action, NormalConfig, NormalError};
use crate::rmt::Address;
use crate::time::Instant;
use rina_wire::cdap::CdapMessage;
use rina_wire::fa::{FaMessage, FaResult};
use rina_wire::{AppName, QosSpec};
use std::time::Duration;

/// One side: its allocator and settings, with no open flow.
struct Side {
    fa: FlowAllocator,
    cfg: NormalConfig,
    flows: IdMap<crate::normal::FlowId, Box<crate::normal::Flow>>,
    by_cep: IdMap<crate::normal::CepId, crate::normal::FlowId>,
}

impl Side {
    fn new(addr: Address) -> Self {
        Side {
            fa: FlowAllocator::new(0),
            cfg: NormalConfig::new("net", addr),
            flows: IdMap::default(),
            by_cep: IdMap::default(),
        }
    }

    /// Calls `f` with the allocator and its context, then returns what the
    /// allocator asked for.
    fn call<R>(&mut self, f: impl FnOnce(&mut FlowAllocator, &Ctx) -> R) -> (R, Vec<FaOut>) {
        let cx = Ctx {
            cfg: &self.cfg,
            flows: &self.flows,
            by_cep: &self.by_cep,
        };
        let r = f(&mut self.fa, &cx);
        let mut out = Vec::new();
        while let Some(o) = self.fa.poll_out() {
            out.push(o);
        }
        (r, out)
    }
}

fn name(s: &str) -> AppName {
    AppName::new(s).unwrap()
}

/// The messages sent, decoded, with their destination and whether each is
/// a request that awaits an answer.
fn sent(out: &[FaOut]) -> Vec<(Address, FaMessage, bool)> {
    out.iter()
        .filter_map(|o| match o {
            FaOut::Send {
                to,
                message,
                request,
            } => Some((*to, FaMessage::parse(message).unwrap(), *request)),
            _ => None,
        })
        .collect()
}

fn cdap(m: &FaMessage) -> CdapMessage {
    m.to_cdap()
}

fn reports(out: Vec<FaOut>) -> Vec<Action> {
    out.into_iter()
        .filter_map(|o| match o {
            FaOut::Report(a) => Some(*a),
            _ => None,
        })
        .collect()
}

/// A asks B (address 2) for a flow to `server`: the REQUEST it sends.
fn ask(a: &mut Side, now: Instant) -> FaMessage {
    let (r, out) = a.call(|fa, cx| {
        fa.allocate(
            cx,
            now,
            7,
            name("client"),
            name("server"),
            QosSpec::default(),
            (2, 1),
        )
    });
    r.unwrap();
    let mut s = sent(&out);
    assert_eq!(s.len(), 1, "one REQUEST: {out:?}");
    let (to, msg, request) = s.remove(0);
    assert_eq!((to, request), (2, true));
    assert!(matches!(msg, FaMessage::Request { src_addr: 1, .. }));
    msg
}

#[test]
fn a_handshake_between_two_allocators_opens_the_flow_at_both_ends() {
    let (mut a, mut b) = (Side::new(1), Side::new(2));
    let t = Instant::ZERO;
    b.call(|fa, cx| fa.register(cx, name("server"))).0.unwrap();
    let request = ask(&mut a, t);
    assert!(a.fa.is_allocating(7));

    // B asks its application, which accepts.
    let (_, out) = b.call(|fa, cx| fa.on_cdap(cx, t, 1, &cdap(&request)));
    let handle = match reports(out).as_slice() {
        [Action::FlowRequest { handle, local, .. }] => {
            assert_eq!(**local, name("server"));
            *handle
        }
        other => panic!("expected one FlowRequest, got {other:?}"),
    };
    let (accepting, _) = b.call(|fa, cx| fa.accept(cx, handle, 40));
    let accepting = accepting.unwrap();
    assert_eq!(accepting.ep.remote_addr, 1);
    let (max_sdu, out) = b.call(|fa, cx| fa.accepted(cx, accepting, Ok(())));
    assert_eq!(max_sdu.unwrap(), 65_536);
    let s = sent(&out);
    let [(1, response @ FaMessage::Response { result, .. }, false)] = s.as_slice() else {
        panic!("expected one answer to A, got {s:?}");
    };
    assert_eq!(*result, FaResult::Accepted);

    // A opens its end, and reports it once the IPCP says it is open.
    let (_, out) = a.call(|fa, cx| fa.on_cdap(cx, t, 2, &cdap(response)));
    let (flow, ep, max_sdu) = match out.as_slice() {
        [FaOut::Open { flow, ep, max_sdu }] => (*flow, *ep, *max_sdu),
        other => panic!("expected Open, got {other:?}"),
    };
    assert_eq!((flow, ep.remote_addr), (7, 2));
    assert!(!a.fa.is_allocating(7), "no longer waiting");
    let (_, out) = a.call(|fa, cx| fa.opened(cx, t, (flow, ep, max_sdu), Ok(())));
    assert!(matches!(
        reports(out).as_slice(),
        [Action::Allocated { flow: 7, .. }]
    ));
    assert_eq!(a.fa.poll_timeout(), None, "nothing left to repeat");
}

#[test]
fn a_lost_request_is_repeated_until_the_timeout_then_fails() {
    let mut a = Side::new(1);
    let t = Instant::ZERO;
    let request = ask(&mut a, t);
    let retry = a.cfg.alloc_retry;
    assert_eq!(a.fa.poll_timeout(), Some(t + retry));
    let (_, out) = a.call(|fa, cx| fa.handle_timeout(cx, t + retry));
    let s = sent(&out);
    assert_eq!(s.len(), 1, "repeated once: {out:?}");
    assert_eq!(s[0].1, request, "the same REQUEST");
    assert_eq!(a.fa.counters().alloc_retries, 1);

    let end = t + a.cfg.alloc_timeout;
    let (_, out) = a.call(|fa, cx| fa.handle_timeout(cx, end));
    assert!(
        out.iter().any(|o| matches!(o, FaOut::Settle { to: 2, .. })),
        "the session stops waiting for an answer: {out:?}"
    );
    match reports(out).as_slice() {
        [Action::AllocateFailed { flow: 7, error }]
            if matches!(**error, NormalError::Timeout { dst: 2, .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(!a.fa.is_allocating(7));
    assert_eq!(a.fa.counters().alloc_timeouts, 1);
}

#[test]
fn a_refusal_carries_its_reason_and_a_repeated_request_gets_it_again() {
    let (mut a, mut b) = (Side::new(1), Side::new(2));
    let t = Instant::ZERO;
    // Nothing registered at B.
    let request = ask(&mut a, t);
    let (_, out) = b.call(|fa, cx| fa.on_cdap(cx, t, 1, &cdap(&request)));
    let s = sent(&out);
    let [(1, refusal @ FaMessage::Response { result, reason, .. }, false)] = s.as_slice() else {
        panic!("expected a refusal, got {s:?}");
    };
    assert_eq!(*result, FaResult::NotRegistered);
    assert!(reason.contains("server is not registered"), "{reason}");

    let (_, out) = a.call(|fa, cx| fa.on_cdap(cx, t, 2, &cdap(refusal)));
    match reports(out).as_slice() {
        [Action::AllocateFailed { flow: 7, error }] => {
            let NormalError::NotRegistered(n) = &**error else {
                panic!("expected NotRegistered, got {error:?}");
            };
            assert_eq!(**n, name("server"));
        }
        other => panic!("expected NotRegistered, got {other:?}"),
    }

    // An application's refusal is remembered: the repeat is refused again
    // without a second question to the application.
    b.call(|fa, cx| fa.register(cx, name("server"))).0.unwrap();
    let (_, out) = b.call(|fa, cx| fa.on_cdap(cx, t, 1, &cdap(&request)));
    let [Action::FlowRequest { handle, .. }] = reports(out)[..] else {
        panic!("expected a FlowRequest");
    };
    let (r, out) = b.call(|fa, cx| fa.refuse(cx, t, handle, "busy"));
    r.unwrap();
    assert!(matches!(
        &sent(&out)[..],
        [(1, FaMessage::Response { result: FaResult::Refused, reason, .. }, false)] if reason == "busy"
    ));
    let (_, out) =
        b.call(|fa, cx| fa.on_cdap(cx, t + Duration::from_millis(250), 1, &cdap(&request)));
    assert!(matches!(
        &sent(&out)[..],
        [(1, FaMessage::Response { result: FaResult::Refused, reason, .. }, false)] if reason == "busy"
    ));
    assert_eq!(
        b.fa.pending_requests(),
        0,
        "the application was not asked again"
    );
}

#[test]
fn an_acceptance_of_an_allocation_given_up_is_answered_with_a_dealloc_until_acknowledged() {
    let (mut a, mut b) = (Side::new(1), Side::new(2));
    let t = Instant::ZERO;
    b.call(|fa, cx| fa.register(cx, name("server"))).0.unwrap();
    let request = ask(&mut a, t);
    // A gives up before the answer comes.
    let (open, out) = a.call(|fa, cx| fa.deallocate(cx, t, 7));
    assert_eq!(open.unwrap(), None, "nothing was open");
    assert!(matches!(out.as_slice(), [FaOut::Settle { to: 2, .. }, _]));
    let [(2, FaMessage::Dealloc { dst_cep: 0, .. }, true)] = &sent(&out)[..] else {
        panic!("expected a cancel to B, got {out:?}");
    };

    let (_, out) = b.call(|fa, cx| fa.on_cdap(cx, t, 1, &cdap(&request)));
    let [Action::FlowRequest { handle, .. }] = reports(out)[..] else {
        panic!("expected a FlowRequest");
    };
    let accepting = b.call(|fa, cx| fa.accept(cx, handle, 40)).0.unwrap();
    let b_cep = accepting.ep.local_cep;
    let (_, out) = b.call(|fa, cx| fa.accepted(cx, accepting, Ok(())));
    let s = sent(&out);
    let [(1, response, false)] = s.as_slice() else {
        panic!("expected one answer to A, got {s:?}");
    };

    // The late ACCEPTED is undone: A deletes B's flow object.
    let (_, out) = a.call(|fa, cx| fa.on_cdap(cx, t, 2, &cdap(response)));
    let s = sent(&out);
    let [(2, dealloc @ FaMessage::Dealloc { dst_cep, .. }, true)] = s.as_slice() else {
        panic!("expected a DEALLOC to B, got {s:?}");
    };
    assert_eq!(*dst_cep, b_cep, "B's flow object");
    assert_eq!(a.fa.releasing(), 1);
    assert_eq!(a.fa.counters().rx_fa_stale, 1);

    // The acknowledgement is lost: the DEALLOC is repeated.
    let retry = a.cfg.alloc_retry;
    let (_, out) = a.call(|fa, cx| fa.handle_timeout(cx, t + retry));
    assert!(matches!(
        &sent(&out)[..],
        [(2, FaMessage::Dealloc { .. }, true)]
    ));
    assert_eq!(a.fa.counters().dealloc_retries, 1);

    // B has no such open flow here (its IPCP is not in this test), but
    // acknowledges all the same; the acknowledgement ends the repeats.
    let (_, out) = b.call(|fa, cx| fa.on_cdap(cx, t + retry, 1, &cdap(dealloc)));
    let s = sent(&out);
    let [(1, ack @ FaMessage::DeallocAck { .. }, false)] = s.as_slice() else {
        panic!("expected an acknowledgement, got {s:?}");
    };
    a.call(|fa, cx| fa.on_cdap(cx, t + retry, 2, &cdap(ack)));
    assert_eq!(a.fa.releasing(), 0);
    assert_eq!(a.fa.poll_timeout(), None);
}

#[test]
fn an_acceptance_of_no_allocation_given_up_here_is_counted_and_not_answered() {
    let mut a = Side::new(1);
    let t = Instant::ZERO;
    let accepted = |dst_cep, src_cep| FaMessage::Response {
        dst_addr: 1,
        dst_cep,
        src_cep,
        result: FaResult::Accepted,
        max_sdu: 1000,
        reason: String::new(),
    };
    // A forged answer naming any address as its source: no DEALLOC to it,
    // now or later, and nothing kept.
    let (_, out) = a.call(|fa, cx| fa.on_cdap(cx, t, 3, &cdap(&accepted(4242, 99))));
    assert!(sent(&out).is_empty(), "{out:?}");
    assert_eq!(a.fa.counters().rx_fa_stale, 1);
    assert_eq!(a.fa.releasing(), 0);
    assert_eq!(a.fa.poll_timeout(), None, "nothing to repeat");

    // An allocation given up: its CEP-id, answered from another address,
    // or after alloc_timeout, is not answered either.
    let request = ask(&mut a, t);
    let FaMessage::Request { src_cep: cep, .. } = request else {
        unreachable!()
    };
    a.call(|fa, cx| fa.deallocate(cx, t, 7)).0.unwrap();
    let (_, out) = a.call(|fa, cx| fa.on_cdap(cx, t, 3, &cdap(&accepted(cep, 99))));
    assert!(sent(&out).is_empty(), "{out:?}");
    let late = t + a.cfg.alloc_timeout;
    let (_, out) = a.call(|fa, cx| fa.on_cdap(cx, late, 2, &cdap(&accepted(cep, 99))));
    assert!(sent(&out).is_empty(), "{out:?}");
    assert_eq!(a.fa.counters().rx_fa_stale, 3);
    assert_eq!(a.fa.releasing(), 0);

    // Within alloc_timeout, from the responder: undone, once.
    let request = ask(&mut a, late);
    let FaMessage::Request { src_cep: cep, .. } = request else {
        unreachable!()
    };
    let expiry = late + a.cfg.alloc_timeout;
    let (_, out) = a.call(|fa, cx| fa.handle_timeout(cx, expiry));
    assert!(matches!(
        reports(out).as_slice(),
        [Action::AllocateFailed { flow: 7, .. }]
    ));
    let t2 = expiry + Duration::from_millis(1);
    let (_, out) = a.call(|fa, cx| fa.on_cdap(cx, t2, 2, &cdap(&accepted(cep, 99))));
    assert!(matches!(
        &sent(&out)[..],
        [(2, FaMessage::Dealloc { dst_cep: 99, .. }, true)]
    ));
    let (_, out) = a.call(|fa, cx| fa.on_cdap(cx, t2, 2, &cdap(&accepted(cep, 99))));
    assert!(sent(&out).is_empty(), "the DEALLOC repeats itself: {out:?}");
    assert_eq!(a.fa.releasing(), 1);
}
