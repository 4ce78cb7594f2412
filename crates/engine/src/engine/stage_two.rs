//! Stage two of the fleet-wide rules, for keyed partitions: those of instances that share
//! their keys (`--kafka-join-group`), and those of one instance ([`crate::runtime`]).
//!
//! A rule with a cluster step compares every group of a window with its peers. Split in two
//! (an engine built with [`EngineConfig::two_stage`](super::EngineConfig)), its groups' windows
//! are kept where their events are, in the key group of each group's key, like any other rule's;
//! a closed window's results go, as [`Summary`] records, to the stage two of their peer group.
//! Stage two keeps the rule's groups (their history and alerts), takes the summaries of every
//! source partition, and closes a window once every source has reported its stage one past the
//! window's end. Its close is the window operator's own, so the alerts are those of one engine.
//!
//! - A summary is taken once: by source partition and operator, only windows past the last one
//!   taken (a source restored from a checkpoint closes the same windows again, with the same
//!   events, and sends them again).
//! - A source's reports follow its summaries: records of one producer reach a partition in
//!   their order.

pub use super::summary::{Summarised, Summary};

use super::config::EngineConfig;
use super::eval::RegexCache;
use super::keys::Key;
use super::window::{Pending, Stage, WindowOperator};
use super::Operator;
use crate::alert::Alert;
use crate::event::Millis;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use vigil_lang::plan::RulePlan;

/// The keyed partition (of `partitions`) whose stage two judges the groups of operator `op` in
/// peer group `peers`: the same in every process and version.
pub fn partition_of(op: &str, peers: &Key, partitions: u32) -> i32 {
    (super::keys::key_group_of(&(op, peers)) % partitions.max(1)) as i32
}

/// One split operator's stage two.
struct Judge {
    id: String,
    op: WindowOperator,
    /// By source partition: the end of the last window whose summary was taken.
    taken: BTreeMap<i32, Millis>,
}

/// The stage two of every split operator of a rule set, in one keyed partition.
pub struct StageTwo {
    judges: Vec<Judge>,
    /// By source partition: how far its stage one has got (its engine's watermark).
    sources: BTreeMap<i32, Millis>,
    /// How many source partitions there are: a window closes once each has passed it.
    partitions: u32,
}

/// What a stage two's checkpoint holds.
#[derive(Serialize, Deserialize)]
struct Saved {
    sources: BTreeMap<i32, Millis>,
    /// By operator: its id, the last windows taken, its state and its pending summaries.
    judges: Vec<SavedJudge>,
}

/// One operator's stage two in a checkpoint: its id, the last windows taken by source, its
/// state and its pending summaries.
type SavedJudge = (String, BTreeMap<i32, Millis>, Vec<u8>, Pending);

/// What became of a summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TookSummary {
    Taken,
    /// Its window was taken from its source before.
    Duplicate,
    /// No split operator of this rule set has its id (the rules changed).
    Unknown,
}

impl StageTwo {
    /// The stage two of `plans`' split operators, over `partitions` source partitions.
    pub fn new(plans: &[RulePlan], config: &EngineConfig, partitions: u32) -> StageTwo {
        let plans: Vec<Arc<RulePlan>> = plans.iter().cloned().map(Arc::new).collect();
        let mut regexes = RegexCache::default();
        for e in plans.iter().flat_map(|p| p.exprs()) {
            regexes.add_from(e);
        }
        let judges = super::physical::window_builders(&plans, true, &Arc::new(regexes))
            .into_iter()
            .filter(|b| b.splittable())
            .map(|b| Judge { id: b.id().0, op: b.build_stage(config.limits, Stage::Judge), taken: BTreeMap::new() })
            .collect();
        StageTwo { judges, sources: BTreeMap::new(), partitions }
    }

    /// Whether the rule set has no split operator.
    pub fn is_empty(&self) -> bool {
        self.judges.is_empty()
    }

    /// Takes a summary sent by `source`.
    pub fn take(&mut self, source: i32, summary: Summary) -> TookSummary {
        let Some(judge) = self.judges.iter_mut().find(|j| j.id == summary.op) else { return TookSummary::Unknown };
        if judge.taken.get(&source).is_some_and(|t| summary.end <= *t) {
            return TookSummary::Duplicate;
        }
        judge.taken.insert(source, summary.end);
        match judge.op.summarised(summary.end, summary.groups) {
            true => TookSummary::Taken,
            false => {
                tracing::warn!(source, end = summary.end, "a summary of a window closed already");
                TookSummary::Duplicate
            }
        }
    }

