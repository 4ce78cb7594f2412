//! Keyed partitions that another instance claimed while Kafka still assigns them here.
//!
//! Tansu 0.6.0 has been seen to assign one keyed partition to two members at once (with three
//! members, one of them killed and started again, on a loaded machine). Both claim it in the
//! store; the later epoch wins, and the other instance is fenced on its next write and lets the
//! partition go. If Kafka then settles the partition on the instance that let it go, nobody
//! runs it: its records are read and skipped (`not_owned`), and its keys' alerts are lost.
//!
//! So a partition let go this way is claimed again if, [`RECLAIM_AFTER`] later, Kafka still
//! assigns it here and its owner in the store has not claimed it or stored its checkpoint for
//! three checkpoint intervals (an owner that runs a partition stores one every interval: the
//! progress reports change it). It is restored from the newest checkpoint in the store and read
//! again from its beginning (what the checkpoint covers is skipped). An owner that is alive is
//! left alone: the two would otherwise take the partition from each other in turn until Kafka
//! settles its assignment.

use super::fetching::refetch;
use super::{Ctx, Owned, Shared};
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::time::{Duration, Instant};

/// How long after letting a keyed partition go an instance that Kafka still assigns it to
/// claims it again. Longer than an instance paused past its session timeout takes to learn,
/// once it goes on, that it lost its partitions: it must not take them back from their owner.
const RECLAIM_AFTER: Duration = Duration::from_secs(3);

impl Shared {
    /// Drops the keyed partitions another instance claimed: that instance writes for them now.
    pub(super) fn drop_fenced(&self, owned: &mut Owned, fenced: &[i32]) {
        let mut let_go = self.let_go.lock().expect("let go");
        for partition in fenced {
            owned.keyed.remove(partition);
            let_go.insert(*partition, Instant::now());
            self.telemetry.group.fenced.inc();
            tracing::warn!(partition, "another instance owns the keyed partition now; this one lets it go");
        }
    }

    /// A keyed partition was assigned here or revoked: Kafka has moved it, so what
    /// [`reclaim`] waits for is over.
    pub(super) fn settled(&self, partition: i32) {
        self.let_go.lock().expect("let go").remove(&partition);
    }
}

/// Claims again the keyed partitions let go at least [`RECLAIM_AFTER`] ago that Kafka still
/// assigns to `consumer`.
pub(super) fn reclaim(consumer: &BaseConsumer<Ctx>, checkpoint_every: Duration) {
    let ctx = consumer.context();
    let due: Vec<i32> = {
        let let_go = ctx.let_go.lock().expect("let go");
        let_go.iter().filter(|(_, at)| at.elapsed() >= RECLAIM_AFTER).map(|(p, _)| *p).collect()
    };
    if due.is_empty() {
        return;
    }
    let Ok(assignment) = consumer.assignment() else { return };
    let stale = (checkpoint_every * 3).max(RECLAIM_AFTER).as_millis() as i64;
    for partition in due {
        ctx.settled(partition);
        if assignment.find_partition(&ctx.keyed_topic, partition).is_none() {
            continue;
        }
        let owner_alive = match ctx.runtime.block_on(ctx.store.partition_saved_at(&ctx.group, partition)) {
            Ok(saved_at) => saved_at.is_some_and(|at| crate::event::now_ms() - at < stale),
            Err(e) => {
                tracing::warn!(partition, error = %e, "cannot read when the keyed partition was last checkpointed");
                true
            }
        };
        if owner_alive {
            // Its owner runs it (or the store cannot say): look again later, in case Kafka
            // leaves it here.
            ctx.let_go.lock().expect("let go").insert(partition, Instant::now());
            continue;
        }
        {
            let mut owned = ctx.owned.lock().expect("owned");
            if owned.keyed.contains_key(&partition) {
                continue;
            }
            let p = ctx.claim(partition, &owned.plans);
            owned.keyed.insert(partition, p);
            ctx.gauges(&owned);
        }
        tracing::warn!(
            partition,
            "Kafka still assigns here a keyed partition this instance let go, and its owner has stopped: claimed again"
        );
        refetch(consumer, &ctx.keyed_topic, partition, "reclaimed");
    }
}
