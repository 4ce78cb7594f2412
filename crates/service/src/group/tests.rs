//! A member's keyed partitions on several threads.

use super::keyed::{KeyedPartition, Progress, Tally};
use super::work;
use crate::store::Fence;
use std::collections::BTreeMap;
use vigil_engine::engine::{EngineConfig, Shard};

/// `count` keyed partitions over the shipped rules, each fed every sample event (a partition's
/// engine keeps its own key groups only) and then a progress report past the last of them.
fn partitions(count: usize) -> BTreeMap<i32, KeyedPartition> {
    let inputs = vigil_lang::ruleset::read_files_under(&crate::testing::repo_file("rules")).expect("rules folder");
    let plans: Vec<_> = vigil_lang::compile_all(&inputs).into_iter().flat_map(|c| c.plans).collect();
    let lines = std::fs::read_to_string(crate::testing::repo_file("samples/datacenter.jsonl")).expect("sample events");
    let last = lines.lines().count() as i64;
    (0..count)
        .map(|index| {
            let config = EngineConfig { shard: Shard { index, count }, ..EngineConfig::default() };
            let fence = Fence { group: "g".into(), partition: index as i32, epoch: 1 };
            let mut p = KeyedPartition::new(plans.clone(), &config, fence, None);
            for (offset, line) in lines.lines().enumerate() {
                p.queue_event("t/0", offset as i64, None, line.as_bytes(), false);
            }
            p.queue_event("t/0", last, None, b"{\"stream\":\"metric\"", false);
            let end = Progress { upstream: "t/0".into(), ts: Some(i64::MAX / 8), idle: false, next: None, epoch: 1 };
            p.queue_progress(serde_json::to_string(&[end]).expect("report").as_bytes());
            (index as i32, p)
        })
        .collect()
}

/// Every partition's alerts (ids and transitions, in each partition's order) and tally.
fn run(workers: usize) -> Vec<(Vec<(String, vigil_engine::alert::Status)>, Tally)> {
    let mut keyed = partitions(4);
    work(&mut keyed, &["t/0".to_string()], &Default::default(), workers);
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
    restored.queue_event("t/0", 5992, None, line, false);
    restored.queue_event("t/0", 5994, None, line, false);
    restored.work(&[], &Default::default());
    let tally = restored.tally();
    assert_eq!((tally.duplicates, tally.taken), (1, 1), "the checkpoint holds the last offset taken");
}

/// Queues `lines` as the events of input partition `t/0` from offset `from`, then its
/// forwarder's report of the newest time among them (of a time past everything when `end`).
fn fed(p: &mut KeyedPartition, lines: &[&str], from: usize, end: bool) {
    let ts = |line: &str| vigil_engine::event::decode(line, None).map(|e| e.ts).ok();
    for (n, line) in lines.iter().enumerate() {
        p.queue_event("t/0", (from + n) as i64, None, line.as_bytes(), false);
    }
    let newest = if end { Some(i64::MAX / 8) } else { lines.iter().filter_map(|l| ts(l)).max() };
    let report = Progress { upstream: "t/0".into(), ts: newest, idle: false, next: None, epoch: 1 };
    p.queue_progress(serde_json::to_string(&[report]).expect("report").as_bytes());
}

/// Runs the partitions until no stage-one record is left to deliver: each partition's
/// summaries go to their stage two, and its reports to every partition, in the order sent.
fn run_stages(keyed: &mut BTreeMap<i32, KeyedPartition>) -> Vec<(Option<i32>, bool, Vec<u8>)> {
    let mut sent = Vec::new();
    loop {
        work(keyed, &["t/0".to_string()], &Default::default(), 2);
        let mut sends = Vec::new();
        for p in keyed.values_mut() {
            sends.extend(p.take_outgoing().into_iter().map(|(to, s)| (Some(to), false, s)));
            sends.extend(p.stage_report().map(|r| (None, true, r)));
        }
        if sends.is_empty() {
            return sent;
        }
        deliver(keyed, &sends);
        sent.extend(sends);
    }
}

