//! One rule set on several threads (`--workers N`): N engines, each owning the key groups
//! whose number modulo N is its index ([`Shard`]).
//!
//! ```text
//! events -> every worker's engine (the same events, the same time)
//!             -> each keeps state, and raises alerts, for its own key groups only
//!        -> the alerts of every worker, merged in detection order
//! ```
//!
//! Every worker sees every event, so each has the same watermark, the same late events and the
//! same windows: what differs is only whose keys it keeps. A rule whose state cannot be split by
//! key (a fleet-wide comparison, one global group) runs whole on one worker. The alerts are
//! those of one engine. [`Workers`] drives replay, with batches in flight; [`Engines`] drives
//! the service, one batch at a time, with the clock read once for all workers.

use crate::alert::Alert;
use crate::engine::{Clock, Engine, EngineConfig, EngineError, EngineStats, Shard, Snapshot};
use crate::event::{Decoded, Millis};
use crate::plan::RulePlan;
use std::any::Any;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Events per batch handed to replay's workers.
const BATCH: usize = 1024;
/// Batches in flight before the oldest one's alerts are waited for.
const DEPTH: usize = 4;

type Reply = Box<dyn Any + Send>;
type Job = Box<dyn FnOnce(&mut Engine, &mut Vec<Alert>) -> Reply + Send>;

/// The worker threads, each with its engine, running the jobs sent to all of them in order.
struct Crew {
    work: Vec<SyncSender<Job>>,
    done: Vec<Receiver<(Vec<Alert>, Reply)>>,
    threads: Vec<JoinHandle<()>>,
}

impl Crew {
    fn start(plans: &[RulePlan], config: &EngineConfig, count: usize) -> Crew {
        let mut crew = Crew { work: Vec::new(), done: Vec::new(), threads: Vec::new() };
        for index in 0..count.max(1) {
            let (work_tx, work_rx) = sync_channel::<Job>(DEPTH + 1);
            let (done_tx, done_rx) = sync_channel(DEPTH + 1);
            let engine = Engine::new(plans.to_vec(), EngineConfig { shard: Shard { index, count }, ..config.clone() });
            let thread = std::thread::Builder::new()
                .name(format!("vigil-worker-{index}"))
                .spawn(move || run(engine, work_rx, done_tx))
                .expect("a worker thread starts");
            crew.work.push(work_tx);
            crew.done.push(done_rx);
            crew.threads.push(thread);
        }
        crew
    }

    /// Runs `job` on every worker's engine, after the jobs sent before.
    fn send<R: Send + 'static>(
        &mut self,
        job: impl Fn(usize, &mut Engine, &mut Vec<Alert>) -> R + Send + Sync + 'static,
    ) {
        let job = Arc::new(job);
        for (i, tx) in self.work.iter().enumerate() {
            let job = job.clone();
            if tx
                .send(Box::new(move |engine: &mut Engine, out: &mut Vec<Alert>| Box::new(job(i, engine, out)) as Reply))
                .is_err()
            {
                self.join_failed();
            }
        }
    }

    /// The oldest job's results, by worker; its alerts from all workers go to `out`, in
    /// detection order.
    fn recv<R: 'static>(&mut self, out: &mut Vec<Alert>) -> Vec<R> {
        let from = out.len();
        let mut replies = Vec::with_capacity(self.done.len());
        for i in 0..self.done.len() {
            let Ok((alerts, reply)) = self.done[i].recv() else { self.join_failed() };
            out.extend(alerts);
            replies.push(*reply.downcast::<R>().expect("a job's reply has the type it was sent with"));
        }
        out[from..].sort_by_key(|a| a.detected_at);
        replies
    }

    /// `job` on every worker, waited for.
    fn each<R: Send + 'static>(
        &mut self,
        out: &mut Vec<Alert>,
        job: impl Fn(usize, &mut Engine, &mut Vec<Alert>) -> R + Send + Sync + 'static,
    ) -> Vec<R> {
        self.send(job);
        self.recv(out)
    }

    /// A worker stopped: its panic goes on here, as one engine's would.
    fn join_failed(&mut self) -> ! {
        for thread in self.threads.drain(..) {
            if let Err(panic) = thread.join() {
                std::panic::resume_unwind(panic);
            }
        }
        unreachable!("a worker stopped without a panic while work was in flight")
    }
}

