//! The forwarder: the events of the input partitions this instance owns, sent on to the keyed
//! topic's partitions that hold their key groups, with reports of how far each input partition
//! has got sent to every keyed partition.
//!
//! Forwarding is at least once: the input offsets are committed only after the producer has
//! delivered every record sent before, and after a crash the next owner of an input partition
//! sends again what came after its last committed offset. The keyed partitions take an
//! upstream offset once ([`super::keyed::KeyedPartition::take`]), which makes it exactly once.
//! Records of one input partition reach a keyed partition in their order: the producer is
//! idempotent, so that a retry cannot overtake ([`crate::kafka::forwarding_producer`]).

use super::keyed::{upstream_id, Progress};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Message, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use vigil_engine::engine::Engine;
use vigil_engine::event::{Event, Millis};

/// Header of a forwarded event: `OFFSET UPSTREAM`, where it was read.
pub const FROM: &str = "vigil-from";
/// Header of a progress record, whose payload is a JSON list of [`Progress`].
pub const PROGRESS: &str = "vigil-progress";
/// Header of a stage one's summary of a fleet-wide rule's window, whose payload is a
/// [`SummaryRecord`](super::keyed::SummaryRecord) (postcard).
pub const SUMMARY: &str = "vigil-summary";
/// Header of a stage one's report, whose payload is a
/// [`StageReport`](super::keyed::StageReport) (postcard).
pub const STAGE: &str = "vigil-stage";
/// Header of a forwarded record whose payload is several events, one canonical JSON line
/// each ([`Event::to_json`]): the events of one input message in a collector's format that go
/// to one keyed partition, taken together.
pub const LINES: &str = "vigil-lines";
/// An input partition with no new message for this long, read to its end, is idle.
const IDLE: Duration = Duration::from_secs(1);
/// How often every owned input partition is reported, changed or not: a report that an
/// instance sent after it lost the partition (paused, and not told yet) is set right by the
/// owner's next one.
const REPORT_ALL: Duration = Duration::from_secs(1);
/// How long the loop waits for the records it sent to be delivered before it commits input
/// offsets or stores a checkpoint. Delivered within milliseconds as a rule; while a broker is
/// away its partitions' records wait until their leaders move (about its session timeout, 9 s
/// and more), and a loop that waited with them would stand still, reading and reporting
/// nothing. Every caller tries again on a later round.
const DELIVERY_WAIT: Duration = Duration::from_millis(200);

/// Counts the records the broker did not take.
#[derive(Default)]
pub struct Deliveries {
    pub failed: AtomicU64,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, _: ()) {
        if let Err((e, m)) = result {
            self.failed.fetch_add(1, Ordering::Relaxed);
            tracing::error!(error = %e, topic = m.topic(), partition = m.partition(), "a forwarded record was not delivered");
        }
    }
}

/// One input partition this instance owns.
#[derive(Debug)]
struct Owned {
    /// The next offset to commit: past the last message read.
    next: Option<i64>,
    /// The newest event time read.
    ts: Option<Millis>,
    last_message: Instant,
    /// Where it had been read to when it was found read to its end and quiet: it is idle.
    idle_at: Option<i64>,
    /// What the keyed partitions were last told.
    reported: Option<(Option<Millis>, Option<i64>)>,
    /// This owner's epoch of the partition, from its claim in the store.
    epoch: i64,
}

pub struct Forwarder {
    /// Tells events' key groups; it never takes an event.
    pub router: Engine,
    producer: ThreadedProducer<Deliveries>,
    topic: String,
    partitions: u32,
    owned: BTreeMap<(String, i32), Owned>,
    targets: Vec<usize>,
    reported_all: Instant,
}

impl Forwarder {
    pub fn new(router: Engine, producer: ThreadedProducer<Deliveries>, topic: String, partitions: u32) -> Self {
        Forwarder {
            router,
            producer,
            topic,
            partitions,
            owned: BTreeMap::new(),
            targets: Vec::new(),
            reported_all: Instant::now(),
        }
    }

    /// Starts forwarding a partition, read from `from` (the group's committed offset; from its
    /// beginning when none).
    pub fn assigned(&mut self, topic: &str, partition: i32, from: Option<i64>, epoch: i64) {
        let owned = Owned { next: from, ts: None, last_message: Instant::now(), idle_at: None, reported: None, epoch };
        self.owned.insert((topic.to_string(), partition), owned);
    }

