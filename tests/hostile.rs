//! The hostile-input suite: the real `vigil serve` on its defaults (SQLite, HTTP ingest, no
//! token unless a case sets one), attacked as an attacker or an unlucky operator would. Each
//! case is a row of the hostile-input table in `RELIABILITY.md`.

use crate::support::*;
use serde_json::Value as Json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A folder of rules: the given files, by name.
fn rules_with(files: &[(&str, &str)]) -> std::path::PathBuf {
    let dir = temp_dir("hostile-rules");
    for (name, text) in files {
        std::fs::write(dir.join(name), text).expect("write rule");
    }
    dir
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as i64
}

/// Posts a body and returns the status and the JSON answer.
async fn post(url: &str, body: impl Into<reqwest::Body>) -> (u16, Json) {
    let resp = reqwest::Client::new().post(url).body(body).send().await.expect("answers");
    let status = resp.status().as_u16();
    let json = resp.json().await.unwrap_or(Json::Null);
    (status, json)
}

/// Sends raw bytes on a new connection and reads the answer until the server closes it (or
/// `wait` passes); returns the answer and whether the server closed the connection.
fn raw(url: &str, request: &[u8], wait: Duration) -> (String, bool) {
    let addr = url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).expect("connects");
    stream.set_read_timeout(Some(wait)).expect("timeout");
    stream.write_all(request).expect("writes");
    let mut answer = Vec::new();
    let mut buf = [0u8; 8192];
    let closed = loop {
        match stream.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => break false,
            Err(_) => break true,
        }
    };
    (String::from_utf8_lossy(&answer).into_owned(), closed)
}

fn json_body(answer: &str) -> Json {
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or(Json::Null)
}

async fn firing_count(url: &str) -> usize {
    let page = get_json(&format!("{url}/api/v1/alerts?limit=1000")).await;
    page["alerts"].as_array().map_or(0, |a| a.len())
}

