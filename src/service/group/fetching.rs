//! What a group member knows of fetching each partition it owns, and what it does when Tansu
//! stops or skips a partition (RELIABILITY.md, "Two more limits of the broker").

use super::{Ctx, Shared};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use std::time::{Duration, Instant};

/// How long librdkafka's fetch position of an owned partition may stay still, with nothing
/// queued, while the broker has more of it, before the partition is read again from its
/// beginning ([`Fetching`]).
const STALLED: Duration = Duration::from_secs(3);

/// How the fetching of one owned partition goes. Tansu 0.6.0 answers nothing to a fetch that
/// starts inside a record batch, or answers from a later batch (RELIABILITY.md), and such a
/// fetch starts whenever a member reads an assigned partition from where the last owner left
/// it, or librdkafka fetches a kept partition again from the application's position (after a
/// rebalance). So a partition whose first message after such a (re)start comes past a gap, or
/// whose fetch position stays still for [`STALLED`] with nothing queued while the broker has
/// more of it, is read again from its beginning, what was read skipped. All but the gap come
/// from librdkafka's statistics.
#[derive(Debug)]
pub(super) struct Fetching {
    /// Fetching restarted: the next message is checked for a gap.
    pub(super) restarted: bool,
    /// The last gap in the middle of a keyed partition that made it be read again: seen again
    /// after that, it is taken as the broker's.
    gap_read_again: Option<i64>,
    /// The partition's offsets on the broker, as its fetch responses say: Tansu answers a
    /// ListOffsets for the latest offset with a smaller one.
    pub(super) low: Option<i64>,
    pub(super) high: Option<i64>,
    /// librdkafka's next offset to fetch, and when it last moved (or had messages queued).
    pub(super) fetch_next: Option<i64>,
    pub(super) fetch_moved: Instant,
}

impl Fetching {
    pub(super) fn new(restarted: bool) -> Self {
        Fetching {
            restarted,
            gap_read_again: None,
            low: None,
            high: None,
            fetch_next: None,
            fetch_moved: Instant::now(),
        }
    }

    /// Takes what librdkafka's statistics say of the partition.
    pub(super) fn observe(&mut self, s: &rdkafka::statistics::Partition) {
        self.low = Some(s.lo_offset).filter(|o| *o >= 0).or(self.low);
        self.high = Some(s.hi_offset).filter(|o| *o >= 0).or(self.high);
        let next = Some(s.next_offset).filter(|o| *o >= 0);
        if next != self.fetch_next || s.fetchq_cnt > 0 {
            self.fetch_next = next;
            self.fetch_moved = Instant::now();
        }
    }

    /// Whether fetching has stood still for [`STALLED`] short of the broker's end.
    pub(super) fn stalled(&self) -> bool {
        let behind = self.fetch_next.zip(self.high).is_some_and(|(next, high)| next < high);
        behind && self.fetch_moved.elapsed() >= STALLED
    }
}

pub(super) type PartitionId = (String, i32);

impl Shared {
    /// After a rebalance of `consumer` (`list` assigned, or revoked): the partitions assigned
    /// start where the last owner left them, and those kept are fetched again from the
    /// application's position; either may be inside a batch.
    pub(super) fn restarted(&self, consumer: &BaseConsumer<Ctx>, list: &TopicPartitionList, assigned: bool) {
        let mut fetching = self.fetching.lock().expect("fetching");
        for e in list.elements() {
            let id = (e.topic().to_string(), e.partition());
            match assigned {
                true => fetching.insert(id, Fetching::new(true)),
                false => fetching.remove(&id),
            };
        }
        let Ok(kept) = consumer.assignment() else { return };
        for e in kept.elements() {
            if list.find_partition(e.topic(), e.partition()).is_none() {
                fetching
                    .entry((e.topic().to_string(), e.partition()))
                    .or_insert_with(|| Fetching::new(true))
                    .restarted = true;
            }
        }
    }

    /// Notes a message at `offset` of a partition whose next offset to take is `next`; true
    /// when it came past a gap (the partition is then read again from its beginning, and the
    /// message is not taken): after a restart, or in the middle of a keyed partition, once per
    /// gap. The keyed topic is written by Vigil's forwarders alone, without transactions, so
    /// on Apache Kafka its offsets have no gaps; on Tansu one gap of one offset was seen in six
    /// loaded runs of the group test. Not a gap: `next` is no longer on the broker (below its
    /// first offset, as the fetch responses say), so nothing before `offset` can be read.
    pub(super) fn arrived(&self, topic: &str, partition: i32, offset: i64, next: Option<i64>) -> bool {
        let mut fetching = self.fetching.lock().expect("fetching");
        let Some(f) = fetching.get_mut(&(topic.to_string(), partition)) else { return false };
        let restarted = std::mem::take(&mut f.restarted);
        let gone = |n: i64| f.low.is_some_and(|low| n < low);
        let Some(n) = next.filter(|n| offset > *n && !gone(*n)) else { return false };
        if restarted {
            return true;
        }
        if topic == self.keyed_topic && f.gap_read_again != Some(n) {
            f.gap_read_again = Some(n);
            return true;
        }
        false
    }

    /// The partition's high watermark from the fetch responses, when known.
    pub(super) fn high(&self, topic: &str, partition: i32) -> (Option<i64>, Option<i64>) {
        let fetching = self.fetching.lock().expect("fetching");
        fetching.get(&(topic.to_string(), partition)).map_or((None, None), |f| (f.low, f.high))
    }
}

/// Reads a partition again from its beginning ([`Fetching`]); what was read is skipped.
pub(super) fn refetch(consumer: &BaseConsumer<Ctx>, topic: &str, partition: i32, reason: &str) {
    if let Err(e) = consumer.seek(topic, partition, Offset::Beginning, Duration::from_secs(1)) {
        tracing::warn!(topic, partition, error = %e, "cannot read the partition again from its beginning");
        return;
    }
    let ctx = consumer.context();
    if let Some(f) = ctx.fetching.lock().expect("fetching").get_mut(&(topic.to_string(), partition)) {
        f.restarted = true;
        f.fetch_moved = Instant::now();
    }
    ctx.telemetry.group.refetched.with_label_values(&[reason]).inc();
    tracing::info!(topic, partition, reason, "reading the partition again from its beginning");
}
