//! The engine as a whole: keys, routing, reloads, limits.

use super::*;
use crate::event::Value;

fn plans(src: &str) -> Vec<RulePlan> {
    let c = vigil_lang::compile("t.saql", src.as_bytes());
    assert!(c.is_ok(), "{:?}", c.diagnostics);
    c.plans
}

const TWO_RULES: &str = r#"
    rule burst { task t fail as e with e{3,} within 1 h group by t.job_id }
    rule spike { task t use machine m as e #time(5 min) state ss { n := count() } group by m alert ss.n > 2 }
"#;

fn fail(min: i64, job: &str) -> Event {
    let mut e = Event::new(vigil_lang::schema::Stream::TaskEvent, min * 60_000);
    e.set("type", Value::str("FAIL")).set("job_id", Value::str(job)).set("task_index", Value::Num(0.0));
    e
}

#[test]
fn a_key_read_in_place_finds_the_key_built_from_the_same_values() {
    use std::hash::BuildHasher;
    let hasher = foldhash::fast::RandomState::default();
    let mut e = Event::new(vigil_lang::schema::Stream::TaskUsage, 42);
    e.set("machine_id", Value::str("m7")).set("cpu", Value::Num(f64::NAN)).set("task_index", Value::Num(3.0));
    let missing = crate::event::TS_INDEX - 1;
    for positions in [vec![2], vec![2, 1], vec![3, 0], vec![crate::event::TS_INDEX, 2], vec![missing], vec![]] {
        let built = Key(positions.iter().map(|&p| e.value(p)).collect());
        let in_place = FieldsKey { event: &e, positions: &positions };
        assert_eq!(hasher.hash_one(&in_place), hasher.hash_one(&built), "{positions:?}");
        assert!(hashbrown::Equivalent::equivalent(&in_place, &built), "{positions:?}");
        let mut other = built.clone();
        other.0.push(Value::Null);
        assert!(!hashbrown::Equivalent::equivalent(&in_place, &other), "{positions:?}: a longer key");
    }
    let mut map: KeyMap<u8> = KeyMap::default();
    map.insert(Key(vec![Value::str("m7")]), 1);
    assert_eq!(map.get(&FieldsKey { event: &e, positions: &[2] }), Some(&1));
    assert_eq!(map.get(&FieldsKey { event: &e, positions: &[0] }), None);
}

#[test]
fn compiled_number_filters_hold_exactly_when_the_evaluator_says_so() {
    let rules = r#"
        rule a { task t use machine m as e where e.cpu > 0.5 }
        rule b { task t use machine m as e where e.cpu >= 0.5 and 0.25 > e.mem }
        rule c { task t use machine m as e where e.mem <= 0.5 and e.cpu < 1 and e.cpu >= 0 }
        rule d { task t use machine m as e where e.cpu > 0.5 or e.mem > 0.5 }
        rule e { task t use machine m as e where e.cpu != 0.5 }
    "#;
    let regexes = RegexCache::default();
    let values =
        [Value::Null, Value::Num(f64::NAN), Value::Num(0.0), Value::Num(0.25), Value::Num(0.5), Value::Num(1.0)];
    let mut compiled = 0;
    for plan in plans(rules) {
        let filter = plan.sources[0].filter.clone().expect("every rule here has a filter");
        let Some(test) = eval::NumberTest::new(&filter, 0) else {
            assert!(["d", "e"].contains(&plan.name.as_str()), "{} should compile", plan.name);
            continue;
        };
        compiled += 1;
        for cpu in &values {
            for mem in &values {
                let mut e = Event::new(vigil_lang::schema::Stream::TaskUsage, 0);
                e.set("cpu", cpu.clone()).set("mem", mem.clone());
                let events = [Some(&e)];
                let expected = eval::holds(&filter, &Env::events(&plan.sources, &events, &regexes));
                assert_eq!(test.holds(&e), expected, "{}: cpu {cpu:?}, mem {mem:?}", plan.name);
            }
        }
    }
    assert_eq!(compiled, 3);
}

#[test]
fn compiled_window_conditions_hold_exactly_when_the_evaluator_says_so() {
    let state = "task t use machine m as e #time(10 s) state[2] ss { a := avg(e.cpu), n := count() } group by m";
    let rules = format!(
        "rule p {{ {state} alert ss.a > 0.5 }}
         rule q {{ {state} alert ss[0].a >= 0.5 and 0.25 > ss.n }}
         rule r {{ {state} alert ss.n <= 0.5 and ss.a < 1 and ss.a >= 0 }}
         rule s {{ {state} alert ss[1].a > 0.5 }}
         rule t {{ {state} alert ss.a > ss.n }}
         rule u {{ {state} alert ss.a > 0.5 or ss.n > 0.5 }}"
    );
    let regexes = RegexCache::default();
    let values =
        [Value::Null, Value::Num(f64::NAN), Value::Num(0.0), Value::Num(0.25), Value::Num(0.5), Value::Num(1.0)];
    let mut compiled = Vec::new();
    for plan in plans(&rules) {
        let condition = &plan.alert.condition;
        let Some(test) = eval::NumberTest::of_window(condition) else { continue };
        compiled.push(plan.name.clone());
        for a in &values {
            for n in &values {
                let newest: Arc<[Value]> = vec![a.clone(), n.clone()].into();
                let older: Arc<[Value]> = vec![Value::Num(0.9), Value::Num(0.9)].into();
                for history in [vec![newest.clone()], vec![newest, older], vec![]] {
                    let events = [None];
                    let env = Env {
                        sources: &plan.sources,
                        events: &events,
                        state: Some(&history),
                        baselines: None,
                        cluster: None,
                        regexes: &regexes,
                        scores: None,
                        intervals: None,
                    };
                    let expected = eval::holds(condition, &env);
                    assert_eq!(test.holds_on_window(&history), expected, "{}: {history:?}", plan.name);
                }
            }
        }
    }
    assert_eq!(compiled, ["p", "q", "r"], "only comparisons of the newest window with literals compile");
}

#[test]
fn many_threshold_rules_over_one_state_alert_as_each_would_alone() {
    // The rules share one window operator and are judged by compiled tests; each run alone
    // (no sharing) must give the same alerts, resolutions included.
    let rule = |i: usize, threshold: f64| {
        format!(
            "rule w{i} {{ task t use machine m as e #time(10 s)
               state ss {{ c := avg(e.cpu), n := count() }} group by m
               alert ss.c > {threshold} and ss.n >= 2 }}\n"
        )
    };
    let thresholds = [0.3, 0.5, 0.5, 0.7, 0.9];
    let all: String = thresholds.iter().enumerate().map(|(i, &t)| rule(i, t)).collect();
    let events: Vec<Event> = (0..600)
        .map(|i| {
            let mut e = Event::new(vigil_lang::schema::Stream::TaskUsage, i * 250);
            e.set("job_id", Value::str("j")).set("task_index", Value::Num(0.0));
            let cpu = ((i * 37) % 100) as f64 / 100.0;
            e.set("machine_id", Value::str(&format!("m{}", i % 7))).set("cpu", Value::Num(cpu));
            e
        })
        .collect();
    let run = |rules: &str| {
        let mut engine = Engine::new(plans(rules), EngineConfig::default());
        let mut out = Vec::new();
        for e in &events {
            engine.push(e.clone(), &mut out);
        }
        engine.advance_to(200_000, &mut out);
        out.into_iter().map(|a| (a.rule.to_string(), a.id, a.status, a.time)).collect::<Vec<_>>()
    };
    let shared = run(&all);
    let mut alone: Vec<_> = thresholds.iter().enumerate().flat_map(|(i, &t)| run(&rule(i, t))).collect();
    let mut together = shared.clone();
    together.sort_by(|a, b| (&a.0, a.3, &a.1).cmp(&(&b.0, b.3, &b.1)));
    alone.sort_by(|a, b| (&a.0, a.3, &a.1).cmp(&(&b.0, b.3, &b.1)));
    assert_eq!(together, alone);
    let resolved = shared.iter().filter(|a| a.2 == crate::alert::Status::Resolved).count();
    assert!(resolved > 0 && shared.len() > resolved, "the run fires and resolves: {shared:?}");
}