    /// Takes a source's report of how far its stage one has got: only forward.
    pub fn report(&mut self, source: i32, watermark: Millis) {
        let w = self.sources.entry(source).or_insert(watermark);
        *w = (*w).max(watermark);
    }

    /// How far every source has got: none until each has reported.
    pub fn watermark(&self) -> Option<Millis> {
        (0..self.partitions as i32).map(|p| self.sources.get(&p).copied()).min().flatten()
    }

    /// Closes every window whose end one of `marks` (rising) passes, at the first such mark,
    /// once every source has passed them all: for stage ones in one process that moved through
    /// the same marks ([`super::Engine::release_marks`]), so an alert is detected when one
    /// engine with every event would detect it. Alerts go to `out`.
    pub fn advance_marks(&mut self, marks: &[Millis], out: &mut Vec<Alert>) {
        let Some(&last) = marks.last() else { return };
        for source in 0..self.partitions as i32 {
            self.report(source, last);
        }
        for judge in &mut self.judges {
            let mut from = 0;
            while let Some(due) = judge.op.next_deadline().filter(|d| *d <= last) {
                from += marks[from..].partition_point(|m| *m < due);
                let at = marks[from];
                let before = out.len();
                judge.op.on_watermark(due, out);
                judge.op.skip_quiet(at);
                for alert in &mut out[before..] {
                    alert.detected_at = at.max(alert.time);
                }
            }
        }
    }

    /// Closes every window that every source has passed; alerts go to `out`.
    pub fn advance(&mut self, out: &mut Vec<Alert>) {
        let Some(watermark) = self.watermark() else { return };
        for judge in &mut self.judges {
            // As the engine's timers do: a close at a time, then what quiet closes it may skip.
            while let Some(due) = judge.op.next_deadline().filter(|d| *d <= watermark) {
                let before = out.len();
                judge.op.on_watermark(due, out);
                judge.op.skip_quiet(watermark);
                for alert in &mut out[before..] {
                    alert.detected_at = watermark.max(alert.time);
                }
            }
        }
    }

    pub fn snapshot(&self) -> Result<Vec<u8>, postcard::Error> {
        let mut judges = Vec::new();
        for j in &self.judges {
            judges.push((j.id.clone(), j.taken.clone(), j.op.snapshot()?, j.op.pending().clone()));
        }
        postcard::to_stdvec(&Saved { sources: self.sources.clone(), judges })
    }

