//! The alert writer: stores what the engine hands it, then publishes each new transition to
//! stream clients and wakes the webhook worker; stores checkpoints behind their alerts, commits
//! their Kafka offsets and deletes the ingest log they cover. Dead letters are written apart.
//!
//! While the store is down, batches go to the spool on disk (the engine goes on) and are
//! stored in order when it is back; a full spool holds the engine back, and the engine the
//! sources. After a crash the service resumes from the last checkpoint and reads again what
//! came after it (the alerts that come out twice are stored once, by id).
//!
//! A group member's keyed partitions go the same way out: their alerts and checkpoints carry
//! their claim's fence, are stored only while it holds, and what became of each checkpoint is
//! told back to the member's loop ([`Settled`]).

use super::backoff::Backoff;
use super::engine_loop::{Output, PartitionSave};
use super::position::{resume_offset, Position, HTTP_SOURCE};
use super::spool::{Batch, Spool, SpoolError};
use super::store::{DeadLetter, Fence, Store, Stored};
use super::telemetry::{StoreFailed, Telemetry};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, Notify};
use vigil_engine::alert::{Alert, Status};

/// Shared state the writer keeps up to date for `/readyz`.
#[derive(Default)]
pub struct Health {
    pub store_ok: AtomicBool,
    /// Whether the last write failed.
    pub failing: AtomicBool,
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
    /// The engine's: the writer tells it how long its last checkpoint took to store.
    pub engine_health: Arc<crate::engine_loop::EngineHealth>,
    pub spool: Spool,
    /// The ingest log's folder: segments a stored checkpoint covers are deleted.
    pub ingest_log: Option<PathBuf>,
    /// Where a group member's loop hears what became of its partitions' checkpoints, and of
    /// alerts handed under a fence that no longer holds.
    pub settled: Option<std::sync::mpsc::Sender<Settled>>,
}

/// What became of a keyed partition's alerts or checkpoint.
#[derive(Debug)]
pub enum Settled {
    /// The checkpoint is stored: the keyed topic's offset may be committed.
    Saved { fence: Fence, next_offset: i64 },
    /// Another instance claimed the partition: what was handed under this fence is dropped.
    Fenced(Fence),
}

/// Checkpoints waiting for the spool to empty (or for the store): a newer one replaces the one
/// of its engine or keyed partition.
#[derive(Default)]
struct Waiting {
    engine: Option<(Vec<u8>, Vec<Position>)>,
    partitions: BTreeMap<i32, PartitionSave>,
}

impl Waiting {
    fn is_empty(&self) -> bool {
        self.engine.is_none() && self.partitions.is_empty()
    }

    /// Keeps a keyed partition's checkpoint in place of the one waiting, unless that one is of a
    /// later claim (a revoked partition's last checkpoint can be handed after the partition was
    /// claimed here again). Returns the one of an earlier claim that is not kept: the later
    /// claim fenced it.
    fn keep(&mut self, save: PartitionSave) -> Option<PartitionSave> {
        let partition = save.fence.partition;
        let epoch = save.fence.epoch;
        match self.partitions.get(&partition) {
            Some(waiting) if waiting.fence.epoch > epoch => Some(save),
            _ => self.partitions.insert(partition, save).filter(|old| old.fence.epoch < epoch),
        }
    }
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
    let mut checkpoint = Waiting::default();
    let mut retry = Retry::default();
    let mut closed = false;
    w.report_spool();
    loop {
        let waiting = !w.spool.is_empty() || !checkpoint.is_empty();
        if closed && !waiting {
            tracing::info!("the engine's alerts and its last checkpoint are stored");
            return;
        }
        let output = if waiting {
            tokio::select! {
                o = rx.recv(), if !closed => o,
                _ = tokio::time::sleep_until(retry.at()) => {
                    let drained = w.drain(&mut checkpoint).await;
                    retry.tried(drained);
                    continue;
                }
            }
        } else {
            // Nothing waits, so nothing failed since the last try: the next failure starts over.
            retry = Retry::default();
            rx.recv().await
        };
        match output {
            None => closed = true,
            Some(Output::Checkpoint(bytes, positions)) => {
                checkpoint.engine = Some((bytes, positions));
                w.drain_unless_failing(&mut checkpoint).await;
            }
            Some(Output::PartitionCheckpoint(save)) => {
                if let Some(fenced) = checkpoint.keep(save) {
                    w.settle(Settled::Fenced(fenced.fence));
                }
                w.drain_unless_failing(&mut checkpoint).await;
            }
            Some(Output::Alerts(alerts)) => w.take(Batch::Alerts(alerts), &mut checkpoint).await,
            Some(Output::FencedAlerts(fence, alerts)) => w.take(Batch::Fenced { fence, alerts }, &mut checkpoint).await,
        }
    }
}

