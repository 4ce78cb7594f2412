//! The streaming engine: checked rule plans compiled into operators that run over event time.
//!
//! ```text
//! events -> reorder buffer (bounded lateness) -> dispatch by stream and type -> operators -> alerts
//! ```
//!
//! The reorder buffer releases events in timestamp order once the watermark (the largest
//! timestamp seen, minus the allowed lateness) has passed them, so every operator sees a sorted
//! stream and out-of-order input within the lateness gives exactly the alerts of sorted input.
//! Events older than the watermark are late: counted per rule and reported, not processed.
//!
//! Operators ([`Operator`]) are driven by two hooks, `on_event` and `on_watermark`. Each reports
//! the next time at which the watermark would make it act (a window close, an absence deadline,
//! an alert to resolve), so the engine wakes only the operators that have something to do.
//! Rules that aggregate the same events the same way share one window operator (SAQL's
//! master-dependent scheme): the state is computed once and each dependent rule judges it.

mod alerting;
mod blind;
#[cfg(test)]
mod bounds_tests;
mod eval;
mod filter;
mod invariant;
mod lifecycle;
mod outlier;
mod reorder;
mod sequence;
mod state;
mod window;

pub use blind::RULE as STATE_EVICTED_RULE;
pub use eval::{ClusterResult, Env, History, RegexCache};
pub use lifecycle::{Lifecycle, Transition};
pub use outlier::judge as judge_peers;

use crate::alert::Alert;
use crate::event::{Event, Millis, Value};
use crate::plan::{Model, RulePlan};
use crate::schema::Stream;
use reorder::{Pending, ReorderBuffer};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// A hash map by [`Key`], the engine's per-key state. foldhash rather than SipHash: hashing
/// the key is a good part of an event's cost in window and sequence rules, and its per-process
/// random seed still keeps crafted keys from colliding on purpose.
pub type KeyMap<V> = hashbrown::HashMap<Key, V, foldhash::fast::RandomState>;

/// A group or match key: the values that identify what an alert is about.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Key(pub Vec<Value>);

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len() && self.0.iter().zip(&other.0).all(|(a, b)| same_key_value(a, b))
    }
}

impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        for v in &self.0 {
            hash_key_value(v, state);
        }
    }
}

/// Equality of key values: numbers by their bits, so that a NaN key finds itself.
fn same_key_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Num(x), Value::Num(y)) => x.to_bits() == y.to_bits(),
        _ => a == b,
    }
}

fn hash_key_value<H: Hasher>(v: &Value, state: &mut H) {
    match v {
        Value::Null => 0u8.hash(state),
        Value::Num(n) => n.to_bits().hash(state),
        Value::Str(s) => s.hash(state),
        Value::Bool(b) => b.hash(state),
        Value::Dur(d) | Value::Time(d) => d.hash(state),
        other => other.to_text().hash(state),
    }
}

/// The key made of an event's values at `positions` (as [`Event::value`] reads them), read in
/// place: it hashes and compares as that [`Key`] would, so a group or partition is found
/// without building its key (an allocation, and a shared count per string).
pub struct FieldsKey<'a> {
    pub event: &'a Event,
    pub positions: &'a [usize],
}

impl FieldsKey<'_> {
    fn with_value<R>(&self, position: usize, f: impl FnOnce(&Value) -> R) -> R {
        match self.event.fields.get(position) {
            Some(v) => f(v),
            None => f(&self.event.value(position)),
        }
    }
}

impl Hash for FieldsKey<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        for &p in self.positions {
            self.with_value(p, |v| hash_key_value(v, state));
        }
    }
}

impl hashbrown::Equivalent<Key> for FieldsKey<'_> {
    fn equivalent(&self, key: &Key) -> bool {
        key.0.len() == self.positions.len()
            && self.positions.iter().zip(&key.0).all(|(&p, k)| self.with_value(p, |v| same_key_value(v, k)))
    }
}

/// A compiled rule (or group of rules sharing work) driven by events and the watermark.
pub trait Operator: Send {
    /// An event for source `source` of the operator's rule, in timestamp order.
    fn on_event(&mut self, source: usize, event: &Arc<Event>, out: &mut Vec<Alert>);
    /// Every event with a timestamp up to `watermark` has been seen.
    fn on_watermark(&mut self, watermark: Millis, out: &mut Vec<Alert>);
    /// The smallest watermark at which `on_watermark` would do anything.
    fn next_deadline(&self) -> Option<Millis>;
    /// Every event up to `horizon` has been seen: work that would only repeat itself up to
    /// there may be skipped, so that a far jump of event time costs a bounded amount of work
    /// (a windowed rule's closes of windows that no group has events in).
    fn skip_quiet(&mut self, _horizon: Millis) {}
    /// Live keys per rule: groups, partial matches and active alerts.
    fn live_keys(&self) -> Vec<(String, usize)>;
    /// The operator's state, for a checkpoint.
    fn snapshot(&self) -> Result<Vec<u8>, postcard::Error>;
    /// Puts back a state [`Operator::snapshot`] made, by an operator built from the same rules.
    fn restore(&mut self, state: &[u8]) -> Result<(), postcard::Error>;
    /// Keys dropped so far, per rule and reason (`cap`, `idle` or `memory`).
    fn evicted(&self) -> Vec<(String, &'static str, u64)> {
        Vec::new()
    }
    /// About how many bytes the operator's state takes: an estimate from its counts, cheap
    /// enough to take every second, for the state budget.
    fn state_bytes(&self) -> usize {
        0
    }
    /// Drops some of its keys (about a sixteenth, least recently active first) to get under the
    /// state budget, counted as `memory`; false when it holds nothing to drop.
    fn shrink(&mut self, _now: Millis, _out: &mut Vec<Alert>) -> bool {
        false
    }
}

