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
        let url = format!("{url}/api/v1/events");
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut latencies = Vec::new();
            let mut n = 0u64;
            while Instant::now() < deadline {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock");
                let ts = now.as_millis() as i64 - 1_000;
                let body: String = (0..batch)
                    .map(|i| {
                        format!(
                            "{{\"stream\":\"task_usage\",\"ts\":{ts},\"job_id\":\"j{c}\",\"task_index\":{i},\"machine_id\":\"m{}\",\"cpu\":0.5}}\n",
                            i % 50
                        )
                    })
                    .collect();
                let sent = Instant::now();
                let resp = client.post(&url).body(body).send().await.expect("answers");
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
