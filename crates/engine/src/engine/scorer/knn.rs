//! `knn`: conformal k-nearest-neighbour anomaly detection over lag vectors (the idea of KNN-CAD,
//! Burnaev and Ishimtsev 2016), kept online.
//!
//! The last `dim` values form the current vector. Its non-conformity is its mean Euclidean
//! distance to its `k` nearest neighbours among the `window` vectors before it that share no
//! value with it. The non-conformities of the last `calibration` vectors, each computed the same
//! way when it was current, calibrate it: the conformal p-value is the share of them at least
//! as large (counting the new one), and the score is one minus it. On exchangeable data the
//! p-values are uniform, so a threshold on the score is a false-alarm rate.
//!
//! The values are the series' history, shared with the rule's other scorers of the same input
//! (`robust_z`), in `f32`: half the memory, and twice the distances per vector instruction.
//! Seven significant digits are more than a shape's distance needs; a value beyond `f32`'s
//! range gives no score and is not kept.

use super::history::History;
use std::collections::VecDeque;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Knn {
    dim: usize,
    k: usize,
    window: usize,
    calibration: usize,
    /// The non-conformities of the last vectors, oldest first, as [`code`]s, after the first
    /// `flat_scores`, which are 0 (those of a series before it first moved), counted, not kept.
    scores: VecDeque<u16>,
    flat_scores: usize,
    /// The last vector's non-conformity and p-value.
    pub alpha: f64,
    pub p_value: f64,
}

