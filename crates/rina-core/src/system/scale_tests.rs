//! Many idle flows in one system: past the old cap of 4,096 per IPCP, with
//! nothing to time while they are idle.

use super::*;
use crate::rmt::FifoConfig;

const ME: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 7000);

fn name(s: &str) -> AppName {
    s.parse().unwrap()
}

/// Carries out the system's outputs (frames straight back in, requests
/// accepted) until it is quiet; returns the flows that came up.
fn settle(s: &mut System, now: Instant) -> Vec<PortId> {
    let mut up = Vec::new();
    while let Some(o) = s.poll_output() {
        match o {
            Output::ToMedium { medium, frame, .. } => s.handle_frame(now, medium, ME, &frame),
            Output::App(AppEvent::FlowRequest { handle, .. }) => {
                up.push(s.accept(now, handle).expect("accept").0);
            }
            Output::App(AppEvent::Allocated { port, .. }) => up.push(port),
            Output::App(AppEvent::AllocateFailed { error, .. }) => panic!("{error}"),
            _ => {}
        }
    }
    up
}

/// Allocates `pairs` flows from `src` to `sink` (both ends here) and checks
/// that, idle, they ask for no timer of their own (a shim-udp checks them
/// all once per `check`); then closes them all.
fn fill(mut s: System, pairs: usize, check: Option<std::time::Duration>) {
    s.register_at(0, name("sink")).unwrap();
    let now = Instant::from_nanos(1_000_000);
    let mut up = settle(&mut s, now);
    for _ in 0..pairs {
        s.allocate_at(now, 0, name("src"), name("sink"), QosSpec::default())
            .expect("no cap below the flows asked for");
        up.extend(settle(&mut s, now));
    }
    assert_eq!(up.len(), 2 * pairs);
    // Idle: once the allocations' own timers are done, nothing is due.
    let later = now + std::time::Duration::from_secs(60);
    s.handle_timeout(later);
    settle(&mut s, later);
    assert_eq!(
        s.poll_timeout(),
        check.map(|c| later + c),
        "idle flows keep no timer running but one liveness check for all"
    );
    for p in up {
        s.close(later, p);
        settle(&mut s, later);
    }
    assert_eq!(s.app_flows.len(), 0);
}

#[test]
fn a_shim_udp_holds_a_hundred_thousand_idle_flows() {
    let mut s = System::new("s");
    let mut c = shim_udp::Config::new("udp");
    c.directory.insert(name("sink"), ME);
    s.add_shim_udp("s.udp", c, None).unwrap();
    fill(s, 50_000, Some(std::time::Duration::from_secs(10)));
}

#[test]
fn a_normal_ipcp_holds_a_hundred_thousand_idle_flows_with_wide_cep_ids() {
    let mut s = System::new("s");
    let mut c = NormalConfig::new("net", 1);
    c.directory.insert(name("sink"), 1);
    // 100,000 connections need more than the default 2-byte CEP-id.
    c.dt.cep = rina_wire::pci::FieldWidth::W4;
    let fifo = SchedulerConfig::Fifo(FifoConfig { queue_len: 100 });
    s.add_normal(name("s.net"), c, &fifo, Vec::new(), BTreeMap::new())
        .unwrap();
    fill(s, 50_000, None);
}

#[test]
fn a_normal_ipcp_says_when_its_cep_ids_run_out() {
    let mut s = System::new("s");
    let mut c = NormalConfig::new("net", 1);
    c.directory.insert(name("sink"), 1);
    c.dt.cep = rina_wire::pci::FieldWidth::W1;
    let fifo = SchedulerConfig::Fifo(FifoConfig { queue_len: 100 });
    s.add_normal(name("s.net"), c, &fifo, Vec::new(), BTreeMap::new())
        .unwrap();
    s.register_at(0, name("sink")).unwrap();
    let now = Instant::from_nanos(1_000_000);
    let mut errors = Vec::new();
    for _ in 0..200 {
        match s.allocate_at(now, 0, name("src"), name("sink"), QosSpec::default()) {
            Ok(_) => {
                while let Some(o) = s.poll_output() {
                    match o {
                        Output::App(AppEvent::FlowRequest { handle, .. }) => {
                            if let Err(e) = s.accept(now, handle) {
                                errors.push(e.to_string());
                            }
                        }
                        Output::App(AppEvent::AllocateFailed { error, .. }) => {
                            errors.push(error.to_string())
                        }
                        _ => {}
                    }
                }
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    // A 1-byte field: 255 CEP-ids, 127 flows with both ends here, then
    // refusals that say why.
    assert!(!errors.is_empty());
    assert!(errors.iter().any(|e| e.contains("CEP-id")), "{errors:?}");
}
