//! InfluxDB line protocol (what Telegraf and the Influx clients write) to `metric` events.
//!
//! A line `measurement,tag=v,... field=value,... [timestamp]` is one sample per numeric field:
//!
//! | line protocol | `metric` event |
//! |---|---|
//! | field `value` of measurement `m` | `name` = `m` |
//! | any other field `f` of measurement `m` | `name` = `m_f` (Telegraf's Prometheus naming) |
//! | float, integer (`i`), unsigned (`u`) field | `value` |
//! | boolean field | `value` 1 or 0 |
//! | string field | no sample (counted as skipped) |
//! | the host tag (`host` by default) | `host` |
//! | no host tag | `host` = [`FLEET_HOST`], as remote-write does |
//! | every other tag | `labels` |
//! | timestamp, in the request's precision (ns by default) | `ts`, in milliseconds |
//! | no timestamp | `ts` = when the line was received |
//!
//! A line without the host tag (Telegraf's `omit_hostname`, a client that names no host) is kept
//! under the fleet-level host rather than refused: a sender drops a refused batch whole.
//! Parsing is InfluxDB IOx's parser (`influxdb-line-protocol`).

use crate::remote_write::FLEET_HOST;
use std::collections::BTreeMap;
use std::sync::Arc;
use vigil_engine::event::{DecodeError, Event, Millis, Value};
use vigil_lang::schema::Stream;

/// The unit of line protocol timestamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    #[default]
    Nanoseconds,
    Microseconds,
    Milliseconds,
    Seconds,
    Minutes,
    Hours,
}

impl Precision {
    /// The `precision` parameter of the InfluxDB 2 API (`ns`, `us`, `ms`, `s`) or of the 1.x
    /// API (`n`, `u`, `ms`, `s`, `m`, `h`).
    pub fn parse(text: &str) -> Option<Precision> {
        Some(match text {
            "ns" | "n" => Precision::Nanoseconds,
            "us" | "u" | "µ" => Precision::Microseconds,
            "ms" => Precision::Milliseconds,
            "s" => Precision::Seconds,
            "m" => Precision::Minutes,
            "h" => Precision::Hours,
            _ => return None,
        })
    }

    /// A timestamp in this unit as epoch milliseconds (rounded down); none when it does not fit.
    fn to_ms(self, t: i64) -> Option<Millis> {
        match self {
            Precision::Nanoseconds => Some(t.div_euclid(1_000_000)),
            Precision::Microseconds => Some(t.div_euclid(1_000)),
            Precision::Milliseconds => Some(t),
            Precision::Seconds => t.checked_mul(1_000),
            Precision::Minutes => t.checked_mul(60_000),
            Precision::Hours => t.checked_mul(3_600_000),
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Precision::parse(s).ok_or_else(|| format!("`{s}` is not a precision: use ns, us, ms, s, m or h"))
    }
}

/// How lines become samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// The tag that names the host.
    pub host_tag: String,
    pub precision: Precision,
}

impl Default for Mapping {
    fn default() -> Self {
        Mapping { host_tag: "host".into(), precision: Precision::Nanoseconds }
    }
}

/// The samples of one line.
#[derive(Debug, Default, PartialEq)]
pub struct Samples {
    pub events: Vec<Event>,
    /// String fields, which are not samples.
    pub skipped: usize,
}

/// The lines of a body with their 1-based line numbers, blank lines and `#` comments left out.
/// A line ends at a newline outside a quoted string field.
pub fn lines(body: &str) -> impl Iterator<Item = (u64, &str)> {
    let mut line_no = 1u64;
    let mut last = 0usize;
    influxdb_line_protocol::split_lines(body).filter_map(move |line| {
        // `line` is a slice of `body`: count the newlines between the last line and this one.
        let at = line.as_ptr() as usize - body.as_ptr() as usize;
        line_no += memchr::memchr_iter(b'\n', &body.as_bytes()[last..at]).count() as u64;
        last = at;
        let trimmed = line.trim_matches(|c: char| c.is_ascii_whitespace());
        (!trimmed.is_empty() && !trimmed.starts_with('#')).then_some((line_no, trimmed))
    })
}

