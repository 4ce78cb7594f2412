//! Memory per live key, counted by a wrapping allocator (resident-set sizes include freed and
//! fragmented memory, so they overstate it). `cargo bench --bench memory`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use vigil::engine::{Engine, EngineConfig};
use vigil::event::{Event, Value};
use vigil::schema::Stream;

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

/// Bytes held per live key after `keys` keys each saw `per_key` events within one window.
fn measure(name: &str, rule: &str, keys: u64, per_key: u64) {
    let c = vigil::compile("memory.saql", rule.as_bytes());
    assert!(c.is_ok(), "{:?}", c.diagnostics);
    let mut engine = Engine::new(c.plans, EngineConfig::default());
    let mut out = Vec::new();
    let before = LIVE.load(Ordering::Relaxed);
    for i in 0..keys * per_key {
        engine.push(usage(i, keys, 1_767_225_600_000 + (i / 1000) as i64), &mut out);
    }
    out.clear();
    out.shrink_to_fit();
    let held = LIVE.load(Ordering::Relaxed) - before;
    let live: usize = engine.live_keys().values().sum();
    println!("{name:<40} {live:>8} live keys  {:>6.0} bytes per key", held as f64 / live.max(1) as f64);
    drop(engine);
}

fn main() {
    let keys = 100_000;
    measure(
        "tumbling window, count()",
        "rule w { task t use machine m as e #time(1 h) state ss { n := count() } group by m }",
        keys,
        3,
    );
    measure(
        "tumbling window, Q2 (avg, max, count)",
        "rule q2 { task t use machine m as e #time(1 h) state ss { a := avg(e.cpu), x := max(e.mem), n := count() } group by m alert ss.a > 0.9 }",
        keys,
        3,
    );
    measure(
        "sliding window 1 h every 10 min, avg",
        "rule s { task t use machine m as e #time(1 h, 10 min) state ss { a := avg(e.cpu) } group by m alert ss.a > 0.9 }",
        keys,
        3,
    );
    measure(
        "sequence, partial matches",
        "rule q3 { task t1 use machine m as e1 task t2 use machine m as e2 where e2.mem > 2 with e1 -> e2 within 1 h }",
        keys,
        1,
    );
}
