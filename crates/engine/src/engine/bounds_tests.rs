//! The engine's bounds: what a jump of event time costs, the clock event time may not pass,
//! the state budget, and the self-alert of a rule its limits made blind.

use super::*;
use crate::alert::Status;
use crate::event::Value;
use vigil_lang::schema::Stream;

fn plans(src: &str) -> Vec<RulePlan> {
    let c = vigil_lang::compile("t.saql", src.as_bytes());
    assert!(c.is_ok(), "{:?}", c.diagnostics);
    c.plans
}

fn usage(ts: Millis, machine: &str, cpu: f64) -> Event {
    let mut e = Event::new(Stream::TaskUsage, ts);
    e.set("job_id", Value::str("j")).set("task_index", Value::Num(0.0)).set("machine_id", Value::str(machine));
    e.set("cpu", Value::Num(cpu)).set("mem", Value::Num(cpu / 2.0));
    e
}

const MINUTE: Millis = 60_000;

/// Rules whose judgement of an empty window differs from a busy one, with history, `for`,
/// `keep_firing_for` and an invariant: what a skipped close would have to get right. `silent`
/// fires while a machine is quiet, and `learned` remembers idle machines for 500 windows: both
/// keep groups alive across a gap, which every close then judges.
const WINDOWED: &str = r#"
    rule went_quiet { task t use machine m as e #time(1 min)
      state[3] ss { n := count() } group by m
      alert ss.n == 0 and ss[2].n > 0 keep_firing_for 5 min }
    rule silent { task t use machine m as e #time(1 min)
      state ss { n := count() } group by m
      alert ss.n == 0 for 3 min keep_firing_for 2 min }
    rule busy { task t use machine m as e #time(1 min, 30 s)
      state ss { n := count(), c := avg(e.cpu) } group by m
      alert ss.n >= 2 for 1 min keep_firing_for 3 min }
    rule learned { task t use machine m as e #time(1 min)
      state ss { top := max(e.cpu) } group by m
      invariant[500][online] { hi := 0; hi = max(hi, ss.top) }
      alert ss.top > hi * 1.5 }
"#;

/// Drives one operator's timers to `to` as the engine does, closing one window per call, and
/// skipping quiet closes after each when `skip`. Returns how many `on_watermark` calls it took.
fn drive(op: &mut dyn Operator, to: Millis, skip: bool, out: &mut Vec<Alert>) -> usize {
    let mut calls = 0;
    while let Some(due) = op.next_deadline().filter(|d| *d <= to) {
        op.on_watermark(due, out);
        calls += 1;
        if skip {
            op.skip_quiet(to);
        }
    }
    calls
}

#[test]
fn skipping_quiet_closes_gives_the_alerts_and_groups_of_closing_every_window() {
    let regexes = Arc::new(RegexCache::default());
    // Bursts on a few machines, a ten-day gap, one machine back, then one far in the future
    // whose window stays open across the whole gap.
    let mut events: Vec<Event> = Vec::new();
    for i in 0..40 {
        events.push(usage(i * 7_000, &format!("m{}", i % 4), 0.1 + (i % 5) as f64 * 0.2));
    }
    let gap = 10 * 24 * 60 * MINUTE;
    for i in 0..10 {
        events.push(usage(gap + i * 5_000, "m1", 0.9));
    }
    let mut plans = plans(WINDOWED);
    for plan in plans.drain(..) {
        let plan = Arc::new(plan);
        let windowed = plan.model.windowed().expect("a windowed rule").clone();
        let build =
            || window::WindowOperatorBuilder::new(plan.clone(), &windowed, regexes.clone()).build(Limits::default());
        let (mut skipping, mut closing) = (build(), build());
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let (mut calls_a, mut calls_b) = (0, 0);
        for e in &events {
            let e = Arc::new(e.clone());
            calls_a += drive(&mut skipping, e.ts - 1, true, &mut a);
            calls_b += drive(&mut closing, e.ts - 1, false, &mut b);
            skipping.on_event(0, &e, &mut a);
            closing.on_event(0, &e, &mut b);
        }
        let end = gap + 2 * 24 * 60 * MINUTE;
        calls_a += drive(&mut skipping, end, true, &mut a);
        calls_b += drive(&mut closing, end, false, &mut b);
        let view = |alerts: &[Alert]| -> Vec<(String, Status, Millis, String)> {
            alerts
                .iter()
                .map(|x| (x.id.clone(), x.status, x.time, serde_json::to_string(&x.values).expect("json")))
                .collect()
        };
        assert_eq!(view(&a), view(&b), "{}: the same alerts", plan.name);
        // `learned` trains for 500 windows with events, more than the scenario has.
        assert!(plan.name == "learned" || !a.is_empty(), "{}: the scenario raises alerts", plan.name);
        assert_eq!(skipping.live_keys(), closing.live_keys(), "{}: the same groups left", plan.name);
        assert!(calls_a <= calls_b, "{}: {calls_a} closes skipping, {calls_b} without", plan.name);
        match plan.name.as_str() {
            "silent" => {
                assert!(calls_b > 14_000, "silent: closing every window takes {calls_b} closes");
                assert!(calls_a < 200, "silent: skipping takes {calls_a} closes, not one per window");
            }
            "learned" => assert!(calls_b >= 500 && calls_a < 100, "learned: {calls_a} closes, not {calls_b}"),
            _ => {}
        }
    }
}

