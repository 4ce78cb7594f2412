//! The engine's own thread: events in from the sources, alerts and checkpoints out to the
//! writer.
//!
//! ```text
//! sources --Input--> engine thread --Output--> writer
//!                       |  \--> EngineHealth (progress, watermark: /readyz, the intake's bounds)
//!                       '--> metrics every second (live keys, evictions, state size)
//! ```
//!
//! Every `checkpoint_every` or further apart ([`crate::pacing`]), and when the inputs close,
//! the engine's state goes to the writer behind the alerts it produced, with the next position
//! of every source it covers, so the store never holds a checkpoint ahead of its alerts.

use super::event_time::{Origin, Slowest, SourceClocks};
use super::idle::Idle;
use super::pacing::CheckpointPacing;
use super::position::{Position, HTTP_SOURCE};
use super::telemetry::Telemetry;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use vigil_engine::alert::Alert;
use vigil_engine::event::now_ms;
use vigil_engine::event::{Event, Millis};
use vigil_engine::runtime::Runtime;
use vigil_lang::plan::RulePlan;

/// Events waiting for the engine; sources block when it is full.
pub const INPUT_CAPACITY: usize = 16_384;
/// Batches of alerts waiting for the store.
const ALERT_CAPACITY: usize = 1_024;
/// Most inputs taken together: the events waiting behind one go to the engines at once, so
/// that several workers share the work of one batch.
const BATCH: usize = 1_024;
/// Quiet time after which buffered events are released (the source is idle).
const IDLE: Duration = Duration::from_secs(1);
/// Quiet time after which the events of the newest millisecond are released. They wait for a
/// newer event, since another of their millisecond may still come (simultaneous events are
/// processed in an order of their content), and without this a live stream that pauses would
/// hold them, and their alerts, for [`IDLE`]: with no lateness allowed, 1 to 1.5 s.
const SETTLE: Duration = Duration::from_millis(100);

/// What the sources hand the engine.
pub enum Input {
    /// An event, with where it came from when a checkpoint must cover it.
    Event(Event, Option<Position>),
    /// The events of one Kafka message (line protocol carries several), taken together so
    /// that a checkpoint covers all of them or none.
    Events(Vec<Event>, Position),
    /// An event of HTTP ingest, with its offset in the ingest log.
    Ingested(Event, u64),
    /// The end of one ingest request's events: the reply counts those that were late.
    Ack(oneshot::Sender<u64>),
    /// Sent 20 times a second; after a quiet tenth of a second the newest millisecond's events
    /// are released (within the lateness), after a quiet second every buffered event.
    Tick,
    /// Replace the rules; the reply names the rules whose state was kept.
    Reload(Vec<RulePlan>, oneshot::Sender<Vec<String>>),
    /// The service is stopping: what came before is taken, a last checkpoint follows, and the
    /// thread ends (other senders, the API's, may still be alive). A group member ends on the
    /// service's stop flag instead, and takes no input.
    Stop,
}

/// What the engine hands the writer: alerts, and now and then a checkpoint. A group member's
/// keyed partitions hand theirs under their claim's fence: stored only while it holds.
pub enum Output {
    Alerts(Vec<Alert>),
    /// The engine's snapshot and the next position to read of each source it covers.
    Checkpoint(Vec<u8>, Vec<Position>),
    /// Alerts a keyed partition raised.
    FencedAlerts(crate::store::Fence, Vec<Alert>),
    /// A keyed partition's checkpoint, stored behind the alerts handed before it.
    PartitionCheckpoint(PartitionSave),
}

/// A keyed partition's checkpoint, and the offset of the keyed topic it resumes at.
pub struct PartitionSave {
    pub fence: crate::store::Fence,
    pub checkpoint: crate::store::PartitionCheckpoint,
    pub next_offset: i64,
}

/// What the engine thread shows the rest of the service: whether it makes progress, and how
/// far event time has got.
#[derive(Debug)]
pub struct EngineHealth {
    /// Inputs taken so far; ticks count, so an idle engine moves it 20 times a second.
    inputs: AtomicU64,
    /// The engine's watermark, `i64::MIN` before there is one.
    watermark: AtomicI64,
    /// How long (ms) the engine has made no progress, as the watchdog last saw.
    stalled_ms: AtomicU64,
    /// The estimated state size, in bytes.
    pub state_bytes: AtomicU64,
    /// How long (µs) the writer has taken to store checkpoints, in total: the next ones are
    /// spaced by it ([`crate::pacing`]).
    pub checkpoint_store_us: AtomicU64,
    /// Why this instance does not process, when it does not (a group member whose rules
    /// differ from its group's).
    held: std::sync::RwLock<Option<String>>,
}

