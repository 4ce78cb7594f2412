//! `likelihood`: how unusual a score's recent average is against that score's own long-term
//! distribution (the anomaly likelihood of Ahmad et al., "Unsupervised real-time anomaly
//! detection for streaming data", 2017).
//!
//! The mean of the last `short` scores is compared with the mean and standard deviation of such
//! means over about the last `long` of them (exponentially weighted, so the state is a few
//! numbers); the result is the normal CDF of its z-score. A detector that is often a little
//! anomalous is judged against itself: only a run of scores unusual *for it* comes near 1.

use std::collections::VecDeque;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Likelihood {
    short: usize,
    long: usize,
    warmup: usize,
    recent: VecDeque<f64>,
    seen: u64,
    /// The long-term mean and variance of the short-term mean.
    pub mean: f64,
    variance: f64,
    /// The short-term mean last judged, and the deviation it was judged with.
    pub recent_mean: f64,
    pub deviation: f64,
}

/// The smallest standard deviation a score's history is given: without it, a detector that has
/// said exactly 0 for days would make any small score certain.
const MIN_DEVIATION: f64 = 1e-3;

impl Likelihood {
    pub fn new(short: usize, long: usize, warmup: usize) -> Self {
        Likelihood {
            short: short.max(1),
            long: long.max(2),
            warmup: warmup.max(2),
            recent: VecDeque::with_capacity(short),
            seen: 0,
            mean: 0.0,
            variance: 0.0,
            recent_mean: f64::NAN,
            deviation: f64::NAN,
        }
    }

    pub fn update(&mut self, score: f64) -> Option<f64> {
        self.recent.push_back(score);
        if self.recent.len() > self.short {
            self.recent.pop_front();
        }
        // Summed afresh (`short` is small), so no running sum can overflow or drift for good.
        let avg = self.recent.iter().sum::<f64>() / self.recent.len() as f64;
        if !avg.is_finite() {
            // Scores so large that their mean overflows are not judged, and not learned from.
            return None;
        }
        let out = (self.seen >= self.warmup as u64).then(|| {
            self.recent_mean = avg;
            self.deviation = self.variance.sqrt().max(MIN_DEVIATION);
            normal_cdf((avg - self.mean) / self.deviation)
        });
        let seen = self.seen + 1;
        let a = 1.0 / (seen.min(self.long as u64)) as f64;
        let delta = avg - self.mean;
        let (mean, variance) = (self.mean + a * delta, (1.0 - a) * (self.variance + a * delta * delta));
        if mean.is_finite() && variance.is_finite() {
            (self.seen, self.mean, self.variance) = (seen, mean, variance);
        }
        out
    }

    pub fn bytes(&self) -> usize {
        super::heap(&self.recent)
    }
}

/// The standard normal CDF.
pub fn normal_cdf(z: f64) -> f64 {
    0.5 * statrs::function::erf::erfc(-z / std::f64::consts::SQRT_2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_normal_cdf_by_table() {
        assert!((normal_cdf(0.0) - 0.5).abs() < 1e-15);
        assert!((normal_cdf(1.96) - 0.975_002).abs() < 1e-6);
        assert!((normal_cdf(-3.0) - 0.001_349_9).abs() < 1e-7);
    }

    #[test]
    fn weights_and_judgement_by_hand() {
        // short 1, long 2: means 1, then 3 (weights 1, then 1/2 each).
        let mut l = Likelihood::new(1, 2, 2);
        assert_eq!(l.update(1.0), None);
        assert_eq!((l.mean, l.variance), (1.0, 0.0));
        assert_eq!(l.update(3.0), None);
        // a = 1/2: mean 1 + 1 = 2, variance 1/2 (0 + 1/2 * 4) = 1.
        assert_eq!((l.mean, l.variance), (2.0, 1.0));
        // 4 is 2 deviations above 2.
        let got = l.update(4.0).expect("judged");
        assert!((got - normal_cdf(2.0)).abs() < 1e-12);
    }

    #[test]
    fn a_run_of_unusual_scores_is_likely_anomalous_and_one_alone_less() {
        let mut l = Likelihood::new(5, 500, 100);
        let mut state = 3u64;
        for _ in 0..1000 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            l.update((state >> 11) as f64 / (1u64 << 53) as f64);
        }
        // Uniform scores: the mean of five has a deviation of about 0.13. One 0.9 moves it by
        // about 0.08; five move it to 0.9, three deviations up.
        let one = l.update(0.9).expect("judged");
        let mut run = one;
        for _ in 0..4 {
            run = l.update(0.9).expect("judged");
        }
        assert!(one < 0.99 && run > 0.99, "{one} then {run}");
    }
}
