//! Aggregates of a window's events, one accumulator per state field.

use crate::event::{Millis, Value};
use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use vigil_lang::plan::AggFunc;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum Acc {
    /// `count()`: every event.
    Count(u64),
    /// `count(x)`: events where `x` is present.
    CountOf(u64),
    Sum(f64),
    Avg {
        sum: f64,
        n: u64,
    },
    Min(Option<f64>),
    Max(Option<f64>),
    /// Welford's running count, mean and sum of squared deviations; boxed, so that the
    /// accumulator every window holds per field stays 24 bytes.
    Stddev(Box<(u64, f64, f64)>),
    // The collecting and value-holding accumulators are boxed so that the common ones stay
    // small (clippy's box_collection lint does not weigh enum size).
    Percentile(Box<(Vec<f64>, f64)>),
    #[allow(clippy::box_collection)]
    Distinct(Box<HashSet<String>>),
    #[allow(clippy::box_collection)]
    Set(Box<BTreeSet<String>>),
    First(Box<Value>),
    Last(Box<Value>),
    /// A rate over one series, as a checkpoint may hold one: read on, never made.
    Rate(Box<Rate>),
    /// `rate(x)`: each series' rate, summed.
    Rates(Box<BySeries<Rate>>),
    /// `increase(x)`: each series' increase, summed.
    Increases(Box<BySeries<Rate>>),
    /// `deriv(x)`: each series' least-squares slope per second, summed.
    Derivs(Box<BySeries<Fit>>),
    /// `predict_linear(x, d)`: each series' fitted value `d` seconds after its last sample,
    /// summed.
    Predictions(Box<(BySeries<Fit>, f64)>),
}

/// The accumulators of the series of one group, each by its series' hash. A group most often
/// holds one series, or a host's few (its CPUs, its filesystems): a vector searched in order
/// beats a map.
pub type BySeries<T> = Vec<(u64, T)>;

/// What a per-series accumulator takes: a number at a time.
trait OfSeries: Default {
    fn add(&mut self, x: f64, ts: Millis);
}

impl OfSeries for Rate {
    fn add(&mut self, x: f64, ts: Millis) {
        Rate::add(self, x, ts)
    }
}

impl OfSeries for Fit {
    fn add(&mut self, x: f64, ts: Millis) {
        Fit::add(self, x, ts)
    }
}

/// Adds `num`, if it is a number, to the accumulator of series `series` in `by`, made if new.
fn add_to<T: OfSeries>(by: &mut BySeries<T>, series: u64, num: Option<f64>, ts: Millis) {
    let Some(x) = num else { return };
    let i = match by.iter().position(|(s, _)| *s == series) {
        Some(i) => i,
        None => {
            by.push((series, T::default()));
            by.len() - 1
        }
    };
    by[i].1.add(x, ts);
}

/// The sum of the series' results; none when no series has one.
fn summed<T>(by: &BySeries<T>, result: impl Fn(&T) -> Option<f64>) -> Value {
    by.iter()
        .filter_map(|(_, a)| result(a))
        .fold(None, |sum: Option<f64>, x| Some(sum.unwrap_or(0.0) + x))
        .map_or(Value::Null, Value::Num)
}

/// A least-squares line through one series' samples (value against time), kept as running
/// means and co-moments (Welford's), in seconds from the first sample so that epoch
/// milliseconds cost no precision.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Fit {
    n: u32,
    first_ts: Millis,
    last_t: f64,
    mean_t: f64,
    mean_v: f64,
    /// Sum of (t - mean t) (v - mean v).
    c_tv: f64,
    /// Sum of (t - mean t)^2.
    m2_t: f64,
}

impl Fit {
    fn add(&mut self, v: f64, ts: Millis) {
        if self.n == 0 {
            self.first_ts = ts;
        }
        let t = (ts - self.first_ts) as f64 / 1000.0;
        self.n = self.n.saturating_add(1);
        let n = f64::from(self.n);
        let dt = t - self.mean_t;
        self.mean_t += dt / n;
        self.mean_v += (v - self.mean_v) / n;
        self.c_tv += dt * (v - self.mean_v);
        self.m2_t += dt * (t - self.mean_t);
        self.last_t = t;
    }

    /// The slope per second; none from fewer than two samples or samples all at one time.
    fn slope(&self) -> Option<f64> {
        (self.n >= 2 && self.m2_t > 0.0).then(|| self.c_tv / self.m2_t)
    }

