//! A real fleet: Debian's `prometheus-node-exporter` scraped by Debian's `prometheus` as several
//! hosts (one exporter listed as N targets, each with its own `instance` label, and one faulted
//! host with an exporter of its own), remote-writing to `vigil serve` with the shipped rules.
//! Prometheus also records a rule's aggregate (a series without `instance`) and evaluates the
//! same host-down alert in PromQL. `scripts/test.sh` installs both (VIGIL_TEST_PROMETHEUS and
//! VIGIL_TEST_NODE_EXPORTER name other binaries).
//!
//! Prometheus runs as an HA pair: two replicas with the same configuration, told apart by the
//! external label `__replica__`.
//!
//! What it checks: Prometheus never counts a sample failed, with the recording rule present and
//! across a `kill -9` of Vigil; the HA pair is judged once (one replica's samples taken, one
//! alert for the dead host) and fails over when its elected replica dies; the healthy hosts
//! raise no alert; a dead host is paged by `host_down`, and how long that takes beside
//! Prometheus' own alert; SIGTERM stops Vigil within 30 s without an error logged. Each
//! measurement is a `fleet-tally` line, collected in `target/tmp/fleet-tally.md`, which
//! scripts/test.sh prints at its end: the numbers of RELIABILITY.md.

use crate::support::*;
use serde_json::Value as Json;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How often Prometheus scrapes and evaluates here (a real fleet's 10 s, halved to keep the
/// test short).
const SCRAPE_SECONDS: u64 = 5;
const HEALTHY_HOSTS: [&str; 3] = ["host-01", "host-02", "host-03"];

/// A fault injected into a host of its own (an exporter of its own), the rule that must see it
/// and the node-mixin's alert that Prometheus raises for it.
#[derive(Clone, Copy)]
enum Fault {
    /// Its exporter killed: Prometheus writes `up` 0 and stale markers.
    Dead,
    /// Its exporter stopped (SIGSTOP): scrapes time out, `up` 0.
    Hung,
    /// A malformed file in its textfile collector's folder.
    TextfileError,
}

const FAULTS: [(&str, Fault, &str, &str); 3] = [
    ("host-dead", Fault::Dead, "host_down", "HostDown"),
    ("host-hung", Fault::Hung, "host_down", "HostDown"),
    (
        "host-textfile",
        Fault::TextfileError,
        "node_text_file_collector_scrape_error",
        "NodeTextFileCollectorScrapeError",
    ),
];

/// A child process killed when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn binary(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

fn node_exporter(port: u16, textfiles: &Path) -> Proc {
    let exe = binary("VIGIL_TEST_NODE_EXPORTER", "prometheus-node-exporter");
    let child = Command::new(&exe)
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg(format!("--collector.textfile.directory={}", textfiles.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{exe} does not start ({e}): scripts/test.sh installs prometheus-node-exporter"));
    Proc(child)
}

/// Prometheus' configuration: the healthy hosts on one exporter, each faulted one on its own
/// (`own`, in the order of [`FAULTS`]), a recording rule and the node-mixin's alerts in PromQL,
/// remote-write to Vigil; `replica` names this replica of the HA pair.
fn prometheus_config(dir: &Path, shared: u16, own: &[u16], vigil: u16, replica: &str) -> std::path::PathBuf {
    let mut targets = String::new();
    for host in HEALTHY_HOSTS {
        targets += &format!("      - targets: ['127.0.0.1:{shared}']\n        labels: {{instance: '{host}'}}\n");
    }
    for ((host, ..), port) in FAULTS.iter().zip(own) {
        targets += &format!("      - targets: ['127.0.0.1:{port}']\n        labels: {{instance: '{host}'}}\n");
    }
    let config = format!(
        "global:\n  scrape_interval: {SCRAPE_SECONDS}s\n  scrape_timeout: {timeout}s\n  evaluation_interval: {SCRAPE_SECONDS}s\n  \
         external_labels: {{cluster: fleet, __replica__: {replica}}}\n\
         rule_files: ['{rules}', '{mixin}']\n\
         scrape_configs:\n  - job_name: node\n    static_configs:\n{targets}\
         remote_write:\n  - url: http://127.0.0.1:{vigil}/api/v1/write\n    queue_config:\n      \
         batch_send_deadline: 1s\n      min_backoff: 100ms\n      max_backoff: 2s\n    metadata_config:\n      send_interval: 10s\n",
        timeout = SCRAPE_SECONDS - 1,
        rules = dir.join("rules.yml").display(),
        mixin = std::fs::canonicalize("tests/data/node-mixin/alerts.yml").expect("the mixin's alerts").display(),
    );
    // The recording rule's series carries `job` but no `instance`.
    let rules = "groups:\n  - name: recorded\n    rules:\n      - record: job:node_cpu_seconds:rate1m\n        \
                 expr: sum by (job) (rate(node_cpu_seconds_total[1m]))\n";
    std::fs::write(dir.join("rules.yml"), rules).expect("rules.yml");
    let path = dir.join(format!("prometheus-{replica}.yml"));
    std::fs::write(&path, config).expect("prometheus.yml");
    path
}

fn prometheus(dir: &Path, config: &Path, port: u16) -> Proc {
    let exe = binary("VIGIL_TEST_PROMETHEUS", "prometheus");
    let child = Command::new(&exe)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join(format!("tsdb-{port}")).display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{exe} does not start ({e}): scripts/test.sh installs Debian's prometheus"));
    Proc(child)
}

/// The sum of a metric's samples in a Prometheus text exposition (0 when absent).
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn text(url: &str) -> String {
    match reqwest::get(url).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Every alert Vigil stored.
async fn vigil_alerts(url: &str) -> Vec<Json> {
    let page = get_json(&format!("{url}/api/v1/alerts?limit=1000")).await;
    page["alerts"].as_array().cloned().unwrap_or_default()
}

/// The host an alert is about: the value of its key's host attribute.
fn host_of(alert: &Json) -> String {
    let key = alert["key"].as_object().cloned().unwrap_or_default();
    key.iter().find(|(k, _)| k.ends_with(".host")).and_then(|(_, v)| v.as_str()).unwrap_or_default().to_string()
}

/// Prints a measurement, and keeps it for the summary scripts/test.sh prints at its end.
fn tally(line: String) {
    use std::io::Write;
    println!("fleet-tally {line}");
    let file = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fleet-tally.md");
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(file) {
        let _ = writeln!(f, "{line}");
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

#[tokio::test]
#[ignore = "needs Prometheus and node_exporter: scripts/test.sh installs them"]
async fn a_real_fleet_is_judged_without_a_false_alert_and_prometheus_never_fails_a_sample() {
    let dir = temp_dir("fleet");
    let textfiles = |name: &str| {
        let d = dir.join(format!("textfiles-{name}"));
        std::fs::create_dir_all(&d).expect("textfile dir");
        d
    };
    let (shared_port, vigil_port) = (free_port(), free_port());
    let own_ports: Vec<u16> = FAULTS.iter().map(|_| free_port()).collect();
    let prom_ports = [free_port(), free_port()];
    let vigil_addr = format!("127.0.0.1:{vigil_port}");
    let (db, spool, ingest) = (sqlite_url(&dir), dir.join("spool"), dir.join("ingest"));
    let rules = rules_dir();
    let args = [
        "--http-addr",
        vigil_addr.as_str(),
        "--database-url",
        db.as_str(),
        "--rules",
        rules.as_str(),
        "--spool-dir",
        spool.to_str().expect("utf-8"),
        "--ingest-log-dir",
        ingest.to_str().expect("utf-8"),
        "--remote-write-ha-failover",
        "10s",
    ];
    let mut vigil = Service::start(&args);
    let _shared = node_exporter(shared_port, &textfiles("shared"));
    let mut own: Vec<Option<Proc>> =
        FAULTS.iter().zip(&own_ports).map(|((host, ..), port)| Some(node_exporter(*port, &textfiles(host)))).collect();
    // The HA pair: replicas a and b, on ports of their own.
    let mut pair: Vec<Option<Proc>> = ["a", "b"]
        .iter()
        .zip(prom_ports)
        .map(|(replica, port)| {
            let config = prometheus_config(&dir, shared_port, &own_ports, vigil_port, replica);
            Some(prometheus(&dir, &config, port))
        })
        .collect();
    let prom_of = |i: usize| format!("http://127.0.0.1:{}", prom_ports[i]);
    let prom = prom_of(0);
    let prom_metrics = format!("{prom}/metrics");

    // Healthy: samples of every host and of the recording rule reach Vigil, none refused.
    let sent = |t: &str| metric_sum(t, "prometheus_remote_storage_samples_total");
    let failed = |t: &str| metric_sum(t, "prometheus_remote_storage_samples_failed_total");
    eventually_within(Duration::from_secs(60), "Prometheus sending samples", || async {
        let t = text(&prom_metrics).await;
        (sent(&t) > 2_000.0).then_some(())
    })
    .await;
    eventually_within(Duration::from_secs(60), "the recording rule's series sent", || async {
        let url = format!("{prom}/api/v1/query?query=job:node_cpu_seconds:rate1m");
        let answer: Json = reqwest::get(&url).await.ok()?.json().await.ok()?;
        answer["data"]["result"].as_array().is_some_and(|r| !r.is_empty()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3 * SCRAPE_SECONDS)).await;
    let t = text(&prom_metrics).await;
    assert_eq!(failed(&t), 0.0, "Prometheus counted samples failed with a recording rule present");
    let t_b = text(&format!("{}/metrics", prom_of(1))).await;
    assert_eq!(failed(&t_b), 0.0, "the second replica counted samples failed");
    let vigil_metrics = metrics(&vigil.url).await;
    assert_eq!(metric_sum(&vigil_metrics, "vigil_samples_rejected_total"), 0.0, "Vigil refused samples");
    let dropped = metric_sum(&vigil_metrics, "vigil_remote_write_ha_dropped_samples_total");
    let taken = metric_sum(&vigil_metrics, "vigil_samples_in_total");
    assert!(dropped > 0.0, "one replica of the HA pair is dropped");
    tally(format!("healthy: {} and {} samples sent by the two replicas, 0 failed; Vigil took {taken}, dropped {dropped} of the other replica",
        sent(&t),
        sent(&t_b)
    ));

    // kill -9 of Vigil: Prometheus retries what it could not send, and counts nothing failed.
    vigil.kill();
    tokio::time::sleep(Duration::from_secs(2 * SCRAPE_SECONDS)).await;
    let before_restart = sent(&text(&prom_metrics).await);
    let mut vigil = Service::start(&args);
    eventually_within(Duration::from_secs(60), "Prometheus sending again after Vigil's restart", || async {
        let t = text(&prom_metrics).await;
        (sent(&t) > before_restart + 2_000.0).then_some(())
    })
    .await;
    let t = text(&prom_metrics).await;
    assert_eq!(failed(&t), 0.0, "Prometheus counted samples failed across a kill -9 of Vigil");
    let retried = metric_sum(&t, "prometheus_remote_storage_samples_retried_total");
    tally(format!("kill -9: Prometheus retried {retried} samples, 0 failed"));

    // The faults, all at once; each is timed in Vigil and in Prometheus, with the same alert in
    // PromQL, as each first shows it.
    for ((host, fault, ..), exporter) in FAULTS.iter().zip(own.iter_mut()) {
        match fault {
            Fault::Dead => drop(exporter.take()),
            Fault::Hung => {
                let pid = exporter.as_ref().expect("running").0.id().to_string();
                Command::new("kill").args(["-STOP", &pid]).status().expect("kill runs");
            }
            Fault::TextfileError => {
                std::fs::write(textfiles(host).join("broken.prom"), "this is { not a metric\n").expect("textfile")
            }
        }
    }
    let injected = Instant::now();
    let mut vigil_took: Vec<Option<Duration>> = vec![None; FAULTS.len()];
    let mut prometheus_took: Vec<Option<Duration>> = vec![None; FAULTS.len()];
    let deadline = injected + Duration::from_secs(240);
    while vigil_took.iter().chain(&prometheus_took).any(Option::is_none) {
        assert!(
            Instant::now() < deadline,
            "not every fault seen within 240 s: Vigil {vigil_took:?}, Prometheus {prometheus_took:?}"
        );
        let alerts = vigil_alerts(&vigil.url).await;
        let answer: Json = get_json(&format!("{prom}/api/v1/alerts")).await;
        let firing = answer["data"]["alerts"].as_array().cloned().unwrap_or_default();
        for (i, (host, _, rule, alertname)) in FAULTS.iter().enumerate() {
            if vigil_took[i].is_none() && alerts.iter().any(|a| a["rule"] == *rule && host_of(a) == *host) {
                vigil_took[i] = Some(injected.elapsed());
            }
            let fired = |a: &Json| {
                a["state"] == "firing" && a["labels"]["instance"] == *host && a["labels"]["alertname"] == *alertname
            };
            if prometheus_took[i].is_none() && firing.iter().any(fired) {
                prometheus_took[i] = Some(injected.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for (i, (host, _, rule, alertname)) in FAULTS.iter().enumerate() {
        let seconds = |d: Option<Duration>| d.unwrap_or_default().as_secs_f64();
        tally(format!("{host}: Vigil {rule} after {:.0} s, Prometheus {alertname} after {:.0} s (scrapes every {SCRAPE_SECONDS} s)",
            seconds(vigil_took[i]),
            seconds(prometheus_took[i])
        ));
    }

    // No alert about any healthy host; a faulted host is paged once, not once per replica.
    let alerts = vigil_alerts(&vigil.url).await;
    let faulted: Vec<&str> = FAULTS.iter().map(|(host, ..)| *host).collect();
    for (host, _, rule, _) in FAULTS {
        let of_host: Vec<&Json> = alerts.iter().filter(|a| a["rule"] == rule && host_of(a) == host).collect();
        assert_eq!(of_host.len(), 1, "{host}: one {rule} alert for the HA pair: {of_host:#?}");
    }
    let false_alerts: Vec<&Json> = alerts.iter().filter(|a| !faulted.contains(&host_of(a).as_str())).collect();
    assert!(false_alerts.is_empty(), "alerts on healthy hosts: {false_alerts:#?}");
    tally(format!("false alerts on the healthy hosts: {}", false_alerts.len()));
    let t = text(&prom_metrics).await;
    assert_eq!(failed(&t), 0.0, "Prometheus counted samples failed");

    // The elected replica dies: the other is taken after the failover time (10 s here).
    let log = vigil.log();
    let elected = log
        .lines()
        .rev()
        .find_map(|l| {
            let b = if l.contains("HA pair: replica elected") {
                l.contains("replica=b")
            } else if l.contains("failing over") {
                l.contains("to=b")
            } else {
                return None;
            };
            Some(usize::from(b))
        })
        .expect("Vigil elected a replica");
    drop(pair[elected].take());
    let taken_before = metric_sum(&metrics(&vigil.url).await, "vigil_samples_in_total");
    let other = ["a", "b"][1 - elected];
    eventually_within(Duration::from_secs(60), "the other replica taken over", || async {
        let now = metric_sum(&metrics(&vigil.url).await, "vigil_samples_in_total");
        let failed_over =
            vigil.log()[log.len()..].lines().any(|l| l.contains("failing over") && l.contains(&format!("to={other}")));
        (failed_over && now > taken_before + 500.0).then_some(())
    })
    .await;
    let other = text(&format!("{}/metrics", prom_of(1 - elected))).await;
    assert_eq!(failed(&other), 0.0, "the surviving replica counted samples failed");
    tally(format!("HA failover: replica {} died, the other was taken", ["a", "b"][elected]));

    // SIGTERM: the receivers answer 503 (Prometheus retries), a last checkpoint, no error, and
    // the process is gone within 30 s.
    let asked = Instant::now();
    let status = vigil.terminate(Duration::from_secs(30)).expect("vigil exits within 30 s of SIGTERM");
    let stopped_in = asked.elapsed();
    assert!(status.success(), "vigil exits cleanly on SIGTERM: {status}");
    let log = vigil.log();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(errors.is_empty(), "errors logged on the way down:\n{}", errors.join("\n"));
    assert!(log.contains("last checkpoint are stored"), "the last checkpoint is stored on the way down:\n{log}");
    assert!(log.contains("stopped"), "the shutdown ends with its last line:\n{log}");
    tally(format!("SIGTERM: exited in {:.1} s", stopped_in.as_secs_f64()));
    tokio::time::sleep(Duration::from_secs(SCRAPE_SECONDS)).await;
    let t = text(&format!("{}/metrics", prom_of(1 - elected))).await;
    assert_eq!(failed(&t), 0.0, "Prometheus counted samples failed while Vigil stopped");
}
