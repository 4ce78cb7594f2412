//! A checkpoint written by an earlier build restores in this one. `tests/data/checkpoint/`
//! holds the state of the engine after the first 3,000 lines of the bundled sample, over a copy
//! of the rules shipped when it was written; it was written by the build that made operators
//! keep their state under the structure of their rules rather than under how a plan prints, so
//! a later change to the printing (or to anything but what a rule keeps) must leave it usable.
//! `VIGIL_BLESS=1` writes it again, for a deliberate change to the checkpoint's format.

use vigil::alert::Alert;
use vigil::engine::{Engine, EngineConfig, Snapshot};
use vigil::runtime::Runtime;

const CUT: usize = 3_000;
const SNAPSHOT: &str = "tests/data/checkpoint/snapshot-v2.bin";

fn engine() -> Engine {
    let set = vigil::ruleset::RuleSet::load(&["tests/data/checkpoint/rules".into()]).expect("rules");
    assert!(set.is_ok(), "{}", set.render(false));
    Engine::new(set.plans(), EngineConfig::default())
}

fn events() -> Vec<vigil::event::Event> {
    let text = std::fs::read_to_string("samples/datacenter.jsonl").expect("sample");
    text.lines().map(|l| vigil::event::decode(l, None).expect("an event")).collect()
}

/// The alerts as JSON, without what later builds added to evidence: an alert firing at the
/// checkpoint keeps the evidence the earlier build gave it (outliers' `peers` came later).
fn view(alerts: &[Alert]) -> Vec<String> {
    alerts
        .iter()
        .map(|a| {
            let mut json = serde_json::to_value(a).expect("json");
            for item in json["evidence"].as_array_mut().into_iter().flatten() {
                if let Some(cluster) = item.get_mut("cluster").and_then(|c| c.as_object_mut()) {
                    cluster.remove("peers");
                }
            }
            json.to_string()
        })
        .collect()
}

#[test]
fn a_checkpoint_of_an_earlier_build_restores_and_continues_like_the_uninterrupted_run() {
    let events = events();
    let mut whole = engine();
    let mut before = Vec::new();
    for e in &events[..CUT] {
        whole.push(e.clone(), &mut before);
    }
    if std::env::var_os("VIGIL_BLESS").is_some() {
        let bytes = whole.snapshot().and_then(|s| s.to_bytes()).expect("snapshot");
        std::fs::write(SNAPSHOT, bytes).expect("write the snapshot");
    }
    let mut after = Vec::new();
    for e in &events[CUT..] {
        whole.push(e.clone(), &mut after);
    }
    whole.flush(&mut after);

    let bytes = std::fs::read(SNAPSHOT).expect("the stored snapshot");
    let mut restored = engine();
    let mut rules = restored.restore(Snapshot::from_bytes(&bytes).expect("readable")).expect("restores");
    rules.sort();
    // The snapshot was written when a metric series was its host and name; it is now its labels
    // too (key version 1 of `metric`), so the rules that key by a series start empty, as does
    // `host_down`, written after it, and every other rule gets its state back.
    let series_rules = ["host_silent", "metric_deviation", "metric_saturation", "metric_stuck", "host_down"];
    let mut kept: Vec<String> = engine().plans().iter().map(|p| p.name.clone()).collect();
    kept.retain(|r| !series_rules.contains(&r.as_str()));
    kept.sort();
    assert_eq!(rules, kept);
    let mut continued = Vec::new();
    for e in &events[CUT..] {
        restored.push(e.clone(), &mut continued);
    }
    restored.flush(&mut continued);
    let of_kept = |alerts: &[Alert]| -> Vec<String> {
        let alerts: Vec<Alert> = alerts.iter().filter(|a| kept.iter().any(|r| **r == *a.rule)).cloned().collect();
        view(&alerts)
    };
    assert!(!of_kept(&after).is_empty(), "the rest of the sample raises alerts");
    assert_eq!(of_kept(&continued), of_kept(&after));
}

/// The shipped rules and the sample through a [`Runtime`]: the alerts, in full and sorted, of
/// pushing `events` in batches of 500.
fn through(runtime: &mut Runtime, events: &[vigil::event::Event], alerts: &mut Vec<Alert>) {
    for batch in events.chunks(500) {
        let late = runtime.push(batch.to_vec(), Vec::new(), alerts);
        assert_eq!(late, 0, "the sorted sample has no late event");
    }
}