#[test]
fn a_far_jump_of_event_time_costs_a_bounded_number_of_closes() {
    let regexes = Arc::new(RegexCache::default());
    let plan = Arc::new(plans(WINDOWED).remove(1));
    let windowed = plan.model.windowed().expect("a windowed rule").clone();
    let mut op = window::WindowOperatorBuilder::new(plan, &windowed, regexes).build(Limits::default());
    let mut out = Vec::new();
    op.on_event(0, &Arc::new(usage(0, "m1", 0.5)), &mut out);
    // One event dated near the end of year 9999 opens a window there.
    let far = crate::event::MAX_TS - MINUTE;
    op.on_event(0, &Arc::new(usage(far, "m2", 0.5)), &mut out);
    let calls = drive(&mut op, far + MINUTE, true, &mut out);
    assert!(calls < 100, "{calls} closes to cross 8,000 years of one-minute windows");
}

#[derive(Debug)]
struct ManualClock(std::sync::atomic::AtomicI64);

impl Clock for ManualClock {
    fn now_ms(&self) -> Millis {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[test]
fn event_time_does_not_pass_the_clock_so_a_future_event_cannot_make_the_present_late() {
    let now = 1_767_225_600_000;
    let clock = Arc::new(ManualClock(now.into()));
    let config = EngineConfig { lateness_ms: 5_000, clock: Some(clock.clone()), ..EngineConfig::default() };
    let mut engine = Engine::new(plans("rule hot { task t use machine m as e where e.cpu > 0.9 }"), config);
    let mut out = Vec::new();
    // Dated four minutes ahead of the clock: it waits, and moves event time no further than
    // the clock less the lateness, as an event of the present would.
    assert!(engine.push(usage(now + 4 * MINUTE, "m9", 0.95), &mut out));
    assert!(engine.watermark().is_some_and(|w| w <= now - 5_000), "{:?}", engine.watermark());
    // An event of the present, a second old, is still on time.
    assert!(engine.push(usage(now - 1_000, "m1", 0.95), &mut out), "an event of the present is not late");
    engine.flush(&mut out);
    assert!(out.is_empty(), "both wait for the clock: {out:?}");
    clock.0.store(now + 5 * MINUTE, std::sync::atomic::Ordering::Relaxed);
    engine.flush(&mut out);
    let fired: Vec<String> = out
        .iter()
        .filter(|a| a.status == Status::Firing)
        .map(|a| a.key.get("m.machine_id").map(|v| v.to_string()).unwrap_or_default())
        .collect();
    assert_eq!(fired, ["\"m1\"", "\"m9\""], "the clock reached both, in time order");
}

#[test]
fn times_out_of_range_are_refused_and_counted() {
    let mut engine = Engine::new(plans("rule hot { task t use machine m as e where e.cpu > 0.9 }"), Default::default());
    let mut out = Vec::new();
    for ts in [i64::MIN, -1, crate::event::MAX_TS + 1, i64::MAX] {
        assert!(!engine.push(usage(ts, "m", 0.95), &mut out));
        assert!(!engine.pass(ts, &mut out));
    }
    assert_eq!(engine.stats().out_of_range, 8);
    assert!(engine.watermark().is_none(), "event time did not move");
    assert!(engine.push(usage(1_000, "m", 0.95), &mut out));
}

#[test]
fn the_state_budget_evicts_the_idlest_keys_and_counts_them() {
    let rule = "rule per_machine { task t use machine m as e #time(1 min) state[10] ss { n := count() } group by m
                alert ss.n > 1000 }";
    let mut engine = Engine::new(plans(rule), EngineConfig::default());
    let mut out = Vec::new();
    for i in 0..20_000 {
        engine.push(usage(i, &format!("m{i}"), 0.5), &mut out);
    }
    let before = engine.state_bytes();
    let budget = before / 4;
    let after = engine.enforce_budget(budget, &mut out);
    assert!(after <= budget, "{after} bytes left over a budget of {budget}");
    let evicted = engine.evicted()[&("per_machine".to_string(), "memory")];
    assert!(evicted >= 15_000 / 2, "{evicted} groups evicted for memory");
    assert!(engine.live_keys()["per_machine"] < 20_000);
}

#[test]
fn dropping_a_waiting_absence_raises_one_self_alert_per_episode() {
    let rule = r#"rule host_silent {
        host h report metric s1 as e1
        host h report metric s2 as e2
        with e1 -> not e2 for 10 min
        return h.host }"#;
    let limits = Limits { max_keys: 3, idle_ms: 0 };
    let mut engine = Engine::new(plans(rule), EngineConfig { limits, ..EngineConfig::default() });
    let mut out = Vec::new();
    for i in 0..10 {
        let mut e = Event::new(Stream::Metric, i * 1_000);
        e.set("host", Value::str(&format!("h{i}"))).set("name", Value::str("cpu")).set("value", Value::Num(1.0));
        engine.push(e, &mut out);
    }
    engine.flush(&mut out);
    let own: Vec<&Alert> = out.iter().filter(|a| &*a.rule == STATE_EVICTED_RULE).collect();
    assert_eq!(own.len(), 1, "one self-alert while it fires: {own:#?}");
    assert_eq!(own[0].key.get("rule"), Some(&serde_json::json!("host_silent")));
    assert_eq!(engine.evicted()[&("host_silent".to_string(), "cap")], 7);
    // An hour without drops resolves it.
    engine.advance_to(2 * 3_600_000, &mut out);
    let resolved = out.iter().filter(|a| &*a.rule == STATE_EVICTED_RULE && a.status == Status::Resolved).count();
    assert_eq!(resolved, 1);
}

