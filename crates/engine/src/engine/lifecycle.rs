//! The alert lifecycle: pending (`for`) -> firing -> resolved (`keep_firing_for`), one alert per
//! key while it fires.
//!
//! Two ways to feed it. Window rules judge every group at every window close, so the condition
//! is known to be true or false at each such time ([`Lifecycle::observe`]). Event rules only see
//! matches: a match says "true now", and silence says nothing, so an episode ends when no match
//! has come for `keep_firing_for` ([`Lifecycle::expire`]).

use crate::alert::Status;
use crate::event::Millis;
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::hash::Hash;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
enum Phase {
    Pending { since: Millis, last_true: Millis },
    Firing { since: Millis, last_true: Millis },
}

/// A change of an alert's status, for the caller to turn into an [`crate::alert::Alert`].
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub status: Status,
    /// When the episode started (the start of `for`).
    pub starts_at: Millis,
    /// When this transition happened.
    pub at: Millis,
}

/// When a key's phase may lapse, for event rules. Stale entries (the key matched again since)
/// are skipped when they come up, so a match costs a push, not a scan of all keys.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Due<K>(Millis, K);

impl<K> PartialEq for Due<K> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl<K> Eq for Due<K> {}
impl<K> PartialOrd for Due<K> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<K> Ord for Due<K> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.cmp(&other.0)
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Lifecycle<K: Hash + Eq> {
    for_ms: i64,
    keep_ms: i64,
    /// foldhash, as the engine's other per-key maps: an alert's key is hashed on every match.
    keys: HashMap<K, Phase, foldhash::fast::RandomState>,
    dues: BinaryHeap<Reverse<Due<K>>>,
}

impl<K: Hash + Eq + Clone> Lifecycle<K> {
    pub fn new(for_ms: u64, keep_firing_for_ms: u64) -> Self {
        Lifecycle {
            for_ms: for_ms as i64,
            keep_ms: keep_firing_for_ms as i64,
            keys: HashMap::default(),
            dues: BinaryHeap::new(),
        }
    }

    /// Keys that are pending or firing.
    pub fn active(&self) -> usize {
        self.keys.len()
    }

    pub fn is_active(&self, key: &K) -> bool {
        self.keys.contains_key(key)
    }

    /// The condition for `key` is `holds` at time `t`.
    pub fn observe(&mut self, key: &K, t: Millis, holds: bool) -> Option<Transition> {
        if holds {
            return self.hold(key, t);
        }
        match self.keys.get(key)? {
            Phase::Pending { .. } => {
                self.keys.remove(key);
                None
            }
            Phase::Firing { since, last_true } => {
                let since = *since;
                if t - last_true >= self.keep_ms {
                    self.keys.remove(key);
                    Some(Transition { status: Status::Resolved, starts_at: since, at: t })
                } else {
                    None
                }
            }
        }
    }

    fn hold(&mut self, key: &K, t: Millis) -> Option<Transition> {
        match self.keys.get_mut(key) {
            None if self.for_ms == 0 => {
                self.keys.insert(key.clone(), Phase::Firing { since: t, last_true: t });
                Some(Transition { status: Status::Firing, starts_at: t, at: t })
            }
            None => {
                self.keys.insert(key.clone(), Phase::Pending { since: t, last_true: t });
                None
            }
            Some(Phase::Pending { since, last_true }) => {
                *last_true = t;
                let since = *since;
                if t - since >= self.for_ms {
                    self.keys.insert(key.clone(), Phase::Firing { since, last_true: t });
                    Some(Transition { status: Status::Firing, starts_at: since, at: t })
                } else {
                    None
                }
            }
            Some(Phase::Firing { last_true, .. }) => {
                *last_true = t;
                None
            }
        }
    }

    /// For event rules: the condition for `key` held at `t` (a match). Unlike [`observe`], silence
    /// is judged later, by [`expire`].
    ///
    /// [`observe`]: Lifecycle::observe
    /// [`expire`]: Lifecycle::expire
    pub fn matched(&mut self, key: &K, t: Millis) -> Option<Transition> {
        let transition = self.hold(key, t);
        if let Some(due) = self.keys.get(key).map(|p| self.lapse_time(p)) {
            self.dues.push(Reverse(Due(due, key.clone())));
        }
        transition
    }

