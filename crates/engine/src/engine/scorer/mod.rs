//! Streaming anomaly scorers: per-group state that a rule's `score` block feeds one value per
//! window in which the group had events, and that answers with a score.
//!
//! Every scorer reads only the values before the one it judges (no look-ahead), keeps a bounded
//! state, and skips what is not a finite number: a NaN, an infinity or a missing value gives no
//! score and leaves the state as it was, so one bad sample cannot poison a series.

mod change;
mod changepoint;
mod history;
mod knn;
mod likelihood;
mod novelty;
mod robust;
mod shift;
mod spot;

pub use history::History;
pub use likelihood::normal_cdf;

/// The most a surprise score (`spot`, `changepoint`: `-log10` of a tail probability) can be, and
/// what a value beyond a bounded tail's end scores: `P < 1e-16` is beyond what a fitted tail
/// can tell apart.
const MAX_SURPRISE: f64 = 16.0;

use super::eval::{eval, Env};
use crate::event::Value;
use serde_json::{json, Value as Json};
use std::collections::VecDeque;
use vigil_lang::ast::BinOp;
use vigil_lang::plan::{ScorePlan, ScoreStep, ScorerSpec, TExpr, TExprKind};

/// One scorer's state. The larger ones are boxed, so that a rule of small scorers
/// (`metric_stuck`'s) does not pay the largest's size in every slot of every series; a box
/// serialises as what it holds, so checkpoints are the same.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Scorer {
    RobustZ(robust::RobustZ),
    Knn(Box<knn::Knn>),
    Shift(Box<shift::Shift>),
    Likelihood(Box<likelihood::Likelihood>),
    Novelty(Box<novelty::Novelty>),
    Unchanged(change::Unchanged),
    ChangeRate(Box<change::ChangeRate>),
    Streak(change::Streak),
    Spot(Box<spot::Spot>),
    Changepoint(Box<changepoint::Changepoint>),
}

impl Scorer {
    pub fn new(spec: &ScorerSpec) -> Scorer {
        let n = |v: u32| v as usize;
        match *spec {
            ScorerSpec::RobustZ { window, warmup } => Scorer::RobustZ(robust::RobustZ::new(n(window), n(warmup))),
            ScorerSpec::Knn { dim, k, window, calibration } => {
                Scorer::Knn(Box::new(knn::Knn::new(n(dim), n(k), n(window), n(calibration))))
            }
            ScorerSpec::Shift { window, bins, warmup } => {
                Scorer::Shift(Box::new(shift::Shift::new(n(window), n(bins), n(warmup))))
            }
            ScorerSpec::Likelihood { short, long, warmup } => {
                Scorer::Likelihood(Box::new(likelihood::Likelihood::new(n(short), n(long), n(warmup))))
            }
            ScorerSpec::Novelty { window, warmup } => {
                Scorer::Novelty(Box::new(novelty::Novelty::new(n(window), n(warmup))))
            }
            ScorerSpec::Unchanged => Scorer::Unchanged(change::Unchanged::default()),
            ScorerSpec::ChangeRate { window } => Scorer::ChangeRate(Box::new(change::ChangeRate::new(n(window)))),
            ScorerSpec::Streak => Scorer::Streak(change::Streak::default()),
            ScorerSpec::Spot { level, warmup, peaks, risk } => {
                Scorer::Spot(Box::new(spot::Spot::new(n(level), n(warmup), n(peaks), n(risk))))
            }
            ScorerSpec::Changepoint { expected, runs, warmup } => {
                Scorer::Changepoint(Box::new(changepoint::Changepoint::new(n(expected), n(runs), n(warmup))))
            }
        }
    }

    /// How many of the series' recent values the scorer reads from its rule's shared history,
    /// for the scorers that read one.
    pub fn history_len(&self) -> Option<usize> {
        match self {
            Scorer::RobustZ(s) => Some(s.history_len()),
            Scorer::Knn(s) => Some(s.history_len()),
            _ => None,
        }
    }

    /// The score of `x`, if the scorer has learned enough to give one; a value that is not a
    /// finite number gives none and changes nothing. A scorer with a [`Scorer::history_len`]
    /// reads `history`, which has taken `x` already; without one it gives no score.
    pub fn update(&mut self, x: f64, history: Option<&History>) -> Option<f64> {
        if !x.is_finite() {
            return None;
        }
        let score = match self {
            Scorer::RobustZ(s) => s.update(x, history?),
            Scorer::Knn(s) => s.update(history?),
            Scorer::Shift(s) => s.update(x),
            Scorer::Likelihood(s) => s.update(x),
            Scorer::Novelty(s) => s.update(x),
            Scorer::Unchanged(s) => s.update(x),
            Scorer::ChangeRate(s) => s.update(x),
            Scorer::Streak(s) => s.update(x != 0.0),
            Scorer::Spot(s) => s.update(x),
            Scorer::Changepoint(s) => s.update(x),
        };
        // Finite values so large that their arithmetic overflows (inf - inf) give no score.
        score.filter(|s| !s.is_nan())
    }

