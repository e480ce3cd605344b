//! Traffic sources as pure schedules: a [`Generator`] yields the send time
//! (ns from the start of the flow) and size of every SDU of a [`Profile`],
//! drawn from a ChaCha8 stream seeded with a `u64`. No clock, no IO: the same
//! profile and seed always give the same schedule.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::header::HEADER_LEN;

/// Default SDU size of MTU-sized sources, in bytes.
pub const MTU_SIZE: usize = 1400;

/// A traffic source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Profile {
    /// Constant bit rate: one `size`-byte SDU every `size * 8 / rate_bps` s.
    Cbr { rate_bps: f64, size: usize },
    /// Poisson: exponential gaps of mean `size * 8 / rate_bps` s.
    Poisson { rate_bps: f64, size: usize },
    /// Exponential ON and OFF periods of means `on_s` and `off_s`; CBR at
    /// `rate_bps` during ON, nothing during OFF. Starts with an ON period.
    OnOff {
        on_s: f64,
        off_s: f64,
        rate_bps: f64,
        size: usize,
    },
    /// Voice (seed 004, G.722-like): one SDU every `interval_s`, of
    /// `talk_size` bytes during talk spurts and `silence_size` during silence;
    /// spurts and silences are exponential with means `talk_s`, `silence_s`.
    Voice {
        interval_s: f64,
        talk_size: usize,
        silence_size: usize,
        talk_s: f64,
        silence_s: f64,
    },
    /// Rate that changes every `segment_s`: uniform in
    /// `[min_bps, max_bps]`, CBR of `size`-byte SDUs within a segment (seed
    /// 004 video: MTU-sized SDUs at a varying rate; P2P data: up to 5 Mb/s).
    Varying {
        min_bps: f64,
        max_bps: f64,
        segment_s: f64,
        size: usize,
    },
}

/// Names accepted by [`Profile::named`], with what they stand for.
pub const PROFILE_NAMES: &[(&str, &str)] = &[
    ("hd-video-call", "seed 003: CBR 1.5 Mb/s"),
    (
        "online-gaming",
        "seed 003: ON-OFF 4 s / 2 s, 4 Mb/s during ON",
    ),
    ("voip", "seed 003: ON-OFF 3 s / 3 s, 64 kb/s during ON"),
    (
        "file-sharing",
        "seed 003: ON-OFF 2 s / 1 s, 5 Mb/s during ON",
    ),
    ("interactive", "seed 003: Poisson 2 Mb/s"),
    (
        "voice",
        "seed 004: every 20 ms, 200 B talking / 40 B silent, 1 s / 1.35 s",
    ),
    (
        "video-hd",
        "seed 004: MTU SDUs, 0.75..2.25 Mb/s per 2 s (mean 1.5)",
    ),
    (
        "video-fullhd",
        "seed 004: MTU SDUs, 1.5..4.5 Mb/s per 2 s (mean 3)",
    ),
    ("p2p", "seed 004: MTU SDUs, 0..5 Mb/s per 1 s (mean 2.5)"),
    ("cbr", "CBR, --rate-bps and --size (default 1 Mb/s, 1400 B)"),
    (
        "poisson",
        "Poisson, --rate-bps and --size (default 1 Mb/s, 1400 B)",
    ),
    (
        "on-off",
        "ON-OFF, --on-s, --off-s, --rate-bps, --size (default 1 s / 1 s, 1 Mb/s, 1400 B)",
    ),
];

/// What a flow's source is, as written in a matrix or on the command line:
/// a profile name and optional overrides.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSpec {
    /// One of [`PROFILE_NAMES`].
    pub profile: String,
    /// Rate (CBR, Poisson, ON-OFF during ON, maximum of varying sources;
    /// voice: the mean, by stretching or shrinking the SDU interval), bit/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_bps: Option<f64>,
    /// SDU size in bytes (voice: talk size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<usize>,
    /// Mean ON (talk) period, s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_s: Option<f64>,
    /// Mean OFF (silence) period, s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off_s: Option<f64>,
}

impl SourceSpec {
    /// The profile this spec names, with its overrides applied. An override
    /// the profile has no use for (ON and OFF periods of a source without
    /// them) is an error that names it as a matrix does (`on_s`, `off_s`).
    pub fn profile(&self) -> Result<Profile, String> {
        self.profile_keyed(["on_s", "off_s"])
    }

