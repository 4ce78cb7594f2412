//! The service's engines: one, or several workers with batches of events in flight.
//!
//! The engine thread hands each run of queued events to every worker as one batch and goes on
//! to the next without waiting, up to [`DEPTH`] batches ahead. It collects a batch's alerts and
//! late events when it runs ahead that far, before anything else it asks of the engines (a
//! tick, a reload, the gauges, a checkpoint), and when its input queue is empty, so that the
//! alerts of a quiet stream are not held back.

use super::{merge, Crew, DEPTH};
use crate::alert::Alert;
use crate::engine::{Clock, Engine, EngineConfig, EngineError, EngineStats, Snapshot};
use crate::event::{Event, Millis};
use serde_bytes::ByteBuf;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use vigil_lang::plan::RulePlan;

/// The time one worker reads: the wall clock as read once when a job was handed out, the same
/// for every worker, so that all of them release the same events at the same points and agree
/// on which are late.
#[derive(Debug, Default)]
struct JobClock(AtomicI64);

type Clocks = Arc<Vec<Arc<JobClock>>>;

impl Clock for JobClock {
    fn now_ms(&self) -> Millis {
        self.0.load(Ordering::Relaxed)
    }
}

/// Marks a checkpoint of several workers' states, which one engine's never starts with (its
/// first byte is the snapshot version).
const SPLIT_MAGIC: &[u8; 4] = b"VGW1";

/// One engine, or several workers splitting the keys ([`super`]).
pub struct Engines {
    inner: Inner,
    /// Late events not yet reported by [`Engines::push`].
    late: u64,
    /// Late events of HTTP ingest not yet taken by [`Engines::take_late_ingested`].
    late_ingested: u64,
}

enum Inner {
    One(Box<Engine>),
    Many(Box<Split>),
}

/// Several workers and what is in flight to them.
struct Split {
    crew: Crew,
    /// By worker.
    clocks: Clocks,
    wall: Option<Arc<dyn Clock>>,
    plans: Vec<RulePlan>,
    config: EngineConfig,
    /// The first worker's, as of the last job collected.
    watermark: Option<Millis>,
    /// Batches handed out and not collected yet: which of their events came from ingest.
    in_flight: VecDeque<Vec<usize>>,
}

impl Split {
    /// Hands `job` to every worker, with the clock read now.
    fn send<R: Send + 'static>(
        &mut self,
        job: impl Fn(usize, &mut Engine, &mut Vec<Alert>) -> R + Send + Sync + 'static,
    ) {
        let now = self.wall.as_ref().map(|c| c.now_ms());
        let clocks = self.clocks.clone();
        self.crew.send(move |i, engine, out| {
            if let Some(now) = now {
                clocks[i].0.store(now, Ordering::Relaxed);
            }
            (job(i, engine, out), engine.watermark())
        });
    }

    fn recv<R: 'static>(&mut self, out: &mut Vec<Alert>) -> Vec<R> {
        let replies: Vec<(R, Option<Millis>)> = self.crew.recv(out);
        self.watermark = replies[0].1;
        replies.into_iter().map(|(r, _)| r).collect()
    }

    /// The oldest batch in flight: its alerts to `out`; the count of its late events, and of
    /// those from ingest.
    fn collect(&mut self, out: &mut Vec<Alert>) -> (u64, u64) {
        let taken: Vec<Vec<bool>> = self.recv(out);
        let ingested = self.in_flight.pop_front().unwrap_or_default();
        let late = taken[0].iter().filter(|t| !**t).count() as u64;
        let late_ingested = ingested.iter().filter(|&&i| !taken[0][i]).count() as u64;
        (late, late_ingested)
    }
}

impl Engines {
    /// `count` engines over `plans`; with a clock in `config`, the workers read it through
    /// [`JobClock`]s.
    pub fn new(plans: Vec<RulePlan>, config: EngineConfig, count: usize) -> Engines {
        let inner = if count <= 1 {
            Inner::One(Box::new(Engine::new(plans, config)))
        } else {
            let clocks: Clocks = Arc::new((0..count).map(|_| Arc::new(JobClock::default())).collect());
            let crew = Crew::start_with(&plans, count, |i| EngineConfig {
                clock: config.clock.as_ref().map(|_| clocks[i].clone() as Arc<dyn Clock>),
                ..config.clone()
            });
            let wall = config.clock.clone();
            Inner::Many(Box::new(Split {
                crew,
                clocks,
                wall,
                plans,
                config,
                watermark: None,
                in_flight: VecDeque::new(),
            }))
        };
        Engines { inner, late: 0, late_ingested: 0 }
    }

