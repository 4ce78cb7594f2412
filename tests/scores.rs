//! Rules with a `score` block, refractory periods and absences bounded by a learned interval,
//! through the whole engine:
//! - a restored snapshot continues exactly like the uninterrupted run, scorers included;
//! - any arrival order within the lateness gives the alerts of sorted input;
//! - a refractory period holds back new episodes of a key, and only for its length;
//! - a scored alert's evidence says which test fired it, with the score, threshold and baseline.

use crate::support::restore;

use proptest::prelude::*;
use serde_json::Value as Json;
use vigil::alert::{Alert, Status};
use vigil::engine::{Engine, EngineConfig};
use vigil::event::{Event, Value};
use vigil::plan::RulePlan;
use vigil::schema::Stream;

/// Every scorer, with windows small enough for a few hundred events to reach their judging
/// state; and a cadence-bounded absence with a refractory period.
const SCORED: &str = r#"
rule scored {
  metric s sample as e #time(1 min)
  state ss { v := avg(e.value), lo := min(e.value), hi := max(e.value) } group by s
  score {
    z := robust_z(ss.v, window = 16, warmup = 4),
    p := knn(ss.v, dim = 2, k = 2, window = 16, calibration = 20),
    d := shift(ss.v, window = 8, bins = 3, warmup = 8),
    l := likelihood(abs(z), short = 2, long = 32, warmup = 8),
    nv := novelty(ss.v, window = 32, warmup = 4),
    run := unchanged(ss.lo),
    still := streak(ss.lo == ss.hi),
    moving := change_rate(ss.hi, window = 8)
  }
  alert abs(z) > 3 or p > 0.97 or d > 0.99 or l > 0.99 or nv > 1 or (min(run, still) >= 3 and moving >= 0.5)
    severity warning refractory 5 min
  return s.host, z, p, d, l, nv, run
}
rule silent {
  host h report metric s1 as e1
  host h report metric s2 as e2
  with e1 -> not e2 for max(2 min, 3 * interval(e1))
  alert severity warning refractory 10 min
  return h.host
}
"#;

const LATENESS_MS: i64 = 60_000;
const START: i64 = 1_767_225_600_000;

fn plans(text: &str) -> Vec<RulePlan> {
    let c = vigil::compile("scored.saql", text.as_bytes());
    assert!(c.diagnostics.is_empty(), "{:?}", c.diagnostics);
    c.plans
}

fn engine(plans: &[RulePlan]) -> Engine {
    Engine::new(plans.to_vec(), EngineConfig { lateness_ms: LATENESS_MS, ..Default::default() })
}

fn metric(secs: i64, host: &str, value: f64) -> Event {
    let mut e = Event::new(Stream::Metric, START + secs * 1000);
    e.set("host", Value::str(host)).set("name", Value::str("cpu")).set("value", Value::Num(value));
    e
}

/// (seconds, host, value): values from a few levels, some repeated, some far out.
fn generated(raw: Vec<(i64, u8, u8)>) -> Vec<Event> {
    let mut events: Vec<Event> = raw
        .into_iter()
        .map(|(secs, h, v)| {
            let value = match v % 16 {
                0 => 500.0,
                1..=4 => 10.0,
                n => f64::from(n) + f64::from(v / 16) / 16.0,
            };
            metric(secs, ["a", "b", "c"][usize::from(h % 3)], value)
        })
        .collect();
    events.sort_by(|a, b| a.tie_order(b));
    events
}

fn run(events: &[Event], plans: &[RulePlan]) -> Vec<Alert> {
    let mut engine = engine(plans);
    let mut alerts = Vec::new();
    for e in events {
        engine.push(e.clone(), &mut alerts);
    }
    engine.flush(&mut alerts);
    alerts
}

fn comparable(alerts: &[Alert]) -> Vec<String> {
    alerts.iter().map(|a| serde_json::to_string(&Alert { detected_at: 0, ..a.clone() }).expect("json")).collect()
}

