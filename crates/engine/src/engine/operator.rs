//! What every operator is: a set of lifecycle hooks the engine drives, and the helpers operators
//! share to read events.

use crate::alert::Alert;
use crate::event::{Event, Millis, Value};
use std::sync::Arc;
use vigil_lang::schema::Stream;

/// A compiled rule (or group of rules sharing work) driven by events and the watermark.
pub trait Operator: Send {
    /// An event for source `source` of the operator's rule, in timestamp order.
    fn on_event(&mut self, source: usize, event: &Arc<Event>, out: &mut Vec<Alert>);
    /// Where in `source`'s events are the fields whose values make the key the operator keeps
    /// its state under, so that several engines (`--workers`) can split its state by key group;
    /// `None` when the state cannot be split by an event's fields (a fleet-wide comparison, one
    /// global group, a computed key): one engine then owns all of it.
    fn key_fields(&self, _source: usize) -> Option<Vec<usize>> {
        None
    }
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
    /// A stage-one operator's closed windows since the last call ([`super::stage_two`]).
    fn take_summaries(&mut self) -> Vec<super::summary::Summary> {
        Vec::new()
    }
    /// Notes the judgements of the rule `trace` names, if this operator runs it.
    fn trace(&mut self, _trace: &super::trace::Trace) {}
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

/// Whether an event names every entity its pattern binds: `task t use machine m` needs a
/// machine id, and an event without one is not that pattern (it would otherwise join every
/// other machine-less event as "the same machine"). A label set is the one key field that may
/// be absent: a series without labels is still a series.
pub(crate) fn binds_entities(key_positions: &[usize], event: &Event) -> bool {
    let optional = |i: usize| event.stream.fields().get(i).is_some_and(|(_, ty)| *ty == vigil_lang::schema::Type::Map);
    key_positions.iter().all(|&i| event.fields.get(i).is_some_and(|v| !v.is_null()) || optional(i))
}

/// Where the key fields of a pattern's entities are in its stream's events, with their names
/// as alerts show them (`m.machine_id`).
pub(crate) fn entity_key_positions(src: &vigil_lang::plan::SourcePlan) -> Vec<(String, usize)> {
    std::iter::once(&src.subject)
        .chain(src.object.as_ref())
        .flat_map(|(kind, var)| {
            kind.key_fields().iter().zip(src.key_positions(var)).map(move |(f, p)| (format!("{var}.{f}"), p))
        })
        .collect()
}
