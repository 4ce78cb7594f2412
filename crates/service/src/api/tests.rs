//! The handlers in process, through the router (`oneshot`), against SQLite in memory and the
//! real engine thread, ingest log and alert writer.

use super::*;
use crate::engine_loop::{channels, EngineLoop};
use crate::sources::http::HttpSource;
use axum::http::{Method, Request as HttpRequest};
use http_body_util::BodyExt;
use tower::ServiceExt;

struct App {
    router: Router,
    state: Arc<AppState>,
    dir: std::path::PathBuf,
    /// Says the service is stopping, as the shutdown signal does.
    stop: tokio::sync::watch::Sender<bool>,
}

impl Drop for App {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

async fn app(token: Option<&str>, read_token: Option<&str>) -> App {
    app_with(token, read_token, None).await
}

/// [`app`], reading its history for questions from `history`.
async fn app_with(token: Option<&str>, read_token: Option<&str>, history: Option<crate::history::Source>) -> App {
    let dir = std::env::temp_dir().join(format!("vigil-api-{}-{}", std::process::id(), fastrand::u64(..)));
    std::fs::create_dir_all(dir.join("rules")).expect("temp dir");
    std::fs::copy(
        crate::testing::repo_file("rules/evicted_then_failed.saql"),
        dir.join("rules/evicted_then_failed.saql"),
    )
    .expect("rule");
    let store = Store::connect("sqlite::memory:").await.expect("SQLite in memory");
    let telemetry = Arc::new(Telemetry::new());
    let rules = crate::rules::load(&dir.join("rules")).expect("rules").checked().expect("valid");
    let engine = vigil_engine::runtime::Runtime::new(rules.plans(), Default::default(), 2, 2);
    let (tx, rx, alerts_tx, alerts_rx) = channels();
    let engine_health = Arc::new(EngineHealth::default());
    let health = Arc::new(Health::default());
    EngineLoop {
        engine,
        telemetry: telemetry.clone(),
        health: engine_health.clone(),
        checkpoint_every: Duration::from_secs(3600),
        warm: None,
        restored: Vec::new(),
        max_state_bytes: usize::MAX,
        input_stopped_after: Duration::from_secs(300),
        source_idle_after: Duration::from_secs(10),
    }
    .spawn(rx, alerts_tx);
    let (published, _) = broadcast::channel(64);
    let spool = crate::spool::Spool::open(&dir.join("spool"), 1 << 20).expect("spool");
    tokio::spawn(crate::writer::write_alerts(
        alerts_rx,
        crate::writer::Writer {
            consumer: None,
            store: store.clone(),
            published: published.clone(),
            webhook: None,
            wake: Arc::new(Notify::new()),
            telemetry: telemetry.clone(),
            health: health.clone(),
            engine_health: engine_health.clone(),
            spool,
            ingest_log: None,
            settled: None,
        },
    ));
    let (ingest, ingest_rx) = mpsc::channel(8);
    HttpSource {
        dir: dir.join("ingest"),
        fsync: false,
        replay_from: 0,
        engine: tx.clone(),
        overload: crate::config::Overload::Backpressure,
        shed: telemetry.shed.with_label_values(&["http"]),
        telemetry: telemetry.clone(),
        catalog: rules.catalog().clone(),
    }
    .spawn(ingest_rx)
    .expect("ingest log");
    tokio::spawn(crate::engine_loop::tick(tx.clone()));
    let (dead, mut dead_rx) = mpsc::channel(64);
    tokio::spawn(async move { while dead_rx.recv().await.is_some() {} });
    let catalog = Arc::new(crate::sources::SharedCatalog::new(rules.catalog().clone()));
    let live = LiveRules::new(dir.join("rules"), &rules, tx, telemetry.clone(), catalog.clone());
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let state = Arc::new(AppState {
        store,
        ingest,
        intake: Intake {
            bounds: vigil_engine::event::TimeBounds { max_future_ms: Some(300_000), max_jump_ms: None },
            health: engine_health.clone(),
            labels: Default::default(),
            catalog,
        },
        dead,
        published,
        telemetry,
        rules: Arc::new(live),
        token: token.map(String::from),
        read_token: read_token.map(String::from),
        stop: stop_rx,
        ha: Arc::new(crate::ha::HaTracker::new(crate::ha::HaLabels {
            replica: vec!["__replica__".into()],
            cluster: "cluster".into(),
            failover: Duration::from_secs(30),
        })),
        resent: Default::default(),
        metric_families: Default::default(),
        hosts: Default::default(),
        health,
        engine_health,
        webhook_wake: Arc::new(Notify::new()),
        silences: Default::default(),
        history,
        limits: Limits {
            body_timeout: Duration::from_secs(5),
            stream_clients: Arc::new(Semaphore::new(4)),
            catch_up: Arc::new(Semaphore::new(2)),
            stall_timeout: Duration::from_secs(10),
            max_samples_per_request: 1000,
            questions: Arc::new(Semaphore::new(1)),
        },
    });
    App { router: router(state.clone()), state, dir, stop }
}

async fn call(app: &App, method: Method, uri: &str, body: &str, token: Option<&str>) -> (u16, serde_json::Value) {
    let mut request = HttpRequest::builder().method(method).uri(uri);
    if let Some(t) = token {
        request = request.header("authorization", format!("Bearer {t}"));
    }
    let request = request.body(Body::from(body.to_string())).expect("request");
    let response = app.router.clone().oneshot(request).await.expect("answers");
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
}

async fn send(app: &App, uri: &str, body: Vec<u8>, headers: &[(&str, &str)]) -> (u16, serde_json::Value) {
    let (status, _, body) = send_for_headers(app, uri, body, headers).await;
    (status, body)
}

/// [`send`], with the answer's headers.
async fn send_for_headers(
    app: &App,
    uri: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
) -> (u16, axum::http::HeaderMap, serde_json::Value) {
    let mut request = HttpRequest::builder().method(Method::POST).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = app.router.clone().oneshot(request.body(Body::from(body)).expect("request")).await.expect("answers");
    let status = response.status().as_u16();
    let answer_headers = response.headers().clone();
    let bytes = response.into_body().collect().await.expect("body").to_bytes();
    (status, answer_headers, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
}

#[tokio::test]
async fn line_protocol_is_taken_and_a_bad_line_refused_with_where_and_why() {
    let app = app(None, None).await;
    let now = vigil_engine::event::now_ms() / 1000;
    let good = format!("cpu,host=a,cpu=0 usage_user=1.5,usage_system=2i {now}\nmem,host=a used_percent=40 {now}\n");
    let (status, body) = send(&app, "/api/v2/write?org=o&bucket=b&precision=s", good.clone().into_bytes(), &[]).await;
    assert_eq!((status, &body), (204, &serde_json::Value::Null));
    let mixed = format!("cpu,host=a usage_user=1 {now}\ncpu,dc=x usage_user=2 {now}\ncpu,host=a usage_user= {now}\n");
    let (status, body) = send(&app, "/write?db=x&precision=s", mixed.into_bytes(), &[]).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["code"], "invalid");
    // The line without a host is kept under the fleet's; the one without a value is refused.
    assert_eq!((body["accepted"].as_u64(), body["rejected_total"].as_u64()), (Some(2), Some(1)));
    assert_eq!(body["rejected"][0]["line"], 3);
    assert!(body["message"].as_str().is_some_and(|m| m.contains("line 3")), "{body}");
    let request = HttpRequest::builder().uri("/metrics").body(Body::empty()).expect("request");
    let response = app.router.clone().oneshot(request).await.expect("answers");
    let metrics = response.into_body().collect().await.expect("body").to_bytes();
    let metrics = String::from_utf8_lossy(&metrics);
    for counted in [
        r#"vigil_samples_in_total{format="influx"} 5"#,
        r#"vigil_samples_rejected_total{format="influx",reason="malformed"} 1"#,
    ] {
        assert!(metrics.contains(counted), "{counted} in\n{metrics}");
    }

    let (status, body) = send(&app, "/api/v2/write?precision=fortnights", good.clone().into_bytes(), &[]).await;
    assert!(status == 400 && body["message"].as_str().is_some_and(|m| m.contains("fortnights")), "{body}");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, good.as_bytes()).expect("gzip");
    let gz = gz.finish().expect("gzip");
    let (status, _) = send(&app, "/api/v2/write?precision=s", gz, &[("content-encoding", "gzip")]).await;
    assert_eq!(status, 204);
    let (status, _) = send(&app, "/api/v2/write?precision=s", good.into_bytes(), &[("content-encoding", "br")]).await;
    assert_eq!(status, 415);
    // A gzip bomb: 65 KiB that would be 65 MiB is refused once the limit is passed.
    let mut bomb = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![b'0'; 1 << 20];
    for _ in 0..(MAX_DECOMPRESSED >> 20) + 1 {
        std::io::Write::write_all(&mut bomb, &zeros).expect("gzip");
    }
    let bomb = bomb.finish().expect("gzip");
    assert!(bomb.len() < MAX_BODY / 100);
    let (status, body) = send(&app, "/api/v2/write", bomb, &[("content-encoding", "gzip")]).await;
    assert_eq!(status, 413, "{body}");
    // More samples than a request may carry (1,000 in this app): refused whole.
    let many: String = (0..1001).map(|i| format!("m,host=a v={i} {now}\n")).collect();
    let (status, body) = send(&app, "/api/v2/write?precision=s", many.into_bytes(), &[]).await;
    assert!(status == 413 && body["message"].as_str().is_some_and(|m| m.contains("1001 samples")), "{body}");
    // A label value past its limit (2,048 bytes): the line is refused with the reason.
    let long = format!("m,host=a,path={} v=1 {now}\n", "x".repeat(3000));
    let (status, body) = send(&app, "/api/v2/write?precision=s", long.into_bytes(), &[]).await;
    assert!(status == 400 && body["message"].as_str().is_some_and(|m| m.contains("3000 bytes")), "{body}");
}