/// About what an event of `stream` takes in memory: its record and its values.
pub(crate) fn event_bytes(stream: Stream) -> usize {
    std::mem::size_of::<Event>() + stream.fields().len() * std::mem::size_of::<Value>() + 16
}

/// Everything the engine knows, for a checkpoint: the events waiting in the reorder buffer,
/// event time, and each operator's state under the text of the rules it serves, so that a
/// changed rule starts empty and the others carry on.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    pub version: u32,
    buffered: Vec<(Event, u64)>,
    arrivals: u64,
    max_ts: Option<Millis>,
    watermark: Option<Millis>,
    operators: Vec<(String, Vec<u8>)>,
}

/// The snapshot format; a snapshot of another version is not restored.
pub const SNAPSHOT_VERSION: u32 = 1;

impl Snapshot {
    pub fn to_bytes(&self) -> Result<Vec<u8>, postcard::Error> {
        postcard::to_stdvec(self)
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Snapshot, postcard::Error> {
        postcard::from_bytes(bytes)
    }
}

/// Engine settings.
#[derive(Debug, Clone, Default)]
pub struct EngineConfig {
    /// How far behind the newest event an event may arrive and still be processed.
    pub lateness_ms: Millis,
    pub limits: Limits,
    /// When set, event time never runs ahead of this clock: events dated later wait until it
    /// reaches them. A live service sets the wall clock, so that no event, however far ahead it
    /// is dated, can make the events of the present late.
    pub clock: Option<Arc<dyn Clock>>,
}

/// Where the time comes from that event time may not pass.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now_ms(&self) -> Millis;
}

/// The machine's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> Millis {
        crate::event::now_ms()
    }
}

/// Bounds on the state one rule holds.
///
/// State is bounded in time already: every sequence has a `within`, and a windowed group goes
/// once it has been idle for as many windows as it remembers. These limits bound it further.
/// Past `max_keys`, a sequence rule drops its oldest partial match (the one started first), and
/// a windowed rule drops the sixteenth of its groups that have been idle longest (groups with
/// an active alert last). With `idle_ms`, a partial match that has not progressed for that
/// long (event time) is dropped before its `within` ends, and so is a group without events for
/// that long that would otherwise be remembered longer (for a long history or training), unless
/// its alert is active. Every drop is counted ([`Operator::evicted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_keys: usize,
    /// 0: never.
    pub idle_ms: Millis,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_keys: 1_000_000, idle_ms: 0 }
    }
}

/// Counters the engine keeps; shown in replay summaries and exported as metrics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineStats {
    /// Late events, per rule that would have consumed them.
    pub late_by_rule: BTreeMap<String, u64>,
    /// Late events in all (an event late for several rules counts once here).
    pub late: u64,
    /// Events refused for a time outside [`MIN_TS`](crate::event::MIN_TS) to
    /// [`MAX_TS`](crate::event::MAX_TS); inputs refuse them first, with the reason.
    pub out_of_range: u64,
    pub alerts_by_rule: BTreeMap<String, u64>,
}

/// The rules of an operator as text: what a snapshot's state belongs to.
fn signature(plans: &[Arc<RulePlan>]) -> String {
    plans.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("\n")
}

/// An operator with the rules it serves.
type Served = (Vec<Arc<RulePlan>>, Box<dyn Operator>);

/// Where events of one stream go: (operator, source within its rule), for every event of the
/// stream, by the value of its `type` field, and by the value of a field a pattern's filter
/// requires (`where e.machine_id == "m7" and ...`). Rules that select FAIL events never see
/// others, and a thousand rules that each watch one machine cost one lookup, not a thousand
/// evaluations.
#[derive(Default)]
struct StreamRoutes {
    any: Vec<Target>,
    by_type: HashMap<Box<str>, Vec<Target>>,
    /// Field position -> required value -> targets, with the type they also require.
    by_value: Vec<(usize, ValueIndex)>,
}