#[tokio::test]
async fn extreme_and_far_future_timestamps_are_refused_and_the_sample_still_raises_its_18_alerts() {
    let dir = temp_dir("hostile-time");
    let service = Service::start(&["--rules", &rules_dir(), "--database-url", &sqlite_url(&dir)]);
    let events = format!("{}/api/v1/events", service.url);
    let hostile = [
        r#"{"stream":"metric","ts":9223372036854775807,"host":"h","name":"cpu","value":1}"#,
        r#"{"stream":"metric","ts":-9223372036854775808,"host":"h","name":"cpu","value":1}"#,
        r#"{"stream":"metric","ts":9223372036854775806,"host":"h","name":"cpu","value":1}"#,
        r#"{"stream":"metric","ts":"9999-12-31T23:59:59Z","host":"h","name":"cpu","value":1}"#,
        // The poison behind a normal first `ts`.
        r#"{"stream":"metric","ts":"2026-01-01T00:00:00Z","host":"h","name":"cpu","value":1,"ts":"9999-12-31T00:00:00Z"}"#,
        r#"{"stream":"task_event","ts":-5,"type":"FAIL","job_id":"j","task_index":0}"#,
    ];
    let (status, answer) = post(&events, hostile.join("\n")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["accepted"], 0, "{answer}");
    assert_eq!(answer["rejected_total"], hostile.len(), "{answer}");
    for r in answer["rejected"].as_array().expect("rejected") {
        let reason = r["reason"].as_str().expect("reason");
        assert!(reason.starts_with("field `ts`:"), "{reason}");
    }
    let reasons: Vec<&str> =
        answer["rejected"].as_array().unwrap().iter().filter_map(|r| r["reason"].as_str()).collect();
    assert!(reasons[3].contains("ahead of this machine's clock"), "{reasons:?}");
    assert!(reasons[4].contains("given twice"), "{reasons:?}");
    assert!(reasons[0].contains("outside 1970-01-01 to 9999-12-31"), "{reasons:?}");

    let sample = std::fs::read_to_string("samples/datacenter.jsonl").expect("sample");
    let (status, answer) = post(&events, sample).await;
    assert_eq!((status, answer["accepted"].as_u64(), answer["late"].as_u64()), (200, Some(5993), Some(0)), "{answer}");
    let n = eventually("the sample's 17 alerts", || async {
        let n = firing_count(&service.url).await;
        (n >= 17).then_some(n)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(firing_count(&service.url).await, 17, "no more than the replay's 17 ({n})");
    let ready = reqwest::get(format!("{}/readyz", service.url)).await.expect("readyz");
    assert_eq!(ready.status().as_u16(), 200);
    let dead = get_json(&format!("{}/api/v1/dead-letters", service.url)).await;
    assert_eq!(dead["dead_letters"].as_array().map(Vec::len), Some(hostile.len()), "each refusal is a dead letter");
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn an_event_dated_ahead_of_the_clock_cannot_make_the_present_late() {
    let dir = temp_dir("hostile-ahead");
    let service = Service::start(&["--rules", &rules_dir(), "--database-url", &sqlite_url(&dir)]);
    let events = format!("{}/api/v1/events", service.url);
    let now = now_ms();
    // Four minutes ahead: inside --max-event-future (5 min), so taken, but event time waits
    // for the clock instead of jumping there.
    let ahead = format!(r#"{{"stream":"metric","ts":{},"host":"h9","name":"cpu","value":1}}"#, now + 240_000);
    let (_, answer) = post(&events, ahead).await;
    assert_eq!(answer["accepted"], 1, "{answer}");
    let job = |kind: &str, ts: i64, machine: &str| {
        format!(
            r#"{{"stream":"task_event","ts":{ts},"type":"{kind}","job_id":"now","task_index":0,"machine_id":"{machine}"}}"#
        )
    };
    let present = [job("EVICT", now - 2_000, "m1"), job("FAIL", now - 1_000, "m2")].join("\n");
    let (_, answer) = post(&events, present).await;
    assert_eq!((answer["accepted"].as_u64(), answer["late"].as_u64()), (Some(2), Some(0)), "{answer}");
    eventually("the alert of the present", || async {
        let page = get_json(&format!("{}/api/v1/alerts?rule=evicted_then_failed", service.url)).await;
        page["alerts"].as_array().filter(|a| !a.is_empty()).cloned()
    })
    .await;
    // An hour old now: taken (on disk), but late, and the answer says so.
    let (_, answer) = post(&events, job("EVICT", now - 3_600_000, "m3")).await;
    assert_eq!((answer["accepted"].as_u64(), answer["late"].as_u64()), (Some(1), Some(1)), "{answer}");
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn a_window_bomb_is_refused_by_check_and_by_the_api() {
    let dir = temp_dir("hostile-bomb");
    let service = Service::start(&["--rules", &rules_dir(), "--database-url", &sqlite_url(&dir)]);
    for window in ["#time(1 d, 1 ms)", "#time(3650 d, 1 s)"] {
        let rule = format!(
            "rule bomb {{ task t use machine m as e {window} state ss {{ n := count() }} group by m alert ss.n > 1 }}"
        );
        let resp = reqwest::Client::new()
            .put(format!("{}/api/v1/rules/bomb", service.url))
            .body(rule.clone())
            .send()
            .await
            .expect("answers");
        assert_eq!(resp.status().as_u16(), 422);
        let body: Json = resp.json().await.expect("json");
        assert_eq!(body["diagnostics"][0]["code"], "E0312", "{body}");
        let file = dir.join("bomb.saql");
        std::fs::write(&file, &rule).expect("write");
        let check = std::process::Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args(["check", file.to_str().expect("utf-8")])
            .output()
            .expect("check runs");
        assert_eq!(check.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&check.stdout).contains("error[E0312]"));
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn slow_headers_idle_connections_and_endless_bodies_are_closed() {
    let dir = temp_dir("hostile-slow");
    let service = Service::start(&[
        "--rules",
        &rules_dir(),
        "--database-url",
        &sqlite_url(&dir),
        "--http-header-timeout",
        "1s",
        "--http-body-timeout",
        "1s",
    ]);
    let url = service.url.clone();
    let started = Instant::now();
    let (answer, closed) = raw(&url, b"GET /healthz HTTP/1.1\r\nHost: x\r\n", Duration::from_secs(10));
    assert!(closed && answer.is_empty(), "headers never finished: closed without an answer ({answer:?})");
    assert!(started.elapsed() < Duration::from_secs(8));
    // A complete request, then nothing: the idle connection is closed too.
    let (answer, closed) = raw(&url, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", Duration::from_secs(10));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(closed, "an idle keep-alive connection is closed");
    // A chunked body that never ends gets 408, as JSON.
    let request = b"POST /api/v1/events HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n";
    let (answer, _) = raw(&url, request, Duration::from_secs(10));
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(json_body(&answer)["error"].as_str().is_some_and(|e| e.contains("did not arrive")), "{answer}");
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn connections_past_the_limit_are_refused_and_health_checks_come_back() {
    let dir = temp_dir("hostile-conns");
    let service = Service::start(&[
        "--rules",
        &rules_dir(),
        "--database-url",
        &sqlite_url(&dir),
        "--max-connections",
        "20",
        "--http-header-timeout",
        "2s",
    ]);
    let addr = service.url.trim_start_matches("http://").to_string();
    let idle: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(&addr).expect("connects")).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (answer, _) = raw(&service.url, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert_eq!(json_body(&answer)["error"], "too many connections; try again later");
    // The idle ones are closed after the header timeout, and the server answers again.
    eventually("health checks answered again", || async {
        let ok = reqwest::get(format!("{}/healthz", service.url)).await.is_ok_and(|r| r.status().is_success());
        ok.then_some(())
    })
    .await;
    let metrics = metrics(&service.url).await;
    assert!(metrics.contains("vigil_http_connections_refused_total"), "{metrics}");
    drop(idle);
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn every_error_answer_is_json_with_413_414_and_431_among_them() {
    let dir = temp_dir("hostile-json");
    let service = Service::start(&["--rules", &rules_dir(), "--database-url", &sqlite_url(&dir)]);
    let url = service.url.clone();
    // 413: a body over 16 MiB.
    let (status, body) = post(&format!("{url}/api/v1/events"), vec![b' '; (16 << 20) + 10]).await;
    assert_eq!(status, 413);
    assert!(body["error"].as_str().is_some_and(|e| e.contains("over")), "{body}");
    // 414: a URI longer than hyper reads.
    let long = format!("GET /api/v1/alerts?rule={} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000));
    let (answer, _) = raw(&url, long.as_bytes(), Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 414"), "{}", &answer[..answer.len().min(200)]);
    assert_eq!(json_body(&answer)["error"], "the request's URI is too long");
    // 431: headers larger than hyper reads.
    let big = format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "b".repeat(600_000));
    let (answer, _) = raw(&url, big.as_bytes(), Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 431"), "{}", &answer[..answer.len().min(200)]);
    assert_eq!(json_body(&answer)["error"], "the request's headers are too large");
    // 404, 405, and a query that does not parse.
    for (path, want) in [("/nope", 404), ("/api/v1/alerts?limit=abc", 400)] {
        let resp = reqwest::get(format!("{url}{path}")).await.expect("answers");
        assert_eq!(resp.status().as_u16(), want, "{path}");
        let body: Json = resp.json().await.expect("JSON");
        assert!(body["error"].is_string(), "{path}: {body}");
    }
    let resp = reqwest::Client::new().delete(format!("{url}/api/v1/alerts")).send().await.expect("answers");
    assert_eq!(resp.status().as_u16(), 405);
    assert!(resp.json::<Json>().await.expect("JSON")["error"].is_string());
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn a_resume_over_twelve_thousand_transitions_is_complete_while_fifty_clients_never_read() {
    let dir = temp_dir("hostile-resume");
    let rules = rules_with(&[(
        "hot.saql",
        "rule hot { task t use machine m as e where e.cpu > 0.9 alert severity warning keep_firing_for 1 d }",
    )]);
    let service = Service::start(&[
        "--rules",
        rules.to_str().expect("utf-8"),
        "--database-url",
        &sqlite_url(&dir),
        "--http-body-timeout",
        "3s",
    ]);
    let url = service.url.clone();
    // Fifty clients that open the stream and never read it.
    let addr = url.trim_start_matches("http://").to_string();
    let stuck: Vec<TcpStream> = (0..50)
        .map(|_| {
            let mut s = TcpStream::connect(&addr).expect("connects");
            s.write_all(b"GET /api/v1/alerts/stream HTTP/1.1\r\nHost: x\r\nLast-Event-ID: 0\r\n\r\n").expect("writes");
            s
        })
        .collect();
    let base = now_ms() - 60_000;
    let total = 12_000;
    for chunk in 0..(total / 2_000) {
        let lines: Vec<String> = (0..2_000)
            .map(|i| {
                let n = chunk * 2_000 + i;
                format!(
                    r#"{{"stream":"task_usage","ts":{},"job_id":"j{n}","task_index":0,"machine_id":"m1","cpu":0.95,"pad":"{}"}}"#,
                    base + n as i64,
                    "x".repeat(200)
                )
            })
            .collect();
        let (status, answer) = post(&format!("{url}/api/v1/events"), lines.join("\n")).await;
        assert_eq!((status, answer["accepted"].as_u64()), (200, Some(2_000)), "{answer}");
    }
    eventually("every transition stored", || async {
        let m = metrics(&url).await;
        m.contains(&format!("vigil_alerts_total{{rule=\"hot\",severity=\"warning\"}} {total}")).then_some(())
    })
    .await;
    let stream = SseClient::connect(&format!("{url}/api/v1/alerts/stream"), Some(0)).await;
    let got = eventually("the whole backlog", || async {
        let got = stream.received();
        (got.len() >= total).then_some(got)
    })
    .await;
    assert_eq!(got.len(), total, "no repeats");
    assert!(got.windows(2).all(|w| w[0].0 < w[1].0), "in order");
    let last = got.last().expect("some").0;
    // Live transitions go on from there, with no gap.
    let more: Vec<String> = (0..10)
        .map(|n| {
            format!(
                r#"{{"stream":"task_usage","ts":{},"job_id":"live{n}","task_index":0,"machine_id":"m1","cpu":0.99}}"#,
                base + 50_000 + n
            )
        })
        .collect();
    post(&format!("{url}/api/v1/events"), more.join("\n")).await;
    let live = eventually("the live transitions", || async {
        let got = stream.received();
        (got.len() >= total + 10).then_some(got)
    })
    .await;
    assert_eq!(live.len(), total + 10);
    assert!(live[total..]
        .iter()
        .all(|(id, a)| *id > last && a["key"]["t.job_id"].as_str().unwrap_or("").starts_with("live")));
    // The clients that never read did not hold up the writer, and are let go.
    let m = metrics(&url).await;
    let errors: Vec<&str> =
        m.lines().filter(|l| l.starts_with("vigil_store_errors_total{") && !l.ends_with(" 0")).collect();
    assert!(errors.is_empty(), "no store errors: {errors:?}");
    eventually("the stuck clients dropped", || async {
        let m = metrics(&url).await;
        let open =
            m.lines().find_map(|l| l.strip_prefix("vigil_http_connections ")).and_then(|v| v.parse::<i64>().ok());
        open.filter(|n| *n < 10).map(|_| ())
    })
    .await;
    drop(stuck);
    stream.close();
    std::fs::remove_dir_all(&dir).ok();
    std::fs::remove_dir_all(&rules).ok();
}

#[tokio::test]
async fn a_webhook_token_never_reaches_the_log_or_the_store() {
    let dir = temp_dir("hostile-secret");
    let secret = "s3cr3t-T0KEN";
    // Port 1: nothing listens, so every delivery fails and its error is logged and stored.
    let hook = format!("http://127.0.0.1:1/hook?token={secret}");
    let service = Service::start(&[
        "--rules",
        &rules_dir(),
        "--database-url",
        &sqlite_url(&dir),
        "--webhook-url",
        &hook,
        "--webhook-max-attempts",
        "2",
        "--webhook-backoff",
        "100ms",
        "--lateness",
        "0s",
    ]);
    post_events(&service.url, evict_then_fail("leak", 0)).await;
    eventually("the delivery gone dead", || async {
        let w = get_json(&format!("{}/api/v1/webhook", service.url)).await;
        (w["deliveries"]["dead"].as_i64() >= Some(1)).then_some(())
    })
    .await;
    let log = service.log();
    assert!(log.contains("webhook delivery failed"), "the failure is logged:\n{log}");
    assert!(!log.contains(secret), "the token is in the log:\n{log}");
    use sqlx::Connection;
    let mut db = sqlx::SqliteConnection::connect(&sqlite_url(&dir)).await.expect("sqlite");
    let errors: Vec<(Option<String>,)> =
        sqlx::query_as("SELECT last_error FROM webhook_outbox").fetch_all(&mut db).await.expect("rows");
    assert!(!errors.is_empty());
    for (e,) in errors {
        let e = e.unwrap_or_default();
        assert!(e.contains("cannot reach receiver") && !e.contains(secret), "{e}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_read_token_alone_is_refused_at_start_because_writes_would_stay_open() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["serve", "--rules", &rules_dir(), "--http-addr", "127.0.0.1:0", "--api-read-token", "reader"])
        .env_remove("VIGIL_API_TOKEN")
        .env_remove("VIGIL_CONFIG")
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--api-read-token is set without --api-token"), "{err}");
}

#[tokio::test]
async fn a_flood_of_bad_lines_keeps_the_dead_letters_bounded() {
    let dir = temp_dir("hostile-dead");
    let service =
        Service::start(&["--rules", &rules_dir(), "--database-url", &sqlite_url(&dir), "--max-dead-letters", "50"]);
    let body: String = (0..5_000).map(|i| format!("not json {i}\n")).collect();
    let (status, answer) = post(&format!("{}/api/v1/events", service.url), body).await;
    assert_eq!(status, 200);
    assert_eq!(answer["rejected_total"], 5_000);
    assert_eq!(answer["rejected"].as_array().map(Vec::len), Some(1_000), "the answer lists a thousand");
    let dead = eventually("the summary dead letter", || async {
        let d = get_json(&format!("{}/api/v1/dead-letters?limit=1000", service.url)).await;
        let rows = d["dead_letters"].as_array().cloned().unwrap_or_default();
        rows.iter()
            .any(|r| r["reason"].as_str().is_some_and(|s| s.contains("4900 more rejected lines")))
            .then_some(rows)
    })
    .await;
    assert!(dead.len() <= 50, "{} dead letters kept", dead.len());
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn a_flood_of_new_keys_stays_within_the_state_budget_and_says_the_rule_went_partly_blind() {
    let dir = temp_dir("hostile-keys");
    let silent = std::fs::read_to_string("rules/metrics/host_silent.saql").expect("rule");
    let rules = rules_with(&[("host_silent.saql", &silent)]);
    let service = Service::start(&[
        "--rules",
        rules.to_str().expect("utf-8"),
        "--database-url",
        &sqlite_url(&dir),
        "--max-state-mb",
        "1",
    ]);
    let base = now_ms() - 60_000;
    for chunk in 0..6 {
        let lines: Vec<String> = (0..5_000)
            .map(|i| {
                let n = chunk * 5_000 + i;
                format!(
                    r#"{{"stream":"metric","ts":{},"host":"flood{n}","name":"cpu","value":1}}"#,
                    base + n as i64 / 10
                )
            })
            .collect();
        let (status, _) = post(&format!("{}/api/v1/events", service.url), lines.join("\n")).await;
        assert_eq!(status, 200);
    }
    let alert = eventually("the self-alert", || async {
        let page = get_json(&format!("{}/api/v1/alerts?rule=vigil_state_evicted", service.url)).await;
        page["alerts"].as_array().and_then(|a| a.first().cloned())
    })
    .await;
    assert_eq!(alert["key"]["rule"], "host_silent");
    let m = metrics(&service.url).await;
    let bytes = m.lines().find_map(|l| l.strip_prefix("vigil_state_bytes ")).and_then(|v| v.parse::<f64>().ok());
    assert!(bytes.is_some_and(|b| b <= (1u64 << 20) as f64), "state over budget: {bytes:?}");
    assert!(m.contains("vigil_evicted_keys_total{reason=\"memory\",rule=\"host_silent\"}"), "{m}");
    std::fs::remove_dir_all(&dir).ok();
    std::fs::remove_dir_all(&rules).ok();
}
