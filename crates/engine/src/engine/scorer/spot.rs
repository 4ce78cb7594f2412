//! `spot`: how rare a value is in the upper tail of the series' own values, as the surprise
//! `-log10 P(X > x)`, with the tail fitted by extreme value theory in the manner of SPOT
//! (Siffer et al., "Anomaly detection in streams with extreme value theory", KDD 2017).
//!
//! The first `warmup` values set the tail's threshold `t`, their `level` quantile. From then on
//! every value above `t` that is not itself an anomaly (surprise at most `risk`) is a peak; the
//! excesses of the last `peaks` of them are fitted with a generalised Pareto distribution by
//! the method of moments (closed form, so a refit costs one pass over the peaks), and
//! `P(X > x) = share * (1 + shape * (x - t) / scale) ^ (-1 / shape)`, where `share` is the
//! fraction of values above `t` over the span the peaks cover. So the threshold a rule writes is
//! a probability (`spot(..) > 4`: rarer than one in 10,000), and what value that is follows from
//! each series' own tail: a series with heavy tails gets a high one, a quiet series a low one.
//!
//! A value at or below `t` is not in the tail and scores 0.

use super::MAX_SURPRISE;
use std::collections::VecDeque;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Spot {
    level: f64,
    warmup: usize,
    cap: usize,
    risk: f64,
    /// The first values, until the threshold is set; empty from then on.
    first: Vec<f32>,
    /// Values seen, the first ones included.
    seen: u32,
    /// The peaks' excesses over the threshold and the index of the value each came from.
    peaks: VecDeque<(f32, u32)>,
    /// The tail the last value was judged against.
    pub threshold: f64,
    pub shape: f64,
    pub scale: f64,
    pub share: f64,
}

/// Fewer peaks than this give no shape: the tail is taken as exponential (`shape` 0).
const MIN_PEAKS_FOR_SHAPE: usize = 8;

impl Spot {
    pub fn new(level_percent: usize, warmup: usize, peaks: usize, risk: usize) -> Self {
        let warmup = warmup.max(2);
        Spot {
            level: level_percent as f64 / 100.0,
            warmup,
            cap: peaks.max(2),
            risk: risk as f64,
            first: Vec::with_capacity(warmup),
            seen: 0,
            peaks: VecDeque::new(),
            threshold: f64::NAN,
            shape: f64::NAN,
            scale: f64::NAN,
            share: f64::NAN,
        }
    }

    pub fn update(&mut self, x: f64) -> Option<f64> {
        let index = self.seen;
        self.seen = self.seen.saturating_add(1);
        // Until the threshold is set, every value is one of the first.
        if self.threshold.is_nan() {
            self.first.push(narrow(x));
            if self.first.len() == self.warmup {
                self.start();
            }
            return None;
        }
        let surprise = self.surprise(x);
        if x > self.threshold && surprise <= self.risk {
            if self.peaks.len() == self.cap {
                self.peaks.pop_front();
            }
            self.peaks.push_back((narrow(x - self.threshold), index));
            self.fit();
        }
        Some(surprise)
    }

    /// Sets the threshold from the first values, takes those above it as the first peaks.
    fn start(&mut self) {
        let mut sorted = std::mem::take(&mut self.first);
        sorted.sort_by(f32::total_cmp);
        let at = ((sorted.len() as f64 * self.level) as usize).min(sorted.len() - 1);
        self.threshold = f64::from(sorted[at]);
        // All from the first values (index 0, so the span they cover starts there), in ascending
        // order: over the cap, the smallest go.
        let above = sorted[at + 1..].iter().map(|v| (narrow(f64::from(*v) - self.threshold), 0));
        self.peaks = above.filter(|(y, _)| *y > 0.0).collect();
        while self.peaks.len() > self.cap {
            self.peaks.pop_front();
        }
        self.fit();
    }

