-- The rule set of a consumer group (--kafka-join-group): every instance of the group runs it.
-- A change on any instance (through the API or its folder) replaces it, version by version;
-- the other instances write it into their folders and run it.
CREATE TABLE group_rules (
    group_name TEXT PRIMARY KEY,
    version BIGINT NOT NULL,
    digest TEXT NOT NULL,
    -- JSON object: each rule file's name, relative to the rules folder, and its text.
    files TEXT NOT NULL,
    updated_by TEXT NOT NULL,
    updated_at_ms BIGINT NOT NULL
);
