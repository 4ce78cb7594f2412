//! The state budget and the state's gauges of a member's keyed partitions, once a second, as a
//! single instance's engine thread keeps its own ([`crate::engine_loop`]): `--max-state-mb`
//! is shared by the keyed partitions owned here, and `vigil_state_bytes`, `vigil_live_keys`
//! and `vigil_evicted_keys_total` count what they hold and drop.

use super::keyed::KeyedPartition;
use crate::engine_loop::EngineHealth;
use crate::telemetry::Telemetry;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const EVERY: Duration = Duration::from_secs(1);

#[derive(Default)]
pub struct StateGauges {
    /// Keys dropped so far, as last counted, by keyed partition, rule and reason: a partition
    /// counts from zero when it is claimed here.
    evicted_seen: BTreeMap<i32, BTreeMap<(String, &'static str), u64>>,
    /// The rules last given a `vigil_live_keys` value, so that a rule no longer held goes to 0.
    rules: Vec<String>,
    last: Option<Instant>,
}

impl StateGauges {
    /// Whether a second has passed since the last [`StateGauges::update`].
    pub fn due(&mut self) -> bool {
        let due = self.last.is_none_or(|t| t.elapsed() >= EVERY);
        if due {
            self.last = Some(Instant::now());
        }
        due
    }

    /// Keeps each owned keyed partition under its share of `max_bytes`, and sets the gauges.
    /// The self-alerts the budget raises wait with the partitions' alerts.
    pub fn update(
        &mut self,
        keyed: &mut BTreeMap<i32, KeyedPartition>,
        max_bytes: usize,
        telemetry: &Telemetry,
        health: &EngineHealth,
    ) {
        let share = max_bytes / keyed.len().max(1);
        let mut bytes = 0;
        let mut live: BTreeMap<String, usize> = BTreeMap::new();
        for (partition, p) in keyed.iter_mut() {
            bytes += p.enforce_budget(share);
            for (rule, n) in p.live_keys() {
                *live.entry(rule).or_insert(0) += n;
            }
            telemetry.count_evicted(self.evicted_seen.entry(*partition).or_default(), p.evicted());
        }
        self.evicted_seen.retain(|partition, _| keyed.contains_key(partition));
        health.state_bytes.store(bytes as u64, Ordering::Relaxed);
        telemetry.state_bytes.set(bytes as i64);
        for rule in self.rules.iter().filter(|r| !live.contains_key(*r)) {
            telemetry.live_keys.with_label_values(&[rule]).set(0);
        }
        for (rule, n) in &live {
            telemetry.live_keys.with_label_values(&[rule]).set(*n as i64);
        }
        self.rules = live.into_keys().collect();
    }
}
