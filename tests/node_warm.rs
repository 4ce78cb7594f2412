//! A real fleet's history, a warm start, then a real rate anomaly live: `rules/metrics` judges
//! node_exporter series from the first minute (`benches/node_warm.py` is the same run, with its
//! numbers in RELIABILITY.md).
//!
//! `tests/data/node/record.jsonl.gz` holds every scrape of Debian's node_exporter, 10 s apart:
//! 20 minutes healthy, then 4 under `stress-ng --fork` (`benches/node_faults.py` recorded it).
//! The healthy part is laid end to end for a day on three hosts (each starting at another point
//! of it, counters carried on so they keep climbing), every scrape in the last hour and one in
//! fifteen before (what the warm start reads at its 150 s step), ending two hours ago. Debian's
//! Prometheus serves it (`promtool` made the blocks). `vigil serve` warm-starts from it, then
//! the 40 minutes after it come live, remote-written: the healthy hosts carry on, `host-0` runs
//! the recorded fork from its sixth minute. The fork is caught on `host-0` within the window it
//! began in; the healthy hosts raise nothing. A first start, stopped (SIGTERM) while it warms,
//! ends at once and leaves no checkpoint.

use serde_json::Value as Json;
use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;
use std::time::Duration;

const SCRAPE_MS: i64 = 10_000;
const HOSTS: usize = 3;
/// Ticks (scrapes) in a day, an hour, and between the values of the history's stepped part.
const DAY: i64 = 8_640;
const HOUR: i64 = 360;
const STEP: i64 = 15;
const LIVE: i64 = 40 * 6;
const FORK_AFTER: i64 = 6 * 6;
const COUNTING: [&str; 4] = ["_total", "_count", "_sum", "_bucket"];

/// A series of the recording: its name and its labels as JSON (sorted).
type Key = (String, String);
/// A scrape: each series' value, by its place in the keys.
type Scrape = Vec<Option<f64>>;

/// The recording's series, its scrapes in time order, and the index of the first under the fork.
fn recording() -> (Vec<Key>, Vec<Scrape>, usize) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/node");
    let marks: Json =
        serde_json::from_str(&std::fs::read_to_string(dir.join("record.json")).expect("record.json")).expect("JSON");
    let fork_ms = marks["fork_start_ms"].as_i64().expect("fork_start_ms");
    let file = std::fs::File::open(dir.join("record.jsonl.gz")).expect("record.jsonl.gz");
    let mut by_ts: std::collections::BTreeMap<i64, Vec<(Key, f64)>> = Default::default();
    for line in std::io::BufReader::new(flate2::read::GzDecoder::new(file)).lines() {
        let e: Json = serde_json::from_str(&line.expect("a line")).expect("an event");
        let key = (e["name"].as_str().expect("name").to_string(), e["labels"].to_string());
        by_ts.entry(e["ts"].as_i64().expect("ts")).or_default().push((key, e["value"].as_f64().expect("value")));
    }
    let mut keys: Vec<Key> = by_ts.values().flatten().map(|(k, _)| k.clone()).collect();
    keys.sort();
    keys.dedup();
    let place: HashMap<&Key, usize> = keys.iter().enumerate().map(|(i, k)| (k, i)).collect();
    let fork = by_ts.keys().filter(|ts| **ts < fork_ms).count();
    let scrapes = by_ts
        .values()
        .map(|samples| {
            let mut scrape = vec![None; keys.len()];
            for (k, v) in samples {
                scrape[place[k]] = Some(*v);
            }
            scrape
        })
        .collect();
    (keys, scrapes, fork)
}

/// One host's scrapes tick by tick: the recording's scrape `r` at each, counters carried on.
/// Where `r` does not follow the last one (a pass laid after another, the fork spliced in), a
/// counter gains its mean step instead of the jump. The recorded step is taken first, then
/// added: `before + raw - p` rounds, and can step a counter back by its last bit.
struct Host<'a> {
    scrapes: &'a [Scrape],
    /// By series: a counter's mean gain per scrape.
    gains: &'a [Option<f64>],
    last: Option<usize>,
    values: Scrape,
}

impl Host<'_> {
    fn next(&mut self, r: usize) -> Scrape {
        let out: Scrape = (0..self.scrapes[r].len())
            .map(|i| {
                let raw = self.scrapes[r][i]?;
                Some(match (self.gains[i], self.values.get(i).copied().flatten(), self.last) {
                    (Some(gain), Some(before), Some(last)) => match self.scrapes[last][i] {
                        Some(p) if r == last + 1 && raw >= p => before + (raw - p),
                        _ => before + gain,
                    },
                    _ => raw,
                })
            })
            .collect();
        self.last = Some(r);
        self.values = out.clone();
        out
    }
}