impl Default for EngineHealth {
    fn default() -> Self {
        EngineHealth {
            inputs: AtomicU64::new(0),
            watermark: AtomicI64::new(i64::MIN),
            stalled_ms: AtomicU64::new(0),
            state_bytes: AtomicU64::new(0),
            checkpoint_store_us: AtomicU64::new(0),
            held: Default::default(),
        }
    }
}

impl EngineHealth {
    /// The writer's time in the checkpoints it stored, in total, in microseconds.
    pub fn checkpoint_stored(&self) -> u64 {
        self.checkpoint_store_us.load(Ordering::Relaxed)
    }

    /// The writer stored a checkpoint (or a keyed partition's) in `took`.
    pub fn checkpoint_stored_in(&self, took: Duration) {
        self.checkpoint_store_us.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }

    /// Why this instance does not process, if it does not.
    pub fn held(&self) -> Option<String> {
        self.held.read().ok().and_then(|h| h.clone())
    }

    /// Stops processing for `reason`, or goes on (`None`).
    pub fn hold(&self, reason: Option<String>) {
        if let Ok(mut h) = self.held.write() {
            *h = reason;
        }
    }

    pub fn watermark(&self) -> Option<Millis> {
        Some(self.watermark.load(Ordering::Relaxed)).filter(|w| *w != i64::MIN)
    }

    /// For an engine run elsewhere (a group member's): `n` inputs taken.
    pub fn progressed(&self, n: u64) {
        self.inputs.fetch_add(n, Ordering::Relaxed);
    }

    pub fn set_watermark(&self, w: Millis) {
        self.watermark.store(w, Ordering::Relaxed);
    }

    /// How long the engine has been stuck on one input, once that passes `limit`.
    pub fn stalled(&self, limit: Duration) -> Option<Duration> {
        let ms = self.stalled_ms.load(Ordering::Relaxed);
        (ms >= limit.as_millis() as u64).then(|| Duration::from_millis(ms))
    }

    /// Watches the engine's progress until the service stops: the time since its input count
    /// last moved. Ticks keep a healthy idle engine moving; an engine that does not take its
    /// ticks is busy with one input. A stopping service's ticks end, so its watch ends too.
    pub async fn watch(self: Arc<Self>, limit: Duration, stop: tokio::sync::watch::Receiver<bool>) {
        use tokio::time::Instant;
        let mut last = (self.inputs.load(Ordering::Relaxed), Instant::now());
        let mut warned = false;
        while !*stop.borrow() {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = self.inputs.load(Ordering::Relaxed);
            // A held engine (warming, or a member whose rules differ) is not stuck on an input.
            if now != last.0 || self.held().is_some() {
                last = (now, Instant::now());
                if warned {
                    tracing::info!("the engine makes progress again");
                }
                warned = false;
            }
            let stuck = last.1.elapsed();
            self.stalled_ms.store(stuck.as_millis() as u64, Ordering::Relaxed);
            if stuck >= limit && !warned {
                warned = true;
                tracing::error!(seconds = stuck.as_secs(), "the engine has made no progress; /readyz reports it");
            }
        }
    }
}

/// What `/readyz` says while a warm start reads history.
const WARMING: &str = "warming: the rules read their history from Prometheus (--warm-from-prometheus) before any \
     live sample; live samples wait until it is done";

/// The engine thread's settings.
pub struct EngineLoop {
    pub engine: Runtime,
    pub telemetry: Arc<Telemetry>,
    pub health: Arc<EngineHealth>,
    pub checkpoint_every: Duration,
    /// The history to read into the rules before any live input ([`crate::history::warm`]),
    /// on the engine's thread, so that the service answers meanwhile (not ready, "warming"),
    /// and the live inputs wait in the channel; the alerts it leaves firing are sent first.
    pub warm: Option<(crate::history::warm::WarmStart, tokio::runtime::Handle)>,
    /// The positions of the restored checkpoint, carried into later ones.
    pub restored: Vec<Position>,
    /// The state budget, in bytes.
    pub max_state_bytes: usize,
    /// Quiet input after which `vigil_input_stopped` fires ([`super::idle`]).
    pub input_stopped_after: Duration,
    /// Quiet after which a source stops holding time back ([`super::event_time`]).
    pub source_idle_after: Duration,
}