    /// Puts back a state [`StageTwo::snapshot`] made; operators no longer in the rule set are
    /// dropped.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), postcard::Error> {
        let saved: Saved = postcard::from_bytes(bytes)?;
        self.sources = saved.sources;
        for (id, taken, state, pending) in saved.judges {
            if let Some(j) = self.judges.iter_mut().find(|j| j.id == id) {
                j.op.restore(&state)?;
                j.op.restore_pending(pending);
                j.taken = taken;
            }
        }
        Ok(())
    }

    /// The stage two of another rule set: operators of the same state keep it, as the engine's
    /// do ([`super::Engine::reload`]).
    pub fn reload(&mut self, plans: &[RulePlan], config: &EngineConfig) {
        let mut fresh = StageTwo::new(plans, config, self.partitions);
        for j in &mut fresh.judges {
            let Some(old) = self.judges.iter().find(|o| o.id == j.id) else { continue };
            let moved = old.op.snapshot().and_then(|state| j.op.restore(&state));
            if let Err(e) = moved {
                tracing::warn!(error = %e, "a fleet-wide rule's stage-two state could not be carried over; it starts empty");
                continue;
            }
            j.op.restore_pending(old.op.pending().clone());
            j.taken = old.taken.clone();
        }
        fresh.sources = std::mem::take(&mut self.sources);
        *self = fresh;
    }

    pub fn state_bytes(&self) -> usize {
        self.judges.iter().map(|j| j.op.state_bytes()).sum()
    }

    /// Counts the groups each rule keeps here into `keys`, the live keys of its stage ones: a
    /// group's open windows are there and its history here, so each group is counted once,
    /// where more of them are.
    pub fn count_live_keys(&self, keys: &mut BTreeMap<String, usize>) {
        for (rule, n) in self.judges.iter().flat_map(|j| j.op.live_keys()) {
            let held = keys.entry(rule).or_insert(0);
            *held = (*held).max(n);
        }
    }

    /// Adds the groups dropped here so far to `evicted`, by rule and reason.
    pub fn count_evicted(&self, evicted: &mut BTreeMap<(String, &'static str), u64>) {
        for (rule, reason, n) in self.judges.iter().flat_map(|j| j.op.evicted()) {
            *evicted.entry((rule, reason)).or_insert(0) += n;
        }
    }

    /// Drops the idlest groups of the operators that hold the most until the state is
    /// estimated under `max_bytes`, as an engine does with its own ([`super::Engine::enforce_budget`]);
    /// the self-alerts that says so go to `out`, detected at the stage two's time. Returns the
    /// estimate after.
    pub fn enforce_budget(&mut self, max_bytes: usize, out: &mut Vec<Alert>) -> usize {
        let now = self.watermark().unwrap_or(crate::event::MIN_TS);
        let mut total = self.state_bytes();
        for _ in 0..64 {
            if total <= max_bytes {
                break;
            }
            let Some(largest) = self.judges.iter_mut().max_by_key(|j| j.op.state_bytes()) else { break };
            let before = out.len();
            if !largest.op.shrink(now, out) {
                break;
            }
            for alert in &mut out[before..] {
                alert.detected_at = now.max(alert.time);
            }
            total = self.state_bytes();
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Engine;

    /// A rule per peer group in `pers` (`;` between them), over one state.
    fn plans(pers: &str, group_by: &str) -> Vec<RulePlan> {
        let src: String = pers
            .split(';')
            .enumerate()
            .map(|(n, per)| {
                format!(
                    "rule r{n} {{ task t use machine m as e #time(1 min) state ss {{ load := sum(e.cpu) }} \
                     group by {group_by} cluster(points = all(ss.load) per {per}, method = mad(3.5)) \
                     alert cluster.outlier }}\n"
                )
            })
            .collect();
        let c = vigil_lang::compile("r.saql", src.as_bytes());
        assert!(c.is_ok(), "{:?}", c.diagnostics);
        c.plans
    }

    /// The summaries of two machines' first window, from an engine that runs `plans` in two
    /// stages.
    fn summaries(plans: Vec<RulePlan>) -> Vec<Summary> {
        let mut engine = Engine::new(plans, EngineConfig { two_stage: true, ..Default::default() });
        let mut out = Vec::new();
        for (ts, machine) in [(1_000, "m1"), (2_000, "m2"), (61_000, "m1")] {
            let line = format!(
                r#"{{"stream":"task_usage","ts":{ts},"job_id":"j","task_index":0,"machine_id":"{machine}","cluster":"c1","cpu":0.5}}"#
            );
            engine.push(crate::event::decode(&line, None).expect("event"), &mut out);
        }
        engine.release_to(61_000, &mut out);
        engine.take_summaries()
    }

    #[test]
    fn summaries_go_to_the_stage_two_of_their_peer_group_when_the_key_tells_it() {
        let by_cluster = summaries(plans("e.cluster", "m, e.cluster"));
        assert_eq!(by_cluster.len(), 1, "one window closed");
        let s = &by_cluster[0];
        assert_eq!(s.groups.len(), 2);
        assert!(s.groups.iter().all(|g| g.peers == Key(vec![crate::event::Value::str("c1")])), "{s:?}");
        // Two rules over one state that compare groups within different peer groups: one stage
        // two judges every group.
        let two = summaries(plans("e.cluster; m.machine_id", "m, e.cluster"));
        assert_eq!(two.len(), 1, "one operator for both rules");
        assert_eq!(two[0].groups.len(), 2);
        assert!(two[0].groups.iter().all(|g| g.peers.0.is_empty()), "{two:?}");
    }

    #[test]
    fn a_rule_grouped_by_a_computed_key_is_not_split() {
        let split = StageTwo::new(&plans("e.cluster", "m, e.cluster"), &EngineConfig::default(), 4);
        assert!(!split.is_empty());
        let computed = StageTwo::new(&plans("m.machine_id", "m, e.cpu > 0.5"), &EngineConfig::default(), 4);
        assert!(computed.is_empty(), "its stand-in event cannot be made from its key");
        assert!(summaries(plans("m.machine_id", "m, e.cpu > 0.5")).is_empty());
    }
}
