//! Property: any arrival order within the allowed lateness yields exactly the alerts of sorted
//! input, for all shipped rules running together.

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

fn run(events: &[Event], plans: &[vigil::plan::RulePlan]) -> Vec<String> {
    let mut engine =
        vigil::engine::Engine::new(plans.to_vec(), vigil::engine::EngineConfig { lateness_ms: LATENESS_MS });
    let mut alerts = Vec::new();
    for e in events {
        assert!(engine.push(e.clone(), &mut alerts), "an event within the lateness was taken as late");
    }
    engine.flush(&mut alerts);
    // Detection time is when the engine could decide, which depends on arrival; all else must not.
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