#[test]
fn window_arguments_read_in_place_or_evaluated_agree_and_alerts_come_in_key_order() {
    // `sum(e.cpu)` is read in place, `sum(e.cpu * 100)` through the evaluator, `count()`
    // has no argument; each window's alerts come out by machine whatever the map's order.
    let rule = r#"
        rule w {
          task t use machine m as e #time(10 s)
          state ss { a := sum(e.cpu), b := sum(e.cpu * 100), n := count() } group by m
          alert ss.n > 0 and ss.b == ss.a * 100
          return ss.a, ss.b, ss.n
        }
    "#;
    let mut engine = Engine::new(plans(rule), EngineConfig::default());
    let mut out = Vec::new();
    for i in 0..200 {
        let mut e = Event::new(vigil_lang::schema::Stream::TaskUsage, i * 100);
        e.set("job_id", Value::str("j")).set("task_index", Value::Num(0.0));
        e.set("machine_id", Value::str(&format!("m{}", (i * 7) % 40))).set("cpu", Value::Num(0.5));
        engine.push(e, &mut out);
    }
    engine.advance_to(100_000, &mut out);
    let fired: Vec<&Alert> = out.iter().filter(|a| a.status == crate::alert::Status::Firing).collect();
    assert_eq!(fired.len(), 40, "every machine fires once, in the first window it has events");
    for a in &fired {
        let n = a.values.get("ss.n").and_then(|v| v.as_f64()).expect("n is returned");
        assert_eq!(a.values.get("ss.a").and_then(|v| v.as_f64()), Some(0.5 * n));
        assert_eq!(a.values.get("ss.b").and_then(|v| v.as_f64()), Some(50.0 * n));
    }
    for pair in fired.windows(2) {
        let machine = |a: &Alert| a.key.get("m.machine_id").and_then(|v| v.as_str().map(str::to_string));
        if pair[0].time == pair[1].time {
            assert!(machine(pair[0]) < machine(pair[1]), "{:?} before {:?}", machine(pair[0]), machine(pair[1]));
        }
    }
}

