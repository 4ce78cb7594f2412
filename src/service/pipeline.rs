//! The running pipeline: sources -> engine thread -> alert writer -> store, stream, webhook.
//!
//! Channels between the stages are bounded, so a slow store slows the engine and the engine
//! slows the sources (Kafka is then simply read later): nothing is dropped in between.

use super::store::{DeadLetter, Store, Stored};
use super::telemetry::Telemetry;
use crate::alert::{Alert, Status};
use crate::engine::Engine;
use crate::event::{Event, Millis};
use crate::plan::RulePlan;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, mpsc, oneshot, Notify};

/// Events waiting for the engine; sources block when it is full.
pub const INPUT_CAPACITY: usize = 16_384;
/// Batches of alerts waiting for the store.
const ALERT_CAPACITY: usize = 1_024;
/// Quiet time after which buffered events are released (the source is idle).
const IDLE: Duration = Duration::from_secs(1);

/// Sends [`Input::Tick`] to the engine until it stops.
pub async fn tick(tx: mpsc::Sender<Input>) {
    let mut interval = tokio::time::interval(Duration::from_millis(500));
    loop {
        interval.tick().await;
        if tx.send(Input::Tick).await.is_err() {
            return;
        }
    }
}

/// Where an event came from in Kafka; a checkpoint records the last of each partition.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Position {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// What the engine hands the writer: alerts, and now and then a checkpoint.
pub enum Output {
    Alerts(Vec<Alert>),
    /// The engine's snapshot and the next offset to read of each partition it covers.
    Checkpoint(Vec<u8>, Vec<Position>),
}

pub enum Input {
    Event(Event, Option<Position>),
    /// Sent twice a second; after a quiet second the newest buffered events are released.
    Tick,
    /// Replace the rules; the reply names the rules whose state was kept.
    Reload(Vec<RulePlan>, oneshot::Sender<Vec<String>>),
}

pub fn now_ms() -> Millis {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Runs the engine on its own thread until every input sender is gone. Alerts are stamped with
/// the wall-clock time of detection and handed to the writer.
///
/// Every `checkpoint_every` (and when the inputs close) the engine's state goes to the writer
/// behind the alerts it produced, so the store never holds a checkpoint ahead of its alerts.
pub fn spawn_engine(
    mut engine: Engine,
    mut rx: mpsc::Receiver<Input>,
    alerts: mpsc::Sender<Output>,
    telemetry: Arc<Telemetry>,
    checkpoint_every: Duration,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("vigil-engine".into())
        .spawn(move || {
            let mut out = Vec::new();
            let mut late_seen: BTreeMap<String, u64> = BTreeMap::new();
            let mut last_gauges = Instant::now();
            let mut last_event = Instant::now();
            let events_in: Vec<prometheus::IntCounter> =
                crate::schema::Stream::ALL.iter().map(|s| telemetry.events_in.with_label_values(&[s.name()])).collect();
            let mut positions: BTreeMap<(String, i32), i64> = BTreeMap::new();
            let mut last_checkpoint = Instant::now();
            let checkpoint = |engine: &Engine, positions: &BTreeMap<(String, i32), i64>| -> Option<Output> {
                match engine.snapshot().and_then(|s| s.to_bytes()) {
                    Ok(bytes) => {
                        let next = positions
                            .iter()
                            .map(|((topic, partition), offset)| Position {
                                topic: topic.clone(),
                                partition: *partition,
                                offset: offset + 1,
                            })
                            .collect();
                        Some(Output::Checkpoint(bytes, next))
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot snapshot the engine");
                        None
                    }
                }
            };
            while let Some(input) = rx.blocking_recv() {
                match input {
                    // The watermark trails the newest event, so the newest events wait for a
                    // newer one. When none comes for a second the stream is idle: release them.
                    Input::Tick if last_event.elapsed() >= IDLE => engine.flush(&mut out),
                    Input::Tick => {}
                    Input::Event(event, position) => {
                        if let Some(p) = position {
                            positions.insert((p.topic, p.partition), p.offset);
                        }
                        last_event = Instant::now();
                        events_in[event.stream as usize].inc();
                        let started = Instant::now();
                        let taken = engine.push(event, &mut out);
                        telemetry.eval_latency.observe(started.elapsed().as_secs_f64());
                        if !taken {
                            for (rule, n) in &engine.stats().late_by_rule {
                                let before = late_seen.insert(rule.clone(), *n).unwrap_or(0);
                                telemetry.late.with_label_values(&[rule]).inc_by(n - before);
                            }
                        }
                    }
                    Input::Reload(plans, reply) => {
                        let kept = engine.reload(plans);
                        let _ = reply.send(kept);
                    }
                }
                if !out.is_empty() {
                    let now = now_ms();
                    for a in &mut out {
                        a.detected_at = now;
                    }
                    if alerts.blocking_send(Output::Alerts(std::mem::take(&mut out))).is_err() {
                        return;
                    }
                }
                if last_checkpoint.elapsed() >= checkpoint_every {
                    last_checkpoint = Instant::now();
                    if let Some(c) = checkpoint(&engine, &positions) {
                        if alerts.blocking_send(c).is_err() {
                            return;
                        }
                    }
                }
                if last_gauges.elapsed() > Duration::from_secs(1) {
                    last_gauges = Instant::now();
                    for (rule, n) in engine.live_keys() {
                        telemetry.live_keys.with_label_values(&[&rule]).set(n as i64);
                    }
                    if let Some(w) = engine.watermark() {
                        telemetry.watermark_lag_ms.set(now_ms() - w);
                    }
                }
            }
            if let Some(c) = checkpoint(&engine, &positions) {
                let _ = alerts.blocking_send(c);
            }
        })
        .expect("the engine thread starts")
}

/// Shared state the writer keeps up to date for `/readyz`.
#[derive(Default)]
pub struct Health {
    pub store_ok: AtomicBool,
}

/// Stores alert batches, retrying while the store is down (which holds the engine back), then
/// publishes each newly stored transition to stream clients and wakes the webhook worker.
/// Checkpoints are stored in turn, and only then are their Kafka offsets committed: after a
/// crash the service resumes from the last checkpoint and reads again what came after it (the
/// alerts that come out twice are stored once, by id).
#[allow(clippy::too_many_arguments)]
pub async fn write_alerts(
    mut rx: mpsc::Receiver<Output>,
    consumer: Option<Arc<rdkafka::consumer::StreamConsumer>>,
    store: Store,
    published: broadcast::Sender<Arc<Stored>>,
    webhook: Option<String>,
    wake: Arc<Notify>,
    telemetry: Arc<Telemetry>,
    health: Arc<Health>,
) {
    while let Some(output) = rx.recv().await {
        let batch = match output {
            Output::Alerts(batch) => batch,
            Output::Checkpoint(bytes, positions) => {
                save_checkpoint(&store, &bytes, &positions, consumer.as_deref(), &telemetry).await;
                continue;
            }
        };
        let mut delay = Duration::from_millis(200);
        loop {
            let payload =
                |a: &Alert| super::webhook::alertmanager_payload(a, webhook.as_deref().unwrap_or_default()).to_string();
            let result = match &webhook {
                Some(_) => store.insert_alerts(&batch, Some(&payload)).await,
                None => store.insert_alerts(&batch, None).await,
            };
            match result {
                Ok(stored) => {
                    health.store_ok.store(true, Ordering::Relaxed);
                    for s in stored {
                        if s.alert.status == Status::Firing {
                            telemetry.alerts.with_label_values(&[&s.alert.rule, &s.alert.severity]).inc();
                        }
                        let _ = published.send(Arc::new(s));
                    }
                    wake.notify_one();
                    break;
                }
                Err(e) => {
                    health.store_ok.store(false, Ordering::Relaxed);
                    telemetry.store_errors.with_label_values(&["insert_alerts"]).inc();
                    tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "cannot store alerts; holding them");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
            }
        }
    }
}

async fn save_checkpoint(
    store: &Store,
    bytes: &[u8],
    positions: &[Position],
    consumer: Option<&rdkafka::consumer::StreamConsumer>,
    telemetry: &Telemetry,
) {
    let text = serde_json::to_string(positions).unwrap_or_else(|_| "[]".into());
    let mut delay = Duration::from_millis(200);
    while let Err(e) = store.save_checkpoint(bytes, &text, now_ms()).await {
        telemetry.store_errors.with_label_values(&["save_checkpoint"]).inc();
        tracing::warn!(error = %e, "cannot store the checkpoint; retrying");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(10));
    }
    if let (Some(consumer), false) = (consumer, positions.is_empty()) {
        use rdkafka::consumer::{CommitMode, Consumer};
        let mut list = rdkafka::TopicPartitionList::new();
        for p in positions {
            let _ = list.add_partition_offset(&p.topic, p.partition, rdkafka::Offset::Offset(p.offset));
        }
        if let Err(e) = consumer.commit(&list, CommitMode::Async) {
            tracing::warn!(error = %e, "cannot commit Kafka offsets; the next checkpoint will");
        }
    }
}

