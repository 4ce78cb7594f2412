//! The streaming engine: checked rule plans compiled into operators that run over event time.
//!
//! ```text
//! events -> reorder buffer (bounded lateness) -> routing by stream, type and value
//!        -> shared filters -> operators -> alerts
//! ```
//!
//! This module is the driver. The reorder buffer ([`reorder`]) releases events in timestamp
//! order once the watermark (the largest timestamp seen, minus the allowed lateness) has passed
//! them, so every operator sees a sorted stream and out-of-order input within the lateness gives
//! exactly the alerts of sorted input. Events older than the watermark are late: counted per
//! rule and reported, not processed.
//!
//! What the engine builds from its rules is the physical plan ([`physical`]): operators, one
//! file per kind ([`filter`], [`sequence`], [`window`]), driven through the [`Operator`] hooks;
//! the routes and shared filters ([`routing`]); the gate. Each operator reports the next time at
//! which the watermark would make it act, so the engine wakes only the operators that have
//! something to do. Operators keep their state under keys ([`keys`]); a checkpoint
//! ([`snapshot`]) holds each operator's state under the identity of what it computes.

mod alerting;
mod blind;
#[cfg(test)]
mod bounds_tests;
pub mod config;
mod eval;
mod filter;
mod invariant;
pub mod keys;
mod lifecycle;
mod open_windows;
pub mod operator;
mod outlier;
mod partitioned;
pub mod physical;
mod reorder;
mod rollup;
pub mod routing;
pub mod scorer;
mod sequence;
mod sequence_plan;
pub mod snapshot;
pub mod stage_two;
mod state;
mod summary;
#[cfg(test)]
mod tests;
pub mod trace;
mod window;

pub use alerting::shown_number;
pub use blind::RULE as STATE_EVICTED_RULE;
pub use config::{Clock, EngineConfig, EngineStats, Limits, Shard, SystemClock};
pub use eval::{ClusterResult, Env, History, RegexCache};
pub use keys::{FieldsKey, Key, KeyMap};
pub use lifecycle::{Lifecycle, Transition};
pub use operator::Operator;
pub use outlier::judge as judge_peers;
pub use routing::Gate;
pub use snapshot::{Snapshot, SNAPSHOT_VERSION};

/// Why the engine could not take a snapshot back.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("snapshot version {found} is not {expected}")]
    Version { found: u32, expected: u32 },
    #[error("the snapshot cannot be read: {0}")]
    Encoding(#[from] postcard::Error),
    #[error("the state of {rules} cannot be restored: {source}")]
    State { rules: String, source: postcard::Error },
    #[error("the checkpoint record is malformed: {0}")]
    Record(String),
}

use crate::alert::Alert;
use crate::event::{Event, Millis};
use physical::Layout;
use reorder::{Pending, ReorderBuffer};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;
use vigil_lang::plan::RulePlan;

/// Registers an operator's next deadline; stale heap entries are skipped when popped.
fn schedule(
    registered: &mut [Option<Millis>],
    timers: &mut BinaryHeap<Reverse<(Millis, usize)>>,
    op: &dyn Operator,
    index: usize,
) {
    let next = op.next_deadline();
    if next != registered[index] {
        registered[index] = next;
        if let Some(due) = next {
            timers.push(Reverse((due, index)));
        }
    }
}

