//! Evaluation of checked expressions against events, window states, baselines and clusters.
//!
//! Evaluation never fails: a missing field, a window a group has not lived through, or an
//! operation without an answer (avg of nothing, division by zero) yields `Null`, and a condition
//! is met only when it is exactly `true`.

use crate::event::{Event, Value};
use regex::Regex;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use vigil_lang::ast::{BinOp, UnaryOp};
use vigil_lang::plan::{Func, SourcePlan, TExpr, TExprKind};

/// Closed windows of one group, newest first; each holds the state fields in plan order.
pub type History = Vec<Arc<[Value]>>;

/// Per-group outcome of a rule's cluster step.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterResult {
    pub outlier: bool,
    pub score: f64,
    pub median: f64,
    pub mean: f64,
    pub mad: f64,
    pub size: usize,
    /// The peer group's values (first dimension), sorted; at most [`MAX_PEERS`], evenly picked
    /// from the sorted values when there are more. Shared by the group's points.
    pub peers: Arc<[f64]>,
}

/// Peer values an outlier's evidence carries.
pub const MAX_PEERS: usize = 200;

/// What an expression can see.
#[derive(Clone, Copy)]
pub struct Env<'a> {
    pub sources: &'a [SourcePlan],
    /// The event bound to each source, by source index.
    pub events: &'a [Option<&'a Event>],
    /// The group's history of windows (fields in plan order, which expressions index).
    pub state: Option<&'a History>,
    pub baselines: Option<&'a BTreeMap<String, Value>>,
    pub cluster: Option<&'a ClusterResult>,
    pub regexes: &'a RegexCache,
    /// The values of a `score` block's slots computed so far.
    pub scores: Option<&'a [Value]>,
    /// A sequence partition's usual interval between events: its gaps' given quantile, in ms.
    pub intervals: Option<&'a dyn Fn(f64) -> Option<i64>>,
}

impl<'a> Env<'a> {
    /// An environment of events only: filters, sequence conditions, event-rule alerts.
    pub fn events(sources: &'a [SourcePlan], events: &'a [Option<&'a Event>], regexes: &'a RegexCache) -> Self {
        Env { sources, events, state: None, baselines: None, cluster: None, regexes, scores: None, intervals: None }
    }
}

/// Regexes of a rule set, compiled once when the rules load.
#[derive(Default, Debug)]
pub struct RegexCache(HashMap<String, Regex>);

impl RegexCache {
    /// Compiles every `=~` pattern in `e`. The checker has already rejected invalid ones.
    pub fn add_from(&mut self, e: &TExpr) {
        visit(e, &mut |e| {
            if let TExprKind::Binary(BinOp::Match, _, r) = &e.kind {
                if let TExprKind::Str(p) = &r.kind {
                    if !self.0.contains_key(p) {
                        if let Ok(re) = Regex::new(p) {
                            self.0.insert(p.clone(), re);
                        }
                    }
                }
            }
        });
    }
}

/// Calls `f` on `e` and every expression below it.
pub fn visit(e: &TExpr, f: &mut dyn FnMut(&TExpr)) {
    f(e);
    match &e.kind {
        TExprKind::List(items) | TExprKind::Call(_, items) => items.iter().for_each(|i| visit(i, f)),
        TExprKind::Unary(_, a) | TExprKind::Cardinality(a) => visit(a, f),
        TExprKind::Binary(_, a, b) | TExprKind::Lookup(a, b) => {
            visit(a, f);
            visit(b, f);
        }
        _ => {}
    }
}

/// A condition that only compares number fields of one event with number literals, joined by
/// `and` (`e.cpu > 0.9 and e.mem < 0.5`): the usual pattern filter, decided straight from the
/// event's fields instead of through values. It holds exactly when [`holds`] would: a missing
/// field or NaN makes a comparison unknown, and `and` holds only when both sides do.
#[derive(Debug, Clone)]
pub struct NumberTest(Vec<(usize, std::cmp::Ordering, bool, f64)>);

impl NumberTest {
    /// The test for `e` on events of `source`, if `e` is of that kind.
    pub fn new(e: &TExpr, source: usize) -> Option<NumberTest> {
        Self::over(e, &|x| match &x.kind {
            TExprKind::EventField { source: s, index, .. } if *s == source && *index != crate::event::TS_INDEX => {
                Some(*index)
            }
            _ => None,
        })
    }

