//! What instances sharing a Kafka consumer group keep in the store (PostgreSQL only): who owns
//! each partition of the group's keyed topic, under which epoch, and the partition's latest
//! checkpoint. Every write for a partition checks the epoch, so an instance that lost the
//! partition while it was paused (past its session timeout) cannot write for it any more.

use super::{insert_in, Result, Store, Stored};
use sqlx::Row;
use vigil_engine::alert::Alert;
use vigil_engine::event::Millis;

/// The owner of one partition of a group's keyed topic, as writes for it must prove.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
        // A claim counts as a sign of life, as a checkpoint does ([`Store::partition_saved_at`]).
        let row = sqlx::query(
            "INSERT INTO group_partitions (group_name, part, epoch, taken_at_ms) VALUES ($1, $2, 1, $3) \
             ON CONFLICT (group_name, part) DO UPDATE SET epoch = group_partitions.epoch + 1, taken_at_ms = $3 \
             RETURNING epoch, snapshot, state",
        )
        .bind(group.to_string())
        .bind(partition)
        .bind(vigil_engine::event::now_ms())
        .fetch_one(&self.pool)
        .await?;
        let epoch: i64 = row.try_get(0)?;
        let snapshot: Option<Vec<u8>> = row.try_get(1)?;
        let state: Option<String> = row.try_get(2)?;
        let checkpoint = snapshot.zip(state).map(|(snapshot, state)| PartitionCheckpoint { snapshot, state });
        Ok((Fence { group: group.to_string(), partition, epoch }, checkpoint))
    }

    /// The epoch of every partition kept under one of `groups`, as (group, partition, epoch).
    pub async fn partition_epochs(&self, groups: &[String]) -> Result<Vec<(String, i32, i64)>> {
        let mut all = Vec::new();
        for group in groups {
            let rows: Vec<(i32, i64)> =
                sqlx::query_as("SELECT part, epoch FROM group_partitions WHERE group_name = $1")
                    .bind(group.clone())
                    .fetch_all(&self.pool)
                    .await?;
            all.extend(rows.into_iter().map(|(part, epoch)| (group.clone(), part, epoch)));
        }
        Ok(all)
    }

    /// When the owner of a partition last claimed it or stored its checkpoint (wall clock),
    /// if ever: an owner that runs the partition stores a checkpoint every interval.
    pub async fn partition_saved_at(&self, group: &str, partition: i32) -> Result<Option<Millis>> {
        let row: Option<(Option<i64>,)> =
            sqlx::query_as("SELECT taken_at_ms FROM group_partitions WHERE group_name = $1 AND part = $2")
                .bind(group.to_string())
                .bind(partition)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.and_then(|(at,)| at))
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
        for a in alerts {
            sqlx::query("UPDATE alerts SET part = $1 WHERE id = $2")
                .bind(fence.partition)
                .bind(a.id.clone())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(Some(stored))
    }

    /// The firing alerts raised in the keyed partitions `parts` of a group (their owner's to
    /// resend to Alertmanager).
    pub async fn firing_alerts_in(&self, parts: &[i32]) -> Result<Vec<Alert>> {
        let mut out = Vec::new();
        for part in parts {
            let rows: Vec<(String,)> =
                sqlx::query_as("SELECT body FROM alerts WHERE status = 'firing' AND part = $1 ORDER BY seq")
                    .bind(*part)
                    .fetch_all(&self.pool)
                    .await?;
            for (body,) in rows {
                let alert = serde_json::from_str(&body)
                    .map_err(|e| super::StoreError { message: format!("stored alert: {e}"), retryable: false })?;
                out.push(alert);
            }
        }
        Ok(out)
    }
}

/// A group's rule set as the store keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupRules {
    pub version: i64,
    pub digest: String,
    /// A JSON object: each rule file's name (relative to the rules folder) and its text.
    pub files: String,
    pub updated_by: String,
    pub updated_at_ms: Millis,
}

impl Store {
    /// The rule set of `group`, if one was published.
    pub async fn group_rules(&self, group: &str) -> Result<Option<GroupRules>> {
        let row = sqlx::query(
            "SELECT version, digest, files, updated_by, updated_at_ms FROM group_rules WHERE group_name = $1",
        )
        .bind(group.to_string())
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(GroupRules {
            version: row.try_get(0)?,
            digest: row.try_get(1)?,
            files: row.try_get(2)?,
            updated_by: row.try_get(3)?,
            updated_at_ms: row.try_get(4)?,
        }))
    }

    /// Replaces `group`'s rule set with `rules` (its version is ignored: the stored one is
    /// raised by one) if the stored version is still `over` (`None`: none stored yet); returns
    /// the new version, or `None` when another instance changed it first.
    pub async fn publish_group_rules(&self, group: &str, over: Option<i64>, rules: &GroupRules) -> Result<Option<i64>> {
        let (sql, version) = match over {
            None => (
                "INSERT INTO group_rules (group_name, version, digest, files, updated_by, updated_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (group_name) DO NOTHING",
                1,
            ),
            Some(v) => (
                "UPDATE group_rules SET version = $2, digest = $3, files = $4, updated_by = $5, updated_at_ms = $6 \
                 WHERE group_name = $1 AND version = $7",
                v + 1,
            ),
        };
        let mut query = sqlx::query(sql)
            .bind(group.to_string())
            .bind(version)
            .bind(rules.digest.clone())
            .bind(rules.files.clone())
            .bind(rules.updated_by.clone())
            .bind(rules.updated_at_ms);
        if let Some(v) = over {
            query = query.bind(v);
        }
        let done = query.execute(&self.pool).await?;
        Ok((done.rows_affected() == 1).then_some(version))
    }
}