/// When the writer next tries to store what waits (the spool, checkpoints). The time is set
/// once and kept until the try: what the engine hands meanwhile joins the wait without putting
/// the try off, so a busy engine (a checkpoint every second, alerts in between) cannot keep the
/// writer from ever trying the store again.
#[derive(Debug)]
struct Retry {
    backoff: Backoff,
    at: Option<tokio::time::Instant>,
}

impl Default for Retry {
    fn default() -> Self {
        Retry { backoff: Backoff::new(RETRY_MIN, RETRY_MAX), at: None }
    }
}

impl Retry {
    /// When to try: a backoff's wait from the first call after the last try.
    fn at(&mut self) -> tokio::time::Instant {
        *self.at.get_or_insert_with(|| tokio::time::Instant::now() + self.backoff.wait())
    }

    /// A try was made: the next waits the first wait again after a success, longer after a
    /// failure.
    fn tried(&mut self, stored: bool) {
        self.at = None;
        match stored {
            true => self.backoff.succeeded(),
            false => _ = self.backoff.failed(),
        }
    }
}

impl Writer {
    /// Stores a batch unless it must wait behind the spool or a checkpoint; else spools it.
    async fn take(&mut self, batch: Batch, checkpoint: &mut Waiting) {
        if self.spool.is_empty() && checkpoint.is_empty() && self.store_batch(&batch).await {
            return;
        }
        self.hold(batch, checkpoint).await;
    }

    /// Stores one batch and publishes it; false when the store did not take it. A fenced batch
    /// whose claim another instance holds now is dropped, and the member's loop told.
    async fn store_batch(&self, batch: &Batch) -> bool {
        let webhook = self.webhook.as_deref();
        let payload = |a: &Alert| super::webhook::alertmanager_payload(a, webhook.unwrap_or_default()).to_string();
        let payload: Option<&(dyn Fn(&Alert) -> String + Sync)> = match webhook {
            Some(_) => Some(&payload),
            None => None,
        };
        let result = match batch {
            Batch::Alerts(alerts) => self.store.insert_alerts(alerts, payload).await.map(Some),
            Batch::Fenced { fence, alerts } => self.store.insert_alerts_fenced(fence, alerts, payload).await,
        };
        match result {
            Ok(stored) => {
                self.stored_again();
                let Some(stored) = stored else {
                    if let Batch::Fenced { fence, .. } = batch {
                        self.telemetry.group.fenced.inc();
                        self.settle(Settled::Fenced(fence.clone()));
                    }
                    return true;
                };
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
                self.failed_now();
                self.telemetry.emit(StoreFailed { operation: "insert_alerts", error: &e });
                false
            }
        }
    }

    /// Notes that the store takes writes, and says so when it had failed.
    fn stored_again(&self) {
        self.health.store_ok.store(true, Ordering::Relaxed);
        if self.health.failing.swap(false, Ordering::Relaxed) {
            tracing::info!(spooled = self.spool.alerts(), "the store is back: the spooled alerts are stored first");
        }
    }

    fn failed_now(&self) {
        self.health.store_ok.store(false, Ordering::Relaxed);
        self.health.failing.store(true, Ordering::Relaxed);
    }

    fn settle(&self, settled: Settled) {
        if let Some(tx) = &self.settled {
            let _ = tx.send(settled);
        }
    }