/// One engine over the sample, in batches of 500: its alerts up to the cut, and from it on
/// (the end of input's included).
fn uninterrupted(set: &vigil::ruleset::RuleSet, events: &[vigil::event::Event]) -> (Vec<Alert>, Vec<Alert>) {
    let (mut before, mut after) = (Vec::new(), Vec::new());
    let mut one = Runtime::new(set.plans(), EngineConfig::default(), 1, 1);
    through(&mut one, &events[..CUT], &mut before);
    through(&mut one, &events[CUT..], &mut after);
    one.flush(&mut after);
    (before, after)
}

/// `restarted` given the sample from the cut on, after `alerts`: every alert, sorted.
fn go_on(restarted: &mut Runtime, events: &[vigil::event::Event], mut alerts: Vec<Alert>) -> Vec<String> {
    through(restarted, &events[CUT..], &mut alerts);
    restarted.flush(&mut alerts);
    sorted(&mut alerts)
}

fn sorted(alerts: &mut Vec<Alert>) -> Vec<String> {
    let mut text: Vec<String> = alerts.drain(..).map(|a| serde_json::to_string(&a).expect("json")).collect();
    text.sort();
    text
}

/// Four keyed partitions checkpointed on two threads go on on three, and on one, with the
/// alerts of one engine that saw the sample whole: state follows the partitions, not the
/// threads, and the fleet-wide rules' stage two is in the checkpoint. Asked for another number
/// of partitions, the restart runs the checkpoint's.
#[test]
fn keyed_partitions_restore_on_any_number_of_threads() {
    let set = vigil::ruleset::RuleSet::load(&["rules".into()]).expect("rules");
    let events = events();
    let config = EngineConfig::default();
    let (mut whole, after) = uninterrupted(&set, &events);
    whole.extend(after);
    assert!(whole.len() > 10, "the sample raises alerts");
    let after_cut = |a: &Alert| a.detected_at > events[CUT].ts;
    let judged =
        whole.iter().filter(|a| after_cut(a) && ["straggler_task", "machine_load_outlier"].contains(&&*a.rule));
    assert!(judged.count() > 0, "fleet-wide rules, judged in a stage two, fire after the checkpoint");
    let whole = sorted(&mut whole);

    let mut alerts = Vec::new();
    let mut four = Runtime::new(set.plans(), config.clone(), 4, 2);
    through(&mut four, &events[..CUT], &mut alerts);
    let bytes = four.checkpoint(&mut alerts).expect("a checkpoint");
    drop(four);
    for (asked, threads) in [(1, 3), (8, 1)] {
        let mut restarted = Runtime::new(set.plans(), config.clone(), asked, threads);
        let restored = restarted.restore(&bytes).expect("restored");
        assert_eq!((restarted.partitions(), restarted.count()), (4, threads));
        assert_eq!(restored.len(), set.plans().len(), "{restored:?}");
        assert_eq!(go_on(&mut restarted, &events, alerts.clone()), whole, "on {threads} threads");
    }
}

/// Checkpoints of the build before the runtime restore as records of as many partitions, on
/// any number of threads, and go on like the uninterrupted run. `tests/data/checkpoint/engines`
/// holds them: the state of that build's `Engines` with 1 worker (one engine's bare snapshot)
/// and 2 workers (`VGW1`), after the first 3,000 lines of the sample pushed in batches of 500,
/// over a copy of the rules shipped then (written by 7409cea).
#[test]
fn checkpoints_of_the_build_before_the_runtime_restore_and_go_on() {
    let set = vigil::ruleset::RuleSet::load(&["tests/data/checkpoint/engines/rules".into()]).expect("rules");
    assert!(set.is_ok(), "{}", set.render(false));
    let events = events();
    let config = EngineConfig::default();
    let (_, mut whole) = uninterrupted(&set, &events);
    assert!(whole.len() > 10, "the rest of the sample raises alerts");
    let whole = sorted(&mut whole);
    for (file, partitions, threads) in [("workers-1.bin", 1, 2), ("workers-2.bin", 2, 1), ("workers-2.bin", 2, 2)] {
        let bytes = std::fs::read(format!("tests/data/checkpoint/engines/{file}")).expect("the stored checkpoint");
        let mut restarted = Runtime::new(set.plans(), config.clone(), 1, threads);
        let mut restored = restarted.restore(&bytes).expect("restores");
        assert_eq!(restarted.partitions(), partitions, "{file}");
        restored.sort();
        let mut names: Vec<String> = set.plans().iter().map(|p| p.name.clone()).collect();
        names.sort();
        assert_eq!(restored, names, "{file}: every rule's state restored");
        assert_eq!(go_on(&mut restarted, &events, Vec::new()), whole, "{file} on {threads} threads");
    }
}

