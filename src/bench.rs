//! `vigil bench`: generated (or given) JSON-lines data through a rule set, measured.
//!
//! Reports events per second (reading the file, decoding and evaluating, on one core), alerts,
//! peak memory, live keys, and the latency from reading the line of the event that made an
//! alert to the alert coming out of the engine. Workloads are the ones `BENCHMARKS.md` lists.

use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;
use vigil_engine::engine::{Engine, Gate};
use vigil_engine::event::{EventPool, LineDecoder};
use vigil_engine::runtime::{Driven, Runtime};
use vigil_engine::settings::EngineSettings;
use vigil_lang::ruleset::RuleSet;
use vigil_lang::schema::Catalog;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// (a) one filter rule: `cpu > 0.95` (Flink Q1).
    Filter,
    /// (b) a tumbling 10 s window per machine: avg(cpu), max(mem), count (Flink Q2).
    Tumbling,
    /// (b) a sliding window (1 min every 10 s) per key.
    Sliding,
    /// Per machine, cpu > 0.9 followed within 30 s by mem > 0.9 (Flink Q3).
    Sequence,
    /// (c) the same pattern within 100 s, which keeps about 10,000 partial matches live.
    Matches,
    /// (d) per-job outliers (median absolute deviation) over 1,000 peers per window.
    Outlier,
    /// (e) many mixed rules at once (`--rules-count`).
    Mixed,
}

#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub workload: Workload,
    pub events: u64,
    /// Distinct keys: machines for most workloads, tasks for `outlier`, group keys for windows.
    pub keys: u64,
    /// Rules for `mixed`.
    pub rules: usize,
    /// Event time between two generated events, in microseconds.
    pub step_us: u64,
    /// Use this file instead of generating one.
    pub input: Option<PathBuf>,
    /// Use these rules instead of the workload's.
    pub rules_path: Option<PathBuf>,
    /// Over [`DECLARED_USAGE`] instead of task_usage.
    pub declared_stream: bool,
    /// Latency is timed on one line in this many: the clock costs several percent of an
    /// event's time. The lines timed are a fixed sample, independent of what the events do.
    pub latency_every: u64,
    /// Lateness, time bounds, workers and limits, as `replay` takes them.
    pub engine: EngineSettings,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub workload: String,
    pub rules: usize,
    pub events: u64,
    pub malformed: u64,
    pub seconds: f64,
    pub events_per_second: f64,
    pub alerts: u64,
    pub peak_rss_bytes: Option<u64>,
    pub live_keys: usize,
    /// Resident memory growth during the run divided by live keys.
    pub bytes_per_live_key: Option<f64>,
    pub latency_p50_us: Option<f64>,
    pub latency_p99_us: Option<f64>,
    pub latency_max_us: Option<f64>,
    /// Latency was timed on one line in this many; `latency_samples` alerting lines were timed.
    pub latency_every: u64,
    pub latency_samples: usize,
    pub startup_seconds: f64,
}

impl BenchReport {
    pub fn text(&self) -> String {
        let mb = |b: Option<u64>| b.map_or("n/a".to_string(), |b| format!("{:.1} MiB", b as f64 / 1048576.0));
        let us = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{v:.1} µs"));
        format!(
            "workload {} ({} rules)\n  events       {} ({} malformed) in {:.3} s, start-up {:.3} s\n  throughput   {:.0} events/s\n  alerts       {}\n  memory       peak {}, {} live keys, {} per key\n  latency      p50 {}, p99 {}, max {} (line read -> alert out; {} lines timed, one in {})\n",
            self.workload,
            self.rules,
            self.events,
            self.malformed,
            self.seconds,
            self.startup_seconds,
            self.events_per_second,
            self.alerts,
            mb(self.peak_rss_bytes),
            self.live_keys,
            self.bytes_per_live_key.map_or("n/a".into(), |b| format!("{b:.0} bytes")),
            us(self.latency_p50_us),
            us(self.latency_p99_us),
            us(self.latency_max_us),
            self.latency_samples,
            self.latency_every,
        )
    }
}

