//! A fleet of node_exporter hosts remote-writing to `vigil serve`, without Prometheus: what
//! `benches/fleet.py --sender` runs where Prometheus and a scrape proxy cannot keep up (1,000
//! hosts on two cores).
//!
//! ```text
//! cargo build --release --example fleet_send
//! target/release/examples/fleet_send --url http://127.0.0.1:9000/api/v1/write \
//!     --source http://127.0.0.1:9100/metrics --hosts 1000 --seconds 300
//! ```
//!
//! Every `--scrape` seconds it scrapes one real node_exporter (`--source`) and sends what it
//! read as `--hosts` hosts, as Prometheus would after scraping each of them: each host is
//! scraped at its own offset within the interval (spread evenly, with up to 5% jitter), its
//! series carry `instance="host-NNNN"` and `job="node"`, and its counters start at its own
//! offset (the same rates, other values). One request per host and scrape (about 500 series,
//! Prometheus' batch size), `--concurrency` requests in flight, like Prometheus' shards; the
//! metric families' types go in a request of their own every minute, as Prometheus sends
//! metadata. A host whose send is still queued when its next scrape is due is sent late, not
//! skipped, so what Vigil cannot take shows as lag.
//!
//! `--fill-hours H` first sends H hours of history before now, one scrape every
//! `--fill-step` seconds per host (the same values, counters advanced at their current rates),
//! as fast as Vigil takes it, and prints how long that took: a way to reach older state than a
//! live run's minutes, paid for by Vigil at its own speed.
//!
//! Prints one JSON line at the end: samples offered and sent, requests failed, and the
//! largest lag behind a host's due time.

use clap::Parser;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use vigil_formats::remote_write::{Label, MetricMetadata, Sample, TimeSeries, WriteRequest};

#[derive(Parser)]
struct Args {
    /// Vigil's remote-write URL.
    #[arg(long)]
    url: String,
    /// A real node_exporter's metrics URL.
    #[arg(long)]
    source: String,
    #[arg(long, default_value_t = 50)]
    hosts: usize,
    /// Seconds between a host's scrapes.
    #[arg(long, default_value_t = 10)]
    scrape: u64,
    /// Seconds to send live scrapes for.
    #[arg(long, default_value_t = 300)]
    seconds: u64,
    /// Requests in flight.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Hours of history to send before the live scrapes.
    #[arg(long, default_value_t = 0.0)]
    fill_hours: f64,
    /// Seconds between a host's scrapes in the history.
    #[arg(long, default_value_t = 60)]
    fill_step: u64,
}

/// One series of an exposition: its name and labels, and its value.
struct Line {
    labels: Vec<Label>,
    value: f64,
    counter: bool,
}

/// A scrape: every sample line of a text exposition, and the families' types.
struct Scrape {
    lines: Vec<Line>,
    types: Vec<MetricMetadata>,
}

/// Reads a Prometheus text exposition (version 0.0.4): `# TYPE` lines and sample lines,
/// `name{label="value",...} value`, label values with `\\`, `\"` and `\n` escapes.
fn parse(text: &str) -> Result<Scrape, String> {
    let mut types = Vec::new();
    let mut kinds: HashMap<String, i32> = HashMap::new();
    let mut lines = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let raw = raw.trim();
        if let Some(rest) = raw.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else { continue };
            let code = match kind {
                "counter" => 1,
                "gauge" => 2,
                "histogram" => 3,
                "summary" => 5,
                _ => 0,
            };
            kinds.insert(name.to_string(), code);
            types.push(MetricMetadata { r#type: code, metric_family_name: name.to_string(), unit: String::new() });
            continue;
        }
        if raw.is_empty() || raw.starts_with('#') {
            continue;
        }
        let line = sample_line(raw).map_err(|e| format!("line {}: {e}", n + 1))?;
        let name = &line.0[0].value;
        let family = ["_bucket", "_count", "_sum"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name);
        let counter =
            kinds.get(name.as_str()).or_else(|| kinds.get(family)).is_some_and(|&k| k == 1 || k == 3 || k == 5)
                && !(kinds.get(family) == Some(&5) && !name.ends_with("_count") && !name.ends_with("_sum"));
        lines.push(Line { labels: line.0, value: line.1, counter });
    }
    Ok(Scrape { lines, types })
}

