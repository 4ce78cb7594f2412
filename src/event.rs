//! Events and values: what flows through the engine.
//!
//! An event is one JSON object, `{"stream": "...", "ts": ..., <fields>}`, with `ts` as RFC 3339
//! or epoch milliseconds. Fields are stored in the order of the stream's schema
//! ([`Stream::fields`]), so operators reach them by position.

use crate::schema::{Stream, Type};
use serde_json::Value as Json;
use smol_str::SmolStr;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

mod scan;

/// Event time: milliseconds since the Unix epoch, UTC.
pub type Millis = i64;

/// A value in an event, a state or an expression.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Value {
    /// A missing field, or the result of an operation that has no answer (avg of nothing).
    Null,
    Num(f64),
    /// Text: up to 23 bytes (ids, names) held in the value itself, with nothing to allocate,
    /// copy or free; longer text shared.
    Str(SmolStr),
    Bool(bool),
    /// A duration in milliseconds.
    Dur(i64),
    Time(Millis),
    /// Members of sets are kept as text; numbers in their shortest form.
    Set(Arc<BTreeSet<String>>),
    /// Values of a state field over a range of windows, newest first.
    List(Arc<Vec<f64>>),
    Map(Arc<BTreeMap<String, String>>),
}

impl Value {
    pub fn str(s: &str) -> Value {
        // Up to 23 bytes, what a `SmolStr` holds inline: ids are a few bytes, and copied byte by
        // byte they cost less than `SmolStr::new`'s call to copy and its check for text of only
        // spaces.
        if s.len() <= 23 {
            return Value::Str(SmolStr::new_inline(s));
        }
        Value::Str(SmolStr::new(s))
    }

    /// Lets a value go, without a call to its drop when it owns nothing (numbers, times, text
    /// held inline), which the compiler does not leave out by itself.
    #[inline(always)]
    pub fn discard(self) {
        match self {
            Value::Null | Value::Num(_) | Value::Bool(_) | Value::Dur(_) | Value::Time(_) => std::mem::forget(self),
            Value::Str(ref s) if !s.is_heap_allocated() => std::mem::forget(self),
            owner => drop(owner),
        }
    }

    /// Whether the value is missing: a look at its kind, where `== Value::Null` would call the
    /// comparison of any two values.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Num(n) => Some(*n),
            _ => None,
        }
    }

    /// The text a set member or a template hole shows for this value.
    pub fn to_text(&self) -> String {
        match self {
            Value::Null => "null".into(),
            Value::Num(n) => format_number(*n),
            Value::Str(s) => s.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Dur(ms) => crate::ast::format_duration(ms.unsigned_abs()),
            Value::Time(t) => format_time(*t),
            Value::Set(s) => format!("{{{}}}", s.iter().cloned().collect::<Vec<_>>().join(", ")),
            Value::List(l) => format!("[{}]", l.iter().map(|n| format_number(*n)).collect::<Vec<_>>().join(", ")),
            Value::Map(m) => {
                format!("{{{}}}", m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", "))
            }
        }
    }

    pub fn to_json(&self) -> Json {
        match self {
            Value::Null => Json::Null,
            // Whole numbers print as integers (`3`, not `3.0`), as they usually arrived.
            Value::Num(n) if n.fract() == 0.0 && n.abs() < 9e15 => Json::from(*n as i64),
            Value::Num(n) => serde_json::Number::from_f64(*n).map_or(Json::Null, Json::Number),
            Value::Str(s) => Json::String(s.to_string()),
            Value::Bool(b) => Json::Bool(*b),
            Value::Dur(ms) => Json::from(*ms),
            Value::Time(t) => Json::String(format_time(*t)),
            Value::Set(s) => Json::Array(s.iter().map(|m| Json::String(m.clone())).collect()),
            Value::List(l) => Json::Array(l.iter().map(|n| Value::Num(*n).to_json()).collect()),
            Value::Map(m) => Json::Object(m.iter().map(|(k, v)| (k.clone(), Json::String(v.clone()))).collect()),
        }
    }

    /// A total order used only to break ties between events with the same timestamp, so that
    /// any arrival order of simultaneous events gives the same processing order.
    pub fn tie_order(&self, other: &Value) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        fn rank(v: &Value) -> u8 {
            match v {
                Value::Null => 0,
                Value::Num(_) => 1,
                Value::Str(_) => 2,
                Value::Bool(_) => 3,
                Value::Dur(_) => 4,
                Value::Time(_) => 5,
                Value::Set(_) => 6,
                Value::List(_) => 7,
                Value::Map(_) => 8,
            }
        }
        match (self, other) {
            (Value::Num(a), Value::Num(b)) => a.total_cmp(b),
            (Value::Str(a), Value::Str(b)) => a.cmp(b),
            (Value::Bool(a), Value::Bool(b)) => a.cmp(b),
            (Value::Map(a), Value::Map(b)) => a.cmp(b),
            (a, b) if rank(a) != rank(b) => rank(a).cmp(&rank(b)),
            _ => Ordering::Equal,
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}

