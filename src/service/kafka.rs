//! Kafka through rdkafka: the consumer that feeds the engine, and `vigil produce`.
//!
//! Messages are JSON events. The topic names the stream when a message has no `stream` field.
//! A message that is not an event is counted and kept as a dead letter with its topic,
//! partition, offset and reason; the consumer goes on.

use super::pipeline::{now_ms, Input};
use super::store::DeadLetter;
use super::telemetry::Telemetry;
use crate::schema::Stream;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

pub fn consumer(
    brokers: &str,
    group: &str,
    instance: Option<&str>,
) -> Result<StreamConsumer, rdkafka::error::KafkaError> {
    let mut config = ClientConfig::new();
    // Static membership: a restarted Vigil with the same instance id gets its partitions back at
    // once, instead of after the dead member's session times out.
    if let Some(id) = instance {
        config.set("group.instance.id", id);
    }
    config
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        // Offsets are committed after the checkpoint that covers them is stored.
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("session.timeout.ms", "10000")
        // A member that died (kill -9) is dropped from the group when it misses this interval;
        // some brokers wait for it during a rebalance rather than for the session timeout, so a
        // restarted Vigil would wait minutes for its partitions at the default of 300 s.
        .set("max.poll.interval.ms", "10000")
        // librdkafka waits up to 500 ms for a fetch to fill by default; an alerting system
        // wants events as soon as they are there.
        .set("fetch.wait.max.ms", "10")
        .create()
}

/// Creates the topics that do not exist yet (one replica, `partitions` partitions), for
/// brokers without automatic topic creation. Existing topics are left as they are.
pub async fn ensure_topics(brokers: &str, topics: &[String], partitions: i32) -> anyhow::Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::types::RDKafkaErrorCode;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new().set("bootstrap.servers", brokers).create()?;
    let new: Vec<NewTopic> = topics.iter().map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1))).collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin.create_topics(&new, &options).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => anyhow::bail!("cannot create topic {topic}: {code}"),
        }
    }
    Ok(())
}

/// Reads the stream topics until `stop`, sending events to the engine (waiting when it is busy).
pub async fn consume(
    consumer: Arc<StreamConsumer>,
    topics: BTreeMap<Stream, String>,
    tx: mpsc::Sender<Input>,
    dead: mpsc::Sender<DeadLetter>,
    mut stop: watch::Receiver<bool>,
) {
    let by_topic: BTreeMap<String, Stream> = topics.iter().map(|(s, t)| (t.clone(), *s)).collect();
    let names: Vec<&str> = by_topic.keys().map(String::as_str).collect();
    if let Err(e) = consumer.subscribe(&names) {
        tracing::error!(error = %e, "cannot subscribe to Kafka topics");
        return;
    }
    tracing::info!(topics = ?names, "consuming from Kafka");
    loop {
        let message = tokio::select! {
            m = consumer.recv() => m,
            _ = stop.changed() => return,
        };
        let m = match message {
            Ok(m) => m,
            Err(e) => {
                // Broker down or restarting: librdkafka reconnects by itself; wait a little.
                tracing::warn!(error = %e, "Kafka receive failed");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let topic = m.topic().to_string();
        let payload = m.payload().unwrap_or_default();
        let dead_letter = |reason: String| DeadLetter {
            source: "kafka".into(),
            topic: Some(topic.clone()),
            partition: Some(m.partition()),
            offset: Some(m.offset()),
            line: None,
            reason,
            payload: String::from_utf8_lossy(payload).into_owned(),
            received_at_ms: now_ms(),
        };
        let event = match std::str::from_utf8(payload) {
            Ok(text) => crate::event::decode(text.trim(), by_topic.get(&topic).copied()).map_err(|e| e.to_string()),
            Err(e) => Err(format!("invalid UTF-8 at byte {}", e.valid_up_to())),
        };
        let sent = match event {
            Ok(e) => {
                let position =
                    super::pipeline::Position { topic: topic.clone(), partition: m.partition(), offset: m.offset() };
                tx.send(Input::Event(e, Some(position))).await.is_ok()
            }
            Err(reason) => dead.send(dead_letter(reason)).await.is_ok(),
        };
        if !sent {
            return;
        }
    }
}

/// Updates the consumer-lag gauge every few seconds until `stop`.
pub async fn report_lag(consumer: Arc<StreamConsumer>, telemetry: Arc<Telemetry>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = stop.changed() => return,
        }
        let c = consumer.clone();
        let lags = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            let Ok(assignment) = c.assignment() else { return out };
            let positions = c.position().unwrap_or(assignment);
            for e in positions.elements() {
                let Ok((_, high)) = c.fetch_watermarks(e.topic(), e.partition(), Duration::from_secs(2)) else {
                    continue;
                };
                let pos = e.offset().to_raw().filter(|o| *o >= 0).unwrap_or(0);
                out.push((e.topic().to_string(), e.partition(), (high - pos).max(0)));
            }
            out
        })
        .await
        .unwrap_or_default();
        for (topic, partition, lag) in lags {
            telemetry.kafka_lag.with_label_values(&[&topic, &partition.to_string()]).set(lag);
        }
    }
}

/// `vigil produce`: sends a recorded file's events to Kafka, as JSON, at the chosen speed.
pub async fn produce(
    brokers: &str,
    topic: Option<&str>,
    inputs: Vec<crate::input::Input>,
    speed: crate::replay::Speed,
    create_topics: bool,
) -> anyhow::Result<(u64, u64)> {
    if create_topics {
        let topics: Vec<String> = match topic {
            Some(t) => vec![t.to_string()],
            None => Stream::ALL.iter().map(|s| s.name().to_string()).collect(),
        };
        ensure_topics(brokers, &topics, 1).await?;
    }
    use futures_util::stream::{FuturesUnordered, StreamExt};
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("message.timeout.ms", "30000")
        .set("linger.ms", "5")
        .create()?;
    let (mut sent, mut malformed) = (0u64, 0u64);
    let mut in_flight = FuturesUnordered::new();
    let started = std::time::Instant::now();
    let mut first_ts = None;
    for input in inputs {
        let name = input.name.clone();
        for record in input.records {
            let event = match record.event {
                Ok(e) => e,
                Err(e) => {
                    malformed += 1;
                    eprintln!("malformed: {name}:{}: {e}", record.line);
                    continue;
                }
            };
            if let crate::replay::Speed::Times(factor) = speed {
                let first = *first_ts.get_or_insert(event.ts);
                let due = Duration::from_secs_f64(((event.ts - first).max(0) as f64 / 1000.0) / factor);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
            let topic = topic.unwrap_or(event.stream.name()).to_string();
            let payload = event.to_json().to_string();
            let producer = producer.clone();
            in_flight.push(async move {
                producer
                    .send(FutureRecord::<(), _>::to(&topic).payload(&payload), Duration::from_secs(30))
                    .await
                    .map(|_| ())
                    .map_err(|(e, _)| e)
            });
            while in_flight.len() >= 10_000 {
                if let Some(r) = in_flight.next().await {
                    r?;
                }
            }
            sent += 1;
        }
    }
    while let Some(r) = in_flight.next().await {
        r?;
    }
    Ok((sent, malformed))
}
