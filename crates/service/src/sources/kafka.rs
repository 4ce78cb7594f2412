//! The Kafka source: messages of the stream topics, as JSON events.
//!
//! The topic names the stream when a message has no `stream` field. A message that is not an
//! event, or whose time is out of bounds, is counted and kept as a dead letter with its topic,
//! partition, offset and reason; the consumer goes on.
//!
//! The consumer of a single instance does not join a consumer group: it assigns itself every
//! partition of its topics and starts each at the offset named by the checkpoint it restored
//! (or, for a partition the checkpoint does not name, at the group's committed offset, else the
//! earliest). A restart then resumes at once instead of waiting for the broker to rebalance
//! the group away from the dead process. Instances that share the work join the group
//! instead: [`crate::group`]. Offsets are still committed under the group, after each checkpoint,
//! so the usual tools show the consumer's progress and lag.

use super::{now_ms, offer, Intake, Offered, Position, SharedCatalog};
use crate::config::Overload;
use crate::engine_loop::Input;
use crate::store::DeadLetter;
use crate::telemetry::Telemetry;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::Offset;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use vigil_engine::event::DecodeError;
use vigil_formats::{Format, HostMapping};
use vigil_lang::schema::Stream;

/// How often the topics are looked up again for partitions added since.
const RESCAN: Duration = Duration::from_secs(10);

