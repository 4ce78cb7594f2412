//! A member's keyed partitions on several threads.

use super::keyed::{KeyedPartition, Progress, Tally};
use super::work;
use crate::engine::{EngineConfig, Shard};
use crate::service::store::Fence;
use std::collections::BTreeMap;

/// `count` keyed partitions over the shipped rules, each fed every sample event (a partition's
/// engine keeps its own key groups only) and then a progress report past the last of them.
fn partitions(count: usize) -> BTreeMap<i32, KeyedPartition> {
    let inputs = crate::read_rule_files(std::path::Path::new("rules")).expect("rules folder");
    let plans: Vec<_> = crate::compile_all(&inputs).into_iter().flat_map(|c| c.plans).collect();
    let lines = std::fs::read_to_string("samples/datacenter.jsonl").expect("sample events");
    let last = lines.lines().count() as i64;
    (0..count)
        .map(|index| {
            let config = EngineConfig { shard: Shard { index, count }, ..EngineConfig::default() };
            let fence = Fence { group: "g".into(), partition: index as i32, epoch: 1 };
            let mut p = KeyedPartition::new(plans.clone(), &config, fence, None);
            for (offset, line) in lines.lines().enumerate() {
                p.queue_event("t/0", offset as i64, None, line.as_bytes());
            }
            p.queue_event("t/0", last, None, b"{\"stream\":\"metric\"");
            let end = Progress { upstream: "t/0".into(), ts: Some(i64::MAX / 8), idle: false, epoch: 1 };
            p.queue_progress(serde_json::to_string(&[end]).expect("report").as_bytes());
            (index as i32, p)
        })
        .collect()
}

/// Every partition's alerts (ids and transitions, in each partition's order) and tally.
fn run(workers: usize) -> Vec<(Vec<(String, crate::alert::Status)>, Tally)> {
    let mut keyed = partitions(4);
    work(&mut keyed, &["t/0".to_string()], workers);
    keyed
        .values_mut()
        .map(|p| {
            assert_eq!(p.queued(), 0, "every queued record is taken");
            (p.out.iter().map(|a| (a.id.clone(), a.status)).collect(), p.tally())
        })
        .collect()
}

#[test]
fn partitions_run_on_threads_raise_the_alerts_of_one_thread() {
    let one = run(1);
    let alerts: usize = one.iter().map(|(a, _)| a.len()).sum();
    assert!(alerts >= 10, "the sample raises alerts: {alerts}");
    assert!(one.iter().filter(|(a, _)| !a.is_empty()).count() >= 2, "in more than one partition");
    for (_, tally) in &one {
        assert_eq!(tally.taken, 5993);
        assert_eq!(tally.unreadable, 1);
    }
    assert_eq!(run(2), one);
    assert_eq!(run(3), one);
}

#[test]
fn a_checkpoint_takes_what_was_read_first() {
    let mut keyed = partitions(1);
    let p = keyed.get_mut(&0).expect("partition");
    let checkpoint = p.checkpoint().expect("checkpoint");
    assert_eq!(p.queued(), 0);
    assert_eq!(p.tally().taken, 5993);
    let fence = p.fence.clone();
    let mut restored = KeyedPartition::new(Vec::new(), &EngineConfig::default(), fence, Some(&checkpoint));
    let line = br#"{"stream":"metric","ts":1767225600000,"host":"h","name":"m","value":1}"#;
    restored.queue_event("t/0", 5992, None, line);
    restored.queue_event("t/0", 5994, None, line);
    restored.work(&[]);
    let tally = restored.tally();
    assert_eq!((tally.duplicates, tally.taken), (1, 1), "the checkpoint holds the last offset taken");
}