fn deliver(keyed: &mut BTreeMap<i32, KeyedPartition>, sends: &[(Option<i32>, bool, Vec<u8>)]) {
    for (to, report, bytes) in sends {
        for (n, p) in keyed.iter_mut() {
            if to.is_none_or(|t| t == *n) {
                if *report {
                    p.queue_stage_report(bytes);
                } else {
                    p.queue_summary(bytes);
                }
            }
        }
    }
}

/// Every alert of the partitions, as (rule, id, status), sorted.
fn alerts(keyed: &mut BTreeMap<i32, KeyedPartition>) -> Vec<(String, String, vigil_engine::alert::Status)> {
    let mut out: Vec<_> =
        keyed.values_mut().flat_map(|p| p.out.drain(..)).map(|a| (a.rule.to_string(), a.id, a.status)).collect();
    out.sort_by(|a, b| (&a.0, &a.1, a.2 as u8).cmp(&(&b.0, &b.1, b.2 as u8)));
    out
}

fn two_stage_partitions(count: usize) -> BTreeMap<i32, KeyedPartition> {
    staged_over("rules", count, |_| None)
}

/// `count` keyed partitions over the rules under `rules`, fleet-wide ones in two stages, each
/// restored from what `checkpoint` gives for it.
fn staged_over(
    rules: &str,
    count: usize,
    checkpoint: impl Fn(i32) -> Option<crate::store::PartitionCheckpoint>,
) -> BTreeMap<i32, KeyedPartition> {
    let inputs = vigil_lang::ruleset::read_files_under(&crate::testing::repo_file(rules)).expect("rules folder");
    let plans: Vec<_> = vigil_lang::compile_all(&inputs).into_iter().flat_map(|c| c.plans).collect();
    (0..count)
        .map(|index| {
            let config = EngineConfig { shard: Shard { index, count }, two_stage: true, ..EngineConfig::default() };
            let fence = Fence { group: "g".into(), partition: index as i32, epoch: 1 };
            let restored = checkpoint(index as i32);
            (index as i32, KeyedPartition::new(plans.clone(), &config, fence, restored.as_ref()))
        })
        .collect()
}

/// Keyed partitions' checkpoints of the build before the runtime restore and go on with the
/// alerts of the uninterrupted run. `tests/data/checkpoint/keyed` holds what 7409cea wrote for
/// three partitions, fleet-wide rules in two stages, after the first half of the sample, over
/// the rules copied in `tests/data/checkpoint/engines/rules`.
#[test]
fn keyed_checkpoints_of_the_build_before_restore_and_go_on() {
    const RULES: &str = "tests/data/checkpoint/engines/rules";
    let text = std::fs::read_to_string(crate::testing::repo_file("samples/datacenter.jsonl")).expect("sample events");
    let lines: Vec<&str> = text.lines().collect();
    let (first, second) = lines.split_at(lines.len() / 2);
    let mut whole = staged_over(RULES, 3, |_| None);
    for p in whole.values_mut() {
        fed(p, &lines, 0, true);
    }
    run_stages(&mut whole);
    let want = alerts(&mut whole);
    assert!(want.len() > 10, "the sample raises alerts: {want:?}");

    let mut before = staged_over(RULES, 3, |_| None);
    for p in before.values_mut() {
        fed(p, first, 0, false);
    }
    run_stages(&mut before);
    let mut got = alerts(&mut before);
    let stored = |n: i32| {
        let at = |ext: &str| crate::testing::repo_file(&format!("tests/data/checkpoint/keyed/partition-{n}.{ext}"));
        let snapshot = std::fs::read(at("bin")).expect("the stored snapshot");
        let state = std::fs::read_to_string(at("json")).expect("the stored state");
        Some(crate::store::PartitionCheckpoint { snapshot, state })
    };
    let mut restored = staged_over(RULES, 3, stored);
    for p in restored.values_mut() {
        // The first half's last line again: taken before the checkpoint, so a duplicate.
        p.queue_event("t/0", first.len() as i64 - 1, None, first[first.len() - 1].as_bytes(), false);
        fed(p, second, first.len(), true);
    }
    run_stages(&mut restored);
    for p in restored.values_mut() {
        assert_eq!(p.tally().duplicates, 1, "the checkpoint holds the last offset taken");
    }
    got.extend(alerts(&mut restored));
    got.sort_by(|a, b| (&a.0, &a.1, a.2 as u8).cmp(&(&b.0, &b.1, b.2 as u8)));
    assert_eq!(got, want);
}

