//! Kafka clients through rdkafka: their configuration, topic creation, and `vigil produce`.
//! The consumer that feeds the engine is a source: [`super::sources::kafka`].

use rdkafka::config::ClientConfig;
use rdkafka::consumer::StreamConsumer;
use rdkafka::producer::{FutureProducer, FutureRecord};
use vigil_lang::schema::Stream;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// What went wrong with Kafka.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    #[error(transparent)]
    Client(#[from] rdkafka::error::KafkaError),
    #[error("cannot create topic {topic}: {code}")]
    CreateTopic { topic: String, code: String },
}

/// The errors a consumer hands out in place of messages while its brokers are away. librdkafka
/// reconnects by itself and queues an error for each attempt that fails, ahead of the messages
/// fetched once a broker is back: they are taken as fast as they come (a pause after each would
/// hold those messages back by the pause times the errors queued, a minute after a broker's
/// restart of ten seconds), and logged at most once every [`ReceiveErrors::EVERY`], with how many
/// came since the last one logged.
#[derive(Debug, Default)]
pub struct ReceiveErrors {
    logged_at: Option<Instant>,
    since: u64,
}

impl ReceiveErrors {
    pub const EVERY: Duration = Duration::from_secs(5);

    pub fn note(&mut self, error: &rdkafka::error::KafkaError) {
        let now = Instant::now();
        if self.logged_at.is_some_and(|at| now.duration_since(at) < Self::EVERY) {
            self.since += 1;
            return;
        }
        tracing::warn!(%error, unlogged_since_last = self.since, "Kafka receive failed; librdkafka reconnects");
        self.logged_at = Some(now);
        self.since = 0;
    }
}

/// The librdkafka properties Vigil sets itself, which `kafka_options` may not change, and what
/// to do instead.
pub const OWN_OPTIONS: [(&str, &str); 5] = [
    ("bootstrap.servers", "use --kafka-brokers"),
    ("group.id", "use --kafka-group"),
    ("enable.auto.commit", "offsets are committed after the checkpoint that covers them"),
    ("enable.partition.eof", "the consumer needs no end-of-partition events"),
    ("partition.assignment.strategy", "group members use cooperative-sticky (--kafka-join-group)"),
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
    // message, so this only bounds how often an idle consumer asks.
    let defaults = [("fetch.wait.max.ms", "5"), ("auto.offset.reset", "earliest")];
    client(brokers, &defaults, options)
        .set("group.id", group)
        // Offsets are committed after the checkpoint that covers them is stored.
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
}

/// The consumer of a group member (`--kafka-join-group`): it joins the group with the
/// cooperative-sticky strategy, so that a rebalance moves only the partitions that change
/// owner. With an `instance_id` it is a static member (`group.instance.id`): the broker keeps its
/// partitions for it across a restart within the session timeout, with no rebalance, and it
/// leaves the group only when that timeout passes (librdkafka sends no LeaveGroup for a static
/// member), so a clean stop waits for it too.
pub fn group_consumer<C: rdkafka::consumer::ConsumerContext>(
    brokers: &str,
    group: &str,
    instance_id: Option<&str>,
    options: &BTreeMap<String, String>,
    context: C,
) -> Result<rdkafka::consumer::BaseConsumer<C>, rdkafka::error::KafkaError> {
    // The statistics carry the watermarks of the fetch responses: when an input partition has
    // been read to its end, and the lag, with no request of its own. Metadata every 5 s, as
    // the member surveys the input partitions: partitions added to a topic are then assigned
    // within seconds (librdkafka's default, 5 minutes, would leave every keyed partition's
    // time waiting that long for partitions nobody reads).
    let defaults = [
        ("fetch.wait.max.ms", "5"),
        ("auto.offset.reset", "earliest"),
        ("statistics.interval.ms", "500"),
        ("topic.metadata.refresh.interval.ms", "5000"),
    ];
    let mut config = client(brokers, &defaults, options);
    if let Some(id) = instance_id {
        config.set("group.instance.id", id);
    }
    config
        .set("group.id", group)
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create_with_context(context)
}

/// A client that only asks the brokers for partitions' offsets (in no group).
pub fn offsets_client(
    brokers: &str,
    options: &BTreeMap<String, String>,
) -> Result<rdkafka::consumer::BaseConsumer, rdkafka::error::KafkaError> {
    let mut options = options.clone();
    options.retain(|k, _| k != "group.instance.id");
    // Partitions added to a topic are asked for within seconds, as the group's consumers see
    // them (librdkafka's default refresh is 5 minutes).
    client(brokers, &[("topic.metadata.refresh.interval.ms", "5000")], &options).create()
}

