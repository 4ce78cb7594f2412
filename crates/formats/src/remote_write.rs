//! Prometheus remote-write 1.0 (`prometheus.WriteRequest`, snappy-compressed protobuf) to
//! `metric` events.
//!
//! | remote-write | `metric` event |
//! |---|---|
//! | label `__name__` | `name` |
//! | the host label (`instance` by default), without its `:port` | `host` |
//! | without it, the fallback label (`job` by default) | `host` as `job=VALUE`, and that label stays a label |
//! | without either | `host` [`FLEET_HOST`] |
//! | every other label (`job` included) | `labels` |
//! | the family's metadata type, else the name's counting suffix | `kind` |
//! | the family's metadata unit, else the name's unit suffix (`_bytes`, `_ratio`...) | `unit` |
//! | each sample's value and timestamp (ms) | `value`, `ts` |
//! | a stale marker (the NaN Prometheus writes when a series ends) | no sample: counted as stale |
//! | any other NaN or infinity (a summary's quantile with no observations) | no sample: counted as not finite |
//!
//! A series without a name is refused with the reason; the request's other series are kept. A
//! series without a host is no mistake of its sender's: a recording rule's aggregate
//! (`job:node_cpu_seconds:rate1m`) has none, and Prometheus drops a whole batch, and pages its
//! team, on a refusal. So it is kept under the host its fallback label names, else under
//! the fleet's.

pub mod v2;

use crate::metric_kind::{self, Families};
use std::collections::BTreeMap;
use std::sync::Arc;
use vigil_engine::event::{DecodeError, Event, Value};
use vigil_lang::schema::Stream;

/// The host of a series that names neither its host nor its fallback label.
pub const FLEET_HOST: &str = "fleet";

/// Which labels of a series name its host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLabels {
    /// The label that names the host; its value's `:port` is dropped.
    pub label: String,
    /// For a series without `label`: the label whose value places it, as the host
    /// `LABEL=VALUE` (no host name has a `=`, so it cannot be taken for one). Empty for none.
    pub fallback: String,
}

impl Default for HostLabels {
    fn default() -> Self {
        HostLabels { label: "instance".into(), fallback: "job".into() }
    }
}

impl HostLabels {
    /// Labels named `label`, with `job` as the fallback.
    pub fn new(label: &str) -> Self {
        HostLabels { label: label.into(), ..HostLabels::default() }
    }
}

/// The bits of the NaN that Prometheus writes as a series' stale marker.
pub const STALE_NAN: u64 = 0x7ff0_0000_0000_0002;

#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteRequest {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
    /// The types of metric families; Prometheus sends them in requests of their own.
    #[prost(message, repeated, tag = "3")]
    pub metadata: Vec<MetricMetadata>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct MetricMetadata {
    /// `prometheus.MetricMetadata.MetricType`: 1 counter, 2 gauge, 3 histogram, 4 gauge
    /// histogram, 5 summary, others 0 or above 5.
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    #[prost(string, tag = "2")]
    pub metric_family_name: String,
    /// The family's unit, empty when the exposition gave none.
    #[prost(string, tag = "5")]
    pub unit: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TimeSeries {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(double, tag = "1")]
    pub value: f64,
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// Why a body is not a write request.
#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    /// Larger than `limit` once decompressed.
    TooLarge(usize),
    Bad(String),
}

/// Decompresses (snappy block format) and decodes a remote-write body (a 1.0 `WriteRequest`
/// or a 2.0 [`v2::Request`], named `what` in errors), refusing one that would decompress past
/// `limit` bytes before decompressing it.
pub fn decode_body<M: prost::Message + Default>(body: &[u8], limit: usize, what: &str) -> Result<M, BodyError> {
    let len = snap::raw::decompress_len(body).map_err(|e| BodyError::Bad(format!("not snappy: {e}")))?;
    if len > limit {
        return Err(BodyError::TooLarge(len));
    }
    let raw = snap::raw::Decoder::new().decompress_vec(body).map_err(|e| BodyError::Bad(format!("not snappy: {e}")))?;
    M::decode(raw.as_slice()).map_err(|e| BodyError::Bad(format!("not a {what}: {e}")))
}

