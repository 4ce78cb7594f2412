//! What a checkpoint of `rules/metrics` costs at full history, whole and as a delta, against
//! replaying the input since the last one.
//!
//! ```text
//! cargo run --release --example checkpoint_bench -- [SERIES ...] [--rounds 4400]
//!     [--partitions 16] [--threads 2] [--dir /tmp]
//!     [--postgres URL --writes 30 --every-s 10]
//! ```
//!
//! For each count of series (ten per host, each moving: a daily cycle with noise, the largest
//! state a series keeps), the runtime takes `--rounds` five-minute samples per series, past every
//! scorer's window. Then it prints:
//! - the whole checkpoint: its bytes, the snapshot's time, the time to write it to SQLite as
//!   `vigil serve` does and to read and restore it into a new runtime;
//! - what changed below the key in one scrape interval (one 10 s sample per series, inside the
//!   open window) and in five minutes (30 samples, every window closed): the snapshot's bytes
//!   that differ at the same place, and `zstd --patch-from` of the new snapshot against the old
//!   one, the size a delta format could reach at best;
//! - the input of those intervals: the bytes the ingest log keeps of it (record header and JSON
//!   line) and the time the runtime takes to replay it, measured over the last rounds.
//!
//! With `--postgres`, the whole checkpoint is then written `--writes` times to that database,
//! `--every-s` apart, as `vigil serve` replaces its one row, and the checkpoint table's size
//! (TOAST included) is printed after each write: whether autovacuum keeps the store at a few
//! checkpoints or it grows with every write. The database's `checkpoints` table is emptied
//! first; use a database of its own.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use vigil::engine::EngineConfig;
use vigil::event::{Event, Value};
use vigil::runtime::Runtime;
use vigil::schema::Stream;
use vigil::service::store::Store;

const START: i64 = 1_767_225_600_000;
const FIVE_MINUTES: i64 = 300_000;
/// The ingest log's record header: length, CRC and offset.
const LOG_HEADER: usize = 16;

struct Args {
    series: Vec<u64>,
    rounds: u64,
    partitions: usize,
    threads: usize,
    dir: PathBuf,
    postgres: Option<String>,
    writes: u32,
    every_s: u64,
}

fn args() -> Args {
    let mut a = Args {
        series: Vec::new(),
        rounds: 4_400,
        partitions: 16,
        threads: 2,
        dir: std::env::temp_dir(),
        postgres: None,
        writes: 30,
        every_s: 10,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().unwrap_or_else(|| panic!("{name} needs a value"));
        match arg.as_str() {
            "--rounds" => a.rounds = value("--rounds").parse().expect("--rounds: a count"),
            "--partitions" => a.partitions = value("--partitions").parse().expect("--partitions: a count"),
            "--threads" => a.threads = value("--threads").parse().expect("--threads: a count"),
            "--dir" => a.dir = value("--dir").into(),
            "--postgres" => a.postgres = Some(value("--postgres")),
            "--writes" => a.writes = value("--writes").parse().expect("--writes: a count"),
            "--every-s" => a.every_s = value("--every-s").parse().expect("--every-s: seconds"),
            n => a.series.push(n.replace('_', "").parse().expect("SERIES: a count")),
        }
    }
    if a.series.is_empty() {
        a.series.push(2_500);
    }
    a
}

/// Series `s`'s sample at `ts`: ten series per host, a daily cycle with noise, different per series.
fn sample(ts: i64, s: u64, series: u64) -> Event {
    let step = (ts - START) / 10_000;
    let phase = ((ts - START) as f64 / 86_400_000.0 + s as f64 / series as f64) * std::f64::consts::TAU;
    let noise = ((step as u64).wrapping_mul(7919).wrapping_add(s * 104_729) % 97) as f64 / 10.0;
    let mut e = Event::new(Stream::Metric, ts);
    e.set("host", Value::str(&format!("h{}", s / 10)))
        .set("name", Value::str(&format!("metric_{}", s % 10)))
        .set("value", Value::Num(50.0 + 20.0 * phase.sin() + noise));
    e
}

