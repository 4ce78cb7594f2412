//! Following one rule's judgements, for "why didn't it page?" (`vigil why`).
//!
//! A [`Trace`] set in the engine's settings makes the windowed operator that runs the rule note,
//! for each group it judges within a time range, the outcome of every test of the alert
//! condition and the number each test compared. A test is a leaf of the condition under `and`,
//! `or` and `not` (`p > 0.98`, `abs(z) > 6`, `cluster.outlier`). A test that compares a number
//! with a literal is a [`Threshold`]: [`holds_with`] re-evaluates the condition with one test's
//! outcome changed, which is how the smallest change of a threshold that would have fired the
//! rule is found without running it again.

use super::eval::{eval, Env};
use crate::event::{Millis, Value};
use std::sync::{Arc, Mutex};
use vigil_lang::ast::{BinOp, UnaryOp};
use vigil_lang::plan::{TExpr, TExprKind};

/// Which rule to follow, when, and where its judgements go.
#[derive(Debug, Clone)]
pub struct Trace {
    pub rule: String,
    /// The ends of the windows noted: from and to, inclusive.
    pub from: Millis,
    pub to: Millis,
    /// Only groups whose key, as alerts write it, contains this text.
    pub key_contains: Option<String>,
    points: Arc<Mutex<Vec<TracePoint>>>,
}

/// One group's judgement at the close of one window.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TracePoint {
    /// The group's key as alerts write it (`s.host=web-1 s.name=cpu`).
    #[serde(skip)]
    pub key: String,
    /// The end of the window judged.
    pub end: Millis,
    /// Whether the window had events: a scored rule does not judge a quiet one.
    pub active: bool,
    /// Each test's outcome, `None` when it read a missing value (a scorer still warming up).
    pub tests: Vec<Option<bool>>,
    /// Each test's number: the side a [`Threshold`] compares with its literal.
    pub values: Vec<Option<f64>>,
    /// Whether the condition held.
    pub held: bool,
    /// Whether the group was in its refractory period after an earlier alert.
    pub quiet: bool,
}

impl Trace {
    pub fn new(rule: &str, from: Millis, to: Millis, key_contains: Option<String>) -> Trace {
        Trace { rule: rule.to_string(), from, to, key_contains, points: Arc::default() }
    }

    /// The judgements noted so far, in the order they were made.
    pub fn take(&self) -> Vec<TracePoint> {
        std::mem::take(&mut *self.points.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub(crate) fn wants(&self, end: Millis) -> bool {
        (self.from..=self.to).contains(&end)
    }

    /// Notes a judgement of the group `key` (as alerts write it) under `condition` in `env`.
    pub(crate) fn note(&self, key: String, end: Millis, active: bool, condition: &TExpr, env: &Env, quiet: bool) {
        if self.key_contains.as_ref().is_some_and(|part| !key.contains(part.as_str())) {
            return;
        }
        let leaves = tests(condition);
        let values = leaves.iter().map(|t| number_side(t).and_then(|(side, _)| eval(side, env).as_f64())).collect();
        let tests: Vec<Option<bool>> = leaves
            .iter()
            .map(|t| match eval(t, env) {
                Value::Bool(b) => Some(b),
                _ => None,
            })
            .collect();
        let held = holds_with(condition, &tests) == Some(true);
        let point = TracePoint { key, end, active, tests, values, held, quiet };
        self.points.lock().unwrap_or_else(|e| e.into_inner()).push(point);
    }
}

/// The tests of a condition: its leaves under `and`, `or` and `not`, in order.
pub fn tests(condition: &TExpr) -> Vec<&TExpr> {
    fn walk<'a>(e: &'a TExpr, out: &mut Vec<&'a TExpr>) {
        match &e.kind {
            TExprKind::Binary(BinOp::And | BinOp::Or, a, b) => {
                walk(a, out);
                walk(b, out);
            }
            TExprKind::Unary(UnaryOp::Not, a) => walk(a, out),
            _ => out.push(e),
        }
    }
    let mut out = Vec::new();
    walk(condition, &mut out);
    out
}

/// A test that compares a number with a literal, written as `value op literal`: `abs(z) > 6`,
/// and `0.9 < p` as `p > 0.9`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    pub op: BinOp,
    pub literal: f64,
}

impl Threshold {
    /// Whether `value` passes the test with the literal `literal`.
    pub fn passes(&self, value: f64, literal: f64) -> bool {
        match self.op {
            BinOp::Gt => value > literal,
            BinOp::Ge => value >= literal,
            BinOp::Lt => value < literal,
            BinOp::Le => value <= literal,
            _ => false,
        }
    }

    /// Whether a larger literal makes the test harder to pass (`>` and `>=`).
    pub fn upper(&self) -> bool {
        matches!(self.op, BinOp::Gt | BinOp::Ge)
    }
}

/// Each test's threshold, for those that compare a number with a literal.
pub fn thresholds(condition: &TExpr) -> Vec<Option<Threshold>> {
    tests(condition).into_iter().map(|t| number_side(t).map(|(_, threshold)| threshold)).collect()
}

