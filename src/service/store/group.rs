//! What instances sharing a Kafka consumer group keep in the store (PostgreSQL only): who owns
//! each partition of the group's keyed topic, under which epoch, and the partition's latest
//! checkpoint. Every write for a partition checks the epoch, so an instance that lost the
//! partition while it was paused (past its session timeout) cannot write for it any more.

use super::{insert_in, Result, Store, Stored};
use crate::alert::Alert;
use crate::event::Millis;
use sqlx::Row;

/// The owner of one partition of a group's keyed topic, as writes for it must prove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub group: String,
    pub partition: i32,
    pub epoch: i64,
}

/// A partition's checkpoint: the engine's snapshot and what the instance keeps beside it.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionCheckpoint {
    pub snapshot: Vec<u8>,
    pub state: String,
}

impl Store {
    /// Takes a partition of `group`'s keyed topic: raises its epoch (so the previous owner's
    /// writes fail from now on) and returns the new owner's fence with the partition's
    /// checkpoint, if it has one.
    pub async fn claim_partition(&self, group: &str, partition: i32) -> Result<(Fence, Option<PartitionCheckpoint>)> {
        let row = sqlx::query(
            "INSERT INTO group_partitions (group_name, part, epoch) VALUES ($1, $2, 1) \
             ON CONFLICT (group_name, part) DO UPDATE SET epoch = group_partitions.epoch + 1 \
             RETURNING epoch, snapshot, state",
        )
        .bind(group.to_string())
        .bind(partition)
        .fetch_one(&self.pool)
        .await?;
        let epoch: i64 = row.try_get(0)?;
        let snapshot: Option<Vec<u8>> = row.try_get(1)?;
        let state: Option<String> = row.try_get(2)?;
        let checkpoint = snapshot.zip(state).map(|(snapshot, state)| PartitionCheckpoint { snapshot, state });
        Ok((Fence { group: group.to_string(), partition, epoch }, checkpoint))
    }

    /// Replaces a partition's checkpoint when `fence` still owns it; false when it does not.
    pub async fn save_partition_checkpoint(
        &self,
        fence: &Fence,
        checkpoint: &PartitionCheckpoint,
        now: Millis,
    ) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE group_partitions SET snapshot = $1, state = $2, taken_at_ms = $3 \
             WHERE group_name = $4 AND part = $5 AND epoch = $6",
        )
        .bind(checkpoint.snapshot.clone())
        .bind(checkpoint.state.clone())
        .bind(now)
        .bind(fence.group.clone())
        .bind(fence.partition)
        .bind(fence.epoch)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// [`Store::insert_alerts`] for a partition, when `fence` still owns it: the owner row is
    /// locked for the transaction, so a new owner's claim waits for it. `None` when it does not.
    pub async fn insert_alerts_fenced(
        &self,
        fence: &Fence,
        alerts: &[Alert],
        webhook: Option<&(dyn Fn(&Alert) -> String + Sync)>,
    ) -> Result<Option<Vec<Stored>>> {
        let mut tx = self.pool.begin().await?;
        let owned =
            sqlx::query("UPDATE group_partitions SET epoch = epoch WHERE group_name = $1 AND part = $2 AND epoch = $3")
                .bind(fence.group.clone())
                .bind(fence.partition)
                .bind(fence.epoch)
                .execute(&mut *tx)
                .await?;
        if owned.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(None);
        }
        let stored = insert_in(&mut tx, alerts, webhook).await?;
        tx.commit().await?;
        Ok(Some(stored))
    }
}
