//! Helpers for end-to-end tests: the real `vigil` binary, a webhook receiver, an SSE client,
//! fresh PostgreSQL databases and Kafka topics.

#![allow(dead_code)]

pub mod restore;

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
        cmd.arg("serve");
        if !args.contains(&"--http-addr") {
            cmd.args(["--http-addr", "127.0.0.1:0"]);
        }
        cmd.args(args);
        // Never the shared default folder: a spool left by one test must not reach another's store.
        if !args.contains(&"--spool-dir") {
            cmd.arg("--spool-dir").arg(temp_dir("spool"));
        }
        if !args.contains(&"--ingest-log-dir") {
            cmd.arg("--ingest-log-dir").arg(temp_dir("ingest"));
        }
        // VIGIL_TEST_LOG sets the services' log filter (default info), to look into a failure.
        let filter = std::env::var("VIGIL_TEST_LOG").unwrap_or_else(|_| "info".into());
        cmd.env("VIGIL_LOG", filter).stdout(Stdio::null()).stderr(Stdio::piped());
        for var in [
            "VIGIL_RULES",
            "VIGIL_DATABASE_URL",
            "VIGIL_KAFKA_BROKERS",
            "VIGIL_WEBHOOK_URL",
            "VIGIL_API_TOKEN",
            "VIGIL_API_READ_TOKEN",
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

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM, as a service manager stops a service, and waits at most `patience` for
    /// the process to exit: its exit status, or `None` if it is still running.
    pub fn terminate(&mut self, patience: Duration) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill").args(["-TERM", &self.pid().to_string()]).status();
        let deadline = Instant::now() + patience;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
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
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_within(PATIENCE, what, check).await
}

