//! Routing: which operators an event goes to, the filters it must pass first (each evaluated
//! once however many rules share it), and the gate that refuses events no rule takes before
//! they are built.

use super::eval::{self, Env, RegexCache};
use super::operator::with_events;
use crate::event::Event;
use std::collections::HashMap;
use std::sync::Arc;
use vigil_lang::plan::RulePlan;
use vigil_lang::schema::Stream;

/// Where events of one stream go: (operator, source within its rule), for every event of the
/// stream, by the value of its `type` field, and by the value of a field a pattern's filter
/// requires (`where e.machine_id == "m7" and ...`). Rules that select FAIL events never see
/// others, and a thousand rules that each watch one machine cost one lookup, not a thousand
/// evaluations.
#[derive(Default)]
pub struct StreamRoutes {
    pub(super) any: Vec<Target>,
    pub(super) by_type: HashMap<Box<str>, Vec<Target>>,
    /// Field position -> required value -> targets, with the type they also require.
    pub(super) by_value: Vec<(usize, ValueIndex)>,
}

/// Required value -> the targets that need it, with the event type they also require.
pub(super) type ValueIndex = HashMap<Box<str>, Vec<(Target, Option<&'static str>)>>;

/// An operator's source that an event may go to, and the filter it must pass first.
#[derive(Clone, Copy)]
pub struct Target {
    pub op: usize,
    pub source: usize,
    pub filter: Option<usize>,
}

impl StreamRoutes {
    /// The targets of an event of this stream: by type, by a required value, and those that take
    /// every event.
    pub fn targets<'a>(&'a self, event: &'a Event) -> impl Iterator<Item = &'a Target> + 'a {
        // The event's type is looked up only when some route is by type.
        let typed = (!self.by_type.is_empty()).then(|| event.event_type().and_then(|t| self.by_type.get(t))).flatten();
        let by_value = self.by_value.iter().flat_map(move |(field, index)| match event.fields.get(*field) {
            Some(crate::event::Value::Str(v)) => index.get(&**v).map_or(&[][..], |t| t.as_slice()),
            _ => &[][..],
        });
        let indexed =
            by_value.filter(move |(_, t)| t.is_none_or(|t| event.event_type() == Some(t))).map(|(target, _)| target);
        self.any.iter().chain(typed.into_iter().flatten()).chain(indexed)
    }

    pub fn is_empty(&self) -> bool {
        self.any.is_empty() && self.by_type.is_empty() && self.by_value.is_empty()
    }

    pub fn add(&mut self, src: &vigil_lang::plan::SourcePlan, required: Option<(usize, String)>, target: Target) {
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
/// no operator, and all [`Engine::push`](super::Engine::push) does with it is move time on. A decoder that reads the
/// event's numbers can tell so and hand [`Engine::pass`](super::Engine::pass) its time alone, without building the
/// event (for `e.cpu > 0.95`, 95 events in 100). Taken from the engine's rules at one time: a
/// reload needs a new gate.
#[derive(Debug, Clone, Default)]
pub struct Gate {
    /// By [`Stream::index`]: the filters when every route of the stream has one of numbers
    /// (none at all for a stream no rule reads).
    streams: Vec<Option<Arc<[eval::NumberTest]>>>,
    /// By stream: the field positions those filters read, as bits.
    reads: Vec<u64>,
}

impl Gate {
    pub fn new(routes: &[StreamRoutes], filters: &[SharedFilter]) -> Gate {
        let gate = |r: &StreamRoutes| -> Option<Arc<[eval::NumberTest]>> {
            if !r.by_type.is_empty() || !r.by_value.is_empty() {
                return None;
            }
            let mut used: Vec<usize> = r.any.iter().map(|t| t.filter).collect::<Option<_>>()?;
            used.sort_unstable();
            used.dedup();
            used.into_iter().map(|f| filters[f].numbers.clone()).collect::<Option<Vec<_>>>().map(Arc::from)
        };
        let streams: Vec<_> = routes.iter().map(gate).collect();
        let reads = streams
            .iter()
            .map(|tests| tests.as_ref().map_or(0, |tests| tests.iter().fold(0, |bits, t| bits | t.reads())))
            .collect();
        Gate { streams, reads }
    }

    /// How many number filters judge `stream`, when it is judged at all.
    pub fn tests(&self, stream: Stream) -> Option<usize> {
        self.streams.get(stream.index())?.as_ref().map(|t| t.len())
    }
}

impl crate::event::EventGate for Gate {
    fn judges(&self, stream: Stream) -> bool {
        self.streams.get(stream.index()).is_some_and(Option::is_some)
    }

    fn reads(&self, stream: Stream) -> u64 {
        self.reads.get(stream.index()).copied().unwrap_or(0)
    }

    fn refuses(&self, stream: Stream, number: impl Fn(usize) -> Option<f64>) -> bool {
        self.streams
            .get(stream.index())
            .and_then(Option::as_ref)
            .is_some_and(|tests| !tests.iter().any(|t| t.holds_on(&number)))
    }
}

/// A pattern filter, evaluated once per event however many rules share it.
pub struct SharedFilter {
    plan: Arc<RulePlan>,
    source: usize,
    /// The filter compiled, when it is only number comparisons.
    numbers: Option<eval::NumberTest>,
}

impl SharedFilter {
    pub fn new(plan: Arc<RulePlan>, source: usize) -> Self {
        let numbers = plan.sources[source].filter.as_ref().and_then(|f| eval::NumberTest::new(f, source));
        SharedFilter { plan, source, numbers }
    }

    /// The filter as `vigil explain --physical` prints it.
    pub fn describe(&self) -> String {
        let src = &self.plan.sources[self.source];
        let text = src.filter.as_ref().map(|f| f.to_string()).unwrap_or_default();
        let compiled = if self.numbers.is_some() { " (compiled: numbers only)" } else { "" };
        format!("{} {text}{compiled}", src.stream.name())
    }

    pub fn holds(&self, event: &Event, regexes: &RegexCache) -> bool {
        if let Some(test) = &self.numbers {
            return test.holds(event);
        }
        let Some(filter) = &self.plan.sources[self.source].filter else { return true };
        with_events(&[], Some((self.source, event)), self.plan.sources.len(), |events| {
            eval::holds(filter, &Env::events(&self.plan.sources, events, regexes))
        })
    }
}

/// The value a field of `source`'s events must have for the rule to use them: from the
/// pattern's own filter, or carried over from another pattern through a shared entity
/// (`task t1 use machine m as e1 where e1.machine_id == "m7"` makes every pattern that binds `m`
/// need machine "m7" too).
pub fn required_for(plan: &RulePlan, source: usize) -> Option<(usize, String)> {
    let own = &plan.sources[source];
    if let Some((index, v)) = own.filter.as_ref().and_then(required_value) {
        return Some((index, v.to_string()));
    }
    for (i, other) in plan.sources.iter().enumerate() {
        if i == source {
            continue;
        }
        let Some((index, value)) = other.filter.as_ref().and_then(required_value) else { continue };
        let entities = std::iter::once(&other.subject).chain(other.object.as_ref());
        for (kind, var) in entities {
            if other.key_positions(var) != [index] {
                continue;
            }
            let shared = std::iter::once(&own.subject).chain(own.object.as_ref()).any(|(k, v)| k == kind && v == var);
            if shared {
                if let [pos] = own.key_positions(var)[..] {
                    if pos < own.stream.fields().len() {
                        return Some((pos, value.to_string()));
                    }
                }
            }
        }
    }
    None
}

/// A string equality every match of a filter needs (`e.machine_id == "m7"`, possibly inside
/// `and`), as (field position, value).
fn required_value(filter: &vigil_lang::plan::TExpr) -> Option<(usize, &str)> {
    use vigil_lang::ast::BinOp;
    use vigil_lang::plan::TExprKind as K;
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