/// The OpenMetrics text of `rows` (tick, each host's scrape), each family's samples together.
fn open_metrics(keys: &[Key], rows: &[(i64, Vec<Scrape>)]) -> String {
    let mut text = String::new();
    let mut family = "";
    for (i, key) in keys.iter().enumerate() {
        if key.0 != family {
            family = &key.0;
            text.push_str(&format!("# TYPE {family} unknown\n"));
        }
        let labels: serde_json::Map<String, Json> = serde_json::from_str(&key.1).unwrap_or_default();
        for h in 0..HOSTS {
            let mut pairs = vec![format!("instance=\"host-{h}:9100\""), "job=\"node\"".to_string()];
            for (k, v) in &labels {
                let v = v.as_str().unwrap_or_default().replace('\\', "\\\\").replace('"', "\\\"");
                pairs.push(format!("{k}=\"{v}\""));
            }
            let head = format!("{family}{{{}}}", pairs.join(","));
            for (t, scrape) in rows {
                if let Some(v) = scrape[h][i] {
                    text.push_str(&format!("{head} {v:?} {}.{:03}\n", t * SCRAPE_MS / 1000, t * SCRAPE_MS % 1000));
                }
            }
        }
    }
    text + "# EOF\n"
}

/// A series' remote-write labels on host `h`, as Prometheus scraping it would write them.
fn remote_labels(name: &str, labels: &str, h: usize) -> Vec<vigil::remote_write::Label> {
    let label = |name: &str, value: &str| vigil::remote_write::Label { name: name.into(), value: value.into() };
    let recorded: serde_json::Map<String, Json> = serde_json::from_str(labels).unwrap_or_default();
    let mut out = vec![label("__name__", name), label("instance", &format!("host-{h}:9100")), label("job", "node")];
    out.extend(recorded.iter().map(|(k, v)| label(k, v.as_str().unwrap_or_default())));
    out
}

/// Each alert of the service: its host, series, and when it first fired (ms).
async fn fired(url: &str) -> Vec<(String, String, i64)> {
    let page = crate::support::get_json(&format!("{url}/api/v1/alerts?limit=1000")).await;
    let mut out = Vec::new();
    for a in page["alerts"].as_array().cloned().unwrap_or_default() {
        let detail = crate::support::get_json(&format!("{url}/api/v1/alerts/{}", a["id"].as_str().expect("id"))).await;
        let first = detail["transitions"]
            .as_array()
            .expect("transitions")
            .iter()
            .filter(|t| t["status"] == "firing")
            .filter_map(|t| vigil::event::parse_time(t["time"].as_str()?))
            .min();
        let key = a["key"].as_object().cloned().unwrap_or_default();
        let host = key.iter().find(|(k, _)| k.ends_with("host")).and_then(|(_, v)| v.as_str()).unwrap_or_default();
        let host = host.to_string();
        let name = a["key"]["s.name"].as_str().unwrap_or("(roll-up)").to_string();
        out.push((host, name, first.unwrap_or(i64::MAX)));
    }
    out
}

/// Asserts that the service at `url` says it is not ready: warming.
async fn warming(url: &str) {
    let ready = reqwest::get(format!("{url}/readyz")).await.expect("readyz answers");
    assert_eq!(ready.status(), 503);
    let body: Json = ready.json().await.expect("JSON");
    assert!(body["reason"].as_str().is_some_and(|r| r.starts_with("warming")), "{body}");
}

