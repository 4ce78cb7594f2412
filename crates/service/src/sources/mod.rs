//! Where events come from: Kafka ([`kafka`]), HTTP ingest through its log ([`http`]), and
//! recorded files ([`file`]). Each turns its input into events, refuses what is not an event
//! (a dead letter with the reason) or whose time is out of bounds, and hands the rest to the
//! engine under the overload policy.

pub mod file;
pub mod forward;
pub mod http;
pub mod kafka;

use super::config::Overload;
use super::engine_loop::{EngineHealth, Input};
use super::store::DeadLetter;
use std::sync::Arc;
use tokio::sync::mpsc;
use vigil_engine::event::{DecodeError, Event, LineDecoder, TimeBounds};
use vigil_lang::schema::Catalog;

pub use super::position::{resume_offset, Position};

/// Outcome of [`offer`].
#[derive(Debug, PartialEq, Eq)]
pub enum Offered {
    Taken,
    /// Dropped under the `shed` overload policy (and counted).
    Shed,
    /// The engine is stopping.
    Closed,
}

/// Hands an event to the engine under the overload policy: waits for room (backpressure), or
/// drops it when the engine's queue is full (shed).
pub async fn offer(
    tx: &mpsc::Sender<Input>,
    input: Input,
    overload: Overload,
    shed: &prometheus::IntCounter,
) -> Offered {
    match overload {
        Overload::Backpressure => match tx.send(input).await {
            Ok(()) => Offered::Taken,
            Err(_) => Offered::Closed,
        },
        Overload::Shed => match tx.try_send(input) {
            Ok(()) => Offered::Taken,
            Err(mpsc::error::TrySendError::Full(_)) => {
                shed.inc();
                Offered::Shed
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Offered::Closed,
        },
    }
}

/// Largest event accepted from Kafka or HTTP; a bigger one is a dead letter.
pub const MAX_EVENT_BYTES: usize = 1 << 20;
/// Most of a rejected payload kept with its dead letter.
const MAX_DEAD_PAYLOAD: usize = 4_096;

/// What every source checks of an event before the engine sees it: that its time is within
/// bounds of the wall clock and of event time.
#[derive(Clone)]
pub struct Intake {
    pub bounds: TimeBounds,
    pub health: Arc<EngineHealth>,
    pub labels: LabelLimits,
    /// The streams the running rules declare, which events may be of.
    pub catalog: Arc<SharedCatalog>,
}

/// The running rules' catalogue, shared by every source's decoder: a reload replaces it, and
/// decoders take the new one before their next event.
#[derive(Debug)]
pub struct SharedCatalog {
    generation: std::sync::atomic::AtomicU64,
    catalog: std::sync::RwLock<Catalog>,
}

impl Default for SharedCatalog {
    fn default() -> Self {
        SharedCatalog::new(Catalog::prelude().clone())
    }
}

impl SharedCatalog {
    pub fn new(catalog: Catalog) -> SharedCatalog {
        SharedCatalog { generation: Default::default(), catalog: std::sync::RwLock::new(catalog) }
    }

    /// How many times the catalogue changed.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn get(&self) -> Catalog {
        self.catalog.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    pub fn set(&self, catalog: &Catalog) {
        let mut current = self.catalog.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        if *current != *catalog {
            *current = catalog.clone();
            self.generation.fetch_add(1, std::sync::atomic::Ordering::Release);
        }
    }

    /// A decoder of the current catalogue's streams.
    pub fn decoder(&self) -> LineDecoder {
        LineDecoder::new(self.get())
    }

    /// Brings `decoder` to the current catalogue if it changed since generation `seen`: one
    /// atomic load when it did not.
    pub fn sync(&self, decoder: &mut LineDecoder, seen: &mut u64) {
        let now = self.generation.load(std::sync::atomic::Ordering::Acquire);
        if now != *seen {
            decoder.set_catalog(&self.get());
            *seen = now;
        }
    }
}

/// How many labels a sample may carry, and how long their names and values may be (as
/// Mimir's and Prometheus' receivers bound them): past them a sample is refused with the
/// reason, not stored as a series nobody asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LabelLimits {
    pub per_series: usize,
    pub name_bytes: usize,
    pub value_bytes: usize,
}

