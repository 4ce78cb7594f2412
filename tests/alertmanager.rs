//! Vigil sending to a real Alertmanager, and showing its silences (Debian's `prometheus-alertmanager`, which
//! scripts/test.sh installs; VIGIL_TEST_ALERTMANAGER names another binary).

use crate::group::{member_args, sum_of};
use crate::support::*;
use serde_json::Value as Json;
use std::process::{Child, Command, Stdio};

/// A running Alertmanager, killed when dropped.
struct Alertmanager {
    child: Child,
    url: String,
    args: Vec<String>,
}

impl Alertmanager {
    /// Routes `severity="critical"` to `pager`, the rest to `chat`; groups by `group_by` (a
    /// YAML list) and notifies a second after a group changes.
    async fn start(dir: &std::path::Path, pager: &str, chat: &str, group_by: &str) -> Alertmanager {
        let config = format!(
            "route:\n  receiver: chat\n  group_by: {group_by}\n  group_wait: 1s\n  group_interval: 1s\n  \
             repeat_interval: 1h\n  routes:\n    - matchers: ['severity=\"critical\"']\n      receiver: pager\n\
             receivers:\n  - name: chat\n    webhook_configs: [{{url: '{chat}', send_resolved: true}}]\n  \
             - name: pager\n    webhook_configs: [{{url: '{pager}', send_resolved: true}}]\n"
        );
        let path = dir.join("alertmanager.yml");
        std::fs::write(&path, config).expect("config");
        let port = kafka_ports(1);
        let args = vec![
            format!("--config.file={}", path.display()),
            format!("--storage.path={}", dir.join("am-data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--cluster.listen-address=".to_string(),
        ];
        let mut am = Alertmanager { child: spawn(&args), url: format!("http://127.0.0.1:{port}"), args };
        am.wait_ready().await;
        am
    }

    async fn wait_ready(&mut self) {
        let ready = format!("{}/-/ready", self.url);
        eventually("Alertmanager ready", || async {
            reqwest::get(&ready).await.ok().filter(|r| r.status().is_success()).map(|_| ())
        })
        .await;
    }

    /// Killed at once (no shutdown), then started again on the same storage.
    async fn restart_after(&mut self, while_down: impl std::future::Future<Output = ()>) {
        self.child.kill().ok();
        self.child.wait().ok();
        while_down.await;
        self.child = spawn(&self.args);
        self.wait_ready().await;
    }

    async fn alerts(&self) -> Vec<Json> {
        let got = reqwest::get(format!("{}/api/v2/alerts", self.url)).await.expect("Alertmanager answers");
        got.json::<Json>().await.expect("JSON").as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Alertmanager {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

fn spawn(args: &[String]) -> Child {
    let binary =
        std::env::var("VIGIL_TEST_ALERTMANAGER").unwrap_or_else(|_| "/usr/bin/prometheus-alertmanager".to_string());
    Command::new(&binary).args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap_or_else(|e| {
        panic!("{binary} does not start ({e}): scripts/test.sh installs Debian's prometheus-alertmanager")
    })
}

fn named<'a>(alerts: &'a [Json], name: &str, job: &str) -> Option<&'a Json> {
    alerts.iter().find(|a| a["labels"]["alertname"] == name && a["labels"]["t_job_id"] == job)
}

/// Alert names in a receiver's notifications.
fn notified(receiver: &Receiver) -> Vec<String> {
    let bodies = receiver.bodies();
    let alerts = bodies.iter().flat_map(|b| b["alerts"].as_array().cloned().unwrap_or_default());
    alerts.filter_map(|a| a["labels"]["alertname"].as_str().map(String::from)).collect()
}

/// Now and an hour from now, as Alertmanager's API writes times.
fn now_and_an_hour_on() -> (String, String) {
    let format = |t: std::time::SystemTime| {
        let ms = t.duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as i64;
        vigil::event::format_time(ms)
    };
    let now = std::time::SystemTime::now();
    (format(now), format(now + std::time::Duration::from_secs(3600)))
}

/// Five failures of `job`, a minute apart from `hour`:00.
fn burst(job: &str, hour: u32) -> String {
    (0..5)
        .map(|i| {
            format!(
                "{{\"stream\":\"task_event\",\"ts\":\"2026-01-01T{hour:02}:0{i}:00Z\",\"type\":\"FAIL\",\"job_id\":\"{job}\",\
                 \"task_index\":{i},\"machine_id\":\"m{i}\"}}\n"
            )
        })
        .collect()
}

/// The shipped burst rule (critical), and the shipped eviction rule kept firing for a day (a
/// warning that stays firing: event time stands still in this past-dated input), in `dir/rules`.
fn rules_in(dir: &std::path::Path) -> String {
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).expect("rules folder");
    std::fs::copy("rules/job_failure_burst.saql", rules.join("job_failure_burst.saql")).expect("copy");
    let evicted = std::fs::read_to_string("rules/evicted_then_failed.saql").expect("rule");
    let evicted = evicted.replace("alert severity warning", "alert severity warning keep_firing_for 1 d");
    assert!(evicted.contains("keep_firing_for 1 d"), "{evicted}");
    std::fs::write(rules.join("evicted_then_failed.saql"), evicted).expect("write");
    rules.to_str().expect("utf-8").to_string()
}

#[tokio::test]
#[ignore = "needs Alertmanager: run scripts/test.sh"]
async fn alerts_reach_alertmanager_route_as_configured_survive_its_restart_and_show_its_silences() {
    let dir = temp_dir("alertmanager");
    let rules = rules_in(&dir);
    let (pager, chat) = (Receiver::start(0).await, Receiver::start(0).await);
    let mut am = Alertmanager::start(&dir, &pager.url, &chat.url, "['alertname']").await;
    let service = Service::start(&[
        "--rules",
        &rules,
        "--database-url",
        &sqlite_url(&dir),
        "--lateness",
        "0s",
        "--alertmanager-url",
        &am.url,
        "--alertmanager-resend-delay",
        "2s",
        "--alertmanager-external-label",
        "site=test",
    ]);
    post_events(&service.url, evict_then_fail("j1", 0) + &burst("b1", 1)).await;

    let alerts = eventually("both alerts in Alertmanager", || async {
        let alerts = am.alerts().await;
        (named(&alerts, "evicted_then_failed", "j1").is_some() && named(&alerts, "job_failure_burst", "b1").is_some())
            .then_some(alerts)
    })
    .await;
    let warning = named(&alerts, "evicted_then_failed", "j1").expect("there");
    assert_eq!(warning["labels"]["severity"], "warning");
    assert_eq!(warning["labels"]["t_task_index"], "0");
    assert_eq!(warning["labels"]["site"], "test", "the external label");
    assert_eq!(warning["status"]["state"], "active");
    let id = get_json(&format!("{}/api/v1/alerts?rule=evicted_then_failed", service.url)).await["alerts"][0]["id"]
        .as_str()
        .expect("id")
        .to_string();
    assert_eq!(warning["generatorURL"], format!("{}/?alert={id}", service.url));
    assert!(alerts.iter().any(|a| a["labels"]["alertname"] == "Watchdog"), "the watchdog fires: {alerts:?}");

    // Routed as configured: the critical burst pages, the warning goes to chat.
    eventually("the routed notifications", || async {
        let (paged, chatted) = (notified(&pager), notified(&chat));
        (paged.contains(&"job_failure_burst".to_string()) && chatted.contains(&"evicted_then_failed".to_string()))
            .then_some(())
    })
    .await;
    assert!(!notified(&pager).contains(&"evicted_then_failed".to_string()), "a warning never pages");

    // Alertmanager killed; an alert fires while it is down; started again, it has all of them.
    let url = service.url.clone();
    am.restart_after(async move {
        post_events(&url, evict_then_fail("j2", 70)).await;
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    })
    .await;
    eventually("every alert in Alertmanager after its restart", || async {
        let alerts = am.alerts().await;
        ["j1", "j2"]
            .iter()
            .all(|j| named(&alerts, "evicted_then_failed", j).is_some())
            .then_some(())
            .filter(|_| named(&alerts, "job_failure_burst", "b1").is_some())
    })
    .await;
    // Prometheus' rules and alerts endpoints, as Grafana reads them.
    let rules = get_json(&format!("{}/prometheus/api/v1/rules", service.url)).await;
    assert_eq!(rules["status"], "success");
    let groups = rules["data"]["groups"].as_array().expect("groups");
    let all: Vec<&Json> = groups.iter().flat_map(|g| g["rules"].as_array().into_iter().flatten()).collect();
    let burst_rule = all.iter().find(|r| r["name"] == "job_failure_burst").expect("the burst rule");
    assert_eq!(burst_rule["type"], "alerting");
    assert_eq!(burst_rule["state"], "firing");
    assert_eq!(burst_rule["labels"]["severity"], "critical");
    assert!(burst_rule["query"].as_str().is_some_and(|q| q.starts_with("rule job_failure_burst {")), "{burst_rule}");
    assert_eq!(burst_rule["alerts"][0]["labels"]["t_job_id"], "b1");
    assert!(groups.iter().any(|g| g["name"] == "job_failure_burst"), "a group per file: {groups:?}");
    let listed = get_json(&format!("{}/prometheus/api/v1/alerts", service.url)).await;
    let listed = listed["data"]["alerts"].as_array().cloned().unwrap_or_default();
    assert_eq!(listed.len(), 3, "j1, j2 and b1 fire: {listed:?}");
    assert!(listed.iter().all(|a| a["state"] == "firing" && a["activeAt"].is_string()), "{listed:?}");

    // A silence made in Alertmanager shows where the console reads it.
    let now = now_and_an_hour_on();
    let silence = serde_json::json!({
        "matchers": [
            {"name": "alertname", "value": "evicted_then_failed", "isRegex": false, "isEqual": true},
            {"name": "t_job_id", "value": "j1", "isRegex": false, "isEqual": true}
        ],
        "startsAt": now.0, "endsAt": now.1, "createdBy": "test", "comment": "maintenance"
    });
    let made: Json = reqwest::Client::new()
        .post(format!("{}/api/v2/silences", am.url))
        .json(&silence)
        .send()
        .await
        .expect("Alertmanager answers")
        .json()
        .await
        .expect("JSON");
    let silence_id = made["silenceID"].as_str().expect("a silence id").to_string();
    let j1 = get_json(&format!("{}/api/v1/alerts?rule=evicted_then_failed&key=t.job_id=j1", service.url)).await;
    let j1 = j1["alerts"][0]["id"].as_str().expect("j1's id").to_string();
    let silenced = eventually("the silence seen by Vigil", || async {
        let got = get_json(&format!("{}/api/v1/alertmanager/silenced", service.url)).await;
        got["silenced"].as_object().filter(|s| !s.is_empty()).cloned()
    })
    .await;
    assert_eq!(silenced.keys().collect::<Vec<_>>(), [&j1], "j1 alone is silenced: {silenced:?}");
    assert_eq!(silenced[&j1], serde_json::json!([silence_id]));

    let m = metrics(&service.url).await;
    let am_label = format!("alertmanager=\"{}\"", am.url);
    assert!(m.lines().any(|l| l.starts_with("vigil_notifications_errors_total") && l.contains(&am_label)), "{m}");
    assert!(m.lines().any(|l| l.starts_with("vigil_notifications_sent_total") && l.contains(&am_label)), "{m}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Firing notifications per alert (its labels), over every receiver.
fn firing_notifications(receivers: &[&Receiver]) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for body in receivers.iter().flat_map(|r| r.bodies()) {
        for a in body["alerts"].as_array().cloned().unwrap_or_default() {
            if a["status"] == "firing" && a["labels"]["alertname"] != "Watchdog" {
                *out.entry(a["labels"].to_string()).or_insert(0) += 1;
            }
        }
    }
    out
}

#[tokio::test]
#[ignore = "needs Alertmanager: run scripts/test.sh"]
async fn vigil_killed_and_restarted_makes_alertmanager_notify_nothing_twice() {
    let dir = temp_dir("alertmanager-kill");
    let rules = rules_in(&dir);
    let (pager, chat) = (Receiver::start(0).await, Receiver::start(0).await);
    // Every alert its own group: a second notification of one would be a duplicate.
    let _am = Alertmanager::start(&dir, &pager.url, &chat.url, "['...']").await;
    let (db, spool, ingest) = (sqlite_url(&dir), dir.join("spool"), dir.join("ingest"));
    let args = [
        "--rules",
        &rules,
        "--database-url",
        &db,
        "--lateness",
        "0s",
        "--checkpoint-interval",
        "1s",
        "--spool-dir",
        spool.to_str().expect("utf-8"),
        "--ingest-log-dir",
        ingest.to_str().expect("utf-8"),
        "--alertmanager-url",
        &_am.url,
        "--alertmanager-resend-delay",
        "1s",
    ];
    let mut service = Service::start(&args);
    post_events(&service.url, evict_then_fail("j1", 0) + &burst("b1", 1)).await;
    eventually("both alerts notified", || async { (firing_notifications(&[&pager, &chat]).len() == 2).then_some(()) })
        .await;
    // More input, acknowledged, then kill -9 at once: whatever the engine had not stored yet
    // comes back from the ingest log and the checkpoint.
    post_events(&service.url, burst("b2", 2) + &evict_then_fail("j2", 130)).await;
    service.kill();
    let service = Service::start(&args);
    eventually("every alert notified", || async { (firing_notifications(&[&pager, &chat]).len() == 4).then_some(()) })
        .await;
    // Several resends and group intervals more.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let counts = firing_notifications(&[&pager, &chat]);
    assert_eq!(counts.len(), 4, "{counts:?}");
    assert!(counts.values().all(|n| *n == 1), "an alert notified twice: {counts:?}");
    let stored = get_json(&format!("{}/api/v1/alerts", service.url)).await;
    assert_eq!(stored["alerts"].as_array().map(Vec::len), Some(4), "{stored}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A group of two members (`--kafka-join-group`) sending to one Alertmanager, one member killed
/// with `kill -9` while its alerts fire: the other takes its partitions over once Kafka's
/// session timeout (6 s) has passed and, with them, the resends of their firing alerts, before
/// Alertmanager's `endsAt` (four resend delays, 16 s) passes. So Alertmanager never sees an
/// alert resolved: each is notified once, none resolved.
#[tokio::test]
#[ignore = "needs Alertmanager, Apache Kafka and PostgreSQL: run scripts/test.sh"]
async fn a_group_member_killed_makes_alertmanager_notify_nothing_twice() {
    let dir = temp_dir("alertmanager-group");
    let rules = rules_in(&dir);
    let (pager, chat) = (Receiver::start(0).await, Receiver::start(0).await);
    let am = Alertmanager::start(&dir, &pager.url, &chat.url, "['...']").await;
    let brokers = kafka_brokers();
    let topic = unique("group_alertmanager");
    vigil::service::kafka::ensure_topics(&brokers, std::slice::from_ref(&topic), 4, &Default::default())
        .await
        .expect("topic");
    let (db_name, db_url) = create_database().await;
    let mut args = member_args(&rules, &db_url, &brokers, &unique("group"));
    let streams = format!("task_event={topic}");
    let more = ["--topic", &streams, "--checkpoint-interval", "1s", "--alertmanager-url", &am.url];
    args.extend(more.iter().chain(&["--alertmanager-resend-delay", "4s"]).map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut members = [Service::start(&args), Service::start(&args)];
    let lines = |text: String| text.lines().map(str::to_string).collect::<Vec<_>>();
    // Alerts that stay firing: time moves to the newest event at most, which the burst's
    // window and the evictions' day of keep_firing_for outlast.
    let first = lines(evict_then_fail("j1", 0) + &burst("b2", 2) + &evict_then_fail("j2", 130));
    produce(&topic, &first.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while firing_notifications(&[&pager, &chat]).len() < 3 {
        if std::time::Instant::now() > deadline {
            let stored = get_json(&format!("{}/api/v1/alerts", members[0].url)).await;
            let logs = members.iter().map(|s| s.log()).collect::<Vec<_>>().join("\n----\n");
            panic!("notified {:?}; stored {stored}\n{logs}", firing_notifications(&[&pager, &chat]));
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    // Each firing alert is resent by one member: the owner of its keyed partition.
    eventually("each firing alert resent by one member", || async {
        let mut resent = 0.0;
        for m in &members {
            resent += sum_of(&metrics(&m.url).await, "vigil_notifications_firing", |_| true);
        }
        (resent == 3.0).then_some(())
    })
    .await;
    members[1].kill();
    // Past the session timeout, the rebalance, and Alertmanager's `endsAt` twice over.
    tokio::time::sleep(std::time::Duration::from_secs(35)).await;
    let counts = firing_notifications(&[&pager, &chat]);
    assert_eq!(counts.len(), 3, "{counts:?}");
    assert!(counts.values().all(|n| *n == 1), "an alert notified twice: {counts:?}");
    let resolved: Vec<Json> = [&pager, &chat]
        .iter()
        .flat_map(|r| r.bodies())
        .flat_map(|b| b["alerts"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["status"] == "resolved")
        .collect();
    assert!(resolved.is_empty(), "Alertmanager resolved alerts that still fire: {resolved:?}");
    let resent = sum_of(&metrics(&members[0].url).await, "vigil_notifications_firing", |_| true);
    assert_eq!(resent, 3.0, "the survivor resends every firing alert");
    drop(members);
    drop_database(&db_name).await;
    std::fs::remove_dir_all(&dir).ok();
}
