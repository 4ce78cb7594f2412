//! Kafka through rdkafka: the consumer that feeds the engine, and `vigil produce`.
//!
//! Messages are JSON events. The topic names the stream when a message has no `stream` field.
//! A message that is not an event is counted and kept as a dead letter with its topic,
//! partition, offset and reason; the consumer goes on.
//!
//! The consumer does not join a consumer group: it assigns itself every partition of its topics
//! and starts each at the offset named by the checkpoint it restored (or, for a partition the
//! checkpoint does not name, at the group's committed offset, else the earliest). The engine's
//! state is one whole, so partitions cannot be shared among several Vigils anyway, and a
//! restart then resumes at once instead of waiting for the broker to rebalance the group away
//! from the dead process. Offsets are still committed under the group, after each checkpoint,
//! so the usual tools show the consumer's progress and lag.

use super::config::Overload;
use super::pipeline::{now_ms, Input, Offered, Position};
use super::store::DeadLetter;
use super::telemetry::Telemetry;
use crate::schema::Stream;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Offset;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// The librdkafka properties Vigil sets itself, which `kafka_options` may not change, and what
/// to do instead.
pub const OWN_OPTIONS: [(&str, &str); 4] = [
    ("bootstrap.servers", "use --kafka-brokers"),
    ("group.id", "use --kafka-group"),
    ("enable.auto.commit", "offsets are committed after the checkpoint that covers them"),
    ("enable.partition.eof", "the consumer needs no end-of-partition events"),
];

/// A client configuration for `brokers`: Vigil's `defaults`, the user's `options` over them.
fn client(brokers: &str, defaults: &[(&str, &str)], options: &BTreeMap<String, String>) -> ClientConfig {
    let mut config = ClientConfig::new();
    for (key, value) in defaults {
        config.set(*key, *value);
    }
    for (key, value) in options {
        config.set(key, value);
    }
    config.set("bootstrap.servers", brokers);
    config
}

pub fn consumer(
    brokers: &str,
    group: &str,
    options: &BTreeMap<String, String>,
) -> Result<StreamConsumer, rdkafka::error::KafkaError> {
    // librdkafka waits up to 500 ms for a fetch to fill by default; an alerting system wants
    // events as soon as they are there. Apache Kafka answers a fetch as soon as there is a
    // message, so this only bounds how often an idle consumer asks; a broker that holds every
    // fetch for the whole wait (Tansu does) adds up to twice it to the detection latency.
    let defaults = [("fetch.wait.max.ms", "5"), ("auto.offset.reset", "earliest")];
    client(brokers, &defaults, options)
        .set("group.id", group)
        // Offsets are committed after the checkpoint that covers them is stored.
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
}

/// Creates the topics that do not exist yet (one replica, `partitions` partitions), for
/// brokers without automatic topic creation. Existing topics are left as they are.
pub async fn ensure_topics(
    brokers: &str,
    topics: &[String],
    partitions: i32,
    options: &BTreeMap<String, String>,
) -> anyhow::Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::types::RDKafkaErrorCode;
    let admin: AdminClient<DefaultClientContext> = client(brokers, &[], options).create()?;
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

/// How often the topics are looked up again for partitions added since.
const RESCAN: Duration = Duration::from_secs(10);

