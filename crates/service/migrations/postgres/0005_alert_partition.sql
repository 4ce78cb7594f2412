-- The keyed partition of a consumer group (--kafka-join-group) whose owner raised each alert:
-- only that partition's owner resends it to Alertmanager. Empty for a single instance's alerts.
ALTER TABLE alerts ADD COLUMN part INTEGER;
