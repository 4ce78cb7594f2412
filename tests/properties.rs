//! Properties of the engine, for all shipped rules running together:
//! - any arrival order within the allowed lateness yields exactly the alerts of sorted input;
//! - restoring a snapshot taken at any point and feeding the rest of the input yields exactly the
//!   alerts of the uninterrupted run;
//! - handing the engine only the time of the events its gate refuses yields exactly the alerts
//!   and counts of pushing every event, detection times included.

use crate::support::restore;

use proptest::prelude::*;
use vigil::event::{Event, Value};
use vigil::schema::Stream;

const LATENESS_MS: i64 = 120_000;

fn shipped_plans() -> Vec<vigil::plan::RulePlan> {
    let inputs = vigil::ruleset::read_files_under(std::path::Path::new("rules")).expect("rules folder");
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
        let (alerts, restored) = restore::run_with_restore(|| engine(&plans), &events, cut);
        prop_assert_eq!(restored, plans.len());
        prop_assert_eq!(comparable(&alerts), whole);
    }
}

/// Rules whose patterns on `task_usage` all filter on numbers (so the gate judges that stream,
/// and refuses every event of the streams no rule reads), beside a window rule on metrics whose
/// closes are timers that refused events' times must fire at the same moments.
const GATED_RULES: &str = r#"
    rule hot { task t use machine m as e where e.cpu > 0.8 and e.mem >= 0.2 }
    rule hot_then_full {
      task t1 use machine m as e1 where e1.cpu > 0.5
      task t2 use machine m as e2 where e2.mem > 0.7
      with e1 -> e2 within 10 min
    }
    rule busy_host {
      host h report metric x as e #time(5 min)
      state ss { n := count() } group by h
      alert ss.n > 1
    }
"#;

/// An event as a producer writes it: epoch milliseconds, fields in schema order.
fn json_line(e: &Event) -> String {
    let mut json = e.to_json();
    json["ts"] = e.ts.into();
    json.to_string()
}