/// The samples of one line; `now` is the time of lines without a timestamp.
pub fn samples(line: &str, mapping: &Mapping, now: Millis) -> Result<Samples, DecodeError> {
    let whole = |reason: String| DecodeError { field: None, reason };
    let parsed = match influxdb_line_protocol::parse_lines(line).next() {
        Some(Ok(parsed)) => parsed,
        Some(Err(e)) => return Err(whole(format!("not line protocol: {e}"))),
        None => return Err(whole("no line".into())),
    };
    let ts = match parsed.timestamp {
        None => now,
        Some(t) => mapping.precision.to_ms(t).ok_or_else(|| whole(format!("the timestamp {t} is out of range")))?,
    };
    let tags = parsed.series.tag_set.iter().flatten().map(|(k, v)| (k.as_str(), v.as_str()));
    let fields = parsed.field_set.iter().map(|(field, value)| {
        use influxdb_line_protocol::FieldValue as F;
        let value = match value {
            F::F64(v) => Some(*v),
            F::I64(v) => Some(*v as f64),
            F::U64(v) => Some(*v as f64),
            F::Boolean(b) => Some(f64::from(u8::from(*b))),
            F::String(_) => None,
        };
        (field.as_str(), value)
    });
    metric_samples(parsed.series.measurement.as_str(), tags, fields, ts, &mapping.host_tag)
}

/// The samples of one measurement at `ts`: a sample per numeric field (`None`: a string field,
/// skipped), the host from the tag `host_tag`, the other tags as labels.
fn metric_samples<'a>(
    measurement: &str,
    tags: impl Iterator<Item = (&'a str, &'a str)>,
    fields: impl Iterator<Item = (&'a str, Option<f64>)>,
    ts: Millis,
    host_tag: &str,
) -> Result<Samples, DecodeError> {
    let mut host = None;
    let mut labels = BTreeMap::new();
    for (key, value) in tags {
        if key == host_tag {
            host = Some(value);
        } else {
            labels.insert(key.to_string(), value.to_string());
        }
    }
    let host = host.unwrap_or(FLEET_HOST);
    let labels = (!labels.is_empty()).then(|| Value::Map(Arc::new(labels)));
    let mut out = Samples::default();
    for (field, value) in fields {
        let Some(value) = value else {
            out.skipped += 1;
            continue;
        };
        if !value.is_finite() {
            return Err(DecodeError { field: Some(field.to_string()), reason: "not a finite number".into() });
        }
        let name = match field {
            "value" => measurement.to_string(),
            f => format!("{measurement}_{f}"),
        };
        let mut event = Event::new(Stream::Metric, ts);
        event.set("host", Value::str(host)).set("name", Value::str(&name)).set("value", Value::Num(value));
        if let Some(labels) = &labels {
            event.set("labels", labels.clone());
        }
        // Telegraf's `cpu` plugin documents its `usage_*` fields as percentages; other names
        // say their unit by Prometheus' suffixes (`mem_used_percent`) or not at all.
        let unit = match (measurement, field.starts_with("usage_")) {
            ("cpu", true) => Some("percent"),
            _ => crate::metric_kind::unit_by_name(&name),
        };
        if let Some(unit) = unit {
            event.set("unit", Value::str(unit));
        }
        out.events.push(event);
    }
    Ok(out)
}

