//! The reorder buffer: events wait here until the watermark passes them, then leave in time
//! order (ties broken by content, then by arrival, so any arrival order gives one result).
//!
//! Most input arrives in time order or nearly so. An event no older than every waiting event
//! joins the back of a queue in constant time; only an older one goes to a heap. The queue is in
//! time order only: the events of one timestamp (a collector's request carries a thousand samples
//! of one time, in no order of content) stay in arrival order until their timestamp reaches the
//! front, and are sorted then, once, together. The next event out is the smaller of the two
//! fronts.

use crate::event::{Event, Millis};
use std::cmp::{Ordering, Reverse};
use std::collections::binary_heap::PeekMut;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

/// An event with its arrival number, or only the time of an event no rule takes (see
/// [`Engine::pass`](super::Engine::pass)): such an event still moves time on when it leaves.
pub struct Pending {
    pub ts: Millis,
    pub event: Option<Arc<Event>>,
    pub arrival: u64,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    /// Timestamp first, then the event's content, so simultaneous events are processed in the
    /// same order whatever order they arrived in; the arrival number breaks exact duplicates.
    /// A time alone goes before the events of its timestamp: all it does on leaving is fire the
    /// timers due before that timestamp, as the first of those events does anyway.
    fn cmp(&self, other: &Self) -> Ordering {
        let content = match (&self.event, &other.event) {
            (Some(a), Some(b)) => a.tie_order(b),
            (a, b) => self.ts.cmp(&other.ts).then(a.is_some().cmp(&b.is_some())),
        };
        content.then(self.arrival.cmp(&other.arrival))
    }
}

#[derive(Default)]
pub struct ReorderBuffer {
    /// Events by timestamp; of the front timestamp's, the first `sorted` are in full order.
    in_order: VecDeque<Pending>,
    sorted: usize,
    /// The rest.
    late: BinaryHeap<Reverse<Pending>>,
}

impl ReorderBuffer {
    pub fn push(&mut self, pending: Pending) {
        if self.in_order.back().is_none_or(|last| last.ts <= pending.ts) {
            if self.in_order.front().is_some_and(|first| first.ts == pending.ts) {
                // It joins the front timestamp's events, which are sorted again when next read.
                self.sorted = 0;
            }
            self.in_order.push_back(pending);
        } else {
            self.late.push(Reverse(pending));
        }
    }

    /// Puts the queue's front timestamp's events in full order, unless they are.
    fn sort_front(&mut self) {
        let Some(ts) = self.in_order.front().map(|p| p.ts).filter(|_| self.sorted == 0) else { return };
        let (a, b) = self.in_order.as_mut_slices();
        let in_a = a.partition_point(|p| p.ts <= ts);
        if in_a < a.len() || b.first().is_none_or(|p| p.ts != ts) {
            a[..in_a].sort_unstable();
            self.sorted = in_a;
        } else {
            // The run goes on past the ring buffer's wrap (rare): out, sorted, and back.
            let n = in_a + b.partition_point(|p| p.ts <= ts);
            let mut run: Vec<Pending> = self.in_order.drain(..n).collect();
            run.sort_unstable();
            for p in run.into_iter().rev() {
                self.in_order.push_front(p);
            }
            self.sorted = n;
        }
    }

    /// Whether the next event out comes from the queue rather than the heap.
    fn queue_first(&mut self) -> Option<bool> {
        self.sort_front();
        match (self.in_order.front(), self.late.peek()) {
            (Some(a), Some(Reverse(b))) => Some(a <= b),
            (Some(_), None) => Some(true),
            (None, Some(_)) => Some(false),
            (None, None) => None,
        }
    }

    /// The next event out, if its timestamp is at most `until`.
    pub fn pop_until(&mut self, until: Millis) -> Option<Pending> {
        match self.queue_first()? {
            true => self.front_until(until),
            false => self.late.peek_mut().filter(|p| p.0.ts <= until).map(|p| PeekMut::pop(p).0),
        }
    }