/// [`eventually`], failing the test after `patience`.
pub async fn eventually_within<T, F, Fut>(patience: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + patience;
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

/// The service's Prometheus metrics, as text.
pub async fn metrics(base: &str) -> String {
    reqwest::get(format!("{base}/metrics")).await.expect("metrics").text().await.expect("text")
}

fn admin_url() -> String {
    std::env::var("VIGIL_TEST_POSTGRES").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A fresh PostgreSQL database on the local server, dropped by [`drop_database`].
pub async fn create_database() -> (String, String) {
    create_database_at(&admin_url()).await
}

/// A fresh database on the server that `admin_url` (a URL of an existing database) reaches.
pub async fn create_database_at(admin_url: &str) -> (String, String) {
    use sqlx::Connection;
    let name = unique("vigil_test");
    let mut admin = sqlx::PgConnection::connect(admin_url)
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
    drop_database_at(&admin_url(), name).await
}

pub async fn drop_database_at(admin_url: &str, name: &str) {
    use sqlx::Connection;
    if let Ok(mut admin) = sqlx::PgConnection::connect(admin_url).await {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&mut admin).await;
    }
}

pub fn kafka_brokers() -> String {
    std::env::var("VIGIL_TEST_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// The script that runs Apache Kafka for the tests (`VIGIL_KAFKA_SCRIPT`, or the repo's own).
pub fn kafka_script_path() -> std::path::PathBuf {
    std::env::var_os("VIGIL_KAFKA_SCRIPT")
        .map(Into::into)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kafka.sh"))
}

/// Runs scripts/kafka.sh with `args`; it returns once the brokers it starts answer.
pub fn kafka_script(args: &[&str]) {
    let status = std::process::Command::new(kafka_script_path()).args(args).status().expect("scripts/kafka.sh runs");
    assert!(status.success(), "scripts/kafka.sh {args:?} failed");
}

/// A port P for scripts/kafka.sh's `--port` such that the `count` brokers' ports P.. and the
/// controllers' ports P+100.. are free. They are taken below the kernel's ephemeral range
/// (32768 and up): a port from that range can be taken by any outgoing connection in the
/// seconds a JVM needs to bind it, and a broker that cannot bind exits.
pub fn kafka_ports(count: u16) -> u16 {
    const LOW: u32 = 20_000;
    const HIGH: u32 = 32_000 - 200;
    let mut seed = unique("port").bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    loop {
        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let p = (LOW + (seed >> 8) % (HIGH - LOW)) as u16;
        let free = |q: u16| std::net::TcpListener::bind(("127.0.0.1", q)).is_ok();
        if (0..count).all(|i| free(p + i) && free(p + 100 + i)) {
            return p;
        }
    }
}

pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(unique(name));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

pub fn sqlite_url(dir: &std::path::Path) -> String {
    format!("sqlite://{}", dir.join("vigil.db").display())
}

/// The alerts `vigil replay` of the shipped rules prints for `lines`, one JSON object each.
pub fn replay_alerts(lines: &[String]) -> Vec<Json> {
    replay_alerts_with(lines, &rules_dir())
}

/// The alerts of `vigil replay --rules RULES` over `lines`.
pub fn replay_alerts_with(lines: &[String], rules: &str) -> Vec<Json> {
    let dir = temp_dir("expected");
    let file = dir.join("events.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["replay", "--rules", rules, file.to_str().expect("utf-8")])
        .output()
        .expect("replay runs");
    std::fs::remove_dir_all(&dir).ok();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Json>(l).expect("an alert per line"))
        .collect()
}

/// An alert's (id, status): what identifies a transition.
pub fn transition(a: &Json) -> (String, String) {
    (a["id"].as_str().unwrap_or("").to_string(), a["status"].as_str().unwrap_or("").to_string())
}

pub fn rules_dir() -> String {
    std::fs::canonicalize("rules").expect("rules folder").display().to_string()
}

/// Sends each payload to `topic` and waits for the broker to take it.
pub async fn produce(topic: &str, payloads: &[&str]) {
    produce_to(&kafka_brokers(), topic, payloads).await
}

pub async fn produce_to(brokers: &str, topic: &str, payloads: &[&str]) {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("message.timeout.ms", "60000")
        .create()
        .expect("producer");
    for p in payloads {
        producer
            .send(FutureRecord::<(), _>::to(topic).payload(*p), Duration::from_secs(60))
            .await
            .expect("Kafka accepts the message (is the broker running? scripts/test.sh starts it)");
    }
}

/// A service reading `task_event` from a fresh topic into a fresh PostgreSQL database.
pub struct KafkaSetup {
    pub service: Service,
    pub topic: String,
    pub db_name: String,
    pub db_url: String,
    /// The arguments it was started with, to start it again.
    pub args: Vec<String>,
}

pub async fn start_with_kafka(extra: &[&str]) -> KafkaSetup {
    let (db_name, db_url) = create_database().await;
    start_with_kafka_at(&kafka_brokers(), db_name, db_url, extra).await
}

/// The same, against the broker at `brokers` and the database `db_url`.
pub async fn start_with_kafka_at(brokers: &str, db_name: String, db_url: String, extra: &[&str]) -> KafkaSetup {
    let topic = unique("task_events");
    vigil::service::kafka::ensure_topics(brokers, std::slice::from_ref(&topic), 1, &Default::default())
        .await
        .expect("topics created");
    let spool = temp_dir("spool");
    let mut args: Vec<String> = [
        "--rules",
        &rules_dir(),
        "--database-url",
        &db_url,
        "--kafka-brokers",
        brokers,
        "--kafka-group",
        &unique("group"),
        "--topic",
        &format!("task_event={topic}"),
        "--lateness",
        "0s",
        "--spool-dir",
        &spool.display().to_string(),
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    args.extend(extra.iter().map(|a| a.to_string()));
    let service = Service::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    KafkaSetup { service, topic, db_name, db_url, args }
}

/// The series of NAB's AWS CloudWatch folder recorded in April 2014 (eight hosts, three weeks,
/// every 5 minutes, overlapping in time), as `metric` events in time order, each with its
/// 5-minute step, and after them one event of a host of its own two days later: time moves past
/// every host's last sample in the group as in `vigil replay`, whose end of input fires what is
/// still waiting (a group's time has no end).
pub fn cloudwatch_workload() -> Vec<(i64, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/nab/realAWSCloudwatch");
    let mut rows: Vec<(i64, String, String, String)> = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("../shared/data/nab/realAWSCloudwatch") {
        let path = entry.expect("entry").path();
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
        let Some((name, host)) = stem.rsplit_once('_').filter(|(_, h)| h.len() == 6) else { continue };
        let text = std::fs::read_to_string(&path).expect("csv");
        for line in text.lines().skip(1) {
            let Some((stamp, value)) = line.split_once(',') else { continue };
            if !stamp.starts_with("2014-04") {
                break;
            }
            let ts = stamp.replace(' ', "T") + "Z";
            rows.push((vigil::event::parse_time(&ts).expect("a time"), ts, format!("{host} {name}"), value.into()));
        }
    }
    rows.sort();
    let mut timed: Vec<(i64, String)> = rows
        .iter()
        .map(|(ms, ts, series, value)| {
            let (host, name) = series.split_once(' ').expect("host and name");
            let line = format!(r#"{{"stream":"metric","ts":"{ts}","host":"{host}","name":"{name}","value":{value}}}"#);
            (ms / 300_000, line)
        })
        .collect();
    let last = rows.last().expect("rows").0;
    let end = last + 2 * 86_400_000;
    let end_ts = time::OffsetDateTime::from_unix_timestamp(end / 1000)
        .expect("a time")
        .format(&time::format_description::well_known::Rfc3339)
        .expect("formatted");
    timed.push((
        end / 300_000,
        format!(r#"{{"stream":"metric","ts":"{end_ts}","host":"end-of-data","name":"marker","value":0}}"#),
    ));
    timed
}

/// The PostgreSQL cluster this test may stop: `VIGIL_TEST_PG_CLUSTER` ("VERSION NAME", for
/// pg_ctlcluster) and `VIGIL_TEST_PG_CLUSTER_URL` (a database URL on it). scripts/test.sh makes
/// one; the shared server of the other tests is never stopped.
pub fn fault_cluster() -> (Vec<String>, String) {
    let cluster = std::env::var("VIGIL_TEST_PG_CLUSTER").expect("VIGIL_TEST_PG_CLUSTER (scripts/test.sh sets it)");
    let url = std::env::var("VIGIL_TEST_PG_CLUSTER_URL").expect("VIGIL_TEST_PG_CLUSTER_URL (scripts/test.sh sets it)");
    (cluster.split_whitespace().map(str::to_string).collect(), url)
}

pub fn pg_ctl(cluster: &[String], action: &str) {
    let mut cmd = std::process::Command::new("pg_ctlcluster");
    cmd.arg("--skip-systemctl-redirect").args(cluster).arg(action);
    if action == "stop" {
        cmd.args(["-m", "fast"]);
    }
    let status = cmd.status().expect("pg_ctlcluster runs");
    assert!(status.success(), "pg_ctlcluster {action} failed");
}