/// The samples of a message of Telegraf's JSON output (`data_format = "json"`): one metric
/// `{"name", "tags", "fields", "timestamp"}`, or a batch `{"metrics": [...]}`
/// (`use_batch_format`). Each metric maps as a line of line protocol does; its samples, or why it
/// is refused, in order. A numeric timestamp's unit is read from its size (Telegraf writes
/// seconds by default, and `json_timestamp_units` can make it ms, us or ns: 10, 13, 16 and 19
/// digits for times of this era); a text one is RFC 3339.
pub fn telegraf_json(text: &str, host_tag: &str) -> Vec<Result<Samples, DecodeError>> {
    let whole = |reason: String| DecodeError { field: None, reason };
    let value: serde_json::Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return vec![Err(whole(format!("not JSON (line {}, column {}): {e}", e.line(), e.column())))],
    };
    match value.get("metrics") {
        Some(serde_json::Value::Array(metrics)) => metrics.iter().map(|m| telegraf_metric(m, host_tag)).collect(),
        _ => vec![telegraf_metric(&value, host_tag)],
    }
}

fn telegraf_metric(m: &serde_json::Value, host_tag: &str) -> Result<Samples, DecodeError> {
    let bad = |field: &str, reason: &str| DecodeError { field: Some(field.into()), reason: reason.into() };
    let name = m.get("name").and_then(|n| n.as_str()).ok_or_else(|| bad("name", "a metric needs a text `name`"))?;
    let ts = match m.get("timestamp") {
        Some(serde_json::Value::Number(n)) => n.as_i64().and_then(epoch_ms),
        Some(serde_json::Value::String(t)) => vigil_engine::event::parse_time(t),
        _ => None,
    }
    .ok_or_else(|| bad("timestamp", "a metric needs a `timestamp`: epoch seconds (or ms, us, ns) or RFC 3339"))?;
    let tags = match m.get("tags") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::Object(t)) => Some(t),
        Some(_) => return Err(bad("tags", "`tags` must be an object of texts")),
    };
    let tags = tags.into_iter().flatten().filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)));
    let Some(serde_json::Value::Object(fields)) = m.get("fields") else {
        return Err(bad("fields", "a metric needs an object of `fields`"));
    };
    let fields = fields.iter().map(|(k, v)| {
        let value = match v {
            serde_json::Value::Number(n) => n.as_f64(),
            serde_json::Value::Bool(b) => Some(f64::from(u8::from(*b))),
            _ => None,
        };
        (k.as_str(), value)
    });
    metric_samples(name, tags, fields, ts, host_tag)
}