fn events_strategy() -> impl Strategy<Value = Vec<(i64, u8, u8)>> {
    proptest::collection::vec((0i64..3 * 3600, any::<u8>(), any::<u8>()), 1..600)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn a_restored_snapshot_with_scorers_continues_exactly_like_the_uninterrupted_run(
        raw in events_strategy(),
        cut in any::<prop::sample::Index>(),
    ) {
        let plans = plans(SCORED);
        let events = generated(raw);
        let whole = comparable(&run(&events, &plans));
        let cut = cut.index(events.len() + 1);
        let (alerts, restored) = restore::run_with_restore(|| engine(&plans), &events, cut);
        prop_assert_eq!(restored, plans.len());
        prop_assert_eq!(comparable(&alerts), whole);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    /// Disorder within the allowed lateness, repeated timestamps included, changes nothing a
    /// scorer sees: each window's state is scored once, when it closes.
    #[test]
    fn arrival_order_within_the_lateness_does_not_change_what_scorers_say(
        raw in events_strategy(),
        delays in proptest::collection::vec(0i64..LATENESS_MS, 600),
    ) {
        let plans = plans(SCORED);
        let events = generated(raw);
        let sorted = comparable(&run(&events, &plans));
        let mut arrivals: Vec<(i64, usize)> =
            events.iter().enumerate().map(|(i, e)| (e.ts + delays[i % delays.len()], i)).collect();
        arrivals.sort();
        let shuffled: Vec<Event> = arrivals.iter().map(|&(_, i)| events[i].clone()).collect();
        prop_assert_eq!(comparable(&run(&shuffled, &plans)), sorted);
    }
}

#[test]
fn the_generated_streams_fire_both_rules_from_their_scores() {
    // Guards the property above against passing because nothing fires or nothing is scored.
    let raw: Vec<(i64, u8, u8)> =
        (0..3000).map(|i: i64| (i * 7 % 10_800, (i % 3) as u8, (i * 37 % 251) as u8)).collect();
    let alerts = run(&generated(raw), &plans(SCORED));
    let firing: Vec<&Alert> = alerts.iter().filter(|a| a.status == Status::Firing).collect();
    assert!(firing.iter().any(|a| &*a.rule == "scored"), "the scored rule never fired");
    let mut gapped = generated((0..200).map(|i: i64| (i * 20, 0, 7)).collect());
    gapped.extend(generated((0..200).map(|i: i64| (4000 + i * 20, 1, 7)).collect()));
    let alerts = run(&gapped, &plans(SCORED));
    assert!(alerts.iter().any(|a| &*a.rule == "silent" && a.status == Status::Firing), "no absence fired");
}

/// The minutes (from the start) at which the alerts `keep` picks fired.
fn firing_minutes(alerts: &[Alert], keep: impl Fn(&Alert) -> bool) -> Vec<i64> {
    alerts.iter().filter(|a| a.status == Status::Firing && keep(a)).map(|a| (a.time - START) / 60_000).collect()
}

#[test]
fn a_refractory_period_holds_back_new_episodes_of_the_key_for_its_length() {
    let plans = plans(
        r#"rule hot {
          metric s sample as e #time(1 min)
          state ss { v := max(e.value) } group by s
          alert ss.v > 10 severity warning refractory 30 min
          return s.host
        }"#,
    );
    // Spikes at minutes 5, 10 and 20 are one incident; the spike at minute 40 is a new one. Host
    // b's spike at minute 10 is its own key. A sample each minute moves the windows on.
    let mut events = Vec::new();
    for minute in 0..60 {
        let hot = [5, 10, 20, 40].contains(&minute);
        events.push(metric(minute * 60 + 1, "a", if hot { 50.0 } else { 1.0 }));
        events.push(metric(minute * 60 + 2, "b", if minute == 10 { 50.0 } else { 1.0 }));
    }
    let alerts = run(&events, &plans);
    let a = firing_minutes(&alerts, |x| x.values.get("s.host") == Some(&Json::from("a")));
    assert_eq!(a, vec![6, 41], "host a fires at the first spike's close and again after 30 minutes");
    assert_eq!(firing_minutes(&alerts, |x| &*x.rule == "hot"), vec![6, 11, 41]);
    // Each firing episode resolves: refractory is not keep_firing_for.
    let resolved = alerts.iter().filter(|x| x.status == Status::Resolved).count();
    assert_eq!(resolved, 3);
}

#[test]
fn a_scored_alert_says_which_test_fired_it_with_its_score_threshold_and_baseline() {
    let plans = plans(
        r#"rule jump {
          metric s sample as e #time(1 min)
          state ss { v := avg(e.value) } group by s
          score { z := robust_z(ss.v, window = 32, warmup = 8) }
          alert abs(z) > 4 or z < -100 severity warning
          return s.host, z
        }"#,
    );
    let mut events: Vec<Event> = (0..30).map(|m| metric(m * 60, "a", 10.0 + (m % 3) as f64)).collect();
    events.push(metric(30 * 60, "a", 40.0));
    events.push(metric(31 * 60, "a", 10.0));
    let alerts = run(&events, &plans);
    let fired: Vec<&Alert> = alerts.iter().filter(|a| a.status == Status::Firing).collect();
    assert_eq!(fired.len(), 1);
    let last = fired[0].evidence.last().expect("evidence").to_json();
    let tests = &last["thresholds"];
    assert_eq!(tests[0]["test"], "abs(z) > 4");
    assert_eq!(tests[0]["threshold"], 4.0);
    assert_eq!(tests[0]["holds"], true);
    assert_eq!(tests[1]["test"], "z < -100");
    assert_eq!(tests[1]["holds"], false);
    let z = last["scores"]["z"].as_f64().expect("z");
    assert_eq!(tests[0]["value"].as_f64(), Some(z.abs()));
    // Values 10, 11, 12 in turn: the median is 11 and the scale comes from their deviation.
    let baseline: &Json = &last["scorers"]["z"];
    assert_eq!(baseline["scorer"], "robust_z(ss[0].v)");
    assert_eq!(baseline["median"], 11.0);
    assert!(baseline["scale"].as_f64().is_some_and(|s| s > 0.0 && (40.0 - 11.0) / s == z), "{baseline}");
}
