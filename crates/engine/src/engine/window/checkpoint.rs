//! A window operator's checkpoint: its groups and alerting, then sections that later builds
//! added, each read only when the checkpoint has it, so that an older checkpoint restores.

use super::super::blind::BlindSpot;
use super::{Group, Scores, WindowOperator};
use crate::engine::keys::{Key, KeyMap};
use crate::event::Millis;
use std::sync::atomic::Ordering;

/// What a window operator's snapshot holds.
type WindowState = (KeyMap<Group>, Option<Millis>, Vec<crate::engine::alerting::AlertingState>);
/// What follows it, when any rule has scores or a refractory period: each group's scores, and
/// each rule's keys in their refractory period. Checkpoints of builds before these end at the
/// state above.
type WindowExtension = (Vec<(Key, Box<[Option<Scores>]>)>, Vec<Vec<(Key, Millis)>>);
/// What follows that, when any rule rolls its alerts up or has scores: each rule's roll-up.
/// Checkpoints of builds before roll-ups end before it, and the roll-ups start empty.
type RollupExtension = Vec<Option<crate::engine::rollup::RollupState>>;
/// What follows that, when any rule has scores: each rule's self-alert for series its limits
/// dropped. Checkpoints of builds before it end before it, and no self-alert is firing.
type BlindExtension = Vec<BlindSpot>;

impl WindowOperator {
    pub(super) fn snapshot_bytes(&self) -> Result<Vec<u8>, postcard::Error> {
        let alerting: Vec<_> = self.dependents.iter().map(|d| d.alerting.snapshot()).collect();
        let room = Vec::with_capacity(self.snapshot_room.load(Ordering::Relaxed));
        let mut bytes = postcard::to_extend(&(&self.groups, self.next_close, alerting), room)?;
        let quiet: Vec<Vec<(Key, Millis)>> = self.dependents.iter().map(|d| d.alerting.quiet_snapshot()).collect();
        let rollups: RollupExtension = self.dependents.iter().map(|d| d.alerting.rollup_snapshot()).collect();
        let rolled_up = rollups.iter().any(Option::is_some);
        if self.has_scores || rolled_up || quiet.iter().any(|q| !q.is_empty()) {
            let scores: Vec<(&Key, &Box<[Option<Scores>]>)> =
                self.groups.iter().filter(|(_, g)| !g.scores.is_empty()).map(|(k, g)| (k, &g.scores)).collect();
            bytes = postcard::to_extend(&(scores, quiet), bytes)?;
        }
        if rolled_up || self.has_scores {
            bytes = postcard::to_extend(&rollups, bytes)?;
        }
        if self.has_scores {
            let blind: Vec<&BlindSpot> = self.dependents.iter().map(|d| &d.blind).collect();
            bytes = postcard::to_extend(&blind, bytes)?;
        }
        self.snapshot_room.store(bytes.len() + bytes.len() / 8, Ordering::Relaxed);
        Ok(bytes)
    }

    pub(super) fn restore_bytes(&mut self, state: &[u8]) -> Result<(), postcard::Error> {
        let ((groups, next_close, alerting), rest): (WindowState, &[u8]) = postcard::take_from_bytes(state)?;
        self.groups = groups;
        self.next_close = next_close;
        for (d, a) in self.dependents.iter_mut().zip(alerting) {
            d.alerting.restore(a);
        }
        let ((scores, quiet), rest): (WindowExtension, &[u8]) =
            if rest.is_empty() { (Default::default(), rest) } else { postcard::take_from_bytes(rest)? };
        let (rollups, rest): (RollupExtension, &[u8]) =
            if rest.is_empty() { (Vec::new(), rest) } else { postcard::take_from_bytes(rest)? };
        let blind: BlindExtension = if rest.is_empty() { Vec::new() } else { postcard::from_bytes(rest)? };
        for (d, r) in self.dependents.iter_mut().zip(rollups) {
            d.alerting.restore_rollup(r);
        }
        for (d, b) in self.dependents.iter_mut().zip(blind) {
            d.blind = b;
        }
        for (key, s) in scores {
            if let Some(g) = self.groups.get_mut(&key) {
                g.scores = s;
            }
        }
        // A group restored without scores (a checkpoint from before the rule had them) starts
        // learning afresh.
        if self.has_scores {
            let fresh: Box<[Option<Scores>]> =
                self.dependents.iter().map(|d| d.scores.as_ref().map(Scores::new)).collect();
            for g in self.groups.values_mut().filter(|g| g.scores.len() != fresh.len()) {
                g.scores = fresh.clone();
            }
        }
        for (d, q) in self.dependents.iter_mut().zip(quiet) {
            d.alerting.restore_quiet(q);
        }
        self.scores_bytes = self.groups.values().map(Group::scores_bytes).sum();
        Ok(())
    }
}