/// Epoch seconds, milliseconds, microseconds or nanoseconds, told apart by size, as ms.
fn epoch_ms(t: i64) -> Option<Millis> {
    match t.unsigned_abs() {
        0..100_000_000_000 => t.checked_mul(1_000),
        100_000_000_000..100_000_000_000_000 => Some(t),
        100_000_000_000_000..100_000_000_000_000_000 => Some(t.div_euclid(1_000)),
        _ => Some(t.div_euclid(1_000_000)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each sample's name, value and time.
    fn named(s: &Samples) -> Vec<(String, f64, Millis)> {
        s.events.iter().map(|e| (e.get("name").to_text(), e.get("value").as_f64().expect("value"), e.ts)).collect()
    }

    fn one(line: &str) -> Result<Samples, DecodeError> {
        samples(line, &Mapping::default(), 42)
    }

    #[test]
    fn every_numeric_field_is_a_sample_named_after_its_measurement() {
        let s = one(r#"cpu,host=web-1,cpu=cpu0 usage_idle=91.5,value=3i,up=true,note="x" 1700000000123456789"#)
            .expect("a line");
        assert_eq!(s.skipped, 1);
        let got = named(&s);
        assert_eq!(
            got,
            vec![
                ("cpu_usage_idle".to_string(), 91.5, 1_700_000_000_123),
                ("cpu".to_string(), 3.0, 1_700_000_000_123),
                ("cpu_up".to_string(), 1.0, 1_700_000_000_123),
            ]
        );
        let e = &s.events[0];
        assert_eq!(e.get("host").to_text(), "web-1");
        assert_eq!(e.get("labels"), Value::Map(Arc::new(BTreeMap::from([("cpu".into(), "cpu0".into())]))));
    }

    #[test]
    fn time_follows_the_precision_and_defaults_to_now() {
        let mapping = Mapping { precision: Precision::Seconds, ..Mapping::default() };
        let s = samples("mem,host=h used=1 1700000000", &mapping, 0).expect("a line");
        assert_eq!(s.events[0].ts, 1_700_000_000_000);
        assert_eq!(one("mem,host=h used=1").expect("a line").events[0].ts, 42);
        assert_eq!(one("mem,host=h used=1 -1500000").expect("a line").events[0].ts, -2, "rounded down");
    }

    #[test]
    fn bad_lines_say_why() {
        let no_host = one("mem,dc=x used=1").expect("a line without a host is kept");
        assert_eq!(no_host.events[0].get("host").to_text(), FLEET_HOST);
        assert_eq!(no_host.events[0].get("labels").to_text(), "{dc=x}");
        let no_field = one("mem,host=h").expect_err("no field").reason;
        assert!(no_field.starts_with("not line protocol"), "{no_field}");
        assert!(one("mem,host=h used=abc").is_err());
        assert!(one("mem,host=h used=1 12x").is_err());
        let mapping = Mapping { precision: Precision::Hours, ..Mapping::default() };
        assert!(samples("m,host=h v=1 9223372036854775807", &mapping, 0)
            .expect_err("overflow")
            .reason
            .contains("range"));
    }

    #[test]
    fn lines_are_numbered_past_blanks_comments_and_quoted_newlines() {
        let body = "# a comment\ncpu,host=a v=1\n\n  \nlog,host=a msg=\"two\nlines\",v=2\ncpu,host=b v=3\n";
        let got: Vec<(u64, &str)> = lines(body).collect();
        assert_eq!(got.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![2, 5, 7]);
        assert!(got[1].1.ends_with("v=2"));
    }

    #[test]
    fn telegraf_json_maps_as_line_protocol_does_one_metric_or_a_batch() {
        let line = r#"{"fields":{"usage_idle":91.5,"value":3,"up":true,"note":"x"},"name":"cpu","tags":{"cpu":"cpu0","host":"web-1"},"timestamp":1700000000}"#;
        let one = telegraf_json(line, "host");
        let s = one[0].as_ref().expect("a metric");
        assert_eq!(s.skipped, 1);
        let got = named(s);
        // serde_json keeps the fields' order (`preserve_order`).
        assert_eq!(
            got,
            vec![
                ("cpu_usage_idle".to_string(), 91.5, 1_700_000_000_000),
                ("cpu".to_string(), 3.0, 1_700_000_000_000),
                ("cpu_up".to_string(), 1.0, 1_700_000_000_000),
            ]
        );
        assert_eq!(s.events[0].get("host").to_text(), "web-1");
        let batch = r#"{"metrics":[
            {"fields":{"used":1},"name":"mem","tags":{"host":"a"},"timestamp":1700000000123},
            {"fields":{"used":2},"name":"mem","tags":{"dc":"x"},"timestamp":1700000000123456},
            {"fields":{"used":3},"name":"mem","tags":{"host":"b"},"timestamp":"2023-11-14T22:13:20Z"},
            {"fields":{"used":4},"name":"mem","tags":{"host":"c"}}]}"#;
        let got = telegraf_json(batch, "host");
        assert_eq!(got.len(), 4);
        assert_eq!(got[0].as_ref().expect("ms").events[0].ts, 1_700_000_000_123);
        assert_eq!(got[1].as_ref().expect("no host: the fleet's").events[0].get("host").to_text(), FLEET_HOST);
        assert_eq!(got[2].as_ref().expect("RFC 3339").events[0].ts, 1_700_000_000_000);
        assert_eq!(got[3].as_ref().expect_err("no time").field.as_deref(), Some("timestamp"));
        let e = telegraf_json("{\"name\": ", "host").remove(0).expect_err("not JSON");
        assert!(e.reason.contains("line 1, column"), "{}", e.reason);
        assert_eq!(epoch_ms(1_700_000_000_123_456_789), Some(1_700_000_000_123));
    }
}
