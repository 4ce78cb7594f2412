//! The alert store: PostgreSQL, or SQLite as the embedded default, through sqlx.
//!
//! Both speak the same SQL here (`$n` parameters, `ON CONFLICT`, `RETURNING`); only the
//! migrations differ, in `migrations/postgres` and `migrations/sqlite`. Every value is bound as a
//! parameter, never spliced into the text.

use serde::Serialize;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};
use std::fmt;
use vigil_engine::alert::{Alert, Status};
use vigil_engine::event::Millis;

mod group;
pub use group::{Fence, GroupRules, PartitionCheckpoint};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

#[derive(Debug)]
pub struct StoreError {
    pub message: String,
    /// Whether trying again later may succeed (a connection problem, not bad SQL).
    pub retryable: bool,
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StoreError {}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        let retryable =
            matches!(e, sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Tls(_));
        StoreError { message: format!("store: {e}"), retryable }
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        StoreError { message: format!("store migrations: {e}"), retryable: false }
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// Which alerts a listing or a stream wants.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AlertFilter {
    pub rule: Option<String>,
    pub severity: Option<String>,
    pub status: Option<Status>,
    /// `name=value` pairs that must all be in the alert's key.
    pub key: Vec<(String, String)>,
    pub from: Option<Millis>,
    pub to: Option<Millis>,
}

impl AlertFilter {
    pub fn matches(&self, a: &Alert) -> bool {
        let key = key_text(a);
        self.rule.as_ref().is_none_or(|r| **r == *a.rule)
            && self.severity.as_ref().is_none_or(|s| **s == *a.severity)
            && self.status.is_none_or(|s| s == a.status)
            && self.key.iter().all(|(k, v)| key.contains(&format!(",{k}={v},")))
            && self.from.is_none_or(|f| a.time >= f)
            && self.to.is_none_or(|t| a.time <= t)
    }
}

/// An alert's key as stored for filtering: `,name=value,name=value,`.
pub fn key_text(a: &Alert) -> String {
    let mut out = String::from(",");
    for (k, v) in a.key.iter() {
        let v = v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
        out.push_str(&format!("{k}={v},"));
    }
    out
}

/// A stored alert transition and its sequence number.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stored {
    pub seq: i64,
    pub alert: Alert,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadLetter {
    pub source: String,
    pub topic: Option<String>,
    pub partition: Option<i32>,
    pub offset: Option<i64>,
    pub line: Option<i64>,
    pub reason: String,
    pub payload: String,
    pub received_at_ms: Millis,
}

/// Longest payload kept in a dead letter; the rest is cut (the reason says why it was bad).
const DEAD_LETTER_PAYLOAD: usize = 4096;

#[derive(Debug, Clone, PartialEq)]
pub struct OutboxItem {
    pub seq: i64,
    pub idempotency_key: String,
    pub payload: String,
    pub attempts: i64,
}

/// Two pools: one that writes (alerts, checkpoints, deliveries) and one that reads for the API
/// and the alert stream, so that readers, however many and however slow, never hold the
/// connection the writer needs. With SQLite (one writer at a time, readers beside it in WAL
/// mode) the writing pool has one connection.
#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    reader: AnyPool,
    backend: Backend,
}

enum Arg {
    Str(String),
    Int(i64),
}

/// A query assembled from optional conditions, with its parameters numbered in order.
struct Sql {
    text: String,
    args: Vec<Arg>,
}

impl Sql {
    fn new(text: &str) -> Self {
        Sql { text: text.to_string(), args: Vec::new() }
    }

    fn arg(&mut self, a: Arg) -> String {
        self.args.push(a);
        format!("${}", self.args.len())
    }

    fn and(&mut self, condition: &str, a: Arg) {
        let p = self.arg(a);
        self.text.push_str(&format!(" AND {}", condition.replace('?', &p)));
    }

    fn query(&self) -> sqlx::query::Query<'_, sqlx::Any, sqlx::any::AnyArguments<'_>> {
        let mut q = sqlx::query(&self.text);
        for a in &self.args {
            q = match a {
                Arg::Str(s) => q.bind(s.clone()),
                Arg::Int(i) => q.bind(*i),
            };
        }
        q
    }
}

fn like_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_")
}