#[test]
fn settling_releases_the_newest_millisecond_within_the_lateness() {
    let rule = "rule hot { task t use machine m as e where e.cpu > 0.9 }";
    let usage = |ts: Millis, cpu: f64| {
        let mut e = Event::new(vigil_lang::schema::Stream::TaskUsage, ts);
        e.set("job_id", Value::str("j")).set("task_index", Value::Num(0.0)).set("machine_id", Value::str("m"));
        e.set("cpu", Value::Num(cpu));
        e
    };
    let mut out = Vec::new();
    let mut engine = Engine::new(plans(rule), EngineConfig::default());
    engine.push(usage(1_000, 0.95), &mut out);
    assert!(out.is_empty(), "the newest millisecond waits for a newer event");
    engine.settle(&mut out);
    let firing = |out: &[Alert]| out.iter().filter(|a| a.status == crate::alert::Status::Firing).count();
    assert_eq!(firing(&out), 1, "settled, its alert comes out");
    assert!(!engine.push(usage(1_000, 0.5), &mut out), "the settled millisecond is closed");
    // With a lateness, settling releases only what the lateness allows.
    let mut late = Engine::new(plans(rule), EngineConfig { lateness_ms: 5_000, ..EngineConfig::default() });
    let mut out = Vec::new();
    late.push(usage(1_000, 0.95), &mut out);
    late.push(usage(6_000, 0.5), &mut out);
    assert!(out.is_empty(), "5 s back, the first event still waits");
    late.settle(&mut out);
    assert_eq!(firing(&out), 1, "settled, the event 5 s back is released");
    assert!(late.push(usage(3_000, 0.5), &mut out), "an event within the lateness is still taken");
}

