//! Webhook delivery in Alertmanager's format (version 4), from a persistent outbox.
//!
//! Each alert transition is stored with a delivery row in the same transaction, so an alert is
//! never lost while the receiver is down. A worker posts due deliveries, retries failures with
//! exponential backoff and jitter, and after [`MAX_ATTEMPTS`] marks a delivery dead (counted,
//! listed by the API, and redeliverable). Every call carries an `Idempotency-Key` header
//! (`<alert id>:<status>`), so a receiver can drop the duplicate that a crash between sending
//! and recording the delivery may cause.

use super::backoff::Backoff;
use super::store::Store;
use super::telemetry::{Telemetry, WebhookCalled};
use serde_json::{json, Value as Json};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use vigil_engine::alert::Alert;
use vigil_engine::event::format_time;

/// Backoff: the configured first wait, doubling, at most 5 minutes.
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// The body Alertmanager would send for this alert, as a group of one.
pub fn alertmanager_payload(a: &Alert, external_url: &str) -> Json {
    let ends_at = a.ends_at.map_or_else(|| "0001-01-01T00:00:00Z".to_string(), format_time);
    json!({
        "version": "4",
        "groupKey": format!("{{}}:{{alertname=\"{}\"}}", a.rule),
        "truncatedAlerts": 0,
        "status": a.status.as_str(),
        "receiver": "vigil",
        "groupLabels": { "alertname": a.rule },
        "commonLabels": a.labels,
        "commonAnnotations": a.annotations,
        "externalURL": external_url,
        "alerts": [{
            "status": a.status.as_str(),
            "labels": a.labels,
            "annotations": a.annotations,
            "startsAt": format_time(a.starts_at),
            "endsAt": ends_at,
            "generatorURL": format!("{external_url}/api/v1/alerts/{}", a.id),
            "fingerprint": a.id.get(..16).unwrap_or(&a.id),
        }],
    })
}

pub struct Deliverer {
    pub store: Store,
    pub url: String,
    pub client: reqwest::Client,
    pub wake: Arc<Notify>,
    pub telemetry: Arc<Telemetry>,
    pub settings: super::config::WebhookSettings,
    /// Whether other instances deliver from the same outbox (a shared consumer group): each
    /// then leases what it takes, so that a transition is sent by one of them.
    pub shared: bool,
}

use vigil_engine::event::now_ms;

/// Deliveries an instance of a shared group leases at once.
const CLAIMED: i64 = 16;

impl Deliverer {
    /// Delivers until `stop` turns true.
    pub async fn run(self, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            let wait = match self.deliver_due().await {
                Ok(()) => match self.store.outbox_next_due().await {
                    Ok(Some(due)) => Duration::from_millis((due - now_ms()).clamp(0, 5_000) as u64),
                    _ => Duration::from_secs(5),
                },
                Err(e) => {
                    tracing::warn!(error = %e, "webhook outbox unavailable");
                    Duration::from_secs(1)
                }
            };
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => return,
            }
        }
    }

    async fn deliver_due(&self) -> Result<(), super::store::StoreError> {
        loop {
            let due = if self.shared {
                // Long enough for every delivery of the batch to time out once.
                let lease = super::config::millis(self.settings.timeout) * (CLAIMED + 1);
                self.store.outbox_claim(now_ms(), CLAIMED, lease).await?
            } else {
                self.store.outbox_due(now_ms(), 64).await?
            };
            if due.is_empty() {
                return Ok(());
            }
            for item in due {
                let started = std::time::Instant::now();
                let result = self
                    .client
                    .post(&self.url)
                    .header("Content-Type", "application/json")
                    .header("Idempotency-Key", &item.idempotency_key)
                    .body(item.payload.clone())
                    .send()
                    .await;
                // Never the URL in the message: it is logged and stored, and a receiver's URL
                // often carries a token.
                let failure = match result {
                    Ok(resp) if resp.status().is_success() => None,
                    Ok(resp) => Some(format!("receiver answered {}", resp.status())),
                    Err(e) if e.is_timeout() => Some("receiver timed out".to_string()),
                    Err(e) => Some(format!("cannot reach receiver: {}", crate::redact::error_chain(&e.without_url()))),
                };
                let seconds = started.elapsed().as_secs_f64();
                let (delivery, attempts) = (item.seq, item.attempts + 1);
                match failure {
                    None => {
                        self.store.outbox_delivered(item.seq, now_ms()).await?;
                        self.telemetry.emit(WebhookCalled { delivery, attempts, seconds, failure: None });
                    }
                    Some(error) => {
                        let dead = attempts >= i64::from(self.settings.max_attempts);
                        let backoff = Backoff::new(self.settings.backoff, BACKOFF_MAX);
                        let wait = backoff.nth_with_jitter(u32::try_from(item.attempts).unwrap_or(u32::MAX));
                        let next = now_ms() + wait.as_millis() as i64;
                        self.store.outbox_failed(item.seq, next, &error, dead).await?;
                        let failure = Some((error.as_str(), dead));
                        self.telemetry.emit(WebhookCalled { delivery, attempts, seconds, failure });
                        // The receiver is failing; the others in this batch would most likely
                        // fail too. Wait for the backoff instead of hammering it.
                        return Ok(());
                    }
                }
            }
        }
    }
}