#[tokio::test]
async fn remote_write_is_taken_and_answered_as_the_specification_says() {
    use vigil_formats::remote_write::{Label, Sample, TimeSeries, WriteRequest, STALE_NAN};
    let app = app(None, None).await;
    let now = vigil_engine::event::now_ms();
    let series = |labels: &[(&str, &str)], samples: &[f64]| TimeSeries {
        labels: labels.iter().map(|(n, v)| Label { name: n.to_string(), value: v.to_string() }).collect(),
        samples: samples
            .iter()
            .enumerate()
            .map(|(i, v)| Sample { value: *v, timestamp: now - 1000 + i as i64 })
            .collect(),
    };
    let body = |request: &WriteRequest| {
        snap::raw::Encoder::new().compress_vec(&prost::Message::encode_to_vec(request)).expect("snappy")
    };
    let headers = [("content-type", "application/x-protobuf"), ("content-encoding", "snappy")];
    let good = WriteRequest {
        timeseries: vec![series(
            &[("__name__", "node_load1"), ("instance", "web-1:9100"), ("job", "node")],
            &[0.5, f64::from_bits(STALE_NAN)],
        )],
        metadata: Vec::new(),
    };
    assert_eq!(send(&app, "/api/v1/write", body(&good), &headers).await, (204, serde_json::Value::Null));
    // Prometheus sends the types of metric families in requests of their own: remembered.
    let metadata = WriteRequest {
        timeseries: Vec::new(),
        metadata: vec![vigil_formats::remote_write::MetricMetadata {
            r#type: 2,
            metric_family_name: "queue_total".into(),
            unit: String::new(),
        }],
    };
    assert_eq!(send(&app, "/api/v1/write", body(&metadata), &headers).await, (204, serde_json::Value::Null));
    assert_eq!(app.state.metric_families.kind_of("queue_total"), Some("gauge"));
    // A recording rule's series has no `instance`: taken under its job, never refused (a
    // refusal makes Prometheus drop the whole batch).
    let recorded = WriteRequest {
        timeseries: vec![
            series(&[("__name__", "job:node_cpu_seconds:rate1m"), ("job", "node")], &[1.0]),
            series(&[("__name__", "node_load5"), ("instance", "web-1:9100")], &[0.5]),
        ],
        metadata: Vec::new(),
    };
    assert_eq!(send(&app, "/api/v1/write", body(&recorded), &headers).await, (204, serde_json::Value::Null));
    // A series without a name is refused; the request's good series are kept.
    let mixed = WriteRequest {
        timeseries: vec![
            series(&[("job", "node")], &[1.0]),
            series(&[("__name__", "node_load15"), ("instance", "web-1:9100")], &[0.5]),
        ],
        metadata: Vec::new(),
    };
    let (status, answer) = send(&app, "/api/v1/write", body(&mixed), &headers).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!((answer["accepted"].as_u64(), answer["rejected"][0]["series"].as_u64()), (Some(1), Some(1)), "{answer}");
    assert!(answer["error"].as_str().is_some_and(|e| e.contains("no metric name")), "{answer}");
    // An HA pair: the first replica heard is taken, the other's samples dropped (answered 204:
    // the sender must not resend them).
    let replica = |r: &str| WriteRequest {
        timeseries: vec![series(
            &[("__name__", "up"), ("instance", "db-1:9100"), ("cluster", "eu"), ("__replica__", r)],
            &[1.0],
        )],
        metadata: Vec::new(),
    };
    assert_eq!(send(&app, "/api/v1/write", body(&replica("a")), &headers).await.0, 204);
    assert_eq!(send(&app, "/api/v1/write", body(&replica("b")), &headers).await.0, 204);
    assert_eq!(send(&app, "/api/v1/write", body(&replica("a")), &headers).await.0, 204);
    assert_eq!(app.state.telemetry.samples.ha_dropped.get(), 1, "replica b's one sample");
    // A batch sent again (its answer lost) is taken once.
    assert_eq!(send(&app, "/api/v1/write", body(&good), &headers).await.0, 204);
    assert_eq!(app.state.telemetry.samples.resent.get(), 2, "replica a's sample sent twice above, and node_load1's");
    let (status, _) = send(&app, "/api/v1/write", b"garbage".to_vec(), &headers).await;
    assert_eq!(status, 400);
    let other = [("content-type", "application/x-protobuf;proto=io.prometheus.write.v3.Request")];
    let (status, answer) = send(&app, "/api/v1/write", body(&good), &other).await;
    assert!(status == 415 && answer["error"].as_str().is_some_and(|e| e.contains("v2.Request")), "{answer}");
    assert_eq!(send(&app, "/api/v1/write", body(&good), &[("content-type", "application/json")]).await.0, 415);
}