/// The rules of a workload.
pub fn rules_for(options: &BenchOptions) -> String {
    let rules = workload_rules(options);
    if options.declared_stream {
        format!("{DECLARED_USAGE}\n{}", rules.replace(" use ", " consume "))
    } else {
        rules
    }
}

/// A stream of a user's with task_usage's fields, declared as the prelude declares task_usage
/// but for its operation: the workloads over it measure a declared stream beside Vigil's own.
pub const DECLARED_USAGE: &str = "stream usage {
    fields {
        job_id?: string, task_index?: number, machine_id?: string, cpu?: number, mem?: number,
        max_cpu?: number, max_mem?: number, disk_io?: number, cpi?: number, cluster?: string,
    }
    entity task (job_id, task_index)
    entity machine (machine_id)
    op task consume machine?
}";

fn workload_rules(options: &BenchOptions) -> String {
    match options.workload {
        Workload::Filter => "rule q1 { task t use machine m as e where e.cpu > 0.95 }".into(),
        Workload::Tumbling => "rule q2 {\n  task t use machine m as e #time(10 s)\n  state ss { avg_cpu := avg(e.cpu), max_mem := max(e.mem), n := count() } group by m\n  alert ss.avg_cpu > 0.9\n}".into(),
        Workload::Sliding => "rule sliding {\n  task t use machine m as e #time(1 min, 10 s)\n  state ss { avg_cpu := avg(e.cpu), n := count() } group by m\n  alert ss.avg_cpu > 0.9\n}".into(),
        Workload::Sequence => "rule q3 {\n  task t1 use machine m as e1 where e1.cpu > 0.9\n  task t2 use machine m as e2 where e2.mem > 0.9\n  with e1 -> e2 within 30 s\n}".into(),
        Workload::Matches => "rule matches {\n  task t1 use machine m as e1 where e1.cpu > 0.9\n  task t2 use machine m as e2 where e2.mem > 0.999\n  with e1 -> e2 within 100 s\n}".into(),
        Workload::Outlier => "rule peers {\n  task t use machine m as e #time(10 s)\n  state ss { cpu := avg(e.cpu) } group by t\n  cluster(points = all(ss.cpu) per t.job_id, method = mad(3.5))\n  alert cluster.outlier\n}".into(),
        Workload::Mixed => mixed_rules(options.rules, options.keys),
    }
}

/// `n` rules of four kinds. Filters and sequences each watch one machine (an equality the
/// dispatcher can index); windows share one state and differ in their thresholds. Thresholds
/// are high, as real alerting rules are: the workload measures evaluation, not alert output.
pub fn mixed_rules(n: usize, machines: u64) -> String {
    let mut out = String::new();
    for i in 0..n {
        let m = i as u64 % machines.max(1);
        let threshold = 0.95 + (i % 5) as f64 / 100.0;
        let rule = match i % 4 {
            0 => format!("rule filter_{i} {{ task t use machine m as e where e.machine_id == \"m{m}\" and e.cpu > {threshold} }}\n"),
            1 => format!(
                "rule window_{i} {{ task t use machine m as e #time(10 s) state ss {{ avg_cpu := avg(e.cpu), max_mem := max(e.mem), n := count() }} group by m alert ss.avg_cpu > {threshold} }}\n"
            ),
            2 => format!(
                "rule sequence_{i} {{ task t1 use machine m as e1 where e1.machine_id == \"m{m}\" and e1.cpu > 0.9 task t2 use machine m as e2 where e2.mem > 0.9 with e1 -> e2 within 30 s }}\n"
            ),
            _ => format!("rule mem_{i} {{ task t use machine m as e where e.machine_id == \"m{m}\" and e.mem > {threshold} }}\n"),
        };
        out.push_str(&rule);
    }
    out
}