/// A scored rule, one series per host.
const SCORED: &str = r#"rule deviation {
    metric s sample as e #time(1 min)
    state ss { v := avg(e.value) } group by s
    score { z := robust_z(ss.v, window = 16, warmup = 4) }
    alert abs(z) > 100 }"#;

/// One sample of host `i`'s series at `ts`.
fn series_sample(i: i64, ts: Millis) -> Event {
    let mut e = Event::new(Stream::Metric, ts);
    e.set("host", Value::str(&format!("h{i}"))).set("name", Value::str("cpu")).set("value", Value::Num(1.0));
    e
}

#[test]
fn dropping_a_scored_series_raises_one_self_alert_that_a_checkpoint_keeps() {
    let limits = Limits { max_keys: 3, idle_ms: 0 };
    let config = || EngineConfig { limits, ..EngineConfig::default() };
    let mut engine = Engine::new(plans(SCORED), config());
    let mut out = Vec::new();
    for i in 0..10 {
        engine.push(series_sample(i, i * MINUTE), &mut out);
    }
    engine.advance_to(11 * MINUTE, &mut out);
    let own: Vec<&Alert> = out.iter().filter(|a| &*a.rule == STATE_EVICTED_RULE).collect();
    assert_eq!(own.len(), 1, "one self-alert while it fires: {own:#?}");
    assert_eq!(own[0].key.get("rule"), Some(&serde_json::json!("deviation")));
    let summary = own[0].annotations.get("summary").cloned().unwrap_or_default();
    assert!(summary.contains("learned history"), "{summary}");
    assert_eq!(engine.evicted()[&("deviation".to_string(), "cap")], 7);
    // Restored from a checkpoint, the firing self-alert is not raised again, and resolves after
    // an hour without drops.
    let mut restored = Engine::new(plans(SCORED), config());
    restored.restore(engine.snapshot().expect("snapshot")).expect("restore");
    let mut later = Vec::new();
    restored.advance_to(2 * 3_600_000, &mut later);
    let own: Vec<&Alert> = later.iter().filter(|a| &*a.rule == STATE_EVICTED_RULE).collect();
    assert_eq!(own.len(), 1, "{own:#?}");
    assert_eq!(own[0].status, Status::Resolved);
}

