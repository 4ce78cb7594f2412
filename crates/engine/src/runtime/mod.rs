//! The runtime: one rule set as keyed partitions, on one thread or several. `vigil replay`,
//! `vigil serve` and `vigil test` drive it.
//!
//! ```text
//! events -> router: time (lateness, the clock, the slowest source), late events counted,
//!           the partitions of the key groups each event reaches (Engine::partitions_of)
//!        -> the partitions that keep those key groups, on their threads (lanes)
//!           + the points of time the router fired timers at, to every partition
//!        -> each partition's alerts, merged in detection order
//! ```
//!
//! A keyed partition ([`Partition`]) is the unit of work and of state: an engine that keeps the
//! key groups whose number modulo the partition count is its index
//! ([`Shard`](crate::engine::Shard)), the same split a group's keyed topic makes, and the type a
//! group member runs for each keyed partition it owns. An event goes only to the partitions that
//! keep a key it reaches (a series' key and its host's may be two). A fleet-wide rule runs in
//! two stages: its groups' windows in the partitions of their keys, their summaries judged by a
//! stage two on the calling thread ([`StageTwo::advance_marks`]); in a group, by the stage twos
//! of the keyed partitions, each judging its peer groups. Another rule whose state cannot be
//! split by key runs whole in the partition of its state's key group.
//!
//! Time is the router's, moved by every event as one engine's would be: no partition judges
//! lateness on its own, and each moves through the points of time at which the router fired
//! timers ([`Engine::release_marks`]), as the stage two does, so a window closes, an absence
//! fires and an alert is detected at the time one engine with every event would. Results are
//! the same for any number of partitions and threads.
//!
//! One partition runs on the caller's thread as a lone engine, with nothing routed. The
//! partition count is fixed by the first start and kept in the checkpoint ([`record`]), which
//! restores under any number of threads.

use crate::alert::Alert;
use crate::engine::stage_two::{StageTwo, Summary};
use crate::engine::{Engine, EngineConfig, EngineError, EngineStats};
use crate::event::{Decoded, Event, Millis};
use lanes::{balanced, busiest, Lanes, DEPTH};
pub use partition::Partition;
use record::{Record, RECORD_VERSION};
use serde_bytes::ByteBuf;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use vigil_lang::plan::RulePlan;

mod lanes;
pub mod partition;
pub mod record;

/// Events routed before a batch goes to the threads, when the caller hands them one by one.
const BATCH: usize = 1024;
/// Events routed between two looks at how the partitions' load is spread over the threads.
const BALANCE_EVERY: u64 = 1 << 17;

/// What replay drives: one engine, or the runtime.
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
    /// Keys held, in every rule of every partition.
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

/// A rule set's keyed partitions and what drives them ([`self`]).
pub struct Runtime {
    inner: Inner,
    plans: Vec<RulePlan>,
    config: EngineConfig,
    /// Threads asked for; at most one per partition run.
    threads: usize,
    /// Whether fleet-wide rules run in two stages (several partitions, unless a checkpoint of
    /// an earlier build had them whole).
    two_stage: bool,
    /// Whether checkpoints are written in the layout of the build before the record.
    previous: bool,
    /// Late events of HTTP ingest not yet taken by [`Runtime::take_late_ingested`].
    late_ingested: u64,
    /// The counters as of the end of input ([`Driven::flush`]).
    flushed: EngineStats,
}

enum Inner {
    /// One partition, with every key group and the fleet-wide rules whole.
    One(Box<Partition>),
    Routed(Box<Routed>),
}

/// Several partitions, on threads, and the router that feeds them.
struct Routed {
    /// Time and routes: it keeps no event and no state.
    router: Engine,
    lanes: Lanes,
    partitions: usize,
    /// Events routed and not sent yet, by thread, with their partition.
    pending: Vec<Vec<(u32, Arc<Event>)>>,
    routed: usize,
    /// Events routed to each partition since the last look at the threads' load.
    load: Vec<u64>,
    since_balance: u64,
    balance_every: u64,
    in_flight: usize,
    targets: Vec<usize>,
    /// Each batch in flight's marks, for the stage two when the batch is collected.
    marks_in_flight: VecDeque<Arc<[Millis]>>,
    /// Fleet-wide rules' judging, fed the partitions' summaries of their windows.
    stage_two: StageTwo,
    /// Alerts raised by the stage two, by rule.
    judged: BTreeMap<String, u64>,
}