    /// As [`SourceSpec::profile`], naming the ON and OFF overrides as they
    /// were written where the spec came from (`--on-s` and `--off-s` on the
    /// command line, `on` and `off` in a rina-lab experiment file).
    pub fn profile_keyed(&self, keys: [&str; 2]) -> Result<Profile, String> {
        let mut p = Profile::named(&self.profile)?;
        if !p.has_on_off() {
            let given: Vec<&str> = [(self.on_s, keys[0]), (self.off_s, keys[1])]
                .iter()
                .filter_map(|&(v, k)| v.map(|_| k))
                .collect();
            if !given.is_empty() {
                let with: Vec<&str> = PROFILE_NAMES
                    .iter()
                    .map(|(n, _)| *n)
                    .filter(|n| Profile::named(n).is_ok_and(|p| p.has_on_off()))
                    .collect();
                return Err(format!(
                    "profile {} has no ON and OFF periods, so {} would change nothing \
                     (the profiles with them: {})",
                    self.profile,
                    given.join(" and "),
                    with.join(", ")
                ));
            }
        }
        match &mut p {
            Profile::Cbr { rate_bps, size } | Profile::Poisson { rate_bps, size } => {
                set(rate_bps, self.rate_bps);
                set(size, self.size);
            }
            Profile::OnOff {
                on_s,
                off_s,
                rate_bps,
                size,
            } => {
                set(on_s, self.on_s);
                set(off_s, self.off_s);
                set(rate_bps, self.rate_bps);
                set(size, self.size);
            }
            Profile::Voice {
                talk_size,
                talk_s,
                silence_s,
                ..
            } => {
                set(talk_size, self.size);
                set(talk_s, self.on_s);
                set(silence_s, self.off_s);
            }
            Profile::Varying {
                min_bps,
                max_bps,
                size,
                ..
            } => {
                if let Some(r) = self.rate_bps {
                    *min_bps *= r / *max_bps;
                    *max_bps = r;
                }
                set(size, self.size);
            }
        }
        if let (Some(r), Profile::Voice { .. }) = (self.rate_bps, &p) {
            if !(r > 0.0 && r.is_finite()) {
                return Err(format!("voice rate {r} bit/s is not above 0"));
            }
            let mean = p.mean_rate_bps();
            if let Profile::Voice { interval_s, .. } = &mut p {
                *interval_s *= mean / r;
            }
        }
        p.validate()?;
        Ok(p)
    }
}

fn set<T>(slot: &mut T, v: Option<T>) {
    if let Some(v) = v {
        *slot = v;
    }
}

impl Profile {
    /// A named profile with its defaults (see [`PROFILE_NAMES`]).
    pub fn named(name: &str) -> Result<Profile, String> {
        let on_off = |on_s, off_s, rate_bps| Profile::OnOff {
            on_s,
            off_s,
            rate_bps,
            size: MTU_SIZE,
        };
        Ok(match name {
            "hd-video-call" => Profile::Cbr {
                rate_bps: 1.5e6,
                size: MTU_SIZE,
            },
            "online-gaming" => on_off(4.0, 2.0, 4e6),
            "voip" => Profile::OnOff {
                on_s: 3.0,
                off_s: 3.0,
                rate_bps: 64e3,
                size: 160,
            },
            "file-sharing" => on_off(2.0, 1.0, 5e6),
            "interactive" => Profile::Poisson {
                rate_bps: 2e6,
                size: MTU_SIZE,
            },
            "voice" => Profile::Voice {
                interval_s: 0.02,
                talk_size: 200,
                silence_size: 40,
                talk_s: 1.0,
                silence_s: 1.35,
            },
            "video-hd" => Profile::Varying {
                min_bps: 0.75e6,
                max_bps: 2.25e6,
                segment_s: 2.0,
                size: MTU_SIZE,
            },
            "video-fullhd" => Profile::Varying {
                min_bps: 1.5e6,
                max_bps: 4.5e6,
                segment_s: 2.0,
                size: MTU_SIZE,
            },
            "p2p" => Profile::Varying {
                min_bps: 0.0,
                max_bps: 5e6,
                segment_s: 1.0,
                size: MTU_SIZE,
            },
            "cbr" => Profile::Cbr {
                rate_bps: 1e6,
                size: MTU_SIZE,
            },
            "poisson" => Profile::Poisson {
                rate_bps: 1e6,
                size: MTU_SIZE,
            },
            "on-off" => on_off(1.0, 1.0, 1e6),
            _ => {
                let names: Vec<_> = PROFILE_NAMES.iter().map(|(n, _)| *n).collect();
                return Err(format!(
                    "unknown profile {name:?} (one of {})",
                    names.join(", ")
                ));
            }
        })
    }