pub struct Engine {
    plans: Vec<Arc<RulePlan>>,
    operators: Vec<Box<dyn Operator>>,
    /// What the operators serve, and how events reach them.
    layout: Layout,
    /// Per event: 0 not yet evaluated, 1 passes, 2 fails, by filter.
    filter_memo: Vec<u8>,
    config: EngineConfig,
    buffer: ReorderBuffer,
    arrivals: u64,
    max_ts: Option<Millis>,
    /// The newest time that every live source of the input has reached, when the caller tracks
    /// sources ([`Engine::set_slowest`]): time moves no further than the newest event's would
    /// from here, so that a source behind the others (a sender resending a backlog) is not late.
    slowest: Option<Millis>,
    /// Every event up to here has been released to the operators.
    watermark: Option<Millis>,
    timers: BinaryHeap<Reverse<(Millis, usize)>>,
    registered: Vec<Option<Millis>>,
    stats: EngineStats,
    regexes: Arc<RegexCache>,
    /// The latest watermark the clock allows, as last read ([`EngineConfig::clock`]).
    ceiling: Millis,
    /// Events released that no rule kept, for their owner to read later lines into
    /// ([`Engine::recycle_into`]); a few at most.
    released: Vec<Arc<Event>>,
    /// The times timers were fired at, in order, when a router keeps them for its partitions
    /// ([`Engine::record_marks`]).
    marks: Option<Vec<Millis>>,
    /// By operator: which of its events this engine handles ([`EngineConfig::shard`]).
    owned: Vec<Owned>,
    /// By operator: where its state lives among the key groups.
    key_of: Vec<KeyOf>,
}

/// Where one operator's state lives among the key groups.
enum KeyOf {
    /// Under the key read at these fields, by source.
    Fields(Vec<Vec<usize>>),
    /// Whole, in this key group: the state cannot be split by key.
    Whole(u32),
}

impl KeyOf {
    fn of(served: &physical::Served, op: &dyn Operator) -> KeyOf {
        let sources = served.plans[0].sources.len();
        match (0..sources).map(|s| op.key_fields(s)).collect::<Option<Vec<_>>>() {
            Some(fields) => KeyOf::Fields(fields),
            None => KeyOf::Whole(keys::key_group_of(&served.id.0)),
        }
    }
}

/// Which events of one operator an engine handles, when several split the rule set's state.
enum Owned {
    All,
    Nothing,
    /// Those whose key, read at these fields by source, is in a key group the engine owns.
    ByKey(Vec<Vec<usize>>),
}

impl Owned {
    /// An operator whose state cannot be split by key is owned whole by the engine that owns the
    /// key group of its state's identity.
    fn of(shard: Shard, key: &KeyOf) -> Owned {
        match key {
            _ if shard.count <= 1 => Owned::All,
            KeyOf::Fields(fields) => Owned::ByKey(fields.clone()),
            KeyOf::Whole(group) if shard.owns(*group) => Owned::All,
            KeyOf::Whole(_) => Owned::Nothing,
        }
    }

    fn takes(&self, shard: Shard, source: usize, event: &Event) -> bool {
        match self {
            Owned::All => true,
            Owned::Nothing => false,
            Owned::ByKey(fields) => shard.owns(keys::key_group(event, &fields[source])),
        }
    }
}

/// How far the newest event's time `max_ts` lets an engine without a clock release events:
/// the lateness before it, and not its own millisecond, which may still get more events.
pub fn release_target(max_ts: Millis, lateness_ms: Millis) -> Millis {
    max_ts.saturating_sub(lateness_ms).saturating_sub(1)
}

/// Released events kept for [`Engine::recycle_into`] at most: one is usually enough, a few more
/// for when the engine releases many at once.
const RELEASED: usize = 16;

impl Engine {
    /// Builds operators for checked plans. Rules whose windowed state is the same share it.
    pub fn new(plans: Vec<RulePlan>, config: EngineConfig) -> Engine {
        let plans: Vec<Arc<RulePlan>> = plans.into_iter().map(Arc::new).collect();
        let mut regexes = RegexCache::default();
        for p in &plans {
            for e in p.exprs() {
                regexes.add_from(e);
            }
        }
        let regexes = Arc::new(regexes);
        let (mut operators, layout) = physical::build(&plans, config.limits, &regexes, config.two_stage);
        if let Some(trace) = &config.trace {
            operators.iter_mut().for_each(|op| op.trace(trace));
        }
        let n = operators.len();
        let key_of: Vec<KeyOf> =
            operators.iter().zip(&layout.served).map(|(op, served)| KeyOf::of(served, op.as_ref())).collect();
        Engine {
            owned: key_of.iter().map(|k| Owned::of(config.shard, k)).collect(),
            key_of,
            filter_memo: vec![0; layout.filters.len()],
            plans,
            operators,
            layout,
            config,
            buffer: ReorderBuffer::default(),
            arrivals: 0,
            max_ts: None,
            slowest: None,
            watermark: None,
            timers: BinaryHeap::new(),
            registered: vec![None; n],
            stats: EngineStats::default(),
            regexes,
            ceiling: Millis::MIN,
            released: Vec::new(),
            marks: None,
        }
    }

