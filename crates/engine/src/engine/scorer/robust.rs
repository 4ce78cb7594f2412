//! `robust_z`: how far a value is from the median of the series' recent values, in robust
//! standard deviations (1.4826 median absolute deviations).

use super::history::History;

/// The recent values' order: their positions in the series' history, sorted by value, so that
/// the median is read in place and the median absolute deviation costs a bisection. The values
/// themselves are the history's, shared with the rule's other scorers of the same input.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RobustZ {
    window: usize,
    warmup: usize,
    /// Sequence numbers in the history (modulo 2^16: windows are at most 4,096) of the last
    /// `window` values, in increasing order of value; none while the history is flat (all its
    /// values the same, in any order).
    order: Vec<u16>,
    /// The median and scale the last value was judged against.
    pub median: f64,
    pub scale: f64,
}

/// The scale's unit: 1.4826 MAD estimates a normal distribution's standard deviation.
const MAD_TO_SIGMA: f64 = 1.4826;
/// The same for the mean absolute deviation, the fallback when more than half the values are
/// equal (MAD 0): sqrt(pi / 2).
const MEAN_AD_TO_SIGMA: f64 = 1.2533;

impl RobustZ {
    pub fn new(window: usize, warmup: usize) -> Self {
        RobustZ {
            window: window.clamp(2, 1 << 15),
            warmup: warmup.clamp(2, window.max(2)),
            order: Vec::new(),
            median: f64::NAN,
            scale: f64::NAN,
        }
    }

    /// The values of the history it reads: its window and the value being judged.
    pub fn history_len(&self) -> usize {
        self.window + 1
    }

    /// The robust z-score of `x` (the history's last value) against the values before it, once
    /// `warmup` have been seen. `x` is judged as kept, in `f32`, like the values before it, so
    /// that a series that never moves is 0 from its median.
    pub fn update(&mut self, x: f64, history: &History) -> Option<f64> {
        if !history.current() {
            return None;
        }
        let x = f64::from(x as f32);
        let before = (history.kept() - 1).min(self.window);
        if let Some(c) = history.flat() {
            let c = f64::from(c);
            return (before >= self.warmup).then(|| {
                self.median = c;
                self.scale = scale_by(before, |_| c, c);
                (x - self.median) / self.scale
            });
        }
        let last = history.taken() as u16;
        if history.unflattened() {
            // The values before this one were all the same: their order is their arrival.
            self.order = (1..=before as u16).rev().map(|back| last.wrapping_sub(1).wrapping_sub(back)).collect();
        }
        let values = history.values();
        // The value of sequence number `seq`: `last - seq` back from the end, the judged one 1.
        let value = |seq: u16| f64::from(values[values.len() - usize::from(last.wrapping_sub(seq))]);
        let n = self.order.len();
        let out = (n >= self.warmup).then(|| {
            let at = |i: usize| value(self.order[i]);
            self.median = median_by(n, at);
            self.scale = scale_by(n, at, self.median);
            (x - self.median) / self.scale
        });
        // The oldest leaves before the new one comes, so the order never outgrows the window.
        if n == self.window {
            let old = last.wrapping_sub(1).wrapping_sub(self.window as u16);
            let v = value(old);
            let from = self.order.partition_point(|s| value(*s) < v);
            if let Some(i) = self.order[from..].iter().position(|s| *s == old) {
                self.order.remove(from + i);
            }
        } else if self.order.len() == self.order.capacity() {
            self.order.reserve_exact((n.max(8) * 2).min(self.window) - n);
        }
        let at = self.order.partition_point(|s| value(*s) < x);
        self.order.insert(at, last.wrapping_sub(1));
        out
    }

    pub fn bytes(&self) -> usize {
        super::heap(&self.order)
    }
}

/// The median of `n` sorted values, the `i`-th read by `at(i)` (the mean of the middle two for
/// an even count).
fn median_by(n: usize, at: impl Fn(usize) -> f64) -> f64 {
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => at(n / 2),
        // Halved first, so that two values near the largest float do not overflow.
        _ => at(n / 2 - 1) / 2.0 + at(n / 2) / 2.0,
    }
}

/// A robust standard deviation of `n` sorted values around `median`: 1.4826 MAD; when more than
/// half are equal, the mean absolute deviation; when all are, the smallest step a number of
/// that size can take, so that any change is far.
fn scale_by(n: usize, at: impl Fn(usize) -> f64, median: f64) -> f64 {
    let mad = median_deviation_by(n, &at, median);
    if mad > 0.0 {
        return MAD_TO_SIGMA * mad;
    }
    let mean_ad = (0..n).map(|i| (at(i) - median).abs()).sum::<f64>() / n.max(1) as f64;
    if mean_ad > 0.0 {
        return MEAN_AD_TO_SIGMA * mean_ad;
    }
    f64::EPSILON * median.abs().max(1.0)
}

