//! `shift`: whether the distribution of the recent values is one the series has shown before
//! (relative entropy against remembered distributions, after Wang et al., "Statistical
//! techniques for online anomaly detection in data centers", 2011).
//!
//! Values fall into `bins` bins, cut at the quantiles of the first `warmup` values (values out of
//! their range go to the outer bins). The last `window` values make a histogram P. The series
//! remembers up to 16 distributions, each with how many times it was seen. The statistic is
//! 2 W KL(P ‖ Q) for the closest remembered Q seen at least `window` times; under "P comes from
//! Q" it is chi-square with bins − 1 degrees of freedom, and the score is its CDF: near 1 when
//! the recent window is unlike every distribution the series has settled in. Then P is counted
//! with the closest Q when the test at 1% accepts it, or remembered as a new distribution.

use std::collections::VecDeque;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Shift {
    window: usize,
    bins: usize,
    warmup: usize,
    /// The first values, until the bins are cut.
    learning: Vec<f64>,
    /// Upper edges of all but the last bin.
    edges: Vec<f64>,
    recent: VecDeque<u8>,
    counts: Vec<u32>,
    /// Remembered distributions and how many windows matched each.
    known: Vec<(Vec<f64>, u64)>,
    /// The chi-square value that accepts a match at 1%.
    accept: f64,
    /// The last window's smallest divergence from a settled distribution, as 2 W KL.
    pub statistic: f64,
}

const MAX_KNOWN: usize = 16;

impl Shift {
    pub fn new(window: usize, bins: usize, warmup: usize) -> Self {
        let bins = bins.clamp(2, 64);
        let window = window.max(bins);
        Shift {
            window,
            bins,
            warmup: warmup.max(bins),
            learning: Vec::new(),
            edges: Vec::new(),
            recent: VecDeque::with_capacity(window),
            counts: vec![0; bins],
            known: Vec::new(),
            accept: chi2_quantile(0.99, (bins - 1) as f64),
            statistic: f64::NAN,
        }
    }

    pub fn update(&mut self, x: f64) -> Option<f64> {
        if self.edges.is_empty() {
            self.learning.push(x);
            if self.learning.len() < self.warmup {
                return None;
            }
            let mut sorted = std::mem::take(&mut self.learning);
            sorted.sort_by(f64::total_cmp);
            self.edges = (1..self.bins).map(|i| sorted[i * (sorted.len() - 1) / self.bins]).collect();
            return None;
        }
        let bin = self.edges.partition_point(|e| *e < x) as u8;
        self.recent.push_back(bin);
        self.counts[bin as usize] += 1;
        if self.recent.len() > self.window {
            if let Some(old) = self.recent.pop_front() {
                self.counts[old as usize] -= 1;
            }
        }
        if self.recent.len() < self.window {
            return None;
        }
        let n = self.window as f64;
        let p: Vec<f64> = self.counts.iter().map(|c| *c as f64 / n).collect();
        let divergence = |q: &[f64]| 2.0 * n * relative_entropy(&p, q, n);
        let settled = self.window as u64;
        let out = self
            .known
            .iter()
            .filter(|(_, seen)| *seen >= settled)
            .map(|(q, _)| divergence(q))
            .min_by(f64::total_cmp)
            .map(|stat| {
                self.statistic = stat;
                chi2_cdf(stat, (self.bins - 1) as f64)
            });
        let closest =
            self.known.iter().enumerate().map(|(i, (q, _))| (i, divergence(q))).min_by(|a, b| a.1.total_cmp(&b.1));
        match closest {
            Some((i, stat)) if stat <= self.accept => {
                // The distribution follows what it matches, the recent more for a young one.
                let (q, seen) = &mut self.known[i];
                *seen += 1;
                let weight = 1.0 / (*seen).min(self.window as u64 * 4) as f64;
                for (qi, pi) in q.iter_mut().zip(&p) {
                    *qi += weight * (pi - *qi);
                }
            }
            _ => {
                if self.known.len() == MAX_KNOWN {
                    // The least seen goes.
                    if let Some(i) = (0..self.known.len()).min_by_key(|&i| self.known[i].1) {
                        self.known.swap_remove(i);
                    }
                }
                self.known.push((p, 1));
            }
        }
        out
    }

