//! What collectors send, sent by clients written by others: each client writes NAB's AWS
//! CloudWatch series to `vigil serve` in its own format, and the alerts stored must be those of
//! `vigil replay` over the same samples as Vigil's JSON lines. The clients run in Python, from
//! the packages of `tests/clients/requirements.txt` (scripts/test.sh installs them in a virtual
//! environment and names its interpreter in `VIGIL_TEST_PYTHON`).

mod support;

use std::collections::BTreeSet;
use support::*;

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

#[tokio::test]
#[ignore = "needs the Python clients and ../shared/data: run scripts/test.sh"]
async fn influxdata_client_writes_line_protocol_that_alerts_as_replay_does() {
    let lines: Vec<String> = cloudwatch_workload().into_iter().map(|(_, line)| line).collect();
    let expected: BTreeSet<String> = replay_alerts_with(&lines, &metric_rules())
        .iter()
        .map(transition)
        .map(|(id, status)| format!("{id}:{status}"))
        .collect();
    assert!(expected.len() > 20, "the series raise alerts in replay: {expected:?}");

    let dir = temp_dir("influx_client");
    let db = dir.join("vigil.db");
    let rules = metric_rules();
    let service =
        Service::start(&["--rules", &rules, "--database-url", &sqlite_url(&dir), "--api-token", "collector-token"]);
    let events = dir.join("events.jsonl");
    std::fs::write(&events, lines.join("\n") + "\n").expect("events");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/influx_write.py");
    let out = std::process::Command::new(python())
        .arg(&script)
        .args([&service.url, "collector-token", events.to_str().expect("utf-8")])
        .output()
        .expect("the client runs");
    assert!(out.status.success(), "the client failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the client's report");
    assert_eq!(report["written"].as_u64(), Some(lines.len() as u64), "{report}");
    // A line without the host tag: refused as InfluxDB refuses a malformed write, with why.
    assert_eq!(report["malformed"]["status"], 400, "{report}");
    let message = report["malformed"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("line 1") && message.contains("`host`"), "{report}");

    let deadline = std::time::Instant::now() + PATIENCE;
    let mut got = stored(&db).await;
    while got != expected && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        got = stored(&db).await;
    }
    let lost: Vec<_> = expected.difference(&got).collect();
    let extra: Vec<_> = got.difference(&expected).collect();
    assert!(lost.is_empty() && extra.is_empty(), "lost {lost:?}, extra {extra:?}\n{}", service.log());
    std::fs::remove_dir_all(&dir).ok();
}