    /// Puts a batch the store did not take (or that must wait behind the spool) in the spool;
    /// when the spool is full or cannot be written, waits until the store takes enough.
    async fn hold(&mut self, mut batch: Batch, checkpoint: &mut Waiting) {
        let mut delay = Backoff::new(RETRY_MIN, RETRY_MAX);
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
                Err((e, back)) => {
                    // Without a spool the batch can only wait for the store.
                    tracing::error!(error = %e, "cannot write the spool");
                    if self.spool.is_empty() && self.store_batch(&back).await {
                        return;
                    }
                    back
                }
            };
            tokio::time::sleep(delay.wait()).await;
            match self.drain(checkpoint).await {
                true => delay.succeeded(),
                false => _ = delay.failed(),
            }
        }
    }

    /// Stores a checkpoint as it comes, unless the spool holds alerts or the store failed last
    /// time: then the retry timer stores it, so that checkpoints coming one after another (one
    /// per keyed partition) do not skip the backoff.
    async fn drain_unless_failing(&mut self, checkpoint: &mut Waiting) {
        if self.spool.is_empty() && !self.health.failing.load(Ordering::Relaxed) {
            self.drain(checkpoint).await;
        }
    }

    /// Stores the spool, oldest first, then the waiting checkpoints. True when all went.
    async fn drain(&mut self, checkpoint: &mut Waiting) -> bool {
        while let Some(batch) = self.spool.front() {
            if !self.store_batch(batch).await {
                return false;
            }
            if let Err(e) = self.spool.pop() {
                tracing::error!(error = %e, "cannot shorten the spool");
            }
            self.report_spool();
        }
        if let Some((bytes, positions)) = checkpoint.engine.take() {
            if !self.save_checkpoint(&bytes, &positions).await {
                checkpoint.engine = Some((bytes, positions));
                return false;
            }
        }
        while let Some((partition, save)) = checkpoint.partitions.pop_first() {
            if !self.save_partition(&save).await {
                checkpoint.partitions.insert(partition, save);
                return false;
            }
        }
        true
    }

    /// Stores a keyed partition's checkpoint while its claim holds, and tells the member's loop
    /// what became of it; false when the store did not answer.
    async fn save_partition(&self, save: &PartitionSave) -> bool {
        let started = std::time::Instant::now();
        let saved = self.store.save_partition_checkpoint(&save.fence, &save.checkpoint, vigil_engine::event::now_ms());
        let saved = saved.await;
        let took = started.elapsed();
        self.telemetry.checkpoint.seconds.with_label_values(&["store"]).observe(took.as_secs_f64());
        if saved.is_ok() {
            self.engine_health.checkpoint_stored_in(took);
        }
        match saved {
            Ok(true) => {
                self.stored_again();
                self.settle(Settled::Saved { fence: save.fence.clone(), next_offset: save.next_offset });
                true
            }
            Ok(false) => {
                self.stored_again();
                self.telemetry.group.fenced.inc();
                self.settle(Settled::Fenced(save.fence.clone()));
                true
            }
            Err(e) => {
                self.failed_now();
                self.telemetry.emit(StoreFailed { operation: "save_partition_checkpoint", error: &e });
                false
            }
        }
    }

    fn report_spool(&self) {
        let n = self.spool.alerts();
        self.health.spooled.store(n as u64, Ordering::Relaxed);
        self.telemetry.spooled.set(n as i64);
    }

    /// Stores a checkpoint, then commits its Kafka offsets.
    async fn save_checkpoint(&self, bytes: &[u8], positions: &[Position]) -> bool {
        let text = serde_json::to_string(positions).unwrap_or_else(|_| "[]".into());
        let started = std::time::Instant::now();
        let saved = self.store.save_checkpoint(bytes, &text, vigil_engine::event::now_ms()).await;
        let took = started.elapsed();
        self.telemetry.checkpoint.seconds.with_label_values(&["store"]).observe(took.as_secs_f64());
        if let Err(e) = saved {
            self.failed_now();
            self.telemetry.emit(StoreFailed { operation: "save_checkpoint", error: &e });
            return false;
        }
        self.engine_health.checkpoint_stored_in(took);
        self.stored_again();
        // Kafka topic names cannot hold a `:`; files and the ingest log are named with one.
        let kafka: Vec<&Position> = positions.iter().filter(|p| !p.topic.contains(':')).collect();
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
        let ingested = resume_offset(positions, HTTP_SOURCE);
        if let (Some(dir), Some(offset)) = (self.ingest_log.clone(), ingested.and_then(|o| u64::try_from(o).ok())) {
            let deleted = tokio::task::spawn_blocking(move || super::ingest_log::truncate_before(&dir, offset)).await;
            match deleted {
                Ok(Ok(n)) if n > 0 => {
                    tracing::debug!(segments = n, "ingest log segments covered by the checkpoint deleted")
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "cannot delete covered ingest log segments; the next checkpoint will")
                }
                _ => {}
            }
        }
        true
    }
}

/// Dead letters taken from the queue at once, and stored in one transaction.
const DEAD_BATCH: usize = 512;