/// Pushes every event, or decodes each line through the gate and passes the refused ones' times;
/// the alerts in full (detection times included) and the engine's counts.
fn run_lines(lines: &[String], plans: &[vigil::plan::RulePlan], gated: bool) -> (Vec<String>, String, usize) {
    let mut engine = engine(plans);
    let gate = engine.gate();
    let (mut alerts, mut passed) = (Vec::new(), 0);
    let (mut decoder, mut pool) = (vigil::event::LineDecoder::default(), vigil::event::EventPool::default());
    for line in lines {
        engine.recycle_into(&mut pool);
        let event = if gated {
            decoder.decode_gated(line.as_bytes(), None, &gate, &mut pool).expect("a valid line")
        } else {
            vigil::event::Decoded::Event(std::sync::Arc::new(vigil::event::decode(line, None).expect("a valid line")))
        };
        match event {
            vigil::event::Decoded::Event(e) => engine.push_shared(e, &mut alerts),
            vigil::event::Decoded::Time(ts) => {
                passed += 1;
                engine.pass(ts, &mut alerts)
            }
        };
    }
    engine.flush(&mut alerts);
    let alerts = alerts.iter().map(|a| serde_json::to_string(a).expect("serialisable")).collect();
    (alerts, format!("{:?}", engine.stats()), passed)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn times_alone_give_the_alerts_of_whole_events(
        raw in proptest::collection::vec((0i64..2 * 3600, any::<u8>(), any::<u8>(), any::<u8>()), 1..300),
        delays in proptest::collection::vec(0i64..2 * LATENESS_MS, 300),
    ) {
        let plans = vigil::compile("gated.saql", GATED_RULES.as_bytes()).plans;
        prop_assert_eq!(plans.len(), 3);
        let mut events: Vec<Event> = raw.into_iter().map(event).collect();
        events.sort_by(|a, b| a.tie_order(b));
        // Out of order, some beyond the lateness (late, and counted as such).
        let mut arrivals: Vec<(i64, usize)> = events.iter().enumerate().map(|(i, e)| (e.ts + delays[i % delays.len()], i)).collect();
        arrivals.sort();
        let lines: Vec<String> = arrivals.iter().map(|&(_, i)| json_line(&events[i])).collect();
        let (whole, whole_stats, _) = run_lines(&lines, &plans, false);
        let (gated, gated_stats, passed) = run_lines(&lines, &plans, true);
        prop_assert_eq!(gated, whole);
        prop_assert_eq!(gated_stats, whole_stats);
        // Task, machine and most usage events are refused: the gate is in use.
        prop_assert!(lines.len() < 20 || passed > 0, "no event was refused out of {}", lines.len());
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
fn the_gated_rules_fire_and_their_gate_refuses() {
    // Guards the gate's property above against passing because nothing fires or nothing is refused.
    let plans = vigil::compile("gated.saql", GATED_RULES.as_bytes()).plans;
    let lines: Vec<String> = (0..2000)
        .map(|i: i64| json_line(&event((i * 5, (i % 4) as u8, (i % 11) as u8, (i * 37 % 251) as u8))))
        .collect();
    let (alerts, _, passed) = run_lines(&lines, &plans, true);
    let rules: std::collections::BTreeSet<String> = alerts
        .iter()
        .map(|a| {
            serde_json::from_str::<serde_json::Value>(a).expect("json")["rule"].as_str().expect("rule").to_string()
        })
        .collect();
    assert_eq!(rules.len(), 3, "only {rules:?} fired");
    assert!(passed > 1000, "only {passed} of {} events were refused", lines.len());
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

/// The alerts, in full and sorted, and the counts of `lines` decoded through the gate and run by
/// `driven`: one engine, or the runtime's keyed partitions on threads.
fn run_driven(
    lines: &[String],
    plans: &[vigil::plan::RulePlan],
    driven: &mut dyn vigil::runtime::Driven,
) -> (Vec<String>, String) {
    let gate = engine(plans).gate();
    let (mut decoder, mut pool) = (vigil::event::LineDecoder::default(), vigil::event::EventPool::default());
    let mut alerts = Vec::new();
    for line in lines {
        driven.recycle_into(&mut pool);
        driven.take(decoder.decode_gated(line.as_bytes(), None, &gate, &mut pool).expect("a valid line"), &mut alerts);
    }
    driven.flush(&mut alerts);
    let mut alerts: Vec<String> = alerts.iter().map(|a| serde_json::to_string(a).expect("serialisable")).collect();
    alerts.sort();
    (alerts, format!("{:?}", driven.stats()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn an_event_goes_to_the_partitions_of_every_key_group_it_reaches(
        raw in proptest::collection::vec((0i64..4 * 3600, any::<u8>(), any::<u8>(), any::<u8>()), 1..50),
        partitions in 1usize..=16,
    ) {
        // The router skips a filter whose key adds no partition: the partitions must still be
        // those of every key group the event reaches.
        let engine = engine(&shipped_plans());
        let (mut groups, mut parts) = (Vec::new(), Vec::new());
        for e in raw.into_iter().map(event) {
            engine.key_groups(&e, &mut groups);
            engine.partitions_of(&e, partitions, &mut parts);
            let want: std::collections::BTreeSet<usize> = groups.iter().map(|g| *g as usize % partitions).collect();
            let got: std::collections::BTreeSet<usize> = parts.iter().copied().collect();
            prop_assert_eq!(parts.len(), got.len(), "no repeats");
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn keyed_partitions_on_threads_give_the_alerts_and_counts_of_one_engine(
        raw in proptest::collection::vec((0i64..4 * 3600, any::<u8>(), any::<u8>(), any::<u8>()), 1..400),
        delays in proptest::collection::vec(0i64..2 * LATENESS_MS, 400),
        partitions in 2usize..=8,
        threads in 1usize..=3,
        balance_every in 1u64..300,
    ) {
        // Every shipped rule, the fleet-wide outlier rules among them; some events late.
        let plans = shipped_plans();
        let mut events: Vec<Event> = raw.into_iter().map(event).collect();
        events.sort_by(|a, b| a.tie_order(b));
        let mut arrivals: Vec<(i64, usize)> = events.iter().enumerate().map(|(i, e)| (e.ts + delays[i % delays.len()], i)).collect();
        arrivals.sort();
        let lines: Vec<String> = arrivals.iter().map(|&(_, i)| json_line(&events[i])).collect();
        let one = run_driven(&lines, &plans, &mut engine(&plans));
        let config = vigil::engine::EngineConfig { lateness_ms: LATENESS_MS, ..Default::default() };
        // Partitions move between threads as their load says, as often as every event.
        let mut runtime = vigil::runtime::Runtime::new(plans.clone(), config, partitions, threads).balance_every(balance_every);
        let split = run_driven(&lines, &plans, &mut runtime);
        prop_assert_eq!(split, one);
    }
}