#[tokio::test]
async fn a_stopping_service_answers_its_senders_503_with_retry_after() {
    let app = app(None, None).await;
    let _ = app.stop.send(true);
    let headers = [("content-type", "application/x-protobuf"), ("content-encoding", "snappy")];
    let (status, answer, _) = send_for_headers(&app, "/api/v1/write", b"any body".to_vec(), &headers).await;
    assert_eq!(status, 503, "remote-write");
    assert_eq!(answer.get("retry-after").map(|v| v.as_bytes()), Some(&b"1"[..]), "Prometheus waits, then resends");
    let (status, answer, _) = send_for_headers(&app, "/api/v1/events", b"{}".to_vec(), &[]).await;
    assert_eq!((status, answer.contains_key("retry-after")), (503, true), "JSON lines");
    let (status, answer, _) = send_for_headers(&app, "/write?db=x", b"m,host=a v=1".to_vec(), &[]).await;
    assert_eq!((status, answer.contains_key("retry-after")), (503, true), "line protocol");
    for content_type in ["application/x-protobuf", "application/json"] {
        let headers = [("content-type", content_type)];
        let (status, answer, _) = send_for_headers(&app, "/v1/metrics", b"{}".to_vec(), &headers).await;
        assert_eq!((status, answer.contains_key("retry-after")), (503, true), "OTLP, {content_type}");
    }
}