    /// Whether the source has ON and OFF (talk and silence) periods, the
    /// ones `on_s` and `off_s` override.
    pub fn has_on_off(&self) -> bool {
        matches!(self, Profile::OnOff { .. } | Profile::Voice { .. })
    }

    /// Checks that rates, periods and sizes make sense.
    pub fn validate(&self) -> Result<(), String> {
        let pos = |x: f64, what: &str| {
            if x.is_finite() && x > 0.0 {
                Ok(())
            } else {
                Err(format!("{what} must be a positive number, not {x}"))
            }
        };
        let size = |s: usize| {
            if s >= HEADER_LEN {
                Ok(())
            } else {
                Err(format!(
                    "SDU size {s} is less than the {HEADER_LEN}-byte header"
                ))
            }
        };
        match *self {
            Profile::Cbr { rate_bps, size: s } | Profile::Poisson { rate_bps, size: s } => {
                pos(rate_bps, "rate")?;
                size(s)
            }
            Profile::OnOff {
                on_s,
                off_s,
                rate_bps,
                size: s,
            } => {
                pos(on_s, "ON mean")?;
                pos(off_s, "OFF mean")?;
                pos(rate_bps, "rate")?;
                size(s)
            }
            Profile::Voice {
                interval_s,
                talk_size,
                silence_size,
                talk_s,
                silence_s,
            } => {
                pos(interval_s, "interval")?;
                pos(talk_s, "talk mean")?;
                pos(silence_s, "silence mean")?;
                size(talk_size)?;
                size(silence_size)
            }
            Profile::Varying {
                min_bps,
                max_bps,
                segment_s,
                size: s,
            } => {
                pos(max_bps, "maximum rate")?;
                pos(segment_s, "segment")?;
                if !(min_bps >= 0.0 && min_bps <= max_bps) {
                    return Err(format!("bad rate range {min_bps}..{max_bps}"));
                }
                size(s)
            }
        }
    }

    /// The same source with every rate multiplied by `f` (SDU sizes and
    /// period lengths unchanged; voice, whose rate is its SDU interval,
    /// sends every `interval_s / f`).
    pub fn scaled(&self, f: f64) -> Profile {
        let mut p = self.clone();
        match &mut p {
            Profile::Cbr { rate_bps, .. }
            | Profile::Poisson { rate_bps, .. }
            | Profile::OnOff { rate_bps, .. } => *rate_bps *= f,
            Profile::Voice { interval_s, .. } => *interval_s /= f,
            Profile::Varying {
                min_bps, max_bps, ..
            } => {
                *min_bps *= f;
                *max_bps *= f;
            }
        }
        p
    }

    /// The same source in time dilated by `1/f` (`f` < 1 slows it down):
    /// every rate multiplied by `f` as [`Profile::scaled`] does, and every
    /// period (ON and OFF, talk and silence, a varying rate's segment)
    /// divided by `f`, so that the source sends the same SDUs, only `1/f`
    /// times slower: a scaled-down experiment keeps its burst structure.
    pub fn dilated(&self, f: f64) -> Profile {
        let mut p = self.scaled(f);
        match &mut p {
            Profile::Cbr { .. } | Profile::Poisson { .. } => {}
            Profile::OnOff { on_s, off_s, .. } => {
                *on_s /= f;
                *off_s /= f;
            }
            Profile::Voice {
                talk_s, silence_s, ..
            } => {
                *talk_s /= f;
                *silence_s /= f;
            }
            Profile::Varying { segment_s, .. } => *segment_s /= f,
        }
        p
    }