    /// The line's value `ahead` seconds after the last sample.
    fn predict(&self, ahead: f64) -> Option<f64> {
        self.slope().map(|slope| self.mean_v + slope * (self.last_t + ahead - self.mean_t))
    }
}

/// `rate(x)` of a counter: how much it rose between the window's first and last samples, per
/// second between them. A fall is a reset (the process restarted and counts from 0 again), so
/// the sample after it counts whole, as PromQL's `rate` reads resets; a fall within
/// floating-point rounding of the value (`ROUNDING`) is not one, but no change: a counter that
/// a sender adds up in floating point can step back by its last bit, and read as a reset that
/// one step would count its whole value. Unlike PromQL's, the increase is not extrapolated to
/// the window's edges: it is the slope the samples show, the same for a steady counter.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Rate {
    first_ts: Millis,
    last_ts: Millis,
    last: f64,
    increase: f64,
    samples: u32,
}

/// The largest fall of a counter, relative to its value, that is rounding and not a reset:
/// a thousand times an f64's relative precision, far below any real restart (which starts
/// again from near 0).
const ROUNDING: f64 = 1e3 * f64::EPSILON;

impl Rate {
    fn add(&mut self, x: f64, ts: Millis) {
        if self.samples == 0 {
            self.first_ts = ts;
        } else {
            self.increase += if x >= self.last {
                x - self.last
            } else if self.last - x <= self.last.abs() * ROUNDING {
                0.0
            } else {
                x
            };
        }
        self.last = x;
        self.last_ts = ts;
        self.samples = self.samples.saturating_add(1);
    }

    /// Per second; none from fewer than two samples, or two at one time.
    fn result(&self) -> Option<f64> {
        let seconds = (self.last_ts - self.first_ts) as f64 / 1000.0;
        (self.samples >= 2 && seconds > 0.0).then(|| self.increase / seconds)
    }

    /// The rise between the first and the last sample; none from fewer than two.
    fn increase(&self) -> Option<f64> {
        (self.samples >= 2).then_some(self.increase)
    }
}

impl Acc {
    pub fn new(agg: AggFunc, has_arg: bool) -> Acc {
        match agg {
            AggFunc::Count if has_arg => Acc::CountOf(0),
            AggFunc::Count => Acc::Count(0),
            AggFunc::Sum => Acc::Sum(0.0),
            AggFunc::Avg => Acc::Avg { sum: 0.0, n: 0 },
            AggFunc::Min => Acc::Min(None),
            AggFunc::Max => Acc::Max(None),
            AggFunc::Stddev => Acc::Stddev(Box::new((0, 0.0, 0.0))),
            AggFunc::Percentile(p) => Acc::Percentile(Box::new((Vec::new(), p))),
            AggFunc::DistinctCount => Acc::Distinct(Box::default()),
            AggFunc::Set => Acc::Set(Box::default()),
            AggFunc::First => Acc::First(Box::new(Value::Null)),
            AggFunc::Last => Acc::Last(Box::new(Value::Null)),
            AggFunc::Rate => Acc::Rates(Box::default()),
            AggFunc::Increase => Acc::Increases(Box::default()),
            AggFunc::Deriv => Acc::Derivs(Box::default()),
            AggFunc::PredictLinear(ahead) => Acc::Predictions(Box::new((Vec::new(), ahead))),
        }
    }