    pub fn count(&self) -> usize {
        match &self.inner {
            Inner::One(_) => 1,
            Inner::Many(split) => split.crew.count(),
        }
    }

    /// Collects every batch in flight: their alerts go to `out`.
    pub fn catch_up(&mut self, out: &mut Vec<Alert>) {
        if let Inner::Many(split) = &mut self.inner {
            while !split.in_flight.is_empty() {
                let (late, ingested) = split.collect(out);
                self.late += late;
                self.late_ingested += ingested;
            }
        }
    }

    /// `job` on every engine, after every batch in flight, waited for.
    fn each<R: Send + 'static>(
        &mut self,
        out: &mut Vec<Alert>,
        job: impl Fn(usize, &mut Engine, &mut Vec<Alert>) -> R + Send + Sync + 'static,
    ) -> Vec<R> {
        self.catch_up(out);
        match &mut self.inner {
            Inner::One(engine) => vec![job(0, engine, out)],
            Inner::Many(split) => {
                split.send(job);
                split.recv(out)
            }
        }
    }

    /// Events in arrival order; `ingested` lists, in order, those that came from HTTP ingest.
    /// Returns how many events were found late since the last call (with several workers,
    /// those of the batches collected so far).
    pub fn push(&mut self, events: Vec<Event>, ingested: Vec<usize>, out: &mut Vec<Alert>) -> u64 {
        match &mut self.inner {
            Inner::One(engine) => {
                for (i, e) in events.into_iter().enumerate() {
                    if !engine.push(e, out) {
                        self.late += 1;
                        self.late_ingested += u64::from(ingested.binary_search(&i).is_ok());
                    }
                }
            }
            Inner::Many(split) => {
                let events: Arc<[Arc<Event>]> = events.into_iter().map(Arc::new).collect();
                split.send(move |i, engine, out| {
                    let taken = events.iter().map(|e| engine.push_shared(e.clone(), out));
                    // Every worker decides alike; the first tells.
                    if i == 0 {
                        taken.collect()
                    } else {
                        for _ in taken {}
                        Vec::new()
                    }
                });
                split.in_flight.push_back(ingested);
                self.collect_beyond_depth(out);
            }
        }
        std::mem::take(&mut self.late)
    }

    /// Collects the oldest batches while more than [`DEPTH`] are in flight.
    fn collect_beyond_depth(&mut self, out: &mut Vec<Alert>) {
        let Inner::Many(split) = &mut self.inner else { return };
        while split.in_flight.len() > DEPTH {
            let (late, ingested) = split.collect(out);
            self.late += late;
            self.late_ingested += ingested;
        }
    }

    /// See [`Engine::set_slowest`]: handed to the workers behind the batches in flight, not
    /// waited for.
    pub fn set_slowest(&mut self, slowest: Option<Millis>, out: &mut Vec<Alert>) {
        match &mut self.inner {
            Inner::One(engine) => engine.set_slowest(slowest, out),
            Inner::Many(split) => {
                split.send(move |_, engine, out| {
                    engine.set_slowest(slowest, out);
                    Vec::<bool>::new()
                });
                split.in_flight.push_back(Vec::new());
                self.collect_beyond_depth(out);
            }
        }
    }

    /// Late events of HTTP ingest since the last call, once every batch in flight is done.
    pub fn take_late_ingested(&mut self, out: &mut Vec<Alert>) -> u64 {
        self.catch_up(out);
        std::mem::take(&mut self.late_ingested)
    }

    pub fn flush(&mut self, out: &mut Vec<Alert>) {
        self.each(out, |_, engine, out| engine.flush(out));
    }

    pub fn settle(&mut self, out: &mut Vec<Alert>) {
        self.each(out, |_, engine, out| engine.settle(out));
    }

    /// See [`Engine::advance_to`]: every worker's time moves to `now`.
    pub fn advance_to(&mut self, now: Millis, out: &mut Vec<Alert>) {
        self.each(out, move |_, engine, out| engine.advance_to(now, out));
    }

    /// See [`Engine::reload`]; every worker keeps the same rules' state.
    pub fn reload(&mut self, plans: Vec<RulePlan>, out: &mut Vec<Alert>) -> Vec<String> {
        if let Inner::Many(split) = &mut self.inner {
            split.plans = plans.clone();
        }
        let plans = Arc::new(plans);
        self.each(out, move |_, engine, _| engine.reload(plans.to_vec())).swap_remove(0)
    }

    pub fn stats(&mut self, out: &mut Vec<Alert>) -> EngineStats {
        merge(self.each(out, |_, engine, _| engine.stats().clone()))
    }

    /// As of the last batch collected.
    pub fn watermark(&self) -> Option<Millis> {
        match &self.inner {
            Inner::One(engine) => engine.watermark(),
            Inner::Many(split) => split.watermark,
        }
    }

    /// Each worker keeps its share of the budget; returns the estimate for all.
    pub fn enforce_budget(&mut self, max_bytes: usize, out: &mut Vec<Alert>) -> usize {
        let share = max_bytes / self.count();
        self.each(out, move |_, engine, out| engine.enforce_budget(share, out)).into_iter().sum()
    }

    pub fn live_keys(&mut self, out: &mut Vec<Alert>) -> BTreeMap<String, usize> {
        sum(self.each(out, |_, engine, _| engine.live_keys()))
    }

    pub fn evicted(&mut self, out: &mut Vec<Alert>) -> BTreeMap<(String, &'static str), u64> {
        sum(self.each(out, |_, engine, _| engine.evicted()))
    }

    /// The state of every engine, for a checkpoint: one engine's snapshot as it always was, or
    /// the workers' snapshots together.
    pub fn checkpoint(&mut self, out: &mut Vec<Alert>) -> Result<Vec<u8>, postcard::Error> {
        let parts = self.each(out, |_, engine, _| engine.snapshot().and_then(|s| s.to_bytes()).map(ByteBuf::from));
        let mut parts = parts.into_iter().collect::<Result<Vec<ByteBuf>, _>>()?;
        if parts.len() == 1 {
            return Ok(parts.swap_remove(0).into_vec());
        }
        let mut bytes = Vec::with_capacity(parts.iter().map(|p| p.len() + 8).sum::<usize>() + 16);
        bytes.extend_from_slice(SPLIT_MAGIC);
        postcard::to_extend(&parts, bytes)
    }

    /// Continues from [`Engines::checkpoint`]'s bytes. State split for another number of
    /// workers is not split again: the engines take the checkpoint's number instead (said in
    /// the log), so that no state is lost. Returns the rules whose state was restored.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<Vec<String>, EngineError> {
        let parts: Vec<ByteBuf> = match bytes.strip_prefix(SPLIT_MAGIC) {
            Some(rest) => postcard::from_bytes(rest)?,
            None => vec![ByteBuf::from(bytes)],
        };
        if parts.len() != self.count() {
            tracing::warn!(
                checkpoint = parts.len(),
                asked = self.count(),
                "the checkpoint's state is split for another number of workers; running that many (start from an empty store to change it)"
            );
            let (plans, config) = match &self.inner {
                Inner::One(engine) => (engine.plans().iter().map(|p| (**p).clone()).collect(), engine.config().clone()),
                Inner::Many(split) => (split.plans.clone(), split.config.clone()),
            };
            *self = Engines::new(plans, config, parts.len());
        }
        let parts = Arc::new(parts);
        let restored = self.each(&mut Vec::new(), move |i, engine, _| {
            Snapshot::from_bytes(&parts[i]).map_err(EngineError::from).and_then(|s| engine.restore(s))
        });
        let mut restored = restored.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok(restored.swap_remove(0))
    }
}

/// Counts by key, summed over the workers.
fn sum<K: Ord, N: std::ops::AddAssign + Default>(all: Vec<BTreeMap<K, N>>) -> BTreeMap<K, N> {
    let mut total = BTreeMap::new();
    for counts in all {
        for (key, n) in counts {
            *total.entry(key).or_default() += n;
        }
    }
    total
}