#[tokio::test]
async fn remote_write_2_is_read_on_the_same_path_and_says_what_it_wrote() {
    use vigil_formats::remote_write::v2::{Histogram, Request, Series};
    use vigil_formats::remote_write::Sample;
    let app = app(None, None).await;
    let now = vigil_engine::event::now_ms();
    let symbols = ["", "__name__", "rpc_seconds", "instance", "web-1:9100", "up", "job"];
    let request = Request {
        symbols: symbols.iter().map(|s| s.to_string()).collect(),
        timeseries: vec![
            Series {
                labels_refs: vec![1, 2, 3, 4],
                samples: vec![Sample { value: 0.5, timestamp: now }, Sample { value: 0.7, timestamp: now + 1 }],
                histograms: vec![Histogram {
                    count_int: Some(3),
                    sum: 1.5,
                    positive_deltas: vec![3],
                    timestamp: now,
                    ..Default::default()
                }],
                ..Default::default()
            },
            // No name: refused, and the request's other series still written.
            Series {
                labels_refs: vec![6, 5],
                samples: vec![Sample { value: 1.0, timestamp: now }],
                ..Default::default()
            },
        ],
    };
    let body = snap::raw::Encoder::new().compress_vec(&prost::Message::encode_to_vec(&request)).expect("snappy");
    let headers = [
        ("content-type", "application/x-protobuf;proto=io.prometheus.write.v2.Request"),
        ("content-encoding", "snappy"),
    ];
    let (status, written, answer) = send_for_headers(&app, "/api/v1/write", body, &headers).await;
    assert_eq!(status, 400, "{answer}");
    let header = |name: &str| written.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    assert_eq!(header("x-prometheus-remote-write-samples-written"), "2");
    assert_eq!(header("x-prometheus-remote-write-histograms-written"), "1");
    assert_eq!(header("x-prometheus-remote-write-exemplars-written"), "0");
    assert_eq!(answer["accepted"], 4, "two samples, and the histogram's count and sum: {answer}");
    assert!(answer["error"].as_str().is_some_and(|e| e.contains("no metric name")), "{answer}");
    // Only the good series: all written, 204. With an exemplar, which is taken and not kept:
    // still 204, and counted written (the compliance suite asks every one to be).
    let mut good = request.clone();
    good.timeseries.truncate(1);
    let encode =
        |r: &Request| snap::raw::Encoder::new().compress_vec(&prost::Message::encode_to_vec(r)).expect("snappy");
    assert_eq!(send_for_headers(&app, "/api/v1/write", encode(&good), &headers).await.0, 204);
    good.timeseries[0].exemplars.push(vigil_formats::remote_write::v2::Exemplar {
        labels_refs: vec![],
        value: 1.0,
        timestamp: now,
    });
    let (status, written, _) = send_for_headers(&app, "/api/v1/write", encode(&good), &headers).await;
    assert_eq!(status, 204);
    assert_eq!(written.get("x-prometheus-remote-write-samples-written").map(|v| v.as_bytes()), Some(&b"2"[..]));
    assert_eq!(written.get("x-prometheus-remote-write-exemplars-written").map(|v| v.as_bytes()), Some(&b"1"[..]));
    // A histogram whose buckets do not add up to its count is refused, as Prometheus refuses it.
    good.timeseries[0].histograms[0].count_int = Some(99);
    let (status, _, answer) = send_for_headers(&app, "/api/v1/write", encode(&good), &headers).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"].as_str().is_some_and(|e| e.contains("observations in its buckets")), "{answer}");
}