/// Writes `events` task_usage lines (`ts` advancing `step_us` each, keys round-robin, uniform
/// cpu and mem), or lines of [`DECLARED_USAGE`].
pub fn generate(path: &Path, options: &BenchOptions) -> std::io::Result<()> {
    let mut w = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut rng = fastrand::Rng::with_seed(42);
    let keys = options.keys.max(1);
    let stream = if options.declared_stream { "usage" } else { "task_usage" };
    for i in 0..options.events {
        let k = i % keys;
        let (job, task, machine) = match options.workload {
            // 1,000 peers per job: tasks of a few jobs, spread over the machines.
            Workload::Outlier => (k / 1000, k % 1000, k % 1000),
            _ => (k % 100, i % 1000, k),
        };
        let cpu = (rng.f64() * 1000.0).round() / 1000.0;
        let mem = (rng.f64() * 1000.0).round() / 1000.0;
        writeln!(
            w,
            "{{\"stream\":\"{stream}\",\"ts\":{},\"job_id\":\"j{job}\",\"task_index\":{task},\"machine_id\":\"m{machine}\",\"cpu\":{cpu},\"mem\":{mem}}}",
            1_767_225_600_000u64 + i * options.step_us / 1000
        )?;
    }
    w.flush()
}

/// Peak resident memory of this process, from Linux's /proc.
pub fn peak_rss() -> Option<u64> {
    proc_status_kb("VmHWM:").map(|kb| kb * 1024)
}

pub fn current_rss() -> Option<u64> {
    proc_status_kb("VmRSS:").map(|kb| kb * 1024)
}

fn proc_status_kb(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    Some(sorted[i])
}

/// Runs one benchmark. Start-up (compiling the rules, building the engine) is timed apart.
/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the benchmark rules do not check:\n{0}")]
    Rules(String),
}

pub fn run(options: &BenchOptions) -> Result<BenchReport, BenchError> {
    let started = Instant::now();
    let input = match &options.input {
        Some(p) => p.clone(),
        None => {
            let p =
                std::env::temp_dir().join(format!("vigil-bench-{}-{:?}.jsonl", std::process::id(), options.workload));
            generate(&p, options)?;
            p
        }
    };
    let generated = options.input.is_none();
    let result = run_on(options, &input, started);
    if generated {
        let _ = std::fs::remove_file(&input);
    }
    result
}

fn run_on(options: &BenchOptions, input: &Path, started: Instant) -> Result<BenchReport, BenchError> {
    let name = match &options.rules_path {
        Some(p) => p.display().to_string(),
        None => format!("{:?}", options.workload).to_lowercase(),
    };
    let t0 = Instant::now();
    let set = match &options.rules_path {
        // A file or a folder, loaded as `--rules` is everywhere else.
        Some(p) => RuleSet::load(std::slice::from_ref(p)).map_err(|e| BenchError::Rules(e.to_string()))?,
        None => RuleSet::from_sources(&[(name.clone(), rules_for(options).into_bytes())]),
    };
    if !set.is_ok() {
        return Err(BenchError::Rules(set.render(false)));
    }
    let plans = set.plans();
    let rules = plans.len();
    let settings = &options.engine;
    let engine = Engine::new(plans.clone(), settings.config());
    let gate = engine.gate();
    let startup = t0.elapsed().as_secs_f64();
    let rss_before = current_rss();
    let file = std::fs::File::open(input)?;
    let measured = match settings.partitions() {
        1 => measure(engine, &gate, set.catalog(), file, options)?,
        n => measure(Runtime::new(plans, settings.config(), n, settings.workers), &gate, set.catalog(), file, options)?,
    };
    let grown = match (rss_before, current_rss()) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64),
        _ => None,
    };
    let Measured { events, malformed, fired, seconds, live_keys, mut latencies } = measured;
    let every = options.latency_every.max(1);
    latencies.sort_by(f64::total_cmp);
    let _ = started;
    Ok(BenchReport {
        workload: name,
        rules,
        events,
        malformed,
        seconds,
        events_per_second: events as f64 / seconds.max(1e-9),
        alerts: fired,
        peak_rss_bytes: peak_rss(),
        live_keys,
        bytes_per_live_key: grown.filter(|_| live_keys > 0).map(|g| g / live_keys as f64),
        latency_p50_us: percentile(&latencies, 0.5),
        latency_p99_us: percentile(&latencies, 0.99),
        latency_max_us: latencies.last().copied(),
        latency_every: every,
        latency_samples: latencies.len(),
        startup_seconds: startup,
    })
}

