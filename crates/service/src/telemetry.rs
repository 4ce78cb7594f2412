//! The service's own metrics, exported at `/metrics` in Prometheus' text format.
//!
//! Metrics are labelled by rule, stream or source, never by entity: a label per machine or task
//! would make the series count grow with the cluster.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

pub struct Telemetry {
    registry: Registry,
    pub events_in: IntCounterVec,
    pub malformed: IntCounterVec,
    pub late: IntCounterVec,
    pub alerts: IntCounterVec,
    pub eval_latency: Histogram,
    pub watermark_lag_ms: IntGauge,
    pub kafka_lag: IntGaugeVec,
    pub live_keys: IntGaugeVec,
    pub webhook: IntCounterVec,
    pub webhook_latency: Histogram,
    pub store_errors: IntCounterVec,
    pub rule_reloads: IntCounterVec,
    pub spooled: IntGauge,
    pub evicted: IntCounterVec,
    pub shed: IntCounterVec,
    pub samples: SampleMetrics,
    pub notifications: NotificationMetrics,
    pub state_bytes: IntGauge,
    pub checkpoint: CheckpointMetrics,
    /// Sources that hold event time back ([`super::event_time`]).
    pub live_sources: IntGauge,
    pub workers: IntGauge,
    pub partitions: IntGauge,
    /// Of a group member (`--kafka-join-group`).
    pub group: GroupMetrics,
    pub slow_streams: IntCounter,
    pub connections: IntGauge,
    pub connections_refused: IntCounter,
}

/// What the collectors' receivers (line protocol, remote-write) report.
pub struct SampleMetrics {
    /// Samples taken, by format.
    pub taken: IntCounterVec,
    /// Lines or series refused, by format and reason.
    pub rejected: IntCounterVec,
    /// Samples of an HA pair's replica that is not the one taken.
    pub ha_dropped: IntCounter,
    /// Samples sent again that were taken before.
    pub resent: IntCounter,
}

/// Alerts sent to Alertmanager ([`super::alertmanager`]), by Alertmanager, under the names of
/// Prometheus' notifier.
pub struct NotificationMetrics {
    /// The firing alerts this instance resends (in a group, those of its keyed partitions).
    pub firing: IntGauge,
    pub sent: IntCounterVec,
    pub errors: IntCounterVec,
    pub latency: HistogramVec,
}

impl NotificationMetrics {
    fn new(registry: &Registry) -> NotificationMetrics {
        let latency = histograms(
            registry,
            HistogramOpts::new("vigil_notifications_latency_seconds", "Time of one request to Alertmanager")
                .buckets(SECONDS.to_vec()),
            &["alertmanager"],
        );
        NotificationMetrics {
            firing: gauge(
                registry,
                "vigil_notifications_firing",
                "Firing alerts this instance resends to Alertmanager (a group member: those of its keyed partitions)",
            ),
            sent: counter(
                registry,
                "vigil_notifications_sent_total",
                "Alerts sent to Alertmanager (resends included), by Alertmanager",
                &["alertmanager"],
            ),
            errors: counter(
                registry,
                "vigil_notifications_errors_total",
                "Alerts that could not be sent to Alertmanager (sent again at the next resend), by Alertmanager",
                &["alertmanager"],
            ),
            latency,
        }
    }
}

impl SampleMetrics {
    fn new(registry: &Registry) -> SampleMetrics {
        SampleMetrics {
            taken: counter(
                registry,
                "vigil_samples_in_total",
                "Samples of the collectors' formats taken (influx, remote_write), by format",
                &["format"],
            ),
            rejected: counter(
                registry,
                "vigil_samples_rejected_total",
                "Lines (influx) or series (remote_write) refused, by format and reason: malformed, no_host, no_name, time_bounds, field",
                &["format", "reason"],
            ),
            ha_dropped: plain_counter(
                registry,
                "vigil_remote_write_ha_dropped_samples_total",
                "Samples of an HA pair's replica that is not the one taken (the elected replica's are)",
            ),
            resent: plain_counter(
                registry,
                "vigil_remote_write_resent_samples_total",
                "Remote-write samples sent again (no newer than their series' newest taken), dropped",
            ),
        }
    }
}