/// The partitions of `topics` that are not in `assigned`, each starting at its offset in
/// `start` (from the checkpoint), else at the group's committed offset (else the earliest).
/// The committed offsets are read here, not left to librdkafka (`Offset::Stored`): when its
/// OffsetFetch is answered NOT_COORDINATOR, as on a fresh broker while it creates its offsets
/// topic, librdkafka leaves the partition unfetched for good (librdkafka issue 5586). A
/// partition whose committed offset cannot be read now is left for a look a second later (true
/// with the list).
fn new_partitions(
    consumer: &StreamConsumer,
    topics: &[String],
    assigned: &BTreeSet<(String, i32)>,
    start: &BTreeMap<(String, i32), i64>,
) -> (rdkafka::TopicPartitionList, bool) {
    let mut list = rdkafka::TopicPartitionList::new();
    let mut ask = rdkafka::TopicPartitionList::new();
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
            match start.get(&key) {
                Some(o) => add(&mut list, topic, p, Offset::Offset(*o)),
                None => add(&mut ask, topic, p, Offset::Invalid),
            }
        }
    }
    if ask.count() == 0 {
        return (list, false);
    }
    let (asked, before) = (ask.count(), list.count());
    match consumer.committed_offsets(ask, Duration::from_secs(10)) {
        Ok(committed) => {
            for e in committed.elements() {
                if let Err(error) = e.error() {
                    let (topic, partition) = (e.topic(), e.partition());
                    tracing::warn!(topic, partition, %error, "cannot read the committed offset; looking again in 1s");
                    continue;
                }
                let from = match e.offset() {
                    Offset::Offset(o) if o >= 0 => Offset::Offset(o),
                    _ => Offset::Beginning,
                };
                add(&mut list, e.topic(), e.partition(), from);
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read the group's committed offsets; looking again in 1s"),
    }
    let left = list.count() - before < asked;
    (list, left)
}

fn add(list: &mut rdkafka::TopicPartitionList, topic: &str, partition: i32, offset: Offset) {
    if let Err(e) = list.add_partition_offset(topic, partition, offset) {
        tracing::warn!(%topic, partition, error = %e, "cannot assign the partition");
    }
}

/// The topics of the streams, as configured.
#[derive(Debug, Clone, Default)]
pub struct StreamTopics {
    /// The topic of each stream at the start.
    pub start: BTreeMap<Stream, String>,
    /// Topics set for streams the rules declare, by name: for streams a reload adds.
    pub declared: BTreeMap<String, String>,
}

/// The stream of each topic the consumer reads, rebuilt when a reload changes the catalogue:
/// one that declares a stream adds its topic, one that removes a stream stops naming its
/// messages' stream by their topic.
pub(crate) struct TopicMap {
    topics: StreamTopics,
    pub(crate) by_topic: BTreeMap<String, Stream>,
    /// The topics, sorted.
    pub(crate) names: Vec<String>,
    /// The catalogue's generation the map was built for.
    seen: u64,
}

impl TopicMap {
    pub(crate) fn new(topics: StreamTopics, catalog: &SharedCatalog) -> TopicMap {
        let by_topic: BTreeMap<String, Stream> = topics.start.iter().map(|(s, t)| (t.clone(), *s)).collect();
        let names = by_topic.keys().cloned().collect();
        TopicMap { topics, by_topic, names, seen: catalog.generation() }
    }

    /// Vigil's own streams' topics as at the start, and those of the streams the catalogue
    /// declares now: the topic set for each, or else one named as it. Whether the catalogue
    /// changed since the last call.
    pub(crate) fn refresh(&mut self, catalog: &SharedCatalog) -> bool {
        if catalog.generation() == self.seen {
            return false;
        }
        self.seen = catalog.generation();
        let declared = catalog.get();
        let own = self.topics.start.iter().filter(|(s, _)| Stream::BUILT_IN.contains(s)).map(|(s, t)| (t.clone(), *s));
        let named = |s: Stream| self.topics.declared.get(s.name()).cloned().unwrap_or_else(|| s.name().into());
        self.by_topic = own.chain(declared.declared().map(|s| (named(s), s))).collect();
        self.names = self.by_topic.keys().cloned().collect();
        true
    }
}

/// What the consumer needs besides the Kafka client.
pub struct KafkaSource {
    pub topics: StreamTopics,
    /// Topics whose messages are not Vigil's JSON lines.
    pub formats: BTreeMap<String, Format>,
    /// How the collectors' samples are placed under hosts.
    pub collectors: HostMapping,
    /// The checkpoint's next offset of each partition.
    pub start: Vec<Position>,
    pub engine: mpsc::Sender<Input>,
    pub dead: mpsc::Sender<DeadLetter>,
    pub intake: Intake,
    pub overload: Overload,
    pub shed: prometheus::IntCounter,
    pub telemetry: std::sync::Arc<Telemetry>,
}

/// Reads the stream topics until `stop`, sending events to the engine (waiting when it is
/// busy).
pub async fn consume(consumer: Arc<StreamConsumer>, source: KafkaSource, mut stop: watch::Receiver<bool>) {
    let KafkaSource { topics, formats, collectors, start, engine: tx, dead, intake, overload, shed, telemetry } =
        source;
    let mut topics = TopicMap::new(topics, &intake.catalog);
    let start: BTreeMap<(String, i32), i64> = start.into_iter().map(|p| ((p.topic, p.partition), p.offset)).collect();
    let mut assigned: BTreeSet<(String, i32)> = BTreeSet::new();
    let mut decoder = intake.catalog.decoder();
    let mut catalog_seen = 0;
    let mut errors = crate::kafka::ReceiveErrors::default();
    let mut rescan = tokio::time::interval(RESCAN);
    rescan.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let message = tokio::select! {
            m = consumer.recv(), if !assigned.is_empty() => m,
            _ = rescan.tick() => {
                topics.refresh(&intake.catalog);
                let (c, n, a, s) = (consumer.clone(), topics.names.clone(), assigned.clone(), start.clone());
                let Ok((list, left)) = tokio::task::spawn_blocking(move || new_partitions(&c, &n, &a, &s)).await else {
                    return;
                };
                if left {
                    rescan.reset_after(Duration::from_secs(1));
                }
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
                errors.note(&e);
                continue;
            }
        };
        let topic = m.topic().to_string();
        let payload = m.payload().unwrap_or_default();
        let position = Position { topic: topic.clone(), partition: m.partition(), offset: m.offset() };
        let letter = |line: Option<u64>, reason: String, payload: &[u8]| DeadLetter {
            source: "kafka".into(),
            topic: Some(topic.clone()),
            partition: Some(m.partition()),
            offset: Some(m.offset()),
            line: line.map(|l| l as i64),
            reason,
            payload: super::dead_payload(payload),
            received_at_ms: now_ms(),
        };
        let sent = match formats.get(&topic).copied().unwrap_or(Format::Jsonl) {
            Format::Jsonl => {
                match intake.decode_synced(
                    &mut decoder,
                    &mut catalog_seen,
                    payload,
                    topics.by_topic.get(&topic).copied(),
                ) {
                    Ok(e) => offer(&tx, Input::Event(e, Some(position)), overload, &shed).await != Offered::Closed,
                    Err(reason) => dead.send(letter(None, reason.to_string(), payload)).await.is_ok(),
                }
            }
            format => {
                let (events, refused) = samples(&collectors, &intake, format, payload, &telemetry);
                let mut sent = true;
                for l in dead_letters(refused, letter) {
                    sent &= dead.send(l).await.is_ok();
                }
                if !events.is_empty() {
                    sent &= offer(&tx, Input::Events(events, position), overload, &shed).await != Offered::Closed;
                }
                sent
            }
        };
        if !sent {
            return;
        }
    }
}