#[test]
fn time_moves_no_further_than_the_slowest_source_allows() {
    // Two shards resending a backlog: the fast one an hour ahead of the slow one. With the slow
    // one's time given, none of its events is late, and the alerts are those of sorted input.
    let mut engine = Engine::new(plans(TWO_RULES), EngineConfig::default());
    let mut out = Vec::new();
    engine.set_slowest(Some(0), &mut out);
    for min in 60..63 {
        assert!(engine.push(fail(min, "fast"), &mut out));
    }
    assert!(engine.watermark().is_none_or(|w| w < 0), "nothing released past the slow shard");
    for min in 0..3 {
        assert!(engine.push(fail(min, "slow"), &mut out), "the slow shard's minute {min} is not late");
        engine.set_slowest(Some(min * 60_000), &mut out);
    }
    engine.set_slowest(Some(62 * 60_000), &mut out);
    let firing = |out: &[Alert]| -> Vec<String> {
        let firing = out.iter().filter(|a| a.status == crate::alert::Status::Firing);
        firing.map(|a| format!("{:?}", a.key)).collect()
    };
    let jobs = firing(&out);
    assert_eq!(jobs.len(), 1, "the slow job's burst; the fast one's newest minute waits: {jobs:?}");
    assert!(jobs[0].contains("slow"), "{jobs:?}");
    engine.set_slowest(None, &mut out);
    engine.flush(&mut out);
    assert_eq!(firing(&out).len(), 2, "no source holds time back: the rest is released");
    assert!(!engine.push(fail(30, "slow"), &mut out), "behind both shards, late");
}

#[test]
fn the_state_budget_releases_what_a_slow_source_holds_back() {
    let mut engine = Engine::new(plans(TWO_RULES), EngineConfig::default());
    let mut out = Vec::new();
    engine.set_slowest(Some(0), &mut out);
    for min in 60..120 {
        assert!(engine.push(fail(min, "fast"), &mut out));
    }
    let held = engine.state_bytes();
    assert_eq!(engine.enforce_budget(held, &mut out), held, "within the budget, the hold stays");
    assert!(engine.watermark().is_none_or(|w| w < 0));
    engine.enforce_budget(held / 2, &mut out);
    assert!(engine.watermark().is_some_and(|w| w >= 60 * 60_000), "the oldest released");
    assert!(!engine.push(fail(30, "slow"), &mut out), "the slow source's later events are late");
    engine.enforce_budget(0, &mut out);
    assert_eq!(engine.watermark(), Some(119 * 60_000), "all of them");
}

#[test]
fn reload_keeps_the_state_of_unchanged_rules() {
    let mut engine = Engine::new(plans(TWO_RULES), EngineConfig::default());
    let mut out = Vec::new();
    engine.push(fail(0, "j1"), &mut out);
    engine.push(fail(1, "j1"), &mut out);
    // `spike` changes, `burst` does not: its two counted failures survive the reload.
    let changed = TWO_RULES.replace("ss.n > 2", "ss.n > 3");
    let kept = engine.reload(plans(&changed));
    assert_eq!(kept, vec!["burst".to_string()]);
    engine.push(fail(2, "j1"), &mut out);
    engine.flush(&mut out);
    let fired = out.iter().filter(|a| &*a.rule == "burst" && a.status == crate::alert::Status::Firing).count();
    assert_eq!(fired, 1, "the third failure completes the burst");
}