/// The partitions of `topics` that are not in `assigned`, each starting at its offset in
/// `start` (from the checkpoint), else at the group's committed offset (else the earliest).
fn new_partitions(
    consumer: &StreamConsumer,
    topics: &[String],
    assigned: &BTreeSet<(String, i32)>,
    start: &BTreeMap<(String, i32), i64>,
) -> rdkafka::TopicPartitionList {
    let mut list = rdkafka::TopicPartitionList::new();
    for topic in topics {
        let partitions = match consumer.fetch_metadata(Some(topic), Duration::from_secs(5)) {
            Ok(m) => m
                .topics()
                .iter()
                .filter(|t| t.error().is_none())
                .flat_map(|t| t.partitions().iter().map(|p| p.id()))
                .collect::<Vec<_>>(),
            Err(e) => {
                tracing::warn!(%topic, error = %e, "cannot read the topic's partitions; trying again");
                continue;
            }
        };
        if partitions.is_empty() {
            tracing::warn!(%topic, "the topic does not exist (yet); looking again in {:?}", RESCAN);
        }
        for p in partitions {
            let key = (topic.clone(), p);
            if assigned.contains(&key) {
                continue;
            }
            let offset = start.get(&key).map_or(Offset::Stored, |o| Offset::Offset(*o));
            if let Err(e) = list.add_partition_offset(topic, p, offset) {
                tracing::warn!(%topic, partition = p, error = %e, "cannot assign the partition");
            }
        }
    }
    list
}

/// Reads the stream topics until `stop`, sending events to the engine (waiting when it is
/// busy). `start` holds the checkpoint's next offset of each partition.
pub async fn consume(
    consumer: Arc<StreamConsumer>,
    topics: BTreeMap<Stream, String>,
    start: Vec<Position>,
    tx: mpsc::Sender<Input>,
    dead: mpsc::Sender<DeadLetter>,
    (overload, shed): (Overload, prometheus::IntCounter),
    mut stop: watch::Receiver<bool>,
) {
    let by_topic: BTreeMap<String, Stream> = topics.iter().map(|(s, t)| (t.clone(), *s)).collect();
    let names: Vec<String> = by_topic.keys().cloned().collect();
    let start: BTreeMap<(String, i32), i64> = start.into_iter().map(|p| ((p.topic, p.partition), p.offset)).collect();
    let mut assigned: BTreeSet<(String, i32)> = BTreeSet::new();
    let mut rescan = tokio::time::interval(RESCAN);
    rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let message = tokio::select! {
            m = consumer.recv(), if !assigned.is_empty() => m,
            _ = rescan.tick() => {
                let (c, n, a, s) = (consumer.clone(), names.clone(), assigned.clone(), start.clone());
                let Ok(list) = tokio::task::spawn_blocking(move || new_partitions(&c, &n, &a, &s)).await else {
                    return;
                };
                if list.count() > 0 {
                    match consumer.incremental_assign(&list) {
                        Ok(()) => {
                            for e in list.elements() {
                                tracing::info!(topic = e.topic(), partition = e.partition(), offset = ?e.offset(), "consuming");
                                assigned.insert((e.topic().to_string(), e.partition()));
                            }
                        }
                        Err(e) => tracing::error!(error = %e, "cannot assign the Kafka partitions"),
                    }
                }
                continue;
            }
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
        let sent = match super::pipeline::decode_payload(payload, by_topic.get(&topic).copied()) {
            Ok(e) => {
                let position = Position { topic: topic.clone(), partition: m.partition(), offset: m.offset() };
                super::pipeline::offer(&tx, Input::Event(e, Some(position)), overload, &shed).await != Offered::Closed
            }
            Err(reason) => dead
                .send(DeadLetter {
                    source: "kafka".into(),
                    topic: Some(topic.clone()),
                    partition: Some(m.partition()),
                    offset: Some(m.offset()),
                    line: None,
                    reason,
                    payload: super::pipeline::dead_payload(payload),
                    received_at_ms: now_ms(),
                })
                .await
                .is_ok(),
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

/// `vigil produce`: sends a recorded file's events to Kafka, as JSON, at the chosen speed;
/// `options` are librdkafka properties over the producer's defaults.
pub async fn produce(
    brokers: &str,
    options: &BTreeMap<String, String>,
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
        ensure_topics(brokers, &topics, 1, options).await?;
    }
    use futures_util::stream::{FuturesUnordered, StreamExt};
    let defaults = [("message.timeout.ms", "30000"), ("linger.ms", "5")];
    let producer: FutureProducer = client(brokers, &defaults, options).create()?;
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
