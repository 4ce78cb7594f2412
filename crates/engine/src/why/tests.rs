//! "Why didn't it page?" over a series whose incident a threshold just missed.

use super::*;
use crate::event::{Event, Value};
use std::sync::Arc;
use vigil_lang::schema::Stream;

const MIN: Millis = 60_000;

fn plan(src: &str) -> RulePlan {
    let c = vigil_lang::compile("t.saql", src.as_bytes());
    assert!(c.is_ok(), "{:?}", c.diagnostics);
    c.plans.into_iter().next().expect("one rule")
}

/// One sample a minute of `host`'s `cpu`: `value(minute)`.
fn series(host: &str, minutes: i64, value: impl Fn(i64) -> f64) -> Vec<Event> {
    (0..minutes)
        .map(|m| {
            let mut e = Event::new(Stream::Metric, m * MIN + 1_000);
            e.set("host", Value::str(host)).set("name", Value::str("cpu")).set("value", Value::Num(value(m)));
            e
        })
        .collect()
}

/// Opens the events as one input, as often as asked.
fn opener(events: Vec<Event>) -> impl FnMut(Gate, Rc<RefCell<EventPool>>) -> Result<Vec<Input<Decoded>>, String> {
    move |_, _| {
        let mut events = events.clone();
        events.sort_by_key(|e| e.ts);
        let records = events
            .into_iter()
            .enumerate()
            .map(|(i, e)| crate::replay::Record { line: i as u64 + 1, event: Ok(Decoded::Event(Arc::new(e))) });
        Ok(vec![Input { name: "events".into(), records: Box::new(records), progress: Default::default(), size: 0 }])
    }
}

fn options() -> ReplayOptions {
    ReplayOptions { speed: crate::replay::Speed::Max, strict: false, engine: crate::settings::EngineSettings::batch() }
}

const HOT: &str = r#"rule hot { metric s sample as e #time(1 min) state ss { v := avg(e.value) } group by s
    alert ss.v > 10 and ss.v < 50 severity warning refractory 30 min }"#;

#[test]
fn a_missed_incident_shows_its_closest_window_and_the_threshold_that_catches_it() {
    // web-1 reaches 9.5 in minutes 100 to 104; web-2 stays at 1.
    let mut events = series("web-1", 200, |m| if (100..105).contains(&m) { 9.5 } else { 1.0 });
    events.extend(series("web-2", 200, |_| 1.0));
    let question = Question { from: 95 * MIN, to: 110 * MIN, key: Some("web-1".into()) };
    let answer = ask(&plan(HOT), &question, &options(), &mut opener(events)).expect("answered");
    assert!(!answer.caught);
    assert_eq!(answer.groups.len(), 1, "web-2 is not asked about");
    let group = &answer.groups[0];
    assert!(group.key.contains("web-1"), "{}", group.key);
    assert_eq!(group.points.len(), 16, "a window a minute from 95 to 110");
    assert!(group.verdict.contains("v > 10 (9.5)"), "{}", group.verdict);
    // Only `ss.v > 10` can change to catch it; `ss.v < 50` already holds.
    assert_eq!(answer.changes.len(), 1);
    let change = &answer.changes[0];
    assert_eq!((change.test, change.from, change.to), (0, 10.0, 9.4));
    let caught = change.caught.as_ref().expect("the changed rule fires");
    assert!((100 * MIN..=106 * MIN).contains(&caught.time), "{}", caught.time);
    // The change's cost, over both hosts: one alert where the rule had none.
    assert_eq!((answer.cost.alerts, change.cost.alerts), (0, 1));
    assert_eq!((change.cost.series, change.cost.hosts), (2, 2));
    // Drawn: one panel per threshold test, each with its values, threshold and change.
    let svg = plot::svg(&answer, group);
    assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
    assert_eq!(svg.matches("<path").count(), 2);
    assert_eq!(svg.matches("changed to 9.4").count(), 1);
    assert_eq!(svg.matches("<title>threshold ").count(), 2);
}