    /// What the last value was compared with, for an alert's evidence.
    pub fn baseline(&self) -> Json {
        let num = |x: f64| Value::Num(x).to_json();
        match self {
            Scorer::RobustZ(s) => json!({ "median": num(s.median), "scale": num(s.scale) }),
            Scorer::Knn(s) => json!({ "nonconformity": num(s.alpha), "p_value": num(s.p_value) }),
            Scorer::Shift(s) => json!({ "divergence": num(s.statistic) }),
            Scorer::Likelihood(s) => json!({
                "recent_mean": num(s.recent_mean), "mean": num(s.mean), "deviation": num(s.deviation)
            }),
            Scorer::Novelty(s) => json!({ "low": num(s.low), "high": num(s.high) }),
            Scorer::Spot(s) => json!({
                "threshold": num(s.threshold), "shape": num(s.shape), "scale": num(s.scale), "tail_share": num(s.share)
            }),
            Scorer::Changepoint(s) => json!({
                "run_length": num(s.run_length), "centre": num(s.loc), "scale": num(s.scale)
            }),
            Scorer::Unchanged(_) | Scorer::ChangeRate(_) | Scorer::Streak(_) => Json::Null,
        }
    }

    /// What the scorer holds on the heap beyond its slot: a boxed scorer's record, and the
    /// capacity of its buffers.
    pub fn bytes(&self) -> usize {
        use std::mem::size_of_val;
        match self {
            Scorer::RobustZ(s) => s.bytes(),
            Scorer::Knn(s) => size_of_val(&**s) + s.bytes(),
            Scorer::Shift(s) => size_of_val(&**s) + s.bytes(),
            Scorer::Likelihood(s) => size_of_val(&**s) + s.bytes(),
            Scorer::Novelty(s) => size_of_val(&**s) + s.bytes(),
            Scorer::Unchanged(_) | Scorer::Streak(_) => 0,
            Scorer::ChangeRate(s) => size_of_val(&**s) + s.bytes(),
            Scorer::Spot(s) => size_of_val(&**s) + s.bytes(),
            Scorer::Changepoint(s) => size_of_val(&**s) + s.bytes(),
        }
    }
}

/// One group's scores for one rule: the scorers of its slots (`None` for expression slots), the
/// recent values they share, and every slot's value at the last window.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Scores {
    scorers: Vec<Option<Scorer>>,
    /// One history per input that scorers read recent values of: `knn(ss.v)` and
    /// `robust_z(ss.v)` keep `ss.v`'s values once.
    histories: Vec<History>,
    /// The history each slot's scorer reads, by index into `histories`.
    reads: Vec<Option<u16>>,
    pub values: Vec<Value>,
}

impl Scores {
    pub fn new(plan: &ScorePlan) -> Scores {
        let mut scorers = Vec::with_capacity(plan.slots.len());
        let mut reads = Vec::with_capacity(plan.slots.len());
        // Each distinct input read, with its history's index and length.
        let mut inputs: Vec<(&TExpr, usize)> = Vec::new();
        for slot in &plan.slots {
            let ScoreStep::Scorer(spec, _) = &slot.step else {
                scorers.push(None);
                reads.push(None);
                continue;
            };
            let scorer = Scorer::new(spec);
            let read = scorer.history_len().and_then(|len| {
                let input = slot.input();
                let at = inputs.iter().position(|(e, _)| *e == input).unwrap_or_else(|| {
                    inputs.push((input, 0));
                    inputs.len() - 1
                });
                inputs[at].1 = inputs[at].1.max(len);
                u16::try_from(at).ok()
            });
            scorers.push(Some(scorer));
            reads.push(read);
        }
        Scores {
            scorers,
            histories: inputs.iter().map(|(_, len)| History::new(*len)).collect(),
            reads,
            values: vec![Value::Null; plan.slots.len()],
        }
    }

    /// The window that just closed had events: every slot in order, each seeing the ones before.
    pub fn update(&mut self, plan: &ScorePlan, env: &Env) {
        for (i, slot) in plan.slots.iter().enumerate() {
            let value = {
                let env = Env { scores: Some(&self.values[..i]), ..*env };
                eval(slot.input(), &env)
            };
            self.values[i] = match (&slot.step, &mut self.scorers[i]) {
                (ScoreStep::Scorer(..), Some(scorer)) => {
                    // A condition feeds a scorer as 1 or 0 (`streak`).
                    let x = match value {
                        Value::Bool(b) => Some(f64::from(u8::from(b))),
                        v => v.as_f64(),
                    };
                    let history = self.reads[i].map(usize::from);
                    // Every reader of one input is given the same value: the first takes it.
                    let first = !self.reads[..i].contains(&self.reads[i]);
                    if let (Some(h), Some(x), true) = (history, x, first) {
                        self.histories[h].take(x);
                    }
                    let history = history.map(|h| &self.histories[h]);
                    x.and_then(|x| scorer.update(x, history)).map_or(Value::Null, Value::Num)
                }
                _ => value,
            };
        }
    }

