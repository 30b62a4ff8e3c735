//! The intervals EVALUATION.md gives with every figure: Wilson score intervals for rates, a
//! percentile bootstrap for p95s, and an exact Poisson bound for false incidents per hour.

use dm_lab::soak::Rng;

use super::assess::percentile;

/// The standard normal quantile of 97.5 %: a two-sided 95 % interval.
const Z_95: f64 = 1.959_963_984_540_054;
/// Resamples of a bootstrap interval.
pub const BOOTSTRAP_RESAMPLES: usize = 2000;

/// The 95 % Wilson score interval of `successes` in `trials`; None when there are no trials.
/// Unlike the normal approximation it stays inside [0, 1] and is not empty at 0 % or 100 %.
pub fn wilson(successes: usize, trials: usize) -> Option<(f64, f64)> {
    if trials == 0 {
        return None;
    }
    let n = trials as f64;
    let p = successes.min(trials) as f64 / n;
    let z2 = Z_95 * Z_95;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = Z_95 / (1.0 + z2 / n) * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    // At 0 % and 100 % the bound is exactly 0 or 1; rounding would leave it just inside.
    let low = if successes == 0 { 0.0 } else { (centre - half).max(0.0) };
    let high = if successes >= trials { 1.0 } else { (centre + half).min(1.0) };
    Some((low, high))
}

/// A 95 % percentile-bootstrap interval of the nearest-rank `p`-th percentile of `values`:
/// [`BOOTSTRAP_RESAMPLES`] resamples with replacement, drawn from `seed` (the same values and
/// seed give the same interval). None when `values` is empty.
pub fn bootstrap_percentile(values: &[f64], p: f64, seed: u64) -> Option<(f64, f64)> {
    if values.is_empty() {
        return None;
    }
    let mut rng = Rng::from_seed(seed);
    let mut resample = vec![0.0; values.len()];
    let estimates: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
        .filter_map(|_| {
            for slot in resample.iter_mut() {
                *slot = values[rng.range(0, values.len() as u64 - 1) as usize];
            }
            percentile(&resample, p)
        })
        .collect();
    Some((percentile(&estimates, 2.5)?, percentile(&estimates, 97.5)?))
}

/// The exact one-sided 95 % upper bound on a Poisson rate per hour, having seen `events` in
/// `hours`: the λ with P(X ≤ events | λ) = 5 %, over the hours (3.0/h for none in one hour, the
/// "rule of three"). None for no exposure.
pub fn poisson_upper_per_hour(events: u64, hours: f64) -> Option<f64> {
    if !(hours > 0.0 && hours.is_finite()) {
        return None;
    }
    let cdf = |lambda: f64| {
        // P(X ≤ k) = e^-λ Σ λ^i / i!, summed in a way that does not overflow.
        let mut term = (-lambda).exp();
        let mut sum = term;
        for i in 1..=events {
            term *= lambda / i as f64;
            sum += term;
        }
        sum
    };
    let (mut low, mut high) = (0.0_f64, 10.0 + 10.0 * events as f64);
    for _ in 0..200 {
        let middle = (low + high) / 2.0;
        if cdf(middle) > 0.05 { low = middle } else { high = middle }
    }
    Some(high / hours)
}

/// `[0.72, 1.00]`-style text of an interval of rates, as percentages; `—` for None.
pub fn rate_interval(interval: Option<(f64, f64)>) -> String {
    interval.map_or_else(|| "—".to_string(), |(low, high)| format!("[{:.0} %, {:.0} %]", low * 100.0, high * 100.0))
}

/// `[0.21 s, 0.64 s]`-style text; `—` for None.
pub fn seconds_interval(interval: Option<(f64, f64)>) -> String {
    interval.map_or_else(|| "—".to_string(), |(low, high)| format!("[{low:.2} s, {high:.2} s]"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tolerance: f64) -> bool {
        (a - b).abs() <= tolerance
    }

    #[test]
    fn wilson_intervals_match_published_values() {
        // Reference values: Newcombe (1998), table I, and R's prop.test(correct = FALSE).
        let (low, high) = wilson(0, 10).unwrap();
        assert!(low == 0.0 && close(high, 0.2775, 5e-4), "{low} {high}");
        let (low, high) = wilson(10, 10).unwrap();
        assert!(close(low, 0.7225, 5e-4) && high == 1.0, "{low} {high}");
        let (low, high) = wilson(81, 263).unwrap();
        assert!(close(low, 0.2553, 5e-4) && close(high, 0.3662, 5e-4), "{low} {high}");
        let (low, high) = wilson(15, 148).unwrap();
        assert!(close(low, 0.0624, 5e-4) && close(high, 0.1605, 5e-4), "{low} {high}");
        assert_eq!(wilson(3, 0), None);
    }

    #[test]
    fn poisson_bounds_are_the_exact_ones() {
        // Garwood's exact upper limits at 95 % one-sided: 2.996, 4.744, 6.296, 16.96 (k = 10).
        for (events, bound) in [(0, 2.9957), (1, 4.7439), (2, 6.2958), (10, 16.9622)] {
            let got = poisson_upper_per_hour(events, 1.0).unwrap();
            assert!(close(got, bound, 1e-3), "{events}: {got}");
        }
        // Half an hour of nothing: under 6 per hour.
        assert!(close(poisson_upper_per_hour(0, 0.5).unwrap(), 5.9915, 1e-3));
        assert_eq!(poisson_upper_per_hour(0, 0.0), None);
    }

    #[test]
    fn bootstrap_intervals_hold_the_estimate_and_replay() {
        let values: Vec<f64> = (1..=40).map(|i| f64::from(i) / 40.0).collect();
        let (low, high) = bootstrap_percentile(&values, 95.0, 7).unwrap();
        let p95 = percentile(&values, 95.0).unwrap();
        assert!(low <= p95 && p95 <= high && high <= 1.0 && low >= 0.8, "{low} {p95} {high}");
        assert_eq!(bootstrap_percentile(&values, 95.0, 7), Some((low, high)));
        // One value: no spread at all.
        assert_eq!(bootstrap_percentile(&[0.4], 95.0, 1), Some((0.4, 0.4)));
        assert_eq!(bootstrap_percentile(&[], 95.0, 1), None);
        assert_eq!(rate_interval(Some((0.7225, 1.0))), "[72 %, 100 %]");
        assert_eq!(seconds_interval(None), "—");
    }
}
