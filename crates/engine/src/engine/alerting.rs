//! Turns lifecycle transitions of one rule into alert records.

use super::eval::{eval, Env};
use super::keys::Key;
use super::lifecycle::{Lifecycle, Transition};
use super::rollup::{Rollup, RollupState};
use crate::alert::{alert_id, Alert, Evidence, Fields, Status};
use crate::event::Millis;
use crate::event::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use vigil_lang::ast::HoleFormat;
use vigil_lang::plan::{RulePlan, TemplatePiece};

/// What [`Alerting::snapshot`] saves.
pub type AlertingState = (Lifecycle<Key>, Vec<(Key, String)>);

/// The alerting side of one rule: its lifecycle per key, and the record of each firing alert,
/// which its resolution repeats (the values that made it fire, not the values at resolution).
pub struct Alerting {
    plan: Arc<RulePlan>,
    /// The key's names in sorted order (how the key is written, and hashed into the alert's
    /// id), each with its place in the key.
    key_names: Vec<(Arc<str>, usize)>,
    /// The names of the rule's `return` values.
    value_names: Vec<Arc<str>>,
    lifecycle: Lifecycle<Key>,
    firing: super::keys::KeyMap<Alert>,
    /// Keys in their refractory period, and until when: no new alert starts for them.
    quiet: super::keys::KeyMap<Millis>,
    /// How many keys `quiet` held after it was last pruned of the ones whose time is up.
    quiet_pruned: usize,
    /// What every alert of the rule shares: its name, severity, and the labels and annotations
    /// that have no template holes (`None` when they have some, and are rendered per alert).
    rule: Arc<str>,
    severity: Arc<str>,
    labels: Option<Arc<BTreeMap<String, String>>>,
    annotations: Option<Arc<BTreeMap<String, String>>>,
    /// With `rollup by`: the alerts of the keys gathered by one of their fields.
    rollup: Option<Rollup>,
}

impl Alerting {
    pub fn new(plan: Arc<RulePlan>, key_names: Vec<String>) -> Self {
        let lifecycle = Lifecycle::new(plan.alert.for_ms, plan.alert.keep_firing_for_ms);
        let rule: Arc<str> = plan.name.as_str().into();
        let severity: Arc<str> = plan.alert.severity.to_string().into();
        let labels = fixed_text(&plan.labels).map(|labels| Arc::new(named(labels, &rule, &severity)));
        let annotations = fixed_text(&plan.annotations).map(Arc::new);
        // Sorted, and of a name given twice the last, as a map of the names would have it.
        let mut sorted: Vec<(Arc<str>, usize)> =
            key_names.iter().enumerate().map(|(i, name)| (Arc::from(name.as_str()), i)).collect();
        sorted.reverse();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        sorted.dedup_by(|a, b| a.0 == b.0);
        let value_names = plan.returns.iter().map(|(name, _)| Arc::from(name.as_str())).collect();
        let rollup = plan.alert.rollup.as_ref().and_then(|r| {
            let position = key_names.iter().rposition(|n| *n == r.by)?;
            let labels = fixed_text(&plan.labels).unwrap_or_default();
            Some(Rollup::new(rule.clone(), &r.by, r.severity, position, labels))
        });
        Alerting {
            plan,
            key_names: sorted,
            value_names,
            lifecycle,
            firing: Default::default(),
            quiet: Default::default(),
            quiet_pruned: 0,
            rule,
            severity,
            labels,
            annotations,
            rollup,
        }
    }

    /// The lifecycle and the firing alerts, for a checkpoint. Alerts go as JSON text: they hold
    /// free-form JSON values, which a compact binary format cannot describe.
    pub fn snapshot(&self) -> AlertingState {
        let firing =
            self.firing.iter().map(|(k, a)| (k.clone(), serde_json::to_string(a).unwrap_or_default())).collect();
        (self.lifecycle.clone(), firing)
    }

    pub fn restore(&mut self, (lifecycle, firing): AlertingState) {
        self.lifecycle = lifecycle;
        self.firing = firing.into_iter().filter_map(|(k, text)| Some((k, serde_json::from_str(&text).ok()?))).collect();
    }