/// With `--checkpoint-layout previous`, the checkpoint is what the build before the record
/// reads, read here as it read it: one engine's snapshot, or `VGW1` and one snapshot per
/// partition, every one with the same time, as that build's workers (which all saw every
/// event) had it. It restores here too, and goes on like the uninterrupted run.
#[test]
fn the_previous_layout_is_what_the_build_before_reads() {
    let set = vigil::ruleset::RuleSet::load(&["rules".into()]).expect("rules");
    let events = events();
    let config = EngineConfig::default();
    let (mut whole, after) = uninterrupted(&set, &events);
    whole.extend(after);
    let whole = sorted(&mut whole);
    for partitions in [1, 3] {
        let mut alerts = Vec::new();
        let mut before = Runtime::previous(set.plans(), config.clone(), partitions, 2);
        through(&mut before, &events[..CUT], &mut alerts);
        let bytes = before.checkpoint(&mut alerts).expect("a checkpoint");
        drop(before);
        let parts: Vec<serde_bytes::ByteBuf> = match bytes.strip_prefix(b"VGW1") {
            Some(rest) => postcard::from_bytes(rest).expect("a list of snapshots"),
            None => vec![serde_bytes::ByteBuf::from(bytes.clone())],
        };
        assert_eq!(parts.len(), partitions);
        let times: std::collections::BTreeSet<_> =
            parts.iter().map(|p| Snapshot::from_bytes(p).expect("a snapshot").time()).collect();
        assert_eq!(times.len(), 1, "every snapshot has the same time: {times:?}");
        let mut after = Runtime::new(set.plans(), config.clone(), 16, 2);
        after.restore(&bytes).expect("restores");
        assert_eq!(after.partitions(), partitions);
        assert_eq!(go_on(&mut after, &events, alerts), whole, "{partitions} partitions");
    }
}

/// Records restore on any number of threads and go on like the uninterrupted run.
/// `tests/data/checkpoint/records` holds one written by d7638cb: four keyed partitions and the
/// fleet-wide rules' stage two beside them (record version 1), after the first 3,000 lines of
/// the sample pushed in batches of 500 to `Runtime::new(plans, 4 partitions, 2 threads)`, over
/// a copy of the rules shipped then. It is never written again: a later build must read it.
#[test]
fn records_of_an_earlier_build_restore_and_go_on() {
    const RECORD: &str = "tests/data/checkpoint/records/record-v1-4.bin";
    let set = vigil::ruleset::RuleSet::load(&["tests/data/checkpoint/records/rules".into()]).expect("rules");
    assert!(set.is_ok(), "{}", set.render(false));
    let events = events();
    let config = EngineConfig::default();
    let (_, mut whole) = uninterrupted(&set, &events);
    let judged = whole.iter().filter(|a| ["straggler_task", "machine_load_outlier"].contains(&&*a.rule)).count();
    assert!(judged > 0, "fleet-wide rules, judged in a stage two, fire after the checkpoint");
    let whole = sorted(&mut whole);
    let bytes = std::fs::read(RECORD).expect("the stored record");
    for threads in [1, 2, 3] {
        let mut restarted = Runtime::new(set.plans(), config.clone(), 1, threads);
        let mut restored = restarted.restore(&bytes).expect("restores");
        assert_eq!(restarted.partitions(), 4);
        restored.sort();
        let mut names: Vec<String> = set.plans().iter().map(|p| p.name.clone()).collect();
        names.sort();
        assert_eq!(restored, names, "every rule's state restored");
        assert_eq!(go_on(&mut restarted, &events, Vec::new()), whole, "on {threads} threads");
    }
}
