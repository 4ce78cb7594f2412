//! "Why didn't it page?": a rule's judgements of the series of a past incident, the smallest
//! change of one of its thresholds that would have caught it, and what that change costs.
//!
//! The input (files, or a range of a team's Prometheus) is replayed through the one rule with
//! a [`Trace`] on: every window the rule judged within the incident's range, for the groups the
//! question names, with each test of its alert condition and the number it compared. From
//! these, for each test that compares a number with a literal, the literal closest to today's
//! that makes the condition hold in some judged window, the others unchanged ([`holds_with`]).
//! When no one literal does (a condition of several tests, each short in the incident), the
//! closest two that do together ([`pairs`]).
//! A change found so is only a candidate: an earlier alert it raises can put the series in its
//! refractory period through the incident. So each is checked by replaying the input again
//! with the changed rule, which also counts its alerts and pages over the whole input: the
//! change's cost, against the rule as written.

use crate::alert::{Alert, Status};
use crate::engine::config::EngineConfig;
use crate::engine::trace::{holds_with, tests, thresholds, with_literal, Threshold, Trace, TracePoint};
use crate::engine::Gate;
use crate::event::{Decoded, EventPool, Millis};
use crate::replay::Input;
use crate::replay::{replay_into, Quiet, ReplayOptions, Spans};
use crate::runtime::Runtime;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use vigil_lang::ast::BinOp;
use vigil_lang::plan::RulePlan;

/// Candidate changes checked by a replay each, smallest first.
const CHECKED: usize = 3;

/// What is asked: which windows, and which groups.
#[derive(Debug, Clone)]
pub struct Question {
    /// The incident: the ends of the windows looked at, inclusive.
    pub from: Millis,
    pub to: Millis,
    /// Only groups whose key (as alerts write it: `s.host=web-1 s.name=cpu`) contains this.
    pub key: Option<String>,
}

/// Opens the input anew for each replay, its events drawn from the gate's pool.
pub type Open<'a> = dyn FnMut(Gate, Rc<RefCell<EventPool>>) -> Result<Vec<Input<Decoded>>, String> + 'a;

/// The answer.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Answer {
    pub rule: String,
    pub condition: String,
    pub from: Millis,
    pub to: Millis,
    pub key: Option<String>,
    /// The condition's tests, in the order of each point's outcomes.
    pub tests: Vec<TestShown>,
    /// The groups judged in the range that the question names.
    pub groups: Vec<GroupAnswer>,
    /// Whether the rule as written alerted for a group named within the range.
    pub caught: bool,
    /// The smallest changes, each checked by a replay, smallest first.
    pub changes: Vec<Change>,
    /// Alerts and pages of the rule as written over the whole input.
    pub cost: Cost,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct TestShown {
    pub text: String,
    /// `>`, `>=`, `<` or `<=` with the literal, for a test that compares a number with one.
    pub op: Option<String>,
    pub threshold: Option<f64>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct GroupAnswer {
    pub key: String,
    pub points: Vec<TracePoint>,
    /// The rule's firing alerts of this group (and of its roll-up) in the range.
    pub alerts: Vec<Seen>,
    /// Why it did or did not alert, in words.
    pub verdict: String,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Seen {
    pub time: Millis,
    pub severity: String,
    pub key: String,
}

/// A threshold changed, and what the replay with it showed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Change {
    pub test: usize,
    pub text: String,
    pub from: f64,
    pub to: f64,
    /// The change relative to the threshold (or absolute, for a threshold of 0); the larger of
    /// the two when a second threshold moves too.
    pub relative: f64,
    /// A second threshold moved with the first, when no one alone makes the condition hold.
    pub also: Vec<Moved>,
    pub condition: String,
    /// The first alert of the changed rule for a named group within the range, if any.
    pub caught: Option<Seen>,
    /// If none: why, from the replay with the change.
    pub missed: Option<String>,
    pub cost: Cost,
}

/// A threshold moved beside a change's first.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Moved {
    pub test: usize,
    pub text: String,
    pub from: f64,
    pub to: f64,
}

impl Change {
    /// Each threshold the change moves, and its new literal: `(test, literal)`.
    pub fn literals(&self) -> impl Iterator<Item = (usize, f64)> + '_ {
        std::iter::once((self.test, self.to)).chain(self.also.iter().map(|m| (m.test, m.to)))
    }

    /// `condition` with the change's literals.
    pub fn applied(&self, condition: &vigil_lang::plan::TExpr) -> vigil_lang::plan::TExpr {
        self.literals().fold(condition.clone(), |c, (test, to)| with_literal(&c, test, to))
    }
}