/// Numbers print without a trailing `.0` when whole, as JSON would.
pub fn format_number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        format!("{n}")
    }
}

/// RFC 3339 with milliseconds, UTC.
pub fn format_time(ms: Millis) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    match OffsetDateTime::from_unix_timestamp_nanos(nanos) {
        // Four-digit years by hand: a format description is interpreted on every call, and an
        // alert formats several times (its own times, its evidence's).
        Ok(t) if (0..=9999).contains(&t.year()) => {
            let (h, mi, sec, milli) = t.to_hms_milli();
            let mut out = *b"0000-00-00T00:00:00.000Z";
            let mut put = |at: usize, width: usize, mut v: u32| {
                for i in (at..at + width).rev() {
                    out[i] = b'0' + (v % 10) as u8;
                    v /= 10;
                }
            };
            put(0, 4, t.year() as u32);
            put(5, 2, u32::from(u8::from(t.month())));
            put(8, 2, u32::from(t.day()));
            put(11, 2, u32::from(h));
            put(14, 2, u32::from(mi));
            put(17, 2, u32::from(sec));
            put(20, 3, u32::from(milli));
            String::from_utf8_lossy(&out).into_owned()
        }
        Ok(t) => {
            let fmt = time::macros::format_description!(
                "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
            );
            t.format(&fmt).unwrap_or_else(|_| ms.to_string())
        }
        Err(_) => ms.to_string(),
    }
}

