//! The running pipeline: sources -> engine thread -> alert writer -> store, stream, webhook.
//!
//! Channels between the stages are bounded, so a slow store slows the engine (once the spool is
//! full) and the engine slows the sources (Kafka is then simply read later): nothing is dropped
//! in between, unless the overload policy is `shed`, which drops and counts at the source.

use super::config::Overload;
use super::spool::{Spool, SpoolError};
use super::store::{DeadLetter, Store, Stored};
use super::telemetry::Telemetry;
use crate::alert::{Alert, Status};
use crate::engine::Engine;
use crate::event::{Event, Millis};
use crate::plan::RulePlan;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, mpsc, oneshot, Notify};

/// Events waiting for the engine; sources block when it is full.
pub const INPUT_CAPACITY: usize = 16_384;
/// Batches of alerts waiting for the store.
const ALERT_CAPACITY: usize = 1_024;
/// Quiet time after which buffered events are released (the source is idle).
const IDLE: Duration = Duration::from_secs(1);
/// Quiet time after which the events of the newest millisecond are released. They wait for a
/// newer event, since another of their millisecond may still come (simultaneous events are
/// processed in an order of their content), and without this a live stream that pauses would
/// hold them, and their alerts, for [`IDLE`]: with no lateness allowed, 1 to 1.5 s.
const SETTLE: Duration = Duration::from_millis(100);

/// Sends [`Input::Tick`] to the engine until it stops.
pub async fn tick(tx: mpsc::Sender<Input>) {
    let mut interval = tokio::time::interval(Duration::from_millis(50));
    loop {
        interval.tick().await;
        if tx.send(Input::Tick).await.is_err() {
            return;
        }
    }
}

/// Where an event came from: a Kafka topic, partition and offset, or a replayed file
/// (`file:<path>`, partition 0, line number). A checkpoint records the next of each.
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
    /// Sent 20 times a second; after a quiet tenth of a second the newest millisecond's events
    /// are released (within the lateness), after a quiet second every buffered event.
    Tick,
    /// Replace the rules; the reply names the rules whose state was kept.
    Reload(Vec<RulePlan>, oneshot::Sender<Vec<String>>),
}

/// Outcome of [`offer`].
#[derive(Debug, PartialEq, Eq)]
pub enum Offered {
    Taken,
    /// Dropped under the `shed` overload policy (and counted).
    Shed,
    /// The engine is stopping.
    Closed,
}