impl Routed {
    /// Routes one event; false when it was late (or out of range), and went nowhere.
    fn route(&mut self, event: Arc<Event>, out: &mut Vec<Alert>) -> bool {
        if !self.router.observe(&event, out) {
            return false;
        }
        self.router.partitions_of(&event, self.partitions, &mut self.targets);
        for &p in &self.targets {
            self.pending[self.lanes.thread_of(p)].push((p as u32, event.clone()));
            self.load[p] += 1;
        }
        self.routed += 1;
        true
    }

    /// Sends what was routed, and the router's time, to every thread; collects the oldest
    /// batches beyond [`DEPTH`] in flight.
    fn send(&mut self, out: &mut Vec<Alert>) {
        let marks: Arc<[Millis]> = self.router.take_marks().into();
        for t in 0..self.lanes.count() {
            let items = std::mem::take(&mut self.pending[t]);
            let marks = marks.clone();
            self.lanes.send_to(t, move |held, out| {
                for (p, event) in items {
                    held[p as usize].as_mut().expect("placed here").engine_mut().accept(event);
                }
                let mut summaries: Vec<(usize, Vec<Summary>)> = Vec::new();
                for (p, partition) in held.iter_mut().enumerate().filter_map(|(p, e)| Some((p, e.as_mut()?))) {
                    let engine = partition.engine_mut();
                    engine.release_marks(&marks, out);
                    let closed = engine.take_summaries();
                    if !closed.is_empty() {
                        summaries.push((p, closed));
                    }
                }
                summaries
            });
        }
        self.marks_in_flight.push_back(marks);
        self.since_balance += self.routed as u64;
        self.routed = 0;
        self.in_flight += 1;
        while self.in_flight > DEPTH {
            self.collect(out);
        }
        if self.since_balance >= self.balance_every && self.lanes.count() > 1 {
            self.balance(out);
        }
    }

    /// Moves partitions between threads when the events routed since the last look would
    /// spread a twentieth more evenly: keys are hashed to key groups, and a few busy keys can
    /// load one thread's partitions more than another's.
    fn balance(&mut self, out: &mut Vec<Alert>) {
        let threads = self.lanes.count();
        let to = balanced(&self.load, threads);
        let now = busiest(&self.load, |p| self.lanes.thread_of(p), threads);
        let then = busiest(&self.load, |p| to[p], threads);
        if then * 20 < now * 19 {
            self.catch_up(out);
            self.lanes.place(&to);
            tracing::debug!(busiest_before = now, busiest_after = then, "partitions moved between threads");
        }
        self.load.iter_mut().for_each(|l| *l = 0);
        self.since_balance = 0;
    }

    fn catch_up(&mut self, out: &mut Vec<Alert>) {
        if self.routed > 0 {
            self.send(out);
        }
        while self.in_flight > 0 {
            self.collect(out);
        }
    }

    /// The oldest batch in flight: its alerts to `out`, its windows' summaries to the stage
    /// two, which judges them at the batch's marks.
    fn collect(&mut self, out: &mut Vec<Alert>) {
        let from = out.len();
        let summaries: Vec<Vec<(usize, Vec<Summary>)>> = self.lanes.recv(out);
        self.in_flight -= 1;
        let marks = self.marks_in_flight.pop_front().unwrap_or_else(|| Arc::from(Vec::new()));
        if self.stage_two.is_empty() {
            return;
        }
        for (p, closed) in summaries.into_iter().flatten() {
            for summary in closed {
                self.stage_two.take(p as i32, summary);
            }
        }
        let judged_from = out.len();
        self.stage_two.advance_marks(&marks, out);
        for alert in &out[judged_from..] {
            if alert.status == crate::alert::Status::Firing {
                *self.judged.entry(alert.rule.to_string()).or_insert(0) += 1;
            }
        }
        out[from..].sort_by_key(|a| a.detected_at);
    }

