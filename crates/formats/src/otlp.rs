//! OTLP metrics (`ExportMetricsServiceRequest`, as OpenTelemetry SDKs and the Collector send
//! it over OTLP/HTTP, in protobuf or in OTLP's JSON) to `metric` events.
//!
//! | OTLP | `metric` event |
//! |---|---|
//! | the host attribute (`host.name` by default) of the resource, else of the data point | `host` |
//! | neither | `host` = [`FLEET_HOST`], as remote-write does |
//! | the data point's other attributes | `labels` (values as text) |
//! | a gauge's point, a non-monotonic sum's point | `name` = the metric's name, `value` |
//! | a cumulative monotonic sum's point (a counter) | `name`, `value` = the running total |
//! | a histogram's point | `NAME_count`, `NAME_sum`, and `NAME_bucket` with label `le` per bound and `+Inf` (counts cumulative, as Prometheus keeps them) |
//! | an exponential histogram's point | `NAME_count`, `NAME_sum` |
//! | a summary's point | `NAME_count`, `NAME_sum`, and `NAME` with label `quantile` per quantile |
//! | `time_unix_nano` | `ts`, in milliseconds (when it is 0: when the request was received) |
//!
//! Refused with the reason, the request's other points kept: delta sums and delta histograms
//! (their running total is the sender's to keep: configure the SDK or the Collector's
//! `deltatocumulative` processor for cumulative temporality) and metrics without a name. Points
//! flagged "no recorded value" and points that are not finite are skipped and counted, as
//! remote-write's stale markers are.

use crate::metric_kind::{COUNTER, GAUGE};
use crate::remote_write::FLEET_HOST;
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;
use std::sync::Arc;
use vigil_engine::event::{DecodeError, Event, Millis, Value};
use vigil_lang::schema::Stream;

