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
    Rate(Box<Rate>),
}

/// `rate(x)` of a counter: how much it rose between the window's first and last samples, per
/// second between them. A fall is a reset (the process restarted and counts from 0 again), so
/// the sample after it counts whole, as PromQL's `rate` reads resets. Unlike PromQL's, the
/// increase is not extrapolated to the window's edges: it is the slope the samples show, the
/// same for a steady counter.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Rate {
    first_ts: Millis,
    last_ts: Millis,
    last: f64,
    increase: f64,
    samples: u32,
}

impl Rate {
    fn add(&mut self, x: f64, ts: Millis) {
        if self.samples == 0 {
            self.first_ts = ts;
        } else {
            self.increase += if x >= self.last { x - self.last } else { x };
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
            AggFunc::Rate => Acc::Rate(Box::default()),
        }
    }

    /// Adds one event's value of the aggregate's argument (`Null` for `count()`), at the
    /// event's time `ts` (events come in time order).
    pub fn add(&mut self, v: &Value, ts: Millis) {
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
        values.iter().zip(0..).for_each(|(v, i)| acc.add(v, i * 1000));
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
        // Missing values are skipped; one sample, or none, has no rate.
        assert_eq!(run(AggFunc::Rate, &[Value::Num(1.0), Value::Null, Value::Num(5.0)]), Value::Num(2.0));
        assert_eq!(run(AggFunc::Rate, &nums(&[7.0])), Value::Null);
        let mut same_time = Acc::new(AggFunc::Rate, true);
        same_time.add(&Value::Num(1.0), 5);
        same_time.add(&Value::Num(2.0), 5);
        assert_eq!(same_time.result(), Value::Null);
    }
}