/// The engine's input channel and the output channel out of it.
pub type Channels = (mpsc::Sender<Input>, mpsc::Receiver<Input>, mpsc::Sender<Output>, mpsc::Receiver<Output>);

pub fn channels() -> Channels {
    let (tx, rx) = mpsc::channel(INPUT_CAPACITY);
    let (atx, arx) = mpsc::channel(ALERT_CAPACITY);
    (tx, rx, atx, arx)
}

/// What the thread keeps between inputs.
struct Running {
    out: Vec<Alert>,
    /// The last offset taken from each partition or file; those of the restored checkpoint
    /// carry over, so a source quiet since the restart keeps its place in later checkpoints.
    positions: BTreeMap<(String, i32), i64>,
    /// The last ingest log offset taken.
    ingested: Option<u64>,
    late_seen: BTreeMap<String, u64>,
    evicted_seen: BTreeMap<(String, &'static str), u64>,
    last_event: Instant,
    /// The time of the newest event taken.
    newest: Option<Millis>,
    idle: Idle,
    sources: SourceClocks,
    /// Some of an ingest request's events are taken and its `Ack` is still to come
    /// ([`EngineLoop::follow_sources`]).
    mid_request: bool,
    /// What the sources last let time move to ([`Slowest`]: `None` when free).
    slowest: Option<Millis>,
    pacing: CheckpointPacing,
    last_gauges: Instant,
}

impl EngineLoop {
    /// Runs the engine on its own thread until every input sender is gone. Alerts are stamped
    /// with the wall-clock time of detection and handed to the writer.
    pub fn spawn(mut self, mut rx: mpsc::Receiver<Input>, alerts: mpsc::Sender<Output>) -> std::thread::JoinHandle<()> {
        std::thread::Builder::new()
            .name("vigil-engine".into())
            .spawn(move || {
                let handed_over = match self.warm.take() {
                    Some((warm, handle)) => {
                        self.health.hold(Some(WARMING.into()));
                        // Stopped: the engine ends without a checkpoint of half the history;
                        // what came live meanwhile is replayed from the ingest log and Kafka.
                        let Some(firing) = crate::history::warm::warm_up(&mut self.engine, &warm, &handle) else {
                            return;
                        };
                        self.health.hold(None);
                        firing
                    }
                    None => Vec::new(),
                };
                let mut r = self.running(handed_over);
                let mut events_in = StreamCounters { family: self.telemetry.events_in.clone(), by_stream: Vec::new() };
                while let Some(first) = rx.blocking_recv() {
                    let mut batch = vec![first];
                    while batch.len() < BATCH {
                        match rx.try_recv() {
                            Ok(input) => batch.push(input),
                            Err(_) => break,
                        }
                    }
                    let n = batch.len() as u64;
                    let stop = batch.iter().any(|i| matches!(i, Input::Stop));
                    self.take(batch, &mut r, &mut events_in);
                    if stop {
                        break;
                    }
                    self.health.inputs.fetch_add(n, Ordering::Relaxed);
                    let checkpoint_due = r.pacing.due(Instant::now(), self.health.checkpoint_stored());
                    if rx.is_empty() || checkpoint_due {
                        // Nothing queued behind: the batches in flight are waited for, so that
                        // the alerts of a quiet stream are not held back.
                        self.engine.catch_up(&mut r.out);
                    }
                    if let Some(w) = self.engine.watermark() {
                        self.health.watermark.store(w, Ordering::Relaxed);
                    }
                    if r.last_gauges.elapsed() > Duration::from_secs(1) {
                        r.last_gauges = Instant::now();
                        self.gauges(&mut r);
                    }
                    if !send_alerts(&mut r.out, &alerts) {
                        return;
                    }
                    if checkpoint_due {
                        r.pacing.begin(Instant::now(), self.health.checkpoint_stored());
                        if let Some(c) = self.checkpoint(&mut r) {
                            // Alerts raised while the snapshot was taken go to the writer first:
                            // a stored checkpoint must never be ahead of its alerts.
                            if !send_alerts(&mut r.out, &alerts) || alerts.blocking_send(c).is_err() {
                                return;
                            }
                        }
                    }
                }
                self.engine.catch_up(&mut r.out);
                if !send_alerts(&mut r.out, &alerts) {
                    return;
                }
                if let Some(c) = self.checkpoint(&mut r) {
                    if send_alerts(&mut r.out, &alerts) {
                        let _ = alerts.blocking_send(c);
                    }
                }
            })
            .expect("the engine thread starts")
    }