/// A sample line's labels (`__name__` first) and value.
fn sample_line(raw: &str) -> Result<(Vec<Label>, f64), String> {
    let end = raw.find(['{', ' ']).ok_or("no value")?;
    let mut labels = vec![Label { name: "__name__".into(), value: raw[..end].to_string() }];
    let mut rest = &raw[end..];
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices().peekable();
        loop {
            while chars.next_if(|&(_, c)| c == ',' || c == ' ').is_some() {}
            match chars.peek() {
                Some(&(i, '}')) => {
                    rest = &body[i + 1..];
                    break;
                }
                None => return Err("labels not closed".into()),
                _ => {}
            }
            let mut name = String::new();
            for (_, c) in chars.by_ref() {
                if c == '=' {
                    break;
                }
                name.push(c);
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return Err(format!("label {name}: value not quoted"));
            }
            let mut value = String::new();
            loop {
                match chars.next().map(|(_, c)| c) {
                    Some('"') => break,
                    Some('\\') => match chars.next().map(|(_, c)| c) {
                        Some('n') => value.push('\n'),
                        Some(c) => value.push(c),
                        None => return Err("escape at the end".into()),
                    },
                    Some(c) => value.push(c),
                    None => return Err(format!("label {name}: value not closed")),
                }
            }
            labels.push(Label { name: name.trim().to_string(), value });
        }
    }
    let value = rest.split_whitespace().next().ok_or("no value")?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().map_err(|e| format!("value {v:?}: {e}"))?,
    };
    Ok((labels, value))
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock after 1970").as_millis() as i64
}

/// Host `host`'s request for one scrape at `ts`: counters moved by the host's own offset, and
/// by `rates` times `ahead_s` (history sent before the scrape it was read from).
fn request(scrape: &Scrape, host: usize, ts: i64, rates: Option<(&[f64], f64)>) -> Vec<u8> {
    let instance = format!("host-{host:04}");
    let offset = (host as f64 * 7919.0) % 1_000_003.0;
    let timeseries = scrape
        .lines
        .iter()
        .enumerate()
        .map(|(i, line)| {
            let mut labels = Vec::with_capacity(line.labels.len() + 2);
            labels.push(line.labels[0].clone());
            labels.push(Label { name: "instance".into(), value: instance.clone() });
            labels.push(Label { name: "job".into(), value: "node".into() });
            labels.extend(line.labels[1..].iter().cloned());
            labels.sort_by(|a, b| a.name.cmp(&b.name));
            let mut value = line.value;
            if line.counter {
                value += offset;
                if let Some((rates, ahead)) = rates {
                    value = (value - rates[i] * ahead).max(offset);
                }
            }
            TimeSeries { labels, samples: vec![Sample { value, timestamp: ts }] }
        })
        .collect();
    encode(&WriteRequest { timeseries, metadata: Vec::new() })
}

fn encode(request: &WriteRequest) -> Vec<u8> {
    let raw = prost::Message::encode_to_vec(request);
    snap::raw::Encoder::new().compress_vec(&raw).expect("snappy compresses any input")
}

/// Posts bodies, `concurrency` at once, retrying what Vigil refuses for now (429, 5xx) as
/// Prometheus does, and counting what it refuses for good.
struct Sender {
    client: reqwest::Client,
    url: String,
    permits: Arc<tokio::sync::Semaphore>,
    sent: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

impl Sender {
    async fn send(&self, body: Vec<u8>, samples: u64) {
        let permit = self.permits.clone().acquire_owned().await.expect("never closed");
        let (client, url, sent, failed) =
            (self.client.clone(), self.url.clone(), self.sent.clone(), self.failed.clone());
        tokio::spawn(async move {
            let _permit = permit;
            for attempt in 0..10u32 {
                let answer = client
                    .post(&url)
                    .header("Content-Encoding", "snappy")
                    .header("Content-Type", "application/x-protobuf")
                    .header("X-Prometheus-Remote-Write-Version", "0.1.0")
                    .body(body.clone())
                    .send()
                    .await;
                match answer {
                    Ok(r) if r.status().is_success() => {
                        sent.fetch_add(samples, Ordering::Relaxed);
                        return;
                    }
                    Ok(r) if r.status().as_u16() != 429 && r.status().is_client_error() => break,
                    _ => tokio::time::sleep(Duration::from_millis(100 << attempt.min(5))).await,
                }
            }
            failed.fetch_add(1, Ordering::Relaxed);
        });
    }