    /// The same for a window rule's alert condition over the window that just closed
    /// (`ss.avg_cpu > 0.9`, `ss[0].n >= 10 and ss.max_mem < 0.5`): positions are the state's
    /// fields, read with [`NumberTest::holds_on_window`]. A rule set with many such rules over
    /// one shared state (thresholds per team or per tier) judges each group without the
    /// evaluator.
    pub fn of_window(e: &TExpr) -> Option<NumberTest> {
        Self::over(e, &|x| match &x.kind {
            TExprKind::StateField { ago: 0, index, .. } => Some(*index),
            _ => None,
        })
    }

    /// The comparisons of `e` of a number `field` (its position) with a number literal, joined
    /// by `and`; `None` if `e` has anything else.
    fn over(e: &TExpr, field: &dyn Fn(&TExpr) -> Option<usize>) -> Option<NumberTest> {
        fn collect(
            e: &TExpr,
            field: &dyn Fn(&TExpr) -> Option<usize>,
            out: &mut Vec<(usize, std::cmp::Ordering, bool, f64)>,
        ) -> Option<()> {
            use std::cmp::Ordering::{Greater, Less};
            let TExprKind::Binary(op, a, b) = &e.kind else { return None };
            if *op == BinOp::And {
                collect(a, field, out)?;
                return collect(b, field, out);
            }
            // (ordering that makes it true, whether equal also does), field on the left.
            let (ord, or_equal) = match op {
                BinOp::Lt => (Less, false),
                BinOp::Le => (Less, true),
                BinOp::Gt => (Greater, false),
                BinOp::Ge => (Greater, true),
                _ => return None,
            };
            let field = |x: &TExpr| field(x).filter(|_| x.ty == vigil_lang::schema::Type::Number);
            let number = |x: &TExpr| match x.kind {
                TExprKind::Number(n) => Some(n),
                _ => None,
            };
            match (field(a), number(b), number(a), field(b)) {
                (Some(i), Some(n), _, _) => out.push((i, ord, or_equal, n)),
                // `0.9 < e.cpu` is `e.cpu > 0.9`.
                (_, _, Some(n), Some(i)) => out.push((i, ord.reverse(), or_equal, n)),
                _ => return None,
            }
            Some(())
        }
        let mut tests = Vec::new();
        collect(e, field, &mut tests)?;
        Some(NumberTest(tests))
    }

    /// Whether a test made by [`NumberTest::of_window`] holds for a group's history.
    pub fn holds_on_window(&self, history: &History) -> bool {
        let window = history.first();
        self.holds_on(|index| number(window.and_then(|w| w.get(index))))
    }

    pub fn holds(&self, event: &Event) -> bool {
        self.holds_on(|index| number(event.fields.get(index)))
    }

    /// The field positions it reads, as bits.
    pub fn reads(&self) -> u64 {
        self.0.iter().fold(0, |bits, &(index, ..)| bits | 1u64.checked_shl(index as u32).unwrap_or(0))
    }

