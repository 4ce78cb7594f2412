//! Properties every scorer keeps: what it does with values that are not finite numbers, and the
//! calibration of the conformal p-values.

use super::knn::tests::Fed;
use super::{History, Scorer};
use proptest::prelude::*;
use vigil_lang::plan::ScorerSpec;

/// A scorer and, for one that reads recent values, a history of its own.
#[derive(Debug)]
struct Lone(Scorer, Option<History>);

impl Lone {
    fn update(&mut self, x: f64) -> Option<f64> {
        if let Some(h) = &mut self.1 {
            h.take(x);
        }
        self.0.update(x, self.1.as_ref())
    }
}

/// Small windows, so that short inputs reach every scorer's judging state.
fn all_scorers() -> Vec<Lone> {
    [
        ScorerSpec::RobustZ { window: 16, warmup: 4 },
        ScorerSpec::Knn { dim: 3, k: 2, window: 16, calibration: 20 },
        ScorerSpec::Shift { window: 8, bins: 3, warmup: 8 },
        ScorerSpec::Likelihood { short: 3, long: 32, warmup: 8 },
        ScorerSpec::Novelty { window: 32, warmup: 4 },
        ScorerSpec::Unchanged,
        ScorerSpec::ChangeRate { window: 8 },
        ScorerSpec::Streak,
        ScorerSpec::Spot { level: 90, warmup: 16, peaks: 8, risk: 4 },
        ScorerSpec::Changepoint { expected: 50, runs: 8, warmup: 4 },
    ]
    .iter()
    .map(|spec| {
        let scorer = Scorer::new(spec);
        let history = scorer.history_len().map(History::new);
        Lone(scorer, history)
    })
    .collect()
}

fn value() -> impl Strategy<Value = f64> {
    prop_oneof![
        6 => -1000.0..1000.0f64,
        1 => Just(0.0),
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
        1 => prop_oneof![Just(1e300), Just(-1e300), Just(f64::MIN_POSITIVE), Just(f64::MAX)],
    ]
}

proptest! {
    /// A value that is not a finite number gives no score and changes nothing: the scorer that
    /// saw it answers every later value exactly as one that never saw it, and no score is ever
    /// NaN, however extreme the finite values.
    #[test]
    fn values_that_are_not_numbers_never_poison_a_scorer(values in proptest::collection::vec(value(), 0..400)) {
        for (mut seen, mut clean) in all_scorers().into_iter().zip(all_scorers()) {
            for &x in &values {
                let a = seen.update(x);
                if x.is_finite() {
                    let b = clean.update(x);
                    prop_assert_eq!(a.map(f64::to_bits), b.map(f64::to_bits), "{:?} after {}", seen, x);
                    prop_assert!(a.is_none_or(|s| !s.is_nan()), "{:?} scored NaN", seen);
                } else {
                    prop_assert_eq!(a, None);
                }
            }
            // Debug text, as the states hold NaN for "not yet" and NaN is unequal to itself.
            prop_assert_eq!(format!("{:?}", seen.0), format!("{:?}", clean.0));
            let kept = |l: &Lone| l.1.as_ref().map(|h| (h.values().to_vec(), h.taken()));
            prop_assert_eq!(kept(&seen), kept(&clean));
        }
    }
}

/// A deterministic source of standard normal draws (SplitMix64 and Box-Muller).
struct Normal(u64);

impl Normal {
    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn draw(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// The Kolmogorov-Smirnov distance between the sample and the uniform distribution on [0, 1].
fn ks_uniform(mut p: Vec<f64>) -> f64 {
    p.sort_by(f64::total_cmp);
    let n = p.len() as f64;
    p.iter().enumerate().map(|(i, &x)| (x - i as f64 / n).abs().max(((i + 1) as f64 / n - x).abs())).fold(0.0, f64::max)
}

proptest! {
    /// A series that never moved keeps its history as one value: the scores are those of a
    /// history that kept every value, before it moves and after.
    #[test]
    fn a_flat_history_kept_as_one_value_scores_as_one_kept_whole(
        flat in 0usize..80,
        level in -5i32..5,
        rest in proptest::collection::vec(value(), 0..120),
    ) {
        let values: Vec<f64> = std::iter::repeat_n(f64::from(level) / 3.0, flat).chain(rest).collect();
        let specs = [
            ScorerSpec::RobustZ { window: 16, warmup: 4 },
            ScorerSpec::Knn { dim: 3, k: 2, window: 16, calibration: 20 },
        ];
        for spec in specs {
            let with = |history: fn(usize) -> History| {
                let scorer = Scorer::new(&spec);
                let history = scorer.history_len().map(history);
                Lone(scorer, history)
            };
            let (mut kept_flat, mut kept_whole) = (with(History::new), with(History::never_flat));
            for &x in &values {
                let (a, b) = (kept_flat.update(x), kept_whole.update(x));
                prop_assert_eq!(a.map(f64::to_bits), b.map(f64::to_bits), "{:?} at {}", spec, x);
            }
        }
    }
}

/// The p-values of the values after `skip`, once the scorer gives them.
fn p_values(knn: &mut Fed, values: impl Iterator<Item = f64>, skip: usize) -> Vec<f64> {
    values.enumerate().filter_map(|(i, x)| knn.update(x).filter(|_| i >= skip).map(|_| knn.0.p_value)).collect()
}

#[test]
fn conformal_p_values_are_close_to_uniform_on_iid_noise() {
    // Exchangeable input: p-values of one series are uniform on the grid 1/(n+1) .. 1. Neighbouring
    // p-values share most of their calibration set, so they are not independent and the usual
    // critical value (1.63 / sqrt(n) = 0.023 at the 1% level for 5,000) is a little tight; 0.03 is
    // still five times below what a miscalibrated scorer gives (the control below). Measured: 0.010.
    let mut rng = Normal(7);
    let mut knn = Fed::new(6, 3, 256, 256);
    let p = p_values(&mut knn, (0..5600).map(|_| rng.draw()), 600);
    assert_eq!(p.len(), 5000);
    let d = ks_uniform(p.clone());
    assert!(d < 0.03, "KS distance {d} from uniform");
    // And the false-alarm rate a threshold promises: p < 0.05 about 5% of the time.
    let rate = p.iter().filter(|&&x| x < 0.05).count() as f64 / p.len() as f64;
    assert!((0.03..0.07).contains(&rate), "share of p < 0.05: {rate}");
}

#[test]
fn the_uniformity_bound_fails_when_the_noise_changes() {
    // The control: the same scorer after the noise triples is far from uniform (its p-values
    // crowd near 0), so the bound above cannot pass by accident.
    let mut rng = Normal(11);
    let mut knn = Fed::new(6, 3, 256, 256);
    let calm = (0..600).map(|_| rng.draw()).collect::<Vec<_>>();
    let wild = (0..300).map(|_| 3.0 * rng.draw()).collect::<Vec<_>>();
    let p = p_values(&mut knn, calm.into_iter().chain(wild), 600);
    let d = ks_uniform(p);
    assert!(d > 0.16, "KS distance {d}: the change went unnoticed");
}