    /// What the thread keeps between inputs, as it starts: the restored positions carried
    /// over, and the alerts a warm start left firing to hand on first.
    fn running(&self, handed_over: Vec<Alert>) -> Running {
        Running {
            out: handed_over,
            ingested: self
                .restored
                .iter()
                .find(|p| p.topic == HTTP_SOURCE)
                .and_then(|p| u64::try_from(p.offset - 1).ok()),
            positions: self
                .restored
                .iter()
                .filter(|p| p.topic != HTTP_SOURCE)
                .map(|p| ((p.topic.clone(), p.partition), p.offset - 1))
                .collect(),
            late_seen: BTreeMap::new(),
            evicted_seen: BTreeMap::new(),
            last_event: Instant::now(),
            newest: None,
            idle: Idle::new(self.input_stopped_after),
            sources: SourceClocks::new(
                self.source_idle_after,
                self.engine.watermark().is_some() || !self.restored.is_empty(),
                Instant::now(),
            ),
            mid_request: false,
            slowest: None,
            pacing: CheckpointPacing::new(self.checkpoint_every, Instant::now(), self.health.checkpoint_stored()),
            last_gauges: Instant::now(),
        }
    }

    /// Inputs in order: runs of events go to the engines together.
    fn take(&mut self, batch: Vec<Input>, r: &mut Running, events_in: &mut StreamCounters) {
        let mut events = Vec::with_capacity(batch.len());
        // Which of them came from HTTP ingest, whose late ones the next `Ack` counts.
        let mut ingested = Vec::new();
        let now = Instant::now();
        for input in batch {
            match input {
                Input::Event(event, position) => {
                    // A replayed file is no source that holds time back (`super::event_time`).
                    if let Some(p) = position.as_ref().filter(|p| !p.is_file()) {
                        r.sources.heard(Origin::Partition(&p.topic, p.partition), &event, now);
                    }
                    if let Some(p) = position {
                        r.positions.insert((p.topic, p.partition), p.offset);
                    }
                    events.push(event);
                }
                Input::Events(list, p) => {
                    for event in &list {
                        r.sources.heard(Origin::Partition(&p.topic, p.partition), event, now);
                    }
                    r.positions.insert((p.topic, p.partition), p.offset);
                    events.extend(list);
                }
                Input::Ingested(event, offset) => {
                    r.sources.heard(Origin::Pushed, &event, now);
                    r.mid_request = true;
                    r.ingested = Some(offset);
                    ingested.push(events.len());
                    events.push(event);
                }
                control => {
                    self.push(std::mem::take(&mut events), std::mem::take(&mut ingested), r, events_in);
                    self.control(control, r);
                }
            }
        }
        self.push(events, ingested, r, events_in);
    }

    /// The slowest live source's time to the engines ([`super::event_time`]). While an ingest
    /// request is half taken, the sources of its events still to come are not heard yet, and
    /// cannot hold time back: time may then be held further back (a new source's older events),
    /// never moved on, until the request's `Ack`.
    fn follow_sources(&mut self, r: &mut Running) {
        if r.sources.enabled() {
            let mut slowest = match r.sources.slowest(Instant::now()) {
                Slowest::Held => Some(self.engine.watermark().unwrap_or(Millis::MIN)),
                Slowest::At(t) => Some(t),
                Slowest::Free => None,
            };
            if r.mid_request {
                slowest = match (slowest, r.slowest) {
                    (Some(now), Some(before)) => Some(now.min(before)),
                    (now, before) => now.or(before),
                };
            }
            r.slowest = slowest;
            self.engine.set_slowest(slowest, &mut r.out);
            self.telemetry.live_sources.set(r.sources.live() as i64);
        }
    }