    /// The keys in their refractory period, for a checkpoint (kept apart from
    /// [`Alerting::snapshot`], whose form checkpoints of earlier builds have).
    pub fn quiet_snapshot(&self) -> Vec<(Key, Millis)> {
        self.quiet.iter().map(|(k, t)| (k.clone(), *t)).collect()
    }

    pub fn restore_quiet(&mut self, quiet: Vec<(Key, Millis)>) {
        self.quiet = quiet.into_iter().collect();
    }

    /// Whether the rule rolls its alerts up (`rollup by`).
    pub fn rolls_up(&self) -> bool {
        self.rollup.is_some()
    }

    /// The roll-up's state, for a checkpoint, if the rule has one.
    pub fn rollup_snapshot(&self) -> Option<RollupState> {
        self.rollup.as_ref().map(Rollup::snapshot)
    }

    pub fn restore_rollup(&mut self, state: Option<RollupState>) {
        if let (Some(r), Some(state)) = (&mut self.rollup, state) {
            r.restore(state);
        }
    }

    /// Whether a new alert for `key` would start within the refractory period of its last one.
    pub(crate) fn quieted(&self, key: &Key, t: Millis) -> bool {
        !self.quiet.is_empty() && !self.lifecycle.is_active(key) && self.quiet.get(key).is_some_and(|until| t < *until)
    }

    pub fn plan(&self) -> &Arc<RulePlan> {
        &self.plan
    }

    /// Keys with a pending or firing alert.
    pub fn active(&self) -> usize {
        self.lifecycle.active()
    }

    /// About what the lifecycle and the firing alerts take (an alert with its evidence is a
    /// few hundred bytes to a few kilobytes).
    pub fn state_bytes(&self) -> usize {
        self.lifecycle.active() * 160
            + self.firing.len() * 2048
            + self.quiet.len() * 96
            + self.rollup.as_ref().map_or(0, Rollup::state_bytes)
    }

    pub fn is_active(&self, key: &Key) -> bool {
        self.lifecycle.is_active(key)
    }

    /// Window rules: the condition for `key` is `holds` at `t`; `env` gives the alert's values.
    pub fn observe(
        &mut self,
        key: &Key,
        t: Millis,
        holds: bool,
        env: &Env,
        evidence: impl FnOnce() -> Vec<Evidence>,
        out: &mut Vec<Alert>,
    ) {
        let holds = holds && !self.quieted(key, t);
        if let Some(r) = &mut self.rollup {
            r.observed(key, t, out);
        }
        let transition = self.lifecycle.observe(key, t, holds);
        self.transition(key, transition, env, evidence, out);
    }

    /// Event rules: a match for `key` at `t`.
    pub fn matched(
        &mut self,
        key: &Key,
        t: Millis,
        env: &Env,
        evidence: impl FnOnce() -> Vec<Evidence>,
        out: &mut Vec<Alert>,
    ) {
        if self.quieted(key, t) {
            return;
        }
        let transition = self.lifecycle.matched(key, t);
        self.transition(key, transition, env, evidence, out);
    }

    fn transition(
        &mut self,
        key: &Key,
        transition: Option<Transition>,
        env: &Env,
        evidence: impl FnOnce() -> Vec<Evidence>,
        out: &mut Vec<Alert>,
    ) {
        match transition {
            Some(tr) if tr.status == Status::Firing => {
                let refractory = self.plan.alert.refractory_ms as Millis;
                if refractory > 0 {
                    if self.quiet.len() > 2 * self.quiet_pruned + 64 {
                        self.quiet.retain(|_, until| *until > tr.at);
                        self.quiet_pruned = self.quiet.len();
                    }
                    self.quiet.insert(key.clone(), tr.at.saturating_add(refractory));
                }
                let alert = self.build(key, &tr, env, evidence());
                let summary = alert.annotations.get("summary").cloned();
                self.firing.insert(key.clone(), alert.clone());
                out.push(alert);
                if let Some(r) = &mut self.rollup {
                    r.fired(key, tr.at, summary.unwrap_or_default(), out);
                }
            }
            Some(tr) => self.resolve(key, &tr, out),
            None => {}
        }
    }

