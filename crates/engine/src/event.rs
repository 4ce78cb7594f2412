//! Events and values: what flows through the engine.
//!
//! An event is one JSON object, `{"stream": "...", "ts": ..., <fields>}`, with `ts` as RFC 3339
//! or epoch milliseconds. Fields are stored in the order of the stream's schema
//! ([`Stream::fields`]), so operators reach them by position.

use serde_json::Value as Json;
use vigil_lang::schema::{Catalog, Stream};

use std::sync::Arc;

mod error;
mod json;
mod scan;
mod time;
mod value;

use error::bad;
pub use error::DecodeError;
pub use time::{format_time, now_ms, parse_time, Millis, TimeBounds, MAX_TS, MIN_TS};
pub use value::{format_number, Value};

pub use vigil_lang::schema::{field_position, TS_INDEX};

/// One event of a declared stream.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Event {
    pub stream: Stream,
    pub ts: Millis,
    /// Values in the order of `stream.fields()`; absent fields are `Null`.
    pub fields: Vec<Value>,
}

impl Event {
    /// An event with every field missing; fill it with [`Event::set`].
    pub fn new(stream: Stream, ts: Millis) -> Event {
        // Not `vec![Value::Null; n]`, which clones its element through `Value::clone`.
        let mut fields = Vec::with_capacity(stream.fields().len());
        fields.resize_with(stream.fields().len(), || Value::Null);
        Event { stream, ts, fields }
    }

    /// Makes the event an empty one of `stream` (every field `Null`), keeping its allocation.
    fn clear(&mut self, stream: Stream) {
        for v in &mut self.fields {
            std::mem::replace(v, Value::Null).discard();
        }
        if stream != self.stream {
            self.stream = stream;
            self.fields.resize_with(stream.fields().len(), || Value::Null);
        }
    }

    pub fn set(&mut self, field: &str, value: Value) -> &mut Self {
        if let Some(i) = self.stream.field_index(field) {
            self.fields[i] = value;
        }
        self
    }

    pub fn get(&self, field: &str) -> Value {
        if field == "ts" {
            return Value::Time(self.ts);
        }
        self.stream.field_index(field).map_or(Value::Null, |i| self.fields[i].clone())
    }

    /// The value at a position of the stream's schema, or the timestamp for [`TS_INDEX`].
    pub fn value(&self, index: usize) -> Value {
        match self.fields.get(index) {
            Some(v) => v.clone(),
            None if index == TS_INDEX => Value::Time(self.ts),
            None => Value::Null,
        }
    }

    /// The `type` field of task and machine events.
    pub fn event_type(&self) -> Option<&str> {
        match self.stream.type_index().map(|i| &self.fields[i]) {
            Some(Value::Str(s)) => Some(s),
            _ => None,
        }
    }

    /// The canonical JSON form, as read back by [`decode`].
    pub fn to_json(&self) -> Json {
        // Serializing text keys and JSON values into a tree cannot fail.
        serde_json::to_value(EventJson(self)).unwrap_or(Json::Null)
    }

    /// Deterministic order for events with equal timestamps.
    pub fn tie_order(&self, other: &Event) -> std::cmp::Ordering {
        self.ts.cmp(&other.ts).then(self.stream.cmp(&other.stream)).then_with(|| {
            self.fields
                .iter()
                .zip(&other.fields)
                .map(|(a, b)| a.tie_order(b))
                .find(|o| o.is_ne())
                .unwrap_or(std::cmp::Ordering::Equal)
        })
    }
}

/// Serializes an event in its canonical JSON form, [`Event::to_json`]'s, without building it.
pub struct EventJson<'a>(pub &'a Event);

impl serde::Serialize for EventJson<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let event = self.0;
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("stream", event.stream.name())?;
        map.serialize_entry("ts", &format_time(event.ts))?;
        for ((name, _), v) in event.stream.fields().iter().zip(&event.fields) {
            match v {
                Value::Null => {}
                Value::Num(n) if n.fract() == 0.0 && n.abs() < 9e15 => map.serialize_entry(name, &(*n as i64))?,
                Value::Num(n) if n.is_finite() => map.serialize_entry(name, n)?,
                Value::Str(text) => map.serialize_entry(name, &**text)?,
                other => map.serialize_entry(name, &other.to_json())?,
            }
        }
        map.end()
    }
}

/// Longest string value accepted in an event; longer values are an attack or a bug.
pub const MAX_STRING: usize = 64 * 1024;

/// What the rules need to see of an event before it is built: the engine's gate implements it
/// ([`crate::engine::Gate`]). For a stream it judges, a line whose numbers no rule's filter
/// takes is not built: only its time is kept ([`Decoded::Time`]).
pub trait EventGate {
    /// Whether events of `stream` can be judged from their numbers alone.
    fn judges(&self, stream: Stream) -> bool;
    /// The field positions whose numbers are read for `stream`, as bits.
    fn reads(&self, stream: Stream) -> u64;
    /// Whether no rule takes an event of `stream` whose number at each field position is
    /// `number(position)`; false for a stream not judged.
    fn refuses(&self, stream: Stream, number: impl Fn(usize) -> Option<f64>) -> bool;
}

