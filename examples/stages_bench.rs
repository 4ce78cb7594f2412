//! What splitting a fleet-wide rule in two stages buys a group (`--kafka-join-group`): the
//! work of each keyed partition's engine, whole and in two stages, without Kafka.
//!
//! ```text
//! cargo run --release --example stages_bench -- [MACHINES] [MINUTES] [PARTITIONS]
//! ```
//!
//! Makes one `task_usage` sample per machine and minute (machines in 100 clusters, one in 500
//! far from its cluster), routes each event to the keyed partitions of its key groups as a
//! group's forwarder does, and runs `rules/machine_load_outlier.saql` in each partition's
//! engine: first whole (the partition that owns the rule's state does all of its work), then in
//! two stages (each partition summarises its own machines' windows; the stage twos judge the
//! summaries). Prints each stage's time per partition, the summaries sent, and checks that both
//! raise the same alerts.

use std::collections::BTreeMap;
use std::time::Instant;
use vigil::engine::stage_two::{self, StageTwo};
use vigil::engine::{Engine, EngineConfig, Shard};
use vigil::event::{Event, Value};
use vigil::schema::Stream;

const CLUSTERS: usize = 100;

fn events(machines: usize, minutes: usize) -> Vec<Event> {
    let start = 1_767_225_600_000i64;
    let mut out = Vec::with_capacity(machines * minutes);
    for minute in 0..minutes {
        for m in 0..machines {
            let ts = start + minute as i64 * 60_000 + (m as i64 * 60_000) / machines as i64;
            let odd = m % 500 == 7;
            let cpu = if odd { 0.95 } else { 0.4 + ((m * 7919 + minute * 31) % 100) as f64 / 1000.0 };
            let mut e = Event::new(Stream::TaskUsage, ts);
            e.set("job_id", Value::str(&format!("j{}", m % 50)))
                .set("task_index", Value::Num((m % 10) as f64))
                .set("machine_id", Value::str(&format!("m{m}")))
                .set("cluster", Value::str(&format!("c{}", m % CLUSTERS)))
                .set("cpu", Value::Num(cpu))
                .set("mem", Value::Num(0.2));
            out.push(e);
        }
    }
    out
}

/// Each event's keyed partitions, as a group's forwarder routes it.
fn routed(plans: &[vigil::plan::RulePlan], two_stage: bool, events: &[Event], partitions: usize) -> Vec<Vec<Event>> {
    let router = Engine::new(plans.to_vec(), EngineConfig { two_stage, ..Default::default() });
    let mut out = vec![Vec::new(); partitions];
    let mut groups = Vec::new();
    for e in events {
        router.key_groups(e, &mut groups);
        let mut targets: Vec<usize> = groups.iter().map(|g| *g as usize % partitions).collect();
        targets.dedup();
        for t in targets {
            out[t].push(e.clone());
        }
    }
    out
}

/// Runs each partition's engine over its events to their end; (seconds, alerts, engine) each.
fn run(
    plans: &[vigil::plan::RulePlan],
    two_stage: bool,
    by_partition: Vec<Vec<Event>>,
) -> Vec<(f64, Vec<vigil::alert::Alert>, Engine)> {
    let count = by_partition.len();
    by_partition
        .into_iter()
        .enumerate()
        .map(|(index, events)| {
            let config = EngineConfig { shard: Shard { index, count }, two_stage, ..Default::default() };
            let mut engine = Engine::new(plans.to_vec(), config);
            let mut out = Vec::new();
            let started = Instant::now();
            for e in events {
                engine.push(e, &mut out);
            }
            engine.release_to(i64::MAX / 8, &mut out);
            (started.elapsed().as_secs_f64(), out, engine)
        })
        .collect()
}

fn ids(alerts: impl Iterator<Item = vigil::alert::Alert>) -> Vec<(String, u8)> {
    let mut out: Vec<(String, u8)> = alerts.map(|a| (a.id, a.status as u8)).collect();
    out.sort();
    out
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let machines = args.first().copied().unwrap_or(20_000);
    let minutes = args.get(1).copied().unwrap_or(60);
    let partitions = args.get(2).copied().unwrap_or(12);
    let source = std::fs::read("rules/machine_load_outlier.saql").expect("run from the repository");
    let compiled = vigil::compile("machine_load_outlier.saql", &source);
    assert!(compiled.is_ok(), "{:?}", compiled.diagnostics);
    let plans = compiled.plans;
    let events = events(machines, minutes);
    println!("{} events: {machines} machines, {minutes} minutes, {partitions} keyed partitions", events.len());

    let whole = run(&plans, false, routed(&plans, false, &events, partitions));
    let times: Vec<String> = whole.iter().map(|(s, ..)| format!("{s:.3}")).collect();
    println!("whole: seconds per partition [{}]", times.join(", "));
    let want = ids(whole.into_iter().flat_map(|(_, a, _)| a));

    let staged = run(&plans, true, routed(&plans, true, &events, partitions));
    let times: Vec<String> = staged.iter().map(|(s, ..)| format!("{s:.3}")).collect();
    println!("stage one: seconds per partition [{}]", times.join(", "));
    // Every partition's summaries, to the stage two of their peer group.
    let mut inbox: BTreeMap<i32, Vec<(i32, stage_two::Summary)>> = BTreeMap::new();
    let mut got = Vec::new();
    let (mut records, mut groups) = (0, 0);
    for (source, (_, alerts, mut engine)) in staged.into_iter().enumerate() {
        got.extend(alerts);
        for summary in engine.take_summaries() {
            let mut split: BTreeMap<i32, Vec<stage_two::Summarised>> = BTreeMap::new();
            for g in summary.groups {
                groups += 1;
                split.entry(stage_two::partition_of(&summary.op, &g.peers, partitions as u32)).or_default().push(g);
            }
            for (to, gs) in split {
                records += 1;
                let s = stage_two::Summary { op: summary.op.clone(), end: summary.end, groups: gs };
                inbox.entry(to).or_default().push((source as i32, s));
            }
        }
    }
    let mut two = Vec::new();
    for (to, summaries) in inbox {
        let started = Instant::now();
        let mut judge = StageTwo::new(&plans, &EngineConfig::default(), partitions as u32);
        for (source, s) in summaries {
            judge.take(source, s);
        }
        for p in 0..partitions as i32 {
            judge.report(p, i64::MAX / 8);
        }
        judge.advance(&mut got);
        two.push(format!("{to}: {:.3}", started.elapsed().as_secs_f64()));
    }
    println!("stage two: seconds per partition [{}]", two.join(", "));
    println!(
        "summaries: {records} records, {groups} group windows ({:.1} per event)",
        groups as f64 / events.len() as f64
    );
    let got = ids(got.into_iter());
    assert_eq!(got, want, "two stages raise the alerts of one engine");
    println!("alerts: {} transitions, the same in both", want.len());
}