/// What a member of a shared consumer group reports.
pub struct GroupMetrics {
    /// Partitions assigned to this instance, by topic (the input topics and the keyed topic).
    pub owned_partitions: IntGaugeVec,
    pub rebalances: IntCounterVec,
    /// Time to restore one keyed partition's state from the store.
    pub restore_seconds: Histogram,
    /// Bytes of state restored, summed.
    pub restore_bytes: IntCounter,
    /// Writes refused because another instance owns the partition now.
    pub fenced: IntCounter,
    /// Alert transitions the keyed partitions hold while the writer's queue is full.
    pub held_alerts: IntGauge,
    /// Keyed partitions paused because they hold `--kafka-max-held-alerts`.
    pub held_back_partitions: IntGauge,
    /// Dead letters dropped because the dead-letter writer's queue stayed full.
    pub dead_letters_dropped: IntCounter,
    /// Partitions assigned here and paused until the store takes their claim, and revoked keyed
    /// partitions whose checkpoint waits.
    pub pending_partitions: IntGauge,
    pub leaving_partitions: IntGauge,
    /// Keyed partitions claimed without a checkpoint, paused while their history is read.
    pub warming_partitions: IntGauge,
    /// Records sent to the keyed topic (an event goes to each keyed partition of its keys).
    pub forwarded: IntCounter,
    /// Forwarded events the keyed partitions took (those sent again after a hand-over once).
    pub taken: IntCounter,
    /// Forwarded events, and summaries, a keyed partition had taken already (sent again after a
    /// hand-over).
    pub duplicates: IntCounter,
    /// Summaries of fleet-wide rules' windows sent to their stage two, and taken there.
    pub summaries: IntCounter,
    pub summaries_taken: IntCounter,
    /// Records of the keyed topic read and not taken, by reason.
    pub skipped: IntCounterVec,
}

impl GroupMetrics {
    fn new(registry: &Registry) -> GroupMetrics {
        let owned_partitions = IntGaugeVec::new(
            Opts::new("vigil_group_owned_partitions", "Partitions this instance owns in its consumer group, by topic"),
            &["topic"],
        )
        .expect("valid gauge");
        registry.register(Box::new(owned_partitions.clone())).expect("registered once");
        let restore_seconds = histogram(
            registry,
            HistogramOpts::new(
                "vigil_group_restore_seconds",
                "Time to restore one keyed partition's state from the store",
            )
            .buckets(vec![0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0]),
        );
        GroupMetrics {
            owned_partitions,
            rebalances: counter(
                registry,
                "vigil_group_rebalances_total",
                "Partitions assigned to or revoked from this instance, or lost by it, by kind",
                &["kind"],
            ),
            restore_seconds,
            restore_bytes: plain_counter(
                registry,
                "vigil_group_restore_bytes_total",
                "Bytes of state restored from the store",
            ),
            forwarded: plain_counter(
                registry,
                "vigil_group_forwarded_total",
                "Events sent on to the keyed topic, one per keyed partition of the event's keys",
            ),
            taken: plain_counter(
                registry,
                "vigil_group_taken_total",
                "Forwarded events the keyed partitions took (an event forwarded again after a hand-over counts once)",
            ),
            duplicates: plain_counter(
                registry,
                "vigil_group_duplicates_total",
                "Forwarded events and summaries a keyed partition had taken already (sent again after a hand-over), dropped",
            ),
            summaries: plain_counter(
                registry,
                "vigil_group_summaries_total",
                "Summaries of fleet-wide rules' windows sent by stage one to the keyed partition of their stage two",
            ),
            summaries_taken: plain_counter(
                registry,
                "vigil_group_summaries_taken_total",
                "Summaries stage two took (one sent again after a hand-over counts once, with the duplicates)",
            ),
            skipped: counter(
                registry,
                "vigil_group_skipped_total",
                "Records of the keyed topic read and not taken, by reason (not_owned, before_checkpoint: read again \
                 after a hand-over, no_header, unreadable)",
                &["reason"],
            ),
            dead_letters_dropped: plain_counter(
                registry,
                "vigil_group_dead_letters_dropped_total",
                "Dead letters a member dropped because the dead-letter writer's queue stayed full (the store down)",
            ),
            fenced: plain_counter(
                registry,
                "vigil_group_fenced_writes_total",
                "Writes refused because another instance owns the partition now",
            ),
            held_alerts: gauge(
                registry,
                "vigil_group_held_alerts",
                "Alert transitions the keyed partitions hold while the writer's queue is full",
            ),
            held_back_partitions: gauge(
                registry,
                "vigil_group_held_back_partitions",
                "Keyed partitions whose input is paused because they hold --kafka-max-held-alerts alerts the writer has no room for",
            ),
            pending_partitions: gauge(
                registry,
                "vigil_group_pending_partitions",
                "Partitions assigned to this instance and paused until the store takes their claim",
            ),
            leaving_partitions: gauge(
                registry,
                "vigil_group_leaving_partitions",
                "Keyed partitions revoked from this instance whose checkpoint is still to be stored",
            ),
            warming_partitions: gauge(
                registry,
                "vigil_group_warming_partitions",
                "Keyed partitions claimed by this instance without a checkpoint, paused while their history is read \
                 from Prometheus (--warm-from-prometheus)",
            ),
        }
    }
}

fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    let g = IntGauge::new(name, help).expect("valid gauge");
    registry.register(Box::new(g.clone())).expect("metric registered once");
    g
}

/// Buckets for the times of requests to Alertmanager, webhook calls and checkpoints.
const SECONDS: [f64; 9] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0];

/// What a checkpoint costs: the last one's size, and the time of each of its two steps,
/// `snapshot` (the engine's state serialised, on the engine's thread) and `store` (written and
/// committed).
pub struct CheckpointMetrics {
    pub bytes: IntGauge,
    pub seconds: HistogramVec,
}

impl CheckpointMetrics {
    fn new(registry: &Registry) -> Self {
        CheckpointMetrics {
            bytes: gauge(registry, "vigil_checkpoint_bytes", "Size of the last checkpoint of the engine's state"),
            seconds: histograms(
                registry,
                HistogramOpts::new("vigil_checkpoint_seconds", "Time of a checkpoint's steps: snapshot, store")
                    .buckets(SECONDS.to_vec()),
                &["step"],
            ),
        }
    }
}

fn histogram(registry: &Registry, opts: HistogramOpts) -> Histogram {
    let h = Histogram::with_opts(opts).expect("valid histogram");
    registry.register(Box::new(h.clone())).expect("metric registered once");
    h
}

fn histograms(registry: &Registry, opts: HistogramOpts, labels: &[&str]) -> HistogramVec {
    let h = HistogramVec::new(opts, labels).expect("valid histogram");
    registry.register(Box::new(h.clone())).expect("metric registered once");
    h
}

fn plain_counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid counter");
    registry.register(Box::new(c.clone())).expect("metric registered once");
    c
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric definition");
    registry.register(Box::new(c.clone())).expect("metric registered once");
    c
}

/// The reason label of a refused line or series of a collector's format.
pub fn reject_reason(e: &vigil_engine::event::DecodeError, host_field: &str) -> &'static str {
    match e.field.as_deref() {
        None => "malformed",
        Some("ts") => "time_bounds",
        Some("__name__") => "no_name",
        Some("labels") => "label_limits",
        Some(f) if f == host_field => "no_host",
        Some(_) => "field",
    }
}

/// The `reason` label of an OTLP data point refused for `e`.
pub fn otlp_reject_reason(e: &vigil_engine::event::DecodeError, host_attribute: &str) -> &'static str {
    match e.field.as_deref() {
        Some("name") => "no_name",
        Some("aggregationTemporality") => "delta",
        _ => reject_reason(e, host_attribute),
    }
}