/// The side of a test compared with a numeric literal, and the test as a [`Threshold`].
fn number_side(test: &TExpr) -> Option<(&TExpr, Threshold)> {
    let TExprKind::Binary(op @ (BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge), a, b) = &test.kind else {
        return None;
    };
    match (&a.kind, &b.kind) {
        (TExprKind::Number(_), TExprKind::Number(_)) => None,
        (_, TExprKind::Number(n)) => Some((a, Threshold { op: *op, literal: *n })),
        (TExprKind::Number(n), _) => {
            let flipped = match op {
                BinOp::Lt => BinOp::Gt,
                BinOp::Le => BinOp::Ge,
                BinOp::Gt => BinOp::Lt,
                _ => BinOp::Le,
            };
            Some((b, Threshold { op: flipped, literal: *n }))
        }
        _ => None,
    }
}

/// The condition's outcome from its tests' outcomes, as the engine evaluates it: `and` and `or`
/// in three values, a missing value unknown.
pub fn holds_with(condition: &TExpr, outcomes: &[Option<bool>]) -> Option<bool> {
    fn walk(e: &TExpr, outcomes: &[Option<bool>], next: &mut usize) -> Option<bool> {
        match &e.kind {
            TExprKind::Binary(BinOp::And, a, b) => {
                let (x, y) = (walk(a, outcomes, next), walk(b, outcomes, next));
                match (x, y) {
                    (Some(false), _) | (_, Some(false)) => Some(false),
                    (Some(true), Some(true)) => Some(true),
                    _ => None,
                }
            }
            TExprKind::Binary(BinOp::Or, a, b) => {
                let (x, y) = (walk(a, outcomes, next), walk(b, outcomes, next));
                match (x, y) {
                    (Some(true), _) | (_, Some(true)) => Some(true),
                    (Some(false), Some(false)) => Some(false),
                    _ => None,
                }
            }
            TExprKind::Unary(UnaryOp::Not, a) => walk(a, outcomes, next).map(|b| !b),
            _ => {
                *next += 1;
                outcomes.get(*next - 1).copied().flatten()
            }
        }
    }
    walk(condition, outcomes, &mut 0)
}

/// The condition with the literal of test `test` (a [`Threshold`]) set to `literal`.
pub fn with_literal(condition: &TExpr, test: usize, literal: f64) -> TExpr {
    fn walk(e: &mut TExpr, test: usize, literal: f64, next: &mut usize) {
        match &mut e.kind {
            TExprKind::Binary(BinOp::And | BinOp::Or, a, b) => {
                walk(a, test, literal, next);
                walk(b, test, literal, next);
            }
            TExprKind::Unary(UnaryOp::Not, a) => walk(a, test, literal, next),
            TExprKind::Binary(_, a, b) => {
                if *next == test {
                    for side in [a, b] {
                        if let TExprKind::Number(n) = &mut side.kind {
                            *n = literal;
                        }
                    }
                }
                *next += 1;
            }
            _ => *next += 1,
        }
    }
    let mut changed = condition.clone();
    walk(&mut changed, test, literal, &mut 0);
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_lang::schema::Type;

    fn num(n: f64) -> TExpr {
        TExpr { ty: Type::Number, kind: TExprKind::Number(n) }
    }
    fn score(slot: usize) -> TExpr {
        TExpr { ty: Type::Number, kind: TExprKind::Score { slot, name: format!("s{slot}") } }
    }
    fn bin(op: BinOp, a: TExpr, b: TExpr) -> TExpr {
        TExpr { ty: Type::Bool, kind: TExprKind::Binary(op, Box::new(a), Box::new(b)) }
    }

    /// `(s0 > 0.98 and 3 < s1) or s2 >= 0.9`
    fn condition() -> TExpr {
        let left = bin(BinOp::And, bin(BinOp::Gt, score(0), num(0.98)), bin(BinOp::Lt, num(3.0), score(1)));
        bin(BinOp::Or, left, bin(BinOp::Ge, score(2), num(0.9)))
    }

    #[test]
    fn a_condition_is_judged_from_its_tests_in_three_values() {
        let c = condition();
        assert_eq!(tests(&c).len(), 3);
        assert_eq!(holds_with(&c, &[Some(true), Some(true), Some(false)]), Some(true));
        assert_eq!(holds_with(&c, &[Some(true), Some(false), Some(false)]), Some(false));
        assert_eq!(holds_with(&c, &[Some(true), None, Some(false)]), None);
        assert_eq!(holds_with(&c, &[None, Some(false), Some(true)]), Some(true));
    }

    #[test]
    fn thresholds_read_a_literal_on_either_side_and_can_be_changed() {
        let c = condition();
        let t = thresholds(&c);
        assert_eq!(t[0], Some(Threshold { op: BinOp::Gt, literal: 0.98 }));
        assert_eq!(t[1], Some(Threshold { op: BinOp::Gt, literal: 3.0 }));
        assert!(t[1].unwrap().passes(3.5, 3.0) && !t[1].unwrap().passes(2.5, 3.0));
        let changed = with_literal(&c, 1, 2.5);
        assert_eq!(thresholds(&changed)[1], Some(Threshold { op: BinOp::Gt, literal: 2.5 }));
        assert_eq!(thresholds(&changed)[0], t[0]);
        assert_eq!(thresholds(&changed)[2], t[2]);
    }
}