#[test]
fn a_changed_rule_starts_over() {
    let mut engine = Engine::new(plans(TWO_RULES), EngineConfig::default());
    let mut out = Vec::new();
    engine.push(fail(0, "j1"), &mut out);
    engine.push(fail(1, "j1"), &mut out);
    let changed = TWO_RULES.replace("within 1 h", "within 2 h");
    assert_eq!(engine.reload(plans(&changed)), vec!["spike".to_string()]);
    engine.push(fail(2, "j1"), &mut out);
    engine.flush(&mut out);
    assert!(out.is_empty(), "the changed rule lost its count: {out:?}");
}

const NO_WITHIN: &str = r#"
    rule evict_fail { task t evict as e1 task t fail as e2 with e1 -> e2 within 30 d }
"#;

fn task(kind: &str, min: i64, job: &str) -> Event {
    let mut e = fail(min, job);
    e.set("type", Value::str(kind));
    e
}

fn limited(src: &str, max_keys: usize, idle_ms: Millis) -> Engine {
    Engine::new(
        plans(src),
        EngineConfig { lateness_ms: 0, limits: Limits { max_keys, idle_ms }, ..EngineConfig::default() },
    )
}

#[test]
fn past_the_cap_the_oldest_partial_match_goes_and_is_counted() {
    let mut engine = limited(NO_WITHIN, 3, 0);
    let mut out = Vec::new();
    for (i, job) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        engine.push(task("EVICT", i as i64, job), &mut out);
    }
    engine.flush(&mut out);
    assert_eq!(engine.live_keys()["evict_fail"], 3);
    assert_eq!(engine.evicted()[&("evict_fail".to_string(), "cap")], 2);
    // `a` and `b` were dropped; `e` is still waiting for its failure.
    engine.push(task("FAIL", 10, "a"), &mut out);
    engine.push(task("FAIL", 11, "e"), &mut out);
    engine.flush(&mut out);
    let jobs: Vec<String> = out
        .iter()
        .filter(|a| a.status == crate::alert::Status::Firing)
        .map(|a| a.key.iter().map(|(_, v)| v.to_string()).collect())
        .collect();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert!(jobs[0].contains("\"e\""), "{jobs:?}");
}

#[test]
fn a_partial_match_without_progress_expires_after_the_idle_time() {
    let mut engine = limited(NO_WITHIN, 1_000, 60 * 60_000);
    let mut out = Vec::new();
    engine.push(task("EVICT", 0, "old"), &mut out);
    engine.push(task("EVICT", 30, "young"), &mut out);
    // Two hours later: `old` has waited over an hour, `young` too by then.
    engine.push(task("FAIL", 61, "young"), &mut out);
    engine.push(task("FAIL", 120, "old"), &mut out);
    engine.flush(&mut out);
    let fired: Vec<&Alert> = out.iter().filter(|a| a.status == crate::alert::Status::Firing).collect();
    assert_eq!(fired.len(), 1, "only `young` completes in time: {fired:#?}");
    // `old` went waiting; `young`'s prefix, kept for more failures, went an hour after its
    // eviction, long before its 30 days.
    assert_eq!(engine.evicted()[&("evict_fail".to_string(), "idle")], 2);
    assert_eq!(engine.live_keys()["evict_fail"], 0);
}

#[test]
fn a_windowed_rule_past_its_cap_drops_its_idlest_groups() {
    let src =
        "rule per_job { task t fail as e #time(1 min) state ss { n := count() } group by t.job_id alert ss.n > 5 }";
    let mut engine = limited(src, 32, 0);
    let mut out = Vec::new();
    for i in 0..100 {
        engine.push(task("FAIL", i / 50, &format!("j{i}")), &mut out);
    }
    engine.flush(&mut out);
    let live = engine.live_keys()["per_job"];
    assert!(live <= 32, "{live} groups live");
    let evicted = engine.evicted()[&("per_job".to_string(), "cap")];
    assert!(evicted >= 68, "{evicted} evicted");
}