impl Telemetry {
    pub fn new() -> Self {
        let registry = Registry::new();
        let eval_latency = histogram(
            &registry,
            HistogramOpts::new("vigil_eval_latency_seconds", "Time to evaluate one event against all rules")
                .buckets(vec![1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5]),
        );
        let webhook_latency = histogram(
            &registry,
            HistogramOpts::new("vigil_webhook_latency_seconds", "Time of one webhook call").buckets(SECONDS.to_vec()),
        );
        let watermark_lag_ms =
            gauge(&registry, "vigil_watermark_lag_milliseconds", "Wall clock minus the engine's watermark");
        let kafka_lag = IntGaugeVec::new(
            Opts::new("vigil_kafka_consumer_lag", "Messages behind the end of each partition"),
            &["topic", "partition"],
        )
        .expect("valid gauge");
        registry.register(Box::new(kafka_lag.clone())).expect("registered once");
        let live_keys = IntGaugeVec::new(
            Opts::new("vigil_live_keys", "Groups, partial matches and active alerts held per rule"),
            &["rule"],
        )
        .expect("valid gauge");
        registry.register(Box::new(live_keys.clone())).expect("registered once");
        let spooled = IntGauge::new("vigil_spooled_alerts", "Alerts kept on disk until the store takes them")
            .expect("valid gauge");
        registry.register(Box::new(spooled.clone())).expect("registered once");
        Telemetry {
            group: GroupMetrics::new(&registry),
            state_bytes: gauge(&registry, "vigil_state_bytes", "Estimated memory of the engine's state (--max-state-mb bounds it)"),
            checkpoint: CheckpointMetrics::new(&registry),
            live_sources: gauge(
                &registry,
                "vigil_event_time_sources",
                "Sources (partitions, files, pushed series) whose newest event time holds the engine's time back",
            ),
            workers: gauge(&registry, "vigil_workers", "Engine threads running the rules' keyed partitions (--workers)"),
            partitions: gauge(
                &registry,
                "vigil_partitions",
                "Keyed partitions splitting the rules' keys (--partitions at the first start, then the checkpoint's)",
            ),
            slow_streams: plain_counter(
                &registry,
                "vigil_stream_clients_dropped_total",
                "Alert stream clients dropped for reading too slowly",
            ),
            connections: gauge(&registry, "vigil_http_connections", "HTTP connections open"),
            connections_refused: plain_counter(
                &registry,
                "vigil_http_connections_refused_total",
                "HTTP connections refused over --max-connections",
            ),
            evicted: counter(
                &registry,
                "vigil_evicted_keys_total",
                "Keys and partial matches dropped, by rule and reason (cap: over the per-rule cap; idle: no event for the idle timeout)",
                &["rule", "reason"],
            ),
            shed: counter(
                &registry,
                "vigil_events_shed_total",
                "Events dropped under overload (overload policy `shed`), by source",
                &["source"],
            ),
            samples: SampleMetrics::new(&registry),
            notifications: NotificationMetrics::new(&registry),
            spooled,
            events_in: counter(&registry, "vigil_events_in_total", "Events taken in, by stream", &["stream"]),
            malformed: counter(
                &registry,
                "vigil_events_malformed_total",
                "Input that was not an event, by source",
                &["source"],
            ),
            late: counter(
                &registry,
                "vigil_events_late_total",
                "Events older than the watermark, by rule that would have used them",
                &["rule"],
            ),
            alerts: counter(
                &registry,
                "vigil_alerts_total",
                "Alerts fired, by rule and severity",
                &["rule", "severity"],
            ),
            webhook: counter(&registry, "vigil_webhook_deliveries_total", "Webhook attempts by outcome", &["outcome"]),
            store_errors: counter(&registry, "vigil_store_errors_total", "Failed store operations", &["operation"]),
            rule_reloads: counter(&registry, "vigil_rule_reloads_total", "Rule set reloads by outcome", &["outcome"]),
            registry,
            eval_latency,
            watermark_lag_ms,
            kafka_lag,
            live_keys,
            webhook_latency,
        }
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Telemetry {
    fn default() -> Self {
        Self::new()
    }
}

/// Something the service reports about itself: each says, in one place, what it logs and what
/// it counts (as Vector's internal events do), so that call sites name what happened and
/// metric names stay here.
pub trait InternalEvent {
    fn emit(self, telemetry: &Telemetry);
}

impl Telemetry {
    pub fn emit(&self, event: impl InternalEvent) {
        event.emit(self);
    }

    /// Adds to `vigil_evicted_keys_total` what `counts` (keys dropped so far, by rule and
    /// reason) holds beyond `seen`, the counts as last read, which it then keeps.
    pub fn count_evicted(
        &self,
        seen: &mut std::collections::BTreeMap<(String, &'static str), u64>,
        counts: std::collections::BTreeMap<(String, &'static str), u64>,
    ) {
        for ((rule, reason), n) in counts {
            let before = seen.insert((rule.clone(), reason), n).unwrap_or(0);
            if n > before {
                self.evicted.with_label_values(&[&rule, reason]).inc_by(n - before);
            }
        }
    }
}

/// A store operation failed; it is retried (alerts go to the spool meanwhile).
pub struct StoreFailed<'a> {
    pub operation: &'static str,
    pub error: &'a dyn std::fmt::Display,
}

impl InternalEvent for StoreFailed<'_> {
    fn emit(self, t: &Telemetry) {
        t.store_errors.with_label_values(&[self.operation]).inc();
        tracing::warn!(operation = self.operation, error = %self.error, "a store operation failed; it is retried");
    }
}

/// A group member dropped dead letters: the dead-letter writer's queue stayed full.
pub struct DeadLettersDropped {
    pub count: u64,
    /// Whether these are the first since the queue last had room: only those are logged.
    pub first: bool,
}

impl InternalEvent for DeadLettersDropped {
    fn emit(self, t: &Telemetry) {
        t.group.dead_letters_dropped.inc_by(self.count);
        if self.first {
            tracing::warn!(
                "the dead-letter queue is full (is the store down?): the oldest dead letters are dropped, and counted"
            );
        }
    }
}

/// The ingest log could not be written: the requests of the group were refused.
pub struct IngestLogFailed<'a> {
    pub dir: &'a std::path::Path,
    pub error: &'a std::io::Error,
}

impl InternalEvent for IngestLogFailed<'_> {
    fn emit(self, t: &Telemetry) {
        t.store_errors.with_label_values(&["ingest_log"]).inc();
        tracing::error!(dir = %self.dir.display(), error = %self.error, "cannot write the ingest log; requests refused");
    }
}

