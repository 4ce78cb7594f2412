//! Instances sharing a Kafka consumer group (`--kafka-join-group`), against a real broker
//! (Tansu) and a real PostgreSQL: three instances over a 12-partition input topic whose events
//! are produced without keys. One starts, two join mid-stream, one is killed with `kill -9` and
//! started again, one is stopped (`SIGSTOP`) past its session timeout and continued. The alerts
//! stored, and the webhook's calls, must be those of a clean `vigil replay` of the same events,
//! a fleet-wide outlier rule's included: none lost, none extra, none twice.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;
use support::*;

/// Evictions followed by failures (a sequence by task), and the CPU use of 8 machines of one
/// cluster each minute, one of them busy for two spells (a fleet-wide outlier, and spikes).
fn workload() -> Vec<String> {
    let at = |m: i64| format!("2026-01-01T{:02}:{:02}:00Z", m / 60, m % 60);
    let mut timed: Vec<(i64, String)> = Vec::new();
    for j in 0..30i64 {
        for line in evict_then_fail(&format!("job{j}"), j * 9).lines() {
            let ts = if line.contains("EVICT") { j * 9 } else { j * 9 + 4 };
            timed.push((ts * 60, line.to_string()));
        }
    }
    for minute in 0..300i64 {
        for machine in 0..8 {
            let busy = machine == 7 && ((100..130).contains(&minute) || (200..220).contains(&minute));
            let cpu = if busy { 0.95 } else { 0.1 + 0.01 * machine as f64 };
            let line = format!(
                r#"{{"stream":"task_usage","ts":"{}","job_id":"batch","task_index":{machine},"machine_id":"m{machine}","cluster":"c1","cpu":{cpu},"mem":0.2}}"#,
                at(minute)
            );
            timed.push((minute * 60 + 1, line));
        }
    }
    timed.sort_by_key(|(ts, _)| *ts);
    timed.into_iter().map(|(_, l)| l).collect()
}

/// The transitions (id, status) of `vigil replay` over the same events, and their rules.
fn replayed(lines: &[String]) -> (Vec<(String, String)>, Vec<String>) {
    let alerts = replay_alerts(lines);
    let mut all: Vec<(String, String)> = alerts.iter().map(transition).collect();
    all.sort();
    (all, alerts.iter().map(|a| a["rule"].as_str().unwrap_or("").to_string()).collect())
}

fn signal(service: &Service, sig: &str) {
    let status =
        std::process::Command::new("kill").args([sig, &service.pid().to_string()]).status().expect("kill runs");
    assert!(status.success(), "kill {sig}");
}

