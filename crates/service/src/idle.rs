//! When input stops. Event time moves only with events, so when every sender stops, an
//! absence rule ("host silent") would wait forever for the time its silence is due. Once the
//! input has been quiet for a second, and the feed is live (its newest event within an hour of
//! the wall clock: not a replay of old data), event time moves on by the wall clock from the
//! newest event, as Flink's watermarks do for idle sources; the lateness still applies. A
//! sender that comes back with samples no later, against its own pace, than the lateness
//! allows loses none.
//!
//! Vigil also says that its input stopped: the self-alert `vigil_input_stopped` fires once
//! the input has been quiet for `--input-stopped-after` and for three of its own longest recent
//! gaps (a feed that comes every 10 minutes is not stopped after 5), and resolves with the next
//! input.

use serde_json::json;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vigil_engine::alert::{Alert, Fields, Status};
use vigil_engine::event::Millis;

/// The name the self-alert carries as its rule.
pub const RULE: &str = "vigil_input_stopped";

/// How quiet the input must be before time moves without it.
const QUIET: Duration = Duration::from_secs(1);
/// How near the wall clock a feed's newest event must be for the feed to be live.
const LIVE_MS: Millis = 3_600_000;
/// How many recent gaps between inputs the self-alert's threshold reads.
const GAPS: usize = 32;

/// The input's quiet spells, and the self-alert while one lasts too long.
#[derive(Debug)]
pub struct Idle {
    stopped_after: Duration,
    /// The longest recent gaps between inputs, of a second or more, newest last.
    gaps: VecDeque<Duration>,
    firing: Option<Alert>,
}

impl Idle {
    pub fn new(stopped_after: Duration) -> Idle {
        Idle { stopped_after, gaps: VecDeque::new(), firing: None }
    }

    /// Input came, the previous one at `last`: the gap is noted, and a firing self-alert
    /// resolves at `now_ms`.
    pub fn input(&mut self, last: Instant, now_ms: Millis, out: &mut Vec<Alert>) {
        let gap = last.elapsed();
        if gap >= QUIET {
            if self.gaps.len() == GAPS {
                self.gaps.pop_front();
            }
            self.gaps.push_back(gap);
        }
        if let Some(mut alert) = self.firing.take() {
            alert.status = Status::Resolved;
            alert.time = now_ms;
            alert.ends_at = Some(now_ms);
            alert.detected_at = now_ms;
            out.push(alert);
        }
    }

    /// The input has been quiet since `last`, and the newest event seen is of `newest`: the
    /// event time to move the engines to, when the feed is live. Raises the self-alert once
    /// the quiet lasts too long.
    pub fn quiet(
        &mut self,
        last: Instant,
        newest: Option<Millis>,
        now_ms: Millis,
        out: &mut Vec<Alert>,
    ) -> Option<Millis> {
        let quiet = last.elapsed();
        let newest = newest?;
        if quiet < QUIET || (now_ms - newest).abs() > LIVE_MS {
            return None;
        }
        let longest = self.gaps.iter().max().copied().unwrap_or_default();
        if self.firing.is_none() && quiet >= self.stopped_after.max(longest * 3) {
            let alert = self.alert(quiet, now_ms);
            out.push(alert.clone());
            self.firing = Some(alert);
        }
        Some(newest + quiet.as_millis() as Millis)
    }

    fn alert(&self, quiet: Duration, now: Millis) -> Alert {
        let key = Fields::new(vec![(Arc::from("input"), json!("all"))]);
        let summary = format!(
            "no event, sample or message has reached Vigil for {} s: every sender stopped, or the way to Vigil is cut; absence rules go on by the wall clock",
            quiet.as_secs()
        );
        let values = Fields::new(vec![(Arc::from("quiet_seconds"), json!(quiet.as_secs()))]);
        Alert::own(RULE, "critical", key, values, &[], summary, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_moves_on_for_a_live_feed_only_and_the_self_alert_fires_once_per_stop() {
        let now = vigil_engine::event::now_ms();
        let mut idle = Idle::new(Duration::ZERO);
        let mut out = Vec::new();
        let two_seconds_ago = Instant::now() - Duration::from_secs(2);
        assert_eq!(idle.quiet(Instant::now(), Some(now), now, &mut out), None, "not quiet yet");
        let old_data = now - 2 * LIVE_MS;
        assert_eq!(idle.quiet(two_seconds_ago, Some(old_data), now, &mut out), None, "a replay of old data");
        assert!(out.is_empty());
        let moved = idle.quiet(two_seconds_ago, Some(now - 5_000), now, &mut out).expect("a live feed");
        assert!((now - 3_100..now - 2_900).contains(&moved), "{moved}: the newest event and two seconds");
        idle.quiet(two_seconds_ago, Some(now - 5_000), now, &mut out);
        assert_eq!(out.len(), 1, "one self-alert while it lasts");
        assert_eq!((out[0].rule.as_ref(), out[0].status), (RULE, Status::Firing));
        idle.input(two_seconds_ago, now, &mut out);
        assert_eq!(out[1].status, Status::Resolved);
        assert_eq!(out[1].id, out[0].id);
    }

    #[test]
    fn a_feed_with_long_gaps_is_not_stopped_before_three_of_them() {
        let now = vigil_engine::event::now_ms();
        let mut idle = Idle::new(Duration::ZERO);
        let mut out = Vec::new();
        idle.input(Instant::now() - Duration::from_secs(10), now, &mut out);
        idle.quiet(Instant::now() - Duration::from_secs(20), Some(now), now, &mut out);
        assert!(out.is_empty(), "20 s of quiet after gaps of 10 s");
        idle.quiet(Instant::now() - Duration::from_secs(31), Some(now), now, &mut out);
        assert_eq!(out.len(), 1);
    }
}
