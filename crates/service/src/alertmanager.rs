//! Alerts to Alertmanager (`--alertmanager-url`), as Prometheus' notifier sends them: a JSON
//! array of alerts to `POST /api/v2/alerts` of every Alertmanager configured.
//!
//! What is sent is a state, not a log of transitions, as the alert generator compliance
//! specification has it: every firing alert is sent when it fires and again every resend delay,
//! with `endsAt` four resend delays ahead, so that Alertmanager resolves it if Vigil goes away;
//! a resolved one is sent with its end, and again for 15 minutes unless it fires again. Each
//! transition is sent as the writer stores and publishes it; each resend sends the firing
//! alerts the store has. So a restart of Vigil or of an Alertmanager loses no firing alert:
//! the next resend carries it, and Alertmanager deduplicates by labels. (The webhook's outbox
//! delivers every transition once; here a state is what Alertmanager wants, and a resend of it
//! from the store is as durable as an outbox without one to empty.)
//!
//! Where event time makes a rule of the specification mean something else: `startsAt` is when
//! the condition first held and `endsAt` of a resolved alert when it stopped holding, in event
//! time, which in a backfill lies in the past; the resend and the 15 minutes are wall-clock.
//! An always-firing `Watchdog` alert goes with every send, for a dead man's switch.

use super::store::{Store, Stored};
use super::telemetry::Telemetry;
use serde_json::{json, Map, Value as Json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::broadcast;
use vigil_engine::alert::{Alert, Status};
use vigil_engine::event::{format_time, now_ms, Millis};

/// How long a resolved alert is sent again.
const RESOLVED_RESEND: Duration = Duration::from_secs(15 * 60);
/// Alerts in one request, at most (Prometheus' `MaxBatchSize`).
const BATCH: usize = 64;
/// How soon a failed send is tried again, when the resend delay is longer.
const RETRY: Duration = Duration::from_secs(5);
/// How often a group member looks whether its keyed partitions changed.
const OWNERSHIP_CHECK: Duration = Duration::from_secs(1);

/// Where and how alerts go.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Alertmanagers' base URLs; each gets every alert.
    pub urls: Vec<String>,
    pub resend_delay: Duration,
    /// Labels every alert carries (unless it has them), telling one Vigil from another.
    pub external_labels: BTreeMap<String, String>,
    /// Where the console is, for `generatorURL`.
    pub external_url: String,
}

/// The alerts every Alertmanager reports silenced, by alert id, with the silences' ids: what
/// the console shows (`GET /api/v1/alertmanager/silenced`). Vigil keeps no silences itself.
#[derive(Default)]
pub struct Silences(std::sync::RwLock<BTreeMap<String, Vec<String>>>);

impl Silences {
    pub fn current(&self) -> BTreeMap<String, Vec<String>> {
        self.0.read().map(|s| s.clone()).unwrap_or_default()
    }

    fn set(&self, silenced: BTreeMap<String, Vec<String>>) {
        if let Ok(mut s) = self.0.write() {
            *s = silenced;
        }
    }
}

/// The keyed partitions a group member owns, as its loop keeps them.
pub type OwnedPartitions = Arc<std::sync::RwLock<Vec<i32>>>;

pub struct Notifier {
    pub settings: Settings,
    pub silences: Arc<Silences>,
    pub store: Store,
    pub published: broadcast::Receiver<Arc<Stored>>,
    pub telemetry: Arc<Telemetry>,
    pub client: reqwest::Client,
    /// In a group, the keyed partitions this member owns: it resends only their alerts, so that
    /// each alert reaches Alertmanager from one member, the one that would resolve it.
    pub owned_partitions: Option<OwnedPartitions>,
}

/// The alerts to send: firing ones, and resolved ones with when they were resolved here.
#[derive(Default)]
struct State {
    firing: HashMap<String, Alert>,
    resolved: HashMap<String, (Alert, Instant)>,
}

impl State {
    fn take(&mut self, alert: &Alert) {
        match alert.status {
            Status::Firing => {
                self.resolved.remove(&alert.id);
                self.firing.insert(alert.id.clone(), alert.clone());
            }
            Status::Resolved => {
                self.firing.remove(&alert.id);
                self.resolved.insert(alert.id.clone(), (alert.clone(), Instant::now()));
            }
        }
    }

    /// Everything to send now; resolved alerts past their 15 minutes are forgotten.
    fn all(&mut self) -> Vec<Alert> {
        self.resolved.retain(|_, (_, at)| at.elapsed() < RESOLVED_RESEND);
        self.firing.values().chain(self.resolved.values().map(|(a, _)| a)).cloned().collect()
    }
}