#[tokio::test]
async fn otlp_json_is_taken_and_what_is_refused_is_a_partial_success_with_the_reason() {
    let app = app(None, None).await;
    let ns = |ms: i64| (ms * 1_000_000).to_string();
    let now = vigil_engine::event::now_ms();
    let request = serde_json::json!({"resourceMetrics": [
        {"resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "web-1"}}]},
         "scopeMetrics": [{"metrics": [
            {"name": "load", "gauge": {"dataPoints": [
                {"timeUnixNano": ns(now - 1000), "asDouble": 0.5},
                {"timeUnixNano": ns(now + 86_400_000), "asDouble": 0.7}]}},
            {"name": "bytes", "sum": {"aggregationTemporality": 1, "isMonotonic": true, "dataPoints": [
                {"timeUnixNano": ns(now), "asInt": "10"}]}}]}]},
        {"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "api"}}]},
         "scopeMetrics": [{"metrics": [{"name": "up", "gauge": {"dataPoints": [{"timeUnixNano": ns(now), "asInt": 1}]}}]}]}
    ]});
    let json = [("content-type", "application/json")];
    let (status, answer) = send(&app, "/v1/metrics", request.to_string().into_bytes(), &json).await;
    assert_eq!(status, 200, "{answer}");
    let partial = &answer["partialSuccess"];
    assert_eq!(partial["rejectedDataPoints"], "2", "a delta sum, one a day ahead: {answer}");
    assert!(partial["errorMessage"].as_str().is_some_and(|m| m.contains("delta temporality")), "{answer}");
    let all_taken = serde_json::json!({"resourceMetrics": [request["resourceMetrics"][0].clone()]});
    let mut only_now = all_taken.clone();
    only_now["resourceMetrics"][0]["scopeMetrics"][0]["metrics"] =
        serde_json::json!([{"name": "load", "gauge": {"dataPoints": [{"timeUnixNano": ns(now), "asDouble": 0.5}]}}]);
    assert_eq!(send(&app, "/v1/metrics", only_now.to_string().into_bytes(), &json).await, (200, serde_json::json!({})));
    let (status, answer) = send(&app, "/v1/metrics", b"{\"resourceMetrics\": 7}".to_vec(), &json).await;
    assert!(status == 400 && answer["code"] == 3, "{answer}");
    assert!(answer["message"].as_str().is_some_and(|m| m.contains("line 1, column")), "{answer}");
    let (status, _) = send(&app, "/v1/metrics", b"a=b".to_vec(), &[("content-type", "text/plain")]).await;
    assert_eq!(status, 415);
    let request = HttpRequest::builder().uri("/metrics").body(Body::empty()).expect("request");
    let response = app.router.clone().oneshot(request).await.expect("answers");
    let metrics = response.into_body().collect().await.expect("body").to_bytes();
    let metrics = String::from_utf8_lossy(&metrics);
    for counted in [
        // `up` has no host.name: kept under the fleet's host.
        r#"vigil_samples_in_total{format="otlp"} 3"#,
        r#"vigil_samples_rejected_total{format="otlp",reason="delta"} 1"#,
        r#"vigil_samples_rejected_total{format="otlp",reason="time_bounds"} 1"#,
    ] {
        assert!(metrics.contains(counted), "{counted} in\n{metrics}");
    }
}