    /// Fits the generalised Pareto distribution to the peaks' excesses by the method of moments:
    /// with mean `m` and variance `v`, `shape = (1 - m^2 / v) / 2`, `scale = m (1 + m^2 / v) / 2`.
    fn fit(&mut self) {
        let n = self.peaks.len();
        let oldest = if n == self.cap { self.peaks.front().map_or(0, |p| p.1) } else { 0 };
        let span = f64::from(self.seen - oldest).max(1.0);
        // No peak yet: the tail is known only to be rarer than one value in the span.
        self.share = (n.max(1) as f64 / span).min(1.0);
        let mean = self.peaks.iter().map(|p| f64::from(p.0)).sum::<f64>() / n.max(1) as f64;
        let var = self.peaks.iter().map(|p| (f64::from(p.0) - mean).powi(2)).sum::<f64>() / (n.max(2) - 1) as f64;
        let floor = f64::EPSILON * self.threshold.abs().max(1.0);
        if n < MIN_PEAKS_FOR_SHAPE || var <= 0.0 {
            self.shape = 0.0;
            self.scale = mean.max(floor);
        } else {
            let r = mean * mean / var;
            self.shape = (0.5 * (1.0 - r)).max(-0.5);
            self.scale = (0.5 * mean * (1.0 + r)).max(floor);
        }
    }

    fn surprise(&self, x: f64) -> f64 {
        if x <= self.threshold {
            return 0.0;
        }
        let z = (x - self.threshold) / self.scale;
        let log_tail = if self.shape.abs() < 1e-9 {
            -z * std::f64::consts::LOG10_E
        } else {
            let base = 1.0 + self.shape * z;
            if base <= 0.0 {
                return MAX_SURPRISE;
            }
            -base.log10() / self.shape
        };
        (-(self.share.log10() + log_tail)).clamp(0.0, MAX_SURPRISE)
    }

    pub fn bytes(&self) -> usize {
        super::heap(&self.first) + super::heap(&self.peaks)
    }
}

/// A value as kept: `f32`, its largest finite value for anything larger, so that one huge
/// value cannot make the fit infinite.
fn narrow(x: f64) -> f32 {
    x.clamp(f64::from(f32::MIN), f64::from(f32::MAX)) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic stream with an exponential tail: -ln(u) for u evenly spread in (0, 1),
    /// in a scrambled order.
    fn exponential(n: u32) -> impl Iterator<Item = f64> {
        (0..n).map(move |i| {
            let u = (f64::from((i * 7919) % n) + 0.5) / f64::from(n);
            -u.ln()
        })
    }

    #[test]
    fn an_exponential_tail_is_read_as_one() {
        let mut s = Spot::new(90, 1000, 256, 6);
        for x in exponential(1000).chain(exponential(1000)) {
            s.update(x);
        }
        // The 90% quantile of Exp(1) is ln 10; the excesses over it are Exp(1) again.
        assert!((s.threshold - 10f64.ln()).abs() < 0.01, "{}", s.threshold);
        assert!(s.shape.abs() < 0.15, "{}", s.shape);
        assert!((s.scale - 1.0).abs() < 0.15, "{}", s.scale);
        assert!((s.share - 0.1).abs() < 0.02, "{}", s.share);
        // P(X > 4 ln 10) = 1e-4 for Exp(1).
        let surprise = s.update(4.0 * 10f64.ln()).unwrap();
        assert!((surprise - 4.0).abs() < 0.5, "{surprise}");
        assert_eq!(s.update(1.0), Some(0.0), "below the threshold");
    }

    #[test]
    fn the_same_excess_is_rarer_in_a_quiet_series() {
        let quiet = |x: f64| x * 0.1;
        let (mut a, mut b) = (Spot::new(98, 500, 64, 6), Spot::new(98, 500, 64, 6));
        for x in exponential(2000) {
            a.update(x);
            b.update(quiet(x));
        }
        let (sa, sb) = (a.update(6.0).unwrap(), b.update(6.0).unwrap());
        assert!(sa < 3.0 && sb >= MAX_SURPRISE - 1.0, "{sa} {sb}");
    }

    #[test]
    fn anomalies_do_not_raise_the_tail() {
        let mut s = Spot::new(90, 1000, 64, 4);
        for x in exponential(1000).chain(exponential(500)) {
            s.update(x);
        }
        let before = (s.shape, s.scale);
        for _ in 0..20 {
            assert!(s.update(50.0).unwrap() > 4.0);
        }
        assert_eq!((s.shape, s.scale), before, "what scores above the risk is not learned");
    }

    #[test]
    fn nothing_before_the_warmup_and_a_flat_series_is_handled() {
        let mut s = Spot::new(98, 10, 16, 4);
        for _ in 0..10 {
            assert_eq!(s.update(3.0), None);
        }
        assert_eq!(s.update(3.0), Some(0.0));
        assert_eq!(s.update(3.5), Some(MAX_SURPRISE), "anything above a constant is new");
        assert!(s.first.is_empty() && s.first.capacity() == 0, "the first values are let go");
    }
}