/// Writes dead letters; they are kept even while the engine is busy.
pub async fn write_dead_letters(mut rx: mpsc::Receiver<DeadLetter>, store: Store, telemetry: Arc<Telemetry>) {
    while let Some(d) = rx.recv().await {
        telemetry.malformed.with_label_values(&[&d.source]).inc();
        let mut delay = Duration::from_millis(200);
        while let Err(e) = store.insert_dead_letter(&d).await {
            telemetry.store_errors.with_label_values(&["insert_dead_letter"]).inc();
            tracing::warn!(error = %e, "cannot store a dead letter; retrying");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(10));
        }
    }
}

/// Feeds a recorded file into the running service, reporting malformed lines as dead letters.
pub fn replay_file(
    path: std::path::PathBuf,
    tx: mpsc::Sender<Input>,
    dead: mpsc::Sender<DeadLetter>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let input = match crate::input::open(&path, crate::input::Format::Auto, &crate::input::InputOptions::default())
        {
            Ok(i) => i,
            Err(e) => {
                tracing::error!(file = %path.display(), error = %e, "cannot replay");
                return;
            }
        };
        let name = input.name.clone();
        let mut n = 0u64;
        for record in input.records {
            match record.event {
                Ok(e) => {
                    if tx.blocking_send(Input::Event(e, None)).is_err() {
                        return;
                    }
                    n += 1;
                }
                Err(e) => {
                    let _ = dead.blocking_send(DeadLetter {
                        source: "replay".into(),
                        topic: Some(name.clone()),
                        partition: None,
                        offset: None,
                        line: Some(record.line as i64),
                        reason: e.to_string(),
                        payload: String::new(),
                        received_at_ms: now_ms(),
                    });
                }
            }
        }
        tracing::info!(file = %name, events = n, "replay finished");
    })
}

/// The engine's input channel and the output channel out of it.
pub type Channels = (mpsc::Sender<Input>, mpsc::Receiver<Input>, mpsc::Sender<Output>, mpsc::Receiver<Output>);

pub fn channels() -> Channels {
    let (tx, rx) = mpsc::channel(INPUT_CAPACITY);
    let (atx, arx) = mpsc::channel(ALERT_CAPACITY);
    (tx, rx, atx, arx)
}