    /// For event rules: resolve what has been quiet long enough by `now`.
    pub fn expire(&mut self, now: Millis, out: &mut Vec<Alert>) {
        for (key, tr) in self.lifecycle.expire(now) {
            self.resolve(&key, &tr, out);
        }
    }

    pub fn next_expiry(&self) -> Option<Millis> {
        self.lifecycle.next_expiry()
    }

    fn resolve(&mut self, key: &Key, tr: &Transition, out: &mut Vec<Alert>) {
        if let Some(mut alert) = self.firing.remove(key) {
            alert.status = Status::Resolved;
            alert.time = tr.at;
            alert.ends_at = Some(tr.at);
            out.push(alert);
        }
    }

    /// A key's values by name, as an alert of the rule shows them.
    fn key_fields(&self, key: &Key) -> Fields {
        Fields::new(
            self.key_names
                .iter()
                .filter_map(|(name, i)| Some((name, key.0.get(*i)?)))
                .filter(|(name, v)| !is_no_label_set(name, v))
                .map(|(name, v)| (name.clone(), v.to_json()))
                .collect(),
        )
    }

    /// A key as text, `name=value` by name: `s.host=web-1 s.name=cpu`.
    pub(crate) fn key_text(&self, key: &Key) -> String {
        self.key_fields(key).text()
    }

    fn build(&self, key: &Key, tr: &Transition, env: &Env, evidence: Vec<Evidence>) -> Alert {
        let plan = &self.plan;
        let key_fields = self.key_fields(key);
        let values = Fields::new(
            self.value_names
                .iter()
                .zip(&plan.returns)
                .map(|(name, (_, e))| (name.clone(), eval(e, env).to_json()))
                .collect(),
        );
        Alert {
            id: alert_id(&plan.name, &key_fields, tr.starts_at),
            rule: self.rule.clone(),
            severity: self.severity.clone(),
            status: Status::Firing,
            time: tr.at,
            starts_at: tr.starts_at,
            ends_at: None,
            detected_at: tr.at,
            key: key_fields,
            values,
            labels: self
                .labels
                .clone()
                .unwrap_or_else(|| Arc::new(named(render_all(&plan.labels, env), &self.rule, &self.severity))),
            annotations: self.annotations.clone().unwrap_or_else(|| Arc::new(render_all(&plan.annotations, env))),
            evidence: evidence.into(),
        }
    }
}

/// Whether a key value is a series' label set that is absent or empty: such a series is keyed
/// by its host and name alone, as alerts showed every series before labels were part of one.
fn is_no_label_set(name: &str, v: &Value) -> bool {
    name.ends_with(".labels")
        && match v {
            Value::Null => true,
            Value::Map(m) => m.is_empty(),
            _ => false,
        }
}

/// A rule's labels with the two every alert carries: `severity`, which wins over a label of
/// that name, and `alertname`, the rule's name unless its labels give one. A rule written for an
/// alert a team already routes and silences (the node-mixin's `NodeFilesystemAlmostOutOfSpace`,
/// at two severities) keeps its name in Alertmanager that way, while rule names stay unique.
fn named(mut labels: BTreeMap<String, String>, rule: &str, severity: &str) -> BTreeMap<String, String> {
    labels.entry("alertname".into()).or_insert_with(|| rule.to_string());
    labels.insert("severity".into(), severity.to_string());
    labels
}

/// Labels or annotations that have no template holes, rendered once for every alert.
fn fixed_text(templates: &[(String, Vec<TemplatePiece>)]) -> Option<BTreeMap<String, String>> {
    templates
        .iter()
        .map(|(name, pieces)| {
            let text = pieces.iter().map(|p| match p {
                TemplatePiece::Text(t) => Some(t.as_str()),
                TemplatePiece::Value(..) => None,
            });
            Some((name.clone(), text.collect::<Option<String>>()?))
        })
        .collect()
}