/// Required value -> the targets that need it, with the event type they also require.
type ValueIndex = HashMap<Box<str>, Vec<(Target, Option<&'static str>)>>;

/// An operator's source that an event may go to, and the filter it must pass first.
#[derive(Clone, Copy)]
struct Target {
    op: usize,
    source: usize,
    filter: Option<usize>,
}

impl StreamRoutes {
    fn add(&mut self, src: &crate::plan::SourcePlan, required: Option<(usize, String)>, target: Target) {
        if let Some((field, value)) = required {
            let slot = match self.by_value.iter().position(|(f, _)| *f == field) {
                Some(i) => i,
                None => {
                    self.by_value.push((field, HashMap::new()));
                    self.by_value.len() - 1
                }
            };
            self.by_value[slot].1.entry(value.into_boxed_str()).or_default().push((target, src.event_type));
            return;
        }
        match src.event_type {
            None => self.any.push(target),
            Some(t) => self.by_type.entry(t.into()).or_default().push(target),
        }
    }
}

/// What the rules need to see of an event before it is built. For a stream whose every route
/// has a filter that only compares numbers, those filters: an event that fails them all reaches
/// no operator, and all [`Engine::push`] does with it is move time on. A decoder that reads the
/// event's numbers can tell so and hand [`Engine::pass`] its time alone, without building the
/// event (for `e.cpu > 0.95`, 95 events in 100). Taken from the engine's rules at one time: a
/// reload needs a new gate.
#[derive(Debug, Clone, Default)]
pub struct Gate {
    /// By `Stream as usize`: the filters when every route of the stream has one of numbers
    /// (none at all for a stream no rule reads).
    streams: [Option<Arc<[eval::NumberTest]>>; 4],
    /// By stream: the field positions those filters read, as bits.
    reads: [u64; 4],
}

impl Gate {
    fn new(routes: &[StreamRoutes; 4], filters: &[SharedFilter]) -> Gate {
        let gate = |r: &StreamRoutes| -> Option<Arc<[eval::NumberTest]>> {
            if !r.by_type.is_empty() || !r.by_value.is_empty() {
                return None;
            }
            let mut used: Vec<usize> = r.any.iter().map(|t| t.filter).collect::<Option<_>>()?;
            used.sort_unstable();
            used.dedup();
            used.into_iter().map(|f| filters[f].numbers.clone()).collect::<Option<Vec<_>>>().map(Arc::from)
        };
        let streams = [0, 1, 2, 3].map(|i| gate(&routes[i]));
        let reads = [0, 1, 2, 3]
            .map(|i| streams[i].as_ref().map_or(0, |tests| tests.iter().fold(0, |bits, t| bits | t.reads())));
        Gate { streams, reads }
    }

    /// Whether events of `stream` can be judged from their numbers alone.
    pub fn judges(&self, stream: Stream) -> bool {
        self.streams[stream as usize].is_some()
    }

    /// The field positions whose numbers the gate reads for `stream`, as bits.
    pub fn reads(&self, stream: Stream) -> u64 {
        self.reads[stream as usize]
    }

    /// Whether no rule takes an event of `stream` whose number at each field position is
    /// `number(position)`; false for a stream the gate does not judge.
    pub fn refuses(&self, stream: Stream, number: impl Fn(usize) -> Option<f64>) -> bool {
        self.streams[stream as usize].as_ref().is_some_and(|tests| !tests.iter().any(|t| t.holds_on(&number)))
    }
}

/// A pattern filter, evaluated once per event however many rules share it.
struct SharedFilter {
    plan: Arc<RulePlan>,
    source: usize,
    /// The filter compiled, when it is only number comparisons.
    numbers: Option<eval::NumberTest>,
}

impl SharedFilter {
    fn new(plan: Arc<RulePlan>, source: usize) -> Self {
        let numbers = plan.sources[source].filter.as_ref().and_then(|f| eval::NumberTest::new(f, source));
        SharedFilter { plan, source, numbers }
    }

    fn holds(&self, event: &Event, regexes: &RegexCache) -> bool {
        if let Some(test) = &self.numbers {
            return test.holds(event);
        }
        let Some(filter) = &self.plan.sources[self.source].filter else { return true };
        with_events(&[], Some((self.source, event)), self.plan.sources.len(), |events| {
            eval::holds(filter, &Env::events(&self.plan.sources, events, regexes))
        })
    }
}

/// The events bound to a rule's `n` patterns as the evaluator takes them (`bound` by pattern,
/// and `extra` at its pattern): on the stack for rules of up to eight patterns, as nearly all
/// are.
pub(crate) fn with_events<R>(
    bound: &[Option<Arc<Event>>],
    extra: Option<(usize, &Event)>,
    n: usize,
    f: impl FnOnce(&[Option<&Event>]) -> R,
) -> R {
    let mut stack: [Option<&Event>; 8] = [None; 8];
    let mut heap: Vec<Option<&Event>>;
    let events: &mut [Option<&Event>] = if n <= stack.len() {
        &mut stack[..n]
    } else {
        heap = vec![None; n];
        &mut heap
    };
    for (slot, e) in events.iter_mut().zip(bound) {
        *slot = e.as_deref();
    }
    if let Some((source, e)) = extra {
        events[source] = Some(e);
    }
    f(events)
}

/// The value a field of `source`'s events must have for the rule to use them: from the
/// pattern's own filter, or carried over from another pattern through a shared entity
/// (`task t1 use machine m as e1 where e1.machine_id == "m7"` makes every pattern that binds `m`
/// need machine "m7" too).
fn required_for(plan: &RulePlan, source: usize) -> Option<(usize, String)> {
    let own = &plan.sources[source];
    if let Some((index, v)) = own.filter.as_ref().and_then(required_value) {
        return Some((index, v.to_string()));
    }
    for (i, other) in plan.sources.iter().enumerate() {
        if i == source {
            continue;
        }
        let Some((index, value)) = other.filter.as_ref().and_then(required_value) else { continue };
        let Some((field, _)) = other.stream.fields().get(index) else { continue };
        let entities = std::iter::once(&other.subject).chain(other.object.as_ref());
        for (kind, var) in entities {
            if kind.key_fields() != [*field] {
                continue;
            }
            let shared = std::iter::once(&own.subject).chain(own.object.as_ref()).any(|(k, v)| k == kind && v == var);
            if shared {
                if let Some(pos) = own.stream.field_index(field) {
                    return Some((pos, value.to_string()));
                }
            }
        }
    }
    None
}

/// A string equality every match of a filter needs (`e.machine_id == "m7"`, possibly inside
/// `and`), as (field position, value).
fn required_value(filter: &crate::plan::TExpr) -> Option<(usize, &str)> {
    use crate::ast::BinOp;
    use crate::plan::TExprKind as K;
    match &filter.kind {
        K::Binary(BinOp::And, a, b) => required_value(a).or_else(|| required_value(b)),
        K::Binary(BinOp::Eq, a, b) => match (&a.kind, &b.kind) {
            (K::EventField { index, .. } | K::EntityField { index, .. }, K::Str(v))
            | (K::Str(v), K::EventField { index, .. } | K::EntityField { index, .. })
                if *index != crate::event::TS_INDEX =>
            {
                Some((*index, v.as_str()))
            }
            _ => None,
        },
        _ => None,
    }
}

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
    /// The rules each operator serves; an operator whose rules are unchanged survives a reload.
    op_plans: Vec<Vec<Arc<RulePlan>>>,
    /// Routing by stream (indexed by `Stream as usize`).
    routes: [StreamRoutes; 4],
    filters: Vec<SharedFilter>,
    /// Per event: 0 not yet evaluated, 1 passes, 2 fails, by filter.
    filter_memo: Vec<u8>,
    config: EngineConfig,
    buffer: ReorderBuffer,
    arrivals: u64,
    max_ts: Option<Millis>,
    /// Every event up to here has been released to the operators.
    watermark: Option<Millis>,
    timers: BinaryHeap<Reverse<(Millis, usize)>>,
    registered: Vec<Option<Millis>>,
    stats: EngineStats,
    regexes: Arc<RegexCache>,
    gate: Gate,
    /// The latest watermark the clock allows, as last read ([`EngineConfig::clock`]).
    ceiling: Millis,
}