    pub fn bytes(&self) -> usize {
        super::heap(&self.learning)
            + super::heap(&self.edges)
            + super::heap(&self.recent)
            + super::heap(&self.counts)
            + super::heap(&self.known)
            + self.known.iter().map(|(d, _)| super::heap(d)).sum::<usize>()
    }
}

/// KL(P ‖ Q) in nats, where a bin Q has (almost) never seen counts as half a value in `n`, so
/// that it costs much but not infinitely; equal distributions are 0 apart.
fn relative_entropy(p: &[f64], q: &[f64], n: f64) -> f64 {
    let floor = 0.5 / n;
    p.iter().zip(q).filter(|(pi, _)| **pi > 0.0).map(|(pi, qi)| pi * (pi / qi.max(floor)).ln()).sum::<f64>().max(0.0)
}

/// The chi-square CDF at `x` with `k` degrees of freedom (1 past any finite bound).
fn chi2_cdf(x: f64, k: f64) -> f64 {
    if x.is_nan() || x <= 0.0 {
        return 0.0;
    }
    statrs::function::gamma::checked_gamma_lr(k / 2.0, x / 2.0).unwrap_or(1.0)
}

/// The chi-square quantile at `p` with `k` degrees of freedom, by bisection on its CDF.
fn chi2_quantile(p: f64, k: f64) -> f64 {
    let (mut lo, mut hi) = (0.0, 1000.0);
    for _ in 0..100 {
        let mid = (lo + hi) / 2.0;
        if chi2_cdf(mid, k) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo + hi) / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_acceptance_bound_is_the_chi_square_quantile() {
        // Tables: chi-square 0.99 quantiles for 1 and 4 degrees of freedom.
        assert!((chi2_quantile(0.99, 1.0) - 6.635).abs() < 1e-3);
        assert!((chi2_quantile(0.99, 4.0) - 13.277).abs() < 1e-3);
    }

    #[test]
    fn relative_entropy_by_hand() {
        // P = (1/2, 1/2) against Q = (1/2, 1/2): 0. Against (1, 0) with the empty bin at half a
        // value in n = 10: KL = 1/2 ln(1/2) + 1/2 ln(1/2 / (1/20)) = 1/2 ln(5).
        assert_eq!(relative_entropy(&[0.5, 0.5], &[0.5, 0.5], 10.0), 0.0);
        let kl = relative_entropy(&[0.5, 0.5], &[1.0, 0.0], 10.0);
        assert!((kl - 0.5 * 5.0f64.ln()).abs() < 1e-12, "{kl}");
    }

    #[test]
    fn a_new_distribution_scores_high_until_it_has_settled() {
        let mut s = Shift::new(20, 4, 40);
        let mut state = 1u64;
        let mut noise = move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut last = 0.0;
        for _ in 0..400 {
            last = s.update(noise()).unwrap_or(0.0);
        }
        assert!(last < 0.99, "the usual distribution is settled: {last}");
        // Values far above the learned range all fall in the top bin: a new distribution.
        let shifted: Vec<f64> = (0..20).filter_map(|_| s.update(10.0 + noise())).collect();
        assert!(shifted.last().copied().unwrap_or(0.0) > 0.999, "{shifted:?}");
        // Seen for long enough, it is a distribution the series has.
        let later: Vec<f64> = (0..200).filter_map(|_| s.update(10.0 + noise())).collect();
        assert!(later.last().copied().unwrap_or(1.0) < 0.5, "{:?}", &later[later.len() - 5..]);
    }
}