    /// Replaces the rule set while running. Operators whose state is the same computation as
    /// before ([`vigil_lang::plan::StateId`]) keep it (windows, partial matches, baselines, active
    /// alerts), even when their rules changed in their description, labels, annotations,
    /// severity or returned values; new or changed rules start empty; removed rules are dropped.
    /// Buffered events, the watermark and the counters carry over. Returns the names of the
    /// rules whose state was kept.
    pub fn reload(&mut self, plans: Vec<RulePlan>) -> Vec<String> {
        let mut fresh = Engine::new(plans, self.config.clone());
        let mut kept = Vec::new();
        let mut old: Vec<Option<(physical::Served, Box<dyn Operator>)>> =
            self.layout.served.drain(..).zip(self.operators.drain(..)).map(Some).collect();
        for (j, served) in fresh.layout.served.iter().enumerate() {
            let Some(slot) = old.iter_mut().find(|slot| slot.as_ref().is_some_and(|(s, _)| s.id == served.id)) else {
                continue;
            };
            let (prev, op) = slot.take().expect("matched a full slot");
            let same_plans =
                prev.plans.len() == served.plans.len() && prev.plans.iter().zip(&served.plans).all(|(a, b)| **a == **b);
            if same_plans {
                fresh.operators[j] = op;
            } else {
                // The same state under rules changed in what they say, not in what they keep:
                // the state moves into the operator built from the new rules.
                let moved = op.snapshot().map(|bytes| fresh.operators[j].restore(&bytes));
                if !matches!(moved, Ok(Ok(()))) {
                    tracing::warn!(rules = ?served.plans.iter().map(|p| &p.name).collect::<Vec<_>>(), "state could not be carried over; it starts empty");
                    continue;
                }
            }
            kept.extend(served.plans.iter().map(|p| p.name.clone()));
        }
        fresh.buffer = std::mem::take(&mut self.buffer);
        fresh.arrivals = self.arrivals;
        fresh.max_ts = self.max_ts;
        fresh.slowest = self.slowest;
        fresh.watermark = self.watermark;
        fresh.stats = std::mem::take(&mut self.stats);
        fresh.ceiling = self.ceiling;
        fresh.marks = self.marks.take();
        for op in 0..fresh.operators.len() {
            schedule(&mut fresh.registered, &mut fresh.timers, fresh.operators[op].as_ref(), op);
        }
        *self = fresh;
        kept
    }

    /// The engine's state, for a checkpoint.
    pub fn snapshot(&self) -> Result<Snapshot, postcard::Error> {
        let mut operators = Vec::with_capacity(self.operators.len());
        for (op, served) in self.operators.iter().zip(&self.layout.served) {
            operators.push((served.id.clone(), serde_bytes::ByteBuf::from(op.snapshot()?)));
        }
        // Times alone are left out: `max_ts` holds how far they moved time, and a timer they
        // would have fired fires with the next event instead (its alert's detection time may
        // be later by the events in between). Only `vigil replay` and `vigil bench` pass times.
        let mut buffered: Vec<(Event, u64)> =
            self.buffer.iter().filter_map(|p| Some(((**p.event.as_ref()?).clone(), p.arrival))).collect();
        buffered.sort_by_key(|(_, n)| *n);
        Ok(Snapshot {
            version: SNAPSHOT_VERSION,
            buffered,
            arrivals: self.arrivals,
            max_ts: self.max_ts,
            watermark: self.watermark,
            operators,
        })
    }

