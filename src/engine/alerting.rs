//! Turns lifecycle transitions of one rule into alert records.

use super::eval::{eval, Env};
use super::keys::Key;
use super::lifecycle::{Lifecycle, Transition};
use crate::alert::{alert_id, Alert, Evidence, Fields, Status};
use crate::event::Millis;
use crate::plan::{RulePlan, TemplatePiece};
use std::collections::BTreeMap;
use std::sync::Arc;

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
    /// What every alert of the rule shares: its name, severity, and the labels and annotations
    /// that have no template holes (`None` when they have some, and are rendered per alert).
    rule: Arc<str>,
    severity: Arc<str>,
    labels: Option<Arc<BTreeMap<String, String>>>,
    annotations: Option<Arc<BTreeMap<String, String>>>,
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
        Alerting {
            plan,
            key_names: sorted,
            value_names,
            lifecycle,
            firing: Default::default(),
            rule,
            severity,
            labels,
            annotations,
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
        self.lifecycle.active() * 160 + self.firing.len() * 2048
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
                let alert = self.build(key, &tr, env, evidence());
                self.firing.insert(key.clone(), alert.clone());
                out.push(alert);
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

    fn build(&self, key: &Key, tr: &Transition, env: &Env, evidence: Vec<Evidence>) -> Alert {
        let plan = &self.plan;
        let key_fields = Fields::new(
            self.key_names.iter().filter_map(|(name, i)| Some((name.clone(), key.0.get(*i)?.to_json()))).collect(),
        );
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

/// A rule's labels with the two every alert carries, which win over labels of the same name.
fn named(mut labels: BTreeMap<String, String>, rule: &str, severity: &str) -> BTreeMap<String, String> {
    labels.insert("alertname".into(), rule.to_string());
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
                TemplatePiece::Value(_) => None,
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
                    TemplatePiece::Value(e) => eval(e, env).to_text(),
                })
                .collect();
            (name.clone(), text)
        })
        .collect()
}