#[test]
fn editing_what_a_rule_says_keeps_its_windows_and_active_alerts() {
    let rule = |description: &str, severity: &str, note: &str, team: &str| {
        format!(
            r#"rule spike {{
                description "{description}"
                task t use machine m as e #time(1 min)
                state[3] ss {{ n := count() }} group by m
                alert ss.n > 2 severity {severity}
                labels {{ team = "{team}" }}
                annotations {{ summary = "{note} {{m.machine_id}}" }}
                return ss.n as seen
            }}"#
        )
    };
    let usage = |ts: Millis, machine: &str| {
        let mut e = Event::new(vigil_lang::schema::Stream::TaskUsage, ts);
        e.set("job_id", Value::str("j")).set("task_index", Value::Num(0.0)).set("machine_id", Value::str(machine));
        e.set("cpu", Value::Num(0.5));
        e
    };
    let first = rule("before", "warning", "busy", "a");
    let second = rule("after", "critical", "very busy", "b");
    assert_ne!(plans(&first)[0].to_string(), plans(&second)[0].to_string(), "the plans print differently");
    assert_eq!(plans(&first)[0].state_id(), plans(&second)[0].state_id(), "but keep the same state");
    let run = |edit_at: Option<Millis>| {
        let mut engine = Engine::new(plans(&first), EngineConfig::default());
        let mut out = Vec::new();
        for i in 0..40 {
            let ts = i * 10_000;
            if edit_at == Some(ts) {
                assert_eq!(engine.reload(plans(&second)), vec!["spike".to_string()], "the state is kept");
            }
            // Busy for the first three minutes, then quiet, on m1; m2 only now and then.
            if ts < 180_000 {
                engine.push(usage(ts, "m1"), &mut out);
            }
            if i % 9 == 0 {
                engine.push(usage(ts, "m2"), &mut out);
            }
        }
        engine.advance_to(600_000, &mut out);
        out.into_iter().map(|a| (a.id, a.status, a.time)).collect::<Vec<_>>()
    };
    let unchanged = run(None);
    assert!(unchanged.iter().any(|a| a.1 == crate::alert::Status::Resolved), "fires and resolves: {unchanged:?}");
    // Edited while m1's alert fires and its windows are open: the same alert, resolved once.
    assert_eq!(run(Some(150_000)), unchanged);
}

#[test]
fn a_series_is_its_host_its_name_and_its_whole_label_set() {
    let rule = r#"rule busy { metric s sample as e #time(1 min) state ss { v := avg(e.value) } group by s
        alert ss.v > 75 }"#;
    let sample = |ts: Millis, labels: Option<&[(&str, &str)]>, value: f64| {
        let mut e = Event::new(vigil_lang::schema::Stream::Metric, ts);
        e.set("host", Value::str("h1")).set("name", Value::str("cpu_busy")).set("value", Value::Num(value));
        if let Some(labels) = labels {
            let map = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            e.set("labels", Value::Map(std::sync::Arc::new(map)));
        }
        e
    };
    let mut engine = Engine::new(plans(rule), EngineConfig::default());
    let mut out = Vec::new();
    for i in 0..6 {
        engine.push(sample(i * 10_000, Some(&[("cpu", "0")]), 1.0), &mut out);
        engine.push(sample(i * 10_000, Some(&[("cpu", "1")]), 100.0), &mut out);
        // No labels and an empty label set are one series.
        engine.push(sample(i * 10_000, None, 80.0), &mut out);
        engine.push(sample(i * 10_000 + 1, Some(&[]), 90.0), &mut out);
    }
    engine.advance_to(300_000, &mut out);
    let mut keys: Vec<String> = out
        .iter()
        .filter(|a| a.status == crate::alert::Status::Firing)
        .map(|a| serde_json::to_string(&a.key).unwrap())
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [r#"{"s.host":"h1","s.labels":{"cpu":"1"},"s.name":"cpu_busy"}"#, r#"{"s.host":"h1","s.name":"cpu_busy"}"#],
        "cpu 0 averages 1 and does not fire; cpu 1 and the unlabelled series (85) do"
    );
}

