//! What a runtime asks of an engine beyond events in and alerts out
//! ([`crate::runtime`]): its router keeps time and tells where events go without keeping
//! them, and its partitions take the events routed to them and move through the router's
//! points of time.

use super::reorder::Pending;
use super::{keys, KeyOf};
use super::{Engine, Millis};
use crate::alert::Alert;
use crate::event::Event;
use std::cmp::Reverse;
use std::sync::Arc;

impl Engine {
    /// Takes the time of an event that other engines keep (a runtime's router): [`Engine::push`]
    /// without keeping the event. Returns false when it was late, counted per rule as a push
    /// would count it.
    pub fn observe(&mut self, event: &Event, out: &mut Vec<Alert>) -> bool {
        if !self.in_range(event.ts) {
            return false;
        }
        if self.watermark.is_some_and(|w| event.ts <= w) {
            self.count_late(event);
            return false;
        }
        self.arrive(event.ts, None, out);
        true
    }

    /// Buffers an event whose time a router has judged ([`Engine::observe`]): it is not late,
    /// and it is released when the router's time passes it ([`Engine::release_to`]).
    pub fn accept(&mut self, event: Arc<Event>) {
        self.max_ts = Some(self.max_ts.map_or(event.ts, |m| m.max(event.ts)));
        self.arrivals += 1;
        self.buffer.push(Pending { ts: event.ts, event: Some(event), arrival: self.arrivals });
    }

    /// Sets how far time has got, as a checkpoint of a router kept it: the newest event's
    /// time and the watermark.
    pub fn restore_time(&mut self, max_ts: Option<Millis>, watermark: Option<Millis>) {
        self.max_ts = max_ts;
        self.watermark = watermark;
    }

    /// The newest event's time and the watermark, as a snapshot keeps them.
    pub fn time(&self) -> (Option<Millis>, Option<Millis>) {
        (self.max_ts, self.watermark)
    }

    /// Notes a time timers are fired at, when marks are kept.
    pub(super) fn mark(&mut self, at: Millis) {
        if let Some(marks) = &mut self.marks {
            if marks.last().is_none_or(|last| *last < at) {
                marks.push(at);
            }
        }
    }

    /// Keeps the times at which this engine fires timers from now on, for
    /// [`Engine::take_marks`]: a router's, whose partitions fire theirs at the same points.
    pub fn record_marks(&mut self) {
        self.marks.get_or_insert_with(Vec::new);
    }

    /// The times timers were fired at since the last call, in order (rising).
    pub fn take_marks(&mut self) -> Vec<Millis> {
        self.marks.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Moves time through `marks` (a router's [`Engine::take_marks`]) as the router's did:
    /// the events this engine holds and its timers meet the same points of time, so an alert
    /// is detected at the time one engine with every event would detect it. Marks at which
    /// nothing is due are passed over.
    pub fn release_marks(&mut self, marks: &[Millis], out: &mut Vec<Alert>) {
        let Some(&last) = marks.last() else { return };
        let mut from = 0;
        loop {
            // The first mark at which an event of this engine or one of its timers is due.
            let event = self.buffer.next_ts();
            let timer = self.timers.peek().map(|Reverse((due, _))| *due);
            let Some(due) = [event, timer].into_iter().flatten().min() else { break };
            from += marks[from..].partition_point(|m| *m < due);
            let Some(&at) = marks.get(from) else { break };
            if at == last {
                break;
            }
            self.release_to(at, out);
            from += 1;
        }
        self.release_to(last, out);
    }

    /// The key groups whose state `event` reaches: for each operator whose filter it passes,
    /// the key group of its key there, or the one that holds the operator whole. An instance
    /// that shares the key groups with others sends the event to the owners of these (and
    /// nowhere when there are none); the result is sorted, without repeats.
    pub fn key_groups(&self, event: &Event, into: &mut Vec<u32>) {
        into.clear();
        let Some(routes) = self.layout.routes.get(event.stream.index()) else { return };
        for target in routes.targets(event) {
            if let Some(f) = target.filter {
                if !self.layout.filters[f].holds(event, &self.regexes) {
                    continue;
                }
            }
            into.push(match &self.key_of[target.op] {
                KeyOf::Fields(fields) => keys::key_group(event, &fields[target.source]),
                KeyOf::Whole(group) => *group,
            });
        }
        into.sort_unstable();
        into.dedup();
    }

    /// The keyed partitions, of `partitions`, whose key groups `event` reaches (as
    /// [`Engine::key_groups`] tells them): a target's filter is evaluated only when its key
    /// would add a partition, so an event read by several rules under one key costs one
    /// filter at most. Not sorted, without repeats.
    pub fn partitions_of(&self, event: &Event, partitions: usize, into: &mut Vec<usize>) {
        into.clear();
        let Some(routes) = self.layout.routes.get(event.stream.index()) else { return };
        for filtered in [false, true] {
            for target in routes.targets(event).filter(|t| t.filter.is_some() == filtered) {
                let group = match &self.key_of[target.op] {
                    KeyOf::Fields(fields) => keys::key_group(event, &fields[target.source]),
                    KeyOf::Whole(group) => *group,
                };
                let p = group as usize % partitions;
                if into.contains(&p) {
                    continue;
                }
                if let Some(f) = target.filter {
                    if !self.layout.filters[f].holds(event, &self.regexes) {
                        continue;
                    }
                }
                into.push(p);
            }
        }
    }
}