/// The events of one series, and how many of its samples were stale markers or not finite.
#[derive(Debug, Default, PartialEq)]
pub struct SeriesSamples {
    pub events: Vec<Event>,
    pub stale: usize,
    pub not_finite: usize,
}

/// The samples of one series as events; `hosts` says which label names the host. Their `kind`
/// and `unit` are what `families` knows of the series' family, else what its name says.
pub fn series_samples(
    series: &TimeSeries,
    hosts: &HostLabels,
    families: Option<&Families>,
) -> Result<SeriesSamples, DecodeError> {
    let name = series.labels.iter().find(|l| l.name == "__name__").map_or("", |l| l.value.as_str());
    let about = match families {
        Some(f) => f.about(name),
        None => metric_kind::About { kind: metric_kind::by_name(name), unit: None },
    };
    series_samples_of_kind(series, hosts, about)
}

/// [`series_samples`] of a series whose `kind` and `unit` are known.
pub fn series_samples_of_kind(
    series: &TimeSeries,
    hosts: &HostLabels,
    about: metric_kind::About,
) -> Result<SeriesSamples, DecodeError> {
    let mut name = None;
    let mut host = None;
    let mut fallback = None;
    let mut labels = BTreeMap::new();
    for l in &series.labels {
        if l.name == "__name__" {
            name = Some(l.value.as_str());
        } else if l.name == hosts.label {
            host = Some(without_port(&l.value));
        } else {
            if l.name == hosts.fallback && !l.value.is_empty() {
                fallback = Some(l);
            }
            labels.insert(l.name.clone(), l.value.clone());
        }
    }
    let name = name.filter(|n| !n.is_empty()).ok_or_else(|| DecodeError {
        field: Some("__name__".into()),
        reason: "the series has no metric name".into(),
    })?;
    let host = match (host.filter(|h| !h.is_empty()), fallback) {
        (Some(host), _) => Value::str(host),
        (None, Some(l)) => Value::str(&format!("{}={}", l.name, l.value)),
        (None, None) => Value::str(FLEET_HOST),
    };
    let labels = (!labels.is_empty()).then(|| Value::Map(Arc::new(labels)));
    let kind = about.kind.map(Value::str);
    // Prometheus' conventions put the unit last in the name: what the name says stands when
    // the metadata does not (node_exporter's text format gives no units).
    let unit = about.unit.as_deref().or_else(|| metric_kind::unit_by_name(name)).map(Value::str);
    let mut out = SeriesSamples::default();
    for s in &series.samples {
        if s.value.to_bits() == STALE_NAN {
            out.stale += 1;
            continue;
        }
        if !s.value.is_finite() {
            out.not_finite += 1;
            continue;
        }
        let mut event = Event::new(Stream::Metric, s.timestamp);
        event.set("host", host.clone()).set("name", Value::str(name)).set("value", Value::Num(s.value));
        if let Some(labels) = &labels {
            event.set("labels", labels.clone());
        }
        if let Some(kind) = &kind {
            event.set("kind", kind.clone());
        }
        if let Some(unit) = &unit {
            event.set("unit", unit.clone());
        }
        out.events.push(event);
    }
    Ok(out)
}

