//! What collectors send, sent by clients written by others: each client writes NAB's AWS
//! CloudWatch series to `vigil serve` in its own format, and the alerts stored must be those of
//! `vigil replay` over the same samples as Vigil's JSON lines. The clients run in Python, from
//! the packages of `tests/clients/requirements.txt` (scripts/test.sh installs them in a virtual
//! environment and names its interpreter in `VIGIL_TEST_PYTHON`).

use crate::support::*;
use std::collections::BTreeSet;

fn python() -> String {
    std::env::var("VIGIL_TEST_PYTHON").expect("VIGIL_TEST_PYTHON: the Python with the clients (scripts/test.sh)")
}

fn metric_rules() -> String {
    format!("{}/metrics", rules_dir())
}

/// The transitions stored in the service's SQLite store, as `id:status`.
async fn stored(db: &std::path::Path) -> BTreeSet<String> {
    let url = format!("sqlite://{}?mode=ro", db.display());
    let Ok(pool) = sqlx::SqlitePool::connect(&url).await else { return BTreeSet::new() };
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT alert_id, status FROM alert_events").fetch_all(&pool).await.unwrap_or_default();
    pool.close().await;
    rows.into_iter().map(|(id, status)| format!("{id}:{status}")).collect()
}

/// The CloudWatch series as `metric` JSON lines, and the transitions `vigil replay` of the
/// shipped metric rules gives for them.
fn workload() -> (Vec<String>, BTreeSet<String>) {
    workload_as(None, false)
}

/// [`workload`] with every sample carrying `labels` (a JSON object), which are part of each
/// series' identity and so of its alerts', and, with `kinds_by_name`, the `kind` that
/// Prometheus' formats give a series by its name (`elb_request_count` is a counter there).
fn workload_as(labels: Option<&str>, kinds_by_name: bool) -> (Vec<String>, BTreeSet<String>) {
    let labels: Option<serde_json::Value> = labels.map(|l| serde_json::from_str(l).expect("labels"));
    let lines: Vec<String> = cloudwatch_workload()
        .into_iter()
        .map(|(_, line)| {
            let mut event: serde_json::Value = serde_json::from_str(&line).expect("a line");
            if let Some(labels) = &labels {
                event["labels"] = labels.clone();
            }
            let kind = event["name"].as_str().and_then(vigil::metric_kind::by_name);
            if let Some(kind) = kind.filter(|_| kinds_by_name) {
                event["kind"] = kind.into();
            }
            event.to_string()
        })
        .collect();
    let expected: BTreeSet<String> = replay_alerts_with(&lines, &metric_rules())
        .iter()
        .map(transition)
        .map(|(id, status)| format!("{id}:{status}"))
        .collect();
    assert!(expected.len() > 20, "the series raise alerts in replay: {expected:?}");
    (lines, expected)
}

/// Runs a client script of `tests/clients` with `args`; its report (JSON on stdout).
fn client(script: &str, args: &[&str]) -> serde_json::Value {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients").join(script);
    let out = std::process::Command::new(python()).arg(&script).args(args).output().expect("the client runs");
    assert!(out.status.success(), "{} failed:\n{}", script.display(), String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("the client's report")
}

/// Waits until the store holds exactly `expected`, or fails with what is lost and extra.
async fn assert_stored(db: &std::path::Path, expected: &BTreeSet<String>, service: &Service) {
    let deadline = std::time::Instant::now() + PATIENCE;
    let mut got = stored(db).await;
    while got != *expected && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        got = stored(db).await;
    }
    let lost: Vec<_> = expected.difference(&got).collect();
    let extra: Vec<_> = got.difference(expected).collect();
    assert!(lost.is_empty() && extra.is_empty(), "lost {lost:?}, extra {extra:?}\n{}", service.log());
}