fn run(mut engine: Engine, work: Receiver<Job>, done: SyncSender<(Vec<Alert>, Reply)>) {
    let mut out = Vec::new();
    for job in work {
        let reply = job(&mut engine, &mut out);
        if done.send((std::mem::take(&mut out), reply)).is_err() {
            return;
        }
    }
}

impl Drop for Crew {
    fn drop(&mut self) {
        // Closed both ways first, so that no worker waits to hand over results no one takes.
        self.done.clear();
        self.work.clear();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// The counters of all workers: alerts are each worker's own; late and refused events were
/// seen by all alike, so they are the first's.
fn merge(mut all: Vec<EngineStats>) -> EngineStats {
    let mut total = all.remove(0);
    for s in all {
        for (rule, n) in s.alerts_by_rule {
            *total.alerts_by_rule.entry(rule).or_insert(0) += n;
        }
    }
    total
}

/// What replay drives: one engine, or several on threads.
pub trait Driven {
    /// Every event up to here has been released to the rules.
    fn watermark(&self) -> Option<Millis>;
    /// Takes one decoded line; the alerts it causes go to `out`, now or with a later call.
    fn take(&mut self, decoded: Decoded, out: &mut Vec<Alert>);
    /// Hands events no rule kept back to the decoders' pool.
    fn recycle_into(&mut self, _pool: &mut crate::event::EventPool) {}
    /// End of input; every alert still held goes to `out`.
    fn flush(&mut self, out: &mut Vec<Alert>);
    fn stats(&self) -> EngineStats;
}

impl Driven for Engine {
    fn watermark(&self) -> Option<Millis> {
        Engine::watermark(self)
    }

    fn take(&mut self, decoded: Decoded, out: &mut Vec<Alert>) {
        Engine::take(self, decoded, out);
    }

    fn recycle_into(&mut self, pool: &mut crate::event::EventPool) {
        Engine::recycle_into(self, pool)
    }

    fn flush(&mut self, out: &mut Vec<Alert>) {
        Engine::flush(self, out)
    }

    fn stats(&self) -> EngineStats {
        Engine::stats(self).clone()
    }
}

/// Replay's workers: batches of decoded lines, several in flight.
pub struct Workers {
    crew: Crew,
    batch: Vec<Decoded>,
    in_flight: usize,
    /// The time the engines have, mirrored: without a clock, an engine's watermark trails its
    /// newest event by the lateness.
    lateness: Millis,
    max_ts: Option<Millis>,
    watermark: Option<Millis>,
    stats: EngineStats,
}

impl Workers {
    /// Starts `count` workers (at least one) over `plans`; `config` has no clock.
    pub fn start(plans: &[RulePlan], config: &EngineConfig, count: usize) -> Workers {
        Workers {
            crew: Crew::start(plans, &EngineConfig { clock: None, ..config.clone() }, count),
            batch: Vec::with_capacity(BATCH),
            in_flight: 0,
            lateness: config.lateness_ms,
            max_ts: None,
            watermark: None,
            stats: EngineStats::default(),
        }
    }

    fn send_batch(&mut self, out: &mut Vec<Alert>) {
        if self.batch.is_empty() {
            return;
        }
        let batch: Arc<[Decoded]> = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH)).into();
        self.crew.send(move |_, engine, out| {
            for d in batch.iter() {
                engine.take(d.clone(), out);
            }
        });
        self.in_flight += 1;
        while self.in_flight > DEPTH {
            self.crew.recv::<()>(out);
            self.in_flight -= 1;
        }
    }
}

impl Driven for Workers {
    fn watermark(&self) -> Option<Millis> {
        self.watermark
    }