impl Notifier {
    /// Sends until `stop` turns true.
    pub async fn run(mut self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let started = now_ms();
        let mut state = State::default();
        let mut next = Instant::now();
        let mut known: Vec<i32> = Vec::new();
        loop {
            let mut changed = Vec::new();
            // A group member looks at its keyed partitions every second: one it took over has
            // firing alerts whose resends were its former owner's.
            let wake = match self.owned_partitions {
                Some(_) => next.min(Instant::now() + OWNERSHIP_CHECK),
                None => next,
            };
            tokio::select! {
                _ = tokio::time::sleep_until(wake.into()) => {}
                got = self.published.recv() => match got {
                    Ok(stored) => {
                        state.take(&stored.alert);
                        changed.push(stored.alert.clone());
                        // What else is already published goes in the same requests.
                        while let Ok(more) = self.published.try_recv() {
                            state.take(&more.alert);
                            changed.push(more.alert.clone());
                        }
                    }
                    // Missed some: the next resend, now, reads the store.
                    Err(broadcast::error::RecvError::Lagged(_)) => next = Instant::now(),
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = stop.changed() => return,
            }
            if let Some(owned) = &self.owned_partitions {
                let parts = owned.read().map(|p| p.clone()).unwrap_or_default();
                if parts != known {
                    known = parts;
                    next = Instant::now();
                }
            }
            let due = Instant::now() >= next;
            if due {
                self.load(&mut state).await;
            }
            let alerts = if due { state.all() } else { changed };
            if alerts.is_empty() && !due {
                continue;
            }
            let sent = self.send(&alerts, started).await;
            if due {
                self.read_silences().await;
            }
            if due || !sent {
                let wait = if sent { self.settings.resend_delay } else { self.settings.resend_delay.min(RETRY) };
                next = Instant::now() + wait;
            }
        }
    }

    /// The firing alerts as the store has them, which is what every resend sends: after a
    /// restart, after missed ones, and in a group, where another member may have resolved one
    /// (a member reads those of the keyed partitions it owns: a partition's new owner takes
    /// over its alerts' resends at its next resend).
    /// When the store cannot be read, what this instance has seen stands.
    async fn load(&self, state: &mut State) {
        let firing = match &self.owned_partitions {
            None => self.store.firing_alerts(usize::MAX).await,
            Some(owned) => {
                let parts = owned.read().map(|p| p.clone()).unwrap_or_default();
                self.store.firing_alerts_in(&parts).await
            }
        };
        match firing {
            Ok(alerts) => {
                let firing: HashMap<String, Alert> = alerts.into_iter().map(|a| (a.id.clone(), a)).collect();
                state.resolved.retain(|id, _| !firing.contains_key(id));
                self.telemetry.notifications.firing.set(firing.len() as i64);
                state.firing = firing;
            }
            Err(e) => {
                tracing::warn!(error = %e, "firing alerts could not be read for Alertmanager; resending those seen");
            }
        }
    }

    /// Asks every Alertmanager which of Vigil's alerts it holds silenced (by the alert id in
    /// their `generatorURL`); an alert is silenced when every one says so. When one cannot be
    /// asked, what was known stands.
    async fn read_silences(&self) {
        let mut every: Option<BTreeMap<String, Vec<String>>> = None;
        for url in &self.settings.urls {
            let target =
                format!("{}/api/v2/alerts?active=false&inhibited=false&unprocessed=false", url.trim_end_matches('/'));
            let answer = match self.client.get(&target).send().await {
                Ok(resp) if resp.status().is_success() => resp.json::<Vec<Json>>().await.ok(),
                _ => None,
            };
            let Some(alerts) = answer else { return };
            let mut here: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for alert in alerts {
                let id = alert["generatorURL"].as_str().and_then(|u| u.rsplit_once("?alert=")).map(|(_, id)| id);
                let by: Vec<String> = alert["status"]["silencedBy"]
                    .as_array()
                    .map(|s| s.iter().filter_map(|x| x.as_str().map(String::from)).collect())
                    .unwrap_or_default();
                if let (Some(id), false) = (id, by.is_empty()) {
                    here.entry(id.to_string()).or_default().extend(by);
                }
            }
            every = Some(match every {
                None => here,
                Some(mut so_far) => {
                    so_far.retain(|id, _| here.contains_key(id));
                    for (id, by) in so_far.iter_mut() {
                        by.extend(here.remove(id).unwrap_or_default());
                        by.sort();
                        by.dedup();
                    }
                    so_far
                }
            });
        }
        self.silences.set(every.unwrap_or_default());
    }

    /// Sends `alerts` and the watchdog to every Alertmanager; true when every one took them.
    async fn send(&self, alerts: &[Alert], started: Millis) -> bool {
        let now = now_ms();
        let ends = now + i64::try_from(self.settings.resend_delay.as_millis() * 4).unwrap_or(i64::MAX / 2);
        let mut bodies: Vec<Json> = alerts.iter().map(|a| self.body(a, ends)).collect();
        bodies.push(self.watchdog(started, ends));
        let mut all = true;
        for url in &self.settings.urls {
            for batch in bodies.chunks(BATCH) {
                all &= self.post(url, batch).await;
            }
        }
        all
    }

    async fn post(&self, url: &str, batch: &[Json]) -> bool {
        let target = format!("{}/api/v2/alerts", url.trim_end_matches('/'));
        let started = Instant::now();
        let result = self.client.post(&target).json(batch).send().await;
        let failure = match result {
            Ok(resp) if resp.status().is_success() => None,
            Ok(resp) => Some(format!("Alertmanager answered {}", resp.status())),
            Err(e) if e.is_timeout() => Some("Alertmanager timed out".to_string()),
            Err(e) => Some(format!("cannot reach Alertmanager: {}", crate::redact::error_chain(&e.without_url()))),
        };
        let am = crate::redact::redact(url);
        let t = &self.telemetry.notifications;
        t.latency.with_label_values(&[&am]).observe(started.elapsed().as_secs_f64());
        match failure {
            None => {
                t.sent.with_label_values(&[&am]).inc_by(batch.len() as u64);
                true
            }
            Some(error) => {
                t.errors.with_label_values(&[&am]).inc_by(batch.len() as u64);
                tracing::warn!(alertmanager = %am, %error, alerts = batch.len(), "alerts not sent to Alertmanager; sent again soon");
                false
            }
        }
    }

    /// An alert as Alertmanager takes it: a firing one ends at `ends` unless sent again.
    fn body(&self, a: &Alert, ends: Millis) -> Json {
        let labels = labels_of(a, &self.settings.external_labels);
        let ends_at = match a.status {
            Status::Firing => ends,
            Status::Resolved => a.ends_at.unwrap_or(a.time),
        };
        json!({
            "labels": labels,
            "annotations": a.annotations,
            "startsAt": format_time(a.starts_at),
            "endsAt": format_time(ends_at),
            "generatorURL": format!("{}/?alert={}", self.settings.external_url, a.id),
        })
    }

    /// The always-firing alert that says Vigil is alive.
    fn watchdog(&self, started: Millis, ends: Millis) -> Json {
        let mut labels = Map::new();
        labels.insert("alertname".into(), json!("Watchdog"));
        labels.insert("severity".into(), json!("none"));
        for (name, value) in &self.settings.external_labels {
            labels.entry(name.clone()).or_insert(Json::String(value.clone()));
        }
        json!({
            "labels": labels,
            "annotations": {"summary": "Vigil is running: this alert always fires, so that its absence pages (a dead man's switch)"},
            "startsAt": format_time(started),
            "endsAt": format_time(ends),
            "generatorURL": self.settings.external_url,
        })
    }
}

/// `NAME=VALUE`, NAME a label name Alertmanager takes.
pub fn parse_external_label(s: &str) -> Result<(String, String), String> {
    let (name, value) = s.split_once('=').ok_or_else(|| format!("`{s}`: expected NAME=VALUE"))?;
    let name = name.trim();
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!("`{name}`: a label name is letters, digits and `_`, not starting with a digit"));
    }
    Ok((name.to_string(), value.to_string()))
}

