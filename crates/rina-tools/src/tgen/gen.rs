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

/// Largest SDU a profile may write, bytes (1 MiB, as rina-lab allows; no
/// DIF carries more than 65,536, and a server refuses a source larger than
/// its flow's maximum SDU).
pub const MAX_SIZE: usize = 1 << 20;

/// Highest rate a profile may ask for, bit/s (1 Tb/s, rinad's fastest
/// link): a faster source's gaps fall below the schedule's resolution.
pub const MAX_RATE_BPS: f64 = 1e12;

/// Shortest period or interval of a profile (ON and OFF, talk and
/// silence, voice's SDU interval, a varying rate's segment), s: 1 µs.
pub const MIN_PERIOD_S: f64 = 1e-6;

/// Longest period or interval of a profile, s: [`crate::opts::MAX_SECONDS`].
pub const MAX_PERIOD_S: f64 = crate::opts::MAX_SECONDS;

/// Most ON/OFF (talk/silence) periods a voice schedule draws for one SDU:
/// beyond it, the SDU's period is drawn afresh (see [`Generator`]).
const MAX_PERIODS_PER_SDU: u32 = 10_000;

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
            if !(r > 0.0 && r <= MAX_RATE_BPS) {
                return Err(format!(
                    "voice rate {} bit/s is not a rate: it must be above 0 and at most \
                     {MAX_RATE_BPS:e} bit/s",
                    num(r)
                ));
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

/// Checks a rate in bit/s, named `what` in the error.
fn check_rate(x: f64, what: &str) -> Result<(), String> {
    if x.is_finite() && x > 0.0 && x <= MAX_RATE_BPS {
        Ok(())
    } else {
        Err(format!(
            "{what} {} bit/s is not a rate: it must be above 0 and at most {MAX_RATE_BPS:e} bit/s",
            num(x)
        ))
    }
}

/// Checks a period in s, named `what` in the error.
fn check_period(x: f64, what: &str) -> Result<(), String> {
    if x.is_finite() && (MIN_PERIOD_S..=MAX_PERIOD_S).contains(&x) {
        Ok(())
    } else {
        Err(format!(
            "{what} {} s is not a period: it must be from {MIN_PERIOD_S:e} s (1 µs) to \
             {MAX_PERIOD_S:e} s",
            num(x)
        ))
    }
}

/// Checks an SDU size in bytes.
fn check_size(s: usize) -> Result<(), String> {
    if s < HEADER_LEN {
        Err(format!(
            "SDU size {s} is less than the {HEADER_LEN}-byte header"
        ))
    } else if s > MAX_SIZE {
        Err(format!(
            "SDU size {s} is more than {MAX_SIZE} bytes (1 MiB)"
        ))
    } else {
        Ok(())
    }
}

/// A rate override for clap (`--rate-bps`): above 0, at most
/// [`MAX_RATE_BPS`].
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let x: f64 = s.parse().map_err(|e| format!("{e}"))?;
    check_rate(x, "rate").map(|()| x)
}

/// A period override for clap (`--on-s`, `--off-s`): [`MIN_PERIOD_S`] to
/// [`MAX_PERIOD_S`].
pub fn parse_period(s: &str) -> Result<f64, String> {
    let x: f64 = s.parse().map_err(|e| format!("{e}"))?;
    check_period(x, "period").map(|()| x)
}

/// A size override for clap (`--size`): [`HEADER_LEN`] to [`MAX_SIZE`].
pub fn parse_size(s: &str) -> Result<usize, String> {
    let x: usize = s.parse().map_err(|e| format!("{e}"))?;
    check_size(x).map(|()| x)
}