    fn take(&mut self, decoded: Decoded, out: &mut Vec<Alert>) {
        let ts = decoded.ts();
        let in_range = (crate::event::MIN_TS..=crate::event::MAX_TS).contains(&ts);
        if in_range && self.watermark.is_none_or(|w| ts > w) {
            let max = self.max_ts.map_or(ts, |m| m.max(ts));
            self.max_ts = Some(max);
            let target = max.saturating_sub(self.lateness).saturating_sub(1);
            self.watermark = Some(self.watermark.map_or(target, |w| w.max(target)));
        }
        self.batch.push(decoded);
        if self.batch.len() >= BATCH {
            self.send_batch(out);
        }
    }

    fn flush(&mut self, out: &mut Vec<Alert>) {
        self.send_batch(out);
        for _ in 0..std::mem::take(&mut self.in_flight) {
            self.crew.recv::<()>(out);
        }
        self.stats = merge(self.crew.each(out, |_, engine, out| {
            engine.flush(out);
            engine.stats().clone()
        }));
        if let Some(max) = self.max_ts {
            self.watermark = Some(self.watermark.map_or(max, |w| w.max(max)));
        }
    }

    fn stats(&self) -> EngineStats {
        self.stats.clone()
    }
}

/// The time every worker of the service reads: the wall clock, read once per batch by the
/// thread that hands the workers their work, so that all of them release the same events at
/// the same points and agree on which are late.
#[derive(Debug, Default)]
struct BatchClock(AtomicI64);

impl Clock for BatchClock {
    fn now_ms(&self) -> Millis {
        self.0.load(Ordering::Relaxed)
    }
}

/// Marks a checkpoint of several workers' states, which one engine's never starts with (its
/// first byte is the snapshot version).
const SPLIT_MAGIC: &[u8; 4] = b"VGW1";

/// The service's engines: one, or several workers run one batch at a time.
pub struct Engines(Inner);

enum Inner {
    One(Box<Engine>),
    Many { crew: Crew, clock: Arc<BatchClock>, plans: Vec<RulePlan>, config: EngineConfig, watermark: Option<Millis> },
}

impl Engines {
    /// `count` engines over `plans`; with a clock in `config`, the workers read it through
    /// [`BatchClock`].
    pub fn new(plans: Vec<RulePlan>, config: EngineConfig, count: usize) -> Engines {
        if count <= 1 {
            return Engines(Inner::One(Box::new(Engine::new(plans, config))));
        }
        let clock = Arc::new(BatchClock::default());
        let shared =
            EngineConfig { clock: config.clock.as_ref().map(|_| clock.clone() as Arc<dyn Clock>), ..config.clone() };
        Engines(Inner::Many { crew: Crew::start(&plans, &shared, count), clock, plans, config, watermark: None })
    }

    pub fn count(&self) -> usize {
        match &self.0 {
            Inner::One(_) => 1,
            Inner::Many { crew, .. } => crew.threads.len(),
        }
    }