/// One message of prometheus-kafka-adapter's JSON serialisation (what it writes to Kafka for
/// each sample Prometheus remote-writes to it): `{"timestamp": RFC 3339, "value": "1.5",
/// "name": "up", "labels": {"__name__": "up", "instance": ..., ...}}`, mapped as a
/// remote-write series of one sample.
pub fn adapter_sample(text: &str, hosts: &HostLabels) -> Result<SeriesSamples, DecodeError> {
    let bad = |field: Option<&str>, reason: String| DecodeError { field: field.map(str::to_string), reason };
    let m: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| bad(None, format!("not JSON (line {}, column {}): {e}", e.line(), e.column())))?;
    let value = match m.get("value") {
        Some(serde_json::Value::String(v)) => match v.as_str() {
            "NaN" => Some(f64::NAN),
            "+Inf" | "Inf" => Some(f64::INFINITY),
            "-Inf" => Some(f64::NEG_INFINITY),
            v => v.parse().ok(),
        },
        Some(serde_json::Value::Number(n)) => n.as_f64(),
        _ => None,
    }
    .ok_or_else(|| bad(Some("value"), "a sample needs a `value`, a number as text".into()))?;
    let timestamp = m
        .get("timestamp")
        .and_then(|t| t.as_str())
        .and_then(vigil_engine::event::parse_time)
        .ok_or_else(|| bad(Some("timestamp"), "a sample needs an RFC 3339 `timestamp`".into()))?;
    let mut labels: Vec<Label> = match m.get("labels") {
        Some(serde_json::Value::Object(l)) => {
            l.iter().filter_map(|(k, v)| Some(Label { name: k.clone(), value: v.as_str()?.to_string() })).collect()
        }
        _ => Vec::new(),
    };
    if !labels.iter().any(|l| l.name == "__name__") {
        if let Some(name) = m.get("name").and_then(|n| n.as_str()) {
            labels.push(Label { name: "__name__".into(), value: name.into() });
        }
    }
    series_samples(&TimeSeries { labels, samples: vec![Sample { value, timestamp }] }, hosts, None)
}

