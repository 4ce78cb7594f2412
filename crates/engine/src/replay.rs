//! Replay: recorded inputs through the engine, alerts out as JSON lines.
//!
//! Several inputs are merged by event time (each is read in order; the merge always takes the
//! input whose next event is oldest), so a folder of per-host files replays as one stream.
//! Malformed lines are reported with file, line and reason, counted, and skipped, unless
//! `strict` asks to stop at the first one.

use crate::alert::Alert;
use crate::engine::EngineStats;
use crate::event::{DecodeError, Decoded, Event, Millis};
use crate::runtime::{Driven, Runtime};
use crate::settings::EngineSettings;
use std::io::Write;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vigil_lang::plan::RulePlan;

mod spans;
pub use spans::Spans;

/// One input line: an event (or, from a gated reader, what the gate left of it), or why it is
/// not one. `vigil-formats` reads files into these.
#[derive(Debug, Clone, PartialEq)]
pub struct Record<T = Event> {
    /// 1-based line (for CSV, the data line including the header's count).
    pub line: u64,
    pub event: Result<T, DecodeError>,
}

/// A readable input and how far into it reading has got, for progress reports.
pub struct Input<T = Event> {
    pub name: String,
    pub records: Box<dyn Iterator<Item = Record<T>>>,
    /// Bytes of the file read so far, and the file's size.
    pub progress: Arc<AtomicU64>,
    pub size: u64,
}

/// How fast to replay: as fast as possible, or event time at a multiple of wall-clock time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Speed {
    Max,
    Times(f64),
}

impl std::str::FromStr for Speed {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "max" {
            return Ok(Speed::Max);
        }
        let n = s.strip_suffix('x').unwrap_or(s);
        match n.parse::<f64>() {
            Ok(f) if f > 0.0 && f.is_finite() => Ok(Speed::Times(f)),
            _ => Err(format!("`{s}` is not a speed: use `max`, `1x`, `60x`, ...")),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub speed: Speed,
    /// Stop at the first malformed line instead of skipping it.
    pub strict: bool,
    /// Lateness, limits and workers; its bounds say which event times are taken in, a line out
    /// of them being malformed, with the reason.
    pub engine: EngineSettings,
}

/// The runtime a replay drives as `settings` say, with the gate by which the decoders skip
/// lines no rule takes.
pub fn engines(plans: Vec<RulePlan>, settings: &EngineSettings) -> (Box<dyn Driven>, crate::engine::Gate) {
    let runtime = Runtime::new(plans, settings.config(), settings.partitions(), settings.workers);
    let gate = runtime.gate();
    (Box::new(runtime), gate)
}

/// What a replay did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    pub events: u64,
    pub malformed: u64,
    pub stats: EngineStats,
    pub alerts: u64,
    pub resolved: u64,
    /// The first malformed line when `strict` stopped the replay.
    pub stopped_at: Option<String>,
}

impl Summary {
    /// The text printed at the end of a replay.
    pub fn report(&self) -> String {
        let mut out = format!(
            "replayed {} events ({} malformed, {} late): {} alerts fired, {} resolved\n",
            self.events, self.malformed, self.stats.late, self.alerts, self.resolved
        );
        for (rule, n) in &self.stats.alerts_by_rule {
            out.push_str(&format!("  {rule}: {n} fired\n"));
        }
        for (rule, n) in &self.stats.late_by_rule {
            out.push_str(&format!("  {rule}: {n} late events not processed\n"));
        }
        if let Some(stop) = &self.stopped_at {
            out.push_str(&format!("stopped at the first malformed line (--strict): {stop}\n"));
        }
        out
    }
}

/// Progress callbacks, so the command line can draw a bar and tests need none.
pub trait Progress {
    /// Called every few thousand events with the counts so far and the bytes of the inputs
    /// read, out of their total size.
    fn advance(&mut self, _events: u64, _alerts: u64, _bytes: (u64, u64)) {}
    fn malformed(&mut self, _message: &str) {}
}

/// No progress output.
pub struct Quiet;
impl Progress for Quiet {}

/// Replays `inputs` through `engine`, writing alerts as JSON lines to `out`. The engine gives
/// the events it is done with back to `pool`, which the inputs read into.
pub fn replay(
    engine: &mut dyn Driven,
    inputs: Vec<Input<Decoded>>,
    pool: &std::cell::RefCell<crate::event::EventPool>,
    options: &ReplayOptions,
    out: &mut dyn Write,
    progress: &mut dyn Progress,
) -> std::io::Result<Summary> {
    let mut text = Vec::new();
    let summary = replay_into(
        engine,
        inputs,
        pool,
        options,
        &mut |alerts| {
            // Serialized into one buffer and written at once: serde_json writes in small
            // pieces, each of which would otherwise be a dynamic call.
            text.clear();
            for a in alerts.drain(..) {
                serde_json::to_writer(&mut text, &a)?;
                text.push(b'\n');
            }
            out.write_all(&text)
        },
        progress,
    )?;
    out.flush()?;
    Ok(summary)
}