    /// `job` on every partition (with its number), after everything sent before, waited for;
    /// the replies by partition.
    fn each<R: Send + 'static>(
        &mut self,
        out: &mut Vec<Alert>,
        job: impl Fn(usize, &mut Partition, &mut Vec<Alert>) -> R + Send + Sync + 'static,
    ) -> Vec<R> {
        self.catch_up(out);
        let job = Arc::new(job);
        for t in 0..self.lanes.count() {
            let job = job.clone();
            self.lanes.send_to(t, move |held, out| {
                let placed = held.iter_mut().enumerate().filter_map(|(p, h)| Some((p, h.as_mut()?)));
                placed.map(|(p, partition)| (p, job(p, partition, out))).collect::<Vec<(usize, R)>>()
            });
        }
        let by_thread: Vec<Vec<(usize, R)>> = self.lanes.recv(out);
        let mut by_partition: Vec<Option<R>> = (0..self.partitions).map(|_| None).collect();
        for (p, r) in by_thread.into_iter().flatten() {
            by_partition[p] = Some(r);
        }
        by_partition.into_iter().map(|r| r.expect("every partition replies")).collect()
    }
}

impl Runtime {
    /// `partitions` keyed partitions (at least one) over `plans`, on `threads` threads (at
    /// most one per partition). With a clock in `config`, the router reads it.
    pub fn new(plans: Vec<RulePlan>, config: EngineConfig, partitions: usize, threads: usize) -> Runtime {
        Runtime::build(plans, config, partitions, threads, partitions > 1)
    }

    /// [`Runtime::new`], with fleet-wide rules in two stages or whole in one partition.
    fn build(
        plans: Vec<RulePlan>,
        config: EngineConfig,
        partitions: usize,
        threads: usize,
        two_stage: bool,
    ) -> Runtime {
        let partitions = partitions.max(1);
        let two_stage = two_stage && partitions > 1;
        let inner = if partitions == 1 {
            Inner::One(Box::new(Partition::new(plans.clone(), config.clone(), false)))
        } else {
            let staged = EngineConfig { two_stage, ..config.clone() };
            let lanes = Lanes::start(&plans, &staged, partitions, threads);
            let pending = (0..lanes.count()).map(|_| Vec::with_capacity(BATCH)).collect();
            let mut router = Engine::new(plans.clone(), staged.clone());
            router.record_marks();
            // Without two stages no operator is split, and the stage two has nothing to judge.
            let stage_two = StageTwo::new(&plans, &staged, partitions as u32);
            Inner::Routed(Box::new(Routed {
                router,
                lanes,
                partitions,
                pending,
                routed: 0,
                load: vec![0; partitions],
                since_balance: 0,
                balance_every: BALANCE_EVERY,
                in_flight: 0,
                targets: Vec::new(),
                marks_in_flight: VecDeque::new(),
                stage_two,
                judged: BTreeMap::new(),
            }))
        };
        Runtime {
            inner,
            plans,
            config,
            threads,
            two_stage,
            previous: false,
            late_ingested: 0,
            flushed: EngineStats::default(),
        }
    }

    /// A runtime whose checkpoints the build before the record reads, so that a rollback to it
    /// keeps the rules' state: fleet-wide rules whole, and [`Runtime::checkpoint`] writes one
    /// engine's snapshot, or `VGW1` and each partition's, every one with the router's time (as
    /// that build's workers, which all saw every event, had it).
    pub fn previous(plans: Vec<RulePlan>, config: EngineConfig, partitions: usize, threads: usize) -> Runtime {
        Runtime { previous: true, ..Runtime::build(plans, config, partitions, threads, false) }
    }

    /// Looks at the partitions' load every `events` routed, rather than every 131,072.
    pub fn balance_every(mut self, events: u64) -> Runtime {
        if let Inner::Routed(r) = &mut self.inner {
            r.balance_every = events.max(1);
        }
        self
    }

