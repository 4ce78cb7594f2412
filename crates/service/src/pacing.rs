//! When the next checkpoint is taken, in a single instance and a group member alike.
//!
//! A checkpoint is the whole state (2.5 s for 25,000 series at full history, about 25 for
//! 250,000); what comes between two is kept by its source (Kafka, the ingest log, the file) and
//! read again after a crash, so the input since the last checkpoint is its delta, already
//! written once (BENCHMARKS.md, "Checkpoints at full history"). Checkpoints are therefore
//! spaced by their cost: `--checkpoint-interval` apart, or further when the last one's
//! snapshots and the writer's store of them took more than a tenth of that.

use crate::engine_loop::EngineHealth;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How many times its cost the next checkpoint waits at least: the snapshots on the engine's
/// thread and the writer's store of them, so that checkpoints take at most a tenth of either
/// thread.
const SPACING: u32 = 10;

#[derive(Debug)]
pub struct CheckpointPacing {
    every: Duration,
    /// When the last checkpoint began.
    began: Instant,
    /// What its snapshots took on the engine's thread.
    snapshots: Duration,
    /// The writer's store time in total ([`EngineHealth::checkpoint_store_ms`]) when it began:
    /// what the writer has spent since is its store.
    stored_before: u64,
}

impl CheckpointPacing {
    /// Paces checkpoints `every` apart at least, the first one `every` after `now`.
    pub fn new(every: Duration, now: Instant) -> CheckpointPacing {
        CheckpointPacing { every, began: now, snapshots: Duration::ZERO, stored_before: 0 }
    }

    /// The least time between two checkpoints: `every`, or [`SPACING`] times what the last one
    /// cost when that is longer.
    pub fn spacing(&self, health: &EngineHealth) -> Duration {
        let stored = health.checkpoint_store_ms.load(Ordering::Relaxed).saturating_sub(self.stored_before);
        self.every.max((self.snapshots + Duration::from_millis(stored)) * SPACING)
    }

    /// Whether the next checkpoint is due.
    pub fn due(&self, health: &EngineHealth) -> bool {
        self.began.elapsed() >= self.spacing(health)
    }

    /// A checkpoint begins now.
    pub fn begin(&mut self, health: &EngineHealth) {
        self.began = Instant::now();
        self.snapshots = Duration::ZERO;
        self.stored_before = health.checkpoint_store_ms.load(Ordering::Relaxed);
    }

    /// One of its snapshots took `took` (a group member takes one per keyed partition).
    pub fn snapshot_took(&mut self, took: Duration) {
        self.snapshots += took;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_are_spaced_by_ten_times_their_snapshots_and_store() {
        let health = EngineHealth::default();
        let every = Duration::from_secs(60);
        let mut pacing = CheckpointPacing::new(every, Instant::now());
        assert_eq!(pacing.spacing(&health), every, "a cheap checkpoint keeps the interval");
        health.checkpoint_store_ms.fetch_add(5_000, Ordering::Relaxed);
        pacing.begin(&health);
        pacing.snapshot_took(Duration::from_secs(1));
        pacing.snapshot_took(Duration::from_secs(2));
        assert_eq!(pacing.spacing(&health), Duration::from_secs(60), "3 s of snapshots, the store before not counted");
        health.checkpoint_store_ms.fetch_add(4_000, Ordering::Relaxed);
        assert_eq!(pacing.spacing(&health), Duration::from_secs(70), "3 s of snapshots and 4 s of store");
        assert!(!pacing.due(&health));
        pacing.begin(&health);
        assert_eq!(pacing.spacing(&health), every, "the next checkpoint's cost is its own");
        let began = Instant::now() - Duration::from_secs(2);
        assert!(CheckpointPacing::new(Duration::from_secs(1), began).due(&EngineHealth::default()));
    }
}