/// Events their last holder let go of, kept to read later lines into: an event is two
/// allocations (the shared count with the event, and its fields), and freeing them and
/// dropping the values one call each cost about a tenth of a windowed rule's time per event.
/// Whoever owns both the decoder and the engine owns the pool: the engine hands back what it
/// released ([`crate::engine::Engine::recycle_into`]), the decoder reads into it.
#[derive(Default)]
pub struct EventPool {
    spares: Vec<Arc<Event>>,
}

/// Events a pool keeps at most.
const SPARES: usize = 16;

impl EventPool {
    /// Keeps `event` to read a later line into, if nothing else holds it and there is room. Its
    /// values stay until then: the decoder writes over them.
    pub fn give_back(&mut self, mut event: Arc<Event>) {
        if Arc::get_mut(&mut event).is_some() && self.spares.len() < SPARES {
            self.spares.push(event);
        }
    }
}

/// A reader of JSON-line events that remembers the shapes of the lines it read, so that a line
/// like the last ones is read value by value (see the fast path, [`scan`]). The streams lines
/// may name are those of its catalogue: Vigil's own unless it is given a rule set's.
pub struct LineDecoder {
    memory: scan::ScanMemory,
    catalog: Catalog,
}

impl Default for LineDecoder {
    fn default() -> Self {
        LineDecoder::new(Catalog::prelude().clone())
    }
}

impl LineDecoder {
    pub fn new(catalog: Catalog) -> LineDecoder {
        LineDecoder { memory: scan::ScanMemory::default(), catalog }
    }

    /// Reads later lines with the streams of `catalog` (a reload's); the shapes of earlier lines
    /// are forgotten, since a name may now mean another declaration.
    pub fn set_catalog(&mut self, catalog: &Catalog) {
        if *catalog != self.catalog {
            self.catalog = catalog.clone();
            self.memory = scan::ScanMemory::default();
        }
    }

    /// Decodes one JSON line. `default_stream` names the stream when the object has no `stream`
    /// field (a Kafka topic per stream, for example). Unknown fields are ignored, so producers
    /// can send more than Vigil reads.
    ///
    /// Plain flat lines, the usual case, are scanned by hand ([`scan`]); the rest are read in one
    /// pass with serde's visitor interface straight into the stream's field order: no
    /// intermediate JSON tree, and keys and strings are borrowed from the line where they have
    /// no escapes.
    pub fn decode(&mut self, line: &str, default_stream: Option<Stream>) -> Result<Event, DecodeError> {
        self.decode_bytes(line.as_bytes(), default_stream)
    }

    /// [`LineDecoder::decode`] for a line not yet known to be UTF-8: the scanner checks only its
    /// strings (what else it accepts is ASCII), so a plain line is not validated twice.
    pub fn decode_bytes(&mut self, line: &[u8], default_stream: Option<Stream>) -> Result<Event, DecodeError> {
        if let Some(event) = scan::scan(line, default_stream, &self.catalog, &mut self.memory) {
            return Ok(event);
        }
        decode_unscanned(line, default_stream, &self.catalog)
    }

    /// [`LineDecoder::decode_bytes`], except that a line the gate shows no rule takes comes
    /// back as its time alone, checked as the event would be but not built. Lines of a
    /// remembered shape are judged so, and read into an event of `pool` when there is one; the
    /// others are decoded in full.
    pub fn decode_gated<G: EventGate>(
        &mut self,
        line: &[u8],
        default_stream: Option<Stream>,
        gate: &G,
        pool: &mut EventPool,
    ) -> Result<Decoded, DecodeError> {
        if let Some(decoded) = scan::scan_gated(line, default_stream, &self.catalog, gate, &mut self.memory, pool) {
            return Ok(decoded);
        }
        decode_unscanned(line, default_stream, &self.catalog).map(|event| Decoded::Event(Arc::new(event)))
    }
}

/// Decodes one JSON line with a decoder of its own; see [`LineDecoder::decode`]. A caller with
/// many lines keeps a [`LineDecoder`].
pub fn decode(line: &str, default_stream: Option<Stream>) -> Result<Event, DecodeError> {
    LineDecoder::default().decode(line, default_stream)
}

/// A line the scanner did not take, with serde_json.
fn decode_unscanned(line: &[u8], default_stream: Option<Stream>, catalog: &Catalog) -> Result<Event, DecodeError> {
    match std::str::from_utf8(line) {
        Ok(text) => json::decode_with_serde(text, default_stream, catalog),
        Err(e) => Err(bad(None, format!("invalid UTF-8 at byte {}", e.valid_up_to()))),
    }
}

/// What [`LineDecoder::decode_gated`] makes of a line.
#[derive(Debug, Clone, PartialEq)]
pub enum Decoded {
    /// Shared as the engine holds events.
    Event(Arc<Event>),
    /// A valid event that no rule takes: only its time matters ([`Engine::pass`](crate::engine::Engine::pass)).
    Time(Millis),
}

impl Decoded {
    /// The event's time.
    pub fn ts(&self) -> Millis {
        match self {
            Decoded::Event(e) => e.ts,
            Decoded::Time(ts) => *ts,
        }
    }
}

#[cfg(test)]
mod tests;