    /// Threads running partitions.
    pub fn count(&self) -> usize {
        match &self.inner {
            Inner::One(_) => 1,
            Inner::Routed(r) => r.lanes.count(),
        }
    }

    pub fn partitions(&self) -> usize {
        match &self.inner {
            Inner::One(_) => 1,
            Inner::Routed(r) => r.partitions,
        }
    }

    /// What the rules need to see of an event before it is built ([`Engine::gate`]).
    pub fn gate(&self) -> crate::engine::Gate {
        match &self.inner {
            Inner::One(one) => one.engine().gate(),
            Inner::Routed(r) => r.router.gate(),
        }
    }

    /// Collects every batch in flight: their alerts go to `out`.
    pub fn catch_up(&mut self, out: &mut Vec<Alert>) {
        if let Inner::Routed(r) = &mut self.inner {
            r.catch_up(out);
        }
    }

    /// `job` on every partition, after everything sent before, waited for; by partition.
    fn each<R: Send + 'static>(
        &mut self,
        out: &mut Vec<Alert>,
        job: impl Fn(usize, &mut Partition, &mut Vec<Alert>) -> R + Send + Sync + 'static,
    ) -> Vec<R> {
        match &mut self.inner {
            Inner::One(one) => vec![job(0, one, out)],
            Inner::Routed(r) => r.each(out, job),
        }
    }

    /// Moves time on the router, then tells every partition.
    fn on_router(&mut self, out: &mut Vec<Alert>, step: impl FnOnce(&mut Engine, &mut Vec<Alert>)) {
        match &mut self.inner {
            Inner::One(one) => step(one.engine_mut(), out),
            Inner::Routed(r) => {
                step(&mut r.router, out);
                r.send(out);
            }
        }
    }

    /// Events in arrival order; `ingested` lists, in order, those that came from HTTP ingest.
    /// Returns how many were late.
    pub fn push(&mut self, events: Vec<Event>, ingested: Vec<usize>, out: &mut Vec<Alert>) -> u64 {
        let mut late = 0;
        for (i, e) in events.into_iter().enumerate() {
            let taken = match &mut self.inner {
                Inner::One(one) => one.engine_mut().push(e, out),
                Inner::Routed(r) => r.route(Arc::new(e), out),
            };
            if !taken {
                late += 1;
                self.late_ingested += u64::from(ingested.binary_search(&i).is_ok());
            }
        }
        if let Inner::Routed(r) = &mut self.inner {
            r.send(out);
        }
        late
    }

    /// See [`Engine::set_slowest`].
    pub fn set_slowest(&mut self, slowest: Option<Millis>, out: &mut Vec<Alert>) {
        self.on_router(out, |engine, out| engine.set_slowest(slowest, out));
    }

    /// Late events of HTTP ingest since the last call.
    pub fn take_late_ingested(&mut self, out: &mut Vec<Alert>) -> u64 {
        self.catch_up(out);
        std::mem::take(&mut self.late_ingested)
    }

    /// End of input: every buffered event is released, time moves to the newest event's.
    pub fn flush(&mut self, out: &mut Vec<Alert>) {
        self.on_router(out, |engine, out| engine.flush(out));
        self.catch_up(out);
    }

    pub fn settle(&mut self, out: &mut Vec<Alert>) {
        self.on_router(out, |engine, out| engine.settle(out));
        self.catch_up(out);
    }

    /// See [`Engine::advance_to`].
    pub fn advance_to(&mut self, now: Millis, out: &mut Vec<Alert>) {
        self.on_router(out, |engine, out| engine.advance_to(now, out));
        self.catch_up(out);
    }

    /// See [`Engine::reload`]; every partition keeps the same rules' state.
    pub fn reload(&mut self, plans: Vec<RulePlan>, out: &mut Vec<Alert>) -> Vec<String> {
        self.plans = plans.clone();
        if let Inner::Routed(r) = &mut self.inner {
            r.catch_up(out);
            r.router.reload(plans.clone());
            r.stage_two.reload(&plans, &EngineConfig { two_stage: self.two_stage, ..self.config.clone() });
        }
        let plans = Arc::new(plans);
        self.each(out, move |_, partition, _| partition.reload(plans.to_vec())).swap_remove(0)
    }

    /// The counters: late and refused events as the router judged them, alerts by partition.
    pub fn stats(&mut self, out: &mut Vec<Alert>) -> EngineStats {
        let all = self.each(out, |_, partition, _| partition.engine().stats().clone());
        match &self.inner {
            Inner::One(_) => all.into_iter().next().unwrap_or_default(),
            Inner::Routed(r) => {
                let mut total = r.router.stats().clone();
                let judged = EngineStats { alerts_by_rule: r.judged.clone(), ..EngineStats::default() };
                for s in all.into_iter().chain([judged]) {
                    for (rule, n) in s.alerts_by_rule {
                        *total.alerts_by_rule.entry(rule).or_insert(0) += n;
                    }
                }
                total
            }
        }
    }

    /// How far time has got: every event up to it is released, or sent to be.
    pub fn watermark(&self) -> Option<Millis> {
        match &self.inner {
            Inner::One(one) => one.engine().watermark(),
            Inner::Routed(r) => r.router.watermark(),
        }
    }

    /// Each partition keeps its share of the budget, and so does the stage two when there is
    /// one; returns the estimate for all.
    pub fn enforce_budget(&mut self, max_bytes: usize, out: &mut Vec<Alert>) -> usize {
        let staged = matches!(&self.inner, Inner::Routed(r) if !r.stage_two.is_empty());
        let share = max_bytes / (self.partitions() + usize::from(staged));
        let kept: usize = self.each(out, move |_, p, out| p.enforce_budget(share, out)).into_iter().sum();
        match &mut self.inner {
            Inner::Routed(r) if staged => {
                let from = out.len();
                let judged = r.stage_two.enforce_budget(share, out);
                out[from..].sort_by_key(|a| a.detected_at);
                kept + judged
            }
            _ => kept,
        }
    }

    /// Groups, partial matches and active alerts by rule ([`StageTwo::count_live_keys`]).
    pub fn live_keys(&mut self, out: &mut Vec<Alert>) -> BTreeMap<String, usize> {
        let mut keys = sum(self.each(out, |_, partition, _| partition.live_keys()));
        if let Inner::Routed(r) = &self.inner {
            r.stage_two.count_live_keys(&mut keys);
        }
        keys
    }

    pub fn evicted(&mut self, out: &mut Vec<Alert>) -> BTreeMap<(String, &'static str), u64> {
        let mut evicted = sum(self.each(out, |_, partition, _| partition.evicted()));
        if let Inner::Routed(r) = &self.inner {
            r.stage_two.count_evicted(&mut evicted);
        }
        evicted
    }

    /// The stage two's estimated state, when fleet-wide rules run in two stages.
    pub fn stage_two_bytes(&self) -> Option<usize> {
        match &self.inner {
            Inner::Routed(r) if !r.stage_two.is_empty() => Some(r.stage_two.state_bytes()),
            _ => None,
        }
    }

    /// How far time has got: the newest event's time and the watermark.
    fn time(&self) -> (Option<Millis>, Option<Millis>) {
        match &self.inner {
            Inner::One(one) => one.engine().time(),
            Inner::Routed(r) => r.router.time(),
        }
    }

    /// The checkpoint record of every partition's state ([`record`]), or the layout of the
    /// build before it ([`Runtime::previous`]; a record when a restored record put fleet-wide
    /// rules in two stages, which that build cannot read).
    pub fn checkpoint(&mut self, out: &mut Vec<Alert>) -> Result<Vec<u8>, postcard::Error> {
        if self.previous && !self.two_stage {
            let time = self.time();
            let parts = self.each(out, move |_, partition, _| {
                let mut snapshot = partition.engine().snapshot()?;
                snapshot.set_time(time);
                snapshot.to_bytes().map(ByteBuf::from)
            });
            return Record::previous_layout(parts.into_iter().collect::<Result<Vec<ByteBuf>, _>>()?);
        }
        let parts = self.each(out, |_, partition, _| partition.snapshot().map(|(bytes, _)| ByteBuf::from(bytes)));
        let parts = parts.into_iter().collect::<Result<Vec<ByteBuf>, _>>()?;
        let (max_ts, watermark) = self.time();
        let stage_two = match &self.inner {
            Inner::Routed(r) if !r.stage_two.is_empty() => r.stage_two.snapshot()?,
            _ => Vec::new(),
        };
        let partitions = parts.len() as u32;
        let two_stage = self.two_stage;
        let stage_two = ByteBuf::from(stage_two);
        Record { version: RECORD_VERSION, partitions, two_stage, max_ts, watermark, parts, stage_two }.to_bytes()
    }

    /// Continues from a checkpoint ([`Record::read`] says which layouts). The record's
    /// partition count wins over the one asked for, so that no key group's state is lost; the
    /// threads asked for run them. Returns the rules whose state was restored.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<Vec<String>, EngineError> {
        let record = Record::read(bytes)?;
        let partitions = record.partitions as usize;
        if partitions != self.partitions() || record.two_stage != self.two_stage {
            tracing::info!(
                checkpoint = partitions,
                asked = self.partitions(),
                threads = self.threads,
                two_stage = record.two_stage,
                "running the checkpoint's keyed partitions"
            );
            let (plans, config) = (self.plans.clone(), self.config.clone());
            let previous = self.previous;
            *self = Runtime { previous, ..Runtime::build(plans, config, partitions, self.threads, record.two_stage) };
            if previous && record.two_stage {
                tracing::warn!("the checkpoint runs fleet-wide rules in two stages, which the build before cannot read: checkpoints stay records");
            }
        }
        if let Inner::Routed(r) = &mut self.inner {
            r.router.restore_time(record.max_ts, record.watermark);
            if !record.stage_two.is_empty() {
                r.stage_two.restore(&record.stage_two)?;
            }
        }
        let parts = Arc::new(record.parts);
        let restored = self.each(&mut Vec::new(), move |p, partition, _| partition.restore(&parts[p], None));
        let mut restored = restored.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok(restored.swap_remove(0))
    }
}