/// `x` as written in an error: in exponent notation when very large or
/// small (`1e300`, not three hundred digits).
fn num(x: f64) -> String {
    if x != 0.0 && x.is_finite() && !(1e-4..1e15).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
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

    /// Checks that rates, periods and sizes make sense: rates above 0 and
    /// at most [`MAX_RATE_BPS`], periods and intervals from
    /// [`MIN_PERIOD_S`] to [`MAX_PERIOD_S`], sizes from the header's
    /// [`HEADER_LEN`] bytes to [`MAX_SIZE`].
    pub fn validate(&self) -> Result<(), String> {
        let (rate, period, size) = (check_rate, check_period, check_size);
        match *self {
            Profile::Cbr { rate_bps, size: s } | Profile::Poisson { rate_bps, size: s } => {
                rate(rate_bps, "rate")?;
                size(s)
            }
            Profile::OnOff {
                on_s,
                off_s,
                rate_bps,
                size: s,
            } => {
                period(on_s, "ON mean")?;
                period(off_s, "OFF mean")?;
                rate(rate_bps, "rate")?;
                size(s)
            }
            Profile::Voice {
                interval_s,
                talk_size,
                silence_size,
                talk_s,
                silence_s,
            } => {
                period(interval_s, "SDU interval (voice's rate sets it)")?;
                period(talk_s, "talk mean")?;
                period(silence_s, "silence mean")?;
                size(talk_size)?;
                size(silence_size)
            }
            Profile::Varying {
                min_bps,
                max_bps,
                segment_s,
                size: s,
            } => {
                rate(max_bps, "maximum rate")?;
                period(segment_s, "segment")?;
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
            self.period_end = after(at, segment_s);
            self.stats.on_periods += 1;
            self.stats.on_total_s += segment_s;
            if rate <= 0.0 {
                self.gap_s = f64::INFINITY;
            } else {
                self.gap_s = size as f64 * 8.0 / rate;
            }
        }
    }

    /// Draws talk and silence periods until the one that holds the next
    /// SDU (at `t`): at most [`MAX_PERIODS_PER_SDU`] of them. An SDU further
    /// away than that (an SDU interval many times the periods) falls in a
    /// period drawn afresh at `t`: talk with probability
    /// `talk_s / (talk_s + silence_s)` and of an exponential length of that
    /// period's mean, which is where the alternation stands by then (the
    /// periods are exponential, so without memory).
    fn voice_period(&mut self, talk_s: f64, silence_s: f64) {
        let mut drawn = 0;
        while self.t >= self.period_end {
            if drawn == MAX_PERIODS_PER_SDU {
                self.talking = self.rng.gen::<f64>() < talk_s / (talk_s + silence_s);
                let d = if self.talking {
                    self.on(talk_s)
                } else {
                    self.off(silence_s)
                };
                self.period_end = after(self.t, d);
                return;
            }
            self.talking = !self.talking;
            let d = if self.talking {
                self.on(talk_s)
            } else {
                self.off(silence_s)
            };
            self.period_end = after(self.period_end, d);
            drawn += 1;
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
                // It ends after it begins, however short the draw: one
                // round of the loop.
                while self.t >= self.period_end {
                    let off_end = self.period_end + self.off(off_s);
                    self.t = off_end;
                    self.period_end = after(off_end, self.on(on_s));
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
                self.voice_period(talk_s, silence_s);
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

/// `x + d` for a period of `d` s from `x` (0 or more), or the next number
/// above `x` if `d` is too short to move it (below half its resolution): a
/// period that ends where it began would hold a schedule's loop for ever.
fn after(x: f64, d: f64) -> f64 {
    let y = x + d;
    if y > x || !x.is_finite() || x < 0.0 {
        y
    } else {
        f64::from_bits(x.to_bits() + 1)
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
    fn overrides_out_of_range_are_refused_as_options() {
        assert_eq!(parse_rate("1e12"), Ok(1e12));
        for bad in ["0", "-1", "nan", "inf", "1e300", "x"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
        assert!(parse_rate("1e300")
            .unwrap_err()
            .contains("rate 1e300 bit/s is not a rate"));
        assert_eq!(parse_period("1e-6"), Ok(1e-6));
        for bad in ["0", "1e-300", "2e9", "nan", "x"] {
            assert!(parse_period(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_size("28"), Ok(28));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        for bad in ["27", "1048577", "1099511627776", "-1"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes_rates_and_periods_out_of_range_are_refused() {
        let spec = |json: &str| serde_json::from_str::<SourceSpec>(json).unwrap().profile();
        // A peer's HELLO asked a server for 1 TiB SDUs, and it allocated them.
        let e = spec(r#"{"profile":"cbr","size":1099511627776}"#).unwrap_err();
        assert!(
            e.contains("SDU size 1099511627776 is more than 1048576 bytes"),
            "{e}"
        );
        assert!(spec(&format!(r#"{{"profile":"cbr","size":{MAX_SIZE}}}"#)).is_ok());
        assert!(spec(&format!(r#"{{"profile":"voice","size":{}}}"#, MAX_SIZE + 1)).is_err());
        // A rate whose gaps fall below the schedule's resolution.
        let e = spec(r#"{"profile":"cbr","rate_bps":1e300}"#).unwrap_err();
        assert!(e.contains("rate 1e300 bit/s is not a rate"), "{e}");
        assert!(spec(r#"{"profile":"poisson","rate_bps":1e12}"#).is_ok());
        assert!(spec(r#"{"profile":"p2p","rate_bps":2e12}"#).is_err());
        // Periods below a microsecond held the schedule's loops for ever.
        let e = spec(r#"{"profile":"on-off","on_s":1e-300}"#).unwrap_err();
        assert!(e.contains("ON mean 1e-300 s is not a period"), "{e}");
        let e = spec(r#"{"profile":"voice","on_s":1e-300,"off_s":1e-300}"#).unwrap_err();
        assert!(e.contains("talk mean 1e-300 s"), "{e}");
        assert!(spec(r#"{"profile":"voip","off_s":2e9}"#).is_err());
        assert!(spec(r#"{"profile":"voip","on_s":1e-6,"off_s":1e9}"#).is_ok());
        // Voice's rate sets its SDU interval: too fast, too short.
        let e = spec(r#"{"profile":"voice","rate_bps":1e12}"#).unwrap_err();
        assert!(e.contains("SDU interval (voice's rate sets it)"), "{e}");
        let e = spec(r#"{"profile":"voice","rate_bps":2e12}"#).unwrap_err();
        assert!(
            e.contains("voice rate 2000000000000 bit/s is not a rate"),
            "{e}"
        );
    }

    /// What `f` returns, or `None` if it took more than 10 s (a loop that
    /// no longer moved on).
    fn within<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(10)).ok()
    }

    /// The first `n` packets of `p`'s schedule, if they come within 10 s.
    fn first(p: Profile, n: usize) -> Option<Vec<Packet>> {
        within(move || Generator::new(p, 1).take(n).collect())
    }

    #[test]
    fn periods_below_the_clocks_resolution_do_not_hold_the_schedule() {
        // Not what validate lets through, but what a Generator may be given:
        // its loops move on however short the periods.
        let on_off = Profile::OnOff {
            on_s: 1e-300,
            off_s: 1.0,
            rate_bps: 1e6,
            size: 100,
        };
        let v = first(on_off, 50).expect("ON-OFF schedule hangs");
        assert!(v.windows(2).all(|w| w[0].at_ns <= w[1].at_ns));
        assert!(v[49].at_ns > 10_000_000_000, "{:?}", v[49]);
        let voice = Profile::Voice {
            interval_s: 0.02,
            talk_size: 200,
            silence_size: 40,
            talk_s: 1e-300,
            silence_s: 1e-300,
        };
        let v = first(voice, 50).expect("voice schedule hangs");
        assert_eq!(v[49].at_ns, 980_000_000);
        let varying = Profile::Varying {
            min_bps: 1e6,
            max_bps: 2e6,
            segment_s: 1e-300,
            size: 100,
        };
        assert!(first(varying, 50).is_some(), "varying schedule hangs");
    }

    #[test]
    fn a_voice_interval_far_beyond_its_periods_draws_a_bounded_number() {
        // Valid, and 10^12 talk and silence periods between two SDUs.
        let p = Profile::Voice {
            interval_s: 1e6,
            talk_size: 200,
            silence_size: 40,
            talk_s: 1e-6,
            silence_s: 1e-6,
        };
        p.validate().unwrap();
        let (v, st) = within(move || {
            let mut g = Generator::new(p, 3);
            let v: Vec<Packet> = g.by_ref().take(200).collect();
            (v, g.period_stats())
        })
        .expect("voice schedule hangs");
        assert_eq!(v[199].at_ns, 199 * 1_000_000_000_000_000);
        let periods = st.on_periods + st.off_periods;
        let most = 200 * (u64::from(MAX_PERIODS_PER_SDU) + 1);
        assert!(periods <= most, "{periods}");
        // Drawn afresh, an SDU talks about half the time (equal means).
        let talking = v.iter().filter(|p| p.size == 200).count();
        assert!((60..=140).contains(&talking), "{talking}");
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
