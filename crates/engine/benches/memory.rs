//! Memory per live key, counted by a wrapping allocator (resident-set sizes include freed and
//! fragmented memory, so they overstate it). `cargo bench --bench memory`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use vigil_engine::engine::{Engine, EngineConfig};
use vigil_engine::event::{Event, Value};
use vigil_lang::schema::Stream;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn usage(i: u64, keys: u64, ts: i64) -> Event {
    let mut e = Event::new(Stream::TaskUsage, ts);
    e.set("job_id", Value::str(&format!("j{}", i % 100)))
        .set("task_index", Value::Num((i % 1000) as f64))
        .set("machine_id", Value::str(&format!("m{}", i % keys)))
        .set("cpu", Value::Num(((i * 7919) % 1000) as f64 / 1000.0))
        .set("mem", Value::Num(((i * 104729) % 1000) as f64 / 1000.0));
    e
}

/// Bytes held per live key after `keys` keys each saw one event in each of `rounds` windows an
/// hour apart: for `rounds` > 1 the earlier windows have closed, so this is the steady state
/// (what a closed window leaves behind, and the current one).
fn measure(name: &str, rule: &str, keys: u64, rounds: u64) -> f64 {
    let c = vigil_lang::compile("memory.saql", rule.as_bytes());
    assert!(c.is_ok(), "{:?}", c.diagnostics);
    let mut engine = Engine::new(c.plans, EngineConfig::default());
    let mut out = Vec::new();
    let before = LIVE.load(Ordering::Relaxed);
    for i in 0..keys * rounds {
        let round = (i / keys) as i64;
        engine.push(usage(i, keys, 1_767_225_600_000 + round * 3_600_000 + ((i % keys) / 1000) as i64), &mut out);
    }
    out.clear();
    out.shrink_to_fit();
    let held = LIVE.load(Ordering::Relaxed) - before;
    let live: usize = engine.live_keys().values().sum();
    let per_key = held as f64 / live.max(1) as f64;
    println!("{name:<48} {live:>8} live keys  {per_key:>6.0} bytes per key");
    drop(engine);
    per_key
}

/// Bytes held per metric series by the whole `rules/metrics` folder, after each of `series`
/// series (ten per host) sent `samples` five-minute samples: past every scorer's window, so
/// this is the steady state a fleet keeps per series.
/// The `rules/metrics` folder's engine.
fn metric_folder() -> Engine {
    let set = vigil_lang::ruleset::RuleSet::load(&[
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../rules/metrics")
    ])
    .expect("rules/metrics");
    assert!(set.is_ok(), "{}", set.render(false));
    Engine::new(set.plans(), EngineConfig::default())
}

/// Sample `round` (five minutes apart) of series `s` of `series`: ten per host, a daily cycle
/// with a little noise, different per series.
fn sample(round: u64, s: u64, series: u64) -> Event {
    let ts = 1_767_225_600_000 + round as i64 * 300_000;
    let mut e = Event::new(Stream::Metric, ts);
    let phase = (round as f64 / 288.0 + s as f64 / series as f64) * std::f64::consts::TAU;
    let value = 50.0 + 20.0 * phase.sin() + ((round * 7919 + s * 104_729) % 97) as f64 / 10.0;
    e.set("host", Value::str(&format!("h{}", s / 10)))
        .set("name", Value::str(&format!("metric_{}", s % 10)))
        .set("value", Value::Num(value));
    e
}

fn measure_metric_folder(series: u64, samples: u64) -> f64 {
    measure_folder_of(series, samples, "", |round, s| sample(round, s, series))
}

/// The same for series that never move (most of a node_exporter host's: limits, sizes, flags).
fn measure_flat_series(series: u64, samples: u64) -> f64 {
    measure_folder_of(series, samples, ", flat series", |round, s| {
        let mut e = sample(round, s, series);
        e.set("value", Value::Num(s as f64 / 7.0));
        e
    })
}

fn measure_folder_of(series: u64, samples: u64, kind: &str, event: impl Fn(u64, u64) -> Event) -> f64 {
    let what = format!("rules/metrics, the whole folder, {samples} samples{kind}");
    let mut engine = metric_folder();
    let mut out = Vec::new();
    let before = LIVE.load(Ordering::Relaxed);
    for round in 0..samples {
        for s in 0..series {
            engine.push(event(round, s), &mut out);
        }
        out.clear();
    }
    out.shrink_to_fit();
    let held = LIVE.load(Ordering::Relaxed) - before;
    let per_series = held as f64 / series as f64;
    println!("{what:<48} {series:>8} series     {per_series:>6.0} bytes per series");
    let estimate = engine.state_bytes() as f64 / series as f64;
    println!(
        "{:<48} {series:>8} series     {estimate:>6.0} bytes per series",
        "  the same, as the state budget estimates it"
    );
    drop(engine);
    per_series
}