#[test]
fn the_state_budget_says_at_once_that_it_dropped_scored_series() {
    let mut engine = Engine::new(plans(SCORED), EngineConfig::default());
    let mut out = Vec::new();
    for i in 0..200 {
        engine.push(series_sample(i, MINUTE), &mut out);
    }
    let budget = engine.state_bytes() / 2;
    engine.enforce_budget(budget, &mut out);
    let own: Vec<&Alert> = out.iter().filter(|a| &*a.rule == STATE_EVICTED_RULE).collect();
    assert_eq!(own.len(), 1, "{own:#?}");
    assert_eq!(own[0].values.get("reason"), Some(&serde_json::json!("memory")));
    // The alert counts the drops that raised it; later drops of the episode are counted in
    // `vigil_evicted_keys_total` without a new alert.
    let first = own[0].values.get("dropped").and_then(serde_json::Value::as_u64).unwrap_or(0);
    assert!(first >= 1 && first <= engine.evicted()[&("deviation".to_string(), "memory")]);
}

#[test]
fn under_a_flood_of_new_series_the_learned_baselines_stay() {
    let mut engine = Engine::new(plans(SCORED), EngineConfig::default());
    let mut out = Vec::new();
    // Fifty series learn for half an hour (a window a minute), then miss a few minutes (idler
    // than any new series) while a thousand new ones come.
    for minute in 0..30 {
        for i in 0..50 {
            engine.push(series_sample(i, minute * MINUTE), &mut out);
        }
    }
    let learned = engine.state_bytes();
    for i in 1_000..2_000 {
        engine.push(series_sample(i, 33 * MINUTE), &mut out);
    }
    engine.enforce_budget(learned + (engine.state_bytes() - learned) / 4, &mut out);
    assert!(engine.evicted()[&("deviation".to_string(), "memory")] > 0);
    assert!(out.iter().any(|a| &*a.rule == STATE_EVICTED_RULE), "the drops are said");
    // Every learned series still judges: a jump of each fires at once, which a series that
    // started again could not (its warm-up is 4 windows).
    out.clear();
    for i in 0..50 {
        let mut e = series_sample(i, 34 * MINUTE);
        e.set("value", Value::Num(5.0));
        engine.push(e, &mut out);
    }
    engine.advance_to(36 * MINUTE, &mut out);
    let fired = out.iter().filter(|a| &*a.rule == "deviation" && a.status == Status::Firing).count();
    assert_eq!(fired, 50, "a learned series was dropped for a new one");
}

#[test]
fn the_estimate_counts_each_series_scores_as_they_grew() {
    const GROWING: &str = r#"rule deviation {
        metric s sample as e #time(1 min)
        state ss { v := avg(e.value) } group by s
        score { z := robust_z(ss.v, window = 256, warmup = 4), p := knn(ss.v, window = 256, calibration = 256) }
        alert abs(z) > 100 }"#;
    let sample = |i: i64, minute: i64| {
        let mut e = series_sample(i, minute * MINUTE);
        e.set("value", Value::Num(((i * 7 + minute * 3) % 11) as f64));
        e
    };
    let learn = |engine: &mut Engine, out: &mut Vec<Alert>| {
        for minute in 0..120 {
            for i in 0..50 {
                engine.push(sample(i, minute), out);
            }
        }
    };
    let flood = |engine: &mut Engine, out: &mut Vec<Alert>| {
        for i in 1_000..2_000 {
            engine.push(sample(i, 123), out);
        }
        engine.advance_to(125 * MINUTE, out);
    };
    let mut out = Vec::new();
    let mut learned = Engine::new(plans(GROWING), EngineConfig::default());
    learn(&mut learned, &mut out);
    learned.advance_to(125 * MINUTE, &mut out);
    let mut young = Engine::new(plans(GROWING), EngineConfig::default());
    flood(&mut young, &mut out);
    let mut both = Engine::new(plans(GROWING), EngineConfig::default());
    learn(&mut both, &mut out);
    flood(&mut both, &mut out);
    // Fifty series of two hours and a thousand of one window, together, hold what each holds
    // alone: no one group's scores stand for the others'.
    let (apart, together) = (learned.state_bytes() + young.state_bytes(), both.state_bytes());
    assert!(learned.state_bytes() / 50 > 2 * young.state_bytes() / 1_000, "a learned series holds more");
    assert!(apart.abs_diff(together) * 50 < together, "apart {apart}, together {together}");
    // Dropping the new series gives back what they held.
    both.enforce_budget(learned.state_bytes() + learned.state_bytes() / 20, &mut out);
    let after = both.state_bytes();
    assert!(after * 20 <= learned.state_bytes() * 21 && after * 10 >= learned.state_bytes() * 9, "{after}");
}