impl Driven for Runtime {
    fn watermark(&self) -> Option<Millis> {
        Runtime::watermark(self)
    }

    fn take(&mut self, decoded: Decoded, out: &mut Vec<Alert>) {
        match &mut self.inner {
            Inner::One(one) => {
                one.engine_mut().take(decoded, out);
            }
            Inner::Routed(r) => {
                match decoded {
                    Decoded::Event(event) => {
                        r.route(event, out);
                    }
                    Decoded::Time(ts) => {
                        r.router.pass(ts, out);
                    }
                }
                if r.routed >= BATCH {
                    r.send(out);
                }
            }
        }
    }

    fn recycle_into(&mut self, pool: &mut crate::event::EventPool) {
        if let Inner::One(one) = &mut self.inner {
            one.engine_mut().recycle_into(pool);
        }
    }

    fn flush(&mut self, out: &mut Vec<Alert>) {
        Runtime::flush(self, out);
        self.flushed = Runtime::stats(self, out);
    }

    fn stats(&self) -> EngineStats {
        match &self.inner {
            Inner::One(one) => one.engine().stats().clone(),
            Inner::Routed(_) => self.flushed.clone(),
        }
    }

    fn live_keys(&mut self, out: &mut Vec<Alert>) -> usize {
        Runtime::live_keys(self, out).values().sum()
    }
}

/// Counts by key, summed over the partitions.
fn sum<K: Ord, N: std::ops::AddAssign + Default>(all: Vec<BTreeMap<K, N>>) -> BTreeMap<K, N> {
    let mut total = BTreeMap::new();
    for counts in all {
        for (key, n) in counts {
            *total.entry(key).or_default() += n;
        }
    }
    total
}

#[cfg(test)]
mod tests;
