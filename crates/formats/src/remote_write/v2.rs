//! Prometheus remote-write 2.0 (`io.prometheus.write.v2.Request`): each series' labels are
//! references into the request's symbol table, and a series carries its own metadata. A series
//! maps to `metric` events as a 1.0 series does ([`super::series_samples`]); beyond 1.0:
//!
//! | remote-write 2.0 | `metric` events |
//! |---|---|
//! | `labels_refs`, pairs of indexes into `symbols` | the series' labels |
//! | `metadata.type` | `kind` (a counter, a gauge, or a histogram's or summary's series) |
//! | `metadata.unit_ref` | `unit` |
//! | a native histogram | `NAME_count` and `NAME_sum` at its timestamp, as OTLP's exponential histograms are read (its buckets are not) |
//! | exemplars | taken (counted written) and not kept |
//!
//! Only the fields read are declared; prost skips the others (help references,
//! buckets, created timestamps).

use super::{series_samples_of_kind, HostLabels, Label, Sample, SeriesSamples, TimeSeries};
use crate::metric_kind::{self, About, Families, Family};
use vigil_engine::event::DecodeError;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Request {
    #[prost(string, repeated, tag = "4")]
    pub symbols: Vec<String>,
    #[prost(message, repeated, tag = "5")]
    pub timeseries: Vec<Series>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Series {
    #[prost(uint32, repeated, tag = "1")]
    pub labels_refs: Vec<u32>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub histograms: Vec<Histogram>,
    #[prost(message, repeated, tag = "4")]
    pub exemplars: Vec<Exemplar>,
    #[prost(message, optional, tag = "5")]
    pub metadata: Option<Metadata>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Exemplar {
    #[prost(uint32, repeated, tag = "1")]
    pub labels_refs: Vec<u32>,
    #[prost(double, tag = "2")]
    pub value: f64,
    #[prost(int64, tag = "3")]
    pub timestamp: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Metadata {
    /// `Metadata.MetricType`: numbered as 1.0's metadata types are.
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    /// The unit, a reference into the symbol table (0, the empty string, for none).
    #[prost(uint32, tag = "4")]
    pub unit_ref: u32,
}

/// A native histogram; of it, its count, sum and time are read, and its buckets' counts only to
/// check them against its count.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Histogram {
    #[prost(uint64, optional, tag = "1")]
    pub count_int: Option<u64>,
    #[prost(double, optional, tag = "2")]
    pub count_float: Option<f64>,
    #[prost(double, tag = "3")]
    pub sum: f64,
    #[prost(uint64, optional, tag = "6")]
    pub zero_count_int: Option<u64>,
    #[prost(double, optional, tag = "7")]
    pub zero_count_float: Option<f64>,
    /// An integer histogram's bucket counts, each as the difference from the bucket before.
    #[prost(sint64, repeated, tag = "9")]
    pub negative_deltas: Vec<i64>,
    #[prost(double, repeated, tag = "10")]
    pub negative_counts: Vec<f64>,
    #[prost(sint64, repeated, tag = "12")]
    pub positive_deltas: Vec<i64>,
    #[prost(double, repeated, tag = "13")]
    pub positive_counts: Vec<f64>,
    /// `RESET_HINT_GAUGE` (3) marks a gauge histogram, whose count may fall.
    #[prost(int32, tag = "14")]
    pub reset_hint: i32,
    #[prost(int64, tag = "15")]
    pub timestamp: i64,
}

const RESET_HINT_GAUGE: i32 = 3;

/// What one 2.0 series gave: its events, and how many of its samples and histograms were
/// written (as the `X-Prometheus-Remote-Write-*-Written` headers count them; a stale marker is
/// written, as the end of its series). Its exemplars are taken, and not kept.
#[derive(Debug, Default)]
pub struct Written {
    pub samples: SeriesSamples,
    pub sample_count: usize,
    pub histogram_count: usize,
    pub exemplar_count: usize,
}

/// The labels of `refs`, pairs of name and value indexes into `symbols`.
fn labels(refs: &[u32], symbols: &[String]) -> Result<Vec<Label>, DecodeError> {
    let bad = |reason: String| DecodeError { field: Some("labels_refs".into()), reason };
    if !refs.len().is_multiple_of(2) {
        return Err(bad(format!("{} label references: they come in pairs of name and value", refs.len())));
    }
    let symbol = |r: u32| {
        symbols
            .get(r as usize)
            .ok_or_else(|| bad(format!("label reference {r} is past the symbol table's {} symbols", symbols.len())))
    };
    refs.chunks(2).map(|pair| Ok(Label { name: symbol(pair[0])?.clone(), value: symbol(pair[1])?.clone() })).collect()
}

/// The events of one 2.0 series: its samples, and each native histogram's count and sum.
/// The series' metadata gives their `kind` and `unit`; without it, `families` and the name do.
pub fn series(
    series: &Series,
    symbols: &[String],
    hosts: &HostLabels,
    families: &Families,
) -> Result<Written, DecodeError> {
    let labels = labels(&series.labels_refs, symbols)?;
    let name = labels.iter().find(|l| l.name == "__name__").map(|l| l.value.clone()).unwrap_or_default();
    let family = series.metadata.as_ref().map(|m| Family::from_remote_write(m.r#type)).filter(|f| *f != Family::Other);
    let given_unit =
        series.metadata.as_ref().and_then(|m| symbols.get(m.unit_ref as usize)).and_then(|u| metric_kind::unit(u));
    let about = match family {
        Some(f) => About { kind: f.kind_of(&name), unit: given_unit },
        None => {
            let known = families.about(&name);
            About { kind: known.kind, unit: given_unit.or(known.unit) }
        }
    };
    if let Some(reason) = series.histograms.iter().find_map(invalid) {
        return Err(DecodeError { field: Some("histograms".into()), reason });
    }
    for exemplar in &series.exemplars {
        self::labels(&exemplar.labels_refs, symbols)?;
    }
    let as_v1 = TimeSeries { labels: labels.clone(), samples: series.samples.clone() };
    let mut samples = series_samples_of_kind(&as_v1, hosts, about)?;
    // A stale marker ends its series and a value that is not finite says "no value": both are
    // taken, so both are written.
    let sample_count = samples.events.len() + samples.stale + samples.not_finite;
    let mut written = Written { sample_count, exemplar_count: series.exemplars.len(), ..Written::default() };
    if !series.histograms.is_empty() {
        let gauge = series.histograms.iter().any(|h| h.reset_hint == RESET_HINT_GAUGE);
        let kind = if gauge { crate::metric_kind::GAUGE } else { crate::metric_kind::COUNTER };
        for (suffix, value) in [("_count", count as fn(&Histogram) -> f64), ("_sum", |h: &Histogram| h.sum)] {
            let mut named = labels.clone();
            named.retain(|l| l.name != "__name__");
            named.push(Label { name: "__name__".into(), value: format!("{name}{suffix}") });
            let points = series.histograms.iter().map(|h| Sample { value: value(h), timestamp: h.timestamp }).collect();
            let about = About { kind: Some(kind), unit: None };
            let part = series_samples_of_kind(&TimeSeries { labels: named, samples: points }, hosts, about)?;
            samples.events.extend(part.events);
            samples.not_finite += part.not_finite;
            samples.stale += part.stale;
        }
        // A histogram whose count or sum is not finite is not written whole.
        written.histogram_count =
            series.histograms.iter().filter(|h| count(h).is_finite() && h.sum.is_finite()).count();
    }
    written.samples = samples;
    Ok(written)
}

fn count(h: &Histogram) -> f64 {
    h.count_int.map_or(h.count_float.unwrap_or(0.0), |c| c as f64)
}

/// Why a histogram cannot be, as Prometheus' own validation says: a bucket with a negative
/// count, or an integer histogram whose buckets do not add up to its count (they may add up to
/// less when its sum is NaN: NaN observations are counted in no bucket).
fn invalid(h: &Histogram) -> Option<String> {
    let mut in_buckets = h.zero_count_int.map_or(0.0, |c| c as f64);
    for deltas in [&h.negative_deltas, &h.positive_deltas] {
        let mut running = 0i64;
        for (i, d) in deltas.iter().enumerate() {
            running = running.saturating_add(*d);
            if running < 0 {
                return Some(format!("bucket {} has a negative count ({running})", i + 1));
            }
            in_buckets += running as f64;
        }
    }
    if let Some(c) = [&h.negative_counts, &h.positive_counts].into_iter().flatten().find(|c| **c < 0.0) {
        return Some(format!("a bucket has a negative count ({c})"));
    }
    let count = h.count_int? as f64;
    let adds_up = if h.sum.is_nan() { in_buckets <= count } else { in_buckets == count };
    (!adds_up).then(|| format!("{in_buckets} observations in its buckets, but its count is {count}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_engine::event::Value;

    fn request() -> Request {
        let symbols = ["", "__name__", "rpc_seconds", "instance", "web-1:9100", "job", "api"];
        Request {
            symbols: symbols.iter().map(|s| s.to_string()).collect(),
            timeseries: vec![Series {
                labels_refs: vec![1, 2, 3, 4, 5, 6],
                samples: vec![Sample { value: 0.5, timestamp: 1000 }],
                histograms: vec![Histogram {
                    count_int: Some(4),
                    sum: 2.5,
                    positive_deltas: vec![1, 2],
                    timestamp: 2000,
                    ..Default::default()
                }],
                exemplars: vec![Exemplar { labels_refs: vec![], value: 0.5, timestamp: 1000 }],
                metadata: Some(Metadata { r#type: 3, unit_ref: 0 }),
            }],
        }
    }

    #[test]
    fn labels_come_from_the_symbol_table_and_histograms_are_their_count_and_sum() {
        let r = request();
        let w = series(&r.timeseries[0], &r.symbols, &HostLabels::default(), &Families::default()).expect("a series");
        assert_eq!((w.sample_count, w.histogram_count), (1, 1));
        let shown: Vec<(String, String, f64, String)> = w
            .samples
            .events
            .iter()
            .map(|e| {
                (
                    e.get("name").to_text(),
                    e.get("labels").to_text(),
                    e.get("value").as_f64().unwrap(),
                    e.get("kind").to_text(),
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                ("rpc_seconds".into(), "{job=api}".into(), 0.5, "gauge".into()),
                ("rpc_seconds_count".into(), "{job=api}".into(), 4.0, "counter".into()),
                ("rpc_seconds_sum".into(), "{job=api}".into(), 2.5, "counter".into()),
            ]
        );
        assert_eq!(w.samples.events[0].get("host"), Value::str("web-1"));
        assert_eq!(w.samples.events[1].ts, 2000);
    }

    #[test]
    fn a_histogram_whose_buckets_do_not_add_up_is_refused() {
        let h = |count: u64, sum: f64, deltas: Vec<i64>| Histogram {
            count_int: Some(count),
            sum,
            zero_count_int: Some(1),
            positive_deltas: deltas,
            ..Default::default()
        };
        // Buckets 1, 3, 4 and one in the zero bucket: 9 observations.
        assert_eq!(invalid(&h(9, 1.0, vec![1, 2, 1])), None);
        assert!(invalid(&h(99, 1.0, vec![1, 2, 1])).is_some_and(|r| r.contains("9 observations")));
        assert_eq!(invalid(&h(99, f64::NAN, vec![1, 2, 1])), None, "NaN observations are in no bucket");
        assert!(invalid(&h(9, 1.0, vec![1, -2, 10])).is_some_and(|r| r.contains("negative")));
        let floats = Histogram { count_float: Some(2.0), positive_counts: vec![1.0, -1.0], ..Default::default() };
        assert!(invalid(&floats).is_some());
    }

    #[test]
    fn references_past_the_table_or_unpaired_are_refused_with_why() {
        let mut r = request();
        r.timeseries[0].labels_refs.push(99);
        let err =
            series(&r.timeseries[0], &r.symbols, &HostLabels::default(), &Families::default()).expect_err("unpaired");
        assert!(err.reason.contains("pairs"), "{err}");
        r.timeseries[0].labels_refs.push(100);
        let err = series(&r.timeseries[0], &r.symbols, &HostLabels::default(), &Families::default())
            .expect_err("past the table");
        assert!(err.reason.contains("past the symbol table"), "{err}");
    }
}
