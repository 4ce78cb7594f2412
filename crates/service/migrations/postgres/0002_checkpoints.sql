-- The engine's latest checkpoint: its state, and the source positions it covers (Kafka offsets
-- to resume from). One row; replaced in place.
CREATE TABLE checkpoints (
    id INTEGER PRIMARY KEY,
    taken_at_ms BIGINT NOT NULL,
    snapshot BYTEA NOT NULL,
    positions TEXT NOT NULL
);
