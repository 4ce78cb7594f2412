//! The self-alert of a rule that its state limits made partly blind.
//!
//! An absence rule (`e1 -> not e2 for 10 min`, "host silent") keeps one waiting match per key.
//! When the key cap or the memory budget drops such a match, or the cadence an absence's bound
//! learned for a key (`interval`), that key's silence will not be reported: a flood of new keys
//! (an attacker's, or a misconfigured producer's) can hide a real host going quiet. A scored
//! rule (`score { .. }`) keeps each series' learned history; a series dropped for the same
//! limits is not judged again until its scorers have warmed up anew. Either way Vigil raises an
//! alert of its own, `vigil_state_evicted`, keyed by the rule, so that the operator knows; it
//! resolves an hour (event time) after the last such drop.

use crate::alert::{Alert, Fields, Status};
use crate::event::Millis;
use serde_json::json;
use std::sync::Arc;

/// The name the self-alert carries as its rule.
pub const RULE: &str = "vigil_state_evicted";

/// Quiet time after the last drop before the self-alert resolves.
const QUIET_MS: Millis = 3_600_000;

/// What a rule loses with a dropped key, for the self-alert's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// Waiting absence matches, or the cadences an absence's bound learned.
    Absences,
    /// Series' learned history (a scored rule's scorers).
    Scores,
}

/// One rule's blindness: the firing self-alert, if any, and the drops not yet reported.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct BlindSpot {
    /// The firing self-alert (as JSON, as alerts are kept in snapshots) and when its episode's
    /// latest drop was.
    firing: Option<(String, Millis)>,
    /// Waiting matches dropped in this episode.
    dropped: u64,
    /// Drops since the last report, and why.
    #[serde(skip)]
    pending: u64,
    #[serde(skip)]
    reason: &'static str,
}

impl BlindSpot {
    /// A waiting absence match was dropped, for `reason` (`cap` or `memory`).
    pub fn dropped(&mut self, reason: &'static str) {
        self.dropped_many(reason, 1);
    }

    /// `n` keys' state was dropped, for `reason` (`cap` or `memory`).
    pub fn dropped_many(&mut self, reason: &'static str, n: u64) {
        if n > 0 {
            self.pending += n;
            self.reason = reason;
        }
    }

    /// Raises the self-alert for drops noted since the last call, at event time `now`.
    pub fn report(&mut self, rule: &str, lost: Lost, now: Millis, out: &mut Vec<Alert>) {
        if self.pending == 0 {
            return;
        }
        self.dropped += self.pending;
        self.pending = 0;
        match &mut self.firing {
            Some((_, last)) => *last = now,
            None => {
                let alert = self.alert(rule, lost, now);
                self.firing = Some((serde_json::to_string(&alert).unwrap_or_default(), now));
                out.push(alert);
            }
        }
    }

    fn alert(&self, rule: &str, lost: Lost, now: Millis) -> Alert {
        let key = Fields::new(vec![(Arc::from("rule"), json!(rule))]);
        let why = match self.reason {
            "memory" => "the state budget (--max-state-mb)",
            _ => "the key cap (--max-keys-per-rule)",
        };
        let summary = match lost {
            Lost::Absences => format!(
                "rule {rule} dropped waiting absence matches or learned cadences to stay within {why}: a key that goes quiet now may not be reported"
            ),
            Lost::Scores => format!(
                "rule {rule} dropped the learned history of series to stay within {why}: those series are not judged again until their scorers have warmed up anew"
            ),
        };
        let values = Fields::new(vec![
            (Arc::from("rule"), json!(rule)),
            (Arc::from("dropped"), json!(self.dropped)),
            (Arc::from("reason"), json!(self.reason)),
        ]);
        Alert::own(RULE, "warning", key, values, &[("rule", rule)], summary, now)
    }

    /// When the firing self-alert would resolve.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.firing.as_ref().map(|(_, last)| last + QUIET_MS)
    }

    /// Resolves the self-alert once an hour has passed without drops.
    pub fn expire(&mut self, now: Millis, out: &mut Vec<Alert>) {
        let Some((text, last)) = &self.firing else { return };
        let due = last + QUIET_MS;
        if due > now {
            return;
        }
        if let Ok(mut alert) = serde_json::from_str::<Alert>(text) {
            alert.status = Status::Resolved;
            alert.time = due;
            alert.ends_at = Some(due);
            alert.detected_at = due;
            out.push(alert);
        }
        self.firing = None;
        self.dropped = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_alert_per_episode_resolved_an_hour_after_the_last_drop() {
        let mut b = BlindSpot::default();
        let mut out = Vec::new();
        b.report("host_silent", Lost::Absences, 0, &mut out);
        assert!(out.is_empty(), "nothing dropped, nothing said");
        b.dropped("cap");
        b.report("host_silent", Lost::Absences, 1_000, &mut out);
        b.dropped("cap");
        b.report("host_silent", Lost::Absences, 2_000, &mut out);
        assert_eq!(out.len(), 1, "one alert while it fires");
        assert_eq!(out[0].rule.as_ref(), RULE);
        assert_eq!(out[0].key.get("rule"), Some(&json!("host_silent")));
        assert_eq!(b.next_deadline(), Some(2_000 + QUIET_MS));
        b.expire(2_000 + QUIET_MS - 1, &mut out);
        assert_eq!(out.len(), 1);
        b.expire(2_000 + QUIET_MS, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!((out[1].status, out[1].id.clone()), (Status::Resolved, out[0].id.clone()));
        assert_eq!(b.next_deadline(), None);
    }
}
