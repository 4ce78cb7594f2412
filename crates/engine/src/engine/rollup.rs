//! Roll-up: one alert for a host when unusually many of its series alert together.
//!
//! A host sends about a thousand series. Even a rule that alerts on a series once in five days
//! would page for such a host every few hours, and most of those alerts are a series being
//! itself. What an operator acts on is many series of one host turning anomalous at once (as
//! Netdata pages on a node's anomaly rate). A rule with `rollup by s.host` keeps its alerts per
//! series (they say what happened, at the rule's severity) and raises one more, at the roll-up's
//! severity, keyed by the host alone, when the series of the host that alerted within an hour
//! are unusually many for that host:
//!
//! - at least [`MIN_KEYS`] of them: one or two series are what the per-series alerts are for;
//! - more than in any hour of the host's past week: what the host does every day (a nightly
//!   job touching many series) is its normal;
//! - improbable for the host's own counts over that week: at their mean and variance (a Poisson
//!   count, or a negative binomial one when they vary more, as when a host's series alert
//!   together), at least that many in one hour has a chance below [`ALPHA`], so that a host
//!   whose hours are alike pages less than once in ten weeks;
//! - only once the host has been judged for a day ([`WARMUP_MS`]), so that its rate is known.
//!
//! The roll-up resolves when its hour ends. Its evidence is the series that alerted in it.

use super::keys::{Key, KeyMap};
use crate::alert::{alert_id, Alert, Evidence, Fields, Status};
use crate::event::Millis;
use serde_json::json;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// The length of the hours the alerts of a host are counted in.
pub const BUCKET_MS: Millis = 3_600_000;
/// How many past hours a host's usual count and rate come from: a week.
pub const HISTORY: i64 = 168;
/// How long a host is judged before its roll-up can fire.
pub const WARMUP_MS: Millis = 24 * BUCKET_MS;
/// The fewest keys alerting together that make a roll-up.
pub const MIN_KEYS: u32 = 3;
/// The chance of a count that high at the host's own rate below which it is unusual: a tenth
/// of a page per week of hours for a host whose series alert independently.
pub const ALPHA: f64 = 0.1 / HISTORY as f64;
/// The alerts of an hour a roll-up shows as its evidence, at most.
const EVIDENCE: usize = 32;

/// One host's count.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Host {
    /// When it was first judged, and last.
    first: Millis,
    last: Millis,
    /// The hour counted (its start over [`BUCKET_MS`]), and the keys that alerted in it.
    bucket: i64,
    count: u32,
    /// The first [`EVIDENCE`] of them: key, time and summary.
    alerted: Vec<(Key, Millis, String)>,
    /// Past hours with alerts, within [`HISTORY`] hours: (hour, count).
    history: VecDeque<(i64, u32)>,
}

/// What a checkpoint keeps: the hosts, and the firing roll-ups as JSON text.
pub type RollupState = (Vec<(Key, Host)>, Vec<(Key, String)>);

/// The roll-up of one rule.
pub struct Rollup {
    rule: Arc<str>,
    severity: Arc<str>,
    /// The key field gathered by, and its place in the rule's key.
    by: Arc<str>,
    position: usize,
    labels: Arc<BTreeMap<String, String>>,
    hosts: KeyMap<Host>,
    /// How many hosts there were after they were last pruned of those quiet for a week.
    pruned: usize,
    firing: KeyMap<Alert>,
}

impl Rollup {
    /// `position`: where `by` is in the rule's keys; `labels`: the rule's labels without holes.
    pub fn new(
        rule: Arc<str>,
        by: &str,
        severity: &str,
        position: usize,
        mut labels: BTreeMap<String, String>,
    ) -> Self {
        labels.insert("alertname".into(), rule.to_string());
        labels.insert("severity".into(), severity.to_string());
        labels.insert("rollup".into(), by.to_string());
        Rollup {
            rule,
            severity: severity.into(),
            by: by.into(),
            position,
            labels: Arc::new(labels),
            hosts: KeyMap::default(),
            pruned: 0,
            firing: KeyMap::default(),
        }
    }

    fn host_of(&self, key: &Key) -> Key {
        Key(key.0.get(self.position).cloned().into_iter().collect())
    }

    /// A key of the rule was judged at `t`: its host is known from then. Roll-ups whose hour
    /// has passed resolve, whichever host they are of.
    pub fn observed(&mut self, key: &Key, t: Millis, out: &mut Vec<Alert>) {
        let host = self.host_of(key);
        let bucket = t.div_euclid(BUCKET_MS);
        let entry = self.hosts.entry(host).or_insert_with(|| Host {
            first: t,
            last: t,
            bucket,
            count: 0,
            alerted: Vec::new(),
            history: VecDeque::new(),
        });
        entry.last = entry.last.max(t);
        if bucket > entry.bucket {
            roll(entry, bucket);
        }
        if !self.firing.is_empty() {
            let start = bucket * BUCKET_MS;
            let ended: Vec<Key> =
                self.firing.iter().filter(|(_, a)| a.starts_at < start).map(|(k, _)| k.clone()).collect();
            for host in ended {
                if let Some(mut alert) = self.firing.remove(&host) {
                    let end = alert.starts_at + BUCKET_MS;
                    alert.status = Status::Resolved;
                    alert.time = end;
                    alert.ends_at = Some(end);
                    out.push(alert);
                }
            }
        }
        if self.hosts.len() > 2 * self.pruned + 64 {
            let week = HISTORY * BUCKET_MS;
            self.hosts.retain(|_, h| t - h.last < week);
            self.pruned = self.hosts.len();
        }
    }