#[tokio::test]
#[ignore = "needs Debian's prometheus and promtool: run scripts/test.sh"]
async fn a_warm_start_catches_a_real_fork_storm_from_the_first_minute_and_nothing_else() {
    let (keys, scrapes, n) = recording();
    let fault = scrapes.len() - n;
    let gains: Vec<Option<f64>> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let counter = COUNTING.iter().any(|s| k.0.ends_with(s));
            counter.then(|| Some((scrapes[n - 1][i]? - scrapes[0][i]?) / (n - 1) as f64)).flatten()
        })
        .collect();
    let now_tick = vigil::event::now_ms() / SCRAPE_MS;
    // Two hours ago: a feed within an hour of the clock is live, and its time moves on by the
    // clock whenever it pauses (`service/idle.rs`); these 40 minutes go as fast as they can.
    let end = now_tick - 2 * HOUR;
    let first = end - DAY;
    let fork_from = end + 1 + FORK_AFTER;
    let mut hosts: Vec<Host> =
        (0..HOSTS).map(|_| Host { scrapes: &scrapes, gains: &gains, last: None, values: Vec::new() }).collect();
    let (mut history, mut live) = (Vec::new(), Vec::new());
    for t in first..=end + LIVE {
        let values: Vec<Scrape> = hosts
            .iter_mut()
            .enumerate()
            .map(|(h, host)| {
                let r = if h == 0 && (fork_from..fork_from + fault as i64).contains(&t) {
                    n + (t - fork_from) as usize
                } else {
                    ((t - first) as usize + h * n / HOSTS) % n
                };
                host.next(r)
            })
            .collect();
        if t > end {
            live.push((t, values));
        } else if (t - first) % STEP == 0 || t > end - HOUR {
            history.push((t, values));
        }
    }
    let dir = crate::support::temp_dir("node-warm");
    let prometheus = crate::backtest::prometheus(&dir, &open_metrics(&keys, &history), "");
    drop(history);

    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules/metrics");
    let db = crate::support::sqlite_url(&dir);
    // The history ends two hours before now: the raw hour before it is three from now.
    let args = [
        "--rules",
        rules.to_str().expect("utf-8"),
        "--database-url",
        &db,
        "--warm-from-prometheus",
        &prometheus.url,
        "--warm-lookback",
        "27h",
        "--warm-raw",
        "3h",
        "--warm-match",
        r#"{job="node"}"#,
    ];
    // The service answers while it warms (a day of 1,542 series takes tens of seconds), not
    // ready. A SIGTERM then stops it at once, without a checkpoint of half the history: the
    // next start warms again.
    let mut stopped = crate::support::Service::start(&args);
    warming(&stopped.url).await;
    let exit = stopped.terminate(Duration::from_secs(10));
    let log = stopped.log();
    assert!(exit.is_some_and(|e| e.success()), "{exit:?}: {log}");
    assert!(log.contains("the warm start stopped with the service"), "{log}");
    assert!(!log.contains("WARN") && !log.contains("ERROR"), "{log}");
    let vigil = crate::support::Service::start(&args);
    warming(&vigil.url).await;
    // Live samples are sent once the history is read.
    let log = crate::support::eventually_within(Duration::from_secs(600), "the warm start done", || async {
        let log = vigil.log();
        assert!(!log.contains("no warm start"), "{log}");
        log.contains("warm start done").then_some(log)
    })
    .await;
    assert!(log.contains("series=1542"), "{log}");
    // Live samples come as Prometheus remote-writes them: a minute of each series per request,
    // under its `instance` and `job`, kinded by name (no metadata).
    for (minute, ticks) in live.chunks(6).enumerate() {
        let mut written = Vec::new();
        for h in 0..HOSTS {
            for (i, (name, labels)) in keys.iter().enumerate() {
                let samples: Vec<vigil::remote_write::Sample> = ticks
                    .iter()
                    .filter_map(|(t, values)| {
                        Some(vigil::remote_write::Sample { value: values[h][i]?, timestamp: t * SCRAPE_MS })
                    })
                    .collect();
                if !samples.is_empty() {
                    written.push(vigil::remote_write::TimeSeries { labels: remote_labels(name, labels, h), samples });
                }
            }
        }
        crate::backtest::write_series(&vigil.url, written).await;
        if minute == 0 {
            // With state (the history's), the service holds event time while the senders are
            // heard from (`--source-idle-after`, 10 s): a live feed goes on meanwhile.
            tokio::time::sleep(Duration::from_secs(11)).await;
        }
    }
    let fork_ms = fork_from * SCRAPE_MS;
    let alerts = crate::support::eventually("the fork caught on host-0", || async {
        let alerts = fired(&vigil.url).await;
        alerts
            .iter()
            .any(|(host, name, at)| host == "host-0" && name == "node_forks_total" && *at >= fork_ms)
            .then_some(alerts)
    })
    .await;
    let first_caught = alerts.iter().filter(|(h, _, at)| h == "host-0" && *at >= fork_ms).map(|a| a.2).min();
    assert!(first_caught.is_some_and(|at| at - fork_ms <= 300_000), "within the window the fork began in: {alerts:?}");
    let others: Vec<_> = alerts.iter().filter(|(h, _, at)| h != "host-0" || *at < fork_ms).collect();
    assert!(others.is_empty(), "the healthy hosts, and host-0 before the fork, raise nothing: {others:?}");
    // Every live sample was taken, none late.
    let metrics = reqwest::get(format!("{}/metrics", vigil.url)).await.expect("metrics").text().await.expect("text");
    let counted = |name: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!((counted("vigil_samples_rejected_total"), counted("vigil_events_late_total")), (0.0, 0.0));
    std::fs::remove_dir_all(&dir).ok();
}
