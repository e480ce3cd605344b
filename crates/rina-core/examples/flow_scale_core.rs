//! Scale benchmark of the sans-IO core (not a test): idle flows in one
//! [`System`], with no descriptors in the way (the daemon needs one per
//! flow, and its process limit may be lower than the flows asked for).
//!
//! One system with one IPCP: a shim-udp whose directory points at itself
//! (its frames are fed straight back) or a normal IPCP with no neighbour
//! whose flows loop back inside it. `--flows N` makes N/2 allocations, each
//! accepted by the same system: N flows (ports). Heap bytes are counted by
//! a global allocator, so "bytes per idle flow" is the core's own state,
//! exactly; the daemon adds its flow slot, the descriptor and the poller's
//! entry (see `crates/rinad/examples/flow_scale.rs`).
//!
//!   cargo run --release -p rina-core --example flow_scale_core -- --dif normal --flows 200000

use rina_core::normal::NormalConfig;
use rina_core::rmt::{FifoConfig, SchedulerConfig};
use rina_core::shim_udp;
use rina_core::system::{AppEvent, Output, PortId, System};
use rina_core::Instant;
use rina_wire::{AppName, QosSpec};
use std::alloc::{GlobalAlloc, Layout, System as Heap};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Instant as Clock;

/// The system allocator, counting the bytes in use.
struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        IN_USE.fetch_add(l.size(), Relaxed);
        Heap.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        IN_USE.fetch_sub(l.size(), Relaxed);
        Heap.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        IN_USE.fetch_add(new, Relaxed);
        IN_USE.fetch_sub(l.size(), Relaxed);
        Heap.realloc(p, l, new)
    }
}

#[global_allocator]
static A: Counting = Counting;

const ME: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 7000);

fn name(s: &str) -> AppName {
    s.parse().unwrap()
}

fn system(dif: &str, flows: usize) -> System {
    let mut s = System::new("s");
    match dif {
        "udp" => {
            let mut c = shim_udp::Config::new("udp");
            c.directory.insert(name("sink"), ME);
            c.max_flows = flows + 16;
            s.add_shim_udp("s.udp", c, None).unwrap();
        }
        "normal" => {
            let mut c = NormalConfig::new("net", 1);
            c.directory.insert(name("sink"), 1);
            c.max_flows = flows + 16;
            if flows > 65_000 {
                c.dt.cep = rina_wire::pci::FieldWidth::W4;
            }
            let fifo = SchedulerConfig::Fifo(FifoConfig { queue_len: 100 });
            s.add_normal(name("s.net"), c, &fifo, Vec::new(), BTreeMap::new())
                .unwrap();
        }
        d => panic!("--dif udp or normal, not {d}"),
    }
    s.register_at(0, name("sink")).unwrap();
    s
}

/// Carries out what the system asked until it is quiet: frames go back in,
/// requests are accepted; returns the flows that came up.
fn settle(s: &mut System, now: Instant, up: &mut Vec<PortId>) -> usize {
    let mut failed = 0;
    loop {
        let Some(o) = s.poll_output() else {
            return failed;
        };
        match o {
            Output::ToMedium { medium, frame, .. } => s.handle_frame(now, medium, ME, &frame),
            Output::App(AppEvent::FlowRequest { handle, .. }) => {
                let (port, _) = s.accept(now, handle).expect("accept");
                up.push(port);
            }
            Output::App(AppEvent::Allocated { port, .. }) => up.push(port),
            Output::App(AppEvent::AllocateFailed { error, .. }) => {
                if failed == 0 {
                    eprintln!("allocation failed: {error}");
                }
                failed += 1;
            }
            _ => {}
        }
    }
}

fn main() {
    let mut dif = "udp".to_string();
    let mut flows = 100_000;
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().expect("a value");
        match k.as_str() {
            "--dif" => dif = v,
            "--flows" => flows = v.parse().expect("--flows N"),
            _ => panic!("unknown argument {k}"),
        }
    }
    let clock = Clock::now();
    let now = || Instant::from_nanos(clock.elapsed().as_nanos() as u64);
    let mut s = system(&dif, flows);
    let mut up = Vec::with_capacity(flows);
    settle(&mut s, now(), &mut up);
    let heap0 = IN_USE.load(Relaxed);
    let t = Clock::now();
    let mut failed = 0;
    for _ in 0..flows / 2 {
        let t = now();
        match s.allocate_at(t, 0, name("src"), name("sink"), QosSpec::default()) {
            Ok(_) => failed += settle(&mut s, t, &mut up),
            Err(e) => {
                failed += 1;
                if failed == 1 {
                    eprintln!("allocation refused: {e}");
                }
            }
        }
        if s.poll_timeout().is_some_and(|d| d <= t) {
            s.handle_timeout(t);
        }
    }
    let rate = (flows / 2) as f64 / t.elapsed().as_secs_f64();
    let heap1 = IN_USE.load(Relaxed);
    let t = Clock::now();
    let turns = 1000;
    for _ in 0..turns {
        let _ = s.poll_timeout();
    }
    let turn_ns = t.elapsed().as_nanos() as f64 / turns as f64;
    for &p in &up {
        s.close(now(), p);
        settle(&mut s, now(), &mut Vec::new());
    }
    s.shrink_to_fit();
    let heap2 = IN_USE.load(Relaxed);
    let reached = up.len();
    println!("dif: {dif} (sans-IO core, no descriptors)");
    println!("flows reached: {reached} of {flows} (failed allocations: {failed})");
    println!(
        "heap bytes per idle flow: {:.0}",
        (heap1 - heap0) as f64 / reached.max(1) as f64
    );
    println!("allocations/s (both ends, one at a time): {rate:.0}");
    println!(
        "of which an EFCP connection (normal): {} bytes",
        std::mem::size_of::<rina_core::efcp::Connection>()
    );
    println!("poll_timeout with every flow idle: {turn_ns:.0} ns");
    println!(
        "heap after closing every flow: {:.1} MiB more than before",
        heap2.saturating_sub(heap0) as f64 / 1048576.0
    );
}