thread_local! {
    /// Squared distances to the reference vectors: one buffer per thread, not per series.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Distances looked at together when the nearest are sought.
const BLOCK: usize = 16;

/// Puts `x` among the sorted smallest values of `held` if it is smaller than the largest.
fn insert(held: &mut [f32], x: f32) {
    let last = held.len() - 1;
    if x < held[last] {
        let mut i = last;
        while i > 0 && held[i - 1] > x {
            held[i] = held[i - 1];
            i -= 1;
        }
        held[i] = x;
    }
}

/// A non-conformity as kept for calibration: the top 16 bits of its `f32` (bfloat16, rounded
/// towards zero), 8 significant bits. Non-conformities are never negative, and for those the
/// codes keep the values' order, so a p-value counts codes; two within 0.8% of each other may
/// share a code and then count as equal (at least as large: the p-value can only rise).
fn code(alpha: f32) -> u16 {
    (alpha.to_bits() >> 16) as u16
}

/// Non-conformities needed before a p-value is given: fewer make it coarse.
const MIN_CALIBRATION: usize = 20;

impl Knn {
    pub fn new(dim: usize, k: usize, window: usize, calibration: usize) -> Self {
        let dim = dim.max(1);
        let window = window.max(k.max(1) + 1);
        Knn {
            dim,
            k: k.max(1),
            window,
            calibration: calibration.max(MIN_CALIBRATION),
            scores: VecDeque::new(),
            flat_scores: 0,
            alpha: f64::NAN,
            p_value: f64::NAN,
        }
    }

    /// The values of the history it reads: the window's vectors and the current one, which
    /// shares no value with them.
    pub fn history_len(&self) -> usize {
        self.window + 2 * self.dim - 1
    }

    /// The score of the history's last value, the end of the current vector.
    pub fn update(&mut self, history: &History) -> Option<f64> {
        if !history.current() {
            return None;
        }
        let n = history.kept().min(self.history_len());
        // Reference vectors start at 0..=n - 2 dim, so that none overlaps the current one.
        let references = (n + 1).checked_sub(2 * self.dim)?;
        if references < self.k {
            return None;
        }
        // A flat series' vectors are all the same: every distance is 0.
        let alpha = match history.flat() {
            Some(_) => 0.0,
            None => self.non_conformity(&history.values()[history.kept() - n..], references),
        };
        self.alpha = f64::from(alpha);
        let calibrated = self.flat_scores + self.scores.len();
        let out = (calibrated >= MIN_CALIBRATION).then(|| {
            // Counted in 16-bit lanes, eight to an instruction.
            let alpha = code(alpha);
            let (a, b) = self.scores.as_slices();
            let at_least = |xs: &[u16]| xs.iter().map(|s| u32::from(*s >= alpha)).sum::<u32>();
            let flat = if alpha == 0 { self.flat_scores } else { 0 };
            let larger = (at_least(a) + at_least(b)) as usize + flat;
            self.p_value = (larger + 1) as f64 / (calibrated + 1) as f64;
            1.0 - self.p_value
        });
        if calibrated == self.calibration {
            if self.flat_scores > 0 {
                self.flat_scores -= 1;
            } else {
                self.scores.pop_front();
            }
        }
        if self.scores.is_empty() && alpha == 0.0 {
            self.flat_scores += 1;
            return out;
        }
        if self.scores.len() == self.scores.capacity() {
            // Grows as the series lives, never past the calibration set.
            let n = self.scores.len();
            self.scores.reserve_exact((n.max(8) * 2).min(self.calibration - self.flat_scores) - n);
        }
        self.scores.push_back(code(alpha));
        out
    }

    /// The mean distance of the current vector, the last `dim` of `values`, to its `k` nearest
    /// among the `references` vectors before it.
    fn non_conformity(&self, values: &[f32], references: usize) -> f32 {
        let n = values.len();
        let current = &values[n - self.dim..];
        let mut nearest = [f32::INFINITY; 64];
        let k = self.k.min(nearest.len());
        SCRATCH.with_borrow_mut(|d| {
            // Lag by lag over all references at once: contiguous loops the compiler vectorises.
            d.clear();
            d.resize(references, 0.0);
            for (lag, c) in current.iter().enumerate() {
                for (d, v) in d.iter_mut().zip(&values[lag..lag + references]) {
                    *d += (v - c) * (v - c);
                }
            }
            // The k-th smallest of the blocks' minima bounds the k-th smallest distance from
            // above, since those minima are k distances: only blocks whose minimum is within
            // that bound are looked into, and only their distances within it are inserted.
            // Block minima are loops the compiler vectorises; a series' nearby shapes come in
            // runs, so inserting in time order alone would touch most distances.
            let least = |block: &[f32]| block.iter().fold(f32::INFINITY, |m, &x| if x < m { x } else { m });
            let mut minima = [f32::INFINITY; 64];
            for block in d.chunks(BLOCK) {
                insert(&mut minima[..k], least(block));
            }
            let bound = minima[k - 1];
            for block in d.chunks(BLOCK).filter(|block| least(block) <= bound) {
                for &x in block.iter().filter(|x| **x <= bound) {
                    insert(&mut nearest[..k], x);
                }
            }
        });
        (nearest[..k].iter().map(|d| f64::from(d.sqrt())).sum::<f64>() / k as f64) as f32
    }

    pub fn bytes(&self) -> usize {
        super::heap(&self.scores)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A scorer with a history of its own.
    pub(in crate::engine::scorer) struct Fed(pub Knn, History);

    impl Fed {
        pub fn new(dim: usize, k: usize, window: usize, calibration: usize) -> Self {
            let knn = Knn::new(dim, k, window, calibration);
            let history = History::new(knn.history_len());
            Fed(knn, history)
        }

        pub fn update(&mut self, x: f64) -> Option<f64> {
            self.1.take(x);
            self.0.update(&self.1)
        }
    }

    #[test]
    fn non_conformity_and_p_value_by_hand() {
        // dim 1, k 1: the distance to the nearest earlier value (not the current one).
        let mut knn = Fed::new(1, 1, 10, 20);
        for x in 0..30 {
            // 0, 1, 0, 1, ...: from the third on, each value has an equal one before it.
            let _ = knn.update((x % 2) as f64);
            if x >= 2 {
                assert_eq!(knn.0.alpha, 0.0);
            }
        }
        // The last twenty (zeros) calibrate; 5 is 4 from the nearest (1): larger than all, so
        // p = 1 / 21.
        let score = knn.update(5.0).expect("a score");
        assert_eq!(knn.0.alpha, 4.0);
        assert!((knn.0.p_value - 1.0 / 21.0).abs() < 1e-12);
        assert!((score - 20.0 / 21.0).abs() < 1e-12);
        // A repeated value conforms: alpha 0 and p = 21 / 21.
        assert_eq!(knn.update(1.0), Some(0.0));
    }

    #[test]
    fn a_flat_series_conforms_and_a_step_out_of_it_does_not() {
        let mut knn = Fed::new(3, 2, 50, 50);
        for _ in 0..100 {
            assert!(knn.update(7.0).unwrap_or(0.0) == 0.0);
        }
        assert!(knn.update(8.0).expect("a score") > 0.95);
    }
}
