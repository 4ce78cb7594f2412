//! The low and high watermarks of the partitions a group member owns, as the broker's fetch
//! responses give them (librdkafka's statistics, every half second): they tell when an input
//! partition has been read to its end (so that it can be reported idle), and the lag. Read
//! from the fetch responses, they cost the broker nothing: a ListOffsets request per partition
//! per report would.

use super::Shared;
use rdkafka::TopicPartitionList;

pub(super) type PartitionId = (String, i32);

/// What the fetch responses said of one owned partition.
#[derive(Debug, Default)]
pub(super) struct Watermarks {
    pub(super) low: Option<i64>,
    pub(super) high: Option<i64>,
}

impl Watermarks {
    /// Takes what librdkafka's statistics say of the partition (-1: not known yet).
    pub(super) fn observe(&mut self, s: &rdkafka::statistics::Partition) {
        self.low = Some(s.lo_offset).filter(|o| *o >= 0).or(self.low);
        self.high = Some(s.hi_offset).filter(|o| *o >= 0).or(self.high);
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

    /// The partition's low and high watermarks from the fetch responses, when known.
    pub(super) fn watermarks(&self, topic: &str, partition: i32) -> (Option<i64>, Option<i64>) {
        let watermarks = self.watermarks.lock().expect("watermarks");
        watermarks.get(&(topic.to_string(), partition)).map_or((None, None), |w| (w.low, w.high))
    }
}