/// The producer that forwards events to a group's keyed topic: it retries without end (the
/// offsets it forwards from are committed only once it has delivered), idempotent, so that a
/// retry neither reorders an input partition's records nor writes one twice, with up to 5
/// requests in flight. (A broker without idempotent producers needs
/// `--kafka-option enable.idempotence=false --kafka-option max.in.flight.requests.per.connection=1`.)
pub fn forwarding_producer<C: rdkafka::producer::ProducerContext>(
    brokers: &str,
    options: &BTreeMap<String, String>,
    context: C,
) -> Result<rdkafka::producer::ThreadedProducer<C>, rdkafka::error::KafkaError> {
    let defaults = [("linger.ms", "5"), ("message.timeout.ms", "0"), ("enable.idempotence", "true")];
    client(brokers, &defaults, options).create_with_context(context)
}

/// Header of an input topic's message that holds Vigil's JSON lines whatever the topic's
/// format: events a member's HTTP ingest forwarded ([`crate::sources::forward`]).
pub const VIGIL_LINES: &str = "vigil-jsonl";

/// The producer of a group member's HTTP ingest ([`crate::sources::forward`]): idempotent, so a
/// retry inside it writes no event twice.
pub fn push_producer(
    brokers: &str,
    options: &BTreeMap<String, String>,
) -> Result<FutureProducer, rdkafka::error::KafkaError> {
    let defaults = [("linger.ms", "5"), ("message.timeout.ms", "30000"), ("enable.idempotence", "true")];
    client(brokers, &defaults, options).create()
}

/// Creates the topics that do not exist yet (`partitions` partitions, as many replicas as the
/// broker's `default.replication.factor`), for
/// brokers without automatic topic creation. Existing topics are left as they are.
pub async fn ensure_topics(
    brokers: &str,
    topics: &[String],
    partitions: i32,
    options: &BTreeMap<String, String>,
) -> Result<(), KafkaError> {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::types::RDKafkaErrorCode;
    let admin: AdminClient<DefaultClientContext> = client(brokers, &[], options).create()?;
    let new: Vec<NewTopic> = topics.iter().map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(-1))).collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin.create_topics(&new, &options).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(KafkaError::CreateTopic { topic, code: code.to_string() }),
        }
    }
    Ok(())
}

/// How many partitions `topic` has, as the broker says (none when it does not exist).
pub fn partition_count(
    brokers: &str,
    topic: &str,
    options: &BTreeMap<String, String>,
) -> Result<Option<usize>, KafkaError> {
    use rdkafka::consumer::Consumer;
    let client = offsets_client(brokers, options)?;
    let metadata = client.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    Ok(metadata.topics().iter().find(|t| t.name() == topic && t.error().is_none()).map(|t| t.partitions().len()))
}

/// `vigil produce`: sends a recorded file's events to Kafka, as JSON, at the chosen speed;
/// `options` are librdkafka properties over the producer's defaults. With `create_topics`, the
/// topics that do not exist are created first with that many partitions.
pub async fn produce(
    brokers: &str,
    options: &BTreeMap<String, String>,
    topic: Option<&str>,
    inputs: Vec<vigil_formats::input::Input>,
    speed: vigil_engine::replay::Speed,
    create_topics: Option<i32>,
) -> Result<(u64, u64), KafkaError> {
    if let Some(partitions) = create_topics {
        let topics: Vec<String> = match topic {
            Some(t) => vec![t.to_string()],
            None => Stream::BUILT_IN.iter().map(|s| s.name().to_string()).collect(),
        };
        ensure_topics(brokers, &topics, partitions, options).await?;
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
            if let vigil_engine::replay::Speed::Times(factor) = speed {
                let first = *first_ts.get_or_insert(event.ts);
                let due = Duration::from_secs_f64(((event.ts - first).max(0) as f64 / 1000.0) / factor);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
            }
            let topic = topic.unwrap_or(event.stream.name());
            let payload = event.to_json().to_string();
            // Enqueued in librdkafka at once (a paced send must leave now, not when the next
            // future is polled); a full queue waits for deliveries.
            let delivery = loop {
                match producer.send_result(FutureRecord::<(), _>::to(topic).payload(&payload)) {
                    Ok(delivery) => break delivery,
                    Err((
                        rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                        _,
                    )) => match in_flight.next().await {
                        Some(r) => delivered(r)?,
                        None => tokio::time::sleep(Duration::from_millis(10)).await,
                    },
                    Err((e, _)) => return Err(e.into()),
                }
            };
            in_flight.push(delivery);
            while in_flight.len() >= 10_000 {
                if let Some(r) = in_flight.next().await {
                    delivered(r)?;
                }
            }
            sent += 1;
        }
    }
    while let Some(r) = in_flight.next().await {
        delivered(r)?;
    }
    Ok((sent, malformed))
}

/// What became of one record `vigil produce` sent.
/// (`Err(_)`: the producer went away before it said, which is a cancellation.)
fn delivered<Gone>(
    result: Result<rdkafka::producer::future_producer::OwnedDeliveryResult, Gone>,
) -> Result<(), KafkaError> {
    match result {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((e, _))) => Err(e.into()),
        Err(_) => Err(rdkafka::error::KafkaError::Canceled.into()),
    }
}
