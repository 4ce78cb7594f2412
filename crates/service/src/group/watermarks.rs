//! The low and high watermarks of the partitions a group member owns, as the broker's fetch
//! responses give them (librdkafka's statistics, every half second): they tell when an input
//! partition has been read to its end (so that it can be reported idle), and the lag. Read
//! from the fetch responses, they cost the broker nothing: a ListOffsets request per partition
//! per report would.
//!
//! A partition whose leader is down looks read to its end and quiet, but it is not idle:
//! producers hold its records until a new leader is elected (with a broker killed, for the
//! controller's `broker.session.timeout.ms`, 9 s by default), and they arrive then. Reported
//! idle meanwhile, it would let time pass them. So a partition counts as read to its end only
//! once it has been fetched from a leader that is up for [`SETTLED`].

use super::Shared;
use rdkafka::TopicPartitionList;
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// How long a partition must have been fetched from a live leader before its watermarks say it
/// has been read to its end: records that producers held while it had none reach it first.
const SETTLED: Duration = Duration::from_secs(2);

pub(super) type PartitionId = (String, i32);

/// What the fetch responses said of one owned partition.
#[derive(Debug, Default)]
pub(super) struct Watermarks {
    pub(super) low: Option<i64>,
    pub(super) high: Option<i64>,
    /// Since when every statistics report has had the partition fetched from a leader that is
    /// up; none while it is not.
    fetched_since: Option<Instant>,
}

impl Watermarks {
    /// Takes what librdkafka's statistics say of the partition (-1: not known yet); `up` are
    /// the brokers the client is connected to.
    pub(super) fn observe(&mut self, s: &rdkafka::statistics::Partition, up: &HashSet<i32>) {
        self.low = Some(s.lo_offset).filter(|o| *o >= 0).or(self.low);
        self.high = Some(s.hi_offset).filter(|o| *o >= 0).or(self.high);
        let fetched = s.fetch_state == "active" && up.contains(&s.leader);
        self.fetched_since = match fetched {
            true => self.fetched_since.or_else(|| Some(Instant::now())),
            false => None,
        };
    }

    /// The high watermark, once the partition has been fetched from a live leader for
    /// [`SETTLED`]: until then, what is on the broker is not known.
    fn settled_high(&self) -> Option<i64> {
        self.high.filter(|_| self.fetched_since.is_some_and(|t| t.elapsed() >= SETTLED))
    }
}

impl Shared {
    /// After a rebalance: the partitions in `list` are now owned (`assigned`) or not.
    pub(super) fn owned_partitions_changed(&self, list: &TopicPartitionList, assigned: bool) {
        let mut watermarks = self.watermarks.lock().expect("watermarks");
        for e in list.elements() {
            let id = (e.topic().to_string(), e.partition());
            if assigned {
                watermarks.entry(id).or_default();
            } else {
                watermarks.remove(&id);
            }
        }
    }

    /// The partition's low and high watermarks from the fetch responses, when known; the high
    /// one only once the partition has been fetched from a live leader for [`SETTLED`].
    pub(super) fn watermarks(&self, topic: &str, partition: i32) -> (Option<i64>, Option<i64>) {
        let watermarks = self.watermarks.lock().expect("watermarks");
        watermarks.get(&(topic.to_string(), partition)).map_or((None, None), |w| (w.low, w.settled_high()))
    }
}