#[test]
fn fleet_wide_rules_judged_in_a_second_stage_raise_the_alerts_of_one_engine() {
    let mut whole = partitions(4);
    work(&mut whole, &["t/0".to_string()], &Default::default(), 1);
    let want = alerts(&mut whole);
    let outliers = want.iter().filter(|(rule, ..)| rule == "machine_load_outlier" || rule == "straggler_task").count();
    assert!(outliers >= 2, "the sample raises fleet-wide outliers: {want:?}");

    let text = std::fs::read_to_string(crate::testing::repo_file("samples/datacenter.jsonl")).expect("sample events");
    let lines: Vec<&str> = text.lines().collect();
    let mut staged = two_stage_partitions(4);
    for p in staged.values_mut() {
        fed(p, &lines, 0, true);
    }
    let sent = run_stages(&mut staged);
    let summaries = sent.iter().filter(|(_, report, _)| !report).count();
    assert!(summaries > 10, "stage one sent summaries: {summaries}");
    let targets: std::collections::BTreeSet<_> = sent.iter().filter_map(|(to, ..)| *to).collect();
    assert!(targets.len() >= 2, "to the stage two of more than one peer group: {targets:?}");
    assert_eq!(alerts(&mut staged), want);
}

#[test]
fn a_second_stage_restored_from_its_checkpoint_takes_each_summary_once() {
    let mut whole = partitions(3);
    work(&mut whole, &["t/0".to_string()], &Default::default(), 1);
    let want = alerts(&mut whole);

    let text = std::fs::read_to_string(crate::testing::repo_file("samples/datacenter.jsonl")).expect("sample events");
    let lines: Vec<&str> = text.lines().collect();
    let (first, second) = lines.split_at(lines.len() / 2);
    let mut staged = two_stage_partitions(3);
    for p in staged.values_mut() {
        fed(p, first, 0, false);
    }
    let sent = run_stages(&mut staged);
    let mut got = alerts(&mut staged);
    // Every partition is restored from its checkpoint, as by the next owner after a hand-over.
    let mut restored: BTreeMap<i32, KeyedPartition> = BTreeMap::new();
    for (n, p) in staged.iter_mut() {
        let checkpoint = p.checkpoint().expect("checkpoint");
        let plans = vigil_lang::compile_all(
            &vigil_lang::ruleset::read_files_under(&crate::testing::repo_file("rules")).expect("rules"),
        )
        .into_iter()
        .flat_map(|c| c.plans)
        .collect();
        let config =
            EngineConfig { shard: Shard { index: *n as usize, count: 3 }, two_stage: true, ..Default::default() };
        restored.insert(*n, KeyedPartition::new(plans, &config, p.fence.clone(), Some(&checkpoint)));
    }
    // What the sources sent before comes again (a source restored from an older checkpoint
    // sends its summaries again): none is taken twice.
    deliver(&mut restored, &sent);
    for p in restored.values_mut() {
        p.work(&["t/0".to_string()], &Default::default());
        let tally = p.tally();
        assert_eq!(tally.summaries, 0, "summaries sent again are not taken");
    }
    for p in restored.values_mut() {
        fed(p, second, first.len(), true);
    }
    run_stages(&mut restored);
    got.extend(alerts(&mut restored));
    got.sort_by(|a, b| (&a.0, &a.1, a.2 as u8).cmp(&(&b.0, &b.1, b.2 as u8)));
    assert_eq!(got, want);
}