#[tokio::test]
#[ignore = "needs Tansu and PostgreSQL: run scripts/test.sh"]
async fn three_instances_share_a_group_through_joins_a_kill_and_a_pause() {
    let lines = workload();
    let (want, rules) = replayed(&lines);
    let outliers = rules.iter().filter(|r| *r == "machine_load_outlier").count();
    assert!(outliers > 0 && want.len() > 60, "the clean run raises outliers and sequences: {rules:?}");

    let brokers = kafka_brokers();
    let topic = unique("group_input");
    vigil::service::kafka::ensure_topics(&brokers, std::slice::from_ref(&topic), 12, &Default::default())
        .await
        .expect("input topic");
    let (db_name, db_url) = create_database().await;
    let hook = Receiver::start(0).await;
    let group = unique("group");
    let args: Vec<String> = [
        "--rules",
        &rules_dir(),
        "--database-url",
        &db_url,
        "--kafka-brokers",
        &brokers,
        "--kafka-group",
        &group,
        "--kafka-join-group",
        "--topic",
        &format!("task_event={topic}"),
        "--topic",
        &format!("task_usage={topic}"),
        "--kafka-option",
        "session.timeout.ms=6000",
        "--checkpoint-interval",
        "1s",
        "--webhook-url",
        &hook.url,
        "--webhook-timeout",
        "2s",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    let producer: rdkafka::producer::FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("message.timeout.ms", "60000")
        .create()
        .expect("producer");
    let produce = |chunk: &[String]| {
        let producer = producer.clone();
        let topic = topic.clone();
        let chunk = chunk.to_vec();
        async move {
            for line in chunk {
                let record = rdkafka::producer::FutureRecord::<(), _>::to(&topic).payload(&line);
                producer.send(record, Duration::from_secs(60)).await.expect("the broker takes the event");
            }
        }
    };

    let chunks: Vec<&[String]> = lines.chunks(lines.len() / 40 + 1).collect();
    let mut a = Service::start(&args);
    let mut others: Vec<Service> = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        produce(chunk).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        match i {
            5 => others.push(Service::start(&args)),
            8 => others.push(Service::start(&args)),
            // Killed mid-window, with no goodbye: its partitions move once the broker sees it gone.
            16 => {
                others[0].kill();
                tokio::time::sleep(Duration::from_secs(1)).await;
                others[0] = Service::start(&args);
            }
            // Paused past its session timeout: the others take its partitions; when it goes on
            // it must find them lost, and write nothing for them.
            24 => {
                signal(&others[1], "-STOP");
                tokio::time::sleep(Duration::from_secs(10)).await;
                signal(&others[1], "-CONT");
            }
            _ => {}
        }
    }

    let pool = sqlx::PgPool::connect(&db_url).await.expect("database");
    let expected: BTreeSet<String> = want.iter().map(|(id, s)| format!("{id}:{s}")).collect();
    let stored = eventually("every transition stored", || async {
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT alert_id, status FROM alert_events").fetch_all(&pool).await.ok()?;
        (rows.len() >= want.len()).then_some(rows)
    })
    .await;
    let delivered = eventually("every transition delivered", || async {
        let keys: BTreeSet<String> = hook
            .calls
            .lock()
            .expect("calls")
            .iter()
            .filter_map(|(h, _)| h.get("Idempotency-Key").and_then(|v| v.to_str().ok()).map(str::to_string))
            .collect();
        (keys.len() >= want.len()).then_some(keys)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT alert_id, status FROM alert_events").fetch_all(&pool).await.expect("rows");
    let got: Vec<String> = rows.iter().map(|(id, s)| format!("{id}:{s}")).collect();
    let distinct: BTreeSet<String> = got.iter().cloned().collect();
    let lost: Vec<&String> = expected.difference(&distinct).collect();
    let extra: Vec<&String> = distinct.difference(&expected).collect();
    let logs = || std::iter::once(&a).chain(&others).map(|s| s.log()).collect::<Vec<_>>().join("\n----\n");
    println!(
        "group-tally | 3 instances, 2 joins, 1 kill -9, 1 SIGSTOP | {} | {} | {} | {} | {} |",
        expected.len(),
        distinct.len(),
        lost.len(),
        got.len() - distinct.len(),
        delivered.len()
    );
    assert!(stored.len() >= want.len());
    assert!(lost.is_empty() && extra.is_empty(), "lost {lost:?}, extra {extra:?}\n{}", logs());
    assert_eq!(got.len(), distinct.len(), "no transition stored twice");
    let delivered_missing: Vec<&String> = expected.difference(&delivered).collect();
    assert!(delivered_missing.is_empty(), "the webhook missed {delivered_missing:?}");
    assert!(delivered.is_subset(&expected), "the webhook got transitions the clean run does not have");

    let taken: Vec<usize> = std::iter::once(&a)
        .chain(&others)
        .map(|s| s.log().lines().filter(|l| l.contains("keyed partition taken over")).count())
        .collect();
    println!("keyed partitions taken over, by instance: {taken:?}");
    assert!(taken.iter().all(|n| *n > 0), "every instance ran keyed partitions: {taken:?}");
    let all = logs();
    assert!(all.contains("keyed partition taken over"), "partitions were handed over\n{all}");
    assert!(
        all.lines().any(|l| l.contains("keyed partition taken over") && !l.contains("restored_bytes=0")),
        "a partition was restored from a checkpoint\n{all}"
    );
    let paused = others[1].log();
    assert!(
        paused.contains("lost=true") || paused.contains("another instance owns"),
        "the paused instance found its partitions lost\n{paused}"
    );
    pool.close().await;
    a.kill();
    drop(others);
    drop_database(&db_name).await;
}

#[test]
fn joining_a_group_with_sqlite_or_without_a_broker_is_refused_with_the_reason() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["serve", "--rules", &rules_dir(), "--http-addr", "127.0.0.1:0", "--kafka-join-group"])
        .args(["--database-url", "sqlite://never.db"])
        .env_remove("VIGIL_KAFKA_BROKERS")
        .env_remove("VIGIL_CONFIG")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--kafka-join-group needs PostgreSQL"), "{err}");
    assert!(err.contains("--kafka-join-group needs --kafka-brokers"), "{err}");
    assert!(!std::path::Path::new("never.db").exists(), "nothing was started");
}