impl Default for LabelLimits {
    fn default() -> Self {
        LabelLimits { per_series: 64, name_bytes: 1024, value_bytes: 2048 }
    }
}

impl LabelLimits {
    /// Whether an event's `labels` are within the limits.
    pub fn check(&self, event: &Event) -> Result<(), DecodeError> {
        let vigil_engine::event::Value::Map(labels) = event.get("labels") else { return Ok(()) };
        let refuse = |reason: String| Err(DecodeError { field: Some("labels".into()), reason });
        if labels.len() > self.per_series {
            return refuse(format!("{} labels; at most {} are taken per series", labels.len(), self.per_series));
        }
        for (name, value) in labels.iter() {
            if name.len() > self.name_bytes {
                return refuse(format!("a label name of {} bytes; at most {} are taken", name.len(), self.name_bytes));
            }
            if value.len() > self.value_bytes {
                return refuse(format!(
                    "label `{name}` has a value of {} bytes; at most {} are taken",
                    value.len(),
                    self.value_bytes
                ));
            }
        }
        Ok(())
    }
}

impl Intake {
    /// Decodes one event from Kafka or HTTP with `decoder` (one per source, which remembers the
    /// shape of the lines before), with the reason it is not one (or is out of bounds).
    pub fn decode(
        &self,
        decoder: &mut LineDecoder,
        payload: &[u8],
        stream: Option<vigil_lang::schema::Stream>,
    ) -> Result<Event, DecodeError> {
        let whole = |reason: String| DecodeError { field: None, reason };
        if payload.len() > MAX_EVENT_BYTES {
            return Err(whole(format!("the event is {} bytes; at most {MAX_EVENT_BYTES} are accepted", payload.len())));
        }
        let text =
            std::str::from_utf8(payload).map_err(|e| whole(format!("invalid UTF-8 at byte {}", e.valid_up_to())))?;
        let event = decoder.decode(text.trim(), stream)?;
        self.check(&event)?;
        Ok(event)
    }

    /// [`Intake::decode`] with a decoder kept from event to event, brought to a reload's
    /// catalogue first (`seen`: the catalogue's generation it has).
    pub fn decode_synced(
        &self,
        decoder: &mut LineDecoder,
        seen: &mut u64,
        payload: &[u8],
        stream: Option<vigil_lang::schema::Stream>,
    ) -> Result<Event, DecodeError> {
        self.catalog.sync(decoder, seen);
        self.decode(decoder, payload, stream)
    }

    /// Each line of line protocol in `text` with its number, and its samples, each within the
    /// time bounds, or why it is refused. Lines without a timestamp are taken at now.
    pub fn influx<'a>(
        &'a self,
        mapping: &'a vigil_formats::influx::Mapping,
        text: &'a str,
    ) -> impl Iterator<Item = (u64, &'a str, Result<vigil_formats::influx::Samples, DecodeError>)> + 'a {
        let now = now_ms();
        vigil_formats::influx::lines(text).map(move |(line_no, line)| {
            let samples =
                vigil_formats::influx::samples(line, mapping, now).and_then(|s| self.check_all(&s.events).map(|_| s));
            (line_no, line, samples)
        })
    }

    /// Whether every one of `events` (the samples of one line or series, taken or refused
    /// together) is within bounds now.
    pub fn check_all(&self, events: &[Event]) -> Result<(), DecodeError> {
        events.iter().try_for_each(|e| self.check(e))
    }

    /// Whether the event's time is within bounds now, and its labels within their limits.
    pub fn check(&self, event: &Event) -> Result<(), DecodeError> {
        self.bounds.check(event.ts, now_ms(), self.health.watermark())?;
        self.labels.check(event)
    }
}

/// The start of a rejected payload, as text, for its dead letter.
pub fn dead_payload(payload: &[u8]) -> String {
    let cut = &payload[..payload.len().min(MAX_DEAD_PAYLOAD)];
    let mut text = String::from_utf8_lossy(cut).into_owned();
    if payload.len() > MAX_DEAD_PAYLOAD {
        text.push_str(&format!("... ({} bytes in all)", payload.len()));
    }
    text
}

