-- Instances that share a Kafka consumer group (--kafka-join-group) own the partitions of the
-- group's keyed topic in turn. One row per partition: the owner's epoch, raised when an
-- instance is assigned the partition and checked by every write for it (so an instance that
-- lost the partition without knowing cannot write), and the partition's latest checkpoint.
CREATE TABLE group_partitions (
    group_name TEXT NOT NULL,
    part INTEGER NOT NULL,
    epoch BIGINT NOT NULL,
    taken_at_ms BIGINT,
    snapshot BYTEA,
    state TEXT,
    PRIMARY KEY (group_name, part)
);