/// A rule's alerts over a replay, against the series and hosts it read.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Cost {
    pub alerts: usize,
    /// Firing alerts of severity `critical`.
    pub pages: usize,
    pub series: usize,
    pub hosts: usize,
    /// Days of samples summed over series, and over hosts.
    pub series_days: f64,
    pub host_days: f64,
}

impl Cost {
    fn of(spans: &Spans, alerts: &[Alert]) -> Cost {
        Cost {
            alerts: alerts.len(),
            pages: alerts.iter().filter(|a| &*a.severity == "critical").count(),
            series: spans.series(),
            hosts: spans.hosts(),
            series_days: spans.series_days(),
            host_days: spans.host_days(),
        }
    }

    pub fn alerts_per_series_day(&self) -> f64 {
        self.alerts as f64 / self.series_days.max(f64::MIN_POSITIVE)
    }

    pub fn pages_per_host_week(&self) -> f64 {
        self.pages as f64 * 7.0 / self.host_days.max(f64::MIN_POSITIVE)
    }
}

/// Asks `question` of `plan` over the input `open` gives.
pub fn ask(plan: &RulePlan, question: &Question, options: &ReplayOptions, open: &mut Open) -> Result<Answer, String> {
    let condition = &plan.alert.condition;
    let shown: Vec<TestShown> = tests(condition)
        .iter()
        .zip(thresholds(condition))
        .map(|(t, th)| TestShown {
            text: t.to_string(),
            op: th.map(|th| op_text(th.op).to_string()),
            threshold: th.map(|th| th.literal),
        })
        .collect();
    let first = run(plan, question, options, open)?;
    let mut groups: BTreeMap<String, Vec<TracePoint>> = BTreeMap::new();
    for p in first.points {
        groups.entry(p.key.clone()).or_default().push(p);
    }
    let alerts = seen(&first.alerts, plan, question);
    let groups: Vec<GroupAnswer> = groups
        .into_iter()
        .map(|(key, points)| {
            let alerts: Vec<Seen> = alerts.iter().filter(|a| a.key == key || key.contains(&a.key)).cloned().collect();
            let verdict = verdict(&points, &alerts, &shown);
            GroupAnswer { key, points, alerts, verdict }
        })
        .collect();
    let caught = !alerts.is_empty();
    let mut changes = Vec::new();
    if !caught {
        let points: Vec<&TracePoint> = groups.iter().flat_map(|g| &g.points).collect();
        let mut found: Vec<Vec<(usize, f64, f64)>> =
            candidates(condition, &points).into_iter().map(|c| vec![c]).collect();
        if found.is_empty() {
            found = pairs(condition, &points).into_iter().map(Vec::from).collect();
        }
        for moved in found.into_iter().take(CHECKED) {
            let (test, from, to) = moved[0];
            let mut change = Change {
                test,
                text: shown[test].text.clone(),
                from,
                to,
                relative: moved.iter().map(|m| relative(m.1, m.2)).fold(0.0, f64::max),
                also: moved[1..]
                    .iter()
                    .map(|&(test, from, to)| Moved { test, text: shown[test].text.clone(), from, to })
                    .collect(),
                condition: String::new(),
                caught: None,
                missed: None,
                cost: Cost::default(),
            };
            let mut changed = plan.clone();
            changed.alert.condition = change.applied(condition);
            let rerun = run(&changed, question, options, open)?;
            let caught = seen(&rerun.alerts, &changed, question).into_iter().next();
            // Why a change that makes the condition hold still raised nothing.
            let missed = match caught {
                Some(_) => None,
                None => {
                    let held = rerun.points.iter().find(|p| p.held).or(rerun.points.first());
                    held.map(|h| {
                        let points: Vec<TracePoint> = rerun.points.iter().filter(|p| p.key == h.key).cloned().collect();
                        verdict(&points, &[], &shown)
                    })
                }
            };
            change.condition = changed.alert.condition.to_string();
            (change.caught, change.missed, change.cost) = (caught, missed, rerun.cost);
            changes.push(change);
        }
    }
    Ok(Answer {
        rule: plan.name.clone(),
        condition: condition.to_string(),
        from: question.from,
        to: question.to,
        key: question.key.clone(),
        tests: shown,
        groups,
        caught,
        changes,
        cost: first.cost,
    })
}

fn op_text(op: BinOp) -> &'static str {
    match op {
        BinOp::Gt => ">",
        BinOp::Ge => ">=",
        BinOp::Lt => "<",
        _ => "<=",
    }
}

fn relative(from: f64, to: f64) -> f64 {
    if from == 0.0 {
        (to - from).abs()
    } else {
        ((to - from) / from).abs()
    }
}