/// Hands an event to the engine under the overload policy: waits for room (backpressure), or
/// drops it when the engine's queue is full (shed).
pub async fn offer(
    tx: &mpsc::Sender<Input>,
    input: Input,
    overload: Overload,
    shed: &prometheus::IntCounter,
) -> Offered {
    match overload {
        Overload::Backpressure => match tx.send(input).await {
            Ok(()) => Offered::Taken,
            Err(_) => Offered::Closed,
        },
        Overload::Shed => match tx.try_send(input) {
            Ok(()) => Offered::Taken,
            Err(mpsc::error::TrySendError::Full(_)) => {
                shed.inc();
                Offered::Shed
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Offered::Closed,
        },
    }
}

/// Largest event accepted from Kafka or HTTP; a bigger one is a dead letter.
pub const MAX_EVENT_BYTES: usize = 1 << 20;
/// Most of a rejected payload kept with its dead letter.
const MAX_DEAD_PAYLOAD: usize = 4_096;

/// Decodes one event from Kafka or HTTP, with the reason it is not one.
pub fn decode_payload(payload: &[u8], stream: Option<crate::schema::Stream>) -> Result<Event, String> {
    if payload.len() > MAX_EVENT_BYTES {
        return Err(format!("the event is {} bytes; at most {} are accepted", payload.len(), MAX_EVENT_BYTES));
    }
    let text = std::str::from_utf8(payload).map_err(|e| format!("invalid UTF-8 at byte {}", e.valid_up_to()))?;
    crate::event::decode(text.trim(), stream).map_err(|e| e.to_string())
}

/// The start of a rejected payload, as text, for its dead letter.
pub fn dead_payload(payload: &[u8]) -> String {
    let cut = &payload[..payload.len().min(MAX_DEAD_PAYLOAD)];
    let mut text = String::from_utf8_lossy(cut).into_owned();
    if payload.len() > MAX_DEAD_PAYLOAD {
        text.push_str(&format!("... ({} bytes in all)", payload.len()));
    }
    text
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
    restored: Vec<Position>,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("vigil-engine".into())
        .spawn(move || {
            let mut out = Vec::new();
            let mut late_seen: BTreeMap<String, u64> = BTreeMap::new();
            let mut evicted_seen: BTreeMap<(String, &'static str), u64> = BTreeMap::new();
            let mut last_gauges = Instant::now();
            let mut last_event = Instant::now();
            let events_in: Vec<prometheus::IntCounter> =
                crate::schema::Stream::ALL.iter().map(|s| telemetry.events_in.with_label_values(&[s.name()])).collect();
            // The last offset taken from each partition; those of the restored checkpoint carry
            // over, so a partition quiet since the restart keeps its place in later checkpoints.
            let mut positions: BTreeMap<(String, i32), i64> =
                restored.into_iter().map(|p| ((p.topic, p.partition), p.offset - 1)).collect();
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
                    Input::Tick if last_event.elapsed() >= SETTLE => engine.settle(&mut out),
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
                    for ((rule, reason), n) in engine.evicted() {
                        let before = evicted_seen.insert((rule.clone(), reason), n).unwrap_or(0);
                        if n > before {
                            telemetry.evicted.with_label_values(&[&rule, reason]).inc_by(n - before);
                        }
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
    /// Alerts waiting in the spool for the store.
    pub spooled: AtomicU64,
}

/// Where the writer puts what the engine hands it.
pub struct Writer {
    pub consumer: Option<Arc<rdkafka::consumer::StreamConsumer>>,
    pub store: Store,
    pub published: broadcast::Sender<Arc<Stored>>,
    /// The external URL for webhook payloads; none without a webhook.
    pub webhook: Option<String>,
    pub wake: Arc<Notify>,
    pub telemetry: Arc<Telemetry>,
    pub health: Arc<Health>,
    pub spool: Spool,
}

/// First wait before the store is tried again; it doubles up to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Stores alert batches, then publishes each newly stored transition to stream clients and
/// wakes the webhook worker. While the store is down, batches go to the spool on disk (the
/// engine goes on) and are stored in order when it is back; a full spool holds the engine back.
/// Checkpoints are stored behind their alerts, and only then are their Kafka offsets committed:
/// after a crash the service resumes from the last checkpoint and reads again what came after it
/// (the alerts that come out twice are stored once, by id).
pub async fn write_alerts(mut rx: mpsc::Receiver<Output>, mut w: Writer) {
    // A checkpoint waiting for the spool to empty (or for the store); a newer one replaces it.
    let mut checkpoint: Option<(Vec<u8>, Vec<Position>)> = None;
    let mut delay = RETRY_MIN;
    let mut closed = false;
    w.report_spool();
    loop {
        let waiting = !w.spool.is_empty() || checkpoint.is_some();
        if closed && !waiting {
            return;
        }
        let output = if waiting {
            tokio::select! {
                o = rx.recv(), if !closed => o,
                _ = tokio::time::sleep(delay) => {
                    delay = if w.drain(&mut checkpoint).await { RETRY_MIN } else { (delay * 2).min(RETRY_MAX) };
                    continue;
                }
            }
        } else {
            rx.recv().await
        };
        match output {
            None => closed = true,
            Some(Output::Checkpoint(bytes, positions)) => {
                checkpoint = Some((bytes, positions));
                if w.spool.is_empty() {
                    w.drain(&mut checkpoint).await;
                }
            }
            Some(Output::Alerts(batch)) => {
                if w.spool.is_empty() && checkpoint.is_none() && w.store_batch(&batch).await {
                    continue;
                }
                w.hold(batch, &mut checkpoint).await;
            }
        }
    }
}

impl Writer {
    /// Stores one batch and publishes it; false when the store did not take it.
    async fn store_batch(&self, batch: &[Alert]) -> bool {
        let webhook = self.webhook.as_deref();
        let payload = |a: &Alert| super::webhook::alertmanager_payload(a, webhook.unwrap_or_default()).to_string();
        let result = match webhook {
            Some(_) => self.store.insert_alerts(batch, Some(&payload)).await,
            None => self.store.insert_alerts(batch, None).await,
        };
        match result {
            Ok(stored) => {
                self.health.store_ok.store(true, Ordering::Relaxed);
                for s in stored {
                    if s.alert.status == Status::Firing {
                        self.telemetry.alerts.with_label_values(&[&s.alert.rule, &s.alert.severity]).inc();
                    }
                    let _ = self.published.send(Arc::new(s));
                }
                self.wake.notify_one();
                true
            }
            Err(e) => {
                self.health.store_ok.store(false, Ordering::Relaxed);
                self.telemetry.store_errors.with_label_values(&["insert_alerts"]).inc();
                tracing::warn!(error = %e, "cannot store alerts");
                false
            }
        }
    }

    /// Puts a batch the store did not take (or that must wait behind the spool) in the spool;
    /// when the spool is full or cannot be written, waits until the store takes enough.
    async fn hold(&mut self, mut batch: Vec<Alert>, checkpoint: &mut Option<(Vec<u8>, Vec<Position>)>) {
        let mut delay = RETRY_MIN;
        loop {
            batch = match self.spool.push(batch) {
                Ok(()) => {
                    self.report_spool();
                    return;
                }
                Err((SpoolError::Full, back)) => {
                    tracing::warn!(alerts = self.spool.alerts(), "the spool is full; holding the engine back");
                    back
                }
                Err((SpoolError::Io(e), back)) => {
                    // Without a spool the batch can only wait for the store.
                    tracing::error!(error = %e, "cannot write the spool");
                    if self.spool.is_empty() && self.store_batch(&back).await {
                        return;
                    }
                    back
                }
            };
            tokio::time::sleep(delay).await;
            delay = if self.drain(checkpoint).await { RETRY_MIN } else { (delay * 2).min(RETRY_MAX) };
        }
    }

    /// Stores the spool, oldest first, then the waiting checkpoint. True when all went.
    async fn drain(&mut self, checkpoint: &mut Option<(Vec<u8>, Vec<Position>)>) -> bool {
        while let Some(batch) = self.spool.front() {
            if !self.store_batch(batch).await {
                return false;
            }
            if let Err(e) = self.spool.pop() {
                tracing::error!(error = %e, "cannot shorten the spool");
            }
            self.report_spool();
        }
        if let Some((bytes, positions)) = checkpoint.take() {
            if !self.save_checkpoint(&bytes, &positions).await {
                *checkpoint = Some((bytes, positions));
                return false;
            }
        }
        true
    }

    fn report_spool(&self) {
        let n = self.spool.alerts();
        self.health.spooled.store(n as u64, Ordering::Relaxed);
        self.telemetry.spooled.set(n as i64);
    }

    /// Stores a checkpoint, then commits its Kafka offsets.
    async fn save_checkpoint(&self, bytes: &[u8], positions: &[Position]) -> bool {
        let text = serde_json::to_string(positions).unwrap_or_else(|_| "[]".into());
        if let Err(e) = self.store.save_checkpoint(bytes, &text, now_ms()).await {
            self.health.store_ok.store(false, Ordering::Relaxed);
            self.telemetry.store_errors.with_label_values(&["save_checkpoint"]).inc();
            tracing::warn!(error = %e, "cannot store the checkpoint");
            return false;
        }
        let kafka: Vec<&Position> = positions.iter().filter(|p| !p.topic.starts_with("file:")).collect();
        if let (Some(consumer), false) = (self.consumer.as_deref(), kafka.is_empty()) {
            use rdkafka::consumer::{CommitMode, Consumer};
            let mut list = rdkafka::TopicPartitionList::new();
            for p in kafka {
                let _ = list.add_partition_offset(&p.topic, p.partition, rdkafka::Offset::Offset(p.offset));
            }
            if let Err(e) = consumer.commit(&list, CommitMode::Async) {
                tracing::warn!(error = %e, "cannot commit Kafka offsets; the next checkpoint will");
            }
        }
        true
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

/// The source name a replayed file's position is checkpointed under (Kafka topic names cannot
/// hold a `:`, so the two never mix).
fn file_source(path: &std::path::Path) -> String {
    format!("file:{}", path.display())
}

/// Feeds a recorded file into the running service, reporting malformed lines as dead letters.
/// Each event carries its line number as its position, so checkpoints cover the file too: after
/// a restart the file is read on from the line after the last checkpointed one.
pub fn replay_file(
    path: std::path::PathBuf,
    resume: &[Position],
    tx: mpsc::Sender<Input>,
    dead: mpsc::Sender<DeadLetter>,
) -> std::thread::JoinHandle<()> {
    let source = file_source(&path);
    let next_line = resume.iter().find(|p| p.topic == source).map_or(0, |p| p.offset);
    std::thread::spawn(move || {
        let input = match crate::input::open(&path, crate::input::Format::Auto, &crate::input::InputOptions::default())
        {
            Ok(i) => i,
            Err(e) => {
                tracing::error!(file = %path.display(), error = %e, "cannot replay");
                return;
            }
        };
        if next_line > 0 {
            tracing::info!(file = %path.display(), line = next_line, "replay resumes where the checkpoint left off");
        }
        let name = input.name.clone();
        let mut n = 0u64;
        for record in input.records.filter(|r| r.line as i64 >= next_line) {
            match record.event {
                Ok(e) => {
                    let position = Position { topic: source.clone(), partition: 0, offset: record.line as i64 };
                    if tx.blocking_send(Input::Event(e, Some(position))).is_err() {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn event() -> Input {
        Input::Event(Event::new(crate::schema::Stream::Metric, 0), None)
    }

    #[tokio::test]
    async fn shedding_drops_and_counts_what_does_not_fit_and_backpressure_waits() {
        let (tx, mut rx) = mpsc::channel(2);
        let shed = prometheus::IntCounter::new("shed", "test").expect("counter");
        assert_eq!(offer(&tx, event(), Overload::Shed, &shed).await, Offered::Taken);
        assert_eq!(offer(&tx, event(), Overload::Shed, &shed).await, Offered::Taken);
        assert_eq!(offer(&tx, event(), Overload::Shed, &shed).await, Offered::Shed);
        assert_eq!(shed.get(), 1);
        // Backpressure: the third event waits until the engine takes one.
        let waiting = tokio::spawn({
            let tx = tx.clone();
            let shed = shed.clone();
            async move { offer(&tx, event(), Overload::Backpressure, &shed).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "a full queue holds the source back");
        rx.recv().await.expect("an event");
        assert_eq!(waiting.await.expect("task"), Offered::Taken);
        assert_eq!(shed.get(), 1, "nothing shed under backpressure");
        drop(rx);
        assert_eq!(offer(&tx, event(), Overload::Shed, &shed).await, Offered::Closed);
    }

    #[test]
    fn oversized_and_non_utf8_payloads_are_refused_with_a_reason() {
        let big = vec![b' '; MAX_EVENT_BYTES + 1];
        assert!(decode_payload(&big, None).unwrap_err().contains("at most 1048576"));
        assert_eq!(decode_payload(b"{\"ts\":0,\xff}", None).unwrap_err(), "invalid UTF-8 at byte 8");
        let kept = dead_payload(&big);
        assert!(kept.len() < 5_000 && kept.ends_with("(1048577 bytes in all)"), "{}", &kept[kept.len() - 40..]);
    }
}