/// Writes dead letters, a batch at a time; they are kept even while the engine is busy. The
/// table keeps the newest `max_kept`: after each batch the oldest beyond that go.
pub async fn write_dead_letters(
    mut rx: mpsc::Receiver<DeadLetter>,
    store: Store,
    telemetry: Arc<Telemetry>,
    max_kept: u64,
) {
    let mut batch = Vec::with_capacity(DEAD_BATCH);
    while rx.recv_many(&mut batch, DEAD_BATCH).await > 0 {
        for d in &batch {
            telemetry.malformed.with_label_values(&[&d.source]).inc();
        }
        let mut delay = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        loop {
            match store.insert_dead_letters(&batch, max_kept).await {
                Ok(()) => break,
                Err(e) => {
                    telemetry.emit(StoreFailed { operation: "insert_dead_letter", error: &e });
                    tokio::time::sleep(delay.failed()).await;
                }
            }
        }
        batch.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spool::tests::alert;
    use std::sync::atomic::AtomicUsize;

    fn save(partition: i32, epoch: i64, next_offset: i64) -> PartitionSave {
        let fence = Fence { group: "g".into(), partition, epoch };
        let checkpoint = crate::store::PartitionCheckpoint { snapshot: Vec::new(), state: String::new() };
        PartitionSave { fence, checkpoint, next_offset }
    }

    #[test]
    fn a_waiting_checkpoint_of_a_later_claim_is_not_replaced_by_an_earlier_one() {
        let mut waiting = Waiting::default();
        assert!(waiting.keep(save(3, 1, 10)).is_none());
        assert!(waiting.keep(save(3, 1, 20)).is_none(), "a newer one of the same claim replaces it");
        let fenced = waiting.keep(save(3, 2, 5)).expect("the later claim's replaces the earlier claim's");
        assert_eq!((fenced.fence.epoch, fenced.next_offset), (1, 20));
        let stale = waiting.keep(save(3, 1, 30)).expect("an earlier claim's is not kept");
        assert_eq!(stale.next_offset, 30);
        assert!(waiting.keep(save(4, 1, 7)).is_none(), "partitions wait apart");
        let kept: Vec<(i32, i64, i64)> =
            waiting.partitions.values().map(|s| (s.fence.partition, s.fence.epoch, s.next_offset)).collect();
        assert_eq!(kept, [(3, 2, 5), (4, 1, 7)]);
    }

    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "waited 20 s for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The engine hands a batch every 20 ms, far more often than the writer's wait between two
    /// tries of a failing store: the spool is still written to the store once it is back, while
    /// batches keep coming.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_busy_engine_does_not_keep_the_writer_from_trying_the_store_again() {
        let dir = std::env::temp_dir().join(format!("vigil-writer-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).expect("folder");
        let url = format!("sqlite://{}", dir.join("vigil.db").display());
        let store = Store::connect(&url).await.expect("store");
        let side = sqlx::SqlitePool::connect(&url).await.expect("a second connection");
        let rename = |from: &str, to: &str| format!("ALTER TABLE {from} RENAME TO {to}");
        // The store fails: the table of transitions is away.
        sqlx::query(&rename("alert_events", "away")).execute(&side).await.expect("rename");

        let health = Arc::new(Health::default());
        let writer = Writer {
            consumer: None,
            store,
            published: broadcast::channel(16).0,
            webhook: None,
            wake: Arc::new(Notify::new()),
            telemetry: Arc::new(Telemetry::new()),
            health: health.clone(),
            engine_health: Default::default(),
            spool: Spool::open(&dir.join("spool"), 1 << 24).expect("spool"),
            ingest_log: None,
            settled: None,
        };
        let (tx, rx) = mpsc::channel(16);
        let writing = tokio::spawn(write_alerts(rx, writer));
        let sent = Arc::new(AtomicUsize::new(0));
        let feeding = Arc::new(AtomicBool::new(true));
        let feeder = {
            let (sent, feeding) = (sent.clone(), feeding.clone());
            tokio::spawn(async move {
                while feeding.load(Ordering::Relaxed) {
                    let n = sent.fetch_add(1, Ordering::Relaxed);
                    tx.send(Output::Alerts(vec![alert(&format!("a{n}"))])).await.expect("the writer takes");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        };

        until("alerts in the spool", || health.spooled.load(Ordering::Relaxed) > 0).await;
        // A few failed tries: the wait between two is longer than the time between batches.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(health.failing.load(Ordering::Relaxed), "the store failed");
        sqlx::query(&rename("away", "alert_events")).execute(&side).await.expect("rename back");
        until("the spool written while batches keep coming", || {
            !health.failing.load(Ordering::Relaxed) && health.spooled.load(Ordering::Relaxed) == 0
        })
        .await;

        feeding.store(false, Ordering::Relaxed);
        feeder.await.expect("feeder");
        writing.await.expect("the writer ends once the engine's side is closed");
        let (rows,): (i64,) =
            sqlx::query_as("SELECT COUNT(DISTINCT alert_id) FROM alert_events").fetch_one(&side).await.expect("count");
        assert_eq!(rows as usize, sent.load(Ordering::Relaxed), "every alert handed is stored once");
        side.close().await;
        std::fs::remove_dir_all(&dir).ok();
    }
}