#[test]
fn many_series_of_a_host_alerting_together_roll_up_and_a_checkpoint_keeps_the_count() {
    let rule = r#"rule hot { metric s sample as e #time(10 min) state ss { v := avg(e.value) } group by s
        alert ss.v > 75 severity warning
        rollup by s.host severity critical }"#;
    let sample = |ts: Millis, host: &str, name: &str, value: f64| {
        let mut e = Event::new(vigil_lang::schema::Stream::Metric, ts);
        e.set("host", Value::str(host)).set("name", Value::str(name)).set("value", Value::Num(value));
        e
    };
    const MIN: Millis = 60_000;
    let feed =
        |engine: &mut Engine, from: Millis, to: Millis, hot: &dyn Fn(Millis, usize) -> bool, out: &mut Vec<Alert>| {
            for t in (from..to).step_by(10 * MIN as usize) {
                for (i, name) in ["cpu", "mem", "disk", "net"].iter().enumerate() {
                    let value = if hot(t, i) { 90.0 } else { 10.0 };
                    engine.push(sample(t, "h1", name, value), out);
                }
            }
        };
    let mut engine = Engine::new(plans(rule), EngineConfig::default());
    let mut out = Vec::new();
    // A day and a half: one series hot now and then, never two at once.
    feed(&mut engine, 0, 36 * 60 * MIN, &|t, i| i == 0 && (t / (60 * MIN)) % 5 == 0 && t % (60 * MIN) == 0, &mut out);
    assert!(out.iter().all(|a| &*a.severity == "warning"), "no roll-up from one series at a time");
    let single = out.iter().filter(|a| a.status == crate::alert::Status::Firing).count();
    assert!(single > 3, "{single}");
    let snapshot = engine.snapshot().expect("snapshot");
    let mut restored = Engine::new(plans(rule), EngineConfig::default());
    restored.restore(snapshot).expect("restores");
    out.clear();
    // Then all four at once: at the host's rate (8 alerts in 37 hours), 3 in an hour would have
    // a chance of about 2e-3, 4 of about 1e-4.
    let start = 36 * 60 * MIN;
    feed(
        &mut restored,
        start,
        start + 2 * 60 * MIN,
        &|t, _| (start + 10 * MIN..start + 30 * MIN).contains(&t),
        &mut out,
    );
    let pages: Vec<&Alert> = out.iter().filter(|a| &*a.severity == "critical").collect();
    assert_eq!(pages.len(), 2, "one roll-up, fired and resolved: {pages:?}");
    assert_eq!(serde_json::to_string(&pages[0].key).unwrap(), r#"{"s.host":"h1"}"#);
    assert_eq!(pages[0].values.get("alerted"), Some(&serde_json::json!(4)));
    assert_eq!(pages[1].status, crate::alert::Status::Resolved);
    // Its state is partitioned by host: every series of a host is judged where its roll-up is.
    let groups = |host: &str, name: &str| {
        let mut into = Vec::new();
        restored.key_groups(&sample(0, host, name, 1.0), &mut into);
        into
    };
    assert_eq!(groups("h1", "cpu"), groups("h1", "mem"));
    let spread: std::collections::BTreeSet<Vec<u32>> = (0..20).map(|i| groups(&format!("h{i}"), "cpu")).collect();
    assert!(spread.len() > 10, "hosts spread over key groups: {spread:?}");
}