    /// `job` on every engine, waited for; the clock read once for all of them first.
    fn each<R: Send + 'static>(
        &mut self,
        out: &mut Vec<Alert>,
        job: impl Fn(usize, &mut Engine, &mut Vec<Alert>) -> R + Send + Sync + 'static,
    ) -> Vec<R> {
        match &mut self.0 {
            Inner::One(engine) => vec![job(0, engine, out)],
            Inner::Many { crew, clock, config, watermark, .. } => {
                if let Some(c) = &config.clock {
                    clock.0.store(c.now_ms(), Ordering::Relaxed);
                }
                let replies = crew.each(out, move |i, engine, out| (job(i, engine, out), engine.watermark()));
                *watermark = replies[0].1;
                replies.into_iter().map(|(r, _)| r).collect()
            }
        }
    }

    /// Events in arrival order; returns, for each, whether it was taken (false: late).
    pub fn push(&mut self, events: Vec<crate::event::Event>, out: &mut Vec<Alert>) -> Vec<bool> {
        if let Inner::One(engine) = &mut self.0 {
            return events.into_iter().map(|e| engine.push(e, out)).collect();
        }
        let events: Arc<[Arc<crate::event::Event>]> = events.into_iter().map(Arc::new).collect();
        let mut taken = self.each(out, move |i, engine, out| {
            let taken: Vec<bool> = events.iter().map(|e| engine.push_shared(e.clone(), out)).collect();
            // Every worker decides alike; the first tells.
            if i == 0 {
                taken
            } else {
                Vec::new()
            }
        });
        taken.swap_remove(0)
    }

    pub fn flush(&mut self, out: &mut Vec<Alert>) {
        self.each(out, |_, engine, out| engine.flush(out));
    }

    pub fn settle(&mut self, out: &mut Vec<Alert>) {
        self.each(out, |_, engine, out| engine.settle(out));
    }

    /// See [`Engine::reload`]; every worker keeps the same rules' state.
    pub fn reload(&mut self, plans: Vec<RulePlan>) -> Vec<String> {
        if let Inner::Many { plans: current, .. } = &mut self.0 {
            *current = plans.clone();
        }
        let plans = Arc::new(plans);
        self.each(&mut Vec::new(), move |_, engine, _| engine.reload(plans.to_vec())).swap_remove(0)
    }

    pub fn stats(&mut self) -> EngineStats {
        merge(self.each(&mut Vec::new(), |_, engine, _| engine.stats().clone()))
    }

    pub fn watermark(&self) -> Option<Millis> {
        match &self.0 {
            Inner::One(engine) => engine.watermark(),
            Inner::Many { watermark, .. } => *watermark,
        }
    }

    /// Each worker keeps its share of the budget; returns the estimate for all.
    pub fn enforce_budget(&mut self, max_bytes: usize, out: &mut Vec<Alert>) -> usize {
        let share = max_bytes / self.count();
        self.each(out, move |_, engine, out| engine.enforce_budget(share, out)).into_iter().sum()
    }

    pub fn live_keys(&mut self) -> std::collections::BTreeMap<String, usize> {
        let mut total = std::collections::BTreeMap::new();
        for keys in self.each(&mut Vec::new(), |_, engine, _| engine.live_keys()) {
            for (rule, n) in keys {
                *total.entry(rule).or_insert(0) += n;
            }
        }
        total
    }

    pub fn evicted(&mut self) -> std::collections::BTreeMap<(String, &'static str), u64> {
        let mut total = std::collections::BTreeMap::new();
        for keys in self.each(&mut Vec::new(), |_, engine, _| engine.evicted()) {
            for (key, n) in keys {
                *total.entry(key).or_insert(0) += n;
            }
        }
        total
    }

    /// The state of every engine, for a checkpoint: one engine's snapshot as it always was, or
    /// the workers' snapshots together.
    pub fn checkpoint(&mut self) -> Result<Vec<u8>, postcard::Error> {
        if let Inner::One(engine) = &mut self.0 {
            return engine.snapshot()?.to_bytes();
        }
        let parts = self.each(&mut Vec::new(), |_, engine, _| engine.snapshot().and_then(|s| s.to_bytes()));
        let parts = parts.into_iter().collect::<Result<Vec<Vec<u8>>, _>>()?;
        let mut bytes = SPLIT_MAGIC.to_vec();
        bytes.extend(postcard::to_stdvec(&parts)?);
        Ok(bytes)
    }

    /// Continues from [`Engines::checkpoint`]'s bytes. State split for another number of
    /// workers is not split again: the engines take the checkpoint's number instead (said in
    /// the log), so that no state is lost. Returns the rules whose state was restored.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<Vec<String>, EngineError> {
        let parts: Vec<Vec<u8>> = match bytes.strip_prefix(SPLIT_MAGIC) {
            Some(rest) => postcard::from_bytes(rest)?,
            None => vec![bytes.to_vec()],
        };
        if parts.len() != self.count() {
            tracing::warn!(
                checkpoint = parts.len(),
                asked = self.count(),
                "the checkpoint's state is split for another number of workers; running that many (start from an empty store to change it)"
            );
            let (plans, config) = match &mut self.0 {
                Inner::One(engine) => (engine.plans().iter().map(|p| (**p).clone()).collect(), engine.config().clone()),
                Inner::Many { plans, config, .. } => (plans.clone(), config.clone()),
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