impl Store {
    /// Connects and brings the schema up to date. `sqlite://file.db` creates the file.
    pub async fn connect(url: &str) -> Result<Store> {
        sqlx::any::install_default_drivers();
        let (backend, url) = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            (Backend::Postgres, url.to_string())
        } else if let Some(rest) = url.strip_prefix("sqlite:") {
            let url = if rest.contains('?') || rest.contains(":memory:") {
                url.to_string()
            } else {
                format!("{url}?mode=rwc")
            };
            (Backend::Sqlite, url)
        } else {
            return Err(StoreError {
                message: format!("unsupported database URL `{url}`: use postgres://... or sqlite://..."),
                retryable: false,
            });
        };
        let options = || AnyPoolOptions::new().acquire_timeout(std::time::Duration::from_secs(5));
        let sqlite = |options: AnyPoolOptions, connections: u32| {
            options.max_connections(connections).after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::query("PRAGMA journal_mode = WAL").execute(&mut *conn).await?;
                    sqlx::query("PRAGMA busy_timeout = 5000").execute(&mut *conn).await?;
                    Ok(())
                })
            })
        };
        let pool = match backend {
            // One writer at a time is all SQLite does; a single connection avoids busy errors.
            Backend::Sqlite => sqlite(options(), 1).connect(&url).await?,
            Backend::Postgres => options().max_connections(8).connect(&url).await?,
        };
        let mut migrator = match backend {
            Backend::Postgres => sqlx::migrate!("migrations/postgres"),
            Backend::Sqlite => sqlx::migrate!("migrations/sqlite"),
        };
        // A store a later build migrated is opened as it is: its migrations only add
        // (migrations/README.md), so a build rolled back to finds the schema it knows. Without
        // this, sqlx refuses a store whose ledger holds a migration it does not have.
        migrator.set_ignore_missing(true);
        migrator.run(&pool).await?;
        let reader = match backend {
            // An in-memory database is one connection's own: readers must share it.
            Backend::Sqlite if url.contains(":memory:") => pool.clone(),
            Backend::Sqlite => sqlite(options(), 4).connect(&url).await?,
            Backend::Postgres => options().max_connections(4).connect(&url).await?,
        };
        Ok(Store { pool, reader, backend })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Stores alert transitions in one transaction, idempotently by (alert id, status), with a
    /// webhook delivery for each when `webhook` is given. Returns the ones newly stored.
    pub async fn insert_alerts(
        &self,
        alerts: &[Alert],
        webhook: Option<&(dyn Fn(&Alert) -> String + Sync)>,
    ) -> Result<Vec<Stored>> {
        let mut tx = self.pool.begin().await?;
        let stored = insert_in(&mut tx, alerts, webhook).await?;
        tx.commit().await?;
        Ok(stored)
    }

    /// Alerts (latest status of each), newest first, `limit` at most, before cursor `before`.
    pub async fn list_alerts(&self, filter: &AlertFilter, before: Option<i64>, limit: i64) -> Result<Vec<Stored>> {
        let mut sql = Sql::new("SELECT seq, body FROM alerts WHERE 1 = 1");
        self.conditions(&mut sql, filter, "time_ms");
        if let Some(b) = before {
            sql.and("seq < ?", Arg::Int(b));
        }
        let limit = sql.arg(Arg::Int(limit));
        sql.text.push_str(&format!(" ORDER BY seq DESC LIMIT {limit}"));
        let rows = sql.query().fetch_all(&self.reader).await?;
        rows.iter().map(stored).collect()
    }

    /// The firing alerts, newest first, `most` at most, read a page at a time.
    pub async fn firing_alerts(&self, most: usize) -> Result<Vec<Alert>> {
        let filter = AlertFilter { status: Some(Status::Firing), ..Default::default() };
        let mut out = Vec::new();
        let mut before = None;
        while out.len() < most {
            let page = self.list_alerts(&filter, before, 1_000).await?;
            let Some(last) = page.last() else { break };
            before = Some(last.seq);
            out.extend(page.into_iter().map(|s| s.alert));
        }
        out.truncate(most);
        Ok(out)
    }

    /// Alert transitions after `seq`, oldest first: what a stream client missed.
    pub async fn events_after(&self, seq: i64, filter: &AlertFilter, limit: i64) -> Result<Vec<Stored>> {
        let mut sql = Sql::new("SELECT seq, body FROM alert_events WHERE 1 = 1");
        sql.and("seq > ?", Arg::Int(seq));
        self.conditions(&mut sql, filter, "time_ms");
        let limit = sql.arg(Arg::Int(limit));
        sql.text.push_str(&format!(" ORDER BY seq ASC LIMIT {limit}"));
        let rows = sql.query().fetch_all(&self.reader).await?;
        rows.iter().map(stored).collect()
    }

    /// The newest stored transition's seq, where a fresh stream starts.
    pub async fn last_event_seq(&self) -> Result<i64> {
        let row = sqlx::query("SELECT COALESCE(MAX(seq), 0) FROM alert_events").fetch_one(&self.reader).await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    fn conditions(&self, sql: &mut Sql, f: &AlertFilter, time: &str) {
        if let Some(r) = &f.rule {
            sql.and("rule = ?", Arg::Str(r.clone()));
        }
        if let Some(s) = &f.severity {
            sql.and("severity = ?", Arg::Str(s.clone()));
        }
        if let Some(s) = f.status {
            sql.and("status = ?", Arg::Str(s.as_str().into()));
        }
        for (k, v) in &f.key {
            sql.and("key_text LIKE ? ESCAPE '\\'", Arg::Str(format!("%,{}={},%", like_escape(k), like_escape(v))));
        }
        if let Some(from) = f.from {
            sql.and(&format!("{time} >= ?"), Arg::Int(from));
        }
        if let Some(to) = f.to {
            sql.and(&format!("{time} <= ?"), Arg::Int(to));
        }
    }

    /// One alert with its transitions.
    pub async fn get_alert(&self, id: &str) -> Result<Option<(Alert, Vec<Stored>)>> {
        let Some(row) = sqlx::query("SELECT seq, body FROM alerts WHERE id = $1")
            .bind(id.to_string())
            .fetch_optional(&self.reader)
            .await?
        else {
            return Ok(None);
        };
        let current = stored(&row)?.alert;
        let rows = sqlx::query("SELECT seq, body FROM alert_events WHERE alert_id = $1 ORDER BY seq")
            .bind(id.to_string())
            .fetch_all(&self.reader)
            .await?;
        let transitions = rows.iter().map(stored).collect::<Result<Vec<_>>>()?;
        Ok(Some((current, transitions)))
    }

    /// Stores dead letters in one transaction, then deletes the oldest beyond the newest
    /// `max_kept`, so that a flood of bad input cannot fill the disk.
    pub async fn insert_dead_letters(&self, letters: &[DeadLetter], max_kept: u64) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        for d in letters {
            let mut payload = d.payload.clone();
            if payload.len() > DEAD_LETTER_PAYLOAD {
                let mut end = DEAD_LETTER_PAYLOAD;
                while !payload.is_char_boundary(end) {
                    end -= 1;
                }
                payload.truncate(end);
            }
            sqlx::query(
                "INSERT INTO dead_letters (source, topic, kafka_partition, kafka_offset, line, reason, payload, received_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(d.source.clone())
            .bind(d.topic.clone())
            .bind(d.partition)
            .bind(d.offset)
            .bind(d.line)
            .bind(d.reason.clone())
            .bind(payload)
            .bind(d.received_at_ms)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query("DELETE FROM dead_letters WHERE seq <= (SELECT MAX(seq) FROM dead_letters) - $1")
            .bind(i64::try_from(max_kept).unwrap_or(i64::MAX))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn dead_letters(&self, limit: i64) -> Result<Vec<DeadLetter>> {
        let rows = sqlx::query(
            "SELECT source, topic, kafka_partition, kafka_offset, line, reason, payload, received_at_ms \
             FROM dead_letters ORDER BY seq DESC LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.reader)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(DeadLetter {
                    source: r.try_get(0)?,
                    topic: r.try_get(1)?,
                    partition: r.try_get(2)?,
                    offset: r.try_get(3)?,
                    line: r.try_get(4)?,
                    reason: r.try_get(5)?,
                    payload: r.try_get(6)?,
                    received_at_ms: r.try_get(7)?,
                })
            })
            .collect()
    }

    /// Replaces the checkpoint: the engine's snapshot and the source positions it covers.
    pub async fn save_checkpoint(&self, snapshot: &[u8], positions: &str, now: Millis) -> Result<()> {
        sqlx::query(
            "INSERT INTO checkpoints (id, taken_at_ms, snapshot, positions) VALUES (1, $1, $2, $3) \
             ON CONFLICT (id) DO UPDATE SET taken_at_ms = excluded.taken_at_ms, snapshot = excluded.snapshot, \
             positions = excluded.positions",
        )
        .bind(now)
        // Borrowed: a copy of the snapshot (hundreds of MB for a large fleet) would be one more
        // buffer of its size while it is written; the database driver still takes its own.
        .bind(snapshot)
        .bind(positions)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The latest checkpoint: (snapshot, positions as JSON).
    pub async fn load_checkpoint(&self) -> Result<Option<(Vec<u8>, String)>> {
        let row =
            sqlx::query("SELECT snapshot, positions FROM checkpoints WHERE id = 1").fetch_optional(&self.pool).await?;
        row.map(|r| Ok((r.try_get::<Vec<u8>, _>(0)?, r.try_get::<String, _>(1)?))).transpose()
    }

    /// Webhook deliveries due by `now`, oldest first.
    pub async fn outbox_due(&self, now: Millis, limit: i64) -> Result<Vec<OutboxItem>> {
        let rows = sqlx::query(
            "SELECT seq, idempotency_key, payload, attempts FROM webhook_outbox \
             WHERE state = 'pending' AND next_attempt_ms <= $1 ORDER BY seq LIMIT $2",
        )
        .bind(now)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(outbox_item).collect()
    }

    /// [`Store::outbox_due`] for one of several instances delivering from the same outbox
    /// (PostgreSQL): the deliveries returned are leased to the caller for `lease_ms`, skipped
    /// by the others meanwhile, and due again after it unless delivered or failed.
    pub async fn outbox_claim(&self, now: Millis, limit: i64, lease_ms: Millis) -> Result<Vec<OutboxItem>> {
        let rows = sqlx::query(
            "UPDATE webhook_outbox SET next_attempt_ms = $1 WHERE seq IN (SELECT seq FROM webhook_outbox \
             WHERE state = 'pending' AND next_attempt_ms <= $2 ORDER BY seq LIMIT $3 FOR UPDATE SKIP LOCKED) \
             RETURNING seq, idempotency_key, payload, attempts",
        )
        .bind(now.saturating_add(lease_ms))
        .bind(now)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        let mut items = rows.iter().map(outbox_item).collect::<Result<Vec<_>>>()?;
        items.sort_by_key(|i| i.seq);
        Ok(items)
    }

    /// The earliest time a pending delivery is due, if any.
    pub async fn outbox_next_due(&self) -> Result<Option<Millis>> {
        let row = sqlx::query("SELECT MIN(next_attempt_ms) FROM webhook_outbox WHERE state = 'pending'")
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get::<Option<i64>, _>(0)?)
    }

    pub async fn outbox_delivered(&self, seq: i64, now: Millis) -> Result<()> {
        sqlx::query("UPDATE webhook_outbox SET state = 'delivered', delivered_at_ms = $1, attempts = attempts + 1 WHERE seq = $2")
            .bind(now)
            .bind(seq)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// A failed attempt: retry at `next` or, when `dead`, give up (visible, and redeliverable).
    pub async fn outbox_failed(&self, seq: i64, next: Millis, error: &str, dead: bool) -> Result<()> {
        sqlx::query("UPDATE webhook_outbox SET state = $1, attempts = attempts + 1, next_attempt_ms = $2, last_error = $3 WHERE seq = $4")
            .bind(if dead { "dead" } else { "pending" })
            .bind(next)
            .bind(error.to_string())
            .bind(seq)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Counts of deliveries by state: pending, delivered, dead.
    pub async fn outbox_counts(&self) -> Result<Vec<(String, i64)>> {
        let rows = sqlx::query("SELECT state, COUNT(*) FROM webhook_outbox GROUP BY state ORDER BY state")
            .fetch_all(&self.reader)
            .await?;
        rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
    }

    /// Puts dead deliveries back in the queue, due now. Returns how many.
    pub async fn outbox_redeliver(&self, now: Millis) -> Result<u64> {
        let done = sqlx::query(
            "UPDATE webhook_outbox SET state = 'pending', attempts = 0, next_attempt_ms = $1 WHERE state = 'dead'",
        )
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}

/// Stores alert transitions within `tx` (see [`Store::insert_alerts`]); returns the new ones.
pub(super) async fn insert_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    alerts: &[Alert],
    webhook: Option<&(dyn Fn(&Alert) -> String + Sync)>,
) -> Result<Vec<Stored>> {
    let mut stored = Vec::new();
    for a in alerts {
        let body = serde_json::to_string(a).map_err(|e| StoreError { message: e.to_string(), retryable: false })?;
        let key = key_text(a);
        let row = sqlx::query(
            "INSERT INTO alert_events (alert_id, status, rule, severity, key_text, time_ms, body) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (alert_id, status) DO NOTHING RETURNING seq",
        )
        .bind(a.id.clone())
        .bind(a.status.as_str())
        .bind(&*a.rule)
        .bind(&*a.severity)
        .bind(key.clone())
        .bind(a.time)
        .bind(body.clone())
        .fetch_optional(&mut **tx)
        .await?;
        let Some(row) = row else { continue };
        let seq: i64 = row.try_get(0)?;
        sqlx::query(
            "INSERT INTO alerts (id, seq, rule, severity, status, key_text, starts_at_ms, ends_at_ms, time_ms, body) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
                 ON CONFLICT (id) DO UPDATE SET status = excluded.status, ends_at_ms = excluded.ends_at_ms, \
                 time_ms = excluded.time_ms, body = excluded.body",
        )
        .bind(a.id.clone())
        .bind(seq)
        .bind(&*a.rule)
        .bind(&*a.severity)
        .bind(a.status.as_str())
        .bind(key)
        .bind(a.starts_at)
        .bind(a.ends_at)
        .bind(a.time)
        .bind(body)
        .execute(&mut **tx)
        .await?;
        if let Some(payload) = webhook {
            sqlx::query(
                "INSERT INTO webhook_outbox (event_seq, idempotency_key, payload, state, attempts, next_attempt_ms) \
                     VALUES ($1, $2, $3, 'pending', 0, 0) ON CONFLICT (event_seq) DO NOTHING",
            )
            .bind(seq)
            .bind(format!("{}:{}", a.id, a.status.as_str()))
            .bind(payload(a))
            .execute(&mut **tx)
            .await?;
        }
        stored.push(Stored { seq, alert: a.clone() });
    }
    Ok(stored)
}

fn outbox_item(r: &AnyRow) -> Result<OutboxItem> {
    Ok(OutboxItem {
        seq: r.try_get(0)?,
        idempotency_key: r.try_get(1)?,
        payload: r.try_get(2)?,
        attempts: r.try_get::<i64, _>(3).or_else(|_| r.try_get::<i32, _>(3).map(i64::from))?,
    })
}

fn stored(row: &AnyRow) -> Result<Stored> {
    let seq: i64 = row.try_get(0)?;
    let body: String = row.try_get(1)?;
    let alert = serde_json::from_str(&body)
        .map_err(|e| StoreError { message: format!("stored alert {seq}: {e}"), retryable: false })?;
    Ok(Stored { seq, alert })
}

#[cfg(test)]
mod tests {
    use super::Store;

    #[tokio::test]
    async fn a_store_a_later_build_migrated_still_opens() {
        let dir = std::env::temp_dir().join(format!("vigil-store-later-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary folder");
        let url = format!("sqlite://{}", dir.join("vigil.db").display());
        let store = Store::connect(&url).await.expect("a new store");
        // What a later build's migration leaves: a row of its own in sqlx's ledger.
        sqlx::query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
             VALUES (9001, 'a later build''s', 1, x'00', 0)",
        )
        .execute(&store.pool)
        .await
        .expect("ledger row");
        drop(store);
        let reopened = Store::connect(&url).await;
        std::fs::remove_dir_all(&dir).ok();
        let store = reopened.expect("opened by the build rolled back to");
        store.ping().await.expect("answers");
    }
}
