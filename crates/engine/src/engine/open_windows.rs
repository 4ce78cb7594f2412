//! The open windows of one group of a windowed rule.

use super::state::Acc;
use crate::event::{Millis, Value};
use std::sync::Arc;

/// A group's open windows, oldest first, in one allocation: each window's start followed by its
/// accumulators, one per state field. A tumbling window has one open at a time, a sliding one
/// size/slide; an event updates every window it falls in, and with the windows side by side
/// that is one memory access, not one per window (at 100,000 groups each is a cache miss).
#[derive(Default)]
pub struct OpenWindows(Vec<Slot>);

pub enum Slot {
    Start(Millis),
    Acc(Acc),
}

impl OpenWindows {
    pub fn with_capacity(windows: usize, fields: usize) -> Self {
        OpenWindows(Vec::with_capacity(windows * (fields + 1)))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every window from `first` to `last` (starts `slide` apart), each opened from `empty` if
    /// it is not open yet; `add` gets each of their accumulators with its field's position.
    /// Windows are kept in start order and each holds one accumulator per field, so one pass
    /// over them finds every window an event falls in (size/slide of them in a sliding window).
    pub fn update(
        &mut self,
        first: Millis,
        last: Millis,
        slide: Millis,
        empty: &[Acc],
        mut add: impl FnMut(usize, &mut Acc),
    ) {
        let stride = empty.len() + 1;
        let mut at = 0;
        let mut start = first;
        while start <= last {
            while matches!(self.0.get(at), Some(Slot::Start(s)) if *s < start) {
                at += stride;
            }
            at = at.min(self.0.len());
            if !matches!(self.0.get(at), Some(Slot::Start(s)) if *s == start) {
                // Starts arrive in increasing order, so a new window almost always goes last.
                let window = std::iter::once(Slot::Start(start)).chain(empty.iter().cloned().map(Slot::Acc));
                self.0.splice(at..at, window);
            }
            for (field, slot) in self.0.iter_mut().skip(at + 1).take(stride - 1).enumerate() {
                if let Slot::Acc(acc) = slot {
                    add(field, acc);
                }
            }
            at += stride;
            start += slide;
        }
    }

    /// The start of the oldest open window.
    pub fn first_start(&self) -> Option<Millis> {
        match self.0.first() {
            Some(Slot::Start(s)) => Some(*s),
            _ => None,
        }
    }

    /// Where the window whose start is at `at` ends: at the next start, or at the end.
    fn run_end(&self, at: usize) -> usize {
        let next = self.0.iter().skip(at + 1).position(|slot| matches!(slot, Slot::Start(_)));
        next.map_or(self.0.len(), |n| at + 1 + n)
    }

    /// Closes the oldest window if it starts at `start`: its results, in field order.
    pub fn close(&mut self, start: Millis) -> Option<Arc<[Value]>> {
        match self.0.first() {
            Some(Slot::Start(s)) if *s == start => {}
            _ => return None,
        }
        let end = self.run_end(0);
        let results = self
            .0
            .drain(..end)
            .filter_map(|slot| match slot {
                Slot::Acc(acc) => Some(acc.result()),
                Slot::Start(_) => None,
            })
            .collect();
        Some(results)
    }

    /// The windows as (start, accumulators), the form a snapshot holds.
    pub fn windows(&self) -> Vec<(Millis, Vec<&Acc>)> {
        let mut out: Vec<(Millis, Vec<&Acc>)> = Vec::new();
        for slot in &self.0 {
            match slot {
                Slot::Start(s) => out.push((*s, Vec::new())),
                Slot::Acc(acc) => {
                    if let Some((_, accs)) = out.last_mut() {
                        accs.push(acc);
                    }
                }
            }
        }
        out
    }
}

/// Written as a list of (start, accumulators), as before the windows shared one allocation, so
/// that checkpoints carry over.
impl serde::Serialize for OpenWindows {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.windows().serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for OpenWindows {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let windows = Vec::<(Millis, Vec<Acc>)>::deserialize(d)?;
        let mut slots = Vec::new();
        for (start, accs) in windows {
            slots.push(Slot::Start(start));
            slots.extend(accs.into_iter().map(Slot::Acc));
        }
        Ok(OpenWindows(slots))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Value;
    use vigil_lang::plan::AggFunc;

    #[test]
    fn an_event_updates_every_window_it_falls_in_once_and_windows_stay_in_start_order() {
        let empty = [Acc::new(AggFunc::Count, false)];
        let count = |_: usize, acc: &mut Acc| acc.add(&Value::Null, 0, 0);
        let mut open = OpenWindows::default();
        open.update(0, 50, 10, &empty, count);
        open.update(20, 70, 10, &empty, count);
        // A window missing in the middle (which events in time order never leave) is opened in
        // its place.
        let mut gap = OpenWindows::default();
        gap.update(0, 0, 10, &empty, count);
        gap.update(20, 20, 10, &empty, count);
        gap.update(10, 20, 10, &empty, count);
        let counts = |open: &OpenWindows| -> Vec<(Millis, Vec<Value>)> {
            open.windows().into_iter().map(|(start, accs)| (start, accs.iter().map(|a| a.result()).collect())).collect()
        };
        let n = |x: f64| vec![Value::Num(x)];
        assert_eq!(
            counts(&open),
            [
                (0, n(1.0)),
                (10, n(1.0)),
                (20, n(2.0)),
                (30, n(2.0)),
                (40, n(2.0)),
                (50, n(2.0)),
                (60, n(1.0)),
                (70, n(1.0))
            ]
        );
        assert_eq!(counts(&gap), [(0, n(1.0)), (10, n(1.0)), (20, n(2.0))]);
    }

    #[test]
    fn open_windows_share_one_allocation_and_keep_the_checkpoint_format() {
        // A slot is no larger than the accumulator it holds.
        assert_eq!(std::mem::size_of::<Slot>(), std::mem::size_of::<Acc>());
        let empty = [Acc::new(AggFunc::Avg, true), Acc::new(AggFunc::Count, false)];
        let mut open = OpenWindows::default();
        for (start, x) in [(0, 1.0), (10, 2.0), (0, 3.0), (20, 4.0), (10, 5.0)] {
            open.update(start, start, 10, &empty, |_, acc| acc.add(&Value::Num(x), 0, 0));
        }
        // Written as the list of (start, accumulators) that checkpoints held before.
        let before: Vec<(Millis, Box<[Acc]>)> = vec![
            (0, Box::new([Acc::Avg { sum: 4.0, n: 2 }, Acc::Count(2)])),
            (10, Box::new([Acc::Avg { sum: 7.0, n: 2 }, Acc::Count(2)])),
            (20, Box::new([Acc::Avg { sum: 4.0, n: 1 }, Acc::Count(1)])),
        ];
        let bytes = postcard::to_stdvec(&open).expect("serializes");
        assert_eq!(bytes, postcard::to_stdvec(&before).expect("serializes"));
        let mut back: OpenWindows = postcard::from_bytes(&bytes).expect("reads back");
        assert!(back.close(10).is_none(), "only the oldest window closes");
        assert_eq!(back.close(0).as_deref(), Some(&[Value::Num(2.0), Value::Num(2.0)][..]));
        assert_eq!(back.close(10).as_deref(), Some(&[Value::Num(3.5), Value::Num(2.0)][..]));
        assert_eq!(back.close(20).as_deref(), Some(&[Value::Num(4.0), Value::Num(1.0)][..]));
        assert!(back.is_empty());
    }
}
