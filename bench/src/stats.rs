//! Summaries of repeated measurements: median, nearest-rank percentiles, spread.

/// Nearest-rank percentile (`p` in 0..=100) of `values`; None when empty.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    Some(if sorted.len().is_multiple_of(2) { (sorted[middle - 1] + sorted[middle]) / 2.0 } else { sorted[middle] })
}

/// (min, max) of `values`.
pub fn range(values: &[f64]) -> Option<(f64, f64)> {
    let min = values.iter().copied().min_by(f64::total_cmp)?;
    let max = values.iter().copied().max_by(f64::total_cmp)?;
    Some((min, max))
}

/// Ratio of medians, and its spread as the lowest and highest ratio of one round's pair.
pub struct Ratio {
    pub median: f64,
    pub low: f64,
    pub high: f64,
}

/// `with[i]` and `without[i]` come from round i (interleaved): each round's ratio, then their median.
pub fn paired_ratio(with: &[f64], without: &[f64]) -> Option<Ratio> {
    let ratios: Vec<f64> =
        with.iter().zip(without).filter(|(_, base)| **base > 0.0).map(|(value, base)| value / base).collect();
    let (low, high) = range(&ratios)?;
    Some(Ratio { median: median(&ratios)?, low, high })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let values: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&values, 50.0), Some(10.0));
        assert_eq!(percentile(&values, 95.0), Some(19.0));
        assert_eq!(percentile(&values, 99.0), Some(20.0));
        assert_eq!(percentile(&values, 0.0), Some(1.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn median_of_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
    }

    #[test]
    fn paired_ratio_pairs_rounds() {
        let ratio = paired_ratio(&[99.0, 95.0, 100.0], &[100.0, 100.0, 100.0]).unwrap();
        assert_eq!(ratio.median, 0.99);
        assert_eq!(ratio.low, 0.95);
        assert_eq!(ratio.high, 1.0);
        assert!(paired_ratio(&[], &[]).is_none());
    }
}