    /// An alert with this summary fired for `key` at `t` (judged just before,
    /// [`Rollup::observed`]).
    pub fn fired(&mut self, key: &Key, t: Millis, summary: String, out: &mut Vec<Alert>) {
        let host = self.host_of(key);
        let Some(h) = self.hosts.get_mut(&host) else { return };
        if h.alerted.iter().any(|(k, _, _)| k == key) {
            return;
        }
        h.count += 1;
        if h.alerted.len() < EVIDENCE {
            h.alerted.push((key.clone(), t, summary));
        }
        if self.firing.contains_key(&host) {
            return;
        }
        let Some(judged) = judge(h, t) else { return };
        let h = h.clone();
        let rollup = self.build(&host, &h, t, judged);
        self.firing.insert(host, rollup.clone());
        out.push(rollup);
    }

    fn build(&self, host: &Key, h: &Host, t: Millis, judged: Judged) -> Alert {
        let value = host.0.first().map(|v| v.to_json()).unwrap_or(serde_json::Value::Null);
        let key = Fields::new(vec![(self.by.clone(), value.clone())]);
        let text = match &value {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let summary = format!(
            "{} series of {text} alerted within an hour (at most {} in an hour of its past week, {:.2} expected)",
            h.count, judged.usual, judged.expected
        );
        let values = Fields::new(vec![
            (Arc::from("alerted"), json!(h.count)),
            (Arc::from("usual_most"), json!(judged.usual)),
            (Arc::from("expected"), json!(judged.expected)),
            (Arc::from("chance"), json!(judged.chance)),
        ]);
        let evidence: Vec<Evidence> = h
            .alerted
            .iter()
            .map(|(_, at, summary)| Evidence::Json(json!({"time": crate::event::format_time(*at), "summary": summary})))
            .collect();
        let start = h.bucket * BUCKET_MS;
        Alert {
            id: alert_id(&self.rule, &key, start),
            rule: self.rule.clone(),
            severity: self.severity.clone(),
            status: Status::Firing,
            time: t,
            starts_at: start,
            ends_at: None,
            detected_at: t,
            key,
            values,
            labels: self.labels.clone(),
            annotations: Arc::new(BTreeMap::from([("summary".to_string(), summary)])),
            evidence: evidence.into(),
        }
    }

    /// Hosts known, for the state estimate.
    pub fn state_bytes(&self) -> usize {
        let per_host: usize = self.hosts.values().map(|h| 96 + h.alerted.len() * 160 + h.history.len() * 16).sum();
        per_host + self.firing.len() * 2048
    }

    pub fn snapshot(&self) -> RollupState {
        let hosts = self.hosts.iter().map(|(k, h)| (k.clone(), h.clone())).collect();
        let firing =
            self.firing.iter().map(|(k, a)| (k.clone(), serde_json::to_string(a).unwrap_or_default())).collect();
        (hosts, firing)
    }

    pub fn restore(&mut self, (hosts, firing): RollupState) {
        self.hosts = hosts.into_iter().collect();
        self.pruned = self.hosts.len();
        self.firing = firing.into_iter().filter_map(|(k, text)| Some((k, serde_json::from_str(&text).ok()?))).collect();
    }
}

/// Why a host's hour is unusual.
struct Judged {
    usual: u32,
    expected: f64,
    chance: f64,
}

/// Moves a host's count on to hour `bucket`, keeping the hour that ended in its history.
fn roll(h: &mut Host, bucket: i64) {
    if h.count > 0 {
        h.history.push_back((h.bucket, h.count));
    }
    while h.history.front().is_some_and(|(b, _)| *b <= bucket - HISTORY) {
        h.history.pop_front();
    }
    h.bucket = bucket;
    h.count = 0;
    h.alerted.clear();
}

/// P(N >= k) for a count N of this mean and variance: negative binomial when the counts vary
/// more than a Poisson count would (the series of a host alert together more often than by
/// chance: a host's CPU series move as one), else Poisson.
fn tail(k: f64, mean: f64, variance: f64) -> f64 {
    let chance = if variance > mean {
        // Mean r(1-p)/p and variance r(1-p)/p^2; P(N <= k-1) = I_p(r, k), so
        // P(N >= k) = I_(1-p)(k, r).
        let p = mean / variance;
        let r = mean * mean / (variance - mean);
        statrs::function::beta::checked_beta_reg(k, r, 1.0 - p).ok()
    } else {
        // P(N >= k) for N ~ Poisson(mean): the regularised lower incomplete gamma.
        statrs::function::gamma::checked_gamma_lr(k, mean).ok()
    };
    chance.unwrap_or(1.0)
}

/// Whether the host's hour, as counted at `t`, is unusual (see the module's text).
fn judge(h: &Host, t: Millis) -> Option<Judged> {
    if h.count < MIN_KEYS || t - h.first < WARMUP_MS {
        return None;
    }
    let usual = h.history.iter().map(|(_, n)| *n).max().unwrap_or(0);
    if h.count <= usual {
        return None;
    }
    // The hours judged in the past week, with one alert more than seen: no host's rate is
    // known to be zero.
    let hours = (h.bucket - h.first.div_euclid(BUCKET_MS)).clamp(1, HISTORY) as f64;
    let (sum, squares) = h.history.iter().fold((0.0, 0.0), |(s, q), (_, n)| {
        let n = f64::from(*n);
        (s + n, q + n * n)
    });
    let expected = (sum + 1.0) / (hours + 1.0);
    let spread = (squares / hours - (sum / hours).powi(2)).max(0.0);
    let chance = tail(f64::from(h.count), expected, spread);
    (chance < ALPHA).then_some(Judged { usual, expected, chance })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Value;

    fn series(host: &str, name: &str) -> Key {
        Key(vec![Value::str(host), Value::str(name)])
    }

    /// Judges `names` of host `h` at `t`, the first `fire` of them alerting.
    fn hour(r: &mut Rollup, h: &str, t: Millis, fire: usize, out: &mut Vec<Alert>) {
        for i in 0..40 {
            let key = series(h, &format!("m{i}"));
            r.observed(&key, t, out);
            if i < fire {
                r.fired(&key, t, "a series".into(), out);
            }
        }
    }

    fn rollup() -> Rollup {
        Rollup::new("metric_deviation".into(), "s.host", "warning", 0, BTreeMap::new())
    }

    #[test]
    fn many_series_of_one_host_together_raise_one_alert_that_resolves_with_its_hour() {
        let mut r = rollup();
        let mut out = Vec::new();
        for h in 0..48 {
            hour(&mut r, "a", h * BUCKET_MS, usize::from(h % 6 == 0), &mut out);
        }
        assert!(out.is_empty(), "one series now and then: {out:?}");
        hour(&mut r, "a", 48 * BUCKET_MS + 60_000, 5, &mut out);
        hour(&mut r, "b", 48 * BUCKET_MS + 60_000, 5, &mut out);
        assert_eq!(out.len(), 1, "host b is not known for a day yet");
        let page = out[0].clone();
        assert_eq!(page.severity.as_ref(), "warning");
        assert_eq!(page.key.get("s.host"), Some(&json!("a")));
        // At the host's rate (9 alerts in 48 hours), 3 in an hour has a chance of about 1e-3,
        // 4 of about 5e-5: it fires with the fourth.
        assert_eq!(page.values.get("alerted"), Some(&json!(4)));
        assert_eq!(page.evidence.len(), 4);
        assert_eq!(page.labels.get("rollup").map(String::as_str), Some("s.host"));
        hour(&mut r, "a", 49 * BUCKET_MS, 0, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[1].status, Status::Resolved);
        assert_eq!(out[1].ends_at, Some(49 * BUCKET_MS));
        assert_eq!(out[1].id, page.id);
    }

    #[test]
    fn what_a_host_does_every_day_is_its_normal_and_its_spread_sets_the_bar() {
        let mut r = rollup();
        let mut out = Vec::new();
        // Every night at two, eight series alert together.
        for h in 0..24 * 8 {
            hour(&mut r, "a", h * BUCKET_MS, if h % 24 == 2 { 8 } else { 0 }, &mut out);
        }
        assert!(out.is_empty(), "eight every night: {out:?}");
        hour(&mut r, "a", (24 * 8 + 2) * BUCKET_MS, 40, &mut out);
        assert_eq!(out.len(), 1, "far more than any hour of its week");
        // Its hours vary far more than a Poisson count's (mean 0.33, variance 2.6): at that
        // spread, 22 in an hour is the first count rarer than ALPHA.
        assert_eq!(out[0].values.get("alerted"), Some(&json!(22)));
        assert_eq!(out[0].values.get("usual_most"), Some(&json!(8)));
    }

    #[test]
    fn a_checkpoint_keeps_the_counts_and_the_firing_roll_up() {
        let mut r = rollup();
        let mut out = Vec::new();
        for h in 0..30 {
            hour(&mut r, "a", h * BUCKET_MS, 0, &mut out);
        }
        hour(&mut r, "a", 30 * BUCKET_MS, 4, &mut out);
        assert_eq!(out.len(), 1);
        let bytes = postcard::to_stdvec(&r.snapshot()).unwrap();
        let mut restored = rollup();
        restored.restore(postcard::from_bytes(&bytes).unwrap());
        hour(&mut restored, "a", 30 * BUCKET_MS, 5, &mut out);
        assert_eq!(out.len(), 1, "the firing roll-up is known, the alerted series too");
        hour(&mut restored, "a", 31 * BUCKET_MS, 0, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[1].status, Status::Resolved);
    }
}