// The messages below are those of opentelemetry-proto (collector/metrics/v1, metrics/v1,
// common/v1, resource/v1) that Vigil reads, with their protobuf tags; the fields it does not
// read (exemplars, scopes' names, schema URLs) are left out, so the decoder skips them. Each
// also reads from OTLP's JSON encoding: lowerCamelCase names, 64-bit integers as strings or
// numbers, enums as numbers, unknown fields ignored.

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ExportMetricsServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub resource_metrics: Vec<ResourceMetrics>,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ResourceMetrics {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub scope_metrics: Vec<ScopeMetrics>,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ScopeMetrics {
    #[prost(message, repeated, tag = "2")]
    pub metrics: Vec<Metric>,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Metric {
    #[prost(string, tag = "1")]
    pub name: String,
    /// UCUM: `1` a ratio, `%` a percentage, `By` bytes, `s` seconds.
    #[prost(string, tag = "3")]
    #[serde(default)]
    pub unit: String,
    #[prost(oneof = "Data", tags = "5, 7, 9, 10, 11")]
    #[serde(flatten)]
    pub data: Option<Data>,
}

#[derive(Clone, PartialEq, prost::Oneof, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Data {
    #[prost(message, tag = "5")]
    Gauge(Gauge),
    #[prost(message, tag = "7")]
    Sum(Sum),
    #[prost(message, tag = "9")]
    Histogram(Histogram),
    #[prost(message, tag = "10")]
    ExponentialHistogram(ExponentialHistogram),
    #[prost(message, tag = "11")]
    Summary(Summary),
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Gauge {
    #[prost(message, repeated, tag = "1")]
    pub data_points: Vec<NumberDataPoint>,
}

/// `AggregationTemporality`'s values.
pub const DELTA: i32 = 1;
pub const CUMULATIVE: i32 = 2;

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Sum {
    #[prost(message, repeated, tag = "1")]
    pub data_points: Vec<NumberDataPoint>,
    #[prost(int32, tag = "2")]
    pub aggregation_temporality: i32,
    #[prost(bool, tag = "3")]
    pub is_monotonic: bool,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Histogram {
    #[prost(message, repeated, tag = "1")]
    pub data_points: Vec<HistogramDataPoint>,
    #[prost(int32, tag = "2")]
    pub aggregation_temporality: i32,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ExponentialHistogram {
    #[prost(message, repeated, tag = "1")]
    pub data_points: Vec<ExponentialHistogramDataPoint>,
    #[prost(int32, tag = "2")]
    pub aggregation_temporality: i32,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub data_points: Vec<SummaryDataPoint>,
}

/// `DataPointFlags`: the point stands for a gap in the series, not a value.
pub const NO_RECORDED_VALUE: u32 = 1;

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct NumberDataPoint {
    #[prost(message, repeated, tag = "7")]
    pub attributes: Vec<KeyValue>,
    #[prost(fixed64, tag = "3")]
    #[serde(deserialize_with = "int64_text")]
    pub time_unix_nano: u64,
    #[prost(oneof = "NumberValue", tags = "4, 6")]
    #[serde(flatten)]
    pub value: Option<NumberValue>,
    #[prost(uint32, tag = "8")]
    pub flags: u32,
}

#[derive(Clone, PartialEq, prost::Oneof, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NumberValue {
    #[prost(double, tag = "4")]
    AsDouble(#[serde(deserialize_with = "double_text")] f64),
    #[prost(sfixed64, tag = "6")]
    AsInt(#[serde(deserialize_with = "int64_text")] i64),
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HistogramDataPoint {
    #[prost(message, repeated, tag = "9")]
    pub attributes: Vec<KeyValue>,
    #[prost(fixed64, tag = "3")]
    #[serde(deserialize_with = "int64_text")]
    pub time_unix_nano: u64,
    #[prost(fixed64, tag = "4")]
    #[serde(deserialize_with = "int64_text")]
    pub count: u64,
    #[prost(double, optional, tag = "5")]
    #[serde(deserialize_with = "optional_double_text")]
    pub sum: Option<f64>,
    #[prost(fixed64, repeated, tag = "6")]
    #[serde(deserialize_with = "int64_texts")]
    pub bucket_counts: Vec<u64>,
    #[prost(double, repeated, tag = "7")]
    pub explicit_bounds: Vec<f64>,
    #[prost(uint32, tag = "10")]
    pub flags: u32,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ExponentialHistogramDataPoint {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
    #[prost(fixed64, tag = "3")]
    #[serde(deserialize_with = "int64_text")]
    pub time_unix_nano: u64,
    #[prost(fixed64, tag = "4")]
    #[serde(deserialize_with = "int64_text")]
    pub count: u64,
    #[prost(double, optional, tag = "5")]
    #[serde(deserialize_with = "optional_double_text")]
    pub sum: Option<f64>,
    #[prost(uint32, tag = "10")]
    pub flags: u32,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SummaryDataPoint {
    #[prost(message, repeated, tag = "7")]
    pub attributes: Vec<KeyValue>,
    #[prost(fixed64, tag = "3")]
    #[serde(deserialize_with = "int64_text")]
    pub time_unix_nano: u64,
    #[prost(fixed64, tag = "4")]
    #[serde(deserialize_with = "int64_text")]
    pub count: u64,
    #[prost(double, tag = "5")]
    #[serde(deserialize_with = "double_text")]
    pub sum: f64,
    #[prost(message, repeated, tag = "6")]
    pub quantile_values: Vec<ValueAtQuantile>,
    #[prost(uint32, tag = "8")]
    pub flags: u32,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ValueAtQuantile {
    #[prost(double, tag = "1")]
    #[serde(deserialize_with = "double_text")]
    pub quantile: f64,
    #[prost(double, tag = "2")]
    #[serde(deserialize_with = "double_text")]
    pub value: f64,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AnyValue {
    #[prost(oneof = "Any", tags = "1, 2, 3, 4, 5, 6")]
    #[serde(flatten)]
    pub value: Option<Any>,
}

#[derive(Clone, PartialEq, prost::Oneof, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Any {
    #[prost(string, tag = "1")]
    StringValue(String),
    #[prost(bool, tag = "2")]
    BoolValue(bool),
    #[prost(int64, tag = "3")]
    IntValue(#[serde(deserialize_with = "int64_text")] i64),
    #[prost(double, tag = "4")]
    DoubleValue(#[serde(deserialize_with = "double_text")] f64),
    #[prost(message, tag = "5")]
    ArrayValue(ArrayValue),
    #[prost(message, tag = "6")]
    KvlistValue(KeyValueList),
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ArrayValue {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<AnyValue>,
}

#[derive(Clone, PartialEq, prost::Message, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct KeyValueList {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<KeyValue>,
}

/// What OTLP/HTTP answers: the count and reason of the points refused.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportMetricsServiceResponse {
    #[prost(message, optional, tag = "1")]
    pub partial_success: Option<ExportMetricsPartialSuccess>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ExportMetricsPartialSuccess {
    #[prost(int64, tag = "1")]
    pub rejected_data_points: i64,
    #[prost(string, tag = "2")]
    pub error_message: String,
}

/// `google.rpc.Status`, the body of an OTLP/HTTP error.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

/// A 64-bit integer of OTLP's JSON: a string of digits or a number.
fn int64_text<'de, D: Deserializer<'de>, T: std::str::FromStr + TryFrom<i64> + TryFrom<u64>>(
    d: D,
) -> Result<T, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int {
        Signed(i64),
        Unsigned(u64),
        Digits(String),
    }
    let bad = || serde::de::Error::custom("not a 64-bit integer");
    match Int::deserialize(d)? {
        Int::Signed(n) => T::try_from(n).map_err(|_| bad()),
        Int::Unsigned(n) => T::try_from(n).map_err(|_| bad()),
        Int::Digits(s) => s.parse().map_err(|_| bad()),
    }
}

fn int64_texts<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
    #[derive(Deserialize)]
    struct One(#[serde(deserialize_with = "int64_text")] u64);
    Ok(Vec::<One>::deserialize(d)?.into_iter().map(|o| o.0).collect())
}

/// A double of protobuf's JSON: a number, or `"NaN"`, `"Infinity"`, `"-Infinity"`.
fn double_text<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Double {
        Number(f64),
        Named(String),
    }
    match Double::deserialize(d)? {
        Double::Number(n) => Ok(n),
        Double::Named(s) => match s.as_str() {
            "NaN" => Ok(f64::NAN),
            "Infinity" => Ok(f64::INFINITY),
            "-Infinity" => Ok(f64::NEG_INFINITY),
            other => other.parse().map_err(|_| serde::de::Error::custom("not a double")),
        },
    }
}

fn optional_double_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    double_text(d).map(Some)
}

/// How a request's body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Protobuf,
    Json,
}

/// Why a request's body is not an OTLP metrics export.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    #[error("not an ExportMetricsServiceRequest: {0}")]
    Protobuf(prost::DecodeError),
    #[error("not an ExportMetricsServiceRequest in OTLP's JSON (line {line}, column {column}): {error}", line = .0.line(), column = .0.column(), error = .0)]
    Json(serde_json::Error),
}

/// Decodes a request's (decompressed) body.
pub fn decode(body: &[u8], encoding: Encoding) -> Result<ExportMetricsServiceRequest, OtlpError> {
    match encoding {
        Encoding::Protobuf => prost::Message::decode(body).map_err(OtlpError::Protobuf),
        Encoding::Json => serde_json::from_slice(body).map_err(OtlpError::Json),
    }
}

/// The samples of a request, and the points refused with their reasons.
#[derive(Debug, Default)]
pub struct Samples {
    pub events: Vec<Event>,
    /// Points flagged "no recorded value", or not finite.
    pub skipped: usize,
    /// Data points refused, with where they were (`metric NAME`) and why.
    pub refused: Vec<(usize, String, DecodeError)>,
}

/// The samples of every point of `request`; `host_attribute` names the host, `now` stands for
/// a point without a time.
pub fn samples(request: &ExportMetricsServiceRequest, host_attribute: &str, now: Millis) -> Samples {
    let mut out = Samples::default();
    for rm in &request.resource_metrics {
        let resource: &[KeyValue] = rm.resource.as_ref().map_or(&[], |r| &r.attributes);
        let resource_host = attribute(resource, host_attribute).map(|h| Value::str(&h));
        for metric in rm.scope_metrics.iter().flat_map(|s| &s.metrics) {
            let name = Value::str(&metric.name);
            let unit = crate::metric_kind::unit(&metric.unit).map(|u| Value::str(&u));
            let mut sink =
                Sink { metric, name, host_attribute, resource_host: resource_host.as_ref(), now, out: &mut out, unit };
            sink.metric();
        }
    }
    out
}

/// The points of one metric, written into `out`.
struct Sink<'a> {
    metric: &'a Metric,
    host_attribute: &'a str,
    resource_host: Option<&'a Value>,
    /// The metric's name, as its gauges' and sums' samples carry it.
    name: Value,
    /// The metric's unit, which the samples named as it carry (a histogram's count has none).
    unit: Option<Value>,
    now: Millis,
    out: &'a mut Samples,
}

impl Sink<'_> {
    fn refuse(&mut self, points: usize, field: &str, reason: String) {
        let at = format!("metric {:?}", self.metric.name);
        self.out.refused.push((points, at, DecodeError { field: Some(field.into()), reason }));
    }

    fn metric(&mut self) {
        let name = self.metric.name.as_str();
        let Some(data) = &self.metric.data else { return };
        let points = match data {
            Data::Gauge(g) => g.data_points.len(),
            Data::Sum(s) => s.data_points.len(),
            Data::Histogram(h) => h.data_points.len(),
            Data::ExponentialHistogram(h) => h.data_points.len(),
            Data::Summary(s) => s.data_points.len(),
        };
        if name.is_empty() {
            return self.refuse(points, "name", "the metric has no name".into());
        }
        let delta = |temporality: i32| temporality == DELTA;
        let refuse_delta = |what: &str| {
            format!("{what} {name} has delta temporality: Vigil reads running totals; have the sender export cumulative temporality")
        };
        match data {
            Data::Gauge(g) => g.data_points.iter().for_each(|p| self.number(p, GAUGE)),
            Data::Sum(s) if delta(s.aggregation_temporality) => {
                self.refuse(points, "aggregationTemporality", refuse_delta("sum"))
            }
            Data::Sum(s) => {
                // A sum that may fall is a level (a queue's length), not a running total.
                let kind = if s.is_monotonic { COUNTER } else { GAUGE };
                s.data_points.iter().for_each(|p| self.number(p, kind))
            }
            Data::Histogram(h) if delta(h.aggregation_temporality) => {
                self.refuse(points, "aggregationTemporality", refuse_delta("histogram"))
            }
            Data::Histogram(h) => h.data_points.iter().for_each(|p| self.histogram(name, p)),
            Data::ExponentialHistogram(h) if delta(h.aggregation_temporality) => {
                self.refuse(points, "aggregationTemporality", refuse_delta("histogram"))
            }
            Data::ExponentialHistogram(h) => h.data_points.iter().for_each(|p| {
                let at = self.point(&p.attributes, p.time_unix_nano, p.flags);
                self.count_and_sum(name, at, p.count, p.sum);
            }),
            Data::Summary(s) => s.data_points.iter().for_each(|p| {
                let at = self.point(&p.attributes, p.time_unix_nano, p.flags);
                self.count_and_sum(name, at.clone(), p.count, Some(p.sum));
                for q in &p.quantile_values {
                    let quantile = Some(("quantile", number_label(q.quantile)));
                    self.sample(self.name.clone(), GAUGE, at.clone(), quantile, q.value);
                }
            }),
        }
    }

    /// Where a point's samples go: its host, labels and time; none when it has no value.
    fn point(&mut self, attributes: &[KeyValue], time_unix_nano: u64, flags: u32) -> Option<Point> {
        if flags & NO_RECORDED_VALUE != 0 {
            self.out.skipped += 1;
            return None;
        }
        let host = match self.resource_host {
            Some(h) => h.clone(),
            None => Value::str(&attribute(attributes, self.host_attribute).unwrap_or_else(|| FLEET_HOST.into())),
        };
        let labels: BTreeMap<String, String> = attributes
            .iter()
            .filter(|kv| kv.key != self.host_attribute)
            .map(|kv| (kv.key.clone(), any_text(kv.value.as_ref())))
            .collect();
        let ts = if time_unix_nano == 0 { self.now } else { (time_unix_nano / 1_000_000) as Millis };
        Some(Point { host, labels, ts })
    }

    fn number(&mut self, p: &NumberDataPoint, kind: &str) {
        let at = self.point(&p.attributes, p.time_unix_nano, p.flags);
        let value = match p.value {
            Some(NumberValue::AsDouble(v)) => v,
            Some(NumberValue::AsInt(v)) => v as f64,
            None => f64::NAN,
        };
        self.sample(self.name.clone(), kind, at, None, value);
    }

    fn histogram(&mut self, name: &str, p: &HistogramDataPoint) {
        let at = self.point(&p.attributes, p.time_unix_nano, p.flags);
        self.count_and_sum(name, at.clone(), p.count, p.sum);
        let bucket = Value::str(&format!("{name}_bucket"));
        let mut below = 0u64;
        for (i, count) in p.bucket_counts.iter().enumerate() {
            below += count;
            let le = p.explicit_bounds.get(i).map_or_else(|| "+Inf".to_string(), |b| number_label(*b));
            self.sample(bucket.clone(), COUNTER, at.clone(), Some(("le", le)), below as f64);
        }
    }

    fn count_and_sum(&mut self, name: &str, at: Option<Point>, count: u64, sum: Option<f64>) {
        self.sample(Value::str(&format!("{name}_count")), COUNTER, at.clone(), None, count as f64);
        if let Some(sum) = sum {
            self.sample(Value::str(&format!("{name}_sum")), COUNTER, at, None, sum);
        }
    }

    fn sample(&mut self, name: Value, kind: &str, at: Option<Point>, label: Option<(&str, String)>, value: f64) {
        let Some(mut at) = at else { return };
        if !value.is_finite() {
            self.out.skipped += 1;
            return;
        }
        if let Some((k, v)) = label {
            at.labels.insert(k.to_string(), v);
        }
        let mut event = Event::new(Stream::Metric, at.ts);
        let unit = self.unit.as_ref().filter(|_| name == self.name).cloned();
        event.set("host", at.host).set("name", name).set("value", Value::Num(value));
        if !at.labels.is_empty() {
            event.set("labels", Value::Map(Arc::new(at.labels)));
        }
        event.set("kind", Value::str(kind));
        if let Some(unit) = unit {
            event.set("unit", unit);
        }
        self.out.events.push(event);
    }
}

#[derive(Clone)]
struct Point {
    host: Value,
    labels: BTreeMap<String, String>,
    ts: Millis,
}

fn attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes.iter().find(|kv| kv.key == key).map(|kv| any_text(kv.value.as_ref())).filter(|v| !v.is_empty())
}

/// An attribute's value as a label's text.
fn any_text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        None => String::new(),
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(Any::IntValue(i)) => i.to_string(),
        Some(Any::DoubleValue(d)) => d.to_string(),
        Some(Any::ArrayValue(a)) => {
            let items: Vec<String> = a.values.iter().map(|v| any_text(Some(v))).collect();
            format!("[{}]", items.join(","))
        }
        Some(Any::KvlistValue(l)) => {
            let items: Vec<String> =
                l.values.iter().map(|kv| format!("{}={}", kv.key, any_text(kv.value.as_ref()))).collect();
            format!("{{{}}}", items.join(","))
        }
    }
}

/// A bound or quantile as Prometheus writes it in `le` and `quantile`.
fn number_label(x: f64) -> String {
    if x == f64::INFINITY {
        "+Inf".into()
    } else {
        format!("{x:?}").trim_end_matches(".0").to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &str) -> KeyValue {
        KeyValue { key: key.into(), value: Some(AnyValue { value: Some(Any::StringValue(value.into())) }) }
    }

    fn request(resource: Vec<KeyValue>, metrics: Vec<Metric>) -> ExportMetricsServiceRequest {
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                resource: Some(Resource { attributes: resource }),
                scope_metrics: vec![ScopeMetrics { metrics }],
            }],
        }
    }

    fn point(attributes: Vec<KeyValue>, ms: u64, value: NumberValue) -> NumberDataPoint {
        NumberDataPoint { attributes, time_unix_nano: ms * 1_000_000, value: Some(value), flags: 0 }
    }

    fn shown(samples: &Samples) -> Vec<String> {
        samples
            .events
            .iter()
            .map(|e| serde_json::to_string(&vigil_engine::event::EventJson(e)).unwrap_or_default())
            .collect()
    }

    #[test]
    fn gauges_and_cumulative_sums_are_samples_of_their_host_with_their_attributes_as_labels() {
        let gauge = Metric {
            name: "system.cpu.utilization".into(),
            unit: String::new(),
            data: Some(Data::Gauge(Gauge {
                data_points: vec![point(vec![kv("cpu", "0")], 1_000, NumberValue::AsDouble(0.25))],
            })),
        };
        let counter = Metric {
            name: "requests".into(),
            unit: String::new(),
            data: Some(Data::Sum(Sum {
                data_points: vec![point(vec![], 2_000, NumberValue::AsInt(7))],
                aggregation_temporality: CUMULATIVE,
                is_monotonic: true,
            })),
        };
        let s = samples(
            &request(vec![kv("host.name", "web-1"), kv("service.name", "api")], vec![gauge, counter]),
            "host.name",
            0,
        );
        assert!(s.refused.is_empty(), "{:?}", s.refused);
        assert_eq!(
            shown(&s),
            [
                r#"{"stream":"metric","ts":"1970-01-01T00:00:01.000Z","host":"web-1","name":"system.cpu.utilization","value":0.25,"labels":{"cpu":"0"},"kind":"gauge"}"#,
                r#"{"stream":"metric","ts":"1970-01-01T00:00:02.000Z","host":"web-1","name":"requests","value":7,"kind":"counter"}"#,
            ]
        );
    }

    #[test]
    fn a_histogram_is_its_count_sum_and_cumulative_buckets() {
        let histogram = Metric {
            name: "latency".into(),
            unit: String::new(),
            data: Some(Data::Histogram(Histogram {
                data_points: vec![HistogramDataPoint {
                    attributes: vec![kv("host.name", "db-2")],
                    time_unix_nano: 5_000_000_000,
                    count: 6,
                    sum: Some(2.5),
                    bucket_counts: vec![1, 2, 3],
                    explicit_bounds: vec![0.1, 1.0],
                    flags: 0,
                }],
                aggregation_temporality: CUMULATIVE,
            })),
        };
        let s = samples(&request(vec![], vec![histogram]), "host.name", 0);
        let named: Vec<(String, String, f64)> = s
            .events
            .iter()
            .map(|e| {
                (e.get("name").to_string(), e.get("labels").to_string(), e.get("value").as_f64().unwrap_or(f64::NAN))
            })
            .collect();
        let labels = |le: &str| if le.is_empty() { "null".to_string() } else { format!("{{le={le}}}") };
        let want = [
            ("latency_count", labels(""), 6.0),
            ("latency_sum", labels(""), 2.5),
            ("latency_bucket", labels("0.1"), 1.0),
            ("latency_bucket", labels("1"), 3.0),
            ("latency_bucket", labels("+Inf"), 6.0),
        ];
        let want: Vec<(String, String, f64)> = want.into_iter().map(|(n, l, v)| (n.to_string(), l, v)).collect();
        assert_eq!(named, want);
        assert!(s.events.iter().all(|e| e.get("host").to_string() == "db-2" && e.ts == 5_000));
    }

    #[test]
    fn delta_sums_are_refused_gaps_skipped_and_points_without_a_host_kept_as_the_fleet_s() {
        let delta = Metric {
            name: "bytes".into(),
            unit: String::new(),
            data: Some(Data::Sum(Sum {
                data_points: vec![point(vec![], 1, NumberValue::AsInt(1)), point(vec![], 2, NumberValue::AsInt(2))],
                aggregation_temporality: DELTA,
                is_monotonic: true,
            })),
        };
        let mut gap = point(vec![kv("host.name", "h")], 3, NumberValue::AsDouble(1.0));
        gap.flags = NO_RECORDED_VALUE;
        let gauge = Metric {
            name: "temp".into(),
            unit: String::new(),
            data: Some(Data::Gauge(Gauge { data_points: vec![point(vec![], 4, NumberValue::AsDouble(1.0)), gap] })),
        };
        let s = samples(&request(vec![], vec![delta, gauge]), "host.name", 0);
        assert_eq!(s.events.len(), 1, "the gauge's point without a host");
        assert_eq!(s.events[0].get("host").to_text(), FLEET_HOST);
        assert_eq!(s.skipped, 1);
        let refused: Vec<(usize, String)> =
            s.refused.iter().map(|(n, _, e)| (*n, e.field.clone().unwrap_or_default())).collect();
        assert_eq!(refused, [(2, "aggregationTemporality".to_string())]);
        assert!(s.refused[0].2.reason.contains("delta temporality"), "{}", s.refused[0].2.reason);
    }

    #[test]
    fn otlp_json_reads_as_the_protobuf_does() {
        let json = r#"{"resourceMetrics":[{"resource":{"attributes":[
            {"key":"host.name","value":{"stringValue":"web-1"}},
            {"key":"pid","value":{"intValue":"42"}}]},
          "scopeMetrics":[{"scope":{"name":"x"},"metrics":[
            {"name":"load","unit":"1","gauge":{"dataPoints":[
              {"timeUnixNano":"1000000000","asDouble":1.5,"attributes":[{"key":"core","value":{"intValue":3}}]}]}},
            {"name":"hits","sum":{"aggregationTemporality":2,"isMonotonic":true,"dataPoints":[
              {"timeUnixNano":2000000000,"asInt":"9"}]}},
            {"name":"rtt","summary":{"dataPoints":[{"timeUnixNano":"3000000000","count":"4","sum":8,
              "quantileValues":[{"quantile":0.5,"value":"NaN"},{"quantile":0.99,"value":3}]}]}}]}]}]}"#;
        let request = decode(json.as_bytes(), Encoding::Json).expect("OTLP JSON");
        let bytes = prost::Message::encode_to_vec(&request);
        // Debug text, as NaN is not equal to itself.
        let again = decode(&bytes, Encoding::Protobuf).expect("protobuf");
        assert_eq!(format!("{again:?}"), format!("{request:?}"));
        let s = samples(&request, "host.name", 0);
        assert_eq!(
            shown(&s),
            [
                r#"{"stream":"metric","ts":"1970-01-01T00:00:01.000Z","host":"web-1","name":"load","value":1.5,"labels":{"core":"3"},"kind":"gauge","unit":"ratio"}"#,
                r#"{"stream":"metric","ts":"1970-01-01T00:00:02.000Z","host":"web-1","name":"hits","value":9,"kind":"counter"}"#,
                r#"{"stream":"metric","ts":"1970-01-01T00:00:03.000Z","host":"web-1","name":"rtt_count","value":4,"kind":"counter"}"#,
                r#"{"stream":"metric","ts":"1970-01-01T00:00:03.000Z","host":"web-1","name":"rtt_sum","value":8,"kind":"counter"}"#,
                r#"{"stream":"metric","ts":"1970-01-01T00:00:03.000Z","host":"web-1","name":"rtt","value":3,"labels":{"quantile":"0.99"},"kind":"gauge"}"#,
            ]
        );
        assert_eq!(s.skipped, 1, "the NaN quantile");
    }

    #[test]
    fn bodies_that_are_not_requests_say_where_and_why() {
        let e = decode(b"{\"resourceMetrics\": [{\"scopeMetrics\": 5}]}", Encoding::Json).expect_err("bad JSON");
        assert!(e.to_string().contains("line 1, column"), "{e}");
        let e = decode(&[0x0a, 0xff, 0xff], Encoding::Protobuf).expect_err("bad protobuf");
        assert!(e.to_string().contains("not an ExportMetricsServiceRequest"), "{e}");
    }
}