/// The median of `|v - median|` over `n` sorted values. The deviations below the median grow
/// leftwards and those above it rightwards: two sorted sequences, whose middle one or two
/// values are found by bisection, in logarithmic time.
fn median_deviation_by(n: usize, at: impl Fn(usize) -> f64, median: f64) -> f64 {
    if n == 0 {
        return f64::NAN;
    }
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if at(mid) < median {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let split = lo;
    let below = |i: usize| median - at(split - 1 - i);
    let above = |j: usize| at(split + j) - median;
    let kth = |k: usize| kth_of_two(split, n - split, below, above, k);
    if n % 2 == 1 {
        kth(n / 2)
    } else {
        kth(n / 2 - 1) / 2.0 + kth(n / 2) / 2.0
    }
}

/// The `k`-th smallest (from 0) of two increasing sequences of lengths `na` and `nb` together.
fn kth_of_two(na: usize, nb: usize, a: impl Fn(usize) -> f64, b: impl Fn(usize) -> f64, k: usize) -> f64 {
    // How many of the k + 1 smallest come from `a`: the first count at which a's next value is
    // no smaller than the last one taken from `b`.
    let (mut lo, mut hi) = ((k + 1).saturating_sub(nb), (k + 1).min(na));
    while lo < hi {
        let mid = (lo + hi) / 2;
        if a(mid) < b(k - mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let from_a = lo.checked_sub(1).map(&a);
    let from_b = (lo <= k).then(|| b(k - lo));
    match (from_a, from_b) {
        (Some(x), Some(y)) => x.max(y),
        (Some(x), None) | (None, Some(x)) => x,
        (None, None) => f64::NAN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn median(sorted: &[f64]) -> f64 {
        median_by(sorted.len(), |i| sorted[i])
    }

    fn median_deviation(sorted: &[f64], median: f64) -> f64 {
        median_deviation_by(sorted.len(), |i| sorted[i], median)
    }

    /// A scorer with a history of its own.
    struct Fed(RobustZ, History);

    impl Fed {
        fn new(window: usize, warmup: usize) -> Self {
            let z = RobustZ::new(window, warmup);
            let history = History::new(z.history_len());
            Fed(z, history)
        }

        fn update(&mut self, x: f64) -> Option<f64> {
            self.1.take(x);
            self.0.update(x, &self.1)
        }
    }

    #[test]
    fn the_median_absolute_deviation_by_hand() {
        // 1 2 3 4 100: median 3, deviations 2 1 0 1 97 -> sorted 0 1 1 2 97, MAD 1.
        let sorted = [1.0, 2.0, 3.0, 4.0, 100.0];
        assert_eq!(median(&sorted), 3.0);
        assert_eq!(median_deviation(&sorted, 3.0), 1.0);
        // 1 2 3 4: median 2.5, deviations 1.5 .5 .5 1.5, MAD 1.
        assert_eq!(median_deviation(&[1.0, 2.0, 3.0, 4.0], 2.5), 1.0);
        // Every naive computation agrees on random data.
        let mut state = 7u64;
        for n in 1..60 {
            let mut v: Vec<f64> = (0..n)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((state >> 33) % 50) as f64
                })
                .collect();
            v.sort_by(f64::total_cmp);
            let m = median(&v);
            let mut dev: Vec<f64> = v.iter().map(|x| (x - m).abs()).collect();
            dev.sort_by(f64::total_cmp);
            assert_eq!(median_deviation(&v, m), median(&dev), "n = {n}: {v:?}");
        }
    }

    #[test]
    fn a_value_is_judged_against_the_values_before_it() {
        let mut z = Fed::new(5, 5);
        for x in [1.0, 2.0, 3.0, 4.0, 100.0] {
            assert_eq!(z.update(x), None, "warming up");
        }
        // Median 3, MAD 1: (9 - 3) / 1.4826.
        let got = z.update(9.0).expect("a score");
        assert!((got - 6.0 / 1.4826).abs() < 1e-12, "{got}");
        assert_eq!((z.0.median, z.0.scale), (3.0, 1.4826));
        // The window slid: 2 3 4 100 9 -> median 4, deviations 2 1 0 96 5 -> MAD 2.
        let got = z.update(0.0).expect("a score");
        assert!((got + 4.0 / (2.0 * 1.4826)).abs() < 1e-12, "{got}");
    }

    #[test]
    fn the_order_read_from_the_history_is_the_window_sorted_past_sequence_wrap_around() {
        // More values than a 16-bit sequence number counts, many of them equal.
        let mut z = Fed::new(7, 2);
        let mut state = 3u64;
        let mut window: Vec<f64> = Vec::new();
        for step in 0..70_000 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let x = ((state >> 33) % 9) as f64;
            let got = z.update(x);
            if window.len() >= 2 {
                let mut sorted = window.clone();
                sorted.sort_by(f64::total_cmp);
                let m = median(&sorted);
                assert_eq!(z.0.median, m, "step {step}: {window:?}");
                assert!(got.is_some());
            }
            window.push(x);
            if window.len() > 7 {
                window.remove(0);
            }
        }
    }

    #[test]
    fn when_most_values_are_equal_the_mean_deviation_is_the_scale() {
        let mut z = Fed::new(10, 4);
        for x in [0.0, 0.0, 0.0, 4.0] {
            z.update(x);
        }
        // Median 0, MAD 0, mean absolute deviation 1.
        assert_eq!(z.update(2.0), Some(2.0 / 1.2533));
        let mut flat = Fed::new(10, 3);
        for _ in 0..3 {
            flat.update(5.0);
        }
        assert_eq!(flat.update(5.0), Some(0.0));
        assert!(flat.update(5.5).expect("a score") > 1e12, "a flat series that moves is far from itself");
    }

    #[test]
    fn the_bisected_median_deviation_is_the_sorted_one() {
        use proptest::prelude::*;
        proptest!(|(mut values in proptest::collection::vec(-50i32..50, 1..60), shift in -3i32..3)| {
            values.sort_unstable();
            let sorted: Vec<f64> = values.iter().map(|v| f64::from(*v)).collect();
            let m = median(&sorted) + f64::from(shift) / 2.0;
            let mut deviations: Vec<f64> = sorted.iter().map(|v| (v - m).abs()).collect();
            deviations.sort_by(f64::total_cmp);
            prop_assert_eq!(median_deviation(&sorted, m), median(&deviations));
        });
    }
}