#[tokio::test]
async fn line_protocol_senders_give_the_token_as_they_are_configured_to() {
    let app = app(Some("s3cret"), None).await;
    let line = || b"cpu,host=a v=1".to_vec();
    use base64::Engine;
    let basic = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("telegraf:s3cret"));
    assert_eq!(send(&app, "/api/v2/write", line(), &[]).await.0, 401);
    assert_eq!(send(&app, "/api/v2/write", line(), &[("authorization", "Token wrong")]).await.0, 401);
    assert_eq!(send(&app, "/api/v2/write", line(), &[("authorization", "Token s3cret")]).await.0, 204);
    assert_eq!(send(&app, "/api/v2/write", line(), &[("authorization", "Bearer s3cret")]).await.0, 204);
    assert_eq!(send(&app, "/write", line(), &[("authorization", &basic)]).await.0, 204);
    assert_eq!(send(&app, "/write?db=x&u=telegraf&p=s3cret", line(), &[]).await.0, 204);
    assert_eq!(send(&app, "/write?db=x&u=telegraf&p=nope", line(), &[]).await.0, 401);
}

#[tokio::test]
async fn every_error_is_json_with_what_was_wrong() {
    let app = app(None, None).await;
    let (status, body) = call(&app, Method::GET, "/api/v1/alerts?limit=abc", "", None).await;
    assert_eq!(status, 400);
    assert!(body["error"].as_str().is_some_and(|e| e.contains("limit")), "{body}");
    let (status, body) = call(&app, Method::GET, "/api/v1/alerts?status=maybe", "", None).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("`status`: `maybe` is not firing or resolved")));
    let (status, body) = call(&app, Method::GET, "/nope", "", None).await;
    assert_eq!(status, 404);
    assert!(body["error"].is_string());
    let (status, body) = call(&app, Method::DELETE, "/api/v1/alerts", "", None).await;
    assert_eq!(status, 405);
    assert!(body["error"].is_string());
    let (status, body) = call(&app, Method::GET, "/api/v1/alerts/nope", "", None).await;
    assert_eq!((status, body["error"].as_str()), (404, Some("no alert `nope`")));
}

