-- Alert transitions (firing, resolved), in the order they were stored. `seq` is the id of the
-- server-sent event, so a client that reconnects with Last-Event-ID resumes with no gap.
CREATE TABLE alert_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    alert_id TEXT NOT NULL,
    status TEXT NOT NULL,
    rule TEXT NOT NULL,
    severity TEXT NOT NULL,
    key_text TEXT NOT NULL,
    time_ms BIGINT NOT NULL,
    body TEXT NOT NULL,
    UNIQUE (alert_id, status)
);

-- One row per alert with its latest status; `seq` is the seq of its first transition, a stable
-- order for cursor pagination.
CREATE TABLE alerts (
    id TEXT PRIMARY KEY,
    seq BIGINT NOT NULL,
    rule TEXT NOT NULL,
    severity TEXT NOT NULL,
    status TEXT NOT NULL,
    key_text TEXT NOT NULL,
    starts_at_ms BIGINT NOT NULL,
    ends_at_ms BIGINT,
    time_ms BIGINT NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX alerts_by_seq ON alerts (seq);
CREATE INDEX alerts_by_rule ON alerts (rule, seq);
CREATE INDEX alerts_by_status ON alerts (status, seq);
CREATE INDEX alerts_by_severity ON alerts (severity, seq);
CREATE INDEX alerts_by_time ON alerts (time_ms);

-- Input that could not be read as an event, with where it came from.
CREATE TABLE dead_letters (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    source TEXT NOT NULL,
    topic TEXT,
    kafka_partition INTEGER,
    kafka_offset BIGINT,
    line BIGINT,
    reason TEXT NOT NULL,
    payload TEXT NOT NULL,
    received_at_ms BIGINT NOT NULL
);

-- Webhook deliveries still to make; written in the same transaction as the alert.
CREATE TABLE webhook_outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    event_seq BIGINT NOT NULL UNIQUE,
    idempotency_key TEXT NOT NULL,
    payload TEXT NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_ms BIGINT NOT NULL,
    last_error TEXT,
    delivered_at_ms BIGINT
);
CREATE INDEX webhook_outbox_due ON webhook_outbox (state, next_attempt_ms);
