//! Summary statistics of latency samples: min/avg/max/mdev and percentiles.

use serde::{Deserialize, Serialize};

/// Summary of a set of samples, in the samples' unit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Number of samples.
    pub count: usize,
    /// Smallest sample.
    pub min: f64,
    /// Mean.
    pub avg: f64,
    /// Largest sample.
    pub max: f64,
    /// Standard deviation (what `ping` calls mdev).
    pub mdev: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Summary {
    /// Summarises `samples`; `None` if there are none (or only NaNs).
    pub fn of(samples: &[f64]) -> Option<Summary> {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len() as f64;
        let avg = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n;
        Some(Summary {
            count: v.len(),
            min: v[0],
            avg,
            max: v[v.len() - 1],
            mdev: var.sqrt(),
            p50: percentile(&v, 50.0),
            p90: percentile(&v, 90.0),
            p99: percentile(&v, 99.0),
        })
    }

    /// The same summary with every value multiplied by `k` (unit change).
    pub fn scaled(&self, k: f64) -> Summary {
        Summary {
            count: self.count,
            min: self.min * k,
            avg: self.avg * k,
            max: self.max * k,
            mdev: self.mdev * k,
            p50: self.p50 * k,
            p90: self.p90 * k,
            p99: self.p99 * k,
        }
    }
}

/// The `p`-th percentile (0..=100) of sorted, non-empty `sorted`, by linear
/// interpolation between closest ranks. Returns NaN for an empty slice.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let rank = (p.clamp(0.0, 100.0) / 100.0) * (n - 1) as f64;
            let lo = rank.floor() as usize;
            let hi = rank.ceil() as usize;
            let frac = rank - lo as f64;
            sorted[lo] + (sorted[hi] - sorted[lo]) * frac
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_none() {
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[f64::NAN]).is_none());
    }

    #[test]
    fn one_sample() {
        let s = Summary::of(&[3.0]).unwrap();
        assert_eq!((s.min, s.avg, s.max, s.mdev), (3.0, 3.0, 3.0, 0.0));
        assert_eq!((s.p50, s.p90, s.p99), (3.0, 3.0, 3.0));
    }

    #[test]
    fn known_values() {
        // 1..=100, shuffled order does not matter.
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        v.reverse();
        let s = Summary::of(&v).unwrap();
        assert_eq!(s.count, 100);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 100.0);
        assert!((s.avg - 50.5).abs() < 1e-9);
        assert!((s.p50 - 50.5).abs() < 1e-9);
        assert!((s.p90 - 90.1).abs() < 1e-9);
        assert!((s.p99 - 99.01).abs() < 1e-9);
        // Population standard deviation of 1..=100.
        assert!((s.mdev - 28.866_070_047_722_12).abs() < 1e-9);
    }

    #[test]
    fn percentile_bounds() {
        let v = [1.0, 2.0, 4.0];
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert_eq!(percentile(&v, 100.0), 4.0);
        assert_eq!(percentile(&v, 75.0), 3.0);
        assert_eq!(percentile(&v, 150.0), 4.0);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn scaled_changes_units() {
        let s = Summary::of(&[1000.0, 3000.0]).unwrap().scaled(1e-3);
        assert!((s.avg - 2.0).abs() < 1e-12);
        assert_eq!(s.count, 2);
    }
}