    /// Adds one event's value of the aggregate's argument (`Null` for `count()`), at the
    /// event's time `ts` (events come in time order), of the series whose hash is `series`
    /// (read only by the aggregates kept per series).
    pub fn add(&mut self, v: &Value, ts: Millis, series: u64) {
        let num = v.as_f64().filter(|x| x.is_finite());
        match self {
            Acc::Count(n) => *n += 1,
            Acc::CountOf(n) => *n += u64::from(!v.is_null()),
            Acc::Sum(s) => *s += num.unwrap_or(0.0),
            Acc::Avg { sum, n } => {
                if let Some(x) = num {
                    *sum += x;
                    *n += 1;
                }
            }
            Acc::Min(m) => {
                if let Some(x) = num {
                    *m = Some(m.map_or(x, |m| m.min(x)));
                }
            }
            Acc::Max(m) => {
                if let Some(x) = num {
                    *m = Some(m.map_or(x, |m| m.max(x)));
                }
            }
            Acc::Stddev(w) => {
                let (n, mean, m2) = &mut **w;
                if let Some(x) = num {
                    *n += 1;
                    let delta = x - *mean;
                    *mean += delta / *n as f64;
                    *m2 += delta * (x - *mean);
                }
            }
            Acc::Percentile(b) => b.0.extend(num),
            Acc::Distinct(s) => {
                if !v.is_null() {
                    s.insert(v.to_text());
                }
            }
            Acc::Set(s) => {
                if !v.is_null() {
                    s.insert(v.to_text());
                }
            }
            Acc::First(f) => {
                if f.is_null() {
                    **f = v.clone();
                }
            }
            Acc::Last(l) => {
                if !v.is_null() {
                    **l = v.clone();
                }
            }
            Acc::Rate(r) => {
                if let Some(x) = num {
                    r.add(x, ts);
                }
            }
            Acc::Rates(by) | Acc::Increases(by) => add_to(by, series, num, ts),
            Acc::Derivs(by) => add_to(by, series, num, ts),
            Acc::Predictions(p) => add_to(&mut p.0, series, num, ts),
        }
    }

    pub fn result(&self) -> Value {
        match self {
            Acc::Count(n) | Acc::CountOf(n) => Value::Num(*n as f64),
            Acc::Sum(s) => Value::Num(*s),
            Acc::Avg { sum, n } if *n > 0 => Value::Num(sum / *n as f64),
            Acc::Min(Some(x)) | Acc::Max(Some(x)) => Value::Num(*x),
            Acc::Stddev(w) if w.0 >= 2 => Value::Num((w.2 / (w.0 - 1) as f64).sqrt()),
            Acc::Percentile(b) if !b.0.is_empty() => Value::Num(percentile(&b.0, b.1)),
            Acc::Distinct(s) => Value::Num(s.len() as f64),
            Acc::Set(s) => Value::Set(Arc::new((**s).clone())),
            Acc::First(v) | Acc::Last(v) => (**v).clone(),
            Acc::Rate(r) => r.result().map_or(Value::Null, Value::Num),
            Acc::Rates(by) => summed(by, Rate::result),
            Acc::Increases(by) => summed(by, Rate::increase),
            Acc::Derivs(by) => summed(by, Fit::slope),
            Acc::Predictions(p) => summed(&p.0, |f| f.predict(p.1)),
            _ => Value::Null,
        }
    }
}

/// Linear interpolation between the closest ranks (the "R-7" definition, as numpy's default).
#[cfg(test)]
#[test]
fn an_accumulator_is_24_bytes() {
    assert_eq!(std::mem::size_of::<Acc>(), 24);
}

pub fn percentile(values: &[f64], p: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    percentile_of_sorted(&sorted, p)
}