    /// The long-run mean offered rate in bit/s (SDU bytes, header included).
    pub fn mean_rate_bps(&self) -> f64 {
        match *self {
            Profile::Cbr { rate_bps, .. } | Profile::Poisson { rate_bps, .. } => rate_bps,
            Profile::OnOff {
                on_s,
                off_s,
                rate_bps,
                ..
            } => rate_bps * on_s / (on_s + off_s),
            Profile::Voice {
                interval_s,
                talk_size,
                silence_size,
                talk_s,
                silence_s,
            } => {
                let mean = (talk_size as f64 * talk_s + silence_size as f64 * silence_s)
                    / (talk_s + silence_s);
                mean * 8.0 / interval_s
            }
            Profile::Varying {
                min_bps, max_bps, ..
            } => (min_bps + max_bps) / 2.0,
        }
    }

    /// The largest SDU the profile writes.
    pub fn max_size(&self) -> usize {
        match *self {
            Profile::Cbr { size, .. }
            | Profile::Poisson { size, .. }
            | Profile::OnOff { size, .. }
            | Profile::Varying { size, .. } => size,
            Profile::Voice {
                talk_size,
                silence_size,
                ..
            } => talk_size.max(silence_size),
        }
    }
}

/// One SDU of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    /// Send time, ns from the start of the flow.
    pub at_ns: u64,
    /// Size in bytes, header included.
    pub size: usize,
}

/// Totals of the ON/OFF (talk/silence, segment) periods drawn so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PeriodStats {
    /// ON (talk) periods begun.
    pub on_periods: u64,
    /// Their total length, s.
    pub on_total_s: f64,
    /// OFF (silence) periods begun.
    pub off_periods: u64,
    /// Their total length, s.
    pub off_total_s: f64,
}

/// The schedule of a profile: an endless iterator of [`Packet`]s in time order.
#[derive(Debug, Clone)]
pub struct Generator {
    profile: Profile,
    rng: ChaCha8Rng,
    /// Time of the next SDU, s.
    t: f64,
    /// End of the current ON / talk / segment period, s.
    period_end: f64,
    /// Talking (voice), or the current segment's gap (varying).
    talking: bool,
    gap_s: f64,
    stats: PeriodStats,
}

impl Generator {
    /// The schedule of `profile` drawn from `seed`.
    pub fn new(profile: Profile, seed: u64) -> Generator {
        let mut g = Generator {
            profile,
            rng: ChaCha8Rng::seed_from_u64(seed),
            t: 0.0,
            period_end: 0.0,
            talking: true,
            gap_s: 0.0,
            stats: PeriodStats::default(),
        };
        g.start();
        g
    }

    /// The profile.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// The periods drawn so far.
    pub fn period_stats(&self) -> PeriodStats {
        self.stats
    }

    /// An exponential draw of mean `mean` (inverse transform).
    fn exp(&mut self, mean: f64) -> f64 {
        let u: f64 = self.rng.gen(); // [0, 1)
        -mean * (1.0 - u).ln()
    }

    fn on(&mut self, mean: f64) -> f64 {
        let d = self.exp(mean);
        self.stats.on_periods += 1;
        self.stats.on_total_s += d;
        d
    }

    fn off(&mut self, mean: f64) -> f64 {
        let d = self.exp(mean);
        self.stats.off_periods += 1;
        self.stats.off_total_s += d;
        d
    }

    fn start(&mut self) {
        match self.profile.clone() {
            Profile::Cbr { .. } => {}
            Profile::Poisson { rate_bps, size } => {
                self.t = self.exp(size as f64 * 8.0 / rate_bps);
            }
            Profile::OnOff { on_s, .. } => self.period_end = self.on(on_s),
            Profile::Voice { talk_s, .. } => {
                self.talking = true;
                self.period_end = self.on(talk_s);
            }
            Profile::Varying { .. } => self.new_segment(0.0),
        }
    }

    /// Draws the rate of the segment that begins at `at`.
    fn new_segment(&mut self, at: f64) {
        if let Profile::Varying {
            min_bps,
            max_bps,
            segment_s,
            size,
        } = self.profile
        {
            let rate = min_bps + (max_bps - min_bps) * self.rng.gen::<f64>();
            self.period_end = at + segment_s;
            self.stats.on_periods += 1;
            self.stats.on_total_s += segment_s;
            if rate <= 0.0 {
                self.gap_s = f64::INFINITY;
            } else {
                self.gap_s = size as f64 * 8.0 / rate;
            }
        }
    }