    fn lapse_time(&self, phase: &Phase) -> Millis {
        match phase {
            Phase::Pending { last_true, .. } => last_true + self.for_ms.max(1),
            Phase::Firing { last_true, .. } => last_true + self.keep_ms,
        }
    }

    /// For event rules: time has reached `now` with no match since each key's last one. Pending
    /// keys lapse after `for` without a match; firing keys resolve `keep_firing_for` after their
    /// last match. Transitions come in time order.
    pub fn expire(&mut self, now: Millis) -> Vec<(K, Transition)> {
        let mut out = Vec::new();
        while let Some(Reverse(Due(due, _))) = self.dues.peek() {
            if *due > now {
                break;
            }
            let Some(Reverse(Due(due, key))) = self.dues.pop() else { break };
            let Some(phase) = self.keys.get(&key) else { continue };
            if self.lapse_time(phase) != due {
                continue;
            }
            if let Some(Phase::Firing { since, .. }) = self.keys.remove(&key) {
                out.push((key, Transition { status: Status::Resolved, starts_at: since, at: due }));
            }
        }
        out
    }

    /// The earliest time at which [`Lifecycle::expire`] may change something (possibly earlier).
    pub fn next_expiry(&self) -> Option<Millis> {
        self.dues.peek().map(|Reverse(Due(due, _))| *due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fired(t: Option<Transition>) -> Option<(Status, Millis, Millis)> {
        t.map(|t| (t.status, t.starts_at, t.at))
    }

    #[test]
    fn fires_at_once_without_for_and_resolves_when_false() {
        let mut l = Lifecycle::new(0, 0);
        assert_eq!(fired(l.observe(&"k", 10, true)), Some((Status::Firing, 10, 10)));
        assert_eq!(fired(l.observe(&"k", 20, true)), None, "one alert per key while firing");
        assert_eq!(fired(l.observe(&"k", 30, false)), Some((Status::Resolved, 10, 30)));
        assert_eq!(l.active(), 0);
    }

    #[test]
    fn for_keeps_the_alert_pending_until_it_held_long_enough() {
        let mut l = Lifecycle::new(20, 0);
        assert_eq!(fired(l.observe(&"k", 0, true)), None);
        assert_eq!(fired(l.observe(&"k", 10, true)), None);
        assert_eq!(fired(l.observe(&"k", 20, true)), Some((Status::Firing, 0, 20)));
        let mut l = Lifecycle::new(20, 0);
        l.observe(&"k", 0, true);
        assert_eq!(fired(l.observe(&"k", 10, false)), None, "a pending alert that stops holding is dropped");
        assert_eq!(fired(l.observe(&"k", 20, true)), None, "and starts over");
    }

    #[test]
    fn keep_firing_for_bridges_short_gaps() {
        let mut l = Lifecycle::new(0, 15);
        l.observe(&"k", 0, true);
        assert_eq!(fired(l.observe(&"k", 10, false)), None);
        assert_eq!(fired(l.observe(&"k", 14, false)), None);
        assert_eq!(fired(l.observe(&"k", 20, true)), None, "still the same episode");
        assert_eq!(fired(l.observe(&"k", 35, false)), Some((Status::Resolved, 0, 35)));
    }

    #[test]
    fn event_rules_resolve_after_silence() {
        let mut l = Lifecycle::new(0, 100);
        l.matched(&"a", 0);
        l.matched(&"b", 50);
        assert_eq!(l.next_expiry(), Some(100));
        assert!(l.expire(99).is_empty());
        let out = l.expire(160);
        assert_eq!(out.len(), 2);
        assert_eq!((out[0].0, out[0].1.at), ("a", 100));
        assert_eq!((out[1].0, out[1].1.at), ("b", 150));
    }

    #[test]
    fn a_new_match_postpones_the_resolution() {
        let mut l = Lifecycle::new(0, 100);
        l.matched(&"a", 0);
        l.matched(&"a", 80);
        assert!(l.expire(150).is_empty(), "the entry due at 100 is stale");
        assert_eq!(l.expire(180).len(), 1);
        assert_eq!(l.next_expiry(), None);
    }

    #[test]
    fn pending_event_keys_lapse_without_a_match() {
        let mut l = Lifecycle::new(50, 0);
        assert_eq!(l.matched(&"a", 0), None);
        assert!(l.expire(60).is_empty());
        assert_eq!(l.active(), 0);
        assert_eq!(l.matched(&"a", 70), None, "pending starts over");
    }
}
