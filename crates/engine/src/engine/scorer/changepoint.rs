//! `changepoint`: how unlikely a value is in the series' current regime, as the surprise
//! `-log10 P(|X - loc| >= |x - loc|)`, where the regime is found by Bayesian online change point
//! detection (Adams and MacKay, "Bayesian Online Changepoint Detection", 2007).
//!
//! The series is taken as runs of values drawn from a normal distribution of unknown mean and
//! variance, a run ending at each value with probability `1 / expected`. The posterior over the
//! current run's length is kept for at most `runs` lengths (the least probable are let go), each
//! with its values' count, mean and sum of squares. A value is judged by the Student-t
//! predictive of the most probable run, so a series that has moved to a new level is judged by
//! its new level as soon as the evidence says it moved, not after a fixed window.
//!
//! The prior of a new run is the series' own: its mean and variance over every value seen, with
//! the weight of one value, so no parameter depends on the series' scale.

use super::MAX_SURPRISE;
use statrs::function::{beta::checked_beta_reg, gamma::ln_gamma};

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Changepoint {
    hazard: f64,
    cap: usize,
    warmup: usize,
    /// Every value seen: count, mean and sum of squared deviations (Welford).
    all: Moments,
    /// The run lengths kept, each with its posterior probability and its values' moments.
    runs: Vec<(f64, Moments)>,
    /// The run that judged the last value: its length and the predictive's centre and scale.
    pub run_length: f64,
    pub loc: f64,
    pub scale: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
struct Moments {
    n: f64,
    mean: f64,
    ss: f64,
}

impl Moments {
    fn push(&mut self, x: f64) {
        self.n += 1.0;
        let d = x - self.mean;
        self.mean += d / self.n;
        self.ss += d * (x - self.mean);
    }
}

/// A prior's weight, in values: a new run's mean and variance start as the series' and give way
/// to the run's own after a few values.
const PRIOR_WEIGHT: f64 = 1.0;

/// A Student-t predictive: degrees of freedom, centre and scale.
struct Predictive {
    dof: f64,
    loc: f64,
    scale: f64,
}

impl Predictive {
    /// The normal-gamma posterior predictive of a run with moments `m` under the prior `all`.
    fn of(m: &Moments, all: &Moments) -> Predictive {
        let kappa = PRIOR_WEIGHT + m.n;
        let alpha = PRIOR_WEIGHT + m.n / 2.0;
        let prior_var = all.ss / (all.n - 1.0).max(1.0);
        // A floor relative to the level, so that a flat series still has a scale.
        let floor = f64::EPSILON * all.mean.abs().max(1.0);
        let beta = PRIOR_WEIGHT * prior_var.max(floor * floor)
            + m.ss / 2.0
            + PRIOR_WEIGHT * m.n * (m.mean - all.mean).powi(2) / (2.0 * kappa);
        Predictive {
            dof: 2.0 * alpha,
            loc: (PRIOR_WEIGHT * all.mean + m.n * m.mean) / kappa,
            scale: (beta * (kappa + 1.0) / (alpha * kappa)).sqrt().max(floor),
        }
    }

    fn ln_pdf(&self, x: f64) -> f64 {
        let t = (x - self.loc) / self.scale;
        let v = self.dof;
        ln_gamma_half_step(v / 2.0)
            - 0.5 * (v * std::f64::consts::PI).ln()
            - self.scale.ln()
            - (v + 1.0) / 2.0 * (t * t / v).ln_1p()
    }

    /// `P(|X - loc| >= |x - loc|)`; NaN where values so large that their arithmetic
    /// overflows leave no number to judge.
    fn two_sided_tail(&self, x: f64) -> f64 {
        let t = (x - self.loc) / self.scale;
        let v = self.dof;
        checked_beta_reg(v / 2.0, 0.5, v / (v + t * t)).unwrap_or(f64::NAN)
    }
}

/// `ln Γ(x + 1/2) - ln Γ(x)`: by its asymptotic series where that is exact to about 1e-12 (most
/// runs are long, so this spares two log-gamma calls per run and value), directly below.
fn ln_gamma_half_step(x: f64) -> f64 {
    if x < 40.0 {
        return ln_gamma(x + 0.5) - ln_gamma(x);
    }
    let r = 1.0 / x;
    0.5 * x.ln() - r / 8.0 + r.powi(3) / 192.0 + r.powi(5) / 640.0
}

impl Changepoint {
    pub fn new(expected: usize, runs: usize, warmup: usize) -> Self {
        Changepoint {
            hazard: 1.0 / expected.max(2) as f64,
            cap: runs.max(2),
            warmup: warmup.max(2),
            all: Moments::default(),
            runs: vec![(1.0, Moments::default())],
            run_length: f64::NAN,
            loc: f64::NAN,
            scale: f64::NAN,
        }
    }

    pub fn update(&mut self, x: f64) -> Option<f64> {
        let out = (self.all.n >= self.warmup as f64).then(|| {
            let (_, map) = self.runs.iter().max_by(|a, b| a.0.total_cmp(&b.0)).copied().unwrap_or_default();
            let p = Predictive::of(&map, &self.all);
            self.run_length = map.n;
            self.loc = p.loc;
            self.scale = p.scale;
            let tail = p.two_sided_tail(x);
            if tail > 0.0 {
                (-tail.log10()).clamp(0.0, MAX_SURPRISE)
            } else if tail == 0.0 {
                MAX_SURPRISE
            } else {
                f64::NAN
            }
        });
        self.learn(x);
        out
    }

    /// The posterior over run lengths after `x`: each run grows or ends, weighed by how well it
    /// predicted `x`; then every run takes `x` in, and a new, empty run starts.
    fn learn(&mut self, x: f64) {
        let ln_pdfs: Vec<f64> = self.runs.iter().map(|(_, m)| Predictive::of(m, &self.all).ln_pdf(x)).collect();
        // Scaled by the best predictive, so that far-off values do not underflow every weight.
        let top = ln_pdfs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut ended = 0.0;
        for ((w, m), lp) in self.runs.iter_mut().zip(&ln_pdfs) {
            let joint = *w * (lp - top).exp();
            ended += joint * self.hazard;
            *w = joint * (1.0 - self.hazard);
            m.push(x);
        }
        self.runs.push((ended, Moments::default()));
        if self.runs.len() > self.cap {
            // The least probable go; the newest run stays, as it is where a change starts.
            let newest = self.runs.pop();
            self.runs.sort_by(|a, b| b.0.total_cmp(&a.0));
            self.runs.truncate(self.cap - 1);
            self.runs.extend(newest);
        }
        let total: f64 = self.runs.iter().map(|r| r.0).sum();
        if total > 0.0 && total.is_finite() {
            self.runs.iter_mut().for_each(|r| r.0 /= total);
        } else {
            // Nothing predicted `x` at all: start afresh from the series' prior.
            self.runs = vec![(1.0, Moments::default())];
        }
        self.all.push(x);
    }

    pub fn bytes(&self) -> usize {
        super::heap(&self.runs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic noise in [-1, 1).
    fn noise(i: u32) -> f64 {
        f64::from((i * 7919 + 13) % 200) / 100.0 - 1.0
    }

    #[test]
    fn a_jump_is_surprising_once_and_the_new_level_is_learned() {
        let mut c = Changepoint::new(250, 32, 20);
        for i in 0..300 {
            c.update(10.0 + noise(i));
        }
        assert!(c.update(10.2).unwrap() < 1.0, "within the regime");
        assert!((c.loc - 10.0).abs() < 0.2 && c.run_length > 100.0, "{} {}", c.loc, c.run_length);
        let jump = c.update(30.0).unwrap();
        assert!(jump > 6.0, "{jump}");
        let mut last = 0.0;
        for i in 0..30 {
            last = c.update(30.0 + noise(i)).unwrap();
        }
        assert!(last < 2.0, "the new level is the regime now: {last}");
        assert!((c.loc - 30.0).abs() < 1.0 && c.run_length < 40.0, "{} {}", c.loc, c.run_length);
    }

    #[test]
    fn the_half_step_series_agrees_with_log_gamma() {
        // Not much beyond 1e5, where the direct difference loses the digits the series keeps.
        for x in [40.0, 41.5, 100.0, 1e4, 1e5] {
            let direct = ln_gamma(x + 0.5) - ln_gamma(x);
            assert!((ln_gamma_half_step(x) - direct).abs() < 1e-9 * direct.abs().max(1.0), "{x}");
        }
    }

    #[test]
    fn the_runs_kept_are_bounded_and_a_flat_series_has_a_scale() {
        let mut c = Changepoint::new(100, 8, 4);
        for _ in 0..50 {
            c.update(5.0);
        }
        assert!(c.runs.len() <= 8);
        assert_eq!(c.update(5.0), Some(0.0));
        assert!(c.update(6.0).unwrap() >= MAX_SURPRISE - 1.0);
    }
}
