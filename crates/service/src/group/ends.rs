//! The end offsets of every input partition, asked of the broker (ListOffsets) when a keyed
//! partition would let time pass an upstream partition that its forwarder reported idle.
//!
//! A report that a partition is idle says where its forwarder had read it to; it may be old by
//! the time another partition's progress would move time past it. Records written to the idle
//! partition since, which its forwarder has not read yet, would then be late: under load, a
//! forwarder on another instance can lag a second behind. So time passes an idle partition
//! only once the broker, asked after the progress that would move time was seen, says that
//! the partition still ends where its forwarder had read it to
//! ([`super::keyed::KeyedPartition::work`]).
//!
//! The member asks on its own thread, at most every [`ASK_EVERY`], and only while a keyed
//! partition waits for an answer: one ListOffsets request per broker that leads input
//! partitions.

use super::keyed::{upstream_id, EndOffsets};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the broker may be asked.
const ASK_EVERY: Duration = Duration::from_millis(50);
/// How long one request may take before it is given up (and asked again).
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// How often partitions without an end offset are logged.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// What the member's loop and the asking thread share.
pub struct Ends {
    wanted: AtomicBool,
    /// The input partitions, as topic and partition.
    inputs: Mutex<Vec<(String, i32)>>,
    latest: Mutex<Arc<EndOffsets>>,
    last_unknown_warning: Mutex<Instant>,
}

impl Default for Ends {
    fn default() -> Self {
        Ends {
            wanted: AtomicBool::default(),
            inputs: Mutex::default(),
            latest: Mutex::default(),
            last_unknown_warning: Mutex::new(Instant::now().checked_sub(WARN_EVERY).unwrap_or_else(Instant::now)),
        }
    }
}

impl Ends {
    /// Asks for the end offsets, in a request sent from now on.
    pub fn want(&self) {
        self.wanted.store(true, Ordering::Release);
    }

    /// The newest answer.
    pub fn latest(&self) -> Arc<EndOffsets> {
        self.latest.lock().expect("ends").clone()
    }

    /// The input partitions to ask for.
    pub fn set_inputs(&self, inputs: Vec<(String, i32)>) {
        *self.inputs.lock().expect("inputs") = inputs;
    }

    /// Asks the broker through `client` whenever an answer is wanted, until `ends` is dropped.
    pub fn spawn(ends: &Arc<Ends>, client: BaseConsumer) -> std::io::Result<std::thread::JoinHandle<()>> {
        let weak = Arc::downgrade(ends);
        std::thread::Builder::new().name("vigil-group-ends".into()).spawn(move || {
            while let Some(ends) = weak.upgrade() {
                if ends.wanted.swap(false, Ordering::AcqRel) {
                    ends.ask(&client);
                }
                drop(ends);
                std::thread::sleep(ASK_EVERY);
            }
        })
    }

    fn ask(&self, client: &BaseConsumer) {
        let mut list = TopicPartitionList::new();
        for (topic, partition) in self.inputs.lock().expect("inputs").iter() {
            // Offset::End as a timestamp asks for the latest offset.
            let _ = list.add_partition_offset(topic, *partition, Offset::End);
        }
        let asked = Instant::now();
        match client.offsets_for_times(list, ASK_TIMEOUT) {
            Ok(answer) => {
                let mut unknown = Vec::new();
                let offsets = answer
                    .elements()
                    .iter()
                    .filter_map(|e| match (e.error(), e.offset()) {
                        (Ok(()), Offset::Offset(o)) => Some((upstream_id(e.topic(), e.partition()), o)),
                        _ => {
                            unknown.push(upstream_id(e.topic(), e.partition()));
                            None
                        }
                    })
                    .collect();
                // Time cannot pass an idle partition whose end is unknown: say which.
                if !unknown.is_empty() && self.last_unknown_warning.lock().expect("warned").elapsed() >= WARN_EVERY {
                    *self.last_unknown_warning.lock().expect("warned") = Instant::now();
                    tracing::warn!(partitions = ?unknown, "the broker gave no end offset for these input partitions; asking again");
                }
                *self.latest.lock().expect("ends") = Arc::new(EndOffsets { asked: Some(asked), offsets });
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the input partitions' end offsets; asking again");
                self.want();
            }
        }
    }
}