/// Labels or annotations with their template holes filled from `env`.
fn render_all(templates: &[(String, Vec<TemplatePiece>)], env: &Env) -> BTreeMap<String, String> {
    templates
        .iter()
        .map(|(name, pieces)| {
            let text = pieces
                .iter()
                .map(|p| match p {
                    TemplatePiece::Text(t) => t.clone(),
                    TemplatePiece::Value(e, format) => shown(&eval(e, env), *format),
                })
                .collect();
            (name.clone(), text)
        })
        .collect()
}

/// A value as a template hole shows it: numbers in the hole's format, anything else as text.
pub fn shown(v: &Value, format: HoleFormat) -> String {
    let n = match v {
        Value::Num(n) if n.is_finite() => *n,
        Value::Dur(ms) if format == HoleFormat::Duration => *ms as f64,
        other => return other.to_text(),
    };
    match format {
        HoleFormat::Default => significant(n, 4),
        HoleFormat::Raw => crate::event::format_number(n),
        HoleFormat::Decimals(d) => format!("{n:.*}", usize::from(d)),
        HoleFormat::Percent => format!("{}%", significant(n * 100.0, 4)),
        HoleFormat::Duration => {
            let text = vigil_lang::ast::human_duration(n.abs() as u64);
            if n < 0.0 {
                format!("-{text}")
            } else {
                text
            }
        }
        HoleFormat::Si => scaled(n, 1000.0, &["", "k", "M", "G", "T", "P", "E"]),
        HoleFormat::Bytes => scaled(n, 1024.0, &[" B", " KiB", " MiB", " GiB", " TiB", " PiB", " EiB"]),
    }
}

/// A number as alerts show it: four significant digits at most.
pub fn shown_number(n: f64) -> String {
    significant(n, 4)
}

/// `n` with `digits` significant digits at most (whole digits are never dropped), without
/// trailing zeros: 99.41599999999998 shows as 99.42, 0.000123456 as 0.0001235.
fn significant(n: f64, digits: i32) -> String {
    if n == 0.0 || (n.fract() == 0.0 && n.abs() < 1e15) {
        return crate::event::format_number(n);
    }
    let magnitude = n.abs().log10().floor() as i32 + 1;
    let decimals = (digits - magnitude).clamp(0, 15) as usize;
    let text = format!("{n:.decimals$}");
    let text = if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.') } else { &text };
    text.to_string()
}

/// `n` over the largest power of `base` it reaches, with that power's unit.
fn scaled(n: f64, base: f64, units: &[&str]) -> String {
    let mut v = n;
    let mut unit = 0;
    while v.abs() >= base && unit + 1 < units.len() {
        v /= base;
        unit += 1;
    }
    format!("{}{}", significant(v, 3), units[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holes_show_numbers_for_people() {
        let n = |x: f64| Value::Num(x);
        assert_eq!(shown(&n(99.41599999999998), HoleFormat::Default), "99.42");
        assert_eq!(shown(&n(12.0), HoleFormat::Default), "12");
        assert_eq!(shown(&n(123456.789), HoleFormat::Default), "123457");
        assert_eq!(shown(&n(0.000123456), HoleFormat::Default), "0.0001235");
        assert_eq!(shown(&n(99.41599999999998), HoleFormat::Raw), "99.41599999999998");
        assert_eq!(shown(&n(2.0 / 3.0), HoleFormat::Decimals(2)), "0.67");
        assert_eq!(shown(&n(0.9534), HoleFormat::Percent), "95.34%");
        assert_eq!(shown(&n(1_536_000.0), HoleFormat::Si), "1.54M");
        assert_eq!(shown(&n(1_610_612_736.0), HoleFormat::Bytes), "1.5 GiB");
        assert_eq!(shown(&n(5_400_000.0), HoleFormat::Duration), "1.5 h");
        assert_eq!(shown(&Value::Dur(90_000), HoleFormat::Duration), "1.5 min");
        assert_eq!(shown(&Value::str("m7"), HoleFormat::Decimals(2)), "m7");
        assert_eq!(shown(&n(f64::NAN), HoleFormat::Default), "NaN");
    }
}