    fn control(&mut self, input: Input, r: &mut Running) {
        if matches!(input, Input::Tick) {
            self.follow_sources(r);
        }
        match input {
            // A request half taken is input on its way, not a quiet one.
            Input::Tick if r.mid_request => {}
            // The watermark trails the newest event, so the newest events wait for a newer
            // one. When none comes for a second the stream is idle: release them.
            Input::Tick if r.last_event.elapsed() >= IDLE => {
                self.engine.flush(&mut r.out);
                // Before the first event since a restart, the restored time stands for it.
                let newest = r.newest.or_else(|| self.engine.watermark());
                if let Some(now) = r.idle.quiet(r.last_event, newest, now_ms(), &mut r.out) {
                    self.engine.advance_to(now, &mut r.out);
                }
            }
            Input::Tick if r.last_event.elapsed() >= SETTLE => self.engine.settle(&mut r.out),
            Input::Ack(reply) => {
                // Every source of the request is heard: time may move on, as far as the last
                // look at the sources' clocks allows, without waiting for a tick outside a
                // request, which under steady ingest seldom comes.
                r.mid_request = false;
                self.follow_sources(r);
                let _ = reply.send(self.engine.take_late_ingested(&mut r.out));
            }
            Input::Reload(plans, reply) => {
                let kept = self.engine.reload(plans, &mut r.out);
                let _ = reply.send(kept);
            }
            Input::Tick | Input::Event(..) | Input::Events(..) | Input::Ingested(..) | Input::Stop => {}
        }
    }

    /// Events into the engines; late ones are counted by rule (HTTP ingest's by the engines,
    /// for the next `Ack`).
    fn push(&mut self, events: Vec<Event>, ingested: Vec<usize>, r: &mut Running, events_in: &mut StreamCounters) {
        if events.is_empty() {
            return;
        }
        if r.sources.added() {
            self.follow_sources(r);
        }
        r.idle.input(r.last_event, now_ms(), &mut r.out);
        r.last_event = Instant::now();
        r.newest = events.iter().map(|e| e.ts).max().max(r.newest);
        for e in &events {
            events_in.inc(e.stream);
        }
        let n = events.len();
        let started = Instant::now();
        let late = self.engine.push(events, ingested, &mut r.out);
        r.sources.taken();
        let per_event = started.elapsed().as_secs_f64() / n as f64;
        for _ in 0..n {
            self.telemetry.eval_latency.observe(per_event);
        }
        if late == 0 {
            return;
        }
        for (rule, n) in &self.engine.stats(&mut r.out).late_by_rule {
            let before = r.late_seen.insert(rule.clone(), *n).unwrap_or(0);
            self.telemetry.late.with_label_values(&[rule]).inc_by(n - before);
        }
    }

    /// Once a second: the state budget, and the gauges of live keys, evictions and lag.
    fn gauges(&mut self, r: &mut Running) {
        let bytes = self.engine.enforce_budget(self.max_state_bytes, &mut r.out);
        self.health.state_bytes.store(bytes as u64, Ordering::Relaxed);
        self.telemetry.state_bytes.set(bytes as i64);
        for (rule, n) in self.engine.live_keys(&mut r.out) {
            self.telemetry.live_keys.with_label_values(&[&rule]).set(n as i64);
        }
        let evicted = self.engine.evicted(&mut r.out);
        self.telemetry.count_evicted(&mut r.evicted_seen, evicted);
        if let Some(w) = self.engine.watermark() {
            self.telemetry.watermark_lag_ms.set(now_ms().saturating_sub(w));
        }
    }