#[test]
fn scorers_whose_state_changed_give_their_rule_a_new_state_identity_once() {
    let rule = |scores: &str| {
        format!(
            "rule r {{ metric s sample as e #time(5 min) state ss {{ v := avg(e.value) }} group by s \
             score {{ {scores} }} alert a > 0.9 }}"
        )
    };
    let versioned = plans(&rule("a := knn(ss.v), b := knn(ss.v, k = 4), c := change_rate(ss.v)"));
    let vigil_lang::plan::ModelPlan::Scored(_, score) = &versioned[0].model else { panic!("a scored rule") };
    assert_eq!(score.state_versions(), vec![("scores", 1), ("knn", 2), ("change_rate", 1)]);
    let plain = plans(&rule("a := novelty(ss.v)"));
    let vigil_lang::plan::ModelPlan::Scored(_, score) = &plain[0].model else { panic!("a scored rule") };
    assert_eq!(score.state_versions(), vec![("scores", 1)], "the block's layout alone");
}

/// Two files compiled together: a declaration of `pods` with `count` of type `ty`, and a
/// sequence over it.
fn declared(ty: &str) -> (Vec<RulePlan>, vigil_lang::schema::Catalog) {
    let streams = format!(
        "entity pod (namespace, pod)\nstream pods {{ fields {{ namespace: string, pod: string, reason: string, \
         count?: {ty} }} entity pod (namespace, pod) operation reason op pod evict = \"Evicted\" \
         op pod fail = \"Failed\" }}"
    );
    let rule = "rule moved { pod p evict as e1 pod p fail as e2 with e1 -> e2 within 1 h }";
    let files = vigil_lang::compile_all(&[("s.saql".into(), streams.into_bytes()), ("r.saql".into(), rule.into())]);
    assert!(files.iter().all(|c| c.is_ok()), "{:?}", files.iter().map(|c| &c.diagnostics).collect::<Vec<_>>());
    (files.iter().flat_map(|c| c.plans.clone()).collect(), files[0].catalog.clone())
}

#[test]
fn a_checkpoint_restores_state_under_the_declarations_it_was_built_under_only() {
    let (plans_before, catalog) = declared("number");
    let mut engine = Engine::new(plans_before.clone(), EngineConfig::default());
    let mut decoder = crate::event::LineDecoder::new(catalog);
    let evicted = r#"{"stream":"pods","ts":60000,"namespace":"shop","pod":"cart","reason":"Evicted"}"#;
    let mut out = Vec::new();
    engine.push(decoder.decode(evicted, None).expect("an event of pods"), &mut out);
    let bytes = postcard::to_stdvec(&engine.snapshot().expect("snapshot")).expect("serializes");
    // The same declarations, as a restarted process reads them: the partial match is back.
    let mut again = Engine::new(declared("number").0, EngineConfig::default());
    let snapshot: super::snapshot::Snapshot = postcard::from_bytes(&bytes).expect("the declaration is registered");
    assert_eq!(again.restore(snapshot).expect("restores"), vec!["moved".to_string()]);
    let (_, catalog) = declared("number");
    let failed = r#"{"stream":"pods","ts":120000,"namespace":"shop","pod":"cart","reason":"Failed"}"#;
    again.push(crate::event::LineDecoder::new(catalog).decode(failed, None).expect("event"), &mut out);
    again.flush(&mut out);
    let firing = out.iter().filter(|a| a.status == crate::alert::Status::Firing);
    assert_eq!(firing.map(|a| a.evidence.len()).collect::<Vec<_>>(), vec![2], "the restored eviction and the failure");
    // `count` retyped: another declaration, so the rule's state is another computation and the
    // checkpoint's is not read under it.
    let (plans_after, _) = declared("string");
    assert_ne!(plans_after[0].state_id(), plans_before[0].state_id());
    let mut changed = Engine::new(plans_after, EngineConfig::default());
    let snapshot: super::snapshot::Snapshot = postcard::from_bytes(&bytes).expect("both are registered");
    assert!(changed.restore(snapshot).expect("restores").is_empty(), "the changed stream's rule starts empty");
}
