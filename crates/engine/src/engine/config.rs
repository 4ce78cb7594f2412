//! The engine's settings, its clock, and the counters it keeps.

use crate::event::Millis;
use std::collections::BTreeMap;
use std::sync::Arc;

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
    /// The key groups this engine owns, when several engines split one rule set's state
    /// (`--workers`); by default all of them.
    pub shard: Shard,
    /// Whether rules with a cluster step run in two stages, as instances that share their keys
    /// run them: their windows summarised where their events are, and judged where the
    /// summaries meet ([`super::stage_two`]).
    pub two_stage: bool,
    /// One rule's judgements to note ([`super::trace`]), for `vigil why`.
    pub trace: Option<super::trace::Trace>,
}

/// Which of the [`KEY_GROUPS`](super::keys::KEY_GROUPS) key groups an engine owns: those whose
/// number modulo `count` is `index`. Every engine of a set sees every event (so that each has
/// the same time); each keeps state, and raises alerts, only for the keys of its own key groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Default for Shard {
    fn default() -> Self {
        Shard { index: 0, count: 1 }
    }
}

impl Shard {
    pub fn owns(&self, key_group: u32) -> bool {
        self.count <= 1 || key_group as usize % self.count == self.index
    }
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