fn round(ts: i64, series: u64) -> Vec<Event> {
    (0..series).map(|s| sample(ts, s, series)).collect()
}

fn runtime(a: &Args) -> Runtime {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules/metrics");
    let set = vigil::ruleset::RuleSet::load(&[rules]).expect("rules/metrics");
    assert!(set.is_ok(), "{}", set.render(false));
    Runtime::new(set.plans(), EngineConfig::default(), a.partitions, a.threads)
}

/// Bytes that differ between two snapshots at the same place, the longer's tail counted whole.
fn differing(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count() + a.len().abs_diff(b.len())
}

/// `zstd --patch-from=old new`: the delta's bytes and the time it took.
fn patch(dir: &Path, old: &[u8], new: &[u8]) -> (u64, f64) {
    let (o, n, d) = (dir.join("ck-old.bin"), dir.join("ck-new.bin"), dir.join("ck-delta.zst"));
    std::fs::write(&o, old).expect("write");
    std::fs::write(&n, new).expect("write");
    let t = Instant::now();
    let status = Command::new("zstd")
        .args(["-q", "-f", "-3", "--long=31", "--memory=2047MB"])
        .arg(format!("--patch-from={}", o.display()))
        .arg(&n)
        .arg("-o")
        .arg(&d)
        .status()
        .expect("zstd on PATH");
    assert!(status.success(), "zstd failed");
    let secs = t.elapsed().as_secs_f64();
    let bytes = std::fs::metadata(&d).expect("delta").len();
    for p in [o, n, d] {
        let _ = std::fs::remove_file(p);
    }
    (bytes, secs)
}

fn mb(bytes: usize) -> f64 {
    bytes as f64 / 1e6
}

async fn measure(a: &Args, series: u64) {
    let mut rt = runtime(a);
    let mut out = Vec::new();
    let built = Instant::now();
    let tail = a.rounds.saturating_sub(100);
    let mut tail_started = None;
    for r in 0..a.rounds {
        if r == tail {
            tail_started = Some(Instant::now());
        }
        rt.push(round(START + r as i64 * FIVE_MINUTES, series), Vec::new(), &mut out);
        out.clear();
    }
    rt.catch_up(&mut out);
    let tail_events = (a.rounds - tail) * series;
    let per_event = tail_started.expect("rounds").elapsed().as_secs_f64() / tail_events as f64;
    println!(
        "{series} series, {} rounds: built in {:.0} s; at full history {:.2} us per event",
        a.rounds,
        built.elapsed().as_secs_f64(),
        per_event * 1e6
    );

    let t = Instant::now();
    let whole = rt.checkpoint(&mut out).expect("checkpoint");
    let snapshot_s = t.elapsed().as_secs_f64();
    let db = a.dir.join(format!("checkpoint-bench-{series}.db"));
    let _ = std::fs::remove_file(&db);
    let store = Store::connect(&format!("sqlite://{}", db.display())).await.expect("store");
    let t = Instant::now();
    store.save_checkpoint(&whole, "{}", 0).await.expect("save");
    let store_s = t.elapsed().as_secs_f64();
    // Written again and again, the database keeps to about twice a checkpoint: SQLite reuses
    // the pages the replaced one freed, and its WAL is checkpointed back into the file.
    for _ in 0..3 {
        store.save_checkpoint(&whole, "{}", 0).await.expect("save");
    }
    let size = |p: PathBuf| std::fs::metadata(p).map(|m| m.len() as usize).unwrap_or(0);
    let wal = PathBuf::from(format!("{}-wal", db.display()));
    let (db_bytes, wal_bytes) = (size(db.clone()), size(wal));
    let t = Instant::now();
    let (loaded, _) = store.load_checkpoint().await.expect("load").expect("a checkpoint");
    let mut restored = runtime(a);
    restored.restore(&loaded).expect("restore");
    let restore_s = t.elapsed().as_secs_f64();
    drop((restored, loaded, store));
    let _ = std::fs::remove_file(&db);

    println!(
        "  whole: {:.1} MB ({:.0} B per series), snapshot {:.2} s, SQLite write {:.2} s, read and restore {:.2} s; \
         after four writes the database is {:.1} MB and its WAL {:.1} MB",
        mb(whole.len()),
        whole.len() as f64 / series as f64,
        snapshot_s,
        store_s,
        restore_s,
        mb(db_bytes),
        mb(wal_bytes)
    );
    if let Some(url) = &a.postgres {
        postgres_growth(a, url, &whole).await;
    }

    let last = START + (a.rounds as i64 - 1) * FIVE_MINUTES;
    let (mut log_bytes, mut events_in) = (0, 0);
    for (label, steps) in [("one 10 s interval", 1..2), ("five minutes", 2..31)] {
        for step in steps {
            let events = round(last + step * 10_000, series);
            log_bytes += events.iter().map(|e| LOG_HEADER + e.to_json().to_string().len()).sum::<usize>();
            events_in += events.len();
            rt.push(events, Vec::new(), &mut out);
            out.clear();
        }
        let now = rt.checkpoint(&mut out).expect("checkpoint");
        let (delta, delta_s) = patch(&a.dir, &whole, &now);
        println!(
            "  after {label}: {:.1} MB differ in place; zstd delta {:.1} MB ({:.0} B per series, {:.1} s); \
             input {:.1} MB in the ingest log, replayed in {:.2} s",
            mb(differing(&whole, &now)),
            mb(delta as usize),
            delta as f64 / series as f64,
            delta_s,
            mb(log_bytes),
            per_event * events_in as f64
        );
    }
}

