use super::Runtime;
use crate::engine::EngineConfig;
use crate::event::{decode, Event};

/// A fleet-wide rule: each machine's load against its cluster's, split in two stages when the
/// runtime has more than one partition.
fn fleet_wide() -> Vec<vigil_lang::plan::RulePlan> {
    let src = "rule load_outlier { task t use machine m as e #time(1 min) state ss { load := sum(e.cpu) } \
               group by m, e.cluster cluster(points = all(ss.load) per e.cluster, method = mad(3.5)) \
               alert cluster.outlier }";
    let c = vigil_lang::compile("r.saql", src.as_bytes());
    assert!(c.is_ok(), "{:?}", c.diagnostics);
    c.plans
}

fn usage(ts: i64, machine: usize) -> Event {
    let line = format!(
        r#"{{"stream":"task_usage","ts":{ts},"job_id":"j","task_index":0,"machine_id":"m{machine}","cluster":"c{}","cpu":0.5}}"#,
        machine % 20
    );
    decode(&line, None).expect("event")
}

#[test]
fn the_stage_two_keeps_to_its_share_of_the_budget_and_is_counted() {
    let mut rt = Runtime::new(fleet_wide(), EngineConfig::default(), 4, 2);
    let mut out = Vec::new();
    for minute in 0..3 {
        let events = (0..4_000).map(|m| usage(minute * 60_000 + m as i64, m)).collect();
        rt.push(events, Vec::new(), &mut out);
    }
    rt.flush(&mut out);
    let Some(stage_two) = rt.stage_two_bytes() else { panic!("the rule runs in two stages") };
    assert!(stage_two > 0, "the stage two keeps the machines' history");
    assert_eq!(rt.live_keys(&mut out)["load_outlier"], 4_000, "each machine counted once");

    let before = rt.enforce_budget(usize::MAX, &mut out);
    let budget = before / 4;
    let after = rt.enforce_budget(budget, &mut out);
    assert!(after <= budget, "{after} bytes kept over a budget of {budget}");
    assert!(rt.stage_two_bytes().expect("two stages") <= budget / 5, "the stage two keeps to its share");
    let evicted = rt.evicted(&mut out);
    assert!(evicted[&("load_outlier".to_string(), "memory")] > 0, "{evicted:?}");
    assert!(rt.live_keys(&mut out)["load_outlier"] < 4_000);
}
