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
//! those of one engine. [`Workers`] drives replay and [`Engines`] the service, both with batches
//! in flight.

use crate::alert::Alert;
use crate::engine::{Engine, EngineConfig, EngineStats, Shard};
use crate::event::{Decoded, Millis};
use std::any::Any;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use vigil_lang::plan::RulePlan;

mod engines;
pub use engines::Engines;

/// Events per batch handed to replay's workers.
const BATCH: usize = 1024;
/// Batches in flight before the oldest one's alerts are waited for.
pub(crate) const DEPTH: usize = 4;

type Reply = Box<dyn Any + Send>;
type Job = Box<dyn FnOnce(&mut Engine, &mut Vec<Alert>) -> Reply + Send>;

/// The worker threads, each with its engine, running the jobs sent to all of them in order.
pub(crate) struct Crew {
    work: Vec<SyncSender<Job>>,
    done: Vec<Receiver<(Vec<Alert>, Reply)>>,
    threads: Vec<JoinHandle<()>>,
}

impl Crew {
    pub(crate) fn start(plans: &[RulePlan], config: &EngineConfig, count: usize) -> Crew {
        Crew::start_with(plans, count, |_| config.clone())
    }

    /// Workers whose engines have the settings `config_of` gives by worker (and their shard).
    pub(crate) fn start_with(plans: &[RulePlan], count: usize, config_of: impl Fn(usize) -> EngineConfig) -> Crew {
        let mut crew = Crew { work: Vec::new(), done: Vec::new(), threads: Vec::new() };
        let count = count.max(1);
        for index in 0..count {
            let (work_tx, work_rx) = sync_channel::<Job>(DEPTH + 1);
            let (done_tx, done_rx) = sync_channel(DEPTH + 1);
            let engine =
                Engine::new(plans.to_vec(), EngineConfig { shard: Shard { index, count }, ..config_of(index) });
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
    pub(crate) fn send<R: Send + 'static>(
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
    pub(crate) fn recv<R: 'static>(&mut self, out: &mut Vec<Alert>) -> Vec<R> {
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
    pub(crate) fn each<R: Send + 'static>(
        &mut self,
        out: &mut Vec<Alert>,
        job: impl Fn(usize, &mut Engine, &mut Vec<Alert>) -> R + Send + Sync + 'static,
    ) -> Vec<R> {
        self.send(job);
        self.recv(out)
    }

    pub(crate) fn count(&self) -> usize {
        self.threads.len()
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
pub(crate) fn merge(mut all: Vec<EngineStats>) -> EngineStats {
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
    /// Keys held, in every rule of every engine.
    fn live_keys(&mut self, out: &mut Vec<Alert>) -> usize;
}

impl Driven for Engine {
    #[inline]
    fn watermark(&self) -> Option<Millis> {
        Engine::watermark(self)
    }

    #[inline]
    fn take(&mut self, decoded: Decoded, out: &mut Vec<Alert>) {
        Engine::take(self, decoded, out);
    }

    #[inline]
    fn recycle_into(&mut self, pool: &mut crate::event::EventPool) {
        Engine::recycle_into(self, pool)
    }

    fn flush(&mut self, out: &mut Vec<Alert>) {
        Engine::flush(self, out)
    }

    fn stats(&self) -> EngineStats {
        Engine::stats(self).clone()
    }

    fn live_keys(&mut self, _out: &mut Vec<Alert>) -> usize {
        Engine::live_keys(self).values().sum()
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
            let target = crate::engine::release_target(max, self.lateness);
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

    fn live_keys(&mut self, out: &mut Vec<Alert>) -> usize {
        self.crew.each(out, |_, engine, _| Engine::live_keys(engine).values().sum::<usize>()).into_iter().sum()
    }
}