#[test]
fn an_alert_in_the_range_is_no_miss_and_a_quiet_group_is_told_apart() {
    let events = series("web-1", 200, |m| if (100..105).contains(&m) { 20.0 } else { 1.0 });
    let question = Question { from: 95 * MIN, to: 110 * MIN, key: None };
    let answer = ask(&plan(HOT), &question, &options(), &mut opener(events.clone())).expect("answered");
    assert!(answer.caught);
    assert!(answer.changes.is_empty());
    assert!(answer.groups[0].verdict.starts_with("alerted at"), "{}", answer.groups[0].verdict);
    // A second incident within the refractory period held, and is said to have been quiet.
    let question = Question { from: 106 * MIN, to: 200 * MIN, key: None };
    let twice = series("web-1", 200, |m| if (100..105).contains(&m) || (110..112).contains(&m) { 20.0 } else { 1.0 });
    let answer = ask(&plan(HOT), &question, &options(), &mut opener(twice)).expect("answered");
    assert!(answer.groups[0].verdict.contains("refractory"), "{}", answer.groups[0].verdict);
    let _ = events;
}

#[test]
fn a_scorer_still_warming_up_is_named() {
    let rule = r#"rule odd { metric s sample as e #time(1 min) state ss { v := avg(e.value) } group by s
        score { z := robust_z(ss.v, window = 100, warmup = 60) } alert abs(z) > 6 severity warning }"#;
    let events = series("web-1", 40, |m| if m == 30 { 50.0 } else { 1.0 + (m % 3) as f64 });
    let question = Question { from: 25 * MIN, to: 35 * MIN, key: None };
    let answer = ask(&plan(rule), &question, &options(), &mut opener(events)).expect("answered");
    assert!(answer.groups[0].verdict.contains("warming up"), "{}", answer.groups[0].verdict);
    assert!(answer.groups[0].verdict.contains("abs(z) > 6"), "{}", answer.groups[0].verdict);
    assert!(answer.changes.is_empty(), "no threshold makes an unknown score pass");
}

#[test]
fn a_threshold_is_rounded_past_the_value_at_one_more_decimal() {
    let gt = Threshold { op: BinOp::Gt, literal: 0.98 };
    assert_eq!(rounded_past(gt, 0.9734), 0.973);
    assert_eq!(rounded_past(gt, 0.973), 0.972);
    let ge = Threshold { op: BinOp::Ge, literal: 3.0 };
    assert_eq!(rounded_past(ge, 2.75), 2.7);
    let lt = Threshold { op: BinOp::Lt, literal: 0.5 };
    assert_eq!(rounded_past(lt, 0.512), 0.52);
}

#[test]
fn when_no_one_threshold_suffices_the_closest_two_are_moved_together() {
    // Both tests fall short in the incident: moving either alone catches nothing.
    let rule = r#"rule both { metric s sample as e #time(1 min) state ss { v := avg(e.value), m := max(e.value) }
        group by s alert ss.v > 10 and ss.m > 20 severity warning }"#;
    let events = series("web-1", 200, |m| if (100..105).contains(&m) { 9.5 } else { 1.0 });
    let question = Question { from: 95 * MIN, to: 110 * MIN, key: None };
    let answer = ask(&plan(rule), &question, &options(), &mut opener(events)).expect("answered");
    assert!(!answer.caught);
    assert_eq!(answer.changes.len(), 1, "{:?}", answer.changes);
    let change = &answer.changes[0];
    let moved: Vec<(usize, f64)> = change.literals().collect();
    assert_eq!(moved, [(0, 9.4), (1, 9.4)]);
    assert_eq!(change.also[0].from, 20.0);
    assert!((change.relative - 10.6 / 20.0).abs() < 1e-9, "the larger of the two: {}", change.relative);
    assert!(change.condition.contains("9.4") && !change.condition.contains("20"), "{}", change.condition);
    let caught = change.caught.as_ref().expect("the changed rule fires");
    assert!((100 * MIN..=106 * MIN).contains(&caught.time), "{}", caught.time);
    // Drawn on both panels.
    let svg = plot::svg(&answer, &answer.groups[0]);
    assert_eq!(svg.matches("changed to 9.4").count(), 2);
}
