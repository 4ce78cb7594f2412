//! Workload (f): Kafka -> `vigil serve` -> PostgreSQL -> server-sent events, measured.
//!
//! ```text
//! cargo build --release
//! cargo run --release --example e2e_latency -- BROKERS POSTGRES_URL [RATE] [SECONDS] [VIGIL_FLAGS...]
//! ```
//!
//! Starts `target/release/vigil serve` (or `$VIGIL_BIN`) against the broker and the database,
//! then produces
//! `task_usage` events stamped with the wall clock at RATE events/s for SECONDS. A filter rule
//! fires on about one event in a thousand; each alert is timed from its event's timestamp (when
//! the event was produced) to its arrival on the alert stream, which is after it was stored in
//! PostgreSQL. Then it sends as fast as it can and reports the sustained rate the service took.
//! Flags after SECONDS go to `vigil serve` (`--kafka-option fetch.wait.max.ms=10`).

use rdkafka::producer::{FutureProducer, FutureRecord};
use std::process::Command;
use std::time::{Duration, Instant};

mod support;

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

async fn events_in(url: &str) -> u64 {
    let text = reqwest::get(format!("{url}/metrics")).await.expect("metrics").text().await.expect("text");
    text.lines()
        .filter(|l| l.starts_with("vigil_events_in_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(brokers), Some(db)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: e2e_latency BROKERS POSTGRES_URL [RATE] [SECONDS] [VIGIL_FLAGS...]");
        std::process::exit(2);
    };
    let rate: u64 = args.get(3).and_then(|r| r.parse().ok()).unwrap_or(50_000);
    let seconds: u64 = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(20);
    let dir = std::env::temp_dir().join(format!("vigil-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(dir.join("hot.saql"), "rule hot { task t use machine m as e where e.cpu > 0.999 }\n").expect("rule");
    let topic = format!("e2e_usage_{}", std::process::id());
    vigil::service::kafka::ensure_topics(brokers, std::slice::from_ref(&topic), 1, &Default::default())
        .await
        .expect("topic");

    let (mut child, url) = support::start_vigil(
        Command::new(std::env::var("VIGIL_BIN").unwrap_or_else(|_| "target/release/vigil".into()))
            .args(["serve", "--http-addr", "127.0.0.1:0", "--lateness", "0s", "--kafka-group", &topic])
            .args(["--rules", dir.to_str().expect("utf-8"), "--database-url", db, "--kafka-brokers", brokers])
            .args(["--topic", &format!("task_usage={topic}")])
            .args(args.iter().skip(5)),
    );

    // Alert stream: latency = arrival - the event's timestamp.
    // Per alert: (event produced -> on the stream, event produced -> detected by the engine).
    let latencies = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(i64, i64)>::new()));
    let sink = latencies.clone();
    let stream_url = format!("{url}/api/v1/alerts/stream?status=firing");
    tokio::spawn(async move {
        let mut resp = reqwest::get(&stream_url).await.expect("stream");
        let mut buf = String::new();
        while let Ok(Some(chunk)) = resp.chunk().await {
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buf.find("\n\n") {
                let frame: String = buf.drain(..end + 2).collect();
                if let Some(data) = frame.lines().find_map(|l| l.strip_prefix("data:")) {
                    if let Ok(a) = serde_json::from_str::<vigil::alert::Alert>(data.trim()) {
                        sink.lock().expect("lock").push((now_ms() - a.time, a.detected_at - a.time));
                    }
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;

    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "1")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .expect("producer");
    let send = |i: u64| {
        let line = format!(
            "{{\"ts\":{},\"job_id\":\"j{}\",\"task_index\":{},\"machine_id\":\"m{}\",\"cpu\":{},\"mem\":0.5}}",
            now_ms(),
            i % 100,
            i % 1000,
            i % 1000,
            ((i * 7919) % 10_000) as f64 / 10_000.0
        );
        let p = producer.clone();
        let topic = topic.clone();
        async move { p.send(FutureRecord::<(), _>::to(&topic).payload(&line), Duration::from_secs(30)).await.is_ok() }
    };

    // Paced phase: RATE events/s in 10 ms slices.
    let start = Instant::now();
    let per_slice = (rate / 100).max(1);
    let mut sent = 0u64;
    let mut pending = Vec::new();
    while start.elapsed() < Duration::from_secs(seconds) {
        let slice_start = Instant::now();
        for _ in 0..per_slice {
            pending.push(tokio::spawn(send(sent)));
            sent += 1;
        }
        if pending.len() > 100_000 {
            for p in pending.drain(..) {
                let _ = p.await;
            }
        }
        if let Some(rest) = Duration::from_millis(10).checked_sub(slice_start.elapsed()) {
            tokio::time::sleep(rest).await;
        }
    }
    for p in pending.drain(..) {
        let _ = p.await;
    }
    let offered = sent as f64 / start.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(60);
    while events_in(&url).await < sent && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pairs = latencies.lock().expect("lock").clone();
    let sorted = |part: fn(&(i64, i64)) -> i64| {
        let mut l: Vec<i64> = pairs.iter().map(part).collect();
        l.sort_unstable();
        l
    };
    let pct = |l: &[i64], p: f64| l.get(((l.len().saturating_sub(1)) as f64 * p) as usize).copied().unwrap_or(-1);
    let (total, engine) = (sorted(|p| p.0), sorted(|p| p.1));
    println!("paced: {sent} events at {offered:.0} events/s offered; {} alerts", pairs.len());
    println!(
        "detection latency (event produced -> alert on the stream, stored first): p50 {} ms, p99 {} ms, max {} ms",
        pct(&total, 0.5),
        pct(&total, 0.99),
        pct(&total, 1.0)
    );
    println!(
        "  of which event produced -> alert raised by the engine (through Kafka): p50 {} ms, p99 {} ms, max {} ms",
        pct(&engine, 0.5),
        pct(&engine, 0.99),
        pct(&engine, 1.0)
    );

    // Sustained: as fast as the producer can, then how fast the service took it in.
    let before = events_in(&url).await;
    let burst = 500_000u64;
    let t = Instant::now();
    let mut futures = Vec::with_capacity(burst as usize);
    for i in 0..burst {
        futures.push(tokio::spawn(send(sent + i)));
    }
    for f in futures {
        let _ = f.await;
    }
    while events_in(&url).await < before + burst && t.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = events_in(&url).await - before;
    println!(
        "sustained: {took} events in {:.2} s = {:.0} events/s through Kafka into the engine",
        t.elapsed().as_secs_f64(),
        took as f64 / t.elapsed().as_secs_f64()
    );
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