    /// The front of the queue, if its timestamp is at most `until` (`VecDeque::pop_front_if`,
    /// which is newer than the Rust version the crate supports).
    fn front_until(&mut self, until: Millis) -> Option<Pending> {
        match self.in_order.front() {
            Some(p) if p.ts <= until => {
                self.sorted -= 1;
                self.in_order.pop_front()
            }
            _ => None,
        }
    }

    /// The timestamp of the next event out.
    pub fn next_ts(&mut self) -> Option<Millis> {
        match self.queue_first()? {
            true => self.in_order.front().map(|p| p.ts),
            false => self.late.peek().map(|p| p.0.ts),
        }
    }

    /// How many events wait.
    pub fn len(&self) -> usize {
        self.in_order.len() + self.late.len()
    }

    /// Every waiting event, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Pending> {
        self.in_order.iter().chain(self.late.iter().map(|Reverse(p)| p))
    }
}

impl FromIterator<Pending> for ReorderBuffer {
    fn from_iter<I: IntoIterator<Item = Pending>>(items: I) -> Self {
        let mut buffer = ReorderBuffer::default();
        items.into_iter().for_each(|p| buffer.push(p));
        buffer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_lang::schema::Stream;

    #[test]
    fn releases_in_order_whatever_the_arrival_order() {
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..200 {
            let times: Vec<i64> = (0..50).map(|i| if rng.u8(0..4) == 0 { rng.i64(0..50) } else { i }).collect();
            let mut buffer = ReorderBuffer::default();
            for (n, &t) in times.iter().enumerate() {
                // Every third is a time alone, which sorts with the events by its timestamp.
                let event = (n % 3 != 0).then(|| Arc::new(Event::new(Stream::Metric, t)));
                buffer.push(Pending { ts: t, event, arrival: n as u64 });
            }
            assert_eq!(buffer.iter().count(), times.len());
            let mut out = Vec::new();
            while let Some(p) = buffer.pop_until(i64::MAX) {
                out.push((p.ts, p.arrival));
            }
            // By time, a time alone before the events of its timestamp, then by arrival (the
            // events here differ in nothing else).
            let mut want: Vec<(i64, u64)> = times.iter().enumerate().map(|(n, &t)| (t, n as u64)).collect();
            want.sort_by_key(|&(t, n)| (t, n % 3 != 0, n));
            assert_eq!(out, want);
        }
    }

    #[test]
    fn simultaneous_events_leave_in_content_order_across_pushes_pops_and_the_rings_wrap() {
        let mut rng = fastrand::Rng::with_seed(11);
        for _ in 0..100 {
            let mut buffer = ReorderBuffer::default();
            // What is waiting, as the full order sorts it.
            let mut waiting: Vec<(i64, String, u64)> = Vec::new();
            let mut released = i64::MIN;
            let (mut out, mut want) = (Vec::new(), Vec::new());
            for n in 0..400u64 {
                if rng.u8(0..8) == 0 {
                    // Release up to a time, as the engine's watermark does.
                    let until = released.max(rng.i64(0..60));
                    while let Some(p) = buffer.pop_until(until) {
                        out.push((p.ts, p.event.map(|e| e.value(0).to_text()).unwrap_or_default(), p.arrival));
                    }
                    waiting.sort();
                    let cut = waiting.partition_point(|w| w.0 <= until);
                    want.extend(waiting.drain(..cut));
                    released = until;
                    continue;
                }
                let ts = released.max(0) + 1 + rng.i64(0..6);
                let host = format!("h{}", rng.u8(0..5));
                let mut event = Event::new(Stream::Metric, ts);
                event.fields[0] = crate::event::Value::str(&host);
                buffer.push(Pending { ts, event: Some(Arc::new(event)), arrival: n });
                waiting.push((ts, host, n));
            }
            while let Some(p) = buffer.pop_until(i64::MAX) {
                out.push((p.ts, p.event.map(|e| e.value(0).to_text()).unwrap_or_default(), p.arrival));
            }
            waiting.sort();
            want.extend(waiting);
            assert_eq!(out, want);
        }
    }
}
