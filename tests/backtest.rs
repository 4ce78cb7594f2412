//! Backtests: `vigil replay --from-prometheus` over a real Prometheus (Debian's, which
//! `scripts/test.sh` installs; VIGIL_TEST_PROMETHEUS and VIGIL_TEST_PROMTOOL name others) whose
//! TSDB `promtool tsdb create-blocks-from openmetrics` filled with real series: three of NAB's
//! AWS CloudWatch series, two weeks at five minutes each (`tests/data/prometheus/nab.om.gz`).
//!
//! What it checks: the backtest of `rules/metrics` raises alerts, and exactly the alerts (ids,
//! times, values) of `vigil replay` over the same samples from a file, whether Prometheus
//! streams chunks or sends samples and whatever the page of time read at once; a Prometheus
//! that cannot be reached or a bad selector ends the backtest with the reason.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Prometheus, stopped when dropped.
pub(crate) struct Prometheus {
    child: Child,
    pub(crate) url: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn binary(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// The history in OpenMetrics text.
fn history() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/prometheus/nab.om.gz");
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&path).expect("nab.om.gz"))
        .read_to_string(&mut text)
        .expect("gzip");
    text
}

/// A Prometheus whose TSDB holds `history`, answering on a port of its own, with `global`
/// settings of its configuration.
pub(crate) fn prometheus(dir: &Path, history: &str, global: &str) -> Prometheus {
    let text = dir.join("history.om");
    std::fs::write(&text, history).expect("write");
    let tsdb = dir.join("tsdb");
    let promtool = binary("VIGIL_TEST_PROMTOOL", "promtool");
    let made = Command::new(&promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&text)
        .arg(&tsdb)
        .output()
        .unwrap_or_else(|e| panic!("{promtool} does not start ({e}): scripts/test.sh installs prometheus"));
    assert!(made.status.success(), "promtool: {}", String::from_utf8_lossy(&made.stderr));
    let config = dir.join("prometheus.yml");
    std::fs::write(&config, format!("global:\n  scrape_interval: 1h\n{global}")).expect("write");
    let port = free_port();
    let exe = binary("VIGIL_TEST_PROMETHEUS", "prometheus");
    let child = Command::new(&exe)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", tsdb.display()))
        // The blocks are from 2014: kept whatever the wall clock says.
        .arg("--storage.tsdb.retention.time=100y")
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{exe} does not start ({e}): scripts/test.sh installs prometheus"));
    let p = Prometheus { child, url: format!("http://127.0.0.1:{port}") };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready(port) {
        assert!(Instant::now() < deadline, "Prometheus is not ready within 60 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    p
}

/// Whether Prometheus answers `/-/ready` with 200.
fn ready(port: u16) -> bool {
    use std::io::Write;
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET /-/ready HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    let mut answer = String::new();
    s.write_all(request.as_bytes()).is_ok()
        && s.read_to_string(&mut answer).is_ok()
        && answer.starts_with("HTTP/1.0 200")
}

/// `vigil replay --rules rules/metrics ARGS`.
fn replay(args: &[&str]) -> Output {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules/metrics");
    Command::new(env!("CARGO_BIN_EXE_vigil"))
        .arg("replay")
        .arg("--rules")
        .arg(rules)
        .args(args)
        .output()
        .expect("vigil runs")
}

/// A backtest of every series of the history, read `page` at a time as `mode`.
fn backtest(url: &str, page: &str, mode: &str) -> Output {
    let range = ["--start", "2014-02-01T00:00:00Z", "--end", "1398902400"];
    let args = [
        &["--from-prometheus", url, "--match", r#"{job="cloudwatch"}"#, "--page", page, "--prometheus-read", mode][..],
        &range[..],
    ];
    replay(&args.concat())
}

/// The history's samples as prometheus-kafka-adapter writes them, in time order (the order a
/// file recorded live has).
fn adapter_lines(history: &str) -> String {
    let mut samples: Vec<(i64, String)> = Vec::new();
    for (series, points) in series_of(history) {
        let labels = labels_of(&series);
        let name = &labels[0].value;
        let map: serde_json::Map<String, serde_json::Value> =
            labels.iter().map(|l| (l.name.clone(), l.value.clone().into())).collect();
        for (secs, value) in points {
            let at = time::OffsetDateTime::from_unix_timestamp(secs).expect("time");
            let stamp = at.format(&time::format_description::well_known::Rfc3339).expect("RFC 3339");
            let json = serde_json::json!({"timestamp": stamp, "value": value, "name": name, "labels": map});
            samples.push((secs, json.to_string()));
        }
    }
    samples.sort_by_key(|(secs, _)| *secs);
    samples.into_iter().map(|(_, l)| l + "\n").collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
#[ignore = "needs Debian's prometheus and promtool: run scripts/test.sh"]
fn a_backtest_through_prometheus_raises_the_alerts_of_a_replay_of_the_same_samples() {
    let dir = crate::support::temp_dir("backtest");
    let history = history();
    let p = prometheus(&dir, &history, "");

    let streamed = backtest(&p.url, "1 d", "streamed");
    assert!(streamed.status.success(), "{}", text(&streamed.stderr));
    assert!(
        text(&streamed.stderr).contains("replayed 12783 events (0 malformed, 0 late)"),
        "{}",
        text(&streamed.stderr)
    );
    let alerts = text(&streamed.stdout);
    let fired = alerts.lines().filter(|l| l.contains(r#""status":"firing""#)).count();
    assert!(fired >= 5, "the rules find the series' anomalies: {alerts}");

    let file = dir.join("samples.jsonl");
    std::fs::write(&file, adapter_lines(&history)).expect("write");
    let from_file = replay(&["--format", "prometheus-kafka-adapter", file.to_str().expect("utf-8")]);
    assert!(from_file.status.success(), "{}", text(&from_file.stderr));
    assert_eq!(text(&from_file.stdout), alerts, "the same alerts, ids included, as the file's");

    // Pages that do not fall on the samples' times, and the whole answer in one message.
    for (page, mode) in [("7 h", "streamed"), ("50 min", "streamed"), ("1 d", "samples")] {
        let other = backtest(&p.url, page, mode);
        assert!(other.status.success(), "{}", text(&other.stderr));
        assert_eq!(text(&other.stdout), alerts, "pages of {page}, {mode}");
    }

    // `vigil why` over the same history gives the file's answer, changes and costs included.
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules/metrics");
    let question = [
        "why",
        "--rules",
        rules.to_str().expect("utf-8"),
        "--rule",
        "metric_deviation",
        "--json",
        "--key",
        "ec2-1ef3de",
        "--from",
        "2014-03-08T00:00:00Z",
        "--to",
        "2014-03-08T12:00:00Z",
    ];
    let why =
        |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_vigil")).args(question).args(args).output().expect("runs");
    let range = ["--start", "2014-02-01T00:00:00Z", "--end", "1398902400"];
    let read = why(&[&["--from-prometheus", &p.url, "--match", r#"{job="cloudwatch"}"#][..], &range[..]].concat());
    let answer: serde_json::Value = serde_json::from_slice(&read.stdout).expect("JSON");
    assert_eq!(answer["groups"].as_array().map(Vec::len), Some(1), "{answer}");
    assert!(!answer["changes"].as_array().expect("changes").is_empty(), "{answer}");
    let from_file = why(&["--format", "prometheus-kafka-adapter", file.to_str().expect("utf-8")]);
    assert_eq!(text(&from_file.stdout), text(&read.stdout), "{}", text(&from_file.stderr));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_backtest_that_cannot_read_says_why() {
    let down = format!("http://127.0.0.1:{}", free_port());
    let args = ["--from-prometheus", &down, "--match", "up", "--start", "now-1h", "--prometheus-timeout", "2 s"];
    let out = replay(&args);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("the backtest stopped early") && err.contains("/api/v1/read"), "{err}");

    let out = replay(&["--from-prometheus", &down, "--match", r#"up{job="node""#, "--start", "now-1h"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains(r#"--match `up{job="node"`: column 14: expected `,` or `}`"#),
        "{}",
        text(&out.stderr)
    );

    let out = replay(&["--from-prometheus", &down, "--match", "up", "--start", "yesterday"]);
    assert!(text(&out.stderr).contains("--start: `yesterday` is not a time"), "{}", text(&out.stderr));
}

/// The history's series, each as (labels as written, samples as (seconds, value)), in the
/// order written.
fn series_of(history: &str) -> Vec<(String, Vec<(i64, f64)>)> {
    let mut out: Vec<(String, Vec<(i64, f64)>)> = Vec::new();
    for line in history.lines().filter(|l| !l.starts_with('#')) {
        let (series, rest) = line.split_once("} ").expect("name{labels} value ts");
        let (value, ts) = rest.split_once(' ').expect("value ts");
        let sample = (ts.parse().expect("seconds"), value.parse().expect("a value"));
        match out.last_mut() {
            Some((s, samples)) if *s == series => samples.push(sample),
            _ => out.push((series.to_string(), vec![sample])),
        }
    }
    out
}

/// The labels of a series as written (`name{a="b",...}`), as remote-write labels.
fn labels_of(series: &str) -> Vec<vigil::remote_write::Label> {
    let (name, labels) = series.split_once('{').expect("labels");
    let mut out = vec![vigil::remote_write::Label { name: "__name__".into(), value: name.into() }];
    for pair in labels.split(',') {
        let (k, v) = pair.split_once('=').expect("label=value");
        out.push(vigil::remote_write::Label { name: k.into(), value: v.trim_matches('"').into() });
    }
    out
}

/// Remote-writes one sample of each series to `url`.
pub(crate) async fn remote_write(url: &str, samples: &[(Vec<vigil::remote_write::Label>, i64, f64)]) {
    use vigil::remote_write::{Sample, TimeSeries};
    let timeseries = samples
        .iter()
        .map(|(labels, ms, value)| TimeSeries {
            labels: labels.clone(),
            samples: vec![Sample { value: *value, timestamp: *ms }],
        })
        .collect();
    write_series(url, timeseries).await;
}

/// Remote-writes `timeseries` to `url` in one request, as Prometheus does (1.0, snappy).
pub(crate) async fn write_series(url: &str, timeseries: Vec<vigil::remote_write::TimeSeries>) {
    use vigil::remote_write::WriteRequest;
    let body = prost::Message::encode_to_vec(&WriteRequest { timeseries, metadata: Vec::new() });
    let body = snap::raw::Encoder::new().compress_vec(&body).expect("snappy");
    let answer = reqwest::Client::new()
        .post(format!("{url}/api/v1/write"))
        .header("Content-Encoding", "snappy")
        .header("Content-Type", "application/x-protobuf")
        .header("X-Prometheus-Remote-Write-Version", "0.1.0")
        .body(body)
        .send()
        .await
        .expect("remote-write answers");
    assert!(answer.status().is_success(), "remote-write: {}", answer.status());
}

/// The alerts the service stored, as JSON text each.
pub(crate) async fn stored(url: &str) -> Vec<String> {
    let page = crate::support::get_json(&format!("{url}/api/v1/alerts?limit=500")).await;
    page["alerts"].as_array().map(|a| a.iter().map(|a| a.to_string()).collect()).unwrap_or_default()
}

pub(crate) const FAULTED: &str = "ec2-825cc2";

/// One sample of each series at one time, as remote-write labels.
pub(crate) type Step = Vec<(Vec<vigil::remote_write::Label>, i64, f64)>;

/// The history moved so that each series ends two hours ago, on a five-minute grid (in
/// OpenMetrics text), and the two hours since, to come live: each series' values of the day
/// before, with a fault in one host from the sixth sample on.
pub(crate) fn history_and_live() -> (String, Vec<Step>) {
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs() as i64;
    let end = now_s / 300 * 300 - 7_200;
    let mut shifted = String::new();
    let mut live: Vec<Step> = vec![Vec::new(); 22];
    let mut family = "";
    let all = series_of(&history());
    for (series, samples) in &all {
        let name = series.split('{').next().expect("a name");
        if name != family {
            family = name;
            shifted.push_str(&format!("# TYPE {name} gauge\n"));
        }
        let shift = end - samples.last().expect("samples").0;
        let peak = samples.iter().map(|s| s.1).fold(f64::MIN, f64::max);
        for (ts, value) in samples {
            shifted.push_str(&format!("{series}}} {value} {}\n", ts + shift));
        }
        let day_before = &samples[samples.len() - 288..];
        for (k, step) in live.iter_mut().enumerate() {
            let n = k + 2;
            let value = if series.contains(FAULTED) && n >= 6 { peak * 3.0 + 50.0 } else { day_before[n].1 };
            let mut labels = labels_of(series);
            labels.extend(
                [("cluster", "test"), ("__replica__", "a")]
                    .map(|(name, value)| vigil::remote_write::Label { name: name.into(), value: value.into() }),
            );
            step.push((labels, (end + n as i64 * 300) * 1000, value));
        }
    }
    (shifted + "# EOF\n", live)
}

#[tokio::test]
#[ignore = "needs Debian's prometheus and promtool: run scripts/test.sh"]
async fn a_warm_start_judges_live_samples_from_the_first_minute() {
    let (history, live) = history_and_live();
    let dir = crate::support::temp_dir("warm");
    // An HA pair's replica: its external labels come with live samples (the replica's taken
    // off by Vigil), not with range queries' answers.
    let p = prometheus(&dir, &history, "  external_labels:\n    cluster: test\n    __replica__: a\n");

    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules/metrics");
    let start = |warm: bool, name: &str| {
        let db = crate::support::sqlite_url(&dir.join(name));
        std::fs::create_dir_all(dir.join(name)).expect("dir");
        let mut args = vec!["--rules", rules.to_str().expect("utf-8"), "--database-url", &db]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>();
        if warm {
            args.extend(
                ["--warm-from-prometheus", &p.url, "--warm-lookback", "30d", "--warm-step", "5min"].map(String::from),
            );
            args.extend(["--warm-match".to_string(), r#"{job="cloudwatch"}"#.to_string()]);
        }
        crate::support::Service::start(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let warm = start(true, "warm");
    let cold = start(false, "cold");
    let log = crate::support::eventually_within(Duration::from_secs(600), "the warm start done", || async {
        let log = warm.log();
        log.contains("warm start done").then_some(log)
    })
    .await;
    assert!(log.contains("series=3"), "{log}");
    for step in &live {
        remote_write(&warm.url, step).await;
        remote_write(&cold.url, step).await;
    }
    let caught = crate::support::eventually("the fault caught after the warm start", || async {
        let alerts = stored(&warm.url).await;
        alerts.iter().any(|a| a.contains("metric_deviation") && a.contains(FAULTED)).then_some(alerts)
    })
    .await;
    let others: Vec<&String> = caught.iter().filter(|a| !a.contains(FAULTED)).collect();
    assert!(others.is_empty(), "the healthy hosts raise nothing: {others:?}");
    // The same samples without the history: too young to be judged.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cold_alerts = stored(&cold.url).await;
    assert!(!cold_alerts.iter().any(|a| a.contains("metric_deviation")), "{cold_alerts:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// node_exporter's textfile of families whose names belie their types: a gauge named as a
/// counter is, and a counter named as a level is.
const BELIED: &str = "# HELP vigil_queue_total Jobs waiting.\n# TYPE vigil_queue_total gauge\nvigil_queue_total 7\n\
                      # HELP vigil_jobs_done Jobs done.\n# TYPE vigil_jobs_done counter\nvigil_jobs_done 42\n";

/// Rules that say each series' kind: `counted` fires for counters' series, `levels` for gauges'.
const KINDS: &str = "rule counted {\n  metric s sample as e where e.kind == \"counter\" #time(5 s)\n  \
                     state ss { n := count() } group by s\n  alert ss.n > 0 severity warning\n  return s.name\n}\n\
                     rule levels {\n  metric s sample as e where e.kind == \"gauge\" #time(5 s)\n  \
                     state ss { n := count() } group by s\n  alert ss.n > 0 severity warning\n  return s.name\n}\n";

/// A child process, killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Each alert's rule and series name, sorted, from alerts as JSON.
fn kinds_of<'a>(alerts: impl Iterator<Item = &'a str>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = alerts
        .filter_map(|a| serde_json::from_str::<serde_json::Value>(a).ok())
        .map(|a| {
            (a["rule"].as_str().unwrap_or_default().into(), a["key"]["s.name"].as_str().unwrap_or_default().into())
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

#[tokio::test]
#[ignore = "needs Debian's prometheus and prometheus-node-exporter: run scripts/test.sh"]
async fn history_is_kinded_by_the_servers_metadata_as_live_samples_are() {
    let dir = crate::support::temp_dir("kinds");
    let textfiles = dir.join("textfiles");
    std::fs::create_dir_all(&textfiles).expect("dir");
    std::fs::write(textfiles.join("belied.prom"), BELIED).expect("write");
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).expect("dir");
    std::fs::write(rules.join("kinds.saql"), KINDS).expect("write");
    let exporter_port = free_port();
    let exe = binary("VIGIL_TEST_NODE_EXPORTER", "prometheus-node-exporter");
    let _exporter = Killed(
        Command::new(&exe)
            .arg(format!("--web.listen-address=127.0.0.1:{exporter_port}"))
            .args(["--collector.disable-defaults", "--collector.textfile"])
            .arg(format!("--collector.textfile.directory={}", textfiles.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{exe} does not start ({e}): scripts/test.sh installs it")),
    );
    let config = dir.join("prometheus.yml");
    let scrape = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: node\n    static_configs:\n      \
         - targets: ['127.0.0.1:{exporter_port}']\n        labels: {{instance: 'host-1'}}\n"
    );
    std::fs::write(&config, scrape).expect("write");
    let port = free_port();
    let exe = binary("VIGIL_TEST_PROMETHEUS", "prometheus");
    let _prometheus = Killed(
        Command::new(&exe)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{exe} does not start ({e}): scripts/test.sh installs prometheus")),
    );
    let url = format!("http://127.0.0.1:{port}");
    let scrapes = format!("{url}/api/v1/query?query=count_over_time(vigil_jobs_done[1m])");
    crate::support::eventually_within(Duration::from_secs(60), "ten scrapes stored", || async {
        let answer = reqwest::get(&scrapes).await.ok()?.json::<serde_json::Value>().await.ok()?;
        let count: f64 = answer["data"]["result"][0]["value"][1].as_str()?.parse().ok()?;
        (count >= 10.0).then_some(())
    })
    .await;
    let expected =
        [("counted".to_string(), "vigil_jobs_done".to_string()), ("levels".into(), "vigil_queue_total".into())];

    // A backtest: by their names alone, `vigil_queue_total` would be a counter and
    // `vigil_jobs_done` of no kind.
    let selector = r#"{__name__=~"vigil_.*"}"#;
    let out = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["replay", "--rules", rules.to_str().expect("utf-8"), "--from-prometheus", &url])
        .args(["--match", selector, "--start", "now-5m", "--end", "now"])
        .output()
        .expect("vigil runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(kinds_of(text(&out.stdout).lines()), expected, "{}", text(&out.stderr));

    // A warm start: what the history leaves firing is sent, kinded as the backtest's.
    let db = crate::support::sqlite_url(&dir);
    let args = ["--rules", rules.to_str().expect("utf-8"), "--database-url", &db, "--warm-from-prometheus", &url];
    let vigil = crate::support::Service::start(
        &[&args[..], &["--warm-lookback", "10m", "--warm-match", selector, "--lateness", "0s"]].concat(),
    );
    let log = crate::support::eventually("the warm start done", || async {
        let log = vigil.log();
        log.contains("warm start done").then_some(log)
    })
    .await;
    assert!(log.contains("metric types read from the server's metadata"), "{log}");
    let alerts = stored(&vigil.url).await;
    assert_eq!(kinds_of(alerts.iter().map(String::as_str)), expected, "{log}");
    std::fs::remove_dir_all(&dir).ok();
}