/// `host:port` without the port; an IPv6 address in brackets without them.
fn without_port(instance: &str) -> &str {
    if let Some(rest) = instance.strip_prefix('[') {
        return rest.split_once(']').map_or(instance, |(address, _)| address);
    }
    match instance.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => instance,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(labels: &[(&str, &str)], samples: &[(f64, i64)]) -> TimeSeries {
        TimeSeries {
            labels: labels.iter().map(|(n, v)| Label { name: n.to_string(), value: v.to_string() }).collect(),
            samples: samples.iter().map(|(value, timestamp)| Sample { value: *value, timestamp: *timestamp }).collect(),
        }
    }

    #[test]
    fn a_series_is_its_name_its_host_without_the_port_and_its_labels() {
        let s = series(
            &[("__name__", "node_load1"), ("instance", "web-1:9100"), ("job", "node")],
            &[(0.5, 1000), (f64::from_bits(STALE_NAN), 2000)],
        );
        let got = series_samples(&s, &HostLabels::default(), None).expect("a series");
        assert_eq!(got.stale, 1, "the stale marker ends the series: no sample");
        assert_eq!(got.events.len(), 1);
        let e = &got.events[0];
        assert_eq!(
            (e.ts, e.get("host").to_text(), e.get("name").to_text()),
            (1000, "web-1".into(), "node_load1".into())
        );
        assert_eq!(e.get("labels"), Value::Map(Arc::new(BTreeMap::from([("job".into(), "node".into())]))));
        assert_eq!(without_port("[::1]:9100"), "::1");
        assert_eq!(without_port("::1"), "::1");
        assert_eq!(without_port("db"), "db");
    }

    #[test]
    fn a_series_without_a_name_is_refused_and_one_without_a_host_falls_back() {
        let hosts = HostLabels::default();
        let host_of = |labels: &[(&str, &str)]| {
            let got = series_samples(&series(labels, &[(1.0, 1)]), &hosts, None).expect("taken");
            got.events[0].get("host").to_text()
        };
        assert_eq!(host_of(&[("__name__", "job:node_cpu_seconds:rate1m"), ("job", "node")]), "job=node");
        assert_eq!(host_of(&[("__name__", "cluster:cpu:sum")]), FLEET_HOST);
        assert_eq!(host_of(&[("__name__", "up"), ("instance", "db-1:9100"), ("job", "node")]), "db-1");
        let kept = series_samples(&series(&[("__name__", "x"), ("job", "node")], &[(1.0, 1)]), &hosts, None);
        assert_eq!(kept.expect("taken").events[0].get("labels").to_text(), "{job=node}", "the fallback stays a label");
        let no_fallback = HostLabels { fallback: String::new(), ..HostLabels::default() };
        let fleet = series_samples(&series(&[("__name__", "x"), ("job", "n")], &[(1.0, 1)]), &no_fallback, None);
        assert_eq!(fleet.expect("taken").events[0].get("host").to_text(), FLEET_HOST);
        assert!(series_samples(&series(&[("instance", "a:1")], &[(1.0, 1)]), &hosts, None).is_err());
        let nan = series(&[("__name__", "up"), ("instance", "a:1")], &[(f64::NAN, 1), (2.0, 2)]);
        let got = series_samples(&nan, &hosts, None).expect("a series");
        assert_eq!((got.not_finite, got.events.len()), (1, 1), "a NaN is no sample; the others are");
    }

    #[test]
    fn a_body_is_snappy_protobuf_checked_for_size_before_it_is_decompressed() {
        let request = WriteRequest {
            timeseries: vec![series(&[("__name__", "up"), ("instance", "a:1")], &[(1.0, 5)])],
            metadata: Vec::new(),
        };
        let raw = prost::Message::encode_to_vec(&request);
        let body = snap::raw::Encoder::new().compress_vec(&raw).expect("snappy");
        assert_eq!(decode_body::<WriteRequest>(&body, 1 << 20, "WriteRequest"), Ok(request));
        assert_eq!(decode_body::<WriteRequest>(&body, 4, "WriteRequest"), Err(BodyError::TooLarge(raw.len())));
        assert!(matches!(
            decode_body::<WriteRequest>(b"not snappy at all", 1 << 20, "WriteRequest"),
            Err(BodyError::Bad(_))
        ));
        let not_proto = snap::raw::Encoder::new().compress_vec(&[0xff, 0xff, 0xff]).expect("snappy");
        assert!(
            matches!(decode_body::<WriteRequest>(&not_proto, 1 << 20, "WriteRequest"), Err(BodyError::Bad(r)) if r.contains("WriteRequest"))
        );
    }

    #[test]
    fn a_message_of_prometheus_kafka_adapter_is_a_series_of_one_sample() {
        let text = r#"{"timestamp":"2023-11-14T22:13:20Z","value":"0.75","name":"node_load1","labels":{"__name__":"node_load1","instance":"web-1:9100","job":"node"}}"#;
        let hosts = HostLabels::default();
        let s = adapter_sample(text, &hosts).expect("a sample");
        let e = &s.events[0];
        assert_eq!(
            (e.get("host").to_text(), e.get("name").to_text(), e.ts),
            ("web-1".into(), "node_load1".into(), 1_700_000_000_000)
        );
        assert_eq!(e.get("value").as_f64(), Some(0.75));
        assert_eq!(e.get("labels").to_text(), "{job=node}");
        let stale = r#"{"timestamp":"2023-11-14T22:13:20Z","value":"NaN","name":"up","labels":{"instance":"h"}}"#;
        assert_eq!(adapter_sample(stale, &hosts).expect("taken").not_finite, 1);
        let no_host = r#"{"timestamp":"2023-11-14T22:13:20Z","value":"1","name":"up","labels":{}}"#;
        assert_eq!(adapter_sample(no_host, &hosts).expect("taken").events[0].get("host").to_text(), FLEET_HOST);
        let no_time = r#"{"value":"1","name":"up","labels":{"instance":"h"}}"#;
        assert_eq!(adapter_sample(no_time, &hosts).expect_err("no time").field.as_deref(), Some("timestamp"));
    }
}
