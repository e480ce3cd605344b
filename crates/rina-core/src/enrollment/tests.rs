//! Enrollee and enroller connected by a hand-carried channel, explicit time.

use super::*;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn secs(s: u64) -> Instant {
    Instant::ZERO + Duration::from_secs(s)
}

fn name(s: &str) -> AppName {
    AppName::new(s).unwrap()
}

/// Which way a message goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// Enrollee → member.
    Up,
    /// Member → enrollee.
    Down,
}

/// Decides whether to drop the `n`-th (from 0) message described as `desc`.
type DropFn = Box<dyn FnMut(Dir, &str) -> bool>;

/// One management flow: an enrollee, its enroller and the channel.
struct Link {
    ee: Enrollee,
    er: Enroller,
    drop: DropFn,
    /// Every message put on the channel: time, direction, "OPCODE name".
    log: Vec<(Instant, Dir, String)>,
    /// Every message's bytes, as a capture of the flow would show them.
    wire: Vec<Vec<u8>>,
    ee_events: Vec<EnrollmentEvent>,
    er_events: Vec<EnrollerEvent>,
}

fn describe(bytes: &[u8]) -> String {
    match CdapMessage::decode(bytes) {
        Ok(m) => {
            let mut s = m.op_code().name().to_string();
            if let Some(n) = &m.obj_name {
                s.push(' ');
                s.push_str(n);
            }
            if m.is_response() && m.result() != 0 {
                s.push_str(&format!(" ({})", m.result()));
            }
            s
        }
        Err(_) => "garbage".into(),
    }
}

impl Link {
    fn new(ee: Enrollee) -> Self {
        Link {
            ee,
            er: Enroller::new(EnrollerConfig::default()),
            drop: Box::new(|_, _| false),
            log: Vec::new(),
            wire: Vec::new(),
            ee_events: Vec::new(),
            er_events: Vec::new(),
        }
    }

    fn with_drop(mut self, f: impl FnMut(Dir, &str) -> bool + 'static) -> Self {
        self.drop = Box::new(f);
        self
    }

    /// Carries messages both ways until both sides are quiet.
    fn pump(&mut self, now: Instant, m: &mut Membership) {
        loop {
            let mut moved = false;
            while let Some(b) = self.ee.poll_transmit() {
                moved = true;
                let d = describe(&b);
                self.log.push((now, Dir::Up, d.clone()));
                self.wire.push(b.clone());
                if !(self.drop)(Dir::Up, &d) {
                    self.er.on_message(now, &b, m);
                }
            }
            while let Some(b) = self.er.poll_transmit() {
                moved = true;
                let d = describe(&b);
                self.log.push((now, Dir::Down, d.clone()));
                self.wire.push(b.clone());
                if !(self.drop)(Dir::Down, &d) {
                    self.ee.on_message(now, &b);
                }
            }
            if !moved {
                break;
            }
        }
        self.ee_events
            .extend(std::iter::from_fn(|| self.ee.poll_event()));
        self.er_events
            .extend(std::iter::from_fn(|| self.er.poll_event()));
    }

