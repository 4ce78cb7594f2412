//! When the next checkpoint is taken, in a single instance and a group member alike.
//!
//! A checkpoint is the whole state (2.5 s for 25,000 series at full history, about 25 for
//! 250,000); what comes between two is kept by its source (Kafka, the ingest log, the file) and
//! read again after a crash, so the input since the last checkpoint is its delta, already
//! written once (BENCHMARKS.md, "Checkpoints at full history"). Checkpoints are therefore
//! spaced by their cost: `--checkpoint-interval` apart, or further when a checkpoint's
//! snapshots and the writer's stores took more than a tenth of that.
//!
//! The writer adds the time of every store that succeeded to one total
//! ([`crate::engine_loop::EngineHealth::checkpoint_stored`]); a checkpoint's store time is what
//! the total grew by from its start to the next one's. A group member's stores of partitions
//! it hands over on a rebalance count with the checkpoint under way: the writer's time all the
//! same.

use std::time::{Duration, Instant};

/// How many times its cost the next checkpoint waits at least: the snapshots on the engine's
/// thread and the writer's store of them, so that checkpoints take at most a tenth of either
/// thread.
const SPACING: u32 = 10;

#[derive(Debug)]
pub struct CheckpointPacing {
    every: Duration,
    /// When the checkpoint under way (or the last one) began.
    began: Instant,
    /// What its snapshots have taken on the engine's thread.
    snapshots: Duration,
    /// The writer's store time in total (µs) when it began.
    stored_before: u64,
    /// What the checkpoint before it cost in all: it stands while this one's store is still
    /// under way and counts as nothing yet.
    before: Duration,
}

impl CheckpointPacing {
    /// Paces checkpoints `every` apart at least, the first one `every` after `now`;
    /// `stored_us`: the writer's store time in total so far.
    pub fn new(every: Duration, now: Instant, stored_us: u64) -> CheckpointPacing {
        CheckpointPacing {
            every,
            began: now,
            snapshots: Duration::ZERO,
            stored_before: stored_us,
            before: Duration::ZERO,
        }
    }

    /// What the checkpoint under way has cost so far.
    fn cost(&self, stored_us: u64) -> Duration {
        self.snapshots + Duration::from_micros(stored_us.saturating_sub(self.stored_before))
    }

    /// The least time between two checkpoints: `every`, or [`SPACING`] times what the last one
    /// cost (the one before while its store is under way) when that is longer.
    pub fn spacing(&self, stored_us: u64) -> Duration {
        self.every.max(self.cost(stored_us).max(self.before) * SPACING)
    }

    /// Whether the next checkpoint is due at `now`.
    pub fn due(&self, now: Instant, stored_us: u64) -> bool {
        now.saturating_duration_since(self.began) >= self.spacing(stored_us)
    }

    /// A checkpoint begins at `now`.
    pub fn begin(&mut self, now: Instant, stored_us: u64) {
        self.before = self.cost(stored_us);
        self.began = now;
        self.snapshots = Duration::ZERO;
        self.stored_before = stored_us;
    }

    /// One of its snapshots took `took` (a group member takes one per keyed partition).
    pub fn snapshot_took(&mut self, took: Duration) {
        self.snapshots += took;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    #[test]
    fn checkpoints_are_spaced_by_ten_times_their_snapshots_and_store() {
        let every = Duration::from_secs(60);
        let start = Instant::now();
        let mut pacing = CheckpointPacing::new(every, start, 2 * S);
        assert_eq!(pacing.spacing(2 * S), every, "a cheap checkpoint keeps the interval");
        assert!(!pacing.due(start + Duration::from_secs(59), 2 * S));
        assert!(pacing.due(start + every, 2 * S));

        pacing.begin(start, 5 * S);
        pacing.snapshot_took(Duration::from_secs(1));
        pacing.snapshot_took(Duration::from_secs(2));
        assert_eq!(pacing.spacing(5 * S), every, "3 s of snapshots; the stores before it do not count");
        assert_eq!(pacing.spacing(9 * S), Duration::from_secs(70), "3 s of snapshots and 4 s of store");
        assert!(!pacing.due(start + every, 9 * S));
        assert!(pacing.due(start + Duration::from_secs(70), 9 * S));

        pacing.begin(start + Duration::from_secs(70), 9 * S);
        assert_eq!(
            pacing.spacing(9 * S),
            Duration::from_secs(70),
            "while the next one's store is under way, the last one's cost stands"
        );
        pacing.snapshot_took(Duration::from_millis(100));
        assert_eq!(pacing.spacing(9 * S + S / 2), Duration::from_secs(70));
        pacing.begin(start + Duration::from_secs(140), 9 * S + S / 2);
        pacing.begin(start + Duration::from_secs(200), 9 * S + S / 2);
        assert_eq!(pacing.spacing(9 * S + S / 2), every, "cheap again: the interval again");
    }
}
