//! A group's warm start (`--kafka-join-group` with `--warm-from-prometheus`), against Apache
//! Kafka, PostgreSQL and Debian's Prometheus: each member warms the keyed partitions it claims
//! without a checkpoint, from a month of three NAB series (`tests/backtest.rs`), and the group
//! then judges live samples, remote-written to one member and forwarded through the group's
//! topic, from the first minute.

use crate::backtest::{history_and_live, prometheus, remote_write, stored, FAULTED};
use crate::support::*;
use std::time::Duration;

#[tokio::test]
#[ignore = "needs Apache Kafka, PostgreSQL, Debian's prometheus and promtool: run scripts/test.sh"]
async fn a_group_warms_the_partitions_it_claims_and_judges_from_the_first_minute() {
    let (history, live) = history_and_live();
    let dir = temp_dir("group_warm");
    let p = prometheus(&dir, &history, "  external_labels:\n    cluster: test\n    __replica__: a\n");

    let brokers = kafka_brokers();
    let topic = unique("group_warm_input");
    vigil::service::kafka::ensure_topics(&brokers, std::slice::from_ref(&topic), 12, &Default::default())
        .await
        .expect("input topic");
    let (db_name, db_url) = create_database().await;
    let rules = crate::group::copy_rules(&std::path::Path::new(&rules_dir()).join("metrics"));
    let group = unique("group_warm");
    let mut args = crate::group::member_args(&rules.display().to_string(), &db_url, &brokers, &group);
    let warm = ["--warm-from-prometheus", &p.url, "--warm-lookback", "30d", "--warm-step", "5min"];
    args.extend(warm.map(String::from));
    args.extend(["--warm-match".to_string(), r#"{job="cloudwatch"}"#.to_string()]);
    args.extend(["--checkpoint-interval", "1s"].map(String::from));
    // Every stream on the test's own topic, so that the group's input partitions are its 12
    // whatever default topics (`task_usage`, ...) other tests have made on the broker.
    for stream in ["task_event", "task_usage", "machine_event", "metric"] {
        args.extend(["--topic".to_string(), format!("{stream}={topic}")]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    // The second member joins while the first warms what it claimed, or after: it warms the
    // partitions it takes over unless the first has stored their warmed checkpoints already.
    let a = Service::start(&args);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let b = Service::start(&args);
    let members = [a, b];
    crate::group::settled(&members, 12.0).await;
    let logs = || members.iter().map(|m| m.log()).collect::<Vec<_>>().join("\n----\n");
    let log = logs();
    assert!(log.contains("warm start done"), "{log}");

    for step in &live {
        remote_write(&members[0].url, step).await;
    }
    let caught = eventually_within(Duration::from_secs(120), "the fault caught after the warm start", || async {
        let alerts = stored(&members[0].url).await;
        alerts.iter().any(|a| a.contains("metric_deviation") && a.contains(FAULTED)).then_some(alerts)
    })
    .await;
    let others: Vec<&String> = caught.iter().filter(|a| !a.contains(FAULTED)).collect();
    assert!(others.is_empty(), "the healthy hosts raise nothing: {others:?}\n{}", logs());
    drop(members);
    drop_database(&db_name).await;
    std::fs::remove_dir_all(&dir).ok();
}
