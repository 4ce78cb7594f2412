//! Criterion micro-benchmarks: parsing and checking, event decoding, and each operator kind.
//! `cargo bench --bench engine`; numbers are in BENCHMARKS.md.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use std::hint::black_box;
use vigil_engine::engine::{Engine, EngineConfig};
use vigil_engine::event::{decode, Event, Value};
use vigil_lang::schema::Stream;

fn shipped_rules() -> Vec<(String, Vec<u8>)> {
    vigil_lang::ruleset::read_files_under(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../rules"))
        .expect("rules folder")
}

fn usage(i: u64, machines: u64) -> Event {
    let mut e = Event::new(Stream::TaskUsage, 1_767_225_600_000 + i as i64);
    e.set("job_id", Value::str(&format!("j{}", i % 100)))
        .set("task_index", Value::Num((i % 1000) as f64))
        .set("machine_id", Value::str(&format!("m{}", i % machines)))
        .set("cpu", Value::Num(((i * 7919) % 1000) as f64 / 1000.0))
        .set("mem", Value::Num(((i * 104729) % 1000) as f64 / 1000.0));
    e
}

fn plans(src: &str) -> Vec<vigil_lang::plan::RulePlan> {
    let c = vigil_lang::compile("bench.saql", src.as_bytes());
    assert!(c.is_ok(), "{:?}", c.diagnostics);
    c.plans
}

/// Events per iteration of the operator benchmarks.
const BATCH: u64 = 10_000;

fn operator(c: &mut Criterion, name: &str, rules: &str, machines: u64) {
    let events: Vec<Event> = (0..BATCH).map(|i| usage(i, machines)).collect();
    let mut group = c.benchmark_group("operator");
    group.throughput(Throughput::Elements(BATCH));
    group.bench_function(name, |b| {
        b.iter_batched(
            || (Engine::new(plans(rules), EngineConfig::default()), events.clone()),
            |(mut engine, events)| {
                let mut out = Vec::new();
                for e in events {
                    engine.push(e, &mut out);
                }
                engine.flush(&mut out);
                black_box(out.len())
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

fn benches(c: &mut Criterion) {
    let rules = shipped_rules();
    let mut group = c.benchmark_group("language");
    group.throughput(Throughput::Elements(rules.len() as u64));
    group.bench_function("parse_and_check_shipped_rules", |b| {
        b.iter(|| black_box(vigil_lang::compile_all(&rules).len()))
    });
    group.finish();

    let line = r#"{"stream":"task_usage","ts":1767225600123,"job_id":"j42","task_index":7,"machine_id":"m123","cpu":0.734,"mem":0.25}"#;
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Bytes(line.len() as u64));
    group.bench_function("task_usage_line", |b| b.iter(|| black_box(decode(black_box(line), None).is_ok())));
    group.finish();

    operator(c, "filter", "rule q1 { task t use machine m as e where e.cpu > 0.95 }", 1000);
    operator(
        c,
        "tumbling_window",
        "rule q2 { task t use machine m as e #time(10 s) state ss { a := avg(e.cpu), x := max(e.mem), n := count() } group by m alert ss.a > 0.9 }",
        1000,
    );
    operator(
        c,
        "sliding_window",
        "rule s { task t use machine m as e #time(1 min, 10 s) state ss { a := avg(e.cpu) } group by m alert ss.a > 0.9 }",
        1000,
    );
    // 250 rules over one shared state that differ in their thresholds, all judged at each of
    // the ten closes (1 s windows over 10 s of events): 2.5M judgements per iteration. No
    // event's cpu reaches a threshold, so it measures judging, not building alerts.
    let thresholds: String = (0..250)
        .map(|i| {
            let t = 1.0 + i as f64 / 1000.0;
            format!("rule w{i} {{ task t use machine m as e #time(1 s) state ss {{ a := avg(e.cpu), n := count() }} group by m alert ss.a > {t} }}\n")
        })
        .collect();
    operator(c, "window_250_threshold_rules", &thresholds, 1000);
    operator(
        c,
        "sequence",
        "rule q3 { task t1 use machine m as e1 where e1.cpu > 0.9 task t2 use machine m as e2 where e2.mem > 0.9 with e1 -> e2 within 30 s }",
        1000,
    );
    operator(
        c,
        "absence",
        "rule quiet { task t1 use machine m as e1 task t2 use machine m as e2 with e1 -> not e2 for 5 s }",
        1000,
    );
    operator(
        c,
        "invariant",
        "rule inv { task t use machine m as e #time(1 s) state ss { a := max(e.cpu) } group by m invariant[3][online] { hi := ss.a; hi = max(hi, ss.a) } alert ss.a > hi * 2 }",
        100,
    );

    let points: Vec<Vec<f64>> = (0..1000).map(|i| vec![((i * 7919) % 1000) as f64 / 1000.0]).collect();
    let mut group = c.benchmark_group("outlier");
    group.throughput(Throughput::Elements(points.len() as u64));
    for (name, method) in [
        ("mad_1000_peers", vigil_lang::plan::ClusterMethod::Mad { threshold: 3.5 }),
        ("dbscan_1000_peers", vigil_lang::plan::ClusterMethod::Dbscan { eps: 0.01, min_pts: 3 }),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                black_box(
                    vigil_engine::engine::judge_peers(&points, method, vigil_lang::plan::Distance::Euclidean).len(),
                )
            })
        });
    }
    group.finish();
}

criterion_group!(engine_benches, benches);
criterion_main!(engine_benches);