/// What one replay gave.
struct Run {
    points: Vec<TracePoint>,
    alerts: Vec<Alert>,
    cost: Cost,
}

/// Replays the input through `plan` alone, its judgements in the range noted.
fn run(plan: &RulePlan, question: &Question, options: &ReplayOptions, open: &mut Open) -> Result<Run, String> {
    let trace = Trace::new(&plan.name, question.from, question.to, question.key.clone());
    let config = EngineConfig { trace: Some(trace.clone()), ..options.engine.config() };
    let mut runtime = Runtime::new(vec![plan.clone()], config, 1, 1);
    let gate = runtime.gate();
    let pool = Rc::new(RefCell::new(EventPool::default()));
    let spans = Rc::new(RefCell::new(Spans::default()));
    let inputs = open(gate, pool.clone())?.into_iter().map(|input| input.noting(&spans)).collect();
    let mut alerts = Vec::new();
    let mut sink = |batch: &mut Vec<Alert>| {
        alerts.extend(batch.drain(..).filter(|a| a.status == Status::Firing));
        Ok(())
    };
    replay_into(&mut runtime, inputs, &pool, options, &mut sink, &mut Quiet).map_err(|e| e.to_string())?;
    let cost = Cost::of(&spans.borrow(), &alerts);
    let mut points = trace.take();
    points.sort_by(|a, b| (a.end, &a.key).cmp(&(b.end, &b.key)));
    Ok(Run { points, alerts, cost })
}

/// The rule's firing alerts within the range for the groups named (a roll-up's page names the
/// host alone, and counts when a named group's key has that host).
fn seen(alerts: &[Alert], plan: &RulePlan, question: &Question) -> Vec<Seen> {
    alerts
        .iter()
        .filter(|a| *a.rule == *plan.name && (question.from..=question.to).contains(&a.time))
        .map(|a| Seen { time: a.time, severity: a.severity.to_string(), key: a.key.text() })
        .filter(|s| question.key.as_ref().is_none_or(|k| s.key.contains(k.as_str()) || k.contains(&s.key)))
        .collect()
}

/// For each test that compares a number with a literal, the literal closest to its own that
/// makes the condition hold in one of `points` (the others' outcomes as they were), rounded to
/// one more decimal than the literal is written with: `(test, literal, changed)`, the smallest
/// relative change first.
pub fn candidates(condition: &vigil_lang::plan::TExpr, points: &[&TracePoint]) -> Vec<(usize, f64, f64)> {
    let mut out = Vec::new();
    for (test, threshold) in thresholds(condition).into_iter().enumerate() {
        let Some(th) = threshold else { continue };
        // The values at which forcing this test to pass makes the condition hold.
        let mut needed: Option<f64> = None;
        // A quiet window (a refractory period after an earlier alert) fires nothing.
        for p in points.iter().filter(|p| p.active && !p.quiet) {
            let Some(v) = p.values.get(test).copied().flatten() else { continue };
            let mut outcomes = p.tests.clone();
            outcomes[test] = Some(true);
            if holds_with(condition, &outcomes) != Some(true) {
                continue;
            }
            needed = Some(match needed {
                None => v,
                Some(n) if th.upper() => n.max(v),
                Some(n) => n.min(v),
            });
        }
        let Some(value) = needed else { continue };
        if th.passes(value, th.literal) {
            continue;
        }
        let literal = rounded_past(th, value);
        out.push((test, th.literal, literal));
    }
    out.sort_by(|a, b| relative(a.1, a.2).total_cmp(&relative(b.1, b.2)));
    out
}

/// A threshold to move: `(test, literal, changed)`.
pub type Moving = (usize, f64, f64);