/// The samples of a message in `format`, placed under hosts by `hosts`, and what is refused,
/// counted by format and reason.
pub(crate) fn samples(
    hosts: &HostMapping,
    intake: &Intake,
    format: Format,
    payload: &[u8],
    telemetry: &Telemetry,
) -> (Vec<vigil_engine::event::Event>, Vec<Refused>) {
    let text = || {
        std::str::from_utf8(payload)
            .map_err(|e| DecodeError { field: None, reason: format!("invalid UTF-8 at byte {}", e.valid_up_to()) })
    };
    let (label, (events, refused)) = match format {
        Format::Influx => ("influx", influx_samples(intake, &hosts.influx, payload)),
        Format::TelegrafJson => {
            let host = &hosts.influx.host_tag;
            let each = match text() {
                Ok(t) => {
                    vigil_formats::influx::telegraf_json(t, host).into_iter().map(|r| r.map(|s| s.events)).collect()
                }
                Err(e) => vec![Err(e)],
            };
            ("telegraf_json", each_checked(intake, each, payload, host))
        }
        Format::PrometheusKafkaAdapter => {
            let labels = &hosts.remote_write;
            let one = text().and_then(|t| vigil_formats::remote_write::adapter_sample(t, labels)).map(|s| s.events);
            ("prometheus_kafka_adapter", each_checked(intake, vec![one], payload, &labels.label))
        }
        _ => ("otlp", otlp_samples(intake, &hosts.otlp_attribute, format, payload)),
    };
    telemetry.samples.taken.with_label_values(&[label]).inc_by(events.len() as u64);
    for (_, counted, _, _) in &refused {
        telemetry.samples.rejected.with_label_values(&[label, counted]).inc();
    }
    (events, refused)
}

/// Refused lines of one message kept as dead letters; the rest are summed up in one more.
const DEAD_PER_MESSAGE: usize = 100;