    /// The window that just closed had no events: nothing is judged.
    pub fn clear(&mut self) {
        self.values.fill(Value::Null);
    }

    /// The scores, what each scorer compared with, and each test of the alert condition that
    /// reads a score with the two sides it compared, for an alert's evidence.
    pub fn evidence(&self, plan: &ScorePlan, condition: &TExpr, env: &Env) -> Json {
        let mut scores = serde_json::Map::new();
        let mut baselines = serde_json::Map::new();
        // A scorer named directly (`z := robust_z(..)`) is listed under that name.
        let named = |i: usize| {
            plan.slots.iter().find_map(|s| match (&s.name, &s.step) {
                (Some(n), ScoreStep::Expr(TExpr { kind: TExprKind::Score { slot, .. }, .. })) if *slot == i => {
                    Some(n.clone())
                }
                _ => None,
            })
        };
        for (i, (slot, value)) in plan.slots.iter().zip(&self.values).enumerate() {
            let name = slot.name.clone().or_else(|| named(i)).unwrap_or_else(|| format!("${i}"));
            if slot.name.is_some() {
                scores.insert(name.clone(), value.to_json());
            }
            if let (ScoreStep::Scorer(spec, input), Some(scorer)) = (&slot.step, &self.scorers[i]) {
                let baseline = scorer.baseline();
                let mut entry = json!({ "scorer": format!("{}({input})", spec.name()), "score": value.to_json() });
                if let (Json::Object(e), Json::Object(b)) = (&mut entry, baseline) {
                    e.extend(b);
                }
                baselines.insert(name, entry);
            }
        }
        let mut tests = Vec::new();
        thresholds(condition, env, &mut tests);
        json!({ "scores": scores, "scorers": baselines, "thresholds": tests })
    }

    /// How many values the scorers that keep recent values have learned from: what dropping
    /// the group would lose.
    pub fn learned(&self) -> u64 {
        self.histories.iter().map(History::taken).max().unwrap_or(0)
    }

    /// What the scores hold on the heap: their vectors' capacity, what each scorer and history
    /// holds, and the text of any text value. The record itself is in its group's slice.
    pub fn bytes(&self) -> usize {
        heap(&self.scorers)
            + self.scorers.iter().flatten().map(Scorer::bytes).sum::<usize>()
            + heap(&self.histories)
            + self.histories.iter().map(History::bytes).sum::<usize>()
            + heap(&self.reads)
            + heap(&self.values)
            + self.values.iter().map(|v| if let Value::Str(s) = v { text_bytes(s) } else { 0 }).sum::<usize>()
    }
}

/// The comparisons in `e` that read a score: `abs(z) > 6` as its text, the score side's value,
/// the threshold side's value and whether it held, so an alert says which test fired it.
fn thresholds(e: &TExpr, env: &Env, out: &mut Vec<Json>) {
    match &e.kind {
        TExprKind::Binary(BinOp::And | BinOp::Or, a, b) => {
            thresholds(a, env, out);
            thresholds(b, env, out);
        }
        TExprKind::Unary(_, a) => thresholds(a, env, out),
        TExprKind::Binary(BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::Eq | BinOp::Ne, a, b)
            if reads_score(a) || reads_score(b) =>
        {
            let (score, threshold) = if reads_score(a) { (a, b) } else { (b, a) };
            out.push(json!({
                "test": e.to_string(),
                "value": eval(score, env).to_json(),
                "threshold": eval(threshold, env).to_json(),
                "holds": eval(e, env) == Value::Bool(true),
            }));
        }
        _ => {}
    }
}

fn reads_score(e: &TExpr) -> bool {
    match &e.kind {
        TExprKind::Score { .. } => true,
        TExprKind::Call(_, args) => args.iter().any(reads_score),
        TExprKind::Unary(_, a) => reads_score(a),
        TExprKind::Binary(_, a, b) => reads_score(a) || reads_score(b),
        _ => false,
    }
}

#[cfg(test)]
mod tests;

/// A text's heap bytes: none when it is kept inline, else the text and its reference counts.
fn text_bytes(s: &smol_str::SmolStr) -> usize {
    if s.is_heap_allocated() {
        s.len() + 16
    } else {
        0
    }
}

/// What a collection holds on the heap: its capacity in elements, as the allocator sees it.
fn heap<C: Capacity>(c: &C) -> usize {
    c.capacity_bytes()
}

trait Capacity {
    fn capacity_bytes(&self) -> usize;
}

impl<T> Capacity for Vec<T> {
    fn capacity_bytes(&self) -> usize {
        self.capacity() * std::mem::size_of::<T>()
    }
}

impl<T> Capacity for VecDeque<T> {
    fn capacity_bytes(&self) -> usize {
        self.capacity() * std::mem::size_of::<T>()
    }
}