    /// Continues from a snapshot. Operators whose state is the same computation as when it was
    /// taken get their state back; the others start empty. Returns the rules whose state was
    /// restored.
    pub fn restore(&mut self, snapshot: Snapshot) -> Result<Vec<String>, EngineError> {
        if snapshot.version != SNAPSHOT_VERSION {
            return Err(EngineError::Version { found: snapshot.version, expected: SNAPSHOT_VERSION });
        }
        let mut restored = Vec::new();
        for (i, served) in self.layout.served.iter().enumerate() {
            if let Some(state) = snapshot.state_of(&served.id) {
                let names: Vec<&str> = served.plans.iter().map(|p| p.name.as_str()).collect();
                self.operators[i]
                    .restore(state)
                    .map_err(|source| EngineError::State { rules: names.join(", "), source })?;
                restored.extend(names.iter().map(|n| n.to_string()));
            }
        }
        self.buffer = snapshot
            .buffered
            .into_iter()
            .map(|(e, arrival)| Pending { ts: e.ts, event: Some(Arc::new(e)), arrival })
            .collect();
        self.arrivals = snapshot.arrivals;
        self.max_ts = snapshot.max_ts;
        self.watermark = snapshot.watermark;
        self.registered = vec![None; self.operators.len()];
        self.timers.clear();
        for op in 0..self.operators.len() {
            schedule(&mut self.registered, &mut self.timers, self.operators[op].as_ref(), op);
        }
        Ok(restored)
    }

    /// What the engine built from its rules, as `vigil explain --physical` prints it.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn plans(&self) -> &[Arc<RulePlan>] {
        &self.plans
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// What its rules need to see of an event before it is built; see [`Gate`].
    pub fn gate(&self) -> Gate {
        self.layout.gate.clone()
    }

    /// Hands the events released since the last call, that no rule kept, to `pool`: the
    /// decoder that reads later lines into them.
    pub fn recycle_into(&mut self, pool: &mut crate::event::EventPool) {
        for event in self.released.drain(..) {
            pool.give_back(event);
        }
    }

    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    pub fn watermark(&self) -> Option<Millis> {
        self.watermark
    }