    /// Waits for every request in flight.
    async fn drain(&self, concurrency: usize) {
        let _all = self.permits.acquire_many(concurrency as u32).await.expect("never closed");
    }
}

async fn scrape(client: &reqwest::Client, source: &str) -> Scrape {
    let text = client.get(source).send().await.and_then(|r| r.error_for_status()).expect("the source answers");
    parse(&text.text().await.expect("a text body")).unwrap_or_else(|e| panic!("{source}: {e}"))
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let client = reqwest::Client::new();
    let sender = Sender {
        client: client.clone(),
        url: args.url.clone(),
        permits: Arc::new(tokio::sync::Semaphore::new(args.concurrency)),
        sent: Arc::new(AtomicU64::new(0)),
        failed: Arc::new(AtomicU64::new(0)),
    };
    let mut current = scrape(&client, &args.source).await;
    let per_host = current.lines.len() as u64;
    sender.send(encode(&WriteRequest { timeseries: Vec::new(), metadata: current.types.clone() }), 0).await;
    let mut filled = serde_json::Value::Null;
    if args.fill_hours > 0.0 {
        // Counters' rates from two scrapes one interval apart, to run them back in time.
        tokio::time::sleep(Duration::from_secs(args.scrape)).await;
        let next = scrape(&client, &args.source).await;
        let rates: Vec<f64> = current
            .lines
            .iter()
            .zip(&next.lines)
            .map(|(a, b)| if b.value >= a.value { (b.value - a.value) / args.scrape as f64 } else { 0.0 })
            .collect();
        current = next;
        let started = Instant::now();
        let end = now_ms() - args.scrape as i64 * 1000;
        let steps = (args.fill_hours * 3600.0 / args.fill_step as f64) as i64;
        for step in (1..=steps).rev() {
            let ts = end - step * args.fill_step as i64 * 1000;
            for host in 0..args.hosts {
                let ahead = (end - ts) as f64 / 1000.0;
                sender.send(request(&current, host, ts + host as i64, Some((&rates, ahead))), per_host).await;
            }
        }
        sender.drain(args.concurrency).await;
        let seconds = started.elapsed().as_secs_f64();
        let samples = steps as u64 * per_host * args.hosts as u64;
        filled = serde_json::json!({"fill_samples": samples, "fill_seconds": seconds, "fill_samples_per_s": samples as f64 / seconds});
        eprintln!("fleet_send: filled {} hours in {seconds:.0} s", args.fill_hours);
    }
    eprintln!("fleet_send: live");
    let started = Instant::now();
    let interval = Duration::from_secs(args.scrape);
    let offsets: Vec<Duration> = (0..args.hosts)
        .map(|h| {
            let even = interval.mul_f64(h as f64 / args.hosts as f64);
            even + interval.mul_f64(fastrand::f64() * 0.05)
        })
        .collect();
    let mut order: Vec<usize> = (0..args.hosts).collect();
    order.sort_by_key(|&h| offsets[h]);
    let (mut offered, mut lag, mut round) = (0u64, Duration::ZERO, 0u32);
    let mut last_metadata = Instant::now();
    while started.elapsed() < Duration::from_secs(args.seconds) {
        let round_start = started + interval * round;
        for &host in &order {
            let due = round_start + offsets[host];
            tokio::time::sleep_until(due.into()).await;
            lag = lag.max(Instant::now() - due);
            let ts = now_ms();
            sender.send(request(&current, host, ts, None), per_host).await;
            offered += per_host;
        }
        round += 1;
        current = scrape(&client, &args.source).await;
        if last_metadata.elapsed() >= Duration::from_secs(60) {
            last_metadata = Instant::now();
            sender.send(encode(&WriteRequest { timeseries: Vec::new(), metadata: current.types.clone() }), 0).await;
        }
    }
    sender.drain(args.concurrency).await;
    let report = serde_json::json!({
        "hosts": args.hosts,
        "series_per_host": per_host,
        "offered": offered,
        "sent": sender.sent.load(Ordering::Relaxed),
        "failed_requests": sender.failed.load(Ordering::Relaxed),
        "max_lag_s": lag.as_secs_f64(),
        "fill": filled,
    });
    println!("{report}");
}