    fn next_timeout(&self) -> Option<Instant> {
        [self.ee.poll_timeout(), self.er.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
    }

    fn fire(&mut self, now: Instant, m: &mut Membership) {
        if self.ee.poll_timeout().is_some_and(|t| t <= now) {
            self.ee.handle_timeout(now);
        }
        if self.er.poll_timeout().is_some_and(|t| t <= now) {
            self.er.handle_timeout(now, m);
        }
    }

    /// Messages described as `desc` sent in direction `dir`, with their times.
    fn sent(&self, dir: Dir, desc: &str) -> Vec<Instant> {
        self.log
            .iter()
            .filter(|(_, d, s)| *d == dir && s == desc)
            .map(|(t, _, _)| *t)
            .collect()
    }

    fn enrolled(&self) -> Option<&EnrollmentEvent> {
        self.ee_events
            .iter()
            .find(|e| matches!(e, EnrollmentEvent::Enrolled { .. }))
    }

    fn failed(&self) -> Option<&EnrollmentError> {
        self.ee_events.iter().find_map(|e| match e {
            EnrollmentEvent::Failed(err) => Some(err),
            _ => None,
        })
    }
}

/// Runs every link from `now` until no timer is due before `limit`;
/// returns the time reached.
fn run(links: &mut [&mut Link], m: &mut Membership, mut now: Instant, limit: Instant) -> Instant {
    loop {
        for l in links.iter_mut() {
            l.pump(now, m);
        }
        let Some(t) = links.iter().filter_map(|l| l.next_timeout()).min() else {
            return now;
        };
        if t > limit {
            return now;
        }
        now = now.max(t);
        for l in links.iter_mut() {
            l.fire(now, m);
        }
    }
}

fn content() -> DifContent {
    DifContent {
        config: DifConfigBlob((0..=255u8).cycle().take(1000).collect()),
        neighbors: vec![
            Neighbor {
                ap_name: "member".into(),
                address: 1,
                supporting_difs: vec!["eth.0".into()],
                ..Default::default()
            },
            Neighbor {
                ap_name: "other".into(),
                address: 7,
                ..Default::default()
            },
        ],
        directory: vec![b"echo->1".to_vec(), vec![], b"perf->7".to_vec()],
        fsos: vec![vec![0xAA; 40], vec![0x55; 3]],
    }
}

fn membership(auth: Box<dyn AuthPolicy>, first: Address, last: Address) -> Membership {
    let mut m = Membership::new(auth, Box::new(NextFree::new(first, last)), content());
    m.reserve(1, "member");
    m
}

fn enrollee(who: &str, auth: Box<dyn AuthPolicy>) -> Enrollee {
    Enrollee::new(EnrolleeConfig::new(name(who), name("member")), auth)
}

#[test]
fn enrollment_succeeds_with_address_and_config() {
    let mut m = membership(Box::new(AuthPassword("s3cret".into())), 1, 100);
    let mut l = Link::new(enrollee("joiner", Box::new(AuthPassword("s3cret".into()))));
    l.ee.start(Instant::ZERO);
    let end = run(&mut [&mut l], &mut m, Instant::ZERO, secs(1000));
    assert_eq!(end, Instant::ZERO, "no timer had to fire");

    let Some(EnrollmentEvent::Enrolled {
        address,
        config,
        neighbors,
        directory,
        fsos,
    }) = l.enrolled()
    else {
        panic!("not enrolled: {:?}", l.ee_events);
    };
    let c = content();
    assert_eq!(*address, 2, "1 is the member's, 2 is the next free");
    assert_eq!(*config, c.config, "1000-byte configuration intact");
    let mut got = neighbors.clone();
    got.sort_by(|a, b| a.ap_name.cmp(&b.ap_name));
    assert_eq!(got, c.neighbors);
    assert_eq!(*directory, c.directory, "including the empty entry");
    assert_eq!(*fsos, c.fsos);

    assert_eq!(
        l.er_events,
        vec![EnrollerEvent::Admitted {
            address: 2,
            peer: name("joiner")
        }]
    );
    assert_eq!(m.holder(2), Some("joiner"));

    let seq: Vec<(Dir, &str)> = l.log.iter().map(|(_, d, s)| (*d, s.as_str())).collect();
    use Dir::*;
    let expected = vec![
        (Up, "M_CONNECT"),
        (Down, "M_CONNECT_R"),
        (Up, "M_START /difm/enr"),
        (Down, "M_START_R /difm/enr"),
        (Down, "M_CREATE /dt"),
        (Down, "M_CREATE /difm/enr/neighs/pn=member"),
        (Down, "M_CREATE /difm/enr/neighs/pn=other"),
        (Down, "M_CREATE /difm/nsm/dft/key=0"),
        (Down, "M_CREATE /difm/nsm/dft/key=1"),
        (Down, "M_CREATE /difm/nsm/dft/key=2"),
        (Down, "M_CREATE /ra/fsos/key=0"),
        (Down, "M_CREATE /ra/fsos/key=1"),
        (Up, "M_CREATE_R /dt"),
        (Up, "M_CREATE_R /difm/enr/neighs/pn=member"),
        (Up, "M_CREATE_R /difm/enr/neighs/pn=other"),
        (Up, "M_CREATE_R /difm/nsm/dft/key=0"),
        (Up, "M_CREATE_R /difm/nsm/dft/key=1"),
        (Up, "M_CREATE_R /difm/nsm/dft/key=2"),
        (Up, "M_CREATE_R /ra/fsos/key=0"),
        (Up, "M_CREATE_R /ra/fsos/key=1"),
        (Down, "M_STOP /difm/enr"),
        (Up, "M_STOP_R /difm/enr"),
        (Up, "M_START /difm/ops"),
        (Down, "M_START_R /difm/ops"),
    ];
    assert_eq!(seq, expected);

    let progress: Vec<Step> = l
        .ee_events
        .iter()
        .filter_map(|e| match e {
            EnrollmentEvent::Progress { step } => Some(*step),
            _ => None,
        })
        .collect();
    assert_eq!(
        progress,
        vec![
            Step::Connect,
            Step::StartEnrollment,
            Step::Configuration,
            Step::StartOperation,
            Step::Enrolled
        ]
    );
    let st = l.ee.status();
    assert_eq!(
        (st.step, st.phase, st.attempts),
        (Step::Enrolled, Phase::Enrolled, 1)
    );
    assert_eq!(st.last_error, None);
    assert_eq!(l.ee.address(), 2);
    assert_eq!(l.er.status().phase, Phase::Enrolled);
    assert_eq!(l.er.counters().objects_sent, 8);
    assert_eq!(l.ee.counters().objects, 8);
    // The sessions stay connected for the RIB daemon.
    assert_eq!(l.ee.into_session().state(), SessionState::Connected);
    assert_eq!(l.er.into_session().state(), SessionState::Connected);
}

#[test]
fn small_window_still_transfers_everything() {
    let mut m = membership(Box::new(AuthNone), 1, 100);
    m.content.fsos = (0..50u8).map(|i| vec![i; usize::from(i)]).collect();
    let mut l = Link::new(enrollee("joiner", Box::new(AuthNone)));
    l.er = Enroller::new(EnrollerConfig {
        window: 3,
        ..Default::default()
    });
    l.ee.start(Instant::ZERO);
    run(&mut [&mut l], &mut m, Instant::ZERO, secs(1000));
    let Some(EnrollmentEvent::Enrolled { fsos, .. }) = l.enrolled() else {
        panic!("not enrolled: {:?}", l.ee_events);
    };
    assert_eq!(*fsos, m.content.fsos);
    assert_eq!(l.er.session().outstanding(), 0);
}

#[test]
fn wrong_password_fails_at_once_without_retries() {
    let mut m = membership(Box::new(AuthPassword("s3cret".into())), 1, 100);
    let mut l = Link::new(enrollee("joiner", Box::new(AuthPassword("guess".into()))));
    l.ee.start(Instant::ZERO);
    run(&mut [&mut l], &mut m, Instant::ZERO, secs(1000));

    // The enrollee checks the member's proof first: it fails, and it tells
    // the member with an empty proof.
    match l.failed() {
        Some(EnrollmentError::PeerNotAuthenticated { reason }) => {
            assert_eq!(*reason, AuthFailure::BadProof.to_string());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(l.sent(Dir::Up, "M_CONNECT").len(), 1, "no retry storm");
    assert_eq!(l.sent(Dir::Down, "M_CONNECT_R").len(), 1);
    assert_eq!(l.sent(Dir::Down, "M_START_R /difm/enr (-2)").len(), 1);
    assert!(!l
        .ee_events
        .iter()
        .any(|e| matches!(e, EnrollmentEvent::Retrying { .. })));
    assert_eq!(
        l.er_events,
        vec![EnrollerEvent::Rejected {
            peer: name("joiner"),
            reason: EnrollmentError::BadCredentials {
                reason: AuthFailure::RejectedByPeer.to_string()
            }
        }]
    );
    assert_eq!(l.er.counters().bad_credentials, 1);
    let st = l.ee.status();
    assert_eq!(
        (st.step, st.phase, st.attempts),
        (Step::Connect, Phase::Failed, 1)
    );
    let text = st.last_error.unwrap();
    assert!(
        text.contains("step connect") && text.contains("bad password"),
        "{text}"
    );
    // Nothing we show carries either password.
    let shown = format!(
        "{text} {:?} {:?} {:?} {:?}",
        l.ee,
        l.er_events,
        AuthPassword("guess".into()),
        m
    );
    assert!(
        !shown.contains("guess") && !shown.contains("s3cret"),
        "{shown}"
    );
    assert_eq!(l.ee.poll_timeout(), None);
}

#[test]
fn auth_policy_mismatch_is_refused_not_retried() {
    let mut m = membership(Box::new(AuthPassword("s3cret".into())), 1, 100);
    let mut l = Link::new(enrollee("joiner", Box::new(AuthNone)));
    l.ee.start(Instant::ZERO);
    run(&mut [&mut l], &mut m, Instant::ZERO, secs(1000));
    match l.failed() {
        Some(EnrollmentError::Refused { step, reason }) => {
            assert_eq!(*step, Step::Connect);
            assert!(
                reason.contains(AUTH_PASSWORD) && reason.contains(rina_wire::cdap::AUTH_NONE),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(l.sent(Dir::Up, "M_CONNECT").len(), 1);
}

#[test]
fn silent_enroller_times_out_at_connect_after_backoff() {
    let mut m = membership(Box::new(AuthNone), 1, 100);
    // Defaults: 10 s per step, back-off 1 s doubling, 4 attempts.
    let mut l = Link::new(enrollee("joiner", Box::new(AuthNone))).with_drop(|d, _| d == Dir::Up);
    l.ee.start(Instant::ZERO);
    run(&mut [&mut l], &mut m, Instant::ZERO, secs(1000));

    // Attempt k times out 10 s after it starts; back-offs 1, 2, 4 s.
    assert_eq!(
        l.sent(Dir::Up, "M_CONNECT"),
        vec![secs(0), secs(11), secs(23), secs(37)]
    );
    let retries: Vec<(u32, Instant)> = l
        .ee_events
        .iter()
        .filter_map(|e| match e {
            EnrollmentEvent::Retrying {
                error:
                    EnrollmentError::Timeout {
                        step: Step::Connect,
                    },
                attempt,
                at,
            } => Some((*attempt, *at)),
            _ => None,
        })
        .collect();
    assert_eq!(retries, vec![(1, secs(11)), (2, secs(23)), (3, secs(37))]);
    assert_eq!(
        l.failed(),
        Some(&EnrollmentError::Timeout {
            step: Step::Connect
        })
    );
    assert_eq!(
        l.ee_events.last(),
        Some(&EnrollmentEvent::Failed(EnrollmentError::Timeout {
            step: Step::Connect
        }))
    );
    let st = l.ee.status();
    assert_eq!(
        (st.step, st.phase, st.attempts),
        (Step::Connect, Phase::Failed, 4)
    );
    assert_eq!(
        st.last_error.as_deref(),
        Some("step connect: no answer from the peer in time")
    );
    assert_eq!(l.ee.counters().timeouts, 4);
    assert!(l.er_events.is_empty());
}

#[test]
fn backoff_is_capped_and_attempts_configurable() {
    let mut m = membership(Box::new(AuthNone), 1, 100);
    let mut cfg = EnrolleeConfig::new(name("joiner"), name("member"));
    cfg.step_timeout = Duration::from_secs(2);
    cfg.max_backoff = Duration::from_secs(3);
    cfg.max_attempts = 5;
    let mut l = Link::new(Enrollee::new(cfg, Box::new(AuthNone))).with_drop(|_, _| true);
    l.ee.start(Instant::ZERO);
    run(&mut [&mut l], &mut m, Instant::ZERO, secs(1000));
    // Starts: 0; +2 timeout +1 → 3; +2 +2 → 7; +2 +3(cap of 4) → 12; +2 +3 → 17.
    assert_eq!(
        l.sent(Dir::Up, "M_CONNECT"),
        vec![secs(0), secs(3), secs(7), secs(12), secs(17)]
    );
    assert_eq!(l.ee.status().attempts, 5);
}

#[test]
fn status_while_waiting_to_retry_names_the_failed_step() {
    let mut m = membership(Box::new(AuthNone), 1, 100);
    let mut l = Link::new(enrollee("joiner", Box::new(AuthNone)))
        .with_drop(|d, s| d == Dir::Up && s == "M_START /difm/enr");
    l.ee.start(Instant::ZERO);
    run(&mut [&mut l], &mut m, Instant::ZERO, secs(10));
    let st = l.ee.status();
    assert_eq!(st.step, Step::StartEnrollment);
    assert_eq!(st.phase, Phase::WaitingRetry);
    assert_eq!(st.attempts, 1);
    assert_eq!(st.next_retry, Some(secs(11)));
    assert_eq!(
        st.last_error.as_deref(),
        Some("step start-enrollment: no answer from the peer in time")
    );
    // The member, too, says where it gave up.
    assert_eq!(
        l.er_events,
        vec![EnrollerEvent::Rejected {
            peer: name("joiner"),
            reason: EnrollmentError::Timeout {
                step: Step::StartEnrollment
            }
        }]
    );
    assert_eq!(l.er.status().step, Step::StartEnrollment);
    assert!(l
        .er
        .status()
        .last_error
        .unwrap()
        .contains("start-enrollment"));
}

#[test]
fn two_enrollees_get_different_addresses() {
    let mut m = membership(Box::new(AuthNone), 1, 100);
    let mut a = Link::new(enrollee("alpha", Box::new(AuthNone)));
    let mut b = Link::new(enrollee("beta", Box::new(AuthNone)));
    // Interleaved: both are assigned before either is admitted.
    a.ee.start(Instant::ZERO);
    b.ee.start(Instant::ZERO);
    run(&mut [&mut a, &mut b], &mut m, Instant::ZERO, secs(1000));
    let addr = |l: &Link| match l.enrolled() {
        Some(EnrollmentEvent::Enrolled { address, .. }) => *address,
        _ => panic!("not enrolled: {:?}", l.ee_events),
    };
    let (x, y) = (addr(&a), addr(&b));
    assert_ne!(x, y);
    assert_eq!((x, y), (2, 3));
    assert_eq!(m.holder(2), Some("alpha"));
    assert_eq!(m.holder(3), Some("beta"));
    assert_eq!(
        m.in_use().iter().copied().collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
}

#[test]
fn exhausted_address_space_is_no_address_without_retry() {
    let mut m = membership(Box::new(AuthNone), 1, 2);
    m.reserve(2, "someone");
    let mut l = Link::new(enrollee("joiner", Box::new(AuthNone)));
    l.ee.start(Instant::ZERO);
    run(&mut [&mut l], &mut m, Instant::ZERO, secs(1000));
    assert_eq!(l.failed(), Some(&EnrollmentError::NoAddress));
    assert_eq!(l.sent(Dir::Up, "M_CONNECT").len(), 1);
    assert_eq!(l.sent(Dir::Down, "M_START_R /difm/enr (-3)").len(), 1);
    assert!(l.sent(Dir::Down, "M_CREATE /dt").is_empty());
    assert_eq!(
        l.er_events,
        vec![EnrollerEvent::Rejected {
            peer: name("joiner"),
            reason: EnrollmentError::NoAddress
        }]
    );
    let st = l.ee.status();
    assert_eq!((st.step, st.phase), (Step::StartEnrollment, Phase::Failed));
    assert_eq!(
        st.last_error.as_deref(),
        Some("step start-enrollment: the DIF has no free address")
    );
    assert_eq!(m.in_use().len(), 2, "nothing reserved for the failed one");
}

#[test]
fn dropped_object_mid_sequence_is_retried_and_succeeds() {
    let mut m = membership(Box::new(AuthNone), 1, 100);
    let mut dropped = false;
    let mut l = Link::new(enrollee("joiner", Box::new(AuthNone))).with_drop(move |_, s| {
        let hit = !dropped && s == "M_CREATE /ra/fsos/key=0";
        dropped |= hit;
        hit
    });
    l.ee.start(Instant::ZERO);
    run(&mut [&mut l], &mut m, Instant::ZERO, secs(1000));

    assert!(l.ee_events.contains(&EnrollmentEvent::Retrying {
        error: EnrollmentError::Timeout {
            step: Step::Configuration
        },
        attempt: 1,
        at: secs(11),
    }));
    let Some(EnrollmentEvent::Enrolled { address, fsos, .. }) = l.enrolled() else {
        panic!("not enrolled: {:?}", l.ee_events);
    };
    assert_eq!(*address, 2, "the retry gets the same address back");
    assert_eq!(*fsos, content().fsos);
    assert_eq!(l.sent(Dir::Up, "M_CONNECT"), vec![secs(0), secs(11)]);
    assert_eq!(l.sent(Dir::Up, "M_START /difm/ops"), vec![secs(11)]);
    // The member gave up on the first attempt, freed the address, then admitted.
    assert_eq!(
        l.er_events,
        vec![
            EnrollerEvent::Rejected {
                peer: name("joiner"),
                reason: EnrollmentError::Timeout {
                    step: Step::Configuration
                }
            },
            EnrollerEvent::Admitted {
                address: 2,
                peer: name("joiner")
            }
        ]
    );
    let st = l.ee.status();
    assert_eq!((st.phase, st.attempts), (Phase::Enrolled, 2));
    assert_eq!(m.in_use().len(), 2);
}

#[test]
fn lost_final_answer_re_enrolls_with_the_same_address() {
    let mut m = membership(Box::new(AuthNone), 1, 100);
    let mut dropped = false;
    let mut l = Link::new(enrollee("joiner", Box::new(AuthNone))).with_drop(move |_, s| {
        let hit = !dropped && s == "M_START_R /difm/ops";
        dropped |= hit;
        hit
    });
    l.ee.start(Instant::ZERO);
    run(&mut [&mut l], &mut m, Instant::ZERO, secs(1000));
    assert!(matches!(
        l.enrolled(),
        Some(EnrollmentEvent::Enrolled { address: 2, .. })
    ));
    assert_eq!(
        l.er_events,
        vec![
            EnrollerEvent::Admitted {
                address: 2,
                peer: name("joiner")
            };
            2
        ]
    );
    assert_eq!(l.sent(Dir::Up, "M_CONNECT"), vec![secs(0), secs(11)]);
    assert_eq!(l.ee.status().attempts, 2);
    assert_eq!(m.in_use().len(), 2);
}

#[test]
fn unreachable_member_is_retried_then_reported() {
    let mut m = membership(Box::new(AuthNone), 1, 100);
    let mut cfg = EnrolleeConfig::new(name("joiner"), name("member"));
    cfg.max_attempts = 2;
    let mut l = Link::new(Enrollee::new(cfg, Box::new(AuthNone))).with_drop(|_, _| true);
    l.ee.start(Instant::ZERO);
    l.ee.unreachable(Instant::ZERO, "no N-1 flow to member");
    l.pump(Instant::ZERO, &mut m);
    assert_eq!(l.ee.poll_timeout(), Some(secs(1)));
    l.ee.handle_timeout(secs(1));
    l.ee.unreachable(secs(1), "no N-1 flow to member");
    l.pump(secs(1), &mut m);
    let err = EnrollmentError::Unreachable {
        step: Step::Connect,
        reason: "no N-1 flow to member".into(),
    };
    assert_eq!(l.failed(), Some(&err));
    assert_eq!(
        err.to_string(),
        "step connect: member unreachable: no N-1 flow to member"
    );
    assert_eq!(l.ee.status().attempts, 2);
}

#[test]
fn unexpected_traffic_is_answered_not_fatal() {
    let mut m = membership(Box::new(AuthNone), 1, 100);
    let mut l = Link::new(enrollee("joiner", Box::new(AuthNone)));
    l.ee.start(Instant::ZERO);
    l.ee.on_message(Instant::ZERO, b"\xff\xff not cdap");
    l.er.on_message(Instant::ZERO, b"\x08", &mut m);
    run(&mut [&mut l], &mut m, Instant::ZERO, secs(1000));
    assert!(l.enrolled().is_some());
    assert_eq!(l.ee.counters().malformed, 1);
    assert_eq!(l.er.counters().malformed, 1);
}

#[test]
fn next_free_policy() {
    let mut p = NextFree::new(1, 5);
    let used: BTreeSet<Address> = [1, 2, 4].into();
    assert_eq!(p.assign(0, &used), Some(3));
    assert_eq!(
        p.assign(5, &used),
        Some(5),
        "a free requested address is kept"
    );
    assert_eq!(p.assign(4, &used), Some(3), "a taken one is not");
    assert_eq!(p.assign(9, &used), Some(3), "nor one out of range");
    let full: BTreeSet<Address> = (1..=5).collect();
    assert_eq!(p.assign(0, &full), None);
    assert_eq!(NextFree::new(0, 0).assign(0, &BTreeSet::new()), None);
    assert_eq!(NextFree::new(0, 3).assign(0, &BTreeSet::new()), Some(1));
    assert_eq!(
        NextFree::new(u64::MAX - 1, u64::MAX).assign(0, &[u64::MAX - 1].into()),
        Some(u64::MAX)
    );
    assert_eq!(
        NextFree::new(u64::MAX - 1, u64::MAX).assign(0, &[u64::MAX - 1, u64::MAX].into()),
        None
    );
}

#[test]
fn password_comparison() {
    assert!(constant_time_eq(b"abc", b"abc"));
    assert!(!constant_time_eq(b"abc", b"abd"));
    assert!(!constant_time_eq(b"abc", b"abc\0"));
    assert!(!constant_time_eq(b"", b"\0"));
    assert!(constant_time_eq(b"", b""));
    let p = AuthPassword("pw".into());
    let (ne, nm) = ([1u8; 32], [2u8; 32]);
    let e = Handshake::Enrollment;
    let (answer, ctx) = p.challenge(e, &p.hello(&ne), &nm).unwrap();
    let proof = p.respond(e, &ne, &answer).unwrap();
    assert_eq!(p.verify(e, &ctx, &proof), Ok(()));
    let q = AuthPassword("pW".into());
    assert_eq!(q.respond(e, &ne, &answer), Err(AuthFailure::BadProof));
    assert_eq!(q.verify(e, &ctx, &proof), Err(AuthFailure::BadProof));
    // The member's proof never stands for the enrollee's.
    assert_eq!(p.verify(e, &ctx, &answer[32..]), Err(AuthFailure::BadProof));
    assert_eq!(format!("{p:?}"), "AuthPassword(<hidden>)");
    assert_eq!(AuthNone.verify(e, b"", b"anything"), Ok(()));
}

/// Each policy's proofs of one handshake, checked in the other: refused,
/// both ways and in both directions (a member's answer to an enrollment
/// hello carrying a port-authentication nonce would otherwise make the
/// port's initiator compute an enrollment token for whoever relays it).
#[test]
fn proofs_of_one_handshake_never_serve_in_the_other() {
    use Handshake::{Enrollment, Port};
    let keys = AuthKeys::new([3; 32], Vec::new());
    let keys = AuthKeys::new([3; 32], vec![keys.public_key()]);
    let policies: [Box<dyn AuthPolicy>; 2] = [Box::new(AuthPassword("pw".into())), Box::new(keys)];
    let (ne, nm) = ([1u8; 32], [2u8; 32]);
    for p in &policies {
        for (made, taken) in [(Enrollment, Port), (Port, Enrollment)] {
            let (answer, ctx) = p.challenge(made, &p.hello(&ne), &nm).unwrap();
            let proof = p.respond(made, &ne, &answer).unwrap();
            assert_eq!(p.verify(made, &ctx, &proof), Ok(()), "{}", p.name());
            assert_eq!(
                p.respond(taken, &ne, &answer),
                Err(AuthFailure::BadProof),
                "{}: an answer made in {made:?} taken in {taken:?}",
                p.name()
            );
            assert_eq!(
                p.verify(taken, &ctx, &proof),
                Err(AuthFailure::BadProof),
                "{}: a proof made in {made:?} taken in {taken:?}",
                p.name()
            );
        }
    }
}

/// The attack the labels stop, end to end: a port's hello nonce sent to an
/// enroller as an enrollment hello; the enroller's answer, shown to the
/// port's initiator, gets no proof out of it.
#[test]
fn an_enrollers_answer_to_a_ports_nonce_gets_no_port_proof() {
    let pw = AuthPassword("pw".into());
    let mut m = Membership::new(
        Box::new(pw.clone()),
        Box::new(NextFree::new(1, 10)),
        DifContent {
            config: DifConfigBlob(vec![1]),
            ..Default::default()
        },
    );
    let mut er = Enroller::new(EnrollerConfig::default()).with_nonces(NonceGen::new([7; 32]));
    let n1: Nonce = [9; 32];
    let connect = CdapMessage::connect(
        WireAuth::new(AUTH_PASSWORD, n1.to_vec()),
        &name("evil"),
        &name("member"),
    )
    .with_invoke_id(1);
    er.on_message(secs(0), &connect.encode(), &mut m);
    let r = CdapMessage::decode(&er.poll_transmit().unwrap()).unwrap();
    assert_eq!(r.result(), 0);
    let answer = r.auth_policy.unwrap().options.unwrap();
    // What the port's initiator runs on an answer to its hello n1.
    assert_eq!(
        pw.respond(Handshake::Port, &n1, &answer),
        Err(AuthFailure::BadProof)
    );
    // And an initiator's port proof for n1 is no enrollment token.
    let (port_answer, _) = pw.challenge(Handshake::Port, &n1, &[5; 32]).unwrap();
    let port_proof = pw.respond(Handshake::Port, &n1, &port_answer).unwrap();
    let info = EnrollmentInformation {
        token: auth::hex(&port_proof),
        ..Default::default()
    };
    let start = CdapMessage::start(CLASS_ENROLLMENT, OBJ_ENROLLMENT)
        .with_object(&info)
        .with_invoke_id(2);
    er.on_message(secs(0), &start.encode(), &mut m);
    let r = CdapMessage::decode(&er.poll_transmit().unwrap()).unwrap();
    assert_ne!(r.result(), 0, "enrolled with a port proof");
}

#[test]
fn errors_name_their_step_and_retryability() {
    use EnrollmentError::*;
    let cases = [
        (BadCredentials { reason: "x".into() }, Step::Connect, false),
        (
            PeerNotAuthenticated { reason: "x".into() },
            Step::Connect,
            false,
        ),
        (NoAddress, Step::StartEnrollment, false),
        (
            Refused {
                step: Step::StartOperation,
                reason: "x".into(),
            },
            Step::StartOperation,
            false,
        ),
        (
            Timeout {
                step: Step::Configuration,
            },
            Step::Configuration,
            true,
        ),
        (
            Protocol {
                step: Step::StopEnrollment,
                detail: "x".into(),
            },
            Step::StopEnrollment,
            true,
        ),
    ];
    for (e, step, retry) in cases {
        assert_eq!(e.step(), step, "{e}");
        assert_eq!(e.is_retryable(), retry, "{e}");
        assert!(e.to_string().starts_with(&format!("step {step}:")), "{e}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever is lost, the enrollee ends enrolled or failed in bounded
    /// time, and if enrolled the member agrees on its address.
    #[test]
    fn random_loss_ends_consistently(seed in any::<u64>(), loss in 0.0f64..0.3, pw in any::<bool>()) {
        // With the password too: a loss never turns into an authentication
        // failure (which would not be retried).
        let policy = move || -> Box<dyn AuthPolicy> {
            if pw { Box::new(AuthPassword("pw".into())) } else { Box::new(AuthNone) }
        };
        let mut m = membership(policy(), 1, 100);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let ee = enrollee("joiner", policy()).with_nonces(NonceGen::new([seed as u8; 32]));
        let mut l = Link::new(ee).with_drop(move |_, _| rng.gen_bool(loss));
        l.ee.start(Instant::ZERO);
        run(&mut [&mut l], &mut m, Instant::ZERO, secs(10_000));
        let st = l.ee.status();
        prop_assert!(matches!(st.phase, Phase::Enrolled | Phase::Failed), "{st:?}");
        prop_assert_eq!(l.ee.poll_timeout(), None);
        if let Some(EnrollmentEvent::Enrolled { address, config, .. }) = l.enrolled() {
            prop_assert_eq!(m.holder(*address), Some("joiner"));
            prop_assert_eq!(config, &content().config);
            let admitted = l.er_events.iter().rev().find_map(|e| match e {
                EnrollerEvent::Admitted { address, .. } => Some(*address),
                _ => None,
            });
            prop_assert_eq!(admitted, Some(*address));
        } else {
            prop_assert!(l.failed().is_some_and(EnrollmentError::is_retryable));
            prop_assert_eq!(st.attempts, 4);
        }
        // Never more than one address held by the joiner.
        prop_assert!(m.in_use().len() <= 2);
    }

    /// NextFree never hands out a used or out-of-range address, and says
    /// None only when the range is full.
    #[test]
    fn next_free_is_sound(
        first in 0u64..20,
        len in 0u64..20,
        used in proptest::collection::btree_set(0u64..45, 0..30),
        requested in 0u64..45,
    ) {
        let last = first + len;
        match NextFree::new(first, last).assign(requested, &used) {
            Some(a) => {
                prop_assert!(a >= first.max(1) && a <= last && !used.contains(&a));
            }
            None => prop_assert!((first.max(1)..=last).all(|a| used.contains(&a))),
        }
    }

    /// Garbage on the flow never panics either side.
    #[test]
    fn garbage_does_not_panic(msgs in proptest::collection::vec(
        proptest::collection::vec(any::<u8>(), 0..64), 0..16)) {
        let mut m = membership(Box::new(AuthNone), 1, 100);
        let mut ee = enrollee("joiner", Box::new(AuthNone));
        let mut er = Enroller::new(EnrollerConfig::default());
        ee.start(Instant::ZERO);
        for b in &msgs {
            ee.on_message(Instant::ZERO, b);
            er.on_message(Instant::ZERO, b, &mut m);
        }
        ee.handle_timeout(secs(100));
        er.handle_timeout(secs(100), &mut m);
    }
}

/// The enrollee gives up before the member does and starts over while the
/// member is still mid-sequence; with and without its M_RELEASE arriving.
#[test]
fn enrollee_restarting_mid_sequence_resets_the_member() {
    for drop_release in [false, true] {
        let mut m = membership(Box::new(AuthNone), 1, 100);
        let mut cfg = EnrolleeConfig::new(name("joiner"), name("member"));
        cfg.step_timeout = Duration::from_secs(5);
        let mut seen = false;
        let mut l = Link::new(Enrollee::new(cfg, Box::new(AuthNone))).with_drop(move |_, s| {
            let hit = !seen && s == "M_CREATE /dt";
            seen |= hit;
            hit || (drop_release && s == "M_RELEASE")
        });
        l.ee.start(Instant::ZERO);
        run(&mut [&mut l], &mut m, Instant::ZERO, secs(1000));
        assert!(
            matches!(
                l.enrolled(),
                Some(EnrollmentEvent::Enrolled { address: 2, .. })
            ),
            "drop_release={drop_release}: {:?}",
            l.ee_events
        );
        assert_eq!(l.sent(Dir::Up, "M_CONNECT"), vec![secs(0), secs(6)]);
        assert_eq!(
            l.er_events.last(),
            Some(&EnrollerEvent::Admitted {
                address: 2,
                peer: name("joiner")
            })
        );
        assert!(matches!(
            l.er_events[0],
            EnrollerEvent::Rejected {
                reason: EnrollmentError::Protocol {
                    step: Step::Configuration,
                    ..
                },
                ..
            }
        ));
        assert_eq!(m.in_use().len(), 2);
    }
}

#[test]
fn lost_stop_response_is_implied_by_start_operation() {
    let mut m = membership(Box::new(AuthNone), 1, 100);
    let mut l = Link::new(enrollee("joiner", Box::new(AuthNone)))
        .with_drop(|_, s| s == "M_STOP_R /difm/enr");
    l.ee.start(Instant::ZERO);
    let end = run(&mut [&mut l], &mut m, Instant::ZERO, secs(1000));
    assert!(l.enrolled().is_some(), "{:?}", l.ee_events);
    assert_eq!(l.er_events.len(), 1);
    assert_eq!(end, Instant::ZERO, "no retry needed");
}

#[test]
fn too_many_objects_is_a_protocol_error() {
    let mut m = membership(Box::new(AuthNone), 1, 100);
    let mut cfg = EnrolleeConfig::new(name("joiner"), name("member"));
    cfg.max_objects = 5;
    cfg.max_attempts = 1;
    let mut l = Link::new(Enrollee::new(cfg, Box::new(AuthNone)));
    l.ee.start(Instant::ZERO);
    run(&mut [&mut l], &mut m, Instant::ZERO, secs(1000));
    match l.failed() {
        Some(EnrollmentError::Protocol { step, detail }) => {
            assert_eq!(*step, Step::Configuration);
            assert_eq!(detail, "more than 5 objects");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(l.ee.counters().objects, 5);
    assert!(matches!(
        l.er_events.as_slice(),
        [EnrollerEvent::Rejected {
            reason: EnrollmentError::Protocol {
                step: Step::Configuration,
                ..
            },
            ..
        }]
    ));
    assert_eq!(m.in_use().len(), 1, "the member freed the address");
}

/// Fewer objects than the count allows, but more bytes than an enrollee
/// holds (each object may be up to 4 MiB): the attempt ends as a protocol
/// error saying so, counted, and the member frees the address.
#[test]
fn too_many_bytes_of_objects_is_a_protocol_error() {
    let mut m = membership(Box::new(AuthNone), 1, 100);
    // 65 MiB of directory entries in 65 objects.
    m.content.directory = vec![vec![0x5a; 1 << 20]; 65];
    let mut cfg = EnrolleeConfig::new(name("joiner"), name("member"));
    cfg.max_attempts = 1;
    let mut l = Link::new(Enrollee::new(cfg, Box::new(AuthNone)));
    l.ee.start(Instant::ZERO);
    run(&mut [&mut l], &mut m, Instant::ZERO, secs(1000));
    match l.failed() {
        Some(EnrollmentError::Protocol { step, detail }) => {
            assert_eq!(*step, Step::Configuration);
            assert_eq!(
                detail,
                &format!("more than {MAX_ENROLLMENT_BYTES} bytes of objects")
            );
        }
        other => panic!("the enrollee took 65 MiB of objects: {other:?}"),
    }
    assert_eq!(l.ee.counters().too_many_bytes, 1);
    assert_eq!(m.in_use().len(), 1, "the member freed the address");
}

// Challenge-response and key authentication (issue 18).

#[test]
fn no_secret_crosses_the_wire_and_every_proof_is_fresh() {
    let pw = "correct horse battery staple";
    let mut m = membership(Box::new(AuthPassword(pw.into())), 1, 100);
    let mut proofs = Vec::new();
    for (i, seed) in [[7u8; 32], [8u8; 32]].into_iter().enumerate() {
        let ee =
            enrollee("joiner", Box::new(AuthPassword(pw.into()))).with_nonces(NonceGen::new(seed));
        let mut l = Link::new(ee);
        l.er = Enroller::new(EnrollerConfig::default()).with_nonces(NonceGen::new([i as u8; 32]));
        l.ee.start(Instant::ZERO);
        run(&mut [&mut l], &mut m, Instant::ZERO, secs(1000));
        assert!(l.enrolled().is_some(), "{:?}", l.ee_events);
        let capture = l.wire.concat();
        assert!(!capture.is_empty());
        let needle = pw.as_bytes();
        assert!(
            !capture.windows(needle.len()).any(|w| w == needle),
            "the password is in the capture"
        );
        // Nor a prefix long enough to matter.
        assert!(!capture.windows(8).any(|w| w == &needle[..8]));
        for b in &l.wire {
            let msg = CdapMessage::decode(b).unwrap();
            if msg.op_code() == OpCode::Start && msg.obj_name.as_deref() == Some(OBJ_ENROLLMENT) {
                let info: EnrollmentInformation = msg.object().unwrap();
                proofs.push(info.token);
            }
        }
    }
    assert_eq!(proofs.len(), 2);
    assert_eq!(proofs[0].len(), 64, "an HMAC-SHA256, in hex");
    assert_ne!(proofs[0], proofs[1], "fresh nonces, fresh proofs");
}

#[test]
fn a_replayed_proof_is_refused() {
    // An eavesdropper replays an enrollee's whole side of a recorded
    // enrollment: the member's new nonce makes the old proof worthless.
    let pw = "s3cret";
    let mut m = membership(Box::new(AuthPassword(pw.into())), 1, 100);
    let mut l = Link::new(enrollee("joiner", Box::new(AuthPassword(pw.into()))));
    l.er = Enroller::new(EnrollerConfig::default()).with_nonces(NonceGen::new([1; 32]));
    l.ee.start(Instant::ZERO);
    run(&mut [&mut l], &mut m, Instant::ZERO, secs(1000));
    assert!(l.enrolled().is_some());
    let up: Vec<Vec<u8>> = l
        .log
        .iter()
        .zip(&l.wire)
        .filter(|((_, d, _), _)| *d == Dir::Up)
        .map(|(_, b)| b.clone())
        .collect();
    let mut er = Enroller::new(EnrollerConfig::default()).with_nonces(NonceGen::new([2; 32]));
    for b in &up[..2] {
        er.on_message(secs(5), b, &mut m);
    }
    let ev: Vec<_> = std::iter::from_fn(|| er.poll_event()).collect();
    assert_eq!(
        ev,
        vec![EnrollerEvent::Rejected {
            peer: name("joiner"),
            reason: EnrollmentError::BadCredentials {
                reason: AuthFailure::BadProof.to_string()
            }
        }]
    );
    assert_eq!(er.counters().bad_credentials, 1);
}

fn keys(secret: u8, trusted: &[u8]) -> AuthKeys {
    let pk = |s: u8| AuthKeys::new([s; 32], vec![]).public_key();
    AuthKeys::new([secret; 32], trusted.iter().map(|s| pk(*s)).collect())
}

#[test]
fn key_pairs_enroll_mutually() {
    let mut m = membership(Box::new(keys(1, &[1, 2, 3])), 1, 100);
    let mut l = Link::new(enrollee("joiner", Box::new(keys(2, &[1, 2, 3]))));
    l.ee.start(Instant::ZERO);
    run(&mut [&mut l], &mut m, Instant::ZERO, secs(1000));
    assert!(l.enrolled().is_some(), "{:?}", l.ee_events);
    // No private key on the wire.
    let capture = l.wire.concat();
    assert!(!capture.windows(32).any(|w| w == [2u8; 32]));
    assert!(!format!("{:?}", keys(2, &[])).contains(&auth::hex(&[2u8; 32])));
}

#[test]
fn an_untrusted_enrollee_key_is_refused_with_the_reason_on_both_sides() {
    let mut m = membership(Box::new(keys(1, &[1, 2])), 1, 100);
    let mut l = Link::new(enrollee("joiner", Box::new(keys(9, &[1, 2]))));
    l.ee.start(Instant::ZERO);
    run(&mut [&mut l], &mut m, Instant::ZERO, secs(1000));
    let pk9 = auth::hex(&keys(9, &[]).public_key());
    match l.failed() {
        Some(EnrollmentError::BadCredentials { reason }) => {
            assert!(
                reason.contains(&pk9) && reason.contains("not trusted"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(l.sent(Dir::Down, "M_CONNECT_R (-2)").len(), 1);
    assert_eq!(l.sent(Dir::Up, "M_CONNECT").len(), 1, "not retried");
    match &l.er_events[..] {
        [EnrollerEvent::Rejected {
            reason: EnrollmentError::BadCredentials { reason },
            ..
        }] => assert!(reason.contains("not trusted"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(l.ee.status().last_error.unwrap().contains("step connect"));
}

#[test]
fn an_enrollee_refuses_a_member_whose_key_it_does_not_trust() {
    // The member trusts the enrollee, the enrollee does not trust the member.
    let mut m = membership(Box::new(keys(5, &[2])), 1, 100);
    let mut l = Link::new(enrollee("joiner", Box::new(keys(2, &[1]))));
    l.ee.start(Instant::ZERO);
    run(&mut [&mut l], &mut m, Instant::ZERO, secs(1000));
    match l.failed() {
        Some(EnrollmentError::PeerNotAuthenticated { reason }) => {
            assert!(reason.contains("not trusted"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        &l.er_events[..],
        [EnrollerEvent::Rejected {
            reason: EnrollmentError::BadCredentials { .. },
            ..
        }]
    ));
}