/// Writes `whole` again and again to PostgreSQL as `vigil serve` does, and prints the checkpoint
/// table's size (heap, TOAST and indexes) after each write, and the dead tuples autovacuum has
/// yet to take.
async fn postgres_growth(a: &Args, url: &str, whole: &[u8]) {
    let store = Store::connect(url).await.expect("PostgreSQL store");
    let pool = sqlx::PgPool::connect(url).await.expect("PostgreSQL");
    sqlx::query("DELETE FROM checkpoints").execute(&pool).await.expect("empty the checkpoints");
    sqlx::query("VACUUM FULL checkpoints").execute(&pool).await.expect("vacuum");
    let started = Instant::now();
    let mut largest = 0i64;
    for n in 1..=a.writes {
        let t = Instant::now();
        store.save_checkpoint(whole, "{}", 0).await.expect("save");
        let write_s = t.elapsed().as_secs_f64();
        let (size,): (i64,) =
            sqlx::query_as("SELECT pg_total_relation_size('checkpoints')").fetch_one(&pool).await.expect("size");
        let (toast_dead, vacuums): (i64, i64) = sqlx::query_as(
            "WITH t AS (SELECT n_dead_tup, autovacuum_count FROM pg_stat_all_tables \
             WHERE relid = (SELECT reltoastrelid FROM pg_class WHERE oid = 'checkpoints'::regclass)) \
             SELECT coalesce((SELECT n_dead_tup FROM t), 0), coalesce((SELECT autovacuum_count FROM t), 0)",
        )
        .fetch_one(&pool)
        .await
        .expect("toast stats");
        largest = largest.max(size);
        println!(
            "  PostgreSQL write {n} at {:.0} s: {:.2} s; table {:.1} MB ({:.1} checkpoints), TOAST dead tuples {toast_dead}, \
             its autovacuums {vacuums}",
            started.elapsed().as_secs_f64(),
            write_s,
            mb(size as usize),
            size as f64 / whole.len() as f64
        );
        if n < a.writes {
            tokio::time::sleep(std::time::Duration::from_secs(a.every_s)).await;
        }
    }
    println!(
        "  PostgreSQL, {} writes {} s apart: the table at most {:.1} MB, {:.1} checkpoints",
        a.writes,
        a.every_s,
        mb(largest as usize),
        largest as f64 / whole.len() as f64
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let a = args();
    for &series in &a.series {
        measure(&a, series).await;
    }
}
