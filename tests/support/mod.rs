//! Helpers for end-to-end tests: the real `vigil` binary, a webhook receiver, an SSE client,
//! fresh PostgreSQL databases and Kafka topics.

#![allow(dead_code)]

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::Router;
use serde_json::Value as Json;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a test waits for something to happen before it fails.
pub const PATIENCE: Duration = Duration::from_secs(60);

pub fn unique(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("{prefix}_{}_{}_{nanos}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// A running `vigil serve`, stopped when dropped.
pub struct Service {
    child: Child,
    pub url: String,
    pub stderr: Arc<Mutex<Vec<String>>>,
}

impl Service {
    pub fn start(args: &[&str]) -> Service {
        Service::start_in(args, None)
    }

    pub fn start_in(args: &[&str], dir: Option<&std::path::Path>) -> Service {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vigil"));
        cmd.arg("serve").args(["--http-addr", "127.0.0.1:0"]).args(args);
        cmd.env("VIGIL_LOG", "info").stdout(Stdio::null()).stderr(Stdio::piped());
        for var in [
            "VIGIL_RULES",
            "VIGIL_DATABASE_URL",
            "VIGIL_KAFKA_BROKERS",
            "VIGIL_WEBHOOK_URL",
            "VIGIL_API_TOKEN",
            "VIGIL_CONFIG",
        ] {
            cmd.env_remove(var);
        }
        if let Some(d) = dir {
            cmd.current_dir(d);
        }
        let mut child = cmd.spawn().expect("vigil starts");
        let stderr = child.stderr.take().expect("piped");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let keep = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("vigil: listening on ") {
                    let _ = tx.send(url.to_string());
                }
                keep.lock().expect("log lock").push(line);
            }
        });
        let url = match rx.recv_timeout(PATIENCE) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                panic!("vigil did not start:\n{}", lines.lock().expect("log lock").join("\n"));
            }
        };
        Service { child, url, stderr: lines }
    }

    pub fn log(&self) -> String {
        self.stderr.lock().expect("log lock").join("\n")
    }

    /// Stops the process the hard way.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("---- vigil serve log ({}):\n{}", self.url, self.log());
        }
    }
}

/// Polls `check` until it returns `Some`, or fails the test after [`PATIENCE`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A webhook receiver: records every call; answers 500 to the first `fail_first` calls.
pub struct Receiver {
    pub url: String,
    pub calls: Arc<Mutex<Vec<(HeaderMap, Json)>>>,
}

#[derive(Clone)]
struct ReceiverState {
    calls: Arc<Mutex<Vec<(HeaderMap, Json)>>>,
    fail_first: Arc<AtomicUsize>,
}

async fn receive(State(s): State<ReceiverState>, headers: HeaderMap, body: String) -> axum::http::StatusCode {
    if s.fail_first.load(Ordering::SeqCst) > 0 {
        s.fail_first.fetch_sub(1, Ordering::SeqCst);
        return axum::http::StatusCode::INTERNAL_SERVER_ERROR;
    }
    let json: Json = serde_json::from_str(&body).unwrap_or(Json::Null);
    s.calls.lock().expect("calls lock").push((headers, json));
    axum::http::StatusCode::OK
}

impl Receiver {
    pub async fn start(fail_first: usize) -> Receiver {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let state = ReceiverState { calls: calls.clone(), fail_first: Arc::new(AtomicUsize::new(fail_first)) };
        let app = Router::new().route("/hook", post(receive)).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, app).await.expect("receiver runs") });
        Receiver { url, calls }
    }

    pub fn bodies(&self) -> Vec<Json> {
        self.calls.lock().expect("calls lock").iter().map(|(_, b)| b.clone()).collect()
    }
}

/// A server-sent-events client that collects `(id, alert)` pairs on a background task.
pub struct SseClient {
    pub events: Arc<Mutex<Vec<(i64, Json)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl SseClient {
    pub async fn connect(url: &str, last_event_id: Option<i64>) -> SseClient {
        let client = reqwest::Client::new();
        let mut req = client.get(url);
        if let Some(id) = last_event_id {
            req = req.header("Last-Event-ID", id.to_string());
        }
        let mut resp = req.send().await.expect("stream connects");
        assert!(resp.status().is_success(), "stream answered {}", resp.status());
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let task = tokio::spawn(async move {
            let mut buf = String::new();
            while let Ok(Some(chunk)) = resp.chunk().await {
                buf.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = buf.find("\n\n") {
                    let frame: String = buf.drain(..end + 2).collect();
                    let mut id = None;
                    let mut data = String::new();
                    for line in frame.lines() {
                        if let Some(v) = line.strip_prefix("id:") {
                            id = v.trim().parse::<i64>().ok();
                        } else if let Some(v) = line.strip_prefix("data:") {
                            data.push_str(v.trim_start());
                        }
                    }
                    if let (Some(id), Ok(json)) = (id, serde_json::from_str::<Json>(&data)) {
                        sink.lock().expect("events lock").push((id, json));
                    }
                }
            }
        });
        SseClient { events, task }
    }

    pub fn received(&self) -> Vec<(i64, Json)> {
        self.events.lock().expect("events lock").clone()
    }

    pub fn close(self) {
        self.task.abort();
    }
}

pub fn evict_then_fail(job: &str, minute: i64) -> String {
    let at = |m: i64| format!("2026-01-01T{:02}:{:02}:00Z", m / 60, m % 60);
    format!(
        "{{\"stream\":\"task_event\",\"ts\":\"{}\",\"type\":\"EVICT\",\"job_id\":\"{job}\",\"task_index\":0,\"machine_id\":\"m1\"}}\n\
         {{\"stream\":\"task_event\",\"ts\":\"{}\",\"type\":\"FAIL\",\"job_id\":\"{job}\",\"task_index\":0,\"machine_id\":\"m2\"}}\n",
        at(minute),
        at(minute + 4)
    )
}

pub async fn post_events(base: &str, body: String) -> Json {
    let resp =
        reqwest::Client::new().post(format!("{base}/api/v1/events")).body(body).send().await.expect("ingest answers");
    assert!(resp.status().is_success(), "ingest answered {}", resp.status());
    resp.json().await.expect("ingest JSON")
}

pub async fn get_json(url: &str) -> Json {
    reqwest::get(url).await.expect("GET answers").json().await.expect("JSON body")
}

/// A fresh PostgreSQL database on the local server, dropped by [`drop_database`].
pub async fn create_database() -> (String, String) {
    use sqlx::Connection;
    let name = unique("vigil_test");
    let admin_url =
        std::env::var("VIGIL_TEST_POSTGRES").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let mut admin = sqlx::PgConnection::connect(&admin_url)
        .await
        .expect("PostgreSQL is reachable (scripts/test.sh starts nothing for it: it must run)");
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut admin).await.expect("create database");
    let url = match admin_url.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{name}"),
        None => panic!("bad VIGIL_TEST_POSTGRES"),
    };
    (name, url)
}

pub async fn drop_database(name: &str) {
    use sqlx::Connection;
    let admin_url =
        std::env::var("VIGIL_TEST_POSTGRES").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    if let Ok(mut admin) = sqlx::PgConnection::connect(&admin_url).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&mut admin).await;
    }
}

pub fn kafka_brokers() -> String {
    std::env::var("VIGIL_TEST_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".into())
}