    fn next_packet(&mut self) -> Packet {
        let (at, size) = match self.profile.clone() {
            Profile::Cbr { rate_bps, size } => {
                let at = self.t;
                self.t += size as f64 * 8.0 / rate_bps;
                (at, size)
            }
            Profile::Poisson { rate_bps, size } => {
                let at = self.t;
                self.t += self.exp(size as f64 * 8.0 / rate_bps);
                (at, size)
            }
            Profile::OnOff {
                on_s,
                off_s,
                rate_bps,
                size,
            } => {
                // The ON period holds SDUs at t, t + gap, ... while t < end.
                while self.t >= self.period_end {
                    let off_end = self.period_end + self.off(off_s);
                    self.t = off_end;
                    self.period_end = off_end + self.on(on_s);
                }
                let at = self.t;
                self.t += size as f64 * 8.0 / rate_bps;
                (at, size)
            }
            Profile::Voice {
                interval_s,
                talk_size,
                silence_size,
                talk_s,
                silence_s,
            } => {
                while self.t >= self.period_end {
                    self.talking = !self.talking;
                    let d = if self.talking {
                        self.on(talk_s)
                    } else {
                        self.off(silence_s)
                    };
                    self.period_end += d;
                }
                let at = self.t;
                self.t += interval_s;
                (
                    at,
                    if self.talking {
                        talk_size
                    } else {
                        silence_size
                    },
                )
            }
            Profile::Varying { size, .. } => {
                while self.t >= self.period_end {
                    let start = self.period_end;
                    self.new_segment(start);
                    self.t = start;
                }
                let at = self.t;
                self.t += self.gap_s;
                (at, size)
            }
        };
        Packet {
            at_ns: (at * 1e9).round() as u64,
            size,
        }
    }
}

impl Iterator for Generator {
    type Item = Packet;

    fn next(&mut self) -> Option<Packet> {
        Some(self.next_packet())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_schedule() {
        let p = Profile::named("interactive").unwrap();
        let a: Vec<_> = Generator::new(p.clone(), 7).take(1000).collect();
        let b: Vec<_> = Generator::new(p.clone(), 7).take(1000).collect();
        let c: Vec<_> = Generator::new(p, 8).take(1000).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn every_name_is_valid_and_overrides_apply() {
        for (n, _) in PROFILE_NAMES {
            Profile::named(n).unwrap().validate().unwrap();
        }
        let s = SourceSpec {
            profile: "cbr".into(),
            rate_bps: Some(2e6),
            size: Some(500),
            ..SourceSpec::default()
        };
        assert_eq!(
            s.profile().unwrap(),
            Profile::Cbr {
                rate_bps: 2e6,
                size: 500
            }
        );
        let bad = SourceSpec {
            profile: "cbr".into(),
            size: Some(10),
            ..SourceSpec::default()
        };
        assert!(bad.profile().is_err());
        assert!(Profile::named("nope").is_err());
        // ON and OFF periods apply to the sources that have them...
        for name in ["on-off", "voip", "voice"] {
            let s = SourceSpec {
                profile: name.into(),
                on_s: Some(2.0),
                off_s: Some(0.5),
                ..SourceSpec::default()
            };
            assert!(s.profile().is_ok(), "{name}");
        }
        // ...and to no other: named with the profile, not dropped.
        for (name, on, off, says) in [
            (
                "cbr",
                Some(2.0),
                None,
                "profile cbr has no ON and OFF periods, so on_s would",
            ),
            (
                "video-hd",
                None,
                Some(1.0),
                "profile video-hd has no ON and OFF periods, so off_s",
            ),
            (
                "poisson",
                Some(1.0),
                Some(1.0),
                "so on_s and off_s would change nothing",
            ),
        ] {
            let s = SourceSpec {
                profile: name.into(),
                on_s: on,
                off_s: off,
                ..SourceSpec::default()
            };
            let e = s.profile().unwrap_err();
            assert!(
                e.contains(says) && e.contains("online-gaming, voip, file-sharing, voice, on-off"),
                "{e}"
            );
            let e = s.profile_keyed(["--on-s", "--off-s"]).unwrap_err();
            assert!(e.contains("--o"), "{e}");
        }
    }

    #[test]
    fn schedules_are_in_time_order() {
        for (n, _) in PROFILE_NAMES {
            let g = Generator::new(Profile::named(n).unwrap(), 1);
            let v: Vec<_> = g.take(5000).collect();
            assert!(v.windows(2).all(|w| w[0].at_ns <= w[1].at_ns), "{n}");
        }
    }
}