/// `series` series through one engine of the `rules/metrics` folder within a state budget of
/// `budget_mb`, enforced every 200,000 events as the service does about once a second: how many
/// series it holds, how many it dropped, and whether it said so (`vigil_state_evicted`).
fn measure_many_series(series: u64, rounds: u64, budget_mb: usize) {
    let mut engine = metric_folder();
    let mut out = Vec::new();
    let mut told = 0;
    let before = LIVE.load(Ordering::Relaxed);
    let started = std::time::Instant::now();
    let mut pushed = 0u64;
    for round in 0..rounds {
        for s in 0..series {
            engine.push(sample(round, s, series), &mut out);
            pushed += 1;
            if pushed.is_multiple_of(200_000) {
                engine.enforce_budget(budget_mb << 20, &mut out);
            }
            told += out.iter().filter(|a| &*a.rule == vigil_engine::engine::STATE_EVICTED_RULE).count();
            out.clear();
        }
    }
    engine.enforce_budget(budget_mb << 20, &mut out);
    told += out.iter().filter(|a| &*a.rule == vigil_engine::engine::STATE_EVICTED_RULE).count();
    let seconds = started.elapsed().as_secs_f64();
    let held = (LIVE.load(Ordering::Relaxed) - before) as f64 / (1 << 20) as f64;
    let live = engine.live_keys().get("metric_deviation").copied().unwrap_or(0);
    let dropped: u64 = engine.evicted().iter().filter(|((r, _), _)| r == "metric_deviation").map(|(_, n)| n).sum();
    println!(
        "{series} series x {rounds} samples, budget {budget_mb} MiB: {:.0} events/s, metric_deviation holds {live} series \
         and dropped {dropped}, {told} vigil_state_evicted alerts, heap {held:.0} MiB (estimate {} MiB)",
        pushed as f64 / seconds,
        engine.state_bytes() >> 20
    );
    println!("  live keys by rule: {:?}", engine.live_keys());
}

fn main() {
    let keys = 100_000;
    // The window rules' conditions never hold here, so this is the window state alone; the
    // last line is what an alert adds while it fires.
    let count = |when: &str| {
        format!("rule w {{ task t use machine m as e #time(1 h) state ss {{ n := count() }} group by m alert {when} }}")
    };
    measure("tumbling window, count(), first window", &count("ss.n > 1000"), keys, 1);
    let state = measure("tumbling window, count(), third window", &count("ss.n > 1000"), keys, 3);
    measure(
        "tumbling window, Q2's state, third window",
        "rule q2 { task t use machine m as e #time(1 h) state ss { a := avg(e.cpu), x := max(e.mem), n := count() } group by m alert ss.a > 2 }",
        keys,
        3,
    );
    measure(
        "sliding window 1 h every 10 min, third hour",
        "rule s { task t use machine m as e #time(1 h, 10 min) state ss { a := avg(e.cpu) } group by m alert ss.a > 2 }",
        keys,
        3,
    );
    measure(
        "sequence, partial matches",
        "rule q3 { task t1 use machine m as e1 task t2 use machine m as e2 where e2.mem > 2 with e1 -> e2 within 1 h }",
        keys,
        1,
    );
    let firing = measure("tumbling window, every key's alert firing", &count("ss.n > 0"), keys, 3);
    println!("{:<48} {:>26.0} bytes per firing alert", "an alert while it fires", firing - state);
    // Two weeks and a day of samples: past novelty's 4,032 windows. Run as a test (`cargo test
    // --benches`, an unoptimised build), a day of a few series shows that it runs.
    if std::env::args().any(|a| a == "--bench") {
        // Three hours, then past every window.
        measure_metric_folder(500, 36);
        measure_metric_folder(500, 4_400);
        measure_flat_series(500, 4_400);
        measure_many_series(1_000_000, 3, 1024);
    } else {
        measure_metric_folder(20, 288);
        measure_flat_series(20, 288);
        measure_many_series(2_000, 2, 8);
    }
}