/// A line refused: its number (none for the whole message), its reason's label, why, and its
/// text.
pub(crate) type Refused = (Option<u64>, &'static str, String, String);

/// The dead letters of a message's refused lines, made by `letter` (line, reason, text): the
/// first [`DEAD_PER_MESSAGE`] one by one, the rest counted in one more.
pub(crate) fn dead_letters(
    refused: Vec<Refused>,
    letter: impl Fn(Option<u64>, String, &[u8]) -> DeadLetter,
) -> Vec<DeadLetter> {
    let more = refused.len().saturating_sub(DEAD_PER_MESSAGE);
    let mut letters: Vec<DeadLetter> = refused
        .into_iter()
        .take(DEAD_PER_MESSAGE)
        .map(|(line, _, reason, text)| letter(line, reason, text.as_bytes()))
        .collect();
    if more > 0 {
        letters.push(letter(
            None,
            format!("{more} more refused samples of the same message, not kept one by one"),
            b"",
        ));
    }
    letters
}

/// The samples of a message of line protocol, and each line refused.
fn influx_samples(
    intake: &Intake,
    mapping: &vigil_formats::influx::Mapping,
    payload: &[u8],
) -> (Vec<vigil_engine::event::Event>, Vec<Refused>) {
    let text = match std::str::from_utf8(payload) {
        Ok(text) => text,
        Err(e) => {
            let reason = format!("invalid UTF-8 at byte {}", e.valid_up_to());
            return (Vec::new(), vec![(None, "malformed", reason, String::from_utf8_lossy(payload).into_owned())]);
        }
    };
    let (mut events, mut refused) = (Vec::new(), Vec::new());
    for (line_no, line, samples) in intake.influx(mapping, text) {
        match samples {
            Ok(samples) => events.extend(samples.events),
            Err(reason) => {
                let counted = crate::telemetry::reject_reason(&reason, &mapping.host_tag);
                refused.push((Some(line_no), counted, reason.to_string(), line.to_string()))
            }
        }
    }
    (events, refused)
}

/// The samples of a message's items (the metrics of a batch, numbered from 1 when there are
/// several), each item's taken together when all are within the time bounds.
fn each_checked(
    intake: &Intake,
    items: Vec<Result<Vec<vigil_engine::event::Event>, DecodeError>>,
    payload: &[u8],
    host_field: &str,
) -> (Vec<vigil_engine::event::Event>, Vec<Refused>) {
    let several = items.len() > 1;
    let (mut events, mut refused) = (Vec::new(), Vec::new());
    for (i, item) in items.into_iter().enumerate() {
        match item.and_then(|e| intake.check_all(&e).map(|_| e)) {
            Ok(e) => events.extend(e),
            Err(reason) => {
                let counted = crate::telemetry::reject_reason(&reason, host_field);
                let text = String::from_utf8_lossy(payload).into_owned();
                refused.push((several.then_some(i as u64 + 1), counted, reason.to_string(), text));
            }
        }
    }
    (events, refused)
}

/// The samples of a message holding one OTLP metrics request, and what is refused: the whole
/// message when it is not a request, else the refused metrics and points.
fn otlp_samples(
    intake: &Intake,
    host_attribute: &str,
    format: Format,
    payload: &[u8],
) -> (Vec<vigil_engine::event::Event>, Vec<Refused>) {
    use vigil_formats::otlp::Encoding;
    let encoding = if format == Format::OtlpJson { Encoding::Json } else { Encoding::Protobuf };
    let request = match vigil_formats::otlp::decode(payload, encoding) {
        Ok(r) => r,
        Err(e) => {
            return (
                Vec::new(),
                vec![(None, "malformed", e.to_string(), String::from_utf8_lossy(payload).into_owned())],
            )
        }
    };
    let decoded = vigil_formats::otlp::samples(&request, host_attribute, now_ms());
    let mut refused: Vec<Refused> = decoded
        .refused
        .into_iter()
        .map(|(_, at, reason)| {
            (None, crate::telemetry::otlp_reject_reason(&reason, host_attribute), reason.to_string(), at)
        })
        .collect();
    let mut events = Vec::with_capacity(decoded.events.len());
    for event in decoded.events {
        match intake.check(&event) {
            Ok(()) => events.push(event),
            Err(reason) => {
                let at = format!("{} of {}", event.get("name"), event.get("host"));
                refused.push((
                    None,
                    crate::telemetry::otlp_reject_reason(&reason, host_attribute),
                    reason.to_string(),
                    at,
                ));
            }
        }
    }
    (events, refused)
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