/// The wall clock, in epoch milliseconds.
pub fn now_ms() -> Millis {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Parses RFC 3339 (`2026-01-01T00:00:00Z`) into epoch milliseconds.
pub fn parse_time(s: &str) -> Option<Millis> {
    let t = OffsetDateTime::parse(s.trim(), &Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

/// The earliest event time taken in: the Unix epoch (traces that count from their own start,
/// as Google's and Alibaba's do, begin there).
pub const MIN_TS: Millis = 0;
/// The latest event time taken in: the last millisecond of year 9999. Within these bounds no
/// sum of an event time and a duration a rule can write (ten years at most) overflows.
pub const MAX_TS: Millis = 253_402_300_799_999;

/// Which event times are taken in, beyond [`MIN_TS`]..=[`MAX_TS`]: not too far ahead of the
/// wall clock, nor of the watermark. An event outside them is refused with the reason, so that
/// one hostile or broken timestamp cannot move event time far ahead and make every later event
/// late.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TimeBounds {
    /// How far ahead of the wall clock `ts` may be.
    pub max_future_ms: Option<Millis>,
    /// How far ahead of the watermark `ts` may be.
    pub max_jump_ms: Option<Millis>,
}

impl TimeBounds {
    /// Whether `ts` is taken when the wall clock says `now` and event time is at `watermark`.
    pub fn check(&self, ts: Millis, now: Millis, watermark: Option<Millis>) -> Result<(), DecodeError> {
        let refuse = |reason: String| Err(bad(Some("ts".into()), reason));
        if !(MIN_TS..=MAX_TS).contains(&ts) {
            return refuse(format!("{} is outside 1970-01-01 to 9999-12-31", time_text(ts)));
        }
        if let Some(max) = self.max_future_ms {
            if ts > now.saturating_add(max) {
                return refuse(format!(
                    "{} is {} ahead of this machine's clock; at most {} is accepted",
                    format_time(ts),
                    crate::ast::human_duration(ts.abs_diff(now)),
                    crate::ast::human_duration(max.unsigned_abs())
                ));
            }
        }
        if let (Some(max), Some(w)) = (self.max_jump_ms, watermark) {
            if ts > w.saturating_add(max) {
                return refuse(format!(
                    "{} is {} ahead of event time ({}); at most {} is accepted",
                    format_time(ts),
                    crate::ast::human_duration(ts.abs_diff(w)),
                    format_time(w),
                    crate::ast::human_duration(max.unsigned_abs())
                ));
            }
        }
        Ok(())
    }
}

/// A time for a message: RFC 3339 when it has a four-digit year, else epoch milliseconds.
fn time_text(ts: Millis) -> String {
    if (MIN_TS..=MAX_TS).contains(&ts) {
        format_time(ts)
    } else {
        format!("{ts} (epoch milliseconds)")
    }
}

/// The position that stands for `ts` in field lookups by index.
pub const TS_INDEX: usize = usize::MAX;

/// Position of `field` in `stream`'s events, [`TS_INDEX`] for `ts`.
pub fn field_position(stream: Stream, field: &str) -> usize {
    if field == "ts" {
        TS_INDEX
    } else {
        stream.field_index(field).unwrap_or(TS_INDEX - 1)
    }
}

/// One event of a built-in stream.
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
        self.ts.cmp(&other.ts).then((self.stream as u8).cmp(&(other.stream as u8))).then_with(|| {
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

/// Why an input line is not an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// The field at fault, if one is.
    pub field: Option<String>,
    pub reason: String,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.field {
            Some(field) => write!(f, "field `{field}`: {}", self.reason),
            None => f.write_str(&self.reason),
        }
    }
}

fn bad(field: impl Into<Option<String>>, reason: impl Into<String>) -> DecodeError {
    DecodeError { field: field.into(), reason: reason.into() }
}

fn twice(field: &str) -> DecodeError {
    bad(Some(field.to_string()), "given twice; an event names each field once")
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
/// like the last ones is read value by value (see the fast path, [`scan`]).
#[derive(Default)]
pub struct LineDecoder {
    memory: scan::ScanMemory,
}

impl LineDecoder {
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
        if let Some(event) = scan::scan(line, default_stream, &mut self.memory) {
            return Ok(event);
        }
        decode_unscanned(line, default_stream)
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
        if let Some(decoded) = scan::scan_gated(line, default_stream, gate, &mut self.memory, pool) {
            return Ok(decoded);
        }
        decode_unscanned(line, default_stream).map(|event| Decoded::Event(Arc::new(event)))
    }
}

/// Decodes one JSON line with a decoder of its own; see [`LineDecoder::decode`]. A caller with
/// many lines keeps a [`LineDecoder`].
pub fn decode(line: &str, default_stream: Option<Stream>) -> Result<Event, DecodeError> {
    LineDecoder::default().decode(line, default_stream)
}

/// A line the scanner did not take, with serde_json.
fn decode_unscanned(line: &[u8], default_stream: Option<Stream>) -> Result<Event, DecodeError> {
    match std::str::from_utf8(line) {
        Ok(text) => decode_with_serde(text, default_stream),
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

/// Every line the fast path gives up on: any JSON, and the wording of every error.
fn decode_with_serde(line: &str, default_stream: Option<Stream>) -> Result<Event, DecodeError> {
    use serde::de::DeserializeSeed;
    let problem = std::cell::RefCell::new(None);
    let mut de = serde_json::Deserializer::from_str(line);
    let result =
        EventSeed { default_stream, problem: &problem }.deserialize(&mut de).and_then(|e| de.end().map(|()| e));
    match result {
        Ok(e) => Ok(e),
        Err(e) => Err(problem.into_inner().unwrap_or_else(|| match e.classify() {
            serde_json::error::Category::Data => bad(None, "an event must be a JSON object"),
            _ => bad(None, format!("invalid JSON: {e}")),
        })),
    }
}

/// Every field name of every stream, numbered; keys are matched once, without allocating.
const FIELD_NAMES: [&str; 22] = [
    "job_id",
    "task_index",
    "machine_id",
    "type",
    "user",
    "priority",
    "sched_class",
    "cpu_request",
    "mem_request",
    "cpu",
    "mem",
    "max_cpu",
    "max_mem",
    "disk_io",
    "cpi",
    "cpus",
    "memory",
    "detail",
    "host",
    "name",
    "value",
    "labels",
];

/// `FIELD_NAMES` position of each field of each stream, computed once.
fn global_index(stream: Stream, i: usize) -> usize {
    static TABLE: std::sync::OnceLock<Vec<Vec<usize>>> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        Stream::ALL
            .iter()
            .map(|s| {
                s.fields()
                    .iter()
                    .map(|(name, _)| {
                        FIELD_NAMES.iter().position(|n| n == name).expect("every stream field is in FIELD_NAMES")
                    })
                    .collect()
            })
            .collect()
    });
    table[stream as usize][i]
}

#[derive(Clone, Copy)]
enum Key {
    Stream,
    Ts,
    Field(usize),
    Other,
}

struct KeySeed;

impl<'de> serde::de::DeserializeSeed<'de> for KeySeed {
    type Value = Key;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for KeySeed {
    type Value = Key;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(key_of(v))
    }
}

/// What a field name stands for. A `match` on the text compiles to a switch on its length and
/// a few comparisons, several times faster than a search of the name list.
fn key_of(name: &str) -> Key {
    match name {
        "stream" => Key::Stream,
        "ts" => Key::Ts,
        "job_id" => Key::Field(0),
        "task_index" => Key::Field(1),
        "machine_id" => Key::Field(2),
        "type" => Key::Field(3),
        "user" => Key::Field(4),
        "priority" => Key::Field(5),
        "sched_class" => Key::Field(6),
        "cpu_request" => Key::Field(7),
        "mem_request" => Key::Field(8),
        "cpu" => Key::Field(9),
        "mem" => Key::Field(10),
        "max_cpu" => Key::Field(11),
        "max_mem" => Key::Field(12),
        "disk_io" => Key::Field(13),
        "cpi" => Key::Field(14),
        "cpus" => Key::Field(15),
        "memory" => Key::Field(16),
        "detail" => Key::Field(17),
        "host" => Key::Field(18),
        "name" => Key::Field(19),
        "value" => Key::Field(20),
        "labels" => Key::Field(21),
        _ => Key::Other,
    }
}

/// One JSON value, before it is checked against the stream's schema.
enum Raw<'de> {
    Null,
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(std::borrow::Cow<'de, str>),
    Bool(bool),
    Map(Vec<(std::borrow::Cow<'de, str>, Raw<'de>)>),
    Array,
}

impl<'de> serde::Deserialize<'de> for Raw<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RawVisitor)
    }
}