    /// Whether it holds for an event whose number at each position is `number(position)`
    /// (`None` where the field is missing or not a number).
    pub fn holds_on(&self, number: impl Fn(usize) -> Option<f64>) -> bool {
        self.0.iter().all(|&(index, ord, or_equal, n)| match number(index) {
            Some(x) => match x.partial_cmp(&n) {
                Some(std::cmp::Ordering::Equal) => or_equal,
                Some(o) => o == ord,
                None => false,
            },
            None => false,
        })
    }
}

/// A value that is a number, as a [`NumberTest`] reads it; anything else, or none, is unknown.
fn number(v: Option<&Value>) -> Option<f64> {
    match v {
        Some(Value::Num(x)) => Some(*x),
        _ => None,
    }
}

/// Whether a condition holds.
pub fn holds(e: &TExpr, env: &Env) -> bool {
    matches!(eval(e, env), Value::Bool(true))
}

pub fn eval(e: &TExpr, env: &Env) -> Value {
    match &e.kind {
        TExprKind::Number(n) => Value::Num(*n),
        TExprKind::Str(s) => Value::str(s),
        TExprKind::Bool(b) => Value::Bool(*b),
        TExprKind::Duration(ms) => Value::Dur(*ms as i64),
        TExprKind::EmptySet => Value::Set(Arc::new(BTreeSet::new())),
        TExprKind::List(items) => {
            // A list literal only appears on the right of `in`; it evaluates to its members.
            let members: BTreeSet<String> = items.iter().map(|i| eval(i, env).to_text()).collect();
            Value::Set(Arc::new(members))
        }
        TExprKind::EventField { source, index, .. } | TExprKind::EntityField { source, index, .. } => {
            match env.events.get(*source).copied().flatten() {
                Some(ev) => ev.value(*index),
                None => Value::Null,
            }
        }
        TExprKind::Entity { var, .. } => entity_identity(var, env),
        TExprKind::StateField { ago, index, .. } => state_value(env, *ago, *index),
        TExprKind::StateRange { from, to, index, .. } => {
            let mut out = Vec::with_capacity(to - from + 1);
            for ago in *from..=*to {
                match state_value(env, ago, *index) {
                    Value::Num(n) => out.push(n),
                    _ => return Value::Null,
                }
            }
            Value::List(Arc::new(out))
        }
        TExprKind::Baseline(name) => env.baselines.and_then(|b| b.get(name)).cloned().unwrap_or(Value::Null),
        TExprKind::Score { slot, .. } => env.scores.and_then(|s| s.get(*slot)).cloned().unwrap_or(Value::Null),
        TExprKind::Interval { quantile, .. } => {
            env.intervals.and_then(|f| f(*quantile)).map_or(Value::Null, Value::Dur)
        }
        TExprKind::ClusterField(field) => match env.cluster {
            None => Value::Null,
            Some(c) => match *field {
                "outlier" => Value::Bool(c.outlier),
                "score" => Value::Num(c.score),
                "median" => Value::Num(c.median),
                "mean" => Value::Num(c.mean),
                "mad" => Value::Num(c.mad),
                _ => Value::Num(c.size as f64),
            },
        },
        TExprKind::Call(func, args) => call(*func, args, env),
        TExprKind::Unary(UnaryOp::Not, a) => match eval(a, env) {
            Value::Bool(b) => Value::Bool(!b),
            _ => Value::Null,
        },
        TExprKind::Unary(UnaryOp::Neg, a) => match eval(a, env) {
            Value::Num(n) => Value::Num(-n),
            Value::Dur(d) => Value::Dur(-d),
            _ => Value::Null,
        },
        TExprKind::Binary(op, a, b) => binary(*op, a, b, env),
        TExprKind::Lookup(map, key) => match (eval(map, env), eval(key, env)) {
            (Value::Map(m), Value::Str(k)) => m.get(&*k).map_or(Value::Null, |v| Value::str(v)),
            _ => Value::Null,
        },
        TExprKind::Cardinality(a) => match eval(a, env) {
            Value::Set(s) => Value::Num(s.len() as f64),
            Value::List(l) => Value::Num(l.len() as f64),
            Value::Str(s) => Value::Num(s.chars().count() as f64),
            _ => Value::Null,
        },
    }
}

fn state_value(env: &Env, ago: usize, index: usize) -> Value {
    let Some(history) = env.state else { return Value::Null };
    history.get(ago).and_then(|w| w.get(index)).cloned().unwrap_or(Value::Null)
}

/// An entity compared as a whole is its key fields, read from an event that binds it.
fn entity_identity(var: &str, env: &Env) -> Value {
    for (i, src) in env.sources.iter().enumerate() {
        let binds = src.subject.1 == var || src.object.as_ref().is_some_and(|(_, v)| v == var);
        if let (true, Some(Some(ev))) = (binds, env.events.get(i)) {
            let parts: Vec<String> = src.key_positions(var).into_iter().map(|p| ev.value(p).to_text()).collect();
            return Value::str(&parts.join("\u{1f}"));
        }
    }
    Value::Null
}

fn call(func: Func, args: &[TExpr], env: &Env) -> Value {
    let vals: Vec<Value> = args.iter().map(|a| eval(a, env)).collect();
    let num = |i: usize| vals.get(i).and_then(Value::as_f64);
    let list = || match vals.first() {
        Some(Value::List(l)) => Some(l.clone()),
        _ => None,
    };
    let finite = |x: f64| if x.is_finite() { Value::Num(x) } else { Value::Null };
    match func {
        Func::Abs => num(0).map_or(Value::Null, |x| Value::Num(x.abs())),
        Func::Sqrt => num(0).map_or(Value::Null, |x| finite(x.sqrt())),
        Func::Ln => num(0).map_or(Value::Null, |x| finite(x.ln())),
        Func::Round => num(0).map_or(Value::Null, |x| Value::Num(x.round())),
        Func::Floor => num(0).map_or(Value::Null, |x| Value::Num(x.floor())),
        Func::Ceil => num(0).map_or(Value::Null, |x| Value::Num(x.ceil())),
        Func::Coalesce => vals.iter().find(|v| !v.is_null()).cloned().unwrap_or(Value::Null),
        Func::Lower | Func::Upper => match vals.first() {
            Some(Value::Str(s)) if func == Func::Lower => Value::str(&s.to_lowercase()),
            Some(Value::Str(s)) => Value::str(&s.to_uppercase()),
            _ => Value::Null,
        },
        Func::Min2 | Func::Max2 => match (&vals[..], func == Func::Min2) {
            ([Value::Dur(a), Value::Dur(b)], true) => Value::Dur(*a.min(b)),
            ([Value::Dur(a), Value::Dur(b)], false) => Value::Dur(*a.max(b)),
            _ => match (num(0), num(1)) {
                (Some(a), Some(b)) if func == Func::Min2 => Value::Num(a.min(b)),
                (Some(a), Some(b)) => Value::Num(a.max(b)),
                _ => Value::Null,
            },
        },
        Func::ListCount => list().map_or(Value::Null, |l| Value::Num(l.len() as f64)),
        Func::ListSum => list().map_or(Value::Null, |l| Value::Num(l.iter().sum())),
        Func::ListAvg => list().filter(|l| !l.is_empty()).map_or(Value::Null, |l| Value::Num(mean(&l))),
        Func::ListMin => list().and_then(|l| l.iter().copied().reduce(f64::min)).map_or(Value::Null, Value::Num),
        Func::ListMax => list().and_then(|l| l.iter().copied().reduce(f64::max)).map_or(Value::Null, Value::Num),
        Func::ListStddev => list().and_then(|l| sample_stddev(&l)).map_or(Value::Null, Value::Num),
    }
}

pub fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// Sample standard deviation (n - 1); undefined below two values.
pub fn sample_stddev(xs: &[f64]) -> Option<f64> {
    if xs.len() < 2 {
        return None;
    }
    let m = mean(xs);
    let var = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (xs.len() - 1) as f64;
    Some(var.sqrt())
}

fn binary(op: BinOp, a: &TExpr, b: &TExpr, env: &Env) -> Value {
    // `and` and `or` short-circuit; anything but a bool on the deciding side is unknown.
    match op {
        BinOp::And => {
            return match eval(a, env) {
                Value::Bool(false) => Value::Bool(false),
                Value::Bool(true) => match eval(b, env) {
                    Value::Bool(x) => Value::Bool(x),
                    _ => Value::Null,
                },
                _ => match eval(b, env) {
                    Value::Bool(false) => Value::Bool(false),
                    _ => Value::Null,
                },
            }
        }
        BinOp::Or => {
            return match eval(a, env) {
                Value::Bool(true) => Value::Bool(true),
                left => match (left, eval(b, env)) {
                    (_, Value::Bool(true)) => Value::Bool(true),
                    (Value::Bool(false), Value::Bool(false)) => Value::Bool(false),
                    _ => Value::Null,
                },
            }
        }
        _ => {}
    }
    let (x, y) = (eval(a, env), eval(b, env));
    if matches!(x, Value::Null) || matches!(y, Value::Null) {
        return Value::Null;
    }
    match op {
        BinOp::Eq => Value::Bool(equal(&x, &y)),
        BinOp::Ne => Value::Bool(!equal(&x, &y)),
        BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
            let ord = match (&x, &y) {
                (Value::Num(p), Value::Num(q)) => p.partial_cmp(q),
                (Value::Dur(p), Value::Dur(q)) | (Value::Time(p), Value::Time(q)) => Some(p.cmp(q)),
                (Value::Str(p), Value::Str(q)) => Some(p.cmp(q)),
                _ => None,
            };
            let Some(ord) = ord else { return Value::Null };
            Value::Bool(match op {
                BinOp::Lt => ord.is_lt(),
                BinOp::Le => ord.is_le(),
                BinOp::Gt => ord.is_gt(),
                _ => ord.is_ge(),
            })
        }
        BinOp::Match => match (&x, &y) {
            (Value::Str(s), Value::Str(p)) => {
                env.regexes.0.get(&**p).map_or(Value::Null, |re| Value::Bool(re.is_match(s)))
            }
            _ => Value::Null,
        },
        BinOp::Like => match (&x, &y) {
            (Value::Str(s), Value::Str(p)) => Value::Bool(glob(p, s)),
            _ => Value::Null,
        },
        BinOp::In | BinOp::NotIn => match &y {
            Value::Set(members) => {
                let found = members.contains(&x.to_text());
                Value::Bool(found == (op == BinOp::In))
            }
            _ => Value::Null,
        },
        BinOp::Union | BinOp::Diff | BinOp::Intersect => match (&x, &y) {
            (Value::Set(p), Value::Set(q)) => {
                let out: BTreeSet<String> = match op {
                    BinOp::Union => p.union(q).cloned().collect(),
                    BinOp::Diff => p.difference(q).cloned().collect(),
                    _ => p.intersection(q).cloned().collect(),
                };
                Value::Set(Arc::new(out))
            }
            _ => Value::Null,
        },
        BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Rem => arithmetic(op, &x, &y),
        BinOp::And | BinOp::Or => unreachable!("handled above"),
    }
}