/// A dead letter of `source` received now.
pub fn dead_letter(source: &str, reason: String, payload: &[u8]) -> DeadLetter {
    DeadLetter {
        source: source.into(),
        topic: None,
        partition: None,
        offset: None,
        line: None,
        reason,
        payload: dead_payload(payload),
        received_at_ms: now_ms(),
    }
}

pub use vigil_engine::event::now_ms;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn event() -> Input {
        Input::Event(Event::new(vigil_lang::schema::Stream::Metric, 0), None)
    }

    #[tokio::test]
    async fn shedding_drops_and_counts_what_does_not_fit_and_backpressure_waits() {
        let (tx, mut rx) = mpsc::channel(2);
        let shed = prometheus::IntCounter::new("shed", "test").expect("counter");
        assert_eq!(offer(&tx, event(), Overload::Shed, &shed).await, Offered::Taken);
        assert_eq!(offer(&tx, event(), Overload::Shed, &shed).await, Offered::Taken);
        assert_eq!(offer(&tx, event(), Overload::Shed, &shed).await, Offered::Shed);
        assert_eq!(shed.get(), 1);
        // Backpressure: the third event waits until the engine takes one.
        let waiting = tokio::spawn({
            let tx = tx.clone();
            let shed = shed.clone();
            async move { offer(&tx, event(), Overload::Backpressure, &shed).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "a full queue holds the source back");
        rx.recv().await.expect("an event");
        assert_eq!(waiting.await.expect("task"), Offered::Taken);
        assert_eq!(shed.get(), 1, "nothing shed under backpressure");
        drop(rx);
        assert_eq!(offer(&tx, event(), Overload::Shed, &shed).await, Offered::Closed);
    }

    #[test]
    fn oversized_non_utf8_and_out_of_bounds_payloads_are_refused_with_a_reason() {
        let intake = Intake {
            bounds: TimeBounds { max_future_ms: Some(60_000), max_jump_ms: None },
            health: Arc::new(EngineHealth::default()),
            labels: LabelLimits { per_series: 2, name_bytes: 8, value_bytes: 8 },
            catalog: Default::default(),
        };
        let big = vec![b' '; MAX_EVENT_BYTES + 1];
        let d = &mut LineDecoder::default();
        assert!(intake.decode(d, &big, None).unwrap_err().to_string().contains("at most 1048576"));
        assert_eq!(intake.decode(d, b"{\"ts\":0,\xff}", None).unwrap_err().to_string(), "invalid UTF-8 at byte 8");
        let far = intake
            .decode(d, br#"{"stream":"metric","ts":"9999-12-31T00:00:00Z","host":"h"}"#, None)
            .unwrap_err()
            .to_string();
        assert!(far.starts_with("field `ts`: 9999-12-31T00:00:00.000Z is "), "{far}");
        assert!(intake.decode(d, br#"{"stream":"metric","ts":1767225600000,"host":"h"}"#, None).is_ok());
        let labelled = |labels: &str| {
            let line = format!(r#"{{"stream":"metric","ts":1767225600000,"host":"h","labels":{labels}}}"#);
            intake.decode(&mut LineDecoder::default(), line.as_bytes(), None).map_err(|e| e.to_string())
        };
        assert!(labelled(r#"{"a":"1","b":"2"}"#).is_ok());
        assert!(labelled(r#"{"a":"1","b":"2","c":"3"}"#).unwrap_err().contains("3 labels; at most 2"));
        assert!(labelled(r#"{"a_long_name":"1"}"#).unwrap_err().contains("a label name of 11 bytes"));
        assert!(labelled(r#"{"a":"a long value"}"#).unwrap_err().contains("label `a` has a value of 12 bytes"));
        let kept = dead_payload(&big);
        assert!(kept.len() < 5_000 && kept.ends_with("(1048577 bytes in all)"), "{}", &kept[kept.len() - 40..]);
    }
}