/// Produces the workload onto a topic of format `format` with `script`, and waits for the
/// alerts of replay; the service's dead letters, for the caller to look into.
async fn on_kafka(format: &str, script: &str, more: &[&str], labels: Option<&str>) -> Vec<serde_json::Value> {
    let (lines, expected) = workload_as(labels, format == "prometheus-kafka-adapter");
    let dir = temp_dir(&format!("kafka_{}", format.replace('-', "_")));
    let topic = unique("collector");
    let brokers = kafka_brokers();
    vigil::service::kafka::ensure_topics(&brokers, std::slice::from_ref(&topic), 1, &Default::default())
        .await
        .expect("topic created");
    let rules = metric_rules();
    let service = Service::start(&[
        "--rules",
        &rules,
        "--database-url",
        &sqlite_url(&dir),
        "--kafka-brokers",
        &brokers,
        "--kafka-group",
        &unique("group"),
        "--topic",
        &format!("metric={topic}"),
        "--kafka-topic-format",
        &format!("{topic}={format}"),
    ]);
    let events = dir.join("events.jsonl");
    std::fs::write(&events, lines.join("\n") + "\n").expect("events");
    let mut args = vec![brokers.as_str(), topic.as_str(), events.to_str().expect("utf-8")];
    args.extend_from_slice(more);
    let report = client(script, &args);
    let produced = report["lines"].as_u64().or(report["samples"].as_u64());
    assert_eq!(produced, Some(lines.len() as u64), "{report}");
    assert_stored(&dir.join("vigil.db"), &expected, &service).await;
    let dead = get_json(&format!("{}/api/v1/dead-letters", service.url)).await;
    std::fs::remove_dir_all(&dir).ok();
    dead["dead_letters"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
#[ignore = "needs the Python clients, Apache Kafka and ../shared/data: run scripts/test.sh"]
async fn telegraf_line_protocol_on_kafka_alerts_as_replay_does() {
    let letters = on_kafka("influx", "kafka_influx_produce.py", &[], None).await;
    // The line that does not parse is a dead letter with its line; the rest of its message is
    // taken (late, behind the watermark, so it changes no alert).
    assert!(
        letters.iter().any(|l| l["line"] == 1 && l["reason"].as_str().is_some_and(|r| r.contains("line protocol"))),
        "{letters:?}"
    );
}

#[tokio::test]
#[ignore = "needs the Python clients, Apache Kafka and ../shared/data: run scripts/test.sh"]
async fn otlp_protobuf_on_kafka_alerts_as_replay_does() {
    let letters = on_kafka("otlp-proto", "kafka_otlp_produce.py", &[], None).await;
    // The delta sum and the message that is not protobuf are dead letters saying why.
    let has = |text: &str| letters.iter().any(|l| l["reason"].as_str().is_some_and(|r| r.contains(text)));
    assert!(has("delta temporality") && has("not an ExportMetricsServiceRequest"), "{letters:?}");
}

#[tokio::test]
#[ignore = "needs the Python clients, Apache Kafka and ../shared/data: run scripts/test.sh"]
async fn telegraf_json_and_prometheus_kafka_adapter_on_kafka_alert_as_replay_does() {
    for format in ["telegraf-json", "prometheus-kafka-adapter"] {
        // Prometheus labels every series with the `job` it scraped it for.
        let labels = (format == "prometheus-kafka-adapter").then_some(r#"{"job":"node"}"#);
        let letters = on_kafka(format, "kafka_json_produce.py", &[format], labels).await;
        // Telegraf's message without a host is kept under the fleet's host, and Prometheus'
        // series without `instance` (a recording rule's) under its job's: no dead letter.
        assert!(letters.is_empty(), "{format}: {letters:?}");
    }
}

#[tokio::test]
#[ignore = "needs the Python clients and ../shared/data: run scripts/test.sh"]
async fn influxdata_client_writes_line_protocol_that_alerts_as_replay_does() {
    let (lines, expected) = workload();
    let dir = temp_dir("influx_client");
    let db = dir.join("vigil.db");
    let rules = metric_rules();
    let service =
        Service::start(&["--rules", &rules, "--database-url", &sqlite_url(&dir), "--api-token", "collector-token"]);
    let events = dir.join("events.jsonl");
    std::fs::write(&events, lines.join("\n") + "\n").expect("events");
    let report = client("influx_write.py", &[&service.url, "collector-token", events.to_str().expect("utf-8")]);
    assert_eq!(report["written"].as_u64(), Some(lines.len() as u64), "{report}");
    // A line that does not parse: refused as InfluxDB refuses a malformed write, with why.
    assert_eq!(report["malformed"]["status"], 400, "{report}");
    let message = report["malformed"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("line 1") && message.contains("line protocol"), "{report}");

    assert_stored(&db, &expected, &service).await;
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
#[ignore = "needs the Python clients and ../shared/data: run scripts/test.sh"]
async fn opentelemetry_remote_write_exporter_alerts_as_replay_does() {
    let (lines, expected) = workload_as(None, true);
    let dir = temp_dir("remote_write");
    let rules = metric_rules();
    let service =
        Service::start(&["--rules", &rules, "--database-url", &sqlite_url(&dir), "--api-token", "collector-token"]);
    let events = dir.join("events.jsonl");
    std::fs::write(&events, lines.join("\n") + "\n").expect("events");
    let report = client("remote_write.py", &[&service.url, "collector-token", events.to_str().expect("utf-8")]);
    assert_eq!(
        (report["exported"].as_u64(), report["failed"].as_u64()),
        (Some(lines.len() as u64), Some(0)),
        "{report}"
    );
    // A series without the host label is kept under a fallback host: a 400 would make the
    // exporter drop the whole batch.
    assert_eq!(report["malformed"]["success"], true, "{report}");
    assert_stored(&dir.join("vigil.db"), &expected, &service).await;
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
#[ignore = "needs the Python clients and ../shared/data: run scripts/test.sh"]
async fn opentelemetry_otlp_http_exporter_alerts_as_replay_does() {
    let (lines, expected) = workload();
    let dir = temp_dir("otlp");
    let rules = metric_rules();
    let service =
        Service::start(&["--rules", &rules, "--database-url", &sqlite_url(&dir), "--api-token", "collector-token"]);
    let events = dir.join("events.jsonl");
    std::fs::write(&events, lines.join("\n") + "\n").expect("events");
    let report = client("otlp_export.py", &[&service.url, "collector-token", events.to_str().expect("utf-8")]);
    assert_eq!(
        (report["exported"].as_u64(), report["failed"].as_u64()),
        (Some(lines.len() as u64), Some(0)),
        "{report}"
    );
    // A delta sum: taken as a request, its point refused in a partial success, as the
    // OpenTelemetry Collector answers points it drops.
    assert_eq!(report["delta"]["status"], 200, "{report}");
    assert_eq!(report["delta"]["rejected_data_points"], 1, "{report}");
    assert!(report["delta"]["error_message"].as_str().is_some_and(|m| m.contains("delta temporality")), "{report}");
    // A body that is not protobuf: 400 with a google.rpc.Status saying why (INVALID_ARGUMENT).
    assert_eq!((report["malformed"]["status"].as_u64(), report["malformed"]["code"].as_u64()), (Some(400), Some(3)));
    assert!(report["malformed"]["message"].as_str().is_some_and(|m| m.contains("ExportMetricsServiceRequest")));
    assert_stored(&dir.join("vigil.db"), &expected, &service).await;
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn a_replayed_file_places_samples_under_hosts_as_the_flags_say() {
    // `vigil serve --replay` of a line protocol file, its host tag named by `--influx-host-tag`:
    // the same mapping as `vigil replay`, Kafka topics and the HTTP receivers take.
    let dir = temp_dir("replay_hosts");
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).expect("rules folder");
    std::fs::write(rules.join("hot.saql"), "rule hot { host h report metric s as e where e.value > 90 }\n")
        .expect("rule");
    let file = dir.join("cpu.lp");
    std::fs::write(&file, "cpu,node=web-1 usage=95 1767225600000000000\ncpu,node=web-2 usage=5 1767225601000000000\n")
        .expect("lines");
    let (rules, file) = (rules.to_str().expect("utf-8"), file.to_str().expect("utf-8"));
    let replayed = std::process::Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["replay", "--rules", rules, "--influx-host-tag", "node", file])
        .output()
        .expect("replay runs");
    let expected: serde_json::Value = String::from_utf8_lossy(&replayed.stdout)
        .lines()
        .next()
        .and_then(|l| serde_json::from_str(l).ok())
        .expect("an alert from the replay");
    assert_eq!(expected["key"]["h.host"], "web-1", "{expected}");
    let service = Service::start_in(&["--rules", rules, "--replay", file, "--influx-host-tag", "node"], Some(&dir));
    let alerts = eventually("the alert of the replayed file", || async {
        let page = get_json(&format!("{}/api/v1/alerts?rule=hot", service.url)).await;
        page["alerts"].as_array().filter(|a| !a.is_empty()).cloned()
    })
    .await;
    assert_eq!(alerts[0]["id"], expected["id"], "{alerts:?}");
    assert_eq!(alerts[0]["key"]["h.host"], "web-1", "{alerts:?}");
    drop(service);
    std::fs::remove_dir_all(&dir).ok();
}
