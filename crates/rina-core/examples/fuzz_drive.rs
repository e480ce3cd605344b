//! A coverage-less fuzz driver on stable Rust: feeds the bodies of the fuzz
//! targets in `rina_core::fuzzing` seeded random inputs (random lengths up
//! to 4 KiB; a third of them built from valid-looking records) for a
//! number of executions or seconds each, catching panics. For when
//! cargo-fuzz (nightly, libFuzzer) cannot run; `fuzz/campaign.sh` is the
//! coverage-guided campaign. Prints executions, rate and crashes per
//! target; a crashing input is written to `fuzz-crash-<target>-<n>.bin`.
//!
//! `cargo run --release -p rina-core --example fuzz_drive [EXECS] [SECONDS] [SEED]`

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::{Duration, Instant};

type Body = fn(&[u8]);

fn aead_open(data: &[u8]) {
    use rina_core::sdup::aead::{ephemeral_public, PortCrypto, SessionKeys};
    let (a, b) = ([1u8; 32], [2u8; 32]);
    let (na, nb) = (ephemeral_public(&a), ephemeral_public(&b));
    let mut rx = PortCrypto::new();
    if let Ok(k) = SessionKeys::derive(&b, &na, &nb, false) {
        rx.install(rina_core::time::Instant::ZERO, &k);
    }
    let _ = rx.open(data);
    // The same bytes as a peer's ephemeral key.
    if data.len() >= 32 {
        let mut peer = [0u8; 32];
        peer.copy_from_slice(&data[..32]);
        let _ = SessionKeys::derive(&a, &na, &peer, true);
    }
}

fn input(rng: &mut ChaCha8Rng) -> Vec<u8> {
    let len = rng.gen_range(0..4096);
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    if rng.gen_bool(1.0 / 3.0) {
        // Records with small time steps and short lengths, and first bytes
        // that pick operations and discriminators often.
        let mut i = 0;
        while i + 2 < v.len() {
            v[i] = rng.gen_range(0..50);
            let n = rng.gen_range(0..64u8);
            v[i + 1] = n;
            if i + 2 < v.len() {
                v[i + 2] = *[0u8, 1, 2, 3, 4, 5, 0xE0, 0xE1, 0xE2, 0xF6, 0xAE, 0xC0]
                    .get(rng.gen_range(0..12))
                    .unwrap_or(&0);
            }
            i += 2 + n as usize;
        }
    }
    v
}

fn main() {
    let mut args = std::env::args().skip(1);
    let execs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let secs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(60);
    let seed: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(1);
    let targets: [(&str, Body); 6] = [
        ("mgmt_fragments", rina_core::fuzzing::mgmt_fragments),
        (
            "enrollment_payloads",
            rina_core::fuzzing::enrollment_payloads,
        ),
        ("efcp_pdus", rina_core::fuzzing::efcp_pdus),
        ("normal_ipcp_frames", rina_core::fuzzing::normal_ipcp_frames),
        ("encrypted_link", rina_core::fuzzing::encrypted_link),
        ("aead_open", aead_open),
    ];
    std::panic::set_hook(Box::new(|_| {}));
    println!(
        "{:<20} {:>10} {:>9} {:>8}",
        "target", "execs", "exec/s", "crashes"
    );
    let mut failed = false;
    for (name, body) in targets {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let start = Instant::now();
        let (mut n, mut crashes) = (0u64, 0u64);
        while n < execs && start.elapsed() < Duration::from_secs(secs) {
            let data = input(&mut rng);
            n += 1;
            if std::panic::catch_unwind(|| body(&data)).is_err() {
                crashes += 1;
                if crashes <= 3 {
                    let _ = std::fs::write(format!("fuzz-crash-{name}-{crashes}.bin"), &data);
                }
            }
        }
        let rate = n as f64 / start.elapsed().as_secs_f64();
        println!("{name:<20} {n:>10} {rate:>9.0} {crashes:>8}");
        failed |= crashes > 0;
    }
    std::process::exit(i32::from(failed));
}
