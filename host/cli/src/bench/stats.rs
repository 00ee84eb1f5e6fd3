//! Summaries of repeated measurements: median and range, the numbers every table reports.

use serde::{Deserialize, Serialize};

/// Median, minimum and maximum of a set of repeats (same unit as the samples).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Middle value (mean of the two middle values for an even count).
    pub median: f64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// Number of samples.
    pub n: usize,
}

impl Summary {
    /// Summarises `samples`; `None` when empty or when any sample is not finite (a broken
    /// measurement must not turn into a plausible-looking number).
    pub fn of(samples: &[f64]) -> Option<Self> {
        if samples.is_empty() || samples.iter().any(|s| !s.is_finite()) {
            return None;
        }
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) };
        Some(Self { median, min: v[0], max: v[n - 1], n })
    }

    /// The same summary with every value multiplied by `factor` (unit changes).
    pub fn scaled(self, factor: f64) -> Self {
        Self { median: self.median * factor, min: self.min * factor, max: self.max * factor, n: self.n }
    }

    /// `median [min-max]` with `prec` decimals, the table's cell format.
    pub fn cell(&self, prec: usize) -> String {
        format!("{:.prec$} [{:.prec$}-{:.prec$}]", self.median, self.min, self.max)
    }
}

/// Nanoseconds of simulated time per day for a step of `step_seconds` at a `dt_fs` femtosecond
/// time step: `86400 / step_seconds` steps a day, `dt_fs * 1e-6` ns each.
pub fn ns_per_day(step_seconds: f64, dt_fs: f64) -> f64 {
    if step_seconds <= 0.0 || !step_seconds.is_finite() {
        return f64::NAN;
    }
    86_400.0 / step_seconds * dt_fs * 1e-6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_and_even_counts() {
        let s = Summary::of(&[5.0, 1.0, 3.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (3.0, 1.0, 5.0, 3));
        let s = Summary::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.5, 1.0, 4.0, 4));
        let s = Summary::of(&[7.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (7.0, 7.0, 7.0));
    }

    #[test]
    fn empty_or_broken_samples_give_nothing() {
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[1.0, f64::NAN]).is_none());
        assert!(Summary::of(&[f64::INFINITY]).is_none());
    }

    #[test]
    fn scaling_and_cells() {
        let s = Summary::of(&[1e-6, 2e-6, 3e-6]).unwrap().scaled(1e6);
        assert!((s.median - 2.0).abs() < 1e-9);
        assert_eq!(s.cell(1), "2.0 [1.0-3.0]");
    }

    #[test]
    fn ns_per_day_at_2fs() {
        // 1 ms per step: 8.64e7 steps a day of 2e-6 ns = 172.8 ns/day.
        assert!((ns_per_day(1e-3, 2.0) - 172.8).abs() < 1e-9);
        // 10 us per step: 8.64e9 steps a day * 2e-6 ns = 17 280 ns/day.
        assert!((ns_per_day(10e-6, 2.0) - 17_280.0).abs() < 1e-6);
        assert!(ns_per_day(0.0, 2.0).is_nan());
    }
}