/// [`percentile`] of values already sorted.
pub fn percentile_of_sorted(sorted: &[f64], p: f64) -> f64 {
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The aggregate of `values`, one a second.
    fn run(agg: AggFunc, values: &[Value]) -> Value {
        let mut acc = Acc::new(agg, true);
        values.iter().zip(0..).for_each(|(v, i)| acc.add(v, i * 1000, 0));
        acc.result()
    }

    #[test]
    fn aggregates() {
        let nums: Vec<Value> = [4.0, 1.0, 3.0, 2.0].iter().map(|x| Value::Num(*x)).collect();
        assert_eq!(run(AggFunc::Sum, &nums), Value::Num(10.0));
        assert_eq!(run(AggFunc::Avg, &nums), Value::Num(2.5));
        assert_eq!(run(AggFunc::Min, &nums), Value::Num(1.0));
        assert_eq!(run(AggFunc::Max, &nums), Value::Num(4.0));
        assert_eq!(run(AggFunc::Percentile(50.0), &nums), Value::Num(2.5));
        assert_eq!(run(AggFunc::First, &nums), Value::Num(4.0));
        assert_eq!(run(AggFunc::Last, &nums), Value::Num(2.0));
        let Value::Num(sd) = run(AggFunc::Stddev, &nums) else { panic!("stddev of four numbers") };
        assert!((sd - 1.2910).abs() < 1e-4);
        let users = [Value::str("a"), Value::str("b"), Value::str("a"), Value::Null];
        assert_eq!(run(AggFunc::DistinctCount, &users), Value::Num(2.0));
        assert_eq!(run(AggFunc::Count, &users), Value::Num(3.0), "count(x) skips missing values");
        assert_eq!(Acc::new(AggFunc::Count, false).result(), Value::Num(0.0));
    }

    #[test]
    fn empty_windows_have_no_average() {
        assert_eq!(run(AggFunc::Avg, &[]), Value::Null);
        assert_eq!(run(AggFunc::Sum, &[]), Value::Num(0.0));
        assert_eq!(run(AggFunc::Stddev, &[Value::Num(1.0)]), Value::Null);
    }

    #[test]
    fn a_rate_is_per_second_and_survives_counter_resets() {
        let nums = |xs: &[f64]| xs.iter().map(|x| Value::Num(*x)).collect::<Vec<_>>();
        // 10 a second for 3 seconds.
        assert_eq!(run(AggFunc::Rate, &nums(&[100.0, 110.0, 120.0, 130.0])), Value::Num(10.0));
        // A restart after 120: the counter starts again from 0 and reaches 5; 20 + 5 in 3 s.
        let Value::Num(r) = run(AggFunc::Rate, &nums(&[100.0, 110.0, 120.0, 5.0])) else { panic!("a rate") };
        assert!((r - 25.0 / 3.0).abs() < 1e-12, "{r}");
        // A fall in the last bits, from adding up in floating point, is no change, not a reset.
        let last_bit = 23.529400000003587f64 - 23.529400000003584;
        assert!(last_bit > 0.0);
        let Value::Num(r) = run(AggFunc::Rate, &nums(&[23.5, 23.529400000003587, 23.529400000003584, 23.6])) else {
            panic!("a rate")
        };
        assert!((r - 0.1 / 3.0).abs() < 1e-9, "{r}");
        // Missing values are skipped; one sample, or none, has no rate.
        assert_eq!(run(AggFunc::Rate, &[Value::Num(1.0), Value::Null, Value::Num(5.0)]), Value::Num(2.0));
        assert_eq!(run(AggFunc::Rate, &nums(&[7.0])), Value::Null);
        let mut same_time = Acc::new(AggFunc::Rate, true);
        same_time.add(&Value::Num(1.0), 5, 0);
        same_time.add(&Value::Num(2.0), 5, 0);
        assert_eq!(same_time.result(), Value::Null);
    }

    #[test]
    fn counters_of_several_series_are_read_apart_and_summed() {
        // Two CPUs' idle seconds, interleaved: 1 and 0.5 a second. Read as one series, the
        // alternation would look like resets.
        let mut rate = Acc::new(AggFunc::Rate, true);
        let mut increase = Acc::new(AggFunc::Increase, true);
        for i in 0..5i64 {
            for (cpu, (base, per_s)) in [(1u64, (1000.0, 1.0)), (2, (10.0, 0.5))] {
                let v = Value::Num(base + per_s * i as f64 * 10.0);
                rate.add(&v, i * 10_000, cpu);
                increase.add(&v, i * 10_000, cpu);
            }
        }
        assert_eq!(rate.result(), Value::Num(1.5));
        assert_eq!(increase.result(), Value::Num(60.0));
        assert_eq!(Acc::new(AggFunc::Rate, true).result(), Value::Null, "no series, no rate");
    }

    #[test]
    fn a_line_through_a_gauge_gives_its_slope_and_where_it_is_headed() {
        // A filesystem losing 2 bytes a second from 1e12 (epoch milliseconds as times).
        let start = 1_765_000_000_000i64;
        let mut deriv = Acc::new(AggFunc::Deriv, true);
        let mut predict = Acc::new(AggFunc::PredictLinear(3600.0), true);
        for i in 0..=60i64 {
            let v = Value::Num(1e12 - 2.0 * i as f64 * 10.0);
            deriv.add(&v, start + i * 10_000, 7);
            predict.add(&v, start + i * 10_000, 7);
        }
        let Value::Num(slope) = deriv.result() else { panic!("a slope") };
        assert!((slope + 2.0).abs() < 1e-9, "{slope}");
        let Value::Num(ahead) = predict.result() else { panic!("a prediction") };
        let expected = 1e12 - 2.0 * 600.0 - 2.0 * 3600.0;
        assert!((ahead - expected).abs() < 1e-3, "{ahead} against {expected}");
        let mut one = Acc::new(AggFunc::Deriv, true);
        one.add(&Value::Num(5.0), start, 0);
        assert_eq!(one.result(), Value::Null, "one sample draws no line");
    }
}
