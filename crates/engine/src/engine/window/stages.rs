//! A fleet-wide rule's window operator split in two stages, for instances that share its keys
//! (`--kafka-join-group`). Stage one runs where a group's events are: it keeps the group's open
//! windows and, when a window closes, hands out each group's results as a summary. Stage two
//! gets the summaries of every stage one and closes the window once all of them have passed
//! its end: its groups' results come from the summaries, a group absent from them has an empty
//! window, and the cluster step, the judging and the alerts' lifecycle are those of one
//! operator ([`crate::engine::stage_two`]).

use super::super::eval::{eval, Env};
use super::super::keys::Key;
use super::parts::{compare_keys, rebuild_positions, stand_in};
use super::WindowOperator;
use crate::engine::summary::{Summarised, Summary};
use crate::event::{Event, Millis, Value};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use vigil_lang::plan::{RulePlan, StatePlan, TExpr, TExprKind};

/// Which part of its work a window operator does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// All of it: the windows, the judging, the alerts.
    Whole,
    /// Stage one: the open windows of its own groups, closed into summaries.
    Summarise,
    /// Stage two: closes from the summaries of every stage one, and the rest.
    Judge,
}

/// A group's results in one closed window.
type Closed = (Key, Arc<[Value]>);

/// What a judging operator has been sent of the windows it has not closed yet.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Pending {
    by_end: BTreeMap<Millis, Vec<Closed>>,
    /// The end of the last window closed: a summary of it or an earlier one comes too late.
    closed_to: Option<Millis>,
    /// By key: how many of its summaries wait. Made again from `by_end` on restore.
    #[serde(skip)]
    awaited: HashMap<Key, u32>,
}

impl Pending {
    /// Whether a summary of `key` waits: its group must not be forgotten.
    pub(super) fn awaits(&self, key: &Key) -> bool {
        self.awaited.contains_key(key)
    }

    pub(super) fn first_end(&self) -> Option<Millis> {
        self.by_end.keys().next().copied()
    }

    /// The summaries of the window that ends at `end`, taken out.
    pub(super) fn take(&mut self, end: Millis) -> Vec<Closed> {
        let groups = self.by_end.remove(&end).unwrap_or_default();
        for (key, _) in &groups {
            if let Some(n) = self.awaited.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    self.awaited.remove(key);
                }
            }
        }
        groups
    }

    /// The window ending at `end` was closed: the next close is `next` (the one after it, when
    /// the operator has groups) or the first window with summaries, whichever is earlier.
    pub(super) fn closed(&mut self, end: Millis, next: Option<Millis>) -> Option<Millis> {
        self.closed_to = Some(end);
        match (next, self.first_end()) {
            (Some(n), Some(f)) => Some(n.min(f)),
            (n, f) => n.or(f),
        }
    }

    fn add(&mut self, end: Millis, groups: Vec<Summarised>) {
        for g in &groups {
            *self.awaited.entry(g.key.clone()).or_default() += 1;
        }
        self.by_end.entry(end).or_default().extend(groups.into_iter().map(|g| (g.key, g.results)));
    }
}

/// Whether the summaries of a split operator's groups can go to the stage two of their peer
/// group: every rule compares groups within the same `per` groups, and those are read from the
/// group's key alone (so a group never changes peer group). Otherwise one stage two judges
/// every group of the rule.
pub(super) fn peers_by_key(plans: &[Arc<RulePlan>], state: &StatePlan, src: &vigil_lang::plan::SourcePlan) -> bool {
    let Some(positions) = rebuild_positions(state, src) else { return false };
    let mut pers = plans.iter().map(|p| p.model.cluster().map(|c| &c.per));
    let Some(Some(first)) = pers.next() else { return false };
    pers.all(|p| p == Some(first)) && first.iter().all(|e| reads_only(e, &positions))
}

/// Whether `e` reads nothing but the event fields at `positions` (and constants).
fn reads_only(e: &TExpr, positions: &[usize]) -> bool {
    match &e.kind {
        TExprKind::Number(_)
        | TExprKind::Str(_)
        | TExprKind::Bool(_)
        | TExprKind::Duration(_)
        | TExprKind::EmptySet => true,
        TExprKind::EventField { index, .. } | TExprKind::EntityField { index, .. } => positions.contains(index),
        TExprKind::List(items) | TExprKind::Call(_, items) => items.iter().all(|i| reads_only(i, positions)),
        TExprKind::Unary(_, a) | TExprKind::Cardinality(a) => reads_only(a, positions),
        TExprKind::Binary(_, a, b) | TExprKind::Lookup(a, b) => reads_only(a, positions) && reads_only(b, positions),
        _ => false,
    }
}

impl WindowOperator {
    /// Whether a fleet-wide rule over this state can be split in two stages: every rule of it
    /// has a cluster step, and a group's key makes the stand-in event that stage two reads (it
    /// is sent no events).
    pub fn splittable(plans: &[Arc<RulePlan>], state: &StatePlan) -> bool {
        plans.iter().all(|p| p.model.cluster().is_some())
            && rebuild_positions(state, &plans[0].sources[0]).is_some_and(|p| !p.is_empty())
            && !state.group_by.is_empty()
    }

    /// Stage one's close of the window ending at `end`: the results of the groups that had
    /// events in it become a summary, in key order; groups with no window open are dropped.
    pub(super) fn summarise(&mut self, end: Millis) {
        let start = end - self.size;
        let per: &[TExpr] = match self.dependents[0].plan.model.cluster() {
            Some(c) if self.peers_by_key => &c.per,
            _ => &[],
        };
        let mut scratch = Event::new(self.source[0].stream, 0);
        let mut groups = Vec::new();
        for (key, group) in self.groups.iter_mut() {
            let Some(results) = group.open.close(start) else { continue };
            let events = [Some(stand_in(&None, &self.rebuild, key, &mut scratch))];
            let env = Env::events(&self.source, &events, &self.regexes);
            let peers = Key(per.iter().map(|e| eval(e, &env)).collect());
            groups.push(Summarised { peers, key: key.clone(), results });
        }
        super::retain_groups(&mut self.groups, &mut self.scores_bytes, |_, g| !g.open.is_empty());
        if groups.is_empty() {
            return;
        }
        groups.sort_by(|a, b| compare_keys(&a.key, &b.key));
        self.summaries.push(Summary { op: String::new(), end, groups });
    }

    /// Stage two takes the summary of the window ending at `end`; false when that window is
    /// closed already (a summary that comes too late, which the stage-two bookkeeping rules
    /// out).
    pub fn summarised(&mut self, end: Millis, groups: Vec<Summarised>) -> bool {
        if self.pending.closed_to.is_some_and(|c| end <= c) {
            return false;
        }
        self.pending.add(end, groups);
        if self.next_close.is_none_or(|c| end < c) {
            self.next_close = Some(end);
        }
        true
    }

    /// Stage two's summaries of windows not closed yet, for a checkpoint.
    pub fn pending(&self) -> &Pending {
        &self.pending
    }

    pub fn restore_pending(&mut self, mut pending: Pending) {
        pending.awaited.clear();
        for (key, _) in pending.by_end.values().flatten() {
            *pending.awaited.entry(key.clone()).or_default() += 1;
        }
        self.pending = pending;
    }
}