    /// Live keys per rule (groups, partial matches, active alerts).
    pub fn live_keys(&self) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for op in &self.operators {
            for (rule, n) in op.live_keys() {
                *out.entry(rule).or_insert(0) += n;
            }
        }
        out
    }

    /// About how many bytes the rules' state takes (see [`Operator::state_bytes`]).
    pub fn state_bytes(&self) -> usize {
        self.operators.iter().map(|op| op.state_bytes()).sum::<usize>() + self.buffer_bytes()
    }

    /// About how many bytes the events waiting in the reorder buffer take.
    fn buffer_bytes(&self) -> usize {
        self.buffer.len() * (std::mem::size_of::<Pending>() + 160)
    }

    /// Releases the reorder buffer's oldest events until the state is estimated under
    /// `max_bytes` (the operators' share as it was before: the events released add to it), or
    /// nothing waits.
    fn release_early(&mut self, max_bytes: usize, out: &mut Vec<Alert>) {
        let kept = self.state_bytes() - self.buffer_bytes();
        while self.buffer_bytes() + kept > max_bytes {
            let Some(next) = self.buffer.next_ts() else { break };
            let before = self.buffer.len();
            self.release(next, out);
            if self.buffer.len() == before {
                break;
            }
        }
    }

    /// Drops keys, from the operators that hold the most, until the state is estimated under
    /// `max_bytes` (a bounded number of rounds). Returns the estimate after.
    fn drop_keys(&mut self, max_bytes: usize, out: &mut Vec<Alert>) -> usize {
        let now = self.watermark.unwrap_or(crate::event::MIN_TS);
        let mut total = self.state_bytes();
        for _ in 0..64 {
            if total <= max_bytes {
                break;
            }
            let sizes: Vec<usize> = self.operators.iter().map(|op| op.state_bytes()).collect();
            let Some((largest, _)) = sizes.iter().enumerate().max_by_key(|(_, n)| **n) else { break };
            let before = out.len();
            if !self.operators[largest].shrink(now, out) {
                break;
            }
            self.finish(before, now, out);
            schedule(&mut self.registered, &mut self.timers, self.operators[largest].as_ref(), largest);
            total = self.state_bytes();
        }
        total
    }

    /// Keeps the state estimated under `max_bytes`. Events waiting in the reorder buffer go
    /// first, oldest first, released early: the budget bounds what a slow or stopped source
    /// ([`Engine::set_slowest`]), or a flood of new series each a source, keeps waiting, at the
    /// cost of later events behind them being late. Then keys are dropped, from the operators
    /// that hold the most; the events released may have added keys, so both go round again
    /// while that helps. Self-alerts that either causes go to `out`. Returns the estimate after.
    pub fn enforce_budget(&mut self, max_bytes: usize, out: &mut Vec<Alert>) -> usize {
        let waiting = self.buffer.len();
        let mut total = self.state_bytes();
        for _ in 0..4 {
            if total <= max_bytes {
                break;
            }
            let before = (self.buffer.len(), total);
            self.release_early(max_bytes, out);
            total = self.drop_keys(max_bytes, out);
            if (self.buffer.len(), total) == before {
                break;
            }
        }
        if self.buffer.len() < waiting {
            let released = waiting - self.buffer.len();
            tracing::warn!(released, waiting, "over the state budget: waiting events released early");
        }
        total
    }

    /// Keys dropped so far by the state limits, per rule and reason (`cap`, `idle`, `memory`).
    pub fn evicted(&self) -> BTreeMap<(String, &'static str), u64> {
        let mut out = BTreeMap::new();
        for op in &self.operators {
            for (rule, reason, n) in op.evicted() {
                *out.entry((rule, reason)).or_insert(0) += n;
            }
        }
        out
    }

    /// Takes one event; alerts it causes (now or by moving time on) go to `out`. Returns false
    /// when the event was late and not processed.
    pub fn push(&mut self, event: Event, out: &mut Vec<Alert>) -> bool {
        self.push_shared(Arc::new(event), out)
    }

    /// [`Engine::push`] of an event already shared, as decoders hand them over
    /// ([`Decoded::Event`](crate::event::Decoded::Event)).
    pub fn push_shared(&mut self, event: Arc<Event>, out: &mut Vec<Alert>) -> bool {
        if !self.in_range(event.ts) {
            return false;
        }
        if self.watermark.is_some_and(|w| event.ts <= w) {
            self.count_late(&event);
            return false;
        }
        self.arrive(event.ts, Some(event), out);
        true
    }

    /// Takes the time of an event that no rule takes, which [`Engine::gate`] tells without the
    /// event: the same as [`Engine::push`] of it, without building it. Returns false when it
    /// was late.
    pub fn pass(&mut self, ts: Millis, out: &mut Vec<Alert>) -> bool {
        if !self.in_range(ts) {
            return false;
        }
        if self.watermark.is_some_and(|w| ts <= w) {
            // No rule would have counted it as its own late event.
            self.stats.late += 1;
            return false;
        }
        self.arrive(ts, None, out);
        true
    }

    /// What a gated decoder made of a line: an event is pushed, a time alone passed.
    pub fn take(&mut self, decoded: crate::event::Decoded, out: &mut Vec<Alert>) -> bool {
        match decoded {
            crate::event::Decoded::Event(event) => self.push_shared(event, out),
            crate::event::Decoded::Time(ts) => self.pass(ts, out),
        }
    }

    /// Whether an event time is one the engine takes (the inputs refuse others first).
    fn in_range(&mut self, ts: Millis) -> bool {
        let ok = (crate::event::MIN_TS..=crate::event::MAX_TS).contains(&ts);
        if !ok {
            self.stats.out_of_range += 1;
        }
        ok
    }

    fn arrive(&mut self, ts: Millis, event: Option<Arc<Event>>, out: &mut Vec<Alert>) {
        self.max_ts = Some(self.max_ts.map_or(ts, |m| m.max(ts)));
        self.arrivals += 1;
        self.buffer.push(Pending { ts, event, arrival: self.arrivals });
        let target = release_target(self.newest().unwrap_or(Millis::MIN), self.config.lateness_ms);
        self.release(target, out);
    }

    /// The newest event's time, or the slowest live source's when that is behind it.
    fn newest(&self) -> Option<Millis> {
        match (self.max_ts, self.slowest) {
            (Some(max), Some(slowest)) => Some(max.min(slowest)),
            (max, _) => max,
        }
    }

    /// The newest time every live source has reached (`None`: the caller knows of no source
    /// that holds time back). Time moves as the newest event's would from there; when it rises,
    /// the events it lets through are released.
    pub fn set_slowest(&mut self, slowest: Option<Millis>, out: &mut Vec<Alert>) {
        let before = self.newest();
        self.slowest = slowest;
        if let Some(newest) = self.newest().filter(|n| before.is_none_or(|b| *n > b)) {
            self.release(release_target(newest, self.config.lateness_ms), out);
        }
    }

    /// The summaries of the windows that stage-one operators closed since the last call
    /// ([`stage_two`]), by operator, each operator's in the order of its windows.
    pub fn take_summaries(&mut self) -> Vec<stage_two::Summary> {
        let mut out = Vec::new();
        for (op, served) in self.operators.iter_mut().zip(&self.layout.served) {
            for mut summary in op.take_summaries() {
                summary.op = served.id.0.clone();
                out.push(summary);
            }
        }
        out
    }

    /// Moves time to `target`, whatever the lateness, releasing every buffered event up to it:
    /// for an engine told how far time has got by its caller (a scaled-out instance learns it
    /// from every upstream partition) rather than by its newest event.
    pub fn release_to(&mut self, target: Millis, out: &mut Vec<Alert>) {
        if self.max_ts.is_none_or(|m| m < target) {
            self.max_ts = Some(target);
        }
        self.release(target, out);
    }

    /// End of input: every buffered event is released and time moves to the newest timestamp.
    /// Windows that have not ended and absences not yet due stay open.
    pub fn flush(&mut self, out: &mut Vec<Alert>) {
        if let Some(newest) = self.newest() {
            self.release(newest, out);
        }
    }

    /// Releases the events of the newest timestamp that the lateness allows, which otherwise
    /// wait for a newer event (a service's quiet stream). An event of that timestamp arriving
    /// after this is late.
    pub fn settle(&mut self, out: &mut Vec<Alert>) {
        if let Some(newest) = self.newest() {
            self.advance_to(newest, out);
        }
    }

    /// Moves time to `now` without an event (a service's idle clock, with lateness applied),
    /// no further than the slowest live source allows.
    pub fn advance_to(&mut self, now: Millis, out: &mut Vec<Alert>) {
        let now = self.slowest.map_or(now, |s| now.min(s));
        let target = now.saturating_sub(self.config.lateness_ms);
        if self.max_ts.is_none_or(|m| m < target) {
            self.max_ts = Some(target);
        }
        self.release(target, out);
    }

    /// `target`, held back to what the clock allows when the engine has one: the clock, less
    /// the lateness, as the newest event's time would give. The clock is read only when the
    /// target passes its last reading.
    fn under_clock(&mut self, target: Millis) -> Millis {
        let Some(clock) = &self.config.clock else { return target };
        if target > self.ceiling {
            self.ceiling = clock.now_ms().saturating_sub(self.config.lateness_ms);
        }
        target.min(self.ceiling)
    }

    fn release(&mut self, target: Millis, out: &mut Vec<Alert>) {
        let target = self.under_clock(target);
        if self.watermark.is_some_and(|w| target <= w) {
            return;
        }
        while let Some(Pending { ts, event, .. }) = self.buffer.pop_until(target) {
            // All events before this one's timestamp have been released: let timers due
            // strictly before it fire first, so results do not depend on how input was batched.
            self.mark(ts - 1);
            self.fire_timers(ts - 1, out);
            if let Some(event) = event {
                self.dispatch(&event, out);
                // For the decoder to read a later line into, unless a rule keeps it.
                if self.released.len() < RELEASED && Arc::strong_count(&event) == 1 {
                    self.released.push(event);
                }
            }
        }
        self.mark(target);
        self.fire_timers(target, out);
        self.watermark = Some(target);
    }

    fn dispatch(&mut self, event: &Arc<Event>, out: &mut Vec<Alert>) {
        let before = out.len();
        self.filter_memo.iter_mut().for_each(|m| *m = 0);
        let Layout { routes, filters, .. } = &self.layout;
        let shard = self.config.shard;
        let Some(routes) = routes.get(event.stream.index()) else {
            self.finish(before, event.ts, out);
            return;
        };
        for target in routes.targets(event) {
            if !self.owned[target.op].takes(shard, target.source, event) {
                continue;
            }
            if let Some(f) = target.filter {
                if self.filter_memo[f] == 0 {
                    self.filter_memo[f] = if filters[f].holds(event, &self.regexes) { 1 } else { 2 };
                }
                if self.filter_memo[f] == 2 {
                    continue;
                }
            }
            self.operators[target.op].on_event(target.source, event, out);
            schedule(&mut self.registered, &mut self.timers, self.operators[target.op].as_ref(), target.op);
        }
        self.finish(before, event.ts, out);
    }

    fn fire_timers(&mut self, watermark: Millis, out: &mut Vec<Alert>) {
        while let Some(&Reverse((due, op))) = self.timers.peek() {
            if due > watermark {
                break;
            }
            self.timers.pop();
            if self.registered[op] != Some(due) {
                continue;
            }
            self.registered[op] = None;
            let before = out.len();
            // Up to `due` only, so that work across operators happens in time order however
            // far one batch of input moved the watermark.
            self.operators[op].on_watermark(due, out);
            self.operators[op].skip_quiet(watermark);
            schedule(&mut self.registered, &mut self.timers, self.operators[op].as_ref(), op);
            self.finish(before, watermark, out);
        }
    }

    /// Stamps new alerts with their detection time and counts them.
    fn finish(&mut self, from: usize, now: Millis, out: &mut [Alert]) {
        for alert in &mut out[from..] {
            alert.detected_at = now.max(alert.time);
            if alert.status == crate::alert::Status::Firing {
                match self.stats.alerts_by_rule.get_mut(&*alert.rule) {
                    Some(n) => *n += 1,
                    None => {
                        self.stats.alerts_by_rule.insert(alert.rule.to_string(), 1);
                    }
                }
            }
        }
    }

    fn count_late(&mut self, event: &Event) {
        self.stats.late += 1;
        for plan in &self.plans {
            let takes = plan.sources.iter().enumerate().any(|(i, s)| {
                if s.stream != event.stream || s.event_type.is_some_and(|t| event.event_type() != Some(t)) {
                    return false;
                }
                let Some(filter) = &s.filter else { return true };
                let mut events: Vec<Option<&Event>> = vec![None; plan.sources.len()];
                events[i] = Some(event);
                let env = Env::events(&plan.sources, &events, &self.regexes);
                eval::holds(filter, &env)
            });
            if takes {
                *self.stats.late_by_rule.entry(plan.name.clone()).or_insert(0) += 1;
            }
        }
    }
}