/// A webhook call: delivered, failed (retried later) or dead (after the last attempt).
pub struct WebhookCalled<'a> {
    pub delivery: i64,
    pub attempts: i64,
    pub seconds: f64,
    /// Why it failed, if it did, and whether it was the last attempt.
    pub failure: Option<(&'a str, bool)>,
}

impl InternalEvent for WebhookCalled<'_> {
    fn emit(self, t: &Telemetry) {
        t.webhook_latency.observe(self.seconds);
        match self.failure {
            None => t.webhook.with_label_values(&["delivered"]).inc(),
            Some((error, dead)) => {
                t.webhook.with_label_values(&[if dead { "dead" } else { "failed" }]).inc();
                let (delivery, attempts) = (self.delivery, self.attempts);
                tracing::warn!(delivery, attempts, dead, %error, "webhook delivery failed");
            }
        }
    }
}

/// An alert stream client left its buffer full too long and was dropped.
pub struct StreamClientDropped {
    pub last: i64,
}

impl InternalEvent for StreamClientDropped {
    fn emit(self, t: &Telemetry) {
        t.slow_streams.inc();
        tracing::info!(
            last = self.last,
            "an alert stream client reads too slowly; dropped (it resumes with Last-Event-ID)"
        );
    }
}

/// A new rule set applied (by a reload or through the API), or a reload rejected.
pub enum RulesChanged<'a> {
    Applied,
    Rejected(&'a dyn std::fmt::Display),
}

impl InternalEvent for RulesChanged<'_> {
    fn emit(self, t: &Telemetry) {
        match self {
            RulesChanged::Applied => t.rule_reloads.with_label_values(&["ok"]).inc(),
            RulesChanged::Rejected(error) => {
                t.rule_reloads.with_label_values(&["rejected"]).inc();
                tracing::error!("rules not reloaded, the running ones stay:\n{error}");
            }
        }
    }
}
