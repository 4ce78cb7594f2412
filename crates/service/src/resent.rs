//! A batch that Prometheus sends again is taken once. A sender resends a batch whose answer it
//! did not get (a timeout, a connection cut, a 503 after part of it was logged), and each series
//! comes in time order, so a sample no newer than the newest taken of its series has been taken
//! before: it is dropped, and counted. The newest time of each series is kept in memory (about
//! 30 bytes a series); after a restart, what the engine already has is older than its watermark
//! and judged late there.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Mutex;
use vigil_engine::event::{Event, Millis};

/// Series remembered at most; samples of series beyond them are all taken.
const MAX_SERIES: usize = 4_000_000;

#[derive(Debug, Default)]
pub struct Resent {
    newest: Mutex<HashMap<u64, Millis>>,
}

/// The newest time taken of one series, to be remembered once its samples are logged.
pub type Taken = (u64, Millis);

impl Resent {
    /// Drops from `events` (the samples of one series, in time order) those no newer than the
    /// newest taken of that series; returns how many were dropped, and what to remember
    /// ([`Resent::remember`]) once the rest are on disk. A request answered 503 remembers
    /// nothing, so that its samples sent again are taken.
    pub fn drop_seen(&self, events: &mut Vec<Event>) -> (usize, Option<Taken>) {
        let Some(first) = events.first() else { return (0, None) };
        let key = series_key(first);
        let newest = self.newest.lock().unwrap_or_else(|e| e.into_inner());
        let before = events.len();
        if let Some(seen) = newest.get(&key).copied() {
            events.retain(|e| e.ts > seen);
        }
        let taken = events.iter().map(|e| e.ts).max().map(|last| (key, last));
        (before - events.len(), taken)
    }

    /// Remembers the newest times of series whose samples were taken.
    pub fn remember(&self, taken: &[Taken]) {
        let mut newest = self.newest.lock().unwrap_or_else(|e| e.into_inner());
        for &(key, last) in taken {
            let full = newest.len() >= MAX_SERIES;
            match newest.get_mut(&key) {
                Some(seen) => *seen = (*seen).max(last),
                None if full => {}
                None => {
                    newest.insert(key, last);
                }
            }
        }
    }
}

/// A series: its host, name and labels.
fn series_key(e: &Event) -> u64 {
    let state = foldhash::fast::FixedState::with_seed(0x7669_6769_6c5f_7277);
    state.hash_one((e.get("host").to_text(), e.get("name").to_text(), e.get("labels").to_text()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vigil_engine::event::Value;
    use vigil_lang::schema::Stream;

    fn samples(host: &str, times: &[Millis]) -> Vec<Event> {
        times
            .iter()
            .map(|t| {
                let mut e = Event::new(Stream::Metric, *t);
                e.set("host", Value::str(host)).set("name", Value::str("up")).set("value", Value::Num(1.0));
                e
            })
            .collect()
    }

    #[test]
    fn a_resent_batch_is_taken_once_and_what_is_new_in_it_is_taken() {
        let resent = Resent::default();
        let mut first = samples("a", &[10, 20]);
        let (dropped, taken) = resent.drop_seen(&mut first);
        assert_eq!(dropped, 0);
        let mut refused = samples("a", &[10, 20]);
        assert_eq!(resent.drop_seen(&mut refused).0, 0, "nothing is remembered before it is logged");
        resent.remember(&taken.into_iter().collect::<Vec<_>>());
        let mut again = samples("a", &[10, 20, 30]);
        assert_eq!(resent.drop_seen(&mut again).0, 2);
        assert_eq!(again.iter().map(|e| e.ts).collect::<Vec<_>>(), [30]);
        let mut other = samples("b", &[10]);
        assert_eq!(resent.drop_seen(&mut other).0, 0, "another series has its own time");
    }
}