/// What the timed part of a run found.
struct Measured {
    events: u64,
    malformed: u64,
    fired: u64,
    seconds: f64,
    live_keys: usize,
    latencies: Vec<f64>,
}

/// The timed part: every line of `file` decoded, checked against the time bounds (the clock
/// read once, at the start), and taken by `engine`. Inlined into its caller, so that the loop
/// over one engine compiles as if written there.
#[inline(always)]
fn measure<D: Driven>(
    mut engine: D,
    gate: &Gate,
    catalog: &Catalog,
    file: std::fs::File,
    options: &BenchOptions,
) -> std::io::Result<Measured> {
    let (mut decoder, mut pool) = (LineDecoder::new(catalog.clone()), EventPool::default());
    let mut lines = vigil_formats::input::LineReader::new(file);
    let bounds = options.engine.bounds();
    let now = vigil_engine::event::now_ms();
    let mut alerts = Vec::new();
    let (mut events, mut malformed, mut fired) = (0u64, 0u64, 0u64);
    let mut latencies: Vec<f64> = Vec::new();
    let t = Instant::now();
    let every = options.latency_every.max(1);
    let mut read = 0u64;
    while let Some(line) = lines.next_line() {
        read += 1;
        let read_at = read.is_multiple_of(every).then(Instant::now);
        let decoded = decoder
            .decode_gated(line?.trim_ascii_end(), None, gate, &mut pool)
            .and_then(|d| bounds.check(d.ts(), now, engine.watermark()).map(|()| d));
        match decoded {
            Ok(decoded) => {
                events += 1;
                engine.take(decoded, &mut alerts);
                engine.recycle_into(&mut pool);
            }
            Err(_) => malformed += 1,
        }
        if !alerts.is_empty() {
            // At most a million: the vector would not be cheap for millions of alerts.
            if let Some(read_at) = read_at.filter(|_| latencies.len() < 1_000_000) {
                latencies.push(read_at.elapsed().as_secs_f64() * 1e6);
            }
            fired += alerts.iter().filter(|a| a.status == vigil_engine::alert::Status::Firing).count() as u64;
            alerts.clear();
        }
    }
    engine.flush(&mut alerts);
    fired += alerts.iter().filter(|a| a.status == vigil_engine::alert::Status::Firing).count() as u64;
    let seconds = t.elapsed().as_secs_f64();
    let live_keys = engine.live_keys(&mut alerts);
    Ok(Measured { events, malformed, fired, seconds, live_keys, latencies })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// BENCHMARKS.md runs `benches/flink/qN.saql` with `vigil replay` beside Flink: they must be
    /// the rules `vigil bench` measures.
    #[test]
    fn the_flink_query_files_hold_the_workloads_rules() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/flink");
        for (name, workload) in [("q1", Workload::Filter), ("q2", Workload::Tumbling), ("q3", Workload::Sequence)] {
            let text = std::fs::read_to_string(dir.join(format!("{name}.saql"))).expect("the query file");
            let options = BenchOptions {
                workload,
                events: 0,
                keys: 1000,
                rules: 1,
                step_us: 1000,
                input: None,
                rules_path: None,
                declared_stream: false,
                latency_every: 16,
                engine: EngineSettings::batch(),
            };
            let from_file = vigil_lang::compile(name, text.as_bytes());
            let from_workload = vigil_lang::compile(name, rules_for(&options).as_bytes());
            assert!(from_file.is_ok() && from_workload.is_ok(), "{name} checks");
            let plans = |c: &vigil_lang::Compiled| c.plans.iter().map(|p| p.to_string()).collect::<Vec<_>>();
            assert_eq!(plans(&from_file), plans(&from_workload), "{name}");
        }
    }
}