struct RawVisitor;

impl<'de> serde::de::Visitor<'de> for RawVisitor {
    type Value = Raw<'de>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Raw<'de>, E> {
        Ok(Raw::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Raw<'de>, E> {
        Ok(Raw::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Raw<'de>, E> {
        Ok(Raw::UInt(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Raw<'de>, E> {
        Ok(Raw::Float(v))
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Raw<'de>, E> {
        Ok(Raw::Str(std::borrow::Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Raw<'de>, E> {
        Ok(Raw::Str(std::borrow::Cow::Owned(v.to_string())))
    }
    fn visit_string<E>(self, v: String) -> Result<Raw<'de>, E> {
        Ok(Raw::Str(std::borrow::Cow::Owned(v)))
    }
    fn visit_unit<E>(self) -> Result<Raw<'de>, E> {
        Ok(Raw::Null)
    }
    fn visit_none<E>(self) -> Result<Raw<'de>, E> {
        Ok(Raw::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Raw<'de>, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(Raw::Array)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Raw<'de>, A::Error> {
        let mut out = Vec::new();
        while let Some((k, v)) = map.next_entry::<std::borrow::Cow<'de, str>, Raw<'de>>()? {
            out.push((k, v));
        }
        Ok(Raw::Map(out))
    }
}

impl Raw<'_> {
    fn kind(&self) -> &'static str {
        match self {
            Raw::Null => "null",
            Raw::Int(_) | Raw::UInt(_) | Raw::Float(_) => "a number",
            Raw::Str(_) => "a string",
            Raw::Bool(_) => "a bool",
            Raw::Map(_) => "an object",
            Raw::Array => "an array",
        }
    }

    /// A number as JSON writes it, for numeric ids and label values.
    fn number_text(&self) -> Option<String> {
        match self {
            Raw::Int(i) => Some(i.to_string()),
            Raw::UInt(u) => Some(u.to_string()),
            Raw::Float(f) => serde_json::Number::from_f64(*f).map(|n| n.to_string()),
            _ => None,
        }
    }

    fn as_f64(&self) -> Option<f64> {
        match self {
            Raw::Int(i) => Some(*i as f64),
            Raw::UInt(u) => Some(*u as f64),
            Raw::Float(f) => Some(*f),
            _ => None,
        }
    }
}

struct EventSeed<'p> {
    default_stream: Option<Stream>,
    /// Why the line is not an event, when the reason is ours rather than the JSON parser's.
    problem: &'p std::cell::RefCell<Option<DecodeError>>,
}

impl<'de> serde::de::DeserializeSeed<'de> for EventSeed<'_> {
    type Value = Event;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Event, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for EventSeed<'_> {
    type Value = Event;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an event object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Event, A::Error> {
        let fail = |e: DecodeError| self.fail::<A::Error>(e);
        let first = map.next_key_seed(KeySeed)?;
        // The usual case, `stream` first: every field goes straight to its place in the event.
        if let Some(Key::Stream) = first {
            let stream = stream_of(Some(map.next_value::<Raw<'de>>()?), self.default_stream).map_err(fail)?;
            return self.typed(stream, map);
        }
        // Otherwise the stream is known only at the end: hold every field until then.
        let (mut stream, mut ts) = (None, None);
        let mut fields: [Option<Raw<'de>>; FIELD_NAMES.len()] = Default::default();
        let mut key = first;
        while let Some(k) = key {
            match k {
                Key::Stream if stream.is_some() => return Err(fail(twice("stream"))),
                Key::Stream => stream = Some(map.next_value::<Raw<'de>>()?),
                Key::Ts if ts.is_some() => return Err(fail(twice("ts"))),
                Key::Ts => ts = Some(map.next_value::<Raw<'de>>()?),
                Key::Field(i) if fields[i].is_some() => return Err(fail(twice(FIELD_NAMES[i]))),
                Key::Field(i) => fields[i] = Some(map.next_value::<Raw<'de>>()?),
                Key::Other => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
            key = map.next_key_seed(KeySeed)?;
        }
        build(stream, ts, &mut fields, self.default_stream).map_err(fail)
    }
}

impl EventSeed<'_> {
    /// Keeps our reason for refusing the line, and stops the parser.
    fn fail<E: serde::de::Error>(&self, e: DecodeError) -> E {
        *self.problem.borrow_mut() = Some(e);
        E::custom("not an event")
    }

    /// Reads the rest of an event whose stream is known.
    fn typed<'de, A: serde::de::MapAccess<'de>>(self, stream: Stream, mut map: A) -> Result<Event, A::Error> {
        let fail = |e: DecodeError| self.fail::<A::Error>(e);
        let mut event = Event::new(stream, 0);
        let mut ts = None;
        // Global field numbers seen, so that a key given twice is refused rather than the last
        // value taken: a reader that takes the first would see another event.
        let mut seen = 0u32;
        while let Some(key) = map.next_key_seed(KeySeed)? {
            match key {
                Key::Stream => return Err(fail(twice("stream"))),
                Key::Ts if ts.is_some() => return Err(fail(twice("ts"))),
                Key::Ts => ts = Some(map.next_value::<Raw<'de>>()?),
                Key::Field(g) if seen & (1 << g) != 0 => return Err(fail(twice(FIELD_NAMES[g]))),
                Key::Field(g) => match stream_position(stream, g) {
                    Some(p) => {
                        seen |= 1 << g;
                        let (name, ty) = stream.fields()[p];
                        event.fields[p] = map.next_value_seed(TypedSeed { name, ty })?.map_err(fail)?;
                    }
                    None => {
                        seen |= 1 << g;
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                },
                Key::Other => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        event.ts = ts_of(ts).map_err(fail)?;
        Ok(event)
    }
}

/// Where global field `g` sits in `stream`'s events, if it is one of its fields.
fn stream_position(stream: Stream, g: usize) -> Option<usize> {
    static TABLE: std::sync::OnceLock<Vec<[Option<u8>; FIELD_NAMES.len()]>> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        Stream::ALL
            .iter()
            .map(|s| {
                let mut row = [None; FIELD_NAMES.len()];
                for i in 0..s.fields().len() {
                    row[global_index(*s, i)] = Some(i as u8);
                }
                row
            })
            .collect()
    });
    table[stream as usize][g].map(usize::from)
}

/// One field's value, decoded for its type: numbers and plain strings directly, anything else
/// through [`convert`], so the errors are the same on both paths.
struct TypedSeed {
    name: &'static str,
    ty: Type,
}

impl<'de> serde::de::DeserializeSeed<'de> for TypedSeed {
    type Value = Result<Value, DecodeError>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl TypedSeed {
    fn number(self, raw: Raw) -> Result<Value, DecodeError> {
        match self.ty {
            Type::Number => Ok(Value::Num(raw.as_f64().unwrap_or(f64::NAN))),
            _ => convert(self.name, self.ty, raw),
        }
    }
}

impl<'de> serde::de::Visitor<'de> for TypedSeed {
    type Value = Result<Value, DecodeError>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(convert(self.name, self.ty, Raw::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(self.number(Raw::Int(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(self.number(Raw::UInt(v)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(self.number(Raw::Float(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(match self.ty {
            Type::Str if v.len() <= MAX_STRING => Ok(Value::str(v)),
            _ => convert(self.name, self.ty, Raw::Str(std::borrow::Cow::Borrowed(v))),
        })
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Ok(Value::Null))
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Ok(Value::Null))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Ok(convert(self.name, self.ty, RawVisitor.visit_seq(seq)?))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        Ok(convert(self.name, self.ty, RawVisitor.visit_map(map)?))
    }
}

/// The stream a `stream` field names, or the default one.
fn stream_of(stream: Option<Raw>, default_stream: Option<Stream>) -> Result<Stream, DecodeError> {
    match stream {
        Some(Raw::Str(s)) => Stream::from_name(&s).ok_or_else(|| {
            let names: Vec<&str> = Stream::ALL.iter().map(|s| s.name()).collect();
            bad(Some("stream".into()), format!("unknown stream `{}`; expected one of {}", clip(&s), names.join(", ")))
        }),
        Some(_) => Err(bad(Some("stream".into()), "must be a string")),
        None => default_stream.ok_or_else(|| bad(Some("stream".into()), "missing")),
    }
}

/// The event time a `ts` field gives.
fn ts_of(ts: Option<Raw>) -> Result<Millis, DecodeError> {
    match ts {
        Some(Raw::Int(i)) => Ok(i),
        Some(Raw::UInt(u)) => i64::try_from(u).map_err(|_| bad(Some("ts".into()), "epoch milliseconds out of range")),
        Some(Raw::Float(f)) if f.is_finite() && f.abs() < 9e15 => Ok(f as i64),
        Some(Raw::Float(_)) => Err(bad(Some("ts".into()), "epoch milliseconds out of range")),
        Some(Raw::Str(s)) => {
            parse_time(&s).ok_or_else(|| bad(Some("ts".into()), format!("`{}` is not an RFC 3339 time", clip(&s))))
        }
        Some(_) => Err(bad(Some("ts".into()), "must be RFC 3339 text or epoch milliseconds")),
        None => Err(bad(Some("ts".into()), "missing")),
    }
}

fn build(
    stream: Option<Raw>,
    ts: Option<Raw>,
    fields: &mut [Option<Raw>],
    default_stream: Option<Stream>,
) -> Result<Event, DecodeError> {
    let stream = stream_of(stream, default_stream)?;
    let ts = ts_of(ts)?;
    let mut event = Event::new(stream, ts);
    for (i, (name, ty)) in stream.fields().iter().enumerate() {
        if let Some(raw) = fields[global_index(stream, i)].take() {
            event.fields[i] = convert(name, *ty, raw)?;
        }
    }
    Ok(event)
}

fn convert(name: &str, ty: Type, raw: Raw) -> Result<Value, DecodeError> {
    let field = || Some(name.to_string());
    Ok(match (ty, raw) {
        (_, Raw::Null) => Value::Null,
        (Type::Number, r @ (Raw::Int(_) | Raw::UInt(_) | Raw::Float(_))) => Value::Num(r.as_f64().unwrap_or(f64::NAN)),
        // Numbers sent as text (CSV exports) are accepted when they parse.
        (Type::Number, Raw::Str(s)) => {
            Value::Num(s.trim().parse().map_err(|_| bad(field(), format!("`{}` is not a number", clip(&s))))?)
        }
        (Type::Str, Raw::Str(s)) if s.len() > MAX_STRING => {
            return Err(bad(field(), format!("string of {} bytes is longer than {MAX_STRING}", s.len())))
        }
        (Type::Str, Raw::Str(s)) => Value::str(&s),
        // Ids are text; numeric ids (the Google trace's) are taken as their decimal text.
        (Type::Str, r @ (Raw::Int(_) | Raw::UInt(_) | Raw::Float(_))) => {
            Value::str(&r.number_text().unwrap_or_default())
        }
        (Type::Str, Raw::Bool(b)) => Value::str(&b.to_string()),
        (Type::Map, Raw::Map(entries)) => {
            let mut out = BTreeMap::new();
            for (k, v) in entries {
                let text = match &v {
                    Raw::Str(s) => s.to_string(),
                    Raw::Bool(b) => b.to_string(),
                    n => n.number_text().ok_or_else(|| bad(Some(format!("{name}.{k}")), "label values are strings"))?,
                };
                out.insert(k.into_owned(), text);
            }
            Value::Map(Arc::new(out))
        }
        (ty, other) => return Err(bad(field(), format!("expected {ty}, found {}", other.kind()))),
    })
}

fn clip(s: &str) -> String {
    if s.len() <= 40 {
        s.to_string()
    } else {
        let mut end = 40;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...", &s[..end])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_holds_short_text_in_its_24_bytes() {
        // Group keys and events are lists of values: a larger value would cost every key.
        assert_eq!(std::mem::size_of::<Value>(), 24);
        assert!(matches!(Value::str("m1234"), Value::Str(s) if !s.is_heap_allocated()));
        let long = "x".repeat(100);
        assert!(matches!(Value::str(&long), Value::Str(s) if s.is_heap_allocated() && *s == long));
    }

    #[test]
    fn every_field_name_is_matched_to_its_number() {
        for (i, name) in FIELD_NAMES.iter().enumerate() {
            let key: Result<Key, serde::de::value::Error> = serde::de::Visitor::visit_str(KeySeed, name);
            assert!(matches!(key, Ok(Key::Field(n)) if n == i), "{name}");
        }
    }

    #[test]
    fn times_format_as_rfc3339_with_milliseconds() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_time(1_767_225_600_123), "2026-01-01T00:00:00.123Z");
        assert_eq!(format_time(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(format_time(951_782_400_000), "2000-02-29T00:00:00.000Z");
        for ms in [0, 1_767_225_600_123, -86_400_001, 253_402_300_799_999] {
            assert_eq!(parse_time(&format_time(ms)), Some(ms));
        }
    }

    #[test]
    fn stream_first_or_last_decodes_the_same() {
        let fields = r#""ts":"2026-01-01T00:00:00Z","machine_id":7,"job_id":"j","task_index":"3","cpu":0.5,"labels":{"a":"b"},"extra":[1,[2]]"#;
        let first = decode(&format!(r#"{{"stream":"task_usage",{fields}}}"#), None).expect("event");
        let last = decode(&format!(r#"{{{fields},"stream":"task_usage"}}"#), None).expect("event");
        assert_eq!(first, last);
        assert_eq!(first.get("machine_id"), Value::str("7"));
        assert_eq!(first.get("task_index"), Value::Num(3.0));
        for bad in [r#""cpu":"high""#, r#""cpu":[1]"#, r#""job_id":{"x":1}"#] {
            let a = decode(&format!(r#"{{"stream":"task_usage","ts":0,{bad}}}"#), None).expect_err("bad");
            let b = decode(&format!(r#"{{"ts":0,{bad},"stream":"task_usage"}}"#), None).expect_err("bad");
            assert_eq!(a.to_string(), b.to_string());
        }
        let twice = decode(r#"{"stream":"metric","ts":0,"stream":"task_usage"}"#, None).expect_err("two streams");
        assert_eq!(twice.field.as_deref(), Some("stream"));
    }

    #[test]
    fn a_key_given_twice_is_refused_whichever_comes_first() {
        // A second `ts` would otherwise win, and could hide a hostile time behind a normal one.
        for line in [
            r#"{"stream":"metric","ts":0,"host":"h","ts":253402300799999}"#,
            r#"{"ts":0,"host":"h","ts":1,"stream":"metric"}"#,
            r#"{"stream":"metric","ts":0,"host":"h","host":"g"}"#,
            r#"{"host":"h","ts":0,"host":"g","stream":"metric"}"#,
            r#"{"stream":"metric","ts":0,"stream":"metric"}"#,
            r#"{"stream":"task_usage","ts":0,"host":1,"host":2}"#,
        ] {
            let e = decode(line, None).expect_err(line);
            assert!(e.reason.contains("given twice"), "{line}: {e}");
        }
        // Unknown keys may repeat: Vigil does not read them.
        assert!(decode(r#"{"stream":"metric","ts":0,"x":1,"x":2}"#, None).is_ok());
    }

    #[test]
    fn time_bounds_refuse_times_out_of_range_and_too_far_ahead() {
        let now = 1_767_225_600_000;
        let bounds = TimeBounds { max_future_ms: Some(300_000), max_jump_ms: Some(3_600_000) };
        assert!(bounds.check(now, now, None).is_ok());
        assert!(bounds.check(now + 300_000, now, Some(now)).is_ok());
        let far = bounds.check(MAX_TS, now, None).expect_err("far future");
        assert!(far.to_string().starts_with("field `ts`: 9999-12-31T23:59:59.999Z is 7973.8 years ahead"), "{far}");
        for ts in [i64::MAX, i64::MIN, -1, MAX_TS + 1] {
            let e = TimeBounds::default().check(ts, now, None).expect_err("out of range");
            assert!(e.reason.contains("outside 1970-01-01 to 9999-12-31"), "{e}");
        }
        let jump = bounds.check(now - 600_000, now, Some(now - 4_300_000)).expect_err("a jump");
        assert!(jump.reason.contains("ahead of event time"), "{jump}");
        assert!(TimeBounds::default().check(MAX_TS, now, Some(0)).is_ok(), "no limits but the range");
    }

    #[test]
    fn decodes_rfc3339_and_epoch_millis() {
        let a =
            decode(r#"{"stream":"metric","ts":"2026-01-01T00:00:01.500Z","host":"h","name":"cpu","value":3}"#, None)
                .expect("valid");
        let b =
            decode(r#"{"stream":"metric","ts":1767225601500,"host":"h","name":"cpu","value":3}"#, None).expect("valid");
        assert_eq!(a, b);
        assert_eq!(format_time(a.ts), "2026-01-01T00:00:01.500Z");
        assert_eq!(a.get("value"), Value::Num(3.0));
    }

    #[test]
    fn numeric_ids_become_text_and_unknown_fields_are_ignored() {
        let e =
            decode(r#"{"stream":"task_event","ts":0,"job_id":42,"task_index":"3","type":"FAIL","extra":[1]}"#, None)
                .expect("valid");
        assert_eq!(e.get("job_id"), Value::str("42"));
        assert_eq!(e.get("task_index"), Value::Num(3.0));
        assert_eq!(e.event_type(), Some("FAIL"));
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (r#"{"ts":0}"#, "field `stream`: missing"),
            (
                r#"{"stream":"nope","ts":0}"#,
                "field `stream`: unknown stream `nope`; expected one of task_event, task_usage, machine_event, metric",
            ),
            (r#"{"stream":"metric"}"#, "field `ts`: missing"),
            (r#"{"stream":"metric","ts":"yesterday"}"#, "field `ts`: `yesterday` is not an RFC 3339 time"),
            (r#"{"stream":"metric","ts":0,"value":"high"}"#, "field `value`: `high` is not a number"),
            (r#"{"stream":"metric","ts":0,"host":[1]}"#, "field `host`: expected string, found an array"),
            (r#"[1,2]"#, "an event must be a JSON object"),
        ];
        for (line, want) in cases {
            assert_eq!(decode(line, None).expect_err(line).to_string(), want);
        }
        assert!(decode("{", None).expect_err("truncated").to_string().starts_with("invalid JSON"));
    }
}