/// When no one threshold suffices: for each two tests that compare a number with a literal, the
/// two literals closest to their own that make the condition hold together in one of `points`
/// where both tests failed (the others' outcomes as they were), rounded as [`candidates`]
/// rounds: `[(test, literal, changed); 2]`, the smallest larger relative change first.
pub fn pairs(condition: &vigil_lang::plan::TExpr, points: &[&TracePoint]) -> Vec<[Moving; 2]> {
    let limits = thresholds(condition);
    let mut out = Vec::new();
    for (i, a) in limits.iter().enumerate() {
        let Some(a) = *a else { continue };
        for (j, b) in limits.iter().enumerate().skip(i + 1) {
            let Some(b) = *b else { continue };
            let mut best: Option<(f64, [Moving; 2])> = None;
            for p in points.iter().filter(|p| p.active && !p.quiet) {
                let value = |t: usize| p.values.get(t).copied().flatten();
                let (Some(x), Some(y)) = (value(i), value(j)) else { continue };
                if a.passes(x, a.literal) || b.passes(y, b.literal) {
                    continue;
                }
                let mut outcomes = p.tests.clone();
                (outcomes[i], outcomes[j]) = (Some(true), Some(true));
                if holds_with(condition, &outcomes) != Some(true) {
                    continue;
                }
                let (to_a, to_b) = (rounded_past(a, x), rounded_past(b, y));
                let cost = relative(a.literal, to_a).max(relative(b.literal, to_b));
                if best.as_ref().is_none_or(|(c, _)| cost < *c) {
                    best = Some((cost, [(i, a.literal, to_a), (j, b.literal, to_b)]));
                }
            }
            out.extend(best);
        }
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out.into_iter().map(|(_, pair)| pair).collect()
}

/// The literal nearest `value` at one more decimal than `th`'s literal is written with, on the
/// side of `value` that makes the test pass.
fn rounded_past(th: Threshold, value: f64) -> f64 {
    let decimals = format!("{}", th.literal).split('.').nth(1).map_or(0, str::len) as i32 + 1;
    let step = 10f64.powi(-decimals);
    let mut literal = if th.upper() { (value / step).floor() * step } else { (value / step).ceil() * step };
    if !th.passes(value, literal) {
        literal += if th.upper() { -step } else { step };
    }
    // Printed as the decimals say, not as the float's binary remainder.
    format!("{literal:.*}", decimals.max(0) as usize).parse().unwrap_or(literal)
}

/// Why a group did or did not alert in the range, from its judgements.
fn verdict(points: &[TracePoint], alerts: &[Seen], tests: &[TestShown]) -> String {
    if let Some(a) = alerts.first() {
        return format!("alerted at {} ({})", crate::event::format_time(a.time), a.severity);
    }
    let judged: Vec<&TracePoint> = points.iter().filter(|p| p.active).collect();
    if judged.is_empty() {
        return "not judged: no window in the range had samples".into();
    }
    let held: Vec<&&TracePoint> = judged.iter().filter(|p| p.held).collect();
    if let Some(p) = held.iter().find(|p| p.quiet) {
        return format!(
            "the condition held at {}, but the group was in its refractory period after an earlier alert",
            crate::event::format_time(p.end)
        );
    }
    if let Some(p) = held.first() {
        return format!(
            "the condition held in {} window(s) from {}, but not for as long as the rule's `for`",
            held.len(),
            crate::event::format_time(p.end)
        );
    }
    let unknown: Vec<&str> = (0..tests.len())
        .filter(|&t| judged.iter().all(|p| p.tests.get(t).copied().flatten().is_none()))
        .map(|t| tests[t].text.as_str())
        .collect();
    if !unknown.is_empty() {
        return format!(
            "the condition never held; never known in the range (a scorer still warming up, or a missing value): {}",
            unknown.join(", ")
        );
    }
    // The window that failed fewest tests, and of those the one whose failed thresholds were
    // nearest (relative to each threshold).
    let distance = |p: &TracePoint| {
        let failed = p.tests.iter().filter(|t| **t != Some(true)).count();
        let gaps: f64 = (0..tests.len())
            .filter(|&t| p.tests.get(t).copied().flatten() == Some(false))
            .filter_map(|t| Some(relative(tests[t].threshold?, p.values.get(t).copied().flatten()?)))
            .sum();
        (failed, gaps)
    };
    let closest = judged
        .iter()
        .min_by(|a, b| {
            let ((fa, ga), (fb, gb)) = (distance(a), distance(b));
            fa.cmp(&fb).then(ga.total_cmp(&gb))
        })
        .expect("judged is not empty");
    let failed: Vec<String> = tests
        .iter()
        .zip(&closest.tests)
        .zip(&closest.values)
        .filter(|((_, outcome), _)| **outcome != Some(true))
        .map(|((t, _), v)| match v {
            Some(v) => format!("{} ({})", t.text, crate::engine::shown_number(*v)),
            None => t.text.clone(),
        })
        .collect();
    let quiet: Vec<&&TracePoint> = judged.iter().filter(|p| p.quiet).collect();
    let quiet = match quiet.last() {
        Some(last) => format!(
            "; {} of them in its refractory period after an earlier alert (the last at {})",
            quiet.len(),
            crate::event::format_time(last.end)
        ),
        None => String::new(),
    };
    format!(
        "the condition never held in {} judged window(s){quiet}; closest at {}, where these tests failed: {}",
        judged.len(),
        crate::event::format_time(closest.end),
        failed.join(", ")
    )
}

pub mod plot;
#[cfg(test)]
mod tests;