impl Engine {
    /// Builds operators for checked plans. Rules whose windowed state is the same share it.
    pub fn new(plans: Vec<RulePlan>, config: EngineConfig) -> Engine {
        let plans: Vec<Arc<RulePlan>> = plans.into_iter().map(Arc::new).collect();
        let mut regexes = RegexCache::default();
        for p in &plans {
            for e in plan_exprs(p) {
                regexes.add_from(e);
            }
        }
        let regexes = Arc::new(regexes);
        let mut operators: Vec<Box<dyn Operator>> = Vec::new();
        let mut op_plans: Vec<Vec<Arc<RulePlan>>> = Vec::new();
        let mut routes: [StreamRoutes; 4] = Default::default();
        let mut filters: Vec<SharedFilter> = Vec::new();
        let mut filter_ids: HashMap<(String, usize, Stream, Option<&'static str>), usize> = HashMap::new();
        let mut filter_of = |plan: &Arc<RulePlan>, source: usize| -> Option<usize> {
            let src = &plan.sources[source];
            let f = src.filter.as_ref()?;
            let key = (f.to_string(), source, src.stream, src.event_type);
            Some(*filter_ids.entry(key).or_insert_with(|| {
                filters.push(SharedFilter::new(plan.clone(), source));
                filters.len() - 1
            }))
        };
        let mut shared: HashMap<String, usize> = HashMap::new();
        let mut windows: Vec<window::WindowOperatorBuilder> = Vec::new();
        for plan in &plans {
            match plan.model {
                Model::SingleEvent | Model::Sequence => {
                    let op_index = operators.len();
                    let op: Box<dyn Operator> = if plan.model == Model::SingleEvent {
                        Box::new(filter::FilterOperator::new(plan.clone(), regexes.clone()))
                    } else {
                        Box::new(sequence::SequenceOperator::new(plan.clone(), regexes.clone(), config.limits))
                    };
                    operators.push(op);
                    op_plans.push(vec![plan.clone()]);
                    for (i, src) in plan.sources.iter().enumerate() {
                        let target = Target { op: op_index, source: i, filter: filter_of(plan, i) };
                        routes[src.stream as usize].add(src, required_for(plan, i), target);
                    }
                }
                Model::TimeSeries | Model::Invariant | Model::Outlier => {
                    let signature = window::signature(plan);
                    match shared.get(&signature) {
                        Some(&w) => windows[w].add(plan.clone()),
                        None => {
                            shared.insert(signature, windows.len());
                            windows.push(window::WindowOperatorBuilder::new(plan.clone(), regexes.clone()));
                        }
                    }
                }
            }
        }
        for builder in windows {
            let op_index = operators.len();
            let src = builder.source().clone();
            let target = Target { op: op_index, source: 0, filter: filter_of(&builder.plans()[0], 0) };
            routes[src.stream as usize].add(&src, required_for(&builder.plans()[0], 0), target);
            op_plans.push(builder.plans().to_vec());
            operators.push(Box::new(builder.build(config.limits)));
        }
        let n = operators.len();
        let gate = Gate::new(&routes, &filters);
        Engine {
            gate,
            plans,
            operators,
            op_plans,
            routes,
            filter_memo: vec![0; filters.len()],
            filters,
            config,
            buffer: ReorderBuffer::default(),
            arrivals: 0,
            max_ts: None,
            watermark: None,
            timers: BinaryHeap::new(),
            registered: vec![None; n],
            stats: EngineStats::default(),
            regexes,
            ceiling: Millis::MIN,
        }
    }

    /// Replaces the rule set while running. Operators whose rules are unchanged keep their state
    /// (windows, partial matches, baselines, active alerts); new or changed rules start empty;
    /// removed rules are dropped. Buffered events, the watermark and the counters carry over.
    /// Returns the names of the rules whose state was kept.
    pub fn reload(&mut self, plans: Vec<RulePlan>) -> Vec<String> {
        let mut fresh = Engine::new(plans, self.config.clone());
        let mut kept = Vec::new();
        let mut old: Vec<Option<Served>> = self.op_plans.drain(..).zip(self.operators.drain(..)).map(Some).collect();
        for (j, rules) in fresh.op_plans.iter().enumerate() {
            let same =
                |(prev, _): &Served| prev.len() == rules.len() && prev.iter().zip(rules).all(|(a, b)| **a == **b);
            if let Some(slot) = old.iter_mut().find(|slot| slot.as_ref().is_some_and(same)) {
                let (_, op) = slot.take().expect("matched a full slot");
                fresh.operators[j] = op;
                kept.extend(rules.iter().map(|p| p.name.clone()));
            }
        }
        fresh.buffer = std::mem::take(&mut self.buffer);
        fresh.arrivals = self.arrivals;
        fresh.max_ts = self.max_ts;
        fresh.watermark = self.watermark;
        fresh.stats = std::mem::take(&mut self.stats);
        fresh.ceiling = self.ceiling;
        for op in 0..fresh.operators.len() {
            schedule(&mut fresh.registered, &mut fresh.timers, fresh.operators[op].as_ref(), op);
        }
        *self = fresh;
        kept
    }

    /// The engine's state, for a checkpoint.
    pub fn snapshot(&self) -> Result<Snapshot, postcard::Error> {
        let mut operators = Vec::with_capacity(self.operators.len());
        for (op, plans) in self.operators.iter().zip(&self.op_plans) {
            operators.push((signature(plans), op.snapshot()?));
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

    /// Continues from a snapshot. Operators whose rules are as they were get their state back;
    /// the others start empty. Returns the rules whose state was restored.
    pub fn restore(&mut self, snapshot: Snapshot) -> Result<Vec<String>, String> {
        if snapshot.version != SNAPSHOT_VERSION {
            return Err(format!("snapshot version {} is not {SNAPSHOT_VERSION}", snapshot.version));
        }
        let mut restored = Vec::new();
        for (i, plans) in self.op_plans.iter().enumerate() {
            let sig = signature(plans);
            if let Some((_, state)) = snapshot.operators.iter().find(|(s, _)| *s == sig) {
                self.operators[i].restore(state).map_err(|e| format!("snapshot of {sig:?}: {e}"))?;
                restored.extend(plans.iter().map(|p| p.name.clone()));
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

    pub fn plans(&self) -> &[Arc<RulePlan>] {
        &self.plans
    }

    /// What its rules need to see of an event before it is built; see [`Gate`].
    pub fn gate(&self) -> Gate {
        self.gate.clone()
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
        self.operators.iter().map(|op| op.state_bytes()).sum::<usize>()
            + self.buffer.len() * (std::mem::size_of::<Pending>() + 160)
    }

    /// Drops keys, from the operators that hold the most, until the state is estimated under
    /// `max_bytes` (a bounded number of rounds). Self-alerts that the drops cause go to `out`.
    /// Returns the estimate after.
    pub fn enforce_budget(&mut self, max_bytes: usize, out: &mut Vec<Alert>) -> usize {
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
        let target = self.max_ts.unwrap_or(Millis::MIN).saturating_sub(self.config.lateness_ms).saturating_sub(1);
        self.release(target, out);
    }

    /// End of input: every buffered event is released and time moves to the newest timestamp.
    /// Windows that have not ended and absences not yet due stay open.
    pub fn flush(&mut self, out: &mut Vec<Alert>) {
        if let Some(max) = self.max_ts {
            self.release(max, out);
        }
    }

    /// Releases the events of the newest timestamp that the lateness allows, which otherwise
    /// wait for a newer event (a service's quiet stream). An event of that timestamp arriving
    /// after this is late.
    pub fn settle(&mut self, out: &mut Vec<Alert>) {
        if let Some(max) = self.max_ts {
            self.advance_to(max, out);
        }
    }

    /// Moves time to `now` without an event (a service's idle clock, with lateness applied).
    pub fn advance_to(&mut self, now: Millis, out: &mut Vec<Alert>) {
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
            self.fire_timers(ts - 1, out);
            if let Some(event) = event {
                self.dispatch(&event, out);
                // For the decoder to read a later line into, unless a rule keeps it.
                crate::event::recycle(event);
            }
        }
        self.fire_timers(target, out);
        self.watermark = Some(target);
    }

    fn dispatch(&mut self, event: &Arc<Event>, out: &mut Vec<Alert>) {
        let before = out.len();
        self.filter_memo.iter_mut().for_each(|m| *m = 0);
        let routes = &self.routes[event.stream as usize];
        let typed = event.event_type().and_then(|t| routes.by_type.get(t));
        let by_value = routes.by_value.iter().flat_map(|(field, index)| match event.fields.get(*field) {
            Some(Value::Str(v)) => index.get(&**v).map_or(&[][..], |t| t.as_slice()),
            _ => &[][..],
        });
        let indexed =
            by_value.filter(|(_, t)| t.is_none_or(|t| event.event_type() == Some(t))).map(|(target, _)| target);
        for target in routes.any.iter().chain(typed.into_iter().flatten()).chain(indexed) {
            if let Some(f) = target.filter {
                if self.filter_memo[f] == 0 {
                    self.filter_memo[f] = if self.filters[f].holds(event, &self.regexes) { 1 } else { 2 };
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

/// Whether an event names every entity its pattern binds: `task t use machine m` needs a
/// machine id, and an event without one is not that pattern (it would otherwise join every
/// other machine-less event as "the same machine").
pub(crate) fn binds_entities(key_positions: &[usize], event: &Event) -> bool {
    key_positions.iter().all(|&i| event.fields.get(i).is_some_and(|v| !v.is_null()))
}

/// Where the key fields of a pattern's entities are in its stream's events, with their names
/// as alerts show them (`m.machine_id`).
pub(crate) fn entity_key_positions(src: &crate::plan::SourcePlan) -> Vec<(String, usize)> {
    std::iter::once(&src.subject)
        .chain(src.object.as_ref())
        .flat_map(|(kind, var)| {
            kind.key_fields().iter().map(move |f| (format!("{var}.{f}"), crate::event::field_position(src.stream, f)))
        })
        .collect()
}

/// Every expression of a plan, for passes such as regex compilation.
fn plan_exprs(p: &RulePlan) -> Vec<&crate::plan::TExpr> {
    use crate::plan::{GroupKey, TemplatePiece};
    let mut out: Vec<&crate::plan::TExpr> = Vec::new();
    out.extend(p.sources.iter().filter_map(|s| s.filter.as_ref()));
    if let Some(seq) = &p.sequence {
        out.extend(seq.conditions.iter());
        out.extend(seq.group_by.iter());
    }
    if let Some(st) = &p.state {
        out.extend(st.fields.iter().filter_map(|f| f.arg.as_ref()));
        out.extend(st.group_by.iter().filter_map(|k| match k {
            GroupKey::Value(e) => Some(e),
            GroupKey::Entity { .. } => None,
        }));
    }
    if let Some(inv) = &p.invariant {
        out.extend(inv.init.iter().chain(&inv.update).map(|(_, e)| e));
    }
    if let Some(c) = &p.cluster {
        out.extend(c.dims.iter().chain(&c.per));
    }
    out.push(&p.alert.condition);
    for (_, pieces) in p.labels.iter().chain(&p.annotations) {
        out.extend(pieces.iter().filter_map(|piece| match piece {
            TemplatePiece::Value(e) => Some(e),
            TemplatePiece::Text(_) => None,
        }));
    }
    out.extend(p.returns.iter().map(|(_, e)| e));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plans(src: &str) -> Vec<RulePlan> {
        let c = crate::compile("t.saql", src.as_bytes());
        assert!(c.is_ok(), "{:?}", c.diagnostics);
        c.plans
    }

    const TWO_RULES: &str = r#"
        rule burst { task t fail as e with e{3,} within 1 h group by t.job_id }
        rule spike { task t use machine m as e #time(5 min) state ss { n := count() } group by m alert ss.n > 2 }
    "#;

    fn fail(min: i64, job: &str) -> Event {
        let mut e = Event::new(crate::schema::Stream::TaskEvent, min * 60_000);
        e.set("type", Value::str("FAIL")).set("job_id", Value::str(job)).set("task_index", Value::Num(0.0));
        e
    }

    #[test]
    fn a_key_read_in_place_finds_the_key_built_from_the_same_values() {
        use std::hash::BuildHasher;
        let hasher = foldhash::fast::RandomState::default();
        let mut e = Event::new(crate::schema::Stream::TaskUsage, 42);
        e.set("machine_id", Value::str("m7")).set("cpu", Value::Num(f64::NAN)).set("task_index", Value::Num(3.0));
        let missing = crate::event::TS_INDEX - 1;
        for positions in [vec![2], vec![2, 1], vec![3, 0], vec![crate::event::TS_INDEX, 2], vec![missing], vec![]] {
            let built = Key(positions.iter().map(|&p| e.value(p)).collect());
            let in_place = FieldsKey { event: &e, positions: &positions };
            assert_eq!(hasher.hash_one(&in_place), hasher.hash_one(&built), "{positions:?}");
            assert!(hashbrown::Equivalent::equivalent(&in_place, &built), "{positions:?}");
            let mut other = built.clone();
            other.0.push(Value::Null);
            assert!(!hashbrown::Equivalent::equivalent(&in_place, &other), "{positions:?}: a longer key");
        }
        let mut map: KeyMap<u8> = KeyMap::default();
        map.insert(Key(vec![Value::str("m7")]), 1);
        assert_eq!(map.get(&FieldsKey { event: &e, positions: &[2] }), Some(&1));
        assert_eq!(map.get(&FieldsKey { event: &e, positions: &[0] }), None);
    }

    #[test]
    fn compiled_number_filters_hold_exactly_when_the_evaluator_says_so() {
        let rules = r#"
            rule a { task t use machine m as e where e.cpu > 0.5 }
            rule b { task t use machine m as e where e.cpu >= 0.5 and 0.25 > e.mem }
            rule c { task t use machine m as e where e.mem <= 0.5 and e.cpu < 1 and e.cpu >= 0 }
            rule d { task t use machine m as e where e.cpu > 0.5 or e.mem > 0.5 }
            rule e { task t use machine m as e where e.cpu != 0.5 }
        "#;
        let regexes = RegexCache::default();
        let values =
            [Value::Null, Value::Num(f64::NAN), Value::Num(0.0), Value::Num(0.25), Value::Num(0.5), Value::Num(1.0)];
        let mut compiled = 0;
        for plan in plans(rules) {
            let filter = plan.sources[0].filter.clone().expect("every rule here has a filter");
            let Some(test) = eval::NumberTest::new(&filter, 0) else {
                assert!(["d", "e"].contains(&plan.name.as_str()), "{} should compile", plan.name);
                continue;
            };
            compiled += 1;
            for cpu in &values {
                for mem in &values {
                    let mut e = Event::new(crate::schema::Stream::TaskUsage, 0);
                    e.set("cpu", cpu.clone()).set("mem", mem.clone());
                    let events = [Some(&e)];
                    let expected = eval::holds(&filter, &Env::events(&plan.sources, &events, &regexes));
                    assert_eq!(test.holds(&e), expected, "{}: cpu {cpu:?}, mem {mem:?}", plan.name);
                }
            }
        }
        assert_eq!(compiled, 3);
    }

    #[test]
    fn compiled_window_conditions_hold_exactly_when_the_evaluator_says_so() {
        let state = "task t use machine m as e #time(10 s) state[2] ss { a := avg(e.cpu), n := count() } group by m";
        let rules = format!(
            "rule p {{ {state} alert ss.a > 0.5 }}
             rule q {{ {state} alert ss[0].a >= 0.5 and 0.25 > ss.n }}
             rule r {{ {state} alert ss.n <= 0.5 and ss.a < 1 and ss.a >= 0 }}
             rule s {{ {state} alert ss[1].a > 0.5 }}
             rule t {{ {state} alert ss.a > ss.n }}
             rule u {{ {state} alert ss.a > 0.5 or ss.n > 0.5 }}"
        );
        let regexes = RegexCache::default();
        let values =
            [Value::Null, Value::Num(f64::NAN), Value::Num(0.0), Value::Num(0.25), Value::Num(0.5), Value::Num(1.0)];
        let mut compiled = Vec::new();
        for plan in plans(&rules) {
            let condition = &plan.alert.condition;
            let Some(test) = eval::NumberTest::of_window(condition) else { continue };
            compiled.push(plan.name.clone());
            for a in &values {
                for n in &values {
                    let newest: Arc<[Value]> = vec![a.clone(), n.clone()].into();
                    let older: Arc<[Value]> = vec![Value::Num(0.9), Value::Num(0.9)].into();
                    for history in [vec![newest.clone()], vec![newest, older], vec![]] {
                        let events = [None];
                        let env = Env {
                            sources: &plan.sources,
                            events: &events,
                            state: Some(&history),
                            baselines: None,
                            cluster: None,
                            regexes: &regexes,
                        };
                        let expected = eval::holds(condition, &env);
                        assert_eq!(test.holds_on_window(&history), expected, "{}: {history:?}", plan.name);
                    }
                }
            }
        }
        assert_eq!(compiled, ["p", "q", "r"], "only comparisons of the newest window with literals compile");
    }

    #[test]
    fn many_threshold_rules_over_one_state_alert_as_each_would_alone() {
        // The rules share one window operator and are judged by compiled tests; each run alone
        // (no sharing) must give the same alerts, resolutions included.
        let rule = |i: usize, threshold: f64| {
            format!(
                "rule w{i} {{ task t use machine m as e #time(10 s)
                   state ss {{ c := avg(e.cpu), n := count() }} group by m
                   alert ss.c > {threshold} and ss.n >= 2 }}\n"
            )
        };
        let thresholds = [0.3, 0.5, 0.5, 0.7, 0.9];
        let all: String = thresholds.iter().enumerate().map(|(i, &t)| rule(i, t)).collect();
        let events: Vec<Event> = (0..600)
            .map(|i| {
                let mut e = Event::new(crate::schema::Stream::TaskUsage, i * 250);
                e.set("job_id", Value::str("j")).set("task_index", Value::Num(0.0));
                let cpu = ((i * 37) % 100) as f64 / 100.0;
                e.set("machine_id", Value::str(&format!("m{}", i % 7))).set("cpu", Value::Num(cpu));
                e
            })
            .collect();
        let run = |rules: &str| {
            let mut engine = Engine::new(plans(rules), EngineConfig::default());
            let mut out = Vec::new();
            for e in &events {
                engine.push(e.clone(), &mut out);
            }
            engine.advance_to(200_000, &mut out);
            out.into_iter().map(|a| (a.rule.to_string(), a.id, a.status, a.time)).collect::<Vec<_>>()
        };
        let shared = run(&all);
        let mut alone: Vec<_> = thresholds.iter().enumerate().flat_map(|(i, &t)| run(&rule(i, t))).collect();
        let mut together = shared.clone();
        together.sort_by(|a, b| (&a.0, a.3, &a.1).cmp(&(&b.0, b.3, &b.1)));
        alone.sort_by(|a, b| (&a.0, a.3, &a.1).cmp(&(&b.0, b.3, &b.1)));
        assert_eq!(together, alone);
        let resolved = shared.iter().filter(|a| a.2 == crate::alert::Status::Resolved).count();
        assert!(resolved > 0 && shared.len() > resolved, "the run fires and resolves: {shared:?}");
    }

    #[test]
    fn window_arguments_read_in_place_or_evaluated_agree_and_alerts_come_in_key_order() {
        // `sum(e.cpu)` is read in place, `sum(e.cpu * 100)` through the evaluator, `count()`
        // has no argument; each window's alerts come out by machine whatever the map's order.
        let rule = r#"
            rule w {
              task t use machine m as e #time(10 s)
              state ss { a := sum(e.cpu), b := sum(e.cpu * 100), n := count() } group by m
              alert ss.n > 0 and ss.b == ss.a * 100
              return ss.a, ss.b, ss.n
            }
        "#;
        let mut engine = Engine::new(plans(rule), EngineConfig::default());
        let mut out = Vec::new();
        for i in 0..200 {
            let mut e = Event::new(crate::schema::Stream::TaskUsage, i * 100);
            e.set("job_id", Value::str("j")).set("task_index", Value::Num(0.0));
            e.set("machine_id", Value::str(&format!("m{}", (i * 7) % 40))).set("cpu", Value::Num(0.5));
            engine.push(e, &mut out);
        }
        engine.advance_to(100_000, &mut out);
        let fired: Vec<&Alert> = out.iter().filter(|a| a.status == crate::alert::Status::Firing).collect();
        assert_eq!(fired.len(), 40, "every machine fires once, in the first window it has events");
        for a in &fired {
            let n = a.values.get("ss.n").and_then(|v| v.as_f64()).expect("n is returned");
            assert_eq!(a.values.get("ss.a").and_then(|v| v.as_f64()), Some(0.5 * n));
            assert_eq!(a.values.get("ss.b").and_then(|v| v.as_f64()), Some(50.0 * n));
        }
        for pair in fired.windows(2) {
            let machine = |a: &Alert| a.key.get("m.machine_id").and_then(|v| v.as_str().map(str::to_string));
            if pair[0].time == pair[1].time {
                assert!(machine(pair[0]) < machine(pair[1]), "{:?} before {:?}", machine(pair[0]), machine(pair[1]));
            }
        }
    }

    #[test]
    fn settling_releases_the_newest_millisecond_within_the_lateness() {
        let rule = "rule hot { task t use machine m as e where e.cpu > 0.9 }";
        let usage = |ts: Millis, cpu: f64| {
            let mut e = Event::new(crate::schema::Stream::TaskUsage, ts);
            e.set("job_id", Value::str("j")).set("task_index", Value::Num(0.0)).set("machine_id", Value::str("m"));
            e.set("cpu", Value::Num(cpu));
            e
        };
        let mut out = Vec::new();
        let mut engine = Engine::new(plans(rule), EngineConfig::default());
        engine.push(usage(1_000, 0.95), &mut out);
        assert!(out.is_empty(), "the newest millisecond waits for a newer event");
        engine.settle(&mut out);
        let firing = |out: &[Alert]| out.iter().filter(|a| a.status == crate::alert::Status::Firing).count();
        assert_eq!(firing(&out), 1, "settled, its alert comes out");
        assert!(!engine.push(usage(1_000, 0.5), &mut out), "the settled millisecond is closed");
        // With a lateness, settling releases only what the lateness allows.
        let mut late = Engine::new(plans(rule), EngineConfig { lateness_ms: 5_000, ..EngineConfig::default() });
        let mut out = Vec::new();
        late.push(usage(1_000, 0.95), &mut out);
        late.push(usage(6_000, 0.5), &mut out);
        assert!(out.is_empty(), "5 s back, the first event still waits");
        late.settle(&mut out);
        assert_eq!(firing(&out), 1, "settled, the event 5 s back is released");
        assert!(late.push(usage(3_000, 0.5), &mut out), "an event within the lateness is still taken");
    }

    #[test]
    fn reload_keeps_the_state_of_unchanged_rules() {
        let mut engine = Engine::new(plans(TWO_RULES), EngineConfig::default());
        let mut out = Vec::new();
        engine.push(fail(0, "j1"), &mut out);
        engine.push(fail(1, "j1"), &mut out);
        // `spike` changes, `burst` does not: its two counted failures survive the reload.
        let changed = TWO_RULES.replace("ss.n > 2", "ss.n > 3");
        let kept = engine.reload(plans(&changed));
        assert_eq!(kept, vec!["burst".to_string()]);
        engine.push(fail(2, "j1"), &mut out);
        engine.flush(&mut out);
        let fired = out.iter().filter(|a| &*a.rule == "burst" && a.status == crate::alert::Status::Firing).count();
        assert_eq!(fired, 1, "the third failure completes the burst");
    }

    #[test]
    fn a_changed_rule_starts_over() {
        let mut engine = Engine::new(plans(TWO_RULES), EngineConfig::default());
        let mut out = Vec::new();
        engine.push(fail(0, "j1"), &mut out);
        engine.push(fail(1, "j1"), &mut out);
        let changed = TWO_RULES.replace("within 1 h", "within 2 h");
        assert_eq!(engine.reload(plans(&changed)), vec!["spike".to_string()]);
        engine.push(fail(2, "j1"), &mut out);
        engine.flush(&mut out);
        assert!(out.is_empty(), "the changed rule lost its count: {out:?}");
    }

    const NO_WITHIN: &str = r#"
        rule evict_fail { task t evict as e1 task t fail as e2 with e1 -> e2 within 30 d }
    "#;

    fn task(kind: &str, min: i64, job: &str) -> Event {
        let mut e = fail(min, job);
        e.set("type", Value::str(kind));
        e
    }

    fn limited(src: &str, max_keys: usize, idle_ms: Millis) -> Engine {
        Engine::new(
            plans(src),
            EngineConfig { lateness_ms: 0, limits: Limits { max_keys, idle_ms }, ..EngineConfig::default() },
        )
    }

    #[test]
    fn past_the_cap_the_oldest_partial_match_goes_and_is_counted() {
        let mut engine = limited(NO_WITHIN, 3, 0);
        let mut out = Vec::new();
        for (i, job) in ["a", "b", "c", "d", "e"].iter().enumerate() {
            engine.push(task("EVICT", i as i64, job), &mut out);
        }
        engine.flush(&mut out);
        assert_eq!(engine.live_keys()["evict_fail"], 3);
        assert_eq!(engine.evicted()[&("evict_fail".to_string(), "cap")], 2);
        // `a` and `b` were dropped; `e` is still waiting for its failure.
        engine.push(task("FAIL", 10, "a"), &mut out);
        engine.push(task("FAIL", 11, "e"), &mut out);
        engine.flush(&mut out);
        let jobs: Vec<String> = out
            .iter()
            .filter(|a| a.status == crate::alert::Status::Firing)
            .map(|a| a.key.iter().map(|(_, v)| v.to_string()).collect())
            .collect();
        assert_eq!(jobs.len(), 1, "{jobs:?}");
        assert!(jobs[0].contains("\"e\""), "{jobs:?}");
    }

    #[test]
    fn a_partial_match_without_progress_expires_after_the_idle_time() {
        let mut engine = limited(NO_WITHIN, 1_000, 60 * 60_000);
        let mut out = Vec::new();
        engine.push(task("EVICT", 0, "old"), &mut out);
        engine.push(task("EVICT", 30, "young"), &mut out);
        // Two hours later: `old` has waited over an hour, `young` too by then.
        engine.push(task("FAIL", 61, "young"), &mut out);
        engine.push(task("FAIL", 120, "old"), &mut out);
        engine.flush(&mut out);
        let fired: Vec<&Alert> = out.iter().filter(|a| a.status == crate::alert::Status::Firing).collect();
        assert_eq!(fired.len(), 1, "only `young` completes in time: {fired:#?}");
        // `old` went waiting; `young`'s prefix, kept for more failures, went an hour after its
        // eviction, long before its 30 days.
        assert_eq!(engine.evicted()[&("evict_fail".to_string(), "idle")], 2);
        assert_eq!(engine.live_keys()["evict_fail"], 0);
    }

    #[test]
    fn a_windowed_rule_past_its_cap_drops_its_idlest_groups() {
        let src =
            "rule per_job { task t fail as e #time(1 min) state ss { n := count() } group by t.job_id alert ss.n > 5 }";
        let mut engine = limited(src, 32, 0);
        let mut out = Vec::new();
        for i in 0..100 {
            engine.push(task("FAIL", i / 50, &format!("j{i}")), &mut out);
        }
        engine.flush(&mut out);
        let live = engine.live_keys()["per_job"];
        assert!(live <= 32, "{live} groups live");
        let evicted = engine.evicted()[&("per_job".to_string(), "cap")];
        assert!(evicted >= 68, "{evicted} evicted");
    }
}
