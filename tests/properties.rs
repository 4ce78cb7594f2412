//! Properties of the engine, for all shipped rules running together:
//! - any arrival order within the allowed lateness yields exactly the alerts of sorted input;
//! - restoring a snapshot taken at any point and feeding the rest of the input yields exactly the
//!   alerts of the uninterrupted run.

use proptest::prelude::*;
use vigil::event::{Event, Value};
use vigil::schema::Stream;

const LATENESS_MS: i64 = 120_000;

fn shipped_plans() -> Vec<vigil::plan::RulePlan> {
    let inputs = vigil::read_rule_files(std::path::Path::new("rules")).expect("rules folder");
    vigil::compile_all(&inputs).into_iter().flat_map(|c| c.plans).collect()
}

/// One generated event: (time in seconds, kind, entity number, value).
fn event((secs, kind, n, v): (i64, u8, u8, u8)) -> Event {
    let ts = 1_767_225_600_000 + secs * 1000;
    let task_types = ["SUBMIT", "SCHEDULE", "EVICT", "FAIL", "FINISH"];
    match kind % 4 {
        0 => {
            let mut e = Event::new(Stream::TaskEvent, ts);
            e.set("type", Value::str(task_types[(v % 5) as usize]))
                .set("job_id", Value::str(&format!("j{}", n % 3)))
                .set("task_index", Value::Num(f64::from(n % 4)))
                .set("machine_id", Value::str(&format!("m{}", v % 3)))
                .set("user", Value::str(&format!("u{}", v % 2)))
                .set("cpu_request", Value::Num(0.1));
            e
        }
        1 => {
            let mut e = Event::new(Stream::TaskUsage, ts);
            e.set("job_id", Value::str(&format!("j{}", n % 2)))
                .set("task_index", Value::Num(f64::from(n % 5)))
                .set("machine_id", Value::str(&format!("m{}", n % 3)))
                .set("cpu", Value::Num(f64::from(v) / 100.0))
                .set("mem", Value::Num(f64::from(v % 50) / 50.0));
            e
        }
        2 => {
            let mut e = Event::new(Stream::MachineEvent, ts);
            e.set("type", Value::str(if v % 2 == 0 { "REMOVE" } else { "ADD" }))
                .set("machine_id", Value::str(&format!("m{}", n % 3)));
            e
        }
        _ => {
            let mut e = Event::new(Stream::Metric, ts);
            e.set("host", Value::str(&format!("h{}", n % 3)))
                .set("name", Value::str(if v % 2 == 0 { "cpu_utilization" } else { "disk" }))
                .set("value", Value::Num(f64::from(v % 4) * 30.0));
            e
        }
    }
}

fn engine(plans: &[vigil::plan::RulePlan]) -> vigil::engine::Engine {
    vigil::engine::Engine::new(
        plans.to_vec(),
        vigil::engine::EngineConfig { lateness_ms: LATENESS_MS, ..Default::default() },
    )
}

fn run(events: &[Event], plans: &[vigil::plan::RulePlan]) -> Vec<String> {
    let mut engine = engine(plans);
    let mut alerts = Vec::new();
    for e in events {
        assert!(engine.push(e.clone(), &mut alerts), "an event within the lateness was taken as late");
    }
    engine.flush(&mut alerts);
    comparable(&alerts)
}

/// Detection time is when the engine could decide, which depends on arrival; all else must not.
fn comparable(alerts: &[vigil::alert::Alert]) -> Vec<String> {
    alerts
        .iter()
        .map(|a| {
            let mut a = a.clone();
            a.detected_at = 0;
            serde_json::to_string(&a).expect("serialisable")
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn shuffles_within_lateness_give_the_alerts_of_sorted_input(
        raw in proptest::collection::vec((0i64..4 * 3600, any::<u8>(), any::<u8>(), any::<u8>()), 1..250),
        delays in proptest::collection::vec(0i64..LATENESS_MS, 250),
    ) {
        let plans = shipped_plans();
        let mut events: Vec<Event> = raw.into_iter().map(event).collect();
        events.sort_by(|a, b| a.tie_order(b));
        let sorted = run(&events, &plans);
        // Each event arrives up to the lateness after its own time.
        let mut arrivals: Vec<(i64, usize)> = events.iter().enumerate().map(|(i, e)| (e.ts + delays[i % delays.len()], i)).collect();
        arrivals.sort();
        let shuffled: Vec<Event> = arrivals.iter().map(|&(_, i)| events[i].clone()).collect();
        prop_assert_eq!(run(&shuffled, &plans), sorted);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn a_restored_snapshot_continues_exactly_like_the_uninterrupted_run(
        raw in proptest::collection::vec((0i64..4 * 3600, any::<u8>(), any::<u8>(), any::<u8>()), 1..250),
        cut in any::<prop::sample::Index>(),
    ) {
        let plans = shipped_plans();
        let mut events: Vec<Event> = raw.into_iter().map(event).collect();
        events.sort_by(|a, b| a.tie_order(b));
        let whole = run(&events, &plans);
        let cut = cut.index(events.len() + 1);
        let mut first = engine(&plans);
        let mut alerts = Vec::new();
        for e in &events[..cut] {
            first.push(e.clone(), &mut alerts);
        }
        // Through bytes, as a checkpoint in the store would go.
        let bytes = first.snapshot().expect("snapshot").to_bytes().expect("serialise");
        drop(first);
        let mut second = engine(&plans);
        let restored = second.restore(vigil::engine::Snapshot::from_bytes(&bytes).expect("deserialise")).expect("restore");
        prop_assert_eq!(restored.len(), plans.len());
        for e in &events[cut..] {
            second.push(e.clone(), &mut alerts);
        }
        second.flush(&mut alerts);
        prop_assert_eq!(comparable(&alerts), whole);
    }
}

#[test]
fn a_changed_rule_loses_only_its_own_state() {
    let plans = shipped_plans();
    let mut first = engine(&plans);
    let mut alerts = Vec::new();
    for e in (0..500).map(|i: i64| event((i * 30, (i % 4) as u8, (i % 11) as u8, (i * 37 % 251) as u8))) {
        first.push(e, &mut alerts);
    }
    let snapshot = first.snapshot().expect("snapshot");
    let src = std::fs::read_to_string("rules/machine_cpu_spike.saql").expect("rule").replace("> 0.8", "> 0.85");
    let mut changed: Vec<vigil::plan::RulePlan> =
        plans.iter().filter(|p| p.name != "machine_cpu_spike").cloned().collect();
    changed.extend(vigil::compile("spike.saql", src.as_bytes()).plans);
    let mut second = engine(&changed);
    let restored = second.restore(snapshot).expect("restore");
    assert!(!restored.contains(&"machine_cpu_spike".to_string()));
    assert_eq!(restored.len(), plans.len() - 1, "{restored:?}");
}

#[test]
fn the_generated_streams_do_raise_alerts() {
    // Guards the property above against passing because nothing ever fires.
    let plans = shipped_plans();
    let raw: Vec<(i64, u8, u8, u8)> =
        (0..2000).map(|i: i64| (i * 45, (i % 4) as u8, (i % 11) as u8, (i * 37 % 251) as u8)).collect();
    let events: Vec<Event> = raw.into_iter().map(event).collect();
    let alerts = run(&events, &plans);
    let rules: std::collections::BTreeSet<String> = alerts
        .iter()
        .map(|a| {
            serde_json::from_str::<serde_json::Value>(a).expect("json")["rule"].as_str().expect("rule").to_string()
        })
        .collect();
    assert!(rules.len() >= 4, "only {rules:?} fired");
}