/// [`replay`] with the alerts handed to `sink` as they come (it takes them out of the list).
pub fn replay_into(
    engine: &mut dyn Driven,
    inputs: Vec<Input<Decoded>>,
    pool: &std::cell::RefCell<crate::event::EventPool>,
    options: &ReplayOptions,
    sink: &mut dyn FnMut(&mut Vec<Alert>) -> std::io::Result<()>,
    progress: &mut dyn Progress,
) -> std::io::Result<Summary> {
    let mut summary = Summary::default();
    let mut merger = Merger::new(inputs);
    let mut alerts: Vec<Alert> = Vec::new();
    let started = Instant::now();
    let mut first_ts: Option<Millis> = None;
    let mut deliver = |alerts: &mut Vec<Alert>, summary: &mut Summary| {
        if alerts.is_empty() {
            return Ok(());
        }
        for a in alerts.iter() {
            match a.status {
                crate::alert::Status::Firing => summary.alerts += 1,
                crate::alert::Status::Resolved => summary.resolved += 1,
            }
        }
        sink(alerts)
    };
    let bounds = options.engine.bounds();
    while let Some((input, record)) = merger.next() {
        let checked =
            record.event.and_then(|d| bounds.check(d.ts(), crate::event::now_ms(), engine.watermark()).map(|()| d));
        let decoded = match checked {
            Ok(d) => d,
            Err(e) => {
                summary.malformed += 1;
                let message = format!("{}:{}: {e}", merger.name(input), record.line);
                progress.malformed(&message);
                if options.strict {
                    summary.stopped_at = Some(message);
                    break;
                }
                continue;
            }
        };
        summary.events += 1;
        if let Speed::Times(factor) = options.speed {
            pace(&mut first_ts, decoded.ts(), factor, started);
        }
        engine.take(decoded, &mut alerts);
        engine.recycle_into(&mut pool.borrow_mut());
        deliver(&mut alerts, &mut summary)?;
        if summary.events % 4096 == 0 {
            progress.advance(summary.events, summary.alerts, merger.bytes());
        }
    }
    engine.flush(&mut alerts);
    deliver(&mut alerts, &mut summary)?;
    progress.advance(summary.events, summary.alerts, merger.bytes());
    summary.stats = engine.stats();
    Ok(summary)
}

/// Sleeps so that event time advances `factor` times faster than wall-clock time.
fn pace(first_ts: &mut Option<Millis>, ts: Millis, factor: f64, started: Instant) {
    let first = *first_ts.get_or_insert(ts);
    let due = Duration::from_secs_f64(((ts - first).max(0) as f64 / 1000.0) / factor);
    if let Some(wait) = due.checked_sub(started.elapsed()) {
        std::thread::sleep(wait);
    }
}

/// Merges inputs by the time of their next event; malformed lines pass through at once.
struct Merger {
    inputs: Vec<Input<Decoded>>,
    heads: Vec<Option<Record<Decoded>>>,
}

impl Merger {
    fn new(mut inputs: Vec<Input<Decoded>>) -> Self {
        let heads = inputs.iter_mut().map(|i| i.records.next()).collect();
        Merger { inputs, heads }
    }

    /// The next record, with the index of its input.
    fn next(&mut self) -> Option<(usize, Record<Decoded>)> {
        let key = |r: &Record<Decoded>| r.event.as_ref().map_or(Millis::MIN, Decoded::ts);
        let i = (0..self.heads.len()).filter(|&i| self.heads[i].is_some()).min_by_key(|&i| {
            let r = self.heads[i].as_ref().expect("filtered");
            (key(r), i)
        })?;
        let record = self.heads[i].take().expect("filtered");
        self.heads[i] = self.inputs[i].records.next();
        Some((i, record))
    }

    /// The name of the `i`th input.
    fn name(&self, i: usize) -> &str {
        &self.inputs[i].name
    }

    fn bytes(&self) -> (u64, u64) {
        let read = self.inputs.iter().map(|i| i.progress.load(std::sync::atomic::Ordering::Relaxed)).sum();
        (read, self.inputs.iter().map(|i| i.size).sum())
    }
}