/// An alert's labels as Alertmanager and Prometheus' API show them: its own (`alertname`,
/// `severity`, the rule's), its key's values, and `external` labels, none over another before it.
pub fn labels_of(a: &Alert, external: &BTreeMap<String, String>) -> Map<String, Json> {
    let mut labels = Map::new();
    for (name, value) in a.labels.iter() {
        labels.insert(name.clone(), Json::String(value.clone()));
    }
    // The key's values tell one alert of a rule from another: Alertmanager tells alerts apart
    // by their labels alone.
    for (name, value) in a.key.iter() {
        let text = match value {
            Json::String(s) => s.clone(),
            Json::Object(m) => {
                m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default())).collect::<Vec<_>>().join(",")
            }
            other => other.to_string(),
        };
        labels.entry(label_name(name)).or_insert(Json::String(text));
    }
    for (name, value) in external {
        labels.entry(name.clone()).or_insert(Json::String(value.clone()));
    }
    labels
}

/// A key's name as a label name (`s.host` as `s_host`): Alertmanager's names are
/// `[a-zA-Z_][a-zA-Z0-9_]*`.
fn label_name(name: &str) -> String {
    let mut out: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    if out.chars().next().is_none_or(|c| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_names_become_label_names() {
        assert_eq!(label_name("s.host"), "s_host");
        assert_eq!(label_name("t.job_id"), "t_job_id");
        assert_eq!(label_name("9x"), "_9x");
        assert_eq!(label_name(""), "_");
    }

    #[test]
    fn external_labels_are_names_alertmanager_takes() {
        assert_eq!(parse_external_label("site=eu1"), Ok(("site".into(), "eu1".into())));
        assert_eq!(parse_external_label("replica=a=b"), Ok(("replica".into(), "a=b".into())));
        assert!(parse_external_label("9site=x").is_err());
        assert!(parse_external_label("si.te=x").is_err());
        assert!(parse_external_label("site").is_err());
    }
}
