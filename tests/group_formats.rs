//! A group reading its input topic in the collectors' formats (`--kafka-topic-format`): InfluxDB
//! line protocol as Telegraf's Kafka output writes it, and OTLP protobuf as the OpenTelemetry
//! Collector's Kafka exporter does, through the group's faults (a member killed with `kill -9`,
//! one stopped past its session timeout). The samples of one time make one message, so that a
//! message's events go to several keyed partitions and each takes its share once. The alerts
//! must be those of a clean `vigil replay` of the same samples as JSON lines.

use crate::group::{run_case, Case};
use crate::support::*;
use prost::Message;
use vigil::otlp;

/// The messages of a chunk of `metric` events (JSON lines) in `format`: one per event time in
/// a collector's format, one per event as Vigil's JSON lines when none.
pub fn encode(format: Option<&str>, lines: &[String]) -> Vec<Vec<u8>> {
    let Some(format) = format else { return lines.iter().map(|l| l.as_bytes().to_vec()).collect() };
    let mut by_time: Vec<(i64, Vec<serde_json::Value>)> = Vec::new();
    for line in lines {
        let event: serde_json::Value = serde_json::from_str(line).expect("a metric event");
        let ms = vigil::event::parse_time(event["ts"].as_str().expect("ts")).expect("a time");
        match by_time.last_mut() {
            Some((t, events)) if *t == ms => events.push(event),
            _ => by_time.push((ms, vec![event])),
        }
    }
    by_time
        .into_iter()
        .map(|(ms, events)| match format {
            "influx" => influx(ms, &events).into_bytes(),
            "otlp-proto" => otlp_request(ms, &events).encode_to_vec(),
            other => panic!("no encoder for {other}"),
        })
        .collect()
}

/// The events of one time as line protocol, a line each (`value` is the sample's field).
fn influx(ms: i64, events: &[serde_json::Value]) -> String {
    let lines: Vec<String> = events
        .iter()
        .map(|e| format!("{},host={} value={} {}", text(e, "name"), text(e, "host"), e["value"], ms * 1_000_000))
        .collect();
    lines.join("\n")
}

/// The events of one time as an OTLP request: a resource per host (`host.name`), a gauge per
/// sample.
fn otlp_request(ms: i64, events: &[serde_json::Value]) -> otlp::ExportMetricsServiceRequest {
    let mut resources: Vec<otlp::ResourceMetrics> = Vec::new();
    for e in events {
        let host = text(e, "host");
        let point = otlp::NumberDataPoint {
            attributes: Vec::new(),
            time_unix_nano: ms as u64 * 1_000_000,
            value: Some(otlp::NumberValue::AsDouble(e["value"].as_f64().expect("a value"))),
            flags: 0,
        };
        let metric = otlp::Metric {
            name: text(e, "name"),
            unit: String::new(),
            data: Some(otlp::Data::Gauge(otlp::Gauge { data_points: vec![point] })),
        };
        let resource = otlp::Resource {
            attributes: vec![otlp::KeyValue {
                key: "host.name".into(),
                value: Some(otlp::AnyValue { value: Some(otlp::Any::StringValue(host)) }),
            }],
        };
        match resources.iter_mut().find(|r| r.resource.as_ref() == Some(&resource)) {
            Some(r) => r.scope_metrics[0].metrics.push(metric),
            None => resources.push(otlp::ResourceMetrics {
                resource: Some(resource),
                scope_metrics: vec![otlp::ScopeMetrics { metrics: vec![metric] }],
            }),
        }
    }
    otlp::ExportMetricsServiceRequest { resource_metrics: resources }
}

fn text(e: &serde_json::Value, field: &str) -> String {
    e[field].as_str().expect("a text field").to_string()
}

fn case(label: &'static str, format: &'static str) -> Case {
    Case {
        label,
        format: Some(format),
        timed: cloudwatch_workload(),
        rules: crate::group::metric_rules(),
        streams: &["metric"],
        fleet_rule: "fleet_cpu_outlier",
        cluster: None,
        cousins: false,
        stale_claims: false,
    }
}

#[tokio::test]
#[ignore = "needs Apache Kafka, PostgreSQL and ../shared/data: run scripts/test.sh"]
async fn a_group_reading_line_protocol_through_a_kill_and_a_pause_is_exact() {
    run_case(case("NAB CloudWatch metrics as line protocol", "influx")).await;
}

#[tokio::test]
#[ignore = "needs Apache Kafka, PostgreSQL and ../shared/data: run scripts/test.sh"]
async fn a_group_reading_otlp_through_a_kill_and_a_pause_is_exact() {
    run_case(case("NAB CloudWatch metrics as OTLP protobuf", "otlp-proto")).await;
}
