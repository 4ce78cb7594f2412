//! The full decoder: any JSON line, read with serde's visitor interface straight into the
//! stream's field order, which also words every error. The scanner ([`super::scan`]) takes the
//! plain lines before it and falls back on this.

use super::error::{bad, twice, DecodeError};
use super::time::{parse_time, Millis};
use super::value::Value;
use super::{Event, MAX_STRING};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use vigil_lang::schema::{field_id, Catalog, Stream, Type};

/// Every line the fast path gives up on: any JSON, and the wording of every error.
pub(super) fn decode_with_serde(
    line: &str,
    default_stream: Option<Stream>,
    catalog: &Catalog,
) -> Result<Event, DecodeError> {
    use serde::de::DeserializeSeed;
    let problem = std::cell::RefCell::new(None);
    let mut de = serde_json::Deserializer::from_str(line);
    let result = EventSeed { default_stream, catalog, problem: &problem }
        .deserialize(&mut de)
        .and_then(|e| de.end().map(|()| e));
    match result {
        Ok(e) => Ok(e),
        Err(e) => Err(problem.into_inner().unwrap_or_else(|| match e.classify() {
            serde_json::error::Category::Data => bad(None, "an event must be a JSON object"),
            _ => bad(None, format!("invalid JSON: {e}")),
        })),
    }
}

#[derive(Clone, Copy)]
pub(super) enum Key {
    Stream,
    Ts,
    Field(usize),
    Other,
}

pub(super) struct KeySeed;

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

/// What a field name stands for: `stream`, `ts`, a field some stream declares (by its
/// number, [`field_id`]), or a key no stream has.
pub(super) fn key_of(name: &str) -> Key {
    match name {
        "stream" => Key::Stream,
        "ts" => Key::Ts,
        _ => field_id(name).map_or(Key::Other, Key::Field),
    }
}

/// One JSON value, before it is checked against the stream's schema.
pub(super) enum Raw<'de> {
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

    pub(super) fn as_f64(&self) -> Option<f64> {
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
    catalog: &'p Catalog,
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
            let stream =
                stream_of(Some(map.next_value::<Raw<'de>>()?), self.default_stream, self.catalog).map_err(fail)?;
            return self.typed(stream, map);
        }
        // Otherwise the stream is known only at the end: hold every field until then.
        let (mut stream, mut ts) = (None, None);
        let mut fields: Vec<(usize, Raw<'de>)> = Vec::new();
        let mut key = first;
        while let Some(k) = key {
            match k {
                Key::Stream if stream.is_some() => return Err(fail(twice("stream"))),
                Key::Stream => stream = Some(map.next_value::<Raw<'de>>()?),
                Key::Ts if ts.is_some() => return Err(fail(twice("ts"))),
                Key::Ts => ts = Some(map.next_value::<Raw<'de>>()?),
                Key::Field(g) => fields.push((g, map.next_value::<Raw<'de>>()?)),
                Key::Other => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
            key = map.next_key_seed(KeySeed)?;
        }
        build(stream, ts, fields, self.default_stream, self.catalog).map_err(fail)
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
        // Positions seen, so that a key given twice is refused rather than the last value
        // taken: a reader that takes the first would see another event.
        let mut seen = 0u64;
        while let Some(key) = map.next_key_seed(KeySeed)? {
            match key {
                Key::Stream => return Err(fail(twice("stream"))),
                Key::Ts if ts.is_some() => return Err(fail(twice("ts"))),
                Key::Ts => ts = Some(map.next_value::<Raw<'de>>()?),
                Key::Field(g) => match stream_position(stream, g) {
                    Some(p) if seen & (1 << p) != 0 => return Err(fail(twice(stream.fields()[p].0))),
                    Some(p) => {
                        seen |= 1 << p;
                        let (name, ty) = stream.fields()[p];
                        event.fields[p] = map.next_value_seed(TypedSeed { name, ty })?.map_err(fail)?;
                    }
                    // Another stream's field: not read.
                    None => {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                },
                Key::Other => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        event.ts = ts_of(ts).map_err(fail)?;
        has_required(&event).map_err(fail)?;
        Ok(event)
    }
}

/// Where global field `g` sits in `stream`'s events, if it is one of its fields.
pub(super) fn stream_position(stream: Stream, g: usize) -> Option<usize> {
    stream.position_of_global(g)
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

/// The stream a `stream` field names in `catalog`, or the default one.
pub(super) fn stream_of(
    stream: Option<Raw>,
    default_stream: Option<Stream>,
    catalog: &Catalog,
) -> Result<Stream, DecodeError> {
    match stream {
        Some(Raw::Str(s)) => catalog.stream(&s).ok_or_else(|| {
            bad(
                Some("stream".into()),
                format!("unknown stream `{}`; expected one of {}", clip(&s), catalog.stream_names().join(", ")),
            )
        }),
        Some(_) => Err(bad(Some("stream".into()), "must be a string")),
        None => default_stream.ok_or_else(|| bad(Some("stream".into()), "missing")),
    }
}

/// The event time a `ts` field gives.
pub(super) fn ts_of(ts: Option<Raw>) -> Result<Millis, DecodeError> {
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
    fields: Vec<(usize, Raw)>,
    default_stream: Option<Stream>,
    catalog: &Catalog,
) -> Result<Event, DecodeError> {
    let stream = stream_of(stream, default_stream, catalog)?;
    let ts = ts_of(ts)?;
    let mut event = Event::new(stream, ts);
    let mut placed: Vec<(usize, Raw)> =
        fields.into_iter().filter_map(|(g, raw)| Some((stream.position_of_global(g)?, raw))).collect();
    // In the stream's order, so that the first bad value reported is the one a line in that
    // order would have. The stable sort keeps a field given twice in the order given.
    placed.sort_by_key(|(p, _)| *p);
    if let Some(w) = placed.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(twice(stream.fields()[w[0].0].0));
    }
    for (p, raw) in placed {
        let (name, ty) = stream.fields()[p];
        event.fields[p] = convert(name, ty, raw)?;
    }
    has_required(&event)?;
    Ok(event)
}

/// Refuses an event without a field its stream requires (declared without `?`).
pub(super) fn has_required(event: &Event) -> Result<(), DecodeError> {
    let required = event.stream.required();
    if required == 0 {
        return Ok(());
    }
    match (0..event.fields.len()).find(|&p| required & (1 << p) != 0 && event.fields[p].is_null()) {
        Some(p) => Err(bad(
            Some(event.stream.fields()[p].0.to_string()),
            format!(
                "missing; stream `{}` declares it required (write it `{}?` to let events leave it out)",
                event.stream.name(),
                event.stream.fields()[p].0
            ),
        )),
        None => Ok(()),
    }
}

pub(super) fn convert(name: &str, ty: Type, raw: Raw) -> Result<Value, DecodeError> {
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

pub(super) fn clip(s: &str) -> String {
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