/// The value of a counter or gauge of `rendered` (the text exposition), summed over the series
/// whose labels hold `with`.
fn metric(rendered: &str, name: &str, with: &str) -> f64 {
    rendered
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']) && l.contains(with))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn a_member_keeps_its_keyed_partitions_under_the_state_budget_and_says_so() {
    let mut keyed = partitions(2);
    work(&mut keyed, &["t/0".to_string()], &Default::default(), 1);
    keyed.values_mut().for_each(|p| p.out.clear());
    let telemetry = crate::telemetry::Telemetry::new();
    let health = crate::engine_loop::EngineHealth::default();
    let mut gauges = super::state::StateGauges::default();
    assert!(gauges.due() && !gauges.due(), "once a second");

    gauges.update(&mut keyed, usize::MAX, &telemetry, &health);
    let held = telemetry.render();
    let before = metric(&held, "vigil_state_bytes", "");
    assert!(before > 0.0, "the partitions' state is estimated");
    assert_eq!(before as u64, health.state_bytes.load(std::sync::atomic::Ordering::Relaxed));
    assert!(metric(&held, "vigil_live_keys", "") > 0.0, "{held}");
    assert_eq!(metric(&held, "vigil_evicted_keys_total", "memory"), 0.0);

    gauges.update(&mut keyed, before as usize / 4, &telemetry, &health);
    let squeezed = telemetry.render();
    let after = metric(&squeezed, "vigil_state_bytes", "");
    assert!(after < before, "{after} bytes kept of {before}");
    assert!(metric(&squeezed, "vigil_evicted_keys_total", "memory") > 0.0, "{squeezed}");
    let told = keyed.values().flat_map(|p| &p.out).filter(|a| &*a.rule == vigil_engine::engine::STATE_EVICTED_RULE);
    assert!(told.count() > 0, "the partitions say which rules went partly blind");
}

#[test]
fn a_partition_holding_the_most_alerts_pauses_until_it_holds_none() {
    use super::out::{HeldBack, Turns};
    let mut keyed = partitions(2);
    work(&mut keyed, &["t/0".to_string()], &Default::default(), 1);
    let alerts: Vec<_> = keyed.values_mut().flat_map(|p| std::mem::take(&mut p.out)).collect();
    assert!(alerts.len() >= 3, "{}", alerts.len());
    let mut held = HeldBack::default();
    fn p1(keyed: &mut BTreeMap<i32, KeyedPartition>) -> &mut KeyedPartition {
        keyed.get_mut(&1).expect("partition 1")
    }
    p1(&mut keyed).out = alerts[..2].to_vec();
    assert_eq!(held.follow(&keyed, &[], 3), Turns::default(), "fewer than the most");
    p1(&mut keyed).out = alerts[..3].to_vec();
    assert_eq!(held.follow(&keyed, &[], 3), Turns { pause: vec![1], resume: vec![] });
    assert_eq!(held.follow(&keyed, &[], 3), Turns::default(), "paused once");
    p1(&mut keyed).out.truncate(1);
    assert_eq!(held.follow(&keyed, &[], 3), Turns::default(), "paused until every alert is handed on");
    p1(&mut keyed).out.clear();
    assert_eq!(held.follow(&keyed, &[], 3), Turns { pause: vec![], resume: vec![1] });
    assert_eq!(held.len(), 0);
    // Claimed again while paused (a new epoch): the claim resumed it, not this.
    let p0 = keyed.get_mut(&0).expect("partition 0");
    p0.out = alerts[..3].to_vec();
    assert_eq!(held.follow(&keyed, &[], 3).pause, vec![0]);
    let p0 = keyed.get_mut(&0).expect("partition 0");
    p0.fence.epoch = 2;
    p0.out.clear();
    assert_eq!(held.follow(&keyed, &[], 3), Turns::default());
    assert_eq!(held.len(), 0);
    // Still starting: its claim holds it paused until it is sought.
    keyed.get_mut(&0).expect("partition 0").out = alerts[..3].to_vec();
    assert_eq!(held.follow(&keyed, &[0], 3), Turns::default());
}
