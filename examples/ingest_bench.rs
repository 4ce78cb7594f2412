//! The cost of durable HTTP ingest: `POST /api/v1/events` answered only once its events are
//! in the ingest log on disk.
//!
//! ```text
//! cargo build --release
//! cargo run --release --example ingest_bench -- [CLIENTS] [BATCH] [SECONDS] [VIGIL_FLAGS...]
//! ```
//!
//! Starts `target/release/vigil serve` on SQLite in a temporary folder with one filter rule,
//! then CLIENTS clients each post batches of BATCH `task_usage` events, one request after the
//! other, for SECONDS. Prints events/s taken, requests/s, and the latency of a request (p50,
//! p99). Flags after SECONDS go to `vigil serve`: `--ingest-fsync false` measures the same
//! without the flush to disk.
//!
//! `VIGIL_INGEST_FORMAT` picks what the clients send: `json` (the default, above), `influx`
//! (`POST /api/v2/write`: BATCH lines of one field each, Telegraf's shape) or `remote-write`
//! (`POST /api/v1/write`: BATCH series of one sample each, snappy protobuf) or `otlp`
//! (`POST /v1/metrics`: BATCH gauge points over 50 hosts' resources, protobuf); the last three
//! are `metric` samples, judged by one metric filter rule.

use std::process::Command;
use std::time::{Duration, Instant};

mod support;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let clients: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(4);
    let batch: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(100);
    let seconds: u64 = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(10);
    let dir = std::env::temp_dir().join(format!("vigil-ingest-bench-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("rules")).expect("temp dir");
    std::fs::write(dir.join("rules/hot.saql"), "rule hot { task t use machine m as e where e.cpu > 0.999 }\n")
        .expect("rule");
    std::fs::write(dir.join("rules/huge.saql"), "rule huge { metric s sample as e where e.value > 1000000 }\n")
        .expect("rule");
    let format = std::env::var("VIGIL_INGEST_FORMAT").unwrap_or_else(|_| "json".into());
    let (mut child, url) = support::start_vigil(
        Command::new(std::env::current_dir().expect("cwd").join("target/release/vigil"))
            .args(["serve", "--http-addr", "127.0.0.1:0", "--rules", "rules"])
            .args(args.iter().skip(4))
            .current_dir(&dir),
    );
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (path, content_type, encoding) = match format.as_str() {
            "influx" => ("/api/v2/write?precision=ms", "text/plain", None),
            "remote-write" => ("/api/v1/write", "application/x-protobuf", Some("snappy")),
            "otlp" => ("/v1/metrics", "application/x-protobuf", None),
            _ => ("/api/v1/events", "application/x-ndjson", None),
        };
        let url = format!("{url}{path}");
        let format = format.clone();
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut latencies = Vec::new();
            let mut n = 0u64;
            while Instant::now() < deadline {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock");
                let ts = now.as_millis() as i64 - 1_000;
                let body = body(&format, batch, c, ts);
                let sent = Instant::now();
                let mut request = client.post(&url).header("content-type", content_type).body(body);
                if let Some(encoding) = encoding {
                    request = request.header("content-encoding", encoding);
                }
                let resp = request.send().await.expect("answers");
                assert!(resp.status().is_success(), "{}", resp.status());
                latencies.push(sent.elapsed());
                n += batch as u64;
            }
            (n, latencies)
        }));
    }
    let mut events = 0;
    let mut latencies = Vec::new();
    for t in tasks {
        let (n, l) = t.await.expect("client");
        events += n;
        latencies.extend(l);
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    println!(
        "clients {clients}, batch {batch}: {:.0} events/s, {:.0} requests/s, latency p50 {:.2} ms, p99 {:.2} ms",
        events as f64 / elapsed,
        latencies.len() as f64 / elapsed,
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3
    );
    let _ = child.kill();
    let _ = child.wait();
    std::fs::remove_dir_all(&dir).ok();
}

/// One request's body of `batch` events of client `c` at `ts`, in `format`.
fn body(format: &str, batch: usize, c: usize, ts: i64) -> Vec<u8> {
    match format {
        "influx" => (0..batch)
            .map(|i| format!("cpu,host=h{},cpu=cpu{c} usage_user={}.5 {ts}\n", i % 50, i % 90))
            .collect::<String>()
            .into_bytes(),
        "remote-write" => {
            use vigil::remote_write::{Label, Sample, TimeSeries, WriteRequest};
            let label = |name: &str, value: String| Label { name: name.into(), value };
            let timeseries = (0..batch)
                .map(|i| TimeSeries {
                    labels: vec![
                        label("__name__", "node_cpu_seconds_total".into()),
                        label("cpu", format!("{c}")),
                        label("instance", format!("h{}:9100", i % 50)),
                        label("mode", format!("m{}", i / 50)),
                    ],
                    samples: vec![Sample { value: (i % 90) as f64 + 0.5, timestamp: ts }],
                })
                .collect();
            let raw = prost::Message::encode_to_vec(&WriteRequest { timeseries, metadata: Vec::new() });
            snap::raw::Encoder::new().compress_vec(&raw).expect("snappy")
        }
        "otlp" => {
            use vigil::otlp::*;
            let text = |s: String| Some(AnyValue { value: Some(Any::StringValue(s)) });
            let kv = |key: &str, value: String| KeyValue { key: key.into(), value: text(value) };
            let resource_metrics = (0..50)
                .map(|h| ResourceMetrics {
                    resource: Some(Resource { attributes: vec![kv("host.name", format!("h{h}"))] }),
                    scope_metrics: vec![ScopeMetrics {
                        metrics: vec![Metric {
                            name: "system.cpu.utilization".into(),
                            unit: "1".into(),
                            data: Some(Data::Gauge(Gauge {
                                data_points: (0..batch / 50)
                                    .map(|i| NumberDataPoint {
                                        attributes: vec![kv("cpu", format!("{c}")), kv("state", format!("s{i}"))],
                                        time_unix_nano: ts as u64 * 1_000_000,
                                        value: Some(NumberValue::AsDouble((i % 90) as f64 + 0.5)),
                                        flags: 0,
                                    })
                                    .collect(),
                            })),
                        }],
                    }],
                })
                .collect();
            prost::Message::encode_to_vec(&ExportMetricsServiceRequest { resource_metrics })
        }
        _ => (0..batch)
            .map(|i| {
                format!(
                    "{{\"stream\":\"task_usage\",\"ts\":{ts},\"job_id\":\"j{c}\",\"task_index\":{i},\"machine_id\":\"m{}\",\"cpu\":0.5}}\n",
                    i % 50
                )
            })
            .collect::<String>()
            .into_bytes(),
    }
}