    /// The next offset of an owned input partition to forward, when known.
    pub fn next(&self, topic: &str, partition: i32) -> Option<i64> {
        self.owned.get(&(topic.to_string(), partition)).and_then(|o| o.next)
    }

    /// Stops forwarding a partition; what was read of it is committed first unless it was lost.
    pub fn released<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        topic: &str,
        partition: i32,
        lost: bool,
    ) {
        if !lost {
            self.commit(consumer, Some((topic, partition)), CommitMode::Sync);
        }
        self.owned.remove(&(topic.to_string(), partition));
    }

    /// After this instance stood still (paused, or starved) for a while: what it knew of its
    /// partitions is old, and it may have lost them without knowing yet. None is reported idle
    /// before it has been quiet for [`IDLE`] again, by which time a lost partition is known.
    pub fn thawed(&mut self) {
        for o in self.owned.values_mut() {
            o.last_message = Instant::now();
            o.idle_at = None;
        }
    }

    pub fn owns(&self) -> usize {
        self.owned.len()
    }

    /// Whether this instance forwards the input partition (it has claimed it).
    pub fn forwards(&self, topic: &str, partition: i32) -> bool {
        self.owned.contains_key(&(topic.to_string(), partition))
    }

    /// The owned input partitions with this owner's epoch of each.
    pub fn epochs(&self) -> Vec<(String, i32, i64)> {
        self.owned.iter().map(|((t, p), o)| (t.clone(), *p, o.epoch)).collect()
    }

    /// Takes a new epoch of an owned input partition (claimed again), reported to every keyed
    /// partition in the next report.
    pub fn set_epoch(&mut self, topic: &str, partition: i32, epoch: i64) {
        if let Some(o) = self.owned.get_mut(&(topic.to_string(), partition)) {
            o.epoch = epoch;
            o.reported = None;
        }
    }

    /// Sends `event`, read at `offset` of an input partition, to the keyed partitions of its
    /// key groups (none when no rule takes it); returns how many records that made.
    pub fn forward(&mut self, topic: &str, partition: i32, offset: i64, payload: &[u8], event: &Event) -> u64 {
        self.router.partitions_of(event, self.partitions as usize, &mut self.targets);
        self.targets.sort_unstable();
        let targets: Vec<i32> = self.targets.iter().map(|&p| p as i32).collect();
        let from = format!("{offset} {}", upstream_id(topic, partition));
        for &p in &targets {
            let headers = OwnedHeaders::new().insert(Header { key: FROM, value: Some(&from) });
            self.send(p, payload, headers);
        }
        self.read(topic, partition, offset, Some(event.ts));
        targets.len() as u64
    }

    /// Sends the events of one message, read at `offset` of an input partition, to the keyed
    /// partitions of their key groups: one record per keyed partition, holding its events as
    /// JSON lines ([`LINES`]). Returns how many records that made.
    pub fn forward_all(&mut self, topic: &str, partition: i32, offset: i64, events: &[Event]) -> u64 {
        let mut by_partition: BTreeMap<i32, Vec<u8>> = BTreeMap::new();
        let mut targets = Vec::new();
        for event in events {
            self.router.partitions_of(event, self.partitions as usize, &mut targets);
            targets.sort_unstable();
            let line = event.to_json().to_string();
            for &p in &targets {
                let payload = by_partition.entry(p as i32).or_default();
                if !payload.is_empty() {
                    payload.push(b'\n');
                }
                payload.extend_from_slice(line.as_bytes());
            }
        }
        let from = format!("{offset} {}", upstream_id(topic, partition));
        for (p, payload) in &by_partition {
            let headers = OwnedHeaders::new()
                .insert(Header { key: FROM, value: Some(&from) })
                .insert(Header { key: LINES, value: Some(&[][..]) });
            self.send(*p, payload, headers);
        }
        self.read(topic, partition, offset, events.iter().map(|e| e.ts).max());
        by_partition.len() as u64
    }

    /// Notes a message read that is not forwarded (not an event: a dead letter).
    pub fn read(&mut self, topic: &str, partition: i32, offset: i64, ts: Option<Millis>) {
        if let Some(o) = self.owned.get_mut(&(topic.to_string(), partition)) {
            o.next = Some(offset + 1);
            o.ts = o.ts.max(ts);
            o.last_message = Instant::now();
            o.idle_at = None;
        }
    }

    /// Sends a record of a keyed partition's own (`header`: [`SUMMARY`] or [`STAGE`]) to the
    /// keyed partition `partition`, or to every one when `None`.
    pub fn send_stage(&self, partition: Option<i32>, header: &'static str, payload: &[u8]) {
        let partitions = match partition {
            Some(p) => p..p + 1,
            None => 0..self.partitions as i32,
        };
        for p in partitions {
            let headers = OwnedHeaders::new().insert(Header { key: header, value: Some(&[][..]) });
            self.send(p, payload, headers);
        }
    }

    /// Waits until the broker has every record sent so far; false when that takes longer than
    /// [`DELIVERY_WAIT`] or a record was lost. A keyed partition's checkpoint is stored only
    /// after the summaries sent before it are delivered: they are not sent again once it is.
    pub fn delivered(&self) -> bool {
        if let Err(e) = self.producer.flush(DELIVERY_WAIT) {
            tracing::debug!(error = %e, "records sent are still on their way");
            return false;
        }
        !self.lost()
    }

    /// Whether the broker refused a record sent.
    fn lost(&self) -> bool {
        self.producer.context().failed.load(Ordering::Relaxed) > 0
    }

    fn send(&self, partition: i32, payload: &[u8], headers: OwnedHeaders) {
        let mut record = BaseRecord::<(), [u8]>::to(&self.topic).partition(partition).payload(payload).headers(headers);
        loop {
            match self.producer.send(record) {
                Ok(()) => return,
                Err((
                    rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                    back,
                )) => {
                    record = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, _)) => {
                    self.producer.context().failed.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(error = %e, "cannot forward a record");
                    return;
                }
            }
        }
    }

    /// Tells every keyed partition how far the owned input partitions have got, when that
    /// changed, and all of them now and then ([`REPORT_ALL`]). `caught_up` says where an input
    /// partition ends when it has been read to its end (none when not); it is asked only of
    /// partitions quiet for a while.
    pub fn report(&mut self, mut caught_up: impl FnMut(&str, i32, Option<i64>) -> Option<i64>) {
        let mut reports = Vec::new();
        let all = self.reported_all.elapsed() >= REPORT_ALL;
        if all {
            self.reported_all = Instant::now();
        }
        for ((topic, partition), o) in self.owned.iter_mut() {
            if o.idle_at.is_none() && o.last_message.elapsed() >= IDLE {
                o.idle_at = caught_up(topic, *partition, o.next);
            }
            let now = (o.ts, o.idle_at);
            if all || o.reported != Some(now) {
                if o.reported.is_some_and(|(_, idle_at)| idle_at != o.idle_at) {
                    tracing::debug!(topic = %topic, partition, ts = ?o.ts, idle_at = ?o.idle_at, next = ?o.next, "input partition's idleness changed");
                }
                o.reported = Some(now);
                let upstream = upstream_id(topic, *partition);
                let (idle, next) = (o.idle_at.is_some(), o.idle_at.or(o.next));
                reports.push(Progress { upstream, ts: o.ts, idle, next, epoch: o.epoch });
            }
        }
        if reports.is_empty() {
            return;
        }
        let payload = serde_json::to_vec(&reports).expect("progress serialises");
        for p in 0..self.partitions as i32 {
            let headers = OwnedHeaders::new().insert(Header { key: PROGRESS, value: Some(&[][..]) });
            self.send(p, &payload, headers);
        }
    }

    /// Waits until the broker has every record sent so far (up to [`DELIVERY_WAIT`]), then
    /// commits the offsets read of the owned input partitions (of `only` one); nothing is
    /// committed while records are on their way, nor after a record was lost, so that the next
    /// owner reads them again.
    pub fn commit<C: ConsumerContext>(&self, consumer: &BaseConsumer<C>, only: Option<(&str, i32)>, mode: CommitMode) {
        if !self.delivered() {
            if self.lost() {
                tracing::error!("a forwarded record was lost: offsets are no longer committed, so that the input is read again after a restart");
            }
            return;
        }
        let mut list = TopicPartitionList::new();
        for ((topic, partition), o) in &self.owned {
            if only.is_some_and(|(t, p)| (t, p) != (topic.as_str(), *partition)) {
                continue;
            }
            if let Some(next) = o.next {
                let _ = list.add_partition_offset(topic, *partition, rdkafka::Offset::Offset(next));
            }
        }
        if list.count() > 0 {
            if let Err(e) = consumer.commit(&list, mode) {
                tracing::warn!(error = %e, "cannot commit the input offsets");
            }
        }
    }
}
