//! HTTP ingest of a group member: every instance takes pushed events and samples (from the
//! ingest API and the collectors' receivers), so that senders can be balanced over several.
//! A member forwards each event, as the JSON line the ingest log would keep, to the Kafka
//! topic its stream is read from, keyed by the host, machine or job it is about; the group
//! then reads it as any event of that topic, and the member that owns its key group judges it.
//! The request is answered once the broker has acknowledged every event of it: the topic is the
//! group's durable log, as the ingest log is a single instance's.
//!
//! A push that fails part way is refused (503, to be sent again) with some of its events
//! already forwarded: those are read twice (at least once), as a producer's retry of a Kafka
//! topic would be. Each forwarded message carries the `vigil-jsonl` header, so a topic of a
//! collector's format (`--kafka-topic-format`) takes Vigil's lines too.

use crate::sources::http::{Batch, Logged};
use futures_util::future::join_all;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::mpsc;
use vigil_engine::event::Event;
use vigil_lang::schema::Stream;

/// Where a member forwards pushed events.
pub struct Forward {
    pub producer: FutureProducer,
    pub topics: BTreeMap<Stream, String>,
}

/// The key a forwarded event goes under: what it is about, so that one host's, machine's or
/// job's events stay in one partition, in the order they were pushed.
fn key_of(event: &Event) -> String {
    ["host", "machine_id", "job_id"]
        .iter()
        .map(|f| event.get(f))
        .find(|v| !v.is_null())
        .map(|v| v.to_text())
        .unwrap_or_default()
}

impl Forward {
    /// The topic `stream`'s events are read from.
    fn topic(&self, stream: Stream) -> &str {
        self.topics.get(&stream).map_or(stream.name(), String::as_str)
    }

    async fn forward(&self, batch: &Batch) -> Result<(), KafkaError> {
        let keys: Vec<String> = batch.events.iter().map(|(_, e)| key_of(e)).collect();
        let sends = batch.events.iter().zip(&keys).map(|((range, event), key)| {
            let headers = OwnedHeaders::new().insert(Header { key: crate::kafka::VIGIL_LINES, value: Some(&[][..]) });
            let record = FutureRecord::to(self.topic(event.stream))
                .payload(&batch.body[range.clone()])
                .key(key)
                .headers(headers);
            self.producer.send(record, Duration::from_secs(30))
        });
        for result in join_all(sends).await {
            result.map_err(|(e, _)| e)?;
        }
        Ok(())
    }

    /// Serves the member's HTTP ingest until the service stops.
    pub fn spawn(self) -> mpsc::Sender<Batch> {
        let (tx, mut rx) = mpsc::channel::<Batch>(16);
        tokio::spawn(async move {
            while let Some(batch) = rx.recv().await {
                let answer = match self.forward(&batch).await {
                    Ok(()) => {
                        // The group judges them later; none is known to be late now.
                        let (late, counted) = tokio::sync::oneshot::channel();
                        let _ = late.send(0);
                        Logged::Taken(counted)
                    }
                    Err(e) => {
                        Logged::Failed(format!("the group's Kafka topic did not take the events: {e}; send them again"))
                    }
                };
                let _ = batch.reply.send(answer);
            }
        });
        tx
    }
}