    fn checkpoint(&mut self, r: &mut Running) -> Option<Output> {
        let started = Instant::now();
        match self.engine.checkpoint(&mut r.out) {
            Ok(bytes) => {
                let took = started.elapsed();
                r.pacing.snapshot_took(took);
                self.telemetry.checkpoint.seconds.with_label_values(&["snapshot"]).observe(took.as_secs_f64());
                self.telemetry.checkpoint.bytes.set(bytes.len() as i64);
                let mut next: Vec<Position> = r
                    .positions
                    .iter()
                    .map(|((topic, partition), offset)| Position {
                        topic: topic.clone(),
                        partition: *partition,
                        offset: offset + 1,
                    })
                    .collect();
                if let Some(o) = r.ingested {
                    next.push(Position { topic: HTTP_SOURCE.into(), partition: 0, offset: o as i64 + 1 });
                }
                Some(Output::Checkpoint(bytes, next))
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot snapshot the engine");
                None
            }
        }
    }
}

/// Hands the alerts in `out` to the writer, stamped with the time of detection; false when the
/// writer is gone.
fn send_alerts(out: &mut Vec<Alert>, alerts: &mpsc::Sender<Output>) -> bool {
    if out.is_empty() {
        return true;
    }
    let now = now_ms();
    for a in out.iter_mut() {
        a.detected_at = now;
    }
    alerts.blocking_send(Output::Alerts(std::mem::take(out))).is_ok()
}

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

/// `vigil_events_in_total` by stream, each stream's counter taken from the family once.
struct StreamCounters {
    family: prometheus::IntCounterVec,
    /// By [`Stream::index`](vigil_lang::schema::Stream::index).
    by_stream: Vec<Option<prometheus::IntCounter>>,
}

impl StreamCounters {
    fn inc(&mut self, stream: vigil_lang::schema::Stream) {
        if self.by_stream.len() <= stream.index() {
            self.by_stream.resize(stream.index() + 1, None);
        }
        let family = &self.family;
        self.by_stream[stream.index()].get_or_insert_with(|| family.with_label_values(&[stream.name()])).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_engine_without_progress_is_reported_stalled_and_then_recovered() {
        let health = Arc::new(EngineHealth::default());
        let (_stop_tx, stop) = tokio::sync::watch::channel(false);
        tokio::spawn(health.clone().watch(Duration::from_secs(10), stop));
        let limit = Duration::from_secs(10);
        for _ in 0..20 {
            health.inputs.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert_eq!(health.stalled(limit), None, "ticks keep it moving");
        tokio::time::sleep(Duration::from_secs(12)).await;
        let stalled = health.stalled(limit).expect("stalled");
        assert!(stalled >= limit, "{stalled:?}");
        health.inputs.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(health.stalled(limit), None, "progress again");
    }

    /// Two series of metric samples, a minute each from `from` (old data, so that time does
    /// not move by the wall clock), as one ingest request with a tick after the first
    /// series; how many of them were late.
    fn request(tx: &mpsc::Sender<Input>, from: Millis) -> oneshot::Receiver<u64> {
        for (i, host) in ["a", "b"].into_iter().enumerate() {
            for s in 0..6 {
                let ts = from + s * 10_000;
                let line = format!(r#"{{"stream":"metric","ts":{ts},"host":"{host}","name":"node_load1","value":1}}"#);
                let event = vigil_engine::event::decode(&line, None).expect("a sample");
                tx.blocking_send(Input::Ingested(event, (i * 6 + s as usize) as u64)).expect("engine");
            }
            if i == 0 {
                tx.blocking_send(Input::Tick).expect("engine");
            }
        }
        let (late, reply) = oneshot::channel();
        tx.blocking_send(Input::Ack(late)).expect("engine");
        reply
    }

    #[test]
    fn a_tick_inside_a_request_after_every_source_went_idle_makes_none_of_it_late() {
        let rules = crate::rules::load(&crate::testing::repo_file("rules/metrics")).expect("rules");
        let rules = rules.checked().expect("valid");
        let (tx, rx, alerts_tx, mut alerts_rx) = channels();
        let idle_after = Duration::from_millis(200);
        let health = Arc::new(EngineHealth::default());
        let engine = EngineLoop {
            engine: Runtime::new(rules.plans(), Default::default(), 1, 1),
            telemetry: Arc::new(Telemetry::new()),
            health: health.clone(),
            checkpoint_every: Duration::from_secs(3600),
            warm: None,
            restored: Vec::new(),
            max_state_bytes: usize::MAX,
            input_stopped_after: Duration::from_secs(300),
            source_idle_after: idle_after,
        }
        .spawn(rx, alerts_tx);
        let drain = std::thread::spawn(move || while alerts_rx.blocking_recv().is_some() {});
        let from = now_ms() - 86_400_000;
        assert_eq!(request(&tx, from).blocking_recv(), Ok(0));
        // Every source idle: the next request's series are new sources again, and the tick
        // between them must not let the first one's newest sample move time past the second's.
        std::thread::sleep(idle_after * 2);
        assert_eq!(request(&tx, from + 60_000).blocking_recv(), Ok(0), "none of the second request late");
        // Taken whole, the request lets time move on to its newest sample, with the next look
        // at the sources' clocks (they are spaced: a tick takes the next).
        let deadline = Instant::now() + Duration::from_secs(5);
        while health.watermark().is_none_or(|w| w < from + 110_000 - 1) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            tx.blocking_send(Input::Tick).expect("engine");
        }
        assert_eq!(health.watermark(), Some(from + 110_000 - 1), "time at the request's newest sample");
        tx.blocking_send(Input::Stop).expect("engine");
        engine.join().expect("the engine thread");
        drain.join().expect("the drain");
    }
}