fn equal(x: &Value, y: &Value) -> bool {
    match (x, y) {
        (Value::Num(p), Value::Num(q)) => p == q,
        _ => x == y,
    }
}

fn arithmetic(op: BinOp, x: &Value, y: &Value) -> Value {
    let num = |n: f64| if n.is_finite() { Value::Num(n) } else { Value::Null };
    match (op, x, y) {
        (BinOp::Add, Value::Num(p), Value::Num(q)) => num(p + q),
        (BinOp::Sub, Value::Num(p), Value::Num(q)) => num(p - q),
        (BinOp::Mul, Value::Num(p), Value::Num(q)) => num(p * q),
        (BinOp::Div, Value::Num(p), Value::Num(q)) => num(p / q),
        (BinOp::Rem, Value::Num(p), Value::Num(q)) => num(p % q),
        (BinOp::Add, Value::Dur(p), Value::Dur(q)) => Value::Dur(p.saturating_add(*q)),
        (BinOp::Sub, Value::Dur(p), Value::Dur(q)) => Value::Dur(p.saturating_sub(*q)),
        (BinOp::Add, Value::Time(t), Value::Dur(d)) => Value::Time(t.saturating_add(*d)),
        (BinOp::Sub, Value::Time(t), Value::Dur(d)) => Value::Time(t.saturating_sub(*d)),
        (BinOp::Sub, Value::Time(p), Value::Time(q)) => Value::Dur(p.saturating_sub(*q)),
        (BinOp::Mul, Value::Num(n), Value::Dur(d)) | (BinOp::Mul, Value::Dur(d), Value::Num(n)) => {
            let v = n * *d as f64;
            if v.is_finite() {
                Value::Dur(v as i64)
            } else {
                Value::Null
            }
        }
        (BinOp::Div, Value::Dur(p), Value::Dur(q)) if *q != 0 => Value::Num(*p as f64 / *q as f64),
        (BinOp::Div, Value::Dur(d), Value::Num(n)) if *n != 0.0 => Value::Dur((*d as f64 / n) as i64),
        _ => Value::Null,
    }
}

/// Glob match with `*` (any run) and `?` (one character), over characters, iteratively.
pub fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("*cpu*", "ec2_cpu_utilization"));
        assert!(glob("web-??", "web-01"));
        assert!(!glob("web-??", "web-1"));
        assert!(glob("*", ""));
        assert!(!glob("a*b", "acd"));
    }

    #[test]
    fn stddev_is_the_sample_one() {
        assert_eq!(sample_stddev(&[1.0]), None);
        let s = sample_stddev(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]).expect("defined");
        assert!((s - 2.138).abs() < 1e-3);
    }
}
