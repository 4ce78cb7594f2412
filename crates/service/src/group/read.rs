//! What a member does with a message it read: an input partition's message is decoded (in its
//! topic's format) and its events forwarded to their keyed partitions; a keyed partition's
//! record is queued for that partition's engine.

use super::keyed::KeyedPartition;
use super::{forward, Ctx, Member};
use crate::store::DeadLetter;
use crate::telemetry::DeadLettersDropped;
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::Message;
use std::collections::{BTreeMap, VecDeque};
use tokio::sync::mpsc::error::TrySendError;
use vigil_engine::event::LineDecoder;
use vigil_formats::Format;
use vigil_lang::schema::Stream;

/// Takes one message: an input partition's events are forwarded, a keyed partition's record
/// goes to its engine.
pub(super) fn take(
    m: &Member,
    by_topic: &BTreeMap<String, Stream>,
    decoder: &mut LineDecoder,
    ctx: &Ctx,
    message: &BorrowedMessage<'_>,
) {
    let mut owned = ctx.owned.lock().expect("owned");
    if message.topic() == ctx.keyed_topic {
        if let Some(p) = owned.keyed.get_mut(&message.partition()) {
            queue(m, by_topic, p, message);
        } else {
            m.telemetry.group.skipped.with_label_values(&["not_owned"]).inc();
        }
        return;
    }
    let (topic, partition, offset) = (message.topic(), message.partition(), message.offset());
    // Not claimed yet (read before its pause took hold), or read before: forwarded by an
    // earlier owner, or by this one before the partition was read again from its beginning.
    let next = owned.next(false, topic, partition);
    if !owned.forwarder.forwards(topic, partition) || next.is_some_and(|next| offset < next) {
        return;
    }
    let payload = message.payload().unwrap_or_default();
    let letter = |line: Option<u64>, reason: String, payload: &[u8]| DeadLetter {
        source: "kafka".into(),
        topic: Some(topic.to_string()),
        partition: Some(partition),
        offset: Some(offset),
        line: line.map(|l| l as i64),
        reason,
        payload: crate::sources::dead_payload(payload),
        received_at_ms: vigil_engine::event::now_ms(),
    };
    let format = match vigil_lines(message) {
        true => Format::Jsonl,
        false => m.formats.get(topic).copied().unwrap_or(Format::Jsonl),
    };
    let letters = match format {
        Format::Jsonl => match m.intake.decode(decoder, payload, by_topic.get(topic).copied()) {
            Ok(event) => {
                m.telemetry.events_in.with_label_values(&[event.stream.name()]).inc();
                let sent = owned.forwarder.forward(topic, partition, offset, payload, &event);
                m.telemetry.group.forwarded.inc_by(sent);
                return;
            }
            Err(reason) => vec![letter(None, reason.to_string(), payload)],
        },
        format => {
            let (events, refused) =
                crate::sources::kafka::samples(&m.collectors, &m.intake, format, payload, &m.telemetry);
            if let Some(first) = events.first() {
                let counter = m.telemetry.events_in.with_label_values(&[first.stream.name()]);
                counter.inc_by(events.len() as u64);
            }
            let sent = owned.forwarder.forward_all(topic, partition, offset, &events);
            m.telemetry.group.forwarded.inc_by(sent);
            crate::sources::kafka::dead_letters(refused, letter)
        }
    };
    if letters.is_empty() {
        return;
    }
    owned.forwarder.read(topic, partition, offset, None);
    owned.dead.letters.extend(letters);
    owned.dead.hand(m);
}

/// Dead letters a member keeps while the dead-letter writer's queue is full (the store is down,
/// say). The loop hands them on each round and never waits for room: a member that waited
/// would stop polling Kafka. Past [`HeldDead::MAX`] the oldest are dropped and counted
/// (`vigil_group_dead_letters_dropped_total`), so that a flood of bad input during an outage costs
/// bounded memory.
#[derive(Default)]
pub(super) struct HeldDead {
    letters: VecDeque<DeadLetter>,
    /// Whether letters are being dropped: said once when it starts.
    dropping: bool,
}

impl HeldDead {
    /// At most this many are kept: with payloads cut to 4 KiB, about 45 MB at worst.
    const MAX: usize = 10_000;

    /// Hands the dead letters kept to the writer's queue, oldest first, as many as it takes now.
    pub(super) fn hand(&mut self, m: &Member) {
        while let Some(l) = self.letters.pop_front() {
            match m.dead.try_send(l) {
                Ok(()) => {}
                Err(TrySendError::Full(l)) => {
                    self.letters.push_front(l);
                    break;
                }
                // The service is stopping.
                Err(TrySendError::Closed(_)) => self.letters.clear(),
            }
        }
        let over = self.letters.len().saturating_sub(Self::MAX);
        if over > 0 {
            self.letters.drain(..over);
            m.telemetry.emit(DeadLettersDropped { count: over as u64, first: !self.dropping });
        }
        self.dropping = over > 0 || (self.dropping && !self.letters.is_empty());
    }
}

/// Whether a message says it holds Vigil's JSON lines whatever its topic's format: the events
/// a member's HTTP ingest forwards to a stream's topic ([`crate::sources::forward`]).
fn vigil_lines(message: &BorrowedMessage<'_>) -> bool {
    message.headers().is_some_and(|h| h.iter().any(|h| h.key == crate::kafka::VIGIL_LINES))
}

/// Queues a keyed partition's record for its engine, unless the partition took it already.
fn queue(m: &Member, by_topic: &BTreeMap<String, Stream>, p: &mut KeyedPartition, message: &BorrowedMessage<'_>) {
    let skipped = |reason: &str| m.telemetry.group.skipped.with_label_values(&[reason]).inc();
    if !p.fresh(message.offset()) {
        skipped("before_checkpoint");
        return;
    }
    let Some(headers) = message.headers() else {
        skipped("no_header");
        return;
    };
    let payload = message.payload().unwrap_or_default();
    let lines = headers.iter().any(|h| h.key == forward::LINES);
    for h in headers.iter() {
        match (h.key, h.value) {
            (forward::PROGRESS, _) => p.queue_progress(payload),
            (forward::SUMMARY, _) => p.queue_summary(payload),
            (forward::STAGE, _) => p.queue_stage_report(payload),
            (forward::FROM, Some(from)) => {
                let Some((offset, upstream)) = std::str::from_utf8(from).ok().and_then(|f| f.split_once(' ')) else {
                    continue;
                };
                let Ok(offset) = offset.parse::<i64>() else { continue };
                let stream = upstream.rsplit_once('/').and_then(|(t, _)| by_topic.get(t)).copied();
                p.queue_event(upstream, offset, stream, payload, lines);
            }
            _ => {}
        }
    }
}