#[tokio::test]
async fn ingest_answers_once_the_engine_took_the_events_and_the_alert_is_listed() {
    let app = app(None, None).await;
    let lines = concat!(
        r#"{"stream":"task_event","ts":"2026-01-01T00:00:00Z","type":"EVICT","job_id":"j","task_index":0,"machine_id":"m1"}"#,
        "\n",
        r#"{"stream":"task_event","ts":"2026-01-01T00:04:00Z","type":"FAIL","job_id":"j","task_index":0,"machine_id":"m2"}"#,
        "\nnot json\n",
    );
    let (status, body) = call(&app, Method::POST, "/api/v1/events", lines, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["accepted"].as_u64(), body["late"].as_u64(), body["rejected_total"].as_u64()),
        (Some(2), Some(0), Some(1))
    );
    assert_eq!(body["rejected"][0]["line"], 3);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, page) = call(&app, Method::GET, "/api/v1/alerts?rule=evicted_then_failed", "", None).await;
        if page["alerts"].as_array().is_some_and(|a| !a.is_empty()) {
            assert_eq!(page["alerts"][0]["key"]["t.job_id"], "j");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the alert was not stored");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn rules_are_listed_validated_and_changed_through_the_router() {
    let app = app(Some("w"), Some("r")).await;
    let (status, _) = call(&app, Method::GET, "/api/v1/rules", "", None).await;
    assert_eq!(status, 401);
    let (status, body) = call(&app, Method::GET, "/api/v1/rules", "", Some("r")).await;
    assert_eq!(status, 200);
    assert_eq!(body["rules"][0]["name"], "evicted_then_failed");
    let (status, body) =
        call(&app, Method::POST, "/api/v1/rules/validate", "rule x { task t fial as e }", Some("r")).await;
    assert_eq!((status, body["valid"].as_bool()), (200, Some(false)));
    assert_eq!(body["diagnostics"][0]["code"], "E0102");
    assert_eq!(
        (body["diagnostics"][0]["line"].as_u64(), body["diagnostics"][0]["column"].as_u64()),
        (Some(1), Some(17))
    );
    let (status, _) =
        call(&app, Method::PUT, "/api/v1/rules/kills", "rule kills { task t kill as e }", Some("r")).await;
    assert_eq!(status, 401, "the read token does not write");
    let (status, body) =
        call(&app, Method::PUT, "/api/v1/rules/kills", "rule kills { task t kil as e }", Some("w")).await;
    assert_eq!((status, body["diagnostics"][0]["code"].as_str()), (422, Some("E0102")));
    let (status, body) =
        call(&app, Method::PUT, "/api/v1/rules/kills", "rule kills { task t kill as e }", Some("w")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["kept_state"], serde_json::json!(["evicted_then_failed"]));
    let (status, body) = call(&app, Method::DELETE, "/api/v1/rules/kills", "", Some("w")).await;
    assert_eq!((status, body["deleted"].as_str()), (200, Some("kills")));
    let (status, _) = call(&app, Method::DELETE, "/api/v1/rules/kills", "", Some("w")).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn readiness_reports_the_store_and_the_engine() {
    let app = app(None, None).await;
    let (status, body) = call(&app, Method::GET, "/readyz", "", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ready"], true);
    assert_eq!(body["engine"]["stalled_seconds"], 0);
}

#[tokio::test]
async fn the_console_is_served_with_its_assets_and_a_strict_policy_even_when_tokens_are_set() {
    let app = app(Some("w"), Some("r")).await;
    let get = |uri: &'static str| {
        let router = app.router.clone();
        async move {
            let request = HttpRequest::builder().uri(uri).body(Body::empty()).expect("request");
            let response = router.oneshot(request).await.expect("answers");
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let bytes = response.into_body().collect().await.expect("body").to_bytes();
            (status, headers, String::from_utf8_lossy(&bytes).into_owned())
        }
    };
    let (status, headers, body) = get("/").await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    assert!(headers["content-security-policy"].to_str().expect("ascii").contains("script-src 'self'"));
    assert!(body.contains("/console/app.js") && body.contains("/console/uPlot.iife.min.js"), "{body}");
    for (asset, kind) in [
        ("/console/app.js", "text/javascript"),
        ("/console/app.css", "text/css"),
        ("/console/uPlot.iife.min.js", "text/javascript"),
        ("/console/uPlot.min.css", "text/css"),
    ] {
        let (status, headers, body) = get(asset).await;
        assert_eq!(status, 200, "{asset}");
        assert!(headers["content-type"].to_str().expect("ascii").starts_with(kind), "{asset}");
        assert!(body.len() > 1000, "{asset} is {} bytes", body.len());
    }
    let (status, _, body) = get("/console/secrets.txt").await;
    assert_eq!(status, 404, "{body}");
    // The data behind the page still needs the token.
    let (status, _, _) = get("/api/v1/alerts").await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn a_declared_stream_is_taken_once_declared_and_kept_while_a_rule_reads_it() {
    let app = app(None, None).await;
    let event = |minute: u32, node: &str, reason: &str| {
        format!(
            r#"{{"stream":"k8s_event","ts":"2026-01-01T00:0{minute}:00Z","namespace":"shop","pod":"cart","node":"{node}","reason":"{reason}"}}"#
        )
    };
    let (status, body) = call(&app, Method::POST, "/api/v1/events", &event(0, "n1", "Evicted"), None).await;
    assert_eq!((status, body["rejected_total"].as_u64()), (200, Some(1)), "{body}");
    assert!(body["rejected"][0]["reason"].as_str().is_some_and(|r| r.contains("unknown stream `k8s_event`")), "{body}");
    // A rule's file may declare the stream it reads.
    let streams = std::fs::read_to_string(crate::testing::repo_file("rules/k8s/streams.saql")).expect("streams");
    let rule =
        std::fs::read_to_string(crate::testing::repo_file("rules/k8s/pod_evicted_then_failed.saql")).expect("rule");
    let text = format!("{streams}\n{rule}");
    let (status, body) = call(&app, Method::PUT, "/api/v1/rules/pod_evicted_then_failed", &text, None).await;
    assert_eq!(status, 200, "{body}");
    // A rule over it checks as one more file of the set, and so does the file declaring it.
    let (_, body) =
        call(&app, Method::POST, "/api/v1/rules/validate", "rule evictions { pod p evict as e }", None).await;
    assert_eq!(body["valid"], true, "{body}");
    let (_, body) = call(&app, Method::POST, "/api/v1/rules/validate", &text, None).await;
    assert_eq!(body["valid"], true, "{body}");
    let (_, body) = call(&app, Method::GET, "/api/v1/rules/pod_evicted_then_failed", "", None).await;
    assert!(body["explain"].as_str().is_some_and(|e| e.contains("k8s_event")), "{body}");
    let (_, listed) = call(&app, Method::GET, "/api/v1/streams", "", None).await;
    let k8s = listed["streams"].as_array().and_then(|s| s.iter().find(|s| s["name"] == "k8s_event")).expect("listed");
    assert_eq!((k8s["built_in"].as_bool(), k8s["operation"].as_str()), (Some(false), Some("reason")));
    let evict = serde_json::json!({ "pattern": "pod evict [node]", "value": "Evicted" });
    assert!(k8s["operations"].as_array().is_some_and(|o| o.contains(&evict)), "{k8s}");
    assert_eq!(k8s["fields"][0], serde_json::json!({ "name": "namespace", "type": "string", "required": true }));
    let lines = format!("{}\n{}\n", event(0, "n1", "Evicted"), event(4, "n2", "Failed"));
    let (status, body) = call(&app, Method::POST, "/api/v1/events", &lines, None).await;
    assert_eq!((status, body["accepted"].as_u64()), (200, Some(2)), "{body}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, page) = call(&app, Method::GET, "/api/v1/alerts?rule=pod_evicted_then_failed", "", None).await;
        if page["alerts"].as_array().is_some_and(|a| !a.is_empty()) {
            assert_eq!(page["alerts"][0]["values"]["evicted_from"], "n1");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the alert was not stored");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The same rule without the declaration it reads: refused, naming the rule.
    let (status, body) = call(&app, Method::PUT, "/api/v1/rules/pod_evicted_then_failed", &rule, None).await;
    assert_eq!(status, 422, "{body}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(error.contains("E0405") && error.contains("removes stream `k8s_event`"), "{body}");
    assert!(error.contains("rule pod_evicted_then_failed reads"), "{body}");
}

#[tokio::test]
async fn a_question_is_refused_with_its_reason_before_any_history_is_read() {
    let without = app(None, None).await;
    let (status, body) =
        call(&without, Method::GET, "/api/v1/rules/evicted_then_failed/why?from=now-1h&to=now", "", None).await;
    assert_eq!(status, 409, "{body}");
    assert!(body["error"].as_str().unwrap_or_default().contains("--warm-from-prometheus"), "{body}");
    // A Prometheus nothing listens at: each refusal below comes before it would be asked.
    let auth = crate::history::Auth::of(None, None, None);
    let down = crate::history::Prometheus::new("http://127.0.0.1:9", auth, Default::default(), Duration::from_secs(1))
        .expect("a client");
    let source = crate::history::Source {
        prometheus: down,
        selector: r#"{job="node"}"#.into(),
        lookback: Duration::from_secs(3600),
        hosts: Default::default(),
    };
    let app = app_with(None, None, Some(source)).await;
    for (uri, status, reason) in [
        ("/api/v1/rules/evicted_then_failed/why?from=yesterday&to=now", 400, "from: `yesterday` is not a time"),
        ("/api/v1/rules/evicted_then_failed/why?from=now&to=now-1h", 400, "`to` is before `from`"),
        ("/api/v1/rules/evicted_then_failed/why?from=now-1h&to=now&lookback=soon", 400, "lookback:"),
        ("/api/v1/rules/no_such_rule/why?from=now-1h&to=now", 404, "no rule `no_such_rule`"),
    ] {
        let (got, body) = call(&app, Method::GET, uri, "", None).await;
        assert_eq!(got, status, "{uri}: {body}");
        assert!(body["error"].as_str().unwrap_or_default().contains(reason), "{uri}: {body}");
    }
}
